"""Client, chunk ids, models and the planned FETCH over libkvedge (ctypes).

Every C call goes through ctypes.CDLL, which releases the GIL for the call's duration, so a
call waiting on the network never blocks other Python threads. Arguments are checked here
(TypeError / ValueError) before any C call; C errors raise kvedge.Error subclasses.
"""
import atexit
import ctypes
import itertools
import math
import operator
import os
import threading
import weakref
from contextlib import contextmanager
from ctypes import (byref, c_bool, c_double, c_float, c_int, c_size_t, c_uint8, c_uint32,
                    c_uint64, c_void_p)

from . import _ffi
from .errors import CODES, UseAfterClose, check, error
from . import errors as _err
from .errors import client_check as _check

DTYPES = {"fp16": _ffi.DTYPE_FP16, "bf16": _ffi.DTYPE_BF16, "fp32": _ffi.DTYPE_FP32}
SCHEMES = {"lossless": _ffi.SCHEME_LOSSLESS, "int8": _ffi.SCHEME_INT8, "int4": _ffi.SCHEME_INT4}
ROLES = {_ffi.ROLE_CLOUD: "cloud", _ffi.ROLE_EDGE: "edge", _ffi.ROLE_PROXY: "proxy"}
DEADLINE_MS_DEFAULT = 5000
# Extra time a Python-side wait allows past a C deadline before it gives up on a callback.
_WAIT_MARGIN_S = 5.0
_INT_MAX = 2**31 - 1


def _dtype_name(code):
    return {v: k for k, v in DTYPES.items()}.get(code, "?")


def _str_arg(name, value, optional=True, max_bytes=None):
    """A str argument as bytes for C (None stays None when optional)."""
    if value is None:
        if optional:
            return None
        raise TypeError(f"{name} is required")
    if isinstance(value, bytes):
        raise TypeError(f"{name} must be str, not bytes")
    if not isinstance(value, str):
        raise TypeError(f"{name} must be str, not {type(value).__name__}")
    b = value.encode()
    if b"\0" in b:
        raise ValueError(f"{name} contains a NUL character")
    if not optional and not b:
        raise ValueError(f"{name} is empty")
    if max_bytes is not None and len(b) > max_bytes:
        raise ValueError(f"{name} is longer than {max_bytes} bytes")
    return b


def _int_arg(name, value, lo, hi):
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    v = operator.index(value)
    if v < lo or v > hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {v}")
    return v


def _deadline_arg(value):
    return _int_arg("deadline_ms", value, 0, _INT_MAX)


class Model:
    """A model's KV shape as the store knows it: id, layers, kv_heads, head_dim, dtype."""

    __slots__ = ("id", "layers", "kv_heads", "head_dim", "dtype")

    def __init__(self, id, layers, kv_heads, head_dim, dtype="fp16"):
        _str_arg("id", id, optional=False, max_bytes=_ffi.MODEL_ID_MAX_BYTES)
        self.id = id
        self.layers = _int_arg("layers", layers, 1, 1024)
        self.kv_heads = _int_arg("kv_heads", kv_heads, 1, 1024)
        self.head_dim = _int_arg("head_dim", head_dim, 1, _ffi.BLOCK_MAX_HEAD_DIM)
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        self.dtype = dtype

    @classmethod
    def builtin(cls, id):
        """A built-in model shape by id ("opt-125m", "llama-2-7b", ...); kvedge.NoModel else."""
        m = _ffi.Model()
        check(_ffi.kvedge_model_builtin(_str_arg("id", id, optional=False), byref(m)),
              "model_builtin")
        return cls._from_c(m)

    @classmethod
    def _from_c(cls, m):
        return cls(m.id.decode(), m.layers, m.kv_heads, m.head_dim, _dtype_name(m.dtype))

    def _to_c(self):
        m = _ffi.Model()
        m.id = self.id.encode()
        m.layers, m.kv_heads, m.head_dim = self.layers, self.kv_heads, self.head_dim
        m.dtype = DTYPES[self.dtype]
        check(_ffi.kvedge_model_check(byref(m)), "model")
        return m

    def __eq__(self, other):
        return isinstance(other, Model) and all(
            getattr(self, f) == getattr(other, f) for f in self.__slots__)

    def __repr__(self):
        return (f"Model({self.id!r}, layers={self.layers}, kv_heads={self.kv_heads}, "
                f"head_dim={self.head_dim}, dtype={self.dtype!r})")


def _model_arg(model):
    if isinstance(model, Model):
        return model
    if isinstance(model, str):
        return Model.builtin(model)
    raise TypeError(f"model must be a kvedge.Model or a built-in model id, not "
                    f"{type(model).__name__}")


class Chain(list):
    """A context's chunk chain: the 32-byte chunk ids (bytes) of its chunks in order, with
    what made them: model_id, chunk_tokens, tokens (total) and counts (tokens per chunk)."""

    def __init__(self, ids, model_id, chunk_tokens, tokens):
        super().__init__(ids)
        self.model_id = model_id
        self.chunk_tokens = chunk_tokens
        self.tokens = tokens
        self.counts = [min(chunk_tokens, tokens - i * chunk_tokens) for i in range(len(ids))]

    def hex(self):
        return [i.hex() for i in self]

    def _to_c(self):
        return _chunk_array(self)


def _chunk_array(ids):
    """ids (a Chain, or a sequence of 32-byte bytes or 64-hex-digit str) as a C array."""
    if isinstance(ids, (bytes, str)) or not hasattr(ids, "__len__"):
        raise TypeError("chunk ids must be a sequence of 32-byte ids (bytes or hex str)")
    n = len(ids)
    if n == 0:
        raise ValueError("no chunk ids")
    if n > 4096:
        raise ValueError("more than 4096 chunk ids")
    arr = (_ffi.ChunkId * n)()
    for i, x in enumerate(ids):
        if isinstance(x, str):
            try:
                x = bytes.fromhex(x)
            except ValueError:
                raise ValueError(f"chunk id {i} is not hex") from None
        if not isinstance(x, (bytes, bytearray)):
            raise TypeError(f"chunk id {i} must be bytes or a hex str, not {type(x).__name__}")
        if len(x) != _ffi.CHUNK_ID_BYTES:
            raise ValueError(f"chunk id {i} has {len(x)} bytes, not {_ffi.CHUNK_ID_BYTES}")
        ctypes.memmove(arr[i].bytes, bytes(x), _ffi.CHUNK_ID_BYTES)
    return arr


def _tokens_arg(tokens):
    """Token ids (a sequence of ints, a NumPy integer array, a torch tensor) as a uint32 C
    array and its length."""
    if isinstance(tokens, (str, bytes)):
        raise TypeError("tokens must be a sequence of token ids, not text")
    if hasattr(tokens, "detach") and hasattr(tokens, "tolist"):  # torch
        tokens = tokens.detach().cpu().reshape(-1).tolist()
    elif hasattr(tokens, "dtype") and hasattr(tokens, "tolist"):  # numpy
        if tokens.dtype.kind not in "iu":
            raise TypeError(f"tokens must be integers, not {tokens.dtype}")
        tokens = tokens.reshape(-1).tolist()
    if not hasattr(tokens, "__len__"):
        raise TypeError(f"tokens must be a sequence of ints, not {type(tokens).__name__}")
    n = len(tokens)
    if n == 0:
        raise ValueError("no tokens")
    for t in tokens:
        if isinstance(t, bool) or not hasattr(t, "__index__"):
            raise TypeError(f"token ids must be ints, not {type(t).__name__}")
        if not 0 <= t <= 0xFFFFFFFF:
            raise ValueError(f"token id {t} outside [0, 2^32)")
    return (c_uint32 * n)(*tokens), n


def chunk_ids(tokens, model, chunk_tokens=_ffi.CHUNK_TOKENS_DEFAULT):
    """The chunk chain of a context: the ids a prefill stores it under and a fetch asks for
    (kvedge_chunk_chain, no salt: the ids `kvedge prefill` / `decode` use). model: a
    kvedge.Model or a model id (str, used as is: any id, built in or not)."""
    model_id = model.id if isinstance(model, Model) else model
    mid = _str_arg("model", model_id, optional=False, max_bytes=_ffi.MODEL_ID_MAX_BYTES)
    ct = _int_arg("chunk_tokens", chunk_tokens, 1, _ffi.CHUNK_TOKENS_MAX)
    arr, n = _tokens_arg(tokens)
    n_ids = (n + ct - 1) // ct
    ids = (_ffi.ChunkId * n_ids)()
    rc = _ffi.kvedge_chunk_chain(None, 0, mid, arr, n, ct, ids, n_ids)
    check(rc, "chunk_ids")
    return Chain([bytes(i.bytes) for i in ids[:rc]], model_id, ct, n)


class _Guard:
    """Keeps a C handle alive while calls use it: close() waits for calls in flight (each
    bounded by its deadline) before the handle is destroyed, and later calls raise
    UseAfterClose, so no thread can use a freed handle."""

    def __init__(self):
        self._cv = threading.Condition()
        self._users = 0
        self.closed = False

    @contextmanager
    def use(self, what):
        with self._cv:
            if self.closed:
                raise UseAfterClose(what)
            self._users += 1
        try:
            yield
        finally:
            with self._cv:
                self._users -= 1
                if self._users == 0:
                    self._cv.notify_all()

    def close(self):
        """True when this call closed it (the caller then destroys the handle)."""
        with self._cv:
            if self.closed:
                return False
            self.closed = True
            while self._users:
                self._cv.wait()
            return True


_live_clients = weakref.WeakSet()


@atexit.register
def _close_all():
    # czmq aborts at exit when a client's I/O thread still runs: close every client first.
    for c in list(_live_clients):
        try:
            c.close()
        except Exception:
            pass


# ---------------------------------------------------------------- FETCH callbacks
# One set of C thunks for the whole process (they never go away, so a callback that arrives
# late still finds valid code); each fetch is an entry in _fetches, found by the integer ctx.
_fetches = {}
_fetch_ids = itertools.count(1)


class _FetchState:
    def __init__(self, want_blocks):
        self.event = threading.Event()
        self.plan = None
        self.layers = []
        self.blocks = [] if want_blocks else None
        self.status = None


def _on_plan(ctx, plan_p):
    st = _fetches.get(ctx)
    if st is not None and plan_p:
        p = _ffi.FetchPlan()
        ctypes.memmove(byref(p), plan_p, ctypes.sizeof(_ffi.FetchPlan))
        st.plan = p


def _on_block(ctx, layer, chunk_index, head, source, status, data, length):
    st = _fetches.get(ctx)
    if st is not None and st.blocks is not None:
        st.blocks.append({"layer": layer, "chunk": chunk_index, "head": head, "source": source,
                          "status": status,
                          "data": ctypes.string_at(data, length) if data and status == 0
                          else b""})


def _on_layer(ctx, lp):
    st = _fetches.get(ctx)
    if st is not None and lp:
        l = lp.contents
        st.layers.append({
            "layer": l.layer, "source": l.source,
            "source_name": (l.source_name or b"").decode(errors="replace"),
            "reason": _ffi.kvedge_fetch_reason_name(l.reason).decode(), "status": l.status,
            "blocks": l.blocks, "attempts": l.attempts, "from_layer": l.from_layer,
            "prec": _prec_name(l.prec)})


def _on_done(ctx, status):
    st = _fetches.pop(ctx, None)
    if st is not None:
        st.status = status
        st.event.set()


_THUNKS = (_ffi.ON_PLAN(_on_plan), _ffi.ON_BLOCK(_on_block), _ffi.ON_LAYER(_on_layer),
           _ffi.ON_DONE(_on_done))
_CBS_NO_BLOCKS = _ffi.FetchCbs(_THUNKS[0], _ffi.ON_BLOCK(), _THUNKS[2], _THUNKS[3])
_CBS_BLOCKS = _ffi.FetchCbs(*_THUNKS)


def _prec_name(rung):
    """A precision rung's name ("int8", "int4-g32+think-50"), None for 0 (none chosen)."""
    return _ffi.kvedge_prec_name(rung).decode() if rung else None


def _accept_arg(accept):
    """An accept list: "int8,int4-g32" or a sequence of names, best first -> (array, n)."""
    if accept is None:
        return None, 0
    if not isinstance(accept, str):
        if isinstance(accept, bytes) or not hasattr(accept, "__iter__"):
            raise TypeError("accept must be a str or a sequence of precision names")
        names = list(accept)
        if not all(isinstance(x, str) for x in names):
            raise TypeError("accept must name precisions as str")
        accept = ",".join(names)
    out = (c_uint8 * 8)()
    n = c_size_t(0)
    if _ffi.kvedge_prec_list_parse(accept.encode(), out, 8, byref(n)) != 0:
        raise ValueError(f"accept {accept!r}: 1 to 8 distinct precisions, best first "
                         "(lossless, int8, int4-g32/64/128, each optionally +think-75/+think-50)")
    return out, n.value


def _budget_arg(budget):
    """A quality budget "kl:2e-5" / "ppl:0.5" / "none" -> (metric, value)."""
    if budget is None:
        return 0, 0.0
    if not isinstance(budget, str):
        raise TypeError("budget must be a str such as 'kl:2e-5' or 'ppl:0.5'")
    metric, value = c_int(0), c_double(0)
    if _ffi.kvedge_quality_budget_parse(budget.encode(), byref(metric), byref(value)) != 0:
        raise ValueError(f"budget {budget!r}: ppl:PCT (0 to 100), kl:NATS (0 to 10) or none")
    return metric.value, value.value


def plan_to_dict(p):
    """A kvedge_fetch_plan_t as a dict (sources, per-layer choices, the priced totals)."""
    ns = min(p.nsources, _ffi.FETCH_MAX_SOURCES)
    sources = [{"name": s.name.decode(errors="replace"),
                "kind": _ffi.kvedge_plan_kind_name(s.kind).decode(), "up": bool(s.up),
                "rtt_us": s.rtt_us, "bw_bytes_per_s": s.bw_bytes_per_s}
               for s in p.source[:ns]]
    layers = []
    for l in p.layer[:min(p.layers, _ffi.FETCH_MAX_LAYERS)]:
        name = sources[l.source]["name"] if 0 <= l.source < ns else "local"
        layers.append({"source": l.source, "source_name": name,
                       "reason": _ffi.kvedge_plan_reason_name(l.reason).decode(),
                       "cost_us": _priced(l.cost_us), "from_layer": l.from_layer,
                       "prec": _prec_name(l.prec),
                       "prec_reason": _ffi.kvedge_plan_prec_reason_name(l.prec_reason).decode()})
    return {"sources": sources, "layers": layers, "split": p.split,
            "total_us": _priced(p.total_us), "bound_us": _priced(p.bound_us),
            "cloud_only_us": _priced(p.cloud_only_us),
            "recompute_all_us": _priced(p.recompute_all_us),
            "load_then_compute_us": _priced(p.load_then_compute_us)}


# A plan cost of 1e300 (or more) on the wire means "unpriced": what the request did not allow
# (recomputation without decoder times) has no price. Python gets None for it.
_UNPRICED_US = 1e290


def _priced(us):
    return us if math.isfinite(us) and abs(us) < _UNPRICED_US else None


def _floats_arg(name, values, n):
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"{name} must be a sequence of {n} floats")
    if len(values) != n:
        raise ValueError(f"{name} must have {n} entries (one per layer), got {len(values)}")
    out = (c_float * n)()
    for i, x in enumerate(values):
        if isinstance(x, bool) or not isinstance(x, (int, float)) and not hasattr(x, "__float__"):
            raise TypeError(f"{name}[{i}] must be a number")
        f = float(x)
        if not (f >= 0.0 and f < float("inf")):
            raise ValueError(f"{name}[{i}] must be finite and >= 0")
        out[i] = f
    return out


class Client(_ffi.Closing):
    """A connection to a kvedge store node or edge proxy (kvedge_client_t).

    Client(endpoint, server_key=None, cert=None, deadline_ms=0): server_key is the node's
    public key (Z85 or a certificate path) and cert this client's secret certificate, both or
    neither (plaintext). deadline_ms (0 = 5000) bounds every call: a dead node raises
    kvedge.Timeout within it. credit (0 = 8) is the least a stream keeps in flight, in messages;
    window_bytes (0 = 4 MiB, at most 256 MiB) the block bytes a stream of small blocks is widened
    to (1: never widened). no_pack=True asks for one head per GET_LAYER data message instead of
    packed ones (the same blocks; for comparison or diagnosis). Thread-safe; close() (or
    `with`, or garbage collection) ends it, after closing the pipelines opened on it."""

    def __init__(self, endpoint, server_key=None, cert=None, deadline_ms=0, credit=0, name=None,
                 link=None, window_bytes=0, no_pack=False):
        self._h = c_void_p()
        self._guard = _Guard()
        self._guard.closed = True  # until connected
        # The C resources of the pipelines opened on this client (pipeline._Resource), held
        # strongly: closed before the client whatever order garbage collection takes.
        self._children = set()
        self._keep = [_str_arg("endpoint", endpoint, optional=False),
                      _str_arg("server_key", server_key), _str_arg("cert", cert),
                      _str_arg("name", name), _str_arg("link", link)]
        if (server_key is None) != (cert is None):
            raise ValueError("server_key and cert go together (or neither: plaintext)")
        dl = _deadline_arg(deadline_ms)
        credit = _int_arg("credit", credit, 0, 1 << 20)
        window = _int_arg("window_bytes", window_bytes, 0, 256 << 20)
        opts = _ffi.ClientOpts()
        _ffi.kvedge_client_opts_default(byref(opts))
        opts.endpoint, opts.server_key, opts.client_cert, opts.name, opts.link = self._keep
        opts.deadline_ms = dl
        opts.credit = credit
        opts.window_bytes = window
        opts.no_pack = bool(no_pack)
        self.endpoint = endpoint
        self.deadline_ms = opts.deadline_ms or DEADLINE_MS_DEFAULT
        h = c_void_p()
        _check(_ffi.kvedge_client_connect(byref(opts), byref(h)), f"connect {endpoint}")
        self._h = h
        self._guard.closed = False
        _live_clients.add(self)
        ni = _ffi.kvedge_client_node(h).contents
        self.node = {"role": ROLES.get(ni.role, str(ni.role)),
                     "name": ni.name.decode(errors="replace"),
                     "tenant_tag": bytes(ni.tenant_tag), "max_items": ni.max_items,
                     "max_chunks": ni.max_chunks}

    # -- lifetime
    def close(self):
        """Closes the pipelines opened on this client, then the client. Idempotent. Calls in
        flight on other threads finish first (each within its deadline); later calls raise
        kvedge.UseAfterClose."""
        # First no new call or pipeline can start (and those starting have finished), so the
        # set of pipelines is final: C requires the client to outlive every one of them.
        closing = self._guard.close()
        for p in list(self._children):
            p.close()
        if closing and self._h:
            _ffi.kvedge_client_destroy(byref(self._h))
        _live_clients.discard(self)

    @property
    def closed(self):
        return self._guard.closed

    def __repr__(self):
        role = getattr(self, "node", {}).get("role", "?")
        state = " closed" if self.closed else ""
        return f"<kvedge.Client {getattr(self, 'endpoint', '?')} {role}{state}>"

    @contextmanager
    def _use(self, what):
        with self._guard.use(what):
            yield self._h

    # -- calls
    def ping(self, bytes=0):
        """Round trip with `bytes` of payload: (rtt_us, bandwidth bytes/s)."""
        n = _int_arg("bytes", bytes, 0, 64 << 20)
        rtt, bw = c_double(), c_double()
        with self._use("ping") as h:
            _check(_ffi.kvedge_client_ping(h, n, byref(rtt), byref(bw)), "ping")
        return rtt.value, bw.value

    def link(self):
        """What the client measured of its link: bandwidth, rtt, samples."""
        bw, rtt, n = c_double(), c_double(), c_uint64()
        with self._use("link") as h:
            _check(_ffi.kvedge_client_link(h, byref(bw), byref(rtt), byref(n)), "link")
        return {"bw_bytes_per_s": bw.value, "rtt_us": rtt.value, "samples": n.value}

    def put_model(self, model):
        m = _model_arg(model)._to_c()
        with self._use("put_model") as h:
            _check(_ffi.kvedge_client_put_model(h, byref(m)), "put_model")

    def get_model(self, id):
        """The node's (or proxy's) shape of a model id: a kvedge.Model; kvedge.NoModel else."""
        mid = _str_arg("id", id, optional=False, max_bytes=_ffi.MODEL_ID_MAX_BYTES)
        m = _ffi.Model()
        with self._use("get_model") as h:
            _check(_ffi.kvedge_client_get_model(h, mid, byref(m)), "get_model")
        return Model._from_c(m)

    def put_blocks(self, chain, items, pin=False, ttl_s=0):
        """Stores encoded blocks: items are (chunk_index, layer, head, block bytes) of chain
        (a Chain from chunk_ids). Returns the per-item statuses (all 0 on success; raises the
        first failure's error otherwise)."""
        if not isinstance(chain, Chain):
            raise TypeError("chain must be a kvedge.Chain (from kvedge.chunk_ids)")
        if isinstance(items, (str, bytes)) or not hasattr(items, "__len__"):
            raise TypeError("items must be a sequence of (chunk_index, layer, head, block)")
        if not isinstance(pin, bool):
            raise TypeError("pin must be a bool")
        ttl = _int_arg("ttl_s", ttl_s, 0, _ffi.TTL_NEVER)
        n = len(items)
        if n == 0:
            return []
        arr = (_ffi.PutItem * n)()
        keep = []
        mid = chain.model_id.encode()
        for i, it in enumerate(items):
            if not isinstance(it, (tuple, list)) or len(it) != 4:
                raise TypeError(f"item {i} must be (chunk_index, layer, head, block)")
            ci = _int_arg(f"item {i} chunk_index", it[0], 0, len(chain) - 1)
            layer = _int_arg(f"item {i} layer", it[1], 0, 1023)
            head = _int_arg(f"item {i} head", it[2], 0, 1023)
            blk = it[3]
            if not isinstance(blk, (bytes, bytearray, memoryview)):
                raise TypeError(f"item {i} block must be bytes")
            blk = bytes(blk)
            if not blk:
                raise ValueError(f"item {i} block is empty")
            keep.append(blk)
            p = arr[i]
            ctypes.memmove(p.chunk.id.bytes, chain[ci], _ffi.CHUNK_ID_BYTES)
            if ci > 0:
                p.chunk.has_parent = True
                ctypes.memmove(p.chunk.parent.bytes, chain[ci - 1], _ffi.CHUNK_ID_BYTES)
            p.chunk.model_id = mid
            p.chunk.index = ci
            p.chunk.tokens = chain.counts[ci]
            p.layer, p.head = layer, head
            p.block = ctypes.cast(ctypes.c_char_p(blk), c_void_p)
            p.len = len(blk)
            p.pin = pin
            p.ttl_s = ttl
        st = (c_int * n)()
        with self._use("put_blocks") as h:
            rc = _ffi.kvedge_client_put(h, arr, n, st)
        _check(rc, "put_blocks")
        return list(st)

    def put_layer(self, model, chain, layer, k, v, scheme="int8", dtype="fp16", group_size=0,
                  lz4=True, pin=False, ttl_s=0):
        """Encodes one layer of a context's K and V ([kv_heads][tokens][head_dim], NumPy or
        torch, fp32 or fp16; non-contiguous input is copied) into one block per (chunk, head)
        with `scheme` (lossless, int8, int4) over `dtype` elements (fp16 or fp32), and stores
        them (registering the model on the node first when it does not know it). Returns
        {"blocks", "bytes"}."""
        from ._arrays import as_numpy_input
        m = _model_arg(model)
        if not isinstance(chain, Chain):
            raise TypeError("chain must be a kvedge.Chain (from kvedge.chunk_ids)")
        if chain.model_id != m.id:
            raise ValueError(f"chain was made for model {chain.model_id!r}, not {m.id!r}")
        layer = _int_arg("layer", layer, 0, m.layers - 1)
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {sorted(SCHEMES)}")
        if dtype not in ("fp16", "fp32"):
            raise ValueError("dtype must be fp16 or fp32")
        gs = _int_arg("group_size", group_size, 0, 65535)
        if not isinstance(lz4, bool):
            raise TypeError("lz4 must be a bool")
        if not isinstance(pin, bool):
            raise TypeError("pin must be a bool")
        _int_arg("ttl_s", ttl_s, 0, _ffi.TTL_NEVER)
        shape = (m.kv_heads, chain.tokens, m.head_dim)
        import numpy as np
        np_dtype = np.float16 if dtype == "fp16" else np.float32
        ka = as_numpy_input("k", k, shape, np_dtype)
        va = as_numpy_input("v", v, shape, np_dtype)
        spec = _ffi.BlockSpec()
        spec.dtype = DTYPES[dtype]
        spec.scheme = SCHEMES[scheme]
        spec.head_dim = m.head_dim
        spec.group_size = (gs or 32) if scheme == "int4" else gs
        spec.lz4 = lz4
        items = []
        total = 0
        start = 0
        for ci, t in enumerate(chain.counts):
            spec.tokens = t
            cap = _ffi.kvedge_block_encoded_bound(byref(spec))
            if cap == 0:
                raise ValueError("block spec refused (kvedge_block_encoded_bound)")
            buf = ctypes.create_string_buffer(cap)
            for h in range(m.kv_heads):
                kh = ka[h, start:start + t]
                vh = va[h, start:start + t]
                out_len = c_size_t()
                check(_ffi.kvedge_block_encode(byref(spec), kh.ctypes.data, vh.ctypes.data, buf,
                                               cap, byref(out_len)), "block_encode")
                blk = buf.raw[:out_len.value]
                total += len(blk)
                items.append((ci, layer, h, blk))
            start += t
        try:
            self.put_blocks(chain, items, pin=pin, ttl_s=ttl_s)
        except CODES[_err.ENOMODEL]:  # register the shape once, then put again
            self.put_model(m)
            self.put_blocks(chain, items, pin=pin, ttl_s=ttl_s)
        return {"blocks": len(items), "bytes": total}

    def get_layer(self, chain, layer, decode=False):
        """One layer of a context from a store node (GET_LAYER): a list of
        {"chunk", "head", "status", "block"} in (chunk, head) order; with decode=True the
        layer's K and V as fp32 NumPy arrays [heads][tokens][head_dim] (raises kvedge.NotFound
        when a head is missing)."""
        ids = _chunk_array(chain)
        layer = _int_arg("layer", layer, 0, 1023)
        n = len(ids)
        cap = max(1 << 20, n * 256 << 10)
        out_cap = n * 64
        while True:
            buf = ctypes.create_string_buffer(cap)
            out = (_ffi.Fetched * out_cap)()
            heads = c_uint32()
            with self._use("get_layer") as h:
                rc = _ffi.kvedge_client_get_layer(h, ids, n, layer, buf, cap, out, out_cap,
                                                  byref(heads))
            if rc == _err.ENOSPACE and cap < (1 << 31):  # grow and ask again
                cap *= 4
                out_cap = max(out_cap, n * max(heads.value, 1))
                continue
            _check(rc, "get_layer")
            break
        nh = heads.value
        raw = buf.raw
        res = []
        for i in range(min(n * nh, out_cap)):
            f = out[i]
            res.append({"chunk": i // nh, "head": i % nh, "status": f.status,
                        "block": raw[f.offset:f.offset + f.len] if f.status == 0 else b""})
        if not decode:
            return res
        return decode_layer(res, nh)

    def lookup(self, chain):
        """How many leading chunks of chain the node holds whole."""
        ids = _chunk_array(chain)
        hit = c_size_t()
        with self._use("lookup") as h:
            _check(_ffi.kvedge_client_lookup(h, ids, len(ids), byref(hit)), "lookup")
        return hit.value

    def list(self, limit=None):
        """The tenant's chunks in id order (all, or the first `limit`): dicts with id (hex),
        parent, model_id, index, tokens, blocks, bytes, pinned_blocks, fp16_bytes."""
        if limit is not None:
            limit = _int_arg("limit", limit, 0, 1 << 40)
        out = []
        after = None
        page = 256
        while limit is None or len(out) < limit:
            arr = (_ffi.ChunkEntry * page)()
            n, more = c_size_t(), c_bool()
            with self._use("list") as h:
                _check(_ffi.kvedge_client_list(h, byref(after) if after is not None else None,
                                              arr, page, byref(n), byref(more)), "list")
            for e in arr[:n.value]:
                c = e.chunk
                out.append({"id": bytes(c.id.bytes).hex(),
                            "parent": bytes(c.parent.bytes).hex() if c.has_parent else None,
                            "model_id": c.model_id.decode(errors="replace"), "index": c.index,
                            "tokens": c.tokens, "blocks": e.blocks, "bytes": e.bytes,
                            "pinned_blocks": e.pinned_blocks, "fp16_bytes": e.fp16_bytes})
            if not more.value or n.value == 0:
                break
            after = _ffi.ChunkId()
            ctypes.memmove(after.bytes, arr[n.value - 1].chunk.id.bytes, _ffi.CHUNK_ID_BYTES)
        return out if limit is None else out[:limit]

    def stat(self):
        """The node's store statistics (kvedge_engine_stats_t) as a dict."""
        s = _ffi.EngineStats()
        with self._use("stat") as h:
            _check(_ffi.kvedge_client_stat(h, byref(s)), "stat")
        return {f: getattr(s, f) for f in _ffi.ENGINE_STATS_FIELDS}

    def pin(self, chain, pin=True):
        """Pins (or unpins) chunks; returns the blocks changed per chunk."""
        ids = _chunk_array(chain)
        if not isinstance(pin, bool):
            raise TypeError("pin must be a bool")
        changed = (c_uint32 * len(ids))()
        with self._use("pin") as h:
            _check(_ffi.kvedge_client_pin(h, ids, len(ids), pin, changed), "pin")
        return list(changed)

    def fetch(self, chain, model=None, first_layer=0, layers=None, compute_us=None,
              recompute_us=None, deadline_ms=0, blocks=False, accept=None, budget=None):
        """A planned FETCH through an edge proxy (this client must be connected to one).
        Returns {"status", "plan" (dict or None), "layers" (one record per layer, in order),
        "blocks" (with blocks=True: every block's bytes)}. A layer nobody delivered has status
        KVEDGE_ENOTFOUND (kvedge.errors.ENOTFOUND) in its record; a failed stream raises its error.
        The cache optimizer: accept ("int8,int4-g32" or a list of names, best first) lets the
        proxy choose each layer's precision, under budget ("kl:2e-5", "ppl:0.5"; needs
        accept); the plan's layers and the records then say the precision ("prec")."""
        model_id = chain.model_id if model is None and isinstance(chain, Chain) else None
        m = None
        if model is not None:
            m = model if isinstance(model, Model) else None
            model_id = model.id if isinstance(model, Model) else model
        mid = _str_arg("model", model_id, optional=False, max_bytes=_ffi.MODEL_ID_MAX_BYTES)
        ids = _chunk_array(chain)
        first = _int_arg("first_layer", first_layer, 0, 1023)
        if layers is None:
            if m is None:
                raise ValueError("layers is required unless model is a kvedge.Model")
            layers = m.layers - first
        nl = _int_arg("layers", layers, 1, _ffi.FETCH_MAX_LAYERS)
        cu = _floats_arg("compute_us", compute_us, nl)
        ru = _floats_arg("recompute_us", recompute_us, nl)
        if (cu is None) != (ru is None):
            raise ValueError("compute_us and recompute_us go together")
        dl = _deadline_arg(deadline_ms) or self.deadline_ms
        req = _ffi.FetchReq()
        req.model_id = mid
        req.chunks = ids
        req.n = len(ids)
        req.first_layer, req.layers = first, nl
        req.tokens = chain.tokens if isinstance(chain, Chain) else 0
        req.compute_us, req.recompute_us = cu, ru
        req.deadline_ms = dl
        acc, nacc = _accept_arg(accept)
        metric, value = _budget_arg(budget)
        if acc is None and metric:
            raise ValueError("budget needs accept: the precisions it may choose among")
        req.accept, req.n_accept = acc, nacc
        req.quality_metric, req.quality_budget = metric, value
        if not isinstance(blocks, bool):
            raise TypeError("blocks must be a bool")
        st = _FetchState(blocks)
        key = next(_fetch_ids)
        with self._use("fetch") as h:
            _fetches[key] = st
            rc = _ffi.kvedge_client_fetch_async(h, byref(req),
                                                byref(_CBS_BLOCKS if blocks else _CBS_NO_BLOCKS),
                                                c_void_p(key))
            if rc < 0:
                _fetches.pop(key, None)
                raise error(rc, "fetch", _ffi.last_error())
            # on_done always comes (within the deadline: the client guarantees it).
            if not st.event.wait(dl / 1000.0 + _WAIT_MARGIN_S):
                raise error(_err.ETIMEDOUT, "fetch")  # the state stays registered
        if st.status < 0:
            raise error(st.status, "fetch")
        return {"status": st.status,
                "plan": plan_to_dict(st.plan) if st.plan is not None else None,
                "layers": st.layers, "blocks": st.blocks}


def fetch(proxy, chain, **kw):
    """kvedge.fetch(proxy_client, chain, ...): Client.fetch on a proxy client."""
    if not isinstance(proxy, Client):
        raise TypeError("proxy must be a kvedge.Client connected to an edge proxy")
    return proxy.fetch(chain, **kw)


def decode_layer(records, heads):
    """K and V fp32 [heads][tokens][head_dim] from get_layer's records of one layer."""
    import numpy as np
    if heads == 0 or not records:
        raise error(_err.ENOTFOUND, "decode_layer")
    ks, vs = [[] for _ in range(heads)], [[] for _ in range(heads)]
    for r in records:
        if r["status"] != 0:
            raise error(r["status"] if r["status"] < 0 else _err.ENOTFOUND, "decode_layer")
        blk = r["block"]
        info = _ffi.BlockInfo()
        cbuf = ctypes.create_string_buffer(blk, len(blk))
        check(_ffi.kvedge_block_check(cbuf, len(blk), byref(info)), "block_check")
        k = np.empty((info.tokens, info.head_dim), np.float32)
        v = np.empty((info.tokens, info.head_dim), np.float32)
        check(_ffi.kvedge_block_decode(byref(info), _ffi.DTYPE_FP32, k.ctypes.data,
                                       v.ctypes.data), "block_decode")
        ks[r["head"]].append(k)
        vs[r["head"]].append(v)
    return (np.stack([np.concatenate(x) for x in ks]), np.stack([np.concatenate(x) for x in vs]))


def load_bases(directory):
    """Loads and registers every coding basis ("*.kvb") of directory in this process, in name
    order, so tc blocks of their models decode (Pipeline, decode_layer) and a fetch may accept
    the tc precision. Returns how many were registered (a basis already loaded counts). A file
    that does not load raises (the ones before it stay registered); the exception's detail
    names the file and the check that failed."""
    loaded = c_size_t(0)
    why = ctypes.create_string_buffer(512)
    rc = _ffi.kvedge_basis_load_dir(os.fsencode(directory), byref(loaded), why, len(why))
    if rc < 0:
        raise error(rc, "load_bases", why.value.decode(errors="replace"))
    return loaded.value


def version():
    """The version of the libkvedge loaded ("MAJOR.MINOR.PATCH")."""
    return _ffi.kvedge_version().decode()


def version_number():
    """The version of the libkvedge loaded as one number that orders versions:
    MAJOR * 10000 + MINOR * 100 + PATCH (0.1.0 is 100), as KVEDGE_VERSION_NUMBER."""
    return _ffi.kvedge_version_number()
