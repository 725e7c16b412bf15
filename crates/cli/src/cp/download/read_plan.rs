//! How one object is read: its size and identity (the ETag every ranged read must match),
//! the slice ranges (the uploader's part size where a per-part digest needs it), and which
//! digests each slice computes so the object's can be checked.

use super::super::endpoint::Remote;
use super::super::plan::{self, slices};
use super::super::verify::{self, BlockSpec, Expect};
use super::super::{retry, CpError, Ctx};
use bucketfs_store::{HeadOpts, ObjectHead};

/// How to read one object: its identity, size, ranges and what to verify against.
pub(super) struct ReadPlan {
    pub(super) size: u64,
    pub(super) if_match: Option<String>,
    pub(super) ranges: Vec<std::ops::Range<u64>>,
    pub(super) expect: Expect,
    /// For a COMPOSITE crc: the block crcs each slice keeps, so that every part size can
    /// be tried (see [`verify::check`]).
    pub(super) blocks: Option<BlockSpec>,
    pub(super) slice_md5: bool,
    /// Each slice's crc32 too (the object's S3 checksum is a crc32).
    pub(super) slice_crc32: bool,
    /// Each slice's crc32c: but for a crc32-verified download with no summary to report it.
    pub(super) slice_crc32c: bool,
}

/// Ask the store for what `head` does not already say: the object's size, identity and digests.
pub(in crate::cp) async fn head(ctx: &Ctx, src: &Remote, head: Option<&ObjectHead>) -> Result<ObjectHead, CpError> {
    match head {
        Some(d) => Ok(d.clone()),
        None => {
            retry(ctx, "head", &src.key, || src.store.head(&src.key, HeadOpts { digests: true, ..Default::default() }))
                .await
        }
    }
}

pub(super) async fn read_plan(ctx: &Ctx, src: &Remote, head: Option<&ObjectHead>) -> Result<ReadPlan, CpError> {
    let d = self::head(ctx, src, head).await?;
    let size = d.meta.size;
    let expect = verify::expect(src.kind, &d);
    let mut tuning = plan::tuning(Some(size), ctx.slice, Some(ctx.parallel));
    let told = expect.parts().and_then(|n| verify::told_part_size(&d, n));
    if let (Some(parts), None) = (expect.parts(), ctx.slice) {
        // Read in the uploader's parts so the per-slice MD5s or crcs rebuild its digest.
        let ours = plan::tuning(Some(size), None, None).slice.max(plan::MIN_S3_PART);
        if let Some(p) = told.or_else(|| verify::guess_part_size(size, parts, ours)) {
            tuning.slice = p;
        }
    }
    // Unless the store told the part size, a download only guesses it (or takes
    // --slice-size): a COMPOSITE crc is also tried in every other part size of whole blocks.
    let blocks = expect.blocks(tuning.slice, told);
    let slice_md5 = matches!(expect, Expect::Composite { .. });
    let slice_crc32 = expect.wants_crc32();
    let slice_crc32c = ctx.summary || !slice_crc32;
    let ranges = slices(size, tuning.slice);
    Ok(ReadPlan { size, if_match: d.meta.etag, ranges, expect, blocks, slice_md5, slice_crc32, slice_crc32c })
}
