#!/usr/bin/env bash
# Where a CUDA step's time goes, on the GPU machine, with Nsight Compute: every kernel of one decode
# step (TinyLlama shape, bf16, batch 64, 512-token contexts) and of one 2,047-token prefill, timed
# one by one (gpu__time_duration), grouped by kernel, each group beside its bound (the bytes it
# must move at the measured copy bandwidth, or its flops at 790 TFLOP/s bf16) and beside the step's
# wall time measured without the profiler. The difference between the two is what the GPU did not
# spend in kernels: launches, uploads of the step's metadata, and the host's own work.
#
#   scripts/build-gpu-bin.sh                   # here
#   scripts/gpu-profile.sh OUT_DIR [BIN_DIR]   # there: logs and CSVs in OUT_DIR, a table last
#
# Exit 0 when both profiles were taken, 1 otherwise, 2 without a CUDA device or ncu.
set -uo pipefail
OUT=${1:?usage: scripts/gpu-profile.sh OUT_DIR [BIN_DIR]}
BIN=${2:-gpu-bin}
mkdir -p "$OUT"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "gpu-profile: no ncu (Nsight Compute) found" >&2; exit 2; }
"$BIN/gpu_check" throughput --help > /dev/null 2>&1 || { echo "gpu-profile: $BIN/gpu_check is missing" >&2; exit 2; }

# Wall times without the profiler first.
timeout 120 "$BIN/gpu_check" throughput --batches 64 > "$OUT/plain.json" 2> "$OUT/plain.err"
failed=0
for what in decode prefill; do
  timeout 240 "$NCU" --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --print-units base \
    --csv --page raw --log-file "$OUT/ncu-$what.csv" \
    "$BIN/gpu_check" throughput --batches 64 --profile "$what" > "$OUT/ncu-$what.out" 2> "$OUT/ncu-$what.err" || failed=1
done
python3 - "$OUT" <<'PY' | tee "$OUT/table.txt"
import csv, json, os, sys
out = sys.argv[1]
plain = {}
try:
    plain = json.loads(open(os.path.join(out, "plain.json")).read().strip().splitlines()[-1])
except Exception as e:
    print(f"no plain run: {e}")
def group(name):
    n = name.lower()
    if any(s in n for s in ("gemm", "nvjet", "cublas", "cutlass", "splitk", "reduce_kernel")):
        return "cuBLAS matrix products"
    return name.split("(")[0].strip()
shape = plain.get("shape", {})
bw = plain.get("copy_bandwidth_gb_s", float("nan")) * 1e9
def bound_ms(what, name):
    """A group's floor in ms: decode moves bytes (weights once, each sequence's KV once, the
    logits once), prefill computes flops; None where the group's traffic is too small to bound."""
    try:
        if what == "decode":
            if name == "cuBLAS matrix products":
                return shape["weight_bytes"] / bw * 1e3
            if name.startswith("attention_decode"):
                return 64 * (shape["context"] + 10) * shape["kv_token_bytes"] / bw * 1e3
            if name.startswith(("argmax_rows", "sample_rows")):
                return 64 * shape["vocab"] * shape["dtype_bytes"] / bw * 1e3
        else:
            if name == "cuBLAS matrix products":
                return shape["prefill_matmul_flops"] / 790e12 * 1e3
            if name.startswith("attention_prefill"):
                return shape["prefill_attention_flops"] / 790e12 * 1e3
    except (KeyError, TypeError, ZeroDivisionError):
        pass
    return None
for what in ("decode", "prefill"):
    path = os.path.join(out, f"ncu-{what}.csv")
    rows = []
    try:
        lines = [l for l in open(path) if l.startswith('"')]
        for r in csv.DictReader(lines):
            v = r.get("gpu__time_duration.sum", "")
            try:
                rows.append((r["Kernel Name"], float(v.replace(",", ""))))
            except (KeyError, ValueError):
                pass  # the units row
    except OSError as e:
        print(f"{what}: no profile ({e})")
        continue
    if not rows:
        print(f"{what}: the profile holds no kernels (see {path})")
        continue
    # gpu__time_duration is in ns unless the units row said usecond/msecond; ncu's raw page uses ns.
    groups = {}
    for name, ns in rows:
        g = groups.setdefault(group(name), [0, 0.0])
        g[0] += 1
        g[1] += ns
    total_ms = sum(ns for _, ns in rows) / 1e6
    if what == "decode":
        wall = next((r["step_ms"] for r in plain.get("decode", []) if r["batch"] == 64), float("nan"))
    else:
        wall = plain.get("prefill_ms", float("nan"))
    print(f"== {what}: {len(rows)} kernels, {total_ms:.2f} ms in kernels; step wall time {wall:.2f} ms without the profiler ({wall - total_ms:.2f} ms outside kernels)")
    for name, (n, ns) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        b = bound_ms(what, name)
        beside = f"; bound {b:.3f} ms ({ns / 1e6 / b:.1f}x)" if b else ""
        print(f"  {name[:48]:<48} {n:>5} launches {ns / 1e6:>9.3f} ms {100 * ns / 1e6 / total_ms:>5.1f}%{beside}")
PY
exit $failed
