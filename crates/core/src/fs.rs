//! The filesystem operations, in kernel terms but free of FUSE types.
//!
//! Directories are key prefixes. A directory is listed with one delimited LIST sequence
//! (the store pages it), never a HEAD per entry, and the result is kept as the directory's
//! listing for `metadata_ttl`: lookups in a freshly listed directory, positive or negative,
//! cost no request. A lookup in a directory with no fresh listing lists the directory again
//! if it is small (one page), else asks about the name with one LIST of the plain prefix
//! (object stores) or several requests at once (HEAD `k`, HEAD `k/`, LIST `k/`); a directory
//! wins over a file of the same name. File attributes older than the TTL are revalidated the
//! same way: a new listing of a small directory, else a HEAD (see `Fs::find_child`).
//!
//! Locking: the one order is written in docs/ARCHITECTURE.md ("Locking"); the comment at
//! each field below gives its level there. In short, outermost first:
//! 1. intents (`intents.rs`: the keys an upload, unlink or rename changes; held across
//!    awaits, only overlapping ones wait);
//! 2. a directory's listing flight or a staged file's own tokio mutex (held across awaits:
//!    a listing, an upload), independent of each other;
//! 3. `table`, then the staging area's map (`Fs::unstaged_node_opened` holds both; nothing takes `table`
//!    while holding the map);
//! 4. `handles`, never held with `table` or the map;
//! 5. leaf locks (the write-back queue's entries, `dir_cache`, readers, caches).
//!
//! The std mutexes (3-5) are never held across an `.await`; all come from `crate::sync`.

use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering, Weak};
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use bucketfs_store::{ObjectMeta, Store, WriteOptions};

use crate::inode::{ChildMeta, InodeTable, Node};
use crate::read::{FileReader, ReadCache};
use crate::{names, FsError};

pub use crate::dir_cache::DirEntry;
pub use crate::inode::{Kind, ROOT_INO};

pub(crate) use crate::inode::RELIST_MAX;

/// Attributes as the kernel sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
    pub mtime: SystemTime,
    /// The last change of the inode: its mtime, or a later chmod/chown/utimens here.
    pub ctime: SystemTime,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
}

#[derive(Debug, Clone)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
}

#[derive(Debug, Clone)]
pub struct FsConfig {
    pub uid: u32,
    pub gid: u32,
    pub file_mode: u16,
    pub dir_mode: u16,
    /// How long listings and attributes are trusted before asking the store again; the
    /// kernel's entry and attribute timeouts use the same value.
    pub metadata_ttl: Duration,
    /// Largest sequential prefetch window per open file, in bytes.
    pub max_prefetch: u64,
    /// Bytes of prefetch in flight across all open files.
    pub prefetch_budget: u64,
    /// Bytes of object data kept in the memory block cache.
    pub cache_bytes: u64,
    /// The on-disk block cache: directory and size bound; `None` disables it.
    pub disk_cache: Option<(std::path::PathBuf, u64)>,
    /// Where files being written are staged on local disk.
    pub staging_dir: std::path::PathBuf,
    /// Part size and parallelism of uploads.
    pub write: WriteOptions,
    /// Bytes of upload parts held in memory across all files (see `part_budget.rs`).
    pub upload_budget: u64,
    /// A directory rename moves every key below it; past this many it fails with EXDEV
    /// (so `mv` falls back to copying) instead of running for minutes.
    pub max_rename_keys: usize,
    /// List-ahead: a directory listing also asks for one page of the recursive listing below
    /// it, used when it holds at most this many keys; 0 turns it off.
    pub list_ahead_keys: usize,
    /// Names kept in memory (nodes and cached listing entries, about 1 KB each) before the
    /// cached state of directories not in use is dropped (`inode_trim.rs`); 0: no bound.
    pub max_cached_entries: usize,
    /// Write-back mode: `close` returns once staged, uploads follow (see `write_back.rs`);
    /// `None`: every close uploads before it returns.
    pub write_back: Option<crate::write_back::WriteBackConfig>,
    /// A read-only mount: nothing an earlier mount left pending (deletes, moves, staged
    /// files) is sent to the store; a read-write mount of the mount point sends it later.
    pub read_only: bool,
    /// The time TTLs are measured in: the real clock, or a manual one in tests.
    pub clock: crate::clock::Clock,
}

impl Default for FsConfig {
    fn default() -> Self {
        Self {
            uid: 0,
            gid: 0,
            file_mode: 0o644,
            dir_mode: 0o755,
            // One second: fresh enough for another writer's change to show up promptly,
            // long enough that `ls -l` and `find` hit the cache for every entry they stat.
            metadata_ttl: Duration::from_secs(1),
            // 64 MiB ahead: 32 GETs of 2 MiB in flight (examples/readbench.rs: ~84% of a plain
            // parallel download; 32 MiB: ~54%). Blocks come from a bounded pool of reused
            // buffers, so the peak RSS reading 1 GiB stays ~120 MiB (it was past 200 MB
            // with fresh allocations per block).
            max_prefetch: 64 * 1024 * 1024,
            // One reader at full window, or several sharing it.
            prefetch_budget: 64 * 1024 * 1024,
            cache_bytes: 32 * 1024 * 1024,
            disk_cache: None,
            staging_dir: std::env::temp_dir().join("bucketfs-staging"),
            write: WriteOptions::default(),
            // Two uploads at full parallelism (4 parts in flight and one being handed over,
            // 40 MiB each), one of them eager (see part_budget.rs); more wait their turn.
            upload_budget: 80 * 1024 * 1024,
            // 10,000 keys: a few minutes of copies at most on a slow link.
            max_rename_keys: 10_000,
            // One page of S3's LIST (1,000 keys) less one: a subtree is known not to fit when
            // the page's last key arrives, before the store would ask for the next page.
            list_ahead_keys: 999,
            max_cached_entries: 250_000,
            write_back: None,
            read_only: false,
            clock: Default::default(),
        }
    }
}

pub(crate) enum Handle {
    /// A directory's snapshot, its number (readdir offsets carry it: `dir_cache::cookie`),
    /// whether the kernel may cache what it reads through this handle (`cacheable`), and
    /// whether it may keep what an earlier open cached.
    Dir {
        ino: u64,
        entries: Arc<Vec<DirEntry>>,
        snap: u32,
        cacheable: bool,
        keep_cache: bool,
    },
    File(Arc<OpenFile>),
}

/// One open file handle.
/// What a [`Fs::setattr`] changes (`None`: left as it is), and the handle it came through.
#[derive(Debug, Clone, Copy, Default)]
pub struct SetAttr {
    pub size: Option<u64>,
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mtime: Option<SystemTime>,
    pub fh: Option<u64>,
}

pub(crate) struct OpenFile {
    pub ino: u64,
    /// Reads of a file with no staged data; replaced when a local upload changes the object.
    /// Lock level 5 (a leaf): held only to clone or replace the reader.
    pub reader: Mutex<Arc<FileReader>>,
    /// The kernel may keep its page cache: the object is unchanged since the last open.
    pub keep_cache: bool,
    /// Counted in `Node::kernel_dropping` until this handle's first read or its release.
    pub dropping: AtomicBool,
    /// Opened with the kernel's page cache bypassed: the size the kernel holds may be a
    /// placeholder (`Node::size_unknown`), so reads must reach us.
    pub direct: bool,
    /// Counted in the staged file's `handles`.
    pub staged: AtomicBool,
    /// This handle changed the data (write, truncate, O_TRUNC, create) since its last
    /// successful upload: its flush must publish. See `Fs::upload_for`.
    pub wrote: AtomicBool,
    /// Opened `O_RDONLY|O_TRUNC`: the file is emptied at this handle's first flush (see
    /// `Fs::open`).
    pub truncate_at_flush: AtomicBool,
    /// Opened for writing (or created).
    pub writable: bool,
    /// Writable and passed through: the kernel writes the staged file without us, so this
    /// handle's flush publishes whatever changed (see `Fs::upload_for`).
    pub writes_unseen: AtomicBool,
    /// The staged file's `write_gen` when this handle opened it or last published: a
    /// change before that was another handle's, which this one's flush does not publish
    /// though its own writes are unseen (see `Fs::changed_by`). `u64::MAX`: not known.
    pub unseen_mark: AtomicU64,
}

impl OpenFile {
    /// Whether this handle changed the data since its last upload or commit point, its
    /// staged file (observed) being at `write_gen`: it wrote through us, or its writes are
    /// unseen (passthrough) and the file changed since [`OpenFile::unseen_mark`].
    pub(crate) fn changed_data(&self, write_gen: u64) -> bool {
        self.wrote.load(Ordering::Relaxed)
            || self.writes_unseen.load(Ordering::Relaxed) && self.unseen_mark.load(Ordering::Relaxed) != write_gen
    }
}

pub struct Fs {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) cfg: FsConfig,
    mounted_at: SystemTime,
    /// Lock level 3: taken after a staged file's mutex, before the staging area's maps.
    pub(crate) table: Mutex<InodeTable>,
    /// Lock level 4: never held with `table` or the staging area's map.
    pub(crate) handles: Mutex<HashMap<u64, Handle>>,
    /// The files being written: staged files (lock level 3, after `table`), the upload
    /// budget, the write-back queue, the passthrough watch (`staging.rs`).
    pub(crate) staging: crate::staging::Staging,
    /// The keys uploads, unlinks and renames are changing now (intents.rs): lock level 1,
    /// the outermost, held across awaits.
    pub(crate) intents: crate::intents::Intents,
    pub(crate) read_cache: Arc<ReadCache>,
    next_fh: AtomicU64,
    /// This filesystem, for work it starts in the background (listing subdirectories
    /// ahead); dangling only while [`Fs::new`] builds it.
    pub(crate) me: Weak<Fs>,
    /// Background listings in flight, mount-wide (see `preload.rs`).
    pub(crate) listing_ahead: Arc<tokio::sync::Semaphore>,
    /// What the kernel's readdir cache of each directory was filled from.
    pub(crate) dir_cache: crate::dir_cache::DirCache,
    /// Per directory, held while its listing is fetched (see `ensure_listing`): lock level
    /// 2 (the tokio mutex, across the listing's awaits); the map itself is a leaf.
    listing_flights: Mutex<HashMap<u64, Arc<listing::Flight>>>,
    /// Kernel forgets so far (the heap is trimmed every [`TRIM_EVERY`]).
    forgets: AtomicU64,
    /// Single-request refreshes (a HEAD, a probe) that outlasted their caller's patience
    /// and go on (`Fs::refresh_within`): while any does, the store hangs, and callers do
    /// not wait again.
    pub(crate) overdue_refreshes: Arc<AtomicU64>,
    /// Write-back mode: unlinks journaled and sent in the background (deletes.rs); `store`
    /// is this wrapper then.
    pub(crate) deletes: Option<std::sync::Arc<crate::deletes::DeferredDeletes>>,
    /// Write-back mode: keys an upload cut off may still land on (late.rs).
    pub(crate) late: crate::late::LateLandings,
    /// Opens the kernel serves from local files (passthrough.rs).
    pub(crate) passthrough: crate::passthrough::Counters,
    /// The store's change events, if followed (`events.rs`).
    pub(crate) events: crate::events::EventState,
    /// Link targets read or made here, by inode, with the version they belong to
    /// (fs_links.rs); bounded by their bytes.
    pub(crate) links: moka::sync::Cache<u64, (crate::inode::Version, bytes::Bytes)>,
}

fn read_cache(cfg: &FsConfig) -> ReadCache {
    let cache = ReadCache::new(cfg.cache_bytes, cfg.prefetch_budget);
    match &cfg.disk_cache {
        Some((dir, bytes)) => match crate::disk_cache::DiskCache::open(dir, *bytes) {
            Ok(disk) => cache.with_disk(disk),
            Err(e) => {
                tracing::warn!("disk cache {} unusable, continuing without it: {e}", dir.display());
                cache
            }
        },
        None => cache,
    }
}

/// Background listings in flight at once, mount-wide; more are skipped, not queued.
pub(crate) const LISTINGS_AHEAD: usize = 8;

/// Forgets between two [`trim_heap`]s: `find` over a big bucket, then the kernel forgetting
/// it (memory pressure, `drop_caches`), frees many small allocations (nodes, listings).
const TRIM_EVERY: u64 = 10_000;

/// Give the heap's free memory back to the system. glibc keeps what small allocations
/// freed in its arenas, so without this the daemon's RSS stayed at its peak after the
/// kernel forgot a walked tree (100,000 keys: 100 MB before and after `drop_caches`).
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; no pointer is passed.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Fs {
    /// A filesystem over `store`. It holds a reference to itself, so it may start
    /// background work of its own (listing ahead, directory-cache expiry, write-back).
    pub fn new(store: Arc<dyn Store>, cfg: FsConfig) -> Arc<Self> {
        Arc::new_cyclic(|me| Self { me: me.clone(), ..Self::build(store, cfg) })
    }

    fn build(store: Arc<dyn Store>, cfg: FsConfig) -> Self {
        let now = SystemTime::now();
        // Write-back defers deletes; any mount but a read-only one finishes those an earlier
        // one left pending.
        let left = crate::deletes::journal_left(&cfg.staging_dir);
        let deletes = ((cfg.write_back.is_some() || left) && !cfg.read_only)
            .then(|| crate::deletes::DeferredDeletes::new(store.clone(), &cfg.staging_dir));
        let store: Arc<dyn Store> = match &deletes {
            Some(d) => d.clone(),
            None => store,
        };
        let mut table = InodeTable::with_clock(now, cfg.clock.clone());
        // Google Drive (the store that moves items whole) holds repeated names.
        table.names_alias = store.capabilities().moves;
        Self {
            store,
            deletes,
            late: Default::default(),
            mounted_at: now,
            table: Mutex::new(table),
            handles: Mutex::new(HashMap::new()),
            staging: crate::staging::Staging::new(cfg.staging_dir.clone(), cfg.upload_budget),
            intents: Default::default(),
            read_cache: Arc::new(read_cache(&cfg)),
            next_fh: AtomicU64::new(1),
            cfg,
            me: Weak::new(),
            listing_ahead: Arc::new(tokio::sync::Semaphore::new(LISTINGS_AHEAD)),
            dir_cache: Default::default(),
            listing_flights: Mutex::new(HashMap::new()),
            forgets: AtomicU64::new(0),
            overdue_refreshes: Default::default(),
            passthrough: Default::default(),
            events: Default::default(),
            links: crate::fs_links::cache(),
        }
    }

    /// Whether attributes confirmed `at` still answer: within the TTL, or confirmed while
    /// the store's events flow (`events.rs`).
    pub(crate) fn fresh(&self, at: Instant) -> bool {
        let age = self.cfg.clock.since(at);
        age < self.cfg.metadata_ttl || age < crate::events::EVENT_TRUST_MAX && self.events.vouches_for(at)
    }

    pub(crate) fn attr(&self, n: &Node) -> Attr {
        let (uid, gid) = n.owner.unwrap_or((self.cfg.uid, self.cfg.gid));
        // A staged file the kernel writes directly (passthrough): its size is the file's.
        let watched = if n.local { self.staging.watched_state(n.ino) } else { None };
        let (size, mtime) = watched.unwrap_or((n.size, n.mtime));
        let mtime = n.mtime_set.unwrap_or(mtime);
        Attr {
            ino: n.ino,
            kind: n.kind,
            size,
            mtime,
            ctime: n.ctime.map_or(mtime, |c| c.max(mtime)),
            perm: match n.kind {
                Kind::Symlink => 0o777, // as on Linux: a link's own mode is never checked
                Kind::Dir => n.perm.unwrap_or(self.cfg.dir_mode),
                Kind::File => n.perm.unwrap_or(self.cfg.file_mode),
            },
            uid,
            gid,
            nlink: match (n.linked, n.kind) {
                (false, _) => 0,
                (true, Kind::Dir) => 2,
                (true, Kind::File | Kind::Symlink) => 1,
            },
        }
    }

    pub(crate) fn node(&self, ino: u64) -> Result<Node, FsError> {
        self.table.lock().unwrap().get(ino).cloned().ok_or(FsError::NotFound)
    }

    pub(crate) fn child_meta(&self, name: &str, m: &ObjectMeta, kind: Kind) -> ChildMeta {
        ChildMeta {
            name: name.to_string(),
            kind,
            size: if kind == Kind::Dir { 0 } else { m.size },
            mtime: m.mtime.unwrap_or(self.mounted_at),
            etag: m.etag.clone(),
            attrs: None,
            size_unknown: kind == Kind::File && m.size_unknown,
            asked: 0,
        }
    }

    pub fn forget(&self, ino: u64, count: u64) {
        let mut t = self.table.lock().unwrap();
        let parent = t.get(ino).map(|n| n.parent);
        t.forget(ino, count);
        match t.get(ino) {
            None => {
                self.dir_cache.forgotten(ino);
                if let Some(parent) = parent {
                    // Its parent's snapshot names an inode gone: the next read takes a new one.
                    self.dir_cache.forget_snapshot(parent);
                }
                self.listing_flights.lock().unwrap().remove(&ino);
            }
            Some(n) if n.lookups == 0 => self.dir_cache.forgotten(ino), // a directory kept
            Some(_) => {}
        }
        let left = t.len();
        drop(t);
        if self.forgets.fetch_add(1, Ordering::Relaxed) % TRIM_EVERY == TRIM_EVERY - 1 {
            self.table.lock().unwrap().shrink();
            self.dir_cache.shrink();
            tracing::debug!(nodes = left, "many inodes forgotten: freed memory goes back to the system");
            // A thread of its own: forgets arrive on FUSE threads, outside the runtime.
            let _ = std::thread::Builder::new().name("bucketfs-trim".into()).spawn(trim_heap);
        }
    }

    /// The kernel took a reference through a readdirplus entry.
    pub fn remember(&self, ino: u64) {
        self.table.lock().unwrap().remember(ino);
    }

    pub async fn getattr(&self, ino: u64) -> Result<Attr, FsError> {
        match self.getattr_now(ino) {
            Some(answer) => answer,
            None => self.refresh(&self.node(ino)?).await,
        }
    }

    /// `getattr` when it needs no request to the store (None when it does), so the FUSE
    /// thread can answer at once: directories, links, and files within the TTL.
    pub fn getattr_now(&self, ino: u64) -> Option<Result<Attr, FsError>> {
        let node = match self.node(ino) {
            Ok(node) => node,
            Err(e) => return Some(Err(e)),
        };
        // Staged files are ours: their size and mtime are the local ones until uploaded.
        // A file no longer linked (unlinked while open) has no object left to ask about.
        if node.kind == Kind::File && node.linked && !self.fresh(node.validated) && !self.staging.owns(ino) {
            return None;
        }
        Some(Ok(self.attr(&node)))
    }

    /// Snapshot a directory for one readdir sequence; offsets index into the snapshot.
    pub async fn opendir(&self, ino: u64) -> Result<u64, FsError> {
        self.dir_cache.touch(ino, self.cfg.clock.now());
        let entries = self.dir_snapshot(ino).await?;
        // Numbered per handle: another handle's snapshot, which the kernel may have cached
        // since, holds other offsets, so a read part-way through this one is not continued
        // at the same index of that one (a name repeated or skipped) but asked of us.
        let snap = self.dir_cache.next_snap();
        let cacheable = !crate::dir_cache::ends_on_a_page_edge(&entries);
        let keep_cache = self.dir_cache.opened(ino, &entries) && cacheable;
        Ok(self.insert_handle(Handle::Dir { ino, entries, snap, cacheable, keep_cache }))
    }

    /// A directory handle's snapshot.
    pub fn readdir(&self, fh: u64) -> Result<Arc<Vec<DirEntry>>, FsError> {
        self.readdir_numbered(fh).map(|(entries, _)| entries)
    }

    /// A directory handle's snapshot and its number.
    pub fn readdir_numbered(&self, fh: u64) -> Result<(Arc<Vec<DirEntry>>, u32), FsError> {
        match self.handles.lock().unwrap().get(&fh) {
            Some(Handle::Dir { entries, snap, .. }) => Ok((entries.clone(), *snap)),
            _ => Err(FsError::BadHandle),
        }
    }

    /// Whether the kernel may cache the entries it reads through directory handle `fh`
    /// (FOPEN_CACHE_DIR): not where its cache would end on a page edge
    /// ([`crate::dir_cache::ends_on_a_page_edge`]).
    pub fn dir_cacheable(&self, fh: u64) -> bool {
        matches!(self.handles.lock().unwrap().get(&fh), Some(Handle::Dir { cacheable: true, .. }))
    }

    /// Attributes of an entry for readdirplus, from what the listing just recorded.
    pub fn cached_attr(&self, ino: u64) -> Option<Attr> {
        self.table.lock().unwrap().get(ino).map(|n| self.attr(n))
    }

    /// The attributes to answer for entry `name` of directory `dir` in a readdirplus, from
    /// what the mount knows now, not from the listing snapshot being read (taken at opendir,
    /// perhaps before a rename or unlink here): the node now under that name, or `None` if
    /// the name is gone. Such an answer links the name to the inode in the kernel, so an
    /// inode that left the name must never be handed out under it (writes to the name
    /// would change another file).
    pub fn entry_attr(&self, dir: u64, name: &str, ino: u64) -> Option<Attr> {
        let mut t = self.table.lock().unwrap();
        if let "." | ".." = name {
            return t.get(ino).map(|n| self.attr(n));
        }
        if let Some(n) = t.child(dir, name).filter(|n| n.linked) {
            return Some(self.attr(n));
        }
        // No node under the name: gone since the snapshot, or only forgotten by the kernel
        // (and dropped) while the listing still holds it. That one is made again: leaving
        // it out of a readdirplus left it out of what the kernel caches of the directory
        // (a directory of 220 files then listed 18).
        let l = t.listing(dir)?;
        let (meta, overtaken) = (l.children.get(name)?.clone(), l.overtaken);
        let child = crate::fs_readdir::listed_node(&mut t, dir, &meta, overtaken)?;
        t.get(child).filter(|n| n.linked).map(|n| self.attr(n))
    }

    /// Whether the kernel may keep cached pages for this handle's file (see `open`), or
    /// its cached entries for this handle's directory (see `dir_cache.rs`).
    pub fn keep_cache(&self, fh: u64) -> bool {
        match self.handles.lock().unwrap().get(&fh) {
            Some(Handle::File(f)) => f.keep_cache,
            Some(Handle::Dir { keep_cache, .. }) => *keep_cache,
            None => false,
        }
    }

    /// Whether file handle `fh` must be opened direct (see `OpenFile::direct`).
    pub fn direct_io(&self, fh: u64) -> bool {
        matches!(self.handles.lock().unwrap().get(&fh), Some(Handle::File(f)) if f.direct)
    }

    pub(crate) fn reader_for(&self, node: &Node) -> Arc<FileReader> {
        self.reader_of(node.key.clone(), node.version.tag().map(str::to_owned), node.identity(), node.size)
    }

    /// A reader of version `identity` (tag `tag`, `size` bytes) of the object at `key`.
    pub(crate) fn reader_of(&self, key: String, tag: Option<String>, identity: String, size: u64) -> Arc<FileReader> {
        let (store, cache) = (self.store.clone(), self.read_cache.clone());
        Arc::new(FileReader::new(store, cache, key, tag, identity, size, self.cfg.max_prefetch))
    }

    pub fn releasedir(&self, fh: u64) {
        if let Some(Handle::Dir { ino, .. }) = self.handles.lock().unwrap().remove(&fh) {
            self.dir_cache.released(ino);
        }
    }

    /// Count a file handle opened on `ino`, or one released (`Node::opens`).
    pub(crate) fn count_open(&self, ino: u64, opened: bool) {
        if let Some(n) = self.table.lock().unwrap().get_mut(ino) {
            n.opens = if opened { n.opens + 1 } else { n.opens.saturating_sub(1) };
        }
    }

    /// A read or the release of `file` came: the kernel has finished its open, dropping its
    /// cached pages if told to (`Node::kernel_dropping`).
    pub(crate) fn kernel_finished_open(&self, file: &OpenFile) {
        if file.dropping.swap(false, Ordering::Relaxed) {
            if let Some(n) = self.table.lock().unwrap().get_mut(file.ino) {
                n.kernel_dropping = n.kernel_dropping.saturating_sub(1);
            }
        }
    }

    /// Whether a file handle is open on `ino` (the node's count, not a scan of the handles).
    pub(crate) fn has_open_handle(&self, ino: u64) -> bool {
        self.table.lock().unwrap().get(ino).is_some_and(|n| n.opens > 0)
    }

    pub(crate) fn insert_handle(&self, h: Handle) -> u64 {
        self.insert_handle_as(h, false)
    }

    /// [`Fs::insert_handle`]; `counted`: a file handle's open is counted already.
    pub(crate) fn insert_handle_as(&self, h: Handle, counted: bool) -> u64 {
        match &h {
            Handle::File(f) if !counted => self.count_open(f.ino, true),
            _ => {}
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().unwrap().insert(fh, h);
        fh
    }

    pub fn statfs(&self) -> StatFs {
        // Buckets have no fixed size; report 1 PiB free so tools that check space proceed.
        let blocks = (1u64 << 50) / 4096;
        StatFs { blocks, bfree: blocks, files: 1 << 32, ffree: 1 << 32, bsize: 4096, namelen: names::NAME_MAX as u32 }
    }
}

#[path = "fs_listing.rs"]
mod listing;
pub(crate) use listing::{note_deleted, KNOWN_ANSWER_WAIT};
#[path = "fs_lookup.rs"]
mod lookup;

#[cfg(test)]
#[path = "fs_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "fs_write_tests.rs"]
mod write_tests;

#[cfg(test)]
#[path = "fs_write_model_tests.rs"]
mod write_model_tests;

#[cfg(test)]
#[path = "integrity_tests.rs"]
mod integrity_tests;

#[cfg(test)]
#[path = "economy_tests.rs"]
mod economy_tests;
#[cfg(test)]
#[path = "patch_tests.rs"]
mod patch_tests;
#[cfg(test)]
#[path = "refresh_tests.rs"]
mod refresh_tests;

impl Fs {
    /// [`crate::inode::InodeTable::check_invariants`] on this mount's table (for tests).
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        self.table.lock().unwrap().check_invariants();
    }
}
