//! What a running mount reports about itself: one place that reads the store's [`Metrics`]
//! and the core's figures, for both the Prometheus endpoint and `bucketfs status`.

use std::sync::Arc;
use std::time::Instant;

use bucketfs_core::Fs;
use bucketfs_store::metered::Metrics;

use crate::control::Status;

pub struct Observed {
    pub fs: Arc<Fs>,
    pub metrics: Arc<Metrics>,
    pub started: Instant,
    pub mountpoint: String,
    pub store: String,
    /// Already redacted (no `user:password@`).
    pub endpoint: Option<String>,
    pub read_only: bool,
    pub memory_cache_limit: u64,
    pub disk_cache_limit: u64,
    pub max_cached_entries: u64,
    /// `--notify`'s source, as given.
    pub notify: Option<String>,
}

impl Observed {
    pub fn status(&self) -> Status {
        let t = self.metrics.totals();
        let c = self.fs.cache_stats();
        let wb = self.fs.write_back_status();
        let ev = self.fs.event_stats();
        Status {
            mountpoint: self.mountpoint.clone(),
            store: self.store.clone(),
            endpoint: self.endpoint.clone(),
            pid: std::process::id(),
            read_only: self.read_only,
            uptime_secs: self.started.elapsed().as_secs(),
            pending_uploads: self.fs.pending_uploads() as u64,
            staged_files: self.fs.staged_files() as u64,
            memory_cache_bytes: c.memory_bytes,
            memory_cache_limit: self.memory_cache_limit,
            disk_cache_bytes: c.disk_bytes,
            disk_cache_limit: self.disk_cache_limit,
            cached_entries: c.entries,
            max_cached_entries: self.max_cached_entries,
            requests: t.requests,
            errors: t.errors,
            not_found: t.not_found,
            bytes_read: t.bytes_read,
            bytes_written: t.bytes_written,
            bytes_copied: t.bytes_copied,
            write_back: self.fs.write_back(),
            write_back_files: wb.files,
            write_back_bytes: wb.bytes,
            write_back_oldest_secs: wb.oldest_secs,
            write_back_uploaded: wb.uploaded,
            write_back_deletes: wb.deletes,
            write_back_refused: wb.refused,
            upload_errors: wb.failing,
            write_back_pending: wb
                .pending
                .iter()
                .map(|(k, f)| if *f { format!("{k} (uploading)") } else { k.clone() })
                .collect(),
            passthrough: self.fs.passthrough_on(),
            passthrough_opens: self.fs.passthrough_opens(),
            notify: self.notify.clone(),
            notify_up: ev.up,
            notify_applied: ev.applied,
            notify_checked: ev.expired,
            notify_downs: ev.downs,
            notify_gaps: ev.gaps,
            notify_notices_dropped: ev.notices_dropped,
            notify_down_secs: ev.down_since.map(|t| t.elapsed().unwrap_or_default().as_secs()),
            notify_down_reason: ev.down_reason,
        }
    }

    /// The Prometheus text: the store's counters plus the core's gauges.
    pub fn render(&self) -> String {
        let c = self.fs.cache_stats();
        let wb = self.fs.write_back_status();
        self.metrics.render(&[
            (
                "bucketfs_pending_uploads",
                "Staged files with changes not yet uploaded.",
                self.fs.pending_uploads() as u64,
            ),
            (
                "bucketfs_staged_files",
                "Files staged on local disk (open for writing or pending).",
                self.fs.staged_files() as u64,
            ),
            ("bucketfs_memory_cache_bytes", "Bytes in the memory block cache.", c.memory_bytes),
            ("bucketfs_disk_cache_bytes", "Bytes in the on-disk block cache.", c.disk_bytes),
            ("bucketfs_cached_entries", "Names kept in memory (inodes and cached listing entries).", c.entries),
            ("bucketfs_write_back_files", "Closed files waiting for their write-back upload.", wb.files),
            ("bucketfs_write_back_bytes", "Bytes of closed files waiting for their write-back upload.", wb.bytes),
            ("bucketfs_write_back_oldest_seconds", "Age of the oldest file waiting for upload.", wb.oldest_secs),
            ("bucketfs_write_back_uploaded", "Write-back uploads done since mount.", wb.uploaded),
            ("bucketfs_write_back_deletes", "Unlinked files whose journaled DELETE is not done yet.", wb.deletes),
            (
                "bucketfs_write_back_refused",
                "Deferred changes the store refused for good since mount (not retried).",
                wb.refused,
            ),
            (
                "bucketfs_write_back_failing_files",
                "Files whose last write-back upload failed (retried).",
                wb.failing.len() as u64,
            ),
            (
                "bucketfs_passthrough_opens",
                "Opens the kernel served from a local file itself.",
                self.fs.passthrough_opens(),
            ),
            ("bucketfs_uptime_seconds", "Seconds since the mount started.", self.started.elapsed().as_secs()),
        ])
    }
}
