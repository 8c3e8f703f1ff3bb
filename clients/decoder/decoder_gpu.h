/* The bridge from the reference decoder to the GPU decoder (gpu/opt.h): any model
 * kvedge_decoder_load loaded, its fp32 weights described for kvedge_gpu_opt_new. */
#ifndef KVEDGE_CLIENTS_DECODER_DECODER_GPU_H
#define KVEDGE_CLIENTS_DECODER_DECODER_GPU_H

#include "clients/decoder/decoder.h"
#include "gpu/opt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills out with the config of a loaded model and pointers to its fp32 weights (lm_head equals
 * embed_tokens when the head is tied). The pointers are valid while the model lives;
 * out->layer is an array the call allocates: release it with kvedge_decoder_gpu_weights_free
 * (kvedge_gpu_opt_new only reads it, so that may follow at once). Errors: KVEDGE_EINVAL (NULL,
 * model not loaded; *out is then zeroed), KVEDGE_ENOMEM. */
int kvedge_decoder_gpu_weights(const kvedge_decoder_t *model, kvedge_gpu_opt_weights_t *out);

/* Frees what kvedge_decoder_gpu_weights allocated and zeroes *w. NULL-safe. */
void kvedge_decoder_gpu_weights_free(kvedge_gpu_opt_weights_t *w);

#ifdef __cplusplus
}
#endif
#endif
