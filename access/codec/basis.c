/* Coding bases of the tc rung (basis.h): the strict file parser and the process's registry. */
#include "access/codec/basis.h"
#include "access/codec/basis_dir.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "access/codec/block.h"
#include "access/codec/byteorder.h"
#include "access/codec/chunk.h"
#include "access/codec/error.h"
#include "access/codec/half.h"
#include "access/codec/model.h"
#include "access/codec/why.h"

/* Where the header's fields sit (basis.h's table). */
#define S_OFF_VERSION  8u
#define S_OFF_FLAGS    10u
#define S_OFF_DIM      12u
#define S_OFF_RESERVED 14u
#define S_OFF_LAYERS   16u
#define S_OFF_HEADS    20u
#define S_OFF_MODEL    24u
#define S_MODEL_FIELD  (KVEDGE_BASIS_HEADER_BYTES - S_OFF_MODEL)

_Static_assert(S_MODEL_FIELD > KVEDGE_MODEL_ID_MAX_BYTES, "the model id field holds a NUL");

struct kvedge_basis {
    uint64_t id;                               /* first 8 digest bytes, little-endian */
    char model[KVEDGE_MODEL_ID_MAX_BYTES + 1]; /* NUL-terminated */
    uint32_t layers, heads, dim;               /* L, H, D */
    float *step;                               /* [L][H][2] */
    float *fwd;                                /* [L][H][2][D][D] */
    float *inv;                                /* [L][H][2][D][D], fp16 values as fp32 */
};

/* Bytes of one section in the file: step, fwd fp32, inv fp16. */
static uint64_t s_section_bytes(uint32_t d)
{
    return 4u + 6ull * d * d;
}

void kvedge_basis_free(kvedge_basis_t **b)
{
    if (!b || !*b)
        return;
    free((*b)->inv);
    free((*b)->fwd);
    free((*b)->step);
    free(*b);
    *b = NULL;
}

/* The header's checks in the order the file is read; *expect gets the whole file's length. */
static int s_header(const uint8_t *buf, size_t len, uint64_t *expect, char *why, size_t why_len)
{
    if (len >= 8 && memcmp(buf, KVEDGE_BASIS_MAGIC, 8) != 0)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "bad magic (not a kvedge basis file)");
    if (len < KVEDGE_BASIS_HEADER_BYTES)
        return kvedge_why(why, why_len, KVEDGE_ETRUNCATED,
                          "truncated: %zu bytes, shorter than the %u-byte header", len,
                          KVEDGE_BASIS_HEADER_BYTES);
    const uint16_t version = kvedge_le_get16(buf + S_OFF_VERSION);
    if (version != KVEDGE_BASIS_VERSION)
        return kvedge_why(why, why_len, KVEDGE_EVERSION, "version %u (this reader knows %d)",
                          version, KVEDGE_BASIS_VERSION);
    if (kvedge_le_get16(buf + S_OFF_FLAGS) != 0)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "flags 0x%04x (must be 0)",
                          kvedge_le_get16(buf + S_OFF_FLAGS));
    if (kvedge_le_get16(buf + S_OFF_RESERVED) != 0)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "reserved field is not 0");
    const uint32_t d = kvedge_le_get16(buf + S_OFF_DIM), l = kvedge_le_get32(buf + S_OFF_LAYERS),
                   h = kvedge_le_get32(buf + S_OFF_HEADS);
    if (d == 0 || l == 0 || h == 0)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                          "empty shape: head_dim %u, layers %u, kv_heads %u (each must be >= 1)", d,
                          l, h);
    if (d > KVEDGE_BLOCK_MAX_HEAD_DIM || l > KVEDGE_MODEL_MAX_LAYERS || h > KVEDGE_MODEL_MAX_HEADS)
        return kvedge_why(why, why_len, KVEDGE_ETOOBIG,
                          "shape over the limits: head_dim %u (max %d), layers %u (max %d), "
                          "kv_heads %u (max %d)",
                          d, KVEDGE_BLOCK_MAX_HEAD_DIM, l, KVEDGE_MODEL_MAX_LAYERS, h,
                          KVEDGE_MODEL_MAX_HEADS);
    const uint8_t *mid = buf + S_OFF_MODEL;
    const size_t idlen = strnlen((const char *)mid, S_MODEL_FIELD);
    if (idlen == S_MODEL_FIELD)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "model id has no NUL");
    if (idlen == 0)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "model id is empty");
    if (idlen > KVEDGE_MODEL_ID_MAX_BYTES)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "model id is %zu bytes (max %d)", idlen,
                          KVEDGE_MODEL_ID_MAX_BYTES);
    for (size_t i = idlen; i < S_MODEL_FIELD; i++)
        if (mid[i] != 0)
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "model id padding has a non-NUL byte at offset %zu", S_OFF_MODEL + i);
    *expect = KVEDGE_BASIS_HEADER_BYTES + (uint64_t)l * h * 2u * s_section_bytes(d) +
              KVEDGE_BASIS_DIGEST_BYTES;
    if (*expect > KVEDGE_BASIS_MAX_BYTES)
        return kvedge_why(why, why_len, KVEDGE_ETOOBIG,
                          "a %u x %u x %u basis is %llu bytes (max %u)", l, h, d,
                          (unsigned long long)*expect, KVEDGE_BASIS_MAX_BYTES);
    if (len < *expect)
        return kvedge_why(why, why_len, KVEDGE_ETRUNCATED,
                          "truncated: %zu bytes of the %llu its header says", len,
                          (unsigned long long)*expect);
    if (len > *expect)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                          "%zu bytes past the end its header says (%llu)", len - (size_t)*expect,
                          (unsigned long long)*expect);
    return KVEDGE_OK;
}

/* True for a positive normal fp16 value held exactly in a float. */
static bool s_step_ok(float s)
{
    if (!isfinite(s) || !(s > 0.0f))
        return false;
    const uint16_t h = kvedge_f32_to_fp16(s);
    return (h & 0x7C00u) != 0 && (h & 0x7C00u) != 0x7C00u && kvedge_fp16_to_f32(h) == s;
}

/* Reads the sections after the header into b (allocated). */
static int s_sections(const uint8_t *buf, kvedge_basis_t *b, char *why, size_t why_len)
{
    const uint32_t d = b->dim;
    const size_t n = (size_t)b->layers * b->heads * 2u, dd = (size_t)d * d;
    b->step = malloc(n * sizeof *b->step);
    b->fwd = malloc(n * dd * sizeof *b->fwd);
    b->inv = malloc(n * dd * sizeof *b->inv);
    if (!b->step || !b->fwd || !b->inv)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "out of memory for %zu sections", n);
    const uint8_t *p = buf + KVEDGE_BASIS_HEADER_BYTES;
    for (size_t s = 0; s < n; s++) {
        const uint32_t layer = (uint32_t)(s / (2u * b->heads)),
                       head = (uint32_t)(s / 2u % b->heads);
        const char *kv = s % 2u ? "V" : "K";
        const float step = kvedge_f32_from_bits(kvedge_le_get32(p));
        if (!s_step_ok(step))
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "layer %u head %u %s: step %g is not a positive normal fp16 value",
                              layer, head, kv, (double)step);
        b->step[s] = step;
        p += 4;
        float *fwd = b->fwd + s * dd, *inv = b->inv + s * dd;
        for (size_t i = 0; i < dd; i++, p += 4) {
            fwd[i] = kvedge_f32_from_bits(kvedge_le_get32(p));
            if (!isfinite(fwd[i]))
                return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                                  "layer %u head %u %s: fwd[%zu][%zu] is not finite", layer, head,
                                  kv, i / d, i % d);
        }
        for (size_t i = 0; i < dd; i++, p += 2) {
            inv[i] = kvedge_fp16_to_f32(kvedge_le_get16(p));
            if (!isfinite(inv[i]))
                return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                                  "layer %u head %u %s: inv[%zu][%zu] is not finite", layer, head,
                                  kv, i / d, i % d);
        }
    }
    return KVEDGE_OK;
}

int kvedge_basis_parse(const uint8_t *buf, size_t len, kvedge_basis_t **out, char *why,
                       size_t why_len)
{
    if (out)
        *out = NULL;
    if (!buf || !out)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "no buffer or no output");
    if (len > KVEDGE_BASIS_MAX_BYTES)
        return kvedge_why(why, why_len, KVEDGE_ETOOBIG, "%zu bytes (a basis file is at most %u)",
                          len, KVEDGE_BASIS_MAX_BYTES);
    uint64_t expect = 0;
    int rc = s_header(buf, len, &expect, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    if (sodium_init() < 0) /* idempotent and thread-safe; picks the fast BLAKE2b */
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "libsodium failed to initialize");
    uint8_t digest[KVEDGE_BASIS_DIGEST_BYTES];
    const size_t body = len - KVEDGE_BASIS_DIGEST_BYTES;
    crypto_generichash(digest, sizeof digest, buf, body, NULL, 0);
    if (sodium_memcmp(digest, buf + body, sizeof digest) != 0)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                          "digest mismatch (the file is damaged or was edited)");
    kvedge_basis_t *b = calloc(1, sizeof *b);
    if (!b)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "out of memory");
    b->id = kvedge_le_get64(digest);
    b->dim = kvedge_le_get16(buf + S_OFF_DIM);
    b->layers = kvedge_le_get32(buf + S_OFF_LAYERS);
    b->heads = kvedge_le_get32(buf + S_OFF_HEADS);
    memcpy(b->model, buf + S_OFF_MODEL, KVEDGE_MODEL_ID_MAX_BYTES);
    b->model[KVEDGE_MODEL_ID_MAX_BYTES] = '\0';
    rc = s_sections(buf, b, why, why_len);
    if (rc != KVEDGE_OK) {
        kvedge_basis_free(&b);
        return rc;
    }
    *out = b;
    return KVEDGE_OK;
}

int kvedge_basis_load(const char *path, kvedge_basis_t **out, char *why, size_t why_len)
{
    if (out)
        *out = NULL;
    if (!path || !out)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "no path or no output");
    FILE *f = fopen(path, "rb");
    if (!f)
        return kvedge_why(why, why_len, KVEDGE_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return kvedge_why(why, why_len, KVEDGE_EIO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > KVEDGE_BASIS_MAX_BYTES) {
        fclose(f);
        return kvedge_why(why, why_len, KVEDGE_ETOOBIG,
                          "%s: %lld bytes (a basis file is at most %u)", path,
                          (long long)st.st_size, KVEDGE_BASIS_MAX_BYTES);
    }
    const size_t len = (size_t)st.st_size;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        fclose(f);
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "%s: out of memory", path);
    }
    const size_t got = fread(buf, 1, len, f);
    const bool err = ferror(f) != 0;
    fclose(f);
    if (err || got != len) {
        free(buf);
        return kvedge_why(why, why_len, KVEDGE_EIO, "%s: read %zu of %zu bytes", path, got, len);
    }
    char inner[256] = "";
    int rc = kvedge_basis_parse(buf, len, out, inner, sizeof inner);
    free(buf);
    if (rc != KVEDGE_OK)
        return kvedge_why(why, why_len, rc, "%s: %s", path, inner);
    return KVEDGE_OK;
}

uint64_t kvedge_basis_id(const kvedge_basis_t *b)
{
    return b ? b->id : 0;
}

const char *kvedge_basis_model(const kvedge_basis_t *b)
{
    return b ? b->model : NULL;
}

uint32_t kvedge_basis_layers(const kvedge_basis_t *b)
{
    return b ? b->layers : 0;
}

uint32_t kvedge_basis_kv_heads(const kvedge_basis_t *b)
{
    return b ? b->heads : 0;
}

uint32_t kvedge_basis_head_dim(const kvedge_basis_t *b)
{
    return b ? b->dim : 0;
}

int kvedge_basis_section(const kvedge_basis_t *b, uint32_t layer, uint32_t head, int which,
                         kvedge_basis_section_t *out)
{
    if (!b || !out || layer >= b->layers || head >= b->heads || (which != 0 && which != 1))
        return KVEDGE_EINVAL;
    const size_t s = ((size_t)layer * b->heads + head) * 2u + (size_t)which,
                 dd = (size_t)b->dim * b->dim;
    out->dim = b->dim;
    out->step = b->step[s];
    out->fwd = b->fwd + s * dd;
    out->inv = b->inv + s * dd;
    return KVEDGE_OK;
}

/* The registry: entries are only ever appended, and never freed, so a pointer handed out stays
 * valid for the life of the process. */
static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static kvedge_basis_t *s_loaded[KVEDGE_BASIS_MAX_LOADED];
static size_t s_count;

int kvedge_basis_register(kvedge_basis_t **b)
{
    if (!b || !*b)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&s_lock);
    int rc = KVEDGE_OK;
    bool dup = false;
    for (size_t i = 0; i < s_count && !dup && rc == KVEDGE_OK; i++) {
        if (s_loaded[i]->id == (*b)->id)
            dup = true;
        else if (strcmp(s_loaded[i]->model, (*b)->model) == 0)
            rc = KVEDGE_EAMBIGUOUS;
    }
    if (rc == KVEDGE_OK && !dup) {
        if (s_count == KVEDGE_BASIS_MAX_LOADED)
            rc = KVEDGE_EFULL;
        else
            s_loaded[s_count++] = *b;
    }
    pthread_mutex_unlock(&s_lock);
    if (rc != KVEDGE_OK)
        return rc;
    if (dup)
        kvedge_basis_free(b);
    *b = NULL;
    return KVEDGE_OK;
}

const kvedge_basis_t *kvedge_basis_find(uint64_t id)
{
    const kvedge_basis_t *found = NULL;
    pthread_mutex_lock(&s_lock);
    for (size_t i = 0; i < s_count && !found; i++)
        if (s_loaded[i]->id == id)
            found = s_loaded[i];
    pthread_mutex_unlock(&s_lock);
    return found;
}

const kvedge_basis_t *kvedge_basis_find_model(const char *model_id)
{
    if (!model_id)
        return NULL;
    const kvedge_basis_t *found = NULL;
    pthread_mutex_lock(&s_lock);
    for (size_t i = 0; i < s_count && !found; i++)
        if (strcmp(s_loaded[i]->model, model_id) == 0)
            found = s_loaded[i];
    pthread_mutex_unlock(&s_lock);
    return found;
}

static int s_is_basis_file(const struct dirent *e)
{
    const size_t n = strlen(e->d_name), k = strlen(KVEDGE_BASIS_SUFFIX);
    return e->d_name[0] != '.' && n > k && strcmp(e->d_name + n - k, KVEDGE_BASIS_SUFFIX) == 0;
}

/* Appends ", model" (or "model" first) to the list out of cap bytes, cut at cap. */
static void s_list_model(char *out, size_t cap, const char *model)
{
    if (!out || !cap)
        return;
    size_t used = strnlen(out, cap);
    if (used + 1 < cap)
        snprintf(out + used, cap - used, "%s%s", used ? ", " : "", model);
}

int kvedge_basis_load_dir(const char *dir, size_t *loaded, char *why, size_t why_len)
{
    return kvedge_basis_load_dir_models(dir, loaded, NULL, 0, why, why_len);
}

int kvedge_basis_load_dir_models(const char *dir, size_t *loaded, char *models, size_t models_len,
                                 char *why, size_t why_len)
{
    if (loaded)
        *loaded = 0;
    if (models && models_len)
        models[0] = '\0';
    if (!dir)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "no directory");
    struct dirent **names = NULL;
    const int n = scandir(dir, &names, s_is_basis_file, alphasort);
    if (n < 0)
        return kvedge_why(why, why_len, KVEDGE_EIO, "%s: %s", dir, strerror(errno));
    int rc = KVEDGE_OK;
    for (int i = 0; i < n; i++) {
        if (rc == KVEDGE_OK) {
            char path[4096];
            kvedge_basis_t *b = NULL;
            if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name) >= sizeof path)
                rc = kvedge_why(why, why_len, KVEDGE_EINVAL, "%s/%s: path too long", dir,
                                names[i]->d_name);
            else
                rc = kvedge_basis_load(path, &b, why, why_len);
            if (rc == KVEDGE_OK) {
                s_list_model(models, models_len, kvedge_basis_model(b));
                rc = kvedge_basis_register(&b);
                if (rc != KVEDGE_OK) {
                    if (rc == KVEDGE_EAMBIGUOUS)
                        kvedge_why(why, why_len, rc,
                                   "%s: another basis of model %s is already loaded (one per "
                                   "model per process)",
                                   path, kvedge_basis_model(b));
                    else
                        kvedge_why(why, why_len, rc, "%s: the process holds %d bases already", path,
                                   KVEDGE_BASIS_MAX_LOADED);
                    kvedge_basis_free(&b);
                }
            }
            if (rc == KVEDGE_OK && loaded)
                (*loaded)++;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}
