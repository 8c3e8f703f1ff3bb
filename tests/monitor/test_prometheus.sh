#!/usr/bin/env bash
# A real Prometheus scraping real daemons: a Storage Master, a cloud node, an edge node and an
# edge proxy, each with its /metrics on a loopback port; a few fetches through the proxy; then
# Prometheus's HTTP API must show every target up and the proxy's fetch counter moved, and
# promtool must accept every daemon's exposition. Also: /health, /ready, 404, 405, and a
# metrics address that cannot be bound failing the start with the address named.
# Usage: test_prometheus.sh KVEDGE_BIN
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../common/wait.sh
. "$(dirname "$0")/../common/wait.sh"

KVEDGE=${1:?usage: test_prometheus.sh KVEDGE_BIN}
for tool in prometheus promtool curl; do
    command -v "$tool" >/dev/null || {
        echo "test_prometheus: $tool is missing: run scripts/setup.sh" >&2
        exit 1
    }
done

DIR=$(mktemp -d /tmp/kvedge-prom.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT
fail() {
    echo "test_prometheus: $*" >&2
    for f in "$DIR"/*.log; do
        echo "--- $f" >&2
        tail -20 "$f" >&2
    done
    exit 1
}

# A free loopback TCP port (nothing answers on it now).
free_port() {
    local p
    for _ in $(seq 100); do
        p=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || {
            echo "$p"
            return
        }
    done
    fail "no free port"
}

# start NAME ARGS...: a daemon in the background, its stderr+stdout in NAME.log; waits until it
# logs its metrics URL and sets PORT (not in a subshell: PIDS must keep the pid for cleanup).
start() {
    local name=$1
    shift
    "$KVEDGE" "$@" >"$DIR/$name.log" 2>&1 &
    PIDS+=($!)
    wait_until "$KT_WAIT_S" started_or_gone "$DIR/$name.log" "${PIDS[-1]}" ||
        fail "$name did not start its metrics endpoint"
    grep -q 'metrics on http://127.0.0.1:' "$DIR/$name.log" || fail "$name exited"
    PORT=$(grep -o 'metrics on http://127.0.0.1:[0-9]*' "$DIR/$name.log" | head -1 | sed 's/.*://')
}
# Whether the daemon logging to $1 has logged its metrics URL, or its process $2 is gone.
started_or_gone() {
    grep -q 'metrics on http://127.0.0.1:' "$1" || ! kill -0 "$2" 2>/dev/null
}

ep() { echo "ipc://$DIR/$1.sock"; }
MASTER=(--master "$(ep master)" --master-pub "$(ep master-pub)")

start master master --insecure --bind "$(ep master)" --pub "$(ep master-pub)" \
    --data "$DIR/master" --metrics 127.0.0.1:0
M_PORT=$PORT
start cloud --data "$DIR/cloud" store --role cloud --insecure --bind "$(ep cloud)" \
    "${MASTER[@]}" --node-id cloud --metrics 127.0.0.1:0
C_PORT=$PORT
start edge --data "$DIR/edge" store --role edge --insecure --bind "$(ep edge)" \
    "${MASTER[@]}" --node-id edge --metrics 127.0.0.1:0
E_PORT=$PORT
start proxy proxy --insecure --bind "$(ep proxy)" "${MASTER[@]}" \
    --source "cloud cloud $(ep cloud)" --source "local edge $(ep edge)" --metrics 127.0.0.1:0
P_PORT=$PORT
echo "metrics: master $M_PORT, cloud $C_PORT, edge $E_PORT, proxy $P_PORT"

# ---------------------------------------------------------------- the endpoints themselves
for port in "$M_PORT" "$C_PORT" "$E_PORT" "$P_PORT"; do
    [ "$(curl -s "http://127.0.0.1:$port/health")" = "ok" ] || fail "/health on $port"
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/nope")" = 404 ] ||
        fail "unknown path on $port is not 404"
    [ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$port/metrics")" = 405 ] ||
        fail "POST on $port is not 405"
done
ctype=$(curl -s -o /dev/null -w '%{content_type}' "http://127.0.0.1:$C_PORT/metrics")
case "$ctype" in text/plain*version=0.0.4*) ;; *) fail "content type '$ctype'" ;; esac
# Readiness: nodes are ready once registered with the master.
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/ready")" = 200 ]; }
for port in "$C_PORT" "$E_PORT"; do
    wait_until "$KT_WAIT_S" ready "$port" || fail "node on $port not ready"
    [ "$(curl -s "http://127.0.0.1:$port/ready")" = "ready" ] || fail "node on $port not ready"
done

# ---------------------------------------------------------------- traffic
"$KVEDGE" -H "$(ep cloud)" --json put-synthetic --model opt-125m --tokens 512 >/dev/null
# `ls --full`: PREFIX MODEL CHUNK ... per chunk; the chain in chunk order, comma-separated.
CHAIN=$("$KVEDGE" -H "$(ep cloud)" ls --full | awk 'NR > 1 { print $3, $1 }' | sort -n |
    cut -d' ' -f2 | paste -sd, -)
[ -n "$CHAIN" ] || fail "no chunks on the cloud node"
# The proxy serves the chain once its view of the master has the cloud node's directory.
fetched() {
    "$KVEDGE" -H "$(ep proxy)" fetch --model opt-125m --chunks "$CHAIN" >"$DIR/fetch.out" 2>&1 &&
        grep -q "12 layers delivered" "$DIR/fetch.out"
}
wait_until "$KT_WAIT_S" fetched || true
grep -q "12 layers delivered" "$DIR/fetch.out" || fail "fetch: $(cat "$DIR/fetch.out")"
fetches_ok() { # the proxy's count of fetches that ended OK, from its /metrics
    curl -s "http://127.0.0.1:$P_PORT/metrics" |
        sed -n 's/^kvedge_proxy_fetches_total{status="OK"} \([0-9]*\)$/\1/p'
}
before=$(fetches_ok)
[ -n "$before" ] && [ "$before" -ge 1 ] || fail "no fetch counted after a delivered fetch"
for _ in 1 2 3; do "$KVEDGE" -H "$(ep proxy)" fetch --model opt-125m --chunks "$CHAIN" >/dev/null; done
after=$((before + 3))

# ---------------------------------------------------------------- promtool lints every daemon
for port in "$M_PORT" "$C_PORT" "$E_PORT" "$P_PORT"; do
    curl -s "http://127.0.0.1:$port/metrics" >"$DIR/metrics-$port.txt"
    promtool check metrics <"$DIR/metrics-$port.txt" || fail "promtool rejects the metrics on $port"
done
grep -q "^kvedge_proxy_fetches_total{status=\"OK\"} $after\$" "$DIR/metrics-$P_PORT.txt" ||
    fail "the proxy did not count 3 more fetches ($before before): $(grep fetches_total \
        "$DIR/metrics-$P_PORT.txt")"
grep -q '^kvedge_node_requests_total{op="GET_LAYER",status="OK"} [1-9]' \
    "$DIR/metrics-$C_PORT.txt" || fail "the cloud node counted no GET_LAYER"
grep -q '^kvedge_node_hot_prefix_accesses{rank="1",' "$DIR/metrics-$C_PORT.txt" ||
    fail "the cloud node shows no hot prefix"

# ---------------------------------------------------------------- a real Prometheus
cat >"$DIR/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: kvedge
    static_configs:
      - targets: ['127.0.0.1:$M_PORT', '127.0.0.1:$C_PORT', '127.0.0.1:$E_PORT', '127.0.0.1:$P_PORT']
EOF
promtool check config "$DIR/prometheus.yml" >/dev/null || fail "promtool rejects the config"
# A port found free may be taken by a parallel test before Prometheus binds it: Prometheus then
# exits with "address already in use", and is started again on another port (5 tries).
prom_ready_or_gone() {
    curl -sf "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null 2>&1 || ! kill -0 "$PROM_PID" 2>/dev/null
}
for try in 1 2 3 4 5; do
    PROM_PORT=$(free_port)
    prometheus --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$DIR/tsdb" \
        --web.listen-address="127.0.0.1:$PROM_PORT" >"$DIR/prometheus.log" 2>&1 &
    PROM_PID=$!
    wait_until "$KT_WAIT_S" prom_ready_or_gone || true
    kill -0 "$PROM_PID" 2>/dev/null && break
    grep -q "address already in use" "$DIR/prometheus.log" ||
        fail "Prometheus exited: $(tail -3 "$DIR/prometheus.log")"
    [ "$try" -lt 5 ] || fail "Prometheus found no free port in 5 tries"
done
PIDS+=("$PROM_PID")
API="http://127.0.0.1:$PROM_PORT/api/v1/query"
up=""
four_up() { # sets up: what Prometheus says of sum(up)
    up=$(curl -s --get "$API" --data-urlencode 'query=sum(up{job="kvedge"})' 2>/dev/null |
        grep -o '"value":\[[^]]*\]' || true)
    case "$up" in *'"4"]') return 0 ;; *) return 1 ;; esac
}
wait_until $((KT_WAIT_S + 10)) four_up || true
case "$up" in *'"4"]') ;; *) fail "Prometheus does not see 4 targets up: $up" ;; esac
first=$(curl -s --get "$API" --data-urlencode 'query=kvedge_proxy_fetches_total{status="OK"}' |
    grep -o '"value":\[[^]]*\]')
"$KVEDGE" -H "$(ep proxy)" fetch --model opt-125m --chunks "$CHAIN" >/dev/null
moved=""
counter_moved() { # sets moved: the counter once Prometheus scraped it past $after
    moved=$(curl -s --get "$API" \
        --data-urlencode "query=kvedge_proxy_fetches_total{status=\"OK\"} > $after" |
        grep -o '"value":\[[^]]*\]' || true)
    [ -n "$moved" ]
}
wait_until $((KT_WAIT_S + 10)) counter_moved || true
[ -n "$moved" ] || fail "Prometheus did not see the fetch counter move (first $first)"
echo "prometheus: 4 targets up; fetch counter $first -> $moved"

# ---------------------------------------------------------------- a port that is taken
if "$KVEDGE" --data "$DIR/other" store --insecure --bind "ipc://$DIR/other.sock" \
    --metrics "127.0.0.1:$C_PORT" >"$DIR/taken.log" 2>&1; then
    fail "a node started on a metrics port that is taken"
fi
grep -q "127.0.0.1:$C_PORT" "$DIR/taken.log" || fail "the error does not name the address: \
$(cat "$DIR/taken.log")"
echo "test_prometheus: ok"
