#!/usr/bin/env bash
# The GPU suite on a device machine, as one pytest run: `pytest -m gpu tests/gpu` in ONE process.
# On a bare machine most of that run is Triton compiling kernels (CPU bound, one core), so the compile cache is
# first filled by several pytest processes over disjoint sets of files in parallel; their results are thrown away.
# The one-process run after them is the result: its log and junit XML land in $OUT.
#
#   . bench/_device_env.sh; bash bench/gpu_suite.sh [WARM_PROCS=4] [WARM_TIMEOUT_S=270] [SUITE_TIMEOUT_S=270]
#
# WARM_PROCS=0 skips the warm-up (a carried cache that is already warm).
set -u
procs=${1:-4}; warm_timeout=${2:-270}; suite_timeout=${3:-270}
OUT=${OUT:-out}; mkdir -p "$OUT/warm"
files=(tests/gpu/test_*.py)
if [ "$procs" -gt 0 ]; then
  start=$SECONDS
  for ((i = 0; i < procs; i++)); do
    group=()
    for ((j = i; j < ${#files[@]}; j += procs)); do group+=("${files[j]}"); done
    timeout "$warm_timeout" python3 -m pytest -q -m gpu -p no:cacheprovider "${group[@]}" \
      >"$OUT/warm/group$i.log" 2>&1 &
  done
  wait
  echo "warm-up: $procs processes, $((SECONDS - start)) s"
  for ((i = 0; i < procs; i++)); do echo "  group $i: $(tail -n 1 "$OUT/warm/group$i.log")"; done
fi
start=$SECONDS
timeout "$suite_timeout" python3 -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/gpu_suite.xml" tests/gpu \
  >"$OUT/gpu_suite.log" 2>&1
rc=$?
echo "one-process suite: rc $rc, $((SECONDS - start)) s (commit ${NINFER_COMMIT:-unknown})"
grep -E "^(FAILED|ERROR)" "$OUT/gpu_suite.log" | head -20
tail -n 3 "$OUT/gpu_suite.log"
exit $rc
