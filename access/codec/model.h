/* Model shapes: what a KV cache of a model looks like (layers, KV heads, head dim, dtype),
 * with a built-in table of well-known models so no configuration is needed. */
#ifndef KVEDGE_STORE_MODEL_H
#define KVEDGE_STORE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "access/codec/block.h"
#include "access/codec/chunk.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_MODEL_MAX_LAYERS 1024
#define KVEDGE_MODEL_MAX_HEADS  1024

typedef struct {
    char id[KVEDGE_MODEL_ID_MAX_BYTES + 1];
    uint16_t layers;
    uint16_t kv_heads;
    uint16_t head_dim;
    kvedge_dtype_t dtype;
} kvedge_model_t;

/* Checks a shape against the limits. Returns 0 or KVEDGE_EINVAL / KVEDGE_ETOOBIG. */
int kvedge_model_check(const kvedge_model_t *m);

/* Looks a model up in the built-in table by id ("opt-1.3b", "llama-2-7b", ...).
 * Returns 0 or KVEDGE_ENOMODEL. */
int kvedge_model_builtin(const char *id, kvedge_model_t *out);

/* Bytes of the rotary suffix a rotary model's id carries (clients/e2e/e2e.h,
 * kvedge_e2e_model): "@rope-" and 8 lowercase hex digits, a fingerprint of its rotary
 * frequencies. The stored record has no field for them; the id does. */
#define KVEDGE_MODEL_ROPE_SUFFIX_BYTES 14

/* The rotary fingerprint an id ends with ("@rope-XXXXXXXX"), 0 when it has none. */
uint32_t kvedge_model_id_rope(const char *id);

/* kvedge_model_builtin for an id with a rotary suffix whose base (the id without it) is built
 * in: the base's shape under the whole id, in fp16 (what kvedge_e2e_prefill stores). What a
 * proxy with no master knows of "llama-3.2-1b@rope-XXXXXXXX". Returns 0 or KVEDGE_ENOMODEL. */
int kvedge_model_builtin_rope(const char *id, kvedge_model_t *out);

/* The built-in table: *n entries, static storage. */
const kvedge_model_t *kvedge_model_builtins(size_t *n);

/* fp16 bytes of K and V of the whole model for n tokens. */
uint64_t kvedge_model_fp16_bytes(const kvedge_model_t *m, uint64_t tokens);

/* Fixed-size serialization used by the engine's models column family. */
#define KVEDGE_MODEL_RECORD_BYTES 16
/* pack writes the shape of *m (not its id) as KVEDGE_MODEL_RECORD_BYTES bytes into the
 * caller's out; it never fails. unpack reads such a record (len bytes at buf) back into *out
 * with the given id: KVEDGE_ECORRUPT for a NULL argument, a wrong len or record version, an id
 * longer than KVEDGE_MODEL_ID_MAX_BYTES, or a shape that is not a valid model
 * (kvedge_model_check). */
void kvedge_model_pack(const kvedge_model_t *m, uint8_t out[KVEDGE_MODEL_RECORD_BYTES]);
int kvedge_model_unpack(const char *id, const uint8_t *buf, size_t len, kvedge_model_t *out);

#ifdef __cplusplus
}
#endif
#endif
