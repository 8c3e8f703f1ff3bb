/* Placement skew and movement (access/placement.h): N contexts (root chunk ids, BLAKE2b
 * hashes, so uniform bytes here) of varied sizes placed with R replicas on 4 nodes of equal
 * capacity and of capacities 1:1:1:2; per node the contexts and bytes it holds against the
 * mean (and, weighted, against its capacity's share); then a 5th node joins and the contexts
 * and replicas that move are counted against the ideal R/(N+1). Pure computation: no daemons.
 * Usage: bench_placement [--contexts N] [--replicas R] [--seeds S] */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/placement.h"
#include "bench/bench_common.h"

#define S_MAX_NODES 8
#define S_GIB       (1ull << 30)

static uint64_t s_mix(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct {
    kvedge_chunk_id_t key;
    uint64_t bytes;
} s_ctx_t;

/* n contexts: random root ids; sizes log-uniform between 512 and 32768 tokens of 24 KiB each
 * (opt-1.3b's K/V per token at int8, about), so a few large ones weigh as much as many small. */
static void s_contexts(s_ctx_t *c, size_t n, uint64_t seed)
{
    uint64_t st = seed;
    for (size_t i = 0; i < n; i++) {
        for (size_t b = 0; b < sizeof c[i].key.bytes; b += 8) {
            uint64_t r = s_mix(&st);
            memcpy(c[i].key.bytes + b, &r, 8);
        }
        double u = (double)(s_mix(&st) >> 11) / 9007199254740992.0;
        double tokens = 512.0 * pow(64.0, u);
        c[i].bytes = (uint64_t)tokens * 24576u;
    }
}

typedef struct {
    double ctx_max_mean, bytes_max_mean;   /* max over nodes / mean over nodes */
    double ctx_max_share, bytes_max_share; /* max over nodes of load share / capacity share */
    size_t moved_contexts, moved_replicas; /* when the extra node joins */
    double ideal_moved;                    /* R/(N+1)-style ideal: replicas the new node takes */
} s_fig_t;

/* Places every context on nodes[0 .. n-1] (r replicas): per-node counts and bytes, and the
 * placements themselves into out (n_ctx * r). */
static void s_place(const s_ctx_t *c, size_t n_ctx, const kvedge_place_node_t *nodes, size_t n,
                    uint32_t r, uint32_t *out, double *cnt, double *bytes)
{
    for (size_t i = 0; i < n; i++)
        cnt[i] = bytes[i] = 0;
    for (size_t k = 0; k < n_ctx; k++) {
        uint32_t got = 0;
        KVEDGE_BENCH_CHECK(kvedge_place_pick(&c[k].key, nodes, n, r, out + k * r, &got));
        if (got != r) {
            fprintf(stderr, "placement gave %u of %u replicas\n", got, r);
            exit(1);
        }
        for (uint32_t j = 0; j < r; j++) {
            cnt[out[k * r + j]] += 1;
            bytes[out[k * r + j]] += (double)c[k].bytes;
        }
    }
}

static void s_skew(const double *v, const kvedge_place_node_t *nodes, size_t n, double *max_mean,
                   double *max_share)
{
    double sum = 0, wsum = 0, mx = 0, share = 0;
    for (size_t i = 0; i < n; i++) {
        sum += v[i];
        wsum += (double)nodes[i].weight;
        mx = v[i] > mx ? v[i] : mx;
    }
    for (size_t i = 0; i < n; i++) {
        double s = (v[i] / sum) / ((double)nodes[i].weight / wsum);
        share = s > share ? s : share;
    }
    *max_mean = mx / (sum / (double)n);
    *max_share = share;
}

/* One run: the tier of weights w[0 .. n-1], then w[n] joining. */
static void s_run(const s_ctx_t *c, size_t n_ctx, const uint64_t *w, size_t n, uint32_t r,
                  s_fig_t *f, double *cnt, double *bytes)
{
    kvedge_place_node_t nodes[S_MAX_NODES];
    memset(nodes, 0, sizeof nodes);
    for (size_t i = 0; i <= n; i++) {
        snprintf(nodes[i].id, sizeof nodes[i].id, "cloud-%zu", i + 1);
        nodes[i].weight = w[i];
        nodes[i].up = true;
    }
    uint32_t *before = bench_alloc(n_ctx * r * sizeof *before);
    uint32_t *after = bench_alloc(n_ctx * r * sizeof *after);
    double c2[S_MAX_NODES], b2[S_MAX_NODES];
    s_place(c, n_ctx, nodes, n, r, before, cnt, bytes);
    s_skew(cnt, nodes, n, &f->ctx_max_mean, &f->ctx_max_share);
    s_skew(bytes, nodes, n, &f->bytes_max_mean, &f->bytes_max_share);
    s_place(c, n_ctx, nodes, n + 1, r, after, c2, b2);
    f->moved_contexts = f->moved_replicas = 0;
    for (size_t k = 0; k < n_ctx; k++) {
        size_t moved = 0;
        for (uint32_t j = 0; j < r; j++) {
            bool kept = false;
            for (uint32_t i = 0; i < r; i++)
                kept |= after[k * r + j] == before[k * r + i];
            moved += !kept;
        }
        f->moved_replicas += moved;
        f->moved_contexts += moved > 0;
    }
    double wsum = 0;
    for (size_t i = 0; i <= n; i++)
        wsum += (double)w[i];
    /* Ideal: the new node takes its capacity's share of all replicas, and nothing else moves. */
    f->ideal_moved = (double)n_ctx * r * (double)w[n] / wsum;
    free(before);
    free(after);
}

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    size_t n_ctx = 1000;
    uint32_t r = 2, seeds = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--contexts") == 0)
            n_ctx = (size_t)strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--replicas") == 0)
            r = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--seeds") == 0)
            seeds = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "usage: bench_placement [--contexts N] [--replicas R] [--seeds S]\n");
            return 2;
        }
    }
    if (n_ctx == 0 || r == 0 || r > 4 || seeds == 0 || seeds > 1000) {
        fprintf(stderr, "bench_placement: contexts >= 1, replicas 1..4, seeds 1..1000\n");
        return 2;
    }
    static const struct {
        const char *name;
        uint64_t w[5]; /* 4 nodes, then the one that joins */
    } tiers[] = {
        {"4 nodes 1:1:1:1, +1", {S_GIB, S_GIB, S_GIB, S_GIB, S_GIB}},
        {"4 nodes 1:1:1:2, +1", {S_GIB, S_GIB, S_GIB, 2 * S_GIB, S_GIB}},
    };
    s_ctx_t *c = bench_alloc(n_ctx * sizeof *c);
    printf("placement of %zu contexts, R=%u, %u seeds (median [max] over seeds)\n", n_ctx, r,
           seeds);
    printf("%-22s %16s %16s %16s %16s %22s %14s\n", "tier", "contexts max/mean", "bytes max/mean",
           "ctx max/share", "bytes max/share", "moved ctx (replicas)", "ideal replicas");
    for (size_t t = 0; t < sizeof tiers / sizeof tiers[0]; t++) {
        double *v[7];
        for (int k = 0; k < 7; k++)
            v[k] = bench_alloc(seeds * sizeof(double));
        double cnt[S_MAX_NODES], bytes[S_MAX_NODES], lastc[S_MAX_NODES] = {0};
        for (uint32_t s = 0; s < seeds; s++) {
            s_contexts(c, n_ctx, 1000 + s);
            s_fig_t f;
            s_run(c, n_ctx, tiers[t].w, 4, r, &f, cnt, bytes);
            double fig[7] = {f.ctx_max_mean,    f.bytes_max_mean,         f.ctx_max_share,
                             f.bytes_max_share, (double)f.moved_contexts, (double)f.moved_replicas,
                             f.ideal_moved};
            for (int k = 0; k < 7; k++)
                v[k][s] = fig[k];
            if (s == 0)
                memcpy(lastc, cnt, sizeof cnt);
        }
        double med[7], mx[7];
        for (int k = 0; k < 7; k++) {
            qsort(v[k], seeds, sizeof(double), s_cmp);
            med[k] = v[k][seeds / 2];
            mx[k] = v[k][seeds - 1];
        }
        printf("%-22s %8.3f [%.3f] %8.3f [%.3f] %8.3f [%.3f] %8.3f [%.3f] %7.0f (%4.0f) [%4.0f] "
               "%14.0f\n",
               tiers[t].name, med[0], mx[0], med[1], mx[1], med[2], mx[2], med[3], mx[3], med[4],
               med[5], mx[5], med[6]);
        printf("  seed 1000, replicas per node: %.0f %.0f %.0f %.0f (of %zu)\n", lastc[0], lastc[1],
               lastc[2], lastc[3], n_ctx * r);
        for (int k = 0; k < 7; k++)
            free(v[k]);
    }
    /* The cost of one placement decision on 4 and on 64 nodes. */
    kvedge_place_node_t nodes[64];
    memset(nodes, 0, sizeof nodes);
    for (int i = 0; i < 64; i++) {
        snprintf(nodes[i].id, sizeof nodes[i].id, "cloud-%d", i + 1);
        nodes[i].weight = S_GIB;
        nodes[i].up = true;
    }
    s_contexts(c, n_ctx, 7);
    for (size_t nn = 4; nn <= 64; nn *= 16) {
        double best = 1e30;
        for (int rep = 0; rep < KVEDGE_BENCH_REPS_MIN; rep++) {
            double t0 = bench_now_s();
            for (size_t k = 0; k < n_ctx; k++) {
                uint32_t out[4], got;
                KVEDGE_BENCH_CHECK(kvedge_place_pick(&c[k].key, nodes, nn, r, out, &got));
            }
            double dt = (bench_now_s() - t0) / (double)n_ctx;
            best = dt < best ? dt : best;
        }
        printf("kvedge_place_pick on %zu nodes: %.2f us per context (best of %d)\n", nn, best * 1e6,
               KVEDGE_BENCH_REPS_MIN);
    }
    free(c);
    return 0;
}
