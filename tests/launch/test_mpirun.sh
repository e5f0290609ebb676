#!/usr/bin/env bash
# OpenMPI's mpirun launches chorus programs with no code change (ranks from OMPI_COMM_WORLD_*).
set -u
example=$1
command -v mpirun >/dev/null || { echo "skip: mpirun not installed (apt-get install openmpi-bin)"; exit 77; }
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-run-as-root)
out=$(timeout 120 mpirun "${extra[@]}" --oversubscribe --bind-to none -n 4 "$example" --quick 2>&1)
rc=$?
echo "$out"
[ $rc = 0 ] || { echo "FAIL: mpirun exited $rc"; exit 1; }
n=$(echo "$out" | grep -c "checked, 0 wrong")
[ "$n" = 4 ] || { echo "FAIL: expected 4 ranks to check their data, saw $n"; exit 1; }
echo "ok: 4 ranks under mpirun"
