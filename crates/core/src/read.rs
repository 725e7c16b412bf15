//! The read path: exact ranges for random reads, a growing window of parallel ranged GETs
//! ahead of sequential readers, and a shared block cache bounded in bytes.
//!
//! Objects are read in blocks of [`BLOCK`] bytes. Each handle remembers where its reads
//! ended. A read that starts there (or inside blocks already fetched for it) is sequential:
//! it takes its blocks from the cache or from fetches in flight, and then makes sure the
//! next `window` blocks are being fetched in the background, each by its own ranged GET, so
//! several requests are in flight while the reader consumes the current one. The window
//! starts at one block and doubles on every sequential read up to `max_window`. A read
//! anywhere else is random: unless every block it needs is cached, it fetches exactly the
//! bytes asked for, and the window starts over. Prefetch never blocks a reader: it only
//! starts when the global prefetch budget (bytes in flight across all handles) has room.
//!
//! The kernel sends a sequential reader's readahead as several requests at once, and they
//! reach us out of order (many FUSE threads, many tasks). So once a window is open, a read
//! starting within [`REORDER`] bytes of the end of the furthest read is still sequential; a
//! reader with no window open (random) must start exactly where it left off.
//!
//! Cached blocks are keyed by (key, identity, block index), where the identity is the ETag
//! or generation seen at open (or size and mtime on stores without one), so bytes of a
//! changed object are never served. Every GET also carries the ETag (`If-Match`), so a
//! change mid-read fails with ESTALE instead of mixing versions.
//!
//! A block is streamed from the store (or read from the disk cache) straight into a
//! buffer of the shared [`BlockPool`], zero-padded to a page; the memory cache, the reply
//! and the disk-cache writer all hold views of that one buffer, which goes back to the
//! pool when the last view drops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bucketfs_store::{Store, StoreErrorKind};
use bytes::{Bytes, BytesMut};
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::TryStreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::block_pool::{round_up, BlockPool, ALIGN};
use crate::FsError;

/// Block size: 2 MiB per GET amortizes a ~20 ms round trip while keeping a random
/// reader's over-fetch (when it hits a cached neighbour) small.
pub const BLOCK: u64 = 2 * 1024 * 1024;

/// How far an open window's reads may arrive out of order: a few of the kernel's largest
/// requests (1 MiB) either side of the end of the furthest read.
pub const REORDER: u64 = 4 * 1024 * 1024;

/// Blocks queued for the disk cache at most: enough to keep a disk busy, small next to the
/// other bounds (16 MiB).
const DISK_QUEUE: usize = 8;

type Fetch = Shared<BoxFuture<'static, Result<Bytes, FsError>>>;
type BlockKey = (Arc<str>, Arc<str>, u64);

/// Shared by every handle of a mount: the block cache and the prefetch budget.
pub struct ReadCache {
    blocks: moka::sync::Cache<BlockKey, Bytes>,
    disk: Option<Arc<crate::disk_cache::DiskCache>>,
    /// Blocks waiting to be written to the disk cache; when the disk lags, new blocks are
    /// not queued (skipped), so the queue never holds more than this many blocks in memory.
    disk_queue: Arc<Semaphore>,
    /// Permits are KiB of prefetch in flight; a prefetch that finds none is skipped.
    budget: Arc<Semaphore>,
    /// Buffers blocks are fetched into; see [`ReadCache::new`] for its bound.
    pub(crate) pool: BlockPool,
}

impl ReadCache {
    /// `cache_bytes` bounds the cached blocks; `prefetch_bytes` the bytes being prefetched.
    ///
    /// The buffer pool holds at most as many blocks as those bounds and the disk queue
    /// allow to be alive at once, plus a few for demand reads: `(cache_bytes +
    /// prefetch_bytes) / BLOCK + DISK_QUEUE + 4` (60 blocks, 120 MiB, with the defaults).
    /// Blocks past that are plain allocations, freed when dropped.
    pub fn new(cache_bytes: u64, prefetch_bytes: u64) -> Self {
        let pool_max = ((cache_bytes + prefetch_bytes) / BLOCK) as usize + DISK_QUEUE + 4;
        let blocks = moka::sync::Cache::builder()
            .weigher(|_k: &BlockKey, v: &Bytes| v.len().try_into().unwrap_or(u32::MAX))
            .max_capacity(cache_bytes)
            .build();
        Self {
            blocks,
            disk: None,
            disk_queue: Arc::new(Semaphore::new(DISK_QUEUE)),
            budget: Arc::new(Semaphore::new((prefetch_bytes / 1024) as usize)),
            // Room for a whole block file (block and trailer page) read with O_DIRECT.
            pool: BlockPool::new(BLOCK as usize + ALIGN, pool_max),
        }
    }

    /// Add the on-disk cache below the memory cache.
    pub fn with_disk(mut self, disk: crate::disk_cache::DiskCache) -> Self {
        self.disk = Some(Arc::new(disk));
        self
    }

    /// Put a block we already have (just uploaded) into both caches under its new identity.
    pub fn remember(&self, key: &str, identity: &str, block: u64, data: Bytes) {
        let (k, id): (Arc<str>, Arc<str>) = (key.into(), identity.into());
        self.to_disk(&k, &id, block, data.clone(), data.len());
        self.insert((k, id, block), data);
    }

    /// Queue the first `len` bytes of `padded` for the disk cache, unless the queue is full
    /// (then it is skipped). See [`crate::disk_cache::DiskCache::put`] for `padded`.
    fn to_disk(&self, key: &Arc<str>, identity: &Arc<str>, block: u64, padded: Bytes, len: usize) {
        let Some(disk) = self.disk.clone() else { return };
        let Ok(permit) = self.disk_queue.clone().try_acquire_owned() else { return };
        let (k, id) = (key.clone(), identity.clone());
        tokio::task::spawn_blocking(move || {
            disk.put(&k, &id, block, &padded, len);
            drop(permit);
        });
    }

    /// Cache a block, and settle evictions now: moka applies them lazily, in batches of
    /// many writes, and with 2 MiB blocks that lag held far more than the bound (peak RSS).
    fn insert(&self, key: BlockKey, data: Bytes) {
        self.blocks.insert(key, data);
        self.blocks.run_pending_tasks();
    }

    /// Bytes held by the cache now (approximate: moka settles evictions lazily).
    pub fn cached_bytes(&self) -> u64 {
        self.blocks.run_pending_tasks();
        self.blocks.weighted_size()
    }

    /// Bytes held by the on-disk cache (0 without one).
    pub fn disk_bytes(&self) -> u64 {
        self.disk.as_ref().map_or(0, |d| d.used_bytes())
    }
}

/// One open file read through the store.
pub struct FileReader {
    store: Arc<dyn Store>,
    cache: Arc<ReadCache>,
    pub key: Arc<str>,
    /// Sent as If-Match; `None` on stores without ETags.
    pub etag: Option<String>,
    identity: Arc<str>,
    pub size: u64,
    max_window: u64,
    state: Mutex<ReadState>,
}

#[derive(Default)]
struct ReadState {
    /// Where the furthest sequential read ended (where the last read ended after a random
    /// one): a read starting here is sequential, or near here while a window is open.
    next: u64,
    /// Blocks to keep in flight ahead of a sequential reader.
    window: u64,
    /// Blocks fetched or being fetched for this reader, not yet passed. A prefetched block
    /// holds its share of the global budget until the reader moves past it, so the budget
    /// bounds prefetched memory, not just requests in flight.
    inflight: HashMap<u64, (Fetch, Option<OwnedSemaphorePermit>)>,
}

impl FileReader {
    /// `identity` names this version of the object for the cache (ETag, or size+mtime).
    pub fn new(
        store: Arc<dyn Store>,
        cache: Arc<ReadCache>,
        key: String,
        etag: Option<String>,
        identity: String,
        size: u64,
        max_window: u64,
    ) -> Self {
        Self {
            store,
            cache,
            key: key.into(),
            etag,
            identity: identity.into(),
            size,
            max_window: (max_window / BLOCK).max(1),
            state: Mutex::default(),
        }
    }

    /// Up to `len` bytes at `offset`; fewer only at the end of the file.
    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, FsError> {
        if offset >= self.size || len == 0 {
            return Ok(Bytes::new());
        }
        let end = (offset + len as u64).min(self.size);
        let (first, last) = (offset / BLOCK, (end - 1) / BLOCK);
        let cached: Vec<Option<Bytes>> = (first..=last).map(|b| self.cache.blocks.get(&self.block_key(b))).collect();
        let fetches = {
            let mut st = self.state.lock().unwrap();
            let near = st.window > 0 && offset.abs_diff(st.next) <= REORDER;
            let sequential = offset == st.next || near || st.inflight.contains_key(&first);
            tracing::trace!(key = %self.key, offset, len, sequential, next = st.next, window = st.window, "read");
            st.next = if sequential { st.next.max(end) } else { end };
            if !sequential && cached.iter().any(Option::is_none) {
                st.window = 0;
                st.inflight.clear();
                None
            } else {
                st.window = if sequential { (st.window * 2).clamp(1, self.max_window) } else { st.window };
                let needed: Vec<Result<Bytes, Fetch>> = (first..=last)
                    .zip(cached)
                    .map(|(b, c)| c.ok_or_else(|| self.block_fetch(&mut st, b, false).expect("demand fetch")))
                    .collect();
                if sequential {
                    for b in last + 1..=last + st.window {
                        if b * BLOCK >= self.size || self.block_fetch(&mut st, b, true).is_none() {
                            break;
                        }
                    }
                    // Blocks a late (reordered) request may still need stay in flight.
                    let keep = st.next.saturating_sub(REORDER) / BLOCK;
                    st.inflight.retain(|b, _| *b >= first.min(keep));
                }
                Some(needed)
            }
        };
        let Some(needed) = fetches else {
            // Random access: exactly the bytes asked for, nothing cached or prefetched.
            return self.fetch(offset, end).await;
        };
        let mut parts = Vec::with_capacity(needed.len());
        for (i, block) in needed.into_iter().enumerate() {
            let b = first + i as u64;
            let data = match block {
                Ok(d) => d,
                Err(f) => f.await?,
            };
            let start = if b == first { (offset - b * BLOCK) as usize } else { 0 };
            let stop = if b == last { (end - b * BLOCK) as usize } else { data.len() };
            if stop > data.len() {
                return Err(FsError::Stale(format!("{} is shorter than when it was opened", self.key)));
            }
            parts.push(data.slice(start..stop));
        }
        // Inside one block (the usual case: blocks are larger than any kernel request) the
        // reply is a view of the cached block; across blocks the parts are joined once.
        if parts.len() == 1 {
            return Ok(parts.pop().expect("one part"));
        }
        let mut out = BytesMut::with_capacity((end - offset) as usize);
        parts.iter().for_each(|p| out.extend_from_slice(p));
        Ok(out.freeze())
    }

    fn block_key(&self, b: u64) -> BlockKey {
        (self.key.clone(), self.identity.clone(), b)
    }

    /// The fetch of block `b`: already in flight, or started now. A prefetch starts only if
    /// the global budget has room (`None` otherwise, or if the block is cached).
    fn block_fetch(&self, st: &mut ReadState, b: u64, prefetch: bool) -> Option<Fetch> {
        if let Some((f, _)) = st.inflight.get(&b) {
            return Some(f.clone());
        }
        if prefetch && self.cache.blocks.contains_key(&self.block_key(b)) {
            return None;
        }
        let (start, end) = (b * BLOCK, ((b + 1) * BLOCK).min(self.size));
        let permit = if prefetch {
            Some(self.cache.budget.clone().try_acquire_many_owned(((end - start) / 1024) as u32).ok()?)
        } else {
            None
        };
        let (store, cache, key, etag, ck) = (
            self.store.clone(),
            self.cache.clone(),
            self.key.clone(),
            self.etag.clone(),
            self.block_key(b),
        );
        // A task, so the GET proceeds while nobody awaits it (that is what prefetch is).
        let task = tokio::spawn(async move {
            if let Some(disk) = cache.disk.clone() {
                let (k, id) = (ck.0.clone(), ck.1.clone());
                let pool = cache.pool.clone();
                let hit = tokio::task::spawn_blocking(move || disk.get(&k, &id, b, &pool)).await.ok().flatten();
                if let Some(data) = hit.filter(|d| d.len() as u64 == end - start) {
                    cache.insert(ck, data.clone());
                    return Ok(data);
                }
            }
            let (padded, n) = get_block(store.as_ref(), &cache.pool, &key, start, end, etag.as_deref()).await?;
            let data = padded.slice(..n);
            if n as u64 == end - start {
                cache.to_disk(&ck.0, &ck.1, b, padded, data.len());
            }
            cache.insert(ck, data.clone());
            Ok(data)
        });
        let fut = async move { task.await.unwrap_or_else(|e| Err(FsError::Local(format!("read task: {e}")))) }
            .boxed()
            .shared();
        st.inflight.insert(b, (fut.clone(), permit));
        Some(fut)
    }

    async fn fetch(&self, start: u64, end: u64) -> Result<Bytes, FsError> {
        let data = get(self.store.as_ref(), &self.key, start, end, self.etag.as_deref()).await?;
        if (data.len() as u64) < end - start {
            return Err(FsError::Stale(format!("{} is shorter than when it was opened", self.key)));
        }
        Ok(data)
    }
}

/// Bytes `start..end` streamed into a pooled buffer: how many arrived (fewer if the object
/// ended early), and a view of them zero-padded to a multiple of a page.
async fn get_block(
    store: &dyn Store,
    pool: &BlockPool,
    key: &str,
    start: u64,
    end: u64,
    etag: Option<&str>,
) -> Result<(Bytes, usize), FsError> {
    let want = (end - start) as usize;
    let mut buf = pool.take();
    let space = &mut buf.space()[..round_up(want)];
    let mut body = store.get_range_stream(key, start..end, etag).await.map_err(store_err)?;
    let mut n = 0;
    while let Some(chunk) = body.try_next().await.map_err(store_err)? {
        if chunk.len() > want - n {
            return Err(FsError::Stale(format!("{key}: the store sent more bytes than asked for")));
        }
        space[n..n + chunk.len()].copy_from_slice(&chunk);
        n += chunk.len();
    }
    space[n..round_up(n)].fill(0);
    Ok((buf.into_bytes(round_up(n)), n))
}

fn store_err(e: bucketfs_store::StoreError) -> FsError {
    match e.kind {
        StoreErrorKind::Changed | StoreErrorKind::NotFound => FsError::Stale(e.message),
        _ => FsError::Store(e),
    }
}

async fn get(store: &dyn Store, key: &str, start: u64, end: u64, etag: Option<&str>) -> Result<Bytes, FsError> {
    store.get_range(key, start..end, etag).await.map_err(store_err)
}

#[cfg(test)]
#[path = "read_tests.rs"]
mod tests;
