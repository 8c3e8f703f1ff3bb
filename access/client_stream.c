/* The protocol client's streams (access/client.c): GET_LAYER streams and the edge proxy's
 * FETCH, with the blocks their callbacks may take. */
#include <czmq.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "access/client_credit.h"
#include "access/client_impl.h"
#include "access/client_internal.h"
#include "access/codec/clock.h"

/* Whether (chunk, head) is the block that must come next in (chunk, head) order: (0, 0)
 * first, then the next head of the same chunk or head 0 of the next chunk. heads is the
 * layer's head count once known (0 = not yet). */
static bool s_next_head(bool first, uint32_t last_chunk, uint16_t last_head, uint32_t heads,
                        uint32_t chunk, uint16_t head)
{
    if (first)
        return chunk == 0 && head == 0;
    if (chunk == last_chunk)
        return head == last_head + 1 && (heads == 0 || head < heads);
    return chunk == last_chunk + 1 && head == 0 && (heads == 0 || heads == (uint32_t)last_head + 1);
}

/* ---------------------------------------------------------------- taking a block's frame */

/* kvedge_client_block_take: the message being dispatched on this thread (set by s_io_message
 * around s_io_stream / s_io_fetch) and the data pointer of the block an on_block callback is
 * running for (set around the call only). Nothing after on_block reads the data frame: the
 * actor accounts credit from the stream header and destroys what is left of the message. */
static _Thread_local zmsg_t *s_tl_msg;
static _Thread_local const uint8_t *s_tl_data;
/* kvedge_client_credit_hold: the stream whose on_block runs on the I/O actor right now (set
 * around the call only), and whether the callback kept that message's credit. */
static _Thread_local kvedge_client__req_t *s_tl_hold_req;
static _Thread_local bool s_tl_held;

zframe_t *kvedge_client_block_take_frame(void)
{
    if (!s_tl_msg || !s_tl_data)
        return NULL;
    for (zframe_t *f = zmsg_first(s_tl_msg); f; f = zmsg_next(s_tl_msg))
        if (zframe_data(f) == s_tl_data) {
            zmsg_remove(s_tl_msg, f); /* the message no longer owns it: destroy skips it */
            s_tl_data = NULL;         /* taken once */
            return f;
        }
    return NULL;
}

uint64_t kvedge_client_credit_hold(void)
{
    /* A packed message uses one credit for all its heads: the first hold keeps it, later
     * ones in the same message hold nothing (and return 0, so nothing is given back twice). */
    if (!s_tl_hold_req || s_tl_held)
        return 0;
    s_tl_held = true;
    return s_tl_hold_req->id;
}

int kvedge_client_credit_return(kvedge_client_t *c, uint64_t stream, uint32_t n)
{
    KVEDGE_CLIENT__ENTER(c);
    if (!c || stream == 0 || n == 0 || n > KVEDGE_WIRE_MAX_CREDIT)
        return KVEDGE_EINVAL;
    kvedge_client__req_t *r =
        kvedge_client__req_new(KVEDGE_OP_CREDIT, n, kvedge_client__deadline(c, 0));
    if (!r)
        return KVEDGE_ENOMEM;
    r->grant_to = stream;
    return kvedge_client__submit(c, r);
}

/* Around a stream's on_block call: what kvedge_client_block_take and kvedge_client_credit_hold
 * may use while it runs. s_cb_leave returns whether a callback held the message's credit (a
 * packed message runs several callbacks: s_cb_msg_done forgets it once they all ran). */
static void s_cb_enter(const kvedge_client__io_t *io, kvedge_client__req_t *r, const uint8_t *data)
{
    s_tl_data = data;
    s_tl_hold_req = io->actor ? r : NULL; /* a direct channel's caller cannot be given it back */
}

static bool s_cb_leave(void)
{
    s_tl_data = NULL;
    s_tl_hold_req = NULL;
    return s_tl_held;
}

static void s_cb_msg_done(void)
{
    s_tl_held = false;
}

/* One more message of r consumed: its credit is owed back to the node (in this drain's
 * CREDIT), unless the consumer held it. */
static void s_owe(kvedge_client__io_t *io, kvedge_client__req_t *r)
{
    if (r->owed++ == 0 && io->n_due < KVEDGE_CLIENT__DRAIN_MAX)
        io->due[io->n_due++] = r->id;
}

/* A kvedge_block_ref_t is the zframe_t that holds the bytes, under a name of its own: the
 * public API names no czmq type. */
kvedge_block_ref_t *kvedge_client_block_take(void)
{
    return (kvedge_block_ref_t *)kvedge_client_block_take_frame();
}

const uint8_t *kvedge_block_ref_data(const kvedge_block_ref_t *ref, size_t *len)
{
    zframe_t *f = (zframe_t *)ref;
    if (len)
        *len = f ? zframe_size(f) : 0;
    return f ? zframe_data(f) : NULL;
}

void kvedge_client_block_free(kvedge_block_ref_t *ref)
{
    zframe_t *f = (zframe_t *)ref;
    zframe_destroy(&f);
}

/* A GET_LAYER stream's position: the last head delivered and the head count once shown. */
typedef struct {
    bool first;
    uint32_t last_chunk;
    uint16_t last_head;
    uint32_t heads;
} s_pos_t;

/* Checks the k heads of a data message (f1, validated by the codec) against the stream's order
 * and moves pos past them; the stream's own state changes only once all of them are good. */
static int s_stream_heads(const kvedge_client__req_t *r, const uint8_t *f1, uint32_t k,
                          kvedge_wire_stream_hdr_t *hd, s_pos_t *pos)
{
    for (uint32_t i = 0; i < k; i++) {
        if (kvedge_wire_stream_hdr_parse(f1 + (size_t)i * KVEDGE_WIRE_STREAM_HDR_BYTES,
                                         KVEDGE_WIRE_STREAM_HDR_BYTES, &hd[i]) != KVEDGE_OK ||
            hd[i].chunk_index >= r->n_chunks ||
            !s_next_head(pos->first, pos->last_chunk, pos->last_head, pos->heads, hd[i].chunk_index,
                         hd[i].head))
            return KVEDGE_EPROTO;
        if (!pos->first && hd[i].chunk_index != pos->last_chunk && pos->heads == 0)
            pos->heads = (uint32_t)pos->last_head + 1;
        pos->first = false;
        pos->last_chunk = hd[i].chunk_index;
        pos->last_head = hd[i].head;
    }
    return KVEDGE_OK;
}

/* A GET_LAYER end message: the stream is complete when every head of every chunk came, so the
 * last one is (n - 1, H - 1), in as many data messages as the node says it sent. A packed
 * request the node refused before any data is sent again unpacked. */
static void s_stream_end(kvedge_client__io_t *io, kvedge_client__req_t *r,
                         const kvedge_wire_header_t *h)
{
    if (r->packed && r->retry && h->status == KVEDGE_EPROTO && h->count == 0 && r->msgs == 0) {
        kvedge_client__io_resubmit_unpacked(io, r);
        return;
    }
    int status = h->status;
    if (status == KVEDGE_OK && h->count != r->msgs)
        status = KVEDGE_EPROTO;
    if (status == KVEDGE_OK && r->received > 0) {
        uint32_t heads = r->received / r->n_chunks;
        if (r->received % r->n_chunks != 0 || (r->heads && r->heads != heads) ||
            r->last_chunk != r->n_chunks - 1 || (uint32_t)r->last_head + 1 != heads)
            status = KVEDGE_EPROTO;
    }
    kvedge_client__finish(io, r, status, false);
}

/* One GET_LAYER message of stream r (already validated). Data messages, of one head or (asked
 * for) a pack of up to pack_max, must come in (chunk, head) order within the credit granted;
 * anything else fails the stream before any of the message's heads is delivered. */
static void s_io_stream(kvedge_client__io_t *io, kvedge_client__req_t *r,
                        const kvedge_wire_header_t *h, size_t nframes)
{
    if (h->flags & KVEDGE_WIRE_FLAG_END) {
        s_stream_end(io, r, h);
        return;
    }
    uint32_t k = h->count;
    kvedge_wire_stream_hdr_t hd[KVEDGE_WIRE_MAX_PACK];
    s_pos_t pos = {r->received == 0, r->last_chunk, r->last_head, r->heads};
    if (r->outstanding == 0 || k == 0 || k > r->pack_max || k > KVEDGE_WIRE_MAX_PACK ||
        s_stream_heads(r, io->frames[0].data, k, hd, &pos) != KVEDGE_OK) {
        kvedge_client__finish(io, r, KVEDGE_EPROTO, true);
        return;
    }
    r->heads = pos.heads;
    r->last_chunk = pos.last_chunk;
    r->last_head = pos.last_head;
    r->outstanding--;
    r->msgs++;
    zmsg_destroy(&r->retry); /* the node packs: no unpacked retry from here on */
    size_t at = 1;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < k; i++) {
        const uint8_t *data = NULL;
        size_t len = 0;
        if (hd[i].status == KVEDGE_OK && at < nframes) {
            data = io->frames[at].data;
            len = io->frames[at++].len;
            bytes += len;
        }
        r->received++;
        if (r->on_block) {
            s_cb_enter(io, r, data);
            r->on_block(r->ctx, hd[i].chunk_index, hd[i].head, hd[i].status, data, len);
            s_cb_leave();
        }
    }
    if (at > 1) {
        r->blk_bytes += bytes;
        r->blk_n++;
    }
    bool held = s_cb_leave();
    s_cb_msg_done();
    if (!held)
        s_owe(io, r);
}

/* ---------------------------------------------------------------- FETCH streams */

/* A FETCH stream's client state (I/O thread only after submit). */
struct kvedge_client__fetch_t {
    kvedge_fetch_cbs_t cbs;
    uint16_t first_layer;
    uint16_t layers;
    bool planned;        /* the PLAN message has come */
    uint32_t next_layer; /* offset of the layer whose blocks come now */
    uint32_t layer_blocks;
    bool in_layer; /* a block of next_layer has come */
    uint32_t last_chunk;
    uint16_t last_head;
    bool mapped; /* the request named a mapped model */
    bool prec;   /* the request sent a precision frame */
    kvedge_fetch_plan_t plan;
};

void kvedge_client__fetch_done(kvedge_client__req_t *r, int status)
{
    struct kvedge_client__fetch_t *f = r->fetch;
    if (status == KVEDGE_OK && f->next_layer != f->layers)
        status = KVEDGE_EPROTO; /* END before every layer was accounted for */
    if (f->cbs.on_done)
        f->cbs.on_done(r->ctx, status);
}

static int s_fetch_plan(struct kvedge_client__fetch_t *f, const kvedge_wire_frame_t *fr)
{
    kvedge_wire_fetch_plan_t p;
    if (f->planned || kvedge_wire_fetch_plan_parse(fr[0].data, fr[0].len, &p) != KVEDGE_OK ||
        p.layers != f->layers)
        return KVEDGE_EPROTO;
    kvedge_fetch_plan_t *o = &f->plan;
    o->nsources = p.sources;
    o->layers = p.layers;
    o->split = p.split;
    o->total_us = p.total_us;
    o->bound_us = p.bound_us;
    o->cloud_only_us = p.cloud_only_us;
    o->recompute_all_us = p.recompute_all_us;
    o->load_then_compute_us = p.load_then_compute_us;
    for (uint32_t i = 0; i < p.sources; i++) {
        kvedge_wire_fetch_source_t ws;
        if (kvedge_wire_fetch_source_parse(fr[1].data + (size_t)i * KVEDGE_WIRE_FETCH_SOURCE_BYTES,
                                           KVEDGE_WIRE_FETCH_SOURCE_BYTES, &ws) != KVEDGE_OK)
            return KVEDGE_EPROTO;
        memcpy(o->source[i].name, ws.name, sizeof o->source[i].name);
        o->source[i].kind = ws.kind;
        o->source[i].up = ws.up;
        o->source[i].rtt_us = ws.rtt_us;
        o->source[i].bw_bytes_per_s = ws.bw_bytes_per_s;
    }
    for (uint32_t l = 0; l < p.layers; l++) {
        kvedge_wire_fetch_plan_layer_t wl;
        if (kvedge_wire_fetch_plan_layer_parse(
                fr[2].data + (size_t)l * KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES,
                KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES, &wl) != KVEDGE_OK ||
            wl.source >= (int)p.sources)
            return KVEDGE_EPROTO;
        o->layer[l].source = wl.source;
        o->layer[l].reason = wl.reason;
        o->layer[l].cost_us = wl.cost_us;
        o->layer[l].from_layer = wl.mapped ? (int)wl.from_layer : -1;
        o->layer[l].prec = wl.prec;
        o->layer[l].prec_reason = wl.prec_reason;
        if (wl.prec != KVEDGE_PREC_STORED && !f->prec)
            return KVEDGE_EPROTO; /* a precision the request did not offer */
        if (wl.mapped && !f->mapped)
            return KVEDGE_EPROTO; /* a layer of a model the request did not name */
    }
    f->planned = true;
    return KVEDGE_OK;
}

/* The k BLOCK records of a FETCH message (k > 1: packed), checked all against the order
 * (the layer being delivered, (chunk, head) order, sources of the plan) before any is
 * delivered; then each goes to on_block with its block frame. *held: a callback held the
 * message's credit. */
static int s_fetch_blocks(kvedge_client__io_t *io, kvedge_client__req_t *r, uint32_t k,
                          size_t nframes, bool *held)
{
    struct kvedge_client__fetch_t *f = r->fetch;
    const kvedge_wire_frame_t *fr = io->frames;
    kvedge_wire_fetch_block_t b[KVEDGE_WIRE_MAX_PACK];
    bool first = !f->in_layer;
    uint32_t last_chunk = f->last_chunk;
    uint16_t last_head = f->last_head;
    for (uint32_t i = 0; i < k; i++) {
        kvedge_wire_fetch_block_parse(fr[0].data + (size_t)i * KVEDGE_WIRE_FETCH_BLOCK_BYTES,
                                      KVEDGE_WIRE_FETCH_BLOCK_BYTES, &b[i]);
        if (!s_next_head(first, last_chunk, last_head, 0, b[i].chunk_index, b[i].head) ||
            b[i].layer != f->first_layer + f->next_layer || b[i].chunk_index >= r->n_chunks ||
            b[i].source >= f->plan.nsources)
            return KVEDGE_EPROTO;
        first = false;
        last_chunk = b[i].chunk_index;
        last_head = b[i].head;
    }
    size_t at = 1;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < k; i++) {
        f->in_layer = true;
        f->last_chunk = b[i].chunk_index;
        f->last_head = b[i].head;
        f->layer_blocks++;
        const uint8_t *data = NULL;
        size_t len = 0;
        if (b[i].status == KVEDGE_OK && at < nframes) {
            data = fr[at].data;
            len = fr[at++].len;
            bytes += len;
        }
        if (f->cbs.on_block) {
            s_cb_enter(io, r, data);
            f->cbs.on_block(r->ctx, b[i].layer, b[i].chunk_index, b[i].head, b[i].source,
                            b[i].status, data, len);
            *held = s_cb_leave();
        }
    }
    s_cb_msg_done();
    if (at > 1) {
        r->blk_bytes += bytes;
        r->blk_n++;
    }
    return KVEDGE_OK;
}

/* One FETCH message (validated by the codec). Order: the plan, then per layer, in layer
 * order, its blocks in (chunk, head) order and its LAYER record; anything else fails it. */
static void s_io_fetch(kvedge_client__io_t *io, kvedge_client__req_t *r,
                       const kvedge_wire_header_t *h, size_t nframes)
{
    struct kvedge_client__fetch_t *f = r->fetch;
    if (h->flags & KVEDGE_WIRE_FLAG_END) {
        /* A packed request the proxy refused before any data: again, unpacked. */
        if (r->packed && r->retry && h->status == KVEDGE_EPROTO && h->count == 0 && r->msgs == 0)
            kvedge_client__io_resubmit_unpacked(io, r);
        else
            kvedge_client__finish(io, r, h->status, false);
        return;
    }
    if (r->outstanding == 0 || h->count > r->pack_max) {
        kvedge_client__finish(io, r, KVEDGE_EPROTO, true);
        return;
    }
    r->msgs++;
    zmsg_destroy(&r->retry); /* the proxy packs (or was not asked): no unpacked retry now */
    const kvedge_wire_frame_t *fr = io->frames;
    int rc = KVEDGE_OK;
    bool held = false; /* the consumer keeps this message's credit for now */
    uint8_t kind = fr[0].data[0];
    if (kind == KVEDGE_FETCH_MSG_PLAN) {
        rc = s_fetch_plan(f, fr);
        if (rc == KVEDGE_OK && f->cbs.on_plan)
            f->cbs.on_plan(r->ctx, &f->plan);
    } else if (!f->planned || f->next_layer >= f->layers) {
        rc = KVEDGE_EPROTO;
    } else if (kind == KVEDGE_FETCH_MSG_BLOCK) {
        rc = s_fetch_blocks(io, r, h->count, nframes, &held);
    } else { /* LAYER */
        kvedge_wire_fetch_layer_t l;
        kvedge_wire_fetch_layer_parse(fr[0].data, fr[0].len, &l);
        bool complete = l.status != KVEDGE_OK ||
                        (f->in_layer && f->last_chunk == r->n_chunks - 1 &&
                         f->layer_blocks == r->n_chunks * ((uint32_t)f->last_head + 1));
        if (l.layer != f->first_layer + f->next_layer || l.heads != f->layer_blocks ||
            l.source >= (int)f->plan.nsources || !complete ||
            (l.status != KVEDGE_OK && f->layer_blocks != 0) ||
            (l.from_layer != KVEDGE_WIRE_FETCH_OWN_LAYER && !f->mapped) ||
            (l.prec != KVEDGE_PREC_STORED && !f->prec)) {
            rc = KVEDGE_EPROTO;
        } else {
            kvedge_fetch_layer_t info = {
                .layer = l.layer,
                .source = l.source,
                .source_name = l.source >= 0 ? f->plan.source[l.source].name : "",
                .reason = l.reason,
                .status = l.status,
                .blocks = l.heads,
                .attempts = l.attempts,
                .from_layer = l.from_layer == KVEDGE_WIRE_FETCH_OWN_LAYER ? -1 : l.from_layer,
                .prec = l.prec,
            };
            f->next_layer++;
            f->in_layer = false;
            f->layer_blocks = 0;
            if (f->cbs.on_layer)
                f->cbs.on_layer(r->ctx, &info);
        }
    }
    if (rc != KVEDGE_OK) {
        kvedge_client__finish(io, r, rc, true);
        return;
    }
    r->outstanding--;
    r->received++;
    if (!held)
        s_owe(io, r);
}

void kvedge_client__stream_message(kvedge_client__io_t *io, kvedge_client__req_t *r,
                                   const kvedge_wire_header_t *h, size_t n, zmsg_t *m)
{
    s_tl_msg = m; /* an on_block callback may take its block's frame out of m */
    if (r->fetch)
        s_io_fetch(io, r, h, n);
    else
        s_io_stream(io, r, h, n);
    s_tl_msg = NULL;
}

/* ---------------------------------------------------------------- get_layer */

static int s_layer_request(kvedge_client_t *c, const kvedge_chunk_id_t *chunks, size_t n,
                           uint16_t layer, const kvedge_prec_t *accept, size_t n_accept,
                           int deadline_ms, kvedge_block_fn *on_block, kvedge_done_fn *on_done,
                           void *ctx, kvedge_client__req_t **out);

/* One stream of n <= the node's max_chunks chunks (KVEDGE_EINVAL past it); the deadline
 * covers the whole stream. */
int kvedge_client_get_layer_async(kvedge_client_t *c, const kvedge_chunk_id_t *chunks, size_t n,
                                  uint16_t layer, int deadline_ms, kvedge_block_fn *on_block,
                                  kvedge_done_fn *on_done, void *ctx)
{
    KVEDGE_CLIENT__ENTER(c);
    return kvedge_client_get_layer_prec_async(c, chunks, n, layer, NULL, 0, deadline_ms, on_block,
                                              on_done, ctx);
}

int kvedge_client_get_layer_prec_async(kvedge_client_t *c, const kvedge_chunk_id_t *chunks,
                                       size_t n, uint16_t layer, const kvedge_prec_t *accept,
                                       size_t n_accept, int deadline_ms, kvedge_block_fn *on_block,
                                       kvedge_done_fn *on_done, void *ctx)
{
    KVEDGE_CLIENT__ENTER(c);
    kvedge_client__req_t *r;
    int rc = s_layer_request(c, chunks, n, layer, accept, n_accept, deadline_ms, on_block, on_done,
                             ctx, &r);
    return rc == KVEDGE_OK ? kvedge_client__submit(c, r) : rc;
}

/* A GET_LAYER stream's request, not yet sent. */
static int s_layer_request(kvedge_client_t *c, const kvedge_chunk_id_t *chunks, size_t n,
                           uint16_t layer, const kvedge_prec_t *accept, size_t n_accept,
                           int deadline_ms, kvedge_block_fn *on_block, kvedge_done_fn *on_done,
                           void *ctx, kvedge_client__req_t **out)
{
    if (!c || !chunks || n == 0 || n > c->max_chunks || deadline_ms < 0 ||
        deadline_ms > KVEDGE_WIRE_MAX_DEADLINE_MS ||
        (accept && kvedge_prec_list_check(accept, n_accept) != KVEDGE_OK) || (!accept && n_accept))
        return KVEDGE_EINVAL;
    uint8_t *p;
    kvedge_client__req_t *r = kvedge_client__req_frame(KVEDGE_OP_GET_LAYER, (uint32_t)n,
                                                       kvedge_client__deadline(c, deadline_ms),
                                                       NULL, 4 + n * KVEDGE_CHUNK_ID_BYTES, &p);
    if (!r)
        return KVEDGE_ENOMEM;
    p[0] = (uint8_t)layer; /* layer u16 LE | reserved u16 | chunk ids */
    p[1] = (uint8_t)(layer >> 8);
    memcpy(p + 4, chunks, n * KVEDGE_CHUNK_ID_BYTES);
    if (accept && zmsg_addmem(r->payload, accept, n_accept) != 0) {
        kvedge_client__req_free(r);
        return KVEDGE_ENOMEM;
    }
    r->stream = true;
    r->credit = c->credit;
    r->credit_max = c->max_credit;
    r->window = c->window;
    r->pack_want = !c->no_pack;
    r->has_accept = accept != NULL;
    r->pack_bytes =
        c->max_frame < KVEDGE_CLIENT_PACK_BYTES ? c->max_frame : KVEDGE_CLIENT_PACK_BYTES;
    r->n_chunks = (uint32_t)n;
    r->on_block = on_block;
    r->on_done = on_done;
    r->ctx = ctx;
    *out = r;
    return KVEDGE_OK;
}

/* The synchronous form's state, shared by the caller and the callbacks (on the I/O thread, or
 * on the caller's own on a direct channel); the mutex also keeps a callback from writing into
 * the caller's buffer after it gave up. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    bool done, abandoned;
    kvedge_client__sink_t sink;
    kvedge_fetched_t *out;
    size_t out_cap;
    bool out_full; /* more heads than out has entries */
    int status;
    uint32_t received;
    uint32_t max_head_plus1;
} s_layer_t;

static void s_layer_release(s_layer_t *l)
{
    bool last = --l->refs == 0; /* under l->mu */
    pthread_mutex_unlock(&l->mu);
    if (last) {
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
        free(l);
    }
}

static void s_layer_block(void *ctx, uint32_t chunk_index, uint16_t head, int status,
                          const uint8_t *data, size_t len)
{
    (void)chunk_index;
    s_layer_t *l = ctx;
    pthread_mutex_lock(&l->mu);
    if (!l->abandoned) {
        if ((uint32_t)head + 1 > l->max_head_plus1)
            l->max_head_plus1 = (uint32_t)head + 1;
        if (l->received < l->out_cap)
            kvedge_client__sink_put(&l->sink, status, data, len, &l->out[l->received]);
        else
            l->out_full = true;
        l->received++;
    }
    pthread_mutex_unlock(&l->mu);
}

static void s_layer_done(void *ctx, int status, uint32_t heads)
{
    s_layer_t *l = ctx;
    (void)heads;
    pthread_mutex_lock(&l->mu);
    l->status = status;
    l->done = true;
    pthread_cond_signal(&l->cv);
    s_layer_release(l);
}

/* The async form into the caller's buffer, with kvedge_client_get's ENOSPACE rule; out_cap
 * smaller than n * heads is KVEDGE_ENOSPACE too (the first out_cap heads are kept). */
int kvedge_client_get_layer(kvedge_client_t *c, const kvedge_chunk_id_t *chunks, size_t n,
                            uint16_t layer, uint8_t *buf, size_t cap, kvedge_fetched_t *out,
                            size_t out_cap, uint32_t *heads)
{
    KVEDGE_CLIENT__ENTER(c);
    return kvedge_client_get_layer_prec(c, chunks, n, layer, NULL, 0, buf, cap, out, out_cap,
                                        heads);
}

int kvedge_client_get_layer_prec(kvedge_client_t *c, const kvedge_chunk_id_t *chunks, size_t n,
                                 uint16_t layer, const kvedge_prec_t *accept, size_t n_accept,
                                 uint8_t *buf, size_t cap, kvedge_fetched_t *out, size_t out_cap,
                                 uint32_t *heads)
{
    KVEDGE_CLIENT__ENTER(c);
    if (!c || (cap && !buf) || (out_cap && !out))
        return KVEDGE_EINVAL;
    s_layer_t *l = calloc(1, sizeof *l);
    if (!l)
        return KVEDGE_ENOMEM;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    l->refs = 2;
    l->sink = (kvedge_client__sink_t){buf, cap, 0, false};
    l->out = out;
    l->out_cap = out_cap;
    int64_t until = kvedge_client__deadline(c, 0) + KVEDGE_CLIENT__WAIT_MARGIN_MS;
    kvedge_client__path_t path = kvedge_client__path_open(c);
    int rc;
    if (!path.ch) {
        rc = kvedge_client_get_layer_prec_async(c, chunks, n, layer, accept, n_accept, 0,
                                                s_layer_block, s_layer_done, l);
    } else {
        /* Direct: the stream runs on this thread's channel, its callbacks here too. */
        kvedge_client__req_t *r;
        rc = s_layer_request(c, chunks, n, layer, accept, n_accept, 0, s_layer_block, s_layer_done,
                             l, &r);
        if (rc == KVEDGE_OK) {
            kvedge_client__io_submit(path.ch, r); /* failures end the stream (on_done) at once */
            if (!kvedge_client__chan_run(c, path.ch, &l->done))
                kvedge_client__path_close(&path, true);
        }
    }
    kvedge_client__path_close(&path, false);
    pthread_mutex_lock(&l->mu);
    if (rc != KVEDGE_OK) {
        l->refs--; /* the callbacks will never run */
        l->done = true;
        l->status = rc;
    }
    struct timespec ts = {(time_t)(until / 1000), (long)(until % 1000) * 1000000};
    while (!l->done)
        if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) == ETIMEDOUT)
            break;
    if (!l->done) {
        l->abandoned = true;
        rc = KVEDGE_ETIMEDOUT;
    } else {
        rc = l->status;
    }
    if (rc == KVEDGE_OK && (l->sink.full || l->out_full))
        rc = KVEDGE_ENOSPACE;
    if (heads)
        *heads = l->done && l->status == KVEDGE_OK ? l->received / (uint32_t)n : l->max_head_plus1;
    s_layer_release(l);
    return kvedge_client__role_err(c, KVEDGE_OP_GET_LAYER, rc);
}

/* ---------------------------------------------------------------- fetch (edge proxy) */

int kvedge_client_fetch_async(kvedge_client_t *c, const kvedge_fetch_req_t *req,
                              const kvedge_fetch_cbs_t *cbs, void *ctx)
{
    KVEDGE_CLIENT__ENTER(c);
    kvedge_fetch_req_t rq; /* the caller's, in this library's layout */
    if (req) {
        kvedge_fetch_req_default(&rq);
        int rc = kvedge_abi_read(&rq, sizeof rq, req, KVEDGE_FETCH_REQ_SIZE_MIN, "req");
        if (rc != KVEDGE_OK)
            return rc;
        req = &rq;
    }
    if (c && !kvedge_client__role_serves(c->node.role, KVEDGE_OP_FETCH))
        return kvedge_client__role_err(c, KVEDGE_OP_FETCH,
                                       KVEDGE_EPROTO); /* a node would refuse it */
    if (!c || !req || !cbs || !req->model_id || !req->chunks || req->n == 0 ||
        req->n > KVEDGE_WIRE_MAX_CHUNKS || req->layers == 0 ||
        req->layers > KVEDGE_WIRE_FETCH_MAX_LAYERS || req->deadline_ms < 0 ||
        req->deadline_ms > KVEDGE_WIRE_MAX_DEADLINE_MS ||
        (!req->compute_us) != (!req->recompute_us) ||
        (!req->mapped_model_id) != (!req->mapped_chunks) || (!req->accept && req->n_accept) ||
        (!req->accept && req->quality_metric != KVEDGE_QUALITY_NONE))
        return KVEDGE_EINVAL;
    kvedge_wire_fetch_prec_t prec = {0};
    if (req->accept) {
        if (req->n_accept > KVEDGE_WIRE_MAX_ACCEPT)
            return KVEDGE_EINVAL;
        prec.metric = req->quality_metric;
        prec.n = (uint8_t)req->n_accept;
        prec.budget = req->quality_budget;
        memcpy(prec.accept, req->accept, req->n_accept);
        if (kvedge_wire_fetch_prec_check(&prec) != KVEDGE_OK)
            return KVEDGE_EINVAL;
    }
    kvedge_wire_fetch_spec_t spec = {
        .first_layer = req->first_layer, .layers = req->layers, .tokens = req->tokens};
    if (strlen(req->model_id) >= KVEDGE_WIRE_MODEL_ID_BYTES)
        return KVEDGE_EINVAL;
    strcpy(spec.model_id, req->model_id);
    uint8_t mhdr[KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES];
    if (req->mapped_model_id) {
        if (strcmp(req->mapped_model_id, req->model_id) == 0 ||
            kvedge_wire_fetch_mapped_pack(req->mapped_model_id, mhdr) != KVEDGE_OK)
            return KVEDGE_EINVAL;
        spec.flags |= KVEDGE_WIRE_FETCH_FLAG_MAPPED;
    }
    if (req->accept)
        spec.flags |= KVEDGE_WIRE_FETCH_FLAG_PREC;
    uint8_t *p;
    kvedge_client__req_t *r = kvedge_client__req_frame(KVEDGE_OP_FETCH, (uint32_t)req->n,
                                                       kvedge_client__deadline(c, req->deadline_ms),
                                                       NULL, KVEDGE_WIRE_FETCH_SPEC_BYTES, &p);
    if (!r)
        return KVEDGE_ENOMEM;
    int rc = kvedge_wire_fetch_spec_pack(&spec, p);
    r->fetch = rc == KVEDGE_OK ? calloc(1, sizeof *r->fetch) : NULL;
    if (rc == KVEDGE_OK && !r->fetch)
        rc = KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK &&
        zmsg_addmem(r->payload, req->chunks, req->n * KVEDGE_CHUNK_ID_BYTES) != 0)
        rc = KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK && req->compute_us) {
        size_t len = (size_t)req->layers * KVEDGE_WIRE_FETCH_TIMES_BYTES;
        zframe_t *t = zframe_new(NULL, len);
        if (!t) {
            rc = KVEDGE_ENOMEM;
        } else {
            uint8_t *q = zframe_data(t);
            for (uint32_t l = 0; l < req->layers; l++) {
                float cu = req->compute_us[l], ru = req->recompute_us[l];
                if (!(cu >= 0 && cu < 1e30f) || !(ru >= 0 && ru < 1e30f))
                    rc = KVEDGE_EINVAL;
                uint32_t a, b;
                memcpy(&a, &cu, 4);
                memcpy(&b, &ru, 4);
                kvedge_le_put32(q + 8 * l, a);
                kvedge_le_put32(q + 8 * l + 4, b);
            }
            zmsg_append(r->payload, &t);
        }
    }
    if (rc == KVEDGE_OK && req->accept) {
        /* The precision frame: after the times, before the mapped frame. */
        uint8_t pf[KVEDGE_WIRE_FETCH_PREC_HDR_BYTES + KVEDGE_WIRE_MAX_ACCEPT];
        size_t plen;
        kvedge_wire_fetch_prec_pack(&prec, pf, &plen);
        if (zmsg_addmem(r->payload, pf, plen) != 0)
            rc = KVEDGE_ENOMEM;
    }
    if (rc == KVEDGE_OK && req->mapped_model_id) {
        /* The mapped frame, always the last: its model id and its chain. */
        size_t ids = req->n * KVEDGE_CHUNK_ID_BYTES;
        zframe_t *mf = zframe_new(NULL, sizeof mhdr + ids);
        if (!mf) {
            rc = KVEDGE_ENOMEM;
        } else {
            memcpy(zframe_data(mf), mhdr, sizeof mhdr);
            memcpy(zframe_data(mf) + sizeof mhdr, req->mapped_chunks, ids);
            zmsg_append(r->payload, &mf);
        }
    }
    if (rc != KVEDGE_OK) {
        kvedge_client__req_free(r);
        return rc;
    }
    r->pack_want = !c->no_pack;
    r->fetch->cbs = *cbs;
    r->fetch->mapped = req->mapped_model_id != NULL;
    r->fetch->prec = req->accept != NULL;
    r->fetch->first_layer = req->first_layer;
    r->fetch->layers = req->layers;
    r->stream = true;
    r->credit = c->credit;
    r->credit_max = c->max_credit;
    r->window = c->window;
    r->n_chunks = (uint32_t)req->n;
    r->ctx = ctx;
    return kvedge_client__submit(c, r);
}
