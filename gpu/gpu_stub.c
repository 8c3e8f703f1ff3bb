/* The kvedge_gpu_* kernels of a build without CUDA: there is no device, so each returns
 * KVEDGE_EINVAL (documented in gpu/gpu.h) without touching its arguments. */
#include "gpu/adapt.h"
#include "gpu/attn.h"
#include "gpu/cka.h"
#include "gpu/rsa.h"
#include "gpu/dequant.h"
#include "gpu/scores.h"
#include "access/codec/error.h"

int kvedge_gpu_dequant(const kvedge_dequant_args_t *a, kvedge_gpu_stream_t s)
{
    (void)a;
    (void)s;
    return KVEDGE_EINVAL;
}

int kvedge_gpu_attn_partial(const kvedge_attn_partial_args_t *a, kvedge_gpu_stream_t s)
{
    (void)a;
    (void)s;
    return KVEDGE_EINVAL;
}

int kvedge_gpu_attn_merge(const kvedge_attn_merge_args_t *a, kvedge_gpu_stream_t s)
{
    (void)a;
    (void)s;
    return KVEDGE_EINVAL;
}

int kvedge_gpu_masked_scores(const kvedge_scores_args_t *a, kvedge_gpu_stream_t s)
{
    (void)a;
    (void)s;
    return KVEDGE_EINVAL;
}

int kvedge_gpu_cka(const kvedge_cka_args_t *a, kvedge_gpu_stream_t s)
{
    (void)a;
    (void)s;
    return KVEDGE_EINVAL;
}

int kvedge_gpu_rsa(const kvedge_rsa_args_t *a, kvedge_gpu_stream_t s)
{
    (void)a;
    (void)s;
    return KVEDGE_EINVAL;
}

int kvedge_gpu_think_scores(const kvedge_think_args_t *a, kvedge_gpu_stream_t s)
{
    (void)a;
    (void)s;
    return KVEDGE_EINVAL;
}

int kvedge_gpu_adapt(const kvedge_adapt_args_t *a, kvedge_gpu_stream_t s)
{
    (void)a;
    (void)s;
    return KVEDGE_EINVAL;
}
