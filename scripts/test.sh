#!/usr/bin/env bash
# The whole test suite, as CI runs it. Works on a fresh Debian machine: installs what it needs.
#   1. system packages (memcached, libmemcached-tools for memccapable, sasl2-bin for the SASL
#      differential test, python venv)
#   2. cargo fmt --check, cargo clippy --all-targets -D warnings
#   3. cargo test --workspace (unit, property, crash, ENOSPC, multi-process cluster tests, seeded
#      fault-injection runs checked for linearizability by tools/linearizability, and the
#      memcached differential test: the same bytes to Debian's memcached and to `fawn up`)
#   4. memcached compatibility: memccapable (ASCII and binary) and pymemcache's integration tests
#      against `fawn up`
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

# A clean clone builds once: incremental caches would only take disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
step "disk space"
df -h . | tail -1

step "installing system packages (if missing)"
need=()
command -v memcached >/dev/null || need+=(memcached)
command -v memccapable >/dev/null || need+=(libmemcached-tools)
command -v saslpasswd2 >/dev/null || need+=(sasl2-bin)
command -v redis-server >/dev/null || need+=(redis-server)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
command -v go >/dev/null || need+=(golang-go)   # the linearizability checker (Porcupine)
command -v ip >/dev/null || need+=(iproute2)    # network namespaces for the link-cut fault test (needs root)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

step "python venv with pymemcache (the memcached TLS test runs it)"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q pymemcache==4.0.0

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test --workspace"
cargo test --workspace --no-fail-fast 2>&1 | tee target/cargo-test.log
# The simulator's fault tests need the replica's test-only faults compiled in.
cargo test -p fawn-sim --features faults --no-fail-fast 2>&1 | tee -a target/cargo-test.log
summary=$(grep -E '^test result:' target/cargo-test.log | awk '{p+=$4; f+=$6} END {print p" passed, "f" failed"}')

step "memcached compatibility (memccapable, pymemcache) against fawn up"
cargo build --release -p fawn
scripts/memcached-compat.sh --against fawn

step "summary"
df -h . | tail -1
echo "cargo: $summary"
