/* A raw client of a Storage Master's ROUTER for the etcd tests and the failover bench: one
 * request (STATUS, SET, ICANHAZ, HEARTBEAT) on a fresh DEALER, its answer read with a deadline
 * (a snapshot: every KVSYNC up to KTHXBAI). No cmocka: callers assert on what it returns. */
#ifndef KVEDGE_TESTS_MASTER_MCLIENT_H
#define KVEDGE_TESTS_MASTER_MCLIENT_H

#include <cjson/cJSON.h>
#include <czmq.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "runtime/kvmsg.h"
#include "access/codec/error.h"
#include "access/codec/model.h"

typedef struct {
    int cmd;                                    /* the final reply: OK, ERR, KTHXBAI */
    int status;                                 /* ERR */
    uint64_t seq;                               /* OK, KTHXBAI */
    uint64_t registry;                          /* KTHXBAI */
    uint32_t synced;                            /* KVSYNC messages before KTHXBAI */
    char body[KVEDGE_KVMSG_MAX_BODY_BYTES + 1]; /* ERR: reason; OK of STATUS: the JSON */
    size_t body_len;
} kt_mreply_t;

/* Sends one request to the master at ep and waits up to timeout_ms for its answer. Returns 0,
 * or -1 when nothing (complete) came back. on_sync (may be NULL) sees each KVSYNC's key. */
static inline int kt_master_call(const char *ep, kvedge_kvmsg_cmd_t cmd, const char *key,
                                 const void *body, size_t len, int timeout_ms, kt_mreply_t *out,
                                 void (*on_sync)(void *ctx, const char *key), void *ctx)
{
    static uint64_t rid = 1;
    memset(out, 0, sizeof *out);
    zsock_t *d = zsock_new(ZMQ_DEALER);
    if (!d)
        return -1;
    zsock_set_linger(d, 0);
    zsock_set_rcvtimeo(d, timeout_ms);
    if (zsock_connect(d, "%s", ep) != 0) {
        zsock_destroy(&d);
        return -1;
    }
    kvedge_kvmsg_t k = {.cmd = cmd,
                        .key = (const uint8_t *)key,
                        .key_len = key ? strlen(key) : 0,
                        .body = body,
                        .body_len = len,
                        .rid = rid++};
    kvedge_kvmsg_buf_t buf;
    kvedge_wire_frame_t f[KVEDGE_KVMSG_MAX_FRAMES];
    size_t n = 0;
    int rc = -1;
    if (kvedge_kvmsg_pack(&k, &buf, f, &n) == 0) {
        zmsg_t *m = zmsg_new();
        for (size_t i = 0; i < n; i++)
            zmsg_addmem(m, f[i].data, f[i].len);
        if (zmsg_send(&m, d) != 0)
            zmsg_destroy(&m);
        for (;;) {
            zmsg_t *r = zmsg_recv(d);
            if (!r)
                break;
            kvedge_wire_frame_t rf[KVEDGE_KVMSG_MAX_FRAMES];
            size_t rn = 0;
            for (zframe_t *fr = zmsg_first(r); fr && rn < KVEDGE_KVMSG_MAX_FRAMES;
                 fr = zmsg_next(r))
                rf[rn++] = (kvedge_wire_frame_t){zframe_data(fr), zframe_size(fr)};
            kvedge_kvmsg_t a;
            bool done = false;
            if (kvedge_kvmsg_parse(rf, rn, &a) == 0 && a.rid == k.rid) {
                if (a.cmd == KVEDGE_KVMSG_KVSYNC) {
                    out->synced++;
                    if (on_sync) {
                        char kk[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
                        snprintf(kk, sizeof kk, "%.*s", (int)a.key_len, (const char *)a.key);
                        on_sync(ctx, kk);
                    }
                } else {
                    out->cmd = a.cmd;
                    out->status = a.status;
                    out->seq = a.seq;
                    out->registry = a.registry;
                    out->body_len = a.body_len < KVEDGE_KVMSG_MAX_BODY_BYTES
                                        ? a.body_len
                                        : KVEDGE_KVMSG_MAX_BODY_BYTES;
                    if (out->body_len)
                        memcpy(out->body, a.body, out->body_len);
                    out->body[out->body_len] = '\0';
                    done = true;
                    rc = 0;
                }
            }
            zmsg_destroy(&r);
            if (done)
                break;
        }
    }
    zsock_destroy(&d);
    return rc;
}

/* STATUS's role ("leader", "standby", ...) into role (cap bytes); false without an answer. */
static inline bool kt_master_role(const char *ep, char *role, size_t cap, int timeout_ms)
{
    kt_mreply_t r;
    role[0] = '\0';
    if (kt_master_call(ep, KVEDGE_KVMSG_STATUS, NULL, NULL, 0, timeout_ms, &r, NULL, NULL) != 0 ||
        r.cmd != KVEDGE_KVMSG_OK)
        return false;
    cJSON *o = cJSON_Parse(r.body);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "role");
    if (cJSON_IsString(v))
        snprintf(role, cap, "%s", v->valuestring);
    cJSON_Delete(o);
    return role[0] != '\0';
}

/* A model record named id (opt-125m's shape). */
static inline size_t kt_model_body(const char *id, uint8_t out[KVEDGE_MASTER_RECORD_MAX_BYTES])
{
    kvedge_model_t m;
    size_t len = 0;
    if (kvedge_model_builtin("opt-125m", &m) != 0)
        return 0;
    snprintf(m.id, sizeof m.id, "%s", id);
    return kvedge_master_model_pack(&m, out, &len) == 0 ? len : 0;
}

#endif
