"""The split attention of the PyTorch engines, apart from the serving glue so that tools
(scripts/train_adapter.py) can use the engines' layer math without loading libkvedge."""
import torch


def attend(q, keys, vals, n_prefix, causal_offset):
    """Scaled queries q [heads][n][hd] over keys/vals [kv_heads][n_prefix + m][hd] (query
    head h reads KV head h // (heads / kv_heads)): every query sees the n_prefix context
    keys and the local keys up to its own position (causal_offset earlier local ones)."""
    group = q.shape[0] // keys.shape[0]
    if group > 1:
        keys = keys.repeat_interleave(group, 0)
        vals = vals.repeat_interleave(group, 0)
    s = q @ keys.transpose(1, 2)
    n, m = q.shape[1], keys.shape[1] - n_prefix
    if n > 1 or m > causal_offset + 1:
        qi = torch.arange(n)[:, None] + causal_offset
        kj = torch.arange(m)[None, :]
        mask = torch.zeros(n, n_prefix + m, dtype=torch.bool)
        mask[:, n_prefix:] = kj > qi
        s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ vals
