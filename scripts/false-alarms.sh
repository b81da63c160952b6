#!/usr/bin/env bash
# False alarms of the detector, under load: every shipped scenario at its full default length for
# seeds FIRST..LAST (default 1..20), two soaks side by side (JOBS=N to change; SCENARIOS="a b" for
# some), clean and with each plant in PLANTS (default: every plant of `plateau list`, the must-pass
# caches; PLANTS=none for clean runs only); then the external mode's clean runs, two side by side, for seeds 1..EXTERNAL_SEEDS
# (default 5): n-sampling and mixed against `plateau serve`, and n-sampling against a Python
# server whose LRU of 8 KiB entries is full at 1,000 and churns (scripts/external/lru_server.py);
# then one long `mixed` run.
#   scripts/false-alarms.sh [FIRST] [LAST] [LONG_ITERATIONS]     (build first: cargo build --release;
#   PLATEAU=path/to/plateau to use another binary; LONG_ITERATIONS=0 skips the long run)
# Prints one line per run that did not pass, then a summary: false alarms (exit 1) apart from
# undecided runs (exit 4). Exits 1 on a false alarm or a harness error, 4 when runs were only
# undecided, 0 when every run passed.
set -u
cd "$(dirname "$0")/.."
first=${1:-1}; last=${2:-20}; long=${3:-2000}
plateau=$(realpath "${PLATEAU:-target/release/plateau}")
[ -x "$plateau" ] || { echo "build first: cargo build --release -p plateau-soak" >&2; exit 2; }
out=$(mktemp -d)
scenarios=${SCENARIOS:-"n-sampling aborts rl-rollout prefill-only mixed multimodal-repeat pd-transfer"}
plants=${PLANTS:-"bounded-cache cleared-buffer prompt-lru"}
[ "$plants" = none ] && plants=""
jobs=()
for seed in $(seq "$first" "$last"); do for s in $scenarios; do
  jobs+=("local $s $seed")
  for p in $plants; do jobs+=("plant:$p $s $seed"); done
done; done
for seed in $(seq 1 "${EXTERNAL_SEEDS:-5}"); do
  jobs+=("serve n-sampling $seed" "serve mixed $seed" "lru n-sampling $seed")
done
# One soak: local (in-process), plant:NAME (in-process with that plant), serve (plateau serve spawned on a free port) or lru (the Python
# server spawned on a free port); prints "EXIT KIND SCENARIO SEED".
run_one() {
  set -- $1
  local kind=$1 s=$2 seed=$3 dir="$out/$1-$2-$3" port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  case $kind in
    local) "$plateau" run "$s" --seed "$seed" --quiet --out "$dir" >"$dir.log" 2>&1 ;;
    plant:*) "$plateau" run "$s" --seed "$seed" --plant "${kind#plant:}" --quiet --out "$dir" >"$dir.log" 2>&1 ;;
    serve) "$plateau" run "$s" --seed "$seed" --quiet --out "$dir" --target "http://127.0.0.1:$port" \
             --spawn "$plateau serve $s --port $port" >"$dir.log" 2>&1 ;;
    lru)   "$plateau" run "$s" --seed "$seed" --quiet --out "$dir" --target "http://127.0.0.1:$port" \
             --spawn "python3 $PWD/scripts/external/lru_server.py $port" >"$dir.log" 2>&1 ;;
  esac
  echo "$? $kind $s $seed"
}
export -f run_one; export plateau out
t0=$(date +%s)
printf '%s\n' "${jobs[@]}" | xargs -P "${JOBS:-2}" -I{} bash -c 'run_one "{}"' > "$out/codes"
bad=$(awk '$1 != 0' "$out/codes")
alarms=$(awk '$1 == 1' "$out/codes" | grep -c .); undecided=$(awk '$1 == 4' "$out/codes" | grep -c .)
echo "$(wc -l < "$out/codes") clean runs (in-process seeds $first..$last at default lengths, plants: ${plants:-none}, external seeds 1..${EXTERNAL_SEEDS:-5}) in $(( $(date +%s) - t0 )) s: $alarms false alarms (exit 1), $undecided undecided (exit 4), $(echo -n "$bad" | grep -c .) did not pass"
[ -n "$bad" ] && echo "$bad" | while read -r code kind s seed; do
  echo "  exit $code: $kind $s seed $seed: $(grep -m1 '^verdict:' "$out/$kind-$s-$seed.log")"
done
code=0
if [ "$long" != 0 ]; then
  t1=$(date +%s)
  "$plateau" run mixed --iterations "$long" --quiet --out "$out/mixed-long" >"$out/mixed-long.log" 2>&1; code=$?
  echo "mixed, $long iterations: exit $code in $(( $(date +%s) - t1 )) s: $(grep -m1 '^verdict:' "$out/mixed-long.log")"
fi
echo "runs kept in $out"
# 1: a clean run failed (a false alarm) or the harness failed; 4: only undecided runs.
errors=$(awk '$1 != 0 && $1 != 4' "$out/codes" | grep -c .)
if [ "$errors" != 0 ] || { [ "$code" != 0 ] && [ "$code" != 4 ]; }; then exit 1; fi
if [ "$undecided" != 0 ] || [ "$code" = 4 ]; then exit 4; fi
