/* Fuzz target for the block decoder (bytes from disk or the wire), plain, lz4, entropy-coded and
 * transform-coded (tc) bodies; tc blocks decode with the fixture basis "fuzz-tc" registered at
 * the first input (the corpus's tc blocks are coded against it). Built with libFuzzer
 * (KVEDGE_FUZZ=ON, clang) it fuzzes; built normally it replays the committed corpus. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <string.h>
#include <xxhash.h>

#include "access/codec/basis.h"
#include "access/codec/block.h"
#include "access/codec/error.h"
#include "tests/common/basis_fixture.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void s_parse_and_decode(const uint8_t *data, size_t size);

/* Registers the basis gen_corpus codes the tc seeds against, once. */
static void s_basis_once(void)
{
    static int done;
    if (done)
        return;
    done = 1;
    uint8_t *file = NULL;
    size_t len = 0;
    kvedge_basis_t *b = NULL;
    if (kt_basis_file(KT_FUZZ_TC_MODEL, KT_FUZZ_TC_LAYERS, KT_FUZZ_TC_HEADS, KT_FUZZ_TC_DIM,
                      KT_FUZZ_TC_STEP, KT_FUZZ_TC_SEED, &file, &len) != 0 ||
        kvedge_basis_parse(file, len, &b, NULL, 0) != KVEDGE_OK ||
        kvedge_basis_register(&b) != KVEDGE_OK)
        abort();
    free(file);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    s_basis_once();
    s_parse_and_decode(data, size);
    /* Random bytes almost never carry a valid checksum, which would stop exploration at the
     * checksum check; a second pass with the trailer fixed up reaches the structure checks
     * after it and the decoders. */
    if (size >= KVEDGE_BLOCK_HEADER_BYTES + KVEDGE_BLOCK_CHECKSUM_BYTES && size <= (1u << 20)) {
        uint8_t *fixed = malloc(size);
        if (!fixed)
            return 0;
        memcpy(fixed, data, size);
        uint64_t h = XXH3_64bits(fixed, size - 8);
        for (int i = 0; i < 8; i++)
            fixed[size - 8 + i] = (uint8_t)(h >> (8 * i));
        s_parse_and_decode(fixed, size);
        free(fixed);
    }
    return 0;
}

static void s_parse_and_decode(const uint8_t *data, size_t size)
{
    kvedge_block_info_t info;
    if (kvedge_block_parse(data, size, &info) != KVEDGE_OK)
        return;
    /* Its sections as stored (kvedge block's view) are read without trusting the records. */
    kvedge_block_section_coding_t sec[4];
    size_t nsec;
    (void)kvedge_block_coding(&info, sec, &nsec);
    /* A parsed block must decode; cap the output so the fuzzer's memory stays bounded. */
    size_t n = (size_t)info.tokens * info.head_dim;
    if (n > (1u << 22))
        return;
    float *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
    if (info.scheme == KVEDGE_SCHEME_TC) {
        /* A tc block that passes the full check decodes, but for a basis it does not fit. */
        const int checked = kvedge_block_check(data, size, NULL);
        const int rc = k && v ? kvedge_block_decode(&info, KVEDGE_DTYPE_FP32, k, v) : KVEDGE_OK;
        if (checked == KVEDGE_OK && rc != KVEDGE_OK && rc != KVEDGE_ENOBASIS &&
            rc != KVEDGE_ESHAPE && rc != KVEDGE_ENOMEM)
            abort();
        if (checked != KVEDGE_OK && checked != KVEDGE_ENOMEM && rc == KVEDGE_OK)
            abort(); /* the decoder accepted what the structural walk refused */
    } else if (k && v && kvedge_block_decode(&info, KVEDGE_DTYPE_FP32, k, v) != KVEDGE_OK &&
               !info.lz4 && !info.ec) {
        abort(); /* an uncompressed, uncoded block that verified must decode */
    }
    /* A coded body that decodes must code back to a block that verifies (and the other way). */
    uint8_t *re = NULL;
    size_t re_len = 0;
    if (info.scheme != KVEDGE_SCHEME_LOSSLESS &&
        kvedge_block_recode(&info, !info.ec, false, &re, &re_len) == KVEDGE_OK &&
        kvedge_block_check(re, re_len, NULL) != KVEDGE_OK)
        abort();
    free(re);
    free(k);
    free(v);
}
