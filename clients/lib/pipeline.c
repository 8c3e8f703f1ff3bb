/* The pipelined loader (clients/lib/pipeline.h): a ring of pinned slots filled by the client's
 * I/O thread, drained by one loader thread that copies, dequantizes and marks layers ready.
 *
 * Locking: one mutex and one condition variable (monotonic clock) guard every layer's state,
 * the slots' ownership and the counters. The bytes of a slot (and the frames it holds for
 * zero-copy bodies) are written without the lock by the I/O thread while its layer is S_RECV
 * (only that thread writes it then), and read without the lock by the loader once the layer
 * is S_READY (the hand-over happens under the lock); the frames are freed under the lock when
 * the slot is released (s_slot_free), or by destroy once no callback is inside. Callbacks announce
 * themselves in in_cb, so destroy can free the ring once none is inside; the struct itself lives
 * until the last stream that points at it has ended (refs). A large–small pipeline's layers go
 * through its adapt stage (pipeline_adapt.c) on the loader thread. */
#include "clients/lib/pipeline.h"
#include "clients/lib/pipeline_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "access/client_credit.h"
#include "access/client_internal.h"
#include "access/codec/basis.h"
#include "access/frame.h" /* wire sizes for the slots */
#include "gpu/stage.h"
#include "access/codec/clock.h"

/* wait() gives up this long after the deadline: the streams end by the deadline on the I/O
 * thread's timer, this only guards against a loader that never comes back. */
#define S_WAIT_MARGIN_MS 250

/* Zero-copy staging (CPU path): a block stored uncompressed whose body is at least this long
 * and 4-byte aligned in its frame is dequantized from the received frame itself (taken from
 * the client with kvedge_client_block_take) instead of being copied into the slot. Smaller
 * bodies are copied: cheap, and a small frame may sit in ZeroMQ's shared receive buffer (8 KiB
 * by default), which holding it would keep alive. */
#define S_ZC_MIN_BYTES 4096

/* kvedge_fetch_source_t kinds (proxy/plan.h kvedge_plan_kind_t) a store-node source maps to. */
#define S_KIND_LOCAL 0
#define S_KIND_CLOUD 2

typedef enum {
    S_IDLE = 0, /* nothing received, no slot */
    S_RECV,     /* owns a slot; blocks coming in */
    S_READY,    /* complete in its slot, waiting for the loader */
    S_ISSUED,   /* copy + dequantize queued on the device */
    S_DONE,     /* resident, missed or failed: status says which */
} s_state_t;

typedef struct {
    kvedge_pipeline_t *p; /* back pointer: a GET_LAYER stream's callback context is its layer */
    uint32_t idx;         /* index in the request, 0 ... layers - 1 */
    s_state_t state;
    int status; /* final once S_DONE; before that the first error, 0 if none */
    bool miss;  /* a head came back missing or corrupt */
    int slot;   /* -1 when it holds none */
    uint32_t blocks;
    uint32_t order; /* rank among resident layers */
    int64_t arrived_us, resident_us;
    uint64_t wire_bytes, raw_bytes;
    kvedge_kv_dst_t k, v;   /* copies; page tables point at owned copies */
    kvedge_gpu_event_t *ev; /* device path: recorded after the layer's kernel */
    bool recorded;          /* FETCH: its LAYER record came; the three below are set */
    char source[64];        /* the record's source name, "" when none */
    int kind;               /* that source's kind in the plan, -1 when none */
    int reason;             /* the record's kvedge_fetch_reason_t */
    int from;               /* FETCH: the mapped model's layer delivered for it, -1: its own */
    bool adapt_failed;      /* delivered as the mapped model's, but its adaptation failed */
} s_layer_t;

/* FETCH: a message that came while its layer's slot was still taken, or behind one that did
 * (kept in arrival order). A block keeps its received frame (or a copy) and holds its credit,
 * so the proxy sends no more than the credit window meanwhile; the loader stages it once the
 * slot is free and gives the credit back. */
typedef enum { S_PARK_BLOCK, S_PARK_LAYER, S_PARK_DONE } s_park_kind_t;

typedef struct s_park_t s_park_t;
struct s_park_t {
    s_park_t *next;
    s_park_kind_t kind;
    uint32_t idx; /* BLOCK, LAYER: the layer's index in the request */
    uint32_t ci;  /* BLOCK */
    uint16_t head;
    int status;          /* BLOCK: the head's status; DONE: the stream's */
    const uint8_t *data; /* BLOCK: the block, in frame or copy (NULL: none came) */
    size_t len;
    void *frame;               /* its received frame (kvedge_client_block_take), or NULL */
    uint8_t *copy;             /* or a copy of it */
    bool held;                 /* its credit is held (kvedge_client_credit_hold) */
    kvedge_fetch_layer_t info; /* LAYER: the record, its source name copied */
    char source_name[64];
};

typedef struct {
    uint8_t *host;                /* pinned, slot_bytes (from the ring pool) */
    size_t host_bytes;            /* its real size: a pooled buffer can be larger */
    void *dev;                    /* device staging, slot_bytes (device path) */
    size_t used;                  /* bytes of bodies staged */
    kvedge_dequant_block_t *desc; /* one per (chunk, head), index chunk * stride + head */
    uint8_t *have;                /* the same, 1 once staged */
    void **held;                  /* the same: a frame the body is read from in place, or NULL
                                   * (copied into host); freed when the slot is released */
    kvedge_gpu_event_t *copied;   /* device path: after the slot's host-to-device copy */
    int layer;                    /* the layer using it, -1 when free */
} s_slot_t;

struct kvedge_pipeline_t {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* any state change: waiters, the loader, a FETCH receiver */
    int refs;          /* the caller's handle + each stream in flight */
    bool abandoned;    /* destroy has begun: callbacks drop, the loader stops */
    int in_cb;         /* callbacks staging into the ring right now */
    kvedge_client_t *client;
    char model_id[KVEDGE_MODEL_ID_MAX_BYTES + 1];
    kvedge_prec_t accept[KVEDGE_PREC_MAX_ACCEPT]; /* precisions accepted (GET_LAYER path) */
    size_t n_accept;
    uint32_t heads, head_dim;
    kvedge_chunk_id_t *chunks; /* owned copy */
    uint32_t n_chunks, chunk_tokens, tokens, token_offset;
    uint16_t first_layer;
    uint32_t layers;
    uint32_t n_blocks; /* per layer: n_chunks * heads */
    /* A slot's descriptors are indexed chunk * stride + head for either model's shape. */
    uint32_t stride;                 /* max(heads, the mapped model's heads); heads when none */
    uint32_t n_cap;                  /* descriptors per slot: n_chunks * stride */
    kvedge_pipeline__adapt_t *adapt; /* large–small stage (pipeline_adapt.c); NULL: none */
    bool device, via_proxy;
    s_layer_t *layer; /* layers entries; freed with the struct */
    s_slot_t *slot;
    uint32_t nslots;
    size_t slot_bytes;
    int32_t *tables; /* every copied page table, one allocation */
    kvedge_gpu_stream_t copy_stream, compute_stream;
    int64_t t0_us, deadline_ms; /* open time; absolute deadline (monotonic ms) */
    uint32_t next_open;         /* GET_LAYER: next layer to open a stream for */
    uint32_t open_streams;
    uint32_t next_issue;    /* the loader issues layers in order */
    uint32_t next_complete; /* device path: the oldest layer that may still be S_ISSUED */
    uint32_t resident, misses, failed, done;
    uint64_t wire_bytes, raw_bytes;
    uint32_t zc_blocks;             /* blocks staged in place from their frame */
    uint64_t zc_bytes;              /* their body bytes */
    uint64_t sent_bytes, msg_bytes; /* encoded request and stream message bytes */
    kvedge_fetch_plan_t *plan;      /* FETCH: the proxy's plan once have_plan; freed last */
    bool have_plan;
    bool stream_over;           /* FETCH: on_done has run */
    s_park_t *park, *park_tail; /* FETCH: messages waiting for a slot, oldest first */
    bool unparking;             /* the loader stages a parked block outside the lock */
    int64_t park_us;            /* when the park last became non-empty */
    uint64_t stream_id;         /* FETCH: the stream parked blocks hold credit of */
    uint32_t credit_held;       /* credit of parked blocks not staged yet */
    uint32_t credit_due;        /* credit of parked blocks staged, not given back yet */
    char node_name[64];         /* GET_LAYER: the node's HELLO name */
    int node_kind;              /* GET_LAYER: its kind (cloud or local) */
    int64_t ring_wait_us, copy_us, dequant_us, done_us;
    pthread_t loader;
    bool loader_started;
};

/* ---------------------------------------------------------------- helpers */

/* Waits on p->cv until abs_ms (monotonic); returns ETIMEDOUT once it has passed. */
static int s_wait_until(kvedge_pipeline_t *p, int64_t abs_ms)
{
    struct timespec ts = {(time_t)(abs_ms / 1000), (long)(abs_ms % 1000) * 1000000};
    return pthread_cond_timedwait(&p->cv, &p->mu, &ts);
}

static size_t s_align(size_t n)
{
    return (n + KVEDGE_PIPELINE_ALIGN_BYTES - 1) & ~(size_t)(KVEDGE_PIPELINE_ALIGN_BYTES - 1);
}

/* Tokens of chunk ci: chunk_tokens, except a short last chunk. */
static uint32_t s_chunk_tokens(const kvedge_pipeline_t *p, uint32_t ci)
{
    uint32_t start = ci * p->chunk_tokens;
    uint32_t left = p->tokens - start;
    return left < p->chunk_tokens ? left : p->chunk_tokens;
}

/* A decompressed body bound that covers fp16/bf16 lossless (4 bytes per element pair) and
 * int8/int4 with groups of 4 or more (codes plus at most as many param bytes again). */
static size_t s_body_bound(uint32_t tokens, uint32_t head_dim)
{
    return s_align(4 * (size_t)tokens * head_dim + 4 * (size_t)head_dim + 4 * (size_t)tokens);
}

/* The checks kvedge_dequant_check will make of a destination, made up front for the whole
 * range of positions the context covers, so a bad destination fails open, not a layer. */
static int s_check_dst(const kvedge_kv_dst_t *d, const kvedge_model_t *m, uint64_t end)
{
    if (!d->base || kvedge_dtype_size(d->dtype) == 0 || d->heads != m->kv_heads ||
        d->head_dim != m->head_dim)
        return KVEDGE_EINVAL;
    if (d->layout == KVEDGE_KV_CONTIG) {
        if (end > d->tokens_cap)
            return KVEDGE_ENOSPACE;
    } else if (d->layout == KVEDGE_KV_PAGED) {
        if (d->page_size == 0 || d->num_pages == 0 || !d->page_table)
            return KVEDGE_EINVAL;
        for (uint32_t i = 0; i < d->table_len; i++)
            if (d->page_table[i] < 0 || (uint32_t)d->page_table[i] >= d->num_pages)
                return KVEDGE_EINVAL;
        if (end > (uint64_t)d->table_len * d->page_size)
            return KVEDGE_ENOSPACE;
    } else {
        return KVEDGE_EINVAL;
    }
    return d->cap_bytes < kvedge_dequant_dst_bytes(d) ? KVEDGE_ENOSPACE : KVEDGE_OK;
}

/* ---------------------------------------------------------------- layer state (locked) */

/* Frees the frames slot s holds (zero-copy bodies): once its layer is dequantized, missed or
 * failed, or the pipeline is destroyed. */
static void s_slot_unhold(const kvedge_pipeline_t *p, s_slot_t *s)
{
    for (uint32_t j = 0; s->held && j < p->n_cap; j++)
        if (s->held[j]) {
            kvedge_client_block_free(s->held[j]);
            s->held[j] = NULL;
        }
}

static void s_slot_free(kvedge_pipeline_t *p, s_layer_t *l)
{
    if (l->slot >= 0) {
        s_slot_unhold(p, &p->slot[l->slot]);
        p->slot[l->slot].layer = -1;
        l->slot = -1;
    }
}

static void s_slot_take(kvedge_pipeline_t *p, s_layer_t *l, uint32_t si)
{
    s_slot_t *s = &p->slot[si];
    s->layer = (int)l->idx;
    s->used = 0;
    memset(s->have, 0, p->n_cap);
    l->slot = (int)si;
    l->state = S_RECV;
}

static void s_done(kvedge_pipeline_t *p, s_layer_t *l, int status)
{
    s_slot_free(p, l);
    l->state = S_DONE;
    l->status = status;
    l->resident_us = kvedge_mono_us() - p->t0_us;
    if (status == KVEDGE_OK)
        l->order = p->resident++;
    else if (status == KVEDGE_ENOTFOUND)
        p->misses++;
    else
        p->failed++;
    if (++p->done == p->layers)
        p->done_us = l->resident_us;
    pthread_cond_broadcast(&p->cv);
}

/* Every block of l has come, all staged (status 0, no miss): as many as its shape has
 * (the mapped model's when it was delivered as that), and with a mapped model, each
 * (chunk, head) of that shape present with its head size. Locked. */
static bool s_layer_shape_ok(const kvedge_pipeline_t *p, const s_layer_t *l)
{
    uint32_t heads = l->from >= 0 ? p->adapt->heads : p->heads;
    uint32_t head_dim = l->from >= 0 ? p->adapt->head_dim : p->head_dim;
    if (l->blocks != p->n_chunks * heads)
        return false;
    if (!p->adapt)
        return true; /* s_stage checked the head size and refused doubles */
    const s_slot_t *s = &p->slot[l->slot];
    for (uint32_t ci = 0; ci < p->n_chunks; ci++)
        for (uint32_t h = 0; h < heads; h++) {
            uint32_t j = ci * p->stride + h;
            if (!s->have[j] || s->desc[j].head_dim != head_dim)
                return false;
        }
    return true;
}

/* Every block of l has come (or its stream ended): hand it to the loader, or finish it. */
static void s_received(kvedge_pipeline_t *p, s_layer_t *l)
{
    l->arrived_us = kvedge_mono_us() - p->t0_us;
    if (l->status == KVEDGE_OK && l->miss)
        l->status = KVEDGE_ENOTFOUND;
    if (l->status == KVEDGE_OK && !s_layer_shape_ok(p, l))
        l->status = KVEDGE_ESHAPE; /* the node streamed another head count */
    if (l->status != KVEDGE_OK) {
        s_done(p, l, l->status);
        return;
    }
    l->state = S_READY;
    pthread_cond_broadcast(&p->cv);
}

/* Drops one reference; the last one frees what destroy left (the layer array and the struct,
 * which stream callbacks point into). Called with the lock held; releases it. */
static void s_release(kvedge_pipeline_t *p)
{
    bool last = --p->refs == 0;
    pthread_mutex_unlock(&p->mu);
    if (!last)
        return;
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->plan);
    free(p->layer);
    free(p->chunks);
    free(p);
}

/* ---------------------------------------------------------------- receive (I/O thread) */

/* A transform-coded block (version 3) has no body the dequantize step reads: it is decoded
 * here, on the host, into the slot as the K-then-V body of a lossless block of its dtype, and
 * goes on as that block would (both paths: the device path copies the slot as it copies any
 * staged body). The basis is this process's (kvedge_basis_load_dir); without it the head is
 * a miss, as any block that cannot be read. Same contract as s_stage. */
static int s_stage_tc(kvedge_pipeline_t *p, s_slot_t *s, const kvedge_block_info_t *tc, uint32_t j,
                      uint16_t head, uint32_t ci, size_t pos, uint64_t *raw_bytes, bool *zero_copy)
{
    kvedge_block_info_t info = *tc; /* the lossless block the decoded values make */
    info.scheme = KVEDGE_SCHEME_LOSSLESS;
    info.group_size = 0;
    info.key_channels = info.head_dim;
    info.key_mask = NULL;
    info.lz4 = false;
    info.ec = false;
    size_t half = (size_t)info.tokens * info.head_dim * kvedge_dtype_size(info.dtype);
    if (half == 0 || 2 * half > UINT32_MAX)
        return KVEDGE_ESHAPE;
    info.raw_len = (uint32_t)(2 * half);
    info.stored_len = info.raw_len;
    if (pos > p->slot_bytes || info.raw_len > p->slot_bytes - pos)
        return KVEDGE_ENOSPACE;
    uint8_t *body = s->host + pos;
    if (kvedge_block_decode(tc, info.dtype, body, body + half) != KVEDGE_OK)
        return KVEDGE_ENOTFOUND; /* no basis here, or a section that does not decode */
    info.body = body;
    uint32_t offset = p->token_offset + ci * p->chunk_tokens;
    if (kvedge_dequant_block_init(&info, body, head, offset, &s->desc[j]) != KVEDGE_OK)
        return KVEDGE_ESHAPE;
    *zero_copy = false;
    s->have[j] = 1;
    s->used = pos + info.raw_len;
    *raw_bytes = info.raw_len;
    return KVEDGE_OK;
}

/* Verifies one block and writes its decompressed body into l's slot, with its descriptor.
 * On the CPU path a body stored uncompressed, aligned and not small is not copied: its frame
 * is taken from the client (kvedge_client_block_take; only ever after kvedge_block_parse has
 * verified the whole block) and the descriptor points into it; the slot still reserves the
 * body's room, so what fits a slot does not depend on it. Runs without the lock (the I/O
 * thread alone writes a S_RECV slot), inside the client's on_block callback; or by the loader
 * for a parked block, whose frame (*frame, when not NULL) the slot may keep. Returns 0,
 * KVEDGE_ENOTFOUND for a block that fails verification (treated as a miss, never used), or
 * the layer's error. */
static int s_stage(kvedge_pipeline_t *p, s_slot_t *s, uint32_t ci, uint16_t head,
                   const uint8_t *data, size_t len, void **frame, uint64_t *raw_bytes,
                   bool *zero_copy)
{
    if (ci >= p->n_chunks || head >= p->stride)
        return KVEDGE_ESHAPE;
    uint32_t j = ci * p->stride + head;
    if (s->have[j])
        return KVEDGE_EPROTO;
    kvedge_block_info_t info;
    if (!data || kvedge_block_parse(data, len, &info) != KVEDGE_OK)
        return KVEDGE_ENOTFOUND;
    /* With a mapped model the layer's record (after its blocks) says which shape it has:
     * either head size is staged, s_layer_shape_ok checks the whole layer then. */
    if (info.tokens != s_chunk_tokens(p, ci) ||
        (info.head_dim != p->head_dim && !(p->adapt && info.head_dim == p->adapt->head_dim)))
        return KVEDGE_ESHAPE;
    size_t pos = s_align(s->used);
    if (info.scheme == KVEDGE_SCHEME_TC)
        return s_stage_tc(p, s, &info, j, head, ci, pos, raw_bytes, zero_copy);
    if (pos > p->slot_bytes || info.raw_len > p->slot_bytes - pos)
        return KVEDGE_ENOSPACE;
    const uint8_t *raw = NULL;
    if (kvedge_block_body(&info, s->host + pos, p->slot_bytes - pos, &raw) != KVEDGE_OK)
        return KVEDGE_ENOTFOUND;
    const uint8_t *body = s->host + pos;
    if (raw != body) { /* stored uncompressed: raw points into the (verified) frame */
        if (!p->device && info.raw_len >= S_ZC_MIN_BYTES && ((uintptr_t)raw & 3u) == 0) {
            s->held[j] = frame && *frame ? *frame : kvedge_client_block_take();
            if (frame && s->held[j] == *frame)
                *frame = NULL; /* a parked block's frame: the slot holds it now */
        }
        if (s->held[j])
            body = raw; /* read in place: the frame is ours until the slot is released */
        else
            memcpy(s->host + pos, raw, info.raw_len);
    }
    uint32_t offset = p->token_offset + ci * p->chunk_tokens;
    if (kvedge_dequant_block_init(&info, body, head, offset, &s->desc[j]) != KVEDGE_OK) {
        kvedge_client_block_free(s->held[j]);
        s->held[j] = NULL;
        return KVEDGE_ESHAPE;
    }
    *zero_copy = s->held[j] != NULL;
    s->have[j] = 1;
    s->used = pos + info.raw_len;
    *raw_bytes = info.raw_len;
    return KVEDGE_OK;
}

/* Stages a block of l outside the lock when l still wants blocks; accounts for it under it.
 * frame: a parked block's received frame, or NULL. Called with the lock held; returns with it
 * held. */
static void s_block_locked(kvedge_pipeline_t *p, s_layer_t *l, uint32_t ci, uint16_t head,
                           int status, const uint8_t *data, size_t len, void **frame)
{
    l->blocks++;
    l->wire_bytes += len;
    p->wire_bytes += len;
    if (status != KVEDGE_OK) {
        l->miss = true; /* the source reported the head missing or corrupt */
        return;
    }
    if (l->state != S_RECV || l->status != KVEDGE_OK || l->miss)
        return; /* the layer is lost already: drop the rest of it */
    p->in_cb++;
    pthread_mutex_unlock(&p->mu);
    uint64_t raw = 0;
    bool zc = false;
    int rc = s_stage(p, &p->slot[l->slot], ci, head, data, len, frame, &raw, &zc);
    pthread_mutex_lock(&p->mu);
    p->in_cb--;
    if (zc) {
        p->zc_blocks++;
        p->zc_bytes += raw;
    }
    if (rc == KVEDGE_ENOTFOUND)
        l->miss = true;
    else if (rc != KVEDGE_OK)
        l->status = rc;
    l->raw_bytes += raw;
    p->raw_bytes += raw;
    if (p->abandoned && p->in_cb == 0)
        pthread_cond_broadcast(&p->cv);
}

static void s_gl_block(void *ctx, uint32_t ci, uint16_t head, int status, const uint8_t *data,
                       size_t len)
{
    s_layer_t *l = ctx;
    kvedge_pipeline_t *p = l->p;
    pthread_mutex_lock(&p->mu);
    p->msg_bytes += KVEDGE_WIRE_HEADER_BYTES + KVEDGE_WIRE_STREAM_HDR_BYTES + len;
    if (!p->abandoned)
        s_block_locked(p, l, ci, head, status, data, len, NULL);
    pthread_mutex_unlock(&p->mu);
}

static void s_gl_done(void *ctx, int status, uint32_t heads)
{
    (void)heads; /* counted block by block */
    s_layer_t *l = ctx;
    kvedge_pipeline_t *p = l->p;
    pthread_mutex_lock(&p->mu);
    p->open_streams--;
    if (status == KVEDGE_OK || status == KVEDGE_ENOTFOUND)
        p->msg_bytes += KVEDGE_WIRE_HEADER_BYTES; /* the node's end message */
    if (!p->abandoned) {
        if (status == KVEDGE_ENOTFOUND)
            l->miss = true; /* the node knows none of the chunks */
        else if (status != KVEDGE_OK && l->status == KVEDGE_OK)
            l->status = status;
        s_received(p, l);
    }
    pthread_cond_broadcast(&p->cv);
    s_release(p);
}

/* Appends e to the park (locked). */
static void s_park_add(kvedge_pipeline_t *p, s_park_t *e)
{
    if (!p->park)
        p->park_us = kvedge_mono_us();
    if (p->park_tail)
        p->park_tail->next = e;
    else
        p->park = e;
    p->park_tail = e;
    pthread_cond_broadcast(&p->cv);
}

static void s_park_free(s_park_t *e)
{
    kvedge_client_block_free(e->frame);
    free(e->copy);
    free(e);
}

/* Parks a block of layer index i (locked, in its on_block callback): its frame taken from the
 * client (or copied), its credit held. Returns false when there is no memory for it. */
static bool s_park_block(kvedge_pipeline_t *p, uint32_t i, uint32_t ci, uint16_t head, int status,
                         const uint8_t *data, size_t len)
{
    s_park_t *e = calloc(1, sizeof *e);
    if (!e)
        return false;
    *e = (s_park_t){.kind = S_PARK_BLOCK, .idx = i, .ci = ci, .head = head, .status = status};
    if (data) {
        e->frame = kvedge_client_block_take();
        if (!e->frame && !(e->copy = malloc(len ? len : 1))) {
            free(e);
            return false;
        }
        if (e->copy)
            memcpy(e->copy, data, len);
        e->data = e->copy ? e->copy : data; /* the frame's data stays where it is */
        e->len = len;
    }
    uint64_t id = kvedge_client_credit_hold();
    if (id) {
        p->stream_id = id;
        e->held = true;
        p->credit_held++;
    }
    s_park_add(p, e);
    return true;
}

static void s_fx_block(void *ctx, uint16_t layer, uint32_t ci, uint16_t head, int source,
                       int status, const uint8_t *data, size_t len)
{
    (void)source;
    kvedge_pipeline_t *p = ctx;
    pthread_mutex_lock(&p->mu);
    p->msg_bytes += KVEDGE_WIRE_HEADER_BYTES + KVEDGE_WIRE_FETCH_BLOCK_BYTES + len;
    uint32_t i = (uint32_t)(layer - p->first_layer); /* the client checked the order */
    if (p->abandoned || i >= p->layers) {
        pthread_mutex_unlock(&p->mu);
        return;
    }
    s_layer_t *l = &p->layer[i];
    /* Its slot is free once layer i - nslots has left it. Until then this thread does not
     * wait: the block is parked with its credit held (so the proxy is held back by credit,
     * nothing dropped) and every later message parks behind it, in order. */
    bool wants_slot = l->state == S_IDLE && l->status == KVEDGE_OK;
    if (p->park || p->unparking || (wants_slot && p->slot[i % p->nslots].layer >= 0)) {
        if (!s_park_block(p, i, ci, head, status, data, len) && l->status == KVEDGE_OK)
            l->status = KVEDGE_ENOMEM; /* the layer fails; the stream goes on */
        pthread_mutex_unlock(&p->mu);
        return;
    }
    if (wants_slot)
        s_slot_take(p, l, i % p->nslots);
    s_block_locked(p, l, ci, head, status, data, len, NULL);
    pthread_mutex_unlock(&p->mu);
}

static void s_fx_plan(void *ctx, const kvedge_fetch_plan_t *plan)
{
    kvedge_pipeline_t *p = ctx;
    pthread_mutex_lock(&p->mu);
    p->msg_bytes += KVEDGE_WIRE_HEADER_BYTES + KVEDGE_WIRE_FETCH_PLAN_BYTES +
                    (uint64_t)plan->nsources * KVEDGE_WIRE_FETCH_SOURCE_BYTES +
                    (uint64_t)plan->layers * KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES;
    if (!p->abandoned && p->plan) {
        memcpy(p->plan, plan, sizeof *plan);
        p->have_plan = true;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
}

/* A layer's LAYER record (locked): who delivered it, and its end on the wire. */
static void s_layer_record(kvedge_pipeline_t *p, const kvedge_fetch_layer_t *info)
{
    uint32_t i = (uint32_t)(info->layer - p->first_layer);
    if (i >= p->layers)
        return;
    s_layer_t *l = &p->layer[i];
    l->recorded = true;
    snprintf(l->source, sizeof l->source, "%s", info->source_name ? info->source_name : "");
    l->kind = -1;
    if (p->have_plan && info->source >= 0 && (uint32_t)info->source < p->plan->nsources)
        l->kind = p->plan->source[info->source].kind;
    l->reason = info->reason;
    l->from = info->from_layer >= 0 ? info->from_layer : -1;
    if (l->state > S_RECV)
        return;
    if (l->from >= 0 && (!p->adapt || (uint32_t)l->from >= p->adapt->layers) &&
        l->status == KVEDGE_OK && info->status == KVEDGE_OK)
        l->status = KVEDGE_EPROTO; /* a layer of a model this fetch did not name */
    if (info->status == KVEDGE_ENOTFOUND)
        l->miss = true; /* nobody had it, or the plan says recompute */
    else if (info->status != KVEDGE_OK && l->status == KVEDGE_OK)
        l->status = info->status;
    s_received(p, l);
}

static void s_fx_layer(void *ctx, const kvedge_fetch_layer_t *info)
{
    kvedge_pipeline_t *p = ctx;
    pthread_mutex_lock(&p->mu);
    p->msg_bytes += KVEDGE_WIRE_HEADER_BYTES + KVEDGE_WIRE_FETCH_LAYER_BYTES;
    if (!p->abandoned && (p->park || p->unparking)) { /* after its parked blocks */
        s_park_t *e = calloc(1, sizeof *e);
        if (e) {
            e->kind = S_PARK_LAYER;
            e->info = *info;
            snprintf(e->source_name, sizeof e->source_name, "%s",
                     info->source_name ? info->source_name : "");
            e->info.source_name = e->source_name; /* the client's copy ends with the call */
            s_park_add(p, e);
            pthread_mutex_unlock(&p->mu);
            return;
        }
        /* No memory to keep it in order: the layer fails now, its parked blocks drop. */
        uint32_t i = (uint32_t)(info->layer - p->first_layer);
        if (i < p->layers && p->layer[i].status == KVEDGE_OK)
            p->layer[i].status = KVEDGE_ENOMEM;
    }
    if (!p->abandoned)
        s_layer_record(p, info);
    pthread_mutex_unlock(&p->mu);
}

/* The FETCH stream's end (locked): every layer without its record ends with why. */
static void s_stream_end(kvedge_pipeline_t *p, int status)
{
    for (uint32_t i = 0; i < p->layers; i++) {
        s_layer_t *l = &p->layer[i];
        if (l->state > S_RECV)
            continue;
        /* The stream ended before this layer's record: its status says why. */
        if (l->status == KVEDGE_OK)
            l->status = status != KVEDGE_OK ? status : KVEDGE_EPROTO;
        s_done(p, l, l->status);
    }
}

static void s_fx_done(void *ctx, int status)
{
    kvedge_pipeline_t *p = ctx;
    pthread_mutex_lock(&p->mu);
    p->stream_over = true;
    if (status == KVEDGE_OK)
        p->msg_bytes += KVEDGE_WIRE_HEADER_BYTES; /* the proxy's end message */
    s_park_t *e = NULL;
    if (!p->abandoned && (p->park || p->unparking) && (e = calloc(1, sizeof *e)) != NULL) {
        e->kind = S_PARK_DONE; /* after the parked messages */
        e->status = status;
        s_park_add(p, e);
    } else if (!p->abandoned) {
        s_stream_end(p, status);
    }
    pthread_cond_broadcast(&p->cv);
    s_release(p);
}

/* ---------------------------------------------------------------- loader thread */

/* GET_LAYER source: opens the next layer's stream when its slot is free and fewer than
 * KVEDGE_PIPELINE_STREAMS_MAX are open. Locked; may drop the lock. Returns true if it did
 * something. */
static bool s_open_next(kvedge_pipeline_t *p)
{
    if (p->via_proxy || p->next_open >= p->layers || p->open_streams >= KVEDGE_PIPELINE_STREAMS_MAX)
        return false;
    uint32_t i = p->next_open, si = i % p->nslots;
    if (p->slot[si].layer >= 0)
        return false;
    s_layer_t *l = &p->layer[i];
    p->next_open++;
    int64_t left = p->deadline_ms - kvedge_mono_us() / 1000;
    if (left <= 0) {
        s_done(p, l, KVEDGE_ETIMEDOUT);
        return true;
    }
    s_slot_take(p, l, si);
    p->open_streams++;
    p->refs++;
    uint64_t req_bytes =
        KVEDGE_WIRE_HEADER_BYTES + 4 + (uint64_t)p->n_chunks * KVEDGE_CHUNK_ID_BYTES + p->n_accept;
    p->sent_bytes += req_bytes;
    pthread_mutex_unlock(&p->mu);
    int rc = kvedge_client_get_layer_prec_async(
        p->client, p->chunks, p->n_chunks, (uint16_t)(p->first_layer + i),
        p->n_accept ? p->accept : NULL, p->n_accept, (int)left, s_gl_block, s_gl_done, l);
    pthread_mutex_lock(&p->mu);
    if (rc != KVEDGE_OK) {
        p->open_streams--;
        p->refs--; /* never below 1: the caller's reference is held while the loader runs */
        p->sent_bytes -= req_bytes;
        s_done(p, l, rc);
    }
    return true;
}

/* FETCH: stages the oldest parked message when it can go: a block once its layer's slot is
 * free (or its layer is lost already, or the deadline has passed: the layer then fails with
 * KVEDGE_ETIMEDOUT), a record, the stream's end. Locked; drops the lock while staging.
 * Returns true if it did something. */
static bool s_unpark(kvedge_pipeline_t *p)
{
    s_park_t *e = p->park;
    if (!e)
        return false;
    s_layer_t *l = e->kind == S_PARK_BLOCK ? &p->layer[e->idx] : NULL;
    if (l && l->state == S_IDLE && l->status == KVEDGE_OK) {
        uint32_t si = e->idx % p->nslots;
        if (p->slot[si].layer < 0)
            s_slot_take(p, l, si);
        else if (kvedge_mono_us() / 1000 >= p->deadline_ms)
            l->status = KVEDGE_ETIMEDOUT;
        else
            return false; /* the loader frees it: it comes back here then */
    }
    p->park = e->next;
    if (!p->park)
        p->park_tail = NULL;
    if (e->kind == S_PARK_BLOCK) {
        p->unparking = true; /* the I/O thread parks behind it meanwhile */
        s_block_locked(p, l, e->ci, e->head, e->status, e->data, e->len, &e->frame);
        p->unparking = false;
        if (e->held) {
            p->credit_held--;
            p->credit_due++;
        }
    } else if (e->kind == S_PARK_LAYER) {
        s_layer_record(p, &e->info);
    } else {
        s_stream_end(p, e->status);
    }
    s_park_free(e); /* unlocked would do; it is short */
    if (!p->park)
        p->ring_wait_us += kvedge_mono_us() - p->park_us;
    return true;
}

/* Gives the credit of staged parked blocks back to the stream (locked; drops the lock for the
 * call). Returns false when the client is too busy to take it now (try again shortly). */
static bool s_give_credit(kvedge_pipeline_t *p)
{
    if (p->credit_due == 0 || p->stream_id == 0)
        return true;
    uint32_t n = p->credit_due > KVEDGE_WIRE_MAX_CREDIT ? KVEDGE_WIRE_MAX_CREDIT : p->credit_due;
    p->credit_due -= n;
    pthread_mutex_unlock(&p->mu);
    int rc = kvedge_client_credit_return(p->client, p->stream_id, n);
    pthread_mutex_lock(&p->mu);
    if (rc == KVEDGE_EBACKLOG || rc == KVEDGE_ENOMEM) {
        p->credit_due += n;
        return false;
    }
    return true; /* given back; or the client is closing and the stream ends anyway */
}

/* A layer of a large–small pipeline (CPU path only) through the adapt stage, which writes
 * it or finds it a miss. Unlocked on entry; returns locked with the layer done. */
static void s_issue_adapt(kvedge_pipeline_t *p, s_layer_t *l, const s_slot_t *s)
{
    bool failed = false;
    int64_t t = kvedge_mono_us(), adapt = 0;
    int rc = kvedge_pipeline__adapt_layer(p->adapt, (uint16_t)(p->first_layer + l->idx), l->from,
                                          s->desc, &l->k, &l->v, &failed, &adapt);
    int64_t end = kvedge_mono_us();
    pthread_mutex_lock(&p->mu);
    p->dequant_us += end - t;
    p->adapt->adapt_us += adapt;
    if (failed) {
        l->adapt_failed = true;
        /* access/proto.h has no reason of its own for this yet; adapt_failed tells it apart */
        l->reason = KVEDGE_FETCH_MISS;
    } else if (rc == KVEDGE_OK && l->from >= 0) {
        p->adapt->adapted++;
    }
    s_done(p, l, rc);
}

/* Dequantizes a S_READY layer: on the device, copy then kernel then event (S_ISSUED); on the
 * CPU, in place from the slot (S_DONE). Locked; drops the lock for the work. */
static void s_issue(kvedge_pipeline_t *p, s_layer_t *l)
{
    s_slot_t *s = &p->slot[l->slot];
    l->state = S_ISSUED;
    pthread_mutex_unlock(&p->mu);
    if (p->adapt) {
        s_issue_adapt(p, l, s);
        return;
    }
    kvedge_dequant_args_t a = {s->desc, p->n_blocks, l->k, l->v};
    int rc;
    int64_t t = kvedge_mono_us(), copy = 0;
    if (p->device) {
        rc = kvedge_gpu_copy_h2d(s->dev, s->host, s->used, p->copy_stream);
        if (rc == KVEDGE_OK)
            rc = kvedge_gpu_event_record(s->copied, p->copy_stream);
        if (rc == KVEDGE_OK)
            rc = kvedge_gpu_stream_wait_event(p->compute_stream, s->copied);
        copy = kvedge_mono_us() - t;
        /* The kernel reads the device copy of the slot: same offsets, other base. */
        for (uint32_t j = 0; j < p->n_blocks; j++)
            s->desc[j].body =
                (const uint8_t *)s->dev + ((const uint8_t *)s->desc[j].body - s->host);
        if (rc == KVEDGE_OK)
            rc = kvedge_gpu_dequant(&a, p->compute_stream);
        if (rc == KVEDGE_OK)
            rc = kvedge_gpu_event_record(l->ev, p->compute_stream);
        if (rc != KVEDGE_OK) { /* the slot may be reused only once nothing reads it */
            (void)kvedge_gpu_stream_sync(p->copy_stream);
            (void)kvedge_gpu_stream_sync(p->compute_stream);
        }
    } else {
        rc = kvedge_cpu_dequant(&a);
    }
    int64_t end = kvedge_mono_us();
    pthread_mutex_lock(&p->mu);
    p->copy_us += copy;
    p->dequant_us += end - t - copy;
    if (!p->device || rc != KVEDGE_OK)
        s_done(p, l, rc);
}

/* Device path: waits for the oldest issued layer's event, then it is resident. Locked; drops
 * the lock while waiting. */
static void s_complete(kvedge_pipeline_t *p, s_layer_t *l)
{
    pthread_mutex_unlock(&p->mu);
    int rc = kvedge_gpu_event_sync(l->ev);
    pthread_mutex_lock(&p->mu);
    s_done(p, l, rc);
}

static void *s_loader(void *arg)
{
    kvedge_pipeline_t *p = arg;
    pthread_mutex_lock(&p->mu);
    bool credit_ok = true;
    while (!p->abandoned && p->done < p->layers) {
        if (s_open_next(p))
            continue;
        if (s_unpark(p))
            continue;
        if (p->credit_due && (credit_ok = s_give_credit(p)))
            continue;
        if (p->next_issue < p->layers) {
            s_layer_t *l = &p->layer[p->next_issue];
            if (l->state == S_DONE) { /* missed or failed before the loader saw it */
                p->next_issue++;
                continue;
            }
            if (l->state == S_READY) {
                p->next_issue++;
                s_issue(p, l);
                continue;
            }
        }
        while (p->next_complete < p->next_issue && p->layer[p->next_complete].state == S_DONE)
            p->next_complete++;
        if (p->next_complete < p->next_issue) {
            s_complete(p, &p->layer[p->next_complete]);
            continue;
        }
        if (kvedge_mono_us() / 1000 >= p->deadline_ms) {
            /* Layers no stream was opened for fail now; open ones end on the I/O thread. */
            for (uint32_t i = p->next_open; !p->via_proxy && i < p->layers; i++)
                s_done(p, &p->layer[i], KVEDGE_ETIMEDOUT);
            if (!p->via_proxy)
                p->next_open = p->layers;
            pthread_cond_wait(&p->cv, &p->mu);
        } else if (!credit_ok) {
            s_wait_until(p, kvedge_mono_us() / 1000 + 1); /* the client was busy: again soon */
            credit_ok = true;
        } else {
            s_wait_until(p, p->deadline_ms);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---------------------------------------------------------------- public */

static void s_free_ring(kvedge_pipeline_t *p)
{
    kvedge_gpu_stream_destroy(&p->copy_stream);
    kvedge_gpu_stream_destroy(&p->compute_stream);
    for (uint32_t i = 0; p->slot && i < p->nslots; i++) {
        s_slot_t *s = &p->slot[i];
        kvedge_gpu_event_destroy(&s->copied);
        kvedge_gpu_dev_free(s->dev);
        s_slot_unhold(p, s); /* a layer still in the slot when destroyed */
        kvedge_pipeline__pool_give(s->host, s->host_bytes);
        s->host = NULL;
        free(s->held);
        free(s->desc);
        free(s->have);
    }
    free(p->slot);
    p->slot = NULL;
    kvedge_pipeline__adapt_destroy(&p->adapt);
    for (uint32_t i = 0; p->layer && i < p->layers; i++)
        kvedge_gpu_event_destroy(&p->layer[i].ev);
    free(p->tables);
    p->tables = NULL;
}

static int s_check_opts(const kvedge_pipeline_opts_t *o)
{
    const kvedge_model_t *m = o->model;
    if (!o->client || !m || !o->chunks || o->n_chunks == 0 || o->chunk_tokens == 0 ||
        o->tokens == 0 || o->layers == 0 || !o->k || !o->v || o->deadline_ms < 0 ||
        (!o->compute_us) != (!o->recompute_us) || o->ring_slots > o->layers ||
        (!o->accept && (o->n_accept || o->quality_metric != KVEDGE_QUALITY_NONE)) ||
        (o->accept && kvedge_prec_list_check(o->accept, o->n_accept) != KVEDGE_OK) ||
        kvedge_quality_budget_check(o->quality_metric, o->quality_budget) != KVEDGE_OK ||
        o->n_chunks > KVEDGE_WIRE_MAX_CHUNKS || o->layers > KVEDGE_FETCH_MAX_LAYERS ||
        o->n_chunks * (uint64_t)(m ? m->kv_heads : 0) > KVEDGE_DEQUANT_MAX_BLOCKS)
        return KVEDGE_EINVAL;
    if (kvedge_model_check(m) != KVEDGE_OK || (uint32_t)o->first_layer + o->layers > m->layers)
        return KVEDGE_EINVAL;
    /* Every chunk full but the last, which holds at least one token. */
    uint64_t full = (uint64_t)(o->n_chunks - 1) * o->chunk_tokens;
    if (o->tokens <= full || o->tokens > full + o->chunk_tokens)
        return KVEDGE_EINVAL;
    if (o->chunk_tokens > KVEDGE_BLOCK_MAX_TOKENS)
        return KVEDGE_EINVAL;
    const kvedge_model_t *mm = o->mapped_model;
    if (!mm && (o->mapped_chunks || o->adapt))
        return KVEDGE_EINVAL;
    if (mm && (!o->mapped_chunks || !o->adapt || o->on_device || kvedge_model_check(mm) != 0 ||
               strcmp(mm->id, m->id) == 0 ||
               o->n_chunks * (uint64_t)mm->kv_heads > KVEDGE_DEQUANT_MAX_BLOCKS))
        return KVEDGE_EINVAL;
    for (uint32_t i = 0; mm && i < o->layers; i++)
        if (o->k[i].layout != KVEDGE_KV_CONTIG || o->k[i].dtype != KVEDGE_DTYPE_FP32 ||
            o->v[i].layout != KVEDGE_KV_CONTIG || o->v[i].dtype != KVEDGE_DTYPE_FP32)
            return KVEDGE_EINVAL; /* the adapted layer is written as fp32 rows */
    uint64_t end = (uint64_t)o->token_offset + o->tokens;
    int first_enospace = KVEDGE_OK;
    for (uint32_t i = 0; i < o->layers; i++) {
        int rk = s_check_dst(&o->k[i], m, end), rv = s_check_dst(&o->v[i], m, end);
        if (rk == KVEDGE_EINVAL || rv == KVEDGE_EINVAL)
            return KVEDGE_EINVAL;
        if (first_enospace == KVEDGE_OK)
            first_enospace = rk != KVEDGE_OK ? rk : rv;
    }
    return first_enospace;
}

/* Copies the destinations, their page tables into one owned allocation. */
static int s_copy_dsts(kvedge_pipeline_t *p, const kvedge_pipeline_opts_t *o)
{
    size_t n = 0;
    for (uint32_t i = 0; i < o->layers; i++)
        n += (o->k[i].layout == KVEDGE_KV_PAGED ? o->k[i].table_len : 0) +
             (o->v[i].layout == KVEDGE_KV_PAGED ? o->v[i].table_len : 0);
    p->tables = n ? malloc(n * sizeof *p->tables) : NULL;
    if (n && !p->tables)
        return KVEDGE_ENOMEM;
    int32_t *t = p->tables;
    for (uint32_t i = 0; i < o->layers; i++) {
        kvedge_kv_dst_t *d[2] = {&p->layer[i].k, &p->layer[i].v};
        *d[0] = o->k[i];
        *d[1] = o->v[i];
        for (int j = 0; j < 2; j++)
            if (d[j]->layout == KVEDGE_KV_PAGED && d[j]->table_len) {
                memcpy(t, d[j]->page_table, d[j]->table_len * sizeof *t);
                d[j]->page_table = t;
                t += d[j]->table_len;
            }
    }
    return KVEDGE_OK;
}

static int s_alloc_ring(kvedge_pipeline_t *p)
{
    p->slot = calloc(p->nslots, sizeof *p->slot);
    if (!p->slot)
        return KVEDGE_ENOMEM;
    for (uint32_t i = 0; i < p->nslots; i++)
        p->slot[i].layer = -1;
    for (uint32_t i = 0; i < p->nslots; i++) {
        s_slot_t *s = &p->slot[i];
        s->desc = calloc(p->n_cap, sizeof *s->desc);
        s->have = calloc(p->n_cap, 1);
        s->held = calloc(p->n_cap, sizeof *s->held);
        if (!s->desc || !s->have || !s->held)
            return KVEDGE_ENOMEM;
        int rc = kvedge_pipeline__pool_take(p->slot_bytes, (void **)&s->host, &s->host_bytes);
        if (rc == KVEDGE_OK && p->device)
            rc = kvedge_gpu_dev_alloc(p->slot_bytes, &s->dev);
        if (rc == KVEDGE_OK && p->device)
            rc = kvedge_gpu_event_new(&s->copied);
        if (rc != KVEDGE_OK)
            return rc;
    }
    if (p->adapt) {
        kvedge_pipeline__geom_t g = {p->heads,  p->head_dim,     p->n_chunks, p->chunk_tokens,
                                     p->tokens, p->token_offset, p->stride};
        int rc = kvedge_pipeline__adapt_alloc(p->adapt, &g);
        if (rc != KVEDGE_OK)
            return rc;
    }
    if (p->device) {
        int rc = kvedge_gpu_stream_new(&p->copy_stream);
        if (rc == KVEDGE_OK)
            rc = kvedge_gpu_stream_new(&p->compute_stream);
        for (uint32_t i = 0; rc == KVEDGE_OK && i < p->layers; i++)
            rc = kvedge_gpu_event_new(&p->layer[i].ev);
        if (rc != KVEDGE_OK)
            return rc;
    }
    return KVEDGE_OK;
}

/* A transform-coded rung decodes only with its model's basis: a request that accepts one for
 * a model this process holds no basis of is refused before anything is fetched (its blocks
 * could only be misses). */
static int s_check_bases(const kvedge_pipeline_opts_t *o)
{
    for (size_t i = 0; i < o->n_accept; i++)
        if (KVEDGE_PREC_BASE(o->accept[i]) == KVEDGE_PREC_TC &&
            !kvedge_basis_find_model(o->model->id))
            return kvedge_client__say(
                KVEDGE_ENOBASIS,
                "the accept list holds %s, but no coding basis of model \"%s\" is loaded in "
                "this process: load it with kvedge_basis_load_dir (kvedge --basis DIR, "
                "kvedge.load_bases), or drop %s from the list",
                kvedge_prec_name(o->accept[i]), o->model->id, kvedge_prec_name(o->accept[i]));
    return KVEDGE_OK;
}

/* The smallest kvedge_pipeline_opts_t the loader accepts (kvedge_abi_read): the first layout
 * with a size field, today's. */
#define KVEDGE_PIPELINE_OPTS_SIZE_MIN sizeof(kvedge_pipeline_opts_t)

void kvedge_pipeline_opts_default(kvedge_pipeline_opts_t *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof *opts);
    opts->size = sizeof *opts;
}

int kvedge_pipeline_open(const kvedge_pipeline_opts_t *opts, kvedge_pipeline_t **out)
{
    if (!opts || !out)
        return KVEDGE_EINVAL;
    kvedge_pipeline_opts_t o; /* the caller's, in this library's layout */
    kvedge_pipeline_opts_default(&o);
    int rc = kvedge_abi_read(&o, sizeof o, opts, KVEDGE_PIPELINE_OPTS_SIZE_MIN, "opts");
    if (rc != KVEDGE_OK)
        return rc;
    opts = &o;
    rc = s_check_opts(opts);
    if (rc != KVEDGE_OK)
        return rc;
    rc = s_check_bases(opts);
    if (rc != KVEDGE_OK)
        return rc;
    const kvedge_node_info_t *node = kvedge_client_node(opts->client);
    bool via_proxy = node && node->role == KVEDGE_ROLE_PROXY;
    if (!via_proxy && node && node->max_chunks && opts->n_chunks > node->max_chunks)
        return KVEDGE_EINVAL; /* one GET_LAYER stream carries the whole chain */
    if (!via_proxy && opts->mapped_model)
        return KVEDGE_EINVAL; /* only a proxy delivers another model's layers */
    if (!via_proxy && opts->quality_metric != KVEDGE_QUALITY_NONE)
        return KVEDGE_EINVAL; /* only a proxy plans under a budget */
    kvedge_pipeline_t *p = calloc(1, sizeof *p);
    if (!p)
        return KVEDGE_ENOMEM;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    p->refs = 1;
    p->client = opts->client;
    snprintf(p->model_id, sizeof p->model_id, "%s", opts->model->id);
    if (opts->accept) {
        memcpy(p->accept, opts->accept, opts->n_accept);
        p->n_accept = opts->n_accept;
    }
    p->heads = opts->model->kv_heads;
    p->head_dim = opts->model->head_dim;
    p->n_chunks = (uint32_t)opts->n_chunks;
    p->chunk_tokens = opts->chunk_tokens;
    p->tokens = opts->tokens;
    p->token_offset = opts->token_offset;
    p->first_layer = opts->first_layer;
    p->layers = opts->layers;
    p->n_blocks = p->n_chunks * p->heads;
    p->stride = p->heads;
    if (opts->mapped_model) {
        p->adapt = kvedge_pipeline__adapt_new(opts);
        if (p->adapt && p->adapt->heads > p->stride)
            p->stride = p->adapt->heads;
    }
    p->n_cap = p->n_chunks * p->stride;
    p->via_proxy = via_proxy;
    p->device = opts->on_device && kvedge_gpu_stage_on_device() == 1;
    p->nslots = opts->ring_slots ? opts->ring_slots : KVEDGE_PIPELINE_RING_DEFAULT;
    if (p->nslots > p->layers)
        p->nslots = p->layers;
    p->slot_bytes = opts->slot_bytes;
    if (p->slot_bytes == 0) {
        size_t mine = 0, theirs = 0;
        for (uint32_t ci = 0; ci < p->n_chunks; ci++) {
            mine += p->heads * s_body_bound(s_chunk_tokens(p, ci), p->head_dim);
            if (p->adapt)
                theirs += p->adapt->heads * s_body_bound(s_chunk_tokens(p, ci), p->adapt->head_dim);
        }
        p->slot_bytes = mine > theirs ? mine : theirs;
    }
    if (node) {
        snprintf(p->node_name, sizeof p->node_name, "%.63s", node->name); /* kept short */
        p->node_kind = node->role == KVEDGE_ROLE_CLOUD ? S_KIND_CLOUD : S_KIND_LOCAL;
    }
    p->chunks = malloc(opts->n_chunks * sizeof *p->chunks);
    p->layer = calloc(p->layers, sizeof *p->layer);
    p->plan = via_proxy ? malloc(sizeof *p->plan) : NULL;
    rc = p->chunks && p->layer && (p->plan || !via_proxy) && (p->adapt || !opts->mapped_model)
             ? KVEDGE_OK
             : KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK) {
        memcpy(p->chunks, opts->chunks, opts->n_chunks * sizeof *p->chunks);
        for (uint32_t i = 0; i < p->layers; i++) {
            p->layer[i].p = p;
            p->layer[i].idx = i;
            p->layer[i].slot = -1;
            p->layer[i].from = -1;
        }
        rc = s_copy_dsts(p, opts);
    }
    if (rc == KVEDGE_OK)
        rc = s_alloc_ring(p);
    int deadline = opts->deadline_ms ? opts->deadline_ms : KVEDGE_CLIENT_DEADLINE_MS_DEFAULT;
    p->t0_us = kvedge_mono_us();
    p->deadline_ms = p->t0_us / 1000 + deadline;
    if (rc == KVEDGE_OK && via_proxy) {
        kvedge_fetch_req_t req = {.size = sizeof(kvedge_fetch_req_t),
                                  .model_id = p->model_id,
                                  .chunks = p->chunks,
                                  .n = p->n_chunks,
                                  .first_layer = p->first_layer,
                                  .layers = (uint16_t)p->layers,
                                  .tokens = p->tokens,
                                  .compute_us = opts->compute_us,
                                  .recompute_us = opts->recompute_us,
                                  .deadline_ms = deadline,
                                  .mapped_model_id = p->adapt ? p->adapt->id : NULL,
                                  .mapped_chunks = p->adapt ? p->adapt->chunks : NULL,
                                  .accept = opts->accept,
                                  .n_accept = opts->n_accept,
                                  .quality_metric = opts->quality_metric,
                                  .quality_budget = opts->quality_budget};
        kvedge_fetch_cbs_t cbs = {s_fx_plan, s_fx_block, s_fx_layer, s_fx_done};
        p->refs++; /* the stream's, dropped by s_fx_done */
        rc = kvedge_client_fetch_async(p->client, &req, &cbs, p);
        if (rc != KVEDGE_OK)
            p->refs--;
        else
            p->sent_bytes =
                KVEDGE_WIRE_HEADER_BYTES + KVEDGE_WIRE_FETCH_SPEC_BYTES +
                (uint64_t)p->n_chunks * KVEDGE_CHUNK_ID_BYTES +
                (opts->compute_us ? (uint64_t)p->layers * KVEDGE_WIRE_FETCH_TIMES_BYTES : 0) +
                (p->adapt ? KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES +
                                (uint64_t)p->n_chunks * KVEDGE_CHUNK_ID_BYTES
                          : 0) +
                (opts->accept ? KVEDGE_WIRE_FETCH_PREC_HDR_BYTES + opts->n_accept : 0);
    }
    if (rc == KVEDGE_OK) {
        if (pthread_create(&p->loader, NULL, s_loader, p) == 0) {
            p->loader_started = true;
        } else if (via_proxy) {
            /* The FETCH is under way and points at p: let it end on its own. */
            kvedge_pipeline_destroy(&p);
            return KVEDGE_ENOMEM;
        } else {
            rc = KVEDGE_ENOMEM;
        }
    }
    if (rc != KVEDGE_OK) {
        s_free_ring(p);
        pthread_mutex_lock(&p->mu);
        s_release(p);
        return rc;
    }
    *out = p;
    return KVEDGE_OK;
}

int kvedge_pipeline_wait(kvedge_pipeline_t *p, uint16_t layer)
{
    if (!p || layer < p->first_layer || (uint32_t)(layer - p->first_layer) >= p->layers)
        return KVEDGE_EINVAL;
    s_layer_t *l = &p->layer[layer - p->first_layer];
    pthread_mutex_lock(&p->mu);
    int rc = KVEDGE_OK;
    while (l->state != S_DONE && rc == KVEDGE_OK)
        if (s_wait_until(p, p->deadline_ms + S_WAIT_MARGIN_MS) == ETIMEDOUT && l->state != S_DONE)
            rc = KVEDGE_ETIMEDOUT;
    if (rc == KVEDGE_OK)
        rc = l->status;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int kvedge_pipeline_ready(kvedge_pipeline_t *p, uint16_t layer)
{
    if (!p || layer < p->first_layer || (uint32_t)(layer - p->first_layer) >= p->layers)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&p->mu);
    const int done = p->layer[layer - p->first_layer].state == S_DONE;
    pthread_mutex_unlock(&p->mu);
    return done;
}

/* Who delivered l, into its stats (locked). */
static void s_layer_source(const kvedge_pipeline_t *p, const s_layer_t *l,
                           kvedge_pipeline_layer_stats_t *out)
{
    if (p->via_proxy) {
        if (l->recorded) {
            snprintf(out->source, sizeof out->source, "%s", l->source);
            out->kind = l->kind;
            out->reason = l->reason;
        }
        return;
    }
    if (l->state != S_DONE)
        return;
    if (l->status == KVEDGE_OK) {
        snprintf(out->source, sizeof out->source, "%s", p->node_name);
        out->kind = p->node_kind;
        out->reason = KVEDGE_FETCH_PLANNED;
    } else if (l->status == KVEDGE_ENOTFOUND) {
        out->reason = KVEDGE_FETCH_MISS;
    } else if (l->status == KVEDGE_ETIMEDOUT) {
        out->reason = KVEDGE_FETCH_MISS_DEADLINE;
    }
}

int kvedge_pipeline_plan(kvedge_pipeline_t *p, kvedge_fetch_plan_t *out)
{
    if (!p || !out)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&p->mu);
    while (p->via_proxy && !p->have_plan && !p->stream_over && p->done < p->layers)
        if (s_wait_until(p, p->deadline_ms + S_WAIT_MARGIN_MS) == ETIMEDOUT)
            break;
    int rc = p->have_plan ? KVEDGE_OK : KVEDGE_ENOTFOUND;
    if (rc == KVEDGE_OK)
        memcpy(out, p->plan, sizeof *out);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int kvedge_pipeline_stats(kvedge_pipeline_t *p, kvedge_pipeline_stats_t *out,
                          kvedge_pipeline_layer_stats_t *layers, size_t max)
{
    if (!p || !out)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&p->mu);
    *out = (kvedge_pipeline_stats_t){
        .device = p->device,
        .via_proxy = p->via_proxy,
        .ring_slots = p->nslots,
        .slot_bytes = p->slot_bytes,
        .resident = p->resident,
        .misses = p->misses,
        .failed = p->failed,
        .wire_bytes = p->wire_bytes,
        .raw_bytes = p->raw_bytes,
        .sent_bytes = p->sent_bytes,
        .msg_bytes = p->msg_bytes,
        .ring_wait_us = (double)p->ring_wait_us,
        .copy_us = (double)p->copy_us,
        .dequant_us = (double)p->dequant_us,
        .done_us = p->done == p->layers ? (double)p->done_us : 0,
        .adapted = p->adapt ? p->adapt->adapted : 0,
        .adapt_us = p->adapt ? (double)p->adapt->adapt_us : 0,
        .zero_copy_blocks = p->zc_blocks,
        .zero_copy_bytes = p->zc_bytes,
    };
    for (size_t i = 0; layers && i < max && i < p->layers; i++) {
        const s_layer_t *l = &p->layer[i];
        layers[i] = (kvedge_pipeline_layer_stats_t){
            .layer = (uint16_t)(p->first_layer + i),
            .done = l->state == S_DONE,
            .status = l->state == S_DONE ? l->status : KVEDGE_OK,
            .order = l->order,
            .arrived_us = (double)l->arrived_us,
            .resident_us = (double)l->resident_us,
            .wire_bytes = l->wire_bytes,
            .raw_bytes = l->raw_bytes,
            .blocks = l->blocks,
            .kind = -1,
            .from_layer = l->from,
            .adapt_failed = l->adapt_failed,
        };
        s_layer_source(p, l, &layers[i]);
    }
    pthread_mutex_unlock(&p->mu);
    return KVEDGE_OK;
}

void kvedge_pipeline_destroy(kvedge_pipeline_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_pipeline_t *p = *self_p;
    *self_p = NULL;
    pthread_mutex_lock(&p->mu);
    p->abandoned = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->loader_started)
        pthread_join(p->loader, NULL);
    pthread_mutex_lock(&p->mu);
    while (p->in_cb > 0) /* a callback staging a block finishes it, then sees abandoned */
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    s_free_ring(p); /* the stream destroys wait for queued device work first */
    pthread_mutex_lock(&p->mu);
    /* Parked messages are dropped; their held credit goes back so the stream ends now rather
     * than at its deadline (its callbacks drop the rest). */
    uint32_t held = p->credit_held + p->credit_due;
    while (p->park) {
        s_park_t *e = p->park;
        p->park = e->next;
        s_park_free(e);
    }
    p->park_tail = NULL;
    p->credit_held = p->credit_due = 0;
    uint64_t stream = p->stream_id;
    bool over = p->stream_over;
    pthread_mutex_unlock(&p->mu);
    for (uint32_t n; held > 0 && !over; held -= n) {
        n = held > KVEDGE_WIRE_MAX_CREDIT ? KVEDGE_WIRE_MAX_CREDIT : held;
        if (kvedge_client_credit_return(p->client, stream, n) != KVEDGE_OK)
            break; /* the stream ends at its deadline instead */
    }
    pthread_mutex_lock(&p->mu);
    s_release(p);
}
