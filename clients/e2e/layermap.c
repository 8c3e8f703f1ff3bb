/* Layer matching between a cloud and an edge model (clients/e2e/layermap.h): hidden states through
 * the decoder's trace hook, CKA and RSA from gpu/, the selection rule of Eq. 16, the map file. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clients/e2e/layermap.h"
#include "gpu/cka.h"
#include "gpu/rsa.h"
#include "gpu/stage.h"
#include "access/codec/error.h"

#define S_MAGIC   "kvedge-layermap"
#define S_VERSION 1
/* Largest hidden size a map names (the decoder's own bound on a size). */
#define S_HIDDEN_MAX (1u << 24)

double kvedge_layermap_alignment(double cka, double rsa)
{
    return (cka + rsa) / 2;
}

int32_t kvedge_layermap_select(const double *cka, const double *rsa, uint32_t cloud_layers,
                               double cka_min, double rsa_min, double tie)
{
    if (!cka || !rsa)
        return KVEDGE_LAYERMAP_NONE;
    double best = -INFINITY;
    for (uint32_t c = 0; c < cloud_layers; c++)
        if (cka[c] >= cka_min && rsa[c] >= rsa_min) {
            const double s = kvedge_layermap_alignment(cka[c], rsa[c]);
            if (s > best)
                best = s;
        }
    if (best == -INFINITY)
        return KVEDGE_LAYERMAP_NONE;
    for (uint32_t c = 0; c < cloud_layers; c++)
        if (cka[c] >= cka_min && rsa[c] >= rsa_min &&
            kvedge_layermap_alignment(cka[c], rsa[c]) >= best - tie)
            return (int32_t)c;
    return KVEDGE_LAYERMAP_NONE; /* not reached: the best candidate passes its own test */
}

/* ---------------------------------------------------------------------------------------- */
/* Hidden states                                                                             */

typedef struct {
    float *out;       /* [layers][samples][hidden] */
    uint32_t samples; /* rows per layer */
    uint32_t hidden;
    uint32_t row0; /* the window's first row */
} s_collect_t;

static int s_collect_layer(void *arg, uint32_t layer, const float *hidden, uint32_t n,
                           const float *q, const float *k, const float *v)
{
    (void)q;
    (void)k;
    (void)v;
    s_collect_t *c = arg;
    float *dst = c->out + ((size_t)layer * c->samples + c->row0) * c->hidden;
    memcpy(dst, hidden, (size_t)n * c->hidden * sizeof(float));
    return KVEDGE_OK;
}

int kvedge_layermap_collect(const kvedge_decoder_t *md, const int32_t *tokens, uint32_t samples,
                            uint32_t window, float *out)
{
    if (!md || !tokens || !out || samples == 0 || window == 0)
        return KVEDGE_EINVAL;
    const kvedge_decoder_config_t *cfg = kvedge_decoder_config(md);
    if (cfg->layers == 0 || window > cfg->max_positions)
        return KVEDGE_EINVAL;
    s_collect_t c = {out, samples, cfg->hidden, 0};
    for (uint32_t at = 0; at < samples; at += window) {
        const uint32_t n = samples - at < window ? samples - at : window;
        c.row0 = at;
        int rc = kvedge_decoder_prefill_trace(md, tokens + at, n, s_collect_layer, &c);
        if (rc != KVEDGE_OK)
            return rc;
    }
    return KVEDGE_OK;
}

/* The scores on the device: every layer's states uploaded once, then cuBLAS CKA and RSA per
 * pair. Returns KVEDGE_EINVAL without a device (or on any CUDA failure), so the caller runs
 * the CPU references instead: the same numbers within KVEDGE_CKA_TOL / KVEDGE_RSA_TOL. */
static int s_scores_gpu(const float *edge, uint32_t edge_layers, uint32_t edge_hidden,
                        const float *cloud, uint32_t cloud_layers, uint32_t cloud_hidden,
                        uint32_t n, double *cka, double *rsa)
{
    if (kvedge_gpu_device_count() <= 0)
        return KVEDGE_EINVAL;
    const size_t eb = sizeof(float) * n * edge_hidden, cb = sizeof(float) * n * cloud_hidden;
    void *de = NULL, *dc = NULL;
    int rc = kvedge_gpu_dev_alloc(eb * edge_layers, &de);
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_dev_alloc(cb * cloud_layers, &dc);
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_copy_h2d(de, edge, eb * edge_layers, NULL);
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_copy_h2d(dc, cloud, cb * cloud_layers, NULL);
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_stream_sync(NULL);
    for (uint32_t e = 0; rc == KVEDGE_OK && e < edge_layers; e++)
        for (uint32_t c = 0; rc == KVEDGE_OK && c < cloud_layers; c++) {
            const float *x = (const float *)((const char *)de + eb * e);
            const float *y = (const float *)((const char *)dc + cb * c);
            double *ck = cka + (size_t)e * cloud_layers + c,
                   *rs = rsa + (size_t)e * cloud_layers + c;
            const kvedge_cka_args_t ca = {x, y, n, edge_hidden, cloud_hidden, ck};
            const kvedge_rsa_args_t ra = {x, y, n, edge_hidden, cloud_hidden, rs};
            rc = kvedge_gpu_cka(&ca, NULL);
            if (rc == KVEDGE_OK)
                rc = kvedge_gpu_rsa(&ra, NULL);
        }
    kvedge_gpu_dev_free(de);
    kvedge_gpu_dev_free(dc);
    return rc;
}

int kvedge_layermap_scores(const float *edge, uint32_t edge_layers, uint32_t edge_hidden,
                           const float *cloud, uint32_t cloud_layers, uint32_t cloud_hidden,
                           uint32_t n, double *cka, double *rsa)
{
    if (!edge || !cloud || !cka || !rsa || edge_layers == 0 || cloud_layers == 0)
        return KVEDGE_EINVAL;
    if (s_scores_gpu(edge, edge_layers, edge_hidden, cloud, cloud_layers, cloud_hidden, n, cka,
                     rsa) == KVEDGE_OK)
        return KVEDGE_OK;
    for (uint32_t e = 0; e < edge_layers; e++)
        for (uint32_t c = 0; c < cloud_layers; c++) {
            const float *x = edge + (size_t)e * n * edge_hidden;
            const float *y = cloud + (size_t)c * n * cloud_hidden;
            double *ck = cka + (size_t)e * cloud_layers + c,
                   *rs = rsa + (size_t)e * cloud_layers + c;
            const kvedge_cka_args_t ca = {x, y, n, edge_hidden, cloud_hidden, ck};
            const kvedge_rsa_args_t ra = {x, y, n, edge_hidden, cloud_hidden, rs};
            int rc = kvedge_cpu_cka(&ca);
            if (rc == KVEDGE_OK)
                rc = kvedge_cpu_rsa(&ra);
            if (rc != KVEDGE_OK)
                return rc;
        }
    return KVEDGE_OK;
}

/* Bounded by strnlen: an id from a file need not be terminated within the limit. */
bool kvedge_layermap_id_ok(const char *id)
{
    size_t n = id ? strnlen(id, KVEDGE_LAYERMAP_ID_MAX_BYTES + 1) : 0;
    if (n == 0 || n > KVEDGE_LAYERMAP_ID_MAX_BYTES)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isgraph((unsigned char)id[i]))
            return false;
    return true;
}

/* Scores as the file keeps them: 6 decimals, so a map read back is the map written. */
static double s_round6(double x)
{
    return round(x * 1e6) / 1e6;
}

int kvedge_layermap_build(const kvedge_decoder_t *cloud, const char *cloud_id,
                          const kvedge_decoder_t *edge, const char *edge_id, const int32_t *tokens,
                          size_t ntokens, uint32_t samples, double cka_min, double rsa_min,
                          kvedge_layermap_t *map, double **cka_out, double **rsa_out)
{
    if (cka_out)
        *cka_out = NULL;
    if (rsa_out)
        *rsa_out = NULL;
    if (!cloud || !edge || !tokens || !map || !kvedge_layermap_id_ok(cloud_id) ||
        !kvedge_layermap_id_ok(edge_id) || !isfinite(cka_min) || !isfinite(rsa_min))
        return KVEDGE_EINVAL;
    memset(map, 0, sizeof *map);
    const kvedge_decoder_config_t *cc = kvedge_decoder_config(cloud),
                                  *ec = kvedge_decoder_config(edge);
    if (cc->layers == 0 || ec->layers == 0)
        return KVEDGE_EINVAL;
    if (cc->layers > KVEDGE_LAYERMAP_LAYERS_MAX || ec->layers > KVEDGE_LAYERMAP_LAYERS_MAX ||
        samples > KVEDGE_RSA_MAX_SAMPLES)
        return KVEDGE_ETOOBIG;
    if (samples < 3 || ntokens < samples)
        return KVEDGE_ETRUNCATED;
    uint32_t window = KVEDGE_LAYERMAP_WINDOW_TOKENS_MAX;
    window = cc->max_positions < window ? cc->max_positions : window;
    window = ec->max_positions < window ? ec->max_positions : window;

    const size_t pairs = (size_t)ec->layers * cc->layers;
    float *hc = malloc((size_t)cc->layers * samples * cc->hidden * sizeof(float));
    float *he = malloc((size_t)ec->layers * samples * ec->hidden * sizeof(float));
    double *cka = malloc(pairs * sizeof(double)), *rsa = malloc(pairs * sizeof(double));
    map->entry = calloc(ec->layers, sizeof *map->entry);
    int rc = hc && he && cka && rsa && map->entry ? KVEDGE_OK : KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK)
        rc = kvedge_layermap_collect(cloud, tokens, samples, window, hc);
    if (rc == KVEDGE_OK)
        rc = kvedge_layermap_collect(edge, tokens, samples, window, he);
    if (rc == KVEDGE_OK)
        rc = kvedge_layermap_scores(he, ec->layers, ec->hidden, hc, cc->layers, cc->hidden, samples,
                                    cka, rsa);
    free(hc);
    free(he);
    if (rc == KVEDGE_OK) {
        snprintf(map->cloud_id, sizeof map->cloud_id, "%s", cloud_id);
        snprintf(map->edge_id, sizeof map->edge_id, "%s", edge_id);
        map->cloud_layers = cc->layers;
        map->cloud_hidden = cc->hidden;
        map->edge_layers = ec->layers;
        map->edge_hidden = ec->hidden;
        map->samples = samples;
        map->cka_min = s_round6(cka_min);
        map->rsa_min = s_round6(rsa_min);
        for (uint32_t e = 0; e < ec->layers; e++) {
            const double *ck = cka + (size_t)e * cc->layers, *rs = rsa + (size_t)e * cc->layers;
            int32_t c = kvedge_layermap_select(ck, rs, cc->layers, map->cka_min, map->rsa_min,
                                               KVEDGE_LAYERMAP_NEAR_TIE);
            /* With none, the scores shown are those of the best-aligned layer, thresholds aside. */
            int32_t shown =
                c != KVEDGE_LAYERMAP_NONE
                    ? c
                    : kvedge_layermap_select(ck, rs, cc->layers, -INFINITY, -INFINITY, 0.0);
            map->entry[e].cloud = c;
            map->entry[e].cka = s_round6(shown >= 0 ? ck[shown] : 0.0);
            map->entry[e].rsa = s_round6(shown >= 0 ? rs[shown] : 0.0);
        }
    }
    if (rc == KVEDGE_OK && cka_out) {
        *cka_out = cka;
        cka = NULL;
    }
    if (rc == KVEDGE_OK && rsa_out) {
        *rsa_out = rsa;
        rsa = NULL;
    }
    free(cka);
    free(rsa);
    if (rc != KVEDGE_OK)
        kvedge_layermap_clear(map);
    return rc;
}

void kvedge_layermap_clear(kvedge_layermap_t *map)
{
    if (!map)
        return;
    free(map->entry);
    memset(map, 0, sizeof *map);
}

/* ---------------------------------------------------------------------------------------- */
/* The map file                                                                              */

static void s_why(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void s_why(char *why, size_t why_len, const char *fmt, ...)
{
    if (!why || why_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
}

int kvedge_layermap_pair_check(const char *cloud_id, const char *edge_id, uint32_t cloud_layers,
                               uint32_t edge_layers, char *why, size_t why_len)
{
    if (!kvedge_layermap_id_ok(cloud_id) || !kvedge_layermap_id_ok(edge_id)) {
        s_why(why, why_len, "a model id is empty, over %u bytes or not one printable word",
              KVEDGE_LAYERMAP_ID_MAX_BYTES);
        return KVEDGE_ECORRUPT;
    }
    if (cloud_layers == 0 || cloud_layers > KVEDGE_LAYERMAP_LAYERS_MAX || edge_layers == 0 ||
        edge_layers > KVEDGE_LAYERMAP_LAYERS_MAX) {
        s_why(why, why_len, "layer counts must be 1..%u", KVEDGE_LAYERMAP_LAYERS_MAX);
        return KVEDGE_ECORRUPT;
    }
    return KVEDGE_OK;
}

/* The map's header fields; 0 or KVEDGE_ECORRUPT with why. */
static int s_check_head(const kvedge_layermap_t *m, char *why, size_t why_len)
{
    int rc = kvedge_layermap_pair_check(m->cloud_id, m->edge_id, m->cloud_layers, m->edge_layers,
                                        why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    if (m->cloud_hidden == 0 || m->cloud_hidden > S_HIDDEN_MAX || m->edge_hidden == 0 ||
        m->edge_hidden > S_HIDDEN_MAX) {
        s_why(why, why_len, "hidden sizes must be 1..%u", S_HIDDEN_MAX);
        return KVEDGE_ECORRUPT;
    }
    if (m->samples < 3 || m->samples > KVEDGE_RSA_MAX_SAMPLES) {
        s_why(why, why_len, "samples must be 3..%u", KVEDGE_RSA_MAX_SAMPLES);
        return KVEDGE_ECORRUPT;
    }
    if (!(m->cka_min >= 0 && m->cka_min <= 1) || !(m->rsa_min >= -1 && m->rsa_min <= 1)) {
        s_why(why, why_len, "thresholds must be CKA in [0, 1], RSA in [-1, 1]");
        return KVEDGE_ECORRUPT;
    }
    return KVEDGE_OK;
}

/* One entry; 0 or KVEDGE_ECORRUPT with why. */
static int s_check_entry(const kvedge_layermap_t *m, uint32_t e, char *why, size_t why_len)
{
    const kvedge_layermap_entry_t *x = &m->entry[e];
    if (x->cloud != KVEDGE_LAYERMAP_NONE &&
        (x->cloud < 0 || (uint32_t)x->cloud >= m->cloud_layers)) {
        s_why(why, why_len, "edge layer %u: cloud layer %d out of range 0..%u", e, x->cloud,
              m->cloud_layers - 1);
        return KVEDGE_ECORRUPT;
    }
    if (!(x->cka >= 0 && x->cka <= 1) || !(x->rsa >= -1 && x->rsa <= 1)) {
        s_why(why, why_len, "edge layer %u: scores must be finite, CKA in [0, 1], RSA in [-1, 1]",
              e);
        return KVEDGE_ECORRUPT;
    }
    if (x->cloud != KVEDGE_LAYERMAP_NONE && (x->cka < m->cka_min || x->rsa < m->rsa_min)) {
        s_why(why, why_len, "edge layer %u: cloud layer %d is below the thresholds", e, x->cloud);
        return KVEDGE_ECORRUPT;
    }
    return KVEDGE_OK;
}

int kvedge_layermap_check(const kvedge_layermap_t *map, char *why, size_t why_len)
{
    if (!map || (map->edge_layers && !map->entry))
        return KVEDGE_EINVAL;
    int rc = s_check_head(map, why, why_len);
    for (uint32_t e = 0; rc == KVEDGE_OK && e < map->edge_layers; e++)
        rc = s_check_entry(map, e, why, why_len);
    return rc;
}

int kvedge_layermap_write(FILE *f, const kvedge_layermap_t *map)
{
    int rc = kvedge_layermap_check(map, NULL, 0);
    if (rc != KVEDGE_OK)
        return rc;
    fprintf(f, "%s %d\n", S_MAGIC, S_VERSION);
    fprintf(f, "cloud %s %u %u\n", map->cloud_id, map->cloud_layers, map->cloud_hidden);
    fprintf(f, "edge %s %u %u\n", map->edge_id, map->edge_layers, map->edge_hidden);
    fprintf(f, "samples %u\n", map->samples);
    fprintf(f, "thresholds %.6f %.6f\n", map->cka_min, map->rsa_min);
    for (uint32_t e = 0; e < map->edge_layers; e++) {
        const kvedge_layermap_entry_t *x = &map->entry[e];
        if (x->cloud == KVEDGE_LAYERMAP_NONE)
            fprintf(f, "layer %u none %.6f %.6f\n", e, x->cka, x->rsa);
        else
            fprintf(f, "layer %u %d %.6f %.6f\n", e, x->cloud, x->cka, x->rsa);
    }
    fprintf(f, "end\n");
    return fflush(f) == 0 && !ferror(f) ? KVEDGE_OK : KVEDGE_EIO;
}

int kvedge_layermap_save(const char *path, const kvedge_layermap_t *map)
{
    if (!path || !*path)
        return KVEDGE_EINVAL;
    int rc = kvedge_layermap_check(map, NULL, 0);
    if (rc != KVEDGE_OK)
        return rc;
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (!tmp)
        return KVEDGE_ENOMEM;
    snprintf(tmp, n, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    rc = f ? kvedge_layermap_write(f, map) : KVEDGE_EIO;
    int e = errno;
    if (f && fclose(f) != 0 && rc == KVEDGE_OK) {
        rc = KVEDGE_EIO;
        e = errno;
    }
    if (rc == KVEDGE_OK && rename(tmp, path) != 0) {
        rc = KVEDGE_EIO;
        e = errno;
    }
    if (rc != KVEDGE_OK && f)
        unlink(tmp);
    free(tmp);
    errno = e;
    return rc;
}

/* Splits line (no newline) at single spaces into at most max fields; returns the count, or
 * -1 for an empty field (two spaces, a leading or trailing space) or too many fields. */
static int s_fields(char *line, char **field, int max)
{
    int n = 0;
    char *p = line;
    for (;;) {
        char *sp = strchr(p, ' ');
        if (sp)
            *sp = '\0';
        if (!*p || n == max)
            return -1;
        field[n++] = p;
        if (!sp)
            return n;
        p = sp + 1;
    }
}

/* A decimal integer in [min, max], all of s. */
static bool s_u32(const char *s, uint32_t min, uint32_t max, uint32_t *out)
{
    if (!isdigit((unsigned char)s[0]) || (s[0] == '0' && s[1]))
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return false;
    *out = (uint32_t)v;
    return true;
}

/* A finite decimal number, all of s (no hex, inf or nan). */
static bool s_num(const char *s, double *out)
{
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p) && *p != '.' && *p != '-' && *p != '+' && *p != 'e' &&
            *p != 'E')
            return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (!*s || errno || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

typedef struct {
    FILE *f;
    const char *path;
    unsigned line;
    char buf[KVEDGE_LAYERMAP_LINE_MAX_BYTES + 2];
    char *why;
    size_t why_len;
} s_reader_t;

/* The next line without its newline: 1, 0 at the end of the file, or -1 with why set (too
 * long, a NUL or CR in it, a read error). */
static int s_next(s_reader_t *r)
{
    if (!fgets(r->buf, sizeof r->buf, r->f)) {
        if (ferror(r->f)) {
            s_why(r->why, r->why_len, "%s:%u: read error: %s", r->path, r->line + 1,
                  strerror(errno));
            return -1;
        }
        return 0;
    }
    r->line++;
    size_t n = strlen(r->buf);
    if (n && r->buf[n - 1] == '\n')
        r->buf[--n] = '\0';
    else if (!feof(r->f)) {
        s_why(r->why, r->why_len, "%s:%u: line over %u bytes", r->path, r->line,
              KVEDGE_LAYERMAP_LINE_MAX_BYTES);
        return -1;
    }
    if (n == 0 || strchr(r->buf, '\r')) {
        s_why(r->why, r->why_len, "%s:%u: %s", r->path, r->line,
              n == 0 ? "empty line" : "a CR in the line");
        return -1;
    }
    return 1;
}

/* Reads the next line into fields, expecting keyword and exactly want fields. */
static int s_expect(s_reader_t *r, const char *keyword, char **field, int want)
{
    field[0] = "";
    int got = s_next(r);
    if (got < 0)
        return KVEDGE_ECORRUPT;
    if (got == 0) {
        s_why(r->why, r->why_len, "%s:%u: truncated: expected '%s'", r->path, r->line + 1, keyword);
        return KVEDGE_ETRUNCATED;
    }
    int n = s_fields(r->buf, field, 8);
    if (n < 0) {
        s_why(r->why, r->why_len, "%s:%u: malformed line: fields are separated by one space",
              r->path, r->line);
        return KVEDGE_ECORRUPT;
    }
    if (strcmp(field[0], keyword) != 0) {
        s_why(r->why, r->why_len, "%s:%u: expected '%s'", r->path, r->line, keyword);
        return KVEDGE_ECORRUPT;
    }
    if (n != want) {
        s_why(r->why, r->why_len, "%s:%u: '%s' takes %d fields, found %d", r->path, r->line,
              keyword, want - 1, n - 1);
        return KVEDGE_ECORRUPT;
    }
    return KVEDGE_OK;
}

static int s_bad(s_reader_t *r, const char *what)
{
    s_why(r->why, r->why_len, "%s:%u: %s", r->path, r->line, what);
    return KVEDGE_ECORRUPT;
}

/* "cloud|edge ID LAYERS HIDDEN". */
static int s_read_model(s_reader_t *r, const char *side, char *id, uint32_t *layers,
                        uint32_t *hidden)
{
    char *f[8];
    int rc = s_expect(r, side, f, 4);
    if (rc != KVEDGE_OK)
        return rc;
    if (!kvedge_layermap_id_ok(f[1]))
        return s_bad(r, "bad model id");
    snprintf(id, KVEDGE_LAYERMAP_ID_MAX_BYTES + 1, "%s", f[1]);
    if (!s_u32(f[2], 1, KVEDGE_LAYERMAP_LAYERS_MAX, layers))
        return s_bad(r, "layer count out of range 1..1024");
    if (!s_u32(f[3], 1, S_HIDDEN_MAX, hidden))
        return s_bad(r, "hidden size out of range 1..16777216");
    return KVEDGE_OK;
}

static int s_read(s_reader_t *r, kvedge_layermap_t *m)
{
    char *f[8];
    int rc = s_expect(r, S_MAGIC, f, 2);
    uint32_t v;
    if (rc != KVEDGE_OK)
        return rc;
    if (!s_u32(f[1], 0, UINT32_MAX, &v))
        return s_bad(r, "bad format version");
    if (v != S_VERSION) {
        s_why(r->why, r->why_len, "%s:%u: format version %u, this reader knows %d", r->path,
              r->line, v, S_VERSION);
        return KVEDGE_EVERSION;
    }
    rc = s_read_model(r, "cloud", m->cloud_id, &m->cloud_layers, &m->cloud_hidden);
    if (rc == KVEDGE_OK)
        rc = s_read_model(r, "edge", m->edge_id, &m->edge_layers, &m->edge_hidden);
    if (rc == KVEDGE_OK && (rc = s_expect(r, "samples", f, 2)) == KVEDGE_OK &&
        !s_u32(f[1], 3, KVEDGE_RSA_MAX_SAMPLES, &m->samples))
        rc = s_bad(r, "samples out of range 3..16384");
    if (rc == KVEDGE_OK && (rc = s_expect(r, "thresholds", f, 3)) == KVEDGE_OK &&
        (!s_num(f[1], &m->cka_min) || !s_num(f[2], &m->rsa_min) ||
         s_check_head(m, NULL, 0) != KVEDGE_OK))
        rc = s_bad(r, "thresholds must be numbers, CKA in [0, 1], RSA in [-1, 1]");
    if (rc != KVEDGE_OK)
        return rc;
    m->entry = calloc(m->edge_layers, sizeof *m->entry);
    if (!m->entry)
        return KVEDGE_ENOMEM;
    for (uint32_t e = 0; e < m->edge_layers; e++) {
        rc = s_expect(r, "layer", f, 5);
        if (rc == KVEDGE_ECORRUPT && strcmp(f[0], "end") == 0) {
            s_why(r->why, r->why_len, "%s:%u: truncated: %u of %u edge layers", r->path, r->line, e,
                  m->edge_layers);
            return KVEDGE_ETRUNCATED;
        }
        if (rc != KVEDGE_OK)
            return rc;
        uint32_t le, c;
        if (!s_u32(f[1], 0, KVEDGE_LAYERMAP_LAYERS_MAX, &le))
            return s_bad(r, "bad edge layer number");
        if (le < e)
            return s_bad(r, "edge layer listed twice");
        if (le != e)
            return s_bad(r, le >= m->edge_layers ? "edge layer out of range"
                                                 : "edge layers out of order (one is missing)");
        kvedge_layermap_entry_t *x = &m->entry[e];
        if (strcmp(f[2], "none") == 0)
            x->cloud = KVEDGE_LAYERMAP_NONE;
        else if (s_u32(f[2], 0, m->cloud_layers - 1, &c))
            x->cloud = (int32_t)c;
        else
            return s_bad(r, "cloud layer out of range (or not a number or 'none')");
        if (!s_num(f[3], &x->cka) || !s_num(f[4], &x->rsa))
            return s_bad(r, "scores must be finite decimal numbers");
        char why[KVEDGE_LAYERMAP_WHY_BYTES];
        if (s_check_entry(m, e, why, sizeof why) != KVEDGE_OK)
            return s_bad(r, why);
    }
    rc = s_expect(r, "end", f, 1);
    if (rc == KVEDGE_ECORRUPT && strcmp(f[0], "layer") == 0)
        return s_bad(r, "more layer lines than edge layers (a duplicate?)");
    if (rc != KVEDGE_OK)
        return rc;
    int more = s_next(r);
    if (more != 0)
        return more < 0 ? KVEDGE_ECORRUPT : s_bad(r, "text after 'end'");
    return KVEDGE_OK;
}

int kvedge_layermap_read(const char *path, kvedge_layermap_t *map, char *why, size_t why_len)
{
    if (why && why_len)
        why[0] = '\0';
    if (!path || !map)
        return KVEDGE_EINVAL;
    memset(map, 0, sizeof *map);
    s_reader_t r = {.path = path, .why = why, .why_len = why_len};
    r.f = fopen(path, "r");
    if (!r.f) {
        int e = errno;
        s_why(why, why_len, "%s: %s", path, strerror(e));
        errno = e;
        return KVEDGE_EIO;
    }
    int rc = s_read(&r, map);
    fclose(r.f);
    if (rc != KVEDGE_OK)
        kvedge_layermap_clear(map);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Printing                                                                                  */

static void s_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void s_json_matrix(FILE *f, const char *name, const double *m, uint32_t rows, uint32_t cols)
{
    fprintf(f, ",\"%s\":[", name);
    for (uint32_t r = 0; r < rows; r++) {
        fprintf(f, "%s[", r ? "," : "");
        for (uint32_t c = 0; c < cols; c++)
            fprintf(f, "%s%.6f", c ? "," : "", m[(size_t)r * cols + c]);
        fputc(']', f);
    }
    fputc(']', f);
}

int kvedge_layermap_print(FILE *f, const kvedge_layermap_t *map, bool json, const double *cka,
                          const double *rsa)
{
    if (!f || !map || (map->edge_layers && !map->entry))
        return KVEDGE_EINVAL;
    if (json) {
        fputs("{\"cloud\":{\"id\":", f);
        s_json_str(f, map->cloud_id);
        fprintf(f, ",\"layers\":%u,\"hidden\":%u},\"edge\":{\"id\":", map->cloud_layers,
                map->cloud_hidden);
        s_json_str(f, map->edge_id);
        fprintf(f,
                ",\"layers\":%u,\"hidden\":%u},\"samples\":%u,\"cka_min\":%.6f,"
                "\"rsa_min\":%.6f,\"map\":[",
                map->edge_layers, map->edge_hidden, map->samples, map->cka_min, map->rsa_min);
        for (uint32_t e = 0; e < map->edge_layers; e++) {
            const kvedge_layermap_entry_t *x = &map->entry[e];
            fprintf(f, "%s{\"edge\":%u,\"cloud\":", e ? "," : "", e);
            if (x->cloud == KVEDGE_LAYERMAP_NONE)
                fputs("null", f);
            else
                fprintf(f, "%d", x->cloud);
            fprintf(f, ",\"cka\":%.6f,\"rsa\":%.6f}", x->cka, x->rsa);
        }
        fputc(']', f);
        if (cka)
            s_json_matrix(f, "cka", cka, map->edge_layers, map->cloud_layers);
        if (rsa)
            s_json_matrix(f, "rsa", rsa, map->edge_layers, map->cloud_layers);
        fputs("}\n", f);
    } else {
        fprintf(f, "cloud %s: %u layers x %u; edge %s: %u layers x %u; %u samples\n", map->cloud_id,
                map->cloud_layers, map->cloud_hidden, map->edge_id, map->edge_layers,
                map->edge_hidden, map->samples);
        fprintf(f, "rule: CKA >= %.3f and RSA >= %.3f, best (CKA+RSA)/2, shallower within %.2f\n",
                map->cka_min, map->rsa_min, KVEDGE_LAYERMAP_NEAR_TIE);
        fprintf(f, "%-10s %-11s %-8s %s\n", "edge", "cloud", "CKA", "RSA");
        for (uint32_t e = 0; e < map->edge_layers; e++) {
            const kvedge_layermap_entry_t *x = &map->entry[e];
            char c[16];
            if (x->cloud == KVEDGE_LAYERMAP_NONE)
                snprintf(c, sizeof c, "none");
            else
                snprintf(c, sizeof c, "%d", x->cloud);
            fprintf(f, "%-10u %-11s %-8.4f %.4f%s\n", e, c, x->cka, x->rsa,
                    x->cloud == KVEDGE_LAYERMAP_NONE ? " (best, below thresholds)" : "");
        }
        if (cka && rsa) {
            for (int k = 0; k < 2; k++) {
                const double *m = k ? rsa : cka;
                fprintf(f, "\n%s  edge\\cloud", k ? "RSA" : "CKA");
                for (uint32_t c = 0; c < map->cloud_layers; c++)
                    fprintf(f, " %6u", c);
                fputc('\n', f);
                for (uint32_t e = 0; e < map->edge_layers; e++) {
                    fprintf(f, "%15u", e);
                    for (uint32_t c = 0; c < map->cloud_layers; c++)
                        fprintf(f, " %6.3f", m[(size_t)e * map->cloud_layers + c]);
                    fputc('\n', f);
                }
            }
        }
    }
    return fflush(f) == 0 && !ferror(f) ? KVEDGE_OK : KVEDGE_EIO;
}

int kvedge_layermap_to_master(const kvedge_layermap_t *map, kvedge_master_map_t *out, char *why,
                              size_t why_len)
{
    if (!out)
        return KVEDGE_EINVAL;
    memset(out, 0, sizeof *out);
    int rc = kvedge_layermap_check(map, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    if (map->cloud_layers > KVEDGE_MODEL_MAX_LAYERS || map->edge_layers > KVEDGE_MODEL_MAX_LAYERS) {
        if (why && why_len)
            snprintf(why, why_len, "over %u layers: no registry record holds it",
                     KVEDGE_MODEL_MAX_LAYERS);
        return KVEDGE_ETOOBIG;
    }
    out->cloud_layers = (uint16_t)map->cloud_layers;
    out->edge_layers = (uint16_t)map->edge_layers;
    for (uint32_t e = 0; e < map->edge_layers; e++)
        out->from[e] = map->entry[e].cloud == KVEDGE_LAYERMAP_NONE ? KVEDGE_MASTER_MAP_NONE
                                                                   : (uint16_t)map->entry[e].cloud;
    return KVEDGE_OK;
}
