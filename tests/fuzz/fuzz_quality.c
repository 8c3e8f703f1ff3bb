/* Fuzz target for the quality-profile reader (proxy/quality.h: the files `kvedge eval
 * --profile-out` writes and `kvedge proxy --quality` reads). Built with libFuzzer
 * (KVEDGE_FUZZ=ON, clang) it fuzzes; built normally it replays the committed corpus. A refused
 * text leaves a reason and no profile; an accepted one answers every cost query within its
 * bounds: lossless 0, a measured rung a finite cost >= 0, anything else an error. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "proxy/quality.h"
#include "access/codec/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvedge_quality_profile_t *q = NULL;
    char why[256] = "";
    int rc = kvedge_quality_parse((const char *)data, size, &q, why, sizeof why);
    if (rc != KVEDGE_OK) {
        if (q || why[0] == '\0')
            abort();
        return 0;
    }
    if (!q || !kvedge_quality_model(q) || kvedge_quality_layers(q) == 0 ||
        kvedge_quality_layers(q) > KVEDGE_QUALITY_MAX_LAYERS ||
        kvedge_quality_n_rungs(q) > KVEDGE_QUALITY_MAX_RUNGS)
        abort();
    const kvedge_quality_metric_t metrics[] = {KVEDGE_QUALITY_PPL_PCT, KVEDGE_QUALITY_KL};
    uint32_t layers = kvedge_quality_layers(q);
    for (uint32_t l = 0; l <= layers; l += layers > 8 ? layers / 8 : 1)
        for (unsigned r = 0; r < 256; r++)
            for (size_t m = 0; m < 2; m++) {
                double c = -1;
                kvedge_prec_t rung = (kvedge_prec_t)r;
                int crc = kvedge_quality_cost(q, l, rung, metrics[m], &c);
                bool valid = l < layers && kvedge_prec_valid(rung);
                if (!valid && crc == KVEDGE_OK)
                    abort(); /* a layer past the model, or no rung: never a cost */
                if (crc == KVEDGE_OK && !(c >= 0 && isfinite(c)))
                    abort();
                if (valid && rung == KVEDGE_PREC_LOSSLESS && (crc != KVEDGE_OK || c != 0))
                    abort();
                if (valid && crc != KVEDGE_OK && kvedge_quality_has(q, rung))
                    abort(); /* a measured rung always has a cost */
            }
    kvedge_quality_destroy(&q);
    if (q)
        abort();
    return 0;
}
