. bench/_device_env.sh
export NINFER_COMMIT=$(cat .commit)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$gpu"
enc=$(cat .encode_ms 2>/dev/null || echo 15.71)
timeout 170 python3 bench/vision_ttft.py --identity qwen3_6-27b --reps 5 --encode-ms $enc --out $OUT 2>&1 | grep -v "^JSON\|^env" | tail -4
if echo "$gpu" | grep -q H200; then
  timeout 200 python3 bench/spec_step.py --identity qwen3_6-27b qwen3_6-35b-a3b --draft-vocab 0 32768 --batches 1 2>&1 | tee $OUT/spec_step.log | grep -v "^JSON\|^\[" | tail -12
  left=$((560 - SECONDS)); echo "left: $left"
  timeout $left python3 -m ninfer bench serve --identity qwen3_6-27b qwen3_6-35b-a3b --concurrency 1 --prompt-len 1024 --output-len 64 \
    --requests-per-client 2 --max-model-len 8192 --speculative-method mtp --num-speculative-tokens 3 \
    --draft-vocab-size 32768 --force-accept-len 3 --with-plain 2>&1 | tee $OUT/serve_mtp.log | grep -v "^JSON\|^env" | tail -14
else
  left=$((560 - SECONDS)); echo "left: $left"
  timeout $left python3 -m ninfer bench serve --identity qwen3_6-27b --concurrency 1 --prompt-len 1024 --output-len 64 \
    --requests-per-client 2 --max-model-len 8192 --speculative-method mtp --num-speculative-tokens 3 \
    --draft-vocab-size 32768 --force-accept-len 3 --with-plain 2>&1 | tee $OUT/serve_mtp.log | grep -v "^JSON\|^env" | tail -14
fi
save_tcache
