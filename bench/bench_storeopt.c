/* The storage optimizer under capacity pressure (docs/operations.md "Storage optimizer"): N
 * contexts of a synthetic model stored at int8 in a capacity that holds N/2 of them, read along
 * a Zipf trace; a read is a hit when every block of its context is present at any rung, and a
 * miss puts the missing blocks back at int8 (as a cloud would send them again). Compared: plain
 * LRU eviction, the pressure order (variants, demotion, eviction, demoted blocks last) at a
 * few demotion rungs, and unlimited capacity. The quality cost of each rung is the KJV cloud
 * model's whole-model measurement (models/kjv/cloud/quality.json, kvedge eval). Engine only,
 * no network, a virtual clock, a fixed seed: the figures are deterministic. */
#define _GNU_SOURCE
#include <ftw.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench_common.h"
#include "access/codec/block.h"
#include "access/codec/chunk.h"
#include "store/engine/engine.h"
#include "access/codec/error.h"
#include "access/codec/model.h"
#include "access/codec/prec.h"
#include "access/codec/synth.h"

#define S_MODEL            "opt-125m" /* built in: 12 layers x 12 KV heads x 64 */
#define S_HEADS            12
#define S_HEAD_DIM         64
#define S_TOKENS           256 /* one chunk per context */
#define S_CONTEXTS_DEFAULT 64
#define S_LAYERS_DEFAULT   2
#define S_LAYERS_MAX       12
#define S_READS_DEFAULT    20000
#define S_ZIPF_DEFAULT     1.0
#define S_SEED_DEFAULT     20261124u
#define S_QUALITY_DEFAULT  "models/kjv/cloud/quality.json"
#define S_PATH_MAX         4096

typedef struct {
    uint32_t contexts, layers, reads;
    double zipf;
    uint64_t seed;
    const char *quality;
} s_cfg_t;

/* One policy: its name, the capacity (0: unlimited) and the rung demoted to (0: plain LRU). */
typedef struct {
    const char *name;
    bool unlimited;
    kvedge_prec_t demote;
} s_policy_t;

typedef struct {
    uint64_t hits, misses, demoted_hits; /* demoted_hits: hits with a demoted block in them */
    uint64_t held;                       /* contexts complete at the end */
    uint64_t bytes;                      /* stored at the end (primaries and variants) */
    uint64_t evicted, demoted, puts;
    double seconds;
} s_result_t;

static uint64_t s_vclock;

static uint64_t s_clock(void *ctx)
{
    (void)ctx;
    return s_vclock;
}

static int s_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* The whole-model KL and perplexity change of a rung in a kvedge eval quality profile; false
 * when the file or the rung is not there. */
static bool s_quality(const char *path, const char *rung, double *kl, double *ppl_pct)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *w = strstr(text, "\"whole_model\"");
    char want[64];
    snprintf(want, sizeof want, "\"rung\": \"%s\"", rung);
    const char *r = w ? strstr(w, want) : NULL;
    const char *k = r ? strstr(r, "\"kl\":") : NULL, *p = r ? strstr(r, "\"ppl_pct\":") : NULL;
    if (!k || !p)
        return false;
    *kl = strtod(k + 5, NULL);
    *ppl_pct = strtod(p + 10, NULL);
    return true;
}

/* A Zipf(s) sampler over ranks 0..n-1 by inverse CDF. */
typedef struct {
    double *cdf;
    uint32_t n;
} s_zipf_t;

static void s_zipf_init(s_zipf_t *z, uint32_t n, double s)
{
    z->n = n;
    z->cdf = bench_alloc(n * sizeof *z->cdf);
    double sum = 0;
    for (uint32_t i = 0; i < n; i++)
        sum += 1.0 / pow(i + 1, s);
    double acc = 0;
    for (uint32_t i = 0; i < n; i++) {
        acc += 1.0 / pow(i + 1, s) / sum;
        z->cdf[i] = acc;
    }
    z->cdf[n - 1] = 1.0;
}

static uint32_t s_zipf_draw(const s_zipf_t *z, kvedge_rng_t *r)
{
    double u = (double)(kvedge_rng_next(r) >> 11) / 9007199254740992.0; /* [0, 1) */
    uint32_t lo = 0, hi = z->n - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (z->cdf[mid] > u)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* The workload: every context's chunk and its int8 blocks, and the trace. */
typedef struct {
    kvedge_chunk_info_t *chunks;
    uint8_t **blocks; /* [context][layer][head] */
    size_t *lens;
    uint32_t *trace;
    uint64_t int8_bytes; /* of one context */
} s_work_t;

static void s_work_make(const s_cfg_t *c, s_work_t *w)
{
    size_t nb = (size_t)c->contexts * c->layers * S_HEADS;
    w->chunks = bench_alloc(c->contexts * sizeof *w->chunks);
    w->blocks = bench_alloc(nb * sizeof *w->blocks);
    w->lens = bench_alloc(nb * sizeof *w->lens);
    uint16_t *k = bench_alloc((size_t)S_TOKENS * S_HEAD_DIM * 2);
    uint16_t *v = bench_alloc((size_t)S_TOKENS * S_HEAD_DIM * 2);
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, S_TOKENS, S_HEAD_DIM, 0, NULL, false};
    size_t cap = kvedge_block_encoded_bound(&spec);
    uint32_t tok[S_TOKENS];
    w->int8_bytes = 0;
    for (uint32_t i = 0; i < c->contexts; i++) {
        kvedge_chunk_info_t *ch = &w->chunks[i];
        memset(ch, 0, sizeof *ch);
        for (uint32_t t = 0; t < S_TOKENS; t++)
            tok[t] = (i * S_TOKENS + t) ^ (uint32_t)c->seed; /* distinct for every context */
        if (kvedge_chunk_chain(NULL, 0, S_MODEL, tok, S_TOKENS, 0, &ch->id, 1) != 1) {
            fprintf(stderr, "chunk id failed\n");
            exit(1);
        }
        snprintf(ch->model_id, sizeof ch->model_id, "%s", S_MODEL);
        ch->tokens = S_TOKENS;
        for (uint32_t l = 0; l < c->layers; l++)
            for (uint32_t h = 0; h < S_HEADS; h++) {
                size_t b = ((size_t)i * c->layers + l) * S_HEADS + h;
                KVEDGE_BENCH_CHECK(kvedge_synth_head(c->seed ^ (b * 0x9E3779B97F4A7C15ull), 0,
                                                     S_TOKENS, S_HEAD_DIM, KVEDGE_DTYPE_FP16, k,
                                                     v));
                w->blocks[b] = bench_alloc(cap);
                KVEDGE_BENCH_CHECK(
                    kvedge_block_encode(&spec, k, v, w->blocks[b], cap, &w->lens[b]));
                if (i == 0)
                    w->int8_bytes += w->lens[b];
            }
    }
    free(k);
    free(v);
    /* The trace: Zipf ranks mapped to contexts by a seeded shuffle. */
    uint32_t *perm = bench_alloc(c->contexts * sizeof *perm);
    kvedge_rng_t r;
    kvedge_rng_seed(&r, c->seed);
    for (uint32_t i = 0; i < c->contexts; i++)
        perm[i] = i;
    for (uint32_t i = c->contexts - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(kvedge_rng_next(&r) % (i + 1));
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    s_zipf_t z;
    s_zipf_init(&z, c->contexts, c->zipf);
    w->trace = bench_alloc(c->reads * sizeof *w->trace);
    for (uint32_t i = 0; i < c->reads; i++)
        w->trace[i] = perm[s_zipf_draw(&z, &r)];
    free(z.cdf);
    free(perm);
}

static int s_count_cb(void *ctx, const kvedge_block_key_t *key, const kvedge_block_meta_t *m)
{
    (void)key;
    (void)m;
    (*(uint64_t *)ctx)++;
    return 0;
}

/* Runs the trace under one policy in a fresh store under dir. */
static void s_run(const s_cfg_t *c, const s_work_t *w, const s_policy_t *p, uint64_t capacity,
                  const char *dir, s_result_t *out)
{
    memset(out, 0, sizeof *out);
    nftw(dir, s_rm, 16, FTW_DEPTH | FTW_PHYS);
    kvedge_engine_opts_t o;
    kvedge_engine_opts_default(&o);
    o.capacity_bytes = p->unlimited ? 0 : capacity;
    o.pressure_demote = p->demote;
    o.atime_granularity_ms = 1; /* exact LRU on the virtual clock */
    o.clock_ms = s_clock;
    s_vclock = 1000000;
    kvedge_engine_t *e = NULL;
    char why[512];
    if (kvedge_engine_open(dir, &o, &e, why, sizeof why) != 0) {
        fprintf(stderr, "open %s: %s\n", dir, why);
        exit(1);
    }
    kvedge_model_t model;
    KVEDGE_BENCH_CHECK(kvedge_model_builtin(S_MODEL, &model));
    KVEDGE_BENCH_CHECK(kvedge_engine_put_model(e, &model));
    uint32_t per = c->layers * S_HEADS;
    double t0 = bench_now_s();
    for (uint32_t i = 0; i < c->reads; i++) {
        uint32_t ctx = w->trace[i];
        s_vclock++;
        bool hit = true, demoted = false;
        bool missing[S_LAYERS_MAX * S_HEADS];
        for (uint32_t b = 0; b < per; b++) {
            kvedge_block_key_t k = {.chunk = w->chunks[ctx].id,
                                    .layer = (uint16_t)(b / S_HEADS),
                                    .head = (uint16_t)(b % S_HEADS)};
            kvedge_value_t v;
            int rc = kvedge_engine_get(e, &k, &v);
            missing[b] = rc != 0;
            if (rc == 0) {
                kvedge_block_info_t info;
                KVEDGE_BENCH_CHECK(kvedge_block_parse(v.data, v.len, &info));
                if (info.scheme != KVEDGE_SCHEME_INT8 || info.key_channels != S_HEAD_DIM)
                    demoted = true;
                kvedge_value_release(&v);
            } else if (rc != KVEDGE_ENOTFOUND) {
                KVEDGE_BENCH_CHECK(rc);
            }
            hit = hit && rc == 0;
        }
        if (hit) {
            out->hits++;
            out->demoted_hits += demoted;
        } else {
            out->misses++;
            for (uint32_t b = 0; b < per; b++) {
                if (!missing[b])
                    continue;
                size_t at = (size_t)ctx * per + b;
                KVEDGE_BENCH_CHECK(kvedge_engine_put(e, &w->chunks[ctx], (uint16_t)(b / S_HEADS),
                                                     (uint16_t)(b % S_HEADS), w->blocks[at],
                                                     w->lens[at], NULL));
                out->puts++;
            }
        }
    }
    out->seconds = bench_now_s() - t0;
    for (uint32_t ctx = 0; ctx < c->contexts; ctx++) {
        bool all = true;
        for (uint32_t b = 0; b < per && all; b++) {
            kvedge_block_key_t k = {.chunk = w->chunks[ctx].id,
                                    .layer = (uint16_t)(b / S_HEADS),
                                    .head = (uint16_t)(b % S_HEADS)};
            kvedge_block_meta_t m;
            all = kvedge_engine_get_meta(e, &k, &m) == 0;
        }
        out->held += all;
    }
    kvedge_engine_stats_t st;
    KVEDGE_BENCH_CHECK(kvedge_engine_stats(e, &st));
    uint64_t vbytes = 0;
    KVEDGE_BENCH_CHECK(kvedge_engine_variant_stats(e, NULL, &vbytes));
    kvedge_engine_demote_stats_t ds;
    KVEDGE_BENCH_CHECK(kvedge_engine_demote_stats(e, &ds));
    out->bytes = st.bytes + vbytes;
    if (getenv("BENCH_STOREOPT_DEBUG")) {
        uint64_t scanned = 0;
        KVEDGE_BENCH_CHECK(kvedge_engine_scan(e, NULL, s_count_cb, &scanned));
        fprintf(stderr, "blocks %llu scanned %llu bytes %llu cap %llu\n",
                (unsigned long long)st.blocks, (unsigned long long)scanned,
                (unsigned long long)st.bytes, (unsigned long long)capacity);
    }
    out->evicted = st.evicted_blocks;
    out->demoted = ds.demoted;
    kvedge_engine_destroy(&e);
}

static void s_usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s [--contexts N] [--layers L] [--reads R] [--zipf S] [--seed X] "
            "[--quality FILE]\n",
            prog);
}

int main(int argc, char **argv)
{
    s_cfg_t c = {S_CONTEXTS_DEFAULT, S_LAYERS_DEFAULT, S_READS_DEFAULT,
                 S_ZIPF_DEFAULT,     S_SEED_DEFAULT,   S_QUALITY_DEFAULT};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--contexts") == 0 && v)
            c.contexts = (uint32_t)atoi(argv[++i]);
        else if (strcmp(a, "--layers") == 0 && v)
            c.layers = (uint32_t)atoi(argv[++i]);
        else if (strcmp(a, "--reads") == 0 && v)
            c.reads = (uint32_t)atoi(argv[++i]);
        else if (strcmp(a, "--zipf") == 0 && v)
            c.zipf = atof(argv[++i]);
        else if (strcmp(a, "--seed") == 0 && v)
            c.seed = strtoull(argv[++i], NULL, 0);
        else if (strcmp(a, "--quality") == 0 && v)
            c.quality = argv[++i];
        else {
            s_usage(argv[0]);
            return 2;
        }
    }
    if (c.contexts < 2 || c.layers < 1 || c.layers > S_LAYERS_MAX || c.reads < 1 || c.zipf < 0) {
        s_usage(argv[0]);
        return 2;
    }
    char dir[S_PATH_MAX];
    snprintf(dir, sizeof dir, "/tmp/kvedge-bench-storeopt-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char store[S_PATH_MAX + 16];
    snprintf(store, sizeof store, "%s/store", dir);

    s_work_t w;
    s_work_make(&c, &w);
    uint64_t capacity = w.int8_bytes * (c.contexts / 2);
    printf("bench_storeopt: %u contexts of %s (%u layers x %d heads x %d, %d tokens, one chunk "
           "each), int8 %.1f KiB a context; capacity %.2f MiB = %u contexts at int8; Zipf(%.2f) "
           "trace of %u reads, seed %llu\n",
           c.contexts, S_MODEL, c.layers, S_HEADS, S_HEAD_DIM, S_TOKENS,
           (double)w.int8_bytes / 1024, (double)capacity / (1 << 20), c.contexts / 2, c.zipf,
           c.reads, (unsigned long long)c.seed);

    /* What one block weighs at each rung (the first context's first block). */
    kvedge_block_info_t info0;
    KVEDGE_BENCH_CHECK(kvedge_block_parse(w.blocks[0], w.lens[0], &info0));
    printf("one block: int8 %zu bytes", w.lens[0]);
    const kvedge_prec_t rungs[] = {KVEDGE_PREC_INT4_G32, KVEDGE_PREC_INT4_G128,
                                   KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, KVEDGE_PREC_THINK_50)};
    for (size_t i = 0; i < sizeof rungs / sizeof rungs[0]; i++) {
        uint8_t *t = NULL;
        size_t tl = 0;
        KVEDGE_BENCH_CHECK(kvedge_block_transcode(&info0, rungs[i], true, &t, &tl));
        printf(", %s %zu (%.3f of int8)", kvedge_prec_name(rungs[i]), tl,
               (double)tl / (double)w.lens[0]);
        free(t);
    }
    printf("\n");

    const s_policy_t policies[] = {
        {"unlimited capacity", true, 0},
        {"LRU, int8", false, 0},
        {"pressure -> int4-g32", false, KVEDGE_PREC_INT4_G32},
        {"pressure -> int4-g128", false, KVEDGE_PREC_INT4_G128},
        {"pressure -> int4-g32+think-50", false,
         KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, KVEDGE_PREC_THINK_50)},
    };
    size_t np = sizeof policies / sizeof policies[0];
    printf("\n| policy | hit ratio | hits served demoted | contexts held | stored MiB | "
           "demotions | evictions | puts | rung KL (KJV) | rung ppl %% | s |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    double kl8 = 0, ppl8 = 0;
    bool have8 = s_quality(c.quality, "int8", &kl8, &ppl8);
    for (size_t i = 0; i < np; i++) {
        s_result_t r;
        s_run(&c, &w, &policies[i], capacity, store, &r);
        double kl = kl8, ppl = ppl8;
        bool have = have8;
        if (policies[i].demote)
            have = s_quality(c.quality, kvedge_prec_name(policies[i].demote), &kl, &ppl);
        char klt[32] = "n/a", pplt[32] = "n/a";
        if (have) {
            snprintf(klt, sizeof klt, "%.2e", kl);
            snprintf(pplt, sizeof pplt, "%+.3f", ppl);
        }
        printf("| %s | %.4f | %.1f %% | %llu / %u | %.2f | %llu | %llu | %llu | %s | %s | %.1f |\n",
               policies[i].name, (double)r.hits / c.reads,
               r.hits ? 100.0 * (double)r.demoted_hits / (double)r.hits : 0.0,
               (unsigned long long)r.held, c.contexts, (double)r.bytes / (1 << 20),
               (unsigned long long)r.demoted, (unsigned long long)r.evicted,
               (unsigned long long)r.puts, klt, pplt, r.seconds);
        fflush(stdout);
    }
    printf("\nA hit: every block of the context present at any rung. Rung KL and ppl %%: "
           "whole-model KL divergence and perplexity change against lossless of the KJV cloud "
           "model at that rung (%s; int8 for LRU and unlimited), the cost a read served by a "
           "demoted block pays.\n",
           c.quality);
    nftw(dir, s_rm, 16, FTW_DEPTH | FTW_PHYS);
    size_t nb = (size_t)c.contexts * c.layers * S_HEADS;
    for (size_t i = 0; i < nb; i++)
        free(w.blocks[i]);
    free(w.blocks);
    free(w.lens);
    free(w.chunks);
    free(w.trace);
    return 0;
}
