//! End-to-end verification: digests of what was read or written, compared with what the
//! store reports, or else with a second, independent read of the object.
//!
//! - GCS keeps an MD5 (`md5Hash`) for objects uploaded in one request (and the emulator
//!   for composed ones too): compare the MD5 of the whole content.
//! - S3's ETag is the MD5 of the content for a single-request upload, and
//!   `md5(md5(part 1) ‖ … ‖ md5(part N))-N` for a multipart upload: compare whichever it is
//!   (for downloads the part size must be guessed from N; a wrong guess is not an error,
//!   it falls back to re-reading).
//! - Otherwise (local fs, memory, encrypted S3 objects, composed GCS objects): read the
//!   object again, ranged and in parallel, and compare the crc32c of every range.
//!
//! A mismatch is never a success: the caller retries, then fails.

use std::ops::Range;
use std::sync::Arc;

use bucketfs_store::ObjectDigests;
use md5::{Digest, Md5};

use super::endpoint::Kind;
use super::{retry, Ctx};
use bucketfs_store::Store;

/// Digests of one range of the content, computed as it passed through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceSum {
    pub range: Range<u64>,
    pub crc: u32,
    pub md5: Option<[u8; 16]>,
}

impl SliceSum {
    pub fn of(range: Range<u64>, data: &[u8], with_md5: bool) -> Self {
        Self { range, crc: crc32c::crc32c(data), md5: with_md5.then(|| Md5::digest(data).into()) }
    }

    /// [`SliceSum::of`] the concatenation of `chunks`.
    pub fn of_chunks(range: Range<u64>, chunks: &[bytes::Bytes], with_md5: bool) -> Self {
        let crc = chunks.iter().fold(0, |c, b| crc32c::crc32c_append(c, b));
        let md5 = with_md5.then(|| {
            let mut h = Md5::new();
            chunks.iter().for_each(|b| h.update(b));
            h.finalize().into()
        });
        Self { range, crc, md5 }
    }
}

/// The crc32c of the whole content from the per-range ones (in order).
pub fn combined_crc(sums: &[SliceSum]) -> u32 {
    sums.iter().fold(0, |acc, s| crc32c::crc32c_combine(acc, s.crc, (s.range.end - s.range.start) as usize))
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

/// What a store's digests let us check, decided before reading so that the right
/// digests get computed on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// The MD5 of the whole content.
    WholeMd5([u8; 16]),
    /// An S3 multipart ETag `hex-N`.
    Composite { etag: String, parts: u64 },
    /// Nothing usable: verify by re-reading.
    Reread,
}

pub fn expect(kind: Kind, d: &ObjectDigests) -> Expect {
    if let Some(md5) = d.md5 {
        return Expect::WholeMd5(md5);
    }
    let Some(etag) = d.etag.as_deref().filter(|_| kind == Kind::S3) else {
        return Expect::Reread;
    };
    let is_hex = |s: &str| s.len() == 32 && s.bytes().all(|c| c.is_ascii_hexdigit());
    if is_hex(etag) {
        let mut md5 = [0u8; 16];
        for (i, b) in md5.iter_mut().enumerate() {
            *b = u8::from_str_radix(&etag[2 * i..2 * i + 2], 16).unwrap_or_default();
        }
        return Expect::WholeMd5(md5);
    }
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
/// An S3 upload whose every request's crc32c the server checked and confirmed.
pub const BY_S3_CRC32C: &str = "s3-crc32c";

/// The outcome of comparing with the store's digests.
#[derive(Debug, PartialEq, Eq)]
pub enum Check {
    Ok(&'static str),
    /// The store's digest says the content differs.
    Mismatch(String),
    /// Nothing to compare with (or a guessed part size was wrong): re-read.
    Reread,
}

/// Compare the digests of what passed through (`sums`, `whole_md5`) with `expect`.
/// `guessed`: the part size of a composite ETag was guessed, so a mismatch is not proof.
pub fn check(expect: &Expect, sums: &[SliceSum], whole_md5: Option<[u8; 16]>, guessed: bool) -> Check {
    match expect {
        Expect::WholeMd5(want) => match whole_md5 {
            Some(got) if got == *want => Check::Ok(BY_MD5),
            Some(got) => Check::Mismatch(format!("MD5 {} but the store has {}", hex(&got), hex(want))),
            None => Check::Reread,
        },
        Expect::Composite { etag, parts } => match composite_etag(sums) {
            Some(got) if got == *etag => Check::Ok(BY_ETAG),
            Some(_) if guessed || sums.len() as u64 != *parts => Check::Reread,
            Some(got) => Check::Mismatch(format!("multipart ETag {got} but the store has {etag}")),
            None => Check::Reread,
        },
        Expect::Reread => Check::Reread,
    }
}

/// Read `sums`' ranges of `key` again (in parallel) and return the indices whose crc32c
/// differs from the recorded one.
pub async fn reread(
    ctx: &Ctx,
    store: &Arc<dyn Store>,
    key: &str,
    sums: &[SliceSum],
    if_match: Option<&str>,
) -> Result<Vec<usize>, String> {
    use futures::StreamExt;
    let results: Vec<Result<Option<usize>, String>> = futures::stream::iter(sums.iter().enumerate())
        .map(|(i, s)| async move {
            let _slot = ctx.slot().await;
            let data = retry(ctx, "verify read", key, || store.get_range(key, s.range.clone(), if_match)).await?;
            let crc = tokio::task::spawn_blocking(move || crc32c::crc32c(&data)).await.map_err(|e| e.to_string())?;
            ctx.progress.verified(s.range.end - s.range.start);
            Ok((crc != s.crc).then_some(i))
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
