/* CPU reference of gpu/scores.h: gather the kept channels of q once, then one sgemm against
 * the compact keys. */
#include <cblas.h>
#include <stdlib.h>

#include "gpu/scores.h"
#include "access/codec/error.h"
#include "access/codec/quant.h"

int kvedge_scores_check(const kvedge_scores_args_t *a)
{
    if (!a || a->head_dim == 0 || a->head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM || a->key_channels == 0 ||
        a->key_channels > a->head_dim || kvedge_dtype_size(a->k_dtype) == 0)
        return KVEDGE_EINVAL;
    if ((a->nq && !a->q) || (a->nq && a->tokens && (!a->k || !a->scores)))
        return KVEDGE_EINVAL;
    uint32_t kept = 0;
    if (a->key_mask) {
        for (uint32_t c = 0; c < (a->head_dim + 7) / 8 * 8; c++) {
            const unsigned bit = (a->key_mask[c >> 3] >> (c & 7)) & 1u;
            if (bit && c >= a->head_dim)
                return KVEDGE_EINVAL;
            kept += bit;
        }
    } else {
        kept = a->head_dim;
    }
    return kept == a->key_channels ? KVEDGE_OK : KVEDGE_EINVAL;
}

int kvedge_cpu_masked_scores(const kvedge_scores_args_t *a)
{
    int rc = kvedge_scores_check(a);
    if (rc != KVEDGE_OK || a->nq == 0 || a->tokens == 0)
        return rc;
    const uint32_t D = a->head_dim, kc = a->key_channels, T = a->tokens;
    const size_t kn = (size_t)T * kc;
    float *qc =
        malloc(sizeof(float) * ((size_t)a->nq * kc + (a->k_dtype == KVEDGE_DTYPE_FP32 ? 0 : kn)));
    if (!qc)
        return KVEDGE_ENOMEM;
    for (uint32_t i = 0; i < a->nq; i++)
        for (uint32_t c = 0, j = 0; c < D; c++)
            if (!a->key_mask || ((a->key_mask[c >> 3] >> (c & 7)) & 1u))
                qc[(size_t)i * kc + j++] = a->q[(size_t)i * D + c];
    const float *k = a->k;
    if (a->k_dtype != KVEDGE_DTYPE_FP32) {
        float *kf = qc + (size_t)a->nq * kc;
        kvedge_convert_to_f32(a->k_dtype, a->k, kn, kf);
        k = kf;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)a->nq, (int)T, (int)kc, a->scale, qc,
                (int)kc, k, (int)kc, 0.0f, a->scores, (int)T);
    free(qc);
    return KVEDGE_OK;
}
