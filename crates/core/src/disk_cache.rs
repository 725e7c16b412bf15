//! The on-disk block cache: object blocks kept across reads and remounts.
//!
//! Each block is one file named by a hash of (key, identity, block index); a changed object
//! has a new identity, so its old blocks are never found again and age out. The layout is
//! aligned for `O_DIRECT`: the block's bytes at offset 0, zero padding up to a multiple of
//! 4 KiB, then one 4 KiB trailer holding a magic, the format version, the block's length
//! and its CRC32C. Blocks are written and read with `O_DIRECT` straight from and into the
//! read path's pooled buffers ([`crate::block_pool`]), so caching a block costs no copy
//! into the page cache; where the file system refuses `O_DIRECT` (tmpfs) plain I/O is used.
//!
//! A block whose trailer or checksum does not match (corruption, a torn file, a file of an
//! older format) is deleted and reported as a miss, so it costs a refetch, never wrong
//! data. Writes go to a temp file that is renamed into place. The total size is bounded:
//! an in-memory index (moka, weighted by bytes on disk) evicts least-recently-used blocks
//! and deletes their files. Files left by an earlier mount are indexed at start-up (files
//! of the older `.blk` format are deleted there), so the bound holds across remounts too.

use std::fs::File;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use bytes::Bytes;

use crate::block_pool::{round_up, BlockPool, ALIGN};

/// Extension of block files in the current format.
const EXT: &str = ".b2";
/// Trailer: magic, format version (u32 LE), block length (u64 LE), CRC32C (u32 LE).
const MAGIC: &[u8; 8] = b"BFSBLOCK";
const VERSION: u32 = 2;

pub struct DiskCache {
    dir: PathBuf,
    /// file name -> size on disk; evicting an entry deletes its file.
    index: moka::sync::Cache<String, u32>,
    /// Cleared the first time the file system refuses `O_DIRECT`; plain I/O from then on.
    direct: AtomicBool,
}

fn trailer(len: usize, crc: u32) -> Vec<u8> {
    let mut t = Vec::with_capacity(24);
    t.extend_from_slice(MAGIC);
    t.extend_from_slice(&VERSION.to_le_bytes());
    t.extend_from_slice(&(len as u64).to_le_bytes());
    t.extend_from_slice(&crc.to_le_bytes());
    t
}

/// The block length and CRC a trailer records, if it is one of this format.
fn parse_trailer(t: &[u8]) -> Option<(usize, u32)> {
    if t.len() < 24 || &t[..8] != MAGIC || u32::from_le_bytes(t[8..12].try_into().ok()?) != VERSION {
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
        let evict_dir = dir.to_path_buf();
        let index = moka::sync::Cache::builder()
            .weigher(|_k: &String, v: &u32| *v)
            .max_capacity(max_bytes)
            .eviction_listener(move |name: std::sync::Arc<String>, _size, cause| {
                if cause != moka::notification::RemovalCause::Replaced {
                    let _ = std::fs::remove_file(evict_dir.join(name.as_str()));
                }
            })
            .build();
        for entry in std::fs::read_dir(dir)?.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            match entry.metadata() {
                Ok(m) if name.ends_with(EXT) => index.insert(name, m.len().min(u32::MAX as u64) as u32),
                _ => {
                    // A torn temp file from a crash, or a block of an older format.
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        Ok(Self { dir: dir.to_path_buf(), index, direct: AtomicBool::new(true) })
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
    fn open_file(&self, path: &Path, write: bool) -> std::io::Result<(File, bool)> {
        let mut o = std::fs::OpenOptions::new();
        if write {
            o.write(true).create(true).truncate(true);
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

    /// The block if it is cached and intact, read into a buffer from `pool`. Blocking file
    /// I/O: call from a blocking context.
    pub fn get(&self, key: &str, identity: &str, block: u64, pool: &BlockPool) -> Option<Bytes> {
        let name = Self::name(key, identity, block);
        let size = self.index.get(&name)? as usize;
        let path = self.dir.join(&name);
        match self.read_block(&path, size, pool) {
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
    fn read_block(&self, path: &Path, size: usize, pool: &BlockPool) -> std::io::Result<Option<Bytes>> {
        if size < ALIGN || !size.is_multiple_of(ALIGN) || size > pool.size() {
            return Ok(None);
        }
        let mut buf = pool.take();
        let (f, direct) = self.open_file(path, false)?;
        let n = match read_full(&f, &mut buf.space()[..size]) {
            Err(e) if direct && is_einval(&e) => {
                self.no_direct(&e);
                read_full(&File::open(path)?, &mut buf.space()[..size])?
            }
            r => r?,
        };
        if n != size {
            return Ok(None);
        }
        let space = buf.space();
        let Some((len, crc)) = parse_trailer(&space[size - ALIGN..size]) else { return Ok(None) };
        if round_up(len) != size - ALIGN || crc32c::crc32c(&space[..len]) != crc {
            return Ok(None);
        }
        Ok(Some(buf.into_bytes(len)))
    }

    /// Store the first `len` bytes of `padded`. When `padded` is page-aligned and exactly
    /// `len` rounded up to a page (a pooled block, zero-padded), it is written with
    /// `O_DIRECT`; otherwise with plain writes. Temp file then rename: a crash never leaves
    /// a torn block under a block's name. Blocking file I/O.
    pub fn put(&self, key: &str, identity: &str, block: u64, padded: &[u8], len: usize) {
        let name = Self::name(key, identity, block);
        let tmp = self.dir.join(format!("{name}.tmp"));
        let data_end = round_up(len);
        let write = || -> std::io::Result<()> {
            let mut tail = BlockPool::new(ALIGN, 0).take(); // one aligned page, unpooled
            let t = trailer(len, crc32c::crc32c(&padded[..len]));
            tail.space().fill(0);
            tail.space()[..t.len()].copy_from_slice(&t);
            let aligned = padded.len() == data_end && (padded.as_ptr() as usize).is_multiple_of(ALIGN);
            if aligned {
                let (f, direct) = self.open_file(&tmp, true)?;
                let r = f.write_all_at(padded, 0).and_then(|()| f.write_all_at(tail.space(), data_end as u64));
                match r {
                    Err(e) if direct && is_einval(&e) => self.no_direct(&e), // plain writes below
                    r => return r.and_then(|()| std::fs::rename(&tmp, self.dir.join(&name))),
                }
            }
            let f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
            f.write_all_at(&padded[..len], 0)?;
            f.write_all_at(tail.space(), data_end as u64)?; // the padding reads as zeros
            std::fs::rename(&tmp, self.dir.join(&name))
        };
        match write() {
            Ok(()) => self.index.insert(name, (data_end + ALIGN) as u32),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                tracing::debug!("disk cache write failed: {e}");
            }
        }
    }

    /// Bytes the cache holds (after pending evictions run).
    pub fn used_bytes(&self) -> u64 {
        self.index.run_pending_tasks();
        self.index.weighted_size()
    }

    #[cfg(test)]
    pub fn path_of(&self, key: &str, identity: &str, block: u64) -> PathBuf {
        self.dir.join(Self::name(key, identity, block))
    }
}

/// Read until `buf` is full or the file ends; the bytes read.
fn read_full(f: &File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
#[path = "disk_cache_tests.rs"]
mod tests;
