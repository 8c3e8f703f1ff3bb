/* Fuzz target for the coding-basis parser (access/codec/basis.h): refusals leave no basis and a
 * reason; what is accepted has a shape within the limits, every section readable with a
 * positive finite fp16 step and finite transforms. Seeds: gen_basis_corpus DIR. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/basis.h"
#include "access/codec/block.h"
#include "access/codec/chunk.h"
#include "access/codec/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvedge_basis_t *b = NULL;
    char why[256] = "";
    const int rc = kvedge_basis_parse(data, size, &b, why, sizeof why);
    if (rc != KVEDGE_OK) {
        if (b || why[0] == '\0' || rc == KVEDGE_EINVAL)
            abort();
        return 0;
    }
    const uint32_t L = kvedge_basis_layers(b), H = kvedge_basis_kv_heads(b),
                   D = kvedge_basis_head_dim(b);
    const size_t idlen = strlen(kvedge_basis_model(b));
    if (L == 0 || H == 0 || D == 0 || D > KVEDGE_BLOCK_MAX_HEAD_DIM || idlen == 0 ||
        idlen > KVEDGE_MODEL_ID_MAX_BYTES)
        abort();
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t h = 0; h < H; h++)
            for (int w = 0; w < 2; w++) {
                kvedge_basis_section_t s;
                if (kvedge_basis_section(b, l, h, w, &s) != KVEDGE_OK || s.dim != D ||
                    !(s.step > 0.0f) || !isfinite(s.step))
                    abort();
                for (size_t i = 0; i < (size_t)D * D; i++)
                    if (!isfinite(s.fwd[i]) || !isfinite(s.inv[i]))
                        abort();
            }
    kvedge_basis_section_t s;
    if (kvedge_basis_section(b, L, 0, 0, &s) != KVEDGE_EINVAL)
        abort();
    kvedge_basis_free(&b);
    return 0;
}
