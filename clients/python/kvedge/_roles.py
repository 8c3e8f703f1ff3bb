"""The cloud and edge roles shared by the PyTorch engines (kvedge.opt, kvedge.llama): prefill
with every layer's K/V saved as it is computed, decode over K/V taken layer by layer from a
kvedge.KVLoader with any layer it does not deliver computed lazily, greedy picks as the C
decoder makes them, and per-layer time estimates for a proxy's plan.

An engine subclasses RoleEngine and gives n_layers, kv_heads, head_dim, hidden, max_positions
and three pieces: _embed(tokens, start) -> x [n][hidden], _layer(l, x, pos0, ctx_k, ctx_v,
past_k, past_v) -> (x, k, v) with k, v [kv_heads][n][head_dim] (what the store keeps), and
_logits(x) -> [n][vocab].
"""
import time

import numpy as np
import torch

from ._attn import attend
from .client import Model


class RoleEngine:
    """The roles over an engine's forward (see the module's doc)."""

    def store_model(self, model_id):
        """The store's record of this model's KV shape: layers, KV heads (the query heads for
        OPT, num_key_value_heads under grouped-query attention), head_dim, fp16."""
        return Model(model_id, self.n_layers, self.kv_heads, self.head_dim, "fp16")

    # The split attention (kvedge/_attn.py): context keys, then causal local keys.
    _attend = staticmethod(attend)

    @torch.no_grad()
    def prefill(self, tokens, loader=None, handle=None, all_logits=False):
        """Runs the context through the model; with a cloud-role loader every layer's K/V
        ([kv_heads][n][head_dim]; rotary models: K post-rotary) goes to loader.save_layer as
        soon as it is computed (handle: default loader.start_load(tokens)). Returns the last
        position's logits (all positions' with all_logits)."""
        if loader is not None and handle is None:
            handle = loader.start_load(tokens)
        x = self._embed(tokens, 0)
        for l in range(self.n_layers):
            x, k, v = self._layer(l, x, 0)
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
        context's own K/V, causal), timed on layer 0 (every layer costs the same), best of
        reps after a warm-up. Two lists of one entry per layer, for start_load's compute_us
        and recompute_us (the proxy may then plan layers as "recompute")."""
        g = torch.Generator().manual_seed(0)
        xc = torch.randn(ctx_len, self.hidden, generator=g)
        xp = torch.randn(prompt_len, self.hidden, generator=g)
        _, ck, cv = self._layer(0, xc, 0)

        def best(fn):
            fn()
            t = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                t.append(time.perf_counter() - t0)
            return min(t) * 1e6
        recompute = best(lambda: self._layer(0, xc, 0))
        compute = best(lambda: self._layer(0, xp, ctx_len, ck, cv))
        return [compute] * self.n_layers, [recompute] * self.n_layers

    def _check_kv(self, l, got, n):
        want = (self.kv_heads, n, self.head_dim)
        ck, cv = (torch.as_tensor(t).float() for t in got)
        if tuple(ck.shape) != want or tuple(cv.shape) != want:
            raise ValueError(f"layer {l}: context K/V of shape {tuple(ck.shape)} / "
                             f"{tuple(cv.shape)}, not [kv_heads][tokens][head_dim] {want}")
        return ck, cv

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
                        ctx_h, ck, cv = self._layer(ctx_done, ctx_h, 0)
                        ctx_done += 1
                    how.append("computed")
                elif n:
                    # Zero-copy views of the loader's buffer (they keep it alive after
                    # finish()); converted only when the loader hands out fp16/bf16.
                    ck, cv = self._check_kv(l, got, n)
                    how.append("fetched")
                else:
                    ck = cv = None
                x, k, v = self._layer(l, x, n, ck, cv)
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
            pos = n + len(prompt) + i
            y = self._embed([tok], pos)
            for l in range(self.n_layers):
                y, k, v = self._layer(l, y, pos, ctx_k[l], ctx_v[l], loc_k[l], loc_v[l])
                loc_k[l] = torch.cat([loc_k[l], k], 1)
                loc_v[l] = torch.cat([loc_v[l], v], 1)
            logits = self._logits(y)[0]
        return out, first_logits, how
