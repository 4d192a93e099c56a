#!/bin/sh
# QEMU with a CephFS share from ceph-virtiofsd: exactly the command line the project's guest
# harness (tests/lab/guest/run-guest) runs, so it is tested on every CI run
# (tests/packaging.rs compares the two argument by argument).
#
# 1. Start the daemon first; QEMU is the socket's client:
#      ceph-virtiofsd --socket-path /run/ceph-virtiofsd/vm1.sock --config /etc/ceph-virtiofsd/vm1.toml
#    (or: systemctl start ceph-virtiofsd@vm1)
# 2. Run this script; in the guest: mount -t virtiofs cephfs /mnt
#
# What matters for virtio-fs:
#   - guest RAM must be shared with the daemon: memory-backend-memfd (or -file on hugetlbfs)
#     with share=on, selected by -M ...,memory-backend=mem;
#   - -chardev socket,path=SOCK + -device vhost-user-fs-pci,chardev=...,tag=TAG; the guest mounts
#     TAG. num-request-queues=N (QUEUES below) needs the daemon's --queues N or more.
# The rest is the harness's choice: TCG (add -accel kvm where KVM is usable), a bare kernel and
# initramfs whose /init reads vfs_tag= from the command line, isa-debug-exit to report the guest's
# exit status, the serial console to a file. Extra QEMU arguments can follow on the command line.
QEMU=${QEMU:-qemu-system-x86_64}
ACCEL=${ACCEL:-tcg}
SMP=${SMP:-1}
MEM=${MEM:-512M}
SOCK=${SOCK:-/run/ceph-virtiofsd/vm1.sock}
TAG=${TAG:-cephfs}
QUEUES=${QUEUES:-}
KERNEL=${KERNEL:-/var/lib/guest/vmlinux}
INITRD=${INITRD:-/var/lib/guest/initrd.img}
APPEND=${APPEND:-}
CONSOLE=${CONSOLE:-console.log}

"$QEMU" -accel "$ACCEL" -M pc,memory-backend=mem -smp "$SMP" -m "$MEM" \
  -object "memory-backend-memfd,id=mem,size=$MEM,share=on" \
  -chardev "socket,id=char0,path=$SOCK" \
  -device "vhost-user-fs-pci,chardev=char0,tag=$TAG${QUEUES:+,num-request-queues=$QUEUES}" \
  -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
  -kernel "$KERNEL" -initrd "$INITRD" \
  -append "console=ttyS0 quiet panic=-1 vfs_tag=$TAG $APPEND" \
  -nodefaults -display none -serial "file:$CONSOLE" -no-reboot "$@"
