/* Per-peer link meter: EWMA bandwidth and RTT estimates (see meter.h for the model). */
#include "access/meter.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "access/codec/clock.h"
#include "access/codec/error.h"

/* One smoothed quantity: its value, how many samples shaped it (a prior counts as one),
 * and whether any of them was a real observation. */
typedef struct {
    double value;
    uint64_t n;
    bool observed;
} s_ewma_t;

struct kvedge_meter_t {
    pthread_mutex_t mu; /* guards everything below */
    double alpha;       /* steady-state weight of a new sample */
    s_ewma_t bw;        /* bytes/s */
    s_ewma_t rtt;       /* microseconds */
    uint64_t samples;   /* accepted observations */
    uint64_t bytes_total;
    uint64_t last_update_ms; /* CLOCK_MONOTONIC */
};

/* Folds x in with weight max(alpha, 1/n): the exact mean of the first samples, then an EWMA.
 * Non-finite or negative samples are dropped (they can only come from a bug upstream). */
static void s_ewma_add(s_ewma_t *e, double alpha, double x)
{
    if (!isfinite(x) || x < 0)
        return;
    if (e->n < UINT64_MAX)
        e->n++;
    double w = 1.0 / (double)e->n;
    if (w < alpha)
        w = alpha;
    e->value += w * (x - e->value);
    e->observed = true;
}

/* Caller holds m->mu. */
static void s_touch(kvedge_meter_t *m)
{
    if (m->samples < UINT64_MAX)
        m->samples++;
    m->last_update_ms = kvedge_mono_ms();
}

kvedge_meter_t *kvedge_meter_new(double alpha)
{
    if (isnan(alpha) || alpha > 1.0)
        return NULL;
    kvedge_meter_t *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    if (pthread_mutex_init(&m->mu, NULL) != 0) {
        free(m);
        return NULL;
    }
    m->alpha = alpha > 0 ? alpha : KVEDGE_METER_ALPHA_DEFAULT;
    return m;
}

void kvedge_meter_destroy(kvedge_meter_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_meter_t *m = *self_p;
    pthread_mutex_destroy(&m->mu);
    free(m);
    *self_p = NULL;
}

int kvedge_meter_observe(kvedge_meter_t *m, uint64_t bytes, uint64_t elapsed_us)
{
    if (!m || elapsed_us == 0)
        return KVEDGE_EINVAL;
    double elapsed = (double)elapsed_us;
    pthread_mutex_lock(&m->mu);
    if (bytes >= KVEDGE_METER_MIN_BW_BYTES) {
        double net = elapsed - (m->rtt.n ? m->rtt.value : 0.0);
        double floor_us = elapsed / KVEDGE_METER_NET_FLOOR_DIV;
        if (floor_us < KVEDGE_METER_NET_FLOOR_US)
            floor_us = KVEDGE_METER_NET_FLOOR_US;
        if (net < floor_us)
            net = floor_us;
        s_ewma_add(&m->bw, m->alpha, (double)bytes * 1e6 / net);
    } else {
        /* Latency-dominated: what is left after serialization is the round trip. */
        double lat = elapsed;
        if (m->bw.n && m->bw.value > 0)
            lat -= (double)bytes * 1e6 / m->bw.value;
        s_ewma_add(&m->rtt, m->alpha, lat > 0 ? lat : 0.0);
    }
    m->bytes_total = bytes > UINT64_MAX - m->bytes_total ? UINT64_MAX : m->bytes_total + bytes;
    s_touch(m);
    pthread_mutex_unlock(&m->mu);
    return KVEDGE_OK;
}

int kvedge_meter_observe_rtt(kvedge_meter_t *m, uint64_t rtt_us)
{
    if (!m)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&m->mu);
    s_ewma_add(&m->rtt, m->alpha, (double)rtt_us);
    s_touch(m);
    pthread_mutex_unlock(&m->mu);
    return KVEDGE_OK;
}

int kvedge_meter_prior(kvedge_meter_t *m, double bw_bytes_per_s, uint64_t rtt_us)
{
    if (!m || !isfinite(bw_bytes_per_s) || bw_bytes_per_s <= 0)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&m->mu);
    if (!m->bw.observed)
        m->bw = (s_ewma_t){.value = bw_bytes_per_s, .n = 1};
    if (!m->rtt.observed)
        m->rtt = (s_ewma_t){.value = (double)rtt_us, .n = 1};
    pthread_mutex_unlock(&m->mu);
    return KVEDGE_OK;
}

int kvedge_meter_stats(kvedge_meter_t *m, kvedge_meter_stats_t *out)
{
    if (!m || !out)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&m->mu);
    *out = (kvedge_meter_stats_t){
        .bw_bytes_per_s = m->bw.n ? m->bw.value : 0.0,
        .rtt_us = m->rtt.n ? m->rtt.value : 0.0,
        .samples = m->samples,
        .bytes_total = m->bytes_total,
        .last_update_ms = m->last_update_ms,
    };
    pthread_mutex_unlock(&m->mu);
    return KVEDGE_OK;
}

double kvedge_meter_bw(kvedge_meter_t *m)
{
    kvedge_meter_stats_t st;
    return kvedge_meter_stats(m, &st) == KVEDGE_OK ? st.bw_bytes_per_s : 0.0;
}

double kvedge_meter_rtt_us(kvedge_meter_t *m)
{
    kvedge_meter_stats_t st;
    return kvedge_meter_stats(m, &st) == KVEDGE_OK ? st.rtt_us : 0.0;
}

double kvedge_meter_transfer_time_us(kvedge_meter_t *m, uint64_t bytes)
{
    kvedge_meter_stats_t st;
    if (kvedge_meter_stats(m, &st) != KVEDGE_OK)
        return INFINITY;
    if (bytes == 0)
        return st.rtt_us;
    if (!(st.bw_bytes_per_s > 0))
        return INFINITY;
    return st.rtt_us + (double)bytes * 1e6 / st.bw_bytes_per_s;
}
