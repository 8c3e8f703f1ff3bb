#!/usr/bin/env python3
"""The package as docs/python.md installs it with pip: `pip install --no-index
--no-build-isolation clients/python` into a fresh virtual environment (made with
--system-site-packages, for Debian's setuptools and wheel) builds through pyproject.toml with no
network and leaves nothing in the source tree; the installed package, imported from outside the
tree, loads the build's libkvedge.so through KVEDGE_LIB and pings a real store node; without
KVEDGE_LIB it finds a libkvedge.so.1 installed under the interpreter's prefix; when there is
none, the ImportError lists every place it looked and how to fix it. The example imports the
installed package and takes the CURVE flags.

Exit 77 (ctest SKIP) only when this python3 has no working venv module."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import kvtest

SOVERSION = 1
VENV = None  # made once, in main()


def venv_python():
    return os.path.join(VENV, "bin", "python")


def clean_env(**extra):
    """The environment without anything that would find the library or the source tree."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVEDGE_LIB", "LD_LIBRARY_PATH", "PYTHONPATH")}
    env.update(extra)
    return env


def run_in_venv(code, cwd, **env):
    return subprocess.run([venv_python(), "-c", code], capture_output=True, text=True, cwd=cwd,
                          env=clean_env(**env), timeout=120)


def system_libkvedge():
    """A libkvedge.so.1 this machine's loader or /usr/local/lib already has, or None: then
    "not found" cannot be shown here."""
    probe = ("import ctypes, sys\n"
             "for p in sys.argv[1:]:\n"
             "    try:\n"
             "        ctypes.CDLL(p); print(p); break\n"
             "    except OSError: pass\n")
    names = [f"libkvedge.so.{SOVERSION}"] + [
        f"{p}/{d}/libkvedge.so.{SOVERSION}" for p in ("/usr/local", "/usr")
        for d in ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu")]
    r = subprocess.run([sys.executable, "-c", probe, *names], capture_output=True, text=True,
                       env=clean_env())
    return r.stdout.strip() or None


class PipTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kvedge-pip.")
        cls.src = os.path.join(kvtest.SRC, "clients", "python")
        cls.before = sorted(os.listdir(cls.src))
        scratch = os.path.join(cls.tmp, "scratch")  # TMPDIR of the build: must end empty
        os.mkdir(scratch)
        # PIP_NO_INDEX and no proxy: any attempt at the network fails instead of hanging.
        env = clean_env(PIP_NO_INDEX="1", TMPDIR=scratch, PIP_DISABLE_PIP_VERSION_CHECK="1",
                        https_proxy="http://127.0.0.1:9", http_proxy="http://127.0.0.1:9")
        cls.pip = subprocess.run(
            [os.path.join(VENV, "bin", "pip"), "install", "--no-index", "--no-build-isolation",
             "--no-cache-dir", "-v", cls.src], capture_output=True, text=True, env=env,
            timeout=300)
        cls.scratch_left = os.listdir(scratch)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_install_offline(self):
        out = self.pip.stdout + self.pip.stderr
        self.assertEqual(self.pip.returncode, 0, out[-4000:])
        # PEP 517 through pyproject.toml, not the legacy `setup.py bdist_wheel` / install.
        self.assertIn("Building wheel for kvedge (pyproject.toml)", out)
        self.assertNotIn("setup.py install", out)
        self.assertEqual(sorted(os.listdir(self.src)), self.before, "build byproducts in the tree")
        self.assertEqual([x for x in self.scratch_left if x.startswith("kvedge-py-build.")], [],
                         "the build's scratch directory was left behind")
        r = run_in_venv("import importlib.metadata as m; print(m.version('kvedge'))", self.tmp)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "0.1.0")

    def test_real_call(self):
        """Imported from the venv (not the tree), loaded from KVEDGE_LIB: a store node pings."""
        self.assertEqual(self.pip.returncode, 0)
        d = kvtest.Daemons()
        try:
            ep = d.store("cloud", "cloud", master=False)
            code = ("import kvedge, sys\n"
                    "m = kvedge.Model.builtin('opt-125m')\n"
                    "chain = kvedge.chunk_ids(list(range(300)), m, 256)\n"
                    "with kvedge.Client(sys.argv[1], deadline_ms=5000) as c:\n"
                    "    rtt, bw = c.ping()\n"
                    "    print(kvedge.__file__, kvedge.library_path, kvedge.version(),\n"
                    "          c.node['role'], len(chain), rtt > 0)\n")
            r = subprocess.run([venv_python(), "-c", code, ep], capture_output=True, text=True,
                               cwd=self.tmp, env=clean_env(KVEDGE_LIB=os.environ["KVEDGE_LIB"]),
                               timeout=60)
        finally:
            d.close()
        self.assertEqual(r.returncode, 0, r.stderr)
        init, lib, version, role, n_ids, rtt_ok = r.stdout.split()
        self.assertTrue(init.startswith(VENV), init)
        self.assertEqual(lib, os.environ["KVEDGE_LIB"])
        self.assertRegex(version, r"^\d+\.\d+\.\d+$")
        self.assertEqual((role, n_ids, rtt_ok), ("cloud", "2", "True"))

    def test_found_under_prefix(self):
        """`make install PREFIX=$VIRTUAL_ENV` without ldconfig: found with no variable set."""
        self.assertEqual(self.pip.returncode, 0)
        installed = system_libkvedge()
        if installed:
            self.skipTest(f"this machine already has {installed}, which is found first")
        libdir = os.path.join(VENV, "lib")
        dst = os.path.join(libdir, f"libkvedge.so.{SOVERSION}")
        shutil.copy(os.path.realpath(os.environ["KVEDGE_LIB"]), dst)
        try:
            r = run_in_venv("import kvedge; print(kvedge.library_path, kvedge.version())",
                            self.tmp)
        finally:
            os.unlink(dst)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split()[0], dst)

    def test_not_found(self):
        """No KVEDGE_LIB and no library anywhere: the error lists where it looked, says how."""
        self.assertEqual(self.pip.returncode, 0)
        installed = system_libkvedge()
        if installed:
            self.skipTest(f"this machine has {installed}: the library cannot be missing here")
        r = run_in_venv("import kvedge", self.tmp)
        self.assertNotEqual(r.returncode, 0)
        err = r.stderr
        print(err.strip().splitlines()[-1])
        self.assertIn(f"ImportError: kvedge: cannot load libkvedge.so.{SOVERSION}; tried:", err)
        for where in ("$KVEDGE_LIB: not set", f"libkvedge.so.{SOVERSION} (system loader)",
                      f"/usr/local/lib/libkvedge.so.{SOVERSION} (install prefix): no such file",
                      f"{VENV}/lib/libkvedge.so.{SOVERSION} (install prefix): no such file",
                      "make install PREFIX=/usr/local && sudo ldconfig", "KVEDGE_LIB",
                      "docs/python.md"):
            self.assertIn(where, err)

    def test_kvedge_lib_missing(self):
        """KVEDGE_LIB names a file that is not there: only it is tried, and named."""
        self.assertEqual(self.pip.returncode, 0)
        gone = os.path.join(self.tmp, "gone", "libkvedge.so")
        r = run_in_venv("import kvedge", self.tmp, KVEDGE_LIB=gone)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"{gone} ($KVEDGE_LIB): no such file", r.stderr)
        self.assertIn("Fix: point KVEDGE_LIB at libkvedge.so", r.stderr)
        self.assertNotIn("system loader", r.stderr)

    def test_example_uses_installed_package(self):
        """The example has no sys.path insert: from outside the tree it imports the venv's
        package, and --help lists the CURVE flags."""
        self.assertEqual(self.pip.returncode, 0)
        for path in glob.glob(os.path.join(self.src, "examples", "*.py")):
            with open(path) as f:
                self.assertNotIn("sys.path.insert", f.read(), path)
        try:
            import torch  # noqa: F401  (kvedge.opt needs it)
        except ImportError:
            self.skipTest("PyTorch is missing (scripts/setup.sh installs python3-torch)")
        example = os.path.join(self.src, "examples", "opt_engine.py")
        r = subprocess.run([venv_python(), example, "--help"], capture_output=True, text=True,
                           cwd=self.tmp, env=clean_env(KVEDGE_LIB=os.environ["KVEDGE_LIB"]),
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        for flag in ("--server-key FILE", "--cert FILE", "--proxy-key FILE"):
            self.assertIn(flag, r.stdout)
        r = subprocess.run([venv_python(), example, "--node", "x", "--proxy", "y", "--weights",
                            "w", "--model-id", "m", "--tokenizer", "t", "--context-file", "c",
                            "--prompt", "p", "--server-key", "k"], capture_output=True,
                           text=True, cwd=self.tmp,
                           env=clean_env(KVEDGE_LIB=os.environ["KVEDGE_LIB"]), timeout=120)
        self.assertEqual(r.returncode, 2)
        self.assertIn("need --cert", r.stderr)


def main():
    global VENV
    if not os.environ.get("KVEDGE_LIB"):
        print("test_pip: KVEDGE_LIB must name the build's libkvedge.so (tests/CMakeLists.txt)")
        return 1
    top = tempfile.mkdtemp(prefix="kvedge-venv.")
    try:
        VENV = os.path.join(top, "venv")
        r = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", VENV],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"SKIP: {sys.executable} -m venv does not work here ({r.stderr.strip()[-300:]});"
                  " scripts/setup.sh installs python3-venv")
            return 77
        prog = unittest.main(exit=False)
        return 0 if prog.result.wasSuccessful() else 1
    finally:
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
