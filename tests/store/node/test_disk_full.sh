#!/usr/bin/env bash
# A store node on a disk that fills (a 48 MiB tmpfs): block writes are refused with "no space
# left on the store's disk" before RocksDB meets a full disk, said once in the log with the path
# and free space and in /metrics; reads go on; deleting frees space and writes go again; a
# clean stop and a restart work with the disk full (another file took the last byte); an
# offline evict works there too; and --capacity bounds RocksDB's files on disk, WAL included.
# Real processes over an ipc endpoint; skips (77) where a tmpfs cannot be mounted.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../../common/wait.sh
. "$(dirname "$0")/../../common/wait.sh"
K=$1
T=$(mktemp -d /tmp/kvedge-diskfull-XXXXXX)
M=$T/disk
NODE_PID=
fail() {
    echo "FAIL: $*" >&2
    [ -f "$T/node.log" ] && { echo "--- node log" >&2; tail -20 "$T/node.log" >&2; }
    exit 1
}
cleanup() {
    if [ -n "$NODE_PID" ]; then
        kill -9 "$NODE_PID" 2>/dev/null || true
        wait "$NODE_PID" 2>/dev/null || true
    fi
    [ -n "${KEEP:-}" ] && { echo "kept: $T (umount $M when done)" >&2; return; }
    umount "$M" 2>/dev/null || true
    rm -rf "$T"
}
trap cleanup EXIT # KEEP=1: the node is stopped, the tmpfs and logs are left for a look
mkdir -p "$M"
if ! mount -t tmpfs -o size=48m tmpfs "$M" 2>/dev/null; then
    echo "SKIP: cannot mount a tmpfs (needs root)"
    exit 77
fi
EP=ipc://$T/node.sock
STORE=$M/store

# Polls a command (quietly) until it succeeds, at most KT_WAIT_S.
quiet() { "$@" >/dev/null 2>&1; }
wait_for() { wait_until "$KT_WAIT_S" quiet "$@"; }
start_node() {
    "$K" --data "$STORE" store --insecure --bind "$EP" --metrics 127.0.0.1:0 "$@" \
        >>"$T/node.log" 2>&1 &
    NODE_PID=$!
    wait_for "$K" -H "$EP" ping --count 1 || fail "node did not start"
}
# Stops the node with SIGTERM and checks it exits 0.
stop_node() {
    kill -TERM "$NODE_PID"
    local rc=0
    wait "$NODE_PID" || rc=$?
    NODE_PID=
    [ "$rc" -eq 0 ] || fail "node exited $rc on SIGTERM"
    ! grep -q "Assertion" "$T/node.log" || fail "RocksDB assertion on stop"
}
metric() { # NAME: its value on the node's /metrics
    local url
    url=$(grep -o 'metrics on http://[0-9.:]*' "$T/node.log" | tail -1 | sed 's/metrics on //')
    curl -sf "$url/metrics" | awk -v n="$1" '$1 == n { print $2 }'
}
put() { "$K" -H "$EP" put-synthetic --model opt-125m --tokens 256 --scheme lossless --seed "$1"; }
# The first chunk held whole (a refused put leaves its chunk partly stored).
first_prefix() {
    "$K" -H "$EP" --json ls | python3 -c '
import json, sys
print([c for c in json.load(sys.stdin) if c["blocks"] == 144][0]["prefix"][:16])'
}

# ---- fill the disk
start_node
refused=0
for i in $(seq 1 12); do
    if ! put "$i" >"$T/put.out" 2>"$T/put.err"; then
        grep -q "no space left on the store's disk" "$T/put.err" ||
            fail "put $i failed otherwise: $(cat "$T/put.err")"
        refused=$((refused + 1))
    fi
done
[ "$refused" -ge 2 ] || fail "a 48 MiB disk took 12 x 9 MiB ($refused refused)"
n_warn=$(grep -c "disk full: store $STORE has .* MiB free of .* MiB" "$T/node.log" || true)
[ "$n_warn" -eq 1 ] || fail "expected one disk-full warning for $refused refusals, got $n_warn"
! grep -q "No space left on device" "$STORE/LOG" || fail "RocksDB met the full disk"
[ "$(metric kvedge_node_disk_full)" = 1 ] || fail "kvedge_node_disk_full is not 1"
[ "$(metric kvedge_node_disk_refused_writes_total)" -ge 1 ] || fail "no refused writes counted"

# ---- reads go on
P=$(first_prefix) || fail "ls on a full disk"
"$K" -H "$EP" show "$P" --layer 11 >"$T/show.out" || fail "show on a full disk"
[ "$(grep -c ' ok$' "$T/show.out")" -eq 12 ] || fail "layer 11 is not served whole on a full disk"

# ---- deleting frees space; writes go again
for _ in 1 2 3; do
    "$K" -H "$EP" delete "$(first_prefix)" >/dev/null || fail "delete on a full disk"
done
# (a compaction drops the deleted blocks' blob files; RocksDB unlinks them as it finishes)
wait_for put 100 || fail "no put after deleting three chunks"
grep -q "disk has room again" "$T/node.log" || fail "no 'room again' line"
[ "$(metric kvedge_node_disk_full)" = 0 ] || fail "kvedge_node_disk_full stays 1"

# ---- a clean stop with the disk full (another file takes the last byte), and a restart
put 101 >/dev/null 2>&1 || true
dd if=/dev/zero of="$M/filler" bs=64k status=none 2>/dev/null || true
[ "$(df --output=avail "$M" | tail -1)" -lt 256 ] || fail "the filler left room"
stop_node
start_node
"$K" -H "$EP" show "$(first_prefix)" --layer 11 >"$T/show.out" || fail "no read after restart"
[ "$(grep -c ' ok$' "$T/show.out")" -eq 12 ] || fail "layer 11 is not served whole after restart"
"$K" -H "$EP" delete "$(first_prefix)" >/dev/null || fail "delete after restart on a full disk"
stop_node

# ---- offline evict on the full disk
"$K" --data "$STORE" evict --to 4M >/dev/null || fail "offline evict on a full disk"
"$K" --data "$STORE" verify >/dev/null || fail "verify after evict"
rm -f "$M/filler"

# ---- --capacity bounds RocksDB's files on disk, the WAL included
rm -rf "$STORE"
: >"$T/node.log"
start_node --capacity 20M
for i in $(seq 1 8); do
    put "$i" >/dev/null 2>"$T/put.err" || fail "put $i under --capacity 20M: $(cat "$T/put.err")"
done
files=$(find "$STORE" -maxdepth 1 \( -name '*.sst' -o -name '*.blob' -o -name '*.log' \) \
    -printf '%s\n' | awk '{ s += $1 } END { print s }')
[ "$files" -le $((20 * 1048576)) ] || fail "RocksDB's files take $files bytes, over --capacity 20M"
stop_node
echo "1 passed, 0 failed"
