/* Pipelined fetch of a full context over an emulated cloud link, as an edge client would run
 * it: the planner (proxy/plan.h) picks per layer "fetch from the cloud" or "recompute", the
 * layers stream in order while an emulated decoder computes layer by layer. Measured against
 * cloud-only (fetch every layer, pipelined), load-everything-then-compute, recompute-all, and
 * the Eq. 20 bound of the executed plan, sweeping the link bandwidth. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_context.h"
#include "clients/lib/kvedge.h"
#include "proxy/plan.h"
#include "access/codec/synth.h"

#define S_MODEL      "opt-125m" /* 12 layers x 12 KV heads x 64 */
#define S_TOKENS     512
#define S_LATENCY_MS 20
#define S_IN_FLIGHT  64 /* layer streams kept open ahead of the decoder */

static double s_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void s_sleep_us(double us)
{
    if (us <= 0)
        return;
    struct timespec ts = {(time_t)(us / 1e6), (long)fmod(us * 1e3, 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* One layer stream: done flag and time. */
typedef struct {
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    bool done;
    int status;
    double at_us;
    uint64_t bytes;
} s_layer_t;

static void s_on_block(void *ctx, uint32_t ci, uint16_t head, int status, const uint8_t *data,
                       size_t len)
{
    (void)ci;
    (void)head;
    (void)data;
    s_layer_t *l = ctx;
    if (status == 0)
        l->bytes += len;
}

static void s_on_done(void *ctx, int status, uint32_t heads)
{
    (void)heads;
    s_layer_t *l = ctx;
    pthread_mutex_lock(l->mu);
    l->done = true;
    l->status = status;
    l->at_us = s_now_us();
    pthread_cond_broadcast(l->cv);
    pthread_mutex_unlock(l->mu);
}

/* Runs one strategy: assign[l] = 0 (fetch from the cloud) or -1 (recompute). With
 * load_first, all fetches complete before the decoder starts. Returns T in microseconds. */
static double s_run(kvedge_client_t *c, const kvedge_chunk_id_t *ids, uint32_t nchunks,
                    uint32_t layers, const int32_t *assign, bool load_first, double compute_us,
                    double recompute_us)
{
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    s_layer_t st[KVEDGE_PLAN_MAX_LAYERS];
    memset(st, 0, sizeof st);
    uint32_t next = 0, open = 0;
    double t0 = s_now_us();
    /* Opens the next fetched layers' streams, S_IN_FLIGHT at a time, in layer order. */
#define S_OPEN_MORE()                                                                              \
    while (next < layers && (load_first || open < S_IN_FLIGHT)) {                                  \
        if (assign[next] < 0) {                                                                    \
            next++;                                                                                \
            continue;                                                                              \
        }                                                                                          \
        st[next].mu = &mu;                                                                         \
        st[next].cv = &cv;                                                                         \
        if (kvedge_client_get_layer_async(c, ids, nchunks, (uint16_t)next, 60000, s_on_block,      \
                                          s_on_done, &st[next]) != 0) {                            \
            fprintf(stderr, "bench_pipeline: get_layer_async failed\n");                           \
            exit(1);                                                                               \
        }                                                                                          \
        open++;                                                                                    \
        next++;                                                                                    \
    }
    S_OPEN_MORE();
    if (load_first) {
        pthread_mutex_lock(&mu);
        for (uint32_t l = 0; l < layers; l++)
            while (assign[l] >= 0 && !st[l].done)
                pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
    }
    for (uint32_t l = 0; l < layers; l++) {
        if (assign[l] < 0) {
            s_sleep_us(recompute_us + compute_us); /* the decoder computes the layer's KV */
            continue;
        }
        pthread_mutex_lock(&mu);
        while (!st[l].done)
            pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
        if (st[l].status != 0) {
            fprintf(stderr, "bench_pipeline: layer %u: %s\n", l, kvedge_strerror(st[l].status));
            exit(1);
        }
        open--;
        S_OPEN_MORE();
        s_sleep_us(compute_us); /* the decoder runs layer l over the prompt */
    }
#undef S_OPEN_MORE
    return s_now_us() - t0;
}

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double s_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, s_cmp);
    return v[n / 2];
}

static void s_put_context(kvedge_client_t *c, kvedge_scheme_t scheme, kvedge_chunk_id_t *ids,
                          uint32_t nchunks, uint32_t layers, uint32_t heads, double *layer_bytes)
{
    uint32_t tok[S_TOKENS];
    for (uint32_t i = 0; i < S_TOKENS; i++)
        tok[i] = 31 * i + 5;
    if (kvedge_chunk_chain(NULL, 0, S_MODEL, tok, S_TOKENS, 0, ids, nchunks) != (int)nchunks)
        exit(1);
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP16,
                                scheme,
                                256,
                                64,
                                (uint16_t)(scheme == KVEDGE_SCHEME_INT4 ? 32 : 0),
                                NULL,
                                false};
    size_t cap = kvedge_block_encoded_bound(&spec);
    uint8_t *blocks = malloc(cap * heads);
    uint16_t *k = malloc(256 * 64 * 2), *v = malloc(256 * 64 * 2);
    kvedge_put_item_t *items = calloc(heads, sizeof *items);
    for (uint32_t l = 0; l < layers; l++) {
        layer_bytes[l] = 0;
        for (uint32_t ci = 0; ci < nchunks; ci++) {
            for (uint32_t h = 0; h < heads; h++) {
                bench_chunk_item(&items[h], S_MODEL, ids, ci, l, h, l * 100 + h, &spec,
                                 blocks + h * cap, cap, k, v);
                layer_bytes[l] += (double)items[h].len;
            }
            if (kvedge_client_put(c, items, heads, NULL) != 0) {
                fprintf(stderr, "bench_pipeline: put failed\n");
                exit(1);
            }
        }
    }
    free(blocks);
    free(k);
    free(v);
    free(items);
}

static pid_t s_node_pid;

static void s_stop_node(void)
{
    if (s_node_pid > 0) {
        kill(s_node_pid, SIGTERM);
        waitpid(s_node_pid, NULL, 0);
        s_node_pid = 0;
    }
}

int main(int argc, char **argv)
{
    const char *kvedge = argc > 1 ? argv[1] : "build/clients/kvedge";
    double compute_us = 4000, recompute_us = 25000; /* per layer: decoder and KV recompute */
    char dir[] = "/tmp/kvedge-pipe-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char ep[300], data[300];
    snprintf(ep, sizeof ep, "ipc://%s/node.sock", dir);
    snprintf(data, sizeof data, "%s/node", dir);
    int pfd[2];
    if (pipe(pfd) != 0)
        return 1;
    s_node_pid = fork();
    if (s_node_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], STDOUT_FILENO);
        execl(kvedge, "kvedge", "--data", data, "store", "--insecure", "--bind", ep, "--log-level",
              "warn", "--metrics", "off", (char *)NULL);
        _exit(127);
    }
    atexit(s_stop_node);
    char line[400];
    if (read(pfd[0], line, sizeof line) <= 0) {
        fprintf(stderr, "bench_pipeline: the node did not start (%s)\n", kvedge);
        return 1;
    }
    kvedge_model_t m;
    kvedge_model_builtin(S_MODEL, &m);
    const uint32_t L = m.layers, nchunks = S_TOKENS / 256;
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = 60000;
    kvedge_client_t *loader = NULL;
    if (kvedge_client_connect(&o, &loader) != 0)
        return 1;
    kvedge_chunk_id_t ids[8];
    double layer_bytes[KVEDGE_PLAN_MAX_LAYERS];
    s_put_context(loader, KVEDGE_SCHEME_INT8, ids, nchunks, L, m.kv_heads, layer_bytes);
    kvedge_client_destroy(&loader);

    printf("### Pipelined fetch over an emulated cloud link\n\n"
           "%s, %u tokens (%u chunks), int8 blocks, %.2f MB per layer, %u layers; emulated link "
           "one-way latency %d ms; decoder %.1f ms per layer, KV recompute %.1f ms per layer "
           "(emulated: the decoder sleeps). Median of 3 runs per cell.\n\n",
           S_MODEL, S_TOKENS, nchunks, layer_bytes[0] / 1e6, L, S_LATENCY_MS, compute_us / 1e3,
           recompute_us / 1e3);
    printf("| link | plan: fetched layers | kvedge plan ms | Eq. 20 bound ms | plan/bound | "
           "cloud-only ms | load-then-compute ms | recompute-all ms | best single ms | "
           "plan/best |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    static const char *links[] = {"10mbit", "100mbit", "1gbit", "10gbit"};
    static const double rates[] = {10e6, 100e6, 1e9, 10e9};
    double cu[KVEDGE_PLAN_MAX_LAYERS], ru[KVEDGE_PLAN_MAX_LAYERS];
    for (uint32_t l = 0; l < L; l++) {
        cu[l] = compute_us;
        ru[l] = recompute_us;
    }
    int worst = 0;
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
        char spec[64];
        snprintf(spec, sizeof spec, "%s,%dms", links[i], S_LATENCY_MS);
        o.link = spec;
        o.credit = 64; /* cover the bandwidth-delay product */
        kvedge_client_t *c = NULL;
        if (kvedge_client_connect(&o, &c) != 0)
            return 1;
        kvedge_plan_source_t cloud = {KVEDGE_PLAN_CLOUD,  "cloud",      true,
                                      2e3 * S_LATENCY_MS, rates[i] / 8, layer_bytes};
        kvedge_plan_request_t req = {L, 0, cu, ru};
        static kvedge_plan_t plan;
        if (kvedge_plan_make(&req, &cloud, 1, &plan) != 0)
            return 1;
        int32_t assign[KVEDGE_PLAN_MAX_LAYERS], all_cloud[KVEDGE_PLAN_MAX_LAYERS];
        uint32_t fetched = 0;
        for (uint32_t l = 0; l < L; l++) {
            assign[l] = plan.layer[l].source;
            all_cloud[l] = 0;
            fetched += assign[l] >= 0;
        }
        double bound = 0;
        kvedge_plan_bound(&req, &cloud, 1, assign, &bound);
        int reps = rates[i] < 50e6 ? 1 : 3;
        double tp[3], tc[3], tl[3];
        for (int r = 0; r < reps; r++) {
            tp[r] = s_run(c, ids, nchunks, L, assign, false, compute_us, recompute_us);
            tc[r] = s_run(c, ids, nchunks, L, all_cloud, false, compute_us, recompute_us);
            tl[r] = s_run(c, ids, nchunks, L, all_cloud, true, compute_us, recompute_us);
        }
        double p = s_median(tp, reps), co = s_median(tc, reps), lt = s_median(tl, reps);
        double rec = L * (compute_us + recompute_us) * 1.0; /* emulated exactly by sleeping */
        double best = co < rec ? co : rec;
        printf("| %s, %d ms | %u of %u | %.1f | %.1f | %.2f | %.1f | %.1f | %.1f | %.1f | %.2f |\n",
               links[i], S_LATENCY_MS, fetched, L, p / 1e3, bound / 1e3, p / bound, co / 1e3,
               lt / 1e3, rec / 1e3, best / 1e3, p / best);
        if (p > 1.10 * bound || p > best * 1.05)
            worst = 1;
        kvedge_client_destroy(&c);
    }
    printf("\nGoals: within 10%% of the Eq. 20 bound at every point, never slower than the best "
           "single source: %s.\n",
           worst ? "missed at some point (see the ratios)" : "met at every point");
    s_stop_node();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}
