//! [`ReadCache`]: what every handle of a mount shares, the memory block cache, the queue
//! to the disk cache, and the prefetch and held budgets (with their reclaim from idle
//! readers).

use super::*;

/// A block for the disk cache: block `block` of a version of `size` bytes, the first `len`
/// bytes of `padded` (see [`crate::disk_cache::DiskCache::put`]), their CRC32C if the
/// caller has it (else computed there).
pub(super) struct DiskPut {
    pub(super) key: Arc<str>,
    pub(super) identity: Arc<str>,
    pub(super) size: u64,
    pub(super) block: u64,
    pub(super) padded: Bytes,
    pub(super) len: usize,
    pub(super) crc: Option<u32>,
}

/// Shared by every handle of a mount: the block cache and the prefetch budget.
pub struct ReadCache {
    pub(super) blocks: crate::weighted::WeightedCache<BlockKey, Bytes>,
    pub(super) disk: Option<Arc<crate::disk_cache::DiskCache>>,
    /// Blocks waiting to be written to the disk cache; when the disk lags, new blocks are
    /// not queued (skipped), so the queue never holds more than this many blocks in memory.
    pub(super) disk_queue: Arc<Semaphore>,
    /// Permits are KiB of prefetch in flight; a prefetch that finds none is skipped.
    pub(super) budget: Arc<Semaphore>,
    /// Permits are KiB of the blocks readers keep that are not ahead of them (see
    /// [`FileReader::hold`]): as many as `budget`, so open handles never hold more than
    /// twice the prefetch budget, however many there are and however long they stay idle.
    pub(super) held: Arc<Semaphore>,
    /// Blocks being fetched for the disk cache after their reader closed
    /// ([`FileReader::fill_disk`]): [`FILLS`] at once across the mount.
    pub(super) fills: Arc<Semaphore>,
    /// Every reader's state, for [`ReadCache::reclaim`] (dead ones pruned now and then).
    /// A leaf lock: taken with one reader's state held, never the other way round.
    pub(super) readers: Mutex<Vec<Weak<Mutex<ReadState>>>>,
    /// When [`ReadCache::reclaim`] last ran (ms since `born`): at most every [`RECLAIM_EVERY`].
    pub(super) reclaimed: crate::sync::AtomicU64,
    pub(super) born: Instant,
    /// Buffers blocks are fetched into; see [`ReadCache::new`] for its bound.
    pub(crate) pool: BlockPool,
}

impl ReadCache {
    /// `cache_bytes` bounds the cached blocks; `prefetch_bytes` the bytes being prefetched.
    ///
    /// The buffer pool holds at most as many blocks as those bounds (the blocks readers
    /// hold count twice the prefetch budget) and the disk queue allow to be alive at once,
    /// plus a few for demand reads: `(cache_bytes + 2 * prefetch_bytes) / BLOCK +
    /// DISK_QUEUE + 4` (88 blocks, 176 MiB, with the defaults). Blocks past that are plain
    /// allocations, freed when dropped.
    pub fn new(cache_bytes: u64, prefetch_bytes: u64) -> Self {
        let pool_max = ((cache_bytes + 2 * prefetch_bytes) / BLOCK) as usize + DISK_QUEUE + 4;
        let blocks = moka::sync::Cache::builder()
            .weigher(|_k: &BlockKey, v: &Bytes| v.len().try_into().unwrap_or(u32::MAX))
            .max_capacity(cache_bytes)
            .build();
        let blocks = crate::weighted::WeightedCache::new(blocks);
        Self {
            blocks,
            disk: None,
            disk_queue: Arc::new(Semaphore::new(DISK_QUEUE)),
            budget: Arc::new(Semaphore::new((prefetch_bytes / 1024) as usize)),
            held: Arc::new(Semaphore::new((prefetch_bytes / 1024) as usize)),
            fills: Arc::new(Semaphore::new(FILLS)),
            readers: Mutex::default(),
            reclaimed: Default::default(),
            born: Instant::now(),
            // Room for a whole block file (block and trailer page) read with O_DIRECT.
            pool: BlockPool::new(BLOCK as usize + ALIGN, pool_max),
        }
    }

    /// Add the on-disk cache below the memory cache.
    pub fn with_disk(mut self, disk: crate::disk_cache::DiskCache) -> Self {
        self.disk = Some(Arc::new(disk));
        self
    }

    /// Put a block we already have (just uploaded; the version is `size` bytes) into both
    /// caches under its new identity.
    pub fn remember(&self, key: &str, identity: &str, size: u64, block: u64, data: Bytes) {
        let (k, id): (Arc<str>, Arc<str>) = (key.into(), identity.into());
        let put = DiskPut {
            key: k.clone(),
            identity: id.clone(),
            size,
            block,
            len: data.len(),
            padded: data.clone(),
            crc: None,
        };
        // Never waits: the queue has room, or the block is skipped (its caller uploads).
        futures::FutureExt::now_or_never(self.to_disk(put, std::time::Duration::ZERO));
        self.insert((k, id, block), data);
    }

    /// Drop what both caches hold of `key`'s version `identity` (`size` bytes). For a store
    /// whose versions are named by size and mtime (a local folder), which another object
    /// can share: one this mount moves to `key` (a rename keeps the mtime) must not be
    /// served the bytes of the one it replaced. Blocking file I/O (deletes).
    pub fn forget(&self, key: &str, identity: &str, size: u64) {
        let (k, id): (Arc<str>, Arc<str>) = (key.into(), identity.into());
        for b in 0..size.div_ceil(BLOCK).max(1) {
            self.blocks.invalidate(&(k.clone(), id.clone(), b));
        }
        if let Some(disk) = &self.disk {
            disk.forget(key, identity);
        }
    }

    /// Queue a block for the disk cache; `false` if there is none, or its queue stayed full
    /// for `wait` (the block is skipped). The read path's fetches arrive in bursts (a
    /// streamed GET hands over [`GROUP`] blocks at memory speed) that a disk faster than the
    /// link absorbs in a moment ([`DISK_WAIT`]), and a block skipped costs a second GET at
    /// the close (or a cache that stays incomplete).
    pub(super) async fn to_disk(&self, put: DiskPut, wait: std::time::Duration) -> bool {
        let Some(disk) = self.disk.clone() else { return false };
        let permit = match self.disk_queue.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) if wait.is_zero() => return false,
            Err(_) => match tokio::time::timeout(wait, self.disk_queue.clone().acquire_owned()).await {
                Ok(Ok(p)) => p,
                _ => return false,
            },
        };
        crate::sync::blocking_detached(move || {
            let crc = put.crc.unwrap_or_else(|| crc32c::crc32c(&put.padded[..put.len]));
            disk.put(&put.key, &put.identity, put.size, put.block, &put.padded, put.len, crc);
            drop(permit);
        });
        true
    }

    /// Cache a block, and settle evictions now: moka applies them lazily, in batches of
    /// many writes, and with 2 MiB blocks that lag held far more than the bound (peak RSS).
    ///
    /// A block under half a buffer (a small file, a file's tail) is cached as a copy: the
    /// cache weighs the bytes, but a view keeps its whole 2 MiB buffer alive, so 8,000
    /// cached 4 KB files held 17 GB of address space (one mapping each, against the
    /// kernel's limit of 65,530 per process) and kept pool buffers from being reused.
    pub(super) fn insert(&self, key: BlockKey, data: Bytes) {
        let data = if (data.len() as u64) < BLOCK / 2 { Bytes::copy_from_slice(&data) } else { data };
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

    pub(crate) fn disk(&self) -> Option<&Arc<crate::disk_cache::DiskCache>> {
        self.disk.as_ref()
    }

    /// A new reader's state, known to [`ReadCache::reclaim`].
    pub(super) fn register(&self, pace: Arc<Pace>) -> Arc<Mutex<ReadState>> {
        let state = Arc::new(Mutex::new(ReadState { pace, ..Default::default() }));
        let mut all = self.readers.lock().unwrap();
        if all.len() >= 64 && all.len().is_power_of_two() {
            all.retain(|w| w.strong_count() > 0); // closed readers, now and then
        }
        all.push(Arc::downgrade(&state));
        state
    }

    /// A reader found a budget spent: the readers idle for [`IDLE`] keep nothing and end
    /// their fetches (their shares of both budgets go back), so handles left open and
    /// unread do not starve the readers that read. At most every [`RECLAIM_EVERY`]; a
    /// reader busy now (its state locked) is skipped. The blocks stay in the caches; an
    /// idle reader that reads again fetches what it needs again.
    pub(super) fn reclaim(&self) {
        let now = self.born.elapsed().as_millis() as u64;
        let last = self.reclaimed.load(Relaxed);
        if now < last + RECLAIM_EVERY.as_millis() as u64
            || self.reclaimed.compare_exchange(last, now, Relaxed, Relaxed).is_err()
        {
            return;
        }
        let readers: Vec<Arc<Mutex<ReadState>>> = {
            let mut all = self.readers.lock().unwrap();
            all.retain(|w| w.strong_count() > 0);
            all.iter().filter_map(Weak::upgrade).collect()
        };
        for r in readers {
            let Ok(mut st) = r.try_lock() else { continue };
            if st.reading == 0 && st.last.is_some_and(|t| t.elapsed() >= IDLE) {
                st.quiesce();
            }
        }
    }

    /// Whether `p` is a share of the prefetch budget (a block ahead of its reader), not of
    /// the held one.
    pub(super) fn is_prefetch_share(&self, p: &OwnedSemaphorePermit) -> bool {
        Arc::ptr_eq(p.semaphore(), &self.budget)
    }

    /// Wait (up to `limit`) until no block is queued for the disk cache.
    pub(crate) async fn disk_settled(&self, limit: std::time::Duration) {
        let until = tokio::time::Instant::now() + limit;
        while self.disk_queue.available_permits() < DISK_QUEUE && tokio::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}
