#!/usr/bin/env python3
"""The ctypes mirror (clients/python/kvedge/_ffi.py) has the C layout of every struct it
mirrors: abi_layout (tests/python/abi_layout.c, built against the headers) prints each size and
field offset, compared here with ctypes.sizeof / offsetof. A field appended in C and not here
(or the reverse) fails this test instead of corrupting memory at run time."""
import ctypes
import os
import subprocess
import unittest

import kvtest  # noqa: F401  (puts clients/python on sys.path)
from kvedge import _ffi


def c_layout():
    out = subprocess.run([os.environ["KVEDGE_ABI"]], check=True, capture_output=True,
                         text=True).stdout
    sizes, fields, consts = {}, {}, {}
    for line in out.splitlines():
        p = line.split()
        if p[0] == "C":
            consts[p[1]] = int(p[2])
        elif p[0] == "S":
            sizes[p[1]] = int(p[2])
        elif p[0] == "F":
            fields.setdefault(p[1], []).append((p[2], int(p[3])))
    return sizes, fields, consts


class AbiTest(unittest.TestCase):
    def test_every_mirrored_struct_matches_c(self):
        sizes, fields, _ = c_layout()
        self.assertEqual(set(sizes), set(_ffi.MIRRORED), "structs printed vs mirrored")
        for name, cls in _ffi.MIRRORED.items():
            with self.subTest(struct=name):
                self.assertEqual(ctypes.sizeof(cls), sizes[name], f"sizeof({name})")
                py = [(f, getattr(cls, f).offset) for f, _ in cls._fields_]
                self.assertEqual(py, fields[name], f"fields and offsets of {name}")

    def test_version_number(self):
        import kvedge
        consts = c_layout()[2]
        # The library loaded is the one these headers describe, and the number orders versions.
        self.assertEqual(kvedge.version_number(), consts["KVEDGE_VERSION_NUMBER"])
        major, minor, patch = (int(x) for x in kvedge.version().split("."))
        self.assertEqual(kvedge.version_number(), major * 10000 + minor * 100 + patch)

    def test_error_codes(self):
        import kvedge
        consts = c_layout()[2]
        self.assertEqual(kvedge.errors.ERR_BASE, consts.pop("KVEDGE_ERR_BASE"))
        consts.pop("KVEDGE_VERSION_NUMBER")
        self.assertEqual(consts.pop("KVEDGE_OK"), 0)
        # Every C code has its class and its name in kvedge.errors, and no other.
        self.assertEqual(sorted(consts.values()), sorted(kvedge.CODES))
        for name, code in consts.items():
            with self.subTest(code=name):
                self.assertEqual(getattr(kvedge.errors, name[len("KVEDGE_"):]), code)
                self.assertEqual(kvedge.CODES[code].code, code)
                self.assertEqual(kvedge.CODES[code](code).name, name)
                self.assertLess(code, -4095)  # never a -errno value
        self.assertEqual(kvedge.Busy.code, kvedge.errors.EBUSY)
        self.assertEqual(kvedge.Locked.code, kvedge.errors.ELOCKED)
        self.assertEqual(kvedge.Backlog.code, kvedge.errors.EBACKLOG)
        # A value that is no kvedge code (a -errno) is a plain kvedge.Error.
        e = kvedge.errors.error(-22, "x")
        self.assertIs(type(e), kvedge.Error)
        self.assertEqual(e.name, "KVEDGE_EUNKNOWN")

    def test_plan_layer_is_the_plan_array_element(self):
        self.assertIs(dict(_ffi.FetchPlan._fields_)["layer"]._type_, _ffi.PlanLayer)


if __name__ == "__main__":
    unittest.main()
