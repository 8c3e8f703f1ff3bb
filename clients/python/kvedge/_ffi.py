"""ctypes mirror of libkvedge's C API (clients/lib/kvedge.h and the headers it includes).

Every struct here mirrors its C definition field for field, in order; tests/python/abi_layout.c
prints the C sizes and offsets and tests/python/test_binding.py compares them with these, so a
field added on either side fails the test rather than corrupting memory. Fields appended to the
C structs and not used here (the large-small `mapped_*`, `adapt*`) are mirrored and left NULL.
"""
import ctypes
import ctypes.util
import os
import sys
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_char, c_char_p, c_double, c_float,
                    c_int, c_int32, c_size_t, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p)

CHUNK_ID_BYTES = 32
MODEL_ID_MAX_BYTES = 128
FETCH_MAX_SOURCES = 32
FETCH_MAX_LAYERS = 1024
CHUNK_TOKENS_DEFAULT = 256
CHUNK_TOKENS_MAX = 65536
BLOCK_MAX_HEAD_DIM = 1024
BLOCK_MAX_TOKENS = 65536

DTYPE_FP16, DTYPE_BF16, DTYPE_FP32 = 1, 2, 3
SCHEME_LOSSLESS, SCHEME_INT8, SCHEME_INT4 = 0, 1, 2
KV_CONTIG, KV_PAGED = 0, 1
ROLE_CLOUD, ROLE_EDGE, ROLE_PROXY = 1, 2, 3
TTL_NEVER = 0xFFFFFFFF
# The ABI this mirror describes: libkvedge.so.SOVERSION (clients/lib/CMakeLists.txt).
SOVERSION = 1


class ChunkId(Structure):
    _fields_ = [("bytes", c_uint8 * CHUNK_ID_BYTES)]


class Model(Structure):
    _fields_ = [("id", c_char * (MODEL_ID_MAX_BYTES + 1)), ("layers", c_uint16),
                ("kv_heads", c_uint16), ("head_dim", c_uint16), ("dtype", c_int)]


class ChunkInfo(Structure):
    _fields_ = [("id", ChunkId), ("parent", ChunkId), ("has_parent", c_bool),
                ("model_id", c_char * (MODEL_ID_MAX_BYTES + 1)), ("index", c_uint32),
                ("tokens", c_uint32), ("created_ms", c_uint64), ("tenant", c_uint8 * 16),
                ("name", ChunkId)]


class _Sized(Structure):
    """A struct that can grow: its first field is size, sizeof the struct as this mirror lays it
    out (the C _default functions set it the same way)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.size = ctypes.sizeof(self)


class ClientOpts(_Sized):
    _fields_ = [("size", c_size_t), ("endpoint", c_char_p), ("server_key", c_char_p),
                ("client_cert", c_char_p),
                ("deadline_ms", c_int), ("credit", c_uint32), ("name", c_char_p),
                ("link", c_char_p), ("window_bytes", c_uint32), ("no_pack", c_bool)]


class NodeInfo(Structure):
    _fields_ = [("role", c_int), ("name", c_char * 256), ("tenant_tag", c_uint8 * 16),
                ("max_items", c_uint32), ("max_chunks", c_uint32)]


class PutItem(Structure):
    _fields_ = [("chunk", ChunkInfo), ("layer", c_uint16), ("head", c_uint16),
                ("block", c_void_p), ("len", c_size_t), ("pin", c_bool), ("ttl_s", c_uint32)]


class Fetched(Structure):
    _fields_ = [("status", c_int), ("offset", c_size_t), ("len", c_size_t)]


class ChunkEntry(Structure):
    _fields_ = [("chunk", ChunkInfo), ("blocks", c_uint32), ("bytes", c_uint64),
                ("pinned_blocks", c_uint32), ("fp16_bytes", c_uint64)]


ENGINE_STATS_FIELDS = ("blocks", "bytes", "fp16_bytes", "pinned_blocks", "pinned_bytes",
                       "capacity_bytes", "quarantined", "puts", "gets", "hits", "misses",
                       "corrupt", "evicted_blocks", "evicted_bytes", "expired", "bytes_written",
                       "bytes_read")


class EngineStats(Structure):
    _fields_ = [(f, c_uint64) for f in ENGINE_STATS_FIELDS]


class FetchReq(_Sized):
    _fields_ = [("size", c_size_t), ("model_id", c_char_p), ("chunks", POINTER(ChunkId)),
                ("n", c_size_t),
                ("first_layer", c_uint16), ("layers", c_uint16), ("tokens", c_uint32),
                ("compute_us", POINTER(c_float)), ("recompute_us", POINTER(c_float)),
                ("deadline_ms", c_int), ("mapped_model_id", c_char_p),
                ("mapped_chunks", POINTER(ChunkId)), ("accept", POINTER(c_uint8)),
                ("n_accept", c_size_t), ("quality_metric", c_int), ("quality_budget", c_double)]


class FetchSource(Structure):
    _fields_ = [("name", c_char * 64), ("kind", c_int), ("up", c_bool), ("rtt_us", c_double),
                ("bw_bytes_per_s", c_double)]


class PlanLayer(Structure):
    _fields_ = [("source", c_int), ("reason", c_int), ("cost_us", c_double),
                ("from_layer", c_int), ("prec", c_int), ("prec_reason", c_int)]


class FetchPlan(Structure):
    _fields_ = [("nsources", c_uint32), ("source", FetchSource * FETCH_MAX_SOURCES),
                ("layers", c_uint32), ("split", c_uint32), ("total_us", c_double),
                ("bound_us", c_double), ("cloud_only_us", c_double),
                ("recompute_all_us", c_double), ("load_then_compute_us", c_double),
                ("layer", PlanLayer * FETCH_MAX_LAYERS)]


class FetchLayer(Structure):
    _fields_ = [("layer", c_uint16), ("source", c_int), ("source_name", c_char_p),
                ("reason", c_int), ("status", c_int), ("blocks", c_uint32),
                ("attempts", c_uint32), ("from_layer", c_int), ("prec", c_int)]


ON_PLAN = CFUNCTYPE(None, c_void_p, POINTER(FetchPlan))
ON_BLOCK = CFUNCTYPE(None, c_void_p, c_uint16, c_uint32, c_uint16, c_int, c_int,
                     POINTER(c_uint8), c_size_t)
ON_LAYER = CFUNCTYPE(None, c_void_p, POINTER(FetchLayer))
ON_DONE = CFUNCTYPE(None, c_void_p, c_int)


class FetchCbs(Structure):
    _fields_ = [("on_plan", ON_PLAN), ("on_block", ON_BLOCK), ("on_layer", ON_LAYER),
                ("on_done", ON_DONE)]


class KvDst(Structure):
    _fields_ = [("layout", c_int), ("dtype", c_int), ("base", c_void_p), ("cap_bytes", c_size_t),
                ("heads", c_uint32), ("head_dim", c_uint32), ("tokens_cap", c_uint32),
                ("page_size", c_uint32), ("num_pages", c_uint32),
                ("page_table", POINTER(c_int32)), ("table_len", c_uint32)]


class PipelineOpts(_Sized):
    _fields_ = [("size", c_size_t), ("client", c_void_p), ("model", POINTER(Model)),
                ("chunks", POINTER(ChunkId)),
                ("n_chunks", c_size_t), ("chunk_tokens", c_uint32), ("tokens", c_uint32),
                ("first_layer", c_uint16), ("layers", c_uint16), ("k", POINTER(KvDst)),
                ("v", POINTER(KvDst)), ("token_offset", c_uint32), ("on_device", c_bool),
                ("ring_slots", c_uint32), ("slot_bytes", c_size_t),
                ("compute_us", POINTER(c_float)), ("recompute_us", POINTER(c_float)),
                ("deadline_ms", c_int), ("mapped_model", POINTER(Model)),
                ("mapped_chunks", POINTER(ChunkId)), ("adapt", c_void_p),
                ("adapt_arg", c_void_p), ("accept", POINTER(c_uint8)), ("n_accept", c_size_t),
                ("quality_metric", c_int), ("quality_budget", c_double)]


class PipelineLayerStats(Structure):
    _fields_ = [("layer", c_uint16), ("done", c_bool), ("status", c_int), ("order", c_uint32),
                ("arrived_us", c_double), ("resident_us", c_double), ("wire_bytes", c_uint64),
                ("raw_bytes", c_uint64), ("blocks", c_uint32), ("source", c_char * 64),
                ("kind", c_int), ("reason", c_int), ("from_layer", c_int),
                ("adapt_failed", c_bool)]


class PipelineStats(Structure):
    _fields_ = [("device", c_bool), ("via_proxy", c_bool), ("ring_slots", c_uint32),
                ("slot_bytes", c_size_t), ("resident", c_uint32), ("misses", c_uint32),
                ("failed", c_uint32), ("wire_bytes", c_uint64), ("raw_bytes", c_uint64),
                ("sent_bytes", c_uint64), ("msg_bytes", c_uint64), ("ring_wait_us", c_double),
                ("copy_us", c_double), ("dequant_us", c_double), ("done_us", c_double),
                ("adapted", c_uint32), ("adapt_us", c_double), ("zero_copy_blocks", c_uint32),
                ("zero_copy_bytes", c_uint64)]


class BlockSpec(Structure):
    _fields_ = [("dtype", c_int), ("scheme", c_int), ("tokens", c_uint32),
                ("head_dim", c_uint16), ("group_size", c_uint16), ("key_mask", c_void_p),
                ("lz4", c_bool)]


class BlockInfo(Structure):
    _fields_ = [("version", c_uint8), ("dtype", c_int), ("scheme", c_int), ("tokens", c_uint32),
                ("head_dim", c_uint16), ("key_channels", c_uint16), ("group_size", c_uint16),
                ("lz4", c_bool), ("ec", c_bool), ("key_mask", c_void_p), ("raw_len", c_uint32),
                ("stored_len", c_uint32), ("body", c_void_p), ("checksum", c_uint64),
                ("total_len", c_size_t)]


# The structs the ABI test checks: C name -> ctypes class (nested anonymous structs by the
# name abi_layout.c prints for them).
MIRRORED = {
    "kvedge_chunk_id_t": ChunkId,
    "kvedge_model_t": Model,
    "kvedge_chunk_info_t": ChunkInfo,
    "kvedge_client_opts_t": ClientOpts,
    "kvedge_node_info_t": NodeInfo,
    "kvedge_put_item_t": PutItem,
    "kvedge_fetched_t": Fetched,
    "kvedge_chunk_entry_t": ChunkEntry,
    "kvedge_engine_stats_t": EngineStats,
    "kvedge_fetch_req_t": FetchReq,
    "kvedge_fetch_source_t": FetchSource,
    "kvedge_fetch_plan_t.layer": PlanLayer,
    "kvedge_fetch_plan_t": FetchPlan,
    "kvedge_fetch_layer_t": FetchLayer,
    "kvedge_fetch_cbs_t": FetchCbs,
    "kvedge_kv_dst_t": KvDst,
    "kvedge_pipeline_opts_t": PipelineOpts,
    "kvedge_pipeline_layer_stats_t": PipelineLayerStats,
    "kvedge_pipeline_stats_t": PipelineStats,
    "kvedge_block_spec_t": BlockSpec,
    "kvedge_block_info_t": BlockInfo,
}


# Where `make install` puts the library when the package was not installed by it (pip): the
# default prefix, then this interpreter's own prefixes (`make install PREFIX=$VIRTUAL_ENV`).
# The system loader finds /usr/local/lib only after `ldconfig`; these are tried by path.
def _prefix_dirs():
    multiarch = getattr(sys.implementation, "_multiarch", "")
    dirs = []
    for prefix in ("/usr/local", sys.prefix, sys.base_prefix):
        for sub in ("lib", "lib64", os.path.join("lib", multiarch) if multiarch else None):
            d = os.path.join(prefix, sub) if sub else None
            if d and d not in dirs:
                dirs.append(d)
    return dirs


def _candidates():
    """(where, what to load) in the order tried: $KVEDGE_LIB alone when it is set; else the
    path `make install` recorded, the system loader (ld.so.cache, LD_LIBRARY_PATH), then the
    install prefixes by path."""
    env = os.environ.get("KVEDGE_LIB")
    if env:
        yield "$KVEDGE_LIB", env
        return
    try:
        from . import _paths  # written by `make install`
        if _paths.LIBRARY:
            yield "recorded by make install", _paths.LIBRARY
    except ImportError:
        pass
    name = "libkvedge.so.%d" % SOVERSION
    yield "system loader", name
    found = ctypes.util.find_library("kvedge")
    if found and found != name:
        yield "ctypes.util.find_library", found
    for d in _prefix_dirs():
        yield "install prefix", os.path.join(d, name)


class Closing:
    """A with-statement and garbage collection for a class with close(): the with block ends
    with close(), and so does the object's collection (errors then ignored)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def try_load(candidates, env):
    """Loads the first of candidates ((where, path) pairs) that loads: (library, path, []), or
    (None, None, the lines saying what each try gave), the first saying $env is not set when
    it is not."""
    tried = [] if os.environ.get(env) else [f"  ${env}: not set"]
    for where, path in candidates:
        if os.sep in path and not os.path.exists(path):
            tried.append(f"  {path} ({where}): no such file")
            continue
        try:
            return ctypes.CDLL(path), path, []
        except OSError as e:
            tried.append(f"  {path} ({where}): {e}")
    return None, None, tried


def bind(library, name, restype, *argtypes):
    """library's function name with its ctypes signature."""
    f = getattr(library, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


def _load():
    found, path, tried = try_load(_candidates(), "KVEDGE_LIB")
    if found:
        return found, path
    if os.environ.get("KVEDGE_LIB"):
        fix = "point KVEDGE_LIB at libkvedge.so (a build has build/clients/libkvedge.so)"
    else:
        fix = ("install it (`make install PREFIX=/usr/local && sudo ldconfig`), or set "
               "KVEDGE_LIB to its path (a build has build/clients/libkvedge.so)")
    raise ImportError("kvedge: cannot load libkvedge.so.%d; tried:\n%s\nFix: %s. See "
                      "docs/python.md." % (SOVERSION, "\n".join(tried), fix))


lib, LIB_PATH = _load()


def _fn(name, restype, *argtypes):
    return bind(lib, name, restype, *argtypes)


P = POINTER
kvedge_version = _fn("kvedge_version", c_char_p)
kvedge_version_number = _fn("kvedge_version_number", c_int)
kvedge_strerror = _fn("kvedge_strerror", c_char_p, c_int)
kvedge_errname = _fn("kvedge_errname", c_char_p, c_int)
kvedge_client_last_error = _fn("kvedge_client_last_error", c_char_p)


def last_error():
    """What the latest kvedge_client_* call on this thread said beyond its code ("" if
    nothing): read right after the call that failed."""
    return (kvedge_client_last_error() or b"").decode(errors="replace")


kvedge_client_opts_default = _fn("kvedge_client_opts_default", None, P(ClientOpts))
kvedge_client_connect = _fn("kvedge_client_connect", c_int, P(ClientOpts), P(c_void_p))
kvedge_client_destroy = _fn("kvedge_client_destroy", None, P(c_void_p))
kvedge_client_node = _fn("kvedge_client_node", P(NodeInfo), c_void_p)
kvedge_client_ping = _fn("kvedge_client_ping", c_int, c_void_p, c_size_t, P(c_double),
                         P(c_double))
kvedge_client_link = _fn("kvedge_client_link", c_int, c_void_p, P(c_double), P(c_double),
                         P(c_uint64))
kvedge_client_put_model = _fn("kvedge_client_put_model", c_int, c_void_p, P(Model))
kvedge_client_get_model = _fn("kvedge_client_get_model", c_int, c_void_p, c_char_p, P(Model))
kvedge_client_put = _fn("kvedge_client_put", c_int, c_void_p, P(PutItem), c_size_t, P(c_int))
kvedge_client_get_layer = _fn("kvedge_client_get_layer", c_int, c_void_p, P(ChunkId), c_size_t,
                              c_uint16, c_void_p, c_size_t, P(Fetched), c_size_t, P(c_uint32))
kvedge_client_lookup = _fn("kvedge_client_lookup", c_int, c_void_p, P(ChunkId), c_size_t,
                           P(c_size_t))
kvedge_client_list = _fn("kvedge_client_list", c_int, c_void_p, P(ChunkId), P(ChunkEntry),
                         c_size_t, P(c_size_t), P(c_bool))
kvedge_client_stat = _fn("kvedge_client_stat", c_int, c_void_p, P(EngineStats))
kvedge_client_pin = _fn("kvedge_client_pin", c_int, c_void_p, P(ChunkId), c_size_t, c_bool,
                        P(c_uint32))
kvedge_client_delete = _fn("kvedge_client_delete", c_int, c_void_p, P(ChunkId), c_size_t,
                           P(c_uint32))
kvedge_client_fetch_async = _fn("kvedge_client_fetch_async", c_int, c_void_p, P(FetchReq),
                                P(FetchCbs), c_void_p)
kvedge_pipeline_open = _fn("kvedge_pipeline_open", c_int, P(PipelineOpts), P(c_void_p))
kvedge_pipeline_wait = _fn("kvedge_pipeline_wait", c_int, c_void_p, c_uint16)
kvedge_pipeline_ready = _fn("kvedge_pipeline_ready", c_int, c_void_p, c_uint16)
kvedge_pipeline_stats = _fn("kvedge_pipeline_stats", c_int, c_void_p, P(PipelineStats),
                            P(PipelineLayerStats), c_size_t)
kvedge_pipeline_plan = _fn("kvedge_pipeline_plan", c_int, c_void_p, P(FetchPlan))
kvedge_pipeline_destroy = _fn("kvedge_pipeline_destroy", None, P(c_void_p))
kvedge_chunk_chain = _fn("kvedge_chunk_chain", c_int, c_void_p, c_size_t, c_char_p,
                         P(c_uint32), c_size_t, c_uint32, P(ChunkId), c_size_t)
kvedge_model_builtin = _fn("kvedge_model_builtin", c_int, c_char_p, P(Model))
kvedge_model_check = _fn("kvedge_model_check", c_int, P(Model))
kvedge_block_encoded_bound = _fn("kvedge_block_encoded_bound", c_size_t, P(BlockSpec))
kvedge_block_encode = _fn("kvedge_block_encode", c_int, P(BlockSpec), c_void_p, c_void_p,
                          c_void_p, c_size_t, P(c_size_t))
kvedge_block_parse = _fn("kvedge_block_parse", c_int, c_void_p, c_size_t, P(BlockInfo))
kvedge_block_check = _fn("kvedge_block_check", c_int, c_void_p, c_size_t, P(BlockInfo))
kvedge_block_decode = _fn("kvedge_block_decode", c_int, P(BlockInfo), c_int, c_void_p, c_void_p)
kvedge_basis_load_dir = _fn("kvedge_basis_load_dir", c_int, c_char_p, P(c_size_t), c_char_p,
                            c_size_t)
kvedge_fetch_reason_name = _fn("kvedge_fetch_reason_name", c_char_p, c_int)
kvedge_plan_reason_name = _fn("kvedge_plan_reason_name", c_char_p, c_int)
kvedge_plan_prec_reason_name = _fn("kvedge_plan_prec_reason_name", c_char_p, c_int)
kvedge_prec_name = _fn("kvedge_prec_name", c_char_p, c_uint8)
kvedge_prec_list_parse = _fn("kvedge_prec_list_parse", c_int, c_char_p, P(c_uint8), c_size_t,
                             P(c_size_t))
kvedge_quality_budget_parse = _fn("kvedge_quality_budget_parse", c_int, c_char_p, P(c_int),
                                  P(c_double))
kvedge_plan_kind_name = _fn("kvedge_plan_kind_name", c_char_p, c_int)
