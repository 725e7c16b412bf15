//! End-to-end verification: digests of what was read or written, compared with what the
//! store reports, or else with a second, independent read of the object.
//!
//! - S3 keeps an additional checksum for objects uploaded with one (boto3 and the aws cli
//!   send crc32 by default, `bucketfs cp` crc32c), which HEAD reports when asked
//!   (`x-amz-checksum-mode`, see the store's `s3::checksum_mode`). A crc32c or crc32 is
//!   checked first, as the cheapest: FULL_OBJECT, the crc of the whole content (the
//!   per-slice crcs combined); COMPOSITE `-N`, the crc of the N parts' big-endian crcs, so
//!   the bytes must be cut into the parts. The part size is the first part's, which a
//!   HEAD of `?partNumber=1` tells (`ObjectHead::first_part`); where the store did not tell
//!   it, a download keeps the crc of every block ([`BlockSpec`]: 1 MiB, absolute offsets)
//!   and tries every part size of whole blocks that gives N parts. A checksum that no part
//!   size tried rebuilds is a mismatch (re-reading would only read the same bytes). Only
//!   where no such part size exists is it settled by re-reading. crc32c is computed
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
    /// For a COMPOSITE checksum: the crcs (of its algorithm) of the slice's pieces cut at
    /// multiples of the [`BlockSpec`]'s size, in order; empty otherwise.
    pub blocks: Vec<u32>,
}

impl SliceSum {
    pub fn of(range: Range<u64>, data: &[u8], with_md5: bool) -> Self {
        let (crc, md5) = (Some(crc32c::crc32c(data)), with_md5.then(|| Md5::digest(data).into()));
        Self { range, crc, md5, crc32: None, blocks: Vec::new() }
    }

    /// The sum of the concatenation of `chunks`: its crc32c only `with_crc32c`, its crc32
    /// only `with_crc32`, its blocks' crcs with `blocks`.
    pub fn of_chunks(
        range: Range<u64>,
        chunks: &[bytes::Bytes],
        with_md5: bool,
        with_crc32c: bool,
        with_crc32: bool,
        blocks: Option<BlockSpec>,
    ) -> Self {
        let mut crcs = Crcs::new(with_crc32c, with_crc32).with_blocks(blocks, range.start);
        chunks.iter().for_each(|b| crcs.update(b));
        let (crc, crc32, blocks) = crcs.take();
        let md5 = with_md5.then(|| {
            let mut h = Md5::new();
            chunks.iter().for_each(|b| h.update(b));
            h.finalize().into()
        });
        Self { range, crc, md5, crc32, blocks }
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

/// A slice's crc32c and crc32, each where wanted, summed piece by piece as its bytes go by;
/// with a [`BlockSpec`], its blocks' crcs too (and the slice's crc of that algorithm is
/// then combined from them: each byte is summed once).
pub struct Crcs {
    crc: Option<u32>,
    crc32: Option<crc32fast::Hasher>,
    blocks: Option<Blocks>,
}

/// The block crcs [`Crcs`] keeps: `pos` is the absolute offset of the next byte.
struct Blocks {
    spec: BlockSpec,
    pos: u64,
    /// The block being summed, and its length so far.
    cur: (u32, u64),
    /// The slice's finished pieces, and their crcs combined.
    done: Vec<u32>,
    slice: u32,
}

impl Crcs {
    pub fn new(crc32c: bool, crc32: bool) -> Self {
        Self { crc: crc32c.then_some(0), crc32: crc32.then(crc32fast::Hasher::new), blocks: None }
    }

    /// Keep the crcs of `spec`'s blocks too, for bytes that start at offset `at`.
    pub fn with_blocks(mut self, spec: Option<BlockSpec>, at: u64) -> Self {
        self.blocks = spec.map(|spec| Blocks { spec, pos: at, cur: (0, 0), done: Vec::new(), slice: 0 });
        self
    }

    pub fn update(&mut self, b: &[u8]) {
        let by_blocks = self.blocks.as_ref().map(|k| k.spec.algo);
        if let Some(k) = self.blocks.as_mut() {
            let mut rest = b;
            while !rest.is_empty() {
                let room = k.spec.size - k.pos % k.spec.size;
                let (piece, tail) = rest.split_at(rest.len().min(usize::try_from(room).unwrap_or(usize::MAX)));
                k.cur = (k.spec.algo.append(k.cur.0, piece), k.cur.1 + piece.len() as u64);
                k.pos += piece.len() as u64;
                if k.pos % k.spec.size == 0 {
                    k.finish_piece();
                }
                rest = tail;
            }
        }
        if let Some(c) = self.crc.as_mut().filter(|_| by_blocks != Some(Crc::Crc32c)) {
            *c = crc32c::crc32c_append(*c, b);
        }
        if let Some(h) = self.crc32.as_mut().filter(|_| by_blocks != Some(Crc::Crc32)) {
            h.update(b);
        }
    }

    /// The finished slice's (crc32c, crc32, block crcs); starts the next slice.
    pub fn take(&mut self) -> (Option<u32>, Option<u32>, Vec<u32>) {
        let mut crc = self.crc;
        self.crc = crc.map(|_| 0);
        let mut crc32 = self.crc32.as_mut().map(|h| std::mem::take(h).finalize());
        let Some(k) = self.blocks.as_mut() else { return (crc, crc32, Vec::new()) };
        k.finish_piece();
        let whole = std::mem::take(&mut k.slice);
        match k.spec.algo {
            Crc::Crc32c => crc = crc.map(|_| whole),
            Crc::Crc32 => crc32 = crc32.map(|_| whole),
        }
        (crc, crc32, std::mem::take(&mut k.done))
    }
}

impl Blocks {
    fn finish_piece(&mut self) {
        let (c, len) = std::mem::take(&mut self.cur);
        if len > 0 {
            self.slice = self.spec.algo.cat(self.slice, c, len);
            self.done.push(c);
        }
    }
}

/// Which block crcs a read keeps for a COMPOSITE checksum: of its algorithm, per `size`
/// bytes at absolute offsets (multiples of `size` are the part sizes then tried).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSpec {
    pub algo: Crc,
    pub size: u64,
}

/// The block size: 1 MiB (S3 tools upload in parts of whole MiB: bucketfs cp, the aws cli
/// and boto3, rclone, mc, s3cmd), or the slice where reads are cut finer (tests).
pub const BLOCK: u64 = 1 << 20;

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
    /// `crc` (of some bytes) extended by `data`.
    fn append(self, crc: u32, data: &[u8]) -> u32 {
        match self {
            Crc::Crc32 => {
                let mut h = crc32fast::Hasher::new_with_initial(crc);
                h.update(data);
                h.finalize()
            }
            Crc::Crc32c => crc32c::crc32c_append(crc, data),
        }
    }

    /// The crc of A‖B from A's crc `a` and B's crc `b` and length.
    fn cat(self, a: u32, b: u32, len_b: u64) -> u32 {
        match self {
            Crc::Crc32 => {
                let mut h = crc32fast::Hasher::new_with_initial(a);
                h.combine(&crc32fast::Hasher::new_with_initial_len(b, len_b));
                h.finalize()
            }
            Crc::Crc32c => crc32c::crc32c_combine(a, b, len_b as usize),
        }
    }

    /// The slice's crc of this kind, if it was computed.
    fn of_slice(self, s: &SliceSum) -> Option<u32> {
        match self {
            Crc::Crc32 => s.crc32,
            Crc::Crc32c => s.crc,
        }
    }

    /// How a download that matched it was verified.
    fn by(self) -> &'static str {
        match self {
            Crc::Crc32 => BY_S3_CRC32,
            Crc::Crc32c => BY_S3_CRC32C,
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

    /// The block crcs a read of `slice`-byte slices keeps: for a COMPOSITE checksum of
    /// more than one part, cut at the part size the store `told` ([`told_part_size`]), or
    /// else in blocks whose multiples are the part sizes tried.
    pub fn blocks(&self, slice: u64, told: Option<u64>) -> Option<BlockSpec> {
        match self {
            Expect::Crc { algo, parts: Some(n), .. } if *n > 1 => {
                Some(BlockSpec { algo: *algo, size: told.unwrap_or(BLOCK.min(slice)).max(1) })
            }
            _ => None,
        }
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
    // A FULL_OBJECT value is the whole content's crc, even if a store tags it `-N`.
    let parts = c.parts.filter(|_| c.kind.as_deref() != Some("FULL_OBJECT"));
    Some(Expect::Crc { algo, crc, parts })
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
    match bucketfs_store::multipart_etag_parts(etag) {
        Some(parts) => Expect::Composite { etag: etag.to_ascii_lowercase(), parts },
        None => Expect::Reread,
    }
}

/// The part size of an N-part S3 object as its HEAD told it (its first part's), if that
/// gives N parts of its size.
pub fn told_part_size(d: &ObjectHead, parts: u64) -> Option<u64> {
    d.first_part.filter(|&p| p > 0 && d.meta.size.div_ceil(p) == parts)
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
    /// Nothing to compare with, or a difference that proves nothing (an ETag, a COMPOSITE
    /// checksum with no part size to try): re-read.
    Reread,
}

/// Compare the digests of what passed through (`sums`, `whole_md5`) with `expect`.
/// `blocks`: what the sums' block crcs are (see [`Expect::blocks`]); a COMPOSITE checksum
/// is then tried in every part size of whole blocks, else only in the slices as the parts.
pub fn check(expect: &Expect, sums: &[SliceSum], whole_md5: Option<[u8; 16]>, blocks: Option<BlockSpec>) -> Check {
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
        Expect::Crc { algo, crc, parts: None } => {
            let got = match algo {
                Crc::Crc32c => combined_crc(sums),
                Crc::Crc32 => combined_crc32(sums),
            };
            match got {
                Some(got) if got == *crc => Check::Ok(algo.by()),
                Some(got) => Check::Mismatch(format!("{} {got:08x} but the store has {crc:08x}", algo.name())),
                None => Check::Reread,
            }
        }
        Expect::Crc { algo, crc, parts: Some(n) } => match composite_crc(*algo, *crc, *n, sums, blocks) {
            Some(true) => Check::Ok(algo.by()),
            Some(false) => Check::Mismatch(format!(
                "no part size rebuilds the store's COMPOSITE {} {crc:08x}-{n} from the bytes read{}",
                algo.name(),
                match blocks {
                    Some(b) => format!(" (tried every multiple of {} bytes that gives {n} parts)", b.size),
                    None => String::new(),
                }
            )),
            None => Check::Reread,
        },
        Expect::Reread => Check::Reread,
    }
}

/// Whether `sums` rebuild the COMPOSITE crc `want` of `n` parts (S3's crc of the parts'
/// big-endian crcs): cut as the slices, or (from the block crcs) into parts of any multiple
/// of the block size that gives `n` parts. A match proves the bytes right; none proves them
/// wrong for every part size tried. `None`: no part size could be tried.
fn composite_crc(algo: Crc, want: u32, n: u64, sums: &[SliceSum], blocks: Option<BlockSpec>) -> Option<bool> {
    let rebuild =
        |parts: &mut dyn Iterator<Item = u32>| parts.fold(0, |acc, c| algo.append(acc, &c.to_be_bytes())) == want;
    if n == 1 {
        // The one part is the whole content, whatever its size.
        let whole = match algo {
            Crc::Crc32c => combined_crc(sums),
            Crc::Crc32 => combined_crc32(sums),
        };
        return Some(rebuild(&mut std::iter::once(whole?)));
    }
    let mut tried = false;
    if sums.len() as u64 == n {
        if let Some(crcs) = sums.iter().map(|s| algo.of_slice(s)).collect::<Option<Vec<u32>>>() {
            if rebuild(&mut crcs.into_iter()) {
                return Some(true);
            }
            tried = true;
        }
    }
    let Some(spec) = blocks.filter(|b| b.algo == algo && !sums.is_empty()) else { return tried.then_some(false) };
    // The crc of every prefix that ends at a piece's end: [0, at).
    let mut prefix: Vec<(u64, u32)> = vec![(0, 0)];
    for s in sums {
        let cuts = pieces(s.range.clone(), spec.size);
        if cuts.len() != s.blocks.len() {
            return tried.then_some(false); // this slice kept no block crcs
        }
        for (r, &c) in cuts.iter().zip(&s.blocks) {
            let last = prefix.last().expect("never empty").1;
            prefix.push((r.end, algo.cat(last, c, r.end - r.start)));
        }
    }
    let at = |off: u64| prefix.binary_search_by_key(&off, |p| p.0).ok().map(|i| prefix[i].1);
    // crc([a, b)) from the prefixes: crc([0, b)) = cat(crc([0, a)), crc([a, b)), b - a), and
    // cat is linear: cat(x, y, l) = cat(x, 0, l) ^ y.
    let part = |a: u64, b: u64| Some(at(b)? ^ algo.cat(at(a)?, 0, b - a));
    let size = sums.last().map_or(0, |s| s.range.end);
    // Part sizes q that give n parts: (n - 1) q < size <= n q; S3's parts are at most 5 GiB.
    let lo = size.div_ceil(n).div_ceil(spec.size) * spec.size;
    let hi = (size.saturating_sub(1) / (n - 1)).min(5 << 30);
    for q in (lo.max(spec.size)..=hi).step_by(usize::try_from(spec.size).unwrap_or(usize::MAX)) {
        let crcs: Option<Vec<u32>> = (0..n).map(|k| part(k * q, ((k + 1) * q).min(size))).collect();
        let Some(crcs) = crcs else { continue };
        if rebuild(&mut crcs.into_iter()) {
            return Some(true);
        }
        tried = true;
    }
    tried.then_some(false)
}

/// `range` cut at the multiples of `block`.
pub fn pieces(range: Range<u64>, block: u64) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    let mut at = range.start;
    while at < range.end {
        let end = ((at / block + 1) * block).min(range.end);
        out.push(at..end);
        at = end;
    }
    out
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
