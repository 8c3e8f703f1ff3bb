/* Helpers shared by kvedge's cmocka tests: waiting for a condition with a deadline, the one
 * slack timing asserts allow, and synthetic blocks. */
#ifndef KVEDGE_TESTS_TESTUTIL_H
#define KVEDGE_TESTS_TESTUTIL_H

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include <cmocka.h>

#include "access/codec/block.h"
#include "access/codec/quant.h"
#include "access/codec/synth.h"
#include "tests/common/poll.h"

/* How late past its bound something a test times may end: what a loaded, shared 2-core
 * runner (ASan, parallel ctest) meets with a wide margin. A timing assert says "not before the
 * deadline, and not grossly after it": >= deadline - a little, <= deadline + KT_SLACK_MS. */
#define KT_SLACK_MS 5000
/* How long a test waits for a condition that should hold within milliseconds on an idle
 * machine (a view catching up, a log line, a counter): generous, since a wait that holds
 * returns as soon as it does. */
#define KT_WAIT_MS 20000

static inline void kt_wait_until_(kt_pred_t pred, void *ctx, int64_t deadline_ms, const char *what,
                                  const char *file, int line)
{
    if (!kt_poll(pred, ctx, deadline_ms))
        fail_msg("%s:%d: waited %lld ms for %s: it did not happen", file, line,
                 (long long)deadline_ms, what);
}

/* Waits until pred(ctx) holds; fails the test, naming pred, when deadline_ms pass first. */
#define kt_wait_until(pred, ctx, deadline_ms)                                                      \
    kt_wait_until_((pred), (ctx), (deadline_ms), #pred, __FILE__, __LINE__)

/* Waits until the expression cond holds (evaluated every KT_POLL_MS); fails the test, naming
 * cond, when deadline_ms pass first. */
#define kt_wait_for(cond, deadline_ms)                                                             \
    do {                                                                                           \
        int64_t kt_end_ = kt_now_ms() + (deadline_ms);                                             \
        while (!(cond)) {                                                                          \
            if (kt_now_ms() >= kt_end_) {                                                          \
                if (cond)                                                                          \
                    break;                                                                         \
                fail_msg("%s:%d: waited %lld ms for %s: it did not happen", __FILE__, __LINE__,    \
                         (long long)(deadline_ms), #cond);                                         \
            }                                                                                      \
            kt_pause_ms(KT_POLL_MS);                                                               \
        }                                                                                          \
    } while (0)

/* ||a - b|| / ||a|| over n floats. */
static inline double kt_rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)a[i] * a[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Encodes one synthetic head; returns a malloc'd block and its length via *len. */
static inline uint8_t *kt_encode(const kvedge_block_spec_t *spec, uint64_t seed, size_t *len)
{
    size_t n = (size_t)spec->tokens * spec->head_dim, es = kvedge_dtype_size(spec->dtype);
    void *k = malloc(n * es), *v = malloc(n * es);
    size_t cap = kvedge_block_encoded_bound(spec);
    uint8_t *out = malloc(cap ? cap : 1);
    if (!k || !v || !out || cap == 0 ||
        kvedge_synth_head(seed, 0, spec->tokens, spec->head_dim, spec->dtype, k, v) != 0 ||
        kvedge_block_encode(spec, k, v, out, cap, len) != 0) {
        free(out);
        out = NULL;
    }
    free(k);
    free(v);
    return out;
}

#endif
