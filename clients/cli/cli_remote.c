/* The kvedge admin commands in remote mode (-H ENDPOINT): the same commands as local mode,
 * through libkvedge against a running node, within the tenant of this client's key.
 * put-synthetic is not here: one command in clients/cli/cli_local.c writes either way. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "access/frame.h"
#include "clients/cli/cli.h"
#include "clients/cli/cli_admin.h"
#include "clients/cli/top_doc.h"
#include "clients/lib/kvedge.h"

#define S_PING_ROUNDS 20

/* The options of the commands without any (inspect, verify, stat). */
typedef struct {
    char unused;
} s_none_t;

/* The commands that name one prefix (pin, unpin, delete). */
typedef kvedge_cli_prefix_opts_t s_prefix_opts_t;

static int s_fail(const char *what, int rc)
{
    kvedge_cli_error("%s: %s", what, kvedge_strerror(rc));
    return kvedge_cli_exit_code(rc);
}

/* Resolves a hex prefix of a client chunk id among the tenant's chunks. */
static int s_resolve(kvedge_cli_t *cli, kvedge_client_t *c, const char *arg,
                     kvedge_chunk_entry_t *found)
{
    size_t len = strlen(arg);
    if (len < 4 || len > 64 || strspn(arg, "0123456789abcdefABCDEF") != len) {
        kvedge_cli_error("'%s' is not a prefix id (give at least 4 hex digits, see kvedge ls)",
                         arg);
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_chunk_entry_t *all;
    size_t n, hits = 0;
    int rc = kvedge_client_list_all(c, &all, &n);
    if (rc != KVEDGE_OK)
        return s_fail("list", rc);
    for (size_t i = 0; i < n; i++) {
        char hex[KVEDGE_CHUNK_ID_HEX_BYTES];
        kvedge_chunk_id_hex(&all[i].chunk.id, hex);
        if (strncasecmp(hex, arg, len) == 0) {
            *found = all[i];
            hits++;
        }
    }
    free(all);
    if (hits == 1)
        return KVEDGE_EXIT_OK;
    if (hits == 0) {
        kvedge_cli_error("no prefix '%s' on %s (see kvedge -H %s ls)", arg, cli->host, cli->host);
        return KVEDGE_EXIT_NOTFOUND;
    }
    kvedge_cli_error("prefix id '%s' is ambiguous on %s: give more digits", arg, cli->host);
    return KVEDGE_EXIT_USAGE;
}

static int s_entry_id_cmp(const void *a, const void *b)
{
    return memcmp(((const kvedge_chunk_entry_t *)a)->chunk.id.bytes,
                  ((const kvedge_chunk_entry_t *)b)->chunk.id.bytes, KVEDGE_CHUNK_ID_BYTES);
}

/* A row of ls: an entry and the first chunk of its chain (as far as the list goes). */
typedef struct {
    const kvedge_chunk_entry_t *e;
    kvedge_chunk_id_t root;
} s_ls_row_t;

static int s_ls_row_cmp(const void *a, const void *b)
{
    const s_ls_row_t *x = a, *y = b;
    int c = memcmp(x->root.bytes, y->root.bytes, KVEDGE_CHUNK_ID_BYTES);
    if (c)
        return c;
    return x->e->chunk.index < y->e->chunk.index ? -1 : x->e->chunk.index > y->e->chunk.index;
}

/* The rows of all (sorted here by id) chain by chain, each chain in index order: a context's
 * chunks together, its last one (what subscriptions and fetch name) last. Caller frees. */
static s_ls_row_t *s_ls_rows(kvedge_chunk_entry_t *all, size_t n)
{
    s_ls_row_t *rows = calloc(n ? n : 1, sizeof *rows);
    if (!rows)
        return NULL;
    qsort(all, n, sizeof *all, s_entry_id_cmp);
    for (size_t i = 0; i < n; i++) {
        const kvedge_chunk_entry_t *cur = &all[i];
        for (size_t hops = 0; cur->chunk.has_parent && hops < n; hops++) {
            kvedge_chunk_entry_t probe;
            probe.chunk.id = cur->chunk.parent;
            const kvedge_chunk_entry_t *up = bsearch(&probe, all, n, sizeof *all, s_entry_id_cmp);
            if (!up)
                break;
            cur = up;
        }
        rows[i].e = &all[i];
        rows[i].root = cur->chunk.id;
    }
    qsort(rows, n, sizeof *rows, s_ls_row_cmp);
    return rows;
}

typedef kvedge_cli_ls_opts_t s_ls_opts_t;

static const kvedge_cmdopts_t s_ls_opts = {
    .command = "ls",
    .summary = "List this tenant's prefix chunks.",
    .about = "Lists this tenant's prefix chunks on the node (client ids), each context's\n"
             "chunks together in chain order.\n",
    KVEDGE_CMDOPTS_OF(s_ls_opts_t, kvedge_cli_ls_list)};

static void s_ls_row(const kvedge_cli_t *cli, const kvedge_chunk_entry_t *e, int idw, size_t shown)
{
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES], phex[KVEDGE_CHUNK_ID_HEX_BYTES], b[32];
    kvedge_chunk_id_hex(&e->chunk.id, hex);
    double ratio = e->bytes ? (double)e->fp16_bytes / (double)e->bytes : 0.0;
    if (cli->json) {
        printf("%s{\"prefix\":\"%s\",\"parent\":", shown ? "," : "", hex);
        if (e->chunk.has_parent)
            printf("\"%s\"", kvedge_chunk_id_hex(&e->chunk.parent, phex));
        else
            printf("null");
        printf(",\"model\":");
        kvedge_cli_json_str(stdout, e->chunk.model_id);
        printf(",\"chunk\":%u,\"tokens\":%u,\"blocks\":%u,\"bytes\":%llu,\"fp16_bytes\":%llu,"
               "\"pinned_blocks\":%u}",
               e->chunk.index, e->chunk.tokens, e->blocks, (unsigned long long)e->bytes,
               (unsigned long long)e->fp16_bytes, e->pinned_blocks);
    } else {
        hex[idw] = '\0';
        printf("%-*s %-16s %5u %6u %6u %10s %6.2fx %6u\n", idw, hex, e->chunk.model_id,
               e->chunk.index, e->chunk.tokens, e->blocks, kvedge_cli_bytes(e->bytes, b, sizeof b),
               ratio, e->pinned_blocks);
    }
}

static int s_r_ls(kvedge_cli_t *cli, const void *opts)
{
    const char *model = ((const s_ls_opts_t *)opts)->model;
    bool full = ((const s_ls_opts_t *)opts)->full;
    kvedge_client_t *c;
    int ex = kvedge_cli_connect(cli, "kvedge-cli", &c);
    if (ex)
        return ex;
    kvedge_chunk_entry_t *all;
    size_t n;
    int rc = kvedge_client_list_all(c, &all, &n);
    kvedge_client_destroy(&c);
    if (rc != KVEDGE_OK)
        return s_fail("ls", rc);
    s_ls_row_t *rows = s_ls_rows(all, n);
    if (!rows) {
        free(all);
        return s_fail("ls", KVEDGE_ENOMEM);
    }
    int idw = full ? KVEDGE_CHUNK_ID_HEX_BYTES - 1 : 16;
    if (cli->json)
        printf("[");
    else
        printf("%-*s %-16s %5s %6s %6s %10s %7s %6s\n", idw, "PREFIX", "MODEL", "CHUNK", "TOKENS",
               "BLOCKS", "STORED", "RATIO", "PINNED");
    size_t shown = 0;
    for (size_t i = 0; i < n; i++) {
        const kvedge_chunk_entry_t *e = rows[i].e;
        if (model && strcmp(model, e->chunk.model_id) != 0)
            continue;
        s_ls_row(cli, e, idw, shown++);
    }
    if (cli->json)
        printf("]\n");
    free(rows);
    free(all);
    return KVEDGE_EXIT_OK;
}

/* json_extra: more members for the JSON object (",\"k\":v..."), or NULL. */
static void s_print_stats(kvedge_cli_t *cli, const kvedge_engine_stats_t *st,
                          const char *json_extra)
{
    char b1[32], b2[32];
    if (cli->json) {
        printf("{\"blocks\":%llu,\"bytes\":%llu,\"fp16_bytes\":%llu,\"pinned_blocks\":%llu,"
               "\"quarantined\":%llu,\"gets\":%llu,\"hits\":%llu,\"misses\":%llu,"
               "\"corrupt\":%llu,\"puts\":%llu,\"evicted_blocks\":%llu%s}\n",
               (unsigned long long)st->blocks, (unsigned long long)st->bytes,
               (unsigned long long)st->fp16_bytes, (unsigned long long)st->pinned_blocks,
               (unsigned long long)st->quarantined, (unsigned long long)st->gets,
               (unsigned long long)st->hits, (unsigned long long)st->misses,
               (unsigned long long)st->corrupt, (unsigned long long)st->puts,
               (unsigned long long)st->evicted_blocks, json_extra ? json_extra : "");
        return;
    }
    printf("node %s: %llu blocks (%llu pinned), %s stored for %s fp16, %llu quarantined\n",
           cli->host, (unsigned long long)st->blocks, (unsigned long long)st->pinned_blocks,
           kvedge_cli_bytes(st->bytes, b1, 32), kvedge_cli_bytes(st->fp16_bytes, b2, 32),
           (unsigned long long)st->quarantined);
    printf("since start: %llu puts, %llu gets (%llu hits, %llu misses, %llu corrupt), %llu "
           "evicted\n",
           (unsigned long long)st->puts, (unsigned long long)st->gets, (unsigned long long)st->hits,
           (unsigned long long)st->misses, (unsigned long long)st->corrupt,
           (unsigned long long)st->evicted_blocks);
}

/* stat on an edge proxy (it answers STAT with EINVAL): its summary from MONITOR. */
static int s_r_stat_proxy(kvedge_cli_t *cli, const kvedge_top_doc_t *d)
{
    uint32_t up = 0;
    for (uint32_t i = 0; i < d->proxy.nsources; i++)
        up += d->proxy.sources[i].connected && strcmp(d->proxy.sources[i].state, "up") == 0;
    const kvedge_top_proxy_stats_t *st = &d->proxy.stats;
    char b[32];
    if (cli->json) {
        printf("{\"kind\":\"proxy\",\"name\":");
        kvedge_cli_json_str(stdout, d->name);
        printf(",\"ready\":%s,\"not_ready\":", d->ready ? "true" : "false");
        kvedge_cli_json_str(stdout, d->not_ready);
        printf(",\"requests\":%llu,\"layers\":%llu,\"misses\":%llu,\"fallbacks\":%llu,"
               "\"corrupt\":%llu,\"bytes\":%llu,\"source_failures\":%llu,\"sources_up\":%u,"
               "\"sources\":%u}\n",
               (unsigned long long)st->requests, (unsigned long long)st->layers,
               (unsigned long long)st->misses, (unsigned long long)st->fallbacks,
               (unsigned long long)st->corrupt, (unsigned long long)st->bytes,
               (unsigned long long)st->source_failures, up, d->proxy.nsources);
        return KVEDGE_EXIT_OK;
    }
    printf("proxy %s (%s): %s%s\n", d->name, cli->host,
           d->ready ? "ready" : "not ready: ", d->ready ? "" : d->not_ready);
    printf("since start: %llu fetch requests, %llu layers delivered (%s), %llu misses, %llu "
           "fallbacks, %llu corrupt blocks\n",
           (unsigned long long)st->requests, (unsigned long long)st->layers,
           kvedge_cli_bytes(st->bytes, b, sizeof b), (unsigned long long)st->misses,
           (unsigned long long)st->fallbacks, (unsigned long long)st->corrupt);
    printf("sources: %u up of %u, %llu failures (kvedge -H %s sources)\n", up, d->proxy.nsources,
           (unsigned long long)st->source_failures, cli->host);
    return KVEDGE_EXIT_OK;
}

static const kvedge_cmdopts_t s_stat_opts = {
    .command = "stat",
    .summary = "Node statistics.",
    .about = "Node-wide counters: blocks, bytes, gets, hits, misses, corrupt, and the\n"
             "I/O analyzer's summary; on an edge proxy, its fetch counters and sources.\n",
    .struct_size = sizeof(s_none_t)};

static int s_r_stat(kvedge_cli_t *cli, const void *unused)
{
    (void)unused;
    kvedge_client_t *c;
    int ex = kvedge_cli_connect(cli, "kvedge-cli", &c);
    if (ex)
        return ex;
    kvedge_top_doc_t *d = calloc(1, sizeof *d);
    char *json = NULL;
    size_t len = 0;
    const kvedge_node_info_t *ni = kvedge_client_node(c);
    int rc = d ? KVEDGE_OK : KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK && ni && ni->role == KVEDGE_ROLE_PROXY) {
        rc = kvedge_client_monitor(c, 0, &json, &len);
        if (rc == KVEDGE_OK)
            rc = kvedge_top_doc_parse(json, len, d);
        kvedge_client_destroy(&c);
        free(json);
        ex = rc == KVEDGE_OK ? s_r_stat_proxy(cli, d) : s_fail("stat", rc);
        free(d);
        return ex;
    }
    kvedge_engine_stats_t st;
    if (rc == KVEDGE_OK)
        rc = kvedge_client_stat(c, &st);
    /* The analyzer's line when the node answers MONITOR (older nodes do not). */
    bool mon = rc == KVEDGE_OK &&
               kvedge_client_monitor(c, KVEDGE_WIRE_MAX_MONITOR_TOP, &json, &len) == KVEDGE_OK &&
               kvedge_top_doc_parse(json, len, d) == KVEDGE_OK && d->kind == KVEDGE_TOP_DOC_NODE &&
               d->node.analyzer;
    free(json);
    kvedge_client_destroy(&c);
    if (rc != KVEDGE_OK) {
        free(d);
        return s_fail("stat", rc);
    }
    uint64_t requests = 0;
    for (uint32_t i = 0; mon && i < d->node.nops; i++)
        requests += d->node.ops[i].requests;
    uint64_t reads = mon ? d->node.hits + d->node.misses : 0;
    double ratio = reads ? (double)d->node.hits / (double)reads : 0;
    char extra[256] = "";
    if (mon)
        snprintf(extra, sizeof extra,
                 ",\"analyzer\":{\"requests\":%llu,\"hits\":%llu,\"misses\":%llu,"
                 "\"hit_ratio\":%.4f,\"hot_prefixes\":%u}",
                 (unsigned long long)requests, (unsigned long long)d->node.hits,
                 (unsigned long long)d->node.misses, ratio, d->node.hot.nprefixes);
    s_print_stats(cli, &st, extra);
    if (mon && !cli->json)
        printf("analyzer: %llu requests, hit ratio %.1f%% (%llu hits, %llu misses), %u%s hot "
               "prefixes tracked (kvedge -H %s top)\n",
               (unsigned long long)requests, 100.0 * ratio, (unsigned long long)d->node.hits,
               (unsigned long long)d->node.misses, d->node.hot.nprefixes,
               d->node.hot.nprefixes == KVEDGE_WIRE_MAX_MONITOR_TOP ? "+" : "", cli->host);
    free(d);
    return KVEDGE_EXIT_OK;
}

static const kvedge_cmdopts_t s_inspect_opts = {
    .command = "inspect",
    .summary = "Summarize this tenant on the node, and the node.",
    .about = "Summarizes this tenant on the node, and the node.\n",
    .struct_size = sizeof(s_none_t)};

static int s_r_inspect(kvedge_cli_t *cli, const void *unused)
{
    (void)unused;
    kvedge_client_t *c;
    int ex = kvedge_cli_connect(cli, "kvedge-cli", &c);
    if (ex)
        return ex;
    kvedge_engine_stats_t st;
    kvedge_chunk_entry_t *all = NULL;
    size_t n = 0;
    int rc = kvedge_client_stat(c, &st);
    if (rc == KVEDGE_OK)
        rc = kvedge_client_list_all(c, &all, &n);
    const kvedge_node_info_t *node = kvedge_client_node(c);
    char nodename[256];
    snprintf(nodename, sizeof nodename, "%s", node ? node->name : "?");
    kvedge_client_destroy(&c);
    if (rc != KVEDGE_OK)
        return s_fail("inspect", rc);
    uint64_t bytes = 0, fp16 = 0, blocks = 0, tokens = 0;
    for (size_t i = 0; i < n; i++) {
        bytes += all[i].bytes;
        fp16 += all[i].fp16_bytes;
        blocks += all[i].blocks;
        tokens += all[i].chunk.tokens;
    }
    char b1[32], b2[32];
    if (cli->json) {
        printf("{\"node\":");
        kvedge_cli_json_str(stdout, nodename);
        printf(",\"tenant_chunks\":%zu,\"tenant_blocks\":%llu,\"tenant_bytes\":%llu,"
               "\"tenant_fp16_bytes\":%llu,\"tenant_tokens\":%llu,\"node_blocks\":%llu,"
               "\"node_bytes\":%llu}\n",
               n, (unsigned long long)blocks, (unsigned long long)bytes, (unsigned long long)fp16,
               (unsigned long long)tokens, (unsigned long long)st.blocks,
               (unsigned long long)st.bytes);
    } else {
        printf("node %s (%s): this tenant has %zu prefix chunks, %llu tokens, %llu blocks\n",
               nodename, cli->host, n, (unsigned long long)tokens, (unsigned long long)blocks);
        printf("stored %s for %s of fp16 KV: %.2fx\n", kvedge_cli_bytes(bytes, b1, 32),
               kvedge_cli_bytes(fp16, b2, 32), bytes ? (double)fp16 / (double)bytes : 0.0);
        s_print_stats(cli, &st, NULL);
    }
    free(all);
    return KVEDGE_EXIT_OK;
}

typedef struct {
    bool json;
    uint32_t layer;
    uint64_t shown, bad;
} s_show_t;

static void s_show_block(void *ctx, uint32_t chunk_index, uint16_t head, int status,
                         const uint8_t *data, size_t len)
{
    (void)chunk_index;
    s_show_t *s = ctx;
    kvedge_block_info_t info;
    int rc = status == KVEDGE_OK ? kvedge_block_parse(data, len, &info) : status;
    /* A head the node does not have is a miss, not damage. */
    const char *state = rc == KVEDGE_OK          ? "ok"
                        : rc == KVEDGE_ENOTFOUND ? "missing"
                                                 : kvedge_errname(rc);
    s->bad += rc != KVEDGE_OK && rc != KVEDGE_ENOTFOUND;
    if (s->json) {
        printf("%s{\"layer\":%u,\"head\":%u,\"bytes\":%zu,\"state\":\"%s\"", s->shown ? "," : "",
               s->layer, head, len, state);
        if (rc == KVEDGE_OK)
            printf(",\"scheme\":\"%s\",\"dtype\":\"%s\",\"key_channels\":%u,\"head_dim\":%u",
                   kvedge_scheme_name(info.scheme), kvedge_dtype_name(info.dtype),
                   info.key_channels, info.head_dim);
        printf("}");
    } else if (rc == KVEDGE_OK) {
        printf("%5u %4u %-8s %-5s %4u/%-4u %9zu %s\n", s->layer, head,
               kvedge_scheme_name(info.scheme), kvedge_dtype_name(info.dtype), info.key_channels,
               info.head_dim, len, state);
    } else {
        printf("%5u %4u %-8s %-5s %9s %9s %s\n", s->layer, head, "-", "-", "-", "-", state);
    }
    s->shown++;
}

typedef kvedge_cli_show_opts_t s_show_opts_t;

static const kvedge_cmdopts_t s_show_opts = {
    .command = "show",
    .summary = "Fetch and verify every block of a prefix chunk.",
    .about = "Fetches every block of the prefix chunk (or of layer L) from the node and\n"
             "verifies it after the network: per layer and head, scheme, dtype, kept key\n"
             "channels, bytes and state.\n",
    KVEDGE_CMDOPTS_OF(s_show_opts_t, kvedge_cli_show_list)};

/* Fetches and prints every block of chunk id (of layer only, or of all when only < 0), layer
 * by layer through GET_LAYER until the node says the layer is past the model (ESHAPE). */
static int s_show_layers(kvedge_client_t *c, const kvedge_chunk_id_t *id, int64_t only, s_show_t *s)
{
    int rc = KVEDGE_OK;
    for (uint32_t layer = only >= 0 ? (uint32_t)only : 0; layer < KVEDGE_MODEL_MAX_LAYERS;
         layer++) {
        s->layer = layer;
        uint8_t *buf = malloc(64u << 20);
        kvedge_fetched_t *out = calloc(KVEDGE_MODEL_MAX_HEADS, sizeof *out);
        uint32_t heads = 0;
        rc = buf && out ? kvedge_client_get_layer(c, id, 1, (uint16_t)layer, buf, 64u << 20, out,
                                                  KVEDGE_MODEL_MAX_HEADS, &heads)
                        : KVEDGE_ENOMEM;
        for (uint32_t h = 0; rc == KVEDGE_OK && h < heads; h++)
            s_show_block(s, 0, (uint16_t)h, out[h].status, buf + out[h].offset, out[h].len);
        free(buf);
        free(out);
        if (rc == KVEDGE_ESHAPE)
            return KVEDGE_OK;
        if (rc != KVEDGE_OK || only >= 0)
            break;
    }
    return rc;
}

static int s_r_show(kvedge_cli_t *cli, const void *opts)
{
    const s_show_opts_t *o = opts;
    int64_t only = o->layer == UINT32_MAX ? -1 : (int64_t)o->layer;
    kvedge_client_t *c;
    int ex = kvedge_cli_connect(cli, "kvedge-cli", &c);
    if (ex)
        return ex;
    kvedge_chunk_entry_t e;
    if ((ex = s_resolve(cli, c, o->prefix, &e)) != 0) {
        kvedge_client_destroy(&c);
        return ex;
    }
    kvedge_model_t m; /* a layer past the model is a mistake, not an empty table */
    if (only >= 0 && kvedge_client_get_model(c, e.chunk.model_id, &m) == KVEDGE_OK &&
        only >= m.layers) {
        kvedge_cli_error("show: --layer %lld is past the %u layers of %s (0 to %u)",
                         (long long)only, m.layers, m.id, m.layers - 1u);
        kvedge_client_destroy(&c);
        return KVEDGE_EXIT_USAGE;
    }
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES];
    kvedge_chunk_id_hex(&e.chunk.id, hex);
    if (cli->json)
        printf("{\"prefix\":\"%s\",\"model\":\"%s\",\"chunk\":%u,\"tokens\":%u,\"blocks\":[", hex,
               e.chunk.model_id, e.chunk.index, e.chunk.tokens);
    else
        printf("prefix %s\nmodel  %s   chunk #%u   tokens %u   (node %s)\n\n%5s %4s %-8s %-5s "
               "%9s %9s %s\n",
               hex, e.chunk.model_id, e.chunk.index, e.chunk.tokens, cli->host, "LAYER", "HEAD",
               "SCHEME", "DTYPE", "CHANNELS", "BYTES", "STATE");
    s_show_t s = {cli->json, 0, 0, 0};
    int rc = s_show_layers(c, &e.chunk.id, only, &s);
    kvedge_client_destroy(&c);
    if (cli->json)
        printf("],\"corrupt\":%llu}\n", (unsigned long long)s.bad);
    else
        printf("\n%llu blocks shown, %llu failed verification\n", (unsigned long long)s.shown,
               (unsigned long long)s.bad);
    if (rc != KVEDGE_OK)
        return s_fail("show", rc);
    return s.bad ? KVEDGE_EXIT_CORRUPT : KVEDGE_EXIT_OK;
}

/* verify over the network: every block of every chunk of the tenant, fetched and checked. */
static const kvedge_cmdopts_t s_verify_opts = {
    .command = "verify",
    .summary = "Fetch and verify every block of this tenant.",
    .about = "Fetches every block of this tenant and verifies it after the network.\n",
    .struct_size = sizeof(s_none_t)};

static int s_r_verify(kvedge_cli_t *cli, const void *unused)
{
    (void)unused;
    kvedge_client_t *c;
    int ex = kvedge_cli_connect(cli, "kvedge-cli", &c);
    if (ex)
        return ex;
    kvedge_chunk_entry_t *all = NULL;
    size_t n = 0;
    int rc = kvedge_client_list_all(c, &all, &n);
    uint64_t checked = 0, bad = 0;
    uint8_t *buf = malloc(64u << 20);
    kvedge_fetched_t *out = calloc(KVEDGE_MODEL_MAX_HEADS, sizeof *out);
    if (rc == KVEDGE_OK && (!buf || !out))
        rc = KVEDGE_ENOMEM;
    for (size_t i = 0; rc == KVEDGE_OK && i < n; i++) {
        uint64_t seen = 0;
        for (uint32_t layer = 0; rc == KVEDGE_OK && seen < all[i].blocks; layer++) {
            uint32_t heads = 0;
            rc = kvedge_client_get_layer(c, &all[i].chunk.id, 1, (uint16_t)layer, buf, 64u << 20,
                                         out, KVEDGE_MODEL_MAX_HEADS, &heads);
            if (rc == KVEDGE_ESHAPE) {
                rc = KVEDGE_OK;
                break;
            }
            for (uint32_t h = 0; rc == KVEDGE_OK && h < heads; h++) {
                if (out[h].status == KVEDGE_ENOTFOUND)
                    continue;
                kvedge_block_info_t info;
                int st = out[h].status == KVEDGE_OK
                             ? kvedge_block_parse(buf + out[h].offset, out[h].len, &info)
                             : out[h].status;
                checked++;
                seen++;
                if (st != KVEDGE_OK) {
                    char hex[KVEDGE_CHUNK_ID_HEX_BYTES];
                    bad++;
                    if (!cli->json)
                        printf("corrupt: prefix %s layer %u head %u: %s\n",
                               kvedge_chunk_id_hex(&all[i].chunk.id, hex), layer, h,
                               kvedge_strerror(st));
                }
            }
        }
    }
    free(buf);
    free(out);
    free(all);
    kvedge_client_destroy(&c);
    if (rc != KVEDGE_OK)
        return s_fail("verify", rc);
    if (cli->json)
        printf("{\"checked\":%llu,\"corrupt\":%llu}\n", (unsigned long long)checked,
               (unsigned long long)bad);
    else
        printf("verified %llu blocks over the network: %llu ok, %llu corrupt\n",
               (unsigned long long)checked, (unsigned long long)(checked - bad),
               (unsigned long long)bad);
    return bad ? KVEDGE_EXIT_CORRUPT : KVEDGE_EXIT_OK;
}

/* pin/unpin a prefix: the chunk and every chunk above it in its chain; delete: the chunk and
 * every chunk below it (the node follows the chain down). */
static int s_r_chain(kvedge_cli_t *cli, const char *prefix, int op)
{
    const char *name = op == 0 ? "delete" : op > 0 ? "pin" : "unpin";
    kvedge_client_t *c;
    int ex = kvedge_cli_connect(cli, "kvedge-cli", &c);
    if (ex)
        return ex;
    kvedge_chunk_entry_t e;
    if ((ex = s_resolve(cli, c, prefix, &e)) != 0) {
        kvedge_client_destroy(&c);
        return ex;
    }
    kvedge_chunk_id_t ids[KVEDGE_MODEL_MAX_LAYERS];
    size_t n = 0;
    ids[n++] = e.chunk.id;
    if (op != 0) { /* walk up the chain through LIST entries */
        kvedge_chunk_entry_t *all;
        size_t na;
        if (kvedge_client_list_all(c, &all, &na) == KVEDGE_OK) {
            kvedge_chunk_entry_t cur = e;
            while (cur.chunk.has_parent && n < sizeof ids / sizeof ids[0]) {
                size_t j = 0;
                while (j < na && memcmp(&all[j].chunk.id, &cur.chunk.parent, sizeof ids[0]) != 0)
                    j++;
                if (j == na)
                    break;
                cur = all[j];
                ids[n++] = cur.chunk.id;
            }
            free(all);
        }
    }
    uint32_t changed[KVEDGE_MODEL_MAX_LAYERS];
    int rc = op == 0 ? kvedge_client_delete(c, ids, 1, changed)
                     : kvedge_client_pin(c, ids, n, op > 0, changed);
    kvedge_client_destroy(&c);
    if (rc != KVEDGE_OK)
        return s_fail(name, rc);
    uint64_t total = 0;
    for (size_t i = 0; i < (op == 0 ? 1 : n); i++)
        total += changed[i];
    const char *verb = op == 0 ? "deleted" : op > 0 ? "pinned" : "unpinned";
    if (cli->json)
        printf("{\"%s\":%llu,\"chunks\":%zu}\n", verb, (unsigned long long)total,
               op == 0 ? (size_t)1 : n);
    else
        printf("%s %llu blocks in %zu chunks\n", verb, (unsigned long long)total,
               op == 0 ? (size_t)1 : n);
    return KVEDGE_EXIT_OK;
}

static const kvedge_cmdopts_t s_pin_opts = {
    .command = "pin",
    .summary = "Pin a prefix and its chain.",
    .about = "Pins the prefix chunk and every chunk above it in its chain.\n",
    KVEDGE_CMDOPTS_OF(s_prefix_opts_t, kvedge_cli_prefix_list)};

static const kvedge_cmdopts_t s_unpin_opts = {
    .command = "unpin",
    .summary = "Unpin a prefix and its chain.",
    .about = "Unpins the prefix chunk and every chunk above it in its chain.\n",
    KVEDGE_CMDOPTS_OF(s_prefix_opts_t, kvedge_cli_prefix_list)};

static const kvedge_cmdopts_t s_delete_opts = {
    .command = "delete",
    .summary = "Delete a prefix chunk and the chunks below it.",
    .about = "Deletes the prefix chunk and every chunk chained below it.\n",
    KVEDGE_CMDOPTS_OF(s_prefix_opts_t, kvedge_cli_prefix_list)};

static int s_r_pin(kvedge_cli_t *cli, const void *opts)
{
    return s_r_chain(cli, ((const s_prefix_opts_t *)opts)->prefix, 1);
}

static int s_r_unpin(kvedge_cli_t *cli, const void *opts)
{
    return s_r_chain(cli, ((const s_prefix_opts_t *)opts)->prefix, -1);
}

static int s_r_delete(kvedge_cli_t *cli, const void *opts)
{
    return s_r_chain(cli, ((const s_prefix_opts_t *)opts)->prefix, 0);
}

typedef struct {
    uint64_t count, size;
} s_ping_opts_t;

static const kvedge_cmdopt_t s_ping_list[] = {
    {.name = "count",
     .letter = 'c',
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_ping_opts_t, count),
     .min = 1,
     .max = 100000,
     .def_num = S_PING_ROUNDS,
     .help = "rounds"},
    {.name = "size",
     .letter = 's',
     .arg = "SIZE",
     .type = KVEDGE_CMDOPT_SIZE,
     KVEDGE_CMDOPT_AT(s_ping_opts_t, size),
     .max = 16u << 20,
     .def_num = 4u << 20,
     .help = "payload of the bandwidth PINGs"},
};

static const kvedge_cmdopts_t s_ping_opts = {
    .command = "ping",
    .summary = "Round-trip latency and bandwidth.",
    .about = "Round-trip latency (empty PINGs) and measured bandwidth (PINGs of SIZE\n"
             "bytes): medians over N rounds.\n",
    KVEDGE_CMDOPTS_OF(s_ping_opts_t, s_ping_list)};

/* Sorts v[0..n) in place (insertion: n is small). */
static void s_sort(double *v, uint64_t n)
{
    for (uint64_t i = 1; i < n; i++)
        for (uint64_t j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
}

static int s_r_ping(kvedge_cli_t *cli, const void *opts)
{
    uint64_t count = ((const s_ping_opts_t *)opts)->count;
    uint64_t size = ((const s_ping_opts_t *)opts)->size;
    kvedge_client_t *c;
    int ex = kvedge_cli_connect(cli, "kvedge-cli", &c);
    if (ex)
        return ex;
    double *rtt = calloc(count, sizeof *rtt), *bw = calloc(count, sizeof *bw);
    int rc = rtt && bw ? KVEDGE_OK : KVEDGE_ENOMEM;
    for (uint64_t i = 0; rc == KVEDGE_OK && i < count; i++) {
        rc = kvedge_client_ping(c, 0, &rtt[i], NULL);
        if (rc == KVEDGE_OK)
            rc = kvedge_client_ping(c, size, NULL, &bw[i]);
    }
    kvedge_client_destroy(&c);
    if (rc != KVEDGE_OK) {
        free(rtt);
        free(bw);
        return s_fail("ping", rc);
    }
    /* medians: these links are noisy */
    s_sort(rtt, count);
    s_sort(bw, count);
    double rtt_med = rtt[count / 2], bw_med = bw[count / 2];
    if (cli->json)
        printf("{\"rtt_us_p50\":%.1f,\"rtt_us_min\":%.1f,\"bandwidth_bytes_per_s_p50\":%.0f,"
               "\"rounds\":%llu,\"size\":%llu}\n",
               rtt_med, rtt[0], bw_med, (unsigned long long)count, (unsigned long long)size);
    else
        printf("%s: rtt p50 %.1f us (min %.1f us), bandwidth p50 %.1f MB/s with %llu-byte "
               "payloads, %llu rounds\n",
               cli->host, rtt_med, rtt[0], bw_med / 1e6, (unsigned long long)size,
               (unsigned long long)count);
    free(rtt);
    free(bw);
    return KVEDGE_EXIT_OK;
}

typedef kvedge_cli_evict_opts_t s_evict_opts_t;

static const kvedge_cmdopts_t s_evict_opts = {
    .command = "evict",
    .summary = "Store-wide LRU eviction (admin key).",
    .about = "Store-wide LRU eviction of unpinned blocks on the node; needs an admin key.\n",
    KVEDGE_CMDOPTS_OF(s_evict_opts_t, kvedge_cli_evict_list)};

static int s_r_evict(kvedge_cli_t *cli, const void *opts)
{
    uint64_t target = ((const s_evict_opts_t *)opts)->to;
    kvedge_client_t *c;
    int ex = kvedge_cli_connect(cli, "kvedge-cli", &c);
    if (ex)
        return ex;
    uint64_t blocks = 0, bytes = 0;
    int rc = kvedge_client_evict(c, target, &blocks, &bytes);
    kvedge_client_destroy(&c);
    if (rc == KVEDGE_EDENIED) {
        kvedge_cli_error("evict: denied: eviction is store-wide and needs an admin key "
                         "(kvedge keygen --admin, listed in the node's allowlist)");
        return kvedge_cli_exit_code(rc);
    }
    if (rc == KVEDGE_EFULL) {
        kvedge_cli_error("evict: pinned blocks alone exceed the target");
        return KVEDGE_EXIT_FAILURE;
    }
    if (rc != KVEDGE_OK)
        return s_fail("evict", rc);
    char b[32];
    if (cli->json)
        printf("{\"evicted_blocks\":%llu,\"evicted_bytes\":%llu}\n", (unsigned long long)blocks,
               (unsigned long long)bytes);
    else
        printf("evicted %llu blocks (%s) on %s\n", (unsigned long long)blocks,
               kvedge_cli_bytes(bytes, b, sizeof b), cli->host);
    return KVEDGE_EXIT_OK;
}

const kvedge_cli_cmd_t kvedge_cli_remote_cmds[] = {
    {.name = "inspect", .opts = &s_inspect_opts, .exec = s_r_inspect},
    {.name = "ls", .opts = &s_ls_opts, .exec = s_r_ls},
    {.name = "show", .opts = &s_show_opts, .exec = s_r_show},
    {.name = "verify", .opts = &s_verify_opts, .exec = s_r_verify},
    {.name = "evict", .opts = &s_evict_opts, .exec = s_r_evict},
    {.name = "pin", .opts = &s_pin_opts, .exec = s_r_pin},
    {.name = "unpin", .opts = &s_unpin_opts, .exec = s_r_unpin},
    {.name = "delete", .opts = &s_delete_opts, .exec = s_r_delete},
    {.name = "stat", .opts = &s_stat_opts, .exec = s_r_stat},
    {.name = "ping", .opts = &s_ping_opts, .exec = s_r_ping},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};
