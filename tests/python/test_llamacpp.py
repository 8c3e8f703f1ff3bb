#!/usr/bin/env python3
"""kvedge.llamacpp (the llama.cpp bridge from Python, over libkvedge_llamacpp.so) against the
fixture's llama.cpp (@node-llama-cpp/linux-x64 3.22.1, tests/decoder/fetch_llamacpp.sh) and real
daemons (a master, a cloud store node, an edge proxy): the project's trained pair
(models/kjv/llama, converted to GGUF by tests/decoder/tiny_llama.py) on the held-out ids.
 - export through Python (llama.cpp prefills, the bridge puts the blocks to the node), import
   through the proxy into a fresh engine, generate: the greedy tokens of llama.cpp recomputing
   context + prompt itself (F32 cache with lossless fp32 blocks, F16 with fp16);
 - two sequences in one engine: an import into one leaves the other as it was;
 - the example (clients/python/examples/llamacpp_roles.py): cloud, then edge with --compare;
 - llama.cpp's tokenizer: the fixture's text gives its ids (BOS first), and back;
 - bad input: a missing GGUF, a file that is no GGUF, a model mismatch (the edge model over
   the cloud model's record: from the node, through the proxy, the check alone), token ids
   past the vocabulary, a context past n_ctx, a closed engine;
 - installed (a build configured with -DKVEDGE_LLAMACPP, else skipped): beside libkvedge.so,
   found through _paths.py, Unavailable naming llama.cpp's libraries until the loader finds them;
 - the mirror's struct sizes against the library's (a mismatch: Unavailable);
 - the library: not found (kvedge.llamacpp.Unavailable listing what was tried), and a libllama
   of another version (llama_version interposed with LD_PRELOAD): Unavailable with the
   bridge's message.
Builds libkvedge_llamacpp.so first (outside `all` unless -DKVEDGE_LLAMACPP). Exit 77 when the
fixture skipped (no llama.cpp in BUILD/llama/prefix)."""
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import kvtest

BUILD = os.environ.get("KVEDGE_BUILD") or os.path.join(kvtest.SRC, "build")
PREFIX = os.path.join(BUILD, "llama", "prefix")
WORK = os.path.join(BUILD, "llama", "pybridge")
CTX, PROMPT, GEN, CHUNK = 256, 16, 16, 64


def setUpModule():
    if not os.path.exists(os.path.join(PREFIX, "include", "llama.h")):
        print(f"SKIP: no llama.cpp in {PREFIX} (the fixture skipped)")
        sys.exit(77)
    r = subprocess.run(["cmake", "--build", BUILD, "--target", "kvedge_llamacpp_shared",
                        "-j2"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("building libkvedge_llamacpp.so failed:\n" + r.stdout[-4000:]
                           + r.stderr[-4000:])
    os.makedirs(WORK, exist_ok=True)
    models = os.path.join(kvtest.SRC, "models", "kjv", "llama")
    tiny = os.path.join(kvtest.SRC, "tests", "decoder", "tiny_llama.py")
    for size in ("cloud", "edge"):
        subprocess.run([sys.executable, tiny, "gguf", os.path.join(models, size),
                        os.path.join(models, "tokenizer.json"), gguf(size)], check=True)


def gguf(size):
    return os.path.join(WORK, f"kjv-{size}.gguf")


def heldout():
    with open(os.path.join(kvtest.FIXTURES, "tokenizer", "kjv_llama_heldout.json")) as f:
        return json.load(f)


class LlamaCppTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        global kvedge, llamacpp
        import kvedge
        from kvedge import llamacpp
        h = heldout()
        cls.text, cls.ids = h["text"], h["ids"]
        cls.ctx, cls.prompt = cls.ids[:CTX], cls.ids[CTX:CTX + PROMPT]
        cls.d, cls.node_ep, cls.proxy_ep = kvtest.cluster()
        cls.node = kvedge.Client(cls.node_ep, deadline_ms=20000)
        cls.proxy = kvedge.Client(cls.proxy_ep, deadline_ms=20000)

    @classmethod
    def tearDownClass(cls):
        cls.proxy.close()
        cls.node.close()
        cls.d.close()

    def engine(self, size, model_id, cache="f32", n_ctx=512):
        e = llamacpp.Engine(gguf(size), model_id, n_ctx=n_ctx, cache=cache, threads=2)
        self.addCleanup(e.close)
        return e

    def recompute(self, e):
        """llama.cpp computing context + prompt itself, then the greedy tokens."""
        e.clear()
        e.prefill(self.ctx)
        return e.generate(self.prompt, GEN)

    def round_trip(self, model_id, cache, dtype):
        cloud = self.engine("cloud", model_id, cache)
        put = cloud.export_context(self.node, self.ctx, chunk_tokens=CHUNK, scheme="lossless",
                                   dtype=dtype)
        self.assertEqual(len(put["chain"]), CTX // CHUNK)
        self.assertEqual(put["blocks"], CTX // CHUNK * 6 * 2)  # chunks x layers x KV heads
        want = self.recompute(cloud)
        kvtest.wait_proxy_knows(self.proxy, put["chain"])
        edge = self.engine("cloud", model_id, cache)
        st = edge.import_context(self.proxy, self.ctx, chunk_tokens=CHUNK)
        self.assertEqual((st["fetched"], st["missed"], st["prefilled"]), (6, 0, False))
        self.assertEqual(st["state_bytes"], put["state_bytes"])
        self.assertEqual(edge.pos(), CTX)
        got = edge.generate(self.prompt, GEN)
        print(f"{model_id}: {cache} cache, {dtype} blocks: greedy {got}, llama.cpp alone "
              f"{want}; import fetch {st['fetch_ms']:.1f} ms, convert {st['convert_ms']:.1f} "
              f"ms, load {st['load_ms']:.1f} ms")
        self.assertEqual(got, want)

    def test_round_trip_f32(self):
        self.round_trip("kjv-py-f32", "f32", "fp32")

    def test_round_trip_f16(self):
        self.round_trip("kjv-py-f16", "f16", "fp16")

    def test_two_sequences(self):
        # An engine of two sequences (a cache stream each): the context imported into sequence
        # 1 gives the same tokens there, sequence 0 keeps what it held.
        cloud = self.engine("cloud", "kjv-py-seq", "f32")
        put = cloud.export_context(self.node, self.ctx, chunk_tokens=CHUNK, scheme="lossless",
                                   dtype="fp32")
        want = self.recompute(cloud)
        kvtest.wait_proxy_knows(self.proxy, put["chain"])
        edge = llamacpp.Engine(gguf("cloud"), "kjv-py-seq", n_ctx=512, n_seq=2, cache="f32",
                               threads=2)
        self.addCleanup(edge.close)
        self.assertEqual(edge.n_ctx, 512)
        edge.prefill(self.prompt, seq=0)
        edge.import_context(self.proxy, self.ctx, chunk_tokens=CHUNK, seq=1)
        self.assertEqual((edge.pos(0), edge.pos(1)), (PROMPT, CTX))
        self.assertEqual(edge.generate(self.prompt, GEN, seq=1), want)
        self.assertEqual(edge.pos(0), PROMPT)
        with self.assertRaises(ValueError):
            edge.pos(2)

    def test_example(self):
        # clients/python/examples/llamacpp_roles.py: the cloud role over a text context, the
        # edge role over its ids and a text prompt, with --compare.
        ex = os.path.join(kvtest.SRC, "clients", "python", "examples", "llamacpp_roles.py")
        text = self.text[:400]
        text_file, ids_file = os.path.join(WORK, "example.txt"), os.path.join(WORK, "example.ids")
        with open(text_file, "w") as f:
            f.write(text)
        e = self.engine("cloud", "kjv-py-example")
        ctx = e.tokenize(text)
        with open(ids_file, "w") as f:
            f.write(" ".join(map(str, ctx)))
        common = ["--gguf", gguf("cloud"), "--model-id", "kjv-py-example", "--chunk-tokens",
                  str(CHUNK), "--cache", "f32", "--threads", "2"]
        env = dict(os.environ, PYTHONPATH=os.path.join(kvtest.SRC, "clients", "python"))
        r = subprocess.run([sys.executable, ex, "cloud", "--node", self.node_ep, "--context-file",
                            text_file, "--scheme", "lossless", "--dtype", "fp32"] + common,
                           capture_output=True, text=True, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"stored {len(ctx)} context tokens of {e.model.id}", r.stdout)
        kvtest.wait_proxy_knows(self.proxy, kvedge.chunk_ids(ctx, e.model, CHUNK))
        r = subprocess.run([sys.executable, ex, "edge", "--proxy", self.proxy_ep, "--context-ids",
                            ids_file, "--prompt", "And Noah said", "--compare"] + common,
                           capture_output=True, text=True, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("6 of 6 layers fetched", r.stdout)
        self.assertIn("tokens equal: yes", r.stdout)
        print(r.stdout)

    def test_tokenize(self):
        # llama.cpp's tokenizer over the GGUF's vocabulary gives the fixture's ids (BOS first).
        e = self.engine("edge", "kjv-py-tok", n_ctx=16)
        self.assertEqual(e.tokenize(self.text, add_special=True), self.ids)
        self.assertEqual(e.detokenize(self.ids), self.text)
        self.assertEqual(e.tokenize(""), [])
        self.assertEqual(e.tokenize("<s>", special=True), [0])
        with self.assertRaises(ValueError):
            e.detokenize([e.vocab])

    def test_engine(self):
        e = self.engine("edge", "kjv-py-shape")
        self.assertEqual(e.arch, "llama")
        self.assertEqual((e.model.layers, e.model.kv_heads, e.model.head_dim), (4, 1, 32))
        self.assertTrue(e.model.id.startswith("kjv-py-shape@rope-"), e.model.id)
        self.assertEqual(e.n_ctx, 512)
        self.assertNotEqual(e.context, 0)
        self.assertEqual(e.pos(), 0)
        e.prefill(self.ctx[:10])
        self.assertEqual(e.pos(), 10)
        e.clear()
        self.assertEqual(e.pos(), 0)
        self.assertIn("kjv-py-shape@rope-", repr(e))

    def test_missing_gguf(self):
        path = os.path.join(WORK, "no-such.gguf")
        with self.assertRaises(kvedge.IOFailure) as cm:
            llamacpp.Engine(path, "kjv")
        self.assertIn(f"{path}: No such file or directory", str(cm.exception))

    def test_not_a_gguf(self):
        path = os.path.join(WORK, "not.gguf")
        with open(path, "wb") as f:
            f.write(b"GGUF" + bytes(60))
        with self.assertRaises(kvedge.IOFailure) as cm:
            llamacpp.Engine(path, "kjv")
        self.assertIn("llama.cpp cannot load it", cm.exception.detail)

    def test_model_mismatch(self):
        cloud = self.engine("cloud", "kjv-py-mismatch")
        put = cloud.export_context(self.node, self.ctx, chunk_tokens=CHUNK)
        edge = self.engine("edge", "kjv-py-mismatch")
        self.assertEqual(edge.model.id, cloud.model.id)  # same rotary settings, same id
        edge.prefill(self.ctx[:5])
        # From the store node: the record it holds under the id is the cloud model's.
        with self.assertRaises(kvedge.ShapeError) as cm:
            edge.import_context(self.node, self.ctx, chunk_tokens=CHUNK)
        self.assertIn(f"layers: GGUF 4, model record {cloud.model.id} 6", str(cm.exception))
        # Through the proxy, with the record asked of the node; and the check alone.
        kvtest.wait_proxy_knows(self.proxy, put["chain"])
        with self.assertRaises(kvedge.ShapeError) as cm:
            edge.import_context(self.proxy, self.ctx, chunk_tokens=CHUNK,
                                model=self.node.get_model(cloud.model.id))
        self.assertIn("layers: GGUF 4", cm.exception.detail)
        with self.assertRaises(kvedge.ShapeError):
            edge.check(cloud.model)
        cloud.check(cloud.model)
        self.assertEqual(edge.pos(), 5)  # left as it was

    def test_bad_arguments(self):
        e = self.engine("edge", "kjv-py-args", n_ctx=64)
        with self.assertRaises(ValueError):
            e.prefill([0, e.vocab])
        with self.assertRaises(ValueError):
            e.generate([], 4)
        with self.assertRaises(TypeError):
            e.import_context("tcp://127.0.0.1:1", self.ctx)
        # llama.cpp rounds n_ctx up (to 256 here): the engine says what it got.
        self.assertGreaterEqual(e.n_ctx, 64)
        too_long = (self.ctx + self.prompt)[:e.n_ctx + 1]
        self.assertEqual(len(too_long), e.n_ctx + 1)
        with self.assertRaises(kvedge.TooBig) as cm:
            e.prefill(too_long)
        self.assertIn(f"do not fit n_ctx {e.n_ctx}", cm.exception.detail)
        with self.assertRaises(kvedge.TooBig):
            e.import_context(self.proxy, too_long, chunk_tokens=CHUNK)
        with self.assertRaises(ValueError):
            llamacpp.Engine(gguf("edge"), "kjv", cache="q8_0")
        e.close()
        e.close()
        with self.assertRaises(kvedge.UseAfterClose):
            e.generate([1], 1)


def run_import(env):
    code = "import kvedge.llamacpp as l; print(l.LIB_PATH)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=os.path.join(kvtest.SRC, "clients", "python"))


class LibraryTest(unittest.TestCase):
    def test_found(self):
        r = run_import(dict(os.environ))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("libkvedge_llamacpp.so", r.stdout)

    def test_layout(self):
        # The mirror's struct sizes are the library's (checked at import), and a size the
        # library does not know is 0.
        from kvedge import llamacpp
        for name, cls in llamacpp.MIRRORED.items():
            self.assertEqual(llamacpp._sizeof(name.encode()), ctypes.sizeof(cls), name)
        self.assertEqual(llamacpp._sizeof(b"kvedge_nothing_t"), 0)
        self.assertEqual(llamacpp._sizeof(None), 0)
        saved = llamacpp.MIRRORED["kvedge_llamacpp_import_stats_t"]
        try:
            llamacpp.MIRRORED["kvedge_llamacpp_import_stats_t"] = ctypes.c_int32
            with self.assertRaises(llamacpp.Unavailable) as cm:
                llamacpp._check_layout()
        finally:
            llamacpp.MIRRORED["kvedge_llamacpp_import_stats_t"] = saved
        self.assertIn("kvedge_llamacpp_import_stats_t: the library's", str(cm.exception))
        self.assertIn("this package's 4", str(cm.exception))

    def test_not_found(self):
        env = dict(os.environ, KVEDGE_LLAMACPP_LIB="/nonexistent/libkvedge_llamacpp.so.1")
        r = run_import(env)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("kvedge.llamacpp.Unavailable: kvedge.llamacpp: cannot load "
                      "libkvedge_llamacpp.so.1", r.stderr)
        self.assertIn("/nonexistent/libkvedge_llamacpp.so.1 ($KVEDGE_LLAMACPP_LIB): no such "
                      "file", r.stderr)

    def test_other_llama_version(self):
        tmp = tempfile.mkdtemp(prefix="kvedge-llv.")
        self.addCleanup(shutil.rmtree, tmp, True)
        src, so = os.path.join(tmp, "v.c"), os.path.join(tmp, "libv.so")
        with open(src, "w") as f:
            f.write('const char *llama_version(void);\n'
                    'const char *llama_version(void) { return "0.4.2-other"; }\n')
        subprocess.run(["cc", "-shared", "-fPIC", "-o", so, src], check=True)
        r = run_import(dict(os.environ, LD_PRELOAD=so))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("kvedge.llamacpp.Unavailable: kvedge.llamacpp: llama.cpp 0.4.2-other: "
                      "the bridge knows the state layout of 0.5.0-dev", r.stderr)

    def test_installed(self):
        # A build configured with -DKVEDGE_LLAMACPP installs the library beside libkvedge.so and
        # records it: found with no variable set once the loader finds libllama, Unavailable
        # saying so before.
        if not configured_with_llama():
            self.skipTest("the build is not configured with -DKVEDGE_LLAMACPP")
        tmp = tempfile.mkdtemp(prefix="kvedge-lcinst.")
        self.addCleanup(shutil.rmtree, tmp, True)
        r = subprocess.run(["cmake", "--install", BUILD, "--prefix", tmp], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(os.path.join(tmp, "lib", "libkvedge_llamacpp.so.1")))
        pkgs = [dp for dp, _, files in os.walk(tmp) if "_paths.py" in files]
        self.assertEqual(len(pkgs), 1, pkgs)
        env = {k: v for k, v in os.environ.items()
               if k not in ("KVEDGE_LIB", "KVEDGE_LLAMACPP_LIB", "LD_LIBRARY_PATH", "PYTHONPATH")}
        env["PYTHONPATH"] = os.path.dirname(pkgs[0])
        code = "import kvedge.llamacpp as l; print(l.LIB_PATH)"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, cwd=tmp)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("the bridge is there but the loader does not find llama.cpp's libraries",
                      r.stderr)
        env["LD_LIBRARY_PATH"] = os.path.join(PREFIX, "lib")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, cwd=tmp)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), os.path.join(tmp, "lib", "libkvedge_llamacpp.so.1"))


def configured_with_llama():
    with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith("KVEDGE_LLAMACPP:PATH="):
                return bool(line.strip().split("=", 1)[1])
    return False


if __name__ == "__main__":
    unittest.main()
