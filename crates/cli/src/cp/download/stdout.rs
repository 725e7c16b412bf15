//! A download to stdout, or into a file that is not a regular one (a device, a FIFO):
//! the same ranged reads as to a file, emitted in order.

use std::io::Write;
use std::sync::Arc;

use futures::StreamExt;
use md5::{Digest, Md5};

use super::super::endpoint::Remote;
use super::super::verify::{self, Check, Expect, SliceSum};
use super::super::{CpError, Ctx, Report};
use super::fetch::fetch_chunks;
use super::read_plan::read_plan;
use bucketfs_store::ObjectHead;

/// Where an in-order download goes.
#[derive(Clone)]
pub enum Sink {
    Stdout,
    /// A file opened for writing that is written in order and in place, never renamed
    /// over: a character device (`/dev/null`), a FIFO, the terminal. A temporary renamed
    /// over `/dev/null` replaced the device with a regular file for the whole machine
    /// (tester Q).
    Special(Arc<std::fs::File>, String),
}

impl Sink {
    fn write(&self, data: &[bytes::Bytes]) -> std::io::Result<()> {
        match self {
            Sink::Stdout => {
                let mut out = std::io::stdout().lock();
                data.iter().try_for_each(|c| out.write_all(c))?;
                out.flush()
            }
            Sink::Special(file, _) => data.iter().try_for_each(|c| (&**file).write_all(c)),
        }
    }

    fn name(&self) -> &str {
        match self {
            Sink::Stdout => "stdout",
            Sink::Special(_, name) => name,
        }
    }
}

/// Write the object to stdout in order ([`to_sink`]).
pub async fn to_stdout(ctx: &Ctx, src: &Remote, head: Option<&ObjectHead>) -> Result<Report, CpError> {
    to_sink(ctx, src, head, Sink::Stdout).await
}

/// Write the object to `sink` in order. Reads run `parallel` ahead; the reordering window
/// is those slices. A mismatch found afterwards can only be reported (the bytes are out).
pub async fn to_sink(ctx: &Ctx, src: &Remote, head: Option<&ObjectHead>, sink: Sink) -> Result<Report, CpError> {
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
        let out = sink.clone();
        let (sum, h) = tokio::task::spawn_blocking(move || {
            out.write(&data)?;
            let h = h.map(|mut h| {
                data.iter().for_each(|c| h.update(c));
                h
            });
            Ok::<_, std::io::Error>((SliceSum::of_chunks(range, &data, with_md5, with_crc32c, with_crc32, blocks), h))
        })
        .await
        .map_err(|e| CpError::from(e.to_string()))?
        .map_err(|e| CpError::io(format_args!("writing to {}", sink.name()), &e))?;
        hasher = h;
        ctx.progress.moved(sum.range.end - sum.range.start);
        sums.push(sum);
    }
    let whole = hasher.map(|h| h.finalize().into());
    let how = match verify::check(&p.expect, &sums, whole, p.blocks) {
        Check::Ok(how) => how,
        Check::Mismatch(m) => {
            return Err(CpError::Mismatch(format!(
                "{}: the bytes written to {} are wrong: {m}",
                src.url(),
                sink.name()
            )))
        }
        Check::Reread => {
            let bad = verify::reread(ctx, &src.store, &src.key, &sums, if_match).await?;
            if let Some(&i) = bad.first() {
                return Err(CpError::Mismatch(format!(
                    "{}: the bytes written to {} differ from a second read (at byte {})",
                    src.url(),
                    sink.name(),
                    sums[i].range.start
                )));
            }
            verify::BY_REREAD
        }
    };
    Ok(Report { bytes: p.size, verified: how.into(), crc32c: verify::combined_crc(&sums) })
}
