/* A byte-level BPE tokenizer of the GPT-2 family (GPT-2, OPT, RoBERTa) and of Llama 3 and Qwen2:
 * GPT-2's pre-tokenization pattern, or the Split regex a tokenizer.json gives, over UTF-8 (PCRE2),
 * GPT-2's map of bytes to printable characters, merges applied by rank, added and special tokens
 * matched before the regex, Qwen2's NFC normalizer, the BOS a template adds, and decoding back to
 * the exact bytes. It reads Hugging Face's vocab.json + merges.txt (GPT-2's encoder.json +
 * vocab.bpe are the same formats) or a tokenizer.json. docs/decoder.md ("Tokenizer") has the
 * forms, what is refused, the bounds and how it was checked against GPT-2's own encoder and
 * llama.cpp's test cases.
 *
 * Everything read from a file is bounded and checked; a refused file gives a negative KVEDGE_E*
 * code and, in why, one line naming the file and the position (merges.txt line, JSON key, array
 * index or byte offset). Nothing is left allocated after a failure. */
#ifndef KVEDGE_CLIENTS_DECODER_TOKENIZER_H
#define KVEDGE_CLIENTS_DECODER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest vocab.json, merges.txt or tokenizer.json read. */
#define KVEDGE_TOKENIZER_FILE_MAX_BYTES (64u << 20)
/* Most tokens in a vocabulary; every id is below it too. */
#define KVEDGE_TOKENIZER_VOCAB_MAX 1048576u
/* Longest token string, in UTF-8 bytes as the file writes it (GPT-2's longest is 256). */
#define KVEDGE_TOKENIZER_TOKEN_MAX_BYTES 1024u
/* Most merges. */
#define KVEDGE_TOKENIZER_MERGES_MAX 2097152u
/* The word cache of encode: this many entries, each a word of at most WORD_MAX_BYTES bytes
 * that gives at most IDS_MAX ids (longer words are not cached). About 640 KiB. */
#define KVEDGE_TOKENIZER_CACHE_WORDS          8192u
#define KVEDGE_TOKENIZER_CACHE_WORD_MAX_BYTES 32u
#define KVEDGE_TOKENIZER_CACHE_IDS_MAX        8u
/* A why buffer of this size holds any reason in full. */
#define KVEDGE_TOKENIZER_WHY_BYTES 512u

typedef struct kvedge_tokenizer_t kvedge_tokenizer_t;

/* Loads vocab.json (an object of token string to id) and merges.txt (an optional first line
 * "#version: ...", then one merge a line: two tokens separated by one space, in rank order;
 * blank lines only at the end). Rules, each refused with KVEDGE_ECORRUPT unless said: valid
 * JSON; ids integers in 0..KVEDGE_TOKENIZER_VOCAB_MAX-1; no token twice, no id twice; tokens
 * non-empty valid UTF-8 of at most KVEDGE_TOKENIZER_TOKEN_MAX_BYTES bytes; the 256 single-byte
 * tokens present; every merge's two tokens and their concatenation in the vocabulary; no merge
 * twice. Errors: KVEDGE_EINVAL (NULL argument), KVEDGE_EIO (a file cannot be read; errno holds
 * the cause), KVEDGE_ETOOBIG (a file over KVEDGE_TOKENIZER_FILE_MAX_BYTES, more tokens or merges
 * than the bounds), KVEDGE_ECORRUPT, KVEDGE_ENOMEM. why (may be NULL) receives the reason,
 * "PATH: ..." or "PATH:LINE: ...". On success the caller owns *out; on failure *out is NULL. */
int kvedge_tokenizer_load(const char *vocab_path, const char *merges_path, kvedge_tokenizer_t **out,
                          char *why, size_t why_len);

/* Loads a Hugging Face tokenizer.json of one of two forms:
 *  - GPT-2's: pre_tokenizer ByteLevel (use_regex true, no add_prefix_space), no normalizer;
 *  - Llama 3's and Qwen2's: pre_tokenizer a Sequence of a Split (a "Regex" pattern, behavior
 *    "Isolated", not inverted; Oniguruma's \s is kept) and a ByteLevel with use_regex false;
 *    normalizer none or NFC (Qwen2).
 * model: type "BPE" (when given), "vocab" as in vocab.json, "merges" as "a b" strings or
 * ["a", "b"] pairs, ignore_merges (a piece the vocabulary has whole is one id). added_tokens:
 * matched in the text before the regex, never merged; a token the vocabulary lacks takes its id
 * and decodes to its content. post_processor: none, ByteLevel, TemplateProcessing (at most one
 * special token before the text, kvedge_tokenizer_bos_id, and one after it,
 * kvedge_tokenizer_eos_id) or a Sequence of them. decoder: none or ByteLevel.
 * Anything else that would make Hugging Face tokenize differently is refused naming the component
 * and its type (`normalizer type "Lowercase" is not supported (only NFC)`): other models
 * (WordPiece, Unigram), normalizers, pre-tokenizers, post-processors, decoders; a dropout, a
 * subword prefix or suffix, byte_fallback, added tokens with single_word, lstrip or rstrip, or
 * normalized under a normalizer; a regex that may match the empty string. Errors: those of
 * kvedge_tokenizer_load; why names the key ("model.vocab[\"x\"]", "model.merges[12]",
 * "added_tokens[3].content") or the byte offset of a JSON syntax error. */
int kvedge_tokenizer_load_json(const char *path, kvedge_tokenizer_t **out, char *why,
                               size_t why_len);

/* Loads a folder: DIR/vocab.json + DIR/merges.txt when both exist, else DIR/tokenizer.json.
 * Errors: those of the two loaders; KVEDGE_ENOTFOUND when the folder has neither. */
int kvedge_tokenizer_load_dir(const char *dir, kvedge_tokenizer_t **out, char *why, size_t why_len);

/* What a --tokenizer PATH names: a folder (kvedge_tokenizer_load_dir), else a tokenizer.json
 * (kvedge_tokenizer_load_json). Errors: those of the loader it picks. */
int kvedge_tokenizer_load_path(const char *path, kvedge_tokenizer_t **out, char *why,
                               size_t why_len);

/* kvedge_tokenizer_load on bytes in memory (vocab_len bytes of vocab.json, merges_len of
 * merges.txt); reasons name "vocab.json" and "merges.txt". The bytes are not kept. */
int kvedge_tokenizer_parse(const char *vocab, size_t vocab_len, const char *merges,
                           size_t merges_len, kvedge_tokenizer_t **out, char *why, size_t why_len);

/* kvedge_tokenizer_load_json on len bytes in memory; reasons name "tokenizer.json". */
int kvedge_tokenizer_parse_json(const char *json, size_t len, kvedge_tokenizer_t **out, char *why,
                                size_t why_len);

/* Frees the tokenizer. No encode or decode may be running on it. NULL-safe; nulls *self_p. */
void kvedge_tokenizer_destroy(kvedge_tokenizer_t **self_p);

/* The largest id + 1: the embedding rows a model needs to take every id. */
uint32_t kvedge_tokenizer_vocab_size(const kvedge_tokenizer_t *t);

/* Flags of kvedge_tokenizer_encode_ex. */
/* Special added tokens ("special": true: "<|begin_of_text|>", "<|im_start|>", "</s>") written in
 * the text are their ids; without it they are text like any other. */
#define KVEDGE_TOKENIZER_SPECIAL 1u
/* The template's tokens around the text: kvedge_tokenizer_bos_id before, _eos_id after. */
#define KVEDGE_TOKENIZER_TEMPLATE 2u

/* Text (len bytes, any bytes: NULs are characters, bytes that are not valid UTF-8 become one
 * piece each) to ids, as Hugging Face's tokenizer gives them for valid UTF-8 (GPT-2's own encoder
 * for GPT-2's form). Added tokens that are not special are matched in the text always (as Hugging
 * Face and llama.cpp do); special ones only with KVEDGE_TOKENIZER_SPECIAL. flags: 0 or an OR of
 * KVEDGE_TOKENIZER_*. Thread-safe: threads may encode on one tokenizer at once (the word cache is
 * locked). *ids (caller frees it with free(); NULL when *n is 0) receives *n ids. Errors:
 * KVEDGE_EINVAL (NULL argument, an unknown flag), KVEDGE_ETOOBIG (len over INT32_MAX, or the text
 * exceeds the pattern matcher's limits), KVEDGE_ENOMEM; on error *ids is NULL and *n 0. */
int kvedge_tokenizer_encode_ex(kvedge_tokenizer_t *t, const char *text, size_t len, unsigned flags,
                               int32_t **ids, size_t *n);

/* kvedge_tokenizer_encode_ex with flags 0: special tokens are text, no BOS. */
int kvedge_tokenizer_encode(kvedge_tokenizer_t *t, const char *text, size_t len, int32_t **ids,
                            size_t *n);

/* The id the tokenizer.json's template puts before the text (Llama 3's <|begin_of_text|>), or
 * -1 when it adds none (GPT-2, Qwen2, vocab.json + merges.txt). What "add BOS" means for this
 * tokenizer: kvedge_tokenizer_encode_ex with KVEDGE_TOKENIZER_TEMPLATE adds it. */
int32_t kvedge_tokenizer_bos_id(const kvedge_tokenizer_t *t);

/* The id the template puts after the text, or -1 when it adds none (Llama 3 and Qwen2 add
 * none). */
int32_t kvedge_tokenizer_eos_id(const kvedge_tokenizer_t *t);

/* Ids back to the bytes of their tokens, exactly: not necessarily valid UTF-8 when the ids split
 * a character. *text (caller frees it with free()) holds *len bytes and a terminating NUL.
 * Errors: KVEDGE_EINVAL (NULL argument, an id not in the vocabulary), KVEDGE_ENOMEM; on error
 * *text is NULL. */
int kvedge_tokenizer_decode(const kvedge_tokenizer_t *t, const int32_t *ids, size_t n, char **text,
                            size_t *len);

/* The id of a token as the vocabulary or added_tokens write it ("</s>", "Ġthe",
 * "<|eot_id|>"), or -1 when it has none. */
int32_t kvedge_tokenizer_token_id(const kvedge_tokenizer_t *t, const char *token);

#ifdef __cplusplus
}
#endif
#endif
