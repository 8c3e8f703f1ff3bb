/* A bounds-checked reader of the safetensors format (Hugging Face model weights): an 8-byte
 * little-endian header length, a JSON header naming each tensor's dtype, shape and byte range,
 * then the raw little-endian tensor data. Nothing in a file is trusted before it is checked. */
#ifndef KVEDGE_CLIENTS_DECODER_SAFETENSORS_H
#define KVEDGE_CLIENTS_DECODER_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest JSON header accepted. The reference implementation uses the same bound; real
 * checkpoints have headers of a few hundred KiB. */
#define KVEDGE_SAFETENSORS_MAX_HEADER_BYTES (100u << 20)
/* Most dimensions a tensor may have. */
#define KVEDGE_SAFETENSORS_MAX_DIMS 8
/* Bytes of the detail message kept for the last failure, NUL included. */
#define KVEDGE_SAFETENSORS_ERROR_BYTES 256

typedef enum {
    KVEDGE_SAFETENSORS_F32 = 1,
    KVEDGE_SAFETENSORS_F16 = 2,
    KVEDGE_SAFETENSORS_BF16 = 3,
} kvedge_safetensors_dtype_t;

/* One tensor of an open file. Every pointer is owned by the file object and valid until it is
 * destroyed. data is not aligned: read it with memcpy or kvedge_safetensors_to_f32. */
typedef struct {
    const char *name;
    kvedge_safetensors_dtype_t dtype;
    uint32_t ndim;
    uint64_t shape[KVEDGE_SAFETENSORS_MAX_DIMS];
    uint64_t numel; /* product of shape; 1 for a scalar (ndim 0) */
    const uint8_t *data;
    size_t nbytes; /* numel * element size, equal to the data_offsets span */
} kvedge_safetensors_tensor_t;

typedef struct _kvedge_safetensors_t kvedge_safetensors_t;

/* Allocates an empty reader; NULL when out of memory. Caller owns the return value. */
kvedge_safetensors_t *kvedge_safetensors_new(void);

/* Frees the reader, its tensor table and its mapping of the file. NULL-safe; nulls *self_p. */
void kvedge_safetensors_destroy(kvedge_safetensors_t **self_p);

/* Maps the file at path read-only and parses it; the mapping lives until destroy.
 * Errors: KVEDGE_EINVAL (already open, NULL argument, unsupported dtype), KVEDGE_EIO (cannot open
 * or map), KVEDGE_ETRUNCATED (shorter than its header says), KVEDGE_ETOOBIG (header length over
 * KVEDGE_SAFETENSORS_MAX_HEADER_BYTES), KVEDGE_ECORRUPT (bad JSON, bad or overlapping offsets,
 * shape that disagrees with the byte range, duplicate name, holes in the data), KVEDGE_ENOMEM.
 * kvedge_safetensors_error() then says which tensor and what was wrong. */
int kvedge_safetensors_open(kvedge_safetensors_t *self, const char *path);

/* As kvedge_safetensors_open, on len bytes in memory; the bytes are copied, so buf may be
 * freed once this returns. */
int kvedge_safetensors_parse(kvedge_safetensors_t *self, const uint8_t *buf, size_t len);

/* Detail of the last failure of open or parse ("" when none); static to the reader. */
const char *kvedge_safetensors_error(const kvedge_safetensors_t *self);

/* Number of tensors, and the i-th in ascending byte-offset order (NULL when out of range). */
size_t kvedge_safetensors_count(const kvedge_safetensors_t *self);
const kvedge_safetensors_tensor_t *kvedge_safetensors_at(const kvedge_safetensors_t *self,
                                                         size_t i);

/* The tensor called name, or NULL. */
const kvedge_safetensors_tensor_t *kvedge_safetensors_find(const kvedge_safetensors_t *self,
                                                           const char *name);

/* The string value of key in the header's __metadata__ object, or NULL. */
const char *kvedge_safetensors_metadata(const kvedge_safetensors_t *self, const char *key);

/* Bytes per element of dtype (0 when invalid), and its safetensors name ("F32", "F16", "BF16"). */
size_t kvedge_safetensors_dtype_size(kvedge_safetensors_dtype_t dtype);
const char *kvedge_safetensors_dtype_name(kvedge_safetensors_dtype_t dtype);

/* Converts a tensor to fp32 into out, which holds out_count floats (at least t->numel); fp16
 * and bf16 convert exactly. Errors: KVEDGE_EINVAL, KVEDGE_ENOSPACE. */
int kvedge_safetensors_to_f32(const kvedge_safetensors_tensor_t *t, float *out, size_t out_count);

#ifdef __cplusplus
}
#endif
#endif
