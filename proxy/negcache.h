/* Negative cache: remembers for a while that a source does not have a key (or timed out on
 * it), so the proxy stops sending the same doomed request and waiting out its deadline. */
#ifndef KVEDGE_PROXY_NEGCACHE_H
#define KVEDGE_PROXY_NEGCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Longest source name in bytes, without the terminating NUL. */
#define KVEDGE_NEGCACHE_SOURCE_MAX 64
/* Longest key in bytes (keys are binary: block ids, digests). */
#define KVEDGE_NEGCACHE_KEY_MAX 64
/* Largest capacity kvedge_negcache_new accepts (entries are allocated up front). */
#define KVEDGE_NEGCACHE_MAX_ENTRIES (1u << 20)

typedef struct kvedge_negcache_t kvedge_negcache_t;

typedef struct {
    size_t count;         /* entries stored, expired ones not yet dropped included */
    size_t capacity;      /* most entries stored at once */
    uint64_t hits;        /* contains() that found a live entry */
    uint64_t misses;      /* contains() that did not (absent or expired) */
    uint64_t evictions;   /* live entries dropped by add() at capacity */
    uint64_t expirations; /* expired entries dropped (by contains, add or purge) */
} kvedge_negcache_stats_t;

/* Entry (source, key) added at now_ms with ttl_ms expires at now_ms + ttl_ms (saturating):
 * it is contained while now_ms < that time and not from that instant on. Times are the
 * caller's monotonic clock in milliseconds. Memory is bounded: at capacity, add() evicts the
 * entry closest to expiry (earliest expiry time; ties go to the entry added or refreshed
 * first), which is an already expired entry whenever there is one. This is not LRU: lookups
 * do not extend an entry. All functions are thread-safe (one mutex per cache). */

/* Creates a cache of capacity entries, allocated up front (about 200 bytes each),
 * whose add() with ttl_ms 0 uses default_ttl_ms. Returns NULL when capacity is 0 or above
 * KVEDGE_NEGCACHE_MAX_ENTRIES, default_ttl_ms is 0, or out of memory. Caller owns the return
 * value. */
kvedge_negcache_t *kvedge_negcache_new(size_t capacity, uint64_t default_ttl_ms);

/* Destroys the cache. NULL-safe, idempotent, nulls *self_p. */
void kvedge_negcache_destroy(kvedge_negcache_t **self_p);

/* Remembers that source lacks key (key_len bytes, copied) until now_ms + ttl_ms; ttl_ms 0
 * means the default. An entry already there is refreshed: its expiry becomes the new one,
 * longer or shorter (the latest observation wins). Evicts one entry when full.
 * Errors: KVEDGE_EINVAL (NULL cache, source or key; source empty or longer than
 * KVEDGE_NEGCACHE_SOURCE_MAX; key_len 0 or above KVEDGE_NEGCACHE_KEY_MAX); nothing changed. */
int kvedge_negcache_add(kvedge_negcache_t *nc, const char *source, const void *key, size_t key_len,
                        uint64_t now_ms, uint64_t ttl_ms);

/* Whether source is known to lack key at now_ms. An expired entry is dropped and does not
 * count. false for invalid arguments (as add() defines them). */
bool kvedge_negcache_contains(kvedge_negcache_t *nc, const char *source, const void *key,
                              size_t key_len, uint64_t now_ms);

/* Forgets (source, key), e.g. once the source announces it has the key, expired or not.
 * Errors: KVEDGE_EINVAL (as add()), KVEDGE_ENOTFOUND (no such entry). */
int kvedge_negcache_remove(kvedge_negcache_t *nc, const char *source, const void *key,
                           size_t key_len);

/* Drops every entry expired at now_ms. Returns how many were dropped, or KVEDGE_EINVAL. */
int kvedge_negcache_purge_expired(kvedge_negcache_t *nc, uint64_t now_ms);

/* Entries stored, including expired ones not dropped yet; 0 for a NULL cache. */
size_t kvedge_negcache_count(kvedge_negcache_t *nc);

/* Copies the counters into *out. Errors: KVEDGE_EINVAL (NULL argument). */
int kvedge_negcache_stats(kvedge_negcache_t *nc, kvedge_negcache_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif
