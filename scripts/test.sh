#!/usr/bin/env bash
# The whole test suite: format check, lints, every test (unit, integration,
# doc) with all features and with none. "All features" covers the whole
# workspace (the benchmarks' package is linted, the axum server's and the
# command line's packages tested); "none" is the crate alone, since
# building the other packages would turn on the crate features they depend
# on. Installs redis-server if it is missing (the Redis tests start their
# own servers on free loopback ports).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    echo "==> installing redis-server"
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
fi
# The distribution's service is not needed: every test starts its own server.

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings
cargo clippy --all-targets --no-default-features -- -D warnings
# The library as users build it: the tests turn on the hidden feature
# `internals` (the algorithm's types, for their models), this does not.
cargo clippy --no-default-features -- -D warnings
# The Redis limiters without cluster support, as the command line builds them.
cargo clippy --all-targets --features redis -- -D warnings
# The command line (its own package, cli/), on the library as it builds it.
cargo clippy -p paceline-cli --all-targets -- -D warnings
# The benchmarks as their commands build them (no features beyond their
# own defaults).
cargo clippy -p paceline-benches --all-targets -- -D warnings

echo "==> cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --quiet

echo "==> cargo test (no default features)"
cargo test --no-default-features

echo "==> cargo test (all features, the whole workspace)"
cargo test --workspace --all-features

# The Redis tests again on Valkey. Debian 12 has it in its backports
# suite only: enabled here (for valkey alone) when the system lacks it.
if ! command -v valkey-server >/dev/null && command -v apt-get >/dev/null; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    if ! apt-cache show valkey-server >/dev/null 2>&1 \
        && grep -qs 'VERSION_CODENAME=bookworm' /etc/os-release; then
        echo "==> enabling bookworm-backports for valkey-server"
        echo 'deb http://deb.debian.org/debian bookworm-backports main' \
            | $sudo tee /etc/apt/sources.list.d/bookworm-backports.list >/dev/null
        $sudo apt-get update -qq || true
    fi
    if apt-cache show valkey-server >/dev/null 2>&1; then
        echo "==> installing valkey-server"
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq valkey-server valkey-tools >/dev/null || true
    fi
fi
if command -v valkey-server >/dev/null && command -v valkey-cli >/dev/null; then
    echo "==> cargo test (the Redis tests on Valkey)"
    PACELINE_REDIS_SERVER=valkey-server PACELINE_REDIS_CLI=valkey-cli \
        cargo test --all-features --test redis
else
    echo "==> valkey-server is not installable here: the Redis tests ran on Redis only"
fi
