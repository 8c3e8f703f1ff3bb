/* llama.cpp's serialized sequence state (llama_state_seq_get_data / _set_data) as the pinned
 * llama.cpp writes it, to and from kvedge's K/V layout. Pure C, no llama.h: the byte layout is
 * read from llama.cpp's src/llama-context.cpp and src/llama-kv-cache.cpp (state_write*,
 * state_read*) at the release @node-llama-cpp/linux-x64 3.22.1 was built from
 * (KVEDGE_LLAMACPP_PINNED). That layout is llama.cpp's internal one: a blob of another
 * version is refused (KVEDGE_EVERSION), never guessed at.
 *
 * One sequence of a plain KV cache (no M-RoPE, no per-cell extras, every layer with K and V):
 *   u32 magic 0xaf143cd8, i32 seq_id, u32 n_stream, then per stream u32 cell_count and, for
 *   the one stream holding the sequence: per cell i32 pos, u32 n_seq_id (1), i32 seq_id; then
 *   u32 v_trans, u32 n_layer; per layer i32 K type, u64 K row bytes, cell_count rows of
 *   kv_heads * head_dim elements; then V: not transposed, as K; transposed, per layer i32 type,
 *   u32 element bytes, u32 kv_heads * head_dim, then per channel cell_count elements.
 *
 * kvedge's K/V: [layers][kv_heads][tokens][head_dim] floats, K post-rotary in Hugging Face's
 * rotate-half layout. llama.cpp's `llama` arch rotates adjacent channel pairs on Q/K weights
 * that were permuted at conversion: its cached K channel 2j is Hugging Face's channel j and
 * 2j + 1 is j + head_dim / 2 (per head). `qwen2` is not permuted. V is never permuted. */
#ifndef KVEDGE_CLIENTS_LLAMACPP_STATE_H
#define KVEDGE_CLIENTS_LLAMACPP_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The llama.cpp release whose state layout this codec knows (llama_version() of the libraries
 * @node-llama-cpp/linux-x64 3.22.1 ships), and the magic its sequence state starts with. */
#define KVEDGE_LLAMACPP_PINNED      "3.22.1"
#define KVEDGE_LLAMACPP_STATE_MAGIC 0xaf143cd8u

/* ggml type ids of the cache element types the codec writes (ggml.h's GGML_TYPE_F32 / _F16). */
#define KVEDGE_LLAMACPP_F32 0
#define KVEDGE_LLAMACPP_F16 1

/* Bounds on what a blob may claim, so a corrupt one never sizes an allocation. */
#define KVEDGE_LLAMACPP_MAX_STREAMS  256
#define KVEDGE_LLAMACPP_MAX_CELLS    (1u << 20)
#define KVEDGE_LLAMACPP_MAX_LAYERS   1024
#define KVEDGE_LLAMACPP_MAX_HEAD_DIM 512

/* How one llama.cpp context caches K/V. */
typedef struct {
    uint32_t layers;
    uint32_t kv_heads;
    uint32_t head_dim;
    bool permuted;     /* `llama` arch: K channels in llama.cpp's adjacent-pair order */
    int type;          /* KVEDGE_LLAMACPP_F32 or _F16, K and V alike */
    bool v_trans;      /* V kept transposed (llama.cpp without flash attention) */
    uint32_t n_stream; /* 1 for a unified cache, else the context's n_seq_max */
} kvedge_llamacpp_layout_t;

/* 0 when l is one the codec can write; KVEDGE_EINVAL for a zero or oversized shape, an odd
 * head_dim, n_stream 0 or over KVEDGE_LLAMACPP_MAX_STREAMS, or a cache type other than F32 /
 * F16 (llama.cpp's quantized caches, q8_0 and the like: the bridge does not write them). */
int kvedge_llamacpp_layout_check(const kvedge_llamacpp_layout_t *l);

/* Bytes of the state of one sequence of n tokens in layout l (0 for a bad layout or n). */
size_t kvedge_llamacpp_state_bytes(const kvedge_llamacpp_layout_t *l, uint32_t n);

/* Writes the state of sequence seq holding n tokens at positions pos0 .. pos0 + n - 1 from
 * k and v ([layers][kv_heads][n][head_dim] floats, K in Hugging Face's layout) into out (cap
 * bytes), converting to l's type, permuting K for a `llama` layout and transposing V when
 * l->v_trans; *len gets the bytes written. Errors: KVEDGE_EINVAL (NULL, n 0 or over
 * KVEDGE_LLAMACPP_MAX_CELLS, seq negative, a position past INT32_MAX, a bad layout),
 * KVEDGE_ENOSPACE (cap under kvedge_llamacpp_state_bytes). */
int kvedge_llamacpp_state_write(const kvedge_llamacpp_layout_t *l, int32_t seq, int32_t pos0,
                                uint32_t n, const float *k, const float *v, uint8_t *out,
                                size_t cap, size_t *len);

/* What a sequence state says of itself. */
typedef struct {
    int32_t seq;       /* the sequence it was read from */
    uint32_t n_stream; /* streams of the cache it came from */
    uint32_t cells;    /* tokens it holds (0: an empty sequence; nothing after the counts) */
    int32_t pos0;      /* position of its first cell */
    bool contiguous;   /* positions pos0, pos0 + 1, ... in cell order */
    bool v_trans;
    uint32_t layers;
    int type;       /* the K type of layer 0 (ggml type id) */
    uint32_t k_row; /* K row bytes of layer 0 */
} kvedge_llamacpp_state_info_t;

/* Parses the header and cell list of a state blob (len bytes at buf), bounded by len:
 * KVEDGE_EVERSION (not the pinned layout: wrong magic, a cell with several sequences or with
 * per-cell extras the codec does not know), KVEDGE_ECORRUPT (truncated, a negative sequence id
 * or position, more than one stream holding cells, counts over the bounds), KVEDGE_EINVAL
 * (NULL). */
int kvedge_llamacpp_state_info(const uint8_t *buf, size_t len, kvedge_llamacpp_state_info_t *out);

/* Reads a state blob of layout l back into k and v ([layers][kv_heads][cells][head_dim]
 * floats, room for cap_tokens tokens each, K in Hugging Face's layout): *n gets its cell count
 * and *pos0 its first position. Every type, row size, element size and length in the blob is
 * checked against l before anything is read. Errors: as kvedge_llamacpp_state_info;
 * KVEDGE_ESHAPE (a layer count, type, V layout or row size that is not l's; positions that
 * are not contiguous), KVEDGE_ENOSPACE (cells over cap_tokens), KVEDGE_ECORRUPT (trailing or
 * missing bytes). */
int kvedge_llamacpp_state_read(const kvedge_llamacpp_layout_t *l, const uint8_t *buf, size_t len,
                               float *k, float *v, uint32_t cap_tokens, uint32_t *n, int32_t *pos0);

#ifdef __cplusplus
}
#endif
#endif
