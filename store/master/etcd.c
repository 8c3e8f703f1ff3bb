/* The etcd v3 client over the JSON gateway: requests built with cJSON, POSTed with libcurl
 * (deadline and size bound on every call), replies decoded by kvedge_etcd_decode. */
#include "store/master/etcd.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "access/codec/error.h"
#include "access/codec/why.h"

struct kvedge_etcd_t {
    CURL *curl;
    struct curl_slist *headers;
    char *eps[KVEDGE_ETCD_MAX_ENDPOINTS]; /* without a trailing '/' */
    size_t n_eps;
    size_t cur; /* the endpoint that answered last */
    uint32_t timeout_ms;
    uint64_t ok, failed;
};

/* ---------------------------------------------------------------- decoding */

void kvedge_etcd_reply_free(kvedge_etcd_reply_t *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n_kvs; i++) {
        free(r->kvs[i].key);
        free(r->kvs[i].value);
    }
    free(r->kvs);
    memset(r, 0, sizeof *r);
}

/* An int64 as the gateway writes it (a decimal string) or as a JSON number; absent = 0. */
static bool s_int(const cJSON *o, const char *name, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    *out = 0;
    if (!v)
        return true;
    if (cJSON_IsNumber(v)) {
        if (v->valuedouble < -9.2e18 || v->valuedouble > 9.2e18)
            return false;
        *out = (int64_t)v->valuedouble;
        return true;
    }
    if (!cJSON_IsString(v) || !v->valuestring[0])
        return false;
    errno = 0;
    char *end = NULL;
    long long x = strtoll(v->valuestring, &end, 10);
    if (errno || *end)
        return false;
    *out = (int64_t)x;
    return true;
}

static bool s_bool(const cJSON *o, const char *name, bool *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    *out = false;
    if (!v)
        return true;
    if (!cJSON_IsBool(v))
        return false;
    *out = cJSON_IsTrue(v);
    return true;
}

/* Base64 (ORIGINAL) text into a fresh buffer with a NUL after it. */
static int s_unb64(const char *s, uint8_t **out, size_t *len)
{
    size_t sl = strlen(s);
    uint8_t *b = malloc(sl / 4 * 3 + 4);
    if (!b)
        return KVEDGE_ENOMEM;
    size_t n = 0;
    const char *end = NULL;
    if (sodium_base642bin(b, sl / 4 * 3 + 3, s, sl, NULL, &n, &end,
                          sodium_base64_VARIANT_ORIGINAL) != 0 ||
        (end && *end)) {
        free(b);
        return KVEDGE_EPROTO;
    }
    b[n] = 0;
    *out = b;
    *len = n;
    return KVEDGE_OK;
}

static int s_kv(const cJSON *o, kvedge_etcd_kv_t *kv)
{
    memset(kv, 0, sizeof *kv);
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(o, "key");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "value");
    if (!cJSON_IsObject(o) || !cJSON_IsString(k) || (v && !cJSON_IsString(v)))
        return KVEDGE_EPROTO;
    if (!s_int(o, "lease", &kv->lease) || !s_int(o, "create_revision", &kv->create_rev) ||
        !s_int(o, "mod_revision", &kv->mod_rev))
        return KVEDGE_EPROTO;
    uint8_t *kb = NULL;
    int rc = s_unb64(k->valuestring, &kb, &kv->key_len);
    if (rc != KVEDGE_OK)
        return rc;
    kv->key = (char *)kb;
    if (strlen(kv->key) != kv->key_len) /* keys are text: no NUL inside */
        return KVEDGE_EPROTO;
    rc = s_unb64(v ? v->valuestring : "", &kv->value, &kv->value_len);
    return rc;
}

static int s_kvs(const cJSON *arr, kvedge_etcd_reply_t *r)
{
    if (!arr)
        return KVEDGE_OK;
    if (!cJSON_IsArray(arr))
        return KVEDGE_EPROTO;
    size_t n = (size_t)cJSON_GetArraySize(arr);
    if (r->n_kvs + n > KVEDGE_ETCD_MAX_KVS)
        return KVEDGE_ETOOBIG;
    kvedge_etcd_kv_t *kvs = realloc(r->kvs, (r->n_kvs + n + 1) * sizeof *kvs);
    if (!kvs)
        return KVEDGE_ENOMEM;
    r->kvs = kvs;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        int rc = s_kv(it, &r->kvs[r->n_kvs]);
        r->n_kvs++; /* counted even on failure: its partial strings are freed with the reply */
        if (rc != KVEDGE_OK)
            return rc;
    }
    return KVEDGE_OK;
}

static size_t s_urls(const cJSON *arr, char (*out)[KVEDGE_ETCD_URL_BYTES], bool *ok)
{
    size_t n = 0;
    if (!arr)
        return 0;
    if (!cJSON_IsArray(arr)) {
        *ok = false;
        return 0;
    }
    const cJSON *u;
    cJSON_ArrayForEach(u, arr)
    {
        if (!cJSON_IsString(u)) {
            *ok = false;
            return n;
        }
        if (n < KVEDGE_ETCD_MAX_URLS)
            snprintf(out[n++], KVEDGE_ETCD_URL_BYTES, "%s", u->valuestring);
    }
    return n;
}

static int s_members(const cJSON *arr, kvedge_etcd_reply_t *r)
{
    if (!arr)
        return KVEDGE_OK;
    if (!cJSON_IsArray(arr))
        return KVEDGE_EPROTO;
    const cJSON *m;
    cJSON_ArrayForEach(m, arr)
    {
        if (!cJSON_IsObject(m))
            return KVEDGE_EPROTO;
        if (r->n_members >= KVEDGE_ETCD_MAX_MEMBERS)
            continue;
        kvedge_etcd_member_t *x = &r->members[r->n_members];
        /* Member ids are uint64: above int64's range, so read as text. */
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "ID");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "name");
        bool ok = (!name || cJSON_IsString(name)) &&
                  (!id || (cJSON_IsString(id) && strlen(id->valuestring) < sizeof x->id &&
                           strspn(id->valuestring, "0123456789") == strlen(id->valuestring)));
        x->n_client =
            s_urls(cJSON_GetObjectItemCaseSensitive(m, "clientURLs"), x->client_urls, &ok);
        x->n_peer = s_urls(cJSON_GetObjectItemCaseSensitive(m, "peerURLs"), x->peer_urls, &ok);
        if (!ok)
            return KVEDGE_EPROTO;
        snprintf(x->id, sizeof x->id, "%s", id ? id->valuestring : "0");
        snprintf(x->name, sizeof x->name, "%s", name ? name->valuestring : "");
        r->n_members++;
    }
    return KVEDGE_OK;
}

/* etcd's error text into a kvedge code (its messages are stable: etcdserver/api/v3rpc/rpctypes). */
static int s_etcd_code(const char *msg, int64_t grpc)
{
    if (strstr(msg, "no leader"))
        return KVEDGE_ECLOSED;
    if (strstr(msg, "timed out") || strstr(msg, "timeout"))
        return KVEDGE_ETIMEDOUT;
    if (strstr(msg, "lease not found"))
        return KVEDGE_ENOTFOUND;
    if (strstr(msg, "too many requests"))
        return KVEDGE_EBUSY;
    if (strstr(msg, "space exceeded"))
        return KVEDGE_ENOSPC;
    if (strstr(msg, "too large"))
        return KVEDGE_ETOOBIG;
    if (grpc == 3)
        return KVEDGE_EINVAL;
    return KVEDGE_EIO;
}

/* {"error": "...", "message": "...", "code": N} (unary), or {"error": {"grpc_code", "message"}}
 * (a stream's). KVEDGE_OK when o is no error document. */
static int s_error_doc(const cJSON *o, char *why, size_t why_len)
{
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (!err)
        return KVEDGE_OK;
    const cJSON *in = cJSON_IsObject(err) ? err : o;
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(in, "message");
    const char *text = cJSON_IsString(msg)   ? msg->valuestring
                       : cJSON_IsString(err) ? err->valuestring
                                             : "an error without a message";
    int64_t code = 0;
    if (!s_int(in, cJSON_IsObject(err) ? "grpc_code" : "code", &code))
        code = 0;
    int rc = s_etcd_code(text, code);
    return kvedge_why(why, why_len, rc, "etcd: %.200s", text);
}

static int s_decode_obj(const cJSON *root, long http, kvedge_etcd_reply_t *out, char *why,
                        size_t why_len)
{
    if (!cJSON_IsObject(root))
        return kvedge_why(why, why_len, KVEDGE_EPROTO, "not etcd's JSON (not an object)");
    int rc = s_error_doc(root, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    const cJSON *o = root;
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(root, "result"); /* a stream's reply */
    if (res) {
        if (!cJSON_IsObject(res))
            return kvedge_why(why, why_len, KVEDGE_EPROTO, "not etcd's JSON (result)");
        o = res;
        if ((rc = s_error_doc(o, why, why_len)) != KVEDGE_OK)
            return rc;
    }
    if (http != 200)
        return kvedge_why(why, why_len, KVEDGE_EPROTO, "HTTP %ld without etcd's error document",
                          http);
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "header");
    if (!cJSON_IsObject(h))
        return kvedge_why(why, why_len, KVEDGE_EPROTO, "not etcd's JSON (no header)");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "version");
    if (!s_int(h, "revision", &out->revision) || !s_bool(o, "more", &out->more) ||
        !s_bool(o, "succeeded", &out->succeeded) || !s_int(o, "ID", &out->id) ||
        !s_int(o, "TTL", &out->ttl) || !s_int(o, "dbSize", &out->db_size) ||
        (ver && !cJSON_IsString(ver)))
        return kvedge_why(why, why_len, KVEDGE_EPROTO, "not etcd's JSON (a field's type)");
    if (ver)
        snprintf(out->version, sizeof out->version, "%s", ver->valuestring);
    rc = s_kvs(cJSON_GetObjectItemCaseSensitive(o, "kvs"), out);
    const cJSON *resp = cJSON_GetObjectItemCaseSensitive(o, "responses");
    if (rc == KVEDGE_OK && resp && !cJSON_IsArray(resp))
        rc = KVEDGE_EPROTO;
    const cJSON *r1;
    if (rc == KVEDGE_OK && resp) {
        cJSON_ArrayForEach(r1, resp)
        {
            const cJSON *rr = cJSON_GetObjectItemCaseSensitive(r1, "response_range");
            if (!cJSON_IsObject(r1) || (rr && !cJSON_IsObject(rr))) {
                rc = KVEDGE_EPROTO;
                break;
            }
            if (rr && (rc = s_kvs(cJSON_GetObjectItemCaseSensitive(rr, "kvs"), out)) != KVEDGE_OK)
                break;
        }
    }
    if (rc == KVEDGE_OK)
        rc = s_members(cJSON_GetObjectItemCaseSensitive(o, "members"), out);
    if (rc == KVEDGE_ETOOBIG)
        return kvedge_why(why, why_len, rc, "a reply of more than %u key-values",
                          KVEDGE_ETCD_MAX_KVS);
    if (rc == KVEDGE_EPROTO)
        return kvedge_why(why, why_len, rc, "not etcd's JSON (a key-value or member)");
    if (rc != KVEDGE_OK)
        return kvedge_why(why, why_len, rc, "%s", kvedge_strerror(rc));
    return KVEDGE_OK;
}

int kvedge_etcd_decode(const char *body, size_t len, long http, kvedge_etcd_reply_t *out, char *why,
                       size_t why_len)
{
    if (!out)
        return KVEDGE_EINVAL;
    memset(out, 0, sizeof *out);
    if (!body)
        return kvedge_why(why, why_len, KVEDGE_EPROTO, "no reply");
    if (len > KVEDGE_ETCD_MAX_REPLY_BYTES)
        return kvedge_why(why, why_len, KVEDGE_ETOOBIG, "a reply over %u bytes",
                          KVEDGE_ETCD_MAX_REPLY_BYTES);
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root)
        return kvedge_why(why, why_len, KVEDGE_EPROTO, "not etcd's JSON (HTTP %ld, %zu bytes)",
                          http, len);
    int rc = s_decode_obj(root, http, out, why, why_len);
    cJSON_Delete(root);
    if (rc != KVEDGE_OK)
        kvedge_etcd_reply_free(out);
    return rc;
}

/* ---------------------------------------------------------------- client */

static pthread_once_t s_curl_once = PTHREAD_ONCE_INIT;
static void s_curl_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

int kvedge_etcd_new(const char *endpoints, uint32_t timeout_ms, kvedge_etcd_t **out, char *why,
                    size_t why_len)
{
    if (!out)
        return KVEDGE_EINVAL;
    *out = NULL;
    if (!endpoints || !*endpoints)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "no etcd endpoint");
    if (sodium_init() < 0)
        return KVEDGE_ENOMEM;
    pthread_once(&s_curl_once, s_curl_init);
    kvedge_etcd_t *e = calloc(1, sizeof *e);
    if (!e)
        return KVEDGE_ENOMEM;
    e->timeout_ms = timeout_ms ? timeout_ms : KVEDGE_ETCD_TIMEOUT_MS;
    const char *p = endpoints;
    int rc = KVEDGE_OK;
    while (rc == KVEDGE_OK && *p) {
        size_t n = strcspn(p, ",");
        if (e->n_eps == KVEDGE_ETCD_MAX_ENDPOINTS)
            rc = kvedge_why(why, why_len, KVEDGE_EINVAL, "more than %d etcd endpoints",
                            KVEDGE_ETCD_MAX_ENDPOINTS);
        else if (n == 0 || n >= KVEDGE_ETCD_URL_BYTES ||
                 (strncmp(p, "http://", 7) != 0 && strncmp(p, "https://", 8) != 0))
            rc = kvedge_why(why, why_len, KVEDGE_EINVAL,
                            "etcd endpoint '%.*s' is not http://HOST:PORT",
                            (int)(n > 200 ? 200 : n), p);
        else if (!(e->eps[e->n_eps] = strndup(p, n)))
            rc = KVEDGE_ENOMEM;
        else {
            char *ep = e->eps[e->n_eps++];
            size_t l = strlen(ep);
            while (l > 0 && ep[l - 1] == '/')
                ep[--l] = '\0';
        }
        p += n;
        if (*p == ',')
            p++;
    }
    if (rc == KVEDGE_OK && !(e->curl = curl_easy_init()))
        rc = KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK &&
        !(e->headers = curl_slist_append(NULL, "Content-Type: application/json")))
        rc = KVEDGE_ENOMEM;
    if (rc != KVEDGE_OK) {
        kvedge_etcd_destroy(&e);
        return rc;
    }
    *out = e;
    return KVEDGE_OK;
}

void kvedge_etcd_destroy(kvedge_etcd_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_etcd_t *e = *self_p;
    *self_p = NULL;
    if (e->curl)
        curl_easy_cleanup(e->curl);
    curl_slist_free_all(e->headers);
    for (size_t i = 0; i < e->n_eps; i++)
        free(e->eps[i]);
    free(e);
}

const char *kvedge_etcd_endpoint(const kvedge_etcd_t *e)
{
    return e && e->n_eps ? e->eps[e->cur] : NULL;
}

size_t kvedge_etcd_endpoints(const kvedge_etcd_t *e, const char **out, size_t cap)
{
    size_t n = 0;
    for (; e && n < e->n_eps && n < cap; n++)
        out[n] = e->eps[n];
    return e ? e->n_eps : 0;
}

void kvedge_etcd_counts(const kvedge_etcd_t *e, uint64_t *ok, uint64_t *failed)
{
    if (ok)
        *ok = e ? e->ok : 0;
    if (failed)
        *failed = e ? e->failed : 0;
}

typedef struct {
    char *buf;
    size_t len, cap;
    bool over;
} s_body_t;

static size_t s_write(char *p, size_t size, size_t n, void *arg)
{
    s_body_t *b = arg;
    size_t add = size * n;
    if (b->len + add > KVEDGE_ETCD_MAX_REPLY_BYTES) {
        b->over = true;
        return 0; /* aborts the transfer */
    }
    if (b->len + add + 1 > b->cap) {
        size_t cap = (b->len + add + 1) * 2;
        if (cap > KVEDGE_ETCD_MAX_REPLY_BYTES + 1)
            cap = KVEDGE_ETCD_MAX_REPLY_BYTES + 1;
        char *nb = realloc(b->buf, cap);
        if (!nb)
            return 0;
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, p, add);
    b->len += add;
    b->buf[b->len] = '\0';
    return add;
}

static int64_t s_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* One POST to one endpoint. *moved: try the next endpoint (no etcd answer, or no leader). */
static int s_post(kvedge_etcd_t *e, const char *ep, const char *path, const char *json,
                  int64_t left_ms, kvedge_etcd_reply_t *out, bool *moved, bool *answered, char *why,
                  size_t why_len)
{
    char url[KVEDGE_ETCD_URL_BYTES + 64];
    snprintf(url, sizeof url, "%s%s", ep, path);
    s_body_t b = {0};
    CURL *c = e->curl;
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, json);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, e->headers);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, s_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)left_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)(left_ms < KVEDGE_ETCD_CONNECT_MS ? left_ms : KVEDGE_ETCD_CONNECT_MS));
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    CURLcode cc = curl_easy_perform(c);
    long http = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
    int rc;
    *moved = false;
    *answered = false;
    if (b.over) {
        rc = kvedge_why(why, why_len, KVEDGE_ETOOBIG, "%s: a reply over %u bytes (not etcd?)", ep,
                        KVEDGE_ETCD_MAX_REPLY_BYTES);
        *moved = true;
    } else if (cc != CURLE_OK) {
        rc = kvedge_why(why, why_len,
                        cc == CURLE_OPERATION_TIMEDOUT ? KVEDGE_ETIMEDOUT : KVEDGE_ECLOSED,
                        "%s: %s", ep, curl_easy_strerror(cc));
        *moved = true;
    } else {
        char w[400] = "";
        rc = kvedge_etcd_decode(b.buf ? b.buf : "", b.len, http, out, w, sizeof w);
        if (rc != KVEDGE_OK)
            kvedge_why(why, why_len, rc, "%s%s: %s", ep, path, w);
        *moved = rc == KVEDGE_EPROTO || rc == KVEDGE_ECLOSED || rc == KVEDGE_ETOOBIG;
        *answered = rc != KVEDGE_EPROTO && rc != KVEDGE_ETOOBIG;
    }
    free(b.buf);
    return rc;
}

/* POSTs json to path, trying the endpoints in turn from the current one, within the deadline. */
static int s_call(kvedge_etcd_t *e, const char *path, cJSON *req, kvedge_etcd_reply_t *out,
                  char *why, size_t why_len)
{
    char *json = req ? cJSON_PrintUnformatted(req) : NULL;
    cJSON_Delete(req);
    if (!json)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "out of memory");
    memset(out, 0, sizeof *out);
    int64_t end = s_mono_ms() + e->timeout_ms;
    int rc = KVEDGE_ECLOSED;
    bool answered = false;
    for (size_t t = 0; t < e->n_eps; t++) {
        size_t i = (e->cur + t) % e->n_eps;
        int64_t left = end - s_mono_ms();
        if (left <= 0) {
            if (t == 0 || rc == KVEDGE_ECLOSED)
                rc = kvedge_why(why, why_len, KVEDGE_ETIMEDOUT, "etcd did not answer within %u ms",
                                e->timeout_ms);
            break;
        }
        bool moved, heard;
        rc = s_post(e, e->eps[i], path, json, left, out, &moved, &heard, why, why_len);
        answered = answered || heard;
        if (!moved) {
            e->cur = i;
            break;
        }
    }
    free(json);
    if (answered)
        e->ok++;
    else
        e->failed++;
    return rc;
}

static char *s_b64(const void *p, size_t n)
{
    size_t cap = sodium_base64_encoded_len(n, sodium_base64_VARIANT_ORIGINAL);
    char *s = malloc(cap);
    if (s)
        sodium_bin2base64(s, cap, p, n, sodium_base64_VARIANT_ORIGINAL);
    return s;
}

/* Adds name: base64(p, n) to o. False on ENOMEM. */
static bool s_add_b64(cJSON *o, const char *name, const void *p, size_t n)
{
    char *s = s_b64(p, n);
    bool ok = s && cJSON_AddStringToObject(o, name, s);
    free(s);
    return ok;
}

static bool s_add_i64(cJSON *o, const char *name, int64_t v)
{
    char s[24];
    snprintf(s, sizeof s, "%lld", (long long)v);
    return cJSON_AddStringToObject(o, name, s) != NULL;
}

static int s_simple(kvedge_etcd_t *e, const char *path, cJSON *req, bool ok,
                    kvedge_etcd_reply_t *out, char *why, size_t why_len)
{
    if (!req || !ok) {
        cJSON_Delete(req);
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "out of memory");
    }
    return s_call(e, path, req, out, why, why_len);
}

int kvedge_etcd_status(kvedge_etcd_t *e, kvedge_etcd_reply_t *out, char *why, size_t why_len)
{
    if (!e || !out)
        return KVEDGE_EINVAL;
    int rc = s_simple(e, "/v3/maintenance/status", cJSON_CreateObject(), true, out, why, why_len);
    if (rc == KVEDGE_OK && !out->version[0]) {
        kvedge_etcd_reply_free(out);
        return kvedge_why(why, why_len, KVEDGE_EPROTO, "%s: not etcd (a status without a version)",
                          kvedge_etcd_endpoint(e));
    }
    return rc;
}

int kvedge_etcd_members(kvedge_etcd_t *e, kvedge_etcd_reply_t *out, char *why, size_t why_len)
{
    if (!e || !out)
        return KVEDGE_EINVAL;
    return s_simple(e, "/v3/cluster/member/list", cJSON_CreateObject(), true, out, why, why_len);
}

int kvedge_etcd_get(kvedge_etcd_t *e, const char *key, kvedge_etcd_reply_t *out, char *why,
                    size_t why_len)
{
    if (!e || !key || !*key || !out)
        return KVEDGE_EINVAL;
    cJSON *r = cJSON_CreateObject();
    bool ok = r && s_add_b64(r, "key", key, strlen(key));
    return s_simple(e, "/v3/kv/range", r, ok, out, why, why_len);
}

/* The smallest key above every key starting with prefix (etcd's range_end for a prefix). */
static size_t s_prefix_end(const char *prefix, char *out)
{
    size_t n = strlen(prefix);
    memcpy(out, prefix, n);
    while (n > 0 && (uint8_t)out[n - 1] == 0xFF)
        n--;
    if (n == 0) {
        out[0] = '\0'; /* everything: range_end "\0" */
        return 1;
    }
    out[n - 1] = (char)((uint8_t)out[n - 1] + 1);
    return n;
}

int kvedge_etcd_range_prefix(kvedge_etcd_t *e, const char *prefix, size_t page_keys,
                             kvedge_etcd_kv_fn cb, void *ctx, char *why, size_t why_len)
{
    if (!e || !prefix || !*prefix || strlen(prefix) > 1024 || !cb ||
        page_keys > KVEDGE_ETCD_MAX_KVS)
        return KVEDGE_EINVAL;
    if (!page_keys)
        page_keys = KVEDGE_ETCD_PAGE_KEYS;
    char end[1025], from[1536];
    size_t end_len = s_prefix_end(prefix, end);
    snprintf(from, sizeof from, "%s", prefix);
    size_t from_len = strlen(from);
    int64_t rev = 0;
    for (;;) {
        cJSON *r = cJSON_CreateObject();
        bool ok =
            r && s_add_b64(r, "key", from, from_len) && s_add_b64(r, "range_end", end, end_len) &&
            s_add_i64(r, "limit", (int64_t)page_keys) && (!rev || s_add_i64(r, "revision", rev));
        kvedge_etcd_reply_t rep;
        int rc = s_simple(e, "/v3/kv/range", r, ok, &rep, why, why_len);
        if (rc != KVEDGE_OK)
            return rc;
        if (!rev)
            rev = rep.revision;
        int cbrc = 0;
        for (size_t i = 0; i < rep.n_kvs && !cbrc; i++)
            cbrc = cb(ctx, &rep.kvs[i]);
        bool more = rep.more && rep.n_kvs > 0;
        if (more) {
            const kvedge_etcd_kv_t *last = &rep.kvs[rep.n_kvs - 1];
            if (last->key_len + 1 >= sizeof from) {
                kvedge_etcd_reply_free(&rep);
                return kvedge_why(why, why_len, KVEDGE_EPROTO, "a key over %zu bytes",
                                  sizeof from - 2);
            }
            memcpy(from, last->key, last->key_len);
            from[last->key_len] = '\0'; /* the next key after last: last + "\0" */
            from_len = last->key_len + 1;
        }
        kvedge_etcd_reply_free(&rep);
        if (cbrc)
            return cbrc;
        if (!more)
            return KVEDGE_OK;
    }
}

int kvedge_etcd_put(kvedge_etcd_t *e, const char *key, const void *value, size_t len, int64_t lease,
                    char *why, size_t why_len)
{
    if (!e || !key || !*key || (len && !value))
        return KVEDGE_EINVAL;
    cJSON *r = cJSON_CreateObject();
    bool ok = r && s_add_b64(r, "key", key, strlen(key)) &&
              s_add_b64(r, "value", len ? value : "", len) &&
              (!lease || s_add_i64(r, "lease", lease));
    kvedge_etcd_reply_t rep;
    int rc = s_simple(e, "/v3/kv/put", r, ok, &rep, why, why_len);
    kvedge_etcd_reply_free(&rep);
    return rc;
}

int kvedge_etcd_delete(kvedge_etcd_t *e, const char *key, char *why, size_t why_len)
{
    if (!e || !key || !*key)
        return KVEDGE_EINVAL;
    cJSON *r = cJSON_CreateObject();
    bool ok = r && s_add_b64(r, "key", key, strlen(key));
    kvedge_etcd_reply_t rep;
    int rc = s_simple(e, "/v3/kv/deleterange", r, ok, &rep, why, why_len);
    kvedge_etcd_reply_free(&rep);
    return rc;
}

static cJSON *s_ops(const kvedge_etcd_op_t *ops, size_t n)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < n; i++) {
        cJSON *op = cJSON_CreateObject(), *req = cJSON_CreateObject();
        const char *name = ops[i].kind == KVEDGE_ETCD_OP_PUT      ? "request_put"
                           : ops[i].kind == KVEDGE_ETCD_OP_DELETE ? "request_delete_range"
                                                                  : "request_range";
        bool ok = op && req && ops[i].key && *ops[i].key &&
                  s_add_b64(req, "key", ops[i].key, strlen(ops[i].key));
        if (ok && ops[i].kind == KVEDGE_ETCD_OP_PUT)
            ok = s_add_b64(req, "value", ops[i].value_len ? ops[i].value : "", ops[i].value_len) &&
                 (!ops[i].lease || s_add_i64(req, "lease", ops[i].lease));
        if (ok) {
            cJSON_AddItemToObject(op, name, req);
            cJSON_AddItemToArray(arr, op);
        } else {
            cJSON_Delete(op);
            cJSON_Delete(req);
            cJSON_Delete(arr);
            arr = NULL;
        }
    }
    return arr;
}

int kvedge_etcd_txn(kvedge_etcd_t *e, const kvedge_etcd_cmp_t *cmp, size_t ncmp,
                    const kvedge_etcd_op_t *ok_ops, size_t nok, const kvedge_etcd_op_t *fail_ops,
                    size_t nfail, kvedge_etcd_reply_t *out, char *why, size_t why_len)
{
    if (!e || !out || (ncmp && !cmp) || (nok && !ok_ops) || (nfail && !fail_ops))
        return KVEDGE_EINVAL;
    cJSON *r = cJSON_CreateObject(), *cs = cJSON_CreateArray();
    bool ok = r && cs;
    if (ok)
        cJSON_AddItemToObject(r, "compare", cs);
    else
        cJSON_Delete(cs);
    for (size_t i = 0; ok && i < ncmp; i++) {
        cJSON *c = cJSON_CreateObject();
        bool lease = cmp[i].kind == KVEDGE_ETCD_CMP_LEASE;
        ok = c && cmp[i].key && *cmp[i].key &&
             s_add_b64(c, "key", cmp[i].key, strlen(cmp[i].key)) &&
             cJSON_AddStringToObject(c, "result", "EQUAL") &&
             cJSON_AddStringToObject(c, "target", lease ? "LEASE" : "CREATE") &&
             s_add_i64(c, lease ? "lease" : "create_revision", cmp[i].value);
        if (ok)
            cJSON_AddItemToArray(cs, c);
        else
            cJSON_Delete(c);
    }
    cJSON *s = ok ? s_ops(ok_ops, nok) : NULL, *f = s ? s_ops(fail_ops, nfail) : NULL;
    if (s)
        cJSON_AddItemToObject(r, "success", s);
    if (f)
        cJSON_AddItemToObject(r, "failure", f);
    return s_simple(e, "/v3/kv/txn", r, ok && s && f, out, why, why_len);
}

int kvedge_etcd_lease_grant(kvedge_etcd_t *e, int64_t ttl_s, int64_t *id, char *why, size_t why_len)
{
    if (!e || ttl_s <= 0 || !id)
        return KVEDGE_EINVAL;
    cJSON *r = cJSON_CreateObject();
    bool ok = r && s_add_i64(r, "TTL", ttl_s);
    kvedge_etcd_reply_t rep;
    int rc = s_simple(e, "/v3/lease/grant", r, ok, &rep, why, why_len);
    if (rc == KVEDGE_OK && rep.id == 0)
        rc = kvedge_why(why, why_len, KVEDGE_EPROTO, "%s: a lease grant without an ID",
                        kvedge_etcd_endpoint(e));
    *id = rc == KVEDGE_OK ? rep.id : 0;
    kvedge_etcd_reply_free(&rep);
    return rc;
}

int kvedge_etcd_lease_keepalive(kvedge_etcd_t *e, int64_t id, int64_t *ttl, char *why,
                                size_t why_len)
{
    if (!e || !id || !ttl)
        return KVEDGE_EINVAL;
    cJSON *r = cJSON_CreateObject();
    bool ok = r && s_add_i64(r, "ID", id);
    kvedge_etcd_reply_t rep;
    int rc = s_simple(e, "/v3/lease/keepalive", r, ok, &rep, why, why_len);
    *ttl = rc == KVEDGE_OK ? rep.ttl : 0;
    kvedge_etcd_reply_free(&rep);
    return rc;
}

int kvedge_etcd_lease_revoke(kvedge_etcd_t *e, int64_t id, char *why, size_t why_len)
{
    if (!e || !id)
        return KVEDGE_EINVAL;
    cJSON *r = cJSON_CreateObject();
    bool ok = r && s_add_i64(r, "ID", id);
    kvedge_etcd_reply_t rep;
    int rc = s_simple(e, "/v3/lease/revoke", r, ok, &rep, why, why_len);
    kvedge_etcd_reply_free(&rep);
    return rc;
}
