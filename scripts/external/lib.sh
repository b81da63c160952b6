# What the scripts that soak a third-party server share (sourced by scripts/external-check.sh and
# scripts/vllm-check.sh).

# A free TCP port on 127.0.0.1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# text_only SRC DST: the scenario SRC without its phases that carry images (a server with no
# vision model takes none), written to DST.
text_only() {
  python3 - "$1" "$2" <<'PY'
import sys
src, dst = sys.argv[1], sys.argv[2]
blocks = open(src).read().split("[[phase]]")
kept = [blocks[0]] + [b for b in blocks[1:] if "images" not in b]
open(dst, "w").write("[[phase]]".join(kept))
PY
}
