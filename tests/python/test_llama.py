#!/usr/bin/env python3
"""The PyTorch Llama-family engine (kvedge.llama) against the C reference decoder, on tiny
random Llama (GQA 4/2, untied head), Llama 3-scaled (rope_scaling llama3, tied head) and Qwen2
(Q/K/V biases, sharded weights) models that tests/decoder/tiny_llama.py writes at test time
(never committed; the embedding sized by a small GGUF vocabulary written here, so the models
are small). Per model: logits at every position of 64 ids equal build/tests/decoder_logits's
within TOL, the decode path (context K/V handed in for even layers, recomputed for odd ones, as
decoder_logits does it) gives C's greedy tokens, and so does a decode whose context K/V was
prefilled by the engine into a real cloud store node and fetched back through a proxy with the
loader (every layer fetched, or one left to the edge). The same on the trained pair of
models/kjv/llama. config.json and shard errors are refused by both with the same words."""
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
import warnings

import kvtest

kvtest.need_numpy_torch()
import numpy as np  # noqa: E402
import torch  # noqa: E402

import kvedge  # noqa: E402
from kvedge.engine import KVLoader  # noqa: E402
from kvedge.llama import ConfigError, Llama  # noqa: E402

sys.path.insert(0, os.path.join(kvtest.SRC, "tests", "decoder"))
import tiny_llama  # noqa: E402

BUILD = os.environ.get("KVEDGE_BUILD") or os.path.join(kvtest.SRC, "build")
DECODER_LOGITS = os.path.join(BUILD, "tests", "decoder_logits")
KINDS = ("llama", "llama3", "qwen2")
VOCAB = 1000  # tokens of the GGUF vocabulary written here: the models' vocab_size
N_IDS = 64    # ids per comparison; decoder_logits's context is the first half
GEN = 8       # greedy tokens after them
CHUNK = 16    # chunk_tokens of the stored context (2 chunks)
# Stated tolerance (max |logit difference|), as test_decoder_llamacpp holds the C decoder to
# llama.cpp: both are fp32 with the same algorithm, differing only in summation order.
TOL = 1e-4


def write_vocab_gguf(path, n):
    """A GGUF v3 file with only tokenizer.ggml.tokens (n strings): what tiny_llama.py reads
    from a vocabulary GGUF to size the embedding."""
    key = b"tokenizer.ggml.tokens"
    out = [b"GGUF", struct.pack("<IQQ", 3, 0, 1), struct.pack("<Q", len(key)), key,
           struct.pack("<IIQ", 9, 8, n)]
    for i in range(n):
        s = f"t{i}".encode()
        out += [struct.pack("<Q", len(s)), s]
    with open(path, "wb") as f:
        f.write(b"".join(out))


def quiet(fn, *args):
    """fn(*args) without the ResourceWarnings of tiny_llama.py's files left to the collector."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        return fn(*args)


def write_safetensors(path, tensors, dtype):
    """tensors ({name: fp32 array}) as one safetensors file of BF16 (truncated) or F16."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype="<f4")
        b = ((a.view("<u4") >> 16).astype("<u2") if dtype == "BF16" else a.astype("<f2"))
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [off, off + b.nbytes]}
        blobs.append(b.tobytes())
        off += b.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def c_logits(model_dir, ids, gen=GEN, out_dir=None):
    """decoder_logits's logits [len(ids)][vocab] and gen greedy tokens (the output file in
    out_dir, else beside model_dir)."""
    out = os.path.join(out_dir or os.path.dirname(model_dir),
                       os.path.basename(model_dir) + ".c.bin")
    r = subprocess.run([DECODER_LOGITS, model_dir, out, str(gen), *map(str, ids)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise AssertionError(f"decoder_logits {model_dir}: {r.stderr}")
    with open(out, "rb") as f:
        d = f.read()
    vocab, n = np.frombuffer(d[:8], "<i4")
    lg = np.frombuffer(d[8:8 + 4 * n * vocab], "<f4").reshape(n, vocab)
    return torch.from_numpy(lg.copy()), np.frombuffer(d[8 + 4 * n * vocab:], "<i4").tolist()


def c_refusal(model_dir):
    """decoder_logits's error for a model it refuses."""
    r = subprocess.run([DECODER_LOGITS, model_dir, os.path.join(model_dir, "out.bin"), "1", "1"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode == 0:
        raise AssertionError(f"decoder_logits loaded {model_dir}")
    return r.stderr


class Keep:
    """A cloud-role stand-in for prefill: keeps every layer's K/V."""

    def __init__(self):
        self.k, self.v = {}, {}

    def start_load(self, tokens):
        return None

    def save_layer(self, layer, k, v, handle=None):
        self.k[layer], self.v[layer] = k.clone(), v.clone()

    def finish(self, handle=None):
        return {}


class SkipLayers(KVLoader):
    """A cloud loader that does not store some layers: the edge must compute them."""

    def __init__(self, *a, skip=(), **kw):
        super().__init__(*a, **kw)
        self.skip = set(skip)

    def save_layer(self, layer, k, v, handle=None):
        if layer not in self.skip:
            return super().save_layer(layer, k, v, handle=handle)
        return None


class LlamaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.access(DECODER_LOGITS, os.X_OK):
            raise RuntimeError(f"{DECODER_LOGITS} is not built (cmake --build build "
                               f"--target decoder_logits)")
        cls.dir = tempfile.mkdtemp(prefix="kvedge-llama-py.")
        vocab = os.path.join(cls.dir, "vocab.gguf")
        write_vocab_gguf(vocab, VOCAB)
        tok = os.path.join(cls.dir, "tokenizer.json")
        with open(tok, "w") as f:
            f.write("{}\n")
        cls.models, cls.ids, cls.c = {}, {}, {}
        for kind in KINDS:
            d = os.path.join(cls.dir, kind)
            quiet(tiny_llama.make, kind, vocab, tok, d)
            r = random.Random(kind)
            cls.models[kind] = d
            cls.ids[kind] = [r.randrange(VOCAB) for _ in range(N_IDS)]
            cls.c[kind] = c_logits(d, cls.ids[kind])
        cls.d = None

    @classmethod
    def tearDownClass(cls):
        if cls.d is not None:
            cls.proxy.close()
            cls.node.close()
            cls.d.close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def cluster(cls):
        if cls.d is None:
            cls.d, cls.node_ep, cls.proxy_ep = kvtest.cluster()
            cls.node = kvedge.Client(cls.node_ep, deadline_ms=10000)
            cls.proxy = kvedge.Client(cls.proxy_ep, deadline_ms=10000)

    def split(self, kind):
        ids = self.ids[kind]
        return ids[:N_IDS // 2], ids[N_IDS // 2:]

    # -- the engine against the C decoder

    def check_against_c(self, kind):
        eng = Llama(self.models[kind])
        c_lg, c_gen = self.c[kind]
        with open(os.path.join(self.models[kind], "config.json")) as f:
            kvh = json.load(f)["num_key_value_heads"]
        self.assertEqual(eng.kv_heads, kvh)
        self.assertEqual(eng.store_model("m").kv_heads, kvh)
        py_lg = eng.prefill(self.ids[kind], all_logits=True)
        d = (py_lg - c_lg).abs()
        same_argmax = bool((py_lg.argmax(1) == c_lg.argmax(1)).all())
        print(f"{kind}: {N_IDS} positions x {eng.vocab} logits (|logit| up to "
              f"{c_lg.abs().max().item():.2f}): max |d| {d.max().item():.3g}, mean "
              f"{d.mean().item():.3g}; arg-max equal at every position: {same_argmax}")
        self.assertLessEqual(d.max().item(), TOL)
        self.assertTrue(same_argmax)

        # decoder_logits's session: context = the first half, K/V handed in for even layers
        # and recomputed for odd ones; the rest is the prompt; then GEN greedy tokens.
        ctx, prompt = self.split(kind)
        keep = Keep()
        eng.prefill(ctx, loader=keep)
        got = lambda l: None if l % 2 else (keep.k[l], keep.v[l])  # noqa: E731
        toks, first, how = eng.decode(ctx, prompt, GEN, kv=got)
        print(f"{kind}: greedy {GEN}: C {c_gen} engine {toks} (layers {how})")
        self.assertEqual(toks, c_gen)
        self.assertEqual(how, ["computed" if l % 2 else "fetched" for l in range(eng.n_layers)])
        self.assertLessEqual((first - c_lg[-1]).abs().max().item(), TOL)
        # every layer recomputed: the same tokens
        self.assertEqual(eng.decode(ctx, prompt, GEN)[0], c_gen)

    def test_llama_against_c(self):
        self.check_against_c("llama")

    def test_llama3_against_c(self):
        self.check_against_c("llama3")

    def test_qwen2_against_c(self):
        self.check_against_c("qwen2")

    def test_trained_pair_against_c(self):
        """The trained pair of models/kjv/llama (F16 weights, GQA 6/2 and 4/1) on the first
        held-out ids (the tokenizer fixture's, <s> first): the same checks."""
        with open(os.path.join(kvtest.SRC, "tests", "fixtures", "tokenizer",
                               "kjv_llama_heldout.json")) as f:
            ids = json.load(f)["ids"][:N_IDS]
        for size in ("cloud", "edge"):
            kind = "kjv-llama-" + size
            self.models[kind] = os.path.join(kvtest.MODELS, "kjv", "llama", size)
            self.ids[kind] = ids
            self.c[kind] = c_logits(self.models[kind], ids, out_dir=self.dir)
            self.check_against_c(kind)

    def test_half_precision_weights(self):
        """BF16 (as Llama 3.2, Qwen2.5 and SmolLM2 ship) and F16 copies of the weights: the
        same logits as C's from the same files."""
        for kind, dtype in (("llama", "BF16"), ("qwen2", "F16")):
            src = quiet(tiny_llama.load_dir, self.models[kind])
            d = os.path.join(self.dir, f"{kind}-{dtype.lower()}")
            os.makedirs(d)
            shutil.copy(os.path.join(self.models[kind], "config.json"), d)
            write_safetensors(os.path.join(d, "model.safetensors"), src, dtype)
            eng = Llama(d)
            c_lg, c_gen = c_logits(d, self.ids[kind])
            py_lg = eng.prefill(self.ids[kind], all_logits=True)
            diff = (py_lg - c_lg).abs().max().item()
            moved = (c_lg - self.c[kind][0]).abs().max().item()
            print(f"{kind} {dtype}: max |d| {diff:.3g} (the rounding moved C's logits by "
                  f"{moved:.3g})")
            self.assertLessEqual(diff, TOL)
            self.assertGreater(moved, 0)  # the file really holds rounded weights
            ctx, prompt = self.split(kind)
            self.assertEqual(eng.decode(ctx, prompt, GEN)[0], c_gen)

    # -- through a store node and a proxy

    def test_through_the_store(self):
        """The engine's cloud prefill into a store node (lossless fp32), its edge decode
        through a proxy: C's greedy tokens, with every layer fetched and with layer 1 left to
        the edge; int8 blocks: logits near local recomputation's."""
        self.cluster()
        for kind in KINDS:
            eng = Llama(self.models[kind])
            ctx, prompt = self.split(kind)
            c_gen = self.c[kind][1]
            local, local_lg, _ = eng.decode(ctx, prompt, GEN)
            for skip in ((), (1,)):
                m = eng.store_model(f"py-{kind}-lossless{''.join(map(str, skip))}")
                with SkipLayers(self.node, m, role="cloud", chunk_tokens=CHUNK,
                                scheme="lossless", dtype="fp32", skip=skip) as cloud:
                    eng.prefill(ctx, loader=cloud)
                kvtest.wait_proxy_knows(self.proxy, kvedge.chunk_ids(ctx, m, CHUNK), model=m,
                                        layers=[l for l in range(m.layers) if l not in skip])
                with KVLoader(self.proxy, m, role="edge", chunk_tokens=CHUNK) as edge:
                    toks, lg, how = eng.decode(ctx, prompt, GEN, loader=edge)
                d = (lg - local_lg).abs().max().item()
                print(f"{kind}: lossless, layers {how}: engine {toks}, C {c_gen}; first-token "
                      f"logits vs local recomputation max |d| {d:.3g}")
                self.assertEqual(how, ["computed" if l in skip else "fetched"
                                       for l in range(eng.n_layers)])
                self.assertEqual(toks, c_gen)
                self.assertLessEqual(d, TOL)
                if skip:
                    continue
                # the engine's time estimates go to the proxy: exactly the layers its plan
                # leaves to the edge are computed, and the tokens stay C's
                with KVLoader(self.proxy, m, role="edge", chunk_tokens=CHUNK) as edge:
                    h = edge.start_load(ctx, *eng.estimate(len(ctx), len(prompt)))
                    toks, _, how = eng.decode(ctx, prompt, GEN, loader=edge, handle=h)
                    plan = h.plan
                print(f"{kind}: plan with the engine's estimates: "
                      f"{[x['reason'] for x in plan['layers']]}")
                self.assertEqual(how, ["computed" if x["source"] < 0 else "fetched"
                                       for x in plan["layers"]])
                self.assertEqual(toks, c_gen)
            m = eng.store_model(f"py-{kind}-int8")
            with KVLoader(self.node, m, role="cloud", chunk_tokens=CHUNK) as cloud:
                eng.prefill(ctx, loader=cloud)
            kvtest.wait_proxy_knows(self.proxy, kvedge.chunk_ids(ctx, m, CHUNK), model=m,
                                    layers=range(m.layers))
            with KVLoader(self.proxy, m, role="edge", chunk_tokens=CHUNK,
                          kv_dtype="fp16") as edge:
                toks, lg, how = eng.decode(ctx, prompt, GEN, loader=edge)
            d = (lg - local_lg).abs().max().item()
            scale = local_lg.abs().max().item()
            print(f"{kind}: int8, fp16 handed out: engine {toks} (local {local}); first-token "
                  f"logits vs local max |d| {d:.3g} (|logit| up to {scale:.1f})")
            self.assertEqual(how, ["fetched"] * eng.n_layers)
            self.assertLessEqual(d, 2e-2 * scale)

    # -- refusals, the same as the C decoder's

    def bad_copy(self, kind, name, cfg_edit=None, index_edit=None):
        """A copy of a tiny model (weights linked) with its config.json or index edited."""
        src, d = self.models[kind], os.path.join(self.dir, f"bad-{name}")
        os.makedirs(d)
        for f in os.listdir(src):
            if f.endswith(".safetensors"):
                os.symlink(os.path.join(src, f), os.path.join(d, f))
        with open(os.path.join(src, "config.json")) as f:
            cfg = json.load(f)
        if cfg_edit:
            cfg_edit(cfg)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        ix = os.path.join(src, "model.safetensors.index.json")
        if os.path.exists(ix):
            with open(ix) as f:
                index = json.load(f)
            if index_edit:
                index_edit(index)
            with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
                json.dump(index, f)
        return d

    def test_refusals(self):
        def put(**kw):
            return lambda c: c.update(kw)

        def drop(key):
            return lambda c: c.pop(key)

        def move(name, to):
            def edit(ix):
                ix["weight_map"][name] = to
            return edit

        def unmap(name):
            return lambda ix: ix["weight_map"].pop(name)

        cases = [
            ("type", "llama", put(model_type="gemma2"), None,
             'config.json: model_type "gemma2" is not supported'),
            ("swa", "qwen2", put(use_sliding_window=True), None,
             "config.json: use_sliding_window true is not supported"),
            ("window", "llama", put(sliding_window=64), None,
             "config.json: sliding_window 64 is not supported (llama without one)"),
            ("mla", "llama", put(kv_lora_rank=512), None,
             "config.json: kv_lora_rank 512 is not supported"),
            ("partial", "llama", put(partial_rotary_factor=0.5), None,
             "config.json: partial_rotary_factor 0.5 is not supported (only 1)"),
            ("softcap", "llama", put(final_logit_softcapping=30.0), None,
             "config.json: final_logit_softcapping 30 is not supported"),
            ("moe", "llama", put(num_local_experts=8), None,
             "config.json: num_local_experts 8 is not supported"),
            ("yarn", "llama3", put(rope_scaling={"rope_type": "yarn", "factor": 4.0}), None,
             'config.json: rope_scaling.rope_type "yarn" is not supported (llama3)'),
            ("llama3-short", "llama3", put(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
             None, "config.json: rope_scaling (llama3) needs factor, low_freq_factor < "
             "high_freq_factor and original_max_position_embeddings"),
            ("act", "llama", put(hidden_act="gelu"), None,
             'config.json: hidden_act "gelu" is not supported (silu)'),
            ("mlpbias", "llama", put(mlp_bias=True), None,
             "config.json: mlp_bias true is not supported"),
            ("gqa", "llama", put(num_key_value_heads=3), None,
             "config.json: num_key_value_heads 3 does not divide num_attention_heads 4"),
            ("nolayers", "llama", drop("num_hidden_layers"), None,
             "config.json: num_hidden_layers is missing"),
            ("eps", "llama", put(rms_norm_eps=-1), None,
             "config.json: rms_norm_eps is not a number in (0, 1]"),
            ("vocab", "llama", put(vocab_size=VOCAB + 1), None,
             f"config.json: vocab_size {VOCAB + 1} is larger than the embedding's {VOCAB} rows"),
            ("layers", "llama", put(num_hidden_layers=2), None,
             "the tensors hold more layers than num_hidden_layers 2 "
             "(model.layers.2.input_layernorm.weight)"),
            ("untied", "llama3", put(tie_word_embeddings=False), None,
             "tensor lm_head.weight is missing"),
            ("headdim", "llama", put(head_dim=8), None,
             "tensor model.layers.0.self_attn.q_proj.weight: shape"),
            ("wrongshard", "qwen2", None,
             move("model.norm.weight", "model-00001-of-00002.safetensors"),
             "tensor model.norm.weight is not in model-00001-of-00002.safetensors, where "
             "model.safetensors.index.json maps it"),
            ("unmapped", "qwen2", None, unmap("model.norm.weight"),
             "holds tensor model.norm.weight, which model.safetensors.index.json maps nowhere"),
            ("escape", "qwen2", None, move("model.norm.weight", "../x.safetensors"),
             "tensor model.norm.weight names no shard file in dir"),
        ]
        for name, kind, cfg_edit, index_edit, words in cases:
            with self.subTest(name):
                d = self.bad_copy(kind, name, cfg_edit, index_edit)
                with self.assertRaises(ConfigError) as e:
                    Llama(d)
                c = c_refusal(d)
                print(f"{name}: engine: {e.exception}\n{' ' * len(name)}  C: {c.strip()}")
                self.assertIn(words, str(e.exception))
                self.assertIn(words, c)
                self.assertIn(d, str(e.exception))

    def test_bad_input(self):
        eng = Llama(self.models["llama"])
        with self.assertRaises(ValueError):
            eng.prefill([VOCAB])  # outside the vocabulary
        with self.assertRaises(ValueError):
            eng.decode([1] * 200, [1] * 50, 10)  # over max_position_embeddings (256)
        with self.assertRaises(ValueError):  # context K/V of the wrong shape
            eng.decode([1, 2, 3], [4], 1, kv=lambda l: (torch.zeros(4, 3, 16),) * 2)
        with self.assertRaises(FileNotFoundError):
            Llama(os.path.join(self.dir, "nowhere"))
        with self.assertRaises(TypeError):
            Llama(3)
        d = os.path.join(self.dir, "truncated")
        os.makedirs(d)
        shutil.copy(os.path.join(self.models["llama"], "config.json"), d)
        with open(os.path.join(self.models["llama"], "model.safetensors"), "rb") as f:
            data = f.read()
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(data[:len(data) // 2])
        with self.assertRaises(ConfigError) as e:
            Llama(d)
        self.assertIn("model.safetensors: tensor", str(e.exception))


if __name__ == "__main__":
    unittest.main()
