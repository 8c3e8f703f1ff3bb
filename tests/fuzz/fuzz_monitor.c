/* Fuzz target for the MONITOR document parser of `kvedge top` (clients/cli/top_doc.h). Built
 * with libFuzzer (KVEDGE_FUZZ=ON, clang) it fuzzes; built normally it replays the committed
 * corpus.
 *
 * Whatever the bytes, the parse either refuses them with a cleared snapshot or fills one that
 * keeps its caps, whose strings are NUL-terminated, valid UTF-8 and free of control
 * characters, and whose histograms give finite percentiles. */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/cli/top_doc.h"
#include "access/codec/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void s_check_str(const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    if (n == cap)
        abort(); /* not terminated inside its buffer */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7F)
            abort();
        if (c < 0x80)
            continue;
        /* a lead byte and its continuation bytes, all inside the string */
        size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
        if (len == 0 || i + len > n)
            abort();
        for (size_t k = 1; k < len; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80)
                abort();
        i += len - 1;
    }
}

#define S_CHECK(field) s_check_str((field), sizeof(field))

static void s_check_hist(const kvedge_top_hist_t *h, const uint64_t *le, uint32_t nle)
{
    if (h->nbuckets > KVEDGE_TOP_DOC_MAX_BUCKETS)
        abort();
    for (int i = 0; i <= 100; i += 25) {
        double q = kvedge_top_hist_quantile(h, le, nle, i / 100.0);
        if (!isfinite(q) || q < 0)
            abort();
    }
    kvedge_top_hist_t acc = {0};
    if (kvedge_top_hist_delta(&acc, h, h) && acc.count != 0)
        abort(); /* a snapshot minus itself is empty */
    memset(&acc, 0, sizeof acc);
    if (kvedge_top_hist_delta(&acc, h, NULL) && acc.count != h->count)
        abort();
}

static void s_check_node(const kvedge_top_doc_t *d)
{
    if (d->node.nops > KVEDGE_TOP_DOC_MAX_OPS || d->node.nle > KVEDGE_TOP_DOC_MAX_BUCKETS ||
        d->node.nmiss_reasons > KVEDGE_TOP_DOC_MAX_REASONS ||
        d->node.nschemes > KVEDGE_TOP_DOC_MAX_SCHEMES ||
        d->node.ntenants > KVEDGE_TOP_DOC_MAX_TENANTS ||
        d->node.hot.nprefixes > KVEDGE_TOP_DOC_MAX_PREFIXES ||
        d->node.nsubs > KVEDGE_TOP_DOC_MAX_SUBS)
        abort();
    for (uint32_t i = 0; i < d->node.nops; i++) {
        S_CHECK(d->node.ops[i].op);
        if (d->node.ops[i].errors > d->node.ops[i].requests)
            abort();
        s_check_hist(&d->node.ops[i].latency, d->node.le_us, d->node.nle);
        if (kvedge_top_doc_op(d, d->node.ops[i].op) != &d->node.ops[i])
            abort(); /* one entry per opcode name */
    }
    for (uint32_t i = 0; i < d->node.nmiss_reasons; i++)
        S_CHECK(d->node.miss_reasons[i].a);
    for (uint32_t i = 0; i < d->node.nschemes; i++)
        S_CHECK(d->node.served[i].a);
    for (uint32_t i = 0; i < d->node.ntenants; i++)
        S_CHECK(d->node.tenants[i].tenant);
    for (uint32_t i = 0; i < d->node.hot.nprefixes; i++) {
        S_CHECK(d->node.hot.prefixes[i].id);
        S_CHECK(d->node.hot.prefixes[i].model);
    }
    for (uint32_t i = 0; i < d->node.nsubs; i++) {
        S_CHECK(d->node.subs[i].name);
        S_CHECK(d->node.subs[i].cloud);
        S_CHECK(d->node.subs[i].state);
        S_CHECK(d->node.subs[i].last_error);
    }
    S_CHECK(d->node.master.endpoint);
    S_CHECK(d->node.master.node_id);
    S_CHECK(d->node.master.state);
    S_CHECK(d->node.master.why);
}

static void s_check_proxy(const kvedge_top_doc_t *d)
{
    if (d->proxy.nsources > KVEDGE_TOP_DOC_MAX_SOURCES ||
        d->proxy.nlayers > KVEDGE_TOP_DOC_MAX_REASONS ||
        d->proxy.ntransitions > KVEDGE_TOP_DOC_MAX_TRANSITIONS ||
        d->proxy.fetch.nle > KVEDGE_TOP_DOC_MAX_BUCKETS ||
        d->proxy.master.nnodes > KVEDGE_TOP_DOC_MAX_NODES)
        abort();
    for (uint32_t i = 0; i < d->proxy.nsources; i++) {
        const kvedge_top_source_t *s = &d->proxy.sources[i];
        S_CHECK(s->name);
        S_CHECK(s->kind);
        S_CHECK(s->endpoint);
        S_CHECK(s->origin);
        S_CHECK(s->state);
        S_CHECK(s->last_error);
        S_CHECK(s->history.state);
        if (!isfinite(s->rtt_us) || s->rtt_us < 0 || !isfinite(s->bandwidth) || s->bandwidth < 0 ||
            !isfinite(s->weight) || s->weight < 0 || !isfinite(s->history.last_success_age_s) ||
            s->history.last_success_age_s < -1)
            abort();
    }
    for (uint32_t i = 0; i < d->proxy.nlayers; i++) {
        S_CHECK(d->proxy.layers[i].a);
        S_CHECK(d->proxy.layers[i].b);
    }
    const kvedge_top_fetch_t *f = &d->proxy.fetch;
    s_check_hist(&f->plan, f->le_us, f->nle);
    s_check_hist(&f->first_layer, f->le_us, f->nle);
    s_check_hist(&f->last_layer, f->le_us, f->nle);
    s_check_hist(&f->planned, f->le_us, f->nle);
    if (!isfinite(f->actual_to_plan_median) || f->actual_to_plan_median < 0)
        abort();
    for (uint32_t i = 0; i < d->proxy.ntransitions; i++) {
        S_CHECK(d->proxy.transitions[i].source);
        S_CHECK(d->proxy.transitions[i].from);
        S_CHECK(d->proxy.transitions[i].to);
        S_CHECK(d->proxy.transitions[i].reason);
    }
    S_CHECK(d->proxy.master.endpoint);
    S_CHECK(d->proxy.master.registry);
    for (uint32_t i = 0; i < d->proxy.master.nnodes; i++) {
        S_CHECK(d->proxy.master.nodes[i].node);
        S_CHECK(d->proxy.master.nodes[i].role);
        S_CHECK(d->proxy.master.nodes[i].endpoint);
        S_CHECK(d->proxy.master.nodes[i].health);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvedge_top_doc_t d, zero;
    /* The parser takes unterminated input: give it an exact-size copy, so a read past the
     * end is an ASan report. */
    char *json = malloc(size ? size : 1);
    if (!json)
        return 0;
    memcpy(json, data, size);
    int rc = kvedge_top_doc_parse(json, size, &d);
    free(json);
    if (rc != KVEDGE_OK) {
        if (rc != KVEDGE_EPROTO && rc != KVEDGE_ETOOBIG)
            abort();
        if (memcmp(&d, &zero, sizeof d) != 0)
            abort(); /* a refusal leaves the snapshot cleared */
        return 0;
    }
    if (d.kind != KVEDGE_TOP_DOC_NODE && d.kind != KVEDGE_TOP_DOC_PROXY)
        abort();
    S_CHECK(d.name);
    S_CHECK(d.role);
    S_CHECK(d.version);
    S_CHECK(d.not_ready);
    if (d.kind == KVEDGE_TOP_DOC_NODE)
        s_check_node(&d);
    else
        s_check_proxy(&d);
    return 0;
}
