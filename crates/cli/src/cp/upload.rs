//! Local file or stdin to a store. A reader thread cuts the source into part-sized chunks
//! and digests them; one chunk goes up with a single `put`, more through `Store::writer`
//! (S3 multipart, GCS parts + compose), `parallel` parts in flight. Then the object is
//! verified (see `verify`); a failed or mismatched upload of a file is aborted or deleted
//! and done again, within the retry budget.

use std::path::Path;

use bucketfs_core::block_pool::{read_full, BlockPool};
use bucketfs_store::{
    HeadOpts, ObjectHead, ObjectMeta, ObjectWriter, PutOpts, StoreError, StoreErrorKind, WriteOptions,
};
use bytes::Bytes;
use md5::{Digest, Md5};
use tokio::sync::mpsc;

use super::endpoint::{Kind, Remote};
use super::plan::{self, MIN_S3_PART};
use super::source::{LocalSource, Stat};
use super::verify::{self, Check, SliceSum};
use super::{is_retryable, retry, CpError, Ctx, Report};

/// The bytes of one upload.
pub enum Source<'a> {
    File(&'a Path),
    Stdin,
}

/// What the reader computed besides the chunks.
pub(super) struct Digests {
    pub sums: Vec<SliceSum>,
    pub whole_md5: Option<[u8; 16]>,
}

/// A failure, and whether doing the whole upload again may help.
pub(super) struct Failed {
    pub err: CpError,
    pub retry: bool,
    /// The store could not be reached: see [`super::SILENCE_GIVE_UP`].
    pub unreachable: bool,
}

impl Failed {
    /// A store's error: retried if [`is_retryable`].
    pub fn store(e: StoreError) -> Self {
        Failed {
            retry: is_retryable(&e),
            err: CpError::store(e.to_string(), &e),
            unreachable: e.kind == StoreErrorKind::Unavailable,
        }
    }

    /// `self`, or the error to stop with if the store could not be reached and the copy
    /// has heard nothing for [`super::SILENCE_GIVE_UP`].
    pub fn unless_silent(self, ctx: &Ctx, url: &str) -> Result<Self, CpError> {
        match super::silence(ctx, self.unreachable) {
            None => Ok(self),
            Some(why) => Err(self.err.with_message(format!("{url}: {} ({why})", self.err.message()))),
        }
    }

    /// The bytes are not what was sent or read: worth another attempt.
    pub fn mismatch(msg: String) -> Self {
        Failed { err: CpError::Mismatch(msg), retry: true, unreachable: false }
    }
}

impl From<CpError> for Failed {
    fn from(err: CpError) -> Self {
        Failed { err, retry: false, unreachable: false }
    }
}

impl From<String> for Failed {
    fn from(msg: String) -> Self {
        CpError::from(msg).into()
    }
}

/// Read `src` in `part`-byte chunks on a blocking thread. Each part's digests (crc32c
/// always, its MD5 for S3's multipart ETag unless the server checks crc32cs) are computed on a blocking task of their own,
/// while the part is being sent, so hashing spreads over the cores; GCS's whole-content MD5
/// (its `md5Hash`) needs the bytes in order and is computed by the reader itself.
/// Parts are read into buffers of a [`BlockPool`] of `keep` buffers (about those in flight,
/// read ahead and being hashed): a fresh 8-16 MiB buffer per part cost a page fault and a
/// cleared page per 4 KiB, about a fifth of an upload's CPU.
///
/// A file is read as a [`LocalSource`]: up to the size it had when opened, and checked for
/// changes after its last read, before that last chunk is handed over. A change is sent
/// instead of the last chunk, so the upload is aborted before it can be completed.
/// `first`: the file as the first attempt opened it (set by that attempt); a later attempt
/// fails as "changed" if the path names another file by then, or this one changed.
fn spawn_reader(
    src: &Source<'_>,
    part: usize,
    keep: usize,
    dst: &Remote,
    first: &mut Option<Stat>,
) -> Result<(Chunks, WholeMd5), CpError> {
    let kind = dst.kind;
    let part_md5 = kind == Kind::S3 && !dst.crc_confirmed;
    let mut input = match src {
        Source::File(p) => Input::File(match first {
            Some(was) => LocalSource::reopen(p, was)?,
            None => {
                let f = LocalSource::open(p)?;
                *first = Some(*f.stat());
                f
            }
        }),
        Source::Stdin => Input::Stdin(std::io::stdin()),
    };
    // Two chunks read ahead keep the uploads fed without holding much memory.
    let (tx, rx) = mpsc::channel(2);
    let pool = BlockPool::new(part, keep);
    let handle = tokio::task::spawn_blocking(move || {
        let mut whole = (kind == Kind::Gcs).then(Md5::new);
        let mut off = 0u64;
        loop {
            let mut buf = pool.take();
            let read = match &mut input {
                Input::File(f) => f.read_into(&mut buf.space()[..part]).map_err(CpError::from),
                Input::Stdin(s) => read_full(s, &mut buf.space()[..part]).map_err(|e| CpError::io("reading stdin", &e)),
            };
            let n = match read {
                Ok(n) => n,
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return None;
                }
            };
            let last = match &input {
                Input::File(f) => f.remaining() == 0,
                Input::Stdin(_) => n < part,
            };
            if last {
                // After the last read, before the last chunk can complete the upload.
                if let Input::File(f) = &mut input {
                    if let Err(e) = f.finish() {
                        let _ = tx.blocking_send(Err(e.into()));
                        return None;
                    }
                }
            }
            if n == 0 {
                break;
            }
            let data = buf.into_bytes(n);
            if let Some(h) = whole.as_mut() {
                h.update(&data);
            }
            let range = off..off + n as u64;
            let hashed = data.clone();
            let sum = tokio::task::spawn_blocking(move || SliceSum::of(range, &hashed, part_md5));
            off += n as u64;
            if tx.blocking_send(Ok((data, sum))).is_err() || last {
                break;
            }
        }
        whole.map(|h| h.finalize().into())
    });
    Ok((rx, handle))
}

/// What the reader reads: a watched file, or stdin (a stream: nothing to watch).
enum Input {
    File(LocalSource),
    Stdin(std::io::Stdin),
}

/// A part's digests, being computed.
type PendingSum = tokio::task::JoinHandle<SliceSum>;

/// Wait for the parts' digests, in order.
async fn sums_of(pending: Vec<PendingSum>) -> Result<Vec<SliceSum>, Failed> {
    let mut sums = Vec::with_capacity(pending.len());
    for p in pending {
        sums.push(p.await.map_err(|e| format!("hashing a part: {e}"))?);
    }
    Ok(sums)
}

/// Upload once: single `put` for one chunk, the writer for more.
async fn upload_once(
    ctx: &Ctx,
    src: &Source<'_>,
    dst: &Remote,
    part: usize,
    first: &mut Option<Stat>,
) -> Result<(ObjectMeta, Digests), Failed> {
    let attrs = match src {
        Source::File(p) if ctx.preserve => super::preserve::local_attrs(p),
        _ => bucketfs_store::FileAttrs::default(),
    };
    let (mut rx, reader) = spawn_reader(src, part, ctx.parallel + 4, dst, first)?;
    let mut sums = Vec::new();
    let first = rx.recv().await.transpose()?;
    let second = if first.is_some() { rx.recv().await.transpose()? } else { None };
    let meta = match (first, second) {
        (first, None) => {
            let data = match first {
                Some((data, sum)) => {
                    sums.push(sum);
                    data
                }
                None => Bytes::new(),
            };
            let _slot = ctx.slot().await;
            let put = retry(ctx, "upload", &dst.key, || {
                dst.store.put(&dst.key, data.clone(), PutOpts { attrs: attrs.clone(), ..Default::default() })
            });
            let m = tokio::select! {
                m = put => m?,
                _ = ctx.cancelled() => return Err(CpError::interrupted().into()),
            };
            ctx.progress.moved(data.len() as u64);
            m
        }
        (Some(a), Some(b)) => {
            // A multipart upload uses the whole request budget.
            let _slots = ctx.slots(ctx.parallel).await;
            let opts = WriteOptions {
                part_size: part,
                concurrency: ctx.parallel,
                put: PutOpts { attrs, ..Default::default() },
            };
            let mut w = dst.store.writer(&dst.key, opts).await.map_err(Failed::store)?;
            // Not a select around `feed`: a writer's `write` dropped mid-way poisons OpenDAL's
            // retry layer and then `abort` fails; `feed` checks for cancellation between writes.
            let fed = feed(ctx, w.as_mut(), &mut sums, a, b, &mut rx).await;
            if let Err(f) = fed {
                // Stops the parts in flight and deletes those uploaded: no orphans.
                if let Err(e) = w.abort().await {
                    ctx.progress.println(&format!("bucketfs cp: {}: aborting the upload: {e}", dst.url()));
                }
                return Err(f);
            }
            close_or_abort(ctx, dst, w.as_mut()).await.map_err(Failed::store)?
        }
        (None, Some(_)) => unreachable!("a second chunk is only read after a first"),
    };
    let whole_md5 = reader.await.map_err(|e| e.to_string())?;
    Ok((meta, Digests { sums: sums_of(sums).await?, whole_md5 }))
}

/// Complete the upload; if that fails (a part's error often only shows here, as parts go
/// up concurrently), abort it so that no parts stay behind.
pub(super) async fn close_or_abort(
    ctx: &Ctx,
    dst: &Remote,
    w: &mut dyn ObjectWriter,
) -> Result<ObjectMeta, StoreError> {
    let e = match w.close().await {
        Ok(meta) => return Ok(meta),
        Err(e) => e,
    };
    if let Err(a) = w.abort().await {
        ctx.progress.println(&format!("bucketfs cp: {}: aborting the upload: {a}", dst.url()));
    }
    Err(e)
}

type Chunks = mpsc::Receiver<Result<(Bytes, PendingSum), CpError>>;
/// The reader thread, which ends with the whole content's MD5 (when one was computed).
type WholeMd5 = tokio::task::JoinHandle<Option<[u8; 16]>>;

/// Write chunks `a`, `b`, then the rest of `rx` into `w`.
async fn feed(
    ctx: &Ctx,
    w: &mut dyn ObjectWriter,
    sums: &mut Vec<PendingSum>,
    a: (Bytes, PendingSum),
    b: (Bytes, PendingSum),
    rx: &mut Chunks,
) -> Result<(), Failed> {
    let mut first = [a, b].into_iter();
    loop {
        let item = match first.next() {
            Some(x) => Ok(x),
            // recv is cancel-safe, so waiting for the reader may be interrupted.
            None => match tokio::select! { r = rx.recv() => r, _ = ctx.cancelled() => None } {
                Some(item) => item,
                None if ctx.is_cancelled() => return Err(CpError::interrupted().into()),
                None => break,
            },
        };
        let (data, sum) = item?;
        if ctx.is_cancelled() {
            return Err(CpError::interrupted().into());
        }
        let n = data.len() as u64;
        sums.push(sum);
        w.write(data).await.map_err(Failed::store)?;
        ctx.progress.moved(n);
    }
    Ok(())
}

/// Compare the new object with what was sent; `Ok(how)` or a mismatch message.
pub(super) async fn verify_upload(
    ctx: &Ctx,
    dst: &Remote,
    meta: &ObjectMeta,
    d: &Digests,
) -> Result<&'static str, Failed> {
    let whole = d.whole_md5.or(match d.sums.as_slice() {
        [] => Some(Md5::digest(b"").into()),
        [one] => one.md5,
        _ => None,
    });
    let size: u64 = d.sums.iter().map(|s| s.range.end - s.range.start).sum();
    if meta.size != size {
        return Err(Failed::mismatch(format!("the store has {} bytes, {size} were sent", meta.size)));
    }
    if dst.crc_confirmed {
        // The server checked every request's crc32c and the parts' composite (store s3::checksum).
        return Ok(verify::BY_S3_CRC32C);
    }
    // S3 returns the ETag with the upload; GCS's MD5 needs a HEAD.
    let digests = match (dst.kind, &meta.etag) {
        (Kind::S3, Some(etag)) => {
            ObjectHead { etag: Some(etag.trim_matches('"').to_string()), ..ObjectHead::of(meta.clone()) }
        }
        (Kind::Other, _) => ObjectHead::of(meta.clone()),
        _ => {
            retry(ctx, "head", &dst.key, || dst.store.head(&dst.key, HeadOpts { digests: true, ..Default::default() }))
                .await?
        }
    };
    match verify::check(&verify::expect(dst.kind, &digests), &d.sums, whole, None) {
        Check::Ok(how) => Ok(how),
        Check::Mismatch(msg) => Err(Failed::mismatch(msg)),
        Check::Reread => {
            let bad = verify::reread(ctx, &dst.store, &dst.key, &d.sums, meta.etag.as_deref()).await?;
            match bad.first() {
                None => Ok(verify::BY_REREAD),
                Some(&i) => {
                    Err(Failed::mismatch(format!("crc32c differs on re-read at byte {}", d.sums[i].range.start)))
                }
            }
        }
    }
}

/// Part size for `dst`: the slice, but never under S3's 5 MiB minimum there. On GCS, up
/// to 64 MiB parts so that files to 2 GiB need a single compose request (32 sources):
/// emulators copy the bytes at each compose level.
pub(super) fn part_size(ctx: &Ctx, dst: &Remote, size: Option<u64>) -> usize {
    let slice = plan::tuning(size, ctx.slice, Some(ctx.parallel)).slice;
    let part = match (dst.kind, size, ctx.slice) {
        (Kind::S3, _, _) => slice.max(MIN_S3_PART),
        (Kind::Gcs, Some(n), None) => {
            slice.max(n.div_ceil(32).div_ceil(plan::MIB) * plan::MIB).min(64 * plan::MIB).max(slice)
        }
        _ => slice,
    };
    usize::try_from(part).unwrap_or(usize::MAX)
}

/// Delete a copy that failed verification: a known-bad object must not stay behind looking
/// like a good copy. Not when the object changed meanwhile (`CpError::Changed`, from a
/// re-read pinned to the version written): the key then holds another writer's newer
/// version, which is not ours to delete.
pub(super) async fn remove_bad_copy(ctx: &Ctx, dst: &Remote, err: &CpError) {
    if matches!(err, CpError::Changed(_)) {
        return;
    }
    if let Err(e) = dst.store.delete(&dst.key).await {
        if e.kind != StoreErrorKind::NotFound {
            ctx.progress.println(&format!("bucketfs cp: {}: could not delete the bad copy: {e}", dst.url()));
        }
    }
}

/// Upload `src` (of `size` bytes if known) to `dst`, verified; files retry as a whole.
pub async fn upload(ctx: &Ctx, src: Source<'_>, size: Option<u64>, dst: &Remote) -> Result<Report, CpError> {
    let part = part_size(ctx, dst, size);
    let can_retry = matches!(src, Source::File(_));
    let mut last = CpError::from(String::new());
    let mut first = None;
    for attempt in 0..=ctx.retries {
        if attempt > 0 {
            ctx.progress.println(&format!("bucketfs cp: {}: {last}; uploading again", dst.url()));
            ctx.progress.retrying(size.unwrap_or(0));
            tokio::time::sleep(ctx.backoff(attempt)).await;
        }
        let failed = match upload_once(ctx, &src, dst, part, &mut first).await {
            Ok((meta, d)) => match verify_upload(ctx, dst, &meta, &d).await {
                Ok(how) => {
                    let bytes = d.sums.iter().map(|s| s.range.end - s.range.start).sum();
                    return Ok(Report { bytes, verified: how.into(), crc32c: verify::combined_crc(&d.sums) });
                }
                Err(f) => {
                    remove_bad_copy(ctx, dst, &f.err).await;
                    Failed { err: f.err.context("verification failed"), ..f }
                }
            },
            Err(f) => f,
        };
        let failed = failed.unless_silent(ctx, &dst.url())?;
        last = failed.err;
        if !failed.retry || !can_retry {
            return Err(last.context(dst.url()));
        }
    }
    Err(last.context(format_args!("{}: failed after {} attempts", dst.url(), ctx.retries + 1)))
}
