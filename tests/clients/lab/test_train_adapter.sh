#!/usr/bin/env bash
# scripts/train_adapter.py on both pairs, the Llama family (models/kjv/llama) and OPT
# (models/kjv), shrunk to seconds: a context of 32 and a continuation of 16 tokens, 4 windows,
# 10 steps. For each pair it checks that the script's forward is the C one (its step-0 KL and
# perplexity on its first 2 windows are `kvedge lseval`'s for the least-squares adapter on the
# same 2 documents); that the trained adapter lowers KL(cloud || edge with adapted context) on
# its own windows; that the curve goes to --curve as CSV, every --every steps; that `kvedge
# lseval` loads the file it writes, labels its rows "distilled" beside "least-squares", and, on
# the windows it was trained on, measures a lower KL for it; and that an adapter for other
# models is refused (exit 2). On the Llama pair also: --from cka applies Eq. 16's rule to the
# CKA matrix alone, --from learned hardens its map after half the steps, both write layer map
# files that `kvedge layermap --show` reads and that their adapters fit, and --from rsa without
# --scores is refused. The windows come from the first chapters of models/kjv/heldout.txt only
# because train.txt is not committed; the adapters this test trains are thrown away. Skips (77)
# only where the Python has no PyTorch.
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
head -c 6000 "$src/models/kjv/heldout.txt" >"$tmp/cal.txt"

# close A B TOL: |A - B| <= TOL * max(1, |B|)
close() {
    awk -v a="$1" -v b="$2" -v t="$3" \
        'BEGIN {d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; if (m < 1) m = 1; exit !(d <= t * m)}'
}

# pair NAME CLOUD EDGE LINEAR_ADAPTER [lseval model flags...]
pair() {
    local name=$1 cloud=$2 edge=$3 linear=$4
    shift 4
    local out=$tmp/$name
    mkdir -p "$out"
    echo "== $name: a short training run"
    "$py" "$src/scripts/train_adapter.py" --cloud "$cloud" --edge "$edge" \
        --adapter "$linear" --file "$tmp/cal.txt" --eval-file "$tmp/cal.txt" \
        --out "$out/trained.safetensors" --ctx 32 --cont 16 --train-docs 4 --eval-docs 2 \
        --steps 10 --batch 4 --lr 0.01 --every 5 --curve "$out/curve.csv" >"$out/train.out" 2>&1 ||
        fail "$name: train_adapter.py failed: $(cat "$out/train.out")"
    cat "$out/train.out"
    [ -s "$out/trained.safetensors" ] || fail "$name: no adapter file written"

    echo "== $name: the curve CSV"
    cat "$out/curve.csv"
    [ "$(head -1 "$out/curve.csv")" = "step,train_kl,train_ppl,heldout_kl,heldout_ppl,seconds" ] ||
        fail "$name: the curve's header is $(head -1 "$out/curve.csv")"
    [ "$(tail -n +2 "$out/curve.csv" | cut -d, -f1 | tr '\n' ' ')" = "0 5 10 " ] ||
        fail "$name: the curve's steps are not 0 5 10"
    awk -F, 'NR > 1 && (NF != 6 || $4 == "" || $5 == "") {exit 1}' "$out/curve.csv" ||
        fail "$name: a curve row without its held-out columns"
    local first last
    first=$(awk -F, 'NR == 2 {print $2}' "$out/curve.csv")
    last=$(awk -F, 'END {print $2}' "$out/curve.csv")
    awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < a)}' ||
        fail "$name: the KL on the training windows did not fall: $first -> $last"

    echo "== $name: kvedge lseval loads and measures it"
    "$kv" lseval "$@" --file "$tmp/cal.txt" --adapter "$linear" \
        --adapter "$out/trained.safetensors" --context 32 --continuation 16 --docs 2 -q \
        >"$out/lseval.out" 2>&1 ||
        fail "$name: lseval refused the trained adapter: $(cat "$out/lseval.out")"
    cat "$out/lseval.out"
    local kl_ls ppl_ls kl_tr
    kl_ls=$(awk '$1 == "ce-lslm" && $2 == "least-squares" && $3 == "lossless" {print $7}' \
        "$out/lseval.out")
    ppl_ls=$(awk '$1 == "ce-lslm" && $2 == "least-squares" && $3 == "lossless" {print $4}' \
        "$out/lseval.out")
    kl_tr=$(awk '$1 == "ce-lslm" && $2 == "distilled" && $3 == "lossless" {print $7}' \
        "$out/lseval.out")
    if [ -z "$kl_ls" ] || [ -z "$kl_tr" ]; then
        fail "$name: no rows labeled least-squares and distilled"
    fi
    # The script's forward is the C one: its step 0 (the least-squares adapter) on its first 2
    # windows, lseval's first 2 documents, gives lseval's KL (4 decimals) and perplexity.
    local kl0 ppl0
    kl0=$(awk -F, 'NR == 2 {print $2}' "$out/curve.csv")
    ppl0=$(awk -F, 'NR == 2 {print $3}' "$out/curve.csv")
    close "$kl0" "$kl_ls" 0.0002 ||
        fail "$name: the script's KL $kl0 is not lseval's $kl_ls for the least-squares adapter"
    close "$ppl0" "$ppl_ls" 0.0005 ||
        fail "$name: the script's perplexity $ppl0 is not lseval's $ppl_ls"
    # The same windows (lseval's first 2 documents are the first 2 of the 4 trained on): the C
    # apply path gives the trained adapter a lower KL than the least-squares one it started from.
    awk -v a="$kl_ls" -v b="$kl_tr" 'BEGIN {exit !(b < a)}' ||
        fail "$name: lseval: the trained adapter's KL $kl_tr is not below least squares' $kl_ls"
}

llama=$src/models/kjv/llama
pair llama "$llama/cloud" "$llama/edge" "$llama/ls/adapter-linear.safetensors" \
    --cloud "$llama/cloud" --edge "$llama/edge"
opt=$src/models/kjv
pair opt "$opt/cloud" "$opt/edge" "$opt/ls/adapter-linear.safetensors" \
    --cloud "$opt/cloud/model.safetensors" --edge "$opt/edge/model.safetensors" \
    --tokenizer "$opt"

echo "== llama: maps by one score and a learned map, written as layer map files"
"$kv" --json layermap --cloud "$llama/cloud" --edge "$llama/edge" --file "$tmp/cal.txt" \
    --samples 256 --cloud-id kjv-llama-cloud --edge-id kjv-llama-edge >"$tmp/scores.json" ||
    fail "kvedge layermap --json failed"
for m in cka learned; do
    "$py" "$src/scripts/train_adapter.py" --cloud "$llama/cloud" --edge "$llama/edge" \
        --adapter "$llama/ls/adapter-linear.safetensors" --file "$tmp/cal.txt" \
        --out "$tmp/$m.safetensors" --map-out "$tmp/$m.map" --scores "$tmp/scores.json" \
        --from $m --init lsq --ctx 32 --cont 16 --train-docs 4 --eval-docs 2 --steps 6 \
        --batch 4 --lr 0.01 >"$tmp/$m.out" 2>&1 || fail "--from $m failed: $(cat "$tmp/$m.out")"
    cat "$tmp/$m.out"
    "$kv" layermap --show "$tmp/$m.map" >"$tmp/$m.show" 2>&1 ||
        fail "kvedge layermap --show refused the $m map: $(cat "$tmp/$m.show")"
    "$kv" layermap --show-adapter "$tmp/$m.safetensors" --show "$tmp/$m.map" >"$tmp/$m.fit" 2>&1 ||
        fail "the $m adapter does not fit its map: $(cat "$tmp/$m.fit")"
    grep -q "^fits the map" "$tmp/$m.fit" || fail "no 'fits the map': $(cat "$tmp/$m.fit")"
    grep -q "^fit: distilled: .*init lsq), map $m" "$tmp/$m.fit" ||
        fail "the fit field does not say the map: $(cat "$tmp/$m.fit")"
done
# The cka map is Eq. 16's rule on CKA alone: per edge layer the shallowest cloud layer within
# 0.02 of the row's best CKA (all rows here are above the 0.5 threshold).
want=$("$py" -c '
import json, sys
d = json.loads(open(sys.argv[1]).readline())
print(",".join(str(min(c for c, x in enumerate(r) if x >= max(r) - 0.02)) for r in d["cka"]))
' "$tmp/scores.json")
got=$(awk '$1 == "layer" {printf "%s%s", (n++ ? "," : ""), $3}' "$tmp/cka.map")
[ "$got" = "$want" ] || fail "the cka map is $got, the rule on CKA gives $want"
grep -q "^learned map [0-9,]* after 3 steps" "$tmp/learned.out" ||
    fail "the learned run did not harden after half its steps: $(cat "$tmp/learned.out")"
# Scores of other model ids than the adapter's would make a map file of another pair.
"$kv" --json layermap --cloud "$llama/cloud" --edge "$llama/edge" --file "$tmp/cal.txt" \
    --samples 256 >"$tmp/other.json" || fail "kvedge layermap --json failed"
rc=0
"$py" "$src/scripts/train_adapter.py" --cloud "$llama/cloud" --edge "$llama/edge" \
    --adapter "$llama/ls/adapter-linear.safetensors" --file "$tmp/cal.txt" \
    --out "$tmp/x.safetensors" --from cka --scores "$tmp/other.json" --map-out "$tmp/x.map" \
    --ctx 32 --cont 16 >"$tmp/x.out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "--map-out with another pair's scores: exit $rc, not 2"
grep -q 'run kvedge layermap with --cloud-id' "$tmp/x.out" || fail "no reason: $(cat "$tmp/x.out")"
[ ! -e "$tmp/x.map" ] || fail "a map was written for another pair"
rc=0
"$py" "$src/scripts/train_adapter.py" --cloud "$llama/cloud" --edge "$llama/edge" \
    --adapter "$llama/ls/adapter-linear.safetensors" --file "$tmp/cal.txt" \
    --out "$tmp/x.safetensors" --from rsa --ctx 32 --cont 16 >"$tmp/x.out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "--from rsa without --scores: exit $rc, not 2"
grep -q 'need --scores' "$tmp/x.out" || fail "no reason given: $(cat "$tmp/x.out")"

echo "== an adapter for other models is refused"
for p in "$llama" "$opt"; do
    rc=0
    "$py" "$src/scripts/train_adapter.py" --cloud "$p/edge" --edge "$p/cloud" \
        --adapter "$p/ls/adapter-linear.safetensors" --file "$tmp/cal.txt" \
        --out "$tmp/wrong.safetensors" --ctx 32 --cont 16 >"$tmp/wrong.out" 2>&1 || rc=$?
    [ "$rc" -eq 2 ] || fail "exit $rc for swapped models, not 2: $(cat "$tmp/wrong.out")"
    grep -q 'not these models' "$tmp/wrong.out" || fail "no reason given: $(cat "$tmp/wrong.out")"
    [ ! -e "$tmp/wrong.safetensors" ] || fail "an adapter was written for the wrong models"
done
echo "== models of two families are refused"
rc=0
"$py" "$src/scripts/train_adapter.py" --cloud "$llama/cloud" --edge "$opt/edge" \
    --adapter "$llama/ls/adapter-linear.safetensors" --file "$tmp/cal.txt" \
    --out "$tmp/wrong.safetensors" --ctx 32 --cont 16 >"$tmp/wrong.out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "exit $rc for a Llama cloud and an OPT edge, not 2: $(cat "$tmp/wrong.out")"
grep -q 'different families' "$tmp/wrong.out" || fail "no reason given: $(cat "$tmp/wrong.out")"
echo "PASS"
