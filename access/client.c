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
 * DEALER the calling thread drives itself, two thread handoffs fewer: see "direct channels"
 * in client_io.c);
 * else it waits on a per-request future that the actor completes.
 *
 * Credit policy: a stream starts with the client's credit (opts.credit, at most the node's
 * max_credit). Each data message consumed (after on_block returns) is owed back to the node;
 * owed credit is granted in one CREDIT per stream after each drain of the socket (at most
 * KVEDGE_CLIENT__DRAIN_MAX messages), so the node keeps about `credit` messages in flight with one
 * CREDIT per wakeup rather than one per block. Credit counts messages, but what keeps a stream at
 * line rate is bytes in flight: with small blocks (an int4 head of 256 tokens is 40 KiB) eight
 * messages are a few hundred KiB and the stream stalls on every round of credit. So the
 * client also grants extra credit, once it has seen the stream's block sizes, until about
 * opts.window_bytes of blocks are in flight (never more than the node's max_credit messages,
 * never less than `credit`), and starts its next stream on the same socket at the credit the
 * last one ended with. An asynchronous stream's on_block may hold its message's credit
 * (access/client_credit.h: the loader parks a block it has no slot for) and give it back
 * later; the I/O thread grants it then. */
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

#include "access/client_impl.h"
#include "access/client_internal.h"
#include "access/codec/clock.h"
#include "access/meter.h"
#include "access/shaper.h"

#define S_NAME_DEFAULT "libkvedge"

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

int kvedge_client__say(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s_tl_err, sizeof s_tl_err, fmt, ap);
    va_end(ap);
    return rc;
}

/* Which requests a peer answers, by the role its HELLO gave (docs/protocol.md): an edge proxy
 * HELLO, PING, FETCH and MONITOR; a store node everything but FETCH. Unknown roles: all. */
bool kvedge_client__role_serves(int role, uint8_t op)
{
    if (role == KVEDGE_ROLE_PROXY)
        return op == KVEDGE_OP_HELLO || op == KVEDGE_OP_PING || op == KVEDGE_OP_FETCH ||
               op == KVEDGE_OP_MONITOR;
    if (role == KVEDGE_ROLE_CLOUD || role == KVEDGE_ROLE_EDGE)
        return op != KVEDGE_OP_FETCH;
    return true;
}

kvedge_client__user_t kvedge_client__user_enter(kvedge_client_t *c)
{
    s_err_clear();
    if (c) {
        pthread_mutex_lock(&c->chan_mu);
        c->users++;
        pthread_mutex_unlock(&c->chan_mu);
    }
    return (kvedge_client__user_t){c};
}

void kvedge_client__user_leave(kvedge_client__user_t *u)
{
    if (!u->c)
        return;
    pthread_mutex_lock(&u->c->chan_mu);
    if (--u->c->users == 0)
        pthread_cond_broadcast(&u->c->chan_cv);
    pthread_mutex_unlock(&u->c->chan_mu);
}

int64_t kvedge_client__deadline(const kvedge_client_t *c, int deadline_ms)
{
    return kvedge_mono_ms() + (deadline_ms > 0 ? deadline_ms : c->deadline_ms);
}

/* A request failed that the peer's role does not answer: this thread's message says which
 * daemon does. Returns rc. */
int kvedge_client__role_err(const kvedge_client_t *c, uint8_t op, int rc)
{
    if (rc == KVEDGE_OK || rc == KVEDGE_ETIMEDOUT || kvedge_client__role_serves(c->node.role, op))
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

/* kvedge_client__call_on on a channel of its own when one is free. */
int kvedge_client__call(kvedge_client_t *c, kvedge_client__req_t *r)
{
    uint8_t op = r->opcode;
    kvedge_client__path_t p = kvedge_client__path_open(c);
    int rc = kvedge_client__call_on(&p, r);
    kvedge_client__path_close(&p, false);
    return kvedge_client__role_err(c, op, rc);
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
    kvedge_client__req_t *r = kvedge_client__req_frame(
        KVEDGE_OP_HELLO, 0, kvedge_client__deadline(c, 0), name, strlen(name), NULL);
    if (!r)
        return KVEDGE_ENOMEM;
    int rc = kvedge_client__call(c, r);
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
    kvedge_client__req_release(r);
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
    kvedge_client__io_t *io = calloc(1, sizeof *io);
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
            kvedge_client__io_free_link(io);
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
    c->no_pack = opts->no_pack;
    c->actor = zactor_new(kvedge_client__actor, io);
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
        kvedge_client__chan_destroy(&c->chan_idle[--c->chan_nidle]);
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
    kvedge_client__io_free_link(c->io);
    free(c->io);
    free(c);
}

int kvedge_client_link(kvedge_client_t *c, double *bw_bytes_per_s, double *rtt_us,
                       uint64_t *samples)
{
    KVEDGE_CLIENT__ENTER(c);
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
