//! Unit tests of `cp` against the in-memory store: slicing math, round trips at the slice
//! boundaries, injected failures retried to a correct result, and mismatches detected;
//! store-to-store copies (streamed and server-side) likewise.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bucketfs_store::testing::{FailStore, MemStore, Op};
use bucketfs_store::{
    Capabilities, GetOpts, HeadOpts, ListStream, ObjectChecksum, ObjectHead, ObjectMeta, ObjectWriter, PutOpts, Store,
    StoreError, StoreErrorKind, StoreExt, WriteOptions,
};
use bytes::Bytes;
use futures::StreamExt;

use super::endpoint::{Kind, Remote, Side};
use super::plan::{self, slices, tuning, MIB};
use super::progress::Progress;
use super::verify::{self, Check, Expect, SliceSum};
use super::{download, store_to_store, upload, CpError, Ctx};

/// Slices of 4 KiB keep the tests fast while crossing many slice boundaries.
const SLICE: u64 = 4096;

fn ctx() -> Ctx {
    let mut c = Ctx::new(4, Some(SLICE), 3, Progress::quiet());
    c.backoff_base = Duration::from_millis(1);
    c
}

fn remote(store: Arc<dyn Store>, kind: Kind, key: &str) -> Remote {
    Remote { store, kind, base: "mem://".into(), key: key.into(), crc_confirmed: false }
}

fn data(n: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..n)
        .map(|_| {
            x ^= x << 13; // xorshift: incompressible-looking bytes, reproducible
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn temp_dir(name: &str) -> PathBuf {
    let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let d = std::env::temp_dir().join(format!("bucketfs-cp-test-{name}-{n}"));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn slicing_math() {
    assert_eq!(slices(0, SLICE), Vec::<Range<u64>>::new());
    assert_eq!(slices(1, SLICE), vec![0..1]);
    assert_eq!(slices(SLICE, SLICE), vec![0..SLICE]);
    assert_eq!(slices(SLICE + 1, SLICE), vec![0..SLICE, SLICE..SLICE + 1]);
    assert_eq!(slices(3 * SLICE, SLICE).len(), 3);
    // Never more than S3's 10,000 parts, whatever the user asked for.
    let t = tuning(Some(100_000 * MIB), Some(MIB), Some(8));
    assert!(slices(100_000 * MIB, t.slice).len() <= 10_000);
    assert_eq!(tuning(Some(10 * MIB), None, None).slice, 8 * MIB);
    assert_eq!(tuning(Some(1 << 30), None, None).slice, 16 * MIB);
    assert_eq!(tuning(None, None, None).slice, 16 * MIB);
    let p = plan::default_parallel();
    assert!((8..=16).contains(&p));
}

#[test]
fn sizes_parse() {
    assert_eq!(plan::parse_size("8M"), Ok(8 * MIB));
    assert_eq!(plan::parse_size("16MiB"), Ok(16 * MIB));
    assert_eq!(plan::parse_size("512k"), Ok(512 * 1024));
    assert_eq!(plan::parse_size("4096"), Ok(4096));
    assert!(plan::parse_size("0").is_err());
    assert!(plan::parse_size("8X").is_err());
}

#[test]
fn digests_and_checks() {
    let a = SliceSum::of(0..3, b"abc", true);
    let b = SliceSum::of(3..6, b"def", true);
    assert_eq!(verify::combined_crc(&[a.clone(), b.clone()]), Some(crc32c::crc32c(b"abcdef")));
    // S3's multipart ETag of parts "abc" and "def", as MinIO and S3 compute it.
    let etag = verify::composite_etag(&[a.clone(), b.clone()]).unwrap();
    assert!(etag.ends_with("-2"));
    let d = |etag: &str| ObjectHead {
        etag: Some(etag.into()),
        ..ObjectHead::of(ObjectMeta { key: "k".into(), size: 6, etag: None, mtime: None, size_unknown: false })
    };
    let exp = verify::expect(Kind::S3, &d(&etag));
    assert_eq!(verify::check(&exp, &[a.clone(), b.clone()], None, None), Check::Ok(verify::BY_ETAG));
    // An ETag that differs proves nothing (a guessed part size, SSE-KMS): re-read, which
    // decides; never a mismatch that deletes the upload.
    assert_eq!(verify::check(&exp, &[b.clone(), a.clone()], None, None), Check::Reread);
    assert_eq!(verify::check(&exp, &[b, a], None, None), Check::Reread);
    // Plain MD5 ETag (hex); other services' ETags mean nothing.
    let md5_abc = "900150983cd24fb0d6963f7d28e17f72";
    let exp = verify::expect(Kind::S3, &d(md5_abc));
    assert!(matches!(exp, Expect::WholeMd5 { etag: true, .. }));
    let md5_of = |b: &[u8]| -> [u8; 16] {
        use md5::Digest;
        md5::Md5::digest(b).into()
    };
    assert_eq!(verify::check(&exp, &[], Some(md5_of(b"abc")), None), Check::Ok(verify::BY_MD5));
    // An SSE-KMS object's ETag looks like an MD5 but is not the content's.
    assert_eq!(verify::check(&exp, &[], Some(md5_of(b"abd")), None), Check::Reread);
    // The store's own MD5 (GCS's md5Hash) that differs is a mismatch.
    let gcs = ObjectHead { md5: Some(md5_of(b"abc")), ..d("1") };
    let exp = verify::expect(Kind::Gcs, &gcs);
    assert!(matches!(verify::check(&exp, &[], Some(md5_of(b"abd")), None), Check::Mismatch(_)));
    assert_eq!(verify::expect(Kind::Gcs, &d(md5_abc)), Expect::Reread);
    assert_eq!(verify::expect(Kind::S3, &d("not-an-md5")), Expect::Reread);
    assert_eq!(verify::guess_part_size(20 * MIB, 3, 8 * MIB), Some(8 * MIB));
    assert_eq!(verify::guess_part_size(20 * MIB, 4, 8 * MIB), Some(5 * MIB));
    assert_eq!(verify::guess_part_size(20 * MIB, 999, 8 * MIB), None);
}

#[test]
fn s3_crc_checksums_are_checked_before_md5s() {
    let (abc, def) = (Bytes::from_static(b"abc"), Bytes::from_static(b"def"));
    let a = SliceSum::of_chunks(0..3, std::slice::from_ref(&abc), false, true, true, None);
    let b = SliceSum::of_chunks(3..6, std::slice::from_ref(&def), false, true, true, None);
    let d = |sum: Option<ObjectChecksum>| ObjectHead {
        meta: ObjectMeta { key: "k".into(), size: 6, etag: None, mtime: None, size_unknown: false },
        etag: Some(
            verify::composite_etag(&[SliceSum::of(0..3, b"abc", true), SliceSum::of(3..6, b"def", true)]).unwrap(),
        ),
        md5: None,
        checksum: sum,
        first_part: None,
        attrs: Default::default(),
    };
    let check = |sum: ObjectChecksum, sums: &[SliceSum], blocks: Option<verify::BlockSpec>| {
        verify::check(&verify::expect(Kind::S3, &d(Some(sum))), sums, None, blocks)
    };
    let ab = [a.clone(), b.clone()];
    // Whole object (FULL_OBJECT): the per-slice crcs combined.
    assert_eq!(check(s3_checksum("crc32c", b"abcdef", None), &ab, None), Check::Ok(verify::BY_S3_CRC32C));
    assert_eq!(check(s3_checksum("crc32", b"abcdef", None), &ab, None), Check::Ok(verify::BY_S3_CRC32));
    assert!(
        matches!(check(s3_checksum("crc32", b"abcdeF", None), &ab, None), Check::Mismatch(m) if m.contains("crc32"))
    );
    // COMPOSITE of two 3-byte parts: the crc of the parts' crcs, in order.
    for (algo, crc) in [("crc32", verify::Crc::Crc32), ("crc32c", verify::Crc::Crc32c)] {
        let sum = s3_checksum(algo, b"abcdef", Some(3));
        assert!(matches!(check(sum.clone(), &ab, None), Check::Ok(_)), "{algo}");
        let ba = [b.clone(), a.clone()];
        assert!(matches!(check(sum.clone(), &ba, None), Check::Mismatch(_)), "{algo}");
        // Slices that are not the parts, and no block crcs: nothing to try, re-read.
        assert_eq!(check(sum.clone(), &[SliceSum::of(0..6, b"abcdef", false)], None), Check::Reread, "{algo}");
        // With block crcs every part size of whole blocks is tried: one that gives 2 parts
        // rebuilds it; bytes that none rebuilds are a mismatch, not a guess gone wrong.
        for size in [1, 3] {
            let spec = Some(verify::BlockSpec { algo: crc, size });
            let one =
                |data: &'static [u8]| [SliceSum::of_chunks(0..6, &[Bytes::from_static(data)], false, true, true, spec)];
            assert!(matches!(check(sum.clone(), &one(b"abcdef"), spec), Check::Ok(_)), "{algo} {size}");
            assert!(matches!(check(sum.clone(), &one(b"abcdeF"), spec), Check::Mismatch(_)), "{algo} {size}");
        }
        // Blocks of 4 bytes: only parts of 4 + 2 can be tried, which do not rebuild 3 + 3.
        let spec = Some(verify::BlockSpec { algo: crc, size: 4 });
        let whole = [SliceSum::of_chunks(0..6, &[Bytes::from_static(b"abcdef")], false, true, true, spec)];
        assert!(matches!(check(sum.clone(), &whole, spec), Check::Mismatch(_)), "{algo}");
        // One part: the whole content, whatever the slices.
        let sum1 = s3_checksum(algo, b"abcdef", Some(6));
        assert!(matches!(check(sum1.clone(), &ab, None), Check::Ok(_)), "{algo}");
        assert!(matches!(check(sum1, &[b.clone(), a.clone()], None), Check::Mismatch(_)), "{algo}");
    }
    // A FULL_OBJECT crc tagged `-N` by its store is still the whole content's.
    let mut tagged = s3_checksum("crc32c", b"abcdef", None);
    tagged.parts = Some(2);
    assert_eq!(check(tagged, &ab, None), Check::Ok(verify::BY_S3_CRC32C));
    // The part size the store told: parts of 5 bytes (not a multiple of the blocks tried
    // otherwise) rebuild from slices of any size, 2 bytes here.
    let sum = s3_checksum("crc32c", b"abcdefghijk", Some(5));
    let exp = verify::expect(Kind::S3, &d(Some(sum)));
    let head = ObjectHead { first_part: Some(5), ..d(None) }; // of 6 bytes
    assert_eq!(verify::told_part_size(&head, 2), Some(5));
    assert_eq!(verify::told_part_size(&head, 3), None, "5-byte parts make 2 of 6 bytes");
    let spec = exp.blocks(2, Some(5));
    assert_eq!(spec.map(|b| b.size), Some(5));
    let sliced = |data: &'static [u8], spec: Option<verify::BlockSpec>| -> Vec<SliceSum> {
        (0..data.len())
            .step_by(2)
            .map(|at| {
                let end = (at + 2).min(data.len());
                SliceSum::of_chunks(
                    at as u64..end as u64,
                    &[Bytes::from_static(&data[at..end])],
                    false,
                    true,
                    true,
                    spec,
                )
            })
            .collect()
    };
    assert_eq!(verify::check(&exp, &sliced(b"abcdefghijk", spec), None, spec), Check::Ok(verify::BY_S3_CRC32C));
    assert!(matches!(verify::check(&exp, &sliced(b"abcdefghijK", spec), None, spec), Check::Mismatch(_)));
    // Not told, only even part sizes are tried (blocks of the 2-byte slices): none is 5.
    let guessed = exp.blocks(2, None);
    assert!(matches!(verify::check(&exp, &sliced(b"abcdefghijk", guessed), None, guessed), Check::Mismatch(_)));
    // crc32 needs each slice's crc32: without it, re-read rather than guess.
    let no_crc32 = [SliceSum::of(0..3, b"abc", false), SliceSum::of(3..6, b"def", false)];
    assert_eq!(check(s3_checksum("crc32", b"abcdef", None), &no_crc32, None), Check::Reread);
    // Algorithms cp does not check, and a COMPOSITE without its part count, fall back to the ETag.
    let other = |algorithm: &str, parts, kind: &str| ObjectChecksum {
        algorithm: algorithm.into(),
        digest: vec![1; 8],
        parts,
        kind: Some(kind.into()),
    };
    for sum in [other("crc64nvme", None, "FULL_OBJECT"), other("sha256", Some(2), "COMPOSITE")] {
        assert!(matches!(verify::expect(Kind::S3, &d(Some(sum))), Expect::Composite { parts: 2, .. }));
    }
    let mut bare = s3_checksum("crc32c", b"abcdef", Some(3));
    bare.parts = None;
    assert!(matches!(verify::expect(Kind::S3, &d(Some(bare))), Expect::Composite { .. }));
    // A checksum is an S3 one: elsewhere it is not looked at.
    assert_eq!(verify::expect(Kind::Other, &d(Some(s3_checksum("crc32c", b"abcdef", None)))), Expect::Reread);
}

/// Upload then download through `store`, byte-exact, for sizes around the slice size.
async fn round_trip(store: Arc<dyn Store>, kind: Kind, n: usize) {
    let ctx = ctx();
    let dir = temp_dir("rt");
    let src = dir.join("src");
    let body = data(n);
    std::fs::write(&src, &body).unwrap();
    let r = remote(store.clone(), kind, &format!("obj-{n}"));
    let up = upload::upload(&ctx, upload::Source::File(&src), Some(n as u64), &r).await.unwrap();
    assert_eq!(up.bytes, n as u64);
    assert_eq!(up.crc32c, Some(crc32c::crc32c(&body)), "{n} bytes");
    let dst = dir.join("sub/dst");
    let down = download::to_file(&ctx, &r, None, &dst).await.unwrap();
    assert_eq!(down.crc32c, up.crc32c);
    assert!(std::fs::read(&dst).unwrap() == body, "{n} bytes differ after the round trip");
    // Only the destination is left: no temp files beside it.
    assert_eq!(std::fs::read_dir(dir.join("sub")).unwrap().count(), 1);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_single_object_is_asked_for_once() {
    // Every HEAD after the first fails: the copy must use what expansion learned.
    let mem = Arc::new(MemStore::new());
    let body = data(3 * SLICE as usize + 5);
    mem.put("obj", Bytes::from(body.clone()), PutOpts::default()).await.unwrap();
    let once: Arc<dyn Store> = Arc::new(FailStore::new(mem, Op::Head, 2, u64::MAX / 2, StoreErrorKind::Other));
    let dir = temp_dir("once");
    let src = Side::Remote(remote(once, Kind::Other, "obj"));
    let walk = super::walk::Walk { recursive: false, follow_symlinks: true };
    let jobs = plan::expand(vec![src], Side::Local(dir.join("out")), walk).await.unwrap().jobs;
    assert_eq!(jobs.len(), 1);
    let rep = super::run_job(&ctx(), &jobs[0]).await.unwrap();
    assert_eq!(rep.bytes, body.len() as u64);
    assert!(std::fs::read(dir.join("out")).unwrap() == body);
}

#[test]
fn a_download_target_is_sized_and_allocated_before_the_first_byte() {
    use std::os::unix::fs::MetadataExt;
    let path = temp_dir("reserve").join("f");
    let size = 3 * MIB + 5;
    download::Target::open(&path, true).unwrap().reserve(size).unwrap();
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!(m.len(), size);
    // Allocated, not sparse: the test directory's file system (ext4, tmpfs) has fallocate.
    assert!(m.blocks() * 512 >= size, "{} blocks for {size} bytes", m.blocks());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_at_slice_boundaries() {
    let s = SLICE as usize;
    for n in [0, 1, s - 1, s, s + 1, 5 * s + 3] {
        round_trip(Arc::new(MemStore::new()), Kind::Other, n).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_reads_are_retried_to_a_correct_result() {
    let mem: Arc<dyn Store> = Arc::new(MemStore::new());
    let body = data(10 * SLICE as usize + 17);
    mem.put("obj", Bytes::from(body.clone()), PutOpts::default()).await.unwrap();
    // Reads 3 and 4 fail (mid-transfer); retries with backoff get the slices anyway.
    let failing: Arc<dyn Store> = Arc::new(FailStore::new(mem, Op::Get, 3, 2, StoreErrorKind::Unavailable));
    let dir = temp_dir("retry");
    let rep = download::to_file(&ctx(), &remote(failing, Kind::Other, "obj"), None, &dir.join("out")).await.unwrap();
    assert_eq!(rep.verified, verify::BY_REREAD);
    assert!(std::fs::read(dir.join("out")).unwrap() == body);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A store that has answered nothing for a minute is given up at its next failure to
/// reach it, not tried again: each try waits its full timeout (tester Q: an upload to a
/// black-holed store gave up after 12 minutes). A store that timed out had its own
/// retries, so that is never retried again either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_silent_for_a_minute_is_given_up_at_its_next_failure() {
    let mem: Arc<dyn Store> = Arc::new(MemStore::new());
    let dir = temp_dir("silent");
    std::fs::write(dir.join("f"), data(1000)).unwrap();
    let once =
        || -> Arc<dyn Store> { Arc::new(FailStore::new(mem.clone(), Op::Put, 1, 1, StoreErrorKind::Unavailable)) };
    let silent = ctx();
    silent.progress.pretend_silent_for(super::SILENCE_GIVE_UP);
    let e =
        upload::upload(&silent, upload::Source::File(&dir.join("f")), Some(1000), &remote(once(), Kind::Other, "f"))
            .await
            .unwrap_err();
    assert!(e.to_string().contains("nothing heard from the store for 60 s"), "{e}");
    assert!(mem.head("f", Default::default()).await.is_err(), "tried again");
    // The same failure on a copy that heard from its store recently is tried again.
    upload::upload(&ctx(), upload::Source::File(&dir.join("f")), Some(1000), &remote(once(), Kind::Other, "f"))
        .await
        .unwrap();
    // Downloads (through `again`) alike.
    silent.progress.pretend_silent_for(super::SILENCE_GIVE_UP);
    let failing: Arc<dyn Store> = Arc::new(FailStore::new(mem.clone(), Op::Head, 1, 1, StoreErrorKind::Unavailable));
    let e = download::to_file(&silent, &remote(failing, Kind::Other, "f"), None, &dir.join("out")).await.unwrap_err();
    assert!(e.to_string().contains("nothing heard from the store"), "{e}");
    let timed_out = StoreError { timed_out: true, ..StoreError::new(StoreErrorKind::Unavailable, "no answer") };
    assert!(
        !super::is_retryable(&timed_out) && super::is_retryable(&StoreError::new(StoreErrorKind::Unavailable, "x"))
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// A download whose final rename fails (a directory holds the name) leaves no hidden
/// temporary beside it: the docs say a failed download leaves no file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_that_cannot_take_its_name_leaves_no_temporary() {
    let mem: Arc<dyn Store> = Arc::new(MemStore::new());
    mem.put("obj", Bytes::from_static(b"data"), PutOpts::default()).await.unwrap();
    let dir = temp_dir("rename-fails");
    std::fs::create_dir_all(dir.join("out/keep")).unwrap();
    let r = download::to_file(&ctx(), &remote(mem, Kind::Other, "obj"), None, &dir.join("out")).await;
    assert!(r.is_err(), "a directory holds the name");
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, [std::ffi::OsString::from("out")], "only the directory in the way");
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_uploads_are_retried() {
    let mem: Arc<dyn Store> = Arc::new(MemStore::new());
    let failing: Arc<dyn Store> = Arc::new(FailStore::new(mem.clone(), Op::Put, 1, 2, StoreErrorKind::Unavailable));
    let dir = temp_dir("up-retry");
    let body = data(1000);
    std::fs::write(dir.join("f"), &body).unwrap();
    upload::upload(&ctx(), upload::Source::File(&dir.join("f")), Some(1000), &remote(failing, Kind::Other, "f"))
        .await
        .unwrap();
    assert_eq!(mem.get_range("f", 0..1000, GetOpts::default()).await.unwrap(), body);
    // A failure that retrying cannot fix is reported at once.
    let denied: Arc<dyn Store> = Arc::new(FailStore::new(mem, Op::Upload, 1, 99, StoreErrorKind::PermissionDenied));
    let big = data(3 * SLICE as usize);
    std::fs::write(dir.join("g"), &big).unwrap();
    let e = upload::upload(&ctx(), upload::Source::File(&dir.join("g")), None, &remote(denied, Kind::Other, "g")).await;
    let e = e.unwrap_err();
    assert!(matches!(e, CpError::Permission(_)) && e.to_string().contains("injected"), "{e:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A store that damages data: reads numbered in `flip_reads` (1-based) come back with one
/// byte flipped, `flip_puts` stores flipped data, `wrong_md5` reports a bad MD5,
/// `checksum` is reported as the object's S3 checksum, `kms_etag` an ETag that looks like
/// an MD5 but is not the content's (as S3 gives for SSE-KMS objects), `changed_reads`
/// makes every read fail as if another writer had replaced the object.
struct Corrupt {
    inner: Arc<MemStore>,
    flip_reads: Vec<u64>,
    flip_puts: bool,
    wrong_md5: bool,
    kms_etag: bool,
    changed_reads: bool,
    checksum: Option<ObjectChecksum>,
    reads: AtomicU64,
    /// Bytes returned by all reads.
    read_bytes: AtomicU64,
}

impl Corrupt {
    fn new(inner: Arc<MemStore>) -> Self {
        Self {
            inner,
            flip_reads: vec![],
            flip_puts: false,
            wrong_md5: false,
            kms_etag: false,
            changed_reads: false,
            checksum: None,
            reads: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
        }
    }
}

/// The S3 checksum of `body` as S3 computes it: `algorithm` of the whole body, or with
/// `part` the COMPOSITE of its parts' crcs.
fn s3_checksum(algorithm: &str, body: &[u8], part: Option<usize>) -> ObjectChecksum {
    let crc = |d: &[u8]| if algorithm == "crc32" { crc32fast::hash(d) } else { crc32c::crc32c(d) };
    let (digest, parts, kind) = match part {
        None => (crc(body), None, "FULL_OBJECT"),
        Some(p) => {
            let joined: Vec<u8> = body.chunks(p).flat_map(|c| crc(c).to_be_bytes()).collect();
            (crc(&joined), Some(body.len().div_ceil(p) as u64), "COMPOSITE")
        }
    };
    ObjectChecksum {
        algorithm: algorithm.into(),
        digest: digest.to_be_bytes().to_vec(),
        parts,
        kind: Some(kind.into()),
    }
}

fn flip(b: Bytes) -> Bytes {
    let mut v = b.to_vec();
    if let Some(x) = v.first_mut() {
        *x ^= 0x55;
    }
    v.into()
}

#[async_trait]
impl Store for Corrupt {
    fn describe(&self) -> String {
        "corrupt".into()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn check(&self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn head(&self, key: &str, opts: HeadOpts) -> Result<ObjectHead, StoreError> {
        let head = self.inner.head(key, opts).await?;
        if !opts.digests {
            return Ok(head);
        }
        let etag = self.kms_etag.then(|| KMS_ETAG.to_string());
        Ok(ObjectHead { etag, md5: self.wrong_md5.then_some([7; 16]), checksum: self.checksum.clone(), ..head })
    }
    async fn get(&self, key: &str, r: Range<u64>, opts: GetOpts<'_>) -> Result<bucketfs_store::ByteStream, StoreError> {
        if self.changed_reads {
            return Err(StoreError::new(StoreErrorKind::Changed, format!("{key}: precondition failed")));
        }
        let n = self.reads.fetch_add(1, Ordering::SeqCst) + 1;
        // The fake ETag is not the inner store's: reads pinned to it go unpinned.
        let opts = if self.kms_etag { GetOpts::default() } else { opts };
        let b = self.inner.get_range(key, r, opts).await?;
        self.read_bytes.fetch_add(b.len() as u64, Ordering::SeqCst);
        let b = if self.flip_reads.contains(&n) { flip(b) } else { b };
        Ok(Box::pin(futures::stream::once(async move { Ok(b) })))
    }
    fn list(&self, prefix: &str, recursive: bool) -> ListStream {
        self.inner.list(prefix, recursive)
    }
    async fn put(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<ObjectMeta, StoreError> {
        let meta = self.inner.put(key, if self.flip_puts { flip(data) } else { data }, opts).await?;
        Ok(ObjectMeta { etag: if self.kms_etag { Some(KMS_ETAG.into()) } else { meta.etag }, ..meta })
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key).await
    }
    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        self.inner.copy(from, to).await
    }
    async fn create_dir(&self, key: &str) -> Result<(), StoreError> {
        self.inner.create_dir(key).await
    }
    async fn writer(&self, key: &str, opts: WriteOptions) -> Result<Box<dyn ObjectWriter>, StoreError> {
        self.inner.writer(key, opts).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_read_is_caught_by_the_reread_and_fetched_again() {
    let mem = Arc::new(MemStore::new());
    let body = data(6 * SLICE as usize);
    mem.put("obj", Bytes::from(body.clone()), PutOpts::default()).await.unwrap();
    let mut c = Corrupt::new(mem);
    c.flip_reads = vec![2]; // one slice of the first pass comes back damaged
    let dir = temp_dir("flip");
    let rep =
        download::to_file(&ctx(), &remote(Arc::new(c), Kind::Other, "obj"), None, &dir.join("out")).await.unwrap();
    assert_eq!(rep.verified, verify::BY_REREAD);
    assert!(std::fs::read(dir.join("out")).unwrap() == body, "the damaged slice was not repaired");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Downloads of an object with an S3 crc checksum are verified by it. A damaged read is
/// a mismatch against a whole-object crc and against a COMPOSITE one (every part size of
/// whole blocks is tried), so the object is downloaded again; damaged every time, it is an
/// error. A checksum whose parts are not the slices is rebuilt from the block crcs; one of
/// another algorithm falls back to the re-read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_are_verified_by_the_s3_crc_checksum() {
    let mem = Arc::new(MemStore::new());
    let body = data(6 * SLICE as usize + 100);
    mem.put("obj", Bytes::from(body.clone()), PutOpts::default()).await.unwrap();
    let dir = temp_dir("crc");
    let get = |sum: ObjectChecksum, flip_reads: Vec<u64>| {
        let mut c = Corrupt::new(mem.clone());
        c.checksum = Some(sum);
        c.flip_reads = flip_reads;
        let c = Arc::new(c);
        let dst = dir.join("out");
        async move {
            let r = download::to_file(&ctx(), &remote(c.clone(), Kind::S3, "obj"), None, &dst).await;
            (r, c.read_bytes.load(Ordering::SeqCst))
        }
    };
    let len = body.len() as u64;
    let part = Some(SLICE as usize);
    for (sum, how) in [
        (s3_checksum("crc32", &body, part), verify::BY_S3_CRC32),
        (s3_checksum("crc32c", &body, part), verify::BY_S3_CRC32C),
        (s3_checksum("crc32", &body, None), verify::BY_S3_CRC32),
        (s3_checksum("crc32c", &body, None), verify::BY_S3_CRC32C),
    ] {
        let (r, read) = get(sum.clone(), vec![]).await;
        let rep = r.unwrap();
        assert_eq!(rep.verified, how);
        // A crc32 verifies without the crc32c, which only a --json summary would report.
        let crc32c = (how == verify::BY_S3_CRC32C).then(|| crc32c::crc32c(&body));
        assert_eq!(rep.crc32c, crc32c, "{sum:?}");
        assert!(std::fs::read(dir.join("out")).unwrap() == body);
        assert_eq!(read, len, "no re-read"); // exact: 7 slices for 4 slots are never split
        let (r, read) = get(sum.clone(), vec![2]).await;
        assert_eq!(r.unwrap().verified, how, "{sum:?}");
        assert!(std::fs::read(dir.join("out")).unwrap() == body, "the damaged read was kept");
        assert!(read >= 2 * len, "read again: {read} bytes read");
        // Damaged every time: an error, and nothing left behind.
        let (r, _) = get(sum, (1..1000).collect()).await;
        let e = r.unwrap_err();
        assert!(matches!(e, CpError::Mismatch(_)), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("verification failed") && e.contains("crc32"), "{e}");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec!["out"], "temp file left behind");
    }
    // Parts that are not the slices (2 slices each): rebuilt from the block crcs, no re-read.
    let (r, read) = get(s3_checksum("crc32", &body, Some(2 * SLICE as usize)), vec![]).await;
    assert_eq!((r.unwrap().verified.as_ref(), read), (verify::BY_S3_CRC32, len));
    // sha256: verified by re-reading.
    let (r, read) =
        get(ObjectChecksum { algorithm: "sha256".into(), ..s3_checksum("crc32", &body, None) }, vec![]).await;
    assert_eq!(r.unwrap().verified, verify::BY_REREAD);
    assert!(read >= 2 * len, "{read} bytes read");
    // With a summary to report, a crc32-verified download computes the crc32c too.
    let mut c = Corrupt::new(mem.clone());
    c.checksum = Some(s3_checksum("crc32", &body, part));
    let mut with_summary = ctx();
    with_summary.summary = true;
    let rep =
        download::to_file(&with_summary, &remote(Arc::new(c), Kind::S3, "obj"), None, &dir.join("out")).await.unwrap();
    assert_eq!((rep.verified.as_ref(), rep.crc32c), (verify::BY_S3_CRC32, Some(crc32c::crc32c(&body))));
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_mismatch_is_an_error_not_a_success() {
    let mem = Arc::new(MemStore::new());
    mem.put("obj", Bytes::from(data(3 * SLICE as usize)), PutOpts::default()).await.unwrap();
    let mut c = Corrupt::new(mem.clone());
    c.wrong_md5 = true;
    let c: Arc<dyn Store> = Arc::new(c);
    let dir = temp_dir("mismatch");
    let e = download::to_file(&ctx(), &remote(c.clone(), Kind::Gcs, "obj"), None, &dir.join("out")).await.unwrap_err();
    assert_eq!(e.exit_code(), 7, "{e}");
    let e = e.to_string();
    assert!(e.contains("verification failed") && e.contains("MD5"), "{e}");
    assert!(!dir.join("out").exists(), "a download that failed verification must not be left in place");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "temp file left behind");
    // Upload to a "GCS" that reports a wrong MD5: error, and the bad object is deleted.
    std::fs::write(dir.join("f"), data(100)).unwrap();
    let e = upload::upload(&ctx(), upload::Source::File(&dir.join("f")), Some(100), &remote(c, Kind::Gcs, "up"))
        .await
        .unwrap_err();
    assert!(matches!(e, CpError::Mismatch(_)) && e.to_string().contains("verification failed"), "{e}");
    assert_eq!(mem.stat("up").await.unwrap_err().kind, StoreErrorKind::NotFound);
    std::fs::remove_dir_all(dir).unwrap();
}

/// 32 hex digits, as S3's ETag of an SSE-KMS object: not the MD5 of its content.
const KMS_ETAG: &str = "0123456789abcdef0123456789abcdef";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etag_that_is_not_the_md5_is_settled_by_rereading() {
    // An upload: verified by the re-read, and the object stays (it was deleted as "bad").
    let mem = Arc::new(MemStore::new());
    let mut c = Corrupt::new(mem.clone());
    c.kms_etag = true;
    let c: Arc<dyn Store> = Arc::new(c);
    let dir = temp_dir("kms");
    let body = data(1000);
    std::fs::write(dir.join("f"), &body).unwrap();
    let rep =
        upload::upload(&ctx(), upload::Source::File(&dir.join("f")), Some(1000), &remote(c.clone(), Kind::S3, "up"))
            .await
            .unwrap();
    assert_eq!(rep.verified, verify::BY_REREAD);
    assert_eq!(mem.get_range("up", 0..1000, GetOpts::default()).await.unwrap(), body);
    // A download: verified by the re-read, not fetched again and again.
    let rep = download::to_file(&ctx(), &remote(c, Kind::S3, "up"), None, &dir.join("out")).await.unwrap();
    assert_eq!(rep.verified, verify::BY_REREAD);
    assert_eq!(std::fs::read(dir.join("out")).unwrap(), body);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_object_changed_during_verification_leaves_it() {
    // The pinned re-read finds another writer's version: not ours to delete.
    let mem = Arc::new(MemStore::new());
    let mut c = Corrupt::new(mem.clone());
    c.changed_reads = true;
    let dir = temp_dir("changed");
    std::fs::write(dir.join("f"), data(1000)).unwrap();
    let r = remote(Arc::new(c), Kind::Other, "f");
    let e = upload::upload(&ctx(), upload::Source::File(&dir.join("f")), Some(1000), &r).await.unwrap_err();
    assert!(matches!(e, CpError::Changed(_)) && e.exit_code() == 5, "{e}");
    assert!(mem.stat("f").await.is_ok(), "the object another writer holds was deleted");
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_keeps_bad_bytes_fails_the_upload_on_reread() {
    let mem = Arc::new(MemStore::new());
    let mut c = Corrupt::new(mem.clone());
    c.flip_puts = true;
    let dir = temp_dir("badput");
    std::fs::write(dir.join("f"), data(1000)).unwrap();
    let r = remote(Arc::new(c), Kind::Other, "f");
    let e = upload::upload(&ctx(), upload::Source::File(&dir.join("f")), Some(1000), &r).await.unwrap_err();
    assert!(matches!(e, CpError::Mismatch(_)) && e.to_string().contains("crc32c differs"), "{e}");
    assert_eq!(mem.stat("f").await.unwrap_err().kind, StoreErrorKind::NotFound);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_to_store_streams_at_slice_boundaries_and_retries_failures() {
    let s = SLICE as usize;
    for n in [0, 1, s, s + 1, 10 * s + 17] {
        let a = Arc::new(MemStore::new());
        let b = Arc::new(MemStore::new());
        let body = data(n);
        a.put("obj", Bytes::from(body.clone()), PutOpts::default()).await.unwrap();
        // Reads 3 and 4 fail mid-transfer (retried per request); the first part writer
        // cannot be opened (the whole copy is done again).
        let src: Arc<dyn Store> = Arc::new(FailStore::new(a.clone(), Op::Get, 3, 2, StoreErrorKind::Unavailable));
        let dst: Arc<dyn Store> = Arc::new(FailStore::new(b.clone(), Op::Upload, 1, 1, StoreErrorKind::Unavailable));
        let rep =
            store_to_store::copy(&ctx(), &remote(src, Kind::Other, "obj"), None, &remote(dst, Kind::Other, "copy"))
                .await
                .unwrap();
        assert_eq!(rep.bytes, n as u64);
        assert_eq!(rep.crc32c, Some(crc32c::crc32c(&body)));
        assert_eq!(rep.verified, "reread-crc32c>reread-crc32c", "both sides re-read (mem keeps no digest)");
        assert!(b.get_range("copy", 0..n as u64, GetOpts::default()).await.unwrap() == body, "{n} bytes differ");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_to_store_catches_a_corrupted_source_read_and_copies_again() {
    let a = Arc::new(MemStore::new());
    let body = data(6 * SLICE as usize);
    a.put("obj", Bytes::from(body.clone()), PutOpts::default()).await.unwrap();
    let mut c = Corrupt::new(a);
    c.flip_reads = vec![2]; // one slice of the first pass comes back damaged
    let b = Arc::new(MemStore::new());
    let rep = store_to_store::copy(
        &ctx(),
        &remote(Arc::new(c), Kind::Other, "obj"),
        None,
        &remote(b.clone(), Kind::Other, "k"),
    )
    .await
    .unwrap();
    assert_eq!(rep.crc32c, Some(crc32c::crc32c(&body)));
    assert!(
        b.get_range("k", 0..body.len() as u64, GetOpts::default()).await.unwrap() == body,
        "the damaged copy was kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_to_store_within_one_store_is_server_side() {
    let a: Arc<dyn Store> = Arc::new(MemStore::new());
    let body = data(3 * SLICE as usize + 1);
    a.put("obj", Bytes::from(body.clone()), PutOpts::default()).await.unwrap();
    let rep = store_to_store::copy(
        &ctx(),
        &remote(a.clone(), Kind::Other, "obj"),
        None,
        &remote(a.clone(), Kind::Other, "b"),
    )
    .await
    .unwrap();
    assert_eq!(rep.verified, "copy:reread-crc32c");
    assert_eq!(rep.crc32c, Some(crc32c::crc32c(&body)));
    assert!(a.get_range("b", 0..body.len() as u64, GetOpts::default()).await.unwrap() == body);
    let e = store_to_store::copy(&ctx(), &remote(a.clone(), Kind::Other, "obj"), None, &remote(a, Kind::Other, "obj"))
        .await
        .unwrap_err();
    assert!(matches!(e, CpError::Failed(_)) && e.to_string().contains("same object"), "{e}");
}

/// A store whose ranged reads stream in 1,000-byte chunks (never aligned to a slice), whose
/// streams numbered in `cut` (1-based) break off half way, and which reports an S3
/// multipart ETag of `SLICE`-byte parts. Streams numbered in `slow` wait 5 ms before each
/// chunk. Records every requested range, and counts the bytes of chunks taken.
struct Choppy {
    inner: Arc<MemStore>,
    cut: Vec<u64>,
    slow: Vec<u64>,
    streams: AtomicU64,
    served: Arc<AtomicU64>,
    asked: std::sync::Mutex<Vec<Range<u64>>>,
}

#[async_trait]
impl Store for Choppy {
    fn describe(&self) -> String {
        "choppy".into()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn check(&self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn head(&self, key: &str, opts: HeadOpts) -> Result<ObjectHead, StoreError> {
        let head = self.inner.head(key, opts).await?;
        if !opts.digests {
            return Ok(head);
        }
        let body = self.inner.get_range(key, 0..head.meta.size, GetOpts::default()).await?;
        let sums: Vec<SliceSum> = slices(head.meta.size, SLICE)
            .into_iter()
            .map(|r| SliceSum::of(r.clone(), &body[r.start as usize..r.end as usize], true))
            .collect();
        Ok(ObjectHead { etag: verify::composite_etag(&sums), md5: None, checksum: None, ..head })
    }
    async fn get(&self, key: &str, r: Range<u64>, opts: GetOpts<'_>) -> Result<bucketfs_store::ByteStream, StoreError> {
        let n = self.streams.fetch_add(1, Ordering::SeqCst) + 1;
        self.asked.lock().unwrap().push(r.clone());
        let mut b = self.inner.get_range(key, r, opts).await?;
        let cut = self.cut.contains(&n);
        if cut {
            b.truncate(b.len() / 2);
        }
        let mut chunks: Vec<Result<Bytes, StoreError>> = Vec::new();
        while !b.is_empty() {
            chunks.push(Ok(b.split_to(b.len().min(1000))));
        }
        if cut {
            chunks.push(Err(StoreError::new(StoreErrorKind::Unavailable, "connection reset (injected)")));
        }
        let pause = Duration::from_millis(if self.slow.contains(&n) { 5 } else { 0 });
        let served = self.served.clone();
        Ok(Box::pin(futures::stream::iter(chunks).then(move |c| {
            let served = served.clone();
            async move {
                tokio::time::sleep(pause).await;
                served.fetch_add(c.as_ref().map_or(0, |b| b.len() as u64), Ordering::SeqCst);
                c
            }
        })))
    }
    fn list(&self, prefix: &str, recursive: bool) -> ListStream {
        self.inner.list(prefix, recursive)
    }
    async fn put(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<ObjectMeta, StoreError> {
        self.inner.put(key, data, opts).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key).await
    }
    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        self.inner.copy(from, to).await
    }
    async fn create_dir(&self, key: &str) -> Result<(), StoreError> {
        self.inner.create_dir(key).await
    }
    async fn writer(&self, key: &str, opts: WriteOptions) -> Result<Box<dyn ObjectWriter>, StoreError> {
        self.inner.writer(key, opts).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_cut_off_mid_request_resumes_at_its_first_unfinished_slice() {
    let mem = Arc::new(MemStore::new());
    let size = 40 * SLICE + 5;
    let body = data(size as usize);
    mem.put("obj", Bytes::from(body.clone()), PutOpts::default()).await.unwrap();
    let c = Arc::new(Choppy {
        inner: mem,
        cut: vec![1, 3],
        slow: vec![],
        streams: AtomicU64::new(0),
        served: Default::default(),
        asked: Default::default(),
    });
    let dir = temp_dir("choppy");
    let store: Arc<dyn Store> = c.clone();
    let rep = download::to_file(&ctx(), &remote(store, Kind::S3, "obj"), None, &dir.join("out")).await.unwrap();
    // Verified by the ETag rebuilt from per-slice MD5s hashed chunk by chunk.
    assert_eq!(rep.verified, verify::BY_ETAG);
    assert!(std::fs::read(dir.join("out")).unwrap() == body);
    let asked = c.asked.lock().unwrap().clone();
    // Requests span several slices, all start on a slice boundary, and a resumed request
    // does not fetch again the slices its broken one finished.
    assert!(asked.iter().any(|r| r.end - r.start > SLICE), "{asked:?}");
    assert!(asked.iter().all(|r| r.start % SLICE == 0), "{asked:?}");
    // Each broken request (the 1st and 3rd) is asked again from its first unfinished slice
    // on: by its own retry, and by idle slots that took over its tail while it waited.
    for n in [0, 2] {
        let r = &asked[n];
        let resume = r.start + (r.end - r.start) / 2 / SLICE * SLICE..r.end;
        let later = &asked[n + 1..];
        assert!(later.iter().any(|a| a.start == resume.start), "no retry at {resume:?} after {r:?}: {asked:?}");
        for at in (resume.start..resume.end).step_by(SLICE as usize) {
            assert!(later.iter().any(|a| a.contains(&at)), "byte {at} of {r:?} never asked again: {asked:?}");
        }
    }
    // Bytes read: the whole once, plus what the broken streams delivered before breaking.
    let again: u64 = [0, 2].iter().map(|&n| asked[n].end - asked[n].start).sum::<u64>() / 2;
    let served = c.served.load(Ordering::SeqCst);
    assert!(served <= size + again + 1000 * asked.len() as u64, "{served} bytes read for {size}: {asked:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn idle_slots_take_over_the_tail_of_a_slow_request() {
    let mem = Arc::new(MemStore::new());
    let size = 64 * SLICE;
    let body = data(size as usize);
    mem.put("obj", Bytes::from(body.clone()), PutOpts::default()).await.unwrap();
    // The first request crawls: 5 ms per 1,000 bytes, 0.33 s for its 16 slices alone.
    let c = Arc::new(Choppy {
        inner: mem,
        cut: vec![],
        slow: vec![1],
        streams: AtomicU64::new(0),
        served: Default::default(),
        asked: Default::default(),
    });
    let dir = temp_dir("straggler");
    let store: Arc<dyn Store> = c.clone();
    let rep = download::to_file(&ctx(), &remote(store, Kind::S3, "obj"), None, &dir.join("out")).await.unwrap();
    assert_eq!(rep.verified, verify::BY_ETAG);
    assert!(std::fs::read(dir.join("out")).unwrap() == body);
    let asked = c.asked.lock().unwrap().clone();
    // The other slots took over what the slow one had left, halving it again and again;
    // a request that lost its tail stopped there, so hardly a byte was read twice.
    let slow = asked[0].clone();
    let taken: Vec<_> = asked[1..].iter().filter(|r| slow.contains(&r.start)).collect();
    assert!(taken.len() >= 2, "{asked:?}");
    let served = c.served.load(Ordering::SeqCst);
    assert!(served <= size + 1000 * asked.len() as u64, "{served} bytes read for {size}: {asked:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A retried upload opens its source again: the path must still name the file the first
/// attempt read, unchanged (a file renamed over it between attempts was uploaded instead,
/// exit 0).
#[test]
fn a_source_reopened_for_a_retry_must_be_the_file_first_read() {
    use super::source::{Change, LocalSource, SourceError};
    use std::io::Write;
    let dir = temp_dir("reopen");
    let p = dir.join("f");
    std::fs::write(&p, data(1000)).unwrap();
    let first = *LocalSource::open(&p).unwrap().stat();
    assert!(LocalSource::reopen(&p, &first).is_ok(), "unchanged: the same file");
    std::fs::write(dir.join("new"), data(1000)).unwrap();
    std::fs::rename(dir.join("new"), &p).unwrap();
    let change = |r: Result<LocalSource, SourceError>| match r {
        Err(SourceError::Changed(c)) => c.change,
        other => panic!("{:?}", other.map(|_| ()).map_err(|e| e.to_string())),
    };
    assert_eq!(change(LocalSource::reopen(&p, &first)), Change::Replaced);
    let first = *LocalSource::open(&p).unwrap().stat();
    std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(b"more").unwrap();
    assert_eq!(change(LocalSource::reopen(&p, &first)), Change::Size { before: 1000, after: 1004 });
    std::fs::remove_dir_all(dir).unwrap();
}
