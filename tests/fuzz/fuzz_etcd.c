/* Fuzz target for the etcd client's reply decoder (store/master/etcd.c), the master's parser of
 * bytes from the network: kvedge_etcd_decode. Built with libFuzzer (KVEDGE_FUZZ=ON, clang) it
 * fuzzes; built normally it replays the committed corpus (tests/fuzz/corpus/etcd).
 *
 * Input: byte 0 picks the HTTP status (even: 200, else 400 + byte 0); the rest is the reply
 * body, copied into an exact-size buffer so ASan sees any read past it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store/master/etcd.h"
#include "access/codec/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The decoder must hold its own contract: anything else is a bug worth a crash. */
static void s_require(bool ok)
{
    if (!ok)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    long http = data[0] % 2 == 0 ? 200 : 400 + data[0];
    size_t len = size - 1;
    char *body = malloc(len ? len : 1);
    if (!body)
        return 0;
    memcpy(body, data + 1, len);
    kvedge_etcd_reply_t r;
    char why[256];
    why[0] = '\0';
    int rc = kvedge_etcd_decode(body, len, http, &r, why, sizeof why);
    if (rc == KVEDGE_OK) {
        s_require(http == 200);
        s_require(r.n_kvs <= KVEDGE_ETCD_MAX_KVS && r.n_members <= KVEDGE_ETCD_MAX_MEMBERS);
        for (size_t i = 0; i < r.n_kvs; i++) {
            s_require(r.kvs[i].key && strlen(r.kvs[i].key) == r.kvs[i].key_len);
            s_require(r.kvs[i].value || r.kvs[i].value_len == 0);
        }
        for (size_t i = 0; i < r.n_members; i++)
            s_require(r.members[i].n_client <= KVEDGE_ETCD_MAX_URLS &&
                      r.members[i].n_peer <= KVEDGE_ETCD_MAX_URLS);
        s_require(memchr(r.version, 0, sizeof r.version) != NULL);
    } else {
        /* A refusal: a known code, a reason, and nothing held. */
        s_require(rc == KVEDGE_EPROTO || rc == KVEDGE_ETOOBIG || rc == KVEDGE_ECLOSED ||
                  rc == KVEDGE_ETIMEDOUT || rc == KVEDGE_ENOTFOUND || rc == KVEDGE_EBUSY ||
                  rc == KVEDGE_ENOSPC || rc == KVEDGE_EINVAL || rc == KVEDGE_EIO ||
                  rc == KVEDGE_ENOMEM);
        s_require(why[0] != '\0' && r.kvs == NULL && r.n_kvs == 0 && r.n_members == 0);
    }
    kvedge_etcd_reply_free(&r);
    s_require(r.kvs == NULL && r.n_kvs == 0);
    free(body);
    return 0;
}
