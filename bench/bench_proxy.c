/* Pipelined fetch of a full context through the edge proxy (`kvedge proxy`), sweeping the
 * cloud link from 10 Mbit/s to 10 Gbit/s. Sources: a cloud node holding every layer behind
 * the swept link (20 ms one way) and a peer edge holding the shallow half behind 1 Gbit/s,
 * 1 ms; local recomputation is priced from the client's decoder times. The decoder is
 * emulated from the measured arrival times: done(l) = max(done(l-1), arrival(l)) + compute
 * (+ recompute when the layer is not delivered). Compared in the same run: cloud-only (a proxy
 * with the cloud alone, recomputation priced out), load-then-compute, recompute-all, and the
 * Eq. 20 bound of the proxy's plan. Last, the proxy's monitoring on vs off: two proxies over
 * the same sources, fetched through in alternating rounds, the one with monitoring scraped. */
#include <czmq.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_scrape.h"
#include "bench/bench_context.h"
#include "clients/lib/kvedge.h"
#include "access/codec/synth.h"

#define S_MODEL        "opt-125m" /* 12 layers x 12 KV heads x 64 */
#define S_LAYERS       12
#define S_HEADS        12
#define S_TOKENS       512
#define S_CHUNKS       2
#define S_PEER_LAYERS  6
#define S_LATENCY_MS   20
#define S_COMPUTE_US   4000.0  /* decoder time per layer over the prompt */
#define S_RECOMPUTE_US 25000.0 /* extra time to compute a layer's context KV */
#define S_RUNS         3

static const char *s_bin;
static pid_t s_pids[8];
static int s_npids;

static void s_stop_all(void)
{
    for (int i = 0; i < s_npids; i++)
        if (s_pids[i] > 0) {
            kill(s_pids[i], SIGTERM);
            waitpid(s_pids[i], NULL, 0);
            s_pids[i] = 0;
        }
    s_npids = 0;
}

/* Runs `kvedge ARGS...` and waits for its "listening" line; returns the pid. */
static pid_t s_spawn(char *const argv[])
{
    int pfd[2];
    if (pipe(pfd) != 0)
        exit(1);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], STDOUT_FILENO);
        execv(s_bin, argv);
        _exit(127);
    }
    close(pfd[1]);
    char line[400];
    if (read(pfd[0], line, sizeof line) <= 0) {
        fprintf(stderr, "bench_proxy: %s %s did not start\n", s_bin, argv[1]);
        exit(1);
    }
    close(pfd[0]);
    s_pids[s_npids++] = pid;
    return pid;
}

static void s_stop(pid_t pid)
{
    for (int i = 0; i < s_npids; i++)
        if (s_pids[i] == pid) {
            kill(pid, SIGTERM);
            waitpid(pid, NULL, 0);
            s_pids[i] = s_pids[--s_npids];
            return;
        }
}

static kvedge_client_t *s_connect(const char *ep)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = 120000;
    kvedge_client_t *c = NULL;
    if (kvedge_client_connect(&o, &c) != 0) {
        fprintf(stderr, "bench_proxy: cannot connect %s\n", ep);
        exit(1);
    }
    return c;
}

static void s_put(const char *ep, const kvedge_chunk_id_t *ids, uint32_t layers, double *bytes)
{
    kvedge_client_t *c = s_connect(ep);
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, 256, 64, 0, NULL, false};
    size_t cap = kvedge_block_encoded_bound(&spec);
    uint8_t *blocks = malloc(cap * S_HEADS);
    uint16_t *k = malloc(256 * 64 * 2), *v = malloc(256 * 64 * 2);
    kvedge_put_item_t items[S_HEADS];
    for (uint32_t l = 0; l < layers; l++) {
        if (bytes)
            bytes[l] = 0;
        for (uint32_t ci = 0; ci < S_CHUNKS; ci++) {
            for (uint32_t h = 0; h < S_HEADS; h++) {
                bench_chunk_item(&items[h], S_MODEL, ids, ci, l, h, l * 100 + h, &spec,
                                 blocks + h * cap, cap, k, v);
                if (bytes)
                    bytes[l] += (double)items[h].len;
            }
            if (kvedge_client_put(c, items, S_HEADS, NULL) != 0) {
                fprintf(stderr, "bench_proxy: put failed\n");
                exit(1);
            }
        }
    }
    free(blocks);
    free(k);
    free(v);
    kvedge_client_destroy(&c);
}

typedef struct {
    bench_fetch_end_t end; /* first */
    int64_t t0;
    double wall_us; /* from the request to its end */
    double arrival_us[S_LAYERS];
    bool delivered[S_LAYERS];
    double bound_us, plan_us;
    uint32_t from[4]; /* layers delivered per source kind */
    int kinds[KVEDGE_FETCH_MAX_SOURCES];
} s_run_t;

static void s_on_plan(void *ctx, const kvedge_fetch_plan_t *p)
{
    s_run_t *r = ctx;
    r->bound_us = p->bound_us;
    r->plan_us = p->total_us;
    for (uint32_t s = 0; s < p->nsources; s++)
        r->kinds[s] = p->source[s].kind;
}

static void s_on_layer(void *ctx, const kvedge_fetch_layer_t *l)
{
    s_run_t *r = ctx;
    if (l->layer >= S_LAYERS)
        return;
    r->arrival_us[l->layer] = (double)(zclock_usecs() - r->t0);
    r->delivered[l->layer] = l->status == 0;
    if (l->status == 0 && r->kinds[l->source] >= 0 && r->kinds[l->source] < 4)
        r->from[r->kinds[l->source]]++;
}

/* One FETCH through the proxy at ep; times (compute/recompute) are sent when price_compute.
 * Returns the emulated decoder's completion time T; *ltc receives load-then-compute. */
static double s_fetch(kvedge_client_t *c, const kvedge_chunk_id_t *ids, bool price_compute,
                      s_run_t *r, double *ltc)
{
    static float cu[S_LAYERS], ru[S_LAYERS];
    for (int l = 0; l < S_LAYERS; l++) {
        cu[l] = (float)S_COMPUTE_US;
        ru[l] = (float)S_RECOMPUTE_US;
    }
    memset(r, 0, sizeof *r);
    kvedge_fetch_req_t req = {.size = sizeof(kvedge_fetch_req_t),
                              .model_id = S_MODEL,
                              .chunks = ids,
                              .n = S_CHUNKS,
                              .first_layer = 0,
                              .layers = S_LAYERS,
                              .tokens = S_TOKENS,
                              .compute_us = price_compute ? cu : NULL,
                              .recompute_us = price_compute ? ru : NULL,
                              .deadline_ms = 120000};
    kvedge_fetch_cbs_t cbs = {s_on_plan, NULL, s_on_layer, bench_fetch_done};
    r->t0 = zclock_usecs();
    if (bench_fetch_wait(c, &req, &cbs, r) != 0)
        exit(1);
    r->wall_us = (double)(zclock_usecs() - r->t0);
    if (r->end.status != 0) {
        fprintf(stderr, "bench_proxy: fetch: %s\n", kvedge_strerror(r->end.status));
        exit(1);
    }
    double done = 0, last = 0, compute = 0;
    for (int l = 0; l < S_LAYERS; l++) {
        double a = r->delivered[l] ? r->arrival_us[l] : 0;
        double work = S_COMPUTE_US + (r->delivered[l] ? 0 : S_RECOMPUTE_US);
        done = (done > a ? done : a) + work;
        last = a > last ? a : last;
        compute += work;
    }
    *ltc = last + compute;
    return done;
}

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double s_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, s_cmp);
    return v[n / 2];
}

/* Starts `kvedge proxy` at ipc://dir/name.sock over the sources (peer_src may be NULL), with
 * --monitor monitor (NULL: the default) and --metrics metrics. */
static pid_t s_proxy_with(const char *dir, const char *name, const char *cloud_src,
                          const char *peer_src, const char *monitor, const char *metrics, char *ep,
                          size_t len)
{
    snprintf(ep, len, "ipc://%s/%s.sock", dir, name);
    char *argv[20];
    int n = 0;
    argv[n++] = "kvedge";
    argv[n++] = "proxy";
    argv[n++] = "--insecure";
    argv[n++] = "--bind";
    argv[n++] = ep;
    argv[n++] = "--log-level";
    argv[n++] = "error";
    argv[n++] = "--metrics";
    argv[n++] = (char *)metrics;
    char flag[32];
    if (monitor) {
        snprintf(flag, sizeof flag, "--monitor=%s", monitor); /* a bool takes "=" */
        argv[n++] = flag;
    }
    argv[n++] = "--source";
    argv[n++] = (char *)cloud_src;
    if (peer_src) {
        argv[n++] = "--source";
        argv[n++] = (char *)peer_src;
    }
    argv[n] = NULL;
    pid_t pid = s_spawn(argv);
    zclock_sleep(600); /* the proxy connects and pings its sources */
    return pid;
}

/* The sweep's proxies: the default monitoring, no HTTP endpoint. */
static pid_t s_proxy(const char *dir, const char *name, const char *cloud_src, const char *peer_src,
                     char *ep, size_t len)
{
    return s_proxy_with(dir, name, cloud_src, peer_src, NULL, "off", ep, len);
}

/* ---------------------------------------------------------------- monitoring on vs off */

#define S_MON_ROUNDS  60   /* default; --mon-rounds N */
#define S_MON_FETCHES 5    /* per proxy per round */
#define S_MON_WARMUP  3    /* untimed fetches per proxy: links measured, plans settled */
#define S_MON_PHASES  4    /* fresh pairs of proxies, the start order alternating */
#define S_MON_GOAL    0.02 /* monitoring on costs at most this of p50 and throughput */
/* A family only the Collaboration Monitor declares: a scrape holding it shows it records. */
#define S_MON_FAMILY "kvedge_proxy_fetches_total"

enum { S_OFF, S_ON, S_MODES };

/* Median, 25th/75th percentiles and range of v[0..n) (sorts v). */
static void s_spread(double *v, int n, double out[5])
{
    qsort(v, (size_t)n, sizeof *v, s_cmp);
    out[0] = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    out[1] = v[n / 4];
    out[2] = v[(3 * n) / 4 < n ? (3 * n) / 4 : n - 1];
    out[3] = v[0];
    out[4] = v[n - 1];
}

/* Monitoring on vs off: two proxies over the same two sources (the cloud and the peer edge
 * above, no link emulated, so that the proxy's own work is not hidden behind a link's
 * delay), recomputation not priced, so every fetch moves all 12 layers. One proxy runs with
 * `--monitor=no --metrics off`, the other with `--monitor=yes` and an HTTP endpoint scraped
 * once a second. Rounds of S_MON_FETCHES fetches through each in turn, the order swapped
 * every round. */
/* Starts the section's two proxies for one phase, off and on, in the phase's order: even
 * phases start off first, odd ones on first (and each under the other's ipc name), so that
 * what differs between two proxy instances falls on both modes alike. *port: the on one's. */
static void s_mon_start(const char *dir, const char *cloud_src, const char *peer_src, int phase,
                        bool aa, pid_t pid[S_MODES], kvedge_client_t *c[S_MODES], int *port)
{
    static const char *const name[S_MODES] = {"mon-a", "mon-b"};
    char ep[350], addr[32];
    *port = bench_free_port();
    snprintf(addr, sizeof addr, "127.0.0.1:%d", *port);
    for (int j = 0; j < S_MODES; j++) {
        int m = (phase + j) % S_MODES;
        bool on = m == S_ON && !aa;
        pid[m] = s_proxy_with(dir, name[j], cloud_src, peer_src, on ? "yes" : "no",
                              on ? addr : "off", ep, sizeof ep);
        c[m] = s_connect(ep);
    }
}

static void s_mon_section(const char *dir, const char *cloud_ep, const char *peer_ep,
                          const kvedge_chunk_id_t *ids, const double *layer_bytes, int rounds,
                          bool aa)
{
    char cloud_src[600], peer_src[600];
    snprintf(cloud_src, sizeof cloud_src, "cloud cloud1 %s", cloud_ep);
    snprintf(peer_src, sizeof peer_src, "peer edgeB %s", peer_ep);
    double bytes = 0;
    for (int l = 0; l < S_LAYERS; l++)
        bytes += layer_bytes[l];
    const int all = rounds * S_MON_FETCHES;
    double *t[S_MODES], *p50[S_MODES], *gbps[S_MODES], sum[S_MODES] = {0, 0};
    double *rp50 = calloc((size_t)rounds, sizeof(double));
    double *rgbps = calloc((size_t)rounds, sizeof(double));
    for (int m = 0; m < S_MODES; m++) {
        t[m] = calloc((size_t)all, sizeof(double));
        p50[m] = calloc((size_t)rounds, sizeof(double));
        gbps[m] = calloc((size_t)rounds, sizeof(double));
        if (!t[m] || !p50[m] || !gbps[m] || !rp50 || !rgbps)
            exit(1);
    }
    uint32_t from[S_MODES][4] = {{0}};
    bench_scraper_t sc;
    memset(&sc, 0, sizeof sc);
    double t_timed = 0;
    s_run_t r;
    double ignore;
    double phase_ratio[S_MON_PHASES];
    for (int phase = 0, k = 0; phase < S_MON_PHASES; phase++) {
        const int k0 = k;
        pid_t pid[S_MODES];
        kvedge_client_t *c[S_MODES];
        s_mon_start(dir, cloud_src, peer_src, phase, aa, pid, c, &sc.port);
        for (int w = 0; w < S_MON_WARMUP; w++)
            for (int m = 0; m < S_MODES; m++)
                s_fetch(c[m], ids, false, &r, &ignore);
        if (!aa)
            bench_scraper_start(&sc, S_MON_FAMILY);
        int64_t t_start = zclock_usecs();
        for (int end = rounds * (phase + 1) / S_MON_PHASES; k < end; k++) {
            double rsum[S_MODES] = {0, 0}, v[S_MODES][S_MON_FETCHES];
            for (int f = 0; f < S_MON_FETCHES; f++)
                for (int j = 0; j < S_MODES; j++) {
                    int m = (k + f + j) % S_MODES; /* off, on, on, off, ...: neither always first */
                    s_fetch(c[m], ids, false, &r, &ignore);
                    uint32_t got = 0;
                    for (int l = 0; l < S_LAYERS; l++)
                        got += r.delivered[l];
                    if (got != S_LAYERS) {
                        fprintf(stderr, "bench_proxy: a fetch delivered %u of %d layers\n", got,
                                S_LAYERS);
                        exit(1);
                    }
                    for (int s = 0; s < 4; s++)
                        from[m][s] += r.from[s];
                    t[m][k * S_MON_FETCHES + f] = v[m][f] = r.wall_us / 1e6;
                    rsum[m] += v[m][f];
                }
            for (int m = 0; m < S_MODES; m++) {
                p50[m][k] = s_median(v[m], S_MON_FETCHES);
                gbps[m][k] = bytes * S_MON_FETCHES / rsum[m] / 1e9;
                sum[m] += rsum[m];
            }
            rp50[k] = p50[S_ON][k] / p50[S_OFF][k];
            rgbps[k] = gbps[S_ON][k] / gbps[S_OFF][k];
        }
        t_timed += (double)(zclock_usecs() - t_start) / 1e6;
        double ph[S_MODES];
        for (int m = 0; m < S_MODES; m++) {
            int n = (k - k0) * S_MON_FETCHES;
            double *v = malloc((size_t)n * sizeof *v);
            if (!v)
                exit(1);
            memcpy(v, &t[m][k0 * S_MON_FETCHES], (size_t)n * sizeof *v);
            ph[m] = s_median(v, n);
            free(v);
        }
        phase_ratio[phase] = ph[S_ON] / ph[S_OFF];
        bench_scraper_stop(&sc);
        for (int m = 0; m < S_MODES; m++) {
            kvedge_client_destroy(&c[m]);
            s_stop(pid[m]);
        }
    }

    double P50[S_MODES], P99[S_MODES], G[S_MODES], rp[5], rg[5];
    for (int m = 0; m < S_MODES; m++) {
        G[m] = bytes * all / sum[m] / 1e9;
        qsort(t[m], (size_t)all, sizeof t[m][0], s_cmp);
        P50[m] = all % 2 ? t[m][all / 2] : (t[m][all / 2 - 1] + t[m][all / 2]) / 2;
        P99[m] = t[m][(int)(0.99 * all) < all ? (int)(0.99 * all) : all - 1];
    }
    s_spread(rp50, rounds, rp);
    s_spread(rgbps, rounds, rg);
    if (aa)
        printf("\n### A/A check (--mon-aa): both proxies off; \"on\" below is a second off "
               "proxy, not scraped: the method's own spread\n");
    printf("\n### Monitoring on vs off: FETCH through two proxies\n\n"
           "Two proxies over the same two sources (the cloud node and the peer edge above, "
           "both `--metrics off` with their default monitoring, so any difference is the "
           "proxy's; no link emulated), recomputation not priced, so every fetch moves all %d "
           "layers of both chunks (%.2f MB). **off** = `--monitor=no --metrics off`, **on** = "
           "`--monitor=yes --metrics 127.0.0.1:PORT`, with a thread here GETting /metrics every "
           "%d ms over a fresh TCP connection (%d scrapes of %zu bytes, %.2f ms each, %d "
           "failed). %d phases, each with a fresh pair of proxies (started off then on, on then "
           "off, and so on) and %d warm-up fetches through each; %d rounds in all (%.1f s) of %d "
           "fetches through each, alternating one by one (off, on, on, off, ...). Layers from "
           "peer / cloud over the timed fetches: off %u / %u, on %u / %u. p50 / p99: over all %d "
           "fetches of the proxy (from the request to its last layer); GB/s: all bytes / the "
           "summed fetch time. on/off: first the ratio of those, then the per-round ratios (each "
           "round's p50, each round's bytes / time): median [p25 - p75] (min - max).\n\n",
           S_LAYERS, bytes / 1e6, BENCH_SCRAPE_MS, sc.scrapes, sc.bytes,
           sc.scrapes ? sc.secs / sc.scrapes * 1e3 : 0.0, sc.failures, S_MON_PHASES, S_MON_WARMUP,
           rounds, t_timed, S_MON_FETCHES, from[S_OFF][1], from[S_OFF][2], from[S_ON][1],
           from[S_ON][2], all);
    printf("| off p50 / p99 ms | on p50 / p99 ms | p50 on/off: all; per round | off GB/s | on "
           "GB/s | GB/s on/off: all; per round | cost <= %.0f %% (per-round medians: p50, GB/s) "
           "|\n|---:|---:|---|---:|---:|---|---|\n",
           S_MON_GOAL * 100);
    printf("| %.2f / %.2f | %.2f / %.2f | %.3f; %.3f [%.3f - %.3f] (%.3f - %.3f) | %.3f | %.3f "
           "| %.3f; %.3f [%.3f - %.3f] (%.3f - %.3f) | %s, %s |\n",
           P50[S_OFF] * 1e3, P99[S_OFF] * 1e3, P50[S_ON] * 1e3, P99[S_ON] * 1e3,
           P50[S_ON] / P50[S_OFF], rp[0], rp[1], rp[2], rp[3], rp[4], G[S_OFF], G[S_ON],
           G[S_ON] / G[S_OFF], rg[0], rg[1], rg[2], rg[3], rg[4],
           rp[0] <= 1 + S_MON_GOAL ? "met" : "missed", rg[0] >= 1 - S_MON_GOAL ? "met" : "missed");
    printf("\np50 on/off over each phase's fetches (each phase a fresh pair of proxies):");
    for (int ph = 0; ph < S_MON_PHASES; ph++)
        printf(" %.3f", phase_ratio[ph]);
    printf(".\n");
    printf("\nGoal read on the medians of the ratios: p50 on/off <= %.2f and GB/s on/off >= "
           "%.2f. Where [p25 - p75] is wider than that, the run's noise is larger than the "
           "cost it is meant to show.\n",
           1 + S_MON_GOAL, 1 - S_MON_GOAL);
    fflush(stdout);
    for (int m = 0; m < S_MODES; m++) {
        free(t[m]);
        free(p50[m]);
        free(gbps[m]);
    }
    free(rp50);
    free(rgbps);
}

int main(int argc, char **argv)
{
    s_bin = "build/clients/kvedge";
    int mon_rounds = S_MON_ROUNDS;
    bool mon_aa = false, sweep = true;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mon-rounds") == 0 && i + 1 < argc)
            mon_rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--mon-aa") == 0)
            mon_aa = true;
        else if (strcmp(argv[i], "--no-sweep") == 0)
            sweep = false;
        else if (argv[i][0] != '-')
            s_bin = argv[i];
        else
            mon_rounds = -1;
    }
    if (mon_rounds < 0 || (mon_rounds > 0 && mon_rounds < 7)) {
        fprintf(stderr,
                "usage: %s [KVEDGE_BIN (default build/clients/kvedge)] [--mon-rounds N "
                "(monitoring on vs off, >= 7, default %d; 0: skip)] [--mon-aa (the same "
                "with both proxies off: the comparison's own spread)] [--no-sweep]\n",
                argv[0], S_MON_ROUNDS);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    atexit(s_stop_all);
    char dir[] = "/tmp/kvedge-bproxy-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char cloud_ep[300], peer_ep[300], cloud_data[300], peer_data[300];
    snprintf(cloud_ep, sizeof cloud_ep, "ipc://%s/cloud.sock", dir);
    snprintf(peer_ep, sizeof peer_ep, "ipc://%s/peer.sock", dir);
    snprintf(cloud_data, sizeof cloud_data, "%s/cloud", dir);
    snprintf(peer_data, sizeof peer_data, "%s/peer", dir);
    char *cloud_argv[] = {"kvedge", "--data",     cloud_data, "store",  "--role",
                          "cloud",  "--insecure", "--bind",   cloud_ep, "--log-level",
                          "error",  "--metrics",  "off",      NULL};
    char *peer_argv[] = {"kvedge", "--data",     peer_data, "store", "--role",
                         "edge",   "--insecure", "--bind",  peer_ep, "--log-level",
                         "error",  "--metrics",  "off",     NULL};
    s_spawn(cloud_argv);
    s_spawn(peer_argv);
    uint32_t tok[S_TOKENS];
    for (uint32_t i = 0; i < S_TOKENS; i++)
        tok[i] = 31 * i + 5;
    kvedge_chunk_id_t ids[S_CHUNKS];
    if (kvedge_chunk_chain(NULL, 0, S_MODEL, tok, S_TOKENS, 0, ids, S_CHUNKS) != S_CHUNKS)
        return 1;
    double layer_bytes[S_LAYERS];
    s_put(cloud_ep, ids, S_LAYERS, layer_bytes);
    s_put(peer_ep, ids, S_PEER_LAYERS, NULL); /* a peer edge computed the shallow half */

    if (sweep) {
        printf(
            "### Pipelined fetch through the edge proxy\n\n"
            "%s, %u tokens, int8, %.2f MB per layer, %u layers. Cloud: every layer, swept rate, "
            "%d ms one way. Peer edge: layers 0-%d, 1 Gbit/s, 1 ms. Decoder %.0f ms per layer, "
            "KV recompute %.0f ms per layer (emulated from arrival times). Median of %d runs.\n\n",
            S_MODEL, S_TOKENS, layer_bytes[0] / 1e6, S_LAYERS, S_LATENCY_MS, S_PEER_LAYERS - 1,
            S_COMPUTE_US / 1e3, S_RECOMPUTE_US / 1e3, S_RUNS);
        printf("| cloud link | layers peer / cloud / computed | kvedge ms | Eq. 20 bound ms | "
               "kvedge/bound | cloud-only ms | load-then-compute ms | recompute-all ms | "
               "kvedge/best single |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
        static const char *rates[] = {"10mbit", "100mbit", "1gbit", "10gbit"};
        static const double bps[] = {10e6, 100e6, 1e9, 10e9};
        int missed = 0;
        for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++) {
            char cloud_src[600], peer_src[600], pep[350], cep[350];
            snprintf(cloud_src, sizeof cloud_src, "cloud cloud1 %s link=%s,%dms bw=%.0f rtt=%d",
                     cloud_ep, rates[i], S_LATENCY_MS, bps[i] / 8, 2000 * S_LATENCY_MS);
            snprintf(peer_src, sizeof peer_src,
                     "peer edgeB %s link=1gbit,1ms bw=125000000 rtt=2000", peer_ep);
            pid_t px = s_proxy(dir, "proxy", cloud_src, peer_src, pep, sizeof pep);
            pid_t pc = s_proxy(dir, "cloudonly", cloud_src, NULL, cep, sizeof cep);
            kvedge_client_t *c = s_connect(pep), *cc = s_connect(cep);
            /* Slow cloud-only runs once; everything else S_RUNS times. */
            int co_runs = bps[i] < 50e6 ? 1 : S_RUNS;
            double t[S_RUNS], b[S_RUNS], co[S_RUNS], lt[S_RUNS], ignore;
            s_run_t r;
            /* Warm-up: a running proxy has measured its links and learned (from misses) what
             * each source holds; the first fetch of a fresh one prices declared priors. */
            s_fetch(c, ids, true, &r, &ignore);
            for (int k = 0; k < S_RUNS; k++) {
                t[k] = s_fetch(c, ids, true, &r, &ignore);
                b[k] = r.bound_us;
                if (k < co_runs)
                    co[k] = s_fetch(cc, ids, false, &r, &lt[k]);
            }
            s_fetch(c, ids, true, &r, &ignore); /* the source mix of a typical run */
            double T = s_median(t, S_RUNS), B = s_median(b, S_RUNS), CO = s_median(co, co_runs),
                   LT = s_median(lt, co_runs);
            double RE = S_LAYERS * (S_COMPUTE_US + S_RECOMPUTE_US);
            double best = CO < RE ? CO : RE;
            uint32_t computed = S_LAYERS - r.from[1] - r.from[2];
            printf(
                "| %s, %d ms | %u / %u / %u | %.1f | %.1f | %.2f | %.1f | %.1f | %.1f | %.2f |\n",
                rates[i], S_LATENCY_MS, r.from[1], r.from[2], computed, T / 1e3, B / 1e3, T / B,
                CO / 1e3, LT / 1e3, RE / 1e3, T / best);
            fflush(stdout);
            if (T > 1.10 * B || T > 1.02 * best)
                missed = 1;
            kvedge_client_destroy(&c);
            kvedge_client_destroy(&cc);
            s_stop(px);
            s_stop(pc);
        }
        printf(
            "\nGoals: within 10%% of the Eq. 20 bound, never slower than the best single source: "
            "%s.\n",
            missed ? "missed at some point (see the ratios)" : "met at every point");
    }
    fflush(stdout);
    if (mon_rounds > 0)
        s_mon_section(dir, cloud_ep, peer_ep, ids, layer_bytes, mon_rounds, mon_aa);
    s_stop_all();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}
