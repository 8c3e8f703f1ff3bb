/* The storage optimizer of a store node (the cache optimizer, docs/operations.md "Storage
 * optimizer"): a thread that, every interval, prepares the configured lower-precision variants
 * of the prefixes the I/O Analyzer finds hot (kvedge_engine_prepare_variant), and demotes the
 * blocks nobody read for a while (kvedge_engine_demote_idle). Under capacity pressure the
 * engine itself demotes before it evicts (kvedge_engine_opts_t.pressure_demote); the node
 * turns that on with the optimizer. Off unless the `optimize` setting is on. */
#ifndef KVEDGE_STORE_NODE_OPTIMIZER_H
#define KVEDGE_STORE_NODE_OPTIMIZER_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/engine/engine.h"
#include "store/node/analyzer.h"
#include "access/codec/prec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Defaults of the node's settings (store/node/settings.c). */
#define KVEDGE_OPTIMIZER_INTERVAL_S_DEFAULT 60
#define KVEDGE_OPTIMIZER_IDLE_S_DEFAULT     3600
#define KVEDGE_OPTIMIZER_HOT_READS_DEFAULT  16
#define KVEDGE_OPTIMIZER_HOT_TOP_DEFAULT    10
#define KVEDGE_OPTIMIZER_DEMOTE_DEFAULT     "int4-g32"
#define KVEDGE_OPTIMIZER_PREPARE_DEFAULT    "int4-g32"
/* Hot prefixes one pass looks at, at most: the analyzer's table size. */
#define KVEDGE_OPTIMIZER_HOT_TOP_MAX KVEDGE_ANALYZER_HOT_CAPACITY
/* Blocks one pass demotes at most: a pass stays short; the next one goes on. */
#define KVEDGE_OPTIMIZER_DEMOTE_MAX_PER_PASS 65536

typedef struct {
    kvedge_engine_t *engine;     /* not owned; outlives the optimizer */
    kvedge_analyzer_t *analyzer; /* not owned; NULL: no hot prefixes (monitoring off) */
    uint32_t interval_s;         /* between passes; 0 = the default */
    kvedge_prec_t demote_to;     /* the rung cold blocks are demoted to */
    uint32_t idle_s;             /* unread this long, a block is cold; 0 = never demote idle */
    kvedge_prec_t prepare[KVEDGE_PREC_MAX_ACCEPT]; /* rungs prepared for hot prefixes */
    size_t n_prepare;                              /* 0: prepare nothing */
    uint32_t hot_reads; /* accesses in one interval that make a top prefix hot (>= 1) */
    uint32_t hot_top;   /* prefixes of the analyzer's top looked at (1 .. HOT_TOP_MAX) */
    bool pressure;      /* the engine demotes under pressure (reported, not acted on) */
} kvedge_optimizer_opts_t;

/* What passes did: the last one and the totals since start. */
typedef struct {
    uint64_t passes;
    uint64_t last_pass_ms; /* wall clock when the last pass ended; 0 = none yet */
    uint64_t last_duration_ms;
    int last_error;         /* 0, or the error that cut the last pass short */
    uint32_t last_hot;      /* hot prefixes the last pass found */
    uint64_t last_prepared; /* variants it stored */
    uint64_t last_prepared_bytes;
    uint64_t last_demoted;    /* blocks it demoted */
    int64_t last_saved_bytes; /* bytes its demotions freed */
    uint64_t prepared;        /* totals */
    uint64_t prepared_bytes;
    uint64_t prepare_full; /* variants not prepared: no room within capacity */
    uint64_t demoted;
    int64_t saved_bytes;
} kvedge_optimizer_stats_t;

typedef struct kvedge_optimizer_t kvedge_optimizer_t;

/* Checks opts (a rung to demote to that is coarser than lossless, valid prepare rungs without
 * repeats and not lossless, hot_reads >= 1, hot_top within bounds; the engine is not looked
 * at): 0 or KVEDGE_EINVAL with why. */
int kvedge_optimizer_check(const kvedge_optimizer_opts_t *opts, char *why, size_t why_len);

/* Starts the thread: its first pass one interval after the start. opts is copied. Caller owns
 * *out. Errors: those of kvedge_optimizer_check, KVEDGE_EINVAL (no engine), KVEDGE_ENOMEM. */
int kvedge_optimizer_start(const kvedge_optimizer_opts_t *opts, kvedge_optimizer_t **out, char *why,
                           size_t why_len);

/* One pass now, on the caller's thread (serialized with the thread's): hot prefixes' variants,
 * then idle demotion; logged like the thread's. *pass (may be NULL) receives the stats after
 * it. Returns 0 or the error that cut it short (what was done stays done). */
int kvedge_optimizer_pass(kvedge_optimizer_t *o, kvedge_optimizer_stats_t *pass);

/* The stats so far. Thread-safe. */
void kvedge_optimizer_stats(kvedge_optimizer_t *o, kvedge_optimizer_stats_t *out);

/* Parses the `demote_to` and `prepare` settings' text ("" or "none": prepare nothing) into
 * opts and checks the whole as kvedge_optimizer_check. 0 or KVEDGE_EINVAL with why. */
int kvedge_optimizer_parse(const char *demote_to, const char *prepare,
                           kvedge_optimizer_opts_t *opts, char *why, size_t why_len);

/* Adds its settings and stats to obj (the MONITOR document's "optimizer"). 0 or -1. */
int kvedge_optimizer_json(kvedge_optimizer_t *o, cJSON *obj);

/* Stops the thread after the pass in progress. NULL-safe, idempotent, nulls *self_p. */
void kvedge_optimizer_destroy(kvedge_optimizer_t **self_p);

#ifdef __cplusplus
}
#endif
#endif
