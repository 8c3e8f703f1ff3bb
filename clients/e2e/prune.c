/* The layers of a cloud model that the layer maps use, and the --layers list (prune.h). */
#include "clients/e2e/prune.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/error.h"

static void s_why(char *why, size_t why_len, const char *fmt, ...)
{
    if (!why || !why_len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
}

void kvedge_prune_set_init(kvedge_prune_set_t *s, uint32_t layers)
{
    if (!s)
        return;
    memset(s, 0, sizeof *s);
    s->layers = layers < KVEDGE_MODEL_MAX_LAYERS ? layers : KVEDGE_MODEL_MAX_LAYERS;
}

void kvedge_prune_set_all(kvedge_prune_set_t *s, uint32_t layers)
{
    kvedge_prune_set_init(s, layers);
    for (uint32_t l = 0; s && l < s->layers; l++)
        kvedge_prune_set_add(s, l);
}

bool kvedge_prune_set_has(const kvedge_prune_set_t *s, uint32_t layer)
{
    return s && layer < s->layers && (s->bit[layer / 8] >> (layer % 8)) & 1u;
}

void kvedge_prune_set_add(kvedge_prune_set_t *s, uint32_t layer)
{
    if (s && layer < s->layers)
        s->bit[layer / 8] |= (uint8_t)(1u << (layer % 8));
}

uint32_t kvedge_prune_set_count(const kvedge_prune_set_t *s)
{
    uint32_t n = 0;
    for (uint32_t l = 0; s && l < s->layers; l++)
        n += kvedge_prune_set_has(s, l);
    return n;
}

int kvedge_prune_set_format(const kvedge_prune_set_t *s, char *out, size_t cap)
{
    if (!s || !out || cap == 0)
        return KVEDGE_EINVAL;
    size_t used = 0;
    out[0] = '\0';
    for (uint32_t l = 0; l < s->layers; l++) {
        if (!kvedge_prune_set_has(s, l))
            continue;
        int w = snprintf(out + used, cap - used, "%s%u", used ? "," : "", l);
        if (w < 0 || (size_t)w >= cap - used) {
            out[used] = '\0';
            return KVEDGE_ENOSPACE;
        }
        used += (size_t)w;
    }
    return KVEDGE_OK;
}

int kvedge_prune_parse(const char *list, uint32_t layers, kvedge_prune_set_t *out, char *why,
                       size_t why_len)
{
    if (!out)
        return KVEDGE_EINVAL;
    kvedge_prune_set_init(out, layers);
    if (!list || layers == 0 || layers > KVEDGE_MODEL_MAX_LAYERS) {
        s_why(why, why_len, "no list, or a model of %u layers", layers);
        return KVEDGE_EINVAL;
    }
    if (!*list) {
        s_why(why, why_len, "empty list: give the layers to keep, e.g. 0,1,4");
        return KVEDGE_EINVAL;
    }
    const char *p = list;
    for (;;) {
        const char *start = p;
        uint64_t v = 0;
        while (*p >= '0' && *p <= '9') {
            if (v <= KVEDGE_MODEL_MAX_LAYERS) /* saturates: any longer number is out of range */
                v = v * 10 + (uint64_t)(*p - '0');
            p++;
        }
        if (p == start) {
            if (*p == ',' || *p == '\0')
                s_why(why, why_len, "empty item at byte %zu of '%s'", (size_t)(p - list), list);
            else
                s_why(why, why_len,
                      "'%c' at byte %zu of '%s': layers are decimal numbers separated by "
                      "commas",
                      *p, (size_t)(p - list), list);
            kvedge_prune_set_init(out, layers);
            return KVEDGE_EINVAL;
        }
        if (*p != ',' && *p != '\0') {
            s_why(why, why_len,
                  "'%c' at byte %zu of '%s': layers are decimal numbers separated by commas", *p,
                  (size_t)(p - list), list);
            kvedge_prune_set_init(out, layers);
            return KVEDGE_EINVAL;
        }
        if (v >= layers) {
            s_why(why, why_len, "layer %.*s is out of range: the model has layers 0..%u",
                  (int)(p - start), start, layers - 1);
            kvedge_prune_set_init(out, layers);
            return KVEDGE_EINVAL;
        }
        if (kvedge_prune_set_has(out, (uint32_t)v)) {
            s_why(why, why_len, "layer %llu is listed twice", (unsigned long long)v);
            kvedge_prune_set_init(out, layers);
            return KVEDGE_EINVAL;
        }
        kvedge_prune_set_add(out, (uint32_t)v);
        if (*p == '\0')
            return KVEDGE_OK;
        p++; /* the comma: an item must follow */
    }
}

int kvedge_prune_union(const char *cloud, uint32_t cloud_layers, const kvedge_prune_map_t *maps,
                       size_t n, kvedge_prune_set_t *out, char *why, size_t why_len)
{
    if (!out)
        return KVEDGE_EINVAL;
    kvedge_prune_set_init(out, cloud_layers);
    if (!cloud || (n && !maps) || cloud_layers == 0 || cloud_layers > KVEDGE_MODEL_MAX_LAYERS) {
        s_why(why, why_len, "no cloud model, no maps, or a model of %u layers", cloud_layers);
        return KVEDGE_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        const kvedge_prune_map_t *pm = &maps[i];
        const char *edge = pm->edge ? pm->edge : "?";
        if (!pm->map || !pm->cloud) {
            s_why(why, why_len, "map %zu has no record or no cloud model", i);
            kvedge_prune_set_init(out, cloud_layers);
            return KVEDGE_EINVAL;
        }
        const kvedge_master_map_t *m = pm->map;
        int rc = KVEDGE_OK;
        if (strcmp(pm->cloud, cloud) != 0) {
            s_why(why, why_len, "map/%s/%s is a map of %s, not of %s", pm->cloud, edge, pm->cloud,
                  cloud);
            rc = KVEDGE_EINVAL;
        } else if (m->cloud_layers != cloud_layers) {
            s_why(why, why_len,
                  "map/%s/%s gives %s %u layers, the model has %u: a map of another model "
                  "under that id; register it again",
                  cloud, edge, cloud, m->cloud_layers, cloud_layers);
            rc = KVEDGE_ECORRUPT;
        } else if (m->edge_layers == 0 || m->edge_layers > KVEDGE_MODEL_MAX_LAYERS) {
            s_why(why, why_len, "map/%s/%s has %u edge layers", cloud, edge, m->edge_layers);
            rc = KVEDGE_ECORRUPT;
        }
        for (uint32_t e = 0; rc == KVEDGE_OK && e < m->edge_layers; e++) {
            uint16_t f = m->from[e];
            if (f == KVEDGE_MASTER_MAP_NONE)
                continue;
            if (f >= cloud_layers) {
                s_why(why, why_len, "map/%s/%s: edge layer %u takes cloud layer %u, %s has %u",
                      cloud, edge, e, f, cloud, cloud_layers);
                rc = KVEDGE_ECORRUPT;
                break;
            }
            kvedge_prune_set_add(out, f);
        }
        if (rc != KVEDGE_OK) {
            kvedge_prune_set_init(out, cloud_layers);
            return rc;
        }
    }
    return KVEDGE_OK;
}

/* What kvedge_prune_from_view collects: each record under map/<cloud>/, parsed. */
typedef struct {
    kvedge_master_map_t *rec; /* [cap] */
    char (*edge)[KVEDGE_MASTER_MAX_MODEL_ID_BYTES + 1];
    size_t n, cap;
    int rc;
    char bad[KVEDGE_KVMSG_MAX_KEY_BYTES + 1]; /* the key that did not parse */
} s_collect_t;

static int s_collect(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    (void)seq;
    s_collect_t *c = ctx;
    kvedge_master_key_t k;
    if (kvedge_master_key_parse(key, strlen(key), &k) != KVEDGE_OK ||
        k.space != KVEDGE_MASTER_SPACE_MAP) {
        snprintf(c->bad, sizeof c->bad, "%s", key);
        c->rc = KVEDGE_EPROTO;
        return 1;
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 4;
        kvedge_master_map_t *r = realloc(c->rec, cap * sizeof *r);
        if (r)
            c->rec = r;
        char(*e)[KVEDGE_MASTER_MAX_MODEL_ID_BYTES + 1] =
            r ? realloc(c->edge, cap * sizeof *e) : NULL;
        if (e)
            c->edge = e;
        if (!r || !e) {
            c->rc = KVEDGE_ENOMEM;
            return 1;
        }
        c->cap = cap;
    }
    if (kvedge_master_map_parse(body, len, &c->rec[c->n]) != KVEDGE_OK) {
        snprintf(c->bad, sizeof c->bad, "%s", key);
        c->rc = KVEDGE_EPROTO;
        return 1;
    }
    snprintf(c->edge[c->n], sizeof c->edge[c->n], "%s", k.b);
    c->n++;
    return 0;
}

int kvedge_prune_from_view(kvedge_mview_t *v, const char *cloud, uint32_t cloud_layers,
                           kvedge_prune_set_t *out, size_t *n_maps, char *edges, size_t edges_cap,
                           char *why, size_t why_len)
{
    if (n_maps)
        *n_maps = 0;
    if (edges && edges_cap)
        edges[0] = '\0';
    if (!out)
        return KVEDGE_EINVAL;
    kvedge_prune_set_init(out, cloud_layers);
    char prefix[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    /* map/<cloud>/ and not map/<cloud>X/: the key of a map with a placeholder edge, cut. */
    if (!v || !cloud ||
        kvedge_master_key_format(KVEDGE_MASTER_SPACE_MAP, cloud, "x", prefix, sizeof prefix) !=
            KVEDGE_OK) {
        s_why(why, why_len, "'%s' is not a registry model id", cloud ? cloud : "");
        return KVEDGE_EINVAL;
    }
    prefix[strlen(prefix) - 1] = '\0';
    s_collect_t c;
    memset(&c, 0, sizeof c);
    int rc = kvedge_mview_foreach(v, prefix, s_collect, &c);
    if (rc == KVEDGE_OK)
        rc = c.rc;
    if (rc == KVEDGE_EPROTO)
        s_why(why, why_len, "%s from the master is not a valid map record", c.bad);
    else if (rc != KVEDGE_OK)
        s_why(why, why_len, "reading the maps: %s", kvedge_strerror(rc));
    else if (c.n == 0) {
        s_why(why, why_len,
              "no edge model maps %s: pruning would drop every layer (register a map with "
              "`kvedge layermap --register`, or give --layers)",
              cloud);
        rc = KVEDGE_ENOTFOUND;
    }
    kvedge_prune_map_t *pm = rc == KVEDGE_OK ? calloc(c.n, sizeof *pm) : NULL;
    if (rc == KVEDGE_OK && !pm)
        rc = KVEDGE_ENOMEM;
    for (size_t i = 0; rc == KVEDGE_OK && i < c.n; i++)
        pm[i] = (kvedge_prune_map_t){cloud, c.edge[i], &c.rec[i]};
    if (rc == KVEDGE_OK)
        rc = kvedge_prune_union(cloud, cloud_layers, pm, c.n, out, why, why_len);
    if (rc == KVEDGE_OK && kvedge_prune_set_count(out) == 0) {
        s_why(why, why_len,
              "the %zu map%s of %s use%s none of its layers: pruning would drop every layer", c.n,
              c.n == 1 ? "" : "s", cloud, c.n == 1 ? "s" : "");
        rc = KVEDGE_ENOTFOUND;
    }
    if (rc == KVEDGE_OK) {
        if (n_maps)
            *n_maps = c.n;
        size_t used = 0;
        for (size_t i = 0; edges && edges_cap && i < c.n; i++) {
            int w = snprintf(edges + used, edges_cap - used, "%s%s", i ? "," : "", c.edge[i]);
            if (w < 0 || (size_t)w >= edges_cap - used) {
                edges[used] = '\0';
                break;
            }
            used += (size_t)w;
        }
    } else {
        kvedge_prune_set_init(out, cloud_layers);
    }
    free(pm);
    free(c.edge);
    free(c.rec);
    return rc;
}
