/* Transport rules both ends share: which endpoints count as loopback, and tenant
 * namespacing of chunk ids. */
#include "access/transport.h"

#include <sodium.h>
#include <string.h>

void kvedge_tenant_tag(const char *tenant, uint8_t tag[16])
{
    static const char domain[] = "kvedge.tenant.v1";
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 16);
    crypto_generichash_update(&st, (const uint8_t *)domain, sizeof domain - 1);
    crypto_generichash_update(&st, (const uint8_t *)tenant, strlen(tenant));
    crypto_generichash_final(&st, tag, 16);
}

void kvedge_tenant_chunk_id(const uint8_t tag[16], const kvedge_chunk_id_t *client_id,
                            kvedge_chunk_id_t *stored)
{
    static const char domain[] = "kvedge.ns.v1";
    crypto_generichash_state st;
    crypto_generichash_init(&st, tag, 16, KVEDGE_CHUNK_ID_BYTES);
    crypto_generichash_update(&st, (const uint8_t *)domain, sizeof domain - 1);
    crypto_generichash_update(&st, client_id->bytes, KVEDGE_CHUNK_ID_BYTES);
    crypto_generichash_final(&st, stored->bytes, KVEDGE_CHUNK_ID_BYTES);
}

bool kvedge_endpoint_is_loopback(const char *ep)
{
    if (!ep)
        return false;
    if (strncmp(ep, "ipc://", 6) == 0 || strncmp(ep, "inproc://", 9) == 0)
        return true;
    if (strncmp(ep, "tcp://", 6) != 0)
        return false;
    const char *host = ep + 6;
    return strncmp(host, "127.", 4) == 0 || strncmp(host, "localhost:", 10) == 0 ||
           strncmp(host, "[::1]:", 6) == 0;
}
