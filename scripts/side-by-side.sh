#!/usr/bin/env bash
# Times two shell commands side by side: N pairs, each pair run in turn
# with the first one alternating, and prints the median of the pairs'
# wall-time ratios A/B (and the medians of A and B), so that a change of
# the machine's speed during the run weighs on both sides alike.
#
#   scripts/side-by-side.sh N 'A command' 'B command'
#   scripts/side-by-side.sh 20 'exec target/release/paceline 1e9/s < /tmp/lines7.txt > /dev/null' \
#       'exec cat < /tmp/lines7.txt > /dev/null'
set -euo pipefail
if [ "$#" -ne 3 ]; then
    echo "usage: $0 N 'A command' 'B command'" >&2
    exit 2
fi
n=$1 a=$2 b=$3
run() {
    local start end
    start=$(date +%s%N)
    sh -c "$1"
    end=$(date +%s%N)
    echo $((end - start))
}
ratios=() as=() bs=()
for i in $(seq 1 "$n"); do
    if [ $((i % 2)) -eq 1 ]; then
        ta=$(run "$a"); tb=$(run "$b")
    else
        tb=$(run "$b"); ta=$(run "$a")
    fi
    as+=("$ta") bs+=("$tb")
    ratios+=("$(awk -v a="$ta" -v b="$tb" 'BEGIN { printf "%.6f", a / b }')")
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "A: $a"
echo "B: $b"
echo "pairs: $n"
echo "median wall time: A $(awk -v x="$(median "${as[@]}")" 'BEGIN { printf "%.2f ms", x / 1e6 }'), B $(awk -v x="$(median "${bs[@]}")" 'BEGIN { printf "%.2f ms", x / 1e6 }')"
echo "median A/B: $(median "${ratios[@]}")"
