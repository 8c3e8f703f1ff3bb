/* Time and waiting for a condition with a deadline, without cmocka: for the tests'
 * fixtures that benchmarks share (tests/common/etcd.h) and for testutil.h, which adds the
 * failing waits on top. */
#ifndef KVEDGE_TESTS_POLL_H
#define KVEDGE_TESTS_POLL_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* How often kt_poll looks at its predicate. */
#define KT_POLL_MS 10

/* Monotonic milliseconds. */
static inline int64_t kt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Lets ms pass. Only for a pause that is the point of a test (a deadline to expire, a silence
 * to last, load to pace); "until X happened" is kt_poll / kt_wait_until on X. */
static inline void kt_pause_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

typedef bool (*kt_pred_t)(void *ctx);

/* Polls pred(ctx) every KT_POLL_MS until it holds (true) or deadline_ms have passed (false;
 * pred is asked one last time at the deadline). */
static inline bool kt_poll(kt_pred_t pred, void *ctx, int64_t deadline_ms)
{
    int64_t end = kt_now_ms() + deadline_ms;
    for (;;) {
        if (pred(ctx))
            return true;
        if (kt_now_ms() >= end)
            return pred(ctx);
        kt_pause_ms(KT_POLL_MS); /* the poll interval, not a wait for anything */
    }
}

#endif
