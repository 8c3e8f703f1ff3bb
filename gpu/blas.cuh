/* cuBLAS status to a KVEDGE_E* code, for the gpu/ ops that call cuBLAS (CKA, RSA, the K/V
 * adapter): one mapping, as gpu/common.cuh has for CUDA's own errors. */
#ifndef KVEDGE_GPU_BLAS_CUH
#define KVEDGE_GPU_BLAS_CUH

#include <cublas_v2.h>

#include "access/codec/error.h"

static inline int kvedge_gpu_blas_err(cublasStatus_t st)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return KVEDGE_OK;
    return st == CUBLAS_STATUS_ALLOC_FAILED ? KVEDGE_ENOMEM
           : st == CUBLAS_STATUS_NOT_INITIALIZED || st == CUBLAS_STATUS_INVALID_VALUE
               ? KVEDGE_EINVAL
               : KVEDGE_EIO;
}

#endif
