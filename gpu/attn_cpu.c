/* CPU reference of gpu/attn.h: per kv head, query tiles of scores by sgemm (over the keys the
 * tile can see), a row softmax kept as (max, sum), and P.V by sgemm; the merge is the
 * log-sum-exp rule row by row. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/attn.h"
#include "access/codec/error.h"
#include "access/codec/quant.h"

/* Query rows per sgemm: bounds the score scratch at S_QTILE * n floats. */
#define S_QTILE 64

int kvedge_attn_partial_check(const kvedge_attn_partial_args_t *a)
{
    if (!a || !a->o || !a->lse || a->heads == 0 || a->head_dim == 0 ||
        kvedge_dtype_size(a->dtype) == 0 || !isfinite(a->scale))
        return KVEDGE_EINVAL;
    const uint32_t kvh = a->kv_heads ? a->kv_heads : a->heads;
    if (a->heads % kvh != 0)
        return KVEDGE_EINVAL;
    if ((a->nq && !a->q) || (a->n && a->nq && (!a->k || !a->v)))
        return KVEDGE_EINVAL;
    return KVEDGE_OK;
}

/* Keys query i (of the partial) may see: [0, limit). */
static uint32_t s_limit(const kvedge_attn_partial_args_t *a, uint32_t i)
{
    if (!a->causal)
        return a->n;
    const int64_t lim = (int64_t)i + a->causal_offset + 1;
    return lim <= 0 ? 0 : lim >= (int64_t)a->n ? a->n : (uint32_t)lim;
}

/* fp32 view of n elements: the source itself, or a conversion into buf. */
static const float *s_f32(kvedge_dtype_t dt, const void *src, size_t n, float *buf)
{
    if (dt == KVEDGE_DTYPE_FP32)
        return src;
    kvedge_convert_to_f32(dt, src, n, buf);
    return buf;
}

int kvedge_cpu_attn_partial(const kvedge_attn_partial_args_t *a)
{
    int rc = kvedge_attn_partial_check(a);
    if (rc != KVEDGE_OK)
        return rc;
    const uint32_t H = a->heads, KH = a->kv_heads ? a->kv_heads : a->heads, D = a->head_dim;
    const uint32_t n = a->n, nq = a->nq, grp = H / KH;
    const size_t es = kvedge_dtype_size(a->dtype);
    if (nq == 0)
        return KVEDGE_OK;
    const size_t kv_elems = (size_t)n * D, conv = a->dtype == KVEDGE_DTYPE_FP32 ? 0 : 1;
    float *kbuf = malloc(
        sizeof(float) * (conv * 2 * kv_elems + conv * S_QTILE * D + (size_t)S_QTILE * (n ? n : 1)) +
        1);
    if (!kbuf)
        return KVEDGE_ENOMEM;
    float *vbuf = kbuf + conv * kv_elems, *qbuf = vbuf + conv * kv_elems;
    float *sc = qbuf + conv * S_QTILE * D;
    for (uint32_t kh = 0; kh < KH; kh++) {
        const float *K = NULL, *V = NULL;
        if (n) {
            K = s_f32(a->dtype, (const uint8_t *)a->k + kh * kv_elems * es, kv_elems, kbuf);
            V = s_f32(a->dtype, (const uint8_t *)a->v + kh * kv_elems * es, kv_elems, vbuf);
        }
        for (uint32_t h = kh * grp; h < (kh + 1) * grp; h++) {
            for (uint32_t i0 = 0; i0 < nq; i0 += S_QTILE) {
                const uint32_t qt = nq - i0 < S_QTILE ? nq - i0 : S_QTILE;
                float *O = a->o + ((size_t)h * nq + i0) * D;
                float *L = a->lse + (size_t)h * nq + i0;
                if (n == 0) {
                    memset(O, 0, sizeof(float) * qt * D);
                    for (uint32_t i = 0; i < qt; i++)
                        L[i] = -INFINITY;
                    continue;
                }
                /* Keys past what the tile's last query sees are masked for every row of the
                 * tile: causal tiles skip them (half the work of a causal prefill). */
                const uint32_t cols = s_limit(a, i0 + qt - 1);
                if (cols == 0) {
                    memset(O, 0, sizeof(float) * qt * D);
                    for (uint32_t i = 0; i < qt; i++)
                        L[i] = -INFINITY;
                    continue;
                }
                const float *Q =
                    s_f32(a->dtype, (const uint8_t *)a->q + ((size_t)h * nq + i0) * D * es,
                          (size_t)qt * D, qbuf);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)qt, (int)cols, (int)D,
                            a->scale, Q, (int)D, K, (int)D, 0.0f, sc, (int)cols);
                for (uint32_t i = 0; i < qt; i++) {
                    float *s = sc + (size_t)i * cols;
                    const uint32_t lim = s_limit(a, i0 + i);
                    float m = -INFINITY;
                    for (uint32_t j = 0; j < lim; j++)
                        m = s[j] > m ? s[j] : m;
                    double sum = 0;
                    for (uint32_t j = 0; j < lim; j++) {
                        s[j] = expf(s[j] - m);
                        sum += s[j];
                    }
                    for (uint32_t j = lim; j < cols; j++)
                        s[j] = 0.0f;
                    /* Normalize P before P.V so O comes out scaled; an empty row stays 0. */
                    const float inv = lim ? (float)(1.0 / sum) : 0.0f;
                    for (uint32_t j = 0; j < lim; j++)
                        s[j] *= inv;
                    L[i] = lim ? m + (float)log(sum) : -INFINITY;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)qt, (int)D, (int)cols,
                            1.0f, sc, (int)cols, V, (int)D, 0.0f, O, (int)D);
            }
        }
    }
    free(kbuf);
    return KVEDGE_OK;
}

int kvedge_attn_merge_check(const kvedge_attn_merge_args_t *a)
{
    if (!a || !a->o1 || !a->lse1 || !a->o2 || !a->lse2 || !a->o || !a->lse || a->head_dim == 0)
        return KVEDGE_EINVAL;
    return KVEDGE_OK;
}

int kvedge_cpu_attn_merge(const kvedge_attn_merge_args_t *a)
{
    int rc = kvedge_attn_merge_check(a);
    if (rc != KVEDGE_OK)
        return rc;
    const uint32_t D = a->head_dim;
    for (uint32_t r = 0; r < a->rows; r++) {
        const float l1 = a->lse1[r], l2 = a->lse2[r];
        const float m = l1 > l2 ? l1 : l2;
        const float *o1 = a->o1 + (size_t)r * D, *o2 = a->o2 + (size_t)r * D;
        float *o = a->o + (size_t)r * D;
        if (m == -INFINITY) { /* both partials empty */
            for (uint32_t c = 0; c < D; c++)
                o[c] = 0.0f;
            a->lse[r] = -INFINITY;
            continue;
        }
        const float w1 = expf(l1 - m), w2 = expf(l2 - m), s = w1 + w2;
        const float a1 = w1 / s, a2 = w2 / s;
        for (uint32_t c = 0; c < D; c++)
            o[c] = a1 * o1[c] + a2 * o2[c];
        a->lse[r] = m + logf(s);
    }
    return KVEDGE_OK;
}
