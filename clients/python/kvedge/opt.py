"""A PyTorch OPT engine on the kvedge loader: the model of scripts/opt_reference.py and of the
C reference decoder (docs/decoder.md, "The model, exactly"), fp32 on the CPU, with a KV cache
that comes layer by layer from kvedge.KVLoader.

    eng = OPT("models/kjv/cloud/model.safetensors")
    # cloud role: prefill the shared context, every layer's K/V saved as soon as it is computed
    cloud = KVLoader(cloud_client, eng.store_model("kjv-cloud"), role="cloud")
    eng.prefill(ctx, loader=cloud)
    # edge role: decode a private prompt over the context's layers from a proxy
    edge = KVLoader(proxy_client, eng.store_model("kjv-cloud"), role="edge")
    tokens, logits = eng.decode(ctx, prompt, max_new=16, loader=edge)

decode computes every layer the loader does not deliver (a miss, or a layer the proxy's plan
leaves to the edge) as the C decoder does: the context's hidden state is run lazily through the
layers up to the deepest such layer, and a fetched layer it passes keeps its fetched K/V.
Greedy picks are the C decoder's (lowest id on a tie, CTRL repetition penalty over the prompt
and the generated tokens), so the tokens equal `kvedge decode`'s given the same stored K/V.
The roles (store_model, prefill, decode, estimate, pick) are kvedge._roles.RoleEngine's, shared
with the Llama-family engine kvedge.llama.
"""
import json
import struct

import numpy as np
import torch

from ._roles import RoleEngine

POSITION_OFFSET = 2  # HF OPTLearnedPositionalEmbedding: position p reads row p + 2
LN_EPS = 1e-5
_ST_DTYPES = {"F32": (np.float32, None), "F16": (np.float16, None), "BF16": (np.int16, "bf16")}


def load_safetensors(path):
    """{name: fp32 torch tensor} and the __metadata__ dict of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: not a safetensors file")
    n = struct.unpack("<Q", data[:8])[0]
    if n > len(data) - 8:
        raise ValueError(f"{path}: header past the end of the file")
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for name, t in header.items():
        if t["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{path}: {name}: dtype {t['dtype']} not supported")
        npd, special = _ST_DTYPES[t["dtype"]]
        b, e = t["data_offsets"]
        arr = np.frombuffer(data, dtype=npd, count=(e - b) // np.dtype(npd).itemsize,
                            offset=base + b).reshape(t["shape"])
        ten = torch.from_numpy(arr.copy())
        if special == "bf16":
            ten = ten.view(torch.bfloat16)
        out[name] = ten.float()
    return out, meta


class OPT(RoleEngine):
    """An OPT model (Hugging Face names, do_layer_norm_before) in fp32 torch. heads: the
    attention heads (default: the file's __metadata__ num_attention_heads, else a config.json
    beside the weights with "heads", else hidden / 64)."""

    def __init__(self, path, heads=None):
        w, meta = load_safetensors(path)
        w = {k[len("model."):] if k.startswith("model.") else k: v for k, v in w.items()}
        p = "decoder."
        self.embed = w[p + "embed_tokens.weight"]
        self.pos = w[p + "embed_positions.weight"]
        self.lm_head = w.get("lm_head.weight", self.embed)
        self.vocab, self.hidden = self.embed.shape
        self.max_positions = self.pos.shape[0] - POSITION_OFFSET
        if heads is None:
            heads = meta.get("num_attention_heads")
        if heads is None:
            import os
            cfg = os.path.join(os.path.dirname(path), "config.json")
            if os.path.exists(cfg):
                with open(cfg) as f:
                    heads = json.load(f).get("heads")
        self.heads = int(heads) if heads else self.hidden // 64
        self.kv_heads = self.heads
        self.head_dim = self.hidden // self.heads
        self.scale = self.head_dim ** -0.5
        self.final_ln = (w[p + "final_layer_norm.weight"], w[p + "final_layer_norm.bias"])
        self.layers = []
        i = 0
        while f"{p}layers.{i}.fc1.weight" in w:
            q = f"{p}layers.{i}."
            g = lambda n: w[q + n]  # noqa: E731
            self.layers.append({
                "ln1": (g("self_attn_layer_norm.weight"), g("self_attn_layer_norm.bias")),
                "q": (g("self_attn.q_proj.weight"), g("self_attn.q_proj.bias")),
                "k": (g("self_attn.k_proj.weight"), g("self_attn.k_proj.bias")),
                "v": (g("self_attn.v_proj.weight"), g("self_attn.v_proj.bias")),
                "o": (g("self_attn.out_proj.weight"), g("self_attn.out_proj.bias")),
                "ln2": (g("final_layer_norm.weight"), g("final_layer_norm.bias")),
                "fc1": (g("fc1.weight"), g("fc1.bias")),
                "fc2": (g("fc2.weight"), g("fc2.bias")),
            })
            i += 1
        self.n_layers = len(self.layers)

    # -- pieces
    @staticmethod
    def _ln(x, wb):
        # Statistics in double, as the C decoder computes them.
        xd = x.double()
        mu = xd.mean(-1, keepdim=True)
        var = ((xd - mu) ** 2).mean(-1, keepdim=True)
        return ((xd - mu) / torch.sqrt(var + LN_EPS)).float() * wb[0] + wb[1]

    @staticmethod
    def _lin(x, wb):
        return x @ wb[0].T + wb[1]

    def _split(self, x):  # [n][hidden] -> [heads][n][head_dim]
        return x.reshape(x.shape[0], self.heads, self.head_dim).transpose(0, 1).contiguous()

    def _embed(self, tokens, start):
        t = torch.as_tensor(tokens, dtype=torch.long)
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.vocab):
            raise ValueError("token id outside the vocabulary")
        if start + t.numel() > self.max_positions:
            raise ValueError("more tokens than the model's positions")
        pos = torch.arange(start, start + t.numel()) + POSITION_OFFSET
        return self.embed[t] + self.pos[pos]

    def _layer(self, l, x, pos0=0, ctx_k=None, ctx_v=None, past_k=None, past_v=None):
        """One decoder layer over x [n][hidden]: attention over the context K/V (may be None),
        the local cache past_k/past_v (may be None) and x's own K/V, causal. Returns the new x
        and x's own k, v [heads][n][hd]. pos0 is unused: OPT's positions enter at _embed."""
        L = self.layers[l]
        h = self._ln(x, L["ln1"])
        q = self._split(self._lin(h, L["q"]) * self.scale)
        k = self._split(self._lin(h, L["k"]))
        v = self._split(self._lin(h, L["v"]))
        lk = k if past_k is None else torch.cat([past_k, k], 1)
        lv = v if past_v is None else torch.cat([past_v, v], 1)
        off = 0 if past_k is None else past_k.shape[1]
        if ctx_k is not None:
            keys, vals, npre = torch.cat([ctx_k, lk], 1), torch.cat([ctx_v, lv], 1), ctx_k.shape[1]
        else:
            keys, vals, npre = lk, lv, 0
        a = self._attend(q, keys, vals, npre, off)
        a = a.transpose(0, 1).reshape(x.shape[0], self.hidden)
        x = x + self._lin(a, L["o"])
        h = self._ln(x, L["ln2"])
        x = x + self._lin(torch.relu(self._lin(h, L["fc1"])), L["fc2"])
        return x, k, v

    def _logits(self, x):
        return self._ln(x, self.final_ln) @ self.lm_head.T
