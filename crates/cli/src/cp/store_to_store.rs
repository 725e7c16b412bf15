//! Store to store (`cp s3://a/k gs://b/k`, or between two buckets, or within one).
//!
//! - **Within one bucket** (both sides the same opened store): the store's server-side
//!   `copy` (S3 CopyObject, GCS copy), no bytes through us; S3 objects over 5 GiB (the
//!   CopyObject limit) are streamed instead.
//! - **Otherwise**: parallel ranged reads of the source, pinned to its ETag/generation,
//!   handed in order to the destination's part writer (S3 multipart, GCS parts + compose).
//!   At most `parallel` slices are read ahead and `parallel` parts are in flight, so memory
//!   stays at about 2 × parallel × slice, never the whole object.
//!
//! Verification is end to end: what was read is checked against the *source's* digest
//! (MD5 / ETag, or a re-read of the source) and the destination against what was read (its
//! MD5 / ETag, or a re-read), as for uploads and downloads (see `verify`). A server-side
//! copy compares the two objects' digests, or re-reads both. A failure or mismatch deletes
//! the copy and starts again, within `--retries`.

use std::sync::Arc;

use bucketfs_store::{HeadOpts, ObjectHead, ObjectMeta, PutOpts, WriteOptions};
use bytes::Bytes;
use futures::StreamExt;
use md5::{Digest, Md5};

use super::download::{fetch, fetch_chunks};
use super::endpoint::{Kind, Remote};
use super::plan::{self, slices, MIN_S3_PART};
use super::upload::{close_or_abort, part_size, verify_upload, Digests, Failed};
use super::verify::{self, BlockSpec, Check, Expect, SliceSum, BY_ETAG, BY_MD5, BY_REREAD, BY_S3_CRC32, BY_S3_CRC32C};
use super::{retry, CpError, Ctx, Report};

/// S3's CopyObject copies at most 5 GiB in one request.
const S3_COPY_MAX: u64 = 5 << 30;

/// Copy `src` (`size` bytes) to `dst`, verified.
pub async fn copy(ctx: &Ctx, src: &Remote, head: Option<&ObjectHead>, dst: &Remote) -> Result<Report, CpError> {
    if src.url() == dst.url() {
        return Err(format!("{}: source and destination are the same object", src.url()).into());
    }
    let d = super::download::head(ctx, src, head).await?;
    let same_store = std::ptr::addr_eq(Arc::as_ptr(&src.store), Arc::as_ptr(&dst.store));
    let r = if same_store && !(src.kind == Kind::S3 && d.meta.size > S3_COPY_MAX) {
        server_side(ctx, src, dst, &d).await
    } else {
        streamed(ctx, src, dst, &d).await
    };
    r.map_err(|e| e.context(format_args!("{} -> {}", src.url(), dst.url())))
}

/// How a store-to-store copy was verified, source side then destination side (a side
/// that names no known way counts as re-read).
fn how(src: &str, dst: &str) -> String {
    const HOWS: [&str; 5] = [BY_MD5, BY_ETAG, BY_REREAD, BY_S3_CRC32C, BY_S3_CRC32];
    let known = |h: &str| HOWS.into_iter().find(|k| *k == h).unwrap_or(BY_REREAD);
    format!("{}>{}", known(src), known(dst))
}

// ------------------------------------------------------------------ server side

async fn server_side(ctx: &Ctx, src: &Remote, dst: &Remote, d: &bucketfs_store::ObjectHead) -> Result<Report, CpError> {
    let size = d.meta.size;
    let mut last = CpError::from(String::new());
    for attempt in 0..=ctx.retries {
        if attempt > 0 {
            ctx.progress.println(&format!("bucketfs cp: {}: {last}; copying again", dst.url()));
            tokio::time::sleep(ctx.backoff(attempt)).await;
        }
        {
            let _slot = ctx.slot().await;
            retry(ctx, "copy", &src.key, || src.store.copy(&src.key, &dst.key)).await?;
        }
        ctx.progress.moved(size);
        let got =
            retry(ctx, "head", &dst.key, || dst.store.head(&dst.key, HeadOpts { digests: true, ..Default::default() }))
                .await?;
        match compare_copies(ctx, src, dst, d, &got).await {
            Ok((how, crc)) => return Ok(Report { bytes: size, verified: how.into(), crc32c: crc }),
            Err(e) => {
                super::upload::remove_bad_copy(ctx, dst, &e).await;
                last = e;
            }
        }
    }
    Err(last.context(format_args!("verification failed after {} attempts", ctx.retries + 1)))
}

/// Same size and the same digest, or else the same crc32c of every slice read from both.
async fn compare_copies(
    ctx: &Ctx,
    src: &Remote,
    dst: &Remote,
    a: &bucketfs_store::ObjectHead,
    b: &bucketfs_store::ObjectHead,
) -> Result<(&'static str, Option<u32>), CpError> {
    if a.meta.size != b.meta.size {
        return Err(CpError::Mismatch(format!("the copy has {} bytes, the source {}", b.meta.size, a.meta.size)));
    }
    let (ea, eb) = (verify::expect(src.kind, a), verify::expect(dst.kind, b));
    let same_digest = match (&ea, &eb) {
        (Expect::WholeMd5 { md5: x, .. }, Expect::WholeMd5 { md5: y, .. }) => x == y,
        (Expect::Composite { etag: x, .. }, Expect::Composite { etag: y, .. }) => x == y,
        _ => false,
    };
    if same_digest {
        // The crc32c is not known without reading.
        return Ok((if matches!(ea, Expect::WholeMd5 { .. }) { "copy:md5" } else { "copy:s3-etag" }, None));
    }
    let ranges = slices(a.meta.size, plan::tuning(Some(a.meta.size), ctx.slice, Some(ctx.parallel)).slice);
    let sums = read_sums(ctx, src, &ranges, a.meta.etag.as_deref()).await?;
    let bad = verify::reread(ctx, &dst.store, &dst.key, &sums, b.meta.etag.as_deref()).await?;
    match bad.first() {
        None => Ok(("copy:reread-crc32c", verify::combined_crc(&sums))),
        Some(&i) => Err(CpError::Mismatch(format!("crc32c differs from the source at byte {}", sums[i].range.start))),
    }
}

/// crc32c of each range of `r`, read in parallel.
async fn read_sums(
    ctx: &Ctx,
    r: &Remote,
    ranges: &[std::ops::Range<u64>],
    if_match: Option<&str>,
) -> Result<Vec<SliceSum>, CpError> {
    futures::stream::iter(ranges.iter().cloned())
        .map(|range| async move {
            let data = {
                let _slot = ctx.slot().await;
                fetch(ctx, r, range.clone(), if_match).await?
            };
            let sum = tokio::task::spawn_blocking(move || SliceSum::of(range, &data, false))
                .await
                .map_err(|e| e.to_string())?;
            ctx.progress.verified(sum.range.end - sum.range.start);
            Ok::<_, CpError>(sum)
        })
        .buffered(ctx.parallel)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

// ------------------------------------------------------------------ streamed

/// The slice size: the source's own part size when its ETag or S3 checksum is multipart and
/// that size is usable as the destination's part (then the source's digest can be rebuilt
/// from what was read), else the destination's part size.
fn piece_size(ctx: &Ctx, dst: &Remote, size: u64, src_expect: &Expect, told: Option<u64>) -> u64 {
    let ours = part_size(ctx, dst, Some(size)) as u64;
    if let (Some(parts), None) = (src_expect.parts(), ctx.slice) {
        if let Some(p) = told.or_else(|| verify::guess_part_size(size, parts, ours)) {
            if (dst.kind != Kind::S3 || p >= MIN_S3_PART) && p <= 256 * plan::MIB {
                return p;
            }
        }
    }
    ours
}

async fn streamed(ctx: &Ctx, src: &Remote, dst: &Remote, d: &bucketfs_store::ObjectHead) -> Result<Report, CpError> {
    let size = d.meta.size;
    let src_expect = verify::expect(src.kind, d);
    let told = src_expect.parts().and_then(|n| verify::told_part_size(d, n));
    let piece = piece_size(ctx, dst, size, &src_expect, told);
    // Unless the store told the source's part size, it is only guessed: a COMPOSITE crc is
    // also tried in every other part size of whole blocks.
    let blocks = src_expect.blocks(piece, told);
    let if_match = d.meta.etag.clone();
    let mut last = CpError::from(String::new());
    for attempt in 0..=ctx.retries {
        if attempt > 0 {
            ctx.progress.println(&format!("bucketfs cp: {}: {last}; copying again", dst.url()));
            ctx.progress.retrying(size);
            tokio::time::sleep(ctx.backoff(attempt)).await;
        }
        let want_whole = matches!(src_expect, Expect::WholeMd5 { .. }) || dst.kind == Kind::Gcs;
        let want_parts = matches!(src_expect, Expect::Composite { .. }) || (dst.kind == Kind::S3 && !dst.crc_confirmed);
        let want = Want { parts: want_parts, whole: want_whole, crc32: src_expect.wants_crc32(), blocks };
        let once = stream_once(ctx, src, dst, size, piece, if_match.as_deref(), want);
        let failed = match once.await {
            Ok((meta, digests)) => {
                match verify_both(ctx, src, dst, &meta, &digests, &src_expect, blocks, &if_match).await {
                    Ok(how) => {
                        return Ok(Report {
                            bytes: size,
                            verified: how.into(),
                            crc32c: verify::combined_crc(&digests.sums),
                        });
                    }
                    Err(f) => {
                        super::upload::remove_bad_copy(ctx, dst, &f.err).await;
                        Failed { err: f.err.context("verification failed"), ..f }
                    }
                }
            }
            Err(f) => f,
        };
        let failed = failed.unless_silent(ctx, &dst.url())?;
        last = failed.err;
        if !failed.retry || ctx.is_cancelled() {
            return Err(last);
        }
    }
    Err(last.context(format_args!("failed after {} attempts", ctx.retries + 1)))
}

/// The source read against its own digest, then the destination against what was read.
#[allow(clippy::too_many_arguments)]
async fn verify_both(
    ctx: &Ctx,
    src: &Remote,
    dst: &Remote,
    meta: &ObjectMeta,
    d: &Digests,
    src_expect: &Expect,
    blocks: Option<BlockSpec>,
    if_match: &Option<String>,
) -> Result<String, Failed> {
    let src_how = match verify::check(src_expect, &d.sums, d.whole_md5, blocks) {
        Check::Ok(how) => how,
        Check::Mismatch(m) => return Err(Failed::mismatch(format!("the source read wrong: {m}"))),
        Check::Reread => {
            let bad = verify::reread(ctx, &src.store, &src.key, &d.sums, if_match.as_deref()).await?;
            if let Some(&i) = bad.first() {
                let at = d.sums[i].range.start;
                return Err(Failed::mismatch(format!("crc32c of the source differs on re-read at byte {at}")));
            }
            BY_REREAD
        }
    };
    let dst_how = verify_upload(ctx, dst, meta, d).await?;
    Ok(how(src_how, dst_how))
}

/// The digests [`stream_once`] computes of what it reads: each slice's MD5 (`parts`) and
/// crc32 (`crc32`, besides its crc32c), and the whole content's MD5 (`whole`).
#[derive(Clone, Copy)]
struct Want {
    parts: bool,
    whole: bool,
    crc32: bool,
    /// The block crcs a COMPOSITE source checksum needs.
    blocks: Option<BlockSpec>,
}

/// Read the source in order (`parallel` slices ahead) into the destination. One slice goes
/// up with one `put`, more through the part writer, which then holds all request slots.
async fn stream_once(
    ctx: &Ctx,
    src: &Remote,
    dst: &Remote,
    size: u64,
    piece: u64,
    if_match: Option<&str>,
    want: Want,
) -> Result<(ObjectMeta, Digests), Failed> {
    let Want { parts: want_parts, whole: want_whole, crc32: want_crc32, blocks } = want;
    let ranges = slices(size, piece);
    if ranges.len() <= 1 {
        let data = match ranges.first() {
            Some(r) => {
                let _slot = ctx.slot().await;
                fetch(ctx, src, r.clone(), if_match).await.map_err(read_failed)?
            }
            None => Bytes::new(),
        };
        // Hashing up to a slice (or a large --slice-size) would stall the runtime thread.
        let (d, first) = (data.clone(), ranges.first().cloned());
        let (sums, whole_md5) = tokio::task::spawn_blocking(move || {
            let sums: Vec<SliceSum> = first
                .map(|r| SliceSum::of_chunks(r, std::slice::from_ref(&d), true, true, want_crc32, blocks))
                .into_iter()
                .collect();
            (sums, want_whole.then(|| Md5::digest(&d).into()))
        })
        .await
        .map_err(|e| format!("hashing: {e}"))?;
        let meta = {
            let _slot = ctx.slot().await;
            retry(ctx, "upload", &dst.key, || dst.store.put(&dst.key, data.clone(), PutOpts::default())).await?
        };
        ctx.progress.moved(data.len() as u64);
        return Ok((meta, Digests { sums, whole_md5 }));
    }
    let _slots = ctx.slots(ctx.parallel).await;
    let opts = WriteOptions {
        part_size: usize::try_from(piece).unwrap_or(usize::MAX),
        concurrency: ctx.parallel,
        ..Default::default()
    };
    let mut w = dst.store.writer(&dst.key, opts).await.map_err(Failed::store)?;
    // Reads run ahead without taking slots: this copy already holds them all.
    let mut reads = futures::stream::iter(ranges)
        .map(|range| async move {
            let data = fetch_chunks(ctx, src, range.clone(), if_match).await?;
            let d = data.clone();
            let sum = tokio::task::spawn_blocking(move || {
                SliceSum::of_chunks(range, &d, want_parts, true, want_crc32, blocks)
            })
            .await
            .map_err(|e| e.to_string())?;
            Ok::<_, CpError>((data, sum))
        })
        .buffered(ctx.parallel);
    let whole = want_whole.then(WholeMd5::start);
    let mut sums = Vec::new();
    let mut result = Ok(());
    loop {
        let item = tokio::select! {
            item = reads.next() => item,
            _ = ctx.cancelled() => { result = Err(CpError::interrupted().into()); break }
        };
        let Some(item) = item else { break };
        let (data, sum) = match item {
            Ok(x) => x,
            Err(e) => {
                result = Err(read_failed(e));
                break;
            }
        };
        if let Some(h) = &whole {
            data.iter().for_each(|c| h.feed(c.clone()));
        }
        let n = sum.range.end - sum.range.start;
        sums.push(sum);
        // The response's chunks as they came: the writer gathers them into parts.
        for c in data {
            if let Err(e) = w.write(c).await {
                result = Err(Failed::store(e));
                break;
            }
        }
        if result.is_err() {
            break;
        }
        ctx.progress.moved(n);
    }
    drop(reads);
    if let Err(f) = result {
        if let Err(e) = w.abort().await {
            ctx.progress.println(&format!("bucketfs cp: {}: aborting the upload: {e}", dst.url()));
        }
        return Err(f);
    }
    let meta = close_or_abort(ctx, dst, w.as_mut()).await.map_err(Failed::store)?;
    let whole_md5 = match whole {
        Some(h) => Some(h.finish().await?),
        None => None,
    };
    Ok((meta, Digests { sums, whole_md5 }))
}

/// A failed read is worth another attempt of the whole copy unless the source changed
/// (then its pinned ETag/generation no longer matches and never will).
fn read_failed(err: CpError) -> Failed {
    let retry = !matches!(err, CpError::Changed(_));
    Failed { err, retry, unreachable: false }
}

/// The MD5 of the whole stream on a thread of its own, fed in order.
struct WholeMd5 {
    tx: std::sync::mpsc::Sender<Bytes>,
    handle: std::thread::JoinHandle<[u8; 16]>,
}

impl WholeMd5 {
    fn start() -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<Bytes>();
        let handle = std::thread::spawn(move || {
            let mut h = Md5::new();
            for b in rx {
                h.update(&b);
            }
            h.finalize().into()
        });
        Self { tx, handle }
    }

    fn feed(&self, b: Bytes) {
        let _ = self.tx.send(b);
    }

    async fn finish(self) -> Result<[u8; 16], Failed> {
        drop(self.tx);
        let handle = self.handle;
        tokio::task::spawn_blocking(move || handle.join())
            .await
            .map_err(|e| Failed::from(e.to_string()))?
            .map_err(|_| Failed::from("the hashing thread panicked".to_string()))
    }
}
