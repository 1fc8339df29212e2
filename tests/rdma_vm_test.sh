#!/usr/bin/env bash
# ctest driver of the rdma_vm tests: boots Soft-RoCE guests with hw/rdma-vm.sh and runs
# tests/rdma_vm_guest.sh in them (see there for what is checked).
#   rdma_vm_test.sh SOURCE_DIR BUILD_DIR single|pair
# Exit 77 (ctest SKIP_RETURN_CODE) with the reason when guests cannot run here (no QEMU,
# no kernel package, no busybox-static); any other non-zero status is a failure.
set -euo pipefail
src=$1
build=$2
mode=$3
vm=$src/hw/rdma-vm.sh
guest=$src/tests/rdma_vm_guest.sh
limit=${CANOPY_VM_TEST_TIMEOUT:-420}
# Opt-in for now: on the shared 2-core development VM (load 10+) connection set-up inside and
# between TCG guests exceeded the backends' 5 s bounds and the suite's 20 s I/O bound, so these
# tests did not pass there (see hw/RDMA.md, "Status"). An idle machine or KVM should be tried
# before CI turns them on with CANOPY_RDMA_VM=1.
if [[ ${CANOPY_RDMA_VM:-0} != 1 ]]; then
  echo "rdma_vm_test: not run: set CANOPY_RDMA_VM=1 to boot the Soft-RoCE guests (minutes of TCG; hw/RDMA.md)"
  exit 77
fi
# The guests run the build tree at its host path; everything they need must be built.
for bin in tests/rdma_transport_test tests/cluster_replication_test tests/cluster_failover_test \
           tools/rcopy/rcopy tools/canopy/canopy; do
  [[ -x $build/$bin ]] || { echo "rdma_vm_test: $build/$bin is not built" >&2; exit 1; }
done
case "$mode" in
  single) exec bash "$vm" run --timeout "$limit" --cwd "$build" -- "bash $guest single $build" ;;
  pair) exec bash "$vm" pair --timeout "$limit" --cwd "$build" \
          --a "bash $guest pair-a $build" --b "bash $guest pair-b $build" ;;
  *) echo "rdma_vm_test: unknown mode $mode" >&2; exit 2 ;;
esac
