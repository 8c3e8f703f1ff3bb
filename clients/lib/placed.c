/* The placed writer (clients/lib/placed.h): a placement over the caller's node list, and
 * every call fanned out to the replicas at once, one thread per replica. */
#include "clients/lib/placed.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "access/client_internal.h"
#include "access/codec/error.h"
#include "access/placement.h"

_Static_assert(KVEDGE_PLACED_MAX_NODES == KVEDGE_PLACE_MAX_NODES, "placement limits differ");
_Static_assert(KVEDGE_PLACED_MAX_REPLICAS == KVEDGE_PLACE_MAX_REPLICAS, "placement limits differ");
_Static_assert(KVEDGE_PLACED_REPLICAS_DEFAULT == KVEDGE_PLACE_REPLICAS_DEFAULT,
               "placement defaults differ");
_Static_assert(KVEDGE_PLACED_ID_BYTES == KVEDGE_PLACE_ID_BYTES, "node id sizes differ");

/* The smallest kvedge_placed_opts_t accepted (kvedge_abi_read): the first layout. When a
 * field is appended it stays, and an older caller's struct gets the new field's default. */
#define KVEDGE_PLACED_OPTS_SIZE_MIN sizeof(kvedge_placed_opts_t)

/* One replica: the node it is, its client, what it did. */
typedef struct {
    kvedge_placed_node_t node;
    kvedge_client_t *client;
    kvedge_placed_replica_t rep;
} s_replica_t;

struct kvedge_placed_t {
    kvedge_placed_opts_t opts;
    kvedge_chunk_id_t key;
    uint32_t asked, quorum, n;
    bool connect_tried;
    s_replica_t rep[KVEDGE_PLACED_MAX_REPLICAS];
};

void kvedge_placed_opts_default(kvedge_placed_opts_t *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof *opts);
    opts->size = sizeof *opts;
}

size_t kvedge_placed_usable(const kvedge_placed_node_t *nodes, size_t n)
{
    size_t ok = 0;
    for (size_t i = 0; nodes && i < n; i++)
        ok += nodes[i].up && nodes[i].weight > 0;
    return ok;
}

int kvedge_placed_new(const kvedge_placed_opts_t *opts, const kvedge_placed_node_t *nodes, size_t n,
                      const kvedge_chunk_id_t *key, kvedge_placed_t **out)
{
    if (!out)
        return KVEDGE_EINVAL;
    *out = NULL;
    kvedge_placed_opts_t o;
    kvedge_placed_opts_default(&o);
    int rc =
        kvedge_abi_read(&o, sizeof o, opts, KVEDGE_PLACED_OPTS_SIZE_MIN, "kvedge_placed_opts_t");
    if (rc != KVEDGE_OK)
        return rc;
    if (!key || (!nodes && n > 0) || n > KVEDGE_PLACED_MAX_NODES ||
        o.replicas > KVEDGE_PLACED_MAX_REPLICAS)
        return KVEDGE_EINVAL;
    uint32_t asked = o.replicas ? o.replicas : KVEDGE_PLACED_REPLICAS_DEFAULT;
    if (o.write_quorum > asked)
        return KVEDGE_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!nodes[i].id[0] || !memchr(nodes[i].id, 0, sizeof nodes[i].id) ||
            !nodes[i].endpoint[0] || !memchr(nodes[i].endpoint, 0, sizeof nodes[i].endpoint) ||
            !memchr(nodes[i].server_key, 0, sizeof nodes[i].server_key))
            return KVEDGE_EINVAL;
    size_t usable = kvedge_placed_usable(nodes, n);
    if (usable == 0 || usable < o.write_quorum)
        return KVEDGE_ENOTFOUND;
    kvedge_place_node_t *pn = calloc(n, sizeof *pn);
    kvedge_placed_t *pw = calloc(1, sizeof *pw);
    if (!pn || !pw) {
        free(pn);
        free(pw);
        return KVEDGE_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        memcpy(pn[i].id, nodes[i].id, sizeof pn[i].id);
        pn[i].weight = nodes[i].weight;
        pn[i].up = nodes[i].up;
    }
    uint32_t pick[KVEDGE_PLACED_MAX_REPLICAS], got = 0;
    rc = kvedge_place_pick(key, pn, n, asked, pick, &got);
    free(pn);
    if (rc != KVEDGE_OK || got == 0) {
        free(pw);
        return rc != KVEDGE_OK ? rc : KVEDGE_ENOTFOUND;
    }
    pw->opts = o;
    pw->key = *key;
    pw->asked = asked;
    pw->n = got;
    pw->quorum = o.write_quorum ? o.write_quorum : got;
    for (uint32_t i = 0; i < got; i++) {
        s_replica_t *r = &pw->rep[i];
        r->node = nodes[pick[i]];
        memcpy(r->rep.id, r->node.id, sizeof r->rep.id);
        memcpy(r->rep.endpoint, r->node.endpoint, sizeof r->rep.endpoint);
    }
    *out = pw;
    return KVEDGE_OK;
}

void kvedge_placed_destroy(kvedge_placed_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_placed_t *pw = *self_p;
    for (uint32_t i = pw->n; i-- > 0;)
        kvedge_client_destroy(&pw->rep[i].client);
    free(pw);
    *self_p = NULL;
}

uint32_t kvedge_placed_asked(const kvedge_placed_t *pw)
{
    return pw ? pw->asked : 0;
}

uint32_t kvedge_placed_count(const kvedge_placed_t *pw)
{
    return pw ? pw->n : 0;
}

uint32_t kvedge_placed_quorum(const kvedge_placed_t *pw)
{
    return pw ? pw->quorum : 0;
}

uint32_t kvedge_placed_acked(const kvedge_placed_t *pw)
{
    uint32_t ok = 0;
    for (uint32_t i = 0; pw && i < pw->n; i++)
        ok += pw->rep[i].rep.connected && pw->rep[i].rep.status == KVEDGE_OK;
    return ok;
}

int kvedge_placed_replica(const kvedge_placed_t *pw, uint32_t i, kvedge_placed_replica_t *out)
{
    if (!pw || !out || i >= pw->n)
        return KVEDGE_EINVAL;
    *out = pw->rep[i].rep;
    return KVEDGE_OK;
}

int kvedge_placed_key(const kvedge_placed_t *pw, kvedge_chunk_id_t *out)
{
    if (!pw || !out)
        return KVEDGE_EINVAL;
    *out = pw->key;
    return KVEDGE_OK;
}

kvedge_client_t *kvedge_placed_client(kvedge_placed_t *pw, uint32_t i)
{
    if (!pw || i >= pw->n || pw->rep[i].rep.status != KVEDGE_OK)
        return NULL;
    return pw->rep[i].client;
}

/* ---------------------------------------------------------------- fan-out */

typedef enum { S_CONNECT, S_MODEL, S_PUT } s_op_t;

/* One replica's share of a call, run on its own thread (the last on the caller's). */
typedef struct {
    kvedge_placed_t *pw;
    s_replica_t *r;
    s_op_t op;
    const kvedge_model_t *model;
    const kvedge_put_item_t *items;
    size_t n;
} s_job_t;

/* Marks r failed with rc and this thread's client message. */
static void s_fail(s_replica_t *r, int rc)
{
    r->rep.status = rc;
    snprintf(r->rep.error, sizeof r->rep.error, "%s", kvedge_client_last_error());
}

static void *s_run(void *arg)
{
    s_job_t *j = arg;
    s_replica_t *r = j->r;
    int rc = KVEDGE_OK;
    if (j->op == S_CONNECT) {
        kvedge_client_opts_t co;
        kvedge_client_opts_default(&co);
        co.endpoint = r->node.endpoint;
        co.server_key = r->node.server_key[0] ? r->node.server_key : NULL;
        co.client_cert = r->node.server_key[0] ? j->pw->opts.client_cert : NULL;
        co.deadline_ms = j->pw->opts.deadline_ms;
        co.name = j->pw->opts.name;
        rc = kvedge_client_connect(&co, &r->client);
        r->rep.connected = rc == KVEDGE_OK;
    } else if (j->op == S_MODEL) {
        rc = kvedge_client_put_model(r->client, j->model);
    } else {
        rc = kvedge_client_put(r->client, j->items, j->n, NULL);
        if (rc == KVEDGE_OK)
            r->rep.items += j->n;
    }
    if (rc != KVEDGE_OK)
        s_fail(r, rc);
    return NULL;
}

/* Runs op on every live replica at once; 0 when W replicas are still whole, else the first
 * failure's code. */
static int s_fan_out(kvedge_placed_t *pw, s_op_t op, const kvedge_model_t *model,
                     const kvedge_put_item_t *items, size_t n)
{
    s_job_t job[KVEDGE_PLACED_MAX_REPLICAS];
    pthread_t th[KVEDGE_PLACED_MAX_REPLICAS];
    bool started[KVEDGE_PLACED_MAX_REPLICAS] = {false};
    uint32_t live = 0;
    for (uint32_t i = 0; i < pw->n; i++) {
        s_replica_t *r = &pw->rep[i];
        if (r->rep.status != KVEDGE_OK || (op != S_CONNECT && !r->client) ||
            (op == S_CONNECT && r->client))
            continue;
        job[live] = (s_job_t){pw, r, op, model, items, n};
        live++;
    }
    /* Every job but the last on a thread of its own; a thread that cannot start runs here. */
    for (uint32_t i = 0; i + 1 < live; i++)
        started[i] = pthread_create(&th[i], NULL, s_run, &job[i]) == 0;
    for (uint32_t i = 0; i < live; i++)
        if (i + 1 == live || !started[i])
            s_run(&job[i]);
    for (uint32_t i = 0; i + 1 < live; i++)
        if (started[i])
            pthread_join(th[i], NULL);
    if (kvedge_placed_acked(pw) >= pw->quorum)
        return KVEDGE_OK;
    for (uint32_t i = 0; i < pw->n; i++)
        if (pw->rep[i].rep.status != KVEDGE_OK)
            return pw->rep[i].rep.status;
    return KVEDGE_ECLOSED; /* not reached: fewer than W whole means one failed */
}

int kvedge_placed_connect(kvedge_placed_t *pw)
{
    if (!pw)
        return KVEDGE_EINVAL;
    pw->connect_tried = true;
    return s_fan_out(pw, S_CONNECT, NULL, NULL, 0);
}

int kvedge_placed_put_model(kvedge_placed_t *pw, const kvedge_model_t *model)
{
    if (!pw || !model || !pw->connect_tried)
        return KVEDGE_EINVAL;
    return s_fan_out(pw, S_MODEL, model, NULL, 0);
}

int kvedge_placed_put(kvedge_placed_t *pw, const kvedge_put_item_t *items, size_t n)
{
    if (!pw || (!items && n > 0) || !pw->connect_tried)
        return KVEDGE_EINVAL;
    return s_fan_out(pw, S_PUT, NULL, items, n);
}
