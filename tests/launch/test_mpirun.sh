#!/usr/bin/env bash
# OpenMPI's mpirun launches chorus programs with no code change (ranks from OMPI_COMM_WORLD_*).
# Without MASTER_ADDR, rank 0 publishes its store in a rendezvous file: it must be gone when the
# job ends, also with a fixed CHORUS_JOB_SECRET over several runs. With an elastic probe
# (second argument) and `mpirun --enable-recovery` (OpenMPI otherwise aborts the job when a
# process dies), rank 0 -- the store's host -- is killed and the others shrink and go on on the
# store that took over.
set -u
example=$1 probe=${2:-}
command -v mpirun >/dev/null || { echo "skip: mpirun not installed (apt-get install openmpi-bin)"; exit 77; }
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-run-as-root)
tmp=$(mktemp -d /tmp/chorus-mpirun-test-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
for run in 1 2 3; do
  out=$(TMPDIR=$tmp CHORUS_JOB_SECRET=00112233445566778899aabbccddeeff \
        timeout 120 mpirun "${extra[@]}" --oversubscribe --bind-to none -n 4 "$example" --quick 2>&1)
  rc=$?
  echo "$out"
  [ $rc = 0 ] || { echo "FAIL: mpirun exited $rc (run $run)"; exit 1; }
  n=$(echo "$out" | grep -c "checked, 0 wrong")
  [ "$n" = 4 ] || { echo "FAIL: expected 4 ranks to check their data, saw $n (run $run)"; exit 1; }
  left=$(ls "$tmp/chorus-$(id -u)" 2>/dev/null | grep -c '^rdzv-')
  [ "$left" = 0 ] || { echo "FAIL: the rendezvous file outlived the job (run $run)"; exit 1; }
done
echo "ok: 4 ranks under mpirun, 3 runs with one secret, no rendezvous file left"
[ -n "$probe" ] || exit 0
out=$(TMPDIR=$tmp timeout 120 mpirun "${extra[@]}" --oversubscribe --bind-to none --enable-recovery \
      -n 3 "$probe" 0 2>&1)
rc=$?
echo "$out"
n=$(echo "$out" | grep -c "continued as rank [01] of 2")
[ "$n" = 2 ] && echo "$out" | grep -q "the store moved to rank 1" ||
  { echo "FAIL: mpirun --enable-recovery, rank 0 killed: $n of 2 survivors continued (rc $rc)"; exit 1; }
echo "ok: mpirun --enable-recovery: rank 0 (the store's host) killed, the others went on"
