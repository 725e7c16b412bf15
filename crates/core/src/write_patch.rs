//! Uploads that send only what changed (see [`bucketfs_store::Store::patch`]).
//!
//! A staged file remembers the version the bucket holds of it as this mount last stored or
//! read it ([`Stored`]): its identity, its length and the crc32c of each 1 MiB block, taken
//! from the very bytes that were sent or fetched. At the next upload the blocks of the staged
//! file are read back and compared with those sums; the blocks that match are kept in the
//! store (S3 `UploadPartCopy`, GCS `compose`) and only the rest is sent, with the store's
//! precondition on that identity, so the result is always one whole version: the old bytes
//! where nothing changed and the new bytes elsewhere, never a mix with another writer's.
//!
//! Comparing sums, rather than tracking writes, also covers what the kernel writes unseen
//! (FUSE passthrough). The cost is a local read of the stored length at each upload, far
//! below sending it. The sums of a new version are rebuilt from the kept blocks' sums and
//! the sent bytes' own ([`Sums`]), combined with `crc32c_combine` where a block is part kept,
//! part sent (an append that does not end on a block boundary).

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use bucketfs_store::{PutOpts, Store, StoreErrorKind, WriteOptions};
use bytes::Bytes;

use super::local;
use crate::FsError;

/// The unit of comparison: small enough that an edit sends little, large enough that the
/// sums of a 1 TiB file fit in 8 MiB. (Unit tests use 4 KiB, so their files stay small.)
#[cfg(not(test))]
pub const BLOCK: u64 = 1024 * 1024;
#[cfg(test)]
pub const BLOCK: u64 = 4096;

/// Smallest stored version worth patching: below it one request sends the whole file.
#[cfg(not(test))]
pub const MIN_PATCH: u64 = bucketfs_store::patch::MIN_PART;
#[cfg(test)]
pub const MIN_PATCH: u64 = 5 * BLOCK;

/// The version the bucket holds under `key`, as this mount last stored or read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub key: String,
    /// ETag, or generation on GCS.
    pub identity: String,
    pub len: u64,
    /// Uploads it was assembled from, if known (GCS components).
    pub pieces: Option<u32>,
    /// crc32c of each [`BLOCK`] (the last may be shorter); `None` where not known.
    pub sums: Vec<Option<u32>>,
}

impl Stored {
    /// The ranges of `file` (now `size` bytes) that still hold this version's bytes: whole
    /// blocks whose sums match, merged.
    pub fn kept(&self, file: &File, size: u64) -> std::io::Result<Vec<Range<u64>>> {
        let mut kept: Vec<Range<u64>> = Vec::new();
        let mut buf = vec![0u8; BLOCK as usize];
        for (i, sum) in self.sums.iter().enumerate() {
            let start = i as u64 * BLOCK;
            let end = (start + BLOCK).min(self.len);
            let Some(sum) = sum else { continue };
            if end > size {
                break;
            }
            let b = &mut buf[..(end - start) as usize];
            file.read_exact_at(b, start)?;
            if crc32c::crc32c(b) != *sum {
                continue;
            }
            match kept.last_mut() {
                Some(last) if last.end == start => last.end = end,
                _ => kept.push(start..end),
            }
        }
        Ok(kept)
    }

    /// Seed `sums` with the blocks of this version that `kept` keeps.
    pub fn keep_into(&self, kept: &[Range<u64>], sums: &mut Sums) {
        for r in kept {
            let mut start = r.start;
            while start < r.end {
                let i = (start / BLOCK) as usize;
                let end = (start + BLOCK).min(self.len);
                if let Some(Some(sum)) = self.sums.get(i).filter(|_| start % BLOCK == 0 && end <= r.end) {
                    sums.insert(start, end - start, *sum);
                }
                start = end;
            }
        }
    }
}

/// crc32c of the bytes of a version, recorded as they are sent or read, in pieces that never
/// cross a block boundary; [`Sums::finish`] makes each block's sum.
#[derive(Default, Debug)]
pub struct Sums {
    /// start -> (length, crc32c)
    segs: BTreeMap<u64, (u64, u32)>,
}

impl Sums {
    /// `buf` holds the version's bytes at `off`.
    pub fn record(&mut self, off: u64, buf: &[u8]) {
        let mut at = 0usize;
        while at < buf.len() {
            let start = off + at as u64;
            let next = (start / BLOCK + 1) * BLOCK;
            let n = ((next - start) as usize).min(buf.len() - at);
            self.insert(start, n as u64, crc32c::crc32c(&buf[at..at + n]));
            at += n;
        }
    }

    fn insert(&mut self, start: u64, len: u64, crc: u32) {
        self.segs.insert(start, (len, crc));
    }

    /// Lay `other`'s pieces over these: where both saw the same bytes (a kept block the
    /// store sent after all), what was sent is what the version holds.
    pub fn overlay(&mut self, other: Sums) {
        for (start, (len, crc)) in other.segs {
            let end = start + len;
            let before = self.segs.range(..start).next_back().filter(|(s, (n, _))| **s + *n > start).map(|(s, _)| *s);
            let inside: Vec<u64> = self.segs.range(start..end).map(|(s, _)| *s).collect();
            for s in before.into_iter().chain(inside) {
                self.segs.remove(&s);
            }
            self.insert(start, len, crc);
        }
    }

    /// Each block's sum of a `len`-byte version, `None` where its bytes were not all seen.
    pub fn finish(&self, len: u64) -> Vec<Option<u32>> {
        (0..len.div_ceil(BLOCK))
            .map(|i| {
                let (start, end) = (i * BLOCK, ((i + 1) * BLOCK).min(len));
                let mut at = start;
                let mut crc: Option<u32> = None;
                while at < end {
                    let (n, c) = *self.segs.get(&at)?;
                    crc = Some(match crc {
                        None => c,
                        Some(prev) => crc32c::crc32c_combine(prev, c, n as usize),
                    });
                    at += n;
                }
                crc.filter(|_| at == end)
            })
            .collect()
    }
}

/// The staged file as the source of a patch, recording the sums of what the store reads.
pub struct Source<'a> {
    pub file: &'a File,
    pub sums: std::sync::Mutex<Sums>,
}

impl bucketfs_store::PatchSource for Source<'_> {
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Bytes> {
        let mut buf = vec![0u8; len];
        self.file.read_exact_at(&mut buf, offset)?;
        self.sums.lock().unwrap_or_else(|e| e.into_inner()).record(offset, &buf);
        Ok(buf.into())
    }
}

/// The staged file's side of it: what it remembers, and the upload of what changed.
impl super::Staged {
    /// The staged file holds exactly the version `etag` of `key` (taken over from the disk
    /// cache): remember it, with its blocks' sums read from the file, so the first upload
    /// sends only what changed. Costs a local read of the file.
    pub fn remember_stored(&mut self, key: &str, etag: &str) -> Result<(), FsError> {
        const CHUNK: usize = 8 * 1024 * 1024;
        let mut sums = Sums::default();
        let mut buf = vec![0u8; CHUNK];
        let mut off = 0;
        while off < self.size {
            let n = (CHUNK as u64).min(self.size - off) as usize;
            self.file.read_exact_at(&mut buf[..n], off).map_err(local)?;
            sums.record(off, &buf[..n]);
            off += n as u64;
        }
        let (len, sums) = (self.size, sums.finish(self.size));
        self.stored = Some(Stored { key: key.to_string(), identity: etag.to_string(), len, pieces: None, sums });
        Ok(())
    }

    /// Whether an upload to `key` may patch the version the bucket holds ([`Store::patch`]).
    pub(super) fn patchable(&self, store: &dyn Store, key: &str) -> bool {
        !self.create_only
            && store.capabilities().patches
            && self.stored.as_ref().is_some_and(|s| s.key == key && s.len >= MIN_PATCH)
    }

    /// Send only what changed since the stored version, recording the new version's sums;
    /// `None` where a whole upload is the way (nothing worth keeping, the store cannot, or
    /// the version changed: then the last upload wins, as with any upload).
    pub(super) async fn patch(
        &mut self,
        store: &dyn Store,
        key: &str,
        opts: &WriteOptions,
        put: PutOpts,
        sums: &mut Sums,
    ) -> Option<Result<bucketfs_store::Patched, FsError>> {
        if !self.patchable(store, key) {
            return None;
        }
        let stored = self.stored.clone()?;
        let t0 = std::time::Instant::now();
        let kept = match stored.kept(&self.file, self.size) {
            Ok(k) => k,
            Err(e) => return Some(Err(local(e))),
        };
        let keep: u64 = kept.iter().map(|r| r.end - r.start).sum();
        let compare_ms = t0.elapsed().as_millis() as u64;
        tracing::debug!(key, compared = stored.len, compare_ms, keep, size = self.size, "upload of what changed");
        if keep < MIN_PATCH {
            return None;
        }
        let _share = self.budget.upload(self.size - keep, opts).await;
        let source = Source { file: &self.file, sums: Default::default() };
        let p = bucketfs_store::Patch {
            base: &stored.identity,
            base_len: stored.len,
            base_pieces: stored.pieces,
            len: self.size,
            kept: &kept,
            source: &source,
            put,
        };
        match store.patch(key, p, opts.clone()).await {
            Ok(done) => {
                stored.keep_into(&kept, sums);
                sums.overlay(source.sums.into_inner().unwrap_or_else(|e| e.into_inner()));
                Some(Ok(done))
            }
            Err(e) if matches!(e.kind, StoreErrorKind::Unavailable | StoreErrorKind::RateLimited) => {
                Some(Err(e.into()))
            }
            Err(e) => {
                if e.kind != StoreErrorKind::Unsupported {
                    tracing::info!(key, "uploading the whole file: {e}");
                }
                self.stored = None;
                None
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // one kept range is the usual case
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    fn stored_of(data: &[u8]) -> Stored {
        let mut s = Sums::default();
        // Recorded in uneven pieces, as parts and reads come.
        let mut at = 0;
        for n in [3usize, 1 << 20, 777_777, 5 << 20].iter().cycle() {
            if at >= data.len() {
                break;
            }
            let end = (at + n).min(data.len());
            s.record(at as u64, &data[at..end]);
            at = end;
        }
        Stored {
            key: "k".into(),
            identity: "e".into(),
            len: data.len() as u64,
            pieces: None,
            sums: s.finish(data.len() as u64),
        }
    }

    #[test]
    fn sums_of_pieces_equal_the_sums_of_whole_blocks() {
        let data = bytes(5 * BLOCK as usize + 12345, 1);
        let st = stored_of(&data);
        let whole: Vec<Option<u32>> = data.chunks(BLOCK as usize).map(|c| Some(crc32c::crc32c(c))).collect();
        assert_eq!(st.sums, whole);
        // A gap leaves its block unknown.
        let mut s = Sums::default();
        s.record(0, &data[..100]);
        s.record(200, &data[200..BLOCK as usize + 5]);
        assert_eq!(
            s.finish(BLOCK as usize as u64 + 5),
            vec![None, Some(crc32c::crc32c(&data[BLOCK as usize..BLOCK as usize + 5]))]
        );
    }

    #[test]
    fn an_append_keeps_every_old_block_and_an_edit_loses_one() {
        let dir = std::env::temp_dir().join(format!("bucketfs-patch-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let old = bytes(3 * BLOCK as usize + 500, 2);
        let st = stored_of(&old);
        let mut new = old.clone();
        new.extend(bytes(70_000, 9));
        std::fs::write(&path, &new).unwrap();
        let f = File::open(&path).unwrap();
        assert_eq!(st.kept(&f, new.len() as u64).unwrap(), vec![0..old.len() as u64]);
        // The new version's sums: kept blocks' and sent bytes', combined across the seam.
        let mut sums = Sums::default();
        st.keep_into(&[0..old.len() as u64], &mut sums);
        sums.record(old.len() as u64, &new[old.len()..]);
        assert_eq!(sums.finish(new.len() as u64), stored_of(&new).sums);
        // One byte changed in block 1: blocks 0, 2 and the tail block are kept.
        new[BLOCK as usize + 7] ^= 1;
        std::fs::write(&path, &new).unwrap();
        let b = BLOCK;
        assert_eq!(st.kept(&f, new.len() as u64).unwrap(), vec![0..b, 2 * b..old.len() as u64]);
        // Truncated inside the last block: that block is not kept.
        assert_eq!(st.kept(&f, 3 * b + 10).unwrap(), vec![0..b, 2 * b..3 * b]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
