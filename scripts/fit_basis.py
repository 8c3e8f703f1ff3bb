#!/usr/bin/env python3
"""Fits the coding basis of the tc rung for one trained model and writes it as a .kvb file
(access/codec/basis.h, docs/block-format.md "Coding bases").

usage: /usr/bin/python3 scripts/fit_basis.py --model DIR --out FILE [--docs N] [--threads N]
           [--model-id ID] [--file TEXT]
  DIR: models/kjv/cloud, models/kjv/edge (OPT), models/kjv/llama/cloud, models/kjv/llama/edge
  (Llama family), or another folder of those engines with --model-id.

The basis is scripts/study_lossy_kv.py's best configuration whose K is the stored
(post-rotary) K, "klt+layer+kv", computed with the study's own functions on calibration
documents taken from the TRAINING chapters only (never the held-out ones `kvedge eval`
measures):
  - for every (layer, KV head, K or V) the weighted KLT (klt_bases: K in the metric of the
    queries' second moment, V in that of W_o), its inverse stored as fp16 and the forward the
    exact inverse of those fp16 values;
  - the step of each section a * rms * layer_mult[l] * (k_mult or v_mult), rounded to fp16,
    the multipliers equalizing the KL of each layer and of K and V coded alone at the study's
    probe step (equal_kl_mults), and a chosen so that the mean KL on the calibration documents
    is int4-g32's KL on the same documents (the study's target).
Calibration documents: N training chapters of at least 385 tokens spread evenly over the
corpus (--file, chapters separated by blank lines as models/kjv/train.txt has them; by
default models/kjv/train.txt when present, else the training chapters of the `bible` program
as scripts/train_models.py splits them), tokenized by the model's vocabulary (BOS first for the
Llama family), context the first 256 tokens, the next 128 scored.

The model id is the one the product stores the model under: kjv-cloud, kjv-edge,
kjv-llama-cloud, kjv-llama-edge for the trained folders (the ids of `kvedge eval`, the demo and
docs/benchmarks.md), followed for a rotary model by "@rope-" and its fingerprint (FNV-1a of its
fp32 rotary frequencies, kvedge_decoder_rope_fingerprint). Prints it, the fitted figures, the
basis id and the file's size. Needs Debian's python3-torch, numpy and libhtscodecs.so.2.
"""
import argparse
import hashlib
import math
import os
import struct
import subprocess
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import study_lossy_kv as S  # noqa: E402
import train_models  # noqa: E402
from train_adapter import default_tokenizer, load_model  # noqa: E402

MAGIC = b"KVEDGEKB"
VERSION = 1
ID_FIELD = 132        # model id bytes then NUL padding (at least one NUL)
MODEL_ID_MAX = 128    # KVEDGE_MODEL_ID_MAX_BYTES
FP16_MIN_NORMAL = 2.0 ** -14
FP16_MAX = 65504.0
# The product's ids of the trained folders (relative to the repository).
KNOWN_IDS = {
    "models/kjv/cloud": "kjv-cloud",
    "models/kjv/edge": "kjv-edge",
    "models/kjv/llama/cloud": "kjv-llama-cloud",
    "models/kjv/llama/edge": "kjv-llama-edge",
}
KL_TOLERANCE = 0.01   # |log(KL / target)| at which the search for a stops
SEARCH_STEPS = 8


def rope_fingerprint(inv_freq):
    """kvedge_decoder_rope_fingerprint: FNV-1a over the fp32 frequencies' bytes, never 0."""
    h = 2166136261
    for f in inv_freq:
        for b in struct.pack("<f", f):
            h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h or 1


def rope_freqs(cfg, head_dim):
    """kvedge_decoder_rope_freqs: base^(-2i/d) in double, Llama 3's rope_scaling, as fp32."""
    theta = float(cfg.get("rope_theta", 10000.0))
    sc = cfg.get("rope_scaling") or {}
    llama3 = sc.get("rope_type", sc.get("type")) == "llama3"
    out = []
    for i in range(head_dim // 2):
        f = 1.0 / math.pow(theta, 2.0 * i / head_dim)
        if llama3:
            wavelen = 2.0 * math.pi / f
            low_wl = sc["original_max_position_embeddings"] / sc["low_freq_factor"]
            high_wl = sc["original_max_position_embeddings"] / sc["high_freq_factor"]
            if wavelen > low_wl:
                f /= sc["factor"]
            elif wavelen >= high_wl:
                sm = ((sc["original_max_position_embeddings"] / wavelen - sc["low_freq_factor"]) /
                      (sc["high_freq_factor"] - sc["low_freq_factor"]))
                f = (1.0 - sm) * f / sc["factor"] + sm * f
        out.append(float(np.float32(f)))
    return out


def model_id(model_dir, given, is_llama, head_dim):
    """The id the product uses for the model (see the usage)."""
    import json
    base = given
    if base is None:
        rel = os.path.relpath(os.path.abspath(model_dir), ROOT)
        base = KNOWN_IDS.get(rel.rstrip("/"))
        if base is None:
            sys.exit(f"fit_basis: {model_dir} is not one of the trained folders "
                     f"({', '.join(KNOWN_IDS)}): give its id with --model-id")
    if is_llama and "@rope-" not in base:
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        base += "@rope-%08x" % rope_fingerprint(rope_freqs(cfg, head_dim))
    if not 0 < len(base.encode()) <= MODEL_ID_MAX:
        sys.exit(f"fit_basis: model id '{base}' is not 1..{MODEL_ID_MAX} bytes")
    return base


def training_chapters(path):
    """The training chapters' texts: from path (chapters separated by blank lines), else
    models/kjv/train.txt, else the `bible` program split as scripts/train_models.py does."""
    if path is None:
        cand = os.path.join(ROOT, "models/kjv/train.txt")
        path = cand if os.path.exists(cand) else None
    if path is not None:
        return train_models.load_chapters(path), path
    chapters = train_models.read_bible()
    return ([train_models.chapter_text(t, v) for i, (t, v) in enumerate(chapters)
             if i % train_models.HELDOUT_EVERY != train_models.HELDOUT_AT],
            "the bible program's training chapters")


def calibration_ids(chapters, tok, n):
    """Token ids of n chapters of at least CTX + CONT + 1 tokens, spread evenly: the first
    long enough chapter from each of n equal stretches of the corpus (fewer when the corpus
    has fewer)."""
    need = S.CTX + S.CONT + 1
    stride = max(1, len(chapters) // max(n, 1))
    out = []
    for j in range(0, len(chapters), stride):
        for c in chapters[j:j + stride]:
            ids = tok.encode(c)
            if len(ids) >= need:
                out.append(ids)
                break
        if len(out) == n:
            break
    return out


def fit(docs, eng, is_llama, rans, log):
    """(bases, steps, figures): the klt+layer+kv configuration fitted on docs."""
    L, H = eng.n_layers, eng.kv_heads
    bases = S.klt_bases(docs, S.wv_full_of(eng, is_llama))
    target = sum(d.kl(*S.scheme_minmax(d, 4, 32, None)[:2]) for d in docs) / len(docs)
    log(f"int4-g32's KL on the calibration documents (the target): {target:.4e}")

    def klt(cfg):
        return S.measure(docs, lambda d: S.scheme_klt(d, dict(cfg, bases=bases), rans))

    probe = S.ALPHAS[len(S.ALPHAS) // 2]
    lay = [klt(dict(a=probe, only_layer=l))[0] for l in range(L)]
    kv = [klt(dict(a=probe, only=w))[0] for w in ("k", "v")]
    layer_mult = S.equal_kl_mults(lay)
    k_mult, v_mult = S.equal_kl_mults(kv)
    log(f"sensitivity at a={probe:g}: layers {' '.join('%.2e' % x for x in lay)}, "
        f"K {kv[0]:.2e} V {kv[1]:.2e}")
    cfg = {"layer_mult": layer_mult, "k_mult": k_mult, "v_mult": v_mult}

    # a: the study's sweep until it brackets the target, then secant steps in log-log
    pts = []
    for a in S.ALPHAS:
        kl, nb = klt(dict(cfg, a=a))
        pts.append((a, kl, nb))
        log(f"a={a:g}: KL {kl:.4e}")
        if kl >= target:
            break
    while pts[-1][1] < target and pts[-1][0] < S.ALPHAS[-1] * 2 ** SEARCH_STEPS:
        a = pts[-1][0] * 2  # past the sweep: coarser
        pts.append((a,) + klt(dict(cfg, a=a)))
        log(f"a={a:g}: KL {pts[-1][1]:.4e}")
    while pts[0][1] > target and pts[0][0] > S.ALPHAS[0] / 2 ** SEARCH_STEPS:
        a = pts[0][0] / 2  # before the sweep: finer
        pts.insert(0, (a,) + klt(dict(cfg, a=a)))
        log(f"a={a:g}: KL {pts[0][1]:.4e}")
    pts.sort()
    lo = max((p for p in pts if p[1] <= target), default=None)
    hi = min((p for p in pts if p[1] >= target), default=None)
    if lo is None or hi is None:
        sys.exit(f"fit_basis: the sweep a={S.ALPHAS[0]:g}..{S.ALPHAS[-1]:g} does not reach "
                 f"int4-g32's KL {target:.3e} (KL {pts[0][1]:.3e}..{pts[-1][1]:.3e})")
    best = min(pts, key=lambda p: abs(math.log(p[1] / target)))
    for _ in range(SEARCH_STEPS):
        if abs(math.log(best[1] / target)) <= KL_TOLERANCE or lo[0] == hi[0]:
            break
        f = (math.log(target) - math.log(lo[1])) / (math.log(hi[1]) - math.log(lo[1]))
        a = math.exp(math.log(lo[0]) + f * (math.log(hi[0]) - math.log(lo[0])))
        kl, nb = klt(dict(cfg, a=a))
        log(f"a={a:.5g}: KL {kl:.4e}")
        p = (a, kl, nb)
        if kl <= target:
            lo = p
        else:
            hi = p
        if abs(math.log(kl / target)) < abs(math.log(best[1] / target)):
            best = p
    a, kl, nb = best
    D = eng.head_dim
    int8 = S.int8_block_bytes(S.CTX, D) * L * H * len(docs)
    steps = [[{} for _ in range(H)] for _ in range(L)]
    for l in range(L):
        for h in range(H):
            for which in ("k", "v"):
                rms = bases[l][h][which][2]
                st = a * rms * layer_mult[l] * cfg[which + "_mult"]
                steps[l][h][which] = float(S.f16(min(max(st, FP16_MIN_NORMAL), FP16_MAX)))
    figures = {"target_kl": target, "a": a, "kl": kl, "ratio_int8": nb / int8,
               "bytes_per_token": nb / (len(docs) * S.CTX), "layer_mult": layer_mult,
               "k_mult": k_mult, "v_mult": v_mult}
    return bases, steps, figures


def basis_bytes(mid, bases, steps, L, H, D):
    """The .kvb file (access/codec/basis.h): header, sections, BLAKE2b-256."""
    idb = mid.encode()
    out = bytearray(MAGIC + struct.pack("<HHHHII", VERSION, 0, D, 0, L, H))
    out += idb + b"\0" * (ID_FIELD - len(idb))
    for l in range(L):
        for h in range(H):
            for which in ("k", "v"):
                F, Finv, _ = bases[l][h][which]
                fwd = np.ascontiguousarray(F, "<f4")
                inv = np.ascontiguousarray(Finv, np.float32).astype("<f2")
                assert fwd.shape == (D, D) and inv.shape == (D, D)
                assert np.isfinite(fwd).all() and np.isfinite(inv.astype(np.float32)).all()
                assert inv.astype(np.float32).tobytes() == np.asarray(Finv, "<f4").tobytes()
                out += struct.pack("<f", steps[l][h][which]) + fwd.tobytes() + inv.tobytes()
    out += hashlib.blake2b(bytes(out), digest_size=32).digest()
    return bytes(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="the trained model's folder")
    ap.add_argument("--out", required=True, help="the .kvb file to write")
    ap.add_argument("--docs", type=int, default=24, help="calibration chapters (default 24)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--model-id", help="the model's id, without its @rope- suffix (default: "
                    "the product's id of a trained folder)")
    ap.add_argument("--file", help="training text, chapters separated by blank lines "
                    "(default models/kjv/train.txt, else the bible program's training chapters)")
    args = ap.parse_args()
    if args.docs < 1 or args.threads < 1:
        sys.exit("fit_basis: --docs and --threads must be at least 1")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        sys.exit(f"fit_basis: --out {args.out}: {out_dir} is not a directory")
    t0 = time.time()
    torch.set_num_threads(args.threads)

    def log(msg):
        print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)

    try:
        eng, is_llama = load_model(args.model)
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"fit_basis: cannot load the model {args.model}: {e}")
    L, H, D = eng.n_layers, eng.kv_heads, eng.head_dim
    mid = model_id(args.model, args.model_id, is_llama, D)
    log(f"model {mid}: {L} layers, {H} KV heads of {D}")
    try:
        chapters, src = training_chapters(args.file)
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"fit_basis: no training text: {e} (give --file TEXT)")
    tok = train_models.Tokenizer(default_tokenizer(args.model), llama=is_llama)
    ids = calibration_ids(chapters, tok, args.docs)
    if not ids:
        sys.exit(f"fit_basis: no chapter of {src} has {S.CTX + S.CONT + 1} tokens")
    log(f"{len(ids)} calibration documents from {src} ({len(chapters)} chapters)")
    docs = [S.Doc(eng, is_llama, d) for d in ids]
    bases, steps, fig = fit(docs, eng, is_llama, S.Rans(), log)
    data = basis_bytes(mid, bases, steps, L, H, D)
    try:
        with open(args.out, "wb") as f:
            f.write(data)
    except OSError as e:
        sys.exit(f"fit_basis: cannot write {args.out}: {e}")
    bid = struct.unpack("<Q", data[-32:-24])[0]
    for which in ("k", "v"):
        s = [steps[l][h][which] for l in range(L) for h in range(H)]
        log(f"{which.upper()} steps {min(s):.5g}..{max(s):.5g} "
            f"(mult {fig[which + '_mult']:.3f})")
    log(f"a {fig['a']:.5g}: calibration KL {fig['kl']:.4e} (target {fig['target_kl']:.4e}), "
        f"{fig['bytes_per_token']:.1f} bytes per token, {fig['ratio_int8']:.3f} x int8")
    print(f"wrote {args.out}: model {mid}, basis {bid:016x}, {len(data)} bytes, "
          f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
