#!/usr/bin/env bash
# The README's resolution figures, produced by the binary: a default n-sampling run (seed 1), its
# verdict's heap resolution per iteration and per request, what its noise alone resolves and what
# the default tolerance accepts. Prints the sentence; with --write, puts it into README.md in place
# of the one there. `soak/tests/docs.rs` checks that README.md says what the binary says.
#   scripts/readme-figures.sh [--write]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --release -p plateau-soak
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
code=0
target/release/plateau run n-sampling --seed 1 --quiet --no-replay --out "$out/run" >"$out/log" 2>&1 || code=$?
[ "$code" = 0 ] || { echo "the default n-sampling run (seed 1) exited $code: $(tail -3 "$out/log")" >&2; exit 1; }
python3 - "$out/run/verdict.json" "${1:-}" <<'PY'
import json, re, sys
v = json.load(open(sys.argv[1]))
t = next(m for m in v["metrics"] if m["name"] == "jemalloc.allocated")["trend"]
def b(x):
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"
sentence = (
    f"resolves {b(t['resolution_per_iter'])} bytes per iteration of heap, {b(t['resolution_per_request'])} bytes per request, "
    f"of which its noise alone resolves {b(t['noise_resolution_per_iter'])} bytes per iteration and the default tolerance "
    f"(`1B/request`, {v['requests_per_iter']:.0f} requests an iteration) accepts {b(t['tolerance_per_iter'])}."
)
print(sentence)
if sys.argv[2] == "--write":
    text = open("README.md").read()
    pattern = r"resolves [0-9.]+ bytes per iteration of heap,\s+[0-9.]+ bytes per request,\s+of which its noise alone resolves\s+[0-9.]+\s+bytes per iteration and the default tolerance\s+\(`1B/request`,\s+[0-9]+ requests an iteration\)\s+accepts\s+[0-9.]+\."
    new, n = re.subn(pattern, sentence, text)
    if n != 1:
        sys.exit(f"README.md: the figures' sentence was found {n} times, want 1")
    open("README.md", "w").write(new)
    print("README.md: written")
PY
