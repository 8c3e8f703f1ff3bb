#!/usr/bin/env python3
"""Hostile arguments: every public call of the binding driven with wrong types, out-of-range
and absurd values, lying sequences and tensors of the wrong dtype, layout or shape. Nothing may
crash the interpreter (this process would die and the test fail); every failure is a
TypeError / ValueError raised before any C call that does I/O or takes a handle (counted by
wrapping those functions), or a kvedge.Error from C. Also: closing a client from one thread
while others use it."""
import itertools
import threading
import time
import unittest

import kvtest

kvtest.need_numpy_torch()
import numpy as np  # noqa: E402
import torch  # noqa: E402

import kvedge  # noqa: E402
from kvedge import _ffi  # noqa: E402

MODEL = kvedge.Model("py-hostile", layers=3, kv_heads=2, head_dim=8)

# The C calls that do I/O or take a client / pipeline handle: none may run before an argument
# error is raised.
EFFECTFUL = [n for n in dir(_ffi) if n.startswith(("kvedge_client_", "kvedge_pipeline_"))
             and n not in ("kvedge_client_opts_default",)] + ["kvedge_block_encode"]
CALLS = {"n": 0}


def _wrap(name):
    f = getattr(_ffi, name)

    def counted(*a):
        CALLS["n"] += 1
        return f(*a)
    setattr(_ffi, name, counted)


for _n in EFFECTFUL:
    _wrap(_n)


class Liar(list):
    """A sequence whose len() disagrees with its items."""

    def __len__(self):
        return 3


class BadIndex:
    def __index__(self):
        raise RuntimeError("hostile __index__")


HOSTILE = [None, -1, 0, 2**31, 2**64, -2**63, 1.5, float("nan"), float("inf"), True, "", "x",
           "\0", "é" * 200, b"bytes", b"\0" * 32, object(), [], [None], [b"\0" * 31],
           ["zz" * 32], {"a": 1}, Liar([1]), BadIndex(), np.array([1.5]), np.zeros((0,)),
           np.int64(-5), torch.tensor([-1]), torch.zeros(2, 2, dtype=torch.int8),
           lambda: None, Ellipsis]


class HostileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = kvtest.Daemons()
        cls.d.master()
        cls.node_ep = cls.d.store("cloud", "cloud")
        cls.proxy_ep = cls.d.proxy([f"cloud cloud {cls.node_ep}"])
        cls.c = kvedge.Client(cls.node_ep, deadline_ms=1000)
        cls.px = kvedge.Client(cls.proxy_ep, deadline_ms=1000)
        cls.chain = kvedge.chunk_ids(list(range(20)), MODEL, 8)
        k = np.ones((2, 20, 8), np.float32)
        for l in range(3):
            cls.c.put_layer(MODEL, cls.chain, l, k, k)
        kvtest.wait_proxy_knows(cls.px, cls.chain, model=MODEL, layers=range(MODEL.layers))

    @classmethod
    def tearDownClass(cls):
        cls.px.close()
        cls.c.close()
        cls.d.close()

    def drive(self, name, fn, args, kwargs):
        """Calls fn with each hostile value in each position (and keyword) in turn."""
        tried = 0
        slots = [(i, None) for i in range(len(args))] + [(None, k) for k in kwargs]
        for (i, k), bad in itertools.product(slots, HOSTILE):
            a, kw = list(args), dict(kwargs)
            if i is not None:
                a[i] = bad
            else:
                kw[k] = bad
            before = CALLS["n"]
            try:
                r = fn(*a, **kw)
                if hasattr(r, "close"):
                    r.close()
            except (TypeError, ValueError, OverflowError) as e:
                self.assertEqual(CALLS["n"], before,
                                 f"{name}: {type(e).__name__} ({e}) after a C call")
            except kvedge.Error:
                pass
            except (RuntimeError, MemoryError) as e:  # BadIndex's own error, huge buffers
                self.assertIn(type(e), (RuntimeError, MemoryError), name)
            tried += 1
        return tried

    def test_every_call(self):
        c, px, ch = self.c, self.px, self.chain
        k = np.ones((2, 20, 8), np.float32)
        calls = [
            ("Client", kvedge.Client, [self.node_ep],
             dict(server_key=None, cert=None, deadline_ms=300, credit=0, name=None, link=None,
                  window_bytes=0)),
            ("Model", kvedge.Model, ["m", 2, 2, 8], dict(dtype="fp16")),
            ("Model.builtin", kvedge.Model.builtin, ["opt-125m"], {}),
            ("chunk_ids", kvedge.chunk_ids, [[1, 2, 3], MODEL], dict(chunk_tokens=8)),
            ("ping", c.ping, [], dict(bytes=0)),
            ("put_model", c.put_model, [MODEL], {}),
            ("get_model", c.get_model, ["py-hostile"], {}),
            ("put_layer", c.put_layer, [MODEL, ch, 0, k, k],
             dict(scheme="int8", dtype="fp16", group_size=0, lz4=True, pin=False, ttl_s=0)),
            ("put_blocks", c.put_blocks, [ch, [(0, 0, 0, b"x")]], dict(pin=False, ttl_s=0)),
            ("get_layer", c.get_layer, [ch, 0], dict(decode=False)),
            ("lookup", c.lookup, [ch], {}),
            ("list", c.list, [], dict(limit=3)),
            ("pin", c.pin, [ch], dict(pin=True)),
            ("fetch", px.fetch, [ch],
             dict(model=MODEL, first_layer=0, layers=None, compute_us=None, recompute_us=None,
                  deadline_ms=0, blocks=False)),
            ("kvedge.fetch", kvedge.fetch, [px, ch], {}),
            ("Pipeline", kvedge.Pipeline, [px, MODEL, ch],
             dict(first_layer=0, layers=None, dtype="fp32", tensors="numpy",
                  layout="contiguous", page_size=16, token_offset=0, tokens_cap=None,
                  ring_slots=0, slot_bytes=0, compute_us=None, recompute_us=None,
                  deadline_ms=0)),
            ("KVLoader", kvedge.KVLoader, [px, MODEL],
             dict(role="edge", chunk_tokens=8, tensors="torch", kv_dtype="fp32")),
        ]
        total = 0
        for name, fn, args, kwargs in calls:
            with self.subTest(call=name):
                total += self.drive(name, fn, args, kwargs)
        print(f"{total} hostile calls, interpreter alive")
        # The clients still work.
        c.ping()
        self.assertEqual(px.fetch(ch, model=MODEL)["status"], 0)

    def test_pipeline_and_loader_calls(self):
        p = kvedge.Pipeline(self.px, MODEL, self.chain)
        for bad in HOSTILE + [3, -1, 2**16]:
            try:
                p.wait(bad)
            except (TypeError, ValueError, RuntimeError):  # RuntimeError: BadIndex's own
                pass
        self.assertIsNotNone(p.wait(0))
        p.close()
        for m in (p.wait, p.plan, p.stats):
            with self.assertRaises(kvedge.UseAfterClose):
                m(0) if m == p.wait else m()
        with kvedge.KVLoader(self.px, MODEL, chunk_tokens=8) as ld:
            h = ld.start_load(list(range(20)))
            for bad in HOSTILE:
                for f, a in ((ld.wait_for_layer, (h, bad)), (ld.wait_for_layer, (bad, 0)),
                             (ld.save_layer, (bad, bad, bad))):
                    try:
                        f(*a)
                    except (TypeError, ValueError, RuntimeError, kvedge.Error):
                        pass
            self.assertIsNotNone(ld.wait_for_layer(h, 1))
        with kvedge.KVLoader(self.c, MODEL, role="cloud", chunk_tokens=8) as ld:
            ld.start_load(list(range(20)))
            bads = [np.ones((2, 20, 8), np.int32), np.ones((2, 19, 8), np.float32),
                    np.full((2, 20, 8), np.nan, np.float32), torch.ones(2, 20, 8).half()[:, :, :4],
                    torch.ones(2, 8, 20).transpose(1, 2), "k", None]
            for b in bads:
                try:
                    ld.save_layer(0, b, b)
                except (TypeError, ValueError, kvedge.Error):
                    pass

    def test_close_while_in_use(self):
        """Threads ping, look up and wait while another closes the client: each call either
        completes or raises kvedge.Closed / UseAfterClose; nothing crashes."""
        for _ in range(5):
            c = kvedge.Client(self.proxy_ep, deadline_ms=1000)
            errors = []

            def worker():
                for _ in range(200):
                    try:
                        c.ping()
                        with kvedge.Pipeline(c, MODEL, self.chain) as p:
                            p.wait(2)
                    except kvedge.Closed:
                        return
                    except Exception as e:  # pragma: no cover
                        errors.append(e)
                        return

            ts = [threading.Thread(target=worker) for _ in range(4)]
            for t in ts:
                t.start()
            time.sleep(0.05)
            c.close()
            for t in ts:
                t.join(30)
            self.assertEqual(errors, [])


if __name__ == "__main__":
    unittest.main()
