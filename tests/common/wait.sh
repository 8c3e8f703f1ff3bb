# shellcheck shell=bash disable=SC2034 # the constants are the sourcing test's
# Waiting for a condition in the .sh tests, with a deadline (source it). The shell side of
# tests/common/testutil.h: a test waits for what it needs, never pauses in its place.

# How long a .sh test waits for a condition that should hold within a second on an idle
# machine: generous, since a wait that holds returns as soon as it does.
KT_WAIT_S=20
# How late past its bound something a .sh test times may end (testutil.h's KT_SLACK_MS).
KT_SLACK_S=5

# wait_until DEADLINE_S CMD...: runs CMD every 0.1 s until it succeeds (returns 0) or
# DEADLINE_S seconds have passed (returns 1; CMD is run one last time at the deadline).
wait_until() {
    local secs=$1
    shift
    local end=$(($(date +%s%N) / 1000000 + secs * 1000))
    while :; do
        "$@" && return 0
        if [ $(($(date +%s%N) / 1000000)) -ge "$end" ]; then
            "$@" && return 0
            return 1
        fi
        sleep 0.1 # the poll interval, not a wait for anything
    done
}
