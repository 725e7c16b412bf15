//! FUSE passthrough: which opens the kernel serves from a local backing file by itself.
//!
//! Core's passthrough.rs finds the file: a staged inode's staged file (written and read by
//! the kernel directly), or a whole-object file of the disk cache holding exactly the
//! version a read-only open pinned. This module applies the kernel's rules (Linux 6.9+,
//! fs/fuse/iomode.c) for one inode:
//! - while any open of an inode passes through, every new open of it must pass through to
//!   the same backing file or be a direct-I/O open (no page cache): the kernel fails any
//!   other with EIO;
//! - a passthrough open fails while the inode is open in the ordinary, cached mode.
//!
//! So per inode we count ordinary opens and hold at most one registered backing file:
//! - an open whose file is available (staged, or a read of a version whole on disk) passes
//!   through, unless ordinary opens of the inode are live (then it is an ordinary open,
//!   exactly as without passthrough);
//! - a direct-I/O open (`O_DIRECT`, a size not known yet) is answered as it is (no page
//!   cache, so no mode in the kernel), unless passthrough opens of the inode are live: the
//!   kernel then takes only another passthrough open, so it shares their file;
//! - while passthrough opens are live, an open that would use the same file shares it (every
//!   open of a staged inode uses its staged file);
//! - an open for writing (or a truncate) while readers pass through to a cached version
//!   stages the file from that very cache file (core's `adopt_whole`: the file moves from the
//!   cache to the staging area), and the backing file, the same file, is the staged one from
//!   then on: the writer passes through to it and the readers see the writes. This happens
//!   before the core opens the file for the writer, through a handle of our own kept until
//!   the writer's open is answered. If it cannot (the object changed in the bucket since the
//!   readers opened it), the open is refused with EBUSY before anything changed;
//! - any other open is refused with EBUSY: a read of a version the object changed to (handing
//!   it the old version's file would break close-to-open);
//! - the backing file is unregistered at the last release of the inode's passthrough opens.
//!
//! The kernel drops an open's mode when the file is released, before our RELEASE arrives,
//! so our counts are never below the kernel's: at worst we decline a passthrough the
//! kernel would have taken, never the reverse. Without the capability (flag off, an older
//! kernel, not root) every open is ordinary; the log says why once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bucketfs_core::passthrough::{is_staged_identity, Backing};
use bucketfs_core::{Fs, FsError};
use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FopenFlags, Generation, InitFlags, KernelConfig, ReplyCreate, ReplyOpen,
};

/// How long an open that would otherwise be opened direct waits for the RELEASE of opens
/// closed just before it (it arrives within milliseconds of the close).
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
    /// Open handle -> (inode, how it was opened).
    handles: HashMap<u64, (u64, Mode)>,
    /// Handles being answered whose file's closed version found no room to be copied
    /// aside: refused with `ENOSPC`, not `EBUSY`.
    no_room: std::collections::HashSet<u64>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// The kernel's page cache, through us.
    Ordinary,
    /// The registered backing file.
    Through,
    /// Direct I/O through us (`FOPEN_DIRECT_IO`): no page cache, so no mode in the
    /// kernel's count either; passthrough opens of the inode may come beside it.
    Direct,
}

#[derive(Default)]
struct InodeIo {
    /// Ordinary (cached-mode) opens.
    ordinary: u32,
    /// Opens for writing between [`Passthrough::before_open`] and their answer: no cached
    /// version may be registered meanwhile (they will use the staged file).
    writers_opening: u32,
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
            return tracing::info!("passthrough off (--passthrough off)");
        }
        let why_not = if !config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH) {
            Some("the kernel does not offer FUSE passthrough (Linux 6.9 or later)")
        } else if unsafe { libc::geteuid() } != 0 {
            Some("registering backing files needs root (CAP_SYS_ADMIN)")
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
                let cached = if fs.passthrough_possible() { " and files whole in the disk cache" } else { "" };
                tracing::info!("passthrough on: staged files{cached} are read and written by the kernel directly");
            }
        }
    }

    /// Before the core opens `ino` for writing or truncating (`changes`), or truncates it:
    /// while readers pass through to a cached version, stage the file from it (see the module
    /// doc), or refuse (`Err`) if that cannot be done: the kernel allows one backing file per
    /// inode, and the writer's is its staged file. The change is then counted as a writer
    /// opening; [`Self::end_change`] ends it (called by [`Self::answer`]).
    pub async fn before_open(&self, fs: &Fs, ino: u64, changes: bool) -> Result<Change, Errno> {
        if !changes || !self.on.load(Relaxed) {
            return Ok(Change::default());
        }
        let cached = |io: &InodeIo| io.through.as_ref().is_some_and(|t| !is_staged_identity(&t.identity));
        // A reader that just closed is still counted until its RELEASE arrives.
        self.settle(ino, |io| !cached(io), RELEASE_WAIT).await;
        let busy = self.state.lock().unwrap().inodes.get(&ino).is_some_and(cached);
        let reserved = if busy { Some(self.adopt(fs, ino).await?) } else { None };
        self.state.lock().unwrap().inodes.entry(ino).or_default().writers_opening += 1;
        Ok(Change { counted: true, reserved })
    }

    /// Readers pass through to a cached version of `ino` and a writer comes: open it for
    /// writing ourselves, which stages it from that cache file, and relabel the backing file
    /// as the staged one. The handle (returned) keeps the staged file until the writer's open
    /// is answered. Refused (EBUSY, nothing changed) if the staged file is another file.
    async fn adopt(&self, fs: &Fs, ino: u64) -> Result<u64, Errno> {
        let fh = fs.open(ino, true, false).await.map_err(|e| crate::errno(&e))?;
        if self.relabel(fs, ino, fh).await {
            return Ok(fh);
        }
        let _ = fs.release_quietly(fh).await;
        tracing::info!(
            ino,
            "open for writing refused (EBUSY): the file is open for passthrough reads of another version"
        );
        Err(Errno::EBUSY)
    }

    /// If `ino` passes through to a file labelled otherwise than `fh`'s backing file but
    /// that is the same file (a staged file took the cached one over; a renamed object's
    /// cached file followed it), label it as `fh`'s from now on, so `fh` shares it. `false`
    /// if it passes through to another file.
    async fn relabel(&self, fs: &Fs, ino: u64, fh: u64) -> bool {
        let Ok(b) = fs.backing_file(fh).await else { return false };
        let mut st = self.state.lock().unwrap();
        match st.inodes.get_mut(&ino).and_then(|io| io.through.as_mut()) {
            None => true, // the readers closed meanwhile
            Some(t) if t.identity == b.identity => true,
            Some(t) if same_file(&t._backing.file, &b.file) => {
                tracing::debug!(ino, from = %t.identity, to = %b.identity, "backing file relabelled");
                (t.identity, t._backing) = (b.identity.clone(), b);
                true
            }
            Some(_) => false,
        }
    }

    /// The open (or truncate) prepared by [`Self::before_open`] is answered, failed or done.
    pub async fn end_change(&self, fs: &Fs, ino: u64, change: Change) {
        if let Some(fh) = change.reserved {
            let _ = fs.release_quietly(fh).await;
        }
        if !change.counted {
            return;
        }
        let mut st = self.state.lock().unwrap();
        if let Some(io) = st.inodes.get_mut(&ino) {
            io.writers_opening = io.writers_opening.saturating_sub(1);
        }
        Self::forget_idle(&mut st, ino);
    }

    fn forget_idle(st: &mut State, ino: u64) {
        if st.inodes.get(&ino).is_some_and(|io| io.ordinary == 0 && io.writers_opening == 0 && io.through.is_none()) {
            st.inodes.remove(&ino);
        }
    }

    /// Wait (up to `limit`) until `ok` holds for `ino`'s state (or it has none).
    async fn settle(&self, ino: u64, ok: impl Fn(&InodeIo) -> bool, limit: Duration) {
        let until = Instant::now() + limit;
        while self.state.lock().unwrap().inodes.get(&ino).is_some_and(|io| !ok(io)) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    fn drop_ordinary(st: &mut State, ino: u64) {
        if let Some(io) = st.inodes.get_mut(&ino) {
            io.ordinary = io.ordinary.saturating_sub(1);
        }
        Self::forget_idle(st, ino);
    }

    /// Answer the core's successful open (or create) of `ino` as handle `fh`; `change`:
    /// from [`Self::before_open`]; `flags`: the ordinary open's flags.
    pub async fn answer(
        &self,
        fs: &Arc<Fs>,
        ino: u64,
        fh: u64,
        change: Change,
        flags: FopenFlags,
        reply: impl OpenReply,
    ) {
        let reply = self.answer_inner(fs, ino, fh, flags, reply).await;
        let no_room = self.state.lock().unwrap().no_room.remove(&fh);
        self.end_change(fs, ino, change).await;
        if let Some(reply) = reply {
            if no_room {
                // Handles passing through the file: this one may not go through us beside
                // them, nor through the kernel with the closed version not kept.
                tracing::info!(ino, "open refused (ENOSPC): no room on the staging disk to keep the closed version");
                reply.error(Errno::ENOSPC);
            } else {
                tracing::info!(ino, "open refused (EBUSY): the file is open for passthrough reads of another version");
                reply.error(Errno::EBUSY);
            }
            // Not truncating, or checked by `before_open`: closing it changes nothing. After
            // the answer: a release may wait for an upload in flight, the open must not.
            let _ = fs.release_unanswered(fh).await;
        }
    }

    /// The answer; the reply back if the open is to be refused.
    async fn answer_inner<R: OpenReply>(
        &self,
        fs: &Arc<Fs>,
        ino: u64,
        fh: u64,
        flags: FopenFlags,
        mut reply: R,
    ) -> Option<R> {
        let mut flags = flags;
        if flags.contains(FopenFlags::FOPEN_DIRECT_IO) {
            let mut st = self.state.lock().unwrap();
            if st.inodes.get(&ino).is_none_or(|io| io.through.is_none()) {
                st.handles.insert(fh, (ino, Mode::Direct));
                reply.opened(fh, flags);
                return None;
            }
            // The kernel takes no open of an inode beside its passthrough ones but another
            // passthrough one: this one shares their file (its I/O then keeps the local
            // disk's O_DIRECT alignment). It was refused with EBUSY (tester H).
            flags.remove(FopenFlags::FOPEN_DIRECT_IO);
        }
        let eligible = self.on.load(Relaxed);
        // Once more if refused: the file may have changed hands meanwhile (a reader whose
        // backing file was being found when a writer staged the file joins the staged file;
        // the other file's last opens may be on their way out).
        for _ in 0..2 {
            let identity = if eligible { fs.passthrough_identity(fh).await } else { None };
            reply = self.try_answer(fs, ino, fh, flags, identity.as_deref(), reply).await?;
        }
        Some(reply)
    }

    /// One try of [`Self::answer_inner`] with `fh`'s file as `identity` says.
    async fn try_answer<R: OpenReply>(
        &self,
        fs: &Arc<Fs>,
        ino: u64,
        fh: u64,
        flags: FopenFlags,
        identity: Option<&str>,
        reply: R,
    ) -> Option<R> {
        let other = |io: &InodeIo| io.through.as_ref().is_some_and(|t| Some(t.identity.as_str()) != identity);
        if identity.is_some() && self.state.lock().unwrap().inodes.get(&ino).is_some_and(other) {
            // Perhaps the same file by another name: staged without `before_open` (a create
            // of a name that exists after all), or renamed.
            self.relabel(fs, ino, fh).await;
        }
        if identity.is_some() {
            // Opens closed just before this one are still counted until their RELEASE
            // arrives (the kernel sends it after close returns): give them a moment.
            self.settle(ino, |io| io.ordinary == 0, ORDINARY_WAIT).await;
            self.settle(ino, |io| !other(io), RELEASE_WAIT).await;
        }
        // A writer's bytes land unseen from now on: the version a close returned for, not
        // uploaded yet, is copied aside first. If it cannot be (the staging disk full), the
        // writer's bytes come through us instead, which keep that version at the first
        // write that changes it, or fail that write (`ENOSPC`): an ordinary open, where no
        // reader passes through (was EBUSY).
        let identity = match identity {
            Some(id) => match fs.keep_committed_for(fh).await {
                Ok(()) => Some(id),
                Err(e) => {
                    if matches!(e, FsError::NoSpace(_)) {
                        self.state.lock().unwrap().no_room.insert(fh);
                    }
                    None
                }
            },
            None => None,
        };
        {
            let mut st = self.state.lock().unwrap();
            match plan(st.inodes.get(&ino), identity) {
                Plan::Existing => return Self::through(fs, &mut st, ino, fh, reply),
                Plan::Ordinary => return Self::ordinary(&mut st, ino, fh, flags, reply),
                Plan::Refuse => return Some(reply),
                Plan::New => {}
            }
        }
        // Find or build the backing file (file I/O; a second or so for a large cached one
        // built now) with no lock held; then decide again, as other opens may have come.
        let backing = Some(fs.backing_file(fh).await);
        self.finish(fs, ino, fh, flags, identity, backing, reply)
    }

    /// The decision after looking for a backing file; the reply back if the open is to be
    /// refused.
    #[allow(clippy::too_many_arguments)]
    fn finish<R: OpenReply>(
        &self,
        fs: &Fs,
        ino: u64,
        fh: u64,
        flags: FopenFlags,
        identity: Option<&str>,
        backing: Option<Result<Backing, &'static str>>,
        reply: R,
    ) -> Option<R> {
        let mut st = self.state.lock().unwrap();
        match (plan(st.inodes.get(&ino), identity), backing) {
            (Plan::Existing, _) => Self::through(fs, &mut st, ino, fh, reply),
            (Plan::Refuse, _) => Some(reply),
            (Plan::New, Some(Ok(b))) if self.on.load(Relaxed) => match reply.open_backing(&b.file) {
                Ok(id) => {
                    tracing::debug!(ino, identity = %b.identity, "backing file registered");
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
    }

    /// Answer with the inode's registered backing file (`None`: nothing left to refuse).
    fn through<R: OpenReply>(fs: &Fs, st: &mut State, ino: u64, fh: u64, reply: R) -> Option<R> {
        let t = st.inodes.get_mut(&ino).and_then(|io| io.through.as_mut()).expect("planned");
        t.opens += 1;
        fs.note_passthrough_open(fh);
        reply.through(fh, &t.id);
        st.handles.insert(fh, (ino, Mode::Through));
        None
    }

    fn ordinary<R: OpenReply>(st: &mut State, ino: u64, fh: u64, flags: FopenFlags, reply: R) -> Option<R> {
        st.inodes.entry(ino).or_default().ordinary += 1;
        st.handles.insert(fh, (ino, Mode::Ordinary));
        reply.opened(fh, flags);
        None
    }

    /// Handle `fh` was released: the last passthrough release of an inode unregisters its
    /// backing file.
    pub fn released(&self, fh: u64) {
        let mut st = self.state.lock().unwrap();
        let Some((ino, mode)) = st.handles.remove(&fh) else { return };
        match mode {
            Mode::Ordinary => return Self::drop_ordinary(&mut st, ino),
            Mode::Direct => return,
            Mode::Through => {}
        }
        let Some(io) = st.inodes.get_mut(&ino) else { return };
        if let Some(t) = io.through.as_mut() {
            t.opens = t.opens.saturating_sub(1);
            if t.opens == 0 {
                io.through = None; // unregisters it (BackingId's drop)
            }
        }
        Self::forget_idle(&mut st, ino);
    }
}

/// What [`Passthrough::before_open`] set up for one change, for [`Passthrough::end_change`].
#[derive(Default)]
pub struct Change {
    /// Counted as a writer opening.
    counted: bool,
    /// Our own handle keeping the staged file taken over from a cached version.
    reserved: Option<u64>,
}

/// Whether two open files are the same file on disk.
fn same_file(a: &std::fs::File, b: &std::fs::File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

enum Plan {
    /// Pass through to the inode's registered backing file.
    Existing,
    Ordinary,
    /// The inode passes through to another file: refuse (EBUSY).
    Refuse,
    /// Register a backing file if one can be found.
    New,
}

/// What to do with an open whose file is `identity` (`None`: not eligible) given the state
/// of its inode (see the module doc).
fn plan(io: Option<&InodeIo>, identity: Option<&str>) -> Plan {
    match io {
        Some(InodeIo { through: Some(t), .. }) if Some(t.identity.as_str()) == identity => Plan::Existing,
        Some(InodeIo { through: Some(_), .. }) => Plan::Refuse,
        Some(io) if io.ordinary > 0 => Plan::Ordinary,
        _ if identity.is_none() => Plan::Ordinary,
        // A writer about to use its staged file: no cached version meanwhile.
        Some(io) if io.writers_opening > 0 && !identity.is_some_and(is_staged_identity) => Plan::Ordinary,
        _ => Plan::New,
    }
}

/// The two replies that open a file: `open`'s and `create`'s.
pub trait OpenReply {
    fn open_backing(&self, file: &std::fs::File) -> std::io::Result<BackingId>;
    fn opened(self, fh: u64, flags: FopenFlags);
    fn through(self, fh: u64, id: &BackingId);
    fn error(self, e: Errno);
}

impl OpenReply for ReplyOpen {
    fn open_backing(&self, file: &std::fs::File) -> std::io::Result<BackingId> {
        ReplyOpen::open_backing(self, file)
    }
    fn opened(self, fh: u64, flags: FopenFlags) {
        ReplyOpen::opened(self, FileHandle(fh), flags)
    }
    fn through(self, fh: u64, id: &BackingId) {
        self.opened_passthrough(FileHandle(fh), FopenFlags::FOPEN_PASSTHROUGH, id)
    }
    fn error(self, e: Errno) {
        ReplyOpen::error(self, e)
    }
}

/// `create`'s reply with the new entry it carries.
pub struct Created {
    pub reply: ReplyCreate,
    pub ttl: Duration,
    pub attr: FileAttr,
}

impl OpenReply for Created {
    fn open_backing(&self, file: &std::fs::File) -> std::io::Result<BackingId> {
        self.reply.open_backing(file)
    }
    fn opened(self, fh: u64, flags: FopenFlags) {
        self.reply.created(&self.ttl, &self.attr, Generation(0), FileHandle(fh), flags)
    }
    fn through(self, fh: u64, id: &BackingId) {
        let flags = FopenFlags::FOPEN_PASSTHROUGH;
        self.reply.created_passthrough(&self.ttl, &self.attr, Generation(0), FileHandle(fh), flags, id)
    }
    fn error(self, e: Errno) {
        self.reply.error(e)
    }
}
