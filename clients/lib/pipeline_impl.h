/* The pipelined loader's insides shared by its parts (clients/lib/pipeline.c, the loader, and
 * pipeline_adapt.c, the large–small stage). Internal: not installed. */
#ifndef KVEDGE_CLIENTS_PIPELINE_IMPL_H
#define KVEDGE_CLIENTS_PIPELINE_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "clients/lib/pipeline.h"

/* This model's layout of a layer, as the loader stages it: a slot's descriptors are indexed
 * chunk * stride + head for either model's shape. */
typedef struct {
    uint32_t heads, head_dim; /* this model's */
    uint32_t n_chunks, chunk_tokens, tokens;
    uint32_t token_offset; /* destination position of the context's token 0 */
    uint32_t stride;       /* max(heads, the mapped model's heads) */
} kvedge_pipeline__geom_t;

/* Large–small (docs/largesmall.md): the stage that turns a layer delivered as the mapped
 * model's into this model's K/V, and runs this model's own layers of the same pipeline. Used
 * by the loader thread only; its counters are read under the loader's lock. */
typedef struct {
    char id[KVEDGE_MODEL_ID_MAX_BYTES + 1]; /* the mapped model */
    uint32_t layers, heads, head_dim;       /* its shape */
    kvedge_chunk_id_t *chunks;              /* its chain (owned copy, n_chunks ids) */
    kvedge_pipeline_adapt_fn fn;
    void *arg;
    kvedge_pipeline__geom_t g;     /* set by alloc */
    kvedge_dequant_block_t *cdesc; /* compacted descriptors, n_chunks * stride */
    float *sk, *sv;                /* a mapped layer dequantized: [heads][tokens][head_dim] */
    float *ak, *av;                /* adapted: this model's [heads][tokens][head_dim] */
    uint32_t adapted;              /* layers resident through the adapter */
    int64_t adapt_us;              /* time in fn */
} kvedge_pipeline__adapt_t;

/* The stage of a pipeline with o->mapped_model (checked by open): the mapped model's id,
 * shape and chain copied, no scratch yet. NULL when out of memory. */
kvedge_pipeline__adapt_t *kvedge_pipeline__adapt_new(const kvedge_pipeline_opts_t *o);

/* Allocates the scratch for this model's geometry g. 0 or KVEDGE_ENOMEM. */
int kvedge_pipeline__adapt_alloc(kvedge_pipeline__adapt_t *a, const kvedge_pipeline__geom_t *g);

/* One layer (number `layer`) of the pipeline from its staged descriptors (desc, indexed
 * chunk * stride + head), CPU path: compacted in (chunk, head) order; this model's own layer
 * (from < 0) dequantized into its destinations k, v; a mapped one (from: the mapped model's
 * layer) dequantized into the scratch of the mapped shape (positions from 0), adapted,
 * checked and copied into k, v. Returns 0; KVEDGE_ENOTFOUND when the adaptation failed
 * (*failed set; nothing written); or the dequantizer's error. *adapt_us: time in the adapt
 * callback. */
int kvedge_pipeline__adapt_layer(kvedge_pipeline__adapt_t *a, uint16_t layer, int from,
                                 const kvedge_dequant_block_t *desc, const kvedge_kv_dst_t *k,
                                 const kvedge_kv_dst_t *v, bool *failed, int64_t *adapt_us);

/* Frees the stage and its scratch. NULL-safe, nulls *a_p. */
void kvedge_pipeline__adapt_destroy(kvedge_pipeline__adapt_t **a_p);

/* The ring pool (pipeline_pool.c): a host slot buffer of at least bytes, held or new
 * (kvedge_gpu_host_alloc); *got is its real size, to give back with it. */
int kvedge_pipeline__pool_take(size_t bytes, void **out, size_t *got);
void kvedge_pipeline__pool_give(void *p, size_t bytes);

#endif
