/* The pipelined loader's large–small stage (clients/lib/pipeline_impl.h): a layer delivered as
 * the mapped model's is dequantized into a scratch of that shape, turned into this model's
 * K/V by the caller's adapt callback, checked and written into the destination. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/clock.h"
#include "clients/lib/pipeline_impl.h"

kvedge_pipeline__adapt_t *kvedge_pipeline__adapt_new(const kvedge_pipeline_opts_t *o)
{
    const kvedge_model_t *mm = o->mapped_model;
    kvedge_pipeline__adapt_t *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    snprintf(a->id, sizeof a->id, "%s", mm->id);
    a->layers = mm->layers;
    a->heads = mm->kv_heads;
    a->head_dim = mm->head_dim;
    a->fn = o->adapt;
    a->arg = o->adapt_arg;
    a->chunks = malloc(o->n_chunks * sizeof *a->chunks);
    if (!a->chunks) {
        free(a);
        return NULL;
    }
    memcpy(a->chunks, o->mapped_chunks, o->n_chunks * sizeof *a->chunks);
    return a;
}

int kvedge_pipeline__adapt_alloc(kvedge_pipeline__adapt_t *a, const kvedge_pipeline__geom_t *g)
{
    a->g = *g;
    size_t sf = (size_t)a->heads * g->tokens * a->head_dim;
    size_t af = (size_t)g->heads * g->tokens * g->head_dim;
    a->cdesc = calloc((size_t)g->n_chunks * g->stride, sizeof *a->cdesc);
    a->sk = malloc(sf * sizeof(float));
    a->sv = malloc(sf * sizeof(float));
    a->ak = malloc(af * sizeof(float));
    a->av = malloc(af * sizeof(float));
    return a->cdesc && a->sk && a->sv && a->ak && a->av ? KVEDGE_OK : KVEDGE_ENOMEM;
}

void kvedge_pipeline__adapt_destroy(kvedge_pipeline__adapt_t **a_p)
{
    if (!a_p || !*a_p)
        return;
    kvedge_pipeline__adapt_t *a = *a_p;
    *a_p = NULL;
    free(a->cdesc);
    free(a->sk);
    free(a->sv);
    free(a->ak);
    free(a->av);
    free(a->chunks);
    free(a);
}

/* All n floats of x are finite. */
static bool s_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return false;
    return true;
}

/* Writes an adapted layer, [heads][tokens][head_dim], into a fp32 contiguous destination at
 * token_offset (checked at open). */
static void s_place(const kvedge_pipeline__geom_t *g, const kvedge_kv_dst_t *d, const float *src)
{
    size_t row = (size_t)g->tokens * g->head_dim;
    for (uint32_t h = 0; h < g->heads; h++)
        memcpy((float *)d->base + ((size_t)h * d->tokens_cap + g->token_offset) * g->head_dim,
               src + h * row, row * sizeof(float));
}

int kvedge_pipeline__adapt_layer(kvedge_pipeline__adapt_t *a, uint16_t layer, int from,
                                 const kvedge_dequant_block_t *desc, const kvedge_kv_dst_t *k,
                                 const kvedge_kv_dst_t *v, bool *failed, int64_t *adapt_us)
{
    const kvedge_pipeline__geom_t *g = &a->g;
    const bool mapped = from >= 0; /* set by its record, before it was S_READY */
    const uint32_t heads = mapped ? a->heads : g->heads;
    *failed = false;
    *adapt_us = 0;
    uint32_t n = 0;
    for (uint32_t ci = 0; ci < g->n_chunks; ci++)
        for (uint32_t h = 0; h < heads; h++) {
            kvedge_dequant_block_t *b = &a->cdesc[n++];
            *b = desc[ci * g->stride + h];
            if (mapped)
                b->offset = ci * g->chunk_tokens;
        }
    if (!mapped) {
        kvedge_dequant_args_t args = {a->cdesc, n, *k, *v};
        return kvedge_cpu_dequant(&args);
    }
    size_t sf = (size_t)a->heads * g->tokens * a->head_dim;
    kvedge_kv_dst_t d = {.layout = KVEDGE_KV_CONTIG,
                         .dtype = KVEDGE_DTYPE_FP32,
                         .base = a->sk,
                         .cap_bytes = sf * sizeof(float),
                         .heads = a->heads,
                         .head_dim = a->head_dim,
                         .tokens_cap = g->tokens};
    kvedge_dequant_args_t args = {a->cdesc, n, d, d};
    args.v.base = a->sv;
    int rc = kvedge_cpu_dequant(&args);
    if (rc != KVEDGE_OK)
        return rc;
    size_t af = (size_t)g->heads * g->tokens * g->head_dim;
    int64_t t1 = kvedge_mono_us();
    int arc = a->fn(a->arg, layer, (uint16_t)from, a->sk, a->sv, g->tokens, a->ak, a->av);
    *adapt_us = kvedge_mono_us() - t1;
    *failed = arc != KVEDGE_OK || !s_finite(a->ak, af) || !s_finite(a->av, af);
    if (*failed)
        return KVEDGE_ENOTFOUND; /* the decoder computes it; nothing was written */
    s_place(g, k, a->ak);
    s_place(g, v, a->av);
    return KVEDGE_OK;
}
