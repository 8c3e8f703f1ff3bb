/* The daemons' HTTP endpoint, through libmicrohttpd: GET (or HEAD) /metrics renders a
 * registry in the Prometheus text format, /health says the process serves (liveness),
 * /ready asks the daemon whether it is ready and says why not (readiness). Anything else is
 * 404; methods other than GET and HEAD are 405 with an Allow header. Requests carry no input
 * but the path: a request with a body, headers beyond KVEDGE_HTTP_MEMORY_BYTES, or one slower
 * than KVEDGE_HTTP_TIMEOUT_S is cut by libmicrohttpd; at most KVEDGE_HTTP_MAX_CONNECTIONS are
 * served at once (one thread polls them all), so a scraper cannot take the daemon's cores. */
#ifndef KVEDGE_MONITOR_HTTP_H
#define KVEDGE_MONITOR_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "monitor/metrics.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_HTTP_MAX_CONNECTIONS 32
#define KVEDGE_HTTP_TIMEOUT_S       5
#define KVEDGE_HTTP_MEMORY_BYTES    (32u * 1024)
/* The longest bind address, "HOST:PORT" or "[V6]:PORT". */
#define KVEDGE_HTTP_ADDR_BYTES 128
/* The spelling of "no endpoint" in settings. */
#define KVEDGE_HTTP_OFF "off"

/* Readiness: returns true when ready; when not, writes the reason (one line) to why. Called
 * on the HTTP thread for every GET /ready; must be thread-safe and quick. */
typedef bool (*kvedge_http_ready_fn)(void *arg, char *why, size_t why_len);

typedef struct kvedge_http_t kvedge_http_t;

/* Checks a bind address without binding: "HOST:PORT" with an IPv4 literal or "localhost",
 * "[IPV6]:PORT", or "off"; PORT 0 … 65535 (0: any free port). For the settings tables.
 * Returns 0, or -1 with a reason in why. */
int kvedge_http_check_addr(const char *addr, char *why, size_t why_len);

/* Starts serving on addr (as kvedge_http_check_addr; "off" is an error here: the caller does
 * not start one). metrics and ready (may be NULL: always ready) stay the caller's and must
 * outlive the endpoint. Returns 0 and *out, or KVEDGE_MONITOR_EINVAL (bad address),
 * KVEDGE_MONITOR_EIO (cannot bind: why names the address and the system's reason) or
 * KVEDGE_MONITOR_ENOMEM: the values of KVEDGE_EINVAL, KVEDGE_EIO and KVEDGE_ENOMEM. */
int kvedge_http_start(const char *addr, kvedge_metrics_t *metrics, kvedge_http_ready_fn ready,
                      void *ready_arg, kvedge_http_t **out, char *why, size_t why_len);

/* Binds addr and lets it go at once: whether kvedge_http_start would bind it now, for a
 * daemon that checks every address it will take before it does anything else. "off" passes.
 * Returns 0, KVEDGE_MONITOR_EINVAL (bad address) or KVEDGE_MONITOR_EIO (cannot bind: why
 * names the address and the system's reason, e.g. "Address already in use"). */
int kvedge_http_probe(const char *addr, char *why, size_t why_len);

/* The port bound (resolves port 0). */
uint16_t kvedge_http_port(const kvedge_http_t *h);

/* "http://HOST:PORT" as bound (port 0 resolved), for logs. Valid until stop. */
const char *kvedge_http_url(const kvedge_http_t *h);

/* Connections the endpoint has accepted and not yet closed (0 for NULL). */
unsigned kvedge_http_connections(const kvedge_http_t *h);

/* Stops serving (in-flight requests finish) and frees. NULL-safe, nulls *self_p. */
void kvedge_http_stop(kvedge_http_t **self_p);

#ifdef __cplusplus
}
#endif
#endif
