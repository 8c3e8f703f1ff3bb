/* The protocol client's insides (access/client.c and its parts): the request, the I/O state,
 * the client and the functions one part of the client calls in another. Internal: not
 * installed, included only by access/client*.c.
 *
 *   client.c        connect, destroy, errors, the public call's hold, unary calls
 *   client_io.c     requests, the I/O actor, the direct channels
 *   client_ops.c    request/response calls: ping, model, stat, list, put, get, chunk ops
 *   client_stream.c GET_LAYER streams and FETCH, and the block a callback may take */
#ifndef KVEDGE_ACCESS_CLIENT_IMPL_H
#define KVEDGE_ACCESS_CLIENT_IMPL_H

#include <czmq.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "access/client.h"
#include "access/frame.h"
#include "access/meter.h"
#include "access/shaper.h"

#define KVEDGE_CLIENT__WAIT_MARGIN_MS 250 /* a caller waits this long past its deadline */
#define KVEDGE_CLIENT__DRAIN_MAX      256 /* messages read per wakeup before credit goes out */
/* Direct channels: sockets a synchronous caller drives itself (see "direct channels"). */
#define KVEDGE_CLIENT__CHAN_MAX 4 /* channels per client; more concurrent callers use the actor */

typedef struct kvedge_client__req_t kvedge_client__req_t;
struct kvedge_client__req_t {
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
    uint32_t received;    /* heads delivered */
    uint32_t msgs;        /* data messages received (packed ones count once) */
    bool pack_want;       /* GET_LAYER: ask for packed data messages (opts.no_pack unset) */
    bool has_accept;      /* GET_LAYER: the payload holds an accept list */
    bool packed;          /* GET_LAYER: sent with the pack frame */
    uint32_t pack_max;    /* heads one data message may carry: 1, or the pack frame's */
    uint32_t pack_bytes;  /* the pack frame's max bytes */
    zmsg_t *retry;        /* a packed GET_LAYER's payload without the pack frame, until the
                           * first data message: sent again if the node refuses packing */
    uint32_t target;      /* credit the stream runs at: initial, plus extra granted */
    uint64_t blk_bytes;   /* bytes of the blocks received, for the window */
    uint32_t blk_n;       /* data messages received with a block, for the window */
    uint32_t heads;       /* the model's KV heads, once the stream has shown them */
    uint32_t last_chunk;  /* position of the last data message */
    uint16_t last_head;
    struct kvedge_client__fetch_t *fetch; /* a FETCH stream (stream is true too); NULL otherwise */
    uint64_t grant_to; /* KVEDGE_OP_CREDIT: the stream whose held credit comes back (count) */
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
    zhashx_t *inflight; /* request id -> kvedge_client__req_t */
    uint64_t next_id;
    int64_t next_deadline; /* earliest deadline in flight (may be stale early), or INT64_MAX */
    uint64_t due[KVEDGE_CLIENT__DRAIN_MAX]; /* streams owed credit in this drain */
    size_t n_due;
    bool heard;       /* the node has answered something: a handshake completed */
    bool actor;       /* this is the client's I/O actor (not a direct channel) */
    uint32_t blk_avg; /* mean block bytes per data message of the last stream that ended
                       * here (0: none yet) */
    bool no_pack;     /* the node refused a packed GET_LAYER: ask it for no more */
    kvedge_wire_frame_t frames[KVEDGE_WIRE_MAX_FRAMES];
} kvedge_client__io_t;

struct kvedge_client_t {
    zactor_t *actor;         /* the I/O thread */
    pthread_mutex_t pipe_mu; /* zsock pipes are not thread-safe */
    bool closing;            /* destroy has begun: no more sends (under pipe_mu) */
    kvedge_client__io_t *io; /* the actor's state, freed after the actor stopped */
    kvedge_node_info_t node; /* HELLO answer */
    uint32_t max_frame;      /* the node's limits from HELLO */
    uint32_t max_items;
    uint32_t max_chunks;
    uint32_t credit;     /* initial credit of a stream */
    uint32_t max_credit; /* the node's, from HELLO */
    uint32_t window;     /* opts.window_bytes */
    bool no_pack;        /* opts.no_pack */
    int deadline_ms;     /* default deadline */
    /* Direct channels (after HELLO, without an emulated link): idle ones, and how many exist
     * and are checked out, under chan_mu; destroy waits on chan_cv for chan_busy to be 0. */
    bool direct;
    pthread_mutex_t chan_mu;
    pthread_cond_t chan_cv;
    kvedge_client__io_t *chan_idle[KVEDGE_CLIENT__CHAN_MAX];
    size_t chan_nidle, chan_n, chan_busy;
    atomic_bool chan_closing;
    /* Threads inside a public call (KVEDGE_CLIENT__ENTER), under chan_mu: destroy frees the client
     * only when the last has left, so a call that destroy ended reads nothing freed. */
    size_t users;
};

/* A public call's hold on its client, released when the call's scope ends (even by an early
 * return): destroy waits for every hold to go. */
typedef struct {
    kvedge_client_t *c;
} kvedge_client__user_t;

/* Starts a public call on c (which may be NULL): clears this thread's message and holds c
 * until the enclosing scope ends (the variable is only there for its cleanup: clang would
 * call it unused). */
#define KVEDGE_CLIENT__ENTER(c)                                                                    \
    kvedge_client__user_t s_user_ __attribute__((cleanup(kvedge_client__user_leave), unused)) =    \
        kvedge_client__user_enter(c)

/* Where one call's requests go: a direct channel, or (ch NULL) the actor. */
typedef struct {
    kvedge_client_t *c;
    kvedge_client__io_t *ch;
} kvedge_client__path_t;

typedef struct {
    uint8_t *buf;
    size_t cap, used;
    bool full; /* a block did not fit: every later block is KVEDGE_ENOSPACE */
} kvedge_client__sink_t;

/* ---------------------------------------------------------------- client.c */

/* Which requests a peer answers, by the role its HELLO gave. */
bool kvedge_client__role_serves(int role, uint8_t op);
/* A request failed that the peer's role does not answer: this thread's message says which
 * daemon does. Returns rc. */
int kvedge_client__role_err(const kvedge_client_t *c, uint8_t op, int rc);
kvedge_client__user_t kvedge_client__user_enter(kvedge_client_t *c);
void kvedge_client__user_leave(kvedge_client__user_t *u);
/* The absolute deadline of a call (deadline_ms 0: the client's default). */
int64_t kvedge_client__deadline(const kvedge_client_t *c, int deadline_ms);
/* kvedge_client__call_on on a channel of its own when one is free. */
int kvedge_client__call(kvedge_client_t *c, kvedge_client__req_t *r);

/* ---------------------------------------------------------------- client_io.c */

kvedge_client__req_t *kvedge_client__req_new(uint8_t opcode, uint32_t count, int64_t deadline_ms);
void kvedge_client__req_free(kvedge_client__req_t *r);
void kvedge_client__req_release(kvedge_client__req_t *r);
/* A request with one payload frame of len bytes (copied from data, or zeroed when data is
 * NULL); *frame receives its bytes for filling in. */
kvedge_client__req_t *kvedge_client__req_frame(uint8_t opcode, uint32_t count, int64_t deadline,
                                               const void *data, size_t len, uint8_t **frame);
/* Ends a request: out of the table; a stream hears on_done, a unary request's caller is
 * woken. */
void kvedge_client__finish(kvedge_client__io_t *io, kvedge_client__req_t *r, int status,
                           bool cancel);
/* A request handed over by a caller: numbered, sent, tracked. */
void kvedge_client__io_submit(kvedge_client__io_t *io, kvedge_client__req_t *r);
/* A packed GET_LAYER the node refused before any data (KVEDGE_EPROTO, as a node that cannot
 * pack answers): this connection asks for packing no more, and r is sent again unpacked
 * under a new id. */
void kvedge_client__io_resubmit_unpacked(kvedge_client__io_t *io, kvedge_client__req_t *r);
/* The I/O actor (zactor_new(kvedge_client__actor, io)). */
void kvedge_client__actor(zsock_t *pipe, void *args);
/* Frees the meter and shapers, which outlive the actor. */
void kvedge_client__io_free_link(kvedge_client__io_t *io);
/* Hands r to the I/O thread. On failure r is freed. */
int kvedge_client__submit(kvedge_client_t *c, kvedge_client__req_t *r);
void kvedge_client__chan_destroy(kvedge_client__io_t **ch_p);
/* Caller: runs ch's I/O until *done. Returns false when ch is broken. */
bool kvedge_client__chan_run(kvedge_client_t *c, kvedge_client__io_t *ch, const bool *done);
kvedge_client__path_t kvedge_client__path_open(kvedge_client_t *c);
void kvedge_client__path_close(kvedge_client__path_t *p, bool broken);
int kvedge_client__path_submit(kvedge_client__path_t *p, kvedge_client__req_t *r);
int kvedge_client__path_wait(kvedge_client__path_t *p, kvedge_client__req_t *r);
/* Sends a unary request on p and waits. On 0, r holds the reply; the caller releases r. On
 * error, r has been released. */
int kvedge_client__call_on(kvedge_client__path_t *p, kvedge_client__req_t *r);

/* ---------------------------------------------------------------- client_ops.c */

/* Lands one fetched head in the caller's buffer, one after the other. */
void kvedge_client__sink_put(kvedge_client__sink_t *s, int status, const uint8_t *data, size_t len,
                             kvedge_fetched_t *out);

/* ---------------------------------------------------------------- client_stream.c */

/* One validated message m (header h, n payload frames in io->frames) of stream r: a FETCH or
 * a GET_LAYER stream. Does not consume m; an on_block callback may take its block's frame. */
void kvedge_client__stream_message(kvedge_client__io_t *io, kvedge_client__req_t *r,
                                   const kvedge_wire_header_t *h, size_t n, zmsg_t *m);
/* A FETCH stream ends: its on_done hears status. */
void kvedge_client__fetch_done(kvedge_client__req_t *r, int status);

#endif
