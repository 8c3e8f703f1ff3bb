/* Internal to gpu/: the CUDA side of gpu/stage.h (gpu/stage.cu), called by gpu/stage.c only
 * when a device is present. Streams and events travel as opaque pointers. */
#ifndef KVEDGE_GPU_STAGE_IMPL_H
#define KVEDGE_GPU_STAGE_IMPL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

int kvedge_gpu_cuda_stream_new(void **out);
int kvedge_gpu_cuda_stream_destroy(void *s);
int kvedge_gpu_cuda_stream_sync(void *s);
int kvedge_gpu_cuda_stream_wait(void *s, void *ev);
int kvedge_gpu_cuda_host_alloc(size_t bytes, void **out);
void kvedge_gpu_cuda_host_free(void *p);
int kvedge_gpu_cuda_dev_alloc(size_t bytes, void **out);
void kvedge_gpu_cuda_dev_free(void *p);
/* to_device 1: host to device, 0: device to host. */
int kvedge_gpu_cuda_copy(void *dst, const void *src, size_t bytes, void *s, int to_device);
int kvedge_gpu_cuda_event_new(void **out);
void kvedge_gpu_cuda_event_destroy(void *ev);
int kvedge_gpu_cuda_event_record(void *ev, void *s);
/* 1 done, 0 pending, negative error. */
int kvedge_gpu_cuda_event_query(void *ev);
int kvedge_gpu_cuda_event_sync(void *ev);

#ifdef __cplusplus
}
#endif
#endif
