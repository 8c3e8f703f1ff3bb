/* End to end, at this machine's scale: the experiments of CE-LSLM (Table II, Fig. 7) and
 * EdgePrompt (Figs. 4-5) with the reference OPT decoder (fp32, CPU) on synthetic weights of the
 * real opt-125m shape, against kvedge store nodes and edge proxies spawned from the kvedge
 * binary, over emulated links.
 *
 *   A. One request at a time: edge-only (the edge recomputes the context), cloud-only (the
 *      prompt goes to an emulated cloud model that holds the context's K/V), kvedge (the
 *      context's K/V through the edge proxy, from the cloud node or the edge's history node):
 *      TTFT, total time, memory, bytes moved, share of the prompt that left the edge.
 *   B. Poisson arrivals at swept rates: kvedge with E edge workers against the one cloud model
 *      of cloud-only: latency (arrival to last token), TTFT and throughput. Rates are given
 *      as loads, multiples of the cloud model's capacity measured in the same run (1 / its
 *      time for one request), so the sweep spans unloaded to saturated on any machine.
 *   C. The cloud link swept from 10 Mbit/s to 10 Gbit/s: kvedge's TTFT against the Eq. 20
 *      bound of its plan, against recomputing everything and against fetching everything.
 *   R. (--only R; not run by default) The fixed cost of a request whose plan fetches nothing:
 *      kvedge (the FETCH, the proxy's plan, the pipeline, every layer computed by the decoder)
 *      against edge-only (the decoder alone), interleaved, for a context no source holds and
 *      for a stored context behind a 1 Mbit/s link (every layer priced cheaper to compute).
 *   D. (--only D; not run by default) Repeated requests in one process: the plan's T against
 *      the TTFT, planned with the one-time calibration (kvedge_decoder_forget before each
 *      request) and with the decoder's speed learned from the requests before
 *      (kvedge_e2e_decode feeds the layer times back).
 *
 * Edges, cloud node, proxies and the emulated cloud model all share this machine's cores.
 *
 *   bench_e2e [--contexts 512,1024] [--prompt 32] [--new 16] [--runs 3] [--quick] [--out DIR]
 *             [--only ABCDLR] [--loads 0.3,0.6,1.2,2.4 | --rates R,..] [--requests 8]
 *             [--edges 2] [--no-rss] [--verbose] [--kvedge BIN] [--learn-requests 8]
 *             [--links 10mbit,100mbit,1gbit,10gbit]
 *
 * Tables go to stdout (markdown); data files for scripts/plot_e2e.gp go to --out. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_common.h"
#include "bench/bench_spawn.h"
#include "clients/e2e/e2e.h"
#include "clients/lib/pipeline.h"

#ifndef KVEDGE_BENCH_KVEDGE_BIN
#define KVEDGE_BENCH_KVEDGE_BIN "clients/kvedge"
#endif

/* The default --shape. Its name is the model id: a built-in record (a rotary model's with its
 * @rope- suffix, which a proxy without a master knows by the built-in shape). */
#define S_SHAPE_DEFAULT   "opt-125m"
#define S_WEIGHTS_SEED    125
#define S_TOKENS_SEED     0x6b7665646765ull /* contexts and prompts */
#define S_ARRIVALS_SEED   7
#define S_MAX_CONTEXTS    8
#define S_MAX_RATES       16
#define S_MAX_CHUNKS      64
#define S_MAX_TOKENS      8192 /* longest context (the shape's positions bound it too) */
#define S_MAX_EDGES       8
#define S_MAX_REQUESTS    1000
#define S_MAX_RUNS        100
#define S_CLOUD_LINK      "1gbit,10ms"
#define S_CLOUD_RTT_US    20000
#define S_HIST_BW         1e9 /* priors of the edge's own history node (local, no link) */
#define S_HIST_RTT_US     200
#define S_SWEEP_LATENCY   "10ms"
#define S_DEADLINE_MS     120000
#define S_PROXY_SETTLE_MS 600    /* the proxy connects and pings its sources */
#define S_SLOW_BPS        50e6   /* below it, fetch-everything runs once (it takes seconds) */
#define S_NOISE           1.05   /* "never slower": ratios up to it count as equal (noise) */
#define S_BLAS_IDLE_US    300000 /* OpenBLAS's threads spin about 0.1 s before they sleep */

/* ---------------------------------------------------------------- options and state */

typedef struct {
    uint32_t contexts[S_MAX_CONTEXTS];
    size_t ncontexts;
    uint32_t prompt, max_new, runs;
    bool quick;
    const char *out;
    bool run_a, run_b, run_c, run_d, run_l, run_r;
    const char *shape;         /* --shape: the model shape of the synthetic weights */
    uint32_t learn_requests;   /* D: requests per series */
    const char *links;         /* C: the cloud links swept (NULL: all four) */
    double rates[S_MAX_RATES]; /* loads (multiples of cloud-only's capacity), or req/s */
    size_t nrates;
    bool absolute; /* rates are req/s (--rates) */
    uint32_t requests, edges;
    bool rss;
    bool verbose; /* every request's result on stderr */
    const char *bin;
} s_cfg_t;

static s_cfg_t s_cfg;

/* A shared context: its tokens, where it has been put, and the cloud-only service holding it. */
typedef struct {
    uint32_t n;
    int32_t *tok;
    kvedge_chunk_id_t ids[S_MAX_CHUNKS];
    size_t nids;
    kvedge_e2e_prefill_stats_t pre;
    bool on_cloud, on_history;
    kvedge_e2e_cloud_t *cloud;
} s_ctx_t;

static char s_dir[] = "/tmp/kvedge-be2e-XXXXXX";
static bool s_have_dir;
static char s_weights[320];
static char s_cloud_ep[320], s_hist_ep[320];
static pid_t s_cloud_pid;
static kvedge_decoder_t *s_dec;
static kvedge_model_t s_model;
static s_ctx_t s_ctx[S_MAX_CONTEXTS];

/* Children (store nodes, proxies): stopped on every exit path. */
#define S_MAX_PIDS 32
static pid_t s_pids[S_MAX_PIDS];
static int s_npids;

/* Clients the main thread holds: destroyed before exit (czmq aborts otherwise). */
#define S_MAX_CLIENTS 32
static kvedge_client_t *s_clients[S_MAX_CLIENTS];

static void s_cleanup(void)
{
    for (int i = 0; i < S_MAX_CLIENTS; i++)
        kvedge_client_destroy(&s_clients[i]);
    for (int i = 0; i < s_npids; i++)
        if (s_pids[i] > 0) {
            kill(s_pids[i], SIGTERM);
            waitpid(s_pids[i], NULL, 0);
            s_pids[i] = 0;
        }
    s_npids = 0;
    for (size_t i = 0; i < S_MAX_CONTEXTS; i++)
        kvedge_e2e_cloud_destroy(&s_ctx[i].cloud);
    if (s_have_dir) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_e2e: could not remove %s\n", s_dir);
        s_have_dir = false;
    }
}

/* SIGINT/SIGTERM/SIGHUP: only async-signal-safe calls; rm -rf runs as a child process. */
static void s_on_signal(int sig)
{
    for (int i = 0; i < s_npids; i++)
        if (s_pids[i] > 0) {
            kill(s_pids[i], SIGKILL);
            waitpid(s_pids[i], NULL, 0);
        }
    if (s_have_dir) {
        pid_t p = fork();
        if (p == 0) {
            char *const argv[] = {"rm", "-rf", s_dir, NULL};
            execv("/bin/rm", argv);
            _exit(127);
        }
        if (p > 0)
            waitpid(p, NULL, 0);
    }
    _exit(128 + sig);
}

static void s_die(const char *what, int rc)
{
    fprintf(stderr, "bench_e2e: %s: %s\n", what, rc ? kvedge_strerror(rc) : "failed");
    s_cleanup();
    exit(1);
}

static void s_check(int rc, const char *what)
{
    if (rc != 0)
        s_die(what, rc);
}

/* ---------------------------------------------------------------- deterministic inputs */

static uint64_t s_rng_next(uint64_t *s)
{
    /* xorshift64*: a fixed sequence, the same on every machine */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static uint64_t s_rng_seed(uint64_t a, uint64_t b)
{
    uint64_t s = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
    return s ? s : 1;
}

/* n tokens of the pseudo-random sequence `stream` (ids above OPT's specials). */
static void s_tokens(uint64_t stream, int32_t *out, uint32_t n)
{
    uint32_t vocab = kvedge_decoder_config(s_dec)->vocab;
    uint64_t s = s_rng_seed(S_TOKENS_SEED, stream);
    for (uint32_t i = 0; i < n; i++)
        out[i] = (int32_t)(KVEDGE_E2E_BYTE_TOKEN_BASE +
                           s_rng_next(&s) % (vocab - KVEDGE_E2E_BYTE_TOKEN_BASE));
}

/* The user prompt of request i: private to the edge, different per request. */
static void s_prompt(uint32_t i, int32_t *out)
{
    s_tokens(1000000u + i, out, s_cfg.prompt);
}

/* ---------------------------------------------------------------- processes */

/* Runs `kvedge ARGS...` and waits for its "listening" line; returns the pid. */
static pid_t s_spawn(char *const argv[])
{
    if (s_npids == S_MAX_PIDS)
        s_die("too many children", 0);
    pid_t pid = bench_spawn(s_cfg.bin, argv);
    if (pid < 0) {
        fprintf(stderr, "bench_e2e: %s %s did not start\n", s_cfg.bin, argv[1]);
        s_die("spawn", 0);
    }
    s_pids[s_npids++] = pid;
    return pid;
}

static void s_stop(pid_t pid)
{
    for (int i = 0; i < s_npids; i++)
        if (s_pids[i] == pid) {
            bench_stop(&pid);
            s_pids[i] = s_pids[--s_npids];
            return;
        }
}

static pid_t s_store(const char *name, const char *role, char *ep, size_t len)
{
    char data[340];
    snprintf(ep, len, "ipc://%s/%s.sock", s_dir, name);
    snprintf(data, sizeof data, "%s/%s", s_dir, name);
    char *argv[] = {"kvedge",     "--data",     data,     "store", "--role",
                    (char *)role, "--insecure", "--bind", ep,      "--log-level",
                    "error",      "--metrics",  "off",    NULL};
    return s_spawn(argv);
}

/* An edge proxy named name with the given source specs; ep receives its endpoint. */
static pid_t s_proxy(const char *name, const char *const *sources, size_t n, char *ep, size_t len)
{
    snprintf(ep, len, "ipc://%s/%s.sock", s_dir, name);
    char *argv[24];
    int k = 0;
    argv[k++] = "kvedge";
    argv[k++] = "proxy";
    argv[k++] = "--insecure";
    argv[k++] = "--bind";
    argv[k++] = ep;
    argv[k++] = "--log-level";
    argv[k++] = "error";
    argv[k++] = "--metrics";
    argv[k++] = "off";
    for (size_t i = 0; i < n && k < 22; i++) {
        argv[k++] = "--source";
        argv[k++] = (char *)sources[i];
    }
    argv[k] = NULL;
    pid_t pid = s_spawn(argv);
    struct timespec ts = {0, S_PROXY_SETTLE_MS * 1000000L};
    nanosleep(&ts, NULL);
    return pid;
}

static kvedge_client_t *s_connect_raw(const char *ep)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = S_DEADLINE_MS;
    kvedge_client_t *c = NULL;
    int rc = kvedge_client_connect(&o, &c);
    return rc == 0 ? c : NULL;
}

/* A client the main thread tracks (destroyed on every exit path); s_release drops it. */
static kvedge_client_t *s_connect(const char *ep)
{
    kvedge_client_t *c = s_connect_raw(ep);
    if (!c)
        s_die(ep, KVEDGE_ETIMEDOUT);
    for (int i = 0; i < S_MAX_CLIENTS; i++)
        if (!s_clients[i]) {
            s_clients[i] = c;
            return c;
        }
    kvedge_client_destroy(&c);
    s_die("too many clients", 0);
    return NULL;
}

static void s_release(kvedge_client_t **c)
{
    for (int i = 0; i < S_MAX_CLIENTS; i++)
        if (s_clients[i] == *c)
            s_clients[i] = NULL;
    kvedge_client_destroy(c);
}

/* "cloud cloud1 EP link=RATE,LAT bw=.. rtt=.." for a cloud link of rate (bits/s text). */
static void s_cloud_source(char *out, size_t len, const char *rate, double bits_per_s,
                           const char *latency, int rtt_us)
{
    snprintf(out, len, "cloud cloud1 %s link=%s,%s bw=%.0f rtt=%d", s_cloud_ep, rate, latency,
             bits_per_s / 8, rtt_us);
}

/* ---------------------------------------------------------------- contexts and requests */

static s_ctx_t *s_context(uint32_t n)
{
    for (size_t i = 0; i < S_MAX_CONTEXTS; i++) {
        s_ctx_t *x = &s_ctx[i];
        if (x->n == n)
            return x;
        if (x->n == 0) {
            x->n = n;
            x->tok = bench_alloc(n * sizeof *x->tok);
            s_tokens(n, x->tok, n); /* one sequence per length: contexts share no chunk */
            return x;
        }
    }
    s_die("too many contexts", 0);
    return NULL;
}

/* Cloud prefill of x to the node at ep (not part of any request's time). */
static void s_prefill(s_ctx_t *x, const char *ep, const char *what)
{
    kvedge_client_t *c = s_connect(ep);
    kvedge_e2e_quant_t q;
    kvedge_e2e_quant_default(&q);
    q.pin = true; /* the bench's contexts stay for its whole run */
    kvedge_e2e_prefill_stats_t st;
    double t0 = bench_now_s();
    s_check(kvedge_e2e_prefill(c, s_dec, &s_model, x->tok, x->n, 0, &q, x->ids, S_MAX_CHUNKS, &st),
            what);
    x->nids = st.n_chunks;
    if (!x->on_cloud && !x->on_history)
        x->pre = st;
    fprintf(stderr,
            "bench_e2e: %s: %u tokens, %llu blocks, %.1f MB (fp16 %.1f MB), prefill %.0f ms, "
            "encode %.0f ms, put %.0f ms, %.1f s in all\n",
            what, x->n, (unsigned long long)st.blocks, (double)st.bytes / 1e6,
            (double)st.fp16_bytes / 1e6, st.prefill_us / 1e3, st.encode_us / 1e3, st.put_us / 1e3,
            bench_now_s() - t0);
    s_release(&c);
}

static void s_on_cloud(s_ctx_t *x)
{
    if (!x->on_cloud) {
        s_prefill(x, s_cloud_ep, "cloud prefill");
        x->on_cloud = true;
    }
}

static void s_cloud_service(s_ctx_t *x)
{
    if (!x->cloud)
        s_check(kvedge_e2e_cloud_new(s_dec, x->tok, x->n, S_CLOUD_LINK, &x->cloud),
                "cloud-only service");
}

/* One request of prompt i on context x in mode; res is filled. Returns the decode's status. */
static int s_decode(kvedge_e2e_mode_t mode, s_ctx_t *x, uint32_t i, kvedge_client_t *proxy,
                    bool plan_recompute, uint32_t max_new, kvedge_e2e_result_t *res)
{
    int32_t *prompt = bench_alloc(s_cfg.prompt * sizeof *prompt);
    int32_t *out = bench_alloc(max_new * sizeof *out);
    s_prompt(i, prompt);
    kvedge_e2e_request_t req;
    memset(&req, 0, sizeof req);
    req.mode = mode;
    req.decoder = s_dec;
    req.ctx = x->tok;
    req.ctx_len = x->n;
    req.prompt = prompt;
    req.prompt_len = s_cfg.prompt;
    req.max_new = max_new;
    req.proxy = proxy;
    req.model = &s_model;
    req.plan_recompute = plan_recompute;
    req.deadline_ms = S_DEADLINE_MS;
    req.cloud = x->cloud;
    int rc = kvedge_e2e_decode(&req, out, res);
    if (s_cfg.verbose && rc == 0) {
        static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
        pthread_mutex_lock(&mu);
        fprintf(stderr, "--- %s, context %u, prompt %u%s\n", kvedge_e2e_mode_name(mode), x->n, i,
                mode == KVEDGE_E2E_KVEDGE && !plan_recompute ? ", fetch only" : "");
        kvedge_e2e_print(stderr, res, false);
        pthread_mutex_unlock(&mu);
    }
    free(prompt);
    free(out);
    return rc;
}

/* Layers of a kvedge result by where they came from: [0] computed, [1 + kind] delivered. */
static void s_layer_mix(const kvedge_e2e_result_t *r, uint32_t mix[5])
{
    memset(mix, 0, 5 * sizeof *mix);
    for (uint32_t l = 0; l < r->layers && l < KVEDGE_FETCH_MAX_LAYERS; l++) {
        if (r->layer[l].computed || r->layer[l].kind < 0 || r->layer[l].kind > 3)
            mix[0]++;
        else
            mix[1 + r->layer[l].kind]++;
    }
}

static FILE *s_data(const char *name)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", s_cfg.out, name);
    FILE *f = fopen(path, "w");
    if (!f)
        s_die(path, KVEDGE_EIO);
    return f;
}

/* ---------------------------------------------------------------- peak memory (child) */

static uint64_t s_status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t v = 0;
    size_t klen = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
            v = strtoull(line + klen + 1, NULL, 10);
            break;
        }
    if (f)
        fclose(f);
    return v;
}

/* The child of s_rss: loads the model, runs one request, prints "BASE_KB PEAK_KB" (resident
 * set after load, and its high-water mark during the request: the peak is reset after load
 * through /proc/self/clear_refs). args: MODE CTX_LEN PROXY_EP|-. */
static int s_child(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    kvedge_e2e_mode_t mode = (kvedge_e2e_mode_t)atoi(argv[0]);
    uint32_t n = (uint32_t)strtoul(argv[1], NULL, 10);
    s_dec = kvedge_decoder_new();
    if (!s_dec || kvedge_decoder_load(s_dec, s_weights, 0) != 0 ||
        kvedge_e2e_model(s_dec, s_cfg.shape, &s_model) != 0 || n == 0 || n > S_MAX_TOKENS)
        return 1;
    s_ctx_t *x = s_context(n);
    float cu, ru;
    if (kvedge_decoder_estimate(s_dec, n, s_cfg.prompt, &cu, &ru) != 0) /* its timing prefill */
        return 1;
    kvedge_client_t *c = strcmp(argv[2], "-") ? s_connect_raw(argv[2]) : NULL;
    if (strcmp(argv[2], "-") && !c)
        return 1;
    FILE *f = fopen("/proc/self/clear_refs", "w");
    bool reset = f && fputs("5", f) >= 0;
    if (f)
        reset = fclose(f) == 0 && reset;
    uint64_t base = s_status_kb("VmRSS");
    kvedge_e2e_result_t *res = bench_alloc(sizeof *res);
    int rc = s_decode(mode, x, 0, c, true, s_cfg.max_new, res);
    uint64_t peak = s_status_kb("VmHWM");
    kvedge_client_destroy(&c);
    free(res);
    kvedge_decoder_destroy(&s_dec);
    free(x->tok);
    if (rc != 0)
        return 1;
    printf("%llu %llu %d\n", (unsigned long long)base, (unsigned long long)peak, reset ? 1 : 0);
    return 0;
}

/* Runs one request of mode on context x in a fresh process (this binary, --child) and reads
 * its resident set after load and its peak during the request, in MB. false on failure. */
static bool s_rss(kvedge_e2e_mode_t mode, const s_ctx_t *x, const char *proxy_ep, double *base_mb,
                  double *peak_mb)
{
    char smode[16], sn[16], sp[16], snew[16];
    snprintf(smode, sizeof smode, "%d", (int)mode);
    snprintf(sn, sizeof sn, "%u", x->n);
    snprintf(sp, sizeof sp, "%u", s_cfg.prompt);
    snprintf(snew, sizeof snew, "%u", s_cfg.max_new);
    char *argv[] = {"bench_e2e",
                    "--prompt",
                    sp,
                    "--new",
                    snew,
                    "--weights",
                    s_weights,
                    "--shape",
                    (char *)s_cfg.shape,
                    "--child",
                    smode,
                    sn,
                    (char *)(proxy_ep ? proxy_ep : "-"),
                    NULL};
    int pfd[2];
    if (pipe(pfd) != 0)
        return false;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], STDOUT_FILENO);
        close(pfd[0]);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    close(pfd[1]);
    char buf[200];
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf - 1 && (r = read(pfd[0], buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = '\0';
    close(pfd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    unsigned long long b = 0, p = 0;
    int reset = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
        sscanf(buf, "%llu %llu %d", &b, &p, &reset) != 3 || !reset)
        return false;
    *base_mb = (double)b * 1024 / 1e6;
    *peak_mb = (double)p * 1024 / 1e6;
    return true;
}

/* ---------------------------------------------------------------- A: Table II */

enum { S_A_EDGE, S_A_CLOUD, S_A_KVEDGE, S_A_HISTORY, S_A_ROWS };
static const char *const s_a_names[S_A_ROWS] = {"edge-only", "cloud-only", "kvedge (cloud)",
                                                "kvedge (history)"};
static const kvedge_e2e_mode_t s_a_modes[S_A_ROWS] = {KVEDGE_E2E_LOCAL, KVEDGE_E2E_CLOUD_ONLY,
                                                      KVEDGE_E2E_KVEDGE, KVEDGE_E2E_KVEDGE};

typedef struct {
    double ttft[S_MAX_RUNS], total[S_MAX_RUNS];
    kvedge_e2e_result_t *last; /* bytes, memory and layer mix of the last run */
    double rss_base, rss_peak; /* MB; negative when not measured */
    uint32_t n;
} s_a_row_t;

static void s_a_record(s_a_row_t *row, const kvedge_e2e_result_t *res)
{
    row->ttft[row->n] = res->ttft_us / 1e3;
    row->total[row->n] = res->total_us / 1e3;
    row->n++;
    memcpy(row->last, res, sizeof *res);
}

/* A proxy for experiment A: the cloud behind S_CLOUD_LINK and the edge's history node. */
static pid_t s_a_proxy(const char *name, char *ep, size_t len)
{
    char cloud[700], hist[500];
    s_cloud_source(cloud, sizeof cloud, "1gbit", 1e9, "10ms", S_CLOUD_RTT_US);
    snprintf(hist, sizeof hist, "history hist1 %s bw=%.0f rtt=%d", s_hist_ep, S_HIST_BW,
             S_HIST_RTT_US);
    const char *src[] = {cloud, hist};
    return s_proxy(name, src, 2, ep, len);
}

static void s_run_a(void)
{
    printf("### A. One request at a time (CE-LSLM Table II)\n\n"
           "%s shape, synthetic weights (seed %d), fp32 CPU decoder; context tokens a fixed "
           "pseudo-random sequence, prompt %u tokens, %u new tokens (greedy). The cloud node "
           "holds the context as int8 blocks (cloud prefill, not timed), behind an emulated "
           "%s link (one way; both directions); the edge's history node is local. Rows: "
           "edge-only recomputes the context on the edge; cloud-only sends the prompt to the "
           "emulated cloud model (context K/V already in its memory, one request at a time, "
           "behind the same link); kvedge (cloud) fetches the context's K/V through the edge "
           "proxy (sources: cloud, history node without the context; recomputation priced); "
           "kvedge (history) the same once the history node also holds it. Memory: weights = "
           "the edge decoder's fp32 weights, KV = context + local K/V and staging held for the "
           "request, RSS = resident set of a fresh process after loading the model -> its "
           "peak during one request. Medians of %u runs after one warm-up each, modes "
           "interleaved. Every process shares this machine's %ld cores.\n\n",
           s_cfg.shape, S_WEIGHTS_SEED, s_cfg.prompt, s_cfg.max_new, S_CLOUD_LINK, s_cfg.runs,
           sysconf(_SC_NPROCESSORS_ONLN));
    printf("| context | mode | TTFT ms | total ms | edge-only TTFT / TTFT | layers cloud / history "
           "/ computed | weights MB | KV MB | RSS MB load -> peak | sent bytes | received MB | "
           "prompt bytes sent |\n"
           "|---:|---|---:|---:|---:|---|---:|---:|---|---:|---:|---|\n");
    fflush(stdout);
    FILE *dat = s_data("e2e_table2.dat");
    fprintf(dat,
            "# TTFT (columns 2-5) and total time (6-9), ms, medians of %u runs\n"
            "context \"edge-only\" \"cloud-only\" \"kvedge (cloud)\" \"kvedge (history)\" "
            "\"edge-only\" \"cloud-only\" \"kvedge (cloud)\" \"kvedge (history)\"\n",
            s_cfg.runs);
    double goal_ratio = -1;
    uint32_t goal_ctx = 0;
    for (size_t ci = 0; ci < s_cfg.ncontexts; ci++) {
        s_ctx_t *x = s_context(s_cfg.contexts[ci]);
        s_on_cloud(x);
        s_cloud_service(x);
        s_a_row_t rows[S_A_ROWS];
        memset(rows, 0, sizeof rows);
        for (int r = 0; r < S_A_ROWS; r++) {
            rows[r].last = bench_alloc(sizeof *rows[r].last);
            memset(rows[r].last, 0, sizeof *rows[r].last);
            rows[r].rss_base = rows[r].rss_peak = -1;
        }
        kvedge_e2e_result_t *res = bench_alloc(sizeof *res);
        char ep[400];
        pid_t px = s_a_proxy("proxy-a", ep, sizeof ep);
        kvedge_client_t *c = s_connect(ep);
        for (int r = S_A_EDGE; r <= S_A_KVEDGE; r++) /* warm-up: the proxy learns its sources */
            s_check(s_decode(s_a_modes[r], x, 0, c, true, s_cfg.max_new, res), s_a_names[r]);
        for (uint32_t k = 0; k < s_cfg.runs; k++)
            for (int r = S_A_EDGE; r <= S_A_KVEDGE; r++) {
                s_check(s_decode(s_a_modes[r], x, 1 + k, c, true, s_cfg.max_new, res),
                        s_a_names[r]);
                s_a_record(&rows[r], res);
            }
        if (s_cfg.rss) {
            if (!s_rss(KVEDGE_E2E_LOCAL, x, NULL, &rows[S_A_EDGE].rss_base,
                       &rows[S_A_EDGE].rss_peak) ||
                !s_rss(KVEDGE_E2E_KVEDGE, x, ep, &rows[S_A_KVEDGE].rss_base,
                       &rows[S_A_KVEDGE].rss_peak))
                fprintf(stderr, "bench_e2e: peak RSS not measured (child failed)\n");
        }
        s_release(&c);
        s_stop(px);
        /* The edge has kept this context in its history node (as after an earlier request):
         * a fresh proxy, so no negative entry from the first phase remains. */
        if (!x->on_history) {
            s_prefill(x, s_hist_ep, "history prefill");
            x->on_history = true;
        }
        px = s_a_proxy("proxy-ah", ep, sizeof ep);
        c = s_connect(ep);
        s_check(s_decode(KVEDGE_E2E_KVEDGE, x, 0, c, true, s_cfg.max_new, res), "history");
        for (uint32_t k = 0; k < s_cfg.runs; k++) {
            s_check(s_decode(KVEDGE_E2E_KVEDGE, x, 1 + k, c, true, s_cfg.max_new, res), "history");
            s_a_record(&rows[S_A_HISTORY], res);
        }
        s_release(&c);
        s_stop(px);

        double med_ttft[S_A_ROWS], med_total[S_A_ROWS];
        for (int r = 0; r < S_A_ROWS; r++) {
            med_ttft[r] = bench_median(rows[r].ttft, rows[r].n);
            med_total[r] = bench_median(rows[r].total, rows[r].n);
        }
        for (int r = 0; r < S_A_ROWS; r++) {
            const kvedge_e2e_result_t *l = rows[r].last;
            uint32_t mix[5];
            char layers[64] = "-", rss[64] = "-";
            if (s_a_modes[r] == KVEDGE_E2E_KVEDGE) {
                s_layer_mix(l, mix);
                snprintf(layers, sizeof layers, "%u / %u / %u", mix[1 + 2], mix[1 + 3], mix[0]);
            } else if (s_a_modes[r] == KVEDGE_E2E_LOCAL) {
                snprintf(layers, sizeof layers, "0 / 0 / %u", l->layers);
            }
            if (rows[r].rss_base >= 0)
                snprintf(rss, sizeof rss, "%.0f -> %.0f", rows[r].rss_base, rows[r].rss_peak);
            uint64_t prompt_bytes = (uint64_t)s_cfg.prompt * KVEDGE_E2E_TOKEN_WIRE_BYTES;
            printf("| %u | %s | %.1f | %.1f | %.2f | %s | %.1f | %.1f | %s | %llu | %.3f | "
                   "%llu of %llu (%.0f %%) |\n",
                   x->n, s_a_names[r], med_ttft[r], med_total[r], med_ttft[S_A_EDGE] / med_ttft[r],
                   layers, (double)l->weights_bytes / 1e6, (double)l->kv_bytes / 1e6, rss,
                   (unsigned long long)l->sent_bytes, (double)l->received_bytes / 1e6,
                   (unsigned long long)l->prompt_bytes_sent, (unsigned long long)prompt_bytes,
                   100.0 * (double)l->prompt_bytes_sent / (double)prompt_bytes);
        }
        fflush(stdout);
        fprintf(dat, "%u", x->n);
        for (int r = 0; r < S_A_ROWS; r++)
            fprintf(dat, " %.2f", med_ttft[r]);
        for (int r = 0; r < S_A_ROWS; r++)
            fprintf(dat, " %.2f", med_total[r]);
        fprintf(dat, "\n");
        if (x->n == 1024 || (goal_ctx != 1024 && x->n > goal_ctx)) {
            goal_ctx = x->n;
            goal_ratio = med_ttft[S_A_EDGE] / med_ttft[S_A_KVEDGE];
        }
        for (int r = 0; r < S_A_ROWS; r++)
            free(rows[r].last);
        free(res);
    }
    fclose(dat);
    printf("\nContexts put to the cloud: int8 blocks, %.2f MB per context of %u tokens "
           "(%.2f MB as fp16).\n",
           (double)s_ctx[0].pre.bytes / 1e6, s_ctx[0].n, (double)s_ctx[0].pre.fp16_bytes / 1e6);
    if (goal_ctx)
        printf("Goal: TTFT edge-only / kvedge (cloud) >= 3 at %u tokens, %s, int8: %.2f, %s.\n\n",
               goal_ctx, S_CLOUD_LINK, goal_ratio, goal_ratio >= 3 ? "met" : "missed");
    fflush(stdout);
}

/* ---------------------------------------------------------------- B: Poisson arrivals */

typedef struct {
    double arrival;          /* seconds after the point's start */
    double start, ttft, end; /* seconds after the point's start */
    int status;
} s_job_t;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    s_job_t *jobs;
    size_t n, released, taken;
    bool closed;
    double t0;
    kvedge_e2e_mode_t mode;
    s_ctx_t *x;
    uint32_t first_prompt;
} s_load_t;

typedef struct {
    s_load_t *load;
    kvedge_client_t *proxy; /* kvedge workers; NULL for cloud-only */
    pthread_t th;
} s_worker_t;

static void *s_worker(void *arg)
{
    s_worker_t *w = arg;
    s_load_t *L = w->load;
    kvedge_e2e_result_t *res = bench_alloc(sizeof *res);
    for (;;) {
        pthread_mutex_lock(&L->mu);
        while (L->taken == L->released && !L->closed)
            pthread_cond_wait(&L->cv, &L->mu);
        if (L->taken == L->released) {
            pthread_mutex_unlock(&L->mu);
            break;
        }
        s_job_t *j = &L->jobs[L->taken++];
        uint32_t prompt = L->first_prompt + (uint32_t)(j - L->jobs);
        pthread_mutex_unlock(&L->mu);
        j->start = bench_now_s() - L->t0;
        j->status = s_decode(L->mode, L->x, prompt, w->proxy, true, s_cfg.max_new, res);
        j->end = bench_now_s() - L->t0;
        j->ttft = j->start + res->ttft_us / 1e6;
    }
    free(res);
    return NULL;
}

static void s_sleep_until(double t)
{
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

typedef struct {
    double lat_mean, lat_p50, lat_p95, ttft_p50, ttft_p95, tput, span;
} s_point_t;

/* Releases n requests at the given arrival times to nworkers workers (a shared FIFO queue)
 * and waits for all of them. */
static s_point_t s_load_run(kvedge_e2e_mode_t mode, s_ctx_t *x, kvedge_client_t **proxies,
                            size_t nworkers, const double *arrivals, size_t n,
                            uint32_t first_prompt)
{
    s_load_t L;
    memset(&L, 0, sizeof L);
    pthread_mutex_init(&L.mu, NULL);
    pthread_cond_init(&L.cv, NULL);
    L.jobs = bench_alloc(n * sizeof *L.jobs);
    memset(L.jobs, 0, n * sizeof *L.jobs);
    L.n = n;
    L.mode = mode;
    L.x = x;
    L.first_prompt = first_prompt;
    s_worker_t *w = bench_alloc(nworkers * sizeof *w);
    L.t0 = bench_now_s();
    for (size_t i = 0; i < nworkers; i++) {
        w[i].load = &L;
        w[i].proxy = proxies ? proxies[i] : NULL;
        if (pthread_create(&w[i].th, NULL, s_worker, &w[i]) != 0)
            s_die("pthread_create", 0);
    }
    for (size_t i = 0; i < n; i++) {
        L.jobs[i].arrival = arrivals[i];
        s_sleep_until(L.t0 + arrivals[i]);
        pthread_mutex_lock(&L.mu);
        L.released++;
        pthread_cond_signal(&L.cv);
        pthread_mutex_unlock(&L.mu);
    }
    pthread_mutex_lock(&L.mu);
    L.closed = true;
    pthread_cond_broadcast(&L.cv);
    pthread_mutex_unlock(&L.mu);
    for (size_t i = 0; i < nworkers; i++)
        pthread_join(w[i].th, NULL);
    free(w);
    double *lat = bench_alloc(n * sizeof *lat), *ttft = bench_alloc(n * sizeof *ttft);
    double sum = 0, last = 0;
    for (size_t i = 0; i < n; i++) {
        s_check(L.jobs[i].status, kvedge_e2e_mode_name(mode));
        lat[i] = L.jobs[i].end - L.jobs[i].arrival;
        ttft[i] = L.jobs[i].ttft - L.jobs[i].arrival;
        sum += lat[i];
        last = L.jobs[i].end > last ? L.jobs[i].end : last;
    }
    s_point_t p;
    p.lat_mean = sum / (double)n;
    p.lat_p50 = bench_median(lat, n);
    p.lat_p95 = bench_quantile(lat, n, 0.95);
    p.ttft_p50 = bench_median(ttft, n);
    p.ttft_p95 = bench_quantile(ttft, n, 0.95);
    p.span = last - arrivals[0];
    p.tput = (double)n / p.span;
    free(lat);
    free(ttft);
    free(L.jobs);
    pthread_mutex_destroy(&L.mu);
    pthread_cond_destroy(&L.cv);
    return p;
}

/* n Poisson arrival times at rate per second (exponential gaps, fixed seed per stream). */
static void s_arrivals(double rate, uint64_t stream, double *out, size_t n)
{
    uint64_t s = s_rng_seed(S_ARRIVALS_SEED, stream);
    double t = 0;
    for (size_t i = 0; i < n; i++) {
        double u = ((double)(s_rng_next(&s) >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
        t += -log(u) / rate;
        out[i] = t;
    }
}

static void s_run_b(void)
{
    size_t E = s_cfg.edges, N = s_cfg.requests;
    printf("### B. Poisson arrivals (CE-LSLM Fig. 7, EdgePrompt Figs. 4-5)\n\n"
           "%zu requests per point, exponential inter-arrival times (fixed seed; the same "
           "arrivals for both systems at a rate), prompt %u tokens, %u new tokens. kvedge: %zu "
           "edge workers (threads sharing one decoder, each with its own decoder session, its "
           "own edge proxy and its own %s link to the cloud node), fed from one FIFO queue; "
           "every request fetches its context's K/V from the cloud node through its proxy "
           "(recomputation priced) and decodes on its edge. cloud-only: the one emulated "
           "cloud model (context K/V in its memory) serving one request at a time behind the "
           "same link; requests wait in its queue. Latency = arrival to last token, TTFT = "
           "arrival to first token (queueing included), throughput = requests / (last "
           "completion - first arrival). %s **On this machine the edges, the cloud node, the "
           "proxies and the cloud model all share the same %ld cores**: the edges are not "
           "independent devices, and the cloud is no faster than an edge.\n\n",
           N, s_cfg.prompt, s_cfg.max_new, E, S_CLOUD_LINK,
           s_cfg.absolute ? "Rates as given (--rates)."
                          : "Rates: load x the cloud model's capacity, 1 / (its time for one "
                            "request alone, measured just before at that context).",
           sysconf(_SC_NPROCESSORS_ONLN));
    printf("| context | load | req/s | system | latency mean ms | p50 ms | p95 ms | TTFT p50 ms "
           "| TTFT p95 ms | throughput req/s |\n"
           "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|\n");
    fflush(stdout);
    FILE *dat = s_data("e2e_poisson.dat");
    fprintf(dat, "# one block per (system, context): rate, latency mean / p50 / p95 ms, "
                 "TTFT p50 / p95 ms, throughput req/s\n");
    double *arr = bench_alloc(N * sizeof *arr);
    s_point_t *pts = bench_alloc(2 * s_cfg.nrates * sizeof *pts);
    double *rate = bench_alloc(s_cfg.nrates * sizeof *rate);
    bool first_block = true;
    for (size_t ci = 0; ci < s_cfg.ncontexts; ci++) {
        s_ctx_t *x = s_context(s_cfg.contexts[ci]);
        s_on_cloud(x);
        s_cloud_service(x);
        pid_t px[S_MAX_EDGES];
        kvedge_client_t *cl[S_MAX_EDGES];
        kvedge_e2e_result_t *res = bench_alloc(sizeof *res);
        char cloud[700];
        s_cloud_source(cloud, sizeof cloud, "1gbit", 1e9, "10ms", S_CLOUD_RTT_US);
        const char *src[] = {cloud};
        for (size_t e = 0; e < E; e++) {
            char name[32], ep[400];
            snprintf(name, sizeof name, "proxy-b%zu", e);
            px[e] = s_proxy(name, src, 1, ep, sizeof ep);
            cl[e] = s_connect(ep);
            s_check(s_decode(KVEDGE_E2E_KVEDGE, x, 0, cl[e], true, s_cfg.max_new, res), "warm-up");
        }
        s_check(s_decode(KVEDGE_E2E_CLOUD_ONLY, x, 0, NULL, true, s_cfg.max_new, res), "warm-up");
        /* Requests alone (medians of --runs): the cloud model's capacity sets the rates. */
        double ac[S_MAX_RUNS], ak[S_MAX_RUNS];
        for (uint32_t k = 0; k < s_cfg.runs; k++) {
            s_check(s_decode(KVEDGE_E2E_CLOUD_ONLY, x, 1 + k, NULL, true, s_cfg.max_new, res),
                    "cloud-only alone");
            ac[k] = res->total_us / 1e6;
            s_check(s_decode(KVEDGE_E2E_KVEDGE, x, 1 + k, cl[k % E], true, s_cfg.max_new, res),
                    "kvedge alone");
            ak[k] = res->total_us / 1e6;
        }
        double alone_cloud = bench_median(ac, s_cfg.runs),
               alone_kvedge = bench_median(ak, s_cfg.runs);
        double mu = 1 / alone_cloud;
        free(res);
        printf("| %u | - | - | one request alone: kvedge %.0f ms, cloud-only %.0f ms; cloud "
               "capacity %.2f req/s | | | | | | |\n",
               x->n, alone_kvedge * 1e3, alone_cloud * 1e3, mu);
        for (size_t ri = 0; ri < s_cfg.nrates; ri++) {
            rate[ri] = s_cfg.absolute ? s_cfg.rates[ri] : s_cfg.rates[ri] * mu;
            s_arrivals(rate[ri], ri * 1000 + x->n, arr, N);
            pts[2 * ri] = s_load_run(KVEDGE_E2E_KVEDGE, x, cl, E, arr, N, 100);
            pts[2 * ri + 1] = s_load_run(KVEDGE_E2E_CLOUD_ONLY, x, NULL, N, arr, N, 100);
            for (int s = 0; s < 2; s++) {
                const s_point_t *p = &pts[2 * ri + (size_t)s];
                printf("| %u | %.2f | %.3f | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.3f |\n",
                       x->n, rate[ri] / mu, rate[ri], s ? "cloud-only" : "kvedge",
                       p->lat_mean * 1e3, p->lat_p50 * 1e3, p->lat_p95 * 1e3, p->ttft_p50 * 1e3,
                       p->ttft_p95 * 1e3, p->tput);
            }
            fflush(stdout);
        }
        for (int s = 0; s < 2; s++) {
            fprintf(dat,
                    "%s# %s, context %u\nrate \"%s, %u tokens\" p50 p95 ttft_p50 ttft_p95 "
                    "throughput load\n",
                    first_block ? "" : "\n\n", s ? "cloud-only" : "kvedge", x->n,
                    s ? "cloud-only" : "kvedge", x->n);
            first_block = false;
            for (size_t ri = 0; ri < s_cfg.nrates; ri++) {
                const s_point_t *p = &pts[2 * ri + (size_t)s];
                fprintf(dat, "%.4f %.2f %.2f %.2f %.2f %.2f %.4f %.3f\n", rate[ri],
                        p->lat_mean * 1e3, p->lat_p50 * 1e3, p->lat_p95 * 1e3, p->ttft_p50 * 1e3,
                        p->ttft_p95 * 1e3, p->tput, rate[ri] / mu);
            }
        }
        for (size_t e = 0; e < E; e++) {
            s_release(&cl[e]);
            s_stop(px[e]);
        }
    }
    free(arr);
    free(pts);
    free(rate);
    fclose(dat);
    printf("\n");
    fflush(stdout);
}

/* ---------------------------------------------------------------- C: link sweep */

/* Milliseconds until every layer of x is resident at the edge through the proxy client c,
 * fetched only (no decoder running): the transfer path alone (link, proxy, client, CPU
 * dequantize into the decoder's fp32 layout, as kvedge mode does). */
/* CPU time of every thread of process pid (0: this one) so far, ms: the sum of the first
 * field of /proc/PID/task/TID/schedstat (ns on the CPU). NAN when it cannot be read. */
static double s_cpu_ms(pid_t pid)
{
    char dir[64];
    if (pid > 0)
        snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
    else
        snprintf(dir, sizeof dir, "/proc/self/task");
    DIR *d = opendir(dir);
    if (!d)
        return NAN;
    double ns = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char path[400];
        snprintf(path, sizeof path, "%s/%s/schedstat", dir, e->d_name);
        FILE *f = fopen(path, "r");
        unsigned long long t = 0;
        if (f && fscanf(f, "%llu", &t) == 1)
            ns += (double)t;
        if (f)
            fclose(f);
    }
    closedir(d);
    return ns / 1e6;
}

/* The fetch path's CPU over one transfer-alone request, ms: the cloud node, the proxy and this
 * process (the client's threads and the loader; the decoder idle). */
typedef struct {
    double node, proxy, client;
} s_fetch_cpu_t;

static double s_transfer_alone(kvedge_client_t *c, const s_ctx_t *x, pid_t proxy,
                               s_fetch_cpu_t *cpu)
{
    const kvedge_decoder_config_t *dc = kvedge_decoder_config(s_dec);
    const uint32_t L = dc->layers;
    const size_t kvf = kvedge_decoder_kv_floats(s_dec, x->n);
    float *k = bench_alloc((size_t)L * kvf * sizeof *k),
          *v = bench_alloc((size_t)L * kvf * sizeof *v);
    kvedge_kv_dst_t *kd = bench_alloc(L * sizeof *kd), *vd = bench_alloc(L * sizeof *vd);
    for (uint32_t l = 0; l < L; l++) {
        kvedge_kv_dst_t t;
        memset(&t, 0, sizeof t);
        t.layout = KVEDGE_KV_CONTIG;
        t.dtype = KVEDGE_DTYPE_FP32;
        t.base = k + (size_t)l * kvf;
        t.cap_bytes = kvf * sizeof(float);
        t.heads = kvedge_decoder_kv_heads(s_dec);
        t.head_dim = dc->head_dim;
        t.tokens_cap = x->n;
        kd[l] = t;
        t.base = v + (size_t)l * kvf;
        vd[l] = t;
    }
    kvedge_pipeline_opts_t o;
    kvedge_pipeline_opts_default(&o);
    o.client = c;
    o.model = &s_model;
    o.chunks = x->ids;
    o.n_chunks = x->nids;
    o.chunk_tokens = KVEDGE_E2E_CHUNK_TOKENS_DEFAULT;
    o.tokens = x->n;
    o.layers = (uint16_t)L;
    o.k = kd;
    o.v = vd;
    o.deadline_ms = S_DEADLINE_MS;
    kvedge_pipeline_t *pipe = NULL;
    /* OpenBLAS's idle threads spin for a while after the last decode: let them sleep, so the
     * CPU counted here is the fetch path's. */
    usleep(S_BLAS_IDLE_US);
    const double n0 = s_cpu_ms(s_cloud_pid), p0 = s_cpu_ms(proxy), c0 = s_cpu_ms(0);
    double t0 = bench_now_s();
    s_check(kvedge_pipeline_open(&o, &pipe), "transfer alone");
    for (uint32_t l = 0; l < L; l++) {
        int rc = kvedge_pipeline_wait(pipe, (uint16_t)l);
        if (rc != 0) {
            kvedge_pipeline_destroy(&pipe);
            s_die("transfer alone: layer", rc);
        }
    }
    double ms = (bench_now_s() - t0) * 1e3;
    cpu->node = s_cpu_ms(s_cloud_pid) - n0;
    cpu->proxy = s_cpu_ms(proxy) - p0;
    cpu->client = s_cpu_ms(0) - c0;
    kvedge_pipeline_destroy(&pipe);
    free(kd);
    free(vd);
    free(k);
    free(v);
    return ms;
}

/* Of a kvedge result: the decoder's busy time (layers, then the rest up to the first token)
 * and its time waiting for layers, ms. */
static void s_busy_wait(const kvedge_e2e_result_t *r, double *busy, double *wait)
{
    double b = 0, w = 0, prev = 0;
    for (uint32_t l = 0; l < r->layers; l++) {
        w += r->layer[l].ready_us - prev;
        b += r->layer[l].done_us - r->layer[l].ready_us;
        prev = r->layer[l].done_us;
    }
    b += r->ttft_us - prev;
    *busy = b / 1e3;
    *wait = w / 1e3;
}

/* C's --links: a comma-separated subset of its four rates. */
static bool s_link_wanted(const char *rate)
{
    if (!s_cfg.links)
        return true;
    size_t n = strlen(rate);
    for (const char *p = s_cfg.links; *p;) {
        const char *e = strchr(p, ',');
        size_t k = e ? (size_t)(e - p) : strlen(p);
        if (k == n && strncmp(p, rate, n) == 0)
            return true;
        p += k + (e != NULL);
    }
    return false;
}

static void s_run_c(void)
{
    uint32_t n = 0;
    for (size_t i = 0; i < s_cfg.ncontexts; i++)
        n = s_cfg.contexts[i] > n ? s_cfg.contexts[i] : n;
    s_ctx_t *x = s_context(n);
    s_on_cloud(x);
    float cu = 0, ru = 0;
    s_check(kvedge_decoder_estimate(s_dec, n, s_cfg.prompt, &cu, &ru), "estimate");
    uint32_t L = kvedge_decoder_config(s_dec)->layers;
    static const char *rates[] = {"10mbit", "100mbit", "1gbit", "10gbit"};
    static const double bps[] = {10e6, 100e6, 1e9, 10e9};
    const size_t nb = sizeof rates / sizeof rates[0];
    printf("### C. TTFT against the Eq. 20 bound as the cloud link is swept\n\n"
           "Context %u tokens (int8 on the cloud node, %.2f MB), prompt %u tokens, TTFT only "
           "(1 new token). Cloud link swept at %s one way; a fresh edge proxy per bandwidth "
           "with the cloud node as its only source. kvedge: recomputation priced (the "
           "decoder's estimates: %.1f ms per layer over the prompt, %.1f ms more to compute a "
           "layer's context K/V, %u layers). fetch-all: the same proxy, recomputation not "
           "priced (every layer fetched, the decoder runs each layer as it arrives). edge-only: "
           "every layer recomputed (does not depend on the link). bound: the Eq. 20 bound of "
           "kvedge's plan (the proxy's PLAN, priced with its measured links and the decoder's "
           "estimates); plan T: the plan's own predicted time. yielded: fetched layers the "
           "decoder computed on fewer BLAS threads, the next layer not yet there "
           "(kvedge_decoder_share_cores). kvedge busy / waiting: its "
           "decoder's time computing (layers, LM head) and waiting for layers. transfer "
           "alone: every layer fetched and resident at the edge with no decoder running (the "
           "path link -> proxy -> client -> dequantize, as kvedge mode uses it). Medians of %u "
           "runs after one warm-up (fetch-all below %.0f Mbit/s: 1 run, transfer alone not "
           "run).\n\n",
           n, (double)x->pre.bytes / 1e6, s_cfg.prompt, S_SWEEP_LATENCY, cu / 1e3, ru / 1e3, L,
           s_cfg.runs, S_SLOW_BPS / 1e6);
    printf(
        "| cloud link | proxy's link MB/s | layers fetched / computed (yielded) | kvedge TTFT ms | "
        "kvedge busy / waiting ms | Eq. 20 bound ms | plan T ms | kvedge/bound | edge-only "
        "ms | fetch-all ms | transfer alone ms | kvedge/min(edge-only, fetch-all) |\n"
        "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
    fflush(stdout);
    kvedge_e2e_result_t *res = bench_alloc(sizeof *res);
    double edge[S_MAX_RUNS];
    s_check(s_decode(KVEDGE_E2E_LOCAL, x, 0, NULL, true, 1, res), "edge-only");
    for (uint32_t k = 0; k < s_cfg.runs; k++) {
        s_check(s_decode(KVEDGE_E2E_LOCAL, x, 1 + k, NULL, true, 1, res), "edge-only");
        edge[k] = res->ttft_us / 1e3;
    }
    double EO = bench_median(edge, s_cfg.runs);
    FILE *dat = s_data("e2e_sweep.dat");
    fprintf(dat, "# cloud link bits/s, label, kvedge TTFT, Eq. 20 bound, edge-only, fetch-all, "
                 "transfer alone (ms; NaN: not run)\nbps label kvedge bound recompute fetchall "
                 "transfer\n");
    int miss_bound = 0, miss_best = 0, below_bound = 0;
    char cpus[4][160];
    size_t ncpus = 0;
    for (size_t i = 0; i < nb; i++) {
        if (!s_link_wanted(rates[i]))
            continue;
        char src_spec[700], ep[400];
        s_cloud_source(src_spec, sizeof src_spec, rates[i], bps[i], S_SWEEP_LATENCY,
                       S_CLOUD_RTT_US);
        const char *src[] = {src_spec};
        pid_t px = s_proxy("proxy-c", src, 1, ep, sizeof ep);
        kvedge_client_t *c = s_connect(ep);
        uint32_t fa_runs = bps[i] < S_SLOW_BPS ? 1 : s_cfg.runs;
        double kv[S_MAX_RUNS], busy[S_MAX_RUNS], wait[S_MAX_RUNS], bound[S_MAX_RUNS],
            plan[S_MAX_RUNS], fa[S_MAX_RUNS], tr[S_MAX_RUNS], cn[S_MAX_RUNS], cp[S_MAX_RUNS],
            cc[S_MAX_RUNS];
        double link_bw = 0;
        uint32_t mix[5] = {0};
        double yl[S_MAX_RUNS];
        s_check(s_decode(KVEDGE_E2E_KVEDGE, x, 0, c, true, 1, res), "kvedge warm-up");
        for (uint32_t k = 0; k < s_cfg.runs; k++) {
            s_check(s_decode(KVEDGE_E2E_KVEDGE, x, 1 + k, c, true, 1, res), "kvedge");
            kv[k] = res->ttft_us / 1e3;
            s_busy_wait(res, &busy[k], &wait[k]);
            bound[k] = res->have_plan ? res->plan.bound_us / 1e3 : NAN;
            plan[k] = res->have_plan ? res->plan.total_us / 1e3 : NAN;
            if (res->have_plan && res->plan.nsources > 0)
                link_bw = res->plan.source[0].bw_bytes_per_s / 1e6;
            s_layer_mix(res, mix);
            yl[k] = 0;
            for (uint32_t l = 0; l < res->layers; l++)
                yl[k] += res->layer[l].yielded;
            if (k < fa_runs) {
                s_check(s_decode(KVEDGE_E2E_KVEDGE, x, 1 + k, c, false, 1, res), "fetch-all");
                fa[k] = res->ttft_us / 1e3;
                s_fetch_cpu_t cpu = {NAN, NAN, NAN};
                tr[k] = bps[i] < S_SLOW_BPS ? NAN : s_transfer_alone(c, x, px, &cpu);
                cn[k] = cpu.node;
                cp[k] = cpu.proxy;
                cc[k] = cpu.client;
            }
        }
        s_release(&c);
        s_stop(px);
        double K = bench_median(kv, s_cfg.runs), BU = bench_median(busy, s_cfg.runs),
               W = bench_median(wait, s_cfg.runs), B = bench_median(bound, s_cfg.runs),
               P = bench_median(plan, s_cfg.runs), F = bench_median(fa, fa_runs),
               TR = bps[i] < S_SLOW_BPS ? NAN : bench_median(tr, fa_runs);
        char trs[32] = "-";
        if (!isnan(TR))
            snprintf(trs, sizeof trs, "%.1f", TR);
        double best = EO < F ? EO : F;
        printf(
            "| %s, %s | %.1f | %u / %u (%.0f) | %.1f | %.1f / %.1f | %.1f | %.1f | %.2f | %.1f | "
            "%.1f | %s | %.2f |\n",
            rates[i], S_SWEEP_LATENCY, link_bw, L - mix[0], mix[0], bench_median(yl, s_cfg.runs), K,
            BU, W, B, P, K / B, EO, F, trs, K / best);
        fflush(stdout);
        if (!isnan(TR))
            snprintf(
                cpus[ncpus++], sizeof cpus[0],
                "| %s, %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f |\n", rates[i], S_SWEEP_LATENCY,
                TR, bench_median(cn, fa_runs), bench_median(cp, fa_runs), bench_median(cc, fa_runs),
                bench_median(cn, fa_runs) + bench_median(cp, fa_runs) + bench_median(cc, fa_runs),
                (bench_median(cn, fa_runs) + bench_median(cp, fa_runs) +
                 bench_median(cc, fa_runs)) /
                    TR);
        fprintf(dat, "%.0f \"%s\" %.2f %.2f %.2f %.2f %.2f\n", bps[i], rates[i], K, B, EO, F, TR);
        if (!(K <= 1.10 * B))
            miss_bound = 1;
        if (K < 0.90 * B)
            below_bound = 1;
        if (K > S_NOISE * best)
            miss_best = 1;
    }
    fclose(dat);
    free(res);
    if (ncpus > 0) {
        printf(
            "\nThe fetch path's CPU over one transfer alone (medians; ms on the CPU, every "
            "thread of the process: /proc/PID/task/*/schedstat). The decoder computes on the "
            "same cores.\n\n| cloud link | transfer alone ms | cloud node ms | proxy ms | "
            "client ms | fetch path CPU ms | cores busy |\n|---|---:|---:|---:|---:|---:|---:|\n");
        for (size_t i = 0; i < ncpus; i++)
            printf("%s", cpus[i]);
    }
    printf("\nDecoder time per layer: estimated %.1f ms (%.1f over the prompt + %.1f to compute "
           "the context's K/V), measured %.1f ms (edge-only TTFT / %u layers, LM head "
           "included).\n",
           (cu + ru) / 1e3, cu / 1e3, ru / 1e3, EO / L, L);
    printf("Goals: kvedge never slower than min(edge-only, fetch-all) (%.0f %% allowed for "
           "run-to-run noise): %s; within 10 %% of the Eq. 20 bound: %s.%s\n\n",
           (S_NOISE - 1) * 100,
           miss_best ? "missed at some point (see the ratios)" : "met at every point",
           miss_bound ? "missed at some point (see the ratios)" : "met at every point",
           below_bound ? " Below 0.90 of the bound somewhere: the bound is priced from the "
                         "decoder's estimates and the proxy's link figures; where those are off, "
                         "it is not a bound."
                       : "");
    fflush(stdout);
}

/* ---------------------------------------------------------------- D: learned speed */

/* One series of D: requests 1..R of prompts `first`.. on x through c, TTFT only; with forget,
 * the model's learned speed is dropped before each request (the one-time calibration). */
static void s_d_series(s_ctx_t *x, kvedge_client_t *c, bool forget, uint32_t first,
                       kvedge_e2e_result_t *res, double *ttft, double *plan, uint32_t mix[5])
{
    kvedge_decoder_forget(s_dec);
    for (uint32_t k = 0; k < s_cfg.learn_requests; k++) {
        if (forget)
            kvedge_decoder_forget(s_dec);
        s_check(s_decode(KVEDGE_E2E_KVEDGE, x, first + k, c, true, 1, res), "kvedge");
        ttft[k] = res->ttft_us / 1e3;
        plan[k] = res->have_plan ? res->plan.total_us / 1e3 : NAN;
        s_layer_mix(res, mix);
    }
}

static void s_run_d(void)
{
    uint32_t n = 0;
    for (size_t i = 0; i < s_cfg.ncontexts; i++)
        n = s_cfg.contexts[i] > n ? s_cfg.contexts[i] : n;
    s_ctx_t *x = s_context(n);
    s_on_cloud(x);
    float cu = 0, ru = 0;
    kvedge_decoder_forget(s_dec);
    s_check(kvedge_decoder_estimate(s_dec, n, s_cfg.prompt, &cu, &ru), "estimate");
    const uint32_t R = s_cfg.learn_requests, L = kvedge_decoder_config(s_dec)->layers;
    static const char *rates[] = {"100mbit", "1gbit"};
    static const double bps[] = {100e6, 1e9};
    printf("### D. The planner learns the decoder's speed\n\n"
           "Context %u tokens (int8 on the cloud node), prompt %u tokens, TTFT only (1 new "
           "token), recomputation priced; a fresh proxy per link with the cloud node as its only "
           "source (%s one way). Per link, two series of %u requests in this process: "
           "**calibration**, the learned speed dropped before each request, so every plan is "
           "priced with the one-time calibration (%.1f ms per layer over the prompt, %.1f ms "
           "more to compute a layer's context K/V); **learned**, each request planned with "
           "the layer times kvedge_e2e_decode fed back from the requests before it (request 1 "
           "plans with the calibration). Medians over requests 2..%u of each series.\n\n",
           n, s_cfg.prompt, S_SWEEP_LATENCY, R, cu / 1e3, ru / 1e3, R);
    printf("| cloud link | estimates | layers fetched / computed (last) | plan T ms | TTFT ms | "
           "TTFT / plan T | TTFT / plan T, requests 1..%u | learned factors (compute, "
           "recompute) |\n|---|---|---|---:|---:|---:|---|---|\n",
           R);
    fflush(stdout);
    kvedge_e2e_result_t *res = bench_alloc(sizeof *res);
    double ratio_med[2][2];
    for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++) {
        char src_spec[700], ep[400];
        s_cloud_source(src_spec, sizeof src_spec, rates[i], bps[i], S_SWEEP_LATENCY,
                       S_CLOUD_RTT_US);
        const char *src[] = {src_spec};
        pid_t px = s_proxy("proxy-d", src, 1, ep, sizeof ep);
        kvedge_client_t *c = s_connect(ep);
        kvedge_decoder_forget(s_dec);
        s_check(s_decode(KVEDGE_E2E_KVEDGE, x, 0, c, true, 1, res), "kvedge warm-up");
        for (int learned = 0; learned < 2; learned++) {
            double ttft[S_MAX_REQUESTS], plan[S_MAX_REQUESTS], ratio[S_MAX_REQUESTS];
            uint32_t mix[5] = {0};
            s_d_series(x, c, !learned, 1 + (uint32_t)learned * R, res, ttft, plan, mix);
            kvedge_decoder_speed_t sp;
            s_check(kvedge_decoder_speed(s_dec, &sp), "speed");
            char seq[S_MAX_REQUESTS * 8] = "";
            size_t off = 0;
            for (uint32_t k = 0; k < R; k++) {
                ratio[k] = ttft[k] / plan[k];
                off += (size_t)snprintf(seq + off, sizeof seq - off, "%s%.2f", k ? ", " : "",
                                        ratio[k]);
                if (off >= sizeof seq)
                    break;
            }
            const uint32_t m = R > 1 ? R - 1 : 1, o = R > 1 ? 1 : 0;
            const double P = bench_median(plan + o, m), T = bench_median(ttft + o, m),
                         Q = bench_median(ratio + o, m);
            ratio_med[i][learned] = Q;
            char fac[64] = "1, 1 (dropped)";
            if (learned)
                snprintf(fac, sizeof fac, "%.2f, %.2f", sp.compute, sp.recompute);
            printf("| %s, %s | %s | %u / %u | %.1f | %.1f | %.2f | %s | %s |\n", rates[i],
                   S_SWEEP_LATENCY, learned ? "learned" : "calibration", L - mix[0], mix[0], P, T,
                   Q, seq, fac);
            fflush(stdout);
        }
        s_release(&c);
        s_stop(px);
    }
    free(res);
    printf("\nTTFT / plan T, median, calibration -> learned: %s %.2f -> %.2f, %s %.2f -> %.2f.\n\n",
           rates[0], ratio_med[0][0], ratio_med[0][1], rates[1], ratio_med[1][0], ratio_med[1][1]);
    kvedge_decoder_forget(s_dec);
    fflush(stdout);
}

/* ---------------------------------------------------------------- L: Llama-family shapes */

/* L's cloud links, one way, with S_SWEEP_LATENCY. */
static const char *const s_l_rates[] = {"100mbit", "1gbit"};
static const double s_l_bps[] = {100e6, 1e9};
#define S_L_LINKS 2

/* Puts x's context K/V (computed once, k and v) to the node at ep encoded as scheme, pinned.
 * Returns the stored bytes. */
static uint64_t s_l_put(s_ctx_t *x, const char *ep, kvedge_scheme_t scheme, const float *k,
                        const float *v)
{
    kvedge_client_t *c = s_connect(ep);
    kvedge_e2e_quant_t q;
    kvedge_e2e_quant_default(&q);
    q.scheme = scheme;
    q.pin = true;
    kvedge_e2e_prefill_stats_t st;
    s_check(kvedge_e2e_prefill_kv(c, s_dec, &s_model, x->tok, x->n, 0, &q, k, v, x->ids,
                                  S_MAX_CHUNKS, &st),
            "put");
    x->nids = st.n_chunks;
    s_release(&c);
    return st.bytes;
}

/* Median TTFT (ms) of runs requests of mode on x (prompts 1..), after one warm-up request
 * (prompt 0) but for edge-only: at these shapes one edge-only request takes many seconds, and
 * it needs no connection or calibration warmed. mix gets the last run's layer mix. */
static double s_l_ttft(kvedge_e2e_mode_t mode, s_ctx_t *x, kvedge_client_t *c, uint32_t mix[5],
                       kvedge_e2e_result_t *res)
{
    double t[S_MAX_RUNS];
    if (mode != KVEDGE_E2E_LOCAL)
        s_check(s_decode(mode, x, 0, c, true, 1, res), "warm-up");
    for (uint32_t k = 0; k < s_cfg.runs; k++) {
        s_check(s_decode(mode, x, 1 + k, c, true, 1, res), kvedge_e2e_mode_name(mode));
        t[k] = res->ttft_us / 1e3;
    }
    if (mix)
        s_layer_mix(res, mix);
    return bench_median(t, s_cfg.runs);
}

/* R: kvedge with nothing to fetch against edge-only, interleaved (edge-only, kvedge, ...) so a
 * drift of the machine's speed hits both alike; one warm-up of each first. */
static void s_run_r_case(const char *what, s_ctx_t *x, const char *rate, double bps)
{
    char src_spec[700], ep[400];
    s_cloud_source(src_spec, sizeof src_spec, rate, bps, S_SWEEP_LATENCY, S_CLOUD_RTT_US);
    const char *src[] = {src_spec};
    pid_t px = s_proxy("proxy-r", src, 1, ep, sizeof ep);
    kvedge_client_t *c = s_connect(ep);
    kvedge_e2e_result_t *res = bench_alloc(sizeof *res);
    double eo[S_MAX_RUNS], kv[S_MAX_RUNS], wait[S_MAX_RUNS], share[S_MAX_RUNS], ratio[S_MAX_RUNS];
    uint32_t fetched = 0;
    s_check(s_decode(KVEDGE_E2E_LOCAL, x, 0, NULL, true, 1, res), "edge-only warm-up");
    s_check(s_decode(KVEDGE_E2E_KVEDGE, x, 0, c, true, 1, res), "kvedge warm-up");
    for (uint32_t k = 0; k < s_cfg.runs; k++) {
        s_check(s_decode(KVEDGE_E2E_LOCAL, x, 1 + k, NULL, true, 1, res), "edge-only");
        eo[k] = res->ttft_us / 1e3;
        s_check(s_decode(KVEDGE_E2E_KVEDGE, x, 1 + k, c, true, 1, res), "kvedge");
        kv[k] = res->ttft_us / 1e3;
        double busy;
        s_busy_wait(res, &busy, &wait[k]);
        fetched += res->fetched;
        ratio[k] = kv[k] / eo[k];
        share[k] = wait[k] / eo[k];
    }
    printf("| %s | %u | %.1f | %.1f | %.3f (%.3f-%.3f) | %.2f (%.2f-%.2f) | %.4f |\n", what,
           fetched, bench_median(kv, s_cfg.runs), bench_median(eo, s_cfg.runs),
           bench_median(ratio, s_cfg.runs), bench_quantile(ratio, s_cfg.runs, 0),
           bench_quantile(ratio, s_cfg.runs, 1), bench_median(wait, s_cfg.runs),
           bench_quantile(wait, s_cfg.runs, 0), bench_quantile(wait, s_cfg.runs, 1),
           bench_median(share, s_cfg.runs));
    fflush(stdout);
    free(res);
    s_release(&c);
    s_stop(px);
}

static void s_run_r(void)
{
    uint32_t n = 0;
    for (size_t i = 0; i < s_cfg.ncontexts; i++)
        n = s_cfg.contexts[i] > n ? s_cfg.contexts[i] : n;
    printf("### R. The fixed cost of a request whose plan fetches nothing\n\n"
           "Context %u tokens, prompt %u tokens, TTFT (1 new token). kvedge: a FETCH to a fresh "
           "edge proxy (the cloud node its only source, %s one way), recomputation priced, then "
           "every layer computed by the decoder as the pipeline reports it missing; edge-only: "
           "the decoder alone. Runs interleaved (edge-only, kvedge), %u pairs after one warm-up "
           "of each; ratio: median (range) of the pairs' kvedge / edge-only TTFT. kvedge "
           "waiting: the request's time outside the decoder's work (its start to layer 0 "
           "known missing: the FETCH, the plan, the pipeline; then every wait for a layer), "
           "the fixed cost itself, which the machine's noise in computing does not blur; "
           "share: waiting / the same pair's edge-only TTFT. Goal: within 5 %% of "
           "edge-only.\n\n",
           n, s_cfg.prompt, S_SWEEP_LATENCY, s_cfg.runs);
    printf("| case | layers fetched (all runs) | kvedge TTFT ms | edge-only TTFT ms | kvedge / "
           "edge-only | kvedge waiting ms | share of edge-only |\n|---|---:|---:|---:|---|---|---:|"
           "\n");
    fflush(stdout);
    /* A context no node holds: its own token stream, never put. */
    static s_ctx_t fresh;
    fresh.n = n;
    fresh.tok = bench_alloc(n * sizeof *fresh.tok);
    s_tokens(0x52ull << 32 | n, fresh.tok, n);
    s_run_r_case("context held by no source, 1 Gbit/s link", &fresh, "1gbit", 1e9);
    s_ctx_t *x = s_context(n);
    s_on_cloud(x);
    s_run_r_case("context on the cloud node behind 1 Mbit/s", x, "1mbit", 1e6);
    free(fresh.tok);
    fresh.tok = NULL;
    printf("\n");
}

/* kvedge TTFT through a fresh proxy whose one source is the node at ep behind link i. */
static double s_l_kvedge(s_ctx_t *x, const char *ep, size_t i, uint32_t mix[5],
                         kvedge_e2e_result_t *res)
{
    char spec[700], pep[400];
    snprintf(spec, sizeof spec, "cloud cloud1 %s link=%s,%s bw=%.0f rtt=%d", ep, s_l_rates[i],
             S_SWEEP_LATENCY, s_l_bps[i] / 8, S_CLOUD_RTT_US);
    const char *src[] = {spec};
    pid_t px = s_proxy("proxy-l", src, 1, pep, sizeof pep);
    kvedge_client_t *c = s_connect(pep);
    double ms = s_l_ttft(KVEDGE_E2E_KVEDGE, x, c, mix, res);
    s_release(&c);
    s_stop(px);
    return ms;
}

static void s_run_l(void)
{
    const kvedge_decoder_config_t *dc = kvedge_decoder_config(s_dec);
    char ep4[320];
    s_store("cloud4", "cloud", ep4, sizeof ep4);
    kvedge_model_t ref;
    s_check(kvedge_model_builtin("opt-1.3b", &ref), "opt-1.3b");
    const double tok_fp16 = (double)kvedge_model_fp16_bytes(&s_model, 1),
                 ref_fp16 = (double)kvedge_model_fp16_bytes(&ref, 1);
    printf("### L. Llama-family shapes: TTFT of kvedge (int8, int4) against edge-only and "
           "cloud-only\n\n"
           "%s shape (%s: %u layers, %u query / %u KV heads of %u, hidden %u, ffn %u, vocab %u), "
           "synthetic weights, fp32 CPU decoder; model id %s. Prompt %u tokens, TTFT (1 new "
           "token). kvedge: the context's K/V on a cloud node (int8, or int4 with the codec's "
           "groups) behind the cloud link (%s one way), a fresh edge proxy per point, "
           "recomputation priced. edge-only: every layer recomputed on the edge (no link). "
           "cloud-only: the prompt goes over the same link to an emulated cloud model with the "
           "context in its prefix cache (its prefill not timed), the same CPU decoder. Medians "
           "of %u runs (kvedge and cloud-only after one warm-up request, edge-only none).\n\n",
           s_cfg.shape, kvedge_decoder_arch(s_dec), dc->layers, dc->heads,
           kvedge_decoder_kv_heads(s_dec), dc->head_dim, dc->hidden, dc->ffn, dc->vocab, s_model.id,
           s_cfg.prompt, S_SWEEP_LATENCY, s_cfg.runs);
    printf("| context | cloud link | kvedge int8 TTFT ms (fetched / computed) | kvedge int4 TTFT "
           "ms (fetched / computed) | edge-only TTFT ms | cloud-only TTFT ms | edge-only / "
           "kvedge int8 | cloud-only / kvedge int8 |\n|---:|---|---:|---:|---:|---:|---:|---:|\n");
    fflush(stdout);
    kvedge_e2e_result_t *res = bench_alloc(sizeof *res);
    double per_tok[S_MAX_CONTEXTS][2];
    for (size_t ci = 0; ci < s_cfg.ncontexts; ci++) {
        s_ctx_t *x = s_context(s_cfg.contexts[ci]);
        const size_t kvf = kvedge_decoder_kv_floats(s_dec, x->n);
        float *k = bench_alloc((size_t)dc->layers * kvf * sizeof *k),
              *v = bench_alloc((size_t)dc->layers * kvf * sizeof *v);
        double t0 = bench_now_s();
        s_check(kvedge_decoder_prefill(s_dec, x->tok, x->n, NULL, k, v), "cloud prefill");
        fprintf(stderr, "bench_e2e: L: %s context %u prefilled in %.1f s\n", s_cfg.shape, x->n,
                bench_now_s() - t0);
        per_tok[ci][0] = (double)s_l_put(x, s_cloud_ep, KVEDGE_SCHEME_INT8, k, v) / x->n;
        per_tok[ci][1] = (double)s_l_put(x, ep4, KVEDGE_SCHEME_INT4, k, v) / x->n;
        free(k);
        free(v);
        double eo = s_l_ttft(KVEDGE_E2E_LOCAL, x, NULL, NULL, res);
        fprintf(stderr, "bench_e2e: L: context %u edge-only %.0f ms\n", x->n, eo);
        for (size_t i = 0; i < S_L_LINKS; i++) {
            char link[64];
            snprintf(link, sizeof link, "%s,%s", s_l_rates[i], S_SWEEP_LATENCY);
            s_check(kvedge_e2e_cloud_new(s_dec, x->tok, x->n, link, &x->cloud),
                    "cloud-only service");
            double co = s_l_ttft(KVEDGE_E2E_CLOUD_ONLY, x, NULL, NULL, res);
            kvedge_e2e_cloud_destroy(&x->cloud);
            uint32_t m8[5], m4[5];
            double k8 = s_l_kvedge(x, s_cloud_ep, i, m8, res);
            double k4 = s_l_kvedge(x, ep4, i, m4, res);
            printf("| %u | %s, %s | %.0f (%u / %u) | %.0f (%u / %u) | %.0f | %.0f | %.2f | %.2f "
                   "|\n",
                   x->n, s_l_rates[i], S_SWEEP_LATENCY, k8, dc->layers - m8[0], m8[0], k4,
                   dc->layers - m4[0], m4[0], eo, co, eo / k8, co / k8);
            fflush(stdout);
        }
    }
    printf("\nBytes per context token: the K/V in fp16 (layers x KV heads x head_dim x 2 x 2 "
           "bytes) against opt-1.3b's (%u layers x %u heads x %u: %.0f bytes), and as stored "
           "(encoded blocks, lz4 where it helps).\n\n"
           "| shape | fp16 K/V bytes / token | / opt-1.3b's | context | int8 stored bytes / "
           "token | int4 stored bytes / token |\n|---|---:|---:|---:|---:|---:|\n",
           ref.layers, ref.kv_heads, ref.head_dim, ref_fp16);
    for (size_t ci = 0; ci < s_cfg.ncontexts; ci++)
        printf("| %s | %.0f | %.3f | %u | %.0f | %.0f |\n", s_cfg.shape, tok_fp16,
               tok_fp16 / ref_fp16, s_cfg.contexts[ci], per_tok[ci][0], per_tok[ci][1]);
    printf("\n");
    fflush(stdout);
    free(res);
}

/* ---------------------------------------------------------------- main */

static size_t s_parse_list(const char *s, double *out, size_t max)
{
    size_t n = 0;
    char *end;
    while (*s && n < max) {
        errno = 0;
        double v = strtod(s, &end);
        if (end == s || errno || !(v > 0) || !isfinite(v))
            return 0;
        out[n++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return 0;
    }
    return *s ? 0 : n;
}

static void s_usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--contexts 512,1024] [--prompt 32] [--new 16] [--runs 3] [--quick]\n"
            "          [--out DIR] [--only ABC] [--loads 0.3,0.6,1.2,2.4 | --rates R,...]\n"
            "          [--requests 8] [--edges 2] [--no-rss] [--verbose]\n"
            "          [--kvedge BIN (default %s)] [--learn-requests 8]\n"
            "          [--links 10mbit,100mbit,1gbit,10gbit] [--shape opt-125m]\n"
            "--shape: the synthetic model (opt-125m, opt-1.3b, llama-3.2-1b, qwen2.5-0.5b, ...).\n"
            "--only L (Llama-family shapes: kvedge int8 / int4 against edge-only and cloud-only\n"
            "at 100 Mbit/s and 1 Gbit/s) runs only when named.\n"
            "--loads: B's rates as multiples of the cloud model's measured capacity; --rates:\n"
            "in requests/s. --quick: 1 run, 4 requests per point at loads 0.5 and 2.\n"
            "--only D (learned decoder speed) runs only when named; --learn-requests: per\n"
            "series of D. --links: the cloud links C sweeps (default all four).\n",
            argv0, KVEDGE_BENCH_KVEDGE_BIN);
    exit(2);
}

static void s_options(int argc, char **argv, bool *child, int *child_arg)
{
    enum {
        O_CONTEXTS = 1000,
        O_PROMPT,
        O_NEW,
        O_RUNS,
        O_QUICK,
        O_OUT,
        O_ONLY,
        O_RATES,
        O_LOADS,
        O_REQUESTS,
        O_EDGES,
        O_NORSS,
        O_VERBOSE,
        O_BIN,
        O_WEIGHTS,
        O_CHILD,
        O_LEARN_REQUESTS,
        O_LINKS,
        O_SHAPE,
        O_HELP
    };
    static const struct option opts[] = {
        {"contexts", required_argument, NULL, O_CONTEXTS},
        {"prompt", required_argument, NULL, O_PROMPT},
        {"new", required_argument, NULL, O_NEW},
        {"runs", required_argument, NULL, O_RUNS},
        {"quick", no_argument, NULL, O_QUICK},
        {"out", required_argument, NULL, O_OUT},
        {"only", required_argument, NULL, O_ONLY},
        {"rates", required_argument, NULL, O_RATES},
        {"loads", required_argument, NULL, O_LOADS},
        {"requests", required_argument, NULL, O_REQUESTS},
        {"edges", required_argument, NULL, O_EDGES},
        {"no-rss", no_argument, NULL, O_NORSS},
        {"verbose", no_argument, NULL, O_VERBOSE},
        {"kvedge", required_argument, NULL, O_BIN},
        {"weights", required_argument, NULL, O_WEIGHTS}, /* internal: --child */
        {"child", no_argument, NULL, O_CHILD},           /* internal: s_rss */
        {"learn-requests", required_argument, NULL, O_LEARN_REQUESTS},
        {"links", required_argument, NULL, O_LINKS},
        {"shape", required_argument, NULL, O_SHAPE},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0}};
    memset(&s_cfg, 0, sizeof s_cfg);
    s_cfg.contexts[0] = 512;
    s_cfg.contexts[1] = 1024;
    s_cfg.ncontexts = 2;
    s_cfg.prompt = 32;
    s_cfg.max_new = 16;
    s_cfg.out = ".";
    s_cfg.run_a = s_cfg.run_b = s_cfg.run_c = true;
    s_cfg.learn_requests = 8;
    s_cfg.edges = 2;
    s_cfg.rss = true;
    s_cfg.bin = KVEDGE_BENCH_KVEDGE_BIN;
    s_cfg.shape = S_SHAPE_DEFAULT;
    long runs = -1, requests = -1;
    const char *rates = NULL;
    double tmp[S_MAX_RATES];
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case O_CONTEXTS: {
            size_t n = s_parse_list(optarg, tmp, S_MAX_CONTEXTS);
            if (n == 0)
                s_usage(argv[0]);
            for (size_t i = 0; i < n; i++) {
                if (tmp[i] != floor(tmp[i]) || tmp[i] > S_MAX_TOKENS)
                    s_usage(argv[0]);
                s_cfg.contexts[i] = (uint32_t)tmp[i];
            }
            s_cfg.ncontexts = n;
            break;
        }
        case O_PROMPT:
        case O_NEW:
        case O_RUNS:
        case O_REQUESTS:
        case O_LEARN_REQUESTS:
        case O_EDGES: {
            char *end;
            long v = strtol(optarg, &end, 10);
            long max = o == O_RUNS                                ? S_MAX_RUNS
                       : o == O_REQUESTS || o == O_LEARN_REQUESTS ? S_MAX_REQUESTS
                       : o == O_EDGES                             ? S_MAX_EDGES
                                                                  : S_MAX_TOKENS;
            if (*end || v < 1 || v > max)
                s_usage(argv[0]);
            if (o == O_PROMPT)
                s_cfg.prompt = (uint32_t)v;
            else if (o == O_NEW)
                s_cfg.max_new = (uint32_t)v;
            else if (o == O_RUNS)
                runs = v;
            else if (o == O_REQUESTS)
                requests = v;
            else if (o == O_LEARN_REQUESTS)
                s_cfg.learn_requests = (uint32_t)v;
            else
                s_cfg.edges = (uint32_t)v;
            break;
        }
        case O_QUICK:
            s_cfg.quick = true;
            break;
        case O_OUT:
            s_cfg.out = optarg;
            break;
        case O_ONLY:
            s_cfg.run_a = strchr(optarg, 'A') || strchr(optarg, 'a');
            s_cfg.run_b = strchr(optarg, 'B') || strchr(optarg, 'b');
            s_cfg.run_c = strchr(optarg, 'C') || strchr(optarg, 'c');
            s_cfg.run_d = strchr(optarg, 'D') || strchr(optarg, 'd');
            s_cfg.run_l = strchr(optarg, 'L') || strchr(optarg, 'l');
            s_cfg.run_r = strchr(optarg, 'R') || strchr(optarg, 'r');
            break;
        case O_RATES:
        case O_LOADS:
            rates = optarg;
            s_cfg.absolute = o == O_RATES;
            break;
        case O_LINKS:
            s_cfg.links = optarg;
            for (const char *p = optarg; *p;) {
                const char *e = strchr(p, ',');
                size_t k = e ? (size_t)(e - p) : strlen(p);
                static const char *const ok[] = {"10mbit", "100mbit", "1gbit", "10gbit"};
                bool known = false;
                for (size_t j = 0; j < 4; j++)
                    known |= k == strlen(ok[j]) && strncmp(p, ok[j], k) == 0;
                if (!known)
                    s_usage(argv[0]);
                p += k + (e != NULL);
            }
            break;
        case O_SHAPE: {
            kvedge_decoder_config_t c;
            if (kvedge_decoder_shape(optarg, &c) != KVEDGE_OK)
                s_usage(argv[0]);
            s_cfg.shape = optarg;
            break;
        }
        case O_VERBOSE:
            s_cfg.verbose = true;
            break;
        case O_NORSS:
            s_cfg.rss = false;
            break;
        case O_BIN:
            s_cfg.bin = optarg;
            break;
        case O_WEIGHTS:
            snprintf(s_weights, sizeof s_weights, "%s", optarg);
            break;
        case O_CHILD:
            *child = true;
            break;
        default:
            s_usage(argv[0]);
        }
    }
    *child_arg = optind;
    s_cfg.runs = runs > 0 ? (uint32_t)runs : s_cfg.quick ? 1 : 3;
    s_cfg.requests = requests > 0 ? (uint32_t)requests : s_cfg.quick ? 4 : 8;
    if (rates) {
        s_cfg.nrates = s_parse_list(rates, s_cfg.rates, S_MAX_RATES);
        if (s_cfg.nrates == 0)
            s_usage(argv[0]);
    } else if (s_cfg.quick) {
        static const double q[] = {0.5, 2};
        memcpy(s_cfg.rates, q, sizeof q);
        s_cfg.nrates = 2;
    } else {
        static const double f[] = {0.3, 0.6, 1.2, 2.4};
        memcpy(s_cfg.rates, f, sizeof f);
        s_cfg.nrates = 4;
    }
    if (!*child && optind != argc)
        s_usage(argv[0]);
}

int main(int argc, char **argv)
{
    bool child = false;
    int child_arg = 0;
    s_options(argc, argv, &child, &child_arg);
    signal(SIGPIPE, SIG_IGN);
    if (child)
        return s_child(argc - child_arg, argv + child_arg);

    if (access(s_cfg.bin, X_OK) != 0) {
        fprintf(stderr, "bench_e2e: %s is not executable (--kvedge BIN)\n", s_cfg.bin);
        return 1;
    }
    if (mkdir(s_cfg.out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "bench_e2e: cannot create %s\n", s_cfg.out);
        return 1;
    }
    if (!mkdtemp(s_dir))
        return 1;
    s_have_dir = true;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    double t_start = bench_now_s();

    kvedge_decoder_config_t shape;
    s_check(kvedge_decoder_shape(s_cfg.shape, &shape), "shape");
    const bool opt = strcmp(kvedge_decoder_shape_arch(s_cfg.shape), "opt") == 0;
    snprintf(s_weights, sizeof s_weights, "%s/%s-synth%s", s_dir, s_cfg.shape,
             opt ? ".safetensors" : "");
    double t_synth = bench_now_s();
    s_check(kvedge_decoder_synthesize_shape(s_cfg.shape, s_weights, S_WEIGHTS_SEED, true),
            "synthesize");
    s_dec = kvedge_decoder_new();
    if (!s_dec)
        s_die("decoder", KVEDGE_ENOMEM);
    s_check(kvedge_decoder_load(s_dec, s_weights, 0), "load");
    s_check(kvedge_e2e_model(s_dec, s_cfg.shape, &s_model), "model");
    fprintf(stderr, "bench_e2e: %s synthesized and loaded in %.1f s\n", s_cfg.shape,
            bench_now_s() - t_synth);
    for (size_t i = 0; i < s_cfg.ncontexts; i++)
        if (s_cfg.contexts[i] + s_cfg.prompt + s_cfg.max_new > shape.max_positions) {
            fprintf(stderr, "bench_e2e: context %u + prompt + new is over %u positions\n",
                    s_cfg.contexts[i], shape.max_positions);
            s_cleanup();
            return 2;
        }
    s_cloud_pid = s_store("cloud", "cloud", s_cloud_ep, sizeof s_cloud_ep);
    s_store("history", "edge", s_hist_ep, sizeof s_hist_ep);

    printf("## End to end (bench_e2e): %ld cores, %s shape (%s, %u layers, %u query / %u KV heads "
           "of %u; synthetic weights, %.0f MB fp32)\n\n",
           sysconf(_SC_NPROCESSORS_ONLN), s_cfg.shape, kvedge_decoder_arch(s_dec), shape.layers,
           shape.heads, kvedge_decoder_kv_heads(s_dec), shape.head_dim,
           (double)kvedge_decoder_weights_bytes(s_dec) / 1e6);
    fflush(stdout);
    if (s_cfg.run_a)
        s_run_a();
    if (s_cfg.run_b)
        s_run_b();
    if (s_cfg.run_c)
        s_run_c();
    if (s_cfg.run_d)
        s_run_d();
    if (s_cfg.run_l)
        s_run_l();
    if (s_cfg.run_r)
        s_run_r();
    printf("bench_e2e: %.0f s in all; data files in %s\n", bench_now_s() - t_start, s_cfg.out);
    s_cleanup();
    for (size_t i = 0; i < S_MAX_CONTEXTS; i++)
        free(s_ctx[i].tok);
    kvedge_decoder_destroy(&s_dec);
    return 0;
}
