/* The store node: a frontend actor that owns the ROUTER socket and the GET_LAYER streams, and
 * a pool of worker actors that run requests against the engine. Workers never touch the
 * client socket, so a client that stops reading costs at most its stream's credit in memory
 * and never a worker's time. */
#include "store/node/server.h"

#include <czmq.h>
#include <sodium.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "runtime/log.h"
#include "runtime/secure.h"
#include "access/transport.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"
#include "access/codec/errwire.h"

/* Job kinds on the internal sockets (first frame, one byte). */
#define S_JOB_REQUEST                                                                              \
    'R'                   /* [kind][route][tag 16 | admin 1 | stored series 8][arrival us 8]       \
                            [header][payload...] */
#define S_JOB_READ    'S' /* [kind][stream key][seq 4 | stream serial 4][stored keys 36 each] */
#define S_TICK_MS     100 /* stream housekeeping period */
#define S_READ_WINDOW 16  /* blocks read by one worker trip */

struct kvedge_server_t {
    zactor_t *frontend;     /* the actor running s_frontend */
    char endpoint[256];     /* bound endpoint, resolved */
    char public_key[41];    /* Z85, empty when plaintext */
    char jobs_endpoint[64]; /* the inproc endpoint of the node's job queue */
    void *frontend_state;   /* the actor's s_node_t, freed after the actor stopped */
};

/* Everything the frontend and the workers share; owned by the frontend actor. */
typedef struct {
    kvedge_server_opts_t opts;
    char name[KVEDGE_WIRE_MAX_NAME_BYTES + 1];
    char jobs_ep[64];
    char results_ep[64];
    uint8_t loopback_tag[16];
    zcertstore_t *allow;        /* allowlist, for the tenant metadata of client keys */
    kvedge_secure_router_t sec; /* the ROUTER, its certificate and ZAP handler */
    zcert_t *cert;              /* sec.cert: node certificate (NULL when plaintext) */
    zsock_t *router;            /* sec.router */
    zsock_t *jobs;              /* PUSH to workers */
    zsock_t *results;           /* PULL from workers */
    zactor_t **workers;
    int n_workers;
    zhashx_t *streams;    /* stream key -> s_stream_t */
    zhashx_t *tenants;    /* tenant name -> kvedge_analyzer_tenant_t (frontend's cache) */
    uint64_t outstanding; /* jobs pushed, results not yet back */
    uint32_t serials;     /* streams opened: tells a stream's reads from an earlier one's */
    bool draining;        /* shutting down: new requests are answered ECLOSED */
    char *start_error;    /* set when start fails, read by kvedge_server_start */
    int start_rc;
    kvedge_server_t *owner;
    /* Precisions derived for readers since start, and those kept as variants (workers). */
    _Atomic uint64_t derived;
    _Atomic uint64_t derived_kept;
    /* A full disk: said once when it fills, again at most once a minute while it stays
     * full (with the count refused meanwhile), and once when it has room again (workers). */
    pthread_mutex_t disk_mu;
    bool disk_full_said;
    uint64_t disk_said_ms;
    uint64_t disk_refused_unsaid;
} s_node_t;

#define S_DISK_LOG_INTERVAL_MS 60000
#define S_DISK_ROOM_MAX_BYTES  (1ull << 30)

/* Says what a put's outcome tells of the disk: refused for want of space, or going again. */
static void s_disk_note(s_node_t *n, int rc)
{
    if (rc != KVEDGE_ENOSPC && (rc != KVEDGE_OK || !n->disk_full_said))
        return;
    pthread_mutex_lock(&n->disk_mu);
    uint64_t now = (uint64_t)kvedge_mono_ms();
    kvedge_engine_disk_t d;
    bool have = kvedge_engine_disk(n->opts.engine, &d) == KVEDGE_OK;
    const char *dir = kvedge_engine_dir(n->opts.engine);
    if (rc == KVEDGE_ENOSPC) {
        n->disk_refused_unsaid++;
        if (!n->disk_full_said || now - n->disk_said_ms >= S_DISK_LOG_INTERVAL_MS) {
            kvedge_log_warn("disk full: store %s has %.1f MiB free of %.1f MiB; %llu block "
                            "write(s) refused with KVEDGE_ENOSPC%s; reads go on. Free space: "
                            "kvedge delete / evict (a refused write compacts what they free), "
                            "a lower --capacity, or a larger disk",
                            dir, have ? (double)d.free_bytes / 1048576.0 : 0.0,
                            have ? (double)d.fs_bytes / 1048576.0 : 0.0,
                            (unsigned long long)n->disk_refused_unsaid,
                            n->disk_full_said ? " in the last minute" : "");
            n->disk_full_said = true;
            n->disk_said_ms = now;
            n->disk_refused_unsaid = 0;
        }
    } else if (n->disk_full_said && have &&
               d.free_bytes >= (d.fs_bytes / 4 < S_DISK_ROOM_MAX_BYTES ? d.fs_bytes / 4
                                                                       : S_DISK_ROOM_MAX_BYTES)) {
        /* Said only with room to spare (a quarter of the disk, at most 1 GiB): a disk at its
         * edge takes one block and refuses the next. */
        kvedge_log_info("disk has room again: store %s has %.1f MiB free; writes are accepted", dir,
                        have ? (double)d.free_bytes / 1048576.0 : 0.0);
        n->disk_full_said = false;
        n->disk_refused_unsaid = 0;
    }
    pthread_mutex_unlock(&n->disk_mu);
}

/* ---------------------------------------------------------------- tenants */

/* The tenant of the peer that sent frame f: from the CURVE key the ZAP handler accepted
 * (User-Id), mapped through the allowlist certificate's "tenant" metadata when present. */
static bool s_tenant_of(s_node_t *n, zframe_t *f, uint8_t tag[16], const char **name)
{
    const char *user = n->cert ? zframe_meta(f, "User-Id") : NULL;
    if (!user || !*user) {
        memcpy(tag, n->loopback_tag, 16);
        *name = KVEDGE_LOOPBACK_TENANT;
        return true; /* plaintext exists only on loopback: the operator's own machine */
    }
    zcert_t *c = n->allow ? zcertstore_lookup(n->allow, user) : NULL;
    const char *tenant = c ? zcert_meta(c, "tenant") : NULL;
    const char *admin = c ? zcert_meta(c, "admin") : NULL;
    *name = tenant && *tenant ? tenant : user;
    kvedge_tenant_tag(*name, tag);
    return admin && (strcmp(admin, "1") == 0 || strcmp(admin, "true") == 0);
}

/* The tenant's series, cached by name on the frontend (the analyzer bounds the series; the
 * cache holds at most what the allowlist lets in, and is cut at 4096 names). */
static kvedge_analyzer_tenant_t s_tenant_series(s_node_t *n, const char *name)
{
    kvedge_analyzer_tenant_t t = {NULL, NULL};
    if (!n->opts.analyzer)
        return t;
    kvedge_analyzer_tenant_t *c = n->tenants ? zhashx_lookup(n->tenants, name) : NULL;
    if (c)
        return *c;
    kvedge_analyzer_tenant(n->opts.analyzer, name, &t);
    if (n->tenants && zhashx_size(n->tenants) < 4096 && (c = malloc(sizeof *c)) != NULL) {
        *c = t;
        if (zhashx_insert(n->tenants, name, c) != 0)
            free(c);
    }
    return t;
}

/* Payload bytes of a message's frames from the first payload frame on. */
static uint64_t s_msg_bytes(zmsg_t *m, bool skip_route_and_header)
{
    uint64_t b = 0;
    size_t i = 0;
    for (zframe_t *f = zmsg_first(m); f; f = zmsg_next(m), i++)
        if (!skip_route_and_header || i >= 2)
            b += zframe_size(f);
    return b;
}

/* A quarantine found by a client read: counted, and logged at most once a second. */
static void s_quarantined(s_node_t *n, const kvedge_block_key_t *k)
{
    static _Atomic uint64_t last_ms, suppressed;
    kvedge_analyzer_quarantine(n->opts.analyzer);
    uint64_t now = (uint64_t)kvedge_mono_ms(), last = atomic_load(&last_ms);
    if (now < last + 1000 || !atomic_compare_exchange_strong(&last_ms, &last, now)) {
        atomic_fetch_add(&suppressed, 1);
        return;
    }
    char hex[17];
    for (int i = 0; i < 8; i++)
        snprintf(hex + 2 * i, 3, "%02x", k->chunk.bytes[i]);
    uint64_t more = atomic_exchange(&suppressed, 0);
    kvedge_log_warn("block %s… layer %u head %u failed verification: moved to quarantine, "
                    "served as a miss (kvedge verify lists it)%s",
                    hex, k->layer, k->head, more ? " (and earlier ones not logged)" : "");
}

/* ---------------------------------------------------------------- messages */

static zframe_t *s_header_frame(uint8_t opcode, uint16_t flags, uint64_t id, int32_t status,
                                uint32_t count)
{
    kvedge_wire_header_t h = {KVEDGE_WIRE_VERSION, opcode, flags, id, status, count, 0, 0};
    uint8_t buf[KVEDGE_WIRE_HEADER_BYTES];
    kvedge_wire_header_pack(&h, buf);
    return zframe_new(buf, sizeof buf);
}

/* A reply with a status and no payload: [route][header]. Takes ownership of route. An
 * answer to GET_LAYER is the end message of its stream. */
static zmsg_t *s_error_reply(zframe_t *route, uint8_t opcode, uint64_t id, int32_t status)
{
    zmsg_t *m = zmsg_new();
    zmsg_append(m, &route);
    uint16_t flags =
        KVEDGE_WIRE_FLAG_REPLY | (opcode == KVEDGE_OP_GET_LAYER ? KVEDGE_WIRE_FLAG_END : 0);
    zframe_t *h = s_header_frame(opcode, flags, id, status, 0);
    zmsg_append(m, &h);
    return m;
}

/* Collects a message's payload frames (after the header) as wire frames. */
static size_t s_payload(zmsg_t *m, kvedge_wire_frame_t *out, size_t max)
{
    size_t n = 0;
    for (zframe_t *f = zmsg_first(m); f; f = zmsg_next(m)) {
        if (n == max)
            return max + 1;
        out[n].data = zframe_data(f);
        out[n].len = zframe_size(f);
        n++;
    }
    return n;
}

static void s_send(s_node_t *n, zmsg_t **m)
{
    /* ROUTER_MANDATORY and no send timeout: a gone or stalled peer costs a dropped reply,
     * never a blocked frontend. */
    if (zmsg_send(m, n->router) != 0) {
        kvedge_log_debug("reply dropped: %s", zmq_strerror(zmq_errno()));
        zmsg_destroy(m);
    }
}

/* ---------------------------------------------------------------- worker side */

static uint32_t s_model_heads(kvedge_engine_t *e, const kvedge_chunk_info_t *c, kvedge_model_t *m)
{
    return kvedge_engine_get_tenant_model(e, c->tenant, c->model_id, m) == KVEDGE_OK ? m->kv_heads
                                                                                     : 0;
}

/* The namespace a tenant's MODEL registers in: its own, except for plaintext loopback clients
 * (the operator's machine), whose registrations are node-wide as they always were. */
static const uint8_t *s_model_ns(const s_node_t *n, const uint8_t tag[16])
{
    return memcmp(tag, n->loopback_tag, 16) == 0 ? NULL : tag;
}

/* Registers a built-in model on first use, so clients need no MODEL call for them. */
static void s_ensure_builtin_model(kvedge_engine_t *e, const char *model_id)
{
    kvedge_model_t m;
    if (kvedge_engine_get_model(e, model_id, &m) == KVEDGE_OK)
        return;
    if (kvedge_model_builtin(model_id, &m) == KVEDGE_OK)
        kvedge_engine_put_model(e, &m);
}

static zframe_t *s_status_frame(const int32_t *st, uint32_t n)
{
    zframe_t *f = zframe_new(NULL, (size_t)n * 4);
    for (uint32_t i = 0; i < n; i++)
        kvedge_le_put32(zframe_data(f) + 4 * i, (uint32_t)kvedge_err_to_wire(st[i]));
    return f;
}

static void s_do_put(s_node_t *n, const uint8_t tag[16], kvedge_series_t *stored,
                     const kvedge_wire_header_t *h, const kvedge_wire_frame_t *pf, zmsg_t *reply)
{
    int32_t *st = calloc(h->count, sizeof *st);
    for (uint32_t i = 0; st && i < h->count; i++) {
        kvedge_wire_put_item_t item;
        int rc = kvedge_wire_put_item_parse(pf[2 * i].data, pf[2 * i].len, &item);
        if (rc == KVEDGE_OK) {
            kvedge_chunk_info_t info = item.chunk;
            memcpy(info.tenant, tag, 16);
            info.name = item.chunk.id;
            kvedge_tenant_chunk_id(tag, &item.chunk.id, &info.id);
            if (item.chunk.has_parent)
                kvedge_tenant_chunk_id(tag, &item.chunk.parent, &info.parent);
            s_ensure_builtin_model(n->opts.engine, info.model_id);
            kvedge_put_opts_t po = {item.ttl_s, item.pin};
            rc = kvedge_engine_put(n->opts.engine, &info, item.layer, item.head, pf[2 * i + 1].data,
                                   pf[2 * i + 1].len, &po);
            if (rc == KVEDGE_OK)
                kvedge_series_add(stored, pf[2 * i + 1].len);
            s_disk_note(n, rc);
        }
        st[i] = rc;
    }
    zframe_t *f = st ? s_status_frame(st, h->count) : NULL;
    zframe_t *hdr = s_header_frame(KVEDGE_OP_PUT, KVEDGE_WIRE_FLAG_REPLY, h->request_id,
                                   st ? KVEDGE_OK : KVEDGE_ENOMEM, st ? h->count : 0);
    zmsg_append(reply, &hdr);
    if (f)
        zmsg_append(reply, &f);
    free(st);
}

/* The accept list of a GET or GET_LAYER (its optional frame at `at`): 0 and *na = 0 without
 * one, KVEDGE_EINVAL for a list kvedge_prec_list_check refuses. An empty list with a frame
 * after it (GET_LAYER's pack frame) only keeps the positions: no list. */
static int s_accept(const kvedge_wire_frame_t *f, size_t npf, size_t at, kvedge_prec_t *accept,
                    size_t *na)
{
    *na = 0;
    if (npf <= at || (f[at].len == 0 && npf > at + 1))
        return KVEDGE_OK;
    if (f[at].len > KVEDGE_PREC_MAX_ACCEPT ||
        kvedge_prec_list_check(f[at].data, f[at].len) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    memcpy(accept, f[at].data, f[at].len);
    *na = f[at].len;
    return KVEDGE_OK;
}

/* One block for a reader: as stored without an accept list, else at the first precision of
 * the list the store holds or (settings allowing) derives; a derived block is kept as a
 * variant when the settings say so. */
static int s_read_block(s_node_t *n, const kvedge_block_key_t *k, const kvedge_prec_t *accept,
                        size_t na, kvedge_value_t *v)
{
    if (na == 0)
        return kvedge_engine_get(n->opts.engine, k, v);
    kvedge_prec_t served = KVEDGE_PREC_STORED;
    bool derived = false;
    int rc = kvedge_engine_get_prec(n->opts.engine, k, accept, na, !n->opts.no_derive, v, &served,
                                    &derived);
    if (rc == KVEDGE_OK && derived) {
        atomic_fetch_add(&n->derived, 1);
        if (n->opts.keep_derived &&
            kvedge_engine_put_variant(n->opts.engine, k, served, v->data, v->len) == KVEDGE_OK)
            atomic_fetch_add(&n->derived_kept, 1);
    }
    return rc;
}

static void s_do_get(s_node_t *n, size_t shard, const uint8_t tag[16],
                     const kvedge_wire_header_t *h, const kvedge_wire_frame_t *pf, size_t npf,
                     zmsg_t *reply)
{
    kvedge_prec_t accept[KVEDGE_PREC_MAX_ACCEPT];
    size_t na;
    if (s_accept(pf, npf, 1, accept, &na) != KVEDGE_OK) {
        zframe_t *hdr =
            s_header_frame(KVEDGE_OP_GET, KVEDGE_WIRE_FLAG_REPLY, h->request_id, KVEDGE_EINVAL, 0);
        zmsg_append(reply, &hdr);
        return;
    }
    int32_t *st = calloc(h->count, sizeof *st);
    zmsg_t *blocks = zmsg_new();
    uint64_t total = 0;
    for (uint32_t i = 0; st && i < h->count; i++) {
        kvedge_block_key_t k;
        kvedge_wire_key_parse(pf[0].data + (size_t)i * KVEDGE_WIRE_KEY_BYTES, &k);
        kvedge_tenant_chunk_id(tag, &k.chunk, &k.chunk);
        kvedge_value_t v = {0};
        int rc = s_read_block(n, &k, accept, na, &v);
        if (rc == KVEDGE_OK && total + v.len > KVEDGE_WIRE_MAX_REPLY_BYTES)
            rc = KVEDGE_ETOOBIG;
        if (rc == KVEDGE_OK) {
            zmsg_addmem(blocks, v.data, v.len);
            total += v.len;
            kvedge_analyzer_touch(n->opts.analyzer, shard, &k.chunk, NULL, k.layer, k.head, v.len);
        } else if (rc == KVEDGE_ECORRUPT) {
            s_quarantined(n, &k);
        }
        kvedge_analyzer_read(n->opts.analyzer, rc, rc == KVEDGE_OK ? v.data : NULL,
                             rc == KVEDGE_OK ? v.len : 0);
        kvedge_value_release(&v);
        st[i] = rc;
    }
    zframe_t *hdr = s_header_frame(KVEDGE_OP_GET, KVEDGE_WIRE_FLAG_REPLY, h->request_id,
                                   st ? KVEDGE_OK : KVEDGE_ENOMEM, st ? h->count : 0);
    zmsg_append(reply, &hdr);
    if (st) {
        zframe_t *f = s_status_frame(st, h->count);
        zmsg_append(reply, &f);
        zframe_t *b;
        while ((b = zmsg_pop(blocks)) != NULL)
            zmsg_append(reply, &b);
    }
    zmsg_destroy(&blocks);
    free(st);
}

typedef struct {
    uint32_t blocks, pinned;
    uint64_t bytes, fp16;
} s_chunk_count_t;

static int s_count_meta(void *ctx, const kvedge_block_key_t *key, const kvedge_block_meta_t *m)
{
    (void)key;
    s_chunk_count_t *c = ctx;
    c->blocks++;
    c->pinned += m->pinned;
    c->bytes += m->bytes;
    c->fp16 += kvedge_block_fp16_bytes(m->tokens, m->head_dim);
    return 0;
}

typedef struct {
    const kvedge_model_t *model;
    uint32_t blocks; /* inside the model's shape */
} s_shape_count_t;

static int s_count_in_shape(void *ctx, const kvedge_block_key_t *key, const kvedge_block_meta_t *m)
{
    (void)m;
    s_shape_count_t *c = ctx;
    c->blocks += key->layer < c->model->layers && key->head < c->model->kv_heads;
    return 0;
}

/* The longest prefix of chunks the tenant holds whole: a chunk counts only when every block
 * of its model (layers x KV heads) is present, so a chunk a crash left half-written (an
 * unacknowledged PUT) is a miss, not a short hit. */
static void s_do_lookup(s_node_t *n, const uint8_t tag[16], const kvedge_wire_header_t *h,
                        const kvedge_wire_frame_t *pf, zmsg_t *reply)
{
    uint32_t *blocks = calloc(h->count, sizeof *blocks), k = 0;
    for (; blocks && k < h->count; k++) {
        kvedge_chunk_id_t id;
        memcpy(id.bytes, pf[0].data + (size_t)k * KVEDGE_CHUNK_ID_BYTES, KVEDGE_CHUNK_ID_BYTES);
        kvedge_tenant_chunk_id(tag, &id, &id);
        kvedge_chunk_info_t info;
        if (kvedge_engine_get_chunk(n->opts.engine, &id, &info) != KVEDGE_OK)
            break;
        kvedge_model_t model;
        if (s_model_heads(n->opts.engine, &info, &model) == 0)
            break; /* no shape: no way to tell the chunk is whole */
        s_shape_count_t c = {&model, 0};
        if (kvedge_engine_scan(n->opts.engine, &id, s_count_in_shape, &c) != KVEDGE_OK ||
            c.blocks < (uint32_t)model.layers * model.kv_heads)
            break;
        blocks[k] = c.blocks;
    }
    zframe_t *hdr = s_header_frame(KVEDGE_OP_LOOKUP, KVEDGE_WIRE_FLAG_REPLY, h->request_id,
                                   blocks ? KVEDGE_OK : KVEDGE_ENOMEM, blocks ? k : 0);
    zmsg_append(reply, &hdr);
    if (blocks) {
        zframe_t *f = zframe_new(NULL, (size_t)k * 4);
        for (uint32_t i = 0; i < k; i++)
            kvedge_le_put32(zframe_data(f) + 4 * i, blocks[i]);
        zmsg_append(reply, &f);
    }
    free(blocks);
}

typedef struct {
    const uint8_t *tag;
    const uint8_t *after; /* client id cursor or NULL */
    uint32_t max;
    kvedge_chunk_info_t *rows;
    uint32_t n, cap;
    bool more;
} s_list_t;

/* Keeps the `max` smallest client ids above the cursor, among the tenant's chunks. */
static int s_list_cb(void *ctx, const kvedge_chunk_info_t *info)
{
    s_list_t *l = ctx;
    if (memcmp(info->tenant, l->tag, 16) != 0)
        return 0;
    if (l->after && memcmp(info->name.bytes, l->after, KVEDGE_CHUNK_ID_BYTES) <= 0)
        return 0;
    uint32_t pos = l->n;
    while (pos > 0 &&
           memcmp(l->rows[pos - 1].name.bytes, info->name.bytes, KVEDGE_CHUNK_ID_BYTES) > 0)
        pos--;
    if (pos >= l->max) {
        l->more = true;
        return 0;
    }
    if (l->n == l->max) {
        l->more = true;
        l->n--; /* the largest falls off */
    }
    memmove(&l->rows[pos + 1], &l->rows[pos], (l->n - pos) * sizeof l->rows[0]);
    l->rows[pos] = *info;
    l->n++;
    return 0;
}

static void s_do_list(s_node_t *n, const uint8_t tag[16], const kvedge_wire_header_t *h,
                      const kvedge_wire_frame_t *pf, zmsg_t *reply)
{
    s_list_t l = {tag,  pf[0].len ? pf[0].data : NULL, kvedge_le_get32(pf[1].data), NULL, 0, 0,
                  false};
    l.rows = calloc(l.max + 1, sizeof *l.rows);
    int rc = l.rows ? kvedge_engine_list_chunks(n->opts.engine, s_list_cb, &l) : KVEDGE_ENOMEM;
    zframe_t *hdr =
        s_header_frame(KVEDGE_OP_LIST, KVEDGE_WIRE_FLAG_REPLY | (l.more ? 0 : KVEDGE_WIRE_FLAG_END),
                       h->request_id, rc, rc == KVEDGE_OK ? l.n : 0);
    zmsg_append(reply, &hdr);
    if (rc == KVEDGE_OK) {
        zframe_t *f = zframe_new(NULL, (size_t)l.n * KVEDGE_WIRE_CHUNK_ENTRY_BYTES);
        for (uint32_t i = 0; i < l.n; i++) {
            s_chunk_count_t c = {0, 0, 0, 0};
            kvedge_engine_scan(n->opts.engine, &l.rows[i].id, s_count_meta, &c);
            kvedge_wire_chunk_entry_t e;
            memset(&e, 0, sizeof e);
            e.chunk = l.rows[i];
            e.chunk.id = l.rows[i].name; /* speak in the client's ids */
            if (l.rows[i].has_parent) {
                kvedge_chunk_info_t parent;
                if (kvedge_engine_get_chunk(n->opts.engine, &l.rows[i].parent, &parent) ==
                    KVEDGE_OK)
                    e.chunk.parent = parent.name;
                else
                    memset(&e.chunk.parent, 0, sizeof e.chunk.parent);
            }
            e.blocks = c.blocks;
            e.bytes = c.bytes;
            e.pinned_blocks = c.pinned;
            e.fp16_bytes = c.fp16;
            /* Model ids the wire cannot carry (over 123 bytes) are sent empty-handed:
             * the entry still counts; only a local admin sees such ids. */
            if (kvedge_wire_chunk_entry_pack(
                    &e, zframe_data(f) + (size_t)i * KVEDGE_WIRE_CHUNK_ENTRY_BYTES) != KVEDGE_OK) {
                snprintf(e.chunk.model_id, sizeof e.chunk.model_id, "?");
                kvedge_wire_chunk_entry_pack(&e, zframe_data(f) +
                                                     (size_t)i * KVEDGE_WIRE_CHUNK_ENTRY_BYTES);
            }
        }
        zmsg_append(reply, &f);
    }
    free(l.rows);
}

/* DELETE, PIN, UNPIN: one u32 per chunk. */
static void s_do_chunks(s_node_t *n, const uint8_t tag[16], const kvedge_wire_header_t *h,
                        const kvedge_wire_frame_t *pf, zmsg_t *reply)
{
    zframe_t *f = zframe_new(NULL, (size_t)h->count * 4);
    int rc = KVEDGE_OK;
    for (uint32_t i = 0; i < h->count && rc == KVEDGE_OK; i++) {
        kvedge_chunk_id_t id;
        memcpy(id.bytes, pf[0].data + (size_t)i * KVEDGE_CHUNK_ID_BYTES, KVEDGE_CHUNK_ID_BYTES);
        kvedge_tenant_chunk_id(tag, &id, &id);
        uint64_t changed = 0;
        int r = h->opcode == KVEDGE_OP_DELETE
                    ? kvedge_engine_delete_chunk(n->opts.engine, &id, true, &changed)
                    : kvedge_engine_pin_chunk(n->opts.engine, &id, h->opcode == KVEDGE_OP_PIN,
                                              &changed);
        if (r != KVEDGE_OK && r != KVEDGE_ENOTFOUND) /* a chunk not there changes nothing */
            rc = r;
        kvedge_le_put32(zframe_data(f) + 4 * i,
                        changed > UINT32_MAX ? UINT32_MAX : (uint32_t)changed);
    }
    zframe_t *hdr = s_header_frame(h->opcode, KVEDGE_WIRE_FLAG_REPLY, h->request_id, rc,
                                   rc == KVEDGE_OK ? h->count : 0);
    zmsg_append(reply, &hdr);
    if (rc == KVEDGE_OK)
        zmsg_append(reply, &f);
    zframe_destroy(&f);
}

/* Store-wide eviction: only for keys whose allowlist certificate says admin = true. */
static void s_do_evict(s_node_t *n, bool admin, const kvedge_wire_header_t *h,
                       const kvedge_wire_frame_t *pf, zmsg_t *reply)
{
    uint64_t target =
        (uint64_t)kvedge_le_get32(pf[0].data) | (uint64_t)kvedge_le_get32(pf[0].data + 4) << 32;
    uint64_t blocks = 0, bytes = 0;
    int rc = admin ? kvedge_engine_evict(n->opts.engine, target, &blocks, &bytes) : KVEDGE_EDENIED;
    zframe_t *hdr = s_header_frame(KVEDGE_OP_EVICT, KVEDGE_WIRE_FLAG_REPLY, h->request_id, rc, 0);
    zmsg_append(reply, &hdr);
    if (rc == KVEDGE_OK) {
        uint8_t out[16];
        kvedge_le_put32(out, (uint32_t)blocks);
        kvedge_le_put32(out + 4, (uint32_t)(blocks >> 32));
        kvedge_le_put32(out + 8, (uint32_t)bytes);
        kvedge_le_put32(out + 12, (uint32_t)(bytes >> 32));
        zmsg_addmem(reply, out, sizeof out);
    }
    if (rc == KVEDGE_OK || rc == KVEDGE_EFULL)
        kvedge_log_info("evict to %llu bytes: %llu blocks, %llu bytes%s",
                        (unsigned long long)target, (unsigned long long)blocks,
                        (unsigned long long)bytes, rc ? " (pinned blocks remain over target)" : "");
}

/* Model records are immutable and namespaced per tenant: a tenant registers ids in its own
 * namespace, so no tenant can claim an id for another; built-in ids and the node-wide records
 * (plaintext loopback clients', and those of a store written before namespaces) bind their id
 * for every tenant, and a registration with another shape than the one the tenant sees is
 * refused with KVEDGE_ESHAPE. A query tells the shape the tenant sees. */
static void s_do_model(s_node_t *n, const uint8_t tag[16], const kvedge_wire_header_t *h,
                       const kvedge_wire_frame_t *pf, zmsg_t *reply)
{
    kvedge_model_t m, have;
    int rc;
    if (kvedge_wire_model_query_parse(pf[0].data, pf[0].len, m.id) == KVEDGE_OK) {
        s_ensure_builtin_model(n->opts.engine, m.id); /* a query: register nothing else */
        rc = kvedge_engine_get_tenant_model(n->opts.engine, tag, m.id, &have);
    } else {
        rc = kvedge_wire_model_parse(pf[0].data, pf[0].len, &m);
        if (rc == KVEDGE_OK)
            rc = kvedge_engine_put_tenant_model(n->opts.engine, s_model_ns(n, tag), &m);
        if (rc == KVEDGE_OK) /* the shape the tenant now sees */
            rc = kvedge_engine_get_tenant_model(n->opts.engine, tag, m.id, &have);
    }
    zframe_t *hdr = s_header_frame(KVEDGE_OP_MODEL, KVEDGE_WIRE_FLAG_REPLY, h->request_id, rc, 0);
    zmsg_append(reply, &hdr);
    if (rc == KVEDGE_OK) {
        zframe_t *f = zframe_new(NULL, KVEDGE_WIRE_MODEL_BYTES);
        kvedge_wire_model_pack(&have, zframe_data(f));
        zmsg_append(reply, &f);
    }
}

/* Runs one request job (in worker `shard`); returns the reply [route][header][payload...]. */
static zmsg_t *s_run_request(s_node_t *n, size_t shard, zmsg_t *job)
{
    zframe_t *route = zmsg_pop(job), *tagf = zmsg_pop(job), *arrf = zmsg_pop(job);
    zframe_t *hf = zmsg_pop(job);
    uint8_t tag[16];
    uint64_t arrival_us = 0;
    kvedge_series_t *stored = NULL;
    memcpy(tag, zframe_data(tagf), 16);
    bool admin = zframe_data(tagf)[16] != 0;
    memcpy(&stored, zframe_data(tagf) + 17, sizeof stored);
    memcpy(&arrival_us, zframe_data(arrf), 8);
    uint64_t in_bytes = s_msg_bytes(job, false);
    kvedge_wire_header_t h;
    kvedge_wire_header_parse(zframe_data(hf), zframe_size(hf), &h); /* checked by frontend */
    kvedge_wire_frame_t pf[KVEDGE_WIRE_MAX_FRAMES];
    size_t npf = s_payload(job, pf, KVEDGE_WIRE_MAX_FRAMES);
    zmsg_t *reply = zmsg_new();
    zmsg_append(reply, &route);
    if ((uint64_t)kvedge_mono_us() > arrival_us + (uint64_t)h.deadline_ms * 1000) {
        /* The client has given up: answering is cheap, doing the work is not. */
        zframe_t *hdr =
            s_header_frame(h.opcode, KVEDGE_WIRE_FLAG_REPLY, h.request_id, KVEDGE_ETIMEDOUT, 0);
        zmsg_append(reply, &hdr);
    } else {
        switch (h.opcode) {
        case KVEDGE_OP_PUT:
            s_do_put(n, tag, stored, &h, pf, reply);
            break;
        case KVEDGE_OP_GET:
            s_do_get(n, shard, tag, &h, pf, npf, reply);
            break;
        case KVEDGE_OP_LOOKUP:
            s_do_lookup(n, tag, &h, pf, reply);
            break;
        case KVEDGE_OP_LIST:
            s_do_list(n, tag, &h, pf, reply);
            break;
        case KVEDGE_OP_DELETE:
        case KVEDGE_OP_PIN:
        case KVEDGE_OP_UNPIN:
            s_do_chunks(n, tag, &h, pf, reply);
            break;
        case KVEDGE_OP_MODEL:
            s_do_model(n, tag, &h, pf, reply);
            break;
        case KVEDGE_OP_EVICT:
            s_do_evict(n, admin, &h, pf, reply);
            break;
        default: {
            zframe_t *hdr =
                s_header_frame(h.opcode, KVEDGE_WIRE_FLAG_REPLY, h.request_id, KVEDGE_EPROTO, 0);
            zmsg_append(reply, &hdr);
        }
        }
    }
    if (n->opts.analyzer) {
        kvedge_wire_header_t rh;
        zmsg_first(reply);
        zframe_t *rf = zmsg_next(reply); /* the reply header, after the route */
        int32_t status = rf && kvedge_wire_header_parse(zframe_data(rf), zframe_size(rf), &rh) == 0
                             ? rh.status
                             : KVEDGE_EPROTO;
        kvedge_analyzer_request(n->opts.analyzer, h.opcode, status, kvedge_mono_us() - arrival_us,
                                in_bytes, s_msg_bytes(reply, true));
    }
    zframe_destroy(&tagf);
    zframe_destroy(&arrf);
    zframe_destroy(&hf);
    return reply;
}

/* Reads one block of a stream: [kind][stream key][seq][status 4][block?]. */
/* Frees a block whose bytes travelled zero-copy: called by libzmq once the message is gone
 * (sent on the wire or dropped), on whatever thread releases it last. */
static void s_release_value(void *data, void *hint)
{
    (void)data;
    kvedge_value_t *v = hint;
    kvedge_value_release(v);
    free(v);
}

static int s_send_part(void *sock, zmq_msg_t *m, bool more)
{
    int rc = zmq_msg_send(m, sock, more ? ZMQ_SNDMORE : 0);
    if (rc < 0)
        zmq_msg_close(m);
    return rc < 0 ? -1 : 0;
}

static int s_send_mem(void *sock, const void *data, size_t len, bool more)
{
    zmq_msg_t m;
    zmq_msg_init_size(&m, len);
    memcpy(zmq_msg_data(&m), data, len);
    return s_send_part(sock, &m, more);
}

/* Reads a window of a stream's blocks and sends them to the frontend in one message:
 * [S][stream key][seq0 4 | stream serial 4][n 4] then per block [status 4][block, only when status
 * is 0]. The block bytes are not copied: the frame points into the engine's value (its cache
 * entry), released when libzmq is done with it. */
static void s_run_read(s_node_t *n, zmsg_t *job, zsock_t *results)
{
    zframe_t *key = zmsg_pop(job), *seq = zmsg_pop(job), *keys = zmsg_pop(job);
    zframe_t *acc = zmsg_pop(job); /* the stream's accept list (checked at open), or none */
    size_t na = acc ? zframe_size(acc) : 0;
    kvedge_prec_t accept[KVEDGE_PREC_MAX_ACCEPT];
    if (na > KVEDGE_PREC_MAX_ACCEPT)
        na = 0;
    if (na)
        memcpy(accept, zframe_data(acc), na);
    void *sock = zsock_resolve(results);
    uint32_t count = (uint32_t)(zframe_size(keys) / KVEDGE_BLOCK_KEY_BYTES);
    uint8_t nb[4];
    kvedge_le_put32(nb, count);
    s_send_mem(sock, "S", 1, true);
    s_send_mem(sock, zframe_data(key), zframe_size(key), true);
    s_send_mem(sock, zframe_data(seq), zframe_size(seq), true);
    s_send_mem(sock, nb, 4, count > 0);
    for (uint32_t i = 0; i < count; i++) {
        kvedge_block_key_t k;
        kvedge_block_key_unpack(zframe_data(keys) + (size_t)i * KVEDGE_BLOCK_KEY_BYTES, &k);
        kvedge_value_t *v = calloc(1, sizeof *v);
        int rc = v ? s_read_block(n, &k, accept, na, v) : KVEDGE_ENOMEM;
        if (rc == KVEDGE_ECORRUPT)
            s_quarantined(n, &k);
        uint8_t st[4];
        kvedge_le_put32(st, (uint32_t)rc);
        bool last = i + 1 == count;
        s_send_mem(sock, st, 4, rc == KVEDGE_OK || !last);
        if (rc == KVEDGE_OK) {
            zmq_msg_t m;
            zmq_msg_init_data(&m, (void *)v->data, v->len, s_release_value, v);
            s_send_part(sock, &m, !last);
        } else {
            free(v);
        }
    }
    zframe_destroy(&key);
    zframe_destroy(&seq);
    zframe_destroy(&keys);
    zframe_destroy(&acc);
}

typedef struct {
    s_node_t *node;
    size_t shard; /* the worker's hot table: 1 + its index */
} s_worker_arg_t;

static void s_worker(zsock_t *pipe, void *args)
{
    s_worker_arg_t *wa = args;
    s_node_t *n = wa->node;
    size_t shard = wa->shard;
    free(wa);
    zsock_t *jobs = zsock_new(ZMQ_PULL), *results = zsock_new(ZMQ_PUSH);
    zsock_set_rcvhwm(jobs, 2); /* take work only when free: the rest waits in the frontend */
    zsock_connect(jobs, "%s", n->jobs_ep);
    zsock_connect(results, "%s", n->results_ep);
    zsock_signal(pipe, 0);
    zpoller_t *poller = zpoller_new(pipe, jobs, NULL);
    while (true) {
        void *which = zpoller_wait(poller, -1);
        if (which == pipe || !which)
            break;
        zmsg_t *job = zmsg_recv(jobs);
        if (!job)
            break;
        zframe_t *kind = zmsg_pop(job);
        if (zframe_streq(kind, "R")) {
            zmsg_t *out = s_run_request(n, shard, job);
            zmsg_pushmem(out, "R", 1);
            zmsg_send(&out, results);
        } else {
            s_run_read(n, job, results);
        }
        zframe_destroy(&kind);
        zmsg_destroy(&job);
    }
    zpoller_destroy(&poller);
    zsock_destroy(&jobs);
    zsock_destroy(&results);
}

/* ---------------------------------------------------------------- streams (frontend) */

typedef struct {
    zframe_t *block;
    int32_t status;
    bool ready;
} s_slot_t;

typedef struct {
    char key[96];
    zframe_t *route;
    uint64_t id;
    uint32_t serial; /* echoed by its reads: results of an ended stream are dropped */
    uint16_t layer;
    uint32_t n_chunks;
    kvedge_chunk_id_t *ids; /* stored ids */
    uint32_t heads;
    uint64_t total;      /* data messages to send: n_chunks * heads */
    uint64_t next_issue; /* next seq to read */
    uint64_t next_send;  /* next seq to send */
    uint32_t credit;     /* data messages the client still allows */
    uint32_t pack_max;   /* heads per data message: 1, or the pack frame's max blocks */
    uint32_t pack_bytes; /* block bytes per packed data message (a larger block goes alone) */
    uint64_t msgs;       /* data messages sent (the end message's count) */
    uint64_t read_bytes, read_n; /* blocks read so far, for the read-ahead of a packed stream */
    uint32_t deadline_ms;
    uint64_t last_credit_ms;
    /* For the analyzer: when the request arrived, its payload, the bytes sent, and the
     * bytes of the chunk being sent (touched once its last head went out). */
    uint64_t start_us, in_bytes, out_bytes, chunk_bytes;
    char model[KVEDGE_HOT_LABEL_BYTES + 1];
    kvedge_prec_t accept[KVEDGE_PREC_MAX_ACCEPT]; /* precisions accepted, best first */
    size_t n_accept;                              /* 0: the blocks as stored */
    s_slot_t slots[KVEDGE_WIRE_MAX_CREDIT];
} s_stream_t;

static void s_free_item(void **item)
{
    free(*item);
    *item = NULL;
}

static void s_stream_destroy(void **item)
{
    s_stream_t *s = *item;
    if (!s)
        return;
    for (size_t i = 0; i < KVEDGE_WIRE_MAX_CREDIT; i++)
        zframe_destroy(&s->slots[i].block);
    zframe_destroy(&s->route);
    free(s->ids);
    free(s);
    *item = NULL;
}

static void s_stream_key(zframe_t *route, uint64_t id, char *key, size_t len)
{
    char hex[64];
    size_t rl = zframe_size(route) < 24 ? zframe_size(route) : 24;
    for (size_t i = 0; i < rl; i++)
        snprintf(hex + 2 * i, 3, "%02x", zframe_data(route)[i]);
    hex[2 * rl] = '\0';
    snprintf(key, len, "%s/%016llx", hex, (unsigned long long)id);
}

static void s_stream_end(s_node_t *n, s_stream_t *s, int32_t status)
{
    kvedge_analyzer_request(n->opts.analyzer, KVEDGE_OP_GET_LAYER, status,
                            kvedge_mono_us() - s->start_us, s->in_bytes, s->out_bytes);
    zmsg_t *m = zmsg_new();
    zframe_t *r = zframe_dup(s->route);
    zmsg_append(m, &r);
    zframe_t *h = s_header_frame(KVEDGE_OP_GET_LAYER, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_END,
                                 s->id, status, (uint32_t)s->msgs);
    zmsg_append(m, &h);
    s_send(n, &m);
    zhashx_delete(n->streams, s->key);
}

/* How many ready heads from next_send on go into the next data message: up to pack_max
 * consecutive ones within pack_bytes (the first always). Nothing waits to fill a pack: a
 * worker's window of reads lands at once, so packs come out about a window long. */
static uint32_t s_stream_take(const s_stream_t *s)
{
    uint32_t k = 0;
    uint64_t bytes = 0;
    while (k < s->pack_max && s->next_send + k < s->total) {
        const s_slot_t *slot = &s->slots[(s->next_send + k) % KVEDGE_WIRE_MAX_CREDIT];
        size_t len = slot->block ? zframe_size(slot->block) : 0;
        if (!slot->ready || (k > 0 && bytes + len > s->pack_bytes))
            break;
        bytes += len;
        k++;
    }
    return k;
}

/* The analyzer's record of one head sent. */
static void s_stream_account(s_node_t *n, s_stream_t *s, const kvedge_wire_stream_hdr_t *hdr,
                             const s_slot_t *slot)
{
    size_t len = slot->block ? zframe_size(slot->block) : 0;
    kvedge_analyzer_read(n->opts.analyzer, slot->status,
                         slot->block ? zframe_data(slot->block) : NULL, len);
    s->out_bytes += len + KVEDGE_WIRE_STREAM_HDR_BYTES;
    s->chunk_bytes += len;
    if (hdr->head + 1u == s->heads) {
        kvedge_analyzer_touch(n->opts.analyzer, 0, &s->ids[hdr->chunk_index], s->model, s->layer,
                              UINT32_MAX, s->chunk_bytes);
        s->chunk_bytes = 0;
    }
}

/* Heads a stream may have read and not yet sent: its credit in messages, times the heads a
 * message carries. Packed, that is the blocks of pack_bytes at the mean size read so far (at
 * least 1, at most pack_max); before any block was read, two worker windows, so a stream of
 * large blocks never reads far ahead of what its credit lets out. Within the slot ring. */
static uint64_t s_stream_allow(const s_stream_t *s)
{
    uint64_t per = 1;
    if (s->pack_max > 1) {
        per = s->read_n ? s->pack_bytes / (s->read_bytes / s->read_n + 1) : 0;
        per = per < 1 ? 1 : per > s->pack_max ? s->pack_max : per;
    }
    uint64_t allow = (uint64_t)s->credit * per;
    if (s->pack_max > 1 && s->read_n == 0 && allow < 2 * S_READ_WINDOW)
        allow = s->credit ? 2 * S_READ_WINDOW : 0;
    return allow > KVEDGE_WIRE_MAX_CREDIT ? KVEDGE_WIRE_MAX_CREDIT : allow;
}

/* Sends what is ready and in order, then asks workers for as many blocks as the credit
 * allows. Ends the stream when everything was sent. Credit counts data messages, packed or
 * not. */
static void s_stream_pump(s_node_t *n, s_stream_t *s)
{
    while (s->next_send < s->total && s->credit > 0) {
        uint32_t k = s_stream_take(s);
        if (k == 0)
            break;
        uint8_t sh[KVEDGE_WIRE_MAX_PACK * KVEDGE_WIRE_STREAM_HDR_BYTES];
        zmsg_t *m = zmsg_new();
        zframe_t *r = zframe_dup(s->route);
        zmsg_append(m, &r);
        zframe_t *h =
            s_header_frame(KVEDGE_OP_GET_LAYER, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_MORE,
                           s->id, KVEDGE_OK, k);
        zmsg_append(m, &h);
        for (uint32_t i = 0; i < k; i++) {
            uint64_t q = s->next_send + i;
            s_slot_t *slot = &s->slots[q % KVEDGE_WIRE_MAX_CREDIT];
            kvedge_wire_stream_hdr_t hdr = {(uint32_t)(q / s->heads), (uint16_t)(q % s->heads),
                                            slot->status};
            kvedge_wire_stream_hdr_pack(&hdr, sh + (size_t)i * KVEDGE_WIRE_STREAM_HDR_BYTES);
            if (n->opts.analyzer)
                s_stream_account(n, s, &hdr, slot);
        }
        zmsg_addmem(m, sh, (size_t)k * KVEDGE_WIRE_STREAM_HDR_BYTES);
        for (uint32_t i = 0; i < k; i++) {
            s_slot_t *slot = &s->slots[(s->next_send + i) % KVEDGE_WIRE_MAX_CREDIT];
            if (slot->block)
                zmsg_append(m, &slot->block);
            slot->ready = false;
        }
        s_send(n, &m);
        s->next_send += k;
        s->msgs++;
        s->credit--;
    }
    if (s->next_send == s->total) {
        s_stream_end(n, s, KVEDGE_OK);
        return;
    }
    /* Reads go out in windows of consecutive heads: one worker trip per window instead of
     * per block, and at least two windows in flight when the credit allows, so reading and
     * sending overlap. */
    uint64_t allow = s_stream_allow(s);
    while (s->next_issue < s->total && s->next_issue - s->next_send < allow) {
        uint64_t room = allow - (s->next_issue - s->next_send);
        uint64_t left = s->total - s->next_issue;
        /* Packed: whole windows (a pack is what one window read), two of them in flight. */
        uint64_t w = s->pack_max > 1 ? room : room > 1 ? room / 2 : 1;
        w = w > S_READ_WINDOW ? S_READ_WINDOW : w;
        w = w > left ? left : w;
        uint8_t kb[S_READ_WINDOW * KVEDGE_BLOCK_KEY_BYTES], seq[8];
        for (uint64_t i = 0; i < w; i++) {
            uint64_t q = s->next_issue + i;
            kvedge_block_key_t k = {s->ids[q / s->heads], s->layer, (uint16_t)(q % s->heads)};
            kvedge_block_key_pack(&k, kb + i * KVEDGE_BLOCK_KEY_BYTES);
        }
        kvedge_le_put32(seq, (uint32_t)s->next_issue);
        kvedge_le_put32(seq + 4, s->serial);
        zmsg_t *job = zmsg_new();
        zmsg_addmem(job, "S", 1);
        zmsg_addstr(job, s->key);
        zmsg_addmem(job, seq, sizeof seq);
        zmsg_addmem(job, kb, (size_t)w * KVEDGE_BLOCK_KEY_BYTES);
        if (s->n_accept)
            zmsg_addmem(job, s->accept, s->n_accept);
        if (zmsg_send(&job, n->jobs) != 0) {
            zmsg_destroy(&job);
            break; /* queue full: retried on the next result or tick */
        }
        n->outstanding++;
        s->next_issue += w;
    }
}

static void s_stream_result(s_node_t *n, zmsg_t *m)
{
    char *key = zmsg_popstr(m);
    zframe_t *seqf = zmsg_pop(m), *nf = zmsg_pop(m);
    s_stream_t *s = key ? zhashx_lookup(n->streams, key) : NULL;
    /* A stream ended (cancelled, say) while its reads were out: what they read is dropped,
     * also when a new stream reuses its request id. */
    if (s &&
        (!seqf || zframe_size(seqf) != 8 || kvedge_le_get32(zframe_data(seqf) + 4) != s->serial))
        s = NULL;
    if (s && seqf && nf) {
        /* seq is 32-bit on the internal socket; streams never exceed 4096 x 1024 heads */
        uint32_t seq = kvedge_le_get32(zframe_data(seqf));
        uint32_t count = kvedge_le_get32(zframe_data(nf));
        for (uint32_t i = 0; i < count; i++) {
            zframe_t *stf = zmsg_pop(m);
            if (!stf)
                break;
            s_slot_t *slot = &s->slots[(seq + i) % KVEDGE_WIRE_MAX_CREDIT];
            slot->status = (int32_t)kvedge_le_get32(zframe_data(stf));
            slot->block = slot->status == KVEDGE_OK ? zmsg_pop(m) : NULL;
            slot->ready = true;
            if (slot->block) {
                s->read_bytes += zframe_size(slot->block);
                s->read_n++;
            }
            zframe_destroy(&stf);
        }
        s_stream_pump(n, s);
    }
    zstr_free(&key);
    zframe_destroy(&seqf);
    zframe_destroy(&nf);
}

static int32_t s_stream_open(s_node_t *n, zframe_t *route, const uint8_t tag[16],
                             const kvedge_wire_header_t *h, const kvedge_wire_frame_t *pf,
                             size_t npf, uint64_t start_us)
{
    s_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        return KVEDGE_ENOMEM;
    if (s_accept(pf, npf, 1, s->accept, &s->n_accept) != KVEDGE_OK) {
        free(s);
        return KVEDGE_EINVAL;
    }
    s->pack_max = 1;
    kvedge_wire_pack_t pk;
    if (npf == 3 && kvedge_wire_pack_parse(pf[2].data, pf[2].len, &pk) == KVEDGE_OK) {
        s->pack_max = pk.max_blocks;
        s->pack_bytes = pk.max_bytes;
    }
    s->start_us = start_us;
    s->in_bytes = pf[0].len;
    s->route = zframe_dup(route);
    s->id = h->request_id;
    s->serial = ++n->serials;
    s->layer = (uint16_t)(pf[0].data[0] | pf[0].data[1] << 8);
    s->n_chunks = h->count;
    s->credit = h->credit;
    s->deadline_ms = h->deadline_ms;
    s->last_credit_ms = (uint64_t)kvedge_mono_ms();
    s_stream_key(route, h->request_id, s->key, sizeof s->key);
    s->ids = calloc(h->count, sizeof *s->ids);
    int32_t rc = s->ids ? KVEDGE_ENOTFOUND : KVEDGE_ENOMEM;
    kvedge_model_t model;
    for (uint32_t i = 0; s->ids && i < h->count; i++) {
        kvedge_chunk_id_t id;
        memcpy(id.bytes, pf[0].data + 4 + (size_t)i * KVEDGE_CHUNK_ID_BYTES, KVEDGE_CHUNK_ID_BYTES);
        kvedge_tenant_chunk_id(tag, &id, &s->ids[i]);
        kvedge_chunk_info_t info;
        /* Every chunk of a prefix has the model of the first one the node knows. */
        if (s->heads == 0 && kvedge_engine_get_chunk(n->opts.engine, &s->ids[i], &info) == 0) {
            s->heads = s_model_heads(n->opts.engine, &info, &model);
            snprintf(s->model, sizeof s->model, "%.*s", (int)(sizeof s->model - 1), info.model_id);
            rc = s->heads == 0              ? KVEDGE_ENOMODEL
                 : s->layer >= model.layers ? KVEDGE_ESHAPE
                                            : KVEDGE_OK;
        }
    }
    if (rc != KVEDGE_OK || zhashx_lookup(n->streams, s->key)) {
        void *p = s;
        s_stream_destroy(&p);
        return rc != KVEDGE_OK ? rc : KVEDGE_EPROTO; /* duplicate request id */
    }
    s->total = (uint64_t)s->n_chunks * s->heads;
    zhashx_insert(n->streams, s->key, s);
    s_stream_pump(n, s);
    return KVEDGE_OK;
}

/* Ends streams whose client has sent no credit for its deadline. */
static void s_streams_tick(s_node_t *n)
{
    uint64_t now = (uint64_t)kvedge_mono_ms();
    zlistx_t *keys = zhashx_keys(n->streams);
    for (char *k = zlistx_first(keys); k; k = zlistx_next(keys)) {
        s_stream_t *s = zhashx_lookup(n->streams, k);
        if (!s)
            continue;
        if (s->credit == 0 && now > s->last_credit_ms + s->deadline_ms) {
            kvedge_log_debug("stream %s: no credit for %u ms, dropped", s->key, s->deadline_ms);
            s_stream_end(n, s, KVEDGE_ETIMEDOUT);
        } else {
            s_stream_pump(n, s); /* retries reads a full job queue refused */
        }
    }
    zlistx_destroy(&keys);
}

/* ---------------------------------------------------------------- frontend */

static void s_hello(s_node_t *n, zframe_t *route, const uint8_t tag[16],
                    const kvedge_wire_header_t *h)
{
    zmsg_t *m = zmsg_new();
    zmsg_append(m, &route);
    zframe_t *hf =
        s_header_frame(KVEDGE_OP_HELLO, KVEDGE_WIRE_FLAG_REPLY, h->request_id, KVEDGE_OK, 0);
    zmsg_append(m, &hf);
    kvedge_wire_node_info_t info = {n->opts.role,
                                    {0},
                                    KVEDGE_WIRE_MAX_FRAME_BYTES,
                                    KVEDGE_WIRE_MAX_ITEMS,
                                    KVEDGE_WIRE_MAX_CHUNKS,
                                    KVEDGE_WIRE_MAX_CREDIT,
                                    n->opts.default_credit};
    memcpy(info.tenant_tag, tag, 16);
    uint8_t buf[KVEDGE_WIRE_NODE_INFO_BYTES];
    kvedge_wire_node_info_pack(&info, buf);
    zmsg_addmem(m, buf, sizeof buf);
    zmsg_addstr(m, n->name);
    s_send(n, &m);
}

/* MONITOR: the node's document from its owner (node.c), answered on the frontend. */
static void s_monitor(s_node_t *n, zframe_t *route, const kvedge_wire_header_t *h,
                      const kvedge_wire_frame_t *pf, uint64_t start_us)
{
    size_t len = 0;
    char *doc = n->opts.monitor
                    ? n->opts.monitor(n->opts.monitor_arg, kvedge_le_get16(pf[0].data), &len)
                    : NULL;
    int32_t rc = !n->opts.monitor                      ? KVEDGE_EPROTO
                 : !doc                                ? KVEDGE_ENOMEM
                 : len > KVEDGE_WIRE_MAX_MONITOR_BYTES ? KVEDGE_ETOOBIG
                                                       : KVEDGE_OK;
    zmsg_t *m = zmsg_new();
    zmsg_append(m, &route);
    zframe_t *hf = s_header_frame(KVEDGE_OP_MONITOR, KVEDGE_WIRE_FLAG_REPLY, h->request_id, rc, 0);
    zmsg_append(m, &hf);
    if (rc == KVEDGE_OK)
        zmsg_addmem(m, doc, len);
    free(doc);
    kvedge_analyzer_request(n->opts.analyzer, KVEDGE_OP_MONITOR, rc, kvedge_mono_us() - start_us,
                            pf[0].len, rc == KVEDGE_OK ? len : 0);
    s_send(n, &m);
}

static void s_stat(s_node_t *n, zframe_t *route, const kvedge_wire_header_t *h)
{
    kvedge_engine_stats_t st;
    int rc = kvedge_engine_stats(n->opts.engine, &st);
    zmsg_t *m = zmsg_new();
    zmsg_append(m, &route);
    zframe_t *hf = s_header_frame(KVEDGE_OP_STAT, KVEDGE_WIRE_FLAG_REPLY, h->request_id, rc, 0);
    zmsg_append(m, &hf);
    if (rc == KVEDGE_OK) {
        uint8_t buf[KVEDGE_WIRE_STATS_BYTES];
        kvedge_wire_stats_pack(&st, buf);
        zmsg_addmem(m, buf, sizeof buf);
    }
    s_send(n, &m);
}

/* Handles one client message; every path consumes msg. */
static void s_frontend_request(s_node_t *n, zmsg_t *msg)
{
    zframe_t *route = zmsg_pop(msg), *hf = zmsg_pop(msg);
    if (!route || !hf) {
        zframe_destroy(&route);
        zmsg_destroy(&msg);
        return;
    }
    kvedge_wire_header_t h;
    memset(&h, 0, sizeof h);
    int rc = kvedge_wire_header_parse(zframe_data(hf), zframe_size(hf), &h);
    kvedge_wire_frame_t pf[KVEDGE_WIRE_MAX_FRAMES];
    size_t np = s_payload(msg, pf, KVEDGE_WIRE_MAX_FRAMES);
    if (rc == KVEDGE_OK && np > KVEDGE_WIRE_MAX_FRAMES)
        rc = KVEDGE_EPROTO;
    if (rc == KVEDGE_OK && (h.flags & KVEDGE_WIRE_FLAG_REPLY))
        rc = KVEDGE_EPROTO;
    if (rc == KVEDGE_OK)
        rc = kvedge_wire_validate(&h, pf, np);
    uint64_t start_us = kvedge_mono_us();
    const char *tenant = NULL;
    uint8_t tag[17];
    tag[16] = s_tenant_of(n, hf, tag, &tenant) ? 1 : 0;
    kvedge_analyzer_tenant_t ts = s_tenant_series(n, tenant);
    if (h.opcode != KVEDGE_OP_CREDIT && h.opcode != KVEDGE_OP_CANCEL)
        kvedge_series_inc(ts.requests);
    if (rc != KVEDGE_OK) {
        kvedge_analyzer_request(n->opts.analyzer, kvedge_wire_op_name(h.opcode) ? h.opcode : 0, rc,
                                kvedge_mono_us() - start_us, s_msg_bytes(msg, false), 0);
        kvedge_log_debug("malformed %s request %llu: %s",
                         kvedge_wire_op_name(h.opcode) ? kvedge_wire_op_name(h.opcode) : "?",
                         (unsigned long long)h.request_id, kvedge_strerror(rc));
        bool known = kvedge_wire_op_name(h.opcode) != NULL;
        zmsg_t *r = s_error_reply(route, known ? h.opcode : 0, h.request_id, rc);
        s_send(n, &r);
        zframe_destroy(&hf);
        zmsg_destroy(&msg);
        return;
    }
    if (n->draining && h.opcode != KVEDGE_OP_CREDIT && h.opcode != KVEDGE_OP_CANCEL) {
        zmsg_t *r = s_error_reply(route, h.opcode, h.request_id, KVEDGE_ECLOSED);
        s_send(n, &r);
        zframe_destroy(&hf);
        zmsg_destroy(&msg);
        return;
    }
    /* Requests answered here, at once, are counted here; worker jobs and streams when they
     * end. */
    if (h.opcode == KVEDGE_OP_HELLO || h.opcode == KVEDGE_OP_PING || h.opcode == KVEDGE_OP_STAT) {
        uint64_t in = s_msg_bytes(msg, false);
        kvedge_analyzer_request(n->opts.analyzer, h.opcode, KVEDGE_OK, kvedge_mono_us() - start_us,
                                in, h.opcode == KVEDGE_OP_PING ? in : 0);
    }
    switch (h.opcode) {
    case KVEDGE_OP_HELLO:
        s_hello(n, route, tag, &h);
        break;
    case KVEDGE_OP_MONITOR:
        s_monitor(n, route, &h, pf, start_us);
        break;
    case KVEDGE_OP_PING: {
        zmsg_t *m = zmsg_new();
        zmsg_append(m, &route);
        zframe_t *rh =
            s_header_frame(KVEDGE_OP_PING, KVEDGE_WIRE_FLAG_REPLY, h.request_id, KVEDGE_OK, 0);
        zmsg_append(m, &rh);
        zframe_t *p = zmsg_pop(msg);
        zmsg_append(m, &p);
        s_send(n, &m);
        break;
    }
    case KVEDGE_OP_STAT:
        s_stat(n, route, &h);
        break;
    case KVEDGE_OP_GET_LAYER: {
        /* A node set to behave as one from before packing refuses the pack frame as such a
         * node's validation would. */
        int32_t src = n->opts.no_pack && np == 3
                          ? KVEDGE_EPROTO
                          : s_stream_open(n, route, tag, &h, pf, np, start_us);
        if (src != KVEDGE_OK) {
            kvedge_analyzer_request(n->opts.analyzer, KVEDGE_OP_GET_LAYER, src,
                                    kvedge_mono_us() - start_us, pf[0].len, 0);
            zmsg_t *r = zmsg_new();
            zmsg_append(r, &route);
            zframe_t *eh =
                s_header_frame(KVEDGE_OP_GET_LAYER, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_END,
                               h.request_id, src, 0);
            zmsg_append(r, &eh);
            s_send(n, &r);
        } else {
            zframe_destroy(&route);
        }
        break;
    }
    case KVEDGE_OP_CREDIT:
    case KVEDGE_OP_CANCEL: {
        char key[96];
        s_stream_key(route, h.request_id, key, sizeof key);
        s_stream_t *s = zhashx_lookup(n->streams, key);
        if (s && h.opcode == KVEDGE_OP_CANCEL) {
            /* The END follows what was sent on the same socket; reads still out are
             * dropped when they come back (the stream is gone). */
            s_stream_end(n, s, KVEDGE_ECANCELED);
        } else if (s) {
            uint64_t c = (uint64_t)s->credit + h.credit;
            s->credit = c > KVEDGE_WIRE_MAX_CREDIT ? KVEDGE_WIRE_MAX_CREDIT : (uint32_t)c;
            s->last_credit_ms = (uint64_t)kvedge_mono_ms();
            s_stream_pump(n, s);
        }
        zframe_destroy(&route); /* CREDIT and CANCEL have no reply */
        break;
    }
    default: {
        /* Worker job: [R][route][tag, admin, stored series][arrival us][header][payload...] */
        zmsg_t *job = msg; /* the payload frames move to the worker: no copy of blocks */
        msg = NULL;
        uint8_t tagx[17 + sizeof(kvedge_series_t *)];
        memcpy(tagx, tag, 17);
        memcpy(tagx + 17, &ts.stored_bytes, sizeof ts.stored_bytes);
        zmsg_pushmem(job, zframe_data(hf), zframe_size(hf));
        zmsg_pushmem(job, &start_us, 8);
        zmsg_pushmem(job, tagx, sizeof tagx);
        zframe_t *r = zframe_dup(route);
        zmsg_prepend(job, &r);
        zmsg_pushmem(job, "R", 1);
        if (zmsg_send(&job, n->jobs) != 0) {
            zmsg_destroy(&job);
            kvedge_analyzer_request(n->opts.analyzer, h.opcode, KVEDGE_EBUSY,
                                    kvedge_mono_us() - start_us, 0, 0);
            zmsg_t *busy = s_error_reply(route, h.opcode, h.request_id, KVEDGE_EBUSY);
            route = NULL;
            s_send(n, &busy);
        } else {
            n->outstanding++;
        }
        zframe_destroy(&route);
        break;
    }
    }
    zframe_destroy(&hf);
    zmsg_destroy(&msg);
}

static void s_frontend_result(s_node_t *n)
{
    zmsg_t *m = zmsg_recv(n->results);
    if (!m)
        return;
    n->outstanding--;
    zframe_t *kind = zmsg_pop(m);
    if (kind && zframe_streq(kind, "S")) {
        s_stream_result(n, m);
        zmsg_destroy(&m);
    } else {
        s_send(n, &m);
    }
    zframe_destroy(&kind);
}

/* The sockets between the frontend and its workers, on endpoints no other node of the process
 * ever had: a node destroyed a moment ago may still hold its names (libzmq's reaper releases
 * them later), and a node allocated at the same address must not collide with them. A bind
 * that fails anyway fails the start: workers connected to another node's queue would never
 * take a job, and every stream would wait out its deadline. */
static int s_internal_open(s_node_t *n, char *why, size_t why_len)
{
    static _Atomic uint64_t instances;
    unsigned long long inst = (unsigned long long)atomic_fetch_add(&instances, 1) + 1;
    snprintf(n->jobs_ep, sizeof n->jobs_ep, "inproc://kvedge-node-%llu-jobs", inst);
    snprintf(n->results_ep, sizeof n->results_ep, "inproc://kvedge-node-%llu-results", inst);
    n->jobs = zsock_new(ZMQ_PUSH);
    n->results = zsock_new(ZMQ_PULL);
    if (!n->jobs || !n->results) {
        snprintf(why, why_len, "out of memory");
        return KVEDGE_ENOMEM;
    }
    zsock_set_sndhwm(n->jobs, KVEDGE_SERVER_JOB_QUEUE);
    zsock_set_sndtimeo(n->jobs, 0);
    zsock_set_rcvhwm(n->results, 0);
    const char *failed = zsock_bind(n->jobs, "%s", n->jobs_ep) != 0         ? n->jobs_ep
                         : zsock_bind(n->results, "%s", n->results_ep) != 0 ? n->results_ep
                                                                            : NULL;
    if (failed) {
        snprintf(why, why_len, "internal endpoint %s: %s", failed, zmq_strerror(zmq_errno()));
        return KVEDGE_EIO;
    }
    snprintf(n->owner->jobs_endpoint, sizeof n->owner->jobs_endpoint, "%s", n->jobs_ep);
    return KVEDGE_OK;
}

static int s_setup(s_node_t *n, zsock_t *pipe)
{
    char why[512] = "";
    int rc = KVEDGE_OK;
    const kvedge_server_opts_t *o = &n->opts;
    if (!o->engine) {
        rc = KVEDGE_EINVAL;
        snprintf(why, sizeof why, "a bind endpoint and an engine are required");
    } else {
        rc = kvedge_secure_router_open(&n->sec, o->bind, o->insecure, o->cert, o->clients_dir, why,
                                       sizeof why);
    }
    if (rc == KVEDGE_OK) {
        n->router = n->sec.router;
        n->cert = n->sec.cert;
        if (n->cert)
            n->allow = zcertstore_new(o->clients_dir);
        snprintf(n->owner->endpoint, sizeof n->owner->endpoint, "%s", n->sec.endpoint);
        snprintf(n->owner->public_key, sizeof n->owner->public_key, "%s", n->sec.public_key);
    }
    if (rc == KVEDGE_OK) {
        rc = s_internal_open(n, why, sizeof why);
    }
    if (rc == KVEDGE_OK) {
        n->workers = calloc((size_t)n->n_workers, sizeof *n->workers);
        for (int i = 0; n->workers && i < n->n_workers; i++) {
            s_worker_arg_t *wa = malloc(sizeof *wa);
            if (!wa)
                break;
            *wa = (s_worker_arg_t){n, (size_t)i + 1};
            n->workers[i] = zactor_new(s_worker, wa);
        }
        n->streams = zhashx_new();
        zhashx_set_destructor(n->streams, s_stream_destroy);
        n->tenants = zhashx_new();
        if (n->tenants)
            zhashx_set_destructor(n->tenants, s_free_item);
        if (!n->workers || !n->streams) {
            rc = KVEDGE_ENOMEM;
            snprintf(why, sizeof why, "out of memory");
        }
    }
    n->start_rc = rc;
    if (rc != KVEDGE_OK)
        n->start_error = strdup(why);
    zsock_signal(pipe, 0);
    return rc;
}

static void s_teardown(s_node_t *n)
{
    for (int i = 0; n->workers && i < n->n_workers; i++)
        zactor_destroy(&n->workers[i]);
    free(n->workers);
    zhashx_destroy(&n->streams);
    zhashx_destroy(&n->tenants);
    zsock_destroy(&n->jobs);
    zsock_destroy(&n->results);
    kvedge_secure_router_close(&n->sec);
    n->router = NULL;
    n->cert = NULL;
    zcertstore_destroy(&n->allow);
}

static void s_frontend(zsock_t *pipe, void *args)
{
    s_node_t *n = args;
    if (s_setup(n, pipe) != KVEDGE_OK) {
        s_teardown(n);
        zsock_wait(pipe); /* hold until the owner has read the error, then wait for $TERM */
        char *cmd = zstr_recv(pipe);
        zstr_free(&cmd);
        return;
    }
    kvedge_log_info("serving %s as %s node \"%s\" (%s, %d workers)", n->owner->endpoint,
                    n->opts.role == KVEDGE_ROLE_CLOUD ? "cloud" : "edge", n->name,
                    n->cert ? "CURVE" : "plaintext loopback", n->n_workers);
    zpoller_t *poller = zpoller_new(pipe, n->router, n->results, NULL);
    uint64_t drain_until = 0, next_tick = (uint64_t)kvedge_mono_ms() + S_TICK_MS;
    while (true) {
        void *which = zpoller_wait(poller, S_TICK_MS);
        if (which == pipe) {
            char *cmd = zstr_recv(pipe);
            bool term = !cmd || streq(cmd, "$TERM");
            zstr_free(&cmd);
            if (term && !n->draining) {
                /* Stop taking work: streams end with ECLOSED, workers finish what they hold,
                 * and every request that still arrives is answered ECLOSED. */
                n->draining = true;
                drain_until = (uint64_t)kvedge_mono_ms() + KVEDGE_SERVER_DRAIN_MS;
                zlistx_t *keys = zhashx_keys(n->streams);
                for (char *k = zlistx_first(keys); k; k = zlistx_next(keys)) {
                    s_stream_t *st = zhashx_lookup(n->streams, k);
                    if (st)
                        s_stream_end(n, st, KVEDGE_ECLOSED);
                }
                zlistx_destroy(&keys);
            }
        } else if (which == n->router) {
            zmsg_t *m = zmsg_recv(n->router);
            if (m)
                s_frontend_request(n, m);
        } else if (which == n->results) {
            s_frontend_result(n);
        }
        /* On the clock, not only on idle polls: under steady traffic streams still get their
         * read retries and their idle limit. */
        if (!n->draining && (uint64_t)kvedge_mono_ms() >= next_tick) {
            s_streams_tick(n);
            next_tick = (uint64_t)kvedge_mono_ms() + S_TICK_MS;
        }
        if (n->draining && (n->outstanding == 0 || (uint64_t)kvedge_mono_ms() > drain_until))
            break;
        if (zpoller_terminated(poller) && !n->draining)
            break;
    }
    kvedge_log_info("node %s stopped", n->owner->endpoint);
    zpoller_destroy(&poller);
    s_teardown(n);
}

/* ---------------------------------------------------------------- public */

int kvedge_server_start(const kvedge_server_opts_t *opts, kvedge_server_t **out, char *why,
                        size_t why_len)
{
    if (!opts || !out)
        return KVEDGE_EINVAL;
    *out = NULL;
    if (sodium_init() < 0)
        return KVEDGE_ENOMEM;
    kvedge_server_t *s = calloc(1, sizeof *s);
    s_node_t *n = calloc(1, sizeof *n);
    if (!s || !n) {
        free(s);
        free(n);
        return KVEDGE_ENOMEM;
    }
    n->opts = *opts;
    n->owner = s;
    pthread_mutex_init(&n->disk_mu, NULL);
    n->n_workers = kvedge_server_workers(opts->workers);
    if (n->opts.default_credit == 0 || n->opts.default_credit > KVEDGE_WIRE_MAX_CREDIT)
        n->opts.default_credit = KVEDGE_SERVER_CREDIT_DEFAULT;
    snprintf(n->name, sizeof n->name, "%s", opts->name && *opts->name ? opts->name : "kvedge");
    kvedge_tenant_tag(KVEDGE_LOOPBACK_TENANT, n->loopback_tag);
    zsys_set_logstream(NULL); /* czmq's own logging stays quiet: we have ours */
    s->frontend = zactor_new(s_frontend, n);
    if (!s->frontend) {
        free(s);
        free(n);
        return KVEDGE_ENOMEM;
    }
    int rc = n->start_rc;
    if (rc != KVEDGE_OK) {
        if (why)
            snprintf(why, why_len, "%s", n->start_error ? n->start_error : "start failed");
        zsock_signal(zactor_sock(s->frontend), 0);
        zactor_destroy(&s->frontend);
        free(n->start_error);
        free(n);
        free(s);
        return rc;
    }
    /* n is owned by the actor thread from here; freed after it stops (see destroy). */
    s->frontend_state = n;
    *out = s;
    return KVEDGE_OK;
}

int kvedge_server_workers(int workers)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return workers > 0 ? workers : cores > 2 ? (int)cores : 2;
}

const char *kvedge_server_endpoint(kvedge_server_t *s)
{
    return s ? s->endpoint : NULL;
}

uint64_t kvedge_server_denials(kvedge_server_t *s)
{
    s_node_t *n = s ? s->frontend_state : NULL;
    return n ? kvedge_secure_router_denials(&n->sec) : 0;
}

void kvedge_server_derived(kvedge_server_t *s, uint64_t *derived, uint64_t *kept)
{
    s_node_t *n = s ? s->frontend_state : NULL;
    *derived = n ? atomic_load(&n->derived) : 0;
    *kept = n ? atomic_load(&n->derived_kept) : 0;
}

const char *kvedge_server_jobs_endpoint(kvedge_server_t *s)
{
    return s ? s->jobs_endpoint : NULL;
}

const char *kvedge_server_public_key(kvedge_server_t *s)
{
    return s && s->public_key[0] ? s->public_key : NULL;
}

void kvedge_server_destroy(kvedge_server_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_server_t *s = *self_p;
    *self_p = NULL;
    zactor_destroy(&s->frontend); /* sends $TERM and waits for the drain */
    if (s->frontend_state)
        pthread_mutex_destroy(&((s_node_t *)s->frontend_state)->disk_mu);
    free(s->frontend_state);
    free(s);
}
