//! Uploads that send only what changed ([`crate::Store::patch`]).
//!
//! A new version of an object is described by the ranges it shares with the current version
//! (same bytes at the same offsets) and a source for the rest. The store then assembles it
//! without the shared bytes leaving it:
//!
//! - **S3 and S3-compatible stores**: one multipart upload whose parts are `UploadPartCopy`
//!   of the current object's kept ranges (pinned with `x-amz-copy-source-if-match`) and
//!   uploads of the rest, completed with `If-Match` on the current ETag. Every part but the
//!   last must be at least 5 MiB, so [`plan_parts`] widens small changes and sends small
//!   kept ranges. Until the completion the object is untouched; an abandoned upload leaves
//!   no object (its parts are aborted, or expire by the bucket's lifecycle rule).
//! - **GCS**: appends only. The tail goes up as a temporary object under
//!   [`PARTS_PREFIX`], and one `compose` of the current generation and the tail into the
//!   key itself, with `ifGenerationMatch` on the current generation, makes the new version
//!   (OpenDAL refuses a compose whose destination is one of its sources: see
//!   [`crate::gcs::in_place`]). The tail is deleted in the background. A composite object
//!   has at most 1,024 components: past [`MAX_PIECES`] the caller uploads whole.
//!
//! An upload cancelled mid-way (its future dropped) cleans up in the store's background
//! work: the multipart upload is aborted ([`crate::detached`]), the tail deleted
//! ([`crate::background::Guard`]).
//!
//! Both go through OpenDAL's public API: its `Writer::copy_from` is `UploadPartCopy`, its
//! `compose_with` takes source generations and destination preconditions.

use std::ops::Range;

use bytes::Bytes;
use opendal::Operator;

use crate::gcs::compose::PARTS_PREFIX;
use crate::{ObjectMeta, Patch, StoreError, StoreErrorKind};

/// S3's smallest part that is not the last.
pub const MIN_PART: u64 = 5 * 1024 * 1024;
/// The largest `UploadPartCopy` sent (S3 takes up to 5 GiB): copies of this size run in
/// parallel (the writer's `concurrent`), where one 5 GiB copy would take the store alone.
const MAX_COPY: u64 = 128 * 1024 * 1024;
/// Components a composite object may have before the caller uploads whole (GCS allows
/// 1,024; the margin is for a tail that is itself composed of several parts).
pub const MAX_PIECES: u32 = 1000;
/// How long after a cancelled upload its temporary object is deleted once more (see [`gcs`]).
pub const LATE_LANDING: std::time::Duration = std::time::Duration::from_secs(1);

/// One part of a patched multipart upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Bytes of the current version, copied in the store.
    Copy(Range<u64>),
    /// Bytes read from the source and sent.
    Send(Range<u64>),
}

/// The parts of a multipart upload making a `len`-byte version from `kept` ranges of the
/// current one: every part but the last at least `min_part`, every copy at most 128 MiB.
/// A change between two kept ranges is widened into the next to reach `min_part`; a kept
/// range left shorter than that is sent instead.
pub fn plan_parts(len: u64, kept: &[Range<u64>], min_part: u64) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut send_from: Option<u64> = None; // an open Send run
    let mut at = 0;
    for k in kept.iter().filter(|k| k.start < k.end && k.end <= len) {
        let start = k.start.max(at);
        if start >= k.end {
            continue;
        }
        if start > at {
            send_from.get_or_insert(at);
        }
        // The pending send must reach min_part before a copy may follow it.
        let copy_from = match send_from {
            Some(s) => start.max(s + min_part),
            None => start,
        };
        // A copy shorter than min_part is a part too small (OpenDAL would download it to
        // send it, even as the last part): send it from the source instead.
        if copy_from >= k.end || k.end - copy_from < min_part {
            send_from.get_or_insert(start.min(at));
            at = k.end;
            continue;
        }
        if let Some(s) = send_from.take() {
            steps.push(Step::Send(s..copy_from));
        }
        let mut c = copy_from;
        while c < k.end {
            // Pieces of at most MAX_COPY, none shorter than min_part.
            let mut end = (c + MAX_COPY).min(k.end);
            if k.end - end > 0 && k.end - end < min_part {
                end = k.end - min_part;
            }
            steps.push(Step::Copy(c..end));
            c = end;
        }
        at = k.end;
    }
    if at < len {
        send_from.get_or_insert(at);
    }
    if let Some(s) = send_from {
        if s < len {
            steps.push(Step::Send(s..len));
        }
    }
    steps
}

/// Bytes copied and sent by `steps`.
pub fn totals(steps: &[Step]) -> (u64, u64) {
    steps.iter().fold((0, 0), |(c, s), st| match st {
        Step::Copy(r) => (c + r.end - r.start, s),
        Step::Send(r) => (c, s + r.end - r.start),
    })
}

fn unsupported(key: &str, why: &str) -> StoreError {
    StoreError::new(StoreErrorKind::Unsupported, format!("patch {key:?}: {why}"))
}

fn source_err(key: &str, e: std::io::Error) -> StoreError {
    StoreError::new(StoreErrorKind::Other, format!("patch {key:?}: reading the new bytes: {e}"))
}

/// The request's settings that [`s3`] and [`gcs`] share with the store's other uploads.
pub struct Target<'a> {
    pub key: &'a str,
    /// What the new version stores beside its bytes, as a whole upload would.
    pub headers: crate::headers::Headers,
    pub part_size: u64,
    pub concurrency: usize,
    /// GCS: tries after the first of an append's compose cut off (`crate::retry`).
    pub retries: usize,
}

/// S3: a multipart upload of copies and new parts (see the module doc).
pub async fn s3(
    op: &Operator,
    t: &Target<'_>,
    p: &Patch<'_>,
    background: &crate::background::Background,
) -> Result<(ObjectMeta, u64, u64), StoreError> {
    let key = t.key;
    let steps = plan_parts(p.len, p.kept, MIN_PART);
    let (copied, sent) = totals(&steps);
    if copied == 0 {
        return Err(unsupported(key, "nothing to keep"));
    }
    // No `chunk`: each write of at least 5 MiB is one part as given, and a copy is one part.
    let req = crate::apply_headers!(op.writer_with(key).concurrent(t.concurrency.max(1)).if_match(p.base), &t.headers);
    let err = |what: &'static str| move |e: opendal::Error| StoreError::from_opendal(what, key, e);
    // Cancelled mid-way, the multipart upload is aborted in the background (its parts
    // would stay in the bucket, unseen, until a lifecycle rule expires them).
    let w = req.await.map_err(err("patch"))?;
    let mut w = crate::detached::DetachedWriter::new(w, key, background);
    let run = async {
        for step in &steps {
            match step {
                Step::Copy(r) => {
                    let opts = opendal::options::ReadOptions {
                        range: (r.start..r.end).into(),
                        if_match: Some(p.base.to_string()),
                        ..Default::default()
                    };
                    w.copy_from(key, opts).await.map_err(err("patch (copy)"))?;
                }
                Step::Send(r) => {
                    for piece in pieces(r.clone(), t.part_size.max(MIN_PART)) {
                        let data = read_piece(p.source, key, piece)?;
                        w.write(data).await.map_err(err("patch (upload)"))?;
                    }
                }
            }
        }
        w.close().await.map_err(err("patch (complete)"))
    };
    match run.await {
        Ok(m) => Ok((meta_of(key, &m, false), sent, copied)),
        Err(e) => {
            let _ = w.abort().await;
            Err(e)
        }
    }
}

/// Bytes `r` of the new version from `source`, all of them (a short read is an error).
pub(crate) fn read_piece(source: &dyn crate::PatchSource, key: &str, r: Range<u64>) -> Result<Bytes, StoreError> {
    let n = (r.end - r.start) as usize;
    let data = source.read_at(r.start, n).map_err(|e| source_err(key, e))?;
    if data.len() != n {
        return Err(source_err(key, std::io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(data)
}

/// `r` in pieces of `part` bytes, the last one merged into the one before if it would be
/// shorter than [`MIN_PART`] (so a piece before a copy always fills a part).
fn pieces(r: Range<u64>, part: u64) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    let mut at = r.start;
    while at < r.end {
        let end = (at + part).min(r.end);
        match out.last_mut() {
            Some(last) if end - at < MIN_PART => last.end = end,
            _ => out.push(at..end),
        }
        at = end;
    }
    out
}

/// GCS: the tail as a temporary object, composed after the current generation into the
/// key itself (see the module doc). `upload` stores the tail under the given temporary key
/// and returns how many pieces it is made of. The tail is deleted in `background`: the
/// append is done (and durable) when the compose answers.
pub async fn gcs<F, Fut>(
    compose_op: &Operator,
    t: &Target<'_>,
    p: &Patch<'_>,
    upload: F,
    background: &crate::background::Background,
) -> Result<(ObjectMeta, u64, Option<u32>), StoreError>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<u32, StoreError>>,
{
    let key = t.key;
    let appends = p.kept.len() == 1 && p.kept[0] == (0..p.base_len) && p.base_len > 0 && p.len > p.base_len;
    if !appends {
        return Err(unsupported(key, "GCS composes appends only"));
    }
    if p.base_pieces.is_some_and(|n| n >= MAX_PIECES) {
        return Err(unsupported(key, "the object has too many components to compose again"));
    }
    let tail = format!("{PARTS_PREFIX}{}/tail", crate::gcs::compose::upload_id());
    // Cancelled mid-way, the tail is deleted in the background, and again a moment later:
    // a request cut off after it was sent may still be stored after the first delete.
    let guard =
        crate::background::Guard::new((compose_op.clone(), tail.clone()), background, |(op, tail)| async move {
            for wait in [std::time::Duration::ZERO, LATE_LANDING] {
                tokio::time::sleep(wait).await;
                if let Err(e) = op.delete(&tail).await {
                    tracing::warn!(key = %tail, "the temporary object of a cancelled append is left: {e}");
                    return;
                }
            }
        });
    let result = async {
        // GCS refuses the compose below when the generation moved; fake-gcs-server ignores
        // both the source generation and `ifGenerationMatch`, so ask as well (while the
        // tail goes up: one round trip for both).
        let (now, tail_pieces) = futures::join!(compose_op.stat(key), upload(tail.clone()));
        let now = now.map_err(|e| StoreError::from_opendal("patch", key, e))?;
        let tail_pieces = tail_pieces?;
        if now.version() != Some(p.base) {
            return Err(StoreError::new(StoreErrorKind::Changed, format!("patch {key:?}: the object changed")));
        }
        let base = opendal::options::ComposeSourceOptions { version: Some(p.base.to_string()), ..Default::default() };
        let into = crate::gcs::in_place::in_place(key);
        // OpenDAL's RetryLayer never sends a compose again: one cut connection failed the
        // append. Sent again here, each time only while the key still holds the base
        // generation (asked after the backoff): GCS refuses a second append by
        // `ifGenerationMatch` anyway, but fake-gcs-server ignores it and would append the
        // tail twice. A moved generation is `Changed` (a try that landed unanswered, or
        // another writer): the caller then uploads the whole file (`write_patch`).
        let m = crate::retry::again(t.retries, "patch (compose)", key, |n| {
            let sources = [(key.to_string(), base.clone()), (tail.clone(), Default::default())];
            let req =
                crate::apply_headers!(compose_op.compose_with(sources, &into).if_version_match(p.base), &t.headers);
            let req = std::future::IntoFuture::into_future(req);
            async move {
                if n > 0 && compose_op.stat(key).await?.version() != Some(p.base) {
                    let moved = "the object changed while its append was cut off";
                    return Err(opendal::Error::new(opendal::ErrorKind::ConditionNotMatch, moved));
                }
                crate::gcs::in_place::composing_in_place(req).await
            }
        })
        .await
        .map_err(|e| StoreError::from_opendal("patch (compose)", key, e))?;
        Ok((meta_of(key, &m, true), p.base_pieces.map(|n| n + tail_pieces)))
    }
    .await;
    // One that fails is left for the next mount's clean-up (`Store::clean_parts`).
    let (op, tail) = guard.disarm();
    background.spawn(async move {
        if let Err(e) = op.delete(&tail).await {
            tracing::warn!(key = %tail, "the temporary object of an append is left: {e}");
        }
    });
    let (meta, pieces) = result?;
    Ok((meta, p.len - p.base_len, pieces))
}

/// The new version's metadata from the completing response (identity from it alone).
fn meta_of(key: &str, m: &opendal::Metadata, generation: bool) -> ObjectMeta {
    let etag = if generation { m.version() } else { m.etag().or(m.version()) };
    ObjectMeta {
        key: key.to_string(),
        size: m.content_length(),
        etag: etag.map(str::to_string),
        mtime: m.last_modified().map(Into::into),
        size_unknown: false,
    }
}

/// The bytes a patch sends when a store builds the new version itself (the memory double):
/// `base` with the kept ranges kept and the rest read from `source`.
pub fn assemble(base: &Bytes, p: &Patch<'_>) -> std::io::Result<Bytes> {
    let mut out = vec![0u8; p.len as usize];
    let mut at = 0u64;
    let fill = |from: u64, to: u64, out: &mut Vec<u8>| -> std::io::Result<()> {
        if to > from {
            let d = p.source.read_at(from, (to - from) as usize)?;
            out[from as usize..to as usize].copy_from_slice(&d);
        }
        Ok(())
    };
    for k in p.kept {
        fill(at, k.start, &mut out)?;
        out[k.start as usize..k.end as usize].copy_from_slice(&base[k.start as usize..k.end as usize]);
        at = k.end;
    }
    fill(at, p.len, &mut out)?;
    Ok(out.into())
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // one kept range is the usual patch
mod tests {
    use super::*;

    const M: u64 = 1024 * 1024;

    /// Every part but the last is at least 5 MiB, the steps tile 0..len, and every copy
    /// lies in a kept range.
    fn check(len: u64, kept: &[Range<u64>], steps: &[Step]) {
        let mut at = 0;
        for (i, s) in steps.iter().enumerate() {
            let r = match s {
                Step::Copy(r) => {
                    assert!(kept.iter().any(|k| k.start <= r.start && r.end <= k.end), "{s:?} not kept");
                    r
                }
                Step::Send(r) => r,
            };
            assert_eq!(r.start, at, "{steps:?}");
            assert!(r.end > r.start);
            if i + 1 < steps.len() {
                assert!(r.end - r.start >= MIN_PART, "{steps:?}");
            }
            at = r.end;
        }
        assert_eq!(at, len, "{steps:?}");
    }

    #[test]
    fn an_append_copies_the_old_object_and_sends_the_tail() {
        let steps = plan_parts(64 * M + 16384, &[0..64 * M], MIN_PART);
        assert_eq!(steps, vec![Step::Copy(0..64 * M), Step::Send(64 * M..64 * M + 16384)]);
    }

    #[test]
    fn a_small_edit_is_widened_to_a_part() {
        let len = 256 * M;
        let kept = [0..128 * M, 128 * M + 1..len];
        let steps = plan_parts(len, &kept, MIN_PART);
        check(len, &kept, &steps);
        assert_eq!(totals(&steps).1, MIN_PART);
        // At the very end: the tail is sent as the last part, however short.
        let kept = [0..len - 1];
        let steps = plan_parts(len, &kept, MIN_PART);
        check(len, &kept, &steps);
        assert_eq!(steps.last(), Some(&Step::Send(len - 1..len)));
        assert_eq!(totals(&steps), (len - 1, 1));
    }

    #[test]
    fn kept_ranges_too_short_for_a_part_are_sent() {
        let len = 20 * M;
        let kept = [0..3 * M, 4 * M..6 * M, 7 * M..20 * M];
        let steps = plan_parts(len, &kept, MIN_PART);
        check(len, &kept, &steps);
        assert_eq!(steps, vec![Step::Send(0..7 * M), Step::Copy(7 * M..20 * M)]);
        // A truncation keeps a prefix: one copy.
        assert_eq!(plan_parts(10 * M, &[0..10 * M], MIN_PART), vec![Step::Copy(0..10 * M)]);
        assert_eq!(plan_parts(3 * M, &[0..3 * M], MIN_PART), vec![Step::Send(0..3 * M)]);
        assert_eq!(plan_parts(8 * M, &[], MIN_PART), vec![Step::Send(0..8 * M)]);
    }

    #[test]
    fn long_copies_are_split_into_parts() {
        let len = 12 * 1024 * M;
        let steps = plan_parts(len, &[0..len - M], MIN_PART);
        check(len, &[0..len - M], &steps);
        assert!(steps.iter().all(|s| !matches!(s, Step::Copy(r) if r.end - r.start > MAX_COPY)));
    }

    #[test]
    fn random_layouts_keep_the_part_rules() {
        let mut seed = 7u64;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for _ in 0..2000 {
            let len = next(64) * M + next(M);
            let mut kept = Vec::new();
            let mut at = 0;
            while at < len {
                let a = at + next(8) * M + next(3);
                let b = (a + next(16) * M + next(5)).min(len);
                if a < b {
                    kept.push(a..b);
                }
                at = b + 1 + next(2 * M);
            }
            let steps = plan_parts(len, &kept, MIN_PART);
            check(len, &kept, &steps);
        }
    }

    #[test]
    fn pieces_never_leave_a_short_one_before_a_copy() {
        assert_eq!(pieces(0..9 * M, 8 * M), vec![0..9 * M]);
        assert_eq!(pieces(0..14 * M, 8 * M), vec![0..8 * M, 8 * M..14 * M]);
        assert_eq!(pieces(0..3, 8 * M), vec![0..3]);
    }
}
