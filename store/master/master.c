/* The Storage Master: the kvmsg codec, the key space and record formats (pure functions on
 * bytes), and the master daemon, one actor that owns the registry (RocksDB), the ROUTER and
 * the PUB. Every update goes through one function, s_apply: next seq, one write batch with
 * the record and the seq, then publish. */
#include "store/master/master.h"
#include "store/master/etcd.h"

#include "monitor/http.h"
#include "monitor/metrics.h"

#include <cjson/cJSON.h>
#include <czmq.h>
#include <rocksdb/c.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "runtime/log.h"
#include "runtime/mview.h"
#include "runtime/secure.h"
#include "access/transport.h"
#include "access/codec/byteorder.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"
#include "access/codec/why.h"
#include "store/engine/rocks.h"

/* ---------------------------------------------------------------- the daemon */

#define S_FORMAT_VERSION 1
#define S_META_FORMAT    "\0format"
#define S_META_SEQ       "\0seq"
#define S_META_REGISTRY  "\0registry"
#define S_META_LEN(k)    (sizeof(k) - 1)
#define S_TICK_MAX_MS    100
#define S_DRAIN_MAX      256  /* ROUTER messages handled per wakeup before timers run */
#define S_MAX_MASTERS    16   /* masters/<id> entries kept for STATUS */
#define S_INFO_MS        2000 /* masters and etcd members re-read this often */
/* Hard records per etcd page at a takeover: the largest (a map of 1024 layers, 2056 bytes) is
 * under 3.6 KB as the gateway's JSON, so a page stays under 4 MiB, half the reply bound. */
#define S_HARD_PAGE_KEYS 1024
#define S_RENEW_EVERY    256 /* hard records read between looks at the lease's renewal */

/* A master's role (kvedge_master_role names them). */
enum { S_ROLE_SINGLE = 0, S_ROLE_LEADER, S_ROLE_STANDBY, S_ROLE_READONLY };
static const char *const s_role_names[] = {"single", "leader", "standby", "readonly"};

/* A master as etcd's leader and masters/ keys describe it. */
typedef struct {
    char id[KVEDGE_MASTER_MAX_ID_BYTES + 1]; /* "": none */
    char router[KVEDGE_MASTER_MAX_ENDPOINT_BYTES + 1];
    char pub[KVEDGE_MASTER_MAX_ENDPOINT_BYTES + 1];
    char key[KVEDGE_MASTER_KEY_Z85_BYTES + 1]; /* its public key; "" = plaintext */
} s_peer_master_t;

struct kvedge_master_t {
    zactor_t *actor;
    kvedge_metrics_t *metrics;
    kvedge_http_t *http;
    _Atomic uint64_t records, bytes; /* published by the actor for the scrape */
    kvedge_series_t *records_g, *bytes_g, *seq_g, *denials;
    uint64_t denials_seen; /* the HTTP thread's, at the last scrape */
    char endpoint[256];
    char pub_endpoint[256];
    char public_key[KVEDGE_MASTER_KEY_Z85_BYTES + 1];
    _Atomic uint64_t seq;
    uint64_t registry;
    void *state; /* the actor's s_master_t, freed after the actor stopped */
    /* Masters on etcd, published by the actor for kvedge_master_role and the scrape. */
    _Atomic int role;
    _Atomic uint64_t leader_changes, etcd_ok, etcd_failed;
    kvedge_series_t *leader_g, *changes_c, *etcd_req[2], *role_g[4];
    uint64_t changes_seen, etcd_seen[2];
};

/* A heartbeat id the master watches. */
typedef struct {
    int64_t last_mono_ms; /* last heartbeat, monotonic */
    uint64_t last_wall_ms;
    kvedge_master_health_state_t state;
} s_peer_t;

typedef struct {
    kvedge_master_opts_t opts;
    kvedge_master_t *owner;
    rocksdb_t *db;
    rocksdb_writeoptions_t *wo;
    rocksdb_readoptions_t *ro;
    uint64_t seq;             /* last assigned; persisted with every update */
    uint64_t registry;        /* random id of this registry */
    uint64_t records;         /* live records */
    uint64_t bytes;           /* keys + bodies of live records */
    zhashx_t *peers;          /* heartbeat id -> s_peer_t */
    zcert_t *cert;            /* NULL when plaintext */
    kvedge_secure_zap_t *zap; /* its allowlist in the process's ZAP handler; NULL: plaintext */
    zsock_t *router;
    zsock_t *pub;
    int start_rc;
    char *start_error;
    /* Monitoring (the actor's own series; the registry belongs to the owner). */
    kvedge_metric_t *req_family, *peer_family;
    kvedge_series_t *req[5]; /* snapshot, set, heartbeat, malformed, other */
    /* Masters on etcd (docs/master.md): all zero in the embedded default (role single). */
    kvedge_etcd_t *etcd;
    char prefix[256];                             /* every key of this cluster, with a '/' */
    char id[KVEDGE_MASTER_MAX_ID_BYTES + 1];      /* this master's id */
    char cluster[KVEDGE_MASTER_MAX_ID_BYTES + 1]; /* the cluster name in meta */
    int role;                                     /* S_ROLE_* */
    int64_t lease;                                /* this master's lease; 0 = none */
    int64_t lease_ok_ms;    /* monotonic: when the last keepalive that held was sent */
    int64_t next_keepalive; /* monotonic */
    int64_t next_info;      /* monotonic: masters and members re-read */
    int64_t next_check;     /* monotonic: a leader reads the leader key again */
    uint64_t reserved;      /* H: seqs up to it are reserved in etcd */
    int64_t term;           /* the leader key's create revision while leading */
    bool etcd_ok;           /* the last etcd call was answered */
    s_peer_master_t leader; /* the leader known (id "": none) */
    kvedge_mview_t *view;   /* a standby's view of the leader's registry */
    kvedge_etcd_reply_t members;
    s_peer_master_t masters[S_MAX_MASTERS];
    size_t n_masters;
    uint64_t leader_changes;
    int64_t led_lease; /* the lease under which this master's state became the leader's */
    char why[KVEDGE_KVMSG_MAX_REASON_BYTES + 1]; /* why s_apply refused (etcd), for the ERR */
} s_master_t;

static int s_reserve(s_master_t *m, uint64_t seq, char *why, size_t why_len);
static bool s_hard_key(const char *key, size_t len);
static int s_etcd_record(s_master_t *m, const char *key, uint64_t seq, const uint8_t *body,
                         size_t len, char *why, size_t why_len);

/* Publishes a heartbeat id's state (1 up, 2 suspect, 3 down) as a gauge. */
static void s_peer_metric(s_master_t *m, const char *id, kvedge_master_health_state_t st)
{
    if (!m->peer_family)
        return;
    const char *v[] = {id};
    kvedge_series_set(kvedge_metric_series(m->peer_family, v, 1), (double)st);
}

static void s_publish_size(s_master_t *m)
{
    atomic_store(&m->owner->records, m->records);
    atomic_store(&m->owner->bytes, m->bytes);
}

/* A RocksDB error on the registry: logged, then translated (store/engine/rocks.h), which frees it.
 */
static int s_rerr(char **err)
{
    kvedge_log_error("registry: %s", *err);
    return kvedge_rocks_error(err);
}

/* Reads a meta value of exactly want bytes; ENOTFOUND when absent. */
static int s_meta_get(s_master_t *m, const char *key, size_t klen, uint8_t *out, size_t want)
{
    char *err = NULL;
    size_t len = 0;
    char *v = rocksdb_get(m->db, m->ro, key, klen, &len, &err);
    if (err)
        return s_rerr(&err);
    if (!v)
        return KVEDGE_ENOTFOUND;
    int rc = len == want ? KVEDGE_OK : KVEDGE_ECORRUPT;
    if (rc == KVEDGE_OK)
        memcpy(out, v, want);
    rocksdb_free(v);
    return rc;
}

static zmsg_t *s_kvmsg_zmsg(const kvedge_kvmsg_t *k)
{
    kvedge_kvmsg_buf_t buf;
    kvedge_wire_frame_t f[KVEDGE_KVMSG_MAX_FRAMES];
    size_t n;
    if (kvedge_kvmsg_pack(k, &buf, f, &n) != KVEDGE_OK)
        return NULL;
    zmsg_t *msg = zmsg_new();
    for (size_t i = 0; msg && i < n; i++)
        zmsg_addmem(msg, f[i].data, f[i].len);
    return msg;
}

/* Sends k to the peer at route (a copy of route is used). False when the peer is gone or its
 * queue is full: ROUTER_MANDATORY and no send timeout, so the master never blocks on one. */
static bool s_reply(s_master_t *m, zframe_t *route, const kvedge_kvmsg_t *k)
{
    zmsg_t *msg = s_kvmsg_zmsg(k);
    if (!msg)
        return false;
    zframe_t *r = zframe_dup(route);
    zmsg_prepend(msg, &r);
    if (zmsg_send(&msg, m->router) != 0) {
        zmsg_destroy(&msg);
        return false;
    }
    return true;
}

static void s_reply_err(s_master_t *m, zframe_t *route, const kvedge_kvmsg_t *req, int status,
                        const char *reason)
{
    kvedge_kvmsg_t e = {.cmd = KVEDGE_KVMSG_ERR, .rid = req ? req->rid : 0, .status = status};
    if (req && kvedge_kvmsg_key_ok(req->key, req->key_len)) {
        e.key = req->key;
        e.key_len = req->key_len;
    }
    e.body = (const uint8_t *)reason;
    e.body_len = reason ? strnlen(reason, KVEDGE_KVMSG_MAX_REASON_BYTES) : 0;
    if (!s_reply(m, route, &e))
        kvedge_log_debug("error reply dropped");
}

static void s_publish(s_master_t *m, const kvedge_kvmsg_t *k)
{
    zmsg_t *msg = s_kvmsg_zmsg(k);
    if (msg && zmsg_send(&msg, m->pub) != 0)
        zmsg_destroy(&msg);
}

static void s_hugz(s_master_t *m)
{
    kvedge_kvmsg_t h = {.cmd = KVEDGE_KVMSG_HUGZ, .seq = m->seq, .registry = m->registry};
    s_publish(m, &h);
}

/* The one way anything changes: next seq; on etcd, the seq reserved and a hard record written
 * there first (fenced); the record (or its deletion) and the seq in one write batch; then
 * publish. On failure nothing changed here and nothing was published (m->why says why when
 * etcd refused). Errors: KVEDGE_EFULL (registry limits), store errors, etcd's (s_fenced). */
static int s_apply(s_master_t *m, const char *key, size_t klen, const uint8_t *body, size_t len,
                   uint64_t *seq_out)
{
    char *err = NULL;
    size_t old_len = 0;
    char *old = rocksdb_get(m->db, m->ro, key, klen, &old_len, &err);
    if (err)
        return s_rerr(&err);
    bool existed = old != NULL;
    size_t old_body = existed && old_len >= 8 ? old_len - 8 : 0;
    rocksdb_free(old);
    if (len && !existed && m->records >= KVEDGE_MASTER_MAX_RECORDS)
        return KVEDGE_EFULL;
    uint64_t bytes = m->bytes - (existed ? klen + old_body : 0) + (len ? klen + len : 0);
    if (len && bytes > KVEDGE_MASTER_MAX_TOTAL_BYTES)
        return KVEDGE_EFULL;

    uint64_t seq = m->seq + 1;
    m->why[0] = '\0';
    if (m->etcd && seq > m->reserved) {
        int rrc = s_reserve(m, seq, m->why, sizeof m->why);
        if (rrc != KVEDGE_OK) {
            kvedge_log_warn("update not applied: %s", m->why);
            return rrc;
        }
    }
    if (m->etcd && s_hard_key(key, klen)) {
        /* Hard state: in etcd first (fenced by the leader's lease), then here. */
        char k0[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
        snprintf(k0, sizeof k0, "%.*s", (int)klen, key);
        int erc = s_etcd_record(m, k0, seq, body, len, m->why, sizeof m->why);
        if (erc != KVEDGE_OK)
            return erc;
    }
    uint8_t seqb[8];
    kvedge_le_put64(seqb, seq);
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    uint8_t *val = NULL;
    if (len) {
        val = malloc(8 + len);
        if (!val) {
            rocksdb_writebatch_destroy(b);
            return KVEDGE_ENOMEM;
        }
        memcpy(val, seqb, 8);
        memcpy(val + 8, body, len);
        rocksdb_writebatch_put(b, key, klen, (const char *)val, 8 + len);
    } else {
        rocksdb_writebatch_delete(b, key, klen);
    }
    rocksdb_writebatch_put(b, S_META_SEQ, S_META_LEN(S_META_SEQ), (const char *)seqb, 8);
    rocksdb_write(m->db, m->wo, b, &err);
    rocksdb_writebatch_destroy(b);
    free(val);
    if (err)
        return s_rerr(&err);
    m->seq = seq;
    atomic_store(&m->owner->seq, seq);
    m->records = m->records + (len && !existed) - (!len && existed);
    m->bytes = bytes;
    s_publish_size(m);
    if (m->opts.drop_pub_every && seq % m->opts.drop_pub_every == 0) {
        kvedge_log_debug("update %llu not published (fault injection)", (unsigned long long)seq);
    } else {
        kvedge_kvmsg_t pub = {.cmd = KVEDGE_KVMSG_KVPUB,
                              .key = (const uint8_t *)key,
                              .key_len = klen,
                              .seq = seq,
                              .body = body,
                              .body_len = len};
        s_publish(m, &pub);
    }
    if (seq_out)
        *seq_out = seq;
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- health */

static int s_health_write(s_master_t *m, const char *id, const s_peer_t *p, uint64_t changed)
{
    kvedge_master_health_t h = {p->state, p->last_wall_ms, changed};
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    if (kvedge_master_health_pack(&h, body, &len) != KVEDGE_OK ||
        kvedge_master_key_format(KVEDGE_MASTER_SPACE_HEALTH, id, NULL, key, sizeof key) !=
            KVEDGE_OK)
        return KVEDGE_EINVAL;
    return s_apply(m, key, strlen(key), body, len, NULL);
}

/* Moves silent peers down: up -> suspect -> down. A write that fails is retried next tick. */
static void s_health_tick(s_master_t *m)
{
    int64_t now = kvedge_mono_ms();
    for (s_peer_t *p = zhashx_first(m->peers); p; p = zhashx_next(m->peers)) {
        if (p->state != KVEDGE_MASTER_HEALTH_UP && p->state != KVEDGE_MASTER_HEALTH_SUSPECT)
            continue;
        int64_t silent = now - p->last_mono_ms;
        kvedge_master_health_state_t want =
            silent >= (int64_t)m->opts.down_ms      ? KVEDGE_MASTER_HEALTH_DOWN
            : silent >= (int64_t)m->opts.suspect_ms ? KVEDGE_MASTER_HEALTH_SUSPECT
                                                    : KVEDGE_MASTER_HEALTH_UP;
        if (want <= p->state)
            continue;
        const char *id = zhashx_cursor(m->peers);
        kvedge_master_health_state_t was = p->state;
        p->state = want;
        int rc = s_health_write(m, id, p, kvedge_wall_ms());
        if (rc != KVEDGE_OK) {
            p->state = was;
            continue;
        }
        kvedge_log_info("%s is %s (silent %lld ms)", id, kvedge_master_health_name(want),
                        (long long)silent);
        s_peer_metric(m, id, want);
    }
}

static void s_heartbeat(s_master_t *m, zframe_t *route, const kvedge_kvmsg_t *k)
{
    char id[KVEDGE_MASTER_MAX_ID_BYTES + 1];
    memcpy(id, k->key, k->key_len);
    id[k->key_len] = '\0';
    s_peer_t *p = zhashx_lookup(m->peers, id);
    if (!p) {
        if (zhashx_size(m->peers) >= KVEDGE_MASTER_MAX_HEALTH) {
            s_reply_err(m, route, k, KVEDGE_EFULL, "too many heartbeat ids");
            return;
        }
        s_peer_t fresh = {0, 0, (kvedge_master_health_state_t)0};
        zhashx_insert(m->peers, id, &fresh);
        p = zhashx_lookup(m->peers, id);
        if (!p) {
            s_reply_err(m, route, k, KVEDGE_ENOMEM, "out of memory");
            return;
        }
    }
    p->last_mono_ms = kvedge_mono_ms();
    p->last_wall_ms = kvedge_wall_ms();
    if (p->state != KVEDGE_MASTER_HEALTH_UP) {
        kvedge_master_health_state_t was = p->state;
        p->state = KVEDGE_MASTER_HEALTH_UP;
        int rc = s_health_write(m, id, p, p->last_wall_ms);
        if (rc != KVEDGE_OK) {
            p->state = was;
            s_reply_err(m, route, k, rc, "cannot record the health state");
            return;
        }
        kvedge_log_info("%s is up", id);
        s_peer_metric(m, id, KVEDGE_MASTER_HEALTH_UP);
    }
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    kvedge_master_key_format(KVEDGE_MASTER_SPACE_HEALTH, id, NULL, key, sizeof key);
    kvedge_kvmsg_t ok = {.cmd = KVEDGE_KVMSG_OK,
                         .key = (const uint8_t *)key,
                         .key_len = strlen(key),
                         .seq = m->seq,
                         .rid = k->rid};
    s_reply(m, route, &ok);
}

/* ---------------------------------------------------------------- requests */

static void s_set(s_master_t *m, zframe_t *route, const kvedge_kvmsg_t *k)
{
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    memcpy(key, k->key, k->key_len);
    key[k->key_len] = '\0';
    int rc = kvedge_master_check_set(key, k->key_len, k->body, k->body_len);
    if (rc != KVEDGE_OK) {
        const char *why = rc == KVEDGE_EINVAL     ? "key outside the registry's key space"
                          : rc == KVEDGE_EDENIED  ? "health records are written by the master"
                          : rc == KVEDGE_EVERSION ? "unknown record version"
                                                  : "body is not a valid record for this key";
        s_reply_err(m, route, k, rc, why);
        return;
    }
    uint64_t seq = 0;
    rc = s_apply(m, key, k->key_len, k->body, k->body_len, &seq);
    if (rc != KVEDGE_OK) {
        s_reply_err(m, route, k, rc, m->why[0] ? m->why : kvedge_strerror(rc));
        return;
    }
    kvedge_master_key_t parsed;
    if (k->body_len == 0 && kvedge_master_key_parse(key, k->key_len, &parsed) == KVEDGE_OK &&
        parsed.space == KVEDGE_MASTER_SPACE_HEALTH)
        zhashx_delete(m->peers, parsed.a); /* forgotten: a decommissioned node */
    kvedge_kvmsg_t ok = {
        .cmd = KVEDGE_KVMSG_OK, .key = k->key, .key_len = k->key_len, .seq = seq, .rid = k->rid};
    s_reply(m, route, &ok);
}

/* A stored value: seq u64 | body (1 … 64 KiB) under a valid key. False for anything else
 * (a damaged or foreign row: skipped, never served). */
static bool s_row_ok(const char *k, size_t kl, const char *v, size_t vl)
{
    return kvedge_kvmsg_key_ok((const uint8_t *)k, kl) && vl > 8 &&
           vl - 8 <= KVEDGE_KVMSG_MAX_BODY_BYTES && kvedge_le_get64((const uint8_t *)v) >= 1;
}

/* Clone's snapshot: every record under the prefix as KVSYNC, then KTHXBAI with the current
 * seq and the count. The actor is the only writer, so the iteration is consistent with seq. */
static void s_snapshot(s_master_t *m, zframe_t *route, const kvedge_kvmsg_t *k)
{
    rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
    static const char first[] = "!"; /* the smallest key character: meta rows sort before */
    if (k->key_len)
        rocksdb_iter_seek(it, (const char *)k->key, k->key_len);
    else
        rocksdb_iter_seek(it, first, 1);
    uint32_t count = 0;
    bool sent = true;
    for (; sent && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *key = rocksdb_iter_key(it, &kl);
        if (kl < k->key_len || (k->key_len && memcmp(key, k->key, k->key_len) != 0))
            break;
        const char *v = rocksdb_iter_value(it, &vl);
        if (!s_row_ok(key, kl, v, vl)) {
            kvedge_log_warn("registry: skipping a damaged row (%zu bytes)", vl);
            continue;
        }
        kvedge_kvmsg_t r = {.cmd = KVEDGE_KVMSG_KVSYNC,
                            .key = (const uint8_t *)key,
                            .key_len = kl,
                            .seq = kvedge_le_get64((const uint8_t *)v),
                            .body = (const uint8_t *)v + 8,
                            .body_len = vl - 8,
                            .rid = k->rid};
        sent = s_reply(m, route, &r);
        count++;
    }
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    rocksdb_iter_destroy(it);
    if (err) {
        int rc = s_rerr(&err);
        s_reply_err(m, route, k, rc, "cannot read the registry");
        return;
    }
    if (!sent) {
        kvedge_log_debug("snapshot abandoned: the peer is gone or not reading");
        return;
    }
    kvedge_kvmsg_t end = {.cmd = KVEDGE_KVMSG_KTHXBAI,
                          .key = k->key,
                          .key_len = k->key_len,
                          .seq = m->seq,
                          .rid = k->rid,
                          .count = count,
                          .registry = m->registry};
    s_reply(m, route, &end);
}

/* Receives one message a part at a time, keeping at most max parts: a peer sending a million
 * empty parts costs nothing but the reading. Returns the number of parts read (may exceed
 * max; parts past max were dropped), 0 when nothing was read. */
static size_t s_recv_bounded(zsock_t *sock, zframe_t **parts, size_t max)
{
    size_t n = 0;
    do {
        zframe_t *f = zframe_recv(sock); /* parts after the first are already here */
        if (!f)
            break;
        if (n < max)
            parts[n] = f;
        else
            zframe_destroy(&f);
        n++;
    } while (zsock_rcvmore(sock));
    return n;
}

static void s_status(s_master_t *m, zframe_t *route, const kvedge_kvmsg_t *k);
static void s_not_leader(s_master_t *m, zframe_t *route, const kvedge_kvmsg_t *k);

static void s_request(s_master_t *m)
{
    zframe_t *parts[1 + KVEDGE_KVMSG_MAX_FRAMES] = {NULL};
    size_t n = s_recv_bounded(m->router, parts, 1 + KVEDGE_KVMSG_MAX_FRAMES);
    if (n == 0)
        return;
    zframe_t *route = parts[0];
    size_t nf = n - 1;
    kvedge_wire_frame_t f[KVEDGE_KVMSG_MAX_FRAMES];
    for (size_t i = 0; i < nf && i < KVEDGE_KVMSG_MAX_FRAMES; i++)
        f[i] = (kvedge_wire_frame_t){zframe_data(parts[i + 1]), zframe_size(parts[i + 1])};
    kvedge_kvmsg_t k;
    memset(&k, 0, sizeof k);
    int rc = nf > KVEDGE_KVMSG_MAX_FRAMES ? KVEDGE_EPROTO : kvedge_kvmsg_parse(f, nf, &k);
    if (rc != KVEDGE_OK) {
        kvedge_log_debug("malformed kvmsg (%zu frames)", nf);
        kvedge_series_inc(m->req[3]);
        kvedge_kvmsg_t echo = {.rid = k.rid};
        s_reply_err(m, route, &echo, KVEDGE_EPROTO, "malformed kvmsg");
    } else {
        kvedge_series_inc(m->req[k.cmd == KVEDGE_KVMSG_ICANHAZ     ? 0
                                 : k.cmd == KVEDGE_KVMSG_SET       ? 1
                                 : k.cmd == KVEDGE_KVMSG_HEARTBEAT ? 2
                                                                   : 4]);
        switch (k.cmd) {
        case KVEDGE_KVMSG_STATUS:
            s_status(m, route, &k);
            break;
        case KVEDGE_KVMSG_ICANHAZ:
            if (m->role == S_ROLE_STANDBY)
                s_not_leader(m, route, &k);
            else
                s_snapshot(m, route, &k);
            break;
        case KVEDGE_KVMSG_SET:
            if (m->role == S_ROLE_STANDBY || m->role == S_ROLE_READONLY)
                s_not_leader(m, route, &k);
            else
                s_set(m, route, &k);
            break;
        case KVEDGE_KVMSG_HEARTBEAT:
            if (m->role == S_ROLE_STANDBY || m->role == S_ROLE_READONLY)
                s_not_leader(m, route, &k);
            else
                s_heartbeat(m, route, &k);
            break;
        default: /* a reply or a PUB message sent to the master */
            s_reply_err(m, route, &k, KVEDGE_EPROTO, "not a request");
            break;
        }
    }
    for (size_t i = 0; i < n && i < 1 + KVEDGE_KVMSG_MAX_FRAMES; i++)
        zframe_destroy(&parts[i]);
}

/* Reads one message from the XPUB: true for a subscription (0x01 | topic). Anything else a
 * subscriber sends is read and dropped. */
static bool s_subscription(s_master_t *m)
{
    zframe_t *part = NULL;
    size_t n = s_recv_bounded(m->pub, &part, 1);
    bool sub = n == 1 && part && zframe_size(part) >= 1 && zframe_data(part)[0] == 1;
    zframe_destroy(&part);
    return sub;
}

/* ---------------------------------------------------------------- masters on etcd */

/* The layout under the prefix (docs/master.md, "Masters on etcd"): meta (format, registry id,
 * cluster), seq (the reserved high-water mark H), reg/<key> (hard records: seq u64 | body),
 * leader (the leader's id and endpoints, on its lease), masters/<id> (each master, on its
 * lease). */

static void s_ekey(const s_master_t *m, const char *suffix, char *out, size_t cap)
{
    snprintf(out, cap, "%s%s", m->prefix, suffix);
}

/* model/, tmodel/ and map/ live in etcd; the rest is soft state the nodes re-announce. */
static bool s_hard_key(const char *key, size_t len)
{
    kvedge_master_key_t k;
    return kvedge_master_key_parse(key, len, &k) == KVEDGE_OK &&
           (k.space == KVEDGE_MASTER_SPACE_MODEL || k.space == KVEDGE_MASTER_SPACE_TMODEL ||
            k.space == KVEDGE_MASTER_SPACE_MAP);
}

static void s_set_role(s_master_t *m, int role)
{
    if (m->role == role)
        return;
    kvedge_log_info("role %s -> %s", s_role_names[m->role], s_role_names[role]);
    m->role = role;
    atomic_store(&m->owner->role, role);
}

static void s_counts(s_master_t *m)
{
    uint64_t ok, failed;
    kvedge_etcd_counts(m->etcd, &ok, &failed);
    atomic_store(&m->owner->etcd_ok, ok);
    atomic_store(&m->owner->etcd_failed, failed);
}

/* etcd did not answer: a leader that has not renewed its lease for a whole lease stops
 * leading (its lease may have expired: another master may lead now). */
static void s_etcd_down(s_master_t *m, const char *what, const char *why)
{
    if (m->etcd_ok)
        kvedge_log_warn("etcd: %s failed: %s", what, why);
    m->etcd_ok = false;
    if (m->role == S_ROLE_LEADER &&
        kvedge_mono_ms() - m->lease_ok_ms >= (int64_t)m->opts.lease_ms) {
        kvedge_log_error("no etcd quorum for %u ms: serving reads only", m->opts.lease_ms);
        s_set_role(m, S_ROLE_READONLY);
    }
}

/* A write only the leader may make: a txn that holds only while the leader key is on this
 * master's lease. KVEDGE_ENOTLEADER when it is not (deposed: steps down). */
static int s_fenced(s_master_t *m, const kvedge_etcd_op_t *ops, size_t n, char *why, size_t why_len)
{
    char lk[300];
    s_ekey(m, "leader", lk, sizeof lk);
    kvedge_etcd_cmp_t c = {KVEDGE_ETCD_CMP_LEASE, lk, m->lease};
    kvedge_etcd_reply_t r;
    char w[400] = "";
    int rc = m->lease ? kvedge_etcd_txn(m->etcd, &c, 1, ops, n, NULL, 0, &r, w, sizeof w)
                      : KVEDGE_ENOTLEADER;
    s_counts(m);
    if (rc == KVEDGE_ENOTLEADER)
        return kvedge_why(why, why_len, rc, "no etcd lease: not leading");
    if (rc != KVEDGE_OK) {
        s_etcd_down(m, "a write", w);
        return kvedge_why(why, why_len, rc, "etcd refused or did not answer: %.200s", w);
    }
    m->etcd_ok = true;
    bool held = r.succeeded;
    kvedge_etcd_reply_free(&r);
    if (!held) {
        kvedge_log_error("deposed: the leader key is not on this master's lease");
        s_set_role(m, S_ROLE_STANDBY);
        m->leader.id[0] = '\0';
        return kvedge_why(why, why_len, KVEDGE_ENOTLEADER, "no leader");
    }
    return KVEDGE_OK;
}

/* Persists H = seq + KVEDGE_MASTER_SEQ_BLOCK before seq is published. */
static int s_reserve(s_master_t *m, uint64_t seq, char *why, size_t why_len)
{
    char sk[300], hv[24];
    s_ekey(m, "seq", sk, sizeof sk);
    uint64_t h = seq + KVEDGE_MASTER_SEQ_BLOCK;
    snprintf(hv, sizeof hv, "%llu", (unsigned long long)h);
    kvedge_etcd_op_t op = {KVEDGE_ETCD_OP_PUT, sk, hv, strlen(hv), 0};
    int rc = s_fenced(m, &op, 1, why, why_len);
    if (rc == KVEDGE_OK)
        m->reserved = h;
    return rc;
}

/* A hard record (len 0: its deletion) into etcd, fenced. */
static int s_etcd_record(s_master_t *m, const char *key, uint64_t seq, const uint8_t *body,
                         size_t len, char *why, size_t why_len)
{
    if (seq > m->reserved) {
        int rc = s_reserve(m, seq, why, why_len);
        if (rc != KVEDGE_OK)
            return rc;
    }
    char ek[600];
    snprintf(ek, sizeof ek, "%sreg/%s", m->prefix, key);
    uint8_t *v = malloc(8 + len);
    if (!v)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "out of memory");
    kvedge_le_put64(v, seq);
    if (len)
        memcpy(v + 8, body, len);
    kvedge_etcd_op_t op = {len ? KVEDGE_ETCD_OP_PUT : KVEDGE_ETCD_OP_DELETE, ek, v, 8 + len, 0};
    int rc = s_fenced(m, &op, 1, why, why_len);
    free(v);
    return rc;
}

/* {"id","router","pub","key"} of this master. Caller frees. */
static char *s_self_json(s_master_t *m)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "id", m->id);
    cJSON_AddStringToObject(o, "router", m->owner->endpoint);
    cJSON_AddStringToObject(o, "pub", m->owner->pub_endpoint);
    if (m->owner->public_key[0])
        cJSON_AddStringToObject(o, "key", m->owner->public_key);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* A leader or masters/ value (untrusted: another process wrote it). */
static bool s_peer_parse(const uint8_t *v, size_t len, s_peer_master_t *out)
{
    memset(out, 0, sizeof *out);
    cJSON *o = cJSON_ParseWithLength((const char *)v, len);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "router");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pub");
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(o, "key");
    bool ok = cJSON_IsString(id) && cJSON_IsString(r) && cJSON_IsString(p) &&
              strlen(id->valuestring) < sizeof out->id &&
              strlen(r->valuestring) < sizeof out->router &&
              strlen(p->valuestring) < sizeof out->pub &&
              (!k || (cJSON_IsString(k) && strlen(k->valuestring) == KVEDGE_MASTER_KEY_Z85_BYTES));
    if (ok) {
        snprintf(out->id, sizeof out->id, "%s", id->valuestring);
        snprintf(out->router, sizeof out->router, "%s", r->valuestring);
        snprintf(out->pub, sizeof out->pub, "%s", p->valuestring);
        if (k)
            snprintf(out->key, sizeof out->key, "%s", k->valuestring);
    }
    cJSON_Delete(o);
    return ok;
}

/* A standby follows the leader with a replica view (everything, no snapshot file), so that it
 * holds the soft state too when it takes over. */
static void s_follow(s_master_t *m, const s_peer_master_t *l)
{
    if (m->role != S_ROLE_STANDBY)
        s_set_role(m, S_ROLE_STANDBY);
    bool moved = strcmp(m->leader.id, l->id) != 0 || strcmp(m->leader.router, l->router) != 0 ||
                 strcmp(m->leader.pub, l->pub) != 0;
    if (moved)
        kvedge_log_info("following the leader %s (%s %s)", l->id, l->router, l->pub);
    m->leader = *l;
    if (m->view && !moved)
        return;
    kvedge_mview_destroy(&m->view);
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = l->router;
    vo.pub = l->pub;
    vo.server_key = l->key[0] ? l->key : NULL;
    vo.client_cert = l->key[0] ? m->opts.cert : NULL;
    vo.start_wait_ms = -1;
    if (kvedge_mview_start(&vo, &m->view) != KVEDGE_OK && moved)
        kvedge_log_warn("cannot follow the leader %s: no view (takeover will rebuild from etcd "
                        "and the nodes)",
                        l->id);
}

typedef struct {
    char *key;
    uint8_t *val; /* seq u64 | body */
    size_t len;
} s_row_t;

typedef struct {
    s_row_t *rows;
    size_t n, cap;
    uint64_t max_seq;
    bool failed;
} s_rows_t;

static void s_rows_add(s_rows_t *r, const char *key, size_t kl, uint64_t seq, const uint8_t *body,
                       size_t len)
{
    if (r->failed || !kvedge_kvmsg_key_ok((const uint8_t *)key, kl) || !len ||
        len > KVEDGE_KVMSG_MAX_BODY_BYTES || seq == 0)
        return;
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 256;
        s_row_t *nr = realloc(r->rows, cap * sizeof *nr);
        if (!nr) {
            r->failed = true;
            return;
        }
        r->rows = nr;
        r->cap = cap;
    }
    s_row_t *x = &r->rows[r->n];
    x->key = strndup(key, kl);
    x->val = malloc(8 + len);
    if (!x->key || !x->val) {
        free(x->key);
        free(x->val);
        r->failed = true;
        return;
    }
    kvedge_le_put64(x->val, seq);
    memcpy(x->val + 8, body, len);
    x->len = 8 + len;
    r->n++;
    if (seq > r->max_seq)
        r->max_seq = seq;
}

static void s_rows_free(s_rows_t *r)
{
    for (size_t i = 0; i < r->n; i++) {
        free(r->rows[i].key);
        free(r->rows[i].val);
    }
    free(r->rows);
    memset(r, 0, sizeof *r);
}

/* Renews the lease when it is due, inside a long etcd sequence (a takeover reading a large
 * registry) that must not let it expire under it. False when it is gone or etcd is silent. */
static bool s_renew(s_master_t *m)
{
    int64_t now = kvedge_mono_ms();
    if (!m->lease || now < m->next_keepalive)
        return m->lease != 0;
    int64_t ttl = 0;
    char why[300];
    if (kvedge_etcd_lease_keepalive(m->etcd, m->lease, &ttl, why, sizeof why) != KVEDGE_OK ||
        ttl <= 0)
        return false;
    m->lease_ok_ms = now;
    m->next_keepalive = now + m->opts.lease_ms / 3;
    return true;
}

static int s_hard_cb(void *ctx, const kvedge_etcd_kv_t *kv)
{
    void **a = ctx;
    s_master_t *m = a[0];
    s_rows_t *rows = a[1];
    if (rows->n % S_RENEW_EVERY == 0 && !s_renew(m))
        return KVEDGE_ENOTLEADER;      /* the lease went: this takeover is void */
    size_t pl = strlen(m->prefix) + 4; /* "reg/" */
    const char *key = kv->key + pl;
    size_t kl = kv->key_len - pl;
    if (kv->key_len <= pl || kv->value_len <= 8 || !s_hard_key(key, kl)) {
        kvedge_log_warn("etcd: skipping a damaged hard record (%zu bytes)", kv->value_len);
        return 0;
    }
    s_rows_add(rows, key, kl, kvedge_le_get64(kv->value), kv->value + 8, kv->value_len - 8);
    return 0;
}

static int s_soft_view_cb(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    if (!s_hard_key(key, strlen(key)))
        s_rows_add(ctx, key, strlen(key), seq, body, len);
    return 0;
}

/* The soft records of the local registry (a master that led before and leads again). */
static void s_soft_local(s_master_t *m, s_rows_t *rows)
{
    rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
    for (rocksdb_iter_seek(it, "!", 1); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        if (s_row_ok(k, kl, v, vl) && !s_hard_key(k, kl))
            s_rows_add(rows, k, kl, kvedge_le_get64((const uint8_t *)v), (const uint8_t *)v + 8,
                       vl - 8);
    }
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    rocksdb_iter_destroy(it);
    if (err) {
        s_rerr(&err);
        rows->failed = true;
    }
}

/* The local registry becomes rows (a cache: cleared and rewritten), at seq. */
static int s_rewrite_local(s_master_t *m, const s_rows_t *rows, uint64_t seq)
{
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    rocksdb_writebatch_delete_range(b, "!", 1, "\x7f", 1);
    uint8_t seqb[8], reg[8];
    kvedge_le_put64(seqb, seq);
    kvedge_le_put64(reg, m->registry);
    m->records = 0;
    m->bytes = 0;
    for (size_t i = 0; i < rows->n; i++) {
        size_t kl = strlen(rows->rows[i].key);
        rocksdb_writebatch_put(b, rows->rows[i].key, kl, (const char *)rows->rows[i].val,
                               rows->rows[i].len);
        m->records++;
        m->bytes += kl + rows->rows[i].len - 8;
    }
    rocksdb_writebatch_put(b, S_META_SEQ, S_META_LEN(S_META_SEQ), (const char *)seqb, 8);
    rocksdb_writebatch_put(b, S_META_REGISTRY, S_META_LEN(S_META_REGISTRY), (const char *)reg, 8);
    char *err = NULL;
    rocksdb_write(m->db, m->wo, b, &err);
    rocksdb_writebatch_destroy(b);
    if (err)
        return s_rerr(&err);
    m->seq = seq;
    atomic_store(&m->owner->seq, seq);
    s_publish_size(m);
    /* Every id that was up or suspect gets a fresh grace period, as after a restart. */
    zhashx_purge(m->peers);
    int64_t now = kvedge_mono_ms();
    for (size_t i = 0; i < rows->n; i++) {
        const char *k = rows->rows[i].key;
        kvedge_master_key_t key;
        kvedge_master_health_t h;
        if (kvedge_master_key_parse(k, strlen(k), &key) == KVEDGE_OK &&
            key.space == KVEDGE_MASTER_SPACE_HEALTH &&
            kvedge_master_health_parse(rows->rows[i].val + 8, rows->rows[i].len - 8, &h) ==
                KVEDGE_OK &&
            zhashx_size(m->peers) < KVEDGE_MASTER_MAX_HEALTH) {
            s_peer_t p = {now, h.last_seen_ms, h.state};
            zhashx_insert(m->peers, key.a, &p);
            s_peer_metric(m, key.a, h.state);
        }
    }
    return KVEDGE_OK;
}

/* This master won the election: hard records from etcd, soft ones from the view it followed
 * (else its own registry), seq above anything the old leader may have published, a new block
 * reserved, then HUGZ. On failure it does not lead (readonly until the next election step). */
static int s_takeover(s_master_t *m, int64_t term)
{
    int64_t t0 = kvedge_mono_ms();
    char why[400] = "", sk[300];
    s_ekey(m, "seq", sk, sizeof sk);
    kvedge_etcd_reply_t r;
    int rc = kvedge_etcd_get(m->etcd, sk, &r, why, sizeof why);
    uint64_t h = 0;
    bool got = rc == KVEDGE_OK;
    if (rc == KVEDGE_OK && r.n_kvs == 1) {
        char num[24] = "";
        snprintf(num, sizeof num, "%.*s", (int)(r.kvs[0].value_len < 23 ? r.kvs[0].value_len : 23),
                 (const char *)r.kvs[0].value);
        char *end = NULL;
        h = strtoull(num, &end, 10);
        if (!num[0] || *end) {
            rc = KVEDGE_ECORRUPT;
            snprintf(why, sizeof why, "the seq key %s is not a number", sk);
        }
    }
    if (got)
        kvedge_etcd_reply_free(&r);
    s_rows_t rows = {0};
    if (rc == KVEDGE_OK) {
        char rk[300];
        s_ekey(m, "reg/", rk, sizeof rk);
        void *ctx[2] = {m, &rows};
        rc = kvedge_etcd_range_prefix(m->etcd, rk, S_HARD_PAGE_KEYS, s_hard_cb, ctx, why,
                                      sizeof why);
    }
    size_t hard = rows.n;
    bool from_view = m->view && kvedge_mview_state(m->view) != KVEDGE_MVIEW_EMPTY;
    if (rc == KVEDGE_OK) {
        if (from_view)
            kvedge_mview_foreach(m->view, NULL, s_soft_view_cb, &rows);
        else
            s_soft_local(m, &rows);
        if (rows.failed)
            rc = kvedge_why(why, sizeof why, KVEDGE_ENOMEM, "cannot collect the records");
    }
    uint64_t seq = (h > rows.max_seq ? h : rows.max_seq) + 1;
    if (rc == KVEDGE_OK && !s_renew(m))
        rc = kvedge_why(why, sizeof why, KVEDGE_ENOTLEADER, "the lease went during the takeover");
    if (rc == KVEDGE_OK)
        rc = s_rewrite_local(m, &rows, seq);
    if (rc == KVEDGE_OK)
        rc = s_reserve(m, seq, why, sizeof why);
    s_counts(m);
    if (rc != KVEDGE_OK) {
        kvedge_log_error("takeover failed: %s", why[0] ? why : kvedge_strerror(rc));
        s_rows_free(&rows);
        if (m->role != S_ROLE_STANDBY)
            s_set_role(m, S_ROLE_READONLY);
        return rc;
    }
    kvedge_mview_destroy(&m->view);
    m->led_lease = m->lease;
    m->term = term;
    snprintf(m->leader.id, sizeof m->leader.id, "%s", m->id);
    snprintf(m->leader.router, sizeof m->leader.router, "%s", m->owner->endpoint);
    snprintf(m->leader.pub, sizeof m->leader.pub, "%s", m->owner->pub_endpoint);
    snprintf(m->leader.key, sizeof m->leader.key, "%s", m->owner->public_key);
    m->leader_changes++;
    atomic_store(&m->owner->leader_changes, m->leader_changes);
    s_set_role(m, S_ROLE_LEADER);
    kvedge_log_info("leading (term %lld): %zu hard records from etcd, %zu soft from %s, seq %llu "
                    "(reserved %llu), in %lld ms",
                    (long long)term, hard, rows.n - hard, from_view ? "the view" : "the registry",
                    (unsigned long long)seq, (unsigned long long)m->reserved,
                    (long long)(kvedge_mono_ms() - t0));
    s_rows_free(&rows);
    s_hugz(m);
    return KVEDGE_OK;
}

/* The lease: granted (with masters/<id> on it) when there is none, renewed every lease/3.
 * False when etcd did not answer. */
static bool s_lease(s_master_t *m)
{
    char why[400] = "";
    int64_t now = kvedge_mono_ms();
    if (m->lease && now < m->next_keepalive)
        return true;
    if (m->lease) {
        int64_t ttl = 0;
        int rc = kvedge_etcd_lease_keepalive(m->etcd, m->lease, &ttl, why, sizeof why);
        if (rc != KVEDGE_OK && rc != KVEDGE_ENOTFOUND) {
            s_etcd_down(m, "lease keepalive", why);
            return false;
        }
        if (rc == KVEDGE_OK && ttl > 0) {
            m->lease_ok_ms = now;
            m->next_keepalive = now + m->opts.lease_ms / 3;
            return true;
        }
        kvedge_log_warn("etcd: this master's lease expired");
        m->lease = 0;
        if (m->role == S_ROLE_LEADER || m->role == S_ROLE_READONLY) {
            s_set_role(m, S_ROLE_STANDBY);
            m->leader.id[0] = '\0';
        }
    }
    int64_t id = 0;
    int rc = kvedge_etcd_lease_grant(m->etcd, ((int64_t)m->opts.lease_ms + 999) / 1000, &id, why,
                                     sizeof why);
    if (rc != KVEDGE_OK) {
        s_etcd_down(m, "lease grant", why);
        return false;
    }
    m->lease = id;
    m->lease_ok_ms = now;
    m->next_keepalive = now + m->opts.lease_ms / 3;
    m->next_info = 0;
    return true;
}

static int s_master_cb(void *ctx, const kvedge_etcd_kv_t *kv)
{
    s_master_t *m = ctx;
    if (m->n_masters < S_MAX_MASTERS &&
        s_peer_parse(kv->value, kv->value_len, &m->masters[m->n_masters]))
        m->n_masters++;
    return 0;
}

/* masters/<id> (put again: it goes with an expired lease), the masters and etcd's members, for
 * STATUS. */
static void s_info(s_master_t *m)
{
    char why[400], k[400];
    snprintf(k, sizeof k, "%smasters/%s", m->prefix, m->id);
    char *self = s_self_json(m);
    if (self)
        kvedge_etcd_put(m->etcd, k, self, strlen(self), m->lease, why, sizeof why);
    free(self);
    s_ekey(m, "masters/", k, sizeof k);
    m->n_masters = 0;
    kvedge_etcd_range_prefix(m->etcd, k, 0, s_master_cb, m, why, sizeof why);
    kvedge_etcd_reply_free(&m->members);
    if (kvedge_etcd_members(m->etcd, &m->members, why, sizeof why) != KVEDGE_OK)
        kvedge_etcd_reply_free(&m->members);
}

/* One election step (every few hundred ms): the lease; then, when not leading, who leads: none
 * -> campaign (a txn: create the leader key on this lease if it does not exist) and take over;
 * this master's lease -> lead again (it was readonly); another -> follow it. */
static void s_elect(s_master_t *m)
{
    if (!s_lease(m))
        return;
    char why[400] = "";
    if (!m->etcd_ok)
        kvedge_log_info("etcd answers again (%s)", kvedge_etcd_endpoint(m->etcd));
    m->etcd_ok = true;
    int64_t now = kvedge_mono_ms();
    if (now >= m->next_info) {
        s_info(m);
        m->next_info = now + S_INFO_MS;
    }
    char lk[300];
    s_ekey(m, "leader", lk, sizeof lk);
    if (m->role == S_ROLE_LEADER && now >= m->next_check) {
        /* The key may go without the lease (an operator's delete): a leader that did not see
         * it would lead beside the next one until its next fenced write. */
        kvedge_etcd_reply_t k;
        int grc = kvedge_etcd_get(m->etcd, lk, &k, why, sizeof why);
        if (grc != KVEDGE_OK) {
            s_etcd_down(m, "reading the leader key", why);
            s_counts(m);
            return;
        }
        bool mine = k.n_kvs == 1 && k.kvs[0].lease == m->lease;
        kvedge_etcd_reply_free(&k);
        m->next_check = now + m->opts.lease_ms / 3;
        if (!mine) {
            kvedge_log_error("the leader key is gone or another master's: not leading");
            s_set_role(m, S_ROLE_STANDBY);
            m->leader.id[0] = '\0';
        }
    }
    if (m->role == S_ROLE_LEADER) {
        s_counts(m);
        return;
    }
    char *self = s_self_json(m);
    kvedge_etcd_cmp_t c = {KVEDGE_ETCD_CMP_CREATE, lk, 0};
    kvedge_etcd_op_t put = {KVEDGE_ETCD_OP_PUT, lk, self, self ? strlen(self) : 0, m->lease};
    kvedge_etcd_op_t get = {KVEDGE_ETCD_OP_GET, lk, NULL, 0, 0};
    kvedge_etcd_reply_t r;
    int rc = self ? kvedge_etcd_txn(m->etcd, &c, 1, &put, 1, &get, 1, &r, why, sizeof why)
                  : KVEDGE_ENOMEM;
    free(self);
    s_counts(m);
    if (rc != KVEDGE_OK) {
        s_etcd_down(m, "the election", why);
        return;
    }
    if (r.succeeded) {
        kvedge_log_info("won the election (revision %lld)", (long long)r.revision);
        s_takeover(m, r.revision);
    } else if (r.n_kvs == 1 && r.kvs[0].lease == m->lease && m->led_lease != m->lease) {
        /* Ours, but its takeover did not complete (etcd failed under it): again. */
        s_takeover(m, r.kvs[0].create_rev);
    } else if (r.n_kvs == 1 && r.kvs[0].lease == m->lease) {
        /* Still ours: etcd came back before the lease expired. Nobody else led. */
        if (m->seq + 1 > m->reserved && s_reserve(m, m->seq + 1, why, sizeof why) != KVEDGE_OK) {
            kvedge_log_warn("cannot lead again yet: %s", why);
        } else {
            m->term = r.kvs[0].create_rev;
            s_set_role(m, S_ROLE_LEADER);
            s_hugz(m);
        }
    } else if (r.n_kvs == 1) {
        s_peer_master_t l;
        if (s_peer_parse(r.kvs[0].value, r.kvs[0].value_len, &l))
            s_follow(m, &l);
        else
            kvedge_log_warn("etcd: the leader key %s is not a master's description", lk);
    }
    kvedge_etcd_reply_free(&r);
}

static void s_not_leader(s_master_t *m, zframe_t *route, const kvedge_kvmsg_t *k)
{
    char reason[KVEDGE_KVMSG_MAX_REASON_BYTES + 1];
    if (m->role == S_ROLE_READONLY)
        snprintf(reason, sizeof reason, "no etcd quorum");
    else if (m->leader.id[0] &&
             strlen(m->leader.router) + strlen(m->leader.pub) + 8 < sizeof reason)
        snprintf(reason, sizeof reason, "leader %.123s %.123s", m->leader.router, m->leader.pub);
    else
        snprintf(reason, sizeof reason, "no leader");
    s_reply_err(m, route, k, KVEDGE_ENOTLEADER, reason);
}

static cJSON *s_peer_json(const s_peer_master_t *p, const char *role)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "id", p->id);
    cJSON_AddStringToObject(o, "router", p->router);
    cJSON_AddStringToObject(o, "pub", p->pub);
    if (role)
        cJSON_AddStringToObject(o, "role", role);
    return o;
}

static cJSON *s_etcd_json(s_master_t *m)
{
    cJSON *e = cJSON_CreateObject(), *eps = cJSON_AddArrayToObject(e, "endpoints");
    const char *list[KVEDGE_ETCD_MAX_ENDPOINTS];
    size_t n = kvedge_etcd_endpoints(m->etcd, list, KVEDGE_ETCD_MAX_ENDPOINTS);
    for (size_t i = 0; eps && i < n && i < KVEDGE_ETCD_MAX_ENDPOINTS; i++)
        cJSON_AddItemToArray(eps, cJSON_CreateString(list[i]));
    cJSON_AddStringToObject(e, "prefix", m->prefix);
    cJSON_AddStringToObject(e, "cluster", m->cluster);
    cJSON_AddBoolToObject(e, "healthy", m->etcd_ok);
    cJSON *mem = cJSON_AddArrayToObject(e, "members");
    for (size_t i = 0; mem && i < m->members.n_members; i++) {
        const kvedge_etcd_member_t *x = &m->members.members[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", x->id);
        cJSON_AddStringToObject(o, "name", x->name);
        cJSON *cu = cJSON_AddArrayToObject(o, "client_urls");
        for (size_t j = 0; cu && j < x->n_client; j++)
            cJSON_AddItemToArray(cu, cJSON_CreateString(x->client_urls[j]));
        cJSON *pu = cJSON_AddArrayToObject(o, "peer_urls");
        for (size_t j = 0; pu && j < x->n_peer; j++)
            cJSON_AddItemToArray(pu, cJSON_CreateString(x->peer_urls[j]));
        cJSON_AddItemToArray(mem, o);
    }
    return e;
}

/* STATUS: every master answers, leader or not (docs/master.md, "STATUS"). */
static void s_status(s_master_t *m, zframe_t *route, const kvedge_kvmsg_t *k)
{
    cJSON *o = cJSON_CreateObject();
    char reg[17];
    snprintf(reg, sizeof reg, "%016llx", (unsigned long long)m->registry);
    uint64_t seq = m->role == S_ROLE_STANDBY && m->view ? kvedge_mview_seq(m->view) : m->seq;
    bool leads = m->role == S_ROLE_LEADER || m->role == S_ROLE_SINGLE;
    if (o) {
        cJSON_AddStringToObject(o, "id", m->etcd ? m->id : "single");
        cJSON_AddStringToObject(o, "role", s_role_names[m->role]);
        cJSON_AddStringToObject(o, "router", m->owner->endpoint);
        cJSON_AddStringToObject(o, "pub", m->owner->pub_endpoint);
        s_peer_master_t self = {0};
        snprintf(self.id, sizeof self.id, "%s", m->etcd ? m->id : "single");
        snprintf(self.router, sizeof self.router, "%s", m->owner->endpoint);
        snprintf(self.pub, sizeof self.pub, "%s", m->owner->pub_endpoint);
        if (leads)
            cJSON_AddItemToObject(o, "leader", s_peer_json(&self, NULL));
        else if (m->leader.id[0] && m->role == S_ROLE_STANDBY)
            cJSON_AddItemToObject(o, "leader", s_peer_json(&m->leader, NULL));
        else
            cJSON_AddNullToObject(o, "leader");
        cJSON_AddStringToObject(o, "registry", reg);
        cJSON_AddNumberToObject(o, "seq", (double)seq);
        cJSON_AddNumberToObject(o, "term", (double)m->term);
        if (m->etcd)
            cJSON_AddItemToObject(o, "etcd", s_etcd_json(m));
        else
            cJSON_AddNullToObject(o, "etcd");
        cJSON *ms = cJSON_AddArrayToObject(o, "masters");
        if (!m->etcd && ms)
            cJSON_AddItemToArray(ms, s_peer_json(&self, "single"));
        for (size_t i = 0; ms && i < m->n_masters; i++) {
            const s_peer_master_t *p = &m->masters[i];
            bool is_leader = m->leader.id[0] && strcmp(p->id, m->leader.id) == 0;
            bool me = strcmp(p->id, m->id) == 0;
            cJSON_AddItemToArray(ms, s_peer_json(p, me          ? s_role_names[m->role]
                                                    : is_leader ? "leader"
                                                                : "standby"));
        }
        cJSON_AddNumberToObject(o, "leader_changes", (double)m->leader_changes);
    }
    char *doc = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!doc || strlen(doc) > KVEDGE_MASTER_STATUS_MAX) {
        free(doc);
        s_reply_err(m, route, k, KVEDGE_ENOMEM, "cannot build the status document");
        return;
    }
    kvedge_kvmsg_t ok = {.cmd = KVEDGE_KVMSG_OK,
                         .key = (const uint8_t *)KVEDGE_KVMSG_STATUS_KEY,
                         .key_len = strlen(KVEDGE_KVMSG_STATUS_KEY),
                         .seq = seq,
                         .body = (const uint8_t *)doc,
                         .body_len = strlen(doc),
                         .rid = k->rid};
    s_reply(m, route, &ok);
    free(doc);
}

/* An id from the ROUTER endpoint: "tcp://10.0.0.5:7410" -> "10.0.0.5:7410". */
static void s_default_id(const char *ep, char *out, size_t cap)
{
    const char *p = strstr(ep, "://");
    p = p ? p + 3 : ep;
    while (*p == '/')
        p++;
    size_t n = 0;
    for (; *p && n + 1 < cap && n < KVEDGE_MASTER_MAX_ID_BYTES; p++) {
        char c = *p;
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  strchr("._:@+-", c);
        out[n++] = ok ? c : '-';
    }
    out[n] = '\0';
    if (!n)
        snprintf(out, cap, "master");
}

/* Reads (or makes) meta under the prefix: the format this build reads, this cluster's name,
 * the registry id all masters of the cluster share. */
static int s_meta(s_master_t *m, char *why, size_t why_len)
{
    char mk[300], w[400] = "";
    s_ekey(m, "meta", mk, sizeof mk);
    uint64_t fresh;
    randombytes_buf(&fresh, sizeof fresh);
    cJSON *o = cJSON_CreateObject();
    char reg[17];
    snprintf(reg, sizeof reg, "%016llx", (unsigned long long)fresh);
    cJSON_AddNumberToObject(o, "format", KVEDGE_MASTER_ETCD_FORMAT);
    cJSON_AddStringToObject(o, "registry", reg);
    cJSON_AddStringToObject(o, "cluster", m->cluster);
    char *doc = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!doc)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "out of memory");
    kvedge_etcd_cmp_t c = {KVEDGE_ETCD_CMP_CREATE, mk, 0};
    kvedge_etcd_op_t put = {KVEDGE_ETCD_OP_PUT, mk, doc, strlen(doc), 0};
    kvedge_etcd_op_t get = {KVEDGE_ETCD_OP_GET, mk, NULL, 0, 0};
    kvedge_etcd_reply_t r;
    int rc = kvedge_etcd_txn(m->etcd, &c, 1, &put, 1, &get, 1, &r, w, sizeof w);
    if (rc != KVEDGE_OK) {
        free(doc);
        return kvedge_why(why, why_len, rc, "etcd (%s): %s", m->opts.etcd, w);
    }
    cJSON *meta = r.succeeded ? cJSON_Parse(doc)
                  : r.n_kvs == 1
                      ? cJSON_ParseWithLength((const char *)r.kvs[0].value, r.kvs[0].value_len)
                      : NULL;
    free(doc);
    kvedge_etcd_reply_free(&r);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(meta, "format");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(meta, "registry");
    const cJSON *cl = cJSON_GetObjectItemCaseSensitive(meta, "cluster");
    char *end = NULL;
    uint64_t id = cJSON_IsString(g) ? strtoull(g->valuestring, &end, 16) : 0;
    if (!cJSON_IsNumber(f) || !cJSON_IsString(cl) || !end || *end || strlen(g->valuestring) != 16)
        rc = kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                        "%s in etcd is not a kvedge meta record: refusing to use the prefix", mk);
    else if (f->valuedouble > KVEDGE_MASTER_ETCD_FORMAT)
        rc = kvedge_why(why, why_len, KVEDGE_EVERSION,
                        "%s says format %d; this build reads %d: upgrade this master", mk,
                        (int)f->valuedouble, KVEDGE_MASTER_ETCD_FORMAT);
    else if (strcmp(cl->valuestring, m->cluster) != 0)
        rc = kvedge_why(why, why_len, KVEDGE_ELOCKED,
                        "the etcd prefix %s belongs to the cluster '%.64s', not '%s': give this "
                        "cluster its own --etcd-prefix, or the right --cluster",
                        m->prefix, cl->valuestring, m->cluster);
    else {
        m->registry = id;
        m->owner->registry = id;
    }
    cJSON_Delete(meta);
    return rc;
}

/* etcd mode at start: the client, an endpoint that is etcd, and meta. */
static int s_etcd_open(s_master_t *m, char *why, size_t why_len)
{
    const kvedge_master_opts_t *o = &m->opts;
    snprintf(m->cluster, sizeof m->cluster, "%s",
             o->cluster && *o->cluster ? o->cluster : KVEDGE_MASTER_CLUSTER_DEFAULT);
    if (!kvedge_master_id_ok(m->cluster))
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "cluster name '%.64s': 1 to 64 of [A-Za-z0-9._:@+-]", m->cluster);
    if (o->etcd_prefix && *o->etcd_prefix)
        snprintf(m->prefix, sizeof m->prefix, "%.250s%s", o->etcd_prefix,
                 o->etcd_prefix[strlen(o->etcd_prefix) - 1] == '/' ? "" : "/");
    else
        snprintf(m->prefix, sizeof m->prefix, "/kvedge/%.64s/", m->cluster);
    if (o->id && *o->id) {
        if (!kvedge_master_id_ok(o->id))
            return kvedge_why(why, why_len, KVEDGE_EINVAL,
                              "master id '%.64s': 1 to 64 of [A-Za-z0-9._:@+-]", o->id);
        snprintf(m->id, sizeof m->id, "%s", o->id);
    }
    uint32_t t = o->lease_ms / 3;
    t = t < 200 ? 200 : t > KVEDGE_ETCD_TIMEOUT_MS ? KVEDGE_ETCD_TIMEOUT_MS : t;
    char w[600] = "";
    int rc = kvedge_etcd_new(o->etcd, t, &m->etcd, w, sizeof w);
    if (rc != KVEDGE_OK)
        return kvedge_why(why, why_len, rc, "--etcd %s: %s", o->etcd, w);
    kvedge_etcd_reply_t r;
    rc = kvedge_etcd_status(m->etcd, &r, w, sizeof w);
    if (rc != KVEDGE_OK)
        return kvedge_why(why, why_len, rc, "etcd %s is not usable: %s", o->etcd, w);
    kvedge_log_info("etcd %s (version %s) at %s, prefix %s, cluster %s",
                    kvedge_etcd_endpoint(m->etcd), r.version, o->etcd, m->prefix, m->cluster);
    kvedge_etcd_reply_free(&r);
    rc = s_meta(m, why, why_len);
    m->etcd_ok = rc == KVEDGE_OK;
    s_counts(m);
    return rc;
}

/* A leader going away cleanly hands over at once: its lease (and the leader key) revoked. */
static void s_etcd_close(s_master_t *m)
{
    if (m->etcd && m->lease) {
        char why[300];
        if (kvedge_etcd_lease_revoke(m->etcd, m->lease, why, sizeof why) != KVEDGE_OK)
            kvedge_log_warn("etcd: cannot revoke the lease: %s", why);
    }
    kvedge_mview_destroy(&m->view);
    kvedge_etcd_reply_free(&m->members);
    kvedge_etcd_destroy(&m->etcd);
}

/* ---------------------------------------------------------------- setup */

static void s_why(char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void s_why(char *why, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
}

/* Opens (or creates) the registry, reads its meta rows, counts the records and loads the
 * health table. */
static int s_open_registry(s_master_t *m, char *why, size_t why_len)
{
    const char *dir = m->opts.data_dir;
    mkdir(dir, 0700);
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(o, 1);
    rocksdb_options_set_keep_log_file_num(o, 4);
    rocksdb_options_set_max_open_files(o, 256);
    char *err = NULL;
    m->db = rocksdb_open(o, dir, &err);
    rocksdb_options_destroy(o);
    if (err) {
        char msg[KVEDGE_ROCKS_MSG_MAX_BYTES];
        int rc = kvedge_rocks_open_error(&err, msg, sizeof msg);
        s_why(why, why_len, "cannot open the registry %s: %s", dir, msg);
        m->db = NULL;
        return rc;
    }
    m->wo = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(m->wo, m->opts.sync ? 1 : 0);
    m->ro = rocksdb_readoptions_create();

    /* Zeroed: the compiler cannot see that s_meta_get's RocksDB errors are never 0. */
    uint8_t b8[8] = {0};
    int rc = s_meta_get(m, S_META_FORMAT, S_META_LEN(S_META_FORMAT), b8, 4);
    bool fresh = rc == KVEDGE_ENOTFOUND;
    if (rc == KVEDGE_OK && kvedge_le_get32(b8) != S_FORMAT_VERSION) {
        s_why(why, why_len, "registry %s has format %u; this build reads %u", dir,
              kvedge_le_get32(b8), S_FORMAT_VERSION);
        return KVEDGE_EVERSION;
    }
    if (rc != KVEDGE_OK && !fresh) {
        s_why(why, why_len, "registry %s: cannot read its format (%s)", dir, kvedge_strerror(rc));
        return rc;
    }
    if (fresh) {
        randombytes_buf(&m->registry, sizeof m->registry);
        uint8_t reg[8], fmt[4], zero[8];
        kvedge_le_put64(reg, m->registry);
        kvedge_le_put32(fmt, S_FORMAT_VERSION);
        kvedge_le_put64(zero, 0);
        rocksdb_writebatch_t *b = rocksdb_writebatch_create();
        rocksdb_writebatch_put(b, S_META_REGISTRY, S_META_LEN(S_META_REGISTRY), (char *)reg, 8);
        rocksdb_writebatch_put(b, S_META_SEQ, S_META_LEN(S_META_SEQ), (char *)zero, 8);
        rocksdb_writebatch_put(b, S_META_FORMAT, S_META_LEN(S_META_FORMAT), (char *)fmt, 4);
        rocksdb_writeoptions_t *so = rocksdb_writeoptions_create();
        rocksdb_writeoptions_set_sync(so, 1);
        rocksdb_write(m->db, so, b, &err);
        rocksdb_writeoptions_destroy(so);
        rocksdb_writebatch_destroy(b);
        if (err) {
            rc = s_rerr(&err);
            s_why(why, why_len, "cannot initialize the registry %s", dir);
            return rc;
        }
    } else {
        rc = s_meta_get(m, S_META_REGISTRY, S_META_LEN(S_META_REGISTRY), b8, 8);
        if (rc == KVEDGE_OK) {
            m->registry = kvedge_le_get64(b8);
            rc = s_meta_get(m, S_META_SEQ, S_META_LEN(S_META_SEQ), b8, 8);
            m->seq = rc == KVEDGE_OK ? kvedge_le_get64(b8) : 0;
        }
        if (rc != KVEDGE_OK) {
            s_why(why, why_len, "registry %s: meta rows damaged (%s)", dir,
                  rc == KVEDGE_ENOTFOUND ? "missing" : kvedge_strerror(rc));
            return rc == KVEDGE_ENOTFOUND ? KVEDGE_ECORRUPT : rc;
        }
    }

    /* Count the records; watch again every id that has a health record. Their silence is
     * counted from now: a master restart does not make the whole cluster suspect at once. */
    int64_t now = kvedge_mono_ms();
    rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
    uint64_t damaged = 0;
    for (rocksdb_iter_seek(it, "!", 1); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        if (!s_row_ok(k, kl, v, vl)) {
            damaged++;
            continue;
        }
        m->records++;
        m->bytes += kl + vl - 8;
        kvedge_master_key_t key;
        kvedge_master_health_t h;
        if (kvedge_master_key_parse(k, kl, &key) == KVEDGE_OK &&
            key.space == KVEDGE_MASTER_SPACE_HEALTH &&
            kvedge_master_health_parse((const uint8_t *)v + 8, vl - 8, &h) == KVEDGE_OK &&
            zhashx_size(m->peers) < KVEDGE_MASTER_MAX_HEALTH) {
            s_peer_t p = {now, h.last_seen_ms, h.state};
            zhashx_insert(m->peers, key.a, &p);
            /* Exported from the start: a peer that registered with the master's previous run
             * and only heartbeats now has its series as well. */
            s_peer_metric(m, key.a, h.state);
        }
    }
    rocksdb_iter_get_error(it, &err);
    rocksdb_iter_destroy(it);
    if (err) {
        rc = s_rerr(&err);
        s_why(why, why_len, "cannot scan the registry %s", dir);
        return rc;
    }
    if (damaged)
        kvedge_log_warn("registry %s: %llu damaged rows skipped", dir, (unsigned long long)damaged);
    atomic_store(&m->owner->seq, m->seq);
    m->owner->registry = m->registry;
    return KVEDGE_OK;
}

static void *s_peer_dup(const void *item)
{
    s_peer_t *p = malloc(sizeof *p);
    if (p)
        memcpy(p, item, sizeof *p);
    return p;
}

static void s_peer_free(void **item)
{
    free(*item);
    *item = NULL;
}

static zsock_t *s_socket(s_master_t *m, int type)
{
    zsock_t *s = zsock_new(type);
    if (!s)
        return NULL;
    zsock_set_linger(s, 0);
    zsock_set_sndtimeo(s, 0);
    zsock_set_maxmsgsize(s, (int64_t)KVEDGE_KVMSG_MAX_FRAME_BYTES);
    zsock_set_handshake_ivl(s, KVEDGE_HANDSHAKE_MS);
    zsock_set_heartbeat_ivl(s, KVEDGE_HEARTBEAT_IVL_MS);
    zsock_set_heartbeat_timeout(s, KVEDGE_HEARTBEAT_TIMEOUT_MS);
    if (m->cert) {
        zcert_apply(m->cert, s);
        zsock_set_curve_server(s, 1);
    }
    /* CURVE: the allowlist; plaintext: a ZAP domain all the same, so libzmq refuses pre-ZMTP-3
     * peers instead of reading arbitrary bytes as ZMTP 1.0 frames. */
    kvedge_secure_zap_apply(m->zap, s);
    return s;
}

static int s_setup(s_master_t *m)
{
    char why[512] = "";
    int rc = KVEDGE_OK;
    const kvedge_master_opts_t *o = &m->opts;
    m->peers = zhashx_new();
    if (!m->peers) {
        rc = KVEDGE_ENOMEM;
        s_why(why, sizeof why, "out of memory");
    } else {
        zhashx_set_duplicator(m->peers, s_peer_dup);
        zhashx_set_destructor(m->peers, s_peer_free);
    }
    if (rc != KVEDGE_OK) {
    } else if (!o->bind || !o->pub || !o->data_dir || !*o->data_dir) {
        rc = KVEDGE_EINVAL;
        s_why(why, sizeof why, "a bind endpoint, a pub endpoint and a data directory are required");
    } else if (o->insecure &&
               (!kvedge_endpoint_is_loopback(o->bind) || !kvedge_endpoint_is_loopback(o->pub))) {
        rc = KVEDGE_EDENIED;
        s_why(why, sizeof why,
              "refusing plaintext on %s / %s: plaintext is only allowed on loopback or ipc "
              "endpoints; drop --insecure and use CURVE",
              o->bind, o->pub);
    } else if (!o->insecure && !zsys_has_curve()) {
        rc = KVEDGE_EDENIED;
        s_why(why, sizeof why, "this libzmq has no CURVE support: refusing to serve");
    } else if (!o->insecure && (!o->cert || !o->clients_dir)) {
        rc = KVEDGE_EINVAL;
        s_why(why, sizeof why, "CURVE needs the master certificate and a clients directory");
    }
    if (rc == KVEDGE_OK)
        rc = s_open_registry(m, why, sizeof why);
    if (rc == KVEDGE_OK && o->etcd && *o->etcd)
        rc = s_etcd_open(m, why, sizeof why);
    if (rc == KVEDGE_OK && o->insecure && kvedge_secure_zap_open_plaintext(&m->zap) != KVEDGE_OK) {
        rc = KVEDGE_EDENIED;
        s_why(why, sizeof why, "the ZAP handler did not start: refusing to serve");
    }
    if (rc == KVEDGE_OK && !o->insecure) {
        m->cert = zcert_load(o->cert);
        if (!m->cert) {
            rc = KVEDGE_EIO;
            s_why(why, sizeof why, "cannot load the master certificate %s", o->cert);
        } else if (!zsys_file_exists(o->clients_dir)) {
            rc = KVEDGE_EIO;
            s_why(why, sizeof why, "clients directory %s does not exist", o->clients_dir);
        } else {
            /* The ZAP handler runs before any socket binds: no connection is ever accepted
             * without it. */
            if (kvedge_secure_zap_open(o->clients_dir, &m->zap) != KVEDGE_OK) {
                rc = KVEDGE_EDENIED;
                s_why(why, sizeof why, "the ZAP handler did not start: refusing to serve");
            }
        }
    }
    if (rc == KVEDGE_OK) {
        m->router = s_socket(m, ZMQ_ROUTER);
        m->pub = s_socket(m, ZMQ_XPUB);
        if (!m->router || !m->pub) {
            rc = KVEDGE_ENOMEM;
            s_why(why, sizeof why, "cannot create sockets");
        }
    }
    if (rc == KVEDGE_OK) {
        zsock_set_router_mandatory(m->router, 1);
        /* Room for one whole snapshot per peer; a peer that does not read loses its reply. */
        zsock_set_sndhwm(m->router, (int)KVEDGE_MASTER_MAX_RECORDS + 1024);
        zsock_set_sndhwm(m->pub, o->pub_hwm);
        /* Every subscription reaches us (not only the first per topic): a HUGZ answers it
         * at once, which tells the new subscriber its subscription is live. */
        zsock_set_xpub_verbose(m->pub, 1);
        const char *eps[2] = {o->bind, o->pub};
        zsock_t *socks[2] = {m->router, m->pub};
        char *outs[2] = {m->owner->endpoint, m->owner->pub_endpoint};
        for (int i = 0; i < 2 && rc == KVEDGE_OK; i++) {
            if (zsock_bind(socks[i], "%s", eps[i]) < 0) {
                rc = KVEDGE_EIO;
                s_why(why, sizeof why, "cannot bind %s: %s", eps[i], zmq_strerror(zmq_errno()));
            } else {
                const char *ep = zsock_endpoint(socks[i]);
                snprintf(outs[i], 256, "%s", ep ? ep : eps[i]);
            }
        }
        if (rc == KVEDGE_OK && m->cert)
            snprintf(m->owner->public_key, sizeof m->owner->public_key, "%s",
                     zcert_public_txt(m->cert));
        if (rc == KVEDGE_OK && m->etcd && !m->id[0])
            s_default_id(m->owner->endpoint, m->id, sizeof m->id);
        m->role = m->etcd ? S_ROLE_STANDBY : S_ROLE_SINGLE; /* on etcd: leads once elected */
        atomic_store(&m->owner->role, m->role);
        if (rc == KVEDGE_OK && m->zap) {
            char label[600];
            snprintf(label, sizeof label, "the master %s / %s", m->owner->endpoint,
                     m->owner->pub_endpoint);
            kvedge_secure_zap_label(m->zap, label);
        }
    }
    m->start_rc = rc;
    if (rc != KVEDGE_OK)
        m->start_error = strdup(why);
    return rc;
}

static void s_teardown(s_master_t *m)
{
    s_etcd_close(m);
    zsock_destroy(&m->pub);
    zsock_destroy(&m->router);
    kvedge_secure_zap_close(&m->zap); /* after the sockets under it */
    zcert_destroy(&m->cert);
    if (m->ro)
        rocksdb_readoptions_destroy(m->ro);
    if (m->wo)
        rocksdb_writeoptions_destroy(m->wo);
    if (m->db)
        rocksdb_close(m->db);
    m->db = NULL;
    m->ro = NULL;
    m->wo = NULL;
    zhashx_destroy(&m->peers);
}

static void s_actor(zsock_t *pipe, void *args)
{
    s_master_t *m = args;
    if (s_setup(m) != KVEDGE_OK) {
        s_teardown(m);
        zsock_signal(pipe, 0);
        char *cmd = zstr_recv(pipe); /* hold until destroy's $TERM */
        zstr_free(&cmd);
        return;
    }
    s_publish_size(m);
    zsock_signal(pipe, 0);
    kvedge_log_info("master serving %s, publishing on %s (%s), seq %llu, %llu records",
                    m->owner->endpoint, m->owner->pub_endpoint,
                    m->cert ? "CURVE" : "plaintext loopback", (unsigned long long)m->seq,
                    (unsigned long long)m->records);
    uint32_t tick = m->opts.suspect_ms / 4;
    tick = tick < 10 ? 10 : tick > S_TICK_MAX_MS ? S_TICK_MAX_MS : tick;
    zpoller_t *poller = zpoller_new(pipe, m->router, m->pub, NULL);
    int64_t next_hugz = kvedge_mono_ms(), next_tick = kvedge_mono_ms() + tick;
    /* On etcd: an election step this often (a standby sees a dead leader's key go at once). */
    int64_t elect_ms = m->opts.lease_ms / 6;
    elect_ms = elect_ms < 50 ? 50 : elect_ms > 250 ? 250 : elect_ms;
    int64_t next_elect = m->etcd ? kvedge_mono_ms() : INT64_MAX;
    bool running = poller != NULL;
    while (running) {
        int64_t now = kvedge_mono_ms();
        int64_t next = next_hugz < next_tick ? next_hugz : next_tick;
        next = next_elect < next ? next_elect : next;
        void *which = zpoller_wait(poller, next > now ? (int)(next - now) : 0);
        if (which == pipe) {
            char *cmd = zstr_recv(pipe);
            running = cmd && !streq(cmd, "$TERM");
            zstr_free(&cmd);
        } else if (which == m->router) {
            for (int i = 0; i < S_DRAIN_MAX && (zsock_events(m->router) & ZMQ_POLLIN); i++)
                s_request(m);
        } else if (which == m->pub) {
            for (int i = 0; i < S_DRAIN_MAX && (zsock_events(m->pub) & ZMQ_POLLIN); i++)
                if (s_subscription(m))
                    next_hugz = 0; /* one HUGZ for every subscription of this wakeup */
        } else if (zpoller_terminated(poller)) {
            running = false;
        }
        now = kvedge_mono_ms();
        if (now >= next_elect) {
            s_elect(m);
            /* etcd silent: every call may take its whole deadline; reads are served between. */
            next_elect = kvedge_mono_ms() + (m->etcd_ok ? elect_ms : m->opts.lease_ms / 3);
            now = kvedge_mono_ms();
        }
        bool leads = m->role == S_ROLE_SINGLE || m->role == S_ROLE_LEADER;
        if (now >= next_tick) {
            if (leads)
                s_health_tick(m);
            next_tick = now + tick;
        }
        if (now >= next_hugz) {
            if (m->role != S_ROLE_STANDBY) /* a standby's PUB is silent */
                s_hugz(m);
            next_hugz = now + m->opts.hugz_ms;
        }
    }
    zpoller_destroy(&poller);
    kvedge_log_info("master stopped at seq %llu", (unsigned long long)m->seq);
    s_teardown(m);
}

/* ---------------------------------------------------------------- monitoring */

static void s_collect(kvedge_metrics_t *r, void *arg)
{
    (void)r;
    kvedge_master_t *s = arg;
    kvedge_series_set(s->records_g, (double)atomic_load(&s->records));
    kvedge_series_set(s->bytes_g, (double)atomic_load(&s->bytes));
    kvedge_series_set(s->seq_g, (double)atomic_load(&s->seq));
    /* The ZAP handler lives while the actor does; the endpoint stops before the actor. */
    s_master_t *m = s->state;
    kvedge_series_mirror(s->denials, &s->denials_seen,
                         m && m->zap ? kvedge_secure_zap_denials(m->zap) : 0);
    int role = atomic_load(&s->role);
    kvedge_series_set(s->leader_g, role == S_ROLE_LEADER || role == S_ROLE_SINGLE ? 1 : 0);
    for (int i = 0; i < 4; i++)
        kvedge_series_set(s->role_g[i], i == role ? 1 : 0);
    kvedge_series_mirror(s->changes_c, &s->changes_seen, atomic_load(&s->leader_changes));
    kvedge_series_mirror(s->etcd_req[0], &s->etcd_seen[0], atomic_load(&s->etcd_ok));
    kvedge_series_mirror(s->etcd_req[1], &s->etcd_seen[1], atomic_load(&s->etcd_failed));
}

static kvedge_series_t *s_plain(kvedge_metrics_t *r, kvedge_metric_type_t t, const char *name,
                                const char *help)
{
    return kvedge_metrics_single(r, t, name, help, NULL, NULL, 0);
}

/* The master's registry of metrics: made before the actor, which records into it. */
static int s_metrics_open(kvedge_master_t *s, s_master_t *m, char *why, size_t why_len)
{
    kvedge_metrics_t *r = s->metrics = kvedge_metrics_new();
    if (!r)
        return KVEDGE_ENOMEM;
    const char *cl[] = {"cmd"}, *pl[] = {"id"};
    if (kvedge_metrics_process(r, KVEDGE_VERSION_STRING, "master", (double)kvedge_wall_ms() / 1e3,
                               why, why_len) != 0)
        return KVEDGE_ENOMEM;
    s->records_g = s_plain(r, KVEDGE_METRIC_GAUGE, "kvedge_master_records",
                           "Records in the registry (nodes, health, models, maps, directory, "
                           "links).");
    s->bytes_g = s_plain(r, KVEDGE_METRIC_GAUGE, "kvedge_master_registry_bytes",
                         "Keys and bodies of the registry's records.");
    s->seq_g = s_plain(r, KVEDGE_METRIC_GAUGE, "kvedge_master_seq",
                       "Sequence number of the last update published.");
    s->denials = s_plain(r, KVEDGE_METRIC_COUNTER, "kvedge_master_handshake_denials_total",
                         "CURVE handshakes refused: peers (nodes, proxies) whose certificate is "
                         "not in the allowlist (each is logged).");
    m->req_family = kvedge_metrics_family(
        r, KVEDGE_METRIC_COUNTER, "kvedge_master_requests_total",
        "Requests on the master's ROUTER, by command (snapshot, set, heartbeat, malformed, "
        "other).",
        cl, 1, NULL, 5, why, why_len);
    m->peer_family = kvedge_metrics_family(
        r, KVEDGE_METRIC_GAUGE, "kvedge_master_peer_state",
        "Health of every heartbeat id (nodes and proxies): 1 up, 2 suspect, 3 down (the "
        "first 1024 ids; the rest fold into _other).",
        pl, 1, NULL, 1024, why, why_len);
    s->leader_g = s_plain(r, KVEDGE_METRIC_GAUGE, "kvedge_master_leader",
                          "1 while this master leads (on etcd, or the single master), else 0.");
    s->changes_c = s_plain(r, KVEDGE_METRIC_COUNTER, "kvedge_master_leader_changes_total",
                           "Times this master took over the lead (on etcd).");
    const char *rl[] = {"result"}, *ro[] = {"role"};
    kvedge_metric_t *ef = kvedge_metrics_family(
        r, KVEDGE_METRIC_COUNTER, "kvedge_master_etcd_requests_total",
        "Calls to etcd by result: ok (etcd answered, its refusals included), failed (no etcd "
        "answer: unreachable, not etcd, no leader, deadline).",
        rl, 1, NULL, 2, why, why_len);
    kvedge_metric_t *rf = kvedge_metrics_family(
        r, KVEDGE_METRIC_GAUGE, "kvedge_master_role",
        "1 for this master's role (single, leader, standby, readonly), 0 for the others.", ro, 1,
        NULL, 4, why, why_len);
    if (!s->records_g || !s->bytes_g || !s->seq_g || !s->denials || !m->req_family ||
        !m->peer_family || !s->leader_g || !s->changes_c || !ef || !rf)
        return KVEDGE_ENOMEM;
    const char *res[] = {"ok", "failed"};
    for (int i = 0; i < 2; i++)
        s->etcd_req[i] = kvedge_metric_series(ef, &res[i], 1);
    for (int i = 0; i < 4; i++)
        s->role_g[i] = kvedge_metric_series(rf, &s_role_names[i], 1);
    const char *cmds[] = {"snapshot", "set", "heartbeat", "malformed", "other"};
    for (int i = 0; i < 5; i++)
        m->req[i] = kvedge_metric_series(m->req_family, &cmds[i], 1);
    return kvedge_metrics_on_collect(r, s_collect, s) == 0 ? KVEDGE_OK : KVEDGE_ENOMEM;
}

/* ---------------------------------------------------------------- public */

void kvedge_master_opts_default(kvedge_master_opts_t *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof *opts);
    opts->bind = KVEDGE_MASTER_BIND_DEFAULT;
    opts->pub = KVEDGE_MASTER_PUB_DEFAULT;
}

int kvedge_master_probe(const kvedge_master_opts_t *o, char *why, size_t why_len)
{
    if (!o)
        return KVEDGE_EINVAL;
    const char *eps[2] = {o->bind, o->pub}, *flags[2] = {"--bind", "--pub"},
               *keys[2] = {"bind", "pub"};
    char sys[512] = "";
    for (int i = 0; i < 2; i++) {
        int rc = kvedge_endpoint_probe(eps[i], sys, sizeof sys);
        if (rc != KVEDGE_OK) {
            s_why(why, why_len,
                  "%s%s: give this master another endpoint with %s tcp://HOST:PORT (config key "
                  "%s); nothing was started",
                  sys, rc == KVEDGE_ELOCKED ? " (another master on this host?)" : "", flags[i],
                  keys[i]);
            return rc;
        }
    }
    if (o->metrics && o->metrics[0] && kvedge_http_probe(o->metrics, sys, sizeof sys) != 0) {
        bool busy = strstr(sys, "in use") != NULL;
        s_why(why, why_len,
              "%s%s: give this master another metrics endpoint with --metrics HOST:PORT (port 0: "
              "any free one, its URL is logged), or --metrics off (config key metrics); nothing "
              "was started",
              sys, busy ? " (another daemon on this host?)" : "");
        return busy ? KVEDGE_ELOCKED : KVEDGE_EIO;
    }
    return KVEDGE_OK;
}

int kvedge_master_start(const kvedge_master_opts_t *opts, kvedge_master_t **out, char *why,
                        size_t why_len)
{
    if (why && why_len)
        why[0] = '\0';
    if (!opts || !out)
        return KVEDGE_EINVAL;
    *out = NULL;
    if (sodium_init() < 0)
        return KVEDGE_ENOMEM;
    int prc = kvedge_master_probe(opts, why, why_len);
    if (prc != KVEDGE_OK)
        return prc;
    kvedge_master_t *s = calloc(1, sizeof *s);
    s_master_t *m = calloc(1, sizeof *m);
    if (!s || !m) {
        free(s);
        free(m);
        return KVEDGE_ENOMEM;
    }
    m->opts = *opts;
    m->owner = s;
    int mrc = s_metrics_open(s, m, why, why_len);
    if (mrc != KVEDGE_OK) {
        kvedge_metrics_destroy(&s->metrics);
        free(s);
        free(m);
        return mrc;
    }
    if (!m->opts.hugz_ms)
        m->opts.hugz_ms = KVEDGE_MASTER_HUGZ_MS;
    if (!m->opts.suspect_ms)
        m->opts.suspect_ms = KVEDGE_MASTER_SUSPECT_MS;
    if (!m->opts.down_ms)
        m->opts.down_ms = KVEDGE_MASTER_DOWN_MS;
    if (m->opts.down_ms < m->opts.suspect_ms)
        m->opts.down_ms = m->opts.suspect_ms;
    if (m->opts.pub_hwm <= 0)
        m->opts.pub_hwm = KVEDGE_MASTER_PUB_HWM;
    if (!m->opts.lease_ms)
        m->opts.lease_ms = KVEDGE_MASTER_LEASE_MS;
    zsys_set_logstream(NULL); /* czmq's own logging stays quiet: we have ours */
    s->actor = zactor_new(s_actor, m);
    if (!s->actor) {
        free(s);
        free(m);
        return KVEDGE_ENOMEM;
    }
    int rc = m->start_rc;
    if (rc != KVEDGE_OK) {
        if (why)
            snprintf(why, why_len, "%s", m->start_error ? m->start_error : "start failed");
        zactor_destroy(&s->actor);
        free(m->start_error);
        free(m);
        kvedge_metrics_destroy(&s->metrics);
        free(s);
        return rc;
    }
    s->state = m; /* owned by the actor thread from here; freed after it stops */
    if (opts->metrics && opts->metrics[0] && strcmp(opts->metrics, KVEDGE_HTTP_OFF) != 0) {
        rc = kvedge_http_start(opts->metrics, s->metrics, NULL, NULL, &s->http, why, why_len);
        if (rc != KVEDGE_OK) {
            kvedge_master_destroy(&s);
            return rc;
        }
        kvedge_log_info("metrics on %s/metrics (health: /health, readiness: /ready)",
                        kvedge_http_url(s->http));
    }
    *out = s;
    return KVEDGE_OK;
}

void kvedge_master_destroy(kvedge_master_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_master_t *s = *self_p;
    *self_p = NULL;
    kvedge_http_stop(&s->http);
    zactor_destroy(&s->actor);
    free(s->state);
    kvedge_metrics_destroy(&s->metrics);
    free(s);
}

const char *kvedge_master_endpoint(kvedge_master_t *m)
{
    return m ? m->endpoint : NULL;
}

const char *kvedge_master_pub_endpoint(kvedge_master_t *m)
{
    return m ? m->pub_endpoint : NULL;
}

const char *kvedge_master_public_key(kvedge_master_t *m)
{
    return m && m->public_key[0] ? m->public_key : NULL;
}

uint64_t kvedge_master_seq(kvedge_master_t *m)
{
    return m ? atomic_load(&m->seq) : 0;
}

uint64_t kvedge_master_registry(kvedge_master_t *m)
{
    return m ? m->registry : 0;
}

const char *kvedge_master_role(kvedge_master_t *m)
{
    int r = m ? atomic_load(&m->role) : S_ROLE_SINGLE;
    return s_role_names[r >= 0 && r < 4 ? r : 0];
}
