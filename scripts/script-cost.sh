#!/usr/bin/env bash
# The script's cost per call, deterministically: the machine instructions a
# redis-server spends inside EVALSHA (counted under valgrind's callgrind),
# per call, for the script in the working tree and the one at REV (default
# main), side by side. Wall-clock server time on a shared machine moves by
# ±30% between identical runs; this count does not move, as every call
# passes the same clock (the last argument) instead of reading TIME.
#
#   scripts/script-cost.sh [REV]      (needs valgrind and redis-server)
#   CALLS=5000                        calls per case
#
# Each side's script is assembled as its src/redis/ assembles it (the
# `include_str!` parts of lua/, in order). A revision that kept limiters
# with several limits in a script of their own (lua/several.lua, which
# took the number of limits as ARGV[3]) is measured with that script for
# the two-limit case. The batch case is 64 reservations in one call.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-main}
calls=${CALLS:-5000}
for tool in valgrind redis-server redis-cli redis-benchmark; do
    command -v "$tool" >/dev/null || { echo "$tool is needed" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The one script of a side: `show PATH` prints a file of that side.
assemble() {
    local show=$1 parts
    parts=$( { $show src/redis/script.rs || true; $show src/redis/format.rs || true; } 2>/dev/null \
        | grep -o 'include_str!("../../lua/[a-z_]*\.lua")' | grep -v several \
        | sed 's|.*lua/\(.*\)\.lua.*|\1|')
    for part in $parts; do $show "lua/$part.lua"; done
}
show_rev() { git show "$rev:$1"; }
show_tree() { cat "$1"; }
assemble show_rev > "$tmp/before.lua"
assemble show_tree > "$tmp/after.lua"
before_two=$tmp/before.lua
if git cat-file -e "$rev:lua/several.lua" 2>/dev/null; then
    git show "$rev:lua/several.lua" > "$tmp/before_two.lua"
    before_two=$tmp/before_two.lua
fi

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
    # (A failed run still stops its server.)
    redis-benchmark -p "$port" -c 1 -P 16 -n "$calls" -r 1000000 -q \
        EVALSHA "$sha" "$@" >/dev/null 2>&1 || echo "the script failed: $*" >&2
    redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    wait
    awk -v n="$calls" '/^(summary|totals):/ {printf "%.0f", $2 / n; exit}' "$tmp/cg.$port"
}

now=1000000000
printf '%-46s %10s %10s %7s\n' "case (instructions per call)" "$rev" "worktree" ratio
while IFS='|' read -r label two args; do
    before=$tmp/before.lua
    before_args=$args
    if [ "$two" = 2 ] && [ "$before_two" != "$tmp/before.lua" ]; then
        # The several-limit script: the number of limits as ARGV[3].
        before=$before_two
        read -r keys key permits timeout rest <<<"$args"
        before_args="$keys $key $permits $timeout 2 $rest"
    fi
    # shellcheck disable=SC2086
    b=$(per_call "$before" $before_args $now)
    # shellcheck disable=SC2086
    a=$(per_call "$tmp/after.lua" $args $now)
    printf '%-46s %10s %10s %7s\n' "$label" "$b" "$a" "$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", a / b}')"
done <<'CASES'
one hot key, always in debt|1|1 hot 1 -1 10 bursty 0 0
one hot key, held: a full log|1|1 held 1+ -1 10 bursty 0 0
one hot key, tries refused|1|1 try 1 0 1 bursty 0 0
fresh keys, warming up|1|1 k:__rand_int__ 1 -1 1000 warming_up 1000000 3
two limits, one hot key, always in debt|2|1 two 1 -1 10 bursty 0 0 1 bursty 0 0
a batch of 64, one hot key|1|1 batch batch 1:-1*64 1000000000 bursty 0 0
CASES
