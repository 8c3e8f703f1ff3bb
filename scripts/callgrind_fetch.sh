#!/usr/bin/env bash
# Instructions the edge client spends per fetched MB, from blocks on the socket to K/V resident
# in the decoder's layout (issue 16), counted with valgrind --tool=callgrind: repeatable where
# wall-clock times on this machine are not.
#
# Usage: scripts/callgrind_fetch.sh [BUILD_DIR] [-- BENCH_ARGS...]
#
#   BUILD_DIR   a configured and built tree (default: build) holding bench/bench_fetch_cost and
#               clients/kvedge:
#                 cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVEDGE_CUDA=OFF
#                 cmake --build build --target kvedge bench_fetch_cost
#   BENCH_ARGS  passed on to bench_fetch_cost (e.g. --ring 4, --copy-into-session)
#
# Environment: SCHEMES (default "int8 lossless"), REPS counted fetches per scheme (3), TOKENS
# context tokens (1024), TOP functions listed (10), OUT where the callgrind files, logs and
# summary.md go (default BUILD_DIR/callgrind-fetch). VECTOR_MEMCPY=1 runs the client with
# GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=4294967295, so glibc's memcpy copies large
# buffers with vector loads and stores instead of `rep movsb`: valgrind counts every iteration
# of `rep movsb` as an instruction (1 Ir per byte copied), which makes large copies look far
# dearer than they are next to computed work; run both to see how much of a count is that.
#
# What is counted: bench_fetch_cost (the client) runs under callgrind with --instr-atstart=no and
# switches instrumentation on around its REPS fetches only (CALLGRIND_START/STOP_INSTRUMENTATION),
# so the node's start, the put of the context and the set-up are not counted; every thread of
# the client is (--separate-threads=no: the caller, the client's I/O thread, ZeroMQ's threads and
# the pipeline's loader). The store node is exec'd by the client and runs natively (valgrind
# does not trace children). Workload: opt-125m shape (12 layers x 12 KV heads x 64), TOKENS
# tokens in 256-token chunks, int8 or lossless fp16 blocks, pipelined loader (GET_LAYER streams
# from a local node on ipc://, CPU path, ring of 2) into fp32 contiguous host destinations.
# About 30 s per scheme on a 2-core machine.
set -euo pipefail
# (No `| head` in the pipelines below: a reader that exits early gets the writer a SIGPIPE,
# which pipefail turns into a failure; awk 'NR <= n' reads to the end.)

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

build=build
bench_args=()
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) usage 0 ;;
    --)
        shift
        bench_args=("$@")
        break
        ;;
    -*)
        echo "callgrind_fetch.sh: unknown option $1" >&2
        usage 2
        ;;
    *)
        build=$1
        shift
        ;;
    esac
done

schemes=${SCHEMES:-int8 lossless}
reps=${REPS:-3}
tokens=${TOKENS:-1024}
top=${TOP:-10}
out=${OUT:-$build/callgrind-fetch}
run_env=()
memcpy_mode="glibc default (rep movsb for mid-sized copies: 1 Ir per byte; non-temporal vector stores above glibc's threshold)"
if [ "${VECTOR_MEMCPY:-0}" = 1 ]; then
    run_env=(env GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=4294967295)
    memcpy_mode="vector loop (GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=4294967295)"
fi

for tool in valgrind callgrind_annotate; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "callgrind_fetch.sh: $tool not found; install valgrind (apt-get install -y valgrind)" >&2
        exit 1
    fi
done
bench=$build/bench/bench_fetch_cost
kvedge=$build/clients/kvedge
for f in "$bench" "$kvedge"; do
    if [ ! -x "$f" ]; then
        echo "callgrind_fetch.sh: $f not found; build it first:" >&2
        echo "  cmake --build $build --target kvedge bench_fetch_cost" >&2
        exit 1
    fi
done
mkdir -p "$out"
summary=$out/summary.md
: >"$summary"
: >"$out/sections.md"

# Cost per function name from a callgrind_annotate listing ($1), top $2, as table rows with
# the share of $3. callgrind_annotate splits a function by the source file of its inlined code
# ("file:function [object]", the object named on some rows only): self cost ($4 = sum) adds
# the parts; inclusive cost ($4 = max) takes the largest, the row of the function's own file,
# which holds the rest. Thread start-up frames (start_thread, clone) and recursion levels
# (name'2) are left out of the inclusive list.
by_function() {
    awk -v mode="$4" '
        /^-+$/ { dashes++; next }
        dashes == 6 && NF && $0 !~ /PROGRAM TOTALS/ {
            ir = $1; gsub(",", "", ir); ir += 0
            rest = $0; sub(/^ *[0-9,]+ +\([ 0-9.]+%\) +/, "", rest)
            obj = ""
            if (match(rest, / \[[^]]*\]$/)) {
                obj = substr(rest, RSTART + 2, RLENGTH - 3)
                rest = substr(rest, 1, RSTART - 1)
            }
            fn = rest; sub(/^.*:/, "", fn); sub(/^.*\//, "", obj)
            if (mode == "max" && (fn ~ /\047[0-9]+$/ || fn ~ /^(start_thread|clone|clone3)$/))
                next
            if (obj != "") lib[fn] = obj
            if (mode == "sum") cost[fn] += ir
            else if (ir > cost[fn]) cost[fn] = ir
        }
        END { for (k in cost) printf "%d\t%s%s\n", cost[k], k, (k in lib) ? " (" lib[k] ")" : "" }' "$1" |
        sort -t $'\t' -k1,1nr | awk -v n="$2" 'NR <= n' |
        awk -F '\t' -v total="$3" '{ printf "| %s | %.0f | %.1f %% |\n", $2, $1, 100 * $1 / total }'
}

# Self cost summed per object (the program, libc, libzmq, ...), from a self listing ($1), with
# the share of $2. Rows of inlined code name no object: they count for the function's object.
by_object() {
    awk '
        /^-+$/ { dashes++; next }
        dashes == 6 && NF && $0 !~ /PROGRAM TOTALS/ {
            ir = $1; gsub(",", "", ir); ir += 0
            rest = $0; sub(/^ *[0-9,]+ +\([ 0-9.]+%\) +/, "", rest)
            obj = ""
            if (match(rest, / \[[^]]*\]$/)) {
                obj = substr(rest, RSTART + 2, RLENGTH - 3)
                rest = substr(rest, 1, RSTART - 1)
            }
            fn = rest; sub(/^.*:/, "", fn); sub(/^.*\//, "", obj)
            if (obj != "") lib[fn] = obj
            cost[fn] += ir
        }
        END { for (k in cost) by[(k in lib) ? lib[k] : "?"] += cost[k]
              for (o in by) printf "%d\t%s\n", by[o], o }' "$1" |
        sort -t $'\t' -k1,1nr |
        awk -F '\t' -v total="$2" '{ printf "| %s | %.0f | %.1f %% |\n", $2, $1, 100 * $1 / total }'
}

# Callers of glibc's memcpy and what their calls cost, from a caller tree ($1), with the share
# of $2 (top 5).
memcpy_callers() {
    awk '
        /^ *$/ { n = 0; next }
        / < / { line[++n] = $0; next }
        /\* .*:__memc?py/ { for (i = 1; i <= n; i++) print line[i]; n = 0; next }
        { n = 0 }' "$1" |
        awk '{ ir = $1; gsub(",", "", ir); rest = $0; sub(/^.*< /, "", rest)
               sub(/ \[[^]]*\]$/, "", rest); calls = rest; sub(/^.* \(/, "", calls); sub(/x\)$/, "", calls); gsub(",", "", calls)
               fn = rest; sub(/ \([0-9,]+x\)$/, "", fn); sub(/^.*:/, "", fn)
               c[fn] += ir; k[fn] += calls } END { for (f in c) printf "%d\t%s\t%s\n", c[f], f, k[f] }' |
        sort -t $'\t' -k1,1nr | awk 'NR <= 5' |
        awk -F '\t' -v total="$2" '{ printf "| %s | %s | %.0f | %.1f %% |\n", $2, $3, $1, 100 * $1 / total }'
}

{
    echo "| scheme | counted fetches | wire MB / fetch | fp32 MB resident / fetch | Ir / fetch | Ir / wire MB | Ir / resident (fp32) MB | Ir / fp16 MB of context | Ir / wire byte |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
} >"$out/table.md"

for scheme in $schemes; do
    cg=$out/callgrind.out.$scheme
    log=$out/$scheme.log
    echo "callgrind_fetch.sh: $scheme: valgrind --tool=callgrind ... (log: $log)" >&2
    rm -f "$cg"
    ${run_env[@]+"${run_env[@]}"} valgrind --tool=callgrind --instr-atstart=no --separate-threads=no --trace-children=no \
        --callgrind-out-file="$cg" \
        "$bench" "$kvedge" --scheme "$scheme" --reps "$reps" --tokens "$tokens" \
        ${bench_args[@]+"${bench_args[@]}"} >"$log" 2>"$out/$scheme.valgrind.log" || {
        echo "callgrind_fetch.sh: bench_fetch_cost failed for $scheme; see $log and" \
            "$out/$scheme.valgrind.log" >&2
        cat "$log" "$out/$scheme.valgrind.log" >&2
        exit 1
    }
    line=$(grep '^fetch_cost:' "$log") || {
        echo "callgrind_fetch.sh: no fetch_cost line in $log" >&2
        exit 1
    }
    field() { echo "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
    wire=$(field wire_bytes)
    resident=$(field resident_bytes)
    fp16=$(field fp16_bytes)
    header=$(field callgrind_header)
    if [ "$header" != 1 ]; then
        echo "callgrind_fetch.sh: bench_fetch_cost was built without valgrind/callgrind.h, so" \
            "it cannot mark the fetch; install valgrind and rebuild it" >&2
        exit 1
    fi
    # "totals:" is what was counted; "summary:" can read 0 when instrumentation ends switched off.
    total=$(awk '/^(summary|totals):/ && $2 > m { m = $2 } END { print m + 0 }' "$cg")
    if [ -z "$total" ] || [ "$total" -eq 0 ]; then
        echo "callgrind_fetch.sh: no instructions counted in $cg" >&2
        exit 1
    fi
    awk -v s="$scheme" -v r="$reps" -v w="$wire" -v res="$resident" -v h="$fp16" -v t="$total" \
        'BEGIN { f = t / r; printf "| %s | %d | %.2f | %.2f | %.0f | %.0f | %.0f | %.0f | %.2f |\n",
                 s, r, w / 1e6, res / 1e6, f, f / (w / 1e6), f / (res / 1e6), f / (h / 1e6), f / w }' \
        >>"$out/table.md"

    callgrind_annotate --auto=no --inclusive=yes --threshold=100 "$cg" >"$out/$scheme.inclusive.txt" 2>/dev/null
    callgrind_annotate --auto=no --threshold=100 "$cg" >"$out/$scheme.self.txt" 2>/dev/null
    callgrind_annotate --auto=no --tree=caller --threshold=100 "$cg" >"$out/$scheme.callers.txt" \
        2>/dev/null
    {
        echo
        echo "#### $scheme: top $top functions by self cost"
        echo
        echo "| function (object) | Ir self, $reps fetches | share of counted Ir |"
        echo "|---|---:|---:|"
        by_function "$out/$scheme.self.txt" "$top" "$total" sum
        echo
        echo "#### $scheme: top $top functions by inclusive cost"
        echo
        echo "| function (object) | Ir inclusive, $reps fetches | share of counted Ir |"
        echo "|---|---:|---:|"
        by_function "$out/$scheme.inclusive.txt" "$top" "$total" max
        echo
        echo "#### $scheme: self cost per object"
        echo
        echo "| object | Ir self, $reps fetches | share of counted Ir |"
        echo "|---|---:|---:|"
        by_object "$out/$scheme.self.txt" "$total"
        echo
        echo "#### $scheme: memcpy by caller (valgrind counts \`rep movsb\` per byte)"
        echo
        echo "| caller | calls, $reps fetches | Ir in memcpy | share of counted Ir |"
        echo "|---|---:|---:|---:|"
        memcpy_callers "$out/$scheme.callers.txt" "$total"
    } >>"$out/sections.md"
done

{
    echo "Workload: $(grep -m 1 ' shape (' "$out/${schemes%% *}.log" |
        sed -E -e 's/(int8|lossless fp16) blocks/blocks of one scheme per run ('"$schemes"')/' \
            -e 's/: [0-9.]+ MB put;/;/')"
    echo
    echo "memcpy: $memcpy_mode. Bench arguments: --reps $reps --tokens $tokens ${bench_args[*]+${bench_args[*]}}"
    echo
    cat "$out/table.md"
    cat "$out/sections.md"
} >"$summary"
rm -f "$out/sections.md"
cat "$summary"
echo >&2
echo "callgrind_fetch.sh: summary in $summary; callgrind files in $out (callgrind_annotate FILE)" >&2
