/* Fuzz target for the transform-coded K/V section decoder (access/codec/tcbody.h). Input: two
 * bytes of tokens - 1 and one of dim - 1 (little-endian, tokens up to 512, dim up to 64), then
 * the section. Decoded with the identity basis, an accepted section must give finite values
 * within the range its header and codes allow, and kvedge_tc_check (no basis) must accept
 * exactly the sections the decoder accepts. Seeds: gen_tcbody_corpus DIR. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "access/codec/error.h"
#include "access/codec/tcbody.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    const kvedge_tc_shape_t s = {1u + ((data[0] | (uint32_t)data[1] << 8) % 512u),
                                 1u + data[2] % 64u};
    const size_t n = (size_t)s.tokens * s.dim;
    float *eye = calloc((size_t)s.dim * s.dim, sizeof *eye), *x = malloc(n * sizeof *x);
    if (!eye || !x)
        goto out;
    for (uint32_t c = 0; c < s.dim; c++)
        eye[(size_t)c * s.dim + c] = 1.0f;
    int rc = kvedge_tc_decode(&s, data + 3, size - 3, eye, x);
    if (rc != KVEDGE_OK && rc != KVEDGE_ECORRUPT)
        abort();
    const int checked = kvedge_tc_check(&s, data + 3, size - 3);
    if (checked != rc) /* the structural walk and the decoder agree on every section */
        abort();
    for (size_t i = 0; rc == KVEDGE_OK && i < n; i++)
        if (!isfinite(x[i]))
            abort(); /* fp16 mean + a code of at most 2^15 times an fp16 step is finite */
out:
    free(x);
    free(eye);
    return 0;
}
