/* Internal to gpu/: the section layout of a block body, derived from its shape, shared by the
 * CPU reference and the CUDA launcher so that both read exactly the same bytes. */
#ifndef KVEDGE_GPU_DEQUANT_IMPL_H
#define KVEDGE_GPU_DEQUANT_IMPL_H

#include <stdint.h>

#include "gpu/dequant.h"
#include "access/codec/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    unsigned bits;     /* 0 lossless, 8 or 4 */
    uint32_t esize;    /* source element bytes (lossless) */
    uint32_t kgroup;   /* tokens per K group (effective, >= 1) */
    uint32_t vgroup;   /* channels per V group (effective, >= 1) */
    uint32_t v_groups; /* V params per token */
    uint32_t krow;     /* bytes of one K code row */
    uint32_t vrow;     /* bytes of one V code row */
    uint64_t k_params; /* section offsets in the body */
    uint64_t v_params;
    uint64_t k_codes;
    uint64_t v_codes;
    uint64_t raw; /* implied body length */
} kvedge_dq_layout_t;

/* Returns 0 and fills l, or KVEDGE_EINVAL when the shape is not a valid block shape. */
int kvedge_dq_layout(const kvedge_dequant_block_t *b, kvedge_dq_layout_t *l);

#ifdef __cplusplus
}
#endif
#endif
