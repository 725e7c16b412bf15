//! Store to local file (parallel ranged reads written in place into a pre-sized sparse
//! temp file, renamed into place once verified) and store to stdout (the same reads,
//! emitted in order through a reordering window of `parallel` slices).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use md5::{Digest, Md5};

use super::endpoint::Remote;
use super::plan::{self, slices};
use super::verify::{self, Check, Crcs, Expect, SliceSum};
use super::work::{groups, Group, Work};
use super::{retry, Ctx, Report, INTERRUPTED};
use bucketfs_store::{GetOpts, HeadOpts, ObjectHead, StoreError, StoreErrorKind, StoreExt};

/// How to read one object: its identity, size, ranges and what to verify against.
struct ReadPlan {
    size: u64,
    if_match: Option<String>,
    ranges: Vec<std::ops::Range<u64>>,
    expect: Expect,
    /// The digest is per part (a multipart ETag or COMPOSITE crc): the slices are the
    /// parts only if the part size was guessed right.
    guessed: bool,
    slice_md5: bool,
    /// Each slice's crc32 too (the object's S3 checksum is a crc32).
    slice_crc32: bool,
    /// Each slice's crc32c: but for a crc32-verified download with no summary to report it.
    slice_crc32c: bool,
}

/// Ask the store for what `head` does not already say: the object's size, identity and digests.
pub(super) async fn head(ctx: &Ctx, src: &Remote, head: Option<&ObjectHead>) -> Result<ObjectHead, String> {
    match head {
        Some(d) => Ok(d.clone()),
        None => retry(ctx, "head", &src.key, || src.store.head(&src.key, HeadOpts { digests: true })).await,
    }
}

async fn read_plan(ctx: &Ctx, src: &Remote, head: Option<&ObjectHead>) -> Result<ReadPlan, String> {
    let d = self::head(ctx, src, head).await?;
    let size = d.meta.size;
    let expect = verify::expect(src.kind, &d);
    let mut tuning = plan::tuning(Some(size), ctx.slice, Some(ctx.parallel));
    if let (Some(parts), None) = (expect.parts(), ctx.slice) {
        // Read in the uploader's parts so the per-slice MD5s or crcs rebuild its digest.
        let ours = plan::tuning(Some(size), None, None).slice.max(plan::MIN_S3_PART);
        if let Some(p) = verify::guess_part_size(size, parts, ours) {
            tuning.slice = p;
        }
    }
    // A download never knows the uploader's part size, only guesses it (or takes
    // --slice-size): a per-part digest that does not match is no proof of damage.
    let guessed = expect.parts().is_some();
    let slice_md5 = matches!(expect, Expect::Composite { .. });
    let slice_crc32 = expect.wants_crc32();
    let slice_crc32c = ctx.summary || !slice_crc32;
    let ranges = slices(size, tuning.slice);
    Ok(ReadPlan { size, if_match: d.meta.etag, ranges, expect, guessed, slice_md5, slice_crc32, slice_crc32c })
}

/// One ranged read with retries; a short read counts as a (retried) failure.
pub(super) async fn fetch(
    ctx: &Ctx,
    src: &Remote,
    range: std::ops::Range<u64>,
    if_match: Option<&str>,
) -> Result<Bytes, String> {
    let want = (range.end - range.start) as usize;
    retry(ctx, "read", &src.key, || {
        let range = range.clone();
        async move {
            let data = src.store.get_range(&src.key, range.clone(), GetOpts { if_match }).await?;
            if data.len() != want {
                return Err(StoreError::new(
                    StoreErrorKind::Other,
                    format!("short read at {range:?}: {} bytes", data.len()),
                ));
            }
            Ok(data)
        }
    })
    .await
}

/// [`fetch`] as the chunks the response arrived in (one streamed request): no copy into
/// one contiguous buffer, for readers that consume the bytes piece by piece.
pub(super) async fn fetch_chunks(
    ctx: &Ctx,
    src: &Remote,
    range: std::ops::Range<u64>,
    if_match: Option<&str>,
) -> Result<Vec<Bytes>, String> {
    let want = range.end - range.start;
    retry(ctx, "read", &src.key, || {
        let range = range.clone();
        async move {
            let mut body = src.store.get(&src.key, range.clone(), GetOpts { if_match }).await?;
            let (mut chunks, mut got) = (Vec::new(), 0u64);
            while let Some(c) = body.next().await {
                let c = c?;
                got += c.len() as u64;
                if got > want {
                    break;
                }
                chunks.push(c);
            }
            if got != want {
                return Err(StoreError::new(StoreErrorKind::Other, format!("short read at {range:?}: {got} bytes")));
            }
            Ok(chunks)
        }
    })
    .await
}

/// A temp file beside `dst`, so a half-written file never has the final name.
fn temp_path(dst: &Path) -> PathBuf {
    let name = dst.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let n =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
    dst.with_file_name(format!(".{name}.bucketfs-{:x}-{n:x}", std::process::id()))
}

/// Bytes gathered before one positional write: fewer system calls than one per chunk.
/// Also the size and alignment of a transparent huge page (see [`AlignedBuf`]).
pub(super) const WRITE_BUF: usize = 2 << 20;
/// Offset, length and address alignment of an `O_DIRECT` write.
const ALIGN: usize = 4096;

/// The temp file being filled. Where the file system allows it, aligned writes go through
/// a second descriptor opened with `O_DIRECT`: they skip the copy into the page cache,
/// which costs about as much CPU as hashing (much more in a VM that returns freed memory
/// to its host). Unaligned writes (a file's tail) and file systems that refuse it use the
/// page cache.
pub(super) struct Target {
    file: Arc<File>,
    direct: Option<File>,
}

impl Target {
    pub(super) fn open(path: &Path, direct: bool) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        // Read as well as write: the MD5 thread reads back what landed.
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
        let direct = direct
            .then(|| std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path).ok())
            .flatten();
        Ok(Self { file: Arc::new(file), direct })
    }

    /// Give the file its size and, where the file system can, allocate its blocks now:
    /// a disk too small fails here, before any byte is fetched, and `O_DIRECT` writes into
    /// allocated blocks run side by side (ext4 serializes direct writes that must allocate).
    pub(super) fn reserve(&self, size: u64) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        self.file.set_len(size)?;
        if size == 0 {
            return Ok(());
        }
        // SAFETY: a plain system call on a descriptor this struct owns.
        let r = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, 0, size as libc::off_t) };
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            _ if r == 0 => Ok(()),
            Some(libc::ENOSPC | libc::EDQUOT) => Err(std::io::Error::other(format!(
                "no space for {size} bytes here ({e}); free some space or copy elsewhere"
            ))),
            _ => Ok(()), // not supported here (e.g. some network file systems): stays sparse
        }
    }

    fn write_at(&self, data: &[u8], at: u64) -> std::io::Result<()> {
        let aligned = at.is_multiple_of(ALIGN as u64)
            && data.len().is_multiple_of(ALIGN)
            && (data.as_ptr() as usize).is_multiple_of(ALIGN);
        if let Some(d) = self.direct.as_ref().filter(|_| aligned) {
            match d.write_all_at(data, at) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {} // not after all: buffered
                r => return r,
            }
        }
        self.file.write_all_at(data, at)
    }
}

/// A write buffer of `WRITE_BUF` bytes aligned to its size (so to `ALIGN`, for `O_DIRECT`),
/// which asks the kernel for one transparent huge page: an `O_DIRECT` write then pins one
/// page instead of 512, and the copy into it misses the TLB less. A dropped buffer goes
/// back to [`SPARE_BUFS`] for the next request.
pub(super) struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is owned memory like a Vec's; nothing else points into it.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    const LAYOUT: std::alloc::Layout = match std::alloc::Layout::from_size_align(WRITE_BUF, WRITE_BUF) {
        Ok(l) => l,
        Err(_) => panic!("WRITE_BUF is a power of two"),
    };

    pub(super) fn new() -> Self {
        if let Some(b) = SPARE_BUFS.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return b;
        }
        // SAFETY: a non-zero size; the memory is only read below `len`, after `push` wrote it.
        let raw = unsafe { std::alloc::alloc(Self::LAYOUT) };
        let ptr = std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(Self::LAYOUT));
        // SAFETY: advice on memory this buffer owns; an error (no huge pages) changes nothing.
        unsafe { libc::madvise(raw.cast(), WRITE_BUF, libc::MADV_HUGEPAGE) };
        Self { ptr, len: 0 }
    }

    pub(super) fn space(&self) -> usize {
        WRITE_BUF - self.len
    }

    pub(super) fn push(&mut self, b: &[u8]) {
        assert!(b.len() <= self.space(), "AlignedBuf overflow");
        // SAFETY: in bounds (checked above); `b` cannot overlap memory this buffer owns.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.ptr.as_ptr().add(self.len), b.len()) };
        self.len += b.len();
    }

    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: the first `len` bytes were written by `push`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

/// Buffers that finished their request, for the next one: every new huge page costs the
/// kernel a 2 MiB clear (as much CPU as the socket copy when each request took two fresh
/// buffers). Holds at most the most ever in use at once, up to `SPARE_MAX`.
static SPARE_BUFS: std::sync::Mutex<Vec<AlignedBuf>> = std::sync::Mutex::new(Vec::new());
const SPARE_MAX: usize = 64;

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let mut spare = SPARE_BUFS.lock().unwrap_or_else(|e| e.into_inner());
        if spare.len() < SPARE_MAX {
            // The memory changes owner: this value's drop ends here without freeing it.
            spare.push(AlignedBuf { ptr: self.ptr, len: 0 });
            return;
        }
        // SAFETY: allocated in `new` with the same layout, and owned by no one else.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::LAYOUT) }
    }
}

/// One download's parts, shared by its request slots.
struct Fetch<'a> {
    ctx: &'a Ctx,
    src: &'a Remote,
    p: &'a ReadPlan,
    file: &'a Arc<Target>,
    md5: Option<&'a TrailingMd5>,
    work: Work,
}

/// Fetch `groups` into `file`, `parallel` slots sharing them (see [`Work`]); digests in
/// slice order.
async fn fetch_into(
    ctx: &Ctx,
    src: &Remote,
    p: &ReadPlan,
    file: &Arc<Target>,
    groups: Vec<Group>,
    md5: Option<&TrailingMd5>,
) -> Result<Vec<(usize, SliceSum)>, String> {
    let f = &Fetch { ctx, src, p, file, md5, work: Work::new(groups, ctx.parallel) };
    let results: Vec<Result<Vec<(usize, SliceSum)>, String>> = futures::stream::iter(0..f.work.slots())
        .map(|slot| async move {
            let mut done = Vec::new();
            loop {
                let _permit = ctx.slot().await;
                let Some(g) = f.work.take(slot) else { return Ok(done) };
                let r = fetch_group(f, slot, g.start, &mut done).await;
                f.work.idle(slot);
                if r.is_err() {
                    f.work.abort(); // the download fails: the other slots stop too
                }
                r?;
            }
        })
        .buffer_unordered(f.work.slots())
        .collect()
        .await;
    let mut out = Vec::with_capacity(p.ranges.len());
    for r in results {
        out.extend(r?);
    }
    out.sort_by_key(|(i, _)| *i);
    Ok(out)
}

/// `slot`'s group from slice `start` to its end (which another slot may lower meanwhile),
/// with retries: a failed request is resumed at its first unfinished slice. Finished slices
/// are added to `done`.
async fn fetch_group(
    f: &Fetch<'_>,
    slot: usize,
    start: usize,
    done: &mut Vec<(usize, SliceSum)>,
) -> Result<(), String> {
    let base = done.len();
    let mut attempt = 0;
    loop {
        let (next, end) = (start + done.len() - base, f.work.end(slot));
        if next >= end {
            return Ok(());
        }
        match stream_slices(f, slot, next..end, done).await {
            Ok(()) => {}
            // Aborted by another slot meanwhile: no backoff for a download that has failed.
            Err(Failure::Store(_)) if f.work.end(slot) == 0 => return Ok(()),
            Err(Failure::Store(e)) => super::again(f.ctx, "read", &f.src.key, &mut attempt, e).await?,
            Err(Failure::Local(e)) => return Err(e),
        }
    }
}

enum Failure {
    /// The request failed or was cut short: may be retried.
    Store(StoreError),
    /// Writing the local file failed: final.
    Local(String),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

/// A slice's last buffer: its index, range and crcs.
type SliceEnd = (usize, std::ops::Range<u64>, (Option<u32>, Option<u32>));

/// A filled buffer handed to a blocking thread: written at `at`, hashed into `md5` (the
/// MD5 of its part, when the plan wants one); when it ends a slice, the slice's digests
/// are then in `sum`. Comes back empty, to be filled again.
struct Job {
    buf: AlignedBuf,
    md5: Option<Md5>,
    sum: Option<(usize, SliceSum)>,
}

impl Job {
    fn work(mut self, file: &Target, at: u64, last: Option<SliceEnd>) -> std::io::Result<Self> {
        let b = self.buf.bytes();
        if let Some(h) = self.md5.as_mut() {
            h.update(b);
        }
        file.write_at(b, at)?;
        self.buf.len = 0;
        if let Some((i, range, (crc, crc32))) = last {
            let md5 = self.md5.as_mut().map(|h| h.finalize_reset().into());
            self.sum = Some((i, SliceSum { range, crc, md5, crc32 }));
        }
        Ok(self)
    }
}

type Busy = tokio::task::JoinHandle<std::io::Result<Job>>;

/// One request for slices `todo`. The body is gathered into 2 MiB aligned buffers, its
/// crcs (as the plan says: crc32c, crc32) summed on the way; each full buffer is written
/// at its offset (and hashed into its part's MD5, when the plan wants one) on a blocking
/// thread while the next one fills, so writing runs on both cores and overlaps the
/// network. A finished slice's digests go to `done`; on error, `done` holds the slices
/// that completed.
async fn stream_slices(
    f: &Fetch<'_>,
    slot: usize,
    todo: Group,
    done: &mut Vec<(usize, SliceSum)>,
) -> Result<(), Failure> {
    let mut busy: Option<Busy> = None;
    let spare = Job { buf: AlignedBuf::new(), md5: f.p.slice_md5.then(Md5::new), sum: None };
    let result = receive(f, slot, todo, &mut busy, spare, &mut |j| settle(f, j, done)).await;
    if let Some(b) = busy.take() {
        let job = b.await.map_err(|e| Failure::Local(e.to_string()))?;
        settle(f, job.map_err(|e| Failure::Local(format!("write: {e}")))?, done);
    }
    result
}

/// Record the slice a finished job completed; the job's buffer is free again.
fn settle(f: &Fetch<'_>, mut job: Job, done: &mut Vec<(usize, SliceSum)>) -> Job {
    if let Some((i, sum)) = job.sum.take() {
        f.ctx.progress.moved(sum.range.end - sum.range.start);
        if let Some(m) = f.md5 {
            m.landed(sum.range.clone());
        }
        done.push((i, sum));
    }
    job
}

/// The receiving loop of [`stream_slices`]; `busy` is the job in flight, if any. Stops
/// early, dropping the rest of the body, when another slot took the group's tail.
async fn receive(
    f: &Fetch<'_>,
    slot: usize,
    todo: Group,
    busy: &mut Option<Busy>,
    spare: Job,
    settle: &mut (dyn FnMut(Job) -> Job + Send),
) -> Result<(), Failure> {
    let (src, p) = (f.src, f.p);
    let (start, end) = (p.ranges[todo.start].start, p.ranges[todo.end - 1].end);
    let mut body = src.store.get(&src.key, start..end, GetOpts { if_match: p.if_match.as_deref() }).await?;
    let mut i = todo.start;
    let mut pos = start;
    let mut fill = AlignedBuf::new();
    // Summed on each piece as it arrives, while it is still in cache from the socket read.
    let mut crcs = Crcs::new(p.slice_crc32c, p.slice_crc32);
    let mut spare = Some(spare);
    while let Some(chunk) = body.next().await {
        let mut chunk = chunk?;
        while !chunk.is_empty() {
            let Some(range) = p.ranges.get(i).filter(|_| i < todo.end) else {
                let msg = format!("read past {end} in {:?}", start..end);
                return Err(StoreError::new(StoreErrorKind::Other, msg).into());
            };
            let piece = chunk.split_to(chunk.len().min((range.end - pos) as usize).min(fill.space()));
            crcs.update(&piece);
            fill.push(&piece);
            pos += piece.len() as u64;
            let last = pos == range.end;
            if fill.space() == 0 || last {
                // The previous buffer's job is done before this one starts: a slice's
                // digests are updated in order.
                let mut job = match (busy.take(), spare.take()) {
                    (Some(b), _) => {
                        let job = b.await.map_err(|e| Failure::Local(e.to_string()))?;
                        settle(job.map_err(|e| Failure::Local(format!("write: {e}")))?)
                    }
                    (None, Some(job)) => job,
                    (None, None) => unreachable!("a job is either busy or spare"),
                };
                std::mem::swap(&mut job.buf, &mut fill);
                let at = pos - job.buf.len as u64;
                let last = last.then(|| (i, range.clone(), crcs.take()));
                let target = f.file.clone();
                *busy = Some(tokio::task::spawn_blocking(move || job.work(&target, at, last)));
            }
            if last {
                i += 1;
                if i >= f.work.received(slot, i - 1) {
                    return Ok(()); // the end, or another slot has the rest
                }
            }
        }
    }
    if pos != end {
        let msg = format!("short read at {:?}: {} bytes", start..end, pos - start);
        return Err(StoreError::new(StoreErrorKind::Other, msg).into());
    }
    Ok(())
}

/// The MD5 of the file while it is being written: slices land out of order, and a thread
/// hashes the contiguous prefix (read back from the page cache) as it grows, so the digest
/// is ready moments after the last slice instead of after a second pass.
struct TrailingMd5 {
    tx: Option<std::sync::mpsc::Sender<std::ops::Range<u64>>>,
    handle: std::thread::JoinHandle<std::io::Result<[u8; 16]>>,
}

impl TrailingMd5 {
    fn start(file: Arc<File>, size: u64) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<std::ops::Range<u64>>();
        let handle = std::thread::spawn(move || {
            let mut h = Md5::new();
            let mut next = 0u64;
            let mut landed = std::collections::BTreeMap::new();
            let mut buf = vec![0u8; 1 << 20]; // 1 MiB reads from the page cache
            for r in rx {
                landed.insert(r.start, r.end);
                while let Some(end) = landed.remove(&next) {
                    while next < end {
                        let n = ((end - next) as usize).min(buf.len());
                        file.read_exact_at(&mut buf[..n], next)?;
                        h.update(&buf[..n]);
                        next += n as u64;
                    }
                }
            }
            if next != size {
                return Err(std::io::Error::other(format!("only {next} of {size} bytes were hashed")));
            }
            Ok(h.finalize().into())
        });
        Self { tx: Some(tx), handle }
    }

    fn landed(&self, r: std::ops::Range<u64>) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(r);
        }
    }

    async fn finish(mut self) -> Result<[u8; 16], String> {
        self.tx = None; // ends the thread's loop
        let handle = self.handle;
        tokio::task::spawn_blocking(move || handle.join())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|_| "the hashing thread panicked".to_string())?
            .map_err(|e| format!("hashing the local copy: {e}"))
    }
}

/// [`Target::open`] and [`Target::reserve`] on a blocking thread (allocating can take a
/// while: tmpfs clears the pages, NFS asks its server).
async fn open_reserved(tmp: &Path, direct: bool, size: u64) -> Result<Target, String> {
    let tmp = tmp.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let file = Target::open(&tmp, direct).map_err(|e| format!("{}: {e}", tmp.display()))?;
        let dir = tmp.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        file.reserve(size).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(file)
    })
    .await
    .map_err(|e| e.to_string())?
}

pub async fn to_file(ctx: &Ctx, src: &Remote, head: Option<&ObjectHead>, dst: &Path) -> Result<Report, String> {
    if let Some(parent) = dst.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let p = read_plan(ctx, src, head).await?;
    let tmp = temp_path(dst);
    let result = tokio::select! {
        r = download_verified(ctx, src, &p, &tmp) => r,
        _ = ctx.cancelled() => Err(INTERRUPTED.to_string()),
    };
    match result {
        Ok(report) => {
            std::fs::rename(&tmp, dst).map_err(|e| format!("{}: {e}", dst.display()))?;
            Ok(report)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

async fn download_verified(ctx: &Ctx, src: &Remote, p: &ReadPlan, tmp: &Path) -> Result<Report, String> {
    let mut last = String::new();
    for attempt in 0..=ctx.retries {
        if attempt > 0 {
            ctx.progress.println(&format!("bucketfs cp: {}: {last}; downloading again", src.url()));
            ctx.progress.retrying(p.size);
        }
        // The whole-file MD5 reads back what landed, best from the page cache: no O_DIRECT.
        let whole_md5 = matches!(p.expect, Expect::WholeMd5(_));
        let file = Arc::new(open_reserved(tmp, !whole_md5, p.size).await?);
        let md5 = whole_md5.then(|| TrailingMd5::start(file.file.clone(), p.size));
        let all = groups(p.ranges.len(), p.ranges.first().map_or(1, |r| r.end - r.start), ctx.parallel);
        let mut sums: Vec<SliceSum> =
            fetch_into(ctx, src, p, &file, all, md5.as_ref()).await?.into_iter().map(|(_, s)| s).collect();
        let whole = match md5 {
            Some(m) => Some(m.finish().await?),
            None => None,
        };
        let how = match verify::check(&p.expect, &sums, whole, p.guessed) {
            Check::Ok(how) => how,
            Check::Mismatch(m) => {
                last = m;
                continue;
            }
            Check::Reread => match reread_and_repair(ctx, src, p, &file, &mut sums).await {
                Ok(()) => verify::BY_REREAD,
                Err(e) => {
                    last = e;
                    continue;
                }
            },
        };
        return Ok(Report { bytes: p.size, verified: how.into(), crc32c: verify::combined_crc(&sums) });
    }
    Err(format!("{}: verification failed after {} attempts: {last}", src.url(), ctx.retries + 1))
}

/// Read everything again and compare crc32c (or crc32) per slice; a slice that differs is fetched
/// again (a read was corrupted in transit) until two reads agree, within the retry budget.
async fn reread_and_repair(
    ctx: &Ctx,
    src: &Remote,
    p: &ReadPlan,
    file: &Arc<Target>,
    sums: &mut [SliceSum],
) -> Result<(), String> {
    let mut bad = verify::reread(ctx, &src.store, &src.key, sums, p.if_match.as_deref()).await?;
    for _ in 0..ctx.retries {
        if bad.is_empty() {
            return Ok(());
        }
        ctx.progress.println(&format!(
            "bucketfs cp: {}: {} slice(s) differed on re-read; fetching them again",
            src.url(),
            bad.len()
        ));
        for (i, s) in fetch_into(ctx, src, p, file, bad.iter().map(|&i| i..i + 1).collect(), None).await? {
            sums[i] = s;
        }
        let again: Vec<SliceSum> = bad.iter().map(|&i| sums[i].clone()).collect();
        bad = verify::reread(ctx, &src.store, &src.key, &again, p.if_match.as_deref())
            .await?
            .into_iter()
            .map(|j| bad[j])
            .collect();
    }
    if bad.is_empty() {
        return Ok(());
    }
    Err(format!("the crc of {} slice(s) differs between reads (first at byte {})", bad.len(), sums[bad[0]].range.start))
}

/// Write the object to stdout in order. Reads run `parallel` ahead; the reordering window
/// is those slices. A mismatch found afterwards can only be reported (the bytes are out).
pub async fn to_stdout(ctx: &Ctx, src: &Remote, head: Option<&ObjectHead>) -> Result<Report, String> {
    let p = read_plan(ctx, src, head).await?;
    let want_whole = matches!(p.expect, Expect::WholeMd5(_));
    let if_match = p.if_match.as_deref();
    let mut stream = futures::stream::iter(p.ranges.clone())
        .map(|range| async move {
            let _slot = ctx.slot().await;
            fetch_chunks(ctx, src, range.clone(), if_match).await.map(|d| (range, d))
        })
        .buffered(ctx.parallel);
    let mut sums = Vec::with_capacity(p.ranges.len());
    let mut hasher = want_whole.then(Md5::new);
    loop {
        let item = tokio::select! {
            item = stream.next() => item,
            _ = ctx.cancelled() => return Err(INTERRUPTED.to_string()),
        };
        let Some(item) = item else { break };
        let (range, data) = item?;
        let (with_md5, with_crc32, with_crc32c) = (p.slice_md5, p.slice_crc32, p.slice_crc32c);
        let h = hasher.take();
        let (sum, h) = tokio::task::spawn_blocking(move || {
            let mut out = std::io::stdout().lock();
            for c in &data {
                out.write_all(c)?;
            }
            out.flush()?;
            let h = h.map(|mut h| {
                data.iter().for_each(|c| h.update(c));
                h
            });
            Ok::<_, std::io::Error>((SliceSum::of_chunks(range, &data, with_md5, with_crc32c, with_crc32), h))
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("writing to stdout: {e}"))?;
        hasher = h;
        ctx.progress.moved(sum.range.end - sum.range.start);
        sums.push(sum);
    }
    let whole = hasher.map(|h| h.finalize().into());
    let how = match verify::check(&p.expect, &sums, whole, p.guessed) {
        Check::Ok(how) => how,
        Check::Mismatch(m) => return Err(format!("{}: the bytes written to stdout are wrong: {m}", src.url())),
        Check::Reread => {
            let bad = verify::reread(ctx, &src.store, &src.key, &sums, if_match).await?;
            if let Some(&i) = bad.first() {
                return Err(format!(
                    "{}: the bytes written to stdout differ from a second read (at byte {})",
                    src.url(),
                    sums[i].range.start
                ));
            }
            verify::BY_REREAD
        }
    };
    Ok(Report { bytes: p.size, verified: how.into(), crc32c: verify::combined_crc(&sums) })
}
