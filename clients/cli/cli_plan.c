/* `kvedge plan`: what the planner would do for a context over given sources, without fetching:
 * per layer the source, its Eq. 19 cost and the pipelined timeline, against cloud-only,
 * recompute-all and load-then-compute, and the Eq. 20 bound. Sources are given on the command
 * line (the edge proxy fills them from the Storage Master's directory and link table). */
#include <getopt.h>
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

int kvedge_cli_plan(kvedge_cli_t *cli, int argc, char **argv)
{
    static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
                                         {"tokens", required_argument, NULL, 't'},
                                         {"source", required_argument, NULL, 's'},
                                         {"compute-us", required_argument, NULL, 'c'},
                                         {"recompute-us", required_argument, NULL, 'r'},
                                         {"prefix-us", required_argument, NULL, 'p'},
                                         {"down", required_argument, NULL, 'd'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *model_id = NULL, *specs[KVEDGE_PLAN_MAX_SOURCES], *down[KVEDGE_PLAN_MAX_SOURCES];
    size_t nspec = 0, ndown = 0;
    uint64_t tokens = 1024, compute = 2000, recompute = 20000, prefix = 0;
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "m:t:s:h", opts, NULL)) != -1) {
        int bad = 0;
        switch (ch) {
        case 'm':
            model_id = optarg;
            break;
        case 't':
            bad = kvedge_cli_parse_u64(optarg, 1, 1u << 20, &tokens);
            break;
        case 'c':
            bad = kvedge_cli_parse_u64(optarg, 0, 1ull << 40, &compute);
            break;
        case 'r':
            bad = kvedge_cli_parse_u64(optarg, 0, 1ull << 40, &recompute);
            break;
        case 'p':
            bad = kvedge_cli_parse_u64(optarg, 0, 1ull << 40, &prefix);
            break;
        case 's':
            bad = nspec == KVEDGE_PLAN_MAX_SOURCES;
            if (!bad)
                specs[nspec++] = optarg;
            break;
        case 'd':
            bad = ndown == KVEDGE_PLAN_MAX_SOURCES;
            if (!bad)
                down[ndown++] = optarg;
            break;
        case 'h':
            printf("usage: kvedge plan --model ID [--tokens N] --source SPEC [--source SPEC ...]\n"
                   "                   [--compute-us US] [--recompute-us US] [--prefix-us US]\n"
                   "                   [--down NAME]\n\n"
                   "What the edge proxy's planner would do for a context of N tokens of a model,\n"
                   "without fetching anything: per layer the chosen source, its cost\n"
                   "rtt + bytes/bw (CE-LSLM Eq. 19) and the pipelined timeline (Eq. 20), against\n"
                   "cloud-only, recompute-all and load-then-compute, and the Eq. 20 bound.\n\n"
                   "  SPEC  KIND:NAME:LINK:SCHEME[:FIRST-LAST]\n"
                   "        KIND local|peer|cloud|history; LINK rate,one-way-latency as in\n"
                   "        100mbit,20ms; SCHEME lossless|int8|int4 (what that source stores);\n"
                   "        FIRST-LAST the layers it holds (default all)\n"
                   "  --compute-us US    decoder time per layer over the user prompt (2000)\n"
                   "  --recompute-us US  extra time per layer to compute its context KV (20000)\n"
                   "  --prefix-us US     serial time outside the overlap (0)\n"
                   "  --down NAME        treat that source as down\n\n"
                   "example: kvedge plan --model opt-1.3b --tokens 1024 \\\n"
                   "           --source cloud:c1:100mbit,20ms:int8 "
                   "--source peer:e2:1gbit,1ms:lossless:0-7\n");
            return KVEDGE_EXIT_OK;
        default:
            bad = 1;
            break;
        }
        if (bad) {
            kvedge_cli_error("plan: bad option or value '%s' (see kvedge plan --help)",
                             argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
    }
    kvedge_model_t m;
    if (!model_id || kvedge_model_builtin(model_id, &m) != KVEDGE_OK) {
        kvedge_cli_error("plan: --model must name a built-in model (see kvedge models)");
        return model_id ? KVEDGE_EXIT_NOTFOUND : KVEDGE_EXIT_USAGE;
    }
    kvedge_plan_source_t src[KVEDGE_PLAN_MAX_SOURCES];
    static double bytes[KVEDGE_PLAN_MAX_SOURCES][KVEDGE_PLAN_MAX_LAYERS];
    for (size_t i = 0; i < nspec; i++) {
        if (s_parse_source(specs[i], &m, tokens, &src[i], bytes[i]) != 0) {
            kvedge_cli_error("plan: bad --source '%s' (KIND:NAME:LINK:SCHEME[:FIRST-LAST])",
                             specs[i]);
            return KVEDGE_EXIT_USAGE;
        }
        for (size_t d = 0; d < ndown; d++)
            if (strcmp(down[d], src[i].name) == 0)
                src[i].up = false;
    }
    double cu[KVEDGE_PLAN_MAX_LAYERS], ru[KVEDGE_PLAN_MAX_LAYERS];
    for (uint32_t l = 0; l < m.layers; l++) {
        cu[l] = (double)compute;
        ru[l] = (double)recompute;
    }
    kvedge_plan_request_t req = {m.layers, (double)prefix, cu, ru};
    static kvedge_plan_t plan;
    int rc = kvedge_plan_make(&req, src, nspec, &plan);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("plan: %s", kvedge_strerror(rc));
        return kvedge_cli_exit_code(rc);
    }
    if (cli->json) {
        printf("{\"model\":\"%s\",\"tokens\":%llu,", m.id, (unsigned long long)tokens);
        s_json_us("total_us", plan.total_us);
        s_json_us("bound_us", plan.bound_us);
        s_json_us("cloud_only_us", plan.cloud_only_us);
        s_json_us("recompute_all_us", plan.recompute_all_us);
        s_json_us("load_then_compute_us", plan.load_then_compute_us);
        printf("\"split\":%u,\"layers\":[", plan.split);
        for (uint32_t l = 0; l < m.layers; l++) {
            int32_t s = plan.layer[l].source;
            printf("%s{\"layer\":%u,\"source\":\"%s\",\"reason\":\"%s\",", l ? "," : "", l,
                   s >= 0 ? src[s].name : "recompute",
                   kvedge_plan_reason_name(plan.layer[l].reason));
            s_json_us("cost_us", plan.layer[l].cost_us);
            printf("\"done_us\":%.1f}", plan.layer[l].done_us);
        }
        printf("]}\n");
        return KVEDGE_EXIT_OK;
    }
    static char text[1 << 18];
    rc = kvedge_plan_format(&plan, src, nspec, text, sizeof text);
    fputs(text, stdout);
    return rc == KVEDGE_OK ? KVEDGE_EXIT_OK : KVEDGE_EXIT_FAILURE;
}
