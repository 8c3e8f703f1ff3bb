/* The kvedge admin commands in local mode: they open the store directory themselves.
 * Inspection commands open it read-only, so they also work beside a running node.
 * put-synthetic is one command for both modes: with -H it writes through a node. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "clients/cli/cli.h"
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

/* ---- option parsing shared by every command ---- */

/* Parses only --help for commands without options; returns -1 to go on, else an exit code. */
static int s_no_options(const kvedge_cli_cmd_t *cmd, int argc, char **argv, int want_args,
                        const char *details)
{
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'h') {
            kvedge_cli_usage(stdout, cmd, details);
            return KVEDGE_EXIT_OK;
        }
        kvedge_cli_error("%s: unknown option '%s'", cmd->name, argv[optind - 1]);
        kvedge_cli_usage(stderr, cmd, NULL);
        return KVEDGE_EXIT_USAGE;
    }
    if (argc - optind != want_args) {
        kvedge_cli_error("%s: expected %d argument%s, got %d", cmd->name, want_args,
                         want_args == 1 ? "" : "s", argc - optind);
        kvedge_cli_usage(stderr, cmd, NULL);
        return KVEDGE_EXIT_USAGE;
    }
    return -1;
}

static int s_bad_option(const kvedge_cli_cmd_t *cmd, int argc, char **argv)
{
    (void)argc;
    kvedge_cli_error("%s: unknown option or missing value '%s'", cmd->name, argv[optind - 1]);
    kvedge_cli_usage(stderr, cmd, NULL);
    return KVEDGE_EXIT_USAGE;
}

static const kvedge_cli_cmd_t *s_cmd(const char *name)
{
    for (const kvedge_cli_cmd_t *c = kvedge_cli_local_cmds; c->name; c++)
        if (strcmp(c->name, name) == 0)
            return c;
    return NULL;
}

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

static int s_cmd_inspect(kvedge_cli_t *cli, int argc, char **argv)
{
    int ex = s_no_options(s_cmd("inspect"), argc, argv, 0,
                          "Per model: prefix chunks, tokens, layers x heads x head_dim, blocks,\n"
                          "bytes stored against their fp16 size, schemes and compression ratio.\n");
    if (ex >= 0)
        return ex;
    kvedge_engine_t *e;
    if ((ex = kvedge_cli_open(cli, false, &e)) != 0)
        return ex;
    s_chunks_t c;
    int rc = s_load_chunks(e, &c);
    kvedge_engine_stats_t st;
    if (rc == KVEDGE_OK)
        rc = kvedge_engine_stats(e, &st);
    s_model_row_t *m = calloc(c.n + 1, sizeof *m);
    size_t nm = 0;
    for (size_t i = 0; rc == KVEDGE_OK && m && i < c.n; i++) {
        size_t j = 0;
        while (j < nm && strcmp(m[j].model, c.rows[i].info.model_id) != 0)
            j++;
        if (j == nm) {
            m[nm].model = c.rows[i].info.model_id;
            if (kvedge_engine_get_tenant_model(e, c.rows[i].info.tenant, m[nm].model,
                                               &m[nm].shape) != KVEDGE_OK)
                memset(&m[nm].shape, 0, sizeof m[nm].shape);
            nm++;
        }
        m[j].chunks++;
        m[j].tokens += c.rows[i].info.tokens;
        m[j].blocks += c.rows[i].blocks;
        m[j].bytes += c.rows[i].bytes;
        m[j].fp16_bytes += c.rows[i].fp16_bytes;
        m[j].pinned += c.rows[i].pinned;
        m[j].schemes |= c.rows[i].schemes;
    }
    if (rc == KVEDGE_OK && !m)
        rc = KVEDGE_ENOMEM;
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("inspect %s: %s", cli->data_dir, kvedge_strerror(rc));
        ex = kvedge_cli_exit_code(rc);
    } else if (cli->json) {
        printf("{\"store\":");
        kvedge_cli_json_str(stdout, cli->data_dir);
        printf(",\"blocks\":%llu,\"bytes\":%llu,\"fp16_bytes\":%llu,\"pinned_blocks\":%llu,"
               "\"quarantined\":%llu,\"chunks\":%zu,\"models\":[",
               (unsigned long long)st.blocks, (unsigned long long)st.bytes,
               (unsigned long long)st.fp16_bytes, (unsigned long long)st.pinned_blocks,
               (unsigned long long)st.quarantined, c.n);
        for (size_t j = 0; j < nm; j++) {
            char sch[32];
            printf("%s{\"model\":", j ? "," : "");
            kvedge_cli_json_str(stdout, m[j].model);
            printf(",\"layers\":%u,\"kv_heads\":%u,\"head_dim\":%u,\"chunks\":%llu,"
                   "\"tokens\":%llu,\"blocks\":%llu,\"bytes\":%llu,\"fp16_bytes\":%llu,"
                   "\"pinned_blocks\":%llu,\"ratio\":%.3f,\"schemes\":\"%s\"}",
                   m[j].shape.layers, m[j].shape.kv_heads, m[j].shape.head_dim,
                   (unsigned long long)m[j].chunks, (unsigned long long)m[j].tokens,
                   (unsigned long long)m[j].blocks, (unsigned long long)m[j].bytes,
                   (unsigned long long)m[j].fp16_bytes, (unsigned long long)m[j].pinned,
                   s_ratio(m[j].fp16_bytes, m[j].bytes), s_schemes(m[j].schemes, sch, sizeof sch));
        }
        printf("]}\n");
    } else {
        char b1[32], b2[32];
        printf("store %s: %zu model%s, %zu prefix chunks, %llu blocks (%llu pinned), "
               "%llu quarantined\n",
               cli->data_dir, nm, nm == 1 ? "" : "s", c.n, (unsigned long long)st.blocks,
               (unsigned long long)st.pinned_blocks, (unsigned long long)st.quarantined);
        printf("stored %s for %s of fp16 KV: %.2fx\n\n", kvedge_cli_bytes(st.bytes, b1, 32),
               kvedge_cli_bytes(st.fp16_bytes, b2, 32), s_ratio(st.fp16_bytes, st.bytes));
        printf("%-16s %6s %5s %4s %6s %7s %8s %11s %11s %7s  %s\n", "MODEL", "LAYERS", "HEADS",
               "DIM", "CHUNKS", "TOKENS", "BLOCKS", "STORED", "FP16", "RATIO", "SCHEMES");
        for (size_t j = 0; j < nm; j++) {
            char sch[32];
            printf("%-16s %6u %5u %4u %6llu %7llu %8llu %11s %11s %6.2fx  %s\n", m[j].model,
                   m[j].shape.layers, m[j].shape.kv_heads, m[j].shape.head_dim,
                   (unsigned long long)m[j].chunks, (unsigned long long)m[j].tokens,
                   (unsigned long long)m[j].blocks, kvedge_cli_bytes(m[j].bytes, b1, 32),
                   kvedge_cli_bytes(m[j].fp16_bytes, b2, 32), s_ratio(m[j].fp16_bytes, m[j].bytes),
                   s_schemes(m[j].schemes, sch, sizeof sch));
        }
        if (nm == 0)
            printf("(empty)\n");
    }
    free(m);
    free(c.rows);
    kvedge_engine_destroy(&e);
    return ex;
}

/* ---- ls ---- */

static int s_cmd_ls(kvedge_cli_t *cli, int argc, char **argv)
{
    static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
                                         {"full", no_argument, NULL, 'f'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const kvedge_cli_cmd_t *cmd = s_cmd("ls");
    const char *model = NULL;
    bool full = false;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:fh", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'f':
            full = true;
            break;
        case 'h':
            kvedge_cli_usage(stdout, cmd,
                             "  -m, --model ID   only prefixes of this model\n"
                             "  -f, --full       print full 64-digit prefix ids\n");
            return KVEDGE_EXIT_OK;
        default:
            return s_bad_option(cmd, argc, argv);
        }
    }
    if (optind != argc)
        return s_bad_option(cmd, argc, argv);
    kvedge_engine_t *e;
    int ex = kvedge_cli_open(cli, false, &e);
    if (ex)
        return ex;
    s_chunks_t ch;
    int rc = s_load_chunks(e, &ch);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("ls %s: %s", cli->data_dir, kvedge_strerror(rc));
        free(ch.rows);
        kvedge_engine_destroy(&e);
        return kvedge_cli_exit_code(rc);
    }
    if (!cli->json)
        printf("%-*s %-16s %5s %6s %6s %5s %6s %10s %7s %6s %s\n", full ? 64 : S_SHORT_ID_DIGITS,
               "PREFIX", "MODEL", "CHUNK", "TOKENS", "LAYERS", "HEADS", "BLOCKS", "STORED", "RATIO",
               "PINNED", "SCHEMES");
    else
        printf("[");
    size_t shown = 0;
    for (size_t i = 0; i < ch.n; i++) {
        const s_chunk_row_t *r = &ch.rows[i];
        if (model && strcmp(model, r->info.model_id) != 0)
            continue;
        char hex[KVEDGE_CHUNK_ID_HEX_BYTES], phex[KVEDGE_CHUNK_ID_HEX_BYTES], sch[32], b[32];
        kvedge_chunk_id_hex(&r->info.id, hex);
        if (cli->json) {
            printf("%s{\"prefix\":\"%s\",\"parent\":", shown ? "," : "", hex);
            if (r->info.has_parent)
                printf("\"%s\"", kvedge_chunk_id_hex(&r->info.parent, phex));
            else
                printf("null");
            printf(",\"model\":");
            kvedge_cli_json_str(stdout, r->info.model_id);
            printf(",\"chunk\":%u,\"tokens\":%u,\"layers\":%u,\"heads\":%u,\"blocks\":%llu,"
                   "\"bytes\":%llu,\"fp16_bytes\":%llu,\"pinned_blocks\":%llu,"
                   "\"schemes\":\"%s\"}",
                   r->info.index, r->info.tokens, r->layers_max, r->heads_max,
                   (unsigned long long)r->blocks, (unsigned long long)r->bytes,
                   (unsigned long long)r->fp16_bytes, (unsigned long long)r->pinned,
                   s_schemes(r->schemes, sch, sizeof sch));
        } else {
            if (!full)
                hex[S_SHORT_ID_DIGITS] = '\0';
            printf("%-*s %-16s %5u %6u %6u %5u %6llu %10s %6.2fx %6llu %s\n",
                   full ? 64 : S_SHORT_ID_DIGITS, hex, r->info.model_id, r->info.index,
                   r->info.tokens, r->layers_max, r->heads_max, (unsigned long long)r->blocks,
                   kvedge_cli_bytes(r->bytes, b, sizeof b), s_ratio(r->fp16_bytes, r->bytes),
                   (unsigned long long)r->pinned, s_schemes(r->schemes, sch, sizeof sch));
        }
        shown++;
    }
    if (cli->json)
        printf("]\n");
    free(ch.rows);
    kvedge_engine_destroy(&e);
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

static int s_cmd_show(kvedge_cli_t *cli, int argc, char **argv)
{
    static const struct option opts[] = {{"layer", required_argument, NULL, 'l'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const kvedge_cli_cmd_t *cmd = s_cmd("show");
    s_show_t s = {NULL, cli->json, -1, 0, 0};
    uint64_t v;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "l:h", opts, NULL)) != -1) {
        switch (c) {
        case 'l':
            if (kvedge_cli_parse_u64(optarg, 0, KVEDGE_MODEL_MAX_LAYERS - 1, &v) != 0) {
                kvedge_cli_error("show: --layer wants a layer number, got '%s'", optarg);
                return KVEDGE_EXIT_USAGE;
            }
            s.layer = (int)v;
            break;
        case 'h':
            kvedge_cli_usage(
                stdout, cmd,
                "Reads and verifies every block of the prefix chunk and prints, per\n"
                "layer and head: scheme, dtype, group, kept key channels, bytes, lz4,\n"
                "compression against fp16, pinned, checksum and its state.\n\n"
                "  -l, --layer L   only layer L\n");
            return KVEDGE_EXIT_OK;
        default:
            return s_bad_option(cmd, argc, argv);
        }
    }
    if (argc - optind != 1) {
        kvedge_cli_error("show: expected one PREFIX (see kvedge ls)");
        return KVEDGE_EXIT_USAGE;
    }
    int ex = kvedge_cli_open(cli, false, &s.e);
    if (ex)
        return ex;
    kvedge_chunk_info_t info;
    if ((ex = s_resolve(cli, s.e, argv[optind], &info)) != 0) {
        kvedge_engine_destroy(&s.e);
        return ex;
    }
    kvedge_model_t m; /* a layer past the model is a mistake, not an empty table */
    if (s.layer >= 0 &&
        (kvedge_engine_get_tenant_model(s.e, info.tenant, info.model_id, &m) == KVEDGE_OK ||
         kvedge_model_builtin(info.model_id, &m) == KVEDGE_OK) &&
        (uint32_t)s.layer >= m.layers) {
        kvedge_cli_error("show: --layer %d is past the %u layers of %s (0 to %u)", s.layer,
                         m.layers, m.id, m.layers - 1u);
        kvedge_engine_destroy(&s.e);
        return KVEDGE_EXIT_USAGE;
    }
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES], phex[KVEDGE_CHUNK_ID_HEX_BYTES];
    kvedge_chunk_id_hex(&info.id, hex);
    if (info.has_parent)
        kvedge_chunk_id_hex(&info.parent, phex);
    if (cli->json) {
        printf("{\"prefix\":\"%s\",\"parent\":%s%s%s,\"model\":", hex, info.has_parent ? "\"" : "",
               info.has_parent ? phex : "null", info.has_parent ? "\"" : "");
        kvedge_cli_json_str(stdout, info.model_id);
        printf(",\"chunk\":%u,\"tokens\":%u,\"blocks\":[", info.index, info.tokens);
    } else {
        printf("prefix %s\nmodel  %s   chunk #%u   tokens %u   parent %s\n\n", hex, info.model_id,
               info.index, info.tokens, info.has_parent ? phex : "-");
        printf("%5s %4s %-8s %-5s %5s %9s %9s %3s %7s %6s %-16s %s\n", "LAYER", "HEAD", "SCHEME",
               "DTYPE", "GROUP", "CHANNELS", "BYTES", "LZ4", "RATIO", "PINNED", "CHECKSUM",
               "STATE");
    }
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
    uint64_t tokens, group, keep, seed, chunk_tokens, ttl;
    bool group_set, keep_set, lz4, pin, salt_set;
    kvedge_scheme_t scheme;
    const char *salt;
} s_synth_opts_t;

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

static int s_put_synthetic(kvedge_cli_t *cli, s_sink_t *sink, const kvedge_model_t *m,
                           const s_synth_opts_t *o)
{
    const uint32_t D = m->head_dim, C = (uint32_t)o->chunk_tokens, H = m->kv_heads;
    const size_t es = kvedge_dtype_size(m->dtype);
    const uint32_t n_chunks = (uint32_t)((o->tokens + C - 1) / C);
    /* The node namespaces chunk ids by this client's tenant: ids go with an empty salt. */
    const char *salt = sink->c ? "" : o->salt;
    uint32_t *tokens = malloc(sizeof(uint32_t) * o->tokens);
    kvedge_chunk_id_t *ids = malloc(sizeof *ids * n_chunks);
    kvedge_block_spec_t spec = {m->dtype,           o->scheme, C,     m->head_dim,
                                (uint16_t)o->group, NULL,      o->lz4};
    s_synth_buf_t b;
    b.slot = (kvedge_block_encoded_bound(&spec) + 7) & ~(size_t)7;
    b.kf = malloc(sizeof(float) * 2 * C * D);
    b.vf = b.kf ? b.kf + (size_t)C * D : NULL;
    b.k = malloc((size_t)C * D * es);
    b.v = malloc((size_t)C * D * es);
    b.blocks = malloc(b.slot * H);
    b.lens = calloc(H, sizeof *b.lens);
    kvedge_put_item_t *items = sink->c ? calloc(H, sizeof *items) : NULL;
    int rc = (tokens && ids && b.kf && b.k && b.v && b.blocks && b.lens && (items || !sink->c))
                 ? KVEDGE_OK
                 : KVEDGE_ENOMEM;
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
        char hex[KVEDGE_CHUNK_ID_HEX_BYTES], b1[32], b2[32];
        kvedge_chunk_id_hex(&ids[n_chunks - 1], hex);
        if (cli->json) {
            printf("{\"prefix\":\"%s\",\"model\":", hex);
            kvedge_cli_json_str(stdout, m->id);
            printf(",\"scheme\":\"%s\",\"tokens\":%llu,\"chunks\":%u,\"blocks\":%llu,"
                   "\"bytes\":%llu,\"fp16_bytes\":%llu,\"ratio\":%.3f,\"seconds\":%.3f}\n",
                   kvedge_scheme_name(o->scheme), (unsigned long long)o->tokens, n_chunks,
                   (unsigned long long)blocks, (unsigned long long)stored, (unsigned long long)fp16,
                   s_ratio(fp16, stored), secs);
        } else {
            printf("put %llu blocks of %s%s%s (%llu tokens in %u chunks, %u layers x %u heads, "
                   "%s): %s stored for %s fp16 (%.2fx) in %.2f s\nprefix %s\n",
                   (unsigned long long)blocks, m->id, sink->c ? " to " : "",
                   sink->c ? cli->host : "", (unsigned long long)o->tokens, n_chunks, m->layers,
                   m->kv_heads, kvedge_scheme_name(o->scheme), kvedge_cli_bytes(stored, b1, 32),
                   kvedge_cli_bytes(fp16, b2, 32), s_ratio(fp16, stored), secs, hex);
        }
    }
    free(tokens);
    free(ids);
    free(b.kf);
    free(b.k);
    free(b.v);
    free(b.blocks);
    free(b.lens);
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
    if (!o->keep_set)
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

static int s_cmd_put_synthetic(kvedge_cli_t *cli, int argc, char **argv)
{
    static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
                                         {"tokens", required_argument, NULL, 't'},
                                         {"scheme", required_argument, NULL, 's'},
                                         {"group", required_argument, NULL, 'g'},
                                         {"keep-channels", required_argument, NULL, 'k'},
                                         {"no-lz4", no_argument, NULL, 'Z'},
                                         {"seed", required_argument, NULL, 'S'},
                                         {"salt", required_argument, NULL, 'a'},
                                         {"chunk-tokens", required_argument, NULL, 'c'},
                                         {"pin", no_argument, NULL, 'p'},
                                         {"ttl", required_argument, NULL, 'T'},
                                         {"force", no_argument, NULL, 'F'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const kvedge_cli_cmd_t *cmd = s_cmd("put-synthetic");
    s_synth_opts_t o = {NULL,
                        S_TOKENS_DEFAULT,
                        0,
                        0,
                        1,
                        KVEDGE_CHUNK_TOKENS_DEFAULT,
                        0,
                        false,
                        false,
                        true,
                        false,
                        false,
                        KVEDGE_SCHEME_INT8,
                        S_SALT_DEFAULT};
    bool force = false;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:t:s:g:k:S:c:h", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm':
            o.model = optarg;
            break;
        case 't':
            bad = kvedge_cli_parse_u64(optarg, 1, S_TOKENS_MAX, &o.tokens);
            break;
        case 's':
            bad = kvedge_scheme_parse(optarg, &o.scheme) ? -1 : 0;
            break;
        case 'g':
            bad = kvedge_cli_parse_u64(optarg, 0, UINT16_MAX, &o.group);
            o.group_set = true;
            break;
        case 'k':
            bad = kvedge_cli_parse_u64(optarg, 1, KVEDGE_BLOCK_MAX_HEAD_DIM, &o.keep);
            o.keep_set = true;
            break;
        case 'Z':
            o.lz4 = false;
            break;
        case 'S':
            bad = kvedge_cli_parse_u64(optarg, 0, UINT64_MAX, &o.seed);
            break;
        case 'a':
            o.salt = optarg;
            o.salt_set = true;
            bad = strlen(optarg) > KVEDGE_SALT_MAX_BYTES ? -1 : 0;
            break;
        case 'c':
            bad = kvedge_cli_parse_u64(optarg, 1, KVEDGE_BLOCK_MAX_TOKENS, &o.chunk_tokens);
            break;
        case 'p':
            o.pin = true;
            break;
        case 'T':
            bad = kvedge_cli_parse_u64(optarg, 1, UINT32_MAX - 1, &o.ttl);
            break;
        case 'F':
            force = true;
            break;
        case 'h':
            kvedge_cli_usage(
                stdout, cmd,
                "Generates a realistic synthetic KV cache (Gaussian values, keys with outlier\n"
                "channels) for a model shape and a random token sequence, and stores it in the\n"
                "store of --data, or with -H EP on that node (in this client's tenant). The\n"
                "same options give the same blocks either way.\n\n"
                "  -m, --model ID          model shape (required; see kvedge models; with -H,\n"
                "                          a built-in one)\n"
                "  -t, --tokens N          context length in tokens (default 1024)\n"
                "  -s, --scheme S          lossless, int8 or int4 (default int8)\n"
                "  -g, --group N           quantization group (default: int8 0 = whole axis,\n"
                "                          int4 32)\n"
                "  -k, --keep-channels N   ThinK: keep the N key channels of largest magnitude\n"
                "      --no-lz4            never lz4-compress blocks\n"
                "  -S, --seed N            data and token seed (default 1)\n"
                "      --salt STR          tenant namespace of the chunk ids (default local);\n"
                "                          not with -H: there the node's tenant of this\n"
                "                          client's key is the namespace\n"
                "  -c, --chunk-tokens N    tokens per chunk (default 256)\n"
                "      --pin               pin the blocks (never evicted or expired)\n"
                "      --ttl SECONDS       expire the blocks after SECONDS\n"
                "      --force             write past the size check: more than 1048576\n"
                "                          tokens, or more than the free disk space (about)\n");
            return KVEDGE_EXIT_OK;
        default:
            return s_bad_option(cmd, argc, argv);
        }
        if (bad) {
            kvedge_cli_error("put-synthetic: bad value '%s' for %s", optarg, argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
    }
    if (optind != argc)
        return s_bad_option(cmd, argc, argv);
    if (!o.model) {
        kvedge_cli_error("put-synthetic: --model is required");
        s_list_builtin_models(stderr);
        return KVEDGE_EXIT_USAGE;
    }
    if (o.scheme == KVEDGE_SCHEME_LOSSLESS && o.group_set && o.group) {
        kvedge_cli_error("put-synthetic: --group applies to int8 and int4 only");
        return KVEDGE_EXIT_USAGE;
    }
    if (cli->host && o.salt_set) {
        kvedge_cli_error("put-synthetic: --salt is for a local store; with -H the node "
                         "namespaces chunk ids by the tenant of this client's key");
        return KVEDGE_EXIT_USAGE;
    }
    if (!o.group_set)
        o.group = o.scheme == KVEDGE_SCHEME_INT4 ? KVEDGE_BLOCK_INT4_GROUP_DEFAULT : 0;
    if (o.tokens > S_TOKENS_UNFORCED && !force) { /* before the store is opened or made */
        kvedge_cli_error("put-synthetic: --tokens %llu is over %u: pass --force to write that "
                         "much synthetic KV",
                         (unsigned long long)o.tokens, S_TOKENS_UNFORCED);
        return KVEDGE_EXIT_USAGE;
    }
    s_sink_t sink = {NULL, NULL};
    kvedge_model_t m;
    int ex;
    if (cli->host) { /* the shape first: a usage error needs no network */
        if ((ex = s_synth_model(cli, NULL, &o, &m)) != 0)
            return ex;
        if ((ex = kvedge_cli_connect(cli, "kvedge-cli", &sink.c)) != 0)
            return ex;
    } else {
        if ((ex = kvedge_cli_open_create(cli, &sink.e)) != 0)
            return ex;
        if ((ex = s_synth_model(cli, sink.e, &o, &m)) != 0 ||
            (ex = s_synth_fits(cli, &m, &o, force)) != 0) {
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

static int s_cmd_verify(kvedge_cli_t *cli, int argc, char **argv)
{
    static const struct option opts[] = {{"quarantine", no_argument, NULL, 'q'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const kvedge_cli_cmd_t *cmd = s_cmd("verify");
    bool quarantine = false;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
        if (c == 'q') {
            quarantine = true;
        } else if (c == 'h') {
            kvedge_cli_usage(stdout, cmd,
                             "Reads every block and checks it as a read does: structure, xxh3\n"
                             "checksum, lz4 body, metadata. A RocksDB record that fails its\n"
                             "own checksums around an intact block is listed apart (reads serve\n"
                             "the block; --quarantine writes it again). Exit code 4 when any\n"
                             "block is corrupt or any record damaged, or when the store is too\n"
                             "damaged to open (then run kvedge repair).\n\n"
                             "  -q, --quarantine   move corrupt blocks to quarantine (needs the\n"
                             "                     store not to be in use)\n");
            return KVEDGE_EXIT_OK;
        } else {
            return s_bad_option(cmd, argc, argv);
        }
    }
    if (optind != argc)
        return s_bad_option(cmd, argc, argv);
    kvedge_engine_t *e;
    int ex = s_open_verify(cli, quarantine, &e);
    if (ex)
        return ex;
    s_verify_t v = {cli->json, 0, 0};
    uint64_t checked = 0, bad = 0;
    if (cli->json)
        printf("{\"corrupt_blocks\":[");
    int rc = kvedge_engine_verify(e, quarantine, s_verify_bad, &v, &checked, &bad);
    if (cli->json)
        printf("],\"checked\":%llu,\"corrupt\":%llu,\"damaged_records\":%llu,"
               "\"quarantined\":%s}\n",
               (unsigned long long)checked, (unsigned long long)bad, (unsigned long long)v.records,
               quarantine && bad ? "true" : "false");
    else
        printf("verified %llu blocks: %llu ok, %llu corrupt%s%s\n", (unsigned long long)checked,
               (unsigned long long)(checked - bad), (unsigned long long)bad,
               bad ? (quarantine ? " (moved to quarantine)" : " (run verify --quarantine)") : "",
               v.records ? (quarantine ? "; damaged records rewritten"
                                       : "; damaged records (run verify --quarantine)")
                         : "");
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

static int s_cmd_repair(kvedge_cli_t *cli, int argc, char **argv)
{
    int ex = s_no_options(
        s_cmd("repair"), argc, argv, 0,
        "Salvages a store that cannot be opened or verified any more (a damaged table, blob\n"
        "file or MANIFEST, a lost CURRENT). The damaged store is read through a working copy\n"
        "(DIR/repair.work), so nothing is changed before a new store of every block that\n"
        "passes the check a read makes has been built (DIR/repair.tmp) and read back whole;\n"
        "then the old RocksDB files move to DIR/lost/repair-TIME (delete them once satisfied)\n"
        "and the new ones into DIR. Blocks that fail are listed and kept in quarantine. A\n"
        "sound store is left as it is. Stop the node first; needs free space for a copy of\n"
        "the store. Exit code 0 when nothing was lost, 4 when blocks, chunk or model records\n"
        "were lost, 5 when the store is missing or in use, 1 on any other failure (the store\n"
        "is then as it was).\n");
    if (ex >= 0)
        return ex;
    s_repair_t r = {cli->json, 0};
    kvedge_repair_report_t rep;
    char why[1024] = "";
    if (cli->json)
        printf("{\"lost_blocks\":[");
    int rc = kvedge_engine_repair(cli->data_dir, s_repair_lost, &r, &rep, why, sizeof why);
    bool lost = rep.blocks_lost || rep.chunks_lost || rep.models_lost;
    if (cli->json) {
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
               rc == KVEDGE_OK && !rep.unchanged ? "true" : "false", rep.resumed ? "true" : "false",
               rep.damaged ? "true" : "false", (unsigned long long)rep.blocks_found,
               (unsigned long long)rep.blocks_kept, (unsigned long long)rep.blocks_lost,
               (unsigned long long)rep.meta_rebuilt, (unsigned long long)rep.from_blob_files,
               (unsigned long long)rep.chunks_kept, (unsigned long long)rep.chunks_rebuilt,
               (unsigned long long)rep.chunks_lost, (unsigned long long)rep.models_kept,
               (unsigned long long)rep.models_lost, (unsigned long long)rep.quarantine_kept,
               (unsigned long long)rep.variants_dropped, (unsigned long long)rep.damaged_keys,
               (unsigned long long)rep.table_files, (unsigned long long)rep.blob_files,
               (unsigned long long)rep.wal_files, (unsigned long long)rep.data_bytes,
               rep.rocksdb_repaired ? "true" : "false", rep.rocksdb_aborted ? "true" : "false");
        kvedge_cli_json_str(stdout, rep.old_files);
        printf("}\n");
    } else if (rc == KVEDGE_OK && rep.resumed) {
        printf("finished an interrupted repair of %s: its verified store of %llu blocks is in "
               "place; the damaged store's files are in %s\n",
               cli->data_dir, (unsigned long long)rep.blocks_kept, rep.old_files);
    } else if (rc == KVEDGE_OK) {
        printf("%s held %llu table, %llu blob and %llu WAL files (%llu bytes), naming %llu "
               "blocks\n",
               cli->data_dir, (unsigned long long)rep.table_files,
               (unsigned long long)rep.blob_files, (unsigned long long)rep.wal_files,
               (unsigned long long)rep.data_bytes, (unsigned long long)rep.blocks_found);
        if (rep.unchanged)
            printf("nothing to repair: every block and record reads back; the store is left as "
                   "it is\n");
        else
            printf("repaired %s: %llu blocks kept, %llu lost (in quarantine), %llu with rebuilt "
                   "metadata; %llu chunks kept, %llu rebuilt, %llu chunk records lost; %llu "
                   "model records lost\n",
                   cli->data_dir, (unsigned long long)rep.blocks_kept,
                   (unsigned long long)rep.blocks_lost, (unsigned long long)rep.meta_rebuilt,
                   (unsigned long long)rep.chunks_kept, (unsigned long long)rep.chunks_rebuilt,
                   (unsigned long long)rep.chunks_lost, (unsigned long long)rep.models_lost);
        if (rep.from_blob_files)
            printf("%llu of the kept blocks were read from the blob files directly\n",
                   (unsigned long long)rep.from_blob_files);
        if (rep.rocksdb_repaired)
            printf("RocksDB could not open the store: its own repair rebuilt a copy first\n");
        if (rep.rocksdb_aborted)
            printf("RocksDB aborted reading the damaged tables: the blocks were taken from the "
                   "blob files alone (metadata, chunk records and variants rebuilt or dropped)\n");
        if (rep.old_files[0])
            printf("the damaged store's files are in %s\n", rep.old_files);
    }
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("repair: %s", why[0] ? why : kvedge_strerror(rc));
        return rc == KVEDGE_ENOTFOUND || rc == KVEDGE_ELOCKED || rc == KVEDGE_EVERSION
                   ? KVEDGE_EXIT_UNAVAILABLE
                   : KVEDGE_EXIT_FAILURE;
    }
    return lost ? KVEDGE_EXIT_CORRUPT : KVEDGE_EXIT_OK;
}

/* ---- evict ---- */

static int s_cmd_evict(kvedge_cli_t *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        {"to", required_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    const kvedge_cli_cmd_t *cmd = s_cmd("evict");
    uint64_t target = 0;
    bool have = false;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "t:h", opts, NULL)) != -1) {
        if (c == 't') {
            if (kvedge_cli_parse_size(optarg, &target) != 0) {
                kvedge_cli_error("evict: --to wants a size such as 512M, got '%s'", optarg);
                return KVEDGE_EXIT_USAGE;
            }
            have = true;
        } else if (c == 'h') {
            kvedge_cli_usage(stdout, cmd,
                             "Evicts least-recently-used unpinned blocks until at most SIZE bytes\n"
                             "are stored. Pinned blocks are never evicted.\n\n"
                             "  -t, --to SIZE   target size: bytes, or with K, M, G, T suffix\n");
            return KVEDGE_EXIT_OK;
        } else {
            return s_bad_option(cmd, argc, argv);
        }
    }
    if (!have || optind != argc) {
        kvedge_cli_error("evict: --to SIZE is required");
        return KVEDGE_EXIT_USAGE;
    }
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
static int s_pin(kvedge_cli_t *cli, int argc, char **argv, bool pin)
{
    const kvedge_cli_cmd_t *cmd = s_cmd(pin ? "pin" : "unpin");
    int ex = s_no_options(cmd, argc, argv, 1,
                          "A prefix is its last chunk together with every chunk before it in\n"
                          "the chain; all their blocks are (un)pinned. Pinned blocks are never\n"
                          "evicted and never expire.\n");
    if (ex >= 0)
        return ex;
    kvedge_engine_t *e;
    if ((ex = kvedge_cli_open(cli, true, &e)) != 0)
        return ex;
    kvedge_chunk_info_t info;
    if ((ex = s_resolve(cli, e, argv[optind], &info)) != 0) {
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
        kvedge_cli_error("%s: %s", cmd->name, kvedge_strerror(rc));
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

static int s_cmd_pin(kvedge_cli_t *cli, int argc, char **argv)
{
    return s_pin(cli, argc, argv, true);
}

static int s_cmd_unpin(kvedge_cli_t *cli, int argc, char **argv)
{
    return s_pin(cli, argc, argv, false);
}

static int s_cmd_delete(kvedge_cli_t *cli, int argc, char **argv)
{
    int ex = s_no_options(s_cmd("delete"), argc, argv, 1,
                          "Deletes the prefix chunk and every chunk chained below it (their\n"
                          "blocks are unreachable without it), pinned or not.\n");
    if (ex >= 0)
        return ex;
    kvedge_engine_t *e;
    if ((ex = kvedge_cli_open(cli, true, &e)) != 0)
        return ex;
    kvedge_chunk_info_t info;
    if ((ex = s_resolve(cli, e, argv[optind], &info)) != 0) {
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

static int s_cmd_models(kvedge_cli_t *cli, int argc, char **argv)
{
    int ex =
        s_no_options(s_cmd("models"), argc, argv, 0,
                     "Lists the built-in model shapes and any other model registered in the\n"
                     "store (when the store exists): node-wide ones as registered, a tenant's\n"
                     "own as tenant:TAG (its tenant tag in hex).\n");
    if (ex >= 0)
        return ex;
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
    kvedge_engine_opts_t opts;
    kvedge_engine_opts_default(&opts);
    opts.create_if_missing = false;
    opts.read_only = true;
    kvedge_engine_t *e;
    if (kvedge_engine_open(cli->data_dir, &opts, &e, NULL, 0) == KVEDGE_OK) {
        kvedge_engine_list_tenant_models(e, s_registered_model, &s);
        kvedge_engine_destroy(&e);
    }
    if (cli->json)
        printf("]\n");
    return KVEDGE_EXIT_OK;
}

const kvedge_cli_cmd_t kvedge_cli_local_cmds[] = {
    {"inspect", s_cmd_inspect, "", "Summarize the store: models, prefixes, bytes, compression."},
    {"ls", s_cmd_ls, "[--model ID] [--full]", "List prefix chunks."},
    {"show", s_cmd_show, "PREFIX [--layer L]",
     "Per layer and head of a prefix: scheme, bytes, checksum."},
    {"put-synthetic", s_cmd_put_synthetic, "--model ID [--tokens N] [--scheme S] [...]",
     "Store a realistic synthetic KV cache (in the store, or on a node with -H)."},
    {"verify", s_cmd_verify, "[--quarantine]", "Check every block as a read does; find damage."},
    {"repair", s_cmd_repair, "",
     "Salvage a damaged store: keep what verifies, quarantine the rest."},
    {"evict", s_cmd_evict, "--to SIZE", "Evict least-recently-used unpinned blocks."},
    {"pin", s_cmd_pin, "PREFIX", "Pin a prefix: never evicted, never expired."},
    {"unpin", s_cmd_unpin, "PREFIX", "Unpin a prefix."},
    {"delete", s_cmd_delete, "PREFIX", "Delete a prefix chunk and the chunks chained below it."},
    {"models", s_cmd_models, "", "List known model shapes."},
    {NULL, NULL, NULL, NULL},
};
