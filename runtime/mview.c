/* The replica view: one actor owns a SUB to the master's PUB and a DEALER to its ROUTER and
 * keeps a table of the registry that any thread may read under a mutex.
 *
 * Sync (the zguide Clone client): subscribe, ask for a snapshot (ICANHAZ), buffer what the
 * PUB says meanwhile, and when KTHXBAI gives the snapshot's seq S, apply the buffered updates
 * after S in order. From then on, update S+1 follows S; anything else, or a HUGZ whose seq is
 * not ours, means something was missed: re-sync. A master silent for dead_ms gets new sockets
 * and a re-sync. The snapshot replaces the served state only when complete, so readers always
 * see one consistent state, the last one known.
 *
 * A handshake the master refuses (ZAP: our key is not in its allowlist) ends that connection
 * for good in libzmq (no reconnect), so a monitor on the DEALER watches for it, and sockets that
 * have not heard the master are replaced with a backoff: the view recovers by itself once the
 * master lets it in, and kvedge_mview_conn says why it is not synced meanwhile.
 *
 * A list of masters (one cluster on etcd: one leader, standbys): the view follows one at a time.
 * A standby's PUB is silent, so the snapshot is asked for after a short probe time even when the
 * PUB said nothing; a master's ENOTLEADER answer that names the leader ("leader R P") moves the
 * view there at once, one that names none ("no leader") moves it to the next entry after a
 * backoff, and silence moves it to the next entry (round robin). Every move keeps the served
 * state (STALE) and re-syncs once. */
#include "runtime/mview.h"

#include <czmq.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "access/transport.h"
#include "access/codec/byteorder.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"
#include "access/codec/why.h"
#include "runtime/settings.h"

#define S_WAIT_MARGIN_MS  250 /* a caller of set waits this long past its deadline */
#define S_PIPE_QUEUED_MAX 512 /* requests in the pipe before calls fail with EBUSY */
#define S_SEND_RETRY_MS   25  /* ICANHAZ again after a send found no connection */
#define S_TICK_MS         50  /* the actor's longest sleep */
#define S_DRAIN_MAX       1024
#define S_FILE_MAGIC      "KVMV"
#define S_FILE_HEAD_BYTES 32
#define S_FILE_SUM_BYTES  8

/* ---------------------------------------------------------------- clocks */

/* ---------------------------------------------------------------- the table */

typedef struct {
    uint64_t seq;
    size_t len;
    uint8_t body[];
} s_entry_t;

typedef struct {
    zhashx_t *h;    /* key -> s_entry_t (owned) */
    uint64_t bytes; /* keys + bodies */
} s_table_t;

static void s_entry_free(void **item)
{
    free(*item);
    *item = NULL;
}

static int s_table_init(s_table_t *t)
{
    t->bytes = 0;
    t->h = zhashx_new();
    if (!t->h)
        return KVEDGE_ENOMEM;
    zhashx_set_destructor(t->h, s_entry_free);
    return KVEDGE_OK;
}

static void s_table_free(s_table_t *t)
{
    zhashx_destroy(&t->h);
    t->bytes = 0;
}

/* Puts (len > 0) or deletes (len 0) a record, within the registry limits. */
static int s_table_put(s_table_t *t, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    size_t klen = strlen(key);
    s_entry_t *old = zhashx_lookup(t->h, key);
    uint64_t bytes = t->bytes - (old ? klen + old->len : 0);
    if (len == 0) {
        if (old)
            zhashx_delete(t->h, key);
        t->bytes = bytes;
        return KVEDGE_OK;
    }
    if ((!old && zhashx_size(t->h) >= KVEDGE_MASTER_MAX_RECORDS) ||
        bytes + klen + len > KVEDGE_MASTER_MAX_TOTAL_BYTES)
        return KVEDGE_EFULL;
    s_entry_t *e = malloc(sizeof *e + len);
    if (!e)
        return KVEDGE_ENOMEM;
    e->seq = seq;
    e->len = len;
    memcpy(e->body, body, len);
    zhashx_update(t->h, key, e);
    t->bytes = bytes + klen + len;
    return KVEDGE_OK;
}

static bool s_has_prefix(const char *key, size_t klen, const char *prefix, size_t plen)
{
    return klen >= plen && memcmp(key, prefix, plen) == 0;
}

/* ---------------------------------------------------------------- shared state */

typedef struct s_io_t s_io_t;

struct kvedge_mview_t {
    pthread_mutex_t mu; /* guards everything below up to `actor` */
    pthread_cond_t cv;  /* broadcast on every change of seq or state */
    s_table_t table;
    uint64_t seq;
    uint64_t notified; /* seq whose on_change calls have all run (what wait waits for) */
    uint64_t registry;
    kvedge_mview_state_t state;
    kvedge_mview_stats_t stats;
    kvedge_mview_conn_t conn; /* the connection's state, for kvedge_mview_conn */
    uint64_t version; /* bumped on every change: the snapshot file is behind when it differs */
    zactor_t *actor;
    s_io_t *io;
    pthread_mutex_t pipe_mu; /* zsock pipes are not thread-safe */
    bool closing;            /* destroy has begun (under pipe_mu) */
    atomic_int queued;       /* requests in the pipe, not yet taken */
};

/* A SET in flight: the caller waits on it, the actor completes it; the last to let go frees. */
typedef struct {
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    size_t klen;
    uint8_t *body;
    size_t len;
    int64_t deadline; /* absolute, monotonic ms */
    uint64_t rid;     /* actor only from here */
    bool sent;
    bool acked;       /* OK came; waiting for the view to apply acked_seq */
    bool notleader;   /* a master answered ENOTLEADER: at the deadline that is the answer */
    int64_t retry_at; /* not sent again before (a master that knew no leader) */
    uint64_t acked_seq;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int status;
    bool done;
    int refs;
} s_set_t;

/* A buffered PUB update (during a snapshot). */
typedef struct {
    uint64_t seq;
    size_t len;
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    uint8_t body[];
} s_update_t;

/* The actor's state; only the actor thread touches it after start. */
struct s_io_t {
    kvedge_mview_t *v;
    char *master, *pub;     /* the master followed now: an entry of the list, or a named leader */
    char **masters, **pubs; /* the list given, n_eps entries each */
    size_t n_eps, ep_idx;   /* ep_idx: the entry followed last */
    int64_t probe_at;       /* a snapshot is asked for then even if the PUB said nothing */
    int64_t next_at;        /* the next entry of the list then ("no leader"); 0 = none */
    char *prefix, *path, *hb_id;
    size_t prefix_len;
    bool curve;
    char server_pub[KVEDGE_MASTER_KEY_Z85_BYTES + 1];
    zcert_t *cert;
    uint32_t hb_ms, dead_ms, save_ms;
    kvedge_mview_change_fn on_change;
    void *ctx;
    zsock_t *dealer, *sub;
    zsock_t *mon;         /* PAIR: the DEALER's handshake events */
    uint32_t mon_gen;     /* makes each monitor's endpoint unique */
    int64_t reconnect_at; /* new sockets then unless the master was heard; 0 = none due */
    uint32_t retry_ms;    /* the current backoff of new sockets */
    bool rebuild;         /* sockets were replaced: the poller must be too */
    bool subscribed;      /* the SUB has heard the master since it connected: no update is lost
                           * between a snapshot and the stream after it */
    uint64_t next_rid;
    /* The snapshot in flight. */
    bool syncing;
    uint64_t snap_rid;
    int64_t snap_deadline;
    s_table_t fresh;
    uint32_t fresh_count;
    zlistx_t *buffer; /* s_update_t, in arrival order */
    /* Timers (monotonic ms). */
    int64_t next_sync, last_heard, next_save, next_hb;
    uint64_t saved_version;
    zlistx_t *sets; /* s_set_t in flight */
    int start_rc;
};

const char *kvedge_mview_state_name(int state)
{
    switch (state) {
    case KVEDGE_MVIEW_EMPTY:
        return "empty";
    case KVEDGE_MVIEW_STALE:
        return "stale";
    case KVEDGE_MVIEW_SYNCED:
        return "synced";
    default:
        return "?";
    }
}

static void s_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

static struct timespec s_abs(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000};
    return ts;
}

/* ---------------------------------------------------------------- snapshot file */

/* File: magic "KVMV" | u32 version | u64 seq | u64 registry | u32 count | u32 prefix length |
 * prefix | count x (u8 key length | key | u64 seq | u32 body length | body), keys strictly
 * ascending | u64 XXH3-64 of everything before it. All little-endian. */

typedef struct {
    const char *key;
    const s_entry_t *e;
} s_pair_t;

static int s_pair_cmp(const void *a, const void *b)
{
    return strcmp(((const s_pair_t *)a)->key, ((const s_pair_t *)b)->key);
}

/* The table's entries under prefix, sorted by key; pointers into the table (hold its lock).
 * Returns NULL with *n 0 for none, NULL with *n SIZE_MAX when out of memory. */
static s_pair_t *s_sorted(const s_table_t *t, const char *prefix, size_t *n)
{
    size_t plen = strlen(prefix), cap = zhashx_size(t->h), k = 0;
    *n = 0;
    if (cap == 0)
        return NULL;
    s_pair_t *p = malloc(cap * sizeof *p);
    if (!p) {
        *n = SIZE_MAX;
        return NULL;
    }
    for (s_entry_t *e = zhashx_first(t->h); e; e = zhashx_next(t->h)) {
        const char *key = zhashx_cursor(t->h);
        if (s_has_prefix(key, strlen(key), prefix, plen))
            p[k++] = (s_pair_t){key, e};
    }
    qsort(p, k, sizeof *p, s_pair_cmp);
    *n = k;
    return p;
}

/* Serializes the served state (under the lock) and writes it to path.tmp, fsync, rename. */
static int s_save(s_io_t *io)
{
    kvedge_mview_t *v = io->v;
    pthread_mutex_lock(&v->mu);
    if (v->state == KVEDGE_MVIEW_EMPTY) {
        pthread_mutex_unlock(&v->mu);
        return KVEDGE_OK;
    }
    size_t n;
    s_pair_t *p = s_sorted(&v->table, "", &n);
    if (n == SIZE_MAX) {
        pthread_mutex_unlock(&v->mu);
        return KVEDGE_ENOMEM;
    }
    size_t size = S_FILE_HEAD_BYTES + io->prefix_len + S_FILE_SUM_BYTES;
    for (size_t i = 0; i < n; i++)
        size += 1 + strlen(p[i].key) + 8 + 4 + p[i].e->len;
    uint8_t *buf = malloc(size);
    if (!buf) {
        free(p);
        pthread_mutex_unlock(&v->mu);
        return KVEDGE_ENOMEM;
    }
    memcpy(buf, S_FILE_MAGIC, 4);
    kvedge_le_put32(buf + 4, KVEDGE_MVIEW_FILE_VERSION);
    kvedge_le_put64(buf + 8, v->seq);
    kvedge_le_put64(buf + 16, v->registry);
    kvedge_le_put32(buf + 24, (uint32_t)n);
    kvedge_le_put32(buf + 28, (uint32_t)io->prefix_len);
    uint8_t *w = buf + S_FILE_HEAD_BYTES;
    memcpy(w, io->prefix, io->prefix_len);
    w += io->prefix_len;
    for (size_t i = 0; i < n; i++) {
        size_t kl = strlen(p[i].key);
        *w++ = (uint8_t)kl;
        memcpy(w, p[i].key, kl);
        w += kl;
        kvedge_le_put64(w, p[i].e->seq);
        kvedge_le_put32(w + 8, (uint32_t)p[i].e->len);
        memcpy(w + 12, p[i].e->body, p[i].e->len);
        w += 12 + p[i].e->len;
    }
    uint64_t version = v->version;
    pthread_mutex_unlock(&v->mu);
    free(p);
    kvedge_le_put64(w, XXH3_64bits(buf, (size_t)(w - buf)));

    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", io->path);
    int rc = KVEDGE_EIO;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
        size_t off = 0;
        while (off < size) {
            ssize_t k = write(fd, buf + off, size - off);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                break;
            off += (size_t)k;
        }
        bool ok = off == size && fsync(fd) == 0;
        ok = close(fd) == 0 && ok;
        if (ok && rename(tmp, io->path) == 0)
            rc = KVEDGE_OK;
        else
            unlink(tmp);
    }
    free(buf);
    if (rc == KVEDGE_OK)
        io->saved_version = version;
    return rc;
}

/* Reads and checks a snapshot file written for the same prefix. Every length is checked
 * against the bytes left before use. Returns 0 with t filled, or an error (file ignored). */
static int s_load(const char *path, const char *prefix, size_t plen, s_table_t *t, uint64_t *seq,
                  uint64_t *registry)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return KVEDGE_ENOTFOUND;
    struct stat st;
    uint64_t max = S_FILE_HEAD_BYTES + KVEDGE_KVMSG_MAX_KEY_BYTES + S_FILE_SUM_BYTES +
                   (uint64_t)KVEDGE_MASTER_MAX_RECORDS * 13 + KVEDGE_MASTER_MAX_TOTAL_BYTES;
    if (fstat(fd, &st) != 0 || st.st_size < S_FILE_HEAD_BYTES + S_FILE_SUM_BYTES ||
        (uint64_t)st.st_size > max) {
        close(fd);
        return KVEDGE_ECORRUPT;
    }
    size_t size = (size_t)st.st_size, off = 0;
    uint8_t *buf = malloc(size);
    while (buf && off < size) {
        ssize_t k = read(fd, buf + off, size - off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        off += (size_t)k;
    }
    close(fd);
    int rc = KVEDGE_ECORRUPT;
    if (!buf || off != size)
        goto out;
    size_t end = size - S_FILE_SUM_BYTES;
    if (memcmp(buf, S_FILE_MAGIC, 4) != 0 || XXH3_64bits(buf, end) != kvedge_le_get64(buf + end))
        goto out;
    if (kvedge_le_get32(buf + 4) != KVEDGE_MVIEW_FILE_VERSION) {
        rc = KVEDGE_EVERSION;
        goto out;
    }
    uint32_t count = kvedge_le_get32(buf + 24), fpl = kvedge_le_get32(buf + 28);
    size_t pos = S_FILE_HEAD_BYTES;
    if (count > KVEDGE_MASTER_MAX_RECORDS || fpl != plen || end - pos < fpl ||
        (plen && memcmp(buf + pos, prefix, plen) != 0)) {
        rc = KVEDGE_EINVAL; /* another view's file, or damaged */
        goto out;
    }
    pos += fpl;
    if (s_table_init(t) != KVEDGE_OK) {
        rc = KVEDGE_ENOMEM;
        goto out;
    }
    char prev[KVEDGE_KVMSG_MAX_KEY_BYTES + 1] = "";
    for (uint32_t i = 0; i < count; i++) {
        if (end - pos < 1)
            goto bad;
        size_t kl = buf[pos++];
        if (end - pos < kl + 12 || !kvedge_kvmsg_key_ok(buf + pos, kl))
            goto bad;
        char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
        memcpy(key, buf + pos, kl);
        key[kl] = '\0';
        pos += kl;
        uint64_t rseq = kvedge_le_get64(buf + pos);
        size_t bl = kvedge_le_get32(buf + pos + 8);
        pos += 12;
        if (bl == 0 || bl > KVEDGE_KVMSG_MAX_BODY_BYTES || end - pos < bl || rseq == 0 ||
            (i > 0 && strcmp(prev, key) >= 0) || !s_has_prefix(key, kl, prefix, plen))
            goto bad;
        if (s_table_put(t, key, rseq, buf + pos, bl) != KVEDGE_OK)
            goto bad;
        pos += bl;
        memcpy(prev, key, kl + 1);
    }
    if (pos != end)
        goto bad;
    *seq = kvedge_le_get64(buf + 8);
    *registry = kvedge_le_get64(buf + 16);
    rc = KVEDGE_OK;
    goto out;
bad:
    s_table_free(t);
    rc = KVEDGE_ECORRUPT;
out:
    free(buf);
    return rc;
}

/* ---------------------------------------------------------------- sets */

static void s_set_release(s_set_t *r)
{
    pthread_mutex_lock(&r->mu);
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last) {
        free(r->body);
        pthread_cond_destroy(&r->cv);
        pthread_mutex_destroy(&r->mu);
        free(r);
    }
}

static void s_set_complete(s_set_t *r, int status)
{
    pthread_mutex_lock(&r->mu);
    r->status = status;
    r->done = true;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    s_set_release(r);
}

/* ---------------------------------------------------------------- sockets */

static void s_close(s_io_t *io)
{
    if (io->dealer && io->mon)
        zmq_socket_monitor(zsock_resolve(io->dealer), NULL, 0);
    zsock_destroy(&io->dealer);
    zsock_destroy(&io->sub);
    zsock_destroy(&io->mon);
    io->rebuild = true;
    io->subscribed = false;
}

/* Watches the DEALER's handshakes: a refusal (ZAP status 400 from the master) is otherwise
 * silent, and final for that connection. Best effort: without a monitor the backoff of
 * s_timers still replaces the sockets. */
static void s_monitor(s_io_t *io)
{
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://kvedge-mview-mon-%p-%u", (void *)io, ++io->mon_gen);
    if (zmq_socket_monitor(zsock_resolve(io->dealer), ep,
                           ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_SUCCEEDED) != 0)
        return;
    io->mon = zsock_new(ZMQ_PAIR);
    if (io->mon && zsock_connect(io->mon, "%s", ep) != 0) {
        zmq_socket_monitor(zsock_resolve(io->dealer), NULL, 0);
        zsock_destroy(&io->mon);
    }
}

static void s_sock_common(s_io_t *io, zsock_t *s)
{
    zsock_set_linger(s, 0);
    zsock_set_maxmsgsize(s, (int64_t)KVEDGE_KVMSG_MAX_FRAME_BYTES);
    zsock_set_heartbeat_ivl(s, KVEDGE_HEARTBEAT_IVL_MS);
    zsock_set_heartbeat_timeout(s, KVEDGE_HEARTBEAT_TIMEOUT_MS);
    if (io->curve) {
        zcert_apply(io->cert, s);
        zsock_set_curve_serverkey(s, io->server_pub);
    }
}

/* New sockets: SUB first (subscribed to everything: seq gaps are only visible on the whole
 * stream), then the DEALER, which queues only to a completed connection, so a request to an
 * unreachable master fails at once instead of waiting to burst out later. */
static int s_connect(s_io_t *io)
{
    s_close(io);
    io->sub = zsock_new(ZMQ_SUB);
    io->dealer = zsock_new(ZMQ_DEALER);
    if (!io->sub || !io->dealer)
        return KVEDGE_ENOMEM;
    s_sock_common(io, io->sub);
    zsock_set_rcvhwm(io->sub, KVEDGE_MVIEW_SUB_HWM);
    zsock_set_subscribe(io->sub, "");
    s_sock_common(io, io->dealer);
    zsock_set_immediate(io->dealer, 1);
    zsock_set_sndtimeo(io->dealer, 0);
    s_monitor(io); /* refusals (CURVE) and a master of another mechanism (either way) */
    /* Sockets that hear nothing for this long are replaced (s_timers). */
    uint32_t wait = io->dead_ms > io->retry_ms ? io->dead_ms : io->retry_ms;
    int64_t now = kvedge_mono_ms();
    io->reconnect_at = now + wait;
    /* A standby's PUB is silent: ask for a snapshot anyway after the probe time (one master:
     * half of dead_ms, which a master that publishes never reaches, HUGZ being more frequent). */
    io->probe_at = now + (io->n_eps > 1 ? KVEDGE_MVIEW_PROBE_MS : io->dead_ms / 2);
    pthread_mutex_lock(&io->v->mu);
    io->v->conn.heard = false;
    io->v->conn.retry_ms = io->retry_ms;
    pthread_mutex_unlock(&io->v->mu);
    if (zsock_connect(io->sub, "%s", io->pub) != 0 ||
        zsock_connect(io->dealer, "%s", io->master) != 0)
        return KVEDGE_EINVAL;
    return KVEDGE_OK;
}

/* One event of the DEALER's monitor: [u16 event | u32 value] (host order), endpoint. */
static void s_on_mon(s_io_t *io)
{
    zmsg_t *m = zmsg_recv(io->mon);
    zframe_t *f = m ? zmsg_first(m) : NULL;
    if (f && zframe_size(f) == 6) {
        uint16_t event;
        memcpy(&event, zframe_data(f), sizeof event);
        kvedge_mview_t *v = io->v;
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
            /* This connection is over; new sockets after the current backoff. */
            int64_t at = kvedge_mono_ms() + io->retry_ms;
            if (!io->subscribed && (io->reconnect_at == 0 || at < io->reconnect_at))
                io->reconnect_at = at;
            pthread_mutex_lock(&v->mu);
            v->conn.refused = true;
            v->conn.refusals++;
            pthread_cond_broadcast(&v->cv);
            pthread_mutex_unlock(&v->mu);
        } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
            uint32_t value;
            memcpy(&value, zframe_data(f) + sizeof event, sizeof value);
            if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
                pthread_mutex_lock(&v->mu);
                v->conn.mismatch = true;
                pthread_mutex_unlock(&v->mu);
            }
        } else if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            pthread_mutex_lock(&v->mu);
            v->conn.refused = false;
            v->conn.mismatch = false;
            pthread_mutex_unlock(&v->mu);
        }
    }
    zmsg_destroy(&m);
}

/* Sends a request on the DEALER without waiting. False when there is no connection. */
static bool s_send(s_io_t *io, const kvedge_kvmsg_t *k)
{
    kvedge_kvmsg_buf_t buf;
    kvedge_wire_frame_t f[KVEDGE_KVMSG_MAX_FRAMES];
    size_t n;
    if (!io->dealer || kvedge_kvmsg_pack(k, &buf, f, &n) != KVEDGE_OK)
        return false;
    zmsg_t *m = zmsg_new();
    for (size_t i = 0; m && i < n; i++)
        zmsg_addmem(m, f[i].data, f[i].len);
    if (!m || zmsg_send(&m, io->dealer) != 0) {
        zmsg_destroy(&m);
        return false;
    }
    return true;
}

/* Receives one message, keeping at most max parts (the rest are read and dropped). */
static size_t s_recv_bounded(zsock_t *sock, zframe_t **parts, size_t max)
{
    size_t n = 0;
    do {
        zframe_t *f = zframe_recv(sock);
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

/* ---------------------------------------------------------------- sync */

static void s_bad(s_io_t *io)
{
    pthread_mutex_lock(&io->v->mu);
    io->v->stats.bad++;
    pthread_mutex_unlock(&io->v->mu);
}

/* The callbacks up to seq have run: wake the waiters. */
static void s_notified(s_io_t *io, uint64_t seq)
{
    pthread_mutex_lock(&io->v->mu);
    io->v->notified = seq;
    pthread_cond_broadcast(&io->v->cv);
    pthread_mutex_unlock(&io->v->mu);
}

static void s_buffer_clear(s_io_t *io)
{
    s_update_t *u;
    while ((u = zlistx_detach(io->buffer, NULL)) != NULL)
        free(u);
}

static void s_sync_abort(s_io_t *io)
{
    io->syncing = false;
    s_table_free(&io->fresh);
    s_buffer_clear(io);
}

/* Asks for a snapshot; probe: also when the SUB has heard nothing yet (a standby's PUB is
 * silent; a KVPUB past the snapshot or a HUGZ that differs re-syncs once the PUB speaks). */
static void s_sync_start(s_io_t *io, bool probe)
{
    int64_t now = kvedge_mono_ms();
    if (io->syncing)
        s_sync_abort(io);
    if (!io->dealer && s_connect(io) != KVEDGE_OK)
        s_close(io);
    if (!io->subscribed && !probe) {
        io->next_sync = now; /* the first message on the SUB starts the sync */
        return;
    }
    uint64_t rid = ++io->next_rid;
    kvedge_kvmsg_t k = {.cmd = KVEDGE_KVMSG_ICANHAZ,
                        .key = (const uint8_t *)io->prefix,
                        .key_len = io->prefix_len,
                        .rid = rid};
    if (s_table_init(&io->fresh) != KVEDGE_OK || !s_send(io, &k)) {
        s_table_free(&io->fresh);
        io->next_sync = now + S_SEND_RETRY_MS;
        if (probe)
            io->probe_at = now + S_SEND_RETRY_MS; /* not connected yet */
        return;
    }
    io->syncing = true;
    io->snap_rid = rid;
    io->snap_deadline = now + KVEDGE_MVIEW_SNAPSHOT_MS;
    io->fresh_count = 0;
}

static void s_sync_begin(s_io_t *io)
{
    s_sync_start(io, false);
}

typedef enum {
    S_WHY_GAP,   /* a missed update */
    S_WHY_DEATH, /* a silent master */
    S_WHY_MOVE,  /* another master: counted in conn.moves */
} s_why_t;

/* The served state is no longer the master's: say so and start over. */
static void s_resync_why(s_io_t *io, s_why_t why, bool reconnect)
{
    kvedge_mview_t *v = io->v;
    pthread_mutex_lock(&v->mu);
    if (why == S_WHY_GAP)
        v->stats.gaps++;
    else if (why == S_WHY_DEATH)
        v->stats.deaths++;
    if (v->state == KVEDGE_MVIEW_SYNCED)
        v->state = KVEDGE_MVIEW_STALE;
    pthread_cond_broadcast(&v->cv);
    pthread_mutex_unlock(&v->mu);
    if (io->syncing)
        s_sync_abort(io);
    if (reconnect && s_connect(io) != KVEDGE_OK)
        s_close(io);
    s_sync_begin(io);
}

static void s_resync(s_io_t *io, bool gap, bool reconnect)
{
    s_resync_why(io, gap ? S_WHY_GAP : S_WHY_DEATH, reconnect);
}

/* More than the one master given: a list, or a leader a master named. */
static bool s_following(const s_io_t *io)
{
    return io->n_eps > 1 || strcmp(io->master, io->masters[0]) != 0 ||
           strcmp(io->pub, io->pubs[0]) != 0;
}

/* Follows another master: new sockets to it and a re-sync; the served state stays (STALE).
 * SETs sent to the previous master and not answered are sent again (SET is idempotent). */
static void s_follow(s_io_t *io, const char *router, const char *pub, s_why_t why, bool redirect)
{
    kvedge_mview_t *v = io->v;
    if (strcmp(router, io->master) != 0 || strcmp(pub, io->pub) != 0) {
        char *m = strdup(router), *p = strdup(pub);
        if (m && p) {
            free(io->master);
            free(io->pub);
            io->master = m;
            io->pub = p;
            for (size_t i = 0; i < io->n_eps; i++)
                if (strcmp(router, io->masters[i]) == 0)
                    io->ep_idx = i;
            for (s_set_t *r = zlistx_first(io->sets); r; r = zlistx_next(io->sets))
                if (r->sent && !r->acked)
                    r->sent = false;
            pthread_mutex_lock(&v->mu);
            v->conn.moves++;
            if (redirect)
                v->conn.redirects++;
            snprintf(v->conn.endpoint, sizeof v->conn.endpoint, "%s", io->master);
            snprintf(v->conn.pub, sizeof v->conn.pub, "%s", io->pub);
            pthread_mutex_unlock(&v->mu);
        } else {
            free(m);
            free(p); /* out of memory: new sockets to the same master */
        }
    }
    io->next_at = 0;
    s_resync_why(io, why, true);
}

/* The next entry of the list (round robin). */
static void s_follow_next(s_io_t *io, s_why_t why)
{
    size_t i = (io->ep_idx + 1) % io->n_eps;
    if (strcmp(io->master, io->masters[io->ep_idx]) != 0)
        i = io->ep_idx; /* following a named leader: back to the list where we left it */
    io->ep_idx = i;
    s_follow(io, io->masters[i], io->pubs[i], why, false);
}

/* "leader <ROUTER> <PUB>": the leader a master named, when this view may follow it (a valid
 * endpoint; plaintext only to loopback). */
static bool s_hint(const s_io_t *io, const uint8_t *b, size_t len, char *router, char *pub)
{
    char text[KVEDGE_KVMSG_MAX_REASON_BYTES + 1], extra;
    if (!b || len == 0 || len > KVEDGE_KVMSG_MAX_REASON_BYTES)
        return false;
    memcpy(text, b, len);
    text[len] = '\0';
    if (strncmp(text, "leader ", 7) != 0 ||
        sscanf(text + 7, "%255s %255s %c", router, pub, &extra) != 2)
        return false;
    if (!strstr(router, "://") || !strstr(pub, "://"))
        return false;
    return io->curve || (kvedge_endpoint_is_loopback(router) && kvedge_endpoint_is_loopback(pub));
}

static void s_set_send(s_io_t *io, s_set_t *r);

/* One pass over the sets in flight: completes those the view has applied (read your writes;
 * at once when the view is neither synced nor syncing), and those past their deadline; sends
 * those that found no connection yet. Rotates the list, so the order is kept. */
static void s_sets_sweep(s_io_t *io)
{
    kvedge_mview_t *v = io->v;
    bool synced = v->state == KVEDGE_MVIEW_SYNCED && !io->syncing;
    bool catching_up = synced || io->syncing;
    int64_t now = kvedge_mono_ms();
    for (size_t i = 0, n = zlistx_size(io->sets); i < n; i++) {
        s_set_t *r = zlistx_detach(io->sets, NULL);
        if (!r)
            break;
        if (r->acked && (!catching_up || (synced && r->acked_seq <= v->seq))) {
            s_set_complete(r, KVEDGE_OK);
        } else if (now >= r->deadline) {
            s_set_complete(r, r->acked       ? KVEDGE_OK
                              : r->notleader ? KVEDGE_ENOTLEADER
                                             : KVEDGE_ETIMEDOUT);
        } else {
            s_set_send(io, r);
            if (!zlistx_add_end(io->sets, r))
                s_set_complete(r, KVEDGE_ENOMEM);
        }
    }
}

static void s_sync_finish(s_io_t *io, const kvedge_kvmsg_t *k)
{
    kvedge_mview_t *v = io->v;
    if (k->count != io->fresh_count) {
        s_bad(io); /* KVSYNCs were lost on the way: ask again */
        s_sync_begin(io);
        return;
    }
    uint64_t seq = k->seq;
    for (s_update_t *u = zlistx_first(io->buffer); u; u = zlistx_next(io->buffer)) {
        if (u->seq <= seq)
            continue;
        if (u->seq != seq + 1) {
            s_resync(io, true, false);
            return;
        }
        if (s_has_prefix(u->key, strlen(u->key), io->prefix, io->prefix_len) &&
            s_table_put(&io->fresh, u->key, u->seq, u->body, u->len) != KVEDGE_OK) {
            s_resync(io, true, false);
            return;
        }
        seq = u->seq;
    }
    pthread_mutex_lock(&v->mu);
    s_table_t old = v->table;
    v->table = io->fresh;
    v->seq = seq;
    v->registry = k->registry;
    v->state = KVEDGE_MVIEW_SYNCED;
    v->stats.syncs++;
    v->version++;
    v->conn.refused = false;
    v->conn.mismatch = false;
    v->conn.retry_ms = KVEDGE_MVIEW_RECONNECT_MIN_MS;
    pthread_cond_broadcast(&v->cv);
    pthread_mutex_unlock(&v->mu);
    s_table_free(&old);
    io->fresh.h = NULL;
    io->syncing = false;
    s_buffer_clear(io);
    io->last_heard = kvedge_mono_ms();
    io->retry_ms = KVEDGE_MVIEW_RECONNECT_MIN_MS;
    if (!io->subscribed) /* a probe's snapshot: the PUB gets dead_ms from now to speak */
        io->reconnect_at = io->last_heard + io->dead_ms;
    if (io->on_change)
        io->on_change(io->ctx, NULL, seq, NULL, 0);
    s_notified(io, seq);
    s_sets_sweep(io);
    if (io->path)
        s_save(io);
}

/* A PUB update while synced: the next seq is applied, an old one ignored, a later one is a
 * gap. */
static void s_update(s_io_t *io, const kvedge_kvmsg_t *k)
{
    kvedge_mview_t *v = io->v;
    uint64_t cur = v->seq; /* the actor is the only writer */
    if (k->seq <= cur)
        return;
    if (k->seq != cur + 1) {
        s_resync(io, true, false);
        return;
    }
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    memcpy(key, k->key, k->key_len);
    key[k->key_len] = '\0';
    bool mine = s_has_prefix(key, k->key_len, io->prefix, io->prefix_len);
    pthread_mutex_lock(&v->mu);
    int rc = mine ? s_table_put(&v->table, key, k->seq, k->body, k->body_len) : KVEDGE_OK;
    if (rc == KVEDGE_OK) {
        v->seq = k->seq;
        v->version++;
        pthread_cond_broadcast(&v->cv);
    }
    pthread_mutex_unlock(&v->mu);
    if (rc != KVEDGE_OK) {
        s_resync(io, true, false);
        return;
    }
    if (mine && io->on_change)
        io->on_change(io->ctx, key, k->seq, k->body_len ? k->body : NULL, k->body_len);
    s_notified(io, k->seq);
    s_sets_sweep(io);
}

static void s_on_sub(s_io_t *io)
{
    zframe_t *parts[KVEDGE_KVMSG_MAX_FRAMES] = {NULL};
    size_t n = s_recv_bounded(io->sub, parts, KVEDGE_KVMSG_MAX_FRAMES);
    kvedge_wire_frame_t f[KVEDGE_KVMSG_MAX_FRAMES];
    for (size_t i = 0; i < n && i < KVEDGE_KVMSG_MAX_FRAMES; i++)
        f[i] = (kvedge_wire_frame_t){zframe_data(parts[i]), zframe_size(parts[i])};
    kvedge_kvmsg_t k;
    kvedge_mview_t *v = io->v;
    if (n == 0 || n > KVEDGE_KVMSG_MAX_FRAMES || kvedge_kvmsg_parse(f, n, &k) != KVEDGE_OK ||
        !kvedge_kvmsg_is_pub(k.cmd)) {
        s_bad(io);
    } else {
        io->last_heard = kvedge_mono_ms();
        if (!io->subscribed) {
            io->reconnect_at = 0; /* heard: from now on dead_ms and the snapshot deadline */
            pthread_mutex_lock(&v->mu);
            v->conn.heard = true;
            v->conn.refused = false;
            v->conn.mismatch = false;
            pthread_mutex_unlock(&v->mu);
        }
        io->subscribed = true;
        if (io->syncing) {
            if (k.cmd == KVEDGE_KVMSG_KVPUB) {
                s_update_t *u = zlistx_size(io->buffer) < KVEDGE_MVIEW_BUFFER_MAX
                                    ? malloc(sizeof *u + k.body_len)
                                    : NULL;
                if (u) {
                    u->seq = k.seq;
                    u->len = k.body_len;
                    memcpy(u->key, k.key, k.key_len);
                    u->key[k.key_len] = '\0';
                    if (k.body_len)
                        memcpy(u->body, k.body, k.body_len);
                }
                if (!u || !zlistx_add_end(io->buffer, u)) {
                    free(u);
                    s_sync_abort(io); /* too much while we wait: try again shortly */
                    io->next_sync = io->last_heard + KVEDGE_MVIEW_RETRY_MS;
                }
            }
        } else if (v->state == KVEDGE_MVIEW_SYNCED) {
            if (k.cmd == KVEDGE_KVMSG_KVPUB)
                s_update(io, &k);
            else if (k.seq != v->seq || k.registry != v->registry)
                s_resync(io, true, false); /* missed updates, or another registry */
        } else if (io->next_sync > io->last_heard) {
            io->next_sync = io->last_heard; /* the master is back: sync now */
        }
    }
    for (size_t i = 0; i < n && i < KVEDGE_KVMSG_MAX_FRAMES; i++)
        zframe_destroy(&parts[i]);
}

static s_set_t *s_set_find(s_io_t *io, uint64_t rid)
{
    for (s_set_t *r = zlistx_first(io->sets); r; r = zlistx_next(io->sets))
        if (r->sent && r->rid == rid)
            return r;
    return NULL;
}

static void s_set_done(s_io_t *io, s_set_t *r, int status)
{
    void *h = zlistx_find(io->sets, r);
    if (h)
        zlistx_detach(io->sets, h);
    s_set_complete(r, status);
}

/* ENOTLEADER (a standby, or a master without its etcd quorum), to a snapshot, a SET or a
 * heartbeat: to the leader it names at once, else the next entry of the list after a backoff
 * (a snapshot) or the same SET again after it. */
static void s_not_leader(s_io_t *io, const kvedge_kvmsg_t *k, bool snap)
{
    kvedge_mview_t *v = io->v;
    int64_t now = kvedge_mono_ms();
    char router[KVEDGE_MASTER_MAX_ENDPOINT_BYTES + 1], pub[KVEDGE_MASTER_MAX_ENDPOINT_BYTES + 1];
    bool hinted = s_hint(io, k->body, k->body_len, router, pub) &&
                  (strcmp(router, io->master) != 0 || strcmp(pub, io->pub) != 0);
    pthread_mutex_lock(&v->mu);
    snprintf(v->conn.reason, sizeof v->conn.reason, "%.*s", (int)k->body_len,
             k->body ? (const char *)k->body : "");
    pthread_mutex_unlock(&v->mu);
    s_set_t *r = s_set_find(io, k->rid);
    if (r) {
        r->sent = false;
        r->notleader = true;
        r->retry_at = hinted ? 0 : now + KVEDGE_MVIEW_NO_LEADER_MS;
    }
    if (hinted) {
        s_follow(io, router, pub, S_WHY_MOVE, true);
        return;
    }
    if (!snap)
        return;
    s_sync_abort(io);
    if (s_following(io)) {
        io->next_at = now + KVEDGE_MVIEW_NO_LEADER_MS;
    } else {
        io->next_sync = now + KVEDGE_MVIEW_NO_LEADER_MS;
        io->probe_at = io->next_sync;
    }
}

static void s_on_dealer(s_io_t *io)
{
    zframe_t *parts[KVEDGE_KVMSG_MAX_FRAMES] = {NULL};
    size_t n = s_recv_bounded(io->dealer, parts, KVEDGE_KVMSG_MAX_FRAMES);
    kvedge_wire_frame_t f[KVEDGE_KVMSG_MAX_FRAMES];
    for (size_t i = 0; i < n && i < KVEDGE_KVMSG_MAX_FRAMES; i++)
        f[i] = (kvedge_wire_frame_t){zframe_data(parts[i]), zframe_size(parts[i])};
    kvedge_kvmsg_t k = {0};
    bool ok = n > 0 && n <= KVEDGE_KVMSG_MAX_FRAMES && kvedge_kvmsg_parse(f, n, &k) == KVEDGE_OK;
    bool snap = ok && io->syncing && k.rid == io->snap_rid;
    if (!ok) {
        s_bad(io);
    } else if (k.cmd == KVEDGE_KVMSG_ERR && k.status == KVEDGE_ENOTLEADER) {
        s_not_leader(io, &k, snap);
    } else if (k.cmd == KVEDGE_KVMSG_KVSYNC && snap) {
        char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
        memcpy(key, k.key, k.key_len);
        key[k.key_len] = '\0';
        if (!s_has_prefix(key, k.key_len, io->prefix, io->prefix_len) ||
            zhashx_lookup(io->fresh.h, key) ||
            s_table_put(&io->fresh, key, k.seq, k.body, k.body_len) != KVEDGE_OK) {
            s_bad(io);
            s_sync_abort(io);
            io->next_sync = kvedge_mono_ms() + KVEDGE_MVIEW_RETRY_MS;
        } else {
            io->fresh_count++;
        }
    } else if (k.cmd == KVEDGE_KVMSG_KTHXBAI && snap) {
        if (k.key_len != io->prefix_len ||
            (k.key_len && memcmp(k.key, io->prefix, k.key_len) != 0)) {
            s_bad(io);
            s_sync_begin(io);
        } else {
            s_sync_finish(io, &k);
        }
    } else if (k.cmd == KVEDGE_KVMSG_ERR && snap) {
        s_sync_abort(io);
        io->next_sync = kvedge_mono_ms() + KVEDGE_MVIEW_RETRY_MS;
        if (!io->subscribed)
            io->probe_at = io->next_sync;
    } else if (k.cmd == KVEDGE_KVMSG_OK || k.cmd == KVEDGE_KVMSG_ERR) {
        s_set_t *r = s_set_find(io, k.rid);
        if (r && k.cmd == KVEDGE_KVMSG_ERR) {
            s_set_done(io, r, k.status);
        } else if (r) {
            kvedge_mview_t *v = io->v;
            /* Read your writes: while synced or syncing, answer once the view has it too. */
            if ((v->state == KVEDGE_MVIEW_SYNCED || io->syncing) && v->seq < k.seq) {
                r->acked = true;
                r->acked_seq = k.seq;
            } else {
                s_set_done(io, r, KVEDGE_OK);
            }
        } /* else: a heartbeat's answer, or one that came after its deadline */
    } else if (k.cmd != KVEDGE_KVMSG_KVSYNC && k.cmd != KVEDGE_KVMSG_KTHXBAI) {
        s_bad(io); /* a request or a PUB message on the DEALER */
    }
    for (size_t i = 0; i < n && i < KVEDGE_KVMSG_MAX_FRAMES; i++)
        zframe_destroy(&parts[i]);
}

/* ---------------------------------------------------------------- the actor */

static void s_set_send(s_io_t *io, s_set_t *r)
{
    if (r->sent || (r->retry_at && kvedge_mono_ms() < r->retry_at))
        return;
    r->rid = ++io->next_rid;
    kvedge_kvmsg_t k = {.cmd = KVEDGE_KVMSG_SET,
                        .key = (const uint8_t *)r->key,
                        .key_len = r->klen,
                        .body = r->body,
                        .body_len = r->len,
                        .rid = r->rid};
    r->sent = s_send(io, &k);
}

static void s_heartbeat_send(s_io_t *io, const char *id)
{
    kvedge_kvmsg_t k = {.cmd = KVEDGE_KVMSG_HEARTBEAT,
                        .key = (const uint8_t *)id,
                        .key_len = strlen(id),
                        .rid = ++io->next_rid};
    s_send(io, &k); /* best effort: the next one follows */
}

/* Returns false on $TERM. */
static bool s_on_pipe(s_io_t *io, zsock_t *pipe)
{
    zmsg_t *m = zmsg_recv(pipe);
    if (!m)
        return false;
    char *cmd = zmsg_popstr(m);
    bool running = cmd && !streq(cmd, "$TERM");
    if (cmd && streq(cmd, "SET")) {
        zframe_t *f = zmsg_first(m);
        s_set_t *r = NULL;
        if (f && zframe_size(f) == sizeof r)
            memcpy(&r, zframe_data(f), sizeof r);
        if (r) {
            atomic_fetch_sub(&io->v->queued, 1);
            if (zlistx_add_end(io->sets, r))
                s_set_send(io, r);
            else
                s_set_complete(r, KVEDGE_ENOMEM);
        }
    } else if (cmd && streq(cmd, "HEARTBEAT")) {
        atomic_fetch_sub(&io->v->queued, 1);
        char *id = zmsg_popstr(m);
        if (id && kvedge_master_id_ok(id))
            s_heartbeat_send(io, id);
        zstr_free(&id);
    }
    zstr_free(&cmd);
    zmsg_destroy(&m);
    return running;
}

static int64_t s_timers(s_io_t *io)
{
    kvedge_mview_t *v = io->v;
    int64_t now = kvedge_mono_ms();
    if (io->syncing && now >= io->snap_deadline) {
        /* No complete snapshot in time: the master is unreachable or stuck. New sockets (the
         * next master of a list), and keep serving what we have. */
        s_sync_abort(io);
        if (s_following(io))
            s_follow_next(io, S_WHY_DEATH);
        else if (s_connect(io) != KVEDGE_OK)
            s_close(io);
        io->next_sync = now + KVEDGE_MVIEW_RETRY_MS;
    }
    if (io->next_at && now >= io->next_at)
        s_follow_next(io, S_WHY_MOVE); /* the master knew no leader */
    if (!io->syncing && v->state != KVEDGE_MVIEW_SYNCED && io->subscribed && now >= io->next_sync)
        s_sync_begin(io);
    if (!io->syncing && v->state != KVEDGE_MVIEW_SYNCED && !io->subscribed && io->probe_at &&
        now >= io->probe_at) {
        io->probe_at = 0;
        s_sync_start(io, true);
    }
    if (!io->syncing && v->state == KVEDGE_MVIEW_SYNCED && now - io->last_heard > io->dead_ms) {
        if (s_following(io))
            s_follow_next(io, S_WHY_DEATH);
        else
            s_resync(io, false, true);
    }
    if (!io->subscribed && io->reconnect_at && now >= io->reconnect_at) {
        /* Refused, or nothing heard: libzmq may have given up on these sockets. A list: the
         * next master, the backoff growing once per round. */
        bool round = true;
        if (s_following(io)) {
            s_follow_next(io, S_WHY_MOVE);
            round = io->ep_idx == 0;
        } else if (s_connect(io) != KVEDGE_OK) {
            s_close(io);
        }
        uint32_t next = round ? io->retry_ms * 2 : io->retry_ms;
        io->retry_ms = next < KVEDGE_MVIEW_RECONNECT_MAX_MS ? next : KVEDGE_MVIEW_RECONNECT_MAX_MS;
        pthread_mutex_lock(&v->mu);
        v->conn.reconnects++;
        v->conn.retry_ms = io->retry_ms;
        pthread_mutex_unlock(&v->mu);
    }

    s_sets_sweep(io);
    if (io->hb_id && now >= io->next_hb) {
        s_heartbeat_send(io, io->hb_id);
        io->next_hb = now + io->hb_ms;
    }
    if (io->path && now >= io->next_save) {
        if (v->version != io->saved_version)
            s_save(io);
        io->next_save = now + io->save_ms;
    }
    int64_t next = now + S_TICK_MS;
    if (!io->subscribed && io->reconnect_at && io->reconnect_at < next)
        next = io->reconnect_at;
    if (!io->syncing && v->state != KVEDGE_MVIEW_SYNCED && io->subscribed && io->next_sync < next)
        next = io->next_sync;
    if (!io->syncing && v->state != KVEDGE_MVIEW_SYNCED && !io->subscribed && io->probe_at &&
        io->probe_at < next)
        next = io->probe_at;
    if (io->next_at && io->next_at < next)
        next = io->next_at;
    return next > now ? next - now : 0;
}

static void s_actor(zsock_t *pipe, void *args)
{
    s_io_t *io = args;
    io->start_rc = s_connect(io);
    zsock_signal(pipe, 0);
    if (io->start_rc != KVEDGE_OK) {
        char *cmd = zstr_recv(pipe); /* hold until destroy's $TERM */
        zstr_free(&cmd);
        s_close(io);
        return;
    }
    int64_t now = kvedge_mono_ms();
    io->next_sync = now;
    io->last_heard = now;
    io->next_save = now + io->save_ms;
    io->next_hb = now;
    zpoller_t *poller = NULL;
    int64_t wait_ms = 0;
    bool running = true;
    while (running) {
        if (io->rebuild || !poller) {
            zpoller_destroy(&poller);
            poller = io->dealer && io->sub ? zpoller_new(pipe, io->dealer, io->sub, NULL)
                                           : zpoller_new(pipe, NULL);
            io->rebuild = false;
            if (!poller)
                break;
            if (io->mon && io->dealer)
                zpoller_add(poller, io->mon);
        }
        void *which = zpoller_wait(poller, (int)wait_ms);
        if (which == pipe)
            running = s_on_pipe(io, pipe);
        else if (!which && zpoller_terminated(poller))
            running = false;
        for (int i = 0;
             running && i < S_DRAIN_MAX && io->dealer && (zsock_events(io->dealer) & ZMQ_POLLIN);
             i++)
            s_on_dealer(io);
        for (int i = 0;
             running && i < S_DRAIN_MAX && io->sub && (zsock_events(io->sub) & ZMQ_POLLIN); i++)
            s_on_sub(io);
        for (int i = 0;
             running && i < S_DRAIN_MAX && io->mon && (zsock_events(io->mon) & ZMQ_POLLIN); i++)
            s_on_mon(io);
        if (running)
            wait_ms = s_timers(io);
    }
    zpoller_destroy(&poller);
    s_set_t *r;
    while ((r = zlistx_detach(io->sets, NULL)) != NULL)
        s_set_complete(r, KVEDGE_ECLOSED);
    if (io->syncing)
        s_sync_abort(io);
    if (io->path && io->v->version != io->saved_version)
        s_save(io);
    s_close(io);
}

/* ---------------------------------------------------------------- public */

void kvedge_mview_opts_default(kvedge_mview_opts_t *opts)
{
    if (opts)
        memset(opts, 0, sizeof *opts);
}

int kvedge_mview_check_endpoints(const char *list, char *why, size_t why_len)
{
    if (!list || !*list)
        return 0;
    size_t n = kvedge_mview_count_endpoints(list);
    if (n > KVEDGE_MVIEW_MAX_MASTERS)
        return kvedge_why(why, why_len, -1, "lists %zu masters, more than %d", n,
                          KVEDGE_MVIEW_MAX_MASTERS);
    const char *p = list;
    for (size_t i = 0; i < n; i++) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char ep[KVEDGE_MASTER_MAX_ENDPOINT_BYTES + 1], sub[200] = "";
        if (len == 0)
            return kvedge_why(why, why_len, -1, "entry %zu of the list is empty", i + 1);
        if (len > KVEDGE_MASTER_MAX_ENDPOINT_BYTES)
            return kvedge_why(why, why_len, -1, "entry %zu is longer than %d bytes", i + 1,
                              KVEDGE_MASTER_MAX_ENDPOINT_BYTES);
        memcpy(ep, p, len);
        ep[len] = '\0';
        if (kvedge_settings_check_endpoint(ep, sub, sizeof sub) != 0)
            return n > 1 ? kvedge_why(why, why_len, -1, "has a bad entry '%s': %s", ep, sub)
                         : kvedge_why(why, why_len, -1, "%s", sub);
        p = e ? e + 1 : p + len;
    }
    return 0;
}

size_t kvedge_mview_count_endpoints(const char *list)
{
    if (!list || !*list)
        return 0;
    size_t n = 1;
    for (const char *c = list; *c; c++)
        n += *c == ',';
    return n;
}

int kvedge_mview_default_pubs(const char *masters, char *out, size_t cap)
{
    if (!masters || !*masters || !out || cap == 0)
        return -1;
    size_t off = 0;
    const char *p = masters;
    for (;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        const char *colon = NULL;
        for (const char *c = p; c < p + len; c++)
            if (*c == ':')
                colon = c;
        char *end = NULL;
        unsigned long port = 0;
        if (len > 6 && strncmp(p, "tcp://", 6) == 0 && colon && colon > p + 6 &&
            colon + 1 < p + len && colon[1] >= '0' && colon[1] <= '9') {
            errno = 0;
            port = strtoul(colon + 1, &end, 10);
        }
        if (!end || end != p + len || errno || port < 1 || port > 65534)
            return -1;
        int k = snprintf(out + off, cap - off, "%s%.*s:%lu", off ? "," : "", (int)(colon - p), p,
                         port + 1);
        if (k < 0 || (size_t)k >= cap - off)
            return -1;
        off += (size_t)k;
        if (!e)
            return 0;
        p = e + 1;
    }
}

static char *s_dup(const char *s, bool *failed)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *failed = true;
    return d;
}

/* The master's public key: a certificate file when one exists at that path, else Z85. */
static int s_server_key(const char *key, char out[KVEDGE_MASTER_KEY_Z85_BYTES + 1])
{
    if (zsys_file_exists(key)) {
        zcert_t *cert = zcert_load(key);
        if (!cert)
            return KVEDGE_EIO;
        snprintf(out, KVEDGE_MASTER_KEY_Z85_BYTES + 1, "%s", zcert_public_txt(cert));
        zcert_destroy(&cert);
        return KVEDGE_OK;
    }
    uint8_t bin[32];
    if (strlen(key) != KVEDGE_MASTER_KEY_Z85_BYTES)
        return KVEDGE_EIO; /* not a key, so a path to a missing file */
    if (!zmq_z85_decode(bin, key))
        return KVEDGE_EINVAL;
    memcpy(out, key, KVEDGE_MASTER_KEY_Z85_BYTES + 1);
    return KVEDGE_OK;
}

static void s_list_free(char **list, size_t n)
{
    for (size_t i = 0; list && i < n; i++)
        free(list[i]);
    free(list);
}

/* Splits "EP[,EP...]" into owned strings: 1 … KVEDGE_MVIEW_MAX_MASTERS entries, each (in a
 * list) a transport://address without spaces. Returns 0, KVEDGE_EINVAL or KVEDGE_ENOMEM. */
static int s_split(const char *list, char ***out, size_t *n)
{
    *out = NULL;
    *n = 0;
    size_t cap = 1;
    for (const char *c = list; *c; c++)
        cap += *c == ',';
    if (cap > KVEDGE_MVIEW_MAX_MASTERS)
        return KVEDGE_EINVAL;
    char **v = calloc(cap, sizeof *v);
    if (!v)
        return KVEDGE_ENOMEM;
    const char *p = list;
    for (size_t i = 0; i < cap; i++) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        v[i] = len && len <= KVEDGE_MASTER_MAX_ENDPOINT_BYTES ? strndup(p, len) : NULL;
        int rc =
            !v[i] && len && len <= KVEDGE_MASTER_MAX_ENDPOINT_BYTES ? KVEDGE_ENOMEM : KVEDGE_EINVAL;
        /* One endpoint is checked as it always was, by connecting; a list here. */
        if (!v[i] || (cap > 1 && (!strstr(v[i], "://") || strpbrk(v[i], " \t\r\n")))) {
            s_list_free(v, cap);
            return rc;
        }
        p = e ? e + 1 : p + len;
    }
    *out = v;
    *n = cap;
    return KVEDGE_OK;
}

static void s_io_free(s_io_t *io)
{
    if (!io)
        return;
    s_list_free(io->masters, io->n_eps);
    s_list_free(io->pubs, io->n_eps);
    s_table_free(&io->fresh);
    if (io->buffer)
        s_buffer_clear(io);
    zlistx_destroy(&io->buffer);
    zlistx_destroy(&io->sets);
    zcert_destroy(&io->cert);
    free(io->master);
    free(io->pub);
    free(io->prefix);
    free(io->path);
    free(io->hb_id);
    free(io);
}

static void s_view_free(kvedge_mview_t *v)
{
    s_table_free(&v->table);
    pthread_cond_destroy(&v->cv);
    pthread_mutex_destroy(&v->mu);
    pthread_mutex_destroy(&v->pipe_mu);
    free(v);
}

static int s_io_new(const kvedge_mview_opts_t *o, s_io_t **out)
{
    s_io_t *io = calloc(1, sizeof *io);
    if (!io)
        return KVEDGE_ENOMEM;
    bool failed = false;
    size_t n_pubs = 0;
    int rc = s_split(o->master, &io->masters, &io->n_eps);
    if (rc == KVEDGE_OK)
        rc = s_split(o->pub, &io->pubs, &n_pubs);
    if (rc == KVEDGE_OK && n_pubs != io->n_eps)
        rc = KVEDGE_EINVAL; /* one PUB per master */
    for (size_t i = 0; rc == KVEDGE_OK && !o->server_key && i < io->n_eps; i++)
        if (!kvedge_endpoint_is_loopback(io->masters[i]) ||
            !kvedge_endpoint_is_loopback(io->pubs[i]))
            rc = KVEDGE_EDENIED; /* plaintext only where nobody else can listen */
    if (rc != KVEDGE_OK) {
        s_list_free(io->pubs, n_pubs);
        io->pubs = NULL;
        if (!io->masters)
            io->n_eps = 0;
        s_io_free(io);
        return rc;
    }
    io->master = s_dup(io->masters[0], &failed);
    io->pub = s_dup(io->pubs[0], &failed);
    io->prefix = s_dup(o->prefix ? o->prefix : "", &failed);
    io->path = o->snapshot_path && *o->snapshot_path ? s_dup(o->snapshot_path, &failed) : NULL;
    io->hb_id = o->heartbeat_id ? s_dup(o->heartbeat_id, &failed) : NULL;
    io->buffer = zlistx_new();
    io->sets = zlistx_new();
    if (failed || !io->buffer || !io->sets) {
        s_io_free(io);
        return KVEDGE_ENOMEM;
    }
    io->prefix_len = strlen(io->prefix);
    io->hb_ms = o->heartbeat_ms ? o->heartbeat_ms : KVEDGE_MASTER_HEARTBEAT_IVL_MS;
    io->dead_ms = o->dead_ms ? o->dead_ms : KVEDGE_MVIEW_DEAD_MS;
    io->save_ms = o->save_ms ? o->save_ms : KVEDGE_MVIEW_SAVE_MS;
    io->retry_ms = KVEDGE_MVIEW_RECONNECT_MIN_MS;
    io->on_change = o->on_change;
    io->ctx = o->ctx;
    if (o->server_key) {
        if (!zsys_has_curve()) {
            s_io_free(io);
            return KVEDGE_EDENIED;
        }
        rc = s_server_key(o->server_key, io->server_pub);
        io->cert = rc == KVEDGE_OK ? zcert_load(o->client_cert) : NULL;
        if (rc == KVEDGE_OK && !io->cert)
            rc = KVEDGE_EIO;
        if (rc == KVEDGE_OK) {
            const char *secret = zcert_secret_txt(io->cert);
            bool zero = true;
            for (const char *c = secret; *c; c++)
                zero = zero && *c == '0';
            if (zero)
                rc = KVEDGE_EIO; /* a public certificate: no secret to prove who we are */
        }
        if (rc != KVEDGE_OK) {
            s_io_free(io);
            return rc;
        }
        io->curve = true;
    }
    *out = io;
    return KVEDGE_OK;
}

int kvedge_mview_start(const kvedge_mview_opts_t *opts, kvedge_mview_t **out)
{
    if (!out)
        return KVEDGE_EINVAL;
    *out = NULL;
    if (!opts || !opts->master || !opts->pub || (opts->server_key && !opts->client_cert) ||
        (opts->prefix && strlen(opts->prefix) > KVEDGE_KVMSG_MAX_KEY_BYTES) ||
        (opts->prefix && *opts->prefix &&
         !kvedge_kvmsg_key_ok((const uint8_t *)opts->prefix, strlen(opts->prefix))) ||
        (opts->heartbeat_id && !kvedge_master_id_ok(opts->heartbeat_id)) ||
        (opts->snapshot_path && strlen(opts->snapshot_path) > 4000))
        return KVEDGE_EINVAL;
    s_io_t *io;
    int rc = s_io_new(opts, &io);
    if (rc != KVEDGE_OK)
        return rc;
    kvedge_mview_t *v = calloc(1, sizeof *v);
    if (!v || s_table_init(&v->table) != KVEDGE_OK) {
        free(v);
        s_io_free(io);
        return KVEDGE_ENOMEM;
    }
    pthread_mutex_init(&v->mu, NULL);
    pthread_mutex_init(&v->pipe_mu, NULL);
    s_cond_init(&v->cv);
    io->v = v;
    v->conn.dead_ms = io->dead_ms;
    snprintf(v->conn.endpoint, sizeof v->conn.endpoint, "%s", io->master);
    snprintf(v->conn.pub, sizeof v->conn.pub, "%s", io->pub);
    v->io = io;

    /* The last state known, until the master says otherwise. */
    s_table_t t;
    uint64_t seq = 0, registry = 0;
    if (io->path &&
        s_load(io->path, io->prefix, io->prefix_len, &t, &seq, &registry) == KVEDGE_OK) {
        s_table_free(&v->table);
        v->table = t;
        v->seq = seq;
        v->registry = registry;
        v->state = KVEDGE_MVIEW_STALE;
        v->stats.file_loads = 1;
    }

    zsys_set_logstream(NULL);
    v->actor = zactor_new(s_actor, io);
    rc = !v->actor ? KVEDGE_ENOMEM : io->start_rc;
    if (rc != KVEDGE_OK) {
        zactor_destroy(&v->actor);
        s_io_free(io);
        s_view_free(v);
        return rc;
    }
    int wait = opts->start_wait_ms == 0 ? KVEDGE_MVIEW_START_WAIT_MS : opts->start_wait_ms;
    if (wait > 0)
        kvedge_mview_wait(v, 0, wait);
    *out = v;
    return KVEDGE_OK;
}

void kvedge_mview_destroy(kvedge_mview_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_mview_t *v = *self_p;
    *self_p = NULL;
    pthread_mutex_lock(&v->pipe_mu);
    v->closing = true;
    pthread_mutex_unlock(&v->pipe_mu);
    zactor_destroy(&v->actor);
    s_io_free(v->io);
    s_view_free(v);
}

kvedge_mview_state_t kvedge_mview_state(kvedge_mview_t *v)
{
    if (!v)
        return KVEDGE_MVIEW_EMPTY;
    pthread_mutex_lock(&v->mu);
    kvedge_mview_state_t s = v->state;
    pthread_mutex_unlock(&v->mu);
    return s;
}

uint64_t kvedge_mview_seq(kvedge_mview_t *v)
{
    if (!v)
        return 0;
    pthread_mutex_lock(&v->mu);
    uint64_t s = v->seq;
    pthread_mutex_unlock(&v->mu);
    return s;
}

uint64_t kvedge_mview_registry(kvedge_mview_t *v)
{
    if (!v)
        return 0;
    pthread_mutex_lock(&v->mu);
    uint64_t r = v->registry;
    pthread_mutex_unlock(&v->mu);
    return r;
}

size_t kvedge_mview_count(kvedge_mview_t *v)
{
    if (!v)
        return 0;
    pthread_mutex_lock(&v->mu);
    size_t n = zhashx_size(v->table.h);
    pthread_mutex_unlock(&v->mu);
    return n;
}

void kvedge_mview_stats(kvedge_mview_t *v, kvedge_mview_stats_t *out)
{
    if (!v || !out)
        return;
    pthread_mutex_lock(&v->mu);
    *out = v->stats;
    pthread_mutex_unlock(&v->mu);
}

void kvedge_mview_conn(kvedge_mview_t *v, kvedge_mview_conn_t *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!v)
        return;
    pthread_mutex_lock(&v->mu);
    *out = v->conn;
    pthread_mutex_unlock(&v->mu);
}

int kvedge_mview_wait(kvedge_mview_t *v, uint64_t min_seq, int timeout_ms)
{
    if (!v)
        return KVEDGE_EINVAL;
    struct timespec ts = s_abs(kvedge_mono_ms() + (timeout_ms > 0 ? timeout_ms : 0));
    pthread_mutex_lock(&v->mu);
    while (!(v->state == KVEDGE_MVIEW_SYNCED && v->notified >= min_seq && v->seq >= min_seq))
        if (pthread_cond_timedwait(&v->cv, &v->mu, &ts) == ETIMEDOUT)
            break;
    int rc = v->state == KVEDGE_MVIEW_SYNCED && v->notified >= min_seq && v->seq >= min_seq
                 ? KVEDGE_OK
                 : KVEDGE_ETIMEDOUT;
    pthread_mutex_unlock(&v->mu);
    return rc;
}

int kvedge_mview_get(kvedge_mview_t *v, const char *key, void *buf, size_t cap, size_t *len)
{
    if (len)
        *len = 0;
    if (!v || !key || (cap && !buf))
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&v->mu);
    const s_entry_t *e = zhashx_lookup(v->table.h, key);
    int rc = !e ? KVEDGE_ENOTFOUND : e->len > cap ? KVEDGE_ENOSPACE : KVEDGE_OK;
    if (e && len)
        *len = e->len;
    if (rc == KVEDGE_OK)
        memcpy(buf, e->body, e->len);
    pthread_mutex_unlock(&v->mu);
    return rc;
}

int kvedge_mview_foreach(kvedge_mview_t *v, const char *prefix, kvedge_mview_cb cb, void *ctx)
{
    if (!v || !cb)
        return KVEDGE_EINVAL;
    /* Copy under the lock, call without it. */
    pthread_mutex_lock(&v->mu);
    size_t n;
    s_pair_t *p = s_sorted(&v->table, prefix ? prefix : "", &n);
    if (n == SIZE_MAX) {
        pthread_mutex_unlock(&v->mu);
        return KVEDGE_ENOMEM;
    }
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += strlen(p[i].key) + 1 + sizeof(s_entry_t) + p[i].e->len + 8;
    uint8_t *copy = n ? malloc(total) : NULL;
    if (n && !copy) {
        free(p);
        pthread_mutex_unlock(&v->mu);
        return KVEDGE_ENOMEM;
    }
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        off = (off + 7) & ~(size_t)7;
        s_entry_t *e = (s_entry_t *)(copy + off);
        memcpy(e, p[i].e, sizeof *e + p[i].e->len);
        off += sizeof *e + p[i].e->len;
        char *k = (char *)copy + off;
        size_t kl = strlen(p[i].key) + 1;
        memcpy(k, p[i].key, kl);
        off += kl;
        p[i] = (s_pair_t){k, e};
    }
    pthread_mutex_unlock(&v->mu);
    for (size_t i = 0; i < n; i++)
        if (cb(ctx, p[i].key, p[i].e->seq, p[i].e->body, p[i].e->len) != 0)
            break;
    free(copy);
    free(p);
    return KVEDGE_OK;
}

/* Hands a request to the actor: "SET" + pointer, or "HEARTBEAT" + id. */
static int s_submit(kvedge_mview_t *v, const char *cmd, const void *ptr, const char *id)
{
    int rc = KVEDGE_OK;
    pthread_mutex_lock(&v->pipe_mu);
    if (v->closing) {
        rc = KVEDGE_ECLOSED;
    } else if (atomic_fetch_add(&v->queued, 1) >= S_PIPE_QUEUED_MAX) {
        atomic_fetch_sub(&v->queued, 1);
        rc = KVEDGE_EBACKLOG;
    } else {
        zsock_t *pipe = zactor_sock(v->actor);
        int sent = ptr ? zsock_send(pipe, "sp", cmd, ptr) : zsock_send(pipe, "ss", cmd, id);
        if (sent != 0) {
            atomic_fetch_sub(&v->queued, 1);
            rc = KVEDGE_EBACKLOG;
        }
    }
    pthread_mutex_unlock(&v->pipe_mu);
    return rc;
}

int kvedge_mview_set(kvedge_mview_t *v, const char *key, const void *body, size_t len,
                     int deadline_ms)
{
    size_t klen = key ? strnlen(key, KVEDGE_KVMSG_MAX_KEY_BYTES + 1) : 0;
    if (!v || !kvedge_kvmsg_key_ok((const uint8_t *)key, klen) ||
        len > KVEDGE_KVMSG_MAX_BODY_BYTES || (len && !body))
        return KVEDGE_EINVAL;
    if (deadline_ms <= 0)
        deadline_ms = KVEDGE_MVIEW_SET_DEADLINE_MS;
    if (deadline_ms > KVEDGE_WIRE_MAX_DEADLINE_MS)
        deadline_ms = KVEDGE_WIRE_MAX_DEADLINE_MS;
    s_set_t *r = calloc(1, sizeof *r);
    if (!r)
        return KVEDGE_ENOMEM;
    r->body = len ? malloc(len) : NULL;
    if (len && !r->body) {
        free(r);
        return KVEDGE_ENOMEM;
    }
    memcpy(r->key, key, klen);
    r->klen = klen;
    if (len)
        memcpy(r->body, body, len);
    r->len = len;
    r->deadline = kvedge_mono_ms() + deadline_ms;
    r->refs = 2;
    pthread_mutex_init(&r->mu, NULL);
    s_cond_init(&r->cv);
    int rc = s_submit(v, "SET", r, NULL);
    if (rc != KVEDGE_OK) {
        r->refs = 1;
        s_set_release(r);
        return rc;
    }
    struct timespec ts = s_abs(r->deadline + S_WAIT_MARGIN_MS);
    pthread_mutex_lock(&r->mu);
    while (!r->done)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) == ETIMEDOUT)
            break;
    rc = r->done ? r->status : KVEDGE_ETIMEDOUT;
    pthread_mutex_unlock(&r->mu);
    s_set_release(r);
    return rc;
}

int kvedge_mview_heartbeat(kvedge_mview_t *v, const char *id)
{
    if (!v || !kvedge_master_id_ok(id))
        return KVEDGE_EINVAL;
    return s_submit(v, "HEARTBEAT", NULL, id);
}

/* ---------------------------------------------------------------- typed getters */

static int s_get_record(kvedge_mview_t *v, kvedge_master_space_t space, const char *a,
                        const char *b, uint8_t *buf, size_t *len)
{
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    int rc = kvedge_master_key_format(space, a, b, key, sizeof key);
    if (rc != KVEDGE_OK)
        return KVEDGE_EINVAL;
    rc = kvedge_mview_get(v, key, buf, KVEDGE_MASTER_RECORD_MAX_BYTES, len);
    return rc == KVEDGE_ENOSPACE ? KVEDGE_EPROTO : rc; /* larger than any valid record */
}

int kvedge_mview_node(kvedge_mview_t *v, const char *id, kvedge_master_node_t *out)
{
    uint8_t buf[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    int rc = s_get_record(v, KVEDGE_MASTER_SPACE_NODE, id, NULL, buf, &len);
    return rc != KVEDGE_OK ? rc : kvedge_master_node_parse(buf, len, out);
}

int kvedge_mview_health(kvedge_mview_t *v, const char *id, kvedge_master_health_t *out)
{
    uint8_t buf[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    int rc = s_get_record(v, KVEDGE_MASTER_SPACE_HEALTH, id, NULL, buf, &len);
    return rc != KVEDGE_OK ? rc : kvedge_master_health_parse(buf, len, out);
}

int kvedge_mview_model(kvedge_mview_t *v, const char *model_id, kvedge_model_t *out)
{
    uint8_t buf[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    int rc = s_get_record(v, KVEDGE_MASTER_SPACE_MODEL, model_id, NULL, buf, &len);
    return rc != KVEDGE_OK ? rc : kvedge_master_model_parse(buf, len, out);
}

int kvedge_mview_tenant_model(kvedge_mview_t *v, const uint8_t tag[16], const char *model_id,
                              kvedge_model_t *out)
{
    if (!tag)
        return KVEDGE_EINVAL;
    char hex[KVEDGE_MASTER_TENANT_HEX_BYTES + 1];
    kvedge_master_tenant_hex(tag, hex);
    uint8_t buf[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    int rc = s_get_record(v, KVEDGE_MASTER_SPACE_TMODEL, hex, model_id, buf, &len);
    return rc != KVEDGE_OK ? rc : kvedge_master_model_parse(buf, len, out);
}

int kvedge_mview_map(kvedge_mview_t *v, const char *cloud_model, const char *edge_model,
                     kvedge_master_map_t *out)
{
    uint8_t buf[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    int rc = s_get_record(v, KVEDGE_MASTER_SPACE_MAP, cloud_model, edge_model, buf, &len);
    return rc != KVEDGE_OK ? rc : kvedge_master_map_parse(buf, len, out);
}

int kvedge_mview_adapter(kvedge_mview_t *v, const char *cloud_model, const char *edge_model,
                         kvedge_master_adapter_t *out)
{
    uint8_t buf[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    int rc = s_get_record(v, KVEDGE_MASTER_SPACE_ADAPTER, cloud_model, edge_model, buf, &len);
    return rc != KVEDGE_OK ? rc : kvedge_master_adapter_parse(buf, len, out);
}

int kvedge_mview_dir(kvedge_mview_t *v, const char *node_id, const kvedge_chunk_id_t *chunk,
                     kvedge_master_dir_t *out)
{
    if (!chunk)
        return KVEDGE_EINVAL;
    char hex[KVEDGE_MASTER_CHUNK_HEX_BYTES + 1];
    kvedge_master_chunk_hex(chunk, hex);
    uint8_t buf[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    int rc = s_get_record(v, KVEDGE_MASTER_SPACE_DIR, node_id, hex, buf, &len);
    return rc != KVEDGE_OK ? rc : kvedge_master_dir_parse(buf, len, out);
}

int kvedge_mview_link(kvedge_mview_t *v, const char *from, const char *to,
                      kvedge_master_link_t *out)
{
    uint8_t buf[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    int rc = s_get_record(v, KVEDGE_MASTER_SPACE_LINK, from, to, buf, &len);
    return rc != KVEDGE_OK ? rc : kvedge_master_link_parse(buf, len, out);
}
