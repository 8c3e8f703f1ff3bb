/* Codec-internal entry of the basis loader (basis.c): what a daemon's start-up log needs beyond
 * basis.h's kvedge_basis_load_dir. Not installed. */
#ifndef KVEDGE_CODEC_BASIS_DIR_H
#define KVEDGE_CODEC_BASIS_DIR_H

#include <stddef.h>

/* kvedge_basis_load_dir, which also writes the model ids of the files it loaded into models
 * (may be NULL), in name order as "a, b", cut to models_len bytes with its NUL. On an error the
 * list holds the files loaded before it. */
int kvedge_basis_load_dir_models(const char *dir, size_t *loaded, char *models, size_t models_len,
                                 char *why, size_t why_len);

#endif
