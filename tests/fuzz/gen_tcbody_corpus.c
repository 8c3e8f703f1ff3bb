/* Writes the seed corpus of fuzz_tcbody into DIR: sections of each layout (token-major,
 * component-major, bands), with escapes, of rank 0, and truncated ones, each after the three
 * shape bytes fuzz_tcbody reads. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/tcbody.h"

static int s_write(const char *dir, const char *name, uint32_t T, uint32_t D, const uint8_t *buf,
                   size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    const uint8_t head[3] = {(uint8_t)(T - 1), (uint8_t)((T - 1) >> 8), (uint8_t)(D - 1)};
    int ok = fwrite(head, 1, 3, f) == 3 && fwrite(buf, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* A section of T x D values: channel c with amplitude amp * 0.75^c (falling variance, what a
 * KLT gives), identity basis, at `step`; writes it whole and cut to a third. */
static int s_seed(const char *dir, const char *name, uint32_t T, uint32_t D, float amp, float step)
{
    const kvedge_tc_shape_t s = {T, D};
    float *x = malloc(sizeof(float) * T * D), *eye = calloc((size_t)D * D, sizeof(float));
    uint8_t *buf = malloc(kvedge_tc_bound(&s));
    int rc = -1;
    if (!x || !eye || !buf)
        goto out;
    for (uint32_t c = 0; c < D; c++)
        eye[c * D + c] = 1.0f;
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t c = 0; c < D; c++)
            x[t * D + c] = amp * powf(0.75f, (float)c) * sinf(0.37f * (float)(t * D + c) + 1.0f);
    size_t len;
    if (kvedge_tc_encode(&s, x, eye, step, buf, kvedge_tc_bound(&s), &len) != 0)
        goto out;
    char cut[256];
    snprintf(cut, sizeof cut, "%s-truncated", name);
    rc = s_write(dir, name, T, D, buf, len) || s_write(dir, cut, T, D, buf, len / 3) ? -1 : 0;
out:
    free(buf);
    free(eye);
    free(x);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const char *d = argv[1];
    int rc = s_seed(d, "valid-bands", 256, 32, 4.0f, 0.05f) |
             s_seed(d, "valid-small", 3, 1, 1.0f, 0.1f) |
             s_seed(d, "valid-escapes", 16, 8, 100.0f, 0.01f) |
             s_seed(d, "valid-rank0", 8, 4, 1.0f, 1000.0f) |
             s_seed(d, "valid-odd", 17, 5, 2.0f, 0.2f);
    return rc ? 1 : 0;
}
