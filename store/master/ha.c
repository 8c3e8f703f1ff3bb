/* Masters on etcd (docs/master.md, "Masters on etcd") and the answer to STATUS: the lease and
 * the election, fenced writes of hard records and seq blocks, a standby's view of the leader,
 * the takeover, readonly without quorum. Runs on the master's actor thread (master.c calls it);
 * every etcd call has the client's deadline. */
#include "store/master/master_impl.h"

#include <cjson/cJSON.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/log.h"
#include "access/codec/byteorder.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"
#include "access/codec/why.h"

const char *const kvedge_master_role_names[4] = {"single", "leader", "standby", "readonly"};

/* The layout under the prefix (docs/master.md, "Masters on etcd"): meta (format, registry id,
 * cluster), seq (the reserved high-water mark H), reg/<key> (hard records: seq u64 | body),
 * leader (the leader's id and endpoints, on its lease), masters/<id> (each master, on its
 * lease). */

static void s_ekey(const kvedge_master_state_t *m, const char *suffix, char *out, size_t cap)
{
    snprintf(out, cap, "%s%s", m->prefix, suffix);
}

/* model/, tmodel/, map/ and adapter/ live in etcd; the rest is soft state the nodes re-announce. */
bool kvedge_master_hard_key(const char *key, size_t len)
{
    kvedge_master_key_t k;
    return kvedge_master_key_parse(key, len, &k) == KVEDGE_OK &&
           (k.space == KVEDGE_MASTER_SPACE_MODEL || k.space == KVEDGE_MASTER_SPACE_TMODEL ||
            k.space == KVEDGE_MASTER_SPACE_MAP || k.space == KVEDGE_MASTER_SPACE_ADAPTER);
}

static void s_set_role(kvedge_master_state_t *m, int role)
{
    if (m->role == role)
        return;
    kvedge_log_info("role %s -> %s", kvedge_master_role_names[m->role],
                    kvedge_master_role_names[role]);
    m->role = role;
    atomic_store(&m->owner->role, role);
}

static void s_counts(kvedge_master_state_t *m)
{
    uint64_t ok, failed;
    kvedge_etcd_counts(m->etcd, &ok, &failed);
    atomic_store(&m->owner->etcd_ok, ok);
    atomic_store(&m->owner->etcd_failed, failed);
}

/* etcd did not answer: a leader that has not renewed its lease for a whole lease stops
 * leading (its lease may have expired: another master may lead now). */
static void s_etcd_down(kvedge_master_state_t *m, const char *what, const char *why)
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
static int s_fenced(kvedge_master_state_t *m, const kvedge_etcd_op_t *ops, size_t n, char *why,
                    size_t why_len)
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
int kvedge_master_reserve(kvedge_master_state_t *m, uint64_t seq, char *why, size_t why_len)
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
int kvedge_master_etcd_record(kvedge_master_state_t *m, const char *key, uint64_t seq,
                              const uint8_t *body, size_t len, char *why, size_t why_len)
{
    if (seq > m->reserved) {
        int rc = kvedge_master_reserve(m, seq, why, why_len);
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
static char *s_self_json(kvedge_master_state_t *m)
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
static bool s_peer_parse(const uint8_t *v, size_t len, kvedge_master_desc_t *out)
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
static void s_follow(kvedge_master_state_t *m, const kvedge_master_desc_t *l)
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
static bool s_renew(kvedge_master_state_t *m)
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
    kvedge_master_state_t *m = a[0];
    s_rows_t *rows = a[1];
    if (rows->n % S_RENEW_EVERY == 0 && !s_renew(m))
        return KVEDGE_ENOTLEADER;      /* the lease went: this takeover is void */
    size_t pl = strlen(m->prefix) + 4; /* "reg/" */
    const char *key = kv->key + pl;
    size_t kl = kv->key_len - pl;
    if (kv->key_len <= pl || kv->value_len <= 8 || !kvedge_master_hard_key(key, kl)) {
        kvedge_log_warn("etcd: skipping a damaged hard record (%zu bytes)", kv->value_len);
        return 0;
    }
    s_rows_add(rows, key, kl, kvedge_le_get64(kv->value), kv->value + 8, kv->value_len - 8);
    return 0;
}

static int s_soft_view_cb(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    if (!kvedge_master_hard_key(key, strlen(key)))
        s_rows_add(ctx, key, strlen(key), seq, body, len);
    return 0;
}

/* The soft records of the local registry (a master that led before and leads again). */
static void s_soft_local(kvedge_master_state_t *m, s_rows_t *rows)
{
    rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
    for (rocksdb_iter_seek(it, "!", 1); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        if (kvedge_master_row_ok(k, kl, v, vl) && !kvedge_master_hard_key(k, kl))
            s_rows_add(rows, k, kl, kvedge_le_get64((const uint8_t *)v), (const uint8_t *)v + 8,
                       vl - 8);
    }
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    rocksdb_iter_destroy(it);
    if (err) {
        kvedge_master_rerr(&err);
        rows->failed = true;
    }
}

/* The local registry becomes rows (a cache: cleared and rewritten), at seq. */
static int s_rewrite_local(kvedge_master_state_t *m, const s_rows_t *rows, uint64_t seq)
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
        return kvedge_master_rerr(&err);
    m->seq = seq;
    atomic_store(&m->owner->seq, seq);
    kvedge_master_publish_size(m);
    /* Every id that was up or suspect gets a fresh grace period, as after a restart, and the
     * time its view needs to find this leader on top: a node's view leaves a silent master
     * after KVEDGE_MVIEW_DEAD_MS, and its next heartbeat comes a heartbeat interval later, so
     * counting silence from now alone would call nodes suspect that are on their way. */
    zhashx_purge(m->peers);
    int64_t heard = kvedge_mono_ms() + KVEDGE_MVIEW_DEAD_MS + KVEDGE_MASTER_HEARTBEAT_IVL_MS;
    for (size_t i = 0; i < rows->n; i++) {
        const char *k = rows->rows[i].key;
        kvedge_master_key_t key;
        kvedge_master_health_t h;
        if (kvedge_master_key_parse(k, strlen(k), &key) == KVEDGE_OK &&
            key.space == KVEDGE_MASTER_SPACE_HEALTH &&
            kvedge_master_health_parse(rows->rows[i].val + 8, rows->rows[i].len - 8, &h) ==
                KVEDGE_OK &&
            zhashx_size(m->peers) < KVEDGE_MASTER_MAX_HEALTH) {
            kvedge_master_peer_t p = {heard, h.last_seen_ms, h.state};
            zhashx_insert(m->peers, key.a, &p);
            kvedge_master_peer_metric(m, key.a, h.state);
        }
    }
    return KVEDGE_OK;
}

/* This master won the election: hard records from etcd, soft ones from the view it followed
 * (else its own registry), seq above anything the old leader may have published, a new block
 * reserved, then HUGZ. On failure it does not lead (readonly until the next election step). */
static int s_takeover(kvedge_master_state_t *m, int64_t term)
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
        rc = kvedge_master_reserve(m, seq, why, sizeof why);
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
    kvedge_master_hugz(m);
    return KVEDGE_OK;
}

/* The lease: granted (with masters/<id> on it) when there is none, renewed every lease/3.
 * False when etcd did not answer. */
static bool s_lease(kvedge_master_state_t *m)
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
    kvedge_master_state_t *m = ctx;
    if (m->n_masters < S_MAX_MASTERS &&
        s_peer_parse(kv->value, kv->value_len, &m->masters[m->n_masters]))
        m->n_masters++;
    return 0;
}

/* masters/<id> (put again: it goes with an expired lease), the masters and etcd's members, for
 * STATUS. */
static void s_info(kvedge_master_state_t *m)
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
void kvedge_master_elect(kvedge_master_state_t *m)
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
        if (m->seq + 1 > m->reserved &&
            kvedge_master_reserve(m, m->seq + 1, why, sizeof why) != KVEDGE_OK) {
            kvedge_log_warn("cannot lead again yet: %s", why);
        } else {
            m->term = r.kvs[0].create_rev;
            s_set_role(m, S_ROLE_LEADER);
            kvedge_master_hugz(m);
        }
    } else if (r.n_kvs == 1) {
        kvedge_master_desc_t l;
        if (s_peer_parse(r.kvs[0].value, r.kvs[0].value_len, &l))
            s_follow(m, &l);
        else
            kvedge_log_warn("etcd: the leader key %s is not a master's description", lk);
    }
    kvedge_etcd_reply_free(&r);
}

void kvedge_master_not_leader(kvedge_master_state_t *m, zframe_t *route, const kvedge_kvmsg_t *k)
{
    char reason[KVEDGE_KVMSG_MAX_REASON_BYTES + 1];
    if (m->role == S_ROLE_READONLY)
        snprintf(reason, sizeof reason, "no etcd quorum");
    else if (m->leader.id[0] &&
             strlen(m->leader.router) + strlen(m->leader.pub) + 8 < sizeof reason)
        snprintf(reason, sizeof reason, "leader %.123s %.123s", m->leader.router, m->leader.pub);
    else
        snprintf(reason, sizeof reason, "no leader");
    kvedge_master_reply_err(m, route, k, KVEDGE_ENOTLEADER, reason);
}

static cJSON *s_peer_json(const kvedge_master_desc_t *p, const char *role)
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

static cJSON *s_etcd_json(kvedge_master_state_t *m)
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
void kvedge_master_status_reply(kvedge_master_state_t *m, zframe_t *route, const kvedge_kvmsg_t *k)
{
    cJSON *o = cJSON_CreateObject();
    char reg[17];
    snprintf(reg, sizeof reg, "%016llx", (unsigned long long)m->registry);
    uint64_t seq = m->role == S_ROLE_STANDBY && m->view ? kvedge_mview_seq(m->view) : m->seq;
    bool leads = m->role == S_ROLE_LEADER || m->role == S_ROLE_SINGLE;
    if (o) {
        cJSON_AddStringToObject(o, "id", m->etcd ? m->id : "single");
        cJSON_AddStringToObject(o, "role", kvedge_master_role_names[m->role]);
        cJSON_AddStringToObject(o, "router", m->owner->endpoint);
        cJSON_AddStringToObject(o, "pub", m->owner->pub_endpoint);
        kvedge_master_desc_t self = {0};
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
            const kvedge_master_desc_t *p = &m->masters[i];
            bool is_leader = m->leader.id[0] && strcmp(p->id, m->leader.id) == 0;
            bool me = strcmp(p->id, m->id) == 0;
            cJSON_AddItemToArray(ms, s_peer_json(p, me          ? kvedge_master_role_names[m->role]
                                                    : is_leader ? "leader"
                                                                : "standby"));
        }
        cJSON_AddNumberToObject(o, "leader_changes", (double)m->leader_changes);
    }
    char *doc = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!doc || strlen(doc) > KVEDGE_MASTER_STATUS_MAX) {
        free(doc);
        kvedge_master_reply_err(m, route, k, KVEDGE_ENOMEM, "cannot build the status document");
        return;
    }
    kvedge_kvmsg_t ok = {.cmd = KVEDGE_KVMSG_OK,
                         .key = (const uint8_t *)KVEDGE_KVMSG_STATUS_KEY,
                         .key_len = strlen(KVEDGE_KVMSG_STATUS_KEY),
                         .seq = seq,
                         .body = (const uint8_t *)doc,
                         .body_len = strlen(doc),
                         .rid = k->rid};
    kvedge_master_reply(m, route, &ok);
    free(doc);
}

/* An id from the ROUTER endpoint: "tcp://10.0.0.5:7410" -> "10.0.0.5:7410". */
void kvedge_master_default_id(const char *ep, char *out, size_t cap)
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
static int s_meta(kvedge_master_state_t *m, char *why, size_t why_len)
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
int kvedge_master_etcd_open(kvedge_master_state_t *m, char *why, size_t why_len)
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
void kvedge_master_etcd_close(kvedge_master_state_t *m)
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
