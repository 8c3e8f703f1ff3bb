/* CUDA build of gpu/gpu.h: asks the runtime, and treats any runtime error as "no device". */
#include <cuda_runtime.h>

#include "gpu/gpu.h"

extern "C" int kvedge_gpu_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky error so later calls start clean */
        return 0;
    }
    return n;
}

extern "C" int kvedge_gpu_built_with_cuda(void)
{
    return 1;
}
