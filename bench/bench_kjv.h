/* The four trained KJV models the codec benches measure (models/kjv): their weights, names and
 * coding bases, and loading them or exiting with a line that names the bench. Header-only, for
 * benches that link the decoder. */
#ifndef KVEDGE_BENCH_KJV_H
#define KVEDGE_BENCH_KJV_H

#include <stdio.h>
#include <stdlib.h>

#include "access/codec/basis.h"
#include "clients/decoder/decoder.h"

#define BENCH_KJV_MODELS 4

/* Under the models root (--models DIR, "models" by default). */
static const char *const bench_kjv_weights[BENCH_KJV_MODELS] = {
    "kjv/cloud/model.safetensors", "kjv/edge/model.safetensors", "kjv/llama/cloud",
    "kjv/llama/edge"};
static const char *const bench_kjv_names[BENCH_KJV_MODELS] = {"OPT cloud", "OPT edge",
                                                              "Llama cloud", "Llama edge"};
/* The models' coding bases (scripts/fit_basis.py), for the tc rung. */
static const char *const bench_kjv_bases[BENCH_KJV_MODELS] = {
    "kjv/cloud/basis.kvb", "kjv/edge/basis.kvb", "kjv/llama/cloud/basis.kvb",
    "kjv/llama/edge/basis.kvb"};

/* Model `model`'s coding basis, loaded (not registered). */
static inline kvedge_basis_t *bench_kjv_basis(const char *prog, const char *root, int model)
{
    char path[512], why[512] = "";
    snprintf(path, sizeof path, "%s/%s", root, bench_kjv_bases[model]);
    kvedge_basis_t *b = NULL;
    if (kvedge_basis_load(path, &b, why, sizeof why) != KVEDGE_OK) {
        fprintf(stderr, "%s: %s (scripts/fit_basis.py writes it)\n", prog, why);
        exit(1);
    }
    return b;
}

/* Model `model`'s decoder, its weights loaded. */
static inline kvedge_decoder_t *bench_kjv_decoder(const char *prog, const char *root, int model)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, bench_kjv_weights[model]);
    kvedge_decoder_t *m = kvedge_decoder_new();
    if (!m || kvedge_decoder_load(m, path, 0) != 0) {
        fprintf(stderr, "%s: cannot load %s: %s\n", prog, path,
                m ? kvedge_decoder_error(m) : "no memory");
        exit(1);
    }
    return m;
}

#endif
