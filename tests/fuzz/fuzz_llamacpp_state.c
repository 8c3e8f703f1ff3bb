/* Fuzz target for the llama.cpp sequence-state codec (clients/llamacpp/state.h): the bridge's
 * export reads the bytes llama_state_seq_get_data hands it, so a blob of another llama.cpp
 * build, or a corrupt one, must be refused without reading past it. A blob whose header parses
 * is read with every layout it could be of (KV heads 1, 2 or 4, K permuted or not); a blob
 * that reads back is written again from what was read, and that blob reads back to the same
 * K/V (NaN read as NaN). Built with libFuzzer (KVEDGE_FUZZ=ON, clang) it fuzzes; built
 * normally it replays the committed corpus. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/error.h"
#include "clients/llamacpp/state.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What the fuzzer may make the codec allocate here: small shapes only. */
#define S_MAX_LAYERS 8u
#define S_MAX_CELLS  64u
#define S_MAX_ROW    1024u /* K row elements: kv_heads * head_dim */

static int s_same(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(a[i] == b[i] || (isnan(a[i]) && isnan(b[i]))))
            return 0;
    return 1;
}

/* Reads data with layout l; on success writes it back and checks the round trip. */
static void s_try(const kvedge_llamacpp_layout_t *l, const kvedge_llamacpp_state_info_t *in,
                  const uint8_t *data, size_t size)
{
    const size_t floats = (size_t)l->layers * l->kv_heads * in->cells * l->head_dim;
    float *k = malloc((floats ? floats : 1) * sizeof *k);
    float *v = malloc((floats ? floats : 1) * sizeof *v);
    float *k2 = malloc((floats ? floats : 1) * sizeof *k2);
    float *v2 = malloc((floats ? floats : 1) * sizeof *v2);
    if (!k || !v || !k2 || !v2)
        abort();
    uint32_t n = 0;
    int32_t pos0 = 0;
    int rc = kvedge_llamacpp_state_read(l, data, size, k, v, in->cells, &n, &pos0);
    if (rc == KVEDGE_OK && n > 0) {
        if (n != in->cells || pos0 != in->pos0)
            abort();
        size_t cap = kvedge_llamacpp_state_bytes(l, n), len = 0;
        uint8_t *blob = malloc(cap ? cap : 1);
        if (!blob)
            abort();
        if (kvedge_llamacpp_state_write(l, in->seq, pos0, n, k, v, blob, cap, &len) != KVEDGE_OK ||
            len != cap)
            abort();
        uint32_t n2 = 0;
        int32_t p2 = 0;
        if (kvedge_llamacpp_state_read(l, blob, len, k2, v2, n, &n2, &p2) != KVEDGE_OK || n2 != n ||
            p2 != pos0 || !s_same(k, k2, floats) || !s_same(v, v2, floats))
            abort();
        free(blob);
    } else if (rc == KVEDGE_OK) {
        if (n != 0)
            abort();
    } else if (rc != KVEDGE_EVERSION && rc != KVEDGE_ECORRUPT && rc != KVEDGE_ESHAPE &&
               rc != KVEDGE_ENOSPACE && rc != KVEDGE_EINVAL) {
        abort();
    }
    free(k);
    free(v);
    free(k2);
    free(v2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvedge_llamacpp_state_info_t in;
    int rc = kvedge_llamacpp_state_info(data, size, &in);
    if (rc != KVEDGE_OK) {
        if (rc != KVEDGE_EVERSION && rc != KVEDGE_ECORRUPT)
            abort();
        return 0;
    }
    if (in.cells > KVEDGE_LLAMACPP_MAX_CELLS || in.n_stream > KVEDGE_LLAMACPP_MAX_STREAMS)
        abort(); /* the header parser bounds what it accepts */
    size_t elem = in.type == KVEDGE_LLAMACPP_F32 ? 4 : in.type == KVEDGE_LLAMACPP_F16 ? 2 : 0;
    if (in.cells == 0 || in.cells > S_MAX_CELLS || in.layers == 0 || in.layers > S_MAX_LAYERS ||
        !elem || in.k_row % elem != 0 || in.k_row / elem == 0 || in.k_row / elem > S_MAX_ROW)
        return 0;
    const uint32_t row = (uint32_t)(in.k_row / elem);
    static const uint32_t heads[] = {1, 2, 4};
    for (size_t h = 0; h < sizeof heads / sizeof *heads; h++) {
        if (row % heads[h] != 0 || (row / heads[h]) % 2 != 0)
            continue;
        for (int perm = 0; perm < 2; perm++) {
            kvedge_llamacpp_layout_t l = {.layers = in.layers,
                                          .kv_heads = heads[h],
                                          .head_dim = row / heads[h],
                                          .permuted = perm != 0,
                                          .type = in.type,
                                          .v_trans = in.v_trans,
                                          .n_stream = in.n_stream};
            if (kvedge_llamacpp_layout_check(&l) == KVEDGE_OK)
                s_try(&l, &in, data, size);
        }
    }
    return 0;
}
