/* Capturing the daemons' log lines in a test (kvedge_log_set_sink): the lines are kept, and a
 * test counts those containing given words. Header-only: tests are programs. */
#ifndef KVEDGE_TESTS_LOGCAP_H
#define KVEDGE_TESTS_LOGCAP_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/log.h"

#define KT_LOG_LINES 512 /* lines kept; later ones are dropped */

typedef struct {
    pthread_mutex_t mu;
    char *lines[KT_LOG_LINES];
    size_t n;
} kt_log_t;

/* The sink to give kvedge_log_set_sink, with the kt_log_t as its argument. */
static inline void kt_log_sink(kvedge_log_level_t level, const char *text, void *arg)
{
    (void)level;
    kt_log_t *l = arg;
    pthread_mutex_lock(&l->mu);
    if (l->n < KT_LOG_LINES)
        l->lines[l->n++] = strdup(text);
    pthread_mutex_unlock(&l->mu);
}

/* Lines containing every one of the NULL-terminated needles. */
static inline size_t kt_log_count(kt_log_t *l, ...)
{
    size_t hits = 0;
    pthread_mutex_lock(&l->mu);
    for (size_t i = 0; i < l->n; i++) {
        va_list ap;
        va_start(ap, l);
        bool all = true;
        for (const char *w = va_arg(ap, const char *); w && all; w = va_arg(ap, const char *))
            all = l->lines[i] && strstr(l->lines[i], w) != NULL;
        va_end(ap);
        hits += all;
    }
    pthread_mutex_unlock(&l->mu);
    return hits;
}

/* Frees the lines kept (the mutex is the caller's to destroy when it initialised one). */
static inline void kt_log_clear(kt_log_t *l)
{
    pthread_mutex_lock(&l->mu);
    for (size_t i = 0; i < l->n; i++)
        free(l->lines[i]);
    l->n = 0;
    pthread_mutex_unlock(&l->mu);
}

#endif
