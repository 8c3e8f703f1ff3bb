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

Which cloud layer feeds each edge layer (the layer map) is the adapter's by default; --from
gives another: a list, `cka` or `rsa` (Eq. 16's rule on that score alone: the shallowest
cloud layer within 0.02 of the best at or above the threshold, from the matrices of
`kvedge --json layermap`, --scores), or `learned`: per edge layer a softmax over every cloud
layer, trained jointly with one adapter per (edge, cloud) pair by the same loss for the first
--harden-at of the steps (its temperature falling from 1 to 0.1), then hardened to the argmax
and the chosen pairs' adapters fine-tuned for the rest. --init lsq starts every adapter from
ridge least squares on the calibration windows' contexts (the edge model's own K and V on the
cloud's, as kvedge layermap --adapter fits), so maps compare from the same start. --map-out
writes the map the adapter was trained on as a layer map file (`kvedge layermap --show`
reads it; the scores of each pair from --scores).
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


# -- layer maps: the rule on one score, learned maps, map files

def rule_one(score, minimum, tie=0.02):
    """Eq. 16's rule on one score matrix [edge][cloud]: the shallowest cloud layer within tie
    of the best at or above minimum, or -1 (none)."""
    out = []
    for row in score:
        cand = [c for c, x in enumerate(row) if x >= minimum]
        if not cand:
            out.append(-1)
            continue
        best = max(row[c] for c in cand)
        out.append(min(c for c in cand if row[c] >= best - tie))
    return out


def write_map(path, scores, from_):
    """A layer map file (docs/largesmall.md, "The map file") for from_, the ids, shapes,
    samples and thresholds of `kvedge --json layermap`'s output and each pair's scores."""
    cka, rsa = scores["cka"], scores["rsa"]
    lines = ["kvedge-layermap 1",
             "cloud %s %d %d" % (scores["cloud"]["id"], scores["cloud"]["layers"],
                                 scores["cloud"]["hidden"]),
             "edge %s %d %d" % (scores["edge"]["id"], scores["edge"]["layers"],
                                scores["edge"]["hidden"]),
             "samples %d" % scores["samples"],
             "thresholds %.6f %.6f" % (scores["cka_min"], scores["rsa_min"])]
    for e, c in enumerate(from_):
        if cka[e][c] < scores["cka_min"] or rsa[e][c] < scores["rsa_min"]:
            raise ValueError(f"edge layer {e} <- cloud {c} scores below the thresholds: a map "
                             "file cannot hold it")
        lines.append("layer %d %d %.6f %.6f" % (e, c, cka[e][c], rsa[e][c]))
    lines.append("end")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


@torch.no_grad()
def lsq_init(edge, train, cache, pairs, ctx, ridge=1e-3):
    """Ridge least squares per (edge layer, cloud layer) pair and per K and V on the windows'
    contexts: the edge's own K (un-rotated) and V on [cloud's, 1], lambda = ridge x mean
    diag(X^T X), the bias not penalized, solved in double (kvedge_adapter_fit_linear's fit)."""
    acc = {}
    for toks, (ks, vs, _) in zip(train, cache):
        x = edge._embed(toks[:ctx], 0)
        own = []
        for l in range(edge.n_layers):
            x, k, v = edge._layer(l, x, 0)
            own.append((rotate(edge, k, 0, inverse=True) if rotary(edge) else k, v))
        for e, c in pairs:
            for kind, xs, y in (("k", ks[c], own[e][0]), ("v", vs[c], own[e][1])):
                X = torch.cat([gather(xs), torch.ones(ctx, 1)], 1).double()
                Y = gather(y).double()
                a = acc.setdefault((kind, e, c), [0, 0])
                a[0] = a[0] + X.T @ X
                a[1] = a[1] + X.T @ Y
    w = {}
    for (kind, e, c), (xtx, xty) in acc.items():
        d = xtx.shape[0] - 1
        lam = ridge * float(torch.diagonal(xtx)[:d].mean())
        reg = xtx.clone()
        reg[range(d), range(d)] += lam
        w[(kind, e, c)] = torch.linalg.solve(reg, xty).float()
    return w


def learned_pass(edge, toks, ctx, cont, alpha, tau, ws, ks, vs):
    """edge_pass with every edge layer attending over a softmax(alpha[e] / tau) mixture of
    every cloud layer's adapted context K/V (ws[(kind, e, c)])."""
    x = edge._embed(toks[ctx:ctx + cont], ctx)
    for e in range(edge.n_layers):
        p = torch.softmax(alpha[e] / tau, 0)
        k = sum(p[c] * scatter(affine(gather(ks[c]), ws[("k", e, c)]), edge.kv_heads)
                for c in range(len(ks)))
        if rotary(edge):
            k = rotate(edge, k, 0)
        v = sum(p[c] * scatter(affine(gather(vs[c]), ws[("v", e, c)]), edge.kv_heads)
                for c in range(len(vs)))
        x, _, _ = edge._layer(e, x, ctx, k, v)
    return torch.log_softmax(edge._logits(x), -1)


def learn_map(edge, train, cache, ws, steps, a):
    """The soft phase of --from learned: alpha [edge layers][cloud layers] and every pair's
    adapter trained on the distillation loss; returns the argmax map and alpha's softmax."""
    E, C = edge.n_layers, len(cache[0][0])
    alpha = torch.zeros(E, C, requires_grad=True)
    for v in ws.values():
        v.requires_grad_(True)
    opt = torch.optim.Adam([{"params": list(ws.values()), "lr": a.lr},
                            {"params": [alpha], "lr": a.alpha_lr}])
    order = []
    for step in range(1, steps + 1):
        tau = 0.1 ** ((step - 1) / max(1, steps - 1))  # 1 -> 0.1
        opt.zero_grad()
        for _ in range(a.batch):
            if not order:
                order = list(range(len(train)))
                random.shuffle(order)
            i = order.pop()
            ks, vs, plogp = cache[i]
            qlogp = learned_pass(edge, train[i], a.ctx, a.cont, alpha, tau, ws, ks, vs)
            kl = (plogp.exp() * (plogp - qlogp)).sum(-1).mean()
            (kl / a.batch).backward()
        opt.step()
        if step % max(1, steps // 5) == 0 or step == steps:
            p = torch.softmax(alpha.detach() / tau, 1)
            print(f"learn step {step:4d} tau {tau:.3f} KL {float(kl):.4f} map "
                  f"{','.join(str(int(r.argmax())) for r in p)} "
                  f"p(max) {','.join('%.2f' % float(r.max()) for r in p)}", flush=True)
    p = torch.softmax(alpha.detach(), 1)
    return [int(r.argmax()) for r in alpha.detach()], p


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
                    "adapter's; another map starts from the same edge layer's weights unless "
                    "--init lsq, and the file then no longer matches the registered map); "
                    "cka or rsa: Eq. 16's rule on that score alone (--scores); learned: a "
                    "softmax per edge layer over the cloud layers, trained, then hardened")
    ap.add_argument("--scores", default=None,
                    help="the output of `kvedge --json layermap` for the pair (its map, "
                    "matrices, ids and thresholds): for --from cka|rsa and --map-out")
    ap.add_argument("--map-out", default=None,
                    help="write the map trained on as a layer map file (needs --scores)")
    ap.add_argument("--init", choices=("file", "lsq"), default="file",
                    help="file: the adapter's weights; lsq: ridge least squares on the "
                    "calibration windows' contexts for every pair trained")
    ap.add_argument("--harden-at", type=float, default=0.5,
                    help="--from learned: the share of --steps spent learning the map")
    ap.add_argument("--alpha-lr", type=float, default=0.2,
                    help="--from learned: Adam's learning rate for the map's logits")
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
    scores = None
    if a.scores:
        with open(a.scores) as f:
            scores = json.loads(f.readline())  # the map's line (a second one is the adapter's)
        if (len(scores.get("cka", [])) != edge.n_layers
                or any(len(r) != cloud.n_layers for r in scores["cka"] + scores["rsa"])):
            print(f"{a.scores}: no score matrices of {edge.n_layers} x {cloud.n_layers} (the "
                  f"output of `kvedge --json layermap` for these models)", file=sys.stderr)
            return 2
    if a.map_out and scores and (scores["cloud"]["id"], scores["edge"]["id"]) != (
            meta.get("cloud_id"), meta.get("edge_id")):
        print(f"{a.scores} is for {scores['cloud']['id']} -> {scores['edge']['id']}, the adapter "
              f"for {meta.get('cloud_id')} -> {meta.get('edge_id')}: run kvedge layermap with "
              f"--cloud-id and --edge-id the adapter's", file=sys.stderr)
        return 2
    if (a.from_ in ("cka", "rsa") or a.map_out) and not scores:
        print("--from cka|rsa and --map-out need --scores", file=sys.stderr)
        return 2
    learned = a.from_ == "learned"
    if learned and not 0 < a.harden_at < 1:
        print("--harden-at must be between 0 and 1", file=sys.stderr)
        return 2
    if a.from_ in ("cka", "rsa"):
        from_ = rule_one(scores[a.from_], scores[a.from_ + "_min"])
    elif learned:
        from_ = [0] * edge.n_layers  # chosen by training
    else:
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
    first = 0  # the first step of the adapter's own training (after a learned map's phase)
    if learned:
        pairs = [(e, c) for e in range(edge.n_layers) for c in range(cloud.n_layers)]
    else:
        pairs = [(e, from_[e]) for e in range(edge.n_layers)]
    if a.init == "lsq":
        ws = lsq_init(edge, train, cache, pairs, a.ctx)
        print(f"least squares for {len(pairs)} pairs on {len(train)} windows' contexts "
              f"({time.time() - t0:.0f} s)", flush=True)
    else:
        ws = {(kind, e, c): w[f"{kind}.{e}"].clone() for e, c in pairs for kind in "kv"}
    map_note = "" if a.from_ is None else f", map {a.from_}"
    if learned:
        first = max(1, min(a.steps - 1, round(a.steps * a.harden_at)))
        from_, p = learn_map(edge, train, cache, ws, first, a)
        print(f"learned map {','.join(map(str, from_))} after {first} steps (softmax at tau 1: "
              f"{'; '.join(','.join('%.2f' % float(x) for x in r) for r in p)}) "
              f"({time.time() - t0:.0f} s)", flush=True)
        map_note = f", map learned in {first} steps: {','.join(map(str, from_))}"
    w = {f"{kind}.{e}": ws[(kind, e, from_[e])].detach().clone() for e in range(edge.n_layers)
         for kind in "kv"}
    for v in w.values():
        v.requires_grad_(True)
    opt = torch.optim.Adam(list(w.values()), lr=a.lr)
    rest = a.steps - first
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 10) * 0.5 * (1 + math.cos(math.pi * s / max(1, rest))))
    curve = []

    def point(step):
        tk, tp = evaluate(edge, [train[i] for i in tprobe], [cache[i] for i in tprobe], from_, w,
                          a.ctx, a.cont)
        hk, hp = evaluate(edge, held, hcache, from_, w, a.ctx, a.cont) if held else (0.0, 0.0)
        curve.append((step, tk, tp, hk, hp, time.time() - t0))
        print(f"step {step:5d}  train KL {tk:.4f} ppl {tp:.2f}  held-out KL {hk:.4f} ppl {hp:.2f}"
              f"  ({time.time() - t0:.0f} s)", flush=True)

    point(first)
    order = []
    every = a.every or max(1, a.steps // max(1, a.evals - 1))
    for step in range(first + 1, a.steps + 1):
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
                   + (f"least squares (init lsq){map_note}" if a.init == "lsq" else
                      f"{os.path.basename(a.adapter)}{map_note}"))[:255]
    write_adapter(a.out, meta, {k: v.detach() for k, v in w.items()})
    print(f"wrote {a.out} ({minutes:.1f} min)")
    if a.map_out:
        write_map(a.map_out, scores, from_)
        print(f"wrote {a.map_out}: map {','.join(map(str, from_))}")
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
