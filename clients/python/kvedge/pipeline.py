"""The pipelined loader (kvedge_pipeline_t) for Python: a context's layers land, dequantized,
straight in NumPy arrays or PyTorch tensors that Pipeline.wait(layer) hands back without a
copy."""
import ctypes
import operator
from ctypes import byref, c_int32, c_void_p

from . import _ffi
from . import _arrays
from .client import (Chain, Client, _chunk_array, _deadline_arg, _floats_arg, _Guard, _int_arg,
                     _model_arg, plan_to_dict)
from .errors import ENOTFOUND as _ENOTFOUND
from .errors import check, error



def _slot_bytes_any(chain, heads, head_dim):
    """Ring slot bytes for a whole layer whatever the store holds: lossless fp32 (8 bytes per
    K/V element pair) is the largest scheme (the sizing clients/e2e/e2e.c uses). C's own default
    (slot_bytes 0) fits fp16 and quantized blocks only."""
    total = 0
    for t in chain.counts:
        b = 8 * t * head_dim + 4 * head_dim + 4 * t
        total += heads * ((b + 15) & ~15)
    return total


class _Resource:
    """The C pipeline and its guard, apart from the Pipeline object: the client holds these
    strongly (not the Pipeline) so that it can always destroy its pipelines before itself, even
    when garbage collection finalizes the client first (weak references to objects of a garbage
    cycle are cleared before their finalizers run)."""

    __slots__ = ("h", "guard")

    def __init__(self):
        self.h = c_void_p()
        self.guard = _Guard()
        self.guard.closed = True

    def close(self):
        if self.guard.close() and self.h:
            _ffi.kvedge_pipeline_destroy(byref(self.h))


class Pipeline(_ffi.Closing):
    """Pipeline(client, model, chain, ...) starts fetching layers [first_layer, first_layer +
    layers) of the context `chain` (kvedge.chunk_ids) at once; wait(layer) blocks (GIL
    released) until that layer is in place and returns (k, v), or None when it is a miss
    (compute it yourself), or raises the error that ended it.

    client: a kvedge.Client of an edge proxy (one planned FETCH) or of a store node (GET_LAYER
    streams). The client must stay open while the pipeline is: closing the client closes its
    pipelines first.

    Destinations (written in place by C, never copied):
      - by default one buffer this object allocates, `self.buffer`: contiguous layout
        [2][layers][kv_heads][tokens_cap][head_dim] (k = buffer[0][i], v = buffer[1][i]), or
        with layout="paged", [2][layers][num_pages][page_size][kv_heads][head_dim] with an
        identity page table (pages 0.. in order);
      - or the caller's: k and v, each a sequence of `layers` tensors (or one tensor whose
        first axis is the layer), contiguous layout [kv_heads][tokens_cap][head_dim], NumPy
        float32/float16 or CPU torch float32/float16/bfloat16, C-contiguous and writable:
        anything else is refused (TypeError/ValueError), never silently copied. The pipeline
        keeps references to them until close().
    tensors="numpy" or "torch" chooses what the default buffer is (bf16 needs torch).
    The arrays wait() returns are views of the buffer: they keep it alive after close()."""

    def __init__(self, client, model, chain, first_layer=0, layers=None, dtype="fp32",
                 tensors="numpy", layout="contiguous", page_size=16, k=None, v=None,
                 token_offset=0, tokens_cap=None, ring_slots=0, slot_bytes=0, compute_us=None,
                 recompute_us=None, deadline_ms=0):
        self._res = _Resource()
        self._h = self._res.h
        self._guard = self._res.guard
        if not isinstance(client, Client):
            raise TypeError("client must be a kvedge.Client")
        m = _model_arg(model)
        if not isinstance(chain, Chain):
            raise TypeError("chain must be a kvedge.Chain (from kvedge.chunk_ids)")
        if chain.model_id != m.id:
            raise ValueError(f"chain was made for model {chain.model_id!r}, not {m.id!r}")
        first = _int_arg("first_layer", first_layer, 0, m.layers - 1)
        nl = m.layers - first if layers is None else _int_arg("layers", layers, 1,
                                                              m.layers - first)
        dname = _arrays.dtype_name(dtype)
        if tensors not in ("numpy", "torch"):
            raise ValueError("tensors must be 'numpy' or 'torch'")
        if layout not in ("contiguous", "paged"):
            raise ValueError("layout must be 'contiguous' or 'paged'")
        off = _int_arg("token_offset", token_offset, 0, 1 << 24)
        need = off + chain.tokens
        cap = need if tokens_cap is None else _int_arg("tokens_cap", tokens_cap, need, 1 << 24)
        ps = _int_arg("page_size", page_size, 1, 1 << 16)
        cu = _floats_arg("compute_us", compute_us, nl)
        ru = _floats_arg("recompute_us", recompute_us, nl)
        if (cu is None) != (ru is None):
            raise ValueError("compute_us and recompute_us go together")
        ring = _int_arg("ring_slots", ring_slots, 0, nl)
        slot = _int_arg("slot_bytes", slot_bytes, 0, 1 << 40)
        dl = _deadline_arg(deadline_ms)
        self._ids = _chunk_array(chain)
        heads, hd = m.kv_heads, m.head_dim
        self.model, self.chain = m, chain
        self.first_layer, self.layers = first, nl
        self.layout = layout
        self._page_table = None
        kd = (_ffi.KvDst * nl)()
        vd = (_ffi.KvDst * nl)()
        if (k is None) != (v is None):
            raise ValueError("k and v go together")
        if k is None:
            if tensors == "numpy" and dname == "bf16":
                raise ValueError("bf16 needs tensors='torch' (NumPy has no bfloat16)")
            if layout == "contiguous":
                per = (heads, cap, hd)
            else:
                pages = (need + ps - 1) // ps
                per = (pages, ps, heads, hd)
                self._page_table = (c_int32 * pages)(*range(pages))
            shape = (2, nl) + per
            if tensors == "torch":
                import torch
                buf = torch.empty(shape, dtype=_arrays.torch_dtype(dname))
                base, esize = buf.data_ptr(), buf.element_size()
            else:
                import numpy as np
                buf = np.empty(shape, dtype=_arrays.np_dtype(dname))
                base, esize = buf.ctypes.data, buf.itemsize
            self.buffer = buf
            self._k = [buf[0, i] for i in range(nl)]
            self._v = [buf[1, i] for i in range(nl)]
            per_bytes = esize
            for d in per:
                per_bytes *= d
            ptrs = [(base + i * per_bytes, base + (nl + i) * per_bytes) for i in range(nl)]
            self._dst_refs = None
        else:
            if layout != "contiguous":
                raise ValueError("caller destinations must use layout='contiguous'")
            ks, vs = self._split("k", k, nl), self._split("v", v, nl)
            ptrs = []
            for i in range(nl):
                kp, kb, kshape, kdt = _arrays.describe(f"k[{i}]", ks[i])
                vp, vb, vshape, vdt = _arrays.describe(f"v[{i}]", vs[i])
                for nm, shp, dt in (("k", kshape, kdt), ("v", vshape, vdt)):
                    if len(shp) != 3 or shp[0] != heads or shp[2] != hd or shp[1] < need:
                        raise ValueError(f"{nm}[{i}]: shape {tuple(shp)} is not [{heads}][>= "
                                         f"{need}][{hd}]")
                    if dt != dname:
                        raise TypeError(f"{nm}[{i}]: dtype {dt} is not the pipeline's {dname}")
                if kshape[1] != vshape[1]:
                    raise ValueError(f"k[{i}] and v[{i}] differ in tokens_cap")
                ptrs.append((kp, vp))
            cap = ks[0].shape[1]
            self.buffer = None
            self._k, self._v = list(ks), list(vs)
            self._dst_refs = (k, v)
        for i, (kp, vp) in enumerate(ptrs):
            for d, p in ((kd[i], kp), (vd[i], vp)):
                d.dtype = _arrays.c_dtype(dname)
                d.base = p
                d.heads, d.head_dim = heads, hd
                if layout == "contiguous":
                    d.layout = _ffi.KV_CONTIG
                    d.tokens_cap = self._k[i].shape[1] if self.buffer is None else cap
                    d.cap_bytes = heads * d.tokens_cap * hd * (2 if dname != "fp32" else 4)
                else:
                    d.layout = _ffi.KV_PAGED
                    d.page_size = ps
                    d.num_pages = len(self._page_table)
                    d.page_table = self._page_table
                    d.table_len = len(self._page_table)
                    d.cap_bytes = d.num_pages * ps * heads * hd * (2 if dname != "fp32" else 4)
        self._mc = m._to_c()
        o = _ffi.PipelineOpts()
        o.model = ctypes.pointer(self._mc)
        o.chunks = self._ids
        o.n_chunks = len(self._ids)
        o.chunk_tokens = chain.chunk_tokens
        o.tokens = chain.tokens
        o.first_layer, o.layers = first, nl
        o.k, o.v = kd, vd
        o.token_offset = off
        o.on_device = False
        o.ring_slots = ring
        o.slot_bytes = slot or _slot_bytes_any(chain, heads, hd)
        o.compute_us, o.recompute_us = cu, ru
        o.deadline_ms = dl
        self._keep = (kd, vd, cu, ru)
        self.client = client
        with client._use("Pipeline") as ch:
            o.client = ch
            check(_ffi.kvedge_pipeline_open(byref(o), byref(self._h)), "pipeline_open")
            self._guard.closed = False
            client._children.add(self._res)

    @staticmethod
    def _split(name, x, n):
        if _arrays.is_torch(x) or hasattr(x, "ctypes"):
            if len(x.shape) != 4:
                raise ValueError(f"{name}: one tensor for all layers must be 4-D "
                                 "[layers][kv_heads][tokens_cap][head_dim]")
            if x.shape[0] != n:
                raise ValueError(f"{name}: {x.shape[0]} layers, the pipeline has {n}")
            _arrays.describe(name, x)  # the whole tensor must be contiguous
            return [x[i] for i in range(n)]
        if isinstance(x, (list, tuple)):
            if len(x) != n:
                raise ValueError(f"{name}: {len(x)} tensors, the pipeline has {n} layers")
            return list(x)
        raise TypeError(f"{name} must be a tensor or a list of tensors, not {type(x).__name__}")

    # -- lifetime
    def close(self):
        """Stops the loader and frees the C pipeline; the tensors stay valid. Idempotent."""
        res = getattr(self, "_res", None)
        if res is None:
            return
        res.close()
        c = getattr(self, "client", None)
        if c is not None:
            c._children.discard(res)

    @property
    def closed(self):
        return self._guard.closed

    # -- calls
    def wait(self, layer):
        """Blocks until `layer` (a model layer number) is done: (k, v) views of the
        destination when resident, None when it is a miss; raises its error (kvedge.Timeout,
        kvedge.Closed, ...) when it failed."""
        layer, i = self._layer(layer)
        with self._guard.use("wait"):
            rc = _ffi.kvedge_pipeline_wait(self._h, layer)
        if rc == 0:
            return self._k[i], self._v[i]
        if rc == _ENOTFOUND:
            return None
        raise error(rc, f"wait layer {layer}")

    def ready(self, layer):
        """Whether `layer` is done (resident or a miss: wait() would return at once),
        without blocking."""
        layer, _ = self._layer(layer)
        with self._guard.use("ready"):
            rc = _ffi.kvedge_pipeline_ready(self._h, layer)
        if rc < 0:
            raise error(rc, f"ready layer {layer}")
        return rc == 1

    def _layer(self, layer):
        if isinstance(layer, bool) or not hasattr(layer, "__index__"):
            raise TypeError(f"layer must be an int, not {type(layer).__name__}")
        layer = operator.index(layer)
        i = layer - self.first_layer
        if not 0 <= i < self.layers:
            raise ValueError(f"layer {layer} outside [{self.first_layer}, "
                             f"{self.first_layer + self.layers})")
        return layer, i

    def plan(self):
        """The proxy's plan (dict, see kvedge.Client.fetch), or None (a store-node source, or
        no plan before the stream ended)."""
        p = _ffi.FetchPlan()
        with self._guard.use("plan"):
            rc = _ffi.kvedge_pipeline_plan(self._h, byref(p))
        if rc == _ENOTFOUND:
            return None
        check(rc, "plan")
        return plan_to_dict(p)

    def stats(self):
        """Counters and one record per layer (dicts)."""
        s = _ffi.PipelineStats()
        ls = (_ffi.PipelineLayerStats * self.layers)()
        with self._guard.use("stats"):
            check(_ffi.kvedge_pipeline_stats(self._h, byref(s), ls, self.layers), "stats")
        d = {f: getattr(s, f) for f, _ in _ffi.PipelineStats._fields_}
        d["layer"] = [{"layer": l.layer, "done": l.done, "status": l.status, "order": l.order,
                       "arrived_us": l.arrived_us, "resident_us": l.resident_us,
                       "wire_bytes": l.wire_bytes, "raw_bytes": l.raw_bytes,
                       "blocks": l.blocks, "source": l.source.decode(errors="replace"),
                       "kind": l.kind,
                       "reason": _ffi.kvedge_fetch_reason_name(l.reason).decode(),
                       "from_layer": l.from_layer} for l in ls]
        return d
