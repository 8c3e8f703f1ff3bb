#!/usr/bin/env python3
"""Distils a large-small K/V adapter: starting from a least-squares adapter file (kvedge
layermap --adapter, kind linear), trains the same per-layer affine K and V maps by gradient
descent so that the FROZEN edge model, attending over the cloud model's context K/V adapted
exactly as kvedge_adapter_apply does (K un-rotated with the cloud's rotary setting, mapped,
re-rotated with the edge's), predicts the continuation as the cloud model does:

    loss = KL(cloud || edge with adapted context) + ce * next-token cross-entropy

on calibration windows of CTX context + CONT continuation tokens (consecutive pieces of CTX + CONT + 1
tokens of each chapter, as `kvedge lseval` cuts its documents: position i of the
continuation scores token CTX + i + 1). The result is written in the adapter file format the
C loader reads (docs/largesmall.md, "The adapter file"): the same metadata, the trained
tensors, and one more metadata field, "fit", saying how it was fitted. Every --every steps
it measures the KL and perplexity on the first --eval-docs calibration windows and on the
first --eval-docs held-out documents (--eval-file, never trained on): the curve, printed and,
with --curve FILE, written as CSV.

    /usr/bin/python3 scripts/train_adapter.py --cloud models/kjv/llama/cloud \\
        --edge models/kjv/llama/edge --adapter models/kjv/llama/ls/adapter-linear.safetensors \\
        --file models/kjv/train.txt --eval-file models/kjv/heldout.txt \\
        --out models/kjv/llama/ls/adapter-distilled.safetensors

Both families of the C decoder: a folder whose config.json has a model_type is a Llama-family
model (clients/python/kvedge/llama.py, rotary), any other folder an OPT model's
(model.safetensors, clients/python/kvedge/opt.py: learned absolute positions, so K is mapped
as it is, with no rotation, as kvedge_adapter_apply does for it). The edge model's weights stay
frozen; only the adapter's tensors train. Exit status 2 for bad arguments or an adapter that
does not fit the models.
"""
import argparse
import importlib
import json
import math
import os
import random
import struct
import sys
import time
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _engine_module(name):
    """clients/python/kvedge/NAME.py (llama or opt) without loading libkvedge (its RoleEngine
    base is only the serving glue; the layer math needs only _attend, from kvedge/_attn.py)."""
    pkg_dir = os.path.join(HERE, "..", "clients", "python", "kvedge")
    if "kvedge" not in sys.modules:
        pkg = types.ModuleType("kvedge")
        pkg.__path__ = [pkg_dir]
        sys.modules["kvedge"] = pkg
        roles = types.ModuleType("kvedge._roles")
        attn = importlib.import_module("kvedge._attn")

        class RoleEngine:
            _attend = staticmethod(attn.attend)

        roles.RoleEngine = RoleEngine
        sys.modules["kvedge._roles"] = roles
    return importlib.import_module("kvedge." + name)


def load_model(folder):
    """(engine, is_llama) for a model folder: config.json with a model_type is the Llama
    family (the C decoder's rule), else OPT weights in FOLDER/model.safetensors (or FOLDER
    itself, a .safetensors file)."""
    cfg = os.path.join(folder, "config.json")
    if os.path.isdir(folder) and os.path.exists(cfg):
        with open(cfg) as f:
            if "model_type" in json.load(f):
                return _engine_module("llama").Llama(folder), True
    path = os.path.join(folder, "model.safetensors") if os.path.isdir(folder) else folder
    return _engine_module("opt").OPT(path), False


def default_tokenizer(cloud):
    """The first of the cloud folder's parent and grandparent with vocab.json (models/kjv for
    models/kjv/cloud and for models/kjv/llama/cloud)."""
    d = os.path.dirname(os.path.abspath(cloud))
    for cand in (d, os.path.dirname(d)):
        if os.path.exists(os.path.join(cand, "vocab.json")):
            return cand
    return os.path.dirname(d)


# -- the adapter file (clients/e2e/adapter.c, kvedge_adapter_save / _load)

def read_adapter(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__")
    tensors = {}
    for name, t in header.items():
        if t["dtype"] != "F32" or len(t["shape"]) != 2:
            raise ValueError(f"{path}: tensor {name} is not a 2-D F32 tensor")
        a, b = t["data_offsets"]
        tensors[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(
            t["shape"]).clone()
    return meta, tensors


def write_adapter(path, meta, tensors):
    """Tensors in edge-layer order, K before V, as kvedge_adapter_save writes them."""
    names = sorted(tensors, key=lambda s: (int(s.split(".")[1]), s[0] != "k"))
    h = {"__metadata__": meta}
    off, blobs = 0, []
    for name in names:
        b = tensors[name].detach().contiguous().float().numpy().astype("<f4").tobytes()
        h[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                   "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    hb = json.dumps(h, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


# -- the forward pass

def rotate(eng, k, pos0, inverse=False):
    """Rotary positions on k [heads][n][head_dim] at pos0.. (the inverse: un-rotate), the
    engine's rotate-half layout and frequencies."""
    n, half = k.shape[1], k.shape[2] // 2
    a = torch.arange(pos0, pos0 + n, dtype=torch.float64)[:, None] * eng.inv_freq.double()
    cos, sin = torch.cos(a).float()[None], torch.sin(a).float()[None]
    if inverse:
        sin = -sin
    x1, x2 = k[..., :half], k[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def rotary(eng):
    return getattr(eng, "rope_theta", 0) > 0  # the Llama family is rotary, OPT is not


def gather(x):
    """[heads][n][hd] -> [n][heads * hd] (s_gather)."""
    return x.transpose(0, 1).reshape(x.shape[1], -1)


def scatter(y, heads):
    """[n][heads * hd] -> [heads][n][hd] (s_scatter)."""
    return y.reshape(y.shape[0], heads, -1).transpose(0, 1)


def affine(x, w):
    return x @ w[:-1] + w[-1]


@torch.no_grad()
def cloud_pass(cloud, toks, ctx, cont):
    """The cloud over context and continuation: each layer's context K (un-rotated) and V, and
    the log-probabilities at the continuation positions."""
    x = cloud._embed(toks[:ctx + cont], 0)
    ks, vs = [], []
    for l in range(cloud.n_layers):
        x, k, v = cloud._layer(l, x, 0)
        k = k[:, :ctx]
        ks.append(rotate(cloud, k, 0, inverse=True) if rotary(cloud) else k.contiguous())
        vs.append(v[:, :ctx].contiguous())
    logp = torch.log_softmax(cloud._logits(x[ctx:]), -1)
    return ks, vs, logp


def edge_pass(edge, toks, ctx, cont, from_, w, ks, vs):
    """The edge over the continuation, each mapped layer attending over the adapted cloud
    context (an unmapped layer would compute its own: not supported here, every layer of the
    pairs this script serves is mapped). Returns log-probabilities at the continuation."""
    x = edge._embed(toks[ctx:ctx + cont], ctx)
    for e in range(edge.n_layers):
        c = from_[e]
        k = scatter(affine(gather(ks[c]), w[f"k.{e}"]), edge.kv_heads)
        if rotary(edge):
            k = rotate(edge, k, 0)
        v = scatter(affine(gather(vs[c]), w[f"v.{e}"]), edge.kv_heads)
        x, _, _ = edge._layer(e, x, ctx, k, v)
    return torch.log_softmax(edge._logits(x), -1)


def losses(edge, win, from_, w, cache, ctx, cont):
    toks = win
    ks, vs, plogp = cache
    qlogp = edge_pass(edge, toks, ctx, cont, from_, w, ks, vs)
    kl = (plogp.exp() * (plogp - qlogp)).sum(-1).mean()
    tgt = torch.as_tensor(toks[ctx + 1:ctx + cont + 1], dtype=torch.long)
    ce = torch.nn.functional.nll_loss(qlogp, tgt)
    return kl, ce


def windows(tok, path, ctx, cont, limit):
    """Documents as `kvedge lseval` cuts them: each chapter (between blank lines) encoded with
    <s> before it and cut into consecutive pieces of ctx + cont + 1 tokens (a remainder is
    dropped)."""
    import train_models
    n, out = ctx + cont + 1, []
    for ch in train_models.load_chapters(path):
        ids = tok.encode(ch)
        for at in range(0, len(ids) - n + 1, n):
            out.append(ids[at:at + n])
            if limit and len(out) >= limit:
                return out
    return out


def evaluate(edge, wins, caches, from_, w, ctx, cont):
    with torch.no_grad():
        kl = ce = 0.0
        for win, c in zip(wins, caches):
            a, b = losses(edge, win, from_, w, c, ctx, cont)
            kl, ce = kl + float(a), ce + float(b)
    return kl / len(wins), math.exp(ce / len(wins))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cloud", required=True, help="the cloud model's folder")
    ap.add_argument("--edge", required=True, help="the edge model's folder")
    ap.add_argument("--tokenizer", default=None,
                    help="folder with vocab.json and merges.txt (default: the first of the "
                    "cloud's parent and grandparent that has them: models/kjv for "
                    "models/kjv/cloud and models/kjv/llama/cloud)")
    ap.add_argument("--adapter", required=True, help="the least-squares adapter to start from")
    ap.add_argument("--file", required=True, help="calibration text (chapters)")
    ap.add_argument("--eval-file", default=None, help="held-out text for the curve (never trained on)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--cont", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--ce", type=float, default=0.0, help="weight of the next-token loss")
    ap.add_argument("--train-docs", type=int, default=0, help="calibration windows (0: all)")
    ap.add_argument("--eval-docs", type=int, default=32)
    ap.add_argument("--evals", type=int, default=5,
                    help="curve points when --every is not given (steps spread evenly)")
    ap.add_argument("--every", type=int, default=0,
                    help="measure the curve every K steps (and at the last step)")
    ap.add_argument("--curve", default=None,
                    help="write the curve to this CSV file: step, train_kl, train_ppl, "
                    "heldout_kl, heldout_ppl, seconds (held-out columns empty without "
                    "--eval-file)")
    ap.add_argument("--from", dest="from_", default=None,
                    help="cloud layer of every edge layer, comma-separated (default: the "
                    "adapter's; another map starts from the same layer's least-squares weights, "
                    "and the file then no longer matches the registered map)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    if a.every < 0 or a.steps < 1 or a.batch < 1 or a.eval_docs < 1:
        print("--steps, --batch and --eval-docs must be at least 1, --every at least 0",
              file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    import train_models
    (cloud, cloud_llama), (edge, edge_llama) = load_model(a.cloud), load_model(a.edge)
    if cloud_llama != edge_llama:
        print("the cloud and the edge model are of different families (Llama, OPT): they "
              "share no tokenizer", file=sys.stderr)
        return 2
    meta, w = read_adapter(a.adapter)
    if meta.get("kind") != "linear":
        sys.exit(f"{a.adapter}: kind {meta.get('kind')}, this script trains linear adapters")
    shape = (int(meta["cloud_layers"]), int(meta["cloud_heads"]), int(meta["cloud_head_dim"]),
             int(meta["edge_layers"]), int(meta["edge_heads"]), int(meta["edge_head_dim"]))
    if shape != (cloud.n_layers, cloud.kv_heads, cloud.head_dim, edge.n_layers, edge.kv_heads,
                 edge.head_dim):
        print(f"{a.adapter}: the adapter is for {shape}, not these models", file=sys.stderr)
        return 2
    try:
        from_ = [int(x) for x in (a.from_ or meta["from"]).split(",")]
    except ValueError:
        from_ = []
    if (len(from_) != edge.n_layers or any(f >= cloud.n_layers for f in from_)
            or any(f >= 0 and f"k.{e}" not in w for e, f in enumerate(from_))):
        print(f"from: {edge.n_layers} cloud layers below {cloud.n_layers} wanted, each edge "
              f"layer one the adapter has weights for",
              file=sys.stderr)
        return 2
    if any(f < 0 for f in from_):
        print(f"{a.adapter}: an unmapped edge layer; this script needs every layer mapped",
              file=sys.stderr)
        return 2
    positions = min(getattr(m, "max_positions", 1 << 30) for m in (cloud, edge))
    if a.ctx < 1 or a.cont < 1 or a.ctx + a.cont > positions:
        print(f"--ctx {a.ctx} + --cont {a.cont} must be 2..{positions} tokens (the models' "
              f"positions)", file=sys.stderr)
        return 2
    tok = train_models.Tokenizer(a.tokenizer or default_tokenizer(a.cloud), llama=cloud_llama)
    t0 = time.time()
    train = windows(tok, a.file, a.ctx, a.cont, a.train_docs)
    held = windows(tok, a.eval_file, a.ctx, a.cont, a.eval_docs) if a.eval_file else []
    if not train:
        print(f"{a.file}: no chapter of {a.ctx + a.cont + 1} tokens", file=sys.stderr)
        return 2
    print(f"{len(train)} calibration windows, {len(held)} held-out; caching the cloud's pass",
          flush=True)
    cache = [cloud_pass(cloud, t, a.ctx, a.cont) for t in train]
    hcache = [cloud_pass(cloud, t, a.ctx, a.cont) for t in held]
    tprobe = list(range(min(len(train), a.eval_docs)))
    print(f"cached in {time.time() - t0:.0f} s", flush=True)
    for v in w.values():
        v.requires_grad_(True)
    opt = torch.optim.Adam(list(w.values()), lr=a.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 10) * 0.5 * (1 + math.cos(math.pi * s / max(1, a.steps))))
    curve = []

    def point(step):
        tk, tp = evaluate(edge, [train[i] for i in tprobe], [cache[i] for i in tprobe], from_, w,
                          a.ctx, a.cont)
        hk, hp = evaluate(edge, held, hcache, from_, w, a.ctx, a.cont) if held else (0.0, 0.0)
        curve.append((step, tk, tp, hk, hp, time.time() - t0))
        print(f"step {step:5d}  train KL {tk:.4f} ppl {tp:.2f}  held-out KL {hk:.4f} ppl {hp:.2f}"
              f"  ({time.time() - t0:.0f} s)", flush=True)

    point(0)
    order = []
    every = a.every or max(1, a.steps // max(1, a.evals - 1))
    for step in range(1, a.steps + 1):
        opt.zero_grad()
        for _ in range(a.batch):
            if not order:
                order = list(range(len(train)))
                random.shuffle(order)
            i = order.pop()
            kl, ce = losses(edge, train[i], from_, w, cache[i], a.ctx, a.cont)
            ((kl + a.ce * ce) / a.batch).backward()
        opt.step()
        sched.step()
        if step % every == 0 or step == a.steps:
            point(step)
    minutes = (time.time() - t0) / 60
    meta = dict(meta)
    meta["samples"] = str(len(train) * a.cont)
    meta["from"] = ",".join(str(f) for f in from_)
    meta["fit"] = (f"distilled: KL(cloud||edge)+{a.ce:g}*CE, Adam lr {a.lr:g}, {a.steps} steps x "
                   f"{a.batch} windows of {a.ctx}+{a.cont} tokens, {len(train)} windows, from "
                   f"{os.path.basename(a.adapter)}")
    write_adapter(a.out, meta, {k: v.detach() for k, v in w.items()})
    print(f"wrote {a.out} ({minutes:.1f} min)")
    print("curve: step train_kl train_ppl heldout_kl heldout_ppl")
    for c in curve:
        print("curve: %d %.4f %.2f %.4f %.2f" % c[:5])
    if a.curve:
        with open(a.curve, "w") as f:
            f.write("step,train_kl,train_ppl,heldout_kl,heldout_ppl,seconds\n")
            for step, tk, tp, hk, hp, sec in curve:
                held_cols = f"{hk:.6f},{hp:.4f}" if held else ","
                f.write(f"{step},{tk:.6f},{tp:.4f},{held_cols},{sec:.1f}\n")
        print(f"wrote {a.curve}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
