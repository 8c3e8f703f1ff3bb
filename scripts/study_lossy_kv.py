#!/usr/bin/env python3
"""Bytes against quality of lossy, entropy-coded K/V coders on the trained models' real K/V
(the study behind docs/benchmarks.md "Lossy entropy-coded K/V (CacheGen-style)").

usage: /usr/bin/python3 scripts/study_lossy_kv.py [--models opt-cloud,llama-cloud,...]
           [--docs N] [--kvedge build/clients/kvedge] [--json OUT] [--codec-lib LIB]
       /usr/bin/python3 scripts/study_lossy_kv.py --table OUT
  LIB, to code the KLT rows with the C codec and time its decode: after the build,
    gcc -shared -o /tmp/libkvcodec.so -Wl,--whole-archive build/access/codec/libkvedge_codec.a \
        -Wl,--no-whole-archive -llz4 -lxxhash -lsodium -lhtscodecs -lm

For each model and each of the first N held-out documents with at least 385 tokens (the
documents `kvedge eval` measures: models/kjv/heldout.ids for the OPT pair, the chapters of
models/kjv/heldout.txt tokenized by `kvedge tokenize` for the Llama-family pair, BOS first),
the first 256 tokens are the context and the next 128 are scored, as in `kvedge eval
--context 256 --continuation 128`. The reference is the continuation over the context's own
fp32 K/V; a coder replaces the context's K/V by its decoded values and the figure is the mean
KL(reference || coder) over all scored positions, in nats (kvedge eval's "kl").

Bytes are whole blocks (one per layer, KV head and 256-token chunk, as the store keeps them):
the 40 bytes of header and checksum, every parameter as fp16, and the code streams coded for
real with htscodecs' rANS-Nx16 (libhtscodecs through ctypes, order 0 or 1, whichever is
smaller, as ecbody.c would pick), an escape costing its symbol plus two raw bytes. Ratios are
to the same block at int8 stored plain (kvedge's int8: K per channel, V per token, whole
axis). int4-g32 is kvedge's min-max quantizer bit for bit (fp16 params, floor(x * inv +
0.5)); its bytes are given plain and coded as ec codes it (params striped in two byte streams,
codes one per byte, order 0).

The coders (all quantize each element to an integer q = round((x - m_c) / s_c), m_c the
channel's mean and s_c its step, both fp16 per (layer, KV head, K or V, channel, block)):
  ecsq-rel    s_c = a * std_c (every channel to the same relative precision)
  ecsq-abs    s_c = a * rms over the block (one absolute step: equal MSE per element)
  ecsq-w      s_c = a * rms / sqrt(w_c / mean w): K channels weighted by the context's mean
              squared query of that channel (the queries of the KV head's query heads, known to
              the cloud at prefill), V channels by the squared norm of W_o's column
  +layer      per-layer step multipliers from the measured per-layer sensitivity (equal KL
              per layer, s_l ~ KL_l^-1/2 at a probe step, geometric mean 1)
  +kv         K and V step multipliers likewise from the K-only and V-only KL
  klt         the components of a weighted KLT (model metadata, from calibration documents:
              K in the metric of the queries' second moment, V in that of W_o) at one step
              per block section, in access/codec/tcbody.h's format (layouts, bands, escapes)
  klt-pre     (Llama family) the same with K coded before its rotary turn and turned back
              after decoding; its metric the rotation-invariant part of the queries' moment
  klt-block   a per-block PCA whose basis travels in the block (int8 rows of the used
              components): self-contained, no model metadata
  delta-G     codes coded as token deltas of q (q_t - q_t-1 per channel, lossless on q, so no
              drift), an anchor (q itself) every G tokens
  cm          codes channel-major (a channel's tokens contiguous; order 1 then sees the
              previous token of the same channel)
  think-50    ThinK on top: half the key channels (largest mean |K| kept; rotate-half pairs
              for the Llama family) dropped, not coded
Each coder is swept over a; the frontier figure is the bytes at int4-g32's own KL (log-log
interpolation between the two sweep points around it). Needs Debian's python3-torch and numpy
and libhtscodecs.so.2; one thread (the machine is shared).
"""
import argparse
import ctypes
import ctypes.util
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
from train_adapter import load_model  # noqa: E402  (the engines without libkvedge)

CTX, CONT = 256, 128
HDR = 40  # header (32) + checksum (8) of a block without mask
# The step multipliers a each coder is swept over; the middle one is the sensitivity probe.
ALPHAS = (0.0625, 0.09, 0.125, 0.18, 0.25, 0.35, 0.5, 0.7, 1.0)

MODELS = {
    "opt-cloud": ("models/kjv/cloud/model.safetensors", "ids"),
    "opt-edge": ("models/kjv/edge/model.safetensors", "ids"),
    "llama-cloud": ("models/kjv/llama/cloud", "text"),
    "llama-edge": ("models/kjv/llama/edge", "text"),
}


# -- rANS-Nx16 through ctypes

class Rans:
    def __init__(self):
        name = ctypes.util.find_library("htscodecs") or "libhtscodecs.so.2"
        self.lib = ctypes.CDLL(name)
        self.lib.rans_compress_4x16.restype = ctypes.c_void_p
        self.lib.rans_compress_4x16.argtypes = [ctypes.c_char_p, ctypes.c_uint,
                                                ctypes.POINTER(ctypes.c_uint), ctypes.c_int]
        self.libc = ctypes.CDLL(ctypes.util.find_library("c"))
        self.libc.free.argtypes = [ctypes.c_void_p]

    def size(self, data, order):
        data = bytes(data)
        n = ctypes.c_uint(0)
        p = self.lib.rans_compress_4x16(data, len(data), ctypes.byref(n), order)
        if not p:
            raise RuntimeError("rans_compress_4x16 failed")
        self.libc.free(p)
        return n.value

    def best(self, data):
        """Bytes of the smaller of order 0 and order 1 (a stored section is never larger than
        its bytes plus a CAT header), plus the 5 bytes of an ec record."""
        return 5 + min(self.size(data, 0), self.size(data, 1), len(data) + 6)


class TcLib:
    """access/codec/tcbody.c through ctypes (a shared build of libkvedge_codec.a, see the
    usage line): the KLT rows then code and decode with the C codec itself."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        f = self.lib
        f.kvedge_tc_bound.restype = ctypes.c_size_t
        f.kvedge_tc_bound.argtypes = [ctypes.c_void_p]
        f.kvedge_tc_encode.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                       ctypes.c_float, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.POINTER(ctypes.c_size_t)]
        f.kvedge_tc_decode.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_void_p, ctypes.c_void_p]

    def time_decode(self, sections, reps=7):
        """Decode speed over sections [(x, fwd, inv, step)]: the best of reps passes that
        decode every section (the machine is shared), beside the best copy of the same output
        bytes; coded and output bytes."""
        coded = []
        for x, fwd, inv, step in sections:
            T, D = x.shape
            shape = (ctypes.c_uint32 * 2)(T, D)
            cap = self.lib.kvedge_tc_bound(shape)
            buf = ctypes.create_string_buffer(cap)
            n = ctypes.c_size_t(0)
            xx = np.ascontiguousarray(x, np.float32)
            ff = np.ascontiguousarray(fwd, np.float32)
            if self.lib.kvedge_tc_encode(shape, xx.ctypes.data, ff.ctypes.data, step, buf, cap,
                                         ctypes.byref(n)):
                raise RuntimeError("kvedge_tc_encode")
            coded.append((shape, buf, n.value, np.ascontiguousarray(inv, np.float32),
                          np.empty_like(xx), np.empty_like(xx), xx))
        dec, cpy = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            for shape, buf, n, inv, out, _, _ in coded:
                self.lib.kvedge_tc_decode(shape, buf, n, inv.ctypes.data, out.ctypes.data)
            t1 = time.perf_counter()
            for _, _, _, _, _, dst, src in coded:
                np.copyto(dst, src)
            t2 = time.perf_counter()
            dec.append(t1 - t0)
            cpy.append(t2 - t1)
        return (min(dec), min(cpy), sum(c[2] for c in coded),
                sum(c[6].nbytes for c in coded))

    def code(self, x, fwd, inv, step):
        """(decoded x, section bytes) of x [T][D] fp32."""
        T, D = x.shape
        shape = (ctypes.c_uint32 * 2)(T, D)
        x = np.ascontiguousarray(x, np.float32)
        fwd = np.ascontiguousarray(fwd, np.float32)
        inv = np.ascontiguousarray(inv, np.float32)
        cap = self.lib.kvedge_tc_bound(shape)
        buf = ctypes.create_string_buffer(cap)
        n = ctypes.c_size_t(0)
        rc = self.lib.kvedge_tc_encode(shape, x.ctypes.data, fwd.ctypes.data, step, buf, cap,
                                       ctypes.byref(n))
        if rc != 0:
            raise RuntimeError(f"kvedge_tc_encode: {rc}")
        out = np.empty_like(x)
        rc = self.lib.kvedge_tc_decode(shape, buf, n.value, inv.ctypes.data, out.ctypes.data)
        if rc != 0:
            raise RuntimeError(f"kvedge_tc_decode: {rc}")
        return out, n.value


class Zstd:
    """libzstd through ctypes: frame sizes and decode of byte streams."""

    def __init__(self):
        self.lib = ctypes.CDLL(ctypes.util.find_library("zstd") or "libzstd.so.1")
        self.lib.ZSTD_compressBound.restype = ctypes.c_size_t
        self.lib.ZSTD_compressBound.argtypes = [ctypes.c_size_t]
        self.lib.ZSTD_compress.restype = ctypes.c_size_t
        self.lib.ZSTD_compress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p,
                                           ctypes.c_size_t, ctypes.c_int]
        self.lib.ZSTD_decompress.restype = ctypes.c_size_t
        self.lib.ZSTD_decompress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p,
                                             ctypes.c_size_t]

    def compress(self, data, level):
        cap = self.lib.ZSTD_compressBound(len(data))
        buf = ctypes.create_string_buffer(cap)
        n = self.lib.ZSTD_compress(buf, cap, data, len(data), level)
        return buf.raw[:n]


def coder_compare(docs, bases, kbest, a, rans, zstd, reps=5):
    """The code streams of the KLT sections at step a coded by rANS-Nx16 (order 0/1, the
    smaller) and by zstd -3 and -19, in each section's smallest layout for that coder: total
    bytes and decode seconds (best of reps passes, one core)."""
    lib = rans.lib
    lib.rans_uncompress_4x16.restype = ctypes.c_void_p
    lib.rans_uncompress_4x16.argtypes = [ctypes.c_char_p, ctypes.c_uint,
                                         ctypes.POINTER(ctypes.c_uint)]
    streams = {"rans": [], "zstd-3": [], "zstd-19": []}

    def enc(coder, b):
        if coder == "rans":
            outs = []
            for order in (0, 1):
                n = ctypes.c_uint(0)
                p = lib.rans_compress_4x16(b, len(b), ctypes.byref(n), order)
                outs.append(ctypes.string_at(p, n.value))
                rans.libc.free(p)
            return min(outs, key=len)
        return zstd.compress(b, 3 if coder == "zstd-3" else 19)
    for d in docs:
        for l in range(len(d.k)):
            for h in range(d.k[l].shape[0]):
                for which in ("k", "v"):
                    t = (d.k if which == "k" else d.v)[l][h]
                    F, _, rms = bases[l][h][which]
                    st = float(f16(a * rms * kbest["layer_mult"][l] * kbest[which + "_mult"]))
                    m = f16(t.astype(np.float64).mean(0))
                    q = np.floor(((t - m) @ F) * np.float32(1.0 / st) + np.float32(0.5))
                    q = q.astype(np.int64)
                    nz = np.flatnonzero(np.abs(q).max(0) > 0)
                    if len(nz) == 0:
                        continue
                    R, D = int(nz.max()) + 1, q.shape[1]
                    z = np.where(q[:, :R] >= 0, 2 * q[:, :R], -2 * q[:, :R] - 1)
                    sym = np.where(z >= 255, 255, z).astype(np.uint8)
                    cuts = [min(c, R) for c in (0, D // 8, D // 4, D // 2, D)]
                    layouts = [[sym], [sym.T],
                               [sym[:, x:y].T for x, y in zip(cuts, cuts[1:]) if y > x]]
                    for coder in streams:
                        best = min(([(enc(coder, np.ascontiguousarray(p).tobytes()), p.size)
                                     for p in lay] for lay in layouts),
                                   key=lambda ss: sum(len(x[0]) + 4 for x in ss))
                        streams[coder] += best
    out = {}
    for coder, ss in streams.items():
        times = []
        dst = ctypes.create_string_buffer(max(n for _, n in ss))
        for _ in range(reps):
            t0 = time.perf_counter()
            for c, n in ss:
                if coder == "rans":
                    m = ctypes.c_uint(0)
                    p = lib.rans_uncompress_4x16(c, len(c), ctypes.byref(m))
                    rans.libc.free(p)
                else:
                    zstd.lib.ZSTD_decompress(dst, n, c, len(c))
            times.append(time.perf_counter() - t0)
        out[coder] = {"bytes": sum(len(c) + 4 for c, _ in ss), "symbols": sum(n for _, n in ss),
                      "decode_s": min(times), "streams": len(ss)}
        out[coder]["symbols_mb_s"] = out[coder]["symbols"] / out[coder]["decode_s"] / 1e6
    return out


def tc_section_bytes(q, rans):
    """Bytes of a section as kvedge_tc_encode writes it (access/codec/tcbody.h) for codes q
    [T][D]: head and fp16 means, and when R > 0 the smallest layout (token-major,
    component-major, four bands), each stream at the smaller of orders 0 and 1 with its length,
    then the escape count and the escapes."""
    T, D = q.shape
    head = 5 + 2 * D
    nz = np.flatnonzero(np.abs(q).max(0) > 0)
    if len(nz) == 0:
        return head
    R = int(nz.max()) + 1
    z = np.where(q[:, :R] >= 0, 2 * q[:, :R], -2 * q[:, :R] - 1)
    esc = int((z >= 255).sum())
    sym = np.where(z >= 255, 255, z).astype(np.uint8)

    def stream(a):
        b = np.ascontiguousarray(a).tobytes()
        return 4 + min(rans.size(b, 0), rans.size(b, 1))
    cuts = [min(c, R) for c in (0, D // 8, D // 4, D // 2, D)]
    best = min(stream(sym), stream(sym.T),
               sum(stream(sym[:, a:b].T) for a, b in zip(cuts, cuts[1:]) if b > a))
    return head + best + 4 + 2 * esc


RANS = None


def code_bytes(q, rans):
    """Bytes of an integer array coded as one byte stream: zigzag symbols 0..254, 255 an
    escape followed by two raw bytes."""
    z = np.where(q >= 0, 2 * q, -2 * q - 1).astype(np.int64).ravel()
    esc = z >= 255
    sym = np.where(esc, 255, z).astype(np.uint8)
    return rans.best(sym.tobytes()) + 2 * int(esc.sum())


# -- the models' K/V

def documents(name, path, kind, n_docs, kvedge):
    need = CTX + CONT + 1
    docs = []
    if kind == "ids":
        with open(os.path.join(ROOT, "models/kjv/heldout.ids")) as f:
            text = f.read()
        cur = []
        for line in text.split("\n"):
            if not line.strip():
                if cur:
                    docs.append(cur)
                cur = []
            else:
                cur += [int(t) for t in line.split()]
        if cur:
            docs.append(cur)
        docs = [d for d in docs if len(d) >= need]
        return docs[:n_docs]
    with open(os.path.join(ROOT, "models/kjv/heldout.txt"), "rb") as f:
        text = f.read()
    for piece in text.split(b"\n\n"):
        if not piece.strip():
            continue
        out = subprocess.run([kvedge, "tokenize", "--tokenizer", os.path.join(ROOT, path)],
                             input=piece + b"\n\n", capture_output=True, check=True)
        ids = [int(t) for t in out.stdout.split()]
        if len(ids) >= need:
            docs.append(ids)
        if len(docs) == n_docs:
            break
    return docs


class Doc:
    """One document's context K/V ([layers] of [kv_heads][CTX][hd] fp32), per-channel
    weights, and the reference log-probabilities of its continuation."""

    def __init__(self, eng, is_llama, ids):
        self.eng, self.cont = eng, ids[CTX:CTX + CONT]
        x = eng._embed(ids[:CTX], 0)
        self.k, self.v, self.wk = [], [], []
        group = eng.heads // eng.kv_heads
        for l in range(eng.n_layers):
            L = eng.layers[l]
            if is_llama:
                q = eng._rotate(eng._lin(eng._rms(x, L["ln1"]), L["q"], L["bq"]), eng.heads, 0)
            else:
                q = eng._split(eng._lin(eng._ln(x, L["ln1"]), L["q"]))
            qs = (q * eng.scale).double()
            q2 = qs.pow(2).mean(1)  # [heads][hd]
            self.wk.append(q2.reshape(eng.kv_heads, group, -1).sum(1).float().numpy())
            qq = torch.einsum("hni,hnj->hij", qs, qs) / qs.shape[1]
            self.qq = getattr(self, "qq", []) + [
                qq.reshape(eng.kv_heads, group, eng.head_dim, eng.head_dim).sum(1).numpy()]
            x, k, v = eng._layer(l, x, 0)
            self.k.append(k.numpy().copy())
            self.v.append(v.numpy().copy())
        self.ref = self.logp(self.k, self.v)
        self.rope = None
        if is_llama:  # K before its rotary turn (the decoder knows every position's angle)
            ang = np.arange(CTX, dtype=np.float64)[:, None] * eng.inv_freq.double().numpy()
            self.rope = (np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32))
            self.kpre = [np.stack([self.turn(k, -1) for k in kl]) for kl in self.k]

    def turn(self, k, sign):
        """K [T][D] turned by +-(position x inv_freq), rotate-half pairs (i, i + D/2)."""
        cos, sin = self.rope
        half = k.shape[1] // 2
        x1, x2 = k[:, :half], k[:, half:]
        return np.concatenate([x1 * cos - sign * x2 * sin, x2 * cos + sign * x1 * sin], 1)

    @torch.no_grad()
    def logp(self, ks, vs):
        eng = self.eng
        x = eng._embed(self.cont, CTX)
        for l in range(eng.n_layers):
            x, _, _ = eng._layer(l, x, CTX, torch.from_numpy(ks[l]), torch.from_numpy(vs[l]))
        return torch.log_softmax(eng._logits(x).double(), -1)

    def kl(self, ks, vs):
        lq = self.logp(ks, vs)
        return float((self.ref.exp() * (self.ref - lq)).sum(-1).mean())


def wv_of(eng, is_llama):
    """Per layer [kv_heads][hd]: squared norms of W_o's columns, summed over the query heads
    that read each KV head."""
    out, group = [], eng.heads // eng.kv_heads
    for L in eng.layers:
        wo = L["o"] if is_llama else L["o"][0]
        c2 = wo.pow(2).sum(0).reshape(eng.heads, eng.head_dim)
        out.append(c2.reshape(eng.kv_heads, group, -1).sum(1).numpy())
    return out


# -- kvedge's own quantizers, bit for bit

def f16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def minmax(x, axis_groups, bits):
    """x [n_groups][group_len]: kvedge's min-max quantization of each row; dequantized."""
    qmax = float((1 << bits) - 1)
    lo, hi = x.min(1, keepdims=True), x.max(1, keepdims=True)
    s, m = f16((hi - lo) / np.float32(qmax)), f16(lo)
    inv = np.where(s > 0, np.float32(1) / np.where(s > 0, s, 1), 0).astype(np.float32)
    c = np.clip(np.floor((x - m) * inv + np.float32(0.5)), 0, qmax).astype(np.float32)
    return c * s + m, c


def kvedge_quant(t, is_key, bits, g):
    """t [T][D] one head's K or V; kvedge's int8 (g 0) or int4-gG. Returns (dequant, codes,
    params as fp16 pair count)."""
    T, D = t.shape
    if is_key:  # per channel over groups of g tokens
        g = T if g == 0 or g >= T else g
        x = t.T.reshape(D, T // g, g).reshape(-1, g)
        dq, c = minmax(x, None, bits)
        dq = dq.reshape(D, T).T
        c = c.reshape(D, T).T
        np_ = D * (T // g)
    else:
        g = D if g == 0 or g >= D else g
        x = t.reshape(T * (D // g), g)
        dq, c = minmax(x, None, bits)
        dq, c = dq.reshape(T, D), c.reshape(T, D)
        np_ = T * (D // g)
    return dq, c.astype(np.int64), np_


def int8_block_bytes(T, D):
    return HDR + D * 4 + T * 4 + 2 * T * D


def scheme_minmax(doc, bits, g, rans):
    """kvedge int8 / int4-gG: (ks, vs, plain bytes, ec bytes)."""
    ks, vs, plain, ec = [], [], 0, 0
    for l in range(len(doc.k)):
        kl, vl = np.empty_like(doc.k[l]), np.empty_like(doc.v[l])
        for h in range(doc.k[l].shape[0]):
            T, D = doc.k[l][h].shape
            dk, ck, pk = kvedge_quant(doc.k[l][h], True, bits, g)
            dv, cv, pv = kvedge_quant(doc.v[l][h], False, bits, g)
            kl[h], vl[h] = dk, dv
            row = D if bits == 8 else (D + 1) // 2
            plain += HDR + 4 * (pk + pv) + 2 * T * row
            if rans is not None:
                ec += HDR + params_ec_bytes(doc.k[l][h], doc.v[l][h], bits, g, rans)
                ec += rans.best(ck.astype(np.uint8).tobytes()) + rans.best(
                    cv.astype(np.uint8).tobytes())
        ks.append(kl)
        vs.append(vl)
    return ks, vs, plain, ec


def params_ec_bytes(k, v, bits, g, rans):
    """The fp16 params of one block coded as ec codes them: per section, the high bytes and
    the low bytes as two order-0 streams."""
    out = 0
    qmax = float((1 << bits) - 1)
    for t, is_key in ((k, True), (v, False)):
        T, D = t.shape
        if is_key:
            gg = T if g == 0 or g >= T else g
            x = t.T.reshape(-1, gg)
        else:
            gg = D if g == 0 or g >= D else g
            x = t.reshape(-1, gg)
        lo, hi = x.min(1), x.max(1)
        pairs = np.stack([((hi - lo) / np.float32(qmax)).astype(np.float16),
                          lo.astype(np.float16)], 1).ravel()
        b = pairs.view(np.uint8).reshape(-1, 2)
        out += 5 + 2 + min(rans.size(b[:, 0].tobytes(), 0) + rans.size(b[:, 1].tobytes(), 0),
                           pairs.nbytes + 4)
    return out


# -- the lossy coders

def think_keep(k, keep_frac, is_llama):
    """Key channels ThinK keeps for one head [T][D] (largest mean |K|; pairs for rotary)."""
    D = k.shape[1]
    score = np.abs(k).mean(0)
    if is_llama:
        half = D // 2
        ps = score[:half] + score[half:]
        top = np.argsort(-ps, kind="stable")[:int(round(half * keep_frac))]
        mask = np.zeros(D, bool)
        mask[top] = mask[top + half] = True
        return mask
    top = np.argsort(-score, kind="stable")[:int(round(D * keep_frac))]
    mask = np.zeros(D, bool)
    mask[top] = True
    return mask


def ecsq_head(t, step, delta_g, channel_major, rans):
    """One head's K or V [T][D] at per-channel steps step[D] (fp16): (dequant, bytes)."""
    m = f16(t.mean(0))
    s = f16(np.maximum(step, 1e-7))
    q = np.rint((t - m) / s).astype(np.int64)
    dq = (q * s + m).astype(np.float32)
    c = q
    if delta_g:
        c = q.copy()
        prev = np.roll(q, 1, 0)
        anchor = (np.arange(q.shape[0]) % delta_g) == 0
        c[~anchor] = (q - prev)[~anchor]
    if channel_major:
        c = c.T
    return dq, 4 * t.shape[1] + code_bytes(c, rans)


def scheme_ecsq(doc, cfg, rans, is_llama):
    """cfg: mode rel|abs|w, a, layer_mult[l], k_mult, v_mult, delta_g, cm, think,
    only_layer, only (None|'k'|'v'). Returns (ks, vs, bytes)."""
    ks, vs, total = [], [], 0
    for l in range(len(doc.k)):
        kl, vl = doc.k[l].copy(), doc.v[l].copy()
        lm = cfg["layer_mult"][l] if cfg.get("layer_mult") else 1.0
        for h in range(doc.k[l].shape[0]):
            T, D = doc.k[l][h].shape
            blk = HDR
            for which in ("k", "v"):
                t = doc.k[l][h] if which == "k" else doc.v[l][h]
                if cfg.get("only_layer") is not None and cfg["only_layer"] != l:
                    continue
                if cfg.get("only") and cfg["only"] != which:
                    continue
                mask = np.ones(D, bool)
                if which == "k" and cfg.get("think"):
                    mask = think_keep(t, cfg["think"], is_llama)
                tt = t[:, mask]
                mult = cfg["a"] * lm * cfg.get(which + "_mult", 1.0)
                if cfg["mode"] == "rel":
                    step = mult * tt.std(0)
                else:
                    rms = float(np.sqrt(np.mean((tt - tt.mean(0)) ** 2)))
                    step = np.full(tt.shape[1], mult * rms, np.float32)
                    if cfg["mode"] == "w":
                        w = (doc.wk[l][h] if which == "k" else cfg["wv"][l][h])[mask]
                        step = step / np.sqrt(w / w.mean())
                dq, nb = ecsq_head(tt, step.astype(np.float32), cfg.get("delta_g", 0),
                                   cfg.get("cm", False), rans)
                out = np.zeros_like(t)
                out[:, mask] = dq
                if which == "k":
                    kl[h] = out
                else:
                    vl[h] = out
                blk += nb + (8 if not mask.all() else 0)
            total += blk
        ks.append(kl)
        vs.append(vl)
    return ks, vs, total


def sqrtm_sym(m, inv=False):
    w, u = np.linalg.eigh(m)
    w = np.maximum(w, 1e-12)
    return (u * (w ** (-0.5 if inv else 0.5))) @ u.T


def pair_isotropic(M):
    """The part of a query moment M [D][D] that does not change when both sides turn by the
    same rotary angles: in each 2x2 block between rotate-half pairs i and j, a*I + b*J. The
    metric of a pre-rotary K (a query and a key meet at a relative angle that varies)."""
    h = M.shape[0] // 2
    out = np.zeros_like(M)
    a = (M[:h, :h] + M[h:, h:]) / 2
    b = (M[h:, :h] - M[:h, h:]) / 2
    out[:h, :h] = out[h:, h:] = a
    out[h:, :h] = b
    out[:h, h:] = -b
    return out


def klt_bases(docs, wv_full, ridge=1e-3, weighted=True, pre=False):
    """Per layer, KV head and K/V: (F, Finv, rms) with y = (x - m) F the components of x in
    the metric of its effect (K: the queries' second moment E[q q^T] of the query heads that
    read it; V: W_o's columns' Gram matrix), in falling variance; rms the components' rms.
    Computed on calibration documents (not those measured): model metadata, not per block."""
    L, H = len(docs[0].k), docs[0].k[0].shape[0]
    out = []
    for l in range(L):
        per_h = []
        for h in range(H):
            pair = {}
            for which in ("k", "v"):
                ks = [d.kpre if pre else d.k for d in docs]
                xs = [(k if which == "k" else d.v)[l][h].astype(np.float64)
                      for k, d in zip(ks, docs)]
                C = sum(np.cov(x.T, bias=True) for x in xs) / len(xs)
                M = sum(d.qq[l][h] for d in docs) / len(docs) if which == "k" else wv_full[l][h]
                if pre and which == "k":
                    M = pair_isotropic(M)
                if not weighted:
                    M = np.eye(M.shape[0])
                M = M + ridge * np.trace(M) / M.shape[0] * np.eye(M.shape[0])
                S, Si = sqrtm_sym(M), sqrtm_sym(M, inv=True)
                w, U = np.linalg.eigh(S @ C @ S)
                U = U[:, ::-1]
                # The decoder's matrix is stored as fp16; the encoder uses its exact inverse.
                Finv = f16(U.T @ Si)
                F = np.linalg.inv(Finv.astype(np.float64)).astype(np.float32)
                pair[which] = (F, Finv, float(np.sqrt(max(w.mean(), 1e-30))))
            per_h.append(pair)
        out.append(per_h)
    return out


def wv_full_of(eng, is_llama):
    """Per layer [kv_heads] of D x D: sum over the query heads reading a KV head of W_o's
    column block's Gram matrix."""
    out, group, D = [], eng.heads // eng.kv_heads, eng.head_dim
    for L in eng.layers:
        wo = (L["o"] if is_llama else L["o"][0]).double()
        per = []
        for h in range(eng.kv_heads):
            g = sum(wo[:, (h * group + j) * D:(h * group + j + 1) * D].T @
                    wo[:, (h * group + j) * D:(h * group + j + 1) * D] for j in range(group))
            per.append(g.numpy())
        out.append(per)
    return out


def scheme_klt(doc, cfg, rans):
    """Weighted KLT (cfg["bases"]) + uniform quantization of the components at one step per
    block section (a * rms * layer and K/V multipliers), in tcbody.h's section format: coded
    by the C codec when cfg["tc"] is given, else by its mirror here (tc_section_bytes)."""
    ks, vs, total = [], [], 0
    for l in range(len(doc.k)):
        kl, vl = doc.k[l].copy(), doc.v[l].copy()
        lm = cfg["layer_mult"][l] if cfg.get("layer_mult") else 1.0
        for h in range(doc.k[l].shape[0]):
            blk = HDR
            for which in ("k", "v"):
                if cfg.get("only_layer") is not None and cfg["only_layer"] != l:
                    continue
                if cfg.get("only") and cfg["only"] != which:
                    continue
                pre = cfg.get("pre") and which == "k"
                t = (doc.kpre if pre else doc.k)[l][h] if which == "k" else doc.v[l][h]
                F, Finv, rms = cfg["bases"][l][h][which]
                st = float(f16(cfg["a"] * rms * lm * cfg.get(which + "_mult", 1.0)))
                if cfg.get("tc"):
                    out, nb = cfg["tc"].code(t, F, Finv, st)
                else:
                    m = f16(t.astype(np.float64).mean(0))
                    y = (t - m) @ F
                    q = np.floor(y * np.float32(1.0 / st) + np.float32(0.5)).astype(np.int64)
                    out = (q * np.float32(st)).astype(np.float32) @ Finv + m
                    nb = tc_section_bytes(q, rans)
                if pre:
                    out = doc.turn(out, +1)
                if which == "k":
                    kl[h] = out
                else:
                    vl[h] = out
                blk += nb
            total += blk
        ks.append(kl)
        vs.append(vl)
    return ks, vs, total


def scheme_klt_block(doc, cfg, rans):
    """A self-contained variant: each block section's own PCA (no weighting: the node that
    derives a block from a lossless one has no queries), its basis in the block. The rows of
    the used components (any code non-zero) are stored as int8 with one fp16 scale per row;
    the decoder reconstructs with those rows. Step a * rms of the components."""
    ks, vs, total = [], [], 0
    for l in range(len(doc.k)):
        kl, vl = doc.k[l].copy(), doc.v[l].copy()
        lm = cfg["layer_mult"][l] if cfg.get("layer_mult") else 1.0
        for h in range(doc.k[l].shape[0]):
            blk = HDR
            for which in ("k", "v"):
                t = doc.k[l][h] if which == "k" else doc.v[l][h]
                D = t.shape[1]
                m = f16(t.mean(0))
                x = (t - m).astype(np.float64)
                w, U = np.linalg.eigh(x.T @ x / x.shape[0])
                U = U[:, ::-1]
                y = x @ U
                rms = float(np.sqrt(max(w.mean(), 1e-30)))
                st = float(f16(cfg["a"] * rms * lm * cfg.get(which + "_mult", 1.0)))
                q = np.rint(y / st).astype(np.int64)
                used = np.flatnonzero(np.abs(q).max(0) > 0)
                rs = np.abs(U[:, used]).max(0) / 127.0
                U8 = np.rint(U[:, used] / rs) * f16(rs)
                out = (q[:, used] * st) @ U8.T + m
                if which == "k":
                    kl[h] = out.astype(np.float32)
                else:
                    vl[h] = out.astype(np.float32)
                qb = np.zeros_like(q)
                qb[:, :len(used)] = q[:, used]
                blk += 1 + len(used) * (D + 2) + tc_section_bytes(qb, rans)
            total += blk
        ks.append(kl)
        vs.append(vl)
    return ks, vs, total


def measure(docs, fn):
    """Mean KL over all positions and total bytes of a scheme over the documents."""
    kl, nb = 0.0, 0
    for d in docs:
        ks, vs, b = fn(d)[:3]
        kl += d.kl(ks, vs)
        nb += b
    return kl / len(docs), nb


def equal_kl_mults(kls):
    """Step multipliers that equalize measured KLs (s ~ KL^-1/2), geometric mean 1: the
    +layer and +kv multipliers from the KL of each layer (or of K and of V) coded alone."""
    m = [max(v, 1e-12) ** -0.5 for v in kls]
    gm = math.exp(sum(math.log(x) for x in m) / len(m))
    return [x / gm for x in m]


def interp_bytes(points, target):
    """Bytes at KL = target on a sweep [(kl, bytes)] by log-log interpolation; None when the
    sweep does not bracket it."""
    pts = sorted(points)
    for (k0, b0), (k1, b1) in zip(pts, pts[1:]):
        if k0 <= target <= k1 and k0 > 0:
            f = (math.log(target) - math.log(k0)) / (math.log(k1) - math.log(k0))
            return math.exp(math.log(b0) + f * (math.log(b1) - math.log(b0)))
    return None


def study(name, n_docs, kvedge, rans, alphas, tc=None):
    path, kind = MODELS[name]
    eng, is_llama = load_model(os.path.join(ROOT, path))
    ids = documents(name, path, kind, n_docs, kvedge)
    t0 = time.time()
    docs = [Doc(eng, is_llama, d) for d in ids]
    L, H, D = eng.n_layers, eng.kv_heads, eng.head_dim
    int8_bytes = int8_block_bytes(CTX, D) * L * H * len(docs)
    res = {"model": name, "documents": len(docs), "positions": len(docs) * CONT,
           "layers": L, "kv_heads": H, "head_dim": D,
           "int8_block_bytes": int8_block_bytes(CTX, D), "rows": []}

    def row(label, kl, nb, extra=None):
        r = {"coder": label, "kl": kl, "bytes_per_token": nb / (len(docs) * CTX),
             "ratio_int8": nb / int8_bytes}
        if extra:
            r.update(extra)
        res["rows"].append(r)
        print(f"{name:12s} {label:40s} KL {kl:.3e}  bytes/token {r['bytes_per_token']:8.1f}  "
              f"x int8 {r['ratio_int8']:.3f}", flush=True)
        return r

    for bits, g, lab in ((8, 0, "int8"), (4, 32, "int4-g32")):
        kl, tot, ec = 0.0, 0, 0
        for d in docs:
            ks, vs, p, e = scheme_minmax(d, bits, g, rans)
            kl += d.kl(ks, vs)
            tot += p
            ec += e
        kl /= len(docs)
        row(lab, kl, tot)
        row(lab + "+ec", kl, ec)
        if lab == "int4-g32":
            target = kl
    res["target_kl"] = target
    wv = wv_of(eng, is_llama)
    res["frontier"] = {}

    def sweep(label, fn):
        """fn(doc, a) -> (ks, vs, bytes) swept over alphas; the bytes at the target KL."""
        pts = []
        for a in alphas:
            kl, nb = measure(docs, lambda d: fn(d, a))
            row(f"{label} a={a:g}", kl, nb, {"sweep": label, "a": a})
            pts.append((kl, nb))
        b = interp_bytes(pts, target)
        res["frontier"][label] = None if b is None else b / int8_bytes
        print(f"{name:12s} {label:40s} at int4-g32's KL: "
              f"{'out of the sweep' if b is None else f'{b / int8_bytes:.3f} x int8'}",
              flush=True)

    def sensitivity(label, fn):
        """KL with only layer l coded (each l), with only K and only V, at the probe step;
        the step multipliers that equalize them (s ~ KL^-1/2, geometric mean 1)."""
        probe = alphas[len(alphas) // 2]
        lay = [measure(docs, lambda d: fn(d, dict(a=probe, only_layer=l)))[0]
               for l in range(L)]
        kv = [measure(docs, lambda d: fn(d, dict(a=probe, only=w)))[0] for w in ("k", "v")]
        res.setdefault("sensitivity", {})[label] = {"probe_a": probe, "layer_kl": lay,
                                                    "k_kl": kv[0], "v_kl": kv[1]}
        print(f"{name:12s} {label} sensitivity at a={probe}: layers "
              f"{['%.2e' % x for x in lay]} K {kv[0]:.2e} V {kv[1]:.2e}", flush=True)

        km, vm = equal_kl_mults(kv)
        return equal_kl_mults(lay), km, vm

    def ecsq(base):
        return lambda d, c: scheme_ecsq(d, dict(base, wv=wv, **(c if isinstance(c, dict)
                                                                 else {"a": c})), rans,
                                        is_llama)

    sweep("ecsq-rel", ecsq({"mode": "rel"}))
    sweep("ecsq-abs", ecsq({"mode": "abs"}))
    sweep("ecsq-w", ecsq({"mode": "w"}))
    lm, km, vm = sensitivity("ecsq-w", ecsq({"mode": "w"}))
    best = {"mode": "w", "layer_mult": lm, "k_mult": km, "v_mult": vm}
    sweep("ecsq-w+layer", ecsq({"mode": "w", "layer_mult": lm}))
    sweep("ecsq-w+layer+kv", ecsq(best))
    sweep("ecsq-w+layer+kv delta-256", ecsq(dict(best, delta_g=CTX)))
    sweep("ecsq-w+layer+kv delta-16", ecsq(dict(best, delta_g=16)))
    sweep("ecsq-w+layer+kv cm", ecsq(dict(best, cm=True)))
    sweep("ecsq-w+layer+kv think-50", ecsq(dict(best, think=0.5)))

    # KLT bases from calibration documents after the measured ones (model metadata)
    cal_ids = documents(name, path, kind, 2 * n_docs, kvedge)[len(ids):]
    cal = [Doc(eng, is_llama, d) for d in cal_ids] or docs
    wvf = wv_full_of(eng, is_llama)
    bases = klt_bases(cal, wvf)
    ubases = klt_bases(cal, wvf, weighted=False)
    res["klt_calibration_documents"] = len(cal_ids)
    res["klt_basis_bytes_per_model"] = L * H * 2 * D * D * 2

    def klt(base, b):
        return lambda d, c: scheme_klt(d, dict(base, bases=b, tc=tc, **(c if isinstance(c, dict)
                                                                   else {"a": c})), rans)

    sweep("klt-unweighted", klt({}, ubases))
    sweep("klt", klt({}, bases))
    lm2, km2, vm2 = sensitivity("klt", klt({}, bases))
    kbest = {"layer_mult": lm2, "k_mult": km2, "v_mult": vm2}
    sweep("klt+layer", klt({"layer_mult": lm2}, bases))
    sweep("klt+layer+kv", klt(kbest, bases))
    if is_llama:  # K coded before its rotary turn
        pbases = klt_bases(cal, wvf, pre=True)
        sweep("klt-pre", klt({"pre": True}, pbases))
        lm3, km3, vm3 = sensitivity("klt-pre", klt({"pre": True}, pbases))
        sweep("klt-pre+layer+kv", klt({"pre": True, "layer_mult": lm3, "k_mult": km3,
                                       "v_mult": vm3}, pbases))
    sweep("klt-block", lambda d, a: scheme_klt_block(d, {"a": a}, rans))
    sweep("klt-block+layer+kv", lambda d, a: scheme_klt_block(d, dict(kbest, a=a), rans))
    pts = [r for r in res["rows"] if r.get("sweep") == "klt+layer+kv"]
    a_near = min(pts, key=lambda r: abs(math.log(r["kl"] / target)))["a"]
    res["coders"] = coder_compare(docs, bases, kbest, a_near, rans, Zstd())
    res["coders"]["a"] = a_near
    print(f"{name:12s} coders at a={a_near:g}: " + json.dumps(res["coders"]), flush=True)
    if tc is not None:  # decode speed at the sweep point nearest the target KL
        pts = [r for r in res["rows"] if r.get("sweep") == "klt+layer+kv"]
        a = min(pts, key=lambda r: abs(math.log(r["kl"] / target)))["a"]
        secs = []
        for d in docs[:2]:
            for l in range(L):
                for h in range(H):
                    for which in ("k", "v"):
                        F, Finv, rms = bases[l][h][which]
                        mult = kbest["layer_mult"][l] * kbest[which + "_mult"]
                        secs.append(((d.k if which == "k" else d.v)[l][h], F, Finv,
                                     float(f16(a * rms * mult))))
        dec, cpy, coded, outb = tc.time_decode(secs)
        toks = 2 * CTX * L * H  # (token, layer, KV head) rows decoded
        res["decode"] = {"a": a, "sections": len(secs), "coded_bytes": coded,
                         "fp32_out_bytes": outb, "decode_s": dec, "copy_s": cpy,
                         "coded_mb_s": coded / dec / 1e6, "out_mb_s": outb / dec / 1e6,
                         "ns_per_row": dec / toks * 1e9, "decode_over_copy": dec / cpy}
        print(f"{name:12s} decode at a={a:g}: {coded / dec / 1e6:.1f} MB/s coded in, "
              f"{outb / dec / 1e6:.1f} MB/s fp32 out, {dec / cpy:.1f}x a copy of the output",
              flush=True)
    res["seconds"] = time.time() - t0
    return res


def ec_decode_us_per_byte():
    """KVEDGE_PREC_EC_DECODE_US_PER_BYTE_INT4 of access/codec/prec.h: int4-g32+ec's measured
    decode time per byte received."""
    import re
    with open(os.path.join(ROOT, "access/codec/prec.h")) as f:
        return float(re.search(r"KVEDGE_PREC_EC_DECODE_US_PER_BYTE_INT4\s+([0-9.]+)",
                               f.read()).group(1))


def tables(results):
    """The markdown tables of docs/benchmarks.md from a --json file."""
    names = [r["model"] for r in results]
    print("| coder | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    print("| int4-g32's KL (target) | " +
          " | ".join(f"{r['target_kl']:.2e}" for r in results) + " |")
    for lab in ("int8", "int8+ec", "int4-g32", "int4-g32+ec"):
        cells = []
        for r in results:
            row = next(x for x in r["rows"] if x["coder"] == lab)
            cells.append(f"{row['ratio_int8']:.3f} ({row['bytes_per_token']:.0f} B)")
        print(f"| {lab} | " + " | ".join(cells) + " |")
    labels = []
    for r in results:
        labels += [k for k in r["frontier"] if k not in labels]
    for lab in labels:
        cells = []
        for r in results:
            f = r["frontier"].get(lab)
            per_token = r["int8_block_bytes"] * r["layers"] * r["kv_heads"] / CTX
            cells.append("-" if lab not in r["frontier"] else "out of the sweep" if f is None
                         else f"{f:.3f} ({f * per_token:.0f} B)")
        print(f"| {lab} | " + " | ".join(cells) + " |")
    print()
    for r in results:
        kf = [(v, k) for k, v in r["frontier"].items()
              if v is not None and k.startswith("klt") and "block" not in k]
        best = min(kf)[1] if kf else "klt+layer+kv"
        pts = [x for x in r["rows"] if x.get("sweep") == best]
        print(f"{r['model']} {best}: " + ", ".join(
            f"a {x['a']:g}: KL {x['kl']:.2e} / {x['ratio_int8']:.3f}" for x in pts))
        if "decode" in r:
            d = r["decode"]
            print(f"{r['model']} decode: " + json.dumps({k: round(v, 4) if isinstance(v, float)
                                                         else v for k, v in d.items()}))
            # Per (token, layer, KV head) row: bytes saved against int4-g32+ec at the target
            # KL, and the decode time each costs; the link below which the KLT rung is faster.
            rows_per_token = r["layers"] * r["kv_heads"]
            ec = next(x for x in r["rows"] if x["coder"] == "int4-g32+ec")
            ec_b = ec["bytes_per_token"] / rows_per_token
            kf = [(v, k) for k, v in r["frontier"].items()
                  if v is not None and k.startswith("klt") and "block" not in k]
            f, fl = min(kf) if kf else (None, None)
            if f is not None:
                klt_b = f * r["int8_block_bytes"] / CTX
                ec_ns = ec_b * ec_decode_us_per_byte() * 1e3
                extra_ns = d["ns_per_row"] - ec_ns
                print(f"{r['model']} per row: int4-g32+ec {ec_b:.1f} B (decode {ec_ns:.0f} ns), "
                      f"{fl} {klt_b:.1f} B (decode {d['ns_per_row']:.0f} ns); faster "
                      f"below {(ec_b - klt_b) * 8 / extra_ns * 1e3:.0f} Mbit/s per decoding core")
        if "coders" in r:
            c = r["coders"]
            print(f"{r['model']} coders at a {c['a']:g}: " + ", ".join(
                f"{k} {v['bytes']} B, {v['symbols_mb_s']:.0f} MB/s of symbols"
                for k, v in c.items() if k != "a"))
        print(f"{r['model']} sensitivity: " + json.dumps(r["sensitivity"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="opt-cloud,llama-cloud")
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--kvedge", default=os.path.join(ROOT, "build/clients/kvedge"))
    ap.add_argument("--alphas", default=",".join(f"{x:g}" for x in ALPHAS))
    ap.add_argument("--json")
    ap.add_argument("--table", metavar="JSON", help="print the markdown tables of a --json "
                    "file and exit")
    ap.add_argument("--codec-lib", help="a shared build of libkvedge_codec.a: the KLT rows "
                    "are then coded and decoded by access/codec/tcbody.c itself")
    a = ap.parse_args()
    if a.table:
        with open(a.table) as f:
            tables(json.load(f))
        return
    torch.set_num_threads(1)
    rans = Rans()
    alphas = [float(x) for x in a.alphas.split(",")]
    tc = TcLib(a.codec_lib) if a.codec_lib else None
    out = [study(m, a.docs, a.kvedge, rans, alphas, tc) for m in a.models.split(",")]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
