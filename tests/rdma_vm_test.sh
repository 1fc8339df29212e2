#!/usr/bin/env bash
# ctest driver of the rdma_vm test: boots Soft-RoCE guests with hw/rdma-vm.sh and runs
# tests/rdma_vm_guest.sh in them (see there for what is checked).
#   rdma_vm_test.sh SOURCE_DIR BUILD_DIR pair|single
# "pair" (the ctest test rdma_vm) boots two guests once and does everything there; "single"
# (by hand) runs the within-one-guest suites in one guest.
# Exit 77 (ctest SKIP_RETURN_CODE) with the reason when guests cannot run here (no QEMU, no
# kernel package, no busybox-static) or CANOPY_RDMA_VM=0 turns them off; any other non-zero
# status is a failure. Limits: CANOPY_VM_TEST_TIMEOUT (default 1200 s) for the guests, after
# which hw/rdma-vm.sh kills them (exit 124).
set -euo pipefail
src=$1
build=$2
mode=$3
vm=$src/hw/rdma-vm.sh
guest=$src/tests/rdma_vm_guest.sh
limit=${CANOPY_VM_TEST_TIMEOUT:-1200}
if [[ ${CANOPY_RDMA_VM:-1} == 0 ]]; then
  echo "rdma_vm_test: not run: CANOPY_RDMA_VM=0 (unset it to boot the Soft-RoCE guests; hw/RDMA.md)"
  exit 77
fi
# The guests run the build tree at its host path; everything they need must be built.
for bin in tests/rdma_transport_test tests/cluster_replication_test tests/cluster_failover_test \
           tools/rcopy/rcopy tools/canopy/canopy; do
  [[ -x $build/$bin ]] || { echo "rdma_vm_test: $build/$bin is not built" >&2; exit 1; }
done
# Everything in the guests runs 10-50x slower than on the host (TCG): the tests' hang bounds
# (not what they assert) are scaled (tests/testing/test_util.h, TestTimeScale).
envs=(--env CANOPY_TEST_TIME_SCALE="${CANOPY_TEST_TIME_SCALE:-10}")
# The source tree too (the guest script, test data): under /tmp (a fresh clone there) the guest
# sees it only as a share (hw/rdma-vm.sh --share); elsewhere it is part of the host root anyway.
envs+=(--share "$src")
[[ -n ${CANOPY_VM_FULL:-} ]] && envs+=(--env CANOPY_VM_FULL=1)
# The guests are CPU-bound emulation: keep the host responsive.
run_vm() { exec nice -n 5 bash "$vm" "$@"; }
case "$mode" in
  single) run_vm run --timeout "$limit" --cwd "$build" "${envs[@]}" -- "bash $guest single $build" ;;
  pair) run_vm pair --timeout "$limit" --cwd "$build" "${envs[@]}" \
          --a "bash $guest pair-a $build" --b "bash $guest pair-b $build" ;;
  *) echo "rdma_vm_test: unknown mode $mode" >&2; exit 2 ;;
esac
