#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a veth pair. The ranks see
# different host identities, so they must talk over tcp across the veth (CHORUS_SOCKET_IFNAME).
set -u
example=$1
if ! ip netns add chorus-probe-$$ 2>/dev/null; then
  echo "skip: 'ip netns add' is not allowed here (needs root and CAP_SYS_ADMIN)"; exit 77
fi
ip netns del chorus-probe-$$
a=chorus-a-$$; b=chorus-b-$$
cleanup() { ip netns del $a 2>/dev/null; ip netns del $b 2>/dev/null; }
trap cleanup EXIT
set -e
ip netns add $a; ip netns add $b
ip link add veth-a$$ type veth peer name veth-b$$
ip link set veth-a$$ netns $a; ip link set veth-b$$ netns $b
ip -n $a addr add 10.231.$(( $$ % 200 )).1/24 dev veth-a$$
ip -n $b addr add 10.231.$(( $$ % 200 )).2/24 dev veth-b$$
for ns in $a $b; do ip -n $ns link set lo up; done
ip -n $a link set veth-a$$ up; ip -n $b link set veth-b$$ up
set +e
master=10.231.$(( $$ % 200 )).1
common="WORLD_SIZE=2 MASTER_ADDR=$master MASTER_PORT=29400 CHORUS_TIMEOUT=30 CHORUS_DEBUG=INFO"
ip netns exec $a env RANK=0 $common CHORUS_SOCKET_IFNAME=veth-a$$ timeout 60 "$example" --quick > /tmp/netns-$$-0.log 2>&1 &
p0=$!
ip netns exec $b env RANK=1 $common CHORUS_SOCKET_IFNAME=veth-b$$ timeout 60 "$example" --quick > /tmp/netns-$$-1.log 2>&1 &
p1=$!
wait $p0; r0=$?; wait $p1; r1=$?
cat /tmp/netns-$$-0.log /tmp/netns-$$-1.log; rm -f /tmp/netns-$$-*.log
[ $r0 = 0 ] && [ $r1 = 0 ] || { echo "FAIL: ranks exited $r0 and $r1"; exit 1; }
echo ok: two hosts over veth
