//! The on-disk block cache: object blocks kept across reads and remounts.
//!
//! Each block is one file named by a hash of (key, identity, block index); a changed object
//! has a new identity, so its old blocks are never found again and age out. A file holds
//! the block's CRC32C (4 bytes, little-endian) and then the bytes; a block whose checksum
//! does not match is deleted and reported as a miss, so corruption costs a refetch, never
//! wrong data. The total size is bounded: an in-memory index (moka, weighted by bytes)
//! evicts least-recently-used blocks and deletes their files. Files left by an earlier
//! mount are indexed at start-up, so the bound holds across remounts too.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;

pub struct DiskCache {
    dir: PathBuf,
    /// file name -> size on disk; evicting an entry deletes its file.
    index: moka::sync::Cache<String, u32>,
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
                Ok(m) if name.ends_with(".blk") => index.insert(name, m.len().min(u32::MAX as u64) as u32),
                _ => {
                    let _ = std::fs::remove_file(entry.path()); // a torn temp file from a crash
                }
            }
        }
        Ok(Self { dir: dir.to_path_buf(), index })
    }

    fn name(key: &str, identity: &str, block: u64) -> String {
        // Two independent 64-bit hashes: a collision needs both to collide.
        let h = |seed: u64| {
            let mut s = std::collections::hash_map::DefaultHasher::new();
            (seed, key, identity, block).hash(&mut s);
            s.finish()
        };
        format!("{:016x}{:016x}.blk", h(1), h(2))
    }

    /// The block if it is cached and intact. Blocking file I/O: call from a blocking context.
    pub fn get(&self, key: &str, identity: &str, block: u64) -> Option<Bytes> {
        let name = Self::name(key, identity, block);
        self.index.get(&name)?;
        let path = self.dir.join(&name);
        let raw = std::fs::read(&path).ok()?;
        if raw.len() < 4 {
            self.index.invalidate(&name);
            return None;
        }
        let (sum, data) = raw.split_at(4);
        if u32::from_le_bytes(sum.try_into().expect("4 bytes")) != crc32c::crc32c(data) {
            tracing::warn!(%key, block, "disk cache block failed its checksum; refetching");
            self.index.invalidate(&name);
            let _ = std::fs::remove_file(&path);
            return None;
        }
        Some(Bytes::copy_from_slice(data))
    }

    /// Store a block (write to a temp file, then rename: a crash never leaves a torn block).
    pub fn put(&self, key: &str, identity: &str, block: u64, data: &[u8]) {
        let name = Self::name(key, identity, block);
        let tmp = self.dir.join(format!("{name}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&crc32c::crc32c(data).to_le_bytes())?;
            f.write_all(data)?;
            std::fs::rename(&tmp, self.dir.join(&name))
        };
        match write() {
            Ok(()) => self.index.insert(name, data.len() as u32 + 4),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("bucketfs-dc-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn survives_reopen_and_detects_corruption() {
        let d = dir("reopen");
        let c = DiskCache::open(&d, 1 << 20).unwrap();
        c.put("k", "e1", 0, b"hello block");
        assert_eq!(&c.get("k", "e1", 0).unwrap()[..], b"hello block");
        assert!(c.get("k", "e2", 0).is_none(), "another identity never hits");
        drop(c);
        let c = DiskCache::open(&d, 1 << 20).unwrap();
        assert_eq!(&c.get("k", "e1", 0).unwrap()[..], b"hello block", "survives a remount");
        // Flip one byte: the checksum catches it, the block is dropped.
        let p = c.path_of("k", "e1", 0);
        let mut raw = std::fs::read(&p).unwrap();
        raw[6] ^= 0xff;
        std::fs::write(&p, raw).unwrap();
        assert!(c.get("k", "e1", 0).is_none());
        assert!(!p.exists(), "a corrupted block is deleted");
    }

    #[test]
    fn size_is_bounded() {
        let d = dir("bound");
        let c = DiskCache::open(&d, 10_000).unwrap();
        for i in 0..50 {
            c.put("k", "e", i, &[7u8; 1000]);
        }
        assert!(c.used_bytes() <= 10_000, "{}", c.used_bytes());
        let files = std::fs::read_dir(&d).unwrap().count();
        assert!(files <= 10, "{files} block files for a 10 kB cache");
    }
}
