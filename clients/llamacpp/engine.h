/* The llama.cpp bridge as a shared library for callers through an FFI (the Python package's
 * kvedge.llamacpp, over ctypes): libkvedge_llamacpp.so, beside libkvedge.so, linking it and
 * libllama. An engine is a GGUF model loaded by llama.cpp with one context; import, export,
 * the model check and greedy generation are the bridge's (bridge.h), on the engine's model
 * record, cache layout and context. docs/llamacpp.md, "From Python".
 *
 * Every call returns 0 or a negative KVEDGE_E* code and, where it takes why (room for
 * why_len bytes, KVEDGE_LLAMACPP_WHY_BYTES is enough), says there what was wrong ("" when the
 * code says it all). An engine is used by one thread at a time. */
#ifndef KVEDGE_CLIENTS_LLAMACPP_ENGINE_H
#define KVEDGE_CLIENTS_LLAMACPP_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clients/llamacpp/bridge.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI's version: libkvedge_llamacpp.so.KVEDGE_LLAMACPP_SOVERSION. */
#define KVEDGE_LLAMACPP_SOVERSION 1

/* Positions per sequence when the options leave n_ctx 0. */
#define KVEDGE_LLAMACPP_N_CTX_DEFAULT 4096

typedef struct kvedge_llamacpp_engine kvedge_llamacpp_engine_t;

/* How to open an engine. */
typedef struct {
    size_t size;          /* sizeof(kvedge_llamacpp_engine_opts_t): _default sets it */
    const char *model_id; /* the kvedge model id; the rotary suffix is appended (required) */
    uint32_t n_ctx;       /* positions per sequence: context + prompt + generated; 0 = 4096 */
    uint32_t n_seq;       /* sequences (a cache stream each); 0 = 1 */
    uint32_t threads;     /* llama.cpp's threads; 0 = the online CPUs, at most 4 */
    int cache;            /* KVEDGE_LLAMACPP_F16 (the default) or KVEDGE_LLAMACPP_F32 */
} kvedge_llamacpp_engine_opts_t;

/* Defaults: size set, model_id NULL, n_ctx 0 (4096), one sequence, threads 0, an F16 cache. */
void kvedge_llamacpp_engine_opts_default(kvedge_llamacpp_engine_opts_t *o);

/* sizeof the named struct as this library lays it out ("kvedge_llamacpp_engine_opts_t",
 * "kvedge_llamacpp_import_t", "kvedge_llamacpp_import_stats_t", "kvedge_llamacpp_export_t",
 * "kvedge_llamacpp_export_stats_t", "kvedge_model_t", "kvedge_chunk_id_t"), so an FFI mirror
 * checks its own before a call; 0 for another name or NULL. */
size_t kvedge_llamacpp_engine_sizeof(const char *type);

/* 0 when the libllama this library loaded is the llama.cpp whose state layout the bridge
 * knows; KVEDGE_EVERSION otherwise, why naming both versions. */
int kvedge_llamacpp_engine_version(char *why, size_t why_len);

/* Opens an engine: checks the llama.cpp version, loads llama.cpp's CPU backends
 * (kvedge_llamacpp_backend_init), the GGUF at gguf_path, reads its shape and rotary settings
 * as the kvedge model record under o->model_id, and makes a context of o->n_seq sequences of
 * o->n_ctx positions with flash attention disabled. Caller owns *out
 * (kvedge_llamacpp_engine_destroy). Errors, why saying what: KVEDGE_EINVAL (NULL, o->size not
 * this struct's, no model_id, a cache type or size llama.cpp cannot make), KVEDGE_EVERSION
 * (another llama.cpp), KVEDGE_EIO (the file cannot be opened, or llama.cpp cannot load it),
 * KVEDGE_ESHAPE (an architecture, head shape or rotary scaling the bridge does not know; an id
 * carrying another rotary suffix), KVEDGE_ENOMEM. */
int kvedge_llamacpp_engine_open(const char *gguf_path, const kvedge_llamacpp_engine_opts_t *o,
                                kvedge_llamacpp_engine_t **out, char *why, size_t why_len);

/* Frees the engine's context and model; NULL-safe, sets *e to NULL. */
void kvedge_llamacpp_engine_destroy(kvedge_llamacpp_engine_t **e);

/* The kvedge model record the engine stores and fetches under (id with its rotary suffix,
 * fp16); owned by the engine, valid until it is destroyed. NULL for a NULL engine. */
const kvedge_model_t *kvedge_llamacpp_engine_model(const kvedge_llamacpp_engine_t *e);

/* The GGUF's general.architecture ("llama" or "qwen2"); static storage of the engine, valid
 * until it is destroyed. NULL for a NULL engine. */
const char *kvedge_llamacpp_engine_arch(const kvedge_llamacpp_engine_t *e);

/* Tokens in the GGUF's vocabulary (0 for a NULL engine). */
uint32_t kvedge_llamacpp_engine_vocab(const kvedge_llamacpp_engine_t *e);

/* Positions each sequence holds at most (0 for a NULL engine). */
uint32_t kvedge_llamacpp_engine_n_ctx(const kvedge_llamacpp_engine_t *e);

/* The engine's llama.cpp context (a struct llama_context *), for a caller that drives llama.cpp
 * itself with the same libllama; owned by the engine. NULL for a NULL engine. */
void *kvedge_llamacpp_engine_context(kvedge_llamacpp_engine_t *e);

/* Text (len bytes) to token ids with the GGUF's vocabulary (kvedge_llamacpp_tokenize): at most
 * cap ids into out, *n how many the text has. Errors: KVEDGE_EINVAL (NULL, a text llama.cpp
 * cannot tokenize), KVEDGE_ENOSPACE (more than cap: *n says how many). */
int kvedge_llamacpp_engine_tokenize(const kvedge_llamacpp_engine_t *e, const char *text, size_t len,
                                    bool add_special, bool parse_special, int32_t *out, size_t cap,
                                    size_t *n);

/* Token ids to text (llama_detokenize; special: special tokens written out, else left out):
 * at most cap bytes into out, not NUL-terminated; *len how many the text has. Errors:
 * KVEDGE_EINVAL (NULL, an id outside the vocabulary), KVEDGE_ENOSPACE (more than cap bytes:
 * *len says how many). */
int kvedge_llamacpp_engine_detokenize(const kvedge_llamacpp_engine_t *e, const int32_t *tokens,
                                      uint32_t n, bool special, char *out, size_t cap, size_t *len);

/* The model check: 0 when the kvedge record m describes the engine's GGUF (layers, KV heads,
 * head dim, rotary fingerprint); KVEDGE_ESHAPE with why naming the first field that differs,
 * KVEDGE_EINVAL for NULL. */
int kvedge_llamacpp_engine_check(const kvedge_llamacpp_engine_t *e, const kvedge_model_t *m,
                                 char *why, size_t why_len);

/* The next position of sequence seq (0 when empty) into *pos. Errors: KVEDGE_EINVAL (NULL, a
 * sequence the engine does not have). */
int kvedge_llamacpp_engine_pos(kvedge_llamacpp_engine_t *e, int32_t seq, int32_t *pos);

/* Empties sequence seq. Errors: KVEDGE_EINVAL (NULL, a sequence the engine does not have). */
int kvedge_llamacpp_engine_clear(kvedge_llamacpp_engine_t *e, int32_t seq);

/* llama.cpp runs the n tokens (ids below the vocabulary) through sequence seq at its next
 * positions (kvedge_llamacpp_prefill), leaving the logits of the last. Errors, why saying
 * what: KVEDGE_EINVAL (NULL, n 0, a token id out of range, a sequence the engine does not
 * have), KVEDGE_ETOOBIG (past n_ctx), KVEDGE_EIO (llama_decode failed), KVEDGE_ENOMEM. */
int kvedge_llamacpp_engine_prefill(kvedge_llamacpp_engine_t *e, int32_t seq, const int32_t *tokens,
                                   uint32_t n, char *why, size_t why_len);

/* Imports a context into sequence seq (kvedge_llamacpp_import, with the engine's model and
 * cache layout): req->model NULL means the engine's record, another one is checked against
 * the GGUF first. seq then holds the context at positions 0 .. req->n - 1. Errors: those of
 * kvedge_llamacpp_import, why saying what; on every error seq is as it was. stats may be
 * NULL. */
int kvedge_llamacpp_engine_import(kvedge_llamacpp_engine_t *e, int32_t seq,
                                  const kvedge_llamacpp_import_t *req,
                                  kvedge_llamacpp_import_stats_t *stats, char *why, size_t why_len);

/* An export: where the context goes and how it is stored. */
typedef struct {
    size_t size;                 /* sizeof(kvedge_llamacpp_export_t): _default sets it */
    kvedge_client_t *cloud;      /* the store node */
    const kvedge_model_t *model; /* NULL: the engine's record */
    const int32_t *ctx;          /* the context's token ids, as the sequence was prefilled */
    uint32_t n;                  /* tokens, >= 1 */
    uint32_t chunk_tokens;       /* 0 = KVEDGE_E2E_CHUNK_TOKENS_DEFAULT */
    kvedge_scheme_t scheme;      /* lossless, int8 or int4 */
    kvedge_dtype_t dtype;        /* element type of lossless blocks: fp16 or fp32 */
    uint16_t group_size;         /* int4 groups; 0 = the codec's default */
    bool compress;               /* lz4 on bodies where it helps */
    bool pin;
    uint32_t ttl_s; /* 0 = the node's default */
} kvedge_llamacpp_export_t;

/* Defaults: size set, int8, fp16, group 0, lz4 on, not pinned, the node's TTL (as
 * kvedge_e2e_quant_default), everything else 0 / NULL. */
void kvedge_llamacpp_export_default(kvedge_llamacpp_export_t *req);

/* Exports sequence seq, which llama.cpp prefilled with exactly req->ctx at positions
 * 0 .. req->n - 1, to req->cloud as blocks (kvedge_llamacpp_export; the model record put
 * first); ids (room for max) gets the chunk chain. Errors: KVEDGE_EINVAL (NULL, size, bad
 * scheme or dtype), those of kvedge_llamacpp_export, why saying what. The engine is only read.
 * stats may be NULL. */
int kvedge_llamacpp_engine_export(kvedge_llamacpp_engine_t *e, int32_t seq,
                                  const kvedge_llamacpp_export_t *req, kvedge_chunk_id_t *ids,
                                  size_t max, kvedge_llamacpp_export_stats_t *stats, char *why,
                                  size_t why_len);

/* Decodes the prompt (n_prompt >= 1 ids) on sequence seq at its next positions, then
 * max_new greedy tokens into gen (kvedge_llamacpp_generate). ttft_us (may be NULL): the
 * microseconds from the call to the first generated token. Errors, why saying what:
 * KVEDGE_EINVAL (NULL, max_new 0, a token id out of range, a sequence the engine does not
 * have), KVEDGE_ETOOBIG (prompt and tokens past n_ctx), KVEDGE_EIO (llama_decode failed),
 * KVEDGE_ENOMEM. */
int kvedge_llamacpp_engine_generate(kvedge_llamacpp_engine_t *e, int32_t seq, const int32_t *prompt,
                                    uint32_t n_prompt, uint32_t max_new, int32_t *gen,
                                    double *ttft_us, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif
