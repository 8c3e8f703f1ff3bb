/* gpu/ throughput: CPU dequantization of a layer of int8 / int4 blocks into a paged fp16 KV
 * cache against memcpy of the same output size; with a CUDA device, the kernel against
 * device-to-device cudaMemcpy, and pinned host-to-device copies through gpu/stage.h against
 * plain cudaMemcpy. Medians of KVEDGE_BENCH_REPS_MIN runs. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_common.h"
#include "gpu/dequant.h"
#include "gpu/gpu.h"
#include "gpu/stage.h"
#include "access/codec/block.h"
#include "access/codec/error.h"
#include "access/codec/synth.h"

#ifdef KVEDGE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define S_HEAD_DIM   128
#define S_CHUNK      256
#define S_PAGE       16
#define S_GROUP_INT4 32

typedef struct {
    uint32_t heads, chunks;
    kvedge_dequant_block_t *desc;
    uint8_t **bodies;
    uint64_t in_bytes;  /* decompressed bodies */
    uint64_t out_bytes; /* fp16 K + V written */
} s_layer_t;

/* Encodes heads x chunks blocks of synthetic KV and keeps their raw bodies. */
static void s_layer(kvedge_scheme_t scheme, uint32_t heads, uint32_t chunks, s_layer_t *L)
{
    memset(L, 0, sizeof *L);
    L->heads = heads;
    L->chunks = chunks;
    const uint32_t n = heads * chunks;
    L->desc = bench_alloc(sizeof(kvedge_dequant_block_t) * n);
    L->bodies = bench_alloc(sizeof(uint8_t *) * n);
    const size_t elems = (size_t)S_CHUNK * S_HEAD_DIM;
    float *k = bench_alloc(elems * sizeof(float)), *v = bench_alloc(elems * sizeof(float));
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP32,
                                scheme,
                                S_CHUNK,
                                S_HEAD_DIM,
                                scheme == KVEDGE_SCHEME_INT4 ? S_GROUP_INT4 : 0,
                                NULL,
                                false};
    const size_t cap = kvedge_block_encoded_bound(&spec);
    uint8_t *blk = bench_alloc(cap);
    for (uint32_t c = 0; c < chunks; c++)
        for (uint32_t h = 0; h < heads; h++) {
            const uint32_t i = c * heads + h;
            size_t len = 0;
            kvedge_block_info_t info;
            KVEDGE_BENCH_CHECK(
                kvedge_synth_head_f32(h + 1, c * S_CHUNK, S_CHUNK, S_HEAD_DIM, k, v));
            KVEDGE_BENCH_CHECK(kvedge_block_encode(&spec, k, v, blk, cap, &len));
            KVEDGE_BENCH_CHECK(kvedge_block_parse(blk, len, &info));
            L->bodies[i] = bench_alloc(info.raw_len);
            memcpy(L->bodies[i], info.body, info.raw_len);
            KVEDGE_BENCH_CHECK(
                kvedge_dequant_block_init(&info, L->bodies[i], h, c * S_CHUNK, &L->desc[i]));
            L->in_bytes += info.raw_len;
            L->out_bytes += 2ull * S_CHUNK * S_HEAD_DIM * 2;
        }
    free(blk);
    free(k);
    free(v);
}

static void s_layer_free(s_layer_t *L)
{
    for (uint32_t i = 0; i < L->heads * L->chunks; i++)
        free(L->bodies[i]);
    free(L->bodies);
    free(L->desc);
}

/* A paged fp16 destination for the layer, identity page table; base left to the caller. */
static void s_paged(const s_layer_t *L, int32_t *table, kvedge_kv_dst_t *d)
{
    memset(d, 0, sizeof *d);
    const uint32_t tokens = L->chunks * S_CHUNK;
    d->layout = KVEDGE_KV_PAGED;
    d->dtype = KVEDGE_DTYPE_FP16;
    d->heads = L->heads;
    d->head_dim = S_HEAD_DIM;
    d->page_size = S_PAGE;
    d->num_pages = tokens / S_PAGE;
    d->table_len = d->num_pages;
    for (uint32_t i = 0; i < d->num_pages; i++) /* scrambled, as a real allocator leaves it */
        table[i] = (int32_t)((i * 7919u) % d->num_pages);
    d->page_table = table;
    d->cap_bytes = (size_t)kvedge_dequant_dst_bytes(d);
}

static void s_cpu(kvedge_scheme_t scheme, const char *name)
{
    s_layer_t L;
    s_layer(scheme, 8, 16, &L); /* 8 KV heads x 4096 tokens: one layer of a 7-8B GQA model */
    int32_t *table = bench_alloc(sizeof(int32_t) * 16 * S_CHUNK / S_PAGE);
    kvedge_dequant_args_t a = {L.desc, L.heads * L.chunks, {0}, {0}};
    s_paged(&L, table, &a.k);
    s_paged(&L, table, &a.v);
    a.k.base = bench_alloc(a.k.cap_bytes);
    a.v.base = bench_alloc(a.v.cap_bytes);
    uint8_t *src = bench_alloc(L.out_bytes), *dst = bench_alloc(L.out_bytes);
    memset(src, 1, L.out_bytes);
    memset(dst, 0, L.out_bytes);
    double t_dq[KVEDGE_BENCH_REPS_MIN], t_mc[KVEDGE_BENCH_REPS_MIN];
    KVEDGE_BENCH_CHECK(kvedge_cpu_dequant(&a)); /* warm: page faults out of the timing */
    for (int r = 0; r < KVEDGE_BENCH_REPS_MIN; r++) {
        double t0 = bench_now_s();
        KVEDGE_BENCH_CHECK(kvedge_cpu_dequant(&a));
        t_dq[r] = bench_now_s() - t0;
        t0 = bench_now_s();
        memcpy(dst, src, L.out_bytes);
        t_mc[r] = bench_now_s() - t0;
        src[r] ^= dst[L.out_bytes - 1 - r]; /* keep the copy observable */
    }
    const double dq = bench_median(t_dq, KVEDGE_BENCH_REPS_MIN);
    const double mc = bench_median(t_mc, KVEDGE_BENCH_REPS_MIN);
    printf("| cpu | %s | %.1f | %.2f | %.2f | %.2f | %.2f |\n", name, L.out_bytes / 1e6,
           L.out_bytes / dq / 1e9, L.in_bytes / dq / 1e9, L.out_bytes / mc / 1e9, mc / dq);
    free(src);
    free(dst);
    free(a.k.base);
    free(a.v.base);
    free(table);
    s_layer_free(&L);
}

#ifdef KVEDGE_HAVE_CUDA
/* Median seconds of a device operation, timed with CUDA events on stream s. */
#define S_TIME_DEVICE(out, s, stmt)                                                                \
    do {                                                                                           \
        double samples_[KVEDGE_BENCH_REPS_MIN];                                                    \
        cudaEvent_t a_, b_;                                                                        \
        cudaEventCreate(&a_);                                                                      \
        cudaEventCreate(&b_);                                                                      \
        stmt; /* warm-up */                                                                        \
        for (int r_ = 0; r_ < KVEDGE_BENCH_REPS_MIN; r_++) {                                       \
            cudaEventRecord(a_, (cudaStream_t)(s));                                                \
            stmt;                                                                                  \
            cudaEventRecord(b_, (cudaStream_t)(s));                                                \
            cudaEventSynchronize(b_);                                                              \
            float ms_ = 0;                                                                         \
            cudaEventElapsedTime(&ms_, a_, b_);                                                    \
            samples_[r_] = ms_ * 1e-3;                                                             \
        }                                                                                          \
        cudaEventDestroy(a_);                                                                      \
        cudaEventDestroy(b_);                                                                      \
        (out) = bench_median(samples_, KVEDGE_BENCH_REPS_MIN);                                     \
    } while (0)

/* Calls per timed batch in the back-to-back figure: a loader dequantizes layer after layer, so
 * the host's work for the next call overlaps the kernel of the previous one. */
#define S_BATCH 10

static void s_gpu_dequant(kvedge_scheme_t scheme, const char *name, kvedge_dtype_t out)
{
    s_layer_t L;
    s_layer(scheme, 32, 32, &L); /* 32 heads x 8192 tokens: 134 MB of fp16 written */
    const uint32_t n = L.heads * L.chunks;
    int32_t *table = bench_alloc(sizeof(int32_t) * 32 * S_CHUNK / S_PAGE);
    kvedge_dequant_args_t a = {L.desc, n, {0}, {0}};
    s_paged(&L, table, &a.k);
    s_paged(&L, table, &a.v);
    a.k.dtype = a.v.dtype = out;
    a.k.cap_bytes = (size_t)kvedge_dequant_dst_bytes(&a.k);
    a.v.cap_bytes = (size_t)kvedge_dequant_dst_bytes(&a.v);
    const uint64_t out_bytes = a.k.cap_bytes + a.v.cap_bytes;
    for (uint32_t i = 0; i < n; i++) {
        void *d = NULL;
        KVEDGE_BENCH_CHECK(kvedge_gpu_dev_alloc(L.desc[i].body_len, &d));
        KVEDGE_BENCH_CHECK(kvedge_gpu_copy_h2d(d, L.bodies[i], L.desc[i].body_len, NULL));
        L.desc[i].body = d;
    }
    KVEDGE_BENCH_CHECK(kvedge_gpu_dev_alloc(a.k.cap_bytes, &a.k.base));
    KVEDGE_BENCH_CHECK(kvedge_gpu_dev_alloc(a.v.cap_bytes, &a.v.base));
    void *src = NULL, *dst = NULL;
    KVEDGE_BENCH_CHECK(kvedge_gpu_dev_alloc(out_bytes, &src));
    KVEDGE_BENCH_CHECK(kvedge_gpu_dev_alloc(out_bytes, &dst));
    KVEDGE_BENCH_CHECK(cudaMemset(src, 0x3C, out_bytes) == cudaSuccess ? 0 : -1);
    kvedge_gpu_stream_t s = NULL;
    KVEDGE_BENCH_CHECK(kvedge_gpu_stream_new(&s));
    double one = 0, batch = 0, d2d = 0;
    S_TIME_DEVICE(one, s, KVEDGE_BENCH_CHECK(kvedge_gpu_dequant(&a, s)));
    S_TIME_DEVICE(batch, s,
                  for (int i_ = 0; i_ < S_BATCH; i_++)
                      KVEDGE_BENCH_CHECK(kvedge_gpu_dequant(&a, s)));
    batch /= S_BATCH;
    S_TIME_DEVICE(d2d, s,
                  cudaMemcpyAsync(dst, src, out_bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)s));
    /* Memory traffic: the kernel reads the bodies and writes K and V; a copy reads and writes
     * as many bytes as K and V take. */
    const double cp_traffic = 2.0 * out_bytes / d2d;
    const double tr_one = (double)(L.in_bytes + out_bytes) / one;
    const double tr_batch = (double)(L.in_bytes + out_bytes) / batch;
    printf("| gpu | %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f |\n", name,
           kvedge_dtype_name(out), out_bytes / 1e6, one * 1e6, batch * 1e6, tr_batch / 1e9,
           cp_traffic / 1e9, tr_one / cp_traffic, tr_batch / cp_traffic);
    kvedge_gpu_stream_destroy(&s);
    kvedge_gpu_dev_free(src);
    kvedge_gpu_dev_free(dst);
    kvedge_gpu_dev_free(a.k.base);
    kvedge_gpu_dev_free(a.v.base);
    for (uint32_t i = 0; i < n; i++)
        kvedge_gpu_dev_free((void *)L.desc[i].body);
    free(table);
    s_layer_free(&L);
}

static void s_gpu_h2d(void)
{
    const size_t bytes = 256u << 20;
    void *host = NULL, *dev = NULL;
    KVEDGE_BENCH_CHECK(kvedge_gpu_host_alloc(bytes, &host));
    KVEDGE_BENCH_CHECK(kvedge_gpu_dev_alloc(bytes, &dev));
    memset(host, 3, bytes);
    kvedge_gpu_stream_t s = NULL;
    KVEDGE_BENCH_CHECK(kvedge_gpu_stream_new(&s));
    double staged = 0, plain = 0;
    S_TIME_DEVICE(staged, s, KVEDGE_BENCH_CHECK(kvedge_gpu_copy_h2d(dev, host, bytes, s)));
    double samples[KVEDGE_BENCH_REPS_MIN];
    cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice);
    for (int r = 0; r < KVEDGE_BENCH_REPS_MIN; r++) {
        double t0 = bench_now_s();
        cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice);
        samples[r] = bench_now_s() - t0;
    }
    plain = bench_median(samples, KVEDGE_BENCH_REPS_MIN);
    printf("\nhost-to-device, %zu MiB from pinned memory: staging API %.1f GB/s, plain "
           "cudaMemcpy %.1f GB/s, ratio %.2f (goal >= 0.90)\n",
           bytes >> 20, bytes / staged / 1e9, bytes / plain / 1e9, plain / staged);
    kvedge_gpu_stream_destroy(&s);
    kvedge_gpu_dev_free(dev);
    kvedge_gpu_host_free(host);
}
#endif

int main(void)
{
    printf("CPU dequantize into paged fp16 (page %d, head_dim %d, 8 heads x 4096 tokens), "
           "medians of %d runs\n\n",
           S_PAGE, S_HEAD_DIM, KVEDGE_BENCH_REPS_MIN);
    printf(
        "| path | scheme | MB written | GB/s written | GB/s input | memcpy GB/s | vs memcpy |\n");
    printf("|---|---|---:|---:|---:|---:|---:|\n");
    s_cpu(KVEDGE_SCHEME_INT8, "int8");
    s_cpu(KVEDGE_SCHEME_INT4, "int4 g32");
    if (kvedge_gpu_device_count() == 0) {
        printf("\nGPU part skipped: %s\n", kvedge_gpu_built_with_cuda()
                                               ? "no CUDA device found"
                                               : "built without CUDA (-DKVEDGE_CUDA=OFF)");
        return 0;
    }
#ifdef KVEDGE_HAVE_CUDA
    struct cudaDeviceProp prop;
    KVEDGE_BENCH_CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? 0 : -1);
    printf("\nGPU dequantize into a paged layout (32 heads x 8192 tokens, head_dim %d, page %d, "
           "scrambled page table) on %s, CUDA events, medians of %d. One call: the whole call "
           "(host preparation, descriptor upload, kernel) timed alone; back-to-back: %d calls "
           "in a row, as a loader issues layers, per call. Traffic = block bodies read + K and "
           "V written; D2D = cudaMemcpy of the K+V size, bytes read + written.\n\n",
           S_HEAD_DIM, S_PAGE, prop.name, KVEDGE_BENCH_REPS_MIN, S_BATCH);
    printf("| path | scheme | out | MB written | one call us | back-to-back us/call | "
           "back-to-back GB/s read+written | D2D GB/s | one call vs D2D | back-to-back vs D2D "
           "(goal >= 0.80) |\n");
    printf("|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    s_gpu_dequant(KVEDGE_SCHEME_INT8, "int8", KVEDGE_DTYPE_FP16);
    s_gpu_dequant(KVEDGE_SCHEME_INT8, "int8", KVEDGE_DTYPE_BF16);
    s_gpu_dequant(KVEDGE_SCHEME_INT4, "int4 g32", KVEDGE_DTYPE_FP16);
    s_gpu_dequant(KVEDGE_SCHEME_INT4, "int4 g32", KVEDGE_DTYPE_BF16);
    s_gpu_h2d();
#endif
    return 0;
}
