/* The Storage Master's settings: the struct its table (section `master`, the flags of `kvedge
 * master`) fills, and a start call that takes it. kvedge_master_start(opts) stays for callers
 * that build options themselves (tests). */
#ifndef KVEDGE_STORE_MASTER_SETTINGS_H
#define KVEDGE_STORE_MASTER_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/log.h"
#include "runtime/settings.h"
#include "store/master/master.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_MASTER_DATA_DEFAULT "./master"
#define KVEDGE_MASTER_CERT_NAME    "master.cert" /* in DATA; its secret: master.cert_secret */
#define KVEDGE_MASTER_CLIENTS_NAME "clients"     /* the allowlist directory, in the data dir */
#define KVEDGE_MASTER_PATH_BYTES   1024
#define KVEDGE_MASTER_EP_BYTES     256

typedef struct {
    char data[KVEDGE_MASTER_PATH_BYTES];          /* registry directory; created when missing */
    char bind[KVEDGE_MASTER_EP_BYTES];            /* ROUTER endpoint */
    char pub[KVEDGE_MASTER_EP_BYTES];             /* PUB endpoint */
    char cert[KVEDGE_MASTER_PATH_BYTES];          /* "" = DATA/master.cert, made on first start */
    char clients[KVEDGE_MASTER_PATH_BYTES];       /* "" = DATA/clients, made empty */
    bool insecure;                                /* plaintext: both endpoints loopback or ipc */
    bool sync;                                    /* fsync the registry's WAL on every update */
    uint32_t suspect_ms;                          /* heartbeat silence before suspect */
    uint32_t down_ms;                             /* heartbeat silence before down */
    char metrics[128];                            /* HTTP endpoint "HOST:PORT", or "off" */
    char etcd[1024];                              /* "URL[,URL...]": masters on etcd; "" = none */
    char etcd_prefix[200];                        /* "" = /kvedge/<cluster> */
    char cluster[KVEDGE_MASTER_MAX_ID_BYTES + 1]; /* the cluster's name in etcd */
    char id[KVEDGE_MASTER_MAX_ID_BYTES + 1];      /* "" = from the ROUTER endpoint */
    uint32_t lease_ms;                            /* the leader's etcd lease */
    kvedge_log_level_t log_level;                 /* the daemon's main sets the logger's level */
} kvedge_master_settings_t;

extern const kvedge_settings_table_t kvedge_master_settings_table;

/* Fills *s with the table's defaults. */
void kvedge_master_settings_default(kvedge_master_settings_t *s);

/* Checks what can be checked without touching the disk. why (may be NULL) says what is
 * wrong. Errors: KVEDGE_EINVAL (no data directory, down_ms below suspect_ms), KVEDGE_EDENIED
 * (plaintext on an endpoint other hosts can reach). */
int kvedge_master_settings_check(const kvedge_master_settings_t *s, char *why, size_t why_len);

/* Checks the settings, creates the data directory, the allowlist directory and the master
 * certificate where they are missing (CURVE), and starts the master (kvedge_master_start).
 * Caller owns *out. Errors: those of the check (nothing is created then), KVEDGE_ENOTFOUND
 * (the data directory cannot be created), KVEDGE_EIO (the certificate cannot be made), and
 * those of kvedge_master_start. */
int kvedge_master_settings_start(const kvedge_master_settings_t *s, kvedge_master_t **out,
                                 char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif
