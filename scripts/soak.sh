#!/usr/bin/env bash
# Fault-injection soak: runs the seeded fault scenarios (crates/fawn/tests/faults_*.rs) for many
# seeds, one cargo test process per (scenario, seed), and prints a summary. Every run checks its
# client history for per-key linearizability (tools/linearizability, Porcupine) and scans every
# key for the acknowledged writes. Needs Go (the checker is built with `go build`);
# faults_link_cut also needs root (each back-end in its own network namespace).
#
# Usage:
#   scripts/soak.sh                         # every scenario, seeds 1..20
#   scripts/soak.sh -n 100 -s 1000          # seeds 1000..1099
#   scripts/soak.sh -t faults_mixed -t faults_kill9_backend -n 50
#   FAWN_FAULT_ROUNDS=8 scripts/soak.sh -t faults_mixed   # more faults per mixed run
#   FAWN_FRONTEND_ARGS="--cache-entries 0" scripts/soak.sh  # e.g. rule out the query cache
#
# A failing seed is reproduced with:  FAWN_SEED=<seed> cargo test -p fawn --test <scenario>
# Evidence of each failure (history.jsonl, the checker's history.html, every role's log, the
# faults injected) is kept in target/fault-runs/<scenario>-seed<seed>/; this script's own log of
# each run is in target/soak/<scenario>-seed<seed>.log. Exit status: 0 if every run passed.
set -uo pipefail
cd "$(dirname "$0")/.."

count=20
first=1
scenarios=()
while getopts "n:s:t:h" opt; do
  case $opt in
    n) count=$OPTARG ;;
    s) first=$OPTARG ;;
    t) scenarios+=("$OPTARG") ;;
    *) sed -n '2,19p' "$0"; exit 2 ;;
  esac
done
if [ ${#scenarios[@]} -eq 0 ]; then
  for f in crates/fawn/tests/faults_*.rs; do scenarios+=("$(basename "$f" .rs)"); done
fi

target=${CARGO_TARGET_DIR:-target}
cargo build -p fawn --tests --quiet || exit 1
mkdir -p "$target/soak"
pass=0
fail=0
failed=()
start=$(date +%s)
for t in "${scenarios[@]}"; do
  for ((seed = first; seed < first + count; seed++)); do
    log="$target/soak/$t-seed$seed.log"
    if FAWN_SEED=$seed cargo test -p fawn --quiet --test "$t" -- --nocapture >"$log" 2>&1; then
      pass=$((pass + 1))
      printf 'ok    %s seed %s  %s\n' "$t" "$seed" "$(grep -Eo '[0-9]+ ops \(.*\), [0-9]+ faults' "$log" | head -1)"
    else
      fail=$((fail + 1))
      failed+=("$t seed $seed")
      printf 'FAIL  %s seed %s  (log %s, evidence %s/fault-runs/%s-seed%s)\n' "$t" "$seed" "$log" "$target" "$t" "$seed"
      grep -E 'NOT LINEARIZABLE|final scan|not readable|no operation|exited on their own' "$log" | sed 's/^/        /' | head -8
    fi
  done
done
echo
echo "soak: ${#scenarios[@]} scenarios x $count seeds in $(($(date +%s) - start)) s"
for f in "${failed[@]}"; do echo "  failed: $f"; done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
