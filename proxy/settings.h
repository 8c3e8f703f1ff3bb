/* The edge proxy's settings: the struct its table (section `proxy`, the flags of `kvedge
 * proxy`) fills, and a start call that takes it. kvedge_proxy_start(opts) stays for callers
 * that build options themselves (tests). */
#ifndef KVEDGE_PROXY_SETTINGS_H
#define KVEDGE_PROXY_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/log.h"
#include "runtime/settings.h"
#include "proxy/proxy.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_PROXY_CERT_DEFAULT      "proxy.cert" /* the secret: proxy.cert_secret */
#define KVEDGE_PROXY_PATH_BYTES        1024
#define KVEDGE_PROXY_EP_BYTES          256
#define KVEDGE_PROXY_MASTERS_BYTES     1024 /* a list of masters "EP[,EP...]" */
#define KVEDGE_PROXY_SOURCE_SPEC_BYTES 2048 /* one "KIND NAME ENDPOINT [...]" */

typedef struct {
    char bind[KVEDGE_PROXY_EP_BYTES]; /* where clients connect */
    char id[65];                      /* the proxy's id in the registry */
    /* Static sources, as given: "KIND NAME ENDPOINT [key=K] [link=..] [bw=..] [rtt=..]". */
    char source[KVEDGE_PROXY_MAX_SOURCES][KVEDGE_PROXY_SOURCE_SPEC_BYTES];
    size_t nsource;
    /* Storage Master ROUTER, or a list "EP[,EP...]" of the masters of one cluster; "" = none */
    char master[KVEDGE_PROXY_MASTERS_BYTES];
    char master_pub[KVEDGE_PROXY_MASTERS_BYTES]; /* one PUB per master; "" = tcp PORT+1 */
    char master_key[KVEDGE_PROXY_PATH_BYTES];
    char snapshot[KVEDGE_PROXY_PATH_BYTES]; /* the registry replica's file; "" = none */
    char local_node[65];                    /* this edge's store node id: kind local */
    char history_node[65];                  /* this edge's historical cache id: kind history */
    char cert[KVEDGE_PROXY_PATH_BYTES];     /* made when CURVE is used anywhere */
    char clients[KVEDGE_PROXY_PATH_BYTES];  /* client allowlist (CURVE toward clients) */
    bool insecure;                          /* plaintext for clients: loopback or ipc only */
    char metrics[128];                      /* HTTP endpoint "HOST:PORT", or "off" */
    char quality[1024];                     /* quality profiles, comma-separated paths */
    uint32_t quality_margin;                /* percent the profiles' costs are priced at */
    bool monitor;                           /* the Collaboration Monitor records */
    bool pack;                              /* packed BLOCK messages for clients that ask */
    kvedge_log_level_t log_level;           /* the daemon's main sets the logger's level */
} kvedge_proxy_settings_t;

extern const kvedge_settings_table_t kvedge_proxy_settings_table;

/* Fills *s with the table's defaults. */
void kvedge_proxy_settings_default(kvedge_proxy_settings_t *s);

/* Checks what can be checked without touching the disk or the network. why (may be NULL)
 * says what is wrong. Errors: KVEDGE_EINVAL (master_pub without master, a master list whose PUBs
 * are neither given nor tcp PORT+1, lists of different lengths, no source and no master, CURVE for
 * clients without a clients directory, a bad source spec), KVEDGE_EDENIED (plaintext on an endpoint
 * other hosts can reach). */
int kvedge_proxy_settings_check(const kvedge_proxy_settings_t *s, char *why, size_t why_len);

/* Checks the settings, loads the proxy certificate (making it when missing) where CURVE is or
 * may be used (toward clients, the master or a source with key=, and with any master: it may
 * name nodes that run CURVE; only then is a certificate that cannot be made not fatal, it is
 * logged at warn), and starts the proxy (kvedge_proxy_start).
 * s must outlive the proxy. Caller owns *out. Errors: those of the check (nothing is created
 * then), KVEDGE_EIO (the certificate cannot be made), KVEDGE_ENOMEM, and those of
 * kvedge_proxy_start. */
int kvedge_proxy_settings_start(const kvedge_proxy_settings_t *s, kvedge_proxy_t **out, char *why,
                                size_t why_len);

#ifdef __cplusplus
}
#endif
#endif
