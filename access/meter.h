/* Per-peer link meter: EWMA estimates of a peer's bandwidth and round-trip time from the
 * transfers and probes actually seen, for the planner's transfer-cost model. */
#ifndef KVEDGE_ACCESS_METER_H
#define KVEDGE_ACCESS_METER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* EWMA weight of a new sample once the meter has warmed up. */
#define KVEDGE_METER_ALPHA_DEFAULT 0.2
/* Transfers smaller than this are latency-dominated: they feed the RTT estimate, never the
 * bandwidth estimate. */
#define KVEDGE_METER_MIN_BW_BYTES (64u * 1024u)
/* A bandwidth sample's transfer time (elapsed minus the RTT estimate) is floored at
 * elapsed / this, so an RTT estimate that is briefly too high cannot turn one sample into a
 * spike: no sample exceeds this many times the naive bytes / elapsed. */
#define KVEDGE_METER_NET_FLOOR_DIV 64
/* Absolute floor of a bandwidth sample's transfer time. */
#define KVEDGE_METER_NET_FLOOR_US 1

typedef struct kvedge_meter_t kvedge_meter_t;

typedef struct {
    double bw_bytes_per_s;   /* link throughput estimate; 0 = none yet */
    double rtt_us;           /* round-trip estimate; 0 when none yet */
    uint64_t samples;        /* observations accepted: transfers and RTT probes (not priors) */
    uint64_t bytes_total;    /* bytes of every accepted transfer, saturating */
    uint64_t last_update_ms; /* CLOCK_MONOTONIC ms of the last accepted observation; 0 = never */
} kvedge_meter_stats_t;

/* Creates a meter with EWMA weight alpha in (0, 1]; alpha <= 0 selects
 * KVEDGE_METER_ALPHA_DEFAULT. Each estimate weights its n-th sample (a prior counting as
 * one) by max(alpha, 1/n): a plain mean while there are few samples, so the first ones are
 * not biased toward zero or toward a stale prior, then an EWMA. Returns NULL when alpha is
 * NaN or above 1, or out of memory. Caller owns the return value. Thread-safe. */
kvedge_meter_t *kvedge_meter_new(double alpha);

/* Destroys the meter. NULL-safe, idempotent, nulls *self_p. */
void kvedge_meter_destroy(kvedge_meter_t **self_p);

/* Records one completed transfer of bytes that took elapsed_us from request to last byte
 * (so it includes one round trip). Transfers of at least KVEDGE_METER_MIN_BW_BYTES update the
 * bandwidth with bytes / max(elapsed - rtt estimate, floor): subtracting the round trip makes
 * the estimate the link's throughput rather than a size-dependent goodput. Smaller transfers
 * are latency probes: they update the RTT with elapsed - bytes / bw (elapsed while no
 * bandwidth is known). Errors: KVEDGE_EINVAL (NULL meter, elapsed_us 0); nothing recorded. */
int kvedge_meter_observe(kvedge_meter_t *m, uint64_t bytes, uint64_t elapsed_us);

/* Records one round-trip measurement (a ping). 0 is accepted (loopback at microsecond
 * resolution). Errors: KVEDGE_EINVAL (NULL meter). */
int kvedge_meter_observe_rtt(kvedge_meter_t *m, uint64_t rtt_us);

/* Seeds declared link values (from config or a peer's hello), used until observations
 * arrive and then averaged with them as one sample. A prior never overrides a measurement:
 * an estimate that already has an observation keeps it, one that only has a prior takes the
 * new prior. Errors: KVEDGE_EINVAL (NULL meter, bw not finite or not > 0); nothing seeded. */
int kvedge_meter_prior(kvedge_meter_t *m, double bw_bytes_per_s, uint64_t rtt_us);

/* Copies the current estimates into *out. Errors: KVEDGE_EINVAL (NULL argument). */
int kvedge_meter_stats(kvedge_meter_t *m, kvedge_meter_stats_t *out);

/* The bandwidth estimate in bytes/s; 0 when there is none (or m is NULL). */
double kvedge_meter_bw(kvedge_meter_t *m);

/* The RTT estimate in microseconds; 0 when there is none (or m is NULL). */
double kvedge_meter_rtt_us(kvedge_meter_t *m);

/* Predicted time in microseconds to fetch bytes from this peer: rtt + bytes / bw (the
 * transfer cost of CE-LSLM Eq. 19). INFINITY when bytes > 0 and there is no bandwidth
 * estimate, or m is NULL, so a planner never prefers a link it knows nothing about; a
 * missing RTT counts as 0. */
double kvedge_meter_transfer_time_us(kvedge_meter_t *m, uint64_t bytes);

#ifdef __cplusplus
}
#endif
#endif
