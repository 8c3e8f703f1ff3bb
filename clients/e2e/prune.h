/* Pruning unmapped layers (CE-LSLM section III-B: the Cache Server "prunes redundant layers";
 * docs/largesmall.md, "Pruning unmapped layers"): which layers of a cloud model the layer maps
 * registered for it use, so that its prefill stores only those (kvedge_e2e_quant_t's layers),
 * and the operator's own list of layers to keep. */
#ifndef KVEDGE_CLIENTS_PRUNE_H
#define KVEDGE_CLIENTS_PRUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/kvmsg.h"
#include "runtime/mview.h"
#include "access/codec/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A why buffer of this size holds any reason of this module in full. */
#define KVEDGE_PRUNE_WHY_BYTES 512u
/* Room for a set written as a list ("0,1,4"): at most 1024 numbers of 4 digits and a comma. */
#define KVEDGE_PRUNE_LIST_BYTES (5u * KVEDGE_MODEL_MAX_LAYERS + 1u)

/* A set of layers of one model. Plain data. */
typedef struct {
    uint32_t layers;                          /* the model's layer count */
    uint8_t bit[KVEDGE_MODEL_MAX_LAYERS / 8]; /* bit l (LSB first): layer l is in the set */
} kvedge_prune_set_t;

/* The empty set of a model of `layers` layers (clamped to KVEDGE_MODEL_MAX_LAYERS). */
void kvedge_prune_set_init(kvedge_prune_set_t *s, uint32_t layers);
/* Every layer of a model of `layers` layers. */
void kvedge_prune_set_all(kvedge_prune_set_t *s, uint32_t layers);
bool kvedge_prune_set_has(const kvedge_prune_set_t *s, uint32_t layer);
/* Adds layer (ignored when it is not below s->layers). */
void kvedge_prune_set_add(kvedge_prune_set_t *s, uint32_t layer);
/* Layers in the set. */
uint32_t kvedge_prune_set_count(const kvedge_prune_set_t *s);
/* The set as a list in increasing order, "0,1,4" ("" when empty), into out (cap bytes,
 * KVEDGE_PRUNE_LIST_BYTES holds any). Errors: KVEDGE_EINVAL, KVEDGE_ENOSPACE. */
int kvedge_prune_set_format(const kvedge_prune_set_t *s, char *out, size_t cap);

/* The operator's list (`--layers 0,1,4`): decimal layer numbers separated by single commas,
 * each below layers, each once, in any order. Refused with KVEDGE_EINVAL and why (may be
 * NULL) saying what: an empty list or an empty item, a number out of range, a layer twice,
 * anything that is not a digit or a comma (signs, spaces, ranges). */
int kvedge_prune_parse(const char *list, uint32_t layers, kvedge_prune_set_t *out, char *why,
                       size_t why_len);

/* One registered map, as its key map/<cloud>/<edge> names it. */
typedef struct {
    const char *cloud;
    const char *edge;
    const kvedge_master_map_t *map;
} kvedge_prune_map_t;

/* The layers of cloud model `cloud` (cloud_layers layers) that maps[0..n) use: the union over
 * the maps of the cloud layers their entries name (an entry KVEDGE_MASTER_MAP_NONE adds
 * nothing). Pure. n 0 gives the empty set. Refused, with why naming the map: a map of another
 * cloud model (KVEDGE_EINVAL), one whose cloud layer count is not cloud_layers, an entry at or
 * past it, an edge layer count out of 1..KVEDGE_MODEL_MAX_LAYERS (KVEDGE_ECORRUPT: the map
 * describes another model than this one, and pruning by it could drop a layer that is used).
 * Errors also KVEDGE_EINVAL for NULL arguments. *out is the empty set on failure. */
int kvedge_prune_union(const char *cloud, uint32_t cloud_layers, const kvedge_prune_map_t *maps,
                       size_t n, kvedge_prune_set_t *out, char *why, size_t why_len);

/* The union over every map of the registry view v that names cloud (map/<cloud>/...):
 * kvedge_prune_union of them. *n_maps (may be NULL) receives how many, edges (may be NULL,
 * edges_cap bytes) their edge ids, comma-separated, in key order. Errors: KVEDGE_ENOTFOUND
 * when no map names cloud, or when the maps use none of its layers (why: "no edge model maps
 * CLOUD: pruning would drop every layer", "the maps of CLOUD use none of its layers: ...");
 * KVEDGE_EPROTO for a record under map/<cloud>/ that does not parse; those of
 * kvedge_prune_union; KVEDGE_EINVAL, KVEDGE_ENOMEM. */
int kvedge_prune_from_view(kvedge_mview_t *v, const char *cloud, uint32_t cloud_layers,
                           kvedge_prune_set_t *out, size_t *n_maps, char *edges, size_t edges_cap,
                           char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif
