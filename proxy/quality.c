/* The quality profile of a model (quality.h): the loader and checker of the file kvedge eval
 * --profile-out writes, and the cost lookups the planner makes. */
#include "proxy/quality.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "access/codec/error.h"
#include "access/codec/model.h"
#include "access/codec/why.h"

struct kvedge_quality_profile_t {
    char model[KVEDGE_MODEL_ID_MAX_BYTES + 1]; /* the base model id */
    uint32_t layers;                           /* rows of the per-layer table */
    uint32_t ctx_tokens, cont_tokens;          /* provenance; 0 when absent */
    uint64_t documents;                        /* provenance; 0 when absent */
    size_t n_rungs;
    kvedge_prec_t rung[KVEDGE_QUALITY_MAX_RUNGS]; /* the file's order */
    uint8_t slot[256];                            /* rung code -> index + 1; 0: not measured */
    kvedge_quality_figures_t *fig;                /* [layers][n_rungs] */
    bool whole_has[256];                          /* rung code -> a whole-model row */
    kvedge_quality_figures_t whole[256];          /* by rung code */
};

/* ---------------------------------------------------------------- checks */

/* A finite number in [lo, hi] (hi may be INFINITY), the field's value. */
static bool s_num(const cJSON *j, double lo, double hi, double *out)
{
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) || j->valuedouble < lo ||
        j->valuedouble > hi)
        return false;
    *out = j->valuedouble;
    return true;
}

/* A whole number in [0, hi]. */
static bool s_int(const cJSON *j, double hi, uint64_t *out)
{
    double x;
    if (!s_num(j, 0, hi, &x) || floor(x) != x)
        return false;
    *out = (uint64_t)x;
    return true;
}

/* An optional whole-number field: absent leaves *out 0. */
static int s_opt_int(const cJSON *root, const char *key, double hi, uint64_t *out,
                     const char *origin, char *why, size_t why_len)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    *out = 0;
    if (j && !s_int(j, hi, out))
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: \"%s\" must be a whole number 0..%.0f",
                          origin, key, hi);
    return KVEDGE_OK;
}

/* A rung named by a JSON string; an entropy-coded one ("+ec") is not measured apart, its
 * values being the plain rung's. */
static bool s_rung(const cJSON *j, kvedge_prec_t *out)
{
    return cJSON_IsString(j) && kvedge_prec_parse(j->valuestring, out) == KVEDGE_OK &&
           kvedge_prec_valid(*out) && !KVEDGE_PREC_IS_EC(*out);
}

/* The rung whose figures a rung has: an "+ec" rung decodes to exactly the plain rung's values
 * (the entropy coding is lossless), so it has the plain rung's quality. */
static kvedge_prec_t s_measured(kvedge_prec_t rung)
{
    return (kvedge_prec_t)(rung & ~KVEDGE_PREC_EC);
}

/* The three figures of one measurement: from arrays at index i (obj a row of per_layer), or
 * from scalar fields (i < 0: a whole_model entry). `what` names it in the reason. */
static int s_figures(const cJSON *obj, int i, kvedge_quality_figures_t *f, const char *origin,
                     const char *what, char *why, size_t why_len)
{
    static const char *const keys[3] = {"ppl_pct", "kl", "agreement"};
    static const char *const want[3] = {"a finite number above -100", "a finite number >= 0",
                                        "a finite number in 0..1"};
    const double lo[3] = {-100, 0, 0}, hi[3] = {INFINITY, INFINITY, 1};
    double v[3];
    for (int k = 0; k < 3; k++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, keys[k]);
        if (i >= 0)
            j = cJSON_GetArrayItem(j, i);
        if (!s_num(j, lo[k], hi[k], &v[k]) || (k == 0 && v[k] == -100))
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: %s: \"%s\"%s must be %s", origin,
                              what, keys[k], i >= 0 ? " entries" : "", want[k]);
    }
    f->ppl_pct = v[0];
    f->kl = v[1];
    f->agreement = v[2];
    return KVEDGE_OK;
}

static int s_rungs(kvedge_quality_profile_t *p, const cJSON *root, const char *origin, char *why,
                   size_t why_len)
{
    const cJSON *rungs = cJSON_GetObjectItemCaseSensitive(root, "rungs");
    if (!cJSON_IsArray(rungs) || cJSON_GetArraySize(rungs) == 0)
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "%s: \"rungs\" must be a non-empty array of precision names", origin);
    if (cJSON_GetArraySize(rungs) > KVEDGE_QUALITY_MAX_RUNGS)
        return kvedge_why(why, why_len, KVEDGE_ETOOBIG, "%s: %d rungs, at most %d", origin,
                          cJSON_GetArraySize(rungs), KVEDGE_QUALITY_MAX_RUNGS);
    const cJSON *r;
    cJSON_ArrayForEach(r, rungs)
    {
        kvedge_prec_t x;
        if (!s_rung(r, &x))
            return kvedge_why(why, why_len, KVEDGE_EINVAL,
                              "%s: rung %zu: want a precision name (lossless, int8, int4-g32, "
                              "int4-g64, int4-g128, each optionally +think-75 or +think-50; "
                              "tc)%s%s",
                              origin, p->n_rungs, cJSON_IsString(r) ? ", got " : "",
                              cJSON_IsString(r) ? r->valuestring : "");
        if (p->slot[x])
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: rung %s is listed twice", origin,
                              kvedge_prec_name(x));
        p->rung[p->n_rungs++] = x;
        p->slot[x] = (uint8_t)p->n_rungs;
    }
    return KVEDGE_OK;
}

static int s_per_layer(kvedge_quality_profile_t *p, const cJSON *root, const char *origin,
                       char *why, size_t why_len)
{
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(root, "per_layer");
    if (!cJSON_IsArray(rows))
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: \"per_layer\" must be an array",
                          origin);
    if ((uint32_t)cJSON_GetArraySize(rows) != p->layers)
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "%s: \"per_layer\" has %d rows, \"layers\" says %u", origin,
                          cJSON_GetArraySize(rows), p->layers);
    p->fig = calloc((size_t)p->layers * p->n_rungs, sizeof *p->fig);
    if (!p->fig)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "%s: out of memory", origin);
    uint32_t l = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, rows)
    {
        uint64_t at;
        if (!cJSON_IsObject(row) ||
            !s_int(cJSON_GetObjectItemCaseSensitive(row, "layer"), KVEDGE_QUALITY_MAX_LAYERS,
                   &at) ||
            at != l)
            return kvedge_why(why, why_len, KVEDGE_EINVAL,
                              "%s: per_layer row %u must be an object with \"layer\": %u", origin,
                              l, l);
        static const char *const keys[3] = {"ppl_pct", "kl", "agreement"};
        for (int k = 0; k < 3; k++) {
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(row, keys[k]);
            if (!cJSON_IsArray(a) || (size_t)cJSON_GetArraySize(a) != p->n_rungs)
                return kvedge_why(why, why_len, KVEDGE_EINVAL,
                                  "%s: layer %u: \"%s\" must be an array of %zu numbers (one "
                                  "per rung)",
                                  origin, l, keys[k], p->n_rungs);
        }
        for (size_t i = 0; i < p->n_rungs; i++) {
            char what[64];
            snprintf(what, sizeof what, "layer %u", l);
            int rc = s_figures(row, (int)i, &p->fig[(size_t)l * p->n_rungs + i], origin, what, why,
                               why_len);
            if (rc != KVEDGE_OK)
                return rc;
        }
        l++;
    }
    return KVEDGE_OK;
}

static int s_whole(kvedge_quality_profile_t *p, const cJSON *root, const char *origin, char *why,
                   size_t why_len)
{
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(root, "whole_model");
    if (!rows)
        return KVEDGE_OK;
    if (!cJSON_IsArray(rows) || cJSON_GetArraySize(rows) > 256)
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "%s: \"whole_model\" must be an array of rung rows", origin);
    int i = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, rows)
    {
        kvedge_prec_t x;
        if (!cJSON_IsObject(row) || !s_rung(cJSON_GetObjectItemCaseSensitive(row, "rung"), &x))
            return kvedge_why(why, why_len, KVEDGE_EINVAL,
                              "%s: whole_model row %d: want an object whose \"rung\" is a "
                              "precision name",
                              origin, i);
        if (p->whole_has[x])
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: whole_model lists rung %s twice",
                              origin, kvedge_prec_name(x));
        char what[64];
        snprintf(what, sizeof what, "whole_model %s", kvedge_prec_name(x));
        int rc = s_figures(row, -1, &p->whole[x], origin, what, why, why_len);
        double b;
        const cJSON *bj = cJSON_GetObjectItemCaseSensitive(row, "bytes_over_fp16");
        if (rc == KVEDGE_OK && bj && !s_num(bj, 0, INFINITY, &b))
            rc = kvedge_why(why, why_len, KVEDGE_EINVAL,
                            "%s: %s: \"bytes_over_fp16\" must be a finite number >= 0", origin,
                            what);
        if (rc != KVEDGE_OK)
            return rc;
        p->whole_has[x] = true;
        i++;
    }
    return KVEDGE_OK;
}

/* The checks of a parsed document, into p. */
static int s_build(kvedge_quality_profile_t *p, const cJSON *root, const char *origin, char *why,
                   size_t why_len)
{
    if (!cJSON_IsObject(root))
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: not a JSON object", origin);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "kvedge_quality_profile");
    if (!v)
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "%s: not a quality profile (no \"kvedge_quality_profile\" version)",
                          origin);
    if (!cJSON_IsNumber(v))
        return kvedge_why(why, why_len, KVEDGE_EVERSION,
                          "%s: the profile format version is not a number", origin);
    if (v->valuedouble != KVEDGE_QUALITY_VERSION)
        return kvedge_why(why, why_len, KVEDGE_EVERSION,
                          "%s: profile format version %g, this build reads %d", origin,
                          v->valuedouble, KVEDGE_QUALITY_VERSION);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsString(m) || m->valuestring[0] == '\0' ||
        strlen(m->valuestring) > KVEDGE_MODEL_ID_MAX_BYTES)
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "%s: \"model\" must be a model id of 1..%d bytes", origin,
                          KVEDGE_MODEL_ID_MAX_BYTES);
    snprintf(p->model, sizeof p->model, "%s", m->valuestring);
    uint64_t layers;
    const cJSON *lj = cJSON_GetObjectItemCaseSensitive(root, "layers");
    /* Bounded below 2^53 before the conversion: a larger double does not fit a uint64_t (and
     * anything past KVEDGE_QUALITY_MAX_LAYERS is refused as too big just below). */
    if (!s_int(lj, 9007199254740992.0, &layers) || layers == 0)
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "%s: \"layers\" must be a whole number 1 .. 2^53", origin);
    if (layers > KVEDGE_QUALITY_MAX_LAYERS)
        return kvedge_why(why, why_len, KVEDGE_ETOOBIG, "%s: %llu layers, at most %d", origin,
                          (unsigned long long)layers, KVEDGE_QUALITY_MAX_LAYERS);
    p->layers = (uint32_t)layers;
    uint64_t x;
    int rc = s_opt_int(root, "context_tokens", UINT32_MAX, &x, origin, why, why_len);
    p->ctx_tokens = (uint32_t)x;
    if (rc == KVEDGE_OK)
        rc = s_opt_int(root, "continuation_tokens", UINT32_MAX, &x, origin, why, why_len);
    p->cont_tokens = (uint32_t)x;
    if (rc == KVEDGE_OK)
        rc = s_opt_int(root, "documents", 9007199254740992.0, &p->documents, origin, why, why_len);
    if (rc == KVEDGE_OK)
        rc = s_opt_int(root, "positions", 9007199254740992.0, &x, origin, why, why_len);
    if (rc == KVEDGE_OK)
        rc = s_rungs(p, root, origin, why, why_len);
    if (rc == KVEDGE_OK)
        rc = s_per_layer(p, root, origin, why, why_len);
    if (rc == KVEDGE_OK)
        rc = s_whole(p, root, origin, why, why_len);
    return rc;
}

static int s_parse(const char *json, size_t len, const char *origin, kvedge_quality_profile_t **out,
                   char *why, size_t why_len)
{
    if (len > KVEDGE_QUALITY_MAX_FILE_BYTES)
        return kvedge_why(why, why_len, KVEDGE_ETOOBIG, "%s: %zu bytes, a profile is at most %u",
                          origin, len, KVEDGE_QUALITY_MAX_FILE_BYTES);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= json && at <= json + len ? (size_t)(at - json) : len;
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "%s: malformed or truncated JSON (error at byte %zu of %zu)", origin, off,
                          len);
    }
    for (const char *q = end; q && q < json + len; q++)
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r' && *q != '\0') {
            cJSON_Delete(root);
            return kvedge_why(why, why_len, KVEDGE_EINVAL,
                              "%s: something follows the JSON object at byte %zu", origin,
                              (size_t)(q - json));
        }
    kvedge_quality_profile_t *p = calloc(1, sizeof *p);
    int rc = p ? s_build(p, root, origin, why, why_len)
               : kvedge_why(why, why_len, KVEDGE_ENOMEM, "%s: out of memory", origin);
    cJSON_Delete(root);
    if (rc != KVEDGE_OK) {
        kvedge_quality_destroy(&p);
        return rc;
    }
    *out = p;
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- the class */

int kvedge_quality_parse(const char *json, size_t len, kvedge_quality_profile_t **out, char *why,
                         size_t why_len)
{
    if (out)
        *out = NULL;
    if (!json || !out)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "profile: no JSON or no output");
    return s_parse(json, len, "profile", out, why, why_len);
}

int kvedge_quality_load(const char *path, kvedge_quality_profile_t **out, char *why, size_t why_len)
{
    if (out)
        *out = NULL;
    if (!path || !out)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "profile: no path or no output");
    FILE *f = fopen(path, "rb");
    if (!f)
        return kvedge_why(why, why_len, KVEDGE_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return kvedge_why(why, why_len, KVEDGE_EIO, "%s: not a regular file", path);
    }
    if ((uint64_t)sb.st_size > KVEDGE_QUALITY_MAX_FILE_BYTES) {
        fclose(f);
        return kvedge_why(why, why_len, KVEDGE_ETOOBIG, "%s: %llu bytes, a profile is at most %u",
                          path, (unsigned long long)sb.st_size, KVEDGE_QUALITY_MAX_FILE_BYTES);
    }
    /* Read one byte past the limit: the file may have grown since fstat. */
    char *buf = malloc(KVEDGE_QUALITY_MAX_FILE_BYTES + 1);
    if (!buf) {
        fclose(f);
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "%s: out of memory", path);
    }
    size_t len = fread(buf, 1, KVEDGE_QUALITY_MAX_FILE_BYTES + 1, f);
    int rc = KVEDGE_OK;
    if (ferror(f))
        rc = kvedge_why(why, why_len, KVEDGE_EIO, "%s: read error", path);
    fclose(f);
    if (rc == KVEDGE_OK)
        rc = s_parse(buf, len, path, out, why, why_len);
    free(buf);
    return rc;
}

void kvedge_quality_destroy(kvedge_quality_profile_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_quality_profile_t *p = *self_p;
    *self_p = NULL;
    free(p->fig);
    free(p);
}

const char *kvedge_quality_model(const kvedge_quality_profile_t *self)
{
    return self ? self->model : NULL;
}

uint32_t kvedge_quality_layers(const kvedge_quality_profile_t *self)
{
    return self ? self->layers : 0;
}

uint32_t kvedge_quality_context_tokens(const kvedge_quality_profile_t *self)
{
    return self ? self->ctx_tokens : 0;
}

uint32_t kvedge_quality_continuation_tokens(const kvedge_quality_profile_t *self)
{
    return self ? self->cont_tokens : 0;
}

uint64_t kvedge_quality_documents(const kvedge_quality_profile_t *self)
{
    return self ? self->documents : 0;
}

size_t kvedge_quality_n_rungs(const kvedge_quality_profile_t *self)
{
    return self ? self->n_rungs : 0;
}

kvedge_prec_t kvedge_quality_rung(const kvedge_quality_profile_t *self, size_t i)
{
    return self && i < self->n_rungs ? self->rung[i] : (kvedge_prec_t)KVEDGE_PREC_STORED;
}

bool kvedge_quality_has(const kvedge_quality_profile_t *self, kvedge_prec_t rung)
{
    return self && kvedge_prec_valid(rung) &&
           (rung == KVEDGE_PREC_LOSSLESS || self->slot[s_measured(rung)] != 0);
}

int kvedge_quality_figures(const kvedge_quality_profile_t *self, uint32_t layer, kvedge_prec_t rung,
                           kvedge_quality_figures_t *out)
{
    if (!self || !out || layer >= self->layers || !kvedge_prec_valid(rung))
        return KVEDGE_EINVAL;
    rung = s_measured(rung);
    if (rung == KVEDGE_PREC_LOSSLESS) {
        kvedge_quality_figures_t zero = {0, 0, 1};
        *out = zero;
        return KVEDGE_OK;
    }
    if (!self->slot[rung])
        return KVEDGE_ENOTFOUND;
    *out = self->fig[(size_t)layer * self->n_rungs + (self->slot[rung] - 1u)];
    return KVEDGE_OK;
}

int kvedge_quality_cost(const kvedge_quality_profile_t *self, uint32_t layer, kvedge_prec_t rung,
                        kvedge_quality_metric_t metric, double *cost)
{
    if (!cost || (metric != KVEDGE_QUALITY_PPL_PCT && metric != KVEDGE_QUALITY_KL))
        return KVEDGE_EINVAL;
    kvedge_quality_figures_t f;
    int rc = kvedge_quality_figures(self, layer, rung, &f);
    if (rc != KVEDGE_OK)
        return rc;
    double c = metric == KVEDGE_QUALITY_KL ? f.kl : f.ppl_pct;
    *cost = c > 0 ? c : 0; /* negative perplexity changes: see quality.h */
    return KVEDGE_OK;
}

int kvedge_quality_whole(const kvedge_quality_profile_t *self, kvedge_prec_t rung,
                         kvedge_quality_figures_t *out)
{
    if (!self || !out || !kvedge_prec_valid(rung))
        return KVEDGE_EINVAL;
    rung = s_measured(rung);
    if (rung == KVEDGE_PREC_LOSSLESS) {
        kvedge_quality_figures_t zero = {0, 0, 1};
        *out = zero;
        return KVEDGE_OK;
    }
    if (!self->whole_has[rung])
        return KVEDGE_ENOTFOUND;
    *out = self->whole[rung];
    return KVEDGE_OK;
}
