#!/usr/bin/env bash
# Cross-engine validation of the llama.cpp bridge on a real-size model (not a ctest: minutes and
# gigabytes; docs/llamacpp.md, "Tolerances measured"). Given a Hugging Face Llama or Qwen2
# folder (e.g. `kvedge model-synth --shape llama-3.2-1b --out DIR`), converts it to a GGUF (F32,
# tests/decoder/tiny_llama.py), starts a store node and compares the greedy tokens of:
#   alone         llama.cpp computing context + prompt itself (llama_logits);
#   lc->lc        llama.cpp over a context llama.cpp exported (lossless fp32, F32 cache);
#   lc->ref       the reference decoder over that context;
#   ref->lc       llama.cpp over a context the reference decoder prefilled;
#   lc->lc int8   and int4: llama.cpp over its own context stored quantized;
#   lc->lc f16    lossless fp16 blocks into an F16 cache.
# Needs the fixture (ctest -R decoder_llamacpp_setup) and kvedge-llamacpp (or a kvedge built
# with -DKVEDGE_LLAMACPP). Usage: validate_llamacpp.sh BUILD_DIR MODEL_DIR [CTX_TOKENS [GEN]]
# with PYTHON a python3 with NumPy (default /usr/bin/python3).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../../common/wait.sh
. "$(dirname "$0")/../../common/wait.sh"
build=$(cd "${1:?usage: validate_llamacpp.sh BUILD_DIR MODEL_DIR [CTX_TOKENS [GEN]]}" && pwd)
model=$(cd "${2:?usage: validate_llamacpp.sh BUILD_DIR MODEL_DIR [CTX_TOKENS [GEN]]}" && pwd)
n_ctx=${3:-256}
gen=${4:-16}
py=${PYTHON:-/usr/bin/python3}
here=$(cd "$(dirname "$0")" && pwd)
llama=$build/llama
kv=$build/clients/kvedge
kl=$build/clients/kvedge-llamacpp
[ -x "$kl" ] || kl=$kv
work=${WORK:-$model.validate}
mkdir -p "$work"

vocab="llama-bpe"
grep -q '"qwen2"' "$model/config.json" && vocab=qwen2
gguf=$work/model.gguf
if [ ! -f "$gguf" ]; then
    echo "== converting $model to $gguf"
    "$py" "$here/../../decoder/tiny_llama.py" gguf "$model" "$llama/$vocab/ggml-vocab-$vocab.gguf" \
        "$gguf"
fi
v=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$model/config.json")
ctx=$("$py" -c 'import random, sys; r = random.Random(1); print(",".join(str(r.randrange(int(sys.argv[1]))) for _ in range(int(sys.argv[2]))))' "$v" "$n_ctx")
prompt=$("$py" -c 'import random, sys; r = random.Random(2); print(",".join(str(r.randrange(int(sys.argv[1]))) for _ in range(8)))' "$v")

pid=
cleanup() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
    wait 2>/dev/null || true
}
trap cleanup EXIT
rm -rf "$work/node"
ep=ipc://$work/node.sock
"$kv" --data "$work/node" store --role cloud --insecure --bind "$ep" --log-level error \
    --metrics off >"$work/node.out" 2>&1 &
pid=$!
listening_or_gone() { grep -q '^listening ' "$work/node.out" || ! kill -0 "$pid" 2>/dev/null; }
wait_until "$KT_WAIT_S" listening_or_gone || true
grep -q '^listening ' "$work/node.out" || { cat "$work/node.out" >&2; exit 1; }

common=(--model-id v --context-ids "$ctx" --chunk-tokens 64)
tokens() { sed -n 's/^tokens: //p; s/^generated [0-9]* tokens: //p' "$1"; }
ms() { sed -n "s/.*$1 \([0-9.]*\) ms.*/\1/p" "$2" | head -1; }
lc_decode() { # ID CACHE OUT
    "$kl" -H "$ep" decode --engine llama.cpp --gguf "$gguf" --model-id "$1" --context-ids "$ctx" \
        --chunk-tokens 64 --prompt-ids "$prompt" --max-new "$gen" --llama-cache "$2" >"$3"
}

echo "== alone"
IFS=, read -r -a ids <<<"$ctx,$prompt"
t0=$(date +%s.%N)
"$llama/llama_logits" "$llama/prefix/lib" "$gguf" "$work/alone.bin" "$gen" "${ids[@]}"
alone_s=$(echo "$(date +%s.%N) - $t0" | bc)
want=$("$py" - "$work/alone.bin" <<'PY'
import sys
import numpy as np
d = open(sys.argv[1], "rb").read()
vocab, n = np.frombuffer(d[:8], "<i4")
print(" ".join(str(t) for t in np.frombuffer(d[8 + 4 * n * vocab:], "<i4")))
PY
)
echo "== lc->lc, lc->ref"
"$kl" -H "$ep" prefill --engine llama.cpp --gguf "$gguf" "${common[@]}" --scheme lossless \
    --dtype fp32 --llama-cache f32 >"$work/p1.out"
lc_decode v f32 "$work/d1.out"
"$kv" -H "$ep" decode --weights "$model" "${common[@]}" --prompt-ids "$prompt" --max-new "$gen" \
    >"$work/d2.out"
echo "== ref->lc"
"$kv" -H "$ep" prefill --weights "$model" --model-id r --context-ids "$ctx" --chunk-tokens 64 \
    --scheme lossless --dtype fp32 >"$work/p3.out"
lc_decode r f32 "$work/d3.out"
echo "== quantized, f16"
for s in int8 int4; do
    "$kl" -H "$ep" prefill --engine llama.cpp --gguf "$gguf" --model-id "q$s" --context-ids "$ctx" \
        --chunk-tokens 64 --scheme "$s" --llama-cache f32 >"$work/p-$s.out"
    lc_decode "q$s" f32 "$work/d-$s.out"
done
"$kl" -H "$ep" prefill --engine llama.cpp --gguf "$gguf" --model-id h --context-ids "$ctx" \
    --chunk-tokens 64 --scheme lossless >"$work/p-f16.out"
lc_decode h f16 "$work/d-f16.out"

agree() { "$py" -c 'import sys; a, b = sys.argv[1].split(), sys.argv[2].split(); k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)); print(f"{k}/{len(a)}")' "$1" "$2"; }
printf '%-12s %-10s %s\n' run agree tokens
printf '%-12s %-10s %s   (%.1f s)\n' alone "-" "$want" "$alone_s"
for r in "lc->lc:d1" "lc->ref:d2" "ref->lc:d3" "lc->lc-int8:d-int8" "lc->lc-int4:d-int4" "lc->lc-f16:d-f16"; do
    name=${r%%:*}
    f=$work/${r#*:}.out
    t=$(tokens "$f")
    printf '%-12s %-10s %s\n' "$name" "$(agree "$want" "$t")" "$t"
done
echo "llama.cpp prefill of the context: $(ms 'llama.cpp prefill' "$work/p1.out") ms; import: $(grep '^time:' "$work/d1.out")"
