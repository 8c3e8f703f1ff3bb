/* The protocol client's request/response calls (access/client.c): ping, model, stat, list,
 * monitor, evict, put, get, lookup, delete, pin. */
#include <czmq.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "access/client_impl.h"
#include "access/codec/errwire.h"
#include "access/codec/clock.h"

#define S_PUT_BATCH_BYTES (64u << 20) /* payload bytes per PUT message (one item may be more) */
#define S_PUT_PIPELINE    4           /* PUT messages of one call in flight */
#define S_GET_PIPELINE    2           /* GET messages of one call in flight */
#define S_PING_TINY_BYTES 8           /* payload of the latency ping */
#define S_STATUS_BYTES    4

/* ---------------------------------------------------------------- ping, model, stat */

static uint8_t s_ping_byte(size_t i)
{
    return (uint8_t)((i * 2654435761u) >> 13);
}

/* One PING of bytes; *rtt_us receives the round trip the I/O thread measured. */
static int s_ping_once(kvedge_client_t *c, size_t bytes, double *rtt_us)
{
    uint8_t *p;
    kvedge_client__req_t *r =
        kvedge_client__req_frame(KVEDGE_OP_PING, 0, kvedge_client__deadline(c, 0), NULL, bytes, &p);
    if (!r)
        return KVEDGE_ENOMEM;
    for (size_t i = 0; i < bytes; i++)
        p[i] = s_ping_byte(i);
    int rc = kvedge_client__call(c, r);
    if (rc != KVEDGE_OK)
        return rc;
    zframe_t *f = zmsg_first(r->reply);
    if (zframe_size(f) != bytes)
        rc = KVEDGE_EPROTO;
    for (size_t i = 0; rc == KVEDGE_OK && i < bytes; i++)
        if (zframe_data(f)[i] != s_ping_byte(i))
            rc = KVEDGE_EPROTO;
    *rtt_us = (double)(r->done_us - r->sent_us);
    kvedge_client__req_release(r);
    return rc;
}

/* rtt from a tiny ping; bandwidth from a second one of `bytes` (sent and echoed, so 2 x bytes
 * moved), with the tiny ping's latency taken out when it is smaller. */
int kvedge_client_ping(kvedge_client_t *c, size_t bytes, double *rtt_us, double *bw_bytes_per_s)
{
    KVEDGE_CLIENT__ENTER(c);
    if (!c || bytes > KVEDGE_WIRE_MAX_PING_BYTES)
        return KVEDGE_EINVAL;
    double rtt = 0, big = 0;
    int rc = s_ping_once(c, S_PING_TINY_BYTES, &rtt);
    if (rc == KVEDGE_OK && bytes > 0)
        rc = s_ping_once(c, bytes, &big);
    if (rc != KVEDGE_OK)
        return rc;
    if (rtt_us)
        *rtt_us = rtt;
    if (bw_bytes_per_s) {
        double t = big > rtt ? big - rtt : big;
        *bw_bytes_per_s = bytes > 0 && t > 0 ? 2.0 * (double)bytes * 1e6 / t : 0;
    }
    return KVEDGE_OK;
}

/* One MODEL exchange: registers model (put) or asks about query_id (a query); *have receives
 * the node's record of the id. */
static int s_model_call(kvedge_client_t *c, const kvedge_model_t *model, const char *query_id,
                        kvedge_model_t *have)
{
    uint8_t *p;
    kvedge_client__req_t *r = kvedge_client__req_frame(
        KVEDGE_OP_MODEL, 0, kvedge_client__deadline(c, 0), NULL, KVEDGE_WIRE_MODEL_BYTES, &p);
    if (!r)
        return KVEDGE_ENOMEM;
    if ((model ? kvedge_wire_model_pack(model, p) : kvedge_wire_model_query_pack(query_id, p)) !=
        KVEDGE_OK) {
        kvedge_client__req_free(r);
        return KVEDGE_EINVAL;
    }
    int rc = kvedge_client__call(c, r);
    if (rc != KVEDGE_OK)
        return rc;
    zframe_t *f = zmsg_first(r->reply);
    rc = kvedge_wire_model_parse(zframe_data(f), zframe_size(f), have);
    kvedge_client__req_release(r);
    return rc;
}

int kvedge_client_get_model(kvedge_client_t *c, const char *id, kvedge_model_t *out)
{
    KVEDGE_CLIENT__ENTER(c);
    if (!c || !id || !out)
        return KVEDGE_EINVAL;
    int rc = s_model_call(c, NULL, id, out);
    if (rc == KVEDGE_OK && strcmp(out->id, id) != 0)
        rc = KVEDGE_EPROTO; /* an answer about another model */
    return rc;
}

int kvedge_client_put_model(kvedge_client_t *c, const kvedge_model_t *model)
{
    KVEDGE_CLIENT__ENTER(c);
    if (!c || !model)
        return KVEDGE_EINVAL;
    kvedge_model_t have;
    int rc = s_model_call(c, model, NULL, &have);
    if (rc == KVEDGE_OK && (strcmp(have.id, model->id) != 0 || have.layers != model->layers ||
                            have.kv_heads != model->kv_heads || have.head_dim != model->head_dim ||
                            have.dtype != model->dtype))
        rc = KVEDGE_ESHAPE; /* the node has another shape under this id */
    return rc;
}

#define S_LIST_PAGE_ENTRIES 1024 /* LIST entries asked for per round trip */

int kvedge_client_list_all(kvedge_client_t *c, kvedge_chunk_entry_t **out, size_t *n)
{
    KVEDGE_CLIENT__ENTER(c);
    size_t cap = S_LIST_PAGE_ENTRIES, len = 0;
    kvedge_chunk_entry_t *all = malloc(cap * sizeof *all);
    bool more = true;
    int rc = all ? KVEDGE_OK : KVEDGE_ENOMEM;
    while (rc == KVEDGE_OK && more) {
        if (cap - len < S_LIST_PAGE_ENTRIES) {
            kvedge_chunk_entry_t *p = realloc(all, (cap *= 2) * sizeof *all);
            if (!p) {
                rc = KVEDGE_ENOMEM;
                break;
            }
            all = p;
        }
        size_t got = 0;
        rc = kvedge_client_list(c, len ? &all[len - 1].chunk.id : NULL, all + len,
                                S_LIST_PAGE_ENTRIES, &got, &more);
        len += got;
        if (got == 0)
            more = false;
    }
    if (rc != KVEDGE_OK) {
        free(all);
        return rc;
    }
    *out = all;
    *n = len;
    return KVEDGE_OK;
}

int kvedge_client_stat(kvedge_client_t *c, kvedge_store_stats_t *out)
{
    KVEDGE_CLIENT__ENTER(c);
    if (!c || !out)
        return KVEDGE_EINVAL;
    kvedge_client__req_t *r =
        kvedge_client__req_new(KVEDGE_OP_STAT, 0, kvedge_client__deadline(c, 0));
    if (!r)
        return KVEDGE_ENOMEM;
    int rc = kvedge_client__call(c, r);
    if (rc != KVEDGE_OK)
        return rc;
    zframe_t *f = zmsg_first(r->reply);
    rc = kvedge_wire_stats_parse(zframe_data(f), zframe_size(f), out);
    kvedge_client__req_release(r);
    return rc;
}

int kvedge_client_monitor(kvedge_client_t *c, uint32_t top, char **json, size_t *len)
{
    KVEDGE_CLIENT__ENTER(c);
    if (!c || !json || top > KVEDGE_WIRE_MAX_MONITOR_TOP)
        return KVEDGE_EINVAL;
    *json = NULL;
    uint8_t *p;
    kvedge_client__req_t *r =
        kvedge_client__req_frame(KVEDGE_OP_MONITOR, 0, kvedge_client__deadline(c, 0), NULL, 4, &p);
    if (!r)
        return KVEDGE_ENOMEM;
    kvedge_le_put16(p, (uint16_t)top);
    kvedge_le_put16(p + 2, 0);
    int rc = kvedge_client__call(c, r);
    if (rc != KVEDGE_OK)
        return rc;
    zframe_t *f = zmsg_first(r->reply); /* validated: 2 ... 1 MiB, a '{' first, no NUL */
    char *out = malloc(zframe_size(f) + 1);
    if (out) {
        memcpy(out, zframe_data(f), zframe_size(f));
        out[zframe_size(f)] = '\0';
        if (len)
            *len = zframe_size(f);
    }
    kvedge_client__req_release(r);
    *json = out;
    return out ? KVEDGE_OK : KVEDGE_ENOMEM;
}

int kvedge_client_evict(kvedge_client_t *c, uint64_t target_bytes, uint64_t *blocks,
                        uint64_t *bytes)
{
    KVEDGE_CLIENT__ENTER(c);
    if (!c)
        return KVEDGE_EINVAL;
    uint8_t *p;
    kvedge_client__req_t *r =
        kvedge_client__req_frame(KVEDGE_OP_EVICT, 0, kvedge_client__deadline(c, 0), NULL, 8, &p);
    if (!r)
        return KVEDGE_ENOMEM;
    kvedge_le_put32(p, (uint32_t)target_bytes);
    kvedge_le_put32(p + 4, (uint32_t)(target_bytes >> 32));
    int rc = kvedge_client__call(c, r);
    if (rc != KVEDGE_OK)
        return rc;
    const uint8_t *d = zframe_data(zmsg_first(r->reply));
    if (blocks)
        *blocks = (uint64_t)kvedge_le_get32(d) | (uint64_t)kvedge_le_get32(d + 4) << 32;
    if (bytes)
        *bytes = (uint64_t)kvedge_le_get32(d + 8) | (uint64_t)kvedge_le_get32(d + 12) << 32;
    kvedge_client__req_release(r);
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- put */

/* A PUT or GET message of one call in flight: the request and the items it carries. */
typedef struct {
    kvedge_client__req_t *r;
    size_t *idx; /* item (or key) indices, in message order */
    uint32_t n;
    int rc; /* submission result */
} s_batch_t;

static void s_batch_clear(s_batch_t *b)
{
    free(b->idx);
    memset(b, 0, sizeof *b);
}

/* Packs items from *next into one PUT message: at most max_items items and S_PUT_BATCH_BYTES
 * of payload (a single larger item travels alone). Items that cannot be sent get their status
 * here. b->n is 0 when nothing was left to send. */
static int s_put_batch(const kvedge_client_t *c, const kvedge_put_item_t *items, size_t n,
                       size_t *next, int *st, int64_t deadline, s_batch_t *b)
{
    uint32_t max_items =
        c->max_items < KVEDGE_WIRE_MAX_ITEMS ? c->max_items : KVEDGE_WIRE_MAX_ITEMS;
    b->idx = malloc(max_items * sizeof *b->idx);
    zmsg_t *m = zmsg_new();
    if (!b->idx || !m) {
        zmsg_destroy(&m);
        return KVEDGE_ENOMEM;
    }
    size_t bytes = 0;
    while (*next < n && b->n < max_items) {
        size_t i = *next;
        const kvedge_put_item_t *it = &items[i];
        if (!it->block || it->len == 0) {
            st[i] = KVEDGE_EINVAL;
            (*next)++;
            continue;
        }
        if (it->len > c->max_frame) {
            st[i] = KVEDGE_ETOOBIG;
            (*next)++;
            continue;
        }
        size_t need = KVEDGE_WIRE_PUT_ITEM_BYTES + it->len;
        if (b->n > 0 && bytes + need > S_PUT_BATCH_BYTES)
            break;
        kvedge_wire_put_item_t w = {it->chunk, it->layer, it->head, it->pin, it->ttl_s};
        uint8_t hdr[KVEDGE_WIRE_PUT_ITEM_BYTES];
        if (kvedge_wire_put_item_pack(&w, hdr) != KVEDGE_OK) {
            st[i] = KVEDGE_EINVAL;
            (*next)++;
            continue;
        }
        if (zmsg_addmem(m, hdr, sizeof hdr) != 0 || zmsg_addmem(m, it->block, it->len) != 0) {
            zmsg_destroy(&m);
            return KVEDGE_ENOMEM;
        }
        bytes += need;
        b->idx[b->n++] = i;
        (*next)++;
    }
    if (b->n == 0) {
        zmsg_destroy(&m);
        return KVEDGE_OK;
    }
    b->r = kvedge_client__req_new(KVEDGE_OP_PUT, b->n, deadline);
    if (!b->r) {
        zmsg_destroy(&m);
        return KVEDGE_ENOMEM;
    }
    b->r->payload = m;
    return KVEDGE_OK;
}

/* Waits for a PUT message and spreads its statuses over the items it carried. */
static void s_put_collect(kvedge_client__path_t *path, s_batch_t *b, int *st)
{
    int rc = b->rc == KVEDGE_OK ? kvedge_client__path_wait(path, b->r) : b->rc;
    if (rc == KVEDGE_OK && b->r->rh.count != b->n)
        rc = KVEDGE_EPROTO;
    const uint8_t *p = rc == KVEDGE_OK ? zframe_data(zmsg_first(b->r->reply)) : NULL;
    for (uint32_t k = 0; k < b->n; k++)
        st[b->idx[k]] =
            p ? kvedge_err_from_wire((int32_t)kvedge_le_get32(p + (size_t)k * S_STATUS_BYTES)) : rc;
    if (b->rc == KVEDGE_OK)
        kvedge_client__req_release(b->r);
    s_batch_clear(b);
}

int kvedge_client_put(kvedge_client_t *c, const kvedge_put_item_t *items, size_t n, int *statuses)
{
    KVEDGE_CLIENT__ENTER(c);
    if (!c || (n && !items))
        return KVEDGE_EINVAL;
    if (n == 0)
        return KVEDGE_OK;
    int *st = statuses ? statuses : malloc(n * sizeof *st);
    if (!st)
        return KVEDGE_ENOMEM;
    int64_t deadline = kvedge_client__deadline(c, 0);
    s_batch_t win[S_PUT_PIPELINE];
    memset(win, 0, sizeof win);
    size_t next = 0, head = 0, used = 0;
    int rc = KVEDGE_OK;
    kvedge_client__path_t path = kvedge_client__path_open(c);
    while ((next < n && rc == KVEDGE_OK) || used > 0) {
        if (next < n && rc == KVEDGE_OK && used < S_PUT_PIPELINE) {
            s_batch_t *b = &win[(head + used) % S_PUT_PIPELINE];
            size_t first = next;
            rc = s_put_batch(c, items, n, &next, st, deadline, b);
            if (rc != KVEDGE_OK) {
                for (size_t i = first; i < n; i++)
                    st[i] = rc; /* out of memory: this and the rest are not sent */
                next = n;
                s_batch_clear(b);
            } else if (b->n > 0) {
                b->rc = kvedge_client__path_submit(&path, b->r);
                used++;
            } else {
                s_batch_clear(b);
            }
            continue;
        }
        s_put_collect(&path, &win[head], st);
        head = (head + 1) % S_PUT_PIPELINE;
        used--;
    }
    kvedge_client__path_close(&path, false);
    rc = KVEDGE_OK;
    for (size_t i = 0; i < n && rc == KVEDGE_OK; i++)
        rc = st[i];
    if (st != statuses)
        free(st);
    return kvedge_client__role_err(c, KVEDGE_OP_PUT, rc);
}

/* ---------------------------------------------------------------- get */

/* A GET reply spread over its keys: st[k] and, for status 0, blocks[k] (owned). */
static int s_get_parse(kvedge_client__req_t *r, uint32_t n, int *st, zframe_t **blocks)
{
    if (r->rh.count != n)
        return KVEDGE_EPROTO;
    zframe_t *sf = zmsg_pop(r->reply);
    for (uint32_t k = 0; k < n; k++) {
        st[k] = kvedge_err_from_wire(
            (int32_t)kvedge_le_get32(zframe_data(sf) + (size_t)k * S_STATUS_BYTES));
        blocks[k] = st[k] == KVEDGE_OK ? zmsg_pop(r->reply) : NULL; /* counts validated */
    }
    zframe_destroy(&sf);
    return KVEDGE_OK;
}

static kvedge_client__req_t *s_get_request(const kvedge_block_key_t *keys, const size_t *idx,
                                           uint32_t n, int64_t deadline)
{
    uint8_t *p;
    kvedge_client__req_t *r = kvedge_client__req_frame(KVEDGE_OP_GET, n, deadline, NULL,
                                                       (size_t)n * KVEDGE_WIRE_KEY_BYTES, &p);
    for (uint32_t k = 0; r && k < n; k++)
        kvedge_wire_key_pack(&keys[idx[k]], p + (size_t)k * KVEDGE_WIRE_KEY_BYTES);
    return r;
}

/* Fetches again, one round trip at a time, the keys of a batch the node left out of its
 * reply for size (KVEDGE_ETOOBIG: past KVEDGE_WIRE_MAX_REPLY_BYTES). Every round brings at
 * least the first of them, so this ends. */
static void s_get_refetch(kvedge_client__path_t *path, const kvedge_block_key_t *keys, s_batch_t *b,
                          int64_t deadline, int *st, zframe_t **blocks)
{
    size_t *sub = malloc(b->n * sizeof *sub), *pos = malloc(b->n * sizeof *pos);
    int *sst = malloc(b->n * sizeof *sst);
    zframe_t **sbl = malloc(b->n * sizeof *sbl);
    while (sub && pos && sst && sbl) {
        uint32_t m = 0;
        for (uint32_t k = 0; k < b->n; k++)
            if (st[k] == KVEDGE_ETOOBIG) {
                pos[m] = k;
                sub[m++] = b->idx[k];
            }
        if (m == 0)
            break;
        kvedge_client__req_t *r = s_get_request(keys, sub, m, deadline);
        int rc = r ? kvedge_client__call_on(path, r) : KVEDGE_ENOMEM;
        if (rc == KVEDGE_OK) {
            rc = s_get_parse(r, m, sst, sbl);
            kvedge_client__req_release(r);
        }
        if (rc != KVEDGE_OK) {
            for (uint32_t j = 0; j < m; j++)
                st[pos[j]] = rc;
            break;
        }
        for (uint32_t j = 0; j < m; j++) {
            st[pos[j]] = sst[j];
            blocks[pos[j]] = sbl[j];
        }
        if (sst[0] == KVEDGE_ETOOBIG)
            break; /* no progress: the node will not send it */
    }
    free(sub);
    free(pos);
    free(sst);
    free(sbl);
}

/* Lands one fetched head in the caller's buffer, one after the other. */
void kvedge_client__sink_put(kvedge_client__sink_t *s, int status, const uint8_t *data, size_t len,
                             kvedge_fetched_t *out)
{
    out->status = status;
    out->offset = 0;
    out->len = 0;
    if (status != KVEDGE_OK)
        return;
    out->len = len;
    if (s->full || len > s->cap - s->used) {
        s->full = true;
        out->status = KVEDGE_ENOSPACE; /* len says how much it needs */
        return;
    }
    memcpy(s->buf + s->used, data, len);
    out->offset = s->used;
    s->used += len;
}

/* Waits for one GET message, completes it and lands its blocks in key order. Returns the
 * message's transport error, or 0. */
static int s_get_collect(kvedge_client__path_t *path, const kvedge_block_key_t *keys, s_batch_t *b,
                         int64_t deadline, kvedge_client__sink_t *sink, kvedge_fetched_t *out)
{
    int *st = malloc(b->n * sizeof *st);
    zframe_t **blocks = calloc(b->n, sizeof *blocks);
    int rc = b->rc == KVEDGE_OK ? kvedge_client__path_wait(path, b->r) : b->rc;
    if (rc == KVEDGE_OK)
        rc = st && blocks ? s_get_parse(b->r, b->n, st, blocks) : KVEDGE_ENOMEM;
    if (b->rc == KVEDGE_OK)
        kvedge_client__req_release(b->r);
    if (rc == KVEDGE_OK)
        s_get_refetch(path, keys, b, deadline, st, blocks);
    for (uint32_t k = 0; k < b->n; k++) {
        kvedge_fetched_t *o = &out[b->idx[k]];
        if (rc != KVEDGE_OK) {
            *o = (kvedge_fetched_t){rc, 0, 0};
            continue;
        }
        kvedge_client__sink_put(sink, st[k], blocks[k] ? zframe_data(blocks[k]) : NULL,
                                blocks[k] ? zframe_size(blocks[k]) : 0, o);
        zframe_destroy(&blocks[k]);
    }
    free(st);
    free(blocks);
    s_batch_clear(b);
    return rc;
}

/* Keys go in messages of the node's max_items, two in flight; blocks land in key order. Once
 * one block does not fit, it and every later block found get KVEDGE_ENOSPACE with len set to
 * the bytes it needs (so offsets stay in key order); misses keep their own status. */
int kvedge_client_get(kvedge_client_t *c, const kvedge_block_key_t *keys, size_t n, uint8_t *buf,
                      size_t cap, kvedge_fetched_t *out)
{
    KVEDGE_CLIENT__ENTER(c);
    if (!c || (n && (!keys || !out)) || (cap && !buf))
        return KVEDGE_EINVAL;
    if (n == 0)
        return KVEDGE_OK;
    int64_t deadline = kvedge_client__deadline(c, 0);
    uint32_t per = c->max_items < KVEDGE_WIRE_MAX_ITEMS ? c->max_items : KVEDGE_WIRE_MAX_ITEMS;
    kvedge_client__sink_t sink = {buf, cap, 0, false};
    s_batch_t win[S_GET_PIPELINE];
    memset(win, 0, sizeof win);
    size_t next = 0, head = 0, used = 0;
    int rc = KVEDGE_OK;
    kvedge_client__path_t path = kvedge_client__path_open(c);
    while (next < n || used > 0) {
        if (next < n && used < S_GET_PIPELINE) {
            s_batch_t *b = &win[(head + used) % S_GET_PIPELINE];
            b->n = (uint32_t)(n - next < per ? n - next : per);
            b->idx = malloc(b->n * sizeof *b->idx);
            for (uint32_t k = 0; b->idx && k < b->n; k++)
                b->idx[k] = next + k;
            b->r = b->idx ? s_get_request(keys, b->idx, b->n, deadline) : NULL;
            if (!b->r) {
                for (size_t i = next; i < n; i++)
                    out[i] = (kvedge_fetched_t){KVEDGE_ENOMEM, 0, 0};
                rc = rc ? rc : KVEDGE_ENOMEM;
                next = n;
                s_batch_clear(b);
                continue;
            }
            b->rc = kvedge_client__path_submit(&path, b->r);
            next += b->n;
            used++;
            continue;
        }
        int brc = s_get_collect(&path, keys, &win[head], deadline, &sink, out);
        rc = rc ? rc : brc;
        head = (head + 1) % S_GET_PIPELINE;
        used--;
    }
    kvedge_client__path_close(&path, false);
    if (rc == KVEDGE_OK && sink.full)
        rc = KVEDGE_ENOSPACE;
    return kvedge_client__role_err(c, KVEDGE_OP_GET, rc);
}

/* ---------------------------------------------------------------- chunk operations */

static uint32_t s_per_chunks(const kvedge_client_t *c)
{
    return c->max_chunks < KVEDGE_WIRE_MAX_CHUNKS ? c->max_chunks : KVEDGE_WIRE_MAX_CHUNKS;
}

/* A request carrying n chunk ids. */
static kvedge_client__req_t *s_ids_request(uint8_t opcode, const kvedge_chunk_id_t *ids, uint32_t n,
                                           int64_t deadline)
{
    return kvedge_client__req_frame(opcode, n, deadline, ids, (size_t)n * KVEDGE_CHUNK_ID_BYTES,
                                    NULL);
}

int kvedge_client_lookup(kvedge_client_t *c, const kvedge_chunk_id_t *ids, size_t n, size_t *hit)
{
    KVEDGE_CLIENT__ENTER(c);
    if (!c || (n && !ids) || !hit)
        return KVEDGE_EINVAL;
    *hit = 0;
    int64_t deadline = kvedge_client__deadline(c, 0);
    uint32_t per = s_per_chunks(c);
    /* The prefix continues into the next message only while every chunk so far is held. */
    for (size_t off = 0; off < n;) {
        uint32_t k = (uint32_t)(n - off < per ? n - off : per);
        kvedge_client__req_t *r = s_ids_request(KVEDGE_OP_LOOKUP, ids + off, k, deadline);
        int rc = r ? kvedge_client__call(c, r) : KVEDGE_ENOMEM;
        if (rc != KVEDGE_OK)
            return rc;
        uint32_t got = r->rh.count;
        kvedge_client__req_release(r);
        if (got > k)
            return KVEDGE_EPROTO;
        *hit += got;
        if (got < k)
            break;
        off += k;
    }
    return KVEDGE_OK;
}

/* DELETE, PIN, UNPIN: one u32 per chunk. */
static int s_chunks_op(kvedge_client_t *c, uint8_t opcode, const kvedge_chunk_id_t *ids, size_t n,
                       uint32_t *changed)
{
    if (!c || (n && !ids))
        return KVEDGE_EINVAL;
    int64_t deadline = kvedge_client__deadline(c, 0);
    uint32_t per = s_per_chunks(c);
    for (size_t off = 0; off < n;) {
        uint32_t k = (uint32_t)(n - off < per ? n - off : per);
        kvedge_client__req_t *r = s_ids_request(opcode, ids + off, k, deadline);
        int rc = r ? kvedge_client__call(c, r) : KVEDGE_ENOMEM;
        if (rc != KVEDGE_OK)
            return rc;
        if (r->rh.count != k)
            rc = KVEDGE_EPROTO;
        const uint8_t *p = zframe_data(zmsg_first(r->reply));
        for (uint32_t j = 0; rc == KVEDGE_OK && changed && j < k; j++)
            changed[off + j] = kvedge_le_get32(p + (size_t)j * 4);
        kvedge_client__req_release(r);
        if (rc != KVEDGE_OK)
            return rc;
        off += k;
    }
    return KVEDGE_OK;
}

int kvedge_client_delete(kvedge_client_t *c, const kvedge_chunk_id_t *ids, size_t n,
                         uint32_t *changed)
{
    KVEDGE_CLIENT__ENTER(c);
    return s_chunks_op(c, KVEDGE_OP_DELETE, ids, n, changed);
}

int kvedge_client_pin(kvedge_client_t *c, const kvedge_chunk_id_t *ids, size_t n, bool pin,
                      uint32_t *changed)
{
    KVEDGE_CLIENT__ENTER(c);
    return s_chunks_op(c, pin ? KVEDGE_OP_PIN : KVEDGE_OP_UNPIN, ids, n, changed);
}

int kvedge_client_list(kvedge_client_t *c, const kvedge_chunk_id_t *after,
                       kvedge_chunk_entry_t *out, size_t max, size_t *n, bool *more)
{
    KVEDGE_CLIENT__ENTER(c);
    if (!c || !out || max == 0 || !n)
        return KVEDGE_EINVAL;
    *n = 0;
    uint32_t want = max < KVEDGE_WIRE_MAX_LIST ? (uint32_t)max : KVEDGE_WIRE_MAX_LIST;
    kvedge_client__req_t *r =
        kvedge_client__req_frame(KVEDGE_OP_LIST, 0, kvedge_client__deadline(c, 0), after,
                                 after ? KVEDGE_CHUNK_ID_BYTES : 0, NULL);
    uint8_t w[4];
    kvedge_le_put32(w, want);
    if (r && zmsg_addmem(r->payload, w, sizeof w) != 0) {
        kvedge_client__req_free(r);
        r = NULL;
    }
    int rc = r ? kvedge_client__call(c, r) : KVEDGE_ENOMEM;
    if (rc != KVEDGE_OK)
        return rc;
    uint32_t got = r->rh.count;
    if (got > want)
        rc = KVEDGE_EPROTO;
    const uint8_t *p = zframe_data(zmsg_first(r->reply));
    for (uint32_t i = 0; rc == KVEDGE_OK && i < got; i++) {
        kvedge_wire_chunk_entry_t e;
        rc = kvedge_wire_chunk_entry_parse(p + (size_t)i * KVEDGE_WIRE_CHUNK_ENTRY_BYTES,
                                           KVEDGE_WIRE_CHUNK_ENTRY_BYTES, &e);
        out[i] = (kvedge_chunk_entry_t){e.chunk, e.blocks, e.bytes, e.pinned_blocks, e.fp16_bytes};
    }
    if (rc == KVEDGE_OK) {
        *n = got;
        if (more)
            *more = !(r->rh.flags & KVEDGE_WIRE_FLAG_END);
    }
    kvedge_client__req_release(r);
    return rc;
}
