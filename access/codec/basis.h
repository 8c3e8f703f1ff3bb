/* Coding bases: the per-model metadata of the transform-coded rung ("tc", the lossy
 * entropy-coded precision of docs/block-format.md). A basis file holds, for every layer and KV
 * head of one model, K then V: the forward transform the encoder projects on, its inverse the
 * decoder reconstructs with (fp16, as the study fixed it), and the quantization step of the
 * components. It is fitted offline on calibration text (scripts/fit_basis.py: a weighted
 * KLT) and given to every process that encodes or decodes tc blocks of the model: store nodes
 * that derive the rung (`basis = DIR`), clients that decode it (kvedge_basis_load_dir).
 *
 * File layout (little-endian; docs/block-format.md "Coding bases"):
 *   0     8   magic "KVEDGEKB"
 *   8     2   version, 1
 *   10    2   flags, 0 (every other value refused)
 *   12    2   head_dim D (1..KVEDGE_BLOCK_MAX_HEAD_DIM)
 *   14    2   reserved, 0
 *   16    4   layers L (1..KVEDGE_MODEL_MAX_LAYERS)
 *   20    4   kv_heads H (1..KVEDGE_MODEL_MAX_HEADS)
 *   24    132 model id, 1..KVEDGE_MODEL_ID_MAX_BYTES bytes then NUL padding (at least one NUL)
 *   156   L*H*2 sections in the order layer, head, K then V, each:
 *             4      step, fp32: finite, > 0, exactly an fp16 value (normal)
 *             4*D*D  fwd [D][D] fp32 row-major, finite (y[j] = sum_c (x[c] - m[c]) fwd[c][j])
 *             2*D*D  inv [D][D] fp16 row-major, finite (x[c] = m[c] + sum_j y[j] inv[j][c])
 *   end   32  BLAKE2b-256 (crypto_generichash, no key) of every byte before it
 * The file must end exactly there; at most KVEDGE_BASIS_MAX_BYTES.
 * The basis id is the first 8 bytes of the digest read as a little-endian u64; every tc block
 * names the basis it was coded with by that id. */
#ifndef KVEDGE_CODEC_BASIS_H
#define KVEDGE_CODEC_BASIS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_BASIS_MAGIC        "KVEDGEKB"
#define KVEDGE_BASIS_VERSION      1
#define KVEDGE_BASIS_HEADER_BYTES 156u
#define KVEDGE_BASIS_DIGEST_BYTES 32u
#define KVEDGE_BASIS_MAX_BYTES    (256u << 20)
/* Bases one process holds at most (kvedge_basis_register). */
#define KVEDGE_BASIS_MAX_LOADED 64
/* File names kvedge_basis_load_dir reads: "*.kvb". */
#define KVEDGE_BASIS_SUFFIX ".kvb"

typedef struct kvedge_basis kvedge_basis_t;

/* One section of a basis, as the codec uses it (fp32, converted once at parse). */
typedef struct {
    uint32_t dim;     /* D */
    float step;       /* the components' quantization step */
    const float *fwd; /* [D][D] */
    const float *inv; /* [D][D], the fp16 values of the file as fp32 */
} kvedge_basis_section_t;

/* Parses and checks a whole basis file held in memory (copied: buf may be freed after).
 * Errors: KVEDGE_EINVAL (NULL), KVEDGE_ETRUNCATED (shorter than its header says),
 * KVEDGE_ECORRUPT (bad magic, a length that is not exactly the header's, a digest that does not
 * match, a non-finite value, a step that is not a positive normal fp16 value, a model id without
 * NUL or empty, a reserved field or flag not 0), KVEDGE_EVERSION (another version),
 * KVEDGE_ETOOBIG (over KVEDGE_BASIS_MAX_BYTES or the shape limits), KVEDGE_ENOMEM. why (may be
 * NULL) gets one line saying which check failed. */
int kvedge_basis_parse(const uint8_t *buf, size_t len, kvedge_basis_t **out, char *why,
                       size_t why_len);
/* kvedge_basis_parse of a file's bytes; KVEDGE_EIO when it cannot be read (why names it). */
int kvedge_basis_load(const char *path, kvedge_basis_t **out, char *why, size_t why_len);
/* Frees a basis that is not registered; sets *b to NULL. */
void kvedge_basis_free(kvedge_basis_t **b);

/* The basis's id (basis.h's head comment), model id (valid as long as b) and shape; 0 or NULL
 * for NULL. */
uint64_t kvedge_basis_id(const kvedge_basis_t *b);
const char *kvedge_basis_model(const kvedge_basis_t *b);
uint32_t kvedge_basis_layers(const kvedge_basis_t *b);
uint32_t kvedge_basis_kv_heads(const kvedge_basis_t *b);
uint32_t kvedge_basis_head_dim(const kvedge_basis_t *b);

/* The section of (layer, head), K (which 0) or V (which 1). KVEDGE_EINVAL for NULL or an index
 * outside the basis. */
int kvedge_basis_section(const kvedge_basis_t *b, uint32_t layer, uint32_t head, int which,
                         kvedge_basis_section_t *out);

/* The process's registry of bases: what tc encoding and decoding look bases up in. Registered
 * bases live until the process exits (lookups return stable pointers; nothing is ever
 * unregistered). Thread-safe.
 * kvedge_basis_register takes ownership of *b (sets it to NULL) on success and on
 * KVEDGE_OK-equivalent duplicates: a basis whose id is already registered is freed and the
 * call succeeds. Errors: KVEDGE_EINVAL (NULL), KVEDGE_EFULL (KVEDGE_BASIS_MAX_LOADED held),
 * KVEDGE_EAMBIGUOUS (another basis of the same model is registered: one basis per model per
 * process; *b is left to the caller). */
int kvedge_basis_register(kvedge_basis_t **b);
/* The registered basis with this id, or NULL. */
const kvedge_basis_t *kvedge_basis_find(uint64_t id);
/* The registered basis of this model id, or NULL. */
const kvedge_basis_t *kvedge_basis_find_model(const char *model_id);
/* Loads and registers every "*.kvb" file of dir, in name order. *loaded (may be NULL) gets how
 * many were registered (duplicates count). The first file that fails stops the load: its error
 * is returned and why names the file and the check; the ones before it stay registered.
 * KVEDGE_EIO when dir cannot be read. */
int kvedge_basis_load_dir(const char *dir, size_t *loaded, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif
