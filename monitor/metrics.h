/* A small metrics library for the daemons: counters, gauges and histograms with fixed
 * log-scale buckets, labelled series with a bounded number of label sets per family, and the
 * Prometheus text exposition format (version 0.0.4).
 *
 * Hot paths pay one relaxed atomic add per update and take no lock: a series is looked up
 * (or made) once, by the code that owns the event, and kept as a pointer. Making a series
 * takes the family's mutex; past the family's bound every new label set folds into one
 * overflow series whose label values are all "_other", so a peer that sends ever-new model
 * ids or tenants can never grow the exposition beyond max_series + 1 series per family.
 *
 * Stands alone: libc and pthreads only. */
#ifndef KVEDGE_MONITOR_METRICS_H
#define KVEDGE_MONITOR_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bounds. A family has at most MAX_LABELS label names; a label value longer than
 * LABEL_VALUE_MAX bytes is cut there (at a UTF-8 boundary); a registry holds at most
 * MAX_FAMILIES families; max_series of a family is at most MAX_SERIES. */
#define KVEDGE_METRICS_MAX_LABELS      4
#define KVEDGE_METRICS_LABEL_VALUE_MAX 128
#define KVEDGE_METRICS_MAX_FAMILIES    256
#define KVEDGE_METRICS_MAX_SERIES      4096
/* The label value every label of the overflow series carries. */
#define KVEDGE_METRICS_OTHER "_other"

/* Error codes of monitor/'s int-returning calls. They equal access/codec/error.h's KVEDGE_EINVAL,
 * KVEDGE_ENOMEM and KVEDGE_EIO (KVEDGE_ERR_BASE - 1, - 2, - 8; kvedge_strerror reads them),
 * spelt here because monitor/ stands alone and may not include access/codec/. */
#define KVEDGE_MONITOR_EINVAL (-30701)
#define KVEDGE_MONITOR_ENOMEM (-30702)
#define KVEDGE_MONITOR_EIO    (-30708)

/* Histogram buckets: upper bounds (le) first_le, first_le·2, first_le·4, … (buckets of them),
 * then +Inf. Observations are integers in the family's unit; scale converts to the exposed
 * unit (1e-6 for microseconds shown as seconds). At most MAX_BUCKETS finite buckets. */
#define KVEDGE_METRICS_MAX_BUCKETS 40

typedef enum {
    KVEDGE_METRIC_COUNTER = 0, /* only goes up; name ends in _total */
    KVEDGE_METRIC_GAUGE = 1,   /* set, added to, or read at scrape time */
    KVEDGE_METRIC_HISTOGRAM = 2,
} kvedge_metric_type_t;

typedef struct kvedge_metrics_t kvedge_metrics_t; /* a registry */
typedef struct kvedge_metric_t kvedge_metric_t;   /* a family */
typedef struct kvedge_series_t kvedge_series_t;   /* one label set of a family */

/* Histogram layout of a family. */
typedef struct {
    uint64_t first_le; /* upper bound of the first bucket, in the family's unit; >= 1 */
    uint32_t buckets;  /* finite buckets, 1 … KVEDGE_METRICS_MAX_BUCKETS */
    double scale;      /* exposed value = observed value × scale (> 0) */
} kvedge_histogram_spec_t;

/* Latency in microseconds exposed as seconds: 10 µs … ~42 s in 23 buckets. */
extern const kvedge_histogram_spec_t kvedge_histogram_latency_us;
/* Sizes in bytes: 64 B … 4 GiB in 27 buckets. */
extern const kvedge_histogram_spec_t kvedge_histogram_bytes;

/* A new empty registry. NULL when out of memory. Caller owns it. */
kvedge_metrics_t *kvedge_metrics_new(void);

/* Destroys the registry and every family and series in it. NULL-safe, nulls *self_p. */
void kvedge_metrics_destroy(kvedge_metrics_t **self_p);

/* Declares a family. name: [a-zA-Z_:][a-zA-Z0-9_:]*, unique in the registry; help: one line
 * (escaped on output); labels: n_labels names ([a-zA-Z_][a-zA-Z0-9_]*, not starting "__",
 * not "le"); hist: the bucket layout for histograms (NULL otherwise); max_series: the bound
 * on label sets (1 … KVEDGE_METRICS_MAX_SERIES; ignored without labels: one series).
 * Returns the family (owned by the registry), or NULL with why filled (bad name, duplicate,
 * too many families or labels, out of memory). */
kvedge_metric_t *kvedge_metrics_family(kvedge_metrics_t *r, kvedge_metric_type_t type,
                                       const char *name, const char *help,
                                       const char *const *labels, size_t n_labels,
                                       const kvedge_histogram_spec_t *hist, size_t max_series,
                                       char *why, size_t why_len);

/* The series of a label set (n values, as many as the family has labels; any bytes, cut at
 * KVEDGE_METRICS_LABEL_VALUE_MAX): found, made, or the overflow series once the family holds
 * max_series. Never NULL for a valid family (the overflow series is made with the family);
 * NULL only when m is NULL or n is wrong. Takes the family's mutex: look a series up once and
 * keep the pointer on hot paths. Valid until the registry is destroyed. */
kvedge_series_t *kvedge_metric_series(kvedge_metric_t *m, const char *const *values, size_t n);

/* Forgets every label set of a family, for views rebuilt at each scrape (a top-K set from an
 * on_collect hook): it renders no series until new ones are made, and its overflow series is
 * unused again; an unlabelled family's one series goes back to 0. The series' memory is kept
 * and given to the next label sets made, so memory stays bounded and no pointer dangles, but
 * an old pointer may then count for another label set: reset only families whose series are
 * looked up afresh each time. */
void kvedge_metric_reset(kvedge_metric_t *m);

/* The single series of a family without labels. */
kvedge_series_t *kvedge_metric_plain(kvedge_metric_t *m);

/* A family without labels and its one series in one call (hist: histograms only). NULL, with
 * why (may be NULL) filled, when the family cannot be made. */
kvedge_series_t *kvedge_metrics_single(kvedge_metrics_t *r, kvedge_metric_type_t type,
                                       const char *name, const char *help,
                                       const kvedge_histogram_spec_t *hist, char *why,
                                       size_t why_len);

/* The series of a label set through a slot the caller keeps per label set: the first call
 * makes it (kvedge_metric_series, under the family's mutex), later ones only read the slot.
 * Two first calls racing get the same series. For label sets known only when they happen
 * (an opcode and a status) on paths that must not take a lock each time. */
kvedge_series_t *kvedge_metric_series_at(kvedge_metric_t *m, _Atomic(kvedge_series_t *) *slot,
                                         const char *const *values, size_t n);

/* Mirrors a count kept elsewhere (an engine's, a ZAP handler's) into counter s at scrape
 * time: adds what now grew by since *last and remembers now (a count that went down adds
 * nothing). */
void kvedge_series_mirror(kvedge_series_t *s, uint64_t *last, uint64_t now);

/* The families every daemon exposes: kvedge_build_info{version,role} (always 1) and
 * kvedge_process_start_time_seconds (start_s, seconds since the epoch). 0, or -1 with why. */
int kvedge_metrics_process(kvedge_metrics_t *r, const char *version, const char *role,
                           double start_s, char *why, size_t why_len);

/* Updates: lock-free, any thread; NULL series are ignored, so a daemon without monitoring
 * passes NULL. add on a counter with a value < 0 is ignored. */
void kvedge_series_inc(kvedge_series_t *s);
void kvedge_series_add(kvedge_series_t *s, uint64_t v);
/* Gauges: the value is a double, stored atomically. */
void kvedge_series_set(kvedge_series_t *s, double v);
void kvedge_series_gauge_add(kvedge_series_t *s, double delta);
/* Histograms: one observation in the family's unit. */
void kvedge_series_observe(kvedge_series_t *s, uint64_t v);

/* Reads (for tests, `kvedge top` snapshots and the wire view). value: counter or gauge.
 * count/sum: histogram observations and their sum (in the family's unit). bucket_counts: the
 * cumulative count at each finite bucket (n = the family's buckets), may be NULL. */
double kvedge_series_value(const kvedge_series_t *s);
uint64_t kvedge_series_hist(const kvedge_series_t *s, uint64_t *sum, uint64_t *bucket_counts,
                            size_t n);

/* A quantile q in [0, 1] of a histogram's observations (in the family's unit), interpolated
 * linearly inside the bucket as Prometheus's histogram_quantile does; from cumulative bucket
 * counts (spec's layout) and the total count. 0 when count is 0. For the +Inf bucket: the
 * largest finite bound. */
double kvedge_histogram_quantile(const kvedge_histogram_spec_t *spec, const uint64_t *cumulative,
                                 uint64_t count, double q);

/* Called at the start of every render, before any family is written, so gauges that mirror
 * state (blocks stored, sources up) are current. At most 8 per registry. Returns 0, or -1
 * when full. fn runs on the rendering thread and may set series of this registry. */
typedef void (*kvedge_metrics_collect_fn)(kvedge_metrics_t *r, void *arg);
int kvedge_metrics_on_collect(kvedge_metrics_t *r, kvedge_metrics_collect_fn fn, void *arg);

/* Renders every family in declaration order in the Prometheus text format 0.0.4 (# HELP,
 * # TYPE, series; label values escaped: backslash, double quote, newline; histograms as
 * _bucket{le=…}, _sum and _count). Families with labels and no series yet print only their
 * HELP and TYPE lines. Returns a malloc'd NUL-terminated string (caller frees) and its length
 * in *len (may be NULL), or NULL when out of memory. */
char *kvedge_metrics_render(kvedge_metrics_t *r, size_t *len);

/* Escapes a label value per the exposition format into out (cap bytes, NUL-terminated, cut at
 * a whole escape). Returns the length written. */
size_t kvedge_metrics_escape_label(const char *value, char *out, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
