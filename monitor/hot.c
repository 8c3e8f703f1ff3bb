/* Space-Saving heavy hitters (see hot.h): a fixed pool of slots, an open-addressing index on
 * the key (linear probing, backward-shift deletion) and a min-heap of counts whose root is
 * the slot to replace. Everything is allocated by kvedge_hot_new; nothing after. */
#include "monitor/hot.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define S_EMPTY UINT32_MAX /* empty index slot */

typedef struct {
    uint8_t key[KVEDGE_HOT_KEY_BYTES];
    char label[KVEDGE_HOT_LABEL_BYTES + 1];
    uint64_t count;
    uint64_t error;
    uint64_t bytes;
    uint64_t hash;     /* of key, kept for re-probing on delete */
    uint32_t heap_pos; /* position in the heap */
    uint32_t layers[KVEDGE_HOT_LAYERS];
    uint32_t heads[KVEDGE_HOT_HEADS];
} s_slot_t;

struct kvedge_hot_t {
    pthread_mutex_t mu; /* guards everything below */
    size_t capacity;
    size_t n;          /* slots in use = heap size */
    s_slot_t *slots;   /* [capacity] */
    uint32_t *heap;    /* [capacity] slot positions, min-heap on count */
    uint32_t *index;   /* [index_mask + 1] slot positions by hash; S_EMPTY = empty */
    size_t index_mask; /* index size - 1; a power of two >= 2 * capacity */
    uint64_t total;    /* accesses seen */
    uint64_t admitted; /* keys admitted, replacements included */
    size_t bytes;      /* what the four allocations hold */
};

static uint64_t s_hash(const uint8_t key[KVEDGE_HOT_KEY_BYTES])
{
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < KVEDGE_HOT_KEY_BYTES; i += 8) {
        uint64_t w;
        memcpy(&w, key + i, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    return h;
}

kvedge_hot_t *kvedge_hot_new(size_t capacity)
{
    if (capacity < 1 || capacity > KVEDGE_HOT_MAX_CAPACITY)
        return NULL;
    size_t isize = 2;
    while (isize < 2 * capacity)
        isize *= 2;
    kvedge_hot_t *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->slots = calloc(capacity, sizeof *h->slots);
    h->heap = calloc(capacity, sizeof *h->heap);
    h->index = malloc(isize * sizeof *h->index);
    if (!h->slots || !h->heap || !h->index || pthread_mutex_init(&h->mu, NULL) != 0) {
        free(h->index);
        free(h->heap);
        free(h->slots);
        free(h);
        return NULL;
    }
    memset(h->index, 0xff, isize * sizeof *h->index);
    h->capacity = capacity;
    h->index_mask = isize - 1;
    h->bytes =
        sizeof *h + capacity * (sizeof *h->slots + sizeof *h->heap) + isize * sizeof *h->index;
    return h;
}

void kvedge_hot_destroy(kvedge_hot_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_hot_t *h = *self_p;
    pthread_mutex_destroy(&h->mu);
    free(h->index);
    free(h->heap);
    free(h->slots);
    free(h);
    *self_p = NULL;
}

size_t kvedge_hot_bytes(const kvedge_hot_t *h)
{
    return h ? h->bytes : 0;
}

/* ---- index ---- */

/* The index position holding key, or of the empty slot where it would go. */
static size_t s_find(const kvedge_hot_t *h, const uint8_t *key, uint64_t hash)
{
    size_t i = hash & h->index_mask;
    for (; h->index[i] != S_EMPTY; i = (i + 1) & h->index_mask) {
        const s_slot_t *s = &h->slots[h->index[i]];
        if (s->hash == hash && memcmp(s->key, key, KVEDGE_HOT_KEY_BYTES) == 0)
            break;
    }
    return i;
}

/* Removes index position i, shifting back the entries of the probe run behind it. */
static void s_index_del(kvedge_hot_t *h, size_t i)
{
    size_t j = i;
    for (;;) {
        j = (j + 1) & h->index_mask;
        if (h->index[j] == S_EMPTY)
            break;
        size_t home = h->slots[h->index[j]].hash & h->index_mask;
        /* Entry j may move to hole i unless its home lies cyclically in (i, j]. */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            h->index[i] = h->index[j];
            i = j;
        }
    }
    h->index[i] = S_EMPTY;
}

/* ---- heap ---- */

static void s_heap_set(kvedge_hot_t *h, size_t pos, uint32_t slot)
{
    h->heap[pos] = slot;
    h->slots[slot].heap_pos = (uint32_t)pos;
}

static void s_sift_up(kvedge_hot_t *h, size_t pos)
{
    uint32_t slot = h->heap[pos];
    uint64_t c = h->slots[slot].count;
    while (pos > 0) {
        size_t parent = (pos - 1) / 2;
        if (h->slots[h->heap[parent]].count <= c)
            break;
        s_heap_set(h, pos, h->heap[parent]);
        pos = parent;
    }
    s_heap_set(h, pos, slot);
}

static void s_sift_down(kvedge_hot_t *h, size_t pos)
{
    uint32_t slot = h->heap[pos];
    uint64_t c = h->slots[slot].count;
    for (;;) {
        size_t l = 2 * pos + 1, m = pos;
        uint64_t mc = c;
        if (l < h->n && h->slots[h->heap[l]].count < mc) {
            m = l;
            mc = h->slots[h->heap[l]].count;
        }
        if (l + 1 < h->n && h->slots[h->heap[l + 1]].count < mc)
            m = l + 1;
        if (m == pos)
            break;
        s_heap_set(h, pos, h->heap[m]);
        pos = m;
    }
    s_heap_set(h, pos, slot);
}

/* ---- access ---- */

static void s_sat_inc(uint32_t *v)
{
    if (*v < UINT32_MAX)
        (*v)++;
}

static void s_set_label(s_slot_t *s, const char *label)
{
    size_t n = label ? strnlen(label, KVEDGE_HOT_LABEL_BYTES) : 0;
    memcpy(s->label, label ? label : "", n);
    s->label[n] = '\0';
}

void kvedge_hot_touch(kvedge_hot_t *h, const uint8_t key[KVEDGE_HOT_KEY_BYTES], const char *label,
                      uint32_t layer, uint32_t head, uint64_t bytes)
{
    if (!h || !key)
        return;
    uint64_t hash = s_hash(key);
    pthread_mutex_lock(&h->mu);
    h->total++;
    size_t i = s_find(h, key, hash);
    s_slot_t *s;
    if (h->index[i] != S_EMPTY) {
        s = &h->slots[h->index[i]];
        s->count++;
        s->bytes += bytes;
        if (!s->label[0] && label)
            s_set_label(s, label);
    } else {
        uint32_t slot;
        uint64_t floor = 0;
        bool fresh = h->n < h->capacity;
        if (fresh) {
            slot = (uint32_t)h->n;
            s_heap_set(h, h->n++, slot);
        } else {
            /* Replace the smallest count m: the newcomer starts at m + 1 with error m. */
            slot = h->heap[0];
            floor = h->slots[slot].count;
            s_index_del(h, s_find(h, h->slots[slot].key, h->slots[slot].hash));
            i = s_find(h, key, hash); /* the deletion may have moved the empty slot */
        }
        s = &h->slots[slot];
        uint32_t heap_pos = s->heap_pos;
        memset(s, 0, sizeof *s);
        s->heap_pos = heap_pos;
        memcpy(s->key, key, KVEDGE_HOT_KEY_BYTES);
        s->hash = hash;
        s->count = floor + 1;
        s->error = floor;
        s->bytes = bytes;
        s_set_label(s, label);
        h->index[i] = slot;
        h->admitted++;
        if (fresh)
            s_sift_up(h, s->heap_pos); /* count 1 at the heap's end */
    }
    s_sat_inc(&s->layers[layer < KVEDGE_HOT_LAYERS ? layer : KVEDGE_HOT_LAYERS - 1]);
    if (head != UINT32_MAX)
        s_sat_inc(&s->heads[head < KVEDGE_HOT_HEADS ? head : KVEDGE_HOT_HEADS - 1]);
    s_sift_down(h, s->heap_pos); /* its count grew */
    pthread_mutex_unlock(&h->mu);
}

uint64_t kvedge_hot_total(const kvedge_hot_t *h)
{
    if (!h)
        return 0;
    kvedge_hot_t *w = (kvedge_hot_t *)h; /* the mutex is not part of the value */
    pthread_mutex_lock(&w->mu);
    uint64_t t = h->total;
    pthread_mutex_unlock(&w->mu);
    return t;
}

uint64_t kvedge_hot_admitted(const kvedge_hot_t *h)
{
    if (!h)
        return 0;
    kvedge_hot_t *w = (kvedge_hot_t *)h;
    pthread_mutex_lock(&w->mu);
    uint64_t a = h->admitted;
    pthread_mutex_unlock(&w->mu);
    return a;
}

void kvedge_hot_reset(kvedge_hot_t *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    memset(h->index, 0xff, (h->index_mask + 1) * sizeof *h->index);
    h->n = 0;
    h->total = 0;
    h->admitted = 0;
    pthread_mutex_unlock(&h->mu);
}

/* ---- merge ---- */

/* One tracked key of one table, for the merge. */
typedef struct {
    uint8_t key[KVEDGE_HOT_KEY_BYTES];
    uint64_t count;
    uint64_t error;
    uint32_t table; /* position in the sorted, de-duplicated table list */
    uint32_t slot;
} s_rec_t;

/* A key of the union: its records rec[first … first + n) and merged count and error. */
typedef struct {
    const uint8_t *key; /* in the first record */
    size_t first;
    size_t n;
    uint64_t count;
    uint64_t error;
} s_group_t;

static int s_cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (kvedge_hot_t *const *)a;
    uintptr_t y = (uintptr_t) * (kvedge_hot_t *const *)b;
    return (x > y) - (x < y);
}

static int s_cmp_rec(const void *a, const void *b)
{
    const s_rec_t *x = a, *y = b;
    int c = memcmp(x->key, y->key, KVEDGE_HOT_KEY_BYTES);
    if (c)
        return c;
    return (x->table > y->table) - (x->table < y->table);
}

/* Rank order: count descending, then error ascending; the key breaks the remaining ties. */
static int s_cmp_group(const void *a, const void *b)
{
    const s_group_t *x = a, *y = b;
    if (x->count != y->count)
        return x->count < y->count ? 1 : -1;
    if (x->error != y->error)
        return x->error < y->error ? -1 : 1;
    return memcmp(x->key, y->key, KVEDGE_HOT_KEY_BYTES);
}

static uint64_t s_sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint32_t s_sat_add32(uint32_t a, uint32_t b)
{
    return a > UINT32_MAX - b ? UINT32_MAX : a + b;
}

/* Fills entry e from the records of group g. Caller holds every table's mutex. */
static void s_fill(kvedge_hot_entry_t *e, const s_group_t *g, const s_rec_t *recs,
                   kvedge_hot_t *const *t)
{
    memset(e, 0, sizeof *e);
    memcpy(e->key, g->key, KVEDGE_HOT_KEY_BYTES);
    e->count = g->count;
    e->error = g->error;
    for (size_t r = g->first; r < g->first + g->n; r++) {
        const s_slot_t *s = &t[recs[r].table]->slots[recs[r].slot];
        e->bytes = s_sat_add(e->bytes, s->bytes);
        if (!e->label[0])
            memcpy(e->label, s->label, sizeof e->label);
        for (size_t i = 0; i < KVEDGE_HOT_LAYERS; i++)
            e->layers[i] = s_sat_add32(e->layers[i], s->layers[i]);
        for (size_t i = 0; i < KVEDGE_HOT_HEADS; i++)
            e->heads[i] = s_sat_add32(e->heads[i], s->heads[i]);
    }
}

/* Tables are locked in address order (so two concurrent merges cannot deadlock) and a table
 * named twice counts once. */
size_t kvedge_hot_top(kvedge_hot_t *const *tables, size_t n_tables, kvedge_hot_entry_t *out,
                      size_t n)
{
    if (!tables || n_tables == 0 || !out || n == 0)
        return 0;
    kvedge_hot_t **t = malloc(n_tables * sizeof *t);
    if (!t)
        return 0;
    size_t nt = 0;
    for (size_t i = 0; i < n_tables; i++)
        if (tables[i])
            t[nt++] = tables[i];
    qsort(t, nt, sizeof *t, s_cmp_ptr);
    size_t u = 0;
    for (size_t i = 0; i < nt; i++)
        if (u == 0 || t[u - 1] != t[i])
            t[u++] = t[i];
    nt = u;
    for (size_t i = 0; i < nt; i++)
        pthread_mutex_lock(&t[i]->mu);

    size_t n_recs = 0, cap = 0;
    uint64_t min_sum = 0; /* Σ over full tables of their minimum count */
    for (size_t i = 0; i < nt; i++) {
        n_recs += t[i]->n;
        if (t[i]->capacity > cap)
            cap = t[i]->capacity;
        if (t[i]->n == t[i]->capacity)
            min_sum = s_sat_add(min_sum, t[i]->slots[t[i]->heap[0]].count);
    }
    s_rec_t *recs = malloc((n_recs ? n_recs : 1) * sizeof *recs);
    s_group_t *groups = malloc((n_recs ? n_recs : 1) * sizeof *groups);
    size_t got = 0;
    if (recs && groups) {
        size_t r = 0;
        for (size_t i = 0; i < nt; i++) {
            for (size_t j = 0; j < t[i]->n; j++) {
                const s_slot_t *s = &t[i]->slots[j];
                memcpy(recs[r].key, s->key, KVEDGE_HOT_KEY_BYTES);
                recs[r].count = s->count;
                recs[r].error = s->error;
                recs[r].table = (uint32_t)i;
                recs[r].slot = (uint32_t)j;
                r++;
            }
        }
        qsort(recs, n_recs, sizeof *recs, s_cmp_rec);
        size_t ng = 0;
        for (size_t a = 0; a < n_recs;) {
            size_t b = a + 1;
            while (b < n_recs && memcmp(recs[a].key, recs[b].key, KVEDGE_HOT_KEY_BYTES) == 0)
                b++;
            /* A full table that does not track the key adds its minimum to count and error. */
            uint64_t count = min_sum, error = min_sum, own_min = 0;
            for (size_t k = a; k < b; k++) {
                const kvedge_hot_t *ht = t[recs[k].table];
                if (ht->n == ht->capacity)
                    own_min += ht->slots[ht->heap[0]].count;
                count = s_sat_add(count, recs[k].count);
                error = s_sat_add(error, recs[k].error);
            }
            count = count >= own_min ? count - own_min : 0;
            error = error >= own_min ? error - own_min : 0;
            groups[ng++] = (s_group_t){recs[a].key, a, b - a, count, error};
            a = b;
        }
        qsort(groups, ng, sizeof *groups, s_cmp_group);
        got = ng < n ? ng : n;
        if (got > cap)
            got = cap;
        for (size_t g = 0; g < got; g++)
            s_fill(&out[g], &groups[g], recs, t);
    }
    for (size_t i = nt; i-- > 0;)
        pthread_mutex_unlock(&t[i]->mu);
    free(groups);
    free(recs);
    free(t);
    return got;
}
