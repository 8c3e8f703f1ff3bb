/* The edge proxy's settings table (section `proxy`, the flags of `kvedge proxy`), its checks,
 * and the start call that turns the settings into a running proxy. */
#include "proxy/settings.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/log.h"
#include "runtime/mview.h"
#include "runtime/secure.h"
#include "access/transport.h"
#include "monitor/http.h"
#include "access/codec/error.h"
#include "access/codec/why.h"

#define S_T kvedge_proxy_settings_t

/* A source spec is checked where it is read, so a bad one names its file line or flag. */
static int s_check_source(const char *v, char *why, size_t why_len)
{
    kvedge_proxy_source_t src;
    if (kvedge_proxy_source_parse(v, &src) == KVEDGE_OK)
        return 0;
    snprintf(why, why_len,
             "is a bad source (want \"KIND NAME ENDPOINT [key=K] [link=RATE,LATENCY] "
             "[bw=BYTES_PER_S] [rtt=US]\", KIND local, peer, cloud or history)");
    return -1;
}

static const kvedge_setting_t s_settings[] = {
    {.key = "bind",
     .flag = "bind",
     .letter = 'b',
     .arg = "EP",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, bind),
     .def = KVEDGE_PROXY_BIND_DEFAULT,
     .check = kvedge_settings_check_endpoint,
     .example = "ipc:///tmp/kvedge-proxy.sock",
     .help = "client endpoint"},
    {.key = "id",
     .flag = "id",
     .arg = "ID",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, id),
     .def = "proxy",
     .check = kvedge_settings_check_id,
     .example = "edge1-proxy",
     .help = "the proxy's id in the registry (heartbeats, links)"},
    {.key = "source",
     .flag = "source",
     .letter = 's',
     .arg = "SPEC",
     .type = KVEDGE_SETTING_LIST,
     KVEDGE_SETTING_LIST_AT(S_T, source, nsource),
     .check = s_check_source,
     .example = "cloud cloud1 tcp://127.0.0.1:7400 bw=12500000",
     .help = "a store node: \"KIND NAME ENDPOINT [key=K] [link=RATE,LATENCY] [bw=BYTES_PER_S] "
             "[rtt=US]\", KIND local, peer, cloud or history (link= emulates a link, for tests)"},
    {.key = "master",
     .flag = "master",
     .arg = "EPS",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, master),
     .check = kvedge_mview_check_endpoints,
     .example = "ipc:///tmp/kvedge-master.sock",
     .help = "Storage Master ROUTER: sources, directory, links, models; a list EP[,EP...] of "
             "the masters of one cluster follows the leader"},
    {.key = "master_pub",
     .flag = "master-pub",
     .arg = "EPS",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, master_pub),
     .check = kvedge_mview_check_endpoints,
     .example = "ipc:///tmp/kvedge-master-pub.sock",
     .help = "the masters' PUB endpoints EP[,EP...], one per master; empty: each tcp master's "
             "PORT+1"},
    {.key = "master_key",
     .flag = "master-key",
     .arg = "KEY",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, master_key),
     .help = "the master's public key or certificate file; empty: plaintext (loopback only)"},
    {.key = "snapshot",
     .flag = "snapshot",
     .arg = "FILE",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, snapshot),
     .help = "keep the registry replica here, to plan from while the master is down"},
    {.key = "local_node",
     .flag = "local-node",
     .arg = "ID",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, local_node),
     .check = kvedge_settings_check_id,
     .example = "edge1",
     .help = "this edge's store node in the registry (kind local)"},
    {.key = "history_node",
     .flag = "history-node",
     .arg = "ID",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, history_node),
     .check = kvedge_settings_check_id,
     .example = "edge1-hist",
     .help = "this edge's historical cache in the registry (kind history)"},
    {.key = "cert",
     .flag = "cert",
     .arg = "FILE",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, cert),
     .def = KVEDGE_PROXY_CERT_DEFAULT,
     .help = "proxy certificate, CURVE toward clients, sources and the master (its _secret "
             "file is read; made on first start); loaded whenever CURVE may be used, with a "
             "master too (it may name nodes that run CURVE)"},
    {.key = "clients",
     .flag = "clients",
     .arg = "DIR",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, clients),
     .help = "allowlist of client certificates (required unless insecure)"},
    {.key = "insecure",
     .flag = "insecure",
     .type = KVEDGE_SETTING_BOOL,
     KVEDGE_SETTING_AT(S_T, insecure),
     .help = "plaintext for clients, allowed only on loopback and ipc endpoints"},
    {.key = "metrics",
     .flag = "metrics",
     .arg = "ADDR",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, metrics),
     .def = KVEDGE_PROXY_METRICS_DEFAULT,
     .check = kvedge_http_check_addr,
     .example = "0.0.0.0:9752",
     .help = "HTTP endpoint for /metrics, /health and /ready (HOST:PORT; port 0: any free); "
             "off: none"},
    {.key = "quality",
     .flag = "quality",
     .arg = "FILES",
     .type = KVEDGE_SETTING_STRING,
     KVEDGE_SETTING_AT(S_T, quality),
     .example = "models/kjv/cloud/quality.json",
     .help =
         "per-layer quality profiles of the models (kvedge eval --profile-out), comma-separated: "
         "what a FETCH's quality budget is priced with"},
    {.key = "quality_margin",
     .flag = "quality-margin",
     .arg = "PCT",
     .type = KVEDGE_SETTING_UINT,
     KVEDGE_SETTING_AT(S_T, quality_margin),
     .min = 100,
     .max = 1000,
     .def_num = KVEDGE_PROXY_QUALITY_MARGIN_PCT,
     .help = "price each layer's quality cost at PCT % of its profile's figure (a profile is a "
             "mean over documents: above 100 keeps the measured quality under a budget)"},
    {.key = "monitor",
     .flag = "monitor",
     .type = KVEDGE_SETTING_BOOL,
     KVEDGE_SETTING_AT(S_T, monitor),
     .def_num = 1,
     .help = "record the Collaboration Monitor (layers by source and reason, fetch timings); "
             "no: only the live source gauges"},
    {.key = "pack",
     .flag = "pack",
     .type = KVEDGE_SETTING_BOOL,
     KVEDGE_SETTING_AT(S_T, pack),
     .def_num = 1,
     .help = "send several blocks per FETCH BLOCK message to a client that asks (docs/"
             "protocol.md, Packed data messages); no: refuse the ask as older proxies do"},
    {.key = "log",
     .flag = "log-level",
     .type = KVEDGE_SETTING_ENUM,
     KVEDGE_SETTING_AT(S_T, log_level),
     .choices = kvedge_settings_log_levels,
     .def = "info",
     .help = "most verbose log level printed"},
};

const kvedge_settings_table_t kvedge_proxy_settings_table = {
    "proxy", sizeof(S_T), s_settings, sizeof s_settings / sizeof s_settings[0]};

void kvedge_proxy_settings_default(kvedge_proxy_settings_t *s)
{
    kvedge_settings_defaults(&kvedge_proxy_settings_table, s);
}

/* The masters' PUB list: master_pub, else each tcp master's PORT+1; "" when not derivable. */
static const char *s_master_pubs(const kvedge_proxy_settings_t *s, char *out, size_t cap)
{
    if (s->master_pub[0])
        return s->master_pub;
    if (kvedge_mview_default_pubs(s->master, out, cap) != 0)
        out[0] = '\0';
    return out;
}

int kvedge_proxy_settings_check(const kvedge_proxy_settings_t *s, char *why, size_t why_len)
{
    if (!s || s->nsource > KVEDGE_PROXY_MAX_SOURCES)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "bad settings");
    char pubs[KVEDGE_PROXY_MASTERS_BYTES];
    if (s->master_pub[0] && !s->master[0])
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "master_pub without master");
    if (s->master[0] && !s_master_pubs(s, pubs, sizeof pubs)[0])
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "master and master_pub go together: the PUB endpoints default to "
                          "PORT+1 only for tcp://HOST:PORT masters");
    if (s->master[0] && kvedge_mview_count_endpoints(s->master) !=
                            kvedge_mview_count_endpoints(s_master_pubs(s, pubs, sizeof pubs)))
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "master lists %zu masters and master_pub %zu PUB endpoints: give one "
                          "PUB per master, in the same order",
                          kvedge_mview_count_endpoints(s->master),
                          kvedge_mview_count_endpoints(s->master_pub));
    if (!s->nsource && !s->master[0])
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "no sources: give --source (repeatable) or --master");
    for (size_t i = 0; i < s->nsource; i++) {
        kvedge_proxy_source_t src;
        if (kvedge_proxy_source_parse(s->source[i], &src) != KVEDGE_OK)
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "bad source '%s'", s->source[i]);
    }
    if (s->insecure && !kvedge_endpoint_is_loopback(s->bind))
        return kvedge_why(why, why_len, KVEDGE_EDENIED,
                          "refusing plaintext on %s: insecure is only allowed on loopback "
                          "(tcp://127.0.0.1:PORT) or ipc:// endpoints",
                          s->bind);
    if (!s->insecure && !s->clients[0])
        return kvedge_why(
            why, why_len, KVEDGE_EINVAL,
            "CURVE for clients needs a clients directory (--clients DIR), or insecure "
            "on loopback");
    return KVEDGE_OK;
}

/* Says who the proxy is to its sources, as a node says its key: the key and the tenant the
 * nodes will file it under. Without a tenant in its certificate a node uses the key itself,
 * a tenant of its own that holds nothing: every source then answers "not found". */
static void s_say_identity(const char *cert_path)
{
    zcert_t *cert = zcert_load(cert_path);
    if (!cert)
        return;
    const char *tenant = zcert_meta(cert, "tenant");
    if (tenant && *tenant)
        kvedge_log_info("proxy public key %s (certificate %s); allowlist it on every source node "
                        "with tenant %s: copy %s into each node's clients directory (and the "
                        "master's)",
                        zcert_public_txt(cert), cert_path, tenant, cert_path);
    else
        kvedge_log_warn("proxy public key %s (certificate %s) has no tenant: source nodes will "
                        "file it under its own key and hold nothing for it; make one with "
                        "`kvedge keygen %s --tenant T` (T: the tenant the contexts are stored "
                        "under) and copy it into each node's clients directory (and the master's)",
                        zcert_public_txt(cert), cert_path, cert_path);
    zcert_destroy(&cert);
}

int kvedge_proxy_settings_start(const kvedge_proxy_settings_t *s, kvedge_proxy_t **out, char *why,
                                size_t why_len)
{
    if (!out)
        return KVEDGE_EINVAL;
    int rc = kvedge_proxy_settings_check(s, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    kvedge_proxy_source_t *src = calloc(s->nsource ? s->nsource : 1, sizeof *src);
    if (!src)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "out of memory");
    bool need_cert = !s->insecure || s->master_key[0];
    for (size_t i = 0; i < s->nsource; i++) {
        kvedge_proxy_source_parse(s->source[i], &src[i]); /* checked above */
        need_cert = need_cert || src[i].server_key[0];
    }
    /* The master may name nodes that run CURVE (a node record carries its public key): the
     * certificate is loaded (made if missing) with a master too. Only then is a certificate
     * that cannot be made not fatal: nodes that run CURVE stay unreachable, and the `sources`
     * view and the log say which flag fixes it. */
    bool may_need = !need_cert && s->master[0];
    char secret[KVEDGE_PROXY_PATH_BYTES + 16] = "";
    if (need_cert || may_need) {
        if (kvedge_secure_ensure_cert(s->cert, "kvedge proxy") == KVEDGE_OK) {
            need_cert = true;
            snprintf(secret, sizeof secret, "%s_secret", s->cert);
        } else if (!may_need) {
            free(src);
            return kvedge_why(why, why_len, KVEDGE_EIO, "cannot create the proxy certificate %s",
                              s->cert);
        } else {
            kvedge_log_warn("cannot load or make the proxy certificate %s: nodes the master names "
                            "that run CURVE cannot be reached (give --cert FILE in a writable "
                            "place)",
                            s->cert);
        }
    }
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.bind = s->bind;
    po.insecure = s->insecure;
    po.cert = need_cert ? secret : NULL;
    po.clients_dir = s->insecure ? NULL : s->clients;
    po.id = s->id[0] ? s->id : NULL;
    po.sources = src;
    po.nsources = s->nsource;
    po.master = s->master[0] ? s->master : NULL;
    /* The proxy reads master_pub only while it starts (its view keeps a copy). */
    char pubs[KVEDGE_PROXY_MASTERS_BYTES];
    po.master_pub = s->master[0] ? s_master_pubs(s, pubs, sizeof pubs) : NULL;
    po.master_key = s->master_key[0] ? s->master_key : NULL;
    po.snapshot = s->snapshot[0] ? s->snapshot : NULL;
    po.local_node = s->local_node[0] ? s->local_node : NULL;
    po.history_node = s->history_node[0] ? s->history_node : NULL;
    po.metrics = s->metrics;
    po.no_monitor = !s->monitor;
    po.no_pack = !s->pack;
    po.quality = s->quality[0] ? s->quality : NULL;
    po.quality_margin_pct = s->quality_margin;
    rc = kvedge_proxy_start(&po, out, why, why_len);
    free(src);
    if (rc == KVEDGE_OK && need_cert)
        s_say_identity(s->cert);
    return rc;
}
