#!/usr/bin/env bash
# Soak of the deterministic simulator: runs fawn-sim over consecutive blocks of seeds for a fixed
# time and keeps every failing seed, so that a rare interleaving found overnight can be replayed
# exactly (`cargo run --release -p fawn-sim -- --seeds 1 --seed S --crashes C --trace`).
#
#   scripts/sim-soak.sh [--minutes M] [--crashes C] [--first-seed S] [--block N] [--out FILE] [--no-disks]
#                      [--frontend-cache] [--compaction]
#
# Defaults: 10 minutes, 3 crashes and 2 partitions per run (CI runs 1 crash), process, host and
# disk crashes over disks that fill up, seeds from a random start, blocks of 20 000 seeds;
# --no-disks: every crash loses the node's data; --frontend-cache: clients through a front-end
# with the real query cache; --compaction: stores compacted at each interval sync (superseded
# records and old deletes dropped). Exits 1 if any seed failed; the failing seeds are in FILE
# (default target/sim-soak/failures.txt) and stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=10
crashes=3
first_seed=$(( (RANDOM << 15 | RANDOM) * 1000 ))
block=20000
out=target/sim-soak/failures.txt
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --crashes) crashes=$2; shift 2 ;;
    --first-seed) first_seed=$2; shift 2 ;;
    --block) block=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-disks) extra+=(--no-disks --no-full-disks); shift ;;
    --frontend-cache) extra+=(--frontend-cache); shift ;;
    --compaction) extra+=(--compaction); shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "sim-soak: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

cargo build --release -q -p fawn-sim
sim=target/release/fawn-sim
mkdir -p "$(dirname "$out")"
: > "$out"
deadline=$(( $(date +%s) + minutes * 60 ))
seed=$first_seed
runs=0
while [ "$(date +%s)" -lt "$deadline" ]; do
  # fawn-sim exits 1 when a seed of the block failed; the lines say which.
  "$sim" --seeds "$block" --seed "$seed" --crashes "$crashes" "${extra[@]}" 2>/dev/null | grep '^seed ' | tee -a "$out" || true
  seed=$(( seed + block ))
  runs=$(( runs + block ))
done
failed=$(wc -l < "$out")
echo "sim-soak: $runs seeds from $first_seed with up to $crashes crashes each, $failed failing (listed in $out)"
[ "$failed" -eq 0 ]
