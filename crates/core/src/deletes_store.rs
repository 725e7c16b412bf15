//! [`DeferredDeletes`] as the [`Store`] the mount sends its requests through: each request
//! first waits for (sends at once) the pending changes it could see or collide with (a
//! listing of a prefix, a HEAD or GET of a key, every write), then goes to the store.

use super::*;

#[async_trait]
impl Store for DeferredDeletes {
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
        self.drain_key(key).await?;
        self.inner.head(key, opts).await
    }

    async fn get(&self, key: &str, range: Range<u64>, opts: GetOpts<'_>) -> Result<ByteStream, StoreError> {
        self.drain_key(key).await?;
        self.inner.get(key, range, opts).await
    }

    fn list(&self, prefix: &str, recursive: bool) -> ListStream {
        if self.pending.lock().unwrap().is_empty() {
            return self.inner.list(prefix, recursive);
        }
        // Lazily, like the listing itself: the wait happens when the stream is first polled.
        let Some(me) = self.me.upgrade() else { return self.inner.list(prefix, recursive) };
        let prefix = prefix.to_string();
        futures::stream::once(async move {
            match me.drain(|p| p.starts_with(&prefix)).await {
                Ok(()) => me.inner.list(&prefix, recursive),
                Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
            }
        })
        .flatten()
        .boxed()
    }

    async fn put(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<ObjectMeta, StoreError> {
        Ok(self.put_tried(key, data, opts).await?.meta)
    }

    async fn put_tried(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<bucketfs_store::PutDone, StoreError> {
        self.drain_under(key).await?;
        self.inner.put_tried(key, data, opts).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.drain_under(key).await?;
        self.inner.delete(key).await
    }

    async fn delete_version(&self, key: &str, seen: &ObjectMeta) -> Result<(), StoreError> {
        self.drain_under(key).await?;
        self.inner.delete_version(key, seen).await
    }

    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        self.drain_key(from).await?;
        self.drain_under(to).await?;
        self.inner.copy(from, to).await
    }

    async fn rename(&self, from: &str, to: &str) -> Result<(), StoreError> {
        self.drain_under(from).await?;
        self.drain_under(to).await?;
        self.inner.rename(from, to).await
    }

    async fn create_dir(&self, key: &str) -> Result<(), StoreError> {
        self.drain_under(key).await?;
        self.inner.create_dir(key).await
    }

    async fn writer(&self, key: &str, opts: WriteOptions) -> Result<Box<dyn ObjectWriter>, StoreError> {
        self.drain_under(key).await?;
        self.inner.writer(key, opts).await
    }

    async fn patch(
        &self,
        key: &str,
        p: bucketfs_store::Patch<'_>,
        opts: WriteOptions,
    ) -> Result<bucketfs_store::Patched, StoreError> {
        self.drain_under(key).await?;
        self.inner.patch(key, p, opts).await
    }

    async fn clean_parts(&self, owner: &str) -> Result<usize, StoreError> {
        self.inner.clean_parts(owner).await
    }
    async fn settle(&self) {
        self.inner.settle().await
    }
}
