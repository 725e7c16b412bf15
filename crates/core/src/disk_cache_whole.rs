//! A version's data file used whole: read by the kernel for passthrough opens (core's
//! passthrough.rs), taken over by a writer, given by a writer, moved with a rename.
//!
//! A data file all of whose blocks are present holds exactly the object's bytes: it is
//! handed to the kernel as it is. Its blocks were written by this process from bytes
//! whose CRC32C was taken as they arrived, or they are checked (every block, once per
//! process) before the first hand-over; never per read, since the kernel reads the file
//! without us.
//!
//! A file in use (pinned: the kernel reads it for an open handle) is deleted only once
//! its last pin goes. A writer opening the version takes the file over as its staged file
//! ([`DiskCache::take_whole`]): it leaves the cache, and readers passing through it see the
//! writes, as every handle of a staged file does.

use crate::sync::{Arc, AtomicU64, Mutex, Ordering::Relaxed};
use std::fs::File;
use std::path::Path;

use super::{header, read_full_at, record, DiskCache};

/// The pins of one data file; shared by its entry and its [`WholePin`]s.
#[derive(Default)]
pub(super) struct Pins {
    count: AtomicU64,
    /// The entry's index name (it changes when the file moves with its object).
    name: Mutex<String>,
}

impl Pins {
    pub(super) fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }
}

/// A data file opened read-only, pinned against deletion while this lives.
pub struct WholeFile {
    pub file: File,
    pub pin: WholePin,
}

/// Keeps a data file on disk while it lives (see the module doc).
pub struct WholePin {
    cache: Arc<DiskCache>,
    pins: Arc<Pins>,
}

impl Drop for WholePin {
    fn drop(&mut self) {
        if self.pins.count.fetch_sub(1, Relaxed) != 1 {
            return;
        }
        let mut m = self.cache.entries.lock().unwrap();
        let name = self.pins.name.lock().unwrap().clone();
        let Some(e) = m.get(&name) else { return };
        if Arc::ptr_eq(&e.pin, &self.pins) && e.evicted && e.pin.count() == 0 {
            m.remove(&name);
            drop(m);
            let _ = std::fs::remove_file(self.cache.data_path(&name));
            let _ = std::fs::remove_file(self.cache.meta_path(&name));
        }
    }
}

impl DiskCache {
    /// The version's data file, opened read-only and pinned, if every block is there and
    /// intact (checked once per process, see the module doc). Blocking file I/O.
    pub fn whole(self: &Arc<Self>, key: &str, identity: &str, size: u64) -> Option<WholeFile> {
        let name = Self::name(key, identity);
        let (checked, gen, stamp) = {
            let m = self.entries.lock().unwrap();
            let e = m.get(&name).filter(|e| !e.evicted && e.size == size && e.complete())?;
            (e.checked, e.gen, e.stamp)
        };
        self.index.get(&name); // marks it recently used
        let fail = |why: &str| {
            tracing::warn!(%key, "disk cache file {why}; dropped");
            self.index.invalidate(&name);
            None
        };
        let Ok(file) = File::open(self.data_path(&name)) else { return fail("cannot be opened") };
        let Some(now) = file.metadata().ok().map(|m| super::stamp_of(&m)).filter(|s| s.0 == size) else {
            return fail("has the wrong size");
        };
        // Changed since it was whole and intact (written to by hand, another program): the
        // kernel would read whatever it holds now, so it is checked first.
        let changed = stamp.is_some_and(|s| s != now);
        if changed {
            tracing::warn!(%key, "disk cache file changed on disk since it was written; checking it");
        }
        if !checked || changed {
            // (Copied only here: an open of a checked file need not copy a large one's.)
            let crcs = self.entries.lock().unwrap().get(&name).filter(|e| e.gen == gen)?.crcs.clone();
            let bad = self.bad_blocks(&file, size, &crcs);
            if !bad.is_empty() {
                tracing::warn!(%key, blocks = ?bad, "disk cache blocks failed their checksum; fetched again");
                for b in bad {
                    self.drop_block(&name, gen, b);
                }
                return None;
            }
            if let Some(e) = self.entries.lock().unwrap().get_mut(&name).filter(|e| e.gen == gen) {
                e.checked = true;
            }
        }
        let mut m = self.entries.lock().unwrap();
        let e = m.get_mut(&name).filter(|e| e.gen == gen)?;
        e.stamp = Some(now);
        *e.pin.name.lock().unwrap() = name.clone();
        e.pin.count.fetch_add(1, Relaxed);
        Some(WholeFile { file, pin: WholePin { cache: self.clone(), pins: e.pin.clone() } })
    }

    /// The blocks of `f` whose bytes do not have the CRC32C `crcs` gives them.
    fn bad_blocks(&self, f: &File, size: u64, crcs: &[Option<u32>]) -> Vec<u64> {
        let mut buf = vec![0u8; self.block as usize];
        let bad = |(b, crc): (usize, &Option<u32>)| {
            let len = self.block_len(size, b as u64) as usize;
            let read = read_full_at(f, &mut buf[..len], b as u64 * self.block);
            (read.ok() != Some(len) || Some(crc32c::crc32c(&buf[..len])) != *crc).then_some(b as u64)
        };
        crcs.iter().enumerate().filter_map(bad).collect()
    }

    /// Each block's CRC32C of the file at `path`, if it is `size` bytes long.
    fn crcs_of(&self, path: &Path, size: u64) -> Option<Vec<Option<u32>>> {
        let f = File::open(path).ok()?;
        if f.metadata().ok()?.len() != size {
            return None;
        }
        let mut buf = vec![0u8; self.block as usize];
        (0..size.div_ceil(self.block))
            .map(|b| {
                let len = self.block_len(size, b) as usize;
                let n = read_full_at(&f, &mut buf[..len], b * self.block).ok()?;
                (n == len).then(|| Some(crc32c::crc32c(&buf[..len])))
            })
            .collect()
    }

    /// Write `name`'s sidecar whole: its header and a record per block present.
    fn write_meta(&self, name: &str, e: &super::Entry) -> std::io::Result<()> {
        let mut meta = header(self.block, e.size, name).to_vec();
        for (b, crc) in e.crcs.iter().enumerate() {
            if let Some(crc) = crc {
                meta.extend_from_slice(&record(b as u64, self.block_len(e.size, b as u64), *crc));
            }
        }
        std::fs::write(self.meta_path(name), meta)
    }

    /// Take the file at `from` (`size` bytes: a staged file holding exactly the version just
    /// uploaded) into the cache as the version's data file, by a rename, its blocks'
    /// CRC32C read once: reading back what was just written passes through to it with no
    /// download. `false` (and `from` left where it was) if the version is cached whole
    /// already or pinned, it would take more than 3/4 of the cache, or the disk refused
    /// (another file system). Blocking file I/O.
    pub fn give_whole(&self, key: &str, identity: &str, size: u64, from: &Path) -> bool {
        if size == 0 || size > self.max_bytes / 4 * 3 {
            return false;
        }
        let Some(crcs) = self.crcs_of(from, size) else { return false };
        let name = Self::name(key, identity);
        let mut m = self.entries.lock().unwrap();
        if let Some(old) = m.get(&name) {
            if old.pin.count() > 0 || (old.complete() && !old.evicted && old.size == size) {
                return false;
            }
            let old = m.remove(&name).expect("found above");
            self.delete_files(&name, &old);
        }
        if std::fs::rename(from, self.data_path(&name)).is_err() {
            return false;
        }
        let mut e = self.new_entry(size);
        for (b, crc) in crcs.into_iter().enumerate() {
            e.record(b as u64, self.block_len(size, b as u64), crc.expect("every block read"));
        }
        e.stamp = std::fs::metadata(self.data_path(&name)).ok().map(|m| super::stamp_of(&m));
        if let Err(err) = self.write_meta(&name, &e) {
            tracing::debug!(%key, "disk cache sidecar not written: {err}");
            let _ = std::fs::remove_file(self.data_path(&name));
            return false;
        }
        let slot = e.slot();
        m.insert(name.clone(), e);
        drop(m);
        self.index.insert(name, slot);
        self.index.run_pending_tasks();
        tracing::debug!(%key, %identity, size, "disk cache took the staged file as the version's file");
        true
    }

    /// Whether the kernel reads the version's data file for an open handle (pinned).
    pub fn whole_pinned(&self, key: &str, identity: &str) -> bool {
        self.entries.lock().unwrap().get(&Self::name(key, identity)).is_some_and(|e| e.pin.count() > 0)
    }

    /// The object moved to `new_key` as version `new_identity` with the same bytes (a rename
    /// made here): its data file follows under its new name, so opens of the new name find
    /// it, and readers passing through it keep it (pinned as before). `false` if there is
    /// none or the disk refused. Blocking file I/O (renames).
    pub fn rekey_whole(&self, key: &str, identity: &str, new_key: &str, new_identity: &str) -> bool {
        let (old, new) = (Self::name(key, identity), Self::name(new_key, new_identity));
        if old == new {
            return true;
        }
        let mut m = self.entries.lock().unwrap();
        // Not while a block is being written to it: that write ends under the old name,
        // which it would no longer find (its block lost, the entry counted as being
        // written for good, so never taken over by a writer: EBUSY). Not carried over then;
        // the new name's reads fetch again.
        let Some(pinned) = m.get(&old).filter(|e| !e.evicted && e.writing == 0).map(|e| e.pin.count() > 0) else {
            return false;
        };
        // The new name may hold a copy of the same version already (key and identity name
        // the bytes), left there when a directory moved away with it and came back (Drive
        // and S3 keep a moved object's identity). The file readers pass through must win: a
        // writer's takeover looks under the new name, and a copy that is not the readers'
        // file got an open for writing EBUSY (found by the model).
        if let Some(stale) = m.get(&new) {
            if stale.pin.count() > 0 && !pinned {
                return false; // the one at the new name is the readers'
            }
            let stale = m.remove(&new).expect("found above");
            self.delete_files(&new, &stale); // a pinned one is renamed over below
        }
        if std::fs::rename(self.data_path(&old), self.data_path(&new)).is_err() {
            return false;
        }
        let mut e = m.remove(&old).expect("found above");
        // The rename moved its ctime: stamped again, not checked again at the next open.
        e.stamp = e.stamp.and_then(|_| std::fs::metadata(self.data_path(&new)).ok()).map(|m| super::stamp_of(&m));
        let _ = std::fs::remove_file(self.meta_path(&old));
        if let Err(err) = self.write_meta(&new, &e) {
            tracing::debug!(%new_key, "disk cache sidecar not moved: {err}");
            let _ = std::fs::remove_file(self.data_path(&new));
            drop(m);
            self.index.invalidate(&old);
            return false;
        }
        *e.pin.name.lock().unwrap() = new.clone();
        let slot = e.slot();
        m.insert(new.clone(), e);
        drop(m);
        // The old name's eviction finds no entry and deletes nothing.
        self.index.invalidate(&old);
        self.index.insert(new, slot);
        self.index.run_pending_tasks();
        true
    }

    /// Drop the version's data file and sidecar, even while pinned: another object now
    /// answers to this name (see [`crate::read::ReadCache::forget`]). The kernel keeps
    /// reading a pinned file it holds open; nothing finds it by name from now on. Blocking
    /// file I/O (deletes).
    pub fn forget(&self, key: &str, identity: &str) {
        let name = Self::name(key, identity);
        {
            let mut m = self.entries.lock().unwrap();
            if m.remove(&name).is_none() {
                return;
            }
            // Under the map's lock, before a new entry of that name can be made. (A block
            // write in flight ends in the deleted file: its entry is gone.)
            let _ = std::fs::remove_file(self.data_path(&name));
            let _ = std::fs::remove_file(self.meta_path(&name));
        }
        // Its eviction finds no entry (or a newer one, whose files it then drops: a miss).
        self.index.invalidate(&name);
        self.index.run_pending_tasks();
        tracing::debug!(%key, %identity, "disk cache file dropped: another object took its name");
    }

    /// Move the version's data file (complete, `size` bytes, checked by this process) to
    /// `to`, out of the cache: a writer's staged file from now on (see the module doc). Its
    /// pins stop counting; the file lives on while open. `false` if there is none, or the
    /// disk refused (another file system). Blocking file I/O (a rename).
    pub fn take_whole(&self, key: &str, identity: &str, size: u64, to: &Path) -> bool {
        let name = Self::name(key, identity);
        {
            // Under the map's lock: an eviction (which deletes by name) waits, then finds
            // no entry and deletes nothing.
            let mut m = self.entries.lock().unwrap();
            // (Not while a block is being written into it: see `Entry::writing`.)
            let Some(_) = m.get(&name).filter(|e| e.checked && e.complete() && e.size == size && e.writing == 0) else {
                tracing::debug!(%key, %identity, known = m.contains_key(&name), "no checked whole file to take over");
                return false;
            };
            if let Err(err) = std::fs::rename(self.data_path(&name), to) {
                tracing::debug!(%key, "whole file not taken over: {err}");
                return false;
            }
            let _ = std::fs::remove_file(self.meta_path(&name));
            m.remove(&name);
        }
        self.index.invalidate(&name);
        self.index.run_pending_tasks();
        tracing::debug!(%key, "disk cache file taken over by a writer");
        true
    }
}
