#!/usr/bin/env bash
# One device session: GPU tests, kernel bench, decode bench; logs under $OUT (device tool) or ./out.
# Usage (repo root, on the GPU machine): NINFER_COMMIT=<sha> bash bench/gpu_session.sh [tests] [kernels] [decode]
#        [graphs_tests] [graphs_bench]   (decode CUDA graphs: parity tests; 27B B=1,2,4,8 ctx 1k on/off + tiny host overhead)
set -o pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv | tee "$OUT/gpu.txt"
steps=${*:-tests kernels decode}
for s in $steps; do
  case $s in
    tests)   timeout 240 python3 -m pytest -q -m gpu tests/test_fast_ops_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -25 ;;
    kernels) timeout 200 python3 bench/kernels.py 2>&1 | tee "$OUT/kernels.log" | grep -v "^JSON" ;;
    decode)  timeout 400 python3 bench/decode.py ${DECODE_ARGS:-} 2>&1 | tee "$OUT/decode.log" | grep -v "^JSON" ;;
    graphs_tests) timeout ${GT_TIMEOUT:-170} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py \
                    tests/test_fast_ops_gpu.py::test_moe_experts_decode 2>&1 | tee "$OUT/graphs_tests.log" | tail -30 ;;
    graphs_bench) timeout ${GB_TIMEOUT:-280} python3 bench/decode.py --identity qwen3_6-27b --ctx 1024 --batches 1 2 4 8 \
                    --reps 10 --no-ref --prefill-ref-gdn --host-overhead 2>&1 | tee "$OUT/graphs_bench.log" | grep -v "^JSON" ;;
  esac
done
