#!/usr/bin/env bash
# The script's cost per call, deterministically: the machine instructions a
# redis-server spends inside EVALSHA (counted under valgrind's callgrind),
# per call, for the script in the working tree and the one at REV (default
# HEAD), side by side. Wall-clock server time on a shared machine moves by
# ±30% between identical runs; this count does not move, as every call
# passes the same clock (ARGV[7]) instead of reading TIME.
#
#   scripts/script-cost.sh [REV]      (needs valgrind and redis-server)
#   CALLS=5000                        calls per case
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
calls=${CALLS:-5000}
parts="prelude state cold reserve write"
for tool in valgrind redis-server redis-cli redis-benchmark; do
    command -v "$tool" >/dev/null || { echo "$tool is needed" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for part in $parts; do git show "$rev:lua/$part.lua"; done > "$tmp/before.lua"
for part in $parts; do cat "lua/$part.lua"; done > "$tmp/after.lua"

# Instructions per call of SCRIPT on a fresh server, for EVALSHA <sha> ARGS.
per_call() {
    local script=$1; shift
    local port=$((20000 + RANDOM % 20000))
    valgrind --tool=callgrind --toggle-collect=evalShaCommand \
        --callgrind-out-file="$tmp/cg.$port" \
        redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        >/dev/null 2>&1 &
    for _ in $(seq 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.2; done
    local sha
    sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$script")")
    redis-benchmark -p "$port" -c 1 -P 16 -n "$calls" -r 1000000 -q \
        EVALSHA "$sha" "$@" >/dev/null 2>&1
    redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    wait
    awk -v n="$calls" '/^(summary|totals):/ {printf "%.0f", $2 / n; exit}' "$tmp/cg.$port"
}

printf '%-44s %10s %10s %7s\n' "case (instructions per call)" "$rev" "worktree" ratio
while IFS='|' read -r label args; do
    # shellcheck disable=SC2086
    b=$(per_call "$tmp/before.lua" $args)
    # shellcheck disable=SC2086
    a=$(per_call "$tmp/after.lua" $args)
    printf '%-44s %10s %10s %7s\n' "$label" "$b" "$a" "$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", a / b}')"
done <<'CASES'
one hot key, always in debt|1 hot 1 -1 1000 bursty 1000000 0 1000000000
one hot key, held: a full ledger|1 held 1+ -1 1000 bursty 1000000 0 1000000000
one hot key, tries refused|1 try 1 0 1 bursty 0 0 1000000000
fresh keys, warming up|1 k:__rand_int__ 1 -1 1000 warming_up 1000000 3 1000000000
CASES
