/* User-space link shaper: emulates a link's bandwidth and one-way latency on loopback (no
 * root, no tc) for tests and benchmarks, e.g. a cloud link "100mbit,20ms" and a peer-edge
 * link "1gbit,1ms".
 *
 * Model: a token bucket of burst_bytes filling at the link rate, allowed to go into debt, so
 * messages are serialized one after another as on a real link (each queues behind the bytes
 * already on it; one larger than the burst drains at the link rate), then delivered a fixed
 * latency later. Latency is pipelined: it does not hold the link busy.
 *
 * Use: whoever hands a message on (the sender before it sends, or a receiver before it
 * passes a received message up) calls kvedge_shaper_wait() once per message, so the
 * bandwidth and latency seen end to end match the configured link. Use one shaper per link
 * direction. A thread that sends many messages back to back and waits for each in turn pays
 * the latency once per message (stop-and-wait); to keep a stream pipelined, stamp each
 * message with kvedge_shaper_now_us() when it is sent and have the receiving side call
 * kvedge_shaper_wait_from() with that stamp. Tests drive kvedge_shaper_delay_us() with
 * their own clock and never sleep.
 *
 * A NULL shaper is an unshaped link: no delay. */
#ifndef KVEDGE_ACCESS_SHAPER_H
#define KVEDGE_ACCESS_SHAPER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The default burst is the larger of this and KVEDGE_SHAPER_BURST_DEFAULT_US of traffic. */
#define KVEDGE_SHAPER_BURST_MIN_BYTES  (64u * 1024u)
#define KVEDGE_SHAPER_BURST_DEFAULT_US 10000u

typedef struct kvedge_shaper_t kvedge_shaper_t;

/* Creates a shaper for a link of rate_bits_per_s (0 = unlimited: latency only) and one-way
 * latency_us. burst_bytes 0 selects max(KVEDGE_SHAPER_BURST_MIN_BYTES, 10 ms of the rate).
 * The link starts idle with a full bucket. Returns NULL when out of memory. Caller owns the
 * return value. Thread-safe. */
kvedge_shaper_t *kvedge_shaper_new(uint64_t rate_bits_per_s, uint32_t latency_us,
                                   uint64_t burst_bytes);

/* Destroys the shaper. NULL-safe, idempotent, nulls *self_p. */
void kvedge_shaper_destroy(kvedge_shaper_t **self_p);

/* Puts a message of bytes on the link at now_us (any monotonic microsecond clock, the same
 * for every call on this shaper) and returns how long after now_us it is delivered: the wait
 * for the bucket to hold its bytes behind everything queued before it, plus the latency.
 * Saturates at UINT64_MAX. now_us may step back a little (threads racing to the lock): the
 * link is never busy before the latest time it was seen busy. NULL s: 0. */
uint64_t kvedge_shaper_delay_us(kvedge_shaper_t *s, uint64_t bytes, uint64_t now_us);

/* CLOCK_MONOTONIC in microseconds, the clock kvedge_shaper_wait() uses. */
uint64_t kvedge_shaper_now_us(void);

/* Puts a message of bytes on the link now and sleeps until it is delivered
 * (clock_nanosleep to an absolute CLOCK_MONOTONIC deadline, resumed after signals).
 * Returns 0; KVEDGE_EIO if the clock fails. NULL s: returns 0 at once. */
int kvedge_shaper_wait(kvedge_shaper_t *s, uint64_t bytes);

/* As kvedge_shaper_wait() for a message put on the link at sent_us
 * (kvedge_shaper_now_us() at the sender): sleeps until sent_us plus its delay, not at all
 * if that has passed. */
int kvedge_shaper_wait_from(kvedge_shaper_t *s, uint64_t bytes, uint64_t sent_us);

/* The configured link: rate (0 = unlimited), one-way latency, burst in bytes. */
uint64_t kvedge_shaper_rate_bps(const kvedge_shaper_t *s);
uint32_t kvedge_shaper_latency_us(const kvedge_shaper_t *s);
uint64_t kvedge_shaper_burst_bytes(const kvedge_shaper_t *s);

/* Parses a link spec "RATE[,LATENCY]" or "unlimited[,LATENCY]": RATE is a positive integer
 * with unit bit, kbit, mbit or gbit (decimal: kbit = 1000 bit/s), LATENCY a non-negative
 * integer with unit us, ms or s ("100mbit,20ms", "1gbit,1ms", "10gbit", "unlimited",
 * "500kbit,250us"). Units are case-insensitive; no spaces, no fractions. Latency defaults to
 * 0; unlimited gives rate 0. Errors: KVEDGE_EINVAL for a NULL argument, anything else, or a
 * value past uint64 bits/s or uint32 microseconds; outputs untouched on error. */
int kvedge_shaper_parse(const char *spec, uint64_t *rate_bps, uint32_t *latency_us);

#ifdef __cplusplus
}
#endif
#endif
