//! The on-disk block cache: object blocks kept across reads and remounts.
//!
//! Each block is one file named by a hash of (key, identity, block index); a changed object
//! has a new identity, so its old blocks are never found again and age out. The layout is
//! aligned for `O_DIRECT`: the block's bytes at offset 0, zero padding up to a multiple of
//! 4 KiB, then one 4 KiB trailer holding a magic, the format version, the block's length,
//! its CRC32C and the file's own name. Blocks are written and read with `O_DIRECT` straight
//! from and into the read path's pooled buffers ([`crate::block_pool`]), so caching a block
//! costs no copy into the page cache; where the file system refuses `O_DIRECT` (tmpfs)
//! plain I/O is used.
//! The writer is handed the CRC32C (the read path computes it while the block streams in,
//! when its bytes are still in the CPU's cache), so a put reads no byte of the block.
//!
//! A block whose trailer or checksum does not match (corruption, a torn file, a file of an
//! older format) is deleted and reported as a miss, so it costs a refetch, never wrong
//! data. A new block is written under its own name (data first, trailer last): a file cut
//! short by a crash has no valid trailer, and is a miss. The total size is bounded: an
//! in-memory index (moka, weighted by bytes on disk) evicts least-recently-used blocks.
//! An evicted file is not deleted but kept as a spare (up to [`SPARE_MAX`] bytes of them,
//! counted in the bound): the next block of the same size is written over a spare, which
//! is then renamed to the block's name, so a full cache makes no new file (no inode, no
//! extent allocation) per block and deletes none. Files left by an earlier mount are
//! indexed at start-up (spares and files of older formats are deleted there), so the bound
//! holds across remounts too.
//!
//! Beside the blocks, the cache keeps whole-object files for the kernel to read directly
//! (FUSE passthrough): see [`whole`].

use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering::Relaxed};
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use bytes::Bytes;

pub use whole::{WholeFile, WholePin};

use crate::block_pool::{read_full, round_up, BlockPool, ALIGN};

/// Extension of block files in the current format.
const EXT: &str = ".b3";
/// Extension of spare files (evicted blocks waiting to be written over).
const SPARE_EXT: &str = ".spare";
/// Trailer: magic, format version (u32 LE), block length (u64 LE), CRC32C (u32 LE), then
/// the file's own name: a file renamed away (evicted) and written over while a reader had
/// it open can never pass for the block the reader asked for.
const MAGIC: &[u8; 8] = b"BFSBLOCK";
const VERSION: u32 = 3;
/// Bytes of spare files kept at most: as many 2 MiB blocks as the read path queues for
/// the disk at once (8), so a full cache's writers always find one. A cache smaller than
/// 16 times this keeps 1/16 of its size.
pub const SPARE_MAX: u64 = 16 * 1024 * 1024;

pub struct DiskCache {
    dir: PathBuf,
    /// file name -> size on disk; evicting an entry makes its file a spare (or deletes it).
    index: moka::sync::Cache<String, u32>,
    spares: Arc<Spares>,
    /// Cleared the first time the file system refuses `O_DIRECT`; plain I/O from then on.
    direct: AtomicBool,
    /// Whole-object files (index name -> state). Locked only briefly and never while
    /// calling into `index`, whose eviction listener takes it.
    whole: whole::WholeMap,
    /// One build at a time per whole file; a second caller waits for the first. The map is
    /// a leaf; a file's own mutex is held across its build (in a blocking task), which
    /// takes `whole` and `index` under it (lock level 5's one exception).
    building: Mutex<std::collections::HashMap<String, Arc<Mutex<()>>>>,
}

/// Evicted block files kept to be written over; their bytes count in the cache's bound.
struct Spares {
    dir: PathBuf,
    /// (path, size); at most `max` bytes in all.
    files: Mutex<Vec<(PathBuf, u32)>>,
    max: u64,
    /// Names new spares.
    seq: AtomicU64,
}

impl Spares {
    /// Keep the evicted file `name` of `size` bytes as a spare if there is room, else delete it.
    fn evicted(&self, name: &str, size: u32) {
        let path = self.dir.join(name);
        let mut files = self.files.lock().unwrap();
        let held: u64 = files.iter().map(|(_, s)| *s as u64).sum();
        if held + size as u64 <= self.max {
            let spare = self.dir.join(format!("{}{SPARE_EXT}", self.seq.fetch_add(1, Relaxed)));
            if std::fs::rename(&path, &spare).is_ok() {
                files.push((spare, size));
                return;
            }
        }
        drop(files);
        let _ = std::fs::remove_file(path);
    }

    /// A spare file of exactly `size` bytes, taken out of the list.
    fn take(&self, size: u32) -> Option<PathBuf> {
        let mut files = self.files.lock().unwrap();
        let i = files.iter().position(|(_, s)| *s == size)?;
        Some(files.swap_remove(i).0)
    }

    fn bytes(&self) -> u64 {
        self.files.lock().unwrap().iter().map(|(_, s)| *s as u64).sum()
    }
}

fn trailer(len: usize, crc: u32, name: &str) -> Vec<u8> {
    let mut t = Vec::with_capacity(24 + name.len());
    t.extend_from_slice(MAGIC);
    t.extend_from_slice(&VERSION.to_le_bytes());
    t.extend_from_slice(&(len as u64).to_le_bytes());
    t.extend_from_slice(&crc.to_le_bytes());
    t.extend_from_slice(name.as_bytes());
    t
}

/// The block length and CRC a trailer records, if it is one of this format and names `name`.
fn parse_trailer(t: &[u8], name: &str) -> Option<(usize, u32)> {
    if t.len() < 24 + name.len() || &t[..8] != MAGIC || u32::from_le_bytes(t[8..12].try_into().ok()?) != VERSION {
        return None;
    }
    if &t[24..24 + name.len()] != name.as_bytes() {
        return None;
    }
    let len = u64::from_le_bytes(t[12..20].try_into().ok()?) as usize;
    Some((len, u32::from_le_bytes(t[20..24].try_into().ok()?)))
}

fn is_einval(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

impl DiskCache {
    /// A cache in `dir` holding at most `max_bytes`; indexes what an earlier mount left.
    pub fn open(dir: &Path, max_bytes: u64) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let spare_max = SPARE_MAX.min(max_bytes / 16);
        let spares = Arc::new(Spares {
            dir: dir.to_path_buf(),
            files: Mutex::default(),
            max: spare_max,
            seq: AtomicU64::new(0),
        });
        let evict_dir = dir.to_path_buf();
        let on_evict = spares.clone();
        let whole_map = whole::WholeMap::default();
        let on_evict_whole = whole_map.clone();
        let index = moka::sync::Cache::builder()
            .weigher(|_k: &String, v: &u32| *v)
            .max_capacity(max_bytes - spare_max)
            // LRU, not moka's default TinyLFU: that rejects most new blocks once the cache is
            // full (a block read once has no frequency yet), after they were written to disk.
            .eviction_policy(moka::policy::EvictionPolicy::lru())
            .eviction_listener(move |name: Arc<String>, size, cause| {
                use moka::notification::RemovalCause;
                match cause {
                    RemovalCause::Replaced => {} // the same file, written again
                    _ if name.ends_with(whole::WHOLE_EXT) => whole::evicted(&on_evict_whole, &evict_dir, &name),
                    RemovalCause::Size => on_evict.evicted(&name, size),
                    _ => {
                        let _ = std::fs::remove_file(evict_dir.join(name.as_str()));
                    }
                }
            })
            .build();
        for entry in std::fs::read_dir(dir)?.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            match entry.metadata() {
                Ok(m) if name.ends_with(EXT) => index.insert(name, m.len().min(u32::MAX as u64) as u32),
                Ok(m) if whole::adopt(&whole_map, &name, m.len()).is_some() => {
                    let (index_name, _) = whole::parse_name(&name).expect("adopted");
                    index.insert(index_name, m.len() as u32)
                }
                _ => {
                    // A spare (maybe half written when the process ended), a temp file of
                    // an older version, or a block of an older format.
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            index,
            spares,
            direct: AtomicBool::new(true),
            whole: whole_map,
            building: Mutex::default(),
        })
    }

    fn name(key: &str, identity: &str, block: u64) -> String {
        // Two independent 64-bit hashes: a collision needs both to collide.
        let h = |seed: u64| {
            let mut s = std::collections::hash_map::DefaultHasher::new();
            (seed, key, identity, block).hash(&mut s);
            s.finish()
        };
        format!("{:016x}{:016x}{EXT}", h(1), h(2))
    }

    /// Open for reading or writing, with `O_DIRECT` while the file system takes it.
    /// `create`: a new file (or an old one truncated); otherwise an existing one written over.
    fn open_file(&self, path: &Path, write: bool, create: bool) -> std::io::Result<(File, bool)> {
        let mut o = std::fs::OpenOptions::new();
        if write {
            o.write(true).create(create).truncate(create);
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

    /// Whether the block is in the index (no I/O; [`DiskCache::get`] still checks it).
    pub fn contains(&self, key: &str, identity: &str, block: u64) -> bool {
        self.index.contains_key(&Self::name(key, identity, block))
    }

    /// The block if it is cached and intact, read into a buffer from `pool`. Blocking file
    /// I/O: call from a blocking context.
    pub fn get(&self, key: &str, identity: &str, block: u64, pool: &BlockPool) -> Option<Bytes> {
        let name = Self::name(key, identity, block);
        let size = self.index.get(&name)? as usize;
        let path = self.dir.join(&name);
        match self.read_block(&path, size, pool, &name) {
            Ok(Some(data)) => Some(data),
            Ok(None) => {
                tracing::warn!(%key, block, "disk cache block failed its checks; refetching");
                self.index.invalidate(&name);
                let _ = std::fs::remove_file(&path);
                None
            }
            Err(e) => {
                tracing::debug!(%key, block, "disk cache read failed: {e}");
                self.index.invalidate(&name);
                None
            }
        }
    }

    /// `Ok(None)`: the file is there but is not an intact block of this format.
    fn read_block(&self, path: &Path, size: usize, pool: &BlockPool, name: &str) -> std::io::Result<Option<Bytes>> {
        if size < ALIGN || !size.is_multiple_of(ALIGN) || size > pool.size() {
            return Ok(None);
        }
        let mut buf = pool.take();
        let (f, direct) = self.open_file(path, false, false)?;
        let n = match read_full(&mut &f, &mut buf.space()[..size]) {
            Err(e) if direct && is_einval(&e) => {
                self.no_direct(&e);
                read_full(&mut File::open(path)?, &mut buf.space()[..size])?
            }
            r => r?,
        };
        if n != size {
            return Ok(None);
        }
        let space = buf.space();
        let Some((len, crc)) = parse_trailer(&space[size - ALIGN..size], name) else { return Ok(None) };
        if round_up(len) != size - ALIGN || crc32c::crc32c(&space[..len]) != crc {
            return Ok(None);
        }
        Ok(Some(buf.into_bytes(len)))
    }

    /// Store the first `len` bytes of `padded`, whose CRC32C is `crc`. When `padded` is
    /// page-aligned and exactly `len` rounded up to a page (a pooled block, zero-padded), it
    /// is written with `O_DIRECT`; otherwise with plain writes. Over a spare file of the same
    /// size renamed into place when there is one, else into a new file under the block's
    /// name; data first, trailer last, so a crash never leaves a block that passes its
    /// checks with bytes it did not have. Blocking file I/O.
    pub fn put(&self, key: &str, identity: &str, block: u64, padded: &[u8], len: usize, crc: u32) {
        let name = Self::name(key, identity, block);
        let path = self.dir.join(&name);
        let data_end = round_up(len);
        let size = (data_end + ALIGN) as u32;
        let spare = self.spares.take(size);
        let target = spare.as_deref().unwrap_or(&path);
        let write = || -> std::io::Result<()> {
            let mut tail = BlockPool::new(ALIGN, 0).take(); // one aligned page, unpooled
            let t = trailer(len, crc, &name);
            tail.space().fill(0);
            tail.space()[..t.len()].copy_from_slice(&t);
            let aligned = padded.len() == data_end && (padded.as_ptr() as usize).is_multiple_of(ALIGN);
            if aligned {
                let (f, direct) = self.open_file(target, true, spare.is_none())?;
                let r = f.write_all_at(padded, 0).and_then(|()| f.write_all_at(tail.space(), data_end as u64));
                match r {
                    Err(e) if direct && is_einval(&e) => self.no_direct(&e), // plain writes below
                    r => return r,
                }
            }
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create(spare.is_none())
                .truncate(spare.is_none())
                .open(target)?;
            f.write_all_at(&padded[..len], 0)?;
            f.write_all_at(&[0; ALIGN][..data_end - len], len as u64)?; // a spare's old bytes
            f.write_all_at(tail.space(), data_end as u64)
        };
        let written = write().and_then(|()| match &spare {
            Some(s) => std::fs::rename(s, &path),
            None => Ok(()),
        });
        match written {
            Ok(()) => {
                // Settle evictions now (moka batches them): the bound holds on disk, and the
                // next writer finds the file this one pushed out as a spare.
                self.index.insert(name, size);
                self.index.run_pending_tasks();
            }
            Err(e) => {
                let _ = std::fs::remove_file(target);
                tracing::debug!("disk cache write failed: {e}");
            }
        }
    }

    /// Bytes the cache holds (after pending evictions run).
    pub fn used_bytes(&self) -> u64 {
        self.index.run_pending_tasks();
        self.index.weighted_size() + self.spares.bytes()
    }

    #[cfg(test)]
    pub fn path_of(&self, key: &str, identity: &str, block: u64) -> PathBuf {
        self.dir.join(Self::name(key, identity, block))
    }
}

#[path = "disk_cache_whole.rs"]
pub mod whole;

#[cfg(test)]
#[path = "disk_cache_tests.rs"]
mod tests;
