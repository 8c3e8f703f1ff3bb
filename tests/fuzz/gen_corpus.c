/* Writes the seed corpus for fuzz_block: one small valid block per dtype x scheme x mask x
 * lz4, entropy-coded int8 and int4 blocks, tc blocks against the fixture basis fuzz_block
 * registers, plus a few damaged ones. Run: gen_corpus DIR. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/basis.h"
#include "access/codec/block.h"
#include "access/codec/synth.h"
#include "tests/common/basis_fixture.h"

static void s_write(const char *dir, const char *name, const uint8_t *buf, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

/* Entropy-coded blocks (version 2): int8 and int4 of 64 tokens x 33 channels (odd rows), with
 * and without a key mask, so every section holds a real rANS stream, and a damaged one each. */
static int s_write_coded(const char *dir)
{
    enum { T = 64, D = 33 };
    static uint16_t k[T * D], v[T * D];
    static uint8_t out[4 * T * D + 1024];
    uint8_t mask[8] = {0xFF, 0x0F, 0xF0, 0x01};
    if (kvedge_synth_head(77, 0, T, D, KVEDGE_DTYPE_FP16, k, v) != 0)
        return 1;
    for (int s = KVEDGE_SCHEME_INT8; s <= KVEDGE_SCHEME_INT4; s++)
        for (int m = 0; m < 2; m++) {
            kvedge_block_spec_t spec = {.dtype = KVEDGE_DTYPE_FP16,
                                        .scheme = (kvedge_scheme_t)s,
                                        .tokens = T,
                                        .head_dim = D,
                                        .group_size = 16,
                                        .key_mask = m ? mask : NULL};
            size_t len, clen;
            kvedge_block_info_t info;
            uint8_t *coded;
            if (kvedge_block_encode(&spec, k, v, out, sizeof out, &len) != 0 ||
                kvedge_block_parse(out, len, &info) != 0 ||
                kvedge_block_recode(&info, true, false, &coded, &clen) != 0)
                return 1;
            char name[64];
            snprintf(name, sizeof name, "valid-fp16-%s-m%d-ec", kvedge_scheme_name(s), m);
            s_write(dir, name, coded, clen);
            coded[clen / 2] ^= 0x40;
            snprintf(name, sizeof name, "flipped-%s-m%d-ec", kvedge_scheme_name(s), m);
            s_write(dir, name, coded, clen);
            free(coded);
        }
    return 0;
}

/* tc blocks (version 3) of 6 tokens, one per dtype, coded against the fixture basis; and a
 * flipped and a truncated one. */
static int s_write_tc(const char *dir)
{
    enum { T = 6, D = KT_FUZZ_TC_DIM };
    uint8_t *file = NULL;
    size_t flen = 0;
    kvedge_basis_t *b = NULL;
    if (kt_basis_file(KT_FUZZ_TC_MODEL, KT_FUZZ_TC_LAYERS, KT_FUZZ_TC_HEADS, KT_FUZZ_TC_DIM,
                      KT_FUZZ_TC_STEP, KT_FUZZ_TC_SEED, &file, &flen) != 0 ||
        kvedge_basis_parse(file, flen, &b, NULL, 0) != 0)
        return 1;
    free(file);
    int rc = 0;
    for (int d = KVEDGE_DTYPE_FP16; d <= KVEDGE_DTYPE_FP32 && rc == 0; d++) {
        uint8_t k[T * D * 4], v[T * D * 4], *out = NULL;
        size_t len;
        if (kvedge_synth_head(40 + d, 1, T, D, (kvedge_dtype_t)d, k, v) != 0 ||
            kvedge_block_encode_tc(b, 1, (uint32_t)d % 2, (kvedge_dtype_t)d, T, D, k, v, &out,
                                   &len) != 0) {
            rc = 1;
            break;
        }
        char name[64];
        snprintf(name, sizeof name, "valid-%s-tc", kvedge_dtype_name((kvedge_dtype_t)d));
        s_write(dir, name, out, len);
        if (d == KVEDGE_DTYPE_FP16) {
            s_write(dir, "truncated-tc", out, len / 2);
            out[len / 2] ^= 0x40;
            s_write(dir, "flipped-tc", out, len);
        }
        free(out);
    }
    kvedge_basis_free(&b);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    uint8_t mask[2] = {0x5A, 0x03};
    for (int d = KVEDGE_DTYPE_FP16; d <= KVEDGE_DTYPE_FP32; d++)
        for (int s = KVEDGE_SCHEME_LOSSLESS; s <= KVEDGE_SCHEME_INT4; s++)
            for (int m = 0; m < 2; m++)
                for (int z = 0; z < 2; z++) {
                    kvedge_block_spec_t spec = {(kvedge_dtype_t)d,     (kvedge_scheme_t)s, 6, 12,
                                                (uint16_t)(s ? 4 : 0), m ? mask : NULL,    z};
                    uint8_t k[6 * 12 * 4], v[6 * 12 * 4], out[2048];
                    size_t len;
                    if (z) { /* compressible input so the lz4 path is seeded too */
                        memset(k, 0, sizeof k);
                        memset(v, 0, sizeof v);
                    } else if (kvedge_synth_head(d * 9 + s, 0, 6, 12, spec.dtype, k, v) != 0) {
                        return 1;
                    }
                    if (kvedge_block_encode(&spec, k, v, out, sizeof out, &len) != 0)
                        return 1;
                    char name[64];
                    snprintf(name, sizeof name, "valid-%s-%s-m%d-z%d", kvedge_dtype_name(d),
                             kvedge_scheme_name(s), m, z);
                    s_write(argv[1], name, out, len);
                    if (d == KVEDGE_DTYPE_FP16 && m == 1) {
                        out[len / 2] ^= 0x40;
                        snprintf(name, sizeof name, "flipped-%s-z%d", kvedge_scheme_name(s), z);
                        s_write(argv[1], name, out, len);
                        snprintf(name, sizeof name, "truncated-%s-z%d", kvedge_scheme_name(s), z);
                        s_write(argv[1], name, out, len / 3);
                    }
                }
    if (s_write_coded(argv[1]) != 0 || s_write_tc(argv[1]) != 0)
        return 1;
    s_write(argv[1], "empty", (const uint8_t *)"", 0);
    s_write(argv[1], "magic-only", (const uint8_t *)"KVEB\x01", 5);
    return 0;
}
