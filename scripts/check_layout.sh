#!/usr/bin/env bash
# The module graph, enforced: fails when an #include crosses it the wrong way
# (docs/architecture.md, "Modules"). Libraries point one way:
#   codec <- access <- {node, master, proxy} <- clients;  engine <- node, master;
#   gpu and monitor stand alone (gpu may read the codec's enums).
# RocksDB headers only in the engine and the Storage Master; ZeroMQ never in the store's
# codec or engine, gpu/ or monitor/. Usage: check_layout.sh [ROOT] (default: the repository).
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

# The module of a path (a source file or an included header).
module_of() {
    case "$1" in
    store/node/*) echo node ;;
    store/master/*) echo master ;;
    store/engine* | store/rocks*) echo engine ;;
    store/*) echo codec ;;
    access/*) echo access ;;
    proxy/*) echo proxy ;;
    gpu/*) echo gpu ;;
    monitor/*) echo monitor ;;
    clients/cli/*) echo cli ;;
    clients/*) echo clients ;;
    *) echo other ;;
    esac
}

# What a module may include, by module.
allowed() {
    case "$1" in
    codec) echo "codec" ;;
    engine) echo "codec engine" ;;
    access) echo "codec access" ;;
    node) echo "codec engine access monitor node" ;;
    master) echo "codec engine access monitor master" ;;
    proxy) echo "codec access monitor proxy" ;;
    gpu) echo "codec gpu" ;;
    monitor) echo "monitor" ;;
    clients) echo "codec access proxy gpu clients" ;;
    cli) echo "codec engine access node master proxy gpu monitor clients cli" ;;
    *) echo "codec engine access node master proxy gpu monitor clients cli other" ;;
    esac
}

# System headers a module may not include: pattern per module.
forbidden_system() {
    case "$1" in
    codec | gpu | monitor) echo 'rocksdb/|czmq\.h|zmq\.h' ;;
    engine) echo 'czmq\.h|zmq\.h' ;;
    access | node | proxy | clients) echo 'rocksdb/' ;;
    *) echo '' ;;
    esac
}

bad=0
dirs=()
for d in store access proxy gpu monitor clients; do
    [ -d "$d" ] && dirs+=("$d")
done
files=$(find "${dirs[@]}" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) |
    sort)
for f in $files; do
    from=$(module_of "$f")
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
                echo "$f:$n: $from may not include ${BASH_REMATCH[1]} ($to)" >&2
                bad=$((bad + 1))
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
    echo "check_layout: $bad include(s) cross the module graph (docs/architecture.md)" >&2
    exit 1
fi
echo "check_layout: $(echo "$files" | wc -w) files follow the module graph"
