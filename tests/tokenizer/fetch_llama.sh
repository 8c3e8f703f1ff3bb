#!/usr/bin/env bash
# The setup step of test_tokenizer_llama: llama.cpp's tokenizer test cases, as the source that
# node-llama-cpp 3.22.1 was built from carries them. npm pack fetches the pinned tarball (its
# sha512 is checked against the value below), its llama/gitRelease.bundle (a git bundle of
# llama.cpp) is fetched into a bare repository under DEST, and for each vocabulary (llama-bpe:
# Llama 3, qwen2: Qwen2, gpt-2: GPT-2) DEST/VOCAB/ gets tokenizer.json (made from models/ggml-vocab-VOCAB.gguf
# by gguf_vocab.py) and the cases, VOCAB.inp and VOCAB.out; DEST/release.json is the package's
# llama/binariesGithubRelease.json, the llama.cpp release its prebuilt libraries (the
# @node-llama-cpp/* packages) were made from. Nothing is committed; cached: does
# nothing when DEST already holds this version's files.
# Exit: 0 installed; 77 the registry cannot be reached (the test skips, saying so); 1 anything
# else (no npm, a tarball whose hash differs, a bundle without the files).
# Usage: fetch_llama.sh DEST
set -euo pipefail
dest=${1:?usage: fetch_llama.sh DEST}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd) # git -C below runs elsewhere
here=$(cd "$(dirname "$0")" && pwd)
pkg=node-llama-cpp
version=3.22.1
integrity=sha512-bltIipuWmc123H7tMIgDGKSsSrhmhlQYeVUC48XTjVW7XGJJiJJyCdlTMzQ/LiWoPkGDpcL4FviDpgw7qfTiDw==
vocabs=(llama-bpe qwen2 gpt-2)
stamp=$dest/installed
want="$pkg@$version $integrity $(cksum <"$here/gguf_vocab.py")"

have_all() {
    for v in "${vocabs[@]}"; do
        for f in tokenizer.json "$v.inp" "$v.out"; do
            [ -s "$dest/$v/$f" ] || return 1
        done
    done
    [ -s "$dest/release.json" ]
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && have_all; then
    echo "fetch_llama: $dest holds llama.cpp's tokenizer cases from $pkg@$version"
    exit 0
fi
for tool in npm git python3; do
    if ! command -v "$tool" >/dev/null; then
        echo "fetch_llama: $tool not found (scripts/setup.sh installs it)" >&2
        exit 1
    fi
done
rm -rf "$dest/pack" "$stamp"
mkdir -p "$dest/pack"
# The tarball only: its dependencies (and their platform packages) are not needed.
if ! npm pack "$pkg@$version" --pack-destination "$dest/pack" --cache "$dest/.npm-cache" \
    --loglevel=error >"$dest/pack/npm.log" 2>&1; then
    if ! npm ping --cache "$dest/.npm-cache" >/dev/null 2>&1; then
        echo "fetch_llama: the npm registry cannot be reached: llama.cpp comparisons skipped" >&2
        exit 77
    fi
    cat "$dest/pack/npm.log" >&2
    echo "fetch_llama: npm pack $pkg@$version failed" >&2
    exit 1
fi
tgz=$dest/pack/$pkg-$version.tgz
got=sha512-$(python3 -c 'import base64, hashlib, sys
print(base64.b64encode(hashlib.sha512(open(sys.argv[1], "rb").read()).digest()).decode())' "$tgz")
if [ "$got" != "$integrity" ]; then
    echo "fetch_llama: $tgz: integrity $got, expected $integrity" >&2
    exit 1
fi
tar -xzf "$tgz" -C "$dest/pack" package/llama/gitRelease.bundle \
    package/llama/binariesGithubRelease.json
cp "$dest/pack/package/llama/binariesGithubRelease.json" "$dest/release.json"
repo=$dest/llama.cpp.git
rm -rf "$repo"
git init -q --bare "$repo"
git -C "$repo" fetch -q "$dest/pack/package/llama/gitRelease.bundle" '+HEAD:refs/heads/release'
for v in "${vocabs[@]}"; do
    mkdir -p "$dest/$v"
    for f in gguf gguf.inp gguf.out; do
        git -C "$repo" show "release:models/ggml-vocab-$v.$f" >"$dest/$v/ggml-vocab-$v.$f"
    done
    mv "$dest/$v/ggml-vocab-$v.gguf.inp" "$dest/$v/$v.inp"
    mv "$dest/$v/ggml-vocab-$v.gguf.out" "$dest/$v/$v.out"
    python3 "$here/gguf_vocab.py" "$dest/$v/ggml-vocab-$v.gguf" "$dest/$v/tokenizer.json"
done
rm -rf "$dest/pack"
echo "$want" >"$stamp"
echo "fetch_llama: llama.cpp $(git -C "$repo" rev-parse --short release) from $pkg@$version: cases in $dest"
