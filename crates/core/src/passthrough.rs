//! Local files the kernel may read without us (FUSE passthrough).
//!
//! When a file is opened read-only and the whole version the open pinned (its identity:
//! ETag or generation) is on local disk, the adapter can hand the kernel a file holding
//! exactly those bytes, and the kernel reads (and maps) it directly, with no round trip
//! through this process and no copy. That file is the version's file in the disk cache
//! ([`crate::disk_cache::whole`]), written block by block as reads fetched them, once all
//! of its blocks are there; the close of a handle that read through the store fetches
//! the few a lagging disk skipped, so the next open finds it complete.
//!
//! Files being written pass through to their staged file ([`crate::write`]): the kernel
//! reads and writes it directly, and the daemon learns of the changes by looking at the
//! file (its length and mtime: [`crate::write::Staged::observe`]) wherever they matter:
//! attributes (`stat`, listings), flush, fsync, close, rename, truncate and every upload.
//! An upload during which the kernel changed the file leaves it dirty, so the next commit
//! point uploads again. Crash recovery uploads such a file only if nothing changed it after
//! its last commit point (the `.open` marker names the committed length and mtime).
//!
//! What never goes through a backing file: an `O_RDONLY|O_TRUNC` handle, cached objects
//! smaller than [`WHOLE_MIN`], and every read of an object not staged on a mount without a
//! disk cache. The adapter decides the rest (the kernel's rule that all opens of an inode
//! use the same backing file, or none): fuse/src/passthrough.rs.
//!
//! Consistency: the backing file of a read is named by (key, identity) of the handle's
//! pinned version, so an open after the object changed in the bucket (seen at the open's
//! revalidation, after the TTL) pins the new identity, finds no file for it and reads
//! through the store as before; close-to-open holds as without passthrough. A staged
//! file is this mount's newest bytes: every handle of its inode reads it.

use crate::sync::{Arc, AtomicBool, AtomicU64};
use std::time::Duration;

use crate::disk_cache::WholePin;

/// Objects smaller than this get no whole file: one or two of the kernel's 1 MiB requests
/// cost less than an extra file on disk per small object.
pub const WHOLE_MIN: u64 = 1024 * 1024;

/// How long an open (or a close preparing the next open) waits for blocks still queued
/// for the disk cache: they land within milliseconds unless the disk is saturated.
pub(crate) const SETTLE: Duration = Duration::from_secs(2);

/// A local file for the kernel to use directly: exactly the bytes of one object version
/// (a whole-object cache file), or an inode's staged file.
pub struct Backing {
    pub file: std::fs::File,
    /// What it holds: the version the handle pinned at open, or `staged:` and the staged
    /// file's own identity (every handle of a staged inode shares it).
    pub identity: String,
    /// Keeps a cache file from eviction while the kernel reads it.
    pub(crate) _pin: Option<WholePin>,
}

/// Counters for status and metrics.
#[derive(Default)]
pub(crate) struct Counters {
    /// The adapter found the kernel able to pass through (see [`Fs::set_passthrough`]).
    pub(crate) on: AtomicBool,
    pub(crate) opens: AtomicU64,
}

/// The identity of a staged file's backing (every handle of its inode shares it): the
/// shared staged state's address, unique while any handle holds it.
pub(crate) fn staged_identity(staged: &crate::write::SharedStaged) -> String {
    format!("{STAGED}{:p}", Arc::as_ptr(staged))
}

const STAGED: &str = "staged:";

/// Whether a backing identity names a staged file (else a cached object version).
pub fn is_staged_identity(identity: &str) -> bool {
    identity.starts_with(STAGED)
}
