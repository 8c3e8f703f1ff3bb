#!/usr/bin/env bash
# TTFT of llama.cpp with kvedge against llama.cpp's own prefill of the context
# (docs/benchmarks.md, "llama.cpp at the edge"). A store node, and one edge proxy per emulated
# link in front of it (the source's link=RATE,LATENCY); per context length:
#   prefill    llama.cpp computing context + prompt itself (`decode --engine llama.cpp` of a
#              context nobody stored: every layer misses, llama.cpp prefills);
#   SCHEME@LINK  llama.cpp's context exported as SCHEME (kvedge prefill --engine llama.cpp), then
#              fetched through the proxy on LINK, converted and loaded into llama.cpp, which
#              decodes the prompt: the import's fetch, conversion and load, and TTFT.
#   partial@LINK  (PARTIAL=1) the first scheme's context stored without its middle layer
#              (prefill --layers): the edge fetches the other layers, finds one missing, drops
#              them and has llama.cpp prefill the whole context (docs/llamacpp.md, "What partial
#              fetch means"); another context of the same length, so that the full one stays.
# Each TTFT is from the start of the request (the model already loaded) to the first token: a
# 16-token prompt, an F16 cache, THREADS llama.cpp threads (default 1: on a shared machine more
# threads than idle cores spin against each other and TTFT varies tenfold); each kvedge run is
# repeated REPEAT times (default 3), the median TTFT printed with that run's figures. The model
# id must be a built-in shape (kvedge models) so that a proxy without a master knows it.
# Usage: llamacpp_ttft.sh BUILD_DIR MODEL.gguf MODEL_ID "CTX_TOKENS..." ["SCHEMES"] ["LINKS"]
#   (defaults: "int8 int4", "100mbit,5ms 1gbit,1ms"); KVEDGE_LLAMACPP names the command with
#   --engine llama.cpp (default BUILD_DIR/clients/kvedge-llamacpp, else BUILD_DIR/clients/kvedge).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../tests/common/wait.sh
. "$(dirname "$0")/../tests/common/wait.sh"
build=$(cd "${1:?usage: llamacpp_ttft.sh BUILD_DIR MODEL.gguf MODEL_ID CTX_TOKENS...}" && pwd)
gguf=${2:?}
id=${3:?}
read -r -a sizes <<<"${4:?}"
read -r -a schemes <<<"${5:-int8 int4}"
read -r -a links <<<"${6:-100mbit,5ms 1gbit,1ms}"
py=${PYTHON:-/usr/bin/python3}
threads=${THREADS:-1}
partial=${PARTIAL:-0}
repeat=${REPEAT:-3}
deadline=${DEADLINE_MS:-120000}
kv=$build/clients/kvedge
kl=${KVEDGE_LLAMACPP:-$build/clients/kvedge-llamacpp}
[ -x "$kl" ] || kl=$kv
vocab=$("$py" - "$gguf" <<'PY'
import struct, sys
# The vocabulary size: tokenizer.ggml.tokens' length, read from the GGUF's key/value section.
f = open(sys.argv[1], "rb")
assert f.read(4) == b"GGUF"
_, n_t, n_kv = struct.unpack("<IQQ", f.read(20))
def s():
    return f.read(struct.unpack("<Q", f.read(8))[0]).decode()
size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
def skip(t):
    if t == 8:
        s()
    elif t == 9:
        et, n = struct.unpack("<IQ", f.read(12))
        if et == 8:
            for _ in range(n):
                s()
            return n
        f.seek(size[et] * n, 1)
        return n
    else:
        f.seek(size[t], 1)
for _ in range(n_kv):
    k = s()
    t = struct.unpack("<I", f.read(4))[0]
    n = skip(t)
    if k == "tokenizer.ggml.tokens":
        print(n)
        break
PY
)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvedge-lcttft.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
listening_or_gone() { grep -q '^listening ' "$1" || ! kill -0 "$2" 2>/dev/null; }
start() { # NAME ARGS...: a daemon, returns once it listens
    local name=$1
    shift
    "$kv" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    local pid=$!
    pids+=("$pid")
    wait_until "$KT_WAIT_S" listening_or_gone "$tmp/$name.out" "$pid" || true
    grep -q '^listening ' "$tmp/$name.out" || { cat "$tmp/$name.err" >&2; exit 1; }
}
start node --data "$tmp/node" store --role cloud --insecure --bind "ipc://$tmp/node.sock" \
    --log-level error --metrics off
proxies=()
for i in "${!links[@]}"; do
    start "proxy$i" proxy --insecure --bind "ipc://$tmp/proxy$i.sock" --metrics off --id "px$i" \
        --source "cloud cloud1 ipc://$tmp/node.sock link=${links[$i]}" --log-level error
    proxies+=("ipc://$tmp/proxy$i.sock")
done

field() { "$py" -c 'import json, sys; r = json.load(open(sys.argv[1])); print(" ".join(str(r[k]) for k in sys.argv[2:]))' "$@"; }
printf '%-7s %-18s %10s %9s %10s %8s %8s %8s\n' tokens run ttft_ms speedup fetch_ms conv_ms load_ms state_MB
for n in "${sizes[@]}"; do
    ctx=$("$py" -c 'import random, sys; r = random.Random(1); print(",".join(str(r.randrange(int(sys.argv[1]))) for _ in range(int(sys.argv[2]))))' "$vocab" "$n")
    prompt=$("$py" -c 'import random, sys; r = random.Random(2); print(",".join(str(r.randrange(int(sys.argv[1]))) for _ in range(16)))' "$vocab")
    # The import needs every layer (llama.cpp's state API takes a sequence whole), and a context
    # whose transfer outlasts the fetch's deadline (5 s by default) misses its last layers:
    # llama.cpp then prefills it all. 4096 tokens of Llama 3.2 1B at int8 are 68 MB, 5.4 s at
    # 100 Mbit/s, so the fetch gets DEADLINE_MS (default 120000).
    dec=(decode --engine llama.cpp --gguf "$gguf" --context-ids "$ctx" --prompt-ids "$prompt"
        --max-new 1 --threads "$threads")
    "$kl" -H "ipc://$tmp/node.sock" --json "${dec[@]}" --model-id "none-$n" >"$tmp/base.json"
    base=$(field "$tmp/base.json" ttft_ms)
    printf '%-7s %-18s %10.1f %9s %10s %8s %8s %8s\n' "$n" prefill "$base" 1.00 - - - -
    for s in "${schemes[@]}"; do
        "$kl" -H "ipc://$tmp/node.sock" prefill --engine llama.cpp --gguf "$gguf" --model-id "$id" \
            --context-ids "$ctx" --scheme "$s" --threads "$threads" >/dev/null
        for i in "${!links[@]}"; do
            for r in $(seq "$repeat"); do
                "$kl" -H "${proxies[$i]}" --deadline "$deadline" --json "${dec[@]}" --model-id "$id" \
                    >"$tmp/run$r.json"
            done
            # The median run by TTFT.
            mid=$(for r in $(seq "$repeat"); do echo "$(field "$tmp/run$r.json" ttft_ms) $r"; done |
                sort -n | sed -n "$(((repeat + 1) / 2))p" | cut -d' ' -f2)
            cp "$tmp/run$mid.json" "$tmp/run.json"
            read -r ttft fetch conv load bytes fetched <<<"$(field "$tmp/run.json" ttft_ms fetch_ms \
                convert_ms load_ms state_bytes fetched)"
            [ "$fetched" -gt 0 ] || { echo "no layer fetched: $(cat "$tmp/run.json")" >&2; exit 1; }
            printf '%-7s %-18s %10.1f %9.2f %10.1f %8.1f %8.1f %8.1f\n' "$n" "$s@${links[$i]}" \
                "$ttft" "$(echo "$base / $ttft" | bc -l)" "$fetch" "$conv" "$load" \
                "$(echo "$bytes / 1048576" | bc -l)"
        done
    done
    [ "$partial" = 1 ] || continue
    # The first scheme, another context of n tokens stored without the middle layer.
    layers=$(field "$tmp/base.json" layers)
    keep=$(seq 0 $((layers - 1)) | grep -vx "$((layers / 2))" | paste -sd,)
    ctx2=$("$py" -c 'import random, sys; r = random.Random(3); print(",".join(str(r.randrange(int(sys.argv[1]))) for _ in range(int(sys.argv[2]))))' "$vocab" "$n")
    dec2=(decode --engine llama.cpp --gguf "$gguf" --context-ids "$ctx2" --prompt-ids "$prompt"
        --max-new 1 --threads "$threads" --model-id "$id")
    "$kl" -H "ipc://$tmp/node.sock" prefill --engine llama.cpp --gguf "$gguf" --model-id "$id" \
        --context-ids "$ctx2" --scheme "${schemes[0]}" --threads "$threads" --layers "$keep" \
        >/dev/null
    for i in "${!links[@]}"; do
        for r in $(seq "$repeat"); do
            "$kl" -H "${proxies[$i]}" --deadline "$deadline" --json "${dec2[@]}" >"$tmp/run$r.json"
        done
        mid=$(for r in $(seq "$repeat"); do echo "$(field "$tmp/run$r.json" ttft_ms) $r"; done |
            sort -n | sed -n "$(((repeat + 1) / 2))p" | cut -d' ' -f2)
        read -r ttft fetch pre fetched missed <<<"$(field "$tmp/run$mid.json" ttft_ms fetch_ms \
            prefill_ms fetched missed)"
        [ "$missed" = 1 ] || { echo "not one layer missed: $(cat "$tmp/run$mid.json")" >&2; exit 1; }
        printf '%-7s %-18s %10.1f %9.2f %10.1f %8s %8s %8s   (%s fetched, prefill %.1f ms)\n' \
            "$n" "partial@${links[$i]}" "$ttft" "$(echo "$base / $ttft" | bc -l)" "$fetch" - - - \
            "$fetched" "$pre"
    done
done
