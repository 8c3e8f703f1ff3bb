#!/usr/bin/env bash
# `kvedge top`, `sources` and `stat` against live daemons on loopback: a store node with
# traffic, top on a real terminal under tmux (the screen, q, Ctrl-C, the terminal restored,
# the daemon going away), top into a pipe and --json, and an edge proxy's stat and sources.
# Usage: test_top.sh KVEDGE_BINARY
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../../common/wait.sh
. "$(dirname "$0")/../../common/wait.sh"
kv=${1:?usage: test_top.sh KVEDGE_BINARY}
[ -x "$kv" ] || { echo "FAIL: $kv is not executable" >&2; exit 1; }

fail() {
    echo "FAIL: $*" >&2
    exit 1
}
step() { echo "== $*"; }

command -v tmux >/dev/null ||
    fail "tmux is not installed: this test drives kvedge top on a terminal (scripts/setup.sh installs it)"
command -v python3 >/dev/null || fail "python3 is not installed (needed to check --json output)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvedge-top.XXXXXX")
sock=kvedge-top-$$ # a private tmux server: the user's sessions are not touched
pids=()
cleanup() {
    tmux -L "$sock" kill-server 2>/dev/null || true
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
tm() { tmux -L "$sock" -f /dev/null "$@"; }

# Starts a daemon (its stdout in $tmp/NAME.out) and prints the endpoint it listens on.
start() {
    local name=$1
    shift
    "$kv" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    local pid=$!
    pids+=("$pid")
    echo "$pid" >"$tmp/$name.pid"
    wait_until "$KT_WAIT_S" listening_or_gone "$tmp/$name.out" "$pid" || true
    kill -0 "$pid" 2>/dev/null || { cat "$tmp/$name.err" >&2; fail "$name exited"; }
    grep -q '^listening ' "$tmp/$name.out" || { cat "$tmp/$name.err" >&2; fail "$name not listening"; }
}

# Whether the daemon writing to $1 says it is listening, or its process $2 is gone.
listening_or_gone() {
    grep -q '^listening ' "$1" || ! kill -0 "$2" 2>/dev/null
}

# Whether the pane $1 shows a line matching the extended regex $2 (the screen in pane.txt).
pane_has() {
    tm capture-pane -p -t "$1" >"$tmp/pane.txt" 2>/dev/null || true
    grep -Eq -- "$2" "$tmp/pane.txt"
}

# Waits until the pane shows a line matching the extended regex, or fails with the screen.
wait_pane() {
    local target=$1 re=$2 what=$3
    wait_until "$KT_WAIT_S" pane_has "$target" "$re" && return 0
    cat "$tmp/pane.txt" >&2
    fail "$what (no line matching /$re/ on the screen after $KT_WAIT_S s)"
}

# A pane's program: top, then its exit status and the terminal's modes once it returned.
cat >"$tmp/run_top.sh" <<'EOF'
#!/usr/bin/env bash
"$@"
echo "EXITED $?"
echo "TTY $(stty -a | tr ' ;' '\n\n' | grep -Ex -- '-?(icanon|echo)' | paste -sd' ')"
sleep 60 # keeps the pane open so its screen can be read: the test kills it, nothing waits
EOF
chmod +x "$tmp/run_top.sh"

# ---------------------------------------------------------------- a node with traffic
step "store node, synthetic data, reads in a loop"
start node store --insecure --bind 'tcp://127.0.0.1:*' --data "$tmp/data" --metrics off
ep=$(sed -n 's/^listening //p' "$tmp/node.out")
"$kv" -H "$ep" put-synthetic --model opt-125m --tokens 512 >"$tmp/put.out" 2>&1 ||
    { cat "$tmp/put.out" >&2; fail "put-synthetic"; }
prefix=$("$kv" -H "$ep" ls | awk 'NR == 2 { print $1 }')
[ -n "$prefix" ] || fail "ls lists no prefix after put-synthetic"
(while :; do
    "$kv" -H "$ep" show "$prefix" >/dev/null 2>&1 || true
    sleep 0.05 # paces the background reads (traffic for top to show), not a wait
done) &
pids+=($!)

# ---------------------------------------------------------------- top on a terminal
step "top on a terminal (tmux 160x50): header, rates, hot prefixes; q quits"
tm new-session -d -s q -x 160 -y 50 "$tmp/run_top.sh" "$kv" -H "$ep" top --interval 0.5
wait_pane q "^kvedge top - node kvedge \(edge\) at $ep .* ready$" "the header"
wait_pane q '^GET_LAYER +[0-9]*[1-9][0-9]*\.[0-9]|^GET_LAYER +0\.[1-9]' \
    "a nonzero GET_LAYER rate after traffic"
wait_pane q '^requests [0-9.]+/s +hit ratio [0-9.]+% ' "requests/s and the hit ratio"
wait_pane q '^RANK PREFIX +MODEL +ACCESSES' "the hot prefix table"
wait_pane q '^ +1 [0-9a-f]{16} opt-125m +[0-9]+ .* 0-11$' "the hottest prefix, layers 0-11"
awk 'length > 160 { exit 1 }' "$tmp/pane.txt" || fail "a line is wider than the terminal"
tm send-keys -t q q
wait_pane q '^TTY ' "top did not exit on q"
grep -q '^EXITED 0$' "$tmp/pane.txt" || fail "top exited non-zero on q: $(grep EXITED "$tmp/pane.txt")"
grep -q '^TTY icanon echo$' "$tmp/pane.txt" ||
    fail "terminal not restored after q: $(grep '^TTY' "$tmp/pane.txt")"

step "top on a terminal: Ctrl-C quits and restores the terminal"
tm new-session -d -s c -x 100 -y 20 "$tmp/run_top.sh" "$kv" -H "$ep" top --interval 0.3
wait_pane c '^kvedge top - node ' "the header"
wait_pane c '^OP +REQ/S +P50 +P99 +ERR/S' "the opcode table"
awk 'length > 100 { exit 1 }' "$tmp/pane.txt" || fail "a line is wider than the 100-column terminal"
tm send-keys -t c C-c
wait_pane c '^TTY ' "top did not exit on Ctrl-C"
grep -q '^EXITED 0$' "$tmp/pane.txt" || fail "top exited non-zero on Ctrl-C"
grep -q '^TTY icanon echo$' "$tmp/pane.txt" ||
    fail "terminal not restored after Ctrl-C: $(grep '^TTY' "$tmp/pane.txt")"

# ---------------------------------------------------------------- pipes and --json
step "top into a pipe: two plain frames with --count 2, one by default"
"$kv" -H "$ep" top --count 2 --interval 0.2 | cat >"$tmp/pipe.txt"
[ "$(grep -c '^kvedge top - node ' "$tmp/pipe.txt")" = 2 ] || { cat "$tmp/pipe.txt" >&2; fail "not two frames"; }
if grep -q $'\033' "$tmp/pipe.txt"; then fail "escape codes in a pipe"; fi
grep -q '^HOT PREFIXES' "$tmp/pipe.txt" || fail "no hot prefixes in the pipe frames"
awk '/^kvedge top - node / && NR > 1 { if (prev != "") exit 1 } { prev = $0 }' "$tmp/pipe.txt" ||
    fail "frames are not separated by a blank line"
"$kv" -H "$ep" top --interval 0.1 | cat >"$tmp/pipe1.txt"
[ "$(grep -c '^kvedge top - node ' "$tmp/pipe1.txt")" = 1 ] || fail "a pipe without --count: not one frame"

step "top --json: one snapshot that parses"
"$kv" -H "$ep" top --json --top 5 >"$tmp/top.json"
python3 - "$tmp/top.json" <<'EOF' || fail "top --json"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["kind"] == "node", d["kind"]
assert d["store"]["blocks"] == 288, d["store"]
assert 1 <= len(d["hot"]["prefixes"]) <= 5, d["hot"]
assert any(r["op"] == "GET_LAYER" for r in d["requests"])
EOF

step "stat on the node: the store counters and the analyzer's line"
"$kv" -H "$ep" stat >"$tmp/stat.txt"
grep -q '^node .*: 288 blocks' "$tmp/stat.txt" || { cat "$tmp/stat.txt" >&2; fail "stat"; }
grep -Eq '^analyzer: [0-9]+ requests, hit ratio [0-9.]+% .*[1-9][0-9]* hot prefixes tracked' \
    "$tmp/stat.txt" || { cat "$tmp/stat.txt" >&2; fail "stat has no analyzer line"; }
"$kv" -H "$ep" stat --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["blocks"] == 288 and d["analyzer"]["requests"] > 0, d' ||
    fail "stat --json on the node"

step "sources on a store node: refused with a usage error"
rc=0
"$kv" -H "$ep" sources >"$tmp/src.out" 2>"$tmp/src.err" || rc=$?
[ "$rc" = 2 ] || fail "sources on a node exited $rc, not 2"
grep -q "not a proxy: $ep is a store node (use kvedge -H $ep top)" "$tmp/src.err" ||
    fail "sources on a node: $(cat "$tmp/src.err")"

# ---------------------------------------------------------------- an edge proxy
step "edge proxy: stat, sources, top"
start proxy proxy --insecure --bind 'tcp://127.0.0.1:*' --source "local n1 $ep" --metrics off \
    --cert "$tmp/proxy.cert"
px=$(sed -n 's/^listening //p' "$tmp/proxy.out")
source_up() {
    "$kv" -H "$px" stat >"$tmp/pstat.txt" 2>&1 || true
    grep -q '^sources: 1 up of 1' "$tmp/pstat.txt"
}
wait_until "$KT_WAIT_S" source_up || true
grep -q "^proxy proxy ($px): ready" "$tmp/pstat.txt" || { cat "$tmp/pstat.txt" >&2; fail "stat on the proxy"; }
grep -q '^sources: 1 up of 1' "$tmp/pstat.txt" || { cat "$tmp/pstat.txt" >&2; fail "stat: the source is not up"; }
grep -q '^since start: [0-9]* fetch requests' "$tmp/pstat.txt" || fail "stat: no proxy counters"
"$kv" -H "$px" stat --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["kind"] == "proxy" and d["sources"] == 1 and d["sources_up"] == 1, d' ||
    fail "stat --json on the proxy"
"$kv" -H "$px" sources >"$tmp/sources.txt"
grep -Eq "^n1 +local +$ep +config +yes +up " "$tmp/sources.txt" ||
    { cat "$tmp/sources.txt" >&2; fail "sources does not list n1 up"; }
"$kv" -H "$px" sources --json | python3 -c 'import json,sys; s=json.load(sys.stdin); assert len(s) == 1 and s[0]["name"] == "n1" and s[0]["state"] == "up" and s[0]["connected"], s' ||
    fail "sources --json"
"$kv" -H "$px" top --interval 0.2 | cat >"$tmp/ptop.txt"
grep -q "^kvedge top - proxy proxy at $px " "$tmp/ptop.txt" || { cat "$tmp/ptop.txt" >&2; fail "top on the proxy"; }
grep -Eq '^n1 +local +up +yes ' "$tmp/ptop.txt" || { cat "$tmp/ptop.txt" >&2; fail "top: no sources table"; }
grep -q '^TRANSITIONS' "$tmp/ptop.txt" || fail "top on the proxy: no transitions"

# ---------------------------------------------------------------- the daemon goes away
step "top on a terminal while the node stops: says so, exits non-zero, terminal restored"
tm new-session -d -s gone -x 160 -y 50 "$tmp/run_top.sh" "$kv" -H "$ep" --deadline 1000 top \
    --interval 0.2
wait_pane gone '^kvedge top - node ' "the header"
kill -TERM "$(cat "$tmp/node.pid")"
wait_pane gone '^TTY ' "top did not exit when the node went away"
grep -q "^kvedge: lost $ep" "$tmp/pane.txt" || { cat "$tmp/pane.txt" >&2; fail "top did not say the node went away"; }
grep -q '^EXITED 5$' "$tmp/pane.txt" || fail "top exited $(grep EXITED "$tmp/pane.txt"), not 5"
grep -q '^TTY icanon echo$' "$tmp/pane.txt" || fail "terminal not restored after the node went away"
echo "PASS"
