/* The llama.cpp side of test_decoder_llamacpp: runs token ids through a GGUF model with
 * llama.cpp's C API (CPU, fp32 KV cache) and writes the logits of every position, then greedy
 * continuations. Built at test time against the headers of the llama.cpp source that
 * @node-llama-cpp/linux-x64's libraries were built from (tests/decoder/fetch_llamacpp.sh);
 * kvedge never links it.
 * Usage: llama_logits BINS_DIR MODEL.gguf OUT N_GEN ID...
 * OUT: int32 vocab, int32 n, n * vocab float32 logits, N_GEN int32 greedy tokens. */
#include <ggml-backend.h>
#include <llama.h>
#include <stdio.h>
#include <stdlib.h>

static void s_quiet(enum ggml_log_level level, const char *text, void *arg)
{
    (void)arg;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

static int s_argmax(const float *l, int n)
{
    int best = 0;
    for (int j = 1; j < n; j++)
        if (l[j] > l[best])
            best = j;
    return best;
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: llama_logits BINS_DIR MODEL.gguf OUT N_GEN ID...\n");
        return 2;
    }
    const int n = argc - 5, n_gen = atoi(argv[4]);
    llama_log_set(s_quiet, NULL);
    ggml_backend_load_all_from_path(argv[1]);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[2], mp);
    if (!model) {
        fprintf(stderr, "llama_logits: cannot load %s\n", argv[2]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n + n_gen + 8);
    cp.n_batch = cp.n_ubatch = (uint32_t)(n + 8);
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = GGML_TYPE_F32; /* F16 moves logits by ~5e-3; F32 compares the math */
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama_logits: cannot make a context\n");
        return 1;
    }
    const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = atoi(argv[5 + i]);
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = n;
    FILE *f = fopen(argv[3], "wb");
    if (!f || llama_decode(ctx, b) != 0) {
        fprintf(stderr, "llama_logits: decode failed\n");
        return 1;
    }
    int32_t hdr[2] = {vocab, n};
    fwrite(hdr, sizeof hdr, 1, f);
    for (int i = 0; i < n; i++)
        fwrite(llama_get_logits_ith(ctx, i), sizeof(float), (size_t)vocab, f);
    int32_t tok = s_argmax(llama_get_logits_ith(ctx, n - 1), vocab);
    for (int g = 0; g < n_gen; g++) {
        fwrite(&tok, sizeof tok, 1, f);
        struct llama_batch one = llama_batch_init(1, 0, 1);
        one.token[0] = tok;
        one.pos[0] = n + g;
        one.n_seq_id[0] = 1;
        one.seq_id[0][0] = 0;
        one.logits[0] = 1;
        one.n_tokens = 1;
        if (llama_decode(ctx, one) != 0) {
            fprintf(stderr, "llama_logits: decode failed\n");
            return 1;
        }
        tok = s_argmax(llama_get_logits_ith(ctx, 0), vocab);
        llama_batch_free(one);
    }
    fclose(f);
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
