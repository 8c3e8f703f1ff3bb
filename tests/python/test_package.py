#!/usr/bin/env python3
"""The package as users install it: `cmake --install` into a fresh prefix puts kvedge into
lib/python3.X/dist-packages (or site-packages) with _paths.py naming the installed
libkvedge.so.1, so `import kvedge` works with neither KVEDGE_LIB nor LD_LIBRARY_PATH. The pip
install is test_pip.py's."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import kvtest

BUILD = os.environ.get("KVEDGE_BUILD", "")


class PackageTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kvedge-pkg.")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def clean_env(self, **extra):
        env = {k: v for k, v in os.environ.items()
               if k not in ("KVEDGE_LIB", "LD_LIBRARY_PATH", "PYTHONPATH")}
        env.update(extra)
        return env

    def test_cmake_install(self):
        if not BUILD:
            self.skipTest("KVEDGE_BUILD not set")
        prefix = os.path.join(self.tmp, "prefix")
        r = subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        pkgs = glob.glob(os.path.join(prefix, "lib", "python3*", "*-packages", "kvedge"))
        self.assertEqual(len(pkgs), 1, pkgs)
        with open(os.path.join(pkgs[0], "_paths.py")) as f:
            paths = f.read()
        self.assertIn(prefix, paths)
        code = ("import kvedge; print(kvedge.library_path); print(kvedge.version()); "
                "print(kvedge.__file__)")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=self.tmp,
                           env=self.clean_env(PYTHONPATH=os.path.dirname(pkgs[0])))
        self.assertEqual(r.returncode, 0, r.stderr)
        lib, version, init = r.stdout.split()
        self.assertTrue(lib.startswith(prefix) and os.path.exists(lib), lib)
        self.assertTrue(init.startswith(pkgs[0]), init)
        self.assertRegex(version, r"^\d+\.\d+\.\d+$")


if __name__ == "__main__":
    unittest.main()
