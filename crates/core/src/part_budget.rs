//! The mount-wide bound on upload memory.
//!
//! An upload reads its staged file a part (8 MiB) at a time and hands each part to the
//! store, which holds it until its request is done: up to `--upload-concurrency` parts in
//! flight plus the one being handed over. Per file that is bounded, but not across files:
//! 16 writers of large files held 16 x 5 parts. Now every upload first takes a share of one
//! [`PartBudget`] (`--upload-budget-mib`) for as long as it holds part buffers, so the part
//! buffers of all uploads together stay within the budget.
//!
//! Why a share per upload and not a permit per buffer: the store's writer only moves its
//! queued parts while it is polled, so an upload that waited for room with parts queued
//! would wait for itself (a per-buffer version hung 16 writers). A share is taken before an
//! upload holds any buffer and is never added to, so no upload waits while holding one.
//!
//! Eager uploads (parts sent while a sequential writer is still writing, `write.rs`) may
//! stay open as long as their writer keeps the file open, so they take their share only if
//! it is free at once, and from at most half the budget: a `close` always finds the other
//! half eventually, and an eager share never blocks a close for good.

use std::sync::Arc;

use bucketfs_store::WriteOptions;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Permits are KiB, so a budget up to 4 TiB fits the semaphore's count.
const UNIT: u64 = 1024;

#[derive(Clone)]
pub struct PartBudget {
    /// The whole budget, in KiB.
    all: Arc<Semaphore>,
    /// Half of it: what eager uploads may hold together, in KiB.
    eager: Arc<Semaphore>,
    units: u64,
}

/// A share of the budget, given back when dropped.
pub struct Share {
    _all: OwnedSemaphorePermit,
    _eager: Option<OwnedSemaphorePermit>,
}

impl PartBudget {
    pub fn new(bytes: u64) -> Self {
        let units = (bytes / UNIT).clamp(2, u32::MAX as u64 >> 3);
        Self {
            all: Arc::new(Semaphore::new(units as usize)),
            eager: Arc::new(Semaphore::new(units as usize / 2)),
            units,
        }
    }

    /// The share an upload of `left` more bytes needs: the part being handed over and the
    /// parts in flight, or less for a smaller file; at most half the budget.
    fn units_for(&self, left: u64, opts: &WriteOptions) -> u32 {
        let most = (opts.concurrency as u64 + 1) * opts.part_size as u64;
        (left.min(most).div_ceil(UNIT)).clamp(1, self.units / 2) as u32
    }

    /// Wait for the share of an upload of `left` more bytes (a close, fsync or rename).
    pub async fn upload(&self, left: u64, opts: &WriteOptions) -> Share {
        let n = self.units_for(left, opts);
        Share { _all: self.all.clone().acquire_many_owned(n).await.expect("never closed"), _eager: None }
    }

    /// The share of an eager upload, if it is free now (see the module doc).
    pub fn eager(&self, opts: &WriteOptions) -> Option<Share> {
        let n = self.units_for(u64::MAX, opts);
        let eager = self.eager.clone().try_acquire_many_owned(n).ok()?;
        let all = self.all.clone().try_acquire_many_owned(n).ok()?;
        Some(Share { _all: all, _eager: Some(eager) })
    }

    /// Room for `bytes` of one buffer (the ranged reads that stage a file opened for writing).
    pub async fn buffer(&self, bytes: u64) -> Share {
        let n = bytes.div_ceil(UNIT).clamp(1, self.units / 2) as u32;
        Share { _all: self.all.clone().acquire_many_owned(n).await.expect("never closed"), _eager: None }
    }

    /// Bytes of the budget not in use now.
    pub fn available(&self) -> u64 {
        self.all.available_permits() as u64 * UNIT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[tokio::test]
    async fn eager_uploads_never_take_more_than_half_and_closes_always_get_theirs() {
        let opts = WriteOptions { part_size: 8 << 20, concurrency: 4, ..Default::default() };
        let b = PartBudget::new(80 * MIB);
        let e1 = b.eager(&opts).expect("room for one eager upload (40 MiB)");
        assert!(b.eager(&opts).is_none(), "eager uploads are held to half the budget");
        assert_eq!(b.available(), 40 * MIB);
        let small = b.upload(4107, &opts).await;
        assert_eq!(b.available(), 40 * MIB - 5 * 1024, "a small file takes what it needs");
        drop(small);
        let c1 = b.upload(u64::MAX, &opts).await;
        assert_eq!(b.available(), 0);
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { drop(b.upload(100 * MIB, &opts).await) }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a close waits for room (back-pressure)");
        drop(c1); // another close finished; the eager upload still holds its share
        waiting.await.unwrap();
        drop(e1);
        assert_eq!(b.available(), 80 * MIB);
    }
}
