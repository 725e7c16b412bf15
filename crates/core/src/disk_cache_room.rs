//! Room the disk cache leaves free on its file system.
//!
//! `--disk-cache-mib` bounds what the cache holds, not what its file system has left: a
//! 64 MiB disk held 62 MiB of cache, full, under a 2 GiB bound. By default the staging
//! directory is on the same file system (both under `~/.cache/bucketfs`), and every create
//! then failed with `ENOSPC`, at every later mount too (tester I). So the cache keeps
//! [`reserve`] free: before a block is written, and at start-up, files are evicted (the
//! oldest first, never one the kernel reads) until there is that much room; if there still
//! is not, the block is not cached.

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

use super::DiskCache;

/// Most files evicted for room at one time.
const EVICT_AT_ONCE: usize = 64;

/// The size of `path`'s file system and the bytes free on it for an unprivileged user;
/// `None` if it cannot be asked.
pub(crate) fn space(path: &Path) -> Option<(u64, u64)> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a zeroed statvfs for the call to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let unit = st.f_frsize as u64;
    Some(((st.f_blocks as u64).saturating_mul(unit), (st.f_bavail as u64).saturating_mul(unit)))
}

/// What the cache leaves free on a file system of `total` bytes: a tenth, at most 1 GiB.
pub(crate) fn reserve(total: u64) -> u64 {
    (total / 10).min(1 << 30)
}

impl DiskCache {
    /// Whether `bytes` more fit beside [`reserve`], after evicting files for them if need
    /// be. A file system that cannot be asked counts as roomy.
    pub(super) fn room_for(&self, bytes: u64) -> bool {
        let short = |(total, free): (u64, u64)| free < reserve(total).saturating_add(bytes);
        if !space(&self.dir).is_some_and(short) {
            return true;
        }
        for name in self.oldest_unpinned(EVICT_AT_ONCE) {
            self.index.invalidate(&name); // its listener deletes the files
            if !space(&self.dir).is_some_and(short) {
                return true;
            }
        }
        if !self.told_full.swap(true, Relaxed) {
            tracing::warn!(
                dir = %self.dir.display(),
                "disk cache: its file system has under a tenth (at most 1 GiB) free; it holds less, and caches nothing more while so"
            );
        }
        false
    }

    /// Up to `n` entries no one reads through the kernel or writes now, the oldest first.
    fn oldest_unpinned(&self, n: usize) -> Vec<String> {
        let m = self.entries.lock().unwrap();
        let mut all: Vec<(u64, &String)> = m
            .iter()
            .filter(|(_, e)| e.pin.count() == 0 && e.writing == 0 && !e.evicted)
            .map(|(name, e)| (e.gen, name))
            .collect();
        all.sort_unstable();
        all.into_iter().take(n).map(|(_, name)| name.clone()).collect()
    }
}
