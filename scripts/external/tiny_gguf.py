"""Writes a tiny Llama model as GGUF (llama.cpp's format) with seeded random weights.

Shape: 2 layers, 64 wide, 4 heads, 256 feed-forward, 2048 positions. Vocabulary: <unk>, <s>, </s>,
the 256 byte tokens <0x00>..<0xFF> (llama.cpp falls back to them for any character outside the
vocabulary) and the printable ASCII characters, with and without a leading word marker. About 0.5 MB:
it loads and answers in milliseconds, which is what a soak of the server (not of the model) needs.
    python tiny_gguf.py OUT.gguf [SEED]
"""
import sys

import gguf
import numpy as np

path = sys.argv[1]
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
rng = np.random.default_rng(seed)
dim, layers, heads, ff, ctx = 64, 2, 4, 256, 2048

tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [2, 3, 3]
for b in range(256):
    tokens.append(f"<0x{b:02X}>"); scores.append(0.0); types.append(6)
for c in (chr(i) for i in range(33, 127)):
    for t in (c, "\u2581" + c):
        tokens.append(t); scores.append(-1.0 - len(tokens) / 1000); types.append(1)
tokens.append("\u2581"); scores.append(-0.5); types.append(1)
vocab = len(tokens)

w = gguf.GGUFWriter(path, "llama")
w.add_name("plateau-tiny-llama")
w.add_context_length(ctx)
w.add_embedding_length(dim)
w.add_block_count(layers)
w.add_feed_forward_length(ff)
w.add_head_count(heads)
w.add_head_count_kv(heads)
w.add_rope_dimension_count(dim // heads)
w.add_layer_norm_rms_eps(1e-5)
w.add_file_type(gguf.LlamaFileType.ALL_F32)
w.add_tokenizer_model("llama")
w.add_token_list(tokens)
w.add_token_scores(scores)
w.add_token_types(types)
w.add_bos_token_id(1)
w.add_eos_token_id(2)
w.add_unk_token_id(0)
w.add_add_bos_token(True)


def mat(rows, cols):
    return (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)


w.add_tensor("token_embd.weight", mat(vocab, dim))
for i in range(layers):
    p = f"blk.{i}."
    w.add_tensor(p + "attn_norm.weight", np.ones(dim, dtype=np.float32))
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        w.add_tensor(p + name + ".weight", mat(dim, dim))
    w.add_tensor(p + "ffn_norm.weight", np.ones(dim, dtype=np.float32))
    w.add_tensor(p + "ffn_gate.weight", mat(ff, dim))
    w.add_tensor(p + "ffn_up.weight", mat(ff, dim))
    w.add_tensor(p + "ffn_down.weight", mat(dim, ff))
w.add_tensor("output_norm.weight", np.ones(dim, dtype=np.float32))
w.add_tensor("output.weight", mat(vocab, dim))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(f"{path}: {vocab} tokens, {layers} layers, {dim} wide")
