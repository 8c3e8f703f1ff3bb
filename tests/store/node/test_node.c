/* The store node against bad peers: malformed, truncated, oversized, wrong-version and
 * out-of-order messages, unknown opcodes, credit abuse, a reader that stops mid-stream, raw
 * TCP garbage on the CURVE port, unlisted keys; and tenant isolation and restarts. Each bad
 * peer gets an error or a disconnect, nothing is stored from it, and a well-behaved client
 * is served all along. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <czmq.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "access/frame.h"
#include "access/codec/errwire.h"
#include "store/node/node.h"
#include "store/node/server.h"
#include "clients/lib/kvedge.h"
#include "store/engine/engine_debug.h"
#include "access/codec/synth.h"
#include "tests/common/testutil.h"

#define S_MODEL "opt-125m" /* built in: 12 layers x 12 heads x 64 */
#define S_HEADS 12

typedef struct {
    char dir[256];
    kvedge_node_t *node;
    kvedge_engine_t *engine; /* the node's */
    char certs[300];         /* CURVE: node cert, clients dir, client certs */
    bool curve;
} s_node_t;

static void s_rmrf(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void s_node_start(s_node_t *n)
{
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    ns.role = KVEDGE_ROLE_CLOUD;
    ns.insecure = !n->curve;
    ns.workers = 2;
    snprintf(ns.data, sizeof ns.data, "%s", n->dir);
    snprintf(ns.bind, sizeof ns.bind, "tcp://127.0.0.1:*");
    snprintf(ns.name, sizeof ns.name, "test");
    if (n->curve) {
        snprintf(ns.cert, sizeof ns.cert, "%s/node", n->certs);
        snprintf(ns.clients, sizeof ns.clients, "%s/clients", n->certs);
    }
    char why[256] = "";
    if (kvedge_node_start(&ns, &n->node, why, sizeof why) != 0)
        fail_msg("node start: %s", why);
    n->engine = kvedge_node_engine(n->node);
}

static void s_node_stop(s_node_t *n)
{
    kvedge_node_destroy(&n->node);
    n->engine = NULL;
}

/* A client certificate pair in the certs dir; listed: also in the allowlist. */
static void s_make_client_cert(s_node_t *n, const char *name, const char *tenant, bool listed)
{
    zcert_t *c = zcert_new();
    if (tenant)
        zcert_set_meta(c, "tenant", "%s", tenant);
    char path[500];
    snprintf(path, sizeof path, "%s/%s", n->certs, name);
    assert_int_equal(zcert_save(c, path), 0);
    if (listed) {
        snprintf(path, sizeof path, "%s/clients/%s", n->certs, name);
        assert_int_equal(zcert_save_public(c, path), 0);
    }
    zcert_destroy(&c);
}

static int s_setup(void **state, bool curve)
{
    s_node_t *n = calloc(1, sizeof *n);
    snprintf(n->dir, sizeof n->dir, "/tmp/kvedge-node-XXXXXX");
    if (!mkdtemp(n->dir))
        return -1;
    snprintf(n->certs, sizeof n->certs, "%s/certs", n->dir);
    strncat(n->dir, "/data", sizeof n->dir - strlen(n->dir) - 1);
    n->curve = curve;
    if (curve) {
        char p[400];
        zsys_dir_create("%s/clients", n->certs);
        zcert_t *c = zcert_new();
        snprintf(p, sizeof p, "%s/node", n->certs);
        zcert_save(c, p);
        zcert_destroy(&c);
    }
    s_node_start(n);
    *state = n;
    return 0;
}

static int s_setup_plain(void **state)
{
    return s_setup(state, false);
}

static int s_setup_curve(void **state)
{
    return s_setup(state, true);
}

static int s_teardown(void **state)
{
    s_node_t *n = *state;
    s_node_stop(n);
    n->dir[strlen(n->dir) - strlen("/data")] = '\0';
    s_rmrf(n->dir);
    free(n);
    return 0;
}

static kvedge_client_t *s_client(s_node_t *n, const char *cert_name, int deadline_ms)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = kvedge_node_endpoint(n->node);
    o.deadline_ms = deadline_ms;
    char cert[500], key[500];
    if (cert_name) {
        snprintf(cert, sizeof cert, "%s/%s_secret", n->certs, cert_name);
        snprintf(key, sizeof key, "%s/node", n->certs);
        o.client_cert = cert;
        o.server_key = key;
    }
    kvedge_client_t *c = NULL;
    int rc = kvedge_client_connect(&o, &c);
    return rc == 0 ? c : NULL;
}

/* Encodes and puts one chunk of model m (layers 0..layers-1, every head, blocks of m's head
 * dim) with ids from `seed`; returns the PUT's result, the chunk id in *id_out. */
static int s_put_shape(kvedge_client_t *c, const kvedge_model_t *m, uint32_t seed, uint32_t layers,
                       uint32_t tokens, kvedge_chunk_id_t *id_out)
{
    uint32_t tok[256];
    for (uint32_t i = 0; i < tokens; i++)
        tok[i] = seed * 1000 + i;
    kvedge_chunk_id_t id;
    assert_int_equal(kvedge_chunk_chain(NULL, 0, m->id, tok, tokens, 0, &id, 1), 1);
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, tokens, m->head_dim, 0, NULL, false};
    size_t cap = kvedge_block_encoded_bound(&spec);
    uint8_t *blocks = malloc(cap * m->kv_heads);
    uint16_t *k = malloc((size_t)tokens * m->head_dim * 2),
             *v = malloc((size_t)tokens * m->head_dim * 2);
    kvedge_put_item_t *items = calloc(m->kv_heads, sizeof *items);
    assert_non_null(blocks);
    assert_non_null(k);
    assert_non_null(v);
    assert_non_null(items);
    int rc = 0;
    for (uint32_t l = 0; l < layers && rc == 0; l++) {
        for (uint32_t h = 0; h < m->kv_heads; h++) {
            assert_int_equal(kvedge_synth_head(seed + l * 100 + h, 0, tokens, m->head_dim,
                                               KVEDGE_DTYPE_FP16, k, v),
                             0);
            memset(&items[h], 0, sizeof items[h]);
            assert_int_equal(kvedge_block_encode(&spec, k, v, blocks + h * cap, cap, &items[h].len),
                             0);
            items[h].chunk.id = id;
            snprintf(items[h].chunk.model_id, sizeof items[h].chunk.model_id, "%s", m->id);
            items[h].chunk.tokens = tokens;
            items[h].layer = (uint16_t)l;
            items[h].head = (uint16_t)h;
            items[h].block = blocks + h * cap;
        }
        rc = kvedge_client_put(c, items, m->kv_heads, NULL);
    }
    free(items);
    free(v);
    free(k);
    free(blocks);
    *id_out = id;
    return rc;
}

/* Puts one chunk of S_MODEL (layers 0..layers-1, every head) with ids from `seed`. */
static void s_put_chunk(kvedge_client_t *c, uint32_t seed, uint32_t layers, uint32_t tokens,
                        kvedge_chunk_id_t *id_out)
{
    kvedge_model_t m;
    assert_int_equal(kvedge_model_builtin(S_MODEL, &m), 0);
    assert_int_equal(s_put_shape(c, &m, seed, layers, tokens, id_out), 0);
}

/* ---- raw protocol peer ---- */

static zsock_t *s_raw(s_node_t *n)
{
    zsock_t *s = zsock_new(ZMQ_DEALER);
    zsock_set_linger(s, 0);
    zsock_set_rcvtimeo(s, 2000);
    assert_int_equal(zsock_connect(s, "%s", kvedge_node_endpoint(n->node)), 0);
    return s;
}

static zframe_t *s_hdr(uint8_t op, uint16_t flags, uint64_t id, int32_t status, uint32_t count,
                       uint32_t credit, uint32_t deadline)
{
    kvedge_wire_header_t h = {1, op, flags, id, status, count, credit, deadline};
    uint8_t b[KVEDGE_WIRE_HEADER_BYTES];
    kvedge_wire_header_pack(&h, b);
    return zframe_new(b, sizeof b);
}

/* Receives one reply and returns its header (status in h->status); frames count in *nf. */
static int s_recv(zsock_t *s, kvedge_wire_header_t *h, size_t *nf)
{
    zmsg_t *m = zmsg_recv(s);
    if (!m)
        return -1;
    zframe_t *f = zmsg_first(m);
    int rc = kvedge_wire_header_parse(zframe_data(f), zframe_size(f), h);
    if (nf)
        *nf = zmsg_size(m) - 1;
    zmsg_destroy(&m);
    return rc;
}

static void s_send_frames(zsock_t *s, zframe_t *hdr, ...)
{
    zmsg_t *m = zmsg_new();
    zmsg_append(m, &hdr);
    va_list ap;
    va_start(ap, hdr);
    zframe_t *f;
    while ((f = va_arg(ap, zframe_t *)) != NULL)
        zmsg_append(m, &f);
    va_end(ap);
    assert_int_equal(zmsg_send(&m, s), 0);
}

/* The well-behaved client still gets full, correct answers. */
static void s_check_served(kvedge_client_t *good, const kvedge_chunk_id_t *id)
{
    uint8_t *buf = malloc(1 << 20);
    kvedge_fetched_t out[S_HEADS];
    uint32_t heads = 0;
    assert_int_equal(kvedge_client_get_layer(good, id, 1, 0, buf, 1 << 20, out, S_HEADS, &heads),
                     0);
    assert_int_equal(heads, S_HEADS);
    for (int h = 0; h < S_HEADS; h++) {
        kvedge_block_info_t info;
        assert_int_equal(out[h].status, 0);
        assert_int_equal(kvedge_block_parse(buf + out[h].offset, out[h].len, &info), 0);
    }
    free(buf);
}

static void test_malformed_messages(void **state)
{
    s_node_t *n = *state;
    kvedge_client_t *good = s_client(n, NULL, 3000);
    assert_non_null(good);
    kvedge_chunk_id_t id;
    s_put_chunk(good, 1, 1, 64, &id);
    kvedge_engine_stats_t before;
    assert_int_equal(kvedge_client_stat(good, &before), 0);

    zsock_t *bad = s_raw(n);
    kvedge_wire_header_t h;
    uint8_t junk[KVEDGE_WIRE_PUT_ITEM_BYTES] = {0};

    /* A 31-byte header. */
    s_send_frames(bad, zframe_new(junk, 31), NULL);
    assert_int_equal(s_recv(bad, &h, NULL), 0);
    assert_int_equal(h.status, KVEDGE_EPROTO);
    /* Wrong magic. */
    zframe_t *f = s_hdr(KVEDGE_OP_PING, 0, 7, 0, 0, 0, 1000);
    zframe_data(f)[0] = 'X';
    s_send_frames(bad, f, zframe_new(NULL, 0), NULL);
    assert_int_equal(s_recv(bad, &h, NULL), 0);
    assert_int_equal(h.status, KVEDGE_EPROTO);
    /* Wrong version: answered as such, with the request id. */
    f = s_hdr(KVEDGE_OP_PING, 0, 8, 0, 0, 0, 1000);
    zframe_data(f)[4] = 2;
    s_send_frames(bad, f, zframe_new(NULL, 0), NULL);
    assert_int_equal(s_recv(bad, &h, NULL), 0);
    assert_int_equal(h.status, KVEDGE_EVERSION);
    assert_int_equal(h.request_id, 8);
    /* Unknown opcode. */
    s_send_frames(bad, s_hdr(99, 0, 9, 0, 0, 0, 1000), NULL);
    assert_int_equal(s_recv(bad, &h, NULL), 0);
    assert_int_equal(h.status, KVEDGE_EPROTO);
    /* A request with the REPLY flag; a deadline of 0; a status on a request. */
    s_send_frames(bad, s_hdr(KVEDGE_OP_STAT, KVEDGE_WIRE_FLAG_REPLY, 10, 0, 0, 0, 1000), NULL);
    assert_int_equal(s_recv(bad, &h, NULL), 0);
    assert_int_equal(h.status, KVEDGE_EPROTO);
    s_send_frames(bad, s_hdr(KVEDGE_OP_STAT, 0, 11, 0, 0, 0, 0), NULL);
    assert_int_equal(s_recv(bad, &h, NULL), 0);
    assert_int_equal(h.status, KVEDGE_EPROTO);
    s_send_frames(bad, s_hdr(KVEDGE_OP_STAT, 0, 12, -3, 0, 0, 1000), NULL);
    assert_int_equal(s_recv(bad, &h, NULL), 0);
    assert_int_equal(h.status, KVEDGE_EPROTO);
    /* PUT claiming 2 items with 3 frames; PUT with a truncated item header. */
    s_send_frames(bad, s_hdr(KVEDGE_OP_PUT, 0, 13, 0, 2, 0, 1000),
                  zframe_new(junk, KVEDGE_WIRE_PUT_ITEM_BYTES), zframe_new(junk, 8),
                  zframe_new(junk, KVEDGE_WIRE_PUT_ITEM_BYTES), NULL);
    assert_int_equal(s_recv(bad, &h, NULL), 0);
    assert_int_equal(h.status, KVEDGE_EPROTO);
    s_send_frames(bad, s_hdr(KVEDGE_OP_PUT, 0, 14, 0, 1, 0, 1000), zframe_new(junk, 100),
                  zframe_new(junk, 8), NULL);
    assert_int_equal(s_recv(bad, &h, NULL), 0);
    assert_int_equal(h.status, KVEDGE_EPROTO);
    /* A well-formed PUT of a truncated block: the item fails, nothing is stored. */
    kvedge_wire_put_item_t item;
    memset(&item, 0, sizeof item);
    item.chunk.id = id;
    snprintf(item.chunk.model_id, sizeof item.chunk.model_id, S_MODEL);
    item.chunk.tokens = 64;
    item.layer = 5;
    uint8_t ib[KVEDGE_WIRE_PUT_ITEM_BYTES];
    assert_int_equal(kvedge_wire_put_item_pack(&item, ib), 0);
    s_send_frames(bad, s_hdr(KVEDGE_OP_PUT, 0, 15, 0, 1, 0, 1000), zframe_new(ib, sizeof ib),
                  zframe_new("KVEB\x01", 5), NULL);
    zmsg_t *m = zmsg_recv(bad);
    assert_non_null(m);
    zframe_t *st = zmsg_last(m);
    assert_int_equal(zframe_size(st), 4);
    assert_int_equal(kvedge_err_from_wire((int32_t)kvedge_le_get32(zframe_data(st))),
                     KVEDGE_ETRUNCATED);
    zmsg_destroy(&m);
    /* GET over the item limit. */
    s_send_frames(bad, s_hdr(KVEDGE_OP_GET, 0, 16, 0, KVEDGE_WIRE_MAX_ITEMS + 1, 0, 1000),
                  zframe_new(NULL, (size_t)(KVEDGE_WIRE_MAX_ITEMS + 1) * KVEDGE_WIRE_KEY_BYTES),
                  NULL);
    assert_int_equal(s_recv(bad, &h, NULL), 0);
    assert_int_equal(h.status, KVEDGE_EPROTO);
    /* Out of order: CREDIT and CANCEL for streams that do not exist are ignored. */
    s_send_frames(bad, s_hdr(KVEDGE_OP_CREDIT, 0, 77, 0, 0, 4, 1000), NULL);
    s_send_frames(bad, s_hdr(KVEDGE_OP_CANCEL, 0, 78, 0, 0, 0, 1000), NULL);
    /* GET_LAYER with no credit. */
    uint8_t lr[4 + 32] = {0};
    memcpy(lr + 4, id.bytes, 32);
    s_send_frames(bad, s_hdr(KVEDGE_OP_GET_LAYER, 0, 17, 0, 1, 0, 1000), zframe_new(lr, sizeof lr),
                  NULL);
    assert_int_equal(s_recv(bad, &h, NULL), 0);
    assert_int_equal(h.status, KVEDGE_EPROTO);
    assert_true(h.flags & KVEDGE_WIRE_FLAG_END);

    /* The bad peer stored nothing, and the good client is served. */
    kvedge_engine_stats_t after;
    assert_int_equal(kvedge_client_stat(good, &after), 0);
    assert_int_equal(after.blocks, before.blocks);
    assert_int_equal(after.bytes, before.bytes);
    s_check_served(good, &id);
    zsock_destroy(&bad);
    kvedge_client_destroy(&good);
}

static void test_oversized_frame_disconnects(void **state)
{
    s_node_t *n = *state;
    kvedge_client_t *good = s_client(n, NULL, 3000);
    kvedge_chunk_id_t id;
    s_put_chunk(good, 2, 1, 64, &id);
    zsock_t *bad = s_raw(n);
    zsock_set_rcvtimeo(bad, 500);
    /* One frame past ZMQ_MAXMSGSIZE: libzmq drops the connection before the node reads it. */
    size_t big = KVEDGE_WIRE_MAX_FRAME_BYTES + 1;
    s_send_frames(bad, s_hdr(KVEDGE_OP_PING, 0, 1, 0, 0, 0, 1000), zframe_new(NULL, big), NULL);
    kvedge_wire_header_t h;
    assert_int_equal(s_recv(bad, &h, NULL), -1); /* no answer: disconnected */
    s_check_served(good, &id);
    zsock_destroy(&bad);
    kvedge_client_destroy(&good);
}

static void test_stalled_reader_and_credit_abuse(void **state)
{
    s_node_t *n = *state;
    kvedge_client_t *good = s_client(n, NULL, 3000);
    kvedge_chunk_id_t id;
    s_put_chunk(good, 3, 2, 256, &id);

    /* A reader that takes 2 messages of credit and then never reads or grants more: after
     * its deadline the node drops the stream; the good client is served meanwhile. */
    zsock_t *stall = s_raw(n);
    uint8_t lr[4 + 32] = {0};
    memcpy(lr + 4, id.bytes, 32);
    s_send_frames(stall, s_hdr(KVEDGE_OP_GET_LAYER, 0, 1, 0, 1, 2, 300), zframe_new(lr, sizeof lr),
                  NULL);
    s_check_served(good, &id);
    kt_pause_ms(600); /* the time is the point: the stalled stream's 300 ms deadline passes */
    s_check_served(good, &id);
    int data = 0, ended = 0;
    kvedge_wire_header_t h;
    while (s_recv(stall, &h, NULL) == 0) {
        if (h.flags & KVEDGE_WIRE_FLAG_MORE)
            data++;
        if (h.flags & KVEDGE_WIRE_FLAG_END) {
            ended++;
            assert_int_equal(h.status, KVEDGE_ETIMEDOUT);
            break;
        }
    }
    assert_int_equal(data, 2); /* exactly its credit, no more */
    assert_int_equal(ended, 1);

    /* Credit abuse: a flood of CREDIT grants is capped, and the stream still ends right. */
    s_send_frames(stall, s_hdr(KVEDGE_OP_GET_LAYER, 0, 2, 0, 1, 1, 2000), zframe_new(lr, sizeof lr),
                  NULL);
    for (int i = 0; i < 50; i++)
        s_send_frames(stall, s_hdr(KVEDGE_OP_CREDIT, 0, 2, 0, 0, KVEDGE_WIRE_MAX_CREDIT, 2000),
                      NULL);
    data = 0;
    while (s_recv(stall, &h, NULL) == 0 && !(h.flags & KVEDGE_WIRE_FLAG_END))
        data++;
    assert_int_equal(h.status, 0);
    assert_int_equal(data, S_HEADS);
    assert_int_equal(h.count, S_HEADS);
    s_check_served(good, &id);
    zsock_destroy(&stall);
    kvedge_client_destroy(&good);
}

/* Receives one message: its header, and in *block (caller frees) a data message's block. */
static int s_recv_block(zsock_t *s, kvedge_wire_header_t *h, zframe_t **block)
{
    *block = NULL;
    zmsg_t *m = zmsg_recv(s);
    if (!m)
        return -1;
    zframe_t *f = zmsg_first(m);
    int rc = kvedge_wire_header_parse(zframe_data(f), zframe_size(f), h);
    if (zmsg_size(m) == 3) {
        *block = zmsg_last(m);
        zmsg_remove(m, *block);
    }
    zmsg_destroy(&m);
    return rc;
}

/* CANCEL ends a GET_LAYER stream: the data messages already on their way, then at once an END
 * with KVEDGE_ECANCELED that counts them, and nothing after it, not even blocks the workers
 * were still reading. The request id is free again: a new stream under it gets only its own
 * blocks. */
static void test_cancel_ends_stream(void **state)
{
    s_node_t *n = *state;
    kvedge_client_t *good = s_client(n, NULL, 3000);
    kvedge_chunk_id_t id;
    s_put_chunk(good, 5, 2, 256, &id);
    zsock_t *raw = s_raw(n);
    uint8_t lr[4 + 32] = {0};
    memcpy(lr + 4, id.bytes, 32);
    kvedge_wire_header_t h;

    /* Credit 2: two data messages, then the stream waits for credit; CANCEL ends it, long
     * before the stream's 60 s deadline would. */
    s_send_frames(raw, s_hdr(KVEDGE_OP_GET_LAYER, 0, 1, 0, 1, 2, 60000), zframe_new(lr, sizeof lr),
                  NULL);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(s_recv(raw, &h, NULL), 0);
        assert_int_equal(h.flags, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_MORE);
    }
    int64_t t0 = zclock_mono();
    s_send_frames(raw, s_hdr(KVEDGE_OP_CANCEL, 0, 1, 0, 0, 0, 5000), NULL);
    size_t nf = 99;
    assert_int_equal(s_recv(raw, &h, &nf), 0);
    int64_t took = zclock_mono() - t0;
    assert_int_equal(h.flags, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_END);
    assert_int_equal(h.opcode, KVEDGE_OP_GET_LAYER);
    assert_int_equal(h.request_id, 1);
    assert_int_equal(h.status, KVEDGE_ECANCELED);
    assert_int_equal(h.count, 2);
    assert_int_equal(nf, 0);
    assert_true(took < KT_SLACK_MS);
    zsock_set_rcvtimeo(raw, 300);
    assert_int_equal(s_recv(raw, &h, NULL), -1); /* nothing after the END */

    /* Cancelled at once, with reads in flight, and the id reused for layer 1 at once. */
    zsock_set_rcvtimeo(raw, 2000);
    s_send_frames(raw, s_hdr(KVEDGE_OP_GET_LAYER, 0, 2, 0, 1, 8, 5000), zframe_new(lr, sizeof lr),
                  NULL);
    s_send_frames(raw, s_hdr(KVEDGE_OP_CANCEL, 0, 2, 0, 0, 0, 5000), NULL);
    lr[0] = 1; /* layer 1 */
    s_send_frames(raw, s_hdr(KVEDGE_OP_GET_LAYER, 0, 2, 0, 1, S_HEADS, 5000),
                  zframe_new(lr, sizeof lr), NULL);
    uint32_t data = 0;
    zframe_t *b = NULL;
    while (true) {
        assert_int_equal(s_recv_block(raw, &h, &b), 0);
        zframe_destroy(&b);
        if (h.flags & KVEDGE_WIRE_FLAG_END)
            break;
        data++;
    }
    assert_int_equal(h.status, KVEDGE_ECANCELED);
    assert_int_equal(h.count, data);
    assert_true(data <= 8);
    uint8_t *buf = malloc(1 << 20);
    kvedge_fetched_t out[S_HEADS];
    uint32_t heads = 0;
    assert_int_equal(kvedge_client_get_layer(good, &id, 1, 1, buf, 1 << 20, out, S_HEADS, &heads),
                     0);
    assert_int_equal(heads, S_HEADS);
    for (uint32_t i = 0; i < S_HEADS; i++) {
        assert_int_equal(s_recv_block(raw, &h, &b), 0);
        assert_int_equal(h.flags, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_MORE);
        assert_non_null(b);
        assert_int_equal(zframe_size(b), out[i].len);
        assert_memory_equal(zframe_data(b), buf + out[i].offset, out[i].len);
        zframe_destroy(&b);
    }
    assert_int_equal(s_recv(raw, &h, NULL), 0);
    assert_int_equal(h.flags, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_END);
    assert_int_equal(h.status, 0);
    assert_int_equal(h.count, S_HEADS);
    zsock_set_rcvtimeo(raw, 300);
    assert_int_equal(s_recv(raw, &h, NULL), -1);
    free(buf);
    zsock_destroy(&raw);
    kvedge_client_destroy(&good);
}

static void test_plaintext_only_on_loopback(void **state)
{
    s_node_t *n = *state;
    kvedge_server_opts_t so = {KVEDGE_ROLE_EDGE,
                               NULL,
                               "tcp://0.0.0.0:*",
                               true,
                               NULL,
                               NULL,
                               1,
                               0,
                               n->engine,
                               NULL,
                               NULL,
                               NULL,
                               false,
                               false,
                               false};
    kvedge_server_t *s = NULL;
    char why[256];
    assert_int_equal(kvedge_server_start(&so, &s, why, sizeof why), KVEDGE_EDENIED);
    assert_null(s);
    assert_non_null(strstr(why, "plaintext"));
    assert_true(kvedge_endpoint_is_loopback("tcp://127.0.0.1:7400"));
    assert_true(kvedge_endpoint_is_loopback("ipc:///tmp/x"));
    assert_false(kvedge_endpoint_is_loopback("tcp://10.0.0.1:7400"));
    assert_false(kvedge_endpoint_is_loopback("tcp://127evil.com:1"));
}

static void test_curve_unlisted_refused_and_garbage(void **state)
{
    s_node_t *n = *state;
    s_make_client_cert(n, "alice", NULL, true);
    s_make_client_cert(n, "eve", NULL, false);
    kvedge_client_t *alice = s_client(n, "alice", 3000);
    assert_non_null(alice);
    kvedge_chunk_id_t id;
    s_put_chunk(alice, 4, 1, 64, &id);

    /* An unlisted key completes no handshake: the connect times out within its deadline. */
    int64_t t0 = zclock_mono();
    assert_null(s_client(n, "eve", 800));
    assert_true(zclock_mono() - t0 < 800 + KT_SLACK_MS);
    /* A plaintext client gets nothing either. */
    assert_null(s_client(n, NULL, 500));

    /* Raw TCP garbage on the CURVE port: the node drops it, alice is served. */
    const char *ep = kvedge_node_endpoint(n->node);
    int port = atoi(strrchr(ep, ':') + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    uint8_t garbage[4096];
    kvedge_rng_t r;
    kvedge_rng_seed(&r, 9);
    for (size_t i = 0; i < sizeof garbage; i++)
        garbage[i] = (uint8_t)kvedge_rng_next(&r);
    ssize_t w = send(fd, garbage, sizeof garbage, MSG_NOSIGNAL);
    (void)w;
    struct timeval tv = {KVEDGE_HANDSHAKE_MS / 1000 + 3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint8_t rb[256];
    ssize_t got;
    while ((got = recv(fd, rb, sizeof rb, 0)) > 0) {
    }
    /* Dropped by the node (closed or reset), not left hanging until our timeout. */
    if (!(got == 0 || (got < 0 && errno == ECONNRESET)))
        fail_msg("garbage peer not dropped: recv %zd, %s", got, strerror(errno));
    close(fd);
    s_check_served(alice, &id);
    kvedge_client_destroy(&alice);
}

static void test_tenant_isolation(void **state)
{
    s_node_t *n = *state;
    s_make_client_cert(n, "a1", "acme", true);
    s_make_client_cert(n, "a2", "acme", true);
    s_make_client_cert(n, "b1", NULL, true);
    kvedge_client_t *a1 = s_client(n, "a1", 3000), *a2 = s_client(n, "a2", 3000),
                    *b1 = s_client(n, "b1", 3000);
    assert_non_null(a1);
    assert_non_null(a2);
    assert_non_null(b1);
    assert_memory_equal(kvedge_client_node(a1)->tenant_tag, kvedge_client_node(a2)->tenant_tag, 16);
    assert_memory_not_equal(kvedge_client_node(a1)->tenant_tag, kvedge_client_node(b1)->tenant_tag,
                            16);
    kvedge_chunk_id_t id;
    s_put_chunk(a1, 5, 12, 64, &id); /* LOOKUP counts whole chunks */
    size_t hit = 9;
    /* Same tenant, same tokens: a hit. */
    assert_int_equal(kvedge_client_lookup(a2, &id, 1, &hit), 0);
    assert_int_equal(hit, 1);
    s_check_served(a2, &id);
    /* Other tenant, same tokens: a miss everywhere, and nothing listed. */
    assert_int_equal(kvedge_client_lookup(b1, &id, 1, &hit), 0);
    assert_int_equal(hit, 0);
    kvedge_block_key_t k = {id, 0, 0};
    uint8_t buf[65536];
    kvedge_fetched_t out;
    assert_int_equal(kvedge_client_get(b1, &k, 1, buf, sizeof buf, &out), 0);
    assert_int_equal(out.status, KVEDGE_ENOTFOUND);
    kvedge_chunk_entry_t entries[4];
    size_t ne = 9;
    bool more = true;
    assert_int_equal(kvedge_client_list(b1, NULL, entries, 4, &ne, &more), 0);
    assert_int_equal(ne, 0);
    assert_int_equal(kvedge_client_list(a2, NULL, entries, 4, &ne, &more), 0);
    assert_int_equal(ne, 1);
    assert_memory_equal(&entries[0].chunk.id, &id, sizeof id); /* the client's own id */
    /* b1 deleting "its" copy of the id deletes nothing of acme's. */
    uint32_t changed = 7;
    assert_int_equal(kvedge_client_delete(b1, &id, 1, &changed), 0);
    assert_int_equal(changed, 0);
    s_check_served(a1, &id);
    kvedge_client_destroy(&a1);
    kvedge_client_destroy(&a2);
    kvedge_client_destroy(&b1);
}

static bool s_same_shape(const kvedge_model_t *a, const kvedge_model_t *b)
{
    return strcmp(a->id, b->id) == 0 && a->layers == b->layers && a->kv_heads == b->kv_heads &&
           a->head_dim == b->head_dim && a->dtype == b->dtype;
}

/* Every layer of chunk id comes back to c whole, in m's shape (every head, m's head dim). */
static void s_check_shape(kvedge_client_t *c, const kvedge_model_t *m, const kvedge_chunk_id_t *id,
                          uint32_t tokens)
{
    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    kvedge_fetched_t *out = calloc(m->kv_heads, sizeof *out);
    assert_non_null(buf);
    assert_non_null(out);
    for (uint16_t l = 0; l < m->layers; l++) {
        uint32_t heads = 0;
        assert_int_equal(kvedge_client_get_layer(c, id, 1, l, buf, cap, out, m->kv_heads, &heads),
                         0);
        assert_int_equal(heads, m->kv_heads);
        for (uint32_t h = 0; h < heads; h++) {
            kvedge_block_info_t info;
            assert_int_equal(out[h].status, 0);
            assert_int_equal(kvedge_block_parse(buf + out[h].offset, out[h].len, &info), 0);
            assert_int_equal(info.head_dim, m->head_dim);
            assert_int_equal(info.tokens, tokens);
        }
    }
    free(out);
    free(buf);
}

/* Registered model ids are per tenant: one tenant registering an id first takes nothing from
 * another, who registers the same id with its own shape and stores and reads its own blocks.
 * Built-in ids keep their built-in shape for every tenant, and a tenant's own record is
 * immutable. */
static void test_model_ids_per_tenant(void **state)
{
    s_node_t *n = *state;
    s_make_client_cert(n, "ma", "acme", true);
    s_make_client_cert(n, "mb", "bravo", true);
    s_make_client_cert(n, "mc", "charlie", true);
    kvedge_client_t *a = s_client(n, "ma", 3000), *b = s_client(n, "mb", 3000),
                    *c = s_client(n, "mc", 3000);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    kvedge_model_t real, got;
    assert_int_equal(kvedge_model_builtin(S_MODEL, &real), 0);

    /* Built-in ids: another shape is refused for every tenant, first on a fresh node or not. */
    kvedge_client_t *all[] = {b, a, c};
    for (size_t i = 0; i < 3; i++) {
        kvedge_model_t fake = real;
        fake.layers = 2;
        fake.kv_heads = 1;
        assert_int_equal(kvedge_client_put_model(all[i], &fake), KVEDGE_ESHAPE);
        fake = real;
        fake.dtype = KVEDGE_DTYPE_BF16;
        assert_int_equal(kvedge_client_put_model(all[i], &fake), KVEDGE_ESHAPE);
        kvedge_model_t llama;
        assert_int_equal(kvedge_model_builtin("llama-3-8b", &llama), 0);
        fake = llama;
        fake.kv_heads = 32;
        assert_int_equal(kvedge_client_put_model(all[i], &fake), KVEDGE_ESHAPE);
        assert_int_equal(kvedge_client_get_model(all[i], "llama-3-8b", &got), 0);
        assert_true(s_same_shape(&got, &llama));
        assert_int_equal(kvedge_client_get_model(all[i], S_MODEL, &got), 0);
        assert_true(s_same_shape(&got, &real));
        assert_int_equal(kvedge_client_put_model(all[i], &real), 0); /* its own shape: fine */
    }
    kvedge_chunk_id_t id;
    s_put_chunk(a, 9, 12, 32, &id);
    s_check_served(a, &id);

    /* B registers "m" first with S1; A registers "m" with S2: both stand, each for its own. */
    kvedge_model_t s1 = {
        .id = "m", .layers = 3, .kv_heads = 2, .head_dim = 64, .dtype = KVEDGE_DTYPE_FP16};
    kvedge_model_t s2 = {
        .id = "m", .layers = 2, .kv_heads = 4, .head_dim = 32, .dtype = KVEDGE_DTYPE_FP16};
    assert_int_equal(kvedge_client_put_model(b, &s1), 0);
    assert_int_equal(kvedge_client_put_model(a, &s2), 0);
    assert_int_equal(kvedge_client_get_model(b, "m", &got), 0);
    assert_true(s_same_shape(&got, &s1));
    assert_int_equal(kvedge_client_get_model(a, "m", &got), 0);
    assert_true(s_same_shape(&got, &s2));
    assert_int_equal(kvedge_client_get_model(c, "m", &got), KVEDGE_ENOMODEL);
    /* Each tenant's record is immutable; the same shape again answers 0. */
    assert_int_equal(kvedge_client_put_model(b, &s2), KVEDGE_ESHAPE);
    assert_int_equal(kvedge_client_put_model(a, &s1), KVEDGE_ESHAPE);
    assert_int_equal(kvedge_client_put_model(b, &s1), 0);
    assert_int_equal(kvedge_client_put_model(a, &s2), 0);

    /* Both PUT blocks of "m" in their own shape (the same tokens, so the same client chunk
     * id) and read them back; blocks in the other tenant's shape are refused. */
    kvedge_chunk_id_t ida, idb, idx;
    assert_int_equal(s_put_shape(b, &s1, 40, s1.layers, 16, &idb), 0);
    assert_int_equal(s_put_shape(a, &s2, 40, s2.layers, 16, &ida), 0);
    assert_memory_equal(&ida, &idb, sizeof ida);
    s_check_shape(b, &s1, &idb, 16);
    s_check_shape(a, &s2, &ida, 16);
    assert_int_equal(s_put_shape(a, &s1, 41, 1, 16, &idx), KVEDGE_ESHAPE);
    assert_int_equal(s_put_shape(b, &s2, 42, 1, 16, &idx), KVEDGE_ESHAPE);
    assert_int_equal(s_put_shape(c, &s1, 43, 1, 16, &idx), KVEDGE_ENOMODEL);
    /* C registering "m" later is as free as A was. */
    kvedge_model_t s3 = s1;
    s3.head_dim = 128;
    assert_int_equal(kvedge_client_put_model(c, &s3), 0);
    assert_int_equal(s_put_shape(c, &s3, 40, 1, 16, &idx), 0);
    s_check_shape(b, &s1, &idb, 16);
    s_check_shape(a, &s2, &ida, 16);

    /* The records survive a restart, each in its tenant. */
    kvedge_client_destroy(&a);
    kvedge_client_destroy(&b);
    kvedge_client_destroy(&c);
    s_node_stop(n);
    s_node_start(n);
    a = s_client(n, "ma", 3000);
    b = s_client(n, "mb", 3000);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(kvedge_client_get_model(b, "m", &got), 0);
    assert_true(s_same_shape(&got, &s1));
    assert_int_equal(kvedge_client_get_model(a, "m", &got), 0);
    assert_true(s_same_shape(&got, &s2));
    s_check_shape(b, &s1, &idb, 16);
    s_check_shape(a, &s2, &ida, 16);
    kvedge_client_destroy(&a);
    kvedge_client_destroy(&b);
}

/* A store written before model ids had tenant namespaces (each record keyed by its bare id):
 * its records are node-wide, so they still resolve for every tenant, whose blocks of them go
 * on being stored and read; they stay bound (another shape is refused), while ids the old
 * store never knew are registered per tenant. */
static void test_model_store_before_namespaces(void **state)
{
    s_node_t *n = *state;
    s_node_stop(n);
    kvedge_model_t old = {
        .id = "legacy-m", .layers = 2, .kv_heads = 3, .head_dim = 64, .dtype = KVEDGE_DTYPE_FP16};
    kvedge_engine_opts_t eo;
    kvedge_engine_opts_default(&eo);
    kvedge_engine_t *e = NULL;
    char why[256] = "";
    assert_int_equal(kvedge_engine_open(n->dir, &eo, &e, why, sizeof why), 0);
    uint8_t rec[KVEDGE_MODEL_RECORD_BYTES];
    kvedge_model_pack(&old, rec);
    assert_int_equal(
        kvedge_engine_debug_put_model_record(e, old.id, strlen(old.id), rec, sizeof rec), 0);
    kvedge_engine_destroy(&e);
    s_node_start(n);

    s_make_client_cert(n, "la", "acme", true);
    s_make_client_cert(n, "lb", "bravo", true);
    kvedge_client_t *a = s_client(n, "la", 3000), *b = s_client(n, "lb", 3000);
    assert_non_null(a);
    assert_non_null(b);
    kvedge_model_t got;
    assert_int_equal(kvedge_client_get_model(a, old.id, &got), 0);
    assert_true(s_same_shape(&got, &old));
    assert_int_equal(kvedge_client_get_model(b, old.id, &got), 0);
    assert_true(s_same_shape(&got, &old));
    kvedge_chunk_id_t ida, idb;
    assert_int_equal(s_put_shape(a, &old, 50, old.layers, 32, &ida), 0);
    assert_int_equal(s_put_shape(b, &old, 51, old.layers, 32, &idb), 0);
    s_check_shape(a, &old, &ida, 32);
    s_check_shape(b, &old, &idb, 32);
    /* Read-only for tenants: the same shape is accepted, another is refused. */
    assert_int_equal(kvedge_client_put_model(a, &old), 0);
    kvedge_model_t other = old;
    other.layers = 5;
    assert_int_equal(kvedge_client_put_model(b, &other), KVEDGE_ESHAPE);
    /* New ids: per tenant. */
    kvedge_model_t na = {
        .id = "new-m", .layers = 1, .kv_heads = 1, .head_dim = 64, .dtype = KVEDGE_DTYPE_FP16};
    kvedge_model_t nb = na;
    nb.layers = 4;
    assert_int_equal(kvedge_client_put_model(a, &na), 0);
    assert_int_equal(kvedge_client_put_model(b, &nb), 0);
    kvedge_client_destroy(&a);
    kvedge_client_destroy(&b);
    /* The old record is still where the old layout had it, and the tenants' are apart. */
    assert_int_equal(kvedge_engine_get_model(n->engine, old.id, &got), 0);
    assert_true(s_same_shape(&got, &old));
    assert_int_equal(kvedge_engine_get_model(n->engine, "new-m", &got), KVEDGE_ENOMODEL);
}

/* One MODEL exchange on a raw socket; returns the header status, *nf the payload frames and
 * *have the record when there is one. */
static int32_t s_raw_model(zsock_t *s, uint64_t rid, const kvedge_model_t *m, size_t *nf,
                           kvedge_model_t *have)
{
    uint8_t rec[KVEDGE_WIRE_MODEL_BYTES];
    assert_int_equal(kvedge_wire_model_pack(m, rec), 0);
    s_send_frames(s, s_hdr(KVEDGE_OP_MODEL, 0, rid, 0, 0, 0, 2000), zframe_new(rec, sizeof rec),
                  NULL);
    zmsg_t *msg = zmsg_recv(s);
    assert_non_null(msg);
    zframe_t *f = zmsg_first(msg);
    kvedge_wire_header_t h;
    assert_int_equal(kvedge_wire_header_parse(zframe_data(f), zframe_size(f), &h), 0);
    assert_int_equal(h.request_id, rid);
    *nf = zmsg_size(msg) - 1;
    if (*nf == 1) {
        f = zmsg_next(msg);
        assert_int_equal(kvedge_wire_model_parse(zframe_data(f), zframe_size(f), have), 0);
    }
    zmsg_destroy(&msg);
    return h.status;
}

/* A refused registration says so in the header (KVEDGE_ESHAPE, no payload), not with status 0
 * and the node's record; an accepted one answers 0 and the record. */
static void test_model_refusal_status(void **state)
{
    s_node_t *n = *state;
    zsock_t *s = s_raw(n);
    kvedge_model_t real, have;
    size_t nf = 9;
    assert_int_equal(kvedge_model_builtin(S_MODEL, &real), 0);
    kvedge_model_t fake = real;
    fake.head_dim = 128;
    assert_int_equal(s_raw_model(s, 1, &fake, &nf, &have), KVEDGE_ESHAPE);
    assert_int_equal(nf, 0);
    assert_int_equal(s_raw_model(s, 2, &real, &nf, &have), 0);
    assert_int_equal(nf, 1);
    assert_true(s_same_shape(&have, &real));
    kvedge_model_t x = {
        .id = "raw-x", .layers = 3, .kv_heads = 5, .head_dim = 32, .dtype = KVEDGE_DTYPE_FP32};
    assert_int_equal(s_raw_model(s, 3, &x, &nf, &have), 0);
    assert_int_equal(nf, 1);
    assert_true(s_same_shape(&have, &x));
    kvedge_model_t y = x;
    y.layers = 4;
    assert_int_equal(s_raw_model(s, 4, &y, &nf, &have), KVEDGE_ESHAPE);
    assert_int_equal(nf, 0);
    assert_int_equal(s_raw_model(s, 5, &x, &nf, &have), 0); /* same shape: 0 */
    assert_int_equal(nf, 1);
    assert_true(s_same_shape(&have, &x));
    assert_int_equal(kvedge_engine_get_model(n->engine, "raw-x", &have), 0);
    assert_true(s_same_shape(&have, &x));
    zsock_destroy(&s);
}

static void test_restart_keeps_data(void **state)
{
    s_node_t *n = *state;
    kvedge_client_t *c = s_client(n, NULL, 3000);
    kvedge_chunk_id_t id;
    s_put_chunk(c, 6, 2, 128, &id);
    uint8_t *before = malloc(1 << 20), *after = malloc(1 << 20);
    kvedge_fetched_t o1[S_HEADS], o2[S_HEADS];
    uint32_t heads;
    assert_int_equal(kvedge_client_get_layer(c, &id, 1, 1, before, 1 << 20, o1, S_HEADS, &heads),
                     0);
    kvedge_client_destroy(&c);
    s_node_stop(n);
    s_node_start(n); /* a new port, the same data directory */
    c = s_client(n, NULL, 3000);
    assert_non_null(c);
    assert_int_equal(kvedge_client_get_layer(c, &id, 1, 1, after, 1 << 20, o2, S_HEADS, &heads), 0);
    for (int h = 0; h < S_HEADS; h++) {
        assert_int_equal(o2[h].status, 0);
        assert_int_equal(o1[h].len, o2[h].len);
        assert_memory_equal(before + o1[h].offset, after + o2[h].offset, o1[h].len);
    }
    free(before);
    free(after);
    kvedge_client_destroy(&c);
}

/* A node in its own process (the kvedge binary), killed with SIGKILL in the middle of a
 * stream: the client's call returns within its deadline. */
static void test_node_killed_mid_stream(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvedge-kill-XXXXXX";
    assert_non_null(mkdtemp(dir));
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
        dup2(pfd[1], STDOUT_FILENO);
        close(pfd[0]);
        /* ipc, not an ephemeral tcp port: once the node is dead, no other test's node may
         * take its port and answer in its place. */
        char bind[300];
        snprintf(bind, sizeof bind, "ipc://%s/node.sock", dir);
        execl(KVEDGE_BIN, "kvedge", "--data", dir, "store", "--insecure", "--bind", bind,
              "--log-level", "warn", "--metrics", "off", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char line[256] = "", ep[256] = "";
    ssize_t got = read(pfd[0], line, sizeof line - 1);
    assert_true(got > 0);
    line[got] = '\0';
    assert_int_equal(sscanf(line, "listening %255s", ep), 1);
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = 1500;
    o.credit = 1;
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), 0);
    kvedge_chunk_id_t id;
    s_put_chunk(c, 7, 1, 256, &id);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(pfd[0]);
    int64_t t0 = zclock_mono();
    uint8_t *buf = malloc(1 << 20);
    kvedge_fetched_t out[S_HEADS];
    uint32_t heads;
    int rc = kvedge_client_get_layer(c, &id, 1, 0, buf, 1 << 20, out, S_HEADS, &heads);
    if (rc != KVEDGE_ETIMEDOUT)
        fail_msg("ep %s: rc %d heads %u after %lld ms", ep, rc, heads,
                 (long long)(zclock_mono() - t0));
    assert_true(zclock_mono() - t0 < 1500 + KT_SLACK_MS);
    free(buf);
    kvedge_client_destroy(&c);
    s_rmrf(dir);
}

/* The emulated link of the client (the shaper) and the meter that watches it: a 100 Mbit/s,
 * 20 ms link shows its latency and its rate, and the meter measures both. */
static void test_link_emulation_and_meter(void **state)
{
    s_node_t *n = *state;
    kvedge_client_t *fast = s_client(n, NULL, 5000);
    kvedge_chunk_id_t id;
    s_put_chunk(fast, 8, 1, 256, &id);
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = kvedge_node_endpoint(n->node);
    o.deadline_ms = 10000;
    o.link = "100mbit,20ms";
    /* Credit covering the bandwidth-delay product (12.5 MB/s x 40 ms = 500 KB): with less,
     * the stream waits a round trip for credit and the meter rightly sees less. */
    o.credit = 64;
    kvedge_client_t *slow = NULL;
    assert_int_equal(kvedge_client_connect(&o, &slow), 0);
    o.link = "100 furlongs";
    kvedge_client_t *bad = NULL;
    assert_int_equal(kvedge_client_connect(&o, &bad), KVEDGE_EINVAL);
    assert_null(bad);

    double rtt_slow = 0, rtt_fast = 1e12;
    assert_int_equal(kvedge_client_ping(slow, 0, &rtt_slow, NULL), 0);
    assert_true(rtt_slow >= 40000.0); /* 20 ms each way */
    /* Without the emulated link: the best of a few pings (one may wait for a busy core). */
    for (int i = 0; i < 5; i++) {
        double rtt_us = 0;
        assert_int_equal(kvedge_client_ping(fast, 0, &rtt_us, NULL), 0);
        rtt_fast = rtt_us < rtt_fast ? rtt_us : rtt_fast;
    }
    assert_true(rtt_fast < 20000.0);

    uint8_t *buf = malloc(1 << 20);
    kvedge_fetched_t out[S_HEADS];
    uint32_t heads;
    size_t bytes = 0;
    for (int rep = 0; rep < 4; rep++) {
        int64_t t0 = zclock_usecs();
        assert_int_equal(
            kvedge_client_get_layer(slow, &id, 1, 0, buf, 1 << 20, out, S_HEADS, &heads), 0);
        int64_t took = zclock_usecs() - t0;
        bytes = 0;
        for (int h = 0; h < S_HEADS; h++)
            bytes += out[h].len;
        /* At least the latency one way back plus the bytes at 100 Mbit/s. */
        double floor_us = 20000.0 + (double)bytes * 8.0 / 100e6 * 1e6 * 0.9;
        if ((double)took < floor_us)
            fail_msg("layer of %zu bytes in %lld us over an emulated 100mbit,20ms link", bytes,
                     (long long)took);
    }
    double bw = 0, rtt = 0;
    uint64_t samples = 0;
    assert_int_equal(kvedge_client_link(slow, &bw, &rtt, &samples), 0);
    assert_true(samples >= 5);
    assert_true(rtt > 30000.0);
    /* 100 Mbit/s = 12.5 MB/s of payload, give or take framing and the EWMA's start. */
    if (!(bw > 12.5e6 / 2 && bw < 12.5e6 * 2))
        fail_msg("meter says %.0f B/s over a 12.5 MB/s link (layer %zu bytes)", bw, bytes);
    double fast_bw = 0;
    assert_int_equal(kvedge_client_get_layer(fast, &id, 1, 0, buf, 1 << 20, out, S_HEADS, &heads),
                     0);
    assert_int_equal(kvedge_client_link(fast, &fast_bw, NULL, NULL), 0);
    free(buf);
    kvedge_client_destroy(&slow);
    kvedge_client_destroy(&fast);
}

/* kvedge_node_start refuses bad settings before it touches anything. */
static void test_node_settings_refused(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvedge-nodeset-XXXXXX";
    assert_non_null(mkdtemp(dir));
    kvedge_node_settings_t ns;
    kvedge_node_t *node = NULL;
    char why[256];

    kvedge_node_settings_default(&ns); /* no data directory */

    snprintf(ns.metrics, sizeof ns.metrics, "off");
    assert_int_equal(kvedge_node_start(&ns, &node, why, sizeof why), KVEDGE_EINVAL);
    assert_non_null(strstr(why, "data directory"));

    kvedge_node_settings_default(&ns);

    snprintf(ns.metrics, sizeof ns.metrics, "off");
    snprintf(ns.data, sizeof ns.data, "%s/data", dir);
    ns.role = KVEDGE_ROLE_PROXY;
    assert_int_equal(kvedge_node_start(&ns, &node, why, sizeof why), KVEDGE_EINVAL);
    assert_non_null(strstr(why, "role"));

    ns.role = KVEDGE_ROLE_EDGE;
    snprintf(ns.master, sizeof ns.master, "tcp://127.0.0.1:7410");
    assert_int_equal(kvedge_node_start(&ns, &node, why, sizeof why), KVEDGE_EINVAL);
    assert_non_null(strstr(why, "master_pub"));
    snprintf(ns.master_pub, sizeof ns.master_pub, "tcp://127.0.0.1:7411");
    snprintf(ns.node_id, sizeof ns.node_id, "bad id");
    assert_int_equal(kvedge_node_start(&ns, &node, why, sizeof why), KVEDGE_EINVAL);

    kvedge_node_settings_default(&ns);

    snprintf(ns.metrics, sizeof ns.metrics, "off");
    snprintf(ns.data, sizeof ns.data, "%s/data", dir);
    snprintf(ns.bind, sizeof ns.bind, "tcp://0.0.0.0:*");
    ns.insecure = true;
    assert_int_equal(kvedge_node_start(&ns, &node, why, sizeof why), KVEDGE_EDENIED);
    assert_non_null(strstr(why, "plaintext"));
    assert_null(node);
    /* Nothing was created by a refused start. */
    char data[300];
    snprintf(data, sizeof data, "%s/data", dir);
    assert_int_equal(access(data, F_OK), -1);
    s_rmrf(dir);
}

/* With CURVE and no certificate given, the node makes DATA/node.cert (secret 0600) and an
 * empty allowlist DATA/clients on first start, keeps them on the next, and serves; a broken
 * subscriptions file disables only the historical cache. */
static void test_node_start_defaults(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvedge-nodedef-XXXXXX";
    assert_non_null(mkdtemp(dir));
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    snprintf(ns.data, sizeof ns.data, "%s/data", dir);
    snprintf(ns.bind, sizeof ns.bind, "tcp://127.0.0.1:*");
    snprintf(ns.subscriptions, sizeof ns.subscriptions, "%s/missing.conf", dir);
    kvedge_node_t *node = NULL;
    char why[256] = "";
    if (kvedge_node_start(&ns, &node, why, sizeof why) != KVEDGE_OK)
        fail_msg("node start: %s", why);
    const char *key = kvedge_node_public_key(node);
    assert_non_null(key);
    assert_int_equal(strlen(key), 40);
    char key1[41];
    snprintf(key1, sizeof key1, "%s", key);
    assert_non_null(strstr(kvedge_node_endpoint(node), "tcp://127.0.0.1:"));
    assert_non_null(kvedge_node_engine(node));
    assert_int_equal(kvedge_node_publish(node, NULL), KVEDGE_EINVAL); /* no master */
    char p[400];
    struct stat st;
    snprintf(p, sizeof p, "%s/data/node.cert_secret", dir);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    snprintf(p, sizeof p, "%s/data/clients", dir);
    assert_int_equal(stat(p, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    kvedge_node_destroy(&node);
    assert_null(node);
    kvedge_node_destroy(&node); /* idempotent */

    /* The second start keeps the key. */
    if (kvedge_node_start(&ns, &node, why, sizeof why) != KVEDGE_OK)
        fail_msg("node restart: %s", why);
    assert_string_equal(kvedge_node_public_key(node), key1);
    kvedge_node_destroy(&node);
    s_rmrf(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_settings_refused),
        cmocka_unit_test(test_node_start_defaults),
        cmocka_unit_test(test_node_killed_mid_stream),
        cmocka_unit_test_setup_teardown(test_malformed_messages, s_setup_plain, s_teardown),
        cmocka_unit_test_setup_teardown(test_oversized_frame_disconnects, s_setup_plain,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_stalled_reader_and_credit_abuse, s_setup_plain,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_cancel_ends_stream, s_setup_plain, s_teardown),
        cmocka_unit_test_setup_teardown(test_plaintext_only_on_loopback, s_setup_plain, s_teardown),
        cmocka_unit_test_setup_teardown(test_curve_unlisted_refused_and_garbage, s_setup_curve,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_tenant_isolation, s_setup_curve, s_teardown),
        cmocka_unit_test_setup_teardown(test_model_ids_per_tenant, s_setup_curve, s_teardown),
        cmocka_unit_test_setup_teardown(test_model_store_before_namespaces, s_setup_curve,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_model_refusal_status, s_setup_plain, s_teardown),
        cmocka_unit_test_setup_teardown(test_restart_keeps_data, s_setup_plain, s_teardown),
        cmocka_unit_test_setup_teardown(test_link_emulation_and_meter, s_setup_plain, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
