//! A [`Store`] wrapper that injects an error on the Nth call of a chosen operation.
//!
//! A read (`get`) counts as a `Get`; with [`FailStore::mid_stream`] a failing one first
//! delivers some bytes and then fails, as a connection cut mid-body does.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::{
    ByteStream, Capabilities, GetOpts, HeadOpts, ListStream, ObjectHead, ObjectMeta, ObjectWriter, PutOpts, Store,
    StoreError, StoreErrorKind, WriteOptions,
};

/// Which operation a fault applies to: the operations the metered store counts
/// (`CreateDir` is `create_dir`, `Upload` opening a `writer`, the upload as a whole).
pub use crate::metered::Op;

pub struct FailStore {
    inner: Arc<dyn Store>,
    op: Op,
    /// Calls of `op` numbered from 1; calls `fail_from..fail_from+fail_count` fail (moved
    /// by [`FailStore::fail_next`]).
    fail_from: AtomicU64,
    fail_count: AtomicU64,
    kind: StoreErrorKind,
    calls: AtomicU64,
    /// A failing streamed read delivers this many bytes before its error (None: fails at once).
    cut_after: Option<u64>,
    /// Armed by [`FailStore::hold`]: (operation, calls still to hold, the permits they wait for).
    held: std::sync::Mutex<Option<(Op, u32, Arc<tokio::sync::Semaphore>)>>,
    /// Set by [`FailStore::after_copy`].
    after_copy: Option<AfterCopy>,
    /// Set by [`FailStore::cut_tries_before`]: puts still to report a cut-off try before them.
    cut_tries: AtomicU64,
}

/// What [`FailStore::after_copy`] runs: given the source key of a copy just made.
type AfterCopy = Box<dyn Fn(&str) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

impl FailStore {
    /// Fail calls `n..n+count` (1-based) of `op` with an error of `kind`.
    pub fn new(inner: Arc<dyn Store>, op: Op, n: u64, count: u64, kind: StoreErrorKind) -> Self {
        Self {
            inner,
            op,
            fail_from: AtomicU64::new(n),
            fail_count: AtomicU64::new(count),
            kind,
            calls: AtomicU64::new(0),
            cut_after: None,
            held: Default::default(),
            after_copy: None,
            cut_tries: AtomicU64::new(0),
        }
    }

    /// The next `count` puts that succeed say one try was cut off before them
    /// ([`Store::put_tried`]), as a store that sent them again after a timeout does.
    pub fn cut_tries_before(&self, count: u64) {
        self.cut_tries.store(count, Ordering::SeqCst);
    }

    /// Run `hook` after each copy that succeeded, before it answers, with the copy's source
    /// key: another client's change landing just after the copy (a write to the source
    /// while a rename moves it).
    pub fn after_copy(
        mut self,
        hook: impl Fn(&str) -> futures::future::BoxFuture<'static, ()> + Send + Sync + 'static,
    ) -> Self {
        self.after_copy = Some(Box::new(hook));
        self
    }

    /// The next `count` calls of `op` (`Head`, `List`, `Put`, `Delete` or `CreateDir`; `Copy` waits before it
    /// reaches the store) reach the store at once
    /// (a listing when first polled) but answer only as the returned semaphore gets
    /// permits, one each: replies overtaken by what happens meanwhile, or a caller paused
    /// after its change to the store (a rename between its delete and what follows).
    pub fn hold(&self, op: Op, count: u32) -> Arc<tokio::sync::Semaphore> {
        let permits = Arc::new(tokio::sync::Semaphore::new(0));
        *self.held.lock().unwrap() = Some((op, count, permits.clone()));
        permits
    }

    /// The next `count` calls of its op fail (instead of the calls given to `new`).
    pub fn fail_next(&self, count: u64) {
        self.fail_count.store(count, Ordering::SeqCst);
        self.fail_from.store(self.calls() + 1, Ordering::SeqCst);
    }

    /// How many calls of its op (the one it fails) were made.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Calls of the op armed by [`FailStore::hold`] not made yet answer at once again.
    /// Returns how many were left.
    pub fn disarm(&self) -> u32 {
        self.held.lock().unwrap().take().map_or(0, |(_, left, _)| left)
    }

    /// The permits this call of `op` must wait for, if it is one of those held.
    fn held(&self, op: Op) -> Option<Arc<tokio::sync::Semaphore>> {
        let mut h = self.held.lock().unwrap();
        let (_, left, permits) = h.as_mut().filter(|(o, _, _)| *o == op)?;
        let permits = permits.clone();
        *left -= 1;
        if *left == 0 {
            *h = None;
        }
        Some(permits)
    }

    async fn answer_when_allowed<T>(permits: Option<Arc<tokio::sync::Semaphore>>, answer: T) -> T {
        if let Some(p) = permits {
            p.acquire().await.expect("never closed").forget();
        }
        answer
    }

    /// A failing streamed read first yields `bytes` bytes of the object, then the error.
    pub fn mid_stream(mut self, bytes: u64) -> Self {
        self.cut_after = Some(bytes);
        self
    }

    fn gate(&self, op: Op) -> Result<(), StoreError> {
        if op != self.op {
            return Ok(());
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let from = self.fail_from.load(Ordering::SeqCst);
        if n >= from && n < from.saturating_add(self.fail_count.load(Ordering::SeqCst)) {
            return Err(StoreError::new(self.kind, format!("injected failure on {op:?} call {n}")));
        }
        Ok(())
    }
}

#[async_trait]
impl Store for FailStore {
    fn describe(&self) -> String {
        format!("fail({})", self.inner.describe())
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn check(&self) -> Result<(), StoreError> {
        // A LIST of one key, as the real stores' check.
        self.gate(Op::List)?;
        let held = self.held(Op::List);
        Self::answer_when_allowed(held, self.inner.check().await).await
    }
    async fn head(&self, key: &str, opts: HeadOpts) -> Result<ObjectHead, StoreError> {
        self.gate(Op::Head)?;
        let held = self.held(Op::Head);
        Self::answer_when_allowed(held, self.inner.head(key, opts).await).await
    }
    async fn get(&self, key: &str, r: Range<u64>, opts: GetOpts<'_>) -> Result<ByteStream, StoreError> {
        use futures::StreamExt;
        let (err, n) = match (self.gate(Op::Get), self.cut_after) {
            (Ok(()), _) => return self.inner.get(key, r, opts).await,
            (Err(e), None) => return Err(e),
            (Err(e), Some(n)) => (e, n),
        };
        let cut = (r.start + n).min(r.end);
        let head = self.inner.get(key, r.start..cut, opts).await?;
        Ok(Box::pin(head.chain(futures::stream::once(async move { Err(err) }))))
    }
    fn list(&self, prefix: &str, recursive: bool) -> ListStream {
        match self.gate(Op::List) {
            Ok(()) => {
                use futures::StreamExt;
                let inner = self.inner.list(prefix, recursive);
                let Some(held) = self.held(Op::List) else { return inner };
                let all = async move {
                    let all = futures::stream::iter(inner.collect::<Vec<_>>().await);
                    Self::answer_when_allowed(Some(held), all).await
                };
                Box::pin(futures::stream::once(all).flatten())
            }
            Err(e) => Box::pin(futures::stream::once(async move { Err(e) })),
        }
    }
    async fn put(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<ObjectMeta, StoreError> {
        self.gate(Op::Put)?;
        let held = self.held(Op::Put);
        Self::answer_when_allowed(held, self.inner.put(key, data, opts).await).await
    }
    async fn put_tried(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<crate::PutDone, StoreError> {
        let meta = self.put(key, data, opts).await?;
        let cut = self.cut_tries.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        Ok(crate::PutDone { meta, cut_tries: u32::from(cut) })
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.gate(Op::Delete)?;
        let held = self.held(Op::Delete);
        Self::answer_when_allowed(held, self.inner.delete(key).await).await
    }
    async fn delete_version(&self, key: &str, seen: &ObjectMeta) -> Result<(), StoreError> {
        self.gate(Op::Delete)?;
        let held = self.held(Op::Delete);
        Self::answer_when_allowed(held, self.inner.delete_version(key, seen).await).await
    }
    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        self.gate(Op::Copy)?;
        // Held before it reaches the store: a process that dies meanwhile never copied.
        if let Some(p) = self.held(Op::Copy) {
            p.acquire().await.expect("never closed").forget();
        }
        self.inner.copy(from, to).await?;
        if let Some(hook) = &self.after_copy {
            hook(from).await;
        }
        Ok(())
    }
    async fn rename(&self, from: &str, to: &str) -> Result<(), StoreError> {
        self.gate(Op::Rename)?;
        self.inner.rename(from, to).await
    }
    async fn create_dir(&self, key: &str) -> Result<(), StoreError> {
        self.gate(Op::CreateDir)?;
        let held = self.held(Op::CreateDir);
        Self::answer_when_allowed(held, self.inner.create_dir(key).await).await
    }
    async fn writer(&self, key: &str, opts: WriteOptions) -> Result<Box<dyn ObjectWriter>, StoreError> {
        self.gate(Op::Upload)?;
        self.inner.writer(key, opts).await
    }
    async fn clean_parts(&self, owner: &str) -> Result<usize, StoreError> {
        self.inner.clean_parts(owner).await
    }
    async fn settle(&self) {
        self.inner.settle().await
    }
    async fn patch(&self, key: &str, p: crate::Patch<'_>, opts: WriteOptions) -> Result<crate::Patched, StoreError> {
        self.gate(Op::Patch)?;
        let held = self.held(Op::Patch);
        Self::answer_when_allowed(held, self.inner.patch(key, p, opts).await).await
    }
}
