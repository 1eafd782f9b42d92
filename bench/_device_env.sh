# Sourced before a device command (`. bench/_device_env.sh; python3 ...`): $OUT, PYTHONPATH with the repo and the carried wheels
# (.whl/*.whl, e.g. fla-core, installed into /tmp/site), unbuffered Python.
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
# Triton's compile cache and autotuning results (fla-core's chunk kernels autotune for minutes on a
# bare machine) live in /tmp/tcache; `save_tcache` packs them into $OUT/tcache.tgz, which a later
# call carries back as .tcache/tcache.tgz (.tcache is git-ignored locally).
export TRITON_CACHE_DIR=/tmp/tcache TRITON_CACHE_AUTOTUNING=1
mkdir -p /tmp/tcache
[ -f .tcache/tcache.tgz ] && tar xzf .tcache/tcache.tgz -C /tmp/tcache 2>/dev/null
save_tcache() {
  tar czf "$OUT/tcache.tgz" -C /tmp/tcache . 2>/dev/null
  if [ "$(stat -c %s "$OUT/tcache.tgz")" -gt 15000000 ]; then   # too big to come back: autotune results only
    (cd /tmp/tcache && find . -name '*.autotune.json' | tar czf "$OUT/tcache.tgz" -T -)
  fi
  ls -la "$OUT/tcache.tgz"
}
