/* Transform-coded K/V sections (tcbody.h): a basis projection, one uniform step, rANS codes
 * with escapes, every length bounded by the shape. */
#include "access/codec/tcbody.h"

#include <htscodecs/rANS_static4x16.h>
#include <math.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/byteorder.h"
#include "access/codec/ecbody.h"
#include "access/codec/error.h"
#include "access/codec/half.h"
#include "access/codec/quant.h"

#define S_MAX_TOKENS 65536u
#define S_MAX_DIM    1024u

static bool s_shape_ok(const kvedge_tc_shape_t *s)
{
    return s && s->tokens >= 1 && s->tokens <= S_MAX_TOKENS && s->dim >= 1 && s->dim <= S_MAX_DIM;
}

size_t kvedge_tc_bound(const kvedge_tc_shape_t *s)
{
    if (!s_shape_ok(s))
        return 0;
    const size_t n = (size_t)s->tokens * s->dim;
    return KVEDGE_TC_HEAD_BYTES + 2u * s->dim + 4u +
           rans_compress_bound_4x16((unsigned)n, KVEDGE_EC_ORDER1) + 4u + 2u * n;
}

static uint32_t s_zigzag(int32_t q)
{
    return q >= 0 ? 2u * (uint32_t)q : 2u * (uint32_t)(-(int64_t)q) - 1u;
}

static int32_t s_unzigzag(uint32_t z)
{
    return (z & 1u) ? -(int32_t)((z + 1u) / 2u) : (int32_t)(z / 2u);
}

/* Channels (or components) the vector loops take at a time: four vectors of eight. */
#define S_LANES 32u
/* Eight floats: element-wise mul and add, the same IEEE operations as the scalar loop. */
typedef float s_v8 __attribute__((vector_size(32), aligned(4), may_alias));

/* The codes of tokens xt[0..nt) (nt 1 or 2; two in flight hide the add latency of each one's
 * chain): y[j] = sum over c of (x[c] - m[c]) * fwd[c][j], summed in channel order with a mul
 * then an add per term (the codec builds with -ffp-contract=off), so the vector loops over j
 * (32 components in registers, eight wide in the AVX2 copy below) give the bits of a scalar dot
 * product per component; q = floor(y / step + 0.5). Returns 1 + the last component with a
 * non-zero code (0 for none), or -1 for a code over KVEDGE_TC_CODE_MAX or not finite. */
static inline __attribute__((always_inline)) int64_t s_project_body(uint32_t D, uint32_t nt,
                                                                    const float *xt, const float *m,
                                                                    const float *fwd,
                                                                    float inv_step, int32_t *qt)
{
    float d[2][S_MAX_DIM], y[2][S_MAX_DIM];
    for (uint32_t t = 0; t < nt; t++)
        for (uint32_t c = 0; c < D; c++)
            d[t][c] = xt[(size_t)t * D + c] - m[c];
    uint32_t j0 = 0;
    for (; j0 + S_LANES <= D; j0 += S_LANES) {
        const s_v8 zero = {0};
        s_v8 a0 = zero, a1 = zero, a2 = zero, a3 = zero, b0 = zero, b1 = zero, b2 = zero, b3 = zero;
        for (uint32_t c = 0; c < D; c++) {
            const s_v8 *row = (const s_v8 *)(fwd + (size_t)c * D + j0);
            const s_v8 r0 = row[0], r1 = row[1], r2 = row[2], r3 = row[3];
            const float d0 = d[0][c];
            a0 += d0 * r0;
            a1 += d0 * r1;
            a2 += d0 * r2;
            a3 += d0 * r3;
            if (nt == 2) {
                const float d1 = d[1][c];
                b0 += d1 * r0;
                b1 += d1 * r1;
                b2 += d1 * r2;
                b3 += d1 * r3;
            }
        }
        s_v8 *ya = (s_v8 *)(y[0] + j0), *yb = (s_v8 *)(y[1] + j0);
        ya[0] = a0;
        ya[1] = a1;
        ya[2] = a2;
        ya[3] = a3;
        yb[0] = b0;
        yb[1] = b1;
        yb[2] = b2;
        yb[3] = b3;
    }
    for (uint32_t t = 0; t < nt; t++)
        for (uint32_t j = j0; j < D; j++) {
            float acc = 0.0f;
            for (uint32_t c = 0; c < D; c++)
                acc += d[t][c] * fwd[(size_t)c * D + j];
            y[t][j] = acc;
        }
    int64_t r = 0;
    for (uint32_t t = 0; t < nt; t++) {
        int bad = 0; /* branch-free, so the loop vectorizes */
        int32_t *q = qt + (size_t)t * D;
        for (uint32_t j = 0; j < D; j++) {
            const float v = floorf(y[t][j] * inv_step + 0.5f);
            bad |= !(fabsf(v) <= (float)KVEDGE_TC_CODE_MAX); /* also NaN */
            q[j] = bad ? 0 : (int32_t)v;
        }
        if (bad)
            return -1;
        uint32_t last = D;
        while (last > 0 && q[last - 1] == 0)
            last--;
        if (last > r)
            r = last;
    }
    return r;
}

static int64_t s_project(uint32_t D, uint32_t nt, const float *xt, const float *m, const float *fwd,
                         float inv_step, int32_t *qt)
{
    return s_project_body(D, nt, xt, m, fwd, inv_step, qt);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) static int64_t s_project_avx2(uint32_t D, uint32_t nt,
                                                              const float *xt, const float *m,
                                                              const float *fwd, float inv_step,
                                                              int32_t *qt)
{
    return s_project_body(D, nt, xt, m, fwd, inv_step, qt);
}
#else
#define s_project_avx2 s_project
#endif

/* The fp16 channel means and the codes q [T][D] of x; *rank the components coded. simd picks
 * the AVX2 projection (the same bits). */
static int s_quantize(const kvedge_tc_shape_t *s, const float *x, const float *fwd, float step,
                      bool simd, uint16_t *m16, float *m, int32_t *q, uint32_t *rank)
{
    const uint32_t T = s->tokens, D = s->dim;
    double *sum = calloc(D, sizeof *sum);
    if (!sum)
        return KVEDGE_ENOMEM;
    for (uint32_t t = 0; t < T; t++)     /* per channel, in token order: the same sums as one */
        for (uint32_t c = 0; c < D; c++) /* channel at a time, row by row in memory */
            sum[c] += x[(size_t)t * D + c];
    int rc = KVEDGE_OK;
    for (uint32_t c = 0; c < D && rc == KVEDGE_OK; c++) {
        m16[c] = kvedge_f32_to_fp16((float)(sum[c] / T));
        m[c] = kvedge_fp16_to_f32(m16[c]);
        if (!isfinite(m[c]))
            rc = KVEDGE_EINVAL;
    }
    free(sum);
    const float inv_step = 1.0f / step;
    int64_t r = 0;
    for (uint32_t t = 0; t < T && rc == KVEDGE_OK; t += 2) {
        const float *xt = x + (size_t)t * D;
        int32_t *qt = q + (size_t)t * D;
        const uint32_t nt = T - t >= 2 ? 2 : 1;
        const int64_t rt = simd ? s_project_avx2(D, nt, xt, m, fwd, inv_step, qt)
                                : s_project(D, nt, xt, m, fwd, inv_step, qt);
        if (rt < 0)
            rc = KVEDGE_EINVAL;
        else if (rt > r)
            r = rt;
    }
    *rank = (uint32_t)r;
    return rc;
}

/* Symbols of the first `rank` components in a layout (BANDS: component-major, as COMPONENT);
 * the escaped codes in symbol order (esc may be NULL). Returns the escape count. */
static size_t s_symbols(const kvedge_tc_shape_t *s, const int32_t *q, uint32_t rank, int layout,
                        uint8_t *sym, int16_t *esc)
{
    const uint32_t T = s->tokens, D = s->dim;
    size_t k = 0, e = 0;
    const bool tm = layout == KVEDGE_TC_LAYOUT_TOKEN;
    const uint32_t outer = tm ? T : rank, inner = tm ? rank : T;
    for (uint32_t a = 0; a < outer; a++)
        for (uint32_t b = 0; b < inner; b++) {
            const int32_t v = tm ? q[(size_t)a * D + b] : q[(size_t)b * D + a];
            const uint32_t z = s_zigzag(v);
            if (z >= KVEDGE_TC_ESCAPE) {
                sym[k++] = (uint8_t)KVEDGE_TC_ESCAPE;
                if (esc)
                    esc[e] = (int16_t)v;
                e++;
            } else {
                sym[k++] = (uint8_t)z;
            }
        }
    return e;
}

/* The streams of a layout: their symbol counts in n[] (at most KVEDGE_TC_MAX_STREAMS); returns
 * how many. BANDS cuts the components [0, rank) at D/8, D/4 and D/2 (empty bands dropped). */
static int s_streams(const kvedge_tc_shape_t *s, uint32_t rank, int layout, size_t *n)
{
    if (layout != KVEDGE_TC_LAYOUT_BANDS) {
        n[0] = (size_t)s->tokens * rank;
        return 1;
    }
    const uint32_t D = s->dim;
    const uint32_t cut[KVEDGE_TC_MAX_STREAMS + 1] = {0, D / 8, D / 4, D / 2, D};
    int k = 0;
    for (int b = 0; b < KVEDGE_TC_MAX_STREAMS; b++) {
        const uint32_t lo = cut[b] < rank ? cut[b] : rank,
                       hi = cut[b + 1] < rank ? cut[b + 1] : rank;
        if (hi > lo)
            n[k++] = (size_t)s->tokens * (hi - lo);
    }
    return k;
}

/* One rANS stream of sym[0..n) at `order` into dst (capacity cap); *len its bytes. Codes into
 * scratch (rans_compress_bound_4x16 bytes) when cap is under the library's bound, and refuses
 * with KVEDGE_ENOSPACE when the result does not fit. */
static int s_rans(const uint8_t *sym, size_t n, int order, uint8_t *dst, size_t cap,
                  uint8_t *scratch, unsigned *len)
{
    const unsigned bound = rans_compress_bound_4x16((unsigned)n, order);
    uint8_t *to = cap >= bound ? dst : scratch;
    unsigned got = bound;
    if (!rans_compress_to_4x16((unsigned char *)sym, (unsigned)n, to, &got, order) || got > bound)
        return KVEDGE_ENOMEM;
    if (got > cap)
        return KVEDGE_ENOSPACE;
    if (to != dst)
        memcpy(dst, to, got);
    *len = got;
    return KVEDGE_OK;
}

/* Writes a layout's streams (4-byte length, then the stream) at out + *pos, each at its order
 * in order[] or, where order[i] < 0, at the smaller of orders 0 and 1 (0 on a tie). */
static int s_write_streams(const kvedge_tc_shape_t *s, uint32_t rank, int layout,
                           const uint8_t *sym, const int *order, uint8_t *out, size_t cap,
                           uint8_t *scratch, uint8_t *alt, size_t *pos)
{
    size_t n[KVEDGE_TC_MAX_STREAMS], off = 0;
    const int k = s_streams(s, rank, layout, n);
    for (int i = 0; i < k; off += n[i], i++) {
        if (cap - *pos < 4u)
            return KVEDGE_ENOSPACE;
        uint8_t *dst = out + *pos + 4;
        const size_t room = cap - *pos - 4;
        const bool both = order[i] < 0;
        unsigned len = 0, len1 = 0;
        int rc = KVEDGE_OK;
        bool have = false;
        if (both || order[i] == KVEDGE_EC_ORDER0) {
            rc = s_rans(sym + off, n[i], KVEDGE_EC_ORDER0, dst, room, scratch, &len);
            have = rc == KVEDGE_OK;
            if (both && rc == KVEDGE_ENOSPACE)
                rc = KVEDGE_OK; /* order 1 may still fit */
        }
        if (rc == KVEDGE_OK && !both && order[i] == KVEDGE_EC_ORDER1) {
            rc = s_rans(sym + off, n[i], KVEDGE_EC_ORDER1, dst, room, scratch, &len);
            have = rc == KVEDGE_OK;
        } else if (rc == KVEDGE_OK && both) {
            const unsigned bound = rans_compress_bound_4x16((unsigned)n[i], KVEDGE_EC_ORDER1);
            rc = s_rans(sym + off, n[i], KVEDGE_EC_ORDER1, alt, bound, scratch, &len1);
            if (rc == KVEDGE_OK && (!have || len1 < len) && len1 <= room) {
                memcpy(dst, alt, len1);
                len = len1;
                have = true;
            }
        }
        if (rc == KVEDGE_OK && !have)
            rc = KVEDGE_ENOSPACE;
        if (rc != KVEDGE_OK)
            return rc;
        kvedge_le_put32(out + *pos, len);
        *pos += 4u + len;
    }
    return KVEDGE_OK;
}

/* Estimated bytes of one stream before it is coded (the encoder's choice of layout and order
 * without coding every candidate): the symbols' empirical entropy at order 0 and at order 1,
 * plus the frequency tables htscodecs writes for each (rANS_static4x16pr.c: the stream's
 * alphabet, then per table row a varint per present symbol's normalized frequency, a run of
 * absent ones as two bytes; an order-1 table over 1000 bytes is itself coded at order 0, to
 * about S_O1_TABLE_PACKED of it), and the stream's fixed bytes (flags, sizes, four final
 * states). A stream that does not pay is stored (CAT). */
#define S_STREAM_FIXED_BYTES 22.0
#define S_O1_TABLE_PACKED    0.55
#define S_O1_TABLE_PACK_OVER 1000.0

/* Order-1 counts [prev][sym] (rows 0..the section's largest symbol zeroed at the start of an
 * encode, and every touched cell zeroed again after each stream) and the cells a stream
 * touched (n at most). */
typedef struct {
    uint32_t *h1;
    uint32_t *cells;
} s_est_t;

static double s_cat(size_t n, double est)
{
    return est < (double)n + 4 ? est : (double)n + 4;
}

/* o0 (when not NULL) and o1 of sym[0..n), from one counting pass: the order-1 cells, whose
 * column sums are the order-0 histogram. */
static void s_est_stream(const s_est_t *e, const uint8_t *sym, size_t n, double *o0, double *o1)
{
    uint32_t *h1 = e->h1, *cells = e->cells;
    size_t k = 0;
    uint32_t prev = 0; /* htscodecs starts in context 0 */
    for (size_t i = 0; i < n; i++) {
        const uint32_t at = prev << 8 | sym[i];
        if (h1[at]++ == 0)
            cells[k++] = at;
        prev = sym[i];
    }
    uint32_t h0[256] = {0}, rows[256] = {0}, next[256];
    for (size_t i = 0; i < k; i++) {
        h0[cells[i] & 255u] += h1[cells[i]];
        rows[cells[i] >> 8] += h1[cells[i]];
    }
    /* next[v]: the stream's next present symbol after v (256: none); first: its first. */
    uint32_t first = 256, up = 256;
    for (int v = 255; v >= 0; v--) {
        next[v] = up;
        if (h0[v])
            up = first = (uint32_t)v;
    }
    const double nn = (double)n;
    if (o0) {
        double bits = nn * (double)log2f((float)nn), table = 3;
        for (uint32_t v = first; v < 256; v = next[v]) {
            bits -= (double)h0[v] * (double)log2f((float)h0[v]);
            table += (double)h0[v] * 4096.0 / nn < 128 ? 1 : 2;
        }
        *o0 = s_cat(n, bits / 8 + table + S_STREAM_FIXED_BYTES);
    }
    double bits = 0, table = 3, scale[256];
    for (uint32_t c = 0; c < 256; c++) {
        if (!rows[c])
            continue;
        double t = 1;
        while (t < (double)rows[c] && t < 4096)
            t *= 2;
        scale[c] = t / (double)rows[c];
        bits += (double)rows[c] * (double)log2f((float)rows[c]);
        table += h1[c << 8 | first] ? 0 : 2; /* a leading run of absent symbols */
    }
    for (size_t i = 0; i < k; i++) {
        const uint32_t at = cells[i], c = at >> 8, v = at & 255u, h = h1[at];
        bits -= (double)h * (double)log2f((float)h);
        table += (double)h * scale[c] < 128 ? 1 : 2;
        if (next[v] < 256 && !h1[c << 8 | next[v]])
            table += 2; /* a run of absent symbols starts after v */
    }
    for (size_t i = 0; i < k; i++)
        h1[cells[i]] = 0;
    if (table > S_O1_TABLE_PACK_OVER)
        table = table * S_O1_TABLE_PACKED + 6;
    *o1 = s_cat(n, bits / 8 + table + S_STREAM_FIXED_BYTES);
}

/* The layout, and each of its streams' order, with the fewest estimated bytes (the earlier
 * layout and order 0 on ties). Token- and component-major hold the same symbols, so their
 * order-0 estimates are one. */
static void s_choose(const kvedge_tc_shape_t *s, uint32_t rank, const uint8_t *sym_tm,
                     const uint8_t *sym_cm, const s_est_t *e, int *layout, int *order)
{
    double best = INFINITY, o0_all = 0;
    for (int l = KVEDGE_TC_LAYOUT_TOKEN; l <= KVEDGE_TC_LAYOUT_MAX; l++) {
        const uint8_t *sym = l == KVEDGE_TC_LAYOUT_TOKEN ? sym_tm : sym_cm;
        size_t n[KVEDGE_TC_MAX_STREAMS], off = 0;
        int ord[KVEDGE_TC_MAX_STREAMS] = {0};
        const int k = s_streams(s, rank, l, n);
        double total = 0;
        for (int i = 0; i < k; off += n[i], i++) {
            double o0, o1;
            s_est_stream(e, sym + off, n[i], l == KVEDGE_TC_LAYOUT_COMPONENT ? NULL : &o0, &o1);
            if (l == KVEDGE_TC_LAYOUT_TOKEN)
                o0_all = o0;
            else if (l == KVEDGE_TC_LAYOUT_COMPONENT)
                o0 = o0_all;
            ord[i] = o1 < o0 ? KVEDGE_EC_ORDER1 : KVEDGE_EC_ORDER0;
            total += 4 + (o1 < o0 ? o1 : o0);
        }
        if (total < best) {
            best = total;
            *layout = l;
            memcpy(order, ord, sizeof ord);
        }
    }
}

/* Scratch of one encode, one allocation: codes, the symbols of both orders, escapes, rANS
 * buffers and the order-1 counts. */
typedef struct {
    int32_t *q;
    uint8_t *sym, *sym_cm, *scratch, *alt;
    int16_t *esc, *esc_cm; /* the escaped codes of sym and sym_cm */
    uint32_t *h1, *cells;
    uint16_t *m16;
    float *m;
    void *mem;
} s_work_t;

static int s_work_new(s_work_t *w, const kvedge_tc_shape_t *s)
{
    const size_t n = (size_t)s->tokens * s->dim, D = s->dim;
    unsigned b0 = rans_compress_bound_4x16((unsigned)n, KVEDGE_EC_ORDER0),
             b1 = rans_compress_bound_4x16((unsigned)n, KVEDGE_EC_ORDER1);
    const size_t bound = b0 > b1 ? b0 : b1;
    /* Each piece rounded to 8 bytes so every one is aligned for its type. */
#define S_R8(x) (((x) + 7u) & ~(size_t)7u)
    /* q, sym, sym_cm, scratch, alt, esc, h1, m16, m, cells (distinct cells of h1: at most
     * n and at most its 65536), esc_cm */
    const size_t cells = n < 65536u ? n : 65536u;
    const size_t sz[] = {S_R8(n * 4), S_R8(n),     S_R8(n),          S_R8(bound),
                         S_R8(bound), S_R8(n * 2), 256u * 256u * 4u, S_R8(D * 2),
                         S_R8(D * 4), cells * 4,   S_R8(n * 2)};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sz / sizeof sz[0]; i++)
        total += sz[i];
    uint8_t *p = malloc(total);
    if (!p)
        return KVEDGE_ENOMEM;
    w->mem = p;
    w->q = (int32_t *)(void *)p;
    w->sym = p += sz[0];
    w->sym_cm = p += sz[1];
    w->scratch = p += sz[2];
    w->alt = p += sz[3];
    w->esc = (int16_t *)(void *)(p += sz[4]);
    w->h1 = (uint32_t *)(void *)(p += sz[5]);
    w->m16 = (uint16_t *)(void *)(p += sz[6]);
    w->m = (float *)(void *)(p += sz[7]);
    w->cells = (uint32_t *)(void *)(p += sz[8]);
    w->esc_cm = (int16_t *)(void *)(p + sz[9]);
#undef S_R8
    return KVEDGE_OK;
}

/* The encoder: full tries every layout with both orders per stream; otherwise the layout and
 * orders come from s_choose and only they are coded. */
static int s_encode(const kvedge_tc_shape_t *s, const float *x, const float *fwd, float step,
                    bool full, uint8_t *out, size_t out_cap, size_t *out_len)
{
    if (!s_shape_ok(s) || !x || !fwd || !out || !out_len)
        return KVEDGE_EINVAL;
    const uint16_t step16 = kvedge_f32_to_fp16(step);
    const float st = kvedge_fp16_to_f32(step16);
    if (!(st > 0.0f) || !isfinite(st))
        return KVEDGE_EINVAL;
    const uint32_t D = s->dim;
    s_work_t w;
    int rc = s_work_new(&w, s);
    if (rc != KVEDGE_OK)
        return rc;
    uint32_t rank;
    rc = s_quantize(s, x, fwd, st, kvedge_quant_simd(-1) != 0, w.m16, w.m, w.q, &rank);
    const size_t head = KVEDGE_TC_HEAD_BYTES + 2u * D;
    if (rc == KVEDGE_OK && head > out_cap)
        rc = KVEDGE_ENOSPACE;
    if (rc != KVEDGE_OK)
        goto out;
    int layout = KVEDGE_TC_LAYOUT_TOKEN, order[KVEDGE_TC_MAX_STREAMS];
    size_t pos = head, e_tm = 0, e_cm = 0;
    if (rank > 0 && full) {
        /* Every layout coded into out past the header; the smallest kept. */
        size_t best = SIZE_MAX;
        for (int l = KVEDGE_TC_LAYOUT_TOKEN; l <= KVEDGE_TC_LAYOUT_MAX; l++) {
            size_t end = head;
            for (int i = 0; i < KVEDGE_TC_MAX_STREAMS; i++)
                order[i] = -1;
            s_symbols(s, w.q, rank, l, w.sym, NULL);
            rc = s_write_streams(s, rank, l, w.sym, order, out, out_cap, w.scratch, w.alt, &end);
            if (rc == KVEDGE_ENOSPACE)
                continue; /* another layout may fit */
            if (rc != KVEDGE_OK)
                goto out;
            if (end < best) {
                best = end;
                layout = l;
            }
        }
        for (int i = 0; i < KVEDGE_TC_MAX_STREAMS; i++)
            order[i] = -1;
    } else if (rank > 0) {
        const s_est_t e = {.h1 = w.h1, .cells = w.cells};
        e_tm = s_symbols(s, w.q, rank, KVEDGE_TC_LAYOUT_TOKEN, w.sym, w.esc);
        uint8_t top = 0;
        for (size_t i = 0; i < (size_t)s->tokens * rank; i++)
            top = w.sym[i] > top ? w.sym[i] : top;
        memset(w.h1, 0, ((size_t)top + 1) * 256u * sizeof *w.h1);
        e_cm = s_symbols(s, w.q, rank, KVEDGE_TC_LAYOUT_COMPONENT, w.sym_cm, w.esc_cm);
        s_choose(s, rank, w.sym, w.sym_cm, &e, &layout, order);
    }
    out[0] = (uint8_t)layout;
    kvedge_le_put16(out + 1, (uint16_t)rank);
    kvedge_le_put16(out + 3, step16);
    for (uint32_t c = 0; c < D; c++)
        kvedge_le_put16(out + KVEDGE_TC_HEAD_BYTES + 2u * c, w.m16[c]);
    if (rank) {
        /* The chosen layout's symbols: built above, or (full search) built again. */
        const bool tm = layout == KVEDGE_TC_LAYOUT_TOKEN;
        const uint8_t *sym = tm ? w.sym : w.sym_cm;
        const int16_t *esc = tm ? w.esc : w.esc_cm;
        const size_t e = full ? s_symbols(s, w.q, rank, layout, w.sym, w.esc) : tm ? e_tm : e_cm;
        if (full) {
            sym = w.sym;
            esc = w.esc;
        }
        rc = s_write_streams(s, rank, layout, sym, order, out, out_cap, w.scratch, w.alt, &pos);
        if (rc == KVEDGE_OK && out_cap - pos < 4u + 2u * e)
            rc = KVEDGE_ENOSPACE;
        if (rc != KVEDGE_OK)
            goto out;
        kvedge_le_put32(out + pos, (uint32_t)e);
        pos += 4;
        for (size_t i = 0; i < e; i++, pos += 2)
            kvedge_le_put16(out + pos, (uint16_t)esc[i]);
    }
    *out_len = pos;
out:
    free(w.mem);
    return rc;
}

int kvedge_tc_encode(const kvedge_tc_shape_t *s, const float *x, const float *fwd, float step,
                     uint8_t *out, size_t out_cap, size_t *out_len)
{
    return s_encode(s, x, fwd, step, false, out, out_cap, out_len);
}

int kvedge_tc_encode_full(const kvedge_tc_shape_t *s, const float *x, const float *fwd, float step,
                          uint8_t *out, size_t out_cap, size_t *out_len)
{
    return s_encode(s, x, fwd, step, true, out, out_cap, out_len);
}

/* Reads the codes of a section with R > 0 (at in + pos) into y [T][D] as q * step (components
 * R.. left as they are). With y NULL, checks them only. */
static int s_read_codes(const kvedge_tc_shape_t *s, const uint8_t *in, size_t in_len, size_t pos,
                        int layout, uint32_t rank, float st, float *y)
{
    const uint32_t T = s->tokens, D = s->dim;
    const size_t n = (size_t)T * rank;
    size_t sn[KVEDGE_TC_MAX_STREAMS], off = 0;
    const int k_streams = s_streams(s, rank, layout, sn);
    uint8_t *sym = malloc(n);
    if (!sym)
        return KVEDGE_ENOMEM;
    int rc = KVEDGE_OK;
    for (int i = 0; i < k_streams && rc == KVEDGE_OK; i++) {
        uint32_t len = 0;
        if (in_len - pos < 4 || (len = kvedge_le_get32(in + pos)) == 0 || len > in_len - pos - 4) {
            rc = KVEDGE_ECORRUPT;
            break;
        }
        pos += 4;
        rc = kvedge_ec_stream_decode(in + pos, len, sym + off, sn[i]);
        pos += len;
        off += sn[i];
    }
    size_t escapes = 0;
    for (size_t i = 0; i < n && rc == KVEDGE_OK; i++)
        escapes += sym[i] == KVEDGE_TC_ESCAPE;
    if (rc == KVEDGE_OK && (in_len - pos < 4 || kvedge_le_get32(in + pos) != escapes ||
                            in_len - pos - 4 != 2 * escapes))
        rc = KVEDGE_ECORRUPT;
    const uint8_t *e = in + pos + 4;
    const bool tm = layout == KVEDGE_TC_LAYOUT_TOKEN;
    const uint32_t outer = tm ? T : rank, inner = tm ? rank : T;
    const size_t step_a = tm ? D : 1, step_b = tm ? 1 : D;
    bool bad = false;
    for (uint32_t a = 0, k = 0; a < outer && rc == KVEDGE_OK; a++)
        for (uint32_t b = 0; b < inner; b++, k++) {
            int32_t v;
            if (sym[k] == KVEDGE_TC_ESCAPE) {
                v = (int16_t)kvedge_le_get16(e);
                e += 2;
                bad |= s_zigzag(v) < KVEDGE_TC_ESCAPE; /* not how the encoder writes it */
            } else {
                v = s_unzigzag(sym[k]);
            }
            if (y)
                y[a * step_a + b * step_b] = (float)v * st;
        }
    if (bad)
        rc = KVEDGE_ECORRUPT;
    free(sym);
    return rc;
}

/* x[t] = m + sum over j < rank of y[t][j] * inv[j], mul then add in j order (the codec builds
 * with -ffp-contract=off), so the AVX2 copy below, which the compiler vectorizes eight channels
 * wide, gives the same bits as the generic one. Each token's non-zero components are listed
 * once; the channels go S_LANES at a time through accumulators held in registers. */
static inline __attribute__((always_inline)) void s_transform_body(const kvedge_tc_shape_t *s,
                                                                   const float *m, const float *y,
                                                                   uint32_t rank, const float *inv,
                                                                   float *x)
{
    const uint32_t T = s->tokens, D = s->dim;
    uint32_t nz_j[S_MAX_DIM];
    float nz_y[S_MAX_DIM];
    for (uint32_t t = 0; t < T; t++) {
        const float *yt = y + (size_t)t * D;
        float *xt = x + (size_t)t * D;
        uint32_t nz = 0;
        for (uint32_t j = 0; j < rank; j++) { /* branch-free: zeros are unpredictable */
            nz_j[nz] = j;
            nz_y[nz] = yt[j];
            nz += yt[j] != 0.0f;
        }
        uint32_t c0 = 0;
        for (; c0 + 2 * S_LANES <= D; c0 += 2 * S_LANES) { /* eight chains hide the add latency */
            const s_v8 *mv = (const s_v8 *)(m + c0);
            s_v8 a0 = mv[0], a1 = mv[1], a2 = mv[2], a3 = mv[3], a4 = mv[4], a5 = mv[5], a6 = mv[6],
                 a7 = mv[7];
            for (uint32_t i = 0; i < nz; i++) {
                const s_v8 *row = (const s_v8 *)(inv + (size_t)nz_j[i] * D + c0);
                const float yj = nz_y[i];
                a0 += yj * row[0];
                a1 += yj * row[1];
                a2 += yj * row[2];
                a3 += yj * row[3];
                a4 += yj * row[4];
                a5 += yj * row[5];
                a6 += yj * row[6];
                a7 += yj * row[7];
            }
            s_v8 *xv = (s_v8 *)(xt + c0);
            xv[0] = a0;
            xv[1] = a1;
            xv[2] = a2;
            xv[3] = a3;
            xv[4] = a4;
            xv[5] = a5;
            xv[6] = a6;
            xv[7] = a7;
        }
        for (; c0 + S_LANES <= D; c0 += S_LANES) {
            const s_v8 *mv = (const s_v8 *)(m + c0);
            s_v8 a0 = mv[0], a1 = mv[1], a2 = mv[2], a3 = mv[3];
            for (uint32_t i = 0; i < nz; i++) {
                const s_v8 *row = (const s_v8 *)(inv + (size_t)nz_j[i] * D + c0);
                const float yj = nz_y[i];
                a0 += yj * row[0];
                a1 += yj * row[1];
                a2 += yj * row[2];
                a3 += yj * row[3];
            }
            s_v8 *xv = (s_v8 *)(xt + c0);
            xv[0] = a0;
            xv[1] = a1;
            xv[2] = a2;
            xv[3] = a3;
        }
        for (uint32_t c = c0; c < D; c++) {
            float acc = m[c];
            for (uint32_t i = 0; i < nz; i++)
                acc += nz_y[i] * inv[(size_t)nz_j[i] * D + c];
            xt[c] = acc;
        }
    }
}

static void s_transform(const kvedge_tc_shape_t *s, const float *m, const float *y, uint32_t rank,
                        const float *inv, float *x)
{
    s_transform_body(s, m, y, rank, inv, x);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) static void s_transform_avx2(const kvedge_tc_shape_t *s,
                                                             const float *m, const float *y,
                                                             uint32_t rank, const float *inv,
                                                             float *x)
{
    s_transform_body(s, m, y, rank, inv, x);
}
#else
#define s_transform_avx2 s_transform
#endif

/* Walks a section: header, means (into m when not NULL) and codes (into y [T][D] when not
 * NULL: components 0..R-1 of each token); *rank gets R. Every check of the layout, none needing the
 * basis. */
static int s_walk(const kvedge_tc_shape_t *s, const uint8_t *in, size_t in_len, float *m, float *y,
                  uint32_t *rank_out)
{
    const uint32_t D = s->dim;
    if (in_len < KVEDGE_TC_HEAD_BYTES + 2u * D)
        return KVEDGE_ECORRUPT;
    const int layout = in[0];
    const uint32_t rank = kvedge_le_get16(in + 1);
    const float st = kvedge_fp16_to_f32(kvedge_le_get16(in + 3));
    if (layout > KVEDGE_TC_LAYOUT_MAX || rank > D || !(st > 0.0f) || !isfinite(st))
        return KVEDGE_ECORRUPT;
    for (uint32_t c = 0; c < D; c++) {
        const float mc = kvedge_fp16_to_f32(kvedge_le_get16(in + KVEDGE_TC_HEAD_BYTES + 2u * c));
        if (!isfinite(mc))
            return KVEDGE_ECORRUPT;
        if (m)
            m[c] = mc;
    }
    *rank_out = rank;
    const size_t pos = KVEDGE_TC_HEAD_BYTES + 2u * D;
    if (rank == 0)
        return in_len == pos ? KVEDGE_OK : KVEDGE_ECORRUPT;
    return s_read_codes(s, in, in_len, pos, layout, rank, st, y);
}

int kvedge_tc_check(const kvedge_tc_shape_t *s, const uint8_t *in, size_t in_len)
{
    if (!s_shape_ok(s) || !in)
        return KVEDGE_EINVAL;
    uint32_t rank;
    return s_walk(s, in, in_len, NULL, NULL, &rank);
}

int kvedge_tc_decode(const kvedge_tc_shape_t *s, const uint8_t *in, size_t in_len, const float *inv,
                     float *x)
{
    if (!s_shape_ok(s) || !in || !inv || !x)
        return KVEDGE_EINVAL;
    const uint32_t T = s->tokens, D = s->dim;
    if (in_len < KVEDGE_TC_HEAD_BYTES + 2u * D)
        return KVEDGE_ECORRUPT; /* before allocating anything */
    float *m = malloc(D * sizeof *m);
    float *y = malloc((size_t)T * D * sizeof *y); /* components R.. are never read */
    int rc = KVEDGE_ENOMEM;
    uint32_t rank = 0;
    if (!m || !y)
        goto out;
    rc = s_walk(s, in, in_len, m, y, &rank);
    if (rc != KVEDGE_OK)
        goto out;
    if (kvedge_quant_simd(-1))
        s_transform_avx2(s, m, y, rank, inv, x);
    else
        s_transform(s, m, y, rank, inv, x);
out:
    free(y);
    free(m);
    return rc;
}
