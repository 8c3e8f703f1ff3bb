/* Says why a source that should hold a context answers "not found": the proxy's certificate is
 * allowlisted on it under another tenant than the context was stored under (tenants never see
 * each other's entries, so every layer then falls back and is computed locally). */
#ifndef KVEDGE_PROXY_TENANT_HINT_H
#define KVEDGE_PROXY_TENANT_HINT_H

#include <stdint.h>

#include "proxy/proxy_impl.h"
#include "access/codec/chunk.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Hint lines per source in any window of this length; the next line counts those held back. */
#define KVEDGE_PROXY_TENANT_HINT_MS 60000

/* Source `source` answered "not found" for layer `layer` of the nchunks chunks. When the
 * master's block directory says that source holds that layer of every one of them, logs at
 * warn that the proxy's tenant is the likely cause, naming the source, the last chunk and the
 * proxy's certificate; at most one line per source per KVEDGE_PROXY_TENANT_HINT_MS.
 * Returns true when the directory disagrees with the source (whether or not a line was
 * written). No-op without a master view. Actor only. */
bool kvedge_proxy_tenant_hint(kvedge_proxy_impl_t *p, const char *source,
                              const kvedge_chunk_id_t *chunks, uint32_t nchunks, uint32_t layer);

#ifdef __cplusplus
}
#endif
#endif
