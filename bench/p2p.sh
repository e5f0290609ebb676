#!/usr/bin/env bash
# bench/p2p.sh: chorus point-to-point latency and bandwidth on both links, next to the machine's
# limits as ../shared/peers/comm measures them (memcpy one thread, iperf3 over loopback), in one run.
#   bench/p2p.sh [build-dir]      REPEATS=3 (passes; medians are over passes)
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
peers=${PEERS_DIR:-$root/../shared/peers/comm}
repeats=${REPEATS:-3}
[ -r "$peers/membw.cc" ] || { echo "p2p.sh: no $peers/membw.cc (set PEERS_DIR)" >&2; exit 1; }
command -v iperf3 >/dev/null || { [ "$(id -u)" = 0 ] && apt-get install -y -q iperf3 >/dev/null; }
mkdir -p "$build/peers"
[ "$build/peers/membw" -nt "$peers/membw.cc" ] ||
  g++ -O3 -march=native -std=c++17 -pthread -I"$peers" -o "$build/peers/membw" "$peers/membw.cc"
run="$build/tools/chorus-run --no-prefix -n 2"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for pass in $(seq 1 "$repeats"); do
  for t in shm tcp; do
    CHORUS_TRANSPORT=$t $run "$build/examples/bcast_barrier" > "$tmp/pp-$t-$pass.txt"
  done
  BENCH_SIZES=8,1048576,134217728 "$build/peers/membw" 2>/dev/null | grep '^RESULT peer=memcpy-1t' > "$tmp/mem-$pass.txt" || true
  if command -v iperf3 >/dev/null; then
    port=$((20000 + RANDOM % 20000))
    iperf3 -s -1 -p $port >/dev/null 2>&1 & sleep 0.3
    iperf3 -c 127.0.0.1 -p $port -t 3 -f g 2>/dev/null | awk '/receiver/ {print $(NF-2)}' > "$tmp/iperf-$pass.txt" || true
    wait
  fi
done
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2); else print "n/a"}'; }
echo "# chorus point-to-point, 2 ranks, rank 0 <-> rank 1 ping-pong (examples/bcast_barrier), medians of $repeats passes"
printf "%-6s %10s %14s %10s\n" link bytes "one-way us" "GB/s"
for t in shm tcp; do
  for b in 8 4096 1048576 67108864; do
    us=$(cat "$tmp"/pp-$t-*.txt | awk -v b=$b '/point-to-point/ {p=1} p && $1==b {print $2}' | median)
    gb=$(cat "$tmp"/pp-$t-*.txt | awk -v b=$b '/point-to-point/ {p=1} p && $1==b {print $3}' | median)
    printf "%-6s %10s %14s %10s\n" $t $b "$us" "$gb"
  done
done
echo "# limits (../shared/peers/comm): memcpy one thread, S/t"
for b in 8 1048576 134217728; do
  gb=$(cat "$tmp"/mem-*.txt | awk -v b=$b '{for(i=1;i<=NF;i++) if ($i=="bytes="b) ok=1} ok {for(i=1;i<=NF;i++) if ($i ~ /^algbw_GBps=/) {sub("algbw_GBps=","",$i); print $i}; ok=0}' | median)
  printf "memcpy-1t %10s bytes %10s GB/s\n" $b "$gb"
done
gbit=$(cat "$tmp"/iperf-*.txt 2>/dev/null | median)
echo "iperf3 loopback, one stream: $gbit Gbit/s = $(awk -v g="$gbit" 'BEGIN {if (g+0>0) printf "%.2f", g/8; else print "n/a"}') GB/s"
