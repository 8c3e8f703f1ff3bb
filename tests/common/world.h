/* A small in-process world for the large-small tests (test_largesmall, test_prune): a Storage
 * Master with a view of it, a cloud node "cloud1" not registered with the master, and an edge
 * proxy whose one source is that node; and the synthetic decoders those tests pair. Its master
 * and node settings serve the proxy tests too (kt_master_start, kt_node_settings). Include
 * after <cmocka.h>. */
#ifndef KVEDGE_TESTS_WORLD_H
#define KVEDGE_TESTS_WORLD_H

#include <stdio.h>

#include "runtime/mview.h"
#include "clients/decoder/decoder.h"
#include "proxy/proxy.h"
#include "access/codec/error.h"
#include "store/master/master.h"
#include "store/node/node.h"
#include "tests/common/testutil.h"

/* Synthetic OPT-style weights at path: head_dim 16, hidden 16 x heads, FFN 32 x heads. */
static inline void kt_synth(const char *path, uint32_t layers, uint32_t heads, uint32_t vocab,
                            uint32_t positions, uint64_t seed)
{
    kvedge_decoder_config_t c = {.layers = layers,
                                 .heads = heads,
                                 .head_dim = 16,
                                 .hidden = heads * 16,
                                 .ffn = heads * 32,
                                 .vocab = vocab,
                                 .max_positions = positions};
    assert_int_equal(kvedge_decoder_synthesize(path, &c, seed, false), KVEDGE_OK);
}

/* A decoder of the weights at path (fails the test with the loader's error otherwise). */
static inline kvedge_decoder_t *kt_load(const char *path)
{
    kvedge_decoder_t *d = kvedge_decoder_new();
    assert_non_null(d);
    int rc = kvedge_decoder_load(d, path, 0);
    if (rc != KVEDGE_OK)
        fail_msg("load %s: %s (%s)", path, kvedge_strerror(rc), kvedge_decoder_error(d));
    return d;
}

/* A master on ipc endpoints under root (plaintext: loopback only), registry in root/master. */
typedef struct {
    kvedge_master_opts_t opts; /* as started: a test may start it again */
    char dir[200], ep[220], pub[220];
    kvedge_master_t *m;
} kt_master_t;

static inline kvedge_master_t *kt_master_start(kt_master_t *mm, const char *root)
{
    kvedge_master_opts_default(&mm->opts);
    snprintf(mm->dir, sizeof mm->dir, "%.120s/master", root);
    snprintf(mm->ep, sizeof mm->ep, "ipc://%.120s/m.sock", root);
    snprintf(mm->pub, sizeof mm->pub, "ipc://%.120s/mp.sock", root);
    mm->opts.bind = mm->ep;
    mm->opts.pub = mm->pub;
    mm->opts.data_dir = mm->dir;
    mm->opts.insecure = true;
    mm->m = NULL;
    assert_int_equal(kvedge_master_start(&mm->opts, &mm->m, NULL, 0), 0);
    return mm->m;
}

/* The settings of a plaintext store node called name (2 workers, no metrics) with its store in
 * data, bound to bind. */
static inline void kt_node_settings(kvedge_node_settings_t *ns, kvedge_role_t role,
                                    const char *name, const char *data, const char *bind)
{
    kvedge_node_settings_default(ns);
    snprintf(ns->metrics, sizeof ns->metrics, "off");
    ns->role = role;
    ns->insecure = true;
    ns->workers = 2;
    snprintf(ns->data, sizeof ns->data, "%s", data);
    snprintf(ns->bind, sizeof ns->bind, "%s", bind);
    snprintf(ns->name, sizeof ns->name, "%s", name);
}

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
    kt_node_settings(&ns, KVEDGE_ROLE_CLOUD, "cloud1", w->ndir, w->nep);
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

/* Waits until the proxy's replica of the registry has what the master holds now (the maps
 * and models registered so far). */
static inline void kt_world_proxy_sync(kt_world_t *w)
{
    assert_int_equal(kvedge_proxy_wait_view(w->proxy, kvedge_master_seq(w->master), KT_WAIT_MS),
                     KVEDGE_OK);
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
