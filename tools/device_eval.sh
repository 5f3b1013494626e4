#!/usr/bin/env bash
# The acceptance run on a GPU machine: eval.py test, benchmark and leaderboard for the root problem
# (and for any problem directories given as arguments), logs under $OUT (default: /tmp/device_logs).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/device_logs}  # device logs stay out of the tree
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0
for problem in . "$@"; do
  tag=$(basename "$(cd "$problem" && pwd)")
  for mode in test benchmark leaderboard; do
    echo "=== $tag: eval.py $mode"
    python3 eval.py "$mode" --problem "$problem" 2>&1 | tee "$out/${tag}_${mode}.log"
    rc=${PIPESTATUS[0]}
    echo "=== $tag: eval.py $mode exit $rc"
    [ "$rc" = 0 ] || status=1
  done
done
exit $status
