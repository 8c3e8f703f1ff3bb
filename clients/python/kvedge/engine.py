"""An engine-side loader with the layer-wise shape inference engines use (the shape of vLLM's
KV-connector worker API: start the load, wait for each layer right before its attention runs,
save each layer's K/V as it is computed, finish). It is not a vLLM connector: an engine calls
it from its own forward pass (kvedge.opt shows one).

    loader = KVLoader(client, model, role="edge")       # or role="cloud"
    h = loader.start_load(context_tokens)               # edge: one FETCH / GET_LAYER pipeline
    for l in range(layers):
        kv = loader.wait_for_layer(h, l)                # (k, v) [kv_heads][tokens][head_dim],
        ...                                             # or None: compute layer l locally
    loader.finish(h)

In the cloud role start_load only fixes the context (nothing is fetched: wait_for_layer
returns None, the engine computes every layer) and save_layer(l, k, v) encodes and stores
layer l's K/V under the context's chunk ids as soon as the engine has it.
"""
from . import _arrays, _ffi
from .client import Client, Model, _int_arg, _model_arg, chunk_ids
from .errors import UseAfterClose
from .pipeline import Pipeline

ROLES = ("edge", "cloud")


class LoadHandle:
    """One context being loaded (edge) or saved (cloud): chain (its chunk ids), tokens,
    pipeline (edge role), and per layer what happened: "fetched" or "computed" (edge),
    "saved" (cloud)."""

    def __init__(self, chain, tokens, pipeline):
        self.chain = chain
        self.tokens = tokens
        self.pipeline = pipeline
        self.layers = {}
        self.saved_bytes = 0
        self.finished = False

    @property
    def plan(self):
        return self.pipeline.plan() if self.pipeline is not None else None


class KVLoader(_ffi.Closing):
    """KVLoader(client, model, role="edge", ...): client is a kvedge.Client (of an edge proxy
    for the edge role, of a cloud store node for the cloud role) or an endpoint string (the
    loader then owns its client; server_key / cert / deadline_ms go to it). model: a
    kvedge.Model (its id, layers, kv_heads, head_dim) or a built-in model id.

    Edge options: tensors ("torch" or "numpy") and kv_dtype ("fp32", "fp16", "bf16") of the
    layers handed back, ring_slots, deadline_ms. Cloud options: scheme ("int8", "int4",
    "lossless"), dtype ("fp16" or "fp32" elements before quantization), group_size, lz4, pin,
    ttl_s. chunk_tokens must be the same on both sides (as for `kvedge prefill` / `decode`)."""

    def __init__(self, client, model, role="edge", chunk_tokens=256, tensors="torch",
                 kv_dtype="fp32", ring_slots=0, deadline_ms=0, scheme="int8", dtype="fp16",
                 group_size=0, lz4=True, pin=False, ttl_s=0, server_key=None, cert=None):
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}")
        self.model = _model_arg(model)
        self.role = role
        self.chunk_tokens = _int_arg("chunk_tokens", chunk_tokens, 1, 65536)
        if tensors not in ("torch", "numpy"):
            raise ValueError("tensors must be 'torch' or 'numpy'")
        self.tensors = tensors
        self.kv_dtype = _arrays.dtype_name(kv_dtype)
        self.ring_slots = ring_slots
        self.deadline_ms = deadline_ms
        self.save_opts = dict(scheme=scheme, dtype=dtype, group_size=group_size, lz4=lz4,
                              pin=pin, ttl_s=ttl_s)
        self._own = not isinstance(client, Client)
        if self._own:
            client = Client(client, server_key=server_key, cert=cert, deadline_ms=deadline_ms)
        self.client = client
        self._current = None
        self._handles = []
        self._closed = False

    def _check_open(self, what):
        if self._closed:
            raise UseAfterClose(what)

    def start_load(self, context_tokens, compute_us=None, recompute_us=None):
        """Starts loading the context's layers (edge role; compute_us / recompute_us, one
        entry per layer, let a proxy plan layers as "recompute") or fixes the context that
        save_layer stores (cloud role). Returns a LoadHandle."""
        self._check_open("start_load")
        chain = chunk_ids(context_tokens, self.model, self.chunk_tokens)
        p = None
        if self.role == "edge":
            p = Pipeline(self.client, self.model, chain, dtype=self.kv_dtype,
                         tensors=self.tensors, ring_slots=self.ring_slots,
                         compute_us=compute_us, recompute_us=recompute_us,
                         deadline_ms=self.deadline_ms)
        h = LoadHandle(chain, chain.tokens, p)
        self._current = h
        self._handles.append(h)
        return h

    def wait_for_layer(self, handle, layer):
        """Blocks until layer `layer` of the handle's context is resident and returns its (k, v)
        ([kv_heads][tokens][head_dim], zero-copy views of the loader's buffer), or None when the
        engine must compute it (a miss, a layer the plan leaves to it, or the cloud role).
        Raises kvedge.Error when the layer failed (kvedge.Timeout past the deadline, ...)."""
        if not isinstance(handle, LoadHandle):
            raise TypeError("handle must be a LoadHandle from start_load")
        layer = _int_arg("layer", layer, 0, self.model.layers - 1)
        if handle.pipeline is None or handle.finished:
            handle.layers[layer] = "computed"
            return None
        kv = handle.pipeline.wait(layer)
        handle.layers[layer] = "fetched" if kv is not None else "computed"
        return kv

    def save_layer(self, layer, k, v, handle=None):
        """Cloud role: stores layer `layer`'s K and V ([kv_heads][tokens][head_dim] of the
        context of `handle`, default the last start_load's; NumPy or torch, fp32/fp16/bf16)
        as one block per (chunk, head)."""
        self._check_open("save_layer")
        h = handle if handle is not None else self._current
        if not isinstance(h, LoadHandle):
            raise ValueError("save_layer needs a context: call start_load(context_tokens) first")
        if self.role != "cloud":
            raise ValueError("save_layer is the cloud role's (KVLoader(role='cloud'))")
        r = self.client.put_layer(self.model, h.chain, layer, k, v, **self.save_opts)
        h.layers[layer] = "saved"
        h.saved_bytes += r["bytes"]
        return r

    def finish(self, handle=None):
        """Ends a load (default: the last one): its pipeline stops and is freed; the tensors
        handed out stay valid. Returns the handle's per-layer summary."""
        h = handle if handle is not None else self._current
        if h is None:
            return {}
        if h.pipeline is not None:
            h.pipeline.close()
        h.finished = True
        if h in self._handles:
            self._handles.remove(h)
        if h is self._current:
            self._current = None
        return dict(h.layers)

    def close(self):
        for h in list(self._handles):
            self.finish(h)
        if self._own and self.client is not None:
            self.client.close()
        self._closed = True


__all__ = ["KVLoader", "LoadHandle", "Model"]
