/* Leader failover of masters on etcd: a 3-member etcd cluster on loopback and two (or more)
 * `kvedge master --etcd` processes; --kills times, the leader is SIGKILLed and the time until
 * a standby says it leads (STATUS) and until it acknowledges a SET of a model (polled every
 * 10 ms) is measured; the killed master is started again as a standby before the next kill.
 * Prints each kill, then the median and max. Then the per-record costs behind the capacity
 * estimate in docs/benchmarks.md: --records hard records (models) SET through the leader, their
 * rate, and etcd's backend size before and after (bytes per record in etcd); then one more
 * kill, with those records to take over. With --chaos S: S seconds of random kills and restarts
 * of masters (at most M - 1 down) and etcd members (at most 2 of 3 down: quorum lost at times)
 * under a writer that SETs models to whichever master leads; then everything is started
 * again and every acknowledged model must be in the leader's registry and in etcd.
 *
 * bench_failover [--kvedge BIN] [--kills N] [--masters M] [--lease-ms MS] [--records N]
 *                [--chaos S] [--seed N] [--log-level L (the masters')] */
#include <czmq.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/master/etcd.h"
#include "access/codec/error.h"
#include "tests/common/etcd.h"
#include "tests/store/master/mclient.h"

#define S_MAX_MASTERS 5
#define S_POLL_MS     10

static struct {
    const char *kvedge;
    int kills;
    int masters;
    int lease_ms;
    int records;
    int chaos;
    unsigned seed;
    const char *log; /* the masters' --log-level */
} s_cfg = {KVEDGE_BENCH_KVEDGE_BIN, 10, 2, 3000, 10000, 0, 1, "error"};

typedef struct {
    char name[16], router[64], pub[64], data[256];
    pid_t pid;
} s_master_t;

static kt_etcd_t s_etcd;
static char s_dir[128];

static int s_spawn(s_master_t *m)
{
    char lease[16];
    snprintf(lease, sizeof lease, "%d", s_cfg.lease_ms);
    char *const argv[] = {"kvedge",
                          "master",
                          "--insecure",
                          "--data",
                          m->data,
                          "--bind",
                          m->router,
                          "--pub",
                          m->pub,
                          "--metrics",
                          "off",
                          "--etcd",
                          s_etcd.endpoints,
                          "--etcd-prefix",
                          "/bench/failover",
                          "--id",
                          m->name,
                          "--lease-ms",
                          lease,
                          "--log-level",
                          (char *)s_cfg.log,
                          NULL};
    int pfd[2];
    if (pipe(pfd) != 0)
        return -1;
    m->pid = fork();
    if (m->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], STDOUT_FILENO);
        close(pfd[0]);
        execv(s_cfg.kvedge, argv);
        _exit(127);
    }
    close(pfd[1]);
    char line[400];
    ssize_t got = read(pfd[0], line, sizeof line - 1);
    close(pfd[0]);
    return got > 0 ? 0 : -1;
}

static void s_kill(s_master_t *m)
{
    if (m->pid > 0) {
        kill(m->pid, SIGKILL);
        waitpid(m->pid, NULL, 0);
    }
    m->pid = 0;
}

static bool s_role_is(const s_master_t *m, const char *role)
{
    char r[32];
    return kt_master_role(m->router, r, sizeof r, 500) && strcmp(r, role) == 0;
}

/* The master that leads, waiting up to 30 s; -1 when none does. */
static int s_leader(s_master_t *ms, int n)
{
    for (int64_t end = kt_now_ms() + 30000; kt_now_ms() < end; kt_pause_ms(S_POLL_MS))
        for (int i = 0; i < n; i++)
            if (ms[i].pid > 0 && s_role_is(&ms[i], "leader"))
                return i;
    return -1;
}

static int s_cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* SET model/<id> on m; true when acknowledged. */
static bool s_set(const s_master_t *m, const char *id, int timeout_ms)
{
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    char key[80];
    snprintf(key, sizeof key, "model/%s", id);
    size_t len = kt_model_body(id, body);
    kt_mreply_t r;
    return kt_master_call(m->router, KVEDGE_KVMSG_SET, key, body, len, timeout_ms, &r, NULL,
                          NULL) == 0 &&
           r.cmd == KVEDGE_KVMSG_OK;
}

static int s_failovers(s_master_t *ms)
{
    int64_t lead[64], ack[64];
    int n = 0;
    printf("kill  leader  led_after_ms  set_acked_after_ms\n");
    for (int k = 0; k < s_cfg.kills && k < 64; k++) {
        int l = s_leader(ms, s_cfg.masters);
        if (l < 0) {
            fprintf(stderr, "bench_failover: no leader before kill %d\n", k);
            return 1;
        }
        char id[32];
        snprintf(id, sizeof id, "f-%d", k);
        int64_t t0 = kt_now_ms();
        s_kill(&ms[l]);
        int64_t t_lead = 0, t_ack = 0;
        while ((!t_lead || !t_ack) && kt_now_ms() - t0 < 60000) {
            for (int i = 0; i < s_cfg.masters; i++) {
                if (i == l)
                    continue;
                if (!t_lead && s_role_is(&ms[i], "leader"))
                    t_lead = kt_now_ms();
                if (t_lead && !t_ack && s_set(&ms[i], id, 500))
                    t_ack = kt_now_ms();
            }
            kt_pause_ms(S_POLL_MS);
        }
        lead[n] = t_lead - t0;
        ack[n] = t_ack - t0;
        printf("%4d  %-6s  %12lld  %18lld\n", k, ms[l].name, (long long)lead[n], (long long)ack[n]);
        fflush(stdout);
        n++;
        if (!t_lead || !t_ack || s_spawn(&ms[l]) != 0)
            return 1;
        for (int64_t end = kt_now_ms() + 30000; !s_role_is(&ms[l], "standby") && kt_now_ms() < end;)
            kt_pause_ms(S_POLL_MS);
    }
    qsort(lead, (size_t)n, sizeof lead[0], s_cmp);
    qsort(ack, (size_t)n, sizeof ack[0], s_cmp);
    printf("failover over %d kills (lease %d ms, %d masters): led after median %lld ms, max "
           "%lld ms; SET acknowledged after median %lld ms, max %lld ms\n",
           n, s_cfg.lease_ms, s_cfg.masters, (long long)lead[n / 2], (long long)lead[n - 1],
           (long long)ack[n / 2], (long long)ack[n - 1]);
    return 0;
}

static int64_t s_db_size(void)
{
    kvedge_etcd_t *e = NULL;
    kvedge_etcd_reply_t r;
    int64_t size = -1;
    if (kvedge_etcd_new(s_etcd.client[0], 2000, &e, NULL, 0) == 0 &&
        kvedge_etcd_status(e, &r, NULL, 0) == 0) {
        size = r.db_size;
        kvedge_etcd_reply_free(&r);
    }
    kvedge_etcd_destroy(&e);
    return size;
}

/* Hard records through the leader: the rate, and what each costs etcd's backend. */
static int s_records(s_master_t *ms)
{
    int l = s_leader(ms, s_cfg.masters);
    if (l < 0)
        return 1;
    int64_t before = s_db_size(), t0 = kt_now_ms();
    for (int i = 0; i < s_cfg.records; i++) {
        char id[32];
        snprintf(id, sizeof id, "r-%06d", i);
        if (!s_set(&ms[l], id, 3000)) {
            fprintf(stderr, "bench_failover: SET %s refused\n", id);
            return 1;
        }
    }
    int64_t ms_taken = kt_now_ms() - t0, after = s_db_size();
    printf("%d hard records (models, %d-byte bodies) through the leader in %lld ms: %.0f "
           "records/s; etcd backend %lld -> %lld bytes (%.0f bytes per record, before "
           "compaction)\n",
           s_cfg.records, KVEDGE_MASTER_MODEL_BYTES, (long long)ms_taken,
           ms_taken ? s_cfg.records * 1000.0 / (double)ms_taken : 0.0, (long long)before,
           (long long)after, (double)(after - before) / s_cfg.records);
    /* One more kill with the records in etcd: the takeover reads them all. */
    int64_t t0k = kt_now_ms();
    s_kill(&ms[l]);
    int n2 = s_leader(ms, s_cfg.masters);
    kt_mreply_t r;
    if (n2 < 0 || kt_master_call(ms[n2].router, KVEDGE_KVMSG_ICANHAZ, "model/", NULL, 0, 10000, &r,
                                 NULL, NULL) != 0)
        return 1;
    printf("with %u models in etcd: a standby led after %lld ms and serves all of them (%u)\n",
           r.synced, (long long)(kt_now_ms() - t0k), r.synced);
    return r.synced >= (uint32_t)s_cfg.records ? 0 : 1;
}

/* ---------------------------------------------------------------- chaos */

#define S_CHAOS_MAX_ACKED 200000

typedef struct {
    s_master_t *ms;
    _Atomic bool stop;
    _Atomic int attempted, acked;
    char *acked_ids; /* acked_ids[i]: model c-i acknowledged */
} s_writer_t;

/* SETs model c-N to the master the writer believes leads: a redirect moves it to the master
 * named, anything else to the next master. */
static void *s_writer(void *arg)
{
    s_writer_t *w = arg;
    int at = 0, n = 0;
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    while (!atomic_load(&w->stop) && n < S_CHAOS_MAX_ACKED) {
        char id[32], key[64];
        snprintf(id, sizeof id, "c-%d", n);
        snprintf(key, sizeof key, "model/%s", id);
        size_t len = kt_model_body(id, body);
        kt_mreply_t r;
        atomic_fetch_add(&w->attempted, 1);
        int got = kt_master_call(w->ms[at].router, KVEDGE_KVMSG_SET, key, body, len, 1000, &r, NULL,
                                 NULL);
        if (got == 0 && r.cmd == KVEDGE_KVMSG_OK) {
            w->acked_ids[n++] = 1;
            atomic_fetch_add(&w->acked, 1);
            continue;
        }
        int next = (at + 1) % s_cfg.masters;
        for (int i = 0; got == 0 && i < s_cfg.masters; i++)
            if (strncmp(r.body, "leader ", 7) == 0 &&
                strncmp(r.body + 7, w->ms[i].router, strlen(w->ms[i].router)) == 0)
                next = i;
        at = next;
        if (got == 0 && r.status == KVEDGE_ENOTLEADER)
            kt_pause_ms(50); /* an election under way, or no quorum: do not spin */
    }
    return NULL;
}

typedef struct {
    s_writer_t *w;
    int lost, found;
} s_check_t;

static void s_chaos_key(void *ctx, const char *key)
{
    s_check_t *c = ctx;
    int i;
    if (sscanf(key, "model/c-%d", &i) == 1 && i >= 0 && i < S_CHAOS_MAX_ACKED && c->w->acked_ids[i])
        c->found++;
}

static int s_etcd_count(void *ctx, const kvedge_etcd_kv_t *kv)
{
    s_check_t *c = ctx;
    int i;
    const char *m = strstr(kv->key, "/reg/model/c-");
    if (m && sscanf(m, "/reg/model/c-%d", &i) == 1 && i >= 0 && i < S_CHAOS_MAX_ACKED &&
        c->w->acked_ids[i])
        c->found++;
    return 0;
}

/* One random action of the bounded schedule; its name into what. */
static void s_chaos_step(s_master_t *ms, const char **what)
{
    int down_m = 0, down_e = 0;
    for (int i = 0; i < s_cfg.masters; i++)
        down_m += ms[i].pid <= 0;
    for (int i = 0; i < s_etcd.n; i++)
        down_e += s_etcd.pid[i] <= 0;
    int r = rand() % 4;
    if (r == 0 && down_m < s_cfg.masters - 1) {
        int i = rand() % s_cfg.masters;
        if (ms[i].pid > 0) {
            s_kill(&ms[i]);
            *what = "kill a master";
            return;
        }
    }
    if (r == 1 && down_e < 2) {
        int i = rand() % s_etcd.n;
        if (s_etcd.pid[i] > 0) {
            kt_etcd_kill(&s_etcd, i);
            *what = down_e ? "kill a second etcd member (quorum lost)" : "kill an etcd member";
            return;
        }
    }
    for (int i = 0; i < s_cfg.masters; i++)
        if (ms[i].pid <= 0 && (r == 2 || down_m == s_cfg.masters - 1)) {
            s_spawn(&ms[i]);
            *what = "restart a master";
            return;
        }
    for (int i = 0; i < s_etcd.n; i++)
        if (s_etcd.pid[i] <= 0) {
            kt_etcd_restart(&s_etcd, i);
            *what = "restart an etcd member";
            return;
        }
    *what = "nothing";
}

static int s_chaos(s_master_t *ms)
{
    srand(s_cfg.seed);
    s_writer_t w = {.ms = ms};
    w.acked_ids = calloc(S_CHAOS_MAX_ACKED, 1);
    pthread_t th;
    if (!w.acked_ids || pthread_create(&th, NULL, s_writer, &w) != 0)
        return 1;
    int actions[4] = {0};
    int64_t end = kt_now_ms() + (int64_t)s_cfg.chaos * 1000;
    while (kt_now_ms() < end) {
        kt_pause_ms(1000 + rand() % 2000);
        const char *what = "nothing";
        s_chaos_step(ms, &what);
        actions[what[0] == 'k' ? (strstr(what, "etcd") ? 1 : 0) : what[0] == 'r' ? 2 : 3]++;
        printf("t=%5.1fs  %-40s acked %d of %d\n",
               (double)(kt_now_ms() - (end - (int64_t)s_cfg.chaos * 1000)) / 1000.0, what,
               atomic_load(&w.acked), atomic_load(&w.attempted));
        fflush(stdout);
    }
    /* Everything back; writes must work again. */
    for (int i = 0; i < s_etcd.n; i++)
        kt_etcd_restart(&s_etcd, i);
    for (int i = 0; i < s_cfg.masters; i++)
        if (ms[i].pid <= 0)
            s_spawn(&ms[i]);
    int before = atomic_load(&w.acked);
    for (int64_t t = kt_now_ms(); atomic_load(&w.acked) < before + 10 && kt_now_ms() - t < 60000;)
        kt_pause_ms(S_POLL_MS);
    atomic_store(&w.stop, true);
    pthread_join(th, NULL);
    int acked = atomic_load(&w.acked), attempted = atomic_load(&w.attempted);
    int l = s_leader(ms, s_cfg.masters);
    s_check_t reg = {&w, 0, 0}, etcd = {&w, 0, 0};
    kt_mreply_t r;
    kvedge_etcd_t *e = NULL;
    int rc = l >= 0 &&
                     kt_master_call(ms[l].router, KVEDGE_KVMSG_ICANHAZ, "model/c-", NULL, 0, 10000,
                                    &r, s_chaos_key, &reg) == 0 &&
                     kvedge_etcd_new(s_etcd.endpoints, 3000, &e, NULL, 0) == 0 &&
                     kvedge_etcd_range_prefix(e, "/bench/failover/reg/model/c-", 0, s_etcd_count,
                                              &etcd, NULL, 0) == 0
                 ? 0
                 : 1;
    kvedge_etcd_destroy(&e);
    printf("chaos %d s (seed %u): %d master kills, %d etcd member kills, %d restarts; %d of %d "
           "SETs acknowledged (%.1f%%); acknowledged models lost: %d in the leader's registry, "
           "%d in etcd\n",
           s_cfg.chaos, s_cfg.seed, actions[0], actions[1], actions[2], acked, attempted,
           attempted ? 100.0 * acked / attempted : 0.0, acked - reg.found, acked - etcd.found);
    free(w.acked_ids);
    return rc == 0 && reg.found == acked && etcd.found == acked ? 0 : 1;
}

static int s_args(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return -1;
        if (strcmp(a, "--kvedge") == 0)
            s_cfg.kvedge = v;
        else if (strcmp(a, "--kills") == 0)
            s_cfg.kills = atoi(v);
        else if (strcmp(a, "--masters") == 0)
            s_cfg.masters = atoi(v);
        else if (strcmp(a, "--lease-ms") == 0)
            s_cfg.lease_ms = atoi(v);
        else if (strcmp(a, "--records") == 0)
            s_cfg.records = atoi(v);
        else if (strcmp(a, "--chaos") == 0)
            s_cfg.chaos = atoi(v);
        else if (strcmp(a, "--seed") == 0)
            s_cfg.seed = (unsigned)atoi(v);
        else if (strcmp(a, "--log-level") == 0)
            s_cfg.log = v;
        else
            return -1;
        i++;
    }
    return s_cfg.kills >= 0 && s_cfg.kills <= 64 && s_cfg.chaos >= 0 && s_cfg.masters >= 2 &&
                   s_cfg.masters <= S_MAX_MASTERS && s_cfg.lease_ms >= 1000 && s_cfg.records >= 0
               ? 0
               : -1;
}

int main(int argc, char **argv)
{
    if (s_args(argc, argv) != 0) {
        fprintf(stderr, "usage: bench_failover [--kvedge BIN] [--kills 1..64] [--masters 2..5] "
                        "[--lease-ms MS] [--records N]\n");
        return 2;
    }
    if (!kt_etcd_installed()) {
        printf("skipped: etcd is not installed\n");
        return 0;
    }
    snprintf(s_dir, sizeof s_dir, "/tmp/kvedge-bench-failover-%d", (int)getpid());
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", s_dir, s_dir);
    if (system(cmd) != 0 || kt_etcd_start(&s_etcd, s_dir, 3) != 0) {
        fprintf(stderr, "bench_failover: etcd did not start (%s)\n", s_dir);
        return 1;
    }
    s_master_t ms[S_MAX_MASTERS];
    memset(ms, 0, sizeof ms);
    int rc = 0;
    for (int i = 0; i < s_cfg.masters && rc == 0; i++) {
        snprintf(ms[i].name, sizeof ms[i].name, "m%d", i + 1);
        snprintf(ms[i].router, sizeof ms[i].router, "tcp://127.0.0.1:%d", kt_free_port());
        snprintf(ms[i].pub, sizeof ms[i].pub, "tcp://127.0.0.1:%d", kt_free_port());
        snprintf(ms[i].data, sizeof ms[i].data, "%.120s/%.15s", s_dir, ms[i].name);
        rc = s_spawn(&ms[i]);
    }
    if (rc == 0 && s_cfg.kills)
        rc = s_failovers(ms);
    if (rc == 0 && s_cfg.chaos)
        rc = s_chaos(ms);
    if (rc == 0 && s_cfg.records)
        rc = s_records(ms);
    for (int i = 0; i < s_cfg.masters; i++)
        s_kill(&ms[i]);
    kt_etcd_stop(&s_etcd);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    if (system(cmd) != 0)
        rc = 1;
    return rc;
}
