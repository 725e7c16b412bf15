//! What the shuttle tests share: a store whose every request is a round trip.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bucketfs_store::testing::MemStore;
use bucketfs_store::{
    ByteStream, Capabilities, GetOpts, HeadOpts, ListStream, ObjectHead, ObjectMeta, ObjectWriter, PutOpts, Store,
    StoreError, WriteOptions,
};
use bytes::Bytes;
use futures::StreamExt;
use shuttle::future::yield_now;

/// MemStore where each request is a round trip: scheduling points before and after it, so
/// another task may run between sending a request and seeing its answer.
pub struct YieldStore(pub Arc<MemStore>);

async fn rt<T>(call: impl std::future::Future<Output = T>) -> T {
    yield_now().await;
    let out = call.await;
    yield_now().await;
    out
}

#[async_trait]
impl Store for YieldStore {
    fn describe(&self) -> String {
        "yield-mem".into()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn check(&self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn head(&self, key: &str, opts: HeadOpts) -> Result<ObjectHead, StoreError> {
        rt(self.0.head(key, opts)).await
    }
    async fn get(&self, key: &str, range: Range<u64>, opts: GetOpts<'_>) -> Result<ByteStream, StoreError> {
        rt(self.0.get(key, range, opts)).await
    }
    fn list(&self, prefix: &str, recursive: bool) -> ListStream {
        // The listing is taken when the first page is asked for, after a yield, like a LIST.
        let (inner, prefix) = (self.0.clone(), prefix.to_string());
        futures::stream::once(async move {
            yield_now().await;
            let page: Vec<_> = inner.list(&prefix, recursive).collect().await;
            yield_now().await;
            futures::stream::iter(page)
        })
        .flatten()
        .boxed()
    }
    async fn put(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<ObjectMeta, StoreError> {
        rt(self.0.put(key, data, opts)).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        rt(self.0.delete(key)).await
    }
    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        rt(self.0.copy(from, to)).await
    }
    async fn create_dir(&self, key: &str) -> Result<(), StoreError> {
        rt(self.0.create_dir(key)).await
    }
    async fn writer(&self, key: &str, opts: WriteOptions) -> Result<Box<dyn ObjectWriter>, StoreError> {
        rt(self.0.writer(key, opts)).await
    }
}
