"""kvedge: Python binding of libkvedge, the client library of the kvedge KV-cache store.

    import kvedge
    with kvedge.Client("tcp://127.0.0.1:7400") as c:
        chain = kvedge.chunk_ids(tokens, "kjv-cloud", 256)
        ...

ctypes over the installed libkvedge.so.1 (no compiler at import time): found through
$KVEDGE_LIB, else the path `make install` recorded, else the system's library path, else the
install prefixes (/usr/local/lib, this interpreter's prefix). See docs/python.md.
"""
# noqa: F401 below: these imports are the package's API.
from ._ffi import LIB_PATH as library_path  # noqa: F401
from .errors import *  # noqa: F401,F403  (Error and one subclass per KVEDGE_E* code)
from .errors import CODES, Error, UseAfterClose  # noqa: F401
from .client import (Chain, Client, Model, chunk_ids, decode_layer, fetch,  # noqa: F401
                     load_bases, version, version_number)


def __getattr__(name):
    # NumPy-backed parts load on first use, so `import kvedge` works without NumPy.
    if name == "Pipeline":
        from .pipeline import Pipeline
        return Pipeline
    if name in ("KVLoader", "LoadHandle"):
        from . import engine
        return getattr(engine, name)
    raise AttributeError(f"module 'kvedge' has no attribute {name!r}")


__version__ = "0.1.0"
__all__ = ["library_path", "CODES", "Error", "UseAfterClose", "Chain", "Client", "Model",
           "chunk_ids", "decode_layer", "fetch", "load_bases", "version", "version_number",
           "Pipeline", "KVLoader", "LoadHandle"] + [c.__name__ for c in CODES.values()]
