/* The edge proxy over a jittery or lossy link to its cloud node, all real processes: a
 * `kvedge store` (cloud, CURVE) in a network namespace "cloud", a `kvedge proxy` in a
 * namespace "edge" whose one source is that node across a veth pair, and this test as the
 * client (over ipc). Every TCP packet arriving in either namespace goes through NFQUEUE to a
 * delayer thread here that holds it 50 ms +- 20 ms, drawn per packet, so packets overtake
 * one another (real reordering, as netem's jitter gives: this kernel has no sch_netem), or
 * drops 5 % of them, or both. Packets are held where they arrive, not where they leave: a
 * packet held on its sender's way out still counts against the sender's socket (TCP small
 * queues), which would throttle the sender as no real link does. Every fetch must complete
 * with every layer fetched from the cloud, its blocks intact, within its deadline, and the
 * proxy must never write the cloud off (no "source cloud1 down" or "suspect" line). Skips
 * (77) where the namespaces, the veth pair or the NFQUEUE rules cannot be made (not root, no
 * iptables). */
#define _GNU_SOURCE /* setns */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <czmq.h>
#include <errno.h>
#include <fcntl.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "access/transport.h"
#include "clients/lib/kvedge.h"
#include "store/engine/engine.h"
#include "access/codec/synth.h"
#include "tests/common/ctx_fx.h"
#include "tests/common/testutil.h"

#define S_MODEL  KT_CTX_MODEL /* built in: 12 layers x 12 heads x 64 */
#define S_HEADS  KT_CTX_HEADS
#define S_LAYERS KT_CTX_LAYERS
#define S_CHUNKS 1
#define S_TOKENS KT_CTX_TOKENS /* per chunk */
#define S_TENANT "jitter"      /* of the proxy's key: the node files the context under it */
/* The link, each way: a packet's delay is uniform in DELAY +- SPREAD (jitter cases), or it
 * is dropped with probability LOSS_PCT % (loss cases). */
#define S_DELAY_US  50000
#define S_SPREAD_US 20000
#define S_LOSS_PCT  5
/* Each fetch's deadline: 10 s, which jitter and loss together take half of on an idle host
 * (slowest 3.2-4.8 s), plus the slack every timed bound of the tests gets on a loaded one. */
#define S_DEADLINE_MS (10000 + KT_SLACK_MS)
#define S_RUN_MS      12000 /* fetches back to back this long, per case */

/* ---------------------------------------------------------------- the link */

/* The two namespaces and the veth pair between them, named and addressed after the pid so
 * runs side by side do not collide. */
enum { S_EDGE, S_CLOUD, S_NS };
static struct {
    char ns[S_NS][32], veth[S_NS][16], addr[S_NS][32];
    bool up[S_NS];
} s_net;

static int s_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int s_sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char quiet[600];
    snprintf(quiet, sizeof quiet, "%s >/dev/null 2>&1", cmd);
    int st = system(quiet);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void s_net_down(void)
{
    for (int i = 0; i < S_NS; i++)
        if (s_net.up[i])
            s_sh("ip netns del %s", s_net.ns[i]); /* takes its end of the veth pair along */
    memset(s_net.up, 0, sizeof s_net.up);
}

/* Both namespaces, the veth pair, and in each an NFQUEUE rule for the TCP packets that
 * arrive (bypassed while no delayer listens). Returns why it could not, or NULL. */
static const char *s_net_up(void)
{
    if (geteuid() != 0)
        return "not root: cannot create network namespaces";
    if (s_sh("command -v ip") != 0 || s_sh("command -v iptables") != 0)
        return "ip or iptables not installed (scripts/setup.sh)";
    unsigned id = (unsigned)getpid() % 16000u, base = 4 * id;
    static const char *const tag[S_NS] = {"e", "c"};
    for (int i = 0; i < S_NS; i++) {
        snprintf(s_net.ns[i], sizeof s_net.ns[i], "kvj%u%s", id, tag[i]);
        snprintf(s_net.veth[i], sizeof s_net.veth[i], "kvj%u%s", id, tag[i]);
        snprintf(s_net.addr[i], sizeof s_net.addr[i], "10.77.%u.%u", base >> 8,
                 (base & 255) + 1 + (unsigned)i);
        s_sh("ip netns del %s", s_net.ns[i]);
        if (s_sh("ip netns add %s", s_net.ns[i]) != 0) {
            s_net_down();
            return "ip netns add failed";
        }
        s_net.up[i] = true;
    }
    if (s_sh("ip link add %s netns %s type veth peer name %s netns %s", s_net.veth[0], s_net.ns[0],
             s_net.veth[1], s_net.ns[1]) != 0) {
        s_net_down();
        return "no veth pair (kernel without veth?)";
    }
    for (int i = 0; i < S_NS; i++)
        if (s_sh("ip -n %s addr add %s/30 dev %s", s_net.ns[i], s_net.addr[i], s_net.veth[i]) ||
            s_sh("ip -n %s link set %s up", s_net.ns[i], s_net.veth[i]) ||
            s_sh("ip -n %s link set lo up", s_net.ns[i]) ||
            s_sh("ip netns exec %s iptables -A INPUT -p tcp -i %s -j NFQUEUE --queue-num 0 "
                 "--queue-bypass",
                 s_net.ns[i], s_net.veth[i])) {
            s_net_down();
            return "addresses or the NFQUEUE rule could not be set (kernel without nfqueue?)";
        }
    return NULL;
}

/* Enters namespace i (this thread only). */
static int s_enter_ns(int i)
{
    char path[96];
    snprintf(path, sizeof path, "/var/run/netns/%s", s_net.ns[i]);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = setns(fd, CLONE_NEWNET);
    close(fd);
    return rc;
}

/* A delayer, one per namespace: holds each packet queued there DELAY +- SPREAD (drawn per
 * packet) and lets it go then, so packets overtake one another (jitter), or drops loss_pct %
 * of them and lets the rest go at once. */
typedef struct {
    uint64_t due_us;
    uint32_t id;
} s_held_t;

typedef struct {
    int ns;
    bool jitter;
    int loss_pct;
    atomic_bool stop;
    bool started, ready, failed;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    unsigned seed;
    s_held_t *heap; /* min-heap on due_us */
    size_t n, cap;
    struct nfq_q_handle *qh;
    uint64_t packets, dropped;
} s_delayer_t;

static uint64_t s_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void s_heap_push(s_delayer_t *d, s_held_t x)
{
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 4096;
        d->heap = realloc(d->heap, d->cap * sizeof *d->heap);
        assert_non_null(d->heap);
    }
    size_t i = d->n++;
    while (i > 0 && d->heap[(i - 1) / 2].due_us > x.due_us) {
        d->heap[i] = d->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    d->heap[i] = x;
}

static s_held_t s_heap_pop(s_delayer_t *d)
{
    s_held_t top = d->heap[0], x = d->heap[--d->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= d->n)
            break;
        if (c + 1 < d->n && d->heap[c + 1].due_us < d->heap[c].due_us)
            c++;
        if (d->heap[c].due_us >= x.due_us)
            break;
        d->heap[i] = d->heap[c];
        i = c;
    }
    if (d->n)
        d->heap[i] = x;
    return top;
}

static int s_on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa,
                       void *arg)
{
    (void)msg;
    s_delayer_t *d = arg;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    if (!ph)
        return 0;
    uint32_t id = ntohl(ph->packet_id);
    d->packets++;
    if (d->loss_pct && (int)(rand_r(&d->seed) % 100) < d->loss_pct) {
        d->dropped++;
        return nfq_set_verdict(qh, id, NF_DROP, 0, NULL);
    }
    if (!d->jitter)
        return nfq_set_verdict(qh, id, NF_ACCEPT, 0, NULL);
    uint64_t delay =
        S_DELAY_US - S_SPREAD_US + (uint64_t)(rand_r(&d->seed) % (2 * S_SPREAD_US + 1));
    s_heap_push(d, (s_held_t){s_now_us() + delay, id});
    return 0;
}

static void *s_delayer_main(void *arg)
{
    s_delayer_t *d = arg;
    struct nfq_handle *h = NULL;
    bool ok = s_enter_ns(d->ns) == 0 && (h = nfq_open()) != NULL;
    if (ok)
        ok = (d->qh = nfq_create_queue(h, 0, s_on_packet, d)) != NULL &&
             nfq_set_mode(d->qh, NFQNL_COPY_META, 0) == 0 &&
             nfq_set_queue_maxlen(d->qh, 1u << 16) == 0;
    int fd = ok ? nfq_fd(h) : -1;
    if (ok) {
        nfnl_rcvbufsiz(nfq_nfnlh(h), 16u << 20);
        int one = 1;
        setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);
    }
    char *buf = malloc(1u << 16); /* one per delayer: both run at once */
    ok = ok && buf;
    pthread_mutex_lock(&d->mu);
    d->ready = true;
    d->failed = !ok;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
    while (ok && !atomic_load(&d->stop)) {
        uint64_t now = s_now_us();
        while (d->n && d->heap[0].due_us <= now)
            nfq_set_verdict(d->qh, s_heap_pop(d).id, NF_ACCEPT, 0, NULL);
        int wait_ms = 10;
        if (d->n) {
            uint64_t left = (d->heap[0].due_us - now + 999) / 1000;
            wait_ms = left < 10 ? (int)left : 10;
        }
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, wait_ms) > 0) {
            ssize_t r;
            while ((r = recv(fd, buf, 1u << 16, MSG_DONTWAIT)) > 0)
                nfq_handle_packet(h, buf, (int)r);
        }
    }
    /* Whatever is held goes now (the rule bypasses once the queue is gone). */
    while (d->n)
        nfq_set_verdict(d->qh, s_heap_pop(d).id, NF_ACCEPT, 0, NULL);
    if (d->qh)
        nfq_destroy_queue(d->qh);
    if (h)
        nfq_close(h);
    free(buf);
    return NULL;
}

static void s_delayer_start(s_delayer_t *d, int ns, bool jitter, int loss_pct)
{
    memset(d, 0, sizeof *d);
    d->ns = ns;
    d->jitter = jitter;
    d->loss_pct = loss_pct;
    d->seed = 12345u + (unsigned)ns;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    assert_int_equal(pthread_create(&d->th, NULL, s_delayer_main, d), 0);
    d->started = true;
    pthread_mutex_lock(&d->mu);
    while (!d->ready)
        pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
    if (d->failed)
        fail_msg("the delayer could not open NFQUEUE 0 in %s", s_net.ns[ns]);
}

static void s_delayer_stop(s_delayer_t *d)
{
    if (!d->started)
        return;
    d->started = false;
    atomic_store(&d->stop, true);
    pthread_join(d->th, NULL);
    free(d->heap);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
}

/* ---------------------------------------------------------------- the context */

static kt_ctx_t s_ctx;

static char s_root[] = "/tmp/kvedge-jitter-XXXXXX";
static char s_node_pub[300], s_proxy_cert[300], s_clients[300];

/* Writes every layer of the context into the store at dir before its node starts, filed
 * under S_TENANT as the node files what a client of that tenant puts (store/node/server.c):
 * the test runs in neither namespace, so it cannot reach the node to put. */
static void s_put_store(const char *dir)
{
    kvedge_engine_opts_t o;
    kvedge_engine_opts_default(&o);
    kvedge_engine_t *e = NULL;
    char why[256];
    if (kvedge_engine_open(dir, &o, &e, why, sizeof why) != KVEDGE_OK)
        fail_msg("store %s: %s", dir, why);
    kvedge_model_t m;
    assert_int_equal(kvedge_model_builtin(S_MODEL, &m), KVEDGE_OK);
    assert_int_equal(kvedge_engine_put_model(e, &m), KVEDGE_OK);
    uint8_t tag[16];
    kvedge_tenant_tag(S_TENANT, tag);
    for (uint32_t l = 0; l < S_LAYERS; l++)
        for (uint32_t ci = 0; ci < S_CHUNKS; ci++)
            for (uint32_t h = 0; h < S_HEADS; h++) {
                kvedge_chunk_info_t info;
                memset(&info, 0, sizeof info);
                memcpy(info.tenant, tag, sizeof tag);
                info.name = s_ctx.ids[ci];
                kvedge_tenant_chunk_id(tag, &s_ctx.ids[ci], &info.id);
                info.has_parent = ci > 0;
                if (ci > 0)
                    kvedge_tenant_chunk_id(tag, &s_ctx.ids[ci - 1], &info.parent);
                snprintf(info.model_id, sizeof info.model_id, S_MODEL);
                info.index = ci;
                info.tokens = S_TOKENS;
                assert_int_equal(kvedge_engine_put(e, &info, (uint16_t)l, (uint16_t)h,
                                                   s_ctx.block[l][ci][h], s_ctx.len[l][ci][h],
                                                   NULL),
                                 KVEDGE_OK);
            }
    kvedge_engine_destroy(&e);
}

/* ---------------------------------------------------------------- processes */

/* Runs `kvedge ARGS` in namespace ns with stdout on a pipe and stderr into log (NULL:
 * inherited) and waits for its "listening EP" line; line receives it. Returns the pid. */
static pid_t s_spawn(char *const argv[], int ns, const char *log, char *line, size_t cap)
{
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], STDOUT_FILENO);
        close(pfd[0]);
        if (log) {
            int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd >= 0)
                dup2(fd, STDERR_FILENO);
        }
        if (s_enter_ns(ns) != 0)
            _exit(126);
        execv(KVEDGE_BIN, argv);
        _exit(127);
    }
    close(pfd[1]);
    ssize_t got = read(pfd[0], line, cap - 1);
    close(pfd[0]);
    line[got > 0 ? got : 0] = '\0';
    if (!strstr(line, "listening")) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        fail_msg("%s did not start: %s", argv[1], line);
    }
    return pid;
}

static void s_stop(pid_t pid)
{
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

/* `kvedge keygen path` in the tenant the context is stored under (the proxy reads it too). */
static void s_keygen(const char *path)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, STDOUT_FILENO);
        execl(KVEDGE_BIN, "kvedge", "keygen", path, "--tenant", S_TENANT, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* Copies a public certificate into the node's allowlist. */
static void s_allow(const char *cert, const char *name)
{
    char to[400], buf[4096];
    snprintf(to, sizeof to, "%s/%s", s_clients, name);
    FILE *a = fopen(cert, "rb"), *b = fopen(to, "wb");
    assert_non_null(a);
    assert_non_null(b);
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0)
        assert_int_equal(fwrite(buf, 1, n, b), n);
    fclose(a);
    fclose(b);
}

/* Whether the file holds the text. */
static bool s_file_has(const char *path, const char *text)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    bool has = false;
    while (f && !has && fgets(line, sizeof line, f))
        has = strstr(line, text) != NULL;
    if (f)
        fclose(f);
    return has;
}

/* Prints the file (a proxy's log, when a case fails). */
static void s_cat(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    print_message("---- %s\n", path);
    while (f && fgets(line, sizeof line, f))
        print_message("%s", line);
    if (f)
        fclose(f);
}

/* ---------------------------------------------------------------- fetching */

/* One fetch of every layer; returns its time in ms. */
static double s_fetch(kvedge_client_t *c, kt_fetch_t *r)
{
    memset(r, 0, sizeof *r);
    r->ctx = &s_ctx;
    kvedge_fetch_req_t req = {.size = sizeof(kvedge_fetch_req_t),
                              .model_id = S_MODEL,
                              .chunks = s_ctx.ids,
                              .n = S_CHUNKS,
                              .layers = S_LAYERS,
                              .tokens = S_CHUNKS * S_TOKENS,
                              .deadline_ms = S_DEADLINE_MS};
    kvedge_fetch_cbs_t cbs = {NULL, kt_fetch_block, kt_fetch_layer, kt_fetch_done};
    int64_t t0 = zclock_usecs();
    kt_fetch_wait(c, &req, &cbs, r);
    return (double)(zclock_usecs() - t0) / 1e3;
}

/* ---------------------------------------------------------------- the cases */

/* The cloud node in the namespace and a proxy over the delayed link, with loss_pct % of
 * packets dropped; fetches back to back for S_RUN_MS. Every one completes with every layer
 * fetched from the cloud and its blocks intact, within its deadline; the proxy never marks
 * the cloud down or suspect. */
/* What a case started, for the teardown of a case that failed half-way. */
static pid_t s_node_pid, s_proxy_pid;
static s_delayer_t s_dl[S_NS];
static bool s_dl_on;

static int s_teardown(void **state)
{
    (void)state;
    if (s_proxy_pid > 0)
        s_stop(s_proxy_pid);
    for (int i = 0; s_dl_on && i < S_NS; i++)
        s_delayer_stop(&s_dl[i]);
    if (s_node_pid > 0)
        s_stop(s_node_pid);
    s_proxy_pid = s_node_pid = 0;
    s_dl_on = false;
    return 0;
}

/* The cloud node and the proxy over the link (jitter, or loss_pct % lost each way); fetches
 * back to back for S_RUN_MS. Every one completes with every layer fetched from the cloud and
 * its blocks intact, within its deadline; the proxy never marks the cloud down or suspect. */
static void s_run(const char *name, bool jitter, int loss_pct)
{
    char data[300], line[400], log[300], bind[64];
    snprintf(data, sizeof data, "%s/cloud-%s", s_root, name);
    s_put_store(data);
    snprintf(bind, sizeof bind, "tcp://%s:*", s_net.addr[S_CLOUD]);
    char *nargv[] = {"kvedge",      "--data", data,        "store",    "--role",    "cloud",
                     "--bind",      bind,     "--cert",    s_node_pub, "--clients", s_clients,
                     "--log-level", "warn",   "--metrics", "off",      NULL};
    s_node_pid = s_spawn(nargv, S_CLOUD, NULL, line, sizeof line);
    char *ep = strstr(line, "tcp://");
    assert_non_null(ep);
    ep[strcspn(ep, " \r\n")] = '\0';

    s_dl_on = true;
    for (int i = 0; i < S_NS; i++)
        s_delayer_start(&s_dl[i], i, jitter, loss_pct);
    char src[700], pep[300];
    snprintf(src, sizeof src, "cloud cloud1 %s key=%s", ep, s_node_pub);
    snprintf(pep, sizeof pep, "ipc://%s/proxy-%s.sock", s_root, name);
    snprintf(log, sizeof log, "%s/proxy-%s.log", s_root, name);
    char *pargv[] = {"kvedge", "proxy",       "--insecure", "--bind", pep,
                     "--cert", s_proxy_cert,  "--source",   src,      "--metrics",
                     "off",    "--log-level", "info",       NULL};
    s_proxy_pid = s_spawn(pargv, S_EDGE, log, line, sizeof line);
    /* The source connects in the background: wait for it (the proxy says so). */
    kt_wait_for(s_file_has(log, "source cloud1 (cloud) connected"), KT_WAIT_MS); /* see log */

    kvedge_client_t *c = kt_client(pep, S_DEADLINE_MS);
    int fetches = 0;
    double worst = 0;
    char bad[300] = "";
    int64_t end = zclock_mono() + S_RUN_MS;
    while (!bad[0] && zclock_mono() < end) {
        kt_fetch_t r;
        double ms = s_fetch(c, &r);
        fetches++;
        worst = ms > worst ? ms : worst;
        if (r.status != 0 || r.layers != S_LAYERS || r.fetched != S_LAYERS || r.mismatches ||
            ms >= S_DEADLINE_MS)
            snprintf(bad, sizeof bad,
                     "fetch %d: %s, %u of %u layers fetched, %u bad blocks, "
                     "%.0f ms",
                     fetches, kvedge_strerror(r.status), r.fetched, S_LAYERS, r.mismatches, ms);
    }
    kvedge_client_destroy(&c);
    s_teardown(NULL); /* the delayers' counters are read once they are stopped */
    print_message(
        "%s: %d fetches, %s, slowest %.0f ms; packets %llu + %llu, "
        "dropped %llu + %llu\n",
        name, fetches, bad[0] ? "failed" : "every layer fetched", worst,
        (unsigned long long)s_dl[S_EDGE].packets, (unsigned long long)s_dl[S_CLOUD].packets,
        (unsigned long long)s_dl[S_EDGE].dropped, (unsigned long long)s_dl[S_CLOUD].dropped);
    bool off = s_file_has(log, "source cloud1 down") || s_file_has(log, "source cloud1 suspect");
    if (bad[0] || off) {
        s_cat(log);
        fail_msg("%s: %s", name, bad[0] ? bad : "the proxy wrote the cloud off");
    }
}

/* 50 +- 20 ms each way, drawn per packet: reordered. */
static void test_jitter(void **state)
{
    (void)state;
    s_run("jitter", true, 0);
}

/* 5 % of packets lost each way. */
static void test_loss(void **state)
{
    (void)state;
    s_run("loss", false, S_LOSS_PCT);
}

/* Both: the jitter, and 5 % of the packets lost each way. */
static void test_jitter_and_loss(void **state)
{
    (void)state;
    s_run("jitter-and-loss", true, S_LOSS_PCT);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const char *why = s_net_up();
    if (why) {
        printf("test_jitter: skipped: %s\n", why);
        return 77;
    }
    if (!mkdtemp(s_root)) {
        s_net_down();
        return 1;
    }
    snprintf(s_clients, sizeof s_clients, "%s/clients", s_root);
    snprintf(s_node_pub, sizeof s_node_pub, "%s/node.cert", s_root);
    snprintf(s_proxy_cert, sizeof s_proxy_cert, "%s/proxy.cert", s_root);
    int rc = mkdir(s_clients, 0700);
    if (rc == 0) {
        s_keygen(s_node_pub);
        s_keygen(s_proxy_cert);
        s_allow(s_proxy_cert, "proxy.cert");
        kt_ctx_make(&s_ctx, S_CHUNKS, 7, 5, true);
        const struct CMUnitTest tests[] = {
            cmocka_unit_test_teardown(test_jitter, s_teardown),
            cmocka_unit_test_teardown(test_loss, s_teardown),
            cmocka_unit_test_teardown(test_jitter_and_loss, s_teardown),
        };
        rc = cmocka_run_group_tests(tests, NULL, NULL);
        kt_ctx_free(&s_ctx);
    }
    s_net_down();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_root);
    if (rc == 0 && system(cmd) != 0)
        rc = 1;
    return rc;
}
