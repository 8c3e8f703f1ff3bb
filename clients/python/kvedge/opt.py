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
"""
import json
import struct

import numpy as np
import torch

from .client import Model

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


class OPT:
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

    def store_model(self, model_id):
        """The store's record of this model's KV shape (what `kvedge prefill --model-id`
        registers: kv_heads = heads, fp16)."""
        return Model(model_id, self.n_layers, self.heads, self.head_dim, "fp16")

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

    def _attend(self, q, keys, vals, n_prefix, causal_offset):
        """q [heads][n][hd] over keys/vals [heads][n_prefix + m][hd]: every query sees the
        n_prefix context keys and the local keys up to its own position."""
        s = q @ keys.transpose(1, 2)
        n, m = q.shape[1], keys.shape[1] - n_prefix
        if n > 1 or m > causal_offset + 1:
            qi = torch.arange(n)[:, None] + causal_offset
            kj = torch.arange(m)[None, :]
            mask = torch.zeros(n, n_prefix + m, dtype=torch.bool)
            mask[:, n_prefix:] = kj > qi
            s = s.masked_fill(mask, float("-inf"))
        return torch.softmax(s, dim=-1) @ vals

    def _layer(self, l, x, ctx_k=None, ctx_v=None, past_k=None, past_v=None):
        """One decoder layer over x [n][hidden]: attention over the context K/V (may be None),
        the local cache past_k/past_v (may be None) and x's own K/V, causal. Returns the new x
        and x's own k, v [heads][n][hd]."""
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

    # -- the two roles
    @torch.no_grad()
    def prefill(self, tokens, loader=None, handle=None, all_logits=False):
        """Runs the context through the model; with a cloud-role loader every layer's K/V
        ([heads][n][head_dim]) goes to loader.save_layer as soon as it is computed (handle:
        default loader.start_load(tokens)). Returns the last position's logits (all positions'
        with all_logits)."""
        if loader is not None and handle is None:
            handle = loader.start_load(tokens)
        x = self._embed(tokens, 0)
        for l in range(self.n_layers):
            x, k, v = self._layer(l, x)
            if loader is not None:
                loader.save_layer(l, k, v, handle=handle)
        out = self._logits(x)
        if loader is not None:
            loader.finish(handle)
        return out if all_logits else out[-1]

    @staticmethod
    def pick(logits, seen, penalty):
        """The C decoder's greedy pick (kvedge_decoder_pick): CTRL penalty on seen ids, then
        the arg-max, lowest id on a tie."""
        lg = logits.detach().numpy().astype(np.float32, copy=True)
        if penalty > 1.0 and seen:
            for t in set(seen):
                lg[t] = lg[t] / penalty if lg[t] > 0 else lg[t] * penalty
        return int(np.argmax(lg))

    @torch.no_grad()
    def estimate(self, ctx_len, prompt_len, reps=2):
        """Per-layer microseconds on this machine, as kvedge_decoder_estimate gives them for the
        C decoder: compute (prompt_len tokens over a ctx_len context) and recompute (the
        context's own K/V, causal), timed on layer 0 (every OPT layer costs the same), best of
        reps after a warm-up. Two lists of one entry per layer, for start_load's compute_us
        and recompute_us (the proxy may then plan layers as "recompute")."""
        import time
        g = torch.Generator().manual_seed(0)
        xc = torch.randn(ctx_len, self.hidden, generator=g)
        xp = torch.randn(prompt_len, self.hidden, generator=g)
        _, ck, cv = self._layer(0, xc)

        def best(fn):
            fn()
            t = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                t.append(time.perf_counter() - t0)
            return min(t) * 1e6
        recompute = best(lambda: self._layer(0, xc))
        compute = best(lambda: self._layer(0, xp, ck, cv))
        return [compute] * self.n_layers, [recompute] * self.n_layers

    @torch.no_grad()
    def decode(self, ctx_tokens, prompt, max_new, loader=None, handle=None,
               repetition_penalty=1.0, kv=None, plan_recompute=False):
        """The edge role: decodes prompt (positions len(ctx)..) over the context's K/V, taken
        layer by layer from loader.wait_for_layer (handle: default loader.start_load(ctx)) or
        from kv(l) -> (k, v) | None, computing each layer they do not deliver. Generates
        max_new tokens greedily. plan_recompute (with a loader, no handle): give the proxy this
        engine's time estimates (estimate()), so it may plan layers as "recompute", as
        `kvedge decode --plan-recompute` does. Returns (tokens, logits of the prompt's last
        position, per-layer "fetched" / "computed")."""
        n = len(ctx_tokens)
        if len(prompt) < 1 or max_new < 1:
            raise ValueError("need a prompt and max_new >= 1")
        if n + len(prompt) + max_new > self.max_positions:
            raise ValueError("context + prompt + max_new over the model's positions")
        own = False
        if loader is not None and handle is None and n:
            cu = ru = None
            if plan_recompute:
                cu, ru = self.estimate(n, len(prompt))
            handle = loader.start_load(ctx_tokens, compute_us=cu, recompute_us=ru)
            own = True
        ctx_h, ctx_done = None, 0  # the context's hidden state, run through ctx_done layers
        ctx_k, ctx_v, loc_k, loc_v, how = [], [], [], [], []
        x = self._embed(prompt, n)
        try:
            for l in range(self.n_layers):
                got = None
                if n:
                    if loader is not None:
                        got = loader.wait_for_layer(handle, l)
                    elif kv is not None:
                        got = kv(l)
                if n and got is None:
                    if ctx_h is None:
                        ctx_h = self._embed(ctx_tokens, 0)
                    while ctx_done <= l:
                        ctx_h, ck, cv = self._layer(ctx_done, ctx_h)
                        ctx_done += 1
                    how.append("computed")
                elif n:
                    # Zero-copy views of the loader's buffer (they keep it alive after
                    # finish()); converted only when the loader hands out fp16/bf16.
                    ck, cv = (torch.as_tensor(t).float() for t in got)
                    how.append("fetched")
                else:
                    ck = cv = None
                x, k, v = self._layer(l, x, ck, cv)
                ctx_k.append(ck)
                ctx_v.append(cv)
                loc_k.append(k)
                loc_v.append(v)
        finally:
            if own:
                loader.finish(handle)
        logits = self._logits(x[-1:])[0]
        first_logits = logits.clone()
        seen = list(prompt)
        out = []
        for i in range(max_new):
            tok = self.pick(logits, seen, repetition_penalty)
            out.append(tok)
            seen.append(tok)
            if i == max_new - 1:
                break
            y = self._embed([tok], n + len(prompt) + i)
            for l in range(self.n_layers):
                y, k, v = self._layer(l, y, ctx_k[l], ctx_v[l], loc_k[l], loc_v[l])
                loc_k[l] = torch.cat([loc_k[l], k], 1)
                loc_v[l] = torch.cat([loc_v[l], v], 1)
            logits = self._logits(y)[0]
        return out, first_logits, how
