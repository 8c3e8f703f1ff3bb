/* `kvedge prefill / decode --engine llama.cpp` (cli_llamacpp.h): the GGUF loaded by llama.cpp,
 * the context's K/V exported from or imported into its sequence 0 by the bridge. */
#define _GNU_SOURCE
#include "clients/cli/cli_llamacpp.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "access/codec/error.h"
#include "clients/lib/kvedge.h"
#include "clients/llamacpp/bridge.h"

/* Most bytes of a --file read, and most tokens of a context or a prompt. */
#define S_FILE_MAX_BYTES (64u << 20)
#define S_TOKENS_MAX     (1u << 20)

static double s_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* What one command holds: the model, its context, the tokens. */
typedef struct {
    const kvedge_cli_llamacpp_args_t *a;
    struct llama_model *model;
    struct llama_context *ctx;
    kvedge_llamacpp_model_t mi;
    kvedge_llamacpp_layout_t layout;
    kvedge_model_t rec;
    int32_t *ctx_ids, *prompt;
    uint32_t n, n_prompt, vocab;
} s_run_t;

static void s_run_free(s_run_t *r)
{
    if (r->ctx)
        llama_free(r->ctx);
    if (r->model)
        llama_model_free(r->model);
    free(r->prompt);
    free(r->ctx_ids);
}

/* Text to ids with the GGUF's own vocabulary. Returns an exit code. */
static int s_tokenize(const s_run_t *r, const char *flag, const char *text, size_t len,
                      int32_t **out, uint32_t *n)
{
    if (len > INT32_MAX / 2) {
        kvedge_cli_error("%s: %s is too long", r->a->cmd, flag);
        return KVEDGE_EXIT_USAGE;
    }
    size_t cap = len + 2, got = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids || kvedge_llamacpp_tokenize(r->model, text, len, false, r->a->special, ids, cap,
                                         &got) != KVEDGE_OK) {
        free(ids);
        kvedge_cli_error("%s: %s cannot be tokenized with the GGUF's vocabulary", r->a->cmd, flag);
        return KVEDGE_EXIT_FAILURE;
    }
    *out = ids;
    *n = (uint32_t)got;
    return KVEDGE_EXIT_OK;
}

/* Comma-separated ids below the vocabulary. Returns an exit code. */
static int s_ids(const s_run_t *r, const char *flag, const char *s, int32_t **out, uint32_t *n)
{
    size_t k = 1;
    for (const char *p = s; *p; p++)
        k += *p == ',';
    if (k > S_TOKENS_MAX) {
        kvedge_cli_error("%s: %s has over %u ids", r->a->cmd, flag, S_TOKENS_MAX);
        return KVEDGE_EXIT_USAGE;
    }
    int32_t *ids = malloc(k * sizeof *ids);
    if (!ids)
        return KVEDGE_EXIT_FAILURE;
    const char *p = s;
    for (size_t i = 0; i < k; i++) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char num[16] = "";
        uint64_t val;
        if (len < sizeof num)
            memcpy(num, p, len);
        if (!num[0] || kvedge_cli_parse_u64(num, 0, r->vocab - 1, &val) != 0) {
            kvedge_cli_error("%s: %s wants token ids 0..%u separated by commas, got '%.*s'",
                             r->a->cmd, flag, r->vocab - 1, (int)len, p);
            free(ids);
            return KVEDGE_EXIT_USAGE;
        }
        ids[i] = (int32_t)val;
        p = e ? e + 1 : p + len;
    }
    *out = ids;
    *n = (uint32_t)k;
    return KVEDGE_EXIT_OK;
}

/* The context's ids: --context-ids, --context or --file, cut or repeated to --tokens. */
static int s_context(s_run_t *r)
{
    const kvedge_cli_llamacpp_args_t *a = r->a;
    int ex;
    if (a->context_ids) {
        ex = s_ids(r, "--context-ids", a->context_ids, &r->ctx_ids, &r->n);
    } else if (a->context) {
        ex = s_tokenize(r, "--context", a->context, strlen(a->context), &r->ctx_ids, &r->n);
    } else {
        FILE *f = fopen(a->file, "rb");
        char *buf = f ? malloc(S_FILE_MAX_BYTES + 1) : NULL;
        size_t len = buf ? fread(buf, 1, S_FILE_MAX_BYTES, f) : 0;
        bool bad = !f || !buf || ferror(f);
        if (f)
            fclose(f);
        if (bad) {
            free(buf);
            kvedge_cli_error("%s: cannot read the context file %s", a->cmd, a->file);
            return KVEDGE_EXIT_FAILURE;
        }
        ex = s_tokenize(r, "--file", buf, len, &r->ctx_ids, &r->n);
        free(buf);
    }
    if (!ex && r->n == 0) {
        kvedge_cli_error("%s: the context is empty", a->cmd);
        ex = KVEDGE_EXIT_USAGE;
    }
    if (!ex && a->tokens && a->tokens != r->n) {
        int32_t *fit = realloc(r->ctx_ids, (size_t)a->tokens * sizeof *fit);
        if (!fit)
            return KVEDGE_EXIT_FAILURE;
        for (uint32_t i = r->n; i < a->tokens; i++)
            fit[i] = fit[i % r->n];
        r->ctx_ids = fit;
        r->n = a->tokens;
    }
    return ex;
}

/* Loads the GGUF, reads its shape and rotary settings, makes the model record and the
 * context's ids. Returns an exit code. */
static int s_load(s_run_t *r)
{
    const kvedge_cli_llamacpp_args_t *a = r->a;
    char why[KVEDGE_LLAMACPP_WHY_BYTES] = "";
    kvedge_llamacpp_backend_init();
    if (kvedge_llamacpp_version_check(why, sizeof why) != KVEDGE_OK) {
        kvedge_cli_error("%s: %s", a->cmd, why);
        return KVEDGE_EXIT_FAILURE;
    }
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    r->model = llama_model_load_from_file(a->gguf, mp);
    if (!r->model) {
        kvedge_cli_error("%s: llama.cpp cannot load %s", a->cmd, a->gguf);
        return KVEDGE_EXIT_FAILURE;
    }
    r->vocab = (uint32_t)llama_vocab_n_tokens(llama_model_get_vocab(r->model));
    int rc = kvedge_llamacpp_model_info(r->model, a->gguf, NULL, &r->mi, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("%s: %s", a->cmd, why);
        return rc == KVEDGE_EIO ? KVEDGE_EXIT_FAILURE : KVEDGE_EXIT_USAGE;
    }
    rc = kvedge_llamacpp_record(&r->mi, a->model_id, &r->rec);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("%s: --model-id %s does not fit %s: %s", a->cmd, a->model_id, a->gguf,
                         kvedge_strerror(rc));
        return KVEDGE_EXIT_USAGE;
    }
    return s_context(r);
}

/* A llama.cpp context for n_cells positions with --llama-cache's type, V transposed (flash
 * attention off: stated, so the bridge knows the layout). Returns an exit code. */
static int s_make_ctx(s_run_t *r, uint32_t n_cells)
{
    const kvedge_cli_llamacpp_args_t *a = r->a;
    struct llama_context_params cp;
    if (kvedge_llamacpp_context_params(n_cells, 1, a->threads,
                                       strcmp(a->cache, "f32") == 0 ? KVEDGE_LLAMACPP_F32
                                                                    : KVEDGE_LLAMACPP_F16,
                                       &cp) != KVEDGE_OK) {
        kvedge_cli_error("%s: a context of %u positions is not one llama.cpp can make", a->cmd,
                         n_cells);
        return KVEDGE_EXIT_USAGE;
    }
    char why[KVEDGE_LLAMACPP_WHY_BYTES] = "";
    if (kvedge_llamacpp_layout(&r->mi, &cp, &r->layout, why, sizeof why) != KVEDGE_OK) {
        kvedge_cli_error("%s: %s", a->cmd, why);
        return KVEDGE_EXIT_USAGE;
    }
    r->ctx = llama_init_from_model(r->model, cp);
    if (!r->ctx) {
        kvedge_cli_error("%s: llama.cpp cannot make a context of %u positions", a->cmd, n_cells);
        return KVEDGE_EXIT_FAILURE;
    }
    return KVEDGE_EXIT_OK;
}

/* An error of the store as an exit code (3 the model unknown, 5 unreachable, else 1). */
static int s_store_exit(int rc)
{
    if (rc == KVEDGE_ENOMODEL)
        return KVEDGE_EXIT_NOTFOUND;
    if (rc == KVEDGE_ETIMEDOUT || rc == KVEDGE_ECLOSED)
        return KVEDGE_EXIT_UNAVAILABLE;
    return KVEDGE_EXIT_FAILURE;
}

/* ---------------------------------------------------------------- prefill */

static void s_prefill_print(const kvedge_cli_t *cli, const s_run_t *r, const kvedge_chunk_id_t *ids,
                            double prefill_ms, const kvedge_llamacpp_export_stats_t *st,
                            const kvedge_prune_set_t *kept)
{
    const kvedge_e2e_prefill_stats_t *p = &st->put;
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES], b1[32], b2[32];
    if (cli->json) {
        printf("{\"engine\":\"llama.cpp\",\"node\":");
        kvedge_cli_json_str(stdout, cli->host);
        printf(",\"model\":");
        kvedge_cli_json_str(stdout, r->rec.id);
        printf(",\"tokens\":%u,\"chunks\":[", r->n);
        for (size_t i = 0; i < p->n_chunks; i++)
            printf("%s\"%s\"", i ? "," : "", kvedge_chunk_id_hex(&ids[i], hex));
        printf("],\"scheme\":\"%s\",\"blocks\":%llu,\"bytes\":%llu,\"fp16_bytes\":%llu,"
               "\"layers_put\":%u,\"prefill_ms\":%.3f,\"read_ms\":%.3f,\"encode_ms\":%.3f,"
               "\"put_ms\":%.3f}\n",
               kvedge_scheme_name(r->a->quant.scheme), (unsigned long long)p->blocks,
               (unsigned long long)p->bytes, (unsigned long long)p->fp16_bytes, p->layers_put,
               prefill_ms, st->read_us / 1e3, p->encode_us / 1e3, p->put_us / 1e3);
        return;
    }
    printf("prefilled %u context tokens of %s with llama.cpp (%s, %u layers, %u KV heads of %u, "
           "%s cache) on %s\n",
           r->n, r->rec.id, r->mi.arch, r->mi.layers, r->mi.kv_heads, r->mi.head_dim,
           r->layout.type == KVEDGE_LLAMACPP_F32 ? "F32" : "F16", cli->host);
    printf("chunks: %zu, first %s\n", p->n_chunks,
           p->n_chunks ? kvedge_chunk_id_hex(&ids[0], hex) : "-");
    printf("blocks: %llu (%s), %s stored for %s fp16\n", (unsigned long long)p->blocks,
           kvedge_scheme_name(r->a->quant.scheme), kvedge_cli_bytes(p->bytes, b1, sizeof b1),
           kvedge_cli_bytes(p->fp16_bytes, b2, sizeof b2));
    if (kept) {
        char list[256];
        kvedge_prune_set_format(kept, list, sizeof list);
        printf("layers: kept %s of %u (--layers), pruned %u\n", list, r->mi.layers,
               r->mi.layers - p->layers_put);
    }
    printf("time: llama.cpp prefill %.1f ms, state read %.1f ms, encode %.1f ms, put %.1f ms\n",
           prefill_ms, st->read_us / 1e3, p->encode_us / 1e3, p->put_us / 1e3);
}

/* --layers against the GGUF's layer count: q->layers points at keep. Returns an exit code. */
static int s_prefill_layers(const s_run_t *r, kvedge_e2e_quant_t *q, kvedge_prune_set_t *keep)
{
    if (!r->a->layers)
        return KVEDGE_EXIT_OK;
    char why[KVEDGE_PRUNE_WHY_BYTES] = "";
    if (kvedge_prune_parse(r->a->layers, r->mi.layers, keep, why, sizeof why) != KVEDGE_OK) {
        kvedge_cli_error("prefill: bad value '%s' for --layers: %s", r->a->layers, why);
        return KVEDGE_EXIT_USAGE;
    }
    q->layers = keep;
    return KVEDGE_EXIT_OK;
}

int kvedge_cli_llamacpp_prefill(kvedge_cli_t *cli, const kvedge_cli_llamacpp_args_t *a)
{
    s_run_t r = {.a = a};
    kvedge_e2e_quant_t q = a->quant;
    kvedge_prune_set_t keep;
    int ex = s_load(&r);
    if (!ex)
        ex = s_prefill_layers(&r, &q, &keep);
    if (!ex)
        ex = s_make_ctx(&r, r.n);
    double t0 = s_now_ms(), prefill_ms = 0;
    if (!ex && kvedge_llamacpp_prefill(r.ctx, 0, r.ctx_ids, r.n, 0) != KVEDGE_OK) {
        kvedge_cli_error("prefill: llama.cpp's prefill of the context failed");
        ex = KVEDGE_EXIT_FAILURE;
    }
    prefill_ms = s_now_ms() - t0;
    kvedge_client_t *node = NULL;
    if (!ex)
        ex = kvedge_cli_connect(cli, "kvedge prefill", &node);
    const uint32_t ct = a->chunk_tokens ? a->chunk_tokens : KVEDGE_E2E_CHUNK_TOKENS_DEFAULT;
    size_t max = ((size_t)r.n + ct - 1) / ct;
    kvedge_chunk_id_t *ids = ex ? NULL : calloc(max, sizeof *ids);
    kvedge_llamacpp_export_stats_t st;
    memset(&st, 0, sizeof st);
    if (!ex) {
        char why[KVEDGE_LLAMACPP_WHY_BYTES] = "";
        int rc =
            ids ? kvedge_llamacpp_export(r.ctx, 0, &r.mi, &r.layout, node, &r.rec, r.ctx_ids, r.n,
                                         a->chunk_tokens, &q, ids, max, &st, why, sizeof why)
                : KVEDGE_ENOMEM;
        if (rc != KVEDGE_OK) {
            kvedge_cli_error("prefill: %s%s%s", why, why[0] ? ": " : "", kvedge_strerror(rc));
            ex = rc == KVEDGE_EINVAL || rc == KVEDGE_ESHAPE ? KVEDGE_EXIT_USAGE : s_store_exit(rc);
        }
    }
    /* The plain id too, with no blocks (as the reference engine's prefill): a decode by a model
     * of other rotary settings then learns the context is there for another model. */
    if (!ex && strcmp(r.rec.id, a->model_id) != 0) {
        kvedge_model_t plain = r.rec;
        snprintf(plain.id, sizeof plain.id, "%s", a->model_id);
        int rc = kvedge_client_put_model(node, &plain);
        if (rc != KVEDGE_OK && rc != KVEDGE_ESHAPE)
            ex = s_store_exit(rc);
    }
    if (!ex)
        s_prefill_print(cli, &r, ids, prefill_ms, &st, q.layers);
    free(ids);
    kvedge_client_destroy(&node);
    s_run_free(&r);
    return ex;
}

/* ---------------------------------------------------------------- decode */

/* Greedy: the pick of the prompt's last logits, then one token at a time; ttft_ms from t0. */
static int s_generate(s_run_t *r, int32_t *gen, double *ttft_ms, double t0)
{
    double t1 = s_now_ms(), first_us = 0;
    int rc = kvedge_llamacpp_generate(r->ctx, 0, (int32_t)(r->n + r->n_prompt), r->a->max_new, gen,
                                      &first_us);
    *ttft_ms = t1 - t0 + first_us / 1e3;
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("decode: llama.cpp's decode of the generated tokens failed");
        return KVEDGE_EXIT_FAILURE;
    }
    return KVEDGE_EXIT_OK;
}

static void s_decode_print(const kvedge_cli_t *cli, const s_run_t *r, const int32_t *gen,
                           const kvedge_llamacpp_import_stats_t *st, double ttft_ms,
                           double total_ms)
{
    const struct llama_vocab *v = llama_model_get_vocab(r->model);
    char *text = calloc((size_t)r->a->max_new * 64 + 1, 1);
    size_t at = 0;
    for (uint32_t i = 0; text && i < r->a->max_new; i++) {
        int32_t k = llama_token_to_piece(v, gen[i], text + at, 63, 0, true);
        at += k > 0 ? (size_t)k : 0;
    }
    if (cli->json) {
        printf("{\"engine\":\"llama.cpp\",\"proxy\":");
        kvedge_cli_json_str(stdout, cli->host);
        printf(",\"model\":");
        kvedge_cli_json_str(stdout, r->rec.id);
        printf(",\"context_tokens\":%u,\"prompt_tokens\":%u,\"layers\":%u,\"fetched\":%u,"
               "\"missed\":%u,\"prefilled\":%s,\"fetch_ms\":%.3f,\"convert_ms\":%.3f,"
               "\"load_ms\":%.3f,\"prefill_ms\":%.3f,\"state_bytes\":%llu,\"ttft_ms\":%.3f,"
               "\"total_ms\":%.3f,\"tokens\":[",
               r->n, r->n_prompt, r->mi.layers, st->fetched, st->missed,
               st->prefilled ? "true" : "false", st->fetch_us / 1e3, st->convert_us / 1e3,
               st->load_us / 1e3, st->prefill_us / 1e3, (unsigned long long)st->state_bytes,
               ttft_ms, total_ms);
        for (uint32_t i = 0; i < r->a->max_new; i++)
            printf("%s%d", i ? "," : "", gen[i]);
        printf("],\"text\":");
        kvedge_e2e_json_text(stdout, text ? text : "", at);
        printf("}\n");
    } else {
        if (!r->a->quiet) {
            printf("llama.cpp decode of %s over %u context tokens from %s: %u of %u layers "
                   "fetched%s\n",
                   r->rec.id, r->n, cli->host, st->fetched, r->mi.layers,
                   st->prefilled ? ", a layer missed: llama.cpp prefilled the context" : "");
            printf("time: fetch %.1f ms, convert %.1f ms, load %.1f ms, prefill %.1f ms; TTFT "
                   "%.1f ms, total %.1f ms\n",
                   st->fetch_us / 1e3, st->convert_us / 1e3, st->load_us / 1e3,
                   st->prefill_us / 1e3, ttft_ms, total_ms);
        }
        printf("tokens:");
        for (uint32_t i = 0; i < r->a->max_new; i++)
            printf(" %d", gen[i]);
        printf("\ntext: %.*s\n", (int)at, text ? text : "");
    }
    free(text);
}

/* Against a store node (a proxy answers for layers only): the record the store holds under
 * the id must be the GGUF's (kvedge_llamacpp_check), and a context stored under the plain id
 * but not under this one was prefilled with other rotary settings. Returns an exit code. */
static int s_known(const kvedge_cli_t *cli, kvedge_client_t *c, const s_run_t *r)
{
    const kvedge_node_info_t *peer = kvedge_client_node(c);
    if (!peer || peer->role == KVEDGE_ROLE_PROXY)
        return KVEDGE_EXIT_OK;
    kvedge_model_t known;
    char why[KVEDGE_LLAMACPP_WHY_BYTES] = "";
    int rc = kvedge_client_get_model(c, r->rec.id, &known);
    if (rc == KVEDGE_OK && kvedge_llamacpp_check(&r->mi, &known, why, sizeof why) != KVEDGE_OK) {
        kvedge_cli_error("decode: %s does not match the model the store holds: %s", r->a->gguf,
                         why);
        return KVEDGE_EXIT_USAGE;
    }
    if (rc == KVEDGE_ENOMODEL && strcmp(r->rec.id, r->a->model_id) != 0 &&
        kvedge_client_get_model(c, r->a->model_id, &known) == KVEDGE_OK) {
        kvedge_cli_error("decode: the context of model '%s' on %s was prefilled by a model with "
                         "other rotary settings than %s (this one's K is stored as '%s')",
                         r->a->model_id, cli->host, r->a->gguf, r->rec.id);
        return KVEDGE_EXIT_USAGE;
    }
    return KVEDGE_EXIT_OK;
}

/* Imports the context into sequence 0 (llama.cpp prefills it when a layer missed) and decodes
 * the prompt on top. Returns an exit code. */
static int s_import_prompt(kvedge_cli_t *cli, s_run_t *r, kvedge_llamacpp_import_stats_t *st)
{
    kvedge_client_t *proxy = NULL;
    int ex = kvedge_cli_connect(cli, "kvedge decode", &proxy);
    if (!ex)
        ex = s_known(cli, proxy, r);
    if (ex) {
        kvedge_client_destroy(&proxy);
        return ex;
    }
    kvedge_llamacpp_import_t req;
    kvedge_llamacpp_import_default(&req);
    req.proxy = proxy;
    req.model = &r->rec;
    req.ctx = r->ctx_ids;
    req.n = r->n;
    req.chunk_tokens = r->a->chunk_tokens;
    req.deadline_ms = cli->deadline_ms > 0 ? cli->deadline_ms : 0;
    char why[KVEDGE_LLAMACPP_WHY_BYTES] = "";
    int rc = kvedge_llamacpp_import(r->ctx, 0, &r->mi, &r->layout, &req, st, why, sizeof why);
    kvedge_client_destroy(&proxy);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("decode: %s%s%s", why, why[0] ? ": " : "", kvedge_strerror(rc));
        return rc == KVEDGE_ESHAPE || rc == KVEDGE_ETOOBIG ? KVEDGE_EXIT_USAGE : s_store_exit(rc);
    }
    if (kvedge_llamacpp_prefill(r->ctx, 0, r->prompt, r->n_prompt, (int32_t)r->n) != KVEDGE_OK) {
        kvedge_cli_error("decode: llama.cpp's decode of the prompt failed");
        return KVEDGE_EXIT_FAILURE;
    }
    return KVEDGE_EXIT_OK;
}

int kvedge_cli_llamacpp_decode(kvedge_cli_t *cli, const kvedge_cli_llamacpp_args_t *a)
{
    s_run_t r = {.a = a};
    int ex = s_load(&r);
    if (!ex && a->prompt_ids)
        ex = s_ids(&r, "--prompt-ids", a->prompt_ids, &r.prompt, &r.n_prompt);
    else if (!ex)
        ex = s_tokenize(&r, "--prompt", a->prompt, strlen(a->prompt), &r.prompt, &r.n_prompt);
    if (!ex && r.n_prompt == 0) {
        kvedge_cli_error("decode: the prompt is empty");
        ex = KVEDGE_EXIT_USAGE;
    }
    uint64_t cells = (uint64_t)r.n + r.n_prompt + a->max_new;
    if (!ex && cells > S_TOKENS_MAX) {
        kvedge_cli_error("decode: context, prompt and --max-new make over %u positions",
                         S_TOKENS_MAX);
        ex = KVEDGE_EXIT_USAGE;
    }
    if (!ex)
        ex = s_make_ctx(&r, (uint32_t)cells);
    int32_t *gen = ex ? NULL : calloc(a->max_new, sizeof *gen);
    if (!ex && !gen)
        ex = KVEDGE_EXIT_FAILURE;
    kvedge_llamacpp_import_stats_t st;
    memset(&st, 0, sizeof st);
    double t0 = s_now_ms(), ttft = 0;
    if (!ex)
        ex = s_import_prompt(cli, &r, &st);
    if (!ex)
        ex = s_generate(&r, gen, &ttft, t0);
    if (!ex)
        s_decode_print(cli, &r, gen, &st, ttft, s_now_ms() - t0);
    free(gen);
    s_run_free(&r);
    return ex;
}
