#!/usr/bin/env python3
"""Every call of the Python binding against a real store node, master and edge proxy started
here: Client calls, put/get round trips, FETCH's plan and records, the Pipeline's zero-copy
NumPy and torch views (the data pointer lies in the pipeline's buffer, which outlives the
pipeline while a view lives), deadlines against a stopped node, error mapping, closing, and
the GIL released while C waits."""
import gc
import os
import signal
import subprocess
import threading
import time
import unittest
import weakref

import kvtest

kvtest.need_numpy_torch()
import numpy as np  # noqa: E402
import torch  # noqa: E402

import kvedge  # noqa: E402

MODEL = kvedge.Model("py-test", layers=4, kv_heads=2, head_dim=16)


def kv(layer, tokens, seed=0):
    g = np.random.default_rng(seed + layer)
    return (g.standard_normal((2, tokens, 16)).astype(np.float32),
            g.standard_normal((2, tokens, 16)).astype(np.float32))


class Cluster(unittest.TestCase):
    """One master, one cloud node and one proxy for the class; layers 1..3 of a 100-token
    context stored lossless fp32 (layer 0 is missing: a miss; a missing deeper layer would make
    the proxy plan every layer above it as recompute, which is free once the edge has to run
    the context through them anyway)."""

    @classmethod
    def setUpClass(cls):
        cls.d, cls.node_ep, cls.proxy_ep = kvtest.cluster()
        cls.node = kvedge.Client(cls.node_ep, deadline_ms=3000)
        cls.tokens = list(range(7, 107))
        cls.chain = kvedge.chunk_ids(cls.tokens, MODEL, 32)
        for l in range(1, 4):
            k, v = kv(l, 100)
            cls.node.put_layer(MODEL, cls.chain, l, k, v, scheme="lossless", dtype="fp32")
        cls.proxy = kvedge.Client(cls.proxy_ep, deadline_ms=3000)
        kvtest.wait_proxy_knows(cls.proxy, cls.chain, model=MODEL, layers=[1, 2, 3])

    @classmethod
    def tearDownClass(cls):
        cls.proxy.close()
        cls.node.close()
        cls.d.close()


class ClientTest(Cluster):
    def test_connect_node_info(self):
        self.assertEqual(self.node.node["role"], "cloud")
        self.assertEqual(self.node.node["name"], "cloud")
        self.assertEqual(self.proxy.node["role"], "proxy")
        self.assertGreater(self.node.node["max_chunks"], 0)
        self.assertRegex(kvedge.version(), r"^\d+\.\d+\.\d+$")

    def test_ping_and_link(self):
        rtt, _ = self.node.ping()
        self.assertGreater(rtt, 0)
        rtt, bw = self.node.ping(256 << 10)
        self.assertGreater(bw, 0)
        self.assertIn("rtt_us", self.node.link())

    def test_models(self):
        self.assertEqual(self.node.get_model("py-test"), MODEL)
        other = kvedge.Model("py-other", 2, 1, 8, "fp16")
        self.node.put_model(other)
        self.assertEqual(self.node.get_model("py-other"), other)
        with self.assertRaises(kvedge.NoModel) as cm:
            self.node.get_model("no-such-model")
        self.assertEqual(cm.exception.code, kvedge.errors.ENOMODEL)
        self.assertEqual(cm.exception.name, "KVEDGE_ENOMODEL")
        self.assertEqual(kvedge.Model.builtin("opt-125m").layers, 12)

    def test_chunk_ids(self):
        c = self.chain
        self.assertEqual(len(c), 4)
        self.assertEqual(c.counts, [32, 32, 32, 4])
        self.assertTrue(all(isinstance(i, bytes) and len(i) == 32 for i in c))
        # Same tokens, same ids; another model or chunking, other ids; numpy and torch input.
        self.assertEqual(kvedge.chunk_ids(np.array(self.tokens), MODEL, 32), c)
        self.assertEqual(kvedge.chunk_ids(torch.tensor(self.tokens), "py-test", 32), c)
        self.assertNotEqual(kvedge.chunk_ids(self.tokens, "py-x", 32)[0], c[0])
        self.assertEqual(kvedge.chunk_ids(self.tokens[:64], MODEL, 32), c[:2])

    def test_put_get_lookup_list_stat(self):
        k, v = kv(1, 100)
        K, V = self.node.get_layer(self.chain, 1, decode=True)
        self.assertTrue(np.array_equal(K, k) and np.array_equal(V, v))
        recs = self.node.get_layer(self.chain, 1)
        self.assertEqual(len(recs), 8)
        self.assertTrue(all(r["status"] == 0 and r["block"] for r in recs))
        self.assertEqual(self.node.lookup(self.chain), 0)  # layer 0 missing: not whole
        ids = {e["id"] for e in self.node.list()}
        self.assertTrue(set(self.chain.hex()) <= ids)
        self.assertEqual(len(self.node.list(limit=2)), 2)
        st = self.node.stat()
        self.assertGreaterEqual(st["blocks"], 24)
        # A whole context: int8 from torch fp32, then fp16 numpy input, lookup hits all.
        chain = kvedge.chunk_ids(list(range(50)), MODEL, 16)
        for l in range(MODEL.layers):
            tk = torch.randn(2, 50, 16)
            r = self.node.put_layer(MODEL, chain, l, tk, tk.numpy().astype(np.float16))
            self.assertEqual(r["blocks"], 8)
        self.assertEqual(self.node.lookup(chain), 4)
        K, V = self.node.get_layer(chain, 3, decode=True)
        self.assertLess(np.abs(K - tk.numpy()).max(), 0.05)
        self.assertEqual(len(self.node.pin(chain)), 4)
        self.assertEqual(len(self.node.pin(chain, False)), 4)
        # put_blocks: the blocks of another layer under a new chain, as is.
        chain2 = kvedge.chunk_ids(list(range(1000, 1050)), MODEL, 16)
        blocks = self.node.get_layer(chain, 0)
        st = self.node.put_blocks(chain2, [(r["chunk"], 0, r["head"], r["block"])
                                           for r in blocks])
        self.assertEqual(st, [0] * len(blocks))
        self.assertEqual([r["block"] for r in self.node.get_layer(chain2, 0)],
                         [r["block"] for r in blocks])
        # One head per data message (no_pack) or packed (the default): the same records.
        with kvedge.Client(self.node_ep, deadline_ms=3000, no_pack=True) as unpacked:
            self.assertEqual(unpacked.get_layer(chain, 0), blocks)
        # A corrupt block is refused by the node.
        bad = bytearray(blocks[0]["block"])
        bad[-1] ^= 0xFF
        with self.assertRaises(kvedge.Error) as cm:
            self.node.put_blocks(chain2, [(0, 1, 0, bytes(bad))])
        self.assertIsInstance(cm.exception, kvedge.Corrupt)

    def test_fetch_plan_and_records(self):
        r = kvedge.fetch(self.proxy, self.chain, model=MODEL, blocks=True)
        self.assertEqual(r["status"], 0)
        plan = r["plan"]
        self.assertEqual(len(plan["layers"]), 4)
        self.assertEqual(plan["sources"][0]["name"], "cloud")
        self.assertEqual(plan["sources"][0]["kind"], "cloud")
        self.assertEqual([x["layer"] for x in r["layers"]], [0, 1, 2, 3])
        for x in r["layers"][1:]:
            self.assertEqual((x["status"], x["source_name"], x["blocks"]), (0, "cloud", 8))
        # nobody has layer 0: a miss
        self.assertEqual(r["layers"][0]["status"], kvedge.errors.ENOTFOUND)
        self.assertEqual(plan["layers"][0]["reason"], "recompute:no-source")
        # no decoder times: recomputation was not allowed, so it has no price
        self.assertIsNone(plan["recompute_all_us"])
        self.assertIsInstance(plan["total_us"], float)
        self.assertEqual(len([b for b in r["blocks"] if b["status"] == 0]), 24)
        # fetch on a store node is refused by the node
        with self.assertRaises(kvedge.Error):
            self.node.fetch(self.chain, model=MODEL)

    def test_fetch_precisions(self):
        # The cache optimizer: the node holds lossless and derives what is asked; without a
        # budget the proxy picks the fastest accepted precision, and the blocks come at it.
        r = self.proxy.fetch(self.chain, model=MODEL, blocks=True, accept=["int8", "int4-g32"])
        self.assertEqual(r["status"], 0)
        for x, p in zip(r["layers"][1:], r["plan"]["layers"][1:]):
            self.assertEqual(x["status"], 0)
            self.assertIn(p["prec"], ("int8", "int4-g32"))
            self.assertEqual(x["prec"], p["prec"])
        self.assertIsNone(r["plan"]["layers"][0]["prec"])  # nobody has layer 0
        # lossless only: as stored, never quantized
        r = self.proxy.fetch(self.chain, model=MODEL, accept="lossless")
        self.assertEqual([x["prec"] for x in r["layers"][1:]], ["lossless"] * 3)
        for bad in ("int8,int8", "int9", "", ["int8", 8]):
            with self.assertRaises((ValueError, TypeError)):
                self.proxy.fetch(self.chain, model=MODEL, accept=bad)
        for bad in ("kl:-1", "ppl:101", "x:1", 3):
            with self.assertRaises((ValueError, TypeError)):
                self.proxy.fetch(self.chain, model=MODEL, accept="int8", budget=bad)
        with self.assertRaises(ValueError):
            self.proxy.fetch(self.chain, model=MODEL, budget="kl:1e-4")


    def test_concurrent_fetches(self):
        """FETCH callbacks take the GIL on the client's I/O thread while other threads wait in
        C or run Python: 4 threads x 25 fetches on one client, and a thread spinning in Python
        meanwhile, all finish (no deadlock) with every layer's record."""
        stop = threading.Event()
        results, errors = [], []

        def spin():
            x = 0
            while not stop.is_set():
                x += 1

        def worker():
            try:
                for _ in range(25):
                    r = self.proxy.fetch(self.chain, model=MODEL)
                    results.append([x["status"] for x in r["layers"]])
            except Exception as e:  # pragma: no cover
                errors.append(e)

        sp = threading.Thread(target=spin)
        sp.start()
        ts = [threading.Thread(target=worker) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        stop.set()
        sp.join()
        self.assertEqual(errors, [])
        self.assertEqual(results, [[kvedge.errors.ENOTFOUND, 0, 0, 0]] * 100)


class PipelineTest(Cluster):
    def check_layers(self, p, view=lambda t: t):
        self.assertIsNone(p.wait(0))  # miss: the caller computes it
        self.assertTrue(p.ready(0))  # done, as a miss
        for l in range(1, 4):
            k, v = p.wait(l)
            self.assertTrue(p.ready(l))
            ek, ev = kv(l, 100)
            self.assertTrue(np.array_equal(view(k), ek), f"layer {l} K")
            self.assertTrue(np.array_equal(view(v), ev), f"layer {l} V")

    def test_proxy_numpy(self):
        with kvedge.Pipeline(self.proxy, MODEL, self.chain) as p:
            self.check_layers(p)
            plan = p.plan()
            self.assertEqual(plan["sources"][0]["name"], "cloud")
            st = p.stats()
            self.assertTrue(st["via_proxy"])
            self.assertEqual((st["resident"], st["misses"]), (3, 1))
            self.assertEqual(st["layer"][1]["source"], "cloud")

    def test_node_torch(self):
        with kvedge.Pipeline(self.node, MODEL, self.chain, tensors="torch") as p:
            self.check_layers(p, view=lambda t: t.numpy())
            self.assertIsNone(p.plan())  # a store node has no plan
            self.assertFalse(p.stats()["via_proxy"])

    def test_first_layer_and_fp16_and_paged(self):
        with kvedge.Pipeline(self.proxy, MODEL, self.chain, first_layer=1, layers=2,
                             dtype="fp16") as p:
            k, _ = p.wait(2)
            self.assertEqual(k.dtype, np.float16)
            self.assertTrue(np.array_equal(k, kv(2, 100)[0].astype(np.float16)))
            with self.assertRaises(ValueError):
                p.wait(0)
            with self.assertRaises(ValueError):
                p.ready(3)
            with self.assertRaises(TypeError):
                p.ready(True)
        with kvedge.Pipeline(self.proxy, MODEL, self.chain, layout="paged", page_size=7,
                             tensors="torch", dtype="bf16") as p:
            k, v = p.wait(1)
            self.assertEqual(tuple(k.shape), (15, 7, 2, 16))  # pages, page size, heads, dim
            got = k.float().reshape(-1, 2, 16)[:100].permute(1, 0, 2).numpy()
            want = torch.from_numpy(kv(1, 100)[0]).bfloat16().float().numpy()
            self.assertTrue(np.array_equal(got, want))

    def test_zero_copy(self):
        p = kvedge.Pipeline(self.proxy, MODEL, self.chain, tensors="numpy")
        k, v = p.wait(1)
        base, nbytes = p.buffer.ctypes.data, p.buffer.nbytes
        for t in (k, v):
            self.assertTrue(base <= t.ctypes.data and t.ctypes.data + t.nbytes <= base + nbytes)
            self.assertTrue(np.shares_memory(t, p.buffer))
        del t
        tk = torch.from_numpy(k)  # torch view of the same memory
        self.assertEqual(tk.data_ptr(), k.ctypes.data)
        # The buffer outlives the pipeline while a view does, and goes with the last one.
        wr = weakref.ref(p.buffer)
        p.close()
        del p
        gc.collect()
        self.assertIsNotNone(wr())
        self.assertTrue(np.array_equal(tk.numpy(), kv(1, 100)[0]))
        del k, v
        gc.collect()
        self.assertIsNotNone(wr())  # tk still holds it
        del tk
        gc.collect()
        self.assertIsNone(wr())
        # torch buffer: the tensor's data pointer lies in the pipeline's buffer.
        p = kvedge.Pipeline(self.proxy, MODEL, self.chain, tensors="torch")
        k, v = p.wait(1)
        b = p.buffer
        lo, hi = b.data_ptr(), b.data_ptr() + b.numel() * b.element_size()
        self.assertTrue(lo <= k.data_ptr() < hi and lo <= v.data_ptr() < hi)
        wr = weakref.ref(b)
        del b, p
        gc.collect()
        self.assertIsNotNone(wr())
        self.assertTrue(np.array_equal(k.numpy(), kv(1, 100)[0]))
        del k, v
        gc.collect()
        self.assertIsNone(wr())

    def test_caller_destinations(self):
        k = torch.zeros(3, 2, 120, 16)
        v = np.zeros((3, 2, 120, 16), np.float32)
        v_list = [v[i] for i in range(3)]
        with kvedge.Pipeline(self.node, MODEL, self.chain, first_layer=1, layers=3, k=k,
                             v=v_list,
                             token_offset=10) as p:
            gk, gv = p.wait(3)
            self.assertEqual(gk.data_ptr(), k[2].data_ptr())
            self.assertTrue(np.array_equal(k[2, :, 10:110].numpy(), kv(3, 100)[0]))
            self.assertTrue(np.array_equal(v[2, :, 10:110], kv(3, 100)[1]))
            self.assertTrue((v[2, :, :10] == 0).all())
        # refused, never copied: wrong dtype, non-contiguous, too small, wrong heads
        for bad, exc in [(torch.zeros(3, 2, 120, 16, dtype=torch.float64), TypeError),
                         (torch.zeros(3, 2, 16, 120).transpose(2, 3), ValueError),
                         (np.zeros((3, 2, 50, 16), np.float32), ValueError),
                         (np.zeros((3, 3, 120, 16), np.float32), ValueError),
                         (np.zeros((3, 2, 120, 16), np.int32), TypeError),
                         ("tensor", TypeError)]:
            with self.subTest(bad=type(bad).__name__), self.assertRaises(exc):
                kvedge.Pipeline(self.node, MODEL, self.chain, first_layer=1, layers=3, k=bad, v=v)

    def test_many_waiters_and_gil(self):
        # Several threads wait on one pipeline; Python keeps running while C waits.
        with kvedge.Pipeline(self.proxy, MODEL, self.chain, ring_slots=1) as p:
            got = {}
            ts = [threading.Thread(target=lambda l=l: got.__setitem__(l, p.wait(l)))
                  for l in (3, 2, 1, 0)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(10)
            self.assertIsNone(got[0])
            self.assertTrue(all(got[l] is not None for l in range(1, 4)))

    def test_close_order(self):
        c = kvedge.Client(self.proxy_ep)
        p = kvedge.Pipeline(c, MODEL, self.chain)
        c.close()  # closes its pipelines first
        self.assertTrue(p.closed)
        with self.assertRaises(kvedge.UseAfterClose):
            p.wait(0)
        with self.assertRaises(kvedge.Closed):
            c.ping()
        with self.assertRaises(kvedge.UseAfterClose):
            kvedge.Pipeline(c, MODEL, self.chain)
        c.close()  # idempotent
        # garbage collection closes a client and its pipeline
        c = kvedge.Client(self.proxy_ep)
        p = kvedge.Pipeline(c, MODEL, self.chain)
        p.wait(1)
        c.p = p  # a cycle
        p.c = c
        del c, p
        gc.collect()

    def test_gc_closes(self):
        """A client and a pipeline dropped without close() are closed by garbage collection:
        the client's I/O thread and the pipeline's loader thread go away."""
        def threads():
            return len(os.listdir("/proc/self/task"))
        gc.collect()
        base = threads()
        for _ in range(3):
            c = kvedge.Client(self.proxy_ep)
            p = kvedge.Pipeline(c, MODEL, self.chain)
            p.wait(1)
            self.assertGreater(threads(), base)
            del c, p
            gc.collect()
        for _ in range(50):  # a thread's task entry goes once it has been joined
            if threads() == base:
                break
            time.sleep(0.02)
        self.assertEqual(threads(), base)

    def test_errors(self):
        with self.assertRaises(kvedge.NoSpace) as cm:
            with kvedge.Pipeline(self.node, MODEL, self.chain, slot_bytes=1024) as p:
                p.wait(1)
        self.assertEqual((cm.exception.code, cm.exception.name),
                         (kvedge.errors.ENOSPACE, "KVEDGE_ENOSPACE"))
        self.assertIsInstance(cm.exception, kvedge.Error)
        unknown = kvedge.Model("py-unknown", 2, 2, 16)
        ch = kvedge.chunk_ids(self.tokens, unknown, 32)
        with kvedge.Pipeline(self.proxy, unknown, ch) as p:
            with self.assertRaises(kvedge.NoModel):
                p.wait(0)
        # every code has its class, with its name and text
        for code, cls in kvedge.CODES.items():
            e = cls(code, "x")
            self.assertEqual(e.code, code)
            self.assertTrue(e.name.startswith("KVEDGE_E"))
            self.assertIsInstance(e, kvedge.Error)
        self.assertIsInstance(kvedge.Timeout(kvedge.errors.ETIMEDOUT), TimeoutError)


class ErrorDetailTest(Cluster):
    """What the library says beyond the code (kvedge.Error.detail, also in str(e)): the form of
    an endpoint, and which daemon answers a request sent to the other kind."""

    def test_endpoint_form(self):
        with self.assertRaises(kvedge.InvalidArgument) as cm:
            kvedge.Client("127.0.0.1:17400")
        e = cm.exception
        self.assertIn("tcp://HOST:PORT", e.detail)
        self.assertIn("ipc://PATH", e.detail)
        self.assertIn("tcp://127.0.0.1:17400", str(e))

    def test_request_to_the_wrong_daemon(self):
        with self.assertRaises(kvedge.InvalidArgument) as cm:
            self.proxy.stat()
        self.assertIn("is an edge proxy", cm.exception.detail)
        self.assertIn("STAT is answered by store nodes", str(cm.exception))
        with self.assertRaises(kvedge.InvalidArgument) as cm:
            self.proxy.get_model(MODEL.id)
        self.assertIn("MODEL is answered by store nodes", cm.exception.detail)
        with self.assertRaises(kvedge.ProtocolError) as cm:
            self.node.fetch(self.chain, model=MODEL, layers=2)
        self.assertIn("is a cloud store node", cm.exception.detail)
        self.assertIn("FETCH is answered by edge proxies", str(cm.exception))
        self.node.stat()  # the same client, a request it answers: no error

    def test_no_detail_when_the_code_says_it_all(self):
        e = kvedge.Timeout(kvedge.errors.ETIMEDOUT, "x")
        self.assertEqual(e.detail, "")
        self.assertEqual(str(e), "x: deadline passed (KVEDGE_ETIMEDOUT)")


class CurveTest(unittest.TestCase):
    """A node with CURVE (the default without --insecure): a client with the node's public key
    and an allowlisted certificate connects; a plaintext client is refused silently, which
    comes back as kvedge.Timeout within the deadline; a missing certificate is kvedge.IOFailure
    (KVEDGE_EIO)."""

    def test_curve(self):
        d = kvtest.Daemons()
        try:
            os.makedirs(os.path.join(d.dir, "node", "clients"))
            alice = os.path.join(d.dir, "alice")
            subprocess.run([kvtest.BIN, "keygen", alice, "--tenant", "acme"], check=True,
                           capture_output=True)
            os.link(alice, os.path.join(d.dir, "node", "clients", "alice"))
            ep = d.start("node", "--data", os.path.join(d.dir, "node"), "store", "--bind",
                         d.ep("node"))[0]
            key = os.path.join(d.dir, "node", "node.cert")
            with kvedge.Client(ep, server_key=key, cert=alice + "_secret",
                               deadline_ms=2000) as c:
                c.ping()
                self.assertEqual(c.list(), [])
            with self.assertRaises(kvedge.Timeout):
                kvedge.Client(ep, deadline_ms=500)
            with self.assertRaises(kvedge.IOFailure) as cm:
                kvedge.Client(ep, server_key=key, cert=alice + "_missing", deadline_ms=500)
            self.assertIn(alice + "_missing", str(cm.exception))  # the file is named
            with self.assertRaises(kvedge.IOFailure) as cm:
                kvedge.Client(ep, server_key=key + ".gone", cert=alice + "_secret")
            self.assertIn(key + ".gone: no such file", cm.exception.detail)
            with self.assertRaises(ValueError):
                kvedge.Client(ep, server_key=key)  # a key without a certificate
        finally:
            d.close()


class DeadlineTest(unittest.TestCase):
    """A node that stops answering (SIGSTOP): every call raises kvedge.Timeout within its
    deadline (plus scheduling slack), and Python threads run meanwhile (the GIL is
    released)."""

    SLACK_S = 1.5

    @classmethod
    def setUpClass(cls):
        cls.d = kvtest.Daemons()
        cls.d.master()
        cls.node_ep = cls.d.store("cloud", "cloud")
        cls.proxy_ep = cls.d.proxy([f"cloud cloud {cls.node_ep}"])
        cls.chain = kvedge.chunk_ids(list(range(40)), MODEL, 16)
        with kvedge.Client(cls.node_ep) as c:
            for l in range(4):
                c.put_layer(MODEL, cls.chain, l, *kv(l, 40))
        with kvedge.Client(cls.proxy_ep) as px:
            kvtest.wait_proxy_knows(px, cls.chain, model=MODEL, layers=range(4))

    @classmethod
    def tearDownClass(cls):
        cls.d.close()

    def timed(self, fn, deadline_s):
        ticks = [0]
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                ticks[0] += 1
                time.sleep(0.01)

        t = threading.Thread(target=spin)
        t.start()
        t0 = time.monotonic()
        try:
            with self.assertRaises(kvedge.Timeout) as cm:
                fn()
        finally:
            stop.set()
            t.join()
        took = time.monotonic() - t0
        self.assertLess(took, deadline_s + self.SLACK_S)
        self.assertGreater(ticks[0], 10 * deadline_s, "the GIL was held while C waited")
        self.assertEqual(cm.exception.code, kvedge.errors.ETIMEDOUT)
        return took

    def test_stopped_node_and_proxy(self):
        c = kvedge.Client(self.node_ep, deadline_ms=800)
        px = kvedge.Client(self.proxy_ep, deadline_ms=800)
        self.d.signal("cloud", signal.SIGSTOP)
        try:
            self.timed(c.ping, 0.8)
            self.timed(lambda: c.lookup(self.chain), 0.8)
            self.timed(c.stat, 0.8)

            def pipe():
                with kvedge.Pipeline(c, MODEL, self.chain, deadline_ms=1000) as p:
                    p.wait(0)
            self.timed(pipe, 1.0)
            # The proxy answers, but its only source is stopped: past the FETCH deadline the
            # layers come back as misses (miss:deadline) or the stream times out.
            t0 = time.monotonic()
            try:
                r = px.fetch(self.chain, model=MODEL, deadline_ms=1000)
                self.assertTrue(all(x["status"] != 0 for x in r["layers"]))
            except kvedge.Timeout:
                pass
            self.assertLess(time.monotonic() - t0, 1.0 + self.SLACK_S)
        finally:
            self.d.signal("cloud", signal.SIGCONT)
        c.ping()  # the node answers again
        c.close()
        px.close()
        # Nobody listening at all: connect times out within its deadline.
        t0 = time.monotonic()
        with self.assertRaises(kvedge.Timeout):
            kvedge.Client(f"ipc://{self.d.dir}/nobody.sock", deadline_ms=500)
        self.assertLess(time.monotonic() - t0, 0.5 + self.SLACK_S)


if __name__ == "__main__":
    unittest.main()
