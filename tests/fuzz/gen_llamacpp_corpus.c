/* Writes the seed corpus of fuzz_llamacpp_state: sequence states as the pinned llama.cpp writes
 * them (clients/llamacpp/state.h), for a few layouts (F32 and F16, K permuted or not, V
 * transposed or not, one stream or several), and a truncated and a wrong-magic one.
 * Usage: gen_llamacpp_corpus DIR */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "access/codec/error.h"
#include "clients/llamacpp/state.h"

static void s_write(const char *dir, const char *name, const uint8_t *b, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: gen_llamacpp_corpus DIR\n");
        return 2;
    }
    static const struct {
        const char *name;
        kvedge_llamacpp_layout_t l;
        uint32_t n;
    } seeds[] = {
        {"f32-llama-vtrans", {2, 2, 4, true, KVEDGE_LLAMACPP_F32, true, 1}, 3},
        {"f16-llama", {1, 1, 8, true, KVEDGE_LLAMACPP_F16, false, 1}, 5},
        {"f32-qwen2-2streams", {2, 1, 4, false, KVEDGE_LLAMACPP_F32, false, 2}, 2},
        {"f16-qwen2-vtrans", {3, 2, 2, false, KVEDGE_LLAMACPP_F16, true, 1}, 4},
    };
    for (size_t s = 0; s < sizeof seeds / sizeof *seeds; s++) {
        const kvedge_llamacpp_layout_t *l = &seeds[s].l;
        const uint32_t n = seeds[s].n;
        size_t floats = (size_t)l->layers * l->kv_heads * n * l->head_dim;
        float *k = malloc(floats * sizeof *k), *v = malloc(floats * sizeof *v);
        for (size_t i = 0; i < floats; i++) {
            k[i] = (float)((int)(i * 7 % 23) - 11) / 8.0f;
            v[i] = (float)((int)(i * 5 % 19) - 9) / 4.0f;
        }
        size_t cap = kvedge_llamacpp_state_bytes(l, n), len = 0;
        uint8_t *b = malloc(cap);
        if (!k || !v || !b || kvedge_llamacpp_state_write(l, 0, 3, n, k, v, b, cap, &len) != 0) {
            fprintf(stderr, "gen_llamacpp_corpus: %s: cannot write\n", seeds[s].name);
            return 1;
        }
        s_write(argv[1], seeds[s].name, b, len);
        if (s == 0) {
            s_write(argv[1], "truncated", b, len / 2);
            b[0] ^= 0xff;
            s_write(argv[1], "bad-magic", b, len);
        }
        free(b);
        free(k);
        free(v);
    }
    return 0;
}
