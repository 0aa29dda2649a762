#!/usr/bin/env bash
# Runs one command in a fresh, throwaway QEMU guest that mounts a virtiofs
# share (tag `mado`) served on the host by a vhost-user server (virtiofsd,
# or mado's own) already listening on SOCK.
#
#   scripts/vm-run.sh --virtiofs-socket SOCK [--mem SIZE] [--cpus N]
#                     [--timeout SECONDS] [--scratch-disk SIZE] -- COMMAND...
#   scripts/vm-run.sh --prepare   # install and build what it needs; no boot
#
# In the guest COMMAND runs as root under busybox sh: one word is a shell
# script; several words are a command and its arguments, each passed whole
# (so `-- sh -c 'SCRIPT'` and `-- SCRIPT` do the same). It runs in /mnt/mado (the share), with stdin
# /dev/null and PATH holding the busybox applets. Its stdout and stderr come
# out on this script's stdout and stderr, byte for byte (pipes in the guest,
# not a tty; streamed while it runs); kernel messages go only to the guest
# console log. Afterwards the guest kills what the command left running,
# runs `sync` and `umount /mnt/mado` (so the server sees the flushes and its
# DESTROY) and powers off. --scratch-disk SIZE adds an empty ext4 disk
# (sparse file in $TMPDIR, deleted afterwards) mounted at /mnt/disk.
#
# Exit status: the command's; 124 if --timeout (default 300 s, boot
# included) ran out and QEMU was killed; 125 if this script, QEMU, the
# guest's boot, its modules or its mounts failed (one line on stderr names
# what, with the kept console log's path and its last lines).
#
# Installs what it needs if missing: Debian packages qemu-system-x86,
# busybox-static, cpio, e2fsprogs; a Debian kernel (the version the
# linux-image-amd64 metapackage depends on; `apt-get download`, extracted,
# never installed). The kernel and the base initramfs are cached in
# $MADO_VM_DIR (default $MADO_TOOLS_DIR/vm); each run appends a small cpio
# with the command to the base initramfs.
#
# Environment: MADO_VM_ACCEL=auto|kvm|tcg (auto: KVM if /dev/kvm can run a
# stock kernel, else TCG software emulation), MADO_VM_KEEP=1 keeps the run
# folder (console log, status), MADO_VM_APPEND adds kernel arguments,
# MADO_VM_KERNEL_VERSION pins the kernel (e.g. 6.1.0-56-amd64).
set -euo pipefail
source "$(dirname "$0")/env.sh"
MADO_VM_DIR="${MADO_VM_DIR:-$MADO_TOOLS_DIR/vm}"

# Bump when the guest image changes in a way the stamp below cannot see.
VM_IMAGE_VERSION=2
# Loaded in this order (each after what it depends on; checked at build).
BASE_MODULES=(virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci
  virtio_console fuse virtiofs)
DISK_MODULES=(virtio_blk crc16 mbcache crc32c_generic crc32c-intel jbd2 ext4)

die() { echo "vm-run: $*" >&2; exit 125; }
usage() {
  echo "usage: scripts/vm-run.sh --virtiofs-socket SOCK [--mem SIZE] [--cpus N] [--timeout SECONDS] [--scratch-disk SIZE] -- COMMAND..." >&2
  echo "       scripts/vm-run.sh --prepare    (install and build what it needs, boot nothing)" >&2
  exit 125
}

sock=""; mem=1G; cpus=2; tmo=300; scratch=""; prepare=""
while [ $# -gt 0 ]; do
  case "$1" in
    --virtiofs-socket) [ $# -ge 2 ] || usage; sock="$2"; shift 2 ;;
    --mem) [ $# -ge 2 ] || usage; mem="$2"; shift 2 ;;
    --cpus) [ $# -ge 2 ] || usage; cpus="$2"; shift 2 ;;
    --timeout) [ $# -ge 2 ] || usage; tmo="$2"; shift 2 ;;
    --scratch-disk) [ $# -ge 2 ] || usage; scratch="$2"; shift 2 ;;
    --prepare) prepare=1; shift ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[ -n "$prepare" ] || { [ -n "$sock" ] && [ $# -gt 0 ]; } || usage
[[ "$tmo" =~ ^[0-9]+$ ]] && [ "$tmo" -gt 0 ] || die "--timeout wants a positive number of seconds, not '$tmo'"
[[ "$cpus" =~ ^[0-9]+$ ]] || die "--cpus wants a number, not '$cpus'"
[[ "$mem" =~ ^[0-9]+[KMGT]?$ ]] || die "--mem wants a size like 1G or 512M, not '$mem'"
[ -z "$scratch" ] || [[ "$scratch" =~ ^[0-9]+[KMGT]?$ ]] || die "--scratch-disk wants a size like 1G, not '$scratch'"
[ -n "$prepare" ] || [ -S "$sock" ] || die "virtiofs socket $sock does not exist or is not a socket (start the vhost-user server first)"
# KVM when it can run a stock kernel; else software emulation (TCG): slower,
# but the same guest. A /dev/kvm served by kvm_pvm (PVM, as on some cloud
# VMs without nested virtualization) only runs PVM-built guest kernels.
accel="${MADO_VM_ACCEL:-auto}"
if [ "$accel" = auto ]; then
  accel=tcg
  if [ -r /dev/kvm ] && [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ]; then accel=kvm; fi
fi
# shellcheck disable=SC2054  # (commas inside QEMU options)
case "$accel" in
  kvm) accel_args=(-machine q35 -accel kvm -cpu host) ;;
  tcg) accel_args=(-machine q35 -accel tcg,thread=multi -cpu max) ;;
  *) die "MADO_VM_ACCEL must be auto, kvm or tcg, not '$accel'" ;;
esac
# One word is a shell script (`-- 'echo a > f; cat f'`). Several words are
# one command and its arguments, each kept whole (`-- sh -c 'echo a > f'`):
# joined by spaces, that ran `sh -c echo a > f` in the guest, an `echo`
# with no arguments, and the file held a lone newline (issue #49).
if [ $# -eq 1 ]; then
  command_string="$1"
else
  printf -v command_string '%q ' "$@"
fi

# ---- the guest's /init (busybox sh) ----------------------------------------
read -r -d '' GUEST_INIT <<'INIT' || true
#!/bin/sh
# mado vm-run guest init. Markers on the console (ttyS0):
#   "mado-vm: error: ..." a setup step failed (the host exits 125)
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root
mount -t devtmpfs dev /dev
exec </dev/null >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
ln -s /proc/self/fd /dev/fd
ln -s fd/0 /dev/stdin; ln -s fd/1 /dev/stdout; ln -s fd/2 /dev/stderr
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs shm /dev/shm
echo /bin/true >/proc/sys/kernel/modprobe
fail() { echo "mado-vm: error: $*"; poweroff -f; sleep 10; }
. /run.cfg || fail "no /run.cfg in the initramfs"
for m in $BASE_MODULES; do
  insmod /lib/modules/$m.ko || fail "insmod $m.ko failed"
done
if [ -n "$SCRATCH" ]; then
  for m in $DISK_MODULES; do
    case $m in
      crc32c-intel) insmod /lib/modules/$m.ko 2>/dev/null ;;  # optional: needs SSE4.2
      *) insmod /lib/modules/$m.ko || fail "insmod $m.ko failed" ;;
    esac
  done
fi

# The output channels: virtio serial ports, found by name.
OUT=; ERR=; ST=; i=0
while :; do
  for d in /sys/class/virtio-ports/*; do
    [ -r "$d/name" ] && [ -e "/dev/${d##*/}" ] || continue
    read -r n <"$d/name" || continue
    case "$n" in
      mado.stdout) OUT=/dev/${d##*/} ;;
      mado.stderr) ERR=/dev/${d##*/} ;;
      mado.status) ST=/dev/${d##*/} ;;
    esac
  done
  [ -n "$OUT" ] && [ -n "$ERR" ] && [ -n "$ST" ] && break
  i=$((i + 1)); [ $i -lt 1000 ] || fail "the virtio serial ports (mado.stdout, mado.stderr, mado.status) did not appear"
  sleep 0.01
done

mount -t virtiofs mado /mnt/mado || fail "mount -t virtiofs mado /mnt/mado failed"
if [ -n "$SCRATCH" ]; then
  i=0
  while [ ! -b /dev/vda ]; do
    i=$((i + 1)); [ $i -lt 500 ] || fail "the scratch disk /dev/vda did not appear"
    sleep 0.01
  done
  mount -t ext4 /dev/vda /mnt/disk || fail "mount -t ext4 /dev/vda /mnt/disk failed"
fi
echo "mado-vm: running the command"

# The command writes to pipes (as under a host test harness: not a tty, and
# /dev/stdout can be reopened); two cats relay them to the ports.
mkfifo /run/out /run/err
cat /run/out >"$OUT" & c1=$!
cat /run/err >"$ERR" & c2=$!
cd /mnt/mado
# (A subshell, so that ash's "Killed" for a command killed by a signal goes
# to the console, not into the command's stderr.)
( exec sh -c "$(cat /cmd)" ) </dev/null >/run/out 2>/run/err
rc=$?
cd /
# Kill what the command left running (all but init, the relays and kernel
# threads, which have no exe), so the relays see EOF and the unmount succeeds.
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  case " 1 $$ $c1 $c2 " in *" $pid "*) continue ;; esac
  [ -e "$p/exe" ] && kill -9 "$pid" 2>/dev/null
done
wait $c1 $c2
warn=
sync
umount /mnt/mado || warn="$warn
warning: umount /mnt/mado failed in the guest"
if [ -n "$SCRATCH" ]; then
  umount /mnt/disk || warn="$warn
warning: umount /mnt/disk failed in the guest"
fi
printf 'exit %s%s\n' "$rc" "$warn" >"$ST"
echo "mado-vm: done, exit $rc"
poweroff -f
INIT

# ---- dependencies, kernel, base initramfs (cached; under a lock) -----------
mkdir -p "$MADO_VM_DIR"
exec 9>"$MADO_VM_DIR/.lock"
flock 9

pkgs=(qemu-system-x86 busybox-static cpio e2fsprogs)
need_pkgs=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "vm-run: installing Debian packages: ${need_pkgs[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

# The kernel version: the one cached last, else the one linux-image-amd64
# depends on now (MADO_VM_KERNEL_VERSION overrides, e.g. 6.1.0-56-amd64).
kver="${MADO_VM_KERNEL_VERSION:-}"
if [ -z "$kver" ] && [ -f "$MADO_VM_DIR/kernel-version" ]; then
  kver=$(cat "$MADO_VM_DIR/kernel-version")
  [ -f "$MADO_VM_DIR/$kver/vmlinuz" ] || kver=""
fi
if [ -z "$kver" ]; then
  dep() { apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: linux-image-\(.*\)$/\1/p' | head -n1; }
  kver=$(dep)
  if [ -z "$kver" ]; then $SUDO apt-get update -qq; kver=$(dep); fi
  [ -n "$kver" ] || die "cannot tell which kernel linux-image-amd64 depends on (apt-cache depends linux-image-amd64)"
fi
kdir="$MADO_VM_DIR/$kver"
mkdir -p "$kdir"
echo "$kver" >"$MADO_VM_DIR/kernel-version"

stamp="v$VM_IMAGE_VERSION $kver $(sha256sum /bin/busybox | cut -c1-16) ${BASE_MODULES[*]} / ${DISK_MODULES[*]} $(printf '%s' "$GUEST_INIT" | sha256sum | cut -c1-16)"
if [ ! -f "$kdir/vmlinuz" ] || [ ! -f "$kdir/initramfs.cpio" ] || [ "$(cat "$kdir/initramfs.stamp" 2>/dev/null)" != "$stamp" ]; then
  deb=$(ls "$kdir"/linux-image-"$kver"_*.deb 2>/dev/null | head -n1 || true)
  if [ -z "$deb" ]; then
    echo "vm-run: downloading the guest kernel linux-image-$kver (once)" >&2
    (cd "$kdir" && apt-get download -qq -o APT::Sandbox::User=root "linux-image-$kver" >/dev/null 2>&1) \
      || (cd "$kdir" && $SUDO apt-get update -qq && apt-get download -qq -o APT::Sandbox::User=root "linux-image-$kver" >/dev/null) \
      || die "apt-get download linux-image-$kver failed"
    deb=$(ls "$kdir"/linux-image-"$kver"_*.deb | head -n1)
  fi
  echo "vm-run: building the guest kernel and initramfs in $kdir" >&2
  build=$(mktemp -d "$kdir/build.XXXXXX")
  trap 'rm -rf "$build"' EXIT
  dpkg-deb -x "$deb" "$build/deb"
  cp "$build/deb/boot/vmlinuz-$kver" "$kdir/vmlinuz.new"
  # Also the uncompressed kernel, booted through its PVH entry: that skips
  # the decompressor, 3 of the 5 seconds of a boot under TCG.
  rm -f "$kdir/vmlinux"
  if grep -q '^CONFIG_PVH=y' "$build/deb/boot/config-$kver"; then
    for z in 'xz -dc --single-stream:\xfd7zXZ\x00' 'zstd -qdc:\x28\xb5\x2f\xfd' 'gzip -dc:\x1f\x8b\x08'; do
      off=$(LC_ALL=C grep -obUaP "${z#*:}" "$kdir/vmlinuz.new" | head -n1 | cut -d: -f1 || true)
      [ -n "$off" ] || continue
      tail -c +$((off + 1)) "$kdir/vmlinuz.new" | ${z%%:*} >"$kdir/vmlinux.new" 2>/dev/null || true
      if [ "$(head -c4 "$kdir/vmlinux.new" | od -An -c | tr -d ' ')" = '177ELF' ]; then
        mv "$kdir/vmlinux.new" "$kdir/vmlinux"; break
      fi
      rm -f "$kdir/vmlinux.new"
    done
  fi
  root="$build/root"
  mkdir -p "$root"/{bin,dev,proc,sys,tmp,run,root,lib/modules,mnt/mado,mnt/disk,usr}
  ln -s bin "$root/sbin"; ln -s ../bin "$root/usr/bin"; ln -s ../bin "$root/usr/sbin"
  cp /bin/busybox "$root/bin/busybox"
  for a in $("$root/bin/busybox" --list); do
    [ "$a" = busybox ] || ln -s busybox "$root/bin/$a"
  done
  # The modules, uncompressed (busybox insmod), each after its dependencies.
  mods="$build/deb/lib/modules/$kver"
  loaded=" "
  for m in "${BASE_MODULES[@]}" "${DISK_MODULES[@]}"; do
    f=$(find "$mods" -name "$m.ko" -o -name "$m.ko.xz" -o -name "$m.ko.zst" -o -name "$m.ko.gz" | head -n1)
    [ -n "$f" ] || die "module $m not found in linux-image-$kver"
    case "$f" in
      *.xz) xz -dc "$f" ;; *.zst) zstd -qdc "$f" ;; *.gz) gzip -dc "$f" ;; *) cat "$f" ;;
    esac >"$root/lib/modules/$m.ko"
    deps=$(grep -ao 'depends=[A-Za-z0-9_,-]*' "$root/lib/modules/$m.ko" | head -n1 | cut -d= -f2 | tr , ' ' || true)
    for d in $deps; do
      case "$loaded" in *" $d "*|*" ${d//_/-} "*) ;; *) die "module $m depends on $d, which is not loaded before it (fix BASE_MODULES/DISK_MODULES)" ;; esac
    done
    loaded="$loaded$m "
  done
  printf '%s\n' "$GUEST_INIT" >"$root/init"
  chmod 755 "$root/init"
  (cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$kdir/initramfs.cpio.new"
  mv "$kdir/vmlinuz.new" "$kdir/vmlinuz"
  mv "$kdir/initramfs.cpio.new" "$kdir/initramfs.cpio"
  echo "$stamp" >"$kdir/initramfs.stamp"
  rm -rf "$build"
  trap - EXIT
fi
flock -u 9
exec 9>&-
[ -z "$prepare" ] || { echo "vm-run: ready: $kdir ($accel)" >&2; exit 0; }

# ---- one run ----------------------------------------------------------------
run=$(mktemp -d "${TMPDIR:-/tmp}/mado-vm.XXXXXX")
qpid=""; keep="${MADO_VM_KEEP:-}"
[ -z "$keep" ] || echo "vm-run: keeping $run" >&2
cleanup() {
  [ -n "$qpid" ] && kill "$qpid" 2>/dev/null || true
  exec 7>&- 8>&-
  rm -f "$run/initrd" "$run/scratch.img" "$run"/out.* "$run"/err.*
  [ -n "$keep" ] || rm -rf "$run"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The per-run archive: the command and its settings.
mkdir -p "$run/extra"
printf '%s' "$command_string" >"$run/extra/cmd"
{
  echo "BASE_MODULES='${BASE_MODULES[*]}'"
  echo "DISK_MODULES='${DISK_MODULES[*]}'"
  echo "SCRATCH='${scratch:+1}'"
} >"$run/extra/run.cfg"
(cd "$run/extra" && printf '%s\n' cmd run.cfg | cpio -o -H newc -R 0:0 --quiet) >"$run/extra.cpio"
cat "$kdir/initramfs.cpio" "$run/extra.cpio" >"$run/initrd"

kernel="$kdir/vmlinuz"; [ -f "$kdir/vmlinux" ] && kernel="$kdir/vmlinux"
disk_args=()
if [ -n "$scratch" ]; then
  truncate -s "$scratch" "$run/scratch.img"
  mkfs.ext4 -q -F "$run/scratch.img" || die "mkfs.ext4 of the scratch disk failed"
  # shellcheck disable=SC2054
  disk_args=(-drive "file=$run/scratch.img,format=raw,if=none,id=scratch"
             -device virtio-blk-pci,drive=scratch)
fi

# stdout and stderr stream through FIFOs (QEMU's pipe chardev writes
# NAME.out). This script holds each FIFO open (fds 7, 8) so the readers
# never block on open and see EOF only once QEMU is gone and it lets go.
mkfifo "$run/out.in" "$run/out.out" "$run/err.in" "$run/err.out"
exec 7<>"$run/out.out" 8<>"$run/err.out"
# A reader that stops early (`| head`) must not stall the guest: the rest
# is drained and dropped.
(cat "$run/out.out" || exec cat "$run/out.out" >/dev/null) 7>&- 8>&- & c1=$!
(cat "$run/err.out" >&2 || exec cat "$run/err.out" >/dev/null) 7>&- 8>&- & c2=$!

timeout -k 5 "$tmo" qemu-system-x86_64 \
  -nodefaults -no-user-config -display none -no-reboot \
  "${accel_args[@]}" -smp "$cpus" \
  -object "memory-backend-memfd,id=mem,size=$mem,share=on" -numa node,memdev=mem -m "$mem" \
  -kernel "$kernel" -initrd "$run/initrd" \
  -append "console=ttyS0 quiet panic=-1 mitigations=off i8042.noaux i8042.nokbd i8042.nopnp ${MADO_VM_APPEND:-}" \
  -chardev "file,id=con,path=$run/console.log" -serial chardev:con \
  -chardev "socket,id=vfs,path=$sock" \
  -device vhost-user-fs-pci,chardev=vfs,tag=mado,queue-size=1024 \
  -device virtio-serial-pci,id=vser \
  -chardev "pipe,id=out,path=$run/out" -device virtserialport,chardev=out,name=mado.stdout \
  -chardev "pipe,id=err,path=$run/err" -device virtserialport,chardev=err,name=mado.stderr \
  -chardev "file,id=st,path=$run/status" -device virtserialport,chardev=st,name=mado.status \
  "${disk_args[@]}" \
  </dev/null >"$run/qemu.log" 2>&1 7>&- 8>&- &
qpid=$!
started=$SECONDS
qrc=0; wait "$qpid" || qrc=$?
qpid=""
exec 7>&- 8>&-
wait "$c1" "$c2" || true
rm -f "$run/scratch.img"

log="$run/console.log"
fail_with_log() {
  keep=1
  echo "vm-run: $1; console log: $log" >&2
  if [ -s "$run/qemu.log" ]; then echo "--- qemu output:" >&2; tail -n 20 "$run/qemu.log" >&2; fi
  if [ -s "$log" ]; then echo "--- last lines of $log:" >&2; tail -n 20 "$log" | tr -d '\r' >&2; fi
  exit "${2:-125}"
}
if [ "$qrc" = 124 ] || { [ "$qrc" = 137 ] && [ $((SECONDS - started)) -ge "$tmo" ]; }; then
  fail_with_log "timed out after $tmo s; QEMU killed" 124
fi
status_line=$(head -n1 "$run/status" 2>/dev/null || true)
if [[ "$status_line" =~ ^exit\ ([0-9]+)$ ]]; then
  tail -n +2 "$run/status" | sed 's/^/vm-run: /' >&2
  exit "${BASH_REMATCH[1]}"
fi
msg=$(tr -d '\r' <"$log" 2>/dev/null | sed -n 's/^mado-vm: error: //p' | head -n1 || true)
if [ -n "$msg" ]; then
  fail_with_log "guest setup failed: $msg"
elif [ "$qrc" != 0 ]; then
  fail_with_log "qemu-system-x86_64 failed (exit $qrc): $(head -n1 "$run/qemu.log")"
elif grep -q "Kernel panic" "$log" 2>/dev/null; then
  fail_with_log "the guest kernel panicked: $(tr -d '\r' <"$log" | grep -m1 'Kernel panic')"
elif ! grep -q "mado-vm: running the command" "$log" 2>/dev/null; then
  fail_with_log "the guest did not boot (its init never reported)"
else
  fail_with_log "the guest stopped without reporting the command's exit status"
fi
