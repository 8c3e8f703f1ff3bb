/* A small etcd v3 client for the Storage Master (docs/master.md, "Masters on etcd"): etcd's
 * JSON gateway (POST /v3/...) over libcurl, keys and values base64, replies decoded with cJSON.
 * One client is used by one thread at a time. Every call has a deadline and every reply a size
 * bound; a reply that is not etcd's JSON is KVEDGE_EPROTO with a reason naming the endpoint. */
#ifndef KVEDGE_STORE_MASTER_ETCD_H
#define KVEDGE_STORE_MASTER_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_ETCD_TIMEOUT_MS      1000       /* a whole call, every endpoint tried included */
#define KVEDGE_ETCD_CONNECT_MS      300        /* one TCP connect */
#define KVEDGE_ETCD_MAX_REPLY_BYTES (8u << 20) /* a larger reply is refused (KVEDGE_ETOOBIG) */
#define KVEDGE_ETCD_PAGE_KEYS       64         /* keys per range page: 64 x 64 KiB < the bound */
#define KVEDGE_ETCD_MAX_ENDPOINTS   16
#define KVEDGE_ETCD_MAX_MEMBERS     16 /* members kept from a member list */
#define KVEDGE_ETCD_MAX_URLS        4  /* client/peer URLs kept per member */
#define KVEDGE_ETCD_URL_BYTES       256
#define KVEDGE_ETCD_MAX_KVS         4096 /* key-values kept from one reply */

typedef struct kvedge_etcd_t kvedge_etcd_t;

typedef struct {
    char *key; /* NUL-terminated (keys are text); value may hold any bytes */
    size_t key_len;
    uint8_t *value;
    size_t value_len;
    int64_t lease;
    int64_t create_rev;
    int64_t mod_rev;
} kvedge_etcd_kv_t;

typedef struct {
    char id[24]; /* decimal */
    char name[64];
    char client_urls[KVEDGE_ETCD_MAX_URLS][KVEDGE_ETCD_URL_BYTES];
    size_t n_client;
    char peer_urls[KVEDGE_ETCD_MAX_URLS][KVEDGE_ETCD_URL_BYTES];
    size_t n_peer;
} kvedge_etcd_member_t;

/* One decoded reply. kvs are those of a range, or of the ranges inside a txn's responses. */
typedef struct {
    int64_t revision; /* header.revision */
    kvedge_etcd_kv_t *kvs;
    size_t n_kvs;
    bool more;        /* range: more keys past the limit */
    bool succeeded;   /* txn: the compares held */
    int64_t id;       /* lease grant / keepalive: the lease */
    int64_t ttl;      /* lease grant / keepalive: seconds left; 0 = the lease is gone */
    char version[32]; /* status: etcd's version */
    int64_t db_size;  /* status: the backend's size on disk, bytes */
    kvedge_etcd_member_t members[KVEDGE_ETCD_MAX_MEMBERS];
    size_t n_members;
} kvedge_etcd_reply_t;

/* Frees what a reply holds and zeroes it. NULL-safe. */
void kvedge_etcd_reply_free(kvedge_etcd_reply_t *r);

/* Decodes one reply body of the gateway (untrusted bytes: the fuzz target's entry). http is
 * the HTTP status (200 for success). On failure *out is zeroed and why says why. Errors:
 * KVEDGE_EPROTO (not etcd's JSON: not JSON, no header, a field of the wrong type),
 * KVEDGE_ETOOBIG (over KVEDGE_ETCD_MAX_REPLY_BYTES or KVEDGE_ETCD_MAX_KVS), and the errors etcd
 * reports, mapped: KVEDGE_ECLOSED (etcdserver: no leader), KVEDGE_ETIMEDOUT (request timed out),
 * KVEDGE_ENOTFOUND (lease not found), KVEDGE_EBUSY (too many requests), KVEDGE_ENOSPC (database
 * space exceeded), KVEDGE_EINVAL (invalid argument), KVEDGE_EIO (any other). */
int kvedge_etcd_decode(const char *body, size_t len, long http, kvedge_etcd_reply_t *out, char *why,
                       size_t why_len);

/* A client for "URL[,URL...]" (http://HOST:PORT each). timeout_ms: each call's deadline (0 =
 * KVEDGE_ETCD_TIMEOUT_MS). No I/O. Caller owns *out. Errors: KVEDGE_EINVAL (empty list, a URL
 * that is not http(s)://, too many), KVEDGE_ENOMEM. */
int kvedge_etcd_new(const char *endpoints, uint32_t timeout_ms, kvedge_etcd_t **out, char *why,
                    size_t why_len);

/* NULL-safe, idempotent. */
void kvedge_etcd_destroy(kvedge_etcd_t **self_p);

/* The endpoint calls go to first (the last one that answered). */
const char *kvedge_etcd_endpoint(const kvedge_etcd_t *e);

/* The endpoint list as given. */
size_t kvedge_etcd_endpoints(const kvedge_etcd_t *e, const char **out, size_t cap);

/* Calls answered by etcd (its errors included) and calls that got no etcd answer. */
void kvedge_etcd_counts(const kvedge_etcd_t *e, uint64_t *ok, uint64_t *failed);

/* Every call below tries the endpoints in turn from the current one and sticks to the one that
 * answers; an endpoint that is unreachable, not etcd, or has no leader makes it go on to the
 * next. Errors besides those of kvedge_etcd_decode: KVEDGE_ECLOSED (no endpoint reachable),
 * KVEDGE_ETIMEDOUT (the deadline passed), KVEDGE_EINVAL (bad arguments), KVEDGE_ENOMEM. On
 * success the caller frees *out with kvedge_etcd_reply_free. */

/* /v3/maintenance/status: the endpoint is etcd (out->version). */
int kvedge_etcd_status(kvedge_etcd_t *e, kvedge_etcd_reply_t *out, char *why, size_t why_len);

/* /v3/cluster/member/list. */
int kvedge_etcd_members(kvedge_etcd_t *e, kvedge_etcd_reply_t *out, char *why, size_t why_len);

/* One key: out->n_kvs is 0 or 1. */
int kvedge_etcd_get(kvedge_etcd_t *e, const char *key, kvedge_etcd_reply_t *out, char *why,
                    size_t why_len);

/* Every key starting with prefix, in key order, page_keys at a time (0 = KVEDGE_ETCD_PAGE_KEYS,
 * at most KVEDGE_ETCD_MAX_KVS; size it so that a page of the largest values stays under
 * KVEDGE_ETCD_MAX_REPLY_BYTES), every page read at one revision. cb returns 0 to go on; another
 * value stops and is returned. cb may make calls on e between pages. */
typedef int (*kvedge_etcd_kv_fn)(void *ctx, const kvedge_etcd_kv_t *kv);
int kvedge_etcd_range_prefix(kvedge_etcd_t *e, const char *prefix, size_t page_keys,
                             kvedge_etcd_kv_fn cb, void *ctx, char *why, size_t why_len);

/* lease 0: none. */
int kvedge_etcd_put(kvedge_etcd_t *e, const char *key, const void *value, size_t len, int64_t lease,
                    char *why, size_t why_len);
int kvedge_etcd_delete(kvedge_etcd_t *e, const char *key, char *why, size_t why_len);

typedef enum {
    KVEDGE_ETCD_CMP_CREATE = 1, /* create_revision(key) == value (0: the key does not exist) */
    KVEDGE_ETCD_CMP_LEASE,      /* lease(key) == value */
} kvedge_etcd_cmp_kind_t;

typedef struct {
    kvedge_etcd_cmp_kind_t kind;
    const char *key;
    int64_t value;
} kvedge_etcd_cmp_t;

typedef enum {
    KVEDGE_ETCD_OP_PUT = 1,
    KVEDGE_ETCD_OP_DELETE,
    KVEDGE_ETCD_OP_GET,
} kvedge_etcd_op_kind_t;

typedef struct {
    kvedge_etcd_op_kind_t kind;
    const char *key;
    const void *value; /* PUT */
    size_t value_len;
    int64_t lease; /* PUT; 0 = none */
} kvedge_etcd_op_t;

/* /v3/kv/txn: if every compare holds, the success ops, else the failure ops; out->succeeded
 * says which (the kvs of GET ops are in out->kvs). */
int kvedge_etcd_txn(kvedge_etcd_t *e, const kvedge_etcd_cmp_t *cmp, size_t ncmp,
                    const kvedge_etcd_op_t *ok_ops, size_t nok, const kvedge_etcd_op_t *fail_ops,
                    size_t nfail, kvedge_etcd_reply_t *out, char *why, size_t why_len);

/* Leases. grant: ttl_s seconds, *id receives the lease. keepalive: *ttl receives the seconds
 * left (0: the lease is gone). revoke: deletes the lease and every key attached to it. */
int kvedge_etcd_lease_grant(kvedge_etcd_t *e, int64_t ttl_s, int64_t *id, char *why,
                            size_t why_len);
int kvedge_etcd_lease_keepalive(kvedge_etcd_t *e, int64_t id, int64_t *ttl, char *why,
                                size_t why_len);
int kvedge_etcd_lease_revoke(kvedge_etcd_t *e, int64_t id, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif
