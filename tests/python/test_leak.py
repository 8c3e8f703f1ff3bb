#!/usr/bin/env python3
"""No leak over 10 000 calls: each kind of binding call (ping, chunk ids, lookup, a call that
raises, a FETCH with its Python callbacks, a pipeline opened, waited and closed) runs 10 000
times after a warm-up (get_layer with decoding: 2 000; a client connected and
closed: 1 000); the process's resident memory may not grow by more than a bound."""
import gc
import os
import time
import unittest

import kvtest

kvtest.need_numpy_torch()
import numpy as np  # noqa: E402

import kvedge  # noqa: E402

MODEL = kvedge.Model("py-leak", layers=2, kv_heads=2, head_dim=16)
CALLS = 10000
WARMUP = 500
# Growth allowed over the measured calls: allocator slack and Python's own caches, far below
# what one lost buffer per call would take (10 000 x 1 KiB = 10 MiB at the very least).
MAX_GROWTH_BYTES = 4 << 20


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class LeakTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = kvtest.Daemons()
        cls.d.master()
        cls.node_ep = cls.d.store("cloud", "cloud")
        cls.proxy_ep = cls.d.proxy([f"cloud cloud {cls.node_ep}"])
        cls.c = kvedge.Client(cls.node_ep)
        cls.px = kvedge.Client(cls.proxy_ep)
        cls.tokens = list(range(64))
        cls.chain = kvedge.chunk_ids(cls.tokens, MODEL, 32)
        k = np.ones((2, 64, 16), np.float32)
        for l in range(2):
            cls.c.put_layer(MODEL, cls.chain, l, k, k)
        kvtest.wait_proxy_knows(cls.px, cls.chain, model=MODEL, layers=range(MODEL.layers))

    @classmethod
    def tearDownClass(cls):
        cls.px.close()
        cls.c.close()
        cls.d.close()

    def bounded(self, name, fn, n=CALLS):
        for _ in range(WARMUP):
            fn()
        gc.collect()
        before = rss()
        t0 = time.monotonic()
        for _ in range(n):
            fn()
        gc.collect()
        grew = rss() - before
        print(f"{name}: {n} calls in {time.monotonic() - t0:.1f} s, RSS {before >> 20} MiB, "
              f"grew {grew / 1024:.0f} KiB")
        self.assertLess(grew, MAX_GROWTH_BYTES, f"{name}: RSS grew {grew} bytes")

    def test_the_check_sees_a_leak(self):
        """The measure is not blind: 1 KiB kept per call is caught."""
        kept = []
        with self.assertRaises(AssertionError):
            self.bounded("planted leak (1 KiB per call)", lambda: kept.append(bytearray(1024)))

    def test_calls(self):
        c, px, chain = self.c, self.px, self.chain
        self.bounded("ping", c.ping)
        self.bounded("chunk_ids", lambda: kvedge.chunk_ids(self.tokens, MODEL, 32))
        self.bounded("lookup", lambda: c.lookup(chain))

        def raises():
            try:
                c.get_model("no-such-model")
            except kvedge.NoModel:
                pass
        self.bounded("get_model (raises NoModel)", raises)
        self.bounded("fetch", lambda: px.fetch(chain, model=MODEL))

        def pipeline():
            with kvedge.Pipeline(px, MODEL, chain) as p:
                p.wait(0)
                p.wait(1)
        self.bounded("Pipeline open/wait/close", pipeline)

        k = np.ones((2, 64, 16), np.float32)
        self.bounded("put_layer (int8, 4 blocks)", lambda: c.put_layer(MODEL, chain, 1, k, k))
        self.bounded("get_layer (decode)", lambda: c.get_layer(chain, 1, decode=True), n=2000)

        def connect():
            kvedge.Client(self.node_ep).close()
        self.bounded("Client connect/close", connect, n=1000)


if __name__ == "__main__":
    unittest.main()
