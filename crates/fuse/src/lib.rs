//! The fuser adapter: translate a kernel request, call the core, reply. Nothing else.
//!
//! fuser runs several dispatch threads (`n_threads`); each request is handed to the tokio
//! runtime as its own task and answered from there, so a slow store call never holds a
//! FUSE thread, and no request waits behind another's network I/O.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use bucketfs_core::dir_cache::{cookie, uncookie};
use bucketfs_core::{Attr, DirEntry, Fs, FsError, Kind, SetAttr};
use fuser::{
    BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use tokio::runtime::Handle;

/// Largest read the kernel may send us, and its readahead: 1 MiB, fuser's upper bound
/// for a single request, so a sequential reader needs few round trips through FUSE.
const MAX_IO: u32 = 1024 * 1024;

pub struct FuseAdapter {
    fs: Arc<Fs>,
    rt: Handle,
    /// The kernel sends no opendir/releasedir; readdirs come without a handle and the
    /// kernel keeps directories' entries (core's dir_cache.rs).
    no_opendir: bool,
    /// The mount's device (major, minor), set once mounted; `None` if it was not found.
    device: Arc<std::sync::OnceLock<Option<(u32, u32)>>>,
    /// The session's notifier, set once the session exists (see `session`).
    notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
    /// Which opens the kernel serves from local files itself.
    pt: Arc<passthrough::Passthrough>,
}

/// Run `op` on the runtime and answer an empty reply with its result.
macro_rules! spawn_empty {
    ($self:ident, $reply:ident, |$fs:ident| $op:expr) => {{
        let $fs = $self.fs.clone();
        $self.rt.spawn(async move {
            match $op.await {
                Ok(()) => $reply.ok(),
                Err(e) => $reply.error(errno(&e)),
            }
        });
    }};
}

/// A lookup's answer. `NotFound` is a negative entry (node 0): the kernel caches "no such
/// name" for the TTL, so a build probing for missing headers asks us once per TTL, not per
/// try. A create through this mount replaces it at once.
fn reply_entry(reply: ReplyEntry, ttl: Duration, answer: Result<Attr, FsError>) {
    match answer {
        Ok(a) => reply.entry(&ttl, &file_attr(&a), Generation(0)),
        Err(FsError::NotFound) if !ttl.is_zero() => {
            let none = Attr {
                ino: 0,
                kind: Kind::File,
                size: 0,
                mtime: UNIX_EPOCH,
                ctime: UNIX_EPOCH,
                perm: 0,
                uid: 0,
                gid: 0,
                nlink: 0,
            };
            reply.entry(&ttl, &file_attr(&none), Generation(0))
        }
        Err(e) => reply.error(errno(&e)),
    }
}

impl FuseAdapter {
    pub fn new(
        fs: Arc<Fs>,
        rt: Handle,
        device: Arc<std::sync::OnceLock<Option<(u32, u32)>>>,
        passthrough: bool,
    ) -> Self {
        let pt = Arc::new(passthrough::Passthrough::new(passthrough));
        Self { fs, rt, no_opendir: false, device, notifier: Arc::default(), pt }
    }

    fn ttl(&self) -> Duration {
        self.fs.ttl()
    }
}

/// The kernel's errno for `e`. An EIO tells the user nothing, so what caused it is logged.
pub(crate) fn errno(e: &FsError) -> Errno {
    let n = e.errno();
    if n == libc::EIO {
        tracing::warn!("answering EIO: {e}");
    } else if e.store_unreachable() {
        tracing::warn!("answering ETIMEDOUT, the store did not answer: {e}; retry once it does (`bucketfs status`)");
    } else {
        tracing::debug!(errno = n, "answering an error: {e}");
    }
    Errno::from_i32(n)
}

/// Core attributes to the kernel's; blocks are counted in 512-byte units.
pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.mtime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.mtime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
    }
}

/// Answer a readdir of directory `dir` with `entries` (snapshot number `snap`, 0 for a
/// handle's own) from index `start` on; each entry's offset names the snapshot and the
/// next index (`cookie`). Where a full reply stops is told to the core.
fn fill_dir(fs: &Fs, dir: u64, (entries, snap): (&[DirEntry], u32), start: usize, mut reply: ReplyDirectory) {
    for (i, e) in entries.iter().enumerate().skip(start) {
        if reply.add(INodeNo(e.ino), cookie(snap, i + 1), file_type(e.kind), &e.name) {
            if let Some(last) = i.checked_sub(1).filter(|&l| l >= start) {
                fs.readdir_page_end(dir, snap, i, &entries[last].name);
            }
            break;
        }
    }
    reply.ok();
}

/// Before a reply without opendir that tells the kernel the directory ended: see
/// `Fs::readdir_ending`.
fn before_dir_end(fs: &Fs, dir: u64, entries: &[DirEntry], start: usize) {
    if start > 0 && start >= entries.len() {
        fs.readdir_ending(dir, entries);
    }
}

/// Answer a readdirplus of directory `dir` with `entries` from `offset` on, each with the
/// inode and attributes now under its name (a name gone since the snapshot is left out).
fn fill_dir_plus(
    fs: &Fs,
    dir: u64,
    (entries, snap): (&[DirEntry], u32),
    start: usize,
    ttl: Duration,
    mut reply: ReplyDirectoryPlus,
) {
    let mut given: Option<usize> = None;
    for (i, e) in entries.iter().enumerate().skip(start) {
        let Some(attr) = fs.entry_attr(dir, &e.name, e.ino) else { continue };
        if reply.add(INodeNo(attr.ino), cookie(snap, i + 1), &e.name, &ttl, &file_attr(&attr), Generation(0)) {
            if let Some(last) = given {
                fs.readdir_page_end(dir, snap, last + 1, &entries[last].name);
            }
            break;
        }
        given = Some(i);
        // The kernel holds a reference to every entry except `.` and `..`.
        if e.name != "." && e.name != ".." {
            fs.remember(attr.ino);
        }
    }
    reply.ok();
}

/// An open with `O_DIRECT`: served through us (direct I/O), never passed through. The
/// kernel's backing file would keep `O_DIRECT` after an `fcntl` cleared it, and hold its
/// reads and writes to the local disk's alignment (EINVAL for `dd bs=1000 iflag=direct`
/// once the file was whole in the disk cache; tester H), where bucketfs takes any.
fn o_direct(flags: i32) -> bool {
    flags & libc::O_DIRECT != 0
}

/// The permission bits a create, mknod or mkdir asks for, the umask applied.
fn perm_bits(mode: u32, umask: u32) -> u16 {
    (mode & !umask & 0o7777) as u16
}

fn name_str(name: &OsStr) -> Option<String> {
    name.to_str().map(str::to_string)
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // ATOMIC_O_TRUNC: O_TRUNC arrives with open, so truncation is staged and uploaded at
        // close with the new bytes; without it the kernel sends a separate truncate that
        // would publish an empty object to other readers first.
        let wanted = InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_CACHE_SYMLINKS;
        let have = config.capabilities();
        let _ = config.add_capabilities(wanted & have);
        if self.fs.dirs_without_opendir() && have.contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT) {
            self.no_opendir = config.add_capabilities(InitFlags::FUSE_NO_OPENDIR_SUPPORT).is_ok();
        }
        if let Err(max) = config.set_max_readahead(MAX_IO) {
            let _ = config.set_max_readahead(max);
        }
        if let Err(max) = config.set_max_write(MAX_IO) {
            let _ = config.set_max_write(max);
        }
        self.pt.init(&self.fs, config);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(name) = name_str(name) else { return reply.error(Errno::ENOENT) };
        let ttl = self.ttl();
        // Answered here when the namespace knows (no hand-over to the runtime's threads).
        if let Some(answer) = self.fs.lookup_now(parent.0, &name) {
            return reply_entry(reply, ttl, answer);
        }
        let fs = self.fs.clone();
        self.rt.spawn(async move { reply_entry(reply, ttl, fs.lookup(parent.0, &name).await) });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if let Some(answer) = self.fs.getattr_now(ino.0) {
            return match answer {
                Ok(a) => reply.attr(&self.ttl(), &file_attr(&a)),
                Err(e) => reply.error(errno(&e)),
            };
        }
        let (fs, ttl) = (self.fs.clone(), self.ttl());
        self.rt.spawn(async move {
            match fs.getattr(ino.0).await {
                Ok(a) => reply.attr(&ttl, &file_attr(&a)),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY;
        let truncate = flags.0 & libc::O_TRUNC != 0;
        let o_direct = o_direct(flags.0);
        let (fs, pt) = (self.fs.clone(), self.pt.clone());
        let device = self.device.get().copied().flatten();
        let notifier = self.notifier.clone();
        self.rt.spawn(async move {
            // The kernel checks ETXTBSY for this one only after our open (running.rs).
            if let (true, false, Some(dev)) = (truncate, write, device) {
                let running = tokio::task::spawn_blocking(move || running::is_running(dev, ino.0));
                let running = running.await.unwrap_or(false);
                tracing::debug!(ino = ino.0, running, "open(O_RDONLY|O_TRUNC)");
                if running {
                    return reply.error(Errno::ETXTBSY);
                }
            }
            let change = match pt.before_open(&fs, ino.0, write || truncate).await {
                Ok(change) => change,
                Err(e) => return reply.error(e),
            };
            match fs.open(ino.0, write, truncate).await {
                Ok(fh) => {
                    // Drop the kernel's attributes of `ino` (an offset below 0: no pages).
                    let drop_attrs = || {
                        if let Some(Err(e)) = notifier.get().map(|n| n.inval_inode(ino, -1, 0)) {
                            tracing::debug!(ino = ino.0, "dropping the kernel's attributes: {e}");
                        }
                    };
                    let keep = fs.keep_cache(fh);
                    let mut flags = if keep { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::empty() };
                    let direct = fs.direct_io(fh);
                    if direct || o_direct {
                        flags |= FopenFlags::FOPEN_DIRECT_IO; // through us (`o_direct`)
                    }
                    if !direct && !keep {
                        // Perhaps a version the kernel has not seen: its size may still be an
                        // older version's, which ends its reads there (a new version read
                        // short, silently). Before the answer, so the first read past that
                        // size asks for the attributes again.
                        drop_attrs();
                    }
                    pt.answer(&fs, ino.0, fh, change, flags, reply).await;
                    if direct {
                        // The open learnt the real size; drop the placeholder the kernel holds.
                        drop_attrs();
                    }
                }
                Err(e) => {
                    pt.end_change(&fs, ino.0, change).await;
                    reply.error(errno(&e))
                }
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let fs = self.fs.clone();
        self.rt.spawn(async move {
            match fs.read(fh.0, offset, size).await {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.pt.released(fh.0);
        spawn_empty!(self, reply, |fs| fs.release(fh.0))
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let (fs, data) = (self.fs.clone(), data.to_vec());
        self.rt.spawn(async move {
            match fs.write(fh.0, offset, &data).await {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        spawn_empty!(self, reply, |fs| fs.flush(fh.0))
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        spawn_empty!(self, reply, |fs| fs.fsync(fh.0))
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        spawn_empty!(self, reply, |fs| fs.fsync_dir())
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let Some(name) = name_str(name) else { return reply.error(Errno::EINVAL) };
        let (fs, ttl, pt) = (self.fs.clone(), self.ttl(), self.pt.clone());
        self.rt.spawn(async move {
            let perm = Some(perm_bits(mode, umask));
            match fs.create(parent.0, &name, flags, perm).await {
                Ok((a, fh)) => {
                    let created = passthrough::Created { reply, ttl, attr: file_attr(&a) };
                    let flags = match o_direct(flags) {
                        true => FopenFlags::FOPEN_DIRECT_IO, // as in `open`
                        false => FopenFlags::empty(),
                    };
                    pt.answer(&fs, a.ino, fh, Default::default(), flags, created).await
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// A regular file only (GNU tar makes files this way with `--xattrs`): an empty file,
    /// created exclusively and closed at once. Devices, FIFOs and sockets cannot be objects.
    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG || rdev != 0 {
            return reply.error(Errno::ENOSYS);
        }
        let Some(name) = name_str(name) else { return reply.error(Errno::EINVAL) };
        let (fs, ttl) = (self.fs.clone(), self.ttl());
        self.rt.spawn(async move {
            let perm = Some(perm_bits(mode, umask));
            let made = async {
                let (a, fh) = fs.create(parent.0, &name, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, perm).await?;
                fs.release(fh).await?;
                Ok::<_, bucketfs_core::FsError>(fs.cached_attr(a.ino).unwrap_or(a))
            };
            match made.await {
                Ok(a) => reply.entry(&ttl, &file_attr(&a), Generation(0)),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let Some(name) = name_str(name) else { return reply.error(Errno::EINVAL) };
        let (fs, ttl) = (self.fs.clone(), self.ttl());
        self.rt.spawn(async move {
            match fs.mkdir(parent.0, &name, Some(perm_bits(mode, umask))).await {
                Ok(a) => reply.entry(&ttl, &file_attr(&a), Generation(0)),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn symlink(&self, _req: &Request, parent: INodeNo, link_name: &OsStr, target: &std::path::Path, reply: ReplyEntry) {
        let Some(name) = name_str(link_name) else { return reply.error(Errno::EINVAL) };
        let Some(target) = target.to_str().map(str::to_string) else { return reply.error(Errno::EINVAL) };
        let (fs, ttl) = (self.fs.clone(), self.ttl());
        self.rt.spawn(async move {
            match fs.symlink(parent.0, &name, &target).await {
                Ok(a) => reply.entry(&ttl, &file_attr(&a), Generation(0)),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let fs = self.fs.clone();
        self.rt.spawn(async move {
            match fs.readlink(ino.0).await {
                Ok(target) => reply.data(&target),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let Some(name) = name_str(name) else { return reply.error(Errno::ENOENT) };
        if let Some(done) = self.fs.unlink_now(parent.0, &name) {
            return match done {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            };
        }
        spawn_empty!(self, reply, |fs| fs.unlink(parent.0, &name))
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let Some(name) = name_str(name) else { return reply.error(Errno::ENOENT) };
        spawn_empty!(self, reply, |fs| fs.rmdir(parent.0, &name))
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (Some(name), Some(newname)) = (name_str(name), name_str(newname)) else {
            return reply.error(Errno::EINVAL);
        };
        if flags.bits() & !RenameFlags::RENAME_NOREPLACE.bits() != 0 {
            // RENAME_EXCHANGE: an atomic swap is impossible on a bucket. RENAME_WHITEOUT
            // (overlayfs) would leave a whiteout device, which a bucket cannot hold: a plain
            // rename reported success without it.
            return reply.error(Errno::EINVAL);
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        spawn_empty!(self, reply, |fs| fs.rename(parent.0, &name, newparent.0, &newname, noreplace))
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mtime = mtime.map(|t| match t {
            // fuser misreads a time before 1970 with a fraction (fuser_time.rs).
            TimeOrNow::SpecificTime(t) => fuser_time::fuser_time_fixed(t),
            TimeOrNow::Now => std::time::SystemTime::now(),
        });
        let (fs, ttl, pt) = (self.fs.clone(), self.ttl(), self.pt.clone());
        self.rt.spawn(async move {
            // A truncate changes the bytes: prepared as an open for writing is, while readers
            // pass through to a cached version (they see the new end, as a writer's bytes).
            let prepared = match pt.before_open(&fs, ino.0, size.is_some()).await {
                Ok(change) => change,
                Err(e) => return reply.error(e),
            };
            let change = SetAttr { size, mode, uid, gid, mtime, fh: fh.map(|f| f.0) };
            let result = fs.setattr(ino.0, change).await;
            pt.end_change(&fs, ino.0, prepared).await;
            match result {
                Ok(a) => reply.attr(&ttl, &file_attr(&a)),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn destroy(&mut self) {
        // Unmount: every staged change goes up before the process exits.
        let failed = self.rt.block_on(self.fs.sync_all());
        self.fs.stop_uploads();
        if !failed.is_empty() {
            tracing::error!(files = ?failed, "unmounted with uploads still failing; data kept in the staging directory");
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_opendir {
            // Tells the kernel to open directories without us from now on.
            return reply.error(Errno::ENOSYS);
        }
        let fs = self.fs.clone();
        self.rt.spawn(async move {
            match fs.opendir(ino.0).await {
                Ok(fh) => {
                    // The kernel caches the entries it reads; it keeps an earlier open's
                    // cache only while our snapshot is unchanged (core's dir_cache.rs).
                    // None where that cache would end on a page edge (`dir_cacheable`).
                    let mut flags = FopenFlags::empty();
                    if fs.dir_cacheable(fh) {
                        flags |= FopenFlags::FOPEN_CACHE_DIR;
                    }
                    if fs.keep_cache(fh) {
                        flags |= FopenFlags::FOPEN_KEEP_CACHE;
                    }
                    reply.opened(FileHandle(fh), flags)
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        if self.no_opendir && fh.0 == 0 {
            let fs = self.fs.clone();
            self.rt.spawn(async move {
                match fs.readdir_page(ino.0, offset).await {
                    Ok((entries, snap, start)) => {
                        before_dir_end(&fs, ino.0, &entries, start);
                        fill_dir(&fs, ino.0, (&entries, snap), start, reply);
                    }
                    Err(e) => reply.error(errno(&e)),
                }
            });
            return;
        }
        match self.fs.readdir_numbered(fh.0) {
            Ok((entries, snap)) => fill_dir(&self.fs, ino.0, (&entries, snap), uncookie(offset).1, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectoryPlus) {
        if self.no_opendir && fh.0 == 0 {
            let (fs, ttl) = (self.fs.clone(), self.ttl());
            self.rt.spawn(async move {
                match fs.readdir_page(ino.0, offset).await {
                    Ok((entries, snap, start)) => {
                        before_dir_end(&fs, ino.0, &entries, start);
                        fill_dir_plus(&fs, ino.0, (&entries, snap), start, ttl, reply);
                    }
                    Err(e) => reply.error(errno(&e)),
                }
            });
            return;
        }
        match self.fs.readdir_numbered(fh.0) {
            Ok((entries, snap)) => {
                fill_dir_plus(&self.fs, ino.0, (&entries, snap), uncookie(offset).1, self.ttl(), reply)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        reply.statfs(s.blocks, s.bfree, s.bfree, s.files, s.ffree, s.bsize, s.namelen, s.bsize);
    }

    /// No ioctls: ENOTTY, as a regular file answers a terminal's (`isatty`, which many
    /// programs call on every file they open), without fuser's warning in the log for each.
    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in: &[u8],
        _out: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    // No extended attributes: ENOSYS, after which the kernel stops asking (callers get
    // EOPNOTSUPP), without fuser's warning in the log. The kernel asks for
    // `security.capability` at a file's first write; that warning, written to a log file
    // whose last page was not in memory, cost the first write after a mount 1.5 ms.

    fn getxattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    #[allow(clippy::too_many_arguments)]
    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS);
    }
}

/// How to mount: the options a user controls.
pub struct MountSpec {
    /// Shown as the source in the mount table; never contains credentials.
    pub fsname: String,
    pub allow_other: bool,
    /// Root may use the mount too (allow_root); ignored with `allow_other`.
    pub allow_root: bool,
    /// fusermount3 unmounts when the process dies (needs `allow_other` or `allow_root`).
    pub auto_unmount: bool,
    pub threads: usize,
    /// Writes fail with EROFS.
    pub read_only: bool,
    /// Let the kernel read files whole in the disk cache directly (FUSE passthrough),
    /// where the kernel and privileges allow.
    pub passthrough: bool,
}

mod fuser_time;
mod passthrough;
mod readahead;
mod running;

pub use fuser::{Session, SessionUnmounter};
pub use readahead::set_read_ahead;

/// Mount `fs` on `mountpoint`; the session is not serving until [`Session::run`].
pub fn mount(
    fs: Arc<Fs>,
    rt: Handle,
    mountpoint: &std::path::Path,
    spec: &MountSpec,
) -> std::io::Result<Session<FuseAdapter>> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(spec.fsname.clone()),
        fuser::MountOption::Subtype("bucketfs".into()),
        if spec.read_only { fuser::MountOption::RO } else { fuser::MountOption::RW },
        fuser::MountOption::NoAtime,
        fuser::MountOption::NoDev,
        fuser::MountOption::NoSuid,
        fuser::MountOption::DefaultPermissions,
    ];
    if spec.allow_other {
        config.acl = fuser::SessionACL::All;
    } else if spec.allow_root {
        config.acl = fuser::SessionACL::RootAndOwner;
    }
    if spec.auto_unmount {
        config.mount_options.push(fuser::MountOption::AutoUnmount);
    }
    config.n_threads = Some(spec.threads.max(1));
    config.clone_fd = true;
    // The session's notifier exists only once the session does, and the session answers
    // the kernel's INIT (which must know whether directories go without opendir) as it
    // is made: so the invalidator is handed over first and the notifier put in it after.
    let notifier: Arc<std::sync::OnceLock<fuser::Notifier>> = Arc::default();
    let slot = notifier.clone();
    fs.cache_dirs_without_opendir(Arc::new(move |ino| {
        // ENOENT: the kernel no longer holds the directory, nor its cache.
        if let Some(Err(e)) = slot.get().map(|n| n.inval_inode(INodeNo(ino), 0, 0)) {
            tracing::debug!(ino, "dropping the kernel's cache of a directory: {e}");
        }
    }));
    // Store events (`--notify`): a changed name's dentry goes (the core calls this from a
    // blocking thread).
    let slot = notifier.clone();
    fs.on_entry_change(Arc::new(move |parent, name| {
        if let Some(Err(e)) = slot.get().map(|n| n.inval_entry(INodeNo(parent), std::ffi::OsStr::new(name))) {
            tracing::debug!(parent, "dropping the kernel's entry of a changed name: {e}");
        }
    }));
    let device: Arc<std::sync::OnceLock<Option<(u32, u32)>>> = Arc::default();
    let adapter =
        FuseAdapter { notifier: notifier.clone(), ..FuseAdapter::new(fs, rt, device.clone(), spec.passthrough) };
    let session = fuser::Session::new(adapter, mountpoint, &config)?;
    let _ = notifier.set(session.notifier());
    let dev = running::mount_device(mountpoint);
    if dev.is_none() {
        tracing::warn!(
            "{} not found in /proc/self/mountinfo: open(O_RDONLY|O_TRUNC) cannot tell a running program",
            mountpoint.display()
        );
    }
    let _ = device.set(dev);
    Ok(session)
}
