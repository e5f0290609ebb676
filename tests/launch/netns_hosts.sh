# Sourced by tests/launch/test_hosts_netns.sh, test_failover_netns.sh and bench/hosts.sh: several "hosts" on one
# machine, as network namespaces whose veths meet on a bridge. Needs root.
#   make_hosts N TAG NET   N namespaces; host i is HOST_NS[i], its veth HOST_IF[i] with address
#                          HOST_IP[i] = NET.(i+1); TAG (a few characters, e.g. the pid) keeps
#                          names apart; returns non-zero when something cannot be made
#   remove_hosts           removes them and the bridge
#   require_netns          exits 77 (skip), saying why, where namespaces cannot be made

require_netns() {
  if ! ip netns add "chorus-probe-$$" 2>/dev/null; then
    echo "skip: 'ip netns add' is not allowed here (needs root and CAP_SYS_ADMIN)"; exit 77
  fi
  ip netns del "chorus-probe-$$"
}

make_hosts() {
  local n=$1 tag=$2 net=$3 i
  BRIDGE=br$tag HOST_NS=() HOST_IF=() HOST_IP=()
  ip link add "$BRIDGE" type bridge && ip link set "$BRIDGE" up || return 1
  for ((i = 0; i < n; i++)); do
    HOST_NS+=("chorus-$tag-h$i") HOST_IF+=("v$i$tag") HOST_IP+=("$net.$((i + 1))")
    ip netns add "${HOST_NS[i]}" &&
      ip link add "v$i$tag" type veth peer name "p$i$tag" &&
      ip link set "v$i$tag" netns "${HOST_NS[i]}" &&
      ip link set "p$i$tag" master "$BRIDGE" up &&
      ip -n "${HOST_NS[i]}" addr add "${HOST_IP[i]}/24" dev "v$i$tag" &&
      ip -n "${HOST_NS[i]}" link set lo up &&
      ip -n "${HOST_NS[i]}" link set "v$i$tag" up || return 1
  done
}

remove_hosts() {
  local ns
  for ns in "${HOST_NS[@]}"; do ip netns del "$ns" 2>/dev/null; done
  ip link del "$BRIDGE" 2>/dev/null
}
