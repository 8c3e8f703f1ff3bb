#!/usr/bin/env bash
# `kvedge prefill / decode --engine llama.cpp --gguf FILE` against a store node on loopback, with
# tiny random Llama and Qwen2 models (tests/decoder/tiny_llama.py, GGUF F32 and the Hugging Face
# folder of the same weights) and the fixture's llama.cpp:
#  - llama.cpp prefills and exports, llama.cpp imports and decodes: the greedy tokens of llama.cpp
#    computing context + prompt alone (llama_logits), with an F32 and an F16 cache;
#  - across engines: the reference decoder decodes the context llama.cpp exported, llama.cpp the
#    one the reference decoder prefilled, both with the tokens of each engine alone;
#  - a context nobody stored: llama.cpp prefills it (the same tokens);
#  - the project's trained cloud model (models/kjv/llama/cloud) on a 256-token held-out context:
#    llama.cpp over its own exported context, the reference decoder over it, llama.cpp over the
#    reference decoder's, all with the greedy tokens of each engine alone;
#  - prefill --layers: a context stored without one layer, which llama.cpp then prefills whole
#    (the same tokens);
#  - refusals: a GGUF of other rotary settings than the stored context's, --engine llama.cpp
#    without --gguf or --model-id, --weights with it, a bad --layers, --mapped-only, a
#    quantized --llama-cache.
# Usage: test_cli_llamacpp.sh BUILD_DIR KVEDGE KVEDGE_LLAMACPP TARGET PYTHON3: KVEDGE the
# reference command, KVEDGE_LLAMACPP the command with --engine llama.cpp (the same binary when
# the build has -DKVEDGE_LLAMACPP), TARGET its CMake target, built here once the fixture has
# fetched llama.cpp. Exit 77 when the fixture skipped.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../../common/wait.sh
. "$(dirname "$0")/../../common/wait.sh"
build=$(cd "${1:?usage: test_cli_llamacpp.sh BUILD_DIR KVEDGE KVEDGE_LLAMACPP TARGET PYTHON3}" && pwd)
kv=${2:?}
kl=${3:?}
target=${4:?}
py=${5:-python3}
here=$(cd "$(dirname "$0")" && pwd)
tiny=$here/../../decoder/tiny_llama.py
llama=$build/llama

fail() {
    echo "FAIL: $*" >&2
    exit 1
}
step() { echo "== $*"; }

if [ ! -f "$llama/prefix/include/llama.h" ]; then
    echo "SKIP: no llama.cpp in $llama/prefix (the fixture skipped)"
    exit 77
fi
"$py" -c 'import numpy' 2>/dev/null || fail "$py has no NumPy (tiny_llama.py needs it)"
cmake --build "$build" --target "$target" -j2 >"$llama/cli-build.log" 2>&1 || {
    cat "$llama/cli-build.log" >&2
    fail "cannot build $target"
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvedge-cli-llamacpp.XXXXXX")
pid=
cleanup() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

step "tiny models"
for kind in llama qwen2; do
    vocab="llama-bpe"
    [ "$kind" = qwen2 ] && vocab=qwen2
    "$py" "$tiny" make "$kind" "$llama/$vocab/ggml-vocab-$vocab.gguf" \
        "$llama/$vocab/tokenizer.json" "$tmp/$kind" >/dev/null
    "$py" "$tiny" gguf "$tmp/$kind" "$llama/$vocab/ggml-vocab-$vocab.gguf" "$tmp/$kind.gguf"
done
ctx=$("$py" -c 'import random; r = random.Random(1); print(",".join(str(r.randrange(100000)) for _ in range(40)))')
prompt=$("$py" -c 'import random; r = random.Random(2); print(",".join(str(r.randrange(100000)) for _ in range(5)))')

# What llama.cpp gives computing context + prompt itself: greedy tokens (8, or GEN).
# alone GGUF [CTX PROMPT GEN]
alone() {
    local ids
    IFS=, read -r -a ids <<<"${2:-$ctx},${3:-$prompt}"
    "$llama/llama_logits" "$llama/prefix/lib" "$1" "$tmp/alone.bin" "${4:-8}" "${ids[@]}"
    "$py" - "$tmp/alone.bin" <<'PY'
import sys
import numpy as np
d = open(sys.argv[1], "rb").read()
vocab, n = np.frombuffer(d[:8], "<i4")
print(" ".join(str(t) for t in np.frombuffer(d[8 + 4 * n * vocab:], "<i4")))
PY
}
tokens() { sed -n 's/^tokens: //p; s/^generated [0-9]* tokens: //p' "$1"; }

step "store node"
ep=ipc://$tmp/node.sock
"$kv" --data "$tmp/node" store --role cloud --insecure --bind "$ep" --log-level error \
    --metrics off >"$tmp/node.out" 2>"$tmp/node.err" &
pid=$!
listening_or_gone() { grep -q '^listening ' "$tmp/node.out" || ! kill -0 "$pid" 2>/dev/null; }
wait_until "$KT_WAIT_S" listening_or_gone || true
grep -q '^listening ' "$tmp/node.out" || { cat "$tmp/node.err" >&2; fail "the node is not listening"; }

common=(--context-ids "$ctx" --chunk-tokens 16)
want_llama=$(alone "$tmp/llama.gguf")
want_qwen=$(alone "$tmp/qwen2.gguf")
echo "llama.cpp alone: llama $want_llama; qwen2 $want_qwen"

step "llama.cpp to llama.cpp, F32 cache"
"$kl" -H "$ep" prefill --engine llama.cpp --gguf "$tmp/llama.gguf" --model-id tl "${common[@]}" \
    --scheme lossless --dtype fp32 --llama-cache f32 >"$tmp/prefill.out"
cat "$tmp/prefill.out"
grep -Eq '^prefilled 40 context tokens of tl@rope-[0-9a-f]{8} with llama.cpp \(llama, 3 layers, 2 KV heads of 16, F32 cache\)' \
    "$tmp/prefill.out" || fail "prefill does not say what it stored"
grep -q '^blocks: 18 (lossless)' "$tmp/prefill.out" || fail "not 3 chunks x 3 layers x 2 heads"
"$kl" -H "$ep" decode --engine llama.cpp --gguf "$tmp/llama.gguf" --model-id tl "${common[@]}" \
    --prompt-ids "$prompt" --max-new 8 --llama-cache f32 >"$tmp/d1.out"
cat "$tmp/d1.out"
grep -q ': 3 of 3 layers fetched$' "$tmp/d1.out" || fail "not every layer fetched"
[ "$(tokens "$tmp/d1.out")" = "$want_llama" ] || fail "llama.cpp over the imported context: not the tokens of llama.cpp alone"

step "llama.cpp's context decoded by the reference decoder"
"$kv" -H "$ep" decode --weights "$tmp/llama" --model-id tl "${common[@]}" --prompt-ids "$prompt" \
    --max-new 8 -q >"$tmp/d2.out"
[ "$(tokens "$tmp/d2.out")" = "$want_llama" ] || fail "the reference decoder over llama.cpp's context: other tokens"

step "the reference decoder's context decoded by llama.cpp (qwen2)"
"$kv" -H "$ep" prefill --weights "$tmp/qwen2" --model-id tq "${common[@]}" --scheme lossless \
    --dtype fp32 >/dev/null
"$kl" -H "$ep" --json decode --engine llama.cpp --gguf "$tmp/qwen2.gguf" --model-id tq \
    "${common[@]}" --prompt-ids "$prompt" --max-new 8 --llama-cache f32 >"$tmp/d3.json"
"$py" - "$tmp/d3.json" "$want_qwen" <<'PY' || fail "llama.cpp over the reference decoder's context"
import json, sys
r = json.load(open(sys.argv[1]))
want = [int(t) for t in sys.argv[2].split()]
assert r["engine"] == "llama.cpp" and r["fetched"] == 4 and not r["prefilled"], r
assert r["tokens"] == want, (r["tokens"], want)
PY

step "F16 cache: lossless fp16 blocks"
"$kl" -H "$ep" prefill --engine llama.cpp --gguf "$tmp/qwen2.gguf" --model-id tq16 \
    "${common[@]}" --scheme lossless >/dev/null
"$kl" -H "$ep" decode --engine llama.cpp --gguf "$tmp/qwen2.gguf" --model-id tq16 "${common[@]}" \
    --prompt-ids "$prompt" --max-new 8 >"$tmp/d4.out"
grep -q ': 4 of 4 layers fetched$' "$tmp/d4.out" || fail "F16: not every layer fetched"
[ "$(tokens "$tmp/d4.out")" = "$want_qwen" ] || fail "F16 cache: not the tokens of llama.cpp alone"

step "a context nobody stored: llama.cpp prefills it"
"$kl" -H "$ep" decode --engine llama.cpp --gguf "$tmp/llama.gguf" --model-id nobody \
    "${common[@]}" --prompt-ids "$prompt" --max-new 8 --llama-cache f32 >"$tmp/d5.out"
grep -q 'llama.cpp prefilled the context' "$tmp/d5.out" || fail "no prefill said"
[ "$(tokens "$tmp/d5.out")" = "$want_llama" ] || fail "prefilled: not the tokens of llama.cpp alone"

step "the trained model on held-out text, across engines"
# models/kjv/llama/cloud (6 layers, 2 KV heads of 32): a 256-token context of the held-out
# fixture (<s> first) in chunks of 64, the next 16 ids as the prompt, 16 greedy tokens.
models=$here/../../../models/kjv/llama
"$py" "$tiny" gguf "$models/cloud" "$models/tokenizer.json" "$tmp/kjv.gguf"
kjv_ids() { # FROM TO
    "$py" -c 'import json, sys; print(",".join(str(i) for i in json.load(open(sys.argv[1]))["ids"][int(sys.argv[2]):int(sys.argv[3])]))' \
        "$here/../../fixtures/tokenizer/kjv_llama_heldout.json" "$1" "$2"
}
kctx=$(kjv_ids 0 256)
kprompt=$(kjv_ids 256 272)
want_kjv=$(alone "$tmp/kjv.gguf" "$kctx" "$kprompt" 16)
echo "llama.cpp alone: $want_kjv"
kjv=(--context-ids "$kctx" --chunk-tokens 64 --prompt-ids "$kprompt" --max-new 16)
"$kl" -H "$ep" prefill --engine llama.cpp --gguf "$tmp/kjv.gguf" --model-id kjv \
    --context-ids "$kctx" --chunk-tokens 64 --scheme lossless --dtype fp32 --llama-cache f32 \
    >"$tmp/kp1.out"
"$kl" -H "$ep" decode --engine llama.cpp --gguf "$tmp/kjv.gguf" --model-id kjv "${kjv[@]}" \
    --llama-cache f32 >"$tmp/kd1.out"
grep -q ': 6 of 6 layers fetched$' "$tmp/kd1.out" || fail "kjv: not every layer fetched"
[ "$(tokens "$tmp/kd1.out")" = "$want_kjv" ] || fail "kjv: llama.cpp over its exported context: not the tokens of llama.cpp alone"
# The reference decoder over llama.cpp's context; --compare also runs it alone (edge-only).
"$kv" -H "$ep" --json decode --weights "$models/cloud" --model-id kjv "${kjv[@]}" --compare \
    >"$tmp/kd2.json"
"$py" - "$tmp/kd2.json" "$want_kjv" <<'PY' || fail "kjv: the reference decoder over llama.cpp's context"
import json, sys
r = json.load(open(sys.argv[1]))
want = [int(t) for t in sys.argv[2].split()]
t = r["tokens"]
assert t["kvedge"] == want and t["edge_only"] == want, (t, want)
PY
"$kv" -H "$ep" prefill --weights "$models/cloud" --model-id kjvr --context-ids "$kctx" \
    --chunk-tokens 64 --scheme lossless --dtype fp32 >/dev/null
"$kl" -H "$ep" decode --engine llama.cpp --gguf "$tmp/kjv.gguf" --model-id kjvr "${kjv[@]}" \
    --llama-cache f32 >"$tmp/kd3.out"
grep -q ': 6 of 6 layers fetched$' "$tmp/kd3.out" || fail "kjv: not every layer of the reference's context fetched"
[ "$(tokens "$tmp/kd3.out")" = "$want_kjv" ] || fail "kjv: llama.cpp over the reference decoder's context: other tokens"

step "a context stored without layer 3: llama.cpp prefills it whole"
"$kl" -H "$ep" --json prefill --engine llama.cpp --gguf "$tmp/kjv.gguf" --model-id kjvp \
    --context-ids "$kctx" --chunk-tokens 64 --layers 0,1,2,4,5 --llama-cache f32 >"$tmp/kp4.json"
"$py" - "$tmp/kp4.json" <<'PY' || fail "kjv --layers: not 5 layers stored"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["layers_put"] == 5 and r["blocks"] == 4 * 5 * 2, r
PY
"$kl" -H "$ep" decode --engine llama.cpp --gguf "$tmp/kjv.gguf" --model-id kjvp "${kjv[@]}" \
    --llama-cache f32 >"$tmp/kd4.out"
cat "$tmp/kd4.out"
grep -q ': 5 of 6 layers fetched' "$tmp/kd4.out" || fail "kjv --layers: not 5 of 6 layers fetched"
grep -q 'llama.cpp prefilled the context' "$tmp/kd4.out" || fail "kjv --layers: no prefill said"
[ "$(tokens "$tmp/kd4.out")" = "$want_kjv" ] || fail "kjv --layers: not the tokens of llama.cpp alone"

step "refusals"
set +e
"$kl" -H "$ep" decode --engine llama.cpp --gguf "$tmp/llama.gguf" --model-id tq "${common[@]}" \
    --prompt-ids "$prompt" 2>"$tmp/e1" >/dev/null
rc=$?
set -e
if [ $rc != 2 ] || ! grep -q 'other rotary settings' "$tmp/e1"; then
    fail "a GGUF of other rotary settings: rc $rc $(cat "$tmp/e1")"
fi
expect_usage() {
    local what=$1
    shift
    set +e
    "$@" 2>"$tmp/e" >/dev/null
    local rc=$?
    set -e
    if [ $rc != 2 ] || ! grep -q "$what" "$tmp/e"; then
        fail "expected exit 2 saying '$what', got $rc: $(cat "$tmp/e")"
    fi
}
expect_usage "takes the model as --gguf" "$kl" -H "$ep" decode --engine llama.cpp --model-id x \
    "${common[@]}" --prompt-ids 1
expect_usage "takes the model as --gguf" "$kl" -H "$ep" decode --engine llama.cpp --gguf \
    "$tmp/llama.gguf" --weights "$tmp/llama" --model-id x "${common[@]}" --prompt-ids 1
expect_usage "needs --model-id" "$kl" -H "$ep" prefill --engine llama.cpp --gguf \
    "$tmp/llama.gguf" "${common[@]}"
expect_usage "bad value '9' for --layers" "$kl" -H "$ep" prefill --engine llama.cpp --gguf \
    "$tmp/llama.gguf" --model-id x --layers 9 "${common[@]}"
expect_usage "mapped-only is for --engine reference" "$kl" -H "$ep" prefill --engine llama.cpp \
    --gguf "$tmp/llama.gguf" --model-id x --mapped-only "${common[@]}"
expect_usage "f16 or f32" "$kl" -H "$ep" prefill --engine llama.cpp --gguf "$tmp/llama.gguf" \
    --model-id x --llama-cache q8_0 "${common[@]}"
expect_usage "go with --engine llama.cpp" "$kv" -H "$ep" prefill --weights "$tmp/llama" \
    --gguf "$tmp/llama.gguf" --model-id x "${common[@]}"
echo "OK"
