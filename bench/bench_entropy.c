/* Entropy coding of quantized blocks: on real K/V of the trained models (both pairs), the bytes
 * of each block at int8, int4-g32 and int4-g32+think-50 under lz4, zstd (with and without a
 * dictionary trained on other blocks) and htscodecs' rANS at order 0 and 1, with and without
 * the byte-striped params and unpacked int4 codes of access/codec/ecbody.h, and with
 * channel-major codes and a token delta (measured here only),
 * relative to the int8 block as stored plain; then encode/decode MB/s per core of each against
 * a memcpy of the same bytes. Last, the tc rung: each lossless block transcoded to tc as a node
 * derives it (kvedge_block_transcode_at, against the model's committed coding basis
 * models/kjv/.../basis.kvb), its bytes relative to int8's, and its decode (kvedge_block_decode
 * to fp16) per core against a memcpy of the fp16 K/V it gives and against a 1 Gbit/s link. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <htscodecs/rANS_static4x16.h>
#include <lz4.h>
#include <zdict.h>
#include <zstd.h>

#include "access/codec/basis.h"
#include "access/codec/block.h"
#include "access/codec/ecbody.h"
#include "access/codec/error.h"
#include "access/codec/prec.h"
#include "access/codec/quant.h"
#include "bench/bench_common.h"
#include "bench/bench_kjv.h"
#include "clients/decoder/decoder.h"

#define S_CHUNK_TOKENS   256
#define S_PREFILL_TOKENS 512
#define S_PREFILLS       4
#define S_MODELS         BENCH_KJV_MODELS
#define S_RUNGS          3
#define S_DICT_BYTES     (16u << 10)
#define S_REPS           KVEDGE_BENCH_REPS_MIN

/* A link to price the tc decode against: 1 Gbit/s, in MB/s. */
#define S_LINK_MBPS 125.0

static const char *s_models_root = "models";
static const kvedge_prec_t s_rungs[S_RUNGS] = {
    KVEDGE_PREC_INT8, KVEDGE_PREC_INT4_G32,
    KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, KVEDGE_PREC_THINK_50)};

/* One block at one rung: its raw body and the shape its sections follow. */
typedef struct {
    uint8_t *raw;
    size_t raw_len;
    size_t overhead; /* header, mask and checksum bytes of the block */
    uint32_t chunk;  /* which chunk it came from: dictionaries train on the other parity */
    kvedge_ec_shape_t shape;
} s_blk_t;

typedef struct {
    s_blk_t *b;
    size_t n, cap;
} s_set_t;

/* The tc blocks of one model, in the order of its int8 blocks. */
typedef struct {
    uint8_t **blk;
    size_t *len;
    size_t n, cap;
} s_tc_set_t;

static void s_tc_add(s_tc_set_t *s, uint8_t *blk, size_t len)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->blk = realloc(s->blk, s->cap * sizeof *s->blk);
        s->len = realloc(s->len, s->cap * sizeof *s->len);
        if (!s->blk || !s->len)
            exit(1);
    }
    s->blk[s->n] = blk;
    s->len[s->n++] = len;
}

/* Loads and registers a model's coding basis; returns its model id. */
static const char *s_load_basis(int model)
{
    kvedge_basis_t *b = bench_kjv_basis("bench_entropy", s_models_root, model);
    uint64_t id = kvedge_basis_id(b);
    KVEDGE_BENCH_CHECK(kvedge_basis_register(&b));
    return kvedge_basis_model(kvedge_basis_find(id));
}

/* The methods compared, in print order. */
enum {
    M_PLAIN,
    M_LZ4,
    M_ZSTD3,
    M_ZSTD19,
    M_ZSTD3_DICT,
    M_ZSTD19_DICT,
    M_R_O0,
    M_R_O1,
    M_R_O0_STRIPE,
    M_R_O1_UNPACK,
    M_L_COLS_O1,
    M_L_DELTA,
    M_R_X32,
    M_EC,
    M_COUNT
};
static const char *const s_method_names[M_COUNT] = {
    "plain",
    "lz4 (when it pays)",
    "zstd -3",
    "zstd -19",
    "zstd -3 +dict",
    "zstd -19 +dict",
    "rANS o0, sections as stored",
    "rANS o1, sections as stored",
    "rANS o0, params striped",
    "rANS o0 params striped, o1 codes (int4 one per byte)",
    "rANS o0 params striped, o1 codes channel-major",
    "rANS o0 params striped, o0 codes channel-major + token delta",
    "ec default with 32-way (X32) code streams",
    "**ec (default): o0, params striped, int4 codes one per byte**"};

static void s_add(s_set_t *s, s_blk_t b)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->b = realloc(s->b, s->cap * sizeof *s->b);
        if (!s->b)
            exit(1);
    }
    s->b[s->n++] = b;
}

/* The shape of a block's sections, from its info and its plain body. */
static void s_shape(const kvedge_block_info_t *in, kvedge_ec_shape_t *s)
{
    kvedge_block_sections_t sec;
    kvedge_block_sections(in, in->body, &sec);
    s->tokens = in->tokens;
    s->key_channels = in->key_channels;
    s->head_dim = in->head_dim;
    s->bits = in->scheme == KVEDGE_SCHEME_INT8 ? 8 : 4;
    s->len[0] = (size_t)((const uint8_t *)sec.v_params - in->body);
    s->len[1] = (size_t)(sec.k_codes - (const uint8_t *)sec.v_params);
    s->len[2] = (size_t)(sec.v_codes - sec.k_codes);
    s->len[3] = in->raw_len - s->len[0] - s->len[1] - s->len[2];
}

/* Prefills S_PREFILLS windows of the held-out text and adds every (layer, head, chunk) block at
 * each rung to sets[rung]. */
static void s_collect(int model, const int32_t *ids, size_t n_ids, s_set_t *sets, s_tc_set_t *tc)
{
    const char *model_id = s_load_basis(model);
    kvedge_decoder_t *m = bench_kjv_decoder("bench_entropy", s_models_root, model);
    const kvedge_decoder_config_t *c = kvedge_decoder_config(m);
    const uint32_t L = c->layers, H = kvedge_decoder_kv_heads(m), D = c->head_dim;
    const size_t per_layer = kvedge_decoder_kv_floats(m, S_PREFILL_TOKENS);
    float *k = bench_alloc(L * per_layer * sizeof *k), *v = bench_alloc(L * per_layer * sizeof *v);
    uint16_t *k16 = bench_alloc((size_t)S_CHUNK_TOKENS * D * 2);
    uint16_t *v16 = bench_alloc((size_t)S_CHUNK_TOKENS * D * 2);
    for (uint32_t p = 0; p < S_PREFILLS; p++) {
        size_t off = (size_t)p * (n_ids / S_PREFILLS);
        if (off + S_PREFILL_TOKENS > n_ids) {
            fprintf(stderr, "bench_entropy: held-out text too short\n");
            exit(1);
        }
        KVEDGE_BENCH_CHECK(kvedge_decoder_prefill(m, ids + off, S_PREFILL_TOKENS, NULL, k, v));
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t h = 0; h < H; h++)
                for (uint32_t ch = 0; ch < S_PREFILL_TOKENS / S_CHUNK_TOKENS; ch++) {
                    size_t at = l * per_layer +
                                ((size_t)h * S_PREFILL_TOKENS + (size_t)ch * S_CHUNK_TOKENS) * D;
                    kvedge_convert_from_f32(KVEDGE_DTYPE_FP16, k + at, (size_t)S_CHUNK_TOKENS * D,
                                            k16);
                    kvedge_convert_from_f32(KVEDGE_DTYPE_FP16, v + at, (size_t)S_CHUNK_TOKENS * D,
                                            v16);
                    kvedge_block_spec_t spec = {.dtype = KVEDGE_DTYPE_FP16,
                                                .scheme = KVEDGE_SCHEME_LOSSLESS,
                                                .tokens = S_CHUNK_TOKENS,
                                                .head_dim = (uint16_t)D};
                    size_t cap = kvedge_block_encoded_bound(&spec), len;
                    uint8_t *blk = bench_alloc(cap);
                    KVEDGE_BENCH_CHECK(kvedge_block_encode(&spec, k16, v16, blk, cap, &len));
                    kvedge_block_info_t info;
                    KVEDGE_BENCH_CHECK(kvedge_block_parse(blk, len, &info));
                    for (int r = 0; r < S_RUNGS; r++) {
                        uint8_t *q;
                        size_t qlen;
                        KVEDGE_BENCH_CHECK(
                            kvedge_block_transcode(&info, s_rungs[r], false, &q, &qlen));
                        kvedge_block_info_t qi;
                        KVEDGE_BENCH_CHECK(kvedge_block_parse(q, qlen, &qi));
                        s_blk_t b = {.raw_len = qi.raw_len,
                                     .overhead = qlen - qi.raw_len,
                                     .chunk = p * 2 + ch};
                        b.raw = bench_alloc(qi.raw_len);
                        memcpy(b.raw, qi.body, qi.raw_len);
                        s_shape(&qi, &b.shape);
                        s_add(&sets[r], b);
                        free(q);
                    }
                    uint8_t *t;
                    size_t tlen;
                    KVEDGE_BENCH_CHECK(kvedge_block_transcode_at(&info, KVEDGE_PREC_TC, false,
                                                                 model_id, l, h, &t, &tlen));
                    s_tc_add(tc, t, tlen);
                    free(blk);
                }
    }
    free(k);
    free(v);
    free(k16);
    free(v16);
    kvedge_decoder_destroy(&m);
}

static void s_choice(int method, unsigned bits, kvedge_ec_choice_t *c)
{
    kvedge_ec_choice_default(c, bits);
    const int stripe = RANS_ORDER_STRIPE | (2 << 8);
    for (int i = 0; i < KVEDGE_EC_SECTIONS; i++) {
        const bool code = i >= 2;
        switch (method) {
        case M_R_O0:
        case M_R_O1:
            c->xf[i] = KVEDGE_EC_XF_NONE;
            c->order[i] = method == M_R_O1 ? KVEDGE_EC_ORDER1 : KVEDGE_EC_ORDER0;
            break;
        case M_R_O0_STRIPE:
            c->xf[i] = KVEDGE_EC_XF_NONE;
            c->order[i] = code ? KVEDGE_EC_ORDER0 : stripe;
            break;
        case M_R_O1_UNPACK:
            if (code)
                c->order[i] = KVEDGE_EC_ORDER1;
            break;
        case M_R_X32:
            if (code)
                c->order[i] |= RANS_ORDER_X32;
            break;
        default:
            break;
        }
    }
}

/* Bytes of a body coded as ec's default but with the codes channel-major, one per byte
 * ([channels][tokens]), coded at order 1 (the previous token's code of the same channel as
 * context) or, with delta, replaced by their differences along tokens (mod 2^bits) at order 0:
 * the channel-wise layout and the token-delta prediction, measured here only. */
static size_t s_local_size(const s_blk_t *b, bool delta, uint8_t *tmp)
{
    const kvedge_ec_shape_t *s = &b->shape;
    const uint8_t mask = (uint8_t)((1u << s->bits) - 1u);
    size_t total = 0, off = 0;
    for (int sec = 0; sec < KVEDGE_EC_SECTIONS; sec++) {
        const uint8_t *src = b->raw + off;
        size_t n = s->len[sec];
        int order = RANS_ORDER_STRIPE | (2 << 8);
        if (sec >= 2) {
            const uint32_t T = s->tokens, C = sec == 2 ? s->key_channels : s->head_dim;
            const size_t row = kvedge_quant_row_bytes(C, s->bits);
            for (uint32_t t = 0; t < T; t++)
                for (uint32_t c = 0; c < C; c++) {
                    const uint8_t *r = src + t * row;
                    uint8_t v = s->bits == 8 ? r[c] : (uint8_t)((r[c / 2] >> (c % 2 * 4)) & 15);
                    tmp[(size_t)c * T + t] = v;
                }
            for (uint32_t c = 0; c < C && delta; c++)
                for (uint32_t t = T - 1; t > 0; t--)
                    tmp[(size_t)c * T + t] =
                        (uint8_t)(tmp[(size_t)c * T + t] - tmp[(size_t)c * T + t - 1]) & mask;
            src = tmp;
            n = (size_t)T * C;
            order = delta ? 0 : 1;
        }
        unsigned len = 0;
        uint8_t *z = rans_compress_4x16((unsigned char *)src, (unsigned)n, &len, order);
        free(z);
        total += KVEDGE_EC_RECORD_BYTES + len;
        off += s->len[sec];
    }
    return total;
}

/* Trains a zstd dictionary on the blocks of a set whose chunk parity is `parity`. */
static ZSTD_CDict *s_dict(const s_set_t *s, uint32_t parity, int level, ZSTD_DDict **dd)
{
    size_t total = 0, n = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->b[i].chunk % 2 == parity) {
            total += s->b[i].raw_len;
            n++;
        }
    uint8_t *samples = bench_alloc(total);
    size_t *sizes = bench_alloc(n * sizeof *sizes);
    size_t at = 0, j = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->b[i].chunk % 2 == parity) {
            memcpy(samples + at, s->b[i].raw, s->b[i].raw_len);
            sizes[j++] = s->b[i].raw_len;
            at += s->b[i].raw_len;
        }
    uint8_t *dict = bench_alloc(S_DICT_BYTES);
    size_t dn = ZDICT_trainFromBuffer(dict, S_DICT_BYTES, samples, sizes, (unsigned)n);
    if (ZDICT_isError(dn)) {
        fprintf(stderr, "bench_entropy: ZDICT_trainFromBuffer: %s\n", ZDICT_getErrorName(dn));
        exit(1);
    }
    ZSTD_CDict *cd = ZSTD_createCDict(dict, dn, level);
    if (dd)
        *dd = ZSTD_createDDict(dict, dn);
    free(dict);
    free(samples);
    free(sizes);
    return cd;
}

/* Body bytes of block b under a method (dicts: the CDicts trained on parity 0 and 1). */
static size_t s_size(int method, const s_blk_t *b, ZSTD_CCtx *zc, ZSTD_CDict *const *dicts,
                     uint8_t *buf, size_t cap)
{
    switch (method) {
    case M_PLAIN:
        return b->raw_len;
    case M_LZ4: {
        int n = LZ4_compress_default((const char *)b->raw, (char *)buf, (int)b->raw_len, (int)cap);
        return n > 0 && (size_t)n < b->raw_len ? (size_t)n : b->raw_len;
    }
    case M_ZSTD3:
    case M_ZSTD19:
        return ZSTD_compressCCtx(zc, buf, cap, b->raw, b->raw_len, method == M_ZSTD3 ? 3 : 19);
    case M_ZSTD3_DICT:
    case M_ZSTD19_DICT: /* the dictionary of the other parity: trained on other chunks */
        return ZSTD_compress_usingCDict(zc, buf, cap, b->raw, b->raw_len,
                                        dicts[(method == M_ZSTD19_DICT) * 2 + 1 - b->chunk % 2]);
    case M_L_COLS_O1:
    case M_L_DELTA:
        return s_local_size(b, method == M_L_DELTA, buf);
    default: {
        kvedge_ec_choice_t c;
        s_choice(method, b->shape.bits, &c);
        size_t n = 0;
        KVEDGE_BENCH_CHECK(kvedge_ec_encode(&b->shape, b->raw, &c, buf, cap, &n));
        return n;
    }
    }
}

static void s_sizes(const s_set_t *s, const s_set_t *int8, double med[M_COUNT],
                    double mean_body[M_COUNT])
{
    ZSTD_CCtx *zc = ZSTD_createCCtx();
    ZSTD_CDict *dicts[4] = {s_dict(s, 0, 3, NULL), s_dict(s, 1, 3, NULL), s_dict(s, 0, 19, NULL),
                            s_dict(s, 1, 19, NULL)};
    size_t cap = 0;
    for (size_t i = 0; i < s->n; i++)
        if (ZSTD_compressBound(s->b[i].raw_len) + 1024 > cap)
            cap = ZSTD_compressBound(s->b[i].raw_len) + 1024;
    uint8_t *buf = bench_alloc(cap);
    double *ratio = bench_alloc(s->n * sizeof *ratio);
    for (int m = 0; m < M_COUNT; m++) {
        double sum = 0;
        for (size_t i = 0; i < s->n; i++) {
            size_t body = s_size(m, &s->b[i], zc, dicts, buf, cap);
            if (ZSTD_isError(body)) {
                fprintf(stderr, "bench_entropy: zstd: %s\n", ZSTD_getErrorName(body));
                exit(1);
            }
            const s_blk_t *ref = &int8->b[i];
            ratio[i] = (double)(s->b[i].overhead + body) / (double)(ref->overhead + ref->raw_len);
            sum += (double)body / (double)s->b[i].raw_len;
        }
        med[m] = bench_median(ratio, s->n);
        mean_body[m] = sum / (double)s->n;
    }
    free(ratio);
    free(buf);
    for (int d = 0; d < 4; d++)
        ZSTD_freeCDict(dicts[d]);
    ZSTD_freeCCtx(zc);
}

/* Throughput of one codec over a whole set: encode, decode, and memcpy of the raw bytes. */
enum { T_EC, T_EC_X32, T_EC_O0, T_EC_STRIPE, T_LZ4, T_ZSTD3, T_ZSTD3_DICT, T_COUNT };
static const char *const s_speed_names[T_COUNT] = {"ec (default)",
                                                   "ec, codes X32",
                                                   "rANS o0, sections as stored",
                                                   "rANS o0, params striped",
                                                   "lz4",
                                                   "zstd -3",
                                                   "zstd -3 +dict"};
static const int s_speed_method[T_COUNT] = {M_EC, M_R_X32, M_R_O0, M_R_O0_STRIPE};

static void s_speed(const s_set_t *s, int t, double *enc_mbps, double *dec_mbps,
                    double *memcpy_mbps)
{
    size_t total = 0, cap = 0;
    for (size_t i = 0; i < s->n; i++) {
        total += s->b[i].raw_len;
        if (ZSTD_compressBound(s->b[i].raw_len) + 1024 > cap)
            cap = ZSTD_compressBound(s->b[i].raw_len) + 1024;
    }
    uint8_t *enc = bench_alloc(s->n * cap), *out = bench_alloc(total);
    size_t *len = bench_alloc(s->n * sizeof *len);
    ZSTD_CCtx *zc = ZSTD_createCCtx();
    ZSTD_DCtx *zd = ZSTD_createDCtx();
    ZSTD_DDict *dd[2];
    ZSTD_CDict *cd[2] = {s_dict(s, 0, 3, &dd[0]), s_dict(s, 1, 3, &dd[1])};
    double te[S_REPS], td[S_REPS], tm[S_REPS];
    for (int r = 0; r < S_REPS; r++) {
        double t0 = bench_now_s();
        for (size_t i = 0; i < s->n; i++) {
            const s_blk_t *b = &s->b[i];
            uint8_t *e = enc + i * cap;
            if (t <= T_EC_STRIPE) {
                kvedge_ec_choice_t c;
                s_choice(s_speed_method[t], b->shape.bits, &c);
                KVEDGE_BENCH_CHECK(kvedge_ec_encode(&b->shape, b->raw, &c, e, cap, &len[i]));
            } else if (t == T_LZ4)
                len[i] = (size_t)LZ4_compress_default((const char *)b->raw, (char *)e,
                                                      (int)b->raw_len, (int)cap);
            else if (t == T_ZSTD3)
                len[i] = ZSTD_compressCCtx(zc, e, cap, b->raw, b->raw_len, 3);
            else
                len[i] =
                    ZSTD_compress_usingCDict(zc, e, cap, b->raw, b->raw_len, cd[1 - b->chunk % 2]);
        }
        te[r] = bench_now_s() - t0;
        t0 = bench_now_s();
        size_t at = 0;
        for (size_t i = 0; i < s->n; i++) {
            const s_blk_t *b = &s->b[i];
            const uint8_t *e = enc + i * cap;
            if (t <= T_EC_STRIPE)
                KVEDGE_BENCH_CHECK(kvedge_ec_decode(&b->shape, e, len[i], out + at));
            else if (t == T_LZ4)
                LZ4_decompress_safe((const char *)e, (char *)out + at, (int)len[i],
                                    (int)b->raw_len);
            else if (t == T_ZSTD3)
                ZSTD_decompressDCtx(zd, out + at, b->raw_len, e, len[i]);
            else
                ZSTD_decompress_usingDDict(zd, out + at, b->raw_len, e, len[i],
                                           dd[1 - b->chunk % 2]);
            at += b->raw_len;
        }
        td[r] = bench_now_s() - t0;
        t0 = bench_now_s();
        at = 0;
        for (size_t i = 0; i < s->n; i++) {
            memcpy(out + at, s->b[i].raw, s->b[i].raw_len);
            at += s->b[i].raw_len;
        }
        tm[r] = bench_now_s() - t0;
    }
    /* The last decode pass must have given back every body exactly. */
    size_t at = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (t != T_LZ4 && memcmp(out + at, s->b[i].raw, s->b[i].raw_len) != 0) {
            fprintf(stderr, "bench_entropy: %s did not round-trip block %zu\n", s_speed_names[t],
                    i);
            exit(1);
        }
        at += s->b[i].raw_len;
    }
    *enc_mbps = bench_mbps((double)total, te, S_REPS);
    *dec_mbps = bench_mbps((double)total, td, S_REPS);
    *memcpy_mbps = bench_mbps((double)total, tm, S_REPS);
    for (int d = 0; d < 2; d++) {
        ZSTD_freeCDict(cd[d]);
        ZSTD_freeDDict(dd[d]);
    }
    ZSTD_freeCCtx(zc);
    ZSTD_freeDCtx(zd);
    free(enc);
    free(out);
    free(len);
}

/* The tc table: per model the median of tc's block bytes over int8's, then the decode of every
 * tc block of the four models to fp16 (median of S_REPS passes) against a memcpy of its
 * output. */
static void s_tc_report(const s_tc_set_t *tc, s_set_t sets[S_MODELS][S_RUNGS])
{
    printf("\n## tc (transform-coded, kvedge_block_transcode_at from the lossless block against "
           "the model's basis)\n\n| | OPT cloud | OPT edge | Llama cloud | Llama edge | mean |\n"
           "| --- | --- | --- | --- | --- | --- |\n| block bytes / int8's (median) |");
    double mean = 0;
    size_t n_all = 0, coded = 0, out_bytes = 0, max_out = 0;
    for (int m = 0; m < S_MODELS; m++) {
        double *ratio = bench_alloc(tc[m].n * sizeof *ratio);
        for (size_t i = 0; i < tc[m].n; i++) {
            const s_blk_t *ref = &sets[m][0].b[i];
            ratio[i] = (double)tc[m].len[i] / (double)(ref->overhead + ref->raw_len);
        }
        double med = bench_median(ratio, tc[m].n);
        printf(" %.3f |", med);
        mean += med / S_MODELS;
        n_all += tc[m].n;
        free(ratio);
    }
    printf(" %.3f |\n", mean);
    kvedge_block_info_t *info = bench_alloc(n_all * sizeof *info);
    size_t k = 0;
    for (int m = 0; m < S_MODELS; m++)
        for (size_t i = 0; i < tc[m].n; i++, k++) {
            KVEDGE_BENCH_CHECK(kvedge_block_parse(tc[m].blk[i], tc[m].len[i], &info[k]));
            size_t o = (size_t)info[k].tokens * info[k].head_dim * 2;
            coded += tc[m].len[i];
            out_bytes += 2 * o;
            max_out = o > max_out ? o : max_out;
        }
    uint8_t *ko = bench_alloc(max_out), *vo = bench_alloc(max_out);
    uint8_t *src = bench_alloc(out_bytes), *dst = bench_alloc(out_bytes);
    memset(src, 1, out_bytes);
    double td[S_REPS], tm[S_REPS];
    for (int r = 0; r < S_REPS; r++) {
        double t0 = bench_now_s();
        for (size_t i = 0; i < n_all; i++)
            KVEDGE_BENCH_CHECK(kvedge_block_decode(&info[i], KVEDGE_DTYPE_FP16, ko, vo));
        td[r] = bench_now_s() - t0;
        t0 = bench_now_s();
        memcpy(dst, src, out_bytes);
        tm[r] = bench_now_s() - t0;
    }
    const double out_mbps = bench_mbps((double)out_bytes, td, S_REPS);
    const double in_mbps = bench_mbps((double)coded, td, S_REPS);
    const double cpy_mbps = bench_mbps((double)out_bytes, tm, S_REPS);
    printf("\n| decode per core (all %zu blocks, median of %d passes) | MB/s |\n| --- | --- |\n"
           "| fp16 K/V out | %.1f |\n| coded bytes in | %.1f |\n| memcpy of the fp16 out | %.0f "
           "(%.0fx the decode) |\n| 1 Gbit/s link, coded bytes | %.0f (%.1f cores to keep up) |\n"
           "| decode us per coded byte | %.4f |\n",
           n_all, S_REPS, out_mbps, in_mbps, cpy_mbps, cpy_mbps / out_mbps, S_LINK_MBPS,
           S_LINK_MBPS / in_mbps, 1.0 / in_mbps);
    free(info);
    free(ko);
    free(vo);
    free(src);
    free(dst);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--models") == 0 && i + 1 < argc) {
            s_models_root = argv[++i];
        } else {
            fprintf(stderr, "usage: bench_entropy [--models DIR]\n");
            return 2;
        }
    }
    size_t n_ids;
    int32_t *ids = bench_read_heldout_ids("bench_entropy", s_models_root, &n_ids);
    static s_set_t sets[S_MODELS][S_RUNGS];
    static s_tc_set_t tc[S_MODELS];
    for (int m = 0; m < S_MODELS; m++)
        s_collect(m, ids, n_ids, sets[m], &tc[m]);
    free(ids);

    printf("# bench_entropy: block bytes (header, mask, body, checksum) relative to the same "
           "block at int8 stored plain; median over blocks of %u tokens (%d windows of %u "
           "held-out tokens per model, every layer and K/V head); zstd dictionaries of %u KiB "
           "trained on the blocks of the other chunks\n",
           S_CHUNK_TOKENS, S_PREFILLS, S_PREFILL_TOKENS, S_DICT_BYTES >> 10);
    for (int r = 0; r < S_RUNGS; r++) {
        printf("\n## %s (blocks per model:", kvedge_prec_name(s_rungs[r]));
        for (int m = 0; m < S_MODELS; m++)
            printf(" %zu", sets[m][r].n);
        printf(")\n\n| method |");
        for (int m = 0; m < S_MODELS; m++)
            printf(" %s |", bench_kjv_names[m]);
        printf(" body / raw body (mean, all models) |\n| --- |");
        for (int m = 0; m <= S_MODELS; m++)
            printf(" --- |");
        printf("\n");
        double med[S_MODELS][M_COUNT], body[S_MODELS][M_COUNT];
        for (int m = 0; m < S_MODELS; m++)
            s_sizes(&sets[m][r], &sets[m][0], med[m], body[m]);
        for (int k = 0; k < M_COUNT; k++) {
            printf("| %s |", s_method_names[k]);
            double mean = 0;
            for (int m = 0; m < S_MODELS; m++) {
                printf(" %.3f |", med[m][k]);
                mean += body[m][k] / S_MODELS;
            }
            printf(" %.3f |\n", mean);
        }
    }

    printf("\n## Speed per core (MB/s of raw body; all blocks of the four models; median of %d "
           "passes)\n\n| rung | codec | encode MB/s | decode MB/s | memcpy MB/s | decode time / "
           "memcpy time | decode ns per raw byte |\n| --- | --- | --- | --- | --- | --- | --- |\n",
           S_REPS);
    for (int r = 0; r < S_RUNGS; r++) {
        s_set_t all = {0};
        for (int m = 0; m < S_MODELS; m++)
            for (size_t i = 0; i < sets[m][r].n; i++)
                s_add(&all, sets[m][r].b[i]);
        for (int t = 0; t < T_COUNT; t++) {
            double e, d, c;
            s_speed(&all, t, &e, &d, &c);
            printf("| %s | %s | %.0f | %.0f | %.0f | %.1f | %.2f |\n", kvedge_prec_name(s_rungs[r]),
                   s_speed_names[t], e, d, c, c / d, 1e3 / d);
        }
        free(all.b);
    }
    s_tc_report(tc, sets);
    for (int m = 0; m < S_MODELS; m++) {
        for (size_t i = 0; i < tc[m].n; i++)
            free(tc[m].blk[i]);
        free(tc[m].blk);
        free(tc[m].len);
    }
    for (int m = 0; m < S_MODELS; m++)
        for (int r = 0; r < S_RUNGS; r++) {
            for (size_t i = 0; i < sets[m][r].n; i++)
                free(sets[m][r].b[i].raw);
            free(sets[m][r].b);
        }
    return 0;
}
