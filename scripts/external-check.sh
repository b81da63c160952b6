#!/usr/bin/env bash
# Soaks a real OpenAI-compatible server this project did not write: llama.cpp's `llama-server`, built
# (RelWithDebInfo, so its lines can be named) from the source PyPI's llama-cpp-python carries, on a
# tiny GGUF model this script writes (cached under target/external/; the first run builds for about
# 10 minutes on 2 cores). Each text scenario (n-sampling, aborts without its image phase,
# prefill-only) runs at its default length against llama-server (its default --cache-ram) and
# against `plateau serve`, both spawned by plateau on 127.0.0.1; the script prints both verdicts,
# the servers' RssAnon slopes and, where process memory failed, the allocating functions the
# profiled replay named (llama-server under a preloaded libjemalloc2; plateau serve has its own
# allocator, which the verdict says).
#   scripts/external-check.sh [SCENARIO...]
# Exits 0 when every run ended in a verdict (pass, fail or inconclusive: exit 0, 1 or 4: what the
# server does is the finding, not the check) and plateau serve passed every scenario.
set -u
cd "$(dirname "$0")/.."
paths=$(scripts/external/setup-llama.sh) || { echo "llama.cpp setup failed: see target/external/setup.log" >&2; exit 3; }
server=$(echo "$paths" | sed -n 1p); model=$(echo "$paths" | sed -n 2p)
cargo build -q --release -p plateau-soak || exit 3
plateau=$PWD/target/release/plateau
runs=target/external/runs
rm -rf "$runs"; mkdir -p "$runs"
scenarios=${*:-n-sampling aborts prefill-only}
# free_port, and text_only: a scenario's phases that carry images dropped (no vision model here).
. scripts/external/lib.sh
# slope RUN_DIR: the RssAnon verdict of the target, from verdict.json.
slope() {
  python3 - "$1/verdict.json" <<'PY'
import json, sys
try:
    v = json.load(open(sys.argv[1]))
except OSError:
    print("no verdict"); sys.exit()
m = {x["name"]: x for x in v["metrics"]}.get("target.proc.rss_anon")
print(f'{m["status"]}: {m["reason"]}' if m else "not measured")
PY
}
ok=1
for s in $scenarios; do
  file=scenarios/$s.toml
  [ -f "$file" ] || { echo "no scenario $file" >&2; exit 2; }
  text_only "$file" "$runs/$s.toml"
  for who in llama.cpp plateau-serve; do
    port=$(free_port)
    if [ "$who" = llama.cpp ]; then
      cmd="$server -m $model --host 127.0.0.1 --port $port --metrics -c 4096 -np 4 -t 2"
    else
      cmd="$plateau serve --port $port"
    fi
    out=$runs/$s-$who
    t0=$(date +%s.%N)
    "$plateau" run "$runs/$s.toml" --quiet --out "$out" --target "http://127.0.0.1:$port" --spawn "$cmd" >"$out.log" 2>&1
    code=$?
    secs=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
    echo "$s against $who: exit $code in $secs s"
    grep -E '^verdict:|iterations in|2xx to|where: site:|no allocating line' "$out.log" | sed 's/^/  /'
    echo "  server RssAnon: $(slope "$out")"
    case $code in 0|1|4) ;; *) ok=0; echo "  no verdict: $(tail -2 "$out.log")";; esac
    [ "$who" = plateau-serve ] && [ "$code" != 0 ] && ok=0
  done
done
echo "runs kept in $runs"
[ $ok = 1 ]
