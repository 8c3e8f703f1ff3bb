/* Per-node health for the edge proxy: UP / SUSPECT / DOWN from heartbeats and request
 * outcomes, with gradual re-admission of a node that comes back, so the planner only picks
 * sources that are likely to answer and weights the doubtful ones down. */
#ifndef KVEDGE_PROXY_HEALTH_H
#define KVEDGE_PROXY_HEALTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Most nodes one table tracks; adding one more is KVEDGE_EFULL. */
#define KVEDGE_HEALTH_MAX_NODES 1024
/* Longest node name in bytes, without the terminating NUL. */
#define KVEDGE_HEALTH_NAME_MAX 64
/* Silence (no heartbeat, no success) for more than this makes a node SUSPECT... */
#define KVEDGE_HEALTH_SUSPECT_MS 3000
/* ...and for more than this DOWN. */
#define KVEDGE_HEALTH_DOWN_MS 10000
/* This many consecutive failures make a node SUSPECT... */
#define KVEDGE_HEALTH_SUSPECT_FAILURES 2
/* ...and this many DOWN. */
#define KVEDGE_HEALTH_DOWN_FAILURES 4
/* A DOWN node that is heard again is on probation this long: its weight ramps linearly from
 * KVEDGE_HEALTH_READMIT_WEIGHT_MIN to 1, and a single failure other than a timeout sends it
 * back to DOWN. A timeout on probation counts as any failure does (SUSPECT at 2, DOWN at 4):
 * the deadlines that time out follow the link's measured round trips (kvedge_health_rto_ms),
 * and a jittery link that is up misses one now and then. */
#define KVEDGE_HEALTH_READMIT_MS 10000
/* Weight of a node at the first instant of its probation. */
#define KVEDGE_HEALTH_READMIT_WEIGHT_MIN 0.1
/* Weight cap of a SUSPECT node (usable, but half as attractive). */
#define KVEDGE_HEALTH_SUSPECT_WEIGHT 0.5

typedef enum {
    KVEDGE_HEALTH_UP = 0,      /* heard recently, fewer than SUSPECT_FAILURES failures */
    KVEDGE_HEALTH_SUSPECT = 1, /* silent > SUSPECT_MS or >= SUSPECT_FAILURES failures */
    KVEDGE_HEALTH_DOWN = 2,    /* silent > DOWN_MS, >= DOWN_FAILURES failures, or failed on
                                  probation; stays DOWN until heard again */
} kvedge_health_state_t;

typedef struct kvedge_health_t kvedge_health_t;

/* One node as seen at a given time. */
typedef struct {
    char name[KVEDGE_HEALTH_NAME_MAX + 1];
    kvedge_health_state_t state;
    double weight;          /* 0 (DOWN) or in [READMIT_WEIGHT_MIN, 1]; see kvedge_health_weight */
    uint32_t failures;      /* consecutive failures since the last success or re-admission */
    uint64_t last_heard_ms; /* caller's clock at the latest heartbeat or success; 0 = never */
    bool probation;         /* re-admitted and still ramping up */
    uint64_t probation_start_ms; /* start of the current probation; 0 when not on probation */
    int last_err;                /* error of the latest failure; 0 = none yet */
    double srtt_us;              /* smoothed round trip (RFC 6298 SRTT); 0 = no sample yet */
    double rttvar_us;            /* its mean deviation (RTTVAR) */
} kvedge_health_info_t;

/* Called once per node by kvedge_health_foreach; info is valid only during the call. Return 0
 * to go on, anything else to stop (foreach then returns that value). */
typedef int (*kvedge_health_fn)(const kvedge_health_info_t *info, void *arg);

/* Times: every now_ms is the caller's monotonic clock in milliseconds. Threads may pass
 * slightly out-of-order stamps; an older stamp never moves a node's clocks backwards and
 * counts as no time elapsed. All functions are thread-safe (one mutex per table). */

/* Creates a table for up to max_nodes nodes; 0 selects KVEDGE_HEALTH_MAX_NODES. Returns NULL
 * when max_nodes > KVEDGE_HEALTH_MAX_NODES or out of memory. Caller owns the return value. */
kvedge_health_t *kvedge_health_new(size_t max_nodes);

/* Destroys the table. NULL-safe, idempotent, nulls *self_p. */
void kvedge_health_destroy(kvedge_health_t **self_p);

/* Registers a node without claiming it was heard (a node named in the config): it starts UP
 * and its silence clock starts at now_ms. Existing nodes are left as they are.
 * Errors: KVEDGE_EINVAL (NULL table or name, name empty or longer than
 * KVEDGE_HEALTH_NAME_MAX), KVEDGE_EFULL (table full). Same for the three inputs below, each
 * of which adds an unknown node first. */
int kvedge_health_add(kvedge_health_t *h, const char *node, uint64_t now_ms);

/* The node was heard from. Resets its silence clock; a DOWN node is re-admitted: failures
 * reset to 0 and probation starts at now_ms. Does not reset failures of a node that is not
 * DOWN: a node can be alive and still fail every request. */
int kvedge_health_heartbeat(kvedge_health_t *h, const char *node, uint64_t now_ms);

/* A request to the node succeeded: a heartbeat (a reply is proof of life) that also resets
 * the consecutive-failure count. Does not end a probation early. */
int kvedge_health_success(kvedge_health_t *h, const char *node, uint64_t now_ms);

/* A request to the node failed with err (a negative KVEDGE_E* code, e.g. KVEDGE_ETIMEDOUT).
 * Counts one consecutive failure; a node on probation goes DOWN at once unless err is
 * KVEDGE_ETIMEDOUT (then it counts as any failure). A failure is not proof of life: the
 * silence clock is untouched. Extra error: KVEDGE_EINVAL when err >= 0 (nothing recorded). */
int kvedge_health_failure(kvedge_health_t *h, const char *node, uint64_t now_ms, int err);

/* One round-trip measurement of the node (a ping, the first block of a stream sent while no
 * other was in flight), in microseconds: folded into SRTT and RTTVAR as RFC 6298 says (the
 * first sample R gives SRTT = R, RTTVAR = R / 2; then RTTVAR += (|SRTT - R| - RTTVAR) / 4,
 * SRTT += (R - SRTT) / 8). Not proof of life by itself (the caller says heartbeat or success).
 * Errors: as kvedge_health_add, and KVEDGE_EINVAL for a negative or non-finite rtt_us. */
int kvedge_health_rtt(kvedge_health_t *h, const char *node, uint64_t now_ms, double rtt_us);

/* The node's retransmission timeout as RFC 6298 computes it from the samples above:
 * SRTT + 4 x RTTVAR, in milliseconds; 0 when no sample yet, or for an unknown node or bad
 * arguments. What a deadline on this node should allow for one round trip: it grows with the
 * link's variability (jitter, a retransmission now and then), not only its mean. */
double kvedge_health_rto_ms(kvedge_health_t *h, const char *node);

/* Applies the time-based transitions (silence) to every node as of now_ms. Queries apply them
 * lazily to the node they read, so ticking is only needed to make foreach and monitors
 * timely. Returns how many nodes changed state since last evaluated, or KVEDGE_EINVAL. */
int kvedge_health_tick(kvedge_health_t *h, uint64_t now_ms);

/* The node's state at now_ms (a kvedge_health_state_t, >= 0), or a negative error:
 * KVEDGE_EINVAL (bad arguments), KVEDGE_ENOTFOUND (never mentioned). */
int kvedge_health_state(kvedge_health_t *h, const char *node, uint64_t now_ms);

/* The planner's weight for the node at now_ms: 0 when DOWN; on probation
 * MIN + (1 - MIN) * elapsed / READMIT_MS (MIN = KVEDGE_HEALTH_READMIT_WEIGHT_MIN), reaching 1
 * at READMIT_MS, which ends the probation; otherwise 1; a SUSPECT node is capped at
 * KVEDGE_HEALTH_SUSPECT_WEIGHT. 0 for bad arguments or an unknown node. */
double kvedge_health_weight(kvedge_health_t *h, const char *node, uint64_t now_ms);

/* Whether a planner may choose the node at now_ms: true for UP (on probation or not) and
 * SUSPECT, false for DOWN, unknown nodes and bad arguments. */
bool kvedge_health_usable(kvedge_health_t *h, const char *node, uint64_t now_ms);

/* Copies the node's view at now_ms into *out. Errors: KVEDGE_EINVAL, KVEDGE_ENOTFOUND. */
int kvedge_health_get(kvedge_health_t *h, const char *node, uint64_t now_ms,
                      kvedge_health_info_t *out);

/* Number of nodes tracked; 0 for a NULL table. */
size_t kvedge_health_count(kvedge_health_t *h);

/* Calls fn for every node, in the order they were added, on a snapshot taken at now_ms: the
 * lock is not held during the calls, so fn may call back into h. Returns 0, fn's first
 * nonzero return, or KVEDGE_EINVAL (NULL h or fn), KVEDGE_ENOMEM (no snapshot; fn never
 * called). */
int kvedge_health_foreach(kvedge_health_t *h, uint64_t now_ms, kvedge_health_fn fn, void *arg);

/* "UP", "SUSPECT", "DOWN", or "?" for anything else; static storage. */
const char *kvedge_health_state_name(int state);

/* Longest reason an observer is given, in bytes, without the terminating NUL. */
#define KVEDGE_HEALTH_REASON_MAX 159

/* Hears one state change of one node: from and to differ, reason says why in words ("silent
 * for 3012 ms", "4 consecutive failures, last: deadline passed", "failed on probation: peer
 * is shutting down or gone", "heard again after 5230 ms" (a DOWN node re-admitted on probation),
 * "heard again", "a request succeeded"), now_ms is the stamp of the call that saw it. node and
 * reason are valid only during the call. */
typedef void (*kvedge_health_observer_fn)(const char *node, kvedge_health_state_t from,
                                          kvedge_health_state_t to, const char *reason,
                                          uint64_t now_ms, void *arg);

/* Sets the table's observer (fn NULL removes it). It hears every state change, on the thread
 * whose call (an input, a tick, a query) made it, after that call released the table's lock:
 * fn may call back into h. The changes one call makes arrive in order; calls of different
 * threads may interleave. A change collected before the observer was replaced may still reach
 * the old one, so the old arg must stay valid until calls in flight have returned.
 * Errors: KVEDGE_EINVAL (NULL table). */
int kvedge_health_set_observer(kvedge_health_t *h, kvedge_health_observer_fn fn, void *arg);

/* State changes since the table was made, all nodes together (observed or not); 0 for NULL. */
uint64_t kvedge_health_transitions(kvedge_health_t *h);

#ifdef __cplusplus
}
#endif
#endif
