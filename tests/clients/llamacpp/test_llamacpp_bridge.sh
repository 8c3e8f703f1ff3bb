#!/usr/bin/env bash
# test_llamacpp_bridge: builds the llama.cpp bridge and its test program against the fixture's
# llama.cpp (BUILD/llama/prefix, made by tests/decoder/fetch_llamacpp.sh: kvedge's build
# declares them outside `all` when no -DKVEDGE_LLAMACPP was given, so they build only here),
# makes the tiny GGUF models (tests/decoder/tiny_llama.py) and the trained pair's
# (models/kjv/llama) and runs it.
# Exit 77 when the fixture skipped (the npm registry could not be reached).
# Usage: test_llamacpp_bridge.sh BUILD_DIR; PYTHON names a python3 with NumPy.
set -euo pipefail
build=$(cd "${1:?usage: test_llamacpp_bridge.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
dest=$build/llama
py=${PYTHON:-python3}
if [ ! -f "$dest/prefix/include/llama.h" ]; then
    echo "test_llamacpp_bridge: no llama.cpp in $dest/prefix (the fixture skipped)" >&2
    exit 77
fi
cmake --build "$build" --target test_llamacpp_bridge -j2 >"$dest/bridge-build.log" 2>&1 || {
    cat "$dest/bridge-build.log" >&2
    exit 1
}
work=$dest/bridge
mkdir -p "$work"
for kind in llama llama3 qwen2; do
    vocab="llama-bpe"
    [ "$kind" = qwen2 ] && vocab=qwen2
    gguf_vocab=$dest/$vocab/ggml-vocab-$vocab.gguf
    "$py" "$here/../../decoder/tiny_llama.py" make "$kind" "$gguf_vocab" \
        "$dest/$vocab/tokenizer.json" "$work/$kind"
    "$py" "$here/../../decoder/tiny_llama.py" gguf "$work/$kind" "$gguf_vocab" "$work/$kind.gguf"
done
# The project's trained pair and the held-out ids (<s> first) of the tokenizer fixture.
models=$here/../../../models/kjv/llama
for size in cloud edge; do
    "$py" "$here/../../decoder/tiny_llama.py" gguf "$models/$size" "$models/tokenizer.json" \
        "$work/kjv-$size.gguf"
done
"$py" -c 'import json, sys; print(" ".join(str(i) for i in json.load(open(sys.argv[1]))["ids"]))' \
    "$here/../../fixtures/tokenizer/kjv_llama_heldout.json" >"$work/kjv-ids.txt"
exec "$build/tests/test_llamacpp_bridge" "$dest/prefix/lib" "$work"
