//! Read path tests against the in-memory store (with latency where timing matters).

use super::*;
use bucketfs_store::testing::MemStore;
use bucketfs_store::PutOpts;
use futures::StreamExt;
use std::sync::atomic::Ordering;
use std::time::Duration;

fn data(n: usize) -> Bytes {
    (0..n).map(|i| (i * 7 % 251) as u8).collect::<Vec<_>>().into()
}

fn reader(store: Arc<MemStore>, cache: Arc<ReadCache>, etag: Option<String>, size: u64) -> FileReader {
    reader_of(store, cache, etag, size, 16 * BLOCK)
}

/// A reader of "f" over any store, with a read-ahead window of `window` bytes.
fn reader_of(store: Arc<dyn Store>, cache: Arc<ReadCache>, etag: Option<String>, size: u64, window: u64) -> FileReader {
    FileReader::new(store, cache, "f".into(), etag.clone(), etag.unwrap_or_default(), size, window)
}

/// Read `r` from start to end in `chunk`-byte reads, each equal to `body` at its offset.
async fn read_checked(r: &FileReader, body: &Bytes, chunk: u32) {
    let mut off = 0u64;
    while off < body.len() as u64 {
        let got = r.read(off, chunk).await.unwrap();
        assert_eq!(got, body.slice(off as usize..off as usize + got.len()), "at {off}");
        off += got.len() as u64;
    }
}

fn cache() -> Arc<ReadCache> {
    Arc::new(ReadCache::new(256 << 20, 64 << 20))
}

/// An empty directory for a disk cache, `name` and this process's id in its name.
fn fresh_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("bucketfs-rd-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Wait (up to 10 s) until the disk cache under `c` holds every block of the `len`-byte
/// file `r` read (its bytes in KiB, and 4 KiB for its sidecar): disk writes are
/// asynchronous, and the file exists before its blocks are written, so only the cache's own
/// count (kept once a write is whole) tells. Blocks that skipped the disk because its
/// writes lagged (a busy machine) are put there first, as an open does (`fill_disk`).
async fn disk_holds(c: &ReadCache, r: &FileReader, len: u64) {
    c.disk_settled(Duration::from_secs(10)).await;
    assert!(r.fill_disk(u64::MAX).await, "blocks that skipped the disk were put there");
    let whole = len.div_ceil(1024) * 1024 + 4096;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while c.disk_bytes() < whole && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(c.disk_bytes(), whole, "every block reached the disk cache");
}

/// The process ends: `c`'s lock on its disk cache directory goes, once the reader's
/// prefetch tasks and disk writes (which hold the caches too) are done. Dropped while one still held it, the
/// next mount's cache took another slot (`mount-1`), empty, and asked the store.
async fn release(c: Arc<ReadCache>) {
    let held = |c: &Arc<ReadCache>| Arc::strong_count(c) > 1 || c.disk().is_some_and(|d| Arc::strong_count(d) > 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while held(&c) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!held(&c), "a task still holds the cache after 10 s");
}

/// What a new mount starts with: an empty [`cache`] over the disk cache in `dir`.
fn cache_on_disk(dir: &std::path::Path) -> Arc<ReadCache> {
    Arc::new(ReadCache::new(256 << 20, 64 << 20).with_disk(crate::disk_cache::DiskCache::open(dir, 1 << 30).unwrap()))
}

#[tokio::test]
async fn sequential_reads_are_exact_and_use_few_requests() {
    let store = Arc::new(MemStore::new());
    let body = data(9 * BLOCK as usize + 12345);
    let m = store.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let r = reader(store.clone(), cache(), m.etag, body.len() as u64);
    read_checked(&r, &body, 128 * 1024).await;
    let n = store.requests.load(Ordering::Relaxed);
    assert!(n <= 11, "{n} requests for 10 blocks read sequentially in 128 KiB pieces");
}

#[tokio::test]
async fn a_streaming_reader_gets_a_small_file_in_two_requests() {
    // 1 MiB reads (the kernel's largest): block 0 and one grouped GET for blocks 1-4 at
    // the first read, instead of a window growing from one block (4 GETs, 3 round trips).
    let store = Arc::new(MemStore::new());
    let body = data(5 * BLOCK as usize - 3);
    let m = store.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let before = store.requests.load(Ordering::Relaxed);
    read_checked(&reader(store.clone(), cache(), m.etag.clone(), body.len() as u64), &body, STREAMING_READ).await;
    assert_eq!(store.requests.load(Ordering::Relaxed) - before, 2, "GETs for 5 blocks read in 1 MiB pieces");
    // A small first read (head, file) still starts with one block.
    let before = store.requests.load(Ordering::Relaxed);
    let r = reader(store.clone(), cache(), m.etag, body.len() as u64);
    assert_eq!(r.read(0, 4096).await.unwrap(), body.slice(..4096));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(store.requests.load(Ordering::Relaxed) - before <= 2, "a 4 KiB read prefetched more than a block ahead");
}

#[tokio::test]
async fn reordered_sequential_reads_keep_the_window() {
    // The kernel's concurrent readahead requests arrive out of order: each pair swapped, so
    // every late read is in a block the reader already moved past. No memory cache (a full
    // one may not admit the block either): the block must still be held for the late read.
    let store = Arc::new(MemStore::new().with_latency(Duration::from_millis(2)));
    let body = data(12 * BLOCK as usize);
    let m = store.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let r = reader(store.clone(), Arc::new(ReadCache::new(0, 64 << 20)), m.etag, body.len() as u64);
    let req = 1u64 << 20;
    let check = |off: u64, got: Bytes| assert_eq!(got, body.slice(off as usize..(off + req) as usize), "at {off}");
    check(0, r.read(0, req as u32).await.unwrap());
    for i in (1..body.len() as u64 / req - 1).step_by(2) {
        let (late, early) = (i * req, (i + 1) * req);
        check(early, r.read(early, req as u32).await.unwrap());
        check(late, r.read(late, req as u32).await.unwrap());
    }
    let n = store.requests.load(Ordering::Relaxed);
    assert!(n <= 13, "{n} requests for 12 blocks read in swapped pairs (exact fetches or a reset window)");
}

#[tokio::test]
async fn random_reads_fetch_exact_ranges() {
    let store = Arc::new(MemStore::new());
    let body = data(5 * BLOCK as usize);
    let m = store.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let r = reader(store.clone(), cache(), m.etag, body.len() as u64);
    let before = store.requests.load(Ordering::Relaxed);
    for (off, len) in [(3 * BLOCK + 17, 100u32), (1_000_003, 17), (4 * BLOCK - 5, 10), (5 * BLOCK - 3, 100)] {
        let got = r.read(off, len).await.unwrap();
        let end = (off as usize + len as usize).min(body.len());
        assert_eq!(got, body.slice(off as usize..end));
    }
    assert_eq!(store.requests.load(Ordering::Relaxed) - before, 4, "one exact GET per random read, no prefetch");
    assert!(r.read(body.len() as u64 + 1, 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_second_reader_is_served_from_the_block_cache() {
    let store = Arc::new(MemStore::new());
    let body = data(3 * BLOCK as usize);
    let m = store.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let c = cache();
    let r1 = reader(store.clone(), c.clone(), m.etag.clone(), body.len() as u64);
    let mut off = 0;
    while off < body.len() as u64 {
        off += r1.read(off, 1 << 20).await.unwrap().len() as u64;
    }
    tokio::time::sleep(Duration::from_millis(20)).await; // prefetch tasks settle
    let before = store.requests.load(Ordering::Relaxed);
    let r2 = reader(store.clone(), c.clone(), m.etag, body.len() as u64);
    read_checked(&r2, &body, 1 << 20).await;
    assert_eq!(store.requests.load(Ordering::Relaxed), before, "served from cache");
}

#[tokio::test]
async fn a_changed_object_is_stale_and_never_served_from_cache() {
    let store = Arc::new(MemStore::new());
    let m = store.put("f", data(1000), PutOpts::default()).await.unwrap();
    let c = cache();
    let r = reader(store.clone(), c.clone(), m.etag.clone(), 1000);
    assert_eq!(r.read(100, 10).await.unwrap().len(), 10); // random: an exact GET
    let new = Bytes::from(vec![9u8; 1000]);
    let m2 = store.put("f", new.clone(), PutOpts::default()).await.unwrap();
    // The next GET carries the old ETag: the handle fails rather than mix versions.
    assert!(matches!(r.read(500, 10).await, Err(FsError::Stale(_))));
    // A new identity never sees the old version's cached block.
    let r2 = reader(store.clone(), c, m2.etag, 1000);
    assert_eq!(r2.read(0, 1000).await.unwrap(), new);
}

#[tokio::test]
async fn prefetch_overlaps_requests_for_a_faster_sequential_read() {
    // 20 ms a request: a window of parallel GETs must beat one request per block.
    let store = Arc::new(MemStore::new().with_latency(Duration::from_millis(20)));
    let body = data(16 * BLOCK as usize);
    let m = store.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let r = reader(store.clone(), cache(), m.etag, body.len() as u64);
    let t = std::time::Instant::now();
    let mut off = 0;
    while off < body.len() as u64 {
        off += r.read(off, 1 << 20).await.unwrap().len() as u64;
    }
    let serial = Duration::from_millis(20 * 16);
    assert!(t.elapsed() < serial * 2 / 3, "{:?} for 16 blocks: prefetch did not overlap", t.elapsed());
}

#[tokio::test]
async fn cache_and_budget_are_bounded() {
    let store = Arc::new(MemStore::new());
    let body = data(20 * BLOCK as usize);
    let m = store.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let c = Arc::new(ReadCache::new(4 * BLOCK, 4 * BLOCK));
    let r = reader(store.clone(), c.clone(), m.etag, body.len() as u64);
    read_checked(&r, &body, 1 << 20).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(c.cached_bytes() <= 4 * BLOCK, "cache holds {} bytes", c.cached_bytes());
}

#[tokio::test]
async fn the_disk_cache_serves_a_new_mount_and_survives_corruption() {
    let store = Arc::new(MemStore::new());
    let body = data(3 * BLOCK as usize + 5);
    let m = store.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let dir = fresh_dir("disk");
    let open = |c| reader(store.clone(), c, m.etag.clone(), body.len() as u64);
    let first = cache_on_disk(&dir);
    let r0 = open(first.clone());
    assert_eq!(read_all(&r0, 1 << 20).await, body);
    disk_holds(&first, &r0, body.len() as u64).await;
    drop(r0);
    release(first).await;
    // A new memory cache (a remount): every block comes from disk, no GET.
    let before = store.requests.load(Ordering::Relaxed);
    assert_eq!(read_all(&open(cache_on_disk(&dir)), 1 << 20).await, body);
    assert_eq!(store.requests.load(Ordering::Relaxed), before, "served from the disk cache");
    // Corrupt the data file: reads are still right, refetched from the store.
    for e in std::fs::read_dir(&dir).unwrap().flatten().filter(|e| e.path().extension().is_some_and(|x| x == "d")) {
        let mut raw = std::fs::read(e.path()).unwrap();
        raw[1] ^= 0x55; // a byte of the block's data
        std::fs::write(e.path(), raw).unwrap();
    }
    assert_eq!(read_all(&open(cache_on_disk(&dir)), 1 << 20).await, body);
    assert!(store.requests.load(Ordering::Relaxed) > before, "corrupted blocks were refetched");
}

#[tokio::test]
async fn random_reads_of_blocks_on_disk_make_no_request() {
    // Pages the kernel dropped, or a new mount: a random read whose blocks the disk cache
    // holds is served from there (one local block read, then the memory cache), not GET.
    let store = Arc::new(MemStore::new());
    let body = data(4 * BLOCK as usize + 9);
    let m = store.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let dir = fresh_dir("random");
    let open = |c| reader(store.clone(), c, m.etag.clone(), body.len() as u64);
    let first = cache_on_disk(&dir);
    let r0 = open(first.clone());
    read_checked(&r0, &body, 1 << 20).await;
    disk_holds(&first, &r0, body.len() as u64).await;
    drop(r0);
    release(first).await;
    let r = open(cache_on_disk(&dir));
    let before = store.requests.load(Ordering::Relaxed);
    let reads =
        [(3 * BLOCK + 17, 4096u32), (1_000_003, 17), (2 * BLOCK - 5, 10), (4 * BLOCK, 9), (3 * BLOCK + 9000, 4096)];
    for (off, len) in reads {
        let end = (off as usize + len as usize).min(body.len());
        assert_eq!(r.read(off, len).await.unwrap(), body.slice(off as usize..end), "at {off}");
    }
    assert_eq!(store.requests.load(Ordering::Relaxed), before, "every random read came from the disk cache");
    // A read past this version's end (the kernel saw a newer, longer object) asks the store,
    // whose If-Match says whether the object changed, instead of answering short from disk.
    drop(r);
    let r = open(cache_on_disk(&dir));
    assert_eq!(r.read(4 * BLOCK, 100).await.unwrap(), body.slice(4 * BLOCK as usize..));
    assert_eq!(store.requests.load(Ordering::Relaxed), before + 1, "a read past the end: one exact GET");
    let before = before + 1;
    // A block the disk cache does not hold (deleted behind it) is fetched exactly, as before.
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        std::fs::remove_file(e.path()).unwrap();
    }
    drop(r);
    let r = open(cache_on_disk(&dir));
    assert_eq!(r.read(BLOCK + 1, 10).await.unwrap(), body.slice(BLOCK as usize + 1..BLOCK as usize + 11));
    assert_eq!(store.requests.load(Ordering::Relaxed), before + 1, "a block gone from disk: one exact GET");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn blocks_reuse_pooled_buffers_within_the_bound() {
    let store = Arc::new(MemStore::new());
    let body = data(40 * BLOCK as usize);
    let m = store.put("f", body.clone(), PutOpts::default()).await.unwrap();
    // Cache 4 blocks, prefetch 4: the pool's bound is 4 + 4 + DISK_QUEUE + 4 = 20 buffers.
    let c = Arc::new(ReadCache::new(4 * BLOCK, 4 * BLOCK));
    let r = reader(store.clone(), c.clone(), m.etag, body.len() as u64);
    read_checked(&r, &body, 1 << 20).await;
    assert!(c.pool.pooled() <= 20, "40 blocks read through {} pooled buffers", c.pool.pooled());
    drop(r);
    assert!(c.pool.free() > 0, "buffers no longer viewed are back in the pool");
}

#[tokio::test]
async fn cached_small_files_hold_no_block_buffer() {
    // The memory cache weighs bytes; a 4 KB file cached as a view of its 2 MiB buffer kept
    // the whole buffer (and, past the pool, a mapping of its own) for as long as it stayed.
    let store = Arc::new(MemStore::new());
    let c = cache();
    for i in 0..100 {
        let (key, body) = (format!("f{i}"), data(4000 + i));
        let m = store.put(&key, body.clone(), PutOpts::default()).await.unwrap();
        let etag = m.etag.unwrap();
        let r = FileReader::new(store.clone(), c.clone(), key, Some(etag.clone()), etag, body.len() as u64, BLOCK);
        assert_eq!(read_all(&r, 1 << 20).await, body);
    }
    assert_eq!(c.cached_bytes(), (0..100).map(|i| 4000 + i).sum::<u64>(), "every file cached");
    assert_eq!(c.pool.free(), c.pool.pooled(), "no buffer held by the cache");
}

/// A store whose streamed GETs arrive in 256 KiB chunks, `delay` apart, and record their
/// ranges; the GET covering more than one block whose number is `cut_group` (1-based)
/// fails after `cut_after` bytes.
struct Chunked {
    inner: Arc<MemStore>,
    delay: Duration,
    cut_group: u64,
    cut_after: usize,
    /// Bytes a piece of the body (256 KiB unless changed).
    chunk: usize,
    groups: std::sync::atomic::AtomicU64,
    ranges: std::sync::Mutex<Vec<std::ops::Range<u64>>>,
    /// GETs whose body is being sent now, and the most at once.
    open: Arc<std::sync::atomic::AtomicUsize>,
    peak: Arc<std::sync::atomic::AtomicUsize>,
}

impl Chunked {
    fn new(inner: Arc<MemStore>, delay: Duration) -> Self {
        Self {
            inner,
            delay,
            cut_group: 0,
            cut_after: 0,
            chunk: 256 << 10,
            groups: Default::default(),
            ranges: Default::default(),
            open: Default::default(),
            peak: Default::default(),
        }
    }
}

#[async_trait::async_trait]
impl Store for Chunked {
    fn describe(&self) -> String {
        "chunked".into()
    }
    fn capabilities(&self) -> bucketfs_store::Capabilities {
        self.inner.capabilities()
    }
    async fn check(&self) -> Result<(), bucketfs_store::StoreError> {
        Ok(())
    }
    async fn head(
        &self,
        key: &str,
        opts: bucketfs_store::HeadOpts,
    ) -> Result<bucketfs_store::ObjectHead, bucketfs_store::StoreError> {
        self.inner.head(key, opts).await
    }
    async fn get(
        &self,
        key: &str,
        r: std::ops::Range<u64>,
        opts: GetOpts<'_>,
    ) -> Result<bucketfs_store::ByteStream, bucketfs_store::StoreError> {
        self.ranges.lock().unwrap().push(r.clone());
        let grouped = r.end - r.start > BLOCK;
        let cut = grouped && self.groups.fetch_add(1, Ordering::SeqCst) + 1 == self.cut_group;
        let data = self.inner.get_range(key, r, opts).await?;
        let (delay, limit, size) = (self.delay, if cut { self.cut_after } else { data.len() }, self.chunk);
        let chunks: Vec<Bytes> = (0..limit).step_by(size).map(|i| data.slice(i..(i + size).min(limit))).collect();
        let mut items: Vec<Result<Bytes, bucketfs_store::StoreError>> = chunks.into_iter().map(Ok).collect();
        if cut {
            items.push(Err(bucketfs_store::StoreError::new(StoreErrorKind::Unavailable, "connection reset")));
        }
        let open = self.open.clone();
        self.peak.fetch_max(open.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
        let done = futures::stream::once(async move {
            open.fetch_sub(1, Ordering::SeqCst);
            None
        });
        Ok(futures::stream::iter(items.into_iter().map(Some))
            .chain(done)
            .filter_map(|c| async move { c })
            .then(move |c| async move {
                tokio::time::sleep(delay).await;
                c
            })
            .boxed())
    }
    fn list(&self, prefix: &str, recursive: bool) -> bucketfs_store::ListStream {
        self.inner.list(prefix, recursive)
    }
    async fn put(
        &self,
        key: &str,
        data: Bytes,
        opts: PutOpts,
    ) -> Result<bucketfs_store::ObjectMeta, bucketfs_store::StoreError> {
        self.inner.put(key, data, opts).await
    }
    async fn delete(&self, key: &str) -> Result<(), bucketfs_store::StoreError> {
        self.inner.delete(key).await
    }
    async fn copy(&self, from: &str, to: &str) -> Result<(), bucketfs_store::StoreError> {
        self.inner.copy(from, to).await
    }
    async fn create_dir(&self, key: &str) -> Result<(), bucketfs_store::StoreError> {
        self.inner.create_dir(key).await
    }
    async fn writer(
        &self,
        key: &str,
        opts: bucketfs_store::WriteOptions,
    ) -> Result<Box<dyn bucketfs_store::ObjectWriter>, bucketfs_store::StoreError> {
        self.inner.writer(key, opts).await
    }
}

async fn read_all(r: &FileReader, piece: u32) -> Vec<u8> {
    let mut out = Vec::new();
    while (out.len() as u64) < r.size {
        out.extend_from_slice(&r.read(out.len() as u64, piece).await.unwrap());
    }
    out
}

#[tokio::test]
async fn a_sequential_reader_fetches_whole_groups_of_blocks_per_request() {
    let store = Arc::new(MemStore::new());
    let body = data(40 * BLOCK as usize + 777);
    let m = store.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let r = reader_of(store.clone(), cache(), m.etag.clone(), body.len() as u64, 32 * BLOCK);
    assert_eq!(read_all(&r, 1 << 20).await, body);
    let n = store.requests.load(Ordering::Relaxed);
    // One GET a block until the window holds a group (at most 6), then GROUP blocks a GET,
    // where a GET per block would be 41.
    assert!(n <= 6 + 41 / GROUP + 2, "{n} requests for 41 blocks read sequentially");
}

#[tokio::test]
async fn a_cut_off_group_refetches_only_its_unfinished_blocks() {
    let mem = Arc::new(MemStore::new());
    let body = data(30 * BLOCK as usize);
    let m = mem.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let mut store = Chunked::new(mem, Duration::ZERO);
    (store.cut_group, store.cut_after) = (1, 2 * BLOCK as usize + 1000);
    let store = Arc::new(store);
    let r = reader_of(store.clone(), cache(), m.etag.clone(), body.len() as u64, 32 * BLOCK);
    assert_eq!(read_all(&r, 1 << 20).await, body, "the reader never sees the cut");
    let ranges = store.ranges.lock().unwrap().clone();
    let at = ranges.iter().position(|r| r.end - r.start > BLOCK).expect("a grouped GET");
    let cut = ranges[at].clone();
    assert_eq!(cut.end - cut.start, GROUP * BLOCK);
    let b0 = cut.start / BLOCK;
    // The two blocks that arrived whole are never asked for again; each of the rest is.
    let later: Vec<_> = ranges[at + 1..].iter().filter(|r| r.start < cut.end && r.end > cut.start).cloned().collect();
    let want: Vec<_> = (b0 + 2..b0 + GROUP).map(|b| b * BLOCK..(b + 1) * BLOCK).collect();
    let mut got = later.clone();
    got.sort_by_key(|r| r.start);
    assert_eq!(got, want, "refetched after the cut");
}

#[tokio::test]
async fn a_block_is_handed_over_before_its_group_ends() {
    // 8 chunks of 5 ms a block: the group takes >= GROUP x 40 ms, its first block 40 ms.
    let mem = Arc::new(MemStore::new());
    let body = data(GROUP as usize * BLOCK as usize);
    let m = mem.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let store = Arc::new(Chunked::new(mem, Duration::from_millis(5)));
    let r = reader_of(store.clone(), cache(), m.etag.clone(), body.len() as u64, 32 * BLOCK);
    let (first, last) = {
        let mut st = r.state.lock().unwrap();
        r.start_fetch(&mut st, 0, GROUP, 1, false).unwrap();
        (st.inflight[&0].0.clone(), st.inflight[&(GROUP - 1)].0.clone())
    };
    assert_eq!(first.await.unwrap(), body.slice(..BLOCK as usize));
    assert!(last.clone().now_or_never().is_none(), "the group's last block is still on its way");
    assert_eq!(last.await.unwrap(), body.slice((GROUP - 1) as usize * BLOCK as usize..));
    assert_eq!(store.ranges.lock().unwrap().len(), 1, "one GET for the group");
}

#[tokio::test]
async fn a_reader_short_of_budget_for_a_whole_group_takes_what_there_is() {
    // A budget one block short of a group: whole groups never fit, yet the reader (nothing
    // else in flight ahead of it) still prefetches, several blocks a GET.
    let store = Arc::new(MemStore::new());
    let body = data(30 * BLOCK as usize);
    let m = store.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let c = Arc::new(ReadCache::new(256 << 20, (GROUP - 1) * BLOCK));
    let r = reader_of(store.clone(), c, m.etag.clone(), body.len() as u64, 32 * BLOCK);
    assert_eq!(read_all(&r, 1 << 20).await, body);
    let n = store.requests.load(Ordering::Relaxed);
    assert!(n <= 6 + 30 / (GROUP - 1) + 2, "{n} requests for 30 blocks");
}

#[tokio::test]
async fn blocks_streamed_in_pieces_across_block_boundaries_are_served_from_disk() {
    // 100,000-byte pieces: blocks begin and end mid-piece, so each block's CRC32C is summed
    // over pieces cut at its edges as they stream in. A wrong sum would make every disk read
    // a miss (a refetch), which the second reader would show as GETs.
    let mem = Arc::new(MemStore::new());
    let body = data(5 * BLOCK as usize + 777); // 6 blocks: fewer than the disk queue holds
    let m = mem.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let mut store = Chunked::new(mem, Duration::ZERO);
    store.chunk = 100_000;
    let store = Arc::new(store);
    let dir = fresh_dir("pieces");
    let open = |c| reader_of(store.clone(), c, m.etag.clone(), body.len() as u64, 32 * BLOCK);
    let first = cache_on_disk(&dir);
    let r0 = open(first.clone());
    assert_eq!(read_all(&r0, 1 << 20).await, body);
    disk_holds(&first, &r0, body.len() as u64).await;
    drop(r0);
    release(first).await;
    let before = store.ranges.lock().unwrap().len();
    assert_eq!(read_all(&open(cache_on_disk(&dir)), 1 << 20).await, body);
    assert_eq!(store.ranges.lock().unwrap().len(), before, "every block came from the disk cache");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn fill_disk_completes_a_version_pinned_by_its_etag() {
    // A first read whose blocks skipped a lagging disk: the close completes the version on
    // disk (so the kernel can read its file), within a bound, and never with other bytes.
    let store = Arc::new(MemStore::new());
    let body = data(5 * BLOCK as usize + 3);
    let m = store.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let dir = fresh_dir("fill");
    let c = cache_on_disk(&dir);
    let r = reader(store.clone(), c.clone(), m.etag.clone(), body.len() as u64);
    // Blocks 0 and 1 are on disk; 2..=5 are missing.
    let disk = c.disk().unwrap().clone();
    for b in 0..2usize {
        let chunk = &body[b * BLOCK as usize..(b + 1) * BLOCK as usize];
        let mut buf = c.pool.take();
        buf.space()[..chunk.len()].copy_from_slice(chunk);
        let (size, padded) = (body.len() as u64, buf.into_bytes(chunk.len()));
        disk.put("f", r.identity(), size, b as u64, &padded, chunk.len(), crc32c::crc32c(chunk));
    }
    let before = store.requests.load(Ordering::Relaxed);
    assert!(!r.fill_disk(3).await, "more missing than allowed: nothing done");
    assert_eq!(store.requests.load(Ordering::Relaxed), before);
    assert!(r.fill_disk(4).await);
    assert_eq!(store.requests.load(Ordering::Relaxed), before + 4, "one GET per missing block");
    assert!(disk.is_complete("f", r.identity(), body.len() as u64));
    let w = disk.whole("f", r.identity(), body.len() as u64).unwrap();
    assert_eq!(std::fs::read(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&w.file))).unwrap(), body);
    // The object changed in the bucket: the old version cannot be completed.
    let c2 = cache_on_disk(&fresh_dir("fill2"));
    let old = reader(store.clone(), c2.clone(), m.etag.clone(), body.len() as u64);
    store.put("f", data(100), PutOpts::default()).await.unwrap();
    assert!(!old.fill_disk(10).await, "If-Match refuses the changed object");
    assert!(!c2.disk().unwrap().contains("f", old.identity(), 0));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn readers_closed_together_fill_the_disk_cache_a_few_blocks_at_a_time() {
    // 300 handles closed at once each fetched their missing blocks at once: 700 MB in
    // flight. Across the mount, at most FILLS blocks are fetched for the disk at once.
    let mem = Arc::new(MemStore::new());
    let store = Arc::new(Chunked::new(mem.clone(), Duration::from_millis(5)));
    let dir = fresh_dir("fills");
    let c = cache_on_disk(&dir);
    let mut readers = Vec::new();
    for i in 0..6 {
        let key = format!("f{i}");
        let body = data(5 * BLOCK as usize + i);
        let etag = mem.put(&key, body.clone(), PutOpts::default()).await.unwrap().etag.unwrap();
        readers.push(FileReader::new(
            store.clone(),
            c.clone(),
            key,
            Some(etag.clone()),
            etag,
            body.len() as u64,
            BLOCK,
        ));
    }
    let filled = futures::future::join_all(readers.iter().map(|r| r.fill_disk(u64::MAX))).await;
    assert!(filled.iter().all(|f| *f), "every version completed on disk");
    let peak = store.peak.load(Ordering::SeqCst);
    assert!(peak <= FILLS, "{peak} blocks fetched at once for the disk cache");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Blocks of `r` filled (in the memory cache: no disk cache here), and fetches in flight.
fn filled(r: &FileReader) -> (Vec<u64>, usize) {
    let done = (0..r.size.div_ceil(BLOCK)).filter(|&b| r.cache.blocks.contains_key(&r.block_key(b))).collect();
    (done, r.state.lock().unwrap().inflight.len())
}

#[tokio::test]
async fn a_wide_window_fills_only_so_far_ahead_of_a_slow_reader() {
    // A window of 32 blocks (64 MiB): its GETs go out, but a reader that stops reading
    // has at most AHEAD blocks filled ahead of it (memory), until it reads on.
    let store = Arc::new(MemStore::new());
    let body = data(40 * BLOCK as usize);
    let m = store.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let r = reader_of(store.clone(), cache(), m.etag.clone(), body.len() as u64, 32 * BLOCK);
    for off in (0..4 * BLOCK).step_by(1 << 20) {
        assert_eq!(r.read(off, 1 << 20).await.unwrap(), body.slice(off as usize..off as usize + (1 << 20)));
    }
    let settled = || async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        filled(&r)
    };
    let (done, inflight) = settled().await;
    assert!(inflight > 12, "the window's fetches went out: {inflight}");
    let last = *done.last().unwrap();
    assert!(last < 3 + AHEAD, "filled up to block {last}, more than {AHEAD} ahead of block 3");
    // Reading on releases the next ones.
    for off in (4 * BLOCK..12 * BLOCK).step_by(1 << 20) {
        assert_eq!(r.read(off, 1 << 20).await.unwrap(), body.slice(off as usize..off as usize + (1 << 20)));
    }
    let (done, _) = settled().await;
    let last = *done.last().unwrap();
    assert!((11 + AHEAD / 2..11 + AHEAD).contains(&last), "filled up to block {last}, reader at 11");
    read_checked(&r, &body, 1 << 20).await;
    // A reader dropped with fetches paused: they end, and their buffers go back.
    let r = reader_of(store.clone(), cache(), m.etag.clone(), body.len() as u64, 32 * BLOCK);
    for off in (0..2 * BLOCK).step_by(1 << 20) {
        r.read(off, 1 << 20).await.unwrap();
    }
    let pool = r.cache.pool.clone();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(r);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(pool.free(), pool.pooled(), "every buffer back in the pool");
}

/// Bytes of fetched blocks `r` keeps (ahead of it, asked for, or passed).
fn kept(r: &FileReader) -> u64 {
    let st = r.state.lock().unwrap();
    // Polled, not peeked: a prefetched block nobody awaited shows no output to `peek`.
    st.inflight
        .values()
        .filter_map(|(f, _)| f.clone().now_or_never().and_then(Result::ok))
        .map(|d| d.len() as u64)
        .sum()
}

#[tokio::test]
async fn idle_open_readers_keep_no_more_than_the_budgets() {
    // Each open handle kept the first block it read (2 MiB) for as long as it stayed open:
    // 300 handles that had read 4 KiB each held 700 MB. Now what readers keep is bounded by
    // the prefetch budget (ahead of them) and as much again (asked for, or passed).
    let store = Arc::new(MemStore::new());
    let c = Arc::new(ReadCache::new(4 * BLOCK, 4 * BLOCK));
    let mut readers = Vec::new();
    for i in 0..40 {
        let (key, body) = (format!("f{i}"), data(3 * BLOCK as usize + i));
        let m = store.put(&key, body.clone(), PutOpts::default()).await.unwrap();
        let etag = m.etag.unwrap();
        let r = FileReader::new(store.clone(), c.clone(), key, Some(etag.clone()), etag, body.len() as u64, 16 * BLOCK);
        assert_eq!(r.read(0, 4096).await.unwrap(), body.slice(..4096));
        readers.push((r, body));
    }
    tokio::time::sleep(Duration::from_millis(200)).await; // prefetches land
    let total: u64 = readers.iter().map(|(r, _)| kept(r)).sum();
    assert!(total <= 8 * BLOCK, "40 idle readers keep {} MiB", total >> 20);
    // Each still reads on correctly, whatever it no longer keeps.
    for (r, body) in &readers {
        read_checked(r, body, 1 << 20).await;
    }
    drop(readers);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Small files: a kept block is a copy, not a view of its pooled 2 MiB buffer.
    let in_use = |c: &ReadCache| c.pool.pooled() - c.pool.free();
    let before = in_use(&c); // the memory cache's views of big blocks
    let small: Vec<FileReader> = futures::future::join_all((0..20).map(|i| {
        let (store, c) = (store.clone(), c.clone());
        async move {
            let (key, body) = (format!("s{i}"), data(4000 + i));
            let m = store.put(&key, body.clone(), PutOpts::default()).await.unwrap();
            let etag = m.etag.unwrap();
            let r = FileReader::new(store, c, key, Some(etag.clone()), etag, body.len() as u64, BLOCK);
            assert_eq!(r.read(0, 100).await.unwrap(), body.slice(..100));
            r
        }
    }))
    .await;
    assert!(small.iter().all(|r| kept(r) > 0), "each small reader keeps its block");
    // (The memory cache may have let one of its big blocks go meanwhile.)
    assert!(in_use(&c) <= before, "pooled buffers held by the small readers: {} > {before}", in_use(&c));
}

/// Prefetched blocks `r` keeps ahead of it (each holding a share of the prefetch budget).
fn ahead(r: &FileReader) -> usize {
    let st = r.state.lock().unwrap();
    st.inflight.values().filter(|(_, p)| p.as_ref().is_some_and(|p| r.cache.is_prefetch_share(p))).count()
}

#[tokio::test]
async fn a_reader_left_idle_gives_its_budget_to_one_that_reads() {
    // A handle left open after a sequential read kept its prefetched blocks, and their share
    // of the prefetch budget, for as long as it stayed open: enough such handles left every
    // other reader with no prefetch at all.
    let store = Arc::new(MemStore::new());
    let body = data(20 * BLOCK as usize);
    let m = store.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let c = Arc::new(ReadCache::new(0, 4 * BLOCK));
    let idle = reader(store.clone(), c.clone(), m.etag.clone(), body.len() as u64);
    assert_eq!(idle.read(0, 1 << 20).await.unwrap(), body.slice(..1 << 20));
    tokio::time::sleep(IDLE + Duration::from_millis(200)).await;
    assert!(ahead(&idle) > 0 && c.budget.available_permits() == 0, "the idle reader holds the whole budget");
    let busy = reader(store.clone(), c.clone(), m.etag.clone(), body.len() as u64);
    assert_eq!(busy.read(0, 1 << 20).await.unwrap(), body.slice(..1 << 20));
    assert!(
        ahead(&busy) > 0,
        "the reader that reads prefetches: idle {} avail {}",
        ahead(&idle),
        c.budget.available_permits()
    );
    assert_eq!(ahead(&idle), 0, "the idle reader gave its prefetched blocks back");
    // Both read on correctly.
    read_checked(&busy, &body, 1 << 20).await;
    assert_eq!(idle.read(1 << 20, 1 << 20).await.unwrap(), body.slice(1 << 20..2 << 20));
}

#[tokio::test]
async fn an_idle_reader_with_fetches_paused_or_a_read_cancelled_gives_everything_back() {
    // A wide window (16 blocks, more than AHEAD): most of an idle reader's prefetches are
    // paused GETs, not blocks that arrived, and they hold their budget shares too.
    let store = Arc::new(MemStore::new());
    let body = data(40 * BLOCK as usize);
    let m = store.put("f", body.clone(), PutOpts::default()).await.unwrap();
    let c = Arc::new(ReadCache::new(0, 16 * BLOCK));
    let all = c.budget.available_permits();
    let idle = reader(store.clone(), c.clone(), m.etag.clone(), body.len() as u64);
    for off in (0..3 << 20).step_by(1 << 20) {
        assert_eq!(idle.read(off, 1 << 20).await.unwrap(), body.slice(off as usize..off as usize + (1 << 20)));
    }
    tokio::time::sleep(IDLE + Duration::from_millis(200)).await;
    assert!(ahead(&idle) > AHEAD as usize, "fetches beyond AHEAD are paused: {}", ahead(&idle));
    // A read cancelled midway (its caller gave up) still ends, so its reader can be idle.
    let slow = Arc::new(Chunked::new(store.clone(), Duration::from_millis(50)));
    let cancelled = reader_of(slow, c.clone(), m.etag.clone(), body.len() as u64, 16 * BLOCK);
    assert!(tokio::time::timeout(Duration::from_millis(20), cancelled.read(0, 1 << 20)).await.is_err());
    tokio::time::sleep(IDLE + Duration::from_millis(200)).await;
    let busy = reader(store.clone(), c.clone(), m.etag.clone(), body.len() as u64);
    read_checked(&busy, &body, 1 << 20).await;
    assert_eq!(idle.state.lock().unwrap().inflight.len(), 0, "the idle reader keeps nothing");
    assert_eq!(cancelled.state.lock().unwrap().inflight.len(), 0, "nor does the cancelled one");
    drop(busy);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(c.budget.available_permits(), all, "the whole prefetch budget is back");
    // The idle reader reads on correctly.
    assert_eq!(idle.read(3 << 20, 1 << 20).await.unwrap(), body.slice(3 << 20..4 << 20));
}
