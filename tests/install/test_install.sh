#!/usr/bin/env bash
# Install and link, as a user would: stages `cmake --install BUILD --prefix /usr` under a
# DESTDIR, checks the layout (the man page and the bash completion, which describe the installed
# kvedge, man finds the page and the completion completes), the library's SONAME, dependencies
# and exports, compiles every installed header alone (C, and C++ when there is a C++
# compiler), builds ping.c against the staged tree with pkg-config, and pings a store node
# started from the installed kvedge.
#
# usage: test_install.sh BUILD_DIR VERSION SOVERSION LIBDIR INCLUDEDIR CC [CXX]
#   VERSION: the project's (libkvedge.so.VERSION); SOVERSION: the ABI's (the SONAME
#   libkvedge.so.SOVERSION), which moves on its own when the ABI breaks
#   LIBDIR, INCLUDEDIR: CMAKE_INSTALL_LIBDIR / CMAKE_INSTALL_INCLUDEDIR (relative to the prefix)
#   KVEDGE_TEST_CFLAGS: extra flags for what this compiles (the sanitizer build's)
# Never writes outside its temporary directory.
set -euo pipefail

if [ $# -lt 6 ]; then
    echo "usage: $0 BUILD_DIR VERSION SOVERSION LIBDIR INCLUDEDIR CC [CXX]" >&2
    exit 2
fi
build=$1
version=$2
soversion=$3
libdir=$4
includedir=$5
cc=$6
cxx=${7:-}
here=$(cd "$(dirname "$0")" && pwd)
read -r -a extra <<<"${KVEDGE_TEST_CFLAGS:-}"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvedge-install.XXXXXX")
node_pid=
cleanup() {
    if [ -n "$node_pid" ] && kill -0 "$node_pid" 2>/dev/null; then
        kill -KILL "$node_pid" 2>/dev/null || true
        wait "$node_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
    echo "FAIL: $*" >&2
    exit 1
}
step() { echo "-- $*"; }

stage=$tmp/stage
root=$stage/usr
lib=$root/$libdir
inc=$root/$includedir

# ---------------------------------------------------------------- install under DESTDIR
step "cmake --install $build --prefix /usr (DESTDIR=$stage)"
DESTDIR=$stage cmake --install "$build" --prefix /usr >"$tmp/install.log" ||
    { cat "$tmp/install.log" >&2; fail "cmake --install"; }
# Every path it reported lies under DESTDIR: nothing touched the real system.
grep -q -E '^-- Installing: ' "$tmp/install.log" || fail "cmake --install installed nothing"
if grep -E '^-- (Installing|Up-to-date|Set runtime path)' "$tmp/install.log" |
    grep -v -F -- "$stage/" >&2; then
    fail "installed outside DESTDIR"
fi

for f in bin/kvedge "$libdir/libkvedge.so" "$libdir/libkvedge.so.${soversion}" \
    "$libdir/libkvedge.so.$version" "$libdir/pkgconfig/kvedge.pc" "$includedir/kvedge/kvedge.h"; do
    [ -e "$root/$f" ] || fail "not installed: $f"
done
[ -x "$root/bin/kvedge" ] || fail "bin/kvedge is not executable"

# ---------------------------------------------------------------- man page, bash completion
man1=$root/share/man/man1/kvedge.1
completion=$root/share/bash-completion/completions/kvedge
step "share/man/man1/kvedge.1, share/bash-completion/completions/kvedge"
[ -s "$man1" ] || fail "not installed: share/man/man1/kvedge.1"
[ -s "$completion" ] || fail "not installed: share/bash-completion/completions/kvedge"
# They describe the binary installed with them.
"$root/bin/kvedge" help --man | cmp -s - "$man1" ||
    fail "the installed kvedge.1 is not what the installed kvedge prints (help --man)"
"$root/bin/kvedge" help --completion bash | cmp -s - "$completion" ||
    fail "the installed completion is not what the installed kvedge prints"
if command -v man >/dev/null; then
    # man finds the page through the prefix's man directory, as after a real install.
    page=$(MANPATH=$root/share/man MANWIDTH=80 man -P cat kvedge 2>"$tmp/man.err") ||
        { cat "$tmp/man.err" >&2; fail "man kvedge (MANPATH=share/man) failed"; }
    grep -q 'KVEDGE(1)' <<<"$page" || fail "man kvedge does not show the page"
    echo "   man kvedge: $(wc -l <<<"$page") lines"
fi
# The bash-completion package loads completions/NAME for command NAME on first use.
reply=$(bash --norc --noprofile -c 'source "$1"; COMP_WORDS=(kvedge pre); COMP_CWORD=1;
    _kvedge; echo "${COMPREPLY[*]}"' bash "$completion") || fail "sourcing the completion failed"
[ "$reply" = prefill ] || fail "installed completion: kvedge pre<TAB> gives '$reply'"

# ---------------------------------------------------------------- the shared library
so=$lib/libkvedge.so.${soversion}
step "readelf -d ${so#"$stage"}"
readelf -d "$so" >"$tmp/dynamic.txt"
grep -q 'Library soname: \[libkvedge\.so\.'"$soversion"'\]' "$tmp/dynamic.txt" ||
    fail "SONAME is not libkvedge.so.${soversion}: $(grep SONAME "$tmp/dynamic.txt")"
grep '(NEEDED)' "$tmp/dynamic.txt" | sed 's/.*\[\(.*\)\]/   NEEDED \1/'
if grep -i '(NEEDED).*rocksdb' "$tmp/dynamic.txt"; then
    fail "libkvedge needs RocksDB"
fi
runpath=$(grep -E '\((RPATH|RUNPATH)\)' "$tmp/dynamic.txt" || true)
[[ $runpath != *"$build"* ]] || fail "libkvedge keeps a run path into the build tree: $runpath"

# ---------------------------------------------------------------- headers
step "installed headers"
headers=()
for h in "$inc"/kvedge/*.h; do
    headers+=("$(basename "$h")")
    # Project includes were rewritten to installed names that exist; nothing else is
    # pulled in (the configure step enforces this too, on the sources).
    while read -r target; do
        case "$target" in
        kvedge/*) [ -e "$inc/$target" ] || fail "$h includes missing \"$target\"" ;;
        *) fail "$(basename "$h") includes \"$target\"" ;;
        esac
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$h")
    printf '#include <kvedge/%s>\n' "${headers[-1]}" |
        "$cc" -std=c11 -pedantic-errors -Wall -Wextra -Werror -fsyntax-only -I"$inc" -x c - ||
        fail "kvedge/${headers[-1]} does not compile alone as C"
    if [ -n "$cxx" ]; then
        printf '#include <kvedge/%s>\n' "${headers[-1]}" |
            "$cxx" -Wall -Wextra -Werror -fsyntax-only -I"$inc" -x c++ - ||
            fail "kvedge/${headers[-1]} does not compile alone as C++"
    fi
done
echo "   ${#headers[@]} headers compile alone as C${cxx:+ and C++}: ${headers[*]}"

# The exports are exactly the functions the headers declare.
printf '#include <kvedge/kvedge.h>\n' | "$cc" -E -P -I"$inc" -x c - |
    grep -oE '\bkvedge_[A-Za-z0-9_]+[[:space:]]*\(' | tr -d ' \t(' | sort -u >"$tmp/declared.txt"
nm -D --defined-only "$so" | awk '$2 != "A" { sub(/@.*/, "", $3); print $3 }' |
    sort -u >"$tmp/exported.txt"
if ! diff -u --label declared --label exported "$tmp/declared.txt" "$tmp/exported.txt" >&2; then
    fail "exports differ from the functions the headers declare (clients/lib/libkvedge.map)"
fi
echo "   $(wc -l <"$tmp/exported.txt") exported functions = the functions the headers declare"

# Linked from C++, every one of them resolves: the extern "C" guards are in place.
if [ -n "$cxx" ]; then
    {
        echo '#include <cstdio>'
        echo '#include <kvedge/kvedge.h>'
        echo 'typedef void (*fn_t)(void);'
        echo 'static const fn_t s_fns[] = {'
        sed 's/.*/    reinterpret_cast<fn_t>(\&&),/' "$tmp/declared.txt"
        echo '};'
        printf '%s\n' 'int main() { std::printf("%zu\n", sizeof s_fns / sizeof s_fns[0]); }'
    } >"$tmp/link.cc"
    "$cxx" "${extra[@]}" -Wall -Werror -I"$inc" "$tmp/link.cc" -o "$tmp/link_cxx" -L"$lib" \
        -lkvedge || fail "C++ program taking every function's address does not link"
    n=$(LD_LIBRARY_PATH=$lib "$tmp/link_cxx")
    [ "$n" = "$(wc -l <"$tmp/declared.txt")" ] || fail "C++ link check saw $n functions"
    echo "   C++: all $n functions link with C linkage"
fi

# ---------------------------------------------------------------- pkg-config
# The .pc names the install prefix (/usr); the sysroot maps it onto the staged tree, as for
# any DESTDIR- or cross-staged package.
step "pkg-config kvedge (PKG_CONFIG_SYSROOT_DIR=$stage)"
grep -qx 'prefix=/usr' "$lib/pkgconfig/kvedge.pc" ||
    fail "kvedge.pc: prefix is not the install prefix: $(grep '^prefix=' "$lib/pkgconfig/kvedge.pc")"
export PKG_CONFIG_PATH=$lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$stage
modversion=$(pkg-config --modversion kvedge)
[ "$modversion" = "$version" ] || fail "pkg-config --modversion kvedge: $modversion"
pcso=$(pkg-config --variable=soversion kvedge)
[ "$pcso" = "$soversion" ] || fail "pkg-config --variable=soversion kvedge: $pcso"
read -r -a pc_flags <<<"$(pkg-config --cflags --libs kvedge)"
echo "   ${pc_flags[*]}"
for want in "-I$inc" "-L$lib" -lkvedge; do
    found=0
    for f in "${pc_flags[@]}"; do
        [ "$f" = "$want" ] && found=1
    done
    [ "$found" = 1 ] || fail "pkg-config lacks $want"
done
"$cc" -std=c11 -Wall -Wextra -Werror "${extra[@]}" "$here/ping.c" "${pc_flags[@]}" \
    -o "$tmp/ping" || fail "ping.c does not build against the installed tree"
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
# (Whole outputs are captured before matching: with pipefail, `cmd | grep -q` fails when
# grep's early exit kills cmd with SIGPIPE.)
deps=$(LD_LIBRARY_PATH=$lib ldd "$tmp/ping")
grep -q -F "libkvedge.so.${soversion} => $lib/" <<<"$deps" ||
    fail "ping does not load the staged libkvedge: $deps"

# ---------------------------------------------------------------- ping the installed node
step "kvedge store (installed binary), ping"
"$root/bin/kvedge" --data "$tmp/node" store --insecure --bind "ipc://$tmp/n.sock" --metrics off \
    >"$tmp/node.out" 2>"$tmp/node.err" &
node_pid=$!
for _ in $(seq 100); do
    grep -q '^listening ' "$tmp/node.out" && break
    kill -0 "$node_pid" 2>/dev/null || { cat "$tmp/node.err" >&2; fail "node exited"; }
    sleep 0.1
done
endpoint=$(sed -n 's/^listening //p' "$tmp/node.out")
[ -n "$endpoint" ] || { cat "$tmp/node.err" >&2; fail "node not listening after 10 s"; }

out=$(LD_LIBRARY_PATH=$lib "$tmp/ping" "$endpoint") || fail "ping exited $?"
echo "   $out"
[[ $out =~ ^libkvedge\ ${version//./\\.}:\ node\ \".*\"\ role\ [0-9]+\ rtt_us\ [0-9]+\.[0-9]$ ]] ||
    fail "unexpected ping output: $out"

kill -TERM "$node_pid"
for _ in $(seq 100); do
    kill -0 "$node_pid" 2>/dev/null || break
    sleep 0.1
done
kill -0 "$node_pid" 2>/dev/null && fail "node still running 10 s after SIGTERM"
rc=0
wait "$node_pid" || rc=$?
node_pid=
[ "$rc" -eq 0 ] || { cat "$tmp/node.err" >&2; fail "node exited $rc after SIGTERM"; }
echo "PASS"
