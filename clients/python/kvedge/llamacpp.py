"""llama.cpp at the edge from Python: a thin ctypes layer over libkvedge_llamacpp.so, the
llama.cpp bridge (clients/llamacpp/engine.h, docs/llamacpp.md). An Engine is a GGUF model that
llama.cpp loaded, with one context; a context's K/V is fetched through kvedge into it
(import_context) or put from it to a store node (export_context), and llama.cpp generates on
top:

    import kvedge
    from kvedge.llamacpp import Engine
    with kvedge.Client("ipc:///run/kvedge/proxy.sock") as proxy, \\
            Engine("llama-3.2-1b-f16.gguf", "llama-3.2-1b") as llm:
        llm.import_context(proxy, context_ids)
        print(llm.generate(prompt_ids, 32))

The library is found through $KVEDGE_LLAMACPP_LIB, else the path `make install` recorded, else
beside libkvedge.so, else the system's library path, else the install prefixes. It needs the
llama.cpp it was built against (libllama.so found by the loader) and refuses another version.
Importing this module raises kvedge.llamacpp.Unavailable (an ImportError) saying which of
these is missing; errors of the calls are kvedge.Error subclasses whose detail is the bridge's
message (a model mismatch: kvedge.ShapeError, "layers: GGUF 4, model record ... 6")."""
import ctypes
import os
import threading
import time
from ctypes import (POINTER, Structure, byref, c_bool, c_char_p, c_double, c_int, c_int32,
                    c_size_t, c_uint16, c_uint32, c_uint64, c_void_p)

from . import _ffi
from . import errors as _err
from .client import DTYPES, SCHEMES, Chain, Client, Model, _int_arg, _str_arg
from .errors import UseAfterClose, error

SOVERSION = 1  # libkvedge_llamacpp.so.SOVERSION (KVEDGE_LLAMACPP_SOVERSION)
WHY_BYTES = 256  # KVEDGE_LLAMACPP_WHY_BYTES
N_CTX_DEFAULT = 4096
CACHES = {"f32": 0, "f16": 1}  # KVEDGE_LLAMACPP_F32 / _F16
_LIB_NAME = "libkvedge_llamacpp.so.%d" % SOVERSION


class Unavailable(ImportError):
    """The llama.cpp bridge cannot be used here: libkvedge_llamacpp.so or the libllama it needs
    is not found, or that libllama is not the llama.cpp version the bridge knows (the message
    is the bridge's, naming both)."""


# ------------------------------------------------------------------ ctypes mirror (engine.h)
class EngineOpts(_ffi._Sized):
    _fields_ = [("size", c_size_t), ("model_id", c_char_p), ("n_ctx", c_uint32),
                ("n_seq", c_uint32), ("threads", c_uint32), ("cache", c_int)]


class ImportReq(_ffi._Sized):
    _fields_ = [("size", c_size_t), ("proxy", c_void_p), ("model", POINTER(_ffi.Model)),
                ("ctx", POINTER(c_int32)), ("n", c_uint32), ("chunk_tokens", c_uint32),
                ("deadline_ms", c_int), ("compute_misses", c_bool)]


class ImportStats(Structure):
    _fields_ = [("fetched", c_uint32), ("missed", c_uint32), ("prefilled", c_bool),
                ("fetch_us", c_double), ("convert_us", c_double), ("load_us", c_double),
                ("prefill_us", c_double), ("state_bytes", c_uint64)]


class ExportReq(_ffi._Sized):
    _fields_ = [("size", c_size_t), ("cloud", c_void_p), ("model", POINTER(_ffi.Model)),
                ("ctx", POINTER(c_int32)), ("n", c_uint32), ("chunk_tokens", c_uint32),
                ("scheme", c_int), ("dtype", c_int), ("group_size", c_uint16),
                ("compress", c_bool), ("pin", c_bool), ("ttl_s", c_uint32)]


class PrefillStats(Structure):  # kvedge_e2e_prefill_stats_t
    _fields_ = [("prefill_us", c_double), ("encode_us", c_double), ("put_us", c_double),
                ("blocks", c_uint64), ("bytes", c_uint64), ("fp16_bytes", c_uint64),
                ("n_chunks", c_size_t), ("layers_put", c_uint32), ("pruned_blocks", c_uint64),
                ("pruned_bytes", c_uint64), ("pruned_fp16_bytes", c_uint64)]


class ExportStats(Structure):
    _fields_ = [("read_us", c_double), ("state_bytes", c_uint64), ("put", PrefillStats)]


# ------------------------------------------------------------------ finding the library
def _candidates():
    """(where, what to load) in the order tried: $KVEDGE_LLAMACPP_LIB alone when it is set;
    else the path `make install` recorded, the folder libkvedge.so was loaded from, the system
    loader, then the install prefixes by path."""
    env = os.environ.get("KVEDGE_LLAMACPP_LIB")
    if env:
        yield "$KVEDGE_LLAMACPP_LIB", env
        return
    try:
        from . import _paths  # written by `make install`
        if getattr(_paths, "LLAMACPP_LIBRARY", None):
            yield "recorded by make install", _paths.LLAMACPP_LIBRARY
    except ImportError:
        pass
    if os.sep in _ffi.LIB_PATH:
        yield "beside libkvedge.so", os.path.join(os.path.dirname(os.path.realpath(
            _ffi.LIB_PATH)), _LIB_NAME)
    yield "system loader", _LIB_NAME
    for d in _ffi._prefix_dirs():
        yield "install prefix", os.path.join(d, _LIB_NAME)


def _load():
    found, path, tried = _ffi.try_load(_candidates(), "KVEDGE_LLAMACPP_LIB")
    if found:
        return found, path
    errors = [t.rsplit("): ", 1)[-1] for t in tried]  # what the loader said of each path
    if any("libllama" in e or "libggml" in e for e in errors):
        fix = ("the bridge is there but the loader does not find llama.cpp's libraries: put "
               "their folder (DIR/lib of -DKVEDGE_LLAMACPP=DIR) in LD_LIBRARY_PATH or "
               "/etc/ld.so.conf.d/")
    else:
        fix = ("build kvedge with -DKVEDGE_LLAMACPP=DIR and `make install`, or set "
               "KVEDGE_LLAMACPP_LIB to the library (a build has "
               "build/clients/libkvedge_llamacpp.so)")
    raise Unavailable("kvedge.llamacpp: cannot load %s; tried:\n%s\nFix: %s. See "
                      "docs/llamacpp.md." % (_LIB_NAME, "\n".join(tried), fix))


lib, LIB_PATH = _load()


def _fn(name, restype, *argtypes):
    return _ffi.bind(lib, name, restype, *argtypes)


P = POINTER
_E = c_void_p
_version = _fn("kvedge_llamacpp_engine_version", c_int, c_char_p, c_size_t)
_opts_default = _fn("kvedge_llamacpp_engine_opts_default", None, P(EngineOpts))
_open = _fn("kvedge_llamacpp_engine_open", c_int, c_char_p, P(EngineOpts), P(_E), c_char_p,
            c_size_t)
_destroy = _fn("kvedge_llamacpp_engine_destroy", None, P(_E))
_model = _fn("kvedge_llamacpp_engine_model", P(_ffi.Model), _E)
_arch = _fn("kvedge_llamacpp_engine_arch", c_char_p, _E)
_vocab = _fn("kvedge_llamacpp_engine_vocab", c_uint32, _E)
_n_ctx = _fn("kvedge_llamacpp_engine_n_ctx", c_uint32, _E)
_context = _fn("kvedge_llamacpp_engine_context", c_void_p, _E)
_tokenize = _fn("kvedge_llamacpp_engine_tokenize", c_int, _E, c_char_p, c_size_t, c_bool, c_bool,
                P(c_int32), c_size_t, P(c_size_t))
_detokenize = _fn("kvedge_llamacpp_engine_detokenize", c_int, _E, P(c_int32), c_uint32, c_bool,
                  c_char_p, c_size_t, P(c_size_t))
_check = _fn("kvedge_llamacpp_engine_check", c_int, _E, P(_ffi.Model), c_char_p, c_size_t)
_pos = _fn("kvedge_llamacpp_engine_pos", c_int, _E, c_int32, P(c_int32))
_clear = _fn("kvedge_llamacpp_engine_clear", c_int, _E, c_int32)
_prefill = _fn("kvedge_llamacpp_engine_prefill", c_int, _E, c_int32, P(c_int32), c_uint32,
               c_char_p, c_size_t)
_import_default = _fn("kvedge_llamacpp_import_default", None, P(ImportReq))
_import = _fn("kvedge_llamacpp_engine_import", c_int, _E, c_int32, P(ImportReq),
              P(ImportStats), c_char_p, c_size_t)
_export_default = _fn("kvedge_llamacpp_export_default", None, P(ExportReq))
_export = _fn("kvedge_llamacpp_engine_export", c_int, _E, c_int32, P(ExportReq),
              P(_ffi.ChunkId), c_size_t, P(ExportStats), c_char_p, c_size_t)
_generate = _fn("kvedge_llamacpp_engine_generate", c_int, _E, c_int32, P(c_int32), c_uint32,
                c_uint32, P(c_int32), P(c_double), c_char_p, c_size_t)


def _why_buf():
    return ctypes.create_string_buffer(WHY_BYTES)


def _raise(rc, what, why):
    raise error(rc, what, why.value.decode(errors="replace"))


def _check_version():
    why = _why_buf()
    if _version(why, WHY_BYTES) != 0:
        raise Unavailable(f"kvedge.llamacpp: {why.value.decode(errors='replace')} "
                          f"(libllama as loaded by {LIB_PATH}). See docs/llamacpp.md.")


_check_version()

# The structs this mirror passes, by the C name the library sizes them under.
MIRRORED = {"kvedge_llamacpp_engine_opts_t": EngineOpts, "kvedge_llamacpp_import_t": ImportReq,
            "kvedge_llamacpp_import_stats_t": ImportStats, "kvedge_llamacpp_export_t": ExportReq,
            "kvedge_llamacpp_export_stats_t": ExportStats, "kvedge_model_t": _ffi.Model,
            "kvedge_chunk_id_t": _ffi.ChunkId}
_sizeof = _fn("kvedge_llamacpp_engine_sizeof", c_size_t, c_char_p)


def _check_layout():
    bad = [f"{n}: the library's {_sizeof(n.encode())} bytes, this package's {ctypes.sizeof(c)}"
           for n, c in MIRRORED.items() if _sizeof(n.encode()) != ctypes.sizeof(c)]
    if bad:
        raise Unavailable(f"kvedge.llamacpp: {LIB_PATH} is not the library this package "
                          f"mirrors (install both from one build): " + "; ".join(bad))


_check_layout()


def _tokens_arg(name, tokens, vocab):
    """A sequence of token ids (ints, a NumPy array) as a C int32 array, each below vocab."""
    if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__len__"):
        raise TypeError(f"{name} must be a sequence of token ids")
    n = len(tokens)
    if n == 0:
        raise ValueError(f"{name} is empty")
    if n > (1 << 20):
        raise ValueError(f"{name} has over {1 << 20} tokens")
    arr = (c_int32 * n)()
    for i, t in enumerate(tokens):
        arr[i] = _int_arg(f"{name}[{i}]", t, 0, vocab - 1)
    return arr, n


def _client_arg(name, client):
    if not isinstance(client, Client):
        raise TypeError(f"{name} must be a kvedge.Client, not {type(client).__name__}")
    return client


class Engine(_ffi.Closing):
    """A GGUF model loaded by llama.cpp (kvedge_llamacpp_engine_t) with a context of n_seq
    sequences of n_ctx positions each (context + prompt + generated tokens), a KV cache of
    cache ("f16" or "f32"), llama.cpp running threads threads (0: the online CPUs, at most 4).
    model_id is the kvedge id the context is stored under (the rotary suffix is appended, as
    `kvedge prefill --engine llama.cpp` does: the same model gets the same id from any
    engine). Raises kvedge.IOFailure (the file is missing or not a GGUF llama.cpp loads),
    kvedge.ShapeError (an architecture or rotary scaling the bridge does not know). One call
    at a time (calls from several threads are serialized); close() (or `with`) frees it."""

    def __init__(self, gguf, model_id, n_ctx=N_CTX_DEFAULT, n_seq=1, threads=0, cache="f16"):
        self._h = c_void_p()
        self._lock = threading.Lock()
        path = _str_arg("gguf", os.fspath(gguf) if isinstance(gguf, os.PathLike) else gguf,
                        optional=False)
        mid = _str_arg("model_id", model_id, optional=False, max_bytes=_ffi.MODEL_ID_MAX_BYTES)
        if cache not in CACHES:
            raise ValueError(f"cache must be one of {sorted(CACHES)}, got {cache!r}")
        o = EngineOpts()
        _opts_default(byref(o))
        o.model_id = mid
        o.n_ctx = _int_arg("n_ctx", n_ctx, 1, 1 << 20)
        o.n_seq = _int_arg("n_seq", n_seq, 1, 256)
        o.threads = _int_arg("threads", threads, 0, 1024)
        o.cache = CACHES[cache]
        why = _why_buf()
        h = c_void_p()
        rc = _open(path, byref(o), byref(h), why, WHY_BYTES)
        if rc != 0:
            _raise(rc, f"llama.cpp engine {gguf}", why)
        self._h = h
        self.gguf = os.fspath(gguf)
        self.model = Model._from_c(_model(h).contents)
        self.arch = _arch(h).decode()
        self.vocab = _vocab(h)
        self.n_ctx = _n_ctx(h)
        self.n_seq = n_seq
        self.cache = cache

    # -- lifetime
    def close(self):
        """Frees the llama.cpp context and model. Idempotent; later calls raise
        kvedge.UseAfterClose."""
        with self._lock:
            if self._h:
                _destroy(byref(self._h))
                self._h = c_void_p()

    @property
    def closed(self):
        return not self._h

    def __repr__(self):
        state = "closed" if self.closed else f"{self.arch}, n_ctx {self.n_ctx}"
        return f"<kvedge.llamacpp.Engine {self.model.id} ({state})>"

    def _live(self, what):
        if not self._h:
            raise UseAfterClose(what)
        return self._h

    def _seq(self, seq):
        return _int_arg("seq", seq, 0, self.n_seq - 1)

    @property
    def context(self):
        """The struct llama_context * (an int) for a caller driving llama.cpp itself with the
        same libllama; valid until close()."""
        with self._lock:
            return _context(self._live("context"))

    # -- calls
    def tokenize(self, text, add_special=False, special=False):
        """Text to token ids with the GGUF's own vocabulary (llama.cpp's tokenizer):
        add_special adds the BOS the vocabulary asks for, special reads special tokens written
        in the text as their ids. A list of ints."""
        b = _str_arg("text", text)
        if b is None:
            raise TypeError("text is required")
        cap = len(b) + 2
        while True:
            out = (c_int32 * cap)()
            n = c_size_t()
            with self._lock:
                rc = _tokenize(self._live("tokenize"), b, len(b), bool(add_special),
                               bool(special), out, cap, byref(n))
            if rc == _err.ENOSPACE and n.value > cap:
                cap = n.value
                continue
            if rc != 0:
                raise error(rc, "tokenize")
            return list(out[:n.value])

    def detokenize(self, tokens, special=False):
        """Token ids to text (special: special tokens written out, else left out)."""
        arr, n = _tokens_arg("tokens", tokens, self.vocab)
        cap = 16 * n + 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            got = c_size_t()
            with self._lock:
                rc = _detokenize(self._live("detokenize"), arr, n, bool(special), buf, cap,
                                 byref(got))
            if rc == _err.ENOSPACE and got.value > cap:
                cap = got.value
                continue
            if rc != 0:
                raise error(rc, "detokenize")
            return buf.raw[:got.value].decode(errors="replace")

    def check(self, model):
        """The model check: returns when the kvedge.Model (e.g. a store's, client.get_model)
        describes this GGUF (layers, KV heads, head dim, rotary settings); kvedge.ShapeError
        naming the first field that differs otherwise."""
        if not isinstance(model, Model):
            raise TypeError(f"model must be a kvedge.Model, not {type(model).__name__}")
        m = model._to_c()
        why = _why_buf()
        with self._lock:
            rc = _check(self._live("check"), byref(m), why, WHY_BYTES)
        if rc != 0:
            _raise(rc, "check", why)

    def pos(self, seq=0):
        """The next position of sequence seq (the tokens it holds)."""
        p = c_int32()
        with self._lock:
            rc = _pos(self._live("pos"), self._seq(seq), byref(p))
        if rc != 0:
            raise error(rc, "pos")
        return p.value

    def clear(self, seq=0):
        """Empties sequence seq."""
        with self._lock:
            rc = _clear(self._live("clear"), self._seq(seq))
        if rc != 0:
            raise error(rc, "clear")

    def prefill(self, tokens, seq=0):
        """llama.cpp computes the tokens into sequence seq at its next positions."""
        arr, n = _tokens_arg("tokens", tokens, self.vocab)
        why = _why_buf()
        with self._lock:
            rc = _prefill(self._live("prefill"), self._seq(seq), arr, n, why, WHY_BYTES)
        if rc != 0:
            _raise(rc, "prefill", why)

    def import_context(self, client, tokens, chunk_tokens=_ffi.CHUNK_TOKENS_DEFAULT, seq=0,
                       model=None, deadline_ms=0, compute_misses=True):
        """Fetches the context of these token ids (chunked by chunk_tokens, as it was stored)
        through client (the edge proxy; a store node works too) into sequence seq, replacing
        what it held: it then holds the context at positions 0 .. len(tokens) - 1 and
        generate() decodes a prompt on top. model: the kvedge.Model the context was stored
        under when it is not this engine's (checked against the GGUF first); against a store
        node, the record the node holds under this engine's id is checked too. A missed
        layer: llama.cpp prefills the context itself (compute_misses) or kvedge.NotFound.
        Returns the import's numbers: fetched, missed, prefilled, fetch_ms, convert_ms,
        load_ms, prefill_ms, state_bytes. On an error the sequence is as it was."""
        _client_arg("client", client)
        arr, n = _tokens_arg("tokens", tokens, self.vocab)
        ct = _int_arg("chunk_tokens", chunk_tokens, 1, _ffi.CHUNK_TOKENS_MAX)
        seq = self._seq(seq)
        if model is not None:
            self.check(model)
        elif client.node["role"] != "proxy":
            # A store node knows the record it holds under this id: it must be this GGUF's.
            try:
                known = client.get_model(self.model.id)
            except _err.NoModel:
                known = None
            if known is not None:
                self.check(known)
        req = ImportReq()
        _import_default(byref(req))
        cm = (model or self.model)._to_c()
        req.model = ctypes.pointer(cm)
        req.ctx = arr
        req.n = n
        req.chunk_tokens = ct
        req.deadline_ms = _int_arg("deadline_ms", deadline_ms, 0, 2**31 - 1)
        req.compute_misses = bool(compute_misses)
        st = ImportStats()
        why = _why_buf()
        with self._lock, client._use("llamacpp import") as ch:
            req.proxy = ch
            rc = _import(self._live("import_context"), seq, byref(req), byref(st), why,
                         WHY_BYTES)
        if rc != 0:
            _raise(rc, "import_context", why)
        return {"fetched": st.fetched, "missed": st.missed, "prefilled": st.prefilled,
                "fetch_ms": st.fetch_us / 1e3, "convert_ms": st.convert_us / 1e3,
                "load_ms": st.load_us / 1e3, "prefill_ms": st.prefill_us / 1e3,
                "state_bytes": st.state_bytes}

    def export_context(self, client, tokens, chunk_tokens=_ffi.CHUNK_TOKENS_DEFAULT, seq=0,
                       scheme="int8", dtype="fp16", group_size=0, compress=True, pin=False,
                       ttl_s=0, prefill=True):
        """The cloud role: llama.cpp prefills these token ids into sequence seq (emptied
        first; prefill=False: seq already holds exactly them from position 0) and the bridge
        puts its K/V to client (a store node) as blocks under this engine's model, chunked by
        chunk_tokens, in scheme ("lossless", "int8", "int4"; dtype "fp16" or "fp32" for
        lossless). Returns the chain (a kvedge.Chain) and the numbers: prefill_ms, read_ms,
        encode_ms, put_ms, blocks, bytes, fp16_bytes, state_bytes."""
        _client_arg("client", client)
        arr, n = _tokens_arg("tokens", tokens, self.vocab)
        ct = _int_arg("chunk_tokens", chunk_tokens, 1, _ffi.CHUNK_TOKENS_MAX)
        seq = self._seq(seq)
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {sorted(SCHEMES)}, got {scheme!r}")
        if dtype not in ("fp16", "fp32"):
            raise ValueError(f"dtype must be 'fp16' or 'fp32', got {dtype!r}")
        req = ExportReq()
        _export_default(byref(req))
        req.ctx = arr
        req.n = n
        req.chunk_tokens = ct
        req.scheme = SCHEMES[scheme]
        req.dtype = DTYPES[dtype]
        req.group_size = _int_arg("group_size", group_size, 0, 65535)
        req.compress = bool(compress)
        req.pin = bool(pin)
        req.ttl_s = _int_arg("ttl_s", ttl_s, 0, 0xFFFFFFFF)
        n_ids = (n + ct - 1) // ct
        ids = (_ffi.ChunkId * n_ids)()
        st = ExportStats()
        why = _why_buf()
        prefill_ms = 0.0
        with self._lock:
            h = self._live("export_context")
            if prefill:
                _clear(h, seq)
                t0 = time.perf_counter()
                rc = _prefill(h, seq, arr, n, why, WHY_BYTES)
                prefill_ms = (time.perf_counter() - t0) * 1e3
                if rc != 0:
                    _raise(rc, "export_context: prefill", why)
            with client._use("llamacpp export") as ch:
                req.cloud = ch
                rc = _export(h, seq, byref(req), ids, n_ids, byref(st), why, WHY_BYTES)
        if rc != 0:
            _raise(rc, "export_context", why)
        chain = Chain([bytes(ids[i].bytes) for i in range(st.put.n_chunks)], self.model.id, ct,
                      n)
        p = st.put
        return {"chain": chain, "prefill_ms": prefill_ms, "read_ms": st.read_us / 1e3,
                "encode_ms": p.encode_us / 1e3, "put_ms": p.put_us / 1e3, "blocks": p.blocks,
                "bytes": p.bytes, "fp16_bytes": p.fp16_bytes, "state_bytes": st.state_bytes}

    def generate(self, prompt, max_new, seq=0):
        """llama.cpp decodes the prompt ids on sequence seq at its next positions (after an
        imported context: at len(context)), then max_new greedy tokens: returns them (a list
        of ints). self.ttft_ms: the time to the first one."""
        arr, n = _tokens_arg("prompt", prompt, self.vocab)
        k = _int_arg("max_new", max_new, 1, 1 << 20)
        gen = (c_int32 * k)()
        ttft = c_double()
        why = _why_buf()
        with self._lock:
            rc = _generate(self._live("generate"), self._seq(seq), arr, n, k, gen, byref(ttft),
                           why, WHY_BYTES)
        if rc != 0:
            _raise(rc, "generate", why)
        self.ttft_ms = ttft.value / 1e3
        return list(gen)


__all__ = ["Engine", "Unavailable", "LIB_PATH", "CACHES", "N_CTX_DEFAULT"]
