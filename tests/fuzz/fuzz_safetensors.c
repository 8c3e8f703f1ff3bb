/* Fuzz target for the safetensors reader (model weights from disk). Built with libFuzzer
 * (KVEDGE_FUZZ=ON, clang) it fuzzes; built normally it replays the committed corpus. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "clients/decoder/safetensors.h"
#include "access/codec/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvedge_safetensors_t *st = kvedge_safetensors_new();
    if (!st)
        return 0;
    if (kvedge_safetensors_parse(st, data, size) != KVEDGE_OK) {
        /* A refused file leaves a reason and nothing behind. */
        if (kvedge_safetensors_error(st)[0] == '\0' || kvedge_safetensors_count(st) != 0)
            abort();
        kvedge_safetensors_destroy(&st);
        return 0;
    }
    /* An accepted file: every tensor lies inside the input, is found by its name, and
     * converts; the byte ranges tile the data section in order. */
    size_t n = kvedge_safetensors_count(st);
    const uint8_t *prev_end = NULL;
    for (size_t i = 0; i < n; i++) {
        const kvedge_safetensors_tensor_t *t = kvedge_safetensors_at(st, i);
        if (!t || kvedge_safetensors_find(st, t->name) != t)
            abort();
        if (t->nbytes != t->numel * kvedge_safetensors_dtype_size(t->dtype) || t->nbytes > size)
            abort();
        if (prev_end && t->data != prev_end)
            abort();
        prev_end = t->data + t->nbytes;
        if (t->numel > (1u << 20))
            continue;
        float *f = malloc((t->numel ? t->numel : 1) * sizeof(float));
        if (f && kvedge_safetensors_to_f32(t, f, t->numel) != KVEDGE_OK)
            abort();
        free(f);
    }
    (void)kvedge_safetensors_metadata(st, "format");
    kvedge_safetensors_destroy(&st);
    return 0;
}
