//! One conformance suite, run against every store: the in-memory double, OpenDAL's memory
//! and fs services, MinIO (`BUCKETFS_TEST_S3_ENDPOINT`) and the GCS emulator
//! (`BUCKETFS_TEST_GCS_ENDPOINT`), and our Drive client against the Drive emulator
//! (`BUCKETFS_TEST_DRIVE_ENDPOINT`). Under CI the servers are required, not skipped.
#![allow(clippy::single_range_in_vec_init)] // one kept range is the usual patch

use std::sync::Arc;

use bucketfs_store::location::{self, Location, StoreOptions};
use bucketfs_store::testing::MemStore;
use bucketfs_store::{GetOpts, HeadOpts, PutOpts, Store, StoreErrorKind, StoreExt, WriteOptions};
use bytes::Bytes;
use futures::TryStreamExt;

async fn keys(store: &dyn Store, prefix: &str, recursive: bool) -> Vec<String> {
    let mut v: Vec<String> = store.list(prefix, recursive).map_ok(|m| m.key).try_collect().await.expect("list");
    v.sort();
    v
}

/// The contract every store must keep.
/// Every store, GCS emulator included: fake-gcs-server ignores a download's generation
/// precondition, but the store checks the generation the answer carries (gcs/generation.rs).
async fn conformance(store: Arc<dyn Store>) {
    let s = store.as_ref();
    s.check().await.expect("check");
    let body: Bytes = (0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>().into();
    let m = s.put("dir/sub/file.bin", body.clone(), PutOpts::default()).await.expect("put");
    assert_eq!(m.size, body.len() as u64);
    s.put("dir/a.txt", Bytes::from_static(b"hello"), PutOpts::default()).await.unwrap();
    s.put("top.txt", Bytes::new(), PutOpts::default()).await.unwrap();

    // head: size, etag (object stores), mtime.
    let h = s.stat("dir/sub/file.bin").await.unwrap();
    assert_eq!(h.size, body.len() as u64);
    // mtime is optional (OpenDAL's memory service has none); where given it must be recent.
    if let Some(t) = h.mtime {
        let age = std::time::SystemTime::now().duration_since(t).unwrap_or_default();
        assert!(age.as_secs() < 3600, "{}: mtime {t:?} is not the upload time", s.describe());
    }
    assert_eq!(s.stat("nope").await.unwrap_err().kind, StoreErrorKind::NotFound);
    assert_eq!(s.stat("top.txt").await.unwrap().size, 0);

    // Ranged reads: exact bytes, odd offsets, clamped at the end.
    for (a, b) in [(0u64, 1u64), (1, 4097), (299_990, 300_000), (123_457, 200_001)] {
        let got = s.get_range("dir/sub/file.bin", a..b, GetOpts { if_match: h.etag.as_deref() }).await.unwrap();
        assert_eq!(got, body.slice(a as usize..b as usize), "{}: range {a}..{b}", s.describe());
    }
    let last = s.get_range("dir/sub/file.bin", 299_999..300_000, GetOpts::default()).await.unwrap();
    assert_eq!(last, body.slice(299_999..));
    // The same as a stream of chunks (what `bucketfs cp` reads large ranges with).
    for (a, b) in [(0u64, 300_000u64), (1, 4097), (123_457, 200_001)] {
        let st = s.get("dir/sub/file.bin", a..b, GetOpts { if_match: h.etag.as_deref() }).await.unwrap();
        let got: Vec<Bytes> = st.try_collect().await.unwrap();
        assert_eq!(got.concat(), body.slice(a as usize..b as usize), "{}: streamed {a}..{b}", s.describe());
    }

    // Listing: direct children with sub-prefixes once; recursive: every object.
    assert_eq!(keys(s, "dir/", false).await, ["dir/a.txt", "dir/sub/"]);
    assert_eq!(keys(s, "", false).await, ["dir/", "top.txt"]);
    let all = keys(s, "", true).await;
    for k in ["dir/a.txt", "dir/sub/file.bin", "top.txt"] {
        assert!(all.contains(&k.to_string()), "{}: recursive list misses {k}: {all:?}", s.describe());
    }
    // A plain prefix (what a lookup of one name asks on object stores): every key starting
    // with it, the exact key included, sub-prefixes once.
    if s.capabilities().prefix_dirs {
        s.put("dir/a.txt.rclonelink", Bytes::from_static(b"t"), PutOpts::default()).await.unwrap();
        s.put("dir/su", Bytes::from_static(b"f"), PutOpts::default()).await.unwrap();
        assert_eq!(keys(s, "dir/a.txt", false).await, ["dir/a.txt", "dir/a.txt.rclonelink"], "{}", s.describe());
        assert_eq!(keys(s, "dir/su", false).await, ["dir/su", "dir/sub/"], "{}", s.describe());
        assert!(keys(s, "dir/none", false).await.is_empty(), "{}", s.describe());
        s.delete("dir/a.txt.rclonelink").await.unwrap();
        s.delete("dir/su").await.unwrap();
    }
    let listed: Vec<_> = s.list("dir/", false).try_collect().await.unwrap();
    let a = listed.iter().find(|m| m.key == "dir/a.txt").unwrap();
    assert_eq!(a.size, 5, "{}: listing carries sizes", s.describe());

    // An overwrite changes the identity, and If-Match notices.
    if s.capabilities().read_if_match && h.etag.is_some() {
        s.put("dir/sub/file.bin", Bytes::from_static(b"changed"), PutOpts::default()).await.unwrap();
        let e = s.get_range("dir/sub/file.bin", 0..3, GetOpts { if_match: h.etag.as_deref() }).await.unwrap_err();
        assert_eq!(e.kind, StoreErrorKind::Changed, "{}: {e}", s.describe());
    }

    // Streaming upload in parts, visible only at close; abort leaves nothing.
    let opts = bucketfs_store::WriteOptions { part_size: 5 * 1024 * 1024, concurrency: 2, ..Default::default() };
    let big: Bytes = (0..11 * 1024 * 1024u32).map(|i| (i % 241) as u8).collect::<Vec<_>>().into();
    let mut w = s.writer("dir/multi.bin", opts.clone()).await.unwrap();
    for chunk in big.chunks(1 << 20) {
        w.write(Bytes::copy_from_slice(chunk)).await.unwrap();
    }
    assert_eq!(s.stat("dir/multi.bin").await.unwrap_err().kind, StoreErrorKind::NotFound, "{}", s.describe());
    let m = w.close().await.unwrap();
    assert_eq!(m.size, big.len() as u64);
    let mid = 5 * 1024 * 1024 - 3..5 * 1024 * 1024 + 3;
    assert_eq!(
        s.get_range("dir/multi.bin", mid.clone(), GetOpts::default()).await.unwrap(),
        big.slice(mid.start as usize..mid.end as usize)
    );
    let mut w = s.writer("dir/aborted.bin", opts.clone()).await.unwrap();
    w.write(big.slice(0..1000)).await.unwrap();
    w.abort().await.unwrap();
    assert_eq!(s.stat("dir/aborted.bin").await.unwrap_err().kind, StoreErrorKind::NotFound);
    s.delete("dir/multi.bin").await.unwrap();
    many_parts(s).await;

    // Directories: create_dir makes an (empty) directory that lists.
    s.create_dir("emptydir/").await.unwrap();
    assert!(keys(s, "", false).await.contains(&"emptydir/".to_string()), "{}", s.describe());
    s.delete("emptydir/").await.unwrap();

    // Copy and delete.
    s.copy("dir/a.txt", "dir/b.txt").await.unwrap();
    assert_eq!(&s.get_range("dir/b.txt", 0..5, GetOpts::default()).await.unwrap()[..], b"hello");
    // A delete pinned to a version (what a move copied) leaves another one (written since).
    let copied = s.stat("dir/b.txt").await.unwrap();
    s.put("dir/b.txt", Bytes::from_static(b"written since"), PutOpts::default()).await.unwrap();
    let refused = s.delete_version("dir/b.txt", &copied).await.unwrap_err();
    assert_eq!(refused.kind, StoreErrorKind::Changed, "{}: {refused}", s.describe());
    let now = s.stat("dir/b.txt").await.expect("another version stays");
    assert_eq!(now.size, 13, "{}", s.describe());
    s.delete_version("dir/b.txt", &now).await.expect("the version there goes");
    assert_eq!(s.stat("dir/b.txt").await.unwrap_err().kind, StoreErrorKind::NotFound, "{}", s.describe());
    s.delete_version("dir/b.txt", &now).await.expect("a missing key succeeds");
    s.put("dir/b.txt", Bytes::from_static(b"hello"), PutOpts::default()).await.unwrap();
    for k in ["dir/a.txt", "dir/b.txt", "dir/sub/file.bin", "top.txt"] {
        s.delete(k).await.unwrap();
    }
    s.delete("never-existed").await.expect("deleting a missing key succeeds");
    assert_eq!(s.stat("dir/a.txt").await.unwrap_err().kind, StoreErrorKind::NotFound);
    if s.capabilities().keeps_attrs {
        file_attrs(s, opts).await;
    }
}

/// Attributes sent with a put or a streamed upload come back from `head`, replaced
/// by the next upload's.
async fn file_attrs(s: &dyn Store, opts: bucketfs_store::WriteOptions) {
    use bucketfs_store::FileAttrs;
    use std::time::{Duration, UNIX_EPOCH};
    let a = FileAttrs {
        mode: Some(0o100750),
        uid: Some(1234),
        gid: Some(5678),
        mtime: Some(UNIX_EPOCH + Duration::new(1_000_000_005, 250_000_000)),
        created_by: Some(bucketfs_store::new_create_tag()),
        foreign: None,
    };
    s.put("attrs/put.bin", Bytes::from_static(b"abc"), PutOpts { attrs: a.clone(), ..Default::default() })
        .await
        .unwrap();
    let h = s.head("attrs/put.bin", HeadOpts::default()).await.unwrap();
    assert_eq!((h.meta.size, &h.attrs), (3, &a), "{}: put with attrs", s.describe());
    let b = FileAttrs { mode: Some(0o100600), ..a };
    let mut w = s
        .writer(
            "attrs/put.bin",
            WriteOptions { put: PutOpts { attrs: b.clone(), ..Default::default() }, ..opts.clone() },
        )
        .await
        .unwrap();
    w.write(Bytes::from_static(b"abcdef")).await.unwrap();
    w.close().await.unwrap();
    let h = s.head("attrs/put.bin", HeadOpts::default()).await.unwrap();
    assert_eq!((h.meta.size, &h.attrs), (6, &b), "{}: writer with attrs", s.describe());
    s.delete("attrs/put.bin").await.unwrap();
    // What another client stored (headers, user metadata of its own) comes back from a
    // HEAD and goes up again with both kinds of upload (a chmod's upload dropped it all).
    let headers = s.describe().starts_with("s3://") || s.describe().starts_with("gs://");
    let theirs = bucketfs_store::attrs::Foreign {
        content_type: Some("text/x-theirs".into()),
        cache_control: Some("max-age=7".into()),
        user: vec![("team".into(), "ml".into())],
        ..Default::default()
    };
    let c = FileAttrs { foreign: theirs.clone().new(), ..b };
    for big in [false, true] {
        let put = PutOpts { attrs: c.clone(), ..Default::default() };
        match big {
            false => drop(s.put("attrs/theirs.bin", Bytes::from_static(b"abc"), put).await.unwrap()),
            true => {
                let mut w = s.writer("attrs/theirs.bin", WriteOptions { put, ..opts.clone() }).await.unwrap();
                w.write(Bytes::from(vec![7u8; opts.part_size + 1])).await.unwrap();
                w.close().await.unwrap();
            }
        }
        let h = s.head("attrs/theirs.bin", HeadOpts::default()).await.unwrap();
        let got = h.attrs.foreign.as_deref().cloned().unwrap_or_default();
        assert_eq!(got.user, theirs.user, "{}: their user metadata (parts: {big})", s.describe());
        if headers {
            let want = (theirs.content_type.as_deref(), theirs.cache_control.as_deref());
            assert_eq!((got.content_type.as_deref(), got.cache_control.as_deref()), want, "{}: {big}", s.describe());
        }
        assert_eq!(h.attrs.mode, c.mode);
    }
    s.delete("attrs/theirs.bin").await.unwrap();
}

/// More parts than one GCS compose call takes (32), so GCS composes in a tree; other stores
/// may merge small parts (S3's minimum part is 5 MiB), but the bytes must come back exact.
/// Temporary parts never show in a listing, even mid-upload.
async fn many_parts(s: &dyn Store) {
    // 64 KiB parts: 1,100 of them (3 compose levels on GCS) in about 70 MB would be slow on
    // a 2-core CI box; 70 parts (2 levels) in 4.4 MB are enough for the tree.
    let part = 64 * 1024;
    let opts = bucketfs_store::WriteOptions { part_size: part, concurrency: 8, ..Default::default() };
    let body: Bytes = (0..(70 * part + 123) as u32).map(|i| (i % 239) as u8).collect::<Vec<_>>().into();
    let mut w = s.writer("many/parts.bin", opts.clone()).await.unwrap();
    for chunk in body.chunks(100_000) {
        w.write(body.slice_ref(chunk)).await.unwrap();
    }
    let root = keys(s, "", true).await;
    assert!(root.iter().all(|k| !k.starts_with(".bucketfs-parts")), "{}: temp parts listed: {root:?}", s.describe());
    let m = w.close().await.unwrap();
    assert_eq!(m.size, body.len() as u64, "{}", s.describe());
    assert_eq!(s.stat("many/parts.bin").await.unwrap().size, body.len() as u64);
    for r in [0..10, part - 5..part + 5, 32 * part - 1..32 * part + 1, body.len() - 200..body.len()] {
        let got = s.get_range("many/parts.bin", r.start as u64..r.end as u64, GetOpts::default()).await.unwrap();
        assert_eq!(got, body.slice(r.clone()), "{}: range {r:?}", s.describe());
    }
    let all = s.get_range("many/parts.bin", 0..body.len() as u64, GetOpts::default()).await.unwrap();
    assert!(all == body, "{}: whole object differs", s.describe());
    // Abort after several parts went up: nothing appears.
    let mut w = s.writer("many/aborted.bin", opts).await.unwrap();
    w.write(body.slice(0..5 * part + 1)).await.unwrap();
    w.abort().await.unwrap();
    assert_eq!(s.stat("many/aborted.bin").await.unwrap_err().kind, StoreErrorKind::NotFound);
    s.delete("many/parts.bin").await.unwrap();
}

/// On an object store, the hidden parts prefix of a conformance run must be empty at the end.
async fn no_parts_left(store_at_parts_prefix: Arc<dyn Store>) {
    let left = keys(store_at_parts_prefix.as_ref(), "", true).await;
    assert!(left.is_empty(), "{}: temporary parts left behind: {left:?}", store_at_parts_prefix.describe());
}

/// The digests a real store reports are the content's: S3's single-PUT ETag is the MD5 in
/// hex; GCS keeps `md5Hash`. (MD5 of "hello" is 5d41402abc4b2a76b9719d911017c592.)
async fn digests(s: &dyn Store, want_etag_md5: bool, want_md5: bool) {
    let hello_md5 = [0x5d, 0x41, 0x40, 0x2a, 0xbc, 0x4b, 0x2a, 0x76, 0xb9, 0x71, 0x9d, 0x91, 0x10, 0x17, 0xc5, 0x92];
    s.put("digests/hello", Bytes::from_static(b"hello"), PutOpts::default()).await.unwrap();
    let d = s.head("digests/hello", HeadOpts { digests: true, ..Default::default() }).await.unwrap();
    assert_eq!(d.meta.size, 5);
    if want_etag_md5 {
        assert_eq!(d.etag.as_deref(), Some("5d41402abc4b2a76b9719d911017c592"), "{}", s.describe());
    }
    if want_md5 {
        assert_eq!(d.md5, Some(hello_md5), "{}", s.describe());
    }
    s.delete("digests/hello").await.unwrap();
}

/// A store over HTTP hands a large range over as it arrives, in several chunks, never
/// whole: a streamed read of a 4 MiB range held in memory would be 4 MiB per request.
async fn streams_in_chunks(s: &dyn Store) {
    let body: Bytes = (0..4u32 << 20).map(|i| (i % 253) as u8).collect::<Vec<_>>().into();
    s.put("streamed.bin", body.clone(), PutOpts::default()).await.unwrap();
    let got: Vec<Bytes> =
        s.get("streamed.bin", 0..body.len() as u64, GetOpts::default()).await.unwrap().try_collect().await.unwrap();
    assert!(got.len() > 1, "{}: 4 MiB came as one chunk", s.describe());
    assert_eq!(got.concat(), body);
    s.delete("streamed.bin").await.unwrap();
}

/// New bytes for a patch, from memory.
struct Source(Bytes);
impl bucketfs_store::PatchSource for Source {
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Bytes> {
        Ok(self.0.slice(offset as usize..offset as usize + len))
    }
}

/// Stores that patch ([`Store::patch`]): an append, and on S3 an edit in the middle, make
/// exactly the new bytes while sending only the changed ones; a patch over a version the key
/// no longer holds is refused and replaces nothing.
async fn patches(s: &dyn Store, middle: bool) {
    use bucketfs_store::{Patch, Patched};
    const M: usize = 1024 * 1024;
    assert!(s.capabilities().patches, "{}", s.describe());
    let base: Bytes = (0..12 * M as u32).map(|i| (i % 253) as u8).collect::<Vec<_>>().into();
    let opts = WriteOptions::default();
    let mut w = s.writer("patched", opts.clone()).await.unwrap();
    w.write(base.clone()).await.unwrap();
    let m0 = w.close().await.unwrap();
    let e0 = m0.etag.clone().expect("an identity");
    let patch = |new: &Bytes, kept: &[std::ops::Range<u64>], base: String, base_len: u64| {
        let (new, kept, opts) = (new.clone(), kept.to_vec(), opts.clone());
        async move {
            let src = Source(new.clone());
            let p = Patch {
                base: &base,
                base_len,
                base_pieces: None,
                len: new.len() as u64,
                kept: &kept,
                source: &src,
                put: PutOpts::default(),
            };
            s.patch("patched", p, opts).await
        }
    };
    // An append: the old object kept, 16 KiB sent.
    let mut v1 = base.to_vec();
    v1.extend((0..16384u32).map(|i| (i % 7) as u8));
    let v1 = Bytes::from(v1);
    let Patched { meta, sent, copied, .. } =
        patch(&v1, &[0..base.len() as u64], e0.clone(), base.len() as u64).await.unwrap();
    assert_eq!((sent, copied), (16384, base.len() as u64), "{}", s.describe());
    assert_eq!(meta.size, v1.len() as u64);
    let e1 = meta.etag.clone().expect("the new identity");
    assert_ne!(e1, e0);
    assert_eq!(s.read("patched").await.unwrap(), v1, "{}: the appended object", s.describe());
    assert_eq!(s.stat("patched").await.unwrap().etag.as_deref(), Some(e1.as_str()));
    // Over a version the key no longer holds: refused, nothing replaced.
    let mut v2 = v1.to_vec();
    v2.extend_from_slice(b"more");
    let v2 = Bytes::from(v2);
    let stale = patch(&v2, &[0..v1.len() as u64], e0.clone(), v1.len() as u64).await.unwrap_err();
    assert_eq!(stale.kind, StoreErrorKind::Changed, "{}: {stale}", s.describe());
    assert_eq!(s.read("patched").await.unwrap(), v1);
    if !middle {
        let at = 6 * M as u64;
        let e = patch(&v1, &[0..at, at + 1..v1.len() as u64], e1.clone(), v1.len() as u64).await.unwrap_err();
        assert_eq!(e.kind, StoreErrorKind::Unsupported, "{}", s.describe());
        return;
    }
    // One byte in the middle: a part around it sent, the rest copied.
    let mut v3 = v1.to_vec();
    let at = 6 * M;
    v3[at] ^= 0xff;
    let v3 = Bytes::from(v3);
    let kept = [0..at as u64, at as u64 + 1..v3.len() as u64];
    let done = patch(&v3, &kept, e1.clone(), v1.len() as u64).await.unwrap();
    assert_eq!(done.sent + done.copied, v3.len() as u64);
    assert!(done.copied >= 6 * M as u64, "{}: copied {}", s.describe(), done.copied);
    assert_eq!(s.read("patched").await.unwrap(), v3, "{}: the edited object", s.describe());
    // A truncation keeps a prefix.
    let v4 = v3.slice(..7 * M);
    let e3 = done.meta.etag.unwrap();
    let done = patch(&v4, &[0..7 * M as u64], e3, v3.len() as u64).await.unwrap();
    assert_eq!((done.sent, done.copied), (0, 7 * M as u64));
    assert_eq!(s.read("patched").await.unwrap(), v4, "{}: the truncated object", s.describe());
    s.delete("patched").await.unwrap();
}

fn required(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ if std::env::var_os("CI").is_some() => panic!("{var} must be set under CI (scripts/test sets it)"),
        _ => {
            eprintln!("skipping: {var} is not set (scripts/test sets it)");
            None
        }
    }
}

fn unique(name: &str) -> String {
    let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("conf-{name}-{n}")
}

#[tokio::test]
async fn memstore_double() {
    conformance(Arc::new(MemStore::new())).await;
    patches(&MemStore::new().with_patches(), true).await;
}

#[tokio::test]
async fn opendal_memory() {
    conformance(location::open(&Location::Memory, &StoreOptions::default()).unwrap()).await;
}

#[tokio::test]
async fn opendal_fs() {
    let dir = std::env::temp_dir().join(unique("fs"));
    std::fs::create_dir_all(&dir).unwrap();
    conformance(location::open(&Location::File { path: dir.clone() }, &StoreOptions::default()).unwrap()).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_local_folder_copy_is_the_same_version() {
    // A local folder names versions by size and mtime: a copy (how a directory is renamed)
    // must keep the mtime, or every file moved would look changed to caches and readers.
    let dir = std::env::temp_dir().join(unique("fs-copy"));
    std::fs::create_dir_all(&dir).unwrap();
    let s = location::open(&Location::File { path: dir.clone() }, &StoreOptions::default()).unwrap();
    s.put("d/f", Bytes::from_static(b"same bytes"), PutOpts::default()).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    s.copy("d/f", "e/f").await.unwrap();
    let (a, b) = (s.stat("d/f").await.unwrap(), s.stat("e/f").await.unwrap());
    assert_eq!((a.size, a.mtime), (b.size, b.mtime));
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_local_folder_writes_file_names_up_to_its_reported_limit() {
    // Writes go through a temporary name longer than the file's own: the limit reported is
    // the longest name a write succeeds with (one byte more fails), so a create of a longer
    // name is refused at once instead of failing at close.
    let dir = std::env::temp_dir().join(unique("fs-names"));
    std::fs::create_dir_all(&dir).unwrap();
    let s = location::open(&Location::File { path: dir.clone() }, &StoreOptions::default()).unwrap();
    let max = s.capabilities().max_file_name_len.expect("the local folder reports a limit");
    s.put(&format!("d/{}", "n".repeat(max)), Bytes::from_static(b"x"), PutOpts::default()).await.unwrap();
    assert!(s.put(&format!("d/{}", "n".repeat(max + 1)), Bytes::from_static(b"x"), PutOpts::default()).await.is_err());
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn minio() {
    let Some(endpoint) = required("BUCKETFS_TEST_S3_ENDPOINT") else { return };
    let bucket = std::env::var("BUCKETFS_TEST_S3_BUCKET").unwrap_or_else(|_| "conformance".into());
    let opts = StoreOptions { endpoint: Some(endpoint), ..StoreOptions::default() };
    let prefix = format!("{}/", unique("s3"));
    let loc = Location::S3 { bucket: bucket.clone(), prefix: prefix.clone() };
    conformance(location::open(&loc, &opts).unwrap()).await;
    streams_in_chunks(location::open(&loc, &opts).unwrap().as_ref()).await;
    digests(location::open(&loc, &opts).unwrap().as_ref(), true, false).await;
    patches(location::open(&loc, &opts).unwrap().as_ref(), true).await;
    let parts = Location::S3 { bucket, prefix: format!("{prefix}.bucketfs-parts/") };
    no_parts_left(location::open(&parts, &opts).unwrap()).await;
}

#[tokio::test]
async fn gcs_emulator() {
    let Some(endpoint) = required("BUCKETFS_TEST_GCS_ENDPOINT") else { return };
    let bucket = std::env::var("BUCKETFS_TEST_GCS_BUCKET").unwrap_or_else(|_| "conformance".into());
    let opts = StoreOptions { endpoint: Some(endpoint), anonymous: true, ..StoreOptions::default() };
    let prefix = format!("{}/", unique("gcs"));
    let loc = Location::Gcs { bucket: bucket.clone(), prefix: prefix.clone() };
    conformance(location::open(&loc, &opts).unwrap()).await;
    streams_in_chunks(location::open(&loc, &opts).unwrap().as_ref()).await;
    digests(location::open(&loc, &opts).unwrap().as_ref(), false, true).await;
    patches(location::open(&loc, &opts).unwrap().as_ref(), false).await;
    a_users_key_under_the_in_place_marker_is_a_plain_key(location::open(&loc, &opts).unwrap().as_ref()).await;
    let parts = Location::Gcs { bucket, prefix: format!("{prefix}.bucketfs-parts/") };
    no_parts_left(location::open(&parts, &opts).unwrap()).await;
}

/// A file of the user's named like the marker of GCS's in-place compose
/// (`.bucketfs-in-place/<key>`), uploaded in parts (joined by compose on an emulator):
/// it lands under its own name, and the key the marker would name is untouched.
async fn a_users_key_under_the_in_place_marker_is_a_plain_key(s: &dyn Store) {
    s.put("m.bin", Bytes::from_static(b"keep me"), PutOpts::default()).await.unwrap();
    let opts = bucketfs_store::WriteOptions { part_size: 5 * 1024 * 1024, concurrency: 2, ..Default::default() };
    let big: Bytes = (0..11 * 1024 * 1024u32).map(|i| (i % 239) as u8).collect::<Vec<_>>().into();
    let mut w = s.writer(".bucketfs-in-place/m.bin", opts).await.unwrap();
    for chunk in big.chunks(1 << 20) {
        w.write(Bytes::copy_from_slice(chunk)).await.unwrap();
    }
    assert_eq!(w.close().await.unwrap().size, big.len() as u64);
    assert_eq!(s.stat(".bucketfs-in-place/m.bin").await.unwrap().size, big.len() as u64);
    let kept = s.get_range("m.bin", 0..7, GetOpts::default()).await.unwrap();
    assert_eq!(&kept[..], b"keep me", "{}: the marker's key was written", s.describe());
    for k in ["m.bin", ".bucketfs-in-place/m.bin"] {
        s.delete(k).await.unwrap();
    }
}

/// A new folder in the Drive emulator's My Drive (through its test-control API).
async fn drive_folder(endpoint: &str, name: &str) -> String {
    let body = serde_json::json!({"name": name, "mimeType": "application/vnd.google-apps.folder"});
    let r =
        reqwest::Client::new().post(format!("{endpoint}/_control/seed")).body(body.to_string()).send().await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    v["id"].as_str().expect("seeded folder id").to_string()
}

#[tokio::test]
async fn drive_emulator() {
    let Some(endpoint) = required("BUCKETFS_TEST_DRIVE_ENDPOINT") else { return };
    let folder = drive_folder(&endpoint, &unique("drive")).await;
    let opts = StoreOptions { endpoint: Some(endpoint), ..StoreOptions::default() };
    let loc = Location::Gdrive { folder };
    conformance(location::open(&loc, &opts).unwrap()).await;
    streams_in_chunks(location::open(&loc, &opts).unwrap().as_ref()).await;
    digests(location::open(&loc, &opts).unwrap().as_ref(), false, true).await;
}

/// The store `cp` opens (S3 with crc32c checksums the server confirms) passes the same
/// conformance suite: copy, rename and the multipart writer all still work.
#[tokio::test]
async fn minio_crc32c() {
    let Some(endpoint) = required("BUCKETFS_TEST_S3_ENDPOINT") else { return };
    let bucket = std::env::var("BUCKETFS_TEST_S3_BUCKET").unwrap_or_else(|_| "conformance".into());
    let opts = StoreOptions { endpoint: Some(endpoint), s3_crc32c: true, ..StoreOptions::default() };
    let loc = Location::S3 { bucket, prefix: format!("{}/", unique("s3crc")) };
    conformance(location::open(&loc, &opts).unwrap()).await;
}

/// `cp`'s store asks HEADs for the object's checksum, with the header signed (MinIO checks
/// the signature): it reports the crc32c the uploads carried, of the whole object for a
/// put and COMPOSITE (`-N`, the crc32c of the parts' crc32cs) for a multipart upload. A
/// store opened without the option reports none.
#[tokio::test]
async fn minio_reports_object_checksums() {
    let Some(endpoint) = required("BUCKETFS_TEST_S3_ENDPOINT") else { return };
    let bucket = std::env::var("BUCKETFS_TEST_S3_BUCKET").unwrap_or_else(|_| "conformance".into());
    let opts =
        StoreOptions { endpoint: Some(endpoint), s3_crc32c: true, s3_checksum_mode: true, ..StoreOptions::default() };
    let loc = Location::S3 { bucket, prefix: format!("{}/", unique("s3sum")) };
    let s = location::open(&loc, &opts).unwrap();
    s.put("one", Bytes::from_static(b"hello"), PutOpts::default()).await.unwrap();
    let sum =
        s.head("one", HeadOpts { digests: true, ..Default::default() }).await.unwrap().checksum.expect("a checksum");
    assert_eq!((sum.algorithm.as_str(), sum.parts), ("crc32c", None));
    assert_eq!(sum.digest, crc32c::crc32c(b"hello").to_be_bytes());

    let part = 5usize << 20;
    let data: Vec<u8> = (0..(11u32 << 20)).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut w = s
        .writer("three", bucketfs_store::WriteOptions { part_size: part, concurrency: 2, ..Default::default() })
        .await
        .unwrap();
    w.write(Bytes::from(data.clone())).await.unwrap();
    w.close().await.unwrap();
    let sum =
        s.head("three", HeadOpts { digests: true, ..Default::default() }).await.unwrap().checksum.expect("a checksum");
    let parts: Vec<u8> = data.chunks(part).flat_map(|c| crc32c::crc32c(c).to_be_bytes()).collect();
    assert_eq!((sum.algorithm.as_str(), sum.parts, sum.kind.as_deref()), ("crc32c", Some(3), Some("COMPOSITE")));
    assert_eq!(sum.digest, crc32c::crc32c(&parts).to_be_bytes());

    let plain = StoreOptions { s3_checksum_mode: false, ..opts };
    let d = location::open(&loc, &plain)
        .unwrap()
        .head("one", HeadOpts { digests: true, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(d.checksum, None, "asked only with s3_checksum_mode");
    s.delete("one").await.unwrap();
    s.delete("three").await.unwrap();
}

/// Flips one byte of the body of the next `left` upload requests that carry a crc32c,
/// after OpenDAL computed it: what corruption on the way to the server looks like.
struct Corrupt {
    inner: opendal::HttpTransporter,
    left: Arc<std::sync::atomic::AtomicUsize>,
}

impl opendal::HttpTransport for Corrupt {
    async fn fetch(
        &self,
        mut req: http::Request<opendal::Buffer>,
    ) -> opendal::Result<http::Response<opendal::HttpBody>> {
        use std::sync::atomic::Ordering::SeqCst;
        let has_crc = req.headers().contains_key("x-amz-checksum-crc32c") && !req.body().is_empty();
        if has_crc && self.left.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok() {
            let mut body = req.body().to_vec();
            let mid = body.len() / 2;
            body[mid] ^= 0x40;
            *req.body_mut() = opendal::Buffer::from(body);
        }
        self.inner.fetch(req).await
    }
}

/// A part corrupted on the way is refused by MinIO (it checks x-amz-checksum-crc32c) and
/// sent again; corrupted every time, the upload fails with a crc32c mismatch.
#[tokio::test]
async fn minio_catches_a_corrupted_part() {
    let Some(endpoint) = required("BUCKETFS_TEST_S3_ENDPOINT") else { return };
    let bucket = std::env::var("BUCKETFS_TEST_S3_BUCKET").unwrap_or_else(|_| "conformance".into());
    let prefix = unique("s3corrupt");
    let open = |left: Arc<std::sync::atomic::AtomicUsize>| {
        let b = opendal::services::S3::default()
            .bucket(&bucket)
            .root(&format!("/{prefix}/"))
            .region("us-east-1")
            .endpoint(&endpoint)
            .disable_ec2_metadata()
            .checksum_algorithm("crc32c");
        let op = opendal::Operator::new(b).unwrap();
        let corrupt = Corrupt { inner: op.context().http_transport().clone(), left };
        let ctx = op.context().with_http_transport(opendal::HttpTransporter::new(corrupt));
        let op = op.with_context(ctx);
        let op =
            bucketfs_store::s3::checksum::confirmed(op).layer(opendal::layers::RetryLayer::new().with_max_times(2));
        bucketfs_store::opendal_store::OpendalStore::new(op, "minio".into(), true)
    };
    let data: Vec<u8> = (0..(11u32 << 20)).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let upload = |s: bucketfs_store::opendal_store::OpendalStore, data: Vec<u8>| async move {
        let opts = bucketfs_store::WriteOptions { part_size: 5 << 20, concurrency: 2, ..Default::default() };
        let mut w = s.writer("big", opts).await?;
        w.write(Bytes::from(data)).await?;
        w.close().await
    };
    let once = Arc::new(std::sync::atomic::AtomicUsize::new(1));
    let s = open(once.clone());
    let meta = upload(s.clone(), data.clone()).await.expect("a part corrupted once is sent again");
    assert_eq!(once.load(std::sync::atomic::Ordering::SeqCst), 0, "one part was corrupted");
    assert_eq!(meta.size, data.len() as u64);
    assert_eq!(
        s.get_range("big", 0..data.len() as u64, GetOpts::default()).await.unwrap(),
        data,
        "the object is the data sent"
    );
    let e = s.put("small", Bytes::from_static(b"hello"), PutOpts::default()).await;
    assert!(e.is_ok(), "{e:?}");

    let always = open(Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX)));
    let e = upload(always.clone(), data.clone()).await.expect_err("every part corrupted");
    assert!(e.to_string().contains("crc32c mismatch"), "{e}");
    let e = always.put("small2", Bytes::from_static(b"hello"), PutOpts::default()).await.expect_err("a corrupted put");
    assert!(e.to_string().contains("crc32c mismatch"), "{e}");
    assert_eq!(s.stat("small2").await.unwrap_err().kind, StoreErrorKind::NotFound);
    s.delete("big").await.unwrap();
    s.delete("small").await.unwrap();
}
