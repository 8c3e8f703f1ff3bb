/* CUDA kernel of gpu/dequant.h: one launch places every block of a layer; each thread makes
 * two adjacent channels of one token row of K or V, with the CPU reference's exact float ops. */
#include <stdlib.h>
#include <string.h>

#include "gpu/common.cuh"
#include "gpu/dequant.h"
#include "gpu/dequant_impl.h"

/* Token rows per CUDA block: enough work per block to hide the descriptor loads. */
#define S_TILE_TOKENS 16
#define S_THREADS     256

/* A block descriptor as the kernel reads it: shape and section offsets resolved on the host. */
typedef struct {
    const uint8_t *body;
    uint64_t k_params, v_params, k_codes, v_codes;
    uint32_t tokens, D, kc, kgroup, vgroup, v_groups, krow, vrow, head, offset;
    int src_dtype, bits, masked;
    uint64_t mask[KVEDGE_BLOCK_MAX_HEAD_DIM / 64];
    uint32_t rank[KVEDGE_BLOCK_MAX_HEAD_DIM / 64]; /* kept channels before each mask word */
} s_desc_t;

typedef struct {
    uint8_t *base;
    const int32_t *table; /* device copy of the page table (paged) */
    int paged, dtype, esize;
    uint32_t heads, D, tokens_cap, page_size;
} s_dst_t;

__device__ __forceinline__ uint8_t *s_row(const s_dst_t &d, uint32_t h, uint32_t p)
{
    const size_t row = (size_t)d.D * d.esize;
    if (!d.paged)
        return d.base + ((size_t)h * d.tokens_cap + p) * row;
    const size_t page = (size_t)d.table[p / d.page_size];
    return d.base + ((page * d.page_size + p % d.page_size) * d.heads + h) * row;
}

/* Output bits of a float in the destination dtype (fp32: the float's own bits). */
__device__ __forceinline__ uint32_t s_encode(int dtype, float f)
{
    if (dtype == KVEDGE_DTYPE_FP16)
        return kvedge_d_f32_to_fp16(f);
    if (dtype == KVEDGE_DTYPE_BF16)
        return kvedge_d_f32_to_bf16(f);
    return __float_as_uint(f);
}

__device__ __forceinline__ uint32_t s_code(const uint8_t *row, int bits, uint32_t j)
{
    if (bits == 8)
        return row[j];
    const uint8_t b = row[j >> 1];
    return (j & 1) ? (uint32_t)(b >> 4) : (uint32_t)(b & 15);
}

/* The value of K (is_k) or V at token t, channel c, as destination bits. */
__device__ uint32_t s_value(const s_desc_t &b, bool is_k, uint32_t t, uint32_t c, int out_dtype)
{
    uint32_t j = c; /* position in the stored (compact) row */
    if (is_k && b.masked) {
        const uint64_t w = b.mask[c >> 6];
        if (!((w >> (c & 63)) & 1u))
            return 0; /* dropped channel: +0 in every dtype, as the decoder writes */
        j = b.rank[c >> 6] + (uint32_t)__popcll(w & ((1ull << (c & 63)) - 1ull));
    }
    const uint32_t width = is_k ? b.kc : b.D;
    if (b.bits == 0) {
        const uint8_t *src = b.body + (is_k ? b.k_codes : b.v_codes);
        const size_t i = (size_t)t * width + j;
        if (out_dtype == b.src_dtype) /* bit-exact copy */
            return out_dtype == KVEDGE_DTYPE_FP32 ? ((const uint32_t *)src)[i]
                                                  : ((const uint16_t *)src)[i];
        return s_encode(out_dtype, kvedge_d_load(b.src_dtype, src, i));
    }
    const uint16_t *p;
    const uint8_t *codes;
    if (is_k) {
        p = (const uint16_t *)(b.body + b.k_params) + ((size_t)(t / b.kgroup) * b.kc + j) * 2;
        codes = b.body + b.k_codes + (size_t)t * b.krow;
    } else {
        p = (const uint16_t *)(b.body + b.v_params) + ((size_t)t * b.v_groups + c / b.vgroup) * 2;
        codes = b.body + b.v_codes + (size_t)t * b.vrow;
    }
    const float scale = kvedge_d_fp16_to_f32(p[0]), mn = kvedge_d_fp16_to_f32(p[1]);
    const float x = __fadd_rn(__fmul_rn((float)s_code(codes, b.bits, j), scale), mn);
    return s_encode(out_dtype, x);
}

__device__ __forceinline__ void s_store(const s_dst_t &d, uint8_t *row, uint32_t c, uint32_t v0,
                                        uint32_t v1, bool pair)
{
    if (d.esize == 2) {
        uint16_t *r = (uint16_t *)row;
        if (pair && (d.D & 1u) == 0) {
            *(uint32_t *)(r + c) = v0 | (v1 << 16);
            return;
        }
        r[c] = (uint16_t)v0;
        if (pair)
            r[c + 1] = (uint16_t)v1;
    } else {
        uint32_t *r = (uint32_t *)row;
        if (pair && (d.D & 1u) == 0) {
            *(uint2 *)(r + c) = make_uint2(v0, v1);
            return;
        }
        r[c] = v0;
        if (pair)
            r[c + 1] = v1;
    }
}

__global__ void s_dequant_kernel(const s_desc_t *descs, s_dst_t kd, s_dst_t vd)
{
    const s_desc_t &b = descs[blockIdx.y];
    const uint32_t t0 = blockIdx.x * S_TILE_TOKENS;
    if (t0 >= b.tokens)
        return;
    const uint32_t nt = min((uint32_t)S_TILE_TOKENS, b.tokens - t0);
    const uint32_t pairs = (b.D + 1) / 2;
    const uint32_t per_side = nt * pairs;
    for (uint32_t w = threadIdx.x; w < 2 * per_side; w += blockDim.x) {
        const bool is_k = w < per_side;
        const uint32_t r = is_k ? w : w - per_side;
        const uint32_t t = t0 + r / pairs, c = (r % pairs) * 2;
        const s_dst_t &d = is_k ? kd : vd;
        const bool pair = c + 1 < b.D;
        const uint32_t v0 = s_value(b, is_k, t, c, d.dtype);
        const uint32_t v1 = pair ? s_value(b, is_k, t, c + 1, d.dtype) : 0;
        s_store(d, s_row(d, b.head, b.offset + t), c, v0, v1, pair);
    }
}

static s_dst_t s_dst(const kvedge_kv_dst_t *d, const int32_t *dev_table)
{
    s_dst_t o;
    o.base = (uint8_t *)d->base;
    o.table = dev_table;
    o.paged = d->layout == KVEDGE_KV_PAGED;
    o.dtype = (int)d->dtype;
    o.esize = (int)kvedge_dtype_size(d->dtype);
    o.heads = d->heads;
    o.D = d->head_dim;
    o.tokens_cap = d->tokens_cap;
    o.page_size = d->page_size;
    return o;
}

extern "C" int kvedge_gpu_dequant(const kvedge_dequant_args_t *a, kvedge_gpu_stream_t s)
{
    int rc = kvedge_dequant_check(a);
    if (rc != KVEDGE_OK || a->n_blocks == 0)
        return rc;
    cudaStream_t st = (cudaStream_t)s;
    const uint32_t n = a->n_blocks;
    const size_t kt = a->k.layout == KVEDGE_KV_PAGED ? a->k.table_len : 0;
    const size_t vt = a->v.layout == KVEDGE_KV_PAGED ? a->v.table_len : 0;
    /* One upload: descriptors, then the K and V page tables. */
    const size_t bytes = n * sizeof(s_desc_t) + (kt + vt) * sizeof(int32_t);
    uint8_t *host = (uint8_t *)malloc(bytes);
    if (!host)
        return KVEDGE_ENOMEM;
    s_desc_t *hd = (s_desc_t *)host;
    uint32_t max_tokens = 0;
    for (uint32_t i = 0; i < n; i++) {
        const kvedge_dequant_block_t *b = &a->blocks[i];
        kvedge_dq_layout_t l;
        kvedge_dq_layout(b, &l);
        s_desc_t *o = &hd[i];
        memset(o, 0, sizeof *o);
        o->body = (const uint8_t *)b->body;
        o->k_params = l.k_params;
        o->v_params = l.v_params;
        o->k_codes = l.k_codes;
        o->v_codes = l.v_codes;
        o->tokens = b->tokens;
        o->D = b->head_dim;
        o->kc = b->key_channels;
        o->kgroup = l.kgroup;
        o->vgroup = l.vgroup;
        o->v_groups = l.v_groups;
        o->krow = l.krow;
        o->vrow = l.vrow;
        o->head = b->head;
        o->offset = b->offset;
        o->src_dtype = (int)b->dtype;
        o->bits = (int)l.bits;
        o->masked = b->masked;
        uint32_t kept = 0;
        for (uint32_t w = 0; w < KVEDGE_BLOCK_MAX_HEAD_DIM / 64; w++) {
            uint64_t m = 0;
            for (uint32_t k = 0; k < 8; k++)
                m |= (uint64_t)b->key_mask[w * 8 + k] << (8 * k);
            o->mask[w] = m;
            o->rank[w] = kept;
            kept += (uint32_t)__builtin_popcountll(m);
        }
        if (b->tokens > max_tokens)
            max_tokens = b->tokens;
    }
    if (max_tokens == 0) {
        free(host);
        return KVEDGE_OK;
    }
    int32_t *ht = (int32_t *)(host + n * sizeof(s_desc_t));
    if (kt)
        memcpy(ht, a->k.page_table, kt * sizeof(int32_t));
    if (vt)
        memcpy(ht + kt, a->v.page_table, vt * sizeof(int32_t));

    uint8_t *dev = NULL;
    rc = kvedge_gpu_err(cudaMallocAsync((void **)&dev, bytes, st));
    if (rc == KVEDGE_OK) {
        /* From pageable memory the copy is staged before the call returns: host may go. */
        rc = kvedge_gpu_err(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, st));
        if (rc == KVEDGE_OK) {
            const int32_t *dt = (const int32_t *)(dev + n * sizeof(s_desc_t));
            dim3 grid((max_tokens + S_TILE_TOKENS - 1) / S_TILE_TOKENS, n);
            s_dequant_kernel<<<grid, S_THREADS, 0, st>>>((const s_desc_t *)dev, s_dst(&a->k, dt),
                                                         s_dst(&a->v, dt + kt));
            rc = kvedge_gpu_launch_err();
        }
        int frc = kvedge_gpu_err(cudaFreeAsync(dev, st));
        if (rc == KVEDGE_OK)
            rc = frc;
    }
    free(host);
    return rc;
}
