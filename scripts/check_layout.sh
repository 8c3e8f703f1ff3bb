#!/usr/bin/env bash
# The library graph, enforced: every library is one folder, and an #include may only point
# down the graph (docs/architecture.md, "The tree"). Bottom-up:
#   access/codec <- access <- runtime <- {store/node, store/master, proxy};
#   access/codec <- store/engine <- {store/node, store/master};  monitor stands alone;
#   access/codec <- gpu;  {access, gpu} <- clients/lib <- clients/e2e <- clients/lab <- clients/cli;
#   clients/e2e <- clients/llamacpp (the llama.cpp bridge) <- clients/cli
# A source file outside a library's folder fails too. RocksDB headers only in store/engine/ and
# store/master/; ZeroMQ never in the codec, the engine, gpu/ or monitor/.
# Usage: check_layout.sh [--graph] [ROOT] (default: the repository); --graph prints the
# folder-level include graph with the number of #include lines on each arrow.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# The library of a path (a source file or an included header): every library is one folder.
module_of() {
    case "$1" in
    access/codec/*) echo codec ;;
    access/*/*) echo other ;;
    access/*) echo access ;;
    runtime/*) echo runtime ;;
    monitor/*) echo monitor ;;
    gpu/*) echo gpu ;;
    store/engine/*) echo engine ;;
    store/node/*) echo node ;;
    store/master/*) echo master ;;
    proxy/*) echo proxy ;;
    clients/lib/*) echo lib ;;
    clients/decoder/*) echo decoder ;;
    clients/e2e/*) echo e2e ;;
    clients/llamacpp/*) echo llamacpp ;;
    clients/lab/*) echo lab ;;
    clients/cli/*) echo cli ;;
    *) echo other ;;
    esac
}

# Bottom-up: each library may include itself and the ones before it that it names.
MODULES="codec access runtime monitor gpu engine node master proxy lib decoder e2e llamacpp lab cli"
allowed() {
    case "$1" in
    codec) echo "codec" ;;
    access) echo "codec access" ;;
    runtime) echo "codec access runtime" ;;
    monitor) echo "monitor" ;;
    gpu) echo "codec gpu" ;;
    engine) echo "codec engine" ;;
    node) echo "codec access runtime monitor engine node" ;;
    master) echo "codec access runtime monitor engine master" ;;
    proxy) echo "codec access runtime monitor proxy" ;;
    lib) echo "codec access gpu lib" ;;
    decoder) echo "codec gpu decoder" ;;
    e2e) echo "codec access runtime monitor gpu proxy lib decoder e2e" ;;
    llamacpp) echo "codec access runtime monitor gpu proxy lib decoder e2e llamacpp" ;;
    lab) echo "codec access runtime monitor gpu proxy lib decoder e2e lab" ;;
    cli) echo "$MODULES" ;;
    *) echo "$MODULES other" ;;
    esac
}

# The folder of each library, for messages and the graph.
folder_of() {
    case "$1" in
    codec) echo access/codec ;;
    engine | node | master) echo "store/$1" ;;
    lib | decoder | e2e | llamacpp | lab | cli) echo "clients/$1" ;;
    *) echo "$1" ;;
    esac
}

# System headers a module may not include: pattern per module.
forbidden_system() {
    case "$1" in
    codec | gpu | monitor) echo 'rocksdb/|czmq\.h|zmq\.h' ;;
    engine) echo 'czmq\.h|zmq\.h' ;;
    access | runtime | node | proxy | lib | decoder | e2e | llamacpp | lab) echo 'rocksdb/' ;;
    *) echo '' ;;
    esac
}

graph=0
if [ "${1:-}" = --graph ]; then
    graph=1
    shift
fi
root=${1:-$root}
cd "$root"
declare -A edges=()

bad=0
dirs=()
for d in store access runtime proxy gpu monitor clients; do
    [ -d "$d" ] && dirs+=("$d")
done
files=$(find "${dirs[@]}" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) |
    sort)
for f in $files; do
    from=$(module_of "$f")
    if [ "$from" = other ]; then
        echo "$f: not in a library's folder (docs/architecture.md names them)" >&2
        bad=$((bad + 1))
        continue
    fi
    ok=" $(allowed "$from") "
    sys=$(forbidden_system "$from")
    n=0
    while IFS= read -r line; do
        n=$((n + 1))
        case "$line" in
        \#include*) ;;
        *) continue ;;
        esac
        if [[ $line =~ ^#include[[:space:]]+\"([^\"]+)\" ]]; then
            to=$(module_of "${BASH_REMATCH[1]}")
            if [[ $to != other && $ok != *" $to "* ]]; then
                echo "$f:$n: $from ($(folder_of "$from")/) may not include ${BASH_REMATCH[1]} ($(folder_of "$to")/)" >&2
                bad=$((bad + 1))
            elif [[ $to != other && $to != "$from" ]]; then
                key="$from $to"
                edges[$key]=$((${edges[$key]:-0} + 1))
            fi
        elif [[ -n $sys && $line =~ ^#include[[:space:]]*\<([^\>]+)\> ]]; then
            if [[ ${BASH_REMATCH[1]} =~ ^($sys) ]]; then
                echo "$f:$n: $from may not include <${BASH_REMATCH[1]}>" >&2
                bad=$((bad + 1))
            fi
        fi
    done <"$f"
done
if [ "$bad" -ne 0 ]; then
    echo "check_layout: $bad file(s) or include(s) break the library graph (docs/architecture.md)" >&2
    exit 1
fi
if [ "$graph" = 1 ]; then
    # The folder-level include graph, bottom-up: FROM -> TO (number of #include lines).
    for m in $MODULES; do
        line=""
        for t in $MODULES; do
            [ -n "${edges["$m $t"]:-}" ] && line+=" $(folder_of "$t")(${edges["$m $t"]})"
        done
        printf '%-16s ->%s\n' "$(folder_of "$m")/" "${line:- (nothing)}"
    done
fi
echo "check_layout: $(echo "$files" | wc -w) files follow the library graph"
