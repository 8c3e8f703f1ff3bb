/* Metrics registry and Prometheus text exposition (see metrics.h): families under a registry
 * mutex, series under their family's mutex, values in relaxed atomics. */
#include "monitor/metrics.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_COLLECT_MAX    8  /* on_collect hooks per registry */
#define S_CACHE_LINE     64 /* series are aligned to it so threads on two series never share */
#define S_NUM_BYTES      32 /* a formatted number, NUL included */
#define S_INDEX_MIN      16 /* first size of a family's series index */
#define S_SERIES_CAP_MIN 8  /* first size of a family's series array */

const kvedge_histogram_spec_t kvedge_histogram_latency_us = {10, 23, 1e-6};
const kvedge_histogram_spec_t kvedge_histogram_bytes = {64, 27, 1.0};

struct kvedge_series_t {
    _Atomic uint64_t value; /* counter: the count; gauge: the bits of a double */
    _Atomic uint64_t sum;   /* histogram: sum of observations, in the family's unit */
    uint32_t type;          /* the family's, copied for the hot path */
    uint32_t buckets;       /* the family's finite buckets (histograms) */
    uint64_t first_le;      /* the family's first bound (histograms) */
    uint64_t hash;          /* of the label values, for the family's index */
    char *values[KVEDGE_METRICS_MAX_LABELS]; /* label values (cut, valid UTF-8), in labels */
    char *labels;                            /* one allocation holding the values */
    _Atomic uint64_t bucket[]; /* histogram: [buckets + 1] counts per bucket, last +Inf */
};

struct kvedge_metric_t {
    kvedge_metric_type_t type;
    char *name;
    char *help;
    size_t n_labels;
    char *labels[KVEDGE_METRICS_MAX_LABELS];
    kvedge_histogram_spec_t hist; /* histograms only */
    char (*le)[S_NUM_BYTES];      /* [hist.buckets] bounds as exposed */
    size_t max_series;            /* bound on label sets (labelled families) */
    pthread_mutex_t mu;           /* guards everything below */
    kvedge_series_t **series;     /* [cap_series] in creation order */
    size_t n_series;              /* live: series[0 … n_series) */
    size_t n_made;                /* allocated: series[n_series … n_made) wait for reuse */
    size_t cap_series;
    uint32_t *index;      /* [index_mask + 1] series position + 1 by hash; 0 = empty */
    size_t index_mask;    /* index size - 1; size is a power of two > 2 * n_series */
    kvedge_series_t *ovf; /* overflow series (labelled families) */
    bool ovf_used;        /* handed out at least once: rendered from then on */
};

typedef struct {
    kvedge_metrics_collect_fn fn;
    void *arg;
} s_collect_t;

struct kvedge_metrics_t {
    pthread_mutex_t mu; /* guards everything below */
    kvedge_metric_t *families[KVEDGE_METRICS_MAX_FAMILIES];
    size_t n_families;
    s_collect_t collect[S_COLLECT_MAX];
    size_t n_collect;
};

/* A growing output buffer; oom sticks once an allocation failed. */
typedef struct {
    char *p;
    size_t len;
    size_t cap;
    bool oom;
} s_buf_t;

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

/* ---- names and label values ---- */

static bool s_valid_name(const char *s)
{
    if (!s || !*s)
        return false;
    for (size_t i = 0; s[i]; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                  (i > 0 && c >= '0' && c <= '9');
        if (!ok)
            return false;
    }
    return true;
}

static bool s_valid_label(const char *s)
{
    if (!s_valid_name(s) || strchr(s, ':'))
        return false;
    return strncmp(s, "__", 2) != 0 && strcmp(s, "le") != 0;
}

/* Length of the valid UTF-8 sequence at p (1 … 4), or 0 when p does not start one
 * (stray continuation, overlong form, surrogate, beyond U+10FFFF, cut short). */
static size_t s_utf8_len(const unsigned char *p)
{
    unsigned c = p[0];
    if (c < 0x80)
        return 1;
    size_t n;
    unsigned min;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
        n = 3;
        min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        min = 0x10000;
    } else {
        return 0;
    }
    unsigned cp = c & (0x3f >> (n - 1));
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

/* Copies a label value into out (KVEDGE_METRICS_LABEL_VALUE_MAX + 1 bytes): cut at the bound
 * on a character boundary, each byte that is not valid UTF-8 written as '?' (the exposition
 * format carries UTF-8 only). NULL reads as "". */
static void s_clean_value(const char *value, char *out)
{
    size_t o = 0;
    const unsigned char *p = (const unsigned char *)(value ? value : "");
    while (*p) {
        size_t n = s_utf8_len(p);
        if (o + (n ? n : 1) > KVEDGE_METRICS_LABEL_VALUE_MAX)
            break;
        if (n == 0) {
            out[o++] = '?';
            p++;
        } else {
            memcpy(out + o, p, n);
            o += n;
            p += n;
        }
    }
    out[o] = '\0';
}

static uint64_t s_hash_values(char (*v)[KVEDGE_METRICS_LABEL_VALUE_MAX + 1], size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        for (const unsigned char *p = (const unsigned char *)v[i]; *p; p++)
            h = (h ^ *p) * 1099511628211ull;
        h = (h ^ 0xff) * 1099511628211ull; /* 0xff never occurs in UTF-8: a separator */
    }
    return h ^ (h >> 29);
}

size_t kvedge_metrics_escape_label(const char *value, char *out, size_t cap)
{
    if (!out || cap == 0)
        return 0;
    size_t o = 0;
    for (const char *p = value ? value : ""; *p; p++) {
        const char *e = NULL;
        if (*p == '\\')
            e = "\\\\";
        else if (*p == '"')
            e = "\\\"";
        else if (*p == '\n')
            e = "\\n";
        size_t n = e ? 2 : 1;
        if (o + n >= cap)
            break;
        if (e) {
            out[o++] = e[0];
            out[o++] = e[1];
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
    return o;
}

/* ---- numbers ---- */

/* The shortest of %.15g, %.16g and %.17g that reads back as v; NaN and infinities spelt as
 * the exposition format does. */
static void s_fmt_double(double v, char out[S_NUM_BYTES])
{
    if (isnan(v)) {
        strcpy(out, "NaN");
        return;
    }
    if (isinf(v)) {
        strcpy(out, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(out, S_NUM_BYTES, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

/* A value in the family's unit as exposed: divided by 1/scale when that is a whole number
 * (1e-6 → ÷ 1e6 gives 123 µs as exactly 0.000123), else multiplied. */
static double s_scaled(const kvedge_histogram_spec_t *spec, double x)
{
    double inv = 1.0 / spec->scale;
    double r = round(inv);
    if (r >= 2 && r < 1e18 && fabs(inv - r) <= 1e-9 * r)
        return x / r;
    return x * spec->scale;
}

static bool s_spec_ok(const kvedge_histogram_spec_t *spec)
{
    return spec && spec->first_le >= 1 && spec->buckets >= 1 &&
           spec->buckets <= KVEDGE_METRICS_MAX_BUCKETS && isfinite(spec->scale) &&
           spec->scale > 0 && spec->first_le <= (UINT64_MAX >> (spec->buckets - 1));
}

/* The bucket of v: the first i with v <= first_le << i, or buckets for +Inf. With
 * q = (v - 1) / first_le, first_le << i >= v exactly when 2^i > q: i is q's bit length. */
static inline uint32_t s_bucket_of(uint64_t first_le, uint32_t buckets, uint64_t v)
{
    if (v <= first_le)
        return 0;
    uint64_t q = (v - 1) / first_le;
    uint32_t i = 64u - (uint32_t)__builtin_clzll(q);
    return i < buckets ? i : buckets;
}

/* ---- updates ---- */

static double s_bits_to_double(uint64_t b)
{
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static uint64_t s_double_to_bits(double d)
{
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

/* inc and add count on counters and add to gauges; set and gauge_add act on gauges only;
 * observe on histograms only. Anything else is ignored: a type mix-up is a bug, not a crash. */
void kvedge_series_inc(kvedge_series_t *s)
{
    kvedge_series_add(s, 1);
}

void kvedge_series_add(kvedge_series_t *s, uint64_t v)
{
    if (!s)
        return;
    if (s->type == KVEDGE_METRIC_COUNTER)
        atomic_fetch_add_explicit(&s->value, v, memory_order_relaxed);
    else if (s->type == KVEDGE_METRIC_GAUGE)
        kvedge_series_gauge_add(s, (double)v);
}

void kvedge_series_set(kvedge_series_t *s, double v)
{
    if (s && s->type == KVEDGE_METRIC_GAUGE)
        atomic_store_explicit(&s->value, s_double_to_bits(v), memory_order_relaxed);
}

void kvedge_series_gauge_add(kvedge_series_t *s, double delta)
{
    if (!s || s->type != KVEDGE_METRIC_GAUGE)
        return;
    uint64_t old = atomic_load_explicit(&s->value, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&s->value, &old,
                                                  s_double_to_bits(s_bits_to_double(old) + delta),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

void kvedge_series_observe(kvedge_series_t *s, uint64_t v)
{
    if (!s || s->type != KVEDGE_METRIC_HISTOGRAM)
        return;
    atomic_fetch_add_explicit(&s->bucket[s_bucket_of(s->first_le, s->buckets, v)], 1,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&s->sum, v, memory_order_relaxed);
}

/* ---- reads ---- */

double kvedge_series_value(const kvedge_series_t *s)
{
    if (!s)
        return 0;
    /* The atomics are read through a cast: a const series is still updated by others. */
    kvedge_series_t *w = (kvedge_series_t *)s;
    if (s->type == KVEDGE_METRIC_COUNTER)
        return (double)atomic_load_explicit(&w->value, memory_order_relaxed);
    if (s->type == KVEDGE_METRIC_GAUGE)
        return s_bits_to_double(atomic_load_explicit(&w->value, memory_order_relaxed));
    return (double)kvedge_series_hist(s, NULL, NULL, 0);
}

/* The count is the sum of the bucket counts, so the +Inf bucket and _count always agree even
 * while other threads observe. */
uint64_t kvedge_series_hist(const kvedge_series_t *s, uint64_t *sum, uint64_t *bucket_counts,
                            size_t n)
{
    if (sum)
        *sum = 0;
    if (!s || s->type != KVEDGE_METRIC_HISTOGRAM) {
        for (size_t i = 0; bucket_counts && i < n; i++)
            bucket_counts[i] = 0;
        return 0;
    }
    kvedge_series_t *w = (kvedge_series_t *)s;
    uint64_t cum = 0;
    for (uint32_t i = 0; i <= s->buckets; i++) {
        cum += atomic_load_explicit(&w->bucket[i], memory_order_relaxed);
        if (bucket_counts && i < n && i < s->buckets)
            bucket_counts[i] = cum;
    }
    for (size_t i = s->buckets; bucket_counts && i < n; i++)
        bucket_counts[i] = cum;
    if (sum)
        *sum = atomic_load_explicit(&w->sum, memory_order_relaxed);
    return cum;
}

double kvedge_histogram_quantile(const kvedge_histogram_spec_t *spec, const uint64_t *cumulative,
                                 uint64_t count, double q)
{
    if (!s_spec_ok(spec) || !cumulative || count == 0 || isnan(q))
        return 0;
    if (q < 0)
        q = 0;
    if (q > 1)
        q = 1;
    double rank = q * (double)count;
    /* The first bucket holding the rank (and, for rank 0, the first one not empty). */
    uint32_t b = 0;
    while (b < spec->buckets && ((double)cumulative[b] < rank || cumulative[b] == 0))
        b++;
    if (b == spec->buckets)
        return (double)(spec->first_le << (spec->buckets - 1));
    double lo = b ? (double)(spec->first_le << (b - 1)) : 0;
    double hi = (double)(spec->first_le << b);
    double below = b ? (double)cumulative[b - 1] : 0;
    double in = (double)cumulative[b] - below;
    return lo + (hi - lo) * ((rank - below) / in);
}

/* ---- registry and families ---- */

kvedge_metrics_t *kvedge_metrics_new(void)
{
    kvedge_metrics_t *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    if (pthread_mutex_init(&r->mu, NULL) != 0) {
        free(r);
        return NULL;
    }
    return r;
}

static void s_series_free(kvedge_series_t *s)
{
    if (!s)
        return;
    free(s->labels);
    free(s);
}

static void s_family_free(kvedge_metric_t *m)
{
    if (!m)
        return;
    for (size_t i = m->n_made; i-- > 0;)
        s_series_free(m->series[i]);
    s_series_free(m->ovf);
    free(m->series);
    free(m->index);
    free(m->le);
    for (size_t i = m->n_labels; i-- > 0;)
        free(m->labels[i]);
    free(m->help);
    free(m->name);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void kvedge_metrics_destroy(kvedge_metrics_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_metrics_t *r = *self_p;
    for (size_t i = r->n_families; i-- > 0;)
        s_family_free(r->families[i]);
    pthread_mutex_destroy(&r->mu);
    free(r);
    *self_p = NULL;
}

/* Zeroes a series' values. */
static void s_series_zero(kvedge_series_t *s)
{
    atomic_store_explicit(&s->value, 0, memory_order_relaxed);
    atomic_store_explicit(&s->sum, 0, memory_order_relaxed);
    for (uint32_t i = 0; s->type == KVEDGE_METRIC_HISTOGRAM && i <= s->buckets; i++)
        atomic_store_explicit(&s->bucket[i], 0, memory_order_relaxed);
}

/* Gives series s of family m the label values (clean) and their hash. False when out of
 * memory (s unchanged). */
static bool s_series_label(const kvedge_metric_t *m, kvedge_series_t *s,
                           char (*values)[KVEDGE_METRICS_LABEL_VALUE_MAX + 1], uint64_t hash)
{
    size_t total = 0;
    for (size_t i = 0; i < m->n_labels; i++)
        total += strlen(values[i]) + 1;
    char *p = NULL;
    if (total && !(p = malloc(total)))
        return false;
    free(s->labels);
    s->labels = p;
    for (size_t i = 0; i < m->n_labels; i++) {
        size_t n = strlen(values[i]) + 1;
        memcpy(p, values[i], n);
        s->values[i] = p;
        p += n;
    }
    s->hash = hash;
    return true;
}

/* A new series of family m with the given (clean) values. NULL when out of memory. */
static kvedge_series_t *s_series_new(const kvedge_metric_t *m,
                                     char (*values)[KVEDGE_METRICS_LABEL_VALUE_MAX + 1],
                                     uint64_t hash)
{
    size_t nb = m->type == KVEDGE_METRIC_HISTOGRAM ? (size_t)m->hist.buckets + 1 : 0;
    size_t size = sizeof(kvedge_series_t) + nb * sizeof(_Atomic uint64_t);
    size = (size + S_CACHE_LINE - 1) / S_CACHE_LINE * S_CACHE_LINE;
    kvedge_series_t *s = aligned_alloc(S_CACHE_LINE, size);
    if (!s)
        return NULL;
    memset(s, 0, size);
    s->type = (uint32_t)m->type;
    s->buckets = m->hist.buckets;
    s->first_le = m->hist.first_le;
    atomic_init(&s->value, 0);
    atomic_init(&s->sum, 0);
    for (size_t i = 0; i < nb; i++)
        atomic_init(&s->bucket[i], 0);
    if (!s_series_label(m, s, values, hash)) {
        free(s);
        return NULL;
    }
    return s;
}

/* True when a + sa and b + sb spell the same string. */
static bool s_cat_eq(const char *a, const char *sa, const char *b, const char *sb)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la + strlen(sa) != lb + strlen(sb))
        return false;
    size_t n = la + strlen(sa);
    for (size_t i = 0; i < n; i++) {
        char ca = i < la ? a[i] : sa[i - la];
        char cb = i < lb ? b[i] : sb[i - lb];
        if (ca != cb)
            return false;
    }
    return true;
}

/* True when a family (type, name) and family m would expose a sample name (or a HELP/TYPE
 * name) in common: "x" as a histogram also writes x_bucket, x_sum and x_count. */
static bool s_clash(kvedge_metric_type_t type, const char *name, const kvedge_metric_t *m)
{
    static const char *const hist_sfx[] = {"", "_bucket", "_sum", "_count"};
    static const char *const plain_sfx[] = {""};
    const char *const *sa = type == KVEDGE_METRIC_HISTOGRAM ? hist_sfx : plain_sfx;
    const char *const *sb = m->type == KVEDGE_METRIC_HISTOGRAM ? hist_sfx : plain_sfx;
    size_t na = type == KVEDGE_METRIC_HISTOGRAM ? 4 : 1;
    size_t nb = m->type == KVEDGE_METRIC_HISTOGRAM ? 4 : 1;
    for (size_t i = 0; i < na; i++)
        for (size_t j = 0; j < nb; j++)
            if (s_cat_eq(name, sa[i], m->name, sb[j]))
                return true;
    return false;
}

/* Checks a family's declaration; fills why and returns false when it is refused. Caller holds
 * r->mu (for the duplicate check). */
static bool s_family_ok(const kvedge_metrics_t *r, kvedge_metric_type_t type, const char *name,
                        const char *const *labels, size_t n_labels,
                        const kvedge_histogram_spec_t *hist, size_t max_series, char *why,
                        size_t why_len)
{
    if (type != KVEDGE_METRIC_COUNTER && type != KVEDGE_METRIC_GAUGE &&
        type != KVEDGE_METRIC_HISTOGRAM) {
        s_why(why, why_len, "unknown metric type %d", (int)type);
        return false;
    }
    if (!s_valid_name(name)) {
        s_why(why, why_len, "metric name \"%s\" is not [a-zA-Z_:][a-zA-Z0-9_:]*",
              name ? name : "(null)");
        return false;
    }
    size_t len = strlen(name);
    if (type == KVEDGE_METRIC_COUNTER && (len < 7 || strcmp(name + len - 6, "_total") != 0)) {
        s_why(why, why_len, "counter name \"%s\" does not end in _total", name);
        return false;
    }
    if (n_labels > KVEDGE_METRICS_MAX_LABELS) {
        s_why(why, why_len, "metric %s: %zu labels, at most %d", name, n_labels,
              KVEDGE_METRICS_MAX_LABELS);
        return false;
    }
    if (n_labels && !labels) {
        s_why(why, why_len, "metric %s: %zu labels but no label names", name, n_labels);
        return false;
    }
    for (size_t i = 0; i < n_labels; i++) {
        if (!s_valid_label(labels[i])) {
            s_why(why, why_len,
                  "metric %s: label name \"%s\" is not [a-zA-Z_][a-zA-Z0-9_]* or is reserved "
                  "(__*, le)",
                  name, labels[i] ? labels[i] : "(null)");
            return false;
        }
        for (size_t j = 0; j < i; j++) {
            if (strcmp(labels[i], labels[j]) == 0) {
                s_why(why, why_len, "metric %s: label \"%s\" named twice", name, labels[i]);
                return false;
            }
        }
    }
    if (n_labels && (max_series < 1 || max_series > KVEDGE_METRICS_MAX_SERIES)) {
        s_why(why, why_len, "metric %s: max_series %zu is not in 1 … %d", name, max_series,
              KVEDGE_METRICS_MAX_SERIES);
        return false;
    }
    if (type == KVEDGE_METRIC_HISTOGRAM && !s_spec_ok(hist)) {
        s_why(why, why_len,
              "metric %s: histogram layout needs first_le >= 1, 1 … %d buckets that fit in 64 "
              "bits and a finite scale > 0",
              name, KVEDGE_METRICS_MAX_BUCKETS);
        return false;
    }
    if (r->n_families >= KVEDGE_METRICS_MAX_FAMILIES) {
        s_why(why, why_len, "metric %s: the registry holds %d families already", name,
              KVEDGE_METRICS_MAX_FAMILIES);
        return false;
    }
    for (size_t i = 0; i < r->n_families; i++) {
        if (s_clash(type, name, r->families[i])) {
            s_why(why, why_len, "metric %s: clashes with metric %s declared before", name,
                  r->families[i]->name);
            return false;
        }
    }
    return true;
}

kvedge_metric_t *kvedge_metrics_family(kvedge_metrics_t *r, kvedge_metric_type_t type,
                                       const char *name, const char *help,
                                       const char *const *labels, size_t n_labels,
                                       const kvedge_histogram_spec_t *hist, size_t max_series,
                                       char *why, size_t why_len)
{
    if (!r) {
        s_why(why, why_len, "no registry");
        return NULL;
    }
    pthread_mutex_lock(&r->mu);
    if (!s_family_ok(r, type, name, labels, n_labels, hist, max_series, why, why_len)) {
        pthread_mutex_unlock(&r->mu);
        return NULL;
    }
    kvedge_metric_t *m = calloc(1, sizeof *m);
    if (!m || pthread_mutex_init(&m->mu, NULL) != 0) {
        free(m);
        pthread_mutex_unlock(&r->mu);
        s_why(why, why_len, "metric %s: out of memory", name);
        return NULL;
    }
    m->type = type;
    m->n_labels = n_labels;
    m->max_series = n_labels ? max_series : 1;
    m->name = strdup(name);
    m->help = strdup(help ? help : "");
    bool ok = m->name && m->help;
    for (size_t i = 0; ok && i < n_labels; i++)
        ok = (m->labels[i] = strdup(labels[i])) != NULL;
    if (ok && type == KVEDGE_METRIC_HISTOGRAM) {
        m->hist = *hist;
        char(*le)[S_NUM_BYTES] = calloc(hist->buckets, sizeof *le);
        if (le) {
            for (uint32_t i = 0; i < hist->buckets; i++)
                s_fmt_double(s_scaled(hist, (double)(hist->first_le << i)), le[i]);
        }
        m->le = le;
        ok = le != NULL;
    }
    char empty[KVEDGE_METRICS_MAX_LABELS][KVEDGE_METRICS_LABEL_VALUE_MAX + 1] = {{0}};
    char other[KVEDGE_METRICS_MAX_LABELS][KVEDGE_METRICS_LABEL_VALUE_MAX + 1];
    for (size_t i = 0; i < KVEDGE_METRICS_MAX_LABELS; i++)
        strcpy(other[i], KVEDGE_METRICS_OTHER);
    if (ok) {
        m->cap_series = n_labels ? S_SERIES_CAP_MIN : 1;
        m->series = calloc(m->cap_series, sizeof *m->series);
        ok = m->series != NULL;
    }
    if (ok && n_labels == 0) {
        ok = (m->series[0] = s_series_new(m, empty, 0)) != NULL;
        m->n_series = m->n_made = ok ? 1 : 0;
    } else if (ok) {
        m->index_mask = S_INDEX_MIN - 1;
        m->index = calloc(S_INDEX_MIN, sizeof *m->index);
        ok = m->index && (m->ovf = s_series_new(m, other, s_hash_values(other, n_labels)));
    }
    if (!ok) {
        s_family_free(m);
        pthread_mutex_unlock(&r->mu);
        s_why(why, why_len, "metric %s: out of memory", name);
        return NULL;
    }
    r->families[r->n_families++] = m;
    pthread_mutex_unlock(&r->mu);
    return m;
}

/* Puts series position pos into the index. Caller holds m->mu; the index has room. */
static void s_index_put(kvedge_metric_t *m, size_t pos)
{
    size_t i = m->series[pos]->hash & m->index_mask;
    while (m->index[i])
        i = (i + 1) & m->index_mask;
    m->index[i] = (uint32_t)pos + 1;
}

/* Makes room for one more series (array and index at most half full). Caller holds m->mu. */
static bool s_grow(kvedge_metric_t *m)
{
    if (m->n_series == m->cap_series) {
        size_t cap = m->cap_series * 2;
        kvedge_series_t **p = realloc(m->series, cap * sizeof *p);
        if (!p)
            return false;
        m->series = p;
        m->cap_series = cap;
    }
    if (2 * (m->n_series + 1) > m->index_mask + 1) {
        size_t size = 2 * (m->index_mask + 1);
        uint32_t *idx = calloc(size, sizeof *idx);
        if (!idx)
            return false;
        free(m->index);
        m->index = idx;
        m->index_mask = size - 1;
        for (size_t i = 0; i < m->n_series; i++)
            s_index_put(m, i);
    }
    return true;
}

kvedge_series_t *kvedge_metric_series(kvedge_metric_t *m, const char *const *values, size_t n)
{
    if (!m || n != m->n_labels)
        return NULL;
    if (n == 0)
        return m->series[0];
    char clean[KVEDGE_METRICS_MAX_LABELS][KVEDGE_METRICS_LABEL_VALUE_MAX + 1];
    bool all_other = true;
    for (size_t i = 0; i < n; i++) {
        s_clean_value(values ? values[i] : NULL, clean[i]);
        all_other = all_other && strcmp(clean[i], KVEDGE_METRICS_OTHER) == 0;
    }
    uint64_t hash = s_hash_values(clean, n);
    pthread_mutex_lock(&m->mu);
    kvedge_series_t *s = NULL;
    if (all_other) {
        s = m->ovf; /* the overflow series' own label set: never a second series of it */
    } else {
        for (size_t i = hash & m->index_mask; m->index[i]; i = (i + 1) & m->index_mask) {
            kvedge_series_t *c = m->series[m->index[i] - 1];
            if (c->hash != hash)
                continue;
            size_t j = 0;
            while (j < n && strcmp(c->values[j], clean[j]) == 0)
                j++;
            if (j == n) {
                s = c;
                break;
            }
        }
    }
    if (!s && m->n_series < m->max_series && s_grow(m)) {
        if (m->n_series < m->n_made) {
            /* A series kvedge_metric_reset let go: relabelled and zeroed. */
            kvedge_series_t *old = m->series[m->n_series];
            if (s_series_label(m, old, clean, hash)) {
                s_series_zero(old);
                s = old;
            }
        } else if ((s = s_series_new(m, clean, hash)) != NULL) {
            m->series[m->n_made++] = s;
        }
        if (s)
            s_index_put(m, m->n_series++);
    }
    if (!s)
        s = m->ovf; /* past the bound, or out of memory */
    if (s == m->ovf)
        m->ovf_used = true;
    pthread_mutex_unlock(&m->mu);
    return s;
}

void kvedge_metric_reset(kvedge_metric_t *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    if (m->n_labels == 0) {
        s_series_zero(m->series[0]);
    } else {
        m->n_series = 0; /* series[0 … n_made) wait for reuse */
        memset(m->index, 0, (m->index_mask + 1) * sizeof *m->index);
        s_series_zero(m->ovf);
        m->ovf_used = false;
    }
    pthread_mutex_unlock(&m->mu);
}

kvedge_series_t *kvedge_metric_plain(kvedge_metric_t *m)
{
    return m && m->n_labels == 0 ? m->series[0] : NULL;
}

kvedge_series_t *kvedge_metrics_single(kvedge_metrics_t *r, kvedge_metric_type_t type,
                                       const char *name, const char *help,
                                       const kvedge_histogram_spec_t *hist, char *why,
                                       size_t why_len)
{
    return kvedge_metric_plain(
        kvedge_metrics_family(r, type, name, help, NULL, 0, hist, 1, why, why_len));
}

kvedge_series_t *kvedge_metric_series_at(kvedge_metric_t *m, _Atomic(kvedge_series_t *) *slot,
                                         const char *const *values, size_t n)
{
    kvedge_series_t *s = atomic_load_explicit(slot, memory_order_acquire);
    if (!s) {
        s = kvedge_metric_series(m, values, n);
        atomic_store_explicit(slot, s, memory_order_release);
    }
    return s;
}

void kvedge_series_mirror(kvedge_series_t *s, uint64_t *last, uint64_t now)
{
    if (now > *last)
        kvedge_series_add(s, now - *last);
    *last = now;
}

int kvedge_metrics_process(kvedge_metrics_t *r, const char *version, const char *role,
                           double start_s, char *why, size_t why_len)
{
    const char *names[] = {"version", "role"}, *values[] = {version, role};
    kvedge_metric_t *info = kvedge_metrics_family(r, KVEDGE_METRIC_GAUGE, "kvedge_build_info",
                                                  "Always 1; the labels say what runs.", names, 2,
                                                  NULL, 1, why, why_len);
    kvedge_series_t *start = kvedge_metrics_single(
        r, KVEDGE_METRIC_GAUGE, "kvedge_process_start_time_seconds",
        "When the daemon started, in seconds since the Unix epoch.", NULL, why, why_len);
    if (!info || !start)
        return -1;
    kvedge_series_set(kvedge_metric_series(info, values, 2), 1);
    kvedge_series_set(start, start_s);
    return 0;
}

int kvedge_metrics_on_collect(kvedge_metrics_t *r, kvedge_metrics_collect_fn fn, void *arg)
{
    if (!r || !fn)
        return -1;
    pthread_mutex_lock(&r->mu);
    int rc = -1;
    if (r->n_collect < S_COLLECT_MAX) {
        r->collect[r->n_collect++] = (s_collect_t){fn, arg};
        rc = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* ---- rendering ---- */

static void s_put(s_buf_t *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void s_puts(s_buf_t *b, const char *s)
{
    s_put(b, s, strlen(s));
}

/* Writes s with backslash and newline escaped, and double quote too when quote is set (HELP
 * text escapes the first two, label values all three). */
static void s_put_escaped(s_buf_t *b, const char *s, bool quote)
{
    const char *run = s;
    for (const char *p = s;; p++) {
        const char *e = NULL;
        if (*p == '\\')
            e = "\\\\";
        else if (*p == '\n')
            e = "\\n";
        else if (*p == '"' && quote)
            e = "\\\"";
        else if (*p != '\0')
            continue;
        s_put(b, run, (size_t)(p - run));
        if (!e)
            return;
        s_put(b, e, 2);
        run = p + 1;
    }
}

/* "{a="x",b="y",le="0.5"}", or nothing without labels and le. */
static void s_put_labels(s_buf_t *b, const kvedge_metric_t *m, const kvedge_series_t *s,
                         const char *le)
{
    if (m->n_labels == 0 && !le)
        return;
    s_puts(b, "{");
    for (size_t i = 0; i < m->n_labels; i++) {
        if (i)
            s_puts(b, ",");
        s_puts(b, m->labels[i]);
        s_puts(b, "=\"");
        s_put_escaped(b, s->values[i], true);
        s_puts(b, "\"");
    }
    if (le) {
        s_puts(b, m->n_labels ? ",le=\"" : "le=\"");
        s_puts(b, le);
        s_puts(b, "\"");
    }
    s_puts(b, "}");
}

/* name + suffix + labels + " " + value + "\n". */
static void s_put_sample(s_buf_t *b, const kvedge_metric_t *m, const char *suffix,
                         const kvedge_series_t *s, const char *le, const char *value)
{
    s_puts(b, m->name);
    s_puts(b, suffix);
    s_put_labels(b, m, s, le);
    s_puts(b, " ");
    s_puts(b, value);
    s_puts(b, "\n");
}

static void s_render_series(s_buf_t *b, const kvedge_metric_t *m, const kvedge_series_t *s)
{
    char num[S_NUM_BYTES];
    if (m->type == KVEDGE_METRIC_COUNTER) {
        snprintf(num, sizeof num, "%" PRIu64,
                 atomic_load_explicit(&((kvedge_series_t *)s)->value, memory_order_relaxed));
        s_put_sample(b, m, "", s, NULL, num);
        return;
    }
    if (m->type == KVEDGE_METRIC_GAUGE) {
        s_fmt_double(kvedge_series_value(s), num);
        s_put_sample(b, m, "", s, NULL, num);
        return;
    }
    uint64_t cum[KVEDGE_METRICS_MAX_BUCKETS], sum;
    uint64_t count = kvedge_series_hist(s, &sum, cum, m->hist.buckets);
    for (uint32_t i = 0; i < m->hist.buckets; i++) {
        snprintf(num, sizeof num, "%" PRIu64, cum[i]);
        s_put_sample(b, m, "_bucket", s, m->le[i], num);
    }
    snprintf(num, sizeof num, "%" PRIu64, count);
    s_put_sample(b, m, "_bucket", s, "+Inf", num);
    char sum_s[S_NUM_BYTES];
    s_fmt_double(s_scaled(&m->hist, (double)sum), sum_s);
    s_put_sample(b, m, "_sum", s, NULL, sum_s);
    s_put_sample(b, m, "_count", s, NULL, num);
}

static void s_render_family(s_buf_t *b, kvedge_metric_t *m)
{
    static const char *const type_names[] = {"counter", "gauge", "histogram"};
    s_puts(b, "# HELP ");
    s_puts(b, m->name);
    if (m->help[0]) {
        s_puts(b, " ");
        s_put_escaped(b, m->help, false);
    }
    s_puts(b, "\n# TYPE ");
    s_puts(b, m->name);
    s_puts(b, " ");
    s_puts(b, type_names[m->type]);
    s_puts(b, "\n");
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n_series; i++)
        s_render_series(b, m, m->series[i]);
    if (m->ovf_used)
        s_render_series(b, m, m->ovf);
    pthread_mutex_unlock(&m->mu);
}

char *kvedge_metrics_render(kvedge_metrics_t *r, size_t *len)
{
    if (len)
        *len = 0;
    if (!r)
        return NULL;
    s_collect_t collect[S_COLLECT_MAX];
    pthread_mutex_lock(&r->mu);
    size_t n_collect = r->n_collect;
    memcpy(collect, r->collect, n_collect * sizeof *collect);
    pthread_mutex_unlock(&r->mu);
    /* Hooks run without the registry's mutex: they may declare families or make series. */
    for (size_t i = 0; i < n_collect; i++)
        collect[i].fn(r, collect[i].arg);

    s_buf_t b = {0};
    s_put(&b, "", 0); /* an empty registry renders as "" */
    pthread_mutex_lock(&r->mu);
    size_t n_families = r->n_families;
    pthread_mutex_unlock(&r->mu);
    /* Families are only appended and never move: the first n_families stay valid. */
    for (size_t i = 0; i < n_families; i++)
        s_render_family(&b, r->families[i]);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    if (len)
        *len = b.len;
    return b.p;
}
