/* Leveled logging to stderr for the daemons. */
#include "access/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static atomic_int s_level = KVEDGE_LOG_INFO;
static const char *s_names[] = {"error", "warn", "info", "debug"};

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

void kvedge_log_write(kvedge_log_level_t level, const char *fmt, ...)
{
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, s_names[level < 4 ? level : 3]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line); /* one write per line: lines of threads do not interleave */
}
