/* gpu/opt.h in a build without CUDA: there is no device, so every entry returns KVEDGE_EINVAL
 * (as gpu/gpu_stub.c's kernels) without touching its arguments beyond nulling outputs. */
#include <stddef.h>

#include "gpu/opt.h"
#include "access/codec/error.h"

int kvedge_gpu_opt_new(const kvedge_gpu_opt_weights_t *w, kvedge_dtype_t dtype,
                       kvedge_gpu_opt_t **out)
{
    (void)w;
    (void)dtype;
    if (out)
        *out = NULL;
    return KVEDGE_EINVAL;
}

void kvedge_gpu_opt_destroy(kvedge_gpu_opt_t **self_p)
{
    (void)self_p;
}

const kvedge_gpu_opt_config_t *kvedge_gpu_opt_config(const kvedge_gpu_opt_t *self)
{
    (void)self;
    return NULL;
}

kvedge_dtype_t kvedge_gpu_opt_dtype(const kvedge_gpu_opt_t *self)
{
    (void)self;
    return (kvedge_dtype_t)0;
}

int kvedge_gpu_opt_prefill(kvedge_gpu_opt_t *self, const int32_t *tokens, uint32_t n, float *logits,
                           void *const *k_out, void *const *v_out)
{
    (void)self;
    (void)tokens;
    (void)n;
    (void)logits;
    (void)k_out;
    (void)v_out;
    return KVEDGE_EINVAL;
}

int kvedge_gpu_opt_session_new(kvedge_gpu_opt_t *model, kvedge_gpu_opt_session_t **out)
{
    (void)model;
    if (out)
        *out = NULL;
    return KVEDGE_EINVAL;
}

void kvedge_gpu_opt_session_destroy(kvedge_gpu_opt_session_t **self_p)
{
    (void)self_p;
}

kvedge_gpu_stream_t kvedge_gpu_opt_session_stream(const kvedge_gpu_opt_session_t *self)
{
    (void)self;
    return NULL;
}

int kvedge_gpu_opt_session_begin(kvedge_gpu_opt_session_t *self, const kvedge_gpu_opt_ctx_t *ctx,
                                 const int32_t *prompt, uint32_t prompt_len, uint32_t max_new,
                                 float *logits)
{
    (void)self;
    (void)ctx;
    (void)prompt;
    (void)prompt_len;
    (void)max_new;
    (void)logits;
    return KVEDGE_EINVAL;
}

int kvedge_gpu_opt_session_step(kvedge_gpu_opt_session_t *self, int32_t token, float *logits)
{
    (void)self;
    (void)token;
    (void)logits;
    return KVEDGE_EINVAL;
}

int kvedge_gpu_opt_session_generate(kvedge_gpu_opt_session_t *self, uint32_t n, int32_t *tokens)
{
    (void)self;
    (void)n;
    (void)tokens;
    return KVEDGE_EINVAL;
}
