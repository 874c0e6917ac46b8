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
# The Redis limiters without cluster support, as the command line builds them.
cargo clippy --all-targets --features redis -- -D warnings
# The command line (its own package, cli/), on the library as it builds it.
cargo clippy -p paceline-cli --all-targets -- -D warnings

echo "==> cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --quiet

echo "==> cargo test (no default features)"
cargo test --no-default-features

echo "==> cargo test (all features, the whole workspace)"
cargo test --workspace --all-features

# The Redis tests again on Valkey, where the system's packages have it.
if ! command -v valkey-server >/dev/null && command -v apt-cache >/dev/null \
    && apt-cache show valkey-server >/dev/null 2>&1; then
    echo "==> installing valkey-server"
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq valkey-server valkey-tools >/dev/null || true
fi
if command -v valkey-server >/dev/null && command -v valkey-cli >/dev/null; then
    echo "==> cargo test (the Redis tests on Valkey)"
    PACELINE_REDIS_SERVER=valkey-server PACELINE_REDIS_CLI=valkey-cli \
        cargo test --all-features --test redis
else
    echo "==> valkey-server is not installable here: the Redis tests ran on Redis only"
fi
