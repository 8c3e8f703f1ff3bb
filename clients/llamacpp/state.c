/* llama.cpp's sequence state to and from kvedge's K/V layout (state.h). */
#include "clients/llamacpp/state.h"

#include <string.h>

#include "access/codec/error.h"
#include "access/codec/half.h"

int kvedge_llamacpp_layout_check(const kvedge_llamacpp_layout_t *l)
{
    if (!l || l->layers == 0 || l->layers > KVEDGE_LLAMACPP_MAX_LAYERS || l->kv_heads == 0 ||
        l->kv_heads > 1024 || l->head_dim == 0 || l->head_dim % 2 ||
        l->head_dim > KVEDGE_LLAMACPP_MAX_HEAD_DIM || l->n_stream == 0 ||
        l->n_stream > KVEDGE_LLAMACPP_MAX_STREAMS)
        return KVEDGE_EINVAL;
    if (l->type != KVEDGE_LLAMACPP_F32 && l->type != KVEDGE_LLAMACPP_F16)
        return KVEDGE_EINVAL;
    return KVEDGE_OK;
}

static size_t s_elem(int type)
{
    return type == KVEDGE_LLAMACPP_F32 ? 4 : 2;
}

size_t kvedge_llamacpp_state_bytes(const kvedge_llamacpp_layout_t *l, uint32_t n)
{
    if (kvedge_llamacpp_layout_check(l) != KVEDGE_OK || n == 0 || n > KVEDGE_LLAMACPP_MAX_CELLS)
        return 0;
    const size_t row = (size_t)l->kv_heads * l->head_dim * s_elem(l->type);
    size_t b = 12 + 4 * (size_t)l->n_stream; /* magic, seq, n_stream, a count per stream */
    b += 12 * (size_t)n;                     /* pos, n_seq_id, seq per cell */
    b += 8;                                  /* v_trans, n_layer */
    b += l->layers * (12 + n * row);         /* K: type, row bytes, rows */
    b += l->layers * (12 + n * row); /* V: type and row bytes, or type, element bytes, width */
    return b;
}

/* llama.cpp's K channel c of a head is Hugging Face's channel s_hf(c). */
static uint32_t s_hf(const kvedge_llamacpp_layout_t *l, uint32_t c)
{
    return l->permuted ? (c % 2) * (l->head_dim / 2) + c / 2 : c;
}

static void s_put(uint8_t **p, const void *x, size_t n)
{
    memcpy(*p, x, n);
    *p += n;
}

static void s_put_el(uint8_t **p, int type, float f)
{
    if (type == KVEDGE_LLAMACPP_F32) {
        s_put(p, &f, 4);
    } else {
        uint16_t h = kvedge_f32_to_fp16(f);
        s_put(p, &h, 2);
    }
}

int kvedge_llamacpp_state_write(const kvedge_llamacpp_layout_t *l, int32_t seq, int32_t pos0,
                                uint32_t n, const float *k, const float *v, uint8_t *out,
                                size_t cap, size_t *len)
{
    if (kvedge_llamacpp_layout_check(l) != KVEDGE_OK || !k || !v || !out || !len || seq < 0 ||
        pos0 < 0 || n == 0 || n > KVEDGE_LLAMACPP_MAX_CELLS || (uint64_t)pos0 + n > INT32_MAX)
        return KVEDGE_EINVAL;
    const size_t need = kvedge_llamacpp_state_bytes(l, n);
    if (cap < need)
        return KVEDGE_ENOSPACE;
    const uint32_t kvh = l->kv_heads, hd = l->head_dim, E = kvh * hd;
    const uint32_t magic = KVEDGE_LLAMACPP_STATE_MAGIC, one = 1, zero = 0;
    const size_t es = s_elem(l->type);
    uint8_t *p = out;
    s_put(&p, &magic, 4);
    s_put(&p, &seq, 4);
    s_put(&p, &l->n_stream, 4);
    /* Stream 0 holds the cells; llama.cpp reads them into the sequence's own stream. */
    s_put(&p, &n, 4);
    for (uint32_t t = 0; t < n; t++) {
        int32_t pos = pos0 + (int32_t)t;
        s_put(&p, &pos, 4);
        s_put(&p, &one, 4);
        s_put(&p, &seq, 4);
    }
    const uint32_t v_trans = l->v_trans ? 1 : 0;
    s_put(&p, &v_trans, 4);
    s_put(&p, &l->layers, 4);
    const uint64_t row = (uint64_t)E * es;
    for (uint32_t L = 0; L < l->layers; L++) {
        s_put(&p, &l->type, 4);
        s_put(&p, &row, 8);
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t h = 0; h < kvh; h++) {
                const float *src = k + (((size_t)L * kvh + h) * n + t) * hd;
                for (uint32_t c = 0; c < hd; c++)
                    s_put_el(&p, l->type, src[s_hf(l, c)]);
            }
    }
    for (uint32_t L = 0; L < l->layers; L++) {
        s_put(&p, &l->type, 4);
        if (!l->v_trans) {
            s_put(&p, &row, 8);
            for (uint32_t t = 0; t < n; t++)
                for (uint32_t h = 0; h < kvh; h++) {
                    const float *src = v + (((size_t)L * kvh + h) * n + t) * hd;
                    for (uint32_t c = 0; c < hd; c++)
                        s_put_el(&p, l->type, src[c]);
                }
        } else {
            const uint32_t el = (uint32_t)es;
            s_put(&p, &el, 4);
            s_put(&p, &E, 4);
            for (uint32_t h = 0; h < kvh; h++)
                for (uint32_t c = 0; c < hd; c++) {
                    const float *src = v + ((size_t)L * kvh + h) * n * hd + c;
                    for (uint32_t t = 0; t < n; t++)
                        s_put_el(&p, l->type, src[(size_t)t * hd]);
                }
        }
    }
    for (uint32_t s = 1; s < l->n_stream; s++)
        s_put(&p, &zero, 4);
    *len = (size_t)(p - out);
    return *len == need ? KVEDGE_OK : KVEDGE_EINVAL;
}

/* A bounded reader over a blob. */
typedef struct {
    const uint8_t *p, *end;
} s_rd_t;

static bool s_get(s_rd_t *r, void *x, size_t n)
{
    if ((size_t)(r->end - r->p) < n)
        return false;
    memcpy(x, r->p, n);
    r->p += n;
    return true;
}

static bool s_skip(s_rd_t *r, uint64_t n)
{
    if ((uint64_t)(r->end - r->p) < n)
        return false;
    r->p += n;
    return true;
}

/* Header and cells of the one stream that holds the sequence; leaves r at its layer data
 * (or at the end of an empty state). *after gets the streams that follow it. */
static int s_head(s_rd_t *r, kvedge_llamacpp_state_info_t *o, uint32_t *after)
{
    uint32_t magic, n_stream;
    memset(o, 0, sizeof *o);
    if (!s_get(r, &magic, 4))
        return KVEDGE_ECORRUPT;
    if (magic != KVEDGE_LLAMACPP_STATE_MAGIC)
        return KVEDGE_EVERSION;
    if (!s_get(r, &o->seq, 4) || !s_get(r, &n_stream, 4) || o->seq < 0)
        return KVEDGE_ECORRUPT; /* llama.cpp's sequence ids are never negative */
    if (n_stream == 0 || n_stream > KVEDGE_LLAMACPP_MAX_STREAMS)
        return KVEDGE_ECORRUPT;
    o->n_stream = n_stream;
    *after = 0;
    for (uint32_t s = 0; s < n_stream; s++) {
        uint32_t cells;
        if (!s_get(r, &cells, 4))
            return KVEDGE_ECORRUPT;
        if (cells == 0)
            continue;
        if (cells > KVEDGE_LLAMACPP_MAX_CELLS)
            return KVEDGE_ECORRUPT;
        o->cells = cells;
        o->contiguous = true;
        /* Each cell: pos, n_seq_id, then its ids; a layout with per-cell extras (M-RoPE, the
         * n-gram hash) puts 12 more bytes between them, which shows as n_seq_id != 1. */
        for (uint32_t i = 0; i < cells; i++) {
            int32_t pos, id;
            uint32_t n_id;
            if (!s_get(r, &pos, 4) || !s_get(r, &n_id, 4))
                return KVEDGE_ECORRUPT;
            if (n_id != 1)
                return KVEDGE_EVERSION;
            if (!s_get(r, &id, 4))
                return KVEDGE_ECORRUPT;
            if (pos < 0)
                return KVEDGE_ECORRUPT; /* a cached position is never negative */
            if (i == 0)
                o->pos0 = pos;
            else if ((int64_t)pos != (int64_t)o->pos0 + i)
                o->contiguous = false;
        }
        uint32_t v_trans;
        if (!s_get(r, &v_trans, 4) || !s_get(r, &o->layers, 4) || v_trans > 1)
            return KVEDGE_ECORRUPT;
        if (o->layers == 0 || o->layers > KVEDGE_LLAMACPP_MAX_LAYERS)
            return KVEDGE_ECORRUPT;
        o->v_trans = v_trans == 1;
        int32_t type;
        uint64_t row;
        const uint8_t *mark = r->p;
        if (!s_get(r, &type, 4) || !s_get(r, &row, 8))
            return KVEDGE_ECORRUPT;
        r->p = mark;
        o->type = type;
        o->k_row = row > UINT32_MAX ? UINT32_MAX : (uint32_t)row;
        *after = n_stream - s - 1;
        return KVEDGE_OK;
    }
    return KVEDGE_OK;
}

int kvedge_llamacpp_state_info(const uint8_t *buf, size_t len, kvedge_llamacpp_state_info_t *out)
{
    if (!buf || !out)
        return KVEDGE_EINVAL;
    s_rd_t r = {buf, buf + len};
    uint32_t after;
    return s_head(&r, out, &after);
}

static float s_get_el(const uint8_t *p, int type)
{
    if (type == KVEDGE_LLAMACPP_F32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return kvedge_fp16_to_f32(h);
}

int kvedge_llamacpp_state_read(const kvedge_llamacpp_layout_t *l, const uint8_t *buf, size_t len,
                               float *k, float *v, uint32_t cap_tokens, uint32_t *n, int32_t *pos0)
{
    if (kvedge_llamacpp_layout_check(l) != KVEDGE_OK || !buf || !k || !v || !n || !pos0)
        return KVEDGE_EINVAL;
    s_rd_t r = {buf, buf + len};
    kvedge_llamacpp_state_info_t o;
    uint32_t after = 0;
    int rc = s_head(&r, &o, &after);
    if (rc != KVEDGE_OK)
        return rc;
    if (o.cells == 0) {
        *n = 0;
        *pos0 = 0;
        return r.p == r.end ? KVEDGE_OK : KVEDGE_ECORRUPT;
    }
    if (o.layers != l->layers || o.v_trans != l->v_trans || !o.contiguous)
        return KVEDGE_ESHAPE;
    if (o.cells > cap_tokens)
        return KVEDGE_ENOSPACE;
    const uint32_t kvh = l->kv_heads, hd = l->head_dim, E = kvh * hd, cells = o.cells;
    const size_t es = s_elem(l->type);
    const uint64_t row = (uint64_t)E * es;
    for (uint32_t L = 0; L < l->layers; L++) {
        int32_t type;
        uint64_t row_in;
        if (!s_get(&r, &type, 4) || !s_get(&r, &row_in, 8))
            return KVEDGE_ECORRUPT;
        if (type != l->type || row_in != row)
            return KVEDGE_ESHAPE;
        const uint8_t *p = r.p;
        if (!s_skip(&r, row * cells))
            return KVEDGE_ECORRUPT;
        for (uint32_t t = 0; t < cells; t++)
            for (uint32_t h = 0; h < kvh; h++) {
                float *dst = k + (((size_t)L * kvh + h) * cells + t) * hd;
                for (uint32_t c = 0; c < hd; c++, p += es)
                    dst[s_hf(l, c)] = s_get_el(p, l->type);
            }
    }
    for (uint32_t L = 0; L < l->layers; L++) {
        int32_t type;
        if (!s_get(&r, &type, 4))
            return KVEDGE_ECORRUPT;
        if (type != l->type)
            return KVEDGE_ESHAPE;
        if (!l->v_trans) {
            uint64_t row_in;
            if (!s_get(&r, &row_in, 8))
                return KVEDGE_ECORRUPT;
            if (row_in != row)
                return KVEDGE_ESHAPE;
            const uint8_t *p = r.p;
            if (!s_skip(&r, row * cells))
                return KVEDGE_ECORRUPT;
            for (uint32_t t = 0; t < cells; t++)
                for (uint32_t h = 0; h < kvh; h++) {
                    float *dst = v + (((size_t)L * kvh + h) * cells + t) * hd;
                    for (uint32_t c = 0; c < hd; c++, p += es)
                        dst[c] = s_get_el(p, l->type);
                }
        } else {
            uint32_t el, e_in;
            if (!s_get(&r, &el, 4) || !s_get(&r, &e_in, 4))
                return KVEDGE_ECORRUPT;
            if (el != es || e_in != E)
                return KVEDGE_ESHAPE;
            const uint8_t *p = r.p;
            if (!s_skip(&r, (uint64_t)E * cells * es))
                return KVEDGE_ECORRUPT;
            for (uint32_t h = 0; h < kvh; h++)
                for (uint32_t c = 0; c < hd; c++) {
                    float *dst = v + ((size_t)L * kvh + h) * cells * hd + c;
                    for (uint32_t t = 0; t < cells; t++, p += es)
                        dst[(size_t)t * hd] = s_get_el(p, l->type);
                }
        }
    }
    /* The streams after the sequence's: empty, and nothing after them. */
    for (uint32_t s = 0; s < after; s++) {
        uint32_t c;
        if (!s_get(&r, &c, 4) || c != 0)
            return KVEDGE_ECORRUPT;
    }
    if (r.p != r.end)
        return KVEDGE_ECORRUPT;
    *n = cells;
    *pos0 = o.pos0;
    return KVEDGE_OK;
}
