//! An in-memory [`Store`] that behaves like an object store (flat keys, prefix directories,
//! ETags that change on every put) with optional per-request latency and a throughput cap.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;

use crate::{Capabilities, ListStream, ObjectMeta, Store, StoreError};

#[derive(Default)]
pub struct MemStore {
    /// key -> (data, etag, mtime). One lock; every call holds it only to copy out.
    objects: Mutex<BTreeMap<String, (Bytes, String, SystemTime)>>,
    next_etag: AtomicU64,
    latency: Duration,
    /// Bytes per second for `get_range`; 0 means unlimited.
    bytes_per_sec: u64,
    /// Count of requests made, for tests that assert "no HEAD per entry" and the like.
    pub requests: AtomicU64,
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every request waits `latency` first (a round trip).
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Reads are paced to `bytes_per_sec`.
    pub fn with_throughput(mut self, bytes_per_sec: u64) -> Self {
        self.bytes_per_sec = bytes_per_sec;
        self
    }

    async fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
    }

    fn snapshot(&self, key: &str) -> Option<(Bytes, String, SystemTime)> {
        self.objects.lock().unwrap().get(key).cloned()
    }
}

#[async_trait]
impl Store for MemStore {
    fn describe(&self) -> String {
        "memstore://".into()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { read_if_match: true, copy: true, prefix_dirs: true }
    }

    async fn check(&self) -> Result<(), StoreError> {
        self.request().await;
        Ok(())
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        self.request().await;
        let (data, etag, mtime) = self.snapshot(key).ok_or_else(|| StoreError::not_found(key))?;
        Ok(ObjectMeta { key: key.into(), size: data.len() as u64, etag: Some(etag), mtime: Some(mtime) })
    }

    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<Bytes, StoreError> {
        self.request().await;
        let (data, etag, _) = self.snapshot(key).ok_or_else(|| StoreError::not_found(key))?;
        if if_match.is_some_and(|t| t != etag) {
            return Err(StoreError::new(crate::StoreErrorKind::Changed, format!("{key} changed")));
        }
        let end = range.end.min(data.len() as u64) as usize;
        let start = (range.start as usize).min(end);
        if self.bytes_per_sec > 0 {
            let secs = (end - start) as f64 / self.bytes_per_sec as f64;
            tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        }
        Ok(data.slice(start..end))
    }

    fn list(&self, prefix: &str, recursive: bool) -> ListStream {
        let objects = self.objects.lock().unwrap();
        let mut out: Vec<ObjectMeta> = Vec::new();
        for (key, (data, etag, mtime)) in objects.range(prefix.to_string()..) {
            let Some(rest) = key.strip_prefix(prefix) else { break };
            if rest.is_empty() {
                continue; // the directory marker itself
            }
            match (recursive, rest.find('/')) {
                (false, Some(i)) => {
                    let dir = format!("{prefix}{}", &rest[..=i]);
                    if out.last().map(|m| &m.key) != Some(&dir) {
                        out.push(ObjectMeta { key: dir, size: 0, etag: None, mtime: None });
                    }
                }
                _ => out.push(ObjectMeta {
                    key: key.clone(),
                    size: data.len() as u64,
                    etag: Some(etag.clone()),
                    mtime: Some(*mtime),
                }),
            }
        }
        let latency = self.latency;
        self.requests.fetch_add(1, Ordering::Relaxed);
        futures::stream::once(async move {
            tokio::time::sleep(latency).await;
            futures::stream::iter(out.into_iter().map(Ok))
        })
        .flatten()
        .boxed()
    }

    async fn put(&self, key: &str, data: Bytes) -> Result<ObjectMeta, StoreError> {
        self.request().await;
        let etag = format!("\"{}\"", self.next_etag.fetch_add(1, Ordering::Relaxed) + 1);
        let mtime = SystemTime::now();
        let size = data.len() as u64;
        self.objects.lock().unwrap().insert(key.into(), (data, etag.clone(), mtime));
        Ok(ObjectMeta { key: key.into(), size, etag: Some(etag), mtime: Some(mtime) })
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.request().await;
        self.objects.lock().unwrap().remove(key);
        Ok(())
    }

    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        let (data, _, _) = self.snapshot(from).ok_or_else(|| StoreError::not_found(from))?;
        self.put(to, data).await.map(|_| ())
    }
}
