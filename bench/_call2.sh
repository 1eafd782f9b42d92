. bench/_device_env.sh
export NINFER_COMMIT=$(cat .commit)
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv,noheader
timeout 120 python3 bench/vision_encode.py --identity qwen3_6-27b --reps 5 --sdpa-backends cudnn_attention flash_attention efficient_attention --gelu-epilogue 2>&1 | tee $OUT/vision_encode.log | grep -v "^JSON" | tail -4; grep -o "\"ninfer_[a-z_]*ms\": [0-9.]*\|\"ninfer_[a-z_]*rel_rms\": [0-9.e-]*" $OUT/vision_encode.log
enc=$(grep '^JSON' $OUT/vision_encode.log | python3 -c "import json,sys; r=[x for x in json.loads(sys.stdin.read()[5:])['results'] if x['media'].startswith('image')]; print(round(r[0]['ninfer_ms'],2))")
echo "encode ms: $enc"
timeout 200 python3 bench/vision_ttft.py --identity qwen3_6-27b --reps 5 --encode-ms ${enc:-15.71} --out $OUT 2>&1 | grep -v "^JSON" | tail -5
left=$((560 - SECONDS)); echo "left: $left"
timeout $left python3 -m ninfer bench serve --identity qwen3_6-27b --concurrency 1 --prompt-len 1024 --output-len 64 \
  --requests-per-client 2 --max-model-len 8192 --speculative-method mtp --num-speculative-tokens 3 \
  --draft-vocab-size 32768 --force-accept-len 3 --with-plain 2>&1 | tee $OUT/serve_mtp.log | grep -v "^JSON" | tail -14
save_tcache
