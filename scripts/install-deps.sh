#!/usr/bin/env bash
# Installs (with apt-get) every Debian 12 package canopy builds, tests or
# benchmarks with. Idempotent: only missing packages are installed, and apt's
# index is refreshed only when something is missing. Run as root.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
  # libraries
  libboost-program-options-dev libgtest-dev libgmock-dev libisal-dev libxxhash-dev
  libssl-dev nlohmann-json3-dev libfmt-dev libraft-dev libuv1-dev
  prometheus-cpp-dev  # metrics model + text exposition format (base/metrics.h)
  # RDMA (rdma-core) and DPDK backends
  libibverbs-dev librdmacm-dev ibverbs-providers rdma-core ibverbs-utils
  perftest  # ib_write_bw / ib_send_bw, the peers of bench/scenarios/rdma_perftest.sh
  # QEMU guests with Soft-RoCE for the rdma_vm tests (hw/rdma-vm.sh; the guest kernel is
  # fetched with apt-get download into a cache, never installed)
  qemu-system-x86 busybox-static xz-utils
  dpdk dpdk-dev libdpdk-dev
  # test and benchmark peers / helpers
  iproute2 procps psmisc iperf3 gnuplot-nox util-linux jq bc
  # a real Prometheus scraping a test cluster (tests/metrics_test.cc)
  prometheus
  # the .deb (cpack -G DEB: dpkg-shlibdeps finds its Depends, file spots the ELF binaries)
  dpkg-dev file
  openssl  # CLI: test certificates for the tls+tcp rows of bench/scenarios/rcopy_*.sh
  # replication benchmark peer (bench/scenarios/commits_etcd.sh), and Go + etcd's client
  # library to build its native gRPC load program (bench/etcdload, GO111MODULE=off)
  etcd-server etcd-client golang-go golang-etcd-server-dev
  # HTTP benchmark peers (bench/scenarios/http_nginx.sh, load_wrk.sh)
  nginx-light wget wrk
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# The guest kernel for hw/rdma-vm.sh (downloaded and unpacked once into its cache, not
# installed). Not fatal: without it the rdma_vm tests skip and say why.
prepare_rdma_vm() {
  bash "$(dirname "$0")/../hw/rdma-vm.sh" prepare >/dev/null ||
    echo "install-deps: hw/rdma-vm.sh prepare failed; the rdma_vm tests will skip" >&2
}

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  prepare_rdma_vm
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root (or install them yourself) and try again" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
prepare_rdma_vm
