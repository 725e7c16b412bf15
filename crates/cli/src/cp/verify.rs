//! End-to-end verification: digests of what was read or written, compared with what the
//! store reports, or else with a second, independent read of the object.
//!
//! - S3 keeps an additional checksum for objects uploaded with one (boto3 and the aws cli
//!   send crc32 by default, `bucketfs cp` crc32c), which HEAD reports when asked
//!   (`x-amz-checksum-mode`, see the store's `s3::checksum_mode`). A crc32c or crc32 is
//!   checked first, as the cheapest: FULL_OBJECT, the crc of the whole content (the
//!   per-slice crcs combined); COMPOSITE `-N`, the crc of the N parts' big-endian crcs, so
//!   the slices must be the parts (the part size is guessed as for the multipart ETag
//!   below; a wrong guess is not an error, it falls back to re-reading). crc32c is computed
//!   for every slice but where a crc32 checksum verifies a download to a file and no
//!   `--json` summary reports it (then a re-read compares crc32s); crc32 is computed only
//!   for a crc32 checksum. Other algorithms
//!   (crc64nvme, sha1, sha256) go on to the digests below.
//! - GCS keeps an MD5 (`md5Hash`) for objects uploaded in one request (and the emulator
//!   for composed ones too): compare the MD5 of the whole content.
//! - S3's ETag is the MD5 of the content for a single-request upload, and
//!   `md5(md5(part 1) ‖ … ‖ md5(part N))-N` for a multipart upload: compare whichever it is
//!   (for downloads the part size must be guessed from N; a wrong guess is not an error,
//!   it falls back to re-reading). An ETag is that MD5 only for objects stored plain or
//!   with SSE-S3; under SSE-KMS or SSE-C it is not, and HEAD does not say which, so an
//!   ETag that differs is settled by re-reading, never taken as a mismatch.
//! - Otherwise (local fs, memory, encrypted S3 objects, composed GCS objects): read the
//!   object again, ranged and in parallel, and compare the crc32c of every range.
//!
//! A mismatch is never a success: the caller retries, then fails.

use std::ops::Range;
use std::sync::Arc;

use bucketfs_store::{GetOpts, ObjectChecksum, ObjectHead, StoreExt};
use md5::{Digest, Md5};

use super::endpoint::Kind;
use super::{retry, CpError, Ctx};
use bucketfs_store::Store;

/// Digests of one range of the content, computed as it passed through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceSum {
    pub range: Range<u64>,
    /// crc32c: always, but for a download to a file verified by the object's crc32 with no
    /// `--json` summary to report it (a tenth of such a download's CPU and rate).
    pub crc: Option<u32>,
    pub md5: Option<[u8; 16]>,
    /// crc32 (IEEE), where the object's S3 checksum is one.
    pub crc32: Option<u32>,
}

impl SliceSum {
    pub fn of(range: Range<u64>, data: &[u8], with_md5: bool) -> Self {
        Self { range, crc: Some(crc32c::crc32c(data)), md5: with_md5.then(|| Md5::digest(data).into()), crc32: None }
    }

    /// The sum of the concatenation of `chunks`: its crc32c only `with_crc32c`, its crc32
    /// only `with_crc32`.
    pub fn of_chunks(
        range: Range<u64>,
        chunks: &[bytes::Bytes],
        with_md5: bool,
        with_crc32c: bool,
        with_crc32: bool,
    ) -> Self {
        let mut crcs = Crcs::new(with_crc32c, with_crc32);
        chunks.iter().for_each(|b| crcs.update(b));
        let (crc, crc32) = crcs.take();
        let md5 = with_md5.then(|| {
            let mut h = Md5::new();
            chunks.iter().for_each(|b| h.update(b));
            h.finalize().into()
        });
        Self { range, crc, md5, crc32 }
    }

    /// Whether `data` (this range read again) differs from what was recorded: by crc32c,
    /// or by crc32 where only that was computed.
    fn differs(&self, data: &[u8]) -> bool {
        match (self.crc, self.crc32) {
            (Some(c), _) => crc32c::crc32c(data) != c,
            (None, Some(c)) => crc32fast::hash(data) != c,
            (None, None) => true, // nothing to compare with: never taken as equal
        }
    }
}

/// A slice's crc32c and crc32, each where wanted, summed piece by piece as its bytes go by.
pub struct Crcs {
    crc: Option<u32>,
    crc32: Option<crc32fast::Hasher>,
}

impl Crcs {
    pub fn new(crc32c: bool, crc32: bool) -> Self {
        Self { crc: crc32c.then_some(0), crc32: crc32.then(crc32fast::Hasher::new) }
    }

    pub fn update(&mut self, b: &[u8]) {
        if let Some(c) = self.crc.as_mut() {
            *c = crc32c::crc32c_append(*c, b);
        }
        if let Some(h) = self.crc32.as_mut() {
            h.update(b);
        }
    }

    /// The finished slice's (crc32c, crc32); starts the next slice.
    pub fn take(&mut self) -> (Option<u32>, Option<u32>) {
        let crc = self.crc;
        self.crc = crc.map(|_| 0);
        (crc, self.crc32.as_mut().map(|h| std::mem::take(h).finalize()))
    }
}

/// The crc32c of the whole content from the per-range ones (in order), if every range has one.
pub fn combined_crc(sums: &[SliceSum]) -> Option<u32> {
    sums.iter().try_fold(0, |acc, s| Some(crc32c::crc32c_combine(acc, s.crc?, (s.range.end - s.range.start) as usize)))
}

/// The crc32 of the whole content from the per-range ones, if every range has one.
fn combined_crc32(sums: &[SliceSum]) -> Option<u32> {
    let mut whole = crc32fast::Hasher::new();
    for s in sums {
        whole.combine(&crc32fast::Hasher::new_with_initial_len(s.crc32?, s.range.end - s.range.start));
    }
    Some(whole.finalize())
}

/// S3's multipart ETag for these parts, if every part has its MD5.
pub fn composite_etag(sums: &[SliceSum]) -> Option<String> {
    let mut h = Md5::new();
    for s in sums {
        h.update(s.md5?);
    }
    Some(format!("{}-{}", hex(&h.finalize()), sums.len()))
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The two crcs of S3's additional checksums that `cp` checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crc {
    Crc32,
    Crc32c,
}

impl Crc {
    fn of(self, data: &[u8]) -> u32 {
        match self {
            Crc::Crc32 => crc32fast::hash(data),
            Crc::Crc32c => crc32c::crc32c(data),
        }
    }

    /// The slice's crc of this kind, if it was computed.
    fn of_slice(self, s: &SliceSum) -> Option<u32> {
        match self {
            Crc::Crc32 => s.crc32,
            Crc::Crc32c => s.crc,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Crc::Crc32 => "crc32",
            Crc::Crc32c => "crc32c",
        }
    }
}

/// What a store's digests let us check, decided before reading so that the right
/// digests get computed on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// S3's checksum of the object: the crc of the whole content, or with `parts` the
    /// COMPOSITE crc of that many parts' crcs.
    Crc { algo: Crc, crc: u32, parts: Option<u64> },
    /// The MD5 of the whole content: the store's own (GCS's `md5Hash`), or `etag` when it
    /// is an S3 ETag that looks like one. An ETag is an MD5 only for objects stored plain
    /// or with SSE-S3 (not SSE-KMS or SSE-C, which no HEAD here reveals), so a mismatch
    /// with an ETag is not proof: it is settled by re-reading.
    WholeMd5 { md5: [u8; 16], etag: bool },
    /// An S3 multipart ETag `hex-N`.
    Composite { etag: String, parts: u64 },
    /// Nothing usable: verify by re-reading.
    Reread,
}

impl Expect {
    /// The number of parts whose size has to be guessed, for a multipart ETag or COMPOSITE crc.
    pub fn parts(&self) -> Option<u64> {
        match self {
            Expect::Composite { parts, .. } | Expect::Crc { parts: Some(parts), .. } => Some(*parts),
            _ => None,
        }
    }

    /// Whether each slice needs its crc32 (IEEE).
    pub fn wants_crc32(&self) -> bool {
        matches!(self, Expect::Crc { algo: Crc::Crc32, .. })
    }
}

/// The S3 checksum `cp` can check, if the object has one.
fn crc_expect(c: &ObjectChecksum) -> Option<Expect> {
    let algo = match c.algorithm.as_str() {
        "crc32" => Crc::Crc32,
        "crc32c" => Crc::Crc32c,
        _ => return None,
    };
    let crc = u32::from_be_bytes(c.digest.as_slice().try_into().ok()?);
    // Without `-N` a COMPOSITE value's parts are unknown: not something to check against.
    if c.parts.is_none() && c.kind.as_deref() == Some("COMPOSITE") {
        return None;
    }
    Some(Expect::Crc { algo, crc, parts: c.parts })
}

pub fn expect(kind: Kind, d: &ObjectHead) -> Expect {
    if let Some(e) = d.checksum.as_ref().filter(|_| kind == Kind::S3).and_then(crc_expect) {
        return e;
    }
    if let Some(md5) = d.md5 {
        return Expect::WholeMd5 { md5, etag: false };
    }
    let Some(etag) = d.etag.as_deref().filter(|_| kind == Kind::S3) else {
        return Expect::Reread;
    };
    if let Some(md5) = bucketfs_store::parse_md5_hex(etag) {
        return Expect::WholeMd5 { md5, etag: true };
    }
    let is_hex = |s: &str| s.len() == 32 && s.bytes().all(|c| c.is_ascii_hexdigit());
    match etag.split_once('-') {
        Some((h, n)) if is_hex(h) => match n.parse::<u64>() {
            Ok(parts) if parts > 0 => Expect::Composite { etag: etag.to_ascii_lowercase(), parts },
            _ => Expect::Reread,
        },
        _ => Expect::Reread,
    }
}

/// For a download of an N-part S3 object: a part size that gives N parts, trying the one
/// `bucketfs cp` itself uploads with first. `None` if no usual size fits.
pub fn guess_part_size(size: u64, parts: u64, ours: u64) -> Option<u64> {
    const MIB: u64 = 1 << 20;
    // Common part sizes of S3 tools (aws cli 8 MiB, boto 8 MiB, rclone 5 MiB, others 16+ MiB).
    let candidates = [ours, 8 * MIB, 16 * MIB, 5 * MIB, 32 * MIB, 64 * MIB, 10 * MIB, 15 * MIB, 100 * MIB, 128 * MIB];
    candidates.into_iter().find(|&p| p > 0 && size.div_ceil(p) == parts)
}

/// How a transfer was verified, for the summary.
pub const BY_MD5: &str = "md5";
pub const BY_ETAG: &str = "s3-etag";
pub const BY_REREAD: &str = "reread-crc32c";
/// An S3 upload whose every request's crc32c the server checked and confirmed, or a
/// download that matched the object's S3 crc32c checksum.
pub const BY_S3_CRC32C: &str = "s3-crc32c";
/// A download that matched the object's S3 crc32 checksum.
pub const BY_S3_CRC32: &str = "s3-crc32";

/// The outcome of comparing with the store's digests.
#[derive(Debug, PartialEq, Eq)]
pub enum Check {
    Ok(&'static str),
    /// The store's digest says the content differs.
    Mismatch(String),
    /// Nothing to compare with, or a difference that proves nothing (an ETag, a guessed
    /// part size): re-read.
    Reread,
}

/// Compare the digests of what passed through (`sums`, `whole_md5`) with `expect`.
/// `guessed`: the part size of a COMPOSITE checksum was guessed, so a mismatch is not proof.
pub fn check(expect: &Expect, sums: &[SliceSum], whole_md5: Option<[u8; 16]>, guessed: bool) -> Check {
    match expect {
        Expect::WholeMd5 { md5: want, etag } => match whole_md5 {
            Some(got) if got == *want => Check::Ok(BY_MD5),
            Some(got) if !etag => Check::Mismatch(format!("MD5 {} but the store has {}", hex(&got), hex(want))),
            _ => Check::Reread,
        },
        // A multipart ETag that differs is no proof either (a guessed part size, an
        // encrypted object): re-read.
        Expect::Composite { etag, .. } => match composite_etag(sums) {
            Some(got) if got == *etag => Check::Ok(BY_ETAG),
            _ => Check::Reread,
        },
        Expect::Crc { algo, crc, parts } => {
            let got = match parts {
                None if *algo == Crc::Crc32c => combined_crc(sums),
                None => combined_crc32(sums),
                // COMPOSITE: the slices must be the parts.
                Some(n) if sums.len() as u64 != *n => None,
                Some(_) => {
                    let parts: Option<Vec<u8>> = sums
                        .iter()
                        .map(|s| algo.of_slice(s).map(u32::to_be_bytes))
                        .collect::<Option<Vec<_>>>()
                        .map(|v| v.concat());
                    parts.map(|p| algo.of(&p))
                }
            };
            match got {
                Some(got) if got == *crc => Check::Ok(if *algo == Crc::Crc32 { BY_S3_CRC32 } else { BY_S3_CRC32C }),
                Some(_) if guessed && parts.is_some() => Check::Reread,
                Some(got) => Check::Mismatch(format!("{} {got:08x} but the store has {crc:08x}", algo.name())),
                None => Check::Reread,
            }
        }
        Expect::Reread => Check::Reread,
    }
}

/// Read `sums`' ranges of `key` again (in parallel) and return the indices whose crc32c
/// (or crc32, where only that was recorded) differs from the recorded one.
pub async fn reread(
    ctx: &Ctx,
    store: &Arc<dyn Store>,
    key: &str,
    sums: &[SliceSum],
    if_match: Option<&str>,
) -> Result<Vec<usize>, CpError> {
    use futures::StreamExt;
    let results: Vec<Result<Option<usize>, CpError>> = futures::stream::iter(sums.iter().enumerate())
        .map(|(i, s)| async move {
            let _slot = ctx.slot().await;
            let data =
                retry(ctx, "verify read", key, || store.get_range(key, s.range.clone(), GetOpts { if_match })).await?;
            let sum = s.clone();
            let differs = tokio::task::spawn_blocking(move || sum.differs(&data)).await.map_err(|e| e.to_string())?;
            ctx.progress.verified(s.range.end - s.range.start);
            Ok(differs.then_some(i))
        })
        .buffer_unordered(ctx.parallel)
        .collect()
        .await;
    let mut bad = Vec::new();
    for r in results {
        if let Some(i) = r? {
            bad.push(i);
        }
    }
    bad.sort_unstable();
    Ok(bad)
}
