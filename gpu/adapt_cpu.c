/* CPU reference of gpu/adapt.h: the bias row copied into every output row, then one
 * cblas_sgemm with beta 1. */
#include <cblas.h>
#include <stdint.h>
#include <string.h>

#include "gpu/adapt.h"
#include "access/codec/error.h"

int kvedge_adapt_check(const kvedge_adapt_args_t *a)
{
    if (!a || !a->x || !a->w || !a->y || a->tokens == 0 || a->din == 0 || a->dout == 0)
        return KVEDGE_EINVAL;
    if (a->tokens > INT32_MAX || a->din >= INT32_MAX || a->dout > INT32_MAX)
        return KVEDGE_EINVAL;
    return KVEDGE_OK;
}

int kvedge_cpu_adapt(const kvedge_adapt_args_t *a)
{
    int rc = kvedge_adapt_check(a);
    if (rc != KVEDGE_OK)
        return rc;
    const size_t dout = a->dout;
    const float *bias = a->w + (size_t)a->din * dout;
    for (size_t t = 0; t < a->tokens; t++)
        memcpy(a->y + t * dout, bias, dout * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)a->tokens, (int)a->dout,
                (int)a->din, 1.0f, a->x, (int)a->din, a->w, (int)a->dout, 1.0f, a->y, (int)a->dout);
    return KVEDGE_OK;
}
