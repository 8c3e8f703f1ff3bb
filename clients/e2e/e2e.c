/* The cloud prefill and edge decode roles around the reference decoder, and the edge-only and
 * cloud-only baselines (e2e.h).
 *
 * Times: every clock here is kvedge_shaper_now_us() (CLOCK_MONOTONIC, microseconds), so the
 * emulated cloud link's delivery times and the request's own times are on one axis. */
#include "clients/e2e/e2e.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "access/shaper.h"
#include "clients/lib/pipeline.h"
#include "proxy/plan.h"
#include "gpu/dequant.h"
#include "access/codec/quant.h"
#include "access/codec/synth.h"

static uint64_t s_now_us(void)
{
    return kvedge_shaper_now_us();
}

static double s_since(uint64_t t0)
{
    return (double)(s_now_us() - t0);
}

/* Sleeps until abs_us on the CLOCK_MONOTONIC microsecond clock, through signals. */
static void s_sleep_until(uint64_t abs_us)
{
    struct timespec ts = {(time_t)(abs_us / 1000000), (long)(abs_us % 1000000) * 1000};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

const char *kvedge_e2e_mode_name(kvedge_e2e_mode_t mode)
{
    switch (mode) {
    case KVEDGE_E2E_KVEDGE:
        return "kvedge";
    case KVEDGE_E2E_LOCAL:
        return "edge-only";
    case KVEDGE_E2E_CLOUD_ONLY:
        return "cloud-only";
    }
    return "?";
}

const char *kvedge_e2e_result_mode(const kvedge_e2e_result_t *res)
{
    if (!res)
        return "?";
    return res->large_small ? "ce-lslm" : kvedge_e2e_mode_name(res->mode);
}

/* ---------------------------------------------------------------- tokens, model, chunks */

int kvedge_e2e_byte_tokens(const char *text, size_t len, uint32_t vocab, int32_t *out, size_t max,
                           size_t *n)
{
    if ((!text && len) || (!out && max) || !n || vocab < 256u + KVEDGE_E2E_BYTE_TOKEN_BASE)
        return KVEDGE_EINVAL;
    size_t k = len < max ? len : max;
    for (size_t i = 0; i < k; i++)
        out[i] = (int32_t)(unsigned char)text[i] + KVEDGE_E2E_BYTE_TOKEN_BASE;
    *n = k;
    return KVEDGE_OK;
}

/* Bytes of the valid UTF-8 character at s (n bytes left), 0 when there is none. */
static size_t s_utf8_len(const unsigned char *s, size_t n)
{
    size_t len = s[0] < 0x80             ? 1
                 : (s[0] & 0xE0) == 0xC0 ? 2
                 : (s[0] & 0xF0) == 0xE0 ? 3
                 : (s[0] & 0xF8) == 0xF0 ? 4
                                         : 0;
    if (len == 0 || len > n)
        return 0;
    uint32_t cp = len == 1 ? s[0] : s[0] & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

void kvedge_e2e_json_text(FILE *f, const char *text, size_t len)
{
    const unsigned char *s = (const unsigned char *)text;
    fputc('"', f);
    for (size_t i = 0; i < len;) {
        size_t k = s_utf8_len(s + i, len - i);
        if (k == 0) {
            fputs("\\ufffd", f);
            i++;
        } else if (s[i] == '"' || s[i] == '\\') {
            fprintf(f, "\\%c", s[i++]);
        } else if (s[i] < 0x20 || s[i] == 0x7F) {
            fprintf(f, "\\u%04x", s[i++]);
        } else {
            fwrite(s + i, 1, k, f);
            i += k;
        }
    }
    fputc('"', f);
}

/* Writes the rotary suffix of fingerprint f ("@rope-" and 8 hex digits) to out. */
static void s_rope_suffix(uint32_t f, char out[KVEDGE_E2E_ROPE_SUFFIX_BYTES + 1])
{
    snprintf(out, KVEDGE_E2E_ROPE_SUFFIX_BYTES + 1, "@rope-%08" PRIx32, f);
}

/* The rotary fingerprint an id ends with (its "@rope-XXXXXXXX" suffix), 0 when none. */
static uint32_t s_id_rope(const char *id)
{
    return kvedge_model_id_rope(id);
}

int kvedge_e2e_model(const kvedge_decoder_t *d, const char *id, kvedge_model_t *out)
{
    const kvedge_decoder_config_t *c = d ? kvedge_decoder_config(d) : NULL;
    if (!c || c->layers == 0 || !id || !out || id[0] == '\0' ||
        strlen(id) > KVEDGE_MODEL_ID_MAX_BYTES)
        return KVEDGE_EINVAL;
    uint32_t kvh = kvedge_decoder_kv_heads(d);
    if (c->layers > KVEDGE_MODEL_MAX_LAYERS || kvh > KVEDGE_MODEL_MAX_HEADS ||
        c->head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM)
        return KVEDGE_ETOOBIG;
    kvedge_model_t m;
    memset(&m, 0, sizeof m);
    memcpy(m.id, id, strlen(id) + 1);
    /* A rotary model's K depends on its rotary settings: they go into the id (and so into
     * every chunk id), so a context is found only by a model that rotates K the same way. */
    uint32_t f = kvedge_decoder_rope_fingerprint(d), has = s_id_rope(id);
    if (has && has != f)
        return KVEDGE_ESHAPE;
    if (f && !has) {
        char sfx[KVEDGE_E2E_ROPE_SUFFIX_BYTES + 1];
        s_rope_suffix(f, sfx);
        if (strlen(id) + KVEDGE_E2E_ROPE_SUFFIX_BYTES > KVEDGE_MODEL_ID_MAX_BYTES)
            return KVEDGE_EINVAL;
        memcpy(m.id + strlen(id), sfx, sizeof sfx);
    }
    m.layers = (uint16_t)c->layers;
    m.kv_heads = (uint16_t)kvh;
    m.head_dim = (uint16_t)c->head_dim;
    m.dtype = KVEDGE_DTYPE_FP16;
    int rc = kvedge_model_check(&m);
    if (rc == KVEDGE_OK)
        *out = m;
    return rc;
}

uint32_t kvedge_e2e_model_rope(const kvedge_model_t *m)
{
    return m ? s_id_rope(m->id) : 0;
}

/* 0 when m describes d: KVEDGE_EINVAL when its shape (or validity) does not,
 * KVEDGE_ESHAPE when the shape does but its rotary fingerprint is not d's. */
static int s_model_check(const kvedge_decoder_t *d, const kvedge_model_t *m)
{
    const kvedge_decoder_config_t *c = kvedge_decoder_config(d);
    if (kvedge_model_check(m) != KVEDGE_OK || c->layers != m->layers ||
        kvedge_decoder_kv_heads(d) != m->kv_heads || c->head_dim != m->head_dim)
        return KVEDGE_EINVAL;
    return s_id_rope(m->id) == kvedge_decoder_rope_fingerprint(d) ? KVEDGE_OK : KVEDGE_ESHAPE;
}

static uint32_t s_chunk_tokens(uint32_t chunk_tokens)
{
    return chunk_tokens ? chunk_tokens : KVEDGE_E2E_CHUNK_TOKENS_DEFAULT;
}

int kvedge_e2e_chunks(const kvedge_model_t *m, const int32_t *ctx, uint32_t n,
                      uint32_t chunk_tokens, kvedge_chunk_id_t *ids, size_t max, size_t *n_ids)
{
    if (!m || !ctx || n == 0 || (!ids && max) || !n_ids || chunk_tokens > KVEDGE_CHUNK_TOKENS_MAX ||
        m->id[0] == '\0')
        return KVEDGE_EINVAL;
    uint32_t ct = s_chunk_tokens(chunk_tokens);
    size_t need = ((size_t)n + ct - 1) / ct;
    if (need > max)
        return KVEDGE_ENOSPACE;
    uint32_t *u = malloc((size_t)n * sizeof *u);
    if (!u)
        return KVEDGE_ENOMEM;
    int rc = KVEDGE_OK;
    for (uint32_t i = 0; i < n && rc == KVEDGE_OK; i++) {
        if (ctx[i] < 0)
            rc = KVEDGE_EINVAL;
        u[i] = (uint32_t)ctx[i];
    }
    if (rc == KVEDGE_OK)
        rc = kvedge_chunk_chain(NULL, 0, m->id, u, n, ct, ids, max);
    free(u);
    if (rc < 0)
        return rc;
    *n_ids = (size_t)rc;
    return KVEDGE_OK;
}

void kvedge_e2e_quant_default(kvedge_e2e_quant_t *q)
{
    if (!q)
        return;
    memset(q, 0, sizeof *q);
    q->scheme = KVEDGE_SCHEME_INT8;
    q->dtype = KVEDGE_DTYPE_FP16;
    q->compress = true;
}

/* ---------------------------------------------------------------- cloud prefill */

static int s_quant_check(const kvedge_e2e_quant_t *q, uint32_t head_dim)
{
    if (q->dtype != KVEDGE_DTYPE_FP16 && q->dtype != KVEDGE_DTYPE_FP32)
        return KVEDGE_EINVAL;
    if (q->scheme != KVEDGE_SCHEME_LOSSLESS && q->scheme != KVEDGE_SCHEME_INT8 &&
        q->scheme != KVEDGE_SCHEME_INT4)
        return KVEDGE_EINVAL;
    if (q->scheme == KVEDGE_SCHEME_INT4 && q->group_size && q->group_size < KVEDGE_E2E_GROUP_MIN)
        return KVEDGE_EINVAL;
    if (q->keep_channels > head_dim)
        return KVEDGE_EINVAL;
    return KVEDGE_OK;
}

/* Whether prefill puts layer l: every layer without a pruning set. */
static bool s_layer_put(const kvedge_e2e_quant_t *q, uint32_t l)
{
    return !q->layers || kvedge_prune_set_has(q->layers, l);
}

/* The shape prefill encodes: a decoder's, or a model record's (kvedge_e2e_prefill_model_kv). */
typedef struct {
    uint32_t layers, kvh, head_dim;
    bool rotary; /* K in rotate-half pairs (ThinK keeps channels j and j + head_dim / 2) */
} s_shape_t;

/* Encodes every (chunk, head) of layer l into arena and describes them in items. */
typedef struct {
    const s_shape_t *sh;
    const kvedge_model_t *m;
    const kvedge_e2e_quant_t *q;
    const kvedge_chunk_id_t *ids;
    size_t n_chunks;
    uint32_t n, ct; /* context tokens, tokens per chunk */
    const float *k, *v;
    uint8_t *src_k, *src_v; /* one head of one chunk in the source dtype */
    uint8_t *arena;         /* one layer's encoded blocks */
    size_t arena_cap;
    kvedge_put_item_t *items; /* n_chunks * kv_heads */
} s_enc_t;

static int s_encode_layer(s_enc_t *e, uint32_t l, kvedge_e2e_prefill_stats_t *st)
{
    const s_shape_t *c = e->sh;
    const uint32_t kvh = c->kvh;
    const kvedge_e2e_quant_t *q = e->q;
    size_t used = 0, item = 0;
    uint8_t mask[KVEDGE_BLOCK_MAX_HEAD_DIM / 8];
    for (size_t ci = 0; ci < e->n_chunks; ci++) {
        uint32_t start = (uint32_t)ci * e->ct;
        uint32_t t = e->n - start < e->ct ? e->n - start : e->ct;
        for (uint32_t h = 0; h < kvh; h++) {
            size_t off = (((size_t)l * kvh + h) * e->n + start) * c->head_dim;
            const float *kf = e->k + off, *vf = e->v + off;
            size_t elems = (size_t)t * c->head_dim;
            const void *ks = kf, *vs = vf;
            if (q->dtype != KVEDGE_DTYPE_FP32) {
                kvedge_convert_from_f32(q->dtype, kf, elems, e->src_k);
                kvedge_convert_from_f32(q->dtype, vf, elems, e->src_v);
                ks = e->src_k;
                vs = e->src_v;
            }
            bool masked = q->keep_channels && q->keep_channels < c->head_dim;
            if (masked) {
                /* A rotary model's K channels j and j + head_dim/2 turn together: ThinK keeps
                 * or drops them as pairs. */
                int rc =
                    c->rotary
                        ? kvedge_synth_key_mask_pairs(kf, t, c->head_dim, q->keep_channels, mask)
                        : kvedge_synth_key_mask(kf, t, c->head_dim, q->keep_channels, mask);
                if (rc != KVEDGE_OK)
                    return rc;
            }
            kvedge_block_spec_t spec = {
                .dtype = q->dtype,
                .scheme = q->scheme,
                .tokens = t,
                .head_dim = (uint16_t)c->head_dim,
                .group_size =
                    q->scheme == KVEDGE_SCHEME_INT4
                        ? (q->group_size ? q->group_size : KVEDGE_BLOCK_INT4_GROUP_DEFAULT)
                        : 0,
                .key_mask = masked ? mask : NULL,
                .lz4 = q->compress,
            };
            size_t len = 0;
            int rc = kvedge_block_encode(&spec, ks, vs, e->arena + used, e->arena_cap - used, &len);
            if (rc != KVEDGE_OK)
                return rc;
            kvedge_put_item_t *it = &e->items[item++];
            memset(it, 0, sizeof *it);
            it->chunk.id = e->ids[ci];
            it->chunk.has_parent = ci > 0;
            if (ci > 0)
                it->chunk.parent = e->ids[ci - 1];
            memcpy(it->chunk.model_id, e->m->id, sizeof it->chunk.model_id);
            it->chunk.index = (uint32_t)ci;
            it->chunk.tokens = t;
            it->layer = (uint16_t)l;
            it->head = (uint16_t)h;
            it->block = e->arena + used;
            it->len = len;
            it->pin = q->pin;
            it->ttl_s = q->ttl_s;
            used += (len + 7) & ~(size_t)7;
            st->blocks++;
            st->bytes += len;
            st->fp16_bytes += kvedge_block_fp16_bytes(t, (uint16_t)c->head_dim);
        }
    }
    return KVEDGE_OK;
}

/* kvedge_e2e_prefill and kvedge_e2e_prefill_kv: the context's K/V computed here (k_in NULL)
 * or given. */
/* Where prefill puts: one node's client, or a placed writer (its R replicas). */
typedef struct {
    kvedge_client_t *one;
    kvedge_placed_t *placed;
} s_sink_t;

static int s_sink_model(const s_sink_t *to, const kvedge_model_t *m)
{
    return to->placed ? kvedge_placed_put_model(to->placed, m)
                      : kvedge_client_put_model(to->one, m);
}

static int s_sink_put(const s_sink_t *to, const kvedge_put_item_t *items, size_t n)
{
    return to->placed ? kvedge_placed_put(to->placed, items, n)
                      : kvedge_client_put(to->one, items, n, NULL);
}

static int s_prefill(const s_sink_t *to, const kvedge_decoder_t *d, const kvedge_model_t *m,
                     const int32_t *ctx, uint32_t n, uint32_t chunk_tokens,
                     const kvedge_e2e_quant_t *q, const float *k_in, const float *v_in,
                     kvedge_chunk_id_t *ids, size_t max, kvedge_e2e_prefill_stats_t *stats)
{
    kvedge_e2e_prefill_stats_t st;
    memset(&st, 0, sizeof st);
    if ((!to->one && !to->placed) || (!d && !k_in) || !m || !ctx || n == 0 || !q || !ids ||
        (d && kvedge_decoder_config(d)->layers == 0))
        return KVEDGE_EINVAL;
    /* Without a decoder the record is the shape (the K/V came from another engine). */
    int rc = d ? s_model_check(d, m) : kvedge_model_check(m);
    if (rc != KVEDGE_OK)
        return rc;
    s_shape_t shape = {m->layers, m->kv_heads, m->head_dim, kvedge_model_id_rope(m->id) != 0};
    if (d)
        shape = (s_shape_t){kvedge_decoder_config(d)->layers, kvedge_decoder_kv_heads(d),
                            kvedge_decoder_config(d)->head_dim,
                            kvedge_decoder_rope_fingerprint(d) != 0};
    const s_shape_t *c = &shape;
    const uint32_t kvh = c->kvh;
    rc = s_quant_check(q, c->head_dim);
    if (rc != KVEDGE_OK)
        return rc;
    /* A pruning set of another model, or one that keeps nothing: storing nothing is never
     * what the caller meant. */
    if (q->layers && (q->layers->layers != c->layers || kvedge_prune_set_count(q->layers) == 0))
        return KVEDGE_EINVAL;
    uint32_t ct = s_chunk_tokens(chunk_tokens);
    if (ct > KVEDGE_BLOCK_MAX_TOKENS)
        return KVEDGE_EINVAL;
    size_t n_chunks = 0;
    rc = kvedge_e2e_chunks(m, ctx, n, ct, ids, max, &n_chunks);
    if (rc != KVEDGE_OK)
        return rc;
    /* A placed writer is placed for one context: its root chunk. */
    kvedge_chunk_id_t key;
    if (to->placed && (kvedge_placed_key(to->placed, &key) != KVEDGE_OK || n_chunks == 0 ||
                       memcmp(key.bytes, ids[0].bytes, sizeof key.bytes) != 0))
        return KVEDGE_EINVAL;
    st.n_chunks = n_chunks;

    const size_t kvf = (size_t)kvh * n * c->head_dim;
    s_enc_t e = {.sh = c, .m = m, .q = q, .ids = ids, .n_chunks = n_chunks, .n = n, .ct = ct};
    float *k = k_in ? NULL : malloc((size_t)c->layers * kvf * sizeof(float));
    float *v = k_in ? NULL : malloc((size_t)c->layers * kvf * sizeof(float));
    size_t src_bytes = (size_t)ct * c->head_dim * kvedge_dtype_size(q->dtype);
    e.src_k = malloc(src_bytes);
    e.src_v = malloc(src_bytes);
    e.items = malloc(n_chunks * kvh * sizeof *e.items);
    /* One layer of blocks: each (chunk, head) at most its bound, placed 8-byte aligned. */
    uint8_t full_mask[KVEDGE_BLOCK_MAX_HEAD_DIM / 8];
    memset(full_mask, 0xff, sizeof full_mask);
    if (c->head_dim % 8)
        full_mask[c->head_dim / 8] = (uint8_t)((1u << (c->head_dim % 8)) - 1);
    for (size_t ci = 0; ci < n_chunks; ci++) {
        uint32_t t = n - (uint32_t)ci * ct < ct ? n - (uint32_t)ci * ct : ct;
        kvedge_block_spec_t spec = {
            .dtype = q->dtype,
            .scheme = q->scheme,
            .tokens = t,
            .head_dim = (uint16_t)c->head_dim,
            .group_size = q->scheme == KVEDGE_SCHEME_INT4
                              ? (q->group_size ? q->group_size : KVEDGE_BLOCK_INT4_GROUP_DEFAULT)
                              : 0,
            .key_mask = q->keep_channels && q->keep_channels < c->head_dim ? full_mask : NULL,
        };
        size_t bound = kvedge_block_encoded_bound(&spec);
        if (bound == 0) {
            rc = KVEDGE_EINVAL;
            break;
        }
        e.arena_cap += kvh * ((bound + 7) & ~(size_t)7);
    }
    e.arena = rc == KVEDGE_OK ? malloc(e.arena_cap) : NULL;
    if (rc == KVEDGE_OK && ((!k_in && (!k || !v)) || !e.src_k || !e.src_v || !e.items || !e.arena))
        rc = KVEDGE_ENOMEM;

    if (rc == KVEDGE_OK && !k_in) {
        uint64_t t0 = s_now_us();
        rc = kvedge_decoder_prefill(d, ctx, n, NULL, k, v);
        st.prefill_us = s_since(t0);
    }
    e.k = k_in ? k_in : k;
    e.v = k_in ? v_in : v;
    if (rc == KVEDGE_OK) {
        uint64_t t0 = s_now_us();
        rc = s_sink_model(to, m);
        st.put_us += s_since(t0);
    }
    /* One layer (every chunk and head) per batch: memory bounded by a layer's blocks. A
     * pruned layer is encoded too, only to count what leaving it out saves. */
    for (uint32_t l = 0; rc == KVEDGE_OK && l < c->layers; l++) {
        bool put = s_layer_put(q, l);
        kvedge_e2e_prefill_stats_t pruned;
        memset(&pruned, 0, sizeof pruned);
        uint64_t t0 = s_now_us();
        rc = s_encode_layer(&e, l, put ? &st : &pruned);
        st.encode_us += s_since(t0);
        if (rc != KVEDGE_OK)
            break;
        if (!put) {
            st.pruned_blocks += pruned.blocks;
            st.pruned_bytes += pruned.bytes;
            st.pruned_fp16_bytes += pruned.fp16_bytes;
            continue;
        }
        t0 = s_now_us();
        rc = s_sink_put(to, e.items, n_chunks * kvh);
        st.put_us += s_since(t0);
        if (rc == KVEDGE_OK)
            st.layers_put++;
    }
    free(e.arena);
    free(e.items);
    free(e.src_v);
    free(e.src_k);
    free(v);
    free(k);
    if (stats)
        *stats = st;
    return rc;
}

int kvedge_e2e_prefill(kvedge_client_t *cloud, const kvedge_decoder_t *d, const kvedge_model_t *m,
                       const int32_t *ctx, uint32_t n, uint32_t chunk_tokens,
                       const kvedge_e2e_quant_t *q, kvedge_chunk_id_t *ids, size_t max,
                       kvedge_e2e_prefill_stats_t *stats)
{
    return s_prefill(&(s_sink_t){cloud, NULL}, d, m, ctx, n, chunk_tokens, q, NULL, NULL, ids, max,
                     stats);
}

int kvedge_e2e_prefill_placed(kvedge_placed_t *placed, const kvedge_decoder_t *d,
                              const kvedge_model_t *m, const int32_t *ctx, uint32_t n,
                              uint32_t chunk_tokens, const kvedge_e2e_quant_t *q,
                              kvedge_chunk_id_t *ids, size_t max, kvedge_e2e_prefill_stats_t *stats)
{
    if (!placed)
        return KVEDGE_EINVAL;
    return s_prefill(&(s_sink_t){NULL, placed}, d, m, ctx, n, chunk_tokens, q, NULL, NULL, ids, max,
                     stats);
}

int kvedge_e2e_prefill_model_kv(kvedge_client_t *cloud, const kvedge_model_t *m, const int32_t *ctx,
                                uint32_t n, uint32_t chunk_tokens, const kvedge_e2e_quant_t *q,
                                const float *k, const float *v, kvedge_chunk_id_t *ids, size_t max,
                                kvedge_e2e_prefill_stats_t *stats)
{
    if (!k || !v)
        return KVEDGE_EINVAL;
    return s_prefill(&(s_sink_t){cloud, NULL}, NULL, m, ctx, n, chunk_tokens, q, k, v, ids, max,
                     stats);
}

int kvedge_e2e_prefill_kv(kvedge_client_t *cloud, const kvedge_decoder_t *d,
                          const kvedge_model_t *m, const int32_t *ctx, uint32_t n,
                          uint32_t chunk_tokens, const kvedge_e2e_quant_t *q, const float *k,
                          const float *v, kvedge_chunk_id_t *ids, size_t max,
                          kvedge_e2e_prefill_stats_t *stats)
{
    if (!k || !v)
        return KVEDGE_EINVAL;
    return s_prefill(&(s_sink_t){cloud, NULL}, d, m, ctx, n, chunk_tokens, q, k, v, ids, max,
                     stats);
}

/* ---------------------------------------------------------------- the emulated cloud model */

struct kvedge_e2e_cloud_t {
    const kvedge_decoder_t *d; /* not owned */
    int32_t *ctx;              /* the context it holds, [n] */
    uint32_t n;
    float *k, *v;               /* its K/V, [layers][kv_heads][n][head_dim] */
    size_t kvf;                 /* floats of one layer of k */
    pthread_mutex_t mu;         /* one request at a time */
    kvedge_shaper_t *up, *down; /* the edge-cloud link; NULL: unshaped */
};

int kvedge_e2e_cloud_new(const kvedge_decoder_t *d, const int32_t *ctx, uint32_t n,
                         const char *link, kvedge_e2e_cloud_t **out)
{
    if (!d || !ctx || n == 0 || !out || kvedge_decoder_config(d)->layers == 0)
        return KVEDGE_EINVAL;
    uint64_t rate = 0;
    uint32_t latency = 0;
    if (link && kvedge_shaper_parse(link, &rate, &latency) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    const kvedge_decoder_config_t *c = kvedge_decoder_config(d);
    if (n > c->max_positions)
        return KVEDGE_ETOOBIG;
    kvedge_e2e_cloud_t *self = calloc(1, sizeof *self);
    if (!self)
        return KVEDGE_ENOMEM;
    self->d = d;
    self->n = n;
    self->kvf = kvedge_decoder_kv_floats(d, n);
    self->ctx = malloc((size_t)n * sizeof *self->ctx);
    self->k = malloc((size_t)c->layers * self->kvf * sizeof(float));
    self->v = malloc((size_t)c->layers * self->kvf * sizeof(float));
    if (link) {
        self->up = kvedge_shaper_new(rate, latency, 0);
        self->down = kvedge_shaper_new(rate, latency, 0);
    }
    int rc = KVEDGE_OK;
    if (!self->ctx || !self->k || !self->v || (link && (!self->up || !self->down)))
        rc = KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK) {
        memcpy(self->ctx, ctx, (size_t)n * sizeof *ctx);
        rc = kvedge_decoder_prefill(d, ctx, n, NULL, self->k, self->v);
    }
    pthread_mutex_init(&self->mu, NULL);
    if (rc != KVEDGE_OK) {
        kvedge_e2e_cloud_destroy(&self);
        return rc;
    }
    *out = self;
    return KVEDGE_OK;
}

void kvedge_e2e_cloud_destroy(kvedge_e2e_cloud_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_e2e_cloud_t *self = *self_p;
    *self_p = NULL;
    kvedge_shaper_destroy(&self->down);
    kvedge_shaper_destroy(&self->up);
    pthread_mutex_destroy(&self->mu);
    free(self->v);
    free(self->k);
    free(self->ctx);
    free(self);
}

/* ---------------------------------------------------------------- decoding */

/* The provider of one decode: fetched layers from the pipeline (kvedge mode), the cloud's
 * prefix cache (cloud-only), or nothing (edge-only: every layer a MISS). */
typedef struct {
    uint64_t t0;
    kvedge_e2e_result_t *res;
    kvedge_pipeline_t *pipe; /* kvedge mode */
    const float *k, *v;      /* cloud-only: the cloud's K/V */
    size_t kvf;              /* floats of one layer of k (and of v) */
    uint32_t layers;         /* kvedge mode: the model's */
    bool shared;             /* kvedge mode: holds a share of the cores for the fetch */
} s_prov_t;

/* Edge-only: the session computes every layer of the context. */
static int s_prov_local(void *arg, uint32_t layer, float *k, float *v)
{
    (void)k;
    (void)v;
    s_prov_t *p = arg;
    double now = s_since(p->t0);
    if (layer > 0)
        p->res->layer[layer - 1].done_us = now;
    kvedge_e2e_layer_t *L = &p->res->layer[layer];
    L->blas_threads = kvedge_decoder_share_cores(&p->shared, false);
    snprintf(L->source, sizeof L->source, "local");
    L->kind = -1;
    L->computed = true;
    L->ready_us = now;
    p->res->computed++;
    return KVEDGE_DECODER_MISS;
}

/* kvedge mode: blocks until the pipeline has layer `layer` resident or missed. The pipeline
 * dequantizes into the session's own storage (kvedge_decoder_session_ctx_kv), so a resident
 * layer is already in k and v. */
static int s_prov_fetch(void *arg, uint32_t layer, float *k, float *v)
{
    (void)k;
    (void)v;
    s_prov_t *p = arg;
    if (layer > 0)
        p->res->layer[layer - 1].done_us = s_since(p->t0);
    int rc = kvedge_pipeline_wait(p->pipe, (uint16_t)layer);
    kvedge_e2e_layer_t *L = &p->res->layer[layer];
    L->ready_us = s_since(p->t0);
    /* Work placed where it costs least: a layer it computes itself, or the next layer
     * already here, and the decoder is the critical path (all the cores); the next layer
     * still on its way, and the fetch is: the decoder leaves it the cores it needs. */
    const bool ahead = rc == KVEDGE_OK && layer + 1 < p->layers &&
                       kvedge_pipeline_ready(p->pipe, (uint16_t)(layer + 1)) == 0;
    L->blas_threads = kvedge_decoder_share_cores(&p->shared, ahead);
    L->yielded = p->shared;
    if (rc == KVEDGE_ENOTFOUND) {
        L->computed = true;
        p->res->computed++;
        return KVEDGE_DECODER_MISS;
    }
    if (rc != KVEDGE_OK)
        return rc;
    p->res->fetched++;
    return KVEDGE_DECODER_IN_PLACE;
}

/* Cloud-only: the cloud's prefix cache. */
static int s_prov_cloud(void *arg, uint32_t layer, float *k, float *v)
{
    s_prov_t *p = arg;
    memcpy(k, p->k + (size_t)layer * p->kvf, p->kvf * sizeof(float));
    memcpy(v, p->v + (size_t)layer * p->kvf, p->kvf * sizeof(float));
    return KVEDGE_OK;
}

/* Called as each generated token becomes known where the decoder runs. */
typedef void (*s_token_fn)(void *arg, uint32_t i);

/* Greedy continuation of a begun session: tokens[0] is the pick of the begin logits, then
 * max_new - 1 steps, each appending the previous token and picking from its logits (the last
 * token is never appended: nothing would read its logits). The pick is the arg-max, with
 * req's repetition penalty over the prompt and the tokens so far. */
static int s_greedy(kvedge_decoder_session_t *s, uint32_t vocab, const kvedge_e2e_request_t *req,
                    int32_t *tokens, float *logits, s_token_fn on_token, void *arg)
{
    const uint32_t max_new = req->max_new;
    int32_t *seen = malloc(((size_t)req->prompt_len + max_new) * sizeof *seen);
    if (!seen)
        return KVEDGE_ENOMEM;
    memcpy(seen, req->prompt, req->prompt_len * sizeof *seen);
    size_t nseen = req->prompt_len;
    const float pen = req->repetition_penalty;
    const float *first = kvedge_decoder_session_logits(s);
    tokens[0] = kvedge_decoder_pick(first, vocab, seen, nseen, pen);
    seen[nseen++] = tokens[0];
    if (logits)
        memcpy(logits, first, vocab * sizeof(float));
    on_token(arg, 0);
    int rc = KVEDGE_OK;
    for (uint32_t i = 1; i < max_new && rc == KVEDGE_OK; i++) {
        rc = kvedge_decoder_session_step(s, tokens[i - 1], NULL);
        if (rc != KVEDGE_OK)
            break;
        tokens[i] = kvedge_decoder_pick(kvedge_decoder_session_logits(s), vocab, seen, nseen, pen);
        seen[nseen++] = tokens[i];
        on_token(arg, i);
    }
    free(seen);
    return rc;
}

/* On the edge: a token is known when it is computed. */
typedef struct {
    uint64_t t0;
    kvedge_e2e_result_t *res;
} s_edge_clock_t;

static void s_edge_token(void *arg, uint32_t i)
{
    s_edge_clock_t *c = arg;
    double now = s_since(c->t0);
    if (i == 0)
        c->res->ttft_us = now;
    c->res->total_us = now;
    c->res->generated = i + 1;
}

static int s_decode_local(const kvedge_e2e_request_t *req, int32_t *tokens,
                          kvedge_e2e_result_t *res)
{
    const kvedge_decoder_t *d = req->decoder;
    const kvedge_decoder_config_t *c = kvedge_decoder_config(d);
    kvedge_decoder_session_t *s = kvedge_decoder_session_new(d);
    if (!s)
        return KVEDGE_ENOMEM;
    uint64_t t0 = s_now_us();
    s_prov_t p = {.t0 = t0, .res = res};
    int rc = kvedge_decoder_session_begin(s, req->ctx, req->ctx_len, s_prov_local, &p, req->prompt,
                                          req->prompt_len, req->max_new, NULL);
    if (rc == KVEDGE_OK) {
        res->layer[c->layers - 1].done_us = s_since(t0);
        s_edge_clock_t clk = {t0, res};
        rc = s_greedy(s, c->vocab, req, tokens, req->logits, s_edge_token, &clk);
    }
    res->weights_bytes = kvedge_decoder_weights_bytes(d);
    /* The session's K/V and the context's hidden state it ran the context with. */
    res->kv_bytes = kvedge_decoder_session_kv_bytes(s);
    kvedge_decoder_session_destroy(&s);
    return rc;
}

/* A lossless fp32 element pair takes 8 bytes: the largest any scheme stores. */
size_t kvedge_e2e_slot_bytes(uint32_t n, uint32_t ct, uint32_t heads, uint32_t head_dim)
{
    size_t total = 0;
    for (uint32_t start = 0; start < n; start += ct) {
        size_t t = n - start < ct ? n - start : ct;
        size_t b = 8 * t * head_dim + 4 * (size_t)head_dim + 4 * t;
        b = (b + KVEDGE_PIPELINE_ALIGN_BYTES - 1) & ~(size_t)(KVEDGE_PIPELINE_ALIGN_BYTES - 1);
        total += heads * b;
    }
    return total;
}

/* Large–small: the pipeline's adapt callback. The adapter knows which cloud layer each edge
 * layer was fitted from; a layer the proxy delivered from another (its map and the adapter's
 * disagree) is refused, so the decoder computes it rather than attend over a wrong layer. */
static int s_adapt(void *arg, uint16_t layer, uint16_t from_layer, const float *k_src,
                   const float *v_src, uint32_t tokens, float *k_dst, float *v_dst)
{
    const kvedge_adapter_t *a = arg;
    if (kvedge_adapter_from(a, layer) != (int32_t)from_layer)
        return KVEDGE_ESHAPE;
    return kvedge_adapter_apply(a, layer, k_src, v_src, tokens, k_dst, v_dst);
}

/* Large–small: the adapter is for mapped_model (its cloud_id) and the two models' shapes.
 * Returns 0, KVEDGE_EINVAL (another cloud model) or KVEDGE_ESHAPE. */
static int s_adapter_fits(const kvedge_e2e_request_t *req)
{
    const kvedge_adapter_info_t *ai = kvedge_adapter_info(req->adapter);
    const kvedge_model_t *mm = req->mapped_model;
    if (!ai || kvedge_model_check(mm) != KVEDGE_OK || strcmp(ai->cloud_id, mm->id) != 0)
        return KVEDGE_EINVAL;
    char why[256];
    /* Its shapes, and the edge decoder's rotary settings against those it was fitted for. */
    return kvedge_adapter_check(req->adapter, NULL, mm, req->model, why, sizeof why) == KVEDGE_OK &&
                   kvedge_adapter_check_rope(req->adapter, NULL, req->decoder, why, sizeof why) ==
                       KVEDGE_OK
               ? KVEDGE_OK
               : KVEDGE_ESHAPE;
}

static int s_decode_kvedge(const kvedge_e2e_request_t *req, int32_t *tokens,
                           kvedge_e2e_result_t *res)
{
    const kvedge_decoder_t *d = req->decoder;
    const kvedge_decoder_config_t *c = kvedge_decoder_config(d);
    if (!req->proxy || !req->model || c->layers > KVEDGE_FETCH_MAX_LAYERS || req->deadline_ms < 0 ||
        !req->mapped_model != !req->adapter)
        return KVEDGE_EINVAL;
    int mrc = s_model_check(d, req->model);
    if (mrc != KVEDGE_OK)
        return mrc;
    const uint32_t kvh = kvedge_decoder_kv_heads(d);
    const kvedge_model_t *mm = req->mapped_model;
    if (mm) {
        int rc = s_adapter_fits(req);
        if (rc != KVEDGE_OK)
            return rc;
        res->large_small = true;
        snprintf(res->mapped_model, sizeof res->mapped_model, "%s", mm->id);
    }
    const uint32_t L = c->layers, n = req->ctx_len, ct = s_chunk_tokens(req->chunk_tokens);
    if (ct > KVEDGE_BLOCK_MAX_TOKENS)
        return KVEDGE_EINVAL;
    /* The decoder's estimates are calibrated once per model (a timed prefill on the first
     * call), corrected by what earlier requests measured (s_feed_back): not part of a request,
     * so taken before it starts. */
    float *cu = NULL, *ru = NULL;
    if (req->plan_recompute) {
        float cu1 = 0, ru1 = 0;
        int rc = kvedge_decoder_estimate(d, n, req->prompt_len, &cu1, &ru1);
        if (rc != KVEDGE_OK)
            return rc;
        cu = malloc(L * sizeof *cu);
        ru = malloc(L * sizeof *ru);
        if (!cu || !ru) {
            free(cu);
            free(ru);
            return KVEDGE_ENOMEM;
        }
        for (uint32_t l = 0; l < L; l++) {
            cu[l] = cu1;
            ru[l] = ru1;
        }
    }

    uint64_t t0 = s_now_us();
    const size_t max_chunks = ((size_t)n + ct - 1) / ct, kvf = kvedge_decoder_kv_floats(d, n);
    kvedge_chunk_id_t *ids = malloc(max_chunks * sizeof *ids);
    kvedge_chunk_id_t *mids = mm ? malloc(max_chunks * sizeof *mids) : NULL;
    kvedge_kv_dst_t *kd = calloc(L, sizeof *kd), *vd = calloc(L, sizeof *vd);
    kvedge_pipeline_layer_stats_t *ls = calloc(L, sizeof *ls);
    kvedge_decoder_session_t *s = kvedge_decoder_session_new(d);
    kvedge_pipeline_t *pipe = NULL;
    int rc = ids && kd && vd && ls && s && (mids || !mm) ? KVEDGE_OK : KVEDGE_ENOMEM;
    size_t n_chunks = 0, n_mapped = 0;
    /* The pipeline dequantizes (and places adapted layers) straight into the session's
     * context K/V: reserved before the fetch starts, kept until the session is destroyed. */
    if (rc == KVEDGE_OK)
        rc = kvedge_decoder_session_reserve(s, n, req->prompt_len, req->max_new);
    if (rc == KVEDGE_OK)
        rc = kvedge_e2e_chunks(req->model, req->ctx, n, ct, ids, max_chunks, &n_chunks);
    /* The cloud model's chain over the same tokens: the ids its prefill stored them under. */
    if (rc == KVEDGE_OK && mm)
        rc = kvedge_e2e_chunks(mm, req->ctx, n, ct, mids, max_chunks, &n_mapped);
    size_t slot_bytes = kvedge_e2e_slot_bytes(n, ct, kvh, c->head_dim);
    if (mm) {
        size_t theirs = kvedge_e2e_slot_bytes(n, ct, mm->kv_heads, mm->head_dim);
        slot_bytes = theirs > slot_bytes ? theirs : slot_bytes;
    }
    /* The ring (e2e.h, KVEDGE_E2E_RING_DEFAULT): on this CPU path 2 slots double-buffer, the
     * I/O thread staging one layer while the loader dequantizes the one before; dequantizing a
     * layer takes less than receiving it, so more slots only held memory (4 slots: the same
     * TTFT, docs/benchmarks.md "Fetched K/V in place"). Each slot keeps room for a whole layer
     * in lossless fp32 (kvedge_e2e_slot_bytes), so whatever scheme arrives fits. */
    uint32_t ring = req->ring_slots ? req->ring_slots : KVEDGE_E2E_RING_DEFAULT;
    if (ring > L)
        ring = L;
    if (rc == KVEDGE_OK) {
        for (uint32_t l = 0; l < L && rc == KVEDGE_OK; l++) {
            float *sk = NULL, *sv = NULL;
            rc = kvedge_decoder_session_ctx_kv(s, l, &sk, &sv);
            kvedge_kv_dst_t t = {.layout = KVEDGE_KV_CONTIG,
                                 .dtype = KVEDGE_DTYPE_FP32,
                                 .base = sk,
                                 .cap_bytes = kvf * sizeof(float),
                                 .heads = kvh,
                                 .head_dim = c->head_dim,
                                 .tokens_cap = n};
            kd[l] = t;
            t.base = sv;
            vd[l] = t;
        }
    }
    if (rc == KVEDGE_OK) {
        kvedge_pipeline_opts_t o = {
            .size = sizeof(kvedge_pipeline_opts_t),
            .client = req->proxy,
            .model = req->model,
            .chunks = ids,
            .n_chunks = n_chunks,
            .chunk_tokens = ct,
            .tokens = n,
            .first_layer = 0,
            .layers = (uint16_t)L,
            .k = kd,
            .v = vd,
            .token_offset = 0,
            .on_device = false,
            .ring_slots = ring,
            .slot_bytes = slot_bytes,
            .compute_us = cu,
            .recompute_us = ru,
            .deadline_ms = req->deadline_ms,
            .mapped_model = mm,
            .mapped_chunks = mids,
            .adapt = mm ? s_adapt : NULL,
            .adapt_arg = (void *)req->adapter,
            .accept = req->accept,
            .n_accept = req->n_accept,
            .quality_metric = req->quality_metric,
            .quality_budget = req->quality_budget,
        };
        rc = kvedge_pipeline_open(&o, &pipe);
    }
    kvedge_pipeline_stats_t ps;
    memset(&ps, 0, sizeof ps);
    if (rc == KVEDGE_OK) {
        s_prov_t p = {.t0 = t0, .res = res, .pipe = pipe, .kvf = kvf, .layers = L};
        rc = kvedge_decoder_session_begin(s, req->ctx, n, s_prov_fetch, &p, req->prompt,
                                          req->prompt_len, req->max_new, NULL);
        kvedge_decoder_share_cores(&p.shared, false); /* the fetch is over */
        if (rc == KVEDGE_OK)
            res->layer[L - 1].done_us = s_since(t0);
        /* Every layer has been waited for (or the decode failed): what the pipeline saw. */
        kvedge_pipeline_stats(pipe, &ps, ls, L);
        res->have_plan = kvedge_pipeline_plan(pipe, &res->plan) == KVEDGE_OK;
        kvedge_pipeline_destroy(&pipe);
    }
    if (rc == KVEDGE_OK) {
        s_edge_clock_t clk = {t0, res};
        rc = s_greedy(s, c->vocab, req, tokens, req->logits, s_edge_token, &clk);
    }
    for (uint32_t l = 0; l < L; l++) {
        kvedge_e2e_layer_t *x = &res->layer[l];
        x->kind = ls[l].kind;
        x->reason = ls[l].reason;
        snprintf(x->source, sizeof x->source, "%s", ls[l].source);
        x->from_layer = x->computed ? -1 : ls[l].from_layer;
        x->adapt_failed = ls[l].adapt_failed;
        if (x->computed) {
            snprintf(x->source, sizeof x->source, "local");
            x->kind = -1;
        }
    }
    res->adapted = ps.adapted;
    res->sent_bytes = ps.sent_bytes;
    res->received_bytes = ps.msg_bytes;
    res->weights_bytes = kvedge_decoder_weights_bytes(d);
    /* The session's K/V (the fetched layers were dequantized into it), its context state when
     * it had to run the context for a computed layer, and the ring. */
    res->kv_bytes = kvedge_decoder_session_kv_bytes(s) + (uint64_t)ps.slot_bytes * ps.ring_slots;
    if (mm) /* the pipeline's scratch: a cloud layer dequantized, and adapted */
        res->kv_bytes += 2ull * n * sizeof(float) *
                         ((uint64_t)mm->kv_heads * mm->head_dim + (uint64_t)kvh * c->head_dim);
    kvedge_decoder_session_destroy(&s);
    free(mids);
    free(ls);
    free(vd);
    free(kd);
    free(ids);
    free(ru);
    free(cu);
    return rc;
}

/* Cloud-only: the token i reply leaves the cloud now and reaches the edge `delay` later. */
typedef struct {
    kvedge_shaper_t *down;
    uint64_t t0;
    uint64_t last_us; /* absolute delivery time of the latest reply */
    kvedge_e2e_result_t *res;
} s_cloud_clock_t;

static void s_cloud_token(void *arg, uint32_t i)
{
    s_cloud_clock_t *c = arg;
    uint64_t now = s_now_us();
    uint64_t at =
        now + kvedge_shaper_delay_us(
                  c->down, KVEDGE_E2E_MSG_OVERHEAD_BYTES + KVEDGE_E2E_TOKEN_WIRE_BYTES, now);
    if (at < c->last_us)
        at = c->last_us; /* one link, in order */
    c->last_us = at;
    if (i == 0)
        c->res->ttft_us = (double)(at - c->t0);
    c->res->total_us = (double)(at - c->t0);
    c->res->generated = i + 1;
}

static int s_decode_cloud(const kvedge_e2e_request_t *req, int32_t *tokens,
                          kvedge_e2e_result_t *res)
{
    kvedge_e2e_cloud_t *cl = req->cloud;
    if (!cl || cl->n != req->ctx_len || memcmp(cl->ctx, req->ctx, cl->n * sizeof *cl->ctx) != 0)
        return KVEDGE_EINVAL; /* the cloud holds another context */
    const kvedge_decoder_config_t *c = kvedge_decoder_config(cl->d);
    if ((uint64_t)req->ctx_len + req->prompt_len + req->max_new > c->max_positions)
        return KVEDGE_ETOOBIG;
    kvedge_decoder_session_t *s = kvedge_decoder_session_new(cl->d);
    if (!s)
        return KVEDGE_ENOMEM;
    uint64_t up_bytes =
        KVEDGE_E2E_MSG_OVERHEAD_BYTES + (uint64_t)KVEDGE_E2E_TOKEN_WIRE_BYTES * req->prompt_len;
    uint64_t t0 = s_now_us();
    /* The prompt crosses the uplink, then waits for the one cloud model to be free. */
    kvedge_shaper_wait_from(cl->up, up_bytes, t0);
    uint64_t q0 = s_now_us();
    pthread_mutex_lock(&cl->mu);
    res->queue_us = s_since(q0);
    s_prov_t p = {.t0 = t0, .res = res, .k = cl->k, .v = cl->v, .kvf = cl->kvf};
    int rc = kvedge_decoder_session_begin(s, cl->ctx, cl->n, s_prov_cloud, &p, req->prompt,
                                          req->prompt_len, req->max_new, NULL);
    s_cloud_clock_t clk = {cl->down, t0, 0, res};
    if (rc == KVEDGE_OK)
        rc = s_greedy(s, c->vocab, req, tokens, req->logits, s_cloud_token, &clk);
    pthread_mutex_unlock(&cl->mu);
    kvedge_decoder_session_destroy(&s);
    /* The edge has the answer once the last reply has crossed the downlink. */
    if (clk.last_us)
        s_sleep_until(clk.last_us);
    res->prompt_bytes_sent = (uint64_t)KVEDGE_E2E_TOKEN_WIRE_BYTES * req->prompt_len;
    res->sent_bytes = up_bytes;
    res->received_bytes =
        (uint64_t)res->generated * (KVEDGE_E2E_MSG_OVERHEAD_BYTES + KVEDGE_E2E_TOKEN_WIRE_BYTES);
    return rc;
}

static int s_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Feeds the decoder's measured layer times back to its model (kvedge_decoder_observe), so the
 * next request on it in this process plans with them (e2e.h, "Learning the decoder's speed").
 * Layer l took done(l) - max(ready(l), done(l-1)): the decoder's own time, its wait for the
 * layer left out. The last layer is not used (its time includes the output head). A fetched
 * layer is a compute sample, unless it was yielded (computed on fewer threads while the decoder
 * was ahead of the fetch: slower on purpose, off the critical path). A computed layer also ran the
 * context through the layers c..l (c: the first the context had not been run through); its extra
 * time over this request's median fetched layer, per layer run, is a recompute sample; with no
 * fetched layer to compare (edge-only) its time is split between the two kinds in the proportion of
 * the current estimates. Best effort: the decode has succeeded whatever the feedback does. */
static void s_feed_back(const kvedge_e2e_request_t *req, const kvedge_e2e_result_t *res)
{
    const kvedge_decoder_t *d = req->decoder;
    const uint32_t L = kvedge_decoder_config(d)->layers, n = req->ctx_len, p = req->prompt_len;
    if (L < 2 || L > KVEDGE_FETCH_MAX_LAYERS)
        return;
    double *t = malloc(2 * (size_t)L * sizeof *t);
    if (!t)
        return;
    double *fetched = t + L, prev = 0;
    size_t nf = 0;
    for (uint32_t l = 0; l + 1 < L; l++) {
        const kvedge_e2e_layer_t *x = &res->layer[l];
        t[l] = fmax(x->done_us - fmax(x->ready_us, prev), 0);
        prev = x->done_us;
        if (!x->computed && !x->yielded) {
            fetched[nf++] = t[l];
            kvedge_decoder_observe(d, n, p, t[l], -1);
        }
    }
    qsort(fetched, nf, sizeof *fetched, s_cmp_double);
    const double median = nf == 0  ? 0
                          : nf % 2 ? fetched[nf / 2]
                                   : (fetched[nf / 2 - 1] + fetched[nf / 2]) / 2;
    float cu = 0, ru = 0;
    const bool split = nf == 0 && kvedge_decoder_estimate(d, n, p, &cu, &ru) == KVEDGE_OK;
    uint32_t c = 0; /* the first layer the session's context has not been run through */
    for (uint32_t l = 0; l + 1 < L; l++) {
        if (!res->layer[l].computed)
            continue;
        const double runs = l - c + 1;
        c = l + 1;
        if (nf > 0) {
            kvedge_decoder_observe(d, n, p, -1, fmax(t[l] - median, 0) / runs);
        } else if (split && cu + runs * ru > 0) {
            const double r = t[l] / (cu + runs * ru);
            kvedge_decoder_observe(d, n, p, r * cu, r * ru);
        }
    }
    free(t);
}

int kvedge_e2e_decode(const kvedge_e2e_request_t *req, int32_t *tokens, kvedge_e2e_result_t *res)
{
    if (!req || !tokens || !res || !req->decoder || !req->ctx || req->ctx_len == 0 ||
        !req->prompt || req->prompt_len == 0 || req->max_new == 0)
        return KVEDGE_EINVAL;
    const kvedge_decoder_config_t *c = kvedge_decoder_config(req->decoder);
    if (c->layers == 0)
        return KVEDGE_EINVAL;
    if ((uint64_t)req->ctx_len + req->prompt_len + req->max_new > c->max_positions)
        return KVEDGE_ETOOBIG;
    memset(res, 0, sizeof *res);
    res->mode = req->mode;
    res->layers = c->layers;
    for (uint32_t l = 0; l < KVEDGE_FETCH_MAX_LAYERS; l++) {
        res->layer[l].kind = -1;
        res->layer[l].from_layer = -1;
    }
    if ((req->mapped_model || req->adapter) && req->mode != KVEDGE_E2E_KVEDGE)
        return KVEDGE_EINVAL;
    int rc;
    switch (req->mode) {
    case KVEDGE_E2E_KVEDGE:
        rc = s_decode_kvedge(req, tokens, res);
        if (rc == KVEDGE_OK)
            s_feed_back(req, res);
        return rc;
    case KVEDGE_E2E_LOCAL:
        if (c->layers > KVEDGE_FETCH_MAX_LAYERS)
            return KVEDGE_EINVAL;
        rc = s_decode_local(req, tokens, res);
        if (rc == KVEDGE_OK)
            s_feed_back(req, res);
        return rc;
    case KVEDGE_E2E_CLOUD_ONLY:
        res->layers = kvedge_decoder_config(req->cloud ? req->cloud->d : req->decoder)->layers;
        return s_decode_cloud(req, tokens, res);
    }
    return KVEDGE_EINVAL;
}

/* ---------------------------------------------------------------- printing */

/* kvedge_fetch_source_t kinds are proxy/plan.h's; -1 (computed locally) prints as "-". */
static const char *s_kind_name(int kind)
{
    return kind < 0 ? "-" : kvedge_plan_kind_name((kvedge_plan_kind_t)kind);
}

static const char *s_reason_name(int reason)
{
    return reason ? kvedge_fetch_reason_name(reason) : "-";
}

/* A JSON string: quotes, backslashes, control and non-ASCII bytes escaped (names come from
 * remote peers; the output stays valid JSON whatever they hold). */
static void s_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p >= 0x7f)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* Milliseconds from microseconds; null when not finite (JSON has no NaN or infinity) or not a
 * price (proxy/plan.h: unpriced). */
static void s_json_ms(FILE *f, const char *key, double us, bool comma)
{
    if (isfinite(us) && fabs(us) < KVEDGE_PLAN_UNPRICED_US)
        fprintf(f, "\"%s\":%.3f%s", key, us / 1e3, comma ? "," : "");
    else
        fprintf(f, "\"%s\":null%s", key, comma ? "," : "");
}

/* Whether the proxy planned precisions (a request with an accept list): some layer has a
 * rung or a precision reason. */
static bool s_prec_planned(const kvedge_e2e_result_t *r)
{
    if (!r->have_plan)
        return false;
    uint32_t n =
        r->plan.layers < KVEDGE_FETCH_MAX_LAYERS ? r->plan.layers : KVEDGE_FETCH_MAX_LAYERS;
    for (uint32_t l = 0; l < n; l++)
        if (r->plan.layer[l].prec || r->plan.layer[l].prec_reason)
            return true;
    return false;
}

/* Why the layers computed here were not fetched, as (reason, count) pairs in order of first
 * appearance: the LAYER record's reason ("recompute": the plan chose it; "miss", "miss:deadline":
 * nobody delivered it), or "adaptation-failed" for a mapped layer the adapter refused. Only a
 * kvedge-mode decode has reasons (edge-only computes everything by design). *missed counts the
 * computed layers the plan had not chosen to compute. Returns the number of pairs. */
#define S_WHY_MAX 16
typedef struct {
    const char *why;
    uint32_t count;
} s_why_t;

static uint32_t s_why(const kvedge_e2e_result_t *r, s_why_t *out, uint32_t *missed)
{
    uint32_t n = 0,
             layers = r->layers < KVEDGE_FETCH_MAX_LAYERS ? r->layers : KVEDGE_FETCH_MAX_LAYERS;
    *missed = 0;
    for (uint32_t l = 0; r->mode == KVEDGE_E2E_KVEDGE && l < layers; l++) {
        const kvedge_e2e_layer_t *x = &r->layer[l];
        if (!x->computed || !x->reason)
            continue;
        const char *why = x->adapt_failed ? "adaptation-failed" : s_reason_name(x->reason);
        if (x->adapt_failed || x->reason != KVEDGE_FETCH_RECOMPUTE)
            (*missed)++;
        uint32_t i = 0;
        while (i < n && strcmp(out[i].why, why) != 0)
            i++;
        if (i == n && n == S_WHY_MAX)
            continue;
        if (i == n)
            out[n++] = (s_why_t){why, 0};
        out[i].count++;
    }
    return n;
}

static void s_print_json(FILE *f, const kvedge_e2e_result_t *r)
{
    uint32_t layers = r->layers < KVEDGE_FETCH_MAX_LAYERS ? r->layers : KVEDGE_FETCH_MAX_LAYERS;
    fprintf(f, "{\"mode\":");
    s_json_str(f, kvedge_e2e_result_mode(r));
    fputc(',', f);
    s_json_ms(f, "ttft_ms", r->ttft_us, true);
    s_json_ms(f, "total_ms", r->total_us, true);
    s_json_ms(f, "queue_ms", r->queue_us, true);
    fprintf(f,
            "\"generated\":%u,\"sent_bytes\":%llu,\"received_bytes\":%llu,"
            "\"prompt_bytes_sent\":%llu,\"weights_bytes\":%llu,\"kv_bytes\":%llu,"
            "\"layers\":%u,\"fetched\":%u,\"computed\":%u,",
            r->generated, (unsigned long long)r->sent_bytes, (unsigned long long)r->received_bytes,
            (unsigned long long)r->prompt_bytes_sent, (unsigned long long)r->weights_bytes,
            (unsigned long long)r->kv_bytes, r->layers, r->fetched, r->computed);
    s_why_t why[S_WHY_MAX];
    uint32_t missed, nwhy = s_why(r, why, &missed);
    fprintf(f, "\"missed\":%u,\"why\":{", missed);
    for (uint32_t i = 0; i < nwhy; i++) {
        fprintf(f, "%s", i ? "," : "");
        s_json_str(f, why[i].why);
        fprintf(f, ":%u", why[i].count);
    }
    fprintf(f, "},\"layer\":[");
    bool per_layer = r->mode != KVEDGE_E2E_CLOUD_ONLY;
    for (uint32_t l = 0; per_layer && l < layers; l++) {
        const kvedge_e2e_layer_t *x = &r->layer[l];
        fprintf(f, "%s{\"layer\":%u,\"source\":", l ? "," : "", l);
        s_json_str(f, x->source);
        fprintf(f, ",\"kind\":%d,\"kind_name\":", x->kind);
        s_json_str(f, s_kind_name(x->kind));
        fprintf(f, ",\"reason\":");
        s_json_str(f, s_reason_name(x->reason));
        fprintf(f, ",\"computed\":%s,", x->computed ? "true" : "false");
        if (r->large_small) {
            if (x->from_layer >= 0)
                fprintf(f, "\"from_layer\":%d,", x->from_layer);
            else
                fprintf(f, "\"from_layer\":null,");
            fprintf(f, "\"adapt_failed\":%s,", x->adapt_failed ? "true" : "false");
        }
        if (s_prec_planned(r)) { /* the cache optimizer: the rung planned, and why */
            int pr = r->plan.layer[l].prec;
            fprintf(f, "\"prec\":");
            if (pr)
                s_json_str(f, kvedge_prec_name((kvedge_prec_t)pr));
            else
                fprintf(f, "null");
            fprintf(f, ",\"prec_reason\":");
            s_json_str(f, kvedge_plan_prec_reason_name(
                              (kvedge_plan_prec_reason_t)r->plan.layer[l].prec_reason));
            fputc(',', f);
        }
        s_json_ms(f, "ready_ms", x->ready_us, true);
        s_json_ms(f, "done_ms", x->done_us, false);
        fputc('}', f);
    }
    fprintf(f, "],");
    if (r->large_small) {
        fprintf(f, "\"mapped_model\":");
        s_json_str(f, r->mapped_model);
        fprintf(f, ",\"adapted\":%u,", r->adapted);
    }
    fprintf(f, "\"plan\":");
    if (r->have_plan) {
        fputc('{', f);
        s_json_ms(f, "total_ms", r->plan.total_us, true);
        s_json_ms(f, "bound_ms", r->plan.bound_us, true);
        s_json_ms(f, "cloud_only_ms", r->plan.cloud_only_us, true);
        s_json_ms(f, "recompute_all_ms", r->plan.recompute_all_us, true);
        s_json_ms(f, "load_then_compute_ms", r->plan.load_then_compute_us, true);
        fprintf(f, "\"split\":%u,\"sources\":[", r->plan.split);
        uint32_t ns = r->plan.nsources < KVEDGE_FETCH_MAX_SOURCES ? r->plan.nsources
                                                                  : KVEDGE_FETCH_MAX_SOURCES;
        for (uint32_t i = 0; i < ns; i++) {
            const kvedge_fetch_source_t *src = &r->plan.source[i];
            char name[sizeof src->name + 1];
            memcpy(name, src->name, sizeof src->name);
            name[sizeof src->name] = '\0';
            fprintf(f, "%s{\"name\":", i ? "," : "");
            s_json_str(f, name);
            fprintf(f, ",\"kind\":");
            s_json_str(f, s_kind_name(src->kind));
            fprintf(f, ",\"up\":%s}", src->up ? "true" : "false");
        }
        fprintf(f, "]}");
    } else {
        fprintf(f, "null");
    }
    fprintf(f, "}\n");
}

/* Large–small: which K/V fed edge layer l, one line. */
static void s_print_from(FILE *f, const kvedge_e2e_result_t *res, uint32_t l)
{
    const kvedge_e2e_layer_t *x = &res->layer[l];
    if (x->computed)
        fprintf(f, "layer %u computed here (%s%s)\n", l, s_reason_name(x->reason),
                x->adapt_failed ? ", adaptation failed" : "");
    else if (x->from_layer >= 0)
        fprintf(f, "layer %u \u2190 cloud %s layer %d via %.63s (%s)\n", l, res->mapped_model,
                x->from_layer, x->source[0] ? x->source : "-", s_reason_name(x->reason));
    else
        fprintf(f, "layer %u \u2190 its own K/V via %.63s (%s)\n", l,
                x->source[0] ? x->source : "-", s_reason_name(x->reason));
}

/* "layers    F fetched, C computed of L", and why the computed ones were: "(1 planned
 * recompute; 2 missed: miss 1, miss:deadline 1)". */
static void s_print_counts(FILE *f, const kvedge_e2e_result_t *res)
{
    s_why_t why[S_WHY_MAX];
    uint32_t missed, nwhy = s_why(res, why, &missed), chosen = 0;
    const char *recompute = kvedge_fetch_reason_name(KVEDGE_FETCH_RECOMPUTE);
    fprintf(f, "layers    %u fetched, %u computed of %u", res->fetched, res->computed, res->layers);
    for (uint32_t i = 0; i < nwhy; i++)
        if (strcmp(why[i].why, recompute) == 0)
            chosen = why[i].count;
    if (chosen)
        fprintf(f, " (%u planned recompute%s", chosen, missed ? "; " : ")");
    if (missed) {
        fprintf(f, "%s%u missed:", chosen ? "" : " (", missed);
        bool first = true;
        for (uint32_t i = 0; i < nwhy; i++) {
            if (strcmp(why[i].why, recompute) == 0)
                continue;
            fprintf(f, "%s %s %u", first ? "" : ",", why[i].why, why[i].count);
            first = false;
        }
        fprintf(f, ")");
    }
    fprintf(f, "\n");
}

void kvedge_e2e_print(FILE *f, const kvedge_e2e_result_t *res, bool json)
{
    if (!f || !res)
        return;
    if (json) {
        s_print_json(f, res);
        return;
    }
    uint32_t layers = res->layers < KVEDGE_FETCH_MAX_LAYERS ? res->layers : KVEDGE_FETCH_MAX_LAYERS;
    bool prec = s_prec_planned(res);
    if (res->mode != KVEDGE_E2E_CLOUD_ONLY && layers) {
        fprintf(f, "%5s  %-24s %-8s %-18s %10s %10s", "layer", "source", "kind", "reason",
                "ready ms", "done ms");
        if (prec)
            fprintf(f, "  %-20s %s", "precision", "why");
        fputc('\n', f);
        for (uint32_t l = 0; l < layers; l++) {
            const kvedge_e2e_layer_t *x = &res->layer[l];
            fprintf(f, "%5u  %-24.63s %-8s %-18s %10.2f %10.2f", l, x->source[0] ? x->source : "-",
                    s_kind_name(x->kind), s_reason_name(x->reason), x->ready_us / 1e3,
                    x->done_us / 1e3);
            if (prec) {
                int pr = res->plan.layer[l].prec;
                fprintf(f, "  %-20s %s", pr ? kvedge_prec_name((kvedge_prec_t)pr) : "-",
                        kvedge_plan_prec_reason_name(
                            (kvedge_plan_prec_reason_t)res->plan.layer[l].prec_reason));
            }
            fputc('\n', f);
        }
    }
    for (uint32_t l = 0; res->large_small && l < layers; l++)
        s_print_from(f, res, l);
    fprintf(f, "mode      %s\n", kvedge_e2e_result_mode(res));
    fprintf(f, "TTFT      %.2f ms\n", res->ttft_us / 1e3);
    fprintf(f, "total     %.2f ms for %u tokens\n", res->total_us / 1e3, res->generated);
    if (res->mode == KVEDGE_E2E_CLOUD_ONLY)
        fprintf(f, "queue     %.2f ms waiting for the cloud model\n", res->queue_us / 1e3);
    else
        s_print_counts(f, res);
    if (res->large_small)
        fprintf(f, "adapted   %u layers of %s\n", res->adapted, res->mapped_model);
    fprintf(f, "sent      %llu bytes (prompt %llu bytes)\n", (unsigned long long)res->sent_bytes,
            (unsigned long long)res->prompt_bytes_sent);
    fprintf(f, "received  %llu bytes\n", (unsigned long long)res->received_bytes);
    fprintf(f, "memory    weights %.2f MB, KV %.2f MB\n", (double)res->weights_bytes / 1e6,
            (double)res->kv_bytes / 1e6);
    if (res->have_plan) {
        char t[4][32]; /* an unpriced total (recomputation not allowed) prints as "unpriced" */
        fprintf(f, "plan      T %s, bound %s, cloud-only %s, recompute-all %s, split %u\n",
                kvedge_plan_ms_text(res->plan.total_us, 2, t[0], sizeof t[0]),
                kvedge_plan_ms_text(res->plan.bound_us, 2, t[1], sizeof t[1]),
                kvedge_plan_ms_text(res->plan.cloud_only_us, 2, t[2], sizeof t[2]),
                kvedge_plan_ms_text(res->plan.recompute_all_us, 2, t[3], sizeof t[3]),
                res->plan.split);
    }
}
