/* `kvedge proxy` (the edge proxy daemon, proxy/proxy.c, its settings the table in
 * proxy/settings.c) and `kvedge fetch` (a planned fetch through a proxy, printing where each
 * layer came from and why). */
#include <czmq.h>
#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "access/frame.h"
#include "runtime/log.h"
#include "access/transport.h"
#include "clients/cli/cli.h"
#include "clients/lib/kvedge.h"
#include "proxy/proxy.h"
#include "proxy/settings.h"
#include "access/codec/error.h"

static const char s_proxy_about[] =
    "Runs the edge proxy: clients send it FETCH (docs/protocol.md); it prices every source of\n"
    "every layer (Eq. 19), picks the split that minimizes the pipelined completion time\n"
    "(Eq. 20), streams the layers from their sources in parallel, verifies every block,\n"
    "delivers whole layers in order and re-plans when a source fails, stalls, lacks a layer or\n"
    "sends a corrupt block; a layer nobody has comes back as a miss. Prints \"listening EP\"\n"
    "once it serves; stops cleanly on SIGINT or SIGTERM. It needs sources (--source,\n"
    "repeatable) or a master. Example config: etc/kvedge-proxy.conf.\n";

/* The daemon's own check, in the form kvedge_cli_daemon_settings takes. */
static int s_check(const void *settings, char *why, size_t why_len)
{
    return kvedge_proxy_settings_check(settings, why, why_len);
}

/* `kvedge proxy`: settings from the table (defaults, --config FILE, flags), the proxy, a
 * signal, a clean stop. */
static int s_cmd_proxy(kvedge_cli_t *cli, int argc, char **argv)
{
    const kvedge_settings_table_t *t = &kvedge_proxy_settings_table;
    const kvedge_cli_cmd_t cmd = {
        "proxy", NULL, "[OPTIONS] [--config FILE] [--check-config]", "Run the edge proxy.", NULL,
        NULL,    t};
    static kvedge_proxy_settings_t s; /* 70 KiB of source specs; the proxy points into it */
    int ex = kvedge_cli_daemon_settings(cli, &cmd, s_proxy_about, t, &s, s_check, argc, argv);
    if (ex >= 0)
        return ex;
    kvedge_log_set_name(s.id[0] ? s.id : "proxy"); /* the id it has in the registry */
    char why[1024] = "";
    kvedge_proxy_t *p;
    int rc = kvedge_proxy_settings_start(&s, &p, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("proxy: %s", why[0] ? why : kvedge_strerror(rc));
        return rc == KVEDGE_EDENIED || rc == KVEDGE_EINVAL ? KVEDGE_EXIT_USAGE
               : rc == KVEDGE_ELOCKED                      ? KVEDGE_EXIT_UNAVAILABLE /* taken */
                                                           : KVEDGE_EXIT_FAILURE;
    }
    printf("listening %s\n", kvedge_proxy_endpoint(p));
    fflush(stdout);
    kvedge_cli_wait_signal();
    kvedge_log_info("signal received: stopping");
    kvedge_proxy_destroy(&p);
    return KVEDGE_EXIT_OK;
}

/* ---------------------------------------------------------------- fetch */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    bool json;
    int64_t t0;
    uint64_t bytes;
    uint32_t delivered, missed;
} s_fetch_out_t;

static void s_out_plan(void *ctx, const kvedge_fetch_plan_t *pl)
{
    s_fetch_out_t *o = ctx;
    if (o->json)
        return;
    char t[5][32]; /* an unpriced total (recomputation not allowed) prints as "unpriced" */
    printf("plan: %u layers, split %u, T %s (bound %s, cloud-only %s, load-then-compute %s, "
           "recompute-all %s)\n",
           pl->layers, pl->split, kvedge_plan_ms_text(pl->total_us, 1, t[0], sizeof t[0]),
           kvedge_plan_ms_text(pl->bound_us, 1, t[1], sizeof t[1]),
           kvedge_plan_ms_text(pl->cloud_only_us, 1, t[2], sizeof t[2]),
           kvedge_plan_ms_text(pl->load_then_compute_us, 1, t[3], sizeof t[3]),
           kvedge_plan_ms_text(pl->recompute_all_us, 1, t[4], sizeof t[4]));
    for (uint32_t s = 0; s < pl->nsources; s++)
        printf("  source %u %-16s %-8s %-4s rtt %.2f ms, %.1f MB/s\n", s, pl->source[s].name,
               kvedge_plan_kind_name((kvedge_plan_kind_t)pl->source[s].kind),
               pl->source[s].up ? "up" : "down", pl->source[s].rtt_us / 1e3,
               pl->source[s].bw_bytes_per_s / 1e6);
}

static void s_out_block(void *ctx, uint16_t layer, uint32_t ci, uint16_t head, int source,
                        int status, const uint8_t *data, size_t len)
{
    (void)layer, (void)ci, (void)head, (void)source, (void)status, (void)data;
    ((s_fetch_out_t *)ctx)->bytes += len;
}

static void s_out_layer(void *ctx, const kvedge_fetch_layer_t *l)
{
    s_fetch_out_t *o = ctx;
    double ms = (double)(zclock_usecs() - o->t0) / 1e3;
    if (l->status == KVEDGE_OK)
        o->delivered++;
    else
        o->missed++;
    if (o->json)
        printf("{\"layer\":%u,\"source\":\"%s\",\"reason\":\"%s\",\"status\":\"%s\","
               "\"blocks\":%u,\"attempts\":%u,\"ms\":%.3f}\n",
               l->layer, l->source_name, kvedge_fetch_reason_name(l->reason),
               l->status == KVEDGE_OK ? "ok" : "miss", l->blocks, l->attempts, ms);
    else
        printf("layer %3u  %-16s %-18s %-4s %4u blocks  %u tries  at %8.1f ms\n", l->layer,
               l->status == KVEDGE_OK ? l->source_name : "(compute)",
               kvedge_fetch_reason_name(l->reason), l->status == KVEDGE_OK ? "ok" : "miss",
               l->blocks, l->attempts, ms);
}

static void s_out_done(void *ctx, int status)
{
    s_fetch_out_t *o = ctx;
    pthread_mutex_lock(&o->mu);
    o->done = true;
    o->status = status;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static int s_hex_id(const char *s, size_t n, kvedge_chunk_id_t *out)
{
    if (n != 2 * KVEDGE_CHUNK_ID_BYTES)
        return -1;
    for (size_t i = 0; i < KVEDGE_CHUNK_ID_BYTES; i++) {
        unsigned v;
        char b[3] = {s[2 * i], s[2 * i + 1], 0};
        if (!isxdigit((unsigned char)b[0]) || !isxdigit((unsigned char)b[1]) ||
            sscanf(b, "%2x", &v) != 1)
            return -1;
        out->bytes[i] = (uint8_t)v;
    }
    return 0;
}

/* What `kvedge fetch` runs on. */
typedef struct {
    const char *model, *chunks, *layers;
    uint64_t tokens;       /* 0: 256 per chunk */
    uint64_t cu_us, ru_us; /* S_US_UNSET: not given */
} s_fetch_opts_t;

#define S_US_UNSET UINT64_MAX

static const kvedge_cmdopt_t s_fetch_list[] = {
    {.name = "model",
     .letter = 'm',
     .arg = "ID",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_fetch_opts_t, model),
     .required = true,
     .help = "the model the context was computed with"},
    {.name = "chunks",
     .arg = "IDS",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_fetch_opts_t, chunks),
     .required = true,
     .help = "the context's chunk chain: 64-hex ids, comma-separated, in order"},
    {.name = "layers",
     .arg = "A:B",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_fetch_opts_t, layers),
     .help = "layers A .. B-1 (default: every layer of the model)"},
    {.name = "tokens",
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_fetch_opts_t, tokens),
     .min = 1,
     .max = UINT32_MAX,
     .def_num = 0,
     .def_text = "256 per chunk",
     .help = "context tokens, for pricing"},
    {.name = "compute-us",
     .arg = "US",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_fetch_opts_t, cu_us),
     .max = 1000000000,
     .def_num = S_US_UNSET,
     .def_text = "none",
     .help = "the decoder's time per layer (with --recompute-us)"},
    {.name = "recompute-us",
     .arg = "US",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_fetch_opts_t, ru_us),
     .max = 1000000000,
     .def_num = S_US_UNSET,
     .def_text = "none",
     .help = "its extra time to compute a layer's context KV"},
};

static const kvedge_cmdopts_t s_fetch_opts = {
    .command = "fetch",
    .summary = "Fetch a context's layers through a proxy; print each layer's source and reason.",
    .about = "Fetches layers of a context through an edge proxy (-H) and prints the plan and, per\n"
             "layer, the source that delivered it and why (planned, fallback:failed,\n"
             "fallback:missing, fallback:corrupt, recompute, miss, miss:deadline). Blocks are\n"
             "verified and counted, not kept.\n",
    KVEDGE_CMDOPTS_OF(s_fetch_opts_t, s_fetch_list)};

/* The layers [*a, *b) of --layers, else every layer of a built-in model. Exit code. */
static int s_fetch_range(const s_fetch_opts_t *o, unsigned *a, unsigned *b)
{
    kvedge_model_t shape;
    *a = *b = 0;
    if (o->layers) {
        if (sscanf(o->layers, "%u:%u", a, b) != 2 || *b <= *a ||
            *b - *a > KVEDGE_FETCH_MAX_LAYERS || *b > 65536) {
            kvedge_cli_error("fetch: --layers wants A:B with A < B, at most %d layers",
                             KVEDGE_FETCH_MAX_LAYERS);
            return KVEDGE_EXIT_USAGE;
        }
    } else if (kvedge_model_builtin(o->model, &shape) == KVEDGE_OK) {
        *b = shape.layers;
    } else {
        kvedge_cli_error("fetch: %s is not a built-in model: give --layers A:B", o->model);
        return KVEDGE_EXIT_USAGE;
    }
    return KVEDGE_EXIT_OK;
}

/* The ids of --chunks into a new array (caller frees). Exit code. */
static int s_fetch_ids(const char *chunks, kvedge_chunk_id_t **out, size_t *n)
{
    kvedge_chunk_id_t *ids = calloc(strlen(chunks) / 64 + 1, sizeof *ids);
    *n = 0;
    for (const char *p = chunks; ids && *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (*n > KVEDGE_WIRE_MAX_CHUNKS || s_hex_id(p, l, &ids[*n]) != 0) {
            kvedge_cli_error("fetch: --chunks wants 64-hex chunk ids separated by commas");
            free(ids);
            return KVEDGE_EXIT_USAGE;
        }
        (*n)++;
        p = e ? e + 1 : p + l;
    }
    if (!ids) {
        kvedge_cli_error("fetch: out of memory");
        return KVEDGE_EXIT_FAILURE;
    }
    *out = ids;
    return KVEDGE_EXIT_OK;
}

/* Connects to the proxy and runs the fetch, the callbacks printing into *out. */
static int s_fetch_run(const kvedge_cli_t *cli, const kvedge_fetch_req_t *req, s_fetch_out_t *out)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = cli->host;
    o.server_key = cli->server_key;
    o.client_cert = cli->cert;
    o.deadline_ms = cli->deadline_ms;
    o.link = cli->link;
    o.no_pack = cli->no_pack;
    o.name = "kvedge fetch";
    kvedge_client_t *c = NULL;
    int rc = kvedge_client_connect(&o, &c);
    if (rc == KVEDGE_OK) {
        kvedge_fetch_cbs_t cbs = {s_out_plan, s_out_block, s_out_layer, s_out_done};
        rc = kvedge_client_fetch_async(c, req, &cbs, out);
        if (rc == KVEDGE_OK) {
            pthread_mutex_lock(&out->mu);
            while (!out->done)
                pthread_cond_wait(&out->cv, &out->mu);
            pthread_mutex_unlock(&out->mu);
            rc = out->status;
        }
    }
    kvedge_client_destroy(&c);
    return rc;
}

static int s_fetch(kvedge_cli_t *cli, const void *opts)
{
    const s_fetch_opts_t *o = opts;
    bool have_cu = o->cu_us != S_US_UNSET, have_ru = o->ru_us != S_US_UNSET;
    if (!cli->host || have_cu != have_ru) {
        kvedge_cli_error("fetch: needs -H PROXY, --model and --chunks (and --compute-us with "
                         "--recompute-us)");
        return KVEDGE_EXIT_USAGE;
    }
    unsigned a, b;
    kvedge_chunk_id_t *ids = NULL;
    size_t n = 0;
    int ex = s_fetch_range(o, &a, &b);
    if (ex || (ex = s_fetch_ids(o->chunks, &ids, &n)) != 0)
        return ex;
    float *cus = have_cu ? calloc(b - a, sizeof *cus) : NULL;
    float *rus = have_cu ? calloc(b - a, sizeof *rus) : NULL;
    for (unsigned i = 0; cus && rus && i < b - a; i++) {
        cus[i] = (float)o->cu_us;
        rus[i] = (float)o->ru_us;
    }
    s_fetch_out_t out = {PTHREAD_MUTEX_INITIALIZER,
                         PTHREAD_COND_INITIALIZER,
                         false,
                         0,
                         cli->json,
                         zclock_usecs(),
                         0,
                         0,
                         0};
    kvedge_fetch_req_t req = {.size = sizeof(kvedge_fetch_req_t),
                              .model_id = o->model,
                              .chunks = ids,
                              .n = n,
                              .first_layer = (uint16_t)a,
                              .layers = (uint16_t)(b - a),
                              .tokens = (uint32_t)o->tokens,
                              .compute_us = cus,
                              .recompute_us = rus,
                              .deadline_ms = cli->deadline_ms};
    int rc = s_fetch_run(cli, &req, &out);
    free(ids);
    free(cus);
    free(rus);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("fetch: %s", kvedge_strerror(rc));
        return kvedge_cli_exit_code(rc);
    }
    if (!cli->json)
        printf("%u layers delivered, %u to compute locally, %.1f MB in %.1f ms\n", out.delivered,
               out.missed, (double)out.bytes / 1e6, (double)(zclock_usecs() - out.t0) / 1e3);
    return KVEDGE_EXIT_OK;
}

const kvedge_cli_cmd_t kvedge_cli_proxy_cmds[] = {
    {"proxy", s_cmd_proxy, "[--bind EP] [--source SPEC]... [--master EP --master-pub EP]",
     "Run the edge proxy (planned multi-source fetches, failover, misses).", NULL, NULL,
     &kvedge_proxy_settings_table},
    {.name = "fetch", .opts = &s_fetch_opts, .exec = s_fetch},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};
