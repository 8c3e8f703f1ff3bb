#!/usr/bin/env bash
# Large-small at this machine's scale: the CE-LSLM paper's Table II (TTFT, total time, bytes
# moved, user data uploaded) for a trained pair (the Llama pair of models/kjv/llama by default,
# the OPT pair of models/kjv with BLS_PAIR=opt), with real processes as
# bench_e2e and scripts/demo.sh run them: a Storage Master, a cloud store node, a peer edge
# store node, and edge proxies with an emulated cloud link (link=RATE,LATENCY) and a LAN link
# to the peer; each request is one `kvedge -H PROXY decode` process.
#
# Modes, per context length and cloud link (medians of RUNS runs, modes interleaved):
#   edge-only    the SLM (the pair's edge model) recomputes the context (decode --compare's
#                edge_only)
#   cloud-only   the LLM (the pair's cloud model) answers: the prompt goes to the emulated cloud
#                model behind the cloud link, which holds the context's K/V (decode --compare's
#                cloud_only, with --cloud-link)
#   peer-int8    the SLM's own context K/V, prefilled int8 onto the peer edge node, fetched
#                through the proxy over the LAN
#   ce-lslm int8 / int4   the LLM's context K/V, prefilled onto the cloud node at that
#                precision; the layer map registered with the master; the SLM fetches the mapped
#                cloud layers through the proxy and adapts them (decode --adapter)
#   ce-lslm int8, planned   the same with --plan-recompute: the proxy may leave a layer to the
#                SLM when computing it is cheaper than fetching it (Eq. 19/20); BLS_PLANNED=0
#                leaves it out
#
# usage: scripts/bench_largesmall.sh [BUILD_DIR]          (default: build)
# environment: BLS_RUNS (5), BLS_CONTEXTS ("256 448": the models have 512 positions, and the
#   prompt and 32 new tokens need room), BLS_LINKS ("100mbit 1gbit"), BLS_LATENCY (10ms, one
#   way, as bench_e2e), BLS_PEER_LINK (1gbit,1ms), BLS_NEW (32), BLS_PAIR (llama or opt),
#   BLS_ADAPTER (the linear adapter of the pair's ls/ folder), BLS_MAP, BLS_OUT
#   (/tmp/kvedge-bls: raw JSON, largesmall.dat, table.md), BLS_KEEP=1 keeps the state directory.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(realpath "${1:-$ROOT/build}")
KVEDGE=$BUILD/clients/kvedge
PY=/usr/bin/python3
RUNS=${BLS_RUNS:-5}
CONTEXTS=${BLS_CONTEXTS:-"256 448"}
LINKS=${BLS_LINKS:-"100mbit 1gbit"}
LATENCY=${BLS_LATENCY:-10ms}
PEER_LINK=${BLS_PEER_LINK:-1gbit,1ms}
NEW=${BLS_NEW:-32}
case ${BLS_PAIR:-llama} in
llama) # Hugging Face folders; the tokenizer.json puts <s> first
    PAIR=$ROOT/models/kjv/llama
    CLOUD_W=$PAIR/cloud EDGE_W=$PAIR/edge TOK=$PAIR/tokenizer.json ;;
opt)
    PAIR=$ROOT/models/kjv
    CLOUD_W=$PAIR/cloud/model.safetensors EDGE_W=$PAIR/edge/model.safetensors TOK=$PAIR ;;
*) echo "bench_largesmall: BLS_PAIR is llama or opt" >&2; exit 2 ;;
esac
ADAPTER=$(realpath "${BLS_ADAPTER:-$PAIR/ls/adapter-linear.safetensors}")
MAP=$(realpath "${BLS_MAP:-$PAIR/ls/map}")
OUT=${BLS_OUT:-/tmp/kvedge-bls}
PROMPT=$'\nAnd he said unto them,'

[ -x "$KVEDGE" ] || { echo "bench_largesmall: no $KVEDGE (build first)" >&2; exit 2; }
DIR=$(mktemp -d /tmp/kvedge-bls-XXXXXX)
mkdir -p "$OUT/raw"
rm -f "$OUT"/raw/*.json

# The model ids: those the adapter names (the proxy serves the mapped layers of the cloud model
# under that id, and the map is registered under both).
read -r CLOUD_ID EDGE_ID < <("$PY" - "$ADAPTER" <<'EOF'
import json, struct, sys
with open(sys.argv[1], 'rb') as f:
    n = struct.unpack('<Q', f.read(8))[0]
    m = json.loads(f.read(n))['__metadata__']
print(m['cloud_id'], m['edge_id'])
EOF
)

declare -A PID
log() { printf 'bench_largesmall: %s\n' "$*" >&2; }

start() { # start NAME ARGS...: `kvedge ARGS...` in the background until it says it serves
    local name=$1
    shift
    "$KVEDGE" "$@" --metrics off >"$DIR/$name.log" 2>&1 &
    PID[$name]=$!
    for _ in $(seq 100); do
        grep -q -E "listening|serving" "$DIR/$name.log" 2>/dev/null && return 0
        kill -0 "${PID[$name]}" 2>/dev/null || break
        sleep 0.1
    done
    log "$name did not start; its log:"
    cat "$DIR/$name.log" >&2
    exit 1
}

stop() {
    local name=$1
    [ -n "${PID[$name]:-}" ] || return 0
    kill -TERM "${PID[$name]}" 2>/dev/null || true
    wait "${PID[$name]}" 2>/dev/null || true
    unset "PID[$name]"
}

cleanup() {
    for name in "${!PID[@]}"; do stop "$name"; done
    [ -n "${BLS_KEEP:-}" ] || rm -rf "$DIR"
}
trap cleanup EXIT

ep() { echo "ipc://$DIR/$1.sock"; }
MASTER=(--master "$(ep master)" --master-pub "$(ep master-pub)")

start master master --bind "$(ep master)" --pub "$(ep master-pub)" --data "$DIR/master" \
    --insecure --log-level error
start cloud --data "$DIR/cloud" store --role cloud --bind "$(ep cloud)" --insecure \
    --name cloud "${MASTER[@]}" --node-id cloud --log-level error
start peer --data "$DIR/peer" store --role edge --bind "$(ep peer)" --insecure \
    --name peer "${MASTER[@]}" --node-id peer --log-level error

# The layer map, under the adapter's ids (the master learns the models at the nodes' next
# directory publication; proxies use the map once both are known).
"$KVEDGE" layermap --show "$MAP" --cloud-id "$CLOUD_ID" --edge-id "$EDGE_ID" \
    --register "$(ep master)" --master-pub "$(ep master-pub)" >"$DIR/register.out" 2>&1 ||
    { cat "$DIR/register.out" >&2; exit 1; }

# prefill NODE WEIGHTS ID CTXFILE TOKENS SCHEME
prefill() {
    "$KVEDGE" -H "$(ep "$1")" prefill --weights "$2" --model-id "$3" --tokenizer "$TOK" \
        --file "$4" --tokens "$5" --scheme "$6" --pin >>"$DIR/prefill.out"
}

# proxy NAME SPECS...: a fresh proxy (its own link estimates) joined to the master
proxy() {
    local name=$1
    shift
    local args=()
    for s in "$@"; do args+=(-s "$s"); done
    start "$name" proxy --bind "$(ep "$name")" --insecure "${MASTER[@]}" --id "$name" \
        --cert "$DIR/$name.cert" --log-level error "${args[@]}"
    sleep 1 # the first probes, and the registry's models and map
}

# decode TAG PROXY WEIGHTS ID CTXFILE TOKENS [ARGS...]: one request, its JSON kept as TAG.json
decode() {
    local tag=$1 px=$2 w=$3 id=$4 cf=$5 n=$6
    shift 6
    "$KVEDGE" -H "$(ep "$px")" decode --weights "$w" --model-id "$id" --tokenizer "$TOK" \
        --file "$cf" --tokens "$n" --prompt "$PROMPT" --max-new "$NEW" --json -q "$@" \
        >"$OUT/raw/$tag.json" 2>"$DIR/$tag.err" ||
        { log "$tag failed:"; cat "$DIR/$tag.err" >&2; exit 1; }
}

# The proxies must know the SLM's model record before any node holds its context: a node
# registers the models it holds with the master, so the peer gets a few tokens of unrelated
# text under the SLM's id (no chunk of any measured context).
echo "In the beginning God created the heaven and the earth." >"$DIR/seed.txt"
prefill peer "$EDGE_W" "$EDGE_ID" "$DIR/seed.txt" 8 int8

# One held-out chapter per context length (no chunk is shared between two lengths).
chapter=1
for n in $CONTEXTS; do
    cf="$DIR/context-$n.txt"
    while :; do
        awk -v k="$chapter" 'BEGIN { RS = "" } NR == k { print; exit }' \
            "$ROOT/models/kjv/heldout.txt" >"$cf"
        chapter=$((chapter + 1))
        [ "$(wc -c <"$cf")" -ge $((n * 5)) ] && break # about 4 bytes a token: room to spare
        [ -s "$cf" ] || { log "no chapter long enough for $n tokens"; exit 1; }
    done
    log "context $n tokens: $(head -c 60 "$cf" | tr '\n' ' ')..."
done

uptime >"$OUT/uptime.before"
for n in $CONTEXTS; do
    cf="$DIR/context-$n.txt"
    # 1. CE-LSLM: the LLM's context on the cloud node, int8 then int4; the peer holds nothing
    #    of this context yet, so every layer the SLM does not compute comes from the cloud.
    for scheme in int8 int4; do
        prefill cloud "$CLOUD_W" "$CLOUD_ID" "$cf" "$n" "$scheme"
        for link in $LINKS; do
            proxy "px-$scheme-$link" "cloud cloud $(ep cloud) link=$link,$LATENCY"
            for r in $(seq "$RUNS"); do
                decode "$n-$link-ce-$scheme-$r" "px-$scheme-$link" "$EDGE_W" "$EDGE_ID" "$cf" \
                    "$n" --adapter "$ADAPTER"
                if [ "$scheme" = int8 ] && [ "${BLS_PLANNED:-1}" = 1 ]; then
                    decode "$n-$link-ce-plan-$r" "px-$scheme-$link" "$EDGE_W" "$EDGE_ID" \
                        "$cf" "$n" --adapter "$ADAPTER" --plan-recompute
                fi
            done
            stop "px-$scheme-$link"
        done
    done
    # 2. The SLM's own context int8 on the peer; edge-only and cloud-only beside it.
    prefill peer "$EDGE_W" "$EDGE_ID" "$cf" "$n" int8
    for link in $LINKS; do
        proxy "px-peer-$link" "cloud cloud $(ep cloud) link=$link,$LATENCY" \
            "peer peer $(ep peer) link=$PEER_LINK"
        for r in $(seq "$RUNS"); do
            decode "$n-$link-peer-$r" "px-peer-$link" "$EDGE_W" "$EDGE_ID" "$cf" "$n"
            decode "$n-$link-edgecmp-$r" "px-peer-$link" "$EDGE_W" "$EDGE_ID" "$cf" "$n" \
                --compare --cloud-link "$link,$LATENCY"
            decode "$n-$link-cloudcmp-$r" "px-peer-$link" "$CLOUD_W" "$CLOUD_ID" "$cf" "$n" \
                --compare --cloud-link "$link,$LATENCY"
        done
        stop "px-peer-$link"
    done
done
uptime >"$OUT/uptime.after"

# Medians per (context, link, mode): a markdown table on stdout, largesmall.dat for the plot.
"$PY" - "$OUT" "$CONTEXTS" "$LINKS" <<'EOF'
import glob, json, os, statistics, sys
out, contexts, links = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
modes = [("edge-only", "edgecmp", "edge_only"), ("cloud-only", "cloudcmp", "cloud_only"),
         ("peer-int8", "peer", "kvedge"), ("ce-lslm int8", "ce-int8", "kvedge"),
         ("ce-lslm int4", "ce-int4", "kvedge"),
         ("ce-lslm int8, planned", "ce-plan", "kvedge")]
def runs(n, link, tag, key):
    got = []
    for p in sorted(glob.glob(f"{out}/raw/{n}-{link}-{tag}-*.json")):
        with open(p) as f:
            j = json.load(f)
        got.append(j[key] if key in j else j)
    return got
med = lambda xs: statistics.median(xs) if xs else float("nan")
rows = []
print("| context | cloud link | mode | TTFT ms | total ms | layers fetched / adapted / computed "
      "| bytes edge↔cloud | bytes edge↔peer | prompt bytes uploaded | runs |")
print("|---:|---|---|---:|---:|---|---:|---:|---:|---:|")
for n in contexts:
    for link in links:
        for name, tag, key in modes:
            rs = runs(n, link, tag, key)
            if not rs:
                continue
            ttft = med([r["ttft_ms"] for r in rs])
            total = med([r["total_ms"] for r in rs])
            moved = med([r["sent_bytes"] + r["received_bytes"] for r in rs])
            prompt = med([r["prompt_bytes_sent"] for r in rs])
            r0 = rs[0]
            if name == "edge-only":
                layers, cloud_b, peer_b = f"0 / 0 / {r0['layers']}", 0, 0
            elif name == "cloud-only":
                layers, cloud_b, peer_b = "-", moved, 0
            else:
                layers = f"{r0['fetched']} / {r0.get('adapted', 0)} / {r0['computed']}"
                cloud_b, peer_b = (0, moved) if name == "peer-int8" else (moved, 0)
            cloud_t = f"{cloud_b:.0f}"
            if name != "edge-only" and name != "cloud-only" and r0["fetched"] == 0:
                cloud_b = 0  # nothing fetched: only the FETCH and its plan, with the proxy
                cloud_t = f"0 ({moved:.0f} with the proxy)"
            print(f"| {n} | {link}, 10 ms | {name} | {ttft:.1f} | {total:.1f} | {layers} | "
                  f"{cloud_t} | {peer_b:.0f} | {prompt:.0f} | {len(rs)} |")
            rows.append((n, link, name, ttft, total, cloud_b, peer_b, prompt))
# Wide form for the plot: one line per mode, TTFT and total per (context, link).
cols = [(n, link) for n in contexts for link in links]
with open(os.path.join(out, "largesmall_wide.dat"), "w") as f:
    f.write("mode " + " ".join(f"{n}tok,{l}" for n, l in cols) + " "
            + " ".join(f"{n}tok,{l}" for n, l in cols) + "\n")
    for name, _, _ in modes:
        got = {(n, l): (t, tot) for n, l, m, t, tot, *_ in rows if m == name}
        if not got:
            continue
        nan = (float("nan"), float("nan"))
        f.write('"' + name + '" ' + " ".join(f"{got.get(c, nan)[0]:.3f}" for c in cols) + " "
                + " ".join(f"{got.get(c, nan)[1]:.3f}" for c in cols) + "\n")
with open(os.path.join(out, "largesmall.dat"), "w") as f:
    f.write("# context link mode ttft_ms total_ms bytes_cloud bytes_peer prompt_bytes\n")
    for n, link, name, ttft, total, cb, pb, pr in rows:
        f.write(f"{n} {link} {name.replace(' ', '_')} {ttft:.3f} {total:.3f} {cb:.0f} {pb:.0f} "
                f"{pr:.0f}\n")
EOF
log "load before: $(cat "$OUT/uptime.before")"
log "load after:  $(cat "$OUT/uptime.after")"
