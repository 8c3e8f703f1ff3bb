/* libkvedge's own entry points beyond the client and the loader: its version. */
#include "clients/lib/kvedge.h"

#define S_STR2(x) #x
#define S_STR(x)  S_STR2(x)

const char *kvedge_version(void)
{
    return S_STR(KVEDGE_VERSION_MAJOR) "." S_STR(KVEDGE_VERSION_MINOR) "." S_STR(
        KVEDGE_VERSION_PATCH);
}
