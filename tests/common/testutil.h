/* Helpers shared by kvedge's cmocka tests. */
#ifndef KVEDGE_TESTS_TESTUTIL_H
#define KVEDGE_TESTS_TESTUTIL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "access/codec/block.h"
#include "access/codec/quant.h"
#include "access/codec/synth.h"

/* ||a - b|| / ||a|| over n floats. */
static inline double kt_rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)a[i] * a[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Encodes one synthetic head; returns a malloc'd block and its length via *len. */
static inline uint8_t *kt_encode(const kvedge_block_spec_t *spec, uint64_t seed, size_t *len)
{
    size_t n = (size_t)spec->tokens * spec->head_dim, es = kvedge_dtype_size(spec->dtype);
    void *k = malloc(n * es), *v = malloc(n * es);
    size_t cap = kvedge_block_encoded_bound(spec);
    uint8_t *out = malloc(cap ? cap : 1);
    if (!k || !v || !out || cap == 0 ||
        kvedge_synth_head(seed, 0, spec->tokens, spec->head_dim, spec->dtype, k, v) != 0 ||
        kvedge_block_encode(spec, k, v, out, cap, len) != 0) {
        free(out);
        out = NULL;
    }
    free(k);
    free(v);
    return out;
}

#endif
