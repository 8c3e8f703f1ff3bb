#!/usr/bin/env python3
"""Trains kvedge's default models: a byte-level BPE vocabulary and an OPT-architecture cloud
model and a smaller edge model, on the King James Bible as Debian ships it (package
bible-kjv-text, public domain; read through the `bible` program of package bible-kjv).

    /usr/bin/python3 scripts/train_models.py corpus  --out models/kjv
    /usr/bin/python3 scripts/train_models.py bpe     --out models/kjv
    /usr/bin/python3 scripts/train_models.py train   --out models/kjv --size cloud
    /usr/bin/python3 scripts/train_models.py train   --out models/kjv --size edge
    /usr/bin/python3 scripts/train_models.py fixture --out models/kjv --size cloud
    /usr/bin/python3 scripts/train_models.py tokenizer-json --out models/kjv
    /usr/bin/python3 scripts/train_models.py train   --out models/kjv --size cloud --arch llama
    /usr/bin/python3 scripts/train_models.py train   --out models/kjv --size edge --arch llama

needs python3-torch and python3-numpy (scripts/setup.sh --reference) and bible-kjv. Every step
is seeded; `corpus` and `bpe` are exact, `train` is deterministic on one machine (torch's CPU
kernels may differ in the last bits elsewhere).

The corpus is split by chapter: every chapter whose index is 7 mod 20 is held out (never seen
by the vocabulary or the models), the rest trains. Files written under --out:
    train.txt, heldout.txt        one chapter after another: "Book N" line, then one verse a line
    vocab.json, merges.txt        GPT-2 format: byte-level BPE, specials <s> <pad> </s> <unk>
    cloud/model.safetensors       OPT, Hugging Face tensor names, F16 weights (F32 norms, biases)
    cloud/config.json             shape and training settings
    cloud/loss.csv                step, tokens, train loss, held-out loss
    (edge/ the same)
    llama/tokenizer.json          the same vocabulary as Llama 3 ships its tokenizer: a Split
                                  with Llama 3's regex, ByteLevel(use_regex=false),
                                  ignore_merges, <s> added before the text
    llama/cloud/, llama/edge/     the Llama-family pair (--arch llama): rotary positions,
                                  grouped-query attention, RMSNorm, SwiGLU, tied embeddings;
                                  a Hugging Face folder each: config.json (LlamaForCausalLM),
                                  model.safetensors (F16 matrices, F32 norms), tokenizer.json,
                                  training.json (steps, seed, time, held-out loss), loss.csv
"""
import argparse
import collections
import json
import math
import os
import re
import struct
import subprocess
import sys
import time

SEED = 20261124
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
VOCAB_SIZE = 4096  # specials + 256 bytes + merges
HELDOUT_EVERY, HELDOUT_AT = 20, 7
POS_OFFSET = 2  # Hugging Face OPT: position p is row p + 2 of embed_positions

# OPT shapes: (layers, hidden, heads, ffn, max positions, train window, steps, batch, lr)
SIZES = {
    "cloud": dict(layers=6, hidden=192, heads=6, ffn=768, max_pos=512, window=512,
                  steps=700, batch=8, lr=2e-3),
    "edge": dict(layers=3, hidden=128, heads=4, ffn=512, max_pos=512, window=512,
                 steps=400, batch=8, lr=3e-3),
}

# The Llama-family pair: (layers, hidden, query heads, KV heads, head dim, SwiGLU width, rotary
# base, positions, train window, steps, batch, lr). Grouped-query attention as the edge models
# have it: 3 query heads per KV head in the cloud model, 4 in the edge one.
LLAMA_SIZES = {
    "cloud": dict(layers=6, hidden=192, heads=6, kv_heads=2, head_dim=32, ffn=512,
                  theta=10000.0, max_pos=512, window=512, steps=600, batch=8, lr=2e-3),
    "edge": dict(layers=4, hidden=128, heads=4, kv_heads=1, head_dim=32, ffn=384,
                 theta=10000.0, max_pos=512, window=512, steps=400, batch=8, lr=3e-3),
}
RMS_EPS = 1e-5
BOS = 0  # "<s>": the Llama pair's tokenizer.json puts it before every text; training too
# Llama 3's Split regex, as its tokenizer.json has it (the C tokenizer runs this one) ...
LLAMA3_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
# ... and its ASCII form for Python's re (the corpus is ASCII; the C tokenizer's ids on the
# held-out text are checked against these by test_tokenizer_kjv_llama).
LLAMA3_PAT = re.compile(r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]{1,3}"""
                        r"""| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

# GPT-2's pre-tokenization. The corpus is ASCII, so the letter and number classes are ASCII
# here; the C tokenizer implements the Unicode ones (tests compare it with GPT-2's own encoder).
PAT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    """GPT-2's map of the 256 bytes to printable characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


# ---------------------------------------------------------------- corpus

def read_bible():
    out = subprocess.run(["bible", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                         text=True, env=dict(os.environ, COLUMNS="10000")).stdout
    chapters, title, verses = [], None, []
    for line in out.splitlines():
        if not line.strip():
            continue
        m = re.match(r"^\s+(\d+)\s+(.*)$", line)
        if m:
            verses.append(m.group(2).strip())
        elif line.startswith(" ") and verses:
            verses[-1] += " " + line.strip()
        else:
            if title:
                chapters.append((title, verses))
            title, verses = line.strip(), []
    if title:
        chapters.append((title, verses))
    return chapters


def chapter_text(title, verses):
    return title + "\n" + "\n".join(verses) + "\n\n"


def cmd_corpus(a):
    chapters = read_bible()
    if len(chapters) != 1189:
        sys.exit(f"expected 1189 chapters, got {len(chapters)}")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "train.txt"), "w") as tr, \
            open(os.path.join(a.out, "heldout.txt"), "w") as ho:
        for i, (t, v) in enumerate(chapters):
            (ho if i % HELDOUT_EVERY == HELDOUT_AT else tr).write(chapter_text(t, v))
    print(f"{len(chapters)} chapters")


def load_chapters(path):
    text = open(path).read()
    return [c + "\n\n" for c in text.split("\n\n") if c.strip()]


# ---------------------------------------------------------------- BPE

def cmd_bpe(a):
    b2u = bytes_to_unicode()
    text = open(os.path.join(a.out, "train.txt")).read()
    words = collections.Counter(PAT.findall(text))
    # Each word as a list of symbols; pairs counted with the words they occur in.
    seqs = [[b2u[b] for b in w.encode()] for w in words]
    freqs = list(words.values())
    pairs, where = collections.Counter(), collections.defaultdict(set)
    for i, s in enumerate(seqs):
        for p in zip(s, s[1:]):
            pairs[p] += freqs[i]
            where[p].add(i)
    merges = []
    n_merges = VOCAB_SIZE - len(SPECIALS) - 256
    while len(merges) < n_merges and pairs:
        # Most frequent pair; ties by the pair itself, so the result does not depend on order.
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        if pairs[best] < 2:
            break
        merges.append(best)
        new = best[0] + best[1]
        for i in list(where[best]):
            s, f = seqs[i], freqs[i]
            for p in zip(s, s[1:]):
                pairs[p] -= f
                if pairs[p] <= 0:
                    del pairs[p]
            j, t = 0, []
            while j < len(s):
                if j + 1 < len(s) and (s[j], s[j + 1]) == best:
                    t.append(new)
                    j += 2
                else:
                    t.append(s[j])
                    j += 1
            seqs[i] = t
            for p in zip(t, t[1:]):
                pairs[p] += f
                where[p].add(i)
        del where[best]
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for b in range(256):
        vocab[b2u[b]] = len(vocab)
    for x, y in merges:
        vocab[x + y] = len(vocab)
    with open(os.path.join(a.out, "vocab.json"), "w") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(a.out, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
        for x, y in merges:
            f.write(f"{x} {y}\n")
    print(f"{len(vocab)} tokens, {len(merges)} merges")


class Tokenizer:
    """Encoder for the vocabulary above (the C tokenizer is the one the project uses; this one
    exists so training needs nothing but Python)."""

    def __init__(self, d, llama=False):
        self.vocab = json.load(open(os.path.join(d, "vocab.json")))
        lines = open(os.path.join(d, "merges.txt")).read().splitlines()[1:]
        self.ranks = {tuple(l.split(" ")): i for i, l in enumerate(lines) if l}
        self.b2u = bytes_to_unicode()
        self.cache = {}
        # The Llama pair's form (llama/tokenizer.json): Llama 3's regex, a piece that is in the
        # vocabulary whole is one id (ignore_merges), <s> before the text.
        self.pat = LLAMA3_PAT if llama else PAT
        self.ignore_merges = llama
        self.bos = [BOS] if llama else []

    def bpe(self, w):
        if w in self.cache:
            return self.cache[w]
        s = [self.b2u[b] for b in w.encode()]
        if self.ignore_merges and "".join(s) in self.vocab:
            s = ["".join(s)]
        while len(s) > 1:
            r = min(((self.ranks.get(p, 1 << 30), i) for i, p in enumerate(zip(s, s[1:]))))
            if r[0] == 1 << 30:
                break
            pair = (s[r[1]], s[r[1] + 1])
            t, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and (s[j], s[j + 1]) == pair:
                    t.append(s[j] + s[j + 1])
                    j += 2
                else:
                    t.append(s[j])
                    j += 1
            s = t
        ids = [self.vocab[x] for x in s]
        self.cache[w] = ids
        return ids

    def encode(self, text):
        return self.bos + [i for w in self.pat.findall(text) for i in self.bpe(w)]


def cmd_tokenizer_json(a):
    """llama/tokenizer.json: vocab.json and merges.txt as Llama 3 ships its tokenizer."""
    vocab = json.load(open(os.path.join(a.out, "vocab.json")))
    merges = [l for l in open(os.path.join(a.out, "merges.txt")).read().splitlines()[1:] if l]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": False}
    bos = SPECIALS[BOS]
    doc = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for t in SPECIALS],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated",
             "invert": False}, byte_level]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
             "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": bos, "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {bos: {"id": bos, "ids": [BOS], "tokens": [bos]}}}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {t: i for t, i in vocab.items() if t not in SPECIALS},
                  "merges": merges},
    }
    d = os.path.join(a.out, "llama")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    print(f"{d}/tokenizer.json: {len(vocab)} tokens, {len(merges)} merges")


# ---------------------------------------------------------------- the model

def make_model(torch, nn, c, vocab):
    H, NH = c["hidden"], c["heads"]

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj = nn.Linear(H, H), nn.Linear(H, H)
            self.v_proj, self.out_proj = nn.Linear(H, H), nn.Linear(H, H)

        def forward(self, x):
            b, t, _ = x.shape
            sh = lambda y: y.view(b, t, NH, H // NH).transpose(1, 2)
            q, k, v = sh(self.q_proj(x)), sh(self.k_proj(x)), sh(self.v_proj(x))
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) \
                if hasattr(torch.nn.functional, "scaled_dot_product_attention") else None
            if y is None:
                s = (q @ k.transpose(-1, -2)) * (H // NH) ** -0.5
                s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), -1e9)
                y = torch.softmax(s, -1) @ v
            return self.out_proj(y.transpose(1, 2).reshape(b, t, H))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn_layer_norm, self.self_attn = nn.LayerNorm(H), Attn()
            self.final_layer_norm = nn.LayerNorm(H)
            self.fc1, self.fc2 = nn.Linear(H, c["ffn"]), nn.Linear(c["ffn"], H)

        def forward(self, x):
            x = x + self.self_attn(self.self_attn_layer_norm(x))
            return x + self.fc2(torch.relu(self.fc1(self.final_layer_norm(x))))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, H)
            self.embed_positions = nn.Embedding(c["max_pos"] + POS_OFFSET, H)
            self.layers = nn.ModuleList(Layer() for _ in range(c["layers"]))
            self.final_layer_norm = nn.LayerNorm(H)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1]) + POS_OFFSET
            x = self.embed_tokens(ids) + self.embed_positions(pos)
            for l in self.layers:
                x = l(x)
            return self.final_layer_norm(x) @ self.embed_tokens.weight.T

    m = Decoder()
    with torch.no_grad():  # GPT-2 style initialization
        for name, p in m.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c["layers"]) if name.endswith(
                    ("out_proj.weight", "fc2.weight")) else 0.02
                p.normal_(0.0, std)
            elif name.endswith("bias"):
                p.zero_()
    return m


def make_llama(torch, nn, c, vocab):
    """Llama: RMSNorm, rotary positions (Hugging Face's rotate-half), grouped-query attention,
    SwiGLU, tied embeddings; module names as Hugging Face's LlamaForCausalLM has them (under
    "model."). PyTorch 1.13 has neither nn.RMSNorm nor scaled_dot_product_attention."""
    H, NH, KH, D, F = c["hidden"], c["heads"], c["kv_heads"], c["head_dim"], c["ffn"]
    inv_freq = 1.0 / (c["theta"] ** (torch.arange(0, D, 2, dtype=torch.float32) / D))

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(H))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS))

    def rotate_half(x):
        return torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1)

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(H, NH * D, bias=False)
            self.k_proj = nn.Linear(H, KH * D, bias=False)
            self.v_proj = nn.Linear(H, KH * D, bias=False)
            self.o_proj = nn.Linear(NH * D, H, bias=False)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            q = self.q_proj(x).view(b, t, NH, D).transpose(1, 2)
            k = self.k_proj(x).view(b, t, KH, D).transpose(1, 2)
            v = self.v_proj(x).view(b, t, KH, D).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            # Query head h reads KV head h / (NH / KH), as Hugging Face's repeat_kv.
            k, v = k.repeat_interleave(NH // KH, 1), v.repeat_interleave(NH // KH, 1)
            s = (q @ k.transpose(-1, -2)) * D ** -0.5
            s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), -1e9)
            y = torch.softmax(s, -1) @ v
            return self.o_proj(y.transpose(1, 2).reshape(b, t, NH * D))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(H, F, bias=False)
            self.up_proj = nn.Linear(H, F, bias=False)
            self.down_proj = nn.Linear(F, H, bias=False)

        def forward(self, x):
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.self_attn = RMSNorm(), Attn()
            self.post_attention_layernorm, self.mlp = RMSNorm(), MLP()

        def forward(self, x, cos, sin):
            x = x + self.self_attn(self.input_layernorm(x), cos, sin)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, H)
            self.layers = nn.ModuleList(Layer() for _ in range(c["layers"]))
            self.norm = RMSNorm()

        def forward(self, ids):
            ang = torch.arange(ids.shape[1], dtype=torch.float32)[:, None] * inv_freq[None]
            ang = torch.cat([ang, ang], -1)
            cos, sin = ang.cos(), ang.sin()
            x = self.embed_tokens(ids)
            for l in self.layers:
                x = l(x, cos, sin)
            return self.norm(x) @ self.embed_tokens.weight.T

    class Top(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Model()

        def forward(self, ids):
            return self.model(ids)

    m = Top()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c["layers"]) if name.endswith(
                    ("o_proj.weight", "down_proj.weight")) else 0.02
                p.normal_(0.0, std)
    return m


def save_llama(torch, m, d, c, vocab, meta):
    """A Hugging Face folder: model.safetensors (F16 matrices, F32 norms), config.json
    (LlamaForCausalLM), tokenizer.json (the pair's shared one), training.json."""
    write_weights(torch, m, os.path.join(d, "model.safetensors"), {"format": "pt"}, "")
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": c["hidden"], "intermediate_size": c["ffn"],
        "num_hidden_layers": c["layers"], "num_attention_heads": c["heads"],
        "num_key_value_heads": c["kv_heads"], "head_dim": c["head_dim"], "hidden_act": "silu",
        "max_position_embeddings": c["max_pos"], "rms_norm_eps": RMS_EPS,
        "rope_theta": c["theta"], "rope_scaling": None, "attention_bias": False,
        "mlp_bias": False, "tie_word_embeddings": True, "vocab_size": vocab,
        "bos_token_id": BOS, "eos_token_id": SPECIALS.index("</s>"), "torch_dtype": "float16",
    }
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=1)
    json.dump(meta, open(os.path.join(d, "training.json"), "w"), indent=1)
    src = os.path.join(os.path.dirname(d), "tokenizer.json")
    with open(src, "rb") as f, open(os.path.join(d, "tokenizer.json"), "wb") as g:
        g.write(f.read())


def save_model(torch, m, path, meta):
    """safetensors by hand: u64 LE header length, JSON header, tensors back to back. Matrices
    F16, norms and biases F32; names as Hugging Face's OPTForCausalLM has them."""
    md = {k: str(v) for k, v in meta.items()}
    # What the C loader and Hugging Face read: the head count is not in the tensor shapes.
    md.update(format="pt", num_attention_heads=str(meta["heads"]), do_layer_norm_before="true",
              activation_function="relu")
    write_weights(torch, m, path, md, "model.decoder.")


def write_weights(torch, m, path, metadata, prefix):
    """safetensors by hand: u64 LE header length, JSON header (metadata, then each tensor of m's
    state dict under prefix + its name), tensors back to back; matrices F16, vectors F32.
    Written to a temporary file, renamed."""
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name, p in m.state_dict().items():
        t = p.detach().contiguous()
        if t.dim() == 2:
            b, dt = t.to(torch.float16).numpy().astype("<f2").tobytes(), "F16"
        else:
            b, dt = t.to(torch.float32).numpy().astype("<f4").tobytes(), "F32"
        header[prefix + name] = {"dtype": dt, "shape": list(t.shape),
                                 "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    os.replace(path + ".tmp", path)


def encode_file(tok, path):
    return [tok.encode(c) for c in load_chapters(path)]


def cmd_train(a):
    import torch
    from torch import nn
    torch.manual_seed(SEED)
    torch.set_num_threads(a.threads)
    llama = a.arch == "llama"
    c = dict((LLAMA_SIZES if llama else SIZES)[a.size])
    if a.steps:
        c["steps"] = a.steps
    tok = Tokenizer(a.out, llama)
    vocab = len(tok.vocab)
    train = encode_file(tok, os.path.join(a.out, "train.txt"))
    held = encode_file(tok, os.path.join(a.out, "heldout.txt"))
    stream = torch.tensor([i for ch in train for i in ch])
    starts = torch.tensor([0] + list(__import__("itertools").accumulate(len(ch) for ch in train))[:-1])
    hstream = torch.tensor([i for ch in held for i in ch])
    print(f"{a.size}: {len(stream)} train tokens, {len(hstream)} held-out, vocab {vocab}",
          flush=True)
    m = (make_llama if llama else make_model)(torch, nn, c, vocab)
    params = sum(p.numel() for p in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=c["lr"], betas=(0.9, 0.95), weight_decay=0.1)
    W, B, S = c["window"], c["batch"], c["steps"]
    gen = torch.Generator().manual_seed(SEED)
    d = os.path.join(a.out, "llama", a.size) if llama else os.path.join(a.out, a.size)
    os.makedirs(d, exist_ok=True)
    log = open(os.path.join(d, "loss.csv"), "w")
    log.write("step,tokens,train_loss,heldout_loss\n")

    def heldout_loss():
        m.eval()
        with torch.no_grad():
            tot, n = 0.0, 0
            for s in range(0, len(hstream) - W - 1, W * 4):
                x = hstream[s:s + W].unsqueeze(0)
                y = hstream[s + 1:s + W + 1].unsqueeze(0)
                tot += nn.functional.cross_entropy(m(x).view(-1, vocab), y.view(-1),
                                                   reduction="sum").item()
                n += W
        m.train()
        return tot / n

    t0, ema = time.time(), None
    for step in range(1, S + 1):
        lr = c["lr"] * min(1.0, step / 50) * 0.5 * (1 + math.cos(math.pi * step / S))
        for g in opt.param_groups:
            g["lr"] = lr
        # Half the windows start at a chapter's first token: the model learns how chapters begin.
        r = torch.randint(0, len(stream) - W - 1, (B,), generator=gen)
        ci = torch.randint(0, len(starts), (B,), generator=gen)
        at_start = torch.rand(B, generator=gen) < 0.5
        r = torch.where(at_start, starts[ci].clamp(max=len(stream) - W - 1), r)
        x = torch.stack([stream[i:i + W] for i in r.tolist()])
        y = torch.stack([stream[i + 1:i + W + 1] for i in r.tolist()])
        loss = nn.functional.cross_entropy(m(x).view(-1, vocab), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 50 == 0 or step == S:
            hl = heldout_loss()
            log.write(f"{step},{step * B * W},{ema:.4f},{hl:.4f}\n")
            log.flush()
            print(f"{a.size} step {step}/{S} loss {ema:.3f} heldout {hl:.3f} "
                  f"({time.time() - t0:.0f} s)", flush=True)
    log.close()
    meta = dict(c, vocab=vocab, seed=SEED, params=params, train_tokens=len(stream),
                seconds=round(time.time() - t0), heldout_loss=round(heldout_loss(), 4))
    if llama:
        save_llama(torch, m, d, c, vocab, meta)
    else:
        save_model(torch, m, os.path.join(d, "model.safetensors"), meta)
        json.dump(meta, open(os.path.join(d, "config.json"), "w"), indent=1)
    print(json.dumps(meta), flush=True)


def load_model(torch, nn, d):
    """The saved model as the file holds it (F16 matrices widened to fp32), in eval mode."""
    c = json.load(open(os.path.join(d, "config.json")))
    raw = open(os.path.join(d, "model.safetensors"), "rb").read()
    hl = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + hl])
    base = 8 + hl
    m = make_model(torch, nn, c, c["vocab"]).eval()
    sd = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        dt = {"F16": torch.float16, "F32": torch.float32}[e["dtype"]]
        t = torch.frombuffer(bytearray(raw[base + a:base + b]), dtype=dt).reshape(e["shape"])
        sd[name[len("model.decoder."):]] = t.to(torch.float32)
    m.load_state_dict(sd)
    return m, c


def cmd_fixture(a):
    """Logits the C decoder must match: every position of the first 64 tokens of the first
    held-out chapter, and 8 greedy steps by full recomputation."""
    import torch
    from torch import nn
    torch.set_num_threads(a.threads)
    d = os.path.join(a.out, a.size)
    m, c = load_model(torch, nn, d)
    tok = Tokenizer(a.out)
    ids = torch.tensor(tok.encode(load_chapters(os.path.join(a.out, "heldout.txt"))[0])[:64])
    with torch.no_grad():
        logits = m(ids[None])[0]
        seq, greedy, gl, margins = ids.clone(), [], [], []
        for _ in range(8):
            last = m(seq[None])[0, -1]
            top = torch.topk(last, 2).values
            margins.append((top[0] - top[1]).item())
            t = int(torch.argmax(last))
            greedy.append(t)
            gl.append(last)
            seq = torch.cat([seq, torch.tensor([t])])
    tensors = {"prefill.tokens": ids.to(torch.float32), "prefill.logits": logits,
               "greedy.tokens": torch.tensor(greedy, dtype=torch.float32),
               "greedy.logits": torch.stack(gl)}
    header, blobs, off = {"__metadata__": {"seed": str(SEED), "torch": torch.__version__,
                                           "min_greedy_margin": f"{min(margins):.6g}"}}, [], 0
    for name, t in tensors.items():
        b = t.contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(d, "expected.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    print(f"{a.size}: greedy {greedy}, min margin {min(margins):.3g}, "
          f"max |logit| {logits.abs().max().item():.3g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["corpus", "bpe", "train", "fixture", "tokenizer-json"])
    ap.add_argument("--arch", choices=["opt", "llama"], default="opt",
                    help="train: the OPT pair (default) or the Llama-family pair")
    ap.add_argument("--out", default="models/kjv")
    ap.add_argument("--size", choices=sorted(SIZES), default="cloud")
    ap.add_argument("--steps", type=int, default=0, help="override the size's step count")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    {"corpus": cmd_corpus, "bpe": cmd_bpe, "train": cmd_train, "fixture": cmd_fixture,
     "tokenizer-json": cmd_tokenizer_json}[a.step](a)


if __name__ == "__main__":
    main()
