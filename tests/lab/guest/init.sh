#!/bin/sh
# /init of the test guest (copied into the initramfs by build-initramfs).
#
# Kernel command line knobs:
#   vfs_tag=TAG      virtiofs tag to mount on /mnt (required)
#   vfs_opts=OPTS    extra mount options (-o OPTS)
#   test=PATH        test program to run with /mnt as cwd (default /test.sh; may live in /mnt)
#
# Serial console markers (one line each):
#   GUEST-BOOT: kernel KVER up SECS
#   GUEST-MOUNTED: TAG on /mnt up SECS
#   GUEST-SETUP-FAILED: <step>          (then exit code 126)
#   GUEST-RESULT: rc=N                  (N = exact exit status of the test program)
# The exit code goes to QEMU's isa-debug-exit port (0xf4), clamped to 0..127 so that QEMU's
# (code<<1)|1 still fits in an exit status; `poweroff -f` is the fallback.
export PATH=/sbin:/bin:/usr/sbin:/usr/bin
export HOME=/root

guest_exit() {
  code=$1
  [ "$code" -gt 127 ] && code=127
  cd /
  # Flush and unmount, but never wait for ever: with a dead daemon, requests to the share do not
  # return (the fault tests kill it on purpose), and the verdict must still reach the host.
  ( sync; umount /mnt 2>/dev/null ) &
  flusher=$!
  n=0
  while kill -0 "$flusher" 2>/dev/null && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
  kill -0 "$flusher" 2>/dev/null && echo "GUEST-WARN: sync/umount of /mnt did not finish in 10 s"
  [ -c /dev/port ] || mknod /dev/port c 1 4 2>/dev/null
  # One byte at port 0xf4 (offset 244 of /dev/port).
  # shellcheck disable=SC2059 # the octal escape must be in the format
  printf "\\$(printf %03o "$code")" | dd of=/dev/port bs=1 seek=244 count=1 conv=notrunc 2>/dev/null
  echo "GUEST-WARN: isa-debug-exit did not stop QEMU; powering off" >&2
  poweroff -f
  sleep 5
  exit "$code"
}

setup_failed() {
  echo "GUEST-SETUP-FAILED: $*"
  guest_exit 126
}

mount -t proc proc /proc || setup_failed "mount /proc"
mount -t sysfs sysfs /sys || setup_failed "mount /sys"
mount -t devtmpfs devtmpfs /dev || setup_failed "mount /dev"
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts 2>/dev/null
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp || setup_failed "mount /tmp"
mount -t tmpfs tmpfs /run
chmod 1777 /tmp /dev/shm
chown 1000:1000 /home/tester

echo "GUEST-BOOT: kernel $(uname -r) up $(cut -d' ' -f1 /proc/uptime)s"

VFS_TAG=
VFS_OPTS=
TEST=/test.sh
# shellcheck disable=SC2013 # the command line is one line of words
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    vfs_tag=*) VFS_TAG=${arg#vfs_tag=} ;;
    vfs_opts=*) VFS_OPTS=${arg#vfs_opts=} ;;
    test=*) TEST=${arg#test=} ;;
  esac
done
export VFS_TAG
[ -n "$VFS_TAG" ] || setup_failed "no vfs_tag= on the kernel command line"

while read -r ko; do
  [ -n "$ko" ] || continue
  insmod "/modules/$ko" || setup_failed "insmod $ko"
done < /modules/order

# The virtio-fs device registers asynchronously after virtio_pci probes: retry for ~5 s.
tries=0
if [ -n "$VFS_OPTS" ]; then set -- -o "$VFS_OPTS"; else set --; fi
until mount -t virtiofs "$@" "$VFS_TAG" /mnt 2>/tmp/mount.err; do
  tries=$((tries + 1))
  if [ "$tries" -ge 50 ]; then
    cat /tmp/mount.err
    setup_failed "mount -t virtiofs $VFS_TAG /mnt"
  fi
  usleep 100000
done
echo "GUEST-MOUNTED: $VFS_TAG on /mnt up $(cut -d' ' -f1 /proc/uptime)s"

cd /mnt || setup_failed "cd /mnt"
case "$TEST" in /*) ;; *) TEST=./$TEST ;; esac
if [ ! -e "$TEST" ]; then
  setup_failed "test program $TEST not found"
elif [ -x "$TEST" ]; then
  "$TEST"
else
  sh "$TEST"
fi
rc=$?
# Time checks in the guest (the checker's "now" windows) trust the guest's clock: say if the
# kernel changed clocksource or judged the TSC unstable during the run (TCG on a loaded host).
dmesg 2>/dev/null | grep -i -E 'unstable|switched|skew' | sed 's/^/GUEST-CLOCK: /' | head -n 20
echo "GUEST-CLOCK: clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null), up $(cut -d' ' -f1 /proc/uptime)s (run-guest says how long QEMU ran: a gap of seconds is time the guest lost)"
echo "GUEST-RESULT: rc=$rc"
guest_exit "$rc"
