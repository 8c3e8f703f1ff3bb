/* Masters on etcd as processes (`kvedge master --etcd`) against a real 3-member etcd cluster:
 * SIGKILL the leader under continuous SET and ICANHAZ traffic (a standby leads within the
 * bound below, no acknowledged model is lost, the registry id carries over, seq goes up, the
 * killed master comes back as a standby); then etcd members die: one (writes go on), two
 * (quorum lost: reads are served, SET is refused with "no etcd quorum"), and writes resume when
 * a member returns. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <czmq.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/master/master.h"
#include "runtime/mview.h"
#include "access/codec/error.h"
#include "tests/common/testutil.h"
#include "tests/common/spawn.h"
#include "tests/common/etcd.h"
#include "tests/common/shell.h"
#include "tests/store/master/mclient.h"

#define S_LEASE_MS 2000
/* The failover bound: the lease's TTL (whole seconds, as etcd grants it) and 1 s for etcd to
 * expire it (it checks every 500 ms) and for a standby's election step (every 250 ms) and
 * takeover. */
#define S_FAILOVER_BOUND_MS (((S_LEASE_MS + 999) / 1000) * 1000 + 1000)
#define S_CALL_MS           1000

static kt_etcd_t s_etcd;
static char s_dir[128];

typedef struct {
    char name[16];
    char router[64], pub[64], data[256], prefix[64];
    pid_t pid;
    int fd;
    bool fast_health; /* --suspect-ms 1000 --down-ms 3000 */
} s_proc_t;

static void s_master_spawn(s_proc_t *p)
{
    char lease[16], line[700];
    snprintf(lease, sizeof lease, "%d", S_LEASE_MS);
    char *const argv[] = {"kvedge", "master",  "--insecure",     "--data",        p->data,
                          "--bind", p->router, "--pub",          p->pub,          "--metrics",
                          "off",    "--etcd",  s_etcd.endpoints, "--etcd-prefix", p->prefix,
                          "--id",   p->name,   "--lease-ms",     lease,           "--log-level",
                          "info",   NULL};
    char *const fast[] = {
        "kvedge", "master",       "--insecure",     "--data",        p->data,
        "--bind", p->router,      "--pub",          p->pub,          "--metrics",
        "off",    "--etcd",       s_etcd.endpoints, "--etcd-prefix", p->prefix,
        "--id",   p->name,        "--lease-ms",     lease,           "--log-level",
        "info",   "--suspect-ms", "1000",           "--down-ms",     "3000",
        NULL};
    p->pid = kt_spawn_argv(KVEDGE_BIN, p->fast_health ? fast : argv, line, sizeof line, &p->fd);
    assert_true(p->pid > 0);
    assert_non_null(strstr(line, "listening "));
}

static void s_master_init_opt(s_proc_t *p, const char *name, const char *prefix, bool fast)
{
    memset(p, 0, sizeof *p);
    p->fast_health = fast;
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->router, sizeof p->router, "tcp://127.0.0.1:%d", kt_free_port());
    snprintf(p->pub, sizeof p->pub, "tcp://127.0.0.1:%d", kt_free_port());
    snprintf(p->data, sizeof p->data, "%s/%s", s_dir, name);
    snprintf(p->prefix, sizeof p->prefix, "%s", prefix);
    s_master_spawn(p);
}

static void s_master_init(s_proc_t *p, const char *name, const char *prefix)
{
    s_master_init_opt(p, name, prefix, false);
}

static void s_master_kill(s_proc_t *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        close(p->fd);
    }
    p->pid = 0;
}

static bool s_is(const s_proc_t *p, const char *role)
{
    char r[32];
    return kt_master_role(p->router, r, sizeof r, S_CALL_MS) && strcmp(r, role) == 0;
}

/* ---------------------------------------------------------------- traffic */

#define S_MAX_ACKED 4096

typedef struct {
    s_proc_t *m[2];
    _Atomic bool stop;
    _Atomic int acked;             /* models acknowledged */
    _Atomic int reads;             /* snapshots completed */
    _Atomic int64_t acked_by_1_ms; /* monotonic: the first SET m[1] acknowledged */
    int leader;                    /* the master the traffic goes to */
} s_traffic_t;

/* SET model/k-N on the master the traffic believes leads; on ENOTLEADER or silence, the
 * other. Only acknowledged models count. */
static void *s_traffic(void *arg)
{
    s_traffic_t *t = arg;
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    int n = 0;
    while (!atomic_load(&t->stop) && atomic_load(&t->acked) < S_MAX_ACKED) {
        char id[32], key[64];
        snprintf(id, sizeof id, "k-%d", n);
        snprintf(key, sizeof key, "model/%s", id);
        size_t len = kt_model_body(id, body);
        kt_mreply_t r;
        s_proc_t *m = t->m[t->leader];
        if (kt_master_call(m->router, KVEDGE_KVMSG_SET, key, body, len, S_CALL_MS, &r, NULL,
                           NULL) == 0 &&
            r.cmd == KVEDGE_KVMSG_OK) {
            n++;
            atomic_fetch_add(&t->acked, 1);
            if (t->leader == 1 && atomic_load(&t->acked_by_1_ms) == 0)
                atomic_store(&t->acked_by_1_ms, kt_now_ms());
        } else {
            t->leader = 1 - t->leader; /* a redirect, silence, or "no leader" yet */
        }
        if (kt_master_call(t->m[t->leader]->router, KVEDGE_KVMSG_ICANHAZ, "model/", NULL, 0,
                           S_CALL_MS, &r, NULL, NULL) == 0 &&
            r.cmd == KVEDGE_KVMSG_KTHXBAI)
            atomic_fetch_add(&t->reads, 1);
    }
    return NULL;
}

typedef struct {
    int n;
    char seen[S_MAX_ACKED];
} s_keys_t;

static void s_key_cb(void *ctx, const char *key)
{
    s_keys_t *k = ctx;
    int i;
    if (sscanf(key, "model/k-%d", &i) == 1 && i >= 0 && i < S_MAX_ACKED) {
        k->seen[i] = 1;
        k->n++;
    }
}

static void test_sigkill_leader_under_traffic(void **state)
{
    (void)state;
    s_proc_t a, b;
    s_master_init(&a, "m1", "/t/failover");
    kt_wait_for(s_is(&a, "leader"), KT_WAIT_MS);
    s_master_init(&b, "m2", "/t/failover");
    kt_wait_for(s_is(&b, "standby"), KT_WAIT_MS);

    s_traffic_t t = {.m = {&a, &b}};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, s_traffic, &t), 0);
    kt_wait_for(atomic_load(&t.acked) >= 20 && atomic_load(&t.reads) >= 5, KT_WAIT_MS);
    kt_mreply_t r;
    assert_int_equal(
        kt_master_call(a.router, KVEDGE_KVMSG_ICANHAZ, "", NULL, 0, S_CALL_MS, &r, NULL, NULL), 0);
    uint64_t registry = r.registry, old_seq = r.seq;

    int64_t t_kill = kt_now_ms();
    s_master_kill(&a);
    int acked_at_kill = atomic_load(&t.acked);
    kt_wait_for(s_is(&b, "leader"), KT_WAIT_MS);
    int64_t t_lead = kt_now_ms();
    kt_wait_for(atomic_load(&t.acked_by_1_ms) != 0, KT_WAIT_MS);
    int64_t t_ack = atomic_load(&t.acked_by_1_ms);
    print_message("leader SIGKILLed: a standby led after %lld ms, acknowledged a SET after %lld "
                  "ms (bound %d ms); %d models acknowledged before the kill\n",
                  (long long)(t_lead - t_kill), (long long)(t_ack - t_kill), S_FAILOVER_BOUND_MS,
                  acked_at_kill);
    /* The bound, with the slack every timing assert of this suite allows on a loaded shared
     * runner (docs/contributing.md); bench_failover reports the distribution against the bound. */
    assert_true(t_lead - t_kill <= S_FAILOVER_BOUND_MS + KT_SLACK_MS);
    kt_wait_for(atomic_load(&t.acked) >= acked_at_kill + 20, KT_WAIT_MS);
    atomic_store(&t.stop, true);
    pthread_join(th, NULL);

    /* Every acknowledged model is there; the registry id carried over; seq went up. */
    int acked = atomic_load(&t.acked);
    static s_keys_t keys;
    memset(&keys, 0, sizeof keys);
    assert_int_equal(kt_master_call(b.router, KVEDGE_KVMSG_ICANHAZ, "model/", NULL, 0, 3000, &r,
                                    s_key_cb, &keys),
                     0);
    assert_int_equal(r.cmd, KVEDGE_KVMSG_KTHXBAI);
    for (int i = 0; i < acked; i++)
        if (!keys.seen[i])
            fail_msg("model/k-%d was acknowledged and is lost", i);
    assert_int_equal(r.registry, registry);
    assert_true(r.seq > old_seq);

    /* The killed master comes back as a standby of the new leader. */
    s_master_spawn(&a);
    kt_wait_for(s_is(&a, "standby"), KT_WAIT_MS);
    kt_mreply_t st;
    assert_int_equal(
        kt_master_call(a.router, KVEDGE_KVMSG_SET, "model/z", NULL, 0, S_CALL_MS, &st, NULL, NULL),
        0);
    assert_int_equal(st.status, KVEDGE_ENOTLEADER);
    char want[200];
    snprintf(want, sizeof want, "leader %s %s", b.router, b.pub);
    assert_string_equal(st.body, want);
    s_master_kill(&a);
    s_master_kill(&b);
}

/* ---------------------------------------------------------------- nodes */

/* A cloud store node (a process) that follows the list of masters. */
static pid_t s_node_spawn(const char *id, const s_proc_t *a, const s_proc_t *b)
{
    char data[300], bind[64], masters[200], pubs[200], line[700];
    snprintf(data, sizeof data, "%s/node-%s", s_dir, id);
    snprintf(bind, sizeof bind, "tcp://127.0.0.1:%d", kt_free_port());
    snprintf(masters, sizeof masters, "%s,%s", a->router, b->router);
    snprintf(pubs, sizeof pubs, "%s,%s", a->pub, b->pub);
    char *const argv[] = {"kvedge",    "--data",       data,          "store",     "--role",
                          "cloud",     "--insecure",   "--bind",      bind,        "--master",
                          masters,     "--master-pub", pubs,          "--node-id", (char *)id,
                          "--metrics", "off",          "--log-level", "error",     NULL};
    int fd;
    pid_t pid = kt_spawn_argv(KVEDGE_BIN, argv, line, sizeof line, &fd);
    assert_true(pid > 0);
    close(fd);
    return pid;
}

typedef struct {
    const char *router, *pub;
    int up; /* nodes n1, n2 registered and up */
} s_obs_t;

/* n1 and n2 registered and up in a snapshot of the master (a view made for the check). */
static bool s_nodes_up(void *arg)
{
    s_obs_t *o = arg;
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = o->router;
    vo.pub = o->pub;
    vo.start_wait_ms = 2000;
    kvedge_mview_t *v = NULL;
    o->up = 0;
    if (kvedge_mview_start(&vo, &v) == 0 && kvedge_mview_state(v) == KVEDGE_MVIEW_SYNCED) {
        const char *ids[2] = {"n1", "n2"};
        for (int i = 0; i < 2; i++) {
            kvedge_master_node_t n;
            kvedge_master_health_t h;
            if (kvedge_mview_node(v, ids[i], &n) == 0 && kvedge_mview_health(v, ids[i], &h) == 0 &&
                h.state == KVEDGE_MASTER_HEALTH_UP)
                o->up++;
        }
    }
    kvedge_mview_destroy(&v);
    return o->up == 2;
}

/* Nodes given both masters follow the new leader: their registrations carry over, and their
 * heartbeats reach it (still up past the new leader's suspect time). */
static void test_nodes_follow_the_new_leader(void **state)
{
    (void)state;
    s_proc_t a, b;
    s_master_init_opt(&a, "n-m1", "/t/nodes", true);
    kt_wait_for(s_is(&a, "leader"), KT_WAIT_MS);
    s_master_init_opt(&b, "n-m2", "/t/nodes", true);
    kt_wait_for(s_is(&b, "standby"), KT_WAIT_MS);
    pid_t n1 = s_node_spawn("n1", &a, &b), n2 = s_node_spawn("n2", &a, &b);
    s_obs_t oa = {a.router, a.pub, 0}, ob = {b.router, b.pub, 0};
    kt_wait_until(s_nodes_up, &oa, KT_WAIT_MS);

    int64_t t0 = kt_now_ms();
    s_master_kill(&a);
    kt_wait_for(s_is(&b, "leader"), KT_WAIT_MS);
    kt_wait_until(s_nodes_up, &ob, KT_WAIT_MS);
    print_message("nodes up at the new leader %lld ms after the kill\n",
                  (long long)(kt_now_ms() - t0));
    /* Past the new leader's fresh grace period (the views' dead time and a heartbeat interval
     * on top of its suspect time, 1 s): still up, so the nodes heartbeat the new leader. */
    /* The silence a lost heartbeat would need to show: */
    kt_pause_ms(KVEDGE_MVIEW_DEAD_MS + KVEDGE_MASTER_HEARTBEAT_IVL_MS + 1500);
    assert_true(s_nodes_up(&ob));
    kill(n1, SIGKILL);
    kill(n2, SIGKILL);
    waitpid(n1, NULL, 0);
    waitpid(n2, NULL, 0);
    s_master_kill(&b);
}

/* ---------------------------------------------------------------- quorum */

static int s_set_model(const s_proc_t *m, const char *id, kt_mreply_t *r)
{
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    char key[64];
    snprintf(key, sizeof key, "model/%s", id);
    size_t len = kt_model_body(id, body);
    if (kt_master_call(m->router, KVEDGE_KVMSG_SET, key, body, len, 3000, r, NULL, NULL) != 0)
        return -1;
    return r->cmd == KVEDGE_KVMSG_OK ? 0 : r->status;
}

static bool s_refused_no_quorum(const s_proc_t *m)
{
    kt_mreply_t r;
    return s_set_model(m, "q-refused", &r) == KVEDGE_ENOTLEADER &&
           strcmp(r.body, "no etcd quorum") == 0;
}

static void test_quorum_loss_and_return(void **state)
{
    (void)state;
    s_proc_t m;
    s_master_init(&m, "q1", "/t/quorum");
    kt_wait_for(s_is(&m, "leader"), KT_WAIT_MS);
    kt_mreply_t r;
    assert_int_equal(s_set_model(&m, "q-0", &r), 0);

    /* One member down: a quorum is left, writes go on. */
    kt_etcd_kill(&s_etcd, 0);
    kt_wait_for(s_set_model(&m, "q-1", &r) == 0, KT_WAIT_MS);
    assert_true(s_is(&m, "leader"));

    /* Two down: no quorum. Within the lease the master stops leading: reads go on, writes are
     * refused with a clear reason, STATUS says readonly and etcd unhealthy. */
    kt_etcd_kill(&s_etcd, 1);
    int64_t t0 = kt_now_ms();
    kt_wait_for(s_refused_no_quorum(&m), KT_WAIT_MS);
    print_message("quorum lost: SET refused with \"no etcd quorum\" after %lld ms\n",
                  (long long)(kt_now_ms() - t0));
    assert_true(s_is(&m, "readonly"));
    assert_int_equal(
        kt_master_call(m.router, KVEDGE_KVMSG_ICANHAZ, "model/", NULL, 0, 3000, &r, NULL, NULL), 0);
    assert_int_equal(r.cmd, KVEDGE_KVMSG_KTHXBAI);
    assert_int_equal(r.synced, 2);
    assert_int_equal(
        kt_master_call(m.router, KVEDGE_KVMSG_HEARTBEAT, "n1", NULL, 0, 3000, &r, NULL, NULL), 0);
    assert_int_equal(r.status, KVEDGE_ENOTLEADER);
    assert_int_equal(
        kt_master_call(m.router, KVEDGE_KVMSG_STATUS, NULL, NULL, 0, 3000, &r, NULL, NULL), 0);
    cJSON *o = cJSON_Parse(r.body);
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "etcd"), "healthy")));
    cJSON_Delete(o);

    /* A member returns: quorum, and writes resume. */
    kt_etcd_restart(&s_etcd, 1);
    t0 = kt_now_ms();
    kt_wait_for(s_set_model(&m, "q-2", &r) == 0, KT_WAIT_MS);
    print_message("quorum back: writes resumed after %lld ms\n", (long long)(kt_now_ms() - t0));
    assert_true(s_is(&m, "leader"));
    assert_int_equal(
        kt_master_call(m.router, KVEDGE_KVMSG_ICANHAZ, "model/", NULL, 0, 3000, &r, NULL, NULL), 0);
    assert_int_equal(r.synced, 3);
    kt_etcd_restart(&s_etcd, 0);
    s_master_kill(&m);
}

/* A second SIGTERM while a master stops (its lease revoke waiting on a frozen etcd) exits at
 * once, with exit 1 and a line that says so, instead of interrupting the stop's wait for the
 * actor: that let the process exit while the actor still closed RocksDB ("pthread unlock:
 * Invalid argument", SIGABRT). */
static void test_second_signal_during_a_stop(void **state)
{
    (void)state;
    s_proc_t p;
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "stop1");
    snprintf(p.router, sizeof p.router, "tcp://127.0.0.1:%d", kt_free_port());
    snprintf(p.pub, sizeof p.pub, "tcp://127.0.0.1:%d", kt_free_port());
    snprintf(p.data, sizeof p.data, "%s/stop1", s_dir);
    char log[256], line[700];
    snprintf(log, sizeof log, "%s/stop1.log", s_dir);
    /* A 3 s lease: each etcd call, the revoke included, waits up to 1 s. */
    char *const argv[] = {"kvedge", "master", "--insecure",     "--data",        p.data,
                          "--bind", p.router, "--pub",          p.pub,           "--metrics",
                          "off",    "--etcd", s_etcd.endpoints, "--etcd-prefix", "/t/stop",
                          "--id",   p.name,   "--lease-ms",     "3000",          "--log-level",
                          "info",   NULL};
    /* The master's stderr (its log) goes to a file: the child inherits fd 2. */
    int saved = dup(STDERR_FILENO);
    FILE *lf = fopen(log, "w");
    assert_non_null(lf);
    dup2(fileno(lf), STDERR_FILENO);
    p.pid = kt_spawn_argv(KVEDGE_BIN, argv, line, sizeof line, &p.fd);
    dup2(saved, STDERR_FILENO);
    close(saved);
    fclose(lf);
    assert_true(p.pid > 0);
    kt_wait_for(s_is(&p, "leader"), KT_WAIT_MS);

    for (int i = 0; i < s_etcd.n; i++)
        kill(s_etcd.pid[i], SIGSTOP);
    assert_int_equal(kill(p.pid, SIGTERM), 0);
    kt_wait_for(kt_file_has(log, "signal received: stopping"), KT_WAIT_MS);
    assert_int_equal(kill(p.pid, SIGTERM), 0);
    int st = 0;
    kt_wait_for(waitpid(p.pid, &st, WNOHANG) == p.pid, KT_WAIT_MS);
    for (int i = 0; i < s_etcd.n; i++)
        kill(s_etcd.pid[i], SIGCONT);
    close(p.fd);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 1);
    assert_true(kt_file_has(log, "a second signal during the stop: exiting at once"));
    assert_false(kt_file_has(log, "pthread"));
}

int main(void)
{
    if (!kt_etcd_installed()) {
        fprintf(stderr, "etcd is not installed (scripts/setup.sh installs it): skipped\n");
        return 77;
    }
    snprintf(s_dir, sizeof s_dir, "/tmp/kvedge-test-failover-%d", (int)getpid());
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", s_dir, s_dir);
    if (system(cmd) != 0)
        return 1;
    if (kt_etcd_start(&s_etcd, s_dir, 3) != 0) {
        fprintf(stderr, "etcd did not start: see %s/etcd*.log\n", s_dir);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigkill_leader_under_traffic),
        cmocka_unit_test(test_nodes_follow_the_new_leader),
        cmocka_unit_test(test_quorum_loss_and_return),
        cmocka_unit_test(test_second_signal_during_a_stop),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_etcd_stop(&s_etcd);
    if (rc == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
        rc = system(cmd) == 0 ? 0 : 1;
    }
    return rc;
}
