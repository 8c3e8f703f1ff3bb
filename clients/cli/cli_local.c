/* The kvedge admin commands in local mode: they open the store directory themselves.
 * Inspection commands open it read-only, so they also work beside a running node.
 * put-synthetic is one command for both modes: with -H it writes through a node. */
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "clients/cli/cli.h"
#include "clients/cli/cli_admin.h"
#include "clients/lib/kvedge.h"
#include "access/codec/error.h"
#include "access/codec/quant.h"
#include "access/codec/synth.h"

#define S_SHORT_ID_DIGITS 16
#define S_VOCAB_SIZE      50272 /* OPT's vocabulary: synthetic token ids are drawn from it */
#define S_SALT_DEFAULT    "local"
#define S_TOKENS_DEFAULT  1024
#define S_TOKENS_MAX      (1u << 24) /* put-synthetic --tokens */
#define S_TOKENS_UNFORCED (1u << 20) /* put-synthetic --tokens past this wants --force */

/* ---- options shared by several commands ---- */

/* The options of the commands without any (inspect, repair, models). */
typedef struct {
    char unused;
} s_none_t;

/* The commands that name one prefix (pin, unpin, delete). */
typedef kvedge_cli_prefix_opts_t s_prefix_opts_t;

/* Resolves a PREFIX argument (hex, at least 4 digits) to a chunk, with clear errors. */
static int s_resolve(kvedge_cli_t *cli, kvedge_engine_t *e, const char *arg,
                     kvedge_chunk_info_t *info)
{
    kvedge_chunk_id_t id;
    int rc = kvedge_engine_find_chunk(e, arg, &id);
    if (rc == KVEDGE_OK)
        rc = kvedge_engine_get_chunk(e, &id, info);
    switch (rc) {
    case KVEDGE_OK:
        return KVEDGE_EXIT_OK;
    case KVEDGE_EINVAL:
        kvedge_cli_error("'%s' is not a prefix id (give at least 4 hex digits, see kvedge ls)",
                         arg);
        return KVEDGE_EXIT_USAGE;
    case KVEDGE_EAMBIGUOUS:
        kvedge_cli_error("prefix id '%s' is ambiguous in %s: give more digits", arg, cli->data_dir);
        return KVEDGE_EXIT_USAGE;
    case KVEDGE_ENOTFOUND:
        kvedge_cli_error("no prefix '%s' in %s (see kvedge ls)", arg, cli->data_dir);
        return KVEDGE_EXIT_NOTFOUND;
    default:
        kvedge_cli_error("cannot look up prefix '%s': %s", arg, kvedge_strerror(rc));
        return kvedge_cli_exit_code(rc);
    }
}

/* ---- aggregation of chunks and blocks (inspect, ls) ---- */

typedef struct {
    kvedge_chunk_info_t info;
    uint64_t blocks, bytes, fp16_bytes, pinned;
    uint32_t layers_max, heads_max; /* highest layer / head seen, plus one */
    unsigned schemes;               /* bit per kvedge_scheme_t */
    unsigned dtypes;                /* bit per kvedge_dtype_t */
} s_chunk_row_t;

typedef struct {
    s_chunk_row_t *rows;
    size_t n, cap;
    int err;
} s_chunks_t;

static int s_collect_chunk(void *ctx, const kvedge_chunk_info_t *info)
{
    s_chunks_t *c = ctx;
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        s_chunk_row_t *r = realloc(c->rows, cap * sizeof *r);
        if (!r)
            return c->err = KVEDGE_ENOMEM;
        c->rows = r;
        c->cap = cap;
    }
    memset(&c->rows[c->n], 0, sizeof c->rows[0]);
    c->rows[c->n++].info = *info;
    return 0;
}

static int s_row_cmp(const void *a, const void *b)
{
    return memcmp(((const s_chunk_row_t *)a)->info.id.bytes,
                  ((const s_chunk_row_t *)b)->info.id.bytes, KVEDGE_CHUNK_ID_BYTES);
}

static int s_collect_meta(void *ctx, const kvedge_block_key_t *key, const kvedge_block_meta_t *m)
{
    s_chunks_t *c = ctx;
    s_chunk_row_t probe;
    probe.info.id = key->chunk;
    s_chunk_row_t *r = bsearch(&probe, c->rows, c->n, sizeof *r, s_row_cmp);
    if (!r)
        return 0; /* a block whose chunk record is gone: verify reports it */
    r->blocks++;
    r->bytes += m->bytes;
    r->fp16_bytes += kvedge_block_fp16_bytes(m->tokens, m->head_dim);
    r->pinned += m->pinned;
    if ((uint32_t)key->layer + 1 > r->layers_max)
        r->layers_max = key->layer + 1u;
    if ((uint32_t)key->head + 1 > r->heads_max)
        r->heads_max = key->head + 1u;
    r->schemes |= 1u << m->scheme;
    r->dtypes |= 1u << m->dtype;
    return 0;
}

static int s_load_chunks(kvedge_engine_t *e, s_chunks_t *c)
{
    memset(c, 0, sizeof *c);
    int rc = kvedge_engine_list_chunks(e, s_collect_chunk, c);
    if (rc == KVEDGE_OK && c->err)
        rc = c->err;
    if (rc == KVEDGE_OK) {
        if (c->n)
            qsort(c->rows, c->n, sizeof c->rows[0], s_row_cmp);
        rc = kvedge_engine_scan(e, NULL, s_collect_meta, c);
    }
    return rc;
}

static const char *s_schemes(unsigned mask, char *buf, size_t len)
{
    buf[0] = '\0';
    for (int s = KVEDGE_SCHEME_LOSSLESS; s <= KVEDGE_SCHEME_INT4; s++)
        if (mask & (1u << s)) {
            if (buf[0])
                strncat(buf, ",", len - strlen(buf) - 1);
            strncat(buf, kvedge_scheme_name((kvedge_scheme_t)s), len - strlen(buf) - 1);
        }
    if (!buf[0])
        snprintf(buf, len, "-");
    return buf;
}

static double s_ratio(uint64_t fp16, uint64_t stored)
{
    return stored ? (double)fp16 / (double)stored : 0.0;
}

/* ---- inspect ---- */

typedef struct {
    const char *model;
    kvedge_model_t shape;
    uint64_t chunks, tokens, blocks, bytes, fp16_bytes, pinned;
    unsigned schemes;
} s_model_row_t;

/* What inspect found: the store's chunks, summed per model, and its totals. */
typedef struct {
    s_chunks_t c;
    s_model_row_t *m;
    size_t nm;
    kvedge_engine_stats_t st;
} s_inspect_t;

static const kvedge_cmdopts_t s_inspect_opts = {
    .command = "inspect",
    .summary = "Summarize the store: models, prefixes, bytes, compression.",
    .about = "Per model: prefix chunks, tokens, layers x KV heads x head_dim, blocks,\n"
             "bytes stored against their fp16 size, schemes and compression ratio.\n",
    .struct_size = sizeof(s_none_t)};

static int s_inspect_run(kvedge_engine_t *e, s_inspect_t *r)
{
    int rc = s_load_chunks(e, &r->c);
    if (rc == KVEDGE_OK)
        rc = kvedge_engine_stats(e, &r->st);
    r->m = calloc(r->c.n + 1, sizeof *r->m);
    s_model_row_t *m = r->m;
    for (size_t i = 0; rc == KVEDGE_OK && m && i < r->c.n; i++) {
        const s_chunk_row_t *row = &r->c.rows[i];
        size_t j = 0;
        while (j < r->nm && strcmp(m[j].model, row->info.model_id) != 0)
            j++;
        if (j == r->nm) {
            m[j].model = row->info.model_id;
            if (kvedge_engine_get_tenant_model(e, row->info.tenant, m[j].model, &m[j].shape) !=
                KVEDGE_OK)
                memset(&m[j].shape, 0, sizeof m[j].shape);
            r->nm++;
        }
        m[j].chunks++;
        m[j].tokens += row->info.tokens;
        m[j].blocks += row->blocks;
        m[j].bytes += row->bytes;
        m[j].fp16_bytes += row->fp16_bytes;
        m[j].pinned += row->pinned;
        m[j].schemes |= row->schemes;
    }
    return rc == KVEDGE_OK && !m ? KVEDGE_ENOMEM : rc;
}

static void s_inspect_json(const kvedge_cli_t *cli, const s_inspect_t *r)
{
    const kvedge_engine_stats_t *st = &r->st;
    printf("{\"store\":");
    kvedge_cli_json_str(stdout, cli->data_dir);
    printf(",\"blocks\":%llu,\"bytes\":%llu,\"fp16_bytes\":%llu,\"pinned_blocks\":%llu,"
           "\"quarantined\":%llu,\"chunks\":%zu,\"models\":[",
           (unsigned long long)st->blocks, (unsigned long long)st->bytes,
           (unsigned long long)st->fp16_bytes, (unsigned long long)st->pinned_blocks,
           (unsigned long long)st->quarantined, r->c.n);
    for (size_t j = 0; j < r->nm; j++) {
        const s_model_row_t *m = &r->m[j];
        char sch[32];
        printf("%s{\"model\":", j ? "," : "");
        kvedge_cli_json_str(stdout, m->model);
        printf(",\"layers\":%u,\"kv_heads\":%u,\"head_dim\":%u,\"chunks\":%llu,"
               "\"tokens\":%llu,\"blocks\":%llu,\"bytes\":%llu,\"fp16_bytes\":%llu,"
               "\"pinned_blocks\":%llu,\"ratio\":%.3f,\"schemes\":\"%s\"}",
               m->shape.layers, m->shape.kv_heads, m->shape.head_dim, (unsigned long long)m->chunks,
               (unsigned long long)m->tokens, (unsigned long long)m->blocks,
               (unsigned long long)m->bytes, (unsigned long long)m->fp16_bytes,
               (unsigned long long)m->pinned, s_ratio(m->fp16_bytes, m->bytes),
               s_schemes(m->schemes, sch, sizeof sch));
    }
    printf("]}\n");
}

static void s_inspect_text(const kvedge_cli_t *cli, const s_inspect_t *r)
{
    const kvedge_engine_stats_t *st = &r->st;
    char b1[32], b2[32];
    printf("store %s: %zu model%s, %zu prefix chunks, %llu blocks (%llu pinned), "
           "%llu quarantined\n",
           cli->data_dir, r->nm, r->nm == 1 ? "" : "s", r->c.n, (unsigned long long)st->blocks,
           (unsigned long long)st->pinned_blocks, (unsigned long long)st->quarantined);
    printf("stored %s for %s of fp16 KV: %.2fx\n\n", kvedge_cli_bytes(st->bytes, b1, 32),
           kvedge_cli_bytes(st->fp16_bytes, b2, 32), s_ratio(st->fp16_bytes, st->bytes));
    printf("%-16s %6s %5s %4s %6s %7s %8s %11s %11s %7s  %s\n", "MODEL", "LAYERS", "HEADS", "DIM",
           "CHUNKS", "TOKENS", "BLOCKS", "STORED", "FP16", "RATIO", "SCHEMES");
    for (size_t j = 0; j < r->nm; j++) {
        const s_model_row_t *m = &r->m[j];
        char sch[32];
        printf("%-16s %6u %5u %4u %6llu %7llu %8llu %11s %11s %6.2fx  %s\n", m->model,
               m->shape.layers, m->shape.kv_heads, m->shape.head_dim, (unsigned long long)m->chunks,
               (unsigned long long)m->tokens, (unsigned long long)m->blocks,
               kvedge_cli_bytes(m->bytes, b1, 32), kvedge_cli_bytes(m->fp16_bytes, b2, 32),
               s_ratio(m->fp16_bytes, m->bytes), s_schemes(m->schemes, sch, sizeof sch));
    }
    if (r->nm == 0)
        printf("(empty)\n");
}

static int s_inspect(kvedge_cli_t *cli, const void *opts)
{
    (void)opts;
    kvedge_engine_t *e;
    int ex = kvedge_cli_open(cli, false, &e);
    if (ex)
        return ex;
    s_inspect_t r;
    memset(&r, 0, sizeof r);
    int rc = s_inspect_run(e, &r);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("inspect %s: %s", cli->data_dir, kvedge_strerror(rc));
        ex = kvedge_cli_exit_code(rc);
    } else if (cli->json) {
        s_inspect_json(cli, &r);
    } else {
        s_inspect_text(cli, &r);
    }
    free(r.m);
    free(r.c.rows);
    kvedge_engine_destroy(&e);
    return ex;
}

/* ---- ls ---- */

typedef kvedge_cli_ls_opts_t s_ls_opts_t;

static const kvedge_cmdopts_t s_ls_opts = {.command = "ls",
                                           .summary = "List prefix chunks.",
                                           KVEDGE_CMDOPTS_OF(s_ls_opts_t, kvedge_cli_ls_list)};

static void s_ls_json(const s_chunk_row_t *r, size_t shown)
{
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES], phex[KVEDGE_CHUNK_ID_HEX_BYTES], sch[32];
    kvedge_chunk_id_hex(&r->info.id, hex);
    printf("%s{\"prefix\":\"%s\",\"parent\":", shown ? "," : "", hex);
    if (r->info.has_parent)
        printf("\"%s\"", kvedge_chunk_id_hex(&r->info.parent, phex));
    else
        printf("null");
    printf(",\"model\":");
    kvedge_cli_json_str(stdout, r->info.model_id);
    printf(",\"chunk\":%u,\"tokens\":%u,\"layers\":%u,\"kv_heads\":%u,\"blocks\":%llu,"
           "\"bytes\":%llu,\"fp16_bytes\":%llu,\"pinned_blocks\":%llu,"
           "\"schemes\":\"%s\"}",
           r->info.index, r->info.tokens, r->layers_max, r->heads_max,
           (unsigned long long)r->blocks, (unsigned long long)r->bytes,
           (unsigned long long)r->fp16_bytes, (unsigned long long)r->pinned,
           s_schemes(r->schemes, sch, sizeof sch));
}

static void s_ls_text(const s_chunk_row_t *r, bool full)
{
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES], sch[32], b[32];
    kvedge_chunk_id_hex(&r->info.id, hex);
    if (!full)
        hex[S_SHORT_ID_DIGITS] = '\0';
    printf("%-*s %-16s %5u %6u %6u %5u %6llu %10s %6.2fx %6llu %s\n", full ? 64 : S_SHORT_ID_DIGITS,
           hex, r->info.model_id, r->info.index, r->info.tokens, r->layers_max, r->heads_max,
           (unsigned long long)r->blocks, kvedge_cli_bytes(r->bytes, b, sizeof b),
           s_ratio(r->fp16_bytes, r->bytes), (unsigned long long)r->pinned,
           s_schemes(r->schemes, sch, sizeof sch));
}

static int s_ls(kvedge_cli_t *cli, const void *opts)
{
    const s_ls_opts_t *o = opts;
    kvedge_engine_t *e;
    int ex = kvedge_cli_open(cli, false, &e);
    if (ex)
        return ex;
    s_chunks_t ch;
    int rc = s_load_chunks(e, &ch);
    kvedge_engine_destroy(&e);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("ls %s: %s", cli->data_dir, kvedge_strerror(rc));
        free(ch.rows);
        return kvedge_cli_exit_code(rc);
    }
    if (!cli->json)
        printf("%-*s %-16s %5s %6s %6s %5s %6s %10s %7s %6s %s\n", o->full ? 64 : S_SHORT_ID_DIGITS,
               "PREFIX", "MODEL", "CHUNK", "TOKENS", "LAYERS", "HEADS", "BLOCKS", "STORED", "RATIO",
               "PINNED", "SCHEMES");
    else
        printf("[");
    size_t shown = 0;
    for (size_t i = 0; i < ch.n; i++) {
        if (o->model && strcmp(o->model, ch.rows[i].info.model_id) != 0)
            continue;
        if (cli->json)
            s_ls_json(&ch.rows[i], shown);
        else
            s_ls_text(&ch.rows[i], o->full);
        shown++;
    }
    if (cli->json)
        printf("]\n");
    free(ch.rows);
    return KVEDGE_EXIT_OK;
}

/* ---- show ---- */

typedef struct {
    kvedge_engine_t *e;
    bool json;
    int layer; /* -1 = all */
    uint64_t shown, bad;
} s_show_t;

static int s_show_block(void *ctx, const kvedge_block_key_t *key, const kvedge_block_meta_t *m)
{
    s_show_t *s = ctx;
    if (s->layer >= 0 && key->layer != s->layer)
        return 0;
    kvedge_value_t v;
    int rc = kvedge_engine_get(s->e, key, &v);
    if (rc == KVEDGE_OK)
        kvedge_value_release(&v);
    const char *state = rc == KVEDGE_OK ? "ok" : rc == KVEDGE_ECORRUPT ? "CORRUPT" : "missing";
    s->bad += rc != KVEDGE_OK;
    double ratio = s_ratio(kvedge_block_fp16_bytes(m->tokens, m->head_dim), m->bytes);
    if (s->json) {
        printf("%s{\"layer\":%u,\"head\":%u,\"scheme\":\"%s\",\"dtype\":\"%s\",\"group\":%u,"
               "\"key_channels\":%u,\"head_dim\":%u,\"tokens\":%u,\"bytes\":%u,\"lz4\":%s,"
               "\"ratio\":%.3f,\"pinned\":%s,\"checksum\":\"%016llx\",\"state\":\"%s\"}",
               s->shown ? "," : "", key->layer, key->head, kvedge_scheme_name(m->scheme),
               kvedge_dtype_name(m->dtype), m->group_size, m->key_channels, m->head_dim, m->tokens,
               m->bytes, m->lz4 ? "true" : "false", ratio, m->pinned ? "true" : "false",
               (unsigned long long)m->checksum, state);
    } else {
        printf("%5u %4u %-8s %-5s %5u %4u/%-4u %9u %3s %6.2fx %6s %016llx %s\n", key->layer,
               key->head, kvedge_scheme_name(m->scheme), kvedge_dtype_name(m->dtype), m->group_size,
               m->key_channels, m->head_dim, m->bytes, m->lz4 ? "yes" : "no", ratio,
               m->pinned ? "yes" : "no", (unsigned long long)m->checksum, state);
    }
    s->shown++;
    return 0;
}

typedef kvedge_cli_show_opts_t s_show_opts_t;

static const kvedge_cmdopts_t s_show_opts = {
    .command = "show",
    .summary = "Per layer and head of a prefix: scheme, bytes, checksum.",
    .about = "Reads and verifies every block of the prefix chunk and prints, per\n"
             "layer and head: scheme, dtype, group, kept key channels, bytes, lz4,\n"
             "compression against fp16, pinned, checksum and its state.\n",
    KVEDGE_CMDOPTS_OF(s_show_opts_t, kvedge_cli_show_list)};

/* A layer past the prefix's model is a mistake, not an empty table. Returns an exit code. */
static int s_show_layer_ok(kvedge_engine_t *e, const kvedge_chunk_info_t *info, int layer)
{
    kvedge_model_t m;
    if (layer >= 0 &&
        (kvedge_engine_get_tenant_model(e, info->tenant, info->model_id, &m) == KVEDGE_OK ||
         kvedge_model_builtin(info->model_id, &m) == KVEDGE_OK) &&
        (uint32_t)layer >= m.layers) {
        kvedge_cli_error("show: --layer %d is past the %u layers of %s (0 to %u)", layer, m.layers,
                         m.id, m.layers - 1u);
        return KVEDGE_EXIT_USAGE;
    }
    return KVEDGE_EXIT_OK;
}

static void s_show_head(const kvedge_cli_t *cli, const kvedge_chunk_info_t *info)
{
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES], phex[KVEDGE_CHUNK_ID_HEX_BYTES];
    kvedge_chunk_id_hex(&info->id, hex);
    if (info->has_parent)
        kvedge_chunk_id_hex(&info->parent, phex);
    if (cli->json) {
        printf("{\"prefix\":\"%s\",\"parent\":%s%s%s,\"model\":", hex, info->has_parent ? "\"" : "",
               info->has_parent ? phex : "null", info->has_parent ? "\"" : "");
        kvedge_cli_json_str(stdout, info->model_id);
        printf(",\"chunk\":%u,\"tokens\":%u,\"blocks\":[", info->index, info->tokens);
        return;
    }
    printf("prefix %s\nmodel  %s   chunk #%u   tokens %u   parent %s\n\n", hex, info->model_id,
           info->index, info->tokens, info->has_parent ? phex : "-");
    printf("%5s %4s %-8s %-5s %5s %9s %9s %3s %7s %6s %-16s %s\n", "LAYER", "HEAD", "SCHEME",
           "DTYPE", "GROUP", "CHANNELS", "BYTES", "LZ4", "RATIO", "PINNED", "CHECKSUM", "STATE");
}

static int s_show(kvedge_cli_t *cli, const void *opts)
{
    const s_show_opts_t *o = opts;
    s_show_t s = {NULL, cli->json, o->layer == UINT32_MAX ? -1 : (int)o->layer, 0, 0};
    int ex = kvedge_cli_open(cli, false, &s.e);
    if (ex)
        return ex;
    kvedge_chunk_info_t info;
    if ((ex = s_resolve(cli, s.e, o->prefix, &info)) != 0 ||
        (ex = s_show_layer_ok(s.e, &info, s.layer)) != 0) {
        kvedge_engine_destroy(&s.e);
        return ex;
    }
    s_show_head(cli, &info);
    int rc = kvedge_engine_scan(s.e, &info.id, s_show_block, &s);
    if (cli->json)
        printf("],\"corrupt\":%llu}\n", (unsigned long long)s.bad);
    else
        printf("\n%llu blocks shown, %llu failed verification\n", (unsigned long long)s.shown,
               (unsigned long long)s.bad);
    kvedge_engine_destroy(&s.e);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("show: %s", kvedge_strerror(rc));
        return kvedge_cli_exit_code(rc);
    }
    return s.bad ? KVEDGE_EXIT_CORRUPT : KVEDGE_EXIT_OK;
}

/* ---- put-synthetic: into the store, or with -H through a node ---- */

typedef struct {
    const char *model;
    uint64_t tokens, group, keep, seed, chunk_tokens, ttl; /* group, keep, ttl: see the table */
    bool no_lz4, pin, force;
    int scheme;       /* kvedge_scheme_t */
    const char *salt; /* NULL: S_SALT_DEFAULT */
} s_synth_opts_t;

#define S_GROUP_UNSET UINT64_MAX /* --group not given: the scheme's default */

static const kvedge_cmdopt_t s_synth_list[] = {
    {.name = "model",
     .letter = 'm',
     .arg = "ID",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_synth_opts_t, model),
     .required = true,
     .help = "model shape (see kvedge models; with -H, a built-in one)"},
    {.name = "tokens",
     .letter = 't',
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_synth_opts_t, tokens),
     .min = 1,
     .max = S_TOKENS_MAX,
     .def_num = S_TOKENS_DEFAULT,
     .help = "context length in tokens"},
    {.name = "scheme",
     .letter = 's',
     .type = KVEDGE_CMDOPT_ENUM,
     KVEDGE_CMDOPT_AT(s_synth_opts_t, scheme),
     .choices = kvedge_cli_schemes,
     .def = "int8",
     .help = "how blocks are encoded"},
    {.name = "group",
     .letter = 'g',
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_synth_opts_t, group),
     .max = UINT16_MAX,
     .def_num = S_GROUP_UNSET,
     .def_text = "int8 0 = whole axis, int4 32",
     .help = "quantization group"},
    {.name = "keep-channels",
     .letter = 'k',
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_synth_opts_t, keep),
     .min = 1,
     .max = KVEDGE_BLOCK_MAX_HEAD_DIM,
     .def_num = 0,
     .def_text = "all",
     .help = "ThinK: keep the N key channels of largest magnitude"},
    {.name = "no-lz4",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_synth_opts_t, no_lz4),
     .help = "never lz4-compress blocks"},
    {.name = "seed",
     .letter = 'S',
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_synth_opts_t, seed),
     .max = UINT64_MAX,
     .def_num = 1,
     .help = "data and token seed"},
    {.name = "salt",
     .arg = "STR",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_synth_opts_t, salt),
     .help = "tenant namespace of the chunk ids (default " S_SALT_DEFAULT
             "); not with -H: there the node's tenant of this client's key is the namespace"},
    {.name = "chunk-tokens",
     .letter = 'c',
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_synth_opts_t, chunk_tokens),
     .min = 1,
     .max = KVEDGE_BLOCK_MAX_TOKENS,
     .def_num = KVEDGE_CHUNK_TOKENS_DEFAULT,
     .help = "tokens per chunk"},
    {.name = "pin",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_synth_opts_t, pin),
     .help = "pin the blocks (never evicted or expired)"},
    {.name = "ttl",
     .arg = "SECONDS",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_synth_opts_t, ttl),
     .min = 1,
     .max = UINT32_MAX - 1,
     .def_num = 0,
     .def_text = "never",
     .help = "expire the blocks after SECONDS"},
    {.name = "force",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_synth_opts_t, force),
     .help = "write past the size check: more than 1048576 tokens, or more than the free disk "
             "space (about)"},
};

static const kvedge_cmdopts_t s_synth_opts = {
    .command = "put-synthetic",
    .summary = "Store a realistic synthetic KV cache (in the store, or on a node with -H).",
    .about = "Generates a realistic synthetic KV cache (Gaussian values, keys with outlier\n"
             "channels) for a model shape and a random token sequence, and stores it in the\n"
             "store of --data, or with -H EP on that node (in this client's tenant). The\n"
             "same options give the same blocks either way.\n",
    KVEDGE_CMDOPTS_OF(s_synth_opts_t, s_synth_list)};

/* Where put-synthetic writes: exactly one of the two is set. */
typedef struct {
    kvedge_engine_t *e; /* local mode: the store of --data */
    kvedge_client_t *c; /* remote mode (-H): the node */
} s_sink_t;

/* Seed of one head: fixed per (seed, layer, head) so a head keeps its outlier channels. */
static uint64_t s_head_seed(uint64_t seed, uint32_t layer, uint32_t head)
{
    return seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)layer << 32 | head);
}

/* Scratch of the generator, sized for one chunk of one head. */
typedef struct {
    float *kf, *vf;  /* [tokens][head_dim] floats */
    uint8_t *k, *v;  /* the same in the model's dtype */
    uint8_t *blocks; /* heads slots of slot bytes: the encoded blocks of one layer */
    size_t slot;
    size_t *lens; /* encoded length per head */
} s_synth_buf_t;

/* Allocates b for blocks of spec: values floats values per head, es bytes each, heads heads.
 * Returns false (what was allocated stays for s_synth_buf_free) when out of memory. */
static bool s_synth_buf_new(s_synth_buf_t *b, const kvedge_block_spec_t *spec, size_t values,
                            size_t es, uint32_t heads)
{
    b->slot = (kvedge_block_encoded_bound(spec) + 7) & ~(size_t)7;
    b->kf = malloc(sizeof(float) * 2 * values);
    b->vf = b->kf ? b->kf + values : NULL;
    b->k = malloc(values * es);
    b->v = malloc(values * es);
    b->blocks = malloc(b->slot * heads);
    b->lens = calloc(heads, sizeof *b->lens);
    return b->kf && b->k && b->v && b->blocks && b->lens;
}

static void s_synth_buf_free(s_synth_buf_t *b)
{
    free(b->kf);
    free(b->k);
    free(b->v);
    free(b->blocks);
    free(b->lens);
}

/* Generates and encodes every head of one layer of one chunk (the same bytes whatever the
 * write path). spec->tokens is the chunk's token count. */
static int s_synth_layer(const s_synth_opts_t *o, const kvedge_model_t *m, uint32_t ci,
                         uint32_t layer, kvedge_block_spec_t *spec, s_synth_buf_t *b)
{
    const uint32_t D = m->head_dim, nt = spec->tokens;
    uint8_t mask[KVEDGE_BLOCK_MAX_HEAD_DIM / 8];
    for (uint32_t h = 0; h < m->kv_heads; h++) {
        int rc = kvedge_synth_head_f32(s_head_seed(o->seed, layer, h),
                                       ci * (uint32_t)o->chunk_tokens, nt, D, b->kf, b->vf);
        if (rc != KVEDGE_OK)
            return rc;
        spec->key_mask = NULL;
        if (o->keep < D) {
            kvedge_synth_key_mask(b->kf, nt, D, (uint32_t)o->keep, mask);
            spec->key_mask = mask;
        }
        kvedge_convert_from_f32(m->dtype, b->kf, (size_t)nt * D, b->k);
        kvedge_convert_from_f32(m->dtype, b->vf, (size_t)nt * D, b->v);
        rc = kvedge_block_encode(spec, b->k, b->v, b->blocks + h * b->slot, b->slot, &b->lens[h]);
        if (rc != KVEDGE_OK)
            return rc;
    }
    return KVEDGE_OK;
}

/* Writes the blocks of one layer of one chunk: one engine put per head, or one client PUT
 * per layer. */
static int s_sink_layer(s_sink_t *s, const s_synth_opts_t *o, const kvedge_chunk_info_t *info,
                        uint32_t layer, uint32_t heads, const s_synth_buf_t *b,
                        kvedge_put_item_t *items)
{
    if (s->e) {
        kvedge_put_opts_t po = {(uint32_t)o->ttl, o->pin};
        for (uint32_t h = 0; h < heads; h++) {
            int rc = kvedge_engine_put(s->e, info, (uint16_t)layer, (uint16_t)h,
                                       b->blocks + h * b->slot, b->lens[h], &po);
            if (rc != KVEDGE_OK)
                return rc;
        }
        return KVEDGE_OK;
    }
    for (uint32_t h = 0; h < heads; h++) {
        kvedge_put_item_t *it = &items[h];
        memset(it, 0, sizeof *it);
        it->chunk = *info;
        it->layer = (uint16_t)layer;
        it->head = (uint16_t)h;
        it->block = b->blocks + h * b->slot;
        it->len = b->lens[h];
        it->pin = o->pin;
        it->ttl_s = (uint32_t)o->ttl;
    }
    return kvedge_client_put(s->c, items, heads, NULL);
}

/* What put-synthetic wrote. */
typedef struct {
    kvedge_chunk_id_t last; /* the prefix: its last chunk */
    uint32_t chunks;
    uint64_t blocks, stored, fp16;
    double secs;
} s_synth_done_t;

static void s_synth_print(const kvedge_cli_t *cli, const s_sink_t *sink, const kvedge_model_t *m,
                          const s_synth_opts_t *o, const s_synth_done_t *d)
{
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES], b1[32], b2[32];
    kvedge_chunk_id_hex(&d->last, hex);
    if (cli->json) {
        printf("{\"prefix\":\"%s\",\"model\":", hex);
        kvedge_cli_json_str(stdout, m->id);
        printf(",\"scheme\":\"%s\",\"tokens\":%llu,\"chunks\":%u,\"blocks\":%llu,"
               "\"bytes\":%llu,\"fp16_bytes\":%llu,\"ratio\":%.3f,\"seconds\":%.3f}\n",
               kvedge_scheme_name((kvedge_scheme_t)o->scheme), (unsigned long long)o->tokens,
               d->chunks, (unsigned long long)d->blocks, (unsigned long long)d->stored,
               (unsigned long long)d->fp16, s_ratio(d->fp16, d->stored), d->secs);
        return;
    }
    printf("put %llu blocks of %s%s%s (%llu tokens in %u chunks, %u layers x %u KV heads, "
           "%s): %s stored for %s fp16 (%.2fx) in %.2f s\nprefix %s\n",
           (unsigned long long)d->blocks, m->id, sink->c ? " to " : "", sink->c ? cli->host : "",
           (unsigned long long)o->tokens, d->chunks, m->layers, m->kv_heads,
           kvedge_scheme_name((kvedge_scheme_t)o->scheme), kvedge_cli_bytes(d->stored, b1, 32),
           kvedge_cli_bytes(d->fp16, b2, 32), s_ratio(d->fp16, d->stored), d->secs, hex);
}

static int s_put_synthetic(kvedge_cli_t *cli, s_sink_t *sink, const kvedge_model_t *m,
                           const s_synth_opts_t *o)
{
    const uint32_t D = m->head_dim, C = (uint32_t)o->chunk_tokens, H = m->kv_heads;
    const size_t es = kvedge_dtype_size(m->dtype);
    const uint32_t n_chunks = (uint32_t)((o->tokens + C - 1) / C);
    /* The node namespaces chunk ids by this client's tenant: ids go with an empty salt. */
    const char *salt = sink->c ? "" : o->salt ? o->salt : S_SALT_DEFAULT;
    uint32_t *tokens = malloc(sizeof(uint32_t) * o->tokens);
    kvedge_chunk_id_t *ids = malloc(sizeof *ids * n_chunks);
    kvedge_block_spec_t spec = {
        m->dtype, (kvedge_scheme_t)o->scheme, C, m->head_dim, (uint16_t)o->group, NULL, !o->no_lz4};
    s_synth_buf_t b;
    bool buf_ok = s_synth_buf_new(&b, &spec, C * D, es, H);
    kvedge_put_item_t *items = sink->c ? calloc(H, sizeof *items) : NULL;
    int rc = (tokens && ids && buf_ok && (items || !sink->c)) ? KVEDGE_OK : KVEDGE_ENOMEM;
    kvedge_rng_t r;
    kvedge_rng_seed(&r, o->seed);
    for (uint64_t i = 0; rc == KVEDGE_OK && i < o->tokens; i++)
        tokens[i] = (uint32_t)(kvedge_rng_next(&r) % S_VOCAB_SIZE);
    if (rc == KVEDGE_OK) {
        int n = kvedge_chunk_chain((const uint8_t *)salt, strlen(salt), m->id, tokens, o->tokens, C,
                                   ids, n_chunks);
        rc = n < 0 ? n : KVEDGE_OK;
    }
    uint64_t blocks = 0, stored = 0, fp16 = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bool progress = !cli->json && isatty(STDERR_FILENO);
    for (uint32_t ci = 0; rc == KVEDGE_OK && ci < n_chunks; ci++) {
        uint32_t nt =
            (uint32_t)(o->tokens - (uint64_t)ci * C < C ? o->tokens - (uint64_t)ci * C : C);
        kvedge_chunk_info_t info;
        memset(&info, 0, sizeof info);
        info.id = ids[ci];
        info.has_parent = ci > 0;
        if (ci > 0)
            info.parent = ids[ci - 1];
        snprintf(info.model_id, sizeof info.model_id, "%s", m->id);
        info.index = ci;
        info.tokens = nt;
        spec.tokens = nt;
        for (uint32_t l = 0; rc == KVEDGE_OK && l < m->layers; l++) {
            rc = s_synth_layer(o, m, ci, l, &spec, &b);
            if (rc == KVEDGE_OK)
                rc = s_sink_layer(sink, o, &info, l, H, &b, items);
            for (uint32_t h = 0; rc == KVEDGE_OK && h < H; h++) {
                blocks++;
                stored += b.lens[h];
                fp16 += kvedge_block_fp16_bytes(nt, m->head_dim);
            }
        }
        if (progress)
            fprintf(stderr, "\rput-synthetic: chunk %u/%u", ci + 1, n_chunks);
    }
    if (progress)
        fputc('\n', stderr);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("put-synthetic: %s", kvedge_strerror(rc));
    } else {
        s_synth_done_t done = {ids[n_chunks - 1], n_chunks, blocks, stored, fp16, secs};
        s_synth_print(cli, sink, m, o, &done);
    }
    free(tokens);
    free(ids);
    s_synth_buf_free(&b);
    free(items);
    return rc;
}

static void s_list_builtin_models(FILE *f)
{
    size_t n;
    const kvedge_model_t *t = kvedge_model_builtins(&n);
    fprintf(f, "built-in models:");
    for (size_t i = 0; i < n; i++)
        fprintf(f, " %s", t[i].id);
    fputc('\n', f);
}

/* The model's shape: registered in the store (e, local mode) or built in (and then
 * registered in the store); a node's own registrations cannot be read back, so with -H (e
 * NULL) only built-in shapes. Checks --keep-channels against it. Returns an exit code. */
static int s_synth_model(kvedge_cli_t *cli, kvedge_engine_t *e, s_synth_opts_t *o,
                         kvedge_model_t *m)
{
    int rc = e ? kvedge_engine_get_model(e, o->model, m) : KVEDGE_ENOMODEL;
    if (rc == KVEDGE_ENOMODEL || rc == KVEDGE_ENOTFOUND) {
        rc = kvedge_model_builtin(o->model, m);
        if (rc == KVEDGE_OK && e)
            rc = kvedge_engine_put_model(e, m);
    }
    if (rc == KVEDGE_ENOMODEL || rc == KVEDGE_ENOTFOUND) {
        if (e)
            kvedge_cli_error("unknown model '%s'", o->model);
        else
            kvedge_cli_error("unknown model '%s' (with -H %s, put-synthetic knows the built-in "
                             "shapes only)",
                             o->model, cli->host);
        s_list_builtin_models(stderr);
        return KVEDGE_EXIT_NOTFOUND;
    }
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("put-synthetic: %s", kvedge_strerror(rc));
        return kvedge_cli_exit_code(rc);
    }
    if (!o->keep)
        o->keep = m->head_dim;
    if (o->keep > m->head_dim) {
        kvedge_cli_error("put-synthetic: --keep-channels %llu exceeds head_dim %u of %s",
                         (unsigned long long)o->keep, m->head_dim, m->id);
        return KVEDGE_EXIT_USAGE;
    }
    return KVEDGE_EXIT_OK;
}

/* Local put-synthetic: refuses (exit 2) to write more than the free space of the store's
 * file system, by an estimate of the encoded bytes, unless forced. */
static int s_synth_fits(kvedge_cli_t *cli, const kvedge_model_t *m, const s_synth_opts_t *o,
                        bool force)
{
    struct statvfs fs;
    if (force || statvfs(cli->data_dir, &fs) != 0)
        return KVEDGE_EXIT_OK;
    double per_fp16 = o->scheme == KVEDGE_SCHEME_INT4   ? 0.25
                      : o->scheme == KVEDGE_SCHEME_INT8 ? 0.5
                                                        : (double)kvedge_dtype_size(m->dtype) / 2;
    double need = (double)kvedge_model_fp16_bytes(m, o->tokens) * per_fp16 * (double)o->keep /
                  (double)m->head_dim;
    double avail = (double)fs.f_bavail * (double)fs.f_frsize;
    if (need <= avail)
        return KVEDGE_EXIT_OK;
    char b1[32], b2[32];
    kvedge_cli_error("put-synthetic: about %s to write, but %s has %s free: pass --force to "
                     "write anyway",
                     kvedge_cli_bytes((uint64_t)need, b1, sizeof b1), cli->data_dir,
                     kvedge_cli_bytes((uint64_t)avail, b2, sizeof b2));
    return KVEDGE_EXIT_USAGE;
}

/* The checks of the options that need more than one of them. Returns an exit code. */
static int s_synth_check(const kvedge_cli_t *cli, s_synth_opts_t *o)
{
    if (o->scheme == KVEDGE_SCHEME_LOSSLESS && o->group != S_GROUP_UNSET && o->group) {
        kvedge_cli_error("put-synthetic: --group applies to int8 and int4 only");
        return KVEDGE_EXIT_USAGE;
    }
    if (cli->host && o->salt) {
        kvedge_cli_error("put-synthetic: --salt is for a local store; with -H the node "
                         "namespaces chunk ids by the tenant of this client's key");
        return KVEDGE_EXIT_USAGE;
    }
    if (o->salt && strlen(o->salt) > KVEDGE_SALT_MAX_BYTES) {
        kvedge_cli_error("put-synthetic: bad value '%s' for --salt (at most %d bytes)", o->salt,
                         KVEDGE_SALT_MAX_BYTES);
        return KVEDGE_EXIT_USAGE;
    }
    if (o->group == S_GROUP_UNSET)
        o->group = o->scheme == KVEDGE_SCHEME_INT4 ? KVEDGE_BLOCK_INT4_GROUP_DEFAULT : 0;
    if (o->tokens > S_TOKENS_UNFORCED && !o->force) { /* before the store is opened or made */
        kvedge_cli_error("put-synthetic: --tokens %llu is over %u: pass --force to write that "
                         "much synthetic KV",
                         (unsigned long long)o->tokens, S_TOKENS_UNFORCED);
        return KVEDGE_EXIT_USAGE;
    }
    return KVEDGE_EXIT_OK;
}

static int s_put_synthetic_cmd(kvedge_cli_t *cli, const void *opts)
{
    s_synth_opts_t o = *(const s_synth_opts_t *)opts;
    int ex = s_synth_check(cli, &o);
    if (ex)
        return ex;
    s_sink_t sink = {NULL, NULL};
    kvedge_model_t m;
    if (cli->host) { /* the shape first: a usage error needs no network */
        if ((ex = s_synth_model(cli, NULL, &o, &m)) != 0)
            return ex;
        if ((ex = kvedge_cli_connect(cli, "kvedge-cli", &sink.c)) != 0)
            return ex;
    } else {
        if ((ex = kvedge_cli_open_create(cli, &sink.e)) != 0)
            return ex;
        if ((ex = s_synth_model(cli, sink.e, &o, &m)) != 0 ||
            (ex = s_synth_fits(cli, &m, &o, o.force)) != 0) {
            kvedge_engine_destroy(&sink.e);
            return ex;
        }
    }
    int rc = s_put_synthetic(cli, &sink, &m, &o);
    kvedge_engine_destroy(&sink.e);
    kvedge_client_destroy(&sink.c);
    return kvedge_cli_exit_code(rc);
}

/* ---- verify ---- */

typedef struct {
    bool json;
    uint64_t n;
    uint64_t records; /* blocks intact in a damaged RocksDB record (KVEDGE_EIO) */
} s_verify_t;

static int s_verify_bad(void *ctx, const kvedge_block_key_t *key, int err)
{
    s_verify_t *v = ctx;
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES];
    kvedge_chunk_id_hex(&key->chunk, hex);
    bool intact = err == KVEDGE_EIO;
    if (v->json)
        printf("%s{\"prefix\":\"%s\",\"layer\":%u,\"head\":%u,\"error\":\"%s\"%s}", v->n ? "," : "",
               hex, key->layer, key->head, kvedge_errname(err),
               intact ? ",\"block_intact\":true" : "");
    else if (intact)
        printf("damaged record: prefix %s layer %u head %u: the block reads intact (and is "
               "served); verify --quarantine writes it again\n",
               hex, key->layer, key->head);
    else
        printf("corrupt: prefix %s layer %u head %u: %s\n", hex, key->layer, key->head,
               kvedge_strerror(err));
    v->n++;
    v->records += intact;
    return 0;
}

/* Opens the store for verify. A store too damaged to open is corrupt, not unavailable: exit
 * 4, as for corrupt blocks, with the way out (the engine's reason names kvedge repair). */
static int s_open_verify(kvedge_cli_t *cli, bool writable, kvedge_engine_t **e)
{
    kvedge_engine_opts_t opts;
    kvedge_engine_opts_default(&opts);
    opts.create_if_missing = false;
    opts.read_only = !writable;
    char why[1024] = "";
    int rc = kvedge_engine_open(cli->data_dir, &opts, e, why, sizeof why);
    if (rc == KVEDGE_OK)
        return KVEDGE_EXIT_OK;
    if (rc != KVEDGE_ECORRUPT)
        return kvedge_cli_open(cli, writable, e); /* its messages for the other cases */
    if (cli->json) {
        printf("{\"corrupt_blocks\":[],\"checked\":0,\"corrupt\":0,\"quarantined\":false,"
               "\"store_damaged\":true,\"error\":");
        kvedge_cli_json_str(stdout, why);
        printf("}\n");
    }
    kvedge_cli_error("store %s is damaged: %s", cli->data_dir, why);
    return KVEDGE_EXIT_CORRUPT;
}

typedef struct {
    bool quarantine;
} s_verify_opts_t;

static const kvedge_cmdopt_t s_verify_list[] = {
    {.name = "quarantine",
     .letter = 'q',
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_verify_opts_t, quarantine),
     .help = "move corrupt blocks to quarantine (needs the store not to be in use)"},
};

static const kvedge_cmdopts_t s_verify_opts = {
    .command = "verify",
    .summary = "Check every block as a read does; find damage.",
    .about = "Reads every block and checks it as a read does: structure, xxh3\n"
             "checksum, lz4 body, metadata. A RocksDB record that fails its\n"
             "own checksums around an intact block is listed apart (reads serve\n"
             "the block; --quarantine writes it again). Exit code 4 when any\n"
             "block is corrupt or any record damaged, or when the store is too\n"
             "damaged to open (then run kvedge repair).\n",
    KVEDGE_CMDOPTS_OF(s_verify_opts_t, s_verify_list)};

static void s_verify_summary(const kvedge_cli_t *cli, bool quarantine, uint64_t checked,
                             uint64_t bad, uint64_t records)
{
    if (cli->json)
        printf("],\"checked\":%llu,\"corrupt\":%llu,\"damaged_records\":%llu,"
               "\"quarantined\":%s}\n",
               (unsigned long long)checked, (unsigned long long)bad, (unsigned long long)records,
               quarantine && bad ? "true" : "false");
    else
        printf("verified %llu blocks: %llu ok, %llu corrupt%s%s\n", (unsigned long long)checked,
               (unsigned long long)(checked - bad), (unsigned long long)bad,
               bad ? (quarantine ? " (moved to quarantine)" : " (run verify --quarantine)") : "",
               records ? (quarantine ? "; damaged records rewritten"
                                     : "; damaged records (run verify --quarantine)")
                       : "");
}

static int s_verify(kvedge_cli_t *cli, const void *opts)
{
    bool quarantine = ((const s_verify_opts_t *)opts)->quarantine;
    kvedge_engine_t *e;
    int ex = s_open_verify(cli, quarantine, &e);
    if (ex)
        return ex;
    s_verify_t v = {cli->json, 0, 0};
    uint64_t checked = 0, bad = 0;
    if (cli->json)
        printf("{\"corrupt_blocks\":[");
    int rc = kvedge_engine_verify(e, quarantine, s_verify_bad, &v, &checked, &bad);
    s_verify_summary(cli, quarantine, checked, bad, v.records);
    kvedge_engine_destroy(&e);
    if (rc == KVEDGE_ECORRUPT) { /* a table RocksDB cannot read ended the scan */
        kvedge_cli_error("verify: store %s is damaged past the blocks checked (%s); run kvedge "
                         "repair --data %s to salvage it",
                         cli->data_dir, kvedge_strerror(rc), cli->data_dir);
        return KVEDGE_EXIT_CORRUPT;
    }
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("verify: %s", kvedge_strerror(rc));
        return kvedge_cli_exit_code(rc);
    }
    return bad || v.records ? KVEDGE_EXIT_CORRUPT : KVEDGE_EXIT_OK;
}

/* ---- repair ---- */

typedef struct {
    bool json;
    uint64_t n;
} s_repair_t;

static int s_repair_lost(void *ctx, const kvedge_block_key_t *key, int err)
{
    s_repair_t *r = ctx;
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES];
    kvedge_chunk_id_hex(&key->chunk, hex);
    if (r->json)
        printf("%s{\"prefix\":\"%s\",\"layer\":%u,\"head\":%u,\"error\":\"%s\"}", r->n ? "," : "",
               hex, key->layer, key->head, kvedge_errname(err));
    else
        printf("lost: prefix %s layer %u head %u: %s\n", hex, key->layer, key->head,
               kvedge_strerror(err));
    r->n++;
    return 0;
}

static const kvedge_cmdopts_t s_repair_opts = {
    .command = "repair",
    .summary = "Salvage a damaged store: keep what verifies, quarantine the rest.",
    .about =
        "Salvages a store that cannot be opened or verified any more (a damaged table, blob\n"
        "file or MANIFEST, a lost CURRENT). The damaged store is read through a working copy\n"
        "(DIR/repair.work), so nothing is changed before a new store of every block that\n"
        "passes the check a read makes has been built (DIR/repair.tmp) and read back whole;\n"
        "then the old RocksDB files move to DIR/lost/repair-TIME (delete them once satisfied)\n"
        "and the new ones into DIR. Blocks that fail are listed and kept in quarantine. A\n"
        "sound store is left as it is. Stop the node first; needs free space for a copy of\n"
        "the store. Exit code 0 when nothing was lost, 4 when blocks, chunk or model records\n"
        "were lost, 5 when the store is missing or in use, 1 on any other failure (the store\n"
        "is then as it was).\n",
    .struct_size = sizeof(s_none_t)};

static void s_repair_json(int rc, const kvedge_repair_report_t *r, bool lost)
{
    printf("],\"ok\":%s,\"changed\":%s,\"resumed\":%s,\"damaged\":%s,\"found\":%llu,"
           "\"kept\":%llu,\"lost\":%llu,\"meta_rebuilt\":%llu,\"from_blob_files\":%llu,"
           "\"chunks_kept\":%llu,\"chunks_rebuilt\":%llu,\"chunks_lost\":%llu,"
           "\"models_kept\":%llu,\"models_lost\":%llu,\"quarantine_kept\":%llu,"
           "\"variants_dropped\":%llu,\"damaged_keys\":%llu,\"before\":{\"table_files\":%llu,"
           "\"blob_files\":%llu,"
           "\"wal_files\":%llu,\"data_bytes\":%llu},\"rocksdb_repaired\":%s,\"rocksdb_"
           "aborted\":%s,"
           "\"old_files\":",
           rc == KVEDGE_OK && !lost ? "true" : "false",
           rc == KVEDGE_OK && !r->unchanged ? "true" : "false", r->resumed ? "true" : "false",
           r->damaged ? "true" : "false", (unsigned long long)r->blocks_found,
           (unsigned long long)r->blocks_kept, (unsigned long long)r->blocks_lost,
           (unsigned long long)r->meta_rebuilt, (unsigned long long)r->from_blob_files,
           (unsigned long long)r->chunks_kept, (unsigned long long)r->chunks_rebuilt,
           (unsigned long long)r->chunks_lost, (unsigned long long)r->models_kept,
           (unsigned long long)r->models_lost, (unsigned long long)r->quarantine_kept,
           (unsigned long long)r->variants_dropped, (unsigned long long)r->damaged_keys,
           (unsigned long long)r->table_files, (unsigned long long)r->blob_files,
           (unsigned long long)r->wal_files, (unsigned long long)r->data_bytes,
           r->rocksdb_repaired ? "true" : "false", r->rocksdb_aborted ? "true" : "false");
    kvedge_cli_json_str(stdout, r->old_files);
    printf("}\n");
}

static void s_repair_text(const kvedge_cli_t *cli, int rc, const kvedge_repair_report_t *r)
{
    if (rc == KVEDGE_OK && r->resumed) {
        printf("finished an interrupted repair of %s: its verified store of %llu blocks is in "
               "place; the damaged store's files are in %s\n",
               cli->data_dir, (unsigned long long)r->blocks_kept, r->old_files);
    } else if (rc == KVEDGE_OK) {
        printf("%s held %llu table, %llu blob and %llu WAL files (%llu bytes), naming %llu "
               "blocks\n",
               cli->data_dir, (unsigned long long)r->table_files, (unsigned long long)r->blob_files,
               (unsigned long long)r->wal_files, (unsigned long long)r->data_bytes,
               (unsigned long long)r->blocks_found);
        if (r->unchanged)
            printf("nothing to repair: every block and record reads back; the store is left as "
                   "it is\n");
        else
            printf("repaired %s: %llu blocks kept, %llu lost (in quarantine), %llu with rebuilt "
                   "metadata; %llu chunks kept, %llu rebuilt, %llu chunk records lost; %llu "
                   "model records lost\n",
                   cli->data_dir, (unsigned long long)r->blocks_kept,
                   (unsigned long long)r->blocks_lost, (unsigned long long)r->meta_rebuilt,
                   (unsigned long long)r->chunks_kept, (unsigned long long)r->chunks_rebuilt,
                   (unsigned long long)r->chunks_lost, (unsigned long long)r->models_lost);
        if (r->from_blob_files)
            printf("%llu of the kept blocks were read from the blob files directly\n",
                   (unsigned long long)r->from_blob_files);
        if (r->rocksdb_repaired)
            printf("RocksDB could not open the store: its own repair rebuilt a copy first\n");
        if (r->rocksdb_aborted)
            printf("RocksDB aborted reading the damaged tables: the blocks were taken from the "
                   "blob files alone (metadata, chunk records and variants rebuilt or dropped)\n");
        if (r->old_files[0])
            printf("the damaged store's files are in %s\n", r->old_files);
    }
}

static int s_repair(kvedge_cli_t *cli, const void *opts)
{
    (void)opts;
    s_repair_t r = {cli->json, 0};
    kvedge_repair_report_t rep;
    char why[1024] = "";
    if (cli->json)
        printf("{\"lost_blocks\":[");
    int rc = kvedge_engine_repair(cli->data_dir, s_repair_lost, &r, &rep, why, sizeof why);
    bool lost = rep.blocks_lost || rep.chunks_lost || rep.models_lost;
    if (cli->json)
        s_repair_json(rc, &rep, lost);
    else
        s_repair_text(cli, rc, &rep);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("repair: %s", why[0] ? why : kvedge_strerror(rc));
        return rc == KVEDGE_ENOTFOUND || rc == KVEDGE_ELOCKED || rc == KVEDGE_EVERSION
                   ? KVEDGE_EXIT_UNAVAILABLE
                   : KVEDGE_EXIT_FAILURE;
    }
    return lost ? KVEDGE_EXIT_CORRUPT : KVEDGE_EXIT_OK;
}

/* ---- evict ---- */

typedef kvedge_cli_evict_opts_t s_evict_opts_t;

static const kvedge_cmdopts_t s_evict_opts = {
    .command = "evict",
    .summary = "Evict least-recently-used unpinned blocks.",
    .about = "Evicts least-recently-used unpinned blocks until at most SIZE bytes\n"
             "are stored. Pinned blocks are never evicted.\n",
    KVEDGE_CMDOPTS_OF(s_evict_opts_t, kvedge_cli_evict_list)};

static int s_evict(kvedge_cli_t *cli, const void *opts)
{
    uint64_t target = ((const s_evict_opts_t *)opts)->to;
    kvedge_engine_t *e;
    int ex = kvedge_cli_open(cli, true, &e);
    if (ex)
        return ex;
    uint64_t blocks = 0, bytes = 0;
    int rc = kvedge_engine_evict(e, target, &blocks, &bytes);
    kvedge_engine_stats_t st;
    kvedge_engine_stats(e, &st);
    char b1[32], b2[32];
    if (cli->json)
        printf("{\"evicted_blocks\":%llu,\"evicted_bytes\":%llu,\"bytes\":%llu,"
               "\"pinned_bytes\":%llu,\"reached\":%s}\n",
               (unsigned long long)blocks, (unsigned long long)bytes, (unsigned long long)st.bytes,
               (unsigned long long)st.pinned_bytes, rc == KVEDGE_OK ? "true" : "false");
    else if (rc == KVEDGE_OK || rc == KVEDGE_EFULL)
        printf("evicted %llu blocks (%s); %s stored\n", (unsigned long long)blocks,
               kvedge_cli_bytes(bytes, b1, 32), kvedge_cli_bytes(st.bytes, b2, 32));
    kvedge_engine_destroy(&e);
    if (rc == KVEDGE_EFULL) {
        kvedge_cli_error("evict: pinned blocks alone take %s, more than the target",
                         kvedge_cli_bytes(st.pinned_bytes, b1, 32));
        return KVEDGE_EXIT_FAILURE;
    }
    if (rc != KVEDGE_OK)
        kvedge_cli_error("evict: %s", kvedge_strerror(rc));
    return kvedge_cli_exit_code(rc);
}

/* ---- pin / unpin / delete ---- */

/* Pins or unpins a prefix: the chunk and every chunk above it in its chain. */
static int s_pin(kvedge_cli_t *cli, const char *prefix, bool pin)
{
    const char *name = pin ? "pin" : "unpin";
    kvedge_engine_t *e;
    int ex = kvedge_cli_open(cli, true, &e);
    if (ex)
        return ex;
    kvedge_chunk_info_t info;
    if ((ex = s_resolve(cli, e, prefix, &info)) != 0) {
        kvedge_engine_destroy(&e);
        return ex;
    }
    uint64_t changed = 0, chunks = 0;
    int rc;
    for (;;) {
        uint64_t n = 0;
        rc = kvedge_engine_pin_chunk(e, &info.id, pin, &n);
        if (rc != KVEDGE_OK)
            break;
        changed += n;
        chunks++;
        if (!info.has_parent)
            break;
        kvedge_chunk_id_t parent = info.parent;
        rc = kvedge_engine_get_chunk(e, &parent, &info);
        if (rc == KVEDGE_ENOTFOUND) { /* the chain above was deleted: pin what is here */
            rc = KVEDGE_OK;
            break;
        }
        if (rc != KVEDGE_OK)
            break;
    }
    kvedge_engine_destroy(&e);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("%s: %s", name, kvedge_strerror(rc));
        return kvedge_cli_exit_code(rc);
    }
    if (cli->json)
        printf("{\"%s\":%llu,\"chunks\":%llu}\n", pin ? "pinned" : "unpinned",
               (unsigned long long)changed, (unsigned long long)chunks);
    else
        printf("%s %llu blocks in %llu chunks\n", pin ? "pinned" : "unpinned",
               (unsigned long long)changed, (unsigned long long)chunks);
    return KVEDGE_EXIT_OK;
}

#define S_PIN_ABOUT                                                                                \
    "A prefix is its last chunk together with every chunk before it in\n"                          \
    "the chain; all their blocks are (un)pinned. Pinned blocks are never\n"                        \
    "evicted and never expire.\n"

static const kvedge_cmdopts_t s_pin_opts = {
    .command = "pin",
    .summary = "Pin a prefix: never evicted, never expired.",
    .about = S_PIN_ABOUT,
    KVEDGE_CMDOPTS_OF(s_prefix_opts_t, kvedge_cli_prefix_list)};

static const kvedge_cmdopts_t s_unpin_opts = {
    .command = "unpin",
    .summary = "Unpin a prefix.",
    .about = S_PIN_ABOUT,
    KVEDGE_CMDOPTS_OF(s_prefix_opts_t, kvedge_cli_prefix_list)};

static int s_pin_cmd(kvedge_cli_t *cli, const void *opts)
{
    return s_pin(cli, ((const s_prefix_opts_t *)opts)->prefix, true);
}

static int s_unpin_cmd(kvedge_cli_t *cli, const void *opts)
{
    return s_pin(cli, ((const s_prefix_opts_t *)opts)->prefix, false);
}

static const kvedge_cmdopts_t s_delete_opts = {
    .command = "delete",
    .summary = "Delete a prefix chunk and the chunks chained below it.",
    .about = "Deletes the prefix chunk and every chunk chained below it (their\n"
             "blocks are unreachable without it), pinned or not.\n",
    KVEDGE_CMDOPTS_OF(s_prefix_opts_t, kvedge_cli_prefix_list)};

static int s_delete(kvedge_cli_t *cli, const void *opts)
{
    kvedge_engine_t *e;
    int ex = kvedge_cli_open(cli, true, &e);
    if (ex)
        return ex;
    kvedge_chunk_info_t info;
    if ((ex = s_resolve(cli, e, ((const s_prefix_opts_t *)opts)->prefix, &info)) != 0) {
        kvedge_engine_destroy(&e);
        return ex;
    }
    uint64_t blocks = 0;
    int rc = kvedge_engine_delete_chunk(e, &info.id, true, &blocks);
    kvedge_engine_destroy(&e);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("delete: %s", kvedge_strerror(rc));
        return kvedge_cli_exit_code(rc);
    }
    if (cli->json)
        printf("{\"deleted_blocks\":%llu}\n", (unsigned long long)blocks);
    else
        printf("deleted %llu blocks\n", (unsigned long long)blocks);
    return KVEDGE_EXIT_OK;
}

/* ---- models ---- */

typedef struct {
    bool json;
    size_t n;
} s_models_t;

static void s_print_model(s_models_t *s, const kvedge_model_t *m, const char *source)
{
    uint64_t per_token = kvedge_model_fp16_bytes(m, 1);
    if (s->json) {
        printf("%s{\"model\":", s->n ? "," : "");
        kvedge_cli_json_str(stdout, m->id);
        printf(",\"layers\":%u,\"kv_heads\":%u,\"head_dim\":%u,\"dtype\":\"%s\","
               "\"fp16_bytes_per_token\":%llu,\"source\":\"%s\"}",
               m->layers, m->kv_heads, m->head_dim, kvedge_dtype_name(m->dtype),
               (unsigned long long)per_token, source);
    } else {
        char b[32];
        printf("%-16s %6u %8u %8u %5s %12s  %s\n", m->id, m->layers, m->kv_heads, m->head_dim,
               kvedge_dtype_name(m->dtype), kvedge_cli_bytes(per_token, b, sizeof b), source);
    }
    s->n++;
}

/* A registered record: node-wide ("registered"), or a tenant's own ("tenant:" and its tag in
 * hex, as the master's tmodel/ keys say it). */
static int s_registered_model(void *ctx, const uint8_t *tenant, const kvedge_model_t *m)
{
    kvedge_model_t b;
    if (kvedge_model_builtin(m->id, &b) == KVEDGE_OK)
        return 0;
    char source[8 + 32 + 1] = "registered";
    if (tenant) {
        int at = snprintf(source, sizeof source, "tenant:");
        for (int i = 0; i < 16; i++)
            at += snprintf(source + at, sizeof source - (size_t)at, "%02x", tenant[i]);
    }
    s_print_model(ctx, m, source);
    return 0;
}

static const kvedge_cmdopts_t s_models_opts = {
    .command = "models",
    .summary = "List known model shapes.",
    .about = "Lists the built-in model shapes and any other model registered in the\n"
             "store (when the store exists): node-wide ones as registered, a tenant's\n"
             "own as tenant:TAG (its tenant tag in hex).\n",
    .struct_size = sizeof(s_none_t)};

static int s_models(kvedge_cli_t *cli, const void *unused)
{
    (void)unused;
    s_models_t s = {cli->json, 0};
    if (cli->json)
        printf("[");
    else
        printf("%-16s %6s %8s %8s %5s %12s  %s\n", "MODEL", "LAYERS", "KV_HEADS", "HEAD_DIM",
               "DTYPE", "KV/TOKEN", "SOURCE");
    size_t n;
    const kvedge_model_t *t = kvedge_model_builtins(&n);
    for (size_t i = 0; i < n; i++)
        s_print_model(&s, &t[i], "built-in");
    kvedge_engine_opts_t eo;
    kvedge_engine_opts_default(&eo);
    eo.create_if_missing = false;
    eo.read_only = true;
    kvedge_engine_t *e;
    if (kvedge_engine_open(cli->data_dir, &eo, &e, NULL, 0) == KVEDGE_OK) {
        kvedge_engine_list_tenant_models(e, s_registered_model, &s);
        kvedge_engine_destroy(&e);
    }
    if (cli->json)
        printf("]\n");
    return KVEDGE_EXIT_OK;
}

const kvedge_cli_cmd_t kvedge_cli_local_cmds[] = {
    {.name = "inspect", .opts = &s_inspect_opts, .exec = s_inspect},
    {.name = "ls", .opts = &s_ls_opts, .exec = s_ls},
    {.name = "show", .opts = &s_show_opts, .exec = s_show},
    {.name = "put-synthetic", .opts = &s_synth_opts, .exec = s_put_synthetic_cmd},
    {.name = "verify", .opts = &s_verify_opts, .exec = s_verify},
    {.name = "repair", .opts = &s_repair_opts, .exec = s_repair},
    {.name = "evict", .opts = &s_evict_opts, .exec = s_evict},
    {.name = "pin", .opts = &s_pin_opts, .exec = s_pin_cmd},
    {.name = "unpin", .opts = &s_unpin_opts, .exec = s_unpin_cmd},
    {.name = "delete", .opts = &s_delete_opts, .exec = s_delete},
    {.name = "models", .opts = &s_models_opts, .exec = s_models},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};
