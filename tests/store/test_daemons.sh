#!/usr/bin/env bash
# What an operator sees of the daemons, with real processes on loopback: a second node, master
# or proxy whose port is taken fails at once, names the flag that moves it and creates nothing;
# a node or a plaintext proxy pointed at a CURVE master without --master-key says so (the
# node in top --json and its log, the proxy on /ready and in its log); both nodes see the master's
# SIGKILL (top --json, /metrics, one log line) and its return; the restarted master exports
# kvedge_master_peer_state for the nodes that registered with its previous run; every log line
# names its daemon.
# Usage: test_daemons.sh KVEDGE_BINARY
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../common/wait.sh
. "$(dirname "$0")/../common/wait.sh"
kv=${1:?usage: test_daemons.sh KVEDGE_BINARY}
[ -x "$kv" ] || { echo "FAIL: $kv is not executable" >&2; exit 1; }
command -v python3 >/dev/null || { echo "FAIL: python3 is not installed" >&2; exit 1; }
command -v curl >/dev/null || { echo "FAIL: curl is not installed" >&2; exit 1; }

fail() {
    echo "FAIL: $*" >&2
    exit 1
}
step() { echo "== $*"; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvedge-daemons.XXXXXX")
pids=()
cleanup() {
    {
        for p in "${pids[@]}"; do
            kill -9 "$p" || true
        done
        wait || true
    } 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
cd "$tmp" # what a daemon writes relative to its working directory stays here

# N free loopback TCP ports, one per line.
free_ports() {
    python3 - "$1" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print("\n".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# Starts a daemon in the background (stdout NAME.out, stderr NAME.err) and waits for its
# "listening" line.
start() {
    local name=$1
    shift
    "$kv" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    local pid=$!
    pids+=("$pid")
    echo "$pid" >"$tmp/$name.pid"
    wait_until "$KT_WAIT_S" listening_or_gone "$tmp/$name.out" "$pid" ||
        { cat "$tmp/$name.err" >&2; fail "$name not listening"; }
    grep -q '^listening ' "$tmp/$name.out" || { cat "$tmp/$name.err" >&2; fail "$name exited"; }
}
# Whether the daemon writing to $1 says it is listening, or its process $2 is gone.
listening_or_gone() {
    grep -q '^listening ' "$1" || ! kill -0 "$2" 2>/dev/null
}

# Runs a daemon that must refuse to start: its exit code (non-zero) and stderr in NAME.err.
refused() {
    local name=$1
    shift
    local rc=0
    timeout 10 "$kv" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" || rc=$?
    [ "$rc" -ne 0 ] || fail "$name started although its address is taken"
    [ "$rc" -ne 124 ] || fail "$name did not exit within 10 s"
    [ "$rc" -eq 5 ] || fail "$name exited $rc, not 5 (unavailable): $(cat "$tmp/$name.err")"
}

# Polls until the command succeeds: $1 seconds (what an idle machine needs) plus KT_SLACK_S.
wait_for() {
    local secs=$(($1 + KT_SLACK_S)) what=$2
    shift 2
    wait_until "$secs" "$@" || fail "$what (not within $secs s)"
}

# The master object of a node's MONITOR document, one field.
master_field() {
    "$kv" -H "$1" top --json 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["master"][sys.argv[1]])' "$2"
}
master_state_is() { [ "$(master_field "$1" state)" = "$2" ]; }
metric_is() { # whole output first: grep -q would close the pipe under curl (pipefail)
    local body
    body=$(curl -s "http://$1/metrics") && grep -qx -- "$2" <<<"$body"
}

mapfile -t P < <(free_ports 14)
M_EP=tcp://127.0.0.1:${P[0]}
M_PUB=tcp://127.0.0.1:${P[1]}
M_HTTP=127.0.0.1:${P[2]}
N1_EP=tcp://127.0.0.1:${P[3]}
N1_HTTP=127.0.0.1:${P[4]}
N2_EP=tcp://127.0.0.1:${P[5]}
N2_HTTP=127.0.0.1:${P[6]}
PX_EP=tcp://127.0.0.1:${P[7]}
PX_HTTP=127.0.0.1:${P[8]}
CM_EP=tcp://127.0.0.1:${P[9]}
CM_PUB=tcp://127.0.0.1:${P[10]}
N3_EP=tcp://127.0.0.1:${P[11]}
CPX_EP=tcp://127.0.0.1:${P[12]}
CPX_HTTP=127.0.0.1:${P[13]}

master_args=(master --data "$tmp/master" --insecure --bind "$M_EP" --pub "$M_PUB" --metrics "$M_HTTP")
node_args() { # ID BIND HTTP
    echo --data "$tmp/$1" store --insecure --bind "$2" --metrics "$3" --master "$M_EP" \
        --master-pub "$M_PUB" --node-id "$1"
}

step "a master and two nodes; every log line names its daemon"
start master "${master_args[@]}"
# shellcheck disable=SC2046
start n1 $(node_args n1 "$N1_EP" "$N1_HTTP")
# shellcheck disable=SC2046
start n2 $(node_args n2 "$N2_EP" "$N2_HTTP")
wait_for 10 "n1 registered" master_state_is "$N1_EP" registered
wait_for 10 "n2 registered" master_state_is "$N2_EP" registered
grep -q ' \[n1\] serving .* as edge node "n1"' "$tmp/n1.err" ||
    fail "n1's lines do not carry its id: $(head -2 "$tmp/n1.err")"
grep -q ' \[master\] master serving' "$tmp/master.err" ||
    fail "the master's lines do not say master: $(head -2 "$tmp/master.err")"
[ "$(grep -vc '\] ' "$tmp/n1.err" || true)" = 0 ] || fail "a line of n1 without its name"

step "a second node on a taken metrics port fails before it creates its store"
refused n1b --data "$tmp/n1b" store --insecure --bind "tcp://127.0.0.1:*" --metrics "$N1_HTTP" \
    --master "$M_EP" --master-pub "$M_PUB" --node-id n1b
grep -q "cannot bind: Address already in use" "$tmp/n1b.err" || fail "n1b: $(cat "$tmp/n1b.err")"
grep -q -- "--metrics HOST:PORT" "$tmp/n1b.err" || fail "n1b names no flag: $(cat "$tmp/n1b.err")"
grep -q -- "--metrics off" "$tmp/n1b.err" || fail "n1b: $(cat "$tmp/n1b.err")"
[ ! -e "$tmp/n1b" ] || fail "n1b created its store $tmp/n1b although it could not start"
"$kv" master-dump --master "$M_EP" --pub "$M_PUB" >"$tmp/dump.txt" || fail "master-dump failed"
grep -q "node/n1 " "$tmp/dump.txt" || fail "master-dump shows no node/n1: $(head -5 "$tmp/dump.txt")"
! grep -q "n1b" "$tmp/dump.txt" || fail "n1b registered with the master although it could not start"

step "a second node on a taken endpoint names --bind"
refused n1c --data "$tmp/n1c" store --insecure --bind "$N1_EP" --metrics off
grep -q "cannot bind: Address already in use" "$tmp/n1c.err" || fail "n1c: $(cat "$tmp/n1c.err")"
grep -q -- "--bind tcp://HOST:PORT" "$tmp/n1c.err" || fail "n1c names no flag: $(cat "$tmp/n1c.err")"
[ ! -e "$tmp/n1c" ] || fail "n1c created its store"

step "a second node on an ipc path another node serves is refused (libzmq would take it over)"
start ipc1 --data "$tmp/ipc1" store --insecure --bind "ipc://$tmp/node.ipc" --metrics off
refused ipc2 --data "$tmp/ipc2" store --insecure --bind "ipc://$tmp/node.ipc" --metrics off
grep -q "already in use" "$tmp/ipc2.err" || fail "ipc2: $(cat "$tmp/ipc2.err")"
[ ! -e "$tmp/ipc2" ] || fail "ipc2 created its store"
"$kv" -H "ipc://$tmp/node.ipc" stat >/dev/null || fail "the first node no longer answers on its path"

step "a second master on the same ports fails before it creates its registry"
refused master2 master --data "$tmp/master2" --insecure --bind "$M_EP" --pub "tcp://127.0.0.1:*" \
    --metrics off
grep -q -- "--bind tcp://HOST:PORT" "$tmp/master2.err" || fail "master2: $(cat "$tmp/master2.err")"
refused master3 master --data "$tmp/master3" --insecure --bind "tcp://127.0.0.1:*" \
    --pub "tcp://127.0.0.1:*" --metrics "$M_HTTP"
grep -q -- "--metrics HOST:PORT" "$tmp/master3.err" || fail "master3: $(cat "$tmp/master3.err")"
for d in master2 master3; do
    [ ! -e "$tmp/$d" ] || fail "the refused $d created its registry"
done

step "a second proxy on a taken port fails and names the flag"
start proxy proxy --insecure --bind "$PX_EP" --metrics "$PX_HTTP" --id px1 --source "cloud n1 $N1_EP"
refused proxy2 proxy --insecure --bind "$PX_EP" --metrics off --id px2 --source "cloud n1 $N1_EP"
grep -q -- "--bind tcp://HOST:PORT" "$tmp/proxy2.err" || fail "proxy2: $(cat "$tmp/proxy2.err")"
refused proxy3 proxy --insecure --bind "tcp://127.0.0.1:*" --metrics "$PX_HTTP" --id px3 \
    --source "cloud n1 $N1_EP"
grep -q -- "--metrics HOST:PORT" "$tmp/proxy3.err" || fail "proxy3: $(cat "$tmp/proxy3.err")"
grep -q ' \[px1\] ' "$tmp/proxy.err" || fail "the proxy's lines do not carry its id"

step "the master SIGKILLed: both nodes say lost (top --json, /metrics, one log line)"
{
    kill -9 "$(cat "$tmp/master.pid")"
    wait "$(cat "$tmp/master.pid")" || true
} 2>/dev/null
t0=$SECONDS
wait_for 10 "n1 reports the master lost" master_state_is "$N1_EP" lost
wait_for 10 "n2 reports the master lost" master_state_is "$N2_EP" lost
echo "   lost after $((SECONDS - t0)) s"
[ "$(master_field "$N1_EP" reachable)" = False ] || fail "n1: reachable while the master is gone"
master_field "$N1_EP" why | grep -q "nothing heard from the master" || fail "n1: $(master_field "$N1_EP" why)"
metric_is "$N1_HTTP" "kvedge_node_master_registered 0" || fail "n1 /metrics: still registered"
metric_is "$N1_HTTP" "kvedge_node_master_reachable 0" || fail "n1 /metrics: still reachable"
metric_is "$N2_HTTP" "kvedge_node_master_reachable 0" || fail "n2 /metrics: still reachable"
ready=$(curl -s -o /dev/null -w '%{http_code}' "http://$N1_HTTP/ready")
[ "$ready" = 200 ] || fail "n1 /ready answers $ready with the master lost: it serves as before"

step "the master back on the same registry: both nodes registered again"
start master "${master_args[@]}"
wait_for 15 "n1 registered again" master_state_is "$N1_EP" registered
wait_for 15 "n2 registered again" master_state_is "$N2_EP" registered
metric_is "$N1_HTTP" "kvedge_node_master_registered 1" || fail "n1 /metrics: not registered"
metric_is "$N1_HTTP" "kvedge_node_master_reachable 1" || fail "n1 /metrics: not reachable"
for n in n1 n2; do
    [ "$(grep -c 'master lost' "$tmp/$n.err")" = 1 ] ||
        fail "$n: 'master lost' logged $(grep -c 'master lost' "$tmp/$n.err") times, not once"
    [ "$(grep -c "is back: registered as $n" "$tmp/$n.err")" = 1 ] ||
        fail "$n: the master's return not logged once: $(cat "$tmp/$n.err")"
done
# Both peers registered with the previous run and only heartbeat now: exported all the same.
wait_for 10 "the restarted master exports n1's state" metric_is "$M_HTTP" 'kvedge_master_peer_state{id="n1"} 1'
wait_for 10 "the restarted master exports n2's state" metric_is "$M_HTTP" 'kvedge_master_peer_state{id="n2"} 1'

step "a node pointed at a CURVE master without --master-key says so"
start curvemaster master --data "$tmp/cmaster" --bind "$CM_EP" --pub "$CM_PUB" --metrics off
start n3 --data "$tmp/n3" store --insecure --bind "$N3_EP" --metrics off --master "$CM_EP" \
    --master-pub "$CM_PUB" --node-id n3
why_has_key() { master_field "$N3_EP" why | grep -q -- "requires CURVE.*--master-key"; }
wait_for 15 "n3 says the master requires CURVE" why_has_key
[ "$(master_field "$N3_EP" state)" = failing ] || fail "n3: $(master_field "$N3_EP" state)"
wait_for 5 "n3's log says the master requires CURVE" grep -q "requires CURVE.*--master-key" "$tmp/n3.err"

step "a plaintext proxy pointed at a CURVE master says so on /ready"
start cproxy proxy --insecure --bind "$CPX_EP" --metrics "$CPX_HTTP" --id cpx \
    --cert "$tmp/cpx.cert" --master "$CM_EP" --master-pub "$CM_PUB"
ready_has_key() { curl -s "http://$CPX_HTTP/ready" | grep -q -- "requires CURVE.*--master-key"; }
wait_for 15 "the proxy's /ready says the master requires CURVE" ready_has_key

echo "PASS"
