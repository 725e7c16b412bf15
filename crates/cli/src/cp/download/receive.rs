//! The receive pipeline of a download to a file: request slots share the slices (see
//! [`Work`]); each streams its response into 2 MiB huge-page buffers from the copy's
//! pool (`Ctx::buffers`), summing crcs on the way, while a blocking thread writes the
//! previous buffer at its offset (and hashes it, when a part's MD5 is wanted).

use std::sync::Arc;

use futures::StreamExt;
use md5::{Digest, Md5};

use super::super::endpoint::Remote;
use super::super::verify::{Crcs, SliceSum};
use super::super::work::{Group, Work};
use super::super::{CpError, Ctx};
use super::read_plan::ReadPlan;
use super::target::Target;
use super::trailing_md5::TrailingMd5;
use bucketfs_core::block_pool::BlockBuf;
use bucketfs_store::{GetOpts, StoreError, StoreErrorKind};

/// Bytes gathered before one positional write: fewer system calls than one per chunk.
/// Also the size and alignment of a transparent huge page (the buffers are
/// [`bucketfs_core::block_pool::BlockPool::huge_pages`]).
pub(in crate::cp) const WRITE_BUF: usize = bucketfs_core::block_pool::HUGE_PAGE;

/// Write buffers the pool keeps for the next request: every new huge page costs the kernel
/// a 2 MiB clear (as much CPU as the socket copy when each request took two fresh
/// buffers). The pool holds at most the most ever in use at once, up to this.
pub(in crate::cp) const POOL_MAX: usize = 64;

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
pub(super) async fn fetch_into(
    ctx: &Ctx,
    src: &Remote,
    p: &ReadPlan,
    file: &Arc<Target>,
    groups: Vec<Group>,
    md5: Option<&TrailingMd5>,
) -> Result<Vec<(usize, SliceSum)>, CpError> {
    let f = &Fetch { ctx, src, p, file, md5, work: Work::new(groups, ctx.parallel) };
    let results: Vec<Result<Vec<(usize, SliceSum)>, CpError>> = futures::stream::iter(0..f.work.slots())
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
) -> Result<(), CpError> {
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
            Err(Failure::Store(e)) => super::super::again(f.ctx, "read", &f.src.key, &mut attempt, e).await?,
            Err(Failure::Local(e)) => return Err(e),
        }
    }
}

enum Failure {
    /// The request failed or was cut short: may be retried.
    Store(StoreError),
    /// Writing the local file failed: final.
    Local(CpError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

/// A slice's last buffer: its index, range and crcs.
type SliceEnd = (usize, std::ops::Range<u64>, (Option<u32>, Option<u32>, Vec<u32>));

/// A filled buffer handed to a blocking thread: written at `at`, hashed into `md5` (the
/// MD5 of its part, when the plan wants one); when it ends a slice, the slice's digests
/// are then in `sum`. Comes back empty, to be filled again.
struct Job {
    buf: BlockBuf,
    md5: Option<Md5>,
    sum: Option<(usize, SliceSum)>,
}

impl Job {
    fn work(mut self, file: &Target, at: u64, last: Option<SliceEnd>) -> std::io::Result<Self> {
        let b = self.buf.as_ref();
        if let Some(h) = self.md5.as_mut() {
            h.update(b);
        }
        file.write_at(b, at)?;
        self.buf.clear();
        if let Some((i, range, (crc, crc32, blocks))) = last {
            let md5 = self.md5.as_mut().map(|h| h.finalize_reset().into());
            self.sum = Some((i, SliceSum { range, crc, md5, crc32, blocks }));
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
    let spare = Job { buf: f.ctx.buffers.take(), md5: f.p.slice_md5.then(Md5::new), sum: None };
    let result = receive(f, slot, todo, &mut busy, spare, &mut |j| settle(f, j, done)).await;
    if let Some(b) = busy.take() {
        let job = b.await.map_err(|e| Failure::Local(e.to_string().into()))?;
        settle(f, job.map_err(|e| Failure::Local(CpError::io("write", &e)))?, done);
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
    let mut fill = f.ctx.buffers.take();
    // Summed on each piece as it arrives, while it is still in cache from the socket read.
    let mut crcs = Crcs::new(p.slice_crc32c, p.slice_crc32).with_blocks(p.blocks, start);
    let mut spare = Some(spare);
    while let Some(chunk) = body.next().await {
        let mut chunk = chunk?;
        while !chunk.is_empty() {
            let Some(range) = p.ranges.get(i).filter(|_| i < todo.end) else {
                let msg = format!("read past {end} in {:?}", start..end);
                return Err(StoreError::new(StoreErrorKind::Other, msg).into());
            };
            let piece = chunk.split_to(chunk.len().min((range.end - pos) as usize).min(fill.room()));
            crcs.update(&piece);
            fill.push(&piece);
            pos += piece.len() as u64;
            let last = pos == range.end;
            if fill.room() == 0 || last {
                // The previous buffer's job is done before this one starts: a slice's
                // digests are updated in order.
                let mut job = match (busy.take(), spare.take()) {
                    (Some(b), _) => {
                        let job = b.await.map_err(|e| Failure::Local(e.to_string().into()))?;
                        settle(job.map_err(|e| Failure::Local(CpError::io("write", &e)))?)
                    }
                    (None, Some(job)) => job,
                    (None, None) => unreachable!("a job is either busy or spare"),
                };
                std::mem::swap(&mut job.buf, &mut fill);
                let at = pos - job.buf.as_ref().len() as u64;
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
