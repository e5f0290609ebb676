#!/usr/bin/env bash
# Issue 9 item 4: when rank 0 (the process hosting the bootstrap store) dies, every survivor's
# error names rank 0 and the call it was in, within 5 s -- under chorus-run and under mpirun
# (no MASTER_ADDR: the rendezvous file path). The no-launcher case is in
# tests/collectives/test_failures.cc. Usage: test_dead_rank0.sh CHORUS_RUN DEAD_RANK0
set -u
run=$1 helper=$2
fail=0
check() {  # name, output, ranks expected to report ok
  local name=$1 out=$2 n=$3
  echo "$out"
  local got
  got=$(echo "$out" | grep -c "rank [0-9]*: ok$")
  if [ "$got" != "$n" ]; then echo "FAIL ($name): $got of $n survivors named rank 0 in time"; fail=1; else echo "ok ($name)"; fi
}
out=$(timeout 60 "$run" -n 3 --grace 10 "$helper" 2>&1)
check chorus-run "$out" 2
if command -v mpirun >/dev/null; then
  extra=()
  [ "$(id -u)" = 0 ] && extra+=(--allow-run-as-root)
  out=$(timeout 60 mpirun "${extra[@]}" --oversubscribe --bind-to none -n 3 "$helper" 2>&1)
  check mpirun "$out" 2
else
  echo "mpirun part skipped: mpirun not installed (apt-get install openmpi-bin)"
fi
exit $fail
