/* The quality of the cache schemes, measured on held-out text: for each document the cloud
 * prefills its first ctx_tokens tokens with a scheme and puts them (kvedge_e2e_prefill), the
 * edge fetches them through its proxy with the pipelined loader, and a decoder session runs
 * the next cont_tokens tokens with teacher forcing over the fetched (dequantized) context
 * K/V, against a reference session that computes the context's K/V itself in fp32.
 *
 * Per scheme: perplexity of the continuation (natural log, exp of the mean NLL), its change
 * against lossless, greedy next-token agreement with the reference, the largest |logit
 * difference| and the mean KL(reference || scheme). Per layer (the sensitivity profile):
 * the same with only that layer stored in a profile scheme (by default int4 g32 and ThinK
 * 50 %) and every other layer lossless. kvedge_eval_profile_write saves that profile, for
 * profile schemes that are rungs of the precision ladder (access/codec/prec.h), as the file the
 * edge proxy's planner reads (proxy/quality.h).
 *
 * Scheme s of a run is stored under its own model id, "<model_id>@<scheme name>" (before a
 * rotary model's "@rope-XXXXXXXX", which stays last): its chunk ids differ from every other
 * scheme's, so no store or cache can mix two schemes' blocks.
 *
 * Two kinds of scheme are rungs a node derives rather than one the cloud puts, so they are
 * coded in this process instead, from the same context K/V (kvedge_decoder_prefill, fp32), one
 * block per (layer, KV head, chunk) as a node would hold it, each decoded back with
 * kvedge_block_decode; their bytes are those blocks': "tc" (kvedge_block_encode_tc against the
 * model's registered coding basis, access/codec/basis.h) and the "+ec" rungs (the int8 or int4
 * block recoded with rANS, kvedge_block_recode: the same values as without +ec).
 * docs/benchmarks.md ("Quality of the cache schemes") has the figures of the KJV models. */
#ifndef KVEDGE_CLIENTS_EVAL_H
#define KVEDGE_CLIENTS_EVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "clients/decoder/decoder.h"
#include "clients/e2e/e2e.h"
#include "clients/lib/kvedge.h"
#include "access/codec/prec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a scheme's name, with its NUL ("int4-g128+think-75" is 19). */
#define KVEDGE_EVAL_NAME_BYTES 32
/* Schemes one run measures at most (the default list has 9). */
#define KVEDGE_EVAL_MAX_SCHEMES 16
/* Profile schemes (per-layer rows) one run measures at most (the default list has 2, the
 * ladder's 14). */
#define KVEDGE_EVAL_MAX_PROFILES 16
/* The goals of the quality issue: perplexity change against lossless, in percent. Lossless
 * itself must give logits bit-identical to the reference. */
#define KVEDGE_EVAL_GOAL_INT8_PCT     0.5
#define KVEDGE_EVAL_GOAL_INT4_G32_PCT 3.0
/* How long a fetch is retried while the proxy does not know a scheme's model id yet or
 * reports layers missing (a node joined to a master registers a model at its next directory
 * publication), when the options leave it 0. */
#define KVEDGE_EVAL_WAIT_MS_DEFAULT 10000
/* Pause between such retries. */
#define KVEDGE_EVAL_RETRY_MS 200

/* How a scheme stores the context: kvedge_e2e_quant_t's fields, with ThinK given as a share
 * of the key channels so one name fits every head size. */
typedef struct {
    char name[KVEDGE_EVAL_NAME_BYTES]; /* canonical: kvedge_eval_scheme_parse's grammar */
    kvedge_scheme_t scheme;            /* lossless, int8 or int4 */
    kvedge_dtype_t dtype;              /* source and lossless element type: fp32 or fp16 */
    uint16_t group_size;               /* int4 groups (0 for the others) */
    uint8_t keep_pct;                  /* ThinK: key channels kept, percent; 100 = all */
    bool ec;                           /* "+ec": the blocks recoded with rANS (in process) */
    /* The goal: perplexity change against lossless at most this many percent; 0 with
     * lossless means bit-identical logits; negative: no goal. */
    double goal_pct;
} kvedge_eval_scheme_t;

/* Parses a scheme name: "lossless" (fp32), "fp16" (lossless fp16), "int8", "int4" (group
 * KVEDGE_BLOCK_INT4_GROUP_DEFAULT) or "int4-gN" (N >= KVEDGE_E2E_GROUP_MIN), each optionally
 * followed by "+think-P" (keep P % of the key channels, 1..99); "think-P" alone is lossless
 * values with pruned keys; "int8" and "int4[-gN]" without ThinK optionally followed by "+ec"
 * (entropy-coded blocks); "tc" (transform-coded, scheme KVEDGE_SCHEME_TC, no ThinK, no +ec).
 * The canonical name (int4 always with its group) goes to out->name; goal_pct is the issue's
 * goal for lossless, int8 and int4-g32 (with or without +ec: the same values), else -1.
 * Errors: KVEDGE_EINVAL (NULL, unknown or malformed name, a bound exceeded). */
int kvedge_eval_scheme_parse(const char *name, kvedge_eval_scheme_t *out);

/* The default list: lossless, fp16, int8, int4-g32, int4-g64, int4-g128, think-75,
 * think-50, int4-g32+think-50. Writes at most max entries; returns how many it has. */
size_t kvedge_eval_schemes_default(kvedge_eval_scheme_t *out, size_t max);

/* The default profile schemes: int4-g32 and think-50. Returns how many (at most max). */
size_t kvedge_eval_profiles_default(kvedge_eval_scheme_t *out, size_t max);

/* Every lossy rung of the precision ladder as profile schemes (`kvedge eval --profiles
 * ladder`), the table a planner can choose from: int8, int4-g32, int4-g64, int4-g128, then
 * the same four with +think-75 after think-75, and with +think-50 after think-50 (14).
 * Returns how many (at most max). */
size_t kvedge_eval_profiles_ladder(kvedge_eval_scheme_t *out, size_t max);

/* The ladder rung a scheme is: lossless (fp32, the eval's lossless: the ladder's lossless
 * keeps whatever element type is stored) or int8 or int4 with a group of 32, 64 or 128, with
 * every key channel or ThinK keeping 75 % or 50 %, each +ec too (KVEDGE_PREC_EC); tc
 * (KVEDGE_PREC_TC). Errors: KVEDGE_EINVAL (NULL; fp16, another int4 group or ThinK share: not
 * a rung). */
int kvedge_eval_scheme_prec(const kvedge_eval_scheme_t *s, kvedge_prec_t *out);

/* Key channels a keep_pct keeps of head_dim: round(head_dim * pct / 100), at least 1;
 * head_dim when pct is 0 or 100. */
uint32_t kvedge_eval_keep_channels(uint8_t keep_pct, uint32_t head_dim);

/* The model record scheme s is stored under: m with id "<m->id>@<s->name>". Errors:
 * KVEDGE_EINVAL (NULL), KVEDGE_ETOOBIG (the id would exceed KVEDGE_MODEL_ID_MAX_BYTES). */
int kvedge_eval_model(const kvedge_model_t *m, const kvedge_eval_scheme_t *s, kvedge_model_t *out);

/* Called after each document (from the thread that runs kvedge_eval_run). */
typedef void (*kvedge_eval_progress_fn)(void *arg, size_t done, size_t doc_index, double elapsed_s);

typedef struct {
    const kvedge_decoder_t *decoder; /* loaded; shared by the cloud and the edge roles */
    const kvedge_model_t *model;     /* the decoder's record (kvedge_e2e_model): the base id */
    kvedge_client_t *cloud;          /* a client of the cloud store node (puts) */
    kvedge_client_t *proxy;          /* a client of the edge proxy (or of a store node) */
    /* Documents: docs[i] holds doc_len[i] token ids. A document shorter than ctx_tokens +
     * cont_tokens + 1 is skipped (the continuation's last position needs a target). */
    const int32_t *const *docs;
    const size_t *doc_len;
    size_t n_docs;
    uint32_t ctx_tokens;   /* K >= 1: the shared context */
    uint32_t cont_tokens;  /* M >= 1: continuation positions scored */
    uint32_t chunk_tokens; /* 0 = KVEDGE_E2E_CHUNK_TOKENS_DEFAULT */
    /* The schemes (names unique) and the per-layer profile schemes; n_profiles may be 0. A
     * profile row stores one layer in its scheme and the others lossless, so it needs no
     * scheme of its own in the list. */
    const kvedge_eval_scheme_t *schemes;
    size_t n_schemes; /* 1 .. KVEDGE_EVAL_MAX_SCHEMES */
    const kvedge_eval_scheme_t *profiles;
    size_t n_profiles; /* 0 .. KVEDGE_EVAL_MAX_PROFILES */
    size_t max_docs;   /* stop after this many documents measured; 0 = all */
    double max_s;      /* start no document after this many seconds (at least one); 0 = none */
    int deadline_ms;   /* each fetch's deadline; 0 = the client's default */
    int wait_ms;       /* retry window of a fetch (above); 0 = KVEDGE_EVAL_WAIT_MS_DEFAULT */
    kvedge_eval_progress_fn progress; /* may be NULL */
    void *progress_arg;
} kvedge_eval_opts_t;

/* One row: a scheme (or a profile scheme at one layer) over every scored position. */
typedef struct {
    char name[KVEDGE_EVAL_NAME_BYTES];
    int layer;           /* the layer a profile row stores in its scheme; -1 for scheme rows */
    uint64_t positions;  /* continuation positions scored */
    double nll;          /* mean negative log-likelihood of the targets (nats) */
    double ppl;          /* exp(nll) */
    double ppl_rel;      /* ppl / the lossless row's ppl - 1 (the reference's if none) */
    double agreement;    /* share of positions whose arg-max equals the reference's */
    double max_abs_diff; /* largest |logit - reference logit| over positions and vocabulary */
    double kl;           /* mean KL(reference || this), nats */
    uint64_t bytes;      /* encoded block bytes put (scheme rows) */
    uint64_t fp16_bytes; /* the same K/V as fp16 */
    double goal_pct;     /* the scheme's goal (kvedge_eval_scheme_t); negative: none */
    bool goal_met;       /* lossless: max_abs_diff == 0; else |ppl_rel| * 100 <= goal_pct */
} kvedge_eval_row_t;

typedef struct {
    uint32_t layers;             /* the decoder's */
    uint32_t ctx_tokens;         /* as run */
    uint32_t cont_tokens;        /* as run */
    size_t n_docs;               /* documents measured */
    size_t *doc_index;           /* [n_docs]: their indices in opts->docs */
    size_t n_short;              /* documents skipped as too short */
    double seconds;              /* wall time of the run */
    kvedge_eval_row_t reference; /* context K/V computed locally, fp32 (ppl_rel vs lossless) */
    size_t n_schemes;
    kvedge_eval_row_t scheme[KVEDGE_EVAL_MAX_SCHEMES];
    size_t n_profiles;
    /* profile[p] holds `layers` rows: layer l in profile scheme p, the rest lossless. */
    kvedge_eval_row_t *profile[KVEDGE_EVAL_MAX_PROFILES];
} kvedge_eval_result_t;

/* Runs the evaluation (above) and returns its figures in *out (caller owns it; free with
 * kvedge_eval_result_destroy). Each scheme's context is put to the cloud under its own model
 * id (kvedge_eval_model): the proxy must know those ids (built in, or registered with its
 * master by the caller or by a node that joined it); a fetch that the proxy refuses with
 * KVEDGE_ENOMODEL or that misses a layer is retried for wait_ms, and then fails: a layer
 * recomputed by the decoder would hide the scheme's error. A tc scheme needs the coding basis
 * of model->id registered in the process (kvedge_basis_register). Errors: KVEDGE_EINVAL (a
 * missing field, no scheme or too many, duplicate names, the model not matching the decoder, no
 * document long enough), KVEDGE_ENOBASIS (a tc scheme and no registered basis of the model),
 * KVEDGE_ESHAPE (that basis's layers, KV heads or head_dim not the model's), KVEDGE_ETOOBIG
 * (ctx_tokens + cont_tokens over the decoder's positions), KVEDGE_ENOMODEL (the proxy never learnt
 * a scheme's model id), KVEDGE_ENOTFOUND (layers still missing after wait_ms), KVEDGE_ENOMEM, and
 * the errors of kvedge_e2e_prefill, the pipeline and the decoder. */
int kvedge_eval_run(const kvedge_eval_opts_t *opts, kvedge_eval_result_t **out);

/* Frees a result. NULL-safe; nulls *self_p. */
void kvedge_eval_result_destroy(kvedge_eval_result_t **self_p);

/* Prints the result for people (the scheme table with goals, the per-layer profile), or as
 * one JSON object when json. */
void kvedge_eval_print(FILE *f, const kvedge_eval_result_t *r, bool json);

/* Data files for plots (scripts/plot_quality.gp): the scheme rows, one a line
 * "index name ppl ppl_rel_pct agreement kl max_abs_diff bytes_over_fp16", or the profile,
 * one line per layer "layer ppl_rel_pct(profile 0) kl(profile 0) ...". Comment lines start
 * with '#'. */
void kvedge_eval_print_schemes_dat(FILE *f, const kvedge_eval_result_t *r);
void kvedge_eval_print_layers_dat(FILE *f, const kvedge_eval_result_t *r);

/* Writes the sensitivity profile as a quality profile file (proxy/quality.h, version
 * KVEDGE_QUALITY_VERSION) for model id model_id (the base id, not ID@SCHEME): the profile
 * schemes are its rungs (kvedge_prec_name's names, in the run's order); per layer the
 * perplexity change against lossless in percent (as measured: negative changes stay
 * negative; the loader clamps them for budgeting), mean KL in nats and greedy agreement;
 * the run's context and continuation tokens, documents and positions, and lossless_ppl; and
 * under "whole_model" the scheme rows that are lossy ladder rungs (every layer at that rung),
 * with their bytes over fp16. An +ec rung is not one of the file's (its quality is its plain
 * rung's, proxy/quality.h): its scheme rows are left out and an +ec profile scheme refused.
 * Numbers are written so they read back bit for bit. Everything is checked before anything is
 * written. Errors: KVEDGE_EINVAL (NULL, no profile, a model id empty or over
 * KVEDGE_MODEL_ID_MAX_BYTES, a profile scheme that is not a ladder rung
 * (kvedge_eval_scheme_prec) or is +ec, a figure that is not finite), KVEDGE_EIO (the write
 * failed). */
int kvedge_eval_profile_write(FILE *f, const kvedge_eval_result_t *r, const char *model_id);

/* log(sum(exp(x[0..n)))) in double (n >= 1), and the arg-max (the lowest id on a tie, as the
 * decoder's greedy pick) when argmax is not NULL: the scoring of a continuation's logits that
 * eval, lseval and the cache optimizer's benchmark share. */
double kvedge_eval_lse(const float *x, uint32_t n, int32_t *argmax);

#ifdef __cplusplus
}
#endif
#endif
