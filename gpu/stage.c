/* gpu/stage.h: dispatches to the CUDA runtime (gpu/stage.cu) when a device is present, else
 * runs the CPU path (malloc, memcpy, events complete once recorded). */
#include "gpu/stage.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/stage_impl.h"
#include "access/codec/bigmem.h"
#include "access/codec/error.h"

struct kvedge_gpu_event_s {
    void *ev;            /* cudaEvent_t on the device path, NULL on the CPU path */
    atomic_int recorded; /* CPU path: recorded at least once (for symmetry with CUDA) */
};

/* CPU path: a stream is a token that only has to be distinct and freeable. */
struct kvedge_gpu_stream_s {
    int unused;
};

static atomic_int s_mode = -1; /* -1 unknown, 0 CPU, 1 device */

int kvedge_gpu_stage_on_device(void)
{
    int m = atomic_load(&s_mode);
    if (m < 0) {
        m = kvedge_gpu_device_count() > 0;
        atomic_store(&s_mode, m);
    }
    return m;
}

#ifndef KVEDGE_HAVE_CUDA
/* Never called: without CUDA the mode is always the CPU path. */
int kvedge_gpu_cuda_stream_new(void **out)
{
    (void)out;
    return KVEDGE_EINVAL;
}
int kvedge_gpu_cuda_stream_destroy(void *s)
{
    (void)s;
    return KVEDGE_EINVAL;
}
int kvedge_gpu_cuda_stream_sync(void *s)
{
    (void)s;
    return KVEDGE_EINVAL;
}
int kvedge_gpu_cuda_stream_wait(void *s, void *ev)
{
    (void)s;
    (void)ev;
    return KVEDGE_EINVAL;
}
int kvedge_gpu_cuda_host_alloc(size_t bytes, void **out)
{
    (void)bytes;
    (void)out;
    return KVEDGE_EINVAL;
}
void kvedge_gpu_cuda_host_free(void *p)
{
    (void)p;
}
int kvedge_gpu_cuda_dev_alloc(size_t bytes, void **out)
{
    (void)bytes;
    (void)out;
    return KVEDGE_EINVAL;
}
void kvedge_gpu_cuda_dev_free(void *p)
{
    (void)p;
}
int kvedge_gpu_cuda_copy(void *dst, const void *src, size_t bytes, void *s, int to_device)
{
    (void)dst;
    (void)src;
    (void)bytes;
    (void)s;
    (void)to_device;
    return KVEDGE_EINVAL;
}
int kvedge_gpu_cuda_event_new(void **out)
{
    (void)out;
    return KVEDGE_EINVAL;
}
void kvedge_gpu_cuda_event_destroy(void *ev)
{
    (void)ev;
}
int kvedge_gpu_cuda_event_record(void *ev, void *s)
{
    (void)ev;
    (void)s;
    return KVEDGE_EINVAL;
}
int kvedge_gpu_cuda_event_query(void *ev)
{
    (void)ev;
    return KVEDGE_EINVAL;
}
int kvedge_gpu_cuda_event_sync(void *ev)
{
    (void)ev;
    return KVEDGE_EINVAL;
}
#endif

int kvedge_gpu_stream_new(kvedge_gpu_stream_t *out)
{
    if (!out)
        return KVEDGE_EINVAL;
    if (kvedge_gpu_stage_on_device()) {
        void *s = NULL;
        int rc = kvedge_gpu_cuda_stream_new(&s);
        if (rc == KVEDGE_OK)
            *out = (kvedge_gpu_stream_t)s;
        return rc;
    }
    kvedge_gpu_stream_t s = calloc(1, sizeof *s);
    if (!s)
        return KVEDGE_ENOMEM;
    *out = s;
    return KVEDGE_OK;
}

void kvedge_gpu_stream_destroy(kvedge_gpu_stream_t *s_p)
{
    if (!s_p || !*s_p)
        return;
    if (kvedge_gpu_stage_on_device())
        kvedge_gpu_cuda_stream_destroy(*s_p);
    else
        free(*s_p);
    *s_p = NULL;
}

int kvedge_gpu_stream_sync(kvedge_gpu_stream_t s)
{
    return kvedge_gpu_stage_on_device() ? kvedge_gpu_cuda_stream_sync(s) : KVEDGE_OK;
}

int kvedge_gpu_stream_wait_event(kvedge_gpu_stream_t s, kvedge_gpu_event_t *e)
{
    if (!e)
        return KVEDGE_EINVAL;
    return kvedge_gpu_stage_on_device() ? kvedge_gpu_cuda_stream_wait(s, e->ev) : KVEDGE_OK;
}

int kvedge_gpu_host_alloc(size_t bytes, void **out)
{
    if (!out || bytes == 0)
        return KVEDGE_EINVAL;
    if (kvedge_gpu_stage_on_device())
        return kvedge_gpu_cuda_host_alloc(bytes, out);
    void *p = kvedge_big_alloc(bytes);
    if (!p)
        return KVEDGE_ENOMEM;
    *out = p;
    return KVEDGE_OK;
}

void kvedge_gpu_host_free(void *p)
{
    if (!p)
        return;
    if (kvedge_gpu_stage_on_device())
        kvedge_gpu_cuda_host_free(p);
    else
        free(p);
}

int kvedge_gpu_dev_alloc(size_t bytes, void **out)
{
    if (!out || bytes == 0)
        return KVEDGE_EINVAL;
    if (kvedge_gpu_stage_on_device())
        return kvedge_gpu_cuda_dev_alloc(bytes, out);
    void *p = malloc(bytes);
    if (!p)
        return KVEDGE_ENOMEM;
    *out = p;
    return KVEDGE_OK;
}

void kvedge_gpu_dev_free(void *p)
{
    if (!p)
        return;
    if (kvedge_gpu_stage_on_device())
        kvedge_gpu_cuda_dev_free(p);
    else
        free(p);
}

static int s_copy(void *dst, const void *src, size_t bytes, kvedge_gpu_stream_t s, int to_device)
{
    if (bytes == 0)
        return KVEDGE_OK;
    if (!dst || !src)
        return KVEDGE_EINVAL;
    if (kvedge_gpu_stage_on_device())
        return kvedge_gpu_cuda_copy(dst, src, bytes, s, to_device);
    memcpy(dst, src, bytes);
    return KVEDGE_OK;
}

int kvedge_gpu_copy_h2d(void *dst, const void *src, size_t bytes, kvedge_gpu_stream_t s)
{
    return s_copy(dst, src, bytes, s, 1);
}

int kvedge_gpu_copy_d2h(void *dst, const void *src, size_t bytes, kvedge_gpu_stream_t s)
{
    return s_copy(dst, src, bytes, s, 0);
}

int kvedge_gpu_event_new(kvedge_gpu_event_t **out)
{
    if (!out)
        return KVEDGE_EINVAL;
    kvedge_gpu_event_t *e = calloc(1, sizeof *e);
    if (!e)
        return KVEDGE_ENOMEM;
    atomic_init(&e->recorded, 0);
    if (kvedge_gpu_stage_on_device()) {
        int rc = kvedge_gpu_cuda_event_new(&e->ev);
        if (rc != KVEDGE_OK) {
            free(e);
            return rc;
        }
    }
    *out = e;
    return KVEDGE_OK;
}

void kvedge_gpu_event_destroy(kvedge_gpu_event_t **e_p)
{
    if (!e_p || !*e_p)
        return;
    if ((*e_p)->ev)
        kvedge_gpu_cuda_event_destroy((*e_p)->ev);
    free(*e_p);
    *e_p = NULL;
}

int kvedge_gpu_event_record(kvedge_gpu_event_t *e, kvedge_gpu_stream_t s)
{
    if (!e)
        return KVEDGE_EINVAL;
    if (e->ev)
        return kvedge_gpu_cuda_event_record(e->ev, s);
    atomic_store(&e->recorded, 1);
    return KVEDGE_OK;
}

int kvedge_gpu_event_query(kvedge_gpu_event_t *e)
{
    if (!e)
        return KVEDGE_EINVAL;
    return e->ev ? kvedge_gpu_cuda_event_query(e->ev) : 1;
}

int kvedge_gpu_event_sync(kvedge_gpu_event_t *e)
{
    if (!e)
        return KVEDGE_EINVAL;
    return e->ev ? kvedge_gpu_cuda_event_sync(e->ev) : KVEDGE_OK;
}
