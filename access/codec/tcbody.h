/* A transform-coded (lossy) K or V section of one head: the tokens' values projected on a
 * basis the caller gives (a model-level weighted KLT, scripts/study_lossy_kv.py), the
 * components quantized at one uniform step and entropy-coded with rANS-Nx16 (ecbody.h's
 * streams). The codec of the study in docs/benchmarks.md "Lossy entropy-coded K/V"; not yet a
 * block scheme or a precision rung: the byte layout below is the section's alone.
 *
 * Layout (all integers little-endian; every length is checked against the shape and the
 * bytes left, and the section must end exactly at its length):
 *   0        1   layout: 0 token-major (codes [T][R]), 1 component-major ([R][T]), 2 bands
 *                (component-major in KVEDGE_TC_MAX_STREAMS streams or fewer, below)
 *   1        2   R, the components coded (u16, 0..D); components R.. decode as 0
 *   3        2   step, fp16, finite and > 0
 *   5        2D  means m[D], fp16, finite
 *   then, when R > 0, per stream (one, or one per non-empty band):
 *            4   n, the stream's length (u32, 1..bytes left)
 *            n   a rANS-Nx16 stream of exactly its share of the T*R symbols (T times its
 *                components): zigzag(q) (0, -1, 1, -2 ... as 0, 1, 2, 3 ...) when under 255,
 *                else 255 (an escape)
 *   and then:
 *            4   e, the escapes: exactly the number of 255 symbols
 *            2e  the escaped codes, int16 each, in symbol order; each one's zigzag >= 255
 * Decoded value: x[t][c] = m[c] + sum over j < R of q[t][j] * step * inv[j][c]. */
#ifndef KVEDGE_CODEC_TCBODY_H
#define KVEDGE_CODEC_TCBODY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_TC_LAYOUT_TOKEN     0
#define KVEDGE_TC_LAYOUT_COMPONENT 1
/* Component-major in up to four streams, each its own table: components [0, D/8), [D/8, D/4),
 * [D/4, D/2), [D/2, D), each cut at R, empty ones dropped (a KLT's components in falling
 * variance: the bands' symbols have different spreads, so one table for all fits none). */
#define KVEDGE_TC_LAYOUT_BANDS 2
#define KVEDGE_TC_LAYOUT_MAX   2
#define KVEDGE_TC_MAX_STREAMS  4
/* The escape symbol, and the largest |code| an escape can hold. */
#define KVEDGE_TC_ESCAPE   255u
#define KVEDGE_TC_CODE_MAX 32767
/* Bytes before the code stream: layout, R, step (the means follow). */
#define KVEDGE_TC_HEAD_BYTES 5u

/* A section's shape: T tokens of D values (the block limits: 1..65536, 1..1024). */
typedef struct {
    uint32_t tokens;
    uint32_t dim;
} kvedge_tc_shape_t;

/* Most bytes kvedge_tc_encode writes for a shape (every code an escape); 0 for a bad shape. */
size_t kvedge_tc_bound(const kvedge_tc_shape_t *s);

/* Codes x [T][D] (fp32): m = fp16 of each channel's mean; components y = (x - m) fwd with fwd
 * [D][D] row-major (y[j] = sum over c of (x[c] - m[c]) * fwd[c][j], summed in c order, the
 * same bits with or without SIMD); q = floor(y / step + 0.5) with step rounded to fp16; R = 1 +
 * the last component with a non-zero code. The layout and each stream's rANS order are those
 * with the fewest bytes by an estimate from the symbols' order-0 and order-1 histograms (their
 * entropy and htscodecs' table sizes), and only they are coded. Errors: KVEDGE_EINVAL (bad
 * shape, NULL, non-finite x, fwd or mean, step not a positive fp16, a code over
 * KVEDGE_TC_CODE_MAX), KVEDGE_ENOSPACE (out_cap under what is needed), KVEDGE_ENOMEM. */
int kvedge_tc_encode(const kvedge_tc_shape_t *s, const float *x, const float *fwd, float step,
                     uint8_t *out, size_t out_cap, size_t *out_len);

/* kvedge_tc_encode with the full search: every layout coded, each stream at rANS orders 0 and
 * 1, the smallest kept (the earlier layout and order 0 on ties). The same codes, so the same
 * decoded values; several times slower. The reference tests and bench_tc measure the estimated
 * choice against. */
int kvedge_tc_encode_full(const kvedge_tc_shape_t *s, const float *x, const float *fwd, float step,
                          uint8_t *out, size_t out_cap, size_t *out_len);

/* Decodes a section of in_len bytes into x [T][D] with the inverse basis inv [D][D] (row j:
 * component j's values over the D channels). Errors: KVEDGE_ECORRUPT (anything the layout
 * above does not allow: a length past the end or short of it, an unknown layout, R > D, a
 * step or mean not finite and positive/finite, a stream that is not T*R symbols or uses a
 * layout the encoder does not write, an escape count or value that does not match),
 * KVEDGE_EINVAL (bad shape or NULL), KVEDGE_ENOMEM. */
int kvedge_tc_decode(const kvedge_tc_shape_t *s, const uint8_t *in, size_t in_len, const float *inv,
                     float *x);

/* Checks a section of in_len bytes without decoding it: every check kvedge_tc_decode makes
 * that needs no basis (the header, R <= D, the step and means, each stream decoding to exactly
 * its symbol count, the escapes matching, the section ending exactly at in_len). A section that
 * passes decodes with any inverse basis of its D. Errors: KVEDGE_ECORRUPT, KVEDGE_EINVAL (bad
 * shape or NULL), KVEDGE_ENOMEM. */
int kvedge_tc_check(const kvedge_tc_shape_t *s, const uint8_t *in, size_t in_len);

#ifdef __cplusplus
}
#endif
#endif
