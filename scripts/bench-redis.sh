#!/usr/bin/env bash
# The Redis benchmark, in one command: prints the machine, then builds and
# runs `cargo bench -p paceline-benches --features redis --bench redis`, which starts its own redis-server on a
# free loopback port (127.0.0.1 only), measures the crate's script, the
# baseline script and `return 1` with redis-benchmark, then the crate's
# client next to redis-benchmark's ceilings, prints the tables and stops its
# server. About two minutes with the defaults.
#
#   PACELINE_BENCH_ROUNDS=3   rounds per measurement (the median is shown)
#   PACELINE_BENCH_SECS=2     length of each client run, in seconds
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in redis-server redis-benchmark; do
    if ! command -v "$tool" >/dev/null; then
        echo "$tool is needed (Debian/Ubuntu: apt-get install redis-server redis-tools)" >&2
        exit 1
    fi
done

echo "date:     $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpus:     $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "redis:    $(redis-server --version)"
echo "rustc:    $(rustc --version)"
echo "commit:   $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo

cargo bench -p paceline-benches --features redis --bench redis
