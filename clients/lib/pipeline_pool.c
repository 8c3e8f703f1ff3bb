/* The pipelines' ring pool (clients/lib/pipeline.h, "The ring pool"): the host slot buffers a
 * destroyed pipeline gives back are kept for the next one of this process, so a request does
 * not pay for pinned allocation (cudaHostAlloc on the device path) and first-touch page faults
 * each time. Bounded by a byte cap and a count; best fit within twice the size asked for, so a
 * small pipeline does not take a huge buffer. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "clients/lib/pipeline.h"
#include "clients/lib/pipeline_impl.h"
#include "access/codec/error.h"
#include "gpu/stage.h"

#define S_HELD_MAX 32 /* buffers kept at most, whatever their bytes */

typedef struct {
    void *p;
    size_t bytes;
} s_buf_t;

static struct {
    pthread_mutex_t mu;
    s_buf_t held[S_HELD_MAX];
    uint32_t n;
    size_t held_bytes, cap_bytes;
    uint64_t reused, allocated, kept, freed;
} s_pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .cap_bytes = KVEDGE_PIPELINE_POOL_BYTES_DEFAULT};

int kvedge_pipeline__pool_take(size_t bytes, void **out, size_t *got)
{
    pthread_mutex_lock(&s_pool.mu);
    uint32_t best = S_HELD_MAX;
    for (uint32_t i = 0; i < s_pool.n; i++)
        if (s_pool.held[i].bytes >= bytes && s_pool.held[i].bytes / 2 <= bytes &&
            (best == S_HELD_MAX || s_pool.held[i].bytes < s_pool.held[best].bytes))
            best = i;
    if (best != S_HELD_MAX) {
        *out = s_pool.held[best].p;
        *got = s_pool.held[best].bytes;
        s_pool.held_bytes -= *got;
        s_pool.held[best] = s_pool.held[--s_pool.n];
        s_pool.reused++;
        pthread_mutex_unlock(&s_pool.mu);
        return KVEDGE_OK;
    }
    pthread_mutex_unlock(&s_pool.mu);
    int rc = kvedge_gpu_host_alloc(bytes, out);
    if (rc == KVEDGE_OK) {
        *got = bytes;
        pthread_mutex_lock(&s_pool.mu);
        s_pool.allocated++;
        pthread_mutex_unlock(&s_pool.mu);
    }
    return rc;
}

void kvedge_pipeline__pool_give(void *p, size_t bytes)
{
    if (!p)
        return;
    pthread_mutex_lock(&s_pool.mu);
    const bool keep = s_pool.n < S_HELD_MAX && bytes <= s_pool.cap_bytes &&
                      s_pool.held_bytes <= s_pool.cap_bytes - bytes;
    if (keep) {
        s_pool.held[s_pool.n++] = (s_buf_t){p, bytes};
        s_pool.held_bytes += bytes;
        s_pool.kept++;
    } else {
        s_pool.freed++;
    }
    pthread_mutex_unlock(&s_pool.mu);
    if (!keep)
        kvedge_gpu_host_free(p);
}

/* Frees held buffers until at most cap bytes are held. Call with the lock; frees outside. */
static uint32_t s_shrink(size_t cap, s_buf_t *drop)
{
    uint32_t n = 0;
    while (s_pool.n && s_pool.held_bytes > cap) {
        drop[n] = s_pool.held[--s_pool.n];
        s_pool.held_bytes -= drop[n].bytes;
        s_pool.freed++;
        n++;
    }
    return n;
}

void kvedge_pipeline_pool_set_cap(size_t bytes)
{
    s_buf_t drop[S_HELD_MAX];
    pthread_mutex_lock(&s_pool.mu);
    s_pool.cap_bytes = bytes;
    uint32_t n = s_shrink(bytes, drop);
    pthread_mutex_unlock(&s_pool.mu);
    for (uint32_t i = 0; i < n; i++)
        kvedge_gpu_host_free(drop[i].p);
}

void kvedge_pipeline_pool_trim(void)
{
    s_buf_t drop[S_HELD_MAX];
    pthread_mutex_lock(&s_pool.mu);
    uint32_t n = s_shrink(0, drop);
    pthread_mutex_unlock(&s_pool.mu);
    for (uint32_t i = 0; i < n; i++)
        kvedge_gpu_host_free(drop[i].p);
}

int kvedge_pipeline_pool_stats(kvedge_pipeline_pool_stats_t *out)
{
    if (!out || out->size < KVEDGE_PIPELINE_POOL_STATS_SIZE_MIN)
        return KVEDGE_EINVAL;
    kvedge_pipeline_pool_stats_t s = {.size = sizeof s};
    pthread_mutex_lock(&s_pool.mu);
    s.cap_bytes = s_pool.cap_bytes;
    s.held = s_pool.n;
    s.held_bytes = s_pool.held_bytes;
    s.reused = s_pool.reused;
    s.allocated = s_pool.allocated;
    s.kept = s_pool.kept;
    s.freed = s_pool.freed;
    pthread_mutex_unlock(&s_pool.mu);
    /* A newer caller's larger struct keeps its tail; its size says what it is. */
    const size_t n = out->size < sizeof s ? out->size : sizeof s;
    s.size = out->size;
    memcpy(out, &s, n);
    return KVEDGE_OK;
}
