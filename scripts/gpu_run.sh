#!/bin/bash
# Runs kvedge's GPU tests and benchmarks on a machine with a CUDA device, from a package made by
# scripts/gpu_pack.sh (the machine needs no compiler, no registry and no Debian packages: the
# package carries the programs and their shared libraries; CUDA's runtime and cuBLAS are the
# machine's own). Run from the repository root:
#
#   scripts/gpu_run.sh [setup|tests|bench|all|suite] [LOG_DIR]
#
# setup: only unpack and prepare the libraries (then `. .device/env.sh`);
# tests: every test labelled gpu, the gpu/ unit tests, and the tests whose code takes the device
# path when a device is present; bench: bench_gpu, bench_gpu_decoder, bench_gpu_e2e and
# bench_loader; suite: the whole ctest suite;
# all: tests then bench. Logs go to LOG_DIR (default .device/logs).
set -u
what=${1:-all}
logs=${2:-.device/logs}
root=$(pwd)
mkdir -p "$logs"
if [ -f .device/pkg/kvedge-gpu.tar.xz ]; then
    rm -rf .device/build .device/lib
    tar -C .device -xJf .device/pkg/kvedge-gpu.tar.xz || exit 1
fi
[ -d .device/build ] || { echo "gpu_run: no .device/build: run scripts/gpu_pack.sh first" >&2; exit 2; }
read -r _ src <.device/PACKED
bdir=$(awk '$1 == "build" { print $2 }' .device/PACKED)
# The build's programs name the source tree where they were built (/work/main): point it here.
if [ "$root" != /work/main ]; then
    mkdir -p /work
    [ -e /work/main ] || ln -s "$root" /work/main
fi
case $bdir in
'' | /* | *..* | */*) echo "gpu_run: .device/PACKED names no build directory: $bdir" >&2; exit 2 ;;
esac
rm -rf "${root:?}/${bdir:?}" && ln -s "$root/.device/build" "$root/$bdir"
# Shared libraries: the machine's own where it has them, the package's otherwise.
mkdir -p .device/use
for lib in .device/lib/*; do
    name=$(basename "$lib")
    ldconfig -p | grep -q "^[[:space:]]*$name " || ln -sf "$root/$lib" ".device/use/$name"
done
cudalib=
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib \
         $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13", "lib") for p in nvidia.__path__))' 2>/dev/null); do
    [ -e "$d/libcublas.so.13" ] && { cudalib=$d; break; }
done
export LD_LIBRARY_PATH="$root/.device/use${cudalib:+:$cudalib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "export LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >.device/env.sh
{
    echo "package: $src; cuda libraries: ${cudalib:-not found}"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
} | tee "$logs/device.txt"
missing=$(ldd "$bdir/tests/gpu/test_gpu_ops" | grep 'not found')
[ -z "$missing" ] || { echo "gpu_run: missing libraries: $missing" >&2; exit 1; }

rc=0
run_tests() {
    ctest --test-dir "$bdir" -j4 --timeout 600 --output-on-failure \
        -R '^test_(gpu_dequant|gpu_ops|gpu_adapt|gpu_decoder|pipeline_gpu|dequant|attn|scores|cka|stage|pipeline|layermap|largesmall|adapter|decoder)$' \
        2>&1 | tee "$logs/tests.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
}
run_suite() {
    ctest --test-dir "$bdir" -j8 --timeout 600 --output-on-failure 2>&1 | tee "$logs/suite.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
}
run_bench() {
    "$bdir/bench/bench_gpu" 2>&1 | tee "$logs/bench_gpu.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    "$bdir/bench/bench_gpu_decoder" 2>&1 | tee "$logs/bench_gpu_decoder.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    "$bdir/bench/bench_loader" "$bdir/clients/kvedge" 4096 2>&1 | tee "$logs/bench_loader.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    timeout "${KVEDGE_GPU_E2E_TIMEOUT:-400}" "$bdir/bench/bench_gpu_e2e" --kvedge "$bdir/clients/kvedge" \
        2>&1 | tee "$logs/bench_gpu_e2e.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
}
case $what in
setup) ;; # unpacked; `. .device/env.sh` gives the library path
tests) run_tests ;;
bench) run_bench ;;
suite) run_suite ;;
all) run_tests; run_bench ;;
*) echo "gpu_run: unknown mode $what (setup, tests, bench, suite, all)" >&2; exit 2 ;;
esac
exit $rc
