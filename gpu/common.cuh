/* Device helpers shared by the gpu/ kernels: CUDA error mapping and the exact fp16/bf16
 * conversions of access/codec/half.h (same bits, NaN payloads included), written with explicitly
 * rounded float ops so nvcc cannot fuse them. */
#ifndef KVEDGE_GPU_COMMON_CUH
#define KVEDGE_GPU_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "access/codec/error.h"

/* Maps a CUDA error to a KVEDGE_E* code (see gpu/gpu.h) and clears the sticky last error. */
static inline int kvedge_gpu_err(cudaError_t e)
{
    if (e == cudaSuccess)
        return KVEDGE_OK;
    cudaGetLastError();
    switch (e) {
    case cudaErrorMemoryAllocation:
        return KVEDGE_ENOMEM;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
        return KVEDGE_EINVAL;
    default:
        return KVEDGE_EIO;
    }
}

/* Launch-time failures (bad configuration, no device) show up in cudaGetLastError. */
static inline int kvedge_gpu_launch_err(void)
{
    return kvedge_gpu_err(cudaGetLastError());
}

__device__ __forceinline__ float kvedge_d_fp16_to_f32(uint16_t h)
{
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    if ((h & 0x7C00u) == 0x7C00u) { /* inf / NaN: the CPU keeps the payload and quiets it */
        const uint32_t mant = (uint32_t)(h & 0x03FFu) << 13;
        return __uint_as_float(sign | 0x7F800000u | mant | (mant ? 0x00400000u : 0u));
    }
    const float normal = __fmul_rn(__uint_as_float((two_w >> 4) + (0xE0u << 23)), 0x1.0p-112f);
    const float subnormal = __fadd_rn(__uint_as_float((two_w >> 17) | (126u << 23)), -0.5f);
    const uint32_t bits = two_w < (1u << 27) ? __float_as_uint(subnormal) : __float_as_uint(normal);
    return __uint_as_float(sign | bits);
}

__device__ __forceinline__ uint16_t kvedge_d_f32_to_fp16(float f)
{
    const uint32_t w = __float_as_uint(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    float base = __fmul_rn(__fmul_rn(__uint_as_float(w & 0x7FFFFFFFu), 0x1.0p+112f), 0x1.0p-110f);
    uint32_t bias = shl1_w & 0xFF000000u;
    bias = bias < 0x71000000u ? 0x71000000u : bias;
    base = __fadd_rn(__uint_as_float((bias >> 1) + 0x07800000u), base);
    const uint32_t bits = __float_as_uint(base);
    const uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
    const uint32_t nan = 0x7E00u | ((w >> 13) & 0x03FFu);
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? nan : nonsign));
}

__device__ __forceinline__ float kvedge_d_bf16_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

__device__ __forceinline__ uint16_t kvedge_d_f32_to_bf16(float f)
{
    const uint32_t u = __float_as_uint(f);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    const int is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    return (uint16_t)(is_nan ? ((u >> 16) | 0x40u) : rounded);
}

/* Element i of an array in a kvedge dtype (1 fp16, 2 bf16, 3 fp32), as fp32. */
__device__ __forceinline__ float kvedge_d_load(int dtype, const void *p, size_t i)
{
    if (dtype == 1)
        return kvedge_d_fp16_to_f32(((const uint16_t *)p)[i]);
    if (dtype == 2)
        return kvedge_d_bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

#endif
