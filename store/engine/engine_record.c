/* The block engine's record layouts: the meta record of a block and the prefix record of a
 * chunk, packed and checked here and nowhere else. */
#include "store/engine/engine_impl.h"

/* Layout: version u8, dtype u8, scheme u8, flags u8 (1 lz4, 2 pinned; version 2 also 4
 * demoted), bytes u32, tokens u32, head_dim u16, key_channels u16, group_size u16, zero u16
 * (version 2: the rung it was demoted from u8, zero u8), zero u32, checksum u64, created u64,
 * atime u64, expires u64. A block that is not demoted is written as version 1, which every
 * kvedge reads; an older kvedge refuses a version-2 record (it reads the block as damaged). */
void kvedge_engine_meta_pack(const kvedge_block_meta_t *m, uint8_t out[S_META_RECORD_BYTES])
{
    memset(out, 0, S_META_RECORD_BYTES);
    out[0] = m->demoted ? S_META_VERSION_DEMOTED : S_META_VERSION;
    out[1] = (uint8_t)m->dtype;
    out[2] = (uint8_t)m->scheme;
    out[3] = (uint8_t)((m->lz4 ? 1 : 0) | (m->pinned ? 2 : 0) | (m->demoted ? 4 : 0));
    if (m->demoted)
        out[18] = m->demoted_from;
    kvedge_le_put32(out + 4, m->bytes);
    kvedge_le_put32(out + 8, m->tokens);
    kvedge_le_put16(out + 12, m->head_dim);
    kvedge_le_put16(out + 14, m->key_channels);
    kvedge_le_put16(out + 16, m->group_size);
    kvedge_le_put64(out + 24, m->checksum);
    kvedge_le_put64(out + 32, m->created_ms);
    kvedge_le_put64(out + 40, m->atime_ms);
    kvedge_le_put64(out + 48, m->expires_ms);
}

int kvedge_engine_meta_unpack(const uint8_t *in, size_t len, kvedge_block_meta_t *m)
{
    if (len != S_META_RECORD_BYTES || kvedge_le_get32(in + 20) != 0)
        return KVEDGE_ECORRUPT;
    /* Version 1: no demotion; version 2: demoted, with the rung it came from. */
    bool v1 = in[0] == S_META_VERSION;
    if (v1 ? (in[3] & ~3u) != 0 || kvedge_le_get16(in + 18) != 0
           : in[0] != S_META_VERSION_DEMOTED || (in[3] & ~7u) != 0 || !(in[3] & 4) || in[19] != 0)
        return KVEDGE_ECORRUPT;
    memset(m, 0, sizeof *m);
    m->dtype = (kvedge_dtype_t)in[1];
    m->scheme = (kvedge_scheme_t)in[2];
    m->lz4 = (in[3] & 1) != 0;
    m->pinned = (in[3] & 2) != 0;
    m->bytes = kvedge_le_get32(in + 4);
    m->tokens = kvedge_le_get32(in + 8);
    m->head_dim = kvedge_le_get16(in + 12);
    m->key_channels = kvedge_le_get16(in + 14);
    m->group_size = kvedge_le_get16(in + 16);
    m->checksum = kvedge_le_get64(in + 24);
    m->created_ms = kvedge_le_get64(in + 32);
    m->atime_ms = kvedge_le_get64(in + 40);
    m->expires_ms = kvedge_le_get64(in + 48);
    m->demoted = !v1;
    m->demoted_from = v1 ? KVEDGE_PREC_STORED : in[18];
    if (kvedge_dtype_size(m->dtype) == 0 || m->scheme > KVEDGE_SCHEME_INT4 ||
        m->bytes < KVEDGE_BLOCK_HEADER_BYTES + KVEDGE_BLOCK_CHECKSUM_BYTES ||
        m->bytes > KVEDGE_BLOCK_MAX_BYTES || m->tokens == 0 ||
        m->tokens > KVEDGE_BLOCK_MAX_TOKENS || m->head_dim == 0 ||
        m->head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM || m->key_channels > m->head_dim)
        return KVEDGE_ECORRUPT;
    return KVEDGE_OK;
}

/* Layout: version u8, flags u8 (1 has_parent), model id length u16, index u32, tokens u32,
 * zero u32, created u64, parent id (32 bytes), tenant tag (16), client name (32), model id
 * (no terminator). */
size_t kvedge_engine_prefix_pack(const kvedge_chunk_info_t *c, uint8_t out[S_PREFIX_MAX_BYTES])
{
    size_t mlen = strlen(c->model_id);
    memset(out, 0, S_PREFIX_FIXED_BYTES);
    out[0] = S_PREFIX_VERSION;
    out[1] = c->has_parent ? 1 : 0;
    kvedge_le_put16(out + 2, (uint16_t)mlen);
    kvedge_le_put32(out + 4, c->index);
    kvedge_le_put32(out + 8, c->tokens);
    kvedge_le_put64(out + 16, c->created_ms);
    if (c->has_parent)
        memcpy(out + 24, c->parent.bytes, KVEDGE_CHUNK_ID_BYTES);
    static const uint8_t zero[KVEDGE_CHUNK_ID_BYTES];
    bool named = memcmp(c->name.bytes, zero, sizeof zero) != 0;
    memcpy(out + 56, c->tenant, 16);
    memcpy(out + 72, named ? c->name.bytes : c->id.bytes, KVEDGE_CHUNK_ID_BYTES);
    memcpy(out + S_PREFIX_FIXED_BYTES, c->model_id, mlen);
    return S_PREFIX_FIXED_BYTES + mlen;
}

int kvedge_engine_prefix_unpack(const uint8_t *key, size_t klen, const uint8_t *in, size_t len,
                                kvedge_chunk_info_t *c)
{
    static const uint8_t zero[KVEDGE_CHUNK_ID_BYTES];
    if (klen != KVEDGE_CHUNK_ID_BYTES || len < S_PREFIX_FIXED_BYTES || in[0] != S_PREFIX_VERSION ||
        (in[1] & ~1u) != 0 || kvedge_le_get32(in + 12) != 0)
        return KVEDGE_ECORRUPT;
    size_t mlen = kvedge_le_get16(in + 2);
    if (mlen == 0 || mlen > KVEDGE_MODEL_ID_MAX_BYTES || len != S_PREFIX_FIXED_BYTES + mlen ||
        memchr(in + S_PREFIX_FIXED_BYTES, 0, mlen) != NULL)
        return KVEDGE_ECORRUPT;
    memset(c, 0, sizeof *c);
    memcpy(c->id.bytes, key, KVEDGE_CHUNK_ID_BYTES);
    c->has_parent = (in[1] & 1) != 0;
    c->index = kvedge_le_get32(in + 4);
    c->tokens = kvedge_le_get32(in + 8);
    c->created_ms = kvedge_le_get64(in + 16);
    memcpy(c->parent.bytes, in + 24, KVEDGE_CHUNK_ID_BYTES);
    memcpy(c->tenant, in + 56, 16);
    memcpy(c->name.bytes, in + 72, KVEDGE_CHUNK_ID_BYTES);
    memcpy(c->model_id, in + S_PREFIX_FIXED_BYTES, mlen);
    if (c->tokens == 0 || c->tokens > KVEDGE_CHUNK_TOKENS_MAX ||
        (!c->has_parent && memcmp(c->parent.bytes, zero, sizeof zero) != 0))
        return KVEDGE_ECORRUPT;
    return KVEDGE_OK;
}
