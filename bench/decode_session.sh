#!/usr/bin/env bash
# One device session for the decode pass (issue 8): GPU tests of the changed paths, kernels per
# step, 27B decode with/without graphs + tiny host overhead, then the rest of the fast-op tests.
# Usage (repo root, GPU machine): NINFER_COMMIT=<sha> bash bench/decode_session.sh; logs under $OUT.
set -o pipefail
. bench/_device_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,driver_version --format=csv | tee "$OUT/gpu.txt"
t0=$(date +%s)
K="conv_update or recurrent_gdn or src_to_dst or moe_experts or program or rms_norm"
# NOTE: -k also filters test_cuda_graphs_gpu.py, so that file runs in its own call (no filter).
timeout ${T0:-60} python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_cuda_graphs_gpu.py 2>&1 \
  | tee "$OUT/tests_graphs.log" | tail -8
timeout ${T1:-120} python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_program_cuda.py \
  tests/gpu/test_fast_ops_gpu.py -k "$K" 2>&1 | tee "$OUT/tests_changed.log" | tail -15
echo "== t=$(( $(date +%s) - t0 ))s"
timeout ${T2:-70} python3 bench/graph_kernels.py --identity qwen3_6-tiny-dense qwen3_6-27b --batches 1 8 2>&1 \
  | tee "$OUT/graph_kernels.log" | tail -6
echo "== t=$(( $(date +%s) - t0 ))s"
timeout ${T3:-170} python3 -m ninfer.gateway.cli.main bench decode --identity qwen3_6-27b qwen3_6-35b-a3b --ctx 1024 \
  --batches 1 2 4 8 --reps 5 --no-ref --prefill-ref-gdn --host-overhead --no-hf-baseline --step-timeout 70 \
  --out "$OUT/bench" 2>&1 | tee "$OUT/decode.log" | grep -v "^JSON" | tail -30
echo "== t=$(( $(date +%s) - t0 ))s"
timeout ${T4:-40} python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_fast_ops_gpu.py -k "not ($K)" 2>&1 \
  | tee "$OUT/tests_rest.log" | tail -4
echo "== t=$(( $(date +%s) - t0 ))s"
rem=$(( ${TOTAL:-455} - ($(date +%s) - t0) ))
if [ $rem -gt 30 ]; then   # the other pass's prefill bench (TTFT 1k / 8k), in what is left
  timeout $rem python3 -m ninfer.gateway.cli.main bench prefill --identity qwen3_6-27b qwen3_6-35b-a3b --lengths 1024 8192 \
    --reps 2 --chunk 8192 --step-timeout 45 --out "$OUT/bench" 2>&1 | tee "$OUT/prefill.log" | grep -v "^JSON" | tail -12
fi
echo "== t=$(( $(date +%s) - t0 ))s"
echo "== summary"; grep -h "passed\|failed" "$OUT"/tests_*.log | tail -3
grep -A8 "identity  B  kernels" "$OUT/graph_kernels.log"
