/* Transport constants and rules that both ends of the protocol (store node, master, proxy,
 * client) share: heartbeats, handshake and ZAP settings, the loopback rule for plaintext, and
 * tenant namespacing of chunk ids. */
#ifndef KVEDGE_ACCESS_TRANSPORT_H
#define KVEDGE_ACCESS_TRANSPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "access/codec/chunk.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_HEARTBEAT_IVL_MS     1000
#define KVEDGE_HEARTBEAT_TIMEOUT_MS 5000
#define KVEDGE_HANDSHAKE_MS                                                                        \
    3000 /* a peer that has not finished ZMTP/CURVE by then                                        \
          * is dropped (garbage, stalled handshakes) */
#define KVEDGE_ZAP_DOMAIN      "kvedge"
#define KVEDGE_LOOPBACK_TENANT "loopback"

/* True for endpoints that cannot be reached from another host: tcp on 127.0.0.0/8,
 * localhost or [::1], ipc://, inproc://. */
bool kvedge_endpoint_is_loopback(const char *endpoint);

/* Whether a daemon could bind endpoint now: binds a plain socket to a tcp:// address (with
 * SO_REUSEADDR, as libzmq binds) and lets it go; for ipc://, whether a process already accepts
 * on the path (libzmq would take the path over from it). Port 0 or "*" and endpoints it cannot
 * resolve (an interface name, another transport) pass: the real bind says. For a daemon that
 * checks every endpoint it will take before it creates or joins anything. Returns 0,
 * KVEDGE_ELOCKED (in use: why names the endpoint and the system's reason) or KVEDGE_EIO (cannot
 * bind for another reason, e.g. an address of no interface here). An endpoint in use is tried
 * again for up to KVEDGE_PROBE_GRACE_MS: libzmq lets a closed socket's listener go a moment
 * after zmq_close returns, so a daemon restarted at once (in the same process, say) finds it
 * free. */
int kvedge_endpoint_probe(const char *endpoint, char *why, size_t why_len);

#define KVEDGE_PROBE_GRACE_MS 1000

/* Tenant tag (16 bytes) of a tenant name, and a client chunk id namespaced into a tenant. */
void kvedge_tenant_tag(const char *tenant, uint8_t tag[16]);
void kvedge_tenant_chunk_id(const uint8_t tag[16], const kvedge_chunk_id_t *client_id,
                            kvedge_chunk_id_t *stored);

#ifdef __cplusplus
}
#endif
#endif
