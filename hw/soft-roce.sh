#!/usr/bin/env bash
# hw/soft-roce.sh — create, check or remove a Soft-RoCE (rxe) RDMA device on
# an Ethernet interface, so that canopy's rdma:// backend and its tests can
# run on a host without an RDMA NIC.
#
# usage: hw/soft-roce.sh add IFACE [NAME]     (NAME default rxe0; needs root)
#        hw/soft-roce.sh check                (lists RDMA links and verbs devices)
#        hw/soft-roce.sh remove [NAME]        (needs root)
#
# Needs: iproute2's `rdma` tool, ibverbs-utils (ibv_devices, ibv_devinfo),
# a kernel with CONFIG_RDMA_RXE (module rdma_rxe) and RDMA netlink. Containers
# and kernels without RDMA netlink cannot do this; the script says so.
# Afterwards: ulimit -l unlimited (or a large memlock limit) for the user
# running canopy, since every connection registers (pins) its buffers.
set -euo pipefail

die() { echo "soft-roce.sh: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found (apt-get install $2)"; }

cmd=${1:-}
case "$cmd" in
  add)
    iface=${2:-}
    name=${3:-rxe0}
    [[ -n $iface ]] || die "usage: $0 add IFACE [NAME]"
    [[ $(id -u) -eq 0 ]] || die "add needs root"
    need rdma iproute2
    ip link show "$iface" >/dev/null 2>&1 || die "no network interface '$iface' (see: ip -br link)"
    modprobe rdma_rxe 2>/dev/null || echo "soft-roce.sh: modprobe rdma_rxe failed (built in, or not available)" >&2
    if ! rdma link show >/dev/null 2>&1; then
      die "this kernel has no RDMA netlink (rdma link show fails): Soft-RoCE cannot be created here; use a host with CONFIG_RDMA_RXE or a real RDMA NIC (hw/RDMA.md)"
    fi
    if rdma link show | grep -q "link $name/"; then
      echo "soft-roce.sh: $name already exists"
    else
      rdma link add "$name" type rxe netdev "$iface" || die "rdma link add $name type rxe netdev $iface failed"
      echo "soft-roce.sh: created $name on $iface"
    fi
    rdma link show
    ;;
  check)
    need ibv_devices ibverbs-utils
    status=0
    if command -v rdma >/dev/null 2>&1 && rdma link show 2>/dev/null; then :; else
      echo "soft-roce.sh: rdma link show failed (no RDMA netlink in this kernel?)" >&2
    fi
    devices=$(ibv_devices 2>/dev/null | awk 'NR>2 {print $1}' || true)
    if [[ -z $devices ]]; then
      echo "soft-roce.sh: no RDMA device (ibv_devices lists none); create one with: $0 add IFACE" >&2
      status=1
    else
      for d in $devices; do
        ibv_devinfo -d "$d" | grep -E "hca_id|transport|state|active_mtu|link_layer" || true
        for n in /sys/class/infiniband/"$d"/ports/1/gid_attrs/ndevs/0; do
          [[ -r $n ]] && echo "  netdev: $(cat "$n")  (use its IPv4 address in rdma:// URIs, or CANOPY_RDMA_TEST_ADDR)"
        done
      done
    fi
    echo "memlock limit (ulimit -l): $(ulimit -l)"
    exit $status
    ;;
  remove)
    name=${2:-rxe0}
    [[ $(id -u) -eq 0 ]] || die "remove needs root"
    need rdma iproute2
    rdma link delete "$name" || die "rdma link delete $name failed"
    echo "soft-roce.sh: removed $name"
    ;;
  *)
    die "usage: $0 add IFACE [NAME] | check | remove [NAME]"
    ;;
esac
