/* The kvedge side of test_decoder_llamacpp (tests/decoder/compare_llamacpp.sh): the reference
 * decoder's logits at every position of a token sequence, then greedy continuations, in
 * llama_logits's format. Positions before the middle come from prefills; the rest from a
 * decode session whose context (the first half) has its K/V handed in from a prefill for
 * even layers and recomputed (MISS) for odd ones, so the comparison covers the split
 * attention, the LSE merge and the lazy recompute as well as the forward.
 * Usage: decoder_logits MODEL_DIR OUT N_GEN ID...
 * OUT: int32 vocab, int32 n, n * vocab float32 logits, N_GEN int32 greedy tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/decoder/decoder.h"
#include "access/codec/error.h"

typedef struct {
    const kvedge_decoder_t *md;
    const float *k, *v; /* [layers][kv floats] of the context */
    size_t kvf;
} s_ctx_t;

static int s_provide(void *arg, uint32_t layer, float *k, float *v)
{
    const s_ctx_t *c = arg;
    if (layer % 2)
        return KVEDGE_DECODER_MISS;
    memcpy(k, c->k + layer * c->kvf, c->kvf * sizeof(float));
    memcpy(v, c->v + layer * c->kvf, c->kvf * sizeof(float));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: decoder_logits MODEL_DIR OUT N_GEN ID...\n");
        return 2;
    }
    const uint32_t n = (uint32_t)(argc - 4), n_gen = (uint32_t)atoi(argv[3]);
    kvedge_decoder_t *md = kvedge_decoder_new();
    int rc = kvedge_decoder_load(md, argv[1], 0);
    if (rc != KVEDGE_OK) {
        fprintf(stderr, "decoder_logits: %s: %s\n", kvedge_strerror(rc), kvedge_decoder_error(md));
        return 1;
    }
    const kvedge_decoder_config_t *cfg = kvedge_decoder_config(md);
    const uint32_t V = cfg->vocab, half = n / 2;
    int32_t *ids = malloc(n * sizeof *ids);
    float *lg = malloc((size_t)n * V * sizeof(float));
    const size_t kvf = kvedge_decoder_kv_floats(md, half);
    float *k = malloc(cfg->layers * kvf * sizeof(float) + 1);
    float *v = malloc(cfg->layers * kvf * sizeof(float) + 1);
    int32_t *gen = malloc((n_gen + 1) * sizeof *gen);
    kvedge_decoder_session_t *s = kvedge_decoder_session_new(md);
    if (!ids || !lg || !k || !v || !gen || !s)
        return 1;
    for (uint32_t i = 0; i < n; i++)
        ids[i] = atoi(argv[4 + i]);
    for (uint32_t i = 0; rc == KVEDGE_OK && i < half; i++)
        rc = kvedge_decoder_prefill(md, ids, i + 1, lg + (size_t)i * V, NULL, NULL);
    if (rc == KVEDGE_OK && half)
        rc = kvedge_decoder_prefill(md, ids, half, NULL, k, v);
    s_ctx_t c = {md, k, v, kvf};
    if (rc == KVEDGE_OK)
        rc = kvedge_decoder_session_begin(s, ids, half, s_provide, &c, ids + half, 1,
                                          n - half - 1 + n_gen, lg + (size_t)half * V);
    for (uint32_t i = half + 1; rc == KVEDGE_OK && i < n; i++)
        rc = kvedge_decoder_session_step(s, ids[i], lg + (size_t)i * V);
    if (rc == KVEDGE_OK)
        rc = kvedge_decoder_session_generate(s, n_gen, gen);
    FILE *f = fopen(argv[2], "wb");
    if (rc != KVEDGE_OK || !f) {
        fprintf(stderr, "decoder_logits: %s\n", kvedge_strerror(rc));
        return 1;
    }
    int32_t hdr[2] = {(int32_t)V, (int32_t)n};
    fwrite(hdr, sizeof hdr, 1, f);
    fwrite(lg, sizeof(float), (size_t)n * V, f);
    fwrite(gen, sizeof *gen, n_gen, f);
    fclose(f);
    kvedge_decoder_session_destroy(&s);
    kvedge_decoder_destroy(&md);
    free(gen);
    free(v);
    free(k);
    free(lg);
    free(ids);
    return 0;
}
