#!/usr/bin/env bash
# hw/join-tuning.sh — write-back and I/O-scheduler tuning for a node that is
# about to receive a large join (bulk snapshot install onto a disk), and its
# exact undo.
#
# The tuning is the one measured for Cassandra's node join (19% faster join,
# limited by the disk's sequential write speed): let dirty pages live longer
# and grow larger before write-back starts, and use the deadline scheduler.
#   vm.dirty_expire_centisecs   3000 -> 6000
#   vm.dirty_ratio              20   -> 80
#   vm.dirty_background_ratio   10   -> 40
#   /sys/block/DEV/queue/scheduler  -> mq-deadline (or deadline on old kernels)
# canopy's bulk install already writes without per-file fsync and syncs each
# tree file once at the end (--install-fsync finish), so the longer
# write-back window is used by the join, and the one sync per file pays it.
#
# usage:
#   hw/join-tuning.sh apply DIR [STATE_FILE]   tune for the file system holding DIR;
#                                              the old values go to STATE_FILE
#                                              (default /run/canopy-join-tuning.state)
#   hw/join-tuning.sh restore [STATE_FILE]     put back exactly what apply saved, then
#                                              remove STATE_FILE
#   hw/join-tuning.sh show DIR                 print the current values for DIR's device
# Exit status: 0 done; 1 failed (message on stderr); 2 bad usage.
# apply refuses to run twice over an existing STATE_FILE (restore first), so
# the saved values are always the untuned ones. Needs root for apply/restore.
set -euo pipefail

default_state=/run/canopy-join-tuning.state
die() { echo "join-tuning: $*" >&2; exit 1; }
usage() { sed -n '/^# usage:/,/^# Exit status/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# block_device DIR -> the whole-disk name under /sys/block (vda, sda, nvme0n1)
# of the file system holding DIR; fails for tmpfs and other non-block mounts.
block_device() {
  local src name
  src=$(findmnt -n -o SOURCE --target "$1" 2>/dev/null | tail -n 1) || die "cannot find the mount holding $1"
  [[ $src == /dev/* ]] || die "$1 is on '$src', not a block device (tmpfs?): nothing to tune"
  name=$(basename "$(readlink -f "$src")")
  if [[ -e /sys/block/$name/queue/scheduler ]]; then
    echo "$name"
    return 0
  fi
  # A partition: its parent is the directory above it in /sys/class/block.
  local parent
  parent=$(basename "$(dirname "$(readlink -f "/sys/class/block/$name")")")
  [[ -e /sys/block/$parent/queue/scheduler ]] || die "no I/O scheduler for $src (device $name)"
  echo "$parent"
}

current_scheduler() { sed -n 's/.*\[\(.*\)\].*/\1/p' "/sys/block/$1/queue/scheduler"; }

show() {
  local dev
  dev=$(block_device "$1")
  echo "device $dev (for $1)"
  echo "scheduler: $(cat "/sys/block/$dev/queue/scheduler")"
  sysctl vm.dirty_expire_centisecs vm.dirty_ratio vm.dirty_background_ratio
}

apply() {
  local dir=$1 state=${2:-$default_state} dev sched want
  [[ $(id -u) -eq 0 ]] || die "apply needs root (sysctl and /sys/block writes)"
  [[ -d $dir ]] || die "$dir is not a directory"
  [[ ! -e $state ]] || die "$state exists: the machine is already tuned (run restore first)"
  dev=$(block_device "$dir")
  sched=$(current_scheduler "$dev")
  {
    echo "device=$dev"
    echo "scheduler=$sched"
    echo "dirty_expire_centisecs=$(sysctl -n vm.dirty_expire_centisecs)"
    echo "dirty_ratio=$(sysctl -n vm.dirty_ratio)"
    echo "dirty_background_ratio=$(sysctl -n vm.dirty_background_ratio)"
  } > "$state.tmp"
  mv "$state.tmp" "$state"
  sysctl -q -w vm.dirty_expire_centisecs=6000 vm.dirty_ratio=80 vm.dirty_background_ratio=40
  want=""
  for s in mq-deadline deadline; do
    grep -qw "$s" "/sys/block/$dev/queue/scheduler" && { want=$s; break; }
  done
  if [[ -n $want ]]; then
    echo "$want" > "/sys/block/$dev/queue/scheduler"
  else
    echo "join-tuning: $dev offers no deadline scheduler ($(cat "/sys/block/$dev/queue/scheduler")); left at $sched" >&2
  fi
  echo "join-tuning: applied for $dev (old values in $state)"
}

restore() {
  local state=${1:-$default_state} device="" scheduler="" dirty_expire_centisecs="" dirty_ratio="" dirty_background_ratio=""
  [[ $(id -u) -eq 0 ]] || die "restore needs root"
  [[ -f $state ]] || die "no saved state at $state (nothing was applied, or it was restored already)"
  local key value
  while IFS='=' read -r key value; do
    case $key in
      device) device=$value ;;
      scheduler) scheduler=$value ;;
      dirty_expire_centisecs) dirty_expire_centisecs=$value ;;
      dirty_ratio) dirty_ratio=$value ;;
      dirty_background_ratio) dirty_background_ratio=$value ;;
      *) die "$state: unexpected line '$key=$value'" ;;
    esac
  done < "$state"
  for v in "$dirty_expire_centisecs" "$dirty_ratio" "$dirty_background_ratio"; do
    [[ $v =~ ^[0-9]+$ ]] || die "$state: a saved sysctl value is not a number ('$v')"
  done
  [[ $device =~ ^[A-Za-z0-9._-]+$ && -e /sys/block/$device/queue/scheduler ]] || die "$state: bad device '$device'"
  sysctl -q -w vm.dirty_expire_centisecs="$dirty_expire_centisecs" vm.dirty_ratio="$dirty_ratio" \
    vm.dirty_background_ratio="$dirty_background_ratio"
  [[ -z $scheduler ]] || echo "$scheduler" > "/sys/block/$device/queue/scheduler"
  rm -f "$state"
  echo "join-tuning: restored $device (scheduler $scheduler, dirty_expire_centisecs $dirty_expire_centisecs, dirty_ratio $dirty_ratio, dirty_background_ratio $dirty_background_ratio)"
}

(($# >= 1)) || usage
cmd=$1
shift
case $cmd in
  apply) (($# >= 1 && $# <= 2)) || usage; apply "$@" ;;
  restore) (($# <= 1)) || usage; restore "$@" ;;
  show) (($# == 1)) || usage; show "$1" ;;
  -h | --help | help) usage ;;
  *) echo "join-tuning: unknown command '$cmd'" >&2; usage ;;
esac
