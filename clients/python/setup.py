"""pip install ./clients/python (offline: setuptools only, no build isolation needed since
there is no pyproject.toml). The package loads libkvedge.so at import time: install it first
(`make install`, then `ldconfig`), or point KVEDGE_LIB at it. See docs/python.md."""
import tempfile

from setuptools import setup

# Build byproducts (build/, kvedge.egg-info) go to a temporary directory, not the source tree.
_scratch = tempfile.mkdtemp(prefix="kvedge-py-build.")

setup(
    name="kvedge",
    version="0.1.0",
    description="Python binding of libkvedge, the kvedge KV-cache store's client library",
    packages=["kvedge"],
    python_requires=">=3.9",
    license="see the kvedge repository",
    options={"egg_info": {"egg_base": _scratch}, "build": {"build_base": _scratch}},
)
