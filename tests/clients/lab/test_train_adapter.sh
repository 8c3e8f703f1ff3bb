#!/usr/bin/env bash
# scripts/train_adapter.py on the Llama-family pair (models/kjv/llama), shrunk to seconds: a
# context of 32 and a continuation of 16 tokens, 4 windows, 10 steps. Checks that the trained
# adapter lowers KL(cloud || edge with adapted context) on its own windows; that `kvedge
# lseval` loads the file it writes and, on the windows it was trained on, measures a lower KL
# for it than for the least-squares adapter it started from (the C apply path agrees with the
# script's); and that an adapter for other models is refused (exit 2). The windows come from
# the first chapters of models/kjv/heldout.txt only because train.txt is not committed; the
# adapter this test trains is thrown away.
# Skips (77) only where the Python has no PyTorch.
# Usage: test_train_adapter.sh KVEDGE_BINARY SOURCE_DIR PYTHON3
set -euo pipefail
kv=${1:?usage: test_train_adapter.sh KVEDGE_BINARY SOURCE_DIR PYTHON3}
src=${2:?usage: test_train_adapter.sh KVEDGE_BINARY SOURCE_DIR PYTHON3}
py=${3:-python3}

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

if ! "$py" -c 'import torch' 2>/dev/null; then
    echo "SKIP: $py has no PyTorch"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvedge-train-adapter.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pair=$src/models/kjv/llama
head -c 6000 "$src/models/kjv/heldout.txt" >"$tmp/cal.txt"

echo "== a short training run"
"$py" "$src/scripts/train_adapter.py" --cloud "$pair/cloud" --edge "$pair/edge" \
    --adapter "$pair/ls/adapter-linear.safetensors" --file "$tmp/cal.txt" \
    --out "$tmp/trained.safetensors" --ctx 32 --cont 16 --train-docs 4 --eval-docs 4 \
    --steps 10 --batch 4 --lr 0.01 --evals 2 >"$tmp/train.out" 2>&1 ||
    fail "train_adapter.py failed: $(cat "$tmp/train.out")"
cat "$tmp/train.out"
first=$(awk '$1 == "curve:" && $2 ~ /^[0-9]+$/ {print $3; exit}' "$tmp/train.out")
last=$(awk '$1 == "curve:" && $2 ~ /^[0-9]+$/ {v = $3} END {print v}' "$tmp/train.out")
[ -n "$first" ] && [ -n "$last" ] || fail "no curve in the output"
awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < a)}' ||
    fail "the KL on the training windows did not fall: $first -> $last"
[ -s "$tmp/trained.safetensors" ] || fail "no adapter file written"

echo "== kvedge lseval loads and measures it"
"$kv" lseval --cloud "$pair/cloud" --edge "$pair/edge" --file "$tmp/cal.txt" \
    --adapter "$pair/ls/adapter-linear.safetensors" --adapter "$tmp/trained.safetensors" \
    --context 32 --continuation 16 --docs 2 -q \
    >"$tmp/lseval.out" 2>&1 || fail "lseval refused the trained adapter: $(cat "$tmp/lseval.out")"
cat "$tmp/lseval.out"
# The same windows (lseval's first 2 documents are the first 2 of the 4 trained on): the C
# apply path gives the trained adapter a lower KL than the least-squares one it started from.
kl_ls=$(awk '$1 == "ce-lslm" && $2 == "adapter-linear" && $3 == "lossless" {print $7}' \
    "$tmp/lseval.out")
kl_tr=$(awk '$1 == "ce-lslm" && $2 == "trained" && $3 == "lossless" {print $7}' "$tmp/lseval.out")
[ -n "$kl_ls" ] && [ -n "$kl_tr" ] || fail "no rows for both adapters"
awk -v a="$kl_ls" -v b="$kl_tr" 'BEGIN {exit !(b < a)}' ||
    fail "lseval: the trained adapter's KL $kl_tr is not below least squares' $kl_ls"

echo "== an adapter for other models is refused"
rc=0
"$py" "$src/scripts/train_adapter.py" --cloud "$pair/edge" --edge "$pair/cloud" \
    --adapter "$pair/ls/adapter-linear.safetensors" --file "$tmp/cal.txt" \
    --out "$tmp/wrong.safetensors" --ctx 32 --cont 16 >"$tmp/wrong.out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "exit $rc for swapped models, not 2: $(cat "$tmp/wrong.out")"
grep -q 'not these models' "$tmp/wrong.out" || fail "no reason given: $(cat "$tmp/wrong.out")"
[ ! -e "$tmp/wrong.safetensors" ] || fail "an adapter was written for the wrong models"
echo "PASS"
