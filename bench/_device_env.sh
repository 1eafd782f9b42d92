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
if ls .tcache/tcache.txz.* >/dev/null 2>&1; then cat .tcache/tcache.txz.* | tar xJ -C /tmp/tcache 2>/dev/null
elif ls .tcache/tcache.tgz.* >/dev/null 2>&1; then cat .tcache/tcache.tgz.* | tar xz -C /tmp/tcache 2>/dev/null
elif [ -f .tcache/tcache.tgz ]; then tar xzf .tcache/tcache.tgz -C /tmp/tcache 2>/dev/null; fi
save_tcache() {   # xz in pieces of 15 MB (a returned file is capped at 16 MiB), at most 3 of them
  rm -f "$OUT"/tcache.t?z*
  tar cf - -C /tmp/tcache . 2>/dev/null | xz -T0 -6 | split -b 15000000 -d -a 2 - "$OUT/tcache.txz."
  if [ -e "$OUT/tcache.txz.03" ]; then   # too big to come back: autotune results only
    rm -f "$OUT"/tcache.txz.*
    (cd /tmp/tcache && find . -name '*.autotune.json' | tar cJf "$OUT/tcache.txz.00" -T -)
  fi
  ls -la "$OUT"/tcache.txz.*
}
