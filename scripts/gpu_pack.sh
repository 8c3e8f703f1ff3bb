#!/bin/sh
# Packs a CUDA build of kvedge for a GPU machine that has no package registry: the build's
# test and benchmark programs (debug info stripped), the CTest files, the kvedge CLI and
# libkvedge, and every shared library they load except glibc's and CUDA's, into .device/
# (ignored by git). scripts/gpu_run.sh, run from the repository root on that machine, uses it.
#
#   scripts/gpu_pack.sh [BUILD_DIR]      (default: build, configured with CUDA)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
cd "$root"
# The programs name their build directory (the kvedge binary, fixtures): gpu_run.sh recreates it
# at the same place in the repository, so it must be a directory directly in the repository.
case $build in
'' | /* | *..* | */*) echo "gpu_pack: give a build directory directly in the repository (e.g. build)" >&2; exit 2 ;;
esac
[ -f "$build/CMakeCache.txt" ] || { echo "gpu_pack: $build is not a CMake build directory" >&2; exit 2; }
find "$build/gpu" -name '*.cu.o' | grep -q . ||
    { echo "gpu_pack: $build was configured without CUDA (no gpu/*.cu.o)" >&2; exit 2; }
cmake --build "$build" -j"$(nproc)"
rm -rf .device/build .device/lib .device/pkg
mkdir -p .device/build .device/lib
# Programs, shared objects (symlinks kept) and the CTest files that name them.
find "$build" -path '*/CMakeFiles' -prune -o \( -type f -o -type l \) \
    \( -name 'test_*' -o -name 'bench_*' -o -name 'kvedge' -o -name 'libkvedge.so*' \
       -o -name 'abi_layout' -o -name 'fuzz_*' -o -name 'CTestTestfile.cmake' \) -print |
    while read -r f; do
        rel=${f#"$build"/}
        mkdir -p ".device/build/$(dirname "$rel")"
        cp -a "$f" ".device/build/$rel"
        [ -L "$f" ] || [ "${f##*.}" = cmake ] || strip --strip-debug ".device/build/$rel"
    done
# Shared libraries the programs load, but for the C library, the compiler's runtime and CUDA's
# (the GPU machine's own are used).
find .device/build -type f -perm -u+x -exec ldd {} + 2>/dev/null |
    awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcublasLt)\.so' |
    while read -r lib; do cp -L "$lib" .device/lib/; done
printf 'source %s\nbuild %s\n' "$(git rev-parse --short HEAD)$(git diff --quiet || echo +)" "$build" \
    >.device/PACKED
# One compressed file travels (the device tool's working-tree limit is 64 MiB).
mkdir -p .device/pkg
tar -C .device -cf - build lib PACKED | xz -T0 -6 >.device/pkg/kvedge-gpu.tar.xz
du -sh .device/build .device/lib .device/pkg/kvedge-gpu.tar.xz
