#!/usr/bin/env bash
# One device session: GPU tests, kernel bench, decode bench; logs under $OUT (device tool) or ./out.
# Usage (repo root, on the GPU machine): NINFER_COMMIT=<sha> bash bench/gpu_session.sh [tests] [kernels] [decode]
#        [graphs_tests] [graphs_bench]   (decode CUDA graphs: parity tests; 27B B=1,2,4,8 ctx 1k on/off + tiny host overhead)
#        [bench_all] = [bench_decode] [bench_prefill] [bench_serve]   (27B + 35B-A3B, synthetic weights, `ninfer bench`;
#        ~5 min in all; JSON under $OUT/bench/)
set -o pipefail
. bench/_device_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv | tee "$OUT/gpu.txt"
steps=${*:-tests kernels decode}
for s in $steps; do
  case $s in
    tests)   timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_fast_ops_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -25 ;;
    kernels) timeout 200 python3 bench/kernels.py 2>&1 | tee "$OUT/kernels.log" | grep -v "^JSON" ;;
    decode)  timeout 400 python3 bench/decode.py ${DECODE_ARGS:-} 2>&1 | tee "$OUT/decode.log" | grep -v "^JSON" ;;
    graphs_tests) timeout ${GT_TIMEOUT:-170} python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_cuda_graphs_gpu.py \
                    tests/gpu/test_fast_ops_gpu.py::test_moe_experts_decode 2>&1 | tee "$OUT/graphs_tests.log" | tail -30 ;;
    graphs_bench) timeout ${GB_TIMEOUT:-280} python3 bench/decode.py --identity qwen3_6-27b --ctx 1024 --batches 1 2 4 8 \
                    --reps 10 --no-ref --prefill-ref-gdn --host-overhead 2>&1 | tee "$OUT/graphs_bench.log" | grep -v "^JSON" ;;
    bench_all) bash "$0" bench_decode bench_prefill bench_serve ;;
    bench_decode)  timeout ${BD_TIMEOUT:-130} python3 -m ninfer.gateway.cli.main bench decode --identity qwen3_6-27b qwen3_6-35b-a3b \
                     --ctx 1024 --batches 1 8 --reps 5 --no-ref --prefill-ref-gdn --hf-baseline --hf-batches 1 8 \
                     --step-timeout 60 --out "$OUT/bench" 2>&1 | tee "$OUT/bench_decode.log" | grep -v "^JSON" ;;
    bench_prefill) timeout ${BP_TIMEOUT:-110} python3 -m ninfer.gateway.cli.main bench prefill --identity qwen3_6-27b qwen3_6-35b-a3b \
                     --lengths 1024 8192 32768 --reps 2 --long-reps 1 --chunk 8192 --step-timeout 45 \
                     --out "$OUT/bench" 2>&1 | tee "$OUT/bench_prefill.log" | grep -v "^JSON" ;;
    bench_serve)   timeout ${BS_TIMEOUT:-100} python3 -m ninfer.gateway.cli.main bench serve --identity qwen3_6-27b qwen3_6-35b-a3b \
                     --concurrency 1 2 4 8 --prompt-len 1024 --output-len 32 --requests-per-client 1 \
                     --startup-timeout 60 --step-timeout 30 --out "$OUT/bench" 2>&1 | tee "$OUT/bench_serve.log" | grep -v "^JSON" ;;
  esac
done
