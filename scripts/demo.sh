#!/usr/bin/env bash
# The main job: a cloud and two edges on this machine, no configuration.
#
# Starts a Storage Master, a cloud store node, two edge store nodes (edge-a, where the user
# is, and its peer edge-b) and edge-a's proxy, on ipc endpoints in a temporary directory, with
# emulated links: cloud 1 Gbit/s and 10 ms one way, peer 1 Gbit/s and 1 ms. The model is the
# OPT-125m architecture (12 layers, 12 heads, hidden 768, fp32 on the CPU) with synthetic
# weights (the real ones are not on this machine; every cost is the real model's, the
# generated text is not). The cloud computes the KV of a 1024-token shared document once;
# edge-a answers private prompts on top of it, fetching layers through its proxy while it
# computes. Then the cloud goes down and edge-a keeps answering from its peer and its own
# historical cache. Everything is shut down cleanly at the end.
#
# usage: scripts/demo.sh [path/to/kvedge]     (KVEDGE_DEMO_DIR=DIR keeps the state there)
set -euo pipefail
KVEDGE=$(realpath "${1:-build/clients/kvedge}")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CTX_FILE="$ROOT/docs/architecture.md" # the shared context: a document every user asks about
CTX_TOKENS=1024
CLOUD_LINK=1gbit,10ms
PEER_LINK=1gbit,1ms
WEIGHTS_DIR="$(dirname "$KVEDGE")/../demo-weights"
WEIGHTS="$WEIGHTS_DIR/opt-125m-synthetic.safetensors"
DIR=${KVEDGE_DEMO_DIR:-$(mktemp -d /tmp/kvedge-demo-XXXXXX)}
mkdir -p "$DIR" "$WEIGHTS_DIR"
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
    "$KVEDGE" "$@" >"$DIR/$name.log" 2>&1 &
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

step "Model: OPT-125m architecture with synthetic weights (12 layers x 12 heads x 64)"
if [ ! -s "$WEIGHTS" ]; then
    "$KVEDGE" model-synth --shape opt-125m --seed 1 --out "$WEIGHTS"
else
    note "using $WEIGHTS"
fi

step "Start the Storage Master and the cloud store node"
start master master --bind "$(ep master)" --pub "$(ep master-pub)" --data "$DIR/master" --insecure
# shellcheck disable=SC2086
start cloud --data "$DIR/cloud" store --role cloud --bind "$(ep cloud)" --insecure \
    --name cloud $MASTER --node-id cloud
note "master $(ep master), cloud node $(ep cloud)"

step "Cloud prefill: the cloud model computes the document's KV once and stores it (int8)"
"$KVEDGE" -H "$(ep cloud)" prefill --weights "$WEIGHTS" --context-file "$CTX_FILE" \
    --tokens "$CTX_TOKENS" --scheme int8 | tee "$DIR/prefill.out"
# The document's last chunk (the highest chunk index) names the whole chain.
PREFIX=$("$KVEDGE" --json -H "$(ep cloud)" ls | grep -o '"prefix":"[0-9a-f]*","model":"[^"]*","chunk":[0-9]*' |
    sed 's/"prefix":"\([0-9a-f]*\)".*"chunk":\([0-9]*\)/\2 \1/' | sort -n | tail -1 | cut -d' ' -f2)
[ -n "$PREFIX" ] || { echo "demo: no context on the cloud node" >&2; exit 1; }

subscription() { # subscription FILE LAYERS: the historical-cache subscription of the document
    printf 'subscription\n    name = document\n    cloud = %s\n    prefix = %s\n    layers = %s\n' \
        "$(ep cloud)" "$PREFIX" "$2" >"$1"
}

step "Start the edge nodes: edge-b keeps the shallow layers 0-5 (it served this document before)"
subscription "$DIR/edge-b.subs" 0:6
# shellcheck disable=SC2086
start edge-b --data "$DIR/edge-b" store --role edge --bind "$(ep edge-b)" --insecure \
    --name edge-b $MASTER --node-id edge-b --subscriptions "$DIR/edge-b.subs"
# shellcheck disable=SC2086
start edge-a --data "$DIR/edge-a" store --role edge --bind "$(ep edge-a)" --insecure \
    --name edge-a $MASTER --node-id edge-a
for _ in $(seq 50); do grep -q "sync document" "$DIR/edge-b.log" && break; sleep 0.1; done
note "edge-b: $(grep -o 'sync document.*' "$DIR/edge-b.log" | head -1)"

step "Start edge-a's proxy: cloud over $CLOUD_LINK, peer edge-b over $PEER_LINK, own node as history"
note "the proxy measures each link when it connects, and learns from every fetch"
start proxy proxy --bind "$(ep proxy)" --insecure --master "$(ep master)" \
    --master-pub "$(ep master-pub)" --snapshot "$DIR/proxy.snapshot" \
    -s "cloud cloud $(ep cloud) link=$CLOUD_LINK" \
    -s "peer edge-b $(ep edge-b) link=$PEER_LINK" \
    -s "history edge-a $(ep edge-a)"
sleep 1 # the proxy's first probes and the master's directory

decode() { # decode PROMPT [EXTRA ARGS]: an edge request through the proxy
    local prompt=$1
    shift
    "$KVEDGE" -H "$(ep proxy)" decode --weights "$WEIGHTS" --context-file "$CTX_FILE" \
        --tokens "$CTX_TOKENS" --prompt "$prompt" --max-new 16 --plan-recompute "$@"
}

step "Edge request 1, compared with edge-only recomputation and cloud-only (prompt sent to the cloud)"
note "the prompt stays on edge-a: only the document's chunk ids go to the proxy"
decode "Which source does the proxy pick for a layer, and why?" --compare --cloud-link "$CLOUD_LINK"

step "Edge requests 2 and 3: other users, same document"
decode "What happens when a block arrives corrupt?"
decode "How is the user prompt kept private?" --quiet

step "edge-a's historical cache takes the deep layers 6-11 (subscription added, node restarted)"
stop edge-a
subscription "$DIR/edge-a.subs" 6:12
# shellcheck disable=SC2086
start edge-a --data "$DIR/edge-a" store --role edge --bind "$(ep edge-a)" --insecure \
    --name edge-a $MASTER --node-id edge-a --subscriptions "$DIR/edge-a.subs"
for _ in $(seq 50); do grep -q "sync document" "$DIR/edge-a.log" && break; sleep 0.1; done
note "edge-a: $(grep -o 'sync document.*' "$DIR/edge-a.log" | head -1)"
sleep 1.5 # the directory reaches the proxy

step "The cloud node goes down (SIGKILL)"
stop cloud KILL
note "cloud node killed"

step "Edge request 4 with the cloud gone: the peer and the historical cache serve it"
decode "Does the edge keep working when the network is down?"

step "Shut everything down"
for name in proxy edge-a edge-b master; do
    stop "$name"
    note "$name stopped"
done
step "Done (state in $DIR$([ -n "${KVEDGE_DEMO_DIR:-}" ] || echo ', removed'))"
