#!/usr/bin/env bash
# The setup step of test_decoder_llamacpp: llama.cpp's prebuilt CPU libraries and a program over
# its C API that prints logits (tests/decoder/llama_logits.c), in the build directory.
# tests/tokenizer/fetch_llama.sh first fetches node-llama-cpp 3.22.1 (sha512 checked) and the
# llama.cpp source it carries (a git bundle, into DEST/llama.cpp.git); then npm ci installs
# @node-llama-cpp/linux-x64 from tests/decoder/llamacpp/package-lock.json (a lock naming only
# the platform package: a lock of the whole node-llama-cpp fails on its other platforms'
# packages), the headers (include/llama.h, ggml/include/*.h) are read from the bundle, the
# libraries' llama.cpp release is checked against the one the bundle is of, and llama_logits
# is compiled against them. Nothing is committed; cached.
# Exit: 0 ready; 77 the registry cannot be reached (the test skips, saying so); 1 anything else.
# Usage: fetch_llamacpp.sh DEST
set -euo pipefail
dest=${1:?usage: fetch_llamacpp.sh DEST}
here=$(cd "$(dirname "$0")" && pwd)
"$here/../tokenizer/fetch_llama.sh" "$dest" # exits 77 itself when the registry is unreachable
dest=$(cd "$dest" && pwd)
bins=$dest/bins/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
stamp=$dest/bins/installed
# An install-shaped view of the same files for the llama.cpp bridge (clients/llamacpp/, built
# at test time by tests/clients/llamacpp/build_bridge.sh): prefix/include (llama.h, the ggml
# headers), prefix/lib (links to every library and backend, with libllama.so / libggml.so).
make_prefix() {
    rm -rf "$dest/prefix"
    mkdir -p "$dest/prefix/include" "$dest/prefix/lib"
    cp "$dest/include/include/llama.h" "$dest"/include/ggml/include/*.h "$dest/prefix/include/"
    for f in "$bins"/*.so; do ln -s "$f" "$dest/prefix/lib/$(basename "$f")"; done
    ln -s libllama.v0.5.0.so "$dest/prefix/lib/libllama.so"
    ln -s libggml.v0.5.0.so "$dest/prefix/lib/libggml.so"
}
want="$(cksum <"$here/llamacpp/package-lock.json") $(cksum <"$here/llama_logits.c")"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$dest/llama_logits" ]; then
    make_prefix
    echo "fetch_llamacpp: $dest/llama_logits over $bins"
    exit 0
fi
for tool in npm cc; do
    if ! command -v "$tool" >/dev/null; then
        echo "fetch_llamacpp: $tool not found (scripts/setup.sh installs it)" >&2
        exit 1
    fi
done
rm -rf "$dest/bins" "$dest/include"
mkdir -p "$dest/bins" "$dest/include"
cp "$here/llamacpp/package.json" "$here/llamacpp/package-lock.json" "$dest/bins/"
if ! (cd "$dest/bins" && npm ci --cache "$dest/.npm-cache" --ignore-scripts --no-audit --no-fund \
    --loglevel=error) >"$dest/bins/npm.log" 2>&1; then
    if ! npm ping --cache "$dest/.npm-cache" >/dev/null 2>&1; then
        echo "fetch_llamacpp: the npm registry cannot be reached: llama.cpp comparisons skipped" >&2
        exit 77
    fi
    cat "$dest/bins/npm.log" >&2
    echo "fetch_llamacpp: npm ci of @node-llama-cpp/linux-x64 failed" >&2
    exit 1
fi
# The libraries and the source must be the same llama.cpp: the build metadata of the one and
# node-llama-cpp's binariesGithubRelease.json of the other name the release.
built=$(python3 -c 'import json, sys
print(json.load(open(sys.argv[1]))["buildOptions"]["llamaCpp"]["release"])' "$bins/_nlcBuildMetadata.json")
source=$(python3 -c 'import json, sys
print(json.load(open(sys.argv[1]))["release"])' "$dest/release.json")
if [ "$built" != "$source" ]; then
    echo "fetch_llamacpp: libraries built from llama.cpp $built, headers from $source" >&2
    exit 1
fi
git -C "$dest/llama.cpp.git" archive release include ggml/include | tar -x -C "$dest/include"
cc -std=gnu11 -O1 -Wall -Werror -I"$dest/include/include" -I"$dest/include/ggml/include" \
    -o "$dest/llama_logits" "$here/llama_logits.c" -L"$bins" -l:libllama.v0.5.0.so \
    -l:libggml.v0.5.0.so -l:libggml-base.so -Wl,-rpath,"$bins"
make_prefix
echo "$want" >"$stamp"
echo "fetch_llamacpp: llama.cpp $built ($(git -C "$dest/llama.cpp.git" rev-parse --short release)):" \
    "$dest/llama_logits"
