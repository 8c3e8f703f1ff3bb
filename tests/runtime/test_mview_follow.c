/* The replica view given a list of masters: a fake standby (a ROUTER that answers every request
 * with ENOTLEADER, "leader R P" or "no leader", and a PUB that says nothing) beside real
 * embedded masters on ipc:// endpoints. The view syncs with the real master after the standby,
 * follows a named leader outside its list, moves to the next master when the one it follows is
 * gone (serving its state meanwhile, never EMPTY), lands SETs on the leader, heartbeats reach
 * the leader, a readonly master (no etcd quorum) is followed for reads and refuses writes with
 * its reason; lists are checked at start; one endpoint behaves as it always has. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <czmq.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/error.h"
#include "runtime/mview.h"
#include "store/master/master.h"
#include "tests/common/testutil.h"

/* ---------------------------------------------------------------- a fake standby */

#define S_RO_SEQ      7
#define S_RO_REGISTRY 0x5eedULL

typedef struct {
    char router[200], pub[200];
    char reason[600]; /* what it answers every request with */
    bool readonly;    /* a master without its etcd quorum: serves an empty snapshot at seq
                       * S_RO_SEQ and HUGZ, refuses the rest with the reason */
    zactor_t *actor;
    atomic_int icanhaz, sets, heartbeats;
} s_standby_t;

static void s_standby_actor(zsock_t *pipe, void *args)
{
    s_standby_t *sb = args;
    zsock_t *router = zsock_new_router(sb->router);
    zsock_t *pub = zsock_new_pub(sb->pub); /* silent, as a standby's */
    zsock_signal(pipe, router && pub ? 0 : 1);
    zpoller_t *poller = router && pub ? zpoller_new(pipe, router, NULL) : NULL;
    while (poller) {
        void *which = zpoller_wait(poller, 100);
        if (sb->readonly) { /* HUGZ, as a readonly master publishes them */
            kvedge_kvmsg_t h = {
                .cmd = KVEDGE_KVMSG_HUGZ, .seq = S_RO_SEQ, .registry = S_RO_REGISTRY};
            kvedge_kvmsg_buf_t hb;
            kvedge_wire_frame_t hf[KVEDGE_KVMSG_MAX_FRAMES];
            size_t hn;
            if (kvedge_kvmsg_pack(&h, &hb, hf, &hn) == KVEDGE_OK) {
                zmsg_t *r = zmsg_new();
                for (size_t i = 0; i < hn; i++)
                    zmsg_addmem(r, hf[i].data, hf[i].len);
                zmsg_send(&r, pub);
            }
        }
        if (!which && zpoller_expired(poller))
            continue;
        if (which != router)
            break; /* $TERM, or interrupted */
        zmsg_t *m = zmsg_recv(router);
        zframe_t *id = m ? zmsg_pop(m) : NULL;
        kvedge_wire_frame_t f[KVEDGE_KVMSG_MAX_FRAMES];
        size_t n = 0;
        for (zframe_t *p = m ? zmsg_first(m) : NULL; p && n < KVEDGE_KVMSG_MAX_FRAMES;
             p = zmsg_next(m))
            f[n++] = (kvedge_wire_frame_t){zframe_data(p), zframe_size(p)};
        kvedge_kvmsg_t k;
        if (id && kvedge_kvmsg_parse(f, n, &k) == KVEDGE_OK) {
            if (k.cmd == KVEDGE_KVMSG_ICANHAZ)
                atomic_fetch_add(&sb->icanhaz, 1);
            else if (k.cmd == KVEDGE_KVMSG_SET)
                atomic_fetch_add(&sb->sets, 1);
            else if (k.cmd == KVEDGE_KVMSG_HEARTBEAT)
                atomic_fetch_add(&sb->heartbeats, 1);
            kvedge_kvmsg_t err = {.cmd = KVEDGE_KVMSG_ERR,
                                  .status = KVEDGE_ENOTLEADER,
                                  .body = (const uint8_t *)sb->reason,
                                  .body_len = strlen(sb->reason),
                                  .rid = k.rid};
            if (sb->readonly && k.cmd == KVEDGE_KVMSG_ICANHAZ)
                err = (kvedge_kvmsg_t){.cmd = KVEDGE_KVMSG_KTHXBAI,
                                       .key = k.key,
                                       .key_len = k.key_len,
                                       .seq = S_RO_SEQ,
                                       .count = 0,
                                       .registry = S_RO_REGISTRY,
                                       .rid = k.rid};
            kvedge_kvmsg_buf_t buf;
            kvedge_wire_frame_t out[KVEDGE_KVMSG_MAX_FRAMES];
            size_t on;
            if (kvedge_kvmsg_pack(&err, &buf, out, &on) == KVEDGE_OK) {
                zmsg_t *r = zmsg_new();
                zmsg_append(r, &id);
                for (size_t i = 0; i < on; i++)
                    zmsg_addmem(r, out[i].data, out[i].len);
                zmsg_send(&r, router);
            }
        }
        zframe_destroy(&id);
        zmsg_destroy(&m);
    }
    zpoller_destroy(&poller);
    zsock_destroy(&pub);
    zsock_destroy(&router);
}

/* ---------------------------------------------------------------- fixture */

typedef struct {
    char dir[128];
    char router[2][200], pub[2][200], data[2][200];
    kvedge_master_t *master[2];
    s_standby_t sb[2];
    char list[2][2048]; /* scratch for endpoint lists */
} s_fx_t;

static void s_master_up(s_fx_t *fx, int i)
{
    kvedge_master_opts_t o;
    kvedge_master_opts_default(&o);
    o.bind = fx->router[i];
    o.pub = fx->pub[i];
    o.data_dir = fx->data[i];
    o.insecure = true;
    o.hugz_ms = 200;
    o.metrics = "off";
    char why[512] = "";
    int rc = kvedge_master_start(&o, &fx->master[i], why, sizeof why);
    if (rc != KVEDGE_OK)
        fail_msg("master %d start: %s (%s)", i, why, kvedge_strerror(rc));
}

static void s_standby_up(s_fx_t *fx, int i, const char *reason)
{
    s_standby_t *sb = &fx->sb[i];
    snprintf(sb->reason, sizeof sb->reason, "%s", reason);
    sb->actor = zactor_new(s_standby_actor, sb);
    assert_non_null(sb->actor);
}

/* Master 0 leads, and standby 0 names it ("leader ROUTER PUB", into hint). */
static void s_leader_and_standby(s_fx_t *fx, char *hint, size_t len)
{
    s_master_up(fx, 0);
    snprintf(hint, len, "leader %s %s", fx->router[0], fx->pub[0]);
    s_standby_up(fx, 0, hint);
}

static int s_setup(void **state)
{
    s_fx_t *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    snprintf(fx->dir, sizeof fx->dir, "/tmp/kvedge-follow-XXXXXX");
    if (!mkdtemp(fx->dir))
        return -1;
    for (int i = 0; i < 2; i++) {
        snprintf(fx->router[i], sizeof fx->router[i], "ipc://%s/m%d.ipc", fx->dir, i);
        snprintf(fx->pub[i], sizeof fx->pub[i], "ipc://%s/m%dp.ipc", fx->dir, i);
        snprintf(fx->data[i], sizeof fx->data[i], "%s/data%d", fx->dir, i);
        snprintf(fx->sb[i].router, sizeof fx->sb[i].router, "ipc://%s/s%d.ipc", fx->dir, i);
        snprintf(fx->sb[i].pub, sizeof fx->sb[i].pub, "ipc://%s/s%dp.ipc", fx->dir, i);
    }
    *state = fx;
    return 0;
}

static int s_teardown(void **state)
{
    s_fx_t *fx = *state;
    for (int i = 0; i < 2; i++) {
        kvedge_master_destroy(&fx->master[i]);
        zactor_destroy(&fx->sb[i].actor);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fx->dir);
    assert_int_equal(system(cmd), 0);
    free(fx);
    return 0;
}

/* "a,b" into out. */
static void s_pair(char *out, size_t cap, const char *a, const char *b)
{
    int n = snprintf(out, cap, "%s,%s", a, b);
    assert_true(n > 0 && (size_t)n < cap);
}

/* A view of "A,B" (ROUTERs) and "PA,PB" (PUBs). */
static kvedge_mview_t *s_view(const char *routers, const char *pubs, const char *hb_id)
{
    kvedge_mview_opts_t o;
    kvedge_mview_opts_default(&o);
    o.master = routers;
    o.pub = pubs;
    o.heartbeat_id = hb_id;
    o.heartbeat_ms = 100;
    o.dead_ms = 800;
    o.start_wait_ms = -1;
    kvedge_mview_t *v = NULL;
    assert_int_equal(kvedge_mview_start(&o, &v), KVEDGE_OK);
    return v;
}

static size_t s_node_body(uint64_t capacity, uint8_t *out)
{
    kvedge_master_node_t n;
    memset(&n, 0, sizeof n);
    n.role = KVEDGE_ROLE_CLOUD;
    snprintf(n.region, sizeof n.region, "eu-1");
    snprintf(n.endpoint, sizeof n.endpoint, "tcp://127.0.0.1:7400");
    n.capacity_bytes = capacity;
    n.bandwidth_bytes_per_s = 125000000;
    n.rtt_us = 1500;
    size_t len;
    assert_int_equal(kvedge_master_node_pack(&n, out, &len), KVEDGE_OK);
    return len;
}

static int s_set_node(kvedge_mview_t *v, const char *id, int deadline_ms)
{
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len = s_node_body(1u << 30, body);
    char key[128];
    snprintf(key, sizeof key, "node/%s", id);
    return kvedge_mview_set(v, key, body, len, deadline_ms);
}

static kvedge_mview_conn_t s_conn(kvedge_mview_t *v)
{
    kvedge_mview_conn_t c;
    kvedge_mview_conn(v, &c);
    return c;
}

static bool s_following(kvedge_mview_t *v, const char *router)
{
    kvedge_mview_conn_t c = s_conn(v);
    return kvedge_mview_state(v) == KVEDGE_MVIEW_SYNCED && strcmp(c.endpoint, router) == 0;
}

/* ---------------------------------------------------------------- tests */

/* [standby "no leader", master]: the standby's silent PUB does not hold the view up; it moves
 * on and syncs with the master. */
static void test_list_standby_then_master(void **state)
{
    s_fx_t *fx = *state;
    s_master_up(fx, 0);
    s_standby_up(fx, 0, "no leader");
    s_pair(fx->list[0], sizeof fx->list[0], fx->sb[0].router, fx->router[0]);
    s_pair(fx->list[1], sizeof fx->list[1], fx->sb[0].pub, fx->pub[0]);
    kvedge_mview_t *v = s_view(fx->list[0], fx->list[1], NULL);
    kvedge_mview_conn_t c = s_conn(v);
    assert_string_equal(c.endpoint, fx->sb[0].router); /* the first entry first */
    assert_string_equal(c.pub, fx->sb[0].pub);
    kt_wait_for(s_following(v, fx->router[0]), KT_WAIT_MS);
    assert_true(atomic_load(&fx->sb[0].icanhaz) >= 1);
    c = s_conn(v);
    assert_string_equal(c.pub, fx->pub[0]);
    assert_true(c.moves >= 1);
    assert_int_equal(c.redirects, 0);
    assert_string_equal(c.reason, "no leader");
    /* Reads and writes go to the master it follows. */
    assert_int_equal(s_set_node(v, "cloud-1", 3000), KVEDGE_OK);
    kvedge_master_node_t n;
    assert_int_equal(kvedge_mview_node(v, "cloud-1", &n), KVEDGE_OK);
    assert_int_equal(kvedge_master_seq(fx->master[0]), kvedge_mview_seq(v));
    kvedge_mview_destroy(&v);
}

/* A standby that names the leader: the view goes there at once, also when the leader is not in
 * its list. */
static void test_redirect_by_hint(void **state)
{
    s_fx_t *fx = *state;
    char hint[600];
    s_leader_and_standby(fx, hint, sizeof hint);
    s_standby_up(fx, 1, "no leader");
    s_pair(fx->list[0], sizeof fx->list[0], fx->sb[0].router, fx->sb[1].router);
    s_pair(fx->list[1], sizeof fx->list[1], fx->sb[0].pub, fx->sb[1].pub);
    int64_t t0 = kt_now_ms();
    kvedge_mview_t *v = s_view(fx->list[0], fx->list[1], NULL);
    kt_wait_for(s_following(v, fx->router[0]), KT_WAIT_MS);
    print_message("synced with the named leader %lld ms after start\n",
                  (long long)(kt_now_ms() - t0));
    kvedge_mview_conn_t c = s_conn(v);
    assert_int_equal(c.redirects, 1);
    assert_int_equal(c.moves, 1);
    assert_string_equal(c.pub, fx->pub[0]);
    assert_string_equal(c.reason, hint);
    assert_int_equal(atomic_load(&fx->sb[1].icanhaz), 0); /* never needed the second */
    kvedge_mview_destroy(&v);
}

/* A SET sent to a standby lands on the leader it names, within the caller's deadline; with no
 * leader anywhere the caller gets ENOTLEADER and the reason. */
static void test_set_through_standby(void **state)
{
    s_fx_t *fx = *state;
    char hint[600];
    s_leader_and_standby(fx, hint, sizeof hint);
    s_standby_up(fx, 1, "no leader");
    /* At once, before the view has asked for any snapshot: the SET meets the standby. */
    kvedge_mview_t *v = s_view(fx->sb[0].router, fx->sb[0].pub, NULL);
    assert_int_equal(s_set_node(v, "cloud-2", 5000), KVEDGE_OK);
    assert_true(atomic_load(&fx->sb[0].sets) + atomic_load(&fx->sb[0].icanhaz) >= 1);
    /* The leader has it: a fresh view of the master alone sees it. */
    kvedge_mview_t *check = s_view(fx->router[0], fx->pub[0], NULL);
    kt_wait_for(kvedge_mview_state(check) == KVEDGE_MVIEW_SYNCED, KT_WAIT_MS);
    kvedge_master_node_t n;
    assert_int_equal(kvedge_mview_node(check, "cloud-2", &n), KVEDGE_OK);
    kvedge_mview_destroy(&check);
    kvedge_mview_destroy(&v);

    /* No leader known by anyone: ENOTLEADER at the deadline, not before it. */
    v = s_view(fx->sb[1].router, fx->sb[1].pub, NULL);
    int64_t t0 = kt_now_ms();
    assert_int_equal(s_set_node(v, "cloud-3", 800), KVEDGE_ENOTLEADER);
    assert_true(kt_now_ms() - t0 >= 700);
    assert_true(atomic_load(&fx->sb[1].sets) >= 2); /* asked again after the backoff */
    assert_string_equal(s_conn(v).reason, "no leader");
    kvedge_mview_destroy(&v);
}

/* A readonly master (no etcd quorum) serves snapshots and HUGZ: the view follows it (reads go
 * on) and stays; a SET is refused with the reason, asked again until the deadline. */
static void test_readonly_master_followed(void **state)
{
    s_fx_t *fx = *state;
    s_master_up(fx, 0);
    fx->sb[0].readonly = true;
    s_standby_up(fx, 0, "no etcd quorum");
    s_pair(fx->list[0], sizeof fx->list[0], fx->sb[0].router, fx->router[0]);
    s_pair(fx->list[1], sizeof fx->list[1], fx->sb[0].pub, fx->pub[0]);
    kvedge_mview_t *v = s_view(fx->list[0], fx->list[1], NULL);
    kt_wait_for(s_following(v, fx->sb[0].router), KT_WAIT_MS);
    assert_int_equal(kvedge_mview_seq(v), S_RO_SEQ);
    assert_int_equal(kvedge_mview_registry(v), S_RO_REGISTRY);
    int64_t t0 = kt_now_ms();
    assert_int_equal(s_set_node(v, "cloud-4", 700), KVEDGE_ENOTLEADER);
    assert_true(kt_now_ms() - t0 >= 600);
    assert_true(atomic_load(&fx->sb[0].sets) >= 2);
    kvedge_mview_conn_t c = s_conn(v);
    assert_string_equal(c.reason, "no etcd quorum");
    assert_int_equal(c.moves, 0);
    /* Longer than dead_ms (800): its HUGZ keep the view there. */
    kt_pause_ms(1200); /* a silence the view must not take for death: the point of the test */
    assert_true(s_following(v, fx->sb[0].router));
    assert_int_equal(s_conn(v).moves, 0);
    kvedge_mview_destroy(&v);
}

/* Heartbeats go to whichever master the view follows: the leader records the node's health. */
static void test_heartbeats_reach_leader(void **state)
{
    s_fx_t *fx = *state;
    char hint[600];
    s_leader_and_standby(fx, hint, sizeof hint);
    kvedge_mview_t *v = s_view(fx->sb[0].router, fx->sb[0].pub, "cloud-9");
    kt_wait_for(s_following(v, fx->router[0]), KT_WAIT_MS);
    kvedge_master_health_t h;
    kt_wait_for(kvedge_mview_health(v, "cloud-9", &h) == KVEDGE_OK &&
                    h.state == KVEDGE_MASTER_HEALTH_UP,
                KT_WAIT_MS);
    kvedge_mview_destroy(&v);
}

typedef struct {
    kvedge_mview_t *v;
    const char *router;
    bool empty_seen;
} s_watch_t;

static bool s_moved(void *arg)
{
    s_watch_t *w = arg;
    if (kvedge_mview_state(w->v) == KVEDGE_MVIEW_EMPTY)
        w->empty_seen = true;
    return s_following(w->v, w->router);
}

/* [M0, M1]: the view follows M0; M0 goes away; the view serves what it had (STALE, never
 * EMPTY), moves to M1 and syncs with it. */
static void test_followed_master_dies(void **state)
{
    s_fx_t *fx = *state;
    s_master_up(fx, 0);
    s_master_up(fx, 1);
    kvedge_mview_t *m1 = s_view(fx->router[1], fx->pub[1], NULL);
    kt_wait_for(kvedge_mview_state(m1) == KVEDGE_MVIEW_SYNCED, KT_WAIT_MS);
    assert_int_equal(s_set_node(m1, "on-m1", 3000), KVEDGE_OK);
    kvedge_mview_destroy(&m1);

    s_pair(fx->list[0], sizeof fx->list[0], fx->router[0], fx->router[1]);
    s_pair(fx->list[1], sizeof fx->list[1], fx->pub[0], fx->pub[1]);
    kvedge_mview_t *v = s_view(fx->list[0], fx->list[1], NULL);
    kt_wait_for(s_following(v, fx->router[0]), KT_WAIT_MS);
    assert_int_equal(s_set_node(v, "on-m0", 3000), KVEDGE_OK);
    assert_int_equal(s_conn(v).moves, 0);

    int64_t t0 = kt_now_ms();
    kvedge_master_destroy(&fx->master[0]);
    s_watch_t w = {v, fx->router[1], false};
    kt_wait_until(s_moved, &w, KT_WAIT_MS);
    print_message("synced with the next master %lld ms after the first went (dead_ms 800)\n",
                  (long long)(kt_now_ms() - t0));
    assert_false(w.empty_seen);
    kvedge_master_node_t n;
    assert_int_equal(kvedge_mview_node(v, "on-m1", &n), KVEDGE_OK);
    assert_int_equal(kvedge_mview_node(v, "on-m0", &n), KVEDGE_ENOTFOUND); /* M1's registry */
    kvedge_mview_conn_t c = s_conn(v);
    assert_int_equal(c.moves, 1);
    assert_int_equal(c.redirects, 0);
    kvedge_mview_stats_t st;
    kvedge_mview_stats(v, &st);
    assert_true(st.deaths >= 1);
    assert_true(st.syncs >= 2);
    /* Writes follow too. */
    assert_int_equal(s_set_node(v, "after", 3000), KVEDGE_OK);
    assert_int_equal(kvedge_mview_node(v, "after", &n), KVEDGE_OK);
    kvedge_mview_destroy(&v);
}

/* One endpoint: what it always was (the view follows it, no moves, its endpoint reported). */
static void test_single_endpoint(void **state)
{
    s_fx_t *fx = *state;
    s_master_up(fx, 0);
    kvedge_mview_t *v = s_view(fx->router[0], fx->pub[0], NULL);
    kt_wait_for(s_following(v, fx->router[0]), KT_WAIT_MS);
    assert_int_equal(s_set_node(v, "one", 3000), KVEDGE_OK);
    kvedge_mview_conn_t c = s_conn(v);
    assert_int_equal(c.moves, 0);
    assert_int_equal(c.redirects, 0);
    assert_string_equal(c.reason, "");
    assert_string_equal(c.pub, fx->pub[0]);
    kvedge_mview_destroy(&v);
}

/* Lists are checked at start: one PUB per master, no empty entry, at most the maximum,
 * plaintext only to loopback (every entry). */
static void test_bad_lists(void **state)
{
    (void)state;
    kvedge_mview_opts_t o;
    kvedge_mview_opts_default(&o);
    kvedge_mview_t *v = NULL;
    o.master = "tcp://127.0.0.1:7410,tcp://127.0.0.1:7420";
    o.pub = "tcp://127.0.0.1:7411";
    assert_int_equal(kvedge_mview_start(&o, &v), KVEDGE_EINVAL);
    o.pub = "tcp://127.0.0.1:7411,";
    assert_int_equal(kvedge_mview_start(&o, &v), KVEDGE_EINVAL);
    o.master = "tcp://127.0.0.1:7410,,tcp://127.0.0.1:7420";
    o.pub = "tcp://127.0.0.1:7411,tcp://127.0.0.1:7412,tcp://127.0.0.1:7421";
    assert_int_equal(kvedge_mview_start(&o, &v), KVEDGE_EINVAL);
    o.master = "tcp://127.0.0.1:7410,127.0.0.1:7420";
    o.pub = "tcp://127.0.0.1:7411,tcp://127.0.0.1:7421";
    assert_int_equal(kvedge_mview_start(&o, &v), KVEDGE_EINVAL);
    o.master = "tcp://127.0.0.1:7410,tcp://10.1.2.3:7420";
    assert_int_equal(kvedge_mview_start(&o, &v), KVEDGE_EDENIED);
    char many[2048] = "", pubs[2048] = "";
    for (int i = 0; i <= KVEDGE_MVIEW_MAX_MASTERS; i++) {
        snprintf(many + strlen(many), sizeof many - strlen(many), "%stcp://127.0.0.1:%d",
                 i ? "," : "", 7500 + 2 * i);
        snprintf(pubs + strlen(pubs), sizeof pubs - strlen(pubs), "%stcp://127.0.0.1:%d",
                 i ? "," : "", 7501 + 2 * i);
    }
    o.master = many;
    o.pub = pubs;
    assert_int_equal(kvedge_mview_start(&o, &v), KVEDGE_EINVAL);
    assert_null(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_list_standby_then_master, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_redirect_by_hint, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_set_through_standby, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_heartbeats_reach_leader, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_readonly_master_followed, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_followed_master_dies, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_single_endpoint, s_setup, s_teardown),
        cmocka_unit_test(test_bad_lists),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
