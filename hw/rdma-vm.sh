#!/usr/bin/env bash
# hw/rdma-vm.sh — RDMA hosts on any Linux machine: one QEMU guest, or a pair
# joined by a private link, each with a Soft-RoCE (rxe) device, running the
# host's own binaries (the host's root is the guest's root, read-only).
#
# usage:
#   hw/rdma-vm.sh prepare                 fetch + unpack the guest kernel, build the initramfs (cached)
#   hw/rdma-vm.sh check                   exit 0 if guests can boot here, else say why (exit 77)
#   hw/rdma-vm.sh run  [OPTS] -- CMD      one guest runs CMD (a bash command line)
#   hw/rdma-vm.sh pair [OPTS] --a CMD_A --b CMD_B
#                                         two guests, A = 10.77.0.1, B = 10.77.0.2, run both at once
#   hw/rdma-vm.sh shell [--pair] [OPTS]   interactive shell on guest A's console (with --pair, guest B
#                                         idles until A's shell exits); type `exit` to power off
# OPTS:
#   --timeout S    hard wall limit for the guests (default 600); then they are killed, exit 124
#   --out DIR      where results go (default: a new temporary directory, removed unless --keep)
#   --keep         keep the temporary results directory (its path is printed)
#   --mem MIB      guest memory (default 1536)   --smp N   guest vCPUs (default 2)
#   --cwd DIR      working directory in the guest (default: the current directory)
#   --share DIR    a host directory the guest must see although it lies under /tmp, /run or
#                  /dev/shm (which the guest covers with its own tmpfs); it is mounted read-only
#                  at its host path. The --cwd directory is shared so by itself. (repeatable)
#   --env NAME=V   extra environment variable for the guest commands (repeatable)
#   --quiet        do not copy the guests' output to stdout/stderr
#
# Each guest's command runs as root under bash in a chroot of the host's / (read-only 9p), with
# tmpfs on /tmp /run /dev/shm (with the --cwd and --share directories under them mounted back,
# read-only), `ulimit -l unlimited`, rxe0 on eth0, and environment
#   CANOPY_VM_ROLE=a|b  CANOPY_VM_SELF=<own IPv4>  CANOPY_VM_PEER=<the other's IPv4>
#   CANOPY_RDMA_TEST_ADDR=<own IPv4>  CANOPY_VM_OUT=<results dir, writable, shared by both guests>
#   CANOPY_VM_DIR=<this guest's own results dir>
# A guest powers itself off when its command ends. The host side collects, per guest, in
# OUT/a and OUT/b: stdout, stderr, rc (the command's exit status), console.log (kernel + init).
# Exit status: 0 if every guest's command exited 0; else the first non-zero rc (A before B);
# 124 when the time limit killed a guest; 77 when guests cannot run here (reason on stderr).
# The guests are always shut down: on exit, on a signal, and by `timeout` around each QEMU even
# if this script itself is SIGKILLed.
#
# Facts this depends on (hw/RDMA.md has the background):
#   - qemu-system-x86_64 with -accel tcg -cpu max (KVM, if it works on the host, with
#     CANOPY_VM_ACCEL=kvm); without -cpu max host-built binaries die with SIGILL.
#   - Debian's kernel package (linux-image-amd64 -> linux-image-6.1.*) is fetched with
#     `apt-get download` and unpacked with `dpkg-deb -x` into the cache; it is never installed.
#   - busybox-static makes the initramfs (modules, 9p mounts, chroot).
# Environment: CANOPY_VM_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/canopy-rdma-vm),
#   CANOPY_VM_KERNEL_PKG (default: what linux-image-amd64 depends on), CANOPY_VM_QEMU,
#   CANOPY_VM_ACCEL (tcg), CANOPY_VM_CPU (max), CANOPY_VM_ROOT_CACHE (loose: the guest caches the
#   host root, so do not rebuild on the host while a guest runs; none).
set -euo pipefail

SKIP=77
die() { echo "rdma-vm: $*" >&2; exit 1; }
skip() { echo "rdma-vm: cannot run guests here: $*" >&2; exit $SKIP; }

CACHE=${CANOPY_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/canopy-rdma-vm}
QEMU=${CANOPY_VM_QEMU:-qemu-system-x86_64}
ACCEL=${CANOPY_VM_ACCEL:-tcg}
CPU=${CANOPY_VM_CPU:-max}
# 9p cache mode of the guest's (read-only) view of the host root: loose (default) caches in the
# guest, so rebuild on the host only while no guest runs; none reads every access through.
ROOT_CACHE=${CANOPY_VM_ROOT_CACHE:-loose}
BUSYBOX=${CANOPY_VM_BUSYBOX:-/bin/busybox}
# Modules the guest loads before the 9p root (virtio, 9p) and for Soft-RoCE (rxe needs
# crc32_generic for its ICRC, rdma_ucm for librdmacm's /dev/infiniband/rdma_cm).
MODULES=(virtio_pci virtio_net 9pnet_virtio 9p crc32_generic rdma_rxe ib_uverbs rdma_ucm)
INITRAMFS_VERSION=8  # bump when the init script or the module list changes

# ---------------------------------------------------------------- preparation (cached)

kernel_package() {
  if [[ -n ${CANOPY_VM_KERNEL_PKG:-} ]]; then echo "$CANOPY_VM_KERNEL_PKG"; return; fi
  command -v apt-cache >/dev/null 2>&1 || return 1
  apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}

# The unpacked kernel: $CACHE/kernel/<pkg>/{boot,lib}; prints the directory.
prepare_kernel() {
  local pkg dir tmp
  pkg=$(kernel_package) || true
  if [[ -z $pkg ]]; then
    # Offline with a kernel already unpacked: use the newest one.
    dir=$(ls -d "$CACHE"/kernel/linux-image-* 2>/dev/null | sort -V | tail -1 || true)
    [[ -n $dir && -f $dir/.done ]] && { echo "$dir"; return 0; }
    echo "no kernel package known (apt-cache depends linux-image-amd64 found none) and none cached in $CACHE" >&2
    return 1
  fi
  dir=$CACHE/kernel/$pkg
  [[ -f $dir/.done ]] && { echo "$dir"; return 0; }
  command -v apt-get >/dev/null 2>&1 || { echo "apt-get not found: cannot fetch $pkg" >&2; return 1; }
  command -v dpkg-deb >/dev/null 2>&1 || { echo "dpkg-deb not found: cannot unpack $pkg" >&2; return 1; }
  mkdir -p "$CACHE/kernel"
  tmp=$(mktemp -d "$CACHE/kernel/.fetch.XXXXXX")
  # apt-get download writes into the current directory; _apt may not be able to write there.
  chmod 755 "$tmp"
  if ! (cd "$tmp" && apt-get download -q "$pkg" >"$tmp/apt.log" 2>&1); then
    echo "apt-get download $pkg failed: $(tail -2 "$tmp/apt.log" | tr '\n' ' ')" >&2
    rm -rf "$tmp"; return 1
  fi
  mkdir -p "$tmp/root"
  dpkg-deb -x "$tmp"/*.deb "$tmp/root" || { rm -rf "$tmp"; echo "dpkg-deb -x failed" >&2; return 1; }
  rm -f "$tmp"/*.deb
  rm -rf "$dir"
  mv "$tmp/root" "$dir"
  rm -rf "$tmp"
  touch "$dir/.done"
  echo "$dir"
}

# Closure of module dependencies from modules.dep (paths relative to lib/modules/KVER).
module_closure() {
  local depfile=$1; shift
  awk -v want="$*" '
    function norm(s) { gsub(/-/, "_", s); return s }
    function base(p,  b) { b = p; sub(/.*\//, "", b); sub(/\.ko(\.[a-z]+)?$/, "", b); return norm(b) }
    {
      path = $1; sub(/:$/, "", path)
      name = base(path); file[name] = path
      d = ""; for (i = 2; i <= NF; i++) d = d " " base($i)
      deps[name] = d
    }
    function visit(n,  parts, k, i) {
      if (n in seen) return
      seen[n] = 1
      if (!(n in file)) { print "MISSING " n; return }
      k = split(deps[n], parts, " ")
      for (i = 1; i <= k; i++) visit(parts[i])
      print file[n]
    }
    END { n = split(want, w, " "); for (i = 1; i <= n; i++) visit(norm(w[i])) }
  ' "$depfile"
}

# Builds $CACHE/initramfs-<kver>-v<N>.cpio.gz; prints "KERNEL_IMAGE INITRAMFS".
prepare() {
  local kdir kver image initrd work mods
  command -v "$QEMU" >/dev/null 2>&1 || { echo "$QEMU not found (apt-get install qemu-system-x86)" >&2; return 1; }
  # (the applet list is read whole: grep -q closing the pipe early would fail it under pipefail)
  [[ -x $BUSYBOX ]] && grep -qx depmod <<<"$("$BUSYBOX" --list 2>/dev/null)" ||
    { echo "$BUSYBOX not found or without depmod (apt-get install busybox-static)" >&2; return 1; }
  file_is_static "$BUSYBOX" || { echo "$BUSYBOX is not statically linked (apt-get install busybox-static)" >&2; return 1; }
  kdir=$(prepare_kernel) || return 1
  kver=$(ls "$kdir/lib/modules" | head -1)
  image=$kdir/boot/vmlinuz-$kver
  [[ -f $image ]] || { echo "no kernel image $image in the unpacked package" >&2; return 1; }
  # Under TCG the kernel's own xz decompressor takes half a minute: boot the uncompressed ELF
  # through its PVH entry instead (QEMU loads it directly), when the kernel has one.
  local pvh=$kdir/boot/vmlinux-$kver.pvh
  [[ -f $pvh ]] || extract_pvh_vmlinux "$image" "$kdir/boot/config-$kver" "$pvh" || true
  [[ -f $pvh ]] && image=$pvh
  initrd=$CACHE/initramfs-$kver-v$INITRAMFS_VERSION.cpio
  if [[ ! -f $initrd ]]; then
    [[ -f $kdir/lib/modules/$kver/modules.dep ]] || "$BUSYBOX" depmod -b "$kdir" "$kver" ||
      { echo "busybox depmod failed on $kdir" >&2; return 1; }
    work=$(mktemp -d "$CACHE/.initramfs.XXXXXX")
    mkdir -p "$work"/{bin,dev,proc,sys,newroot,etc,lib/modules/"$kver"}
    cp "$BUSYBOX" "$work/bin/busybox"
    mods=$(module_closure "$kdir/lib/modules/$kver/modules.dep" "${MODULES[@]}")
    if grep -q '^MISSING' <<<"$mods"; then
      rm -rf "$work"; echo "kernel $kver lacks modules: $(grep '^MISSING' <<<"$mods" | tr '\n' ' ')" >&2; return 1
    fi
    local m
    for m in $mods; do
      mkdir -p "$work/lib/modules/$kver/$(dirname "$m")"
      cp "$kdir/lib/modules/$kver/$m" "$work/lib/modules/$kver/$m"
    done
    cp "$kdir/lib/modules/$kver"/modules.builtin* "$work/lib/modules/$kver/" 2>/dev/null || true
    "$BUSYBOX" depmod -b "$work" "$kver"
    write_init "$work/init"
    chmod 755 "$work/init"
    # Uncompressed: unpacking it is a copy, where gunzip under TCG takes seconds.
    (cd "$work" && find . | "$BUSYBOX" cpio -o -H newc 2>/dev/null) >"$initrd.tmp"
    mv "$initrd.tmp" "$initrd"
    rm -rf "$work"
  fi
  echo "$image $initrd" | tee "$CACHE/current.tmp" && mv "$CACHE/current.tmp" "$CACHE/current"
}

# What the last `prepare` made, if it is still there and of this script's initramfs version
# (saves `run` the apt-cache look-up); else prepares.
prepared() {
  local image initrd
  if [[ -f $CACHE/current ]] && read -r image initrd <"$CACHE/current" && [[ -f $image && -f $initrd ]] &&
     [[ $initrd == *-v$INITRAMFS_VERSION.cpio ]]; then
    echo "$image $initrd"
    return 0
  fi
  prepare
}

# extract_pvh_vmlinux BZIMAGE CONFIG OUT: the ELF vmlinux inside a bzImage, if the kernel was
# built with CONFIG_PVH (an entry QEMU's -kernel can boot without decompressing under
# emulation). Returns 1, writing nothing, when it is not such a kernel or no decompressor fits.
extract_pvh_vmlinux() {
  local bz=$1 config=$2 out=$3 offset tmp
  grep -qx 'CONFIG_PVH=y' "$config" 2>/dev/null || return 1
  command -v xz >/dev/null 2>&1 || return 1
  grep -qx 'CONFIG_KERNEL_XZ=y' "$config" || return 1
  # The xz stream starts at its magic (FD 37 7A 58 5A 00); data after it (the bzImage's
  # trailer) makes xz complain, so the result is checked as an ELF with a PVH note instead.
  offset=$(LC_ALL=C grep -obUaP '\xfd\x37\x7a\x58\x5a\x00' "$bz" 2>/dev/null | head -1 | cut -d: -f1)
  [[ -n $offset ]] || return 1
  tmp=$out.tmp.$$
  tail -c +$((offset + 1)) "$bz" | xz -dc >"$tmp" 2>/dev/null || true
  # ELF magic, and XEN_ELFNOTE_PHYS32_ENTRY (type 18) among the notes.
  if [[ $(head -c 4 "$tmp" | od -An -tx1 | tr -d ' ') == 7f454c46 ]] &&
     { ! command -v readelf >/dev/null 2>&1 || readelf -n "$tmp" 2>/dev/null | grep -q '0x00000012'; }; then
    mv "$tmp" "$out"
    return 0
  fi
  rm -f "$tmp"
  return 1
}

file_is_static() {
  # ldd fails on a static executable ("not a dynamic executable").
  ! ldd "$1" >/dev/null 2>&1
}

# The guest's /init (busybox sh). Parameters come on the kernel command line as canopy.*=...
write_init() {
  cat >"$1" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
arg() { sed -n "s/.*\bcanopy\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
role=$(arg role); ip4=$(arg ip); peer=$(arg peer); out=$(arg out); cwd=$(arg cwd); msize=$(arg msize)
log() { echo "canopy-init[$role] $(cut -d' ' -f1 /proc/uptime) s: $*"; }
fail() { log "$*"; echo 125 >"/newroot$out/$role/rc" 2>/dev/null; sync; poweroff -f; }
for m in virtio_pci virtio_net 9pnet_virtio 9p; do modprobe "$m" || log "modprobe $m failed"; done
# The host root is read-only and does not change while the guest runs: cache=loose keeps what
# was read in the guest's page cache (a binary loaded twice is read over 9p once) and reads
# ahead (without it every page fault of a binary is one 9p round trip).
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=$(arg rootcache),msize=${msize:-512000} hostroot /newroot || { log "cannot mount the host root"; poweroff -f; }
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts 2>/dev/null
for d in /tmp /run /dev/shm; do mount -t tmpfs -o mode=1777 tmpfs "/newroot$d" || log "cannot mount tmpfs on $d"; done
# Host directories under those tmpfs mounts that the command needs (a build tree in /tmp):
# each its own read-only 9p share (tag share0, share1, ...), mounted back at its host path.
i=0
for d in $(arg shares | tr ',' ' '); do
  mkdir -p "/newroot$d" 2>/dev/null
  mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=$(arg rootcache),msize=${msize:-512000} "share$i" "/newroot$d" || { log "cannot mount share$i at $d"; poweroff -f; }
  i=$((i + 1))
done
# The results directory, at its host path (a directory under /tmp is made in the guest's tmpfs).
mkdir -p "/newroot$out" 2>/dev/null
mount -t 9p -o trans=virtio,version=9p2000.L,msize=${msize:-512000} results "/newroot$out" || { log "cannot mount results at $out"; poweroff -f; }
log "host root mounted"
for m in crc32_generic rdma_rxe ib_uverbs rdma_ucm; do modprobe "$m" || fail "modprobe $m failed"; done
ip link set lo up
# Jumbo frames on the guest-to-guest link: rxe derives its active MTU from
# the netdev's (4096 at 9000, 1024 at 1500), so every RDMA message and TCP
# stream is cut into about 4x fewer emulated packets.
ip link set eth0 mtu 9000 || log "eth0 stays at its default MTU (9000 refused)"
ip link set eth0 up || fail "no eth0"
ip addr add "$ip4/24" dev eth0 || fail "cannot set $ip4 on eth0"
# The peer's MAC is known (52:54:00:77:00:0N): a permanent neighbour entry, so that the first
# rdma_cm address resolution does not wait for ARP (slow under TCG; it timed out).
[ -n "$(arg peermac)" ] && chroot /newroot /usr/sbin/ip neigh replace "$peer" lladdr "$(arg peermac)" dev eth0 nud permanent || log "cannot add the neighbour entry for $peer"
chroot /newroot rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0 type rxe netdev eth0 failed"
ulimit -l unlimited
hostname "canopy-vm-$role"
log "ready: $ip4 rxe0 on eth0 (MTU $(cat /sys/class/net/eth0/mtu 2>/dev/null))"
dir="$out/$role"
if [ "$(arg shell)" = 1 ]; then
  chroot /newroot /usr/bin/env -i HOME=/tmp TERM=${TERM:-vt100} PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
    CANOPY_VM_ROLE=$role CANOPY_VM_SELF=$ip4 CANOPY_VM_PEER=$peer CANOPY_RDMA_TEST_ADDR=$ip4 \
    CANOPY_VM_OUT=$out CANOPY_VM_DIR=$dir /bin/bash -c "cd '$cwd' 2>/dev/null; exec /bin/bash -i" </dev/console >/dev/console 2>&1
  echo $? >"/newroot$dir/rc"
else
  chroot /newroot /usr/bin/env -i HOME=/tmp PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
    CANOPY_VM_ROLE=$role CANOPY_VM_SELF=$ip4 CANOPY_VM_PEER=$peer CANOPY_RDMA_TEST_ADDR=$ip4 \
    CANOPY_VM_OUT=$out CANOPY_VM_DIR=$dir /bin/bash -c "cd '$cwd' && . '$dir/env.sh' && exec /bin/bash '$dir/cmd.sh'" \
    </dev/null >"/newroot$dir/stdout" 2>"/newroot$dir/stderr"
  echo $? >"/newroot$dir/rc.tmp" && mv "/newroot$dir/rc.tmp" "/newroot$dir/rc"
fi
sync
log "powering off"
poweroff -f
INIT
}

# ---------------------------------------------------------------- running guests

check_host() {
  command -v "$QEMU" >/dev/null 2>&1 || { echo "$QEMU not found (apt-get install qemu-system-x86)"; return 1; }
  command -v timeout >/dev/null 2>&1 || { echo "timeout (coreutils) not found"; return 1; }
  command -v ss >/dev/null 2>&1 || { echo "ss (iproute2) not found"; return 1; }
  if [[ $ACCEL == kvm && ! -w /dev/kvm ]]; then echo "CANOPY_VM_ACCEL=kvm but /dev/kvm is not writable"; return 1; fi
  return 0
}

declare -a QEMU_PIDS=()
OUT=""
REMOVE_OUT=0
cleanup() {
  local pid
  for pid in "${QEMU_PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${QEMU_PIDS[@]}"; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  QEMU_PIDS=()
  if ((REMOVE_OUT)) && [[ -n $OUT ]]; then rm -rf "$OUT"; fi
}
on_signal() { trap - EXIT; cleanup; exit 130; }

# start_guest ROLE IP PEER NETDEV_ARGS CONSOLE(file|stdio) [shell]
# Starts QEMU in the background under `timeout`; appends its pid to QEMU_PIDS.
start_guest() {
  local role=$1 ip=$2 peer=$3 netdev=$4 console=$5 shell=${6:-0}
  local mac serial append
  local peermac
  mac=52:54:00:77:00:$([[ $role == a ]] && echo 01 || echo 02)
  peermac=52:54:00:77:00:$([[ $role == a ]] && echo 02 || echo 01)
  # no_timer_check: on a loaded host the kernel's IO-APIC timer check fails under TCG and the
  # kernel panics ("IO-APIC + timer doesn't work!"; seen at load 13). mitigations=off and
  # init_on_alloc=0: page-table isolation, retpolines and zeroing every allocation cost
  # emulated cycles and protect nothing here.
  append="console=ttyS0 panic=-1 quiet loglevel=4 no_timer_check mitigations=off init_on_alloc=0"
  append+=" canopy.role=$role canopy.ip=$ip canopy.peer=$peer canopy.rootcache=$ROOT_CACHE"
  append+=" canopy.peermac=$peermac"
  append+=" canopy.out=$OUT canopy.cwd=$CWD canopy.shell=$shell"
  local shares=() i
  for i in "${!SHARES[@]}"; do
    shares+=(-virtfs "local,path=${SHARES[$i]},mount_tag=share$i,readonly=on,security_model=none,multidevs=remap")
  done
  ((${#SHARES[@]})) && append+=" canopy.shares=$(IFS=,; echo "${SHARES[*]}")"
  if [[ $console == stdio ]]; then serial=(-serial mon:stdio); else serial=(-serial "file:$OUT/$role/console.log"); fi
  local accel=(-accel "$ACCEL")
  [[ $ACCEL == tcg ]] && accel=(-accel tcg,thread=multi)
  timeout -k 10 "$TIMEOUT" "$QEMU" -nodefaults -no-user-config -nographic -no-reboot \
    "${accel[@]}" -cpu "$CPU" -smp "$SMP" -m "$MEM" \
    -kernel "$IMAGE" -initrd "$INITRD" -append "$append" \
    "${serial[@]}" \
    -netdev "$netdev" -device "virtio-net-pci,netdev=n0,mac=$mac,romfile=" \
    -virtfs local,path=/,mount_tag=hostroot,readonly=on,security_model=none,multidevs=remap \
    "${shares[@]}" \
    -virtfs "local,path=$OUT,mount_tag=results,security_model=none,multidevs=remap" \
    <&"$([[ $console == stdio ]] && echo 3 || echo 4)" \
    >"$([[ $console == stdio ]] && echo /dev/stdout || echo "$OUT/$role/qemu.log")" 2>&1 &
  QEMU_PIDS+=("$!")
}

# collect_shares DIR...: sets SHARES to those DIRs (made canonical) that lie under a directory
# the guest covers with tmpfs (/tmp, /run, /dev/shm), without repeats.
SHARES=()
collect_shares() {
  local d real s seen
  for d in "$@"; do
    [[ -d $d ]] || die "--share/--cwd $d is not a directory"
    real=$(cd "$d" && pwd -P)
    [[ ! $real =~ [[:space:],] ]] || die "--share/--cwd $real must not contain spaces or commas"
    case "$real/" in
      /tmp/*|/run/*|/dev/shm/*) ;;
      *) continue ;;
    esac
    seen=0
    for s in ${SHARES[@]+"${SHARES[@]}"}; do [[ $s == "$real" ]] && seen=1; done
    ((seen)) || SHARES+=("$real")
  done
  # A parent before its children, so that a nested share is mounted on top of its parent's.
  if ((${#SHARES[@]} > 1)); then
    mapfile -t SHARES < <(printf '%s\n' "${SHARES[@]}" | awk '{ print length($0) "\t" $0 }' | sort -n | cut -f2-)
  fi
}

free_port() {
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 30000))
    ss -Htan "( sport = :$p or dport = :$p )" 2>/dev/null | grep -q . || { echo "$p"; return 0; }
  done
  return 1
}

# Waits until something listens on 127.0.0.1:PORT while PID lives.
wait_listening() {
  local port=$1 pid=$2
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 1
    ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && return 0
    sleep 0.1
  done
  return 1
}

write_cmd() {
  local role=$1 cmd=$2
  mkdir -p "$OUT/$role"
  printf '%s\n' "$cmd" >"$OUT/$role/cmd.sh"
  : >"$OUT/$role/env.sh"
  local kv
  for kv in "${ENVS[@]}"; do printf 'export %q\n' "$kv" >>"$OUT/$role/env.sh"; done
}

# Boots the guests (roles given), waits for them, prints and returns the status.
boot_and_wait() {
  local pair=$1 interactive=$2
  local port netdev_a netdev_b
  trap cleanup EXIT
  trap on_signal INT TERM HUP
  local tries=0
  while :; do
    port=$(free_port) || die "no free local port"
    netdev_a="socket,id=n0,listen=127.0.0.1:$port"
    if ((interactive)) && ((!pair)); then
      start_guest a 10.77.0.1 10.77.0.2 "$netdev_a" stdio 1
    else
      start_guest a 10.77.0.1 10.77.0.2 "$netdev_a" "$([[ $interactive == 1 ]] && echo stdio || echo file)" "$interactive"
    fi
    wait_listening "$port" "${QEMU_PIDS[0]}" && break
    wait "${QEMU_PIDS[0]}" 2>/dev/null || true
    QEMU_PIDS=()
    tries=$((tries + 1))
    if ((tries >= 5)); then cat "$OUT/a/qemu.log" >&2; die "QEMU (guest a) did not start"; fi
  done
  if ((pair)); then
    netdev_b="socket,id=n0,connect=127.0.0.1:$port"
    start_guest b 10.77.0.2 10.77.0.1 "$netdev_b" file 0
  fi
  if ((interactive)); then
    # The terminal belongs to guest A's console until its shell exits.
    wait "${QEMU_PIDS[0]}" 2>/dev/null || true
    return 0
  fi
  local status=0 role i pid rc
  local roles=(a); ((pair)) && roles+=(b)
  for i in "${!roles[@]}"; do
    pid=${QEMU_PIDS[$i]}
    rc=0; wait "$pid" || rc=$?
    role=${roles[$i]}
    if ((rc == 124 || rc == 137)); then
      echo "rdma-vm: guest $role killed after the ${TIMEOUT} s time limit" >&2
      ((status == 0)) && status=124
    elif [[ ! -f $OUT/$role/rc ]]; then
      echo "rdma-vm: guest $role stopped without its command's exit status (qemu rc $rc); its console:" >&2
      tail -30 "$OUT/$role/console.log" >&2 2>/dev/null || true
      tail -5 "$OUT/$role/qemu.log" >&2 2>/dev/null || true
      ((status == 0)) && status=125
    fi
  done
  QEMU_PIDS=()
  for role in "${roles[@]}"; do
    if ((!QUIET)); then
      if [[ -s $OUT/$role/stdout ]]; then echo "----- guest $role stdout"; cat "$OUT/$role/stdout"; fi
      if [[ -s $OUT/$role/stderr ]]; then echo "----- guest $role stderr" >&2; cat "$OUT/$role/stderr" >&2; fi
    fi
    if [[ -f $OUT/$role/rc ]]; then
      rc=$(cat "$OUT/$role/rc")
      ((QUIET)) || echo "----- guest $role exit status $rc"
      if ((rc != 0 && status == 0)); then
        status=$rc
        echo "rdma-vm: guest $role's command failed (exit $rc); console tail:" >&2
        grep -v '^\s*$' "$OUT/$role/console.log" 2>/dev/null | tail -8 >&2 || true
      fi
    fi
  done
  ((REMOVE_OUT)) || echo "rdma-vm: results in $OUT"
  return "$status"
}

# ---------------------------------------------------------------- command line

cmd=${1:-}
[[ -n $cmd ]] || die "usage: $0 prepare | check | run [OPTS] -- CMD | pair [OPTS] --a CMD --b CMD | shell [--pair]"
shift
TIMEOUT=600; MEM=1536; SMP=2; CWD=$PWD; QUIET=0; KEEP=0; PAIR=0
CMD_A=""; CMD_B=""; ENVS=(); SHARE_ARGS=()
while (($#)); do
  case "$1" in
    --timeout) TIMEOUT=$2; shift ;;
    --out) OUT=$2; shift ;;
    --keep) KEEP=1 ;;
    --mem) MEM=$2; shift ;;
    --smp) SMP=$2; shift ;;
    --cwd) CWD=$2; shift ;;
    --env) ENVS+=("$2"); shift ;;
    --share) SHARE_ARGS+=("$2"); shift ;;
    --quiet) QUIET=1 ;;
    --pair) PAIR=1 ;;
    --a) CMD_A=$2; shift ;;
    --b) CMD_B=$2; shift ;;
    --) shift; CMD_A="$*"; break ;;
    *) die "unknown argument $1" ;;
  esac
  shift
done

# fd 3: the terminal (for `shell`), fd 4: nothing.
exec 3<&0 4</dev/null
case "$cmd" in
  prepare)
    mkdir -p "$CACHE"
    result=$(prepare) || exit 1
    echo "rdma-vm: kernel and initramfs ready: $result"
    ;;
  check)
    reason=$(check_host) || skip "$reason"
    mkdir -p "$CACHE" 2>/dev/null || skip "cannot create the cache directory $CACHE"
    result=$(prepared 2>&1) || skip "$(tail -1 <<<"$result")"
    echo "rdma-vm: ready (accel $ACCEL, cpu $CPU): $result"
    ;;
  run|pair|shell)
    reason=$(check_host) || skip "$reason"
    mkdir -p "$CACHE" 2>/dev/null || skip "cannot create the cache directory $CACHE"
    result=$(prepared 2>/tmp/rdma-vm-prepare.$$) || { r=$(tail -1 /tmp/rdma-vm-prepare.$$); rm -f /tmp/rdma-vm-prepare.$$; skip "$r"; }
    rm -f /tmp/rdma-vm-prepare.$$
    read -r IMAGE INITRD <<<"$result"
    [[ $CWD == /* && ! $CWD =~ [[:space:]] ]] || die "--cwd must be an absolute path without spaces"
    collect_shares "$CWD" ${SHARE_ARGS[@]+"${SHARE_ARGS[@]}"}
    if [[ -z $OUT ]]; then
      OUT=$(mktemp -d "${TMPDIR:-/tmp}/rdma-vm.XXXXXX")
      ((KEEP)) || REMOVE_OUT=1
    fi
    mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
    [[ ! $OUT =~ [[:space:]] ]] || die "--out must not contain spaces"
    case "$cmd" in
      run)
        [[ -n $CMD_A ]] || die "run: give the command after --"
        write_cmd a "$CMD_A"
        boot_and_wait 0 0 ;;
      pair)
        [[ -n $CMD_A && -n $CMD_B ]] || die "pair: give --a CMD and --b CMD"
        write_cmd a "$CMD_A"; write_cmd b "$CMD_B"
        boot_and_wait 1 0 ;;
      shell)
        write_cmd a "true"
        # Guest B idles until guest A's shell ends (the script then powers it off).
        ((PAIR)) && write_cmd b "sleep $TIMEOUT"
        boot_and_wait "$PAIR" 1 ;;
    esac
    ;;
  *)
    die "unknown command $cmd (prepare | check | run | pair | shell)"
    ;;
esac
