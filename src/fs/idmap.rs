//! The uid/gid translation of [`crate::idmap`] applied as a `FileSystem` decorator.

pub use wrapper::IdMapFs;

/// The translation applied at the `FileSystem` boundary: every request reaches the wrapped
/// filesystem with Ceph ids (credentials and SETATTR owners), and every attribute it returns is
/// rewritten into guest ids. The wrapped filesystem thus lives in one id space (Ceph's), so its
/// own permission and ownership checks compare like with like.
///
/// Every `FileSystem` method is delegated explicitly: a method missing here would silently answer
/// with the trait's default (mostly ENOSYS). When the trait grows, extend this list.
mod wrapper {
    use std::ffi::CStr;
    use std::io;
    use std::sync::Arc;
    use std::time::Duration;

    use fuse_backend_rs::abi::fuse_abi::{
        stat64, statvfs64, CreateIn, FsOptions, OpenOptions, SetattrValid,
    };
    use fuse_backend_rs::abi::virtio_fs::RemovemappingOne;
    use fuse_backend_rs::api::filesystem::{
        Context, DirEntry, Entry, FileLock, FileSystem, GetxattrReply, IoctlData, ListxattrReply,
        ZeroCopyReader, ZeroCopyWriter,
    };
    use fuse_backend_rs::transport::FsCacheReqHandler;

    use crate::idmap::IdMapping;
    use crate::server::wire::ExtraOps;

    /// A filesystem seen through a uid/gid translation (see the module documentation).
    #[derive(Debug)]
    pub struct IdMapFs<F> {
        inner: Arc<F>,
        map: IdMapping,
    }

    impl<F> IdMapFs<F> {
        pub fn new(inner: Arc<F>, map: IdMapping) -> Self {
            IdMapFs { inner, map }
        }

        /// The wrapped filesystem.
        pub fn inner(&self) -> &Arc<F> {
            &self.inner
        }

        /// Request credentials in Ceph ids; EPERM for a forbidden guest id.
        fn ctx(&self, ctx: &Context) -> io::Result<Context> {
            let (uid, gid) = self.map.creds(ctx.uid, ctx.gid)?;
            Ok(Context { uid, gid, ..*ctx })
        }

        /// For requests that must never fail (forget, release): translated when possible.
        fn ctx_lenient(&self, ctx: &Context) -> Context {
            self.ctx(ctx).unwrap_or(*ctx)
        }

        fn entry(&self, mut e: Entry) -> Entry {
            self.map.attr_to_guest(&mut e.attr);
            e
        }

        fn attr(&self, (mut st, ttl): (stat64, Duration)) -> (stat64, Duration) {
            self.map.attr_to_guest(&mut st);
            (st, ttl)
        }
    }

    impl<F: FileSystem<Inode = u64, Handle = u64>> FileSystem for IdMapFs<F> {
        type Inode = u64;
        type Handle = u64;

        fn init(&self, capable: FsOptions) -> io::Result<FsOptions> {
            self.inner.init(capable)
        }

        fn destroy(&self) {
            self.inner.destroy()
        }

        fn lookup(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
            let e = self.inner.lookup(&self.ctx(ctx)?, parent, name)?;
            Ok(self.entry(e))
        }

        fn forget(&self, ctx: &Context, inode: u64, count: u64) {
            self.inner.forget(&self.ctx_lenient(ctx), inode, count)
        }

        fn batch_forget(&self, ctx: &Context, requests: Vec<(u64, u64)>) {
            self.inner.batch_forget(&self.ctx_lenient(ctx), requests)
        }

        fn getattr(
            &self,
            ctx: &Context,
            inode: u64,
            handle: Option<u64>,
        ) -> io::Result<(stat64, Duration)> {
            let a = self.inner.getattr(&self.ctx(ctx)?, inode, handle)?;
            Ok(self.attr(a))
        }

        fn setattr(
            &self,
            ctx: &Context,
            inode: u64,
            mut attr: stat64,
            handle: Option<u64>,
            valid: SetattrValid,
        ) -> io::Result<(stat64, Duration)> {
            let ctx = self.ctx(ctx)?;
            if valid.contains(SetattrValid::UID) {
                attr.st_uid = self.map.host_uid(attr.st_uid)?;
            }
            if valid.contains(SetattrValid::GID) {
                attr.st_gid = self.map.host_gid(attr.st_gid)?;
            }
            let a = self.inner.setattr(&ctx, inode, attr, handle, valid)?;
            Ok(self.attr(a))
        }

        fn readlink(&self, ctx: &Context, inode: u64) -> io::Result<Vec<u8>> {
            self.inner.readlink(&self.ctx(ctx)?, inode)
        }

        fn symlink(
            &self,
            ctx: &Context,
            linkname: &CStr,
            parent: u64,
            name: &CStr,
        ) -> io::Result<Entry> {
            let e = self
                .inner
                .symlink(&self.ctx(ctx)?, linkname, parent, name)?;
            Ok(self.entry(e))
        }

        fn mknod(
            &self,
            ctx: &Context,
            inode: u64,
            name: &CStr,
            mode: u32,
            rdev: u32,
            umask: u32,
        ) -> io::Result<Entry> {
            let e = self
                .inner
                .mknod(&self.ctx(ctx)?, inode, name, mode, rdev, umask)?;
            Ok(self.entry(e))
        }

        fn mkdir(
            &self,
            ctx: &Context,
            parent: u64,
            name: &CStr,
            mode: u32,
            umask: u32,
        ) -> io::Result<Entry> {
            let e = self
                .inner
                .mkdir(&self.ctx(ctx)?, parent, name, mode, umask)?;
            Ok(self.entry(e))
        }

        fn unlink(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
            self.inner.unlink(&self.ctx(ctx)?, parent, name)
        }

        fn rmdir(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
            self.inner.rmdir(&self.ctx(ctx)?, parent, name)
        }

        fn rename(
            &self,
            ctx: &Context,
            olddir: u64,
            oldname: &CStr,
            newdir: u64,
            newname: &CStr,
            flags: u32,
        ) -> io::Result<()> {
            self.inner
                .rename(&self.ctx(ctx)?, olddir, oldname, newdir, newname, flags)
        }

        fn link(
            &self,
            ctx: &Context,
            inode: u64,
            newparent: u64,
            newname: &CStr,
        ) -> io::Result<Entry> {
            let e = self
                .inner
                .link(&self.ctx(ctx)?, inode, newparent, newname)?;
            Ok(self.entry(e))
        }

        fn open(
            &self,
            ctx: &Context,
            inode: u64,
            flags: u32,
            fuse_flags: u32,
        ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
            self.inner.open(&self.ctx(ctx)?, inode, flags, fuse_flags)
        }

        fn create(
            &self,
            ctx: &Context,
            parent: u64,
            name: &CStr,
            args: CreateIn,
        ) -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)> {
            let (e, h, o, p) = self.inner.create(&self.ctx(ctx)?, parent, name, args)?;
            Ok((self.entry(e), h, o, p))
        }

        fn read(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            w: &mut dyn ZeroCopyWriter,
            size: u32,
            offset: u64,
            lock_owner: Option<u64>,
            flags: u32,
        ) -> io::Result<usize> {
            self.inner.read(
                &self.ctx(ctx)?,
                inode,
                handle,
                w,
                size,
                offset,
                lock_owner,
                flags,
            )
        }

        fn write(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            r: &mut dyn ZeroCopyReader,
            size: u32,
            offset: u64,
            lock_owner: Option<u64>,
            delayed_write: bool,
            flags: u32,
            fuse_flags: u32,
        ) -> io::Result<usize> {
            self.inner.write(
                &self.ctx(ctx)?,
                inode,
                handle,
                r,
                size,
                offset,
                lock_owner,
                delayed_write,
                flags,
                fuse_flags,
            )
        }

        fn flush(&self, ctx: &Context, inode: u64, handle: u64, lock_owner: u64) -> io::Result<()> {
            self.inner
                .flush(&self.ctx_lenient(ctx), inode, handle, lock_owner)
        }

        fn fsync(&self, ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
            self.inner.fsync(&self.ctx(ctx)?, inode, datasync, handle)
        }

        fn fallocate(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            mode: u32,
            offset: u64,
            length: u64,
        ) -> io::Result<()> {
            self.inner
                .fallocate(&self.ctx(ctx)?, inode, handle, mode, offset, length)
        }

        fn release(
            &self,
            ctx: &Context,
            inode: u64,
            flags: u32,
            handle: u64,
            flush: bool,
            flock_release: bool,
            lock_owner: Option<u64>,
        ) -> io::Result<()> {
            self.inner.release(
                &self.ctx_lenient(ctx),
                inode,
                flags,
                handle,
                flush,
                flock_release,
                lock_owner,
            )
        }

        fn statfs(&self, ctx: &Context, inode: u64) -> io::Result<statvfs64> {
            self.inner.statfs(&self.ctx(ctx)?, inode)
        }

        fn setxattr(
            &self,
            ctx: &Context,
            inode: u64,
            name: &CStr,
            value: &[u8],
            flags: u32,
        ) -> io::Result<()> {
            self.inner
                .setxattr(&self.ctx(ctx)?, inode, name, value, flags)
        }

        fn getxattr(
            &self,
            ctx: &Context,
            inode: u64,
            name: &CStr,
            size: u32,
        ) -> io::Result<GetxattrReply> {
            self.inner.getxattr(&self.ctx(ctx)?, inode, name, size)
        }

        fn listxattr(&self, ctx: &Context, inode: u64, size: u32) -> io::Result<ListxattrReply> {
            self.inner.listxattr(&self.ctx(ctx)?, inode, size)
        }

        fn removexattr(&self, ctx: &Context, inode: u64, name: &CStr) -> io::Result<()> {
            self.inner.removexattr(&self.ctx(ctx)?, inode, name)
        }

        fn opendir(
            &self,
            ctx: &Context,
            inode: u64,
            flags: u32,
        ) -> io::Result<(Option<u64>, OpenOptions)> {
            self.inner.opendir(&self.ctx(ctx)?, inode, flags)
        }

        fn readdir(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            size: u32,
            offset: u64,
            add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
        ) -> io::Result<()> {
            self.inner
                .readdir(&self.ctx(ctx)?, inode, handle, size, offset, add_entry)
        }

        fn readdirplus(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            size: u32,
            offset: u64,
            add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>,
        ) -> io::Result<()> {
            let mut translated = |d: DirEntry, e: Entry| add_entry(d, self.entry(e));
            self.inner.readdirplus(
                &self.ctx(ctx)?,
                inode,
                handle,
                size,
                offset,
                &mut translated,
            )
        }

        fn fsyncdir(
            &self,
            ctx: &Context,
            inode: u64,
            datasync: bool,
            handle: u64,
        ) -> io::Result<()> {
            self.inner
                .fsyncdir(&self.ctx(ctx)?, inode, datasync, handle)
        }

        fn releasedir(&self, ctx: &Context, inode: u64, flags: u32, handle: u64) -> io::Result<()> {
            self.inner
                .releasedir(&self.ctx_lenient(ctx), inode, flags, handle)
        }

        fn setupmapping(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            foffset: u64,
            len: u64,
            flags: u64,
            moffset: u64,
            vu_req: &mut dyn FsCacheReqHandler,
        ) -> io::Result<()> {
            self.inner.setupmapping(
                &self.ctx(ctx)?,
                inode,
                handle,
                foffset,
                len,
                flags,
                moffset,
                vu_req,
            )
        }

        fn removemapping(
            &self,
            ctx: &Context,
            inode: u64,
            requests: Vec<RemovemappingOne>,
            vu_req: &mut dyn FsCacheReqHandler,
        ) -> io::Result<()> {
            self.inner
                .removemapping(&self.ctx_lenient(ctx), inode, requests, vu_req)
        }

        fn access(&self, ctx: &Context, inode: u64, mask: u32) -> io::Result<()> {
            self.inner.access(&self.ctx(ctx)?, inode, mask)
        }

        fn lseek(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            offset: u64,
            whence: u32,
        ) -> io::Result<u64> {
            self.inner
                .lseek(&self.ctx(ctx)?, inode, handle, offset, whence)
        }

        fn getlk(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            owner: u64,
            lock: FileLock,
            flags: u32,
        ) -> io::Result<FileLock> {
            self.inner
                .getlk(&self.ctx(ctx)?, inode, handle, owner, lock, flags)
        }

        fn setlk(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            owner: u64,
            lock: FileLock,
            flags: u32,
        ) -> io::Result<()> {
            self.inner
                .setlk(&self.ctx(ctx)?, inode, handle, owner, lock, flags)
        }

        fn setlkw(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            owner: u64,
            lock: FileLock,
            flags: u32,
        ) -> io::Result<()> {
            self.inner
                .setlkw(&self.ctx(ctx)?, inode, handle, owner, lock, flags)
        }

        fn ioctl(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            flags: u32,
            cmd: u32,
            data: IoctlData,
            out_size: u32,
        ) -> io::Result<IoctlData<'_>> {
            self.inner
                .ioctl(&self.ctx(ctx)?, inode, handle, flags, cmd, data, out_size)
        }

        fn bmap(&self, ctx: &Context, inode: u64, block: u64, blocksize: u32) -> io::Result<u64> {
            self.inner.bmap(&self.ctx(ctx)?, inode, block, blocksize)
        }

        fn poll(
            &self,
            ctx: &Context,
            inode: u64,
            handle: u64,
            khandle: u64,
            flags: u32,
            events: u32,
        ) -> io::Result<u32> {
            self.inner
                .poll(&self.ctx(ctx)?, inode, handle, khandle, flags, events)
        }

        fn notify_reply(&self) -> io::Result<()> {
            self.inner.notify_reply()
        }

        fn id_remap(&self, ctx: &mut Context) -> io::Result<()> {
            self.inner.id_remap(ctx)
        }
    }

    impl<F: crate::metrics::FsStats> crate::metrics::FsStats for IdMapFs<F> {
        fn node_count(&self) -> usize {
            self.inner.node_count()
        }
        fn handle_count(&self) -> usize {
            self.inner.handle_count()
        }
    }

    impl<F: ExtraOps> ExtraOps for IdMapFs<F> {
        fn copy_file_range(
            &self,
            ctx: &Context,
            ino_in: u64,
            fh_in: u64,
            off_in: u64,
            ino_out: u64,
            fh_out: u64,
            off_out: u64,
            len: u64,
            flags: u64,
        ) -> io::Result<usize> {
            self.inner.copy_file_range(
                &self.ctx(ctx)?,
                ino_in,
                fh_in,
                off_in,
                ino_out,
                fh_out,
                off_out,
                len,
                flags,
            )
        }

        fn syncfs(&self, ctx: &Context, ino: u64) -> io::Result<()> {
            self.inner.syncfs(&self.ctx(ctx)?, ino)
        }
    }
}
