/* The no-CUDA build of gpu/gpu.h: there is never a device. */
#include "gpu/gpu.h"

int kvedge_gpu_device_count(void)
{
    return 0;
}

int kvedge_gpu_built_with_cuda(void)
{
    return 0;
}
