/* The llama.cpp bridge: a context's K/V fetched through kvedge into a llama.cpp sequence
 * (import, the edge), and a sequence llama.cpp prefilled put to kvedge as blocks (export, the
 * cloud), over llama.cpp's public state API (llama_state_seq_get_data / _set_data) and the
 * pinned state layout (state.h). docs/llamacpp.md.
 *
 * Built only when a llama.cpp install is given (-DKVEDGE_LLAMACPP=DIR with include/llama.h and
 * lib/libllama.so), or at test time against the fixture's libraries (tests/decoder/
 * fetch_llamacpp.sh); kvedge builds without it. Everything here is checked before a byte goes
 * into llama.cpp: the library's version, the GGUF model against the kvedge model record, the
 * cache's element type and the context's size. On any error the llama.cpp context is left as
 * it was (the target sequence's previous content is put back). */
#ifndef KVEDGE_CLIENTS_LLAMACPP_BRIDGE_H
#define KVEDGE_CLIENTS_LLAMACPP_BRIDGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <llama.h>

#include "clients/decoder/decoder.h"
#include "clients/e2e/e2e.h"
#include "clients/lib/kvedge.h"
#include "clients/llamacpp/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* llama_version() of the llama.cpp whose state layout state.h knows: the libraries of
 * @node-llama-cpp/linux-x64 KVEDGE_LLAMACPP_PINNED. */
#define KVEDGE_LLAMACPP_VERSION "0.5.0-dev"

/* Room for the text of an error (why arguments). */
#define KVEDGE_LLAMACPP_WHY_BYTES 256

/* 0 when the loaded libllama is the pinned one; KVEDGE_EVERSION otherwise, why naming both. */
int kvedge_llamacpp_version_check(char *why, size_t why_len);

/* What kvedge needs of a GGUF model. */
typedef struct {
    char arch[32]; /* general.architecture: "llama" or "qwen2" */
    uint32_t layers;
    uint32_t kv_heads;
    uint32_t head_dim;
    bool permuted;              /* `llama`: K channels in llama.cpp's adjacent-pair order */
    kvedge_decoder_rope_t rope; /* its rotary settings as the reference decoder states them */
    uint32_t rope_fingerprint;  /* kvedge_decoder_rope_fingerprint_of(&rope, head_dim) */
} kvedge_llamacpp_model_t;

/* Reads model (loaded from the GGUF file at gguf_path, which is read again for its rope_freqs
 * tensor) into *out. The rotary settings: hint when given (a Hugging Face config's, e.g. the
 * reference decoder's kvedge_decoder_rope), checked to give llama.cpp's frequencies
 * (freq_base^(-2i/d) / rope_freqs[i]) to a relative 1e-5; without a hint, theta from
 * rope.freq_base and, for a rope_freqs tensor, Llama 3's scaling recovered from it and checked
 * the same way. Errors, why saying what: KVEDGE_EINVAL (NULL), KVEDGE_ESHAPE (an arch other
 * than llama / qwen2, K and V widths that differ, partial rotary, a rope scaling type or
 * freq_scale the bridge does not know, rotary settings that do not give the GGUF's
 * frequencies), KVEDGE_EIO (the file cannot be read). */
int kvedge_llamacpp_model_info(const struct llama_model *model, const char *gguf_path,
                               const kvedge_decoder_rope_t *hint, kvedge_llamacpp_model_t *out,
                               char *why, size_t why_len);

/* The kvedge model record of mi under id (the rotary suffix appended, as kvedge_e2e_model
 * does for the reference decoder: the same model gets the same id from either engine), fp16.
 * Errors: KVEDGE_EINVAL (bad id, too long), KVEDGE_ESHAPE (id carries another rotary
 * suffix), KVEDGE_ETOOBIG. */
int kvedge_llamacpp_record(const kvedge_llamacpp_model_t *mi, const char *id, kvedge_model_t *out);

/* 0 when the kvedge record m describes mi (layers, KV heads, head dim, rotary fingerprint);
 * KVEDGE_ESHAPE with why naming the first field that differs. */
int kvedge_llamacpp_check(const kvedge_llamacpp_model_t *mi, const kvedge_model_t *m, char *why,
                          size_t why_len);

/* The cache layout of a context made from mi with params cp: F16 / F32 (type_k and type_v
 * equal), V transposed when flash attention is disabled, one stream when kv_unified or
 * n_seq_max is 1. Errors: KVEDGE_EINVAL with why for a quantized or mixed cache type, and for
 * flash_attn_type AUTO (llama.cpp resolves it inside the context; the bridge needs it stated:
 * DISABLED or ENABLED). */
int kvedge_llamacpp_layout(const kvedge_llamacpp_model_t *mi, const struct llama_context_params *cp,
                           kvedge_llamacpp_layout_t *out, char *why, size_t why_len);

/* Runs tokens through ctx into sequence seq at positions pos0.. (batches of llama_n_batch),
 * logits for the last token only. Errors: KVEDGE_EINVAL, KVEDGE_ENOMEM, KVEDGE_EIO
 * (llama_decode failed). */
int kvedge_llamacpp_prefill(struct llama_context *ctx, int32_t seq, const int32_t *tokens,
                            uint32_t n, int32_t pos0);

/* Once per process, on any thread: llama.cpp's log set to print only its errors (on stderr, as
 * "llama.cpp: ..."), its CPU backends loaded from the folder libllama was loaded from (where a
 * llama.cpp install and the prebuilt packages keep them) and from GGML_BACKEND_PATH, and
 * llama_backend_init. Call before loading a model. */
void kvedge_llamacpp_backend_init(void);

/* llama.cpp's threads when none are asked for: the online CPUs, at most this many (more
 * threads than cores spin against each other: 100x slower on a loaded 2-core machine). */
#define KVEDGE_LLAMACPP_THREADS_MAX_DEFAULT 4

/* Context parameters the bridge knows the layout of: n_seq sequences (0 = 1) of n_cells
 * positions each (n_seq 1: one stream; more: a stream per sequence), batches of at most 512,
 * threads (0 = the online CPUs, at most KVEDGE_LLAMACPP_THREADS_MAX_DEFAULT), a cache of type
 * (KVEDGE_LLAMACPP_F32 / _F16, K and V alike), flash attention stated DISABLED (V
 * transposed). Errors: KVEDGE_EINVAL (NULL out, n_cells 0, n_cells * n_seq over
 * KVEDGE_LLAMACPP_MAX_CELLS, another type). */
int kvedge_llamacpp_context_params(uint32_t n_cells, uint32_t n_seq, uint32_t threads, int type,
                                   struct llama_context_params *out);

/* Text (len bytes) to token ids with model's own vocabulary (llama_tokenize): add_special adds
 * the BOS / EOS the vocabulary asks for, parse_special reads special tokens written in the text
 * as their ids. At most cap ids into out; *n gets how many the text has. Errors: KVEDGE_EINVAL
 * (NULL, a text of over INT32_MAX / 2 bytes, one llama.cpp cannot tokenize), KVEDGE_ENOSPACE
 * (more than cap ids: *n says how many; out is not written). */
int kvedge_llamacpp_tokenize(const struct llama_model *model, const char *text, size_t len,
                             bool add_special, bool parse_special, int32_t *out, size_t cap,
                             size_t *n);

/* Greedy generation on sequence seq of ctx, whose last llama_decode left the logits of its
 * last token: max_new tokens into gen, token g the arg-max of the logits, decoded at position
 * pos + g when another follows (the last one is not decoded). first_us (may be NULL): the
 * microseconds from the call to the first token. Errors: KVEDGE_EINVAL, KVEDGE_ENOMEM,
 * KVEDGE_EIO (llama_decode failed; gen holds the tokens before it). */
int kvedge_llamacpp_generate(struct llama_context *ctx, int32_t seq, int32_t pos, uint32_t max_new,
                             int32_t *gen, double *first_us);

/* An import: which context to fetch and from where. */
typedef struct {
    size_t size;                 /* sizeof(kvedge_llamacpp_import_t): _default sets it */
    kvedge_client_t *proxy;      /* the edge proxy (a store node also works) */
    const kvedge_model_t *model; /* the record the context was stored under */
    const int32_t *ctx;          /* the context's token ids (its chunk ids are made here) */
    uint32_t n;                  /* tokens, >= 1 */
    uint32_t chunk_tokens;       /* as at prefill; 0 = KVEDGE_E2E_CHUNK_TOKENS_DEFAULT */
    int deadline_ms;             /* the fetch's deadline; 0 = the client's default */
    bool compute_misses;         /* a missed layer: llama.cpp prefills the context itself */
} kvedge_llamacpp_import_t;

/* Defaults: size set, compute_misses true, everything else 0 / NULL. */
void kvedge_llamacpp_import_default(kvedge_llamacpp_import_t *req);

typedef struct {
    uint32_t fetched;  /* layers the proxy delivered */
    uint32_t missed;   /* layers it reported missing */
    bool prefilled;    /* llama.cpp computed the context (some layer missed) */
    double fetch_us;   /* the fetch, dequantized to fp32 */
    double convert_us; /* kvedge's layout to llama.cpp's state */
    double load_us;    /* llama_state_seq_set_data */
    double prefill_us; /* llama.cpp's own prefill, when a layer missed */
    uint64_t state_bytes;
} kvedge_llamacpp_import_stats_t;

/* Import: fetches the context's layers through req->proxy (the pipelined loader, int8 / int4
 * dequantized), converts them to layout (l's element type, K permuted for `llama`, V
 * transposed when l says so) and loads them into sequence seq of ctx at positions 0 .. n - 1,
 * replacing what seq held; llama.cpp then decodes a prompt on top at positions n... The state
 * API takes a sequence whole, every layer: one missed layer and llama.cpp prefills the whole
 * context itself (req->compute_misses) or nothing is imported (KVEDGE_ENOTFOUND). Checked
 * first, why saying what: the version (KVEDGE_EVERSION), mi against req->model
 * (KVEDGE_ESHAPE), l against mi (KVEDGE_ESHAPE), n against llama_n_ctx_seq (KVEDGE_ETOOBIG),
 * seq against llama_n_seq_max (KVEDGE_EINVAL). Other errors: the fetch's (the pipeline's), a
 * state llama.cpp refused (KVEDGE_ESHAPE: a layout not the context's), KVEDGE_EIO (its
 * prefill failed), KVEDGE_ENOMEM. On every error ctx is as it was. stats may be NULL. */
int kvedge_llamacpp_import(struct llama_context *ctx, int32_t seq,
                           const kvedge_llamacpp_model_t *mi, const kvedge_llamacpp_layout_t *l,
                           const kvedge_llamacpp_import_t *req,
                           kvedge_llamacpp_import_stats_t *stats, char *why, size_t why_len);

typedef struct {
    double read_us; /* llama_state_seq_get_data and the conversion to kvedge's layout */
    uint64_t state_bytes;
    kvedge_e2e_prefill_stats_t put; /* encode and put (its prefill_us is 0) */
} kvedge_llamacpp_export_stats_t;

/* Export: reads sequence seq of ctx (which llama.cpp prefilled with the n tokens of tokens at
 * positions 0 .. n - 1), converts it to kvedge's layout and puts it to cloud as blocks under m
 * (kvedge_e2e_prefill_model_kv: chunked by chunk_tokens, chained ids, encoded with q); ids
 * (room for max) gets the chunk chain. Errors, why saying what: KVEDGE_EVERSION (version or
 * state layout), KVEDGE_ESHAPE (m is not mi, l is not the state's, the sequence does not hold
 * exactly n tokens at 0 .. n - 1), the put's errors. ctx is only read. stats may be NULL. */
int kvedge_llamacpp_export(struct llama_context *ctx, int32_t seq,
                           const kvedge_llamacpp_model_t *mi, const kvedge_llamacpp_layout_t *l,
                           kvedge_client_t *cloud, const kvedge_model_t *m, const int32_t *tokens,
                           uint32_t n, uint32_t chunk_tokens, const kvedge_e2e_quant_t *q,
                           kvedge_chunk_id_t *ids, size_t max,
                           kvedge_llamacpp_export_stats_t *stats, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif
