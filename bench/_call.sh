#!/usr/bin/env bash
# untracked: this session's device calls
. bench/_device_env.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $OUT/smi_$1.txt 2>&1
export NINFER_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
case "$1" in
  c1)
    timeout 230 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fast_moe_gpu.py -k "folds_the_residual or leaf or prefill" > $OUT/t1.txt 2>&1; echo "t1 rc=$?"; tail -2 $OUT/t1.txt
    timeout 190 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_prefill_graphs_gpu.py tests/test_program_cuda.py tests/test_hf_parity_gpu.py > $OUT/t2.txt 2>&1; echo "t2 rc=$?"; tail -2 $OUT/t2.txt
    timeout 150 python3 bench/prefill_ab.py --identity qwen3_6-35b-a3b --tokens 8192 --reps 5 --pause 2 --variants base set:ninfer.ops.fast.moe.PREFILL_RESIDUAL_COMBINE=0 > $OUT/ab35.txt 2>&1; echo "ab35 rc=$?"; tail -12 $OUT/ab35.txt
    save_tcache ;;
  c2)
    timeout 220 python3 bench/prefill_ab.py --identity qwen3_6-27b --tokens 8192 --reps 5 --pause 3 --variants base set:ninfer.ops.fast.gemv.PREFILL_RESIDUAL_GEMM=0 > $OUT/ab27.txt 2>&1; echo "ab27 rc=$?"; tail -12 $OUT/ab27.txt
    timeout 330 python3 -m ninfer.cli.main bench decode --identity qwen3_6-27b qwen3_6-35b-a3b --ctx 1024 --batches 1 8 --reps 10 --no-ref --prefill-ref-gdn --no-hf-baseline --max-model-len 8192 --step-timeout 80 > $OUT/dec.txt 2>&1; echo "dec rc=$?"; tail -25 $OUT/dec.txt ;;
esac
