#!/usr/bin/env bash
# The configure-time checks of cmake/KvedgePublic.cmake on a made-up project: public headers
# are copied with their includes rewritten to <kvedge/...>; configuring fails when a public
# header includes an internal header, a non-standard system header or a computed include,
# when two share a name, or when the header's version is not the project's.
# usage: test_public_headers.sh SOURCE_DIR
set -euo pipefail

src=${1:?usage: $0 SOURCE_DIR}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvedge-pubhdr.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

# A project with the public set mod/api.h -> mod/a.h -> sub/b.h, at version 1.2.3.
mkdir -p "$tmp/p/mod" "$tmp/p/sub" "$tmp/p/other"
cat >"$tmp/p/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.25)
project(fake VERSION 1.2.3 LANGUAGES NONE)
list(APPEND CMAKE_MODULE_PATH "$src/cmake")
include(KvedgePublic)
kvedge_check_header_version(\${PROJECT_SOURCE_DIR}/mod/api.h)
kvedge_public_headers(out \${PROJECT_BINARY_DIR}/include \${PUBLIC})
message(STATUS "generated: \${out}")
EOF
cat >"$tmp/p/mod/api.h" <<'EOF'
/* The facade (#include <kvedge/api.h>): prose that mentions an include is left alone. */
#include <stdint.h>
#include "mod/a.h"
#define KVEDGE_VERSION_MAJOR 1
#define KVEDGE_VERSION_MINOR 2
#define KVEDGE_VERSION_PATCH 3
#define KVEDGE_VERSION_NUMBER (KVEDGE_VERSION_MAJOR * 10000 + KVEDGE_VERSION_MINOR * 100 + KVEDGE_VERSION_PATCH)
EOF
printf '#include <stddef.h>\n  #  include "sub/b.h"\nint kvedge_a(void);\n' >"$tmp/p/mod/a.h"
printf 'int kvedge_b(void);\n' >"$tmp/p/sub/b.h"
printf 'int kvedge_internal(void);\n' >"$tmp/p/sub/internal.h"
printf 'int kvedge_other(void);\n' >"$tmp/p/other/b.h"
public="mod/api.h;mod/a.h;sub/b.h"

# configure NAME EXPECT [PUBLIC]: EXPECT is ok or the text the failure must contain.
configure() {
    local name=$1 expect=$2 set=${3:-$public} rc=0
    cmake -S "$tmp/p" -B "$tmp/b" "-DPUBLIC=$set" >"$tmp/$name.log" 2>&1 || rc=$?
    if [ "$expect" = ok ]; then
        [ "$rc" -eq 0 ] || { cat "$tmp/$name.log" >&2; fail "$name: configure failed"; }
    else
        [ "$rc" -ne 0 ] || fail "$name: configure passed, expected a failure"
        # CMake wraps long messages: compare without line breaks and indentation.
        local said
        said=$(tr -s ' \n' ' ' <"$tmp/$name.log")
        grep -q -F -- "$expect" <<<"$said" ||
            { cat "$tmp/$name.log" >&2; fail "$name: failure does not say: $expect"; }
    fi
    echo "ok: $name"
}

configure good ok
inc=$tmp/b/include/kvedge
grep -qx '#include "kvedge/a.h"' "$inc/api.h" || fail "api.h: include not rewritten"
grep -qx '  #  include "kvedge/b.h"' "$inc/a.h" || fail "a.h: indented include not rewritten"
grep -qx '#include <stdint.h>' "$inc/api.h" || fail "api.h: system include changed"
grep -q -F '(#include <kvedge/api.h>)' "$inc/api.h" || fail "api.h: comment changed"
cmp -s "$tmp/p/sub/b.h" "$inc/b.h" || fail "b.h: changed though it includes nothing"

# A copy is rewritten only when it changes; one dropped from the set is removed.
touch -d '2000-01-01' "$inc/b.h"
configure unchanged ok
[ "$(stat -c %Y "$inc/b.h")" = "$(date -d '2000-01-01' +%s)" ] || fail "b.h rewritten"
printf '#include <stddef.h>\nint kvedge_a(void);\n' >"$tmp/p/mod/a.h"
configure smaller ok "mod/a.h"
if [ -e "$inc/b.h" ] || [ -e "$inc/api.h" ]; then
    fail "dropped headers still there"
fi

printf '#include "sub/internal.h"\n' >"$tmp/p/mod/a.h"
configure internal 'public header mod/a.h includes "sub/internal.h", which is not a public header'
printf '#include <czmq.h>\n' >"$tmp/p/mod/a.h"
configure system 'public header mod/a.h includes <czmq.h>'
printf '#define H "sub/b.h"\n#include H\n' >"$tmp/p/mod/a.h"
# shellcheck disable=SC2016 # the backquotes are the message's own
configure computed 'public header mod/a.h: cannot check `#include H`'
printf '#include "sub/b.h"\n' >"$tmp/p/mod/a.h"
configure same-name 'two of them are named b.h' "mod/api.h;mod/a.h;sub/b.h;other/b.h"
configure missing 'public header sub/none.h does not exist' "sub/none.h;mod/api.h;mod/a.h;sub/b.h"

sed -i 's/KVEDGE_VERSION_PATCH 3/KVEDGE_VERSION_PATCH 4/' "$tmp/p/mod/api.h"
configure version 'says KVEDGE_VERSION_PATCH 4, the project version is 1.2.3'
sed -i 's/KVEDGE_VERSION_PATCH 4/KVEDGE_VERSION_PATCH 3/' "$tmp/p/mod/api.h"
# KVEDGE_VERSION_NUMBER (MAJOR*10000 + MINOR*100 + PATCH) orders versions only below 100.
sed -i 's/VERSION 1.2.3/VERSION 1.100.3/' "$tmp/p/CMakeLists.txt"
configure number-range 'MINOR must stay below 100'
sed -i 's/VERSION 1.100.3/VERSION 1.2.3/' "$tmp/p/CMakeLists.txt"
sed -i '/define KVEDGE_VERSION_NUMBER/d' "$tmp/p/mod/api.h"
configure no-number 'no #define KVEDGE_VERSION_NUMBER'
sed -i '/KVEDGE_VERSION_MINOR/d' "$tmp/p/mod/api.h"
configure no-version 'no #define KVEDGE_VERSION_MINOR'
echo PASS
