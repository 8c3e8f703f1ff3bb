#!/usr/bin/env bash
# Runs the benchmarks of a build and prints their markdown tables (what `make bench` runs).
# Usage: scripts/bench.sh [BUILD_DIR]; KVEDGE_BENCH_DIR picks where the engine and fetch
# benches make their temp dirs (default /tmp). Every figure is a median compared with a peer
# from the same run. bench_fetch (built when hiredis is found) also needs redis-server and
# iperf3 (scripts/setup.sh installs them); it is skipped with a note when not built.
# bench_e2e (end to end, about 10 minutes) writes its data files to KVEDGE_BENCH_E2E_OUT
# (default BUILD_DIR/bench/e2e) and takes extra flags from KVEDGE_BENCH_E2E_ARGS (e.g.
# --quick); gnuplot (Debian: gnuplot-nox) then draws them as KVEDGE_BENCH_IMG/e2e_*.png
# (default docs/img).
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

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
"$BUILD/bench/bench_monitor"
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
echo
E2E_OUT=${KVEDGE_BENCH_E2E_OUT:-$BUILD/bench/e2e}
IMG=${KVEDGE_BENCH_IMG:-$ROOT/docs/img}
# shellcheck disable=SC2086 # KVEDGE_BENCH_E2E_ARGS is a list of flags
"$BUILD/bench/bench_e2e" --kvedge "$BUILD/clients/kvedge" --out "$E2E_OUT" \
    ${KVEDGE_BENCH_E2E_ARGS:-}
if command -v gnuplot > /dev/null; then
    mkdir -p "$IMG"
    gnuplot -e "data='$E2E_OUT'; img='$IMG'" "$ROOT/scripts/plot_e2e.gp"
    echo
    echo "Plots of the experiments that ran: $IMG/e2e_{table2,poisson,sweep}.png"
else
    echo "bench.sh: gnuplot not found (apt-get install gnuplot-nox); plots skipped" >&2
fi
