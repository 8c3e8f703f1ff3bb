/* CPU reference of gpu/cka.h: centering in double, Gram and cross products by OpenBLAS sgemm,
 * Frobenius norms in double; ThinK column norms in double. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/cka.h"
#include "access/codec/block.h"
#include "access/codec/error.h"

int kvedge_cka_check(const kvedge_cka_args_t *a)
{
    if (!a || !a->x || !a->y || !a->cka || a->n < 2 || a->d1 == 0 || a->d2 == 0)
        return KVEDGE_EINVAL;
    return KVEDGE_OK;
}

/* Copies x [n][d] into xc with every column's mean (computed in double) subtracted. */
static void s_center(const float *x, uint32_t n, uint32_t d, float *xc, double *mean)
{
    memset(mean, 0, sizeof(double) * d);
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t c = 0; c < d; c++)
            mean[c] += x[(size_t)r * d + c];
    for (uint32_t c = 0; c < d; c++)
        mean[c] /= n;
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t c = 0; c < d; c++)
            xc[(size_t)r * d + c] = (float)(x[(size_t)r * d + c] - mean[c]);
}

static double s_frob2(const float *m, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)m[i] * m[i];
    return s;
}

int kvedge_cpu_cka(const kvedge_cka_args_t *a)
{
    int rc = kvedge_cka_check(a);
    if (rc != KVEDGE_OK)
        return rc;
    const size_t n = a->n, d1 = a->d1, d2 = a->d2;
    const size_t floats = n * (d1 + d2) + d1 * d1 + d2 * d2 + d1 * d2;
    float *xc = malloc(sizeof(float) * floats);
    double *mean = malloc(sizeof(double) * (d1 > d2 ? d1 : d2));
    if (!xc || !mean) {
        free(xc);
        free(mean);
        return KVEDGE_ENOMEM;
    }
    float *yc = xc + n * d1, *gx = yc + n * d2, *gy = gx + d1 * d1, *cr = gy + d2 * d2;
    s_center(a->x, a->n, a->d1, xc, mean);
    s_center(a->y, a->n, a->d2, yc, mean);
    /* Feature-space form: HSIC(K, L) with linear kernels is ||Yc^T Xc||_F^2 up to a factor
     * that cancels in the ratio. */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)d1, (int)d1, (int)n, 1.0f, xc,
                (int)d1, xc, (int)d1, 0.0f, gx, (int)d1);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)d2, (int)d2, (int)n, 1.0f, yc,
                (int)d2, yc, (int)d2, 0.0f, gy, (int)d2);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)d2, (int)d1, (int)n, 1.0f, yc,
                (int)d2, xc, (int)d1, 0.0f, cr, (int)d1);
    const double den = sqrt(s_frob2(gx, d1 * d1)) * sqrt(s_frob2(gy, d2 * d2));
    *a->cka = den > 0 ? s_frob2(cr, d1 * d2) / den : 0.0;
    free(mean);
    free(xc);
    return KVEDGE_OK;
}

int kvedge_think_check(const kvedge_think_args_t *a)
{
    if (!a || !a->scores || a->heads == 0 || a->head_dim == 0 ||
        a->head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM || (a->nq && !a->q) || (a->n && !a->k))
        return KVEDGE_EINVAL;
    return KVEDGE_OK;
}

/* Sum of squares of each column of m [rows][d] into acc (double). */
static void s_colsq(const float *m, uint32_t rows, uint32_t d, double *acc)
{
    memset(acc, 0, sizeof(double) * d);
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < d; c++)
            acc[c] += (double)m[(size_t)r * d + c] * m[(size_t)r * d + c];
}

int kvedge_cpu_think_scores(const kvedge_think_args_t *a)
{
    int rc = kvedge_think_check(a);
    if (rc != KVEDGE_OK)
        return rc;
    const uint32_t D = a->head_dim;
    double qs[KVEDGE_BLOCK_MAX_HEAD_DIM], ks[KVEDGE_BLOCK_MAX_HEAD_DIM];
    for (uint32_t h = 0; h < a->heads; h++) {
        s_colsq(a->q ? a->q + (size_t)h * a->nq * D : NULL, a->nq, D, qs);
        s_colsq(a->k ? a->k + (size_t)h * a->n * D : NULL, a->n, D, ks);
        for (uint32_t c = 0; c < D; c++)
            a->scores[(size_t)h * D + c] = (float)(sqrt(qs[c]) * sqrt(ks[c]));
    }
    return KVEDGE_OK;
}

typedef struct {
    float score;
    uint32_t channel;
} s_rank_t;

/* Higher score first, NaN last, lower channel first among equals. */
static int s_rank_cmp(const void *pa, const void *pb)
{
    const s_rank_t *x = pa, *y = pb;
    const int xn = isnan(x->score), yn = isnan(y->score);
    if (xn != yn)
        return xn - yn;
    if (!xn && x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return (x->channel > y->channel) - (x->channel < y->channel);
}

int kvedge_think_keep_mask(const float *scores, uint32_t head_dim, uint32_t keep, uint8_t *mask,
                           size_t mask_cap)
{
    if (!scores || !mask || keep == 0 || keep > head_dim || head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM)
        return KVEDGE_EINVAL;
    const size_t bytes = ((size_t)head_dim + 7) / 8;
    if (mask_cap < bytes)
        return KVEDGE_ENOSPACE;
    s_rank_t r[KVEDGE_BLOCK_MAX_HEAD_DIM];
    for (uint32_t c = 0; c < head_dim; c++) {
        r[c].score = scores[c];
        r[c].channel = c;
    }
    qsort(r, head_dim, sizeof r[0], s_rank_cmp);
    memset(mask, 0, bytes);
    for (uint32_t i = 0; i < keep; i++)
        mask[r[i].channel >> 3] |= (uint8_t)(1u << (r[i].channel & 7));
    return KVEDGE_OK;
}
