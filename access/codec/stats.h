/* What a store holds and has done: the statistics an engine keeps and a node reports in
 * STAT (docs/protocol.md, "STAT"; kvedge_client_stat gives them to a client). */
#ifndef KVEDGE_STORE_STATS_H
#define KVEDGE_STORE_STATS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Installed as <kvedge/stats.h>: kvedge_store_stats_t is the client's name,
 * kvedge_engine_stats_t the engine's; the two are one type. Every field counts blocks or
 * bytes of the node's store. */
typedef struct kvedge_store_stats {
    uint64_t blocks;
    uint64_t bytes;      /* encoded bytes stored */
    uint64_t fp16_bytes; /* what the same blocks take as fp16 */
    uint64_t pinned_blocks;
    uint64_t pinned_bytes;
    uint64_t capacity_bytes;
    uint64_t quarantined; /* blocks held in the quarantine column family */
    /* Counters since open. */
    uint64_t puts;
    uint64_t gets;
    uint64_t hits;
    uint64_t misses;
    uint64_t corrupt;
    uint64_t evicted_blocks;
    uint64_t evicted_bytes;
    uint64_t expired;
    uint64_t bytes_written;
    uint64_t bytes_read;
} kvedge_store_stats_t;
typedef kvedge_store_stats_t kvedge_engine_stats_t;

#ifdef __cplusplus
}
#endif
#endif
