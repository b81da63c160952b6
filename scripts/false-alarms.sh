#!/usr/bin/env bash
# False alarms of the detector on this engine: every shipped scenario at its full default length,
# for seeds FIRST..LAST (default 1..20), two runs at a time (JOBS=N to change; SCENARIOS="a b" for some),
# then one long `mixed` run.
#   scripts/false-alarms.sh [FIRST] [LAST] [LONG_ITERATIONS]     (build first: cargo build --release;
#   PLATEAU=path/to/plateau to use another binary)
# Prints one line per run that did not pass, then a summary; exits 1 if any clean run failed.
set -u
cd "$(dirname "$0")/.."
first=${1:-1}; last=${2:-20}; long=${3:-2000}
plateau=${PLATEAU:-target/release/plateau}
[ -x "$plateau" ] || { echo "build first: cargo build --release -p plateau-soak" >&2; exit 2; }
out=$(mktemp -d)
scenarios=${SCENARIOS:-"n-sampling aborts rl-rollout prefill-only mixed multimodal-repeat pd-transfer"}
jobs=()
for seed in $(seq "$first" "$last"); do for s in $scenarios; do jobs+=("$s $seed"); done; done
run_one() {
  set -- $1
  "$plateau" run "$1" --seed "$2" --quiet --out "$out/$1-$2" >"$out/$1-$2.log" 2>&1
  echo "$? $1 $2"
}
export -f run_one; export plateau out
t0=$(date +%s)
printf '%s\n' "${jobs[@]}" | xargs -P "${JOBS:-2}" -I{} bash -c 'run_one "{}"' > "$out/codes"
bad=$(awk '$1 != 0' "$out/codes")
echo "$(wc -l < "$out/codes") clean runs (seeds $first..$last, default lengths) in $(( $(date +%s) - t0 )) s; $(echo -n "$bad" | grep -c .) did not pass"
[ -n "$bad" ] && echo "$bad" | while read -r code s seed; do echo "  exit $code: $s seed $seed: $(head -1 "$out/$s-$seed.log")"; done
t1=$(date +%s)
"$plateau" run mixed --iterations "$long" --quiet --out "$out/mixed-long" >"$out/mixed-long.log" 2>&1; code=$?
echo "mixed, $long iterations: exit $code in $(( $(date +%s) - t1 )) s: $(head -1 "$out/mixed-long.log")"
echo "runs kept in $out"
[ -z "$bad" ] && [ "$code" = 0 ]
