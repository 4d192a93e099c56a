#!/bin/sh
# cloud-hypervisor with a CephFS share from ceph-virtiofsd.
#
# 1. Start the daemon (cloud-hypervisor connects to its socket):
#      ceph-virtiofsd --socket-path /run/ceph-virtiofsd/vm1.sock --config /etc/ceph-virtiofsd/vm1.toml
#    (or: systemctl start ceph-virtiofsd@vm1; add the user cloud-hypervisor runs as to group
#    ceph-virtiofsd so it may open the socket).
# 2. Run this script; in the guest: mount -t virtiofs cephfs /mnt
#
# --memory shared=on is required: vhost-user backends map guest RAM. num_queues/queue_size of
# --fs are the request queues offered to the guest (ceph-virtiofsd's --queues must be at least
# num_queues). cloud-hypervisor takes the tag from --fs, not from the daemon's --tag.
SOCK=${SOCK:-/run/ceph-virtiofsd/vm1.sock}
TAG=${TAG:-cephfs}

exec cloud-hypervisor \
  --cpus boot=2 \
  --memory size=2G,shared=on \
  --kernel /var/lib/guest/vmlinux \
  --cmdline "console=hvc0 root=/dev/vda1 rw" \
  --disk path=/var/lib/guest/rootfs.raw \
  --fs "tag=$TAG,socket=$SOCK,num_queues=1,queue_size=1024" \
  --serial tty --console off
