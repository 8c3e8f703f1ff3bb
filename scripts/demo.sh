#!/usr/bin/env bash
# The main job: writes synthetic KV caches for real model shapes into an embedded store in
# ./data (what a cloud prefill will put once the cloud-edge path lands), reads every block
# back with checksum verification, and prints the inspection table.
set -euo pipefail
KVEDGE=${1:-build/clients/kvedge}
export KVEDGE_DATA=${KVEDGE_DATA:-./data}

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "OPT-1.3B (24 layers x 32 heads x 64), 1024-token context, int8 (keys per channel)"
"$KVEDGE" put-synthetic --model opt-1.3b --tokens 1024 --scheme int8 --seed 1

step "Llama-2-7B (32 layers x 32 heads x 128), 512 tokens, int4 KIVI g32, ThinK keeps 96/128 key channels"
"$KVEDGE" put-synthetic --model llama-2-7b --tokens 512 --scheme int4 --keep-channels 96 --seed 2

step "OPT-1.3B system prompt, 256 tokens, lossless, pinned (what an edge's historical cache holds)"
out=$("$KVEDGE" put-synthetic --model opt-1.3b --tokens 256 --scheme lossless --seed 3 --pin)
echo "$out"
prefix=$(echo "$out" | awk '/^prefix/ {print $2}')

step "Read every block back and verify its checksum"
"$KVEDGE" verify

step "Inspect the store"
"$KVEDGE" inspect

step "Prefix chunks"
"$KVEDGE" ls

step "Layer 0 of the pinned prefix"
"$KVEDGE" show "${prefix:0:12}" --layer 0 | head -n 12
echo "..."
echo
echo "store: $KVEDGE_DATA   (try: $KVEDGE --data $KVEDGE_DATA --help)"
