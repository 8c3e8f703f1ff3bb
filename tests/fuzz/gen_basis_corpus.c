/* Writes the seed corpus of fuzz_basis into DIR: small valid basis files (signed permutation
 * and rotation), and damaged ones (truncated, a flipped body byte, a bad step, version and
 * flags resealed so that the checks behind the digest are reached). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/basis_fixture.h"

static int s_write(const char *dir, const char *name, const uint8_t *buf, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fwrite(buf, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const char *d = argv[1];
    uint8_t *a, *r;
    size_t alen, rlen;
    if (kt_basis_file("opt-tiny", 2, 2, 4, 0.125f, 1, &a, &alen) != 0 ||
        kt_basis_file_kind(KT_BASIS_ROTATION, "llama", 1, 1, 8, 0.05f, 2, &r, &rlen) != 0)
        return 1;
    int rc = s_write(d, "valid-perm", a, alen) | s_write(d, "valid-rotation", r, rlen);
    rc |= s_write(d, "truncated-header", a, 100) | s_write(d, "truncated-body", a, alen / 2);
    uint8_t *t = malloc(alen);
    if (!t)
        return 1;
    memcpy(t, a, alen);
    t[KVEDGE_BASIS_HEADER_BYTES + 10] ^= 0x40;
    rc |= s_write(d, "flipped", t, alen);
    memcpy(t, a, alen);
    kvedge_le_put32(t + KVEDGE_BASIS_HEADER_BYTES, kvedge_f32_bits(0.1f));
    kt_basis_reseal(t, alen);
    rc |= s_write(d, "bad-step", t, alen);
    memcpy(t, a, alen);
    kvedge_le_put16(t + 8, 2);
    kt_basis_reseal(t, alen);
    rc |= s_write(d, "bad-version", t, alen);
    memcpy(t, a, alen);
    kvedge_le_put16(t + 10, 1);
    kt_basis_reseal(t, alen);
    rc |= s_write(d, "bad-flags", t, alen);
    memcpy(t, a, alen);
    memset(t + 24, 'x', 132);
    kt_basis_reseal(t, alen);
    rc |= s_write(d, "model-no-nul", t, alen);
    free(t);
    free(r);
    free(a);
    return rc ? 1 : 0;
}
