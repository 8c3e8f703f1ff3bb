#!/usr/bin/env bash
# The built man page and bash completion are what `kvedge help --man` and `kvedge help
# --completion bash` print now (not stale); groff renders the page without a warning (when
# groff is installed: scripts/setup.sh installs groff-base and man-db); the completion, sourced
# into a real bash, completes commands, flags, file names and choices.
#
# usage: test_cli_doc_render.sh KVEDGE_BIN BUILD/kvedge.1 BUILD/kvedge.bash
set -euo pipefail

if [ $# -ne 3 ]; then
    echo "usage: $0 KVEDGE_BIN KVEDGE_1 KVEDGE_BASH" >&2
    exit 2
fi
bin=$1
man=$2
comp=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvedge-doc.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "FAIL: $*" >&2
    exit 1
}
step() { echo "-- $*"; }

step "the built files are the binary's output"
"$bin" help --man >"$tmp/kvedge.1" || fail "kvedge help --man exited $?"
"$bin" help --completion bash >"$tmp/kvedge.bash" || fail "kvedge help --completion bash exited $?"
cmp -s "$tmp/kvedge.1" "$man" || fail "$man differs from \`kvedge help --man\` (rebuild: kvedge_doc)"
cmp -s "$tmp/kvedge.bash" "$comp" || fail "$comp differs from \`kvedge help --completion bash\`"
echo "   $(wc -l <"$man") lines of roff, $(wc -l <"$comp") lines of bash"
rc=0
"$bin" help --completion zsh >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" = 2 ] || fail "help --completion zsh exited $rc, not 2"
grep -q 'want `kvedge help --man` or `kvedge help --completion bash`' "$tmp/err" ||
    fail "help --completion zsh: $(cat "$tmp/err")"

step "groff -man -Tutf8 -ww (every warning)"
if command -v groff >/dev/null; then
    groff -man -Tutf8 -ww -z "$man" 2>"$tmp/groff.err" || fail "groff exited $?"
    [ ! -s "$tmp/groff.err" ] || { cat "$tmp/groff.err" >&2; fail "groff warns"; }
    # A long, pageless render: every section and a command's flag read as plain text.
    groff -man -Tutf8 -rLL=100n -P-c -P-u -P-b "$man" 2>/dev/null >"$tmp/page.txt"
    for want in NAME SYNOPSIS DESCRIPTION "GLOBAL OPTIONS" COMMANDS "EXIT STATUS" ENVIRONMENT \
        FILES "--weights PATH" "--server-key KEY" "KVEDGE_DATA"; do
        grep -q -F -- "$want" "$tmp/page.txt" || fail "the rendered page lacks '$want'"
    done
    echo "   no warnings; $(wc -l <"$tmp/page.txt") lines rendered"
else
    echo "   groff is not installed: rendering not checked (scripts/setup.sh installs groff-base)"
fi
if command -v man >/dev/null; then
    man --warnings -l "$man" >/dev/null 2>"$tmp/man.err" || fail "man -l exited $?"
    [ ! -s "$tmp/man.err" ] || { cat "$tmp/man.err" >&2; fail "man -l warns"; }
    echo "   man -l --warnings: no warnings"
fi

step "bash completion"
mkdir -p "$tmp/files"
touch "$tmp/files/weights.safetensors" "$tmp/files/other.txt"
mkdir "$tmp/files/wdir"
# complete WORD...: COMPREPLY, sorted, one line, for the words with the cursor on the last.
out=$(
    cd "$tmp/files"
    bash --norc --noprofile -c '
        set -u
        source "$1"
        shift
        complete_words() {
            COMP_WORDS=("$@")
            COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
            COMP_LINE="$*"
            COMPREPLY=()
            _kvedge
            printf "%s\n" "${COMPREPLY[@]}" | sort | tr "\n" " " | sed "s/ $//"
            echo
        }
        complete -p kvedge
        complete_words kvedge pre
        complete_words kvedge prefill --wei
        complete_words kvedge prefill --weights w
        complete_words kvedge --data w
        complete_words kvedge store --role ""
        complete_words kvedge -d /tmp pi
        complete_words kvedge help --completion ""
        complete_words kvedge --js
    ' bash "$comp"
) || fail "bash exited $?"
expect="complete -F _kvedge kvedge
prefill
--weights
wdir weights.safetensors
wdir
cloud edge
pin ping
bash
--json"
if [ "$out" != "$expect" ]; then
    diff <(echo "$expect") <(echo "$out") >&2 || true
    fail "completion answers differ (expected left, got right)"
fi
echo "$out" | sed 's/^/   /'
echo "PASS"
