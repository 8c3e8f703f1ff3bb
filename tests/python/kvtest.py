"""Shared pieces of the Python binding's tests: where the build is, and real daemons
(`kvedge master`, `kvedge store`, `kvedge proxy`) started on ipc endpoints in a temporary
directory with --metrics off, as tests/clients/cli/test_top.sh and scripts/demo.sh start them.

Environment (set by tests/CMakeLists.txt): KVEDGE_LIB (the build's libkvedge.so), KVEDGE_BIN
(the build's kvedge), KVEDGE_ABI (the abi_layout program), KVEDGE_SRC (the source tree)."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SRC = os.environ.get("KVEDGE_SRC") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "clients", "python"))
BIN = os.environ.get("KVEDGE_BIN", "")
FIXTURES = os.path.join(SRC, "tests", "fixtures")
MODELS = os.path.join(SRC, "models")


class Daemons:
    """Daemons in one temporary directory; close() stops them (SIGTERM, then SIGKILL)."""

    def __init__(self):
        if not BIN or not os.access(BIN, os.X_OK):
            raise RuntimeError(f"KVEDGE_BIN={BIN!r} is not an executable kvedge")
        self.dir = tempfile.mkdtemp(prefix="kvedge-py.")
        self.procs = {}
        self.eps = {}

    def ep(self, name):
        return f"ipc://{self.dir}/{name}.sock"

    def start(self, name, *args, wait=True):
        """Runs `kvedge ARGS... --metrics off`; returns what it prints after "listening"."""
        out = open(os.path.join(self.dir, name + ".out"), "w")
        err = open(os.path.join(self.dir, name + ".err"), "w")
        p = subprocess.Popen([BIN, *args, "--metrics", "off"], stdout=out, stderr=err)
        out.close()  # the child has its own descriptors
        err.close()
        self.procs[name] = p
        path = os.path.join(self.dir, name + ".out")
        for _ in range(200):
            with open(path) as f:
                for line in f:
                    if line.startswith("listening "):
                        self.eps[name] = line.split()[1:]
                        return self.eps[name]
            if p.poll() is not None:
                break
            time.sleep(0.05)
        with open(os.path.join(self.dir, name + ".err")) as f:
            raise RuntimeError(f"{name} did not start: {f.read()[-2000:]}")

    def master(self):
        return self.start("master", "master", "--bind", self.ep("master"), "--pub",
                          self.ep("master-pub"), "--data", os.path.join(self.dir, "master"),
                          "--insecure")[0]

    def store(self, name="cloud", role="cloud", master=True):
        args = ["--data", os.path.join(self.dir, name), "store", "--role", role, "--bind",
                self.ep(name), "--insecure", "--name", name]
        if master:
            args += ["--master", self.ep("master"), "--master-pub", self.ep("master-pub"),
                     "--node-id", name]
        return self.start(name, *args)[0]

    def proxy(self, sources, master=True):
        args = ["proxy", "--bind", self.ep("proxy"), "--insecure"]
        if master:
            args += ["--master", self.ep("master"), "--master-pub", self.ep("master-pub")]
        for s in sources:
            args += ["-s", s]
        return self.start("proxy", *args)[0]

    def signal(self, name, sig):
        self.procs[name].send_signal(sig)

    def stop(self, name):
        p = self.procs.pop(name, None)
        if p is None:
            return
        try:
            p.send_signal(signal.SIGCONT)
            p.terminate()
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def close(self):
        for name in list(self.procs)[::-1]:
            self.stop(name)
        shutil.rmtree(self.dir, ignore_errors=True)


def cluster():
    """A master, a cloud store node joined to it, and an edge proxy with the node as its cloud
    source: the Daemons and the endpoints (node, proxy)."""
    d = Daemons()
    try:
        d.master()
        node = d.store("cloud", "cloud")
        proxy = d.proxy([f"cloud cloud {node}"])
        return d, node, proxy
    except Exception:
        d.close()
        raise


def wait_proxy_knows(proxy, chain, timeout=10.0, model=None, layers=None):
    """Waits until the proxy knows the model of chain (a node registers the models it holds
    with the master, the proxy learns them from it): a one-layer FETCH until it stops failing
    with kvedge.NoModel. With model and layers (the layer numbers stored), waits until a whole
    FETCH delivers exactly those layers: the master's block directory has caught up with the
    puts, so the proxy's plan no longer changes. Returns the last fetch's result."""
    import kvedge
    t0 = time.time()
    while True:
        try:
            if model is None:
                return proxy.fetch(chain, layers=1)
            r = proxy.fetch(chain, model=model)
            got = {x["layer"] for x in r["layers"] if x["status"] == 0}
            if got == set(layers):
                return r
            if time.time() - t0 > timeout:
                raise AssertionError(f"proxy delivers layers {sorted(got)}, not "
                                     f"{sorted(layers)}")
        except kvedge.NoModel:
            if time.time() - t0 > timeout:
                raise
        time.sleep(0.1)


def need_numpy_torch():
    """Exit 77 (ctest SKIP) when NumPy or PyTorch is missing."""
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e} (scripts/setup.sh installs python3-numpy and python3-torch)")
        sys.exit(77)
