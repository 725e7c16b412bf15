//! A download to stdout: the same ranged reads as to a file, emitted in order.

use std::io::Write;

use futures::StreamExt;
use md5::{Digest, Md5};

use super::super::endpoint::Remote;
use super::super::verify::{self, Check, Expect, SliceSum};
use super::super::{CpError, Ctx, Report};
use super::fetch::fetch_chunks;
use super::read_plan::read_plan;
use bucketfs_store::ObjectHead;

/// Write the object to stdout in order. Reads run `parallel` ahead; the reordering window
/// is those slices. A mismatch found afterwards can only be reported (the bytes are out).
pub async fn to_stdout(ctx: &Ctx, src: &Remote, head: Option<&ObjectHead>) -> Result<Report, CpError> {
    let p = read_plan(ctx, src, head).await?;
    let want_whole = matches!(p.expect, Expect::WholeMd5 { .. });
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
            _ = ctx.cancelled() => return Err(CpError::interrupted()),
        };
        let Some(item) = item else { break };
        let (range, data) = item?;
        let (with_md5, with_crc32, with_crc32c, blocks) = (p.slice_md5, p.slice_crc32, p.slice_crc32c, p.blocks);
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
            Ok::<_, std::io::Error>((SliceSum::of_chunks(range, &data, with_md5, with_crc32c, with_crc32, blocks), h))
        })
        .await
        .map_err(|e| CpError::from(e.to_string()))?
        .map_err(|e| CpError::io("writing to stdout", &e))?;
        hasher = h;
        ctx.progress.moved(sum.range.end - sum.range.start);
        sums.push(sum);
    }
    let whole = hasher.map(|h| h.finalize().into());
    let how = match verify::check(&p.expect, &sums, whole, p.blocks) {
        Check::Ok(how) => how,
        Check::Mismatch(m) => {
            return Err(CpError::Mismatch(format!("{}: the bytes written to stdout are wrong: {m}", src.url())))
        }
        Check::Reread => {
            let bad = verify::reread(ctx, &src.store, &src.key, &sums, if_match).await?;
            if let Some(&i) = bad.first() {
                return Err(CpError::Mismatch(format!(
                    "{}: the bytes written to stdout differ from a second read (at byte {})",
                    src.url(),
                    sums[i].range.start
                )));
            }
            verify::BY_REREAD
        }
    };
    Ok(Report { bytes: p.size, verified: how.into(), crc32c: verify::combined_crc(&sums) })
}
