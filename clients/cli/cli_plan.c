/* `kvedge plan`: what the planner would do for a context over given sources, without fetching:
 * per layer the source, its Eq. 19 cost and the pipelined timeline, against cloud-only,
 * recompute-all and load-then-compute, and the Eq. 20 bound. Sources are given on the command
 * line (the edge proxy fills them from the Storage Master's directory and link table). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/shaper.h"
#include "clients/cli/cli.h"
#include "clients/cli/cli_plan.h"
#include "proxy/plan.h"
#include "access/codec/error.h"

#define S_GROUP_INT4 32

/* Encoded bytes of one layer of the context at a scheme: the sum of its blocks' exact sizes
 * (lz4 off), one block per chunk and KV head. */
static double s_layer_bytes(const kvedge_model_t *m, uint64_t tokens, kvedge_scheme_t scheme)
{
    double total = 0;
    for (uint64_t t0 = 0; t0 < tokens; t0 += KVEDGE_CHUNK_TOKENS_DEFAULT) {
        uint64_t nt =
            tokens - t0 < KVEDGE_CHUNK_TOKENS_DEFAULT ? tokens - t0 : KVEDGE_CHUNK_TOKENS_DEFAULT;
        kvedge_block_spec_t spec = {m->dtype,
                                    scheme,
                                    (uint32_t)nt,
                                    m->head_dim,
                                    (uint16_t)(scheme == KVEDGE_SCHEME_INT4 ? S_GROUP_INT4 : 0),
                                    NULL,
                                    false};
        total += (double)kvedge_block_encoded_bound(&spec) * m->kv_heads;
    }
    return total;
}

/* KIND:NAME:LINK:SCHEME[:FIRST-LAST] e.g. cloud:c1:100mbit,20ms:int8 or
 * peer:e2:1gbit,1ms:lossless:0-11. */

/* "KEY":VALUE, in microseconds with one decimal, or null for a time that is not a price
 * (proxy/plan.h: unpriced), never a sentinel. */
static void s_json_us(const char *key, double us)
{
    if (isfinite(us) && us < KVEDGE_PLAN_UNPRICED_US)
        printf("\"%s\":%.1f,", key, us);
    else
        printf("\"%s\":null,", key);
}

static int s_parse_source(const char *spec, const kvedge_model_t *m, uint64_t tokens,
                          kvedge_plan_source_t *src, double *bytes)
{
    char buf[256];
    if (snprintf(buf, sizeof buf, "%s", spec) >= (int)sizeof buf)
        return -1;
    char *save = NULL, *kind = strtok_r(buf, ":", &save), *name = strtok_r(NULL, ":", &save);
    char *link = strtok_r(NULL, ":", &save), *scheme = strtok_r(NULL, ":", &save);
    char *range = strtok_r(NULL, ":", &save);
    if (!kind || !name || !link || !scheme || strtok_r(NULL, ":", &save))
        return -1;
    memset(src, 0, sizeof *src);
    static const struct {
        const char *name;
        kvedge_plan_kind_t kind;
    } kinds[] = {{"local", KVEDGE_PLAN_LOCAL},
                 {"peer", KVEDGE_PLAN_PEER},
                 {"cloud", KVEDGE_PLAN_CLOUD},
                 {"history", KVEDGE_PLAN_HISTORY}};
    size_t k = 0;
    while (k < 4 && strcmp(kinds[k].name, kind) != 0)
        k++;
    kvedge_scheme_t sch;
    uint64_t rate = 0;
    uint32_t latency = 0;
    if (k == 4 || kvedge_scheme_parse(scheme, &sch) != KVEDGE_OK ||
        kvedge_shaper_parse(link, &rate, &latency) != KVEDGE_OK)
        return -1;
    unsigned long first = 0, last = m->layers - 1u;
    if (range &&
        (sscanf(range, "%lu-%lu", &first, &last) != 2 || first > last || last >= m->layers))
        return -1;
    src->kind = kinds[k].kind;
    snprintf(src->name, sizeof src->name, "%s", name);
    src->up = true;
    src->rtt_us = 2.0 * latency;                            /* the link spec's latency is one way */
    src->bw_bytes_per_s = rate ? (double)rate / 8.0 : 1e15; /* "unlimited": effectively free */
    double b = s_layer_bytes(m, tokens, sch);
    for (unsigned long l = 0; l < m->layers; l++)
        bytes[l] = l >= first && l <= last ? b : -1.0;
    src->layer_bytes = bytes;
    return 0;
}

/* What `kvedge plan` runs on. */
typedef struct {
    const char *model;
    uint64_t tokens, compute_us, recompute_us, prefix_us;
    const char *sources[KVEDGE_PLAN_MAX_SOURCES];
    size_t n_sources;
    const char *down[KVEDGE_PLAN_MAX_SOURCES];
    size_t n_down;
} s_plan_opts_t;

static const kvedge_cmdopt_t s_plan_list[] = {
    {.name = "model",
     .letter = 'm',
     .arg = "ID",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_plan_opts_t, model),
     .required = true,
     .help = "a built-in model (see kvedge models)"},
    {.name = "tokens",
     .letter = 't',
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_plan_opts_t, tokens),
     .min = 1,
     .max = 1u << 20,
     .def_num = 1024,
     .help = "context length"},
    {.name = "source",
     .letter = 's',
     .arg = "SPEC",
     .type = KVEDGE_CMDOPT_STRS,
     KVEDGE_CMDOPT_LIST_AT(s_plan_opts_t, sources, n_sources),
     .help = "a source, KIND:NAME:LINK:SCHEME[:FIRST-LAST] (below)"},
    {.name = "compute-us",
     .arg = "US",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_plan_opts_t, compute_us),
     .max = 1ull << 40,
     .def_num = 2000,
     .help = "decoder time per layer over the user prompt"},
    {.name = "recompute-us",
     .arg = "US",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_plan_opts_t, recompute_us),
     .max = 1ull << 40,
     .def_num = 20000,
     .help = "extra time per layer to compute its context KV"},
    {.name = "prefix-us",
     .arg = "US",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_plan_opts_t, prefix_us),
     .max = 1ull << 40,
     .def_num = 0,
     .help = "serial time outside the overlap"},
    {.name = "down",
     .arg = "NAME",
     .type = KVEDGE_CMDOPT_STRS,
     KVEDGE_CMDOPT_LIST_AT(s_plan_opts_t, down, n_down),
     .help = "treat that source as down"},
};

const kvedge_cmdopts_t kvedge_cli_plan_opts = {
    .command = "plan",
    .summary = "What the planner would fetch from where, without fetching.",
    .about = "What the edge proxy's planner would do for a context of N tokens of a model,\n"
             "without fetching anything: per layer the chosen source, its cost\n"
             "rtt + bytes/bw (CE-LSLM Eq. 19) and the pipelined timeline (Eq. 20), against\n"
             "cloud-only, recompute-all and load-then-compute, and the Eq. 20 bound.\n\n"
             "  SPEC  KIND:NAME:LINK:SCHEME[:FIRST-LAST]\n"
             "        KIND local|peer|cloud|history; LINK rate,one-way-latency as in\n"
             "        100mbit,20ms; SCHEME lossless|int8|int4 (what that source stores);\n"
             "        FIRST-LAST the layers it holds (default all)\n\n"
             "example: kvedge plan --model opt-1.3b --tokens 1024 \\\n"
             "           --source cloud:c1:100mbit,20ms:int8 "
             "--source peer:e2:1gbit,1ms:lossless:0-7\n",
    KVEDGE_CMDOPTS_OF(s_plan_opts_t, s_plan_list)};

static void s_plan_json(const kvedge_model_t *m, uint64_t tokens, const kvedge_plan_t *plan,
                        const kvedge_plan_source_t *src)
{
    printf("{\"model\":\"%s\",\"tokens\":%llu,", m->id, (unsigned long long)tokens);
    s_json_us("total_us", plan->total_us);
    s_json_us("bound_us", plan->bound_us);
    s_json_us("cloud_only_us", plan->cloud_only_us);
    s_json_us("recompute_all_us", plan->recompute_all_us);
    s_json_us("load_then_compute_us", plan->load_then_compute_us);
    printf("\"split\":%u,\"layers\":[", plan->split);
    for (uint32_t l = 0; l < m->layers; l++) {
        int32_t s = plan->layer[l].source;
        printf("%s{\"layer\":%u,\"source\":\"%s\",\"reason\":\"%s\",", l ? "," : "", l,
               s >= 0 ? src[s].name : "recompute", kvedge_plan_reason_name(plan->layer[l].reason));
        s_json_us("cost_us", plan->layer[l].cost_us);
        printf("\"done_us\":%.1f}", plan->layer[l].done_us);
    }
    printf("]}\n");
}

int kvedge_cli_plan_exec(kvedge_cli_t *cli, const void *opts)
{
    const s_plan_opts_t *o = opts;
    const char *model_id = o->model;
    uint64_t tokens = o->tokens;
    size_t nspec = o->n_sources;
    kvedge_model_t m;
    if (!model_id || kvedge_model_builtin(model_id, &m) != KVEDGE_OK) {
        kvedge_cli_error("plan: --model must name a built-in model (see kvedge models)");
        return model_id ? KVEDGE_EXIT_NOTFOUND : KVEDGE_EXIT_USAGE;
    }
    kvedge_plan_source_t src[KVEDGE_PLAN_MAX_SOURCES];
    static double bytes[KVEDGE_PLAN_MAX_SOURCES][KVEDGE_PLAN_MAX_LAYERS];
    for (size_t i = 0; i < nspec; i++) {
        if (s_parse_source(o->sources[i], &m, tokens, &src[i], bytes[i]) != 0) {
            kvedge_cli_error("plan: bad --source '%s' (KIND:NAME:LINK:SCHEME[:FIRST-LAST])",
                             o->sources[i]);
            return KVEDGE_EXIT_USAGE;
        }
        for (size_t d = 0; d < o->n_down; d++)
            if (strcmp(o->down[d], src[i].name) == 0)
                src[i].up = false;
    }
    double cu[KVEDGE_PLAN_MAX_LAYERS], ru[KVEDGE_PLAN_MAX_LAYERS];
    for (uint32_t l = 0; l < m.layers; l++) {
        cu[l] = (double)o->compute_us;
        ru[l] = (double)o->recompute_us;
    }
    kvedge_plan_request_t req = {m.layers, (double)o->prefix_us, cu, ru};
    static kvedge_plan_t plan;
    int rc = kvedge_plan_make(&req, src, nspec, &plan);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("plan: %s", kvedge_strerror(rc));
        return kvedge_cli_exit_code(rc);
    }
    if (cli->json) {
        s_plan_json(&m, tokens, &plan, src);
        return KVEDGE_EXIT_OK;
    }
    static char text[1 << 18];
    rc = kvedge_plan_format(&plan, src, nspec, text, sizeof text);
    fputs(text, stdout);
    return rc == KVEDGE_OK ? KVEDGE_EXIT_OK : KVEDGE_EXIT_FAILURE;
}

int kvedge_cli_plan(kvedge_cli_t *cli, int argc, char **argv)
{
    const kvedge_cli_cmd_t cmd = {
        .name = "plan", .opts = &kvedge_cli_plan_opts, .exec = kvedge_cli_plan_exec};
    return kvedge_cli_dispatch(cli, &cmd, argc, argv);
}
