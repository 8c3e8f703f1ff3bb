/* The I/O Analyzer's access pattern in bounded memory: the hot set of cached prefixes,
 * found with the Space-Saving algorithm (Metwally, Agrawal, El Abbadi, 2005), and for each
 * tracked prefix its accesses per layer and per head.
 *
 * A table of capacity k keeps at most k prefixes. An access to a tracked prefix adds to its
 * count; an access to an untracked one, when the table is full, replaces the prefix with the
 * smallest count m and starts the newcomer at m + 1 with error m. Any prefix accessed more
 * than N/k times in N accesses is tracked, and a tracked count overestimates the truth by at
 * most its error (≤ N/k). Memory is fixed at creation (kvedge_hot_bytes), however many
 * distinct prefixes pass.
 *
 * Thread-safety: a table has one mutex, held for O(log k) per access (a min-heap of counts).
 * The store node keeps one table per worker thread and merges them only when asked, so the
 * lock is never contended on the request path. */
#ifndef KVEDGE_MONITOR_HOT_H
#define KVEDGE_MONITOR_HOT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_HOT_KEY_BYTES    32  /* a prefix: a chunk id */
#define KVEDGE_HOT_LABEL_BYTES  64  /* what the prefix belongs to (a model id), cut there */
#define KVEDGE_HOT_LAYERS       128 /* per-layer counts kept: layers >= this count in the last */
#define KVEDGE_HOT_HEADS        64  /* per-head counts kept: heads >= this count in the last */
#define KVEDGE_HOT_MAX_CAPACITY 65536

typedef struct kvedge_hot_t kvedge_hot_t;

/* One tracked prefix, as reported. */
typedef struct {
    uint8_t key[KVEDGE_HOT_KEY_BYTES];
    char label[KVEDGE_HOT_LABEL_BYTES + 1];
    uint64_t count; /* accesses counted (an upper bound of the truth) */
    uint64_t error; /* count - error is a lower bound of the truth */
    uint64_t bytes; /* bytes served for it while tracked */
    uint32_t layers[KVEDGE_HOT_LAYERS];
    uint32_t heads[KVEDGE_HOT_HEADS];
} kvedge_hot_entry_t;

/* A table tracking at most capacity (1 … KVEDGE_HOT_MAX_CAPACITY) prefixes. NULL on bad
 * capacity or out of memory. Caller owns it. */
kvedge_hot_t *kvedge_hot_new(size_t capacity);
void kvedge_hot_destroy(kvedge_hot_t **self_p);

/* Bytes the table holds, fixed at creation. */
size_t kvedge_hot_bytes(const kvedge_hot_t *h);

/* One access of `bytes` bytes to prefix key (label: its model id, may be NULL; the first one
 * given while the key is tracked is kept) at layer and head (head UINT32_MAX: every head of
 * the layer, counted once in no head slot). Counts one access toward the ranking, however
 * many blocks it read. */
void kvedge_hot_touch(kvedge_hot_t *h, const uint8_t key[KVEDGE_HOT_KEY_BYTES], const char *label,
                      uint32_t layer, uint32_t head, uint64_t bytes);

/* Total accesses seen (N). */
uint64_t kvedge_hot_total(const kvedge_hot_t *h);

/* Keys ever admitted to the table (replacements included). */
uint64_t kvedge_hot_admitted(const kvedge_hot_t *h);

/* The top n entries by count (ties: smaller error first), copied into out; returns how many
 * (≤ n, ≤ capacity). Merges `tables` tables (their union: counts and errors of one key add;
 * a key tracked by only some tables gets, from each other full table, that table's minimum
 * count as both count and error, the mergeable-summaries rule). */
size_t kvedge_hot_top(kvedge_hot_t *const *tables, size_t n_tables, kvedge_hot_entry_t *out,
                      size_t n);

/* Forgets everything (counts, keys). */
void kvedge_hot_reset(kvedge_hot_t *h);

#ifdef __cplusplus
}
#endif
#endif
