/* The tc section codec (access/codec/tcbody.h) per block (a K and a V section): encode and
 * decode time, MB/s of fp16 per core and bytes, against a memcpy of the block's fp16 K/V and
 * kvedge's int8 block encode/decode of the same head, on real K/V of the four trained models
 * with their fitted bases (models/kjv/.../basis.kvb) and on synthetic 256 x 128 heads; and the
 * coded bytes of the encoder's estimated choice against the exhaustive search
 * (kvedge_tc_encode_full: every layout at both rANS orders). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "access/codec/basis.h"
#include "access/codec/block.h"
#include "access/codec/error.h"
#include "access/codec/quant.h"
#include "access/codec/tcbody.h"
#include "bench/bench_common.h"
#include "bench/bench_kjv.h"
#include "clients/decoder/decoder.h"

#define S_CHUNK_TOKENS   256
#define S_PREFILL_TOKENS 512
#define S_MODELS         BENCH_KJV_MODELS
#define S_SYN_DIM        128
#define S_SYN_HEADS      16
/* A link to price the decode against: 1 Gbit/s, in MB/s of coded bytes. */
#define S_LINK_MBPS 125.0

static const char *s_models_root = "models";
static int s_reps = KVEDGE_BENCH_REPS_MIN;
/* --no-full: skip the exhaustive search (to profile the encoder alone). */
static int s_no_full;

/* One head's block: K and V fp32 [T][D] and the basis sections they are coded with. */
typedef struct {
    uint32_t T, D;
    float *x[2];
    const float *fwd[2], *inv[2];
    float step[2];
} s_head_t;

typedef struct {
    s_head_t *h;
    size_t n, cap;
    /* Synthetic bases own their matrices. */
    float *own;
} s_set_t;

static void s_add(s_set_t *s, s_head_t h)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->h = realloc(s->h, s->cap * sizeof *s->h);
        if (!s->h)
            exit(1);
    }
    s->h[s->n++] = h;
}

/* Every (layer, KV head, chunk) of one prefill of the held-out text, with the model's basis
 * (kept for the process's life). */
static void s_collect(int model, const int32_t *ids, size_t n_ids, s_set_t *set)
{
    kvedge_basis_t *b = bench_kjv_basis("bench_tc", s_models_root, model);
    kvedge_decoder_t *m = bench_kjv_decoder("bench_tc", s_models_root, model);
    const kvedge_decoder_config_t *c = kvedge_decoder_config(m);
    const uint32_t L = c->layers, H = kvedge_decoder_kv_heads(m), D = c->head_dim;
    const size_t per_layer = kvedge_decoder_kv_floats(m, S_PREFILL_TOKENS);
    float *k = bench_alloc(L * per_layer * sizeof *k), *v = bench_alloc(L * per_layer * sizeof *v);
    if (n_ids < S_PREFILL_TOKENS) {
        fprintf(stderr, "bench_tc: held-out text too short\n");
        exit(1);
    }
    KVEDGE_BENCH_CHECK(kvedge_decoder_prefill(m, ids, S_PREFILL_TOKENS, NULL, k, v));
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t h = 0; h < H; h++)
            for (uint32_t ch = 0; ch < S_PREFILL_TOKENS / S_CHUNK_TOKENS; ch++) {
                const size_t at = l * per_layer +
                                  ((size_t)h * S_PREFILL_TOKENS + (size_t)ch * S_CHUNK_TOKENS) * D;
                s_head_t hd = {.T = S_CHUNK_TOKENS, .D = D};
                for (int w = 0; w < 2; w++) {
                    kvedge_basis_section_t sec;
                    KVEDGE_BENCH_CHECK(kvedge_basis_section(b, l, h, w, &sec));
                    hd.fwd[w] = sec.fwd;
                    hd.inv[w] = sec.inv;
                    hd.step[w] = sec.step;
                    /* As a node holds it: fp16. */
                    const size_t n = (size_t)S_CHUNK_TOKENS * D;
                    uint16_t *h16 = bench_alloc(n * 2);
                    hd.x[w] = bench_alloc(n * sizeof(float));
                    kvedge_convert_from_f32(KVEDGE_DTYPE_FP16, (w ? v : k) + at, n, h16);
                    kvedge_convert_to_f32(KVEDGE_DTYPE_FP16, h16, n, hd.x[w]);
                    free(h16);
                }
                s_add(set, hd);
            }
    free(k);
    free(v);
    kvedge_decoder_destroy(&m);
    /* b stays alive: the set points into it. */
}

/* Seconds of this thread's CPU time: the figures are per core, and the machine may be shared. */
static double s_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint32_t s_rng = 2463534242u;
static double s_gauss(void)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        s_rng ^= s_rng << 13;
        s_rng ^= s_rng >> 17;
        s_rng ^= s_rng << 5;
        u[i] = ((double)s_rng + 1.0) / 4294967297.0;
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

/* Synthetic 256 x 128 heads: a random orthonormal basis, components whose spread falls
 * geometrically from 60 steps to a tenth of a step over the 128 (the shape of the fitted bases'
 * KLT spectra), each an AR(1) over tokens (rho 0.6), plus per-channel offsets. */
static void s_synthetic(s_set_t *set)
{
    const uint32_t D = S_SYN_DIM, T = S_CHUNK_TOKENS;
    set->own = bench_alloc(2u * D * D * sizeof(float));
    float *fwd = set->own, *inv = set->own + (size_t)D * D;
    double *b = bench_alloc((size_t)D * D * sizeof *b);
    for (size_t i = 0; i < (size_t)D * D; i++)
        b[i] = s_gauss();
    for (uint32_t j = 0; j < D; j++) {
        for (uint32_t k = 0; k < j; k++) {
            double dot = 0;
            for (uint32_t c = 0; c < D; c++)
                dot += b[(size_t)c * D + j] * b[(size_t)c * D + k];
            for (uint32_t c = 0; c < D; c++)
                b[(size_t)c * D + j] -= dot * b[(size_t)c * D + k];
        }
        double norm = 0;
        for (uint32_t c = 0; c < D; c++)
            norm += b[(size_t)c * D + j] * b[(size_t)c * D + j];
        for (uint32_t c = 0; c < D; c++)
            b[(size_t)c * D + j] /= sqrt(norm);
    }
    for (uint32_t c = 0; c < D; c++)
        for (uint32_t j = 0; j < D; j++) {
            fwd[(size_t)c * D + j] = (float)b[(size_t)c * D + j];
            inv[(size_t)j * D + c] = (float)b[(size_t)c * D + j];
        }
    free(b);
    const float step = 0.0625f;
    double *y = bench_alloc(D * sizeof *y);
    for (int h = 0; h < S_SYN_HEADS; h++) {
        s_head_t hd = {.T = T, .D = D};
        for (int w = 0; w < 2; w++) {
            hd.fwd[w] = fwd;
            hd.inv[w] = inv;
            hd.step[w] = step;
            hd.x[w] = bench_alloc((size_t)T * D * sizeof(float));
            for (uint32_t j = 0; j < D; j++)
                y[j] = 0;
            for (uint32_t t = 0; t < T; t++)
                for (uint32_t c = 0; c < D; c++) {
                    if (c == 0)
                        for (uint32_t j = 0; j < D; j++) {
                            const double sd = step * 60.0 * pow(600.0, -(double)j / (D - 1));
                            y[j] = 0.6 * y[j] + 0.8 * sd * s_gauss();
                        }
                    double v = 0.05 * (double)c - 3.0;
                    for (uint32_t j = 0; j < D; j++)
                        v += y[j] * inv[(size_t)j * D + c];
                    hd.x[w][(size_t)t * D + c] = (float)v;
                }
        }
        s_add(set, hd);
    }
    free(y);
}

/* Figures of one set: per block (K and V) medians over blocks of the median of s_reps runs. */
typedef struct {
    double enc_us, dec_us, full_us, int8_enc_us, int8_dec_us, cpy_us;
    double bytes, full_bytes, int8_bytes, fp16_bytes;
    size_t blocks, same_choice;
} s_fig_t;

typedef int (*s_enc_fn)(const kvedge_tc_shape_t *, const float *, const float *, float, uint8_t *,
                        size_t, size_t *);

/* Median seconds of s_reps encodes of both sections with fn; their bytes in *bytes. */
static double s_time_encode(const s_head_t *h, s_enc_fn fn, uint8_t *out[2], size_t cap,
                            size_t len[2])
{
    const kvedge_tc_shape_t s = {h->T, h->D};
    double *t = bench_alloc((size_t)s_reps * sizeof *t);
    for (int r = 0; r < s_reps; r++) {
        const double t0 = s_cpu_s();
        for (int w = 0; w < 2; w++)
            KVEDGE_BENCH_CHECK(fn(&s, h->x[w], h->fwd[w], h->step[w], out[w], cap, &len[w]));
        t[r] = s_cpu_s() - t0;
    }
    const double med = bench_median(t, (size_t)s_reps);
    free(t);
    return med;
}

/* Median seconds of s_reps int8 block encodes and decodes of the head (from its fp16 K/V, in
 * k16 and v16, which the decodes overwrite); the block's bytes in *bytes. rt: s_reps doubles. */
static void s_time_int8(const s_head_t *h, uint16_t *k16, uint16_t *v16, double *rt, double *enc,
                        double *dec, size_t *bytes)
{
    const size_t nv = (size_t)h->T * h->D;
    kvedge_convert_from_f32(KVEDGE_DTYPE_FP16, h->x[0], nv, k16);
    kvedge_convert_from_f32(KVEDGE_DTYPE_FP16, h->x[1], nv, v16);
    const kvedge_block_spec_t spec = {.dtype = KVEDGE_DTYPE_FP16,
                                      .scheme = KVEDGE_SCHEME_INT8,
                                      .tokens = h->T,
                                      .head_dim = (uint16_t)h->D};
    const size_t bcap = kvedge_block_encoded_bound(&spec);
    uint8_t *blk = bench_alloc(bcap);
    size_t blen = 0;
    for (int r = 0; r < s_reps; r++) {
        const double t0 = s_cpu_s();
        KVEDGE_BENCH_CHECK(kvedge_block_encode(&spec, k16, v16, blk, bcap, &blen));
        rt[r] = s_cpu_s() - t0;
    }
    *enc = bench_median(rt, (size_t)s_reps);
    kvedge_block_info_t info;
    KVEDGE_BENCH_CHECK(kvedge_block_parse(blk, blen, &info));
    for (int r = 0; r < s_reps; r++) {
        const double t0 = s_cpu_s();
        KVEDGE_BENCH_CHECK(kvedge_block_decode(&info, KVEDGE_DTYPE_FP16, k16, v16));
        rt[r] = s_cpu_s() - t0;
    }
    *dec = bench_median(rt, (size_t)s_reps);
    *bytes = blen;
    free(blk);
}

static void s_measure(const s_set_t *set, s_fig_t *f)
{
    memset(f, 0, sizeof *f);
    const size_t n = set->n;
    double *v[8];
    for (int i = 0; i < 8; i++)
        v[i] = bench_alloc(n * sizeof(double));
    double *rt = bench_alloc((size_t)s_reps * sizeof *rt), *rc = bench_alloc(s_reps * sizeof *rc);
    double tot_bytes = 0, tot_full = 0, tot_int8 = 0, tot_fp16 = 0;
    for (size_t i = 0; i < n; i++) {
        const s_head_t *h = &set->h[i];
        const kvedge_tc_shape_t s = {h->T, h->D};
        const size_t cap = kvedge_tc_bound(&s), nv = (size_t)h->T * h->D;
        uint8_t *out[2] = {bench_alloc(cap), bench_alloc(cap)};
        uint8_t *full[2] = {bench_alloc(cap), bench_alloc(cap)};
        size_t len[2], flen[2];
        v[0][i] = s_time_encode(h, kvedge_tc_encode, out, cap, len);
        v[1][i] = s_no_full ? 0 : s_time_encode(h, kvedge_tc_encode_full, full, cap, flen);
        if (s_no_full) {
            memcpy(flen, len, sizeof flen);
            memcpy(full[0], out[0], len[0]);
            memcpy(full[1], out[1], len[1]);
        }
        f->same_choice += (out[0][0] == full[0][0]) + (out[1][0] == full[1][0]);
        float *x = bench_alloc(nv * sizeof *x);
        uint16_t *k16 = bench_alloc(nv * 2), *v16 = bench_alloc(nv * 2);
        uint16_t *src = bench_alloc(2 * nv * 2), *dst = bench_alloc(2 * nv * 2);
        memset(src, 1, 2 * nv * 2);
        for (int r = 0; r < s_reps; r++) {
            double t0 = s_cpu_s();
            for (int w = 0; w < 2; w++) {
                KVEDGE_BENCH_CHECK(kvedge_tc_decode(&s, out[w], len[w], h->inv[w], x));
                kvedge_convert_from_f32(KVEDGE_DTYPE_FP16, x, nv, w ? v16 : k16);
            }
            rt[r] = s_cpu_s() - t0;
            t0 = s_cpu_s();
            memcpy(dst, src, 2 * nv * 2);
            rc[r] = s_cpu_s() - t0;
        }
        v[2][i] = bench_median(rt, (size_t)s_reps);
        v[3][i] = bench_median(rc, (size_t)s_reps);
        if (dst[nv] != src[nv]) /* keep the copy */
            exit(1);
        size_t blen;
        s_time_int8(h, k16, v16, rt, &v[4][i], &v[5][i], &blen);
        tot_bytes += (double)(len[0] + len[1]);
        tot_full += (double)(flen[0] + flen[1]);
        tot_int8 += (double)blen;
        tot_fp16 += (double)(4 * nv);
        free(x);
        free(k16);
        free(v16);
        free(src);
        free(dst);
        for (int w = 0; w < 2; w++) {
            free(out[w]);
            free(full[w]);
        }
    }
    f->blocks = n;
    f->enc_us = 1e6 * bench_median(v[0], n);
    f->full_us = 1e6 * bench_median(v[1], n);
    f->dec_us = 1e6 * bench_median(v[2], n);
    f->cpy_us = 1e6 * bench_median(v[3], n);
    f->int8_enc_us = 1e6 * bench_median(v[4], n);
    f->int8_dec_us = 1e6 * bench_median(v[5], n);
    f->bytes = tot_bytes / (double)n;
    f->full_bytes = tot_full / (double)n;
    f->int8_bytes = tot_int8 / (double)n;
    f->fp16_bytes = tot_fp16 / (double)n;
    for (int i = 0; i < 8; i++)
        free(v[i]);
    free(rt);
    free(rc);
}

int main(int argc, char **argv)
{
    int synthetic_only = 0, real_only = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--models") == 0 && i + 1 < argc) {
            s_models_root = argv[++i];
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            s_reps = atoi(argv[++i]);
            if (s_reps < 1)
                s_reps = 1;
        } else if (strcmp(argv[i], "--no-full") == 0) {
            s_no_full = 1;
        } else if (strcmp(argv[i], "--real") == 0) {
            real_only = 1;
        } else if (strcmp(argv[i], "--synthetic") == 0) {
            synthetic_only = 1;
        } else {
            fprintf(
                stderr,
                "usage: bench_tc [--models DIR] [--reps N] [--synthetic | --real] [--no-full]\n");
            return 2;
        }
    }
    const int sets = S_MODELS + 1;
    s_set_t *set = calloc((size_t)sets, sizeof *set);
    if (!set)
        return 1;
    if (!synthetic_only) {
        size_t n_ids;
        int32_t *ids = bench_read_heldout_ids("bench_tc", s_models_root, &n_ids);
        for (int m = 0; m < S_MODELS; m++)
            s_collect(m, ids, n_ids, &set[m]);
        free(ids);
    }
    if (!real_only)
        s_synthetic(&set[S_MODELS]);
    printf("# bench_tc: per block (a K and a V section of one head, %u tokens), medians over "
           "blocks of the median of %d runs, one core (thread CPU time)\n\n",
           S_CHUNK_TOKENS, s_reps);
    printf("| set | blocks | D | tc encode us | full search us | tc decode us | int8 encode us "
           "| int8 decode us | memcpy fp16 us | tc decode fp16 MB/s | tc encode fp16 MB/s | tc "
           "bytes | full search bytes | size change | same layout | tc / int8 bytes | coded MB/s "
           "in (1 Gbit/s = %.0f) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
           "---:|---:|---:|---:|---:|\n",
           S_LINK_MBPS);
    for (int m = 0; m < sets; m++) {
        if (set[m].n == 0)
            continue;
        s_fig_t f;
        s_measure(&set[m], &f);
        printf("| %s | %zu | %u | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f | %.0f | %.0f | %.0f | "
               "%.0f | %+.2f %% | %zu/%zu | %.3f | %.0f |\n",
               m < S_MODELS ? bench_kjv_names[m] : "synthetic", f.blocks, set[m].h[0].D, f.enc_us,
               f.full_us, f.dec_us, f.int8_enc_us, f.int8_dec_us, f.cpy_us, f.fp16_bytes / f.dec_us,
               f.fp16_bytes / f.enc_us, f.bytes, f.full_bytes,
               100.0 * (f.bytes / f.full_bytes - 1.0), f.same_choice, 2 * f.blocks,
               f.bytes / f.int8_bytes, f.bytes / f.dec_us);
        fflush(stdout);
    }
    for (int m = 0; m < sets; m++) {
        for (size_t i = 0; i < set[m].n; i++) {
            free(set[m].h[i].x[0]);
            free(set[m].h[i].x[1]);
        }
        free(set[m].h);
        free(set[m].own);
    }
    free(set);
    return 0;
}
