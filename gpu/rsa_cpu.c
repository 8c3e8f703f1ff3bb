/* CPU reference of gpu/rsa.h: rows normalized in double, cosine matrices by OpenBLAS sgemm,
 * the Pearson correlation of their lower triangles in double. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "gpu/rsa.h"
#include "access/codec/error.h"

int kvedge_rsa_check(const kvedge_rsa_args_t *a)
{
    if (!a || !a->x || !a->y || !a->rsa || a->n < 2 || a->d1 == 0 || a->d2 == 0)
        return KVEDGE_EINVAL;
    return KVEDGE_OK;
}

/* Copies x [n][d] into u with every row scaled to unit length (a zero row stays zero). */
static void s_unit_rows(const float *x, uint32_t n, uint32_t d, float *u)
{
    for (uint32_t r = 0; r < n; r++) {
        const float *row = x + (size_t)r * d;
        double ss = 0;
        for (uint32_t c = 0; c < d; c++)
            ss += (double)row[c] * row[c];
        const double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
        for (uint32_t c = 0; c < d; c++)
            u[(size_t)r * d + c] = (float)(row[c] * inv);
    }
}

/* S [n][n] = U U^T for unit rows U [n][d]. */
static void s_cosines(const float *u, uint32_t n, uint32_t d, float *s)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)n, (int)d, 1.0f, u, (int)d, u,
                (int)d, 0.0f, s, (int)n);
}

int kvedge_cpu_rsa(const kvedge_rsa_args_t *a)
{
    int rc = kvedge_rsa_check(a);
    if (rc != KVEDGE_OK || a->n > KVEDGE_RSA_MAX_SAMPLES)
        return KVEDGE_EINVAL;
    const size_t n = a->n, d1 = a->d1, d2 = a->d2;
    float *ux = malloc(sizeof(float) * (n * (d1 + d2) + 2 * n * n));
    if (!ux)
        return KVEDGE_ENOMEM;
    float *uy = ux + n * d1, *sx = uy + n * d2, *sy = sx + n * n;
    s_unit_rows(a->x, a->n, a->d1, ux);
    s_unit_rows(a->y, a->n, a->d2, uy);
    s_cosines(ux, a->n, a->d1, sx);
    s_cosines(uy, a->n, a->d2, sy);
    /* Two passes (means, then centred sums) keep the correlation exact near +-1. */
    const double m = (double)n * (n - 1) / 2;
    double mx = 0, my = 0;
    for (size_t i = 1; i < n; i++)
        for (size_t j = 0; j < i; j++) {
            mx += sx[i * n + j];
            my += sy[i * n + j];
        }
    mx /= m;
    my /= m;
    double sxy = 0, sxx = 0, syy = 0;
    for (size_t i = 1; i < n; i++)
        for (size_t j = 0; j < i; j++) {
            const double p = sx[i * n + j] - mx, q = sy[i * n + j] - my;
            sxy += p * q;
            sxx += p * p;
            syy += q * q;
        }
    const double den = sqrt(sxx) * sqrt(syy);
    double r = den > 0 ? sxy / den : 0.0;
    *a->rsa = r > 1 ? 1 : (r < -1 ? -1 : r);
    free(ux);
    return KVEDGE_OK;
}
