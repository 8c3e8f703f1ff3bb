/* Coding-basis files for tests (access/codec/basis.h's layout): valid bytes of a small basis
 * whose transforms are known, so that a test can bound what a tc block decodes to. Header-only;
 * needs libsodium (kvedge_codec links it). */
#ifndef KVEDGE_TESTS_BASIS_FIXTURE_H
#define KVEDGE_TESTS_BASIS_FIXTURE_H

#include <math.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/basis.h"
#include "access/codec/block.h"
#include "access/codec/byteorder.h"
#include "access/codec/chunk.h"
#include "access/codec/error.h"
#include "access/codec/half.h"

/* The basis fuzz_block registers and gen_corpus codes its tc seeds against (the same bytes,
 * so the same id). */
#define KT_FUZZ_TC_MODEL  "fuzz-tc"
#define KT_FUZZ_TC_LAYERS 2
#define KT_FUZZ_TC_HEADS  2
#define KT_FUZZ_TC_DIM    12
#define KT_FUZZ_TC_STEP   0.05f
#define KT_FUZZ_TC_SEED   1

/* What each section's transform is. */
typedef enum {
    /* A signed permutation from the seed: exact in fp16, inv = fwd^T exactly, so a value comes
     * back within step/2 (plus fp16 rounding of the channel mean). */
    KT_BASIS_SIGNED_PERM = 0,
    /* A dense orthonormal Q (three Householder reflections from the seed) as the study builds
     * it: inv = fp16(Q^T), fwd = the exact inverse of that fp16 matrix. */
    KT_BASIS_ROTATION = 1,
} kt_basis_kind_t;

static inline uint32_t kt_basis_rand_(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

/* Inverts a [d][d] (double, row-major) by Gauss-Jordan with partial pivoting into out; returns
 * 0, or -1 when singular. */
static inline int kt_basis_invert_(const double *a, uint32_t d, double *out)
{
    double *m = malloc(sizeof(double) * d * 2u * d);
    if (!m)
        return -1;
    const uint32_t w = 2u * d;
    for (uint32_t r = 0; r < d; r++)
        for (uint32_t c = 0; c < w; c++)
            m[r * w + c] = c < d ? a[r * d + c] : (c - d == r ? 1.0 : 0.0);
    for (uint32_t c = 0; c < d; c++) {
        uint32_t p = c;
        for (uint32_t r = c + 1; r < d; r++)
            if (fabs(m[r * w + c]) > fabs(m[p * w + c]))
                p = r;
        if (fabs(m[p * w + c]) < 1e-12) {
            free(m);
            return -1;
        }
        for (uint32_t k = 0; k < w && p != c; k++) {
            const double t = m[c * w + k];
            m[c * w + k] = m[p * w + k];
            m[p * w + k] = t;
        }
        const double piv = m[c * w + c];
        for (uint32_t k = 0; k < w; k++)
            m[c * w + k] /= piv;
        for (uint32_t r = 0; r < d; r++) {
            if (r == c || m[r * w + c] == 0.0)
                continue;
            const double f = m[r * w + c];
            for (uint32_t k = 0; k < w; k++)
                m[r * w + k] -= f * m[c * w + k];
        }
    }
    for (uint32_t r = 0; r < d; r++)
        for (uint32_t c = 0; c < d; c++)
            out[r * d + c] = m[r * w + d + c];
    free(m);
    return 0;
}

/* One section's fwd (fp32) and inv (fp16) of a kind; returns 0 or -1. */
static inline int kt_basis_section_(kt_basis_kind_t kind, uint32_t d, uint64_t *rng, float *fwd,
                                    uint16_t *inv)
{
    if (kind == KT_BASIS_SIGNED_PERM) {
        uint32_t *perm = malloc(sizeof(uint32_t) * d);
        if (!perm)
            return -1;
        for (uint32_t i = 0; i < d; i++)
            perm[i] = i;
        for (uint32_t i = d; i > 1; i--) {
            const uint32_t j = kt_basis_rand_(rng) % i, t = perm[i - 1];
            perm[i - 1] = perm[j];
            perm[j] = t;
        }
        memset(fwd, 0, sizeof(float) * d * d);
        for (uint32_t i = 0; i < (size_t)d * d; i++)
            inv[i] = kvedge_f32_to_fp16(0.0f);
        for (uint32_t c = 0; c < d; c++) {
            const float sign = kt_basis_rand_(rng) & 1u ? -1.0f : 1.0f;
            fwd[c * d + perm[c]] = sign;                     /* y[perm[c]] = sign x[c] */
            inv[perm[c] * d + c] = kvedge_f32_to_fp16(sign); /* x[c] = sign y[perm[c]] */
        }
        free(perm);
        return 0;
    }
    double *q = malloc(sizeof(double) * d * d), *qi = malloc(sizeof(double) * d * d),
           *v = malloc(sizeof(double) * d);
    int rc = -1;
    if (!q || !qi || !v)
        goto out;
    for (uint32_t i = 0; i < d * d; i++)
        q[i] = i / d == i % d ? 1.0 : 0.0;
    for (int h = 0; h < 3 && d > 1; h++) { /* Q = Q (I - 2 v v^T / v^T v) */
        double vv = 0;
        for (uint32_t i = 0; i < d; i++) {
            v[i] = (double)(kt_basis_rand_(rng) % 2001u) / 1000.0 - 1.0;
            vv += v[i] * v[i];
        }
        if (vv < 1e-6)
            continue;
        for (uint32_t r = 0; r < d; r++) {
            double dot = 0;
            for (uint32_t i = 0; i < d; i++)
                dot += q[r * d + i] * v[i];
            for (uint32_t i = 0; i < d; i++)
                q[r * d + i] -= 2.0 * dot * v[i] / vv;
        }
    }
    /* inv = fp16(Q^T); fwd = inv^-1 (of the fp16 values), so fwd then inv is the identity. */
    for (uint32_t j = 0; j < d; j++)
        for (uint32_t c = 0; c < d; c++) {
            inv[j * d + c] = kvedge_f32_to_fp16((float)q[c * d + j]);
            qi[j * d + c] = (double)kvedge_fp16_to_f32(inv[j * d + c]);
        }
    if (kt_basis_invert_(qi, d, q) != 0)
        goto out;
    for (uint32_t i = 0; i < d * d; i++)
        fwd[i] = (float)q[i];
    rc = 0;
out:
    free(v);
    free(qi);
    free(q);
    return rc;
}

/* Bytes of a valid basis file of a kind for model_id (L layers, H KV heads, head_dim D), every
 * section at `step` (rounded to fp16), the transforms drawn from seed. *out is malloc'd.
 * Returns 0, or -1 (bad arguments, out of memory). */
static inline int kt_basis_file_kind(kt_basis_kind_t kind, const char *model_id, uint32_t layers,
                                     uint32_t kv_heads, uint32_t head_dim, float step,
                                     uint32_t seed, uint8_t **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    const size_t idlen = model_id ? strlen(model_id) : 0;
    if (idlen == 0 || idlen > KVEDGE_MODEL_ID_MAX_BYTES || layers == 0 || kv_heads == 0 ||
        head_dim == 0 || head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM)
        return -1;
    const size_t dd = (size_t)head_dim * head_dim, sec = 4u + 6u * dd;
    const size_t len = KVEDGE_BASIS_HEADER_BYTES + (size_t)layers * kv_heads * 2u * sec +
                       KVEDGE_BASIS_DIGEST_BYTES;
    uint8_t *buf = calloc(1, len);
    float *fwd = malloc(sizeof(float) * dd);
    uint16_t *inv = malloc(sizeof(uint16_t) * dd);
    if (!buf || !fwd || !inv || sodium_init() < 0) {
        free(inv);
        free(fwd);
        free(buf);
        return -1;
    }
    memcpy(buf, KVEDGE_BASIS_MAGIC, 8);
    kvedge_le_put16(buf + 8, KVEDGE_BASIS_VERSION);
    kvedge_le_put16(buf + 12, (uint16_t)head_dim);
    kvedge_le_put32(buf + 16, layers);
    kvedge_le_put32(buf + 20, kv_heads);
    memcpy(buf + 24, model_id, idlen);
    const float st = kvedge_fp16_to_f32(kvedge_f32_to_fp16(step));
    uint64_t rng = 0x9E3779B97F4A7C15ull ^ seed;
    uint8_t *p = buf + KVEDGE_BASIS_HEADER_BYTES;
    for (size_t s = 0; s < (size_t)layers * kv_heads * 2u; s++) {
        if (kt_basis_section_(kind, head_dim, &rng, fwd, inv) != 0) {
            free(inv);
            free(fwd);
            free(buf);
            return -1;
        }
        kvedge_le_put32(p, kvedge_f32_bits(st));
        p += 4;
        for (size_t i = 0; i < dd; i++, p += 4)
            kvedge_le_put32(p, kvedge_f32_bits(fwd[i]));
        for (size_t i = 0; i < dd; i++, p += 2)
            kvedge_le_put16(p, inv[i]);
    }
    crypto_generichash(p, KVEDGE_BASIS_DIGEST_BYTES, buf, len - KVEDGE_BASIS_DIGEST_BYTES, NULL, 0);
    free(inv);
    free(fwd);
    *out = buf;
    *out_len = len;
    return 0;
}

/* kt_basis_file_kind with signed permutations (exact: what most tests want). */
static inline int kt_basis_file(const char *model_id, uint32_t layers, uint32_t kv_heads,
                                uint32_t head_dim, float step, uint32_t seed, uint8_t **out,
                                size_t *out_len)
{
    return kt_basis_file_kind(KT_BASIS_SIGNED_PERM, model_id, layers, kv_heads, head_dim, step,
                              seed, out, out_len);
}

/* Re-seals a file's digest after a test edited its bytes (to reach the checks behind it). */
static inline void kt_basis_reseal(uint8_t *buf, size_t len)
{
    if (len < KVEDGE_BASIS_DIGEST_BYTES || sodium_init() < 0)
        return;
    crypto_generichash(buf + len - KVEDGE_BASIS_DIGEST_BYTES, KVEDGE_BASIS_DIGEST_BYTES, buf,
                       len - KVEDGE_BASIS_DIGEST_BYTES, NULL, 0);
}

/* Writes kt_basis_file's bytes to path; returns 0 or -1. */
static inline int kt_basis_write(const char *path, const char *model_id, uint32_t layers,
                                 uint32_t kv_heads, uint32_t head_dim, float step, uint32_t seed)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    if (kt_basis_file(model_id, layers, kv_heads, head_dim, step, seed, &buf, &len) != 0)
        return -1;
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(buf, 1, len, f) == len;
    if (f && fclose(f) != 0)
        ok = 0;
    free(buf);
    return ok ? 0 : -1;
}

#endif
