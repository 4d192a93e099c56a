//! The one error type of this crate: which libcephfs call failed, and its errno.

use std::fmt;

/// A failed libcephfs call: the C function's name and the positive errno it returned
/// (libcephfs returns `-errno`; the sign is dropped, the code is kept unchanged so that it
/// can reach the guest as is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CephError {
    /// The libcephfs function that failed, e.g. `"ceph_ll_lookup"`.
    pub op: &'static str,
    /// Positive errno, e.g. `libc::ENOENT`.
    pub errno: i32,
}

impl CephError {
    /// An error for `op` with the positive errno `errno`.
    pub const fn new(op: &'static str, errno: i32) -> Self {
        Self { op, errno }
    }

    /// The positive errno.
    pub const fn errno(&self) -> i32 {
        self.errno
    }
}

impl fmt::Display for CephError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {}",
            self.op,
            std::io::Error::from_raw_os_error(self.errno)
        )
    }
}

impl std::error::Error for CephError {}

impl From<CephError> for std::io::Error {
    /// Keeps only the raw errno (`io::Error::from_raw_os_error`), so that fuse-backend-rs
    /// sends exactly that errno to the guest.
    fn from(e: CephError) -> Self {
        std::io::Error::from_raw_os_error(e.errno)
    }
}

/// Result of a libcephfs call.
pub type Result<T> = std::result::Result<T, CephError>;

/// Turns a libcephfs return value (negative errno on failure) into a `Result`, keeping the
/// non-negative value on success.
///
/// Never `impl From<i32> for CephError`: `?` on a bare integer would hide which call failed.
pub fn check<T>(op: &'static str, ret: T) -> Result<T>
where
    T: Copy + Into<i64>,
{
    let v: i64 = ret.into();
    if v < 0 {
        // libcephfs errnos are small positive numbers; anything that does not fit is EIO.
        let errno = i32::try_from(v.unsigned_abs()).unwrap_or(libc::EIO);
        Err(CephError { op, errno })
    } else {
        Ok(ret)
    }
}
