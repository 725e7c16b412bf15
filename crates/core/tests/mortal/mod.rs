//! A store wrapper for crash tests: the store as one mount process sees it (and an
//! outage of its HEADs or LISTs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bucketfs_store::testing::FailStore;
use bucketfs_store::{
    ByteStream, Capabilities, GetOpts, HeadOpts, ListStream, ObjectHead, ObjectMeta, ObjectWriter, PutOpts, Store,
    StoreError, WriteOptions,
};
use bytes::Bytes;

/// The store as one mount process sees it: after [`Mortal::kill`] no request of it is
/// answered (those in flight may still have changed the store, as after a `kill -9`).
pub struct Mortal {
    inner: Arc<FailStore>,
    dead: Arc<AtomicBool>,
    /// An outage of one kind of request: (HEADs, else LISTs; how many more are refused).
    refuse: std::sync::Mutex<(bool, u32)>,
}

impl Mortal {
    pub fn new(inner: Arc<FailStore>) -> Self {
        Mortal { inner, dead: Default::default(), refuse: Default::default() }
    }

    /// The next `n` HEADs (`head`), else LISTs, fail as if the store were unreachable;
    /// `n` 0 ends it.
    pub fn refuse(&self, head: bool, n: u32) {
        *self.refuse.lock().unwrap() = (head, n);
    }

    fn refused(&self, head: bool) -> Result<(), StoreError> {
        let mut r = self.refuse.lock().unwrap();
        if r.0 == head && r.1 > 0 {
            r.1 -= 1;
            return Err(StoreError::new(bucketfs_store::StoreErrorKind::Unavailable, "injected outage"));
        }
        Ok(())
    }

    pub fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }
}

/// Never returns once `dead`.
async fn alive(dead: &AtomicBool) {
    if dead.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
}

/// `call` sent only while alive, its answer seen only while alive still (a request in
/// flight at the kill may have changed the store all the same).
async fn round_trip<T>(dead: &AtomicBool, call: impl std::future::Future<Output = T>) -> T {
    alive(dead).await;
    let out = call.await;
    alive(dead).await;
    out
}

#[async_trait::async_trait]
impl Store for Mortal {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn check(&self) -> Result<(), StoreError> {
        self.inner.check().await
    }
    async fn head(&self, key: &str, opts: HeadOpts) -> Result<ObjectHead, StoreError> {
        alive(&self.dead).await;
        self.refused(true)?;
        round_trip(&self.dead, self.inner.head(key, opts)).await
    }
    async fn get(&self, key: &str, range: std::ops::Range<u64>, opts: GetOpts<'_>) -> Result<ByteStream, StoreError> {
        round_trip(&self.dead, self.inner.get(key, range, opts)).await
    }
    fn list(&self, prefix: &str, recursive: bool) -> ListStream {
        use futures::StreamExt;
        if let Err(e) = self.refused(false) {
            return Box::pin(futures::stream::once(async move { Err(e) }));
        }
        let (dead, inner) = (self.dead.clone(), self.inner.list(prefix, recursive));
        let all = async move { futures::stream::iter(round_trip(&dead, inner.collect::<Vec<_>>()).await) };
        Box::pin(futures::stream::once(all).flatten())
    }
    async fn put(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<ObjectMeta, StoreError> {
        round_trip(&self.dead, self.inner.put(key, data, opts)).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        round_trip(&self.dead, self.inner.delete(key)).await
    }
    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        round_trip(&self.dead, self.inner.copy(from, to)).await
    }
    async fn create_dir(&self, key: &str) -> Result<(), StoreError> {
        round_trip(&self.dead, self.inner.create_dir(key)).await
    }
    async fn writer(&self, key: &str, opts: WriteOptions) -> Result<Box<dyn ObjectWriter>, StoreError> {
        alive(&self.dead).await;
        let inner = self.inner.writer(key, opts).await?;
        Ok(Box::new(MortalWriter { inner, dead: self.dead.clone() }))
    }
    async fn clean_parts(&self, owner: &str) -> Result<usize, StoreError> {
        alive(&self.dead).await;
        self.inner.clean_parts(owner).await
    }
}

struct MortalWriter {
    inner: Box<dyn ObjectWriter>,
    dead: Arc<AtomicBool>,
}

#[async_trait::async_trait]
impl ObjectWriter for MortalWriter {
    async fn write(&mut self, data: Bytes) -> Result<(), StoreError> {
        alive(&self.dead).await;
        self.inner.write(data).await
    }
    async fn close(&mut self) -> Result<ObjectMeta, StoreError> {
        round_trip(&self.dead, self.inner.close()).await
    }
    async fn abort(&mut self) -> Result<(), StoreError> {
        alive(&self.dead).await;
        self.inner.abort().await
    }
}
