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
//! 1. the write-back gate (`write_back::Queue::gate`, held across awaits);
//! 2. a directory's listing flight or a staged file's own tokio mutex (held across awaits:
//!    a listing, an upload), independent of each other;
//! 3. `table`, then the `staged` map (`Fs::unstaged_node` holds both; nothing takes `table`
//!    while holding the map);
//! 4. `handles`, never held with `table` or the map (`Fs::has_open_handle` is asked
//!    before taking the table);
//! 5. leaf locks (the write-back queue's entries, `dir_cache`, readers, caches).
//!
//! The std mutexes (3-5) are never held across an `.await`; all come from `crate::sync`.

use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering, Weak};
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use bucketfs_store::{HeadOpts, ObjectHead, ObjectMeta, Store, StoreError, StoreErrorKind, StoreExt, WriteOptions};
use futures::StreamExt;

use crate::inode::{ChildMeta, InodeTable, Listing, Node};
use crate::read::{FileReader, ReadCache};
use crate::write::SharedStaged;
use crate::{names, FsError};

pub use crate::inode::ROOT_INO;

/// A directory whose last listing held at most this many entries (one page of an S3 LIST)
/// is listed again to answer a lookup or a `stat` past the TTL (see `Fs::find_child`).
const RELIST_MAX: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    /// A symbolic link (see [`crate::links`]).
    Symlink,
}

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

/// One entry of a directory snapshot, in readdir order (`.` and `..` first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: Kind,
    pub name: String,
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
    /// Write-back mode: `close` returns once staged, uploads follow (see `write_back.rs`);
    /// `None`: every close uploads before it returns.
    pub write_back: Option<crate::write_back::WriteBackConfig>,
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
            write_back: None,
            clock: Default::default(),
        }
    }
}

pub(crate) enum Handle {
    /// A directory's snapshot, and whether the kernel may keep its readdir cache.
    Dir {
        ino: u64,
        entries: Arc<Vec<DirEntry>>,
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
}

pub struct Fs {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) cfg: FsConfig,
    mounted_at: SystemTime,
    /// Lock level 3: taken after a staged file's mutex, before the `staged` map.
    pub(crate) table: Mutex<InodeTable>,
    /// Lock level 4: never held with `table` or `staged`.
    pub(crate) handles: Mutex<HashMap<u64, Handle>>,
    /// Inodes with staged (local) data. Lock level 3, after `table` when both are needed;
    /// neither is held across an await (the per-file tokio mutex, level 2, is).
    pub(crate) staged: Mutex<HashMap<u64, SharedStaged>>,
    pub(crate) read_cache: Arc<ReadCache>,
    /// Upload part buffers of every file, bounded together.
    pub(crate) part_budget: crate::part_budget::PartBudget,
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
    listing_flights: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<()>>>>,
    /// Files committed and waiting for upload (write-back mode only).
    pub(crate) wb: Arc<crate::write_back::Queue>,
    /// Write-back mode: unlinks journaled and sent in the background (deletes.rs); `store`
    /// is this wrapper then.
    pub(crate) deletes: Option<std::sync::Arc<crate::deletes::DeferredDeletes>>,
    /// Opens the kernel serves from local files (passthrough.rs).
    pub(crate) passthrough: crate::passthrough::Counters,
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

impl Fs {
    /// A filesystem over `store`. It holds a reference to itself, so it may start
    /// background work of its own (listing ahead, directory-cache expiry, write-back).
    pub fn new(store: Arc<dyn Store>, cfg: FsConfig) -> Arc<Self> {
        Arc::new_cyclic(|me| Self { me: me.clone(), ..Self::build(store, cfg) })
    }

    fn build(store: Arc<dyn Store>, cfg: FsConfig) -> Self {
        let now = SystemTime::now();
        let deletes = cfg.write_back.map(|_| crate::deletes::DeferredDeletes::new(store.clone(), &cfg.staging_dir));
        let store: Arc<dyn Store> = match &deletes {
            Some(d) => d.clone(),
            None => store,
        };
        Self {
            store,
            deletes,
            mounted_at: now,
            table: Mutex::new(InodeTable::with_clock(now, cfg.clock.clone())),
            handles: Mutex::new(HashMap::new()),
            staged: Mutex::new(HashMap::new()),
            read_cache: Arc::new(read_cache(&cfg)),
            part_budget: crate::part_budget::PartBudget::new(cfg.upload_budget),
            next_fh: AtomicU64::new(1),
            cfg,
            me: Weak::new(),
            listing_ahead: Arc::new(tokio::sync::Semaphore::new(crate::preload::LISTINGS_AHEAD)),
            dir_cache: Default::default(),
            listing_flights: Mutex::new(HashMap::new()),
            wb: Default::default(),
            passthrough: Default::default(),
        }
    }

    pub fn ttl(&self) -> Duration {
        self.cfg.metadata_ttl
    }

    pub(crate) fn fresh(&self, at: Instant) -> bool {
        self.cfg.clock.since(at) < self.cfg.metadata_ttl
    }

    pub(crate) fn attr(&self, n: &Node) -> Attr {
        let (uid, gid) = n.owner.unwrap_or((self.cfg.uid, self.cfg.gid));
        // A staged file the kernel writes directly (passthrough): its size is the file's.
        let watched = if n.local { self.watched_state(n.ino) } else { None };
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
        }
    }

    /// Look `name` up in `parent`; the kernel holds one more reference on success.
    pub async fn lookup(&self, parent: u64, name: &str) -> Result<Attr, FsError> {
        names::check_lookup_name(name)?;
        let dir = self.node(parent)?;
        if dir.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        // A key the store cannot hold (S3, GCS: 1,024 bytes) cannot exist: ENAMETOOLONG, and
        // a create or mkdir of it fails so before any request (the kernel looks up first).
        if self.store.capabilities().max_key_len.is_some_and(|max| dir.key.len() + name.len() > max) {
            return Err(FsError::NameTooLong);
        }
        let local = {
            let t = self.table.lock().unwrap();
            t.child(parent, name).filter(|n| self.is_staged(n.ino)).map(|n| n.ino)
        };
        if let Some(ino) = local {
            // Created or written here and maybe not uploaded yet: the local state is the truth.
            let mut t = self.table.lock().unwrap();
            t.remember(ino);
            return Ok(self.attr(t.get(ino).expect("indexed")));
        }
        let since = self.table.lock().unwrap().change_seq();
        let mut found = self.find_child(&dir, name).await?;
        if self.table.lock().unwrap().changed_at(parent) > since {
            // The directory changed here while the store was asked (an upload, a create, an
            // unlink): the answer may predate that change, so ask again (a listing this
            // mount keeps current usually answers with no request).
            found = self.find_child(&dir, name).await?;
        }
        let meta = found.ok_or(FsError::NotFound)?;
        let mut t = self.table.lock().unwrap();
        let ino = t.upsert(parent, &meta);
        t.remember(ino);
        Ok(self.attr(t.get(ino).expect("just inserted")))
    }

    /// `name` in directory `dir` as the store has it (`None`: absent), from the cheapest
    /// source: a fresh listing (no request); else, for a small directory listed before, a
    /// new listing of it (one LIST answers this name and every other lookup and `stat` in
    /// the directory for the TTL); else a probe of the name.
    pub(crate) async fn find_child(&self, dir: &Node, name: &str) -> Result<Option<ChildMeta>, FsError> {
        if let Some(answer) = self.listed_child(dir.ino, name) {
            return Ok(answer);
        }
        if self.relist_worthwhile(dir.ino) {
            self.ensure_listing(dir, false).await?;
            // Installed stale (the directory changed here meanwhile): the probe decides.
            if let Some(answer) = self.listed_child(dir.ino, name) {
                return Ok(answer);
            }
        }
        let since = {
            let t = self.table.lock().unwrap();
            if t.known_absent(dir.ino, name, self.cfg.metadata_ttl) {
                return Ok(None);
            }
            t.change_seq()
        };
        match self.probe(&dir.key, name).await {
            Ok(m) => Ok(Some(m)),
            Err(FsError::NotFound) => {
                self.table.lock().unwrap().note_absent(dir.ino, name, since);
                Ok(None)
            }
            // Stale if the store is down: what this mount last knew of the name answers.
            Err(FsError::Store(e)) if e.kind == StoreErrorKind::Unavailable => {
                let t = self.table.lock().unwrap();
                let known = match t.listing(dir.ino) {
                    Some(l) => Some(l.children.get(name).cloned()),
                    None => t.child(dir.ino, name).map(|n| Some(n.entry())),
                };
                let Some(answer) = known else { return Err(FsError::Store(e)) };
                tracing::warn!(dir = %dir.key, name, "store unreachable, answering from what the mount knows: {e}");
                Ok(answer)
            }
            Err(e) => Err(e),
        }
    }

    /// What `dir`'s fresh listing says of `name`; `None` without a fresh listing.
    fn listed_child(&self, dir: u64, name: &str) -> Option<Option<ChildMeta>> {
        let t = self.table.lock().unwrap();
        t.listing(dir).filter(|l| l.is_fresh(t.now())).map(|l| l.children.get(name).cloned())
    }

    /// Whether listing `dir` again beats asking about one name: it was listed before and
    /// held one page at most. (With a TTL of 0 no listing is ever fresh: never.)
    fn relist_worthwhile(&self, dir: u64) -> bool {
        !self.cfg.metadata_ttl.is_zero()
            && self.table.lock().unwrap().listing(dir).is_some_and(|l| l.children.len() <= RELIST_MAX)
    }

    /// A file's attributes once their TTL ran out: from a new listing of its directory when
    /// that is worthwhile (`git status` after the TTL costs one LIST per directory, not a
    /// HEAD per file), else from a HEAD.
    pub(crate) async fn refresh(&self, node: &Node) -> Result<Attr, FsError> {
        if node.linked && self.relist_worthwhile(node.parent) {
            if let Ok(dir) = self.node(node.parent) {
                self.ensure_listing(&dir, false).await?;
                if let Some(Some(m)) = self.listed_child(node.parent, &node.name) {
                    let mut t = self.table.lock().unwrap();
                    if m.kind == node.kind && t.child(node.parent, &node.name).is_some_and(|c| c.ino == node.ino) {
                        let ino = t.upsert(node.parent, &m);
                        let n = t.get(ino).expect("indexed");
                        tracing::debug!(ino, key = %n.key, identity = %n.identity(), "refreshed from the listing");
                        return Ok(self.attr(n));
                    }
                }
            }
        }
        self.revalidate(node).await
    }

    /// Ask the store whether `name` under `prefix` is a directory, a file, or nothing: on an
    /// object store one LIST of the plain prefix `prefix+name` (a HEAD more for a file whose
    /// mode and owner the store keeps), else [`Fs::probe_each`].
    pub(crate) async fn probe(&self, prefix: &str, name: &str) -> Result<ChildMeta, FsError> {
        let file_key = format!("{prefix}{name}");
        let caps = self.store.capabilities();
        if caps.prefix_dirs && caps.addressable(&file_key) {
            if let Some(found) = self.probe_by_list(&file_key, name).await? {
                return found.ok_or(FsError::NotFound);
            }
        }
        self.probe_each(prefix, name).await
    }

    /// `name` (key `file_key`) from one listing of the plain prefix `file_key`: keys come in
    /// byte order, so everything that decides (`k`, `k.rclonelink`, `k/`) comes before the
    /// first key past `k/`. `None` if the store's answer did not settle it.
    async fn probe_by_list(&self, file_key: &str, name: &str) -> Result<Option<Option<ChildMeta>>, FsError> {
        let dir_key = format!("{file_key}/");
        let link_key = format!("{file_key}{}", crate::links::LINK_SUFFIX);
        let (mut file, mut link, mut dir) = (None, None, false);
        // Read until the first key past `k/` (or the end): the rest cannot decide.
        let mut stream = self.store.list(file_key, false);
        while let Some(m) = stream.next().await {
            let m = m?;
            if !m.key.starts_with(file_key) {
                return Ok(None); // not a prefix listing after all: ask the old way
            }
            if m.key.starts_with(&dir_key) {
                dir = true;
            }
            let past = m.key.as_str() >= dir_key.as_str();
            if m.key == file_key {
                file = Some(m);
            } else if m.key == link_key && crate::links::may_be_link(name) {
                link = Some(m);
            }
            if past {
                break;
            }
        }
        drop(stream);
        if dir {
            return Ok(Some(Some(self.child_meta(
                name,
                &ObjectMeta { key: dir_key, size: 0, etag: None, mtime: None, size_unknown: false },
                Kind::Dir,
            ))));
        }
        if let Some(m) = file {
            if !self.store.capabilities().keeps_attrs {
                return Ok(Some(Some(self.child_meta(name, &m, Kind::File))));
            }
            // The mode, owner and mtime the object carries come only with a HEAD.
            return match self.store.head(file_key, HeadOpts::default()).await {
                Ok(ObjectHead { meta: m, attrs, .. }) if !m.is_prefix() => {
                    Ok(Some(Some(ChildMeta { attrs: Some(attrs), ..self.child_meta(name, &m, Kind::File) })))
                }
                Ok(_) => Ok(None),
                Err(e) if e.kind == StoreErrorKind::NotFound => Ok(None), // deleted meanwhile: ask again
                Err(e) => Err(e.into()),
            };
        }
        Ok(Some(link.map(|m| self.child_meta(name, &m, Kind::Symlink))))
    }

    /// [`Fs::probe`] by asking about each key at once (HEAD `k`, HEAD `k/`, LIST `k/`, HEAD
    /// the link): for stores without prefix listings, or when one did not settle it.
    async fn probe_each(&self, prefix: &str, name: &str) -> Result<ChildMeta, FsError> {
        let file_key = format!("{prefix}{name}");
        let dir_key = format!("{file_key}/");
        let caps = self.store.capabilities();
        // Keys the store would change on the way (see `Capabilities::addressable`) are not
        // asked for: their answer would be another object's.
        let prefix_dirs = caps.prefix_dirs && caps.addressable(&dir_key);
        let file_ok = caps.addressable(&file_key);
        let first_child = async {
            if !prefix_dirs {
                return None;
            }
            self.store.list(&dir_key, false).next().await
        };
        let marker = async {
            if !prefix_dirs {
                return Err(bucketfs_store::StoreError::not_found(""));
            }
            self.store.stat(&dir_key).await
        };
        let link = async {
            if !crate::links::may_be_link(name) {
                return Err(bucketfs_store::StoreError::not_found(""));
            }
            self.store.stat(&format!("{file_key}{}", crate::links::LINK_SUFFIX)).await
        };
        let file = async {
            match file_ok {
                true => self.store.head(&file_key, HeadOpts::default()).await,
                false => Err(bucketfs_store::StoreError::not_found("")),
            }
        };
        let (file, child, marker, link) = tokio::join!(file, first_child, marker, link);
        let dir_meta = ObjectMeta { key: dir_key, size: 0, etag: None, mtime: None, size_unknown: false };
        if matches!(child, Some(Ok(_))) || marker.is_ok() {
            let mtime = marker.as_ref().ok().and_then(|m| m.mtime);
            return Ok(self.child_meta(name, &ObjectMeta { mtime, ..dir_meta }, Kind::Dir));
        }
        match file {
            Ok(ObjectHead { meta: m, .. }) if m.is_prefix() => Ok(self.child_meta(name, &m, Kind::Dir)),
            Ok(ObjectHead { meta: m, attrs, .. }) => {
                Ok(ChildMeta { attrs: Some(attrs), ..self.child_meta(name, &m, Kind::File) })
            }
            Err(e) if e.kind == StoreErrorKind::NotFound => match (child, link) {
                (Some(Err(e)), _) if e.kind != StoreErrorKind::NotFound => Err(e.into()),
                (_, Ok(m)) => Ok(self.child_meta(name, &m, Kind::Symlink)),
                (_, Err(e)) if e.kind != StoreErrorKind::NotFound => Err(e.into()),
                _ => Err(FsError::NotFound),
            },
            Err(e) => Err(e.into()),
        }
    }

    pub fn forget(&self, ino: u64, count: u64) {
        let mut t = self.table.lock().unwrap();
        t.forget(ino, count);
        if t.get(ino).is_none() {
            self.dir_cache.forgotten(ino);
            self.listing_flights.lock().unwrap().remove(&ino);
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
        if node.kind == Kind::File && node.linked && !self.fresh(node.validated) && !self.is_staged(ino) {
            return None;
        }
        Some(Ok(self.attr(&node)))
    }

    /// HEAD a file again and record what the store says now.
    /// Stale if the store is down: `dir`'s last listing (kept current by this mount's own
    /// changes) answers for another TTL when the store cannot be reached, so lookups,
    /// creates and `ls` go on through an outage (docs/SEMANTICS.md, "Freshness").
    fn serve_stale_listing(&self, dir: &Node, e: &StoreError) -> bool {
        if e.kind != StoreErrorKind::Unavailable {
            return false;
        }
        let Some(age) = self.table.lock().unwrap().renew_listing(dir.ino) else { return false };
        tracing::warn!(dir = %dir.key, age_s = age.as_secs(), "store unreachable, serving the last listing: {e}");
        true
    }

    pub(crate) async fn revalidate(&self, node: &Node) -> Result<Attr, FsError> {
        if let Some(gone) = self.table.lock().unwrap().get(node.ino).filter(|n| !n.linked) {
            // Unlinked or replaced while open: its key names another file now, if any.
            return Ok(self.attr(gone));
        }
        let since = self.table.lock().unwrap().change_seq();
        let head = self.store.head(&node.key, HeadOpts::default()).await;
        {
            // An upload, create or unlink here since the HEAD was sent (it notes a change in
            // the parent): the answer may predate it, and must not put the node back on an
            // older version (or unlink a file just made). What the mount holds answers.
            let t = self.table.lock().unwrap();
            if let Some(cur) = t.get(node.ino).filter(|n| t.changed_at(n.parent) > since) {
                tracing::debug!(ino = cur.ino, key = %cur.key, identity = %cur.identity(), "revalidation raced a change here");
                return Ok(self.attr(cur));
            }
        }
        match head {
            Ok(ObjectHead { meta: m, attrs, .. }) if !m.is_prefix() => {
                let meta = self.child_meta(&node.name, &m, Kind::File);
                let mut t = self.table.lock().unwrap();
                let cur = t.get_mut(node.ino).ok_or(FsError::NotFound)?;
                if cur.etag != meta.etag && !cur.local {
                    cur.forget_attrs(); // changed by someone else: what it carries is the truth
                }
                if !cur.local {
                    // Staged here: the size and mtime are the mount's own (see `Node::local`).
                    cur.size = meta.size;
                    cur.size_unknown = meta.size_unknown;
                    cur.mtime = meta.mtime;
                }
                cur.etag = meta.etag;
                cur.validated = self.cfg.clock.now();
                cur.fill_attrs(&attrs);
                tracing::debug!(ino = cur.ino, key = %cur.key, identity = %cur.identity(), "revalidated");
                Ok(self.attr(cur))
            }
            Ok(_) => Err(FsError::NotFound),
            Err(e) if e.kind == StoreErrorKind::NotFound => {
                let open = self.has_open_handle(node.ino); // before the table: never both locks
                let mut t = self.table.lock().unwrap();
                if t.child(node.parent, &node.name).is_some_and(|c| c.ino == node.ino) {
                    t.unlink(node.parent, &node.name);
                }
                // Deleted behind the mount while a handle is open: like a file unlinked while
                // open, it still has attributes (st_nlink 0); reads through the handle fail
                // with ESTALE. `fstat` must not fail, nor a read the kernel precedes with a
                // GETATTR (it does, near the end of what it knows of the file).
                match t.get(node.ino) {
                    Some(n) if open => Ok(self.attr(n)),
                    _ => Err(FsError::NotFound),
                }
            }
            // Stale if the store is down, as for listings (`serve_stale_listing`).
            Err(e) if e.kind == StoreErrorKind::Unavailable => {
                let mut t = self.table.lock().unwrap();
                let cur = t.get_mut(node.ino).ok_or(FsError::Store(e.clone()))?;
                tracing::warn!(key = %node.key, "store unreachable, serving the last attributes: {e}");
                cur.validated = self.cfg.clock.now();
                Ok(self.attr(cur))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Refresh `dir`'s listing from the store if it is older than the TTL. On a first visit
    /// (or where the subtree fit last time) one page of a recursive listing is asked for at
    /// the same time; if it holds the whole subtree, every directory below is listed too.
    /// If not, and `subdirs_ahead`, its subdirectories are listed in the background
    /// (preload.rs).
    pub(crate) async fn ensure_listing(&self, dir: &Node, subdirs_ahead: bool) -> Result<(), FsError> {
        if self.table.lock().unwrap().listing_fresh(dir.ino) {
            return Ok(());
        }
        // One listing of a directory at a time: a walk and the listing ahead often ask for
        // the same one together; the second finds it fresh when the first is done.
        let flight = self.listing_flights.lock().unwrap().entry(dir.ino).or_default().clone();
        let _one = flight.lock().await;
        if self.table.lock().unwrap().listing_fresh(dir.ino) {
            // Listed meanwhile by another caller (often the listing ahead, which does not
            // go further down): this one still asks for the next level ahead.
            if subdirs_ahead {
                self.list_subdirs_ahead(dir.ino);
            }
            return Ok(());
        }
        let (since, ahead) = {
            let t = self.table.lock().unwrap();
            let listing = t.listing(dir.ino);
            let ahead = self.cfg.list_ahead_keys > 0 && listing.is_none_or(|l| l.subtree) && !t.is_big_subtree(dir.ino);
            (t.change_seq(), ahead)
        };
        let started = self.cfg.clock.now();
        let subtree = async {
            match ahead {
                true => self.list_subtree(&dir.key, self.cfg.list_ahead_keys).await.map(Some),
                false => Ok(None),
            }
        };
        let (own, subtree) = tokio::join!(self.list_children(dir), subtree);
        let template = Listing {
            at: started,
            valid_for: self.cfg.metadata_ttl,
            children: HashMap::new(),
            subtree: false,
            overtaken: false,
        };
        let mut children = match own {
            Ok(c) => c,
            Err(FsError::Store(e)) if self.serve_stale_listing(dir, &e) => return Ok(()),
            Err(e) => return Err(e),
        };
        let part = match subtree {
            Ok(Some(mut seen)) if seen.whole => {
                seen.dirs.insert(String::new(), children);
                self.install_subtree(
                    &dir.key,
                    dir.ino,
                    seen.dirs,
                    Listing { subtree: true, ..template },
                    since,
                    &seen.incomplete,
                );
                return Ok(());
            }
            Ok(part) => part,
            // Its own listing decides; the look-ahead is only a shortcut.
            Err(e) => {
                tracing::debug!(dir = %dir.key, "recursive listing failed: {e}");
                None
            }
        };
        // Files created here and not yet uploaded are part of the directory too.
        for meta in self.staged_children(dir.ino) {
            children.insert(meta.name.clone(), meta); // the mount's own state wins
        }
        tracing::debug!(dir = %dir.key, entries = children.len(), ms = self.cfg.clock.since(started).as_millis() as u64, "listed");
        if let Some(mut seen) = part.filter(|p| p.dirs.len() > p.incomplete.len() || !p.too_big.is_empty()) {
            // The directories the page held whole are listed from it (the root's own
            // listing only leads to them: it is in `incomplete`).
            seen.dirs.insert(String::new(), children.clone());
            let inos = self.install_subtree(
                &dir.key,
                dir.ino,
                seen.dirs,
                Listing { subtree: true, ..template.clone() },
                since,
                &seen.incomplete,
            );
            let mut t = self.table.lock().unwrap();
            for ino in seen.too_big.iter().filter_map(|d| inos.get(d)) {
                t.mark_big_subtree(*ino);
            }
        }
        self.table.lock().unwrap().set_listing_since(dir.ino, Listing { children, ..template }, since);
        if subdirs_ahead {
            self.list_subdirs_ahead(dir.ino);
        }
        Ok(())
    }

    /// `dir`'s children from one delimited LIST sequence.
    pub(crate) async fn list_children(&self, dir: &Node) -> Result<HashMap<String, ChildMeta>, FsError> {
        let mut children: HashMap<String, ChildMeta> = HashMap::new();
        let mut skipped = 0usize;
        let caps = self.store.capabilities();
        let mut stream = self.store.list(&dir.key, false);
        while let Some(item) = stream.next().await {
            let m = item?;
            // A key the store cannot address exactly would read another object's bytes.
            match names::child_name(&dir.key, &m.key).filter(|_| caps.addressable(&m.key)) {
                Some((name, true)) => {
                    children.insert(name.to_string(), self.child_meta(name, &m, Kind::Dir));
                }
                Some((name, false)) => {
                    // A directory shadows a file, a file a link (see SEMANTICS.md).
                    let (name, kind) = crate::links::classify(name);
                    crate::links::merge_child(&mut children, self.child_meta(name, &m, kind));
                }
                None => skipped += 1,
            }
        }
        if skipped > 0 {
            tracing::debug!(dir = %dir.key, skipped, "keys that are not valid file names are not shown");
        }
        Ok(children)
    }

    /// Snapshot a directory for one readdir sequence; offsets index into the snapshot.
    pub async fn opendir(&self, ino: u64) -> Result<u64, FsError> {
        let entries = self.dir_snapshot(ino).await?;
        let keep_cache = self.dir_cache.opened(ino, &entries);
        Ok(self.insert_handle(Handle::Dir { ino, entries, keep_cache }))
    }

    pub fn readdir(&self, fh: u64) -> Result<Arc<Vec<DirEntry>>, FsError> {
        match self.handles.lock().unwrap().get(&fh) {
            Some(Handle::Dir { entries, .. }) => Ok(entries.clone()),
            _ => Err(FsError::BadHandle),
        }
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
        let t = self.table.lock().unwrap();
        let node = match name {
            "." | ".." => t.get(ino),
            _ => t.child(dir, name).filter(|n| n.linked),
        };
        node.map(|n| self.attr(n))
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
        Arc::new(FileReader::new(
            self.store.clone(),
            self.read_cache.clone(),
            node.key.clone(),
            node.etag.clone(),
            node.identity(),
            node.size,
            self.cfg.max_prefetch,
        ))
    }

    pub fn releasedir(&self, fh: u64) {
        if let Some(Handle::Dir { ino, .. }) = self.handles.lock().unwrap().remove(&fh) {
            self.dir_cache.released(ino);
        }
    }

    /// Whether a file handle is open on `ino`.
    pub(crate) fn has_open_handle(&self, ino: u64) -> bool {
        self.handles.lock().unwrap().values().any(|h| matches!(h, Handle::File(f) if f.ino == ino))
    }

    pub(crate) fn insert_handle(&self, h: Handle) -> u64 {
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

#[cfg(test)]
#[path = "fs_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "fs_write_tests.rs"]
mod write_tests;

#[cfg(test)]
#[path = "integrity_tests.rs"]
mod integrity_tests;

#[cfg(test)]
#[path = "economy_tests.rs"]
mod economy_tests;
