#!/usr/bin/env bash
# Device session of decode pass 3 (issue 8): fused small ops, fast MoE routing/experts, GEMV.
# Usage (repo root, GPU machine): NINFER_COMMIT=<sha> bash bench/pass3_session.sh <part>...
#   tests    every GPU test file (fused ops, MoE, GEMV, graphs, Program on CUDA, HF parity, fast ops);
#            $TEST_FILES, $TEST_K (pytest -k), $TEST_TAG (log name suffix) choose and name a subset
#   kernels  CUDA kernels per decode step (bench/graph_kernels.py, 27B B=1,8)
#   decode   27B + 35B-A3B decode step, ctx 1k, B=1,2,4,8, graphs, tiny host overhead
#   gemv     GEMV sweep vs cuBLAS (bench/gemv.py), per-step GEMM graph
#   prefill  TTFT 1k/8k, 27B and 35B-A3B
#   hfbase   decode B=1 with the transformers baseline in the same run
#   serve    OpenAI API end to end (`ninfer serve --load-format dummy`), concurrency 1/2/4/8
#   profile  per-kernel GPU time of a decode graph replay (+ PDL on/off) and of one prefill (bench/profile_step.py)
#   moe      35B-A3B MoE decode layer, old vs new expert kernels (bench/moe_decode.py)
#   prefill_ops  27B 8k prefill conv / GDN wrapper / attention, old vs new (bench/prefill_ops.py)
#   serve_engine  the same workload through the public Engine in process (what the gateway adds)
#   bisect   which fast op moves the fp32 Program's logits from the reference op set (bench/op_bisect.py)
#   step_ab  in-process A/B on the decode graph: the committed tree vs each of $AB_VARIANTS (GEMV --out files
#            overlaid and built-in switches, '+'-joined; default: this call's `gemv` part output; bench/step_ab.py;
#            $AB_ARGS: more step_ab options, e.g. --batch 8 --max-model-len 8192)
#   ttft     where one request's TTFT goes inside the Engine, per staged-prefill chunk (bench/ttft_timeline.py)
# Everything goes to $OUT/run.log (the device returns at most 8 files); Triton's cache to $OUT/tcache.tgz.
set -o pipefail
. bench/_device_env.sh
LOG="$OUT/run.log"
t0=$(date +%s)
stamp() { echo "== $1 t=$(( $(date +%s) - t0 ))s" | tee -a "$LOG"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv 2>&1 | tee -a "$LOG"
for part in "$@"; do
  stamp "$part"
  case $part in
    tests)   timeout ${T_TESTS:-240} python3 -m pytest -v -m gpu -p no:cacheprovider -rf --timeout ${T_TEST_EACH:-150} \
               ${TEST_FILES:-tests/gpu/test_fused_ops_gpu.py tests/gpu/test_gdn_decode_gpu.py tests/gpu/test_fast_moe_gpu.py \
               tests/gpu/test_gemv_gpu.py tests/gpu/test_cuda_graphs_gpu.py tests/gpu/test_program_cuda.py tests/gpu/test_hf_parity_gpu.py} \
               ${TEST_K:+-k "$TEST_K"} -s > "$OUT/tests${TEST_TAG:-}.log" 2>&1
             grep -E "FAILED|ERROR|matched prefix|passed|failed" "$OUT/tests${TEST_TAG:-}.log" | tee -a "$LOG" | tail -40 ;;
    fastops) timeout ${T_FASTOPS:-150} python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_fast_ops_gpu.py 2>&1 \
               | tee -a "$LOG" | tail -15 ;;
    kernels) timeout ${T_KERNELS:-90} python3 bench/graph_kernels.py --identity qwen3_6-27b qwen3_6-35b-a3b --batches 1 8 2>&1 \
               | tee -a "$LOG" | tail -30 ;;
    decode)  timeout ${T_DECODE:-200} python3 -m ninfer.gateway.cli.main bench decode --identity qwen3_6-27b qwen3_6-35b-a3b \
               --ctx ${DECODE_CTX:-1024} --batches 1 2 4 8 --reps 10 --no-ref --prefill-ref-gdn --host-overhead --no-hf-baseline \
               --step-timeout 80 2>&1 | tee -a "$LOG" | tail -30 ;;
    gemv)    timeout ${T_GEMV:-300} python3 bench/gemv.py --out "$OUT/gemv_configs.txt" ${GEMV_ARGS:-} 2>&1 \
               | tee -a "$LOG" | tail -60 ;;
    hfbase)  timeout ${T_HF:-200} python3 -m ninfer.gateway.cli.main bench decode --identity qwen3_6-27b qwen3_6-35b-a3b \
               --ctx 1024 --batches 1 --reps 5 --no-ref --prefill-ref-gdn --hf-baseline --hf-batches 1 \
               --step-timeout 90 2>&1 | tee -a "$LOG" | grep -v "^JSON" | tail -14 ;;
    serve)   timeout ${T_SERVE:-200} python3 -m ninfer.gateway.cli.main bench serve --identity qwen3_6-27b qwen3_6-35b-a3b \
               --concurrency 1 2 4 8 --prompt-len 1024 --output-len 32 --requests-per-client 1 \
               --startup-timeout 120 --step-timeout 40 2>&1 | tee -a "$LOG" | grep -v "^JSON" | tail -16 ;;
    serve_engine) timeout ${T_SERVE:-200} python3 -m ninfer.gateway.cli.main bench serve --in-process \
               --identity qwen3_6-27b qwen3_6-35b-a3b --concurrency 1 2 4 8 --prompt-len 1024 --output-len 32 \
               --requests-per-client 1 --startup-timeout 120 --step-timeout 60 2>&1 | tee -a "$LOG" | grep -v "^JSON" | tail -16 ;;
    profile) timeout ${T_PROFILE:-300} python3 bench/profile_step.py --decode ${PROFILE_DECODE:-qwen3_6-27b qwen3_6-35b-a3b} \
               --batches ${PROFILE_BATCHES:-1} ${PROFILE_PDL:---pdl} --prefill ${PROFILE_PREFILL-qwen3_6-27b:8192} 2>&1 \
               | tee -a "$LOG" | tail -${PROFILE_TAIL:-400} > /dev/null ;;
    bisect)  for ident in ${BISECT_IDS:-qwen3_6-tiny-dense qwen3_6-tiny-moe}; do
               timeout ${T_BISECT:-120} python3 bench/op_bisect.py --identity $ident 2>&1 | tee -a "$LOG" | tail -40
             done ;;
    step_ab) timeout ${T_STEP_AB:-300} python3 bench/step_ab.py --identity ${AB_IDS:-qwen3_6-27b qwen3_6-35b-a3b} \
               --variants ${AB_VARIANTS:-$OUT/gemv_configs.txt} ${AB_ARGS:-} 2>&1 | tee -a "$LOG" | tail -30 ;;
    ttft)    timeout ${T_TTFT:-300} python3 bench/ttft_timeline.py --identity ${TTFT_ID:-qwen3_6-27b} \
               --chunks ${TTFT_CHUNKS:-512 8192} --reps ${TTFT_REPS:-2} 2>&1 | tee -a "$LOG" | tail -80 ;;
    moe)     timeout ${T_MOE:-90} python3 bench/moe_decode.py ${MOE_ARGS:-} 2>&1 | tee -a "$LOG" | tail -30 ;;
    prefill_ops) timeout ${T_PREFILL_OPS:-120} python3 bench/prefill_ops.py ${PREFILL_OPS_ARGS:-} 2>&1 | tee -a "$LOG" | tail -40 ;;
    prefill) timeout ${T_PREFILL:-200} python3 -m ninfer.gateway.cli.main bench prefill --identity qwen3_6-27b qwen3_6-35b-a3b \
               --lengths ${PREFILL_LENGTHS:-1024 8192} --reps 3 --long-reps 1 --chunk 8192 --step-timeout 120 2>&1 | tee -a "$LOG" | tail -20 ;;
  esac
done
stamp end
save_tcache
