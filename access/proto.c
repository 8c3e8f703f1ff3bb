/* Names of the protocol's vocabulary (access/proto.h) for logs and tools. The delivery
 * reasons' names are in access/frame.c beside the LAYER record that carries them. */
#include "access/proto.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/error.h"

const char *kvedge_plan_reason_name(kvedge_plan_reason_t reason)
{
    switch (reason) {
#define KVEDGE_PLAN_REASON_CASE(name, text)                                                        \
    case KVEDGE_PLAN_##name:                                                                       \
        return text;
        KVEDGE_PLAN_REASON_MAP(KVEDGE_PLAN_REASON_CASE)
#undef KVEDGE_PLAN_REASON_CASE
    }
    return "?";
}

const char *kvedge_plan_kind_name(kvedge_plan_kind_t kind)
{
    switch (kind) {
    case KVEDGE_PLAN_LOCAL:
        return "local";
    case KVEDGE_PLAN_PEER:
        return "peer";
    case KVEDGE_PLAN_CLOUD:
        return "cloud";
    case KVEDGE_PLAN_HISTORY:
        return "history";
    case KVEDGE_PLAN_RECOMPUTE:
        return "recompute";
    }
    return "?";
}

const char *kvedge_quality_metric_name(kvedge_quality_metric_t metric)
{
    switch (metric) {
    case KVEDGE_QUALITY_NONE:
        return "none";
    case KVEDGE_QUALITY_PPL_PCT:
        return "ppl";
    case KVEDGE_QUALITY_KL:
        return "kl";
    }
    return "?";
}

int kvedge_quality_budget_check(kvedge_quality_metric_t metric, double budget)
{
    if (!isfinite(budget) || budget < 0)
        return KVEDGE_EINVAL;
    switch (metric) {
    case KVEDGE_QUALITY_NONE:
        return budget == 0 ? KVEDGE_OK : KVEDGE_EINVAL;
    case KVEDGE_QUALITY_PPL_PCT:
        return budget <= KVEDGE_QUALITY_PPL_PCT_MAX ? KVEDGE_OK : KVEDGE_EINVAL;
    case KVEDGE_QUALITY_KL:
        return budget <= KVEDGE_QUALITY_KL_MAX ? KVEDGE_OK : KVEDGE_EINVAL;
    }
    return KVEDGE_EINVAL;
}

int kvedge_quality_budget_parse(const char *s, kvedge_quality_metric_t *metric, double *budget)
{
    if (!s || !metric || !budget)
        return KVEDGE_EINVAL;
    if (strcmp(s, "none") == 0) {
        *metric = KVEDGE_QUALITY_NONE;
        *budget = 0;
        return KVEDGE_OK;
    }
    kvedge_quality_metric_t m;
    const char *p;
    if (strncmp(s, "ppl:", 4) == 0) {
        m = KVEDGE_QUALITY_PPL_PCT;
        p = s + 4;
    } else if (strncmp(s, "kl:", 3) == 0) {
        m = KVEDGE_QUALITY_KL;
        p = s + 3;
    } else {
        return KVEDGE_EINVAL;
    }
    /* Digits or a point first: no sign, space, "nan" or "inf" (strtod takes all of them). */
    if (!((*p >= '0' && *p <= '9') || *p == '.'))
        return KVEDGE_EINVAL;
    char *end;
    errno = 0;
    double x = strtod(p, &end);
    if (end == p || errno == ERANGE)
        return KVEDGE_EINVAL;
    for (const char *q = p; q < end; q++) /* decimal only: strtod also reads hex */
        if (!strchr("0123456789.eE+-", *q))
            return KVEDGE_EINVAL;
    if (m == KVEDGE_QUALITY_PPL_PCT && *end == '%')
        end++;
    if (*end != '\0' || kvedge_quality_budget_check(m, x) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    *metric = m;
    *budget = x;
    return KVEDGE_OK;
}

const char *kvedge_plan_prec_reason_name(kvedge_plan_prec_reason_t reason)
{
    switch (reason) {
#define KVEDGE_PLAN_PREC_REASON_CASE(name, text)                                                   \
    case KVEDGE_PLAN_PREC_##name:                                                                  \
        return text;
        KVEDGE_PLAN_PREC_REASON_MAP(KVEDGE_PLAN_PREC_REASON_CASE)
#undef KVEDGE_PLAN_PREC_REASON_CASE
    }
    return "?";
}
