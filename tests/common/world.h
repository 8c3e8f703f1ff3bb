/* A small in-process world for the large-small tests (test_largesmall, test_prune): a Storage
 * Master with a view of it, a cloud node "cloud1" not registered with the master, and an edge
 * proxy whose one source is that node. Include after <cmocka.h>. */
#ifndef KVEDGE_TESTS_WORLD_H
#define KVEDGE_TESTS_WORLD_H

#include <stdio.h>

#include "access/mview.h"
#include "proxy/proxy.h"
#include "store/error.h"
#include "store/master/master.h"
#include "store/node/node.h"

typedef struct {
    char mdir[200], mep[200], mpub[200];
    kvedge_master_t *master;
    kvedge_mview_t *reg;
    char ndir[200], nep[250];
    kvedge_node_t *node;
    char pep[250];
    kvedge_proxy_t *proxy;
} kt_world_t;

/* The master (insecure, data in ROOT/master) and w->reg, a view of it. */
static inline void kt_world_master(kt_world_t *w, const char *root)
{
    snprintf(w->mdir, sizeof w->mdir, "%s/master", root);
    snprintf(w->mep, sizeof w->mep, "ipc://%s/m.sock", root);
    snprintf(w->mpub, sizeof w->mpub, "ipc://%s/mp.sock", root);
    kvedge_master_opts_t mo;
    kvedge_master_opts_default(&mo);
    mo.bind = w->mep;
    mo.pub = w->mpub;
    mo.data_dir = w->mdir;
    mo.insecure = true;
    assert_int_equal(kvedge_master_start(&mo, &w->master, NULL, 0), KVEDGE_OK);
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = w->mep;
    vo.pub = w->mpub;
    assert_int_equal(kvedge_mview_start(&vo, &w->reg), KVEDGE_OK);
}

/* The cloud node "cloud1" (insecure, 2 workers, no metrics), data in ROOT/cloud1. */
static inline void kt_world_node(kt_world_t *w, const char *root)
{
    snprintf(w->ndir, sizeof w->ndir, "%s/cloud1", root);
    snprintf(w->nep, sizeof w->nep, "ipc://%s.sock", w->ndir);
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    ns.role = KVEDGE_ROLE_CLOUD;
    ns.insecure = true;
    ns.workers = 2;
    snprintf(ns.data, sizeof ns.data, "%s", w->ndir);
    snprintf(ns.bind, sizeof ns.bind, "%s", w->nep);
    snprintf(ns.name, sizeof ns.name, "cloud1");
    char why[256];
    if (kvedge_node_start(&ns, &w->node, why, sizeof why) != KVEDGE_OK)
        fail_msg("node: %s", why);
}

/* The edge proxy id on ROOT/proxy.sock: the node as its cloud source (1 Gbit/s, 200 us), the
 * master for layer maps; returns once the source is up. */
static inline void kt_world_proxy(kt_world_t *w, const char *root, const char *id)
{
    kvedge_proxy_source_t src;
    char spec[400];
    snprintf(spec, sizeof spec, "cloud cloud1 %s bw=1000000000 rtt=200", w->nep);
    assert_int_equal(kvedge_proxy_source_parse(spec, &src), KVEDGE_OK);
    snprintf(w->pep, sizeof w->pep, "ipc://%s/proxy.sock", root);
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.bind = w->pep;
    po.insecure = true;
    po.id = id;
    po.sources = &src;
    po.nsources = 1;
    po.master = w->mep;
    po.master_pub = w->mpub;
    char why[256];
    if (kvedge_proxy_start(&po, &w->proxy, why, sizeof why) != KVEDGE_OK)
        fail_msg("proxy: %s", why);
    assert_int_equal(kvedge_proxy_wait_sources(w->proxy, 1, 5000), KVEDGE_OK);
}

/* Stops what was started, proxy first. */
static inline void kt_world_stop(kt_world_t *w)
{
    kvedge_proxy_destroy(&w->proxy);
    kvedge_node_destroy(&w->node);
    kvedge_mview_destroy(&w->reg);
    kvedge_master_destroy(&w->master);
}

#endif
