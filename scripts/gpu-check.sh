#!/usr/bin/env bash
# Every CUDA check of the project in one call on the GPU machine (under 8 minutes): parity with the
# CPU backend and with transformers, device memory across requests and sleep, soaks on the CUDA
# backend (clean and with injections), and throughput beside transformers and the machine's bounds.
#
#   scripts/build-gpu-bin.sh                 # here: builds gpu-bin/ (plateau, gpu_check, generate)
#   scripts/gpu-check.sh OUT_DIR [BIN_DIR]   # there: full logs in OUT_DIR, a table printed last
#
# Exit 0 when every check passes, 1 otherwise, 2 without a CUDA device.
set -uo pipefail
OUT=${1:?usage: scripts/gpu-check.sh OUT_DIR [BIN_DIR]}
BIN=${2:-gpu-bin}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
TABLE="$OUT/table.txt"
: > "$TABLE"
failed=0

row() { printf '%-40s %-5s %s\n' "$1" "$2" "$3" >> "$TABLE"; }
# run NAME TIMEOUT CMD...: stdout to NAME.out, stderr to NAME.err; prints the exit code.
run() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"
  echo $?
}
field() { python3 -c "import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(eval(sys.argv[2], {}, d))" "$@" 2>/dev/null || echo "?"; }
judge() { # judge NAME CODE WANT SUMMARY
  if [ "$2" = "$3" ]; then row "$1" ok "$4"; else row "$1" FAIL "exit $2 (want $3): $4"; failed=1; fi
}

if ! "$BIN/gpu_check" parity --help > /dev/null 2>&1; then
  echo "gpu-check: $BIN/gpu_check is missing: run scripts/build-gpu-bin.sh first" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>/dev/null \
  || echo "a CUDA device (nvidia-smi unavailable)" > "$OUT/gpu.txt"

# 1. Parity with the CPU backend (tiny preset), f32 and bf16; the f32 run dumps logits for transformers.
c=$(run parity-f32 120 "$BIN/gpu_check" parity --dtype f32 --dump "$OUT/parity-f32.json")
[ "$c" = 2 ] && { cat "$OUT/parity-f32.err" >&2; exit 2; }
judge "parity f32 vs cpu" "$c" 0 "prefill $(field "$OUT/parity-f32.out" prefill_rel_err), decode $(field "$OUT/parity-f32.out" decode_rel_err), greedy mismatches $(field "$OUT/parity-f32.out" greedy_mismatches) (< 1e-4)"
c=$(run parity-bf16 120 "$BIN/gpu_check" parity --dtype bf16)
judge "parity bf16 vs cpu" "$c" 0 "prefill $(field "$OUT/parity-bf16.out" prefill_rel_err), decode $(field "$OUT/parity-bf16.out" decode_rel_err) (< 2e-2)"

# 2. Parity with transformers on the same safetensors weights.
run save-tiny 60 "$BIN/generate" --prompt x --preset tiny --save-weights "$OUT/tiny-weights" > /dev/null
c=$(run hf-parity 180 python3 "$HERE/hf_reference.py" parity "$OUT/tiny-weights" "$OUT/parity-f32.json")
judge "parity f32 vs transformers" "$c" 0 "rel err $(field "$OUT/hf-parity.out" rel_err) over $(field "$OUT/hf-parity.out" positions) positions (< 1e-3)"

# 3. Device memory: 200 requests, check_idle, categories back to idle, sleep 2 frees >= 99%, wake.
c=$(run memory 120 "$BIN/gpu_check" memory)
judge "memory: idle, sleep 2, wake" "$c" 0 "check_idle $(field "$OUT/memory.out" check_idle); freed by allocator $(field "$OUT/memory.out" freed_by_allocator), by driver $(field "$OUT/memory.out" freed_by_driver)"
c=$(run memory-keeps-kv 120 "$BIN/gpu_check" memory --inject sleep-keeps-kv)
judge "memory: sleep-keeps-kv shows" "$c" 0 "KV bytes asleep $(field "$OUT/memory-keeps-kv.out" 'asleep_bytes[1]'), after wake $(field "$OUT/memory-keeps-kv.out" 'woke_bytes[1]')"

# 4. Soaks on the CUDA backend: clean scenarios pass, injections fail naming the right metric.
soak() { # soak NAME WANT_EXIT WANT_METRIC ARGS...
  local name=$1 want=$2 metric=$3
  shift 3
  local c
  c=$(run "soak-$name" 150 "$BIN/plateau" run "$@" --backend cuda --out "$OUT/soak-$name")
  local failing
  failing=$(python3 -c "import json,sys; v=json.load(open(sys.argv[1])); print(','.join(m['name'] for m in v['metrics'] if m['status']=='fail') or '-')" "$OUT/soak-$name/verdict.json" 2>/dev/null || echo "no verdict")
  if [ "$c" = "$want" ] && { [ "$metric" = - ] || [[ "$failing" == *"$metric"* ]]; }; then
    row "soak $name" ok "exit $c; failing: $failing"
  else
    row "soak $name" FAIL "exit $c (want $want, metric $metric); failing: $failing"
    failed=1
  fi
}
soak multimodal-repeat 0 - multimodal-repeat --iterations 60
soak pd-transfer 0 - pd-transfer --iterations 60
soak registry-retains-finished 1 registry.requests n-sampling --iterations 30 --inject registry-retains-finished
soak sleep-keeps-kv 1 kv rl-rollout --iterations 30 --inject sleep-keeps-kv

# 5. Throughput: the TinyLlama-shaped preset in bf16 beside transformers and the bandwidth bound.
c=$(run throughput 300 "$BIN/gpu_check" throughput --preset tinyllama-1.1b --dtype bf16 --batches 1,16,64)
run save-tinyllama 120 "$BIN/generate" --prompt x --preset tinyllama-1.1b --save-weights "$OUT/tinyllama-weights" > /dev/null
for b in 1 16 64; do
  run "hf-generate-$b" 150 python3 "$HERE/hf_reference.py" generate "$OUT/tinyllama-weights" "$b" > /dev/null
done
python3 - "$OUT" >> "$TABLE" <<'PY' || failed=1
import json, sys, os
out = sys.argv[1]
def last(name):
    try:
        return json.loads(open(os.path.join(out, name)).read().strip().splitlines()[-1])
    except Exception as e:
        return {"error": str(e)}
t = last("throughput.out")
bad = False
# The targets (issue "The CUDA engine near the hardware's bound"): batch 64 at five times
# transformers and its step within 3x of the bandwidth bound; batch 1 within 4x; other batches
# reported. Each row ends with its ratio to the bound.
BOUND = {64: 3.0, 1: 4.0}
for r in t.get("decode", []):
    hf = last(f"hf-generate-{r['batch']}.out").get("decode_tok_s")
    speed = r["decode_tok_s"] / hf if hf else float("nan")
    judged = r["batch"] in BOUND
    ok = r["ratio_to_bound"] <= BOUND.get(r["batch"], float("inf")) and (speed >= 5 if r["batch"] == 64 else True)
    bad |= not ok
    verdict = ('ok' if ok else 'FAIL') if judged else 'info'
    target = f", target 5x" if r["batch"] == 64 else ""
    print(f"{'decode bf16 batch ' + str(r['batch']):<40} {verdict:<5} {r['decode_tok_s']:.0f} tok/s; transformers {hf or float('nan'):.0f} ({speed:.1f}x{target}); step {r['step_ms']:.2f} ms vs bound {r['bound_ms']:.2f} ms ({r['ratio_to_bound']:.2f}x)")
if "prefill_tok_s" in t:
    # The prefill's target: within 10x of its matrix-product bound.
    ok = t['prefill_ms'] <= 10 * t['prefill_matmul_bound_ms']
    bad |= not ok
    print(f"{'prefill bf16 ' + str(int(t['prefill_tokens'])) + ' tokens':<40} {'ok' if ok else 'FAIL':<5} {t['prefill_tok_s']:.0f} tok/s; {t['prefill_ms']:.1f} ms vs matmul bound {t['prefill_matmul_bound_ms']:.2f} ms; copy bandwidth {t['copy_bandwidth_gb_s']:.0f} GB/s")
else:
    print(f"{'throughput':<40} FAIL  {t}")
    bad = True
sys.exit(1 if bad else 0)
PY

echo "== plateau gpu-check: $(cat "$OUT/gpu.txt" 2>/dev/null) =="
cat "$TABLE"
exit $failed
