/* The edge proxy's FETCH state machine: one request is planned over the sources, streamed from
 * them layer by layer, checked block by block, re-planned when a source fails, stalls, lacks a
 * layer or sends a corrupt block, and delivered in layer order, with misses by the deadline.
 * Everything here runs on the actor thread except the upstream callbacks, which only queue. */
#include <czmq.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "access/client_internal.h"
#include "runtime/log.h"
#include "proxy/proxy_impl.h"
#include "proxy/tenant_hint.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"
#include "access/codec/model.h"

/* Blocks at least this large are forwarded in the frame they arrived in (no copy). */
#define S_TAKE_MIN_BYTES   4096
#define S_TOKENS_PER_CHUNK KVEDGE_CHUNK_TOKENS_DEFAULT
#define S_BW_MIN_BYTES     (256u << 10) /* a fetch teaches a source's bandwidth past this */
/* Mid-request re-plan: when a source's throughput over this fetch (at least S_BW_MIN_BYTES)
 * is off its planned bandwidth by more than this factor either way, the layers still queued
 * are re-planned with the measured figure (sources, and precisions under the budget). */
#define S_REPLAN_BW_FACTOR 2.0

/* ---------------------------------------------------------------- state */

typedef struct s_op_t s_op_t;

/* An upstream layer stream; freed by the actor when its DONE event is handled. */
struct s_op_t {
    kvedge_proxy_impl_t *p;
    uint64_t serial; /* the fetch */
    uint32_t layer;  /* offset in the fetch */
    uint32_t gen;    /* the layer's generation when it was opened */
    int src;         /* request-local source index */
    bool mapped;     /* it streams the mapped model's layer (large-small) */
};

enum { S_EV_BLOCK = 1, S_EV_DONE = 2, S_EV_ASKED = 3 /* a LOOKUP's answer: status, hit */ };

struct kvedge_proxy_impl_event_t {
    kvedge_proxy_impl_event_t *next;
    int kind;
    s_op_t *op;
    uint32_t chunk_index;
    uint16_t head;
    int status;
    zframe_t *frame; /* BLOCK with status 0: a copy of the block */
};

enum { L_QUEUED = 0, L_FLIGHT, L_DONE, L_MISS };

typedef struct {
    int state;
    int src;        /* request-local source index, -1 none */
    uint8_t reason; /* kvedge_fetch_reason_t to report */
    uint32_t attempts;
    uint64_t tried; /* bit s: source s was tried for this layer */
    uint32_t gen;
    uint32_t got;      /* blocks received in this generation */
    zframe_t **blocks; /* nchunks x heads */
    uint64_t bytes;
    uint64_t fp16; /* the same blocks' size as fp16 (from their headers) */
    bool mapped;   /* done: its blocks are the mapped model's layer */
    int prec;      /* precision index into the request's accept list; -1: none */
    /* In flight: when its stream was opened, when it last made progress (opened, or a block
     * of it arrived), when it was last let wait for a source still heard from, the silence
     * it is allowed (the stall window), and whether it was opened alone on its source (its
     * first block is then a round trip). */
    int64_t issued_ms, progress_ms, waited_ms, window_ms;
    bool alone;
} s_layer_t;

typedef struct {
    uint64_t serial;
    zframe_t *route;
    uint64_t rid;
    uint32_t credit;
    bool pack;           /* the request asked for packed BLOCK messages */
    int64_t deadline_ms; /* absolute, monotonic */
    bool plan_only;
    kvedge_model_t model;
    uint32_t nchunks;
    kvedge_chunk_id_t *chunks;
    uint16_t first;
    uint32_t L;
    double *compute, *recompute;
    kvedge_plan_request_t req;
    size_t nsrc;
    kvedge_plan_source_t psrc[KVEDGE_PROXY_MAX_SOURCES];
    int map_src[KVEDGE_PROXY_MAX_SOURCES]; /* request source -> proxy source */
    double *bytes[KVEDGE_PROXY_MAX_SOURCES];
    kvedge_client_t *client[KVEDGE_PROXY_MAX_SOURCES];
    uint32_t inflight[KVEDGE_PROXY_MAX_SOURCES];
    /* Per source: its throughput over this fetch, from its first stream to its last layer
     * (several streams share a link, so one stream's own time says little). */
    int64_t first_issue_us[KVEDGE_PROXY_MAX_SOURCES];
    int64_t last_done_us[KVEDGE_PROXY_MAX_SOURCES];
    uint64_t done_bytes[KVEDGE_PROXY_MAX_SOURCES];
    int64_t last_block_ms[KVEDGE_PROXY_MAX_SOURCES]; /* latest block from the source; 0 none */
    kvedge_plan_t *plan, *replan;
    bool going;     /* planned and streaming (s_fetch_go ran) */
    bool held_back; /* the buffer cap kept s_issue from opening a stream it could have */
    /* Large-small: a MAPPED request with a usable map has the mapped model's shape and chain,
     * the map (map->from[edge layer]), and per source and layer offset whether its option is
     * the mapped layer (via) and what that option would send (mbytes, -1: it lacks it).
     * Without a usable map, map is NULL and so are the rows. */
    kvedge_model_t mmodel;
    char mapped_id[KVEDGE_WIRE_MODEL_ID_BYTES];
    kvedge_chunk_id_t *mchunks;
    kvedge_master_map_t *map;
    uint8_t *via[KVEDGE_PROXY_MAX_SOURCES];
    double *mbytes[KVEDGE_PROXY_MAX_SOURCES];
    uint32_t max_heads; /* blocks per chunk a layer's table holds: both models' KV heads */
    /* The cache optimizer (a PREC request without a usable map): the accept list and budget,
     * the quality cost of each layer at each rung ([L][P], the model's profile) and, per
     * source, what it would send per layer and rung ([L][P], -1: it lacks the layer). */
    bool prec_on;
    kvedge_wire_fetch_prec_t pw;
    double *qcost;
    double *pbytes[KVEDGE_PROXY_MAX_SOURCES];
    double dec_us[KVEDGE_PREC_MAX_ACCEPT]; /* per rung: the client's decode µs per byte */
    kvedge_plan_prec_t pp;
    s_layer_t *layer;
    uint32_t next;    /* next layer to deliver */
    zlistx_t *outbox; /* zmsg_t without route, in order */
    uint32_t sent;    /* data messages sent */
    bool ended;
    /* Asking: LOOKUPs still out to sources the directory says nothing of, for layers it lists
     * no holder for; the fetch is planned again and starts once they are answered or at
     * ask_until_ms (monotonic). tokens: the context's, for pricing. */
    uint32_t asking;
    int64_t ask_until_ms;
    uint32_t tokens;
    /* For the Collaboration Monitor: arrival, plan and first data layer (monotonic us), and
     * whether its end was recorded. */
    int64_t start_us, plan_us, first_us;
    bool recorded;
} s_fetch_t;

static void s_stat_add(kvedge_proxy_impl_t *p, uint64_t *field, uint64_t n)
{
    pthread_mutex_lock(&p->stats_mu);
    *field += n;
    pthread_mutex_unlock(&p->stats_mu);
}

/* Whether source s's option for layer offset i is the mapped model's layer. */
static bool s_via(const s_fetch_t *f, int s, uint32_t i)
{
    return s >= 0 && f->via[s] && f->via[s][i];
}

/* The shape of what a stream of the requested (or the mapped) model's layer sends. */
static const kvedge_model_t *s_shape(const s_fetch_t *f, bool mapped)
{
    return mapped ? &f->mmodel : &f->model;
}

/* The mapped model's layer that stands in for layer offset i (map set). */
static uint16_t s_from(const s_fetch_t *f, uint32_t i)
{
    return f->map->from[f->first + i];
}

/* ---------------------------------------------------------------- events */

/* Queues an event for the actor. Only the push onto an empty queue signals the eventfd: the
 * actor reads the eventfd before it takes the whole queue, so an event pushed onto a queue
 * that is not empty is taken with the one that signalled (a stream's blocks come in bursts,
 * one upstream drain at a time: one wakeup per burst, not per block). */
static void s_event_push(kvedge_proxy_impl_t *p, kvedge_proxy_impl_event_t *e)
{
    pthread_mutex_lock(&p->ev_mu);
    bool was_empty = p->ev_head == NULL;
    if (p->ev_tail)
        p->ev_tail->next = e;
    else
        p->ev_head = e;
    p->ev_tail = e;
    pthread_mutex_unlock(&p->ev_mu);
    if (!was_empty)
        return;
    uint64_t one = 1;
    ssize_t w = write(p->ev_fd, &one, sizeof one);
    (void)w; /* a full eventfd counter still wakes the actor */
}

static void s_on_block(void *ctx, uint32_t ci, uint16_t head, int status, const uint8_t *data,
                       size_t len)
{
    s_op_t *op = ctx;
    kvedge_proxy_impl_event_t *e = calloc(1, sizeof *e);
    if (!e)
        return; /* the layer will come up short and be moved */
    e->kind = S_EV_BLOCK;
    e->op = op;
    e->chunk_index = ci;
    e->head = head;
    e->status = status;
    if (status == KVEDGE_OK) {
        /* Forward the received frame itself (it moves into the reply unchanged, after the
         * actor verified it) rather than a copy; small frames may share ZeroMQ's receive
         * buffer, which holding them would keep alive: those are copied. */
        e->frame = len >= S_TAKE_MIN_BYTES ? kvedge_client_block_take_frame() : NULL;
        if (e->frame)
            s_stat_add(op->p, &op->p->stats.forwarded_in_place, 1);
        else
            e->frame = zframe_new(data, len);
        if (!e->frame) {
            free(e);
            return;
        }
    }
    s_event_push(op->p, e);
}

static void s_on_done(void *ctx, int status, uint32_t heads)
{
    (void)heads;
    s_op_t *op = ctx;
    kvedge_proxy_impl_event_t *e = calloc(1, sizeof *e);
    if (!e) {
        free(op); /* lost: the request's deadline still ends it */
        return;
    }
    e->kind = S_EV_DONE;
    e->op = op;
    e->status = status;
    s_event_push(op->p, e);
}

void kvedge_proxy_impl_fetch_asked(kvedge_proxy_impl_t *p, uint64_t serial, int local, int status,
                                   uint32_t hit)
{
    s_op_t *op = calloc(1, sizeof *op);
    kvedge_proxy_impl_event_t *e = op ? calloc(1, sizeof *e) : NULL;
    if (!e) {
        free(op); /* lost: the fetch stops waiting at its ask_until_ms */
        return;
    }
    *op = (s_op_t){p, serial, 0, 0, local, false};
    e->kind = S_EV_ASKED;
    e->op = op;
    e->status = status;
    e->chunk_index = hit;
    s_event_push(p, e);
}

/* A DONE or ASKED event owns its op (a BLOCK event only borrows it), so only those free it. */
void kvedge_proxy_impl_events_free(kvedge_proxy_impl_t *p)
{
    kvedge_proxy_impl_event_t *e = p->ev_head;
    p->ev_head = p->ev_tail = NULL;
    while (e) {
        kvedge_proxy_impl_event_t *next = e->next;
        zframe_destroy(&e->frame);
        if (e->kind != S_EV_BLOCK)
            free(e->op);
        free(e);
        e = next;
    }
}

/* ---------------------------------------------------------------- fetches */

static void s_layer_clear(kvedge_proxy_impl_t *p, s_fetch_t *f, s_layer_t *l)
{
    size_t n = (size_t)f->nchunks * f->max_heads;
    for (size_t i = 0; l->blocks && i < n; i++)
        if (l->blocks[i]) {
            p->buffered -= zframe_size(l->blocks[i]);
            zframe_destroy(&l->blocks[i]);
        }
    l->got = 0;
    l->bytes = 0;
    l->fp16 = 0;
}

/* Block bytes an outbox message holds (a BLOCK message's second frame), else 0. */
static size_t s_block_bytes(zmsg_t *m)
{
    zframe_t *f = zmsg_first(m);
    if (!f || zframe_size(f) < 1 || zframe_data(f)[0] != KVEDGE_FETCH_MSG_BLOCK)
        return 0;
    zframe_t *b = zmsg_next(m);
    return b ? zframe_size(b) : 0;
}

static void s_fetch_free(kvedge_proxy_impl_t *p, s_fetch_t *f)
{
    if (!f)
        return;
    for (uint32_t i = 0; f->layer && i < f->L; i++) {
        s_layer_clear(p, f, &f->layer[i]);
        free(f->layer[i].blocks);
    }
    free(f->layer);
    for (size_t s = 0; s < f->nsrc; s++) {
        free(f->bytes[s]);
        free(f->via[s]);
        free(f->mbytes[s]);
        free(f->pbytes[s]);
    }
    free(f->qcost);
    zmsg_t *m;
    while (f->outbox && (m = zlistx_detach(f->outbox, NULL)) != NULL) {
        p->buffered -= s_block_bytes(m);
        zmsg_destroy(&m);
    }
    zlistx_destroy(&f->outbox);
    zframe_destroy(&f->route);
    free(f->chunks);
    free(f->mchunks);
    free(f->map);
    free(f->compute);
    free(f->recompute);
    free(f->plan);
    free(f->replan);
    free(f);
}

static s_fetch_t *s_fetch_find(kvedge_proxy_impl_t *p, uint64_t serial)
{
    for (s_fetch_t *f = zlistx_first(p->fetches); f; f = zlistx_next(p->fetches))
        if (f->serial == serial)
            return f;
    return NULL;
}

/* Folds each source's throughput over this fetch into its estimate: bytes over the time from
 * its first stream to its last layer, less one round trip. Only transfers big enough to say
 * something about bandwidth count. */
static void s_learn_links(kvedge_proxy_impl_t *p, s_fetch_t *f)
{
    for (size_t s = 0; s < f->nsrc; s++) {
        if (f->done_bytes[s] < S_BW_MIN_BYTES || !f->first_issue_us[s])
            continue;
        double us = (double)(f->last_done_us[s] - f->first_issue_us[s]) - f->psrc[s].rtt_us;
        double floor_us = (double)(f->last_done_us[s] - f->first_issue_us[s]) / 8;
        if (us < floor_us)
            us = floor_us;
        if (us <= 0)
            continue;
        kvedge_proxy_impl_src_learn_bw(p, f->map_src[s], (double)f->done_bytes[s] * 1e6 / us);
    }
}

/* Records how the fetch ended, once. */
static void s_record(kvedge_proxy_impl_t *p, s_fetch_t *f, int status)
{
    if (f->recorded)
        return;
    f->recorded = true;
    int64_t now = kvedge_mono_us();
    kvedge_collab_fetch_t r = {status,
                               f->plan ? f->plan->total_us : 0,
                               (uint64_t)(f->plan_us - f->start_us),
                               f->first_us ? (uint64_t)(f->first_us - f->start_us) : 0,
                               (uint64_t)(now - f->start_us),
                               f->L};
    kvedge_collab_fetch(p->collab, &r);
}

static void s_fetch_remove(kvedge_proxy_impl_t *p, s_fetch_t *f)
{
    s_learn_links(p, f);
    s_record(p, f, KVEDGE_COLLAB_CANCELLED); /* ended ones were recorded already */
    atomic_fetch_sub(&p->fetches_open, 1);
    atomic_store(&p->buffered_now, p->buffered);
    void *h = zlistx_find(p->fetches, f);
    if (h)
        zlistx_detach(p->fetches, h);
    s_fetch_free(p, f);
}

/* Whether m, an outbox message, is a BLOCK message. */
static bool s_is_block(zmsg_t *m)
{
    zframe_t *f = zmsg_first(m);
    return f && zframe_size(f) == KVEDGE_WIRE_FETCH_BLOCK_BYTES &&
           zframe_data(f)[0] == KVEDGE_FETCH_MSG_BLOCK;
}

/* A packed BLOCK message of the BLOCK messages at the head of the outbox, up to
 * KVEDGE_WIRE_MAX_PACK of them and KVEDGE_WIRE_FETCH_PACK_BYTES of blocks (the first
 * whatever its size): their records in f1, their block frames after it, moved, not copied.
 * NULL when the outbox does not start with a BLOCK message. Sets *k to the blocks taken. */
static zmsg_t *s_pack(kvedge_proxy_impl_t *p, s_fetch_t *f, uint32_t *k)
{
    uint8_t recs[KVEDGE_WIRE_MAX_PACK * KVEDGE_WIRE_FETCH_BLOCK_BYTES];
    zmsg_t *blocks = zmsg_new(), *m;
    size_t bytes = 0;
    *k = 0;
    while (*k < KVEDGE_WIRE_MAX_PACK && (m = zlistx_first(f->outbox)) != NULL && s_is_block(m)) {
        size_t len = s_block_bytes(m);
        if (*k > 0 && bytes + len > KVEDGE_WIRE_FETCH_PACK_BYTES)
            break;
        zlistx_detach(f->outbox, NULL);
        zframe_t *rec = zmsg_pop(m), *blk;
        memcpy(recs + (size_t)*k * KVEDGE_WIRE_FETCH_BLOCK_BYTES, zframe_data(rec),
               KVEDGE_WIRE_FETCH_BLOCK_BYTES);
        zframe_destroy(&rec);
        while ((blk = zmsg_pop(m)) != NULL)
            zmsg_append(blocks, &blk);
        zmsg_destroy(&m);
        p->buffered -= len; /* a block leaves the buffer */
        bytes += len;
        (*k)++;
    }
    if (*k == 0) {
        zmsg_destroy(&blocks);
        return NULL;
    }
    zmsg_pushmem(blocks, recs, (size_t)*k * KVEDGE_WIRE_FETCH_BLOCK_BYTES);
    return blocks;
}

/* Sends what the client has credit for (one credit per message, packed or not); ends the
 * fetch when all is out. */
static void s_pump(kvedge_proxy_impl_t *p, s_fetch_t *f)
{
    zmsg_t *m;
    while (f->credit > 0 && zlistx_first(f->outbox) != NULL) {
        uint32_t k = 1;
        m = f->pack ? s_pack(p, f, &k) : NULL;
        if (!m) {
            m = zlistx_detach(f->outbox, NULL);
            p->buffered -= s_block_bytes(m); /* a block leaves the buffer */
            k = 1;
        }
        zmsg_t *out = zmsg_new();
        zframe_t *h = kvedge_proxy_impl_header(
            KVEDGE_OP_FETCH, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_MORE, f->rid, 0, k);
        zmsg_append(out, &h);
        zframe_t *fr;
        while ((fr = zmsg_pop(m)) != NULL)
            zmsg_append(out, &fr);
        zmsg_destroy(&m);
        kvedge_proxy_impl_send(p, f->route, &out);
        f->credit--;
        f->sent++;
    }
    if (f->ended && zlistx_size(f->outbox) == 0) {
        zmsg_t *end = zmsg_new();
        zframe_t *h = kvedge_proxy_impl_header(
            KVEDGE_OP_FETCH, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_END, f->rid, 0, f->sent);
        zmsg_append(end, &h);
        kvedge_proxy_impl_send(p, f->route, &end);
        s_fetch_remove(p, f);
    }
}

static void s_issue(kvedge_proxy_impl_t *p, s_fetch_t *f);

/* Whether streams the buffer cap held back may open now: room came back, or the layer to
 * deliver next is among them (the cap never holds that one back, and the layers buffered
 * behind it wait for it, so waiting for room would wait for the deadline). */
static bool s_held_can_go(const kvedge_proxy_impl_t *p, const s_fetch_t *f)
{
    return f->held_back && f->going && !f->ended &&
           (p->buffered < p->opts.buffer_bytes ||
            (f->next < f->L && f->layer[f->next].state == L_QUEUED));
}

/* Queues every layer that is complete (or missed), in layer order. */
static void s_deliver(kvedge_proxy_impl_t *p, s_fetch_t *f)
{
    while (f->next < f->L) {
        s_layer_t *l = &f->layer[f->next];
        if (l->state != L_DONE && l->state != L_MISS)
            break;
        uint16_t layer = (uint16_t)(f->first + f->next);
        uint32_t heads = 0;
        /* A mapped layer: the mapped model's blocks (its heads), under the requested layer. */
        bool mapped = l->state == L_DONE && l->mapped;
        uint32_t H = s_shape(f, mapped)->kv_heads;
        if (l->state == L_DONE) {
            for (uint32_t i = 0; i < f->nchunks * H; i++) {
                kvedge_wire_fetch_block_t b = {(uint8_t)l->src, layer, i / H, (uint16_t)(i % H), 0};
                uint8_t rec[KVEDGE_WIRE_FETCH_BLOCK_BYTES];
                kvedge_wire_fetch_block_pack(&b, rec);
                zmsg_t *m = zmsg_new();
                zmsg_addmem(m, rec, sizeof rec);
                zmsg_append(m, &l->blocks[i]); /* ownership moves; bytes stay "buffered" */
                zlistx_add_end(f->outbox, m);
                heads++;
            }
            s_stat_add(p, &p->stats.layers, 1);
            s_stat_add(p, &p->stats.bytes, l->bytes);
            if (!f->first_us)
                f->first_us = kvedge_mono_us();
            kvedge_collab_layer(p->collab, f->map_src[l->src], f->psrc[l->src].kind, l->reason,
                                l->bytes);
            if (mapped) {
                s_stat_add(p, &p->stats.mapped_layers, 1);
                kvedge_collab_mapped(p->collab);
            }
        } else {
            s_stat_add(p, &p->stats.misses, 1);
            kvedge_collab_layer(p->collab, -1, KVEDGE_PLAN_LOCAL, l->reason, 0);
        }
        kvedge_wire_fetch_layer_t rec = {
            .reason = l->reason,
            .layer = layer,
            .source = (int16_t)(l->state == L_DONE ? l->src : -1),
            .status = l->state == L_DONE ? KVEDGE_OK : KVEDGE_ENOTFOUND,
            .heads = heads,
            .attempts = l->attempts,
            .from_layer = mapped ? s_from(f, f->next) : KVEDGE_WIRE_FETCH_OWN_LAYER,
            .prec = l->state == L_DONE && f->prec_on && l->prec >= 0 ? f->pw.accept[l->prec]
                                                                     : KVEDGE_PREC_STORED,
        };
        uint8_t buf[KVEDGE_WIRE_FETCH_LAYER_BYTES];
        kvedge_wire_fetch_layer_pack(&rec, buf);
        zmsg_t *m = zmsg_new();
        zmsg_addmem(m, buf, sizeof buf);
        zlistx_add_end(f->outbox, m);
        kvedge_log_debug("fetch %llu layer %u: %s (%s)%s", (unsigned long long)f->serial, layer,
                         l->state == L_DONE ? f->psrc[l->src].name : "-",
                         kvedge_fetch_reason_name(l->reason), mapped ? " mapped" : "");
        f->next++;
    }
    if (f->next == f->L && !f->ended) {
        f->ended = true;
        s_record(p, f, KVEDGE_OK);
    }
    /* The new next layer may be one the cap held back (it was not next when s_issue ran). */
    if (s_held_can_go(p, f))
        s_issue(p, f);
    atomic_store(&p->buffered_now, p->buffered);
    s_pump(p, f);
}

/* ---------------------------------------------------------------- failover */

/* The set of layers (bitmap over offsets) moves off their source: each goes to the source
 * a re-plan picks for it, or becomes a miss when none is left. */
static void s_reassign(kvedge_proxy_impl_t *p, s_fetch_t *f, const uint8_t *set, uint8_t reason,
                       int failed)
{
    int rc =
        kvedge_plan_replan_prec(&f->req, f->prec_on ? &f->pp : NULL, f->psrc, f->nsrc, f->plan,
                                f->next, failed >= 0 ? failed : KVEDGE_PLAN_SRC_NONE, f->replan);
    for (uint32_t i = f->next; i < f->L; i++) {
        if (!(set[i / 8] >> (i % 8) & 1))
            continue;
        s_layer_t *l = &f->layer[i];
        int ns = rc == KVEDGE_OK ? f->replan->layer[i].source : -1;
        if (ns >= 0 && (l->tried >> ns & 1))
            ns = -1;
        s_stat_add(p, &p->stats.fallbacks, 1);
        if (ns < 0) {
            l->state = L_MISS;
            l->src = -1;
            /* Planned as recomputation, cheaper than the sources left (the failed one is
             * down in the re-plan; a source that lacked the layer is not, so only a failure
             * tells), or nobody has it. */
            l->reason = rc == KVEDGE_OK && reason == KVEDGE_FETCH_FALLBACK_FAILED &&
                                f->replan->layer[i].source == KVEDGE_PLAN_SRC_RECOMPUTE &&
                                f->replan->layer[i].reason == KVEDGE_PLAN_RECOMPUTE_FASTER
                            ? KVEDGE_FETCH_RECOMPUTE
                            : KVEDGE_FETCH_MISS;
        } else {
            l->state = L_QUEUED;
            l->src = ns;
            l->reason = reason;
            l->prec = f->replan->layer[i].prec;
        }
        /* The plan keeps the current assignment: a later re-plan counts what was delivered at
         * the precision it was delivered at. */
        if (rc == KVEDGE_OK)
            f->plan->layer[i] = f->replan->layer[i];
    }
}

/* Source s delivered a layer of a request with a precision choice: when its throughput over
 * this fetch so far is off the bandwidth the plan used by more than S_REPLAN_BW_FACTOR, the
 * layers not yet asked for are re-planned with the measured bandwidth: each may move to
 * another source or rung, or to recomputation. Layers up to the first one still queued
 * (delivered, here, in flight or missed) keep what they have and count against the budget as
 * planned (kvedge_plan_replan_prec's delivered prefix); the re-plan is skipped when a layer
 * past that point is already in flight (several sources interleaving). */
static void s_bw_replan(kvedge_proxy_impl_t *p, s_fetch_t *f, int s)
{
    /* Requests with a precision choice only: what a layer costs in time then decides its
     * rung, so a wrong bandwidth means a wrong rung. Other requests keep their plan (a source
     * failing or stalling still re-plans them). */
    if (!f->prec_on || f->done_bytes[s] < S_BW_MIN_BYTES || !f->first_issue_us[s] || !f->psrc[s].up)
        return;
    double us = (double)(f->last_done_us[s] - f->first_issue_us[s]) - f->psrc[s].rtt_us;
    if (us <= 0)
        return;
    double bw = (double)f->done_bytes[s] * 1e6 / us, was = f->psrc[s].bw_bytes_per_s;
    if (!(bw > 0) || (bw <= was * S_REPLAN_BW_FACTOR && bw * S_REPLAN_BW_FACTOR >= was))
        return;
    uint32_t k = f->next;
    while (k < f->L && f->layer[k].state != L_QUEUED)
        k++;
    if (k == f->L)
        return; /* nothing left to decide */
    for (uint32_t i = k; i < f->L; i++)
        if (f->layer[i].state == L_FLIGHT || f->layer[i].state == L_DONE)
            return;
    f->psrc[s].bw_bytes_per_s = bw;
    if (kvedge_plan_replan_prec(&f->req, f->prec_on ? &f->pp : NULL, f->psrc, f->nsrc, f->plan, k,
                                KVEDGE_PLAN_SRC_NONE, f->replan) != KVEDGE_OK)
        return;
    uint32_t moved = 0;
    for (uint32_t i = k; i < f->L; i++) {
        s_layer_t *l = &f->layer[i];
        const kvedge_plan_layer_t *r = &f->replan->layer[i];
        if (l->state != L_QUEUED)
            continue; /* a planned recompute stays one: it costs no quality */
        int q = f->prec_on ? r->prec : -1;
        if (r->source == l->src && q == l->prec)
            continue;
        if (r->source >= 0 && (l->tried >> r->source & 1))
            continue; /* never back to a source that failed it */
        moved++;
        if (r->source < 0) {
            l->state = L_MISS;
            l->src = -1;
            l->reason = KVEDGE_FETCH_RECOMPUTE;
        } else {
            l->src = r->source;
            l->prec = q;
            l->reason = KVEDGE_FETCH_REPLAN_BANDWIDTH;
        }
        f->plan->layer[i] = *r;
    }
    kvedge_log_debug("fetch %llu: %s measured %.3g MB/s (planned %.3g): %u of layers %u.. "
                     "re-planned",
                     (unsigned long long)f->serial, f->psrc[s].name, bw / 1e6, was / 1e6, moved, k);
    if (moved)
        s_stat_add(p, &p->stats.replans, 1);
}

/* Source s failed for this request (error, stall, protocol): every layer still on it moves. */
static void s_source_failed(kvedge_proxy_impl_t *p, s_fetch_t *f, int s, int err)
{
    if (!f->psrc[s].up)
        return;
    kvedge_health_failure(p->health, f->psrc[s].name, (uint64_t)kvedge_mono_ms(),
                          err < 0 ? err : KVEDGE_EIO);
    s_stat_add(p, &p->stats.source_failures, 1);
    kvedge_log_warn("source %s failed (%s): re-planning its layers", f->psrc[s].name,
                    kvedge_strerror(err));
    f->psrc[s].up = false;
    uint8_t set[KVEDGE_PLAN_MAX_LAYERS / 8] = {0};
    for (uint32_t i = f->next; i < f->L; i++) {
        s_layer_t *l = &f->layer[i];
        if (l->src == s && (l->state == L_QUEUED || l->state == L_FLIGHT)) {
            s_layer_clear(p, f, l);
            l->gen++;
            l->tried |= 1ull << s;
            l->state = L_QUEUED;
            set[i / 8] |= (uint8_t)(1u << (i % 8));
        }
    }
    s_reassign(p, f, set, KVEDGE_FETCH_FALLBACK_FAILED, s);
}

/* The negative cache's key for "layer of this chain": the last chunk id names the whole
 * chain (ids are chained), then the layer. */
#define S_NEG_KEY_BYTES (KVEDGE_CHUNK_ID_BYTES + 2)
static void s_neg_key(const kvedge_chunk_id_t *chain, uint32_t n, uint32_t layer,
                      uint8_t key[S_NEG_KEY_BYTES])
{
    memcpy(key, chain[n - 1].bytes, KVEDGE_CHUNK_ID_BYTES);
    key[KVEDGE_CHUNK_ID_BYTES] = (uint8_t)(layer >> 8);
    key[KVEDGE_CHUNK_ID_BYTES + 1] = (uint8_t)layer;
}

/* The chain and the layer number a stream for layer offset i asks for. */
static const kvedge_chunk_id_t *s_stream_of(const s_fetch_t *f, bool mapped, uint32_t i,
                                            uint16_t *layer)
{
    *layer = mapped ? s_from(f, i) : (uint16_t)(f->first + i);
    return mapped ? f->mchunks : f->chunks;
}

/* What source s sends for layer offset i: at the planned precision for a PREC request. */
static double s_layer_bytes(const s_fetch_t *f, int s, uint32_t i)
{
    int q = f->layer[i].prec;
    if (f->prec_on && q >= 0)
        return f->pbytes[s][(size_t)i * f->pw.n + (size_t)q];
    return f->bytes[s][i];
}

/* The accept list a layer's stream asks for: its planned rung first, then every other rung
 * of the request's list that cost no more quality at this layer, send no more bytes, and which
 * the source has not yet failed to serve (a node that can neither hold nor derive the planned
 * rung may serve one of them; none can take the request over its budget or its plan's time).
 * A finer rung is never listed: a node serves a rung it holds before deriving one, so listing
 * a held lossless block would bring it instead of the planned rung. Returns how many. */
static size_t s_layer_accept(const s_fetch_t *f, int s, uint32_t i, kvedge_prec_t *out)
{
    int q = f->layer[i].prec;
    size_t n = 0, P = f->pw.n;
    out[n++] = f->pw.accept[q];
    double qb = f->pbytes[s][i * P + (size_t)q];
    for (size_t r = 0; r < P; r++)
        if ((int)r != q && f->qcost[i * P + r] <= f->qcost[i * P + (size_t)q] &&
            f->pbytes[s][i * P + r] >= 0 && f->pbytes[s][i * P + r] <= qb)
            out[n++] = f->pw.accept[r];
    return n;
}

/* Layer i is not (or not intact) at its source: remember it, move the layer. A source that
 * lacked the requested model's layer but may hold the mapped one offers that one next. */
static void s_layer_failed(kvedge_proxy_impl_t *p, s_fetch_t *f, uint32_t i, uint8_t reason)
{
    s_layer_t *l = &f->layer[i];
    int s = l->src;
    bool mapped = s_via(f, s, i);
    /* Missing at the rungs a precision request asked for says nothing of the others: those
     * rungs are out for this source and layer, the source stays a candidate at the rest (at
     * most P such rounds), and nothing goes to the negative cache. */
    bool rungs_only = f->prec_on && l->prec >= 0 && reason == KVEDGE_FETCH_FALLBACK_MISSING;
    if (rungs_only) {
        kvedge_prec_t acc[KVEDGE_PREC_MAX_ACCEPT];
        size_t nacc = s_layer_accept(f, s, i, acc), P = f->pw.n;
        for (size_t a = 0; a < nacc; a++)
            for (size_t r = 0; r < P; r++)
                if (f->pw.accept[r] == acc[a])
                    f->pbytes[s][(size_t)i * P + r] = -1;
    } else {
        uint16_t layer;
        const kvedge_chunk_id_t *chain = s_stream_of(f, mapped, i, &layer);
        uint8_t key[S_NEG_KEY_BYTES];
        s_neg_key(chain, f->nchunks, layer, key);
        kvedge_negcache_add(p->neg, f->psrc[s].name, key, sizeof key, (uint64_t)kvedge_mono_ms(),
                            0);
        if (reason == KVEDGE_FETCH_FALLBACK_CORRUPT)
            kvedge_health_failure(p->health, f->psrc[s].name, (uint64_t)kvedge_mono_ms(),
                                  KVEDGE_ECORRUPT);
    }
    s_layer_clear(p, f, l);
    l->gen++;
    if (rungs_only) {
        /* the planner's view is the rungs marked above */
    } else if (!mapped && reason == KVEDGE_FETCH_FALLBACK_MISSING && f->mbytes[s] &&
               f->mbytes[s][i] >= 0) {
        f->via[s][i] = 1; /* s stays a candidate, for the mapped layer */
        f->bytes[s][i] = f->mbytes[s][i];
    } else {
        l->tried |= 1ull << s;
        f->bytes[s][i] = -1; /* the planner's view: s does not hold it */
        if (f->mbytes[s])
            f->mbytes[s][i] = -1;
    }
    uint8_t set[KVEDGE_PLAN_MAX_LAYERS / 8] = {0};
    set[i / 8] = (uint8_t)(1u << (i % 8));
    s_reassign(p, f, set, reason, -1);
}

/* ---------------------------------------------------------------- streams */

/* How many layer streams source s may have open: enough to cover its bandwidth-delay
 * product, at least 2. */
static uint32_t s_window(const s_fetch_t *f, int s, double layer_bytes)
{
    double bdp = f->psrc[s].bw_bytes_per_s * f->psrc[s].rtt_us / 1e6;
    double w = 1 + ceil(bdp / (layer_bytes > 1 ? layer_bytes : 1));
    if (w < 2)
        w = 2;
    return w > KVEDGE_PROXY_WINDOW_MAX ? KVEDGE_PROXY_WINDOW_MAX : (uint32_t)w;
}

/* Opens layer streams on every source that has room, lowest layers first. The buffer cap
 * holds back every layer but the next one to deliver: the layers buffered behind it are
 * freed only once it is delivered, so a full buffer must never keep it (re-planned after
 * its source failed) from being fetched again, or the request would wait to its deadline
 * and miss what another replica holds. */
static void s_issue(kvedge_proxy_impl_t *p, s_fetch_t *f)
{
    int64_t now = kvedge_mono_ms();
    int64_t left = f->deadline_ms - KVEDGE_PROXY_DEADLINE_MARGIN_MS - now;
    uint64_t cap = p->opts.buffer_bytes;
    bool again = true;
    f->held_back = false;
    while (again) {
        again = false;
        for (size_t s = 0; s < f->nsrc; s++) {
            if (!f->psrc[s].up)
                continue;
            for (uint32_t i = f->next; i < f->L && left > 0; i++) {
                s_layer_t *l = &f->layer[i];
                if (l->state != L_QUEUED || l->src != (int)s)
                    continue;
                if (p->buffered >= cap && i != f->next) {
                    f->held_back = true;
                    break;
                }
                double lb = s_layer_bytes(f, (int)s, i);
                if (f->inflight[s] >= s_window(f, (int)s, lb))
                    break;
                /* The stream may stay silent FACTOR x (a round trip as the link's measured
                 * variability allows it, its transfer and the ones ahead of it); every block
                 * restarts that window (kvedge_proxy_impl_fetch_deadlines). */
                double ahead_us = 0;
                for (uint32_t j = f->next; j < f->L; j++)
                    if (f->layer[j].state == L_FLIGHT && f->layer[j].src == (int)s)
                        ahead_us += s_layer_bytes(f, (int)s, j) * 1e6 / f->psrc[s].bw_bytes_per_s;
                double rto_us = kvedge_health_rto_ms(p->health, f->psrc[s].name) * 1e3;
                double rt_us = rto_us > f->psrc[s].rtt_us ? rto_us : f->psrc[s].rtt_us;
                double est_us = rt_us + ahead_us + lb * 1e6 / f->psrc[s].bw_bytes_per_s;
                int64_t stall = (int64_t)(KVEDGE_PROXY_STALL_FACTOR * est_us / 1e3);
                if (stall < (int64_t)p->opts.stall_min_ms)
                    stall = p->opts.stall_min_ms;
                s_op_t *op = calloc(1, sizeof *op);
                if (!op)
                    return;
                bool mapped = s_via(f, (int)s, i);
                *op = (s_op_t){p, f->serial, i, l->gen, (int)s, mapped};
                uint16_t layer;
                const kvedge_chunk_id_t *chain = s_stream_of(f, mapped, i, &layer);
                kvedge_prec_t acc[KVEDGE_PREC_MAX_ACCEPT];
                size_t nacc = f->prec_on && l->prec >= 0 ? s_layer_accept(f, (int)s, i, acc) : 0;
                /* The stream itself may run to the request's deadline: stalls are judged by
                 * silence here, not by its length. */
                int rc = kvedge_client_get_layer_prec_async(f->client[s], chain, f->nchunks, layer,
                                                            nacc ? acc : NULL, nacc, (int)left,
                                                            s_on_block, s_on_done, op);
                if (rc != KVEDGE_OK) {
                    free(op);
                    s_source_failed(p, f, (int)s, rc);
                    again = true;
                    break;
                }
                l->state = L_FLIGHT;
                l->attempts++;
                l->issued_ms = l->progress_ms = l->waited_ms = now;
                l->window_ms = stall;
                l->alone = f->inflight[s] == 0;
                if (f->inflight[s]++ == 0 && !f->first_issue_us[s])
                    f->first_issue_us[s] = zclock_usecs();
            }
        }
    }
}

/* ---------------------------------------------------------------- upstream events */

static void s_asked(kvedge_proxy_impl_t *p, s_fetch_t *f, int s, int status, uint32_t hit);

static void s_event(kvedge_proxy_impl_t *p, kvedge_proxy_impl_event_t *e)
{
    s_op_t *op = e->op;
    s_fetch_t *f = s_fetch_find(p, op->serial);
    if (e->kind == S_EV_ASKED) {
        if (f && f->asking)
            s_asked(p, f, op->src, e->status, e->chunk_index);
        free(op);
        free(e);
        return;
    }
    if (f && e->status == KVEDGE_ENOTFOUND) { /* held, says the directory: another tenant? */
        uint16_t layer;
        const kvedge_chunk_id_t *chain = s_stream_of(f, op->mapped, op->layer, &layer);
        kvedge_proxy_tenant_hint(p, f->psrc[op->src].name, chain, f->nchunks, layer);
    }
    /* What the stream carries: the requested model's layer, or the mapped model's. */
    const kvedge_model_t *shape = f ? s_shape(f, op->mapped) : NULL;
    if (e->kind == S_EV_DONE) {
        if (f) {
            f->inflight[op->src]--;
            s_layer_t *l = &f->layer[op->layer];
            uint32_t want = f->nchunks * shape->kv_heads;
            if (l->gen == op->gen && l->state == L_FLIGHT) {
                if (e->status == KVEDGE_OK && l->got == want) {
                    l->state = L_DONE;
                    l->mapped = op->mapped;
                    f->done_bytes[op->src] += l->bytes;
                    f->last_done_us[op->src] = zclock_usecs();
                    kvedge_health_success(p->health, f->psrc[op->src].name,
                                          (uint64_t)kvedge_mono_ms());
                    /* Learn what this source sends per fp16 byte, for the next plans. */
                    kvedge_proxy_impl_src_t *src = &p->src[f->map_src[op->src]];
                    if (l->fp16 > 0 && !f->prec_on)
                        src->ratio = 0.5 * src->ratio + 0.5 * (double)l->bytes / (double)l->fp16;
                    s_bw_replan(p, f, op->src);
                } else if (e->status == KVEDGE_OK || e->status == KVEDGE_ENOTFOUND ||
                           e->status == KVEDGE_ESHAPE) {
                    /* Short, or ended at once because the node knows no chunk of the chain
                     * (ENOTFOUND) or no such layer (ESHAPE): the layer is not there, the
                     * source is fine. */
                    s_layer_failed(p, f, op->layer, KVEDGE_FETCH_FALLBACK_MISSING);
                } else {
                    s_source_failed(p, f, op->src, e->status);
                }
            }
            s_issue(p, f);
            s_deliver(p, f);
        }
        free(op);
        free(e);
        return;
    }
    /* A block. */
    if (!f || f->layer[op->layer].gen != op->gen || f->layer[op->layer].state != L_FLIGHT) {
        zframe_destroy(&e->frame);
        free(e);
        return;
    }
    s_layer_t *l = &f->layer[op->layer];
    uint32_t H = shape->kv_heads;
    bool moved = true;
    if (e->status != KVEDGE_OK) {
        s_layer_failed(p, f, op->layer,
                       e->status == KVEDGE_ECORRUPT ? KVEDGE_FETCH_FALLBACK_CORRUPT
                                                    : KVEDGE_FETCH_FALLBACK_MISSING);
    } else {
        kvedge_block_info_t info;
        size_t idx = (size_t)e->chunk_index * H + e->head;
        int rc = e->chunk_index < f->nchunks && e->head < H
                     ? kvedge_block_parse(zframe_data(e->frame), zframe_size(e->frame), &info)
                     : KVEDGE_EPROTO;
        if (rc == KVEDGE_OK && (info.head_dim != shape->head_dim || l->blocks[idx]))
            rc = KVEDGE_ECORRUPT;
        if (rc != KVEDGE_OK) {
            s_stat_add(p, &p->stats.corrupt, 1);
            kvedge_log_warn("source %s sent a bad block (layer %u%s chunk %u head %u): %s",
                            f->psrc[op->src].name, f->first + op->layer,
                            op->mapped ? " mapped" : "", e->chunk_index, e->head,
                            kvedge_strerror(rc));
            s_layer_failed(p, f, op->layer, KVEDGE_FETCH_FALLBACK_CORRUPT);
        } else {
            int64_t now = kvedge_mono_ms();
            if (l->got == 0 && l->alone) /* request to first block, nothing ahead of it */
                kvedge_health_rtt(p->health, f->psrc[op->src].name, (uint64_t)now,
                                  (double)(now - l->issued_ms) * 1e3);
            l->progress_ms = now;
            f->last_block_ms[op->src] = now;
            p->buffered += zframe_size(e->frame);
            l->bytes += zframe_size(e->frame);
            l->fp16 += kvedge_block_fp16_bytes(info.tokens, info.head_dim);
            l->blocks[idx] = e->frame;
            e->frame = NULL;
            l->got++;
            moved = false;
        }
    }
    zframe_destroy(&e->frame);
    free(e);
    /* A stored block changes nothing else; a moved layer may open streams or end a fetch. */
    if (moved) {
        s_issue(p, f);
        s_deliver(p, f);
    }
}

void kvedge_proxy_impl_fetch_events(kvedge_proxy_impl_t *p)
{
    uint64_t v;
    ssize_t r = read(p->ev_fd, &v, sizeof v);
    (void)r;
    pthread_mutex_lock(&p->ev_mu);
    kvedge_proxy_impl_event_t *e = p->ev_head;
    p->ev_head = p->ev_tail = NULL;
    pthread_mutex_unlock(&p->ev_mu);
    while (e) {
        kvedge_proxy_impl_event_t *next = e->next;
        s_event(p, e);
        e = next;
    }
}

static void s_fetch_go(kvedge_proxy_impl_t *p, s_fetch_t *f);
static bool s_ask(kvedge_proxy_impl_t *p, s_fetch_t *f);

/* Whether source s, silent on a stream of f, is still heard from: its pings answered within
 * the stream's window and one probe interval. Such a source is slow on this connection (a
 * retransmission backing off, a jittery link), not gone. */
static bool s_heard(kvedge_proxy_impl_t *p, s_fetch_t *f, int s, const s_layer_t *l, int64_t now)
{
    kvedge_health_info_t info;
    return kvedge_health_get(p->health, f->psrc[s].name, (uint64_t)now, &info) == KVEDGE_OK &&
           info.last_heard_ms &&
           now - (int64_t)info.last_heard_ms <= l->window_ms + KVEDGE_PROXY_PROBE_MS;
}

/* Streams silent past their window (no block of theirs or of their source's other streams
 * for that long) stall their source: it fails for this fetch (its layers move) and counts a
 * timeout against its health. A source still heard from is waited for, a window at a time, up
 * to STALL_FACTOR windows of silence. Returns whether layers moved (then f may have ended and
 * been freed). */
static bool s_watch(kvedge_proxy_impl_t *p, s_fetch_t *f, int64_t now)
{
    bool moved = false;
    for (uint32_t i = f->next; i < f->L; i++) {
        s_layer_t *l = &f->layer[i];
        if (l->state != L_FLIGHT || l->src < 0)
            continue;
        int64_t progress = l->progress_ms;
        if (f->last_block_ms[l->src] > progress)
            progress = f->last_block_ms[l->src];
        int64_t since = l->waited_ms > progress ? l->waited_ms : progress;
        if (now - since <= l->window_ms)
            continue;
        if (now - progress <= KVEDGE_PROXY_STALL_FACTOR * l->window_ms &&
            s_heard(p, f, l->src, l, now)) {
            kvedge_log_debug("fetch %llu layer %u: %s silent for %lld ms (window %lld ms) but "
                             "answering pings: waiting",
                             (unsigned long long)f->serial, f->first + i, f->psrc[l->src].name,
                             (long long)(now - progress), (long long)l->window_ms);
            l->waited_ms = now;
            continue;
        }
        s_source_failed(p, f, l->src, KVEDGE_ETIMEDOUT);
        moved = true;
    }
    if (moved) {
        s_issue(p, f);
        s_deliver(p, f);
    }
    return moved;
}

static void s_parked_tick(kvedge_proxy_impl_t *p, int64_t now);

/* Stalled streams are judged (s_watch); layers not delivered by the deadline (less the
 * margin) are reported as misses; a fetch still asking past its ask_until_ms starts with what
 * it learned. */
void kvedge_proxy_impl_fetch_deadlines(kvedge_proxy_impl_t *p)
{
    int64_t now = kvedge_mono_ms();
    s_parked_tick(p, now);
    s_fetch_t *f = zlistx_first(p->fetches);
    while (f) {
        s_fetch_t *next = zlistx_next(p->fetches);
        if (f->asking) {
            if (now >= f->ask_until_ms) { /* what was answered is known; the rest is not */
                kvedge_log_debug("fetch %llu: %u LOOKUPs unanswered, planning without them",
                                 (unsigned long long)f->serial, f->asking);
                f->asking = 0;
                s_fetch_go(p, f);
            }
        } else if (!f->ended && now < f->deadline_ms - KVEDGE_PROXY_DEADLINE_MARGIN_MS &&
                   s_watch(p, f, now)) {
            f = next;
            continue;
        } else if (s_held_can_go(p, f) && now < f->deadline_ms - KVEDGE_PROXY_DEADLINE_MARGIN_MS) {
            s_issue(p, f); /* what the buffer cap held back: it may go now */
        } else if (!f->ended && now >= f->deadline_ms - KVEDGE_PROXY_DEADLINE_MARGIN_MS) {
            for (uint32_t i = f->next; i < f->L; i++) {
                s_layer_t *l = &f->layer[i];
                if (l->state == L_DONE || l->state == L_MISS)
                    continue;
                s_layer_clear(p, f, l);
                l->gen++;
                l->state = L_MISS;
                l->src = -1;
                l->reason = KVEDGE_FETCH_MISS_DEADLINE;
            }
            s_deliver(p, f);
        } else if (now >= f->deadline_ms + KVEDGE_PROXY_DEADLINE_MARGIN_MS) {
            s_fetch_remove(p, f); /* the client stopped granting credit: drop what is left */
        }
        f = next;
    }
}

/* ---------------------------------------------------------------- planning */

/* Does source s (proxy index) hold layer `layer` of every chunk? From the master's block
 * directory when the source is a registered node, and the negative cache in any case. */
static bool s_holds(kvedge_proxy_impl_t *p, const kvedge_proxy_impl_src_t *s, bool in_registry,
                    const kvedge_chunk_id_t *chain, uint32_t n, uint32_t layer)
{
    uint8_t key[S_NEG_KEY_BYTES];
    s_neg_key(chain, n, layer, key);
    if (kvedge_negcache_contains(p->neg, s->conf.name, key, sizeof key, (uint64_t)kvedge_mono_ms()))
        return false;
    if (!in_registry)
        return true; /* no directory for it: assume yes, learn otherwise */
    for (uint32_t c = 0; c < n; c++) {
        kvedge_master_dir_t d;
        if (kvedge_mview_dir(p->view, s->conf.name, &chain[c], &d) != KVEDGE_OK ||
            !kvedge_master_dir_has(&d, layer))
            return false;
    }
    return true;
}

/* Whether s is a registered node whose directory says nothing of some chunk of the chain, or
 * lists one without some of the layers wanted (layers[0..nl)): the directory lags what a node
 * holds (it is published every few hundred ms), so a node it does not list for a chunk may
 * still hold it, and a record published while a prefill was still storing the chunk lists
 * only the layers stored by then. */
static bool s_unlisted(kvedge_proxy_impl_t *p, const kvedge_proxy_impl_src_t *s,
                       const kvedge_chunk_id_t *chain, uint32_t n, const uint16_t *layers,
                       uint32_t nl)
{
    kvedge_master_node_t rec;
    if (!p->view || kvedge_mview_node(p->view, s->conf.name, &rec) != KVEDGE_OK)
        return false;
    for (uint32_t c = 0; c < n; c++) {
        kvedge_master_dir_t d;
        if (kvedge_mview_dir(p->view, s->conf.name, &chain[c], &d) != KVEDGE_OK)
            return true;
        for (uint32_t i = 0; i < nl; i++)
            if (!kvedge_master_dir_has(&d, layers[i]))
                return true;
    }
    return false;
}

/* Whether the directory lets source s serve rung `rung` of every chunk of the chain (held,
 * or derivable by a node that derives); true without a directory, or when it says nothing. */
static bool s_serves(kvedge_proxy_impl_t *p, const kvedge_proxy_impl_src_t *s, bool in_registry,
                     const kvedge_chunk_id_t *chain, uint32_t n, kvedge_prec_t rung)
{
    if (!in_registry)
        return true;
    for (uint32_t c = 0; c < n; c++) {
        kvedge_master_dir_t d;
        if (kvedge_mview_dir(p->view, s->conf.name, &chain[c], &d) == KVEDGE_OK &&
            !kvedge_master_dir_serves(&d, rung))
            return false;
    }
    return true;
}

/* Builds the request's source table: every known source, priced per layer (Eq. 19 inputs:
 * its link, and the bytes it would send: the fp16 size times what it was seen to send per
 * fp16 byte). Sources not connected, down, or not holding a layer are marked so. With a map,
 * a source that lacks the requested model's layer e but holds the mapped model's layer
 * from[e] offers that one, priced by its bytes; one that holds both offers the exact layer. */
static void s_fetch_sources(kvedge_proxy_impl_t *p, s_fetch_t *f, uint32_t tokens)
{
    uint64_t now = (uint64_t)kvedge_mono_ms();
    double fp16 = (double)tokens * f->model.kv_heads * f->model.head_dim * 2 /* K, V */ * 2;
    double mfp16 = (double)tokens * f->mmodel.kv_heads * f->mmodel.head_dim * 2 * 2;
    size_t n = atomic_load(&p->nsrc);
    f->nsrc = 0;
    for (size_t i = 0; i < n && f->nsrc < KVEDGE_PROXY_MAX_SOURCES; i++) {
        pthread_mutex_lock(&p->srcs_mu);
        kvedge_proxy_impl_src_t *s = &p->src[i];
        kvedge_client_t *c = s->client;
        pthread_mutex_unlock(&p->srcs_mu);
        double *b = calloc(f->L, sizeof *b), *mb = f->map ? calloc(f->L, sizeof *mb) : NULL;
        uint8_t *via = f->map ? calloc(f->L, 1) : NULL;
        if (!b || (f->map && (!mb || !via))) {
            free(b);
            free(mb);
            free(via);
            continue;
        }
        kvedge_plan_source_t *ps = &f->psrc[f->nsrc];
        memset(ps, 0, sizeof *ps);
        ps->kind = s->conf.kind;
        snprintf(ps->name, sizeof ps->name, "%s", s->conf.name);
        double weight = kvedge_health_weight(p->health, s->conf.name, now);
        ps->up = c && kvedge_health_usable(p->health, s->conf.name, now) && weight > 0;
        kvedge_proxy_impl_src_link(p, s, c, &ps->bw_bytes_per_s, &ps->rtt_us);
        if (weight > 0) /* a doubtful source (suspect, on probation) is priced as slower */
            ps->bw_bytes_per_s *= weight;
        kvedge_master_node_t rec;
        bool in_registry = p->view && kvedge_mview_node(p->view, s->conf.name, &rec) == KVEDGE_OK;
        for (uint32_t l = 0; l < f->L; l++) {
            b[l] = s_holds(p, s, in_registry, f->chunks, f->nchunks, f->first + l) ? fp16 * s->ratio
                                                                                   : -1;
            if (!f->map)
                continue;
            uint16_t from = s_from(f, l);
            mb[l] = from != KVEDGE_MASTER_MAP_NONE &&
                            s_holds(p, s, in_registry, f->mchunks, f->nchunks, from)
                        ? mfp16 * s->ratio
                        : -1;
            if (b[l] < 0 && mb[l] >= 0) {
                b[l] = mb[l];
                via[l] = 1;
            }
        }
        ps->layer_bytes = b;
        if (f->prec_on) {
            /* Per rung: the block size of that rung for this shape (a node serves a rung it
             * holds, or derives it), for every layer the source holds. */
            size_t P = f->pw.n;
            double *pb = malloc((size_t)f->L * P * sizeof *pb);
            uint32_t per_chunk = f->nchunks ? (tokens + f->nchunks - 1) / f->nchunks : 1;
            bool serves[KVEDGE_PREC_MAX_ACCEPT];
            for (size_t r = 0; r < P; r++)
                serves[r] = s_serves(p, s, in_registry, f->chunks, f->nchunks, f->pw.accept[r]);
            for (uint32_t l = 0; pb && l < f->L; l++)
                for (size_t r = 0; r < P; r++)
                    pb[(size_t)l * P + r] =
                        b[l] < 0 || !serves[r]
                            ? -1
                            : fp16 * kvedge_prec_bytes_per_fp16(f->pw.accept[r], per_chunk,
                                                                f->model.head_dim, 2);
            f->pbytes[f->nsrc] = pb;
            f->pp.layer_prec_bytes[f->nsrc] = pb;
            if (!pb)
                ps->up = false; /* out of memory: price it out rather than misprice it */
        }
        f->bytes[f->nsrc] = b;
        f->mbytes[f->nsrc] = mb;
        f->via[f->nsrc] = via;
        f->client[f->nsrc] = c;
        f->map_src[f->nsrc] = (int)i;
        f->nsrc++;
    }
}

/* The PLAN message: sources, totals, and each layer's source and price. */
static zmsg_t *s_plan_message(const s_fetch_t *f)
{
    const kvedge_plan_t *pl = f->plan;
    /* Unpriced (recomputation the request did not allow): 1e300 on the wire. */
#define S_WIRE_US(x) (isfinite(x) ? (x) : 1e300)
    kvedge_wire_fetch_plan_t w = {(uint32_t)f->nsrc,
                                  f->L,
                                  pl->split,
                                  S_WIRE_US(pl->total_us),
                                  S_WIRE_US(pl->bound_us),
                                  S_WIRE_US(pl->cloud_only_us),
                                  S_WIRE_US(pl->recompute_all_us),
                                  S_WIRE_US(pl->load_then_compute_us)};
#undef S_WIRE_US
    uint8_t head[KVEDGE_WIRE_FETCH_PLAN_BYTES];
    kvedge_wire_fetch_plan_pack(&w, head);
    zframe_t *srcs = zframe_new(NULL, f->nsrc * KVEDGE_WIRE_FETCH_SOURCE_BYTES);
    zframe_t *layers = zframe_new(NULL, (size_t)f->L * KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES);
    zmsg_t *m = zmsg_new();
    if (!srcs || !layers || !m) {
        zframe_destroy(&srcs);
        zframe_destroy(&layers);
        zmsg_destroy(&m);
        return NULL;
    }
    for (size_t s = 0; s < f->nsrc; s++) {
        kvedge_wire_fetch_source_t ws = {.kind = (uint8_t)f->psrc[s].kind,
                                         .up = f->psrc[s].up,
                                         .rtt_us = (float)f->psrc[s].rtt_us,
                                         .bw_bytes_per_s = f->psrc[s].bw_bytes_per_s};
        snprintf(ws.name, sizeof ws.name, "%s", f->psrc[s].name);
        kvedge_wire_fetch_source_pack(&ws, zframe_data(srcs) + s * KVEDGE_WIRE_FETCH_SOURCE_BYTES);
    }
    for (uint32_t l = 0; l < f->L; l++) {
        double cost = pl->layer[l].cost_us;
        bool mapped = s_via(f, pl->layer[l].source, l);
        int q = pl->layer[l].prec;
        bool fetched = f->prec_on && q >= 0 && pl->layer[l].source >= 0;
        /* A layer recomputed because a fetch would break the budget says so. */
        bool budget = f->prec_on && pl->layer[l].source < 0 &&
                      pl->layer[l].prec_reason == KVEDGE_PLAN_PREC_BUDGET;
        kvedge_wire_fetch_plan_layer_t wl = {
            (int16_t)pl->layer[l].source,
            (uint8_t)pl->layer[l].reason,
            isfinite(cost) ? cost : 1e300,
            mapped,
            mapped ? s_from(f, l) : (uint16_t)KVEDGE_WIRE_FETCH_OWN_LAYER,
            fetched ? f->pw.accept[q] : KVEDGE_PREC_STORED,
            fetched || budget ? (uint8_t)pl->layer[l].prec_reason : 0};
        kvedge_wire_fetch_plan_layer_pack(&wl, zframe_data(layers) +
                                                   (size_t)l * KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES);
    }
    zmsg_addmem(m, head, sizeof head);
    zmsg_append(m, &srcs);
    zmsg_append(m, &layers);
    return m;
}

/* A PREC request's quality costs: per layer and accepted rung, the model's profile's figure
 * in the request's metric (lossless and a request without a budget: 0). A rung the profile
 * does not measure, or any lossy rung of a model without a profile, is priced out of the
 * budget (1e300): the plan never picks it. Sets prec_on. Returns 0 or KVEDGE_ENOMEM. */
static int s_fetch_quality(kvedge_proxy_impl_t *p, s_fetch_t *f, const char *model)
{
    size_t P = f->pw.n;
    f->qcost = malloc((size_t)f->L * P * sizeof *f->qcost);
    if (!f->qcost)
        return KVEDGE_ENOMEM;
    const kvedge_quality_profile_t *q = kvedge_proxy_impl_quality(p, model);
    bool unpriced = false;
    for (uint32_t l = 0; l < f->L; l++)
        for (size_t r = 0; r < P; r++) {
            double c = 0;
            kvedge_prec_t rung = f->pw.accept[r];
            bool exact = rung == KVEDGE_PREC_MAKE(KVEDGE_PREC_LOSSLESS, KVEDGE_PREC_THINK_NONE);
            if (f->pw.metric != KVEDGE_QUALITY_NONE && !exact) {
                if (!q || kvedge_quality_cost(q, f->first + l, rung, f->pw.metric, &c) != 0 ||
                    !(c >= 0 && isfinite(c))) {
                    c = 1e300;
                    unpriced = true;
                } else {
                    c *= p->opts.quality_margin_pct / 100.0; /* the margin over the mean */
                }
            }
            f->qcost[(size_t)l * P + r] = c;
        }
    /* At most once a minute: a proxy without a profile would otherwise say it per request. */
    int64_t now_ms = kvedge_mono_ms();
    if (unpriced && (!p->quality_warned_ms || now_ms - p->quality_warned_ms >= 60000)) {
        p->quality_warned_ms = now_ms;
        kvedge_log_warn("fetch of %s: %s; the rungs it lacks are never chosen under a budget",
                        model,
                        q ? "its quality profile does not measure every accepted rung"
                          : "no quality profile for the model (--quality)");
    }
    for (size_t r = 0; r < P; r++)
        f->dec_us[r] = kvedge_prec_decode_us_per_byte(f->pw.accept[r]);
    f->pp = (kvedge_plan_prec_t){.n = (uint32_t)P,
                                 .quality_cost = f->qcost,
                                 .budget = f->pw.metric == KVEDGE_QUALITY_NONE ? 0 : f->pw.budget,
                                 .rungs = f->pw.accept,
                                 .decode_us_per_byte = f->dec_us};
    f->prec_on = true;
    return KVEDGE_OK;
}

/* A MAPPED request: the mapped model's chain, and its shape and map when both can be used.
 * Anything that makes the map unusable is logged (rate-limited) and leaves f->map NULL: the
 * layers are planned as without MAPPED. Returns 0 or KVEDGE_ENOMEM. */
static int s_fetch_mapped(kvedge_proxy_impl_t *p, s_fetch_t *f, const char *edge,
                          const kvedge_wire_frame_t *mf)
{
    const uint8_t *ids = NULL;
    kvedge_wire_fetch_mapped_parse(mf->data, mf->len, f->nchunks, f->mapped_id,
                                   &ids); /* validated already */
    f->mchunks = malloc((size_t)f->nchunks * sizeof *f->mchunks);
    f->map = malloc(sizeof *f->map);
    if (!f->mchunks || !f->map)
        return KVEDGE_ENOMEM;
    memcpy(f->mchunks, ids, (size_t)f->nchunks * KVEDGE_CHUNK_ID_BYTES);
    char why[2 * KVEDGE_WIRE_MODEL_ID_BYTES + 96] = "";
    int rc = kvedge_proxy_impl_model(p, f->mapped_id, &f->mmodel);
    if (rc != KVEDGE_OK)
        snprintf(why, sizeof why, "no shape known for model %s", f->mapped_id);
    else if ((rc = kvedge_proxy_impl_map(p, f->mapped_id, edge, f->map)) == KVEDGE_ENOTFOUND)
        snprintf(why, sizeof why, "no map/%s/%s in the master's registry", f->mapped_id, edge);
    else if (rc == KVEDGE_EPROTO)
        snprintf(why, sizeof why, "the registered map was refused");
    else if (rc != KVEDGE_OK)
        snprintf(why, sizeof why, "%s", kvedge_strerror(rc));
    if (rc != KVEDGE_OK) {
        kvedge_proxy_impl_map_unusable(f->mapped_id, edge, why);
        free(f->map);
        f->map = NULL;
        memset(&f->mmodel, 0, sizeof f->mmodel);
    }
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- FETCHes waiting for a model */

/* A FETCH for a model not in the proxy's view yet, held until the model arrives or its
 * KVEDGE_PROXY_MODEL_WAIT_MS are up (actor only). */
typedef struct {
    zframe_t *route;
    kvedge_wire_header_t h;
    zmsg_t *frames;   /* copies of its payload frames */
    int64_t start_us; /* when it arrived (monotonic): its deadline counts from there */
    int64_t until_ms; /* monotonic: planned, or answered ENOMODEL, by then */
} s_parked_t;

static void s_parked_free(s_parked_t **wp)
{
    s_parked_t *w = *wp;
    if (!w)
        return;
    zframe_destroy(&w->route);
    zmsg_destroy(&w->frames);
    free(w);
    *wp = NULL;
}

/* Holds the request (copies of route, header and frames) in p->parked; false when it cannot
 * wait (no time left before its deadline, no memory): it is answered at once. */
static bool s_park(kvedge_proxy_impl_t *p, zframe_t *route, const kvedge_wire_header_t *h,
                   const kvedge_wire_frame_t *pf, size_t n, int64_t start_us, const char *model)
{
    int64_t now = kvedge_mono_ms();
    int64_t until = start_us / 1000 + (int64_t)h->deadline_ms - KVEDGE_PROXY_DEADLINE_MARGIN_MS;
    if (until > now + KVEDGE_PROXY_MODEL_WAIT_MS)
        until = now + KVEDGE_PROXY_MODEL_WAIT_MS;
    if (until <= now)
        return false;
    s_parked_t *w = calloc(1, sizeof *w);
    if (!w)
        return false;
    w->route = zframe_dup(route);
    w->h = *h;
    w->frames = zmsg_new();
    w->start_us = start_us;
    w->until_ms = until;
    bool ok = w->route && w->frames;
    for (size_t i = 0; ok && i < n; i++)
        ok = zmsg_addmem(w->frames, pf[i].data, pf[i].len) == 0;
    if (!ok || !zlistx_add_end(p->parked, w)) {
        s_parked_free(&w);
        return false;
    }
    kvedge_log_debug("fetch of model %s: not in this proxy's view yet, waiting up to %lld ms for "
                     "the master to announce it",
                     model, (long long)(until - now));
    return true;
}

static void s_start(kvedge_proxy_impl_t *p, zframe_t *route, const kvedge_wire_header_t *h,
                    const kvedge_wire_frame_t *pf, size_t n, int64_t start_us, bool may_park);

/* Starts the held FETCH (its model arrived, or its wait is over: then it is refused). */
static void s_unpark(kvedge_proxy_impl_t *p, s_parked_t *w)
{
    kvedge_wire_frame_t pf[5];
    size_t n = 0;
    for (zframe_t *fr = zmsg_first(w->frames); fr && n < sizeof pf / sizeof pf[0];
         fr = zmsg_next(w->frames))
        pf[n++] = (kvedge_wire_frame_t){zframe_data(fr), zframe_size(fr)};
    s_start(p, w->route, &w->h, pf, n, w->start_us, false);
}

/* Every tick: the held FETCHes whose model is now known, or whose wait is over, start. */
static void s_parked_tick(kvedge_proxy_impl_t *p, int64_t now)
{
    s_parked_t *w = zlistx_first(p->parked);
    while (w) {
        void *handle = zlistx_cursor(p->parked);
        s_parked_t *next = zlistx_next(p->parked);
        kvedge_wire_fetch_spec_t spec;
        zframe_t *sf = zmsg_first(w->frames);
        kvedge_model_t m;
        if (now >= w->until_ms ||
            (sf &&
             kvedge_wire_fetch_spec_parse(zframe_data(sf), zframe_size(sf), &spec) == KVEDGE_OK &&
             kvedge_proxy_impl_model(p, spec.model_id, &m) == KVEDGE_OK)) {
            zlistx_detach(p->parked, handle);
            s_unpark(p, w);
            s_parked_free(&w);
        }
        w = next;
    }
}

/* The held FETCH of route's request rid, detached from the list; NULL when none. */
static s_parked_t *s_parked_take(kvedge_proxy_impl_t *p, zframe_t *route, uint64_t rid)
{
    for (s_parked_t *w = zlistx_first(p->parked); w; w = zlistx_next(p->parked))
        if (w->h.request_id == rid && zframe_eq(w->route, route)) {
            zlistx_detach(p->parked, zlistx_cursor(p->parked));
            return w;
        }
    return NULL;
}

void kvedge_proxy_impl_fetch_start(kvedge_proxy_impl_t *p, zframe_t *route,
                                   const kvedge_wire_header_t *h, const kvedge_wire_frame_t *pf,
                                   size_t n)
{
    s_start(p, route, h, pf, n, kvedge_mono_us(), true);
}

/* Starts a FETCH that arrived at start_us; may_park: it may wait for its model (once). */
static void s_start(kvedge_proxy_impl_t *p, zframe_t *route, const kvedge_wire_header_t *h,
                    const kvedge_wire_frame_t *pf, size_t n, int64_t start_us, bool may_park)
{
    kvedge_wire_fetch_spec_t spec;
    kvedge_wire_fetch_spec_parse(pf[0].data, pf[0].len, &spec); /* validated already */
    s_fetch_t *f = calloc(1, sizeof *f);
    int rc = f ? KVEDGE_OK : KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK)
        rc = kvedge_proxy_impl_model(p, spec.model_id, &f->model);
    /* With a master, a model unknown now may be announced in a moment (a node registers the
     * models it holds on its next directory pass): the request waits for it, bounded. */
    if (rc == KVEDGE_ENOMODEL && may_park && p->view &&
        s_park(p, route, h, pf, n, start_us, spec.model_id)) {
        free(f);
        return;
    }
    if (rc == KVEDGE_OK && (uint32_t)spec.first_layer + spec.layers > f->model.layers)
        rc = KVEDGE_ESHAPE;
    if (rc == KVEDGE_OK) {
        f->serial = ++p->next_serial;
        f->route = zframe_dup(route);
        f->rid = h->request_id;
        f->credit = h->credit;
        f->pack = spec.flags & KVEDGE_WIRE_FETCH_FLAG_PACK;
        f->deadline_ms = start_us / 1000 + h->deadline_ms;
        f->nchunks = h->count;
        f->first = spec.first_layer;
        f->L = spec.layers;
        f->chunks = malloc((size_t)f->nchunks * sizeof *f->chunks);
        f->compute = calloc(f->L, sizeof *f->compute);
        f->recompute = calloc(f->L, sizeof *f->recompute);
        f->plan = malloc(sizeof *f->plan);
        f->replan = malloc(sizeof *f->replan);
        f->layer = calloc(f->L, sizeof *f->layer);
        f->outbox = zlistx_new();
        if (!f->chunks || !f->compute || !f->recompute || !f->plan || !f->replan || !f->layer ||
            !f->outbox)
            rc = KVEDGE_ENOMEM;
    }
    /* MAPPED: the mapped frame is the last; PREC: the precision frame before it; times, when
     * present, come first. */
    bool mapped = spec.flags & KVEDGE_WIRE_FETCH_FLAG_MAPPED;
    bool precf = spec.flags & KVEDGE_WIRE_FETCH_FLAG_PREC;
    bool times = n - (mapped ? 1 : 0) - (precf ? 1 : 0) == 3;
    if (rc == KVEDGE_OK && precf) {
        kvedge_wire_fetch_prec_parse(pf[n - 1 - (mapped ? 1 : 0)].data,
                                     pf[n - 1 - (mapped ? 1 : 0)].len, &f->pw); /* validated */
        if (kvedge_wire_fetch_prec_check(&f->pw) != KVEDGE_OK)
            rc = KVEDGE_EINVAL;
    }
    if (rc == KVEDGE_OK && mapped)
        rc = s_fetch_mapped(p, f, spec.model_id, &pf[n - 1]);
    /* Precisions are chosen for the requested model's own layers: a request whose map is
     * usable is planned as without PREC (its blocks come as stored). */
    if (rc == KVEDGE_OK && precf && !f->map)
        rc = s_fetch_quality(p, f, spec.model_id);
    if (rc == KVEDGE_OK)
        f->max_heads = f->map && f->mmodel.kv_heads > f->model.kv_heads ? f->mmodel.kv_heads
                                                                        : f->model.kv_heads;
    for (uint32_t l = 0; rc == KVEDGE_OK && l < f->L; l++) {
        f->layer[l].blocks = calloc((size_t)f->nchunks * f->max_heads, sizeof(zframe_t *));
        if (!f->layer[l].blocks)
            rc = KVEDGE_ENOMEM;
    }
    if (rc == KVEDGE_OK) {
        memcpy(f->chunks, pf[1].data, (size_t)f->nchunks * KVEDGE_CHUNK_ID_BYTES);
        for (uint32_t l = 0; times && l < f->L; l++) {
            float cu, ru;
            uint32_t a = kvedge_le_get32(pf[2].data + 8 * l),
                     b = kvedge_le_get32(pf[2].data + 8 * l + 4);
            memcpy(&cu, &a, 4);
            memcpy(&ru, &b, 4);
            if (!(cu >= 0 && cu < 1e30f) || !(ru >= 0 && ru < 1e30f))
                rc = KVEDGE_EPROTO;
            f->compute[l] = cu;
            f->recompute[l] = ru;
        }
        /* Fetch only (no times): the request allows no recomputation (proxy/plan.h). */
        f->req = (kvedge_plan_request_t){f->L, 0, f->compute, times ? f->recompute : NULL};
    }
    if (rc == KVEDGE_OK) {
        uint32_t tokens = spec.tokens ? spec.tokens : f->nchunks * S_TOKENS_PER_CHUNK;
        f->tokens = tokens;
        s_fetch_sources(p, f, tokens);
        rc = kvedge_plan_make_prec(&f->req, f->prec_on ? &f->pp : NULL, f->psrc, f->nsrc, f->plan);
        if (rc != KVEDGE_OK)
            rc = KVEDGE_EINVAL;
    }
    if (rc != KVEDGE_OK) {
        s_fetch_free(p, f);
        kvedge_collab_fetch_t r = {rc, 0, 0, 0, (uint64_t)(kvedge_mono_us() - start_us), 0};
        kvedge_collab_fetch(p->collab, &r);
        kvedge_proxy_impl_reply_error(p, route, KVEDGE_OP_FETCH, h->request_id, rc);
        return;
    }
    f->start_us = start_us;
    atomic_fetch_add(&p->fetches_open, 1);
    s_stat_add(p, &p->stats.requests, 1);
    zlistx_add_end(p->fetches, f);
    if (!s_ask(p, f))
        s_fetch_go(p, f);
}

/* Source s (request-local) holds every chunk of the chain whole (LOOKUP): every layer of
 * it, priced as s_fetch_sources prices a layer the directory lists. */
static void s_learn_holder(kvedge_proxy_impl_t *p, s_fetch_t *f, int s)
{
    double fp16 = (double)f->tokens * f->model.kv_heads * f->model.head_dim * 2 * 2;
    double ratio = p->src[f->map_src[s]].ratio;
    size_t P = f->prec_on ? f->pw.n : 0;
    uint32_t per_chunk = f->nchunks ? (f->tokens + f->nchunks - 1) / f->nchunks : 1;
    for (uint32_t l = 0; l < f->L; l++) {
        if (f->via[s] && f->via[s][l]) { /* the requested model's own layer is better */
            f->via[s][l] = 0;
            f->bytes[s][l] = -1;
        }
        if (f->bytes[s][l] < 0)
            f->bytes[s][l] = fp16 * ratio;
        for (size_t r = 0; f->pbytes[s] && r < P; r++)
            if (f->pbytes[s][(size_t)l * P + r] < 0)
                f->pbytes[s][(size_t)l * P + r] =
                    fp16 *
                    kvedge_prec_bytes_per_fp16(f->pw.accept[r], per_chunk, f->model.head_dim, 2);
    }
}

/* Source s (request-local) holds every chunk of the mapped model's chain whole (LOOKUP of a
 * MAPPED request): every edge layer the map gives a cloud layer can come from it as that
 * layer, priced as s_fetch_sources prices a mapped layer the directory lists; a layer it also
 * offers as the requested model's own stays that. */
static void s_learn_mapped_holder(kvedge_proxy_impl_t *p, s_fetch_t *f, int s)
{
    double mfp16 = (double)f->tokens * f->mmodel.kv_heads * f->mmodel.head_dim * 2 * 2;
    double ratio = p->src[f->map_src[s]].ratio;
    for (uint32_t l = 0; f->map && f->via[s] && f->mbytes[s] && l < f->L; l++) {
        if (s_from(f, l) == KVEDGE_MASTER_MAP_NONE)
            continue;
        if (f->mbytes[s][l] < 0)
            f->mbytes[s][l] = mfp16 * ratio;
        if (f->bytes[s][l] < 0) {
            f->bytes[s][l] = f->mbytes[s][l];
            f->via[s][l] = 1;
        }
    }
}

/* A LOOKUP's tag: the request-local source, plus KVEDGE_PROXY_MAX_SOURCES when it asked for
 * the mapped model's chain. */
static int s_ask_tag(int s, bool mapped)
{
    return mapped ? s + KVEDGE_PROXY_MAX_SOURCES : s;
}

/* A LOOKUP answered: a source that holds the whole chain becomes a holder of every layer (of
 * the mapped model's chain: of every mapped layer); once every answer is in, the fetch is
 * planned again and starts. */
static void s_asked(kvedge_proxy_impl_t *p, s_fetch_t *f, int tag, int status, uint32_t hit)
{
    bool mapped = tag >= KVEDGE_PROXY_MAX_SOURCES;
    int s = mapped ? tag - KVEDGE_PROXY_MAX_SOURCES : tag;
    if (s >= 0 && (size_t)s < f->nsrc && status == KVEDGE_OK && hit >= f->nchunks) {
        if (mapped)
            s_learn_mapped_holder(p, f, s);
        else
            s_learn_holder(p, f, s);
        kvedge_log_debug("fetch %llu: %s holds the context%s (LOOKUP), though the directory "
                         "does not list it yet",
                         (unsigned long long)f->serial, f->psrc[s].name,
                         mapped ? " of the mapped model" : "");
    }
    if (--f->asking == 0)
        s_fetch_go(p, f);
}

/* Layers the plan leaves to nobody (no holder) while registered sources the directory says
 * nothing of are up: asks them (LOOKUP) before the misses are final. Returns whether it
 * asked (the fetch then waits, at most until ask_until_ms). */
static bool s_ask(kvedge_proxy_impl_t *p, s_fetch_t *f)
{
    bool missed = false;
    for (uint32_t l = 0; l < f->L && !missed; l++)
        missed = f->plan->layer[l].source < 0 &&
                 f->plan->layer[l].reason == KVEDGE_PLAN_RECOMPUTE_NO_SOURCE;
    int64_t now = kvedge_mono_ms();
    int64_t until = now + KVEDGE_PROXY_ASK_MS,
            last = f->deadline_ms - KVEDGE_PROXY_DEADLINE_MARGIN_MS - 1;
    if (!missed || !p->view || (until > last ? last : until) <= now)
        return false;
    f->ask_until_ms = until > last ? last : until;
    /* The layers wanted of each chain: the requested ones, and the mapped model's layers the
     * map names. */
    uint16_t *want = malloc(2 * (size_t)f->L * sizeof *want);
    uint32_t nown = 0, nmapped = 0;
    for (uint32_t l = 0; want && l < f->L; l++) {
        want[nown++] = (uint16_t)(f->first + l);
        if (f->map && s_from(f, l) != KVEDGE_MASTER_MAP_NONE)
            want[f->L + nmapped++] = s_from(f, l);
    }
    for (size_t s = 0; want && s < f->nsrc; s++) {
        if (!f->psrc[s].up || !f->client[s])
            continue;
        const kvedge_proxy_impl_src_t *src = &p->src[f->map_src[s]];
        /* The requested model's chain, and for a MAPPED request the mapped model's: what the
         * prefill stored is the cloud model's context, which the directory may not list yet. */
        for (int m = 0; m < (f->map ? 2 : 1); m++) {
            const kvedge_chunk_id_t *chain = m ? f->mchunks : f->chunks;
            if (s_unlisted(p, src, chain, f->nchunks, m ? want + f->L : want, m ? nmapped : nown) &&
                kvedge_proxy_impl_ask(p, f->serial, f->map_src[s], s_ask_tag((int)s, m == 1), chain,
                                      f->nchunks) == KVEDGE_OK)
                f->asking++;
        }
    }
    free(want);
    if (!f->asking) {
        f->ask_until_ms = 0; /* nobody to ask: the plan stands */
        return false;
    }
    kvedge_log_debug("fetch %llu: the directory lists no holder of some layers: asking %u "
                     "sources (LOOKUP)",
                     (unsigned long long)f->serial, f->asking);
    return true;
}

/* The fetch starts: (planned again when it asked) its PLAN goes out, its streams open. */
static void s_fetch_go(kvedge_proxy_impl_t *p, s_fetch_t *f)
{
    if (f->ask_until_ms) /* it asked: plan with what the answers taught */
        (void)kvedge_plan_make_prec(&f->req, f->prec_on ? &f->pp : NULL, f->psrc, f->nsrc,
                                    f->plan); /* the same inputs planned once: no error */
    f->plan_us = kvedge_mono_us();
    zmsg_t *pm = s_plan_message(f);
    if (pm)
        zlistx_add_end(f->outbox, pm);
    for (uint32_t l = 0; l < f->L; l++) {
        s_layer_t *ly = &f->layer[l];
        ly->src = f->plan->layer[l].source;
        ly->prec = f->prec_on ? f->plan->layer[l].prec : -1;
        if (ly->src < 0) {
            ly->state = L_MISS;
            ly->reason = f->plan->layer[l].reason == KVEDGE_PLAN_RECOMPUTE_FASTER
                             ? KVEDGE_FETCH_RECOMPUTE
                             : KVEDGE_FETCH_MISS;
        } else {
            ly->state = L_QUEUED;
            ly->reason = KVEDGE_FETCH_PLANNED;
        }
    }
    f->going = true;
    s_issue(p, f);
    s_deliver(p, f);
}

/* Buffer room came back (a client took blocks): the fetches the cap held back open their
 * streams. Without it a fetch whose streams had all ended with the buffer full would wait
 * for its deadline. */
static void s_issue_held(kvedge_proxy_impl_t *p)
{
    for (s_fetch_t *f = zlistx_first(p->fetches); f; f = zlistx_next(p->fetches))
        if (s_held_can_go(p, f))
            s_issue(p, f);
}

/* ---------------------------------------------------------------- client requests */

static s_fetch_t *s_fetch_by_route(kvedge_proxy_impl_t *p, zframe_t *route, uint64_t rid)
{
    for (s_fetch_t *f = zlistx_first(p->fetches); f; f = zlistx_next(p->fetches))
        if (f->rid == rid && zframe_eq(f->route, route))
            return f;
    return NULL;
}

void kvedge_proxy_impl_fetch_credit(kvedge_proxy_impl_t *p, zframe_t *route, uint64_t rid,
                                    uint32_t credit)
{
    s_fetch_t *f = s_fetch_by_route(p, route, rid);
    if (f) {
        uint64_t c = (uint64_t)f->credit + credit;
        f->credit = c > UINT32_MAX ? UINT32_MAX : (uint32_t)c;
        s_pump(p, f); /* may end and free f */
        s_issue_held(p);
    }
}

/* The END follows the data messages already sent; what is still buffered or being fetched
 * for the request is dropped with it. */
/* Ends the fetch early with an END carrying status and the count of data messages sent, as
 * docs/protocol.md says every END does; what was not sent is dropped. */
static void s_end_early(kvedge_proxy_impl_t *p, s_fetch_t *f, int32_t status)
{
    zmsg_t *end = zmsg_new();
    zframe_t *h = kvedge_proxy_impl_header(
        KVEDGE_OP_FETCH, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_END, f->rid, status, f->sent);
    zmsg_append(end, &h);
    kvedge_proxy_impl_send(p, f->route, &end);
    s_fetch_remove(p, f);
}

void kvedge_proxy_impl_fetch_cancel(kvedge_proxy_impl_t *p, zframe_t *route, uint64_t rid)
{
    s_fetch_t *f = s_fetch_by_route(p, route, rid);
    if (f)
        s_end_early(p, f, KVEDGE_ECANCELED);
    s_parked_t *w = f ? NULL : s_parked_take(p, route, rid);
    if (w) {
        kvedge_proxy_impl_reply_error(p, w->route, KVEDGE_OP_FETCH, rid, KVEDGE_ECANCELED);
        s_parked_free(&w);
    }
}

void kvedge_proxy_impl_fetch_close_all(kvedge_proxy_impl_t *p)
{
    s_fetch_t *f;
    while ((f = zlistx_first(p->fetches)) != NULL) {
        s_record(p, f, KVEDGE_ECLOSED);
        s_end_early(p, f, KVEDGE_ECLOSED);
    }
    s_parked_t *w;
    while ((w = zlistx_detach(p->parked, NULL)) != NULL) {
        kvedge_proxy_impl_reply_error(p, w->route, KVEDGE_OP_FETCH, w->h.request_id,
                                      KVEDGE_ECLOSED);
        s_parked_free(&w);
    }
}
