#!/usr/bin/env bash
# bench/hosts.sh: all-reduce across simulated hosts -- network namespaces on a bridge, each
# "host" running its ranks under its own chorus-run -- the hierarchical all-reduce against the
# flat ring (and the tuner's choice), alternating, with an optional rate limit (tc tbf) and delay
# (tc netem, where the kernel has it) on every host's link, the host side of its veth. Root.
#
#   bench/hosts.sh                                   # 2 hosts x 2 ranks, 1 Gbit/s, 16 MiB
#   bench/hosts.sh --hosts 3 --rate 500mbit --sizes 1M,16M --repeats 7 [--delay 0.2ms]
#   bench/hosts.sh --rate none                       # veths at full speed
#
# Prints one line per run and, per size and algorithm, the median time of chorus-perf's
# out-of-place column, with the ratio ring/hier (above 1: hier is faster).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build
NHOSTS=2 PER_HOST=2 RATE=1gbit DELAY=none SIZES=16M REPEATS=5 ALGOS="ring hier auto"
while (($#)); do
  case $1 in
    --hosts) NHOSTS=$2; shift 2 ;;
    --per-host) PER_HOST=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --delay) DELAY=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --algos) ALGOS=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    *) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 2 ;;
  esac
done
RUN=$BUILD/tools/chorus-run PERF=$BUILD/bench/chorus-perf
[ -x "$RUN" ] && [ -x "$PERF" ] || { echo "build first: ninja -C $BUILD" >&2; exit 1; }
source "$ROOT/tests/launch/netns_hosts.sh"
trap remove_hosts EXIT
make_hosts "$NHOSTS" "b$$" "10.233.$(( $$ % 200 ))" || { echo "could not make the hosts (root?)" >&2; exit 1; }
for ((i = 0; i < NHOSTS; i++)); do
  ns=${HOST_NS[i]} dev=${HOST_IF[i]}
  # the rate by a token bucket (tbf); a delay needs netem, which some kernels lack
  if [ "$RATE" != none ]; then
    ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: tbf rate "$RATE" burst 256kb \
      latency 100ms || { echo "tc tbf failed: no rate limit" >&2; exit 1; }
  fi
  if [ "$DELAY" != none ]; then
    parent=root; [ "$RATE" != none ] && parent="parent 1:1"
    ip netns exec "$ns" tc qdisc add dev "$dev" $parent handle 10: netem delay "$DELAY" 2>/dev/null ||
      { [ $i = 0 ] && echo "# note: no netem qdisc in this kernel: no added delay"; }
  fi
done
echo "# $(date -u +%FT%TZ) $NHOSTS hosts x $PER_HOST ranks, link rate $RATE delay $DELAY, chorus $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"

port=29500
one_run() {  # algo size -> prints the out-of-place time (us)
  local algo=$1 size=$2 pids=() i out
  out=$(mktemp -d)
  port=$((port + 1))
  for ((i = 0; i < NHOSTS; i++)); do
    ip netns exec "${HOST_NS[i]}" env CHORUS_SOCKET_IFNAME="${HOST_IF[i]}" CHORUS_TIMEOUT=120 \
      timeout 300 "$RUN" --nnodes "$NHOSTS" --node-rank $i -n "$PER_HOST" \
      --rdzv-endpoint "${HOST_IP[0]}:$port" "$PERF" -b "$size" -e "$size" -n 10 -w 2 -c 0 \
      --time-budget 2 --algo "$algo" > "$out/$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  awk '/^\[0\] +[0-9]/ { print $7 }' "$out/0"
  rm -rf "$out"
}

declare -A times
for ((k = 1; k <= REPEATS; k++)); do
  for size in ${SIZES//,/ }; do
    for algo in $ALGOS; do
      t=$(one_run "$algo" "$size")
      echo "pass $k size $size $algo: ${t:-FAILED} us"
      times[$size/$algo]+="$t "
    done
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
echo "# medians (us) of $REPEATS passes"
for size in ${SIZES//,/ }; do
  line="$size:"
  for algo in $ALGOS; do
    m=$(echo "${times[$size/$algo]}" | median)
    line+=" $algo $m"
    eval "med_$algo=\$m"
  done
  if [ -n "${med_ring:-}" ] && [ -n "${med_hier:-}" ]; then
    line+=" ring/hier $(awk -v a="$med_ring" -v b="$med_hier" 'BEGIN { printf "%.2f", a / b }')"
  fi
  echo "$line"
done
