#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ (libFuzzer, via libfuzzer-sys) for a fixed time each and
# prints, per target, the executions done and whether it found a crash.
#
# Usage:
#   scripts/fuzz.sh              # every target, 60 s each
#   scripts/fuzz.sh -t 600       # 10 minutes each
#   scripts/fuzz.sh native_frame # only the named targets
#
# Needs a nightly toolchain (`rustup toolchain install nightly`): libFuzzer's coverage
# instrumentation uses unstable compiler options. With `cargo fuzz` installed it is used (with
# its defaults, AddressSanitizer included); without it the targets are built with the same
# coverage flags directly (no sanitizer: the code under test is safe Rust).
# Corpora are kept in fuzz/corpus/<target>/, crashes in fuzz/artifacts/<target>/.
# Replay a crash: fuzz/target/<triple>/release/<target> fuzz/artifacts/<target>/crash-...
# Exit status: 0 if no target crashed.
set -uo pipefail
cd "$(dirname "$0")/.."

secs=60
while getopts "t:" opt; do
    case $opt in
        t) secs=$OPTARG ;;
        *) echo "usage: $0 [-t SECONDS] [TARGET...]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^fawn-fuzz$')
fi

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz.sh: no nightly toolchain: libFuzzer needs one (rustup toolchain install nightly)" >&2
    exit 2
fi

triple=$(rustc +nightly -vV | sed -n 's/^host: //p')
if cargo +nightly fuzz --version >/dev/null 2>&1; then
    build() { (cargo +nightly fuzz build "$1" >/dev/null); }
    binary() { echo "fuzz/target/$triple/release/$1"; }
else
    echo "fuzz.sh: cargo-fuzz not installed; building with libFuzzer's coverage flags directly" >&2
    flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
    flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
    flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
    build() {
        (cd fuzz && RUSTFLAGS="$flags" cargo +nightly build --release --target "$triple" --bin "$1")
    }
    binary() { echo "fuzz/target/$triple/release/$1"; }
fi

status=0
summary=()
for t in "${targets[@]}"; do
    if ! build "$t"; then
        echo "fuzz.sh: building $t failed" >&2
        exit 2
    fi
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
    log="fuzz/artifacts/$t/last-run.log"
    "$(binary "$t")" "fuzz/corpus/$t" -max_total_time="$secs" -artifact_prefix="fuzz/artifacts/$t/" \
        -print_final_stats=1 >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    if [ $rc -eq 0 ]; then
        result="no crash"
    else
        result="CRASH (exit $rc; see $log and fuzz/artifacts/$t/)"
        status=1
    fi
    summary+=("$t: ${execs:-?} executions in ${secs}s, $result")
done
printf '%s\n' "${summary[@]}"
exit $status
