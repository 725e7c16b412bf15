//! Store to local file (parallel ranged reads written in place into a pre-sized sparse
//! temp file, renamed into place once verified) and store to stdout (the same reads,
//! emitted in order through a reordering window of `parallel` slices).
//!
//! - [`read_plan`]: what to read and verify; [`fetch`]: ranged reads with retries (also
//!   for store-to-store copies).
//! - [`target`]: the temp file (its name, its allocation, `O_DIRECT` writes).
//! - [`receive`]: the request slots and their write pipeline; [`trailing_md5`]: the
//!   whole-file MD5 while slices land.
//! - This file: a download's attempts, verification and repair; [`stdout`]: to stdout.

mod fetch;
mod read_plan;
mod receive;
mod stdout;
mod target;
mod trailing_md5;

use std::path::Path;
use std::sync::Arc;

use super::endpoint::Remote;
use super::verify::{self, Check, Expect, SliceSum};
use super::work::groups;
use super::{CpError, Ctx, Report};
use bucketfs_store::ObjectHead;
use read_plan::{read_plan, ReadPlan};
use receive::fetch_into;
use target::{open_reserved, temp_path};
use trailing_md5::TrailingMd5;

pub(super) use fetch::{fetch, fetch_chunks};
pub(super) use read_plan::head;
pub(super) use receive::{POOL_MAX, WRITE_BUF};
pub(super) use stdout::to_stdout;
use stdout::{to_sink, Sink};
pub(super) use target::Target;

pub async fn to_file(ctx: &Ctx, src: &Remote, head: Option<&ObjectHead>, dst: &Path) -> Result<Report, CpError> {
    if let Some(parent) = dst.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| CpError::io(parent.display(), &e))?;
    }
    // As cp(1): a device or a FIFO (through a link too: `/dev/stdout`) is written in
    // place; a symlink to a file is written through (the link stays), one to no file
    // makes its target; a file that exists keeps its mode and owner (the new bytes
    // replace it by a rename).
    if let Some(m) = std::fs::metadata(dst).ok().filter(|m| !m.is_file() && !m.is_dir()) {
        let file = std::fs::OpenOptions::new().write(true).open(dst).map_err(|e| CpError::io(dst.display(), &e))?;
        tracing::debug!(dst = %dst.display(), kind = ?m.file_type(), "not a regular file: written in place, in order");
        return to_sink(ctx, src, head, Sink::Special(Arc::new(file), dst.display().to_string())).await;
    }
    let resolved = link_target(dst);
    let dst = resolved.as_deref().unwrap_or(dst);
    let existing = std::fs::metadata(dst).ok().filter(|m| m.is_file());
    let p = read_plan(ctx, src, head).await?;
    let tmp = temp_path(dst);
    let result = tokio::select! {
        r = download_verified(ctx, src, &p, &tmp) => r,
        _ = ctx.cancelled() => Err(CpError::interrupted()),
    };
    match result {
        Ok(report) => {
            if let Some(m) = existing {
                use std::os::unix::fs::{MetadataExt, PermissionsExt};
                let _ = std::os::unix::fs::chown(&tmp, Some(m.uid()), Some(m.gid()));
                let _ = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(m.mode() & 0o7777));
            }
            if let Err(e) = std::fs::rename(&tmp, dst) {
                // A directory in the way, say: no hidden temporary is left behind either.
                let _ = std::fs::remove_file(&tmp);
                return Err(CpError::io(dst.display(), &e));
            }
            Ok(report)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// What the symbolic link `dst` (through a chain of links) leads to, made or not; `None`
/// if `dst` is no link. A link to no file was replaced by the copy, its target never made.
fn link_target(dst: &Path) -> Option<std::path::PathBuf> {
    let mut at = dst.to_path_buf();
    for _ in 0..40 {
        if !std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            return (at != dst).then_some(at);
        }
        let to = std::fs::read_link(&at).ok()?;
        at = at.parent().map_or(to.clone(), |dir| dir.join(&to));
    }
    None // a loop: the rename over the link fails, as cp(1) does
}

async fn download_verified(ctx: &Ctx, src: &Remote, p: &ReadPlan, tmp: &Path) -> Result<Report, CpError> {
    let mut last = CpError::from(String::new());
    for attempt in 0..=ctx.retries {
        if attempt > 0 {
            ctx.progress.println(&format!("bucketfs cp: {}: {last}; downloading again", src.url()));
            ctx.progress.retrying(p.size);
        }
        // The whole-file MD5 reads back what landed, best from the page cache: no O_DIRECT.
        let whole_md5 = matches!(p.expect, Expect::WholeMd5 { .. });
        let file = Arc::new(open_reserved(tmp, !whole_md5, p.size).await?);
        let md5 = whole_md5.then(|| TrailingMd5::start(file.file.clone(), p.size));
        let all = groups(p.ranges.len(), p.ranges.first().map_or(1, |r| r.end - r.start), ctx.parallel);
        let mut sums: Vec<SliceSum> =
            fetch_into(ctx, src, p, &file, all, md5.as_ref()).await?.into_iter().map(|(_, s)| s).collect();
        let whole = match md5 {
            Some(m) => Some(m.finish().await?),
            None => None,
        };
        let how = match verify::check(&p.expect, &sums, whole, p.blocks) {
            Check::Ok(how) => how,
            Check::Mismatch(m) => {
                last = CpError::Mismatch(m);
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
    Err(last.context(format_args!("{}: verification failed after {} attempts", src.url(), ctx.retries + 1)))
}

/// Read everything again and compare crc32c (or crc32) per slice; a slice that differs is fetched
/// again (a read was corrupted in transit) until two reads agree, within the retry budget.
async fn reread_and_repair(
    ctx: &Ctx,
    src: &Remote,
    p: &ReadPlan,
    file: &Arc<Target>,
    sums: &mut [SliceSum],
) -> Result<(), CpError> {
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
    let at = sums[bad[0]].range.start;
    Err(CpError::Mismatch(format!("the crc of {} slice(s) differs between reads (first at byte {at})", bad.len())))
}
