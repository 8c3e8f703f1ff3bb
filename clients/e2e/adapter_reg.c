/* An adapter file registered with the Storage Master (docs/largesmall.md, "Registering an
 * adapter"): its digest, the record the master keeps under adapter/<cloud>/<edge>, and the edge's
 * check of a file against that record and the pair's current layer map. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "clients/e2e/adapter.h"
#include "access/codec/error.h"

static int s_why(char *why, size_t why_len, int rc, const char *fmt, ...)
{
    if (why && why_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* The digest and size of the file's bytes. */
static int s_digest(const char *path, uint8_t digest[KVEDGE_MASTER_DIGEST_BYTES], uint64_t *size,
                    char *why, size_t why_len)
{
    if (sodium_init() < 0)
        return s_why(why, why_len, KVEDGE_ENOMEM, "%s: libsodium does not start", path);
    FILE *f = fopen(path, "rb");
    if (!f)
        return s_why(why, why_len, KVEDGE_EIO, "%s: %s", path, strerror(errno));
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, KVEDGE_MASTER_DIGEST_BYTES);
    uint8_t buf[1 << 16];
    uint64_t n = 0;
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0 && n <= KVEDGE_MASTER_ADAPTER_MAX_SIZE) {
        crypto_generichash_update(&st, buf, got);
        n += got;
    }
    int err = ferror(f) ? errno : 0;
    fclose(f);
    if (err)
        return s_why(why, why_len, KVEDGE_EIO, "%s: %s", path, strerror(err));
    if (n > KVEDGE_MASTER_ADAPTER_MAX_SIZE)
        return s_why(why, why_len, KVEDGE_ETOOBIG, "%s: over %llu bytes", path,
                     (unsigned long long)KVEDGE_MASTER_ADAPTER_MAX_SIZE);
    crypto_generichash_final(&st, digest, KVEDGE_MASTER_DIGEST_BYTES);
    *size = n;
    return KVEDGE_OK;
}

int kvedge_adapter_load_digest(const char *path, kvedge_adapter_t **out,
                               uint8_t digest[KVEDGE_MASTER_DIGEST_BYTES], uint64_t *size,
                               char *why, size_t why_len)
{
    if (!path || !out || !digest || !size)
        return KVEDGE_EINVAL;
    *out = NULL;
    uint8_t again[KVEDGE_MASTER_DIGEST_BYTES];
    uint64_t n2 = 0;
    int rc = s_digest(path, digest, size, why, why_len);
    if (rc == KVEDGE_OK)
        rc = kvedge_adapter_load(path, out, why, why_len);
    if (rc == KVEDGE_OK)
        rc = s_digest(path, again, &n2, why, why_len);
    if (rc == KVEDGE_OK && (n2 != *size || sodium_memcmp(again, digest, sizeof again) != 0))
        rc = s_why(why, why_len, KVEDGE_ECORRUPT, "%s: changed while it was read", path);
    if (rc != KVEDGE_OK)
        kvedge_adapter_destroy(out);
    return rc;
}

static kvedge_master_fit_t s_fit(const kvedge_adapter_info_t *i)
{
    const char *name = kvedge_adapter_fit_name(i);
    if (strcmp(name, "heads") == 0)
        return KVEDGE_MASTER_FIT_HEADS;
    if (strcmp(name, "least-squares") == 0)
        return KVEDGE_MASTER_FIT_LEAST_SQUARES;
    if (strcmp(name, "distilled") == 0)
        return KVEDGE_MASTER_FIT_DISTILLED;
    return KVEDGE_MASTER_FIT_LINEAR;
}

int kvedge_adapter_to_master(const kvedge_adapter_t *a,
                             const uint8_t digest[KVEDGE_MASTER_DIGEST_BYTES], uint64_t size,
                             kvedge_master_adapter_t *out, char *why, size_t why_len)
{
    if (!a || !digest || !out || size == 0)
        return KVEDGE_EINVAL;
    memset(out, 0, sizeof *out);
    const kvedge_adapter_info_t *i = kvedge_adapter_info(a);
    if (i->cloud_layers > KVEDGE_MODEL_MAX_LAYERS || i->edge_layers > KVEDGE_MODEL_MAX_LAYERS)
        return s_why(why, why_len, KVEDGE_ETOOBIG, "over %u layers: no registry record holds it",
                     KVEDGE_MODEL_MAX_LAYERS);
    if (size > KVEDGE_MASTER_ADAPTER_MAX_SIZE)
        return s_why(why, why_len, KVEDGE_ETOOBIG, "a file over %llu bytes",
                     (unsigned long long)KVEDGE_MASTER_ADAPTER_MAX_SIZE);
    char rope[2][512];
    kvedge_adapter_rope_format(&i->cloud_rope, rope[0], sizeof rope[0]);
    kvedge_adapter_rope_format(&i->edge_rope, rope[1], sizeof rope[1]);
    if (strlen(rope[0]) > KVEDGE_MASTER_ROPE_MAX_BYTES ||
        strlen(rope[1]) > KVEDGE_MASTER_ROPE_MAX_BYTES)
        return s_why(why, why_len, KVEDGE_ESHAPE, "a rotary setting over %u bytes",
                     KVEDGE_MASTER_ROPE_MAX_BYTES);
    memcpy(out->digest, digest, KVEDGE_MASTER_DIGEST_BYTES);
    out->size = size;
    out->fit = s_fit(i);
    out->cloud_layers = (uint16_t)i->cloud_layers;
    out->edge_layers = (uint16_t)i->edge_layers;
    for (uint32_t e = 0; e < i->edge_layers; e++) {
        const int32_t c = kvedge_adapter_from(a, e);
        out->from[e] = c == KVEDGE_LAYERMAP_NONE ? KVEDGE_MASTER_MAP_NONE : (uint16_t)c;
    }
    snprintf(out->cloud_rope, sizeof out->cloud_rope, "%s", rope[0]);
    snprintf(out->edge_rope, sizeof out->edge_rope, "%s", rope[1]);
    return KVEDGE_OK;
}

/* "0,1,4" ("-" for none) into out. */
static void s_from_text(uint16_t layers, const uint16_t *from, char *out, size_t cap)
{
    size_t k = 0;
    out[0] = '\0';
    for (uint32_t e = 0; e < layers && k + 8 < cap; e++) {
        if (from[e] == KVEDGE_MASTER_MAP_NONE)
            k += (size_t)snprintf(out + k, cap - k, "%s-", e ? "," : "");
        else
            k += (size_t)snprintf(out + k, cap - k, "%s%u", e ? "," : "", from[e]);
    }
    if (k + 8 >= cap && cap > 4)
        snprintf(out + cap - 4, 4, "...");
}

static bool s_same_map(uint16_t cl, uint16_t el, const uint16_t *from, uint16_t cl2, uint16_t el2,
                       const uint16_t *from2)
{
    return cl == cl2 && el == el2 && memcmp(from, from2, (size_t)el * sizeof *from) == 0;
}

int kvedge_adapter_check_registered(const kvedge_adapter_t *a,
                                    const uint8_t digest[KVEDGE_MASTER_DIGEST_BYTES], uint64_t size,
                                    const kvedge_master_adapter_t *rec,
                                    const kvedge_master_map_t *map, char *why, size_t why_len)
{
    if (!a || !digest)
        return KVEDGE_EINVAL;
    const kvedge_adapter_info_t *i = kvedge_adapter_info(a);
    if (!rec)
        return s_why(why, why_len, KVEDGE_ENOTFOUND, "no adapter is registered for %s -> %s",
                     i->cloud_id, i->edge_id);
    if (rec->size != size || sodium_memcmp(rec->digest, digest, KVEDGE_MASTER_DIGEST_BYTES) != 0)
        return s_why(why, why_len, KVEDGE_ECORRUPT,
                     "the file is not the registered adapter of %s -> %s (%llu bytes, the "
                     "registered one %llu; the digests differ%s)",
                     i->cloud_id, i->edge_id, (unsigned long long)size,
                     (unsigned long long)rec->size, rec->size == size ? "" : " too");
    /* The same bytes: the record describes this file unless it was written by hand. */
    kvedge_master_adapter_t *mine = malloc(sizeof *mine);
    if (!mine)
        return KVEDGE_ENOMEM;
    int rc = kvedge_adapter_to_master(a, digest, size, mine, why, why_len);
    if (rc == KVEDGE_OK &&
        (mine->fit != rec->fit || strcmp(mine->cloud_rope, rec->cloud_rope) != 0 ||
         strcmp(mine->edge_rope, rec->edge_rope) != 0 ||
         !s_same_map(mine->cloud_layers, mine->edge_layers, mine->from, rec->cloud_layers,
                     rec->edge_layers, rec->from)))
        rc = s_why(why, why_len, KVEDGE_ECORRUPT,
                   "the registered record of %s -> %s has the file's digest but not its fit, map "
                   "or rotary settings",
                   i->cloud_id, i->edge_id);
    free(mine);
    if (rc != KVEDGE_OK)
        return rc;
    if (!map)
        return s_why(why, why_len, KVEDGE_EEXPIRED,
                     "the registered adapter of %s -> %s is stale: no layer map is registered for "
                     "the pair",
                     i->cloud_id, i->edge_id);
    if (!s_same_map(rec->cloud_layers, rec->edge_layers, rec->from, map->cloud_layers,
                    map->edge_layers, map->from)) {
        char was[96], now[96];
        s_from_text(rec->edge_layers, rec->from, was, sizeof was);
        s_from_text(map->edge_layers, map->from, now, sizeof now);
        return s_why(why, why_len, KVEDGE_EEXPIRED,
                     "the registered adapter of %s -> %s is stale: fitted with the map %s (%u "
                     "cloud layers), the registered map is %s (%u)",
                     i->cloud_id, i->edge_id, was, rec->cloud_layers, now, map->cloud_layers);
    }
    return KVEDGE_OK;
}
