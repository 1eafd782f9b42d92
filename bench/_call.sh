#!/usr/bin/env bash
. bench/_device_env.sh
export NINFER_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
nvidia-smi --query-gpu=name,power.limit --format=csv > $OUT/smi.txt 2>&1
timeout 80 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fast_moe_gpu.py -k "sort_pairs or (prefill and 2048)" > $OUT/t4.txt 2>&1; echo "t4 rc=$?"; tail -3 $OUT/t4.txt
timeout 130 python3 bench/prefill_ab.py --identity qwen3_6-35b-a3b --tokens 8192 --reps 4 --pause 2 --variants base set:ninfer.ops.fast.moe.CHUNKED_SORT=0 > $OUT/ab35s.txt 2>&1; echo "ab35s rc=$?"; grep -v "^JSON" $OUT/ab35s.txt | tail -8 | cut -c1-160
