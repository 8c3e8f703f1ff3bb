/* Staging primitives for the pipelined loader: streams, pinned host and device memory, async
 * host-to-device copies and events. One API for both paths: with a CUDA device they are the
 * CUDA runtime's; without one (no CUDA in the build, or no device at run time) "device"
 * memory is host memory, copies are synchronous memcpy and an event is complete once
 * recorded, so a loader written on this API runs unchanged (use kvedge_gpu_stage_on_device to
 * pick kvedge_gpu_* or kvedge_cpu_* kernels to go with it).
 *
 * Thread safety: every function may be called from any thread. A stream or event may be used
 * by several threads at once (record/query/sync/wait), as in CUDA; destroying one while
 * another thread still uses it is the caller's bug. Memory returned here is not zeroed. */
#ifndef KVEDGE_GPU_STAGE_H
#define KVEDGE_GPU_STAGE_H

#include <stddef.h>

#include "gpu/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvedge_gpu_event_s kvedge_gpu_event_t;

/* 1 when staging uses a CUDA device, 0 for the CPU path. Decided once per process. */
int kvedge_gpu_stage_on_device(void);

/* A non-blocking stream (does not wait on the legacy default stream). Caller owns *out,
 * destroys with kvedge_gpu_stream_destroy. Errors: KVEDGE_EINVAL (NULL), KVEDGE_ENOMEM, CUDA. */
int kvedge_gpu_stream_new(kvedge_gpu_stream_t *out);
/* Waits for the stream's work, destroys it, sets *s_p to NULL. NULL-safe, idempotent. */
void kvedge_gpu_stream_destroy(kvedge_gpu_stream_t *s_p);
/* Waits until everything queued on s (NULL: the default stream) has finished. */
int kvedge_gpu_stream_sync(kvedge_gpu_stream_t s);
/* Work queued on s after this waits for the last record of e. */
int kvedge_gpu_stream_wait_event(kvedge_gpu_stream_t s, kvedge_gpu_event_t *e);

/* Page-locked host memory (cudaHostAlloc; malloc on the CPU path), so async copies from it
 * overlap compute. bytes 0 gives KVEDGE_EINVAL. Free with kvedge_gpu_host_free (NULL-safe). */
int kvedge_gpu_host_alloc(size_t bytes, void **out);
void kvedge_gpu_host_free(void *p);
/* Device memory (cudaMalloc; malloc on the CPU path). Free with kvedge_gpu_dev_free. */
int kvedge_gpu_dev_alloc(size_t bytes, void **out);
void kvedge_gpu_dev_free(void *p);

/* Queues a copy of bytes from host src to device dst on s and returns (asynchronous only from
 * pinned memory; the CPU path copies before returning). src must stay untouched until the copy
 * is known done (an event recorded after it). Errors: KVEDGE_EINVAL (NULL with bytes > 0),
 * CUDA. */
int kvedge_gpu_copy_h2d(void *dst, const void *src, size_t bytes, kvedge_gpu_stream_t s);
/* Device to host, the same way (for results and tests). */
int kvedge_gpu_copy_d2h(void *dst, const void *src, size_t bytes, kvedge_gpu_stream_t s);

/* An event with timing disabled (cheapest to record and query). Caller owns it. */
int kvedge_gpu_event_new(kvedge_gpu_event_t **out);
/* NULL-safe, idempotent; sets *e_p to NULL. */
void kvedge_gpu_event_destroy(kvedge_gpu_event_t **e_p);
/* Marks the point after everything queued on s so far. */
int kvedge_gpu_event_record(kvedge_gpu_event_t *e, kvedge_gpu_stream_t s);
/* 1 when the work before the last record is done (or it was never recorded), 0 while pending,
 * or a negative error. Never blocks. */
int kvedge_gpu_event_query(kvedge_gpu_event_t *e);
/* Blocks until the work before the last record is done. */
int kvedge_gpu_event_sync(kvedge_gpu_event_t *e);

#ifdef __cplusplus
}
#endif
#endif
