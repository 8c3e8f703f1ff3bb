#!/usr/bin/env python3
"""kvedge.load_bases: every coding basis ("*.kvb", access/codec/basis.h) of a directory is
registered in this process (a basis already registered counts again, other files are not
read), and a file or directory that does not load raises with the loader's reason. No NumPy:
the basis files are written here byte by byte."""
import hashlib
import os
import struct
import tempfile
import unittest

import kvtest  # noqa: F401  (puts clients/python on sys.path)
import kvedge


def basis_file(model, layers, kv_heads, head_dim, step=0.125):
    """A valid basis file: identity transforms (fp32 forward, fp16 inverse), one step."""
    b = bytearray(b"KVEDGEKB")
    b += struct.pack("<HHHHII", 1, 0, head_dim, 0, layers, kv_heads)
    b += model.encode().ljust(132, b"\0")
    fwd = b"".join(struct.pack("<%df" % head_dim, *[1.0 if c == r else 0.0
                                                     for c in range(head_dim)])
                   for r in range(head_dim))
    inv = b"".join(struct.pack("<%de" % head_dim, *[1.0 if c == r else 0.0
                                                     for c in range(head_dim)])
                   for r in range(head_dim))
    for _ in range(layers * kv_heads * 2):
        b += struct.pack("<f", step) + fwd + inv
    return bytes(b + hashlib.blake2b(bytes(b), digest_size=32).digest())


class BasesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, data):
        with open(os.path.join(self.dir, name), "wb") as f:
            f.write(data)

    def test_loads_a_directory(self):
        self.assertEqual(kvedge.load_bases(self.dir), 0)
        self.write("a.kvb", basis_file("py-basis-a", 2, 2, 16))
        self.write("b.kvb", basis_file("py-basis-b", 1, 1, 8))
        self.write("notes.txt", b"not a basis")
        self.assertEqual(kvedge.load_bases(self.dir), 2)
        self.assertEqual(kvedge.load_bases(self.dir), 2)  # the same bases again: fine

    def test_a_bad_file_raises_with_its_reason(self):
        data = bytearray(basis_file("py-basis-bad", 1, 1, 8))
        data[200] ^= 0x40
        self.write("bad.kvb", bytes(data))
        with self.assertRaises(kvedge.Corrupt) as cm:
            kvedge.load_bases(self.dir)
        self.assertIn("bad.kvb", cm.exception.detail)
        self.assertIn("digest", cm.exception.detail)
        with self.assertRaises(kvedge.IOFailure) as cm:
            kvedge.load_bases(os.path.join(self.dir, "no-such-dir"))
        self.assertIn("no-such-dir", cm.exception.detail)


if __name__ == "__main__":
    unittest.main()
