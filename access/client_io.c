/* The protocol client's I/O (access/client.c): requests, the I/O actor that owns the DEALER,
 * and the direct channels a synchronous caller drives itself. */
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

#include "access/client_impl.h"
#include "access/codec/byteorder.h"
#include "access/codec/clock.h"
#include "access/meter.h"
#include "access/shaper.h"
#include "access/transport.h"

#define S_PIPE_MAX 64 /* requests taken from the pipe per wakeup */
/* Requests waiting in the pipe before calls fail with KVEDGE_EBACKLOG: well under the pipe's
 * high-water mark (czmq's default 1000), so destroy's $TERM always finds room. */
#define S_PIPE_QUEUED_MAX 512
#define S_Z85_KEY_CHARS   40
#define S_CHAN_SLICE_MS   100 /* a caller checks for destroy at least this often */

/* ---------------------------------------------------------------- clocks */

/* Milliseconds left until an absolute deadline, as the header's deadline field wants it. */
static uint32_t s_left_ms(int64_t deadline_ms)
{
    int64_t left = deadline_ms - kvedge_mono_ms();
    if (left < 1)
        return 1;
    return left > KVEDGE_WIRE_MAX_DEADLINE_MS ? KVEDGE_WIRE_MAX_DEADLINE_MS : (uint32_t)left;
}

/* ---------------------------------------------------------------- requests */

/* A message in flight on an emulated link: delivered (or sent) at its due time, so the link
 * adds latency once per message in flight, not once per message in turn. */
typedef struct {
    zmsg_t *m;
    uint64_t due_us;
    uint64_t id; /* uplink: the request it carries (0 for CREDIT/CANCEL) */
} s_held_t;

static void s_held_destroy(void **item)
{
    s_held_t *h = *item;
    if (h) {
        zmsg_destroy(&h->m);
        free(h);
        *item = NULL;
    }
}

kvedge_client__req_t *kvedge_client__req_new(uint8_t opcode, uint32_t count, int64_t deadline_ms)
{
    kvedge_client__req_t *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->opcode = opcode;
    r->count = count;
    r->deadline_ms = deadline_ms;
    r->refs = 1;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    return r;
}

void kvedge_client__req_free(kvedge_client__req_t *r)
{
    free(r->fetch);
    zmsg_destroy(&r->payload);
    zmsg_destroy(&r->retry);
    zmsg_destroy(&r->reply);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Drops one reference; frees on the last. */
void kvedge_client__req_release(kvedge_client__req_t *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last)
        kvedge_client__req_free(r);
}

/* I/O thread: publishes the result of a unary request and lets go of it. */
static void s_req_complete(kvedge_client__req_t *r, int status)
{
    pthread_mutex_lock(&r->mu);
    r->status = status;
    r->done = true;
    pthread_cond_signal(&r->cv);
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last)
        kvedge_client__req_free(r);
}

/* Caller: waits for completion until the deadline plus a margin. The I/O thread completes
 * every request by its deadline; the margin only covers an I/O thread held up in a user
 * callback, and then the caller gives up with KVEDGE_ETIMEDOUT. */
static int s_req_wait(kvedge_client__req_t *r)
{
    int64_t until = r->deadline_ms + KVEDGE_CLIENT__WAIT_MARGIN_MS;
    struct timespec ts = {(time_t)(until / 1000), (long)(until % 1000) * 1000000};
    pthread_mutex_lock(&r->mu);
    while (!r->done)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) == ETIMEDOUT)
            break;
    int status = r->done ? r->status : KVEDGE_ETIMEDOUT;
    pthread_mutex_unlock(&r->mu);
    return status;
}

/* ---------------------------------------------------------------- the I/O actor */

static size_t s_id_hash(const void *key)
{
    uint64_t x = (uint64_t)(uintptr_t)key;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x;
}

static int s_id_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y ? -1 : x > y;
}

#define S_KEY(id) ((const void *)(uintptr_t)(id))

/* Node's public key: a certificate file when one exists at that path, else 40 chars of Z85. */
static int s_server_key(const char *key, char out[S_Z85_KEY_CHARS + 1])
{
    if (zsys_file_exists(key)) {
        zcert_t *cert = zcert_load(key);
        if (!cert)
            return KVEDGE_EIO;
        snprintf(out, S_Z85_KEY_CHARS + 1, "%s", zcert_public_txt(cert));
        zcert_destroy(&cert);
        return KVEDGE_OK;
    }
    uint8_t bin[32];
    if (strlen(key) != S_Z85_KEY_CHARS)
        return KVEDGE_EIO; /* not a key, so a path to a missing file */
    if (!zmq_z85_decode(bin, key))
        return KVEDGE_EINVAL;
    memcpy(out, key, S_Z85_KEY_CHARS + 1);
    return KVEDGE_OK;
}

static bool s_all_zero_txt(const char *txt)
{
    for (; *txt; txt++)
        if (*txt != '0')
            return false;
    return true;
}

static int s_io_setup(kvedge_client__io_t *io)
{
    io->inflight = zhashx_new();
    io->dealer = zsock_new(ZMQ_DEALER);
    if (!io->inflight || !io->dealer)
        return KVEDGE_ENOMEM;
    zhashx_set_key_hasher(io->inflight, s_id_hash);
    zhashx_set_key_comparator(io->inflight, s_id_cmp);
    zhashx_set_key_duplicator(io->inflight, NULL);
    zhashx_set_key_destructor(io->inflight, NULL);
    io->next_deadline = INT64_MAX;
    if (io->up) {
        io->held_up = zlistx_new();
        io->held_down = zlistx_new();
        if (!io->held_up || !io->held_down)
            return KVEDGE_ENOMEM;
        zlistx_set_destructor(io->held_up, s_held_destroy);
        zlistx_set_destructor(io->held_down, s_held_destroy);
    }

    zsock_t *d = io->dealer;
    zsock_set_linger(d, 0);
    zsock_set_immediate(d, 0);
    zsock_set_sndtimeo(d, 0); /* a full queue fails the request; never blocks the actor */
    zsock_set_heartbeat_ivl(d, KVEDGE_HEARTBEAT_IVL_MS);
    zsock_set_heartbeat_timeout(d, KVEDGE_HEARTBEAT_TIMEOUT_MS);
    zsock_set_maxmsgsize(d, (int)KVEDGE_WIRE_MAX_FRAME_BYTES);
    char *why = io->setup_why;
    const size_t wl = sizeof io->setup_why;
    if (io->server_key) {
        if (!zsys_has_curve()) {
            snprintf(why, wl, "this libzmq has no CURVE support: a server key cannot be used");
            return KVEDGE_EDENIED;
        }
        char server_pub[S_Z85_KEY_CHARS + 1];
        int rc = s_server_key(io->server_key, server_pub);
        if (rc == KVEDGE_EIO && zsys_file_exists(io->server_key))
            snprintf(why, wl,
                     "server key %s: not a readable certificate (kvedge keygen writes one)",
                     io->server_key);
        else if (rc == KVEDGE_EIO)
            snprintf(why, wl, "server key %s: no such file, and not a key (40 characters of Z85)",
                     io->server_key);
        else if (rc != KVEDGE_OK)
            snprintf(why, wl, "server key %s: not a valid Z85 key", io->server_key);
        if (rc != KVEDGE_OK)
            return rc;
        zcert_t *mine = zsys_file_exists(io->client_cert) ? zcert_load(io->client_cert) : NULL;
        if (!mine) {
            snprintf(why, wl, "client certificate %s: %s", io->client_cert,
                     zsys_file_exists(io->client_cert)
                         ? "not a readable certificate (kvedge keygen writes one)"
                         : "no such file (give the secret certificate, PATH_secret of kvedge "
                           "keygen PATH)");
            return KVEDGE_EIO;
        }
        if (s_all_zero_txt(zcert_secret_txt(mine))) {
            zcert_destroy(&mine); /* a public certificate: no secret key to prove who we are */
            snprintf(why, wl,
                     "client certificate %s holds no secret key: give the secret certificate "
                     "(PATH_secret of kvedge keygen PATH)",
                     io->client_cert);
            return KVEDGE_EIO;
        }
        zcert_apply(mine, d);
        zcert_destroy(&mine);
        zsock_set_curve_serverkey(d, server_pub);
    }
    if (zsock_connect(d, "%s", io->endpoint) != 0) {
        snprintf(why, wl,
                 "cannot connect to \"%s\" (%s): an endpoint is tcp://HOST:PORT or "
                 "ipc://PATH",
                 io->endpoint, zmq_strerror(zmq_errno()));
        return KVEDGE_EINVAL;
    }
    return KVEDGE_OK;
}

static void s_send_header(kvedge_client__io_t *io, uint8_t opcode, uint64_t id, uint32_t credit,
                          int64_t deadline_ms)
{
    kvedge_wire_header_t h = {.version = KVEDGE_WIRE_VERSION,
                              .opcode = opcode,
                              .request_id = id,
                              .credit = credit,
                              .deadline_ms = s_left_ms(deadline_ms)};
    uint8_t buf[KVEDGE_WIRE_HEADER_BYTES];
    kvedge_wire_header_pack(&h, buf);
    if (io->held_up) { /* CREDIT and CANCEL cross the emulated uplink like everything else */
        s_held_t *held = malloc(sizeof *held);
        zmsg_t *m = held ? zmsg_new() : NULL;
        if (m && zmsg_addmem(m, buf, sizeof buf) == 0) {
            uint64_t now = kvedge_shaper_now_us();
            held->m = m;
            held->due_us = now + kvedge_shaper_delay_us(io->up, sizeof buf, now);
            held->id = 0;
            zlistx_add_end(io->held_up, held);
            return;
        }
        zmsg_destroy(&m);
        free(held);
    }
    zmq_send(zsock_resolve(io->dealer), buf, sizeof buf, ZMQ_DONTWAIT); /* best effort */
}

/* Ends a request: out of the table; a stream hears on_done (after a CANCEL when the node may
 * still be sending), a unary request's caller is woken. */
void kvedge_client__finish(kvedge_client__io_t *io, kvedge_client__req_t *r, int status,
                           bool cancel)
{
    if (r->id)
        zhashx_delete(io->inflight, S_KEY(r->id));
    /* Every completed exchange is a sample of the link: request to last byte. */
    if (status == KVEDGE_OK && r->id && r->sent_us) {
        int64_t elapsed = kvedge_mono_us() - r->sent_us;
        if (elapsed > 0)
            kvedge_meter_observe(io->meter, r->rx_bytes, (uint64_t)elapsed);
    }
    if (!r->stream) {
        s_req_complete(r, status);
        return;
    }
    if (cancel && r->id)
        s_send_header(io, KVEDGE_OP_CANCEL, r->id, 0, r->deadline_ms);
    if (r->blk_n)
        io->blk_avg = (uint32_t)(r->blk_bytes / r->blk_n);
    if (r->fetch)
        kvedge_client__fetch_done(r, status);
    else if (r->on_done)
        r->on_done(r->ctx, status, r->received);
    kvedge_client__req_free(r);
}

/* The credit that keeps about r->window bytes of blocks of avg bytes each in flight, within
 * [r->credit, r->credit_max]; r->credit when avg is not known. */
static uint32_t s_window_credit(const kvedge_client__req_t *r, uint64_t avg)
{
    uint64_t want = avg ? r->window / avg : 0;
    if (want < r->credit)
        return r->credit;
    return want > r->credit_max ? r->credit_max : (uint32_t)want;
}

/* A GET_LAYER or FETCH that asks for packing on a connection not known to refuse it: its
 * payload is kept as it is (for kvedge_client__io_resubmit_unpacked); then a FETCH's spec gets
 * the PACK flag, a GET_LAYER the accept list (empty when the caller gave none: it keeps the
 * positions) and the pack frame. */
static int s_pack_ask(kvedge_client__io_t *io, kvedge_client__req_t *r, zmsg_t *m)
{
    r->packed = false;
    r->pack_max = 1;
    if (!r->pack_want || io->no_pack)
        return KVEDGE_OK;
    zmsg_destroy(&r->retry);
    r->retry = zmsg_dup(m);
    if (r->opcode == KVEDGE_OP_FETCH) {
        zframe_t *spec = zmsg_first(m);
        if (!r->retry || !spec || zframe_size(spec) != KVEDGE_WIRE_FETCH_SPEC_BYTES)
            return KVEDGE_ENOMEM;
        uint8_t *fl = zframe_data(spec) + KVEDGE_WIRE_FETCH_SPEC_BYTES - 4; /* flags u32 */
        kvedge_le_put32(fl, kvedge_le_get32(fl) | KVEDGE_WIRE_FETCH_FLAG_PACK);
        r->packed = true;
        r->pack_max = KVEDGE_WIRE_MAX_PACK;
        return KVEDGE_OK;
    }
    uint8_t pf[KVEDGE_WIRE_PACK_BYTES];
    kvedge_wire_pack_t pk = {KVEDGE_CLIENT_PACK_BLOCKS, r->pack_bytes};
    kvedge_wire_pack_pack(&pk, pf);
    if (!r->retry || (!r->has_accept && zmsg_addmem(m, NULL, 0) != 0) ||
        zmsg_addmem(m, pf, sizeof pf) != 0)
        return KVEDGE_ENOMEM;
    r->packed = true;
    r->pack_max = KVEDGE_CLIENT_PACK_BLOCKS;
    return KVEDGE_OK;
}

void kvedge_client__io_resubmit_unpacked(kvedge_client__io_t *io, kvedge_client__req_t *r)
{
    io->no_pack = true;
    zhashx_delete(io->inflight, S_KEY(r->id));
    r->id = 0;
    r->payload = r->retry;
    r->retry = NULL;
    r->pack_want = false;
    r->outstanding = r->owed = 0;
    kvedge_client__io_submit(io, r);
}

/* A request handed over by a caller: numbered, sent, tracked. */
void kvedge_client__io_submit(kvedge_client__io_t *io, kvedge_client__req_t *r)
{
    if (kvedge_mono_ms() >= r->deadline_ms) {
        kvedge_client__finish(io, r, KVEDGE_ETIMEDOUT, false);
        return;
    }
    if (r->stream)
        r->credit = r->target = s_window_credit(r, io->blk_avg);
    zmsg_t *m = r->payload ? r->payload : zmsg_new();
    r->payload = NULL;
    if (m && s_pack_ask(io, r, m) != KVEDGE_OK)
        zmsg_destroy(&m); /* failed below as out of memory */
    r->id = ++io->next_id;
    kvedge_wire_header_t h = {.version = KVEDGE_WIRE_VERSION,
                              .opcode = r->opcode,
                              .request_id = r->id,
                              .count = r->count,
                              .credit = r->credit,
                              .deadline_ms = s_left_ms(r->deadline_ms)};
    uint8_t buf[KVEDGE_WIRE_HEADER_BYTES];
    kvedge_wire_header_pack(&h, buf);
    if (!m || zmsg_pushmem(m, buf, sizeof buf) != 0) {
        zmsg_destroy(&m);
        r->id = 0;
        kvedge_client__finish(io, r, KVEDGE_ENOMEM, false);
        return;
    }
    r->sent_us = kvedge_mono_us(); /* before the emulated uplink: its delay is part of the rtt */
    if (io->up) { /* the emulated uplink sends it when a real one would have it there */
        uint64_t now = kvedge_shaper_now_us();
        s_held_t *held = malloc(sizeof *held);
        if (!held) {
            zmsg_destroy(&m);
            r->id = 0;
            kvedge_client__finish(io, r, KVEDGE_ENOMEM, false);
            return;
        }
        held->m = m;
        held->due_us = now + kvedge_shaper_delay_us(io->up, zmsg_content_size(m), now);
        held->id = r->id;
        zlistx_add_end(io->held_up, held);
        r->outstanding = r->credit;
        zhashx_insert(io->inflight, S_KEY(r->id), r);
        if (r->deadline_ms < io->next_deadline)
            io->next_deadline = r->deadline_ms;
        return;
    }
    if (zmsg_send(&m, io->dealer) != 0) {
        zmsg_destroy(&m);
        if (!io->heard) {
            /* No connection ever came up: a node that refused our key drops the connection at
             * the handshake, and libzmq then takes nothing. As documented, a refusal is
             * silent: the call waits out its deadline (KVEDGE_ETIMEDOUT), not "busy". */
            r->outstanding = r->credit;
            zhashx_insert(io->inflight, S_KEY(r->id), r);
            if (r->deadline_ms < io->next_deadline)
                io->next_deadline = r->deadline_ms;
            return;
        }
        /* The queue to the node is full (it is gone or stalled): fail now rather than
         * block the actor; nothing of this message was sent. */
        r->id = 0;
        kvedge_client__finish(io, r, KVEDGE_EBACKLOG, false);
        return;
    }
    r->outstanding = r->credit;
    zhashx_insert(io->inflight, S_KEY(r->id), r);
    if (r->deadline_ms < io->next_deadline)
        io->next_deadline = r->deadline_ms;
}

/* One message from the node. Unknown request ids are dropped; a malformed message fails its
 * request. Consumes m. */
static void s_io_message(kvedge_client__io_t *io, zmsg_t *m)
{
    size_t bytes = zmsg_content_size(m);
    zframe_t *hf = zmsg_pop(m);
    kvedge_wire_header_t h;
    memset(&h, 0, sizeof h);
    /* A header that is not even readable yields id 0, which no request has. */
    int rc = hf ? kvedge_wire_header_parse(zframe_data(hf), zframe_size(hf), &h) : KVEDGE_EPROTO;
    zframe_destroy(&hf);
    kvedge_client__req_t *r =
        h.request_id ? zhashx_lookup(io->inflight, S_KEY(h.request_id)) : NULL;
    if (!r) {
        zmsg_destroy(&m);
        return;
    }
    r->rx_bytes += bytes;
    size_t n = zmsg_size(m);
    if (rc == KVEDGE_OK && (!(h.flags & KVEDGE_WIRE_FLAG_REPLY) || h.opcode != r->opcode ||
                            n > KVEDGE_WIRE_MAX_FRAMES))
        rc = KVEDGE_EPROTO;
    if (rc == KVEDGE_OK) {
        size_t i = 0;
        for (zframe_t *f = zmsg_first(m); f; f = zmsg_next(m), i++) {
            io->frames[i].data = zframe_data(f);
            io->frames[i].len = zframe_size(f);
        }
        rc = kvedge_wire_validate(&h, io->frames, n);
    }
    if (rc != KVEDGE_OK) {
        zmsg_destroy(&m);
        kvedge_client__finish(io, r, rc, r->stream);
        return;
    }
    if (r->fetch || r->stream) {
        kvedge_client__stream_message(io, r, &h, n, m);
        zmsg_destroy(&m);
        return;
    }
    r->done_us = kvedge_mono_us();
    r->rh = h;
    r->reply = m;
    kvedge_client__finish(io, r, h.status, false);
}

/* Grants back what each stream consumed in this drain, in one CREDIT per stream. */
static void s_io_flush_credit(kvedge_client__io_t *io)
{
    for (size_t i = 0; i < io->n_due; i++) {
        kvedge_client__req_t *r = zhashx_lookup(io->inflight, S_KEY(io->due[i]));
        if (!r || r->owed == 0)
            continue; /* ended in the meantime */
        uint32_t grant = r->owed > KVEDGE_WIRE_MAX_CREDIT ? KVEDGE_WIRE_MAX_CREDIT : r->owed;
        r->owed -= grant;
        /* Widen the stream to its window now that its blocks' size is known. */
        uint32_t want = s_window_credit(r, r->blk_n ? r->blk_bytes / r->blk_n : 0);
        if (want > r->target) {
            uint32_t extra = want - r->target;
            if (extra > KVEDGE_WIRE_MAX_CREDIT - grant)
                extra = KVEDGE_WIRE_MAX_CREDIT - grant;
            grant += extra;
            r->target += extra;
        }
        s_send_header(io, KVEDGE_OP_CREDIT, r->id, grant, r->deadline_ms);
        r->outstanding += grant;
    }
    io->n_due = 0;
}

static void s_io_drain(kvedge_client__io_t *io)
{
    if (!io->down) {
        for (int i = 0; i < KVEDGE_CLIENT__DRAIN_MAX && (zsock_events(io->dealer) & ZMQ_POLLIN);
             i++) {
            zmsg_t *m = zmsg_recv(io->dealer);
            if (!m)
                break;
            io->heard = true;
            s_io_message(io, m);
        }
    } else {
        /* Emulated downlink: everything queued arrived by now; each message is delivered at
         * the time a link of that rate and latency would deliver it. */
        uint64_t now = kvedge_shaper_now_us();
        for (int i = 0; i < KVEDGE_CLIENT__DRAIN_MAX && (zsock_events(io->dealer) & ZMQ_POLLIN);
             i++) {
            zmsg_t *m = zmsg_recv(io->dealer);
            io->heard = io->heard || m;
            s_held_t *h = m ? malloc(sizeof *h) : NULL;
            if (!h) {
                zmsg_destroy(&m);
                break;
            }
            h->m = m;
            h->due_us = now + kvedge_shaper_delay_us(io->down, zmsg_content_size(m), now);
            h->id = 0;
            zlistx_add_end(io->held_down, h);
        }
        now = kvedge_shaper_now_us();
        s_held_t *h;
        while ((h = zlistx_first(io->held_down)) != NULL && h->due_us <= now) {
            zmsg_t *m = h->m;
            h->m = NULL;
            zlistx_delete(io->held_down, zlistx_cursor(io->held_down));
            s_io_message(io, m);
        }
    }
    s_io_flush_credit(io);
}

/* Ends every request whose deadline has passed, or (all) every request with status. */
static void s_io_expire(kvedge_client__io_t *io, bool all, int status)
{
    int64_t now = kvedge_mono_ms();
    if (!all && now < io->next_deadline)
        return;
    zlistx_t *ended = zlistx_new();
    int64_t next = INT64_MAX;
    for (kvedge_client__req_t *r = zhashx_first(io->inflight); r; r = zhashx_next(io->inflight)) {
        if (all || now >= r->deadline_ms)
            zlistx_add_end(ended, r);
        else if (r->deadline_ms < next)
            next = r->deadline_ms;
    }
    io->next_deadline = next;
    for (kvedge_client__req_t *r = zlistx_first(ended); r; r = zlistx_next(ended))
        kvedge_client__finish(io, r, status, true);
    zlistx_destroy(&ended);
}

/* Credit a stream's consumer held (kvedge_client_credit_hold) and gives back now: owed to the
 * node in this wakeup's CREDIT. A stream that has ended in the meantime ignores it. */
static void s_io_credit(kvedge_client__io_t *io, const kvedge_client__req_t *g)
{
    kvedge_client__req_t *r = zhashx_lookup(io->inflight, S_KEY(g->grant_to));
    if (!r || !r->stream)
        return;
    if (r->owed == 0 && io->n_due < KVEDGE_CLIENT__DRAIN_MAX)
        io->due[io->n_due++] = r->id;
    r->owed += g->count;
}

/* Takes requests from the pipe; returns false on $TERM. */
static bool s_io_pipe(kvedge_client__io_t *io, zsock_t *pipe, bool closing)
{
    void *h = zsock_resolve(pipe);
    for (int i = 0; i < S_PIPE_MAX; i++) {
        char buf[16];
        int n = zmq_recv(h, buf, sizeof buf, ZMQ_DONTWAIT);
        if (n < 0)
            break;
        if (n == (int)sizeof(kvedge_client__req_t *)) {
            kvedge_client__req_t *r;
            memcpy(&r, buf, sizeof r);
            atomic_fetch_sub(&io->queued, 1);
            if (r->opcode == KVEDGE_OP_CREDIT) { /* a control request: nobody waits for it */
                if (!closing)
                    s_io_credit(io, r);
                kvedge_client__req_free(r);
            } else if (closing)
                kvedge_client__finish(io, r, KVEDGE_ECLOSED, false);
            else
                kvedge_client__io_submit(io, r);
        } else if (n == 5 && memcmp(buf, "$TERM", 5) == 0) {
            return false;
        }
    }
    return true;
}

static void s_io_teardown(kvedge_client__io_t *io)
{
    zlistx_destroy(&io->held_up);
    zlistx_destroy(&io->held_down);
    zsock_destroy(&io->dealer);
    zhashx_destroy(&io->inflight);
}

/* Sends the emulated uplink's messages that are due. A message the socket refuses fails its
 * request (if it is still in flight). */
static void s_io_flush_up(kvedge_client__io_t *io)
{
    uint64_t now = kvedge_shaper_now_us();
    s_held_t *h;
    while (io->held_up && (h = zlistx_first(io->held_up)) != NULL && h->due_us <= now) {
        uint64_t id = h->id;
        int rc = zmsg_send(&h->m, io->dealer);
        zlistx_delete(io->held_up, zlistx_cursor(io->held_up));
        kvedge_client__req_t *r = rc != 0 && id ? zhashx_lookup(io->inflight, S_KEY(id)) : NULL;
        if (r)
            kvedge_client__finish(io, r, KVEDGE_EBACKLOG, false);
    }
}

/* Milliseconds until the first held message is due (rounded up), or -1 when none is held. */
static int s_io_held_wait(kvedge_client__io_t *io)
{
    uint64_t now = kvedge_shaper_now_us(), first = UINT64_MAX;
    s_held_t *h;
    if (io->held_up && (h = zlistx_first(io->held_up)) != NULL && h->due_us < first)
        first = h->due_us;
    if (io->held_down && (h = zlistx_first(io->held_down)) != NULL && h->due_us < first)
        first = h->due_us;
    if (first == UINT64_MAX)
        return -1;
    return first <= now ? 0 : (int)((first - now + 999) / 1000);
}

/* The meter and shapers outlive the actor (the caller reads the meter): freed with io. */
void kvedge_client__io_free_link(kvedge_client__io_t *io)
{
    kvedge_meter_destroy(&io->meter);
    kvedge_shaper_destroy(&io->up);
    kvedge_shaper_destroy(&io->down);
}

void kvedge_client__actor(zsock_t *pipe, void *args)
{
    kvedge_client__io_t *io = args;
    io->actor = true;
    io->setup_rc = s_io_setup(io);
    zsock_signal(pipe, 0);
    if (io->setup_rc != KVEDGE_OK) {
        s_io_teardown(io);
        char *cmd;
        while ((cmd = zstr_recv(pipe)) != NULL) { /* hold until connect has read the error */
            bool term = streq(cmd, "$TERM");
            zstr_free(&cmd);
            if (term)
                break;
        }
        return;
    }
    zpoller_t *poller = zpoller_new(pipe, io->dealer, NULL);
    if (poller)
        zpoller_set_nonstop(poller, true); /* the application's signals are not ours */
    bool running = poller != NULL;
    while (running) {
        int timeout = -1;
        if (io->next_deadline != INT64_MAX) {
            int64_t left = io->next_deadline - kvedge_mono_ms();
            /* + 1: wake just after the deadline's millisecond, not spin through it */
            timeout = left < 0 ? 0 : left >= INT_MAX ? INT_MAX : (int)left + 1;
        }
        int held = s_io_held_wait(io);
        if (held >= 0 && (timeout < 0 || held < timeout))
            timeout = held;
        zpoller_wait(poller, timeout);
        if (zpoller_terminated(poller))
            break; /* the ZeroMQ context is going away */
        running = s_io_pipe(io, pipe, false);
        s_io_flush_up(io);
        s_io_drain(io);
        s_io_expire(io, false, KVEDGE_ETIMEDOUT);
    }
    s_io_expire(io, true, KVEDGE_ECLOSED);
    s_io_pipe(io, pipe, true); /* requests that raced with destroy */
    zpoller_destroy(&poller);
    s_io_teardown(io);
}

/* Hands r to the I/O thread, which from now on holds a reference. On failure r is freed. */
int kvedge_client__submit(kvedge_client_t *c, kvedge_client__req_t *r)
{
    if (!r->stream)
        r->refs = 2;
    int n = -1, err = 0;
    pthread_mutex_lock(&c->pipe_mu);
    if (c->closing) {
        err = KVEDGE_ECLOSED;
    } else if (atomic_fetch_add(&c->io->queued, 1) >= S_PIPE_QUEUED_MAX) {
        err = KVEDGE_EBACKLOG; /* the I/O thread is that far behind (held up in a callback) */
    } else {
        zsock_t *pipe = zactor_sock(c->actor);
        zsock_set_sndtimeo(pipe, (int)s_left_ms(r->deadline_ms));
        do {
            n = zmq_send(zsock_resolve(pipe), &r, sizeof r, 0);
        } while (n < 0 && zmq_errno() == EINTR);
        if (n != (int)sizeof r)
            err = zmq_errno() == EAGAIN ? KVEDGE_ETIMEDOUT : KVEDGE_ECLOSED;
    }
    if (err)
        atomic_fetch_sub(&c->io->queued, 1);
    pthread_mutex_unlock(&c->pipe_mu);
    if (!err)
        return KVEDGE_OK;
    kvedge_client__req_free(r);
    return err;
}

/* ---------------------------------------------------------------- direct channels */

/* A synchronous call need not cross the actor. When a direct channel is free, the calling
 * thread checks it out and runs the actor's own code (kvedge_client__io_submit, s_io_drain,
 * s_io_expire) on it: a DEALER of its own to the same node with the same key, options and
 * heartbeats. A PING then crosses caller -> libzmq I/O thread -> node -> I/O thread -> caller, two
 * thread handoffs fewer than through the actor's pipe and the future's condition variable. The
 * socket passes between threads only under chan_mu (the full barrier libzmq asks for), and
 * only with nothing in flight on it. Streams and asynchronous calls stay on the actor. */

static kvedge_client__io_t *s_chan_new(const kvedge_client_t *c)
{
    kvedge_client__io_t *ch = calloc(1, sizeof *ch);
    if (!ch)
        return NULL;
    ch->endpoint = c->io->endpoint; /* the client's, read-only while it lives */
    ch->server_key = c->io->server_key;
    ch->client_cert = c->io->client_cert;
    ch->meter = c->io->meter; /* thread-safe */
    if (s_io_setup(ch) != KVEDGE_OK) {
        s_io_teardown(ch);
        free(ch);
        return NULL;
    }
    return ch;
}

void kvedge_client__chan_destroy(kvedge_client__io_t **ch_p)
{
    if (*ch_p) {
        s_io_expire(*ch_p, true, KVEDGE_ECLOSED); /* nothing is left in flight; defensive */
        s_io_teardown(*ch_p);
        free(*ch_p);
        *ch_p = NULL;
    }
}

/* A free channel for the calling thread, or NULL: the call goes through the actor. */
static kvedge_client__io_t *s_chan_get(kvedge_client_t *c)
{
    if (!c->direct)
        return NULL;
    kvedge_client__io_t *ch = NULL;
    bool make = false;
    pthread_mutex_lock(&c->chan_mu);
    if (!atomic_load(&c->chan_closing)) {
        if (c->chan_nidle > 0)
            ch = c->chan_idle[--c->chan_nidle];
        else if (c->chan_n < KVEDGE_CLIENT__CHAN_MAX)
            make = true;
        if (ch || make) {
            c->chan_busy++;
            c->chan_n += make;
        }
    }
    pthread_mutex_unlock(&c->chan_mu);
    if (make && !(ch = s_chan_new(c))) {
        pthread_mutex_lock(&c->chan_mu);
        c->chan_n--;
        if (--c->chan_busy == 0)
            pthread_cond_broadcast(&c->chan_cv);
        pthread_mutex_unlock(&c->chan_mu);
    }
    return ch;
}

/* Gives ch back (its requests have all completed); a broken one is closed. */
static void s_chan_put(kvedge_client_t *c, kvedge_client__io_t *ch, bool broken)
{
    pthread_mutex_lock(&c->chan_mu);
    if (broken || zhashx_size(ch->inflight) > 0 || atomic_load(&c->chan_closing)) {
        kvedge_client__chan_destroy(&ch);
        c->chan_n--;
    } else {
        c->chan_idle[c->chan_nidle++] = ch;
    }
    if (--c->chan_busy == 0)
        pthread_cond_broadcast(&c->chan_cv);
    pthread_mutex_unlock(&c->chan_mu);
}

/* Caller: runs ch's I/O until *done. Every request ends by its deadline (s_io_expire), or
 * with KVEDGE_ECLOSED when the client or ZeroMQ closes. Returns false when ch is broken. */
bool kvedge_client__chan_run(kvedge_client_t *c, kvedge_client__io_t *ch, const bool *done)
{
    zmq_pollitem_t item = {zsock_resolve(ch->dealer), 0, ZMQ_POLLIN, 0};
    while (!*done) {
        if (atomic_load(&c->chan_closing)) {
            s_io_expire(ch, true, KVEDGE_ECLOSED);
            return true;
        }
        int timeout = S_CHAN_SLICE_MS;
        if (ch->next_deadline != INT64_MAX) {
            int64_t left = ch->next_deadline - kvedge_mono_ms();
            if (left < timeout)
                timeout = left < 0 ? 0 : (int)left + 1;
        }
        if (zmq_poll(&item, 1, timeout) < 0 && zmq_errno() != EINTR) {
            s_io_expire(ch, true, KVEDGE_ECLOSED); /* the ZeroMQ context is going away */
            return false;
        }
        s_io_drain(ch);
        s_io_expire(ch, false, KVEDGE_ETIMEDOUT);
    }
    return true;
}

kvedge_client__path_t kvedge_client__path_open(kvedge_client_t *c)
{
    return (kvedge_client__path_t){c, s_chan_get(c)};
}

void kvedge_client__path_close(kvedge_client__path_t *p, bool broken)
{
    if (p->ch)
        s_chan_put(p->c, p->ch, broken);
    p->ch = NULL;
}

/* Sends r (a unary request) as kvedge_client__submit does: on failure r is freed. */
int kvedge_client__path_submit(kvedge_client__path_t *p, kvedge_client__req_t *r)
{
    if (!p->ch)
        return kvedge_client__submit(p->c, r);
    r->refs = 2;
    kvedge_client__io_submit(p->ch, r); /* failures complete r at once */
    return KVEDGE_OK;
}

/* Waits for r as s_req_wait does. A broken channel is given back at once (the call's other
 * requests on it have completed with KVEDGE_ECLOSED). */
int kvedge_client__path_wait(kvedge_client__path_t *p, kvedge_client__req_t *r)
{
    if (!p->ch)
        return s_req_wait(r);
    if (!kvedge_client__chan_run(p->c, p->ch, &r->done))
        kvedge_client__path_close(p, true);
    return r->done ? r->status : KVEDGE_ECLOSED;
}

/* Sends a unary request on p and waits. On 0, r holds the reply; the caller releases r. On
 * error, r has been released. */
int kvedge_client__call_on(kvedge_client__path_t *p, kvedge_client__req_t *r)
{
    int rc = kvedge_client__path_submit(p, r);
    if (rc != KVEDGE_OK)
        return rc;
    rc = kvedge_client__path_wait(p, r);
    if (rc != KVEDGE_OK)
        kvedge_client__req_release(r);
    return rc;
}

/* A request with one payload frame of len bytes (copied from data, or zeroed when data is
 * NULL); *frame receives its bytes for filling in. */
kvedge_client__req_t *kvedge_client__req_frame(uint8_t opcode, uint32_t count, int64_t deadline,
                                               const void *data, size_t len, uint8_t **frame)
{
    kvedge_client__req_t *r = kvedge_client__req_new(opcode, count, deadline);
    zmsg_t *m = zmsg_new();
    zframe_t *f = zframe_new(data, len);
    if (!r || !m || !f) {
        zframe_destroy(&f);
        zmsg_destroy(&m);
        if (r)
            kvedge_client__req_free(r);
        return NULL;
    }
    if (!data && len)
        memset(zframe_data(f), 0, len);
    if (frame)
        *frame = zframe_data(f);
    zmsg_append(m, &f);
    r->payload = m;
    return r;
}
