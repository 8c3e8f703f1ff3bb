/* CUDA kernel of gpu/dequant.h: one launch places every block of a layer, with the CPU
 * reference's exact float ops. A CUDA block takes S_TILE_TOKENS token rows of one kvedge block:
 * blocks of the common shape (every key channel kept, head_dim a multiple of 8, aligned) take
 * the 8-channel path with 16-byte stores, the rest the general 2-channel path. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu/common.cuh"
#include "gpu/dequant.h"
#include "gpu/dequant_impl.h"

/* Token rows per CUDA block: 128 beat 32 and 64 on an H100 (fewer descriptor loads and block
 * starts; docs/benchmarks.md, "GPU kernels"); a build may set KVEDGE_DEQUANT_TILE_TOKENS to
 * compare others. */
#ifdef KVEDGE_DEQUANT_TILE_TOKENS
#define S_TILE_TOKENS KVEDGE_DEQUANT_TILE_TOKENS
#else
#define S_TILE_TOKENS 128
#endif

#define S_THREADS    256
#define S_MASK_WORDS (KVEDGE_BLOCK_MAX_HEAD_DIM / 64)

/* A block descriptor as the kernel reads it: shape and section offsets resolved on the host.
 * Compact (72 bytes: a layer of 1024 blocks uploads 72 KiB); the keep-masks of masked blocks
 * live in a side table. */
typedef struct {
    const uint8_t *body;
    uint32_t k_params, v_params, k_codes, v_codes; /* a body is at most 256 MiB */
    uint32_t tokens, D, kc, kgroup, vgroup, v_groups, krow, vrow, head, offset;
    int32_t mask; /* index in the mask table, -1 when every key channel is kept */
    uint8_t src_dtype, bits;
    uint8_t vec; /* the 8-channel path applies (s_vec_ok) */
    uint8_t pad;
} s_desc_t;
static_assert(sizeof(s_desc_t) % 8 == 0, "descriptor words");

typedef struct {
    uint64_t word[S_MASK_WORDS];
    uint32_t rank[S_MASK_WORDS]; /* kept channels before each mask word */
} s_mask_t;

typedef struct {
    uint8_t *base;
    const int32_t *table; /* device copy of the page table (paged) */
    int paged, dtype, esize;
    int vec;    /* rows of 16-byte multiples at 16-byte aligned addresses */
    int pshift; /* log2(page_size) when a power of two, else -1 */
    uint32_t heads, D, tokens_cap, page_size;
} s_dst_t;

__device__ __forceinline__ uint8_t *s_row(const s_dst_t &d, uint32_t h, uint32_t p)
{
    const size_t row = (size_t)d.D * d.esize;
    if (!d.paged)
        return d.base + ((size_t)h * d.tokens_cap + p) * row;
    const uint32_t lp = d.pshift >= 0 ? p >> d.pshift : p / d.page_size;
    const uint32_t slot = d.pshift >= 0 ? p & (d.page_size - 1) : p % d.page_size;
    const size_t page = (size_t)d.table[lp];
    return d.base + ((page * d.page_size + slot) * d.heads + h) * row;
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

/* code * scale + min, each op rounded as the CPU reference rounds it. */
__device__ __forceinline__ float s_dq(uint32_t code, uint32_t param)
{
    const float scale = kvedge_d_fp16_to_f32((uint16_t)(param & 0xFFFFu));
    const float mn = kvedge_d_fp16_to_f32((uint16_t)(param >> 16));
    return __fadd_rn(__fmul_rn((float)code, scale), mn);
}

/* The value of K (is_k) or V at token t, channel c, as destination bits: any block. */
__device__ uint32_t s_value(const s_desc_t &b, const s_mask_t *masks, bool is_k, uint32_t t,
                            uint32_t c, int out_dtype)
{
    uint32_t j = c; /* position in the stored (compact) row */
    if (is_k && b.mask >= 0) {
        const s_mask_t &m = masks[b.mask];
        const uint64_t w = m.word[c >> 6];
        if (!((w >> (c & 63)) & 1u))
            return 0; /* dropped channel: +0 in every dtype, as the decoder writes */
        j = m.rank[c >> 6] + (uint32_t)__popcll(w & ((1ull << (c & 63)) - 1ull));
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
    const uint32_t *p;
    const uint8_t *codes;
    if (is_k) {
        p = (const uint32_t *)(b.body + b.k_params) + (size_t)(t / b.kgroup) * b.kc + j;
        codes = b.body + b.k_codes + (size_t)t * b.krow;
    } else {
        p = (const uint32_t *)(b.body + b.v_params) + (size_t)t * b.v_groups + c / b.vgroup;
        codes = b.body + b.v_codes + (size_t)t * b.vrow;
    }
    return s_encode(out_dtype, s_dq(s_code(codes, b.bits, j), *p));
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

/* Any block: each work item makes two adjacent channels of one token row. */
__device__ void s_generic(const s_desc_t &b, const s_mask_t *masks, const s_dst_t &kd,
                          const s_dst_t &vd, uint32_t t0, uint32_t nt)
{
    const uint32_t pairs = (b.D + 1) / 2;
    const uint32_t per_side = nt * pairs;
    for (uint32_t w = threadIdx.x; w < 2 * per_side; w += blockDim.x) {
        const bool is_k = w < per_side;
        const uint32_t r = is_k ? w : w - per_side;
        const uint32_t t = t0 + r / pairs, c = (r % pairs) * 2;
        const s_dst_t &d = is_k ? kd : vd;
        const bool pair = c + 1 < b.D;
        const uint32_t v0 = s_value(b, masks, is_k, t, c, d.dtype);
        const uint32_t v1 = pair ? s_value(b, masks, is_k, t, c + 1, d.dtype) : 0;
        s_store(d, s_row(d, b.head, b.offset + t), c, v0, v1, pair);
    }
}

/* Destination bits of a float: the hardware's round-to-nearest-even conversions, which give the
 * bits of s_encode for every non-NaN value (NaNs, possible only from hand-made blocks with
 * non-finite params, stay NaN with another payload, as dequant.h allows). */
__device__ __forceinline__ uint32_t s_cvt(int dtype, float f)
{
    if (dtype == KVEDGE_DTYPE_FP16)
        return (uint32_t)__half_as_ushort(__float2half_rn(f));
    if (dtype == KVEDGE_DTYPE_BF16)
        return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(f));
    return __float_as_uint(f);
}

/* A (scale, min) parameter pair as floats: exact conversions of the two halves. */
__device__ __forceinline__ float2 s_param(uint32_t p)
{
    return make_float2(__half2float(__ushort_as_half((unsigned short)(p & 0xFFFFu))),
                       __half2float(__ushort_as_half((unsigned short)(p >> 16))));
}

/* Eight output values (as 32-bit words, destination bits) into a 16-byte aligned row. */
__device__ __forceinline__ void s_store8(const s_dst_t &d, uint8_t *at, const uint32_t *o)
{
    if (d.esize == 2) {
        *(uint4 *)at = make_uint4(o[0] | (o[1] << 16), o[2] | (o[3] << 16), o[4] | (o[5] << 16),
                                  o[6] | (o[7] << 16));
    } else {
        *(uint4 *)at = make_uint4(o[0], o[1], o[2], o[3]);
        *(uint4 *)(at + 16) = make_uint4(o[4], o[5], o[6], o[7]);
    }
}

/* Code i of 8 packed codes: q0/q1 the two words of 8 int8 codes, or q0 alone for int4. */
__device__ __forceinline__ uint32_t s_code8(int bits, uint32_t q0, uint32_t q1, int i)
{
    if (bits == 8)
        return ((i < 4 ? q0 : q1) >> (8 * (i & 3))) & 0xFFu;
    return (q0 >> (4 * i)) & 0xFu;
}

/* The 8 codes at channel c of a code row. */
__device__ __forceinline__ void s_load8(int bits, const uint8_t *row, uint32_t c, uint32_t *q0,
                                        uint32_t *q1)
{
    if (bits == 8) {
        const uint2 v = *(const uint2 *)(row + c);
        *q0 = v.x;
        *q1 = v.y;
    } else {
        *q0 = *(const uint32_t *)(row + c / 2);
        *q1 = 0;
    }
}

/* The fast path (s_vec_ok on the host): every key channel kept, head_dim a multiple of 8,
 * aligned sections and destinations. A work item makes 8 channels of one token row of K and of
 * V: 8-byte (int8) or 4-byte (int4) code loads, or 16-byte copies (lossless, same dtype), and
 * 16-byte stores. When 256 threads hold whole rows (D / 8 divides 256) each thread keeps one
 * channel group for the whole tile and the K params of the current token group in registers.
 * Same float ops as s_value (the products and sums explicitly rounded): the same bits. */
__device__ void s_vec(const s_desc_t &b, const s_dst_t &kd, const s_dst_t &vd, uint32_t t0,
                      uint32_t nt)
{
    const uint32_t oct = b.D >> 3;
    const bool fixed = (S_THREADS % oct) == 0;
    const uint32_t step = fixed ? S_THREADS / oct : 0;
    const uint32_t items = nt * oct;
    uint32_t w = threadIdx.x;
    uint32_t tl = fixed ? w / oct : 0, c = fixed ? (w - tl * oct) * 8 : 0;
    float2 kp[8];
    uint32_t kgrp = UINT32_MAX;
    for (; w < items; w += S_THREADS) {
        if (fixed) {
            if (w != threadIdx.x)
                tl += step;
        } else {
            tl = w / oct;
            c = (w - tl * oct) * 8;
        }
        const uint32_t t = t0 + tl, p = b.offset + t;
        uint8_t *ka = s_row(kd, b.head, p) + (size_t)c * kd.esize;
        uint8_t *va = s_row(vd, b.head, p) + (size_t)c * vd.esize;
        const uint8_t *krow = b.body + b.k_codes + (size_t)t * b.krow;
        const uint8_t *vrow = b.body + b.v_codes + (size_t)t * b.vrow;
        if (b.bits == 0) { /* lossless, source dtype = destination dtype */
            const uint4 *ks = (const uint4 *)(krow + (size_t)c * kd.esize);
            const uint4 *vs = (const uint4 *)(vrow + (size_t)c * vd.esize);
            const uint4 k0 = ks[0], v0 = vs[0];
            *(uint4 *)ka = k0;
            *(uint4 *)va = v0;
            if (kd.esize == 4) {
                const uint4 k1 = ks[1], v1 = vs[1];
                *(uint4 *)(ka + 16) = k1;
                *(uint4 *)(va + 16) = v1;
            }
            continue;
        }
        uint32_t kq0, kq1, vq0, vq1;
        s_load8(b.bits, krow, c, &kq0, &kq1);
        s_load8(b.bits, vrow, c, &vq0, &vq1);
        const uint32_t vparam =
            __ldg((const uint32_t *)(b.body + b.v_params) + (size_t)t * b.v_groups + c / b.vgroup);
        const uint32_t g = t / b.kgroup;
        if (g != kgrp || !fixed) { /* K params: per channel, per group of kgroup tokens */
            const uint32_t *kpp = (const uint32_t *)(b.body + b.k_params) + (size_t)g * b.kc + c;
#pragma unroll
            for (int i = 0; i < 8; i++)
                kp[i] = s_param(__ldg(kpp + i));
            kgrp = g;
        }
        const float2 vp = s_param(vparam);
        uint32_t ko[8], vo[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float kx =
                __fadd_rn(__fmul_rn((float)s_code8(b.bits, kq0, kq1, i), kp[i].x), kp[i].y);
            const float vx = __fadd_rn(__fmul_rn((float)s_code8(b.bits, vq0, vq1, i), vp.x), vp.y);
            ko[i] = s_cvt(kd.dtype, kx);
            vo[i] = s_cvt(vd.dtype, vx);
        }
        s_store8(kd, ka, ko);
        s_store8(vd, va, vo);
    }
}

__global__ void __launch_bounds__(S_THREADS)
    s_dequant_kernel(const s_desc_t *descs, const s_mask_t *masks, s_dst_t kd, s_dst_t vd)
{
    __shared__ s_desc_t b; /* read once per CUDA block, not once per value */
    if (threadIdx.x < sizeof(s_desc_t) / 4)
        ((uint32_t *)&b)[threadIdx.x] = ((const uint32_t *)&descs[blockIdx.y])[threadIdx.x];
    __syncthreads();
    const uint32_t t0 = blockIdx.x * S_TILE_TOKENS;
    if (t0 >= b.tokens)
        return;
    const uint32_t nt = min((uint32_t)S_TILE_TOKENS, b.tokens - t0);
    if (b.vec)
        s_vec(b, kd, vd, t0, nt);
    else
        s_generic(b, masks, kd, vd, t0, nt);
}

static s_dst_t s_dst(const kvedge_kv_dst_t *d, const int32_t *dev_table)
{
    s_dst_t o;
    o.base = (uint8_t *)d->base;
    o.table = dev_table;
    o.paged = d->layout == KVEDGE_KV_PAGED;
    o.dtype = (int)d->dtype;
    o.esize = (int)kvedge_dtype_size(d->dtype);
    o.vec = ((uintptr_t)d->base & 15u) == 0 && (d->head_dim & 7u) == 0 &&
            (o.esize == 2 || o.esize == 4);
    o.pshift = -1;
    for (int sh = 0; sh < 32; sh++)
        if (d->page_size == (1u << sh))
            o.pshift = sh;
    o.heads = d->heads;
    o.D = d->head_dim;
    o.tokens_cap = d->tokens_cap;
    o.page_size = d->page_size;
    return o;
}

static bool s_aligned(const void *base, uint64_t off, uint32_t stride, uint32_t a)
{
    return (((uintptr_t)base + off) % a) == 0 && stride % a == 0;
}

/* Whether block b (layout l) may take the 8-channel path into destinations k and v. */
static bool s_vec_ok(const kvedge_dequant_block_t *b, const kvedge_dq_layout_t *l, const s_dst_t *k,
                     const s_dst_t *v)
{
    if (b->masked || (b->head_dim & 7u) || !k->vec || !v->vec)
        return false;
    switch (l->bits) {
    case 0: /* a copy: same dtype on both sides, 16-byte rows */
        return (int)b->dtype == k->dtype && (int)b->dtype == v->dtype &&
               s_aligned(b->body, l->k_codes, l->krow, 16) &&
               s_aligned(b->body, l->v_codes, l->vrow, 16);
    case 8:
        return l->vgroup % 8 == 0 && s_aligned(b->body, l->k_codes, l->krow, 8) &&
               s_aligned(b->body, l->v_codes, l->vrow, 8);
    case 4:
        return l->vgroup % 8 == 0 && s_aligned(b->body, l->k_codes, l->krow, 4) &&
               s_aligned(b->body, l->v_codes, l->vrow, 4);
    default:
        return false;
    }
}

/* Pinned upload buffers for descriptors and page tables, so that the upload is asynchronous
 * (from pageable memory the copy may wait for the stream) and the host can prepare layer l + 1
 * while layer l dequantizes. A buffer is reused once the copy recorded on its event is done;
 * when every buffer is in flight the call falls back to pageable memory. */
#define S_POOL 8
typedef struct {
    void *host;
    size_t cap;
    cudaEvent_t done;
    bool busy; /* held by a call between acquire and release */
} s_upload_t;
static s_upload_t s_pool[S_POOL];
static pthread_mutex_t s_pool_mu = PTHREAD_MUTEX_INITIALIZER;

/* A buffer of at least bytes, or -1 (use pageable memory). */
static int s_pool_acquire(size_t bytes)
{
    int got = -1;
    pthread_mutex_lock(&s_pool_mu);
    for (int pass = 0; pass < 2 && got < 0; pass++)
        for (int i = 0; i < S_POOL && got < 0; i++) {
            s_upload_t *u = &s_pool[i];
            if (u->busy || (pass == 0 && u->cap < bytes))
                continue;
            if (u->done) {
                const cudaError_t e = cudaEventQuery(u->done);
                if (e == cudaErrorNotReady) {
                    cudaGetLastError(); /* not an error: do not leave it sticky */
                    continue;
                }
                if (e != cudaSuccess) {
                    cudaGetLastError();
                    continue;
                }
            } else if (cudaEventCreateWithFlags(&u->done, cudaEventDisableTiming) != cudaSuccess) {
                cudaGetLastError();
                u->done = NULL;
                continue;
            }
            if (u->cap < bytes) { /* second pass: grow an idle buffer */
                if (u->host)
                    cudaFreeHost(u->host);
                u->host = NULL;
                u->cap = 0;
                const size_t cap = bytes < 65536 ? 65536 : bytes;
                if (cudaHostAlloc(&u->host, cap, cudaHostAllocDefault) != cudaSuccess) {
                    cudaGetLastError();
                    u->host = NULL;
                    continue;
                }
                u->cap = cap;
            }
            u->busy = true;
            got = i;
        }
    pthread_mutex_unlock(&s_pool_mu);
    return got;
}

/* Marks the buffer reusable once the work recorded on stream st so far is done. */
static void s_pool_release(int i, cudaStream_t st)
{
    pthread_mutex_lock(&s_pool_mu);
    if (cudaEventRecord(s_pool[i].done, st) != cudaSuccess) {
        cudaGetLastError();
        cudaStreamSynchronize(st); /* cannot tell when the copy ends: wait for it here */
        cudaGetLastError();
    }
    s_pool[i].busy = false;
    pthread_mutex_unlock(&s_pool_mu);
}

extern "C" int kvedge_gpu_dequant(const kvedge_dequant_args_t *a, kvedge_gpu_stream_t s)
{
    int rc = kvedge_dequant_check(a);
    if (rc != KVEDGE_OK || a->n_blocks == 0)
        return rc;
    cudaStream_t st = (cudaStream_t)s;
    const uint32_t n = a->n_blocks;
    uint32_t n_masked = 0, max_tokens = 0;
    for (uint32_t i = 0; i < n; i++) {
        n_masked += a->blocks[i].masked ? 1u : 0u;
        if (a->blocks[i].tokens > max_tokens)
            max_tokens = a->blocks[i].tokens;
    }
    if (max_tokens == 0)
        return KVEDGE_OK;
    const size_t kt = a->k.layout == KVEDGE_KV_PAGED ? a->k.table_len : 0;
    const size_t vt = a->v.layout == KVEDGE_KV_PAGED ? a->v.table_len : 0;
    /* One upload: descriptors, keep-masks, then the K and V page tables. */
    const size_t o_masks = n * sizeof(s_desc_t);
    const size_t o_tables = o_masks + n_masked * sizeof(s_mask_t);
    const size_t bytes = o_tables + (kt + vt) * sizeof(int32_t);
    const int slot = s_pool_acquire(bytes);
    uint8_t *host = slot >= 0 ? (uint8_t *)s_pool[slot].host : (uint8_t *)malloc(bytes);
    if (!host)
        return KVEDGE_ENOMEM;
    s_desc_t *hd = (s_desc_t *)host;
    s_mask_t *hm = (s_mask_t *)(host + o_masks);
    const s_dst_t kprobe = s_dst(&a->k, NULL), vprobe = s_dst(&a->v, NULL);
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        const kvedge_dequant_block_t *b = &a->blocks[i];
        kvedge_dq_layout_t l;
        kvedge_dq_layout(b, &l); /* checked above */
        s_desc_t *o = &hd[i];
        o->body = (const uint8_t *)b->body;
        o->k_params = (uint32_t)l.k_params;
        o->v_params = (uint32_t)l.v_params;
        o->k_codes = (uint32_t)l.k_codes;
        o->v_codes = (uint32_t)l.v_codes;
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
        o->mask = -1;
        o->src_dtype = (uint8_t)b->dtype;
        o->bits = (uint8_t)l.bits;
        o->vec = s_vec_ok(b, &l, &kprobe, &vprobe) ? 1 : 0;
        o->pad = 0;
        if (b->masked) {
            s_mask_t *mk = &hm[m];
            uint32_t kept = 0;
            for (uint32_t w = 0; w < S_MASK_WORDS; w++) {
                uint64_t word = 0;
                for (uint32_t k = 0; k < 8; k++)
                    word |= (uint64_t)b->key_mask[w * 8 + k] << (8 * k);
                mk->word[w] = word;
                mk->rank[w] = kept;
                kept += (uint32_t)__builtin_popcountll(word);
            }
            o->mask = (int32_t)m++;
        }
    }
    int32_t *ht = (int32_t *)(host + o_tables);
    if (kt)
        memcpy(ht, a->k.page_table, kt * sizeof(int32_t));
    if (vt)
        memcpy(ht + kt, a->v.page_table, vt * sizeof(int32_t));

    uint8_t *dev = NULL;
    rc = kvedge_gpu_err(cudaMallocAsync((void **)&dev, bytes, st));
    if (rc == KVEDGE_OK) {
        /* Pinned: the copy runs in stream order and the buffer is released on its event.
         * Pageable: the copy is staged before the call returns, so host may go. */
        rc = kvedge_gpu_err(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, st));
        if (rc == KVEDGE_OK) {
            const int32_t *dt = (const int32_t *)(dev + o_tables);
            dim3 grid((max_tokens + S_TILE_TOKENS - 1) / S_TILE_TOKENS, n);
            s_dequant_kernel<<<grid, S_THREADS, 0, st>>>((const s_desc_t *)dev,
                                                         (const s_mask_t *)(dev + o_masks),
                                                         s_dst(&a->k, dt), s_dst(&a->v, dt + kt));
            rc = kvedge_gpu_launch_err();
        }
        int frc = kvedge_gpu_err(cudaFreeAsync(dev, st));
        if (rc == KVEDGE_OK)
            rc = frc;
    }
    if (slot >= 0)
        s_pool_release(slot, st);
    else
        free(host);
    return rc;
}
