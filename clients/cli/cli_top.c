/* `kvedge -H EP top` and `kvedge -H PROXY sources`: live views of a store node or an edge proxy
 * from its MONITOR document (clients/cli/top_doc.h). top redraws in place on a terminal and
 * prints plain frames into a pipe; rates come from the difference of two snapshots. */
#include <cjson/cJSON.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "access/frame.h"
#include "clients/cli/cli.h"
#include "clients/cli/top_doc.h"
#include "clients/lib/kvedge.h"
#include "access/codec/clock.h"

#define S_INTERVAL_S_DEFAULT 1.0
#define S_INTERVAL_S_MIN     0.1
#define S_INTERVAL_S_MAX     3600.0
#define S_TOP_DEFAULT        10
#define S_TRANSITIONS_SHOWN  5
#define S_LINE_BYTES         1024
#define S_COLS_DEFAULT       80
#define S_ROWS_DEFAULT       24

/* ---------------------------------------------------------------- terminal */

static volatile sig_atomic_t s_quit;    /* SIGINT, SIGTERM or SIGHUP arrived */
static volatile sig_atomic_t s_resumed; /* SIGCONT: the shell may have reset the terminal */
static struct termios s_saved;          /* stdin's settings before top changed them */
static struct termios s_keys;           /* the settings top reads keys with */
static bool s_raw;                      /* stdin is in non-canonical no-echo mode */

static void s_on_signal(int sig)
{
    if (sig == SIGCONT)
        s_resumed = 1;
    else
        s_quit = sig;
}

/* Our handlers, without SA_RESTART so a wait returns at once. Installed after the client
 * connected: the client library turns czmq's handlers off when it starts. */
static void s_trap(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGCONT, &sa, NULL);
}

static void s_term_restore(void)
{
    if (s_raw)
        tcsetattr(STDIN_FILENO, TCSANOW, &s_saved);
    s_raw = false;
}

/* Single keys without Enter and without echo; signals (Ctrl-C) stay on. */
static void s_term_keys(void)
{
    if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &s_saved) != 0)
        return;
    s_keys = s_saved;
    s_keys.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    s_keys.c_cc[VMIN] = 0;
    s_keys.c_cc[VTIME] = 0;
    if (tcsetattr(STDIN_FILENO, TCSANOW, &s_keys) == 0) {
        s_raw = true;
        atexit(s_term_restore); /* a safety net: every path restores it before returning */
    }
}

static void s_term_size(int *cols, int *rows)
{
    struct winsize ws;
    *cols = S_COLS_DEFAULT;
    *rows = S_ROWS_DEFAULT;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
        *cols = ws.ws_col;
        *rows = ws.ws_row;
    }
}

/* Waits seconds, reading keys when stdin is in key mode. Returns true when the user quit
 * ('q' or a signal). */
static bool s_wait(double seconds)
{
    int64_t end = kvedge_mono_ms() + (int64_t)(seconds * 1000.0);
    bool keys = s_raw;
    for (;;) {
        if (s_quit)
            return true;
        if (s_resumed && s_raw) /* back from Ctrl-Z: read keys again */
            tcsetattr(STDIN_FILENO, TCSANOW, &s_keys);
        s_resumed = 0;
        int64_t now = kvedge_mono_ms();
        if (now >= end)
            return false;
        struct pollfd p = {STDIN_FILENO, POLLIN, 0};
        int r = poll(&p, keys ? 1 : 0, (int)(end - now));
        if (r <= 0)
            continue; /* timeout, or EINTR: the loop looks at the flag and the clock */
        if (p.revents & POLLIN) {
            char ch;
            ssize_t n = read(STDIN_FILENO, &ch, 1);
            if (n == 1 && (ch == 'q' || ch == 'Q'))
                return true;
            if (n == 0)
                keys = false; /* end of input */
        } else if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) {
            keys = false;
        }
    }
}

/* ---------------------------------------------------------------- a frame of lines */

typedef struct {
    char *buf;
    size_t len, cap;
    int lines;
    int max_lines; /* 0: no limit */
    int width;     /* columns; 0: no limit */
} s_screen_t;

/* Appends one line, cut to the width in characters (UTF-8 continuation bytes take none). */
__attribute__((format(printf, 2, 3))) static void s_line(s_screen_t *s, const char *fmt, ...)
{
    if (s->max_lines && s->lines >= s->max_lines)
        return;
    char line[S_LINE_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t n = strlen(line);
    if (s->width > 0) {
        int cols = 0;
        size_t i = 0;
        for (; i < n; i++) {
            if (((unsigned char)line[i] & 0xC0) == 0x80)
                continue;
            if (cols == s->width)
                break;
            cols++;
        }
        n = i;
    }
    while (n > 0 && line[n - 1] == ' ')
        n--;
    if (s->len + n + 2 > s->cap) {
        size_t cap = (s->cap ? s->cap * 2 : 8192) + n;
        char *b = realloc(s->buf, cap);
        if (!b)
            return;
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, line, n);
    s->len += n;
    s->buf[s->len++] = '\n';
    s->lines++;
}

/* ---------------------------------------------------------------- formatting */

static const char *s_dur(double us, char *b, size_t n)
{
    if (!(us > 0))
        snprintf(b, n, "-");
    else if (us < 1000)
        snprintf(b, n, "%.0fus", us);
    else if (us < 10e3)
        snprintf(b, n, "%.2fms", us / 1e3);
    else if (us < 1e6)
        snprintf(b, n, "%.1fms", us / 1e3);
    else
        snprintf(b, n, "%.2fs", us / 1e6);
    return b;
}

static const char *s_bps(double bytes_per_s, char *b, size_t n)
{
    char v[32];
    if (!(bytes_per_s > 0))
        snprintf(b, n, "-");
    else
        snprintf(b, n, "%s/s",
                 kvedge_cli_bytes(bytes_per_s >= 1.8e19 ? UINT64_MAX : (uint64_t)bytes_per_s, v,
                                  sizeof v));
    return b;
}

static const char *s_age(double s, char *b, size_t n)
{
    uint64_t t = s > 0 && s < 1e15 ? (uint64_t)s : 0;
    if (t >= 86400)
        snprintf(b, n, "%llud%02lluh", (unsigned long long)(t / 86400),
                 (unsigned long long)(t % 86400 / 3600));
    else if (t >= 3600)
        snprintf(b, n, "%lluh%02llum", (unsigned long long)(t / 3600),
                 (unsigned long long)(t % 3600 / 60));
    else if (t >= 60)
        snprintf(b, n, "%llum%02llus", (unsigned long long)(t / 60), (unsigned long long)(t % 60));
    else
        snprintf(b, n, "%llus", (unsigned long long)t);
    return b;
}

/* "0-5,7,9-11": the layers a prefix was read at. */
static const char *s_layers(const uint64_t *l, size_t n, char *b, size_t cap)
{
    size_t len = 0;
    b[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (!l[i])
            continue;
        size_t j = i;
        while (j + 1 < n && l[j + 1])
            j++;
        char part[32];
        if (j > i)
            snprintf(part, sizeof part, "%s%zu-%zu", len ? "," : "", i, j);
        else
            snprintf(part, sizeof part, "%s%zu", len ? "," : "", i);
        if (len + strlen(part) + 4 > cap) {
            snprintf(b + len, cap - len, ",...");
            return b;
        }
        len += (size_t)snprintf(b + len, cap - len, "%s", part);
        i = j;
    }
    if (!len)
        snprintf(b, cap, "-");
    return b;
}

/* Per second between two counter readings (0 when the counter went down). */
static double s_rate(uint64_t cur, uint64_t prev, double dt)
{
    return cur >= prev && dt > 0 ? (double)(cur - prev) / dt : 0;
}

/* ---------------------------------------------------------------- the node's screen */

typedef struct {
    const kvedge_top_op_t *op;
    double rate;
} s_op_row_t;

static int s_op_cmp(const void *a, const void *b)
{
    const s_op_row_t *x = a, *y = b;
    if (x->rate != y->rate)
        return x->rate < y->rate ? 1 : -1;
    if (x->op->requests != y->op->requests)
        return x->op->requests < y->op->requests ? 1 : -1;
    return strcmp(x->op->op, y->op->op);
}

static const kvedge_top_prefix_t *s_prefix(const kvedge_top_doc_t *d, const char *id)
{
    for (uint32_t i = 0; d && i < d->node.hot.nprefixes; i++)
        if (strcmp(d->node.hot.prefixes[i].id, id) == 0)
            return &d->node.hot.prefixes[i];
    return NULL;
}

static void s_header(s_screen_t *s, const kvedge_top_doc_t *d, const char *ep, double interval)
{
    char up[32];
    s_age((double)d->uptime_ms / 1e3, up, sizeof up);
    char what[KVEDGE_TOP_DOC_NAME_BYTES + KVEDGE_TOP_DOC_SHORT_BYTES + 16];
    if (d->kind == KVEDGE_TOP_DOC_NODE)
        snprintf(what, sizeof what, "node %s (%s)", d->name, d->role[0] ? d->role : "?");
    else
        snprintf(what, sizeof what, "proxy %s", d->name);
    s_line(s, "kvedge top - %s at %s   up %s   every %.1fs   %s%s", what, ep, up, interval,
           d->ready ? "ready" : "NOT READY: ", d->ready ? "" : d->not_ready);
}

/* The node's request line: rates, hit ratio, bytes, latency over the interval. */
static void s_node_requests(s_screen_t *s, const kvedge_top_doc_t *cur,
                            const kvedge_top_doc_t *prev, double dt)
{
    char b1[32], b2[32], b3[32], b4[32];
    const uint64_t *le = cur->node.le_us;
    uint32_t nle = cur->node.nle;
    if (cur->node.analyzer) {
        uint64_t req = 0, preq = 0;
        kvedge_top_hist_t all = {0};
        for (uint32_t i = 0; i < cur->node.nops; i++) {
            const kvedge_top_op_t *op = &cur->node.ops[i];
            const kvedge_top_op_t *pop = kvedge_top_doc_op(prev, op->op);
            req += op->requests;
            preq += pop ? pop->requests : 0;
            kvedge_top_hist_delta(&all, &op->latency, pop ? &pop->latency : NULL);
        }
        uint64_t dh = cur->node.hits - (prev ? prev->node.hits : 0);
        uint64_t dm = cur->node.misses - (prev ? prev->node.misses : 0);
        if (prev && (cur->node.hits < prev->node.hits || cur->node.misses < prev->node.misses))
            dh = dm = 0;
        char hit[16] = "-";
        if (dh + dm)
            snprintf(hit, sizeof hit, "%.1f%%", 100.0 * (double)dh / (double)(dh + dm));
        s_line(s, "requests %.1f/s   hit ratio %s   in %s   out %s   latency p50 %s p99 %s",
               s_rate(req, preq, dt), hit,
               s_bps(s_rate(cur->node.bytes_in, prev ? prev->node.bytes_in : 0, dt), b1, 32),
               s_bps(s_rate(cur->node.bytes_out, prev ? prev->node.bytes_out : 0, dt), b2, 32),
               s_dur(kvedge_top_hist_quantile(&all, le, nle, 0.5), b3, 32),
               s_dur(kvedge_top_hist_quantile(&all, le, nle, 0.99), b4, 32));
    } else {
        s_line(s, "requests: the node's I/O analyzer is off (monitor = false): no rates");
    }
}

/* The node's store, sync subscriptions and master lines. */
static void s_node_state(s_screen_t *s, const kvedge_top_doc_t *cur)
{
    char b1[32], b2[32], b3[32];
    if (cur->node.has_store) {
        const kvedge_top_store_t *st = &cur->node.store;
        char cap[48] = "";
        if (st->capacity_bytes)
            snprintf(cap, sizeof cap, "   capacity %s",
                     kvedge_cli_bytes(st->capacity_bytes, b3, 32));
        s_line(s,
               "store    %llu blocks (%llu pinned)   %s stored for %s fp16 (%.2fx)   %llu "
               "quarantined%s",
               (unsigned long long)st->blocks, (unsigned long long)st->pinned_blocks,
               kvedge_cli_bytes(st->bytes, b1, 32), kvedge_cli_bytes(st->fp16_bytes, b2, 32),
               st->bytes ? (double)st->fp16_bytes / (double)st->bytes : 0.0,
               (unsigned long long)st->quarantined, cap);
    }
    if (cur->node.has_sync && cur->node.nsubs == 0)
        s_line(s, "sync     no subscriptions");
    for (uint32_t i = 0; cur->node.has_sync && i < cur->node.nsubs; i++) {
        const kvedge_top_sub_t *sub = &cur->node.subs[i];
        char ok[32] = "never";
        if (sub->last_ok_ms && cur->time_ms >= sub->last_ok_ms)
            snprintf(ok, sizeof ok, "%s ago",
                     s_age((double)(cur->time_ms - sub->last_ok_ms) / 1e3, b1, 32));
        s_line(s, "sync     %s from %s: %s   chunks %llu/%llu   %llu blocks held   last ok %s%s%s",
               sub->name, sub->cloud, sub->state[0] ? sub->state : "?",
               (unsigned long long)sub->chunks_synced, (unsigned long long)sub->chunks_total,
               (unsigned long long)sub->blocks_held, ok, sub->last_error[0] ? "   error: " : "",
               sub->last_error);
    }
    if (cur->node.has_master)
        s_line(s, "master   %s as %s: %s (%llu attempts)%s%s", cur->node.master.endpoint,
               cur->node.master.node_id[0] ? cur->node.master.node_id : "?",
               cur->node.master.state[0] ? cur->node.master.state : "?",
               (unsigned long long)cur->node.master.attempts, cur->node.master.why[0] ? ": " : "",
               cur->node.master.why);
    /* A list of masters: the one followed now, and how often the view moved. */
    if (cur->node.has_master && cur->node.master.following[0] &&
        (strcmp(cur->node.master.following, cur->node.master.endpoint) != 0 ||
         cur->node.master.moves))
        s_line(s, "         following %s (%llu moves)", cur->node.master.following,
               (unsigned long long)cur->node.master.moves);
}

/* The table of operations, busiest first. */
static void s_node_ops(s_screen_t *s, const kvedge_top_doc_t *cur, const kvedge_top_doc_t *prev,
                       double dt)
{
    char b1[32], b2[32];
    const uint64_t *le = cur->node.le_us;
    uint32_t nle = cur->node.nle;
    s_line(s, "%s", "");
    s_line(s, "%-14s %9s %9s %9s %9s %12s", "OP", "REQ/S", "P50", "P99", "ERR/S", "TOTAL");
    s_op_row_t rows[KVEDGE_TOP_DOC_MAX_OPS];
    size_t nr = 0;
    for (uint32_t i = 0; i < cur->node.nops; i++) {
        const kvedge_top_op_t *op = &cur->node.ops[i];
        if (op->requests == 0)
            continue;
        const kvedge_top_op_t *pop = kvedge_top_doc_op(prev, op->op);
        rows[nr].op = op;
        rows[nr++].rate = s_rate(op->requests, pop ? pop->requests : 0, dt);
    }
    qsort(rows, nr, sizeof rows[0], s_op_cmp);
    for (size_t i = 0; i < nr; i++) {
        const kvedge_top_op_t *op = rows[i].op;
        const kvedge_top_op_t *pop = kvedge_top_doc_op(prev, op->op);
        kvedge_top_hist_t h = {0};
        kvedge_top_hist_delta(&h, &op->latency, pop ? &pop->latency : NULL);
        s_line(s, "%-14s %9.1f %9s %9s %9.1f %12llu", op->op, rows[i].rate,
               s_dur(kvedge_top_hist_quantile(&h, le, nle, 0.5), b1, 32),
               s_dur(kvedge_top_hist_quantile(&h, le, nle, 0.99), b2, 32),
               s_rate(op->errors, pop ? pop->errors : 0, dt), (unsigned long long)op->requests);
    }
    if (nr == 0)
        s_line(s, "(no requests yet)");
}

/* The hottest prefixes, at most top. */
static void s_node_hot(s_screen_t *s, const kvedge_top_doc_t *cur, const kvedge_top_doc_t *prev,
                       double dt, uint32_t top)
{
    char b1[32];
    s_line(s, "%s", "");
    uint32_t np = cur->node.hot.nprefixes < top ? cur->node.hot.nprefixes : top;
    s_line(s, "HOT PREFIXES   %llu accesses seen, table of %llu entries (%s)",
           (unsigned long long)cur->node.hot.accesses, (unsigned long long)cur->node.hot.capacity,
           kvedge_cli_bytes(cur->node.hot.memory_bytes, b1, 32));
    s_line(s, "%4s %-16s %-20s %10s %8s %8s  %s", "RANK", "PREFIX", "MODEL", "ACCESSES", "ACC/S",
           "+-ERR", "LAYERS");
    for (uint32_t i = 0; i < np; i++) {
        const kvedge_top_prefix_t *p = &cur->node.hot.prefixes[i];
        const kvedge_top_prefix_t *pp = s_prefix(prev, p->id);
        char id[17], layers[96];
        snprintf(id, sizeof id, "%s", p->id);
        s_line(s, "%4u %-16s %-20.20s %10llu %8.1f %8llu  %s", i + 1, id, p->model,
               (unsigned long long)p->count, pp ? s_rate(p->count, pp->count, dt) : 0.0,
               (unsigned long long)p->error,
               s_layers(p->layers, KVEDGE_TOP_DOC_HOT_LAYERS, layers, sizeof layers));
    }
    if (np == 0)
        s_line(s, "(none yet)");
}

static void s_node_screen(s_screen_t *s, const kvedge_top_doc_t *cur, const kvedge_top_doc_t *prev,
                          double dt, uint32_t top)
{
    s_node_requests(s, cur, prev, dt);
    s_node_state(s, cur);
    if (!cur->node.analyzer)
        return;
    s_node_ops(s, cur, prev, dt);
    s_node_hot(s, cur, prev, dt, top);
}

/* ---------------------------------------------------------------- the proxy's screen */

static void s_source_lag(const kvedge_top_source_t *src, char *b, size_t n)
{
    char age[32];
    if (!src->has_history)
        snprintf(b, n, "-");
    else if (src->history.last_success_age_s < 0)
        snprintf(b, n, "never synced, %llu chunks missing",
                 (unsigned long long)src->history.chunks_missing);
    else
        snprintf(b, n, "%s, %llu chunks missing", s_age(src->history.last_success_age_s, age, 32),
                 (unsigned long long)src->history.chunks_missing);
}

/* Layers per second by reason, over every source kind, as "   REASON RATE..." into by;
 * returns its length. */
static size_t s_reasons(const kvedge_top_doc_t *cur, const kvedge_top_doc_t *prev, double dt,
                        char *by, size_t cap)
{
    /* layers/s by reason, over every source kind */
    size_t len = 0;
    for (uint32_t i = 0; i < cur->proxy.nlayers; i++) {
        const char *reason = cur->proxy.layers[i].b;
        bool seen = false;
        for (uint32_t j = 0; j < i && !seen; j++)
            seen = strcmp(cur->proxy.layers[j].b, reason) == 0;
        if (seen)
            continue;
        uint64_t c = 0, p = 0;
        for (uint32_t j = 0; j < cur->proxy.nlayers; j++)
            if (strcmp(cur->proxy.layers[j].b, reason) == 0)
                c += cur->proxy.layers[j].count;
        for (uint32_t j = 0; prev && j < prev->proxy.nlayers; j++)
            if (strcmp(prev->proxy.layers[j].b, reason) == 0)
                p += prev->proxy.layers[j].count;
        if (len < cap)
            len += (size_t)snprintf(by + len, cap - len, "   %s %.1f", reason[0] ? reason : "?",
                                    s_rate(c, p, dt));
    }
    return len;
}

/* The proxy's rate, reason, latency and master lines. */
static void s_proxy_rates(s_screen_t *s, const kvedge_top_doc_t *cur, const kvedge_top_doc_t *prev,
                          double dt)
{
    char b1[32], b2[32], b3[32], b4[32];
    const kvedge_top_proxy_stats_t *st = &cur->proxy.stats, *pst = prev ? &prev->proxy.stats : NULL;
    s_line(s, "fetches %.1f/s   layers %.1f/s   delivered %s   open %llu   buffered %s",
           s_rate(st->requests, pst ? pst->requests : 0, dt),
           s_rate(st->layers, pst ? pst->layers : 0, dt),
           s_bps(s_rate(st->bytes, pst ? pst->bytes : 0, dt), b1, 32),
           (unsigned long long)st->fetches_open, kvedge_cli_bytes(st->buffered_bytes, b2, 32));
    char by[S_LINE_BYTES] = "";
    size_t len = s_reasons(cur, prev, dt, by, sizeof by);
    s_line(s, "layers/s by reason:%s", len ? by : "   -");
    s_line(s, "misses %.1f/s   fallbacks %.1f/s   corrupt %.1f/s   source failures %.1f/s",
           s_rate(st->misses, pst ? pst->misses : 0, dt),
           s_rate(st->fallbacks, pst ? pst->fallbacks : 0, dt),
           s_rate(st->corrupt, pst ? pst->corrupt : 0, dt),
           s_rate(st->source_failures, pst ? pst->source_failures : 0, dt));
    const kvedge_top_fetch_t *f = &cur->proxy.fetch, *pf = prev ? &prev->proxy.fetch : NULL;
    kvedge_top_hist_t first = {0}, last = {0};
    kvedge_top_hist_delta(&first, &f->first_layer, pf ? &pf->first_layer : NULL);
    kvedge_top_hist_delta(&last, &f->last_layer, pf ? &pf->last_layer : NULL);
    char ratio[16] = "-";
    if (f->actual_to_plan_median > 0)
        snprintf(ratio, sizeof ratio, "%.2f", f->actual_to_plan_median);
    s_line(s, "first layer p50 %s p99 %s   last layer p50 %s p99 %s   actual/plan median %s",
           s_dur(kvedge_top_hist_quantile(&first, f->le_us, f->nle, 0.5), b1, 32),
           s_dur(kvedge_top_hist_quantile(&first, f->le_us, f->nle, 0.99), b2, 32),
           s_dur(kvedge_top_hist_quantile(&last, f->le_us, f->nle, 0.5), b3, 32),
           s_dur(kvedge_top_hist_quantile(&last, f->le_us, f->nle, 0.99), b4, 32), ratio);
    if (cur->proxy.has_master) {
        uint32_t up = 0;
        for (uint32_t i = 0; i < cur->proxy.master.nnodes; i++)
            up += strcmp(cur->proxy.master.nodes[i].health, "up") == 0;
        s_line(s, "master   %s: registry %s, %u nodes (%u up)", cur->proxy.master.endpoint,
               cur->proxy.master.registry[0] ? cur->proxy.master.registry : "?",
               cur->proxy.master.nnodes, up);
    }
}

/* The sources table. */
static void s_proxy_sources(s_screen_t *s, const kvedge_top_doc_t *cur)
{
    char b1[32], b2[32];
    s_line(s, "%s", "");
    s_line(s, "%-16s %-8s %-8s %4s %9s %12s %8s  %s", "SOURCE", "KIND", "STATE", "CONN", "RTT",
           "BANDWIDTH", "FAILURES", "HISTORY LAG");
    for (uint32_t i = 0; i < cur->proxy.nsources; i++) {
        const kvedge_top_source_t *src = &cur->proxy.sources[i];
        char lag[96];
        s_source_lag(src, lag, sizeof lag);
        s_line(s, "%-16s %-8s %-8s %4s %9s %12s %8llu  %s", src->name, src->kind, src->state,
               src->connected ? "yes" : "no", s_dur(src->rtt_us, b1, 32),
               s_bps(src->bandwidth, b2, 32), (unsigned long long)src->failures, lag);
    }
    if (cur->proxy.nsources == 0)
        s_line(s, "(no sources)");
}

/* As many of the last transitions as the screen has room for. */
static void s_proxy_transitions(s_screen_t *s, const kvedge_top_doc_t *cur, int room)
{
    s_line(s, "%s", "");
    /* As many of the last transitions as the screen has room for. */
    int shown = S_TRANSITIONS_SHOWN;
    if (room > 0 && s->lines + 2 + shown > room)
        shown = room - s->lines - 2;
    if (shown > (int)cur->proxy.ntransitions)
        shown = (int)cur->proxy.ntransitions;
    if (shown < 0)
        shown = 0;
    s_line(s, "TRANSITIONS   %llu since start%s", (unsigned long long)cur->proxy.transitions_total,
           cur->proxy.ntransitions ? ", the last:" : "");
    for (uint32_t i = cur->proxy.ntransitions - (uint32_t)shown; i < cur->proxy.ntransitions; i++) {
        const kvedge_top_transition_t *t = &cur->proxy.transitions[i];
        time_t secs = (time_t)(t->time_ms / 1000);
        struct tm tm;
        char when[16] = "?";
        if (localtime_r(&secs, &tm))
            strftime(when, sizeof when, "%H:%M:%S", &tm);
        s_line(s, "%s  %-16s %s -> %s   %s", when, t->source, t->from, t->to, t->reason);
    }
}

static void s_proxy_screen(s_screen_t *s, const kvedge_top_doc_t *cur, const kvedge_top_doc_t *prev,
                           double dt, int room)
{
    s_proxy_rates(s, cur, prev, dt);
    s_proxy_sources(s, cur);
    s_proxy_transitions(s, cur, room);
}

/* ---------------------------------------------------------------- top */

/* One MONITOR call, parsed. Says why on stderr when it fails (lost says the daemon was there
 * before). Returns an exit code. */
static int s_snapshot(kvedge_cli_t *cli, kvedge_client_t *c, uint32_t top, bool lost,
                      kvedge_top_doc_t *d, char **raw)
{
    char *json = NULL;
    size_t len = 0;
    int rc = kvedge_client_monitor(c, top, &json, &len);
    if (rc == KVEDGE_OK)
        rc = kvedge_top_doc_parse(json, len, d);
    else if (rc == KVEDGE_EPROTO && !lost) {
        kvedge_cli_error("%s does not answer MONITOR (a daemon older than this kvedge?)",
                         cli->host);
        return KVEDGE_EXIT_UNAVAILABLE;
    }
    if (rc == KVEDGE_OK && raw) {
        *raw = json;
        return KVEDGE_EXIT_OK;
    }
    free(json);
    if (rc == KVEDGE_OK)
        return KVEDGE_EXIT_OK;
    bool gone = rc == KVEDGE_ETIMEDOUT || rc == KVEDGE_ECLOSED;
    const char *what = lost && gone ? "lost" : "monitor:";
    if (rc == KVEDGE_ETIMEDOUT)
        kvedge_cli_error("%s %s: no answer within the deadline", what, cli->host);
    else
        kvedge_cli_error("%s %s: %s", what, cli->host, kvedge_strerror(rc));
    return gone ? KVEDGE_EXIT_UNAVAILABLE : KVEDGE_EXIT_FAILURE;
}

/* --json: one snapshot, the document as the daemon sent it, pretty-printed. */
static int s_top_json(kvedge_cli_t *cli, kvedge_client_t *c, uint32_t top, kvedge_top_doc_t *d)
{
    char *raw = NULL;
    int ex = s_snapshot(cli, c, top, false, d, &raw);
    if (ex)
        return ex;
    cJSON *root = cJSON_Parse(raw);
    char *pretty = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    free(raw);
    if (!pretty) {
        kvedge_cli_error("top: out of memory");
        return KVEDGE_EXIT_FAILURE;
    }
    printf("%s\n", pretty);
    cJSON_free(pretty);
    return KVEDGE_EXIT_OK;
}

/* What `kvedge top` runs on. */
typedef struct {
    double interval;
    uint32_t count; /* 0: 1 into a pipe, no limit on a terminal */
    uint32_t top;
} s_top_opts_t;

static const kvedge_cmdopt_t s_top_list[] = {
    {.name = "interval",
     .letter = 'i',
     .arg = "S",
     .type = KVEDGE_CMDOPT_DOUBLE,
     KVEDGE_CMDOPT_AT(s_top_opts_t, interval),
     .dmin = S_INTERVAL_S_MIN,
     .dmax = S_INTERVAL_S_MAX,
     .def_double = S_INTERVAL_S_DEFAULT,
     .help = "seconds between frames; the first frame comes after one interval (rates need "
             "two snapshots)"},
    {.name = "count",
     .letter = 'n',
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_top_opts_t, count),
     .min = 1,
     .max = UINT32_MAX,
     .def_text = "1 into a pipe, no limit on a terminal",
     .help = "frames to print, then exit"},
    {.name = "top",
     .letter = 'k',
     .arg = "K",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_top_opts_t, top),
     .max = KVEDGE_WIRE_MAX_MONITOR_TOP,
     .def_num = S_TOP_DEFAULT,
     .help = "hot prefixes shown"},
};

static const kvedge_cmdopts_t s_top_opts = {
    .command = "top",
    .summary = "Live view of a node or proxy (with -H): rates, latency, hot prefixes, sources.",
    .about = "Run as `kvedge -H EP top ...`. A live view of a store node or an edge proxy from\n"
             "its MONITOR document: rates over the interval, latency percentiles, the hottest\n"
             "prefixes (node), the sources and their transitions (proxy). --json prints one\n"
             "snapshot (the document, pretty-printed) and exits.\n\n"
             "On a terminal the screen is redrawn in place: q or Ctrl-C quits. Into a pipe each\n"
             "frame is plain text, frames separated by a blank line.\n",
    KVEDGE_CMDOPTS_OF(s_top_opts_t, s_top_list)};

/* The live view's state between frames. */
typedef struct {
    kvedge_top_doc_t docs[2];
    kvedge_top_doc_t *prev, *cur;
    int64_t prev_ms;
    bool tty;
    s_screen_t screen;
} s_top_t;

/* Draws one frame of cur against prev (the daemon's clock gives the interval; a smaller
 * uptime means it restarted, so its counters start again from zero). */
static void s_top_frame(const kvedge_cli_t *cli, const s_top_opts_t *o, s_top_t *t, uint64_t frame,
                        int64_t now_ms)
{
    const kvedge_top_doc_t *cur = t->cur, *prev = t->prev;
    bool restarted = cur->uptime_ms < prev->uptime_ms || cur->kind != prev->kind;
    double dt =
        restarted ? (double)cur->uptime_ms / 1e3 : (double)(cur->uptime_ms - prev->uptime_ms) / 1e3;
    if (!(dt > 0))
        dt = (double)(now_ms - t->prev_ms) / 1e3;
    if (!(dt > 0))
        dt = o->interval;
    int cols = 0, rows = 0;
    if (t->tty)
        s_term_size(&cols, &rows);
    s_screen_t *s = &t->screen;
    s->len = 0;
    s->lines = 0;
    s->width = cols;
    s->max_lines = t->tty ? (rows > 1 ? rows - 1 : 1) : 0;
    s_header(s, cur, cli->host, o->interval);
    const kvedge_top_doc_t *base = restarted ? NULL : prev;
    if (cur->kind == KVEDGE_TOP_DOC_NODE)
        s_node_screen(s, cur, base, dt, o->top);
    else
        s_proxy_screen(s, cur, base, dt, s->max_lines);
    if (t->tty)
        fputs("\033[H\033[2J", stdout);
    else if (frame > 0)
        fputc('\n', stdout);
    if (s->len)
        fwrite(s->buf, 1, s->len, stdout);
    fflush(stdout);
}

/* The frames: a snapshot every --interval until --count frames, q, a signal or an error.
 * Returns an exit code. */
static int s_top_loop(kvedge_cli_t *cli, const s_top_opts_t *o, kvedge_client_t *c, s_top_t *t)
{
    uint32_t count = o->count ? o->count : t->tty ? 0 : 1;
    t->prev = &t->docs[0];
    t->cur = &t->docs[1];
    int ex = s_snapshot(cli, c, o->top, false, t->prev, NULL);
    t->prev_ms = kvedge_mono_ms();
    if (ex == KVEDGE_EXIT_OK && t->tty) {
        printf("\033[H\033[2Jkvedge top - %s: the first frame in %.1fs (q quits)\n", cli->host,
               o->interval);
        fflush(stdout);
    }
    for (uint64_t frame = 0; ex == KVEDGE_EXIT_OK && (count == 0 || frame < count); frame++) {
        if (s_wait(o->interval))
            break;
        ex = s_snapshot(cli, c, o->top, true, t->cur, NULL);
        if (ex)
            break;
        int64_t now_ms = kvedge_mono_ms();
        s_top_frame(cli, o, t, frame, now_ms);
        kvedge_top_doc_t *swap = t->prev;
        t->prev = t->cur;
        t->cur = swap;
        t->prev_ms = now_ms;
    }
    return ex;
}

static int s_top(kvedge_cli_t *cli, const void *opts)
{
    const s_top_opts_t *o = opts;
    s_top_t *t = calloc(1, sizeof *t);
    if (!t) {
        kvedge_cli_error("top: out of memory");
        return KVEDGE_EXIT_FAILURE;
    }
    t->tty = isatty(STDOUT_FILENO);
    kvedge_client_t *c = NULL;
    int ex = kvedge_cli_connect(cli, "kvedge-top", &c);
    if (!ex && cli->json) {
        ex = s_top_json(cli, c, o->top, &t->docs[0]);
    } else if (!ex) {
        s_trap();
        if (t->tty)
            s_term_keys();
        ex = s_top_loop(cli, o, c, t);
        s_term_restore();
    }
    kvedge_client_destroy(&c);
    free(t->screen.buf);
    free(t);
    return ex;
}

/* ---------------------------------------------------------------- sources */

static void s_sources_json(const kvedge_top_doc_t *d)
{
    printf("[");
    for (uint32_t i = 0; i < d->proxy.nsources; i++) {
        const kvedge_top_source_t *s = &d->proxy.sources[i];
        printf("%s{\"name\":", i ? "," : "");
        kvedge_cli_json_str(stdout, s->name);
        printf(",\"kind\":");
        kvedge_cli_json_str(stdout, s->kind);
        printf(",\"endpoint\":");
        kvedge_cli_json_str(stdout, s->endpoint);
        printf(",\"origin\":");
        kvedge_cli_json_str(stdout, s->origin);
        printf(",\"connected\":%s,\"state\":", s->connected ? "true" : "false");
        kvedge_cli_json_str(stdout, s->state);
        printf(",\"weight\":%.6g,\"rtt_us\":%.1f,\"bandwidth\":%.0f,\"failures\":%llu,"
               "\"last_error\":",
               s->weight, s->rtt_us, s->bandwidth, (unsigned long long)s->failures);
        kvedge_cli_json_str(stdout, s->last_error);
        printf(",\"history\":");
        if (s->has_history) {
            printf("{\"state\":");
            kvedge_cli_json_str(stdout, s->history.state);
            printf(",\"chunks_missing\":%llu,\"blocks_held\":%llu,\"last_success_age_s\":%.1f}",
                   (unsigned long long)s->history.chunks_missing,
                   (unsigned long long)s->history.blocks_held, s->history.last_success_age_s);
        } else {
            printf("null");
        }
        printf("}");
    }
    printf("]\n");
}

/* `kvedge sources` takes no options of its own. */
typedef struct {
    bool unused;
} s_sources_opts_t;

static const kvedge_cmdopts_t s_sources_opts = {
    .command = "sources",
    .summary = "An edge proxy's sources and their state (with -H).",
    .about = "Run as `kvedge -H PROXY sources`. The edge proxy's sources: kind, endpoint, where\n"
             "it came from (config or the master), connection, health state, measured round\n"
             "trip and bandwidth, failures, the last error, and the lag of history sources.\n"
             "--json prints them as an array.\n",
    .struct_size = sizeof(s_sources_opts_t),
    .opts = NULL,
    .count = 0};

/* The proxy's MONITOR document into d; a store node is refused. Returns an exit code. */
static int s_sources_run(kvedge_cli_t *cli, kvedge_top_doc_t *d)
{
    kvedge_client_t *c;
    int ex = kvedge_cli_connect(cli, "kvedge-cli", &c);
    if (ex)
        return ex;
    const kvedge_node_info_t *ni = kvedge_client_node(c);
    bool proxy = ni && ni->role == KVEDGE_ROLE_PROXY;
    if (proxy)
        ex = s_snapshot(cli, c, 0, false, d, NULL);
    kvedge_client_destroy(&c);
    if (!proxy || (ex == KVEDGE_EXIT_OK && d->kind != KVEDGE_TOP_DOC_PROXY)) {
        kvedge_cli_error("not a proxy: %s is a store node (use kvedge -H %s top)", cli->host,
                         cli->host);
        return KVEDGE_EXIT_USAGE;
    }
    return ex;
}

static void s_sources_text(const kvedge_top_doc_t *d)
{
    char b1[32], b2[32];
    printf("%-16s %-8s %-28s %-7s %4s %-8s %9s %12s %8s  %-24s %s\n", "SOURCE", "KIND", "ENDPOINT",
           "ORIGIN", "CONN", "STATE", "RTT", "BANDWIDTH", "FAILURES", "HISTORY LAG", "LAST ERROR");
    for (uint32_t i = 0; i < d->proxy.nsources; i++) {
        const kvedge_top_source_t *s = &d->proxy.sources[i];
        char lag[96];
        s_source_lag(s, lag, sizeof lag);
        printf("%-16s %-8s %-28s %-7s %4s %-8s %9s %12s %8llu  %-24s %s\n", s->name, s->kind,
               s->endpoint, s->origin, s->connected ? "yes" : "no", s->state,
               s_dur(s->rtt_us, b1, 32), s_bps(s->bandwidth, b2, 32),
               (unsigned long long)s->failures, lag, s->last_error[0] ? s->last_error : "-");
    }
    if (d->proxy.nsources == 0)
        printf("(no sources)\n");
}

static int s_sources(kvedge_cli_t *cli, const void *opts)
{
    (void)opts;
    kvedge_top_doc_t *d = calloc(1, sizeof *d);
    if (!d) {
        kvedge_cli_error("sources: out of memory");
        return KVEDGE_EXIT_FAILURE;
    }
    int ex = s_sources_run(cli, d);
    if (!ex && cli->json)
        s_sources_json(d);
    else if (!ex)
        s_sources_text(d);
    free(d);
    return ex;
}

const kvedge_cli_cmd_t kvedge_cli_top_cmds[] = {
    {.name = "top", .opts = &s_top_opts, .exec = s_top},
    {.name = "sources", .opts = &s_sources_opts, .exec = s_sources},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};
