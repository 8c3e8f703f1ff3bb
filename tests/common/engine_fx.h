/* The block engine's per-test fixture, shared by the engine's tests (test_engine,
 * test_variants, test_demote): a fresh directory, an injectable clock, the engine under test.
 * Include after <cmocka.h>; the including file defines _GNU_SOURCE (nftw). */
#ifndef KVEDGE_TESTS_ENGINE_FX_H
#define KVEDGE_TESTS_ENGINE_FX_H

#include <ftw.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "store/engine/engine.h"
#include "access/codec/error.h"

typedef struct {
    char dir[64];
    char path[96]; /* the store, inside dir */
    _Atomic uint64_t now;
    kvedge_engine_t *e;
} fx_t;

static inline uint64_t kt_fx_clock(void *ctx)
{
    return ((fx_t *)ctx)->now;
}

static inline int kt_fx_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* cmocka setup: a fresh /tmp/kvedge-test-NAME-XXXXXX and the clock at now_ms. */
static inline int kt_fx_setup(void **state, const char *name, uint64_t now_ms)
{
    fx_t *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    snprintf(fx->dir, sizeof fx->dir, "/tmp/kvedge-test-%s-XXXXXX", name);
    if (!mkdtemp(fx->dir)) {
        free(fx);
        return -1;
    }
    snprintf(fx->path, sizeof fx->path, "%s/store", fx->dir);
    fx->now = now_ms;
    *state = fx;
    return 0;
}

/* cmocka teardown: the engine closed, the directory removed. */
static inline int kt_fx_teardown(void **state)
{
    fx_t *fx = *state;
    kvedge_engine_destroy(&fx->e);
    nftw(fx->dir, kt_fx_rm, 16, FTW_DEPTH | FTW_PHYS);
    free(fx);
    return 0;
}

/* The default options with the fixture's clock. */
static inline kvedge_engine_opts_t kt_fx_opts(fx_t *fx)
{
    kvedge_engine_opts_t o;
    kvedge_engine_opts_default(&o);
    o.clock_ms = kt_fx_clock;
    o.clock_ctx = fx;
    return o;
}

/* Opens fx->e with opts (the fixture's clock when opts is NULL) and, unless read-only,
 * registers model m. */
static inline void kt_fx_open(fx_t *fx, const kvedge_engine_opts_t *opts, const kvedge_model_t *m)
{
    kvedge_engine_opts_t o = opts ? *opts : kt_fx_opts(fx);
    char why[256];
    int rc = kvedge_engine_open(fx->path, &o, &fx->e, why, sizeof why);
    if (rc != 0)
        fail_msg("open: %s: %s", kvedge_errname(rc), why);
    if (!o.read_only)
        assert_int_equal(kvedge_engine_put_model(fx->e, m), 0);
}

#endif
