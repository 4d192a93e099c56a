//! Raw declarations of the libcephfs C API (the subset this crate uses).
//!
//! Written by hand from `/usr/include/cephfs/libcephfs.h` and `ceph_ll_client.h` of Debian's
//! `libcephfs-dev 16.2.15+ds-0+deb12u2` (Ceph 16.2.15 "Pacific", `LIBCEPHFS_VER` 10.0.2),
//! compiled with `-D_FILE_OFFSET_BITS=64` as the header demands. No bindgen: the build machines
//! have no libclang.
//!
//! How they were checked:
//! - every `#[repr(C)]` struct mirrored here (`ceph_statx`, `vinodeno_t`,
//!   `ceph_client_callback_args`) and the libc structs the calls take (`struct statvfs`,
//!   `struct flock`, `struct dirent`, which the header sees in their 64-bit-offset form) are
//!   compared field by field (size and offset) against the C compiler's view of the header by
//!   `tests/layout.rs`, through the C shim `src/layout_shim.c` that `build.rs` compiles;
//! - every function is checked to be exported by `libcephfs.so.2`
//!   (`nm -D --defined-only`); `ceph_ll_iclose` is declared by the header but NOT exported and
//!   is therefore not declared here. There is no `ceph_ll_get` either.
//!
//! To regenerate after a libcephfs upgrade: re-read the two headers, update the declarations,
//! and run `cargo test -p ceph-client --test layout`.

#![allow(non_camel_case_types)]

use libc::{c_char, c_int, c_uint, c_void, dev_t, gid_t, iovec, mode_t, off_t, size_t, uid_t};

pub use crate::statx::{Statx as ceph_statx, Timespec};

/// `struct ceph_mount_info` (opaque).
#[repr(C)]
#[derive(Debug)]
pub struct ceph_mount_info {
    _private: [u8; 0],
}

/// `struct ceph_dir_result` (opaque).
#[repr(C)]
#[derive(Debug)]
pub struct ceph_dir_result {
    _private: [u8; 0],
}

/// `struct Inode` (opaque, a C++ class inside libcephfs).
#[repr(C)]
#[derive(Debug)]
pub struct Inode {
    _private: [u8; 0],
}

/// `struct Fh` (opaque, a C++ class inside libcephfs).
#[repr(C)]
#[derive(Debug)]
pub struct Fh {
    _private: [u8; 0],
}

/// `struct UserPerm` (opaque, a C++ class inside libcephfs).
#[repr(C)]
#[derive(Debug)]
pub struct UserPerm {
    _private: [u8; 0],
}

/// `typedef struct inodeno_t { uint64_t val; } inodeno_t;`
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct inodeno_t {
    pub val: u64,
}

/// `typedef struct _snapid_t { uint64_t val; } snapid_t;`
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct snapid_t {
    pub val: u64,
}

/// `typedef struct vinodeno_t { inodeno_t ino; snapid_t snapid; } vinodeno_t;`
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct vinodeno_t {
    pub ino: inodeno_t,
    pub snapid: snapid_t,
}

/// `client_ino_callback_t`
pub type client_ino_callback_t =
    Option<unsafe extern "C" fn(handle: *mut c_void, ino: vinodeno_t, off: i64, len: i64)>;
/// `client_dentry_callback_t`
pub type client_dentry_callback_t = Option<
    unsafe extern "C" fn(
        handle: *mut c_void,
        dirino: vinodeno_t,
        ino: vinodeno_t,
        name: *const c_char,
        len: size_t,
    ),
>;
/// `client_switch_interrupt_callback_t`
pub type client_switch_interrupt_callback_t =
    Option<unsafe extern "C" fn(handle: *mut c_void, data: *mut c_void)>;
/// `client_remount_callback_t`
pub type client_remount_callback_t = Option<unsafe extern "C" fn(handle: *mut c_void) -> c_int>;
/// `client_umask_callback_t`
pub type client_umask_callback_t = Option<unsafe extern "C" fn(handle: *mut c_void) -> mode_t>;
/// `client_ino_release_t`
pub type client_ino_release_t = Option<unsafe extern "C" fn(handle: *mut c_void, ino: vinodeno_t)>;

/// `struct ceph_ll_io_info` (libcephfs 20 and later): one read or write for
/// `ceph_ll_nonblocking_readv_writev`. `callback` is called once with the struct back, `result`
/// set (bytes or -errno), on a libcephfs thread that may hold the client lock.
#[cfg(libcephfs_nonblocking)]
#[repr(C)]
#[derive(Debug)]
pub struct ceph_ll_io_info {
    pub callback: Option<unsafe extern "C" fn(*mut ceph_ll_io_info)>,
    pub priv_: *mut c_void,
    pub fh: *mut Fh,
    pub iov: *const iovec,
    pub iovcnt: c_int,
    pub off: i64,
    pub result: i64,
    pub write: bool,
    pub fsync: bool,
    pub syncdataonly: bool,
}

/// `struct ceph_client_callback_args`
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ceph_client_callback_args {
    pub handle: *mut c_void,
    pub ino_cb: client_ino_callback_t,
    pub dentry_cb: client_dentry_callback_t,
    pub switch_intr_cb: client_switch_interrupt_callback_t,
    pub remount_cb: client_remount_callback_t,
    pub umask_cb: client_umask_callback_t,
    pub ino_release_cb: client_ino_release_t,
}

#[link(name = "cephfs")]
extern "C" {
    // --- credentials ---
    pub fn ceph_userperm_new(
        uid: uid_t,
        gid: gid_t,
        ngids: c_int,
        gidlist: *mut gid_t,
    ) -> *mut UserPerm;
    pub fn ceph_userperm_destroy(perm: *mut UserPerm);
    pub fn ceph_mount_perms(cmount: *mut ceph_mount_info) -> *mut UserPerm;

    // --- lifecycle and configuration ---
    pub fn ceph_version(major: *mut c_int, minor: *mut c_int, patch: *mut c_int) -> *const c_char;
    pub fn ceph_create(cmount: *mut *mut ceph_mount_info, id: *const c_char) -> c_int;
    pub fn ceph_init(cmount: *mut ceph_mount_info) -> c_int;
    pub fn ceph_select_filesystem(cmount: *mut ceph_mount_info, fs_name: *const c_char) -> c_int;
    pub fn ceph_mount(cmount: *mut ceph_mount_info, root: *const c_char) -> c_int;
    pub fn ceph_unmount(cmount: *mut ceph_mount_info) -> c_int;
    pub fn ceph_abort_conn(cmount: *mut ceph_mount_info) -> c_int;
    pub fn ceph_release(cmount: *mut ceph_mount_info) -> c_int;
    pub fn ceph_is_mounted(cmount: *mut ceph_mount_info) -> c_int;
    pub fn ceph_get_instance_id(cmount: *mut ceph_mount_info) -> u64;
    pub fn ceph_conf_read_file(cmount: *mut ceph_mount_info, path_list: *const c_char) -> c_int;
    pub fn ceph_conf_set(
        cmount: *mut ceph_mount_info,
        option: *const c_char,
        value: *const c_char,
    ) -> c_int;
    pub fn ceph_conf_get(
        cmount: *mut ceph_mount_info,
        option: *const c_char,
        buf: *mut c_char,
        len: size_t,
    ) -> c_int;
    pub fn ceph_set_mount_timeout(cmount: *mut ceph_mount_info, timeout: u32) -> c_int;
    pub fn ceph_sync_fs(cmount: *mut ceph_mount_info) -> c_int;
    pub fn ceph_set_uuid(cmount: *mut ceph_mount_info, uuid: *const c_char);
    pub fn ceph_set_session_timeout(cmount: *mut ceph_mount_info, timeout: c_uint);
    pub fn ceph_start_reclaim(
        cmount: *mut ceph_mount_info,
        uuid: *const c_char,
        flags: c_uint,
    ) -> c_int;
    pub fn ceph_finish_reclaim(cmount: *mut ceph_mount_info);
    pub fn ceph_ll_register_callbacks(
        cmount: *mut ceph_mount_info,
        args: *mut ceph_client_callback_args,
    );

    // --- directory streams ---
    pub fn ceph_readdirplus_r(
        cmount: *mut ceph_mount_info,
        dirp: *mut ceph_dir_result,
        de: *mut libc::dirent,
        stx: *mut ceph_statx,
        want: c_uint,
        flags: c_uint,
        out: *mut *mut Inode,
    ) -> c_int;
    pub fn ceph_rewinddir(cmount: *mut ceph_mount_info, dirp: *mut ceph_dir_result);
    pub fn ceph_telldir(cmount: *mut ceph_mount_info, dirp: *mut ceph_dir_result) -> i64;
    pub fn ceph_seekdir(cmount: *mut ceph_mount_info, dirp: *mut ceph_dir_result, offset: i64);

    // --- low level (ll) API ---
    pub fn ceph_ll_get_inode(cmount: *mut ceph_mount_info, vino: vinodeno_t) -> *mut Inode;
    pub fn ceph_ll_lookup_vino(
        cmount: *mut ceph_mount_info,
        vino: vinodeno_t,
        inode: *mut *mut Inode,
    ) -> c_int;
    pub fn ceph_ll_lookup_inode(
        cmount: *mut ceph_mount_info,
        ino: inodeno_t,
        inode: *mut *mut Inode,
    ) -> c_int;
    pub fn ceph_ll_lookup_root(cmount: *mut ceph_mount_info, parent: *mut *mut Inode) -> c_int;
    pub fn ceph_ll_lookup(
        cmount: *mut ceph_mount_info,
        parent: *mut Inode,
        name: *const c_char,
        out: *mut *mut Inode,
        stx: *mut ceph_statx,
        want: c_uint,
        flags: c_uint,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_put(cmount: *mut ceph_mount_info, inode: *mut Inode) -> c_int;
    pub fn ceph_ll_forget(cmount: *mut ceph_mount_info, inode: *mut Inode, count: c_int) -> c_int;
    pub fn ceph_ll_walk(
        cmount: *mut ceph_mount_info,
        name: *const c_char,
        i: *mut *mut Inode,
        stx: *mut ceph_statx,
        want: c_uint,
        flags: c_uint,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_getattr(
        cmount: *mut ceph_mount_info,
        inode: *mut Inode,
        stx: *mut ceph_statx,
        want: c_uint,
        flags: c_uint,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_setattr(
        cmount: *mut ceph_mount_info,
        inode: *mut Inode,
        stx: *mut ceph_statx,
        mask: c_int,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_open(
        cmount: *mut ceph_mount_info,
        inode: *mut Inode,
        flags: c_int,
        fh: *mut *mut Fh,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_lseek(
        cmount: *mut ceph_mount_info,
        fh: *mut Fh,
        offset: off_t,
        whence: c_int,
    ) -> off_t;
    pub fn ceph_ll_read(
        cmount: *mut ceph_mount_info,
        fh: *mut Fh,
        off: i64,
        len: u64,
        buf: *mut c_char,
    ) -> c_int;
    pub fn ceph_ll_fsync(cmount: *mut ceph_mount_info, fh: *mut Fh, syncdataonly: c_int) -> c_int;
    pub fn ceph_ll_sync_inode(
        cmount: *mut ceph_mount_info,
        inode: *mut Inode,
        syncdataonly: c_int,
    ) -> c_int;
    pub fn ceph_ll_fallocate(
        cmount: *mut ceph_mount_info,
        fh: *mut Fh,
        mode: c_int,
        offset: i64,
        length: i64,
    ) -> c_int;
    pub fn ceph_ll_write(
        cmount: *mut ceph_mount_info,
        fh: *mut Fh,
        off: i64,
        len: u64,
        data: *const c_char,
    ) -> c_int;
    pub fn ceph_ll_readv(
        cmount: *mut ceph_mount_info,
        fh: *mut Fh,
        iov: *const iovec,
        iovcnt: c_int,
        off: i64,
    ) -> i64;
    pub fn ceph_ll_writev(
        cmount: *mut ceph_mount_info,
        fh: *mut Fh,
        iov: *const iovec,
        iovcnt: c_int,
        off: i64,
    ) -> i64;
    pub fn ceph_ll_close(cmount: *mut ceph_mount_info, fh: *mut Fh) -> c_int;
    /// libcephfs 20 and later (build.rs finds it in the header).
    #[cfg(libcephfs_nonblocking)]
    pub fn ceph_ll_nonblocking_readv_writev(
        cmount: *mut ceph_mount_info,
        io_info: *mut ceph_ll_io_info,
    ) -> i64;
    pub fn ceph_ll_getxattr(
        cmount: *mut ceph_mount_info,
        inode: *mut Inode,
        name: *const c_char,
        value: *mut c_void,
        size: size_t,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_setxattr(
        cmount: *mut ceph_mount_info,
        inode: *mut Inode,
        name: *const c_char,
        value: *const c_void,
        size: size_t,
        flags: c_int,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_listxattr(
        cmount: *mut ceph_mount_info,
        inode: *mut Inode,
        list: *mut c_char,
        buf_size: size_t,
        list_size: *mut size_t,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_removexattr(
        cmount: *mut ceph_mount_info,
        inode: *mut Inode,
        name: *const c_char,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_create(
        cmount: *mut ceph_mount_info,
        parent: *mut Inode,
        name: *const c_char,
        mode: mode_t,
        oflags: c_int,
        outp: *mut *mut Inode,
        fhp: *mut *mut Fh,
        stx: *mut ceph_statx,
        want: c_uint,
        lflags: c_uint,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_mknod(
        cmount: *mut ceph_mount_info,
        parent: *mut Inode,
        name: *const c_char,
        mode: mode_t,
        rdev: dev_t,
        out: *mut *mut Inode,
        stx: *mut ceph_statx,
        want: c_uint,
        flags: c_uint,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_mkdir(
        cmount: *mut ceph_mount_info,
        parent: *mut Inode,
        name: *const c_char,
        mode: mode_t,
        out: *mut *mut Inode,
        stx: *mut ceph_statx,
        want: c_uint,
        flags: c_uint,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_link(
        cmount: *mut ceph_mount_info,
        inode: *mut Inode,
        newparent: *mut Inode,
        name: *const c_char,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_opendir(
        cmount: *mut ceph_mount_info,
        inode: *mut Inode,
        dirpp: *mut *mut ceph_dir_result,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_releasedir(cmount: *mut ceph_mount_info, dir: *mut ceph_dir_result) -> c_int;
    pub fn ceph_ll_rename(
        cmount: *mut ceph_mount_info,
        parent: *mut Inode,
        name: *const c_char,
        newparent: *mut Inode,
        newname: *const c_char,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_unlink(
        cmount: *mut ceph_mount_info,
        inode: *mut Inode,
        name: *const c_char,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_statfs(
        cmount: *mut ceph_mount_info,
        inode: *mut Inode,
        stbuf: *mut libc::statvfs,
    ) -> c_int;
    pub fn ceph_ll_readlink(
        cmount: *mut ceph_mount_info,
        inode: *mut Inode,
        buf: *mut c_char,
        bufsize: size_t,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_symlink(
        cmount: *mut ceph_mount_info,
        inode: *mut Inode,
        name: *const c_char,
        value: *const c_char,
        out: *mut *mut Inode,
        stx: *mut ceph_statx,
        want: c_uint,
        flags: c_uint,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_rmdir(
        cmount: *mut ceph_mount_info,
        inode: *mut Inode,
        name: *const c_char,
        perms: *const UserPerm,
    ) -> c_int;
    pub fn ceph_ll_snap_seq(cmount: *mut ceph_mount_info, inode: *mut Inode) -> u64;
    pub fn ceph_ll_getlk(
        cmount: *mut ceph_mount_info,
        fh: *mut Fh,
        fl: *mut libc::flock,
        owner: u64,
    ) -> c_int;
    pub fn ceph_ll_setlk(
        cmount: *mut ceph_mount_info,
        fh: *mut Fh,
        fl: *mut libc::flock,
        owner: u64,
        sleep: c_int,
    ) -> c_int;
    pub fn ceph_set_deleg_timeout(cmount: *mut ceph_mount_info, timeout: u32) -> c_int;
}

/// One row of the C layout shim (`src/layout_shim.c`): a name such as `"ceph_statx.stx_mode"`
/// or `"sizeof ceph_statx"` and its value as the C compiler computed it. Test support only.
#[doc(hidden)]
#[repr(C)]
#[derive(Debug)]
pub struct ceph_client_layout_entry {
    pub name: *const c_char,
    pub value: size_t,
}

extern "C" {
    /// Number of rows in the layout shim (test support, see `tests/layout.rs`).
    #[doc(hidden)]
    pub fn ceph_client_layout_count() -> size_t;
    /// Row `i` of the layout shim, or null past the end (test support).
    #[doc(hidden)]
    pub fn ceph_client_layout_get(i: size_t) -> *const ceph_client_layout_entry;
}
