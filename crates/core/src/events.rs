//! Change events from the store (`bucketfs mount --notify`): other clients' changes shown
//! at once, and listings trusted past the TTL while the events flow.
//!
//! [`crate::Fs::follow_events`] consumes a [`bucketfs_store::events::Feed`] (crates/store `events.rs`). `Up` starts the
//! trust (`InodeTable::set_events_since`; for at most [`EVENT_TRUST_MAX`] per answer), `Gap` restarts it (listings fetched before are
//! back on their TTL), `Down` ends it: the mount then works on its TTL alone, says so in its
//! log and `bucketfs status`, and trusts events again after the next `Up`. Each event goes
//! through `InodeTable::apply_event` (the rules for late and own events are there), then the
//! kernel is told: the name's entry, the node's attributes, the directory's cached entries.
//!
//! The kernel's own entry and attribute timeouts stay short with `--notify` (at most
//! [`KERNEL_TTL_CAP`]): what it caches is answered from memory here, without the store.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

/// The kernel's timeouts with `--notify`: events reach this process, not the kernel.
pub const KERNEL_TTL_CAP: Duration = Duration::from_secs(1);

/// How long past its fetch a listing or an attribute stays trusted on the events' word,
/// however long they flow: a source may hold an event back (the MinIO built here sends its
/// stream in 4 KB bursts, so one change in a quiet bucket waited for good) or lose it
/// unannounced (a queue's subscription), and the name showed a removed file for as long.
/// The store is asked again after this (or the TTL, if longer).
pub const EVENT_TRUST_MAX: Duration = Duration::from_secs(60);

/// Kernel notices waiting for the one thread that sends them; past this, a flood of events
/// drops them (counted): the kernel then keeps what it cached for at most
/// [`KERNEL_TTL_CAP`], and the mount itself is current already.
pub(crate) const NOTICES_QUEUED: usize = 4096;

/// What the kernel is told of one changed name: the directory's cached entries, the name's
/// dentry, and the node the name led to; with the adapter's notifiers as they are when the
/// event applies (it gives them one after the other at mount, maybe after the first event).
pub(crate) struct Notice {
    pub(crate) dir: u64,
    pub(crate) name: String,
    pub(crate) ino: Option<u64>,
    pub(crate) entries: Option<InvalidateEntry>,
    pub(crate) inodes: Option<crate::InvalidateDir>,
}

/// Tell the kernel that `name` in directory `parent` changed (its dentry, positive or
/// negative, must be looked up again).
pub type InvalidateEntry = Arc<dyn Fn(u64, &str) + Send + Sync>;

/// The state of the event feed, for status and metrics.
#[derive(Default)]
pub struct EventState {
    pub(crate) configured: AtomicBool,
    pub(crate) up: AtomicBool,
    pub(crate) applied: AtomicU64,
    pub(crate) expired: AtomicU64,
    pub(crate) gaps: AtomicU64,
    pub(crate) downs: AtomicU64,
    /// Why the feed is down, and since when (a leaf lock).
    pub(crate) down: std::sync::Mutex<Option<(SystemTime, String)>>,
    /// Since when events flowed without a break, as the table has it (a leaf lock, read
    /// where the table's may be held).
    pub(crate) since: std::sync::Mutex<Option<std::time::Instant>>,
    pub(crate) entries: OnceLock<InvalidateEntry>,
    /// The notice thread's queue (made at the first event that needs one).
    pub(crate) notices: OnceLock<std::sync::mpsc::SyncSender<Notice>>,
    /// Notices dropped because the queue was full.
    pub(crate) notices_dropped: AtomicU64,
}

impl EventState {
    /// Whether attributes confirmed `at` are vouched for by events flowing since before.
    pub(crate) fn vouches_for(&self, at: std::time::Instant) -> bool {
        self.since.lock().unwrap().is_some_and(|s| at >= s)
    }
}

/// What `bucketfs status` shows of the feed.
#[derive(Debug, Clone, Default)]
pub struct EventStats {
    pub configured: bool,
    pub up: bool,
    /// Events that changed a cached name.
    pub applied: u64,
    /// Events checked with the store instead (possibly this mount's own change told late).
    pub expired: u64,
    pub gaps: u64,
    pub downs: u64,
    pub down_since: Option<SystemTime>,
    pub down_reason: Option<String>,
    /// Kernel notices dropped in a flood (see `NOTICES_QUEUED`).
    pub notices_dropped: u64,
}
