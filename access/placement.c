/* Weighted rendezvous hashing (access/placement.h). */
#include "access/placement.h"

#include <math.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "access/codec/error.h"

double kvedge_place_score(const kvedge_chunk_id_t *key, const char *node_id, uint64_t weight)
{
    if (!key || !node_id || weight == 0)
        return 0.0;
    /* The hash of (key, id): the id seeds a hash of the key, so no buffer is assembled. */
    uint64_t seed = XXH3_64bits(node_id, strnlen(node_id, KVEDGE_PLACE_ID_BYTES));
    uint64_t h = XXH3_64bits_withSeed(key->bytes, sizeof key->bytes, seed);
    /* u in (0, 1): the top 53 bits, offset by half a step so neither end is reached. */
    double u = ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    return -(double)weight / log(u);
}

typedef struct {
    double score;
    const char *id;
    uint32_t index;
} s_ranked_t;

/* Descending score; ties by ascending id, then index. */
static bool s_before(const s_ranked_t *a, const s_ranked_t *b)
{
    if (a->score != b->score)
        return a->score > b->score;
    int c = strncmp(a->id, b->id, KVEDGE_PLACE_ID_BYTES);
    if (c != 0)
        return c < 0;
    return a->index < b->index;
}

int kvedge_place_rank(const kvedge_chunk_id_t *key, const kvedge_place_node_t *nodes, size_t n,
                      uint32_t *order)
{
    if (!key || (n && (!nodes || !order)) || n > KVEDGE_PLACE_MAX_NODES)
        return KVEDGE_EINVAL;
    /* Insertion sort without allocation, recomputing a score per comparison: O(n^2) hashes,
     * for n the nodes of one cloud tier. */
    for (size_t i = 0; i < n; i++) {
        s_ranked_t cur = {kvedge_place_score(key, nodes[i].id, nodes[i].weight), nodes[i].id,
                          (uint32_t)i};
        size_t j = i;
        while (j > 0) {
            const kvedge_place_node_t *p = &nodes[order[j - 1]];
            s_ranked_t prev = {kvedge_place_score(key, p->id, p->weight), p->id, order[j - 1]};
            if (!s_before(&cur, &prev))
                break;
            order[j] = order[j - 1];
            j--;
        }
        order[j] = (uint32_t)i;
    }
    return KVEDGE_OK;
}

int kvedge_place_pick(const kvedge_chunk_id_t *key, const kvedge_place_node_t *nodes, size_t n,
                      uint32_t r, uint32_t *out, uint32_t *got)
{
    if (!key || !out || !got || r == 0 || r > KVEDGE_PLACE_MAX_REPLICAS ||
        n > KVEDGE_PLACE_MAX_NODES || (n && !nodes))
        return KVEDGE_EINVAL;
    *got = 0;
    /* The best r usable nodes, kept sorted in out[]: one pass, no allocation. */
    s_ranked_t best[KVEDGE_PLACE_MAX_REPLICAS];
    uint32_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!nodes[i].up || nodes[i].weight == 0)
            continue;
        s_ranked_t cur = {kvedge_place_score(key, nodes[i].id, nodes[i].weight), nodes[i].id,
                          (uint32_t)i};
        if (k == r && !s_before(&cur, &best[k - 1]))
            continue;
        uint32_t j = k < r ? k++ : r - 1;
        while (j > 0 && s_before(&cur, &best[j - 1])) {
            best[j] = best[j - 1];
            j--;
        }
        best[j] = cur;
    }
    for (uint32_t i = 0; i < k; i++)
        out[i] = best[i].index;
    *got = k;
    return KVEDGE_OK;
}

uint32_t kvedge_place_replicas(uint32_t asked, size_t n_up)
{
    uint32_t r = asked ? asked : KVEDGE_PLACE_REPLICAS_DEFAULT;
    if (r > KVEDGE_PLACE_MAX_REPLICAS)
        r = KVEDGE_PLACE_MAX_REPLICAS;
    if ((size_t)r > n_up)
        r = (uint32_t)n_up;
    return r ? r : 1;
}
