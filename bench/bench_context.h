/* A synthetic context for the fetch benchmarks (bench_loader, bench_fetch_cost): fp16 K/V of a
 * model's shape from kvedge_synth_head (head h of layer l seeded l * 1000 + h, positions from
 * the chunk's first token), cut into chunks, encoded in one scheme (lz4 where it pays) and put
 * to a node, one PUT per (layer, chunk) with every head; and the put items and fetch waits that
 * bench_proxy, bench_pipeline and bench_soak share. */
#ifndef KVEDGE_BENCH_CONTEXT_H
#define KVEDGE_BENCH_CONTEXT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_common.h"
#include "clients/lib/kvedge.h"
#include "access/codec/block.h"
#include "access/codec/synth.h"

typedef struct {
    const kvedge_model_t *m;      /* layers, kv_heads, head_dim; its id names the blocks */
    const kvedge_chunk_id_t *ids; /* the chain, chunks entries */
    uint32_t chunks;
    uint32_t tokens;       /* over all chunks; the last chunk may hold fewer */
    uint32_t chunk_tokens; /* tokens per chunk */
    kvedge_scheme_t scheme;
    /* Optional: every block kept, [layer][chunk][head], block i at keep + i * keep_cap (room
     * for the largest block, bench_context_block_cap) and its length in keep_len[i]. */
    uint8_t *keep;
    size_t keep_cap;
    size_t *keep_len;
} bench_context_t;

/* Head h of layer l of chunk ci of the chain ids (model_id, spec->tokens tokens a chunk): fp16
 * K/V synthesized from seed at the chunk's first position into k and v (spec->tokens x
 * spec->head_dim each), encoded with spec into block (cap bytes), and *it filled to put it. */
static inline void bench_chunk_item(kvedge_put_item_t *it, const char *model_id,
                                    const kvedge_chunk_id_t *ids, uint32_t ci, uint32_t l,
                                    uint32_t h, uint64_t seed, const kvedge_block_spec_t *spec,
                                    uint8_t *block, size_t cap, uint16_t *k, uint16_t *v)
{
    kvedge_synth_head(seed, ci * spec->tokens, spec->tokens, spec->head_dim, KVEDGE_DTYPE_FP16, k,
                      v);
    memset(it, 0, sizeof *it);
    kvedge_block_encode(spec, k, v, block, cap, &it->len);
    it->chunk.id = ids[ci];
    it->chunk.has_parent = ci > 0;
    if (ci > 0)
        it->chunk.parent = ids[ci - 1];
    snprintf(it->chunk.model_id, sizeof it->chunk.model_id, "%s", model_id);
    it->chunk.index = ci;
    it->chunk.tokens = spec->tokens;
    it->layer = (uint16_t)l;
    it->head = (uint16_t)h;
    it->block = block;
}

/* The end of an asynchronous fetch: the first member of a benchmark's fetch state, so that
 * bench_fetch_done can be the request's done callback and bench_fetch_wait can wait for it. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status; /* the fetch's */
} bench_fetch_end_t;

static inline void bench_fetch_done(void *ctx, int status)
{
    bench_fetch_end_t *e = ctx;
    pthread_mutex_lock(&e->mu);
    e->done = true;
    e->status = status;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* Sends req on c with the callbacks cbs (their ctx: a state whose first member is a
 * bench_fetch_end_t, cbs->done bench_fetch_done) and, when it was sent, waits for its end.
 * Returns the send's error (0 when sent); the fetch's status is in the end's status. */
static inline int bench_fetch_wait(kvedge_client_t *c, const kvedge_fetch_req_t *req,
                                   const kvedge_fetch_cbs_t *cbs, void *ctx)
{
    bench_fetch_end_t *e = ctx;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->done = false;
    e->status = 0;
    int rc = kvedge_client_fetch_async(c, req, cbs, ctx);
    if (rc == 0) {
        pthread_mutex_lock(&e->mu);
        while (!e->done)
            pthread_cond_wait(&e->cv, &e->mu);
        pthread_mutex_unlock(&e->mu);
    }
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    return rc;
}

/* Bytes one encoded block of the context may take (16-byte multiple). */
static inline size_t bench_context_block_cap(const bench_context_t *x)
{
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, x->scheme, x->chunk_tokens, x->m->head_dim, 0, NULL, true};
    return (kvedge_block_encoded_bound(&spec) + 15) & ~(size_t)15;
}

/* Puts the context with c; returns the bytes of the blocks put. Exits on any error. */
static inline double bench_put_context(kvedge_client_t *c, const bench_context_t *x)
{
    const kvedge_model_t *m = x->m;
    const size_t cap = x->keep ? x->keep_cap : bench_context_block_cap(x);
    uint8_t *own = x->keep ? NULL : bench_alloc(cap * m->kv_heads);
    const size_t n = (size_t)x->chunk_tokens * m->head_dim;
    uint16_t *k = bench_alloc(n * 2), *v = bench_alloc(n * 2);
    kvedge_put_item_t *items = bench_alloc(m->kv_heads * sizeof *items);
    double bytes = 0;
    for (uint32_t l = 0; l < m->layers; l++)
        for (uint32_t ci = 0; ci < x->chunks; ci++) {
            const uint32_t first = ci * x->chunk_tokens;
            const uint32_t t =
                x->tokens - first < x->chunk_tokens ? x->tokens - first : x->chunk_tokens;
            kvedge_block_spec_t spec = {
                KVEDGE_DTYPE_FP16, x->scheme, t, m->head_dim, 0, NULL, true};
            for (uint32_t h = 0; h < m->kv_heads; h++) {
                const size_t bi = ((size_t)l * x->chunks + ci) * m->kv_heads + h;
                uint8_t *blk = x->keep ? x->keep + bi * cap : own + h * cap;
                KVEDGE_BENCH_CHECK(kvedge_synth_head(l * 1000 + h, first, t, m->head_dim,
                                                     KVEDGE_DTYPE_FP16, k, v));
                kvedge_put_item_t *it = &items[h];
                memset(it, 0, sizeof *it);
                KVEDGE_BENCH_CHECK(kvedge_block_encode(&spec, k, v, blk, cap, &it->len));
                if (x->keep_len)
                    x->keep_len[bi] = it->len;
                it->chunk.id = x->ids[ci];
                it->chunk.has_parent = ci > 0;
                if (ci > 0)
                    it->chunk.parent = x->ids[ci - 1];
                snprintf(it->chunk.model_id, sizeof it->chunk.model_id, "%.*s",
                         (int)sizeof it->chunk.model_id - 1, m->id);
                it->chunk.index = ci;
                it->chunk.tokens = t;
                it->layer = (uint16_t)l;
                it->head = (uint16_t)h;
                it->block = blk;
                bytes += (double)it->len;
            }
            KVEDGE_BENCH_CHECK(kvedge_client_put(c, items, m->kv_heads, NULL));
        }
    free(own);
    free(k);
    free(v);
    free(items);
    return bytes;
}

#endif
