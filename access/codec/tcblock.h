/* Codec-internal entry of the tc block encoder (block.c): what kvedge_block_transcode_at needs
 * beyond block.h's kvedge_block_encode_tc. Not installed. */
#ifndef KVEDGE_CODEC_TCBLOCK_H
#define KVEDGE_CODEC_TCBLOCK_H

#include <stddef.h>
#include <stdint.h>

#include "access/codec/basis.h"
#include "access/codec/block.h"

/* kvedge_block_encode_tc of K and V given as fp32 [tokens][head_dim], the block's header naming
 * dtype as its element type (a transcode keeps its source's dtype without rounding the decoded
 * values to it first). Errors and ownership as kvedge_block_encode_tc. */
int kvedge_block_encode_tc_f32(const kvedge_basis_t *b, uint32_t layer, uint32_t head,
                               kvedge_dtype_t dtype, uint32_t tokens, uint16_t head_dim,
                               const float *k, const float *v, uint8_t **out, size_t *out_len);

#endif
