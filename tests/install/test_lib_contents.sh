#!/usr/bin/env bash
# libkvedge.so holds client code only: no object of the daemons' runtime (runtime/: settings,
# log, kvmsg, mview, CURVE/ZAP) in the archives it is made of, none of their symbols in it, and
# every exported symbol declared in an installed header.
# Usage: test_lib_contents.sh LIBKVEDGE_SO INCLUDE_DIR ARCHIVE...
set -euo pipefail
lib=${1:?usage: test_lib_contents.sh LIB INCLUDE_DIR ARCHIVE...}
inc=${2:?}
shift 2
fail=0
runtime_objs='^(settings|log|kvmsg|mview|secure)\.c\.o$'
for a in "$@"; do
    bad=$(ar t "$a" | grep -E "$runtime_objs" || true)
    if [ -n "$bad" ]; then
        echo "FAIL: $(basename "$a") carries runtime objects: $bad"
        fail=1
    fi
done
# Every defined symbol, local ones too (the library is not stripped in the build tree).
syms=$(nm --defined-only "$lib" | awk '{print $3}')
bad=$(grep -E '^kvedge_(settings?|log|kvmsg|mview|secure)_|^kvedge_log$' <<<"$syms" || true)
if [ -n "$bad" ]; then
    echo "FAIL: $(basename "$lib") holds runtime symbols:"
    head -20 <<<"$bad"
    fail=1
fi
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRV]$/ {print $3}' | sed 's/@.*//' | sort -u)
n=0
for s in $exported; do
    n=$((n + 1))
    if ! grep -rqw -- "$s" "$inc"; then
        echo "FAIL: $s is exported but no installed header declares it"
        fail=1
    fi
done
[ "$n" -gt 0 ] || { echo "FAIL: no exported symbol found in $lib"; fail=1; }
[ "$fail" -eq 0 ] || exit 1
echo "$(basename "$lib"): $n exported symbols, each in an installed header; no runtime code"
