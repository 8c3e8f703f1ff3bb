/* The mover: the tier as the directory shows it, the plan that puts chunks where placement
 * says, node-to-node copies under a bandwidth limit, and the node's background re-replication. */
#include "store/node/mover.h"

#include <czmq.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/clock.h"
#include "access/codec/error.h"
#include "runtime/log.h"

/* Per chunk and node, in s_chunk_t.held. */
#define S_ENTRY    1u /* the node's directory names the chunk */
#define S_COMPLETE 2u /* ... with every layer of its model */
#define S_LISTED   4u /* the node's LIST (the lister's tenant) named it */

typedef struct {
    kvedge_chunk_id_t id; /* as the directory key says (client ids) */
    uint8_t *held;        /* n_nodes entries of S_* bits */
    bool known;           /* info learnt from a LIST */
    bool pinned;          /* a LIST said every block of it is pinned */
    kvedge_chunk_info_t info;
    uint64_t bytes;
    int root_state; /* 0 not walked, 1 root known, -1 no root */
    kvedge_chunk_id_t root;
} s_chunk_t;

struct kvedge_tier_t {
    kvedge_tier_node_t *nodes;
    kvedge_place_node_t *place;
    size_t n;
    s_chunk_t *chunks;
    size_t nc, cap;
    zhashx_t *index; /* chunk hex -> index + 1 */
    zhashx_t *ids;   /* node id -> index + 1 */
    uint32_t skipped, unplaced;
    char gone[KVEDGE_MASTER_MAX_ID_BYTES + 1];
};

/* ---------------------------------------------------------------- the tier */

typedef struct {
    kvedge_tier_t *t;
    kvedge_mview_t *view;
    uint64_t now_ms, grace_ms;
    int rc;
} s_read_t;

static int s_read_node(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    (void)seq;
    s_read_t *r = ctx;
    kvedge_master_key_t k;
    kvedge_master_node_t rec;
    if (kvedge_master_key_parse(key, strlen(key), &k) != KVEDGE_OK ||
        k.space != KVEDGE_MASTER_SPACE_NODE ||
        kvedge_master_node_parse(body, len, &rec) != KVEDGE_OK || rec.role != KVEDGE_ROLE_CLOUD)
        return 0;
    kvedge_tier_t *t = r->t;
    if (t->n == KVEDGE_PLACE_MAX_NODES)
        return 0;
    kvedge_tier_node_t *p = realloc(t->nodes, (t->n + 1) * sizeof *p);
    if (!p) {
        r->rc = KVEDGE_ENOMEM;
        return 1;
    }
    t->nodes = p;
    kvedge_tier_node_t *nd = &t->nodes[t->n++];
    memset(nd, 0, sizeof *nd);
    snprintf(nd->id, sizeof nd->id, "%.64s", k.a);
    zhashx_update(t->ids, nd->id, (void *)(uintptr_t)t->n);
    snprintf(nd->endpoint, sizeof nd->endpoint, "%s", rec.endpoint);
    snprintf(nd->public_key, sizeof nd->public_key, "%s", rec.public_key);
    nd->capacity = rec.capacity_bytes;
    kvedge_master_health_t h;
    if (kvedge_mview_health(r->view, nd->id, &h) == KVEDGE_OK) {
        nd->health = (int)h.state;
        nd->up = h.state == KVEDGE_MASTER_HEALTH_UP;
        uint64_t down_for = r->now_ms > h.changed_ms ? r->now_ms - h.changed_ms : 0;
        nd->live =
            h.state != KVEDGE_MASTER_HEALTH_DOWN || (r->grace_ms > 0 && down_for < r->grace_ms);
    } else {
        nd->live = true; /* registered, not yet heard of: neither placed nor given up */
    }
    return 0;
}

static bool s_complete(const kvedge_master_dir_t *d)
{
    if (d->layers == 0)
        return false;
    for (unsigned l = 0; l < d->layers; l++)
        if (!kvedge_master_dir_has(d, l))
            return false;
    return true;
}

static s_chunk_t *s_chunk_get(kvedge_tier_t *t, const char *hex, bool add)
{
    uintptr_t at = (uintptr_t)zhashx_lookup(t->index, hex);
    if (at)
        return &t->chunks[at - 1];
    if (!add)
        return NULL;
    kvedge_chunk_id_t id;
    if (kvedge_chunk_id_parse(hex, &id) != KVEDGE_OK)
        return NULL;
    if (t->nc == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 256;
        s_chunk_t *p = realloc(t->chunks, cap * sizeof *p);
        if (!p)
            return NULL;
        t->chunks = p;
        t->cap = cap;
    }
    s_chunk_t *c = &t->chunks[t->nc];
    memset(c, 0, sizeof *c);
    c->id = id;
    c->held = calloc(t->n ? t->n : 1, 1);
    if (!c->held)
        return NULL;
    t->nc++;
    zhashx_insert(t->index, hex, (void *)(uintptr_t)t->nc);
    return c;
}

static int s_read_dir(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    (void)seq;
    s_read_t *r = ctx;
    kvedge_tier_t *t = r->t;
    kvedge_master_key_t k;
    kvedge_master_dir_t d;
    if (kvedge_master_key_parse(key, strlen(key), &k) != KVEDGE_OK ||
        k.space != KVEDGE_MASTER_SPACE_DIR || kvedge_master_dir_parse(body, len, &d) != KVEDGE_OK)
        return 0;
    int i = kvedge_tier_find(t, k.a);
    if (i < 0) {
        kvedge_master_node_t rec;
        if (kvedge_mview_node(r->view, k.a, &rec) != KVEDGE_OK) {
            t->skipped++; /* a node that is gone: its entries say nothing we can use */
            if (!t->gone[0])
                snprintf(t->gone, sizeof t->gone, "%.64s", k.a);
        }
        return 0; /* an edge node's historical copies are not placed */
    }
    s_chunk_t *c = s_chunk_get(t, k.b, true);
    if (!c) {
        r->rc = KVEDGE_ENOMEM;
        return 1;
    }
    c->held[i] |= (uint8_t)(S_ENTRY | (s_complete(&d) ? S_COMPLETE : 0));
    return 0;
}

int kvedge_tier_read(kvedge_mview_t *view, uint64_t now_ms, uint64_t grace_ms, kvedge_tier_t **out)
{
    if (!view || !out)
        return KVEDGE_EINVAL;
    *out = NULL;
    kvedge_tier_t *t = calloc(1, sizeof *t);
    if (!t || !(t->index = zhashx_new()) || !(t->ids = zhashx_new())) {
        if (t)
            zhashx_destroy(&t->index);
        zhashx_destroy(&t->ids);
        free(t);
        return KVEDGE_ENOMEM;
    }
    s_read_t r = {t, view, now_ms, grace_ms, KVEDGE_OK};
    int rc = kvedge_mview_foreach(view, "node/", s_read_node, &r);
    if (rc == KVEDGE_OK && r.rc == KVEDGE_OK) {
        t->place = calloc(t->n ? t->n : 1, sizeof *t->place);
        if (!t->place)
            rc = KVEDGE_ENOMEM;
        for (size_t i = 0; t->place && i < t->n; i++) {
            memcpy(t->place[i].id, t->nodes[i].id, sizeof t->place[i].id);
            t->place[i].weight = t->nodes[i].capacity;
            t->place[i].up = t->nodes[i].up;
        }
    }
    if (rc == KVEDGE_OK && r.rc == KVEDGE_OK)
        rc = kvedge_mview_foreach(view, "dir/", s_read_dir, &r);
    if (rc == KVEDGE_OK)
        rc = r.rc;
    if (rc != KVEDGE_OK) {
        kvedge_tier_destroy(&t);
        return rc;
    }
    *out = t;
    return KVEDGE_OK;
}

void kvedge_tier_destroy(kvedge_tier_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_tier_t *t = *self_p;
    for (size_t i = 0; i < t->nc; i++)
        free(t->chunks[i].held);
    free(t->chunks);
    zhashx_destroy(&t->index);
    zhashx_destroy(&t->ids);
    free(t->place);
    free(t->nodes);
    free(t);
    *self_p = NULL;
}

const kvedge_tier_node_t *kvedge_tier_nodes(const kvedge_tier_t *t, size_t *n)
{
    if (n)
        *n = t ? t->n : 0;
    return t ? t->nodes : NULL;
}

int kvedge_tier_find(const kvedge_tier_t *t, const char *id)
{
    if (!t || !id)
        return -1;
    uintptr_t at = (uintptr_t)zhashx_lookup(t->ids, id);
    return at ? (int)at - 1 : -1;
}

int kvedge_tier_learn(kvedge_tier_t *t, size_t node, const kvedge_chunk_entry_t *e, size_t n)
{
    if (!t || node >= t->n || (!e && n))
        return KVEDGE_EINVAL;
    kvedge_tier_node_t *nd = &t->nodes[node];
    nd->listed = true;
    for (size_t i = 0; i < n; i++) {
        nd->bytes += e[i].bytes;
        char hex[KVEDGE_MASTER_CHUNK_HEX_BYTES + 1];
        kvedge_master_chunk_hex(&e[i].chunk.id, hex);
        s_chunk_t *c = s_chunk_get(t, hex, false);
        if (!c)
            continue; /* not in the directory yet: the next pass sees it */
        c->held[node] |= S_LISTED;
        if (!c->known) {
            c->known = true;
            c->info = e[i].chunk;
            c->bytes = e[i].bytes;
        }
        c->pinned |= e[i].blocks > 0 && e[i].pinned_blocks == e[i].blocks;
    }
    return KVEDGE_OK;
}

uint32_t kvedge_tier_skipped(const kvedge_tier_t *t, uint32_t *unplaced, const char **gone)
{
    if (unplaced)
        *unplaced = t ? t->unplaced : 0;
    if (gone)
        *gone = t ? t->gone : "";
    return t ? t->skipped : 0;
}

static uint32_t s_r(const kvedge_tier_t *t, uint32_t r)
{
    size_t up = 0;
    for (size_t i = 0; i < t->n; i++)
        up += t->nodes[i].up && t->nodes[i].capacity > 0;
    return kvedge_place_replicas(r, up);
}

uint32_t kvedge_tier_backlog(const kvedge_tier_t *t, uint32_t r, uint32_t *stranded)
{
    uint32_t below = 0, none = 0;
    if (t) {
        uint32_t want = s_r(t, r);
        for (size_t i = 0; i < t->nc; i++) {
            uint32_t live = 0;
            bool source = false;
            for (size_t j = 0; j < t->n; j++)
                if (t->chunks[i].held[j] & S_COMPLETE) {
                    live += t->nodes[j].live;
                    source |= t->nodes[j].up;
                }
            if (live < want) {
                below++;
                none += !source;
            }
        }
    }
    if (stranded)
        *stranded = none;
    return below;
}

double kvedge_tier_skew(const kvedge_tier_t *t)
{
    uint64_t max = 0, sum = 0;
    size_t n = 0;
    for (size_t i = 0; t && i < t->n; i++) {
        if (!t->nodes[i].up || t->nodes[i].capacity == 0)
            continue;
        n++;
        sum += t->nodes[i].bytes;
        if (t->nodes[i].bytes > max)
            max = t->nodes[i].bytes;
    }
    if (!n || !sum)
        return 0;
    return (double)max / ((double)sum / (double)n);
}

/* The placement skew by the directory: max / mean of the complete chunks each up cloud node of
 * weight > 0 holds (0 when none holds any). Unlike kvedge_tier_skew it needs no LIST. */
static double s_dir_skew(const kvedge_tier_t *t)
{
    uint64_t max = 0, sum = 0;
    size_t n = 0;
    for (size_t j = 0; j < t->n; j++) {
        if (!t->nodes[j].up || t->nodes[j].capacity == 0)
            continue;
        uint64_t held = 0;
        for (size_t i = 0; i < t->nc; i++)
            held += (t->chunks[i].held[j] & S_COMPLETE) != 0;
        n++;
        sum += held;
        if (held > max)
            max = held;
    }
    return n && sum ? (double)max / ((double)sum / (double)n) : 0.0;
}

/* The root of chunk c: its chain walked up through the learnt parents. */
static s_chunk_t *s_parent(kvedge_tier_t *t, const s_chunk_t *c)
{
    char hex[KVEDGE_MASTER_CHUNK_HEX_BYTES + 1];
    kvedge_master_chunk_hex(&c->info.parent, hex);
    return s_chunk_get(t, hex, false);
}

/* Walks up from c until a chunk whose root is known, one without a parent (the root), or a
 * link that is missing; then writes the outcome on every chunk of the path, so each chain is
 * walked once however many of its chunks ask. */
static bool s_root(kvedge_tier_t *t, s_chunk_t *c)
{
    s_chunk_t *cur = c;
    int state = -1;
    kvedge_chunk_id_t root;
    for (uint32_t steps = 0; cur && steps < KVEDGE_MOVER_WALK_MAX; steps++) {
        if (cur->root_state) {
            state = cur->root_state;
            root = cur->root;
            break;
        }
        if (!cur->known)
            break;
        if (!cur->info.has_parent) {
            state = 1;
            root = cur->info.id;
            break;
        }
        cur = s_parent(t, cur);
    }
    cur = c;
    for (uint32_t steps = 0; cur && !cur->root_state && steps < KVEDGE_MOVER_WALK_MAX; steps++) {
        cur->root_state = state;
        if (state > 0)
            cur->root = root;
        cur = cur->known && cur->info.has_parent ? s_parent(t, cur) : NULL;
    }
    return state > 0;
}

typedef struct {
    kvedge_move_t *m;
    size_t n, cap;
} s_moves_t;

static int s_add(s_moves_t *v, kvedge_move_kind_t kind, uint32_t from, uint32_t to,
                 const s_chunk_t *c, bool lost)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 64;
        kvedge_move_t *p = realloc(v->m, cap * sizeof *p);
        if (!p)
            return KVEDGE_ENOMEM;
        v->m = p;
        v->cap = cap;
    }
    v->m[v->n++] = (kvedge_move_t){kind, from, to, c->info, c->root, c->bytes, lost, c->pinned};
    return KVEDGE_OK;
}

/* The moves of one chunk (root known) into copies and deletes. */
static int s_plan_chunk(kvedge_tier_t *t, s_chunk_t *c, kvedge_mover_mode_t mode, uint32_t r,
                        int self, uint32_t *order, uint32_t *pick, s_moves_t *copies,
                        s_moves_t *deletes)
{
    uint32_t got = 0;
    if (kvedge_place_rank(&c->root, t->place, t->n, order) != KVEDGE_OK ||
        kvedge_place_pick(&c->root, t->place, t->n, r, pick, &got) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    int src = -1;
    uint32_t live = 0;
    bool lost = false;
    for (size_t k = 0; k < t->n; k++) {
        uint32_t j = order[k];
        uint8_t h = c->held[j];
        lost |= (h & S_ENTRY) && !t->nodes[j].live;
        if (!(h & S_COMPLETE))
            continue;
        live += t->nodes[j].live;
        if (src < 0 && t->nodes[j].up && (h & S_LISTED))
            src = (int)j;
    }
    if (mode == KVEDGE_MOVER_REPAIR && live >= r)
        return KVEDGE_OK;
    if (src >= 0 && (self < 0 || src == self)) {
        uint32_t need = mode == KVEDGE_MOVER_REPAIR ? r - live : got;
        for (uint32_t k = 0; k < got && need > 0; k++) {
            if (c->held[pick[k]] & S_COMPLETE)
                continue;
            int rc = s_add(copies, KVEDGE_MOVE_COPY, (uint32_t)src, pick[k], c, lost);
            if (rc != KVEDGE_OK)
                return rc;
            need--;
        }
    }
    if (mode != KVEDGE_MOVER_REBALANCE)
        return KVEDGE_OK;
    for (uint32_t j = 0; j < t->n; j++) {
        bool placed = false;
        for (uint32_t k = 0; k < got; k++)
            placed |= pick[k] == j;
        if (!placed && t->nodes[j].up && (c->held[j] & S_LISTED)) {
            int rc = s_add(deletes, KVEDGE_MOVE_DELETE, j, j, c, false);
            if (rc != KVEDGE_OK)
                return rc;
        }
    }
    return KVEDGE_OK;
}

int kvedge_tier_plan(kvedge_tier_t *t, kvedge_mover_mode_t mode, uint32_t r, int self,
                     kvedge_move_t **moves, size_t *n)
{
    if (!t || !moves || !n || (mode != KVEDGE_MOVER_REPAIR && mode != KVEDGE_MOVER_REBALANCE) ||
        r > KVEDGE_PLACE_MAX_REPLICAS || self >= (int)t->n)
        return KVEDGE_EINVAL;
    *moves = NULL;
    *n = 0;
    uint32_t want = s_r(t, r);
    s_moves_t copies = {0}, deletes = {0};
    uint32_t *order = calloc(t->n ? t->n : 1, sizeof *order);
    uint32_t *pick = calloc(KVEDGE_PLACE_MAX_REPLICAS, sizeof *pick);
    int rc = order && pick ? KVEDGE_OK : KVEDGE_ENOMEM;
    t->unplaced = 0;
    for (size_t i = 0; i < t->nc && rc == KVEDGE_OK; i++) {
        s_chunk_t *c = &t->chunks[i];
        /* A node plans only what it listed itself; the CLI what anybody listed. */
        if (self >= 0 && !(c->held[self] & S_LISTED))
            continue;
        if (!s_root(t, c)) {
            t->unplaced++;
            continue;
        }
        rc = s_plan_chunk(t, c, mode, want, self, order, pick, &copies, &deletes);
    }
    free(order);
    free(pick);
    if (rc == KVEDGE_OK && deletes.n) {
        size_t total = copies.n + deletes.n;
        kvedge_move_t *p = realloc(copies.m, total * sizeof *p);
        if (!p) {
            rc = KVEDGE_ENOMEM;
        } else {
            memcpy(p + copies.n, deletes.m, deletes.n * sizeof *p);
            copies.m = p;
            copies.n = total;
        }
    }
    free(deletes.m);
    if (rc != KVEDGE_OK) {
        free(copies.m);
        return rc;
    }
    *moves = copies.m;
    *n = copies.n;
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- connections and copies */

typedef struct {
    char endpoint[KVEDGE_MASTER_MAX_ENDPOINT_BYTES + 1];
    char key[KVEDGE_MASTER_KEY_Z85_BYTES + 1];
    kvedge_client_t *client;
} s_conn_t;

struct kvedge_mover_conns_t {
    kvedge_mover_io_t io;
    char cert[1024];
    zhashx_t *by_id;  /* node id -> s_conn_t */
    zhashx_t *failed; /* node id -> until when (mono ms) no new connection is tried */
    char why[512];    /* why the latest connection failed, for the copy's log line */
    int64_t pace_start_us;
    uint64_t pace_bytes;
};

static void s_conn_free(void **item)
{
    s_conn_t *c = *item;
    if (c) {
        kvedge_client_destroy(&c->client);
        free(c);
    }
    *item = NULL;
}

/* zhashx destructor of a malloc'd value. */
static void s_free_ms(void **item)
{
    free(*item);
    *item = NULL;
}

kvedge_mover_conns_t *kvedge_mover_conns_new(const kvedge_mover_io_t *io)
{
    kvedge_mover_conns_t *c = calloc(1, sizeof *c);
    if (!c || !(c->by_id = zhashx_new())) {
        free(c);
        return NULL;
    }
    zhashx_set_destructor(c->by_id, s_conn_free);
    if (!(c->failed = zhashx_new())) {
        zhashx_destroy(&c->by_id);
        free(c);
        return NULL;
    }
    zhashx_set_destructor(c->failed, s_free_ms);
    if (io)
        c->io = *io;
    if (io && io->cert) {
        snprintf(c->cert, sizeof c->cert, "%s", io->cert);
        c->io.cert = c->cert;
    }
    if (!c->io.deadline_ms)
        c->io.deadline_ms = KVEDGE_MOVER_DEADLINE_MS;
    return c;
}

void kvedge_mover_conns_destroy(kvedge_mover_conns_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_mover_conns_t *c = *self_p;
    zhashx_destroy(&c->by_id);
    zhashx_destroy(&c->failed);
    free(c);
    *self_p = NULL;
}

kvedge_client_t *kvedge_mover_conn(kvedge_mover_conns_t *c, const kvedge_tier_t *t, size_t i,
                                   char *why, size_t why_len)
{
    if (!c || !t || i >= t->n)
        return NULL;
    const kvedge_tier_node_t *nd = &t->nodes[i];
    s_conn_t *s = zhashx_lookup(c->by_id, nd->id);
    if (s && strcmp(s->endpoint, nd->endpoint) == 0 && strcmp(s->key, nd->public_key) == 0)
        return s->client;
    if (s)
        zhashx_delete(c->by_id, nd->id);
    int64_t *until = zhashx_lookup(c->failed, nd->id);
    if (until && kvedge_mono_ms() < *until) {
        snprintf(why, why_len, "node %s at %s did not answer a moment ago", nd->id, nd->endpoint);
        return NULL;
    }
    if (nd->public_key[0] && !c->io.cert) {
        snprintf(why, why_len, "node %s is CURVE (key %s): give this copier a certificate", nd->id,
                 nd->public_key);
        return NULL;
    }
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = nd->endpoint;
    o.server_key = nd->public_key[0] ? nd->public_key : NULL;
    o.client_cert = nd->public_key[0] ? c->io.cert : NULL;
    o.deadline_ms = c->io.deadline_ms;
    o.name = "kvedge-mover";
    kvedge_client_t *cl = NULL;
    int rc = kvedge_client_connect(&o, &cl);
    if (rc != KVEDGE_OK) {
        const char *more = kvedge_client_last_error();
        snprintf(why, why_len, "node %s at %s: %s%s%s", nd->id, nd->endpoint, kvedge_strerror(rc),
                 more[0] ? ": " : "", more);
        int64_t *t_until = malloc(sizeof *t_until);
        if (t_until) { /* the next moves to it fail at once, for a while */
            *t_until = kvedge_mono_ms() + KVEDGE_MOVER_RECENT_MS;
            zhashx_update(c->failed, nd->id, t_until);
        }
        return NULL;
    }
    s = calloc(1, sizeof *s);
    if (!s) {
        kvedge_client_destroy(&cl);
        snprintf(why, why_len, "out of memory");
        return NULL;
    }
    snprintf(s->endpoint, sizeof s->endpoint, "%s", nd->endpoint);
    snprintf(s->key, sizeof s->key, "%s", nd->public_key);
    s->client = cl;
    zhashx_update(c->by_id, nd->id, s);
    return cl;
}

/* A connection whose call failed is made again next time (the node may have restarted). */
static void s_conn_drop(kvedge_mover_conns_t *c, const kvedge_tier_t *t, size_t i)
{
    zhashx_delete(c->by_id, t->nodes[i].id);
}

int kvedge_mover_list(kvedge_mover_conns_t *c, kvedge_tier_t *t, size_t i)
{
    char why[512] = "";
    kvedge_client_t *cl = kvedge_mover_conn(c, t, i, why, sizeof why);
    if (!cl) {
        kvedge_log_warn("mover: %s", why);
        return KVEDGE_ETIMEDOUT;
    }
    kvedge_chunk_entry_t *e = NULL;
    size_t n = 0;
    int rc = kvedge_client_list_all(cl, &e, &n);
    if (rc == KVEDGE_OK)
        rc = kvedge_tier_learn(t, i, e, n);
    else
        s_conn_drop(c, t, i);
    free(e);
    return rc;
}

static bool s_stopped(const kvedge_mover_conns_t *c)
{
    return c->io.stop && atomic_load(c->io.stop);
}

/* Waits until bytes so far fit the bandwidth limit (slices of 100 ms, so a stop is seen). */
static void s_pace(kvedge_mover_conns_t *c, uint64_t bytes)
{
    if (!c->io.bw)
        return;
    int64_t now = kvedge_mono_us();
    if (!c->pace_bytes ||
        now - c->pace_start_us > 2000000ll + (int64_t)(c->pace_bytes * 1e6 / (double)c->io.bw)) {
        c->pace_start_us = now; /* idle since: a new window */
        c->pace_bytes = 0;
    }
    c->pace_bytes += bytes;
    int64_t until = c->pace_start_us + (int64_t)((double)c->pace_bytes * 1e6 / (double)c->io.bw);
    while (!s_stopped(c) && (now = kvedge_mono_us()) < until) {
        int64_t us = until - now < 100000 ? until - now : 100000;
        zclock_sleep((int)((us + 999) / 1000));
    }
}

/* The model's shape on the source, registered on the target when it lacks it. */
static int s_model(kvedge_client_t *src, kvedge_client_t *dst, const char *id, kvedge_model_t *m)
{
    int rc = kvedge_client_get_model(src, id, m);
    if (rc != KVEDGE_OK)
        return rc;
    kvedge_model_t there;
    rc = kvedge_client_get_model(dst, id, &there);
    if (rc == KVEDGE_ENOMODEL)
        rc = kvedge_client_put_model(dst, m);
    return rc;
}

/* One layer read ahead: a GET_LAYER stream lands in a buffer of its own, on the source
 * client's I/O thread, while the previous layer is put to the target. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool busy;  /* a stream is in flight: its on_done has not run */
    int status; /* how the stream ended */
    bool bad;   /* a block that did not fit, or a head out of range */
    uint16_t layer;
    uint32_t heads;        /* the model's KV heads */
    kvedge_fetched_t *out; /* heads entries */
    uint8_t *buf;
    size_t cap, used;
} s_slot_t;

static void s_on_block(void *ctx, uint32_t chunk_index, uint16_t head, int status,
                       const uint8_t *data, size_t len)
{
    s_slot_t *sl = ctx;
    if (chunk_index != 0 || head >= sl->heads) {
        sl->bad = true;
        return;
    }
    sl->out[head].status = status;
    if (status != KVEDGE_OK)
        return;
    if (len > sl->cap - sl->used) {
        sl->bad = true; /* grown and read again by s_slot_take */
        sl->out[head].status = KVEDGE_ENOSPACE;
        return;
    }
    memcpy(sl->buf + sl->used, data, len);
    sl->out[head].offset = sl->used;
    sl->out[head].len = len;
    sl->used += len;
}

static void s_on_done(void *ctx, int status, uint32_t heads)
{
    (void)heads;
    s_slot_t *sl = ctx;
    pthread_mutex_lock(&sl->mu);
    sl->status = status;
    sl->busy = false;
    pthread_cond_signal(&sl->cv);
    pthread_mutex_unlock(&sl->mu);
}

static int s_slot_init(s_slot_t *sl, uint32_t heads)
{
    memset(sl, 0, sizeof *sl);
    pthread_mutex_init(&sl->mu, NULL);
    pthread_cond_init(&sl->cv, NULL);
    sl->heads = heads;
    sl->cap = 4u << 20;
    sl->out = calloc(heads ? heads : 1, sizeof *sl->out);
    sl->buf = malloc(sl->cap);
    return sl->out && sl->buf ? KVEDGE_OK : KVEDGE_ENOMEM;
}

/* Waits for the slot's stream to end (on_done runs exactly once per stream started). */
static int s_slot_wait(s_slot_t *sl)
{
    pthread_mutex_lock(&sl->mu);
    while (sl->busy)
        pthread_cond_wait(&sl->cv, &sl->mu);
    int rc = sl->status;
    pthread_mutex_unlock(&sl->mu);
    return rc;
}

static void s_slot_fini(s_slot_t *sl)
{
    s_slot_wait(sl);
    free(sl->out);
    free(sl->buf);
    pthread_cond_destroy(&sl->cv);
    pthread_mutex_destroy(&sl->mu);
}

static int s_slot_start(kvedge_mover_conns_t *c, kvedge_client_t *src, const kvedge_move_t *mv,
                        s_slot_t *sl, uint16_t layer)
{
    sl->layer = layer;
    sl->used = 0;
    sl->bad = false;
    for (uint32_t h = 0; h < sl->heads; h++)
        sl->out[h] = (kvedge_fetched_t){KVEDGE_ENOTFOUND, 0, 0};
    sl->busy = true;
    int rc = kvedge_client_get_layer_async(src, &mv->chunk.id, 1, layer, c->io.deadline_ms,
                                           s_on_block, s_on_done, sl);
    if (rc != KVEDGE_OK)
        sl->busy = false; /* its callbacks never run */
    return rc;
}

/* The slot's layer whole: waits for its stream; a layer larger than the buffer is read again
 * into a larger one. */
static int s_slot_take(kvedge_mover_conns_t *c, kvedge_client_t *src, const kvedge_move_t *mv,
                       s_slot_t *sl)
{
    for (;;) {
        int rc = s_slot_wait(sl);
        if (rc != KVEDGE_OK)
            return rc;
        if (!sl->bad)
            break;
        bool full = false;
        for (uint32_t h = 0; h < sl->heads; h++)
            full |= sl->out[h].status == KVEDGE_ENOSPACE;
        if (!full || sl->cap >= KVEDGE_MOVER_LAYER_BYTES_MAX)
            return KVEDGE_EPROTO;
        uint8_t *p = realloc(sl->buf, sl->cap * 2);
        if (!p)
            return KVEDGE_ENOMEM;
        sl->buf = p;
        sl->cap *= 2;
        if ((rc = s_slot_start(c, src, mv, sl, sl->layer)) != KVEDGE_OK)
            return rc;
    }
    for (uint32_t h = 0; h < sl->heads; h++)
        if (sl->out[h].status != KVEDGE_OK)
            return sl->out[h].status; /* the source lacks a head: this copy would be partial */
    return KVEDGE_OK;
}

/* PUT of the slot's layer to dst, paced. */
static int s_put_layer(kvedge_mover_conns_t *c, kvedge_client_t *dst, const kvedge_move_t *mv,
                       const s_slot_t *sl, kvedge_put_item_t *items, uint64_t *bytes)
{
    uint64_t sum = 0;
    for (uint32_t h = 0; h < sl->heads; h++) {
        items[h] = (kvedge_put_item_t){.chunk = mv->chunk,
                                       .layer = sl->layer,
                                       .head = (uint16_t)h,
                                       .block = sl->buf + sl->out[h].offset,
                                       .len = sl->out[h].len,
                                       .pin = mv->pinned};
        sum += sl->out[h].len;
    }
    int rc = kvedge_client_put(dst, items, sl->heads, NULL);
    if (rc == KVEDGE_OK) {
        *bytes += sum;
        s_pace(c, sum);
    }
    return rc;
}

/* Every layer of a chunk from src to dst, the next layer streaming in while one is put. */
static int s_copy_layers(kvedge_mover_conns_t *c, kvedge_client_t *src, kvedge_client_t *dst,
                         const kvedge_move_t *mv, const kvedge_model_t *model, uint64_t *put)
{
    s_slot_t sl[2];
    int rc = s_slot_init(&sl[0], model->kv_heads);
    int rc1 = s_slot_init(&sl[1], model->kv_heads);
    kvedge_put_item_t *items = calloc(model->kv_heads ? model->kv_heads : 1, sizeof *items);
    if (rc == KVEDGE_OK && (rc1 != KVEDGE_OK || !items))
        rc = KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK && model->layers)
        rc = s_slot_start(c, src, mv, &sl[0], 0);
    for (uint32_t l = 0; rc == KVEDGE_OK && l < model->layers; l++) {
        s_slot_t *cur = &sl[l % 2];
        rc = s_slot_take(c, src, mv, cur);
        if (rc == KVEDGE_OK && l + 1 < model->layers)
            rc = s_slot_start(c, src, mv, &sl[(l + 1) % 2], (uint16_t)(l + 1));
        if (rc == KVEDGE_OK)
            rc = s_put_layer(c, dst, mv, cur, items, put);
        if (rc == KVEDGE_OK && s_stopped(c))
            rc = KVEDGE_ECLOSED;
    }
    s_slot_fini(&sl[0]); /* waits for a stream still in flight */
    s_slot_fini(&sl[1]);
    free(items);
    return rc;
}

int kvedge_mover_copy(kvedge_mover_conns_t *c, const kvedge_tier_t *t, const kvedge_move_t *m,
                      uint64_t *bytes)
{
    if (!c || !t || !m || m->kind != KVEDGE_MOVE_COPY || m->from >= t->n || m->to >= t->n)
        return KVEDGE_EINVAL;
    char why[512] = "";
    kvedge_client_t *src = kvedge_mover_conn(c, t, m->from, why, sizeof why);
    kvedge_client_t *dst = src ? kvedge_mover_conn(c, t, m->to, why, sizeof why) : NULL;
    if (!src || !dst) {
        snprintf(c->why, sizeof c->why, "%s", why); /* copy_all logs it, rate-limited */
        return KVEDGE_ETIMEDOUT;
    }
    kvedge_model_t model;
    uint64_t put = 0;
    int rc = s_model(src, dst, m->chunk.model_id, &model);
    if (rc == KVEDGE_OK)
        rc = s_copy_layers(c, src, dst, m, &model, &put);
    if (bytes)
        *bytes = put;
    if (rc == KVEDGE_ETIMEDOUT || rc == KVEDGE_ECLOSED) {
        s_conn_drop(c, t, m->from);
        s_conn_drop(c, t, m->to);
    }
    return rc;
}

void kvedge_mover_copy_all(kvedge_mover_conns_t *c, const kvedge_tier_t *t,
                           const kvedge_move_t *moves, size_t n, kvedge_mover_result_t *res)
{
    int64_t start = kvedge_mono_us();
    uint64_t failed = 0;
    for (size_t i = 0; i < n && !s_stopped(c); i++) {
        if (moves[i].kind != KVEDGE_MOVE_COPY)
            continue;
        uint64_t bytes = 0;
        int rc = kvedge_mover_copy(c, t, &moves[i], &bytes);
        res->bytes += bytes;
        char hex[KVEDGE_CHUNK_ID_HEX_BYTES];
        if (rc == KVEDGE_OK) {
            res->copies_done++;
            kvedge_log_debug("mover: chunk %.16s copied %s -> %s (%llu bytes)",
                             kvedge_chunk_id_hex(&moves[i].chunk.id, hex),
                             t->nodes[moves[i].from].id, t->nodes[moves[i].to].id,
                             (unsigned long long)bytes);
        } else if (++failed <= KVEDGE_MOVER_FAIL_LINES) {
            res->copies_failed++;
            kvedge_log_warn("mover: chunk %.16s not copied %s -> %s: %s",
                            kvedge_chunk_id_hex(&moves[i].chunk.id, hex),
                            t->nodes[moves[i].from].id, t->nodes[moves[i].to].id,
                            c->why[0] ? c->why : kvedge_strerror(rc));
        } else {
            res->copies_failed++;
        }
        c->why[0] = '\0';
    }
    if (failed > KVEDGE_MOVER_FAIL_LINES)
        kvedge_log_warn("mover: %llu more copies failed, not logged one by one",
                        (unsigned long long)(failed - KVEDGE_MOVER_FAIL_LINES));
    res->elapsed_us += (uint64_t)(kvedge_mono_us() - start);
}

static bool s_dir_complete(kvedge_mview_t *view, const char *node, const kvedge_chunk_id_t *id)
{
    kvedge_master_dir_t d;
    return kvedge_mview_dir(view, node, id, &d) == KVEDGE_OK && s_complete(&d);
}

bool kvedge_mover_landed(kvedge_mview_t *view, const kvedge_tier_t *t, const kvedge_move_t *moves,
                         size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (moves[i].kind == KVEDGE_MOVE_COPY &&
            !s_dir_complete(view, t->nodes[moves[i].to].id, &moves[i].chunk.id))
            return false;
    return true;
}

static int s_by_node_root(const void *a, const void *b)
{
    const kvedge_move_t *x = a, *y = b;
    if (x->to != y->to)
        return x->to < y->to ? -1 : 1;
    return memcmp(x->root.bytes, y->root.bytes, sizeof x->root.bytes);
}

/* Whether chunk m's placement holds it complete in the view, with r nodes at least. */
static bool s_placed_complete(kvedge_mview_t *view, const kvedge_tier_t *t, uint32_t r,
                              const kvedge_move_t *m)
{
    uint32_t pick[KVEDGE_PLACE_MAX_REPLICAS], got = 0;
    if (kvedge_place_pick(&m->root, t->place, t->n, r, pick, &got) != KVEDGE_OK || got < r)
        return false;
    for (uint32_t k = 0; k < got; k++)
        if (!s_dir_complete(view, t->nodes[pick[k]].id, &m->chunk.id))
            return false;
    return true;
}

void kvedge_mover_delete_all(kvedge_mover_conns_t *c, kvedge_mview_t *view, kvedge_tier_t *t,
                             uint32_t r, const kvedge_move_t *moves, size_t n,
                             kvedge_mover_result_t *res)
{
    size_t nd = 0;
    for (size_t i = 0; i < n; i++)
        nd += moves[i].kind == KVEDGE_MOVE_DELETE;
    kvedge_move_t *d = calloc(nd ? nd : 1, sizeof *d);
    kvedge_chunk_id_t *ids = calloc(nd ? nd : 1, sizeof *ids);
    if (!d || !ids) {
        free(d);
        free(ids);
        res->deletes_kept += nd;
        return;
    }
    nd = 0;
    for (size_t i = 0; i < n; i++)
        if (moves[i].kind == KVEDGE_MOVE_DELETE)
            d[nd++] = moves[i];
    qsort(d, nd, sizeof *d, s_by_node_root);
    uint32_t want = s_r(t, r);
    for (size_t i = 0; i < nd;) {
        size_t j = i;
        bool ok = true;
        while (j < nd && s_by_node_root(&d[i], &d[j]) == 0) {
            ok &= s_placed_complete(view, t, want, &d[j]);
            ids[j - i] = d[j].chunk.id;
            j++;
        }
        char why[512] = "";
        kvedge_client_t *cl = ok ? kvedge_mover_conn(c, t, d[i].to, why, sizeof why) : NULL;
        int rc = cl ? kvedge_client_delete(cl, ids, j - i, NULL) : KVEDGE_EBUSY;
        char hex[KVEDGE_CHUNK_ID_HEX_BYTES];
        if (rc == KVEDGE_OK) {
            res->deletes_done += j - i;
            kvedge_log_info("mover: chain %.16s deleted on %s (%zu chunks): its placement holds "
                            "it",
                            kvedge_chunk_id_hex(&d[i].root, hex), t->nodes[d[i].to].id, j - i);
        } else {
            res->deletes_kept += j - i;
            kvedge_log_warn("mover: chain %.16s kept on %s: %s",
                            kvedge_chunk_id_hex(&d[i].root, hex), t->nodes[d[i].to].id,
                            !ok      ? "its placement does not hold it complete yet"
                            : why[0] ? why
                                     : kvedge_strerror(rc));
        }
        i = j;
    }
    free(d);
    free(ids);
}

/* ---------------------------------------------------------------- the node's mover */

struct kvedge_mover_t {
    char node_id[KVEDGE_MASTER_MAX_ID_BYTES + 1];
    uint32_t replicas;
    uint64_t grace_ms;
    uint32_t interval_ms;
    kvedge_mview_t *view;
    kvedge_mover_conns_t *conns;
    atomic_bool stop;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;    /* one pass at a time */
    pthread_mutex_t st_mu; /* guards st */
    pthread_cond_t stop_cv;
    pthread_mutex_t stop_mu;
    kvedge_mover_stats_t st;
    zhashx_t *recent; /* "hex/node" -> expiry (mono ms, malloc'd int64) */
    zhashx_t *under;  /* chunk hex -> when first seen below R with no lost holder */
    uint32_t last_backlog;
    uint64_t last_seq;    /* the view's seq at the last full pass */
    bool last_pending;    /* a node was down within its grace then: time alone changes things */
    bool last_copied;     /* the last full pass copied something */
    int64_t last_full_ms; /* monotonic: when it ran */
    int64_t next_due_ms;  /* monotonic: when a chunk waiting out the grace is due; 0 none */
    int64_t gone_logged_ms;
    kvedge_series_t *m_backlog, *m_stranded, *m_bytes, *m_done, *m_failed, *m_skew;
};

static void s_metrics(kvedge_mover_t *m, kvedge_metrics_t *r)
{
    if (!r)
        return;
    m->m_backlog = kvedge_metrics_single(
        r, KVEDGE_METRIC_GAUGE, "kvedge_mover_backlog_chunks",
        "chunks of the cloud tier below R live complete replicas (re-replication waiting)", NULL,
        NULL, 0);
    m->m_stranded = kvedge_metrics_single(
        r, KVEDGE_METRIC_GAUGE, "kvedge_mover_stranded_chunks",
        "of the backlog, chunks no up node holds complete (nothing to copy from)", NULL, NULL, 0);
    m->m_bytes =
        kvedge_metrics_single(r, KVEDGE_METRIC_COUNTER, "kvedge_mover_bytes_moved_total",
                              "block bytes this node's mover copied to other nodes", NULL, NULL, 0);
    m->m_done = kvedge_metrics_single(r, KVEDGE_METRIC_COUNTER, "kvedge_mover_copies_done_total",
                                      "chunk copies this node's mover completed", NULL, NULL, 0);
    m->m_failed = kvedge_metrics_single(
        r, KVEDGE_METRIC_COUNTER, "kvedge_mover_copies_failed_total",
        "chunk copies this node's mover started and could not finish", NULL, NULL, 0);
    m->m_skew = kvedge_metrics_single(
        r, KVEDGE_METRIC_GAUGE, "kvedge_mover_placement_skew",
        "max / mean of the complete chunks the up cloud nodes hold by the directory, at the "
        "mover's last pass (1 = even; 0 = nothing held)",
        NULL, NULL, 0);
}

/* Keeps the copies of chunks a lost node held, and of the others those seen below R for the
 * grace period (a write in flight to its second replica is not copied under it). */
static size_t s_due(kvedge_mover_t *m, kvedge_move_t *moves, size_t n)
{
    int64_t now = kvedge_mono_ms();
    zhashx_t *seen = zhashx_new();
    if (!seen)
        return 0;
    zhashx_set_destructor(seen, s_free_ms);
    m->next_due_ms = 0;
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        char hex[KVEDGE_CHUNK_ID_HEX_BYTES];
        kvedge_chunk_id_hex(&moves[i].chunk.id, hex);
        int64_t *since = zhashx_lookup(m->under, hex);
        int64_t first = since ? *since : now;
        int64_t *keep = malloc(sizeof *keep);
        if (keep) {
            *keep = first;
            zhashx_update(seen, hex, keep);
        }
        if (moves[i].lost || now - first >= (int64_t)m->grace_ms)
            moves[w++] = moves[i];
        else if (!m->next_due_ms || first + (int64_t)m->grace_ms < m->next_due_ms)
            m->next_due_ms = first + (int64_t)m->grace_ms;
    }
    zhashx_destroy(&m->under);
    m->under = seen; /* what is no longer below R is forgotten */
    return w;
}

/* Drops the copies recently done from moves (and forgets expired ones): a target's directory
 * entry lags its PUT by a publisher interval. */
static size_t s_not_recent(kvedge_mover_t *m, const kvedge_tier_t *t, kvedge_move_t *moves,
                           size_t n)
{
    int64_t now = kvedge_mono_ms();
    zlistx_t *old = zlistx_new();
    for (int64_t *exp = zhashx_first(m->recent); exp; exp = zhashx_next(m->recent))
        if (*exp <= now)
            zlistx_add_end(old, (void *)zhashx_cursor(m->recent));
    for (const char *k = zlistx_first(old); k; k = zlistx_next(old))
        zhashx_delete(m->recent, k);
    zlistx_destroy(&old);
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        char key[KVEDGE_CHUNK_ID_HEX_BYTES + KVEDGE_MASTER_MAX_ID_BYTES + 2], hex[80];
        snprintf(key, sizeof key, "%s/%s", kvedge_chunk_id_hex(&moves[i].chunk.id, hex),
                 t->nodes[moves[i].to].id);
        if (!zhashx_lookup(m->recent, key))
            moves[w++] = moves[i];
    }
    return w;
}

static void s_remember(kvedge_mover_t *m, const kvedge_tier_t *t, const kvedge_move_t *moves,
                       size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char key[KVEDGE_CHUNK_ID_HEX_BYTES + KVEDGE_MASTER_MAX_ID_BYTES + 2], hex[80];
        snprintf(key, sizeof key, "%s/%s", kvedge_chunk_id_hex(&moves[i].chunk.id, hex),
                 t->nodes[moves[i].to].id);
        int64_t *exp = malloc(sizeof *exp);
        if (!exp)
            return;
        *exp = kvedge_mono_ms() + KVEDGE_MOVER_RECENT_MS;
        zhashx_update(m->recent, key, exp);
    }
}

/* Logs the skipped directory entries (a node gone) at most once a minute. */
static void s_log_skipped(kvedge_mover_t *m, const kvedge_tier_t *t)
{
    const char *gone;
    uint32_t unplaced;
    uint32_t skipped = kvedge_tier_skipped(t, &unplaced, &gone);
    int64_t now = kvedge_mono_ms();
    if (!skipped || (m->gone_logged_ms && now - m->gone_logged_ms < KVEDGE_MOVER_LOG_MS))
        return;
    m->gone_logged_ms = now;
    kvedge_log_warn("mover: %u directory entries skipped: they name node %s%s, which has no node "
                    "record (gone); delete its dir/%s/ records or let it register again",
                    skipped, gone, skipped > 1 ? " (and maybe others)" : "", gone);
}

/* Caller holds m->mu. */
/* Caller holds m->mu. Without force, a pass is skipped while nothing can have changed: the
 * registry is at the same seq, nothing was below R and no node was waiting out its grace (so
 * an idle tier costs no copy of the registry per second). */
static int s_pass(kvedge_mover_t *m, bool force)
{
    if (kvedge_mview_state(m->view) != KVEDGE_MVIEW_SYNCED)
        return KVEDGE_ETIMEDOUT;
    uint64_t seq = kvedge_mview_seq(m->view);
    int64_t now = kvedge_mono_ms();
    bool same = seq == m->last_seq && !m->last_pending;
    if (!force && same &&
        (!m->last_backlog || (!m->last_copied && now - m->last_full_ms < KVEDGE_MOVER_IDLE_MS &&
                              (!m->next_due_ms || now < m->next_due_ms))))
        return KVEDGE_OK;
    m->last_full_ms = now;
    kvedge_tier_t *t = NULL;
    int rc = kvedge_tier_read(m->view, kvedge_wall_ms(), m->grace_ms, &t);
    if (rc != KVEDGE_OK)
        return rc;
    m->last_seq = seq;
    m->last_pending = false;
    for (size_t i = 0; i < t->n; i++)
        m->last_pending |= t->nodes[i].health == KVEDGE_MASTER_HEALTH_DOWN && t->nodes[i].live;
    s_log_skipped(m, t);
    uint32_t stranded = 0;
    uint32_t backlog = kvedge_tier_backlog(t, m->replicas, &stranded);
    int self = kvedge_tier_find(t, m->node_id);
    kvedge_mover_result_t res = {0};
    if (backlog && self >= 0 && t->nodes[self].up) {
        if (backlog != m->last_backlog)
            kvedge_log_info("mover: %u chunks below %u live replicas (%u with no up source)",
                            backlog, s_r(t, m->replicas), stranded);
        kvedge_move_t *moves = NULL;
        size_t n = 0;
        if (kvedge_mover_list(m->conns, t, (size_t)self) == KVEDGE_OK &&
            kvedge_tier_plan(t, KVEDGE_MOVER_REPAIR, m->replicas, self, &moves, &n) == KVEDGE_OK) {
            n = s_due(m, moves, n);
            n = s_not_recent(m, t, moves, n);
            kvedge_mover_copy_all(m->conns, t, moves, n, &res);
            s_remember(m, t, moves, n);
            if (n)
                kvedge_log_info("mover: re-replication copied %llu of %zu chunks (%llu bytes, "
                                "%llu failed)",
                                (unsigned long long)res.copies_done, n,
                                (unsigned long long)res.bytes,
                                (unsigned long long)res.copies_failed);
        }
        free(moves);
    } else {
        zhashx_purge(m->under);
        m->next_due_ms = 0;
        if (!backlog && m->last_backlog)
            kvedge_log_info("mover: every chunk has its live replicas again");
    }
    m->last_backlog = backlog;
    m->last_copied = res.copies_done + res.copies_failed > 0;
    pthread_mutex_lock(&m->st_mu);
    m->st.backlog = backlog;
    m->st.stranded = stranded;
    m->st.passes++;
    m->st.total.copies_done += res.copies_done;
    m->st.total.copies_failed += res.copies_failed;
    m->st.total.bytes += res.bytes;
    m->st.total.elapsed_us += res.elapsed_us;
    pthread_mutex_unlock(&m->st_mu);
    if (m->m_backlog) {
        kvedge_series_set(m->m_backlog, backlog);
        kvedge_series_set(m->m_stranded, stranded);
        kvedge_series_add(m->m_bytes, res.bytes);
        kvedge_series_add(m->m_done, res.copies_done);
        kvedge_series_add(m->m_failed, res.copies_failed);
        kvedge_series_set(m->m_skew, s_dir_skew(t));
    }
    kvedge_tier_destroy(&t);
    return KVEDGE_OK;
}

static void *s_run(void *arg)
{
    kvedge_mover_t *m = arg;
    for (;;) {
        pthread_mutex_lock(&m->stop_mu);
        if (!atomic_load(&m->stop)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)m->interval_ms * 1000000ull;
            ts.tv_sec += (time_t)(ns / 1000000000ull);
            ts.tv_nsec = (long)(ns % 1000000000ull);
            pthread_cond_timedwait(&m->stop_cv, &m->stop_mu, &ts);
        }
        bool stop = atomic_load(&m->stop);
        pthread_mutex_unlock(&m->stop_mu);
        if (stop)
            break;
        pthread_mutex_lock(&m->mu);
        s_pass(m, false);
        pthread_mutex_unlock(&m->mu);
    }
    return NULL;
}

int kvedge_mover_start(const kvedge_mover_opts_t *o, kvedge_mover_t **out)
{
    if (!o || !out || !o->node_id || !kvedge_master_id_ok(o->node_id) || !o->master ||
        !o->master_pub || o->replicas > KVEDGE_PLACE_MAX_REPLICAS)
        return KVEDGE_EINVAL;
    *out = NULL;
    kvedge_mover_t *m = calloc(1, sizeof *m);
    if (!m)
        return KVEDGE_ENOMEM;
    snprintf(m->node_id, sizeof m->node_id, "%s", o->node_id);
    m->replicas = o->replicas;
    m->grace_ms = o->grace_ms ? o->grace_ms : KVEDGE_MOVER_GRACE_S_DEFAULT * 1000ull;
    m->interval_ms = o->interval_ms ? o->interval_ms : KVEDGE_MOVER_INTERVAL_MS;
    atomic_init(&m->stop, false);
    pthread_mutex_init(&m->mu, NULL);
    pthread_mutex_init(&m->st_mu, NULL);
    pthread_mutex_init(&m->stop_mu, NULL);
    pthread_cond_init(&m->stop_cv, NULL);
    m->recent = zhashx_new();
    m->under = zhashx_new();
    kvedge_mover_io_t io = {.cert = o->cert, .bw = o->bw, .stop = &m->stop};
    m->conns = kvedge_mover_conns_new(&io);
    if (!m->recent || !m->under || !m->conns) {
        kvedge_mover_destroy(&m);
        return KVEDGE_ENOMEM;
    }
    zhashx_set_destructor(m->recent, s_free_ms);
    zhashx_set_destructor(m->under, s_free_ms);
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = o->master;
    vo.pub = o->master_pub;
    vo.server_key = o->master_key;
    vo.client_cert = o->master_key ? o->cert : NULL;
    vo.start_wait_ms = -1;
    int rc = kvedge_mview_start(&vo, &m->view);
    if (rc != KVEDGE_OK) {
        kvedge_mover_destroy(&m);
        return rc;
    }
    s_metrics(m, o->metrics);
    if (pthread_create(&m->thread, NULL, s_run, m) != 0) {
        kvedge_mover_destroy(&m);
        return KVEDGE_ENOMEM;
    }
    m->started = true;
    *out = m;
    return KVEDGE_OK;
}

void kvedge_mover_destroy(kvedge_mover_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_mover_t *m = *self_p;
    pthread_mutex_lock(&m->stop_mu);
    atomic_store(&m->stop, true);
    pthread_cond_broadcast(&m->stop_cv);
    pthread_mutex_unlock(&m->stop_mu);
    if (m->started)
        pthread_join(m->thread, NULL);
    kvedge_mover_conns_destroy(&m->conns);
    kvedge_mview_destroy(&m->view);
    zhashx_destroy(&m->recent);
    zhashx_destroy(&m->under);
    pthread_cond_destroy(&m->stop_cv);
    pthread_mutex_destroy(&m->stop_mu);
    pthread_mutex_destroy(&m->st_mu);
    pthread_mutex_destroy(&m->mu);
    free(m);
    *self_p = NULL;
}

int kvedge_mover_pass(kvedge_mover_t *m)
{
    if (!m)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&m->mu);
    int rc = s_pass(m, true);
    pthread_mutex_unlock(&m->mu);
    return rc;
}

void kvedge_mover_stats(kvedge_mover_t *m, kvedge_mover_stats_t *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!m)
        return;
    pthread_mutex_lock(&m->st_mu);
    *out = m->st;
    pthread_mutex_unlock(&m->st_mu);
}
