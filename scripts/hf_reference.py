#!/usr/bin/env python3
"""Reference checks with PyTorch and transformers, run by scripts/gpu-check.sh on the GPU machine.

  parity WEIGHTS_DIR DUMP.json   logits of the engine's CUDA backend (f32) against transformers on
                                 the same safetensors weights; prints one JSON object.
  generate WEIGHTS_DIR BATCH     transformers' decode throughput with generate (bf16, greedy, 512-token
                                 prompts): the time of 48 new tokens minus the time of 1, over 47 tokens
                                 per sequence; prints one JSON object.
"""
import json
import statistics
import sys
import time

import torch
from transformers import LlamaForCausalLM


def parity(weights, dump_path):
    dump = json.load(open(dump_path))
    model = LlamaForCausalLM.from_pretrained(weights, torch_dtype=torch.float32, attn_implementation="eager").cuda().eval()
    tokens = dump["tokens"]
    n = dump["prompt_len"]
    with torch.no_grad():
        out = model(torch.tensor([tokens], device="cuda")).logits[0].float().cpu()
    worst = 0.0
    # Engine row k is the logits after n + k tokens: position n + k - 1 of the full sequence.
    for k, row in enumerate(dump["logits"]):
        ref = out[n + k - 1]
        eng = torch.tensor(row)
        worst = max(worst, ((ref - eng).abs().max() / ref.abs().max().clamp_min(1e-12)).item())
    ok = worst < 1e-3
    print(json.dumps({"check": "hf-parity", "rel_err": worst, "limit": 1e-3, "positions": len(dump["logits"]), "pass": ok}))
    return 0 if ok else 1


def generate(weights, batch):
    model = LlamaForCausalLM.from_pretrained(weights, torch_dtype=torch.bfloat16).cuda().eval()
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (batch, 512), device="cuda", generator=gen)
    mask = torch.ones_like(ids)

    def timed(new):
        times = []
        with torch.no_grad():
            for _ in range(3):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    t48, t1 = timed(48), timed(1)
    decode = max(t48 - t1, 1e-9)
    print(json.dumps({"check": "hf-generate", "batch": batch, "decode_tok_s": batch * 47 / decode, "decode_seconds": decode, "prefill_seconds": t1}))
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] not in ("parity", "generate"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    if sys.argv[1] == "parity":
        sys.exit(parity(sys.argv[2], sys.argv[3]))
    sys.exit(generate(sys.argv[2], int(sys.argv[3])))
