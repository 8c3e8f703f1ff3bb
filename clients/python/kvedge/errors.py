"""One exception hierarchy for every failure libkvedge reports: kvedge.Error carries the C
error code (negative KVEDGE_E* value), its symbolic name and its text; each code has its own
subclass, so callers can catch exactly what they handle. Argument errors found before any C
call are Python's own TypeError / ValueError.

The codes sit in a range of their own, ERR_BASE - 1 down (KVEDGE_EINVAL is -30701), never on a
-errno value; this module names each one (kvedge.errors.ENOTFOUND == kvedge.NotFound.code)."""
from . import _ffi


class Error(Exception):
    """A libkvedge call failed. code: the negative KVEDGE_E* code; name: "KVEDGE_ETIMEDOUT"...;
    message: kvedge_strerror's text; what: the call that failed; detail: what the library said
    beyond the code (kvedge_client_last_error: the endpoint's form, the missing file, which
    daemon answers the request), "" when nothing."""

    code = None

    def __init__(self, code, what="", detail=""):
        self.code = code
        self.name = _ffi.kvedge_errname(code).decode()
        self.message = _ffi.kvedge_strerror(code).decode()
        self.what = what
        self.detail = detail or ""
        super().__init__(f"{what + ': ' if what else ''}{self.message} ({self.name})"
                         f"{': ' + self.detail if self.detail else ''}")


# (C name without KVEDGE_, class name, extra Python base)
_TABLE = [
    ("EINVAL", "InvalidArgument", None),
    ("ENOMEM", "OutOfMemory", MemoryError),
    ("ENOTFOUND", "NotFound", None),
    ("ECORRUPT", "Corrupt", None),
    ("EVERSION", "VersionError", None),
    ("ETOOBIG", "TooBig", None),
    ("ETRUNCATED", "Truncated", None),
    ("EIO", "IOFailure", None),
    ("EBUSY", "Busy", None),
    ("EFULL", "Full", None),
    ("ENOMODEL", "NoModel", None),
    ("ESHAPE", "ShapeError", None),
    ("ESTORE", "StoreError", None),
    ("ENOSPACE", "NoSpace", None),
    ("EEXPIRED", "Expired", None),
    ("EREADONLY", "ReadOnly", None),
    ("EAMBIGUOUS", "Ambiguous", None),
    ("EPROTO", "ProtocolError", None),
    ("ETIMEDOUT", "Timeout", TimeoutError),
    ("EDENIED", "Denied", PermissionError),
    ("ECLOSED", "Closed", None),
    ("ECANCELED", "Canceled", None),
    ("ENOSPC", "DiskFull", None),
    ("ELOCKED", "Locked", None),
    ("EBACKLOG", "Backlog", None),
    ("ENOTLEADER", "NotLeader", None),
    ("ENOBASIS", "NoBasis", None),
]

ERR_BASE = -30700  # KVEDGE_ERR_BASE: code n of the table is ERR_BASE - n

CODES = {}  # code -> class
_by_name = {}
for _i, (_cname, _pyname, _extra) in enumerate(_TABLE):
    _code = ERR_BASE - (_i + 1)
    assert _ffi.kvedge_errname(_code).decode() == "KVEDGE_" + _cname, _cname
    _bases = (Error,) if _extra is None else (Error, _extra)
    _cls = type(_pyname, _bases, {"code": _code, "__doc__": f"KVEDGE_{_cname}: "
                                  + _ffi.kvedge_strerror(_code).decode()})
    _cls.__module__ = "kvedge"
    CODES[_code] = _cls
    _by_name[_pyname] = _cls
    globals()[_cname] = _code  # ENOTFOUND = -30703 ...
globals().update(_by_name)
__all__ = ["Error", "check", "client_check", "CODES"] + list(_by_name)


class UseAfterClose(_by_name["Closed"]):
    """A method was called on a client, pipeline or loader after close() (a kvedge.Closed,
    code KVEDGE_ECLOSED)."""

    def __init__(self, what):
        Error.__init__(self, ECLOSED, what)  # noqa: F821 (defined from _TABLE)
        self.args = (f"{what}: the object is closed",)


UseAfterClose.__module__ = "kvedge"
__all__.append("UseAfterClose")


def error(code, what="", detail=""):
    """The exception object for a negative code."""
    return CODES.get(code, Error)(code, what, detail)


def check(code, what=""):
    """Raises the code's exception when code < 0; returns code otherwise."""
    if code < 0:
        raise error(code, what)
    return code


def client_check(code, what=""):
    """check() for a kvedge_client_* call, just made on this thread: the exception carries
    what the library said beyond the code (Error.detail)."""
    if code < 0:
        raise error(code, what, _ffi.last_error())
    return code
