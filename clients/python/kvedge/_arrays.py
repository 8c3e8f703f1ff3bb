"""NumPy / PyTorch arrays at the C boundary: dtype names, checks of caller tensors, inputs
made contiguous. NumPy is required here; torch only when the caller uses it."""
import numpy as np

from . import _ffi

# name -> (C dtype, numpy dtype or None for bf16, torch dtype name)
_DT = {
    "fp32": (_ffi.DTYPE_FP32, np.float32, "float32"),
    "fp16": (_ffi.DTYPE_FP16, np.float16, "float16"),
    "bf16": (_ffi.DTYPE_BF16, None, "bfloat16"),
}
_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16",
            "bfloat16": "bf16"}


def dtype_name(dtype):
    """'fp32' / 'fp16' / 'bf16' from a name, a NumPy dtype or a torch dtype."""
    if isinstance(dtype, str):
        d = _ALIASES.get(dtype, dtype)
        if d in _DT:
            return d
        raise ValueError(f"dtype must be fp32, fp16 or bf16, got {dtype!r}")
    s = str(dtype)
    if s.startswith("torch."):
        return dtype_name(s[6:])
    try:
        return dtype_name(np.dtype(dtype).name)
    except TypeError:
        raise TypeError(f"dtype must be a str, NumPy or torch dtype, not {type(dtype).__name__}")


def c_dtype(name):
    return _DT[name][0]


def np_dtype(name):
    return _DT[name][1]


def torch_dtype(name):
    import torch
    return getattr(torch, _DT[name][2])


def is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def describe(name, t):
    """(pointer, nbytes, shape, dtype name) of a caller's destination tensor, refusing what
    C cannot write into in place: not a NumPy array / CPU torch tensor, read-only, not
    C-contiguous, or an unsupported dtype (TypeError / ValueError)."""
    if is_torch(t):
        if t.device.type != "cpu":
            raise ValueError(f"{name}: a CPU tensor is required (got {t.device})")
        if not t.is_contiguous():
            raise ValueError(f"{name}: tensor is not contiguous (refused: use .contiguous())")
        if t.requires_grad:
            raise ValueError(f"{name}: tensor requires grad")
        d = dtype_name(t.dtype) if str(t.dtype)[6:] in ("float32", "float16", "bfloat16") \
            else None
        if d is None:
            raise TypeError(f"{name}: dtype {t.dtype} is not float32, float16 or bfloat16")
        return t.data_ptr(), t.numel() * t.element_size(), tuple(t.shape), d
    if isinstance(t, np.ndarray):
        if t.dtype not in (np.float32, np.float16):
            raise TypeError(f"{name}: dtype {t.dtype} is not float32 or float16")
        if not t.flags["C_CONTIGUOUS"]:
            raise ValueError(f"{name}: array is not C-contiguous (refused: use "
                             "np.ascontiguousarray)")
        if not t.flags["WRITEABLE"]:
            raise ValueError(f"{name}: array is read-only")
        return t.ctypes.data, t.nbytes, t.shape, dtype_name(t.dtype)
    raise TypeError(f"{name} must be a NumPy array or a torch tensor, not {type(t).__name__}")


def as_numpy_input(name, x, shape, dtype):
    """An input tensor (NumPy or CPU torch, fp32 / fp16 / bf16) as a C-contiguous NumPy array
    of dtype and exactly shape; converted or copied when needed (inputs are only read)."""
    if is_torch(x):
        import torch
        if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"{name}: dtype {x.dtype} is not a float type")
        x = x.detach().to("cpu")
        if x.dtype == torch.bfloat16:
            x = x.float()
        x = x.numpy()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array or a torch tensor, not "
                        f"{type(x).__name__}")
    if x.dtype not in (np.float32, np.float16, np.float64):
        raise TypeError(f"{name}: dtype {x.dtype} is not a float type")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {tuple(x.shape)} is not {tuple(shape)}")
    return np.ascontiguousarray(x, dtype=dtype)
