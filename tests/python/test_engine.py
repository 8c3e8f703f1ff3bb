#!/usr/bin/env python3
"""The engine-side loader (kvedge.KVLoader) and the PyTorch OPT engine (kvedge.opt) against a
real master, cloud node and edge proxy: for the fixture (tests/fixtures/opt_tiny.safetensors)
and the trained models (models/kjv/cloud, models/kjv/edge), the engine's greedy tokens equal
the C decoder's (`kvedge -H PROXY decode`) over the same stored context, whether the cloud
prefill was the engine's (save_layer) or C's (`kvedge prefill`), with every layer fetched or
some computed locally; and its logits match the PyTorch reference of the models' fixtures.
The example script runs against plaintext daemons and against CURVE ones with its key flags."""
import json
import os
import subprocess
import unittest

import kvtest

kvtest.need_numpy_torch()
import numpy as np  # noqa: E402
import torch  # noqa: E402

import kvedge  # noqa: E402
from kvedge.engine import KVLoader  # noqa: E402
from kvedge.opt import OPT, load_safetensors  # noqa: E402

# Stated tolerances (max |logit difference|), as docs/decoder.md states the C decoder's.
TOL_REFERENCE = 1e-4  # engine vs PyTorch reference logits (fixtures), fp32
TOL_LOSSLESS = 1e-4   # context K/V through kvedge lossless fp32 vs local recomputation
TOL_INT8 = 2e-2       # ... through int8 blocks

MODELS = {
    "tiny": (os.path.join(kvtest.FIXTURES, "opt_tiny.safetensors"),
             os.path.join(kvtest.FIXTURES, "opt_tiny_expected.safetensors")),
    "kjv-cloud": (os.path.join(kvtest.MODELS, "kjv", "cloud", "model.safetensors"),
                  os.path.join(kvtest.MODELS, "kjv", "cloud", "expected.safetensors")),
    "kjv-edge": (os.path.join(kvtest.MODELS, "kjv", "edge", "model.safetensors"),
                 os.path.join(kvtest.MODELS, "kjv", "edge", "expected.safetensors")),
}
CHUNK = 64
MAX_NEW = 12
PENALTY = 1.3


class SkipLayers(KVLoader):
    """A cloud loader that does not store some layers: the edge must compute them."""

    def __init__(self, *a, skip=(), **kw):
        super().__init__(*a, **kw)
        self.skip = set(skip)

    def save_layer(self, layer, k, v, handle=None):
        if layer not in self.skip:
            return super().save_layer(layer, k, v, handle=handle)
        return None


def kjv_ids():
    out = subprocess.run([kvtest.BIN, "tokenize", "--tokenizer",
                          os.path.join(kvtest.MODELS, "kjv"), "--file",
                          os.path.join(kvtest.MODELS, "kjv", "heldout.txt")],
                         check=True, capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


class EngineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d, cls.node_ep, cls.proxy_ep = kvtest.cluster()
        cls.node = kvedge.Client(cls.node_ep, deadline_ms=10000)
        cls.proxy = kvedge.Client(cls.proxy_ep, deadline_ms=10000)
        ids = kjv_ids()
        g = np.random.default_rng(7)
        cls.texts = {"tiny": g.integers(4, 256, 120).tolist(), "kjv": ids[1000:1300]}

    @classmethod
    def tearDownClass(cls):
        cls.proxy.close()
        cls.node.close()
        cls.d.close()

    def tokens_for(self, name):
        t = self.texts["tiny" if name == "tiny" else "kjv"]
        n = 100 if name == "tiny" else 280
        return t[:n], t[n:n + 10]

    def c_decode(self, weights, model_id, ctx, prompt):
        r = subprocess.run([kvtest.BIN, "--json", "-H", self.proxy_ep, "decode", "--weights",
                            weights, "--model-id", model_id, "--chunk-tokens", str(CHUNK),
                            "--context-ids", ",".join(map(str, ctx)), "--prompt-ids",
                            ",".join(map(str, prompt)), "--max-new", str(MAX_NEW),
                            "--repetition-penalty", str(PENALTY)],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)["tokens"]["kvedge"]

    def py_decode(self, eng, model, ctx, prompt, kv_dtype="fp32"):
        with KVLoader(self.proxy, model, role="edge", chunk_tokens=CHUNK,
                      kv_dtype=kv_dtype) as edge:
            return eng.decode(ctx, prompt, MAX_NEW, loader=edge, repetition_penalty=PENALTY)

    def ready(self, model, ctx, skip=(), chunk=CHUNK):
        kvtest.wait_proxy_knows(self.proxy, kvedge.chunk_ids(ctx, model, chunk), model=model,
                                layers=[l for l in range(model.layers) if l not in skip])

    def run_model(self, name):
        weights, expected = MODELS[name]
        eng = OPT(weights)
        ex, _ = load_safetensors(expected)
        # The engine is the PyTorch reference's model.
        ref_ids = ex["prefill.tokens"].long().tolist()
        lg = eng.prefill(ref_ids, all_logits=True)
        d = (lg - ex["prefill.logits"]).abs().max().item()
        print(f"{name}: prefill vs PyTorch reference max |diff| {d:.2e}")
        self.assertLessEqual(d, TOL_REFERENCE)
        toks, _, _ = eng.decode(ref_ids[:24], ref_ids[24:], 8)
        self.assertEqual(toks, ex["greedy.tokens"].long().tolist())

        ctx, prompt = self.tokens_for(name)
        local, local_logits, how = eng.decode(ctx, prompt, MAX_NEW,
                                              repetition_penalty=PENALTY)
        self.assertEqual(set(how), {"computed"})

        # 1. the engine's cloud prefill (int8), every layer fetched
        m = eng.store_model(f"py-{name}")
        with KVLoader(self.node, m, role="cloud", chunk_tokens=CHUNK) as cloud:
            eng.prefill(ctx, loader=cloud)
        self.ready(m, ctx)
        py, py_logits, how = self.py_decode(eng, m, ctx, prompt)
        c = self.c_decode(weights, m.id, ctx, prompt)
        print(f"{name}: int8, all fetched: engine {py}\n{' ' * len(name)}  C decoder {c}")
        self.assertEqual(how, ["fetched"] * eng.n_layers)
        self.assertEqual(py, c)
        d = (py_logits - local_logits).abs().max().item()
        print(f"{name}: int8 context vs local recomputation max |logit diff| {d:.2e}")
        self.assertLessEqual(d, TOL_INT8)

        # 2. lossless fp32, layer 0 not stored: computed by both decoders
        m = eng.store_model(f"py-{name}-partial")
        with SkipLayers(self.node, m, role="cloud", chunk_tokens=CHUNK, scheme="lossless",
                        dtype="fp32", skip={0}) as cloud:
            eng.prefill(ctx, loader=cloud)
        self.ready(m, ctx, skip={0})
        py, py_logits, how = self.py_decode(eng, m, ctx, prompt)
        c = self.c_decode(weights, m.id, ctx, prompt)
        print(f"{name}: lossless, layer 0 computed: engine {py}, C {c}, layers {how}")
        self.assertEqual(how[0], "computed")
        self.assertEqual(how[1:], ["fetched"] * (eng.n_layers - 1))
        self.assertEqual(py, c)
        self.assertEqual(py, local)
        d = (py_logits - local_logits).abs().max().item()
        print(f"{name}: lossless context vs local recomputation max |logit diff| {d:.2e}")
        self.assertLessEqual(d, TOL_LOSSLESS)

        # 3. C's cloud prefill (kvedge prefill), the engine decodes; fp16 K/V handed out
        mid = f"c-{name}"
        r = subprocess.run([kvtest.BIN, "-H", self.node_ep, "prefill", "--weights", weights,
                            "--model-id", mid, "--chunk-tokens", str(CHUNK), "--context-ids",
                            ",".join(map(str, ctx)), "--scheme", "int8"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        m = eng.store_model(mid)
        self.ready(m, ctx)
        py, _, how = self.py_decode(eng, m, ctx, prompt)
        py16, _, _ = self.py_decode(eng, m, ctx, prompt, kv_dtype="fp16")
        c = self.c_decode(weights, mid, ctx, prompt)
        print(f"{name}: C prefill: engine {py}, C {c}")
        self.assertEqual(py, c)
        self.assertEqual(len(py16), MAX_NEW)

        # 4. the engine's time estimates go to the proxy (`--plan-recompute`): every layer the
        # plan leaves to the edge is computed, every other one fetched.
        with KVLoader(self.proxy, m, role="edge", chunk_tokens=CHUNK) as edge:
            h = edge.start_load(ctx, *eng.estimate(len(ctx), len(prompt)))
            toks, _, how = eng.decode(ctx, prompt, MAX_NEW, loader=edge, handle=h,
                                      repetition_penalty=PENALTY)
            plan = h.plan
        left = ["computed" if x["source"] < 0 else "fetched" for x in plan["layers"]]
        print(f"{name}: plan with the engine's estimates: "
              f"{[x['reason'] for x in plan['layers']]}")
        self.assertEqual(how, left)
        self.assertEqual(len(toks), MAX_NEW)

    def test_fixture(self):
        self.run_model("tiny")

    def test_kjv_cloud(self):
        self.run_model("kjv-cloud")

    def test_kjv_edge(self):
        self.run_model("kjv-edge")

    def test_example_script(self):
        """clients/python/examples/opt_engine.py (docs/python.md) runs and agrees with C."""
        r = subprocess.run([
            "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3",
            os.path.join(kvtest.SRC, "clients", "python", "examples", "opt_engine.py"),
            "--node", self.node_ep, "--proxy", self.proxy_ep, "--weights",
            MODELS["kjv-cloud"][0], "--model-id", "ex-kjv-cloud", "--tokenizer",
            os.path.join(kvtest.MODELS, "kjv"), "--context-file",
            os.path.join(kvtest.MODELS, "kjv", "heldout.txt"), "--tokens", "300",
            "--prompt", "And Noah said unto his sons,", "--max-new", "8", "--kvedge",
            kvtest.BIN], capture_output=True, text=True, timeout=300,
            # The example imports the package as installed: from the tree, through PYTHONPATH.
            env=dict(os.environ, PYTHONPATH=os.path.join(kvtest.SRC, "clients", "python")))
        print(r.stdout)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("same tokens: True", r.stdout)

    def test_loader_api(self):
        m = kvedge.Model("py-loader", 2, 2, 8)
        ctx = list(range(10, 60))
        k = [torch.randn(2, 50, 8) for _ in range(2)]
        with KVLoader(self.node_ep, m, role="cloud", chunk_tokens=16, scheme="lossless",
                      dtype="fp32") as cloud:
            h = cloud.start_load(ctx)
            self.assertIsNone(cloud.wait_for_layer(h, 0))  # cloud: computes everything
            for l in range(2):
                cloud.save_layer(l, k[l], -k[l])
            self.assertEqual(cloud.finish(), {0: "saved", 1: "saved"})
            with self.assertRaises(ValueError):
                cloud.save_layer(0, k[0], k[0])  # no context any more
        self.ready(m, ctx, chunk=16)
        with KVLoader(self.proxy, m, role="edge", chunk_tokens=16) as edge:
            h = edge.start_load(ctx)
            for l in range(2):
                kk, vv = edge.wait_for_layer(h, l)
                self.assertIsInstance(kk, torch.Tensor)
                self.assertTrue(torch.equal(kk, k[l]) and torch.equal(vv, -k[l]))
            self.assertEqual(h.plan["layers"][0]["source_name"], "cloud")
            with self.assertRaises(ValueError):
                edge.save_layer(0, k[0], k[0])  # edge role saves nothing
            self.assertEqual(edge.finish(h), {0: "fetched", 1: "fetched"})
            # an unknown context: every layer is the engine's to compute
            h = edge.start_load(list(range(500, 540)))
            self.assertIsNone(edge.wait_for_layer(h, 0))
            self.assertIsNone(edge.wait_for_layer(h, 1))
            edge.finish(h)
        with self.assertRaises(kvedge.UseAfterClose):
            edge.start_load(ctx)


class ExampleCurveTest(unittest.TestCase):
    """The example against CURVE daemons (a node and a proxy without --insecure, the client's
    and the proxy's certificates in tenant acme, allowlisted): with --server-key, --proxy-key
    and --cert it runs both roles and agrees with the C decoder; without them the node does
    not let it in."""

    def setUp(self):
        self.d = kvtest.Daemons()
        try:
            self.start()
        except Exception:
            self.d.close()
            raise

    def tearDown(self):
        self.d.close()

    def start(self):
        d = self.d
        node_dir, clients = (os.path.join(d.dir, x) for x in ("node", "proxy-clients"))
        os.makedirs(os.path.join(node_dir, "clients"))
        os.makedirs(clients)
        self.alice, self.proxy_cert = (os.path.join(d.dir, x) for x in ("alice", "proxy.cert"))
        for cert in (self.alice, self.proxy_cert):
            subprocess.run([kvtest.BIN, "keygen", cert, "--tenant", "acme"], check=True,
                           capture_output=True)
            os.link(cert, os.path.join(node_dir, "clients", os.path.basename(cert)))
        os.link(self.alice, os.path.join(clients, "alice"))
        d.master()
        master = ["--master", d.ep("master"), "--master-pub", d.ep("master-pub")]
        self.node_ep = d.start("node", "--data", node_dir, "store", "--role", "cloud", "--bind",
                               d.ep("node"), "--name", "cloud", "--node-id", "cloud",
                               *master)[0]
        self.node_key = os.path.join(node_dir, "node.cert")
        self.proxy_ep = d.start("proxy", "proxy", "--bind", d.ep("proxy"), "--cert",
                                self.proxy_cert, "--clients", clients, *master)[0]

    def run_example(self, *keys):
        return subprocess.run([
            "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3",
            os.path.join(kvtest.SRC, "clients", "python", "examples", "opt_engine.py"),
            "--node", self.node_ep, "--proxy", self.proxy_ep, "--weights",
            MODELS["kjv-cloud"][0], "--model-id", "ex-kjv-cloud", "--tokenizer",
            os.path.join(kvtest.MODELS, "kjv"), "--context-file",
            os.path.join(kvtest.MODELS, "kjv", "heldout.txt"), "--tokens", "300",
            "--prompt", "And Noah said unto his sons,", "--max-new", "8", "--kvedge",
            kvtest.BIN, *keys], capture_output=True, text=True, timeout=300,
            env=dict(os.environ, PYTHONPATH=os.path.join(kvtest.SRC, "clients", "python")))

    def test_example_curve(self):
        r = self.run_example("--server-key", self.node_key, "--proxy-key", self.proxy_cert,
                             "--cert", self.alice + "_secret")
        print(r.stdout)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("same tokens: True", r.stdout)
        self.assertNotIn("computed", r.stdout)  # every layer came through the CURVE proxy
        r = self.run_example()  # plaintext: the CURVE node never answers
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("kvedge.Timeout", r.stderr)


if __name__ == "__main__":
    unittest.main()
