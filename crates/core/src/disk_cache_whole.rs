//! Whole-object files: one object version's bytes, exactly, in one plain file of the disk
//! cache, for the kernel to read directly (FUSE passthrough: core's passthrough.rs).
//!
//! A whole file is built from the version's cached blocks once every one of them is on
//! disk, each block's CRC32C checked as it is read ([`DiskCache::get`]); it is written under
//! a temporary name (deleted at the next start-up if the process ends midway) and renamed
//! into place, so a file under its final name always holds every byte. The name is
//! `<hash>.<crc>.w`: the hash of (key, identity, `u64::MAX`) in the form block names use,
//! so a changed object never finds its old file, and the CRC32C of the whole file. That CRC
//! is checked once per process, before the first use of a file an earlier mount made (one
//! built by this process was checked block by block), never per read: the kernel reads the
//! file without us.
//!
//! Whole files count in the cache's bound like blocks (the index weighs them by size) and
//! are evicted least-recently-used, but never become spares (nothing is written over
//! them). A file in use (pinned: the kernel reads it for an open handle) is deleted only
//! once its last pin goes; a new build of the same version meanwhile takes its name over.
//! A writer opening the version takes the file over as its staged file
//! ([`DiskCache::take_whole`]): it leaves the cache, and readers passing through it see the
//! writes, as every handle of a staged file does.

use crate::sync::{Arc, Mutex};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{DiskCache, EXT};
use crate::block_pool::BlockPool;
use crate::read::BLOCK;

/// Extension of whole-object files (in the index and on disk).
pub(super) const WHOLE_EXT: &str = ".w";

/// Index name -> state of each whole file.
pub(super) type WholeMap = Arc<Mutex<HashMap<String, Whole>>>;

pub(super) struct Whole {
    crc: u32,
    /// The file's bytes were checked against `crc` by this process.
    verified: bool,
    /// Open handles the kernel reads this file for.
    pins: u32,
    /// Evicted while pinned: delete at the last unpin.
    evicted: bool,
    /// Which file this is, for its pins: a file keeps it when renamed with its object
    /// ([`DiskCache::rekey_whole`]); a name taken over and built again is a new file.
    gen: u64,
}

fn next_gen() -> u64 {
    // A plain counter (std's even under shuttle: a static needs a const constructor).
    static GEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    GEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A whole file opened read-only, pinned against deletion while this lives.
pub struct WholeFile {
    pub file: File,
    pub pin: WholePin,
}

/// Keeps a whole file on disk while it lives (see the module doc).
pub struct WholePin {
    cache: Arc<DiskCache>,
    gen: u64,
}

impl Drop for WholePin {
    fn drop(&mut self) {
        let mut m = self.cache.whole.lock().unwrap();
        // By file, not name (a few hundred entries at most: whole files are 1 MiB or more).
        let Some((name, w)) = m.iter_mut().find(|(_, w)| w.gen == self.gen) else { return };
        w.pins = w.pins.saturating_sub(1);
        if w.pins == 0 && w.evicted {
            let (name, crc) = (name.clone(), w.crc);
            m.remove(&name);
            drop(m);
            let _ = std::fs::remove_file(self.cache.dir.join(file_name(&name, crc)));
        }
    }
}

/// The on-disk name of the whole file indexed as `index_name` with CRC32C `crc`.
fn file_name(index_name: &str, crc: u32) -> String {
    format!("{}.{crc:08x}{WHOLE_EXT}", index_name.trim_end_matches(WHOLE_EXT))
}

/// Index name and CRC32C of an on-disk whole file name.
pub(super) fn parse_name(file: &str) -> Option<(String, u32)> {
    let (hash, crc) = file.strip_suffix(WHOLE_EXT)?.split_once('.')?;
    if hash.len() != 32 || crc.len() != 8 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((format!("{hash}{WHOLE_EXT}"), u32::from_str_radix(crc, 16).ok()?))
}

/// At start-up: record a whole file an earlier mount left (unverified); `None` if `file` is
/// not one (the caller then deletes it).
pub(super) fn adopt(map: &WholeMap, file: &str, len: u64) -> Option<()> {
    let (name, crc) = parse_name(file)?;
    if len == 0 || len > u32::MAX as u64 {
        return None;
    }
    map.lock().unwrap().insert(name, Whole { crc, verified: false, pins: 0, evicted: false, gen: next_gen() });
    Some(())
}

/// The index dropped `name` (evicted, or invalidated after a failed check).
pub(super) fn evicted(map: &WholeMap, dir: &Path, name: &str) {
    let mut m = map.lock().unwrap();
    let Some(w) = m.get_mut(name) else { return };
    if w.pins > 0 {
        w.evicted = true;
        return;
    }
    let crc = w.crc;
    m.remove(name);
    drop(m);
    let _ = std::fs::remove_file(dir.join(file_name(name, crc)));
}

/// CRC32C of everything in `f`, read with positioned reads (the file's offset stays at 0).
fn crc_of(f: &File) -> std::io::Result<u32> {
    let mut buf = vec![0u8; 1024 * 1024];
    let (mut crc, mut at) = (0, 0u64);
    loop {
        match f.read_at(&mut buf, at)? {
            0 => return Ok(crc),
            n => {
                crc = crc32c::crc32c_append(crc, &buf[..n]);
                at += n as u64;
            }
        }
    }
}

impl DiskCache {
    fn whole_name(key: &str, identity: &str) -> String {
        let block_style = Self::name(key, identity, u64::MAX);
        format!("{}{WHOLE_EXT}", block_style.trim_end_matches(EXT))
    }

    /// Whether every block of the version (`size` bytes) is in the index. No I/O.
    pub fn has_all_blocks(&self, key: &str, identity: &str, size: u64) -> bool {
        (0..size.div_ceil(BLOCK)).all(|b| self.contains(key, identity, b))
    }

    /// Whether the version's whole file exists. No I/O.
    pub fn has_whole(&self, key: &str, identity: &str) -> bool {
        self.index.contains_key(&Self::whole_name(key, identity))
    }

    /// The version's whole file, opened read-only and pinned, if it exists and is intact
    /// (checked once per process, see the module doc). Blocking file I/O.
    pub fn whole(self: &Arc<Self>, key: &str, identity: &str, size: u64) -> Option<WholeFile> {
        let name = Self::whole_name(key, identity);
        self.index.get(&name)?; // marks it recently used
        let (crc, verified, gen) = {
            let m = self.whole.lock().unwrap();
            let w = m.get(&name)?;
            (w.crc, w.verified, w.gen)
        };
        let path = self.dir.join(file_name(&name, crc));
        let fail = |why: &str| {
            tracing::warn!(%key, "whole-object cache file {why}; dropped");
            self.index.invalidate(&name);
            None
        };
        let Ok(file) = File::open(&path) else { return fail("cannot be opened") };
        if file.metadata().map(|m| m.len()).ok() != Some(size) {
            return fail("has the wrong size");
        }
        if !verified {
            if crc_of(&file).ok() != Some(crc) {
                return fail("failed its checksum");
            }
            if let Some(w) = self.whole.lock().unwrap().get_mut(&name) {
                w.verified = true;
            }
        }
        self.whole.lock().unwrap().get_mut(&name).filter(|w| w.gen == gen)?.pins += 1;
        Some(WholeFile { file, pin: WholePin { cache: self.clone(), gen } })
    }

    /// Build the version's whole file from its cached blocks (every block checked as it is
    /// read). `false` if a block is missing or damaged, or the disk refused. A build of the
    /// same file in progress is waited for. Blocking file I/O.
    pub fn build_whole(&self, key: &str, identity: &str, size: u64, pool: &BlockPool) -> bool {
        if size == 0 || size > u32::MAX as u64 {
            return false; // the index weighs entries in u32
        }
        let name = Self::whole_name(key, identity);
        let lock = self.building.lock().unwrap().entry(name.clone()).or_default().clone();
        let _building = lock.lock().unwrap();
        if self.index.contains_key(&name) {
            return true;
        }
        let tmp = self.dir.join(format!("{}.tmp", name.trim_end_matches(WHOLE_EXT)));
        let write = || -> std::io::Result<Option<u32>> {
            let f = File::create(&tmp)?;
            let mut crc = 0;
            for b in 0..size.div_ceil(BLOCK) {
                let want = ((b + 1) * BLOCK).min(size) - b * BLOCK;
                let Some(data) = self.get(key, identity, b, pool).filter(|d| d.len() as u64 == want) else {
                    return Ok(None);
                };
                f.write_all_at(&data, b * BLOCK)?;
                crc = crc32c::crc32c_append(crc, &data);
            }
            Ok(Some(crc))
        };
        let built = match write() {
            Ok(Some(crc)) => std::fs::rename(&tmp, self.dir.join(file_name(&name, crc))).map(|()| crc).ok(),
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(%key, "whole-object cache file not written: {e}");
                None
            }
        };
        let Some(crc) = built else {
            let _ = std::fs::remove_file(&tmp);
            self.building.lock().unwrap().remove(&name);
            return false;
        };
        {
            let mut m = self.whole.lock().unwrap();
            let (pins, gen) = m.get(&name).map_or((0, next_gen()), |w| (w.pins, w.gen));
            m.insert(name.clone(), Whole { crc, verified: true, pins, evicted: false, gen });
        }
        self.index.insert(name.clone(), size as u32);
        self.index.run_pending_tasks();
        self.building.lock().unwrap().remove(&name);
        tracing::debug!(%key, %identity, size, "whole-object cache file built");
        true
    }

    /// Take the file at `from` (`size` bytes: a staged file holding exactly the version just
    /// uploaded) into the cache as the version's whole file, by a rename, its CRC32C read
    /// once: reading back what was just written passes through to it with no download.
    /// `false` (and `from` left where it was) if the version has one already, it would take
    /// more than 3/4 of the cache, or the disk refused (another file system). Blocking I/O.
    pub fn give_whole(&self, key: &str, identity: &str, size: u64, from: &Path) -> bool {
        let room = self.index.policy().max_capacity().unwrap_or(0) / 4 * 3;
        if size == 0 || size > u32::MAX as u64 || size > room {
            return false;
        }
        let crc = match File::open(from).and_then(|f| Ok((f.metadata()?.len(), crc_of(&f)?))) {
            Ok((len, crc)) if len == size => crc,
            _ => return false,
        };
        let name = Self::whole_name(key, identity);
        let lock = self.building.lock().unwrap().entry(name.clone()).or_default().clone();
        let _building = lock.lock().unwrap();
        let given = !self.index.contains_key(&name) && {
            let mut m = self.whole.lock().unwrap();
            let renamed = std::fs::rename(from, self.dir.join(file_name(&name, crc))).is_ok();
            if renamed {
                let (pins, gen) = m.get(&name).map_or((0, next_gen()), |w| (w.pins, w.gen));
                m.insert(name.clone(), Whole { crc, verified: true, pins, evicted: false, gen });
            }
            renamed
        };
        if given {
            self.index.insert(name.clone(), size as u32);
            self.index.run_pending_tasks();
            tracing::debug!(%key, %identity, size, "whole-object cache file taken from the staged file");
        }
        self.building.lock().unwrap().remove(&name);
        given
    }

    /// Whether the kernel reads the version's whole file for an open handle (pinned).
    pub fn whole_pinned(&self, key: &str, identity: &str) -> bool {
        self.whole.lock().unwrap().get(&Self::whole_name(key, identity)).is_some_and(|w| w.pins > 0)
    }

    /// The object moved to `new_key` as version `new_identity` with the same bytes (a rename
    /// made here): its whole file follows under its new name, so opens of the new name find
    /// it, and readers passing through it keep it (pinned as before). `false` if there is
    /// none or the disk refused. Blocking file I/O (a rename).
    pub fn rekey_whole(&self, key: &str, identity: &str, new_key: &str, new_identity: &str) -> bool {
        let (old, new) = (Self::whole_name(key, identity), Self::whole_name(new_key, new_identity));
        if old == new {
            return true;
        }
        let Some(size) = self.index.get(&old) else { return false };
        {
            let mut m = self.whole.lock().unwrap();
            let Some(w) = m.get(&old) else { return false };
            let (crc, pinned) = (w.crc, w.pins > 0);
            // The new name may hold a copy of the same version already (key and identity
            // name the bytes), left there when a directory moved away with it and came back
            // (Drive and S3 keep a moved object's identity). The file readers pass through
            // must win: a writer's takeover looks under the new name, and a copy that is
            // not the readers' file got an open for writing EBUSY (found by the model).
            if let Some(stale) = m.get(&new) {
                if stale.pins > 0 && !pinned {
                    return false; // the one at the new name is the readers'
                }
                if stale.crc != crc {
                    let _ = std::fs::remove_file(self.dir.join(file_name(&new, stale.crc)));
                }
            }
            let from = self.dir.join(file_name(&old, crc));
            if std::fs::rename(from, self.dir.join(file_name(&new, crc))).is_err() {
                return false;
            }
            let w = m.remove(&old).expect("found above");
            m.insert(new.clone(), w); // replaces a copy left there; its pins matched nothing
        }
        // The old name's eviction finds no entry and deletes nothing.
        self.index.invalidate(&old);
        self.index.insert(new, size);
        self.index.run_pending_tasks();
        true
    }

    /// Move the version's whole file (`size` bytes, checked by this process) to `to`, out
    /// of the cache: a writer's staged file from now on (see the module doc). Its pins stop
    /// counting; the file lives on while open. `false` if there is none, or the disk refused
    /// (another file system). Blocking file I/O (a rename).
    pub fn take_whole(&self, key: &str, identity: &str, size: u64, to: &Path) -> bool {
        let name = Self::whole_name(key, identity);
        {
            // Under the map's lock: an eviction (which deletes by name) waits, then finds
            // no entry and deletes nothing.
            let mut m = self.whole.lock().unwrap();
            let Some(w) = m.get(&name).filter(|w| w.verified) else {
                tracing::debug!(%key, %identity, known = m.contains_key(&name), "no verified whole file to take over");
                return false;
            };
            let path = self.dir.join(file_name(&name, w.crc));
            let len = std::fs::metadata(&path).map(|m| m.len()).ok();
            if len != Some(size) || std::fs::rename(&path, to).is_err() {
                tracing::debug!(%key, ?len, size, "whole file not taken over: other size, or not renamed");
                return false;
            }
            m.remove(&name);
        }
        self.index.invalidate(&name);
        self.index.run_pending_tasks();
        tracing::debug!(%key, "whole-object cache file taken over by a writer");
        true
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::path::PathBuf;

    use super::*;
    use crate::block_pool::{round_up, ALIGN};

    fn dir(tag: &str) -> PathBuf {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/test-tmp")
            .join(format!("bucketfs-whole-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// An object of two and a half blocks, its blocks put in `c` under ("k", "e").
    fn object_in(c: &DiskCache, pool: &BlockPool) -> Vec<u8> {
        let data: Vec<u8> = (0..BLOCK * 5 / 2).map(|i| (i * 31 % 253) as u8).collect();
        for (b, chunk) in data.chunks(BLOCK as usize).enumerate() {
            let mut buf = pool.take();
            buf.space()[..chunk.len()].copy_from_slice(chunk);
            buf.space()[chunk.len()..round_up(chunk.len())].fill(0);
            let padded = buf.into_bytes(round_up(chunk.len()));
            c.put("k", "e", b as u64, &padded, chunk.len(), crc32c::crc32c(chunk));
        }
        data
    }

    fn read_all(w: &WholeFile) -> Vec<u8> {
        let mut v = Vec::new();
        (&w.file).read_to_end(&mut v).unwrap();
        v
    }

    #[test]
    fn built_from_blocks_checked_after_a_remount_and_pinned() {
        let (d, pool) = (dir("build"), BlockPool::new(BLOCK as usize + ALIGN, 2));
        let c = Arc::new(DiskCache::open(&d, 64 << 20).unwrap());
        assert!(!c.build_whole("k", "e", BLOCK * 5 / 2, &pool), "no blocks, no file");
        let data = object_in(&c, &pool);
        let size = data.len() as u64;
        assert!(c.has_all_blocks("k", "e", size) && !c.has_whole("k", "e"));
        assert!(c.build_whole("k", "e", size, &pool));
        let w = c.whole("k", "e", size).expect("built");
        assert!(read_all(&w) == data, "exactly the object's bytes");
        assert!(c.whole("k", "e2", size).is_none(), "another version never finds it");
        assert!(c.whole("k", "e", size + 1).is_none(), "a size mismatch is refused");

        // Evicted while pinned: kept until the pin goes.
        let name = DiskCache::whole_name("k", "e");
        let crc = c.whole.lock().unwrap()[&name].crc;
        let path = d.join(file_name(&name, crc));
        c.index.invalidate(&name);
        c.index.run_pending_tasks();
        assert!(path.exists(), "a pinned file stays");
        drop(w);
        assert!(!path.exists(), "deleted at the last unpin");

        // Adopted at a remount, checked at first use; a damaged one is dropped.
        assert!(c.build_whole("k", "e", size, &pool));
        drop(c);
        let c = Arc::new(DiskCache::open(&d, 64 << 20).unwrap());
        assert!(read_all(&c.whole("k", "e", size).expect("adopted")) == data, "adopted, checked, whole");
        drop(c);
        let mut raw = std::fs::read(&path).unwrap();
        raw[BLOCK as usize + 5] ^= 1;
        std::fs::write(&path, raw).unwrap();
        let c = Arc::new(DiskCache::open(&d, 64 << 20).unwrap());
        assert!(c.whole("k", "e", size).is_none(), "the checksum catches a flipped byte");
        c.index.run_pending_tasks();
        assert!(!path.exists(), "and the file is deleted");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn renamed_with_its_object_then_taken_over_by_a_writer() {
        let (d, pool) = (dir("move"), BlockPool::new(BLOCK as usize + ALIGN, 2));
        let c = Arc::new(DiskCache::open(&d, 64 << 20).unwrap());
        let data = object_in(&c, &pool);
        let size = data.len() as u64;
        assert!(c.build_whole("k", "e", size, &pool));
        let w = c.whole("k", "e", size).expect("built");
        // A rename here: the file follows, its pin with it.
        assert!(c.rekey_whole("k", "e", "k2", "e2"));
        assert!(!c.has_whole("k", "e") && c.has_whole("k2", "e2"));
        assert!(read_all(&c.whole("k2", "e2", size).expect("under the new name")) == data);
        let name = DiskCache::whole_name("k2", "e2");
        let path = d.join(file_name(&name, c.whole.lock().unwrap()[&name].crc));
        c.index.invalidate(&name);
        c.index.run_pending_tasks();
        assert!(path.exists(), "the pin taken before the rename still holds it");
        // A writer takes it over: out of the cache, its bytes at the staged path; the old
        // pin's drop deletes nothing (not even a file built again under the same name).
        assert!(c.build_whole("k", "e", size, &pool) && c.rekey_whole("k", "e", "k3", "e3"));
        let staged = d.join("staged.data");
        assert!(c.take_whole("k3", "e3", size, &staged));
        assert!(!c.has_whole("k3", "e3") && std::fs::read(&staged).unwrap() == data);
        assert!(!c.take_whole("k3", "e3", size, &staged), "taken once");
        assert!(c.build_whole("k", "e", size, &pool) && c.rekey_whole("k", "e", "k3", "e3"), "again under that name");
        drop(w);
        assert!(!path.exists(), "the evicted file went with its last pin");
        assert!(c.whole("k3", "e3", size).is_some(), "the new build was left alone");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A directory moved away and back (Drive and S3 keep a moved object's identity): the
    /// file readers pass through meets a copy of the same version left at the old name. It
    /// must take the name, so a writer's takeover gets the readers' file (was EBUSY).
    #[test]
    fn a_pinned_file_moved_onto_a_copy_left_behind_takes_the_name() {
        let (d, pool) = (dir("moveback"), BlockPool::new(BLOCK as usize + ALIGN, 2));
        let c = Arc::new(DiskCache::open(&d, 64 << 20).unwrap());
        let data = object_in(&c, &pool);
        let size = data.len() as u64;
        // Built from the blocks of "k", then moved (as renames here move them).
        assert!(c.build_whole("k", "e", size, &pool) && c.rekey_whole("k", "e", "a/f", "e"), "left at a/f");
        assert!(c.build_whole("k", "e", size, &pool) && c.rekey_whole("k", "e", "b/a/f", "e"));
        let readers = c.whole("b/a/f", "e", size).expect("pinned by a reader");
        assert!(c.rekey_whole("b/a/f", "e", "a/f", "e"), "the readers' file takes the name");
        let staged = d.join("staged.data");
        assert!(c.take_whole("a/f", "e", size, &staged));
        use std::os::unix::fs::MetadataExt;
        let (r, t) = (readers.file.metadata().unwrap(), std::fs::metadata(&staged).unwrap());
        assert_eq!((r.dev(), r.ino()), (t.dev(), t.ino()), "the writer took the readers' file");
        // An unpinned copy never displaces a pinned one.
        assert!(c.build_whole("k", "e", size, &pool) && c.rekey_whole("k", "e", "x", "e"));
        assert!(c.build_whole("k", "e", size, &pool) && c.rekey_whole("k", "e", "y", "e"));
        let _held = c.whole("y", "e", size).unwrap();
        assert!(!c.rekey_whole("x", "e", "y", "e"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
