#!/usr/bin/env bash
# Issue 17: the bootstrap store's host dies on a job of three "hosts" (network namespaces on a
# bridge, two ranks each, started by hand as torchrun would: rank 0 hosts the store on host 0's
# address). The survivors move to a store on the lowest live rank -- across the hosts, through
# the standby ports on each host's own address -- then shrink and go on (elastic_probe). Twice:
# rank 0 killed (rank 1, on the same host, takes over), and host 0's two ranks killed together
# (rank 2, on another host, takes over). Usage: test_failover_netns.sh ELASTIC_PROBE
set -u
probe=$1
source "$(dirname "${BASH_SOURCE[0]}")/netns_hosts.sh"
require_netns
logs=$(mktemp -d)
trap 'remove_hosts; rm -rf "$logs"' EXIT
make_hosts 3 "f$$" "10.233.$(( $$ % 200 ))" || { echo "FAIL: could not make the hosts"; exit 1; }
set +e
fail=0
secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')

# victims (a comma list), the rank expected to host the new store
job() {
  local victims=$1 host=$2 port=$((29500 + RANDOM % 1000)) pids=() r
  for r in 0 1 2 3 4 5; do
    local h=$((r / 2))
    ip netns exec "${HOST_NS[h]}" env RANK=$r WORLD_SIZE=6 LOCAL_RANK=$((r % 2)) \
      LOCAL_WORLD_SIZE=2 MASTER_ADDR="${HOST_IP[0]}" MASTER_PORT=$port CHORUS_JOB_SECRET=$secret \
      CHORUS_SOCKET_IFNAME="${HOST_IF[h]}" CHORUS_TIMEOUT=30 \
      timeout 90 "$probe" "$victims" > "$logs/$victims.$r" 2>&1 &
    pids+=($!)
  done
  local n=0 left=$((6 - $(echo "$victims" | tr ',' '\n' | wc -l)))
  for r in 0 1 2 3 4 5; do
    wait "${pids[r]}"; local rc=$?
    if echo ",$victims," | grep -q ",$r,"; then
      [ $rc = 137 ] || { echo "FAIL: victims $victims: rank $r exited $rc, not killed"; fail=1; }
      continue
    fi
    if [ $rc = 0 ] && grep -q "rank $r: continued as rank [0-9] of $left" "$logs/$victims.$r"; then
      n=$((n + 1))
    else
      echo "FAIL: victims $victims: rank $r exited $rc"; cat "$logs/$victims.$r"; fail=1
    fi
  done
  grep -q "the store moved to rank $host at ${HOST_IP[host / 2]}:" "$logs/$victims.5" ||
    { echo "FAIL: victims $victims: rank 5 did not move to rank $host's store on host $((host / 2))"
      cat "$logs/$victims.5"; fail=1; }
  echo "ok: victims $victims: $n of $left survivors continued; the store moved to rank $host"
}

job 0 1
job 0,1 2
[ $fail = 0 ] && echo "ok: the store failed over across namespaces"
exit $fail
