#!/usr/bin/env bash
# Issue 14 item 4: a rank's tcp links listen on the NIC closest to its GPU. In a namespace with
# two veth interfaces d0 (10.1.0.1, the first) and d1 (10.2.0.1), hwloc reads a made-up machine
# (HWLOC_XMLFILE: tests/transport/data/two_sockets_gpus_nics.xml with its NICs renamed d0/d1)
# in which d1 sits behind the PCI switch of GPU 0000:81:00.0. The GPUs are faked
# (CHORUS_TEST_GPU_UUID=UUID@BUS): rank 0 on GPU 0000:81:00.0 must listen on 10.2.0.1; rank 1,
# whose GPU's closest NIC (mlx5_0) has no IP interface here, on the default (10.1.0.1); and with
# no GPU both take the default.
#   test_nic_near_gpu.sh CHORUS_RUN PROBE XML
set -u
run=$1 probe=$2 xml=$3
ns=chorus-nic-$$
if ! ip netns add $ns 2>/dev/null; then
  echo "skip: 'ip netns add' is not allowed here (needs root and CAP_SYS_ADMIN)"; exit 77
fi
tmp=$(mktemp -d)
cleanup() { ip netns del $ns 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
ip -n $ns link set lo up
for i in 0 1; do
  ip -n $ns link add d$i type veth peer name d${i}p && ip -n $ns addr add 10.$((i + 1)).0.1/24 dev d$i &&
    ip -n $ns link set d$i up && ip -n $ns link set d${i}p up ||
    { echo "skip: cannot make veth interfaces in a namespace here"; exit 77; }
done
sed -e 's/name="eth1"/name="d0"/' -e 's/name="mlx5_1"/name="d1"/' "$xml" > "$tmp/machine.xml"
fail=0
# Each rank gets its own fake GPU: a tiny wrapper picks it by LOCAL_RANK.
cat > "$tmp/worker.sh" <<WRAP
#!/bin/sh
[ -n "\$GPUS" ] && export CHORUS_TEST_GPU_UUID=\$(echo "\$GPUS" | cut -d' ' -f\$((LOCAL_RANK + 1)))
exec "$probe"
WRAP
chmod +x "$tmp/worker.sh"
out=$(ip netns exec $ns env HWLOC_XMLFILE="$tmp/machine.xml" CHORUS_TRANSPORT=tcp CHORUS_DEBUG=INFO \
  GPUS="GPU-a@0000:81:00.0 GPU-b@0000:11:00.0" timeout 60 "$run" -n 2 "$tmp/worker.sh" 2>&1)
echo "$out"
echo "$out" | grep -q "rank 0: GPU GPU-a at 0000:81:00.0: the closest NIC is d1" ||
  { echo "FAIL: rank 0 did not find d1 closest to its GPU"; fail=1; }
echo "$out" | grep -q "links: rank 0: listening on 10.2.0.1 (interfaces preferred: d1)" ||
  { echo "FAIL: rank 0 does not listen on d1's address"; fail=1; }
echo "$out" | grep -q "links: rank 1: listening on 10.1.0.1 (interfaces preferred: mlx5_0)" ||
  { echo "FAIL: rank 1 did not fall back to the default interface"; fail=1; }
echo "$out" | grep -q "rank 1: main" || { echo "FAIL: the job did not run"; fail=1; }
out=$(ip netns exec $ns env HWLOC_XMLFILE="$tmp/machine.xml" CHORUS_TRANSPORT=tcp CHORUS_DEBUG=INFO \
  timeout 60 "$run" -n 2 "$tmp/worker.sh" 2>&1)
echo "$out" | grep -q "listening on\|closest NIC" &&
  { echo "$out"; echo "FAIL: a rank without a GPU chose by GPU locality"; fail=1; }
echo "$out" | grep -q "rank 1: main" || { echo "$out"; echo "FAIL: the job without GPUs did not run"; fail=1; }
[ $fail = 0 ] && echo ok
exit $fail
