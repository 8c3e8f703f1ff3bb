/* A client on an endpoint and a synthetic opt-125m context (12 layers x 12 heads x 64, 256
 * tokens a chunk, int8 blocks) that the proxy tests put to nodes and fetch back, block by
 * block. Include after <cmocka.h>. */
#ifndef KVEDGE_TESTS_CTX_FX_H
#define KVEDGE_TESTS_CTX_FX_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/lib/kvedge.h"
#include "access/codec/synth.h"

#define KT_CTX_MODEL      "opt-125m"
#define KT_CTX_LAYERS     12
#define KT_CTX_HEADS      12
#define KT_CTX_DIM        64
#define KT_CTX_TOKENS     256 /* per chunk */
#define KT_CTX_MAX_CHUNKS 2

/* A client of the daemon at ep whose calls wait at most deadline_ms. */
static inline kvedge_client_t *kt_client(const char *ep, int deadline_ms)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = deadline_ms;
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), 0);
    return c;
}

typedef struct {
    uint32_t chunks;
    kvedge_chunk_id_t ids[KT_CTX_MAX_CHUNKS];
    uint8_t *block[KT_CTX_LAYERS][KT_CTX_MAX_CHUNKS][KT_CTX_HEADS];
    size_t len[KT_CTX_LAYERS][KT_CTX_MAX_CHUNKS][KT_CTX_HEADS];
} kt_ctx_t;

/* The context of tokens tok_mul * i + tok_add over `chunks` chunks; head (l, c, h) is synthesized
 * from seed l * 1000 + c * 100 + h, at position c * KT_CTX_TOKENS when positioned, else 0. */
static inline void kt_ctx_make(kt_ctx_t *x, uint32_t chunks, uint32_t tok_mul, uint32_t tok_add,
                               bool positioned)
{
    assert_true(chunks >= 1 && chunks <= KT_CTX_MAX_CHUNKS);
    memset(x, 0, sizeof *x);
    x->chunks = chunks;
    uint32_t tok[KT_CTX_MAX_CHUNKS * KT_CTX_TOKENS];
    for (uint32_t i = 0; i < chunks * KT_CTX_TOKENS; i++)
        tok[i] = tok_mul * i + tok_add;
    assert_int_equal(kvedge_chunk_chain(NULL, 0, KT_CTX_MODEL, tok, chunks * KT_CTX_TOKENS,
                                        KT_CTX_TOKENS, x->ids, chunks),
                     (int)chunks);
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, KT_CTX_TOKENS, KT_CTX_DIM, 0, NULL, false};
    size_t cap = kvedge_block_encoded_bound(&spec);
    static uint16_t k[KT_CTX_TOKENS * KT_CTX_DIM], v[KT_CTX_TOKENS * KT_CTX_DIM];
    for (uint32_t l = 0; l < KT_CTX_LAYERS; l++)
        for (uint32_t c = 0; c < chunks; c++)
            for (uint32_t h = 0; h < KT_CTX_HEADS; h++) {
                x->block[l][c][h] = malloc(cap);
                assert_non_null(x->block[l][c][h]);
                assert_int_equal(
                    kvedge_synth_head(l * 1000 + c * 100 + h, positioned ? c * KT_CTX_TOKENS : 0,
                                      KT_CTX_TOKENS, KT_CTX_DIM, KVEDGE_DTYPE_FP16, k, v),
                    0);
                assert_int_equal(
                    kvedge_block_encode(&spec, k, v, x->block[l][c][h], cap, &x->len[l][c][h]), 0);
            }
}

static inline void kt_ctx_free(kt_ctx_t *x)
{
    for (uint32_t l = 0; l < KT_CTX_LAYERS; l++)
        for (uint32_t c = 0; c < x->chunks; c++)
            for (uint32_t h = 0; h < KT_CTX_HEADS; h++) {
                free(x->block[l][c][h]);
                x->block[l][c][h] = NULL;
            }
}

/* Puts layers [l0, l1) of the context to the node at ep, pinned when pin. */
static inline void kt_ctx_put(const kt_ctx_t *x, const char *ep, uint32_t l0, uint32_t l1, bool pin)
{
    kvedge_client_t *c = kt_client(ep, 10000);
    kvedge_put_item_t items[KT_CTX_HEADS];
    for (uint32_t l = l0; l < l1; l++)
        for (uint32_t ci = 0; ci < x->chunks; ci++) {
            for (uint32_t h = 0; h < KT_CTX_HEADS; h++) {
                memset(&items[h], 0, sizeof items[h]);
                items[h].chunk.id = x->ids[ci];
                items[h].chunk.has_parent = ci > 0;
                if (ci > 0)
                    items[h].chunk.parent = x->ids[ci - 1];
                snprintf(items[h].chunk.model_id, sizeof items[h].chunk.model_id, KT_CTX_MODEL);
                items[h].chunk.index = ci;
                items[h].chunk.tokens = KT_CTX_TOKENS;
                items[h].layer = (uint16_t)l;
                items[h].head = (uint16_t)h;
                items[h].block = x->block[l][ci][h];
                items[h].len = x->len[l][ci][h];
                items[h].pin = pin;
            }
            assert_int_equal(kvedge_client_put(c, items, KT_CTX_HEADS, NULL), 0);
        }
    kvedge_client_destroy(&c);
}

/* Puts layers [0, layers) of the one-chunk context id of KT_CTX_MODEL (KT_CTX_TOKENS tokens,
 * every head, no parent) with c, encoded in scheme: head h of layer l synthesized from seed +
 * l * 100 + h. */
static inline void kt_put_chunk(kvedge_client_t *c, const kvedge_chunk_id_t *id, uint32_t layers,
                                kvedge_scheme_t scheme, uint64_t seed)
{
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, scheme, KT_CTX_TOKENS, KT_CTX_DIM, 0, NULL, false};
    size_t cap = kvedge_block_encoded_bound(&spec);
    uint8_t *blocks = malloc(cap * KT_CTX_HEADS);
    assert_non_null(blocks);
    static uint16_t k[KT_CTX_TOKENS * KT_CTX_DIM], v[KT_CTX_TOKENS * KT_CTX_DIM];
    kvedge_put_item_t items[KT_CTX_HEADS];
    for (uint32_t l = 0; l < layers; l++) {
        for (uint32_t h = 0; h < KT_CTX_HEADS; h++) {
            assert_int_equal(kvedge_synth_head(seed + l * 100 + h, 0, KT_CTX_TOKENS, KT_CTX_DIM,
                                               KVEDGE_DTYPE_FP16, k, v),
                             0);
            memset(&items[h], 0, sizeof items[h]);
            assert_int_equal(kvedge_block_encode(&spec, k, v, blocks + h * cap, cap, &items[h].len),
                             0);
            items[h].chunk.id = *id;
            snprintf(items[h].chunk.model_id, sizeof items[h].chunk.model_id, KT_CTX_MODEL);
            items[h].chunk.tokens = KT_CTX_TOKENS;
            items[h].layer = (uint16_t)l;
            items[h].head = (uint16_t)h;
            items[h].block = blocks + h * cap;
        }
        assert_int_equal(kvedge_client_put(c, items, KT_CTX_HEADS, NULL), 0);
    }
    free(blocks);
}

/* Whether a fetched block (layer, chunk ci, head) came with status 0 and is the context's. */
static inline bool kt_ctx_block_ok(const kt_ctx_t *x, uint16_t layer, uint32_t ci, uint16_t head,
                                   int status, const uint8_t *data, size_t len)
{
    return status == 0 && layer < KT_CTX_LAYERS && ci < x->chunks && head < KT_CTX_HEADS &&
           len == x->len[layer][ci][head] && memcmp(data, x->block[layer][ci][head], len) == 0;
}

/* What an asynchronous fetch comes to: its end (kt_fetch_done, the request's done callback;
 * kt_fetch_wait waits for it), its blocks checked against a context (kt_fetch_block) and its
 * layers counted (kt_fetch_layer). A test that gathers more makes it the first member of its
 * own result. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    const kt_ctx_t *ctx; /* what kt_fetch_block checks the blocks against */
    uint32_t mismatches; /* blocks that came with an error or differ from ctx's */
    uint32_t layers;     /* layers reported (kt_fetch_layer) */
    uint32_t fetched;    /* of them, delivered by a source */
} kt_fetch_t;

static inline void kt_fetch_layer(void *ctx, const kvedge_fetch_layer_t *l)
{
    kt_fetch_t *e = ctx;
    e->layers++;
    if (l->status == 0 && l->source >= 0)
        e->fetched++;
}

static inline void kt_fetch_block(void *ctx, uint16_t layer, uint32_t ci, uint16_t head, int source,
                                  int status, const uint8_t *data, size_t len)
{
    (void)source;
    kt_fetch_t *e = ctx;
    if (!kt_ctx_block_ok(e->ctx, layer, ci, head, status, data, len))
        e->mismatches++;
}

static inline void kt_fetch_done(void *ctx, int status)
{
    kt_fetch_t *e = ctx;
    pthread_mutex_lock(&e->mu);
    e->done = true;
    e->status = status;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* Sends req on c with the callbacks cbs (their ctx: a result whose first member is a
 * kt_fetch_t, cbs->done kt_fetch_done) and returns when the fetch has ended. */
static inline void kt_fetch_wait(kvedge_client_t *c, const kvedge_fetch_req_t *req,
                                 const kvedge_fetch_cbs_t *cbs, void *ctx)
{
    kt_fetch_t *e = ctx;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->done = false;
    e->status = 0;
    assert_int_equal(kvedge_client_fetch_async(c, req, cbs, ctx), 0);
    pthread_mutex_lock(&e->mu);
    while (!e->done)
        pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
}

#endif
