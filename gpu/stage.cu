/* CUDA side of gpu/stage.h (see gpu/stage_impl.h): thin wrappers that map errors. */
#include "gpu/common.cuh"
#include "gpu/stage_impl.h"

extern "C" int kvedge_gpu_cuda_stream_new(void **out)
{
    cudaStream_t s;
    int rc = kvedge_gpu_err(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (rc == KVEDGE_OK)
        *out = (void *)s;
    return rc;
}

extern "C" int kvedge_gpu_cuda_stream_destroy(void *s)
{
    cudaStreamSynchronize((cudaStream_t)s);
    return kvedge_gpu_err(cudaStreamDestroy((cudaStream_t)s));
}

extern "C" int kvedge_gpu_cuda_stream_sync(void *s)
{
    return kvedge_gpu_err(cudaStreamSynchronize((cudaStream_t)s));
}

extern "C" int kvedge_gpu_cuda_stream_wait(void *s, void *ev)
{
    return kvedge_gpu_err(cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)ev, 0));
}

extern "C" int kvedge_gpu_cuda_host_alloc(size_t bytes, void **out)
{
    return kvedge_gpu_err(cudaHostAlloc(out, bytes, cudaHostAllocDefault));
}

extern "C" void kvedge_gpu_cuda_host_free(void *p)
{
    kvedge_gpu_err(cudaFreeHost(p));
}

extern "C" int kvedge_gpu_cuda_dev_alloc(size_t bytes, void **out)
{
    return kvedge_gpu_err(cudaMalloc(out, bytes));
}

extern "C" void kvedge_gpu_cuda_dev_free(void *p)
{
    kvedge_gpu_err(cudaFree(p));
}

extern "C" int kvedge_gpu_cuda_copy(void *dst, const void *src, size_t bytes, void *s,
                                    int to_device)
{
    return kvedge_gpu_err(cudaMemcpyAsync(
        dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
        (cudaStream_t)s));
}

extern "C" int kvedge_gpu_cuda_event_new(void **out)
{
    cudaEvent_t e;
    int rc = kvedge_gpu_err(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    if (rc == KVEDGE_OK)
        *out = (void *)e;
    return rc;
}

extern "C" void kvedge_gpu_cuda_event_destroy(void *ev)
{
    kvedge_gpu_err(cudaEventDestroy((cudaEvent_t)ev));
}

extern "C" int kvedge_gpu_cuda_event_record(void *ev, void *s)
{
    return kvedge_gpu_err(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)s));
}

extern "C" int kvedge_gpu_cuda_event_query(void *ev)
{
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaSuccess)
        return 1;
    if (e == cudaErrorNotReady) {
        cudaGetLastError(); /* not an error: do not leave it sticky */
        return 0;
    }
    return kvedge_gpu_err(e);
}

extern "C" int kvedge_gpu_cuda_event_sync(void *ev)
{
    return kvedge_gpu_err(cudaEventSynchronize((cudaEvent_t)ev));
}
