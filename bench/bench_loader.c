/* Pipeline overlap of the pipelined loader (clients/lib/pipeline.h): the time to have every layer
 * of a context resident, against its stages measured alone in the same run (transfer with
 * verify and staging, host-to-device copy, dequantize). With perfect overlap the pipeline
 * takes max(stages) plus one layer's tail; load-then-dequantize takes their sum.
 *
 *   bench_loader [path/to/kvedge] [tokens] [ring slots]
 *
 * A local store node is spawned from the kvedge binary on an ipc:// endpoint. Rows: loopback
 * (no shaping), and an emulated 1 Gbit/s, 1 ms link (access/shaper.h). On a machine with a
 * CUDA device every row is also run on the device path (device destinations). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_common.h"
#include "bench/bench_context.h"
#include "bench/bench_spawn.h"
#include "clients/lib/kvedge.h"
#include "clients/lib/pipeline.h"
#include "gpu/dequant.h"
#include "gpu/stage.h"
#include "access/codec/synth.h"

#define S_MODEL        "opt-1.3b" /* 24 layers x 32 KV heads x 64 */
#define S_CHUNK_TOKENS 256
#define S_MAX_CHUNKS   16
#define S_REPS         5
#define S_DEADLINE_MS  60000

static uint32_t s_tokens = 1024;
static uint32_t s_ring; /* 0 = KVEDGE_PIPELINE_RING_DEFAULT */
static kvedge_model_t s_m;
static uint32_t s_chunks;
static kvedge_chunk_id_t s_ids[S_MAX_CHUNKS];

/* ---------------------------------------------------------------- the node */

static pid_t s_node_pid;

static void s_stop_node(void)
{
    bench_stop(&s_node_pid);
}

/* CPU seconds used so far by this process and by the node (utime + stime), to tell a
 * CPU-bound run (every core busy: stages cannot overlap) from a link-bound one. */
static double s_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    double self = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)s_node_pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* fields after the command name */
    unsigned long ut = 0, st = 0;
    if (p)
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st);
    return self + (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static void s_spawn(const char *kvedge, const char *dir, char *ep, size_t ep_len)
{
    char data[300];
    snprintf(ep, ep_len, "ipc://%s/node.sock", dir);
    snprintf(data, sizeof data, "%s/node", dir);
    char *argv[] = {"kvedge", "--data",      data,   "store",     "--insecure", "--bind",
                    ep,       "--log-level", "warn", "--metrics", "off",        NULL};
    s_node_pid = bench_spawn(kvedge, argv);
    if (s_node_pid < 0) {
        fprintf(stderr, "bench_loader: the node did not start (%s)\n", kvedge);
        exit(1);
    }
    atexit(s_stop_node);
}

static kvedge_client_t *s_client(const char *ep, const char *link)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = S_DEADLINE_MS;
    o.link = link;
    kvedge_client_t *c = NULL;
    KVEDGE_BENCH_CHECK(kvedge_client_connect(&o, &c));
    return c;
}

/* int8 blocks (the cache optimizer's usual pick), lz4 on where it pays. */
static double s_put_context(const char *ep)
{
    uint32_t *tok = bench_alloc(s_tokens * sizeof *tok);
    for (uint32_t i = 0; i < s_tokens; i++)
        tok[i] = 13 * i + 1;
    KVEDGE_BENCH_CHECK(kvedge_chunk_chain(NULL, 0, S_MODEL, tok, s_tokens, S_CHUNK_TOKENS, s_ids,
                                          S_MAX_CHUNKS) == (int)s_chunks
                           ? 0
                           : KVEDGE_EINVAL);
    free(tok);
    kvedge_client_t *c = s_client(ep, NULL);
    bench_context_t x = {.m = &s_m,
                         .ids = s_ids,
                         .chunks = s_chunks,
                         .tokens = s_tokens,
                         .chunk_tokens = S_CHUNK_TOKENS,
                         .scheme = KVEDGE_SCHEME_INT8};
    double bytes = bench_put_context(c, &x);
    kvedge_client_destroy(&c);
    return bytes;
}

/* ---------------------------------------------------------------- staged layers */

/* Every layer's decompressed bodies and descriptors, as the pipeline's ring would hold them,
 * kept for the stage measurements (copy and dequantize alone). */
typedef struct {
    uint8_t *host; /* pinned */
    void *dev;     /* device copy (device path) */
    size_t used, cap;
    kvedge_dequant_block_t *desc;
    kvedge_dequant_block_t *ddesc; /* bodies pointing into dev */
} s_staged_t;

static s_staged_t *s_st;

/* The transfer stage alone: GET_LAYER streams, KVEDGE_PIPELINE_STREAMS_MAX at once, each block
 * verified and its body written into its layer's staging buffer, as the pipeline's receiver
 * does. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t done, open;
    int status;
    uint64_t bytes;
} s_xfer_t;

typedef struct {
    s_xfer_t *x;
    uint32_t layer;
} s_xl_t;

static void s_x_block(void *ctx, uint32_t ci, uint16_t head, int status, const uint8_t *data,
                      size_t len)
{
    s_xl_t *xl = ctx;
    s_staged_t *s = &s_st[xl->layer];
    kvedge_block_info_t info;
    const uint8_t *raw;
    size_t pos =
        (s->used + KVEDGE_PIPELINE_ALIGN_BYTES - 1) & ~(size_t)(KVEDGE_PIPELINE_ALIGN_BYTES - 1);
    if (status != 0 || kvedge_block_parse(data, len, &info) != 0 || info.raw_len > s->cap - pos ||
        kvedge_block_body(&info, s->host + pos, s->cap - pos, &raw) != 0) {
        xl->x->status = KVEDGE_ECORRUPT;
        return;
    }
    if (raw != s->host + pos)
        memcpy(s->host + pos, raw, info.raw_len);
    kvedge_dequant_block_init(&info, s->host + pos, head, ci * S_CHUNK_TOKENS,
                              &s->desc[ci * s_m.kv_heads + head]);
    s->used = pos + info.raw_len;
    xl->x->bytes += len;
}

static void s_x_done(void *ctx, int status, uint32_t heads)
{
    (void)heads;
    s_xl_t *xl = ctx;
    pthread_mutex_lock(&xl->x->mu);
    if (status != 0)
        xl->x->status = status;
    xl->x->done++;
    xl->x->open--;
    pthread_cond_broadcast(&xl->x->cv);
    pthread_mutex_unlock(&xl->x->mu);
}

static double s_transfer(kvedge_client_t *c, uint64_t *bytes)
{
    s_xfer_t x = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0};
    s_xl_t xl[KVEDGE_MODEL_MAX_LAYERS];
    double t0 = bench_now_s();
    pthread_mutex_lock(&x.mu);
    for (uint32_t next = 0; x.done < s_m.layers;) {
        while (next < s_m.layers && x.open < KVEDGE_PIPELINE_STREAMS_MAX) {
            xl[next] = (s_xl_t){&x, next};
            s_st[next].used = 0;
            x.open++;
            KVEDGE_BENCH_CHECK(kvedge_client_get_layer_async(
                c, s_ids, s_chunks, (uint16_t)next, S_DEADLINE_MS, s_x_block, s_x_done, &xl[next]));
            next++;
        }
        pthread_cond_wait(&x.cv, &x.mu);
    }
    pthread_mutex_unlock(&x.mu);
    double t = bench_now_s() - t0;
    KVEDGE_BENCH_CHECK(x.status);
    *bytes = x.bytes;
    return t;
}

/* ---------------------------------------------------------------- destinations */

typedef struct {
    bool device;
    kvedge_kv_dst_t k[KVEDGE_MODEL_MAX_LAYERS], v[KVEDGE_MODEL_MAX_LAYERS];
} s_dst_t;

static void s_dst_make(s_dst_t *d, bool device)
{
    d->device = device;
    kvedge_kv_dst_t t = {.layout = KVEDGE_KV_CONTIG,
                         .dtype = KVEDGE_DTYPE_FP16,
                         .heads = s_m.kv_heads,
                         .head_dim = s_m.head_dim,
                         .tokens_cap = s_tokens};
    t.cap_bytes = (size_t)kvedge_dequant_dst_bytes(&t);
    for (uint32_t l = 0; l < s_m.layers; l++) {
        d->k[l] = t;
        d->v[l] = t;
        if (device) {
            KVEDGE_BENCH_CHECK(kvedge_gpu_dev_alloc(t.cap_bytes, &d->k[l].base));
            KVEDGE_BENCH_CHECK(kvedge_gpu_dev_alloc(t.cap_bytes, &d->v[l].base));
        } else {
            d->k[l].base = bench_alloc(t.cap_bytes);
            d->v[l].base = bench_alloc(t.cap_bytes);
            memset(d->k[l].base, 0, t.cap_bytes); /* fault the pages in before timing */
            memset(d->v[l].base, 0, t.cap_bytes);
        }
    }
}

static void s_dst_free(s_dst_t *d)
{
    for (uint32_t l = 0; l < s_m.layers; l++) {
        if (d->device) {
            kvedge_gpu_dev_free(d->k[l].base);
            kvedge_gpu_dev_free(d->v[l].base);
        } else {
            free(d->k[l].base);
            free(d->v[l].base);
        }
    }
}

/* The copy stage alone: every layer's staged bodies host to device, one stream. */
static double s_copy(kvedge_gpu_stream_t s)
{
    double t0 = bench_now_s();
    for (uint32_t l = 0; l < s_m.layers; l++)
        KVEDGE_BENCH_CHECK(kvedge_gpu_copy_h2d(s_st[l].dev, s_st[l].host, s_st[l].used, s));
    KVEDGE_BENCH_CHECK(kvedge_gpu_stream_sync(s));
    return bench_now_s() - t0;
}

/* The dequantize stage alone: every layer from its staged bodies into the destination. */
static double s_dequant(s_dst_t *d, kvedge_gpu_stream_t s)
{
    uint32_t nb = s_chunks * s_m.kv_heads;
    double t0 = bench_now_s();
    for (uint32_t l = 0; l < s_m.layers; l++) {
        kvedge_dequant_args_t a = {d->device ? s_st[l].ddesc : s_st[l].desc, nb, d->k[l], d->v[l]};
        KVEDGE_BENCH_CHECK(d->device ? kvedge_gpu_dequant(&a, s) : kvedge_cpu_dequant(&a));
    }
    if (d->device)
        KVEDGE_BENCH_CHECK(kvedge_gpu_stream_sync(s));
    return bench_now_s() - t0;
}

/* The pipeline: open to the last layer resident. */
static double s_open_s; /* the last s_pipeline's kvedge_pipeline_open */

static double s_pipeline(kvedge_client_t *c, s_dst_t *d, kvedge_pipeline_stats_t *st)
{
    kvedge_pipeline_opts_t o = {.size = sizeof(kvedge_pipeline_opts_t),
                                .client = c,
                                .model = &s_m,
                                .chunks = s_ids,
                                .n_chunks = s_chunks,
                                .chunk_tokens = S_CHUNK_TOKENS,
                                .tokens = s_tokens,
                                .first_layer = 0,
                                .layers = s_m.layers,
                                .k = d->k,
                                .v = d->v,
                                .on_device = d->device,
                                .ring_slots = s_ring,
                                .deadline_ms = S_DEADLINE_MS};
    double t0 = bench_now_s();
    kvedge_pipeline_t *p = NULL;
    KVEDGE_BENCH_CHECK(kvedge_pipeline_open(&o, &p));
    s_open_s = bench_now_s() - t0;
    for (uint16_t l = 0; l < s_m.layers; l++)
        KVEDGE_BENCH_CHECK(kvedge_pipeline_wait(p, l));
    double t = bench_now_s() - t0;
    KVEDGE_BENCH_CHECK(kvedge_pipeline_stats(p, st, NULL, 0));
    kvedge_pipeline_destroy(&p);
    return t;
}

static int s_row(const char *ep, const char *link, bool device)
{
    kvedge_client_t *c = s_client(ep, link);
    s_dst_t *d = bench_alloc(sizeof *d);
    s_dst_make(d, device);
    kvedge_gpu_stream_t s = NULL;
    if (device)
        KVEDGE_BENCH_CHECK(kvedge_gpu_stream_new(&s));
    double tx[S_REPS], cp[S_REPS], dq[S_REPS], pl[S_REPS], busy_tx = 0, busy_pl = 0;
    uint64_t bytes = 0;
    kvedge_pipeline_stats_t st = {0};
    for (int r = 0; r < S_REPS; r++) {
        double c0 = s_cpu_s();
        tx[r] = s_transfer(c, &bytes);
        busy_tx += (s_cpu_s() - c0) / tx[r] / S_REPS;
        if (device && r == 0)
            for (uint32_t l = 0; l < s_m.layers; l++) {
                /* device bodies: the same offsets in the device copy */
                for (uint32_t j = 0; j < s_chunks * s_m.kv_heads; j++) {
                    s_st[l].ddesc[j] = s_st[l].desc[j];
                    s_st[l].ddesc[j].body = (uint8_t *)s_st[l].dev +
                                            ((const uint8_t *)s_st[l].desc[j].body - s_st[l].host);
                }
            }
        cp[r] = device ? s_copy(s) : 0;
        dq[r] = s_dequant(d, s);
        c0 = s_cpu_s();
        pl[r] = s_pipeline(c, d, &st);
        busy_pl += (s_cpu_s() - c0) / pl[r] / S_REPS;
    }
    double T = bench_median(tx, S_REPS), C = bench_median(cp, S_REPS), D = bench_median(dq, S_REPS),
           P = bench_median(pl, S_REPS);
    double mx = T > C ? T : C;
    mx = mx > D ? mx : D;
    printf("| %s | %s | %.1f | %.0f | %.1f | %.1f | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f, "
           "%.2f |\n",
           link ? link : "loopback", device ? "device" : "CPU", (double)bytes / 1e6,
           (double)bytes / 1e6 / T, T * 1e3, C * 1e3, D * 1e3, P * 1e3, P / mx, (T + C + D) * 1e3,
           st.dequant_us / 1e3, busy_tx, busy_pl);
    kvedge_gpu_stream_destroy(&s);
    s_dst_free(d);
    free(d);
    kvedge_client_destroy(&c);
    return P <= 1.10 * mx ? 0 : 1;
}

#define S_POOL_PAIRS 15

/* The ring pool: requests of this context in interleaved pairs, one with the pool's cap at 0
 * (every slot buffer allocated at open and freed at destroy) and one with the default cap (the
 * buffers of the request before). */
static void s_pool_row(const char *ep, bool device)
{
    kvedge_client_t *c = s_client(ep, NULL);
    s_dst_t *d = bench_alloc(sizeof *d);
    s_dst_make(d, device);
    kvedge_pipeline_stats_t st = {0};
    double open_off[S_POOL_PAIRS], open_on[S_POOL_PAIRS], all_off[S_POOL_PAIRS],
        all_on[S_POOL_PAIRS];
    kvedge_pipeline_pool_stats_t p0 = {.size = sizeof p0}, p1 = {.size = sizeof p1};
    uint64_t reused = 0, allocated = 0; /* by the requests with the pool */
    for (int r = 0; r < S_POOL_PAIRS; r++) {
        kvedge_pipeline_pool_set_cap(0);
        all_off[r] = s_pipeline(c, d, &st);
        open_off[r] = s_open_s;
        kvedge_pipeline_pool_set_cap(KVEDGE_PIPELINE_POOL_BYTES_DEFAULT);
        s_pipeline(c, d, &st); /* back into the pool */
        KVEDGE_BENCH_CHECK(kvedge_pipeline_pool_stats(&p0));
        all_on[r] = s_pipeline(c, d, &st);
        open_on[r] = s_open_s;
        KVEDGE_BENCH_CHECK(kvedge_pipeline_pool_stats(&p1));
        reused += p1.reused - p0.reused;
        allocated += p1.allocated - p0.allocated;
    }
    double oo = bench_median(open_off, S_POOL_PAIRS), on = bench_median(open_on, S_POOL_PAIRS);
    double ao = bench_median(all_off, S_POOL_PAIRS), an = bench_median(all_on, S_POOL_PAIRS);
    printf("| %s | %u x %.1f MB | %.3f | %.3f | %.1f | %.1f | %.3f | %llu / %llu |\n",
           device ? "device" : "CPU", st.ring_slots, (double)st.slot_bytes / 1e6, oo * 1e3,
           on * 1e3, ao * 1e3, an * 1e3, an / ao, (unsigned long long)reused,
           (unsigned long long)allocated);
    s_dst_free(d);
    free(d);
    kvedge_client_destroy(&c);
}

int main(int argc, char **argv)
{
    const char *kvedge = argc > 1 ? argv[1] : "build/clients/kvedge";
    if (argc > 2)
        s_tokens = (uint32_t)strtoul(argv[2], NULL, 10);
    if (argc > 3)
        s_ring = (uint32_t)strtoul(argv[3], NULL, 10);
    KVEDGE_BENCH_CHECK(kvedge_model_builtin(S_MODEL, &s_m));
    s_chunks = (s_tokens + S_CHUNK_TOKENS - 1) / S_CHUNK_TOKENS;
    if (s_tokens == 0 || s_chunks > S_MAX_CHUNKS) {
        fprintf(stderr, "bench_loader: tokens must be 1 ... %u\n", S_MAX_CHUNKS * S_CHUNK_TOKENS);
        return 2;
    }
    char dir[] = "/tmp/kvedge-loader-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char ep[300];
    s_spawn(kvedge, dir, ep, sizeof ep);
    double wire = s_put_context(ep);
    bool gpu = kvedge_gpu_stage_on_device() == 1;
    s_st = calloc(s_m.layers, sizeof *s_st);
    size_t nb = (size_t)s_chunks * s_m.kv_heads;
    for (uint32_t l = 0; l < s_m.layers; l++) {
        s_staged_t *s = &s_st[l];
        s->cap = nb * (4 * (size_t)S_CHUNK_TOKENS * s_m.head_dim + 4096);
        KVEDGE_BENCH_CHECK(kvedge_gpu_host_alloc(s->cap, (void **)&s->host));
        memset(s->host, 0, s->cap);
        s->desc = calloc(nb, sizeof *s->desc);
        s->ddesc = calloc(nb, sizeof *s->ddesc);
        if (gpu)
            KVEDGE_BENCH_CHECK(kvedge_gpu_dev_alloc(s->cap, &s->dev));
    }
    printf("### Pipelined loader: overlap of transfer, copy and dequantize\n\n"
           "%s shape (%u layers x %u KV heads x %u), %u tokens (%u chunks), int8 blocks "
           "(%.1f MB on the wire for the context), fp16 contiguous destination, ring of %u "
           "slots, %d GET_LAYER streams in flight; local store node on ipc://; median of %d "
           "runs per figure. Stages measured alone in the same run: transfer = the layers' "
           "GET_LAYER streams with every block verified and staged (the pipeline's receive "
           "work), copy = host-to-device of the staged bodies (none on the CPU path: it "
           "dequantizes from the ring), dequantize = every layer from staged bodies into "
           "the destination.\n\n",
           S_MODEL, s_m.layers, s_m.kv_heads, s_m.head_dim, s_tokens, s_chunks, wire / 1e6,
           s_ring ? s_ring : KVEDGE_PIPELINE_RING_DEFAULT, KVEDGE_PIPELINE_STREAMS_MAX, S_REPS);
    printf("| link | path | wire MB | transfer MB/s | transfer ms | copy ms | dequantize ms | "
           "pipeline ms | pipeline / max(stages) | load-then-dequantize ms | dequantize "
           "inside the pipeline ms | cores busy: transfer, pipeline "
           "|\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    int missed = 0;
    static const char *links[] = {NULL, "1gbit,1ms"};
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
        missed += s_row(ep, links[i], false);
        if (gpu)
            missed += s_row(ep, links[i], true);
    }
    printf("\nGoal: pipeline within 10%% of max(transfer, copy, dequantize): %s.\n",
           missed ? "missed in some row (see the ratio)" : "met in every row");
    printf("\n### Ring pool: a request's slots taken from the pool against allocated\n\n"
           "Loopback, the same context; %d interleaved pairs, medians. Without the pool (cap 0) "
           "kvedge_pipeline_open allocates the ring's host slots and destroy frees them; with "
           "it (the default cap) open takes the previous request's.\n\n"
           "| path | ring | open ms, no pool | open ms, pool | request ms, no pool | request "
           "ms, pool | request ratio pool / no pool | slots reused / allocated, with the pool |\n"
           "|---|---|---:|---:|---:|---:|---:|---|\n",
           S_POOL_PAIRS);
    s_pool_row(ep, false);
    if (gpu)
        s_pool_row(ep, true);
    for (uint32_t l = 0; l < s_m.layers; l++) {
        kvedge_gpu_host_free(s_st[l].host);
        kvedge_gpu_dev_free(s_st[l].dev);
        free(s_st[l].desc);
        free(s_st[l].ddesc);
    }
    free(s_st);
    s_stop_node();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}
