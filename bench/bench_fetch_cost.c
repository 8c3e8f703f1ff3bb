/* The edge client's CPU cost of a fetch, counted in instructions (valgrind --tool=callgrind)
 * rather than timed: from blocks on the socket to K/V resident in the decoder's layout. Run by
 * scripts/callgrind_fetch.sh; alone (no valgrind) it only checks and prints the workload.
 *
 *   bench_fetch_cost [path/to/kvedge] [--scheme int8|lossless] [--tokens N] [--reps N]
 *                    [--ring N] [--copy-into-session]
 *
 * A local store node is spawned from the kvedge binary on an ipc:// endpoint (it runs natively:
 * valgrind does not follow the exec). The context (opt-125m shape, --tokens tokens in chunks of
 * 256, every block in one scheme, lz4 where it pays) is put once. Then the pipelined loader
 * (clients/lib/pipeline.h, GET_LAYER streams from the node, CPU path) fetches every layer into fp32
 * contiguous host destinations, the decoder's K/V layout (clients/e2e/e2e.c): one warm-up fetch,
 * checked against kvedge_block_decode of the blocks put, then --reps fetches between
 * CALLGRIND_START_INSTRUMENTATION and CALLGRIND_STOP_INSTRUMENTATION (run valgrind with
 * --instr-atstart=no), so the node's start, the put and the set-up are not counted; every thread
 * of this process is (the client's I/O thread, ZeroMQ's threads, the pipeline's loader).
 *
 * --copy-into-session adds, after each layer's wait, the copy of its K and V into a second
 * buffer: what the decoder's provider did at 09fc98c (clients/e2e/e2e.c s_prov_fetch copied each
 * fetched layer into the session), before the fetch dequantized in place.
 *
 * Prints one line "fetch_cost: key=value ..." for the script (bytes per fetch). */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_common.h"
#include "bench/bench_context.h"
#include "bench/bench_spawn.h"
#include "clients/lib/kvedge.h"
#include "clients/lib/pipeline.h"
#include "gpu/dequant.h"
#include "access/codec/synth.h"

#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define S_HAVE_CALLGRIND 1
#endif
#endif
#ifndef S_HAVE_CALLGRIND
#define S_HAVE_CALLGRIND 0
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_STOP_INSTRUMENTATION
#define RUNNING_ON_VALGRIND 0
#endif

#define S_MODEL        "opt-125m" /* 12 layers x 12 KV heads x 64 */
#define S_CHUNK_TOKENS 256
#define S_MAX_CHUNKS   16
/* Under callgrind the client runs some 50x slower than natively: a generous deadline. */
#define S_DEADLINE_MS 600000

static uint32_t s_tokens = 1024;
static uint32_t s_ring = 2; /* the edge decode's ring (clients/e2e/e2e.h KVEDGE_E2E_RING_DEFAULT) */
static kvedge_scheme_t s_scheme = KVEDGE_SCHEME_INT8;
static kvedge_model_t s_m;
static uint32_t s_chunks;
static kvedge_chunk_id_t s_ids[S_MAX_CHUNKS];

/* ---------------------------------------------------------------- the node */

static pid_t s_node_pid;

static void s_stop_node(void)
{
    bench_stop(&s_node_pid);
}

/* Starts `kvedge store` on ipc://dir/node.sock. with_metrics_off: pass --metrics off (older
 * binaries do not know the flag and exit at once). Returns false when the node did not start. */
static bool s_spawn_try(const char *kvedge, const char *dir, char *ep, bool with_metrics_off)
{
    char data[300];
    snprintf(data, sizeof data, "%s/node", dir);
    char *argv[] = {"kvedge", "--data",      data,   "store",     "--insecure", "--bind",
                    ep,       "--log-level", "warn", "--metrics", "off",        NULL};
    if (!with_metrics_off)
        argv[9] = NULL; /* drop "--metrics off" */
    s_node_pid = bench_spawn(kvedge, argv);
    if (s_node_pid > 0)
        return true;
    s_node_pid = 0;
    return false;
}

static void s_spawn(const char *kvedge, const char *dir, char *ep, size_t ep_len)
{
    snprintf(ep, ep_len, "ipc://%s/node.sock", dir);
    atexit(s_stop_node);
    if (s_spawn_try(kvedge, dir, ep, true) || s_spawn_try(kvedge, dir, ep, false))
        return;
    fprintf(stderr, "bench_fetch_cost: the node did not start (%s)\n", kvedge);
    exit(1);
}

/* ---------------------------------------------------------------- the context */

static kvedge_client_t *s_client(const char *ep)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = S_DEADLINE_MS;
    kvedge_client_t *c = NULL;
    KVEDGE_BENCH_CHECK(kvedge_client_connect(&o, &c));
    return c;
}

/* Every block put, kept to check the fetched K/V: [layer][chunk][head]. */
static uint8_t *s_blocks;
static size_t s_block_cap;
static size_t *s_block_len;

static size_t s_bi(uint32_t l, uint32_t ci, uint32_t h)
{
    return ((size_t)l * s_chunks + ci) * s_m.kv_heads + h;
}

/* Puts the context in s_scheme; returns the bytes of the blocks put. */
static double s_put_context(const char *ep)
{
    uint32_t *tok = bench_alloc(s_tokens * sizeof *tok);
    for (uint32_t i = 0; i < s_tokens; i++)
        tok[i] = 13 * i + 1 + 7 * (uint32_t)s_scheme; /* one chain per scheme */
    KVEDGE_BENCH_CHECK(kvedge_chunk_chain(NULL, 0, S_MODEL, tok, s_tokens, S_CHUNK_TOKENS, s_ids,
                                          S_MAX_CHUNKS) == (int)s_chunks
                           ? 0
                           : KVEDGE_EINVAL);
    free(tok);
    kvedge_client_t *c = s_client(ep);
    bench_context_t x = {.m = &s_m,
                         .ids = s_ids,
                         .chunks = s_chunks,
                         .tokens = s_tokens,
                         .chunk_tokens = S_CHUNK_TOKENS,
                         .scheme = s_scheme};
    s_block_cap = bench_context_block_cap(&x);
    size_t nb = (size_t)s_m.layers * s_chunks * s_m.kv_heads;
    s_blocks = bench_alloc(s_block_cap * nb);
    s_block_len = bench_alloc(nb * sizeof *s_block_len);
    x.keep = s_blocks;
    x.keep_cap = s_block_cap;
    x.keep_len = s_block_len;
    double bytes = bench_put_context(c, &x);
    kvedge_client_destroy(&c);
    return bytes;
}

/* ---------------------------------------------------------------- the fetch */

static kvedge_kv_dst_t s_k[KVEDGE_MODEL_MAX_LAYERS], s_v[KVEDGE_MODEL_MAX_LAYERS];
static float *s_sess_k[KVEDGE_MODEL_MAX_LAYERS], *s_sess_v[KVEDGE_MODEL_MAX_LAYERS];
static bool s_copy_into_session;

static void s_dst_make(void)
{
    kvedge_kv_dst_t t = {.layout = KVEDGE_KV_CONTIG,
                         .dtype = KVEDGE_DTYPE_FP32,
                         .heads = s_m.kv_heads,
                         .head_dim = s_m.head_dim,
                         .tokens_cap = s_tokens};
    t.cap_bytes = (size_t)kvedge_dequant_dst_bytes(&t);
    for (uint32_t l = 0; l < s_m.layers; l++) {
        s_k[l] = t;
        s_v[l] = t;
        s_k[l].base = bench_alloc(t.cap_bytes);
        s_v[l].base = bench_alloc(t.cap_bytes);
        memset(s_k[l].base, 0, t.cap_bytes); /* fault the pages in before counting */
        memset(s_v[l].base, 0, t.cap_bytes);
        if (s_copy_into_session) {
            s_sess_k[l] = bench_alloc(t.cap_bytes);
            s_sess_v[l] = bench_alloc(t.cap_bytes);
            memset(s_sess_k[l], 0, t.cap_bytes);
            memset(s_sess_v[l], 0, t.cap_bytes);
        }
    }
}

/* One fetch of every layer: open, wait for each layer in order (copying it into the session
 * with --copy-into-session), stats, destroy. */
static void s_fetch(kvedge_client_t *c, kvedge_pipeline_stats_t *st)
{
    kvedge_pipeline_opts_t o = {.size = sizeof(kvedge_pipeline_opts_t),
                                .client = c,
                                .model = &s_m,
                                .chunks = s_ids,
                                .n_chunks = s_chunks,
                                .chunk_tokens = S_CHUNK_TOKENS,
                                .tokens = s_tokens,
                                .first_layer = 0,
                                .layers = s_m.layers,
                                .k = s_k,
                                .v = s_v,
                                .on_device = false,
                                .ring_slots = s_ring,
                                .deadline_ms = S_DEADLINE_MS};
    kvedge_pipeline_t *p = NULL;
    KVEDGE_BENCH_CHECK(kvedge_pipeline_open(&o, &p));
    for (uint16_t l = 0; l < s_m.layers; l++) {
        KVEDGE_BENCH_CHECK(kvedge_pipeline_wait(p, l));
        if (s_copy_into_session) {
            memcpy(s_sess_k[l], s_k[l].base, s_k[l].cap_bytes);
            memcpy(s_sess_v[l], s_v[l].base, s_v[l].cap_bytes);
        }
    }
    KVEDGE_BENCH_CHECK(kvedge_pipeline_stats(p, st, NULL, 0));
    kvedge_pipeline_destroy(&p);
}

/* The fetched K/V against kvedge_block_decode of the blocks put (fp32). */
static void s_check(void)
{
    size_t n = (size_t)S_CHUNK_TOKENS * s_m.head_dim;
    float *k = bench_alloc(n * sizeof *k), *v = bench_alloc(n * sizeof *v);
    double worst = 0;
    for (uint32_t l = 0; l < s_m.layers; l++)
        for (uint32_t ci = 0; ci < s_chunks; ci++)
            for (uint32_t h = 0; h < s_m.kv_heads; h++) {
                size_t bi = s_bi(l, ci, h);
                kvedge_block_info_t info;
                KVEDGE_BENCH_CHECK(
                    kvedge_block_parse(s_blocks + bi * s_block_cap, s_block_len[bi], &info));
                KVEDGE_BENCH_CHECK(kvedge_block_decode(&info, KVEDGE_DTYPE_FP32, k, v));
                /* contiguous destination: [head][token][channel] */
                size_t row0 = (size_t)h * s_tokens + (size_t)ci * S_CHUNK_TOKENS;
                for (uint32_t t = 0; t < info.tokens; t++)
                    for (uint32_t d = 0; d < s_m.head_dim; d++) {
                        size_t src = (size_t)t * s_m.head_dim + d;
                        size_t dst = (row0 + t) * s_m.head_dim + d;
                        const float *gk = s_k[l].base, *gv = s_v[l].base;
                        double ek = gk[dst] - k[src], ev = gv[dst] - v[src];
                        ek = ek < 0 ? -ek : ek;
                        ev = ev < 0 ? -ev : ev;
                        double tol = 1e-5 * (1.0 + (k[src] < 0 ? -k[src] : k[src]) +
                                             (v[src] < 0 ? -v[src] : v[src]));
                        if (ek > tol || ev > tol) {
                            fprintf(stderr,
                                    "bench_fetch_cost: layer %u chunk %u head %u token %u "
                                    "channel %u: fetched K %g V %g, decoded K %g V %g\n",
                                    l, ci, h, t, d, gk[dst], gv[dst], k[src], v[src]);
                            exit(1);
                        }
                        worst = ek > worst ? ek : worst;
                        worst = ev > worst ? ev : worst;
                    }
            }
    free(k);
    free(v);
    printf("check: every fetched value matches kvedge_block_decode (largest difference %g)\n",
           worst);
}

static void s_usage(void)
{
    fprintf(stderr, "usage: bench_fetch_cost [path/to/kvedge] [--scheme int8|lossless] "
                    "[--tokens N] [--reps N] [--ring N] [--copy-into-session]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *kvedge = "build/clients/kvedge";
    int reps = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--copy-into-session") == 0) {
            s_copy_into_session = true;
        } else if (strcmp(a, "--scheme") == 0 && val) {
            if (strcmp(val, "int8") == 0)
                s_scheme = KVEDGE_SCHEME_INT8;
            else if (strcmp(val, "lossless") == 0)
                s_scheme = KVEDGE_SCHEME_LOSSLESS;
            else
                s_usage();
            i++;
        } else if (strcmp(a, "--tokens") == 0 && val) {
            s_tokens = (uint32_t)strtoul(val, NULL, 10);
            i++;
        } else if (strcmp(a, "--reps") == 0 && val) {
            reps = atoi(val);
            i++;
        } else if (strcmp(a, "--ring") == 0 && val) {
            s_ring = (uint32_t)strtoul(val, NULL, 10);
            i++;
        } else if (a[0] != '-') {
            kvedge = a;
        } else {
            s_usage();
        }
    }
    KVEDGE_BENCH_CHECK(kvedge_model_builtin(S_MODEL, &s_m));
    s_chunks = (s_tokens + S_CHUNK_TOKENS - 1) / S_CHUNK_TOKENS;
    if (s_tokens == 0 || s_chunks > S_MAX_CHUNKS || reps < 1 || s_ring < 1 || s_ring > s_m.layers) {
        fprintf(stderr, "bench_fetch_cost: tokens 1 ... %u, reps >= 1, ring 1 ... %u\n",
                S_MAX_CHUNKS * S_CHUNK_TOKENS, s_m.layers);
        return 2;
    }
    char dir[] = "/tmp/kvedge-fetch-cost-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char ep[300];
    s_spawn(kvedge, dir, ep, sizeof ep);
    double put = s_put_context(ep);
    s_dst_make();
    kvedge_client_t *c = s_client(ep);
    kvedge_pipeline_stats_t st;
    memset(&st, 0, sizeof st);
    s_fetch(c, &st); /* warm-up, not counted */
    s_check();
    uint64_t wire = st.wire_bytes, raw = st.raw_bytes, msg = st.msg_bytes;
    double t0 = bench_now_s();
    CALLGRIND_START_INSTRUMENTATION;
    for (int r = 0; r < reps; r++) {
        s_fetch(c, &st);
        if (st.wire_bytes != wire || st.resident != s_m.layers) {
            fprintf(stderr, "bench_fetch_cost: fetch %d differs from the warm-up\n", r);
            exit(1);
        }
    }
    CALLGRIND_STOP_INSTRUMENTATION;
    double secs = bench_now_s() - t0;
    kvedge_client_destroy(&c);
    uint64_t resident = 2ull * s_m.layers * s_m.kv_heads * s_tokens * s_m.head_dim * 4;
    uint64_t fp16 = resident / 2;
    printf("%s shape (%u layers x %u KV heads x %u), %u tokens (%u chunks of %u), %s blocks "
           "(lz4 where it pays): %.2f MB put; pipelined loader, ring %u, fp32 contiguous host "
           "destinations%s; %d counted fetches, %.3f s each (wall, %s)\n",
           S_MODEL, s_m.layers, s_m.kv_heads, s_m.head_dim, s_tokens, s_chunks, S_CHUNK_TOKENS,
           s_scheme == KVEDGE_SCHEME_INT8 ? "int8" : "lossless fp16", put / 1e6, s_ring,
           s_copy_into_session ? ", each layer then copied into a session buffer" : "", reps,
           secs / reps, RUNNING_ON_VALGRIND ? "under valgrind" : "native");
    printf("fetch_cost: scheme=%s tokens=%u reps=%d wire_bytes=%llu raw_bytes=%llu "
           "msg_bytes=%llu resident_bytes=%llu fp16_bytes=%llu copy_into_session=%d "
           "callgrind_header=%d\n",
           s_scheme == KVEDGE_SCHEME_INT8 ? "int8" : "lossless", s_tokens, reps,
           (unsigned long long)wire, (unsigned long long)raw, (unsigned long long)msg,
           (unsigned long long)resident, (unsigned long long)fp16, s_copy_into_session ? 1 : 0,
           S_HAVE_CALLGRIND);
    for (uint32_t l = 0; l < s_m.layers; l++) {
        free(s_k[l].base);
        free(s_v[l].base);
        free(s_sess_k[l]);
        free(s_sess_v[l]);
    }
    free(s_blocks);
    free(s_block_len);
    s_stop_node();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}
