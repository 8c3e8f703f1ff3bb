#!/usr/bin/env bash
# Runs the benchmarks of a build and prints their markdown tables (what `make bench` runs).
# Usage: scripts/bench.sh [BUILD_DIR]; KVEDGE_BENCH_DIR picks where the engine and fetch
# benches make their temp dirs (default /tmp). Every figure is a median compared with a peer
# from the same run. bench_fetch (built when hiredis is found) also needs redis-server and
# iperf3 (scripts/setup.sh installs them); it is skipped with a note when not built.
set -euo pipefail
BUILD=${1:-build}

for b in bench_codec bench_engine; do
    if [ ! -x "$BUILD/bench/$b" ]; then
        echo "bench.sh: $BUILD/bench/$b is not built (configure with -DKVEDGE_BENCH=ON)" >&2
        exit 1
    fi
done

echo "## kvedge benchmarks: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores"
echo
"$BUILD/bench/bench_codec"
echo
"$BUILD/bench/bench_engine" ${KVEDGE_BENCH_DIR:+--dir "$KVEDGE_BENCH_DIR"}
echo
if [ -x "$BUILD/bench/bench_fetch" ]; then
    "$BUILD/bench/bench_fetch" ${KVEDGE_BENCH_DIR:+--dir "$KVEDGE_BENCH_DIR"}
else
    echo "bench.sh: $BUILD/bench/bench_fetch is not built (needs hiredis); skipped" >&2
fi
echo
"$BUILD/bench/bench_pipeline" "$BUILD/clients/kvedge"
echo
"$BUILD/bench/bench_proxy" "$BUILD/clients/kvedge"
