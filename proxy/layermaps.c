/* The edge proxy's reading of the layer maps the Storage Master holds (map/<cloud>/<edge>,
 * docs/largesmall.md): a map is used only when it agrees with the two models' shapes, so a
 * stale or mistaken map costs recomputation on the edge, never wrong K/V. MAPPED FETCHes
 * (fetch.c) read them here. */
#include <stdio.h>
#include <string.h>

#include "runtime/log.h"
#include "proxy/proxy_impl.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"

/* One line per map key every 10 minutes (and 20 over all keys): a map stays bad until someone
 * registers it again, and the accessor may be asked for it on every request. */
static kvedge_log_limit_t s_map_lines = KVEDGE_LOG_LIMIT_INIT(600000, 1, 20);
/* The same for MAPPED requests that found no usable map: one line per pair of models. */
static kvedge_log_limit_t s_unusable_lines = KVEDGE_LOG_LIMIT_INIT(600000, 1, 20);

int kvedge_proxy_impl_model(kvedge_proxy_impl_t *p, const char *id, kvedge_model_t *out)
{
    if (kvedge_model_builtin(id, out) == KVEDGE_OK)
        return KVEDGE_OK;
    /* A rotary model registered nowhere but named after a built-in shape ("llama-3.2-1b"
     * with its rotary suffix): the built-in's shape. A registered record comes first. */
    kvedge_model_t rope;
    bool by_rope = kvedge_model_builtin_rope(id, &rope) == KVEDGE_OK;
    if (p->view && p->has_tenant &&
        kvedge_mview_tenant_model(p->view, p->tenant_tag, id, out) == KVEDGE_OK)
        return KVEDGE_OK;
    if (p->view && kvedge_mview_model(p->view, id, out) == KVEDGE_OK)
        return KVEDGE_OK;
    if (by_rope) {
        *out = rope;
        return KVEDGE_OK;
    }
    return KVEDGE_ENOMODEL;
}

/* The limit's key for a map key: the key itself when the limit remembers it whole, else an
 * FNV-1a hash of it, so that two long keys with the same beginning are not one key. */
static void s_limit_key(const char *key, char out[KVEDGE_LOG_LIMIT_KEY_MAX + 1])
{
    size_t n = strlen(key);
    if (n <= KVEDGE_LOG_LIMIT_KEY_MAX) {
        memcpy(out, key, n + 1);
        return;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)key[i]) * 0x100000001b3ull;
    snprintf(out, KVEDGE_LOG_LIMIT_KEY_MAX + 1, "map#%016llx", (unsigned long long)h);
}

static void s_ignore(const char *key, const char *reason)
{
    char lk[KVEDGE_LOG_LIMIT_KEY_MAX + 1];
    s_limit_key(key, lk);
    uint64_t held = 0;
    if (kvedge_log_level() < KVEDGE_LOG_WARN ||
        !kvedge_log_limit_allow(&s_map_lines, lk, kvedge_mono_ms(), &held))
        return;
    char more[96] = "";
    if (held)
        snprintf(more, sizeof more, " (%llu more such lines not logged)", (unsigned long long)held);
    kvedge_log_warn("ignoring layer map %s from the master: %s; those layers are computed "
                    "locally%s",
                    key, reason, more);
}

int kvedge_proxy_impl_map(kvedge_proxy_impl_t *p, const char *cloud, const char *edge,
                          kvedge_master_map_t *out)
{
    if (!p || !out)
        return KVEDGE_EINVAL;
    memset(out, 0, sizeof *out);
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    if (kvedge_master_key_format(KVEDGE_MASTER_SPACE_MAP, cloud, edge, key, sizeof key) !=
        KVEDGE_OK)
        return KVEDGE_EINVAL;
    if (!p->view)
        return KVEDGE_ENOTFOUND;
    int rc = kvedge_mview_map(p->view, cloud, edge, out);
    if (rc == KVEDGE_ENOTFOUND)
        return rc;
    char why[256] = "";
    kvedge_model_t cm, em;
    if (rc != KVEDGE_OK)
        snprintf(why, sizeof why, "not a valid map record (%s)", kvedge_strerror(rc));
    else if (kvedge_proxy_impl_model(p, cloud, &cm) != KVEDGE_OK)
        snprintf(why, sizeof why, "no record of model %s to check it against", cloud);
    else if (kvedge_proxy_impl_model(p, edge, &em) != KVEDGE_OK)
        snprintf(why, sizeof why, "no record of model %s to check it against", edge);
    else if (out->cloud_layers != cm.layers)
        snprintf(why, sizeof why, "it has %u cloud layers, model %s has %u", out->cloud_layers,
                 cloud, cm.layers);
    else if (out->edge_layers != em.layers)
        snprintf(why, sizeof why, "it has %u edge layers, model %s has %u", out->edge_layers, edge,
                 em.layers);
    for (uint32_t e = 0; !*why && e < out->edge_layers; e++)
        if (out->from[e] != KVEDGE_MASTER_MAP_NONE && out->from[e] >= cm.layers)
            snprintf(why, sizeof why, "edge layer %u takes cloud layer %u of %u", e, out->from[e],
                     cm.layers);
    if (!*why)
        return KVEDGE_OK;
    s_ignore(key, why);
    memset(out, 0, sizeof *out);
    return KVEDGE_EPROTO;
}

void kvedge_proxy_impl_map_unusable(const char *cloud, const char *edge, const char *why)
{
    char key[2 * KVEDGE_WIRE_MODEL_ID_BYTES + 8], lk[KVEDGE_LOG_LIMIT_KEY_MAX + 1];
    snprintf(key, sizeof key, "%s/%s", cloud ? cloud : "", edge ? edge : "");
    s_limit_key(key, lk);
    uint64_t held = 0;
    if (kvedge_log_level() < KVEDGE_LOG_WARN ||
        !kvedge_log_limit_allow(&s_unusable_lines, lk, kvedge_mono_ms(), &held))
        return;
    char more[96] = "";
    if (held)
        snprintf(more, sizeof more, " (%llu more such lines not logged)", (unsigned long long)held);
    kvedge_log_warn("FETCH of %s with MAPPED %s: no usable layer map (%s); its layers are "
                    "planned without one%s",
                    edge ? edge : "", cloud ? cloud : "", why, more);
}
