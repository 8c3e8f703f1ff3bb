#!/usr/bin/env python3
"""Independent reference for the C decoder (clients/decoder.c): a tiny OPT built from torch's
own modules (nn.Embedding, nn.LayerNorm, nn.MultiheadAttention, nn.Linear), with random weights
from a fixed seed, written as a safetensors file with Hugging Face tensor names, plus the
logits it computes for fixed token ids.

    /usr/bin/python3 scripts/opt_reference.py --out tests/fixtures

needs python3-torch and python3-numpy (scripts/setup.sh --reference). If Hugging Face
`transformers` is importable, the same weights are also loaded into OPTForCausalLM and its
logits are checked against this model's.
"""
import argparse
import json
import os
import struct
import sys

import torch
from torch import nn

SEED = 20240617
VOCAB, HIDDEN, HEADS, LAYERS, FFN, MAX_POS = 256, 64, 4, 3, 256, 160
POS_OFFSET = 2  # HF OPTLearnedPositionalEmbedding: position p uses row p + 2
PREFILL_TOKENS = 40
GREEDY_STEPS = 8
# Greedy steps must win by at least this much, so fp32 rounding in another implementation
# cannot flip an arg-max.
MIN_MARGIN = 1e-3


class Block(nn.Module):
    """One OPT decoder layer with do_layer_norm_before=True."""

    def __init__(self):
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(HIDDEN)
        self.attn = nn.MultiheadAttention(HIDDEN, HEADS, bias=True, batch_first=True)
        self.final_layer_norm = nn.LayerNorm(HIDDEN)
        self.fc1 = nn.Linear(HIDDEN, FFN)
        self.fc2 = nn.Linear(FFN, HIDDEN)

    def forward(self, x, mask):
        h = self.self_attn_layer_norm(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        h = self.final_layer_norm(x)
        return x + self.fc2(torch.relu(self.fc1(h)))


class TinyOPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.embed_positions = nn.Embedding(MAX_POS + POS_OFFSET, HIDDEN)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.final_layer_norm = nn.LayerNorm(HIDDEN)

    def forward(self, ids):
        t = ids.shape[-1]
        pos = torch.arange(t) + POS_OFFSET
        x = self.embed_tokens(ids) + self.embed_positions(pos)
        # True marks a key a query may not see: the future.
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        for blk in self.layers:
            x = blk(x, mask)
        x = self.final_layer_norm(x)
        return x @ self.embed_tokens.weight.T  # output head tied to the embedding


def random_weights(gen):
    """HF-named tensors and the dtype each is stored in. Values are rounded to that dtype here,
    so the fp32 model below computes with exactly what the file holds."""
    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=gen) * std + mean

    w = {}
    p = "model.decoder."
    # Scales chosen so that layers, not the current token's own embedding, drive the logits:
    # otherwise greedy decoding of a random tied model just repeats one token.
    w[p + "embed_tokens.weight"] = (normal((VOCAB, HIDDEN), 0.1), "BF16")
    w[p + "embed_positions.weight"] = (normal((MAX_POS + POS_OFFSET, HIDDEN), 0.2), "BF16")
    for i in range(LAYERS):
        q = f"{p}layers.{i}."
        for ln in ("self_attn_layer_norm", "final_layer_norm"):
            w[q + ln + ".weight"] = (normal((HIDDEN,), 0.1, 1.0), "F32")
            w[q + ln + ".bias"] = (normal((HIDDEN,), 0.1), "F32")
        for proj, gain in (("q_proj", 1), ("k_proj", 1), ("v_proj", 3), ("out_proj", 3)):
            w[q + f"self_attn.{proj}.weight"] = (normal((HIDDEN, HIDDEN), gain * HIDDEN ** -0.5),
                                                 "F16")
            w[q + f"self_attn.{proj}.bias"] = (normal((HIDDEN,), 0.1), "F32")
        w[q + "fc1.weight"] = (normal((FFN, HIDDEN), HIDDEN ** -0.5), "F16")
        w[q + "fc1.bias"] = (normal((FFN,), 0.1), "F32")
        w[q + "fc2.weight"] = (normal((HIDDEN, FFN), 3 * FFN ** -0.5), "F16")
        w[q + "fc2.bias"] = (normal((HIDDEN,), 0.1), "F32")
    w[p + "final_layer_norm.weight"] = (normal((HIDDEN,), 0.1, 1.0), "F32")
    w[p + "final_layer_norm.bias"] = (normal((HIDDEN,), 0.1), "F32")
    torch_dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    return {k: (t.to(torch_dtype[d]).to(torch.float32), d) for k, (t, d) in w.items()}


def tensor_bytes(t, dtype):
    t = t.contiguous()
    if dtype == "F32":
        return t.numpy().astype("<f4").tobytes()
    if dtype == "F16":
        return t.to(torch.float16).numpy().astype("<f2").tobytes()
    if dtype == "BF16":  # numpy has no bfloat16: take the raw 16-bit patterns
        return t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors, metadata):
    """The format by hand: u64 LE header length, JSON header padded with spaces to 8 bytes,
    then the tensors back to back (no holes, as the format requires)."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (t, dtype) in tensors.items():
        b = tensor_bytes(t, dtype)
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def build_model(weights):
    m = TinyOPT().eval()
    p = "model.decoder."
    with torch.no_grad():
        m.embed_tokens.weight.copy_(weights[p + "embed_tokens.weight"][0])
        m.embed_positions.weight.copy_(weights[p + "embed_positions.weight"][0])
        m.final_layer_norm.weight.copy_(weights[p + "final_layer_norm.weight"][0])
        m.final_layer_norm.bias.copy_(weights[p + "final_layer_norm.bias"][0])
        for i, blk in enumerate(m.layers):
            q = f"{p}layers.{i}."
            g = lambda n: weights[q + n][0]  # noqa: E731
            blk.self_attn_layer_norm.weight.copy_(g("self_attn_layer_norm.weight"))
            blk.self_attn_layer_norm.bias.copy_(g("self_attn_layer_norm.bias"))
            blk.final_layer_norm.weight.copy_(g("final_layer_norm.weight"))
            blk.final_layer_norm.bias.copy_(g("final_layer_norm.bias"))
            # MultiheadAttention packs q, k, v projections into one [3H][H] matrix.
            blk.attn.in_proj_weight.copy_(torch.cat(
                [g(f"self_attn.{n}_proj.weight") for n in "qkv"]))
            blk.attn.in_proj_bias.copy_(torch.cat([g(f"self_attn.{n}_proj.bias") for n in "qkv"]))
            blk.attn.out_proj.weight.copy_(g("self_attn.out_proj.weight"))
            blk.attn.out_proj.bias.copy_(g("self_attn.out_proj.bias"))
            blk.fc1.weight.copy_(g("fc1.weight"))
            blk.fc1.bias.copy_(g("fc1.bias"))
            blk.fc2.weight.copy_(g("fc2.weight"))
            blk.fc2.bias.copy_(g("fc2.bias"))
    return m


def compare_transformers(weights, ids, logits):
    """Loads the weights into HF's OPTForCausalLM, when available, and checks its logits."""
    try:
        from transformers import OPTConfig, OPTForCausalLM
    except ImportError:
        print("transformers: not importable, HF comparison skipped")
        return None
    cfg = OPTConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                    ffn_dim=FFN, num_attention_heads=HEADS, max_position_embeddings=MAX_POS,
                    do_layer_norm_before=True, word_embed_proj_dim=HIDDEN, dropout=0.0,
                    attention_dropout=0.0, activation_function="relu", enable_bias=True,
                    pad_token_id=1, bos_token_id=2, eos_token_id=2)
    hf = OPTForCausalLM(cfg).eval()
    sd = {k: t for k, (t, _) in weights.items()}
    sd["lm_head.weight"] = sd["model.decoder.embed_tokens.weight"]
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    assert not missing and not unexpected, (missing, unexpected)
    with torch.no_grad():
        out = hf(input_ids=ids[None], attention_mask=torch.ones_like(ids)[None]).logits[0]
    diff = (out - logits).abs().max().item()
    print(f"transformers {__import__('transformers').__version__}: max |logit diff| = {diff:.3g}")
    assert diff <= 1e-4, "transformers.OPTForCausalLM disagrees with the torch reference"
    return diff


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/fixtures", help="directory for the fixtures")
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(SEED)
    weights = random_weights(gen)
    model = build_model(weights)

    ids = torch.randint(0, VOCAB, (PREFILL_TOKENS,), generator=gen)
    with torch.no_grad():
        logits = model(ids)  # [T][vocab]
        # Greedy decoding by full recomputation at every step: no KV cache to get wrong.
        seq, greedy, greedy_logits, margins = ids.clone(), [], [], []
        for _ in range(GREEDY_STEPS):
            last = model(seq)[-1]
            top = torch.topk(last, 2).values
            margins.append((top[0] - top[1]).item())
            tok = int(torch.argmax(last))
            greedy.append(tok)
            greedy_logits.append(last)
            seq = torch.cat([seq, torch.tensor([tok])])
    if min(margins) < MIN_MARGIN:
        sys.exit(f"greedy margin {min(margins):.3g} < {MIN_MARGIN}: pick another SEED")
    hf_diff = compare_transformers(weights, ids, logits)

    os.makedirs(args.out, exist_ok=True)
    meta = {"num_attention_heads": str(HEADS), "do_layer_norm_before": "true",
            "activation_function": "relu", "seed": str(SEED),
            "generator": "scripts/opt_reference.py", "torch": torch.__version__}
    write_safetensors(os.path.join(args.out, "opt_tiny.safetensors"), weights, meta)
    f32 = lambda t: (t.to(torch.float32), "F32")  # noqa: E731
    expected = {
        # Token ids are stored as F32 (exact below 2^24) so one reader handles every fixture.
        "prefill.tokens": f32(ids),
        "prefill.logits": f32(logits),
        "greedy.tokens": f32(torch.tensor(greedy)),
        "greedy.logits": f32(torch.stack(greedy_logits)),
    }
    emeta = {"seed": str(SEED), "torch": torch.__version__,
             "min_greedy_margin": f"{min(margins):.6g}",
             "transformers_max_abs_diff": "not run" if hf_diff is None else f"{hf_diff:.3g}"}
    write_safetensors(os.path.join(args.out, "opt_tiny_expected.safetensors"), expected, emeta)
    print(f"wrote {args.out}: {LAYERS} layers, hidden {HIDDEN}, {HEADS} heads, vocab {VOCAB}; "
          f"greedy {greedy}, min margin {min(margins):.3g}")


if __name__ == "__main__":
    main()
