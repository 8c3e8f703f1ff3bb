/* `kvedge prefill --engine llama.cpp` and `kvedge decode --engine llama.cpp`: the cloud and
 * edge roles with llama.cpp running the model (a GGUF file) through the llama.cpp bridge
 * (clients/llamacpp/bridge.h). Built when the bridge is (KVEDGE_HAVE_LLAMACPP). */
#ifndef KVEDGE_CLIENTS_CLI_LLAMACPP_H
#define KVEDGE_CLIENTS_CLI_LLAMACPP_H

#include <stdbool.h>
#include <stdint.h>

#include "clients/cli/cli.h"
#include "clients/e2e/e2e.h"

/* What the two commands take from their option tables. */
typedef struct {
    const char *cmd;      /* "prefill" or "decode" */
    const char *gguf;     /* --gguf */
    const char *model_id; /* --model-id (required) */
    const char *file, *context, *context_ids;
    bool special;          /* --special: special tokens in text are their ids */
    uint32_t tokens;       /* --tokens: exactly this many context tokens (0: as given) */
    uint32_t chunk_tokens; /* 0: KVEDGE_E2E_CHUNK_TOKENS_DEFAULT */
    const char *cache;     /* --llama-cache: f16 or f32 */
    uint32_t threads;      /* --threads: llama.cpp's (0: the online CPUs, at most 4) */
    /* prefill */
    kvedge_e2e_quant_t quant;
    const char *layers; /* --layers: put only these layers (NULL: all) */
    /* decode */
    const char *prompt, *prompt_ids;
    uint32_t max_new;
    bool quiet;
} kvedge_cli_llamacpp_args_t;

/* The commands: exit codes as the reference engine's (2 usage, also a GGUF that does not match
 * the model record, a cache type the bridge cannot write; 1 a GGUF that does not load, a
 * failed put or import; 3 the store does not know the model; 5 unreachable). */
int kvedge_cli_llamacpp_prefill(kvedge_cli_t *cli, const kvedge_cli_llamacpp_args_t *a);
int kvedge_cli_llamacpp_decode(kvedge_cli_t *cli, const kvedge_cli_llamacpp_args_t *a);

#endif
