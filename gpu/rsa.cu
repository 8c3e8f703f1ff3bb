/* CUDA side of gpu/rsa.h: rows scaled to unit length by a plain kernel, the two cosine
 * matrices by cublasSgemm (cuBLAS is column-major: a row-major [n][d] matrix is its
 * transpose, and U U^T is symmetric, so either storage order reads the same), the Pearson
 * correlation of their strict lower triangles by two reductions in double, as the CPU
 * reference does. */
#include <cublas_v2.h>
#include <math.h>

#include "gpu/blas.cuh"
#include "gpu/common.cuh"
#include "gpu/rsa.h"

#define S_THREADS 256
#define S_BLOCKS  256

/* u = x with every row scaled to unit length (a zero row stays zero); one thread per row. */
__global__ void s_unit_rows_kernel(const float *x, uint32_t n, uint32_t d, float *u)
{
    const uint32_t r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n)
        return;
    const float *row = x + (size_t)r * d;
    double ss = 0;
    for (uint32_t c = 0; c < d; c++)
        ss += (double)row[c] * row[c];
    const double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
    for (uint32_t c = 0; c < d; c++)
        u[(size_t)r * d + c] = (float)(row[c] * inv);
}

/* Warp sum, then one double atomic per warp. */
__device__ __forceinline__ void s_add(double *out, double v)
{
    for (int off = 16; off > 0; off /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    if (threadIdx.x % 32 == 0)
        atomicAdd(out, v);
}

/* Pass 1: sums[0] += sx, sums[1] += sy over the entries i > j. */
__global__ void s_sums_kernel(const float *sx, const float *sy, uint32_t n, double *sums)
{
    double a = 0, b = 0;
    const size_t total = (size_t)n * n;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < total;
         k += (size_t)gridDim.x * blockDim.x) {
        const size_t i = k / n, j = k % n;
        if (i > j) {
            a += sx[k];
            b += sy[k];
        }
    }
    s_add(sums, a);
    s_add(sums + 1, b);
}

/* Pass 2: sums[2..4] += centred cross and square terms, with the means of pass 1. */
__global__ void s_moments_kernel(const float *sx, const float *sy, uint32_t n, double *sums)
{
    const double m = (double)n * (n - 1) / 2, mx = sums[0] / m, my = sums[1] / m;
    double xy = 0, xx = 0, yy = 0;
    const size_t total = (size_t)n * n;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < total;
         k += (size_t)gridDim.x * blockDim.x) {
        const size_t i = k / n, j = k % n;
        if (i > j) {
            const double p = sx[k] - mx, q = sy[k] - my;
            xy += p * q;
            xx += p * p;
            yy += q * q;
        }
    }
    s_add(sums + 2, xy);
    s_add(sums + 3, xx);
    s_add(sums + 4, yy);
}

extern "C" int kvedge_gpu_rsa(const kvedge_rsa_args_t *a, kvedge_gpu_stream_t s)
{
    int rc = kvedge_rsa_check(a);
    if (rc != KVEDGE_OK || a->n > KVEDGE_RSA_MAX_SAMPLES)
        return KVEDGE_EINVAL;
    cudaStream_t st = (cudaStream_t)s;
    const size_t n = a->n, d1 = a->d1, d2 = a->d2;
    const size_t floats = n * (d1 + d2) + 2 * n * n;
    char *ws = NULL;
    rc = kvedge_gpu_err(
        cudaMallocAsync((void **)&ws, 5 * sizeof(double) + floats * sizeof(float), st));
    if (rc != KVEDGE_OK)
        return rc;
    double *sums = (double *)ws;
    float *ux = (float *)(ws + 5 * sizeof(double)), *uy = ux + n * d1, *sx = uy + n * d2;
    float *sy = sx + n * n;
    cublasHandle_t h = NULL;
    rc = kvedge_gpu_blas_err(cublasCreate(&h));
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_blas_err(cublasSetStream(h, st));
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_err(cudaMemsetAsync(sums, 0, 5 * sizeof(double), st));
    if (rc == KVEDGE_OK) {
        const unsigned blocks = (unsigned)((n + S_THREADS - 1) / S_THREADS);
        s_unit_rows_kernel<<<blocks, S_THREADS, 0, st>>>(a->x, a->n, a->d1, ux);
        s_unit_rows_kernel<<<blocks, S_THREADS, 0, st>>>(a->y, a->n, a->d2, uy);
        rc = kvedge_gpu_launch_err();
    }
    const float one = 1.0f, zero = 0.0f;
    const int in = (int)n, i1 = (int)d1, i2 = (int)d2;
    /* Column-major view of row-major U [n][d]: U^T, [d x n] with ld d. S = (U^T)^T U^T. */
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_blas_err(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, in, in, i1, &one, ux, i1,
                                             ux, i1, &zero, sx, in));
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_blas_err(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, in, in, i2, &one, uy, i2,
                                             uy, i2, &zero, sy, in));
    if (rc == KVEDGE_OK) {
        s_sums_kernel<<<S_BLOCKS, S_THREADS, 0, st>>>(sx, sy, a->n, sums);
        s_moments_kernel<<<S_BLOCKS, S_THREADS, 0, st>>>(sx, sy, a->n, sums);
        rc = kvedge_gpu_launch_err();
    }
    double hs[5] = {0, 0, 0, 0, 0};
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_err(cudaMemcpyAsync(hs, sums, sizeof hs, cudaMemcpyDeviceToHost, st));
    int frc = kvedge_gpu_err(cudaFreeAsync(ws, st));
    int src = kvedge_gpu_err(cudaStreamSynchronize(st));
    if (h)
        cublasDestroy(h);
    if (rc == KVEDGE_OK)
        rc = frc != KVEDGE_OK ? frc : src;
    if (rc == KVEDGE_OK) {
        const double den = sqrt(hs[3]) * sqrt(hs[4]);
        const double r = den > 0 ? hs[2] / den : 0.0;
        *a->rsa = r > 1 ? 1 : (r < -1 ? -1 : r);
    }
    return rc;
}
