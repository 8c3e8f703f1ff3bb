/* Fetch over the network: GET_LAYER of one layer of one chunk from a store node (a separate
 * process persisting to RocksDB) against Redis GET and MGET of the same bytes and a plain TCP
 * transfer of them, all over loopback in the same run; then the effective (fp16-equivalent)
 * bandwidth of the same layer stored lossless, int8 and int4 against Redis moving the lossless
 * bytes; last, the same fetches from two nodes, one with monitoring off and one with it on and
 * scraped, in alternating rounds. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <hiredis.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "bench/bench_common.h"
#include "bench/bench_scrape.h"
#include "clients/lib/kvedge.h"
#include "access/codec/block.h"
#include "access/codec/chunk.h"
#include "access/codec/error.h"
#include "access/codec/model.h"
#include "access/codec/synth.h"

#define S_HEAD_DIM     128
#define S_LAYERS       4 /* layers 0, 1, 2 hold the same data as lossless, int8, int4 */
#define S_SEED_BASE    1000
#define S_GB           1e9
#define S_MS           1e3
#define S_PATH_MAX     4096
#define S_MAX_CHILDREN 8
/* How long a child may take to start listening, and to stop after SIGTERM (the node drains
 * for up to KVEDGE_SERVER_DRAIN_MS). */
#define S_START_MS 15000
#define S_STOP_MS  7000
#define S_POLL_MS  20
/* Round trips timed for the latency floor, and the TCP peer's reply size for it. */
#define S_FLOOR_ITERS     1000
#define S_FLOOR_TCP_BYTES 8
/* iperf3: one stream for this long; the tool prints JSON. */
#define S_IPERF_SECONDS "3"
#define S_IPERF_OUT_MAX (1 << 20)
/* The project's goals for an edge fetch, against Redis GET of the same layer. */
#define S_GOAL_LOSSLESS 1.0
#define S_GOAL_INT8     1.8
#define S_GOAL_INT4     3.0

#ifndef KVEDGE_BENCH_KVEDGE_BIN
#define KVEDGE_BENCH_KVEDGE_BIN "clients/kvedge"
#endif

enum { S_LOSSLESS, S_INT8, S_INT4, S_SCHEMES };

static const struct {
    kvedge_scheme_t scheme;
    uint16_t group;
    double goal; /* effective bandwidth / Redis GET's */
} S_SCHEME[S_SCHEMES] = {
    {KVEDGE_SCHEME_LOSSLESS, 0, S_GOAL_LOSSLESS},
    {KVEDGE_SCHEME_INT8, 0, S_GOAL_INT8},
    {KVEDGE_SCHEME_INT4, KVEDGE_BLOCK_INT4_GROUP_DEFAULT, S_GOAL_INT4},
};

/* One layer size: heads blocks of tokens x S_HEAD_DIM fp16 K+V each. */
typedef struct {
    const char *label;
    uint16_t heads;
    uint32_t tokens;
    int iters; /* timed fetches of each kind */
} s_size_t;

static const s_size_t S_SIZES[] = {
    {"128 KiB", 1, 256, 200},
    {"1 MiB", 8, 256, 200},
    {"16 MiB", 128, 256, 100},
    {"16 MiB", 8, 4096, 100},
};
#define S_N_SIZES (sizeof S_SIZES / sizeof S_SIZES[0])

/* Timings of one kind of fetch, seconds, one per iteration. */
typedef struct {
    double *t;
    double p50, p99;
} s_lat_t;

/* Everything measured for one size. */
typedef struct {
    const s_size_t *sz;
    uint64_t fp16_bytes;
    uint8_t *enc[S_SCHEMES]; /* the layer's blocks, one after the other, as GET_LAYER lands them */
    size_t enc_len[S_SCHEMES];
    size_t *head_len[S_SCHEMES]; /* encoded bytes of each head */
    kvedge_chunk_id_t chunk;
    char model_id[64];
    s_lat_t kv[S_SCHEMES], get, mget, tcp;
} s_case_t;

/* ---------------------------------------------------------------- children and cleanup */

static pid_t s_children[S_MAX_CHILDREN];
static char s_tmpdir[S_PATH_MAX];

_Noreturn static void s_die(const char *fmt, const char *arg)
{
    fprintf(stderr, "bench_fetch: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    exit(1);
}

static void s_forget(pid_t pid)
{
    for (int i = 0; i < S_MAX_CHILDREN; i++)
        if (s_children[i] == pid)
            s_children[i] = 0;
}

/* Waits for pid up to ms; true when it was reaped (and *status filled, if not NULL). */
static bool s_reap(pid_t pid, int ms, int *status)
{
    for (int waited = 0;; waited += S_POLL_MS) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD)) {
            if (status)
                *status = r == pid ? st : -1;
            s_forget(pid);
            return true;
        }
        if (waited >= ms)
            return false;
        usleep(S_POLL_MS * 1000);
    }
}

/* SIGTERM (a clean shutdown), then SIGKILL for one that lingers. */
static void s_stop(pid_t pid)
{
    bool ours = false;
    for (int i = 0; i < S_MAX_CHILDREN; i++)
        ours = ours || (pid > 0 && s_children[i] == pid);
    if (!ours)
        return; /* never started, or already reaped */
    kill(pid, SIGTERM);
    if (!s_reap(pid, S_STOP_MS, NULL)) {
        kill(pid, SIGKILL);
        s_reap(pid, S_STOP_MS, NULL);
    }
}

static int s_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* atexit: every exit path (errors included) stops the children and removes the temp dir. */
static void s_cleanup(void)
{
    for (int i = 0; i < S_MAX_CHILDREN; i++)
        s_stop(s_children[i]);
    if (s_tmpdir[0]) {
        nftw(s_tmpdir, s_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        s_tmpdir[0] = '\0';
    }
}

/* SIGINT/SIGTERM/SIGHUP: only async-signal-safe calls; rm -rf runs as a child process. */
static void s_on_signal(int sig)
{
    for (int i = 0; i < S_MAX_CHILDREN; i++)
        if (s_children[i] > 0) {
            kill(s_children[i], SIGKILL);
            waitpid(s_children[i], NULL, 0);
        }
    if (s_tmpdir[0]) {
        pid_t p = fork();
        if (p == 0) {
            char *const argv[] = {"rm", "-rf", s_tmpdir, NULL};
            execv("/bin/rm", argv);
            _exit(127);
        }
        if (p > 0)
            waitpid(p, NULL, 0);
    }
    _exit(128 + sig);
}

/* A free entry of s_children (dies when there is none). */
static int s_child_slot(void)
{
    for (int i = 0; i < S_MAX_CHILDREN; i++)
        if (s_children[i] == 0)
            return i;
    s_die("%s", "too many children");
}

/* Starts argv[0] (searched in PATH) as a child that dies with us. Its stdout goes to a pipe
 * (*out_fd, when out_fd is not NULL) or to /dev/null; its stderr stays ours unless quiet. */
static pid_t s_spawn(char *const argv[], int *out_fd, bool quiet)
{
    int fds[2] = {-1, -1};
    if (out_fd && pipe2(fds, O_CLOEXEC) != 0)
        s_die("pipe: %s", strerror(errno));
    int slot = s_child_slot();
    pid_t pid = fork();
    if (pid < 0)
        s_die("fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int null = open("/dev/null", O_RDWR);
        dup2(out_fd ? fds[1] : null, STDOUT_FILENO);
        if (quiet)
            dup2(null, STDERR_FILENO);
        dup2(null, STDIN_FILENO);
        execvp(argv[0], argv);
        _exit(127);
    }
    s_children[slot] = pid;
    if (out_fd) {
        close(fds[1]);
        *out_fd = fds[0];
    }
    return pid;
}

/* Reads a line from fd within ms; false on EOF or timeout. */
static bool s_read_line(int fd, char *line, size_t cap, int ms)
{
    size_t n = 0;
    double until = bench_now_s() + ms / S_MS;
    while (n + 1 < cap) {
        int left = (int)((until - bench_now_s()) * S_MS);
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, left) <= 0)
            return false;
        ssize_t r = read(fd, line + n, 1);
        if (r <= 0)
            return false;
        if (line[n] == '\n')
            break;
        n++;
    }
    line[n] = '\0';
    return true;
}

/* A TCP port on 127.0.0.1 that was free a moment ago (for tools that need a number). */
static int s_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        s_die("cannot find a free port: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

/* ---------------------------------------------------------------- the plain TCP peer */

static void s_write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            _exit(1);
        p += w;
        n -= (size_t)w;
    }
}

/* The child: for each 8-byte length it reads, writes back that many bytes from one buffer. */
static void s_tcp_serve(int lfd)
{
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        _exit(1);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint8_t *buf = NULL;
    size_t cap = 0;
    uint64_t len;
    while (recv(fd, &len, sizeof len, MSG_WAITALL) == (ssize_t)sizeof len) {
        if (len > cap) {
            free(buf);
            buf = malloc(len);
            if (!buf)
                _exit(1);
            memset(buf, 0x5a, len); /* fault the pages in once */
            cap = len;
        }
        s_write_all(fd, buf, len);
    }
    _exit(0);
}

/* Forks the TCP peer (before any thread exists) and returns a connected socket to it. */
static int s_tcp_start(void)
{
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 1) != 0 ||
        getsockname(lfd, (struct sockaddr *)&a, &len) != 0)
        s_die("tcp peer: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0)
        s_die("fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        s_tcp_serve(lfd);
    }
    s_children[0] = pid;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        s_die("tcp peer connect: %s", strerror(errno));
    close(lfd);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* The ZeroMQ peer: a ROUTER in a child that echoes every message, and this process's DEALER to
 * it, each in a libzmq context of its own: the round trip of the transport kvedge is built on,
 * with no kvedge code at either end. */
static void s_zmq_serve(int port)
{
    void *ctx = zmq_ctx_new(), *r = zmq_socket(ctx, ZMQ_ROUTER);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    if (!r || zmq_bind(r, ep) != 0)
        _exit(1);
    zmq_msg_t parts[2];
    for (;;) {
        int n = 0, more = 1;
        while (more && n < 2) {
            zmq_msg_init(&parts[n]);
            if (zmq_msg_recv(&parts[n], r, 0) < 0)
                _exit(0);
            more = zmq_msg_more(&parts[n]);
            n++;
        }
        for (int i = 0; i < n; i++)
            zmq_msg_send(&parts[i], r, i + 1 < n ? ZMQ_SNDMORE : 0);
    }
}

/* Forks the ZeroMQ peer (before any thread exists) and returns a DEALER connected to it. */
static void *s_zmq_start(void **ctx)
{
    int port = s_free_port();
    int slot = s_child_slot();
    pid_t pid = fork();
    if (pid < 0)
        s_die("zmq peer: fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        s_zmq_serve(port);
    }
    s_children[slot] = pid;
    *ctx = zmq_ctx_new();
    void *d = *ctx ? zmq_socket(*ctx, ZMQ_DEALER) : NULL;
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    int linger = 0;
    if (!d || zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger) != 0 || zmq_connect(d, ep) != 0)
        s_die("zmq peer connect: %s", zmq_strerror(zmq_errno()));
    return d;
}

/* One 8-byte echo through the ZeroMQ peer. */
static void s_zmq_echo(void *d)
{
    char b[S_FLOOR_TCP_BYTES] = {0};
    if (zmq_send(d, b, sizeof b, 0) != (int)sizeof b ||
        zmq_recv(d, b, sizeof b, 0) != (int)sizeof b)
        s_die("zmq peer: %s", zmq_strerror(zmq_errno()));
}

/* One request/response of len bytes into dst. */
static void s_tcp_fetch(int fd, uint8_t *dst, size_t len)
{
    uint64_t l = len;
    if (send(fd, &l, sizeof l, 0) != (ssize_t)sizeof l)
        s_die("tcp peer send: %s", strerror(errno));
    size_t got = 0;
    while (got < len) {
        ssize_t r = recv(fd, dst + got, len - got, MSG_WAITALL);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            s_die("tcp peer recv: %s", r == 0 ? "closed" : strerror(errno));
        got += (size_t)r;
    }
}

/* ---------------------------------------------------------------- the store node */

/* Spawns a kvedge daemon (argv[0] the binary) and waits for its "listening EP" line: its pid,
 * EP in ep. */
static pid_t s_spawn_listening(char *const argv[], const char *what, char *ep, size_t cap)
{
    char why[160];
    snprintf(why, sizeof why, "%s (%s) did not start listening", what, argv[0]);
    int fd;
    pid_t pid = s_spawn(argv, &fd, false);
    char line[256];
    if (!s_read_line(fd, line, sizeof line, S_START_MS) || strncmp(line, "listening ", 10) != 0)
        s_die("%s", why);
    close(fd);
    snprintf(ep, cap, "%s", line + 10);
    return pid;
}

/* Starts `kvedge store` on an ephemeral loopback port with --monitor monitor (NULL: the
 * default) and --metrics metrics; returns its pid, its endpoint in ep. */
static pid_t s_node_start_with(const char *bin, const char *data, char *ep, size_t cap,
                               const char *monitor, const char *metrics)
{
    const char *fixed[] = {bin,      "store",     "--insecure", "--bind", "tcp://127.0.0.1:*",
                           "--data", data,        "--role",     "cloud",  "--log-level",
                           "warn",   "--metrics", metrics};
    char *argv[sizeof fixed / sizeof fixed[0] + 3];
    size_t n = 0;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        argv[n++] = (char *)fixed[i];
    char flag[32];
    if (monitor) {
        snprintf(flag, sizeof flag, "--monitor=%s", monitor); /* a bool takes "=" */
        argv[n++] = flag;
    }
    argv[n] = NULL;
    return s_spawn_listening(argv, "the store node", ep, cap);
}

/* The node of the main tables: the default monitoring, no HTTP endpoint. */
static pid_t s_node_start(const char *bin, const char *data, char *ep, size_t cap)
{
    return s_node_start_with(bin, data, ep, cap, NULL, "off");
}

/* Starts `kvedge proxy` on an ephemeral loopback port with the node at node_ep as its one
 * (cloud) source; returns its pid, its endpoint in ep. */
static pid_t s_proxy_start(const char *bin, const char *node_ep, char *ep, size_t cap)
{
    char source[320];
    snprintf(source, sizeof source, "cloud cloud1 %s", node_ep);
    char *const argv[] = {(char *)bin, "proxy", "--insecure", "--bind", "tcp://127.0.0.1:*",
                          "--source",  source,  "--metrics",  "off",    "--log-level",
                          "warn",      NULL};
    return s_spawn_listening(argv, "the proxy", ep, cap);
}

/* A live client when the process exits would abort in czmq's atexit (its actor outlives
 * zsys_shutdown): this one, registered after the first connect, runs before czmq's. */
static kvedge_client_t *s_client;
/* The clients of the monitoring section's two nodes (off, on). */
static kvedge_client_t *s_mon_client[2];

static void s_client_atexit(void)
{
    kvedge_client_destroy(&s_client);
    kvedge_client_destroy(&s_mon_client[0]);
    kvedge_client_destroy(&s_mon_client[1]);
}

/* Connects *out (one of the clients above) to ep. */
static void s_client_open(const char *ep, uint32_t credit, kvedge_client_t **out)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.name = "bench_fetch";
    if (credit)
        o.credit = credit;
    static bool registered;
    KVEDGE_BENCH_CHECK(kvedge_client_connect(&o, out));
    if (!registered)
        atexit(s_client_atexit);
    registered = true;
}

static void s_client_connect(const char *ep, uint32_t credit)
{
    s_client_open(ep, credit, &s_client);
}

/* ---------------------------------------------------------------- Redis */

static redisContext *s_redis_start(void)
{
    char port[16];
    snprintf(port, sizeof port, "%d", s_free_port());
    char *const argv[] = {"redis-server", "--port",      port,      "--bind",
                          "127.0.0.1",    "--save",      "",        "--appendonly",
                          "no",           "--daemonize", "no",      "--dir",
                          s_tmpdir,       "--loglevel",  "warning", NULL};
    pid_t pid = s_spawn(argv, NULL, true);
    for (int waited = 0; waited < S_START_MS; waited += S_POLL_MS) {
        redisContext *c = redisConnect("127.0.0.1", atoi(port));
        if (c && !c->err)
            return c;
        redisFree(c);
        if (s_reap(pid, 0, NULL))
            s_die("%s", "redis-server exited at start (is it installed? scripts/setup.sh)");
        usleep(S_POLL_MS * 1000);
    }
    s_die("%s", "redis-server did not start listening");
    return NULL;
}

static void s_redis_set(redisContext *c, const char *key, const uint8_t *v, size_t len)
{
    redisReply *r = redisCommand(c, "SET %s %b", key, v, len);
    if (!r || r->type != REDIS_REPLY_STATUS)
        s_die("redis SET %s failed", key);
    freeReplyObject(r);
}

/* ---------------------------------------------------------------- iperf3 */

/* One iperf3 stream over loopback; bits/s received, or 0 when iperf3 is not there. */
static double s_iperf(void)
{
    char port[16];
    snprintf(port, sizeof port, "%d", s_free_port());
    char *const srv[] = {"iperf3", "-s", "-1", "-p", port, NULL};
    pid_t spid = s_spawn(srv, NULL, true);
    double bps = 0;
    char *out = bench_alloc(S_IPERF_OUT_MAX);
    for (int attempt = 0; attempt < S_START_MS / 100 && bps == 0; attempt++) {
        if (s_reap(spid, 0, NULL))
            break; /* not installed, or it served (and failed) */
        char *const cli[] = {"iperf3",        "-c", "127.0.0.1", "-p", port, "-t",
                             S_IPERF_SECONDS, "-J", NULL};
        int fd;
        pid_t cpid = s_spawn(cli, &fd, true);
        size_t n = 0;
        ssize_t r;
        while (n + 1 < S_IPERF_OUT_MAX && (r = read(fd, out + n, S_IPERF_OUT_MAX - 1 - n)) > 0)
            n += (size_t)r;
        out[n] = '\0';
        close(fd);
        int st;
        s_reap(cpid, S_STOP_MS, &st);
        const char *p = strstr(out, "\"sum_received\"");
        p = p ? strstr(p, "\"bits_per_second\"") : NULL;
        p = p ? strchr(p, ':') : NULL;
        if (p)
            bps = strtod(p + 1, NULL);
        else
            usleep(100 * 1000); /* the server was not up yet */
    }
    free(out);
    s_stop(spid);
    return bps;
}

/* ---------------------------------------------------------------- the data */

/* Registers the case's model on the node of c and puts every block of its three layers in
 * one call. */
static void s_case_put(const s_case_t *cs, kvedge_client_t *c)
{
    const s_size_t *sz = cs->sz;
    kvedge_model_t model = {.layers = S_LAYERS,
                            .kv_heads = sz->heads,
                            .head_dim = S_HEAD_DIM,
                            .dtype = KVEDGE_DTYPE_FP16};
    snprintf(model.id, sizeof model.id, "%s", cs->model_id);
    KVEDGE_BENCH_CHECK(kvedge_client_put_model(c, &model));

    kvedge_put_item_t *items = bench_alloc((size_t)S_SCHEMES * sz->heads * sizeof *items);
    size_t n = 0;
    for (int s = 0; s < S_SCHEMES; s++) {
        size_t off = 0;
        for (uint16_t h = 0; h < sz->heads; h++) {
            kvedge_put_item_t *it = &items[n++];
            memset(it, 0, sizeof *it);
            it->chunk.id = cs->chunk;
            snprintf(it->chunk.model_id, sizeof it->chunk.model_id, "%s", cs->model_id);
            it->chunk.tokens = sz->tokens;
            it->layer = (uint16_t)s;
            it->head = h;
            it->block = cs->enc[s] + off;
            it->len = cs->head_len[s][h];
            off += it->len;
        }
    }
    KVEDGE_BENCH_CHECK(kvedge_client_put(c, items, n, NULL));
    free(items);
}

/* The same synthetic fp16 layer encoded three ways, put on the node as layers 0, 1, 2 of one
 * chunk, and set in Redis as one value (the lossless blocks back to back) and one per head. */
static void s_case_load(s_case_t *cs, size_t index, kvedge_client_t *c, redisContext *rc)
{
    const s_size_t *sz = cs->sz;
    const size_t half = (size_t)sz->tokens * S_HEAD_DIM * 2;
    cs->fp16_bytes = (uint64_t)sz->heads * 2 * half;
    snprintf(cs->model_id, sizeof cs->model_id, "bench-fetch-h%u-t%u", sz->heads, sz->tokens);
    uint32_t *toks = bench_alloc(sz->tokens * sizeof *toks);
    for (uint32_t i = 0; i < sz->tokens; i++)
        toks[i] = (uint32_t)(index * 100000 + i);
    KVEDGE_BENCH_CHECK(kvedge_chunk_id(NULL, 0, cs->model_id, NULL, toks, sz->tokens, &cs->chunk));
    free(toks);

    uint8_t *k = bench_alloc(half), *v = bench_alloc(half);
    for (int s = 0; s < S_SCHEMES; s++) {
        kvedge_block_spec_t spec = {.dtype = KVEDGE_DTYPE_FP16,
                                    .scheme = S_SCHEME[s].scheme,
                                    .tokens = sz->tokens,
                                    .head_dim = S_HEAD_DIM,
                                    .group_size = S_SCHEME[s].group};
        size_t bound = kvedge_block_encoded_bound(&spec);
        cs->enc[s] = bench_alloc(bound * sz->heads);
        cs->head_len[s] = bench_alloc(sz->heads * sizeof(size_t));
        cs->enc_len[s] = 0;
    }
    for (uint16_t h = 0; h < sz->heads; h++) {
        KVEDGE_BENCH_CHECK(
            kvedge_synth_head(S_SEED_BASE + h, 0, sz->tokens, S_HEAD_DIM, KVEDGE_DTYPE_FP16, k, v));
        for (int s = 0; s < S_SCHEMES; s++) {
            kvedge_block_spec_t spec = {.dtype = KVEDGE_DTYPE_FP16,
                                        .scheme = S_SCHEME[s].scheme,
                                        .tokens = sz->tokens,
                                        .head_dim = S_HEAD_DIM,
                                        .group_size = S_SCHEME[s].group};
            size_t bound = kvedge_block_encoded_bound(&spec), len;
            KVEDGE_BENCH_CHECK(
                kvedge_block_encode(&spec, k, v, cs->enc[s] + cs->enc_len[s], bound, &len));
            cs->head_len[s][h] = len;
            cs->enc_len[s] += len;
        }
    }
    free(k);
    free(v);

    s_case_put(cs, c);

    char key[64];
    snprintf(key, sizeof key, "layer:%zu", index);
    s_redis_set(rc, key, cs->enc[S_LOSSLESS], cs->enc_len[S_LOSSLESS]);
    size_t off = 0;
    for (uint16_t h = 0; h < sz->heads; h++) {
        snprintf(key, sizeof key, "head:%zu:%u", index, h);
        s_redis_set(rc, key, cs->enc[S_LOSSLESS] + off, cs->head_len[S_LOSSLESS][h]);
        off += cs->head_len[S_LOSSLESS][h];
    }
}

/* ---------------------------------------------------------------- the fetches */

typedef struct {
    kvedge_client_t *kv;
    redisContext *rc;
    int tcp;
    void *zmq_ctx, *zmq; /* the ZeroMQ echo peer's context and DEALER */
    uint8_t *buf;        /* the caller's buffer every fetch lands in */
    size_t cap;
    kvedge_fetched_t *out;
    char **mget_argv; /* "MGET" and the per-head keys */
    size_t *mget_len;
} s_ctx_t;

static double s_fetch_kvedge(s_ctx_t *x, s_case_t *cs, int s, bool check)
{
    uint32_t heads = 0;
    double t0 = bench_now_s();
    int rc = kvedge_client_get_layer(x->kv, &cs->chunk, 1, (uint16_t)s, x->buf, x->cap, x->out,
                                     cs->sz->heads, &heads);
    double t = bench_now_s() - t0;
    KVEDGE_BENCH_CHECK(rc);
    if (heads != cs->sz->heads)
        s_die("GET_LAYER streamed %s heads", "the wrong number of");
    if (check) {
        size_t at = 0;
        for (uint16_t h = 0; h < heads; h++) {
            if (x->out[h].status != 0 || x->out[h].offset != at ||
                x->out[h].len != cs->head_len[s][h])
                s_die("GET_LAYER head %s", "misplaced or missing");
            at += x->out[h].len;
        }
        if (at != cs->enc_len[s] || memcmp(x->buf, cs->enc[s], at) != 0)
            s_die("GET_LAYER returned %s", "other bytes than were put");
    }
    return t;
}

static double s_fetch_get(s_ctx_t *x, s_case_t *cs, size_t index, bool check)
{
    char key[64];
    snprintf(key, sizeof key, "layer:%zu", index);
    double t0 = bench_now_s();
    redisReply *r = redisCommand(x->rc, "GET %s", key);
    if (!r || r->type != REDIS_REPLY_STRING || (size_t)r->len != cs->enc_len[S_LOSSLESS])
        s_die("redis GET %s failed", key);
    if (check && memcmp(r->str, cs->enc[S_LOSSLESS], (size_t)r->len) != 0)
        s_die("redis GET %s returned other bytes", key);
    freeReplyObject(r);
    return bench_now_s() - t0;
}

static double s_fetch_mget(s_ctx_t *x, s_case_t *cs, size_t index, bool check)
{
    const uint16_t heads = cs->sz->heads;
    for (uint16_t h = 0; h < heads; h++) {
        snprintf(x->mget_argv[h + 1], 64, "head:%zu:%u", index, h);
        x->mget_len[h + 1] = strlen(x->mget_argv[h + 1]);
    }
    double t0 = bench_now_s();
    redisReply *r = redisCommandArgv(x->rc, heads + 1, (const char **)x->mget_argv, x->mget_len);
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != heads)
        s_die("redis MGET of %s failed", cs->sz->label);
    size_t off = 0;
    for (uint16_t h = 0; h < heads; h++) {
        const redisReply *e = r->element[h];
        if (e->type != REDIS_REPLY_STRING || (size_t)e->len != cs->head_len[S_LOSSLESS][h] ||
            (check && memcmp(e->str, cs->enc[S_LOSSLESS] + off, (size_t)e->len) != 0))
            s_die("redis MGET of %s returned other bytes", cs->sz->label);
        off += (size_t)e->len;
    }
    freeReplyObject(r);
    return bench_now_s() - t0;
}

static double s_fetch_tcp(s_ctx_t *x, s_case_t *cs)
{
    double t0 = bench_now_s();
    s_tcp_fetch(x->tcp, x->buf, cs->enc_len[S_LOSSLESS]);
    return bench_now_s() - t0;
}

static void s_lat_init(s_lat_t *l, int n)
{
    l->t = bench_alloc((size_t)n * sizeof(double));
}

static void s_lat_done(s_lat_t *l, int n)
{
    l->p50 = bench_median(l->t, (size_t)n);
    l->p99 = bench_quantile(l->t, (size_t)n, 0.99);
    free(l->t);
    l->t = NULL;
}

/* One untimed checked pass of every fetch, then iters timed passes, the kinds interleaved so
 * that noise hits them alike. */
static void s_case_run(s_ctx_t *x, s_case_t *cs, size_t index)
{
    const int n = cs->sz->iters;
    for (int s = 0; s < S_SCHEMES; s++) {
        s_fetch_kvedge(x, cs, s, true);
        s_lat_init(&cs->kv[s], n);
    }
    s_fetch_get(x, cs, index, true);
    s_fetch_mget(x, cs, index, true);
    s_fetch_tcp(x, cs);
    s_lat_init(&cs->get, n);
    s_lat_init(&cs->mget, n);
    s_lat_init(&cs->tcp, n);
    for (int i = 0; i < n; i++) {
        for (int s = 0; s < S_SCHEMES; s++)
            cs->kv[s].t[i] = s_fetch_kvedge(x, cs, s, false);
        cs->get.t[i] = s_fetch_get(x, cs, index, false);
        cs->mget.t[i] = s_fetch_mget(x, cs, index, false);
        cs->tcp.t[i] = s_fetch_tcp(x, cs);
    }
    for (int s = 0; s < S_SCHEMES; s++)
        s_lat_done(&cs->kv[s], n);
    s_lat_done(&cs->get, n);
    s_lat_done(&cs->mget, n);
    s_lat_done(&cs->tcp, n);
}

/* What one request costs this process (every thread of it: caller, client I/O thread,
 * libzmq's I/O thread), from getrusage over a loop of one kind of request alone:
 * context switches and CPU microseconds. [0] kvedge PING, [1] Redis PING, [2] the ZeroMQ
 * echo peer. */
static struct {
    double csw, cpu_us, p50_ms;
} s_floor_cost[3];

static double s_rusage(struct rusage *ru)
{
    getrusage(RUSAGE_SELF, ru);
    return (double)(ru->ru_utime.tv_sec + ru->ru_stime.tv_sec) * 1e6 +
           (double)(ru->ru_utime.tv_usec + ru->ru_stime.tv_usec);
}

static void s_floor_cost_run(s_ctx_t *x)
{
    for (int k = 0; k < 3; k++) {
        s_lat_t lat;
        s_lat_init(&lat, S_FLOOR_ITERS);
        struct rusage a, b;
        double ua = s_rusage(&a);
        for (int i = 0; i < S_FLOOR_ITERS; i++) {
            double t0 = bench_now_s();
            if (k == 0) {
                KVEDGE_BENCH_CHECK(kvedge_client_ping(x->kv, 0, NULL, NULL));
            } else if (k == 2) {
                s_zmq_echo(x->zmq);
            } else {
                redisReply *r = redisCommand(x->rc, "PING");
                if (!r || r->type != REDIS_REPLY_STATUS)
                    s_die("%s", "redis PING failed");
                freeReplyObject(r);
            }
            lat.t[i] = bench_now_s() - t0;
        }
        double ub = s_rusage(&b);
        s_lat_done(&lat, S_FLOOR_ITERS);
        s_floor_cost[k].p50_ms = lat.p50 * S_MS;
        s_floor_cost[k].csw =
            (double)(b.ru_nvcsw + b.ru_nivcsw - a.ru_nvcsw - a.ru_nivcsw) / S_FLOOR_ITERS;
        s_floor_cost[k].cpu_us = (ub - ua) / S_FLOOR_ITERS;
    }
}

/* The round-trip floor, no payload to speak of: kvedge PING (answered by the node's frontend,
 * no worker, no engine), Redis PING, an 8-byte TCP request/response and an 8-byte ZeroMQ
 * DEALER/ROUTER echo. */
static void s_floor_run(s_ctx_t *x, s_lat_t *ping, s_lat_t *rping, s_lat_t *tcp, s_lat_t *zmq)
{
    s_lat_init(ping, S_FLOOR_ITERS);
    s_lat_init(rping, S_FLOOR_ITERS);
    s_lat_init(tcp, S_FLOOR_ITERS);
    s_lat_init(zmq, S_FLOOR_ITERS);
    for (int i = -1; i < S_FLOOR_ITERS; i++) { /* i = -1: warm-up */
        double t0 = bench_now_s();
        KVEDGE_BENCH_CHECK(kvedge_client_ping(x->kv, 0, NULL, NULL));
        double t1 = bench_now_s();
        redisReply *r = redisCommand(x->rc, "PING");
        if (!r || r->type != REDIS_REPLY_STATUS)
            s_die("%s", "redis PING failed");
        freeReplyObject(r);
        double t2 = bench_now_s();
        s_tcp_fetch(x->tcp, x->buf, S_FLOOR_TCP_BYTES);
        double t3 = bench_now_s();
        s_zmq_echo(x->zmq);
        double t4 = bench_now_s();
        if (i >= 0) {
            ping->t[i] = t1 - t0;
            rping->t[i] = t2 - t1;
            tcp->t[i] = t3 - t2;
            zmq->t[i] = t4 - t3;
        }
    }
    s_lat_done(ping, S_FLOOR_ITERS);
    s_lat_done(rping, S_FLOOR_ITERS);
    s_lat_done(tcp, S_FLOOR_ITERS);
    s_lat_done(zmq, S_FLOOR_ITERS);
    s_floor_cost_run(x);
}

/* ---------------------------------------------------------------- report */

static double s_gbps(double bytes, double secs)
{
    return bytes / S_GB / secs;
}

static void s_print(const s_case_t *cases, const s_lat_t floor[4], double iperf_bps, int ncpu,
                    uint32_t credit, bool restarted)
{
    printf("### Fetch over loopback: one layer of one chunk, GET_LAYER against Redis and TCP\n\n");
    printf("All on 127.0.0.1 on this %d-core machine: the store node (`kvedge store`, RocksDB on "
           "disk, WAL on; blocks read %s), redis-server (persistence off), the TCP peer and this "
           "client share the cores. Each fetch lands in one caller buffer; a warm-up pass of each "
           "precedes the timed ones, which interleave. GB = 10^9 bytes; GB/s = bytes / p50.\n\n",
           ncpu,
           restarted ? "from blob files through the engine's cache, node restarted after the puts"
                     : "from the memtable, as put (--no-restart)");
    if (iperf_bps > 0)
        printf("iperf3, one stream for %s s: %.2f GB/s received.\n\n", S_IPERF_SECONDS,
               iperf_bps / 8 / S_GB);
    else
        printf("iperf3: not available.\n\n");
    printf("Round-trip floor (p50 / p99 ms of %d): kvedge PING %.3f / %.3f, Redis PING %.3f / "
           "%.3f, TCP %d-byte request/response %.3f / %.3f. GET_LAYER credit: %u.\n\n",
           S_FLOOR_ITERS, floor[0].p50 * S_MS, floor[0].p99 * S_MS, floor[1].p50 * S_MS,
           floor[1].p99 * S_MS, S_FLOOR_TCP_BYTES, floor[2].p50 * S_MS, floor[2].p99 * S_MS,
           credit);
    printf("The same PINGs, %d of each kind alone (not interleaved): kvedge p50 %.3f ms, Redis "
           "p50 %.3f ms; per request in this process (all its threads, getrusage) kvedge %.2f "
           "context switches and %.1f us CPU, Redis %.2f and %.1f us.\n\n",
           S_FLOOR_ITERS, s_floor_cost[0].p50_ms, s_floor_cost[1].p50_ms, s_floor_cost[0].csw,
           s_floor_cost[0].cpu_us, s_floor_cost[1].csw, s_floor_cost[1].cpu_us);
    printf("The transport's own floor: a ZeroMQ DEALER/ROUTER echo of %d bytes (libzmq at both "
           "ends, a child process echoing, no kvedge code), interleaved p50 / p99 %.3f / %.3f ms, "
           "alone p50 %.3f ms, %.2f context switches and %.1f us CPU per request in this process. "
           "Alone: kvedge PING / Redis PING %.2f (goal <= 2), ZeroMQ echo / Redis PING %.2f, "
           "kvedge PING / ZeroMQ echo %.2f.\n\n",
           S_FLOOR_TCP_BYTES, floor[3].p50 * S_MS, floor[3].p99 * S_MS, s_floor_cost[2].p50_ms,
           s_floor_cost[2].csw, s_floor_cost[2].cpu_us,
           s_floor_cost[0].p50_ms / s_floor_cost[1].p50_ms,
           s_floor_cost[2].p50_ms / s_floor_cost[1].p50_ms,
           s_floor_cost[0].p50_ms / s_floor_cost[2].p50_ms);

    printf("| layer | heads x tokens | bytes | fetches | kvedge p50 / p99 ms | kvedge GB/s | "
           "Redis GET p50 / p99 ms | GET GB/s | kvedge/GET | Redis MGET p50 / p99 ms | MGET GB/s "
           "| kvedge/MGET | TCP p50 ms | TCP GB/s | kvedge/TCP | lossless >= %.1fx Redis GET |\n",
           S_GOAL_LOSSLESS);
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (size_t i = 0; i < S_N_SIZES; i++) {
        const s_case_t *c = &cases[i];
        double bytes = (double)c->enc_len[S_LOSSLESS];
        double kv = s_gbps(bytes, c->kv[S_LOSSLESS].p50), get = s_gbps(bytes, c->get.p50);
        double mget = s_gbps(bytes, c->mget.p50), tcp = s_gbps(bytes, c->tcp.p50);
        printf("| %s | %u x %u | %zu | %d | %.3f / %.3f | %.2f | %.3f / %.3f | %.2f | %.2f | "
               "%.3f / %.3f | %.2f | %.2f | %.3f | %.2f | %.2f | %s |\n",
               c->sz->label, c->sz->heads, c->sz->tokens, c->enc_len[S_LOSSLESS], c->sz->iters,
               c->kv[S_LOSSLESS].p50 * S_MS, c->kv[S_LOSSLESS].p99 * S_MS, kv, c->get.p50 * S_MS,
               c->get.p99 * S_MS, get, kv / get, c->mget.p50 * S_MS, c->mget.p99 * S_MS, mget,
               kv / mget, c->tcp.p50 * S_MS, tcp, kv / tcp,
               kv / get >= S_GOAL_LOSSLESS ? "met" : "missed");
    }
    printf("\nbytes = the layer's lossless blocks (fp16 K+V + 40 header/checksum bytes per head), "
           "the same bytes in Redis (one value for GET, one per head for MGET) and over TCP.\n\n");

    printf("#### Effective bandwidth: fp16 bytes of the layer / p50 fetch\n\n");
    printf("| layer (fp16) | heads x tokens | scheme | bytes moved | fp16/moved | p50 / p99 ms | "
           "effective GB/s | Redis GET effective GB/s | vs Redis GET | goal |\n");
    printf("|---|---|---|---:|---:|---:|---:|---:|---:|---|\n");
    for (size_t i = 0; i < S_N_SIZES; i++) {
        const s_case_t *c = &cases[i];
        double fp16 = (double)c->fp16_bytes, redis = s_gbps(fp16, c->get.p50);
        for (int s = 0; s < S_SCHEMES; s++) {
            double eff = s_gbps(fp16, c->kv[s].p50);
            printf("| %s | %u x %u | %s | %zu | %.2f | %.3f / %.3f | %.2f | %.2f | %.2f | "
                   ">= %.1fx: %s |\n",
                   c->sz->label, c->sz->heads, c->sz->tokens,
                   kvedge_scheme_name(S_SCHEME[s].scheme), c->enc_len[s],
                   fp16 / (double)c->enc_len[s], c->kv[s].p50 * S_MS, c->kv[s].p99 * S_MS, eff,
                   redis, eff / redis, S_SCHEME[s].goal,
                   eff / redis >= S_SCHEME[s].goal ? "met" : "missed");
        }
    }
    printf("\nint8: group 0 (per channel / per token); int4: group %u; lz4 off. Redis moves the "
           "lossless layer every time (fp16/moved = 1.00 for it).\n",
           KVEDGE_BLOCK_INT4_GROUP_DEFAULT);
}

/* ---------------------------------------------------------------- monitoring on vs off */

#define S_MON_ROUNDS_DEFAULT 60
/* The goal: monitoring on costs at most this fraction of p50 and of throughput. */
#define S_MON_GOAL 0.02
/* A family only the I/O Analyzer declares: a scrape holding it shows the node records. */
#define S_MON_FAMILY "kvedge_node_requests_total"

enum { S_OFF, S_ON, S_MODES };

/* Fetches per node per round for each of S_SIZES: about 0.2 s per node per round. */
static const int S_MON_FETCHES[S_N_SIZES] = {60, 40, 10, 10};

/* What the section measured for one size. */
typedef struct {
    double *t[S_MODES];    /* every timed fetch, round after round */
    double *p50[S_MODES];  /* each round's p50 */
    double *gbps[S_MODES]; /* each round's bytes / summed fetch time, GB/s */
    double *ratio_p50;     /* each round's p50 on / off */
    double *ratio_gbps;    /* each round's GB/s on / off */
} s_mon_t;

/* Starts the off (--monitor=no --metrics off) or the on (--monitor=yes, metrics on port)
 * node on data; returns its pid. */
static pid_t s_mon_node(const char *bin, const char *data, int mode, int port, char *ep, size_t cap)
{
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    return mode == S_ON ? s_node_start_with(bin, data, ep, cap, "yes", addr)
                        : s_node_start_with(bin, data, ep, cap, "no", "off");
}

/* Median, 25th/75th percentiles and range of v[0..n). */
static void s_spread(const double *v, int n, double out[5])
{
    double *c = bench_alloc((size_t)n * sizeof *c);
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, bench_cmp_double);
    out[0] = bench_median(c, (size_t)n);
    out[1] = bench_quantile(c, (size_t)n, 0.25);
    out[2] = bench_quantile(c, (size_t)n, 0.75);
    out[3] = c[0];
    out[4] = c[n - 1];
    free(c);
}

/* Monitoring on vs off: two fresh nodes with the same blocks (every size's three layers),
 * the lossless layer fetched from each in turn, one fetch at a time, who goes first swapped
 * every pair, so that drift and bursts of other work fall on both alike. */
/* (Re)starts the section's nodes for one phase: the node on data[j] runs mode (phase + j) % 2
 * (always off for an A/A check), so that phase 1 swaps the modes between the two data
 * directories and processes; *port: the on node's metrics port. Connects s_mon_client[m]. */
static void s_mon_start(const char *bin, char data[S_MODES][S_PATH_MAX + 16], int phase, bool aa,
                        uint32_t credit, pid_t pid[S_MODES], int *port)
{
    char ep[256];
    *port = s_free_port();
    for (int j = 0; j < S_MODES; j++) {
        int m = (phase + j) % S_MODES;
        pid[m] = s_mon_node(bin, data[j], aa ? S_OFF : m, *port, ep, sizeof ep);
        s_client_open(ep, credit, &s_mon_client[m]);
    }
}

static void s_mon_stop(pid_t pid[S_MODES])
{
    for (int m = 0; m < S_MODES; m++) {
        kvedge_client_destroy(&s_mon_client[m]);
        s_stop(pid[m]);
    }
}

static void s_mon_section(const char *bin, s_ctx_t *x, s_case_t *cases, bool restart,
                          uint32_t credit, int rounds, bool aa)
{
    char data[S_MODES][S_PATH_MAX + 16];
    pid_t pid[S_MODES];
    bench_scraper_t sc;
    memset(&sc, 0, sizeof sc);
    for (int j = 0; j < S_MODES; j++)
        snprintf(data[j], sizeof data[j], "%s/mon-%d", s_tmpdir, j);
    s_mon_start(bin, data, 0, aa, credit, pid, &sc.port);
    for (int m = 0; m < S_MODES; m++)
        for (size_t i = 0; i < S_N_SIZES; i++)
            s_case_put(&cases[i], s_mon_client[m]);

    s_mon_t mon[S_N_SIZES];
    for (size_t i = 0; i < S_N_SIZES; i++) {
        for (int m = 0; m < S_MODES; m++) {
            mon[i].t[m] = bench_alloc((size_t)rounds * S_MON_FETCHES[i] * sizeof(double));
            mon[i].p50[m] = bench_alloc((size_t)rounds * sizeof(double));
            mon[i].gbps[m] = bench_alloc((size_t)rounds * sizeof(double));
        }
        mon[i].ratio_p50 = bench_alloc((size_t)rounds * sizeof(double));
        mon[i].ratio_gbps = bench_alloc((size_t)rounds * sizeof(double));
    }
    /* Without a restart the blocks stay in the memtable: one phase, no swap. */
    const int phases = restart ? 2 : 1;
    double t_timed = 0;
    for (int phase = 0, r = 0; phase < phases; phase++) {
        if (restart) {
            s_mon_stop(pid); /* phase 0: flushes the puts; phase 1: swaps the modes */
            s_mon_start(bin, data, phase, aa, credit, pid, &sc.port);
        }
        s_ctx_t y[S_MODES];
        for (int m = 0; m < S_MODES; m++) {
            y[m] = *x;
            y[m].kv = s_mon_client[m];
            for (size_t i = 0; i < S_N_SIZES; i++)
                s_fetch_kvedge(&y[m], &cases[i], S_LOSSLESS, true);
        }
        if (!aa)
            bench_scraper_start(&sc, S_MON_FAMILY);
        double t_start = bench_now_s();
        for (int end = phase + 1 < phases ? (rounds + 1) / 2 : rounds; r < end; r++)
            for (size_t i = 0; i < S_N_SIZES; i++) {
                const int n = S_MON_FETCHES[i];
                double *t[S_MODES], sum[S_MODES] = {0, 0};
                for (int m = 0; m < S_MODES; m++)
                    t[m] = mon[i].t[m] + (size_t)r * n;
                for (int f = 0; f < n; f++)
                    for (int j = 0; j < S_MODES; j++) {
                        int m = (r + f + j) % S_MODES; /* off, on, on, off: neither always first */
                        t[m][f] = s_fetch_kvedge(&y[m], &cases[i], S_LOSSLESS, false);
                        sum[m] += t[m][f];
                    }
                for (int m = 0; m < S_MODES; m++) {
                    mon[i].p50[m][r] = bench_median(t[m], (size_t)n);
                    mon[i].gbps[m][r] = s_gbps((double)cases[i].enc_len[S_LOSSLESS] * n, sum[m]);
                }
                mon[i].ratio_p50[r] = mon[i].p50[S_ON][r] / mon[i].p50[S_OFF][r];
                mon[i].ratio_gbps[r] = mon[i].gbps[S_ON][r] / mon[i].gbps[S_OFF][r];
            }
        t_timed += bench_now_s() - t_start;
        bench_scraper_stop(&sc);
    }
    s_mon_stop(pid);

    if (aa)
        printf("\n### A/A check (--mon-aa): both nodes off; \"on\" below is a second off "
               "node, not scraped: the method's own spread\n");
    printf("\n### Monitoring on vs off: GET_LAYER from two store nodes\n\n");
    printf("Two fresh `kvedge store` nodes with the same blocks (the three layers of every size "
           "above, put into each%s): **off** = `--monitor=no --metrics off`, **on** = `--monitor="
           "yes --metrics 127.0.0.1:PORT`, with a thread here GETting /metrics from it every %d "
           "ms over a fresh TCP connection, as Prometheus would (%d scrapes of %zu bytes, %.2f ms "
           "each, %d failed). %d rounds (%.1f s); in each, per size, N fetches of the lossless "
           "layer from each node, alternating one by one (off, on, on, off, ...). %s p50 / p99: "
           "over "
           "all of the node's fetches; GB/s: all bytes / the summed fetch time. on/off: first the "
           "ratio of those, then the per-round ratios (each round's p50, each round's bytes / "
           "time): median [p25 - p75] (min - max).\n\n",
           restart ? ", nodes restarted after the puts" : "", BENCH_SCRAPE_MS, sc.scrapes, sc.bytes,
           sc.scrapes ? sc.secs / sc.scrapes * S_MS : 0.0, sc.failures, rounds, t_timed,
           restart ? "Half the rounds, then both nodes restarted with the modes swapped between "
                     "the two data directories (and start order), then the other half."
                   : "One pair of nodes, never restarted (--no-restart).");
    printf("| layer | heads x tokens | rounds x N | off p50 / p99 ms | on p50 / p99 ms | p50 "
           "on/off: all; per round | off GB/s | on GB/s | GB/s on/off: all; per round | cost <= "
           "%.0f %% (per-round medians: p50, GB/s) |\n",
           S_MON_GOAL * 100);
    printf("|---|---|---:|---:|---:|---|---:|---:|---|---|\n");
    for (size_t i = 0; i < S_N_SIZES; i++) {
        const int n = S_MON_FETCHES[i], all = rounds * n;
        double p99[S_MODES], p50[S_MODES], gbps[S_MODES], rp[5], rg[5];
        for (int m = 0; m < S_MODES; m++) {
            double sum = 0;
            for (int k = 0; k < all; k++)
                sum += mon[i].t[m][k];
            p50[m] = bench_median(mon[i].t[m], (size_t)all);
            p99[m] = bench_quantile(mon[i].t[m], (size_t)all, 0.99);
            gbps[m] = s_gbps((double)cases[i].enc_len[S_LOSSLESS] * all, sum);
        }
        s_spread(mon[i].ratio_p50, rounds, rp);
        s_spread(mon[i].ratio_gbps, rounds, rg);
        printf("| %s | %u x %u | %d x %d | %.3f / %.3f | %.3f / %.3f | %.3f; %.3f [%.3f - %.3f] "
               "(%.3f - %.3f) | %.2f | %.2f | %.3f; %.3f [%.3f - %.3f] (%.3f - %.3f) | %s, %s |\n",
               cases[i].sz->label, cases[i].sz->heads, cases[i].sz->tokens, rounds, n,
               p50[S_OFF] * S_MS, p99[S_OFF] * S_MS, p50[S_ON] * S_MS, p99[S_ON] * S_MS,
               p50[S_ON] / p50[S_OFF], rp[0], rp[1], rp[2], rp[3], rp[4], gbps[S_OFF], gbps[S_ON],
               gbps[S_ON] / gbps[S_OFF], rg[0], rg[1], rg[2], rg[3], rg[4],
               rp[0] <= 1 + S_MON_GOAL ? "met" : "missed",
               rg[0] >= 1 - S_MON_GOAL ? "met" : "missed");
        for (int m = 0; m < S_MODES; m++) {
            free(mon[i].t[m]);
            free(mon[i].p50[m]);
            free(mon[i].gbps[m]);
        }
        free(mon[i].ratio_p50);
        free(mon[i].ratio_gbps);
    }
    printf("\nGoal read on the medians of the ratios: p50 on/off <= %.2f and GB/s on/off >= "
           "%.2f. Where [p25 - p75] is wider than that, the run's noise is larger than the "
           "cost it is meant to show.\n",
           1 + S_MON_GOAL, 1 - S_MON_GOAL);
}

/* ---------------------------------------------------------------- GQA shapes (--gqa) */

/* Small blocks at grouped-query shapes: one layer of a context of chunks x tokens, fetched with
 * GET_LAYER packed (the default: several heads per data message) and unpacked (one head per
 * message, opts.no_pack), against a Redis GET of the same bytes as one value, interleaved in
 * the same run; beside them the round-trip floor (kvedge PING, Redis PING). */
typedef struct {
    const char *model; /* the shape's name */
    uint16_t heads;    /* KV heads */
    uint16_t layers;   /* the model's layers (the layer fetched is 0) */
    uint32_t chunks;   /* chunks of the context */
    uint32_t tokens;   /* tokens per chunk */
    const char *label; /* the layer's fp16 size */
    int iters;
    bool fetch; /* also FETCH through a proxy (every layer put: the proxy's LOOKUP) */
} s_gqa_t;

#define S_GQA_DIM 64
static const s_gqa_t S_GQA[] = {
    /* clang-format off */
    {"llama-3.2-1b", 8, 16, 1, 64, "128 KiB", 300, true},
    {"llama-3.2-1b", 8, 16, 4, 16, "128 KiB", 300, true},
    {"llama-3.2-1b", 8, 16, 2, 256, "1 MiB", 200, true},
    {"llama-3.2-1b", 8, 16, 4, 128, "1 MiB", 200, true},
    {"llama-3.2-1b", 8, 16, 32, 256, "16 MiB", 30, false},
    {"qwen2.5-0.5b", 2, 24, 1, 256, "128 KiB", 300, true},
    {"qwen2.5-0.5b", 2, 24, 8, 256, "1 MiB", 200, true},
    {"qwen2.5-0.5b", 2, 24, 128, 256, "16 MiB", 30, false},
    /* clang-format on */
};
#define S_N_GQA (sizeof S_GQA / sizeof S_GQA[0])
enum {
    S_GQA_PACKED,
    S_GQA_UNPACKED,
    S_GQA_GET,
    S_GQA_PING,
    S_GQA_RPING,
    S_GQA_FPACKED,   /* FETCH through the proxy, packed BLOCK messages */
    S_GQA_FUNPACKED, /* FETCH, one block per message */
    S_GQA_KINDS
};

typedef struct {
    const s_gqa_t *g;
    char model_id[64];
    kvedge_chunk_id_t *ids;
    uint8_t *enc; /* the layer's lossless blocks in (chunk, head) order */
    size_t enc_len;
    s_lat_t lat[S_GQA_KINDS];
} s_gqa_case_t;

/* Encodes layer 0 of the case's context, puts it (model registered first) and sets it in
 * Redis as one value. */
static void s_gqa_load(s_gqa_case_t *gc, size_t index, kvedge_client_t *c, redisContext *rc)
{
    const s_gqa_t *g = gc->g;
    /* The built-in shape (proxies know it without a master); the contexts differ by tokens. */
    snprintf(gc->model_id, sizeof gc->model_id, "%s", g->model);
    size_t ntok = (size_t)g->chunks * g->tokens;
    uint32_t *toks = bench_alloc(ntok * sizeof *toks);
    for (size_t i = 0; i < ntok; i++)
        toks[i] = (uint32_t)(index * 1000003 + i);
    gc->ids = bench_alloc(g->chunks * sizeof *gc->ids);
    if (kvedge_chunk_chain(NULL, 0, gc->model_id, toks, ntok, g->tokens, gc->ids, g->chunks) !=
        (int)g->chunks)
        s_die("chunk chain of %s", gc->model_id);
    free(toks);
    kvedge_block_spec_t spec = {.dtype = KVEDGE_DTYPE_FP16,
                                .scheme = KVEDGE_SCHEME_LOSSLESS,
                                .tokens = g->tokens,
                                .head_dim = S_GQA_DIM};
    size_t bound = kvedge_block_encoded_bound(&spec), nb = (size_t)g->chunks * g->heads;
    size_t half = (size_t)g->tokens * S_GQA_DIM * 2;
    gc->enc = bench_alloc(bound * nb);
    uint8_t *k = bench_alloc(half), *v = bench_alloc(half);
    kvedge_put_item_t *items = bench_alloc(nb * sizeof *items);
    for (uint32_t ch = 0; ch < g->chunks; ch++)
        for (uint16_t h = 0; h < g->heads; h++) {
            KVEDGE_BENCH_CHECK(kvedge_synth_head(S_SEED_BASE + ch * 131 + h, 0, g->tokens,
                                                 S_GQA_DIM, KVEDGE_DTYPE_FP16, k, v));
            size_t len;
            KVEDGE_BENCH_CHECK(
                kvedge_block_encode(&spec, k, v, gc->enc + gc->enc_len, bound, &len));
            kvedge_put_item_t *it = &items[(size_t)ch * g->heads + h];
            memset(it, 0, sizeof *it);
            it->chunk.id = gc->ids[ch];
            if (ch > 0) {
                it->chunk.parent = gc->ids[ch - 1];
                it->chunk.has_parent = true;
            }
            snprintf(it->chunk.model_id, sizeof it->chunk.model_id, "%s", gc->model_id);
            it->chunk.index = ch;
            it->chunk.tokens = g->tokens;
            it->head = h;
            it->block = gc->enc + gc->enc_len;
            it->len = len;
            gc->enc_len += len;
        }
    /* Layer 0, then (for FETCH) the same blocks as every other layer. */
    for (uint16_t l = 0; l < (g->fetch ? g->layers : 1); l++) {
        for (size_t i = 0; i < nb; i++)
            items[i].layer = l;
        KVEDGE_BENCH_CHECK(kvedge_client_put(c, items, nb, NULL));
    }
    free(items);
    free(k);
    free(v);
    char key[64];
    snprintf(key, sizeof key, "gqa:%zu", index);
    s_redis_set(rc, key, gc->enc, gc->enc_len);
}

static double s_gqa_layer(kvedge_client_t *c, const s_gqa_case_t *gc, uint8_t *buf, size_t cap,
                          kvedge_fetched_t *out, bool check)
{
    uint32_t heads = 0, n = gc->g->chunks * gc->g->heads;
    double t0 = bench_now_s();
    int rc = kvedge_client_get_layer(c, gc->ids, gc->g->chunks, 0, buf, cap, out, n, &heads);
    double t = bench_now_s() - t0;
    KVEDGE_BENCH_CHECK(rc);
    if (heads != gc->g->heads)
        s_die("GET_LAYER of %s streamed the wrong number of heads", gc->model_id);
    if (check && (out[n - 1].offset + out[n - 1].len != gc->enc_len ||
                  memcmp(buf, gc->enc, gc->enc_len) != 0))
        s_die("GET_LAYER of %s returned other bytes than were put", gc->model_id);
    return t;
}

/* A synchronous FETCH of layer 0 through the proxy: the blocks copied into buf in order, as
 * GET_LAYER lands them. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    uint8_t *buf;
    size_t cap, at;
    uint32_t blocks;
} s_fx_t;

static void s_fx_block(void *ctx, uint16_t layer, uint32_t ci, uint16_t head, int source,
                       int status, const uint8_t *data, size_t len)
{
    (void)layer, (void)ci, (void)head, (void)source;
    s_fx_t *x = ctx;
    if (status == 0 && x->at + len <= x->cap) {
        memcpy(x->buf + x->at, data, len);
        x->at += len;
        x->blocks++;
    }
}

static void s_fx_done(void *ctx, int status)
{
    s_fx_t *x = ctx;
    pthread_mutex_lock(&x->mu);
    x->status = status;
    x->done = true;
    pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

/* One FETCH; *complete: every block came (a proxy just started may not be connected to its
 * source yet: then the layer comes back a miss). */
static double s_gqa_fetch_once(kvedge_client_t *c, const s_gqa_case_t *gc, uint8_t *buf, size_t cap,
                               bool *complete)
{
    s_fx_t x = {.buf = buf, .cap = cap};
    pthread_mutex_init(&x.mu, NULL);
    pthread_cond_init(&x.cv, NULL);
    kvedge_fetch_req_t req;
    kvedge_fetch_req_default(&req);
    req.model_id = gc->model_id;
    req.chunks = gc->ids;
    req.n = gc->g->chunks;
    req.layers = 1;
    req.tokens = gc->g->chunks * gc->g->tokens;
    kvedge_fetch_cbs_t cbs = {NULL, s_fx_block, NULL, s_fx_done};
    double t0 = bench_now_s();
    KVEDGE_BENCH_CHECK(kvedge_client_fetch_async(c, &req, &cbs, &x));
    pthread_mutex_lock(&x.mu);
    while (!x.done)
        pthread_cond_wait(&x.cv, &x.mu);
    pthread_mutex_unlock(&x.mu);
    double t = bench_now_s() - t0;
    pthread_cond_destroy(&x.cv);
    pthread_mutex_destroy(&x.mu);
    KVEDGE_BENCH_CHECK(x.status);
    *complete = x.blocks == gc->g->chunks * gc->g->heads && x.at == gc->enc_len;
    return t;
}

static double s_gqa_fetch(kvedge_client_t *c, const s_gqa_case_t *gc, uint8_t *buf, size_t cap,
                          bool check)
{
    bool complete = false;
    /* The checked pass waits (up to S_START_MS) for the proxy to reach its source. */
    double t = s_gqa_fetch_once(c, gc, buf, cap, &complete);
    for (int waited = 0; check && !complete && waited < S_START_MS; waited += S_POLL_MS) {
        usleep(S_POLL_MS * 1000);
        t = s_gqa_fetch_once(c, gc, buf, cap, &complete);
    }
    if (!complete || (check && memcmp(buf, gc->enc, gc->enc_len) != 0))
        s_die("FETCH of %s returned other bytes than were put", gc->model_id);
    return t;
}

static double s_gqa_get(redisContext *rc, const s_gqa_case_t *gc, size_t index, bool check)
{
    char key[64];
    snprintf(key, sizeof key, "gqa:%zu", index);
    double t0 = bench_now_s();
    redisReply *r = redisCommand(rc, "GET %s", key);
    if (!r || r->type != REDIS_REPLY_STRING || (size_t)r->len != gc->enc_len ||
        (check && memcmp(r->str, gc->enc, gc->enc_len) != 0))
        s_die("redis GET %s failed", key);
    freeReplyObject(r);
    return bench_now_s() - t0;
}

/* One checked pass of each kind, then iters timed rounds, the kinds interleaved. */
static void s_gqa_run(kvedge_client_t *packed, kvedge_client_t *unpacked, kvedge_client_t *fpacked,
                      kvedge_client_t *funpacked, redisContext *rc, s_gqa_case_t *gc, size_t index,
                      int reps)
{
    int n = reps ? reps : gc->g->iters;
    size_t cap = gc->enc_len;
    uint8_t *buf = bench_alloc(cap);
    memset(buf, 0, cap);
    kvedge_fetched_t *out = bench_alloc((size_t)gc->g->chunks * gc->g->heads * sizeof *out);
    s_gqa_layer(packed, gc, buf, cap, out, true);
    s_gqa_layer(unpacked, gc, buf, cap, out, true);
    s_gqa_get(rc, gc, index, true);
    bool fx = gc->g->fetch;
    if (fx) {
        s_gqa_fetch(fpacked, gc, buf, cap, true);
        s_gqa_fetch(funpacked, gc, buf, cap, true);
    }
    for (int k = 0; k < S_GQA_KINDS; k++)
        s_lat_init(&gc->lat[k], n);
    for (int i = 0; i < n; i++) {
        gc->lat[S_GQA_FPACKED].t[i] = fx ? s_gqa_fetch(fpacked, gc, buf, cap, false) : 0;
        gc->lat[S_GQA_FUNPACKED].t[i] = fx ? s_gqa_fetch(funpacked, gc, buf, cap, false) : 0;
        gc->lat[S_GQA_PACKED].t[i] = s_gqa_layer(packed, gc, buf, cap, out, false);
        gc->lat[S_GQA_GET].t[i] = s_gqa_get(rc, gc, index, false);
        gc->lat[S_GQA_UNPACKED].t[i] = s_gqa_layer(unpacked, gc, buf, cap, out, false);
        double t0 = bench_now_s();
        KVEDGE_BENCH_CHECK(kvedge_client_ping(packed, 0, NULL, NULL));
        double t1 = bench_now_s();
        redisReply *r = redisCommand(rc, "PING");
        if (!r || r->type != REDIS_REPLY_STATUS)
            s_die("%s", "redis PING failed");
        freeReplyObject(r);
        gc->lat[S_GQA_PING].t[i] = t1 - t0;
        gc->lat[S_GQA_RPING].t[i] = bench_now_s() - t1;
    }
    for (int k = 0; k < S_GQA_KINDS; k++)
        s_lat_done(&gc->lat[k], n);
    free(out);
    free(buf);
}

static void s_gqa_rows(const s_gqa_case_t *cases, size_t n);

static void s_gqa_print(const s_gqa_case_t *cases, size_t n, bool restart)
{
    printf("### GET_LAYER at GQA shapes: packed and unpacked against Redis GET\n\n");
    printf("One layer (layer 0, lossless fp16 blocks, head_dim %d) of a context of chunks x "
           "tokens, from a store node (`kvedge store`, RocksDB, %s) over loopback: GET_LAYER "
           "packed (the default), GET_LAYER unpacked (`no_pack`: one head per data message) "
           "and a Redis GET of the same bytes as one value; every round also times a kvedge "
           "PING and a Redis PING. The kinds interleave; medians (p50) of the rounds; "
           "ratio = Redis GET p50 / kvedge p50 (> 1: kvedge faster).\n\n",
           S_GQA_DIM,
           restart ? "node restarted after the puts: blocks from disk through the engine's cache"
                   : "blocks from the memtable, as put");
    printf("| model | layer | chunks x tokens | blocks | bytes | rounds | packed p50 ms | "
           "unpacked p50 ms | Redis GET p50 ms | packed / GET | unpacked / GET | packed / "
           "unpacked | kvedge PING ms | Redis PING ms | packed >= 1.0x GET |\n");
    printf("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    s_gqa_rows(cases, n);
    printf("\nFETCH of layer 0 through `kvedge proxy` (one cloud source, the node above; the "
           "proxy asks it for packed GET_LAYER streams either way), packed BLOCK messages (the "
           "default) and one block per message (`no_pack`), blocks copied into one buffer, "
           "in the same rounds:\n\n");
    printf("| model | layer | chunks x tokens | blocks | FETCH packed p50 ms | FETCH unpacked p50 "
           "ms | Redis GET p50 ms | FETCH packed / GET | FETCH unpacked / GET | packed / "
           "unpacked |\n");
    printf("|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < n; i++) {
        const s_gqa_case_t *c = &cases[i];
        if (!c->g->fetch)
            continue;
        double fp = c->lat[S_GQA_FPACKED].p50, fu = c->lat[S_GQA_FUNPACKED].p50,
               get = c->lat[S_GQA_GET].p50;
        printf("| %s | %s | %u x %u | %u | %.3f | %.3f | %.3f | %.2f | %.2f | %.2f |\n",
               c->g->model, c->g->label, c->g->chunks, c->g->tokens, c->g->chunks * c->g->heads,
               fp * S_MS, fu * S_MS, get * S_MS, get / fp, get / fu, fu / fp);
    }
    printf("\n");
}

static void s_gqa_rows(const s_gqa_case_t *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const s_gqa_case_t *c = &cases[i];
        double pk = c->lat[S_GQA_PACKED].p50, up = c->lat[S_GQA_UNPACKED].p50,
               get = c->lat[S_GQA_GET].p50;
        printf("| %s | %s | %u x %u | %u | %zu | %d | %.3f | %.3f | %.3f | %.2f | %.2f | %.2f | "
               "%.3f | %.3f | %s |\n",
               c->g->model, c->g->label, c->g->chunks, c->g->tokens, c->g->chunks * c->g->heads,
               c->enc_len, c->g->iters, pk * S_MS, up * S_MS, get * S_MS, get / pk, get / up,
               up / pk, c->lat[S_GQA_PING].p50 * S_MS, c->lat[S_GQA_RPING].p50 * S_MS,
               get / pk >= 1.0 ? "met" : "missed");
    }
}

/* The --gqa mode: loads every case, restarts the node (unless --no-restart), runs them. */
static void s_gqa_section(const char *bin, const char *data, pid_t *node, char *ep, size_t epcap,
                          redisContext *rc, bool restart, int reps, uint32_t credit)
{
    s_gqa_case_t cases[S_N_GQA];
    memset(cases, 0, sizeof cases);
    s_gqa_t g[S_N_GQA];
    for (size_t i = 0; i < S_N_GQA; i++) {
        g[i] = S_GQA[i];
        if (reps)
            g[i].iters = reps;
        cases[i].g = &g[i];
        s_gqa_load(&cases[i], i, s_client, rc);
    }
    if (restart) {
        kvedge_client_destroy(&s_client);
        s_stop(*node);
        *node = s_node_start(bin, data, ep, epcap);
        s_client_connect(ep, credit);
    }
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.name = "bench_fetch-unpacked";
    if (credit)
        o.credit = credit;
    o.no_pack = true;
    KVEDGE_BENCH_CHECK(kvedge_client_connect(&o, &s_mon_client[0])); /* freed at exit */
    char pep[256];
    pid_t proxy = s_proxy_start(bin, ep, pep, sizeof pep);
    kvedge_client_t *fx[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        kvedge_client_opts_t po;
        kvedge_client_opts_default(&po);
        po.endpoint = pep;
        po.name = "bench_fetch-proxy";
        if (credit)
            po.credit = credit;
        po.no_pack = k == 1;
        KVEDGE_BENCH_CHECK(kvedge_client_connect(&po, &fx[k]));
    }
    for (size_t i = 0; i < S_N_GQA; i++)
        s_gqa_run(s_client, s_mon_client[0], fx[0], fx[1], rc, &cases[i], i, reps);
    kvedge_client_destroy(&fx[0]);
    kvedge_client_destroy(&fx[1]);
    s_stop(proxy);
    s_gqa_print(cases, S_N_GQA, restart);
    for (size_t i = 0; i < S_N_GQA; i++) {
        free(cases[i].ids);
        free(cases[i].enc);
    }
    kvedge_client_destroy(&s_mon_client[0]);
}

/* ---------------------------------------------------------------- main */

static void s_usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--kvedge PATH (the kvedge binary, default %s)] [--dir DIR (temp dir "
            "parent, default /tmp)] [--reps N (fetches per kind and size, >= %d; default "
            "200, 100 for 16 MiB)] [--credit N (GET_LAYER credit, default the client's)] "
            "[--no-iperf] [--no-restart (serve the blocks from the memtable, as put)] "
            "[--mon-rounds N (rounds of monitoring on vs off, >= %d, default %d; 0: skip)] "
            "[--mon-aa (the same with both nodes off: the comparison's own spread)] "
            "[--gqa (only: GET_LAYER packed and unpacked at llama-3.2-1b and qwen2.5-0.5b "
            "shapes against Redis GET; --reps sets every size's rounds)]\n",
            argv0, KVEDGE_BENCH_KVEDGE_BIN, KVEDGE_BENCH_REPS_MIN, KVEDGE_BENCH_REPS_MIN,
            S_MON_ROUNDS_DEFAULT);
    exit(2);
}

int main(int argc, char **argv)
{
    const char *bin = KVEDGE_BENCH_KVEDGE_BIN, *dir = "/tmp";
    int reps = 0, credit = 0, mon_rounds = S_MON_ROUNDS_DEFAULT;
    bool iperf = true, restart = true, mon_aa = false, gqa = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--kvedge") == 0 && i + 1 < argc)
            bin = argv[++i];
        else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
            dir = argv[++i];
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--credit") == 0 && i + 1 < argc)
            credit = atoi(argv[++i]);
        else if (strcmp(argv[i], "--no-iperf") == 0)
            iperf = false;
        else if (strcmp(argv[i], "--no-restart") == 0)
            restart = false;
        else if (strcmp(argv[i], "--mon-rounds") == 0 && i + 1 < argc)
            mon_rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--mon-aa") == 0)
            mon_aa = true;
        else if (strcmp(argv[i], "--gqa") == 0)
            gqa = true;
        else
            s_usage(argv[0]);
    }
    if ((reps != 0 && reps < KVEDGE_BENCH_REPS_MIN) || credit < 0 || credit > 1024 ||
        (mon_rounds != 0 && mon_rounds < KVEDGE_BENCH_REPS_MIN))
        s_usage(argv[0]);
    if (access(bin, X_OK) != 0)
        s_die("cannot run the kvedge binary %s (pass --kvedge PATH)", bin);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    atexit(s_cleanup);
    snprintf(s_tmpdir, sizeof s_tmpdir, "%s/kvedge-bench-fetch-XXXXXX", dir);
    if (!mkdtemp(s_tmpdir)) {
        int e = errno;
        s_tmpdir[0] = '\0';
        s_die("mkdtemp: %s", strerror(e));
    }

    /* Children first, while this process has one thread. */
    s_ctx_t x;
    memset(&x, 0, sizeof x);
    x.tcp = s_tcp_start();
    x.zmq = s_zmq_start(&x.zmq_ctx);
    char data[S_PATH_MAX + 16], ep[256];
    snprintf(data, sizeof data, "%s/node", s_tmpdir);
    pid_t node = s_node_start(bin, data, ep, sizeof ep);
    x.rc = s_redis_start();
    s_client_connect(ep, (uint32_t)credit);
    x.kv = s_client;
    if (gqa) {
        s_gqa_section(bin, data, &node, ep, sizeof ep, x.rc, restart, reps, (uint32_t)credit);
        kvedge_client_destroy(&s_client);
        redisFree(x.rc);
        close(x.tcp);
        zmq_close(x.zmq);
        zmq_ctx_term(x.zmq_ctx);
        return 0;
    }

    s_case_t cases[S_N_SIZES];
    memset(cases, 0, sizeof cases);
    uint16_t max_heads = 0;
    for (size_t i = 0; i < S_N_SIZES; i++) {
        cases[i].sz = &S_SIZES[i];
        s_case_load(&cases[i], i, x.kv, x.rc);
        if (cases[i].enc_len[S_LOSSLESS] > x.cap)
            x.cap = cases[i].enc_len[S_LOSSLESS];
        if (S_SIZES[i].heads > max_heads)
            max_heads = S_SIZES[i].heads;
    }
    if (restart) {
        /* A clean stop flushes the memtables: the node serves what it persisted, from blob
         * files through its block cache, as it would any time after the puts. */
        kvedge_client_destroy(&s_client);
        s_stop(node);
        node = s_node_start(bin, data, ep, sizeof ep);
        s_client_connect(ep, (uint32_t)credit);
        x.kv = s_client;
    }
    x.buf = bench_alloc(x.cap);
    memset(x.buf, 0, x.cap); /* fault the pages in before anything is timed */
    x.out = bench_alloc(max_heads * sizeof *x.out);
    x.mget_argv = bench_alloc(((size_t)max_heads + 1) * sizeof *x.mget_argv);
    x.mget_len = bench_alloc(((size_t)max_heads + 1) * sizeof *x.mget_len);
    x.mget_argv[0] = "MGET";
    x.mget_len[0] = 4;
    for (uint16_t h = 0; h < max_heads; h++)
        x.mget_argv[h + 1] = bench_alloc(64);

    s_size_t sizes[S_N_SIZES];
    for (size_t i = 0; i < S_N_SIZES; i++) {
        sizes[i] = S_SIZES[i];
        if (reps)
            sizes[i].iters = reps;
        cases[i].sz = &sizes[i];
        s_case_run(&x, &cases[i], i);
    }
    s_lat_t floor[4];
    s_floor_run(&x, &floor[0], &floor[1], &floor[2], &floor[3]);
    /* Last, as it loads both cores for seconds: the streaming ceiling of loopback. */
    double bps = iperf ? s_iperf() : 0;

    s_print(cases, floor, bps, (int)sysconf(_SC_NPROCESSORS_ONLN),
            credit ? (uint32_t)credit : KVEDGE_CLIENT_CREDIT_DEFAULT, restart);
    fflush(stdout);

    kvedge_client_destroy(&s_client);
    if (mon_rounds > 0) {
        s_stop(node); /* idle, but one daemon fewer on the cores */
        s_mon_section(bin, &x, cases, restart, (uint32_t)credit, mon_rounds, mon_aa);
    }
    redisFree(x.rc);
    close(x.tcp);
    zmq_close(x.zmq);
    zmq_ctx_term(x.zmq_ctx);
    for (uint16_t h = 0; h < max_heads; h++)
        free(x.mget_argv[h + 1]);
    free(x.mget_argv);
    free(x.mget_len);
    free(x.out);
    free(x.buf);
    for (size_t i = 0; i < S_N_SIZES; i++)
        for (int s = 0; s < S_SCHEMES; s++) {
            free(cases[i].enc[s]);
            free(cases[i].head_len[s]);
        }
    return 0; /* s_cleanup stops the children and removes the temp dir */
}
