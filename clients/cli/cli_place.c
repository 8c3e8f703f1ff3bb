/* The cloud tier from a Storage Master's registry (cli_place.h): two prefixed views, node/ and
 * health/, so the snapshot holds only those records, not the block directory. */
#include "clients/cli/cli_place.h"

#include <stdlib.h>
#include <string.h>

#include "access/codec/error.h"
#include "clients/cli/cli.h"
#include "runtime/mview.h"

/* Opens a synced view of the keys under prefix. Returns an exit code; *out is NULL on error. */
static int s_view(const kvedge_cli_tier_src_t *src, const char *pub, const char *prefix,
                  kvedge_mview_t **out)
{
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = src->master;
    vo.pub = pub;
    vo.server_key = src->key;
    vo.client_cert = src->key ? src->cert : NULL;
    vo.prefix = prefix;
    vo.start_wait_ms = src->deadline_ms;
    *out = NULL;
    int rc = kvedge_mview_start(&vo, out);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("%s: cannot reach the master: %s%s", src->cmd, kvedge_strerror(rc),
                         rc == KVEDGE_EDENIED ? " (plaintext is for loopback and ipc only: give "
                                                "--master-key and --cert)"
                                              : "");
        return rc == KVEDGE_EINVAL || rc == KVEDGE_EDENIED ? KVEDGE_EXIT_USAGE
                                                           : KVEDGE_EXIT_FAILURE;
    }
    if (kvedge_mview_state(*out) != KVEDGE_MVIEW_SYNCED) {
        kvedge_cli_error("%s: no snapshot from the master at %s within %d ms (master down, wrong "
                         "endpoint, or key not allowed); nothing stored",
                         src->cmd, src->master, src->deadline_ms);
        kvedge_mview_destroy(out);
        return KVEDGE_EXIT_UNAVAILABLE;
    }
    return KVEDGE_EXIT_OK;
}

typedef struct {
    kvedge_mview_t *v;
    kvedge_placed_node_t *nodes;
    size_t n;
    size_t with_health; /* health records seen */
} s_acc_t;

static int s_node(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    (void)seq;
    s_acc_t *a = ctx;
    kvedge_master_key_t k;
    kvedge_master_node_t rec;
    if (a->n >= KVEDGE_PLACED_MAX_NODES ||
        kvedge_master_key_parse(key, strlen(key), &k) != KVEDGE_OK ||
        k.space != KVEDGE_MASTER_SPACE_NODE || strlen(k.a) >= KVEDGE_PLACED_ID_BYTES ||
        kvedge_master_node_parse(body, len, &rec) != KVEDGE_OK || rec.role != KVEDGE_ROLE_CLOUD ||
        !rec.endpoint[0] || strlen(rec.endpoint) >= KVEDGE_PLACED_ENDPOINT_BYTES)
        return 0;
    kvedge_placed_node_t *p = &a->nodes[a->n++];
    memset(p, 0, sizeof *p);
    snprintf(p->id, sizeof p->id, "%s", k.a);
    snprintf(p->endpoint, sizeof p->endpoint, "%s", rec.endpoint);
    snprintf(p->server_key, sizeof p->server_key, "%s", rec.public_key);
    p->weight = rec.capacity_bytes;
    p->up = true; /* until health says otherwise */
    return 0;
}

static int s_health(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    (void)seq;
    (void)key;
    (void)body;
    (void)len;
    s_acc_t *a = ctx;
    a->with_health++;
    return 0;
}

int kvedge_cli_tier_read(const kvedge_cli_tier_src_t *src, kvedge_placed_node_t **nodes, size_t *n)
{
    *nodes = NULL;
    *n = 0;
    char pub[1024];
    const char *p = kvedge_cli_master_pubs(src->cmd, "master", src->master, "master-pub", src->pub,
                                           pub, sizeof pub);
    if (!p)
        return KVEDGE_EXIT_USAGE;
    if (src->key && !src->cert) {
        kvedge_cli_error("%s: --master-key needs --cert (this client's secret certificate)",
                         src->cmd);
        return KVEDGE_EXIT_USAGE;
    }
    s_acc_t a = {NULL, calloc(KVEDGE_PLACED_MAX_NODES, sizeof *a.nodes), 0, 0};
    if (!a.nodes) {
        kvedge_cli_error("%s: out of memory", src->cmd);
        return KVEDGE_EXIT_FAILURE;
    }
    int ex = s_view(src, p, "node/", &a.v);
    if (!ex && kvedge_mview_foreach(a.v, "node/", s_node, &a) != KVEDGE_OK)
        ex = KVEDGE_EXIT_FAILURE;
    kvedge_mview_destroy(&a.v);
    if (!ex)
        ex = s_view(src, p, "health/", &a.v);
    if (!ex && kvedge_mview_foreach(a.v, "health/", s_health, &a) != KVEDGE_OK)
        ex = KVEDGE_EXIT_FAILURE;
    /* Up: health up or suspect. A node the master has no health record of, while it has some,
     * never heartbeat since the master started: not up. Without any health record (a registry
     * written by hand), every node counts as up. */
    for (size_t i = 0; !ex && a.with_health > 0 && i < a.n; i++) {
        kvedge_master_health_t h;
        a.nodes[i].up =
            kvedge_mview_health(a.v, a.nodes[i].id, &h) == KVEDGE_OK &&
            (h.state == KVEDGE_MASTER_HEALTH_UP || h.state == KVEDGE_MASTER_HEALTH_SUSPECT);
    }
    kvedge_mview_destroy(&a.v);
    if (ex) {
        free(a.nodes);
        return ex;
    }
    *nodes = a.nodes;
    *n = a.n;
    return KVEDGE_EXIT_OK;
}

void kvedge_cli_tier_explain(const char *cmd, const kvedge_placed_node_t *nodes, size_t n)
{
    size_t up = 0, weighted = 0;
    for (size_t i = 0; i < n; i++) {
        up += nodes[i].up;
        weighted += nodes[i].weight > 0;
    }
    if (n == 0)
        kvedge_cli_error("%s: no placement: the master has no cloud node registered (start "
                         "`kvedge store --role cloud --master EP --node-id ID --capacity SIZE`); "
                         "nothing computed or stored",
                         cmd);
    else if (up == 0)
        kvedge_cli_error("%s: no placement: none of the %zu cloud nodes is up (health down, or "
                         "not heard since the master started); nothing computed or stored",
                         cmd, n);
    else
        kvedge_cli_error("%s: no placement: the %zu cloud nodes up have no capacity (%zu of %zu "
                         "registered have one: a node takes placements in proportion to its "
                         "--capacity SIZE, and 0 takes none); nothing computed or stored",
                         cmd, up, weighted, n);
}
