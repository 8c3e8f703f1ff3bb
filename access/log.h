/* The daemons' logger: one line per event on stderr, level checked before formatting. The
 * client library never logs. */
#ifndef KVEDGE_ACCESS_LOG_H
#define KVEDGE_ACCESS_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KVEDGE_LOG_ERROR = 0,
    KVEDGE_LOG_WARN = 1,
    KVEDGE_LOG_INFO = 2,
    KVEDGE_LOG_DEBUG = 3,
} kvedge_log_level_t;

/* Sets the most verbose level printed (default INFO). Thread-safe. */
void kvedge_log_set_level(kvedge_log_level_t level);
kvedge_log_level_t kvedge_log_level(void);
/* Parses "error", "warn", "info", "debug". Returns 0 or -1. */
int kvedge_log_parse(const char *name, kvedge_log_level_t *out);

void kvedge_log_write(kvedge_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define KVEDGE_LOG(level, ...)                                                                     \
    do {                                                                                           \
        if ((level) <= kvedge_log_level())                                                         \
            kvedge_log_write((level), __VA_ARGS__);                                                \
    } while (0)
#define kvedge_log_error(...) KVEDGE_LOG(KVEDGE_LOG_ERROR, __VA_ARGS__)
#define kvedge_log_warn(...)  KVEDGE_LOG(KVEDGE_LOG_WARN, __VA_ARGS__)
#define kvedge_log_info(...)  KVEDGE_LOG(KVEDGE_LOG_INFO, __VA_ARGS__)
#define kvedge_log_debug(...) KVEDGE_LOG(KVEDGE_LOG_DEBUG, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
