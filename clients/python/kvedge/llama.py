"""A PyTorch Llama-family engine on the kvedge loader: the model of the C reference decoder's
Llama family (docs/decoder.md, "Llama-family models": Llama 2/3, SmolLM2, Mistral without
sliding windows, Qwen2), fp32 on the CPU, loaded from a Hugging Face model directory
(config.json, and model.safetensors or the shards model.safetensors.index.json names).

    eng = Llama("models/tiny-llama")                 # a directory
    cloud = KVLoader(cloud_client, eng.store_model("tiny-llama"), role="cloud")
    eng.prefill(ctx, loader=cloud)                   # K post-rotary, [kv_heads][tokens][head_dim]
    edge = KVLoader(proxy_client, eng.store_model("tiny-llama"), role="edge")
    tokens, logits, how = eng.decode(ctx, prompt, max_new=16, loader=edge)

The math is the C decoder's, where it matters to the last bits: RMSNorm statistics in double;
rotary frequencies rope_theta^(-2i/d) in double (Llama 3's rope_scaling applied) kept as fp32,
angles and their sines in double; Hugging Face's rotate-half layout (dimension i pairs with
i + d/2); queries scaled by head_dim^-0.5 after the rotation; grouped-query attention (query
head h reads KV head h // (heads / kv_heads)); down(silu(gate x) * up x). The K it stores and
takes is post-rotary and unscaled (what Hugging Face, vLLM, llama.cpp and the C decoder cache),
so a fetched layer is used as it arrives. A config.json the C decoder refuses is refused here
with the same words (ValueError naming the field and its value).
"""
import json
import math
import os
import struct

import numpy as np
import torch

from ._roles import RoleEngine

# model_type -> Q/K/V biases (Qwen2). "opt" is kvedge.opt's.
ARCHS = {"llama": False, "mistral": False, "qwen2": True}
INDEX = "model.safetensors.index.json"
_ST_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
_JSON_MAX_BYTES = 64 << 20  # as the C decoder's limit on config.json and the index


class ConfigError(ValueError):
    """A config.json, index or tensor the engine refuses; the message names the file and the
    field or tensor, as the C decoder's kvedge_decoder_error does."""


# -- config.json, as clients/decoder/decoder.c's kvedge_decoder_impl_parse_config reads it

def _field(cfg, key):
    """A field that is present and not null (None else)."""
    return cfg.get(key)


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _text(v):
    """A value as cJSON prints it, for a refusal."""
    if _is_num(v) and float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return json.dumps(v, separators=(",", ":"))[:60]


def _count(cfg, key, required, lo, hi, default=None):
    v = _field(cfg, key)
    if v is None:
        if required:
            raise ConfigError(f"{key} is missing")
        return default
    if not _is_num(v) or v != math.floor(v) or not lo <= v <= hi:
        raise ConfigError(f"{key} is not an integer in [{lo}, {hi}]")
    return int(v)


def _num(cfg, key, lo, hi, default):
    v = _field(cfg, key)
    if v is None:
        return default
    if not _is_num(v) or not lo < v <= hi:
        raise ConfigError(f"{key} is not a number in ({lo:g}, {hi:g}]")
    return float(v)


def _refuse_features(cfg, model_type, max_positions):
    for key in ("kv_lora_rank", "q_lora_rank", "attn_logit_softcapping",
                "final_logit_softcapping", "num_experts", "num_local_experts",
                "n_routed_experts"):
        v = _field(cfg, key)
        if v is not None and not (_is_num(v) and v == 0) and v is not False:
            raise ConfigError(f"{key} {_text(v)} is not supported")
    v = _field(cfg, "partial_rotary_factor")
    if v is not None and not (_is_num(v) and v == 1.0):
        raise ConfigError(f"partial_rotary_factor {_text(v)} is not supported (only 1)")
    use, win = _field(cfg, "use_sliding_window"), _field(cfg, "sliding_window")
    if use is True:
        raise ConfigError("use_sliding_window true is not supported")
    if use is None and win is not None and not (_is_num(win) and win >= max_positions):
        raise ConfigError(f"sliding_window {_text(win)} is not supported ({model_type} "
                          f"without one)")
    v = _field(cfg, "mlp_bias")
    if v is not None and v is not False:
        raise ConfigError(f"mlp_bias {_text(v)} is not supported")


def _rope_scaling(cfg):
    """None, or Llama 3's (factor, low_freq_factor, high_freq_factor, original_max)."""
    rs = _field(cfg, "rope_scaling")
    if rs is None:
        return None
    if not isinstance(rs, dict):
        raise ConfigError("rope_scaling is not an object")
    t = rs.get("rope_type")
    if not isinstance(t, str):
        t = rs.get("type")
    t = t if isinstance(t, str) else None
    if t == "default":
        return None
    if t != "llama3":
        raise ConfigError(f'rope_scaling.rope_type "{(t or "(none)")[:40]}" is not supported '
                          f'(llama3)')
    f = (_num(rs, "factor", 0, 1e6, 0.0), _num(rs, "low_freq_factor", 0, 1e6, 0.0),
         _num(rs, "high_freq_factor", 0, 1e6, 0.0),
         _num(rs, "original_max_position_embeddings", 0, 1e9, 0.0))
    if not (f[0] > 0 and f[1] > 0 and f[2] > f[1] and f[3] > 0):
        raise ConfigError("rope_scaling (llama3) needs factor, low_freq_factor < "
                          "high_freq_factor and original_max_position_embeddings")
    return f


def parse_config(cfg):
    """The engine's settings from a config.json's dict, checked as the C decoder checks them:
    ConfigError (a ValueError) naming the field and its value for what it refuses."""
    if not isinstance(cfg, dict):
        raise ConfigError("not a JSON object")
    mt = cfg.get("model_type")
    if not isinstance(mt, str):
        raise ConfigError("model_type is missing")
    if mt == "opt":
        raise ConfigError('model_type "opt" is kvedge.opt\'s (kvedge.opt.OPT reads its '
                          'model.safetensors)')
    if mt not in ARCHS:
        raise ConfigError(f'model_type "{mt[:40]}" is not supported (llama, mistral, qwen2; '
                          f'opt: kvedge.opt)')
    big = 1 << 24
    c = {"model_type": mt}
    c["heads"] = _count(cfg, "num_attention_heads", True, 1, 1024)
    c["layers"] = _count(cfg, "num_hidden_layers", True, 1, 1024)
    c["hidden"] = _count(cfg, "hidden_size", True, 1, big)
    c["ffn"] = _count(cfg, "intermediate_size", True, 1, big)
    c["vocab"] = _count(cfg, "vocab_size", True, 1, 2**31 - 1)
    c["max_positions"] = _count(cfg, "max_position_embeddings", False, 1, big, 2048)
    c["kv_heads"] = _count(cfg, "num_key_value_heads", False, 1, 1024, c["heads"])
    if c["heads"] % c["kv_heads"]:
        raise ConfigError(f"num_key_value_heads {c['kv_heads']} does not divide "
                          f"num_attention_heads {c['heads']}")
    c["head_dim"] = _count(cfg, "head_dim", False, 2, 4096, c["hidden"] // c["heads"])
    if c["head_dim"] < 2 or c["head_dim"] % 2:
        raise ConfigError(f"head_dim {c['head_dim']} is not even (hidden_size / "
                          f"num_attention_heads)")
    c["eps"] = _num(cfg, "rms_norm_eps", 0, 1, 1e-6)
    c["rope_theta"] = _num(cfg, "rope_theta", 1, 1e12, 10000.0)
    act = cfg.get("hidden_act")
    if isinstance(act, str) and act != "silu":
        raise ConfigError(f'hidden_act "{act[:40]}" is not supported (silu)')
    _refuse_features(cfg, mt, c["max_positions"])
    c["rope_scaling"] = _rope_scaling(cfg)
    tie = _field(cfg, "tie_word_embeddings")
    c["tie"] = tie is None or tie is True
    c["attention_bias"] = _field(cfg, "attention_bias") is True
    return c


def inv_freq(head_dim, theta, scaling=None):
    """The rotary frequencies theta^(-2i/d), i < d/2, in double with Llama 3's rope_scaling
    (factor, low_freq_factor, high_freq_factor, original_max) applied as transformers'
    _compute_llama3_parameters does; fp32, as the C decoder keeps them."""
    out = []
    for i in range(head_dim // 2):
        f = 1.0 / theta ** (2.0 * i / head_dim)
        if scaling is not None:
            factor, low, high, orig = scaling
            wavelen = 2.0 * math.pi / f
            if wavelen > orig / low:
                f /= factor
            elif wavelen >= orig / high:
                sm = (orig / wavelen - low) / (high - low)
                f = (1.0 - sm) * f / factor + sm * f
        out.append(f)
    return torch.tensor(out, dtype=torch.float32)


# -- safetensors, single or sharded

def _read_json(path):
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise FileNotFoundError(f"{path}: {e.strerror}") from None
    if size > _JSON_MAX_BYTES:
        raise ConfigError(f"{path}: larger than {_JSON_MAX_BYTES >> 20} MiB")
    with open(path, "rb") as f:
        try:
            return json.loads(f.read())
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: not JSON ({e})") from None


class _Shard:
    """One safetensors file: its header checked, tensors read on demand (memory-mapped)."""

    def __init__(self, path):
        self.path = path
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ConfigError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            n = struct.unpack("<Q", head)[0]
            if n > size - 8 or n > _JSON_MAX_BYTES:
                raise ConfigError(f"{path}: header of {n} bytes past the end of the file")
            try:
                header = json.loads(f.read(n))
            except (ValueError, UnicodeDecodeError):
                raise ConfigError(f"{path}: header is not JSON") from None
        if not isinstance(header, dict):
            raise ConfigError(f"{path}: header is not a JSON object")
        header.pop("__metadata__", None)
        self.base, data = 8 + n, size - 8 - n
        self.tensors = {}
        for name, t in header.items():
            try:
                dt, shape, (b, e) = t["dtype"], [int(x) for x in t["shape"]], t["data_offsets"]
            except (TypeError, KeyError, ValueError):
                raise ConfigError(f"{path}: tensor {name}: malformed header entry") from None
            if dt not in _ST_DTYPES:
                raise ConfigError(f"{path}: tensor {name}: dtype {dt} is not supported "
                                  f"(F32, F16, BF16)")
            numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
            if (not isinstance(b, int) or not isinstance(e, int) or min(shape + [0]) < 0
                    or not 0 <= b <= e <= data or e - b != numel * _ST_DTYPES[dt].itemsize):
                raise ConfigError(f"{path}: tensor {name}: data_offsets [{b}, {e}] do not fit "
                                  f"its shape {shape} and the file")
            self.tensors[name] = (dt, shape, b)

    def shape(self, name):
        return self.tensors[name][1]

    def read(self, name):
        """The tensor as fp32 torch."""
        dt, shape, b = self.tensors[name]
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if numel == 0:
            return torch.zeros(shape)
        a = np.memmap(self.path, dtype=_ST_DTYPES[dt], mode="r", offset=self.base + b,
                      shape=(numel,))
        if dt == "BF16":
            f = (a.astype(np.uint32) << 16).view(np.float32)
        else:
            f = a.astype(np.float32)
        del a
        return torch.from_numpy(f.reshape(shape))


def open_weights(d):
    """{tensor name: _Shard} of the directory's model.safetensors, or of the shards its
    model.safetensors.index.json names, checked against the index: every tensor the index
    maps is in the shard it names, and every tensor a shard holds is mapped to that shard."""
    ix = os.path.join(d, INDEX)
    if not os.path.exists(ix):
        p = os.path.join(d, "model.safetensors")
        if not os.path.exists(p):
            raise FileNotFoundError(f"{d}: neither model.safetensors nor {INDEX}")
        s = _Shard(p)
        return {name: s for name in s.tensors}
    index = _read_json(ix)
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict):
        raise ConfigError(f"{ix}: no weight_map object")
    if not wm:
        raise ConfigError(f"{ix}: weight_map is empty")
    shards, where = {}, {}
    for name, file in wm.items():
        if not isinstance(file, str) or not file or "/" in file or file in (".", ".."):
            raise ConfigError(f"{ix}: tensor {name} names no shard file in dir")
        if file not in shards:
            p = os.path.join(d, file)
            if not os.path.exists(p):
                raise FileNotFoundError(f"{p}: no such file (a shard {INDEX} names)")
            shards[file] = _Shard(p)
        if name not in shards[file].tensors:
            raise ConfigError(f"{os.path.join(d, file)}: tensor {name} is not in {file}, "
                              f"where {INDEX} maps it")
        where[name] = shards[file]
    for file, s in shards.items():
        for name in s.tensors:
            if wm.get(name) != file:
                to = f"to {wm[name]}" if isinstance(wm.get(name), str) else "nowhere"
                raise ConfigError(f"{s.path}: holds tensor {name}, which {INDEX} maps {to}")
    return where


# -- the engine

class Llama(RoleEngine):
    """A Llama-family model (config.json's model_type llama, mistral or qwen2) in fp32 torch,
    from a Hugging Face model directory. Attributes: model_type, n_layers, heads (query
    heads), kv_heads, head_dim, hidden, ffn, vocab, max_positions, eps, rope_theta,
    rope_scaling, tied (the head is embed_tokens). Refusals raise ConfigError (a ValueError)
    naming the file and the field or tensor; a missing file FileNotFoundError."""

    def __init__(self, path):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a model directory's path, not {type(path).__name__}")
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{path}: not a model directory (config.json and "
                                    f"model.safetensors or {INDEX})")
        cfg_path = os.path.join(path, "config.json")
        try:
            c = parse_config(_read_json(cfg_path))
        except ConfigError as e:
            if str(e).startswith(cfg_path):
                raise
            raise ConfigError(f"{cfg_path}: {e}") from None
        self.path = path
        self.model_type = c["model_type"]
        self.n_layers, self.heads, self.kv_heads = c["layers"], c["heads"], c["kv_heads"]
        self.head_dim, self.hidden, self.ffn = c["head_dim"], c["hidden"], c["ffn"]
        self.vocab, self.max_positions, self.eps = c["vocab"], c["max_positions"], c["eps"]
        self.rope_theta, self.rope_scaling, self.tied = (c["rope_theta"], c["rope_scaling"],
                                                         c["tie"])
        self.inv_freq = inv_freq(self.head_dim, self.rope_theta, self.rope_scaling)
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self._load(path, open_weights(path), ARCHS[self.model_type] or c["attention_bias"],
                   c["attention_bias"])

    def _load(self, d, where, qkv_bias, o_bias):
        H, F, V = self.hidden, self.ffn, self.vocab
        QD, KD = self.heads * self.head_dim, self.kv_heads * self.head_dim
        emb = where.get("model.embed_tokens.weight")
        if emb is not None:
            s = emb.shape("model.embed_tokens.weight")
            if len(s) == 2 and s[1] == H and s[0] < V:
                raise ConfigError(f"{d}/config.json: vocab_size {V} is larger than the "
                                  f"embedding's {s[0]} rows")
        if ("model.layers.0.mlp.experts.0.gate_proj.weight" in where
                or "model.layers.0.block_sparse_moe.gate.weight" in where):
            raise ConfigError(f"{d}: the tensors hold mixture-of-experts layers")
        extra = f"model.layers.{self.n_layers}.input_layernorm.weight"
        if extra in where:
            raise ConfigError(f"{d}: the tensors hold more layers than num_hidden_layers "
                              f"{self.n_layers} ({extra})")

        def take(name, *shape):
            if name not in where:
                raise ConfigError(f"{d}: tensor {name} is missing")
            if list(where[name].shape(name)) != list(shape):
                raise ConfigError(f"{d}: tensor {name}: shape {where[name].shape(name)} does "
                                  f"not fit the config ({list(shape)})")
            return where[name].read(name)

        self.embed = take("model.embed_tokens.weight", V, H)
        self.layers = []
        for l in range(self.n_layers):
            p = f"model.layers.{l}."
            L = {"ln1": take(p + "input_layernorm.weight", H),
                 "q": take(p + "self_attn.q_proj.weight", QD, H),
                 "k": take(p + "self_attn.k_proj.weight", KD, H),
                 "v": take(p + "self_attn.v_proj.weight", KD, H),
                 "o": take(p + "self_attn.o_proj.weight", H, QD)}
            L["bq"] = take(p + "self_attn.q_proj.bias", QD) if qkv_bias else None
            L["bk"] = take(p + "self_attn.k_proj.bias", KD) if qkv_bias else None
            L["bv"] = take(p + "self_attn.v_proj.bias", KD) if qkv_bias else None
            L["bo"] = take(p + "self_attn.o_proj.bias", H) if o_bias else None
            L["ln2"] = take(p + "post_attention_layernorm.weight", H)
            L["gate"] = take(p + "mlp.gate_proj.weight", F, H)
            L["up"] = take(p + "mlp.up_proj.weight", F, H)
            L["down"] = take(p + "mlp.down_proj.weight", H, F)
            self.layers.append(L)
        self.norm = take("model.norm.weight", H)
        self.lm_head = self.embed if self.tied else take("lm_head.weight", V, H)

    # -- pieces
    def _rms(self, x, w):
        # Statistics in double, as the C decoder computes them.
        xd = x.double()
        inv = torch.rsqrt((xd * xd).mean(-1, keepdim=True) + self.eps)
        return (xd * inv).float() * w

    @staticmethod
    def _lin(x, w, b=None):
        y = x @ w.T
        return y if b is None else y + b

    def _rotate(self, x, heads, pos0):
        """Rotary positions on x [n][heads * head_dim] of tokens at pos0..: for i < d/2,
        (x_i, x_{i+d/2}) turns by (pos0 + token) * inv_freq_i. Returns [heads][n][head_dim]."""
        n, hd, half = x.shape[0], self.head_dim, self.head_dim // 2
        a = torch.arange(pos0, pos0 + n, dtype=torch.float64)[:, None] * self.inv_freq.double()
        cos, sin = torch.cos(a).float()[None], torch.sin(a).float()[None]  # [1][n][half]
        x = x.reshape(n, heads, hd).transpose(0, 1)
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).contiguous()

    def _embed(self, tokens, start):
        t = torch.as_tensor(tokens, dtype=torch.long)
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.vocab):
            raise ValueError("token id outside the vocabulary")
        if start + t.numel() > self.max_positions:
            raise ValueError("more tokens than the model's positions")
        return self.embed[t]

    def _layer(self, l, x, pos0, ctx_k=None, ctx_v=None, past_k=None, past_v=None):
        """One decoder layer over x [n][hidden] (tokens at positions pos0..): attention over
        the context K/V (may be None), the local cache past_k/past_v (may be None) and x's
        own K/V, causal. Returns the new x and x's own k (post-rotary), v, each
        [kv_heads][n][head_dim]."""
        L = self.layers[l]
        n = x.shape[0]
        h = self._rms(x, L["ln1"])
        q = self._rotate(self._lin(h, L["q"], L["bq"]), self.heads, pos0) * self.scale
        k = self._rotate(self._lin(h, L["k"], L["bk"]), self.kv_heads, pos0)
        v = self._lin(h, L["v"], L["bv"]).reshape(n, self.kv_heads, self.head_dim)
        v = v.transpose(0, 1).contiguous()
        lk = k if past_k is None else torch.cat([past_k, k], 1)
        lv = v if past_v is None else torch.cat([past_v, v], 1)
        off = 0 if past_k is None else past_k.shape[1]
        if ctx_k is not None:
            keys, vals, npre = torch.cat([ctx_k, lk], 1), torch.cat([ctx_v, lv], 1), ctx_k.shape[1]
        else:
            keys, vals, npre = lk, lv, 0
        a = self._attend(q, keys, vals, npre, off)
        a = a.transpose(0, 1).reshape(n, self.heads * self.head_dim)
        x = x + self._lin(a, L["o"], L["bo"])
        h = self._rms(x, L["ln2"])
        x = x + self._lin(torch.nn.functional.silu(self._lin(h, L["gate"])) *
                          self._lin(h, L["up"]), L["down"])
        return x, k, v

    def _logits(self, x):
        return self._rms(x, self.norm) @ self.lm_head.T


__all__ = ["Llama", "ConfigError", "parse_config", "open_weights", "inv_freq", "ARCHS"]
