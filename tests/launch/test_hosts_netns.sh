#!/usr/bin/env bash
# Three hosts of two ranks each on one machine: three network namespaces on a bridge, one
# chorus-run per "host" (--nnodes 3 --node-rank i -n 2). Ranks in one namespace share a host
# (shm between them); across namespaces they talk tcp over the veths. Every collective is
# checked element by element (chorus-perf -c 1) with the hierarchical all-reduce, the ring and
# the tuner's choice, every type and op.
#   test_hosts_netns.sh CHORUS_RUN CHORUS_PERF
set -u
run=$1 perf=$2
source "$(dirname "${BASH_SOURCE[0]}")/netns_hosts.sh"
require_netns
logs=$(mktemp -d)
trap 'remove_hosts; rm -rf "$logs"' EXIT
make_hosts 3 "a$$" "10.232.$(( $$ % 200 ))" || { echo "FAIL: could not make the hosts"; exit 1; }
set +e

fail=0
# One job on the three hosts: chorus-perf with its arguments, CHORUS_* variables before them.
job() {
  local name=$1; shift
  local pids=() t0=$SECONDS
  for i in 0 1 2; do
    ip netns exec "${HOST_NS[i]}" env CHORUS_SOCKET_IFNAME="${HOST_IF[i]}" CHORUS_TIMEOUT=60 \
      CHORUS_DEBUG=INFO "$@" timeout 120 "$run" --nnodes 3 --node-rank $i -n 2 \
      --rdzv-endpoint "${HOST_IP[0]}:29411" "$perf" "${perf_args[@]}" > "$logs/$name.$i" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  if [ $rc != 0 ]; then
    echo "FAIL: $name"; cat "$logs/$name".*; fail=1; return
  fi
  # rank 0 prints the table; its summary says how many elements were wrong
  grep -q "Wrong elements *: 0 OK" "$logs/$name.0" || { echo "FAIL: $name: no '0 OK'"; cat "$logs/$name.0"; fail=1; return; }
  echo "ok: $name ($((SECONDS - t0)) s)"
}

# every rank: one shm peer (its host's other rank), four tcp peers, each pair named (INFO)
perf_args=(-b 8 -e 1M -f 16 -n 1 -w 1 -c 1 --coll all_reduce --algo hier -d all -o all)
job "all_reduce hier" env
for i in 0 1 2; do
  for r in 0 1; do
    me=$((2 * i + r)) mate=$((2 * i + 1 - r))
    tcp=$(for p in 0 1 2 3 4 5; do [ $p -ne $me ] && [ $p -ne $mate ] && echo $p; done | paste -sd,)
    grep -q "links: rank $me: 1 shm peer(s) ($mate), 4 tcp peer(s) ($tcp)" "$logs/all_reduce hier.$i" ||
      { echo "FAIL: rank $me on host $i: not shm to $mate and tcp to $tcp"; cat "$logs/all_reduce hier.$i"; fail=1; }
  done
done
grep -q "algorithm hier" "$logs/all_reduce hier.0" || { echo "FAIL: hier did not run"; fail=1; }
perf_args=(-b 8 -e 4M -f 8 -n 2 -w 1 -c 1 --coll all_reduce --algo ring -d float -o all)
job "all_reduce ring" env
perf_args=(-b 1M -e 16M -f 16 -n 2 -w 1 -c 1 --coll all_reduce --algo hier -d bf16 -o avg)
job "all_reduce hier, 2 channels" env CHORUS_NCHANNELS=2
for coll in broadcast reduce all_gather reduce_scatter; do
  perf_args=(-b 8 -e 1M -f 16 -n 2 -w 1 -c 1 --coll $coll -d all -o sum)
  job "$coll" env
done
# a rate-limited network: the tuner told (CHORUS_BETA_GBPS) picks hier for large buffers
perf_args=(-b 16M -e 16M -n 2 -w 1 -c 1 --coll all_reduce)
job "all_reduce auto, slow network" env CHORUS_BETA_GBPS=0.125
grep -q "algorithm hier" "$logs/all_reduce auto, slow network.0" ||
  { echo "FAIL: the tuner did not pick hier for a slow network"; cat "$logs/all_reduce auto, slow network.0"; fail=1; }
[ $fail = 0 ] && echo "ok: three hosts of two ranks over namespaces"
exit $fail
