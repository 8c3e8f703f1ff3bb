#!/usr/bin/env python3
"""Layer fetch into PyTorch tensors through the Python binding (kvedge.Pipeline, zero-copy
torch views) against the same fetch in C (kvedge_pipeline_open / wait on the same
libkvedge.so), in the same run, against the same store node.

    /usr/bin/python3 bench/bench_python.py [--build build] [--reps 41] [--layers 8]

A store node is started from BUILD/clients/kvedge on an ipc:// endpoint; a context of the
opt-1.3b KV shape (32 KV heads x 64) is stored as lossless fp16 blocks, at 128, 512 and 2048
tokens: 1, 4 and 16 MiB of K+V per layer. Each rep opens a pipeline for all layers into fresh
fp16 contiguous destinations (the binding's default: one torch buffer; C: malloc per layer)
and waits for every layer, with the same ring (the binding's default slot size, passed to C).
C and Python reps alternate, each side going first every other rep, so drift hits both.
Reported: medians; Python's throughput over C's as the median of the per-rep ratios and as the
ratio of the best reps; the binding's own cost (the Pipeline constructor, a wait on a resident
layer). Throughput = destination bytes / (open .. last wait returned). The C side is a small
driver compiled here with cc against BUILD/include and BUILD/clients/libkvedge.so (the
binding's own library). Goal: Python >= 95 % of C's throughput for 1 MiB layers and up.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)

C_DRIVER = r"""
/* bench_python's C side: the same pipelined fetch as the Python binding's, timed in C. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kvedge/kvedge.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int main(int argc, char **argv)
{
    if (argc != 10) {
        fprintf(stderr, "usage: EP MODEL LAYERS HEADS HEAD_DIM TOKENS CHUNK REPS SLOT_BYTES\n");
        return 2;
    }
    kvedge_model_t m;
    memset(&m, 0, sizeof m);
    snprintf(m.id, sizeof m.id, "%s", argv[2]);
    m.layers = (uint16_t)atoi(argv[3]);
    m.kv_heads = (uint16_t)atoi(argv[4]);
    m.head_dim = (uint16_t)atoi(argv[5]);
    m.dtype = KVEDGE_DTYPE_FP16;
    uint32_t tokens = (uint32_t)atoi(argv[6]), ct = (uint32_t)atoi(argv[7]);
    int reps = atoi(argv[8]);
    size_t slot_bytes = (size_t)atoll(argv[9]);
    uint32_t *tok = malloc(tokens * sizeof *tok);
    for (uint32_t i = 0; i < tokens; i++)
        tok[i] = i % 1000;
    kvedge_chunk_id_t ids[64];
    int n = kvedge_chunk_chain(NULL, 0, m.id, tok, tokens, ct, ids, 64);
    if (n < 0)
        return 1;
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = argv[1];
    kvedge_client_t *c = NULL;
    int rc = kvedge_client_connect(&o, &c);
    if (rc) {
        fprintf(stderr, "connect: %s\n", kvedge_strerror(rc));
        return 1;
    }
    size_t per = (size_t)m.kv_heads * tokens * m.head_dim * 2;
    char line[64];
    /* One rep per line read from stdin, so the Python side can interleave. */
    for (int r = 0; r < reps && fgets(line, sizeof line, stdin); r++) {
        double t0 = now_us();
        kvedge_kv_dst_t *k = calloc(m.layers, sizeof *k), *v = calloc(m.layers, sizeof *v);
        void **mem = calloc(2 * (size_t)m.layers, sizeof *mem);
        for (int l = 0; l < m.layers; l++) {
            mem[2 * l] = malloc(per);
            mem[2 * l + 1] = malloc(per);
            kvedge_kv_dst_t d = {.layout = KVEDGE_KV_CONTIG, .dtype = KVEDGE_DTYPE_FP16,
                                 .cap_bytes = per, .heads = m.kv_heads,
                                 .head_dim = m.head_dim, .tokens_cap = tokens};
            k[l] = d;
            k[l].base = mem[2 * l];
            v[l] = d;
            v[l].base = mem[2 * l + 1];
        }
        kvedge_pipeline_opts_t po = {.client = c, .model = &m, .chunks = ids,
                                     .n_chunks = (size_t)n, .chunk_tokens = ct,
                                     .tokens = tokens, .first_layer = 0, .layers = m.layers,
                                     .k = k, .v = v, .slot_bytes = slot_bytes};
        kvedge_pipeline_t *p = NULL;
        rc = kvedge_pipeline_open(&po, &p);
        for (int l = 0; rc == 0 && l < m.layers; l++)
            rc = kvedge_pipeline_wait(p, (uint16_t)l);
        double t1 = now_us();
        kvedge_pipeline_destroy(&p);
        for (int l = 0; l < 2 * m.layers; l++)
            free(mem[l]);
        free(mem);
        free(k);
        free(v);
        if (rc) {
            fprintf(stderr, "pipeline: %s\n", kvedge_strerror(rc));
            return 1;
        }
        printf("%.1f\n", t1 - t0);
        fflush(stdout);
    }
    kvedge_client_destroy(&c);
    free(tok);
    return 0;
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", default="128,512,2048")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    lib = os.path.join(build, "clients", "libkvedge.so")
    kv = os.path.join(build, "clients", "kvedge")
    os.environ.setdefault("KVEDGE_LIB", lib)
    sys.path.insert(0, os.path.join(SRC, "clients", "python"))
    import numpy as np
    import torch
    import kvedge
    from kvedge.pipeline import _slot_bytes_any  # the binding's default ring slot size

    tmp = tempfile.mkdtemp(prefix="kvedge-benchpy.")
    drv = os.path.join(tmp, "drv")
    with open(drv + ".c", "w") as f:
        f.write(C_DRIVER)
    subprocess.run(["cc", "-O2", "-std=gnu11", "-Wall", "-Werror", "-I",
                    os.path.join(build, "include"), drv + ".c", "-o", drv, "-L",
                    os.path.join(build, "clients"), "-lkvedge",
                    "-Wl,-rpath," + os.path.join(build, "clients")], check=True)
    ep = f"ipc://{tmp}/node.sock"
    node = subprocess.Popen([kv, "--data", os.path.join(tmp, "data"), "store", "--insecure",
                             "--bind", ep, "--metrics", "off"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        line = node.stdout.readline()
        assert line.startswith("listening"), line
        heads, hd, ct = 32, 64, 256
        rows = []
        with kvedge.Client(ep, deadline_ms=60000) as c:
            for T in (int(x) for x in args.tokens.split(",")):
                m = kvedge.Model(f"bench-py-{T}", args.layers, heads, hd, "fp16")
                tokens = [i % 1000 for i in range(T)]
                chain = kvedge.chunk_ids(tokens, m, ct)
                g = np.random.default_rng(T)
                for l in range(args.layers):
                    k = g.standard_normal((heads, T, hd), np.float32)
                    c.put_layer(m, chain, l, k, -k, scheme="lossless", dtype="fp16", lz4=False)
                layer_bytes = 2 * heads * T * hd * 2
                cproc = subprocess.Popen([drv, ep, m.id, str(args.layers), str(heads), str(hd),
                                          str(T), str(ct), str(args.reps + 2),
                                          str(_slot_bytes_any(chain, heads, hd))],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True)
                tc, tp, overhead = [], [], []
                def c_rep():
                    cproc.stdin.write("go\n")
                    cproc.stdin.flush()
                    return float(cproc.stdout.readline())

                def py_rep():
                    t0 = time.perf_counter()
                    p = kvedge.Pipeline(c, m, chain, dtype="fp16", tensors="torch")
                    t_open = time.perf_counter()
                    for l in range(args.layers):
                        kk, vv = p.wait(l)
                    t1 = time.perf_counter()
                    assert isinstance(kk, torch.Tensor) and kk.dtype == torch.float16
                    # The binding's own cost: the constructor (checks, the torch buffer, the
                    # ctypes structs, kvedge_pipeline_open, which returns at once) and a wait
                    # on a resident layer (C returns at once: what is left is Python's).
                    tw = time.perf_counter()
                    for _ in range(200):
                        p.wait(args.layers - 1)
                    overhead.append(((t_open - t0) * 1e6, (time.perf_counter() - tw) / 200 * 1e6))
                    p.close()
                    return (t1 - t0) * 1e6

                for r in range(args.reps + 2):  # 2 warm-up reps each
                    # Alternate which side goes first, so neither always follows the other.
                    if r % 2:
                        us_p, us_c = py_rep(), c_rep()
                    else:
                        us_c, us_p = c_rep(), py_rep()
                    if r >= 2:
                        tc.append(us_c)
                        tp.append(us_p)
                cproc.stdin.close()
                cproc.wait()
                total = layer_bytes * args.layers
                mc, mp = statistics.median(tc), statistics.median(tp)
                # Python's throughput over C's: the median of the per-rep ratios (each pair
                # ran back to back, so load that changes between reps cancels), and the ratio
                # of the best reps (the least disturbed of each).
                paired = statistics.median(c_ / p_ for c_, p_ in zip(tc, tp))
                best = min(tc) / min(tp)
                ov_open = statistics.median(o[0] for o in overhead)
                ov_wait = statistics.median(o[1] for o in overhead)
                rows.append((layer_bytes / 2**20, T, args.layers, total / mc, total / mp,  # MB/s
                             mc / 1e3, mp / 1e3, paired, best, ov_open, ov_wait))
        print(f"{args.reps} reps each, medians; store node on {ep}; lossless fp16 blocks, "
              f"{heads} KV heads x {hd}, chunks of {ct} tokens")
        print("| K+V per layer | tokens | layers | C ms | Python ms | C MB/s | Python MB/s | "
              "Python / C, paired | Python / C, best reps | Pipeline() us | wait() us | "
              "binding share |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for mib, T, L, bc, bp, mc, mp, paired, best, ov_open, ov_wait in rows:
            share = (ov_open + L * ov_wait) / (mc * 1e3) * 100
            print(f"| {mib:.0f} MiB | {T} | {L} | {mc:.2f} | {mp:.2f} | {bc:.0f} | "
                  f"{bp:.0f} | {paired * 100:.1f} % | {best * 100:.1f} % | {ov_open:.0f} | "
                  f"{ov_wait:.1f} | {share:.2f} % |")
    finally:
        node.terminate()
        node.wait()
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
