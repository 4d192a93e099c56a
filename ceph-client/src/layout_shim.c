/*
 * Layout shim for ceph-client's layout test: reports, as the C compiler sees them through the
 * real libcephfs header, the size and field offsets of every struct src/sys.rs mirrors or
 * passes by pointer. Compiled by build.rs with -D_FILE_OFFSET_BITS=64 (as the header demands).
 * Not used by the library itself.
 */
#include <stddef.h>
#include <stdint.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/statvfs.h>
#include <cephfs/libcephfs.h>

struct ceph_client_layout_entry {
	const char *name;
	size_t value;
};

#define SZ(T) { "sizeof " #T, sizeof(struct T) }
#define OFF(T, F) { #T "." #F, offsetof(struct T, F) }

static const struct ceph_client_layout_entry entries[] = {
	SZ(ceph_statx),
	OFF(ceph_statx, stx_mask),
	OFF(ceph_statx, stx_blksize),
	OFF(ceph_statx, stx_nlink),
	OFF(ceph_statx, stx_uid),
	OFF(ceph_statx, stx_gid),
	OFF(ceph_statx, stx_mode),
	OFF(ceph_statx, stx_ino),
	OFF(ceph_statx, stx_size),
	OFF(ceph_statx, stx_blocks),
	OFF(ceph_statx, stx_dev),
	OFF(ceph_statx, stx_rdev),
	OFF(ceph_statx, stx_atime),
	OFF(ceph_statx, stx_ctime),
	OFF(ceph_statx, stx_mtime),
	OFF(ceph_statx, stx_btime),
	OFF(ceph_statx, stx_version),
	SZ(timespec),
	OFF(timespec, tv_sec),
	OFF(timespec, tv_nsec),
	SZ(vinodeno_t),
	OFF(vinodeno_t, ino),
	OFF(vinodeno_t, snapid),
	SZ(inodeno_t),
	SZ(_snapid_t),
	SZ(ceph_client_callback_args),
	OFF(ceph_client_callback_args, handle),
	OFF(ceph_client_callback_args, ino_cb),
	OFF(ceph_client_callback_args, dentry_cb),
	OFF(ceph_client_callback_args, switch_intr_cb),
	OFF(ceph_client_callback_args, remount_cb),
	OFF(ceph_client_callback_args, umask_cb),
	OFF(ceph_client_callback_args, ino_release_cb),
	SZ(statvfs),
	OFF(statvfs, f_bsize),
	OFF(statvfs, f_frsize),
	OFF(statvfs, f_blocks),
	OFF(statvfs, f_bfree),
	OFF(statvfs, f_bavail),
	OFF(statvfs, f_files),
	OFF(statvfs, f_ffree),
	OFF(statvfs, f_favail),
	OFF(statvfs, f_fsid),
	OFF(statvfs, f_flag),
	OFF(statvfs, f_namemax),
	SZ(flock),
	OFF(flock, l_type),
	OFF(flock, l_whence),
	OFF(flock, l_start),
	OFF(flock, l_len),
	OFF(flock, l_pid),
	SZ(dirent),
	OFF(dirent, d_ino),
	OFF(dirent, d_off),
	OFF(dirent, d_reclen),
	OFF(dirent, d_type),
	OFF(dirent, d_name),
#ifdef HAVE_LL_IO_INFO
	SZ(ceph_ll_io_info),
	OFF(ceph_ll_io_info, callback),
	OFF(ceph_ll_io_info, priv),
	OFF(ceph_ll_io_info, fh),
	OFF(ceph_ll_io_info, iov),
	OFF(ceph_ll_io_info, iovcnt),
	OFF(ceph_ll_io_info, off),
	OFF(ceph_ll_io_info, result),
	OFF(ceph_ll_io_info, write),
	OFF(ceph_ll_io_info, fsync),
	OFF(ceph_ll_io_info, syncdataonly),
#endif
	{ "CEPH_NOSNAP", (size_t)CEPH_NOSNAP },
	{ "CEPH_STATX_ALL_STATS", CEPH_STATX_ALL_STATS },
	{ "CEPH_SETATTR_KILL_SGUID", CEPH_SETATTR_KILL_SGUID },
	{ "CEPH_SETATTR_KILL_SUID", CEPH_SETATTR_KILL_SUID },
	{ "CEPH_SETATTR_KILL_SGID", CEPH_SETATTR_KILL_SGID },
	{ "AT_STATX_DONT_SYNC", AT_STATX_DONT_SYNC },
	{ "AT_NO_ATTR_SYNC", AT_NO_ATTR_SYNC },
	{ "AT_SYMLINK_NOFOLLOW", AT_SYMLINK_NOFOLLOW },
};

size_t ceph_client_layout_count(void)
{
	return sizeof(entries) / sizeof(entries[0]);
}

const struct ceph_client_layout_entry *ceph_client_layout_get(size_t i)
{
	return i < ceph_client_layout_count() ? &entries[i] : NULL;
}
