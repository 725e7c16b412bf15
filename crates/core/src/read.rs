//! The read path of one open file handle.
//!
//! Every read asks the store for exactly the bytes it needs, never "from the offset to the
//! end". A handle remembers where the previous read ended. When the next read starts
//! there, the access is sequential and the handle fetches a window ahead of the reader,
//! which doubles on each sequential miss from [`INITIAL_WINDOW`] up to the configured
//! maximum; the bytes beyond the request are kept for the reads that follow. A read
//! elsewhere (random access) resets the window and fetches only the requested range.
//!
//! Every request carries the ETag seen at open (`If-Match`), so bytes of two versions of an
//! object are never mixed: a changed object fails the read with ESTALE.

use std::sync::Arc;

use bucketfs_store::{Store, StoreErrorKind};
use bytes::Bytes;
use tokio::sync::Mutex;

use crate::FsError;

/// First prefetch window: small, so the first byte arrives after one short request.
pub const INITIAL_WINDOW: u64 = 256 * 1024;

/// One open regular file.
pub struct FileReader {
    store: Arc<dyn Store>,
    pub key: String,
    pub etag: Option<String>,
    pub size: u64,
    max_window: u64,
    state: Mutex<ReadState>,
}

#[derive(Default)]
struct ReadState {
    /// Bytes `buf_start..buf_start+buf.len()` of the object, already fetched.
    buf_start: u64,
    buf: Bytes,
    /// Where the last read ended: a read starting here is sequential.
    next: u64,
    window: u64,
}

impl FileReader {
    pub fn new(store: Arc<dyn Store>, key: String, etag: Option<String>, size: u64, max_window: u64) -> Self {
        Self { store, key, etag, size, max_window: max_window.max(INITIAL_WINDOW), state: Mutex::default() }
    }

    /// Up to `len` bytes at `offset`; fewer only at the end of the file.
    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, FsError> {
        if offset >= self.size || len == 0 {
            return Ok(Bytes::new());
        }
        let end = (offset + len as u64).min(self.size);
        let mut st = self.state.lock().await;
        let buf_end = st.buf_start + st.buf.len() as u64;
        if offset >= st.buf_start && end <= buf_end {
            let from = (offset - st.buf_start) as usize;
            let out = st.buf.slice(from..from + (end - offset) as usize);
            st.next = end;
            return Ok(out);
        }
        let sequential = offset == st.next && offset > 0;
        st.window = if sequential { (st.window * 2).clamp(INITIAL_WINDOW, self.max_window) } else { 0 };
        let fetch_end = if sequential { (offset + st.window).max(end).min(self.size) } else { end };
        let data = self.fetch(offset, fetch_end).await?;
        if (data.len() as u64) < end - offset {
            // The object is shorter than it was at open: someone truncated it behind us.
            return Err(FsError::Stale(format!("{} is shorter than when it was opened", self.key)));
        }
        let out = data.slice(0..(end - offset) as usize);
        if sequential {
            st.buf_start = offset;
            st.buf = data;
        }
        st.next = end;
        Ok(out)
    }

    async fn fetch(&self, start: u64, end: u64) -> Result<Bytes, FsError> {
        self.store.get_range(&self.key, start..end, self.etag.as_deref()).await.map_err(|e| match e.kind {
            StoreErrorKind::Changed | StoreErrorKind::NotFound => FsError::Stale(e.message),
            _ => FsError::Store(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bucketfs_store::testing::MemStore;
    use std::sync::atomic::Ordering;

    fn data(n: usize) -> Bytes {
        (0..n).map(|i| (i * 7 % 251) as u8).collect::<Vec<_>>().into()
    }

    #[tokio::test]
    async fn sequential_reads_prefetch_and_random_reads_are_exact() {
        let store = Arc::new(MemStore::new());
        let body = data(3 * 1024 * 1024 + 5);
        let m = store.put("f", body.clone()).await.unwrap();
        let r = FileReader::new(store.clone(), "f".into(), m.etag, body.len() as u64, 1 << 20);
        let mut off = 0u64;
        while off < body.len() as u64 {
            let got = r.read(off, 128 * 1024).await.unwrap();
            assert_eq!(got, body.slice(off as usize..(off as usize + got.len())));
            off += got.len() as u64;
        }
        let seq_requests = store.requests.load(Ordering::Relaxed);
        // 3 MiB in 128 KiB reads is 25 reads; prefetch must need far fewer requests.
        assert!(seq_requests <= 8, "{seq_requests} requests for a sequential read");
        // Random read: exactly the requested bytes, including one past EOF.
        let got = r.read(1_000_003, 17).await.unwrap();
        assert_eq!(got, body.slice(1_000_003..1_000_020));
        assert_eq!(r.read(body.len() as u64 - 3, 100).await.unwrap().len(), 3);
        assert!(r.read(body.len() as u64 + 10, 100).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_changed_object_is_stale_not_mixed() {
        let store = Arc::new(MemStore::new());
        let m = store.put("f", data(1000)).await.unwrap();
        let r = FileReader::new(store.clone(), "f".into(), m.etag, 1000, 1 << 20);
        assert_eq!(r.read(0, 10).await.unwrap().len(), 10);
        store.put("f", data(1000)).await.unwrap();
        assert!(matches!(r.read(500, 10).await, Err(FsError::Stale(_))));
    }
}
