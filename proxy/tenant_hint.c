/* The tenant hint: a source the directory says holds a chunk answers "not found" for it. */
#include "proxy/tenant_hint.h"

#include <stdio.h>
#include <string.h>

#include "runtime/log.h"
#include "runtime/mview.h"
#include "access/codec/clock.h"

/* One line per source and window; at most 16 sources' lines in a window in all. */
static kvedge_log_limit_t s_lines = KVEDGE_LOG_LIMIT_INIT(KVEDGE_PROXY_TENANT_HINT_MS, 1, 16);

bool kvedge_proxy_tenant_hint(kvedge_proxy_impl_t *p, const char *source,
                              const kvedge_chunk_id_t *chunks, uint32_t nchunks, uint32_t layer)
{
    if (!p || !p->view || !source || !chunks || nchunks == 0)
        return false;
    for (uint32_t c = 0; c < nchunks; c++) {
        kvedge_master_dir_t d;
        if (kvedge_mview_dir(p->view, source, &chunks[c], &d) != KVEDGE_OK ||
            !kvedge_master_dir_has(&d, layer))
            return false; /* the directory agrees, or does not know: an ordinary miss */
    }
    uint64_t held = 0;
    if (kvedge_log_level() < KVEDGE_LOG_WARN ||
        !kvedge_log_limit_allow(&s_lines, source, kvedge_mono_ms(), &held))
        return true;
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES], cert[512] = "none: plaintext";
    if (p->cert_path) { /* the public certificate: what gets copied into allowlists */
        size_t n = strlen(p->cert_path);
        bool secret = n > 7 && strcmp(p->cert_path + n - 7, "_secret") == 0;
        snprintf(cert, sizeof cert, "%.*s", (int)(secret ? n - 7 : n), p->cert_path);
    }
    char more[96] = "";
    if (held)
        snprintf(more, sizeof more, " (%llu more such answers since the last line)",
                 (unsigned long long)held);
    kvedge_log_warn("source %s holds chunk %s (layer %u) according to the directory but not in "
                    "this proxy's tenant: is the proxy's certificate (%s) allowlisted with the "
                    "tenant the context was stored under?%s",
                    source, kvedge_chunk_id_hex(&chunks[nchunks - 1], hex), layer, cert, more);
    return true;
}
