/* User-space link shaper: a debt-allowed token bucket plus a fixed latency (see shaper.h). */
#include "access/shaper.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "access/codec/error.h"

/* Link time in nanoseconds, wide enough that neither a clock's absolute value times 1000 nor
 * the serialization time of 2^64 bytes at 1 bit/s can overflow it. */
typedef __int128 s_ns_t;

/* busy_until stops growing here (16 times the largest delay, millions of years), so it cannot
 * overflow however many huge messages are queued; delays past UINT64_MAX us saturate. */
#define S_NS_CAP ((s_ns_t)UINT64_MAX * 1000 * 16)

struct kvedge_shaper_t {
    pthread_mutex_t mu;   /* guards busy_until_ns */
    uint64_t rate_bps;    /* bits/s; 0 = unlimited */
    uint32_t latency_us;  /* one-way, added after serialization */
    uint64_t burst_bytes; /* bucket size */
    s_ns_t burst_ns;      /* time the link takes to send a full bucket */
    s_ns_t busy_until_ns; /* when the link has sent everything queued so far */
};

/* Serialization time of bytes at rate_bps (> 0), rounded up to whole nanoseconds. */
static s_ns_t s_ser_ns(uint64_t bytes, uint64_t rate_bps)
{
    s_ns_t bits_ns = (s_ns_t)bytes * 8 * 1000000000;
    return (bits_ns + (s_ns_t)rate_bps - 1) / (s_ns_t)rate_bps;
}

kvedge_shaper_t *kvedge_shaper_new(uint64_t rate_bits_per_s, uint32_t latency_us,
                                   uint64_t burst_bytes)
{
    kvedge_shaper_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        return NULL;
    }
    s->rate_bps = rate_bits_per_s;
    s->latency_us = latency_us;
    if (burst_bytes == 0) {
        /* rate / 8 bytes per second, for BURST_DEFAULT_US microseconds */
        uint64_t span = rate_bits_per_s / 8 / (1000000u / KVEDGE_SHAPER_BURST_DEFAULT_US);
        burst_bytes = span > KVEDGE_SHAPER_BURST_MIN_BYTES ? span : KVEDGE_SHAPER_BURST_MIN_BYTES;
    }
    s->burst_bytes = burst_bytes;
    if (rate_bits_per_s)
        s->burst_ns = s_ser_ns(burst_bytes, rate_bits_per_s);
    return s;
}

void kvedge_shaper_destroy(kvedge_shaper_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_shaper_t *s = *self_p;
    pthread_mutex_destroy(&s->mu);
    free(s);
    *self_p = NULL;
}

/* GCRA form of the token bucket: busy_until is when the link drains what is queued; a
 * message may leave once that, with it added, is no more than one bucket ahead of now. Integer
 * nanoseconds, so equal times compare equal and rounding drifts at most 1 ns per message. */
uint64_t kvedge_shaper_delay_us(kvedge_shaper_t *s, uint64_t bytes, uint64_t now_us)
{
    if (!s)
        return 0;
    if (s->rate_bps == 0)
        return s->latency_us;
    s_ns_t now = (s_ns_t)now_us * 1000;
    pthread_mutex_lock(&s->mu);
    s_ns_t start = s->busy_until_ns > now ? s->busy_until_ns : now;
    s_ns_t busy = start + s_ser_ns(bytes, s->rate_bps);
    s->busy_until_ns = busy < S_NS_CAP ? busy : S_NS_CAP;
    s_ns_t wait_ns = busy - s->burst_ns - now;
    pthread_mutex_unlock(&s->mu);

    s_ns_t delay = (wait_ns > 0 ? (wait_ns + 999) / 1000 : 0) + s->latency_us;
    return delay < (s_ns_t)UINT64_MAX ? (uint64_t)delay : UINT64_MAX;
}

static int s_clock_us(uint64_t *out)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return KVEDGE_EIO;
    *out = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
    return KVEDGE_OK;
}

uint64_t kvedge_shaper_now_us(void)
{
    uint64_t now = 0;
    s_clock_us(&now);
    return now;
}

/* Sleeps until deadline_us on CLOCK_MONOTONIC; an absolute deadline makes resuming after a
 * signal exact. */
static int s_sleep_until(uint64_t deadline_us)
{
    struct timespec ts = {.tv_sec = (time_t)(deadline_us / 1000000u),
                          .tv_nsec = (long)(deadline_us % 1000000u) * 1000};
    int rc;
    do
        rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    while (rc == EINTR);
    return rc == 0 ? KVEDGE_OK : KVEDGE_EIO;
}

int kvedge_shaper_wait_from(kvedge_shaper_t *s, uint64_t bytes, uint64_t sent_us)
{
    if (!s)
        return KVEDGE_OK;
    uint64_t now;
    if (s_clock_us(&now) != KVEDGE_OK)
        return KVEDGE_EIO;
    uint64_t delay = kvedge_shaper_delay_us(s, bytes, sent_us);
    uint64_t deadline = delay > UINT64_MAX - sent_us ? UINT64_MAX : sent_us + delay;
    return deadline > now ? s_sleep_until(deadline) : KVEDGE_OK;
}

int kvedge_shaper_wait(kvedge_shaper_t *s, uint64_t bytes)
{
    if (!s)
        return KVEDGE_OK;
    uint64_t now;
    if (s_clock_us(&now) != KVEDGE_OK)
        return KVEDGE_EIO;
    return kvedge_shaper_wait_from(s, bytes, now);
}

uint64_t kvedge_shaper_rate_bps(const kvedge_shaper_t *s)
{
    return s ? s->rate_bps : 0;
}

uint32_t kvedge_shaper_latency_us(const kvedge_shaper_t *s)
{
    return s ? s->latency_us : 0;
}

uint64_t kvedge_shaper_burst_bytes(const kvedge_shaper_t *s)
{
    return s ? s->burst_bytes : 0;
}

/* ---------------------------------------------------------------- spec parsing */

typedef struct {
    const char *name;
    uint64_t scale;
} s_unit_t;

static const s_unit_t s_rate_units[] = {
    {"bit", 1}, {"kbit", 1000}, {"mbit", 1000000}, {"gbit", 1000000000}, {NULL, 0}};
static const s_unit_t s_time_units[] = {{"us", 1}, {"ms", 1000}, {"s", 1000000}, {NULL, 0}};

/* Parses "DIGITS UNIT" filling [p, end) exactly into *out (value times the unit's scale).
 * Returns false on anything else, including overflow. */
static bool s_parse_quantity(const char *p, const char *end, const s_unit_t *units, uint64_t *out)
{
    uint64_t v = 0;
    const char *digits = p;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    if (p == digits)
        return false;
    size_t len = (size_t)(end - p);
    for (const s_unit_t *u = units; u->name; u++) {
        if (strlen(u->name) == len && strncasecmp(p, u->name, len) == 0) {
            if (v != 0 && u->scale > UINT64_MAX / v)
                return false;
            *out = v * u->scale;
            return true;
        }
    }
    return false;
}

int kvedge_shaper_parse(const char *spec, uint64_t *rate_bps, uint32_t *latency_us)
{
    if (!spec || !rate_bps || !latency_us)
        return KVEDGE_EINVAL;
    const char *comma = strchr(spec, ',');
    const char *rate_end = comma ? comma : spec + strlen(spec);

    uint64_t rate = 0;
    size_t rlen = (size_t)(rate_end - spec);
    if (!(rlen == 9 && strncasecmp(spec, "unlimited", 9) == 0)) {
        if (!s_parse_quantity(spec, rate_end, s_rate_units, &rate) || rate == 0)
            return KVEDGE_EINVAL;
    }
    uint64_t lat = 0;
    if (comma) {
        const char *p = comma + 1;
        if (!s_parse_quantity(p, p + strlen(p), s_time_units, &lat) || lat > UINT32_MAX)
            return KVEDGE_EINVAL;
    }
    *rate_bps = rate;
    *latency_us = (uint32_t)lat;
    return KVEDGE_OK;
}
