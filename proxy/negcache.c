/* Negative cache (see negcache.h): a fixed pool of entries, an open-addressing index on
 * (source, key) with linear probing and backward-shift deletion, and a min-heap on expiry
 * that picks eviction victims and makes purging cost only what it drops. One mutex. */
#include "proxy/negcache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/error.h"

#define S_NONE UINT32_MAX /* empty index slot */

typedef struct {
    uint64_t expires_ms; /* contained while now < this */
    uint64_t seq;        /* order of the latest add; breaks expiry ties */
    uint64_t hash;       /* of (source, key), kept to skip compares and re-probe on delete */
    uint32_t heap_pos;   /* position in the heap */
    uint8_t source_len;
    uint8_t key_len;
    char source[KVEDGE_NEGCACHE_SOURCE_MAX];
    uint8_t key[KVEDGE_NEGCACHE_KEY_MAX];
} s_entry_t;

struct kvedge_negcache_t {
    pthread_mutex_t mu;            /* guards everything below */
    s_entry_t *entries;            /* [capacity] pool */
    uint32_t *free_list;           /* [capacity] unused pool positions, a stack */
    size_t free_count;             /* entries on free_list */
    uint32_t *heap;                /* [capacity] pool positions, min-heap on (expires_ms, seq) */
    size_t count;                  /* entries in use = heap size */
    size_t capacity;               /* pool size */
    uint32_t *index;               /* [index_mask + 1] pool positions by hash; S_NONE = empty */
    size_t index_mask;             /* index size - 1; size is a power of two >= 2 * capacity */
    uint64_t default_ttl_ms;       /* used by add() with ttl 0 */
    uint64_t seq;                  /* add counter */
    kvedge_negcache_stats_t stats; /* counters; count and capacity filled in on read */
};

/* A validated lookup key. */
typedef struct {
    const char *source;
    size_t source_len;
    const uint8_t *key;
    size_t key_len;
    uint64_t hash;
} s_lookup_t;

static uint64_t s_fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Fills *lk; false when the arguments are not a valid (source, key). The source length is
 * hashed too, so ("ab", "c") and ("a", "bc") differ before the final compare. */
static bool s_lookup(s_lookup_t *lk, const char *source, const void *key, size_t key_len)
{
    if (!source || !key || key_len == 0 || key_len > KVEDGE_NEGCACHE_KEY_MAX)
        return false;
    size_t source_len = strnlen(source, KVEDGE_NEGCACHE_SOURCE_MAX + 1);
    if (source_len == 0 || source_len > KVEDGE_NEGCACHE_SOURCE_MAX)
        return false;
    uint8_t len = (uint8_t)source_len;
    uint64_t h = s_fnv(1469598103934665603ull, &len, 1);
    h = s_fnv(h, source, source_len);
    h = s_fnv(h, key, key_len);
    h ^= h >> 29; /* FNV's low bits are weak; the index uses them */
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    *lk = (s_lookup_t){source, source_len, key, key_len, h};
    return true;
}

static bool s_matches(const s_entry_t *e, const s_lookup_t *lk)
{
    return e->hash == lk->hash && e->source_len == lk->source_len && e->key_len == lk->key_len &&
           memcmp(e->source, lk->source, lk->source_len) == 0 &&
           memcmp(e->key, lk->key, lk->key_len) == 0;
}

/* Caller holds nc->mu. Index slot of the entry for lk, or the empty slot where it goes. */
static size_t s_slot(const kvedge_negcache_t *nc, const s_lookup_t *lk)
{
    size_t i = (size_t)lk->hash & nc->index_mask;
    while (nc->index[i] != S_NONE && !s_matches(&nc->entries[nc->index[i]], lk))
        i = (i + 1) & nc->index_mask;
    return i;
}

/* Heap order: earlier expiry first, then earlier add. */
static bool s_before(const kvedge_negcache_t *nc, uint32_t a, uint32_t b)
{
    const s_entry_t *x = &nc->entries[a], *y = &nc->entries[b];
    return x->expires_ms != y->expires_ms ? x->expires_ms < y->expires_ms : x->seq < y->seq;
}

static void s_heap_put(kvedge_negcache_t *nc, size_t pos, uint32_t e)
{
    nc->heap[pos] = e;
    nc->entries[e].heap_pos = (uint32_t)pos;
}

/* Restores the heap order around pos after its entry's key changed. */
static void s_heap_fix(kvedge_negcache_t *nc, size_t pos)
{
    uint32_t e = nc->heap[pos];
    while (pos > 0 && s_before(nc, e, nc->heap[(pos - 1) / 2])) {
        s_heap_put(nc, pos, nc->heap[(pos - 1) / 2]);
        pos = (pos - 1) / 2;
    }
    for (;;) {
        size_t child = 2 * pos + 1;
        if (child >= nc->count)
            break;
        if (child + 1 < nc->count && s_before(nc, nc->heap[child + 1], nc->heap[child]))
            child++;
        if (!s_before(nc, nc->heap[child], e))
            break;
        s_heap_put(nc, pos, nc->heap[child]);
        pos = child;
    }
    s_heap_put(nc, pos, e);
}

/* Caller holds nc->mu. Drops the entry at index slot: backward-shift deletion keeps every
 * probe chain unbroken without tombstones. */
static void s_drop(kvedge_negcache_t *nc, size_t slot)
{
    uint32_t e = nc->index[slot];
    size_t pos = nc->entries[e].heap_pos;
    nc->count--;
    if (pos != nc->count) {
        s_heap_put(nc, pos, nc->heap[nc->count]);
        s_heap_fix(nc, pos);
    }
    nc->free_list[nc->free_count++] = e;

    size_t hole = slot, i = slot;
    for (;;) {
        i = (i + 1) & nc->index_mask;
        uint32_t moved = nc->index[i];
        if (moved == S_NONE)
            break;
        size_t home = (size_t)nc->entries[moved].hash & nc->index_mask;
        /* moved may fill the hole only if its home is not cyclically in (hole, i] */
        if (((i - home) & nc->index_mask) >= ((i - hole) & nc->index_mask)) {
            nc->index[hole] = moved;
            hole = i;
        }
    }
    nc->index[hole] = S_NONE;
}

/* Caller holds nc->mu. Index slot of the entry at pool position e. */
static size_t s_slot_of(const kvedge_negcache_t *nc, uint32_t e)
{
    size_t i = (size_t)nc->entries[e].hash & nc->index_mask;
    while (nc->index[i] != e)
        i = (i + 1) & nc->index_mask;
    return i;
}

kvedge_negcache_t *kvedge_negcache_new(size_t capacity, uint64_t default_ttl_ms)
{
    if (capacity == 0 || capacity > KVEDGE_NEGCACHE_MAX_ENTRIES || default_ttl_ms == 0)
        return NULL;
    size_t slots = 1;
    while (slots < 2 * capacity)
        slots <<= 1;
    kvedge_negcache_t *nc = calloc(1, sizeof *nc);
    if (!nc)
        return NULL;
    nc->entries = malloc(capacity * sizeof *nc->entries);
    nc->free_list = malloc(capacity * sizeof *nc->free_list);
    nc->heap = malloc(capacity * sizeof *nc->heap);
    nc->index = malloc(slots * sizeof *nc->index);
    if (!nc->entries || !nc->free_list || !nc->heap || !nc->index ||
        pthread_mutex_init(&nc->mu, NULL) != 0) {
        free(nc->index);
        free(nc->heap);
        free(nc->free_list);
        free(nc->entries);
        free(nc);
        return NULL;
    }
    memset(nc->index, 0xff, slots * sizeof *nc->index); /* all S_NONE */
    for (size_t i = 0; i < capacity; i++)
        nc->free_list[i] = (uint32_t)(capacity - 1 - i); /* hand out 0, 1, 2... first */
    nc->free_count = capacity;
    nc->capacity = capacity;
    nc->index_mask = slots - 1;
    nc->default_ttl_ms = default_ttl_ms;
    return nc;
}

void kvedge_negcache_destroy(kvedge_negcache_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_negcache_t *nc = *self_p;
    pthread_mutex_destroy(&nc->mu);
    free(nc->index);
    free(nc->heap);
    free(nc->free_list);
    free(nc->entries);
    free(nc);
    *self_p = NULL;
}

int kvedge_negcache_add(kvedge_negcache_t *nc, const char *source, const void *key, size_t key_len,
                        uint64_t now_ms, uint64_t ttl_ms)
{
    s_lookup_t lk;
    if (!nc || !s_lookup(&lk, source, key, key_len))
        return KVEDGE_EINVAL;
    if (ttl_ms == 0)
        ttl_ms = nc->default_ttl_ms;
    uint64_t expires = ttl_ms > UINT64_MAX - now_ms ? UINT64_MAX : now_ms + ttl_ms;

    pthread_mutex_lock(&nc->mu);
    size_t slot = s_slot(nc, &lk);
    uint32_t e = nc->index[slot];
    if (e == S_NONE) {
        if (nc->count == nc->capacity) {
            uint32_t victim = nc->heap[0];
            if (nc->entries[victim].expires_ms <= now_ms)
                nc->stats.expirations++;
            else
                nc->stats.evictions++;
            s_drop(nc, s_slot_of(nc, victim));
            slot = s_slot(nc, &lk); /* the drop may have shifted the chain */
        }
        e = nc->free_list[--nc->free_count];
        s_entry_t *ent = &nc->entries[e];
        ent->hash = lk.hash;
        ent->source_len = (uint8_t)lk.source_len;
        ent->key_len = (uint8_t)lk.key_len;
        memcpy(ent->source, lk.source, lk.source_len);
        memcpy(ent->key, lk.key, lk.key_len);
        nc->index[slot] = e;
        ent->heap_pos = (uint32_t)nc->count;
        nc->heap[nc->count++] = e;
    }
    nc->entries[e].expires_ms = expires;
    nc->entries[e].seq = nc->seq++;
    s_heap_fix(nc, nc->entries[e].heap_pos);
    pthread_mutex_unlock(&nc->mu);
    return KVEDGE_OK;
}

bool kvedge_negcache_contains(kvedge_negcache_t *nc, const char *source, const void *key,
                              size_t key_len, uint64_t now_ms)
{
    s_lookup_t lk;
    if (!nc || !s_lookup(&lk, source, key, key_len))
        return false;
    pthread_mutex_lock(&nc->mu);
    size_t slot = s_slot(nc, &lk);
    uint32_t e = nc->index[slot];
    bool live = false;
    if (e != S_NONE) {
        if (now_ms < nc->entries[e].expires_ms) {
            live = true;
        } else {
            s_drop(nc, slot);
            nc->stats.expirations++;
        }
    }
    if (live)
        nc->stats.hits++;
    else
        nc->stats.misses++;
    pthread_mutex_unlock(&nc->mu);
    return live;
}

int kvedge_negcache_remove(kvedge_negcache_t *nc, const char *source, const void *key,
                           size_t key_len)
{
    s_lookup_t lk;
    if (!nc || !s_lookup(&lk, source, key, key_len))
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&nc->mu);
    size_t slot = s_slot(nc, &lk);
    bool found = nc->index[slot] != S_NONE;
    if (found)
        s_drop(nc, slot);
    pthread_mutex_unlock(&nc->mu);
    return found ? KVEDGE_OK : KVEDGE_ENOTFOUND;
}

int kvedge_negcache_purge_expired(kvedge_negcache_t *nc, uint64_t now_ms)
{
    if (!nc)
        return KVEDGE_EINVAL;
    int dropped = 0;
    pthread_mutex_lock(&nc->mu);
    while (nc->count > 0 && nc->entries[nc->heap[0]].expires_ms <= now_ms) {
        s_drop(nc, s_slot_of(nc, nc->heap[0]));
        dropped++;
    }
    nc->stats.expirations += (uint64_t)dropped;
    pthread_mutex_unlock(&nc->mu);
    return dropped;
}

size_t kvedge_negcache_count(kvedge_negcache_t *nc)
{
    if (!nc)
        return 0;
    pthread_mutex_lock(&nc->mu);
    size_t count = nc->count;
    pthread_mutex_unlock(&nc->mu);
    return count;
}

int kvedge_negcache_stats(kvedge_negcache_t *nc, kvedge_negcache_stats_t *out)
{
    if (!nc || !out)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&nc->mu);
    *out = nc->stats;
    out->count = nc->count;
    out->capacity = nc->capacity;
    pthread_mutex_unlock(&nc->mu);
    return KVEDGE_OK;
}
