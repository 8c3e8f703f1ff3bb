/* CPU reference of gpu/dequant.h: the row loops of kvedge_block_decode, writing each token row
 * straight into its destination slot, so the bits are the decoder's. */
#include <stdlib.h>
#include <string.h>

#include "gpu/dequant.h"
#include "gpu/dequant_impl.h"
#include "access/codec/error.h"
#include "access/codec/quant.h"

static uint32_t s_popcount(const uint8_t *mask, uint32_t head_dim)
{
    uint32_t n = 0;
    for (uint32_t c = 0; c < head_dim; c++)
        n += (mask[c >> 3] >> (c & 7)) & 1u;
    return n;
}

int kvedge_dq_layout(const kvedge_dequant_block_t *b, kvedge_dq_layout_t *l)
{
    memset(l, 0, sizeof *l);
    const uint32_t T = b->tokens, D = b->head_dim, kc = b->key_channels;
    l->esize = (uint32_t)kvedge_dtype_size(b->dtype);
    if (l->esize == 0 || D == 0 || D > KVEDGE_BLOCK_MAX_HEAD_DIM || kc == 0 || kc > D ||
        T > KVEDGE_BLOCK_MAX_TOKENS)
        return KVEDGE_EINVAL;
    if (b->masked) {
        for (uint32_t c = D; c < KVEDGE_BLOCK_MAX_HEAD_DIM; c++)
            if ((b->key_mask[c >> 3] >> (c & 7)) & 1u)
                return KVEDGE_EINVAL;
        if (s_popcount(b->key_mask, D) != kc)
            return KVEDGE_EINVAL;
    } else if (kc != D) {
        return KVEDGE_EINVAL;
    }
    switch (b->scheme) {
    case KVEDGE_SCHEME_LOSSLESS:
        if (b->group_size != 0)
            return KVEDGE_EINVAL;
        l->kgroup = T ? T : 1;
        l->vgroup = D;
        l->krow = kc * l->esize;
        l->vrow = D * l->esize;
        break;
    case KVEDGE_SCHEME_INT8:
    case KVEDGE_SCHEME_INT4: {
        l->bits = b->scheme == KVEDGE_SCHEME_INT8 ? 8 : 4;
        const uint32_t g = b->group_size;
        l->kgroup = (g == 0 || g > T) ? (T ? T : 1) : g;
        l->vgroup = (g == 0 || g > D) ? D : g;
        l->v_groups = kvedge_quant_groups(D, g);
        l->krow = (uint32_t)kvedge_quant_row_bytes(kc, l->bits);
        l->vrow = (uint32_t)kvedge_quant_row_bytes(D, l->bits);
        l->k_params = 0;
        l->v_params = (uint64_t)kvedge_quant_groups(T, g) * kc * 4;
        l->k_codes = l->v_params + (uint64_t)T * l->v_groups * 4;
        break;
    }
    default:
        return KVEDGE_EINVAL;
    }
    if (T == 0) { /* nothing is read; the block-format groups formula needs T >= 1 */
        l->k_params = l->v_params = l->k_codes = l->v_codes = l->raw = 0;
        return KVEDGE_OK;
    }
    l->v_codes = l->k_codes + (uint64_t)T * l->krow;
    l->raw = l->v_codes + (uint64_t)T * l->vrow;
    return KVEDGE_OK;
}

uint64_t kvedge_dequant_dst_bytes(const kvedge_kv_dst_t *d)
{
    const uint64_t es = kvedge_dtype_size(d->dtype);
    const uint64_t row = (uint64_t)d->heads * d->head_dim * es;
    if (d->layout == KVEDGE_KV_CONTIG)
        return row * d->tokens_cap;
    if (d->layout == KVEDGE_KV_PAGED)
        return row * d->page_size * d->num_pages;
    return 0;
}

static int s_check_dst(const kvedge_kv_dst_t *d)
{
    if (!d->base || kvedge_dtype_size(d->dtype) == 0 || d->heads == 0 || d->head_dim == 0 ||
        d->head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM)
        return KVEDGE_EINVAL;
    if (d->layout == KVEDGE_KV_PAGED) {
        if (d->page_size == 0 || d->num_pages == 0 || (d->table_len && !d->page_table))
            return KVEDGE_EINVAL;
        for (uint32_t i = 0; i < d->table_len; i++)
            if (d->page_table[i] < 0 || (uint32_t)d->page_table[i] >= d->num_pages)
                return KVEDGE_EINVAL;
    } else if (d->layout != KVEDGE_KV_CONTIG) {
        return KVEDGE_EINVAL;
    }
    if (d->cap_bytes < kvedge_dequant_dst_bytes(d))
        return KVEDGE_ENOSPACE;
    return KVEDGE_OK;
}

/* ENOSPACE when positions [off, off + tokens) do not fit the destination. */
static int s_check_fit(const kvedge_kv_dst_t *d, uint32_t head, uint32_t head_dim, uint32_t off,
                       uint32_t tokens)
{
    if (head >= d->heads || head_dim != d->head_dim)
        return KVEDGE_EINVAL;
    const uint64_t end = (uint64_t)off + tokens;
    if (d->layout == KVEDGE_KV_CONTIG)
        return end > d->tokens_cap ? KVEDGE_ENOSPACE : KVEDGE_OK;
    return end > (uint64_t)d->table_len * d->page_size ? KVEDGE_ENOSPACE : KVEDGE_OK;
}

int kvedge_dequant_check(const kvedge_dequant_args_t *a)
{
    if (!a || (a->n_blocks && !a->blocks) || a->n_blocks > KVEDGE_DEQUANT_MAX_BLOCKS)
        return KVEDGE_EINVAL;
    int rc = s_check_dst(&a->k);
    if (rc == KVEDGE_OK)
        rc = s_check_dst(&a->v);
    for (uint32_t i = 0; rc == KVEDGE_OK && i < a->n_blocks; i++) {
        const kvedge_dequant_block_t *b = &a->blocks[i];
        kvedge_dq_layout_t l;
        rc = kvedge_dq_layout(b, &l);
        if (rc != KVEDGE_OK)
            break;
        if (b->tokens && (!b->body || ((uintptr_t)b->body & 3u) || b->body_len != l.raw))
            return KVEDGE_EINVAL;
        rc = s_check_fit(&a->k, b->head, b->head_dim, b->offset, b->tokens);
        if (rc == KVEDGE_OK)
            rc = s_check_fit(&a->v, b->head, b->head_dim, b->offset, b->tokens);
    }
    return rc;
}

int kvedge_dequant_block_init(const kvedge_block_info_t *info, const void *raw, uint32_t head,
                              uint32_t offset, kvedge_dequant_block_t *out)
{
    if (!info || !raw || !out)
        return KVEDGE_EINVAL;
    memset(out, 0, sizeof *out);
    out->body = raw;
    out->body_len = info->raw_len;
    out->dtype = info->dtype;
    out->scheme = info->scheme;
    out->tokens = info->tokens;
    out->head_dim = info->head_dim;
    out->key_channels = info->key_channels;
    out->group_size = info->group_size;
    out->masked = info->key_mask != NULL;
    if (out->masked)
        memcpy(out->key_mask, info->key_mask, ((size_t)info->head_dim + 7) / 8);
    out->head = head;
    out->offset = offset;
    kvedge_dq_layout_t l;
    return kvedge_dq_layout(out, &l);
}

/* Start of the destination row of token position p of head h. */
static uint8_t *s_row(const kvedge_kv_dst_t *d, uint32_t h, uint32_t p)
{
    const size_t row = (size_t)d->head_dim * kvedge_dtype_size(d->dtype);
    if (d->layout == KVEDGE_KV_CONTIG)
        return (uint8_t *)d->base + ((size_t)h * d->tokens_cap + p) * row;
    const size_t page = (size_t)d->page_table[p / d->page_size];
    return (uint8_t *)d->base + ((page * d->page_size + p % d->page_size) * d->heads + h) * row;
}

/* Positions p.. (at most max) whose rows of one head are equally spaced in d, and that spacing
 * in bytes: every remaining row when contiguous, the rest of p's page when paged. */
static uint32_t s_run(const kvedge_kv_dst_t *d, uint32_t p, uint32_t max, size_t *stride)
{
    const size_t row = (size_t)d->head_dim * kvedge_dtype_size(d->dtype);
    if (d->layout == KVEDGE_KV_CONTIG) {
        *stride = row;
        return max;
    }
    *stride = row * d->heads;
    const uint32_t left = d->page_size - p % d->page_size;
    return left < max ? left : max;
}

/* Scratch shared by the row loops of one block. */
typedef struct {
    float scale[KVEDGE_BLOCK_MAX_HEAD_DIM];
    float min[KVEDGE_BLOCK_MAX_HEAD_DIM];
    float kscale[KVEDGE_BLOCK_MAX_HEAD_DIM];
    float kmin[KVEDGE_BLOCK_MAX_HEAD_DIM];
    float row[KVEDGE_BLOCK_MAX_HEAD_DIM];
    float wide[KVEDGE_BLOCK_MAX_HEAD_DIM];
    uint8_t codes[KVEDGE_BLOCK_MAX_HEAD_DIM];
    uint8_t wcodes[KVEDGE_BLOCK_MAX_HEAD_DIM];
    kvedge_expand_plan_t plan;
} s_scratch_t;

static void s_lossless(const kvedge_dequant_block_t *b, const kvedge_dq_layout_t *l,
                       const kvedge_kv_dst_t *kd, const kvedge_kv_dst_t *vd, s_scratch_t *s)
{
    const uint8_t *body = b->body;
    const uint32_t D = b->head_dim, kc = b->key_channels, es = l->esize;
    for (uint32_t t = 0; t < b->tokens; t++) {
        const uint8_t *src = body + l->k_codes + (size_t)t * l->krow;
        uint8_t *dst = s_row(kd, b->head, b->offset + t);
        if (kd->dtype == b->dtype) { /* bit-exact copy, as the decoder does */
            if (b->masked) {
                memset(dst, 0, (size_t)D * es);
                for (uint32_t j = 0; j < kc; j++)
                    memcpy(dst + (size_t)s->plan.idx[j] * es, src + (size_t)j * es, es);
            } else {
                memcpy(dst, src, (size_t)D * es);
            }
        } else if (kd->dtype == KVEDGE_DTYPE_FP32 && !b->masked) { /* no scratch row */
            kvedge_convert_to_f32(b->dtype, src, kc, (float *)dst);
        } else {
            kvedge_convert_to_f32(b->dtype, src, kc, s->row);
            const float *w = s->row;
            if (b->masked) {
                memset(s->wide, 0, sizeof(float) * D);
                for (uint32_t j = 0; j < kc; j++)
                    s->wide[s->plan.idx[j]] = s->row[j];
                w = s->wide;
            }
            kvedge_convert_from_f32(kd->dtype, w, D, dst);
        }
    }
    for (uint32_t t = 0; t < b->tokens; t++) {
        const uint8_t *src = body + l->v_codes + (size_t)t * l->vrow;
        uint8_t *dst = s_row(vd, b->head, b->offset + t);
        if (vd->dtype == b->dtype) {
            memcpy(dst, src, (size_t)D * es);
        } else if (vd->dtype == KVEDGE_DTYPE_FP32) {
            kvedge_convert_to_f32(b->dtype, src, D, (float *)dst);
        } else {
            kvedge_convert_to_f32(b->dtype, src, D, s->row);
            kvedge_convert_from_f32(vd->dtype, s->row, D, dst);
        }
    }
}

static void s_quant(const kvedge_dequant_block_t *b, const kvedge_dq_layout_t *l,
                    const kvedge_kv_dst_t *kd, const kvedge_kv_dst_t *vd, s_scratch_t *s)
{
    const uint8_t *body = b->body;
    const uint32_t D = b->head_dim, kc = b->key_channels, G = l->kgroup;
    const uint16_t *kp = (const uint16_t *)(body + l->k_params);
    const uint16_t *vp = (const uint16_t *)(body + l->v_params);
    /* Keys of every channel: runs of rows that share a token group's params and are equally
     * spaced in the destination, one call each. */
    for (uint32_t t = 0; !b->masked && t < b->tokens;) {
        if (t % G == 0)
            kvedge_quant_params_expand(kp + (size_t)(t / G) * kc * 2, kc, s->scale, s->min);
        const uint32_t group_end = (t / G + 1) * G < b->tokens ? (t / G + 1) * G : b->tokens;
        size_t stride;
        const uint32_t run = s_run(kd, b->offset + t, group_end - t, &stride);
        kvedge_dequant_rows_out(body + l->k_codes + (size_t)t * l->krow, l->krow, run, l->bits, kc,
                                s->scale, s->min, kd->dtype, s_row(kd, b->head, b->offset + t),
                                stride);
        t += run;
    }
    /* Pruned keys: a row is widened first, dropped channels get code 0, scale 0, min 0, so
     * they come out as exact zeros from the same arithmetic (as kvedge_block_decode does). */
    for (uint32_t t = 0; b->masked && t < b->tokens; t++) {
        const uint8_t *src = body + l->k_codes + (size_t)t * l->krow;
        if (t % G == 0) {
            kvedge_quant_params_expand(kp + (size_t)(t / G) * kc * 2, kc, s->kscale, s->kmin);
            memset(s->scale, 0, sizeof(float) * D);
            memset(s->min, 0, sizeof(float) * D);
            for (uint32_t j = 0; j < kc; j++) {
                s->scale[s->plan.idx[j]] = s->kscale[j];
                s->min[s->plan.idx[j]] = s->kmin[j];
            }
        }
        if (l->bits == 4) {
            kvedge_quant_unpack4(src, kc, s->codes);
            src = s->codes;
        }
        kvedge_expand_u8(&s->plan, src, s->wcodes);
        kvedge_dequant_row_out(s->wcodes, 8, D, s->scale, s->min, kd->dtype,
                               s_row(kd, b->head, b->offset + t));
    }
    for (uint32_t t = 0; t < b->tokens;) {
        size_t stride;
        const uint32_t run = s_run(vd, b->offset + t, b->tokens - t, &stride);
        kvedge_dequant_rows_grouped_out(body + l->v_codes + (size_t)t * l->vrow, l->vrow, run,
                                        l->bits, D, vp + (size_t)t * l->v_groups * 2,
                                        (size_t)l->v_groups * 2, b->group_size, vd->dtype,
                                        s_row(vd, b->head, b->offset + t), stride);
        t += run;
    }
}

int kvedge_cpu_dequant(const kvedge_dequant_args_t *a)
{
    int rc = kvedge_dequant_check(a);
    if (rc != KVEDGE_OK || a->n_blocks == 0)
        return rc;
    s_scratch_t *s = malloc(sizeof *s);
    if (!s)
        return KVEDGE_ENOMEM;
    for (uint32_t i = 0; i < a->n_blocks; i++) {
        const kvedge_dequant_block_t *b = &a->blocks[i];
        kvedge_dq_layout_t l;
        kvedge_dq_layout(b, &l);
        if (b->tokens == 0)
            continue;
        /* The plan's idx lists kept channels; unmasked blocks never read it. */
        if (b->masked)
            kvedge_expand_plan(b->key_mask, b->head_dim, &s->plan);
        if (l.bits == 0)
            s_lossless(b, &l, &a->k, &a->v, s);
        else
            s_quant(b, &l, &a->k, &a->v, s);
    }
    free(s);
    return KVEDGE_OK;
}
