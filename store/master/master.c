/* The Storage Master daemon, one actor that owns the registry (RocksDB), the ROUTER and the
 * PUB; masters on etcd and STATUS are ha.c's, on the same actor. Every update goes through one
 * function, s_apply: next seq (on etcd: the seq reserved and a hard record written there first),
 * one write batch with the record and the seq, then publish. */
#include "store/master/master_impl.h"

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

/* Publishes a heartbeat id's state (1 up, 2 suspect, 3 down) as a gauge. */
void kvedge_master_peer_metric(kvedge_master_state_t *m, const char *id,
                               kvedge_master_health_state_t st)
{
    if (!m->peer_family)
        return;
    const char *v[] = {id};
    kvedge_series_set(kvedge_metric_series(m->peer_family, v, 1), (double)st);
}

void kvedge_master_publish_size(kvedge_master_state_t *m)
{
    atomic_store(&m->owner->records, m->records);
    atomic_store(&m->owner->bytes, m->bytes);
}

/* A RocksDB error on the registry: logged, then translated (store/engine/rocks.h), which frees it.
 */
int kvedge_master_rerr(char **err)
{
    kvedge_log_error("registry: %s", *err);
    return kvedge_rocks_error(err);
}

/* Reads a meta value of exactly want bytes; ENOTFOUND when absent. */
static int s_meta_get(kvedge_master_state_t *m, const char *key, size_t klen, uint8_t *out,
                      size_t want)
{
    char *err = NULL;
    size_t len = 0;
    char *v = rocksdb_get(m->db, m->ro, key, klen, &len, &err);
    if (err)
        return kvedge_master_rerr(&err);
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
bool kvedge_master_reply(kvedge_master_state_t *m, zframe_t *route, const kvedge_kvmsg_t *k)
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

void kvedge_master_reply_err(kvedge_master_state_t *m, zframe_t *route, const kvedge_kvmsg_t *req,
                             int status, const char *reason)
{
    kvedge_kvmsg_t e = {.cmd = KVEDGE_KVMSG_ERR, .rid = req ? req->rid : 0, .status = status};
    if (req && kvedge_kvmsg_key_ok(req->key, req->key_len)) {
        e.key = req->key;
        e.key_len = req->key_len;
    }
    e.body = (const uint8_t *)reason;
    e.body_len = reason ? strnlen(reason, KVEDGE_KVMSG_MAX_REASON_BYTES) : 0;
    if (!kvedge_master_reply(m, route, &e))
        kvedge_log_debug("error reply dropped");
}

static void s_publish(kvedge_master_state_t *m, const kvedge_kvmsg_t *k)
{
    zmsg_t *msg = s_kvmsg_zmsg(k);
    if (msg && zmsg_send(&msg, m->pub) != 0)
        zmsg_destroy(&msg);
}

void kvedge_master_hugz(kvedge_master_state_t *m)
{
    kvedge_kvmsg_t h = {.cmd = KVEDGE_KVMSG_HUGZ, .seq = m->seq, .registry = m->registry};
    s_publish(m, &h);
}

/* The one way anything changes: next seq; on etcd, the seq reserved and a hard record written
 * there first (fenced); the record (or its deletion) and the seq in one write batch; then
 * publish. On failure nothing changed here and nothing was published (m->why says why when
 * etcd refused). Errors: KVEDGE_EFULL (registry limits), store errors, etcd's (s_fenced). */
static int s_apply(kvedge_master_state_t *m, const char *key, size_t klen, const uint8_t *body,
                   size_t len, uint64_t *seq_out)
{
    char *err = NULL;
    size_t old_len = 0;
    char *old = rocksdb_get(m->db, m->ro, key, klen, &old_len, &err);
    if (err)
        return kvedge_master_rerr(&err);
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
        int rrc = kvedge_master_reserve(m, seq, m->why, sizeof m->why);
        if (rrc != KVEDGE_OK) {
            kvedge_log_warn("update not applied: %s", m->why);
            return rrc;
        }
    }
    if (m->etcd && kvedge_master_hard_key(key, klen)) {
        /* Hard state: in etcd first (fenced by the leader's lease), then here. */
        char k0[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
        snprintf(k0, sizeof k0, "%.*s", (int)klen, key);
        int erc = kvedge_master_etcd_record(m, k0, seq, body, len, m->why, sizeof m->why);
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
        return kvedge_master_rerr(&err);
    m->seq = seq;
    atomic_store(&m->owner->seq, seq);
    m->records = m->records + (len && !existed) - (!len && existed);
    m->bytes = bytes;
    kvedge_master_publish_size(m);
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

static int s_health_write(kvedge_master_state_t *m, const char *id, const kvedge_master_peer_t *p,
                          uint64_t changed)
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
static void s_health_tick(kvedge_master_state_t *m)
{
    int64_t now = kvedge_mono_ms();
    for (kvedge_master_peer_t *p = zhashx_first(m->peers); p; p = zhashx_next(m->peers)) {
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
        kvedge_master_peer_metric(m, id, want);
    }
}

static void s_heartbeat(kvedge_master_state_t *m, zframe_t *route, const kvedge_kvmsg_t *k)
{
    char id[KVEDGE_MASTER_MAX_ID_BYTES + 1];
    memcpy(id, k->key, k->key_len);
    id[k->key_len] = '\0';
    kvedge_master_peer_t *p = zhashx_lookup(m->peers, id);
    if (!p) {
        if (zhashx_size(m->peers) >= KVEDGE_MASTER_MAX_HEALTH) {
            kvedge_master_reply_err(m, route, k, KVEDGE_EFULL, "too many heartbeat ids");
            return;
        }
        kvedge_master_peer_t fresh = {0, 0, (kvedge_master_health_state_t)0};
        zhashx_insert(m->peers, id, &fresh);
        p = zhashx_lookup(m->peers, id);
        if (!p) {
            kvedge_master_reply_err(m, route, k, KVEDGE_ENOMEM, "out of memory");
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
            kvedge_master_reply_err(m, route, k, rc, "cannot record the health state");
            return;
        }
        kvedge_log_info("%s is up", id);
        kvedge_master_peer_metric(m, id, KVEDGE_MASTER_HEALTH_UP);
    }
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    kvedge_master_key_format(KVEDGE_MASTER_SPACE_HEALTH, id, NULL, key, sizeof key);
    kvedge_kvmsg_t ok = {.cmd = KVEDGE_KVMSG_OK,
                         .key = (const uint8_t *)key,
                         .key_len = strlen(key),
                         .seq = m->seq,
                         .rid = k->rid};
    kvedge_master_reply(m, route, &ok);
}

/* ---------------------------------------------------------------- requests */

static void s_set(kvedge_master_state_t *m, zframe_t *route, const kvedge_kvmsg_t *k)
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
        kvedge_master_reply_err(m, route, k, rc, why);
        return;
    }
    uint64_t seq = 0;
    rc = s_apply(m, key, k->key_len, k->body, k->body_len, &seq);
    if (rc != KVEDGE_OK) {
        kvedge_master_reply_err(m, route, k, rc, m->why[0] ? m->why : kvedge_strerror(rc));
        return;
    }
    kvedge_master_key_t parsed;
    if (k->body_len == 0 && kvedge_master_key_parse(key, k->key_len, &parsed) == KVEDGE_OK &&
        parsed.space == KVEDGE_MASTER_SPACE_HEALTH)
        zhashx_delete(m->peers, parsed.a); /* forgotten: a decommissioned node */
    kvedge_kvmsg_t ok = {
        .cmd = KVEDGE_KVMSG_OK, .key = k->key, .key_len = k->key_len, .seq = seq, .rid = k->rid};
    kvedge_master_reply(m, route, &ok);
}

/* A stored value: seq u64 | body (1 … 64 KiB) under a valid key. False for anything else
 * (a damaged or foreign row: skipped, never served). */
bool kvedge_master_row_ok(const char *k, size_t kl, const char *v, size_t vl)
{
    return kvedge_kvmsg_key_ok((const uint8_t *)k, kl) && vl > 8 &&
           vl - 8 <= KVEDGE_KVMSG_MAX_BODY_BYTES && kvedge_le_get64((const uint8_t *)v) >= 1;
}

/* Clone's snapshot: every record under the prefix as KVSYNC, then KTHXBAI with the current
 * seq and the count. The actor is the only writer, so the iteration is consistent with seq. */
static void s_snapshot(kvedge_master_state_t *m, zframe_t *route, const kvedge_kvmsg_t *k)
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
        if (!kvedge_master_row_ok(key, kl, v, vl)) {
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
        sent = kvedge_master_reply(m, route, &r);
        count++;
    }
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    rocksdb_iter_destroy(it);
    if (err) {
        int rc = kvedge_master_rerr(&err);
        kvedge_master_reply_err(m, route, k, rc, "cannot read the registry");
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
    kvedge_master_reply(m, route, &end);
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

static void s_request(kvedge_master_state_t *m)
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
        kvedge_master_reply_err(m, route, &echo, KVEDGE_EPROTO, "malformed kvmsg");
    } else {
        kvedge_series_inc(m->req[k.cmd == KVEDGE_KVMSG_ICANHAZ     ? 0
                                 : k.cmd == KVEDGE_KVMSG_SET       ? 1
                                 : k.cmd == KVEDGE_KVMSG_HEARTBEAT ? 2
                                                                   : 4]);
        switch (k.cmd) {
        case KVEDGE_KVMSG_STATUS:
            kvedge_master_status_reply(m, route, &k);
            break;
        case KVEDGE_KVMSG_ICANHAZ:
            if (m->role == S_ROLE_STANDBY)
                kvedge_master_not_leader(m, route, &k);
            else
                s_snapshot(m, route, &k);
            break;
        case KVEDGE_KVMSG_SET:
            if (m->role == S_ROLE_STANDBY || m->role == S_ROLE_READONLY)
                kvedge_master_not_leader(m, route, &k);
            else
                s_set(m, route, &k);
            break;
        case KVEDGE_KVMSG_HEARTBEAT:
            if (m->role == S_ROLE_STANDBY || m->role == S_ROLE_READONLY)
                kvedge_master_not_leader(m, route, &k);
            else
                s_heartbeat(m, route, &k);
            break;
        default: /* a reply or a PUB message sent to the master */
            kvedge_master_reply_err(m, route, &k, KVEDGE_EPROTO, "not a request");
            break;
        }
    }
    for (size_t i = 0; i < n && i < 1 + KVEDGE_KVMSG_MAX_FRAMES; i++)
        zframe_destroy(&parts[i]);
}

/* Reads one message from the XPUB: true for a subscription (0x01 | topic). Anything else a
 * subscriber sends is read and dropped. */
static bool s_subscription(kvedge_master_state_t *m)
{
    zframe_t *part = NULL;
    size_t n = s_recv_bounded(m->pub, &part, 1);
    bool sub = n == 1 && part && zframe_size(part) >= 1 && zframe_data(part)[0] == 1;
    zframe_destroy(&part);
    return sub;
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
static int s_open_registry(kvedge_master_state_t *m, char *why, size_t why_len)
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
            rc = kvedge_master_rerr(&err);
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
        if (!kvedge_master_row_ok(k, kl, v, vl)) {
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
            kvedge_master_peer_t p = {now, h.last_seen_ms, h.state};
            zhashx_insert(m->peers, key.a, &p);
            /* Exported from the start: a peer that registered with the master's previous run
             * and only heartbeats now has its series as well. */
            kvedge_master_peer_metric(m, key.a, h.state);
        }
    }
    rocksdb_iter_get_error(it, &err);
    rocksdb_iter_destroy(it);
    if (err) {
        rc = kvedge_master_rerr(&err);
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
    kvedge_master_peer_t *p = malloc(sizeof *p);
    if (p)
        memcpy(p, item, sizeof *p);
    return p;
}

static void s_peer_free(void **item)
{
    free(*item);
    *item = NULL;
}

static zsock_t *s_socket(kvedge_master_state_t *m, int type)
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

static int s_setup(kvedge_master_state_t *m)
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
        rc = kvedge_master_etcd_open(m, why, sizeof why);
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
            kvedge_master_default_id(m->owner->endpoint, m->id, sizeof m->id);
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

static void s_teardown(kvedge_master_state_t *m)
{
    kvedge_master_etcd_close(m);
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
    kvedge_master_state_t *m = args;
    if (s_setup(m) != KVEDGE_OK) {
        s_teardown(m);
        zsock_signal(pipe, 0);
        char *cmd = zstr_recv(pipe); /* hold until destroy's $TERM */
        zstr_free(&cmd);
        return;
    }
    kvedge_master_publish_size(m);
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
            kvedge_master_elect(m);
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
                kvedge_master_hugz(m);
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
    kvedge_master_state_t *m = s->state;
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
static int s_metrics_open(kvedge_master_t *s, kvedge_master_state_t *m, char *why, size_t why_len)
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
        s->role_g[i] = kvedge_metric_series(rf, &kvedge_master_role_names[i], 1);
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
    kvedge_master_state_t *m = calloc(1, sizeof *m);
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
    return kvedge_master_role_names[r >= 0 && r < 4 ? r : 0];
}
