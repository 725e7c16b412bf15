//! Local files the kernel may read without us (FUSE passthrough).
//!
//! When a file is opened read-only and the whole version the open pinned (its identity:
//! ETag or generation) is on local disk, the adapter can hand the kernel a file holding
//! exactly those bytes, and the kernel reads (and maps) it directly, with no round trip
//! through this process and no copy. That file is a whole-object file of the disk cache
//! ([`crate::disk_cache::whole`]), built from the version's cached blocks: at an open
//! that finds them all on disk, and ahead of time at the close of a handle that read
//! through the store, so the next open finds it ready.
//!
//! What never goes through a backing file: a handle reading staged bytes (this mount's
//! own changes, read from the staging file through the daemon), an `O_RDONLY|O_TRUNC`
//! handle, objects smaller than [`WHOLE_MIN`], and every handle of a mount without a disk
//! cache. The adapter decides the rest (the kernel's rule that all opens of an inode use
//! the same backing file, or none): fuse/src/passthrough.rs.
//!
//! Consistency: the backing file is named by (key, identity) of the handle's pinned
//! version, so an open after the object changed in the bucket (seen at the open's
//! revalidation, after the TTL) pins the new identity, finds no file for it and reads
//! through the store as before; close-to-open holds as without passthrough.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::disk_cache::WholePin;
use crate::Fs;

/// Objects smaller than this get no whole file: one or two of the kernel's 1 MiB requests
/// cost less than an extra file on disk per small object.
pub const WHOLE_MIN: u64 = 1024 * 1024;

/// How long an open (or a close preparing the next open) waits for blocks still queued
/// for the disk cache: they land within milliseconds unless the disk is saturated.
const SETTLE: Duration = Duration::from_secs(2);

/// A local file with exactly the bytes of one object version, for the kernel to read.
pub struct Backing {
    pub file: std::fs::File,
    /// The version it holds (what the handle pinned at open).
    pub identity: String,
    /// Keeps the file from eviction while the kernel reads it.
    _pin: WholePin,
}

/// Counters for status and metrics.
#[derive(Default)]
pub(crate) struct Counters {
    /// The adapter found the kernel able to pass through (see [`Fs::set_passthrough`]).
    on: std::sync::atomic::AtomicBool,
    opens: AtomicU64,
}

impl Fs {
    /// The version read-only handle `fh` pinned, if the kernel could read it from a local
    /// file: `None` for a handle that reads staged bytes, empties the file at flush, or a
    /// small object.
    pub fn passthrough_identity(&self, fh: u64) -> Option<String> {
        let f = self.open_file(fh).ok()?;
        if f.staged.load(Relaxed) || f.truncate_at_flush.load(Relaxed) {
            return None;
        }
        let r = f.reader.lock().unwrap().clone();
        (r.size >= WHOLE_MIN).then(|| r.identity().to_string())
    }

    /// The local file holding exactly the version `fh` pinned, building it from the disk
    /// cache's blocks if they are all there. `Err`: why not, for the log.
    pub async fn backing_file(&self, fh: u64) -> Result<Backing, &'static str> {
        let identity = self.passthrough_identity(fh).ok_or("staged, truncating or small")?;
        let f = self.open_file(fh).map_err(|_| "handle gone")?;
        let r = f.reader.lock().unwrap().clone();
        let disk = self.read_cache.disk().ok_or("no disk cache")?.clone();
        let (key, size) = (r.key.to_string(), r.size);
        if !disk.has_whole(&key, &identity) && !disk.has_all_blocks(&key, &identity, size) {
            self.read_cache.disk_settled(SETTLE).await;
        }
        let pool = self.read_cache.pool.clone();
        let id = identity.clone();
        let found = tokio::task::spawn_blocking(move || {
            if let Some(w) = disk.whole(&key, &id, size) {
                return Ok(w);
            }
            if !disk.has_all_blocks(&key, &id, size) {
                return Err("not all of it on local disk");
            }
            if !disk.build_whole(&key, &id, size, &pool) {
                return Err("whole-object file not built");
            }
            disk.whole(&key, &id, size).ok_or("whole-object file unusable")
        })
        .await
        .map_err(|_| "task failed")??;
        Ok(Backing { file: found.file, identity, _pin: found.pin })
    }

    /// At the close of a handle that read through the store: if the whole version is on
    /// disk now, build its whole file in the background, so the next open passes through.
    pub(crate) fn prepare_backing(&self, file: &crate::fs::OpenFile) {
        if file.staged.load(Relaxed) || !self.passthrough.on.load(Relaxed) {
            return;
        }
        let r = file.reader.lock().unwrap().clone();
        let Some(disk) = self.read_cache.disk().cloned() else { return };
        if r.size < WHOLE_MIN || disk.has_whole(&r.key, r.identity()) {
            return;
        }
        let (cache, pool) = (self.read_cache.clone(), self.read_cache.pool.clone());
        tokio::spawn(async move {
            cache.disk_settled(SETTLE).await;
            if disk.has_all_blocks(&r.key, r.identity(), r.size) {
                let _ =
                    tokio::task::spawn_blocking(move || disk.build_whole(&r.key, r.identity(), r.size, &pool)).await;
            }
        });
    }

    /// Whether opens may pass through: set by the adapter once the kernel granted it (and
    /// cleared if registering a backing file fails). Whole files are built ahead only then.
    pub fn set_passthrough(&self, on: bool) {
        self.passthrough.on.store(on, Relaxed);
    }

    /// Whether backing files can exist at all: they live in the disk cache.
    pub fn passthrough_possible(&self) -> bool {
        self.read_cache.disk().is_some()
    }

    pub fn passthrough_on(&self) -> bool {
        self.passthrough.on.load(Relaxed)
    }

    /// Count an open the kernel serves from a backing file.
    pub fn note_passthrough_open(&self) {
        self.passthrough.opens.fetch_add(1, Relaxed);
    }

    /// Opens served from a backing file since mount.
    pub fn passthrough_opens(&self) -> u64 {
        self.passthrough.opens.load(Relaxed)
    }
}
