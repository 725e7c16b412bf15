//! The on-disk cache: one file per object version, kept across reads and remounts.
//!
//! A version (key and identity: ETag, generation, or size and mtime) has one data file,
//! `<hash>.d`, exactly the object's length from the start (sparse): each block the read
//! path fetches is written once, at its own offset, as it arrives. Beside it a small
//! sidecar, `<hash>.m`, says which blocks are there and their CRC32C: a header (magic,
//! format version, block size, object size) then one 16-byte record per block written
//! (block, length, CRC32C, and the record's own CRC32C; length 0 drops a block that failed
//! its checksum). A block is written first and
//! recorded after, so a crash leaves at worst a block that is not recorded (a miss) or a
//! torn last record (ignored); never a recorded block with bytes it did not have that the
//! checksum would not catch. The hash names (key, identity): a changed object has a new
//! identity, so its old file is never found again and ages out.
//!
//! A data file all of whose blocks are present *is* the whole object: the kernel reads it
//! directly for passthrough opens ([`whole`]), with no copy. Blocks are written with
//! `O_DIRECT` straight from the read path's pooled buffers ([`crate::block_pool`]), so
//! caching costs no copy into the page cache; where the file system refuses `O_DIRECT`
//! (tmpfs) plain I/O is used. The writer is handed each block's CRC32C (computed while the
//! block streamed in), so a put reads nothing back. Every block read back is checked
//! against its CRC32C; a failure drops that block (a refetch, never wrong data).
//!
//! The total size is bounded: an in-memory index (moka, weighted by the bytes present,
//! least-recently-used) evicts whole files. A file the kernel reads for an open handle
//! (pinned) is deleted only once its last pin goes. An object larger than the cache can
//! hold beside the pinned files is not cached at all: a sequential read of it streams
//! without writing (said once in the log). The cache also leaves a tenth of its file
//! system free, at most 1 GiB (`disk_cache_room.rs`). Files left by an earlier mount are indexed at
//! start-up (their blocks unverified until read, or checked whole before the kernel reads
//! them); files of older formats (block files, whole-object copies) are deleted there.

use crate::sync::{Arc, AtomicBool, Mutex, Ordering::Relaxed};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use bytes::Bytes;

/// Block size: 2 MiB per GET amortizes a ~20 ms round trip while keeping a random
/// reader's over-fetch (when it hits a cached neighbour) small.
pub const BLOCK: u64 = 2 * 1024 * 1024;

pub use whole::{WholeFile, WholePin};

use crate::block_pool::{round_up, BlockPool, ALIGN};

/// Extension of data files.
const DATA_EXT: &str = ".d";
/// Extension of sidecars.
const META_EXT: &str = ".m";
const MAGIC: &[u8; 8] = b"BFSCACHE";
const VERSION: u32 = 5; // 5: the header checksum covers the entry's name
const HEADER: usize = 32;
const RECORD: usize = 16;
/// Kept in the index for a sidecar and the file's metadata (KiB).
const OVERHEAD_KIB: u32 = 4;

pub struct DiskCache {
    /// An `flock` on `dir`, held while this lives: one process per directory (taken again
    /// on the directory made again after a removal).
    lock: Mutex<File>,
    /// `dir` was removed while in use and another process holds the one made since: no
    /// more files are made.
    lost: AtomicBool,
    dir: PathBuf,
    /// Bytes of a block (the read path's [`BLOCK`]; smaller in unit tests).
    block: u64,
    max_bytes: u64,
    /// Index name (the hash) -> its entry's generation and weight; evicting an entry deletes
    /// its files (or marks them evicted while pinned). Never called under `entries`' lock:
    /// its eviction listener takes that lock.
    index: crate::weighted::WeightedCache<String, Slot>,
    /// Index name -> what the sidecar says. Lock level 5: a leaf but for a pin's name.
    entries: Entries,
    /// Cleared the first time the file system refuses `O_DIRECT`; plain I/O from then on.
    direct: AtomicBool,
    /// Versions found too large to cache (so the check is made once per version); cleared
    /// when it grows past a few thousand.
    too_big: Mutex<HashSet<String>>,
    /// Whether the log has said that large objects stream uncached.
    told: AtomicBool,
    /// Whether the log has said that the file system is short of room (disk_cache_room.rs).
    told_full: AtomicBool,
}

type Entries = Arc<Mutex<HashMap<String, Entry>>>;

/// The index's value: which entry (a name created again is another one) and its weight.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Slot {
    gen: u64,
    kib: u32,
}

struct Entry {
    /// The object's length (the data file's).
    size: u64,
    /// Each block's CRC32C, if the block is in the data file.
    crcs: Vec<Option<u32>>,
    /// Blocks present and their bytes.
    present: u64,
    bytes: u64,
    /// Every present block was written by this process or checked since it started.
    checked: bool,
    /// Out of the index while pinned: deleted at the last unpin.
    evicted: bool,
    /// Block writes under way into the data file ([`DiskCache::put`]): it is not handed to
    /// a writer meanwhile, or a late write of the old bytes would land over the writer's.
    writing: u32,
    gen: u64,
    pin: Arc<whole::Pins>,
    /// The data file as it was once whole and intact ([`Stamp`]); another stamp at a
    /// hand-over to the kernel means it changed since, and it is checked again.
    stamp: Option<Stamp>,
}

/// What a data file's metadata tells of its bytes: length, mtime, inode and ctime (in
/// nanoseconds). A write to it from outside this process (by hand, another program)
/// changes it, also one whose mtime was set back after (`touch -r`: tester C), since
/// nothing sets a ctime back; so does a rename (the cache stamps its own again).
pub(super) type Stamp = (u64, std::time::SystemTime, u64, i128);

pub(super) fn stamp_of(m: &std::fs::Metadata) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let ctime = i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec());
    (m.len(), m.modified().unwrap_or(std::time::UNIX_EPOCH), m.ino(), ctime)
}

impl Entry {
    fn complete(&self) -> bool {
        self.present == self.crcs.len() as u64
    }

    fn slot(&self) -> Slot {
        Slot { gen: self.gen, kib: (self.bytes.div_ceil(1024)).min(u32::MAX as u64 - 8) as u32 + OVERHEAD_KIB }
    }
}

/// Directories a cache may use besides the one it is given (see [`lock_slot`]).
const SLOTS: usize = 16;

/// `dir`, or the first `dir/mount-N` no other process holds, locked for this one. A data
/// file is written in place, so two processes sharing one would cut each other's files
/// (two mounts of one bucket share its default cache directory). Files in a slot no process
/// holds are an earlier mount's: the next mount to take the slot uses them.
fn lock_slot(dir: &Path) -> std::io::Result<(PathBuf, File)> {
    use std::os::fd::AsRawFd;
    for n in 0..SLOTS {
        let path = if n == 0 { dir.to_path_buf() } else { dir.join(format!("mount-{n}")) };
        std::fs::create_dir_all(&path)?;
        let f = File::open(&path)?;
        // SAFETY: flock on a descriptor we own; released when it closes.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            if n > 0 {
                tracing::info!(
                    "disk cache {} is in use by another bucketfs process; this one uses {}",
                    dir.display(),
                    path.display()
                );
            }
            return Ok((path, f));
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(e);
        }
    }
    Err(std::io::Error::other(format!(
        "{SLOTS} bucketfs processes use the disk cache {} already; give this mount its own --cache-dir",
        dir.display()
    )))
}

/// Whether `file` is a name a disk cache writes, in this layout or an older one: 32
/// lowercase hex digits (an object version's hash) and a known ending, or a numbered spare
/// block. Endings: data and sidecar (`.d`, `.m`); the layouts before: blocks (`.blk`,
/// `.b2`, `.b3`), whole files (`.w`, `.<crc>.w`), their temporaries (`.tmp` after any).
fn is_cache_file(file: &str) -> bool {
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if let Some(n) = file.strip_suffix(".spare") {
        return !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    }
    let Some((hash, rest)) = file.split_at_checked(32) else { return false };
    let rest = rest.strip_suffix(".tmp").map_or(rest, |r| if r.is_empty() { ".tmp" } else { r });
    let rest = match rest.strip_suffix(".w") {
        Some(crc) if crc.len() == 9 && crc.starts_with('.') && hex(&crc[1..]) => ".w",
        _ => rest,
    };
    hex(hash) && matches!(rest, ".d" | ".m" | ".blk" | ".b2" | ".b3" | ".w" | ".tmp")
}

fn next_gen() -> u64 {
    // A plain counter (std's even under shuttle: a static needs a const constructor).
    static GEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    GEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn is_einval(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

/// A sidecar's header for entry `name` (the hash of its key and version): its checksum
/// covers the name too, so a sidecar and data file under another entry's name (copied or
/// renamed by hand) are dropped at start-up, never served as that object's bytes (tester M:
/// two objects' pairs swapped were each read as the other).
fn header(block: u64, size: u64, name: &str) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..20].copy_from_slice(&block.to_le_bytes());
    h[20..28].copy_from_slice(&size.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h[..28]), name.as_bytes());
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

fn record(b: u64, len: u64, crc: u32) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    r[..4].copy_from_slice(&(b as u32).to_le_bytes());
    r[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    r[8..12].copy_from_slice(&crc.to_le_bytes());
    let own = crc32c::crc32c(&r[..12]);
    r[12..16].copy_from_slice(&own.to_le_bytes());
    r
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

/// Read into `buf` at `at` until it is full or the file ends; the bytes read.
fn read_full_at(f: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl DiskCache {
    /// A cache in `dir` holding at most `max_bytes`; indexes what an earlier mount left.
    pub fn open(dir: &Path, max_bytes: u64) -> std::io::Result<Self> {
        Self::with_block(dir, max_bytes, BLOCK)
    }

    /// As [`DiskCache::open`], with blocks of `block` bytes (a multiple of 4 KiB).
    pub(crate) fn with_block(dir: &Path, max_bytes: u64, block: u64) -> std::io::Result<Self> {
        assert!(block > 0 && block.is_multiple_of(ALIGN as u64));
        let (dir, lock) = lock_slot(dir)?;
        let dir = dir.as_path();
        let entries = Entries::default();
        let (on_evict, evict_dir) = (entries.clone(), dir.to_path_buf());
        let index = moka::sync::Cache::builder()
            .weigher(|_k: &String, v: &Slot| v.kib)
            .max_capacity(max_bytes / 1024)
            // LRU, not moka's default TinyLFU: that rejects most new files once the cache is
            // full (a file read once has no frequency yet), after they were written to disk.
            .eviction_policy(moka::policy::EvictionPolicy::lru())
            .eviction_listener(move |name: Arc<String>, slot: Slot, cause| {
                if cause != moka::notification::RemovalCause::Replaced {
                    evicted(&on_evict, &evict_dir, &name, slot.gen);
                }
            })
            .build();
        let index = crate::weighted::WeightedCache::new(index);
        let c = Self {
            lock: Mutex::new(lock),
            lost: AtomicBool::new(false),
            dir: dir.to_path_buf(),
            block,
            max_bytes,
            index,
            entries,
            direct: AtomicBool::new(true),
            too_big: Mutex::default(),
            told: AtomicBool::new(false),
            told_full: AtomicBool::new(false),
        };
        c.adopt_all()?;
        c.room_for(0); // what an earlier mount left may fill the disk
        c.index.run_pending_tasks();
        Ok(c)
    }

    /// At start-up: index the files an earlier mount left; delete the rest of what a cache
    /// writes (files of older formats, a data file without its sidecar, a sidecar that does
    /// not parse). Nothing else: `--cache-dir` may name a directory of the user's own files
    /// (every file in it was deleted).
    fn adopt_all(&self) -> std::io::Result<()> {
        let mut keep = HashSet::new();
        for entry in std::fs::read_dir(&self.dir)?.flatten() {
            let file = entry.file_name().to_string_lossy().to_string();
            let Some(name) = file.strip_suffix(META_EXT) else { continue };
            match self.load(name) {
                Some(e) => {
                    let slot = e.slot();
                    self.entries.lock().unwrap().insert(name.to_string(), e);
                    self.index.insert(name.to_string(), slot);
                    keep.insert(name.to_string());
                }
                None => tracing::debug!(file, "disk cache: sidecar unusable; dropped"),
            }
        }
        for entry in std::fs::read_dir(&self.dir)?.flatten() {
            let file = entry.file_name().to_string_lossy().to_string();
            let name = file.strip_suffix(META_EXT).or_else(|| file.strip_suffix(DATA_EXT));
            if !name.is_some_and(|n| keep.contains(n)) && is_cache_file(&file) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        self.index.run_pending_tasks();
        Ok(())
    }

    /// The entry a sidecar and its data file describe (blocks unverified).
    fn load(&self, name: &str) -> Option<Entry> {
        let meta = std::fs::read(self.dir.join(format!("{name}{META_EXT}"))).ok()?;
        let h = meta.get(..HEADER)?;
        let size = le64(&h[20..]);
        if h != header(self.block, size, name) {
            return None; // another format or block size, or damaged
        }
        if std::fs::metadata(self.dir.join(format!("{name}{DATA_EXT}"))).ok()?.len() != size {
            return None;
        }
        let mut e = self.new_entry(size);
        e.checked = false;
        let mut good = HEADER;
        for r in meta[HEADER..].chunks_exact(RECORD) {
            if le32(&r[12..]) != crc32c::crc32c(&r[..12]) {
                break; // torn at a crash: the records after it were never written
            }
            good += RECORD;
            let (b, len) = (le32(r) as u64, le32(&r[4..]) as u64);
            if b >= e.crcs.len() as u64 {
                continue;
            }
            if len == self.block_len(size, b) {
                e.record(b, len, le32(&r[8..]));
            } else if len == 0 && e.crcs[b as usize].take().is_some() {
                // Dropped after failing its checksum.
                e.present -= 1;
                e.bytes -= self.block_len(size, b);
            }
        }
        if meta.len() > good {
            // Cut the torn tail, so the records appended from now on follow the good ones
            // (after it, they would be misaligned and lost at every later start-up).
            let cut = std::fs::OpenOptions::new().write(true).open(self.meta_path(name));
            cut.and_then(|f| f.set_len(good as u64)).ok()?;
        }
        (e.present > 0).then_some(e)
    }

    fn new_entry(&self, size: u64) -> Entry {
        let pin = Arc::new(whole::Pins::default());
        let crcs = vec![None; size.div_ceil(self.block) as usize];
        let gen = next_gen();
        Entry { size, crcs, present: 0, bytes: 0, checked: true, evicted: false, writing: 0, gen, pin, stamp: None }
    }

    fn block_len(&self, size: u64, b: u64) -> u64 {
        ((b + 1) * self.block).min(size).saturating_sub(b * self.block)
    }

    fn name(key: &str, identity: &str) -> String {
        // Two independent 64-bit hashes: a collision needs both to collide.
        let h = |seed: u64| {
            let mut s = std::collections::hash_map::DefaultHasher::new();
            (seed, key, identity).hash(&mut s);
            s.finish()
        };
        format!("{:016x}{:016x}", h(1), h(2))
    }

    fn data_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}{DATA_EXT}"))
    }

    fn meta_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}{META_EXT}"))
    }

    /// Open the data file for reading or writing, with `O_DIRECT` while the file system
    /// takes it; the flag says whether it did.
    fn open_data(&self, path: &Path, write: bool) -> std::io::Result<(File, bool)> {
        let mut o = std::fs::OpenOptions::new();
        if write {
            o.write(true);
        } else {
            o.read(true);
        }
        if self.direct.load(Relaxed) {
            match o.clone().custom_flags(libc::O_DIRECT).open(path) {
                Ok(f) => return Ok((f, true)),
                Err(e) if is_einval(&e) => self.no_direct(&e),
                Err(e) => return Err(e),
            }
        }
        Ok((o.open(path)?, false))
    }

    fn no_direct(&self, e: &std::io::Error) {
        if self.direct.swap(false, Relaxed) {
            tracing::debug!("disk cache: O_DIRECT refused ({e}); using buffered I/O");
        }
    }

    /// Whether the block is cached (no I/O; [`DiskCache::get`] still checks it).
    pub fn contains(&self, key: &str, identity: &str, block: u64) -> bool {
        let m = self.entries.lock().unwrap();
        m.get(&Self::name(key, identity))
            .is_some_and(|e| !e.evicted && e.crcs.get(block as usize).is_some_and(Option::is_some))
    }

    /// Whether every block of the version (`size` bytes) is cached. No I/O.
    /// How many blocks of the version are not on disk (all of them if none is).
    pub fn missing_blocks(&self, key: &str, identity: &str, size: u64) -> u64 {
        let m = self.entries.lock().unwrap();
        match m.get(&Self::name(key, identity)).filter(|e| !e.evicted && e.size == size) {
            Some(e) => e.crcs.len() as u64 - e.present,
            None => size.div_ceil(self.block),
        }
    }

    pub fn is_complete(&self, key: &str, identity: &str, size: u64) -> bool {
        let m = self.entries.lock().unwrap();
        m.get(&Self::name(key, identity)).is_some_and(|e| !e.evicted && e.size == size && e.complete())
    }

    /// The block if it is cached and intact, read into a buffer from `pool`. Blocking file
    /// I/O: call from a blocking context.
    pub fn get(&self, key: &str, identity: &str, block: u64, pool: &BlockPool) -> Option<Bytes> {
        let name = Self::name(key, identity);
        let (len, crc, gen) = {
            let m = self.entries.lock().unwrap();
            let e = m.get(&name).filter(|e| !e.evicted)?;
            (self.block_len(e.size, block) as usize, (*e.crcs.get(block as usize)?)?, e.gen)
        };
        self.index.get(&name); // marks it recently used
        match self.read_block(&name, block, len, pool) {
            Ok(data) if crc32c::crc32c(&data) == crc => Some(data),
            Ok(_) => {
                tracing::warn!(%key, block, "disk cache block failed its checksum; it is fetched again");
                self.drop_block(&name, gen, block);
                None
            }
            Err(e) => {
                tracing::debug!(%key, block, "disk cache read failed: {e}");
                self.index.invalidate(&name);
                None
            }
        }
    }

    fn read_block(&self, name: &str, block: u64, len: usize, pool: &BlockPool) -> std::io::Result<Bytes> {
        let size = round_up(len);
        if size > pool.size() {
            return Err(std::io::Error::other("block larger than the pool's buffers"));
        }
        let (path, at) = (self.data_path(name), block * self.block);
        let mut buf = pool.take();
        let (f, direct) = self.open_data(&path, false)?;
        let n = match read_full_at(&f, &mut buf.space()[..size], at) {
            Err(e) if direct && is_einval(&e) => {
                self.no_direct(&e);
                read_full_at(&File::open(&path)?, &mut buf.space()[..size], at)?
            }
            r => r?,
        };
        if n < len {
            return Err(std::io::Error::other("data file shorter than its sidecar says"));
        }
        Ok(buf.into_bytes(len))
    }

    /// Store block `block` of the version (`size` bytes): the first `len` bytes of `padded`,
    /// whose CRC32C is `crc`. `padded` is written with `O_DIRECT` when it is page-aligned and
    /// exactly `len` rounded up to a page (a pooled block, zero-padded) and that stays inside
    /// the file; otherwise with a plain write. Nothing is done for a block already cached,
    /// or a version too large to cache. Blocking file I/O.
    #[allow(clippy::too_many_arguments)]
    pub fn put(&self, key: &str, identity: &str, size: u64, block: u64, padded: &[u8], len: usize, crc: u32) {
        if len as u64 != self.block_len(size, block) || len == 0 || padded.len() < len {
            return;
        }
        if !self.contains(key, identity, block) && !self.room_for(len as u64) {
            return;
        }
        let name = Self::name(key, identity);
        let Some(gen) = self.entry_for(&name, key, size, block) else { return };
        let written = self.write_block(&name, block * self.block, padded, len);
        let slot = {
            let mut m = self.entries.lock().unwrap();
            let mut entry = m.get_mut(&name).filter(|e| e.gen == gen);
            if let Some(e) = &mut entry {
                e.writing -= 1;
            }
            match (entry, written) {
                (Some(e), Ok(())) => {
                    if e.crcs[block as usize].is_none() {
                        e.record(block, len as u64, crc);
                        self.append_record(&name, block, len as u64, crc);
                    }
                    if e.complete() && e.writing == 0 && e.checked {
                        // Whole, every block written here: as the kernel may be given it.
                        e.stamp = std::fs::metadata(self.data_path(&name)).ok().map(|m| stamp_of(&m));
                    }
                    Some(e.slot())
                }
                (Some(e), Err(err)) => {
                    tracing::debug!("disk cache write failed: {err}");
                    if e.present == 0 {
                        // Never indexed: nothing else would delete it.
                        let e = m.remove(&name).expect("found above");
                        self.delete_files(&name, &e);
                    }
                    None
                }
                // Evicted or replaced meanwhile: the write went to a deleted file, or into
                // a file that has this block already.
                (None, _) => None,
            }
        };
        if let Some(slot) = slot {
            self.index_current(&name, slot);
        }
        // Settle evictions now (moka batches them): the bound holds on disk.
        self.index.run_pending_tasks();
    }

    /// The generation of `name`'s entry, created (an empty sparse file and a sidecar) if
    /// there is none; `None` if the block is there already, or the version is not cached.
    fn entry_for(&self, name: &str, key: &str, size: u64, block: u64) -> Option<u64> {
        let mut m = self.entries.lock().unwrap();
        if let Some(e) = m.get_mut(name).filter(|e| e.size == size) {
            let missing = e.crcs[block as usize].is_none().then_some(e.gen);
            e.writing += u32::from(missing.is_some());
            if std::mem::replace(&mut e.evicted, false) {
                // Evicted while pinned, and read again: back in the index.
                let slot = e.slot();
                drop(m);
                self.index.insert(name.to_string(), slot);
            }
            return missing;
        }
        if self.too_big.lock().unwrap().contains(name) || self.lost.load(Relaxed) {
            return None;
        }
        // What pinned files hold counts against the room only for objects large next to
        // the cache (the sum walks every entry).
        let pinned = || m.values().filter(|e| e.pin.count() > 0).map(|e| e.bytes).sum::<u64>();
        let room = if size > self.max_bytes / 16 { self.max_bytes.saturating_sub(pinned()) } else { self.max_bytes };
        if size > room / 4 * 3 {
            drop(m);
            self.stream_uncached(name, key, size, room);
            return None;
        }
        if m.get(name).is_some_and(|e| e.pin.count() > 0) {
            return None; // another size under a name the kernel reads: left alone
        }
        if let Some(old) = m.remove(name) {
            // Another size under the same name (a hash collision).
            drop(m);
            self.index.invalidate(name);
            self.delete_files(name, &old);
            m = self.entries.lock().unwrap();
        }
        let create = || {
            File::create(self.data_path(name))
                .and_then(|f| f.set_len(size))
                .and_then(|()| std::fs::write(self.meta_path(name), header(self.block, size, name)))
        };
        let mut created = create();
        if created.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) && !self.dir.exists() {
            // The directory was removed while mounted (by hand, a cleanup job): caching
            // stopped for the mount's life, and `status` kept counting files gone (tester
            // C). Made again, with what it held forgotten.
            tracing::warn!(dir = %self.dir.display(), "disk cache directory removed while mounted; made again, empty");
            drop(m);
            self.forget_all_unpinned();
            created = self.make_dir_again().and_then(|()| create());
            m = self.entries.lock().unwrap();
        }
        if let Err(e) = created {
            tracing::debug!("disk cache file not created: {e}");
            let _ = std::fs::remove_file(self.data_path(name));
            return None;
        }
        let mut e = self.new_entry(size);
        e.writing = 1;
        let gen = e.gen;
        m.insert(name.to_string(), e);
        Some(gen)
    }

    /// `dir` again, locked as [`lock_slot`] locks it; if another process made it its own
    /// meanwhile, no more files are made here.
    fn make_dir_again(&self) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        // One thread at a time: two readers found the directory gone at once, and the
        // second one's lock failed against the first one's, our own (tester M: caching
        // then stopped for good, "taken by another process").
        let mut held = self.lock.lock().unwrap();
        std::fs::create_dir_all(&self.dir)?;
        let f = File::open(&self.dir)?;
        let id = |f: &File| f.metadata().map(|m| (m.dev(), m.ino())).ok();
        if id(&held).is_some() && id(&held) == id(&f) {
            return Ok(()); // made again by another thread already, and locked
        }
        // SAFETY: flock on a descriptor we own; released when it closes.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            self.lost.store(true, Relaxed);
            tracing::warn!(dir = %self.dir.display(), "disk cache directory taken by another process; no more caching on disk");
            return Err(e);
        }
        *held = f;
        Ok(())
    }

    /// Forget every entry no reader holds (their files are gone).
    fn forget_all_unpinned(&self) {
        let names: Vec<String> = {
            let mut m = self.entries.lock().unwrap();
            let names: Vec<String> = m.iter().filter(|(_, e)| e.pin.count() == 0).map(|(n, _)| n.clone()).collect();
            for n in &names {
                m.remove(n);
            }
            names
        };
        for n in names {
            self.index.invalidate(&n);
        }
        self.index.run_pending_tasks();
    }

    /// Forget block `block` of `name`'s entry (generation `gen`): in memory, and in the
    /// sidecar with a record of length 0, so a remount does not serve it either.
    fn drop_block(&self, name: &str, gen: u64, block: u64) {
        let slot = {
            let mut m = self.entries.lock().unwrap();
            let Some(e) = m.get_mut(name).filter(|e| e.gen == gen) else { return };
            if e.crcs[block as usize].take().is_none() {
                return;
            }
            e.present -= 1;
            e.bytes -= self.block_len(e.size, block);
            self.append_record(name, block, 0, 0);
            e.slot()
        };
        self.index_current(name, slot);
    }

    /// Index `name` with `slot`, read from its entry under the entries' lock, or the newer
    /// one the entry has by then. The index is written after that lock is let go (its
    /// eviction listener takes it), so two writers of one file's blocks could index in the
    /// other order and leave the smaller size counted (seen: a file's last block missing
    /// from `used_bytes`): inserted again until what was inserted is still the entry's.
    fn index_current(&self, name: &str, mut slot: Slot) {
        loop {
            self.index.insert(name.to_string(), slot);
            // (A newer entry of the name, made meanwhile, gets its own slot back.)
            let now = self.entries.lock().unwrap().get(name).map(Entry::slot);
            match now {
                Some(s) if s != slot => slot = s,
                _ => return,
            }
        }
    }

    fn append_record(&self, name: &str, block: u64, len: u64, crc: u32) {
        let r = std::fs::OpenOptions::new().append(true).open(self.meta_path(name));
        if let Err(e) = r.and_then(|mut f| std::io::Write::write_all(&mut f, &record(block, len, crc))) {
            tracing::debug!("disk cache sidecar not written: {e}");
        }
    }

    fn stream_uncached(&self, name: &str, key: &str, size: u64, room: u64) {
        let mut big = self.too_big.lock().unwrap();
        if big.len() > 4096 {
            big.clear();
        }
        big.insert(name.to_string());
        drop(big);
        let mib = |b: u64| b / (1024 * 1024);
        if !self.told.swap(true, Relaxed) {
            tracing::info!(
                %key,
                "disk cache: objects over 3/4 of its free room ({} MiB of {} MiB) are read without \
                 caching them on disk (this one is {} MiB); raise --disk-cache-mib to keep them",
                mib(room),
                mib(self.max_bytes),
                mib(size)
            );
        } else {
            tracing::debug!(%key, size, "disk cache: too large to cache; streamed");
        }
    }

    fn write_block(&self, name: &str, at: u64, padded: &[u8], len: usize) -> std::io::Result<()> {
        let path = self.data_path(name);
        let end = round_up(len);
        let aligned = padded.len() == end && (padded.as_ptr() as usize).is_multiple_of(ALIGN);
        if aligned && end == len {
            let (f, direct) = self.open_data(&path, true)?;
            match f.write_all_at(padded, at) {
                Err(e) if direct && is_einval(&e) => self.no_direct(&e), // a plain write below
                r => return r,
            }
        }
        // A short last block (its padding would pass the object's end), or unaligned bytes.
        std::fs::OpenOptions::new().write(true).open(&path)?.write_all_at(&padded[..len], at)
    }

    fn delete_files(&self, name: &str, e: &Entry) {
        if e.pin.count() == 0 {
            let _ = std::fs::remove_file(self.data_path(name));
            let _ = std::fs::remove_file(self.meta_path(name));
        }
    }

    /// Bytes the cache holds (after pending evictions run).
    pub fn used_bytes(&self) -> u64 {
        self.index.run_pending_tasks();
        self.index.weighted_size() * 1024
    }

    #[cfg(test)]
    pub fn path_of(&self, key: &str, identity: &str) -> PathBuf {
        self.data_path(&Self::name(key, identity))
    }
}

impl Entry {
    fn record(&mut self, b: u64, len: u64, crc: u32) {
        if self.crcs[b as usize].replace(crc).is_none() {
            self.present += 1;
            self.bytes += len;
        }
    }
}

/// The index dropped `name` (evicted, or invalidated after a failed check): delete its
/// files, unless a pin holds them (then at the last unpin) or the entry is another one.
fn evicted(entries: &Entries, dir: &Path, name: &str, gen: u64) {
    let mut m = entries.lock().unwrap();
    let Some(e) = m.get_mut(name).filter(|e| e.gen == gen) else { return };
    if e.pin.count() > 0 {
        e.evicted = true;
        return;
    }
    m.remove(name);
    drop(m);
    let _ = std::fs::remove_file(dir.join(format!("{name}{DATA_EXT}")));
    let _ = std::fs::remove_file(dir.join(format!("{name}{META_EXT}")));
}

#[path = "disk_cache_whole.rs"]
pub mod whole;

#[path = "disk_cache_room.rs"]
pub(crate) mod room;

#[cfg(test)]
#[path = "disk_cache_tests.rs"]
mod tests;
