//! The read path: exact ranges for random reads, a growing window of parallel ranged GETs
//! ahead of sequential readers, and a shared block cache bounded in bytes.
//!
//! Objects are read in blocks of [`BLOCK`] bytes. Each handle remembers where its reads
//! ended. A read that starts there (or inside blocks already fetched for it) is sequential:
//! it takes its blocks from the cache or from fetches in flight, and then makes sure the
//! next `window` blocks are being fetched in the background, so several requests are in
//! flight while the reader consumes the current one. The window starts at one block (at
//! [`GROUP`] blocks for a reader whose requests are [`STREAMING_READ`] bytes) and doubles
//! on every sequential read up to `max_window`. While it is small each block is its
//! own ranged GET (a short first request: low latency to the first byte); once it holds
//! [`GROUP`] blocks, one streamed GET covers [`GROUP`] blocks, and each block is handed to
//! its waiters as soon as its last byte arrives. A GET cut off early refetches only its
//! unfinished blocks, each on its own. A read
//! anywhere else is random: unless every block it needs is cached (in memory or on disk),
//! it fetches exactly the bytes asked for, and the window starts over. Prefetch never
//! blocks a reader: it only starts when the global prefetch budget (bytes in flight across
//! all handles) has room.
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

use crate::sync::{Arc, Mutex, Ordering::Relaxed, Weak};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bucketfs_store::{GetOpts, Store, StoreErrorKind, StoreExt};
use bytes::{Buf, Bytes, BytesMut};
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::TryStreamExt;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::block_pool::{round_up, BlockBuf, BlockPool, ALIGN};
use crate::FsError;
#[path = "read_cache.rs"]
mod cache;
#[path = "read_fetch.rs"]
mod fetch;
use cache::DiskPut;
pub use cache::ReadCache;
use fetch::Source;

pub use crate::disk_cache::BLOCK;

/// Bytes of block `b` of an object of `size` bytes (the last one may be short).
fn block_len(size: u64, b: u64) -> u64 {
    ((b + 1) * BLOCK).min(size) - b * BLOCK
}

/// How far an open window's reads may arrive out of order: a few of the kernel's largest
/// requests (1 MiB) either side of the end of the furthest read.
pub const REORDER: u64 = 4 * 1024 * 1024;

/// Blocks one streamed GET covers once a reader is clearly sequential (8 MiB): a server
/// spends CPU on every request (and a cloud bills it), so fewer, longer requests leave more
/// of the machine to moving bytes. Measured on a cold 1 GiB read (10 ms each way): 136
/// GETs, not 517; bucketfs and the GCS emulator about 10% less CPU; MinIO reading from a
/// cold disk no less CPU (16 MiB groups cost it about 15% more, so not larger).
pub const GROUP: u64 = 4;

/// A sequential read this large is the kernel's largest request (its readahead at full
/// size, or `dd bs=1M`): a streaming reader. Its window opens at [`GROUP`] blocks at once
/// instead of growing from one, so a 10 MB file takes one round trip, not three. Small
/// first reads (`head`, `file`) still start from one block.
pub const STREAMING_READ: u32 = 1024 * 1024;

/// Blocks a sequential reader's fetches may fill ahead of where it reads (16 MiB). The
/// window may hold more GETs in flight than that (a link with a long round trip needs
/// them); a GET that reaches this far stops reading its body until the reader comes
/// nearer, so the memory a reader holds does not grow with its window where the link is
/// faster than the reader (the server waits on TCP's flow control meanwhile).
pub const AHEAD: u64 = 8;

/// Where a reader is, for the fetches ahead of it (see [`AHEAD`]).
#[derive(Default)]
struct Pace {
    /// The block the reader's furthest read ended in.
    at: crate::sync::AtomicU64,
    /// Set when the reader is dropped: its paused fetches end.
    closed: crate::sync::AtomicBool,
    /// Bumped when an idle reader's fetches are dropped ([`ReadCache::reclaim`]): fetches
    /// started before end as if their reader were gone.
    epoch: crate::sync::AtomicU64,
    moved: tokio::sync::Notify,
}

impl Pace {
    fn advance(&self, block: u64) {
        if self.at.fetch_max(block, Relaxed) < block {
            self.moved.notify_waiters();
        }
    }

    fn close(&self) {
        self.closed.store(true, Relaxed);
        self.moved.notify_waiters();
    }

    /// End the fetches started so far (those paused included).
    fn drop_fetches(&self) {
        self.epoch.fetch_add(1, Relaxed);
        self.moved.notify_waiters();
    }

    /// Whether a fetch started in `epoch` is to end: its reader is gone or dropped it.
    fn gone(&self, epoch: u64) -> bool {
        self.closed.load(Relaxed) || self.epoch.load(Relaxed) != epoch
    }

    /// Wait until block `b` is within [`AHEAD`] of the reader: `false` if the reader is gone
    /// (or dropped the fetch started in `epoch`).
    async fn near(&self, b: u64, epoch: u64) -> bool {
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if self.gone(epoch) {
                return false;
            }
            if b < self.at.load(Relaxed) + AHEAD {
                return true;
            }
            moved.await;
        }
    }
}

/// How long a block fetched for a sequential reader waits for room in the disk queue
/// before it skips the disk cache (see [`ReadCache::to_disk`]).
const DISK_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// Blocks queued for the disk cache at most (8 MiB): `O_DIRECT` writes of 2 MiB keep up
/// with a streaming reader; a block that finds the queue full waits a moment, then is
/// skipped (the close fetches it again, or the memory cache keeps it).
pub(crate) const DISK_QUEUE: usize = 4;

/// Blocks fetched at once for the disk cache after their readers closed, across the mount
/// ([`FileReader::fill_disk`]): 300 handles closed together each fetched theirs at once
/// (700 MB in flight).
const FILLS: usize = 4;

/// A reader that has not read for this long gives the budgets back when another reader
/// finds none ([`ReadCache::reclaim`]).
const IDLE: Duration = Duration::from_secs(1);
/// [`ReadCache::reclaim`] scans the readers at most this often.
const RECLAIM_EVERY: Duration = Duration::from_millis(100);

type Fetch = Shared<BoxFuture<'static, Result<Bytes, FsError>>>;
type BlockKey = (Arc<str>, Arc<str>, u64);

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
    /// Lock level 5: never held across an await; held, only [`ReadCache::reclaim`]'s locks
    /// are taken (another reader's with `try_lock`).
    state: Arc<Mutex<ReadState>>,
    pace: Arc<Pace>,
}

impl Drop for FileReader {
    fn drop(&mut self) {
        self.pace.close();
    }
}

#[derive(Default)]
struct ReadState {
    /// Reads in progress, and when the last one ended: idle is none for [`IDLE`].
    reading: u32,
    last: Option<Instant>,
    /// The reader's [`Pace`], for [`ReadCache::reclaim`].
    pace: Arc<Pace>,
    /// Where the furthest sequential read ended (where the last read ended after a random
    /// one): a read starting here is sequential, or near here while a window is open.
    next: u64,
    /// Blocks to keep in flight ahead of a sequential reader.
    window: u64,
    /// Blocks fetched or being fetched for this reader, not yet passed. A prefetched block
    /// holds its share of the global budget until the reader moves past it, so the budget
    /// bounds prefetched memory, not just requests in flight; a block it has passed or
    /// asked for itself holds a share of the held budget once fetched ([`FileReader::hold`]).
    inflight: HashMap<u64, (Fetch, Option<OwnedSemaphorePermit>)>,
}

impl ReadState {
    /// Keep nothing and end every fetch (paused ones too): their shares of the budgets go
    /// back. The blocks that arrived stay in the caches; reading on fetches again.
    fn quiesce(&mut self) {
        self.inflight.clear();
        self.pace.drop_fetches();
    }
}

/// A read in progress, counted in its reader's state until it ends (or is cancelled).
struct Reading(Arc<Mutex<ReadState>>);

impl Drop for Reading {
    fn drop(&mut self) {
        let mut st = self.0.lock().unwrap();
        st.reading -= 1;
        st.last = Some(Instant::now());
    }
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
        let pace = Arc::<Pace>::default();
        Self {
            state: cache.register(pace.clone()),
            pace,
            store,
            cache,
            key: key.into(),
            etag,
            identity: identity.into(),
            size,
            max_window: (max_window / BLOCK).max(1),
        }
    }

    /// The handle closed: keep nothing and end the fetches ahead (before a fill of the disk
    /// cache keeps the reader alive).
    pub(crate) fn quiesce(&self) {
        let mut st = self.state.lock().unwrap();
        // Not under a read in progress: it waits for fetches this would end (EIO).
        if st.reading == 0 {
            st.quiesce();
        }
    }

    /// The version this reader pinned at open (see [`FileReader::new`]).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Up to `len` bytes at `offset`; fewer only at the end of the file.
    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, FsError> {
        if offset >= self.size || len == 0 {
            return Ok(Bytes::new());
        }
        self.state.lock().unwrap().reading += 1;
        let _reading = Reading(self.state.clone());
        let end = (offset + len as u64).min(self.size);
        let (first, last) = (offset / BLOCK, (end - 1) / BLOCK);
        let cached: Vec<Option<Bytes>> = (first..=last).map(|b| self.cache.blocks.get(&self.block_key(b))).collect();
        let fetches = {
            let mut st = self.state.lock().unwrap();
            let near = st.window > 0 && offset.abs_diff(st.next) <= REORDER;
            let sequential = offset == st.next || near || st.inflight.contains_key(&first);
            tracing::trace!(key = %self.key, offset, len, sequential, next = st.next, window = st.window, "read");
            st.next = if sequential { st.next.max(end) } else { end };
            if sequential {
                self.pace.advance(offset / BLOCK);
            }
            if !sequential && cached.iter().any(Option::is_none) {
                st.window = 0;
                st.inflight.clear();
                Err(cached)
            } else {
                if sequential {
                    let open = if len >= STREAMING_READ { GROUP } else { 1 };
                    st.window = (st.window * 2).max(open).clamp(1, self.max_window);
                }
                let needed: Vec<Result<Bytes, Fetch>> =
                    (first..=last).zip(cached).map(|(b, c)| c.ok_or_else(|| self.block_fetch(&mut st, b))).collect();
                if sequential {
                    // Blocks a late (reordered) request may still need stay in flight, but
                    // give their share of the budget back once the reader has passed them.
                    let keep = st.next.saturating_sub(REORDER) / BLOCK;
                    st.inflight.retain(|b, _| *b >= first.min(keep));
                    for (_, (_, p)) in st.inflight.iter_mut().filter(|(b, _)| **b < first) {
                        if p.as_ref().is_some_and(|p| self.cache.is_prefetch_share(p)) {
                            *p = None; // [`Self::hold`] takes a held share for it
                        }
                    }
                    self.prefetch(&mut st, last + 1);
                }
                Ok(needed)
            }
        };
        let needed = match fetches {
            Ok(needed) => needed,
            // Random access: from the disk cache if it holds every block the memory cache
            // lacks, else exactly the bytes asked for; nothing prefetched. A read past this
            // version's end (the kernel knows a newer size: the object changed) goes to the
            // store, whose If-Match answers ESTALE if so, rather than a short reply.
            Err(cached) => {
                if offset + len as u64 <= self.size {
                    if let Some(blocks) = self.blocks_on_disk(first, cached).await {
                        return self.assemble(blocks, offset, end);
                    }
                }
                return self.fetch(offset, end).await;
            }
        };
        let mut blocks = Vec::with_capacity(needed.len());
        for block in needed {
            blocks.push(match block {
                Ok(d) => d,
                Err(f) => match f.await {
                    Ok(d) => d,
                    Err(e) => {
                        self.drop_failed();
                        return Err(e);
                    }
                },
            });
        }
        self.hold();
        self.assemble(blocks, offset, end)
    }

    /// Give every fetched block this reader keeps that is not prefetched ahead of it (one
    /// it asked for itself, or has passed and keeps for reordered requests) a share of the
    /// mount's held budget, or stop keeping it if there is no room: the memory cache or the
    /// disk cache serve it if it is read again, else the store. Without this, each open
    /// handle kept its first block (2 MiB) for as long as it stayed open: 300 handles that
    /// had read 4 KiB each held 700 MB. A small block is kept as a copy, so it does not keep
    /// its whole 2 MiB buffer alive.
    fn hold(&self) {
        let mut st = self.state.lock().unwrap();
        st.inflight.retain(|_, (f, p)| {
            if p.is_some() {
                return true; // ahead of the reader, or held already
            }
            let Some(Ok(data)) = f.clone().now_or_never() else { return true }; // in flight, or failed
            let share = (data.len() as u64).div_ceil(1024) as u32;
            let take = || self.cache.held.clone().try_acquire_many_owned(share);
            let Ok(permit) = take().or_else(|_| {
                self.cache.reclaim();
                take()
            }) else {
                return false;
            };
            if (data.len() as u64) < BLOCK / 2 {
                *f = futures::future::ready(Ok(Bytes::copy_from_slice(&data))).boxed().shared();
            }
            *p = Some(permit);
            true
        });
    }

    /// Forget fetches that ended in an error, so the next read of their blocks asks the
    /// store again: a failed fetch left in flight answered every later read with the same
    /// error, and one dropped connection broke the handle for good.
    fn drop_failed(&self) {
        let mut st = self.state.lock().unwrap();
        st.inflight.retain(|_, (f, _)| !matches!(f.peek(), Some(Err(_))));
    }

    /// The bytes `offset..end` out of whole `blocks`, the first of which holds `offset`.
    fn assemble(&self, blocks: Vec<Bytes>, offset: u64, end: u64) -> Result<Bytes, FsError> {
        let (first, last) = (offset / BLOCK, (end - 1) / BLOCK);
        let mut parts = Vec::with_capacity(blocks.len());
        for (i, data) in blocks.into_iter().enumerate() {
            let b = first + i as u64;
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

    /// The fetch of block `b` for a demand read: already in flight, or started now.
    fn block_fetch(&self, st: &mut ReadState, b: u64) -> Fetch {
        if let Some((f, _)) = st.inflight.get(&b) {
            return f.clone();
        }
        self.start_fetch(st, b, 1, 1, false).expect("a demand fetch always starts");
        st.inflight[&b].0.clone()
    }

    /// Make sure the `window` blocks from `from` on are fetched or being fetched. In a small
    /// window each block is its own GET; once the window holds [`GROUP`] blocks the reader
    /// is clearly sequential, and blocks are fetched [`GROUP`] at a time by one streamed GET
    /// (a shorter run waits until the reader frees room for a whole group, unless it ends
    /// the file). Stops when the prefetch budget has no room.
    fn prefetch(&self, st: &mut ReadState, from: u64) {
        let blocks = self.size.div_ceil(BLOCK);
        let stop = (from + st.window).min(blocks);
        let grouped = st.window >= GROUP;
        let starving = !st.inflight.keys().any(|&x| x >= from);
        let have =
            |st: &ReadState, b: u64| st.inflight.contains_key(&b) || self.cache.blocks.contains_key(&self.block_key(b));
        let (mut b, mut reclaimed) = (from, false);
        while b < stop {
            if have(st, b) {
                b += 1;
                continue;
            }
            let run = (b..stop).find(|&x| have(st, x)).unwrap_or(stop) - b;
            let n = if grouped { run.min(GROUP) } else { 1 };
            if n < GROUP && grouped && b + n < blocks {
                return;
            }
            // A whole group waits for room in the budget, unless this reader has nothing in
            // flight ahead (other readers hold the budget): then it takes what there is.
            let min = if starving { 1 } else { n };
            match self.start_fetch(st, b, n, min, true) {
                Some(started) if started == n => b += n,
                // The budget is spent: once, ask idle readers to give theirs back.
                _ if !reclaimed => {
                    reclaimed = true;
                    self.cache.reclaim();
                }
                _ => return,
            }
        }
    }

    /// Start fetching blocks `first..first + n` (none of them in flight) with one task, and
    /// put each block's own fetch in flight: how many started. A prefetch takes each block's
    /// share of the global budget first and starts the first blocks there is room for, or
    /// nothing (`None`) if that is fewer than `min`.
    fn start_fetch(&self, st: &mut ReadState, first: u64, n: u64, min: u64, prefetch: bool) -> Option<u64> {
        let mut permits = Vec::with_capacity(n as usize);
        for b in first..first + n {
            permits.push(match prefetch {
                true => match self.cache.budget.clone().try_acquire_many_owned((block_len(self.size, b) / 1024) as u32)
                {
                    Ok(p) => Some(p),
                    Err(_) => break,
                },
                false => None,
            });
        }
        if (permits.len() as u64) < min.max(1) {
            return None;
        }
        let n = permits.len() as u64;
        let mut run = VecDeque::with_capacity(n as usize);
        for (b, permit) in (first..first + n).zip(permits) {
            let (tx, rx) = oneshot::channel();
            let fut = rx.map(|r| r.unwrap_or_else(|_| Err(FsError::Local("read task ended".into())))).boxed().shared();
            st.inflight.insert(b, (fut, permit));
            run.push_back((b, tx));
        }
        let src = Source {
            store: self.store.clone(),
            cache: self.cache.clone(),
            key: self.key.clone(),
            identity: self.identity.clone(),
            etag: self.etag.clone(),
            size: self.size,
            pace: prefetch.then(|| self.pace.clone()),
            epoch: self.pace.epoch.load(Relaxed),
        };
        // A task, so the GETs proceed while nobody awaits them (that is what prefetch is).
        crate::sync::spawn(async move { src.fetch_blocks(run).await });
        Some(n)
    }

    /// Blocks `first..` (as many as `cached` has entries; `None` where the memory cache
    /// lacks one) with the missing ones read from the disk cache, which the memory cache
    /// then holds; `None` unless the disk cache had every one intact. A random read of a
    /// file read before (pages the kernel dropped, a new mount) costs a local block read,
    /// not a GET. One blocking task for all.
    async fn blocks_on_disk(&self, first: u64, cached: Vec<Option<Bytes>>) -> Option<Vec<Bytes>> {
        let disk = self.cache.disk.clone()?;
        let (key, id, pool, size) = (self.key.clone(), self.identity.clone(), self.cache.pool.clone(), self.size);
        let want: Vec<u64> = (first..).zip(&cached).filter(|(_, c)| c.is_none()).map(|(b, _)| b).collect();
        if !want.iter().all(|&b| disk.contains(&key, &id, b)) {
            return None;
        }
        let read = crate::sync::blocking(move || {
            want.into_iter()
                .map(|b| disk.get(&key, &id, b, &pool).filter(|d| d.len() as u64 == block_len(size, b)).map(|d| (b, d)))
                .collect::<Option<Vec<(u64, Bytes)>>>()
        });
        let mut read = read.await??.into_iter();
        let mut blocks = Vec::with_capacity(cached.len());
        for c in cached {
            blocks.push(match c {
                Some(d) => d,
                None => {
                    let (b, d) = read.next()?;
                    self.cache.insert(self.block_key(b), d.clone());
                    d
                }
            });
        }
        Some(blocks)
    }

    /// Whether the caches (memory, else disk) hold every block of this version, for a
    /// tagged file of at most `max` bytes. Nothing is read: [`FileReader::cached_block`]
    /// then gives them one at a time.
    pub(crate) fn all_cached(&self, max: u64) -> bool {
        let disk = self.cache.disk.as_ref();
        self.size <= max
            && self.etag.is_some()
            && (0..self.size.div_ceil(BLOCK)).all(|b| {
                self.cache.blocks.contains_key(&self.block_key(b))
                    || disk.is_some_and(|d| d.contains(&self.key, &self.identity, b))
            })
    }

    /// Block `b` of this version from the memory cache, else the disk cache (not then kept
    /// in memory: a staging reads each block once), if it is there whole.
    pub(crate) fn cached_block(&self, b: u64) -> Option<Bytes> {
        let data = match self.cache.blocks.get(&self.block_key(b)) {
            Some(d) => d,
            None => self.cache.disk.as_ref()?.get(&self.key, &self.identity, b, &self.cache.pool)?,
        };
        (data.len() as u64 == block_len(self.size, b)).then_some(data)
    }

    /// Put on disk every block of this version the disk cache lacks (from the memory cache,
    /// else a ranged GET pinned by If-Match, four at once), unless more than `max_missing`
    /// are missing. A reader's blocks skip the disk when its writers lag ([`ReadCache::
    /// to_disk`]), so a file read whole may still lack a few; completing it lets the next
    /// open pass through to a whole file. `true` once every block is on disk.
    pub(crate) async fn fill_disk(&self, max_missing: u64) -> bool {
        use futures::StreamExt;
        let Some(disk) = self.cache.disk.clone() else { return false };
        let missing: Vec<u64> =
            (0..self.size.div_ceil(BLOCK)).filter(|&b| !disk.contains(&self.key, &self.identity, b)).collect();
        if missing.len() as u64 > max_missing {
            return false;
        }
        let fill = |b: u64| {
            let disk = disk.clone();
            async move {
                let _fill = self.cache.fills.acquire().await.ok()?;
                if disk.contains(&self.key, &self.identity, b) {
                    return Some(()); // another handle's fill, meanwhile
                }
                let want = block_len(self.size, b);
                let data = match self.cache.blocks.get(&self.block_key(b)) {
                    Some(d) => d,
                    None => self.fetch(b * BLOCK, b * BLOCK + want).await.ok()?,
                };
                if data.len() as u64 != want {
                    return None;
                }
                let (key, id, size) = (self.key.clone(), self.identity.clone(), self.size);
                crate::sync::blocking(move || {
                    // `put` takes the block as it is (O_DIRECT when it is a whole pooled block).
                    disk.put(&key, &id, size, b, &data, data.len(), crc32c::crc32c(&data));
                    disk.contains(&key, &id, b).then_some(())
                })
                .await?
            }
        };
        let done: Vec<Option<()>> = futures::stream::iter(missing).map(fill).buffer_unordered(4).collect().await;
        done.iter().all(Option::is_some)
    }

    async fn fetch(&self, start: u64, end: u64) -> Result<Bytes, FsError> {
        let data = get(self.store.as_ref(), &self.key, start, end, self.etag.as_deref()).await?;
        if (data.len() as u64) < end - start {
            return Err(FsError::Stale(format!("{} is shorter than when it was opened", self.key)));
        }
        Ok(data)
    }
}

fn store_err(e: bucketfs_store::StoreError) -> FsError {
    match e.kind {
        StoreErrorKind::Changed | StoreErrorKind::NotFound => FsError::Stale(e.message),
        _ => FsError::Store(e),
    }
}

async fn get(store: &dyn Store, key: &str, start: u64, end: u64, etag: Option<&str>) -> Result<Bytes, FsError> {
    store.get_range(key, start..end, GetOpts { if_match: etag }).await.map_err(store_err)
}

#[cfg(test)]
#[path = "read_tests.rs"]
mod tests;
