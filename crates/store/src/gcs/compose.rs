//! A parallel upload writer for GCS built from plain object PUTs and `compose`.
//!
//! OpenDAL's GCS writer uses the XML multipart API, which fake-gcs-server lacks. This writer
//! instead buffers `part_size` bytes, uploads each full part as a temporary object under
//! [`PARTS_PREFIX`]`<id>/` (relative to the store root), keeps up to `concurrency` part
//! uploads in flight (`write` waits when the window is full), and at `close` composes the
//! parts into the key: at most [`MAX_COMPOSE_SOURCES`] per call, in a tree for more.
//! The temporary objects are then deleted; `abort`, any failure and a dropped writer delete
//! them too (a dropped one in the store's background work, after its part uploads in
//! flight end, which `settle` waits for). An object that fits in one part goes up with one
//! plain PUT.
//!
//! The backend is a small trait so the part/compose/cleanup logic is unit-tested without a
//! server; [`OpendalComposeBackend`] is the real one over OpenDAL's public `Operator` API.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use opendal::Operator;
use tokio::task::JoinSet;

use crate::{ObjectMeta, ObjectWriter, Store, StoreError, StoreErrorKind, StoreExt};

/// Where temporary parts live, relative to the store root. Listings hide this prefix.
pub const PARTS_PREFIX: &str = ".bucketfs-parts/";

/// GCS accepts at most 32 source objects in one compose request.
pub const MAX_COMPOSE_SOURCES: usize = 32;

/// The operations the writer needs; see [`OpendalComposeBackend`].
#[async_trait]
pub trait ComposeBackend: Send + Sync + 'static {
    /// Store one temporary part (the pieces concatenated).
    async fn put_part(&self, key: &str, data: Vec<Bytes>) -> Result<(), StoreError>;
    /// Make `to` the concatenation of `sources` (at most [`MAX_COMPOSE_SOURCES`]); returns
    /// the new object's metadata as the compose response gave it (`etag` = generation).
    async fn compose(&self, sources: &[String], to: &str) -> Result<ObjectMeta, StoreError>;
    /// Delete one key; a missing key is not an error.
    async fn delete(&self, key: &str) -> Result<(), StoreError>;
    /// A plain single-request upload of a whole object.
    async fn put(&self, key: &str, data: Bytes) -> Result<ObjectMeta, StoreError>;
    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError>;
}

/// The real backend: parts and compose through OpenDAL, `put`/`head` through the store.
pub struct OpendalComposeBackend<S: Store> {
    pub op: Operator,
    /// For compose requests, which may take long on emulators (they copy the bytes).
    pub compose_op: Operator,
    pub store: S,
    /// What the object is stored with: by the plain put of an object of one part, or by
    /// the final compose request.
    pub put: crate::PutOpts,
    /// What the final compose stores with the object (an object of one part gets it from
    /// `store`'s put).
    pub headers: crate::headers::Headers,
    /// Tries after the first of a compose request cut off (`crate::retry`).
    pub retries: usize,
}

#[async_trait]
impl<S: Store> ComposeBackend for OpendalComposeBackend<S> {
    async fn put_part(&self, key: &str, data: Vec<Bytes>) -> Result<(), StoreError> {
        self.op
            .write(key, opendal::Buffer::from(data))
            .await
            .map(|_| ())
            .map_err(|e| StoreError::from_opendal("upload part", key, e))
    }
    async fn compose(&self, sources: &[String], to: &str) -> Result<ObjectMeta, StoreError> {
        // The final object's Content-Type, mode, owner and mtime (`cp -P`, a chmod'ed file)
        // and another client's headers: its destination resource carries them (they were
        // dropped: tester C). Intermediate objects need none.
        let last = !to.starts_with(PARTS_PREFIX);
        // Create only: `ifGenerationMatch=0` on the final compose (not on intermediates).
        let created = self.put.if_not_exists && last;
        // OpenDAL's RetryLayer never sends a compose again: one cut connection failed the
        // upload. Sent again here with the same sources and preconditions: an intermediate,
        // or a final compose that overwrites, makes the same object again; a create-only one
        // that completed unanswered is refused (412: `Exists`), and the caller tells its own
        // by the create tag the destination carries (`landed_here`). The parts stay until
        // this returns.
        let m = crate::retry::again(self.retries, "compose", to, |_| {
            let mut req = self.compose_op.compose_with(sources.iter().map(String::as_str), to);
            if last {
                req = crate::apply_headers!(req, &self.headers);
            }
            if created {
                req = req.if_not_exists(true);
            }
            std::future::IntoFuture::into_future(req)
        })
        .await
        .map_err(|e| StoreError::from_opendal("compose", to, e).if_created(created))?;
        Ok(ObjectMeta {
            key: to.to_string(),
            size: m.content_length(),
            etag: m.version().map(str::to_string), // the generation only, as `OpendalStore::meta`
            mtime: m.last_modified().map(Into::into),
            size_unknown: false,
        })
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.op.delete(key).await.map_err(|e| StoreError::from_opendal("delete part", key, e))
    }
    async fn put(&self, key: &str, data: Bytes) -> Result<ObjectMeta, StoreError> {
        self.store.put(key, data, self.put.clone()).await
    }
    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        self.store.stat(key).await
    }
}

/// The owner tag of this process's temporary objects ([`set_parts_owner`]).
static OWNER: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Name every temporary directory this process makes `<owner>-<id>`, so the next process
/// with the same owner (the next mount of the same mount point) can delete what a crash
/// left ([`crate::Store::clean_parts`]). Set once, before the first upload.
pub fn set_parts_owner(owner: &str) {
    let _ = OWNER.set(owner.to_string());
}

/// A fresh id for one upload's temporary directory: owner, time, process and a counter, so
/// two writers (in this process or another) never share one.
pub(crate) fn upload_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let owner = OWNER.get().map(|o| format!("{o}-")).unwrap_or_default();
    format!("{owner}{nanos:x}-{:x}-{n:x}", std::process::id())
}

/// See the module docs.
pub struct ComposeWriter {
    backend: Arc<dyn ComposeBackend>,
    key: String,
    /// `.bucketfs-parts/<id>/`.
    dir: String,
    part_size: usize,
    concurrency: usize,
    /// Bytes written but not yet sent, as the caller's pieces (no copying).
    pending: VecDeque<Bytes>,
    pending_len: usize,
    /// Part keys in order, including those still uploading (so cleanup deletes them too).
    parts: Vec<String>,
    /// Intermediate compose results, deleted with the parts.
    intermediates: Vec<String>,
    inflight: JoinSet<Result<(), StoreError>>,
    /// Set once the upload has ended (closed, aborted or failed); later calls fail.
    ended: bool,
    /// Where a dropped writer's clean-up runs ([`ComposeWriter::with_background`]).
    background: Option<crate::background::Background>,
    /// The runtime it was made on (a drop may happen outside it).
    rt: Option<tokio::runtime::Handle>,
}

impl ComposeWriter {
    pub fn new(backend: Arc<dyn ComposeBackend>, key: &str, part_size: usize, concurrency: usize) -> Self {
        Self {
            backend,
            key: key.to_string(),
            dir: format!("{PARTS_PREFIX}{}/", upload_id()),
            part_size: part_size.max(1),
            concurrency: concurrency.max(1),
            pending: VecDeque::new(),
            pending_len: 0,
            parts: Vec::new(),
            intermediates: Vec::new(),
            inflight: JoinSet::new(),
            ended: false,
            background: None,
            rt: tokio::runtime::Handle::try_current().ok(),
        }
    }

    /// A dropped writer's clean-up runs in `background` (the store's: `settle` waits for
    /// it), not untracked.
    pub fn with_background(mut self, background: crate::background::Background) -> Self {
        self.background = Some(background);
        self
    }

    fn check_open(&self) -> Result<(), StoreError> {
        if self.ended {
            return Err(StoreError::new(StoreErrorKind::Other, format!("upload of {} already ended", self.key)));
        }
        Ok(())
    }

    /// Take exactly `n` bytes (or all there is) off the front of `pending`.
    fn take(&mut self, n: usize) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut need = n;
        while need > 0 {
            let Some(mut b) = self.pending.pop_front() else { break };
            if b.len() > need {
                self.pending.push_front(b.split_off(need));
            }
            need -= b.len();
            self.pending_len -= b.len();
            out.push(b);
        }
        out
    }

    /// Wait for one in-flight task; its error (or panic) fails the upload.
    async fn reap_one(&mut self) -> Result<(), StoreError> {
        match self.inflight.join_next().await {
            None => Ok(()),
            Some(Ok(r)) => r,
            Some(Err(e)) => Err(StoreError::new(StoreErrorKind::Other, format!("upload task of {}: {e}", self.key))),
        }
    }

    async fn reap_all(&mut self) -> Result<(), StoreError> {
        while !self.inflight.is_empty() {
            self.reap_one().await?;
        }
        Ok(())
    }

    /// Start uploading `data` as the next part, first waiting for room in the window.
    async fn send_part(&mut self, data: Vec<Bytes>) -> Result<(), StoreError> {
        while self.inflight.len() >= self.concurrency {
            self.reap_one().await?;
        }
        // Five digits keep names sorted up to 99,999 parts; more still work (order is ours).
        let key = format!("{}{:05}", self.dir, self.parts.len() + 1);
        self.parts.push(key.clone());
        let backend = self.backend.clone();
        self.inflight.spawn(async move { backend.put_part(&key, data).await });
        Ok(())
    }

    async fn write_inner(&mut self, data: Bytes) -> Result<(), StoreError> {
        self.pending_len += data.len();
        self.pending.push_back(data);
        // Strictly more than a part: the data just written might be the last, and an object
        // of exactly one part should stay a single PUT.
        while self.pending_len > self.part_size {
            let part = self.take(self.part_size);
            self.send_part(part).await?;
        }
        Ok(())
    }

    /// Compose `sources` into `to`, in groups of at most 32, as a tree of intermediates.
    async fn compose_tree(&mut self, mut sources: Vec<String>) -> Result<ObjectMeta, StoreError> {
        let mut level = 0;
        while sources.len() > MAX_COMPOSE_SOURCES {
            level += 1;
            let mut next = Vec::new();
            for (i, group) in sources.chunks(MAX_COMPOSE_SOURCES).enumerate() {
                if group.len() == 1 {
                    next.push(group[0].clone()); // nothing to combine; carry it up a level
                    continue;
                }
                while self.inflight.len() >= self.concurrency {
                    self.reap_one().await?;
                }
                let to = format!("{}c{level}-{i:05}", self.dir);
                self.intermediates.push(to.clone());
                next.push(to.clone());
                let (backend, group) = (self.backend.clone(), group.to_vec());
                self.inflight.spawn(async move { backend.compose(&group, &to).await.map(|_| ()) });
            }
            self.reap_all().await?;
            sources = next;
        }
        self.backend.compose(&sources, &self.key).await
    }

    async fn close_inner(&mut self) -> Result<ObjectMeta, StoreError> {
        if self.parts.is_empty() {
            // Everything fit in one part: one plain PUT, no temporary objects.
            let data = self.take(self.pending_len);
            let body = if data.len() == 1 { data.into_iter().next().unwrap_or_default() } else { data.concat().into() };
            return self.backend.put(&self.key, body).await;
        }
        if self.pending_len > 0 {
            let last = self.take(self.pending_len);
            self.send_part(last).await?;
        }
        self.reap_all().await?;
        let parts = self.parts.clone();
        let meta = self.compose_tree(parts).await?;
        self.cleanup().await;
        // The identity is the compose response's own, never a later HEAD's: another writer
        // may have replaced the object in between.
        Ok(meta)
    }

    /// Let in-flight work end, then delete every temporary object this upload may have made.
    /// In-flight requests are waited for, not cancelled: a part whose request was already
    /// sent can still be stored by the server after the client lets go, and would then
    /// outlive a delete made before it (an orphan part after an interrupted `cp`).
    async fn cleanup(&mut self) {
        while self.inflight.join_next().await.is_some() {}
        let keys: Vec<String> = self.parts.drain(..).chain(self.intermediates.drain(..)).collect();
        let failed = delete_all(self.backend.clone(), keys, self.concurrency).await;
        if !failed.is_empty() {
            // The store out (the upload's failure, likely): tried again in the background.
            let work = delete_again(self.backend.clone(), failed, self.concurrency);
            match (&self.background, &self.rt) {
                (Some(bg), Some(rt)) => bg.spawn_on(work, rt),
                (_, Some(rt)) => drop(rt.spawn(work)),
                _ => {}
            }
        }
        self.pending.clear();
        self.pending_len = 0;
    }
}

/// Delete `keys`, `concurrency` at a time; returns those whose delete failed.
async fn delete_all(backend: Arc<dyn ComposeBackend>, keys: Vec<String>, concurrency: usize) -> Vec<String> {
    let failed = Arc::new(std::sync::Mutex::new(Vec::new()));
    futures::stream::iter(keys)
        .for_each_concurrent(concurrency, |k| {
            let (backend, failed) = (backend.clone(), failed.clone());
            async move {
                if let Err(e) = backend.delete(&k).await {
                    tracing::debug!("could not delete temporary upload part {k}: {e}");
                    failed.lock().unwrap().push(k);
                }
            }
        })
        .await;
    let failed = std::mem::take(&mut *failed.lock().unwrap());
    failed
}

/// Waits between the tries of [`delete_again`]: about 4 minutes in all.
const DELETE_AGAIN_AFTER: [u64; 9] = [1, 2, 4, 8, 15, 30, 60, 60, 60];

/// Delete temporary parts whose first delete failed (the store out when the upload failed),
/// trying again with backoff: in the store's background work, which `bucketfs sync` and
/// unmount wait for (bounded). Before, one failed try left them in the bucket, seen by
/// every client, until the next mount of the same mount point (tester U).
async fn delete_again(backend: Arc<dyn ComposeBackend>, mut keys: Vec<String>, concurrency: usize) {
    tracing::warn!(parts = keys.len(), "could not delete temporary upload parts: trying again");
    for secs in DELETE_AGAIN_AFTER {
        tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
        keys = delete_all(backend.clone(), keys, concurrency).await;
        if keys.is_empty() {
            tracing::info!("temporary upload parts deleted");
            return;
        }
    }
    tracing::warn!(parts = ?keys, "temporary upload parts left in the bucket (the store kept refusing their delete); the next mount of this mount point removes them");
}

#[async_trait]
impl ObjectWriter for ComposeWriter {
    async fn write(&mut self, data: Bytes) -> Result<(), StoreError> {
        self.check_open()?;
        let r = self.write_inner(data).await;
        if r.is_err() {
            self.ended = true;
            self.cleanup().await;
        }
        r
    }

    async fn close(&mut self) -> Result<ObjectMeta, StoreError> {
        self.check_open()?;
        self.ended = true;
        let r = self.close_inner().await;
        if r.is_err() {
            self.cleanup().await;
        }
        r
    }

    async fn abort(&mut self) -> Result<(), StoreError> {
        if !self.ended {
            self.ended = true;
            self.cleanup().await;
        }
        Ok(())
    }
}

impl Drop for ComposeWriter {
    /// Dropped mid-upload (a cancelled task): delete the parts in the background if a
    /// runtime is still there, so even then nothing is left behind. As in `cleanup`, the
    /// part uploads in flight end first (one cut off could be stored after the delete).
    fn drop(&mut self) {
        // Decided by what is left, not by `ended`: a close cancelled midway (set ended, its
        // parts not composed or not deleted yet) leaves them all otherwise.
        if self.parts.is_empty() && self.intermediates.is_empty() {
            return;
        }
        let mut inflight = std::mem::take(&mut self.inflight);
        let keys: Vec<String> = self.parts.drain(..).chain(self.intermediates.drain(..)).collect();
        let (backend, concurrency) = (self.backend.clone(), self.concurrency);
        let work = async move {
            while inflight.join_next().await.is_some() {}
            let failed = delete_all(backend.clone(), keys, concurrency).await;
            if !failed.is_empty() {
                delete_again(backend, failed, concurrency).await;
            }
        };
        let Some(rt) = self.rt.clone().or_else(|| tokio::runtime::Handle::try_current().ok()) else { return };
        match &self.background {
            Some(bg) => bg.spawn_on(work, &rt),
            None => drop(rt.spawn(work)),
        }
    }
}

#[cfg(test)]
#[path = "compose_tests.rs"]
mod tests;
