#!/usr/bin/env bash
# One process of a prefill/decode pair of real vLLM servers (the CPU build scripts/external/setup-vllm.sh
# installs, on its tiny text model) whose KV moves through NIXL over UCX, host memory to host memory:
# the stack of the second incident. scripts/external/vllm-pd.toml starts three of these.
#
#   vllm-pd.sh prefill|decode PORT SIDE-CHANNEL-PORT     a vLLM server with the NixlConnector
#   vllm-pd.sh proxy PORT PREFILL-PORT DECODE-PORT       the proxy in front (pd_proxy.py)
#
# VLLM_VERSION picks the release (default: setup-vllm.sh's; NIXL's connector is V1's, 0.9 on).
# UCX's settings pass through from the environment: UCX_MEM_MMAP_HOOK_MODE=none turns its memory
# hooks off (the layer the incident's leak lived in). Each role ends in `exec`, so the process
# plateau watches is the server itself.
set -euo pipefail
cd "$(dirname "$0")/../.."
role=${1:-}; port=${2:-}; third=${3:-}
usage() { echo "usage: vllm-pd.sh prefill|decode PORT SIDE-CHANNEL-PORT | proxy PORT PREFILL-PORT DECODE-PORT" >&2; exit 2; }
[[ $port =~ ^[0-9]+$ ]] && [[ $third =~ ^[0-9]+$ ]] || usage
lines=$(scripts/external/setup-vllm.sh ${VLLM_VERSION:-}) || { echo "vllm-pd.sh: setup-vllm.sh ${VLLM_VERSION:-} failed" >&2; exit 1; }
serve=$(echo "$lines" | sed -n 1p)
python=$(echo "$lines" | sed -n 2p)
case $role in
  prefill|decode)
    # kv_producer (prefill: holds a prompt's KV for the decode side) or kv_consumer (decode: pulls
    # it); kv_buffer_device cpu: the KV cache is host memory, registered with NIXL as DRAM. The
    # side channel is where the decode side asks the prefill side for its agent's metadata.
    kv_role=kv_producer; [ "$role" = decode ] && kv_role=kv_consumer
    config="{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"$kv_role\",\"kv_buffer_device\":\"cpu\"}"
    # shellcheck disable=SC2086 # the serving command is words
    exec env VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_NIXL_SIDE_CHANNEL_PORT="$third" \
      $serve --host 127.0.0.1 --port "$port" --kv-transfer-config "$config";;
  proxy)
    fourth=${4:-}; [[ $fourth =~ ^[0-9]+$ ]] || usage
    exec "$python" scripts/external/pd_proxy.py --port "$port" \
      --prefill "http://127.0.0.1:$third" --decode "http://127.0.0.1:$fourth";;
  *) usage;;
esac
