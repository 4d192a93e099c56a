//! Safe RAII API over libcephfs's low-level (`ceph_ll_*`) interface (Ceph 16.2 "Pacific" and
//! newer).
//!
//! # Ownership: every C object is released exactly once
//!
//! | Rust type      | C object                 | acquired by                              | released by (in `Drop`) |
//! |----------------|--------------------------|------------------------------------------|-------------------------|
//! | [`MountBuilder`] | `ceph_mount_info*` before mount | `ceph_create`                   | `ceph_release` (if never mounted) |
//! | [`Mount`]      | `ceph_mount_info*`       | [`MountBuilder::mount`]                  | `ceph_unmount` + `ceph_release`, by the last clone |
//! | [`Inode`]      | one reference on `Inode*`| lookup/create calls, `try_clone`         | `ceph_ll_put` |
//! | [`File`]       | `Fh*`                    | `open`, `create`                         | `ceph_ll_close` (or [`File::close`]) |
//! | [`Dir`]        | `ceph_dir_result*`       | `opendir`                                | `ceph_ll_releasedir` |
//! | [`UserPerm`]   | `UserPerm*` + its gid list | [`UserPerm::new`]                      | `ceph_userperm_destroy`, then the list |
//!
//! Children keep their parent alive: every `Inode`, `File` and `Dir` holds a `Mount` clone
//! (an `Arc`), so the mount is unmounted only after the last of them is gone. Consuming
//! methods ([`Mount::unmount`], [`File::close`]) report teardown errors; they take the
//! object out so that `Drop` does not release it a second time.
//!
//! A C pointer is only ever handed to the client that made it, while it is alive: a call given
//! an [`Inode`] of another mount fails with EXDEV (a process may hold several mounts), and once
//! [`Mount::shutdown`] has begun, calls of the `Inode`s, `File`s and `Dir`s still alive fail
//! with ENOTCONN. Every call counts itself in flight on its mount for as long as it uses a
//! pointer, and the shutdown unmounts (freeing everything) only when no call is left: no
//! pointer is freed under a call in another thread. The checks are an atomic add and a pointer
//! compare.
//!
//! # Why `Mount`, `Inode`, `File` and `UserPerm` are `Send + Sync`
//!
//! libcephfs serialises the work of a mount on its internal `client_lock`: every `ceph_ll_*`
//! entry point takes it before touching client state (inode map, caps, file handles,
//! reference counts), and drops it only while waiting on the network with the objects it
//! uses still referenced. NFS-Ganesha (FSAL_CEPH) and Samba (vfs_ceph) share one mount
//! among all their worker threads on this basis. The calls that are *not* thread-safe —
//! `ceph_conf_*`, callback registration, `ceph_set_uuid`/`ceph_set_session_timeout` — exist
//! only on [`MountBuilder`], before the `Mount` exists. A `UserPerm` is immutable once
//! created (libcephfs takes `const UserPerm*`). A [`Dir`] has a single stream position, so
//! its reading and seeking methods take `&mut self`.
//!
//! # Errors
//!
//! Every failure is a [`CephError`] naming the C call and keeping its errno unchanged;
//! `io::Error::from(CephError)` is `from_raw_os_error(errno)`, so the errno reaches a FUSE
//! guest intact.

// As in the daemon: no unwrap/expect, no panicking indexing, no lossy or silent `as` (pointer
// casts use `cast`); allow a lint only on the item that needs it, with the reason. Unit tests
// are exempt.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        clippy::cast_sign_loss,
        clippy::as_conversions
    )
)]

pub mod admin_socket;
#[cfg(libcephfs_nonblocking)]
pub mod aio;
pub mod sys;

mod dir;
mod error;
mod file;
mod inode;
mod mount;
mod ops;
mod perm;
mod statx;

pub use dir::{Dir, DirEntryPlus};
pub use error::{check, CephError, Result};
pub use file::File;
pub use inode::Inode;
pub use mount::{version, CallbackHandler, Mount, MountBuilder, ReclaimOutcome, Vino};
pub use perm::{UserPerm, MAX_GROUPS};
pub use statx::*;
