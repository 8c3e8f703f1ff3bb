#!/usr/bin/env bash
# test_decoder_llamacpp: the reference decoder against llama.cpp on tiny random Llama,
# Llama-with-Llama-3-rope-scaling and Qwen2 models (GQA 4 query / 2 KV heads; tests/decoder/
# tiny_llama.py makes them in Hugging Face form and converts them to GGUF as
# convert_hf_to_gguf.py does). Per model: the logits of every position of a 24-token sequence
# (fp32 weights, fp32 KV cache on llama.cpp's side) must agree within TOL, the arg-max of
# every position must be the same token, and 8 greedy tokens after it too. Then the same on the
# project's trained Llama pair (MODELS: models/kjv/llama, cloud and edge; F16 weights, widened
# to F32 exactly for llama.cpp) over the first 64 ids of the held-out text.
# Usage: compare_llamacpp.sh DEST DECODER_LOGITS [MODELS] (DEST prepared by fetch_llamacpp.sh);
# PYTHON names a python3 with NumPy (Debian's python3-numpy; default python3).
set -euo pipefail
dest=$(cd "${1:?usage: compare_llamacpp.sh DEST DECODER_LOGITS}" && pwd)
kvedge=${2:?usage: compare_llamacpp.sh DEST DECODER_LOGITS}
here=$(cd "$(dirname "$0")" && pwd)
tol=${KVEDGE_LLAMACPP_TOL:-1e-4}
py=${PYTHON:-python3}
if ! "$py" -c 'import numpy' 2>/dev/null; then
    echo "compare_llamacpp: $py has no NumPy (scripts/setup.sh installs python3-numpy)" >&2
    exit 1
fi
gen=8
bins=$dest/bins/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
work=$dest/tiny
mkdir -p "$work"
# compare NAME HF_DIR IDS...: llama.cpp ($work/NAME.gguf) and kvedge (HF_DIR) on the same ids.
compare() {
    local name=$1 dir=$2
    shift 2
    "$dest/llama_logits" "$bins" "$work/$name.gguf" "$work/$name.llama.bin" "$gen" "$@"
    "$kvedge" "$dir" "$work/$name.kvedge.bin" "$gen" "$@"
    "$py" - "$name" "$work/$name.llama.bin" "$work/$name.kvedge.bin" "$tol" "$gen" <<'PY'
import sys
import numpy as np
kind, a_path, b_path, tol, gen = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
def read(p):
    d = open(p, "rb").read()
    vocab, n = np.frombuffer(d[:8], "<i4")
    logits = np.frombuffer(d[8:8 + 4 * n * vocab], "<f4").reshape(n, vocab)
    return logits, np.frombuffer(d[8 + 4 * n * vocab:], "<i4")
la, ga = read(a_path)
lb, gb = read(b_path)
assert la.shape == lb.shape, f"{kind}: llama.cpp {la.shape} logits, kvedge {lb.shape}"
d = np.abs(la.astype(np.float64) - lb)
per_pos = d.max(axis=1)
same = (la.argmax(1) == lb.argmax(1)).all() and (ga == gb).all()
ok = d.max() <= tol and same
print(f"{kind}: {la.shape[0]} positions x {la.shape[1]} logits (|logit| up to {np.abs(la).max():.2f}): "
      f"max |d| {d.max():.3g} (position {int(per_pos.argmax())}), mean |d| {d.mean():.3g}; "
      f"arg-max equal at every position: {bool((la.argmax(1) == lb.argmax(1)).all())}; "
      f"greedy {gen}: llama.cpp {ga.tolist()} kvedge {gb.tolist()}: {'OK' if ok else 'FAIL'} (tolerance {tol})")
sys.exit(0 if ok else 1)
PY
}
status=0
for kind in llama llama3 qwen2; do
    vocab=llama-bpe
    [ "$kind" = qwen2 ] && vocab=qwen2
    gguf_vocab=$dest/$vocab/ggml-vocab-$vocab.gguf
    "$py" "$here/tiny_llama.py" make "$kind" "$gguf_vocab" "$dest/$vocab/tokenizer.json" \
        "$work/$kind"
    "$py" "$here/tiny_llama.py" gguf "$work/$kind" "$gguf_vocab" "$work/$kind.gguf"
    # 24 ids drawn with a fixed seed from the model's vocabulary.
    mapfile -t ids < <("$py" -c 'import json, random, sys
v = json.load(open(sys.argv[1]))["vocab_size"]
r = random.Random(sys.argv[2])
print("\n".join(str(r.randrange(v)) for _ in range(24)))' "$work/$kind/config.json" "$kind")
    compare "$kind" "$work/$kind" "${ids[@]}" || status=1
done
models=${3:-}
if [ -n "$models" ]; then
    # The trained pair on real text: the held-out ids of the tokenizer fixture, <s> first.
    mapfile -t ids < <("$py" -c 'import json, sys
print("\n".join(str(i) for i in json.load(open(sys.argv[1]))["ids"][:64]))' \
        "$here/../fixtures/tokenizer/kjv_llama_heldout.json")
    for size in cloud edge; do
        "$py" "$here/tiny_llama.py" gguf "$models/$size" "$models/tokenizer.json" \
            "$work/kjv-$size.gguf"
        compare "kjv-$size" "$models/$size" "${ids[@]}" || status=1
    done
fi
exit $status
