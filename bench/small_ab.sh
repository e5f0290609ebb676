#!/bin/bash
# An 8-byte all-reduce's time per call, two builds of chorus side by side (interleaved rounds),
# 1 rank (the library's own cost per call) and 2 ranks over shm, with OpenMPI's shm in each round
# when bench/compare.sh has built its peer. Prints one line per round; quote the medians.
#   bench/small_ab.sh OLD_BUILD NEW_BUILD [ROUNDS]
#   e.g. git worktree add /tmp/old <commit> && (cd /tmp/old && meson setup b && ninja -C b
#        bench/chorus-perf tools/chorus-run) && bench/small_ab.sh /tmp/old/b build 7
set -euo pipefail
OLD=${1:?old build folder}
NEW=${2:?new build folder}
ROUNDS=${3:-7}
MPI_PEER=$NEW/peers/mpi_allreduce
median_of() { sed -n 's/.*median_us=\([0-9.]*\).*/\1/p'; }
run() {  # run BUILD RANKS
  "$1/tools/chorus-run" --no-prefix -n "$2" "$1/bench/chorus-perf" -b 8 -e 8 -d float -o sum -c 1 \
    --transport shm -n 100000 -w 200 --time-budget 0.3 --result-label x 2>&1 | median_of
}
mpi() {
  if [ ! -x "$MPI_PEER" ] || ! command -v mpirun >/dev/null; then
    echo "-"
    return
  fi
  BENCH_SIZES=8 BENCH_TIME_BUDGET=0.3 mpirun --bind-to none --allow-run-as-root -np 2 "$MPI_PEER" \
    mpi-shm 2>&1 | median_of
}
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg); µs per call"
for ((i = 1; i <= ROUNDS; i++)); do
  echo "old1 $(run "$OLD" 1) new1 $(run "$NEW" 1) old2 $(run "$OLD" 2) new2 $(run "$NEW" 2) mpi2 $(mpi)"
done
