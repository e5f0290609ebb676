#!/usr/bin/env bash
# Issue 14 item 4: chorus-run --bind and the progress threads' placement. With --bind cores each
# rank's main thread runs on its own core, and its progress thread on the CPUs of that core's
# NUMA node (next to the rank, not on its core); with --bind none nothing is bound; a bad mode is
# refused. Also chorus-topo prints this machine. Usage: test_bind.sh CHORUS_RUN BIND_PROBE CHORUS_TOPO
set -u
run=$1 probe=$2 topo=$3
fail=0
ncpu=$(nproc)
all=$(grep Cpus_allowed_list /proc/self/status | awk '{print $2}')
if [ "$ncpu" -lt 2 ]; then echo "skip: one CPU: nothing to bind apart"; exit 77; fi

# The expectations follow this machine's cores (chorus-topo, i.e. hwloc): with two or more, each
# rank's main thread runs on its own core's CPUs; with one core of two hardware threads (a common
# 2-vCPU VM) both ranks share that core and chorus-run says so.
cores=$("$topo" 2>/dev/null | sed -n 's/^machine: .* \([0-9][0-9]*\) core(s).*/\1/p')
[ -n "$cores" ] || { echo "FAIL: chorus-topo did not say how many cores this machine has"; exit 1; }
echo "this machine: $cores core(s), CPUs $all"
out=$(PROBE_EXPECT=$all CHORUS_DEBUG=INFO timeout 60 "$run" --bind cores -n 2 "$probe" 2>&1); echo "$out"
for r in 0 1; do
  bound=$(echo "$out" | sed -n "s/^chorus-run: rank $r bound to core [0-9]* (CPUs \([^)]*\)).*/\1/p")
  [ -n "$bound" ] || { echo "FAIL: chorus-run did not say where rank $r is bound"; fail=1; continue; }
  eval "bound_$r=\$bound"
  line=$(echo "$out" | grep "rank $r: main")
  main=$(echo "$line" | sed 's/.*main \([^;]*\);.*/\1/')
  [ "$main" = "$bound" ] ||
    { echo "FAIL: --bind cores: rank $r main thread on CPUs '$main', expected $bound"; fail=1; }
  # One NUMA node here: the progress thread may use every CPU of it.
  echo "$line" | grep -q "others.* $all\b" ||
    { echo "FAIL: --bind cores: no thread of rank $r spans its NUMA node's CPUs ($all)"; fail=1; }
done
if [ "$cores" -ge 2 ]; then
  [ "${bound_0:-}" != "${bound_1:-}" ] ||
    { echo "FAIL: --bind cores: both ranks on CPUs ${bound_0:-?} with $cores cores"; fail=1; }
  echo "$out" | grep -q ", shared" && { echo "FAIL: a core was shared with $cores cores"; fail=1; }
  echo "$out" | grep -q "progress thread: the process is bound to CPUs" ||
    { echo "FAIL: CHORUS_DEBUG=INFO did not say where the progress thread went"; fail=1; }
else
  [ "$(echo "$out" | grep -c "^chorus-run: rank [01] bound to core 0 (CPUs $all), shared$")" = 2 ] ||
    { echo "FAIL: one core: the two ranks were not both bound to it, marked shared"; fail=1; }
fi

out=$(timeout 60 "$run" --bind none -n 2 "$probe" 2>&1); echo "$out"
n=$(echo "$out" | grep -c "main $all; others\( $all\)*$")
[ "$n" = 2 ] || { echo "FAIL: --bind none: a thread was bound ($n of 2 ranks unbound)"; fail=1; }

out=$("$run" --bind sockets -n 2 "$probe" 2>&1); rc=$?; echo "$out"
[ $rc = 2 ] && echo "$out" | grep -q "sockets not in {cores,numa,none}" ||
  { echo "FAIL: --bind sockets was not refused as a usage error (rc $rc)"; fail=1; }

out=$("$topo" 2>&1); echo "$out"
echo "$out" | grep -q "machine: .* core(s)" && echo "$out" | grep -q "NUMA node 0: CPUs" ||
  { echo "FAIL: chorus-topo did not describe the machine"; fail=1; }
[ $fail = 0 ] && echo "ok"
exit $fail
