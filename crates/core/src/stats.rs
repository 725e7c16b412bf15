//! Read-only figures about a running mount, for metrics and `bucketfs status`.
//!
//! Nothing here changes state or takes a lock across an await; each call is cheap enough to
//! answer a scrape every few seconds.

use crate::Fs;

/// Cache use at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Bytes in the memory block cache.
    pub memory_bytes: u64,
    /// Bytes in the on-disk block cache (0 without one).
    pub disk_bytes: u64,
    /// Names kept in memory: nodes and cached listing entries (`--max-cached-entries`).
    pub entries: u64,
}

impl Fs {
    /// Staged files with changes not yet in the bucket. A file whose state is locked right
    /// now (being written or uploaded) counts as pending.
    pub fn pending_uploads(&self) -> usize {
        self.staging.pending()
    }

    /// Staged files, dirty or not (open for writing, or waiting for their last close).
    pub fn staged_files(&self) -> usize {
        self.staging.len()
    }

    /// How much the block caches hold.
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats {
            memory_bytes: self.read_cache.cached_bytes(),
            disk_bytes: self.read_cache.disk_bytes(),
            entries: self.table.lock().unwrap().cached_entries() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bucketfs_store::testing::MemStore;

    use crate::{Fs, FsConfig, ROOT_INO};

    #[tokio::test]
    async fn pending_uploads_follow_the_staged_files() {
        let dir = std::env::temp_dir().join(format!("bucketfs-stats-test-{}", std::process::id()));
        let fs = Fs::new(Arc::new(MemStore::new()), FsConfig { staging_dir: dir, ..FsConfig::default() });
        assert_eq!((fs.pending_uploads(), fs.staged_files()), (0, 0));
        let (_, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
        fs.write(fh, 0, b"abc").await.unwrap();
        assert_eq!(fs.pending_uploads(), 1);
        fs.flush(fh).await.unwrap();
        assert_eq!((fs.pending_uploads(), fs.staged_files()), (0, 1));
        fs.release(fh).await.unwrap();
        assert_eq!(fs.staged_files(), 0);
        assert_eq!(fs.cache_stats().disk_bytes, 0);
    }
}
