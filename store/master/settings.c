/* The Storage Master's settings table (section `master`, the flags of `kvedge master`), its
 * checks, and the start call that turns the settings into a running master: data directory,
 * allowlist and certificate made where missing, then kvedge_master_start. */
#include "store/master/settings.h"

#include <czmq.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/secure.h"
#include "access/transport.h"
#include "monitor/http.h"
#include "access/codec/error.h"
#include "access/codec/why.h"

#define S_T kvedge_master_settings_t

static const kvedge_setting_t s_settings[] = {
    {.key = "bind",
     .flag = "bind",
     .letter = 'b',
     .arg = "EP",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, bind),
     .def = KVEDGE_MASTER_BIND_DEFAULT,
     .check = kvedge_settings_check_endpoint,
     .example = "ipc:///tmp/kvedge-master.sock",
     .help = "ROUTER endpoint: snapshots, updates, heartbeats"},
    {.key = "pub",
     .flag = "pub",
     .letter = 'p',
     .arg = "EP",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, pub),
     .def = KVEDGE_MASTER_PUB_DEFAULT,
     .check = kvedge_settings_check_endpoint,
     .example = "ipc:///tmp/kvedge-master-pub.sock",
     .help = "PUB endpoint: sequenced updates, HUGZ"},
    {.key = "data",
     .flag = "data",
     .letter = 'd',
     .arg = "DIR",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, data),
     .def = KVEDGE_MASTER_DATA_DEFAULT,
     .help = "registry directory, created when missing"},
    {.key = "cert",
     .flag = "cert",
     .arg = "FILE",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, cert),
     .help = "master certificate (its _secret file is read); empty: DATA/" KVEDGE_MASTER_CERT_NAME
             ", made on first start"},
    {.key = "clients",
     .flag = "clients",
     .arg = "DIR",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, clients),
     .help = "allowlist of peer certificates; empty: DATA/" KVEDGE_MASTER_CLIENTS_NAME
             " (made empty: nobody gets in)"},
    {.key = "insecure",
     .flag = "insecure",
     .type = KVEDGE_SETTING_BOOL,
     KVEDGE_SETTING_AT(S_T, insecure),
     .help = "plaintext, allowed only when both endpoints are loopback or ipc"},
    {.key = "sync",
     .flag = "sync",
     .type = KVEDGE_SETTING_BOOL,
     KVEDGE_SETTING_AT(S_T, sync),
     .help = "fsync the registry's write-ahead log on every update"},
    {.key = "suspect_ms",
     .flag = "suspect-ms",
     .arg = "MS",
     .type = KVEDGE_SETTING_MS,
     KVEDGE_SETTING_AT(S_T, suspect_ms),
     .min = 10,
     .max = 3600000,
     .def_num = KVEDGE_MASTER_SUSPECT_MS,
     .help = "heartbeat silence before a node is suspect"},
    {.key = "down_ms",
     .flag = "down-ms",
     .arg = "MS",
     .type = KVEDGE_SETTING_MS,
     KVEDGE_SETTING_AT(S_T, down_ms),
     .min = 10,
     .max = 3600000,
     .def_num = KVEDGE_MASTER_DOWN_MS,
     .help = "heartbeat silence before a node is down (at least suspect_ms)"},
    {.key = "metrics",
     .flag = "metrics",
     .arg = "ADDR",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, metrics),
     .def = KVEDGE_MASTER_METRICS_DEFAULT,
     .check = kvedge_http_check_addr,
     .example = "0.0.0.0:9751",
     .help = "HTTP endpoint for /metrics, /health and /ready (HOST:PORT; port 0: any free); "
             "off: none"},
    {.key = "etcd",
     .flag = "etcd",
     .arg = "URL[,URL...]",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, etcd),
     .example = "http://10.0.0.1:2379,http://10.0.0.2:2379,http://10.0.0.3:2379",
     .help = "masters on etcd: hard state in etcd, one leader elected on a lease, the others "
             "standbys (docs/master.md); empty: the single master on its own registry"},
    {.key = "etcd_prefix",
     .flag = "etcd-prefix",
     .arg = "P",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, etcd_prefix),
     .example = "/kvedge/prod-eu",
     .help = "the etcd key prefix of this cluster; empty: /kvedge/CLUSTER"},
    {.key = "cluster",
     .flag = "cluster",
     .arg = "NAME",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, cluster),
     .def = KVEDGE_MASTER_CLUSTER_DEFAULT,
     .example = "prod-eu",
     .help = "the cluster's name, checked against the one in etcd (two clusters on one prefix "
             "are refused)"},
    {.key = "id",
     .flag = "id",
     .arg = "ID",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, id),
     .example = "m1",
     .help = "this master's id among the masters on etcd; empty: from the ROUTER endpoint"},
    {.key = "lease_ms",
     .flag = "lease-ms",
     .arg = "MS",
     .type = KVEDGE_SETTING_MS,
     KVEDGE_SETTING_AT(S_T, lease_ms),
     .min = 1000,
     .max = 60000,
     .def_num = KVEDGE_MASTER_LEASE_MS,
     .help = "the leader's etcd lease: a standby takes over within about this long after the "
             "leader dies"},
    {.key = "log",
     .flag = "log-level",
     .type = KVEDGE_SETTING_ENUM,
     KVEDGE_SETTING_AT(S_T, log_level),
     .choices = kvedge_settings_log_levels,
     .def = "info",
     .help = "most verbose log level printed"},
};

const kvedge_settings_table_t kvedge_master_settings_table = {
    "master", sizeof(S_T), s_settings, sizeof s_settings / sizeof s_settings[0]};

void kvedge_master_settings_default(kvedge_master_settings_t *s)
{
    kvedge_settings_defaults(&kvedge_master_settings_table, s);
}

int kvedge_master_settings_check(const kvedge_master_settings_t *s, char *why, size_t why_len)
{
    if (!s || !s->data[0])
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "no data directory");
    if (s->down_ms < s->suspect_ms)
        return kvedge_why(
            why, why_len, KVEDGE_EINVAL,
            "down_ms (%u) is below suspect_ms (%u): a node is suspect before it is down",
            s->down_ms, s->suspect_ms);
    if (s->id[0] && !kvedge_master_id_ok(s->id))
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "id '%s': 1 to 64 of [A-Za-z0-9._:@+-]",
                          s->id);
    if (!kvedge_master_id_ok(s->cluster))
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "cluster '%s': 1 to 64 of [A-Za-z0-9._:@+-]",
                          s->cluster);
    if (s->etcd[0] && strncmp(s->etcd, "http://", 7) != 0 && strncmp(s->etcd, "https://", 8) != 0)
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "etcd '%.200s': a list of http://HOST:PORT (etcd's client URLs)",
                          s->etcd);
    if (s->insecure &&
        (!kvedge_endpoint_is_loopback(s->bind) || !kvedge_endpoint_is_loopback(s->pub)))
        return kvedge_why(why, why_len, KVEDGE_EDENIED,
                          "refusing plaintext on %s / %s: insecure is only allowed on loopback "
                          "(tcp://127.0.0.1:PORT) or ipc:// endpoints",
                          s->bind, s->pub);
    return KVEDGE_OK;
}

int kvedge_master_settings_start(const kvedge_master_settings_t *s, kvedge_master_t **out,
                                 char *why, size_t why_len)
{
    if (!out)
        return KVEDGE_EINVAL;
    int rc = kvedge_master_settings_check(s, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    kvedge_master_opts_t po = {.bind = s->bind, .pub = s->pub, .metrics = s->metrics};
    rc = kvedge_master_probe(&po, why, why_len); /* before the directory and certificate */
    if (rc != KVEDGE_OK)
        return rc;
    if (mkdir(s->data, 0700) != 0 && !zsys_file_exists(s->data))
        return kvedge_why(why, why_len, KVEDGE_ENOTFOUND, "cannot create the data directory %s",
                          s->data);
    /* Resolved paths: "" means a file or directory inside the data directory. */
    char cert[KVEDGE_MASTER_PATH_BYTES + 32], clients[KVEDGE_MASTER_PATH_BYTES + 32];
    char secret[KVEDGE_MASTER_PATH_BYTES + 48] = "";
    snprintf(cert, sizeof cert, "%s", s->cert);
    snprintf(clients, sizeof clients, "%s", s->clients);
    if (!s->insecure) {
        if (!cert[0] && snprintf(cert, sizeof cert, "%s/%s", s->data, KVEDGE_MASTER_CERT_NAME) >=
                            (int)sizeof cert)
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "data directory path too long");
        if (!clients[0]) {
            if (snprintf(clients, sizeof clients, "%s/%s", s->data, KVEDGE_MASTER_CLIENTS_NAME) >=
                (int)sizeof clients)
                return kvedge_why(why, why_len, KVEDGE_EINVAL, "data directory path too long");
            mkdir(clients, 0700); /* an empty allowlist lets nobody in */
        }
        if (kvedge_secure_ensure_cert(cert, "kvedge master") != KVEDGE_OK)
            return kvedge_why(why, why_len, KVEDGE_EIO, "cannot create the master certificate %s",
                              cert);
        snprintf(secret, sizeof secret, "%s_secret", cert);
    }
    kvedge_master_opts_t mo;
    kvedge_master_opts_default(&mo);
    mo.bind = s->bind;
    mo.pub = s->pub;
    mo.data_dir = s->data;
    mo.insecure = s->insecure;
    mo.cert = s->insecure ? NULL : secret;
    mo.clients_dir = s->insecure ? NULL : clients;
    mo.sync = s->sync;
    mo.suspect_ms = s->suspect_ms;
    mo.down_ms = s->down_ms;
    mo.metrics = s->metrics;
    mo.etcd = s->etcd;
    mo.etcd_prefix = s->etcd_prefix;
    mo.cluster = s->cluster;
    mo.id = s->id;
    mo.lease_ms = s->lease_ms;
    rc = kvedge_master_start(&mo, out, why, why_len);
    if (rc == KVEDGE_OK && !s->insecure)
        kvedge_log_info("master public key %s (certificate %s); peers allowed: the "
                        "certificates in %s",
                        kvedge_master_public_key(*out), cert, clients);
    return rc;
}
