/* libkvedge (clients/lib/kvedge.h): the reference client of the kvedge wire protocol
 * (docs/protocol.md).
 *
 * Public calls build a request in the caller's thread (payload frames copied there, so the
 * caller's memory is never touched after the call returns) and hand its pointer to one I/O
 * actor that owns the DEALER socket. The actor assigns request ids, sends, matches replies by
 * id, validates every message with the access/frame.h codec, runs GET_LAYER streams with
 * credit flow control and completes expired requests on its own timer, so a call returns by
 * its deadline whatever the node does. Asynchronous calls and streams go through the actor.
 * A synchronous call runs the same code on a direct channel of its own when one is free (a
 * DEALER the calling thread drives itself, two thread handoffs fewer: see "direct channels");
 * else it waits on a per-request future that the actor completes.
 *
 * Credit policy: a stream starts with the client's credit (opts.credit, at most the node's
 * max_credit). Each data message consumed (after on_block returns) is owed back to the node;
 * owed credit is granted in one CREDIT per stream after each drain of the socket (at most
 * S_DRAIN_MAX messages), so the node keeps about `credit` messages in flight with one CREDIT
 * per wakeup rather than one per block. Credit counts messages, but what keeps a stream at
 * line rate is bytes in flight: with small blocks (an int4 head of 256 tokens is 40 KiB) eight
 * messages are a few hundred KiB and the stream stalls on every round of credit. So the
 * client also grants extra credit, once it has seen the stream's block sizes, until about
 * opts.window_bytes of blocks are in flight (never more than the node's max_credit messages,
 * never less than `credit`), and starts its next stream on the same socket at the credit the
 * last one ended with. */
#include "access/client.h"

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

#include "access/client_internal.h"
#include "access/frame.h"
#include "access/meter.h"
#include "access/shaper.h"
#include "access/transport.h"
#include "access/codec/clock.h"
#include "access/codec/errwire.h"

#define S_WAIT_MARGIN_MS  250         /* a caller waits this long past its deadline */
#define S_PUT_BATCH_BYTES (64u << 20) /* payload bytes per PUT message (one item may be more) */
#define S_PUT_PIPELINE    4           /* PUT messages of one call in flight */
#define S_GET_PIPELINE    2           /* GET messages of one call in flight */
#define S_DRAIN_MAX       256         /* messages read per wakeup before credit goes out */
#define S_PIPE_MAX        64          /* requests taken from the pipe per wakeup */
/* Requests waiting in the pipe before calls fail with KVEDGE_EBACKLOG: well under the pipe's
 * high-water mark (czmq's default 1000), so destroy's $TERM always finds room. */
#define S_PIPE_QUEUED_MAX 512
#define S_PING_TINY_BYTES 8 /* payload of the latency ping */
#define S_NAME_DEFAULT    "libkvedge"
#define S_Z85_KEY_CHARS   40
#define S_STATUS_BYTES    4
/* Direct channels: sockets a synchronous caller drives itself (see "direct channels"). */
#define S_CHAN_MAX      4   /* channels per client; more concurrent callers use the actor */
#define S_CHAN_SLICE_MS 100 /* a caller checks for destroy at least this often */

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

typedef struct s_req_t s_req_t;
struct s_req_t {
    /* What to send; filled in by the calling thread. */
    uint8_t opcode;
    uint32_t count;      /* header count */
    uint32_t credit;     /* GET_LAYER, FETCH: initial credit */
    uint32_t credit_max; /* streams: the node's max credit */
    uint32_t window;     /* streams: block bytes to keep in flight (opts.window_bytes) */
    int64_t deadline_ms; /* absolute, monotonic */
    zmsg_t *payload;     /* payload frames; the I/O thread sends them */
    /* A GET_LAYER stream: callbacks and flow control (I/O thread only). */
    bool stream;
    kvedge_block_fn *on_block;
    kvedge_done_fn *on_done;
    void *ctx;
    uint32_t n_chunks;
    uint32_t outstanding; /* data messages the node may still send */
    uint32_t owed;        /* consumed, not yet granted back */
    uint32_t received;    /* data messages delivered */
    uint32_t target;      /* credit the stream runs at: initial, plus extra granted */
    uint64_t blk_bytes;   /* bytes of the blocks received, for the window */
    uint32_t blk_n;       /* blocks received */
    uint32_t heads;       /* the model's KV heads, once the stream has shown them */
    uint32_t last_chunk;  /* position of the last data message */
    uint16_t last_head;
    struct s_fetch_t *fetch; /* a FETCH stream (stream is true too); NULL otherwise */
    /* I/O thread bookkeeping. */
    uint64_t id;       /* 0 until sent */
    int64_t sent_us;   /* when the request left */
    uint64_t rx_bytes; /* bytes of every message received for it (the meter's sample) */
    int64_t done_us;   /* when its reply arrived */
    /* The result of a unary request. */
    int status;
    kvedge_wire_header_t rh; /* reply header */
    zmsg_t *reply;           /* reply payload frames */
    /* Completion: the caller waits, the I/O thread completes; the last to let go frees. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int refs;
};

static s_req_t *s_req_new(uint8_t opcode, uint32_t count, int64_t deadline_ms)
{
    s_req_t *r = calloc(1, sizeof *r);
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

static void s_req_free(s_req_t *r)
{
    free(r->fetch);
    zmsg_destroy(&r->payload);
    zmsg_destroy(&r->reply);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Drops one reference; frees on the last. */
static void s_req_release(s_req_t *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last)
        s_req_free(r);
}

/* I/O thread: publishes the result of a unary request and lets go of it. */
static void s_req_complete(s_req_t *r, int status)
{
    pthread_mutex_lock(&r->mu);
    r->status = status;
    r->done = true;
    pthread_cond_signal(&r->cv);
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last)
        s_req_free(r);
}

/* Caller: waits for completion until the deadline plus a margin. The I/O thread completes
 * every request by its deadline; the margin only covers an I/O thread held up in a user
 * callback, and then the caller gives up with KVEDGE_ETIMEDOUT. */
static int s_req_wait(s_req_t *r)
{
    int64_t until = r->deadline_ms + S_WAIT_MARGIN_MS;
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

/* The actor's state; owned by the client, used only by the actor thread after setup. */
typedef struct {
    char *endpoint; /* copies of the options */
    char *server_key;
    char *client_cert;
    kvedge_meter_t *meter; /* observed bandwidth and rtt of this node (thread-safe) */
    kvedge_shaper_t *up;   /* emulated link, client -> node (NULL: none) */
    kvedge_shaper_t *down; /* emulated link, node -> client */
    zlistx_t *held_up;     /* s_held_t: messages on the emulated uplink, in due order */
    zlistx_t *held_down;   /* s_held_t: messages on the emulated downlink, in due order */
    int setup_rc;          /* result of s_io_setup, read by connect */
    char setup_why[KVEDGE_CLIENT_ERROR_BYTES]; /* what s_io_setup says when it fails */
    atomic_int queued; /* requests sent into the pipe, not yet taken by the actor */
    zsock_t *dealer;
    zhashx_t *inflight; /* request id -> s_req_t */
    uint64_t next_id;
    int64_t next_deadline;     /* earliest deadline in flight (may be stale early), or INT64_MAX */
    uint64_t due[S_DRAIN_MAX]; /* streams owed credit in this drain */
    size_t n_due;
    bool heard;       /* the node has answered something: a handshake completed */
    uint32_t blk_avg; /* mean block of the last stream that ended here (0: none yet) */
    kvedge_wire_frame_t frames[KVEDGE_WIRE_MAX_FRAMES];
} s_io_t;

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

/* What the latest failing public call on this thread had to say (kvedge_client_last_error). */
static _Thread_local char s_tl_err[KVEDGE_CLIENT_ERROR_BYTES];

const char *kvedge_client_last_error(void)
{
    return s_tl_err;
}

/* Every public call starts with no message: one that fails says its own, or nothing. */
static void s_err_clear(void)
{
    s_tl_err[0] = '\0';
}

static int s_err(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Sets this thread's message; returns rc. */
static int s_err(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s_tl_err, sizeof s_tl_err, fmt, ap);
    va_end(ap);
    return rc;
}

/* Which requests a peer answers, by the role its HELLO gave (docs/protocol.md): an edge proxy
 * HELLO, PING, FETCH and MONITOR; a store node everything but FETCH. Unknown roles: all. */
static bool s_role_serves(int role, uint8_t op)
{
    if (role == KVEDGE_ROLE_PROXY)
        return op == KVEDGE_OP_HELLO || op == KVEDGE_OP_PING || op == KVEDGE_OP_FETCH ||
               op == KVEDGE_OP_MONITOR;
    if (role == KVEDGE_ROLE_CLOUD || role == KVEDGE_ROLE_EDGE)
        return op != KVEDGE_OP_FETCH;
    return true;
}

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

static int s_io_setup(s_io_t *io)
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

static void s_send_header(s_io_t *io, uint8_t opcode, uint64_t id, uint32_t credit,
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

static void s_fetch_done(s_req_t *r, int status);
static void s_io_fetch(s_io_t *io, s_req_t *r, const kvedge_wire_header_t *h, size_t nframes);

/* Ends a request: out of the table; a stream hears on_done (after a CANCEL when the node may
 * still be sending), a unary request's caller is woken. */
static void s_finish(s_io_t *io, s_req_t *r, int status, bool cancel)
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
        s_fetch_done(r, status);
    else if (r->on_done)
        r->on_done(r->ctx, status, r->received);
    s_req_free(r);
}

/* The credit that keeps about r->window bytes of blocks of avg bytes each in flight, within
 * [r->credit, r->credit_max]; r->credit when avg is not known. */
static uint32_t s_window_credit(const s_req_t *r, uint64_t avg)
{
    uint64_t want = avg ? r->window / avg : 0;
    if (want < r->credit)
        return r->credit;
    return want > r->credit_max ? r->credit_max : (uint32_t)want;
}

/* A request handed over by a caller: numbered, sent, tracked. */
static void s_io_submit(s_io_t *io, s_req_t *r)
{
    if (kvedge_mono_ms() >= r->deadline_ms) {
        s_finish(io, r, KVEDGE_ETIMEDOUT, false);
        return;
    }
    if (r->stream)
        r->credit = r->target = s_window_credit(r, io->blk_avg);
    zmsg_t *m = r->payload ? r->payload : zmsg_new();
    r->payload = NULL;
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
        s_finish(io, r, KVEDGE_ENOMEM, false);
        return;
    }
    r->sent_us = kvedge_mono_us(); /* before the emulated uplink: its delay is part of the rtt */
    if (io->up) { /* the emulated uplink sends it when a real one would have it there */
        uint64_t now = kvedge_shaper_now_us();
        s_held_t *held = malloc(sizeof *held);
        if (!held) {
            zmsg_destroy(&m);
            r->id = 0;
            s_finish(io, r, KVEDGE_ENOMEM, false);
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
        s_finish(io, r, KVEDGE_EBACKLOG, false);
        return;
    }
    r->outstanding = r->credit;
    zhashx_insert(io->inflight, S_KEY(r->id), r);
    if (r->deadline_ms < io->next_deadline)
        io->next_deadline = r->deadline_ms;
}

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

/* One GET_LAYER message of stream r (already validated). Data messages must come in
 * (chunk, head) order within the credit granted; anything else fails the stream. */
static void s_io_stream(s_io_t *io, s_req_t *r, const kvedge_wire_header_t *h, size_t nframes)
{
    if (h->flags & KVEDGE_WIRE_FLAG_END) {
        int status = h->status;
        if (status == KVEDGE_OK && h->count != r->received)
            status = KVEDGE_EPROTO;
        if (status == KVEDGE_OK && r->received > 0) {
            /* Complete: every head of every chunk, so the last one is (n - 1, H - 1). */
            uint32_t heads = r->received / r->n_chunks;
            if (r->received % r->n_chunks != 0 || (r->heads && r->heads != heads) ||
                r->last_chunk != r->n_chunks - 1 || (uint32_t)r->last_head + 1 != heads)
                status = KVEDGE_EPROTO;
        }
        s_finish(io, r, status, false);
        return;
    }
    kvedge_wire_stream_hdr_t s;
    if (kvedge_wire_stream_hdr_parse(io->frames[0].data, io->frames[0].len, &s) != KVEDGE_OK ||
        r->outstanding == 0 || s.chunk_index >= r->n_chunks) {
        s_finish(io, r, KVEDGE_EPROTO, true);
        return;
    }
    if (!s_next_head(r->received == 0, r->last_chunk, r->last_head, r->heads, s.chunk_index,
                     s.head)) {
        s_finish(io, r, KVEDGE_EPROTO, true);
        return;
    }
    if (s.chunk_index != r->last_chunk && r->heads == 0)
        r->heads = (uint32_t)r->last_head + 1;
    r->last_chunk = s.chunk_index;
    r->last_head = s.head;
    r->outstanding--;
    r->received++;
    if (r->owed++ == 0 && io->n_due < S_DRAIN_MAX)
        io->due[io->n_due++] = r->id;
    const uint8_t *data = nframes == 2 ? io->frames[1].data : NULL;
    size_t len = nframes == 2 ? io->frames[1].len : 0;
    if (data) {
        r->blk_bytes += len;
        r->blk_n++;
    }
    if (r->on_block) {
        s_tl_data = data;
        r->on_block(r->ctx, s.chunk_index, s.head, s.status, data, len);
        s_tl_data = NULL;
    }
}

/* ---------------------------------------------------------------- FETCH streams */

/* A FETCH stream's client state (I/O thread only after submit). */
struct s_fetch_t {
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

static void s_fetch_done(s_req_t *r, int status)
{
    struct s_fetch_t *f = r->fetch;
    if (status == KVEDGE_OK && f->next_layer != f->layers)
        status = KVEDGE_EPROTO; /* END before every layer was accounted for */
    if (f->cbs.on_done)
        f->cbs.on_done(r->ctx, status);
}

static int s_fetch_plan(struct s_fetch_t *f, const kvedge_wire_frame_t *fr)
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

/* One FETCH message (validated by the codec). Order: the plan, then per layer, in layer
 * order, its blocks in (chunk, head) order and its LAYER record; anything else fails it. */
static void s_io_fetch(s_io_t *io, s_req_t *r, const kvedge_wire_header_t *h, size_t nframes)
{
    struct s_fetch_t *f = r->fetch;
    if (h->flags & KVEDGE_WIRE_FLAG_END) {
        s_finish(io, r, h->status, false);
        return;
    }
    if (r->outstanding == 0) {
        s_finish(io, r, KVEDGE_EPROTO, true);
        return;
    }
    const kvedge_wire_frame_t *fr = io->frames;
    int rc = KVEDGE_OK;
    uint8_t kind = fr[0].data[0];
    if (kind == KVEDGE_FETCH_MSG_PLAN) {
        rc = s_fetch_plan(f, fr);
        if (rc == KVEDGE_OK && f->cbs.on_plan)
            f->cbs.on_plan(r->ctx, &f->plan);
    } else if (!f->planned || f->next_layer >= f->layers) {
        rc = KVEDGE_EPROTO;
    } else if (kind == KVEDGE_FETCH_MSG_BLOCK) {
        kvedge_wire_fetch_block_t b;
        kvedge_wire_fetch_block_parse(fr[0].data, fr[0].len, &b);
        if (!s_next_head(!f->in_layer, f->last_chunk, f->last_head, 0, b.chunk_index, b.head) ||
            b.layer != f->first_layer + f->next_layer || b.chunk_index >= r->n_chunks ||
            b.source >= f->plan.nsources) {
            rc = KVEDGE_EPROTO;
        } else {
            f->in_layer = true;
            f->last_chunk = b.chunk_index;
            f->last_head = b.head;
            f->layer_blocks++;
            if (nframes == 2) {
                r->blk_bytes += fr[1].len;
                r->blk_n++;
            }
            if (f->cbs.on_block) {
                const uint8_t *data = nframes == 2 ? fr[1].data : NULL;
                s_tl_data = data;
                f->cbs.on_block(r->ctx, b.layer, b.chunk_index, b.head, b.source, b.status, data,
                                nframes == 2 ? fr[1].len : 0);
                s_tl_data = NULL;
            }
        }
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
        s_finish(io, r, rc, true);
        return;
    }
    r->outstanding--;
    r->received++;
    if (r->owed++ == 0 && io->n_due < S_DRAIN_MAX)
        io->due[io->n_due++] = r->id;
}

/* One message from the node. Unknown request ids are dropped; a malformed message fails its
 * request. Consumes m. */
static void s_io_message(s_io_t *io, zmsg_t *m)
{
    size_t bytes = zmsg_content_size(m);
    zframe_t *hf = zmsg_pop(m);
    kvedge_wire_header_t h;
    memset(&h, 0, sizeof h);
    /* A header that is not even readable yields id 0, which no request has. */
    int rc = hf ? kvedge_wire_header_parse(zframe_data(hf), zframe_size(hf), &h) : KVEDGE_EPROTO;
    zframe_destroy(&hf);
    s_req_t *r = h.request_id ? zhashx_lookup(io->inflight, S_KEY(h.request_id)) : NULL;
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
        s_finish(io, r, rc, r->stream);
        return;
    }
    if (r->fetch || r->stream) {
        s_tl_msg = m; /* an on_block callback may take its block's frame out of m */
        if (r->fetch)
            s_io_fetch(io, r, &h, n);
        else
            s_io_stream(io, r, &h, n);
        s_tl_msg = NULL;
        zmsg_destroy(&m);
        return;
    }
    r->done_us = kvedge_mono_us();
    r->rh = h;
    r->reply = m;
    s_finish(io, r, h.status, false);
}

/* Grants back what each stream consumed in this drain, in one CREDIT per stream. */
static void s_io_flush_credit(s_io_t *io)
{
    for (size_t i = 0; i < io->n_due; i++) {
        s_req_t *r = zhashx_lookup(io->inflight, S_KEY(io->due[i]));
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

static void s_io_drain(s_io_t *io)
{
    if (!io->down) {
        for (int i = 0; i < S_DRAIN_MAX && (zsock_events(io->dealer) & ZMQ_POLLIN); i++) {
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
        for (int i = 0; i < S_DRAIN_MAX && (zsock_events(io->dealer) & ZMQ_POLLIN); i++) {
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
static void s_io_expire(s_io_t *io, bool all, int status)
{
    int64_t now = kvedge_mono_ms();
    if (!all && now < io->next_deadline)
        return;
    zlistx_t *ended = zlistx_new();
    int64_t next = INT64_MAX;
    for (s_req_t *r = zhashx_first(io->inflight); r; r = zhashx_next(io->inflight)) {
        if (all || now >= r->deadline_ms)
            zlistx_add_end(ended, r);
        else if (r->deadline_ms < next)
            next = r->deadline_ms;
    }
    io->next_deadline = next;
    for (s_req_t *r = zlistx_first(ended); r; r = zlistx_next(ended))
        s_finish(io, r, status, true);
    zlistx_destroy(&ended);
}

/* Takes requests from the pipe; returns false on $TERM. */
static bool s_io_pipe(s_io_t *io, zsock_t *pipe, bool closing)
{
    void *h = zsock_resolve(pipe);
    for (int i = 0; i < S_PIPE_MAX; i++) {
        char buf[16];
        int n = zmq_recv(h, buf, sizeof buf, ZMQ_DONTWAIT);
        if (n < 0)
            break;
        if (n == (int)sizeof(s_req_t *)) {
            s_req_t *r;
            memcpy(&r, buf, sizeof r);
            atomic_fetch_sub(&io->queued, 1);
            if (closing)
                s_finish(io, r, KVEDGE_ECLOSED, false);
            else
                s_io_submit(io, r);
        } else if (n == 5 && memcmp(buf, "$TERM", 5) == 0) {
            return false;
        }
    }
    return true;
}

static void s_io_teardown(s_io_t *io)
{
    zlistx_destroy(&io->held_up);
    zlistx_destroy(&io->held_down);
    zsock_destroy(&io->dealer);
    zhashx_destroy(&io->inflight);
}

/* Sends the emulated uplink's messages that are due. A message the socket refuses fails its
 * request (if it is still in flight). */
static void s_io_flush_up(s_io_t *io)
{
    uint64_t now = kvedge_shaper_now_us();
    s_held_t *h;
    while (io->held_up && (h = zlistx_first(io->held_up)) != NULL && h->due_us <= now) {
        uint64_t id = h->id;
        int rc = zmsg_send(&h->m, io->dealer);
        zlistx_delete(io->held_up, zlistx_cursor(io->held_up));
        s_req_t *r = rc != 0 && id ? zhashx_lookup(io->inflight, S_KEY(id)) : NULL;
        if (r)
            s_finish(io, r, KVEDGE_EBACKLOG, false);
    }
}

/* Milliseconds until the first held message is due (rounded up), or -1 when none is held. */
static int s_io_held_wait(s_io_t *io)
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
static void s_io_free_link(s_io_t *io)
{
    kvedge_meter_destroy(&io->meter);
    kvedge_shaper_destroy(&io->up);
    kvedge_shaper_destroy(&io->down);
}

static void s_actor(zsock_t *pipe, void *args)
{
    s_io_t *io = args;
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

/* ---------------------------------------------------------------- the client */

struct kvedge_client_t {
    zactor_t *actor;         /* the I/O thread */
    pthread_mutex_t pipe_mu; /* zsock pipes are not thread-safe */
    bool closing;            /* destroy has begun: no more sends (under pipe_mu) */
    s_io_t *io;              /* the actor's state, freed after the actor stopped */
    kvedge_node_info_t node; /* HELLO answer */
    uint32_t max_frame;      /* the node's limits from HELLO */
    uint32_t max_items;
    uint32_t max_chunks;
    uint32_t credit;     /* initial credit of a stream */
    uint32_t max_credit; /* the node's, from HELLO */
    uint32_t window;     /* opts.window_bytes */
    int deadline_ms;     /* default deadline */
    /* Direct channels (after HELLO, without an emulated link): idle ones, and how many exist
     * and are checked out, under chan_mu; destroy waits on chan_cv for chan_busy to be 0. */
    bool direct;
    pthread_mutex_t chan_mu;
    pthread_cond_t chan_cv;
    s_io_t *chan_idle[S_CHAN_MAX];
    size_t chan_nidle, chan_n, chan_busy;
    atomic_bool chan_closing;
    /* Threads inside a public call (S_ENTER), under chan_mu: destroy frees the client only
     * when the last has left, so a call that destroy ended reads nothing freed. */
    size_t users;
};

/* A public call's hold on its client, released when the call's scope ends (even by an early
 * return): destroy waits for every hold to go. */
typedef struct {
    kvedge_client_t *c;
} s_user_t;

static s_user_t s_user_enter(kvedge_client_t *c)
{
    s_err_clear();
    if (c) {
        pthread_mutex_lock(&c->chan_mu);
        c->users++;
        pthread_mutex_unlock(&c->chan_mu);
    }
    return (s_user_t){c};
}

static void s_user_leave(s_user_t *u)
{
    if (!u->c)
        return;
    pthread_mutex_lock(&u->c->chan_mu);
    if (--u->c->users == 0)
        pthread_cond_broadcast(&u->c->chan_cv);
    pthread_mutex_unlock(&u->c->chan_mu);
}

/* Starts a public call on c (which may be NULL): clears this thread's message and holds c
 * until the enclosing scope ends. */
#define S_ENTER(c) s_user_t s_user_ __attribute__((cleanup(s_user_leave))) = s_user_enter(c)

static int64_t s_deadline(const kvedge_client_t *c, int deadline_ms)
{
    return kvedge_mono_ms() + (deadline_ms > 0 ? deadline_ms : c->deadline_ms);
}

/* Hands r to the I/O thread, which from now on holds a reference. On failure r is freed. */
static int s_submit(kvedge_client_t *c, s_req_t *r)
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
    s_req_free(r);
    return err;
}

/* ---------------------------------------------------------------- direct channels */

/* A synchronous call need not cross the actor. When a direct channel is free, the calling
 * thread checks it out and runs the actor's own code (s_io_submit, s_io_drain, s_io_expire)
 * on it: a DEALER of its own to the same node with the same key, options and heartbeats. A
 * PING then crosses caller -> libzmq I/O thread -> node -> I/O thread -> caller, two thread
 * handoffs fewer than through the actor's pipe and the future's condition variable. The
 * socket passes between threads only under chan_mu (the full barrier libzmq asks for), and
 * only with nothing in flight on it. Streams and asynchronous calls stay on the actor. */

static s_io_t *s_chan_new(const kvedge_client_t *c)
{
    s_io_t *ch = calloc(1, sizeof *ch);
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

static void s_chan_destroy(s_io_t **ch_p)
{
    if (*ch_p) {
        s_io_expire(*ch_p, true, KVEDGE_ECLOSED); /* nothing is left in flight; defensive */
        s_io_teardown(*ch_p);
        free(*ch_p);
        *ch_p = NULL;
    }
}

/* A free channel for the calling thread, or NULL: the call goes through the actor. */
static s_io_t *s_chan_get(kvedge_client_t *c)
{
    if (!c->direct)
        return NULL;
    s_io_t *ch = NULL;
    bool make = false;
    pthread_mutex_lock(&c->chan_mu);
    if (!atomic_load(&c->chan_closing)) {
        if (c->chan_nidle > 0)
            ch = c->chan_idle[--c->chan_nidle];
        else if (c->chan_n < S_CHAN_MAX)
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
static void s_chan_put(kvedge_client_t *c, s_io_t *ch, bool broken)
{
    pthread_mutex_lock(&c->chan_mu);
    if (broken || zhashx_size(ch->inflight) > 0 || atomic_load(&c->chan_closing)) {
        s_chan_destroy(&ch);
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
static bool s_chan_run(kvedge_client_t *c, s_io_t *ch, const bool *done)
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

/* Where one call's requests go: a direct channel, or (ch NULL) the actor. */
typedef struct {
    kvedge_client_t *c;
    s_io_t *ch;
} s_path_t;

static s_path_t s_path_open(kvedge_client_t *c)
{
    return (s_path_t){c, s_chan_get(c)};
}

static void s_path_close(s_path_t *p, bool broken)
{
    if (p->ch)
        s_chan_put(p->c, p->ch, broken);
    p->ch = NULL;
}

/* Sends r (a unary request) as s_submit does: on failure r is freed. */
static int s_path_submit(s_path_t *p, s_req_t *r)
{
    if (!p->ch)
        return s_submit(p->c, r);
    r->refs = 2;
    s_io_submit(p->ch, r); /* failures complete r at once */
    return KVEDGE_OK;
}

/* Waits for r as s_req_wait does. A broken channel is given back at once (the call's other
 * requests on it have completed with KVEDGE_ECLOSED). */
static int s_path_wait(s_path_t *p, s_req_t *r)
{
    if (!p->ch)
        return s_req_wait(r);
    if (!s_chan_run(p->c, p->ch, &r->done))
        s_path_close(p, true);
    return r->done ? r->status : KVEDGE_ECLOSED;
}

/* Sends a unary request on p and waits. On 0, r holds the reply; the caller releases r. On
 * error, r has been released. */
static int s_call_on(s_path_t *p, s_req_t *r)
{
    int rc = s_path_submit(p, r);
    if (rc != KVEDGE_OK)
        return rc;
    rc = s_path_wait(p, r);
    if (rc != KVEDGE_OK)
        s_req_release(r);
    return rc;
}

/* A request failed that the peer's role does not answer: this thread's message says which
 * daemon does. Returns rc. */
static int s_role_err(const kvedge_client_t *c, uint8_t op, int rc)
{
    if (rc == KVEDGE_OK || rc == KVEDGE_ETIMEDOUT || s_role_serves(c->node.role, op))
        return rc;
    bool proxy = c->node.role == KVEDGE_ROLE_PROXY;
    return s_err(rc, "%s is %s (\"%s\", as its HELLO says): %s is answered by %s", c->io->endpoint,
                 proxy                               ? "an edge proxy"
                 : c->node.role == KVEDGE_ROLE_CLOUD ? "a cloud store node"
                                                     : "an edge store node",
                 c->node.name, kvedge_wire_op_name(op),
                 proxy ? "store nodes (kvedge store): connect to a node's endpoint for it"
                       : "edge proxies (kvedge proxy); a store node streams its layers with "
                         "GET_LAYER (get_layer)");
}

/* s_call_on on a channel of its own when one is free. */
static int s_call(kvedge_client_t *c, s_req_t *r)
{
    uint8_t op = r->opcode;
    s_path_t p = s_path_open(c);
    int rc = s_call_on(&p, r);
    s_path_close(&p, false);
    return s_role_err(c, op, rc);
}

/* A request with one payload frame of len bytes (copied from data, or zeroed when data is
 * NULL); *frame receives its bytes for filling in. */
static s_req_t *s_req_frame(uint8_t opcode, uint32_t count, int64_t deadline, const void *data,
                            size_t len, uint8_t **frame)
{
    s_req_t *r = s_req_new(opcode, count, deadline);
    zmsg_t *m = zmsg_new();
    zframe_t *f = zframe_new(data, len);
    if (!r || !m || !f) {
        zframe_destroy(&f);
        zmsg_destroy(&m);
        if (r)
            s_req_free(r);
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

void kvedge_client_opts_default(kvedge_client_opts_t *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof *opts);
    opts->size = sizeof *opts;
    opts->deadline_ms = KVEDGE_CLIENT_DEADLINE_MS_DEFAULT;
    opts->credit = KVEDGE_CLIENT_CREDIT_DEFAULT;
}

void kvedge_fetch_req_default(kvedge_fetch_req_t *req)
{
    if (!req)
        return;
    memset(req, 0, sizeof *req);
    req->size = sizeof *req;
}

int kvedge_abi_read(void *dst, size_t dst_size, const void *src, size_t min_size, const char *type)
{
    if (!src)
        return s_err(KVEDGE_EINVAL, "%s is NULL", type);
    size_t size;
    memcpy(&size, src, sizeof size); /* every such struct starts with size_t size */
    if (size == 0)
        return s_err(KVEDGE_EINVAL,
                     "%s.size is 0: fill it with its _default function, or set .size = sizeof(%s)",
                     type, type);
    if (size < min_size || size > dst_size)
        return s_err(KVEDGE_EINVAL,
                     "%s.size %zu is no layout this library knows (%zu ... %zu bytes): %s", type,
                     size, min_size, dst_size,
                     size > dst_size ? "the caller was built against newer kvedge headers than the "
                                       "library it runs with"
                                     : "set it with the _default function");
    memcpy(dst, src, size);
    memcpy(dst, &dst_size, sizeof dst_size);
    return KVEDGE_OK;
}

/* HELLO: the node's info and name. */
static int s_hello(kvedge_client_t *c, const char *name)
{
    s_req_t *r = s_req_frame(KVEDGE_OP_HELLO, 0, s_deadline(c, 0), name, strlen(name), NULL);
    if (!r)
        return KVEDGE_ENOMEM;
    int rc = s_call(c, r);
    if (rc != KVEDGE_OK)
        return rc;
    zframe_t *info_f = zmsg_first(r->reply), *name_f = zmsg_next(r->reply);
    kvedge_wire_node_info_t info;
    rc = kvedge_wire_node_info_parse(zframe_data(info_f), zframe_size(info_f), &info);
    if (rc == KVEDGE_OK) {
        c->node.role = (int)info.role;
        memcpy(c->node.tenant_tag, info.tenant_tag, sizeof c->node.tenant_tag);
        c->node.max_items = info.max_items;
        c->node.max_chunks = info.max_chunks;
        size_t len = zframe_size(name_f);
        memcpy(c->node.name, zframe_data(name_f), len); /* 1 ... 255 bytes, validated */
        c->node.name[len] = '\0';
        c->max_frame = info.max_frame_bytes;
        c->max_items = info.max_items;
        c->max_chunks = info.max_chunks;
        if (c->credit > info.max_credit)
            c->credit = info.max_credit;
        c->max_credit = info.max_credit;
    }
    s_req_release(r);
    return rc;
}

static char *s_strdup_or_null(const char *s, bool *failed)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *failed = true;
    return d;
}

/* The options connect refuses, each with this thread's message. */
static int s_connect_check(const kvedge_client_opts_t *opts)
{
    if (!opts || !opts->endpoint || !*opts->endpoint)
        return s_err(KVEDGE_EINVAL, "no endpoint: give tcp://HOST:PORT or ipc://PATH");
    const char *ep = opts->endpoint;
    if (!strstr(ep, "://"))
        return s_err(KVEDGE_EINVAL,
                     "endpoint \"%.200s\" has no transport: an endpoint is tcp://HOST:PORT "
                     "(e.g. tcp://%.200s) or ipc://PATH",
                     ep, strchr(ep, ':') ? ep : "127.0.0.1:7400");
    if (opts->deadline_ms < 0 || opts->deadline_ms > KVEDGE_WIRE_MAX_DEADLINE_MS)
        return s_err(KVEDGE_EINVAL, "deadline_ms %d outside 0 ... %d (0: the default, %d)",
                     opts->deadline_ms, KVEDGE_WIRE_MAX_DEADLINE_MS,
                     KVEDGE_CLIENT_DEADLINE_MS_DEFAULT);
    if (opts->credit > KVEDGE_WIRE_MAX_CREDIT)
        return s_err(KVEDGE_EINVAL, "credit %u above %u", opts->credit, KVEDGE_WIRE_MAX_CREDIT);
    if (opts->window_bytes > KVEDGE_CLIENT_WINDOW_MAX)
        return s_err(KVEDGE_EINVAL, "window_bytes %u above %u", opts->window_bytes,
                     KVEDGE_CLIENT_WINDOW_MAX);
    if (opts->server_key && !opts->client_cert)
        return s_err(KVEDGE_EINVAL, "a server key needs this client's secret certificate "
                                    "(client_cert: PATH_secret of kvedge keygen PATH)");
    const char *name = opts->name ? opts->name : S_NAME_DEFAULT;
    if (strlen(name) < 1 || strlen(name) > KVEDGE_WIRE_MAX_NAME_BYTES)
        return s_err(KVEDGE_EINVAL, "name is %zu bytes: 1 ... %d", strlen(name),
                     KVEDGE_WIRE_MAX_NAME_BYTES);
    return KVEDGE_OK;
}

int kvedge_client_connect(const kvedge_client_opts_t *opts, kvedge_client_t **out)
{
    s_err_clear();
    if (!out)
        return s_err(KVEDGE_EINVAL, "no place for the client (out is NULL)");
    *out = NULL;
    kvedge_client_opts_t o; /* the caller's, in this library's layout */
    if (opts) {
        kvedge_client_opts_default(&o);
        int rc = kvedge_abi_read(&o, sizeof o, opts, KVEDGE_CLIENT_OPTS_SIZE_MIN, "opts");
        if (rc != KVEDGE_OK)
            return rc;
        opts = &o;
    }
    int rc = s_connect_check(opts);
    if (rc != KVEDGE_OK)
        return rc;
    const char *name = opts->name ? opts->name : S_NAME_DEFAULT;
    /* czmq would install process-wide SIGINT/SIGTERM handlers on first use and swallow the
     * application's Ctrl-C; a library must not change that. */
    zsys_handler_set(NULL);
    kvedge_client_t *c = calloc(1, sizeof *c);
    s_io_t *io = calloc(1, sizeof *io);
    bool failed = !c || !io;
    int link_rc = KVEDGE_OK;
    if (io) {
        io->endpoint = s_strdup_or_null(opts->endpoint, &failed);
        io->server_key = s_strdup_or_null(opts->server_key, &failed);
        io->client_cert = s_strdup_or_null(opts->server_key ? opts->client_cert : NULL, &failed);
        io->meter = kvedge_meter_new(0);
        failed |= !io->meter;
        if (opts->link && *opts->link) {
            uint64_t rate = 0;
            uint32_t latency = 0;
            link_rc = kvedge_shaper_parse(opts->link, &rate, &latency);
            if (link_rc == KVEDGE_OK) {
                io->up = kvedge_shaper_new(rate, latency, 0);
                io->down = kvedge_shaper_new(rate, latency, 0);
                failed |= !io->up || !io->down;
            }
        }
    }
    if (failed || link_rc != KVEDGE_OK) {
        if (io) {
            free(io->endpoint);
            free(io->server_key);
            free(io->client_cert);
            s_io_free_link(io);
        }
        free(io);
        free(c);
        if (link_rc != KVEDGE_OK)
            return s_err(link_rc, "link \"%.200s\": expected RATE,LATENCY (e.g. 100mbit,20ms)",
                         opts->link);
        return KVEDGE_ENOMEM;
    }
    pthread_mutex_init(&c->pipe_mu, NULL);
    pthread_mutex_init(&c->chan_mu, NULL);
    pthread_cond_init(&c->chan_cv, NULL);
    atomic_init(&c->chan_closing, false);
    c->io = io;
    c->deadline_ms = opts->deadline_ms ? opts->deadline_ms : KVEDGE_CLIENT_DEADLINE_MS_DEFAULT;
    c->credit = opts->credit ? opts->credit : KVEDGE_CLIENT_CREDIT_DEFAULT;
    c->window = opts->window_bytes ? opts->window_bytes : KVEDGE_CLIENT_WINDOW_DEFAULT;
    c->actor = zactor_new(s_actor, io);
    rc = !c->actor ? KVEDGE_ENOMEM : io->setup_rc;
    if (rc != KVEDGE_OK && io->setup_why[0])
        s_err(rc, "%s", io->setup_why);
    if (rc == KVEDGE_OK) {
        rc = s_hello(c, name);
        if (rc == KVEDGE_ETIMEDOUT)
            s_err(rc, "no answer from %.200s within %d ms: nothing serves there%s", opts->endpoint,
                  c->deadline_ms,
                  opts->server_key
                      ? ", or the server key is not the node's, or the node does not allowlist "
                        "this client's certificate (CURVE refusals are silent)"
                      : ", or it runs with CURVE and ignores plaintext clients (give its "
                        "server key and this client's certificate)");
    }
    if (rc != KVEDGE_OK) {
        kvedge_client_destroy(&c);
        return rc;
    }
    /* Synchronous calls may go direct from now on; an emulated link lives in the actor. */
    c->direct = io->up == NULL;
    *out = c;
    return KVEDGE_OK;
}

void kvedge_client_destroy(kvedge_client_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_client_t *c = *self_p;
    *self_p = NULL;
    /* From here only zactor_destroy uses the pipe; a callback that calls the client while
     * it closes gets KVEDGE_ECLOSED instead of waiting for a lock destroy holds. */
    pthread_mutex_lock(&c->pipe_mu);
    c->closing = true;
    pthread_mutex_unlock(&c->pipe_mu);
    /* Callers on direct channels end their calls with KVEDGE_ECLOSED within a slice. */
    pthread_mutex_lock(&c->chan_mu);
    atomic_store(&c->chan_closing, true);
    while (c->chan_busy > 0)
        pthread_cond_wait(&c->chan_cv, &c->chan_mu);
    while (c->chan_nidle > 0)
        s_chan_destroy(&c->chan_idle[--c->chan_nidle]);
    pthread_mutex_unlock(&c->chan_mu);
    zactor_destroy(&c->actor); /* $TERM: everything in flight ends with KVEDGE_ECLOSED */
    /* Calls that destroy ended may still be on their way out. */
    pthread_mutex_lock(&c->chan_mu);
    while (c->users > 0)
        pthread_cond_wait(&c->chan_cv, &c->chan_mu);
    pthread_mutex_unlock(&c->chan_mu);
    pthread_cond_destroy(&c->chan_cv);
    pthread_mutex_destroy(&c->chan_mu);
    pthread_mutex_destroy(&c->pipe_mu);
    free(c->io->endpoint);
    free(c->io->server_key);
    free(c->io->client_cert);
    s_io_free_link(c->io);
    free(c->io);
    free(c);
}

int kvedge_client_link(kvedge_client_t *c, double *bw_bytes_per_s, double *rtt_us,
                       uint64_t *samples)
{
    S_ENTER(c);
    if (!c)
        return KVEDGE_EINVAL;
    kvedge_meter_stats_t st;
    int rc = kvedge_meter_stats(c->io->meter, &st);
    if (rc != KVEDGE_OK)
        return rc;
    if (bw_bytes_per_s)
        *bw_bytes_per_s = st.bw_bytes_per_s;
    if (rtt_us)
        *rtt_us = st.rtt_us;
    if (samples)
        *samples = st.samples;
    return KVEDGE_OK;
}

const kvedge_node_info_t *kvedge_client_node(kvedge_client_t *c)
{
    return c ? &c->node : NULL;
}

/* ---------------------------------------------------------------- ping, model, stat */

static uint8_t s_ping_byte(size_t i)
{
    return (uint8_t)((i * 2654435761u) >> 13);
}

/* One PING of bytes; *rtt_us receives the round trip the I/O thread measured. */
static int s_ping_once(kvedge_client_t *c, size_t bytes, double *rtt_us)
{
    uint8_t *p;
    s_req_t *r = s_req_frame(KVEDGE_OP_PING, 0, s_deadline(c, 0), NULL, bytes, &p);
    if (!r)
        return KVEDGE_ENOMEM;
    for (size_t i = 0; i < bytes; i++)
        p[i] = s_ping_byte(i);
    int rc = s_call(c, r);
    if (rc != KVEDGE_OK)
        return rc;
    zframe_t *f = zmsg_first(r->reply);
    if (zframe_size(f) != bytes)
        rc = KVEDGE_EPROTO;
    for (size_t i = 0; rc == KVEDGE_OK && i < bytes; i++)
        if (zframe_data(f)[i] != s_ping_byte(i))
            rc = KVEDGE_EPROTO;
    *rtt_us = (double)(r->done_us - r->sent_us);
    s_req_release(r);
    return rc;
}

/* rtt from a tiny ping; bandwidth from a second one of `bytes` (sent and echoed, so 2 x bytes
 * moved), with the tiny ping's latency taken out when it is smaller. */
int kvedge_client_ping(kvedge_client_t *c, size_t bytes, double *rtt_us, double *bw_bytes_per_s)
{
    S_ENTER(c);
    if (!c || bytes > KVEDGE_WIRE_MAX_PING_BYTES)
        return KVEDGE_EINVAL;
    double rtt = 0, big = 0;
    int rc = s_ping_once(c, S_PING_TINY_BYTES, &rtt);
    if (rc == KVEDGE_OK && bytes > 0)
        rc = s_ping_once(c, bytes, &big);
    if (rc != KVEDGE_OK)
        return rc;
    if (rtt_us)
        *rtt_us = rtt;
    if (bw_bytes_per_s) {
        double t = big > rtt ? big - rtt : big;
        *bw_bytes_per_s = bytes > 0 && t > 0 ? 2.0 * (double)bytes * 1e6 / t : 0;
    }
    return KVEDGE_OK;
}

/* One MODEL exchange: registers model (put) or asks about query_id (a query); *have receives
 * the node's record of the id. */
static int s_model_call(kvedge_client_t *c, const kvedge_model_t *model, const char *query_id,
                        kvedge_model_t *have)
{
    uint8_t *p;
    s_req_t *r =
        s_req_frame(KVEDGE_OP_MODEL, 0, s_deadline(c, 0), NULL, KVEDGE_WIRE_MODEL_BYTES, &p);
    if (!r)
        return KVEDGE_ENOMEM;
    if ((model ? kvedge_wire_model_pack(model, p) : kvedge_wire_model_query_pack(query_id, p)) !=
        KVEDGE_OK) {
        s_req_free(r);
        return KVEDGE_EINVAL;
    }
    int rc = s_call(c, r);
    if (rc != KVEDGE_OK)
        return rc;
    zframe_t *f = zmsg_first(r->reply);
    rc = kvedge_wire_model_parse(zframe_data(f), zframe_size(f), have);
    s_req_release(r);
    return rc;
}

int kvedge_client_get_model(kvedge_client_t *c, const char *id, kvedge_model_t *out)
{
    S_ENTER(c);
    if (!c || !id || !out)
        return KVEDGE_EINVAL;
    int rc = s_model_call(c, NULL, id, out);
    if (rc == KVEDGE_OK && strcmp(out->id, id) != 0)
        rc = KVEDGE_EPROTO; /* an answer about another model */
    return rc;
}

int kvedge_client_put_model(kvedge_client_t *c, const kvedge_model_t *model)
{
    S_ENTER(c);
    if (!c || !model)
        return KVEDGE_EINVAL;
    kvedge_model_t have;
    int rc = s_model_call(c, model, NULL, &have);
    if (rc == KVEDGE_OK && (strcmp(have.id, model->id) != 0 || have.layers != model->layers ||
                            have.kv_heads != model->kv_heads || have.head_dim != model->head_dim ||
                            have.dtype != model->dtype))
        rc = KVEDGE_ESHAPE; /* the node has another shape under this id */
    return rc;
}

#define S_LIST_PAGE_ENTRIES 1024 /* LIST entries asked for per round trip */

int kvedge_client_list_all(kvedge_client_t *c, kvedge_chunk_entry_t **out, size_t *n)
{
    S_ENTER(c);
    size_t cap = S_LIST_PAGE_ENTRIES, len = 0;
    kvedge_chunk_entry_t *all = malloc(cap * sizeof *all);
    bool more = true;
    int rc = all ? KVEDGE_OK : KVEDGE_ENOMEM;
    while (rc == KVEDGE_OK && more) {
        if (cap - len < S_LIST_PAGE_ENTRIES) {
            kvedge_chunk_entry_t *p = realloc(all, (cap *= 2) * sizeof *all);
            if (!p) {
                rc = KVEDGE_ENOMEM;
                break;
            }
            all = p;
        }
        size_t got = 0;
        rc = kvedge_client_list(c, len ? &all[len - 1].chunk.id : NULL, all + len,
                                S_LIST_PAGE_ENTRIES, &got, &more);
        len += got;
        if (got == 0)
            more = false;
    }
    if (rc != KVEDGE_OK) {
        free(all);
        return rc;
    }
    *out = all;
    *n = len;
    return KVEDGE_OK;
}

int kvedge_client_stat(kvedge_client_t *c, kvedge_store_stats_t *out)
{
    S_ENTER(c);
    if (!c || !out)
        return KVEDGE_EINVAL;
    s_req_t *r = s_req_new(KVEDGE_OP_STAT, 0, s_deadline(c, 0));
    if (!r)
        return KVEDGE_ENOMEM;
    int rc = s_call(c, r);
    if (rc != KVEDGE_OK)
        return rc;
    zframe_t *f = zmsg_first(r->reply);
    rc = kvedge_wire_stats_parse(zframe_data(f), zframe_size(f), out);
    s_req_release(r);
    return rc;
}

int kvedge_client_monitor(kvedge_client_t *c, uint32_t top, char **json, size_t *len)
{
    S_ENTER(c);
    if (!c || !json || top > KVEDGE_WIRE_MAX_MONITOR_TOP)
        return KVEDGE_EINVAL;
    *json = NULL;
    uint8_t *p;
    s_req_t *r = s_req_frame(KVEDGE_OP_MONITOR, 0, s_deadline(c, 0), NULL, 4, &p);
    if (!r)
        return KVEDGE_ENOMEM;
    kvedge_le_put16(p, (uint16_t)top);
    kvedge_le_put16(p + 2, 0);
    int rc = s_call(c, r);
    if (rc != KVEDGE_OK)
        return rc;
    zframe_t *f = zmsg_first(r->reply); /* validated: 2 ... 1 MiB, a '{' first, no NUL */
    char *out = malloc(zframe_size(f) + 1);
    if (out) {
        memcpy(out, zframe_data(f), zframe_size(f));
        out[zframe_size(f)] = '\0';
        if (len)
            *len = zframe_size(f);
    }
    s_req_release(r);
    *json = out;
    return out ? KVEDGE_OK : KVEDGE_ENOMEM;
}

int kvedge_client_evict(kvedge_client_t *c, uint64_t target_bytes, uint64_t *blocks,
                        uint64_t *bytes)
{
    S_ENTER(c);
    if (!c)
        return KVEDGE_EINVAL;
    uint8_t *p;
    s_req_t *r = s_req_frame(KVEDGE_OP_EVICT, 0, s_deadline(c, 0), NULL, 8, &p);
    if (!r)
        return KVEDGE_ENOMEM;
    kvedge_le_put32(p, (uint32_t)target_bytes);
    kvedge_le_put32(p + 4, (uint32_t)(target_bytes >> 32));
    int rc = s_call(c, r);
    if (rc != KVEDGE_OK)
        return rc;
    const uint8_t *d = zframe_data(zmsg_first(r->reply));
    if (blocks)
        *blocks = (uint64_t)kvedge_le_get32(d) | (uint64_t)kvedge_le_get32(d + 4) << 32;
    if (bytes)
        *bytes = (uint64_t)kvedge_le_get32(d + 8) | (uint64_t)kvedge_le_get32(d + 12) << 32;
    s_req_release(r);
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- put */

/* A PUT or GET message of one call in flight: the request and the items it carries. */
typedef struct {
    s_req_t *r;
    size_t *idx; /* item (or key) indices, in message order */
    uint32_t n;
    int rc; /* submission result */
} s_batch_t;

static void s_batch_clear(s_batch_t *b)
{
    free(b->idx);
    memset(b, 0, sizeof *b);
}

/* Packs items from *next into one PUT message: at most max_items items and S_PUT_BATCH_BYTES
 * of payload (a single larger item travels alone). Items that cannot be sent get their status
 * here. b->n is 0 when nothing was left to send. */
static int s_put_batch(const kvedge_client_t *c, const kvedge_put_item_t *items, size_t n,
                       size_t *next, int *st, int64_t deadline, s_batch_t *b)
{
    uint32_t max_items =
        c->max_items < KVEDGE_WIRE_MAX_ITEMS ? c->max_items : KVEDGE_WIRE_MAX_ITEMS;
    b->idx = malloc(max_items * sizeof *b->idx);
    zmsg_t *m = zmsg_new();
    if (!b->idx || !m) {
        zmsg_destroy(&m);
        return KVEDGE_ENOMEM;
    }
    size_t bytes = 0;
    while (*next < n && b->n < max_items) {
        size_t i = *next;
        const kvedge_put_item_t *it = &items[i];
        if (!it->block || it->len == 0) {
            st[i] = KVEDGE_EINVAL;
            (*next)++;
            continue;
        }
        if (it->len > c->max_frame) {
            st[i] = KVEDGE_ETOOBIG;
            (*next)++;
            continue;
        }
        size_t need = KVEDGE_WIRE_PUT_ITEM_BYTES + it->len;
        if (b->n > 0 && bytes + need > S_PUT_BATCH_BYTES)
            break;
        kvedge_wire_put_item_t w = {it->chunk, it->layer, it->head, it->pin, it->ttl_s};
        uint8_t hdr[KVEDGE_WIRE_PUT_ITEM_BYTES];
        if (kvedge_wire_put_item_pack(&w, hdr) != KVEDGE_OK) {
            st[i] = KVEDGE_EINVAL;
            (*next)++;
            continue;
        }
        if (zmsg_addmem(m, hdr, sizeof hdr) != 0 || zmsg_addmem(m, it->block, it->len) != 0) {
            zmsg_destroy(&m);
            return KVEDGE_ENOMEM;
        }
        bytes += need;
        b->idx[b->n++] = i;
        (*next)++;
    }
    if (b->n == 0) {
        zmsg_destroy(&m);
        return KVEDGE_OK;
    }
    b->r = s_req_new(KVEDGE_OP_PUT, b->n, deadline);
    if (!b->r) {
        zmsg_destroy(&m);
        return KVEDGE_ENOMEM;
    }
    b->r->payload = m;
    return KVEDGE_OK;
}

/* Waits for a PUT message and spreads its statuses over the items it carried. */
static void s_put_collect(s_path_t *path, s_batch_t *b, int *st)
{
    int rc = b->rc == KVEDGE_OK ? s_path_wait(path, b->r) : b->rc;
    if (rc == KVEDGE_OK && b->r->rh.count != b->n)
        rc = KVEDGE_EPROTO;
    const uint8_t *p = rc == KVEDGE_OK ? zframe_data(zmsg_first(b->r->reply)) : NULL;
    for (uint32_t k = 0; k < b->n; k++)
        st[b->idx[k]] =
            p ? kvedge_err_from_wire((int32_t)kvedge_le_get32(p + (size_t)k * S_STATUS_BYTES)) : rc;
    if (b->rc == KVEDGE_OK)
        s_req_release(b->r);
    s_batch_clear(b);
}

int kvedge_client_put(kvedge_client_t *c, const kvedge_put_item_t *items, size_t n, int *statuses)
{
    S_ENTER(c);
    if (!c || (n && !items))
        return KVEDGE_EINVAL;
    if (n == 0)
        return KVEDGE_OK;
    int *st = statuses ? statuses : malloc(n * sizeof *st);
    if (!st)
        return KVEDGE_ENOMEM;
    int64_t deadline = s_deadline(c, 0);
    s_batch_t win[S_PUT_PIPELINE];
    memset(win, 0, sizeof win);
    size_t next = 0, head = 0, used = 0;
    int rc = KVEDGE_OK;
    s_path_t path = s_path_open(c);
    while ((next < n && rc == KVEDGE_OK) || used > 0) {
        if (next < n && rc == KVEDGE_OK && used < S_PUT_PIPELINE) {
            s_batch_t *b = &win[(head + used) % S_PUT_PIPELINE];
            size_t first = next;
            rc = s_put_batch(c, items, n, &next, st, deadline, b);
            if (rc != KVEDGE_OK) {
                for (size_t i = first; i < n; i++)
                    st[i] = rc; /* out of memory: this and the rest are not sent */
                next = n;
                s_batch_clear(b);
            } else if (b->n > 0) {
                b->rc = s_path_submit(&path, b->r);
                used++;
            } else {
                s_batch_clear(b);
            }
            continue;
        }
        s_put_collect(&path, &win[head], st);
        head = (head + 1) % S_PUT_PIPELINE;
        used--;
    }
    s_path_close(&path, false);
    rc = KVEDGE_OK;
    for (size_t i = 0; i < n && rc == KVEDGE_OK; i++)
        rc = st[i];
    if (st != statuses)
        free(st);
    return s_role_err(c, KVEDGE_OP_PUT, rc);
}

/* ---------------------------------------------------------------- get */

/* A GET reply spread over its keys: st[k] and, for status 0, blocks[k] (owned). */
static int s_get_parse(s_req_t *r, uint32_t n, int *st, zframe_t **blocks)
{
    if (r->rh.count != n)
        return KVEDGE_EPROTO;
    zframe_t *sf = zmsg_pop(r->reply);
    for (uint32_t k = 0; k < n; k++) {
        st[k] = kvedge_err_from_wire(
            (int32_t)kvedge_le_get32(zframe_data(sf) + (size_t)k * S_STATUS_BYTES));
        blocks[k] = st[k] == KVEDGE_OK ? zmsg_pop(r->reply) : NULL; /* counts validated */
    }
    zframe_destroy(&sf);
    return KVEDGE_OK;
}

static s_req_t *s_get_request(const kvedge_block_key_t *keys, const size_t *idx, uint32_t n,
                              int64_t deadline)
{
    uint8_t *p;
    s_req_t *r =
        s_req_frame(KVEDGE_OP_GET, n, deadline, NULL, (size_t)n * KVEDGE_WIRE_KEY_BYTES, &p);
    for (uint32_t k = 0; r && k < n; k++)
        kvedge_wire_key_pack(&keys[idx[k]], p + (size_t)k * KVEDGE_WIRE_KEY_BYTES);
    return r;
}

/* Fetches again, one round trip at a time, the keys of a batch the node left out of its
 * reply for size (KVEDGE_ETOOBIG: past KVEDGE_WIRE_MAX_REPLY_BYTES). Every round brings at
 * least the first of them, so this ends. */
static void s_get_refetch(s_path_t *path, const kvedge_block_key_t *keys, s_batch_t *b,
                          int64_t deadline, int *st, zframe_t **blocks)
{
    size_t *sub = malloc(b->n * sizeof *sub), *pos = malloc(b->n * sizeof *pos);
    int *sst = malloc(b->n * sizeof *sst);
    zframe_t **sbl = malloc(b->n * sizeof *sbl);
    while (sub && pos && sst && sbl) {
        uint32_t m = 0;
        for (uint32_t k = 0; k < b->n; k++)
            if (st[k] == KVEDGE_ETOOBIG) {
                pos[m] = k;
                sub[m++] = b->idx[k];
            }
        if (m == 0)
            break;
        s_req_t *r = s_get_request(keys, sub, m, deadline);
        int rc = r ? s_call_on(path, r) : KVEDGE_ENOMEM;
        if (rc == KVEDGE_OK) {
            rc = s_get_parse(r, m, sst, sbl);
            s_req_release(r);
        }
        if (rc != KVEDGE_OK) {
            for (uint32_t j = 0; j < m; j++)
                st[pos[j]] = rc;
            break;
        }
        for (uint32_t j = 0; j < m; j++) {
            st[pos[j]] = sst[j];
            blocks[pos[j]] = sbl[j];
        }
        if (sst[0] == KVEDGE_ETOOBIG)
            break; /* no progress: the node will not send it */
    }
    free(sub);
    free(pos);
    free(sst);
    free(sbl);
}

typedef struct {
    uint8_t *buf;
    size_t cap, used;
    bool full; /* a block did not fit: every later block is KVEDGE_ENOSPACE */
} s_sink_t;

/* Lands one fetched head in the caller's buffer, one after the other. */
static void s_sink_put(s_sink_t *s, int status, const uint8_t *data, size_t len,
                       kvedge_fetched_t *out)
{
    out->status = status;
    out->offset = 0;
    out->len = 0;
    if (status != KVEDGE_OK)
        return;
    out->len = len;
    if (s->full || len > s->cap - s->used) {
        s->full = true;
        out->status = KVEDGE_ENOSPACE; /* len says how much it needs */
        return;
    }
    memcpy(s->buf + s->used, data, len);
    out->offset = s->used;
    s->used += len;
}

/* Waits for one GET message, completes it and lands its blocks in key order. Returns the
 * message's transport error, or 0. */
static int s_get_collect(s_path_t *path, const kvedge_block_key_t *keys, s_batch_t *b,
                         int64_t deadline, s_sink_t *sink, kvedge_fetched_t *out)
{
    int *st = malloc(b->n * sizeof *st);
    zframe_t **blocks = calloc(b->n, sizeof *blocks);
    int rc = b->rc == KVEDGE_OK ? s_path_wait(path, b->r) : b->rc;
    if (rc == KVEDGE_OK)
        rc = st && blocks ? s_get_parse(b->r, b->n, st, blocks) : KVEDGE_ENOMEM;
    if (b->rc == KVEDGE_OK)
        s_req_release(b->r);
    if (rc == KVEDGE_OK)
        s_get_refetch(path, keys, b, deadline, st, blocks);
    for (uint32_t k = 0; k < b->n; k++) {
        kvedge_fetched_t *o = &out[b->idx[k]];
        if (rc != KVEDGE_OK) {
            *o = (kvedge_fetched_t){rc, 0, 0};
            continue;
        }
        s_sink_put(sink, st[k], blocks[k] ? zframe_data(blocks[k]) : NULL,
                   blocks[k] ? zframe_size(blocks[k]) : 0, o);
        zframe_destroy(&blocks[k]);
    }
    free(st);
    free(blocks);
    s_batch_clear(b);
    return rc;
}

/* Keys go in messages of the node's max_items, two in flight; blocks land in key order. Once
 * one block does not fit, it and every later block found get KVEDGE_ENOSPACE with len set to
 * the bytes it needs (so offsets stay in key order); misses keep their own status. */
int kvedge_client_get(kvedge_client_t *c, const kvedge_block_key_t *keys, size_t n, uint8_t *buf,
                      size_t cap, kvedge_fetched_t *out)
{
    S_ENTER(c);
    if (!c || (n && (!keys || !out)) || (cap && !buf))
        return KVEDGE_EINVAL;
    if (n == 0)
        return KVEDGE_OK;
    int64_t deadline = s_deadline(c, 0);
    uint32_t per = c->max_items < KVEDGE_WIRE_MAX_ITEMS ? c->max_items : KVEDGE_WIRE_MAX_ITEMS;
    s_sink_t sink = {buf, cap, 0, false};
    s_batch_t win[S_GET_PIPELINE];
    memset(win, 0, sizeof win);
    size_t next = 0, head = 0, used = 0;
    int rc = KVEDGE_OK;
    s_path_t path = s_path_open(c);
    while (next < n || used > 0) {
        if (next < n && used < S_GET_PIPELINE) {
            s_batch_t *b = &win[(head + used) % S_GET_PIPELINE];
            b->n = (uint32_t)(n - next < per ? n - next : per);
            b->idx = malloc(b->n * sizeof *b->idx);
            for (uint32_t k = 0; b->idx && k < b->n; k++)
                b->idx[k] = next + k;
            b->r = b->idx ? s_get_request(keys, b->idx, b->n, deadline) : NULL;
            if (!b->r) {
                for (size_t i = next; i < n; i++)
                    out[i] = (kvedge_fetched_t){KVEDGE_ENOMEM, 0, 0};
                rc = rc ? rc : KVEDGE_ENOMEM;
                next = n;
                s_batch_clear(b);
                continue;
            }
            b->rc = s_path_submit(&path, b->r);
            next += b->n;
            used++;
            continue;
        }
        int brc = s_get_collect(&path, keys, &win[head], deadline, &sink, out);
        rc = rc ? rc : brc;
        head = (head + 1) % S_GET_PIPELINE;
        used--;
    }
    s_path_close(&path, false);
    if (rc == KVEDGE_OK && sink.full)
        rc = KVEDGE_ENOSPACE;
    return s_role_err(c, KVEDGE_OP_GET, rc);
}

/* ---------------------------------------------------------------- get_layer */

static int s_layer_request(kvedge_client_t *c, const kvedge_chunk_id_t *chunks, size_t n,
                           uint16_t layer, const kvedge_prec_t *accept, size_t n_accept,
                           int deadline_ms, kvedge_block_fn *on_block, kvedge_done_fn *on_done,
                           void *ctx, s_req_t **out);

/* One stream of n <= the node's max_chunks chunks (KVEDGE_EINVAL past it); the deadline
 * covers the whole stream. */
int kvedge_client_get_layer_async(kvedge_client_t *c, const kvedge_chunk_id_t *chunks, size_t n,
                                  uint16_t layer, int deadline_ms, kvedge_block_fn *on_block,
                                  kvedge_done_fn *on_done, void *ctx)
{
    S_ENTER(c);
    return kvedge_client_get_layer_prec_async(c, chunks, n, layer, NULL, 0, deadline_ms, on_block,
                                              on_done, ctx);
}

int kvedge_client_get_layer_prec_async(kvedge_client_t *c, const kvedge_chunk_id_t *chunks,
                                       size_t n, uint16_t layer, const kvedge_prec_t *accept,
                                       size_t n_accept, int deadline_ms, kvedge_block_fn *on_block,
                                       kvedge_done_fn *on_done, void *ctx)
{
    S_ENTER(c);
    s_req_t *r;
    int rc = s_layer_request(c, chunks, n, layer, accept, n_accept, deadline_ms, on_block, on_done,
                             ctx, &r);
    return rc == KVEDGE_OK ? s_submit(c, r) : rc;
}

/* A GET_LAYER stream's request, not yet sent. */
static int s_layer_request(kvedge_client_t *c, const kvedge_chunk_id_t *chunks, size_t n,
                           uint16_t layer, const kvedge_prec_t *accept, size_t n_accept,
                           int deadline_ms, kvedge_block_fn *on_block, kvedge_done_fn *on_done,
                           void *ctx, s_req_t **out)
{
    if (!c || !chunks || n == 0 || n > c->max_chunks || deadline_ms < 0 ||
        deadline_ms > KVEDGE_WIRE_MAX_DEADLINE_MS ||
        (accept && kvedge_prec_list_check(accept, n_accept) != KVEDGE_OK) || (!accept && n_accept))
        return KVEDGE_EINVAL;
    uint8_t *p;
    s_req_t *r = s_req_frame(KVEDGE_OP_GET_LAYER, (uint32_t)n, s_deadline(c, deadline_ms), NULL,
                             4 + n * KVEDGE_CHUNK_ID_BYTES, &p);
    if (!r)
        return KVEDGE_ENOMEM;
    p[0] = (uint8_t)layer; /* layer u16 LE | reserved u16 | chunk ids */
    p[1] = (uint8_t)(layer >> 8);
    memcpy(p + 4, chunks, n * KVEDGE_CHUNK_ID_BYTES);
    if (accept && zmsg_addmem(r->payload, accept, n_accept) != 0) {
        s_req_free(r);
        return KVEDGE_ENOMEM;
    }
    r->stream = true;
    r->credit = c->credit;
    r->credit_max = c->max_credit;
    r->window = c->window;
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
    s_sink_t sink;
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
            s_sink_put(&l->sink, status, data, len, &l->out[l->received]);
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
    S_ENTER(c);
    return kvedge_client_get_layer_prec(c, chunks, n, layer, NULL, 0, buf, cap, out, out_cap,
                                        heads);
}

int kvedge_client_get_layer_prec(kvedge_client_t *c, const kvedge_chunk_id_t *chunks, size_t n,
                                 uint16_t layer, const kvedge_prec_t *accept, size_t n_accept,
                                 uint8_t *buf, size_t cap, kvedge_fetched_t *out, size_t out_cap,
                                 uint32_t *heads)
{
    S_ENTER(c);
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
    l->sink = (s_sink_t){buf, cap, 0, false};
    l->out = out;
    l->out_cap = out_cap;
    int64_t until = s_deadline(c, 0) + S_WAIT_MARGIN_MS;
    s_path_t path = s_path_open(c);
    int rc;
    if (!path.ch) {
        rc = kvedge_client_get_layer_prec_async(c, chunks, n, layer, accept, n_accept, 0,
                                                s_layer_block, s_layer_done, l);
    } else {
        /* Direct: the stream runs on this thread's channel, its callbacks here too. */
        s_req_t *r;
        rc = s_layer_request(c, chunks, n, layer, accept, n_accept, 0, s_layer_block, s_layer_done,
                             l, &r);
        if (rc == KVEDGE_OK) {
            s_io_submit(path.ch, r); /* failures end the stream (on_done) at once */
            if (!s_chan_run(c, path.ch, &l->done))
                s_path_close(&path, true);
        }
    }
    s_path_close(&path, false);
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
    return s_role_err(c, KVEDGE_OP_GET_LAYER, rc);
}

/* ---------------------------------------------------------------- chunk operations */

static uint32_t s_per_chunks(const kvedge_client_t *c)
{
    return c->max_chunks < KVEDGE_WIRE_MAX_CHUNKS ? c->max_chunks : KVEDGE_WIRE_MAX_CHUNKS;
}

/* A request carrying n chunk ids. */
static s_req_t *s_ids_request(uint8_t opcode, const kvedge_chunk_id_t *ids, uint32_t n,
                              int64_t deadline)
{
    return s_req_frame(opcode, n, deadline, ids, (size_t)n * KVEDGE_CHUNK_ID_BYTES, NULL);
}

int kvedge_client_lookup(kvedge_client_t *c, const kvedge_chunk_id_t *ids, size_t n, size_t *hit)
{
    S_ENTER(c);
    if (!c || (n && !ids) || !hit)
        return KVEDGE_EINVAL;
    *hit = 0;
    int64_t deadline = s_deadline(c, 0);
    uint32_t per = s_per_chunks(c);
    /* The prefix continues into the next message only while every chunk so far is held. */
    for (size_t off = 0; off < n;) {
        uint32_t k = (uint32_t)(n - off < per ? n - off : per);
        s_req_t *r = s_ids_request(KVEDGE_OP_LOOKUP, ids + off, k, deadline);
        int rc = r ? s_call(c, r) : KVEDGE_ENOMEM;
        if (rc != KVEDGE_OK)
            return rc;
        uint32_t got = r->rh.count;
        s_req_release(r);
        if (got > k)
            return KVEDGE_EPROTO;
        *hit += got;
        if (got < k)
            break;
        off += k;
    }
    return KVEDGE_OK;
}

/* DELETE, PIN, UNPIN: one u32 per chunk. */
static int s_chunks_op(kvedge_client_t *c, uint8_t opcode, const kvedge_chunk_id_t *ids, size_t n,
                       uint32_t *changed)
{
    if (!c || (n && !ids))
        return KVEDGE_EINVAL;
    int64_t deadline = s_deadline(c, 0);
    uint32_t per = s_per_chunks(c);
    for (size_t off = 0; off < n;) {
        uint32_t k = (uint32_t)(n - off < per ? n - off : per);
        s_req_t *r = s_ids_request(opcode, ids + off, k, deadline);
        int rc = r ? s_call(c, r) : KVEDGE_ENOMEM;
        if (rc != KVEDGE_OK)
            return rc;
        if (r->rh.count != k)
            rc = KVEDGE_EPROTO;
        const uint8_t *p = zframe_data(zmsg_first(r->reply));
        for (uint32_t j = 0; rc == KVEDGE_OK && changed && j < k; j++)
            changed[off + j] = kvedge_le_get32(p + (size_t)j * 4);
        s_req_release(r);
        if (rc != KVEDGE_OK)
            return rc;
        off += k;
    }
    return KVEDGE_OK;
}

int kvedge_client_delete(kvedge_client_t *c, const kvedge_chunk_id_t *ids, size_t n,
                         uint32_t *changed)
{
    S_ENTER(c);
    return s_chunks_op(c, KVEDGE_OP_DELETE, ids, n, changed);
}

int kvedge_client_pin(kvedge_client_t *c, const kvedge_chunk_id_t *ids, size_t n, bool pin,
                      uint32_t *changed)
{
    S_ENTER(c);
    return s_chunks_op(c, pin ? KVEDGE_OP_PIN : KVEDGE_OP_UNPIN, ids, n, changed);
}

int kvedge_client_list(kvedge_client_t *c, const kvedge_chunk_id_t *after,
                       kvedge_chunk_entry_t *out, size_t max, size_t *n, bool *more)
{
    S_ENTER(c);
    if (!c || !out || max == 0 || !n)
        return KVEDGE_EINVAL;
    *n = 0;
    uint32_t want = max < KVEDGE_WIRE_MAX_LIST ? (uint32_t)max : KVEDGE_WIRE_MAX_LIST;
    s_req_t *r = s_req_frame(KVEDGE_OP_LIST, 0, s_deadline(c, 0), after,
                             after ? KVEDGE_CHUNK_ID_BYTES : 0, NULL);
    uint8_t w[4];
    kvedge_le_put32(w, want);
    if (r && zmsg_addmem(r->payload, w, sizeof w) != 0) {
        s_req_free(r);
        r = NULL;
    }
    int rc = r ? s_call(c, r) : KVEDGE_ENOMEM;
    if (rc != KVEDGE_OK)
        return rc;
    uint32_t got = r->rh.count;
    if (got > want)
        rc = KVEDGE_EPROTO;
    const uint8_t *p = zframe_data(zmsg_first(r->reply));
    for (uint32_t i = 0; rc == KVEDGE_OK && i < got; i++) {
        kvedge_wire_chunk_entry_t e;
        rc = kvedge_wire_chunk_entry_parse(p + (size_t)i * KVEDGE_WIRE_CHUNK_ENTRY_BYTES,
                                           KVEDGE_WIRE_CHUNK_ENTRY_BYTES, &e);
        out[i] = (kvedge_chunk_entry_t){e.chunk, e.blocks, e.bytes, e.pinned_blocks, e.fp16_bytes};
    }
    if (rc == KVEDGE_OK) {
        *n = got;
        if (more)
            *more = !(r->rh.flags & KVEDGE_WIRE_FLAG_END);
    }
    s_req_release(r);
    return rc;
}

/* ---------------------------------------------------------------- fetch (edge proxy) */

int kvedge_client_fetch_async(kvedge_client_t *c, const kvedge_fetch_req_t *req,
                              const kvedge_fetch_cbs_t *cbs, void *ctx)
{
    S_ENTER(c);
    kvedge_fetch_req_t rq; /* the caller's, in this library's layout */
    if (req) {
        kvedge_fetch_req_default(&rq);
        int rc = kvedge_abi_read(&rq, sizeof rq, req, KVEDGE_FETCH_REQ_SIZE_MIN, "req");
        if (rc != KVEDGE_OK)
            return rc;
        req = &rq;
    }
    if (c && !s_role_serves(c->node.role, KVEDGE_OP_FETCH))
        return s_role_err(c, KVEDGE_OP_FETCH, KVEDGE_EPROTO); /* a node would refuse it */
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
    s_req_t *r = s_req_frame(KVEDGE_OP_FETCH, (uint32_t)req->n, s_deadline(c, req->deadline_ms),
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
        s_req_free(r);
        return rc;
    }
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
    return s_submit(c, r);
}
