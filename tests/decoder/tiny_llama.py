#!/usr/bin/env python3
"""Tiny random Llama-family models for test_decoder_llamacpp, and their GGUF form for llama.cpp.

  tiny_llama.py make KIND VOCAB.gguf TOKENIZER.json DIR
      writes a Hugging Face model directory: config.json, model.safetensors (F32; the qwen2 kind
      in two shards with model.safetensors.index.json) and tokenizer.json. KIND is one of
      llama (untied head, GQA 4/2, head_dim 16), llama3 (Llama 3's rope_scaling with a short
      original context so that every frequency band is used, tied head, head_dim 32) and qwen2
      (Q/K/V biases, tied head). The vocabulary is that of the llama.cpp test vocabulary
      VOCAB.gguf, whose token count sizes the embedding. Seeded: same kind, same bytes.
  tiny_llama.py bare KIND VOCAB THETA DIR
      the same model with a vocabulary of VOCAB tokens, rope_theta THETA and no tokenizer.json
      (the weights do not depend on THETA: two models that differ only in it have the same
      un-rotated K at layer 0); for tests that need no llama.cpp (test_ls_rotary).
  tiny_llama.py gguf DIR VOCAB.gguf|tokenizer.json OUT.gguf
      converts DIR (F32 or F16 weights, written as F32) to a GGUF v3 file as llama.cpp's
      convert_hf_to_gguf.py does for F32: the
      llama arch gets its Q/K rows permuted (LlamaModel.permute: llama.cpp's llama rotary pairs
      adjacent dimensions, Hugging Face's rotate-half pairs i and i + d/2), qwen2 none; Llama 3's
      rope_scaling becomes a rope_freqs tensor (LlamaModel.generate_extra_tensors); the
      tokenizer.* keys are copied from VOCAB.gguf, or made from a Llama 3-form tokenizer.json
      (the trained pair of models/kjv/llama).

GGUF v3 (ggml/docs/gguf.md): "GGUF", u32 version 3, u64 tensors, u64 keys; keys as (string,
u32 type, value); tensor infos as (string name, u32 n_dims, u64 dims innermost first, u32
type, u64 offset); the data section aligned to general.alignment (32).
"""
import json
import math
import os
import struct
import sys

import numpy as np

KINDS = {
    "llama": dict(model_type="llama", layers=3, hidden=64, heads=4, kv_heads=2, head_dim=16,
                  ffn=96, theta=500000.0, tie=False, bias=False, scaling=None, seed=1),
    "llama3": dict(model_type="llama", layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32,
                   ffn=160, theta=500000.0, tie=True, bias=False,
                   scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                   seed=2),
    "qwen2": dict(model_type="qwen2", layers=4, hidden=64, heads=4, kv_heads=2, head_dim=16,
                  ffn=128, theta=1000000.0, tie=True, bias=True, scaling=None, seed=3),
}
EPS = 1e-5
MAX_POS = 256
ALIGN = 32
GGUF_U32, GGUF_F32, GGUF_STRING = 4, 6, 8
SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_raw_keys(path):
    """The GGUF file's keys as {name: (type, raw value bytes)}, values kept byte for byte."""
    data = open(path, "rb").read()
    pos = 0

    def take(n):
        nonlocal pos
        if pos + n > len(data):
            raise ValueError(f"{path}: truncated")
        b = data[pos:pos + n]
        pos += n
        return b

    def u32():
        return struct.unpack("<I", take(4))[0]

    def u64():
        return struct.unpack("<Q", take(8))[0]

    def skip_value(t):
        if t in SCALARS:
            take(SCALARS[t])
        elif t == GGUF_STRING:
            take(u64())
        elif t == 9:
            it, n = u32(), u64()
            for _ in range(n):
                skip_value(it)
        else:
            raise ValueError(f"{path}: value type {t}")

    if take(4) != b"GGUF" or u32() != 3:
        raise ValueError(f"{path}: not GGUF v3")
    u64()
    keys = {}
    for _ in range(u64()):
        name = take(u64()).decode()
        t = u32()
        start = pos
        skip_value(t)
        keys[name] = (t, data[start:pos])
    return keys


def vocab_size(raw):
    t, b = raw["tokenizer.ggml.tokens"]
    return struct.unpack("<Q", b[4:12])[0]


def write_safetensors(path, tensors):
    header, off, blobs = {}, 0, []
    for name, a in tensors:
        a = np.ascontiguousarray(a, dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
        blobs.append(a.tobytes())
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] in ("F32", "F16"), f"{path}: {name} is {info['dtype']}"
        s, e = info["data_offsets"]
        dt = "<f4" if info["dtype"] == "F32" else "<f2"  # F16 widens to F32 exactly
        out[name] = np.frombuffer(data[8 + n + s:8 + n + e], dtype=dt).reshape(
            info["shape"]).astype(np.float32)
    return out


def make(kind, vocab_gguf, tokenizer, out, vocab=None, theta=None):
    k = dict(KINDS[kind])
    if theta is not None:
        k["theta"] = theta
    rng = np.random.default_rng(k["seed"])
    if vocab is None:
        vocab = vocab_size(gguf_raw_keys(vocab_gguf))
    H, F, hd = k["hidden"], k["ffn"], k["head_dim"]
    QD, KD = k["heads"] * hd, k["kv_heads"] * hd

    def w(*shape, std=None):
        return rng.normal(0, std or 1 / math.sqrt(shape[-1]), shape).astype(np.float32)

    def norm_w():
        return (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)

    t = [("model.embed_tokens.weight", w(vocab, H, std=1.0))]
    for l in range(k["layers"]):
        p = f"model.layers.{l}."
        t += [(p + "input_layernorm.weight", norm_w()),
              (p + "self_attn.q_proj.weight", w(QD, H)),
              (p + "self_attn.k_proj.weight", w(KD, H)),
              (p + "self_attn.v_proj.weight", w(KD, H)),
              (p + "self_attn.o_proj.weight", w(H, QD))]
        if k["bias"]:
            t += [(p + "self_attn.q_proj.bias", w(QD, std=0.5)),
                  (p + "self_attn.k_proj.bias", w(KD, std=0.5)),
                  (p + "self_attn.v_proj.bias", w(KD, std=0.5))]
        t += [(p + "post_attention_layernorm.weight", norm_w()),
              (p + "mlp.gate_proj.weight", w(F, H)),
              (p + "mlp.up_proj.weight", w(F, H)),
              (p + "mlp.down_proj.weight", w(H, F))]
    t.append(("model.norm.weight", norm_w()))
    if not k["tie"]:
        t.append(("lm_head.weight", w(vocab, H)))
    os.makedirs(out, exist_ok=True)
    cfg = {
        "architectures": ["Qwen2ForCausalLM" if k["model_type"] == "qwen2" else "LlamaForCausalLM"],
        "model_type": k["model_type"], "hidden_size": H, "intermediate_size": F,
        "num_hidden_layers": k["layers"], "num_attention_heads": k["heads"],
        "num_key_value_heads": k["kv_heads"], "head_dim": hd, "hidden_act": "silu",
        "max_position_embeddings": MAX_POS, "rms_norm_eps": EPS, "rope_theta": k["theta"],
        "rope_scaling": k["scaling"], "tie_word_embeddings": k["tie"], "vocab_size": vocab,
        "torch_dtype": "float32",
    }
    if k["model_type"] == "qwen2":
        cfg.update(use_sliding_window=False, sliding_window=MAX_POS, max_window_layers=k["layers"])
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    if kind == "qwen2":  # sharded, as large checkpoints are
        half = len(t) // 2
        shards = {"model-00001-of-00002.safetensors": t[:half],
                  "model-00002-of-00002.safetensors": t[half:]}
        for name, part in shards.items():
            write_safetensors(os.path.join(out, name), part)
        index = {"metadata": {}, "weight_map": {n: s for s, part in shards.items() for n, _ in part}}
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=1)
    else:
        write_safetensors(os.path.join(out, "model.safetensors"), t)
    if tokenizer is not None:
        with open(tokenizer, "rb") as src, open(os.path.join(out, "tokenizer.json"), "wb") as dst:
            dst.write(src.read())


def load_dir(d):
    p = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(p):
        files = sorted(set(json.load(open(p))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    t = {}
    for f in files:
        t.update(read_safetensors(os.path.join(d, f)))
    return t


def permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_factors(cfg, dim):
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors for rope_type llama3."""
    rs = cfg["rope_scaling"]
    base = cfg.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rs.get("factor", 8.0), rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    low_wl, high_wl = old / low, old / high
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            s = (old / wl - low) / (high - low)
            out.append(1 / ((1 - s) / factor + s))
    return np.array(out, dtype=np.float32)


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_array(item_type, items):
    """A GGUF array value's bytes (after its u32 type 9): item type, count, items."""
    out = struct.pack("<IQ", item_type, len(items))
    if item_type == GGUF_STRING:
        return out + b"".join(gguf_string(x) for x in items)
    return out + b"".join(struct.pack("<i", x) for x in items)


def tokenizer_keys(path):
    """The tokenizer.* keys of a Llama 3-form tokenizer.json (the project's Llama pair,
    models/kjv/llama/tokenizer.json), as convert_hf_to_gguf.py writes a BPE vocabulary: model
    gpt2, pre llama-bpe, tokens in id order, control type (3) for the added special tokens,
    merges as "a b", the template's BOS."""
    doc = json.load(open(path, encoding="utf-8"))
    m = doc["model"]
    vocab = dict(m["vocab"])
    special = set()
    for a in doc["added_tokens"]:
        vocab[a["content"]] = a["id"]
        if a["special"]:
            special.add(a["id"])
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    assert None not in tokens, f"{path}: ids are not 0..{len(vocab) - 1}"
    merges = [x if isinstance(x, str) else " ".join(x) for x in m["merges"]]
    bos = next(x for x in doc["post_processor"]["processors"]
               if x["type"] == "TemplateProcessing")["single"][0]["SpecialToken"]["id"]
    ARRAY, I32, BOOL = 9, 5, 7
    keys = {"tokenizer.ggml.model": (GGUF_STRING, gguf_string("gpt2")),
            "tokenizer.ggml.pre": (GGUF_STRING, gguf_string("llama-bpe")),
            "tokenizer.ggml.tokens": (ARRAY, gguf_array(GGUF_STRING, tokens)),
            "tokenizer.ggml.token_type": (ARRAY, gguf_array(I32, [3 if i in special else 1
                                                                  for i in range(len(tokens))])),
            "tokenizer.ggml.merges": (ARRAY, gguf_array(GGUF_STRING, merges)),
            "tokenizer.ggml.bos_token_id": (GGUF_U32, struct.pack("<I", vocab[bos])),
            "tokenizer.ggml.eos_token_id": (GGUF_U32, struct.pack("<I", vocab.get("</s>", 0))),
            "tokenizer.ggml.add_bos_token": (BOOL, struct.pack("<?", True))}
    return keys


def to_gguf(d, vocab_gguf, out):
    cfg = json.load(open(os.path.join(d, "config.json")))
    arch = {"llama": "llama", "qwen2": "qwen2"}[cfg["model_type"]]
    src = load_dir(d)
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
    names = {"input_layernorm.weight": "attn_norm.weight",
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
             "self_attn.v_proj.bias": "attn_v.bias",
             "post_attention_layernorm.weight": "ffn_norm.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight"}
    tensors = []
    for name, a in src.items():
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "model.norm.weight":
            g = "output_norm.weight"
        elif name == "lm_head.weight":
            g = "output.weight"
        else:
            parts = name.split(".")
            g = f"blk.{parts[2]}." + names[".".join(parts[3:])]
            if arch == "llama" and name.endswith("q_proj.weight"):
                a = permute(a, nh, nh)
            elif arch == "llama" and name.endswith("k_proj.weight"):
                a = permute(a, nh, nkv)
        tensors.append((g, np.ascontiguousarray(a, dtype="<f4")))
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type", "").lower() == "llama3":
        tensors.append(("rope_freqs.weight", llama3_factors(cfg, hd)))
    raw = gguf_raw_keys(vocab_gguf) if not vocab_gguf.endswith(".json") else \
        tokenizer_keys(vocab_gguf)
    kv = []

    def u32(key, v):
        kv.append(gguf_string(key) + struct.pack("<II", GGUF_U32, v))

    def f32(key, v):
        kv.append(gguf_string(key) + struct.pack("<If", GGUF_F32, v))

    kv.append(gguf_string("general.architecture") + struct.pack("<I", GGUF_STRING) + gguf_string(arch))
    u32("general.alignment", ALIGN)
    u32("general.file_type", 0)  # all F32
    u32(f"{arch}.context_length", cfg["max_position_embeddings"])
    u32(f"{arch}.embedding_length", cfg["hidden_size"])
    u32(f"{arch}.block_count", cfg["num_hidden_layers"])
    u32(f"{arch}.feed_forward_length", cfg["intermediate_size"])
    u32(f"{arch}.attention.head_count", nh)
    u32(f"{arch}.attention.head_count_kv", nkv)
    u32(f"{arch}.attention.key_length", hd)
    u32(f"{arch}.attention.value_length", hd)
    u32(f"{arch}.rope.dimension_count", hd)
    u32(f"{arch}.vocab_size", cfg["vocab_size"])
    f32(f"{arch}.rope.freq_base", cfg.get("rope_theta", 10000.0))
    f32(f"{arch}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    for key, (t, b) in raw.items():
        if key.startswith("tokenizer."):
            kv.append(gguf_string(key) + struct.pack("<I", t) + b)
    infos, off = [], 0
    for name, a in tensors:
        dims = list(reversed(a.shape))
        infos.append(gguf_string(name) + struct.pack("<I", len(dims)) +
                     b"".join(struct.pack("<Q", x) for x in dims) + struct.pack("<IQ", 0, off))
        off += a.nbytes + (-a.nbytes % ALIGN)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(kv) + b"".join(infos)
    with open(out, "wb") as f:
        f.write(head + b"\0" * (-len(head) % ALIGN))
        for _, a in tensors:
            f.write(a.tobytes())
            f.write(b"\0" * (-a.nbytes % ALIGN))


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "make" and sys.argv[2] in KINDS:
        make(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    elif len(sys.argv) == 6 and sys.argv[1] == "bare" and sys.argv[2] in KINDS:
        make(sys.argv[2], None, None, sys.argv[5], vocab=int(sys.argv[3]),
             theta=float(sys.argv[4]))
    elif len(sys.argv) == 5 and sys.argv[1] == "gguf":
        to_gguf(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
