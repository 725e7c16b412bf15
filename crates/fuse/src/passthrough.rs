//! FUSE passthrough: which opens the kernel serves from a local backing file by itself.
//!
//! Core's passthrough.rs finds the file (a whole-object file of the disk cache holding
//! exactly the version the open pinned); this module applies the kernel's rules (Linux
//! 6.9+, fs/fuse/iomode.c) for one inode:
//! - while any open of an inode passes through, every new open of it must pass through to
//!   the same backing file: the kernel fails any other with EIO;
//! - a passthrough open fails (EIO) while the inode is open in the ordinary, cached mode.
//!
//! So per inode we count ordinary opens and hold at most one registered backing file:
//! - a read-only open whose pinned version is whole on disk passes through, unless ordinary
//!   opens of the inode are live (then it is an ordinary open, exactly as without);
//! - while passthrough opens are live, a read-only open of the same version reuses their
//!   backing file; an open for writing or truncating, or a read-only open that pinned
//!   another version (the object changed in the bucket), is refused with EBUSY: handing it
//!   the old version's file would break close-to-open (docs/SEMANTICS.md);
//! - the backing file is unregistered at the last release of the inode's passthrough opens.
//!
//! The kernel drops an open's mode when the file is released, before our RELEASE arrives,
//! so our counts are never below the kernel's: at worst we decline a passthrough the
//! kernel would have taken, never the reverse. Write and truncate opens are counted before
//! the core opens them, so no passthrough can start meanwhile and a refused open never
//! changes a file. Without the capability (flag off, an older kernel, not root, no disk
//! cache) every open is ordinary; the log says why once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bucketfs_core::passthrough::Backing;
use bucketfs_core::Fs;
use fuser::{BackingId, Errno, FileHandle, FopenFlags, InitFlags, KernelConfig, ReplyOpen};

/// How long an open that must otherwise be refused waits for the RELEASE of opens closed
/// just before it (it arrives within milliseconds of the close).
const RELEASE_WAIT: Duration = Duration::from_secs(1);
/// How long a read-only open that could pass through waits for ordinary opens closed just
/// before it (`cat f; cat f`): short, since an ordinary open still live is the common case.
const ORDINARY_WAIT: Duration = Duration::from_millis(10);

pub struct Passthrough {
    /// Asked for (`--passthrough on`).
    wanted: bool,
    /// Granted by the kernel and not turned off since.
    on: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    inodes: HashMap<u64, InodeIo>,
    /// Open handle -> (inode, passes through).
    handles: HashMap<u64, (u64, bool)>,
}

#[derive(Default)]
struct InodeIo {
    /// Ordinary (cached-mode) opens, plus write opens being opened.
    ordinary: u32,
    through: Option<Through>,
}

struct Through {
    id: BackingId,
    /// The version the backing file holds.
    identity: String,
    opens: u32,
    _backing: Backing,
}

impl Passthrough {
    pub fn new(wanted: bool) -> Self {
        Self { wanted, on: AtomicBool::new(false), state: Mutex::default() }
    }

    fn off(&self, fs: &Fs, why: &str) {
        if self.on.swap(false, Relaxed) || self.wanted {
            tracing::info!("passthrough off: {why}; every read goes through bucketfs");
        }
        fs.set_passthrough(false);
    }

    /// At INIT: ask for passthrough if wanted and possible; the log says why not.
    pub fn init(&self, fs: &Fs, config: &mut KernelConfig) {
        if !self.wanted {
            return tracing::info!("passthrough off (--passthrough off, the default)");
        }
        let why_not = if !config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH) {
            Some("the kernel does not offer FUSE passthrough (Linux 6.9 or later)")
        } else if unsafe { libc::geteuid() } != 0 {
            Some("registering backing files needs root (CAP_SYS_ADMIN)")
        } else if !fs.passthrough_possible() {
            Some("no disk cache (--disk-cache-mib 0)")
        // Depth 1: backing files on a plain file system, and this mount may itself be a
        // lower layer of an overlay.
        } else if config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_err()
            || config.set_max_stack_depth(1).is_err()
        {
            Some("the kernel refused the passthrough capability")
        } else {
            None
        };
        match why_not {
            Some(why) => self.off(fs, why),
            None => {
                self.on.store(true, Relaxed);
                fs.set_passthrough(true);
                tracing::info!("passthrough on: files whole in the disk cache are read by the kernel directly");
            }
        }
    }

    /// Before the core opens `ino`: `Err` to refuse the open; `Ok(true)` if it was counted
    /// as an ordinary open already (writing or truncating: undo with [`Self::open_failed`]
    /// if the core's open fails).
    pub async fn before_open(&self, ino: u64, changes: bool) -> Result<bool, Errno> {
        if !changes {
            return Ok(false);
        }
        // A reader that just closed is still counted until its RELEASE arrives.
        self.settle(ino, |io| io.through.is_none(), RELEASE_WAIT).await;
        let mut st = self.state.lock().unwrap();
        let io = st.inodes.entry(ino).or_default();
        if io.through.is_some() {
            tracing::info!(ino, "open for writing refused (EBUSY): the file is open for passthrough reads");
            return Err(Errno::EBUSY);
        }
        io.ordinary += 1;
        Ok(true)
    }

    /// Wait (up to `limit`) until `ok` holds for `ino`'s state (or it has none).
    async fn settle(&self, ino: u64, ok: impl Fn(&InodeIo) -> bool, limit: Duration) {
        let until = Instant::now() + limit;
        while self.state.lock().unwrap().inodes.get(&ino).is_some_and(|io| !ok(io)) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    pub fn open_failed(&self, ino: u64, counted: bool) {
        if counted {
            let mut st = self.state.lock().unwrap();
            Self::drop_ordinary(&mut st, ino);
        }
    }

    fn drop_ordinary(st: &mut State, ino: u64) {
        if let Some(io) = st.inodes.get_mut(&ino) {
            io.ordinary = io.ordinary.saturating_sub(1);
            if io.ordinary == 0 && io.through.is_none() {
                st.inodes.remove(&ino);
            }
        }
    }

    /// A new file from `create`: an ordinary open.
    pub fn created(&self, ino: u64, fh: u64) {
        let mut st = self.state.lock().unwrap();
        let io = st.inodes.entry(ino).or_default();
        if io.through.is_some() {
            tracing::warn!(ino, "create of a file open for passthrough reads: the kernel will refuse it");
        }
        io.ordinary += 1;
        st.handles.insert(fh, (ino, false));
    }

    /// Answer the core's successful open of `ino` as handle `fh`. `counted`: from
    /// [`Self::before_open`]; `flags`: the ordinary open's flags.
    pub async fn answer(&self, fs: &Arc<Fs>, ino: u64, fh: u64, counted: bool, flags: FopenFlags, reply: ReplyOpen) {
        if counted {
            self.state.lock().unwrap().handles.insert(fh, (ino, false));
            return reply.opened(FileHandle(fh), flags);
        }
        let eligible = self.on.load(Relaxed) && !flags.contains(FopenFlags::FOPEN_DIRECT_IO);
        let identity = if eligible { fs.passthrough_identity(fh) } else { None };
        let identity = identity.as_deref();
        if identity.is_some() {
            // Opens closed just before this one are still counted until their RELEASE
            // arrives (the kernel sends it after close returns): give them a moment.
            self.settle(ino, |io| io.ordinary == 0, ORDINARY_WAIT).await;
            self.settle(
                ino,
                |io| io.through.as_ref().is_none_or(|t| Some(t.identity.as_str()) == identity),
                RELEASE_WAIT,
            )
            .await;
        }
        {
            let mut st = self.state.lock().unwrap();
            match plan(st.inodes.get(&ino), identity) {
                Plan::Existing => return Self::through(fs, &mut st, ino, fh, reply),
                Plan::Ordinary => return Self::ordinary(&mut st, ino, fh, flags, reply),
                Plan::Refuse => {}
                Plan::New => {}
            }
        }
        // Find or build the backing file (file I/O; a second or so for a large one that is
        // built now) with no lock held; then decide again, as other opens may have come.
        let look = matches!(plan(self.state.lock().unwrap().inodes.get(&ino), identity), Plan::New);
        let backing = if look { Some(fs.backing_file(fh).await) } else { None };
        if let Some(reply) = self.finish(fs, ino, fh, flags, identity, backing, reply) {
            // Read-only and not truncating: closing it changes nothing.
            let _ = fs.release(fh).await;
            tracing::info!(ino, "open refused (EBUSY): the file is open for passthrough reads of another version");
            reply.error(Errno::EBUSY)
        }
    }

    /// The decision after looking for a backing file; the reply back if the open is to be
    /// refused.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        fs: &Fs,
        ino: u64,
        fh: u64,
        flags: FopenFlags,
        identity: Option<&str>,
        backing: Option<Result<Backing, &'static str>>,
        reply: ReplyOpen,
    ) -> Option<ReplyOpen> {
        let mut st = self.state.lock().unwrap();
        match (plan(st.inodes.get(&ino), identity), backing) {
            (Plan::Existing, _) => Self::through(fs, &mut st, ino, fh, reply),
            (Plan::Refuse, _) => return Some(reply),
            (Plan::New, Some(Ok(b))) if self.on.load(Relaxed) => match reply.open_backing(&b.file) {
                Ok(id) => {
                    let t = Through { id, identity: b.identity.clone(), opens: 0, _backing: b };
                    st.inodes.entry(ino).or_default().through = Some(t);
                    Self::through(fs, &mut st, ino, fh, reply)
                }
                Err(e) => {
                    self.off(fs, &format!("the kernel refused a backing file ({e})"));
                    Self::ordinary(&mut st, ino, fh, flags, reply)
                }
            },
            (_, backing) => {
                if let Some(Err(why)) = backing {
                    tracing::debug!(ino, "open not passed through: {why}");
                }
                Self::ordinary(&mut st, ino, fh, flags, reply)
            }
        }
        None
    }

    /// Answer with the inode's registered backing file.
    fn through(fs: &Fs, st: &mut State, ino: u64, fh: u64, reply: ReplyOpen) {
        let t = st.inodes.get_mut(&ino).and_then(|io| io.through.as_mut()).expect("planned");
        t.opens += 1;
        fs.note_passthrough_open();
        reply.opened_passthrough(FileHandle(fh), FopenFlags::FOPEN_PASSTHROUGH, &t.id);
        st.handles.insert(fh, (ino, true));
    }

    fn ordinary(st: &mut State, ino: u64, fh: u64, flags: FopenFlags, reply: ReplyOpen) {
        st.inodes.entry(ino).or_default().ordinary += 1;
        st.handles.insert(fh, (ino, false));
        reply.opened(FileHandle(fh), flags);
    }

    /// Handle `fh` was released: the last passthrough release of an inode unregisters its
    /// backing file.
    pub fn released(&self, fh: u64) {
        let mut st = self.state.lock().unwrap();
        let Some((ino, through)) = st.handles.remove(&fh) else { return };
        if !through {
            return Self::drop_ordinary(&mut st, ino);
        }
        let Some(io) = st.inodes.get_mut(&ino) else { return };
        if let Some(t) = io.through.as_mut() {
            t.opens = t.opens.saturating_sub(1);
            if t.opens == 0 {
                io.through = None; // unregisters it (BackingId's drop)
            }
        }
        if io.ordinary == 0 && io.through.is_none() {
            st.inodes.remove(&ino);
        }
    }
}

enum Plan {
    /// Pass through to the inode's registered backing file.
    Existing,
    Ordinary,
    /// The inode passes through to another version's file: refuse (EBUSY).
    Refuse,
    /// Register a backing file if one can be found.
    New,
}

/// What to do with a read-only open that pinned `identity` (`None`: not eligible) given
/// the state of its inode (see the module doc).
fn plan(io: Option<&InodeIo>, identity: Option<&str>) -> Plan {
    match io {
        Some(InodeIo { through: Some(t), .. }) if Some(t.identity.as_str()) == identity => Plan::Existing,
        Some(InodeIo { through: Some(_), .. }) => Plan::Refuse,
        Some(io) if io.ordinary > 0 => Plan::Ordinary,
        _ if identity.is_none() => Plan::Ordinary,
        _ => Plan::New,
    }
}
