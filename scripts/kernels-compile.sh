#!/usr/bin/env bash
# The CUDA kernels compiled here, without a GPU, as the backend compiles them on a device: NVRTC
# (from NVIDIA's nvidia-cuda-nvrtc wheel) turns engine/model/src/cuda/*.cu, in kernels.rs's order, into PTX for compute_90,
# then ptxas (nvidia-cuda-nvcc wheel) into sm_90 code, reporting each kernel's registers and
# spills. Fails on a compile error, a missing kernel, or a spill in a kernel that must keep its
# state in registers (decode attention, tensor-core prefill). The wheels (about 100 MB) are fetched once into
# target/cuda-tools/; without network or pip this check is reported as skipped, never passed.
#
#   scripts/kernels-compile.sh [OUT_DIR]   # the PTX and ptxas's report in OUT_DIR (default target/cuda-tools/out)
#   scripts/kernels-compile.sh --fetch     # only fetch the wheels (CI does it while it tests)
set -uo pipefail
cd "$(dirname "$0")/.."
TOOLS=target/cuda-tools
FETCH_ONLY=0
[ "${1:-}" = --fetch ] && { FETCH_ONLY=1; shift; }
OUT=${1:-$TOOLS/out}
mkdir -p "$TOOLS" "$OUT"
for pkg in nvidia-cuda-nvrtc nvidia-cuda-nvcc; do
  if ! ls "$TOOLS/$pkg"/nvidia >/dev/null 2>&1; then
    rm -rf "$TOOLS/wheel"
    if ! python3 -m pip download -q --no-deps -d "$TOOLS/wheel" "$pkg==13.*" >"$TOOLS/pip.log" 2>&1; then
      echo "kernels-compile: skipped: $pkg could not be downloaded (see $TOOLS/pip.log)"
      exit 0
    fi
    python3 -m zipfile -e "$TOOLS"/wheel/*.whl "$TOOLS/$pkg" || { echo "kernels-compile: $pkg's wheel does not unpack" >&2; exit 1; }
  fi
done
[ "$FETCH_ONLY" = 1 ] && exit 0
NVRTC=$(find "$TOOLS/nvidia-cuda-nvrtc" -name 'libnvrtc.so.*' ! -name '*builtins*' | head -1)
PTXAS=$(find "$TOOLS/nvidia-cuda-nvcc" -name ptxas -type f | head -1)
[ -n "$NVRTC" ] && [ -n "$PTXAS" ] || { echo "kernels-compile: libnvrtc or ptxas missing from the wheels" >&2; exit 1; }
chmod +x "$PTXAS"
LD_LIBRARY_PATH="$(dirname "$NVRTC")" python3 - "$NVRTC" "$OUT/kernels.ptx" <<'PY' || exit 1
import ctypes, re, sys
lib = ctypes.CDLL(sys.argv[1])
# The files in kernels.rs's SOURCE order.
kernels_rs = open("engine/model/src/cuda/kernels.rs").read()
names = ["engine/model/src/cuda/" + f for f in re.findall(r'include_str!\("(\w+\.cu)"\)', kernels_rs.split("SOURCE")[1].split(");")[0])]
src = "".join(open(n).read() for n in names)
prog = ctypes.c_void_p()
assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"plateau-kernels.cu", 0, None, None) == 0
opts = (ctypes.c_char_p * 1)(b"--gpu-architecture=compute_90")
rc = lib.nvrtcCompileProgram(prog, 1, opts)
n = ctypes.c_size_t()
lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
log = ctypes.create_string_buffer(n.value)
lib.nvrtcGetProgramLog(prog, log)
if rc != 0:
    print(f"kernels-compile: NVRTC could not compile {' + '.join(names)}:\n{log.value.decode()}", file=sys.stderr)
    sys.exit(1)
lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
ptx = ctypes.create_string_buffer(n.value)
lib.nvrtcGetPTX(prog, ptx)
open(sys.argv[2], "w").write(ptx.value.decode())
# Every kernel the backend loads (kernels.rs's NAMES, for both types) is in the module.
wanted = re.findall(r'^\s+"(\w+)",$', kernels_rs.split("const NAMES")[1].split("];")[0], re.M)
bf16_only = re.findall(r'"(\w+)"', kernels_rs.split("const BF16_NAMES")[1].split("];")[0].split("=")[1])
entries = set(re.findall(r"\.visible \.entry (\w+)\(", ptx.value.decode()))
missing = [f"{w}_{t}" for w in wanted for t in ("f32", "bf16") if f"{w}_{t}" not in entries]
missing += [f"{w}_bf16" for w in bf16_only if f"{w}_bf16" not in entries]
if missing:
    print(f"kernels-compile: kernels.rs loads kernels the module lacks: {missing}", file=sys.stderr)
    sys.exit(1)
print(f"kernels-compile: NVRTC compiled {len(entries)} kernels for compute_90 from {len(names)} files ({len(wanted)} names in f32 and bf16, {len(bf16_only)} in bf16 alone)")
PY
"$PTXAS" -arch=sm_90 -v "$OUT/kernels.ptx" -o "$OUT/kernels.cubin" >"$OUT/ptxas.txt" 2>&1 || { cat "$OUT/ptxas.txt" >&2; echo "kernels-compile: ptxas failed" >&2; exit 1; }
python3 - "$OUT/ptxas.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
bad, rows = [], []
for name, body in re.findall(r"Compiling entry function '(\w+)' for 'sm_90'\n(.*?)(?=Compiling entry|\Z)", text, re.S):
    regs = re.search(r"Used (\d+) registers", body)
    spill = re.search(r"(\d+) bytes spill stores", body)
    regs, spill = int(regs.group(1)) if regs else -1, int(spill.group(1)) if spill else -1
    rows.append((name, regs, spill))
    if name.startswith(("attention_decode", "attention_prefill_tc")) and spill != 0:
        bad.append(f"{name} spills {spill} bytes")
for name, regs, spill in sorted(rows):
    if name.startswith(("attention", "argmax", "sample")):
        print(f"  {name:<28} {regs:>4} registers, {spill} bytes spilled")
if bad:
    print("kernels-compile: " + "; ".join(bad), file=sys.stderr)
    sys.exit(1)
print(f"kernels-compile: ok: ptxas built {len(rows)} kernels for sm_90")
PY
