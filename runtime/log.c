/* Leveled logging to stderr for the daemons, a test sink, and the rate limit of log.h. */
#include "runtime/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static atomic_int s_level = KVEDGE_LOG_INFO;
static const char *s_names[] = {"error", "warn", "info", "debug"};

/* The daemon's name in every line: "[NAME] ", or "" (set before the threads log). */
static char s_name[64 + 4];

void kvedge_log_set_name(const char *name)
{
    if (!name || !*name)
        s_name[0] = '\0';
    else
        snprintf(s_name, sizeof s_name, "[%.64s] ", name);
}

/* The sink: read without the lock first, so a process without one pays one atomic load. */
static atomic_bool s_sink_on;
static pthread_mutex_t s_sink_mu = PTHREAD_MUTEX_INITIALIZER;
static kvedge_log_sink_fn s_sink;
static void *s_sink_arg;

void kvedge_log_set_level(kvedge_log_level_t level)
{
    atomic_store(&s_level, (int)level);
}

kvedge_log_level_t kvedge_log_level(void)
{
    return (kvedge_log_level_t)atomic_load_explicit(&s_level, memory_order_relaxed);
}

int kvedge_log_parse(const char *name, kvedge_log_level_t *out)
{
    for (int i = 0; i < 4; i++)
        if (name && strcmp(name, s_names[i]) == 0) {
            *out = (kvedge_log_level_t)i;
            return 0;
        }
    return -1;
}

void kvedge_log_set_sink(kvedge_log_sink_fn fn, void *arg)
{
    pthread_mutex_lock(&s_sink_mu);
    s_sink = fn;
    s_sink_arg = arg;
    atomic_store(&s_sink_on, fn != NULL);
    pthread_mutex_unlock(&s_sink_mu);
}

void kvedge_log_write(kvedge_log_level_t level, const char *fmt, ...)
{
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, s_names[level < 4 ? level : 3], s_name);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line); /* one write per line: lines of threads do not interleave */
    if (atomic_load_explicit(&s_sink_on, memory_order_acquire)) {
        /* Held during the call: set_sink(NULL) returns only once no call is running. */
        pthread_mutex_lock(&s_sink_mu);
        if (s_sink)
            s_sink(level, n > 0 && (size_t)n < sizeof line ? line + n : line, s_sink_arg);
        pthread_mutex_unlock(&s_sink_mu);
    }
}

/* ---------------------------------------------------------------- rate limit */

void kvedge_log_limit_init(kvedge_log_limit_t *l, uint32_t window_ms, uint32_t per_key,
                           uint32_t total)
{
    memset(l, 0, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
    l->window_ms = window_ms;
    l->per_key = per_key;
    l->total = total;
}

void kvedge_log_limit_fini(kvedge_log_limit_t *l)
{
    pthread_mutex_destroy(&l->mu);
}

/* Caller holds l->mu. The slot of key: its own, a free one, or the one seen least recently
 * (whose held-back count goes to the orphans). */
static kvedge_log_limit_slot_t *s_slot(kvedge_log_limit_t *l, const char *key, int64_t now)
{
    kvedge_log_limit_slot_t *free_slot = NULL, *oldest = NULL;
    for (size_t i = 0; i < KVEDGE_LOG_LIMIT_SLOTS; i++) {
        kvedge_log_limit_slot_t *s = &l->slot[i];
        if (!s->used) {
            if (!free_slot)
                free_slot = s;
        } else if (strncmp(s->key, key, KVEDGE_LOG_LIMIT_KEY_MAX) == 0) {
            return s;
        } else if (!oldest || s->seen_ms < oldest->seen_ms) {
            oldest = s;
        }
    }
    kvedge_log_limit_slot_t *s = free_slot ? free_slot : oldest;
    if (!free_slot)
        l->orphans += s->held;
    memset(s, 0, sizeof *s);
    s->used = true;
    snprintf(s->key, sizeof s->key, "%s", key);
    s->window_start_ms = now;
    return s;
}

bool kvedge_log_limit_allow(kvedge_log_limit_t *l, const char *key, int64_t now_ms, uint64_t *held)
{
    if (!l)
        return true;
    if (!key)
        key = "";
    pthread_mutex_lock(&l->mu);
    kvedge_log_limit_slot_t *s = s_slot(l, key, now_ms);
    if (now_ms > s->seen_ms)
        s->seen_ms = now_ms;
    if (now_ms - s->window_start_ms >= (int64_t)l->window_ms) {
        s->window_start_ms = now_ms;
        s->lines = 0;
    }
    if (now_ms - l->total_start_ms >= (int64_t)l->window_ms) {
        l->total_start_ms = now_ms;
        l->total_lines = 0;
    }
    bool ok = s->lines < l->per_key && l->total_lines < l->total;
    if (ok) {
        s->lines++;
        l->total_lines++;
        if (held)
            *held = s->held + l->orphans;
        s->held = 0;
        l->orphans = 0;
    } else {
        s->held++;
    }
    pthread_mutex_unlock(&l->mu);
    return ok;
}
