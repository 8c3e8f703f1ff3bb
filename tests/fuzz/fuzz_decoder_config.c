/* Fuzz target for the decoder's config.json reader (kvedge_decoder_impl_parse_config): Hugging
 * Face model configs from disk. Built with libFuzzer (KVEDGE_FUZZ=ON, clang) it fuzzes; built
 * normally it replays the committed corpus. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "clients/decoder/decoder_impl.h"
#include "access/codec/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvedge_decoder_impl_hf_config_t hf;
    char err[256];
    int rc = kvedge_decoder_impl_parse_config((const char *)data, size, &hf, err, sizeof err);
    if (rc != KVEDGE_OK) {
        /* A refusal says why, within the buffer. */
        if (err[0] == '\0' || memchr(err, '\0', sizeof err) == NULL ||
            (rc != KVEDGE_EINVAL && rc != KVEDGE_ECORRUPT))
            abort();
        return 0;
    }
    /* An accepted config names a supported architecture and a usable shape. */
    const char *const types[] = {"opt", "llama", "mistral", "qwen2"};
    size_t i = 0;
    while (i < 4 && strcmp(hf.model_type, types[i]) != 0)
        i++;
    if (i == 4 || hf.cfg.heads == 0)
        abort();
    if (i > 0 &&
        (hf.cfg.layers == 0 || hf.cfg.hidden == 0 || hf.cfg.ffn == 0 || hf.cfg.vocab == 0 ||
         hf.kv_heads == 0 || hf.cfg.heads % hf.kv_heads != 0 || hf.cfg.head_dim < 2 ||
         hf.cfg.head_dim % 2 != 0 || !(hf.norm_eps > 0) || !(hf.rope_theta > 0)))
        abort();
    if (hf.rope_llama3 && !(hf.rope_factor > 0 && hf.rope_high > hf.rope_low && hf.rope_low > 0 &&
                            hf.rope_orig_max > 0))
        abort();
    return 0;
}
