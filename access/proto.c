/* Names of the protocol's vocabulary (access/proto.h) for logs and tools. The delivery
 * reasons' names are in access/frame.c beside the LAYER record that carries them. */
#include "access/proto.h"

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
