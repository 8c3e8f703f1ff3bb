/* CUDA side of gpu/cka.h: column centering and norms as plain kernels, the Gram and cross
 * products by cublasSgemm (cuBLAS is column-major: a row-major [n][d] matrix is its
 * transpose). */
#include <cublas_v2.h>
#include <math.h>

#include "gpu/cka.h"
#include "gpu/blas.cuh"
#include "gpu/common.cuh"

#define S_THREADS 128

/* xc = x - column mean, one thread per column (coalesced across columns). */
__global__ void s_center_kernel(const float *x, uint32_t n, uint32_t d, float *xc)
{
    const uint32_t c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= d)
        return;
    double mean = 0;
    for (uint32_t r = 0; r < n; r++)
        mean += x[(size_t)r * d + c];
    mean /= n;
    for (uint32_t r = 0; r < n; r++)
        xc[(size_t)r * d + c] = (float)(x[(size_t)r * d + c] - mean);
}

/* *out += sum of squares of m[0 .. len). */
__global__ void s_frob2_kernel(const float *m, size_t len, double *out)
{
    double s = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x)
        s += (double)m[i] * m[i];
    for (int off = 16; off > 0; off /= 2)
        s += __shfl_xor_sync(0xffffffffu, s, off);
    if (threadIdx.x % 32 == 0)
        atomicAdd(out, s);
}

extern "C" int kvedge_gpu_cka(const kvedge_cka_args_t *a, kvedge_gpu_stream_t s)
{
    int rc = kvedge_cka_check(a);
    if (rc != KVEDGE_OK)
        return rc;
    cudaStream_t st = (cudaStream_t)s;
    const size_t n = a->n, d1 = a->d1, d2 = a->d2;
    const size_t floats = n * (d1 + d2) + d1 * d1 + d2 * d2 + d1 * d2;
    char *ws = NULL;
    rc = kvedge_gpu_err(
        cudaMallocAsync((void **)&ws, 3 * sizeof(double) + floats * sizeof(float), st));
    if (rc != KVEDGE_OK)
        return rc;
    double *sums = (double *)ws;
    float *xc = (float *)(ws + 3 * sizeof(double)), *yc = xc + n * d1, *gx = yc + n * d2;
    float *gy = gx + d1 * d1, *cr = gy + d2 * d2;
    cublasHandle_t h = NULL;
    rc = kvedge_gpu_blas_err(cublasCreate(&h));
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_blas_err(cublasSetStream(h, st));
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_err(cudaMemsetAsync(sums, 0, 3 * sizeof(double), st));
    if (rc == KVEDGE_OK) {
        s_center_kernel<<<(unsigned)((d1 + S_THREADS - 1) / S_THREADS), S_THREADS, 0, st>>>(
            a->x, a->n, a->d1, xc);
        s_center_kernel<<<(unsigned)((d2 + S_THREADS - 1) / S_THREADS), S_THREADS, 0, st>>>(
            a->y, a->n, a->d2, yc);
        rc = kvedge_gpu_launch_err();
    }
    const float one = 1.0f, zero = 0.0f;
    const int in = (int)n, i1 = (int)d1, i2 = (int)d2;
    /* Column-major views: Xc^T is [d1 x n] with ld d1. Gx = Xc^T Xc, Gy = Yc^T Yc,
     * Cr^T = Xc^T Yc (the norm does not care about the transpose). */
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_blas_err(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, i1, i1, in, &one, xc, i1,
                                             xc, i1, &zero, gx, i1));
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_blas_err(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, i2, i2, in, &one, yc, i2,
                                             yc, i2, &zero, gy, i2));
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_blas_err(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, i1, i2, in, &one, xc, i1,
                                             yc, i2, &zero, cr, i1));
    if (rc == KVEDGE_OK) {
        s_frob2_kernel<<<64, 256, 0, st>>>(gx, d1 * d1, sums);
        s_frob2_kernel<<<64, 256, 0, st>>>(gy, d2 * d2, sums + 1);
        s_frob2_kernel<<<64, 256, 0, st>>>(cr, d1 * d2, sums + 2);
        rc = kvedge_gpu_launch_err();
    }
    double hs[3] = {0, 0, 0};
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_err(cudaMemcpyAsync(hs, sums, sizeof hs, cudaMemcpyDeviceToHost, st));
    int frc = kvedge_gpu_err(cudaFreeAsync(ws, st));
    int src = kvedge_gpu_err(cudaStreamSynchronize(st));
    if (h)
        cublasDestroy(h);
    if (rc == KVEDGE_OK)
        rc = frc != KVEDGE_OK ? frc : src;
    if (rc == KVEDGE_OK) {
        const double den = sqrt(hs[0]) * sqrt(hs[1]);
        *a->cka = den > 0 ? hs[2] / den : 0.0;
    }
    return rc;
}

/* One thread per (channel, head): column sums of squares of Q and K in double. */
__global__ void s_think_kernel(kvedge_think_args_t a)
{
    const uint32_t c = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y, D = a.head_dim;
    if (c >= D)
        return;
    double qs = 0, ks = 0;
    for (uint32_t r = 0; r < a.nq; r++) {
        const double x = a.q[((size_t)h * a.nq + r) * D + c];
        qs += x * x;
    }
    for (uint32_t r = 0; r < a.n; r++) {
        const double x = a.k[((size_t)h * a.n + r) * D + c];
        ks += x * x;
    }
    a.scores[(size_t)h * D + c] = (float)(sqrt(qs) * sqrt(ks));
}

extern "C" int kvedge_gpu_think_scores(const kvedge_think_args_t *a, kvedge_gpu_stream_t s)
{
    int rc = kvedge_think_check(a);
    if (rc != KVEDGE_OK)
        return rc;
    if (a->heads > 65535u)
        return KVEDGE_EINVAL;
    dim3 grid((a->head_dim + S_THREADS - 1) / S_THREADS, a->heads);
    s_think_kernel<<<grid, S_THREADS, 0, (cudaStream_t)s>>>(*a);
    return kvedge_gpu_launch_err();
}
