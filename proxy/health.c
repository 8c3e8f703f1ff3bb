/* Per-node health table (see health.h for the rules): a fixed array of nodes plus an
 * open-addressing index by name, all under one mutex. */
#include "proxy/health.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/error.h"

/* One node. UP and SUSPECT are derived from silence and failures at each evaluation; DOWN is
 * latched until the node is heard again. */
typedef struct {
    char name[KVEDGE_HEALTH_NAME_MAX + 1];
    kvedge_health_state_t state; /* as of the latest evaluation */
    uint32_t failures;           /* consecutive, saturating */
    uint64_t silent_since_ms;    /* latest heard time, or the time it was added */
    uint64_t last_heard_ms;      /* 0 = never heard */
    bool probation;              /* re-admitted, ramp not finished */
    uint64_t probation_start_ms; /* valid while probation */
    int last_err;                /* latest failure's error; 0 = none */
    double srtt_us, rttvar_us;   /* RFC 6298 estimators; srtt_us 0 = no sample yet */
} s_node_t;

struct kvedge_health_t {
    pthread_mutex_t mu; /* guards everything below */
    s_node_t *nodes;    /* [max_nodes], the first count in use, in order of addition */
    size_t count;
    size_t max_nodes;
    int32_t *index; /* [index_mask + 1] node positions by name hash; -1 = empty */
    size_t index_mask;
    kvedge_health_observer_fn observer; /* NULL = none */
    void *observer_arg;
    uint64_t transitions; /* state changes since creation */
};

/* One state change, held until the lock is released. */
typedef struct {
    char name[KVEDGE_HEALTH_NAME_MAX + 1];
    kvedge_health_state_t from, to;
    char reason[KVEDGE_HEALTH_REASON_MAX + 1];
    uint64_t now;
} s_change_t;

/* The changes one call makes: a few inline (an input makes at most three), more on the heap
 * (a tick over many nodes). fn and arg are the observer as of the call, NULL when none. */
typedef struct {
    s_change_t inline_[3];
    s_change_t *v;
    size_t n, cap;
    kvedge_health_observer_fn fn;
    void *arg;
} s_changes_t;

static void s_changes_init(kvedge_health_t *h, s_changes_t *c)
{
    c->v = c->inline_;
    c->n = 0;
    c->cap = sizeof c->inline_ / sizeof c->inline_[0];
    c->fn = h->observer;
    c->arg = h->observer_arg;
}

/* Caller holds h->mu. Counts a change of n from `from` to its current state, and keeps it for
 * the observer (dropped when no memory: the count stays right). */
static void s_note(kvedge_health_t *h, s_changes_t *c, const s_node_t *n,
                   kvedge_health_state_t from, uint64_t now, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void s_note(kvedge_health_t *h, s_changes_t *c, const s_node_t *n,
                   kvedge_health_state_t from, uint64_t now, const char *fmt, ...)
{
    h->transitions++;
    if (!c || !c->fn)
        return;
    if (c->n == c->cap) {
        size_t cap = c->cap * 4;
        s_change_t *v = malloc(cap * sizeof *v);
        if (!v)
            return;
        memcpy(v, c->v, c->n * sizeof *v);
        if (c->v != c->inline_)
            free(c->v);
        c->v = v;
        c->cap = cap;
    }
    s_change_t *x = &c->v[c->n++];
    memcpy(x->name, n->name, sizeof x->name);
    x->from = from;
    x->to = n->state;
    x->now = now;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->reason, sizeof x->reason, fmt, ap);
    va_end(ap);
}

/* After the lock is released: tells the observer, frees. */
static void s_changes_fire(s_changes_t *c)
{
    for (size_t i = 0; i < c->n; i++)
        c->fn(c->v[i].name, c->v[i].from, c->v[i].to, c->v[i].reason, c->v[i].now, c->arg);
    if (c->v != c->inline_)
        free(c->v);
    c->v = c->inline_;
    c->n = 0;
}

/* Elapsed from since to now; 0 when now is older (threads' stamps may be out of order). */
static uint64_t s_elapsed(uint64_t now, uint64_t since)
{
    return now > since ? now - since : 0;
}

static uint64_t s_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Length of a valid node name (1..NAME_MAX), or 0 when it is not one. */
static size_t s_name_len(const char *node)
{
    if (!node)
        return 0;
    size_t len = strnlen(node, KVEDGE_HEALTH_NAME_MAX + 1);
    return len <= KVEDGE_HEALTH_NAME_MAX ? len : 0;
}

/* Caller holds h->mu. Index slot for node: its entry, or the empty slot where it goes. The
 * index is at least twice max_nodes, so there is always an empty slot. */
static size_t s_slot(const kvedge_health_t *h, const char *node)
{
    size_t i = (size_t)s_hash(node) & h->index_mask;
    while (h->index[i] >= 0 && strcmp(h->nodes[h->index[i]].name, node) != 0)
        i = (i + 1) & h->index_mask;
    return i;
}

/* Caller holds h->mu. */
static s_node_t *s_find(const kvedge_health_t *h, const char *node)
{
    int32_t at = h->index[s_slot(h, node)];
    return at >= 0 ? &h->nodes[at] : NULL;
}

/* Caller holds h->mu; name is valid. Finds or adds the node; NULL when the table is full. */
static s_node_t *s_get_or_add(kvedge_health_t *h, const char *node, size_t len, uint64_t now)
{
    size_t slot = s_slot(h, node);
    if (h->index[slot] >= 0)
        return &h->nodes[h->index[slot]];
    if (h->count == h->max_nodes)
        return NULL;
    s_node_t *n = &h->nodes[h->count];
    memset(n, 0, sizeof *n);
    memcpy(n->name, node, len);
    n->state = KVEDGE_HEALTH_UP;
    n->silent_since_ms = now;
    h->index[slot] = (int32_t)h->count++;
    return n;
}

static void s_set_down(s_node_t *n)
{
    n->state = KVEDGE_HEALTH_DOWN;
    n->probation = false;
    n->probation_start_ms = 0;
}

/* Applies the rules as of now; returns whether the state changed, and notes the change with
 * its reason. back says why a SUSPECT node is UP again (what the caller's event was). */
static bool s_evaluate(kvedge_health_t *h, s_changes_t *c, s_node_t *n, uint64_t now,
                       const char *back)
{
    kvedge_health_state_t before = n->state;
    if (n->state == KVEDGE_HEALTH_DOWN)
        return false; /* only being heard again lifts DOWN */
    uint64_t silent = s_elapsed(now, n->silent_since_ms);
    bool silent_down = silent > KVEDGE_HEALTH_DOWN_MS;
    if (silent_down || n->failures >= KVEDGE_HEALTH_DOWN_FAILURES) {
        s_set_down(n);
    } else {
        if (n->probation && s_elapsed(now, n->probation_start_ms) >= KVEDGE_HEALTH_READMIT_MS) {
            n->probation = false;
            n->probation_start_ms = 0;
        }
        bool suspect =
            silent > KVEDGE_HEALTH_SUSPECT_MS || n->failures >= KVEDGE_HEALTH_SUSPECT_FAILURES;
        n->state = suspect ? KVEDGE_HEALTH_SUSPECT : KVEDGE_HEALTH_UP;
    }
    if (n->state == before)
        return false;
    if (n->state == KVEDGE_HEALTH_UP)
        s_note(h, c, n, before, now, "%s", back ? back : "recovered");
    else if (silent_down ||
             (n->state == KVEDGE_HEALTH_SUSPECT && silent > KVEDGE_HEALTH_SUSPECT_MS))
        s_note(h, c, n, before, now, "silent for %llu ms", (unsigned long long)silent);
    else
        s_note(h, c, n, before, now, "%u consecutive failures, last: %s", n->failures,
               kvedge_strerror(n->last_err));
    return true;
}

/* Weight of an evaluated node at now. */
static double s_weight(const s_node_t *n, uint64_t now)
{
    if (n->state == KVEDGE_HEALTH_DOWN)
        return 0.0;
    double w = 1.0;
    if (n->probation) {
        double frac = (double)s_elapsed(now, n->probation_start_ms) / KVEDGE_HEALTH_READMIT_MS;
        w = KVEDGE_HEALTH_READMIT_WEIGHT_MIN + (1.0 - KVEDGE_HEALTH_READMIT_WEIGHT_MIN) * frac;
        if (w > 1.0)
            w = 1.0;
    }
    if (n->state == KVEDGE_HEALTH_SUSPECT && w > KVEDGE_HEALTH_SUSPECT_WEIGHT)
        w = KVEDGE_HEALTH_SUSPECT_WEIGHT;
    return w;
}

/* Evaluated node at now into *out. */
static void s_info(const s_node_t *n, uint64_t now, kvedge_health_info_t *out)
{
    memcpy(out->name, n->name, sizeof out->name);
    out->state = n->state;
    out->weight = s_weight(n, now);
    out->failures = n->failures;
    out->last_heard_ms = n->last_heard_ms;
    out->probation = n->probation;
    out->probation_start_ms = n->probation_start_ms;
    out->last_err = n->last_err;
    out->srtt_us = n->srtt_us;
    out->rttvar_us = n->rttvar_us;
}

kvedge_health_t *kvedge_health_new(size_t max_nodes)
{
    if (max_nodes == 0)
        max_nodes = KVEDGE_HEALTH_MAX_NODES;
    if (max_nodes > KVEDGE_HEALTH_MAX_NODES)
        return NULL;
    size_t slots = 1;
    while (slots < 2 * max_nodes)
        slots <<= 1;
    kvedge_health_t *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->nodes = calloc(max_nodes, sizeof *h->nodes);
    h->index = malloc(slots * sizeof *h->index);
    if (!h->nodes || !h->index || pthread_mutex_init(&h->mu, NULL) != 0) {
        free(h->index);
        free(h->nodes);
        free(h);
        return NULL;
    }
    memset(h->index, 0xff, slots * sizeof *h->index); /* all -1 */
    h->index_mask = slots - 1;
    h->max_nodes = max_nodes;
    return h;
}

void kvedge_health_destroy(kvedge_health_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_health_t *h = *self_p;
    pthread_mutex_destroy(&h->mu);
    free(h->index);
    free(h->nodes);
    free(h);
    *self_p = NULL;
}

/* Caller holds h->mu; n is evaluated at now. The node was heard from: restart its silence
 * clock, and re-admit it on probation when it is DOWN. */
static void s_heard(kvedge_health_t *h, s_changes_t *c, s_node_t *n, uint64_t now)
{
    uint64_t silent = s_elapsed(now, n->silent_since_ms);
    if (now > n->silent_since_ms)
        n->silent_since_ms = now;
    if (now > n->last_heard_ms)
        n->last_heard_ms = now;
    if (n->state == KVEDGE_HEALTH_DOWN) {
        n->state = KVEDGE_HEALTH_UP;
        n->failures = 0;
        n->probation = true;
        n->probation_start_ms = now;
        s_note(h, c, n, KVEDGE_HEALTH_DOWN, now, "heard again after %llu ms",
               (unsigned long long)silent);
    }
}

/* The inputs (heard, success, failure, a round trip) and add share validation and lookup;
 * ev picks the event. */
typedef enum { S_ADD, S_HEARD, S_SUCCESS, S_FAILURE, S_RTT } s_event_t;

/* Caller holds h->mu. RFC 6298, section 2: the first sample sets both estimators, later ones
 * move RTTVAR by a quarter of the deviation and SRTT by an eighth of the difference. */
static void s_rtt_sample(s_node_t *n, double r)
{
    if (n->srtt_us <= 0) {
        n->srtt_us = r > 1 ? r : 1; /* > 0 marks "sampled"; loopback pings can read 0 */
        n->rttvar_us = r / 2;
        return;
    }
    n->rttvar_us = 0.75 * n->rttvar_us + 0.25 * fabs(n->srtt_us - r);
    n->srtt_us = 0.875 * n->srtt_us + 0.125 * r;
}

static int s_event(kvedge_health_t *h, const char *node, uint64_t now, s_event_t ev, int err,
                   double rtt_us)
{
    size_t len = s_name_len(node);
    if (!h || len == 0)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&h->mu);
    s_changes_t c;
    s_changes_init(h, &c);
    s_node_t *n = s_get_or_add(h, node, len, now);
    if (!n) {
        pthread_mutex_unlock(&h->mu);
        return KVEDGE_EFULL;
    }
    s_evaluate(h, &c, n, now, NULL); /* a long silence ends in DOWN before this event */
    const char *back = NULL;
    switch (ev) {
    case S_ADD:
        break;
    case S_RTT:
        s_rtt_sample(n, rtt_us);
        break;
    case S_SUCCESS:
        n->failures = 0;
        s_heard(h, &c, n, now); /* a reply is proof of life */
        back = "a request succeeded";
        break;
    case S_HEARD:
        s_heard(h, &c, n, now);
        back = "heard again";
        break;
    case S_FAILURE:
        if (n->failures < UINT32_MAX)
            n->failures++;
        n->last_err = err;
        if (n->probation && err != KVEDGE_ETIMEDOUT) {
            kvedge_health_state_t before = n->state;
            s_set_down(n);
            s_note(h, &c, n, before, now, "failed on probation: %s", kvedge_strerror(err));
        }
        break;
    }
    s_evaluate(h, &c, n, now, back);
    pthread_mutex_unlock(&h->mu);
    s_changes_fire(&c);
    return KVEDGE_OK;
}

int kvedge_health_add(kvedge_health_t *h, const char *node, uint64_t now_ms)
{
    return s_event(h, node, now_ms, S_ADD, 0, 0);
}

int kvedge_health_heartbeat(kvedge_health_t *h, const char *node, uint64_t now_ms)
{
    return s_event(h, node, now_ms, S_HEARD, 0, 0);
}

int kvedge_health_success(kvedge_health_t *h, const char *node, uint64_t now_ms)
{
    return s_event(h, node, now_ms, S_SUCCESS, 0, 0);
}

int kvedge_health_failure(kvedge_health_t *h, const char *node, uint64_t now_ms, int err)
{
    if (err >= 0)
        return KVEDGE_EINVAL;
    return s_event(h, node, now_ms, S_FAILURE, err, 0);
}

int kvedge_health_rtt(kvedge_health_t *h, const char *node, uint64_t now_ms, double rtt_us)
{
    if (!(rtt_us >= 0) || !isfinite(rtt_us))
        return KVEDGE_EINVAL;
    return s_event(h, node, now_ms, S_RTT, 0, rtt_us);
}

double kvedge_health_rto_ms(kvedge_health_t *h, const char *node)
{
    if (!h || s_name_len(node) == 0)
        return 0;
    pthread_mutex_lock(&h->mu);
    s_node_t *n = s_find(h, node);
    double rto = n && n->srtt_us > 0 ? (n->srtt_us + 4 * n->rttvar_us) / 1000.0 : 0;
    pthread_mutex_unlock(&h->mu);
    return rto;
}

int kvedge_health_tick(kvedge_health_t *h, uint64_t now_ms)
{
    if (!h)
        return KVEDGE_EINVAL;
    int changed = 0;
    pthread_mutex_lock(&h->mu);
    s_changes_t c;
    s_changes_init(h, &c);
    for (size_t i = 0; i < h->count; i++)
        changed += s_evaluate(h, &c, &h->nodes[i], now_ms, NULL);
    pthread_mutex_unlock(&h->mu);
    s_changes_fire(&c);
    return changed;
}

int kvedge_health_get(kvedge_health_t *h, const char *node, uint64_t now_ms,
                      kvedge_health_info_t *out)
{
    if (!h || !out || s_name_len(node) == 0)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&h->mu);
    s_changes_t c;
    s_changes_init(h, &c);
    s_node_t *n = s_find(h, node);
    if (n) {
        s_evaluate(h, &c, n, now_ms, NULL);
        s_info(n, now_ms, out);
    }
    pthread_mutex_unlock(&h->mu);
    s_changes_fire(&c);
    return n ? KVEDGE_OK : KVEDGE_ENOTFOUND;
}

int kvedge_health_state(kvedge_health_t *h, const char *node, uint64_t now_ms)
{
    kvedge_health_info_t info;
    int rc = kvedge_health_get(h, node, now_ms, &info);
    return rc == KVEDGE_OK ? (int)info.state : rc;
}

double kvedge_health_weight(kvedge_health_t *h, const char *node, uint64_t now_ms)
{
    kvedge_health_info_t info;
    return kvedge_health_get(h, node, now_ms, &info) == KVEDGE_OK ? info.weight : 0.0;
}

bool kvedge_health_usable(kvedge_health_t *h, const char *node, uint64_t now_ms)
{
    kvedge_health_info_t info;
    return kvedge_health_get(h, node, now_ms, &info) == KVEDGE_OK &&
           info.state != KVEDGE_HEALTH_DOWN;
}

size_t kvedge_health_count(kvedge_health_t *h)
{
    if (!h)
        return 0;
    pthread_mutex_lock(&h->mu);
    size_t count = h->count;
    pthread_mutex_unlock(&h->mu);
    return count;
}

int kvedge_health_foreach(kvedge_health_t *h, uint64_t now_ms, kvedge_health_fn fn, void *arg)
{
    if (!h || !fn)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&h->mu);
    s_changes_t c;
    s_changes_init(h, &c);
    size_t count = h->count;
    kvedge_health_info_t *snap = malloc((count ? count : 1) * sizeof *snap);
    if (snap)
        for (size_t i = 0; i < count; i++) {
            s_evaluate(h, &c, &h->nodes[i], now_ms, NULL);
            s_info(&h->nodes[i], now_ms, &snap[i]);
        }
    pthread_mutex_unlock(&h->mu);
    s_changes_fire(&c);
    if (!snap)
        return KVEDGE_ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < count && rc == 0; i++)
        rc = fn(&snap[i], arg);
    free(snap);
    return rc;
}

int kvedge_health_set_observer(kvedge_health_t *h, kvedge_health_observer_fn fn, void *arg)
{
    if (!h)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&h->mu);
    h->observer = fn;
    h->observer_arg = fn ? arg : NULL;
    pthread_mutex_unlock(&h->mu);
    return KVEDGE_OK;
}

uint64_t kvedge_health_transitions(kvedge_health_t *h)
{
    if (!h)
        return 0;
    pthread_mutex_lock(&h->mu);
    uint64_t t = h->transitions;
    pthread_mutex_unlock(&h->mu);
    return t;
}

const char *kvedge_health_state_name(int state)
{
    switch (state) {
    case KVEDGE_HEALTH_UP:
        return "UP";
    case KVEDGE_HEALTH_SUSPECT:
        return "SUSPECT";
    case KVEDGE_HEALTH_DOWN:
        return "DOWN";
    }
    return "?";
}
