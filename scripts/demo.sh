#!/usr/bin/env bash
# The main job: a cloud and two edges on this machine, no configuration.
#
# Starts a Storage Master, a cloud store node, two edge store nodes (edge-a, where the user
# is, and its peer edge-b) and edge-a's proxy, on ipc endpoints in a temporary directory, with
# emulated links: cloud 1 Gbit/s and 10 ms one way, peer 1 Gbit/s and 1 ms. The model is the
# project's trained Llama-family cloud model (models/kjv/llama/cloud: rotary positions,
# grouped-query attention with 6 query heads on 2 KV heads of 32, RMSNorm, SwiGLU, 6 layers;
# trained on the King James Bible; fp32 on the CPU) with its tokenizer.json. The cloud computes
# the KV of a chapter the model never saw in training (the shared context) once; edge-a
# answers private prompts on top of it, fetching layers through its proxy while it computes,
# and prints the text it generates. Then the cloud goes down and edge-a keeps answering from
# its peer and its own historical cache. In between, edge-a also runs the small edge model
# (models/kjv/llama/edge: 4 layers, 4 query heads on 1 KV head of 32) on the cloud model's
# cache: the layer map in the master and the distilled adapter in models/kjv/llama/ls
# (large-small, docs/largesmall.md), whose quality against the least-squares adapter it
# measures on a few held-out documents. Everything is shut down cleanly at the end. The OPT pair of models/kjv
# runs the same way (docs/decoder.md).
#
# usage: scripts/demo.sh [path/to/kvedge]     (KVEDGE_DEMO_DIR=DIR keeps the state there)
set -euo pipefail
KVEDGE=$(realpath "${1:-build/clients/kvedge}")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# Hugging Face model folders: config.json, model.safetensors, tokenizer.json (its template puts
# <s> before the text, as prefill and decode do by default).
WEIGHTS="$ROOT/models/kjv/llama/cloud"
EDGE_WEIGHTS="$ROOT/models/kjv/llama/edge"
LS="$ROOT/models/kjv/llama/ls" # the layer map kjv-llama-cloud -> kjv-llama-edge, its K/V adapters
LS_DOCS=4 # held-out documents the large-small step measures quality on (about 1 s of CPU)
CTX_TOKENS=448                 # of the chapter: the model has 512 positions, the prompt needs some
CLOUD_LINK=1gbit,10ms
PEER_LINK=1gbit,1ms
DIR=${KVEDGE_DEMO_DIR:-$(mktemp -d /tmp/kvedge-demo-XXXXXX)}
mkdir -p "$DIR"
# The shared context: Genesis 8, the first held-out chapter (models/README.md).
CTX_FILE="$DIR/context.txt"
awk 'BEGIN { RS = "" } NR == 1 { print; exit }' "$ROOT/models/kjv/heldout.txt" >"$CTX_FILE"
T0=$(date +%s%N)

declare -A PID
step() {
    local ms=$((($(date +%s%N) - T0) / 1000000))
    printf '\n\033[1m== [%3d.%01ds] %s\033[0m\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*"
}
note() { printf '   %s\n' "$*"; }

# start NAME ARGS...: runs `kvedge ARGS...` in the background, logging to DIR/NAME.log, and
# waits (10 s at most) for the line that says it serves.
start() {
    local name=$1
    shift
    # Every daemon serves /metrics on a free loopback port (it logs which: "metrics on ...").
    "$KVEDGE" "$@" --metrics 127.0.0.1:0 >"$DIR/$name.log" 2>&1 &
    PID[$name]=$!
    for _ in $(seq 100); do
        grep -q -E "listening|serving" "$DIR/$name.log" 2>/dev/null && return 0
        kill -0 "${PID[$name]}" 2>/dev/null || break
        sleep 0.1
    done
    echo "demo: $name did not start; its log:" >&2
    cat "$DIR/$name.log" >&2
    exit 1
}

stop() { # stop NAME [SIGNAL]: signals it and waits for it to exit
    local name=$1 sig=${2:-TERM}
    [ -n "${PID[$name]:-}" ] || return 0
    kill "-$sig" "${PID[$name]}" 2>/dev/null || true
    wait "${PID[$name]}" 2>/dev/null || true
    unset "PID[$name]"
}

cleanup() {
    for name in proxy edge-a edge-b cloud master; do stop "$name"; done
    [ -n "${KVEDGE_DEMO_DIR:-}" ] || rm -rf "$DIR"
}
trap cleanup EXIT

ep() { echo "ipc://$DIR/$1.sock"; }
MASTER="--master $(ep master) --master-pub $(ep master-pub)"

step "Model: the trained cloud model (models/kjv/llama/cloud: Llama, 6 layers, 6 query / 2 KV heads x 32, vocab 4096)"
note "shared context: $(head -1 "$CTX_FILE") (held out from training), first $CTX_TOKENS tokens"
note "$(sed -n 2p "$CTX_FILE" | cut -c1-90)..."

step "Start the Storage Master and the cloud store node"
start master master --bind "$(ep master)" --pub "$(ep master-pub)" --data "$DIR/master" --insecure
# shellcheck disable=SC2086
start cloud --data "$DIR/cloud" store --role cloud --bind "$(ep cloud)" --insecure \
    --name cloud $MASTER --node-id cloud
note "master $(ep master), cloud node $(ep cloud)"

step "Cloud prefill: the cloud model computes the chapter's KV once and stores it (int8)"
"$KVEDGE" -H "$(ep cloud)" prefill --weights "$WEIGHTS" --model-id kjv-llama-cloud \
    --file "$CTX_FILE" --tokens "$CTX_TOKENS" --scheme int8 | tee "$DIR/prefill.out"
# The chapter's last chunk (the highest chunk index) names the whole chain.
PREFIX=$("$KVEDGE" -H "$(ep cloud)" ls --full | awk 'NR > 1 { print $3, $1 }' | sort -n |
    tail -1 | cut -d' ' -f2)
[ -n "$PREFIX" ] || { echo "demo: no context on the cloud node" >&2; exit 1; }

subscription() { # subscription FILE LAYERS: the historical-cache subscription of the chapter
    printf 'subscription\n    name = chapter\n    cloud = %s\n    prefix = %s\n    layers = %s\n' \
        "$(ep cloud)" "$PREFIX" "$2" >"$1"
}

step "Start the edge nodes: edge-b keeps the shallow layers 0-2 (it served this chapter before)"
subscription "$DIR/edge-b.subs" 0:3
# shellcheck disable=SC2086
start edge-b --data "$DIR/edge-b" store --role edge --bind "$(ep edge-b)" --insecure \
    --name edge-b $MASTER --node-id edge-b --subscriptions "$DIR/edge-b.subs"
# shellcheck disable=SC2086
start edge-a --data "$DIR/edge-a" store --role edge --bind "$(ep edge-a)" --insecure \
    --name edge-a $MASTER --node-id edge-a
for _ in $(seq 50); do grep -q "sync chapter" "$DIR/edge-b.log" && break; sleep 0.1; done
note "edge-b: $(grep -o 'sync chapter.*' "$DIR/edge-b.log" | head -1)"

step "Start edge-a's proxy: cloud over $CLOUD_LINK, peer edge-b over $PEER_LINK, own node as history"
note "the proxy measures each link when it connects, and learns from every fetch"
start proxy proxy --bind "$(ep proxy)" --insecure --master "$(ep master)" \
    --master-pub "$(ep master-pub)" --snapshot "$DIR/proxy.snapshot" --cert "$DIR/proxy.cert" \
    -s "cloud cloud $(ep cloud) link=$CLOUD_LINK" \
    -s "peer edge-b $(ep edge-b) link=$PEER_LINK" \
    -s "history edge-a $(ep edge-a)"
sleep 1 # the proxy's first probes and the master's directory

decode() { # decode PROMPT [EXTRA ARGS]: an edge request through the proxy
    local prompt=$1
    shift
    "$KVEDGE" -H "$(ep proxy)" decode --weights "$WEIGHTS" --model-id kjv-llama-cloud \
        --file "$CTX_FILE" --tokens "$CTX_TOKENS" --prompt "$prompt" --max-new 24 \
        --repetition-penalty 1.3 --plan-recompute "$@"
}

step "Edge request 1, compared with edge-only recomputation and cloud-only (prompt sent to the cloud)"
note "the prompt stays on edge-a: only the chapter's chunk ids go to the proxy"
decode "
And Noah said unto his sons," --compare --cloud-link "$CLOUD_LINK"

step "Edge requests 2 and 3: other users, same chapter"
decode "
And the LORD spake unto Noah, saying,"
decode "
And the dove came in to him" --quiet

step "Large-small: edge-a's small model (models/kjv/llama/edge, 4 layers, 4 query / 1 KV head) on the cloud model's cache"
note "the master gets the layer map (CKA/RSA-matched: edge layers 0,1,2,3 <- cloud layers 1,1,2,4)"
"$KVEDGE" layermap --show "$LS/map" --cloud "$WEIGHTS" --edge "$EDGE_WEIGHTS" \
    --register "$(ep master)" --master-pub "$(ep master-pub)" | grep registered
sleep 0.5 # the registry reaches the proxy
note "no node holds the edge model's K/V: the proxy plans the cloud model's layers 1,2,4 for it,"
note "from the peer's and the cloud's copies, and edge-a adapts them (K un-rotated with the cloud"
note "model's rotary settings, a linear map per layer distilled against the cloud model's"
note "predictions, re-rotated with the edge model's)"
"$KVEDGE" -H "$(ep proxy)" decode --weights "$EDGE_WEIGHTS" --model-id kjv-llama-edge \
    --file "$CTX_FILE" --tokens "$CTX_TOKENS" --prompt "
And Noah said unto his sons," --max-new 24 --repetition-penalty 1.3 \
    --adapter "$LS/adapter-distilled.safetensors"
note "(a 1.3 M-parameter model recomputes 448 tokens about as fast; timing at both links:"
note " docs/benchmarks.md, \"Large-small\")"
note "quality, computed now on the first $LS_DOCS held-out documents (kvedge lseval: 256 tokens of"
note "context, 64 scored; int8 blocks): the distilled adapter beside the least-squares one it"
note "started from (all 122 documents: docs/benchmarks.md, \"A distilled adapter\")"
"$KVEDGE" lseval --cloud "$WEIGHTS" --edge "$EDGE_WEIGHTS" --file "$ROOT/models/kjv/heldout.txt" \
    --adapter "$LS/adapter-linear.safetensors" --adapter "$LS/adapter-distilled.safetensors" \
    --docs "$LS_DOCS" -q | awk 'NR > 1 && $1 != "peer-int8" && $3 != "lossless" && $3 != "int4-g32"'

step "edge-a's historical cache takes the deep layers 3-5 (subscription added, node restarted)"
stop edge-a
subscription "$DIR/edge-a.subs" 3:6
# shellcheck disable=SC2086
start edge-a --data "$DIR/edge-a" store --role edge --bind "$(ep edge-a)" --insecure \
    --name edge-a $MASTER --node-id edge-a --subscriptions "$DIR/edge-a.subs"
for _ in $(seq 50); do grep -q "sync chapter" "$DIR/edge-a.log" && break; sleep 0.1; done
note "edge-a: $(grep -o 'sync chapter.*' "$DIR/edge-a.log" | head -1)"
sleep 1.5 # the directory reaches the proxy

step "The cloud node goes down (SIGKILL)"
stop cloud KILL
note "cloud node killed"

step "Edge request 4 with the cloud gone: the peer and the historical cache serve it"
decode "
And God blessed Noah and his sons, and said"

step "What edge-a's proxy saw (its Collaboration Monitor, over the wire; also on /metrics)"
# The proxy counts the killed cloud down after 4 failed probes (a PING deadline of 1 s each,
# every 500 ms: about 6 s after the kill; suspect after 3 s of silence): wait for it, 20 s at
# most, so the table shows what the proxy concluded rather than a moment in between.
cloud_state() { "$KVEDGE" -H "$(ep proxy)" sources | awk '$1 == "cloud" { print $6 }'; }
for _ in $(seq 200); do [ "$(cloud_state)" = down ] && break; sleep 0.1; done
[ "$(cloud_state)" = down ] || { echo "demo: the proxy still counts the killed cloud $(cloud_state)" >&2; exit 1; }
"$KVEDGE" -H "$(ep proxy)" sources
"$KVEDGE" -H "$(ep proxy)" stat
note "live view: kvedge -H $(ep proxy) top; Prometheus: $(grep -o 'http://127.0.0.1:[0-9]*' "$DIR/proxy.log" | head -1)/metrics"

step "Shut everything down"
for name in proxy edge-a edge-b master; do
    stop "$name"
    note "$name stopped"
done
step "Done (state in $DIR$([ -n "${KVEDGE_DEMO_DIR:-}" ] || echo ', removed'))"
