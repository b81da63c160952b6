#!/usr/bin/env bash
# Builds llama.cpp's OpenAI-compatible `llama-server` and writes a tiny GGUF model, cached under
# target/external/. llama.cpp's source comes from PyPI (llama-cpp-python's source package carries
# it whole; Debian has no llama.cpp package); cmake and ninja come from PyPI into a venv.
#   scripts/external/setup-llama.sh      prints the server binary's path and the model's, one per line
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=target/external
venv=$dir/venv
mkdir -p "$dir"
log=$dir/setup.log
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >>"$log" 2>&1
  "$venv/bin/pip" install -q --upgrade pip >>"$log" 2>&1
fi
"$venv/bin/pip" install -q "gguf>=0.10" "numpy" "cmake>=3.21" "ninja" >>"$log" 2>&1
server=$dir/llama-build/bin/llama-server
if [ ! -x "$server" ]; then
  src=$(ls -d "$dir"/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | head -1 || true)
  if [ -z "$src" ]; then
    "$venv/bin/pip" download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==0.3.*" -d "$dir/sdist" >>"$log" 2>&1
    tar -xzf "$(ls "$dir"/sdist/llama_cpp_python-*.tar.gz | head -1)" -C "$dir"
    src=$(ls -d "$dir"/llama_cpp_python-*/vendor/llama.cpp | head -1)
  fi
  PATH="$PWD/$venv/bin:$PATH" cmake -S "$src" -B "$dir/llama-build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF >>"$log" 2>&1
  PATH="$PWD/$venv/bin:$PATH" cmake --build "$dir/llama-build" --target llama-server -j 2 >>"$log" 2>&1
fi
model=$dir/tiny-llama.gguf
[ -f "$model" ] || "$venv/bin/python" scripts/external/tiny_gguf.py "$model" >>"$log" 2>&1
echo "$PWD/$server"
echo "$PWD/$model"
