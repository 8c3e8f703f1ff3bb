/* The edge proxy. One actor thread owns the client ROUTER and every FETCH in progress; the
 * upstream libkvedge clients deliver blocks on their own I/O threads into an event queue
 * that wakes the actor (an eventfd), so all request state lives on one thread. A prober
 * thread connects sources, pings the ones that are down (re-admission), follows the master's
 * node list and publishes measured links. */
#include "proxy/proxy.h"

#include <czmq.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "access/frame.h"
#include "access/log.h"
#include "store/master/master.h"
#include "access/mview.h"
#include "access/secure.h"
#include "access/shaper.h"
#include "access/client.h"
#include "proxy/health.h"
#include "proxy/negcache.h"
#include "store/clock.h"
#include "store/error.h"
#include "store/model.h"

#define S_CREDIT_DEFAULT   64
#define S_HELLO_MS         1000           /* connect (HELLO) deadline of one probe */
#define S_PING_MS          500            /* PING deadline of one probe */
#define S_PROBE_BYTES      (128u * 1024u) /* payload of the bandwidth probe at connect */
#define S_NEG_CAPACITY     65536
#define S_TICK_MS          50
#define S_RATIO_PRIOR      1.0 /* bytes per fp16 byte a source is assumed to send at first */
#define S_TOKENS_PER_CHUNK KVEDGE_CHUNK_TOKENS_DEFAULT
#define S_BW_MIN_BYTES     (256u << 10) /* a fetch teaches a source's bandwidth past this */

/* ---------------------------------------------------------------- state */

typedef struct {
    kvedge_proxy_source_t conf;
    bool from_master;        /* discovered in the master's node list */
    kvedge_client_t *client; /* set once by the prober (under srcs_mu), never replaced */
    double ratio;            /* learned wire bytes per fp16 byte (actor only) */
    double bw_est;           /* throughput measured over whole fetches (under srcs_mu) */
    uint64_t bw_samples;
    uint64_t last_publish_ms; /* prober: last link record sent */
} s_src_t;

typedef struct s_op_t s_op_t;
typedef struct s_event_t s_event_t;

typedef struct {
    /* Shared by every thread. */
    kvedge_proxy_opts_t opts;
    char id[KVEDGE_MASTER_MAX_ID_BYTES + 1];
    char *cert_path, *master_key;
    pthread_mutex_t srcs_mu;
    s_src_t src[KVEDGE_PROXY_MAX_SOURCES];
    atomic_size_t nsrc;
    kvedge_health_t *health;
    kvedge_negcache_t *neg;
    kvedge_mview_t *view;
    /* The event queue: libkvedge I/O threads -> actor. */
    pthread_mutex_t ev_mu;
    s_event_t *ev_head, *ev_tail;
    int ev_fd;
    /* Prober thread. */
    pthread_t prober;
    bool prober_started;
    pthread_mutex_t stop_mu;
    pthread_cond_t stop_cv;
    bool stop;
    /* Actor only. */
    kvedge_secure_router_t sec;
    zlistx_t *fetches; /* s_fetch_t, owned */
    uint64_t next_serial;
    uint64_t buffered; /* block bytes held */
    pthread_mutex_t stats_mu;
    kvedge_proxy_stats_t stats;
    int start_rc;
    char start_why[512];
    struct kvedge_proxy_t *owner;
} s_proxy_t;

struct kvedge_proxy_t {
    zactor_t *actor;
    s_proxy_t *p;
    char endpoint[256];
    char public_key[41];
};

/* An upstream layer stream; freed by the actor when its DONE event is handled. */
struct s_op_t {
    s_proxy_t *p;
    uint64_t serial; /* the fetch */
    uint32_t layer;  /* offset in the fetch */
    uint32_t gen;    /* the layer's generation when it was opened */
    int src;         /* request-local source index */
};

enum { S_EV_BLOCK = 1, S_EV_DONE = 2 };

struct s_event_t {
    s_event_t *next;
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
} s_layer_t;

typedef struct {
    uint64_t serial;
    zframe_t *route;
    uint64_t rid;
    uint32_t credit;
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
    int map[KVEDGE_PROXY_MAX_SOURCES]; /* request source -> proxy source */
    double *bytes[KVEDGE_PROXY_MAX_SOURCES];
    kvedge_client_t *client[KVEDGE_PROXY_MAX_SOURCES];
    uint32_t inflight[KVEDGE_PROXY_MAX_SOURCES];
    /* Per source: its throughput over this fetch, from its first stream to its last layer
     * (several streams share a link, so one stream's own time says little). */
    int64_t first_issue_us[KVEDGE_PROXY_MAX_SOURCES];
    int64_t last_done_us[KVEDGE_PROXY_MAX_SOURCES];
    uint64_t done_bytes[KVEDGE_PROXY_MAX_SOURCES];
    kvedge_plan_t *plan, *replan;
    s_layer_t *layer;
    uint32_t next;    /* next layer to deliver */
    zlistx_t *outbox; /* zmsg_t without route, in order */
    uint32_t sent;    /* data messages sent */
    bool ended;
} s_fetch_t;

static void s_stat_add(s_proxy_t *p, uint64_t *field, uint64_t n)
{
    pthread_mutex_lock(&p->stats_mu);
    *field += n;
    pthread_mutex_unlock(&p->stats_mu);
}

/* ---------------------------------------------------------------- sources */

int kvedge_proxy_source_parse(const char *spec, kvedge_proxy_source_t *out)
{
    if (!spec || !out)
        return KVEDGE_EINVAL;
    memset(out, 0, sizeof *out);
    char buf[2048];
    if (strlen(spec) >= sizeof buf)
        return KVEDGE_EINVAL;
    strcpy(buf, spec);
    char *save = NULL;
    int field = 0;
    for (char *t = strtok_r(buf, " \t", &save); t; t = strtok_r(NULL, " \t", &save), field++) {
        if (field == 0) {
            if (strcmp(t, "local") == 0)
                out->kind = KVEDGE_PLAN_LOCAL;
            else if (strcmp(t, "peer") == 0)
                out->kind = KVEDGE_PLAN_PEER;
            else if (strcmp(t, "cloud") == 0)
                out->kind = KVEDGE_PLAN_CLOUD;
            else if (strcmp(t, "history") == 0)
                out->kind = KVEDGE_PLAN_HISTORY;
            else
                return KVEDGE_EINVAL;
        } else if (field == 1) {
            if (!kvedge_master_id_ok(t) || strlen(t) >= sizeof out->name)
                return KVEDGE_EINVAL;
            strcpy(out->name, t);
        } else if (field == 2) {
            if (strlen(t) >= sizeof out->endpoint || !strstr(t, "://"))
                return KVEDGE_EINVAL;
            strcpy(out->endpoint, t);
        } else if (strncmp(t, "key=", 4) == 0 && strlen(t + 4) < sizeof out->server_key) {
            strcpy(out->server_key, t + 4);
        } else if (strncmp(t, "link=", 5) == 0 && strlen(t + 5) < sizeof out->link) {
            uint64_t rate;
            uint32_t lat;
            if (kvedge_shaper_parse(t + 5, &rate, &lat) != KVEDGE_OK)
                return KVEDGE_EINVAL;
            strcpy(out->link, t + 5);
        } else if (strncmp(t, "bw=", 3) == 0 || strncmp(t, "rtt=", 4) == 0) {
            char *end;
            const char *v = strchr(t, '=') + 1;
            double d = strtod(v, &end);
            if (end == v || *end || !(d > 0) || !isfinite(d))
                return KVEDGE_EINVAL;
            if (t[0] == 'b')
                out->bw_bytes_per_s = d;
            else
                out->rtt_us = d;
        } else {
            return KVEDGE_EINVAL;
        }
    }
    return field >= 3 ? KVEDGE_OK : KVEDGE_EINVAL;
}

/* Adds a source (prober or start); returns its index or -1 when the table is full. */
static int s_src_add(s_proxy_t *p, const kvedge_proxy_source_t *conf)
{
    pthread_mutex_lock(&p->srcs_mu);
    size_t n = atomic_load(&p->nsrc);
    int idx = -1;
    if (n < KVEDGE_PROXY_MAX_SOURCES) {
        s_src_t *s = &p->src[n];
        memset(s, 0, sizeof *s);
        s->conf = *conf;
        s->ratio = S_RATIO_PRIOR;
        idx = (int)n;
        atomic_store(&p->nsrc, n + 1);
    }
    pthread_mutex_unlock(&p->srcs_mu);
    if (idx >= 0)
        kvedge_health_add(p->health, conf->name, (uint64_t)kvedge_mono_ms());
    return idx;
}

/* The link the planner uses for a source: measured by our own client when it has samples,
 * else the master's link record from this proxy, else declared (node record or flags), else
 * the defaults. */
static void s_src_link(s_proxy_t *p, s_src_t *s, kvedge_client_t *c, double *bw, double *rtt)
{
    double mbw = 0, mrtt = 0;
    uint64_t samples = 0;
    if (c)
        kvedge_client_link(c, &mbw, &mrtt, &samples);
    *bw = s->conf.bw_bytes_per_s > 0 ? s->conf.bw_bytes_per_s : KVEDGE_PROXY_BW_DEFAULT;
    *rtt = s->conf.rtt_us > 0 ? s->conf.rtt_us : KVEDGE_PROXY_RTT_US_DEFAULT;
    kvedge_master_link_t lr;
    if (p->view && kvedge_mview_link(p->view, p->id, s->conf.name, &lr) == KVEDGE_OK) {
        if (lr.bw_bytes_per_s)
            *bw = (double)lr.bw_bytes_per_s;
        if (lr.rtt_us)
            *rtt = lr.rtt_us;
    }
    /* Our own client's round trips (pings, small replies) are the best rtt we have; its
     * per-stream bandwidth undercounts when streams share the link, so the throughput
     * measured over whole fetches wins over it. */
    if (samples > 0) {
        if (mbw > 0)
            *bw = mbw;
        if (mrtt > 0)
            *rtt = mrtt;
    }
    pthread_mutex_lock(&p->srcs_mu);
    double est = s->bw_est;
    pthread_mutex_unlock(&p->srcs_mu);
    if (est > 0)
        *bw = est;
}

/* ---------------------------------------------------------------- events */

static void s_event_push(s_proxy_t *p, s_event_t *e)
{
    pthread_mutex_lock(&p->ev_mu);
    if (p->ev_tail)
        p->ev_tail->next = e;
    else
        p->ev_head = e;
    p->ev_tail = e;
    pthread_mutex_unlock(&p->ev_mu);
    uint64_t one = 1;
    ssize_t w = write(p->ev_fd, &one, sizeof one);
    (void)w; /* a full eventfd counter still wakes the actor */
}

static void s_on_block(void *ctx, uint32_t ci, uint16_t head, int status, const uint8_t *data,
                       size_t len)
{
    s_op_t *op = ctx;
    s_event_t *e = calloc(1, sizeof *e);
    if (!e)
        return; /* the layer will come up short and be moved */
    e->kind = S_EV_BLOCK;
    e->op = op;
    e->chunk_index = ci;
    e->head = head;
    e->status = status;
    if (status == KVEDGE_OK) {
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
    s_event_t *e = calloc(1, sizeof *e);
    if (!e) {
        free(op); /* lost: the request's deadline still ends it */
        return;
    }
    e->kind = S_EV_DONE;
    e->op = op;
    e->status = status;
    s_event_push(op->p, e);
}

/* ---------------------------------------------------------------- replies */

static zframe_t *s_header(uint8_t op, uint16_t flags, uint64_t id, int32_t status, uint32_t count)
{
    kvedge_wire_header_t h = {KVEDGE_WIRE_VERSION, op, flags, id, status, count, 0, 0};
    uint8_t buf[KVEDGE_WIRE_HEADER_BYTES];
    kvedge_wire_header_pack(&h, buf);
    return zframe_new(buf, sizeof buf);
}

static void s_send(s_proxy_t *p, zframe_t *route, zmsg_t **m)
{
    zframe_t *r = zframe_dup(route);
    zmsg_prepend(*m, &r);
    if (zmsg_send(m, p->sec.router) != 0)
        zmsg_destroy(m); /* the client is gone or not reading: its deadline ends it */
}

static void s_reply_error(s_proxy_t *p, zframe_t *route, uint8_t op, uint64_t id, int32_t status)
{
    zmsg_t *m = zmsg_new();
    bool stream = op == KVEDGE_OP_FETCH || op == KVEDGE_OP_GET_LAYER;
    zframe_t *h =
        s_header(op, KVEDGE_WIRE_FLAG_REPLY | (stream ? KVEDGE_WIRE_FLAG_END : 0), id, status, 0);
    zmsg_append(m, &h);
    s_send(p, route, &m);
}

/* ---------------------------------------------------------------- fetches */

static void s_layer_clear(s_proxy_t *p, s_fetch_t *f, s_layer_t *l)
{
    size_t n = (size_t)f->nchunks * f->model.kv_heads;
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

static void s_fetch_free(s_proxy_t *p, s_fetch_t *f)
{
    if (!f)
        return;
    for (uint32_t i = 0; f->layer && i < f->L; i++) {
        s_layer_clear(p, f, &f->layer[i]);
        free(f->layer[i].blocks);
    }
    free(f->layer);
    for (size_t s = 0; s < f->nsrc; s++)
        free(f->bytes[s]);
    zmsg_t *m;
    while (f->outbox && (m = zlistx_detach(f->outbox, NULL)) != NULL) {
        p->buffered -= s_block_bytes(m);
        zmsg_destroy(&m);
    }
    zlistx_destroy(&f->outbox);
    zframe_destroy(&f->route);
    free(f->chunks);
    free(f->compute);
    free(f->recompute);
    free(f->plan);
    free(f->replan);
    free(f);
}

static s_fetch_t *s_fetch_find(s_proxy_t *p, uint64_t serial)
{
    for (s_fetch_t *f = zlistx_first(p->fetches); f; f = zlistx_next(p->fetches))
        if (f->serial == serial)
            return f;
    return NULL;
}

/* Folds each source's throughput over this fetch into its estimate: bytes over the time from
 * its first stream to its last layer, less one round trip. Only transfers big enough to say
 * something about bandwidth count. */
static void s_learn_links(s_proxy_t *p, s_fetch_t *f)
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
        double bw = (double)f->done_bytes[s] * 1e6 / us;
        pthread_mutex_lock(&p->srcs_mu);
        s_src_t *src = &p->src[f->map[s]];
        src->bw_samples++;
        double w = src->bw_samples < 4 ? 1.0 / (double)src->bw_samples : 0.25;
        src->bw_est = src->bw_est > 0 ? (1 - w) * src->bw_est + w * bw : bw;
        pthread_mutex_unlock(&p->srcs_mu);
    }
}

static void s_fetch_remove(s_proxy_t *p, s_fetch_t *f)
{
    s_learn_links(p, f);
    void *h = zlistx_find(p->fetches, f);
    if (h)
        zlistx_detach(p->fetches, h);
    s_fetch_free(p, f);
}

/* Sends what the client has credit for; ends the fetch when all is out. */
static void s_pump(s_proxy_t *p, s_fetch_t *f)
{
    zmsg_t *m;
    while (f->credit > 0 && (m = zlistx_first(f->outbox)) != NULL) {
        zlistx_detach(f->outbox, NULL);
        zmsg_t *out = zmsg_new();
        zframe_t *h =
            s_header(KVEDGE_OP_FETCH, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_MORE, f->rid, 0, 1);
        zmsg_append(out, &h);
        p->buffered -= s_block_bytes(m); /* a block leaves the buffer */
        zframe_t *fr;
        while ((fr = zmsg_pop(m)) != NULL)
            zmsg_append(out, &fr);
        zmsg_destroy(&m);
        s_send(p, f->route, &out);
        f->credit--;
        f->sent++;
    }
    if (f->ended && zlistx_size(f->outbox) == 0) {
        zmsg_t *end = zmsg_new();
        zframe_t *h = s_header(KVEDGE_OP_FETCH, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_END,
                               f->rid, 0, f->sent);
        zmsg_append(end, &h);
        s_send(p, f->route, &end);
        s_fetch_remove(p, f);
    }
}

/* Queues every layer that is complete (or missed), in layer order. */
static void s_deliver(s_proxy_t *p, s_fetch_t *f)
{
    uint32_t H = f->model.kv_heads;
    while (f->next < f->L) {
        s_layer_t *l = &f->layer[f->next];
        if (l->state != L_DONE && l->state != L_MISS)
            break;
        uint16_t layer = (uint16_t)(f->first + f->next);
        uint32_t heads = 0;
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
        } else {
            s_stat_add(p, &p->stats.misses, 1);
        }
        kvedge_wire_fetch_layer_t rec = {
            .reason = l->reason,
            .layer = layer,
            .source = (int16_t)(l->state == L_DONE ? l->src : -1),
            .status = l->state == L_DONE ? KVEDGE_OK : KVEDGE_ENOTFOUND,
            .heads = heads,
            .attempts = l->attempts,
        };
        uint8_t buf[KVEDGE_WIRE_FETCH_LAYER_BYTES];
        kvedge_wire_fetch_layer_pack(&rec, buf);
        zmsg_t *m = zmsg_new();
        zmsg_addmem(m, buf, sizeof buf);
        zlistx_add_end(f->outbox, m);
        kvedge_log_debug("fetch %llu layer %u: %s (%s)", (unsigned long long)f->serial, layer,
                         l->state == L_DONE ? f->psrc[l->src].name : "-",
                         kvedge_fetch_reason_name(l->reason));
        f->next++;
    }
    if (f->next == f->L)
        f->ended = true;
    s_pump(p, f);
}

/* The set of layers (bitmap over offsets) moves off their source: each goes to the source
 * a re-plan picks for it, or becomes a miss when none is left. */
static void s_reassign(s_proxy_t *p, s_fetch_t *f, const uint8_t *set, uint8_t reason, int failed)
{
    int rc = kvedge_plan_replan(&f->req, f->psrc, f->nsrc, f->plan, f->next,
                                failed >= 0 ? failed : KVEDGE_PLAN_SRC_NONE, f->replan);
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
        }
    }
}

/* Source s failed for this request (error, stall, protocol): every layer still on it moves. */
static void s_source_failed(s_proxy_t *p, s_fetch_t *f, int s, int err)
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
static void s_neg_key(const s_fetch_t *f, uint32_t layer, uint8_t key[S_NEG_KEY_BYTES])
{
    memcpy(key, f->chunks[f->nchunks - 1].bytes, KVEDGE_CHUNK_ID_BYTES);
    key[KVEDGE_CHUNK_ID_BYTES] = (uint8_t)(layer >> 8);
    key[KVEDGE_CHUNK_ID_BYTES + 1] = (uint8_t)layer;
}

/* Layer i is not (or not intact) at its source: remember it, move the layer. */
static void s_layer_failed(s_proxy_t *p, s_fetch_t *f, uint32_t i, uint8_t reason)
{
    s_layer_t *l = &f->layer[i];
    int s = l->src;
    uint8_t key[S_NEG_KEY_BYTES];
    s_neg_key(f, f->first + i, key);
    kvedge_negcache_add(p->neg, f->psrc[s].name, key, sizeof key, (uint64_t)kvedge_mono_ms(), 0);
    if (reason == KVEDGE_FETCH_FALLBACK_CORRUPT)
        kvedge_health_failure(p->health, f->psrc[s].name, (uint64_t)kvedge_mono_ms(),
                              KVEDGE_ECORRUPT);
    s_layer_clear(p, f, l);
    l->gen++;
    l->tried |= 1ull << s;
    f->bytes[s][i] = -1; /* the planner's view: s does not hold it */
    uint8_t set[KVEDGE_PLAN_MAX_LAYERS / 8] = {0};
    set[i / 8] = (uint8_t)(1u << (i % 8));
    s_reassign(p, f, set, reason, -1);
}

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

/* Opens layer streams on every source that has room, lowest layers first. */
static void s_issue(s_proxy_t *p, s_fetch_t *f)
{
    int64_t now = kvedge_mono_ms();
    int64_t left = f->deadline_ms - KVEDGE_PROXY_DEADLINE_MARGIN_MS - now;
    uint64_t cap = p->opts.buffer_bytes;
    bool again = true;
    while (again) {
        again = false;
        for (size_t s = 0; s < f->nsrc; s++) {
            if (!f->psrc[s].up)
                continue;
            for (uint32_t i = f->next; i < f->L && left > 0 && p->buffered < cap; i++) {
                s_layer_t *l = &f->layer[i];
                if (l->state != L_QUEUED || l->src != (int)s)
                    continue;
                double lb = f->bytes[s][i];
                if (f->inflight[s] >= s_window(f, (int)s, lb))
                    break;
                /* The stream may take FACTOR x (its transfer + the ones ahead of it). */
                double ahead_us = 0;
                for (uint32_t j = f->next; j < f->L; j++)
                    if (f->layer[j].state == L_FLIGHT && f->layer[j].src == (int)s)
                        ahead_us += f->bytes[s][j] * 1e6 / f->psrc[s].bw_bytes_per_s;
                double est_us = f->psrc[s].rtt_us + ahead_us + lb * 1e6 / f->psrc[s].bw_bytes_per_s;
                int64_t stall = (int64_t)(KVEDGE_PROXY_STALL_FACTOR * est_us / 1e3);
                if (stall < (int64_t)p->opts.stall_min_ms)
                    stall = p->opts.stall_min_ms;
                if (stall > left)
                    stall = left;
                s_op_t *op = calloc(1, sizeof *op);
                if (!op)
                    return;
                *op = (s_op_t){p, f->serial, i, l->gen, (int)s};
                int rc = kvedge_client_get_layer_async(f->client[s], f->chunks, f->nchunks,
                                                       (uint16_t)(f->first + i), (int)stall,
                                                       s_on_block, s_on_done, op);
                if (rc != KVEDGE_OK) {
                    free(op);
                    s_source_failed(p, f, (int)s, rc);
                    again = true;
                    break;
                }
                l->state = L_FLIGHT;
                l->attempts++;
                if (f->inflight[s]++ == 0 && !f->first_issue_us[s])
                    f->first_issue_us[s] = zclock_usecs();
            }
        }
    }
}

static void s_event(s_proxy_t *p, s_event_t *e)
{
    s_op_t *op = e->op;
    s_fetch_t *f = s_fetch_find(p, op->serial);
    if (e->kind == S_EV_DONE) {
        if (f) {
            f->inflight[op->src]--;
            s_layer_t *l = &f->layer[op->layer];
            uint32_t want = f->nchunks * f->model.kv_heads;
            if (l->gen == op->gen && l->state == L_FLIGHT) {
                if (e->status == KVEDGE_OK && l->got == want) {
                    l->state = L_DONE;
                    f->done_bytes[op->src] += l->bytes;
                    f->last_done_us[op->src] = zclock_usecs();
                    kvedge_health_success(p->health, f->psrc[op->src].name,
                                          (uint64_t)kvedge_mono_ms());
                    /* Learn what this source sends per fp16 byte, for the next plans. */
                    s_src_t *src = &p->src[f->map[op->src]];
                    if (l->fp16 > 0)
                        src->ratio = 0.5 * src->ratio + 0.5 * (double)l->bytes / (double)l->fp16;
                } else if (e->status == KVEDGE_OK) {
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
    uint32_t H = f->model.kv_heads;
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
        if (rc == KVEDGE_OK && (info.head_dim != f->model.head_dim || l->blocks[idx]))
            rc = KVEDGE_ECORRUPT;
        if (rc != KVEDGE_OK) {
            s_stat_add(p, &p->stats.corrupt, 1);
            kvedge_log_warn("source %s sent a bad block (layer %u chunk %u head %u): %s",
                            f->psrc[op->src].name, f->first + op->layer, e->chunk_index, e->head,
                            kvedge_strerror(rc));
            s_layer_failed(p, f, op->layer, KVEDGE_FETCH_FALLBACK_CORRUPT);
        } else {
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

static void s_events(s_proxy_t *p)
{
    uint64_t v;
    ssize_t r = read(p->ev_fd, &v, sizeof v);
    (void)r;
    pthread_mutex_lock(&p->ev_mu);
    s_event_t *e = p->ev_head;
    p->ev_head = p->ev_tail = NULL;
    pthread_mutex_unlock(&p->ev_mu);
    while (e) {
        s_event_t *next = e->next;
        s_event(p, e);
        e = next;
    }
}

/* Layers not delivered by the deadline (less the margin) are reported as misses. */
static void s_deadlines(s_proxy_t *p)
{
    int64_t now = kvedge_mono_ms();
    s_fetch_t *f = zlistx_first(p->fetches);
    while (f) {
        s_fetch_t *next = zlistx_next(p->fetches);
        if (!f->ended && now >= f->deadline_ms - KVEDGE_PROXY_DEADLINE_MARGIN_MS) {
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

/* Does source s (proxy index) hold layer `layer` of every chunk? From the master's block
 * directory when the source is a registered node, and the negative cache in any case. */
static bool s_holds(s_proxy_t *p, const s_src_t *s, bool in_registry, const s_fetch_t *f,
                    uint32_t layer)
{
    uint8_t key[S_NEG_KEY_BYTES];
    s_neg_key(f, layer, key);
    if (kvedge_negcache_contains(p->neg, s->conf.name, key, sizeof key, (uint64_t)kvedge_mono_ms()))
        return false;
    if (!in_registry)
        return true; /* no directory for it: assume yes, learn otherwise */
    for (uint32_t c = 0; c < f->nchunks; c++) {
        kvedge_master_dir_t d;
        if (kvedge_mview_dir(p->view, s->conf.name, &f->chunks[c], &d) != KVEDGE_OK ||
            !kvedge_master_dir_has(&d, layer))
            return false;
    }
    return true;
}

/* Builds the request's source table: every known source, priced per layer (Eq. 19 inputs:
 * its link, and the bytes it would send: the fp16 size times what it was seen to send per
 * fp16 byte). Sources not connected, down, or not holding a layer are marked so. */
static void s_fetch_sources(s_proxy_t *p, s_fetch_t *f, uint32_t tokens)
{
    uint64_t now = (uint64_t)kvedge_mono_ms();
    double fp16 = (double)tokens * f->model.kv_heads * f->model.head_dim * 2 /* K, V */ * 2;
    size_t n = atomic_load(&p->nsrc);
    f->nsrc = 0;
    for (size_t i = 0; i < n && f->nsrc < KVEDGE_PROXY_MAX_SOURCES; i++) {
        pthread_mutex_lock(&p->srcs_mu);
        s_src_t *s = &p->src[i];
        kvedge_client_t *c = s->client;
        pthread_mutex_unlock(&p->srcs_mu);
        double *b = calloc(f->L, sizeof *b);
        if (!b)
            continue;
        kvedge_plan_source_t *ps = &f->psrc[f->nsrc];
        memset(ps, 0, sizeof *ps);
        ps->kind = s->conf.kind;
        snprintf(ps->name, sizeof ps->name, "%s", s->conf.name);
        double weight = kvedge_health_weight(p->health, s->conf.name, now);
        ps->up = c && kvedge_health_usable(p->health, s->conf.name, now) && weight > 0;
        s_src_link(p, s, c, &ps->bw_bytes_per_s, &ps->rtt_us);
        if (weight > 0) /* a doubtful source (suspect, on probation) is priced as slower */
            ps->bw_bytes_per_s *= weight;
        kvedge_master_node_t rec;
        bool in_registry = p->view && kvedge_mview_node(p->view, s->conf.name, &rec) == KVEDGE_OK;
        for (uint32_t l = 0; l < f->L; l++)
            b[l] = s_holds(p, s, in_registry, f, f->first + l) ? fp16 * s->ratio : -1;
        ps->layer_bytes = b;
        f->bytes[f->nsrc] = b;
        f->client[f->nsrc] = c;
        f->map[f->nsrc] = (int)i;
        f->nsrc++;
    }
}

/* The PLAN message: sources, totals, and each layer's source and price. */
static zmsg_t *s_plan_message(const s_fetch_t *f)
{
    const kvedge_plan_t *pl = f->plan;
    kvedge_wire_fetch_plan_t w = {(uint32_t)f->nsrc,
                                  f->L,
                                  pl->split,
                                  pl->total_us,
                                  pl->bound_us,
                                  pl->cloud_only_us,
                                  pl->recompute_all_us,
                                  pl->load_then_compute_us};
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
        kvedge_wire_fetch_plan_layer_t wl = {(int16_t)pl->layer[l].source,
                                             (uint8_t)pl->layer[l].reason,
                                             isfinite(cost) ? cost : 1e300};
        kvedge_wire_fetch_plan_layer_pack(&wl, zframe_data(layers) +
                                                   (size_t)l * KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES);
    }
    zmsg_addmem(m, head, sizeof head);
    zmsg_append(m, &srcs);
    zmsg_append(m, &layers);
    return m;
}

/* A model's shape: built-in, else registered with the master. */
static int s_model(s_proxy_t *p, const char *id, kvedge_model_t *out)
{
    if (kvedge_model_builtin(id, out) == KVEDGE_OK)
        return KVEDGE_OK;
    if (p->view && kvedge_mview_model(p->view, id, out) == KVEDGE_OK)
        return KVEDGE_OK;
    return KVEDGE_ENOMODEL;
}

static void s_fetch_start(s_proxy_t *p, zframe_t *route, const kvedge_wire_header_t *h,
                          const kvedge_wire_frame_t *pf, size_t n)
{
    kvedge_wire_fetch_spec_t spec;
    kvedge_wire_fetch_spec_parse(pf[0].data, pf[0].len, &spec); /* validated already */
    s_fetch_t *f = calloc(1, sizeof *f);
    int rc = f ? KVEDGE_OK : KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK)
        rc = s_model(p, spec.model_id, &f->model);
    if (rc == KVEDGE_OK && (uint32_t)spec.first_layer + spec.layers > f->model.layers)
        rc = KVEDGE_ESHAPE;
    if (rc == KVEDGE_OK) {
        f->serial = ++p->next_serial;
        f->route = zframe_dup(route);
        f->rid = h->request_id;
        f->credit = h->credit;
        f->deadline_ms = kvedge_mono_ms() + h->deadline_ms;
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
    for (uint32_t l = 0; rc == KVEDGE_OK && l < f->L; l++) {
        f->layer[l].blocks = calloc((size_t)f->nchunks * f->model.kv_heads, sizeof(zframe_t *));
        if (!f->layer[l].blocks)
            rc = KVEDGE_ENOMEM;
    }
    if (rc == KVEDGE_OK) {
        memcpy(f->chunks, pf[1].data, (size_t)f->nchunks * KVEDGE_CHUNK_ID_BYTES);
        for (uint32_t l = 0; l < f->L; l++) {
            if (n == 3) {
                float cu, ru;
                uint32_t a = kvedge_le_get32(pf[2].data + 8 * l),
                         b = kvedge_le_get32(pf[2].data + 8 * l + 4);
                memcpy(&cu, &a, 4);
                memcpy(&ru, &b, 4);
                if (!(cu >= 0 && cu < 1e30f) || !(ru >= 0 && ru < 1e30f))
                    rc = KVEDGE_EPROTO;
                f->compute[l] = cu;
                f->recompute[l] = ru;
            } else {
                /* Fetch only: computing a layer is priced out of reach (an hour). */
                f->recompute[l] = 3.6e9;
            }
        }
        f->req = (kvedge_plan_request_t){f->L, 0, f->compute, f->recompute};
    }
    if (rc == KVEDGE_OK) {
        uint32_t tokens = spec.tokens ? spec.tokens : f->nchunks * S_TOKENS_PER_CHUNK;
        s_fetch_sources(p, f, tokens);
        rc = kvedge_plan_make(&f->req, f->psrc, f->nsrc, f->plan);
        if (rc != KVEDGE_OK)
            rc = KVEDGE_EINVAL;
    }
    if (rc != KVEDGE_OK) {
        s_fetch_free(p, f);
        s_reply_error(p, route, KVEDGE_OP_FETCH, h->request_id, rc);
        return;
    }
    s_stat_add(p, &p->stats.requests, 1);
    zmsg_t *pm = s_plan_message(f);
    if (pm)
        zlistx_add_end(f->outbox, pm);
    for (uint32_t l = 0; l < f->L; l++) {
        s_layer_t *ly = &f->layer[l];
        ly->src = f->plan->layer[l].source;
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
    zlistx_add_end(p->fetches, f);
    s_issue(p, f);
    s_deliver(p, f);
}

static s_fetch_t *s_fetch_by_route(s_proxy_t *p, zframe_t *route, uint64_t rid)
{
    for (s_fetch_t *f = zlistx_first(p->fetches); f; f = zlistx_next(p->fetches))
        if (f->rid == rid && zframe_eq(f->route, route))
            return f;
    return NULL;
}

static void s_hello(s_proxy_t *p, zframe_t *route, const kvedge_wire_header_t *h)
{
    kvedge_wire_node_info_t info = {.role = KVEDGE_ROLE_PROXY,
                                    .max_frame_bytes = KVEDGE_WIRE_MAX_FRAME_BYTES,
                                    .max_items = KVEDGE_WIRE_MAX_ITEMS,
                                    .max_chunks = KVEDGE_WIRE_MAX_CHUNKS,
                                    .max_credit = KVEDGE_WIRE_MAX_CREDIT,
                                    .default_credit = S_CREDIT_DEFAULT};
    uint8_t buf[KVEDGE_WIRE_NODE_INFO_BYTES];
    kvedge_wire_node_info_pack(&info, buf);
    zmsg_t *m = zmsg_new();
    zframe_t *hf = s_header(KVEDGE_OP_HELLO, KVEDGE_WIRE_FLAG_REPLY, h->request_id, 0, 0);
    zmsg_append(m, &hf);
    zmsg_addmem(m, buf, sizeof buf);
    zmsg_addmem(m, p->id, strlen(p->id));
    s_send(p, route, &m);
}

/* One client message. Bad input gets an error reply and changes nothing. */
static void s_request(s_proxy_t *p, zmsg_t *msg)
{
    zframe_t *route = zmsg_pop(msg);
    zframe_t *hf = zmsg_pop(msg);
    kvedge_wire_header_t h;
    int rc = route && hf ? kvedge_wire_header_parse(zframe_data(hf), zframe_size(hf), &h)
                         : KVEDGE_EPROTO;
    kvedge_wire_frame_t pf[4];
    size_t n = zmsg_size(msg);
    if (rc == KVEDGE_OK && n > 3)
        rc = KVEDGE_EPROTO;
    if (rc == KVEDGE_OK) {
        size_t i = 0;
        for (zframe_t *f = zmsg_first(msg); f; f = zmsg_next(msg), i++)
            pf[i] = (kvedge_wire_frame_t){zframe_data(f), zframe_size(f)};
        rc = kvedge_wire_validate(&h, pf, n);
    }
    if (rc != KVEDGE_OK) {
        if (route)
            s_reply_error(p, route, rc == KVEDGE_EVERSION || hf ? h.opcode : 0, h.request_id, rc);
    } else {
        switch (h.opcode) {
        case KVEDGE_OP_HELLO:
            s_hello(p, route, &h);
            break;
        case KVEDGE_OP_PING: {
            zmsg_t *m = zmsg_new();
            zframe_t *rh = s_header(KVEDGE_OP_PING, KVEDGE_WIRE_FLAG_REPLY, h.request_id, 0, 0);
            zmsg_append(m, &rh);
            zmsg_addmem(m, pf[0].data, pf[0].len);
            s_send(p, route, &m);
            break;
        }
        case KVEDGE_OP_FETCH:
            s_fetch_start(p, route, &h, pf, n);
            break;
        case KVEDGE_OP_CREDIT: {
            s_fetch_t *f = s_fetch_by_route(p, route, h.request_id);
            if (f) {
                uint64_t c = (uint64_t)f->credit + h.credit;
                f->credit = c > UINT32_MAX ? UINT32_MAX : (uint32_t)c;
                s_pump(p, f);
            }
            break;
        }
        case KVEDGE_OP_CANCEL: {
            s_fetch_t *f = s_fetch_by_route(p, route, h.request_id);
            if (f)
                s_fetch_remove(p, f);
            break;
        }
        default:
            /* A proxy serves HELLO, PING and FETCH; store operations go to a store node. */
            s_reply_error(p, route, h.opcode, h.request_id, KVEDGE_EINVAL);
            break;
        }
    }
    zframe_destroy(&route);
    zframe_destroy(&hf);
    zmsg_destroy(&msg);
}

/* ---------------------------------------------------------------- prober */

typedef struct {
    char (*ids)[KVEDGE_MASTER_MAX_ID_BYTES + 1];
    size_t n;
} s_ids_t;

static int s_collect_node(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    (void)seq;
    (void)body;
    (void)len;
    s_ids_t *acc = ctx;
    kvedge_master_key_t k;
    if (acc->n >= KVEDGE_PROXY_MAX_SOURCES ||
        kvedge_master_key_parse(key, strlen(key), &k) != KVEDGE_OK ||
        k.space != KVEDGE_MASTER_SPACE_NODE || strlen(k.a) > KVEDGE_MASTER_MAX_ID_BYTES)
        return 0;
    if (!acc->ids && !(acc->ids = calloc(KVEDGE_PROXY_MAX_SOURCES, sizeof *acc->ids)))
        return -1;
    memcpy(acc->ids[acc->n++], k.a, strlen(k.a) + 1);
    return 0;
}

/* Adds the master's registered nodes not known yet (the view's foreach runs on a copy). */
static void s_discover(s_proxy_t *p)
{
    if (!p->view)
        return;
    s_ids_t acc = {NULL, 0};
    kvedge_mview_foreach(p->view, "node/", s_collect_node, &acc);
    for (size_t i = 0; i < acc.n; i++) {
        const char *id = acc.ids[i];
        bool known = false;
        size_t n = atomic_load(&p->nsrc);
        for (size_t j = 0; j < n && !known; j++)
            known = strcmp(p->src[j].conf.name, id) == 0;
        kvedge_master_node_t rec;
        if (known || strcmp(id, p->id) == 0 || kvedge_mview_node(p->view, id, &rec) != KVEDGE_OK ||
            !rec.endpoint[0])
            continue;
        kvedge_proxy_source_t conf;
        memset(&conf, 0, sizeof conf);
        snprintf(conf.name, sizeof conf.name, "%s", id);
        snprintf(conf.endpoint, sizeof conf.endpoint, "%s", rec.endpoint);
        snprintf(conf.server_key, sizeof conf.server_key, "%s", rec.public_key);
        if (p->opts.local_node && strcmp(id, p->opts.local_node) == 0)
            conf.kind = KVEDGE_PLAN_LOCAL;
        else if (p->opts.history_node && strcmp(id, p->opts.history_node) == 0)
            conf.kind = KVEDGE_PLAN_HISTORY;
        else
            conf.kind = rec.role == KVEDGE_ROLE_CLOUD ? KVEDGE_PLAN_CLOUD : KVEDGE_PLAN_PEER;
        conf.bw_bytes_per_s = (double)rec.bandwidth_bytes_per_s;
        conf.rtt_us = rec.rtt_us;
        if (s_src_add(p, &conf) >= 0)
            kvedge_log_info("source %s (%s) from the master: %s", id,
                            kvedge_plan_kind_name(conf.kind), conf.endpoint);
    }
    free(acc.ids);
}

static void s_probe_source(s_proxy_t *p, size_t i)
{
    pthread_mutex_lock(&p->srcs_mu);
    s_src_t *s = &p->src[i];
    kvedge_client_t *c = s->client;
    kvedge_proxy_source_t conf = s->conf;
    pthread_mutex_unlock(&p->srcs_mu);
    uint64_t now = (uint64_t)kvedge_mono_ms();
    if (!c) {
        kvedge_client_opts_t o;
        kvedge_client_opts_default(&o);
        o.endpoint = conf.endpoint;
        o.server_key = conf.server_key[0] ? conf.server_key : NULL;
        o.client_cert = conf.server_key[0] ? p->cert_path : NULL;
        o.deadline_ms = S_HELLO_MS;
        o.credit = p->opts.credit;
        o.name = p->id;
        o.link = conf.link[0] ? conf.link : NULL;
        int rc = kvedge_client_connect(&o, &c);
        if (rc != KVEDGE_OK) {
            kvedge_log_debug("source %s (%s): %s", conf.name, conf.endpoint, kvedge_strerror(rc));
            kvedge_health_failure(p->health, conf.name, now, rc);
            return;
        }
        /* A first measurement of the link, so an undeclared source is not priced at the
         * defaults until a fetch has used it: a round trip, then a payload big enough to
         * feed the bandwidth estimate (access/meter.h). */
        if (conf.bw_bytes_per_s <= 0 && kvedge_client_ping(c, 0, NULL, NULL) == KVEDGE_OK)
            (void)kvedge_client_ping(c, S_PROBE_BYTES, NULL, NULL);
        pthread_mutex_lock(&p->srcs_mu);
        s->client = c;
        pthread_mutex_unlock(&p->srcs_mu);
        kvedge_health_success(p->health, conf.name, (uint64_t)kvedge_mono_ms());
        kvedge_log_info("source %s (%s) connected: %s", conf.name, kvedge_plan_kind_name(conf.kind),
                        conf.endpoint);
        return;
    }
    /* A liveness probe: keeps an idle source from looking silent, and is how a source that
     * went down is heard again (re-admission). */
    double rtt = 0;
    int rc = kvedge_client_ping(c, 0, &rtt, NULL);
    if (rc == KVEDGE_OK)
        kvedge_health_heartbeat(p->health, conf.name, (uint64_t)kvedge_mono_ms());
    else
        kvedge_health_failure(p->health, conf.name, (uint64_t)kvedge_mono_ms(), rc);
}

/* Publishes what this proxy measured of its link to each source (link/<proxy>/<node>). */
static void s_publish_links(s_proxy_t *p)
{
    if (!p->view)
        return;
    uint64_t now = (uint64_t)kvedge_mono_ms();
    size_t n = atomic_load(&p->nsrc);
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(&p->srcs_mu);
        s_src_t *s = &p->src[i];
        kvedge_client_t *c = s->client;
        bool due = now - s->last_publish_ms >= KVEDGE_PROXY_LINK_PUBLISH_MS;
        pthread_mutex_unlock(&p->srcs_mu);
        double bw = 0, rtt = 0;
        if (!c || !due)
            continue;
        s_src_link(p, s, c, &bw, &rtt);
        uint64_t samples = 0;
        kvedge_client_link(c, NULL, NULL, &samples);
        pthread_mutex_lock(&p->srcs_mu);
        samples += s->bw_samples;
        pthread_mutex_unlock(&p->srcs_mu);
        if (!samples)
            continue;
        kvedge_master_link_t lr = {.rtt_us = (uint32_t)rtt,
                                   .bw_bytes_per_s = (uint64_t)bw,
                                   .samples = samples > UINT32_MAX ? UINT32_MAX : (uint32_t)samples,
                                   .updated_ms = (uint64_t)zclock_time()};
        uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
        size_t len;
        char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
        if (kvedge_master_link_pack(&lr, body, &len) != KVEDGE_OK ||
            kvedge_master_key_format(KVEDGE_MASTER_SPACE_LINK, p->id, s->conf.name, key,
                                     sizeof key) != KVEDGE_OK)
            continue;
        if (kvedge_mview_set(p->view, key, body, len, S_PING_MS) == KVEDGE_OK) {
            pthread_mutex_lock(&p->srcs_mu);
            s->last_publish_ms = now;
            pthread_mutex_unlock(&p->srcs_mu);
        }
    }
}

static void *s_prober(void *arg)
{
    s_proxy_t *p = arg;
    pthread_mutex_lock(&p->stop_mu);
    while (!p->stop) {
        pthread_mutex_unlock(&p->stop_mu);
        s_discover(p);
        size_t n = atomic_load(&p->nsrc);
        for (size_t i = 0; i < n; i++)
            s_probe_source(p, i);
        s_publish_links(p);
        pthread_mutex_lock(&p->stop_mu);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)KVEDGE_PROXY_PROBE_MS * 1000000L;
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        while (!p->stop && pthread_cond_timedwait(&p->stop_cv, &p->stop_mu, &ts) == 0) {
        }
    }
    pthread_mutex_unlock(&p->stop_mu);
    return NULL;
}

/* ---------------------------------------------------------------- the actor */

static void s_actor(zsock_t *pipe, void *args)
{
    s_proxy_t *p = args;
    zsock_signal(pipe, 0);
    zmq_pollitem_t items[3] = {{zsock_resolve(pipe), 0, ZMQ_POLLIN, 0},
                               {zsock_resolve(p->sec.router), 0, ZMQ_POLLIN, 0},
                               {NULL, p->ev_fd, ZMQ_POLLIN, 0}};
    kvedge_log_info("proxy %s serving on %s (%s)", p->id, p->sec.endpoint,
                    p->sec.cert ? "CURVE" : "plaintext loopback");
    bool running = true;
    while (running) {
        if (zmq_poll(items, 3, S_TICK_MS) < 0 && zmq_errno() != EINTR)
            break;
        if (items[0].revents & ZMQ_POLLIN) {
            zmsg_t *m = zmsg_recv(pipe);
            char *cmd = m ? zmsg_popstr(m) : NULL;
            running = !(cmd && strcmp(cmd, "$TERM") == 0) && m;
            free(cmd);
            zmsg_destroy(&m);
        }
        for (int i = 0; i < 256 && (zsock_events(p->sec.router) & ZMQ_POLLIN); i++) {
            zmsg_t *m = zmsg_recv(p->sec.router);
            if (!m)
                break;
            s_request(p, m);
        }
        if (items[2].revents & ZMQ_POLLIN)
            s_events(p);
        s_deadlines(p);
    }
    /* Shutting down: every open FETCH ends with ECLOSED. */
    s_fetch_t *f;
    while ((f = zlistx_first(p->fetches)) != NULL) {
        s_reply_error(p, f->route, KVEDGE_OP_FETCH, f->rid, KVEDGE_ECLOSED);
        s_fetch_remove(p, f);
    }
}

/* ---------------------------------------------------------------- lifecycle */

void kvedge_proxy_opts_default(kvedge_proxy_opts_t *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof *opts);
    opts->bind = KVEDGE_PROXY_BIND_DEFAULT;
}

static void s_events_free(s_proxy_t *p)
{
    s_event_t *e = p->ev_head;
    p->ev_head = p->ev_tail = NULL;
    while (e) {
        s_event_t *next = e->next;
        zframe_destroy(&e->frame);
        if (e->kind == S_EV_DONE)
            free(e->op);
        free(e);
        e = next;
    }
}

static void s_proxy_free(s_proxy_t *p)
{
    if (!p)
        return;
    if (p->prober_started) {
        pthread_mutex_lock(&p->stop_mu);
        p->stop = true;
        pthread_cond_broadcast(&p->stop_cv);
        pthread_mutex_unlock(&p->stop_mu);
        pthread_join(p->prober, NULL);
    }
    size_t n = atomic_load(&p->nsrc);
    for (size_t i = 0; i < n; i++)
        kvedge_client_destroy(&p->src[i].client); /* their callbacks may still queue events */
    s_events_free(p);
    kvedge_mview_destroy(&p->view);
    kvedge_secure_router_close(&p->sec);
    zlistx_destroy(&p->fetches);
    kvedge_health_destroy(&p->health);
    kvedge_negcache_destroy(&p->neg);
    if (p->ev_fd >= 0)
        close(p->ev_fd);
    pthread_mutex_destroy(&p->srcs_mu);
    pthread_mutex_destroy(&p->ev_mu);
    pthread_mutex_destroy(&p->stop_mu);
    pthread_cond_destroy(&p->stop_cv);
    pthread_mutex_destroy(&p->stats_mu);
    free(p->cert_path);
    free(p->master_key);
    free(p);
}

int kvedge_proxy_start(const kvedge_proxy_opts_t *opts, kvedge_proxy_t **out, char *why,
                       size_t why_len)
{
    if (why && why_len)
        why[0] = '\0';
    if (!opts || !out || opts->nsources > KVEDGE_PROXY_MAX_SOURCES ||
        (opts->nsources && !opts->sources) || (opts->id && !kvedge_master_id_ok(opts->id)) ||
        (!opts->master != !opts->master_pub)) {
        if (why && why_len)
            snprintf(why, why_len, "invalid options (id, sources, or master without its PUB)");
        return KVEDGE_EINVAL;
    }
    *out = NULL;
    zsys_handler_set(NULL);
    s_proxy_t *p = calloc(1, sizeof *p);
    kvedge_proxy_t *self = calloc(1, sizeof *self);
    if (!p || !self) {
        free(p);
        free(self);
        return KVEDGE_ENOMEM;
    }
    p->opts = *opts;
    p->ev_fd = -1;
    if (!p->opts.bind)
        p->opts.bind = KVEDGE_PROXY_BIND_DEFAULT;
    if (!p->opts.buffer_bytes)
        p->opts.buffer_bytes = KVEDGE_PROXY_BUFFER_BYTES_DEFAULT;
    if (!p->opts.stall_min_ms)
        p->opts.stall_min_ms = KVEDGE_PROXY_STALL_MIN_MS;
    if (!p->opts.neg_ttl_ms)
        p->opts.neg_ttl_ms = KVEDGE_PROXY_NEG_TTL_MS;
    if (!p->opts.credit)
        p->opts.credit = S_CREDIT_DEFAULT;
    snprintf(p->id, sizeof p->id, "%s", opts->id ? opts->id : "proxy");
    pthread_mutex_init(&p->srcs_mu, NULL);
    pthread_mutex_init(&p->ev_mu, NULL);
    pthread_mutex_init(&p->stop_mu, NULL);
    pthread_cond_init(&p->stop_cv, NULL);
    pthread_mutex_init(&p->stats_mu, NULL);
    p->cert_path = opts->cert ? strdup(opts->cert) : NULL;
    p->master_key = opts->master_key ? strdup(opts->master_key) : NULL;
    p->health = kvedge_health_new(KVEDGE_PROXY_MAX_SOURCES);
    p->neg = kvedge_negcache_new(S_NEG_CAPACITY, p->opts.neg_ttl_ms);
    p->fetches = zlistx_new();
    p->ev_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    int rc = p->health && p->neg && p->fetches && p->ev_fd >= 0 ? KVEDGE_OK : KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK)
        rc = kvedge_secure_router_open(&p->sec, p->opts.bind, opts->insecure, opts->cert,
                                       opts->clients_dir, why, why_len);
    for (size_t i = 0; rc == KVEDGE_OK && i < opts->nsources; i++)
        s_src_add(p, &opts->sources[i]);
    if (rc == KVEDGE_OK && opts->master) {
        kvedge_mview_opts_t vo;
        kvedge_mview_opts_default(&vo);
        vo.master = opts->master;
        vo.pub = opts->master_pub;
        vo.server_key = opts->master_key;
        vo.client_cert = opts->master_key ? opts->cert : NULL;
        vo.snapshot_path = opts->snapshot;
        vo.heartbeat_id = p->id;
        vo.start_wait_ms = 1500;
        rc = kvedge_mview_start(&vo, &p->view);
        if (rc != KVEDGE_OK) {
            if (why && why_len)
                snprintf(why, why_len, "master view: %s", kvedge_strerror(rc));
        } else if (kvedge_mview_state(p->view) != KVEDGE_MVIEW_SYNCED) {
            kvedge_log_warn("master %s unreachable: planning from %s until it answers",
                            opts->master,
                            kvedge_mview_count(p->view) ? "the last snapshot" : "flags only");
        }
    }
    if (rc == KVEDGE_OK) {
        snprintf(self->endpoint, sizeof self->endpoint, "%s", p->sec.endpoint);
        snprintf(self->public_key, sizeof self->public_key, "%s", p->sec.public_key);
        self->p = p;
        p->owner = self;
        if (pthread_create(&p->prober, NULL, s_prober, p) == 0)
            p->prober_started = true;
        else
            rc = KVEDGE_ENOMEM;
    }
    if (rc == KVEDGE_OK) {
        self->actor = zactor_new(s_actor, p);
        if (!self->actor)
            rc = KVEDGE_ENOMEM;
    }
    if (rc != KVEDGE_OK) {
        s_proxy_free(p);
        free(self);
        return rc;
    }
    *out = self;
    return KVEDGE_OK;
}

void kvedge_proxy_destroy(kvedge_proxy_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_proxy_t *self = *self_p;
    zactor_destroy(&self->actor);
    s_proxy_free(self->p);
    free(self);
    *self_p = NULL;
}

const char *kvedge_proxy_endpoint(kvedge_proxy_t *p)
{
    return p ? p->endpoint : NULL;
}

const char *kvedge_proxy_public_key(kvedge_proxy_t *p)
{
    return p && p->public_key[0] ? p->public_key : NULL;
}

void kvedge_proxy_stats(kvedge_proxy_t *p, kvedge_proxy_stats_t *out)
{
    if (!p || !out)
        return;
    pthread_mutex_lock(&p->p->stats_mu);
    *out = p->p->stats;
    pthread_mutex_unlock(&p->p->stats_mu);
}

int kvedge_proxy_wait_sources(kvedge_proxy_t *self, size_t want, int timeout_ms)
{
    int64_t until = kvedge_mono_ms() + timeout_ms;
    s_proxy_t *p = self->p;
    do {
        size_t ok = 0, n = atomic_load(&p->nsrc);
        for (size_t i = 0; i < n; i++) {
            pthread_mutex_lock(&p->srcs_mu);
            bool c = p->src[i].client != NULL;
            pthread_mutex_unlock(&p->srcs_mu);
            ok += c &&
                  kvedge_health_usable(p->health, p->src[i].conf.name, (uint64_t)kvedge_mono_ms());
        }
        if (ok >= want)
            return KVEDGE_OK;
        zclock_sleep(20);
    } while (kvedge_mono_ms() < until);
    return KVEDGE_ETIMEDOUT;
}
