/* Helpers shared by the gpu/ tests: a layer of encoded blocks ready for kvedge_*_dequant and
 * the destination tensors they go to. */
#ifndef KVEDGE_TESTS_GPU_TESTUTIL_H
#define KVEDGE_TESTS_GPU_TESTUTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/dequant.h"
#include "access/codec/block.h"
#include "access/codec/error.h"
#include "access/codec/synth.h"
#include "tests/common/testutil.h"

/* Blocks of one test layer: heads x chunks, the last chunk partial. */
#define GT_CHUNKS      2
#define GT_HEADS_USED  2
#define GT_DST_HEADS   3
#define GT_BLOCKS      (GT_CHUNKS * GT_HEADS_USED)
#define GT_BASE_OFFSET 5 /* first token position: not a multiple of any page size tested */

typedef struct {
    kvedge_dtype_t src;
    kvedge_scheme_t scheme;
    uint16_t head_dim;
    uint16_t group;
    bool masked;
    bool lz4;
    uint32_t chunk_tokens[GT_CHUNKS];
} gt_shape_t;

typedef struct {
    uint8_t *enc[GT_BLOCKS]; /* encoded blocks */
    uint8_t *raw[GT_BLOCKS]; /* 4-byte aligned copies of the decompressed bodies */
    kvedge_block_info_t info[GT_BLOCKS];
    kvedge_dequant_block_t desc[GT_BLOCKS];
    uint32_t total_tokens; /* per head */
} gt_layer_t;

/* A mask keeping about half the channels (at least one), pseudo-random per seed. */
static inline void gt_mask(uint64_t seed, uint32_t head_dim, uint8_t *mask)
{
    kvedge_rng_t r;
    kvedge_rng_seed(&r, seed);
    memset(mask, 0, KVEDGE_BLOCK_MAX_HEAD_DIM / 8);
    for (uint32_t c = 0; c < head_dim; c++)
        if (kvedge_rng_next(&r) & 1u)
            mask[c >> 3] |= (uint8_t)(1u << (c & 7));
    mask[0] |= 1u;
}

/* Encodes, parses and decompresses the layer's blocks; returns 0 or -1. Block i is head
 * (i % GT_HEADS_USED) * 2 (heads 0 and 2 of GT_DST_HEADS), chunk i / GT_HEADS_USED. */
static inline int gt_layer_make(const gt_shape_t *sh, uint64_t seed, gt_layer_t *L)
{
    memset(L, 0, sizeof *L);
    uint8_t mask[KVEDGE_BLOCK_MAX_HEAD_DIM / 8];
    gt_mask(seed, sh->head_dim, mask);
    uint32_t off = GT_BASE_OFFSET;
    for (uint32_t ch = 0; ch < GT_CHUNKS; ch++) {
        for (uint32_t hh = 0; hh < GT_HEADS_USED; hh++) {
            const uint32_t i = ch * GT_HEADS_USED + hh;
            kvedge_block_spec_t spec = {sh->src,      sh->scheme, sh->chunk_tokens[ch],
                                        sh->head_dim, sh->group,  sh->masked ? mask : NULL,
                                        sh->lz4};
            size_t len = 0;
            L->enc[i] = kt_encode(&spec, seed * 131 + i, &len);
            if (!L->enc[i] || kvedge_block_parse(L->enc[i], len, &L->info[i]) != 0)
                return -1;
            L->raw[i] = malloc(L->info[i].raw_len + 4);
            const uint8_t *body = NULL;
            if (!L->raw[i] ||
                kvedge_block_body(&L->info[i], L->raw[i], L->info[i].raw_len, &body) != 0)
                return -1;
            if (body != L->raw[i])
                memcpy(L->raw[i], body, L->info[i].raw_len);
            if (kvedge_dequant_block_init(&L->info[i], L->raw[i], hh * 2, off, &L->desc[i]) != 0)
                return -1;
        }
        off += sh->chunk_tokens[ch];
    }
    L->total_tokens = off;
    return 0;
}

static inline void gt_layer_free(gt_layer_t *L)
{
    for (uint32_t i = 0; i < GT_BLOCKS; i++) {
        free(L->enc[i]);
        free(L->raw[i]);
    }
    memset(L, 0, sizeof *L);
}

/* A destination for the layer: contiguous (page_size 0) or paged with a scrambled page table
 * and one spare logical page. Caller frees d->base and the table. */
static inline int gt_dst_make(kvedge_dtype_t dtype, uint32_t head_dim, uint32_t tokens,
                              uint32_t page_size, uint64_t seed, kvedge_kv_dst_t *d)
{
    memset(d, 0, sizeof *d);
    d->dtype = dtype;
    d->heads = GT_DST_HEADS;
    d->head_dim = head_dim;
    if (page_size == 0) {
        d->layout = KVEDGE_KV_CONTIG;
        d->tokens_cap = tokens + 3;
    } else {
        d->layout = KVEDGE_KV_PAGED;
        d->page_size = page_size;
        d->table_len = (tokens + page_size - 1) / page_size + 1;
        d->num_pages = d->table_len + 2; /* two pages nobody maps: must stay untouched */
        int32_t *t = malloc(sizeof(int32_t) * d->table_len);
        int32_t *perm = malloc(sizeof(int32_t) * d->num_pages);
        if (!t || !perm) {
            free(t);
            free(perm);
            return -1;
        }
        kvedge_rng_t r;
        kvedge_rng_seed(&r, seed);
        for (uint32_t i = 0; i < d->num_pages; i++)
            perm[i] = (int32_t)i;
        for (uint32_t i = d->num_pages - 1; i > 0; i--) {
            uint32_t j = (uint32_t)(kvedge_rng_next(&r) % (i + 1));
            int32_t x = perm[i];
            perm[i] = perm[j];
            perm[j] = x;
        }
        memcpy(t, perm, sizeof(int32_t) * d->table_len);
        free(perm);
        d->page_table = t;
    }
    d->cap_bytes = (size_t)kvedge_dequant_dst_bytes(d);
    d->base = malloc(d->cap_bytes);
    if (!d->base)
        return -1;
    memset(d->base, 0xA5, d->cap_bytes);
    return 0;
}

static inline void gt_dst_free(kvedge_kv_dst_t *d)
{
    free(d->base);
    free((void *)d->page_table);
    memset(d, 0, sizeof *d);
}

/* Address of the row of head h, position p in a host destination. */
static inline const uint8_t *gt_row(const kvedge_kv_dst_t *d, uint32_t h, uint32_t p)
{
    const size_t row = (size_t)d->head_dim * kvedge_dtype_size(d->dtype);
    if (d->layout == KVEDGE_KV_CONTIG)
        return (const uint8_t *)d->base + ((size_t)h * d->tokens_cap + p) * row;
    const size_t page = (size_t)d->page_table[p / d->page_size];
    return (const uint8_t *)d->base +
           ((page * d->page_size + p % d->page_size) * d->heads + h) * row;
}

#endif
