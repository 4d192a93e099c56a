//! Creating, configuring, mounting and unmounting a libcephfs client.

use std::ffi::{CStr, CString};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::error::{check, CephError, Result};
use crate::sys;

/// An inode's identity in CephFS: inode number and snapid (`CEPH_NOSNAP` for live inodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Vino {
    /// Inode number.
    pub ino: u64,
    /// Snapshot id, `CEPH_NOSNAP` for the live filesystem.
    pub snapid: u64,
}

impl From<sys::vinodeno_t> for Vino {
    fn from(v: sys::vinodeno_t) -> Self {
        Vino {
            ino: v.ino.val,
            snapid: v.snapid.val,
        }
    }
}

impl From<Vino> for sys::vinodeno_t {
    fn from(v: Vino) -> Self {
        sys::vinodeno_t {
            ino: sys::inodeno_t { val: v.ino },
            snapid: sys::snapid_t { val: v.snapid },
        }
    }
}

/// Notifications libcephfs sends when the MDS revokes what a client may cache, or asks it to
/// drop inode references. Called from libcephfs's own finisher threads, never while our
/// calls hold a lock of ours: keep them short and non-blocking. All methods default to no-ops.
pub trait CallbackHandler: Send + Sync {
    /// Data and/or attributes of `vino` changed elsewhere: cached pages in `[off, off+len)`
    /// (len 0: whole file) and attributes are stale.
    fn invalidate_inode(&self, _vino: Vino, _off: i64, _len: i64) {}
    /// The dentry `name` in directory `dir` (pointing at `ino`) is no longer valid.
    fn invalidate_dentry(&self, _dir: Vino, _ino: Vino, _name: &[u8]) {}
    /// The MDS wants the client to shrink its cache: release references to `vino` if possible.
    fn release_inode(&self, _vino: Vino) {}
    /// Whether to register the invalidation callbacks (`invalidate_inode`,
    /// `invalidate_dentry`). Registered, libcephfs queues one call on its invalidator threads
    /// for every cap revoke; a handler that only takes [`Self::release_inode`] says no.
    fn wants_invalidations(&self) -> bool {
        true
    }
}

type HandlerBox = Box<dyn CallbackHandler>;

unsafe extern "C" fn ino_cb(handle: *mut libc::c_void, ino: sys::vinodeno_t, off: i64, len: i64) {
    // SAFETY: `handle` is the `*const HandlerBox` registered in MountBuilder::mount; the box
    // lives in MountInner until after ceph_release, and libcephfs calls back only before that.
    let h = unsafe { &*handle.cast_const().cast::<HandlerBox>() };
    // Unwinding into C++ is undefined behaviour: a panicking handler is contained here.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        h.invalidate_inode(ino.into(), off, len)
    }));
}

unsafe extern "C" fn dentry_cb(
    handle: *mut libc::c_void,
    dirino: sys::vinodeno_t,
    ino: sys::vinodeno_t,
    name: *const libc::c_char,
    len: libc::size_t,
) {
    // SAFETY: as in `ino_cb`.
    let h = unsafe { &*handle.cast_const().cast::<HandlerBox>() };
    let name: &[u8] = if name.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: libcephfs passes the dentry name's buffer and its length; it stays valid
        // for the duration of the callback.
        unsafe { std::slice::from_raw_parts(name.cast::<u8>(), len) }
    };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        h.invalidate_dentry(dirino.into(), ino.into(), name)
    }));
}

unsafe extern "C" fn ino_release_cb(handle: *mut libc::c_void, ino: sys::vinodeno_t) {
    // SAFETY: as in `ino_cb`.
    let h = unsafe { &*handle.cast_const().cast::<HandlerBox>() };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.release_inode(ino.into())));
}

fn cstring(op: &'static str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| CephError::new(op, libc::EINVAL))
}

/// Configures a libcephfs client before mounting (`ceph_create` … `ceph_mount`).
///
/// All `ceph_conf_*` calls happen here, before the mount exists: they are not thread-safe.
/// Settings that libcephfs only accepts once its client object exists (callbacks, uuid,
/// session timeout, reclaim) are recorded and applied by [`MountBuilder::mount`] between
/// `ceph_init` and `ceph_mount`.
pub struct MountBuilder {
    // None once consumed by `mount` (which then owns the release).
    cmount: Option<NonNull<sys::ceph_mount_info>>,
    callbacks: Option<Box<HandlerBox>>,
    uuid: Option<CString>,
    session_timeout: Option<u32>,
    reclaim: Option<(CString, u32)>,
}

// SAFETY: the handle is used by one thread at a time (every method takes &mut self or self);
// libcephfs does not tie a not-yet-mounted handle to the creating thread.
unsafe impl Send for MountBuilder {}

impl std::fmt::Debug for MountBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountBuilder")
            .field("callbacks", &self.callbacks.is_some())
            .field("uuid", &self.uuid)
            .field("session_timeout", &self.session_timeout)
            .finish_non_exhaustive()
    }
}

impl MountBuilder {
    /// `ceph_create`: a new client handle for cephx id `client_id` (e.g. `"admin"`; `None`
    /// uses the configuration's default).
    pub fn new(client_id: Option<&str>) -> Result<Self> {
        let id = client_id.map(|s| cstring("ceph_create", s)).transpose()?;
        let mut raw: *mut sys::ceph_mount_info = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer; `id` is null or a NUL-terminated string that
        // outlives the call (libcephfs copies it).
        let ret = unsafe {
            sys::ceph_create(
                &mut raw,
                id.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            )
        };
        check("ceph_create", ret)?;
        let cmount = NonNull::new(raw).ok_or(CephError::new("ceph_create", libc::ENOMEM))?;
        Ok(MountBuilder {
            cmount: Some(cmount),
            callbacks: None,
            uuid: None,
            session_timeout: None,
            reclaim: None,
        })
    }

    fn raw(&self, op: &'static str) -> Result<*mut sys::ceph_mount_info> {
        self.cmount
            .map(NonNull::as_ptr)
            .ok_or(CephError::new(op, libc::EINVAL))
    }

    /// `ceph_conf_read_file`: read a ceph.conf (`None`: the default search path).
    pub fn conf_read_file(self, path: Option<&Path>) -> Result<Self> {
        let cm = self.raw("ceph_conf_read_file")?;
        let p = path
            .map(|p| {
                CString::new(p.as_os_str().as_encoded_bytes())
                    .map_err(|_| CephError::new("ceph_conf_read_file", libc::EINVAL))
            })
            .transpose()?;
        // SAFETY: `cm` is a live, unmounted handle owned by self; `p` is null or a
        // NUL-terminated path valid for the call.
        let ret = unsafe {
            sys::ceph_conf_read_file(cm, p.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()))
        };
        check("ceph_conf_read_file", ret)?;
        Ok(self)
    }

    /// `ceph_conf_set`: set one configuration option.
    pub fn conf_set(self, key: &str, value: &str) -> Result<Self> {
        let cm = self.raw("ceph_conf_set")?;
        let k = cstring("ceph_conf_set", key)?;
        let v = cstring("ceph_conf_set", value)?;
        // SAFETY: `cm` is a live, unmounted handle owned by self; both strings are
        // NUL-terminated and valid for the call (libcephfs copies them).
        let ret = unsafe { sys::ceph_conf_set(cm, k.as_ptr(), v.as_ptr()) };
        check("ceph_conf_set", ret)?;
        Ok(self)
    }

    /// Read one configuration option (`ceph_conf_get`).
    pub fn conf_get(&self, key: &str) -> Result<String> {
        conf_get(self.raw("ceph_conf_get")?, key)
    }

    /// `ceph_select_filesystem`: mount the CephFS named `name` instead of the default one.
    pub fn select_filesystem(self, name: &str) -> Result<Self> {
        let cm = self.raw("ceph_select_filesystem")?;
        let n = cstring("ceph_select_filesystem", name)?;
        // SAFETY: `cm` is a live, unmounted handle; `n` is NUL-terminated.
        let ret = unsafe { sys::ceph_select_filesystem(cm, n.as_ptr()) };
        check("ceph_select_filesystem", ret)?;
        Ok(self)
    }

    /// Register invalidation/release callbacks (`ceph_ll_register_callbacks`, applied at mount;
    /// they cannot be unregistered). The handler lives as long as the mount.
    pub fn register_callbacks(mut self, handler: Box<dyn CallbackHandler>) -> Self {
        self.callbacks = Some(Box::new(handler));
        self
    }

    /// `ceph_set_session_timeout` (seconds), applied at mount.
    pub fn set_session_timeout(mut self, secs: u32) -> Self {
        self.session_timeout = Some(secs);
        self
    }

    /// `ceph_set_uuid`: this client's stable identity for state reclaim, applied at mount.
    pub fn set_uuid(mut self, uuid: &str) -> Result<Self> {
        self.uuid = Some(cstring("ceph_set_uuid", uuid)?);
        Ok(self)
    }

    /// Reclaim (or, with `CEPH_RECLAIM_RESET`, reset) the state of the previous client
    /// instance that used `uuid` (`ceph_start_reclaim` + `ceph_finish_reclaim`, applied at
    /// mount, before `ceph_set_uuid`). With `CEPH_RECLAIM_RESET`, ENOENT (no such old client)
    /// is not an error. [`Mount::reclaim_outcome`] tells which of the two happened.
    ///
    /// The MDS (Ceph 14 and newer) only implements `CEPH_RECLAIM_RESET`: it evicts the old
    /// session (blocklisting its address unless `mds_session_blocklist_on_evict` is off),
    /// which drops its caps and file locks, and answers once that is done. The old session
    /// must belong to the same cephx user (the reclaim fails otherwise). Give the new session
    /// the same uuid with [`Self::set_uuid`], so that the next instance finds it: the MDS
    /// refuses to open a second session with a uuid a live session already has.
    pub fn reclaim(mut self, uuid: &str, flags: u32) -> Result<Self> {
        self.reclaim = Some((cstring("ceph_start_reclaim", uuid)?, flags));
        Ok(self)
    }

    /// `ceph_init` + the recorded settings + `ceph_mount(root)`. On failure the handle is
    /// released exactly once (here) and the error names the failing call.
    pub fn mount(mut self, root: &str) -> Result<Mount> {
        let root = cstring("ceph_mount", root)?;
        let Some(cm) = self.cmount.take() else {
            return Err(CephError::new("ceph_mount", libc::EINVAL));
        };
        // From here on the `inner` owns the handle: its Drop releases it exactly once, on
        // every error path below as well as at the end of the mount's life.
        let mut inner = MountInner {
            calls: AtomicUsize::new(0),
            unmounted: Mutex::new(false),
            idle: Condvar::new(),
            cmount: cm.as_ptr(),
            _callbacks: self.callbacks.take(),
            reclaim: None,
        };
        let cm = inner.cmount;
        // SAFETY: `cm` is a live handle, not yet initialised.
        check("ceph_init", unsafe { sys::ceph_init(cm) })?;
        if let Some(cb) = inner._callbacks.as_ref() {
            let handle: *const HandlerBox = &**cb;
            let inval = cb.wants_invalidations();
            let mut args = sys::ceph_client_callback_args {
                handle: handle.cast_mut().cast(),
                ino_cb: if inval { Some(ino_cb) } else { None },
                dentry_cb: if inval { Some(dentry_cb) } else { None },
                switch_intr_cb: None,
                remount_cb: None,
                umask_cb: None,
                ino_release_cb: Some(ino_release_cb),
            };
            // SAFETY: `cm` is initialised (the client object exists) and not mounted;
            // libcephfs copies the fields of `args`. `handle` points into a heap box owned by
            // `inner`, which outlives the client (dropped after ceph_release).
            unsafe { sys::ceph_ll_register_callbacks(cm, &mut args) };
        }
        if let Some((uuid, flags)) = self.reclaim.take() {
            // SAFETY: `cm` is initialised and not mounted; `uuid` is NUL-terminated.
            let ret = unsafe { sys::ceph_start_reclaim(cm, uuid.as_ptr(), flags) };
            let reset = flags & crate::statx::CEPH_RECLAIM_RESET != 0;
            inner.reclaim = Some(if reset && ret == -libc::ENOENT {
                ReclaimOutcome::NoPrevious
            } else {
                check("ceph_start_reclaim", ret)?;
                ReclaimOutcome::Reclaimed
            });
            // SAFETY: `cm` is initialised; finishing a reclaim that found nothing is a no-op.
            unsafe { sys::ceph_finish_reclaim(cm) };
        }
        if let Some(uuid) = self.uuid.take() {
            // SAFETY: `cm` is initialised and not mounted; libcephfs copies the string.
            unsafe { sys::ceph_set_uuid(cm, uuid.as_ptr()) };
        }
        if let Some(t) = self.session_timeout {
            // SAFETY: `cm` is initialised and not mounted.
            unsafe { sys::ceph_set_session_timeout(cm, t) };
        }
        // SAFETY: `cm` is initialised and not mounted; `root` is NUL-terminated.
        check("ceph_mount", unsafe { sys::ceph_mount(cm, root.as_ptr()) })?;
        Ok(Mount {
            inner: Arc::new(inner),
        })
    }
}

impl Drop for MountBuilder {
    fn drop(&mut self) {
        if let Some(cm) = self.cmount.take() {
            // SAFETY: the handle was never mounted (mount() takes it out of `self.cmount`
            // first) and is released only here.
            unsafe { sys::ceph_release(cm.as_ptr()) };
        }
    }
}

/// In `MountInner::calls`: the mount takes no new calls ([`Mount::shutdown`] has begun).
const CLOSED: usize = 1 << (usize::BITS - 1);

struct MountInner {
    // Null once torn down by `Mount::unmount`.
    cmount: *mut sys::ceph_mount_info,
    // The calls in flight ([`Call`]s alive), and `CLOSED` once `Mount::shutdown` began: from
    // then on no call starts, and the unmount waits until none is left.
    calls: AtomicUsize,
    // Set once `Mount::shutdown` (or `abort_conn`) has had libcephfs unmount: every inode,
    // file handle and directory stream is freed. Also the lock `idle` waits with.
    unmounted: Mutex<bool>,
    // Signalled when the last call of a closed mount ends.
    idle: Condvar,
    // Pointed to by the `handle` registered with libcephfs; dropped after ceph_release.
    _callbacks: Option<Box<HandlerBox>>,
    // What `ceph_start_reclaim` found, for a mount built with `MountBuilder::reclaim`.
    reclaim: Option<ReclaimOutcome>,
}

/// What [`MountBuilder::reclaim`] did before the mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReclaimOutcome {
    /// A session with the uuid existed and its state was reclaimed (with `CEPH_RECLAIM_RESET`:
    /// the MDS ended it, releasing its caps and locks).
    Reclaimed,
    /// No session had the uuid (`CEPH_RECLAIM_RESET` only; ENOENT from `ceph_start_reclaim`).
    NoPrevious,
}

impl MountInner {
    fn teardown(&mut self) -> Result<()> {
        let cm = std::mem::replace(&mut self.cmount, std::ptr::null_mut());
        if cm.is_null() {
            return Ok(());
        }
        // A shutdown (or abort) unmounted already: only the release is left.
        let shut_down = *self
            .unmounted
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        // SAFETY: `cm` is a live handle, torn down only here, once (the field is now null);
        // no Inode/File/Dir exists any more, since each of them holds a Mount clone.
        let mounted = !shut_down
            // SAFETY: as above.
            && unsafe { sys::ceph_is_mounted(cm) } != 0;
        let unmounted = if mounted {
            // SAFETY: as above.
            check("ceph_unmount", unsafe { sys::ceph_unmount(cm) }).map(drop)
        } else {
            Ok(())
        };
        // SAFETY: as above; after ceph_unmount (or a failed mount/abort) the handle is no
        // longer mounted, so ceph_release frees it.
        let released = check("ceph_release", unsafe { sys::ceph_release(cm) }).map(drop);
        unmounted.and(released)
    }
}

impl Drop for MountInner {
    fn drop(&mut self) {
        // Errors cannot be reported from Drop; use Mount::unmount to see them.
        let _ = self.teardown();
    }
}

/// A mounted libcephfs client. Cheap to clone (an `Arc` inside); the last owner unmounts
/// and releases the handle, exactly once. Every `Inode`, `File` and `Dir` holds a clone, so
/// the mount outlives them all.
#[derive(Clone)]
pub struct Mount {
    inner: Arc<MountInner>,
}

// SAFETY: libcephfs serialises all work on a mount under its internal `client_lock`; every
// `ceph_ll_*` entry point takes it before touching client state, and NFS-Ganesha's FSAL_CEPH
// and Samba's vfs_ceph share one mount among all their worker threads. The only calls that
// are not thread-safe (`ceph_conf_*`, callback registration, uuid/session settings) happen on
// the `MountBuilder` before a `Mount` exists. The handle pointer itself is never mutated
// while shared: teardown needs the last owner (`Arc::try_unwrap` or the Arc's Drop).
unsafe impl Send for MountInner {}
// SAFETY: see Send.
unsafe impl Sync for MountInner {}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount")
            .field("cmount", &self.inner.cmount)
            .finish()
    }
}

/// A call on the mount in progress, from [`Mount::enter`] until dropped: while one exists,
/// [`Mount::shutdown`] does not unmount, so the pointers the call hands libcephfs stay valid.
/// The pointers of inodes, files and directory streams are only given out against one
/// ([`Inode::raw_on`](crate::Inode), `File::live`).
pub(crate) struct Call<'a> {
    mount: &'a Mount,
}

impl Call<'_> {
    /// The mount the call is on.
    pub(crate) fn mount(&self) -> &Mount {
        self.mount
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        self.mount.leave();
    }
}

/// A [`Call`] that owns its mount: for I/O that completes after the call that submitted it
/// returned (`ceph_ll_nonblocking_readv_writev`). Dropping it takes no libcephfs lock; in a
/// libcephfs callback it may be dropped only while something else still holds the mount,
/// or the mount's last reference would unmount from libcephfs's own thread.
#[cfg_attr(not(libcephfs_nonblocking), allow(dead_code))]
pub(crate) struct OwnedCall {
    mount: Mount,
}

impl Drop for OwnedCall {
    fn drop(&mut self) {
        self.mount.leave();
    }
}

/// `ceph_conf_get` on a live handle (mounted or not).
fn conf_get(cm: *mut sys::ceph_mount_info, key: &str) -> Result<String> {
    let k = cstring("ceph_conf_get", key)?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: the callers pass a live handle they hold; `k` is NUL-terminated and `buf` is
    // writable for `buf.len()` bytes.
    let ret = unsafe { sys::ceph_conf_get(cm, k.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    check("ceph_conf_get", ret)?;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    buf.truncate(end);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

impl Mount {
    /// The raw handle, for the `ceph_mount_info*` argument of calls.
    pub(crate) fn raw(&self) -> *mut sys::ceph_mount_info {
        self.inner.cmount
    }

    /// Unmount and release now, reporting errors. If other clones (or inodes, files,
    /// directories) still hold the mount, nothing is torn down here (the last owner does it
    /// in Drop) and EBUSY is returned.
    pub fn unmount(self) -> Result<()> {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => inner.teardown(),
            Err(_still_shared) => Err(CephError::new("ceph_unmount", libc::EBUSY)),
        }
    }

    /// Start a call on the mount: ENOTCONN (`op`) once [`Mount::shutdown`] has begun. Until the
    /// returned [`Call`] is dropped, no shutdown unmounts. One atomic add (and one subtract at
    /// the end).
    pub(crate) fn enter(&self, op: &'static str) -> Result<Call<'_>> {
        let call = Call { mount: self };
        if self.inner.calls.fetch_add(1, Ordering::AcqRel) & CLOSED != 0 {
            // Dropping `call` takes the add back.
            return Err(CephError::new(op, libc::ENOTCONN));
        }
        Ok(call)
    }

    /// [`Mount::enter`] for a call that outlives its caller's stack frame.
    #[cfg_attr(not(libcephfs_nonblocking), allow(dead_code))]
    pub(crate) fn enter_owned(&self, op: &'static str) -> Result<OwnedCall> {
        let call = OwnedCall {
            mount: self.clone(),
        };
        if self.inner.calls.fetch_add(1, Ordering::AcqRel) & CLOSED != 0 {
            return Err(CephError::new(op, libc::ENOTCONN));
        }
        Ok(call)
    }

    /// The end of a call: the last one of a closed mount wakes a waiting shutdown.
    fn leave(&self) {
        let inner = &*self.inner;
        if inner.calls.fetch_sub(1, Ordering::AcqRel) == CLOSED | 1 {
            // The last call of a closed mount: a shutdown may be waiting. Taking the lock
            // orders this wake-up after the waiter's check of the count.
            let _g = inner
                .unmounted
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            inner.idle.notify_all();
        }
    }

    /// Unmount now although other owners (inodes, files, directories, clones) may still exist:
    /// for a process that is about to exit (a daemon on SIGTERM) and wants its MDS session
    /// closed cleanly — dirty data flushed, caps returned — instead of left to time out.
    ///
    /// From the start of the shutdown every call on this mount fails with ENOTCONN (the calls
    /// taking an [`Inode`](crate::Inode), and those of [`File`](crate::File) and [`Dir`](crate::Dir), too)
    /// and the owners still alive release nothing in their Drop. The calls already in flight
    /// in other threads are waited for, at most `wait`: then `ceph_unmount` flushes, closes the
    /// open file handles and directory streams and frees every inode, with no pointer of this
    /// mount in use. If calls are still in flight after `wait` (a lock wait, a stuck OSD),
    /// nothing is unmounted and the error is EBUSY: the mount stays closed, a later shutdown
    /// may try again, and the last owner's Drop unmounts. Unmounts at most once; a shutdown
    /// after a successful one does nothing.
    pub fn shutdown(&self, wait: Duration) -> Result<()> {
        self.close("ceph_unmount", wait, |cm| {
            // SAFETY: `close` passes the live handle while no call is in flight and none can
            // start, and only if no earlier shutdown or abort unmounted it.
            unsafe { sys::ceph_unmount(cm) }
        })
    }

    /// Close the mount to new calls, wait (at most `wait`) until none is in flight, and run
    /// `unmount` on the handle once: the common part of [`Mount::shutdown`] and
    /// [`Mount::abort_conn`].
    fn close(
        &self,
        op: &'static str,
        wait: Duration,
        unmount: impl FnOnce(*mut sys::ceph_mount_info) -> i32,
    ) -> Result<()> {
        let inner = &*self.inner;
        inner.calls.fetch_or(CLOSED, Ordering::AcqRel);
        let deadline = Instant::now().checked_add(wait);
        let mut unmounted = inner
            .unmounted
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *unmounted {
            return Ok(());
        }
        while inner.calls.load(Ordering::Acquire) & !CLOSED != 0 {
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return Err(CephError::new(op, libc::EBUSY)),
                },
                None => Duration::MAX,
            };
            unmounted = inner
                .idle
                .wait_timeout(unmounted, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        // Set first: whatever libcephfs answers, it may have freed the handles, so nobody
        // releases one again (Drop of the last owner then only releases the client).
        *unmounted = true;
        check(op, unmount(self.raw())).map(drop)
    }

    /// `ceph_conf_get` on the mounted client: the value of a configuration option. Reading the
    /// configuration needs no mounted session, so this works after a shutdown too.
    pub fn conf_get(&self, key: &str) -> Result<String> {
        conf_get(self.raw(), key)
    }

    /// What the reclaim requested with [`MountBuilder::reclaim`] did; `None` without one.
    pub fn reclaim_outcome(&self) -> Option<ReclaimOutcome> {
        self.inner.reclaim
    }

    /// How many calls are in flight on the mount now (in other threads: those a
    /// [`Mount::shutdown`] waits for). For diagnostics and tests.
    pub fn calls_in_flight(&self) -> usize {
        self.inner.calls.load(Ordering::Acquire) & !CLOSED
    }

    /// Whether `other` is this mount or a clone of it (a pointer compare).
    pub fn same_mount(&self, other: &Mount) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// `ceph_abort_conn`: drop the MDS sessions without flushing or releasing caps (for a
    /// fast exit after which another instance reclaims the state). Like [`Mount::shutdown`]
    /// (which it replaces) it closes the mount to new calls (ENOTCONN) and waits at most
    /// `wait` for the calls in flight (EBUSY otherwise); Drop then only releases the handle.
    pub fn abort_conn(&self, wait: Duration) -> Result<()> {
        self.close("ceph_abort_conn", wait, |cm| {
            // SAFETY: as in `shutdown`; abort_conn frees the client's inodes and handles as
            // an unmount does, without flushing.
            unsafe { sys::ceph_abort_conn(cm) }
        })
    }

    /// `ceph_sync_fs`: flush all dirty data and metadata of this client.
    pub fn sync_fs(&self) -> Result<()> {
        let _call = self.enter("ceph_sync_fs")?;
        // SAFETY: the handle is live and mounted (not shut down while `_call` lives).
        check("ceph_sync_fs", unsafe { sys::ceph_sync_fs(self.raw()) }).map(drop)
    }

    /// `ceph_get_instance_id`: the client's global id (its `client.N`); 0 after a shutdown.
    pub fn instance_id(&self) -> u64 {
        let Ok(_call) = self.enter("ceph_get_instance_id") else {
            return 0;
        };
        // SAFETY: the handle is live and mounted (not shut down while `_call` lives).
        unsafe { sys::ceph_get_instance_id(self.raw()) }
    }

    /// `ceph_set_deleg_timeout`.
    pub fn set_deleg_timeout(&self, secs: u32) -> Result<()> {
        let _call = self.enter("ceph_set_deleg_timeout")?;
        // SAFETY: the handle is live and mounted (not shut down while `_call` lives).
        check("ceph_set_deleg_timeout", unsafe {
            sys::ceph_set_deleg_timeout(self.raw(), secs)
        })
        .map(drop)
    }
}

/// The libcephfs version string and (major, minor, patch) it reports (`ceph_version`).
pub fn version() -> (String, (i32, i32, i32)) {
    let (mut a, mut b, mut c) = (0, 0, 0);
    // SAFETY: three valid out pointers; the returned string is static inside libcephfs.
    let s = unsafe { sys::ceph_version(&mut a, &mut b, &mut c) };
    let s = if s.is_null() {
        String::new()
    } else {
        // SAFETY: non-null, NUL-terminated static string.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    };
    (s, (a, b, c))
}
