/* CUDA side of gpu/adapt.h: a kernel broadcasts the bias row into y, then cublasSgemm adds
 * x W (cuBLAS is column-major: row-major y [tokens][dout] is its transpose, y^T = W^T x^T). */
#include <cublas_v2.h>
#include <stdint.h>

#include "gpu/adapt.h"
#include "gpu/blas.cuh"
#include "gpu/common.cuh"

#define S_THREADS 256

/* y[t][j] = bias[j]; a grid-stride loop over the tokens * dout outputs. */
__global__ void s_bias_kernel(const float *bias, uint32_t dout, size_t total, float *y)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = bias[i % dout];
}

/* The calling thread's handle for the current device, made on first use (and again when the
 * thread moves to another device). Kept, not destroyed per call: cublasDestroy synchronizes. */
static int s_handle(cublasHandle_t *out)
{
    static thread_local cublasHandle_t h = NULL;
    static thread_local int dev = -1;
    int cur = 0;
    int rc = kvedge_gpu_err(cudaGetDevice(&cur));
    if (rc != KVEDGE_OK)
        return rc;
    if (h && dev != cur) {
        cublasDestroy(h);
        h = NULL;
    }
    if (!h) {
        rc = kvedge_gpu_blas_err(cublasCreate(&h));
        if (rc != KVEDGE_OK) {
            h = NULL;
            return rc;
        }
        dev = cur;
        /* Full fp32 products, as the CPU reference: no TF32 tensor-op shortcut. */
        cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    }
    *out = h;
    return KVEDGE_OK;
}

extern "C" int kvedge_gpu_adapt(const kvedge_adapt_args_t *a, kvedge_gpu_stream_t s)
{
    int rc = kvedge_adapt_check(a);
    if (rc != KVEDGE_OK)
        return rc;
    cudaStream_t st = (cudaStream_t)s;
    cublasHandle_t h = NULL;
    rc = s_handle(&h);
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_blas_err(cublasSetStream(h, st));
    if (rc != KVEDGE_OK)
        return rc;
    const size_t total = (size_t)a->tokens * a->dout;
    const size_t want = (total + S_THREADS - 1) / S_THREADS;
    const unsigned blocks = (unsigned)(want < 4096 ? want : 4096);
    s_bias_kernel<<<blocks, S_THREADS, 0, st>>>(a->w + (size_t)a->din * a->dout, a->dout, total,
                                                a->y);
    rc = kvedge_gpu_launch_err();
    if (rc != KVEDGE_OK)
        return rc;
    const float one = 1.0f;
    return kvedge_gpu_blas_err(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)a->dout,
                                           (int)a->tokens, (int)a->din, &one, a->w, (int)a->dout,
                                           a->x, (int)a->din, &one, a->y, (int)a->dout));
}
