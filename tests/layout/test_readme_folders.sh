#!/usr/bin/env bash
# README's "What is where" table names every folder, and only folders that exist: every
# top-level folder of the repository and every folder directly under a source layer (access/,
# store/, clients/, runtime/, proxy/, monitor/, gpu/).
# Usage: test_readme_folders.sh REPO
set -euo pipefail
repo=${1:?usage: test_readme_folders.sh REPO}
cd "$repo"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    files=$(git ls-files --cached --others --exclude-standard)
else
    files=$(find . -type f -not -path './.*' -not -path './build*' | sed 's|^\./||')
fi
want=$( (
    awk -F/ 'NF > 1 && $1 !~ /^\./ {print $1 "/"}' <<<"$files"
    awk -F/ 'NF > 2 && $1 ~ /^(access|store|clients|runtime|proxy|monitor|gpu)$/ {print $1 "/" $2 "/"}' <<<"$files"
) | sort -u)
have=$(sed -n '/^## What is where/,/^## /p' README.md | grep -oE '^\| `[^`]+/`' | sed 's/^| `//; s/`$//' | sort -u)
[ -n "$have" ] || { echo "FAIL: README.md has no \"What is where\" table"; exit 1; }
missing=$(comm -23 <(echo "$want") <(echo "$have"))
extra=$(comm -13 <(echo "$want") <(echo "$have"))
fail=0
for d in $missing; do
    echo "FAIL: folder $d is not in README.md's \"What is where\" table"
    fail=1
done
for d in $extra; do
    echo "FAIL: README.md's \"What is where\" names $d, which does not exist"
    fail=1
done
[ "$fail" -eq 0 ] || exit 1
echo "README names all $(wc -l <<<"$want") folders"
