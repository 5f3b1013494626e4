#!/usr/bin/env bash
# The acceptance run on a GPU machine: eval.py test once, then benchmark and leaderboard RUNS times each
# (default 2), for the root problem and for any problem directories given as arguments; logs and the
# --json of every timed run under $OUT (default: /tmp/device_logs), and the judge's clock against the
# reported times over all of them (tools/judge/judge_clock.py) in $OUT/judge_clock.md.
#     OUT=/tmp/logs RUNS=2 tools/judge/device_eval.sh problems/paged_mqa_logits
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/device_logs}  # device logs stay out of the tree
runs=${RUNS:-2}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0
jsons=()
run() {  # tag, mode, log name, extra eval.py arguments
  local tag=$1 mode=$2 name=$3
  shift 3
  echo "=== $tag: eval.py $mode ($name)"
  python3 eval.py "$mode" "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $tag: eval.py $mode ($name) exit $rc"
  [ "$rc" = 0 ] || status=1
}
for problem in . "$@"; do
  tag=$(basename "$(cd "$problem" && pwd)")
  run "$tag" test "${tag}_test" --problem "$problem"
  for mode in benchmark leaderboard; do
    for i in $(seq 1 "$runs"); do
      json="$out/${tag}_${mode}_$i.json"
      run "$tag" "$mode" "${tag}_${mode}_$i" --problem "$problem" --json "$json"
      [ -f "$json" ] && jsons+=("$json")
    done
  done
done
if [ ${#jsons[@]} -gt 0 ]; then
  python3 tools/judge/judge_clock.py "${jsons[@]}" --write "$out/judge_clock.md" > /dev/null || status=1
  echo "=== judge's clock against the reported times: $out/judge_clock.md"
fi
exit $status
