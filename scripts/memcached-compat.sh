#!/usr/bin/env bash
# memcached drop-in compatibility: runs Debian's `memccapable` (libmemcached-tools; its ASCII
# and binary protocol tests), pymemcache 4.0's own integration tests, and pylibmc 1.6.3's own
# test suite in binary mode (`binary=True`) against a memcached-protocol server.
#
#   scripts/memcached-compat.sh [--against memcached|double|fawn] [--no-install]
#
#   --against memcached  Debian's memcached 1.6 (`memcached -t 1`): validates this script.
#   --against double     FAWN's memcached front-end over an in-memory test double
#                        (crates/fawn-kv/examples/memcache_double.rs).
#   --against fawn       a real `fawn up` cluster with its memcached front-end (default).
#   --no-install         skip apt-get / pip (the machine already has them).
#
# $FAWN_MEMCACHED_ADDR (host:port, default 127.0.0.1:22122) is where the server listens.
# $FAWN_BIN (optional) is a prebuilt `fawn` binary for --against fawn (default: build release).
#
# Excluded, because they test memcached-internal commands that a FAWN cluster does not have:
#   pymemcache test_integration.py::test_misc — `stats cachedump <slab> <n>` (dumps slab-class
#   contents) and `cache_memlimit <MB>` (resizes memcached's slab memory at run time).
#   pylibmc tests/test_autoconf.py — it dials the fixed port 11211 for ElastiCache's
#   `config get cluster` auto-discovery (it fails against Debian's memcached too).
#   pylibmc tests/test_client.py::ClientTests::test_touch in binary mode — after the binary
#   touch reply (the same 28 bytes from Debian's memcached 1.6.18 and from FAWN) libmemcached
#   waits out its 5 s poll timeout, so the test's item (touched to expire in 5 s) has expired
#   by the time it reads it back: it fails against Debian's memcached too.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
AGAINST=fawn
INSTALL=1
while [ $# -gt 0 ]; do
    case "$1" in
        --against) AGAINST=$2; shift 2 ;;
        --against=*) AGAINST=${1#*=}; shift ;;
        --no-install) INSTALL=0; shift ;;
        *) echo "usage: $0 [--against memcached|double|fawn] [--no-install]" >&2; exit 2 ;;
    esac
done
ADDR=${FAWN_MEMCACHED_ADDR:-127.0.0.1:22122}
HOST=${ADDR%:*}
PORT=${ADDR##*:}
WORK=$(mktemp -d)
SERVER_PID=

log() { echo "== $*" >&2; }

install_deps() {
    if ! command -v memccapable >/dev/null || ! command -v memcached >/dev/null; then
        log "installing libmemcached-tools memcached"
        local sudo=; [ "$(id -u)" -eq 0 ] || sudo=sudo
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libmemcached-tools memcached
    fi
    if [ ! -e /usr/include/libmemcached/memcached.h ]; then
        log "installing libmemcached-dev (pylibmc builds against it)"
        local sudo=; [ "$(id -u)" -eq 0 ] || sudo=sudo
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libmemcached-dev zlib1g-dev
    fi
    if [ ! -x "$ROOT/.venv/bin/python" ]; then
        log "creating $ROOT/.venv"
        python3 -m venv "$ROOT/.venv"
    fi
    "$ROOT/.venv/bin/pip" install -q pymemcache==4.0.0 pytest pytest-rerunfailures pylibmc==1.6.3
}

# pylibmc's tests are not in its wheel: take them from its source release, and make every test
# client speak the binary protocol.
run_pylibmc_binary() {
    "$ROOT/.venv/bin/pip" download -q --no-binary :all: --no-deps pylibmc==1.6.3 -d "$WORK/pylibmc"
    tar xzf "$WORK/pylibmc/pylibmc-1.6.3.tar.gz" -C "$WORK/pylibmc"
    local dir="$WORK/pylibmc/pylibmc-1.6.3"
    cat > "$dir/tests/conftest.py" <<'PY'
import pylibmc.test, tests
_make = pylibmc.test.make_test_client
def make_binary(*args, **kwds):
    kwds.setdefault("binary", True)
    return _make(*args, **kwds)
pylibmc.test.make_test_client = make_binary
tests.make_test_client = make_binary
PY
    (cd "$dir" && MEMCACHED_HOST="$HOST" MEMCACHED_PORT="$PORT" "$ROOT/.venv/bin/python" -m pytest -q \
        -p no:cacheprovider tests --ignore tests/test_autoconf.py \
        --deselect tests/test_client.py::ClientTests::test_touch)
}

# --- server start functions: each starts a server on $HOST:$PORT in the background and
# --- sets SERVER_PID. Swap or add one to test another server.

start_memcached() {
    memcached -p "$PORT" -U 0 -l "$HOST" -t 1 -u "$(id -un)" &
    SERVER_PID=$!
}

start_double() {
    (cd "$ROOT" && cargo build -q -p fawn-kv --example memcache_double)
    FAWN_MEMCACHED_ADDR="$ADDR" "$ROOT/target/debug/examples/memcache_double" &
    SERVER_PID=$!
}

start_fawn() {
    local bin=${FAWN_BIN:-}
    if [ -z "$bin" ]; then
        (cd "$ROOT" && cargo build -q --release -p fawn)
        bin="$ROOT/target/release/fawn"
    fi
    "$bin" up --data-dir "$WORK/data" --memcached "$ADDR" --log-level warn &
    SERVER_PID=$!
}

stop_server() {
    if [ -n "$SERVER_PID" ]; then
        # The server and any children it started (cargo test runs the binary as a child).
        pkill -TERM -P "$SERVER_PID" 2>/dev/null || true
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap stop_server EXIT

wait_for_port() {
    for _ in $(seq 1 600); do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "server exited before listening on $ADDR (port in use?)" >&2
            return 1
        fi
        if "$ROOT/.venv/bin/python" - "$HOST" "$PORT" <<'PY' 2>/dev/null; then return 0; fi
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1)
s.sendall(b"version\r\n")
assert s.recv(100).startswith(b"VERSION ")
PY
        sleep 0.2
    done
    echo "server on $ADDR did not come up" >&2
    return 1
}

[ "$INSTALL" -eq 1 ] && install_deps
case "$AGAINST" in
    memcached) start_memcached ;;
    double) start_double ;;
    fawn) start_fawn ;;
    *) echo "unknown --against $AGAINST" >&2; exit 2 ;;
esac
wait_for_port

# Both suites always run, so one report shows every failure.
STATUS=0
log "memccapable (ASCII and binary) against $AGAINST at $ADDR"
memccapable -h "$HOST" -p "$PORT" || STATUS=1

log "pymemcache 4.0 integration tests against $AGAINST at $ADDR"
TESTS=$("$ROOT/.venv/bin/python" -c 'import os, pymemcache.test as t; print(os.path.dirname(t.__file__))')
# A failing test runs once more (pytest-rerunfailures; the rerun shows in the report): test_touch
# stores with a 1 s TTL and then touches, so a whole-second clock ticking between the two
# expires the item first, on memcached's clock as on ours. A real failure fails twice.
"$ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore::pytest.PytestUnknownMarkWarning \
    "$TESTS/test_integration.py" --server "$HOST" --port "$PORT" --reruns 1 \
    -k "not test_misc" || STATUS=1

log "pylibmc 1.6.3 tests in binary mode against $AGAINST at $ADDR"
run_pylibmc_binary || STATUS=1

if [ "$STATUS" -eq 0 ]; then
    log "all compatibility checks passed against $AGAINST"
else
    log "compatibility checks FAILED against $AGAINST"
fi
exit "$STATUS"
