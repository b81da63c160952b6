#!/usr/bin/env bash
# Builds, here, what scripts/gpu-check.sh runs on the GPU machine (which has no Rust toolchain):
# the `plateau` binary and the engine's `gpu_check` and `generate` examples, in release, stripped,
# copied into gpu-bin/ (ignored by git; the device tool carries it: carry = ["gpu-bin"]).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p plateau-soak --bin plateau
cargo build --release -p plateau-engine --example gpu_check --example generate
mkdir -p gpu-bin
for f in target/release/plateau target/release/examples/gpu_check target/release/examples/generate; do
  cp "$f" gpu-bin/
  strip --strip-debug "gpu-bin/$(basename "$f")" 2>/dev/null || true
done
du -sh gpu-bin
