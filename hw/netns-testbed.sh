#!/usr/bin/env bash
# hw/netns-testbed.sh — a two-host testbed on one machine: network namespaces
# A and B joined by a veth pair (MTU 9000 where the kernel allows it), for
# canopy's dpdk:// backend over net_af_packet, or tcp:// between namespaces.
#
# usage: hw/netns-testbed.sh up   [PREFIX]   (default PREFIX canopy; needs root)
#        hw/netns-testbed.sh down [PREFIX]
#        hw/netns-testbed.sh status [PREFIX]
#
# Creates namespaces PREFIX-a / PREFIX-b with interfaces PREFIX-va / PREFIX-vb.
# The kernel side gets 10.9.0.1/24 and 10.9.0.2/24 for tcp:// tests; the dpdk
# backend does not use those (it answers ARP for its own addresses), so give
# dpdk:// other addresses on the same wire, e.g.:
#
#   af=framesz=16384,blocksz=16384,framecnt=2048
#   ip netns exec canopy-a build/tools/bench/bench --server --transport dpdk --bind 10.9.1.1 --port 7000 \
#       --transport-arg "--no-huge --no-pci --file-prefix=a --vdev=net_af_packet0,iface=canopy-va,$af"
#   ip netns exec canopy-b build/tools/bench/bench --transport dpdk --port 7000 \
#       --transport-arg "--no-huge --no-pci --file-prefix=b --vdev=net_af_packet0,iface=canopy-vb,$af ip=10.9.1.2" 10.9.1.1
#
# (--transport-arg is split on spaces into TransportOptions::backend_args;
# rcopy takes the same flag). The veth MTU of 9000 serves tcp://, and
# dpdk:// too: net_af_packet reports a 1518-byte frame limit, but canopy
# sends frames up to its ring frame size (framesz=16384 above) within the
# interface's MTU (hw/DPDK.md); with the default framesz it runs at ~2 KB.
set -euo pipefail

die() { echo "netns-testbed.sh: $*" >&2; exit 1; }

cmd=${1:-}
prefix=${2:-canopy}
ns_a="$prefix-a"
ns_b="$prefix-b"
if_a="$prefix-va"
if_b="$prefix-vb"
(( ${#if_a} <= 15 )) || die "prefix '$prefix' too long: interface names are limited to 15 characters"

case "$cmd" in
  up)
    [[ $(id -u) -eq 0 ]] || die "up needs root"
    command -v ip >/dev/null || die "ip not found (apt-get install iproute2)"
    ip netns list | grep -qw "$ns_a" && die "$ns_a already exists (run: $0 down $prefix)"
    ip netns add "$ns_a"
    ip netns add "$ns_b"
    ip link add "$if_a" type veth peer name "$if_b"
    ip link set "$if_a" netns "$ns_a"
    ip link set "$if_b" netns "$ns_b"
    for side in a b; do
      ns="$prefix-$side"; ifc="$prefix-v$side"
      ip -n "$ns" link set lo up
      if ! ip -n "$ns" link set "$ifc" mtu 9000 2>/dev/null; then
        echo "netns-testbed.sh: MTU 9000 refused on $ifc, keeping $(ip -n "$ns" -o link show "$ifc" | grep -o 'mtu [0-9]*')" >&2
      fi
      ip -n "$ns" link set "$ifc" up
    done
    ip -n "$ns_a" addr add 10.9.0.1/24 dev "$if_a"
    ip -n "$ns_b" addr add 10.9.0.2/24 dev "$if_b"
    echo "up: $ns_a/$if_a (10.9.0.1) <-> $ns_b/$if_b (10.9.0.2)"
    ;;
  down)
    [[ $(id -u) -eq 0 ]] || die "down needs root"
    # Deleting a namespace destroys the veth end inside it (and so the pair).
    ip netns del "$ns_a" 2>/dev/null || true
    ip netns del "$ns_b" 2>/dev/null || true
    echo "down: $ns_a, $ns_b removed"
    ;;
  status)
    for ns in "$ns_a" "$ns_b"; do
      if ip netns list | grep -qw "$ns"; then
        ip -n "$ns" -br addr show
      else
        echo "$ns: absent"
      fi
    done
    ;;
  *)
    die "usage: $0 up|down|status [PREFIX]"
    ;;
esac
