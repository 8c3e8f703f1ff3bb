/* libkvedge's own entry points beyond the client and the loader: its version, which the
 * build passes from project(VERSION) (clients/lib/CMakeLists.txt). */
#include "clients/lib/kvedge.h"

/* The headers and the project agree (configuring checks it too); a build without the
 * definitions (an IDE compiling the file alone) uses the headers'. */
#ifndef KVEDGE_BUILD_VERSION
#define S_STR2(x) #x
#define S_STR(x)  S_STR2(x)
#define KVEDGE_BUILD_VERSION                                                                       \
    S_STR(KVEDGE_VERSION_MAJOR) "." S_STR(KVEDGE_VERSION_MINOR) "." S_STR(KVEDGE_VERSION_PATCH)
#define KVEDGE_BUILD_VERSION_NUMBER KVEDGE_VERSION_NUMBER
#endif
_Static_assert(KVEDGE_BUILD_VERSION_NUMBER == KVEDGE_VERSION_NUMBER,
               "clients/lib/kvedge.h's KVEDGE_VERSION_* are the project's version");

const char *kvedge_version(void)
{
    return KVEDGE_BUILD_VERSION;
}

int kvedge_version_number(void)
{
    return KVEDGE_BUILD_VERSION_NUMBER;
}
