/* Dequantize verified, decompressed kvedge blocks into the decoder's KV layout: contiguous
 * [heads][tokens_cap][head_dim] or vLLM-paged [num_pages][page_size][heads][head_dim], fp16,
 * bf16 or fp32. A whole layer (every head x chunk) is one call: an array of block descriptors.
 *
 * The CPU reference writes exactly the bits kvedge_block_decode(out_dtype) writes for the same
 * block. The CUDA kernel does the same IEEE operations (code * scale, then + min, each rounded,
 * then round-to-nearest-even to the output type), so it matches the CPU reference bit for bit
 * for every block the encoder can produce (finite params); a NaN output (only from a hand-made
 * block with NaN/inf params) is NaN on both but its payload bits may differ. */
#ifndef KVEDGE_GPU_DEQUANT_H
#define KVEDGE_GPU_DEQUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/gpu.h"
#include "access/codec/block.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Blocks in one call: the y dimension of the CUDA grid. */
#define KVEDGE_DEQUANT_MAX_BLOCKS 65535u

typedef enum {
    KVEDGE_KV_CONTIG = 0, /* [heads][tokens_cap][head_dim] */
    KVEDGE_KV_PAGED = 1,  /* [num_pages][page_size][heads][head_dim], position p in page
                             page_table[p / page_size], slot p % page_size */
} kvedge_kv_layout_t;

/* One destination tensor (K or V of one layer). */
typedef struct {
    kvedge_kv_layout_t layout;
    kvedge_dtype_t dtype; /* fp16, bf16 or fp32 */
    void *base;           /* device memory for kvedge_gpu_dequant, host memory for the CPU */
    size_t cap_bytes;     /* bytes writable at base; must hold the whole tensor */
    uint32_t heads;
    uint32_t head_dim;
    uint32_t tokens_cap; /* contiguous: token positions per head */
    uint32_t page_size;  /* paged: slots per page */
    uint32_t num_pages;  /* paged: physical pages at base */
    /* Paged: physical page of each logical page, HOST memory on both paths (it is checked on
     * the host and uploaded by the launcher); table_len entries. */
    const int32_t *page_table;
    uint32_t table_len;
} kvedge_kv_dst_t;

/* One block to place: its decompressed body (kvedge_block_body) and shape, and where it goes.
 * kvedge_dequant_block_init fills it from a parsed block. */
typedef struct {
    const void *body;       /* 4-byte aligned; device memory for the GPU path, host for the CPU */
    uint32_t body_len;      /* bytes; must equal the length the shape implies (info->raw_len) */
    kvedge_dtype_t dtype;   /* source element type (lossless payload) */
    kvedge_scheme_t scheme; /* lossless, int8, int4 */
    uint32_t tokens;        /* 0 is allowed and places nothing */
    uint16_t head_dim;
    uint16_t key_channels; /* head_dim, or popcount(key_mask) when masked */
    uint16_t group_size;   /* as in the block header */
    bool masked;
    uint8_t key_mask[KVEDGE_BLOCK_MAX_HEAD_DIM / 8]; /* LSB-first; bits >= head_dim zero */
    uint32_t head;                                   /* destination head */
    uint32_t offset; /* destination token position of the block's token 0 */
} kvedge_dequant_block_t;

typedef struct {
    const kvedge_dequant_block_t *blocks; /* host array of n_blocks */
    uint32_t n_blocks;
    kvedge_kv_dst_t k; /* keys go here */
    kvedge_kv_dst_t v; /* values go here */
} kvedge_dequant_args_t;

/* Fills *out from a parsed block (kvedge_block_parse) and its decompressed body `raw`
 * (kvedge_block_body; a device copy of it may be swapped into out->body afterwards).
 * Returns 0 or KVEDGE_EINVAL. */
int kvedge_dequant_block_init(const kvedge_block_info_t *info, const void *raw, uint32_t head,
                              uint32_t offset, kvedge_dequant_block_t *out);

/* Bytes the whole tensor d describes (what cap_bytes must hold); 0 for an unknown layout or
 * dtype. */
uint64_t kvedge_dequant_dst_bytes(const kvedge_kv_dst_t *d);

/* Checks every argument without writing anything (both paths call it first):
 * KVEDGE_EINVAL: NULL pointer, unknown dtype/scheme/layout, shape or mask inconsistent with
 *   itself or with body_len, misaligned body, head >= heads, head_dim mismatch, page table
 *   entry outside [0, num_pages), n_blocks > KVEDGE_DEQUANT_MAX_BLOCKS;
 * KVEDGE_ENOSPACE: cap_bytes smaller than the tensor, offset + tokens > tokens_cap, or a
 *   position past the page table (table_len * page_size). */
int kvedge_dequant_check(const kvedge_dequant_args_t *a);

/* CPU reference (the no-GPU production path). Returns 0 or the errors of kvedge_dequant_check;
 * blocks that overlap in the destination are written in array order. */
int kvedge_cpu_dequant(const kvedge_dequant_args_t *a);

/* One kernel launch for all blocks, asynchronous on stream s; block bodies and destinations
 * in device memory, descriptors and page tables in host memory (uploaded by the call, which
 * may return before the kernel ends but no longer needs them). Overlapping blocks: undefined
 * order. Errors: those of kvedge_dequant_check, then the CUDA errors of gpu/gpu.h. */
int kvedge_gpu_dequant(const kvedge_dequant_args_t *a, kvedge_gpu_stream_t s);

#ifdef __cplusplus
}
#endif
#endif
