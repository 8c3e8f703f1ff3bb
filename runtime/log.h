/* The daemons' logger: one line per event on stderr, level checked before formatting, and a
 * rate limit for the lines a peer can cause. The client library never logs. */
#ifndef KVEDGE_ACCESS_LOG_H
#define KVEDGE_ACCESS_LOG_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

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

/* Names the daemon in every line ("... info  [edge-3] ..."): its node id, "master", the proxy's
 * id, so that the logs of several daemons read apart. At most 64 bytes are kept; NULL or ""
 * removes it. Call it before the daemon's threads log. Sinks get the text without it. */
void kvedge_log_set_name(const char *name);

void kvedge_log_write(kvedge_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Hears every line written, with its level and its text (no timestamp), on the writing
 * thread, after the line went to stderr. For tests that check what a daemon says. */
typedef void (*kvedge_log_sink_fn)(kvedge_log_level_t level, const char *text, void *arg);

/* Installs fn (NULL removes it). Thread-safe: once it returns, the previous sink is not running
 * and will not be called again, so its arg may be freed. Lines are handed over one at a time
 * under a lock: fn must not log. */
void kvedge_log_set_sink(kvedge_log_sink_fn fn, void *arg);

#define KVEDGE_LOG(level, ...)                                                                     \
    do {                                                                                           \
        if ((level) <= kvedge_log_level())                                                         \
            kvedge_log_write((level), __VA_ARGS__);                                                \
    } while (0)
#define kvedge_log_error(...) KVEDGE_LOG(KVEDGE_LOG_ERROR, __VA_ARGS__)
#define kvedge_log_warn(...)  KVEDGE_LOG(KVEDGE_LOG_WARN, __VA_ARGS__)
#define kvedge_log_info(...)  KVEDGE_LOG(KVEDGE_LOG_INFO, __VA_ARGS__)
#define kvedge_log_debug(...) KVEDGE_LOG(KVEDGE_LOG_DEBUG, __VA_ARGS__)

/* ---------------------------------------------------------------- rate limit */

/* Keys a limit remembers; past it the key seen least recently is forgotten. */
#define KVEDGE_LOG_LIMIT_SLOTS 64
/* Longest key remembered, in bytes; longer keys are compared on this prefix. */
#define KVEDGE_LOG_LIMIT_KEY_MAX 63

/* One key of a limit (private to log.c; here so that a limit needs no allocation). */
typedef struct {
    char key[KVEDGE_LOG_LIMIT_KEY_MAX + 1];
    bool used;
    int64_t window_start_ms; /* start of this key's current window */
    int64_t seen_ms;         /* latest call for this key */
    uint32_t lines;          /* let through in the current window */
    uint64_t held;           /* held back since the last line let through */
} kvedge_log_limit_slot_t;

/* A limit on the lines a peer can cause (a refused handshake, a flapping source): at most
 * per_key lines per key (a peer address, a source name) and total lines over all keys in any
 * window of window_ms; what is held back is counted and handed to the next line let through,
 * so a log says "N more ..." instead of losing the count. A static one needs no set-up:
 * `static kvedge_log_limit_t lim = KVEDGE_LOG_LIMIT_INIT(10000, 1, 20);`. Thread-safe. */
typedef struct {
    pthread_mutex_t mu;
    uint32_t window_ms;
    uint32_t per_key;
    uint32_t total;
    int64_t total_start_ms; /* start of the window of the total */
    uint32_t total_lines;   /* let through in it */
    uint64_t orphans;       /* held back for keys forgotten since the last line let through */
    kvedge_log_limit_slot_t slot[KVEDGE_LOG_LIMIT_SLOTS];
} kvedge_log_limit_t;

#define KVEDGE_LOG_LIMIT_INIT(window_ms_, per_key_, total_)                                        \
    {                                                                                              \
        .mu = PTHREAD_MUTEX_INITIALIZER, .window_ms = (window_ms_), .per_key = (per_key_),         \
        .total = (total_)                                                                          \
    }

/* Sets up a limit that lives in a struct; kvedge_log_limit_fini releases it. */
void kvedge_log_limit_init(kvedge_log_limit_t *l, uint32_t window_ms, uint32_t per_key,
                           uint32_t total);
void kvedge_log_limit_fini(kvedge_log_limit_t *l);

/* Whether a line about key (NULL or empty: one shared key) may be written at now_ms (the
 * caller's monotonic clock). When it may, *held (may be NULL) receives how many lines for key,
 * and for keys forgotten meanwhile, were held back since the last one let through; when it may
 * not, the call is counted for the next. */
bool kvedge_log_limit_allow(kvedge_log_limit_t *l, const char *key, int64_t now_ms, uint64_t *held);

#ifdef __cplusplus
}
#endif
#endif
