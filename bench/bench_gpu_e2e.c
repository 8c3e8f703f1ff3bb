/* Time to first token of the GPU decoder (gpu/opt.h) with the context's K/V fetched through an
 * edge proxy over an emulated cloud link, against the GPU recomputing the context, and against
 * the Eq. 20 bound measured in the same run.
 *
 * Per model and context: the GPU computes the context's K/V (the cloud), which is put int8 to a
 * cloud store node spawned from the kvedge binary (with a Storage Master, so a proxy knows
 * models that are not built in). Then, per link, a proxy is spawned with that node as its
 * cloud source behind the link, and each run is one edge request from scratch:
 *   kvedge:     FETCH through the proxy into the pipelined loader (clients/lib/pipeline.h) with
 *               device destinations (the dequantize kernel writes each layer's fp16 K/V), the
 *               decoder session running layer l as soon as layer l is resident, the prompt's
 *               first token picked: TTFT.
 *   recompute:  the GPU runs context + prompt from the tokens (kvedge_gpu_opt_prefill): TTFT.
 *   resident:   the session over K/V already on the device (no fetch): C, the decoder's own time.
 *   bound:      Eq. 20 with every layer fetched from one stream, as measured in the same run:
 *               max(t_1 + C, t_L), t_1 and t_L the first and last layer's arrival (the loader's
 *               stats), i.e. the decoder never waiting after layer 0 and the link never idle.
 *
 *   bench_gpu_e2e [--kvedge BIN] [--models opt-1.3b,kjv] [--contexts 1024,2000]
 *                 [--links 1gbit,10gbit] [--latency 2ms] [--prompt 16] [--runs 5]
 *
 * kjv: the trained models of models/kjv (cloud and edge; 512 positions: their contexts are
 * capped at 480). opt-1.3b: seeded synthetic weights of the real shape (2048 positions: a
 * 2048-token context leaves no room for a prompt, so the largest context is 2000). Prints
 * "skipped" and exits 0 without a CUDA device. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_common.h"
#include "bench/bench_spawn.h"
#include "access/shaper.h"
#include "clients/decoder/decoder_gpu.h"
#include "clients/e2e/e2e.h"
#include "clients/lib/pipeline.h"
#include "gpu/opt.h"
#include "gpu/stage.h"
#include "access/codec/quant.h"

#ifndef KVEDGE_BENCH_KVEDGE_BIN
#define KVEDGE_BENCH_KVEDGE_BIN "clients/kvedge"
#endif
#ifndef KVEDGE_BENCH_MODELS
#define KVEDGE_BENCH_MODELS "models"
#endif

#define S_MAX_LIST     8
#define S_MAX_PIDS     8
#define S_CHUNK        256
#define S_MAX_CHUNKS   64
#define S_DEADLINE_MS  120000
#define S_SETTLE_MS    800
#define S_TOKENS_SEED  0x6770752d65326525ull
#define S_WEIGHTS_SEED 13
#define S_KJV_CTX_MAX  480

static struct {
    const char *bin;
    char models[S_MAX_LIST][64];
    size_t nmodels;
    uint32_t contexts[S_MAX_LIST];
    size_t ncontexts;
    char links[S_MAX_LIST][32];
    size_t nlinks;
    const char *latency;
    uint32_t prompt, runs;
} s_cfg;

static char s_dir[] = "/tmp/kvedge-bgpu-XXXXXX";
static pid_t s_pids[S_MAX_PIDS];
static int s_npids;
static char s_master_ep[320], s_master_pub[320], s_cloud_ep[320];

static void s_cleanup(void)
{
    for (int i = 0; i < s_npids; i++)
        if (s_pids[i] > 0) {
            kill(s_pids[i], SIGTERM);
            waitpid(s_pids[i], NULL, 0);
        }
    s_npids = 0;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_gpu_e2e: could not remove %s\n", s_dir);
}

static void s_die(const char *what, int rc)
{
    fprintf(stderr, "bench_gpu_e2e: %s%s%s\n", what, rc ? ": " : "", rc ? kvedge_strerror(rc) : "");
    s_cleanup();
    exit(1);
}

static void s_check(int rc, const char *what)
{
    if (rc != KVEDGE_OK)
        s_die(what, rc);
}

/* Starts the kvedge binary with argv and waits for its "listening" line. */
static pid_t s_spawn(char *const argv[])
{
    if (s_npids == S_MAX_PIDS)
        s_die("too many children", 0);
    pid_t pid = bench_spawn(s_cfg.bin, argv);
    if (pid < 0) {
        fprintf(stderr, "bench_gpu_e2e: %s %s did not start\n", s_cfg.bin, argv[1]);
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

static void s_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static kvedge_client_t *s_connect(const char *ep)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = S_DEADLINE_MS;
    kvedge_client_t *c = NULL;
    s_check(kvedge_client_connect(&o, &c), ep);
    return c;
}

static void s_start_cluster(void)
{
    char data[340], cdata[340];
    snprintf(s_master_ep, sizeof s_master_ep, "ipc://%s/master.sock", s_dir);
    snprintf(s_master_pub, sizeof s_master_pub, "ipc://%s/master-pub.sock", s_dir);
    snprintf(data, sizeof data, "%s/master", s_dir);
    char *m[] = {"kvedge",     "master",    "--bind", s_master_ep,  "--pub",
                 s_master_pub, "--data",    data,     "--insecure", "--log-level",
                 "error",      "--metrics", "off",    NULL};
    s_spawn(m);
    snprintf(s_cloud_ep, sizeof s_cloud_ep, "ipc://%s/cloud.sock", s_dir);
    snprintf(cdata, sizeof cdata, "%s/cloud", s_dir);
    char *n[] = {"kvedge",     "--data",       cdata,        "store",     "--role", "cloud",
                 "--insecure", "--bind",       s_cloud_ep,   "--name",    "cloud",  "--master",
                 s_master_ep,  "--master-pub", s_master_pub, "--node-id", "cloud",  "--log-level",
                 "error",      "--metrics",    "off",        NULL};
    s_spawn(n);
}

/* A proxy whose one source is the cloud node behind link "RATE,LATENCY". */
static pid_t s_proxy(const char *rate, double bits_per_s, char *ep, size_t len)
{
    static unsigned seq;
    char cert[600]; /* with a master the proxy loads (makes) a certificate: keep it here */
    snprintf(cert, sizeof cert, "%s/proxy%u.cert", s_dir, seq);
    snprintf(ep, len, "ipc://%s/proxy%u.sock", s_dir, seq++);
    char src[800];
    snprintf(src, sizeof src, "cloud cloud %s link=%s,%s bw=%.0f", s_cloud_ep, rate, s_cfg.latency,
             bits_per_s / 8);
    char *argv[] = {"kvedge",    "proxy",        "--insecure", "--bind",    ep,    "--master",
                    s_master_ep, "--master-pub", s_master_pub, "--source",  src,   "--cert",
                    cert,        "--log-level",  "error",      "--metrics", "off", NULL};
    pid_t pid = s_spawn(argv);
    s_sleep_ms(S_SETTLE_MS);
    return pid;
}

/* Bits per second of a link rate ("1gbit", "500mbit": access/shaper.h's syntax); 0 when it is
 * not one, or unlimited. */
static double s_rate_bits(const char *rate)
{
    uint64_t bps = 0;
    uint32_t latency_us = 0;
    return kvedge_shaper_parse(rate, &bps, &latency_us) == KVEDGE_OK ? (double)bps : 0;
}

static uint64_t s_rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---------------------------------------------------------------- one model */

typedef struct {
    kvedge_decoder_t *dec; /* CPU model: weights and shape */
    kvedge_gpu_opt_t *gpu;
    kvedge_gpu_opt_session_t *sess;
    kvedge_model_t rec;
    const char *name;
    uint32_t L, H, D, vocab;
} s_model_t;

/* The provider of a decode over K/V that is already resident: layer l's device buffers. */
typedef struct {
    void **k, **v;
} s_resident_t;

static int s_prov_resident(void *arg, uint32_t layer, const void **k, const void **v)
{
    s_resident_t *r = arg;
    *k = r->k[layer];
    *v = r->v[layer];
    return 0;
}

/* The provider of a kvedge decode: waits for the pipeline's layer. */
typedef struct {
    kvedge_pipeline_t *p;
    void **k, **v;
    uint32_t misses;
} s_fetched_t;

static int s_prov_fetched(void *arg, uint32_t layer, const void **k, const void **v)
{
    s_fetched_t *f = arg;
    int rc = kvedge_pipeline_wait(f->p, (uint16_t)layer);
    if (rc == KVEDGE_ENOTFOUND) {
        f->misses++;
        return KVEDGE_GPU_OPT_MISS;
    }
    if (rc != KVEDGE_OK)
        return rc;
    *k = f->k[layer];
    *v = f->v[layer];
    return 0;
}

static double s_median(double *v, uint32_t n)
{
    return bench_quantile(v, n, 0.5);
}

static void s_run_context(s_model_t *M, uint32_t n)
{
    const kvedge_gpu_opt_config_t *c = kvedge_gpu_opt_config(M->gpu);
    const uint32_t P = s_cfg.prompt, L = M->L;
    const size_t per = (size_t)M->H * n * M->D; /* elements of one layer's K */
    uint64_t seed = S_TOKENS_SEED ^ n;
    int32_t *tok = bench_alloc((n + P) * sizeof(int32_t));
    for (uint32_t i = 0; i < n + P; i++)
        tok[i] = 4 + (int32_t)(s_rng(&seed) % (c->vocab - 4));
    const int32_t *prompt = tok + n;

    /* Cloud: the GPU computes the context's K/V, kept resident for the "resident" row. */
    void **rk = bench_alloc(L * sizeof(void *)), **rv = bench_alloc(L * sizeof(void *));
    void **fk = bench_alloc(L * sizeof(void *)), **fv = bench_alloc(L * sizeof(void *));
    for (uint32_t l = 0; l < L; l++) {
        s_check(kvedge_gpu_dev_alloc(per * 2, &rk[l]), "device K");
        s_check(kvedge_gpu_dev_alloc(per * 2, &rv[l]), "device V");
        s_check(kvedge_gpu_dev_alloc(per * 2, &fk[l]), "device K");
        s_check(kvedge_gpu_dev_alloc(per * 2, &fv[l]), "device V");
    }
    s_check(kvedge_gpu_opt_prefill(M->gpu, tok, n, NULL, rk, rv), "GPU prefill");
    float *hk = bench_alloc((size_t)L * per * sizeof(float));
    float *hv = bench_alloc((size_t)L * per * sizeof(float));
    uint16_t *h16 = bench_alloc(per * 2);
    for (uint32_t l = 0; l < L; l++) {
        s_check(kvedge_gpu_copy_d2h(h16, rk[l], per * 2, NULL), "K to host");
        s_check(kvedge_gpu_stream_sync(NULL), "sync");
        kvedge_convert_to_f32(KVEDGE_DTYPE_FP16, h16, per, hk + (size_t)l * per);
        s_check(kvedge_gpu_copy_d2h(h16, rv[l], per * 2, NULL), "V to host");
        s_check(kvedge_gpu_stream_sync(NULL), "sync");
        kvedge_convert_to_f32(KVEDGE_DTYPE_FP16, h16, per, hv + (size_t)l * per);
    }
    free(h16);
    kvedge_client_t *cloud = s_connect(s_cloud_ep);
    kvedge_e2e_quant_t q;
    kvedge_e2e_quant_default(&q); /* int8 */
    kvedge_chunk_id_t ids[S_MAX_CHUNKS];
    kvedge_e2e_prefill_stats_t ps;
    s_check(kvedge_e2e_prefill_kv(cloud, M->dec, &M->rec, tok, n, S_CHUNK, &q, hk, hv, ids,
                                  S_MAX_CHUNKS, &ps),
            "put the context");
    kvedge_client_destroy(&cloud);
    free(hk);
    free(hv);
    s_sleep_ms(1500); /* the node publishes the model record (every 500 ms) */

    const uint32_t R = s_cfg.runs;
    double *t_re = bench_alloc(R * sizeof(double)), *t_res = bench_alloc(R * sizeof(double));
    float *logits = bench_alloc(c->vocab * sizeof(float));
    /* Recompute: context + prompt from the tokens. Resident: the prompt over resident K/V. */
    s_resident_t res = {rk, rv};
    kvedge_gpu_opt_ctx_t rctx = {tok, n, n, s_prov_resident, &res};
    s_check(kvedge_gpu_opt_prefill(M->gpu, tok, n + P, logits, NULL, NULL), "warm-up");
    s_check(kvedge_gpu_opt_session_begin(M->sess, &rctx, prompt, P, 1, logits), "warm-up");
    int32_t first_re = -1, first_res = -1;
    for (uint32_t r = 0; r < R; r++) {
        double t0 = bench_now_s();
        s_check(kvedge_gpu_opt_prefill(M->gpu, tok, n + P, logits, NULL, NULL), "recompute");
        first_re = kvedge_decoder_argmax(logits, c->vocab);
        t_re[r] = bench_now_s() - t0;
        t0 = bench_now_s();
        s_check(kvedge_gpu_opt_session_begin(M->sess, &rctx, prompt, P, 1, logits), "resident");
        first_res = kvedge_decoder_argmax(logits, c->vocab);
        t_res[r] = bench_now_s() - t0;
    }
    const double re = s_median(t_re, R), C = s_median(t_res, R);

    for (size_t li = 0; li < s_cfg.nlinks; li++) {
        const char *rate = s_cfg.links[li];
        char pep[320];
        pid_t pp = s_proxy(rate, s_rate_bits(rate), pep, sizeof pep);
        kvedge_client_t *pc = s_connect(pep);
        kvedge_kv_dst_t *kd = bench_alloc(L * sizeof *kd), *vd = bench_alloc(L * sizeof *vd);
        for (uint32_t l = 0; l < L; l++) {
            kvedge_kv_dst_t d = {.layout = KVEDGE_KV_CONTIG,
                                 .dtype = KVEDGE_DTYPE_FP16,
                                 .cap_bytes = per * 2,
                                 .heads = M->H,
                                 .head_dim = M->D,
                                 .tokens_cap = n};
            kd[l] = d;
            vd[l] = d;
            kd[l].base = fk[l];
            vd[l].base = fv[l];
        }
        /* planned: the FETCH carries the GPU's per-layer times measured above (compute: the
         * resident decode's C / L; recompute: what recomputation adds, (recompute - C) / L), so
         * the proxy may plan layers as "recompute" (they come back as misses). */
        float *cu = bench_alloc(L * sizeof(float)), *ru = bench_alloc(L * sizeof(float));
        for (uint32_t l = 0; l < L; l++) {
            cu[l] = (float)(C / L * 1e6);
            ru[l] = (float)((re > C ? re - C : 0) / L * 1e6);
        }
        for (int planned = 0; planned <= 1; planned++) {
            double *t_kv = bench_alloc((R + 1) * sizeof(double));
            double *t_b = bench_alloc((R + 1) * sizeof(double));
            double *t_1 = bench_alloc((R + 1) * sizeof(double));
            double *t_l = bench_alloc((R + 1) * sizeof(double));
            uint32_t misses = 0, agree = 0;
            uint64_t wire = 0;
            kvedge_pipeline_layer_stats_t *ls = bench_alloc(L * sizeof *ls);
            for (uint32_t r = 0; r <= R; r++) { /* run 0 warms the proxy's link estimates */
                kvedge_pipeline_opts_t o = {.size = sizeof(kvedge_pipeline_opts_t),
                                            .client = pc,
                                            .model = &M->rec,
                                            .chunks = ids,
                                            .n_chunks = ps.n_chunks,
                                            .chunk_tokens = S_CHUNK,
                                            .tokens = n,
                                            .first_layer = 0,
                                            .layers = (uint16_t)L,
                                            .k = kd,
                                            .v = vd,
                                            .on_device = true,
                                            .compute_us = planned ? cu : NULL,
                                            .recompute_us = planned ? ru : NULL,
                                            .deadline_ms = S_DEADLINE_MS};
                kvedge_pipeline_t *p = NULL;
                double t0 = bench_now_s();
                s_check(kvedge_pipeline_open(&o, &p), "pipeline");
                s_fetched_t f = {p, fk, fv, 0};
                kvedge_gpu_opt_ctx_t fctx = {tok, n, n, s_prov_fetched, &f};
                int rc = kvedge_gpu_opt_session_begin(M->sess, &fctx, prompt, P, 1, logits);
                const int32_t first = kvedge_decoder_argmax(logits, c->vocab);
                const double ttft = bench_now_s() - t0;
                if (rc != KVEDGE_OK) {
                    kvedge_pipeline_destroy(&p);
                    s_die("kvedge decode", rc);
                }
                kvedge_pipeline_stats_t st;
                s_check(kvedge_pipeline_stats(p, &st, ls, L), "stats");
                kvedge_pipeline_destroy(&p);
                if (r == 0)
                    continue;
                t_kv[r - 1] = ttft;
                t_1[r - 1] = ls[0].arrived_us * 1e-6;
                t_l[r - 1] = 0;
                for (uint32_t l = 0; l < L; l++)
                    if (ls[l].arrived_us * 1e-6 > t_l[r - 1])
                        t_l[r - 1] = ls[l].arrived_us * 1e-6;
                const double a = t_1[r - 1] + C;
                t_b[r - 1] = a > t_l[r - 1] ? a : t_l[r - 1];
                misses += f.misses;
                agree += first == first_res;
                wire = st.wire_bytes;
            }
            const double kv = s_median(t_kv, R), b = s_median(t_b, R);
            char bound[32];
            if (planned) /* recomputed layers: the fetch-only bound does not apply */
                snprintf(bound, sizeof bound, "-");
            else
                snprintf(bound, sizeof bound, "%.2f", kv / b);
            printf("| %s | %u | %s,%s | %s | %.1f | %.1f | %.1f | %.2f | %.1f | %.1f | %.1f | %.2f "
                   "| %s "
                   "| %u | %u/%u |\n",
                   M->name, n, rate, s_cfg.latency, planned ? "planned" : "fetch all", wire / 1e6,
                   re * 1e3, C * 1e3, re / C, s_median(t_1, R) * 1e3, s_median(t_l, R) * 1e3,
                   kv * 1e3, re / kv, bound, misses / R, agree, R);
            fflush(stdout);
            free(ls);
            free(t_kv);
            free(t_b);
            free(t_1);
            free(t_l);
        }
        free(cu);
        free(ru);
        free(kd);
        free(vd);
        kvedge_client_destroy(&pc);
        s_stop(pp);
    }
    if (first_re != first_res)
        printf("<!-- %s, %u tokens: recompute and resident first tokens differ (%d, %d): fp16 "
               "rounding -->\n",
               M->name, n, first_re, first_res);
    for (uint32_t l = 0; l < L; l++) {
        kvedge_gpu_dev_free(rk[l]);
        kvedge_gpu_dev_free(rv[l]);
        kvedge_gpu_dev_free(fk[l]);
        kvedge_gpu_dev_free(fv[l]);
    }
    free(rk);
    free(rv);
    free(fk);
    free(fv);
    free(t_re);
    free(t_res);
    free(logits);
    free(tok);
}

static void s_load(s_model_t *M, const char *name, const char *path, const char *id)
{
    memset(M, 0, sizeof *M);
    M->name = name;
    M->dec = kvedge_decoder_new();
    if (!M->dec)
        s_die("out of memory", 0);
    int rc = kvedge_decoder_load(M->dec, path, 0);
    if (rc != KVEDGE_OK) {
        fprintf(stderr, "bench_gpu_e2e: %s: %s\n", path, kvedge_decoder_error(M->dec));
        s_die("load", rc);
    }
    const kvedge_decoder_config_t *c = kvedge_decoder_config(M->dec);
    M->L = c->layers;
    M->H = c->heads;
    M->D = c->head_dim;
    M->vocab = c->vocab;
    s_check(kvedge_e2e_model(M->dec, id, &M->rec), "model record");
    kvedge_gpu_opt_weights_t w;
    s_check(kvedge_decoder_gpu_weights(M->dec, &w), "GPU weights");
    rc = kvedge_gpu_opt_new(&w, KVEDGE_DTYPE_FP16, &M->gpu);
    kvedge_decoder_gpu_weights_free(&w);
    s_check(rc, "GPU model");
    s_check(kvedge_gpu_opt_session_new(M->gpu, &M->sess), "GPU session");
}

static void s_unload(s_model_t *M)
{
    kvedge_gpu_opt_session_destroy(&M->sess);
    kvedge_gpu_opt_destroy(&M->gpu);
    kvedge_decoder_destroy(&M->dec);
}

static void s_model(const char *name)
{
    char path[400];
    if (strcmp(name, "kjv") == 0) {
        static const char *const which[] = {"cloud", "edge"};
        for (int i = 0; i < 2; i++) {
            snprintf(path, sizeof path, "%s/kjv/%s/model.safetensors", KVEDGE_BENCH_MODELS,
                     which[i]);
            char id[32], label[32];
            snprintf(id, sizeof id, "kjv-%s", which[i]);
            snprintf(label, sizeof label, "kjv %s (trained)", which[i]);
            s_model_t M;
            s_load(&M, label, path, id);
            for (size_t ci = 0; ci < s_cfg.ncontexts; ci++) {
                uint32_t n =
                    s_cfg.contexts[ci] < S_KJV_CTX_MAX ? s_cfg.contexts[ci] : S_KJV_CTX_MAX;
                if (ci > 0 && n == S_KJV_CTX_MAX && s_cfg.contexts[ci - 1] >= S_KJV_CTX_MAX)
                    continue; /* the cap already ran */
                s_run_context(&M, n);
            }
            s_unload(&M);
        }
        return;
    }
    kvedge_decoder_config_t c;
    if (kvedge_decoder_shape(name, &c) != KVEDGE_OK) {
        fprintf(stderr, "bench_gpu_e2e: unknown model %s (an OPT shape or kjv)\n", name);
        s_die("model", 0);
    }
    snprintf(path, sizeof path, "%s/%s.safetensors", s_dir, name);
    s_check(kvedge_decoder_synthesize(path, &c, S_WEIGHTS_SEED, true), "synthesize");
    char label[80];
    snprintf(label, sizeof label, "%s (synthetic)", name);
    s_model_t M;
    s_load(&M, label, path, name);
    unlink(path);
    for (size_t ci = 0; ci < s_cfg.ncontexts; ci++)
        s_run_context(&M, s_cfg.contexts[ci]);
    s_unload(&M);
}

static size_t s_split(const char *s, char out[][64], size_t max)
{
    size_t n = 0;
    while (s && *s && n < max) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len >= 64)
            len = 63;
        memcpy(out[n], s, len);
        out[n++][len] = '\0';
        s = e ? e + 1 : NULL;
    }
    return n;
}

int main(int argc, char **argv)
{
    s_cfg.bin = KVEDGE_BENCH_KVEDGE_BIN;
    s_cfg.latency = "2ms";
    s_cfg.prompt = 16;
    s_cfg.runs = 5;
    const char *models = "opt-1.3b,kjv", *contexts = "1024,2000", *links = "1gbit,10gbit";
    static const struct option opts[] = {
        {"kvedge", required_argument, NULL, 'b'},   {"models", required_argument, NULL, 'm'},
        {"contexts", required_argument, NULL, 'c'}, {"links", required_argument, NULL, 'l'},
        {"latency", required_argument, NULL, 't'},  {"prompt", required_argument, NULL, 'p'},
        {"runs", required_argument, NULL, 'r'},     {NULL, 0, NULL, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'b':
            s_cfg.bin = optarg;
            break;
        case 'm':
            models = optarg;
            break;
        case 'c':
            contexts = optarg;
            break;
        case 'l':
            links = optarg;
            break;
        case 't':
            s_cfg.latency = optarg;
            break;
        case 'p':
            s_cfg.prompt = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'r':
            s_cfg.runs = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        default:
            fprintf(stderr,
                    "usage: %s [--kvedge BIN] [--models opt-1.3b,kjv] [--contexts "
                    "1024,2000] [--links 1gbit,10gbit] [--latency 2ms] [--prompt 16] "
                    "[--runs 5]\n",
                    argv[0]);
            return 2;
        }
    }
    char tmp[S_MAX_LIST][64];
    s_cfg.nmodels = s_split(models, s_cfg.models, S_MAX_LIST);
    size_t nc = s_split(contexts, tmp, S_MAX_LIST);
    for (size_t i = 0; i < nc; i++)
        s_cfg.contexts[s_cfg.ncontexts++] = (uint32_t)strtoul(tmp[i], NULL, 10);
    size_t nl = s_split(links, tmp, S_MAX_LIST);
    for (size_t i = 0; i < nl; i++) {
        snprintf(s_cfg.links[s_cfg.nlinks], sizeof s_cfg.links[0], "%s", tmp[i]);
        if (s_rate_bits(s_cfg.links[s_cfg.nlinks]) <= 0) {
            fprintf(stderr, "bench_gpu_e2e: link rate %s: want e.g. 1gbit, 500mbit\n", tmp[i]);
            return 2;
        }
        s_cfg.nlinks++;
    }
    if (s_cfg.prompt == 0 || s_cfg.runs == 0 || s_cfg.ncontexts == 0 || s_cfg.nmodels == 0) {
        fprintf(stderr, "bench_gpu_e2e: prompt, runs, contexts and models must be non-empty\n");
        return 2;
    }
    for (size_t i = 0; i < s_cfg.ncontexts; i++)
        if (s_cfg.contexts[i] == 0 || s_cfg.contexts[i] > S_MAX_CHUNKS * S_CHUNK) {
            fprintf(stderr, "bench_gpu_e2e: context %u: 1 ... %u tokens\n", s_cfg.contexts[i],
                    S_MAX_CHUNKS * S_CHUNK);
            return 2;
        }
    if (kvedge_gpu_device_count() == 0) {
        printf("bench_gpu_e2e: skipped: %s\n", kvedge_gpu_built_with_cuda()
                                                   ? "no CUDA device found"
                                                   : "built without CUDA (-DKVEDGE_CUDA=OFF)");
        return 0;
    }
    if (!mkdtemp(s_dir))
        s_die("mkdtemp", 0);
    signal(SIGPIPE, SIG_IGN);
    s_start_cluster();
    printf("### GPU decoder: TTFT with the context's K/V fetched through the proxy\n\n"
           "fp16 weights and K/V on the device; context K/V computed by the GPU, stored int8 "
           "on a cloud node, fetched through an edge proxy whose cloud source is behind the "
           "emulated link (access/shaper.h); %u-token prompt, first token picked; medians of "
           "%u runs (after one warm-up). recompute = GPU prefill of context + prompt; resident "
           "= the decode over K/V already on the device (C); t_1 / t_L = first / last layer "
           "arrived; bound = Eq. 20, max(t_1 + C, t_L), per run. kvedge \"fetch all\": the "
           "FETCH carries no times, every layer is fetched; \"planned\": it carries the GPU's "
           "per-layer compute and recompute times measured above, and the proxy may plan "
           "layers as recompute (the GPU session recomputes them).\n\n",
           s_cfg.prompt, s_cfg.runs);
    printf("| model | context | link | kvedge | wire MB | recompute TTFT ms | resident C ms | "
           "recompute / resident | t_1 ms | t_L ms | kvedge TTFT ms | recompute / kvedge | kvedge "
           "/ bound (goal <= 1.10) | layers computed | first token = resident |\n");
    printf("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < s_cfg.nmodels; i++)
        s_model(s_cfg.models[i]);
    s_cleanup();
    return 0;
}
