/* Chained chunk ids over libsodium's BLAKE2b (crypto_generichash). */
#include "access/codec/chunk.h"

#include <sodium.h>
#include <string.h>

#include "access/codec/byteorder.h"
#include "access/codec/error.h"

/* Field tags: each hashed field is tag, 32-bit little-endian length, bytes. Tagging and
 * length-prefixing make the encoding injective, so no two inputs hash the same bytes. */
enum {
    S_TAG_DOMAIN = 0x01,
    S_TAG_SALT = 0x02,
    S_TAG_MODEL = 0x03,
    S_TAG_PARENT = 0x04,
    S_TAG_TOKENS = 0x05
};

static void s_field(crypto_generichash_state *st, uint8_t tag, const void *data, size_t len)
{
    uint8_t hdr[5] = {tag, (uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16),
                      (uint8_t)(len >> 24)};
    crypto_generichash_update(st, hdr, sizeof hdr);
    if (len)
        crypto_generichash_update(st, data, len);
}

int kvedge_chunk_id(const uint8_t *salt, size_t salt_len, const char *model_id,
                    const kvedge_chunk_id_t *parent, const uint32_t *tokens, size_t n_tokens,
                    kvedge_chunk_id_t *out)
{
    if (!model_id || !*model_id || !tokens || n_tokens == 0 || !out || (salt_len && !salt))
        return KVEDGE_EINVAL;
    size_t model_len = strlen(model_id);
    if (salt_len > KVEDGE_SALT_MAX_BYTES || model_len > KVEDGE_MODEL_ID_MAX_BYTES ||
        n_tokens > KVEDGE_CHUNK_TOKENS_MAX)
        return KVEDGE_ETOOBIG;
    static const char domain[] = "kvedge.chunk.v1";
    if (sodium_init() < 0) /* idempotent and thread-safe; picks the fast BLAKE2b */
        return KVEDGE_ENOMEM;
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, KVEDGE_CHUNK_ID_BYTES);
    s_field(&st, S_TAG_DOMAIN, domain, sizeof domain - 1);
    s_field(&st, S_TAG_SALT, salt, salt_len);
    s_field(&st, S_TAG_MODEL, model_id, model_len);
    s_field(&st, S_TAG_PARENT, parent ? parent->bytes : NULL, parent ? KVEDGE_CHUNK_ID_BYTES : 0);
    /* Tokens as 32-bit little-endian, hashed in slices to keep the stack small. */
    uint8_t le[4 * 256];
    uint8_t hdr[5] = {S_TAG_TOKENS};
    size_t bytes = n_tokens * 4;
    for (int i = 0; i < 4; i++)
        hdr[1 + i] = (uint8_t)(bytes >> (8 * i));
    crypto_generichash_update(&st, hdr, sizeof hdr);
    for (size_t i = 0; i < n_tokens;) {
        size_t n = n_tokens - i < 256 ? n_tokens - i : 256;
        for (size_t j = 0; j < n; j++) {
            uint32_t t = tokens[i + j];
            le[4 * j] = (uint8_t)t;
            le[4 * j + 1] = (uint8_t)(t >> 8);
            le[4 * j + 2] = (uint8_t)(t >> 16);
            le[4 * j + 3] = (uint8_t)(t >> 24);
        }
        crypto_generichash_update(&st, le, 4 * n);
        i += n;
    }
    crypto_generichash_final(&st, out->bytes, KVEDGE_CHUNK_ID_BYTES);
    return KVEDGE_OK;
}

int kvedge_chunk_chain(const uint8_t *salt, size_t salt_len, const char *model_id,
                       const uint32_t *tokens, size_t n_tokens, uint32_t chunk_tokens,
                       kvedge_chunk_id_t *ids, size_t max_ids)
{
    if (chunk_tokens == 0)
        chunk_tokens = KVEDGE_CHUNK_TOKENS_DEFAULT;
    if (chunk_tokens > KVEDGE_CHUNK_TOKENS_MAX)
        return KVEDGE_ETOOBIG;
    if (!tokens || n_tokens == 0 || (max_ids && !ids))
        return KVEDGE_EINVAL;
    size_t n_chunks = (n_tokens + chunk_tokens - 1) / chunk_tokens;
    if (n_chunks > (size_t)INT32_MAX)
        return KVEDGE_ETOOBIG;
    kvedge_chunk_id_t prev;
    for (size_t c = 0; c < n_chunks && c < max_ids; c++) {
        size_t off = c * chunk_tokens;
        size_t n = n_tokens - off < chunk_tokens ? n_tokens - off : chunk_tokens;
        int rc =
            kvedge_chunk_id(salt, salt_len, model_id, c ? &prev : NULL, tokens + off, n, &ids[c]);
        if (rc != KVEDGE_OK)
            return rc;
        prev = ids[c];
    }
    if (max_ids == 0) { /* validate arguments even when only asked for the count */
        kvedge_chunk_id_t tmp;
        size_t n = n_tokens < chunk_tokens ? n_tokens : chunk_tokens;
        int rc = kvedge_chunk_id(salt, salt_len, model_id, NULL, tokens, n, &tmp);
        if (rc != KVEDGE_OK)
            return rc;
    }
    return (int)n_chunks;
}

char *kvedge_chunk_id_hex(const kvedge_chunk_id_t *id, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < KVEDGE_CHUNK_ID_BYTES; i++) {
        out[2 * i] = digits[id->bytes[i] >> 4];
        out[2 * i + 1] = digits[id->bytes[i] & 15];
    }
    out[2 * KVEDGE_CHUNK_ID_BYTES] = '\0';
    return out;
}

static int s_hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int kvedge_chunk_id_parse(const char *hex, kvedge_chunk_id_t *out)
{
    if (!hex || !out || strlen(hex) != 2 * KVEDGE_CHUNK_ID_BYTES)
        return KVEDGE_EINVAL;
    for (int i = 0; i < KVEDGE_CHUNK_ID_BYTES; i++) {
        int hi = s_hexval(hex[2 * i]), lo = s_hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return KVEDGE_EINVAL;
        out->bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    return KVEDGE_OK;
}

void kvedge_block_key_pack(const kvedge_block_key_t *key, uint8_t out[KVEDGE_BLOCK_KEY_BYTES])
{
    memcpy(out, key->chunk.bytes, KVEDGE_CHUNK_ID_BYTES);
    kvedge_be_put16(out + KVEDGE_CHUNK_ID_BYTES, key->layer);
    kvedge_be_put16(out + KVEDGE_CHUNK_ID_BYTES + 2, key->head);
}

void kvedge_block_key_unpack(const uint8_t in[KVEDGE_BLOCK_KEY_BYTES], kvedge_block_key_t *key)
{
    memcpy(key->chunk.bytes, in, KVEDGE_CHUNK_ID_BYTES);
    key->layer = kvedge_be_get16(in + KVEDGE_CHUNK_ID_BYTES);
    key->head = kvedge_be_get16(in + KVEDGE_CHUNK_ID_BYTES + 2);
}
