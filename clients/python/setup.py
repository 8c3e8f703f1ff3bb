"""Build settings pyproject.toml cannot express: the metadata is in pyproject.toml (PEP 621);
this only sends the build's byproducts (build/, kvedge.egg-info) to a temporary directory
instead of the source tree. Install with `pip install --no-build-isolation clients/python`
(docs/python.md)."""
import atexit
import shutil
import tempfile

from setuptools import setup

# pip runs each build step in a process of its own and takes what it needs (the metadata, the
# wheel) into its own directories before the process ends: the scratch goes with the process.
_scratch = tempfile.mkdtemp(prefix="kvedge-py-build.")
atexit.register(shutil.rmtree, _scratch, ignore_errors=True)

setup(options={"egg_info": {"egg_base": _scratch}, "build": {"build_base": _scratch}})
