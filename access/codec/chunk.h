/* Chunk ids: chained BLAKE2b over (namespace salt, model, parent id, tokens), so a prefix's
 * chunks form a chain and "longest cached prefix" is a walk down it. */
#ifndef KVEDGE_STORE_CHUNK_H
#define KVEDGE_STORE_CHUNK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_CHUNK_ID_BYTES       32
#define KVEDGE_CHUNK_ID_HEX_BYTES   (2 * KVEDGE_CHUNK_ID_BYTES + 1)
#define KVEDGE_CHUNK_TOKENS_DEFAULT 256
#define KVEDGE_CHUNK_TOKENS_MAX     65536
#define KVEDGE_SALT_MAX_BYTES       64
#define KVEDGE_MODEL_ID_MAX_BYTES   128

typedef struct {
    uint8_t bytes[KVEDGE_CHUNK_ID_BYTES];
} kvedge_chunk_id_t;

/* Id of one chunk. parent is NULL for the first chunk of a sequence. salt (the tenant
 * namespace) may be empty. Errors: KVEDGE_EINVAL (NULL, empty model, zero tokens),
 * KVEDGE_ETOOBIG (salt, model id or token count past its limit). */
int kvedge_chunk_id(const uint8_t *salt, size_t salt_len, const char *model_id,
                    const kvedge_chunk_id_t *parent, const uint32_t *tokens, size_t n_tokens,
                    kvedge_chunk_id_t *out);

/* The chain of ids for a token sequence cut into chunks of chunk_tokens (0 = default); a
 * final partial chunk gets an id too. Writes at most max_ids ids and returns the number of
 * chunks the sequence has (so a caller can size the array: pass max_ids 0 to ask), or a
 * negative error as kvedge_chunk_id. */
int kvedge_chunk_chain(const uint8_t *salt, size_t salt_len, const char *model_id,
                       const uint32_t *tokens, size_t n_tokens, uint32_t chunk_tokens,
                       kvedge_chunk_id_t *ids, size_t max_ids);

/* Lower-case hex of an id into out (KVEDGE_CHUNK_ID_HEX_BYTES). Returns out. */
char *kvedge_chunk_id_hex(const kvedge_chunk_id_t *id, char *out);

/* Parses exactly 64 hex digits. Returns 0 or KVEDGE_EINVAL. */
int kvedge_chunk_id_parse(const char *hex, kvedge_chunk_id_t *out);

/* ---------------------------------------------------------------- blocks and chunk records */

/* Block key: chunk id (32 bytes) | layer (u16 big-endian) | head (u16 big-endian). */
#define KVEDGE_BLOCK_KEY_BYTES (KVEDGE_CHUNK_ID_BYTES + 4)
/* A put_opts ttl_s meaning "never expires", whatever the engine default. */
#define KVEDGE_TTL_NEVER UINT32_MAX

/* The address of one block: one head of one layer of one chunk. */
typedef struct {
    kvedge_chunk_id_t chunk;
    uint16_t layer;
    uint16_t head;
} kvedge_block_key_t;

/* A chunk (one link of a prefix chain) as registered in the prefixes column family. */
typedef struct {
    kvedge_chunk_id_t id;
    kvedge_chunk_id_t parent; /* all zero when has_parent is false */
    bool has_parent;
    char model_id[KVEDGE_MODEL_ID_MAX_BYTES + 1];
    uint32_t index;  /* position in the chain, 0 = first chunk */
    uint32_t tokens; /* tokens in this chunk */
    uint64_t created_ms;
    /* Set by a node serving tenants (store/node/server.c): the tenant tag, and the id the client
     * knows the chunk by (id is then the namespaced id). Both zero for local use; a zero name
     * is stored as id. */
    uint8_t tenant[16];
    kvedge_chunk_id_t name;
} kvedge_chunk_info_t;

/* A block key as its KVEDGE_BLOCK_KEY_BYTES bytes (the order keys sort in a store and on the
 * wire) and back: pack writes exactly that many bytes into the caller's out; unpack reads as
 * many from in into *key. Neither fails nor allocates. */
void kvedge_block_key_pack(const kvedge_block_key_t *key, uint8_t out[KVEDGE_BLOCK_KEY_BYTES]);
void kvedge_block_key_unpack(const uint8_t in[KVEDGE_BLOCK_KEY_BYTES], kvedge_block_key_t *key);

#ifdef __cplusplus
}
#endif
#endif
