/* Memory soak of a store node: a `kvedge store` (cloud role, CURVE) and a `kvedge proxy` in
 * front of it, under mixed load from this process for --duration seconds: PUTs of new
 * contexts, GET_LAYER streams, FETCHes through the proxy, and short CURVE connections (connect,
 * HELLO, PING, close). The node's resident set (VmRSS) is sampled every --interval seconds and
 * printed with the operations so far; the summary gives the RSS after warm-up, the peak, and
 * the least-squares slope over the second half of the run in MiB/min. With --max-slope the
 * run fails (exit 1) when that slope is above it, or when any operation failed: a node whose
 * memory has bounds reaches them and stays flat; a leak keeps climbing.
 *
 * bench_soak [--kvedge BIN] [--duration S] [--interval S] [--cache SIZE] [--capacity SIZE]
 *            [--put-pause MS] [--max-slope MIB_PER_MIN] [--csv FILE] */
#include <czmq.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_scrape.h"
#include "bench/bench_spawn.h"
#include "bench/bench_context.h"
#include "clients/lib/kvedge.h"
#include "access/codec/synth.h"

#define S_MODEL  "opt-125m" /* 12 layers x 12 KV heads x 64 */
#define S_LAYERS 12
#define S_HEADS  12
#define S_DIM    64
#define S_CHUNKS 2
#define S_TOKENS (S_CHUNKS * 256)
#define S_RING   16 /* contexts readers pick from: the latest put */
/* Pacing of each load thread (ms between operations; a context's PUTs go back to back, then
 * --put-pause, 1000 ms by default). */
#define S_GET_MS   100
#define S_FETCH_MS 250
#define S_CONN_MS  250

static struct {
    const char *bin;
    int duration_s;
    int interval_s;
    const char *cache;
    const char *capacity;
    double max_slope; /* MiB/min; < 0 = report only */
    const char *csv;
    int put_pause_ms;
} s_cfg = {KVEDGE_BENCH_KVEDGE_BIN, 600, 10, "256M", "512M", -1, NULL, 1000};

static char s_node_ep[64], s_proxy_ep[300], s_node_key[300], s_client_cert[300];
static atomic_bool s_stop;
static atomic_uint_fast64_t s_ops[4], s_errors;
static const char *const s_op_names[4] = {"put", "get_layer", "fetch", "connect"};

/* The ring of contexts fully put: readers take any of them (an evicted one is a miss). */
static pthread_mutex_t s_ring_mu = PTHREAD_MUTEX_INITIALIZER;
static kvedge_chunk_id_t s_ring[S_RING][S_CHUNKS];
static uint64_t s_ring_n;

static bool s_ring_pick(kvedge_chunk_id_t ids[S_CHUNKS])
{
    pthread_mutex_lock(&s_ring_mu);
    uint64_t n = s_ring_n;
    if (n)
        memcpy(ids, s_ring[(uint64_t)rand() % (n < S_RING ? n : S_RING)],
               sizeof(kvedge_chunk_id_t) * S_CHUNKS);
    pthread_mutex_unlock(&s_ring_mu);
    return n > 0;
}

static void s_fail(int op, int rc)
{
    if (atomic_fetch_add(&s_errors, 1) < 20)
        fprintf(stderr, "bench_soak: %s: %s\n", s_op_names[op], kvedge_strerror(rc));
}

static int s_connect(const char *ep, bool curve, int deadline_ms, kvedge_client_t **c)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = deadline_ms;
    if (curve) {
        o.server_key = s_node_key;
        o.client_cert = s_client_cert;
    }
    return kvedge_client_connect(&o, c);
}

static void s_sleep_ms(int ms)
{
    for (int i = 0; i < ms / 50 && !atomic_load(&s_stop); i++)
        zclock_sleep(50);
}

/* PUT: a new context of S_CHUNKS chunks, every layer and head (int8), one call per chunk and
 * layer; then it joins the ring. */
static void *s_putter(void *arg)
{
    (void)arg;
    kvedge_client_t *c = NULL;
    if (s_connect(s_node_ep, true, 30000, &c) != KVEDGE_OK) {
        s_fail(0, KVEDGE_ETIMEDOUT);
        return NULL;
    }
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, 256, S_DIM, 0, NULL, false};
    size_t cap = kvedge_block_encoded_bound(&spec);
    uint8_t *blocks = malloc(cap * S_HEADS);
    uint16_t *k = malloc(256 * S_DIM * 2), *v = malloc(256 * S_DIM * 2);
    uint32_t tok[S_TOKENS];
    for (uint64_t ctx = 1; blocks && k && v && !atomic_load(&s_stop); ctx++) {
        for (int i = 0; i < S_TOKENS; i++)
            tok[i] = (uint32_t)(ctx * 7919 + (uint64_t)i) % 50000;
        kvedge_chunk_id_t ids[S_CHUNKS];
        kvedge_chunk_chain(NULL, 0, S_MODEL, tok, S_TOKENS, 0, ids, S_CHUNKS);
        int rc = KVEDGE_OK;
        for (uint32_t l = 0; l < S_LAYERS && rc == KVEDGE_OK; l++)
            for (uint32_t ci = 0; ci < S_CHUNKS && rc == KVEDGE_OK; ci++) {
                kvedge_put_item_t items[S_HEADS];
                for (uint32_t h = 0; h < S_HEADS; h++)
                    bench_chunk_item(&items[h], S_MODEL, ids, ci, l, h, ctx * 1000 + l * 100 + h,
                                     &spec, blocks + h * cap, cap, k, v);
                rc = kvedge_client_put(c, items, S_HEADS, NULL);
                atomic_fetch_add(&s_ops[0], 1);
            }
        if (rc != KVEDGE_OK) {
            s_fail(0, rc);
        } else {
            pthread_mutex_lock(&s_ring_mu);
            memcpy(s_ring[s_ring_n++ % S_RING], ids, sizeof ids);
            pthread_mutex_unlock(&s_ring_mu);
        }
        s_sleep_ms(s_cfg.put_pause_ms);
    }
    free(blocks);
    free(k);
    free(v);
    kvedge_client_destroy(&c);
    return NULL;
}

/* GET_LAYER: one layer of a context of the ring, over a long-lived CURVE connection. A miss
 * (the context evicted under --capacity) is not an error. */
static void *s_getter(void *arg)
{
    (void)arg;
    kvedge_client_t *c = NULL;
    if (s_connect(s_node_ep, true, 30000, &c) != KVEDGE_OK) {
        s_fail(1, KVEDGE_ETIMEDOUT);
        return NULL;
    }
    size_t cap = 8u << 20;
    uint8_t *buf = malloc(cap);
    kvedge_fetched_t out[S_CHUNKS * S_HEADS];
    while (buf && !atomic_load(&s_stop)) {
        kvedge_chunk_id_t ids[S_CHUNKS];
        if (s_ring_pick(ids)) {
            uint32_t heads = 0;
            int rc = kvedge_client_get_layer(c, ids, S_CHUNKS, (uint16_t)(rand() % S_LAYERS), buf,
                                             cap, out, S_CHUNKS * S_HEADS, &heads);
            atomic_fetch_add(&s_ops[1], 1);
            if (rc != KVEDGE_OK && rc != KVEDGE_ENOTFOUND)
                s_fail(1, rc);
        }
        s_sleep_ms(S_GET_MS);
    }
    free(buf);
    kvedge_client_destroy(&c);
    return NULL;
}

/* FETCH: every layer of a context of the ring through the proxy (which streams them from the
 * node over its own CURVE connection). */
static void *s_fetcher(void *arg)
{
    (void)arg;
    kvedge_client_t *c = NULL;
    if (s_connect(s_proxy_ep, false, 30000, &c) != KVEDGE_OK) {
        s_fail(2, KVEDGE_ETIMEDOUT);
        return NULL;
    }
    while (!atomic_load(&s_stop)) {
        kvedge_chunk_id_t ids[S_CHUNKS];
        if (s_ring_pick(ids)) {
            bench_fetch_end_t w;
            kvedge_fetch_req_t req = {.size = sizeof(kvedge_fetch_req_t),
                                      .model_id = S_MODEL,
                                      .chunks = ids,
                                      .n = S_CHUNKS,
                                      .first_layer = 0,
                                      .layers = S_LAYERS,
                                      .tokens = S_TOKENS,
                                      .deadline_ms = 10000};
            kvedge_fetch_cbs_t cbs = {NULL, NULL, NULL, bench_fetch_done};
            int rc = bench_fetch_wait(c, &req, &cbs, &w);
            if (rc == KVEDGE_OK)
                rc = w.status;
            atomic_fetch_add(&s_ops[2], 1);
            if (rc != KVEDGE_OK)
                s_fail(2, rc);
        }
        s_sleep_ms(S_FETCH_MS);
    }
    kvedge_client_destroy(&c);
    return NULL;
}

/* Short CURVE connections: connect (handshake, HELLO), one PING, close. */
static void *s_connector(void *arg)
{
    (void)arg;
    while (!atomic_load(&s_stop)) {
        kvedge_client_t *c = NULL;
        int rc = s_connect(s_node_ep, true, 5000, &c);
        if (rc == KVEDGE_OK)
            rc = kvedge_client_ping(c, 0, NULL, NULL);
        kvedge_client_destroy(&c);
        atomic_fetch_add(&s_ops[3], 1);
        if (rc != KVEDGE_OK)
            s_fail(3, rc);
        s_sleep_ms(S_CONN_MS);
    }
    return NULL;
}

/* VmRSS of pid in KiB; 0 when unreadable. */
static uint64_t s_rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    uint64_t kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %" SCNu64, &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

/* `kvedge keygen path`; exits on failure. */
static void s_keygen(const char *path)
{
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, STDOUT_FILENO);
        execl(s_cfg.bin, "kvedge", "keygen", path, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "bench_soak: %s keygen %s failed\n", s_cfg.bin, path);
        exit(1);
    }
}

static void s_copy(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    char buf[4096];
    size_t n;
    while (a && b && (n = fread(buf, 1, sizeof buf, a)) > 0)
        fwrite(buf, 1, n, b);
    if (!a || !b) {
        fprintf(stderr, "bench_soak: cannot copy %s to %s\n", from, to);
        exit(1);
    }
    fclose(a);
    fclose(b);
}

static void s_usage(void)
{
    fprintf(stderr, "usage: bench_soak [--kvedge BIN] [--duration S] [--interval S] "
                    "[--cache SIZE] [--capacity SIZE] [--put-pause MS] [--max-slope MIB_PER_MIN] "
                    "[--csv FILE]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            s_usage();
        if (strcmp(a, "--kvedge") == 0)
            s_cfg.bin = v;
        else if (strcmp(a, "--duration") == 0)
            s_cfg.duration_s = atoi(v);
        else if (strcmp(a, "--interval") == 0)
            s_cfg.interval_s = atoi(v);
        else if (strcmp(a, "--cache") == 0)
            s_cfg.cache = v;
        else if (strcmp(a, "--capacity") == 0)
            s_cfg.capacity = v;
        else if (strcmp(a, "--max-slope") == 0)
            s_cfg.max_slope = atof(v);
        else if (strcmp(a, "--csv") == 0)
            s_cfg.csv = v;
        else if (strcmp(a, "--put-pause") == 0)
            s_cfg.put_pause_ms = atoi(v);
        else
            s_usage();
        i++;
    }
    if (s_cfg.duration_s < 4 || s_cfg.interval_s < 1 || s_cfg.duration_s < 4 * s_cfg.interval_s ||
        s_cfg.put_pause_ms < 0)
        s_usage();
    zsys_handler_set(NULL);
    srand(1);
    char dir[] = "/tmp/kvedge-soak-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("bench_soak: mkdtemp");
        return 1;
    }
    char data[100], clients[120], proxy_cert[120], pub[200], cmd[300];
    snprintf(data, sizeof data, "%s/node", dir);
    snprintf(clients, sizeof clients, "%s/clients", dir);
    snprintf(s_client_cert, sizeof s_client_cert, "%s/client.cert", dir);
    snprintf(proxy_cert, sizeof proxy_cert, "%s/proxy.cert", dir);
    snprintf(s_node_key, sizeof s_node_key, "%s/node.cert", data);
    if (mkdir(data, 0700) != 0 || mkdir(clients, 0700) != 0) {
        perror("bench_soak: mkdir");
        return 1;
    }
    s_keygen(s_client_cert);
    s_keygen(proxy_cert);
    snprintf(pub, sizeof pub, "%s/client.cert", clients);
    s_copy(s_client_cert, pub);
    snprintf(pub, sizeof pub, "%s/proxy.cert", clients);
    s_copy(proxy_cert, pub);

    snprintf(s_node_ep, sizeof s_node_ep, "tcp://127.0.0.1:%d", bench_free_port());
    char *nargv[] = {"kvedge",      "--data",
                     data,          "store",
                     "--role",      "cloud",
                     "--bind",      s_node_ep,
                     "--clients",   clients,
                     "--cache",     (char *)s_cfg.cache,
                     "--capacity",  (char *)s_cfg.capacity,
                     "--metrics",   "off",
                     "--log-level", "warn",
                     NULL};
    pid_t node = bench_spawn(s_cfg.bin, nargv);
    if (node < 0) {
        fprintf(stderr, "bench_soak: the node did not start\n");
        return 1;
    }
    snprintf(s_proxy_ep, sizeof s_proxy_ep, "ipc://%s/proxy.sock", dir);
    char src[600];
    snprintf(src, sizeof src, "cloud cloud1 %s key=%s", s_node_ep, s_node_key);
    char *pargv[] = {"kvedge", "proxy",       "--insecure", "--bind", s_proxy_ep,
                     "--cert", proxy_cert,    "--source",   src,      "--metrics",
                     "off",    "--log-level", "error",      NULL};
    pid_t proxy = bench_spawn(s_cfg.bin, pargv);
    if (proxy < 0) {
        fprintf(stderr, "bench_soak: the proxy did not start\n");
        bench_stop(&node);
        return 1;
    }

    pthread_t th[4];
    void *(*fn[4])(void *) = {s_putter, s_getter, s_fetcher, s_connector};
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, fn[i], NULL);

    FILE *csv = s_cfg.csv ? fopen(s_cfg.csv, "w") : NULL;
    if (csv)
        fprintf(csv, "t_s,rss_mib,put,get_layer,fetch,connect,errors\n");
    int n = s_cfg.duration_s / s_cfg.interval_s;
    double *t = calloc((size_t)n + 1, sizeof *t), *rss = calloc((size_t)n + 1, sizeof *rss);
    printf("%8s %9s %8s %10s %7s %8s %6s\n", "t_s", "rss_mib", "put", "get_layer", "fetch",
           "connect", "errors");
    int64_t t0 = zclock_mono();
    int got = 0;
    for (int i = 1; i <= n && t && rss; i++) {
        int64_t due = t0 + (int64_t)i * s_cfg.interval_s * 1000;
        while (zclock_mono() < due)
            zclock_sleep((int)(due - zclock_mono()));
        uint64_t kib = s_rss_kib(node);
        if (!kib) {
            fprintf(stderr, "bench_soak: the node is gone\n");
            break;
        }
        t[got] = (double)(zclock_mono() - t0) / 1000.0;
        rss[got] = (double)kib / 1024.0;
        printf("%8.0f %9.1f %8" PRIu64 " %10" PRIu64 " %7" PRIu64 " %8" PRIu64 " %6" PRIu64 "\n",
               t[got], rss[got], (uint64_t)s_ops[0], (uint64_t)s_ops[1], (uint64_t)s_ops[2],
               (uint64_t)s_ops[3], (uint64_t)s_errors);
        fflush(stdout);
        if (csv) {
            fprintf(csv, "%.0f,%.1f,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 "\n",
                    t[got], rss[got], (uint64_t)s_ops[0], (uint64_t)s_ops[1], (uint64_t)s_ops[2],
                    (uint64_t)s_ops[3], (uint64_t)s_errors);
            fflush(csv);
        }
        got++;
    }
    atomic_store(&s_stop, true);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    bench_stop(&proxy);
    bench_stop(&node);
    if (csv)
        fclose(csv);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_soak: could not remove %s\n", dir);

    /* Least squares over the second half of the samples. */
    double slope = 0, peak = 0;
    int from = got / 2, m = got - from;
    if (m >= 2) {
        double st = 0, sr = 0, stt = 0, str = 0;
        for (int i = from; i < got; i++) {
            st += t[i];
            sr += rss[i];
            stt += t[i] * t[i];
            str += t[i] * rss[i];
        }
        double den = m * stt - st * st;
        slope = den > 0 ? (m * str - st * sr) / den * 60.0 : 0;
    }
    for (int i = 0; i < got; i++)
        peak = rss[i] > peak ? rss[i] : peak;
    bool bad =
        got < 4 || atomic_load(&s_errors) > 0 || (s_cfg.max_slope >= 0 && slope > s_cfg.max_slope);
    printf("node RSS: %.1f MiB at t=%.0f s (half-way), %.1f MiB at the end, peak %.1f MiB; "
           "slope over the second half %.2f MiB/min%s; %" PRIu64 " errors\n",
           got ? rss[from] : 0, got ? t[from] : 0, got ? rss[got - 1] : 0, peak, slope,
           s_cfg.max_slope >= 0
               ? (slope > s_cfg.max_slope ? " (above the limit)" : " (within the limit)")
               : "",
           (uint64_t)s_errors);
    free(t);
    free(rss);
    return bad && (s_cfg.max_slope >= 0 || got < 4) ? 1 : 0;
}
