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
use super::verify::{self, Check, Expect, SliceSum};
use super::{retry, Ctx, Report, INTERRUPTED};
use bucketfs_store::{StoreError, StoreErrorKind};

/// How to read one object: its identity, size, ranges and what to verify against.
struct ReadPlan {
    size: u64,
    if_match: Option<String>,
    ranges: Vec<std::ops::Range<u64>>,
    expect: Expect,
    /// The slice size was guessed from a multipart ETag's part count.
    guessed: bool,
    slice_md5: bool,
}

async fn read_plan(ctx: &Ctx, src: &Remote) -> Result<ReadPlan, String> {
    let d = retry(ctx, "head", &src.key, || src.store.head_digests(&src.key)).await?;
    let size = d.meta.size;
    let expect = verify::expect(src.kind, &d);
    let mut tuning = plan::tuning(Some(size), ctx.slice, Some(ctx.parallel));
    let mut guessed = false;
    if let (Expect::Composite { parts, .. }, None) = (&expect, ctx.slice) {
        // Read in the uploader's parts so the per-slice MD5s rebuild the ETag.
        let ours = plan::tuning(Some(size), None, None).slice.max(plan::MIN_S3_PART);
        if let Some(p) = verify::guess_part_size(size, *parts, ours) {
            tuning.slice = p;
            guessed = true;
        }
    }
    let slice_md5 = matches!(expect, Expect::Composite { .. });
    Ok(ReadPlan { size, if_match: d.meta.etag, ranges: slices(size, tuning.slice), expect, guessed, slice_md5 })
}

/// One ranged read with retries; a short read counts as a (retried) failure.
pub(super) async fn fetch(ctx: &Ctx, src: &Remote, range: std::ops::Range<u64>, if_match: Option<&str>) -> Result<Bytes, String> {
    let want = (range.end - range.start) as usize;
    retry(ctx, "read", &src.key, || {
        let range = range.clone();
        async move {
            let data = src.store.get_range(&src.key, range.clone(), if_match).await?;
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

/// A temp file beside `dst`, so a half-written file never has the final name.
fn temp_path(dst: &Path) -> PathBuf {
    let name = dst.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let n =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
    dst.with_file_name(format!(".{name}.bucketfs-{:x}-{n:x}", std::process::id()))
}

/// Fetch `ranges` into `file` in parallel; digests in range order.
async fn fetch_into(
    ctx: &Ctx,
    src: &Remote,
    p: &ReadPlan,
    file: &Arc<File>,
    ranges: Vec<usize>,
    md5: Option<&TrailingMd5>,
) -> Result<Vec<(usize, SliceSum)>, String> {
    let if_match = p.if_match.as_deref();
    let results: Vec<Result<(usize, SliceSum), String>> = futures::stream::iter(ranges)
        .map(|i| {
            let range = p.ranges[i].clone();
            let file = file.clone();
            async move {
                let data = {
                    let _slot = ctx.slot().await;
                    fetch(ctx, src, range.clone(), if_match).await?
                };
                let with_md5 = p.slice_md5;
                let sum = tokio::task::spawn_blocking(move || {
                    file.write_all_at(&data, range.start)?;
                    Ok::<_, std::io::Error>(SliceSum::of(range, &data, with_md5))
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("write: {e}"))?;
                ctx.progress.moved(sum.range.end - sum.range.start);
                if let Some(m) = md5 {
                    m.landed(sum.range.clone());
                }
                Ok((i, sum))
            }
        })
        .buffer_unordered(ctx.parallel)
        .collect()
        .await;
    let mut out = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    out.sort_by_key(|(i, _)| *i);
    Ok(out)
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

pub async fn to_file(ctx: &Ctx, src: &Remote, dst: &Path) -> Result<Report, String> {
    if let Some(parent) = dst.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let p = read_plan(ctx, src).await?;
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
        // Read as well as write: the MD5 thread reads back what landed.
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(tmp);
        let file = Arc::new(file.map_err(|e| format!("{}: {e}", tmp.display()))?);
        file.set_len(p.size).map_err(|e| format!("{}: {e}", tmp.display()))?; // sparse until written
        let md5 = matches!(p.expect, Expect::WholeMd5(_)).then(|| TrailingMd5::start(file.clone(), p.size));
        let all = (0..p.ranges.len()).collect();
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
        return Ok(Report { bytes: p.size, verified: how, crc32c: verify::combined_crc(&sums) });
    }
    Err(format!("{}: verification failed after {} attempts: {last}", src.url(), ctx.retries + 1))
}

/// Read everything again and compare crc32c per slice; a slice that differs is fetched
/// again (a read was corrupted in transit) until two reads agree, within the retry budget.
async fn reread_and_repair(
    ctx: &Ctx,
    src: &Remote,
    p: &ReadPlan,
    file: &Arc<File>,
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
        for (i, s) in fetch_into(ctx, src, p, file, bad.clone(), None).await? {
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
    Err(format!("crc32c of {} slice(s) differs between reads (first at byte {})", bad.len(), sums[bad[0]].range.start))
}

/// Write the object to stdout in order. Reads run `parallel` ahead; the reordering window
/// is those slices. A mismatch found afterwards can only be reported (the bytes are out).
pub async fn to_stdout(ctx: &Ctx, src: &Remote) -> Result<Report, String> {
    let p = read_plan(ctx, src).await?;
    let want_whole = matches!(p.expect, Expect::WholeMd5(_));
    let if_match = p.if_match.as_deref();
    let mut stream = futures::stream::iter(p.ranges.clone())
        .map(|range| async move {
            let _slot = ctx.slot().await;
            fetch(ctx, src, range.clone(), if_match).await.map(|d| (range, d))
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
        let with_md5 = p.slice_md5;
        let h = hasher.take();
        let (sum, h) = tokio::task::spawn_blocking(move || {
            let mut out = std::io::stdout().lock();
            out.write_all(&data)?;
            out.flush()?;
            let h = h.map(|mut h| {
                h.update(&data);
                h
            });
            Ok::<_, std::io::Error>((SliceSum::of(range, &data, with_md5), h))
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
    Ok(Report { bytes: p.size, verified: how, crc32c: verify::combined_crc(&sums) })
}
