/* The Storage Master and its replica view, on ipc:// endpoints in a temp dir: set and get,
 * ordering across views, late joiners, gap detection and re-sync, master restarts, a view
 * that starts with the master down (snapshot file, STALE), sets against a dead master,
 * heartbeats and health, malformed kvmsgs, CURVE refusals; and the codecs' round trips and
 * degenerate inputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <czmq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/master/master.h"
#include "runtime/mview.h"
#include "access/codec/error.h"
#include "tests/common/testutil.h"

typedef struct {
    char dir[128];
    char data[200];
    char router[200];
    char pub[200];
    char certs[200];
    kvedge_master_t *master;
    bool curve;
} s_fx_t;

static void s_rmrf(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static int64_t s_now(void)
{
    return zclock_mono();
}

static void s_master_start_opts(s_fx_t *fx, kvedge_master_opts_t *o)
{
    o->bind = fx->router;
    o->pub = fx->pub;
    o->data_dir = fx->data;
    char cert[300], clients[300];
    snprintf(cert, sizeof cert, "%s/master_secret", fx->certs);
    snprintf(clients, sizeof clients, "%s/clients", fx->certs);
    o->insecure = !fx->curve;
    o->cert = fx->curve ? cert : NULL;
    o->clients_dir = fx->curve ? clients : NULL;
    char why[512] = "";
    int rc = kvedge_master_start(o, &fx->master, why, sizeof why);
    if (rc != KVEDGE_OK)
        fail_msg("master start: %s (%s)", why, kvedge_strerror(rc));
}

static void s_master_start(s_fx_t *fx)
{
    kvedge_master_opts_t o;
    kvedge_master_opts_default(&o);
    s_master_start_opts(fx, &o);
}

static int s_setup(void **state)
{
    s_fx_t *fx = calloc(1, sizeof *fx);
    snprintf(fx->dir, sizeof fx->dir, "/tmp/kvedge-master-XXXXXX");
    if (!fx || !mkdtemp(fx->dir))
        return -1;
    snprintf(fx->data, sizeof fx->data, "%s/data", fx->dir);
    snprintf(fx->router, sizeof fx->router, "ipc://%s/r.ipc", fx->dir);
    snprintf(fx->pub, sizeof fx->pub, "ipc://%s/p.ipc", fx->dir);
    snprintf(fx->certs, sizeof fx->certs, "%s/certs", fx->dir);
    *state = fx;
    return 0;
}

static int s_teardown(void **state)
{
    s_fx_t *fx = *state;
    kvedge_master_destroy(&fx->master);
    s_rmrf(fx->dir);
    free(fx);
    return 0;
}

static kvedge_mview_t *s_view_opts(s_fx_t *fx, kvedge_mview_opts_t *o)
{
    o->master = fx->router;
    o->pub = fx->pub;
    kvedge_mview_t *v = NULL;
    assert_int_equal(kvedge_mview_start(o, &v), KVEDGE_OK);
    return v;
}

static kvedge_mview_t *s_view(s_fx_t *fx)
{
    kvedge_mview_opts_t o;
    kvedge_mview_opts_default(&o);
    kvedge_mview_t *v = s_view_opts(fx, &o);
    assert_int_equal(kvedge_mview_wait(v, 0, 3000), KVEDGE_OK);
    return v;
}

static size_t s_node_body(const char *endpoint, uint64_t capacity, uint8_t *out)
{
    kvedge_master_node_t n;
    memset(&n, 0, sizeof n);
    n.role = KVEDGE_ROLE_EDGE;
    snprintf(n.region, sizeof n.region, "eu-1");
    snprintf(n.endpoint, sizeof n.endpoint, "%s", endpoint);
    n.capacity_bytes = capacity;
    n.bandwidth_bytes_per_s = 125000000;
    n.rtt_us = 1500;
    size_t len;
    assert_int_equal(kvedge_master_node_pack(&n, out, &len), KVEDGE_OK);
    return len;
}

/* SET node/<id> through a view. */
static void s_set_node(kvedge_mview_t *v, const char *id, uint64_t capacity)
{
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len = s_node_body("tcp://10.0.0.1:7400", capacity, body);
    char key[128];
    snprintf(key, sizeof key, "node/%s", id);
    assert_int_equal(kvedge_mview_set(v, key, body, len, 3000), KVEDGE_OK);
}

/* Everything a view holds, as text: key, seq, body hex, one line each, in key order. */
typedef struct {
    char *buf;
    size_t len, cap;
} s_text_t;

static int s_text_cb(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    s_text_t *t = ctx;
    size_t need = t->len + strlen(key) + 32 + 2 * len + 2;
    if (need > t->cap) {
        t->cap = need * 2;
        t->buf = realloc(t->buf, t->cap);
        assert_non_null(t->buf);
    }
    t->len += (size_t)sprintf(t->buf + t->len, "%s %llu ", key, (unsigned long long)seq);
    for (size_t i = 0; i < len; i++)
        t->len += (size_t)sprintf(t->buf + t->len, "%02x", body[i]);
    t->buf[t->len++] = '\n';
    t->buf[t->len] = '\0';
    return 0;
}

static char *s_text(kvedge_mview_t *v)
{
    s_text_t t = {calloc(1, 1), 0, 1};
    assert_int_equal(kvedge_mview_foreach(v, NULL, s_text_cb, &t), KVEDGE_OK);
    return t.buf;
}

/* The view holds exactly what a fresh snapshot of the master holds. */
static void s_assert_same_as_master(s_fx_t *fx, kvedge_mview_t *v)
{
    kvedge_mview_t *fresh = s_view(fx);
    assert_int_equal(kvedge_mview_wait(v, kvedge_master_seq(fx->master), 5000), KVEDGE_OK);
    assert_int_equal(kvedge_mview_seq(v), kvedge_mview_seq(fresh));
    char *a = s_text(v), *b = s_text(fresh);
    assert_string_equal(a, b);
    free(a);
    free(b);
    kvedge_mview_destroy(&fresh);
}

/* ---------------------------------------------------------------- codecs */

static void test_records_roundtrip(void **state)
{
    (void)state;
    uint8_t buf[KVEDGE_MASTER_RECORD_MAX_BYTES], again[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len, len2;

    kvedge_master_node_t n = {KVEDGE_ROLE_CLOUD, "us-west", "tcp://1.2.3.4:7400", "", 1u << 30,
                              1000000,           250};
    zcert_t *c = zcert_new();
    snprintf(n.public_key, sizeof n.public_key, "%s", zcert_public_txt(c));
    zcert_destroy(&c);
    assert_int_equal(kvedge_master_node_pack(&n, buf, &len), 0);
    kvedge_master_node_t n2;
    assert_int_equal(kvedge_master_node_parse(buf, len, &n2), 0);
    assert_string_equal(n2.endpoint, n.endpoint);
    assert_string_equal(n2.public_key, n.public_key);
    assert_int_equal(n2.capacity_bytes, n.capacity_bytes);
    assert_int_equal(kvedge_master_node_pack(&n2, again, &len2), 0);
    assert_memory_equal(buf, again, len);
    assert_int_equal(kvedge_master_node_parse(buf, len - 1, &n2), KVEDGE_EPROTO);
    buf[1] = 2;
    assert_int_equal(kvedge_master_node_parse(buf, len, &n2), KVEDGE_EVERSION);
    n.role = 0;
    assert_int_equal(kvedge_master_node_pack(&n, buf, &len), KVEDGE_EINVAL);
    n.role = KVEDGE_ROLE_EDGE;
    n.endpoint[0] = '\0';
    assert_int_equal(kvedge_master_node_pack(&n, buf, &len), KVEDGE_EINVAL);

    kvedge_model_t m;
    assert_int_equal(kvedge_model_builtin("llama-2-7b", &m), 0);
    assert_int_equal(kvedge_master_model_pack(&m, buf, &len), 0);
    kvedge_model_t m2;
    assert_int_equal(kvedge_master_model_parse(buf, len, &m2), 0);
    assert_string_equal(m2.id, "llama-2-7b");
    assert_int_equal(m2.layers, 32);
    snprintf(m.id, sizeof m.id, "org/model"); /* '/' cannot be in a key */
    assert_int_equal(kvedge_master_model_pack(&m, buf, &len), KVEDGE_EINVAL);

    kvedge_master_map_t *map = calloc(1, sizeof *map), *map2 = calloc(1, sizeof *map2);
    map->cloud_layers = 32;
    map->edge_layers = 5;
    for (int i = 0; i < 5; i++)
        map->from[i] = (uint16_t)(i * 6);
    map->from[4] = KVEDGE_MASTER_MAP_NONE;
    assert_int_equal(kvedge_master_map_pack(map, buf, &len), 0);
    assert_int_equal(len, 8 + 10);
    assert_int_equal(kvedge_master_map_parse(buf, len, map2), 0);
    assert_memory_equal(map->from, map2->from, 10);
    map->from[0] = 32; /* past the cloud model */
    assert_int_equal(kvedge_master_map_pack(map, buf, &len), KVEDGE_EINVAL);
    map->edge_layers = 0;
    assert_int_equal(kvedge_master_map_pack(map, buf, &len), KVEDGE_EINVAL);
    free(map);
    free(map2);

    kvedge_master_dir_t d, d2;
    memset(&d, 0, sizeof d);
    snprintf(d.model_id, sizeof d.model_id, "opt-125m");
    d.layers = 12;
    kvedge_master_dir_set(&d, 0);
    kvedge_master_dir_set(&d, 11);
    kvedge_master_dir_set(&d, 12); /* out of range: ignored */
    assert_int_equal(kvedge_master_dir_pack(&d, buf, &len), 0);
    assert_int_equal(len, 8 + 8 + 2);
    assert_int_equal(kvedge_master_dir_parse(buf, len, &d2), 0);
    assert_true(kvedge_master_dir_has(&d2, 0) && kvedge_master_dir_has(&d2, 11));
    assert_false(kvedge_master_dir_has(&d2, 5) || kvedge_master_dir_has(&d2, 12));
    buf[len - 1] |= 0x80; /* a bit past the last layer */
    assert_int_equal(kvedge_master_dir_parse(buf, len, &d2), KVEDGE_EPROTO);
    /* The precisions it serves (rungs): none said serves anything; int8 held by a node that
     * derives serves int8 and everything coarser, never lossless; without DERIVES only int8. */
    const kvedge_prec_t lossless = KVEDGE_PREC_MAKE(KVEDGE_PREC_LOSSLESS, 0),
                        int8 = KVEDGE_PREC_MAKE(KVEDGE_PREC_INT8, 0),
                        int4 = KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, 0),
                        int4t = KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G128, KVEDGE_PREC_THINK_50);
    assert_int_equal(kvedge_master_rung_bit(lossless), 0);
    assert_int_equal(kvedge_master_rung_bit(int4t), 14);
    assert_int_equal(kvedge_master_rung_bit(KVEDGE_PREC_STORED), -1);
    assert_int_equal(kvedge_master_rung_bit(0x7F), -1);
    d.rungs = 0;
    assert_true(kvedge_master_dir_serves(&d, lossless) && kvedge_master_dir_serves(&d, int4t));
    d.rungs = (uint16_t)(1u << kvedge_master_rung_bit(int8)) | KVEDGE_MASTER_DIR_DERIVES;
    assert_int_equal(kvedge_master_dir_pack(&d, buf, &len), 0);
    assert_int_equal(kvedge_master_dir_parse(buf, len, &d2), 0);
    assert_int_equal(d2.rungs, d.rungs);
    assert_true(kvedge_master_dir_serves(&d2, int8) && kvedge_master_dir_serves(&d2, int4) &&
                kvedge_master_dir_serves(&d2, int4t));
    assert_false(kvedge_master_dir_serves(&d2, lossless));
    assert_false(kvedge_master_dir_serves(&d2, KVEDGE_PREC_STORED));
    /* Entropy-coded rungs: made by a node that derives, from the held rung or a finer one. */
    const kvedge_prec_t int8ec = int8 | KVEDGE_PREC_EC, int4ec = int4 | KVEDGE_PREC_EC;
    assert_int_equal(kvedge_master_rung_bit(int8ec), kvedge_master_rung_bit(int8));
    assert_true(kvedge_master_dir_serves(&d2, int8ec) && kvedge_master_dir_serves(&d2, int4ec));
    d.rungs &= (uint16_t)~KVEDGE_MASTER_DIR_DERIVES;
    assert_true(kvedge_master_dir_serves(&d, int8));
    assert_false(kvedge_master_dir_serves(&d, int4));
    assert_false(kvedge_master_dir_serves(&d, int8ec)); /* held plain, and no deriving */
    /* tc has no bit of its own (it would be lossless+think-75's): derived from int8 or
     * lossless by a node that derives, never from int4. */
    assert_int_equal(kvedge_master_rung_bit(KVEDGE_PREC_TC), -1);
    assert_false(kvedge_master_dir_serves(&d, KVEDGE_PREC_TC));
    assert_true(kvedge_master_dir_serves(&d2, KVEDGE_PREC_TC));
    d2.rungs = (uint16_t)(1u << kvedge_master_rung_bit(int4)) | KVEDGE_MASTER_DIR_DERIVES;
    assert_false(kvedge_master_dir_serves(&d2, KVEDGE_PREC_TC));
    d2.rungs = (uint16_t)(1u << kvedge_master_rung_bit(KVEDGE_PREC_MAKE(KVEDGE_PREC_LOSSLESS, 1))) |
               KVEDGE_MASTER_DIR_DERIVES;
    assert_false(kvedge_master_dir_serves(&d2, KVEDGE_PREC_TC));
    d.rungs = KVEDGE_MASTER_DIR_DERIVES; /* "derives" alone says nothing: refused both ways */
    assert_int_equal(kvedge_master_dir_pack(&d, buf, &len), KVEDGE_EINVAL);
    d.rungs = 1;
    assert_int_equal(kvedge_master_dir_pack(&d, buf, &len), 0);
    buf[6] = 0;
    buf[7] = 0x80;
    assert_int_equal(kvedge_master_dir_parse(buf, len, &d2), KVEDGE_EPROTO);
    d.rungs = 0;

    kvedge_master_link_t l = {1200, 50000000, 7, false, 1700000000000ull}, l2;
    assert_int_equal(kvedge_master_link_pack(&l, buf, &len), 0);
    assert_int_equal(kvedge_master_link_parse(buf, len, &l2), 0);
    assert_int_equal(l2.samples, 7);
    buf[2] = 2;
    assert_int_equal(kvedge_master_link_parse(buf, len, &l2), KVEDGE_EPROTO);

    kvedge_master_health_t h = {KVEDGE_MASTER_HEALTH_SUSPECT, 5, 6}, h2;
    assert_int_equal(kvedge_master_health_pack(&h, buf, &len), 0);
    assert_int_equal(kvedge_master_health_parse(buf, len, &h2), 0);
    assert_int_equal(h2.state, KVEDGE_MASTER_HEALTH_SUSPECT);
    /* A record under another type's key. */
    assert_int_equal(kvedge_master_link_parse(buf, len, &l2), KVEDGE_EPROTO);
    /* Degenerate inputs. */
    assert_int_equal(kvedge_master_node_parse(NULL, 0, &n2), KVEDGE_EPROTO);
    assert_int_equal(kvedge_master_dir_parse(buf, 0, &d2), KVEDGE_EPROTO);
}

/* adapter/<cloud>/<edge>: an adapter file's digest record (docs/master.md, "Records"). */
static void test_adapter_record(void **state)
{
    (void)state;
    static kvedge_master_adapter_t a, a2; /* 2 KiB each: off the stack */
    memset(&a, 0, sizeof a);
    for (int i = 0; i < KVEDGE_MASTER_DIGEST_BYTES; i++)
        a.digest[i] = (uint8_t)(i * 7 + 1);
    a.size = 593752;
    a.fit = KVEDGE_MASTER_FIT_DISTILLED;
    a.cloud_layers = 6;
    a.edge_layers = 4;
    const uint16_t from[4] = {1, 1, KVEDGE_MASTER_MAP_NONE, 4};
    memcpy(a.from, from, sizeof from);
    snprintf(a.cloud_rope, sizeof a.cloud_rope, "theta=10000");
    snprintf(a.edge_rope, sizeof a.edge_rope, "none");
    uint8_t buf[KVEDGE_MASTER_RECORD_MAX_BYTES], back[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len, blen;
    assert_int_equal(kvedge_master_adapter_pack(&a, buf, &len), 0);
    assert_int_equal(len, KVEDGE_MASTER_ADAPTER_FIXED_BYTES + 2 * 4 + 11 + 4);
    assert_int_equal(kvedge_master_adapter_parse(buf, len, &a2), 0);
    assert_memory_equal(a2.digest, a.digest, KVEDGE_MASTER_DIGEST_BYTES);
    assert_int_equal(a2.size, 593752);
    assert_int_equal(a2.fit, KVEDGE_MASTER_FIT_DISTILLED);
    assert_int_equal(a2.from[2], KVEDGE_MASTER_MAP_NONE);
    assert_int_equal(a2.from[3], 4);
    assert_string_equal(a2.cloud_rope, "theta=10000");
    assert_string_equal(a2.edge_rope, "none");
    assert_int_equal(kvedge_master_adapter_pack(&a2, back, &blen), 0);
    assert_int_equal(blen, len);
    assert_memory_equal(back, buf, len);
    assert_string_equal(kvedge_master_fit_name(a2.fit), "distilled");
    assert_string_equal(kvedge_master_fit_name(9), "?");
    /* The largest record fits the bound. */
    a2.edge_layers = KVEDGE_MODEL_MAX_LAYERS;
    memset(a2.cloud_rope, 'x', KVEDGE_MASTER_ROPE_MAX_BYTES);
    memset(a2.edge_rope, 'y', KVEDGE_MASTER_ROPE_MAX_BYTES);
    assert_int_equal(kvedge_master_adapter_pack(&a2, back, &blen), 0);
    assert_int_equal(blen, KVEDGE_MASTER_RECORD_MAX_BYTES);

    /* The master's SET rule: the record under its key; every field checked. */
    const char *key = "adapter/kjv-cloud/kjv-edge";
    kvedge_master_key_t k;
    assert_int_equal(kvedge_master_key_parse(key, strlen(key), &k), 0);
    assert_int_equal(k.space, KVEDGE_MASTER_SPACE_ADAPTER);
    assert_int_equal(kvedge_master_check_set(key, strlen(key), buf, len), 0);
    assert_int_equal(kvedge_master_check_set(key, strlen(key), buf, 0), 0); /* a delete */
    assert_int_equal(kvedge_master_key_parse("adapter/kjv-cloud", 17, &k), KVEDGE_EINVAL);
    const struct {
        size_t at;
        uint8_t v;
        int rc;
    } bad[] = {
        {0, 'P', KVEDGE_EPROTO},    /* a map's type */
        {1, 2, KVEDGE_EVERSION},    /* another version */
        {2, 0, KVEDGE_EPROTO},      /* fit 0 */
        {2, 5, KVEDGE_EPROTO},      /* fit past the last kind */
        {3, 1, KVEDGE_EPROTO},      /* reserved */
        {4, 0, KVEDGE_EPROTO},      /* 0 cloud layers */
        {8, 0, KVEDGE_EPROTO},      /* size 0 (the low byte of 593752 is 0x58; the rest 0) */
        {15, 0x01, KVEDGE_EPROTO},  /* size over 2^40 */
        {48, 12, KVEDGE_EPROTO},    /* rope lengths that do not add up */
        {50, 1, KVEDGE_EPROTO},     /* reserved */
        {52, 6, KVEDGE_EPROTO},     /* from[0] past the cloud's layers */
        {60, ' ', KVEDGE_EPROTO},   /* a space in the cloud rope */
        {len - 1, 0, KVEDGE_EPROTO} /* a NUL in the edge rope */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memcpy(back, buf, len);
        back[bad[i].at] = bad[i].v;
        if (bad[i].at == 8) {
            memset(back + 8, 0, 8);
        }
        assert_int_equal(kvedge_master_adapter_parse(back, len, &a2), bad[i].rc);
        assert_int_equal(kvedge_master_check_set(key, strlen(key), back, len), bad[i].rc);
    }
    assert_int_equal(kvedge_master_adapter_parse(buf, len - 1, &a2), KVEDGE_EPROTO);
    assert_int_equal(kvedge_master_adapter_parse(buf, 40, &a2), KVEDGE_EPROTO);
    /* pack refuses what parse would. */
    a2 = a;
    a2.size = 0;
    assert_int_equal(kvedge_master_adapter_pack(&a2, back, &blen), KVEDGE_EINVAL);
    a2 = a;
    a2.cloud_rope[0] = '\0';
    assert_int_equal(kvedge_master_adapter_pack(&a2, back, &blen), KVEDGE_EINVAL);
    a2 = a;
    a2.from[0] = 6;
    assert_int_equal(kvedge_master_adapter_pack(&a2, back, &blen), KVEDGE_EINVAL);
    a2 = a;
    a2.fit = 0;
    assert_int_equal(kvedge_master_adapter_pack(&a2, back, &blen), KVEDGE_EINVAL);
    /* A map record under an adapter key, and the other way round. */
    kvedge_master_map_t *m = malloc(sizeof *m);
    assert_non_null(m);
    memset(m, 0, sizeof *m);
    m->cloud_layers = 6;
    m->edge_layers = 4;
    assert_int_equal(kvedge_master_map_pack(m, back, &blen), 0);
    assert_int_equal(kvedge_master_check_set(key, strlen(key), back, blen), KVEDGE_EPROTO);
    assert_int_equal(kvedge_master_check_set("map/kjv-cloud/kjv-edge", 22, buf, len),
                     KVEDGE_EPROTO);
    free(m);
}

static void test_keys_and_kvmsg(void **state)
{
    (void)state;
    kvedge_master_key_t k;
    assert_int_equal(kvedge_master_key_parse("node/edge-1", 11, &k), 0);
    assert_int_equal(k.space, KVEDGE_MASTER_SPACE_NODE);
    assert_string_equal(k.a, "edge-1");
    assert_int_equal(kvedge_master_key_parse("map/llama-2-7b/opt-125m", 23, &k), 0);
    assert_string_equal(k.b, "opt-125m");
    assert_int_equal(kvedge_master_key_parse("node/a/b", 8, &k), KVEDGE_EINVAL);
    assert_int_equal(kvedge_master_key_parse("node/", 5, &k), KVEDGE_EINVAL);
    assert_int_equal(kvedge_master_key_parse("map/a", 5, &k), KVEDGE_EINVAL);
    assert_int_equal(kvedge_master_key_parse("dir/n1/abc", 10, &k), KVEDGE_EINVAL);
    assert_int_equal(kvedge_master_key_parse("nodes/x", 7, &k), KVEDGE_EINVAL);
    assert_int_equal(kvedge_master_key_parse("node/a b", 8, &k), KVEDGE_EINVAL);
    assert_int_equal(kvedge_master_key_parse("", 0, &k), KVEDGE_EINVAL);
    kvedge_chunk_id_t id;
    memset(id.bytes, 0xAB, sizeof id.bytes);
    char hex[65], key[256];
    kvedge_master_chunk_hex(&id, hex);
    assert_int_equal(kvedge_master_key_format(KVEDGE_MASTER_SPACE_DIR, "n1", hex, key, sizeof key),
                     0);
    assert_int_equal(kvedge_master_key_parse(key, strlen(key), &k), 0);
    assert_int_equal(k.space, KVEDGE_MASTER_SPACE_DIR);
    /* tmodel/<tenant tag hex>/<model id>: a tenant's model record, its id the key's. */
    const uint8_t tag[16] = {0x01, 0xfe};
    char thex[KVEDGE_MASTER_TENANT_HEX_BYTES + 1];
    kvedge_master_tenant_hex(tag, thex);
    assert_string_equal(thex, "01fe0000000000000000000000000000");
    assert_int_equal(
        kvedge_master_key_format(KVEDGE_MASTER_SPACE_TMODEL, thex, "acme.m", key, sizeof key), 0);
    assert_string_equal(key, "tmodel/01fe0000000000000000000000000000/acme.m");
    assert_int_equal(kvedge_master_key_parse(key, strlen(key), &k), 0);
    assert_int_equal(k.space, KVEDGE_MASTER_SPACE_TMODEL);
    assert_string_equal(k.a, thex);
    assert_string_equal(k.b, "acme.m");
    assert_int_equal(kvedge_master_key_parse("tmodel/01fe/m", 13, &k), KVEDGE_EINVAL);
    assert_int_equal(kvedge_master_key_parse("tmodel/m", 8, &k), KVEDGE_EINVAL);
    assert_int_equal(kvedge_master_key_parse("tmodel/01FE0000000000000000000000000000/m", 40, &k),
                     KVEDGE_EINVAL);
    kvedge_model_t tm = {
        .id = "acme.m", .layers = 2, .kv_heads = 2, .head_dim = 64, .dtype = KVEDGE_DTYPE_FP16};
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t blen;
    assert_int_equal(kvedge_master_model_pack(&tm, body, &blen), 0);
    assert_int_equal(kvedge_master_check_set(key, strlen(key), body, blen), 0);
    snprintf(tm.id, sizeof tm.id, "other");
    assert_int_equal(kvedge_master_model_pack(&tm, body, &blen), 0);
    assert_int_equal(kvedge_master_check_set(key, strlen(key), body, blen), KVEDGE_EPROTO);
    assert_int_equal(kvedge_master_key_format(KVEDGE_MASTER_SPACE_NODE, "a/b", NULL, key, 256),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_master_key_format(KVEDGE_MASTER_SPACE_NODE, "a", NULL, key, 4),
                     KVEDGE_ENOSPACE);

    /* kvmsg: every command round-trips; a change of any frame size is refused. */
    kvedge_kvmsg_t msgs[] = {
        {.cmd = KVEDGE_KVMSG_ICANHAZ, .key = (const uint8_t *)"node/", .key_len = 5, .rid = 9},
        {.cmd = KVEDGE_KVMSG_SET,
         .key = (const uint8_t *)"k",
         .key_len = 1,
         .body = (const uint8_t *)"v",
         .body_len = 1,
         .rid = 1},
        {.cmd = KVEDGE_KVMSG_KTHXBAI, .seq = 7, .count = 3, .registry = 42, .rid = 9},
        {.cmd = KVEDGE_KVMSG_ERR,
         .status = KVEDGE_EPROTO,
         .body = (const uint8_t *)"bad",
         .body_len = 3,
         .rid = 2},
        {.cmd = KVEDGE_KVMSG_HUGZ, .seq = 100, .registry = 5},
        {.cmd = KVEDGE_KVMSG_KVPUB, .key = (const uint8_t *)"k", .key_len = 1, .seq = 1},
        {.cmd = KVEDGE_KVMSG_STATUS, .rid = 4},
        {.cmd = KVEDGE_KVMSG_OK,
         .key = (const uint8_t *)"status",
         .key_len = 6,
         .seq = 12,
         .body = (const uint8_t *)"{}",
         .body_len = 2,
         .rid = 4},
    };
    for (size_t i = 0; i < sizeof msgs / sizeof msgs[0]; i++) {
        kvedge_kvmsg_buf_t buf;
        kvedge_wire_frame_t f[KVEDGE_KVMSG_MAX_FRAMES];
        size_t n;
        assert_int_equal(kvedge_kvmsg_pack(&msgs[i], &buf, f, &n), 0);
        kvedge_kvmsg_t back;
        assert_int_equal(kvedge_kvmsg_parse(f, n, &back), 0);
        assert_int_equal(back.cmd, msgs[i].cmd);
        assert_int_equal(back.seq, msgs[i].seq);
        assert_int_equal(back.rid, msgs[i].rid);
        assert_int_equal(back.count, msgs[i].count);
        assert_int_equal(back.registry, msgs[i].registry);
        assert_int_equal(back.status, msgs[i].status);
        assert_int_equal(kvedge_kvmsg_parse(f, n - 1, &back), KVEDGE_EPROTO);
        f[2].len = 7;
        assert_int_equal(kvedge_kvmsg_parse(f, n, &back), KVEDGE_EPROTO);
    }
    kvedge_kvmsg_t bad = {.cmd = KVEDGE_KVMSG_SET, .key = (const uint8_t *)"a b", .key_len = 3};
    kvedge_kvmsg_buf_t buf;
    kvedge_wire_frame_t f[KVEDGE_KVMSG_MAX_FRAMES];
    size_t n;
    assert_int_equal(kvedge_kvmsg_pack(&bad, &buf, f, &n), KVEDGE_EINVAL);
    bad.cmd = 0;
    assert_int_equal(kvedge_kvmsg_pack(&bad, &buf, f, &n), KVEDGE_EINVAL);
    assert_int_equal(kvedge_kvmsg_parse(NULL, 0, &bad), KVEDGE_EPROTO);
    /* Only the answer to STATUS carries a body in an OK; STATUS itself carries nothing. */
    kvedge_kvmsg_t okb = {.cmd = KVEDGE_KVMSG_OK,
                          .key = (const uint8_t *)"node/a",
                          .key_len = 6,
                          .body = (const uint8_t *)"{}",
                          .body_len = 2};
    assert_int_equal(kvedge_kvmsg_pack(&okb, &buf, f, &n), KVEDGE_EINVAL);
    kvedge_kvmsg_t st = {.cmd = KVEDGE_KVMSG_STATUS, .key = (const uint8_t *)"x", .key_len = 1};
    assert_int_equal(kvedge_kvmsg_pack(&st, &buf, f, &n), KVEDGE_EINVAL);
}

/* ---------------------------------------------------------------- master and views */

static void test_set_get(void **state)
{
    s_fx_t *fx = *state;
    s_master_start(fx);
    kvedge_mview_t *v = s_view(fx);
    assert_int_equal(kvedge_mview_state(v), KVEDGE_MVIEW_SYNCED);
    assert_int_equal(kvedge_mview_count(v), 0);
    s_set_node(v, "edge-1", 1u << 20);
    /* Read your writes: the view has it when set returns. */
    kvedge_master_node_t n;
    assert_int_equal(kvedge_mview_node(v, "edge-1", &n), 0);
    assert_int_equal(n.capacity_bytes, 1u << 20);
    assert_string_equal(n.endpoint, "tcp://10.0.0.1:7400");
    assert_int_equal(kvedge_mview_seq(v), 1);
    uint8_t small[4];
    size_t len;
    assert_int_equal(kvedge_mview_get(v, "node/edge-1", small, sizeof small, &len),
                     KVEDGE_ENOSPACE);
    assert_true(len > sizeof small);
    assert_int_equal(kvedge_mview_get(v, "node/none", small, sizeof small, &len), KVEDGE_ENOTFOUND);

    kvedge_model_t m;
    assert_int_equal(kvedge_model_builtin("opt-125m", &m), 0);
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    assert_int_equal(kvedge_master_model_pack(&m, body, &len), 0);
    assert_int_equal(kvedge_mview_set(v, "model/opt-125m", body, len, 2000), 0);
    kvedge_model_t m2;
    assert_int_equal(kvedge_mview_model(v, "opt-125m", &m2), 0);
    assert_int_equal(m2.kv_heads, 12);
    /* Delete. */
    assert_int_equal(kvedge_mview_set(v, "node/edge-1", NULL, 0, 2000), 0);
    assert_int_equal(kvedge_mview_node(v, "edge-1", &n), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_mview_seq(v), 3);
    assert_int_equal(kvedge_master_seq(fx->master), 3);
    /* Refusals come back as the master's error code. */
    assert_int_equal(kvedge_mview_set(v, "model/other", body, len, 2000), KVEDGE_EPROTO);
    assert_int_equal(kvedge_mview_set(v, "bogus/x", body, len, 2000), KVEDGE_EINVAL);
    assert_int_equal(kvedge_mview_set(v, "bad key", body, len, 2000), KVEDGE_EINVAL);
    assert_int_equal(kvedge_master_seq(fx->master), 3);
    /* A tenant's model record, tmodel/<tag hex>/<id>, read back by its tag only. */
    const uint8_t tag[16] = {0x42}, other[16] = {0x43};
    char hex[KVEDGE_MASTER_TENANT_HEX_BYTES + 1], key[200];
    kvedge_master_tenant_hex(tag, hex);
    snprintf(key, sizeof key, "tmodel/%s/opt-125m", hex);
    assert_int_equal(kvedge_mview_set(v, key, body, len, 2000), 0);
    assert_int_equal(kvedge_mview_tenant_model(v, tag, "opt-125m", &m2), 0);
    assert_int_equal(m2.kv_heads, 12);
    assert_int_equal(kvedge_mview_tenant_model(v, other, "opt-125m", &m2), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_mview_tenant_model(v, NULL, "opt-125m", &m2), KVEDGE_EINVAL);
    snprintf(key, sizeof key, "tmodel/%s/other", hex);
    assert_int_equal(kvedge_mview_set(v, key, body, len, 2000), KVEDGE_EPROTO);
    assert_int_equal(kvedge_master_seq(fx->master), 4);
    kvedge_mview_destroy(&v);
    kvedge_mview_destroy(&v); /* idempotent */
}

typedef struct {
    uint64_t seqs[256];
    char keys[256][32];
    int n;
    int resyncs;
} s_log_t;

static void s_log_change(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    (void)body;
    (void)len;
    s_log_t *l = ctx;
    if (!key) {
        l->resyncs++;
        return;
    }
    if (l->n < 256) {
        l->seqs[l->n] = seq;
        snprintf(l->keys[l->n], sizeof l->keys[0], "%s", key);
        l->n++;
    }
}

static void test_two_views_in_order(void **state)
{
    s_fx_t *fx = *state;
    s_master_start(fx);
    s_log_t *la = calloc(1, sizeof *la), *lb = calloc(1, sizeof *lb);
    kvedge_mview_opts_t o;
    kvedge_mview_opts_default(&o);
    o.on_change = s_log_change;
    o.ctx = la;
    kvedge_mview_t *a = s_view_opts(fx, &o);
    o.ctx = lb;
    kvedge_mview_t *b = s_view_opts(fx, &o);
    assert_int_equal(kvedge_mview_wait(a, 0, 3000), 0);
    assert_int_equal(kvedge_mview_wait(b, 0, 3000), 0);
    for (int i = 0; i < 40; i++) {
        char id[32];
        snprintf(id, sizeof id, "n%d", i % 7);
        s_set_node(i % 2 ? a : b, id, (uint64_t)i);
    }
    assert_int_equal(kvedge_mview_wait(a, 40, 3000), 0);
    assert_int_equal(kvedge_mview_wait(b, 40, 3000), 0);
    /* Both saw the same 40 updates, in seq order. */
    assert_int_equal(la->n, 40);
    assert_int_equal(lb->n, 40);
    for (int i = 0; i < 40; i++) {
        assert_int_equal(la->seqs[i], (uint64_t)i + 1);
        assert_int_equal(lb->seqs[i], (uint64_t)i + 1);
        assert_string_equal(la->keys[i], lb->keys[i]);
    }
    kvedge_master_node_t n;
    assert_int_equal(kvedge_mview_node(b, "n4", &n), 0);
    assert_int_equal(n.capacity_bytes, 39); /* i = 39 was the last write of n4 */
    char *ta = s_text(a), *tb = s_text(b);
    assert_string_equal(ta, tb);
    free(ta);
    free(tb);
    kvedge_mview_destroy(&a);
    kvedge_mview_destroy(&b);
    free(la);
    free(lb);
}

static void test_late_joiner(void **state)
{
    s_fx_t *fx = *state;
    s_master_start(fx);
    kvedge_mview_t *a = s_view(fx);
    for (int i = 0; i < 25; i++) {
        char id[32];
        snprintf(id, sizeof id, "n%02d", i);
        s_set_node(a, id, (uint64_t)i);
    }
    assert_int_equal(kvedge_mview_set(a, "node/n03", NULL, 0, 2000), 0);
    kvedge_mview_t *late = s_view(fx);
    assert_int_equal(kvedge_mview_count(late), 24);
    assert_int_equal(kvedge_mview_seq(late), 26);
    s_set_node(a, "after", 7);
    assert_int_equal(kvedge_mview_wait(late, 27, 3000), 0);
    kvedge_master_node_t n;
    assert_int_equal(kvedge_mview_node(late, "after", &n), 0);
    /* A prefix view holds only its keys but follows every seq. */
    kvedge_mview_opts_t o;
    kvedge_mview_opts_default(&o);
    o.prefix = "node/n1";
    kvedge_mview_t *p = s_view_opts(fx, &o);
    assert_int_equal(kvedge_mview_wait(p, 27, 3000), 0);
    assert_int_equal(kvedge_mview_count(p), 10);
    s_set_node(a, "n15", 1);
    s_set_node(a, "zz", 1);
    assert_int_equal(kvedge_mview_wait(p, 29, 3000), 0);
    assert_int_equal(kvedge_mview_count(p), 10);
    s_assert_same_as_master(fx, late);
    kvedge_mview_destroy(&p);
    kvedge_mview_destroy(&late);
    kvedge_mview_destroy(&a);
}

static void test_gap_detected_and_resynced(void **state)
{
    s_fx_t *fx = *state;
    kvedge_master_opts_t mo;
    kvedge_master_opts_default(&mo);
    mo.drop_pub_every = 5; /* updates 5, 10, 15 ... never reach the subscribers */
    mo.hugz_ms = 200;
    s_master_start_opts(fx, &mo);
    kvedge_mview_t *w = s_view(fx), *v = s_view(fx);
    for (int i = 0; i < 12; i++) {
        char id[32];
        snprintf(id, sizeof id, "n%d", i);
        s_set_node(w, id, (uint64_t)i);
    }
    /* 5 and 10 were lost on the way: 6 and 11 show the gap, the view re-syncs. */
    s_assert_same_as_master(fx, v);
    kvedge_mview_stats_t st;
    kvedge_mview_stats(v, &st);
    assert_true(st.gaps >= 2);
    assert_true(st.syncs >= 3);
    /* The last update lost (15) with nothing after it: HUGZ shows the gap. */
    for (int i = 12; i < 15; i++) {
        char id[32];
        snprintf(id, sizeof id, "n%d", i);
        s_set_node(w, id, (uint64_t)i);
    }
    assert_int_equal(kvedge_master_seq(fx->master), 15);
    assert_int_equal(kvedge_mview_wait(v, 15, 3000), 0);
    s_assert_same_as_master(fx, v);
    kvedge_mview_destroy(&v);
    kvedge_mview_destroy(&w);
}

static void test_master_restart_loses_nothing(void **state)
{
    s_fx_t *fx = *state;
    s_master_start(fx);
    kvedge_mview_opts_t o;
    kvedge_mview_opts_default(&o);
    o.dead_ms = 600;
    kvedge_mview_t *old = s_view_opts(fx, &o);
    assert_int_equal(kvedge_mview_wait(old, 0, 3000), 0);
    for (int i = 0; i < 10; i++) {
        char id[32];
        snprintf(id, sizeof id, "n%d", i);
        s_set_node(old, id, (uint64_t)i);
    }
    char *before = s_text(old);
    uint64_t registry = kvedge_master_registry(fx->master);
    kvedge_master_destroy(&fx->master);
    /* The view notices the silence and says so, serving what it has. */
    kt_wait_for(kvedge_mview_state(old) != KVEDGE_MVIEW_SYNCED, KT_WAIT_MS);
    assert_int_equal(kvedge_mview_state(old), KVEDGE_MVIEW_STALE);
    assert_int_equal(kvedge_mview_count(old), 10);

    s_master_start(fx);
    assert_int_equal(kvedge_master_seq(fx->master), 10);
    assert_int_equal(kvedge_master_registry(fx->master), registry);
    kvedge_mview_t *fresh = s_view(fx);
    char *after = s_text(fresh);
    assert_string_equal(before, after); /* same records, same seqs */
    /* The old view reconnects and re-syncs by itself, and follows new updates. */
    s_set_node(fresh, "new", 1);
    assert_int_equal(kvedge_mview_wait(old, 11, 5000), 0);
    s_assert_same_as_master(fx, old);

    /* A quick restart the view may not even notice: it still ends up in step. */
    kvedge_master_destroy(&fx->master);
    s_master_start(fx);
    kvedge_mview_destroy(&fresh);
    fresh = s_view(fx);
    s_set_node(fresh, "newer", 2);
    assert_int_equal(kvedge_mview_wait(old, 12, 5000), 0);
    s_assert_same_as_master(fx, old);
    free(before);
    free(after);
    kvedge_mview_destroy(&fresh);
    kvedge_mview_destroy(&old);
}

static void test_unreachable_at_start_uses_snapshot(void **state)
{
    s_fx_t *fx = *state;
    char path[300];
    snprintf(path, sizeof path, "%s/view.snap", fx->dir);
    kvedge_mview_opts_t o;
    kvedge_mview_opts_default(&o);
    o.snapshot_path = path;

    /* Nothing at all: EMPTY, quickly. */
    o.start_wait_ms = 200;
    kvedge_mview_t *v = s_view_opts(fx, &o);
    assert_int_equal(kvedge_mview_state(v), KVEDGE_MVIEW_EMPTY);
    kvedge_mview_destroy(&v);

    s_master_start(fx);
    o.start_wait_ms = 0;
    v = s_view_opts(fx, &o);
    assert_int_equal(kvedge_mview_state(v), KVEDGE_MVIEW_SYNCED);
    for (int i = 0; i < 6; i++) {
        char id[32];
        snprintf(id, sizeof id, "n%d", i);
        s_set_node(v, id, (uint64_t)i);
    }
    char *before = s_text(v);
    kvedge_mview_destroy(&v); /* writes the file */
    kvedge_master_destroy(&fx->master);

    /* Master unreachable at start: the last snapshot, and the view says STALE. */
    o.start_wait_ms = 300;
    int64_t t0 = s_now();
    v = s_view_opts(fx, &o);
    assert_true(s_now() - t0 < 300 + KT_SLACK_MS);
    assert_int_equal(kvedge_mview_state(v), KVEDGE_MVIEW_STALE);
    assert_int_equal(kvedge_mview_seq(v), 6);
    char *loaded = s_text(v);
    assert_string_equal(before, loaded);
    kvedge_mview_stats_t st;
    kvedge_mview_stats(v, &st);
    assert_int_equal(st.file_loads, 1);
    /* Then the master comes up: SYNCED, by itself. */
    s_master_start(fx);
    assert_int_equal(kvedge_mview_wait(v, 6, 5000), 0);
    s_set_node(v, "later", 1);
    kvedge_mview_destroy(&v);

    /* A damaged file is ignored. */
    kvedge_master_destroy(&fx->master);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, 40, SEEK_SET);
    fputc(0x5A, f);
    fclose(f);
    v = s_view_opts(fx, &o);
    assert_int_equal(kvedge_mview_state(v), KVEDGE_MVIEW_EMPTY);
    assert_int_equal(kvedge_mview_count(v), 0);
    kvedge_mview_destroy(&v);
    free(before);
    free(loaded);
}

static void test_set_with_master_down_times_out(void **state)
{
    s_fx_t *fx = *state;
    kvedge_mview_opts_t o;
    kvedge_mview_opts_default(&o);
    o.start_wait_ms = -1;
    kvedge_mview_t *v = s_view_opts(fx, &o);
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len = s_node_body("tcp://10.0.0.1:7400", 1, body);
    int64_t t0 = s_now();
    assert_int_equal(kvedge_mview_set(v, "node/x", body, len, 400), KVEDGE_ETIMEDOUT);
    int64_t took = s_now() - t0;
    assert_true(took >= 400 - 50 && took < 400 + KT_SLACK_MS);
    /* The caller keeps working: getters answer at once. */
    assert_int_equal(kvedge_mview_get(v, "node/x", body, sizeof body, &len), KVEDGE_ENOTFOUND);
    /* A master that comes up in time takes the set. */
    s_master_start(fx);
    assert_int_equal(kvedge_mview_set(v, "node/x", body, s_node_body("tcp://h:1", 1, body), 3000),
                     KVEDGE_OK);
    kvedge_mview_destroy(&v);
}

static kvedge_master_health_state_t s_health_of(kvedge_mview_t *v, const char *id)
{
    kvedge_master_health_t h;
    return kvedge_mview_health(v, id, &h) == KVEDGE_OK ? h.state : (kvedge_master_health_state_t)0;
}

typedef struct {
    kvedge_mview_t *v;
    const char *id;
    kvedge_master_health_state_t want;
} s_health_ctx_t;

static bool s_has_health(void *arg)
{
    s_health_ctx_t *x = arg;
    return s_health_of(x->v, x->id) == x->want;
}

static bool s_wait_health(kvedge_mview_t *v, const char *id, kvedge_master_health_state_t want,
                          int ms)
{
    s_health_ctx_t x = {v, id, want};
    return kt_poll(s_has_health, &x, ms);
}

static void test_heartbeats_move_health(void **state)
{
    s_fx_t *fx = *state;
    kvedge_master_opts_t mo;
    kvedge_master_opts_default(&mo);
    mo.suspect_ms = 300;
    mo.down_ms = 700;
    s_master_start_opts(fx, &mo);
    kvedge_mview_t *v = s_view(fx);
    assert_int_equal(kvedge_mview_heartbeat(v, "edge-1"), 0);
    assert_int_equal(kvedge_mview_heartbeat(v, "bad id"), KVEDGE_EINVAL);
    assert_true(s_wait_health(v, "edge-1", KVEDGE_MASTER_HEALTH_UP, 2000));
    uint64_t seq = kvedge_mview_seq(v);
    /* Heartbeats while up publish nothing. */
    for (int i = 0; i < 5; i++) {
        assert_int_equal(kvedge_mview_heartbeat(v, "edge-1"), 0);
        kt_pause_ms(40); /* paces the heartbeats, as a node sends them: not a wait */
    }
    assert_int_equal(kvedge_master_seq(fx->master), seq);
    /* Silence: suspect, then down. */
    int64_t t0 = s_now();
    assert_true(s_wait_health(v, "edge-1", KVEDGE_MASTER_HEALTH_SUSPECT, 2000));
    assert_true(s_now() - t0 >= 150);
    assert_true(s_wait_health(v, "edge-1", KVEDGE_MASTER_HEALTH_DOWN, 2000));
    assert_int_equal(kvedge_mview_seq(v), seq + 2);
    kvedge_master_health_t h;
    assert_int_equal(kvedge_mview_health(v, "edge-1", &h), 0);
    assert_true(h.changed_ms >= h.last_seen_ms);
    /* Back: up again. */
    assert_int_equal(kvedge_mview_heartbeat(v, "edge-1"), 0);
    assert_true(s_wait_health(v, "edge-1", KVEDGE_MASTER_HEALTH_UP, 2000));
    /* Health records are the master's: a client may only delete one. */
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    assert_int_equal(kvedge_master_health_pack(&h, body, &len), 0);
    assert_int_equal(kvedge_mview_set(v, "health/edge-1", body, len, 2000), KVEDGE_EDENIED);
    assert_int_equal(kvedge_mview_set(v, "health/edge-1", NULL, 0, 2000), KVEDGE_OK);
    assert_int_equal(s_health_of(v, "edge-1"), 0);
    /* Automatic heartbeats from the view's options. */
    kvedge_mview_opts_t o;
    kvedge_mview_opts_default(&o);
    o.heartbeat_id = "proxy-7";
    o.heartbeat_ms = 50;
    kvedge_mview_t *p = s_view_opts(fx, &o);
    assert_true(s_wait_health(v, "proxy-7", KVEDGE_MASTER_HEALTH_UP, 2000));
    kt_pause_ms(500); /* the time is the point: longer than suspect_ms, still up while it beats */
    assert_int_equal(s_health_of(v, "proxy-7"), KVEDGE_MASTER_HEALTH_UP);
    kvedge_mview_destroy(&p);
    assert_true(s_wait_health(v, "proxy-7", KVEDGE_MASTER_HEALTH_DOWN, 3000));
    kvedge_mview_destroy(&v);
}

/* A raw DEALER for hostile messages. */
static zsock_t *s_raw(s_fx_t *fx)
{
    zsock_t *d = zsock_new(ZMQ_DEALER);
    zsock_set_rcvtimeo(d, 2000);
    zsock_set_linger(d, 0);
    assert_int_equal(zsock_connect(d, "%s", fx->router), 0);
    return d;
}

static void s_raw_send(zsock_t *d, const kvedge_wire_frame_t *f, size_t n)
{
    zmsg_t *m = zmsg_new();
    for (size_t i = 0; i < n; i++)
        zmsg_addmem(m, f[i].data, f[i].len);
    assert_int_equal(zmsg_send(&m, d), 0);
}

/* Receives one reply and checks it is ERR with this status (and rid, when not 0). */
static void s_expect_err(zsock_t *d, int status, uint64_t rid)
{
    zmsg_t *m = zmsg_recv(d);
    assert_non_null(m);
    kvedge_wire_frame_t f[KVEDGE_KVMSG_MAX_FRAMES];
    size_t n = 0;
    for (zframe_t *fr = zmsg_first(m); fr && n < KVEDGE_KVMSG_MAX_FRAMES; fr = zmsg_next(m))
        f[n++] = (kvedge_wire_frame_t){zframe_data(fr), zframe_size(fr)};
    kvedge_kvmsg_t k;
    assert_int_equal(kvedge_kvmsg_parse(f, n, &k), 0);
    assert_int_equal(k.cmd, KVEDGE_KVMSG_ERR);
    assert_int_equal(k.status, status);
    assert_int_equal(k.rid, rid);
    zmsg_destroy(&m);
}

#define S_F(s) ((kvedge_wire_frame_t){(const uint8_t *)(s), sizeof(s) - 1})

static void test_bad_kvmsgs_get_err(void **state)
{
    s_fx_t *fx = *state;
    s_master_start(fx);
    kvedge_mview_t *v = s_view(fx);
    s_set_node(v, "keep", 5);
    char *before = s_text(v);
    zsock_t *d = s_raw(fx);
    uint8_t zero[8] = {0}, one[8] = {1}, rid[8] = {7, 0, 0, 0, 0, 0, 0, 0};
    kvedge_wire_frame_t seq0 = {zero, 8}, seq1 = {one, 8}, r7 = {rid, 8};
    uint8_t node[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t nl = s_node_body("tcp://h:1", 1, node);
    kvedge_wire_frame_t body = {node, nl};

    kvedge_wire_frame_t m1[] = {S_F("SET")};
    s_raw_send(d, m1, 1);
    s_expect_err(d, KVEDGE_EPROTO, 0);
    kvedge_wire_frame_t m2[] = {S_F("FOO"), S_F("node/a"), seq0, body, r7};
    s_raw_send(d, m2, 5);
    s_expect_err(d, KVEDGE_EPROTO, 7);
    kvedge_wire_frame_t m3[] = {S_F("SET"), S_F("node/a"), seq1, body, r7}; /* seq not 0 */
    s_raw_send(d, m3, 5);
    s_expect_err(d, KVEDGE_EPROTO, 7);
    kvedge_wire_frame_t m4[] = {S_F("SET"), S_F("node/a"), {zero, 7}, body, r7};
    s_raw_send(d, m4, 5);
    s_expect_err(d, KVEDGE_EPROTO, 7);
    kvedge_wire_frame_t m5[] = {S_F("SET"), S_F("node/a\x00x"), seq0, body, r7};
    s_raw_send(d, m5, 5);
    s_expect_err(d, KVEDGE_EPROTO, 7);
    kvedge_wire_frame_t m6[] = {S_F("SET"), S_F("node/a"), seq0, body, r7, r7};
    s_raw_send(d, m6, 6);
    s_expect_err(d, KVEDGE_EPROTO, 0);
    uint8_t *big = calloc(1, KVEDGE_KVMSG_MAX_BODY_BYTES + 1);
    kvedge_wire_frame_t m7[] = {
        S_F("SET"), S_F("node/a"), seq0, {big, KVEDGE_KVMSG_MAX_BODY_BYTES + 1}, r7};
    s_raw_send(d, m7, 5);
    s_expect_err(d, KVEDGE_EPROTO, 7);
    free(big);
    kvedge_wire_frame_t m8[] = {S_F("SET"), S_F("foo/bar"), seq0, body, r7};
    s_raw_send(d, m8, 5);
    s_expect_err(d, KVEDGE_EINVAL, 7);
    kvedge_wire_frame_t m9[] = {S_F("SET"), S_F("node/a"), seq0, S_F("garbage!"), r7};
    s_raw_send(d, m9, 5);
    s_expect_err(d, KVEDGE_EPROTO, 7);
    kvedge_wire_frame_t m10[] = {S_F("SET"), S_F("link/a/b"), seq0, body, r7}; /* wrong type */
    s_raw_send(d, m10, 5);
    s_expect_err(d, KVEDGE_EPROTO, 7);
    kvedge_wire_frame_t m11[] = {S_F("KVPUB"), S_F("node/a"), seq1, body};
    s_raw_send(d, m11, 4);
    s_expect_err(d, KVEDGE_EPROTO, 0);
    kvedge_wire_frame_t m12[] = {S_F("OK"), S_F("node/a"), seq1, S_F(""), r7};
    s_raw_send(d, m12, 5);
    s_expect_err(d, KVEDGE_EPROTO, 7);
    kvedge_wire_frame_t m13[] = {S_F("ICANHAZ"), S_F(""), seq1, S_F(""), r7};
    s_raw_send(d, m13, 5);
    s_expect_err(d, KVEDGE_EPROTO, 7);
    kvedge_wire_frame_t m14[] = {S_F("HEARTBEAT"), S_F("a/b"), seq0, S_F(""), r7};
    s_raw_send(d, m14, 5);
    s_expect_err(d, KVEDGE_EPROTO, 7);
    /* A hundred frames: read and dropped, answered. */
    kvedge_wire_frame_t many[100];
    for (int i = 0; i < 100; i++)
        many[i] = S_F("SET");
    s_raw_send(d, many, 100);
    s_expect_err(d, KVEDGE_EPROTO, 0);
    /* A frame past the transport limit: the master drops the connection. */
    size_t huge_len = KVEDGE_KVMSG_MAX_FRAME_BYTES + 1;
    uint8_t *huge = calloc(1, huge_len);
    kvedge_wire_frame_t m15[] = {S_F("SET"), S_F("node/a"), seq0, {huge, huge_len}, r7};
    s_raw_send(d, m15, 5);
    free(huge);
    zsock_set_rcvtimeo(d, 500);
    zmsg_t *none = zmsg_recv(d);
    assert_null(none);
    zsock_destroy(&d);

    /* Nothing applied; the master keeps serving. */
    assert_int_equal(kvedge_master_seq(fx->master), 1);
    char *after = s_text(v);
    assert_string_equal(before, after);
    s_set_node(v, "still", 6);
    assert_int_equal(kvedge_master_seq(fx->master), 2);
    free(before);
    free(after);
    kvedge_mview_destroy(&v);
}

static void test_plaintext_only_on_loopback(void **state)
{
    s_fx_t *fx = *state;
    kvedge_master_opts_t o;
    kvedge_master_opts_default(&o);
    o.bind = "tcp://0.0.0.0:*";
    o.pub = "tcp://127.0.0.1:*";
    o.data_dir = fx->data;
    o.insecure = true;
    kvedge_master_t *m = NULL;
    char why[256];
    assert_int_equal(kvedge_master_start(&o, &m, why, sizeof why), KVEDGE_EDENIED);
    assert_null(m);
    assert_non_null(strstr(why, "plaintext"));
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = "tcp://10.1.2.3:7410";
    vo.pub = "tcp://10.1.2.3:7411";
    kvedge_mview_t *v = NULL;
    assert_int_equal(kvedge_mview_start(&vo, &v), KVEDGE_EDENIED);
    vo.master = NULL;
    assert_int_equal(kvedge_mview_start(&vo, &v), KVEDGE_EINVAL);
    /* The same directory cannot be served twice. */
    s_master_start(fx);
    o.bind = fx->router;
    o.pub = fx->pub;
    assert_int_equal(kvedge_master_start(&o, &m, why, sizeof why), KVEDGE_ELOCKED);
}

static void s_cert(s_fx_t *fx, const char *name, bool listed)
{
    zcert_t *c = zcert_new();
    char path[400];
    snprintf(path, sizeof path, "%s/%s", fx->certs, name);
    assert_int_equal(zcert_save(c, path), 0);
    if (listed) {
        snprintf(path, sizeof path, "%s/clients/%s", fx->certs, name);
        assert_int_equal(zcert_save_public(c, path), 0);
    }
    zcert_destroy(&c);
}

static void test_curve_unlisted_refused(void **state)
{
    s_fx_t *fx = *state;
    fx->curve = true;
    zsys_dir_create("%s/clients", fx->certs);
    s_cert(fx, "master", false);
    s_cert(fx, "alice", true);
    s_cert(fx, "eve", false);
    s_master_start(fx);
    assert_non_null(kvedge_master_public_key(fx->master));
    char key[400], alice[400], eve[400];
    snprintf(key, sizeof key, "%s/master", fx->certs);
    snprintf(alice, sizeof alice, "%s/alice_secret", fx->certs);
    snprintf(eve, sizeof eve, "%s/eve_secret", fx->certs);

    kvedge_mview_opts_t o;
    kvedge_mview_opts_default(&o);
    o.server_key = key;
    o.client_cert = alice;
    kvedge_mview_t *a = s_view_opts(fx, &o);
    assert_int_equal(kvedge_mview_wait(a, 0, 3000), 0);
    s_set_node(a, "edge-1", 1);

    /* An unlisted key completes no handshake: no snapshot, sets time out, nothing changes. */
    o.client_cert = eve;
    o.start_wait_ms = 600;
    kvedge_mview_t *e = s_view_opts(fx, &o);
    assert_int_equal(kvedge_mview_state(e), KVEDGE_MVIEW_EMPTY);
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len = s_node_body("tcp://evil:1", 1, body);
    assert_int_equal(kvedge_mview_set(e, "node/edge-1", body, len, 500), KVEDGE_ETIMEDOUT);
    assert_int_equal(kvedge_mview_count(e), 0);
    /* Plaintext gets nothing either. */
    kvedge_mview_opts_t p;
    kvedge_mview_opts_default(&p);
    p.start_wait_ms = 400;
    kvedge_mview_t *plain = s_view_opts(fx, &p);
    assert_int_equal(kvedge_mview_state(plain), KVEDGE_MVIEW_EMPTY);
    /* A public certificate (no secret next to it) cannot be a client's. */
    char pub_only[400];
    snprintf(pub_only, sizeof pub_only, "%s/clients/alice", fx->certs);
    o.client_cert = pub_only;
    kvedge_mview_t *bad = NULL;
    assert_int_equal(kvedge_mview_start(&o, &bad), KVEDGE_EIO);
    assert_int_equal(kvedge_master_seq(fx->master), 1);
    kvedge_master_node_t n;
    assert_int_equal(kvedge_mview_node(a, "edge-1", &n), 0);
    assert_string_equal(n.endpoint, "tcp://10.0.0.1:7400");
    kvedge_mview_destroy(&plain);
    kvedge_mview_destroy(&e);
    kvedge_mview_destroy(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_records_roundtrip),
        cmocka_unit_test(test_keys_and_kvmsg),
        cmocka_unit_test(test_adapter_record),
        cmocka_unit_test_setup_teardown(test_set_get, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_two_views_in_order, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_late_joiner, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_gap_detected_and_resynced, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_master_restart_loses_nothing, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_unreachable_at_start_uses_snapshot, s_setup,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_set_with_master_down_times_out, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_heartbeats_move_health, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_bad_kvmsgs_get_err, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_plaintext_only_on_loopback, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_curve_unlisted_refused, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
