//! Unit tests of the local side of `cp`: a source that changes while it is read
//! ([`super::source`], and the upload that must then leave no object), and what a `-r` walk
//! copies and skips ([`super::walk`]).

use std::ops::Range;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bucketfs_store::testing::MemStore;
use bucketfs_store::{
    ByteStream, Capabilities, GetOpts, HeadOpts, ListStream, ObjectHead, ObjectMeta, ObjectWriter, PutOpts, Store,
    StoreError, StoreExt, WriteOptions,
};
use bytes::Bytes;

use super::endpoint::{Kind, Remote, Side};
use super::plan::{self, Dst, Job, Src};
use super::progress::Progress;
use super::source::{Change, LocalSource, SourceError};
use super::walk::{SkipReason, Walk};
use super::{upload, CpError, Ctx};

fn temp_dir(name: &str) -> PathBuf {
    let n = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos();
    let d = std::env::temp_dir().join(format!("bucketfs-cp-local-{name}-{n}"));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn change_of(e: SourceError) -> Change {
    match e {
        SourceError::Changed(c) => c.change,
        SourceError::Io { err, .. } => panic!("an I/O error, not a change: {err}"),
    }
}

/// Read all of `s` in 1000-byte reads.
fn drain(s: &mut LocalSource) -> Result<u64, SourceError> {
    let mut buf = vec![0u8; 1000];
    let mut n = 0;
    while s.remaining() > 0 {
        n += s.read_into(&mut buf)? as u64;
    }
    Ok(n)
}

#[test]
fn a_source_that_stays_the_same_is_read_whole() {
    let d = temp_dir("same");
    std::fs::write(d.join("f"), vec![7u8; 2500]).unwrap();
    let mut s = LocalSource::open(&d.join("f")).unwrap();
    assert_eq!(drain(&mut s).unwrap(), 2500);
    s.finish().unwrap();
}

#[test]
fn every_kind_of_change_is_seen() {
    let d = temp_dir("changes");
    let f = d.join("f");
    let fresh = || {
        std::fs::write(&f, vec![1u8; 3000]).unwrap();
        LocalSource::open(&f).unwrap()
    };

    // Truncated while read: the read that ends early says so.
    let mut s = fresh();
    let mut buf = vec![0u8; 1000];
    s.read_into(&mut buf).unwrap();
    std::fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(1500).unwrap();
    let e = drain(&mut s).unwrap_err();
    assert_eq!(change_of(e), Change::Truncated { size: 3000, got: 1500, now: Some(1500) });

    // Grew: read up to the size at the start, then the probe finds more.
    let mut s = fresh();
    drain(&mut s).unwrap();
    std::io::Write::write_all(&mut std::fs::OpenOptions::new().append(true).open(&f).unwrap(), b"more").unwrap();
    assert_eq!(change_of(s.finish().unwrap_err()), Change::Grew { size: 3000 });

    // Rewritten in place, same size: a new mtime.
    let mut s = fresh();
    drain(&mut s).unwrap();
    let w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&w, b"new", 0).unwrap();
    w.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1000)).unwrap();
    assert_eq!(change_of(s.finish().unwrap_err()), Change::Modified);

    // Replaced (renamed over) and removed: the path no longer names what was read.
    let mut s = fresh();
    drain(&mut s).unwrap();
    std::fs::write(d.join("g"), vec![1u8; 3000]).unwrap();
    std::fs::rename(d.join("g"), &f).unwrap();
    assert_eq!(change_of(s.finish().unwrap_err()), Change::Replaced);
    let mut s = fresh();
    drain(&mut s).unwrap();
    std::fs::remove_file(&f).unwrap();
    assert_eq!(change_of(s.finish().unwrap_err()), Change::Removed);
}

/// A memory store that calls `meddle` once, when an upload's writer is opened (by then the
/// reader has read the first parts and is reading on).
struct Meddle {
    inner: Arc<MemStore>,
    meddle: Box<dyn Fn() + Send + Sync>,
}

#[async_trait]
impl Store for Meddle {
    fn describe(&self) -> String {
        "meddle".into()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn check(&self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn head(&self, key: &str, opts: HeadOpts) -> Result<ObjectHead, StoreError> {
        self.inner.head(key, opts).await
    }
    async fn get(&self, key: &str, r: Range<u64>, opts: GetOpts<'_>) -> Result<ByteStream, StoreError> {
        self.inner.get(key, r, opts).await
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
        (self.meddle)();
        self.inner.writer(key, opts).await
    }
}

async fn upload_while(name: &str, meddle: impl Fn(&Path) + Send + Sync + 'static) -> (String, Arc<MemStore>) {
    let d = temp_dir(name);
    let f = d.join("src");
    std::fs::write(&f, vec![3u8; 64 * 4096]).unwrap();
    let mem = Arc::new(MemStore::new());
    let g = f.clone();
    let store = Arc::new(Meddle { inner: mem.clone(), meddle: Box::new(move || meddle(&g)) });
    let r = Remote { store, kind: Kind::Other, base: "mem://".into(), key: "obj".into(), crc_confirmed: false };
    let mut ctx = Ctx::new(4, Some(4096), 3, Progress::quiet());
    ctx.backoff_base = Duration::from_millis(1);
    let e = upload::upload(&ctx, upload::Source::File(&f), Some(64 * 4096), &r).await.unwrap_err();
    assert!(matches!(e, CpError::Changed(_)), "a changed source is its own case: {e:?}");
    (e.to_string(), mem)
}

#[tokio::test]
async fn an_upload_whose_source_changes_fails_and_leaves_no_object() {
    let truncate = |f: &Path| std::fs::OpenOptions::new().write(true).open(f).unwrap().set_len(20 * 4096).unwrap();
    let (e, mem) = upload_while("trunc", truncate).await;
    assert!(e.contains("changed during the copy") && e.contains("truncated"), "{e}");
    assert!(mem.stat("obj").await.is_err(), "a truncated source left an object");

    let rewrite = |f: &Path| {
        let w = std::fs::OpenOptions::new().write(true).open(f).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&w, b"new bytes", 0).unwrap();
        w.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1000)).unwrap();
    };
    let (e, mem) = upload_while("rewrite", rewrite).await;
    assert!(e.contains("changed during the copy") && e.contains("modification time"), "{e}");
    assert!(mem.stat("obj").await.is_err(), "a rewritten source left an object");
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// (relative destination key, is a marker) of each job, and (path below `tree`, reason) of
/// each skip.
type Walked = (Vec<(String, bool)>, Vec<(String, SkipReason)>);

async fn walk(tree: &Path, follow_symlinks: bool) -> Walked {
    let r = Remote {
        store: Arc::new(MemStore::new()),
        kind: Kind::Other,
        base: "mem://".into(),
        key: "up/".into(),
        crc_confirmed: false,
    };
    let walk = Walk { recursive: true, follow_symlinks };
    let out = plan::expand(vec![Side::Local(tree.to_path_buf())], Side::Remote(r), walk).await.unwrap();
    let mut jobs: Vec<(String, bool)> = out
        .jobs
        .iter()
        .map(|j| match &j.dst {
            Dst::Remote(r) => (r.key.clone(), matches!(j.src, Src::Dir)),
            _ => panic!("a remote destination"),
        })
        .collect();
    jobs.sort();
    let skipped =
        out.skipped.into_iter().map(|s| (s.path.strip_prefix(tree).unwrap().display().to_string(), s.reason)).collect();
    (jobs, skipped)
}

#[tokio::test]
async fn a_tree_walk_follows_links_makes_markers_and_says_what_it_skips() {
    let d = temp_dir("walk");
    let t = d.join("t");
    std::fs::create_dir_all(t.join("sub")).unwrap();
    std::fs::create_dir_all(t.join("empty")).unwrap();
    std::fs::create_dir_all(t.join("only-fifo")).unwrap();
    std::fs::write(t.join("a"), b"a").unwrap();
    std::fs::write(t.join("sub/b"), b"b").unwrap();
    symlink("a", t.join("la")).unwrap();
    symlink("nowhere", t.join("dangling")).unwrap();
    symlink("..", t.join("sub/up")).unwrap();
    mkfifo(&t.join("only-fifo/p"));

    let (jobs, skipped) = walk(&t, true).await;
    let want: Vec<(String, bool)> =
        [("up/t/a", false), ("up/t/empty", true), ("up/t/la", false), ("up/t/only-fifo", true), ("up/t/sub/b", false)]
            .iter()
            .map(|(k, m)| (k.to_string(), *m))
            .collect();
    assert_eq!(jobs, want);
    assert_eq!(
        skipped,
        vec![
            ("dangling".to_string(), SkipReason::Dangling { target: "nowhere".into() }),
            ("only-fifo/p".to_string(), SkipReason::Fifo),
            ("sub/up".to_string(), SkipReason::Loop { ancestor: t.clone() }),
        ]
    );
    assert!(skipped[2].1.to_string().starts_with("symlink loop"), "{}", skipped[2].1);

    let (jobs, skipped) = walk(&t, false).await;
    assert_eq!(jobs.iter().filter(|(_, m)| !m).count(), 2, "{jobs:?}");
    let names: Vec<&str> = skipped.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(names, ["dangling", "la", "only-fifo/p", "sub/up"]);
    assert!(matches!(skipped[1].1, SkipReason::NotFollowed { .. }));
}

#[tokio::test]
async fn only_empty_directory_markers_are_made_on_the_other_side() {
    let mem = Arc::new(MemStore::new());
    mem.put("p/a/x", Bytes::from_static(b"x"), PutOpts::default()).await.unwrap();
    mem.create_dir("p/a/").await.unwrap(); // a mount's mkdir, then a file in it
    mem.create_dir("p/e/").await.unwrap(); // an empty directory
    let r = Remote { store: mem, kind: Kind::Other, base: "mem://".into(), key: "p".into(), crc_confirmed: false };
    let d = temp_dir("markers");
    let walk = Walk { recursive: true, follow_symlinks: true };
    let out = plan::expand(vec![Side::Remote(r)], Side::Local(d.join("out")), walk).await.unwrap();
    let jobs: Vec<(PathBuf, bool)> = out
        .jobs
        .iter()
        .map(|j| match &j.dst {
            Dst::Local(p) => (p.strip_prefix(&d).unwrap().to_path_buf(), matches!(j.src, Src::Dir)),
            _ => panic!("a local destination"),
        })
        .collect();
    assert_eq!(jobs, [(PathBuf::from("out/a/x"), false), (PathBuf::from("out/e"), true)]);
}

/// Where each job of a download writes, relative to `base`.
fn local_targets(jobs: &[plan::Job], base: &Path) -> Vec<PathBuf> {
    let target = |j: &plan::Job| match &j.dst {
        Dst::Local(p) => p.strip_prefix(base).unwrap().to_path_buf(),
        _ => panic!("a local destination"),
    };
    jobs.iter().map(target).collect()
}

/// A key that is not a safe local path is skipped and named; the rest of the prefix is
/// still copied (one such key used to fail the whole `cp -r`).
#[tokio::test]
async fn unsafe_keys_are_skipped_and_the_rest_is_copied() {
    let mem = Arc::new(MemStore::new());
    for k in ["p/ok", "p/x//y", "p/../evil", "p/a/./b", "p/sub/z"] {
        mem.put(k, Bytes::from_static(b"v"), PutOpts::default()).await.unwrap();
    }
    let r = Remote { store: mem, kind: Kind::Other, base: "mem://".into(), key: "p".into(), crc_confirmed: false };
    let d = temp_dir("unsafe-keys");
    let walk = Walk { recursive: true, follow_symlinks: true };
    let out = plan::expand(vec![Side::Remote(r)], Side::Local(d.join("out")), walk).await.unwrap();
    let mut jobs = local_targets(&out.jobs, &d);
    jobs.sort();
    assert_eq!(jobs, [PathBuf::from("out/ok"), PathBuf::from("out/sub/z")]);
    let mut skipped: Vec<String> = out.skipped.iter().map(|s| s.path.display().to_string()).collect();
    skipped.sort();
    assert_eq!(skipped, ["mem://p/../evil", "mem://p/a/./b", "mem://p/x//y"]);
    assert!(out.skipped.iter().all(|s| s.reason == SkipReason::UnsafeKey));
}

/// The destination keys of `jobs`, all to a store.
fn remote_keys(jobs: &[Job]) -> Vec<String> {
    let key = |j: &Job| match &j.dst {
        Dst::Remote(r) => r.key.clone(),
        _ => panic!("a remote destination"),
    };
    jobs.iter().map(key).collect()
}

/// Local names the store would change (OpenDAL trims whitespace at a key's ends) are
/// skipped and named: `x `, `x\t` and `x` all landed on `x`, the last one winning, and
/// the copy said three files verified.
#[tokio::test]
async fn names_the_store_would_trim_are_skipped_not_written_over_another() {
    let d = temp_dir("trimmed-names");
    let src = d.join("t");
    std::fs::create_dir_all(&src).unwrap();
    for (n, v) in [("x", "AAA"), ("x ", "BBB"), ("x\t", "CCC"), (" y", "DDD")] {
        std::fs::write(src.join(n), v).unwrap();
    }
    let mem = Arc::new(MemStore::new().trimming_whitespace());
    let r = Remote { store: mem, kind: Kind::Other, base: "mem://".into(), key: "p/".into(), crc_confirmed: false };
    let walk = Walk { recursive: true, follow_symlinks: true };
    let out = plan::expand(vec![Side::Local(src.clone())], Side::Remote(r), walk).await.unwrap();
    let keys = remote_keys(&out.jobs);
    assert_eq!(keys, ["p/t/ y", "p/t/x"], "whitespace inside a key is kept");
    let mut skipped: Vec<PathBuf> =
        out.skipped.iter().map(|s| s.path.strip_prefix(&src).unwrap().to_path_buf()).collect();
    skipped.sort();
    assert_eq!(skipped, [PathBuf::from("x\t"), PathBuf::from("x ")]);
    assert!(out.skipped.iter().all(|s| s.reason == SkipReason::UnaddressableKey));
}

/// A local name ending in `__XLDIR__` is skipped and named on an object store: MinIO
/// stored `report__XLDIR__` as the marker of `report/`, and `cp -r` exited 0 with the
/// bytes gone (down again: an empty directory `report`).
#[tokio::test]
async fn names_minio_keeps_as_directory_markers_are_skipped() {
    let d = temp_dir("xldir-names");
    let src = d.join("t");
    std::fs::create_dir_all(src.join("d__XLDIR__")).unwrap();
    for (n, v) in [("report__XLDIR__", "AAA"), ("d__XLDIR__/x", "BBB"), ("ok", "CCC")] {
        std::fs::write(src.join(n), v).unwrap();
    }
    let mem = Arc::new(MemStore::new());
    let r = Remote { store: mem, kind: Kind::Other, base: "mem://".into(), key: "p/".into(), crc_confirmed: false };
    let walk = Walk { recursive: true, follow_symlinks: true };
    let out = plan::expand(vec![Side::Local(src.clone())], Side::Remote(r), walk).await.unwrap();
    let keys = remote_keys(&out.jobs);
    assert_eq!(keys, ["p/t/ok"]);
    let mut skipped: Vec<PathBuf> =
        out.skipped.iter().map(|s| s.path.strip_prefix(&src).unwrap().to_path_buf()).collect();
    skipped.sort();
    assert_eq!(skipped, [PathBuf::from("d__XLDIR__/x"), PathBuf::from("report__XLDIR__")]);
    assert!(out.skipped.iter().all(|s| s.reason == SkipReason::MarkerName));
}

/// A listed key the store's client would change (`dup ` read as `dup`) is skipped and
/// named: the download gave the local `dup ` the bytes of the object `dup`.
#[tokio::test]
async fn keys_the_store_would_trim_are_not_read_as_another() {
    let mem = Arc::new(MemStore::new().trimming_whitespace());
    for k in ["p/dup", "p/dup ", "p/only\t"] {
        mem.put(k, Bytes::from_static(b"v"), PutOpts::default()).await.unwrap();
    }
    let r = Remote { store: mem, kind: Kind::Other, base: "mem://".into(), key: "p".into(), crc_confirmed: false };
    let d = temp_dir("trimmed-keys");
    let walk = Walk { recursive: true, follow_symlinks: true };
    let out = plan::expand(vec![Side::Remote(r)], Side::Local(d.join("out")), walk).await.unwrap();
    assert_eq!(local_targets(&out.jobs, &d), [PathBuf::from("out/dup")]);
    let mut skipped: Vec<String> = out.skipped.iter().map(|s| s.path.display().to_string()).collect();
    skipped.sort();
    assert_eq!(skipped, ["mem://p/dup ", "mem://p/only\t"]);
    assert!(out.skipped.iter().all(|s| s.reason == SkipReason::UnaddressableKey));
}

/// A source prefix whose last segment is `..` (`s3://b/t/..`, a key prefix like any other on
/// an object store) copies its keys into the destination, never into its parent.
#[tokio::test]
async fn a_source_named_dot_dot_never_leads_out_of_the_destination() {
    let mem = Arc::new(MemStore::new());
    mem.put("t/../x", Bytes::from_static(b"v"), PutOpts::default()).await.unwrap();
    let r = Remote { store: mem, kind: Kind::Other, base: "mem://".into(), key: "t/..".into(), crc_confirmed: false };
    let d = temp_dir("dot-dot-source");
    std::fs::create_dir(d.join("out")).unwrap();
    let walk = Walk { recursive: true, follow_symlinks: true };
    let out = plan::expand(vec![Side::Remote(r)], Side::Local(d.join("out")), walk).await.unwrap();
    let jobs = local_targets(&out.jobs, &d);
    assert_eq!(jobs, [PathBuf::from("out/x")]);
}

/// A store-to-store copy of keys the store's client rewrites (`p/x//y` reaches `p/x/y`,
/// `/abs` reaches `abs`): skipped and named. Before, both jobs read `p/x/y` and wrote
/// `q/p/x/y`; `p/x//y` was never copied and cp counted two files.
#[tokio::test]
async fn keys_the_store_would_rewrite_are_not_copied_as_another() {
    let mem = Arc::new(MemStore::new().trimming_whitespace());
    for k in ["p/x/y", "p/x//y"] {
        mem.put(k, Bytes::from_static(b"v"), PutOpts::default()).await.unwrap();
    }
    let remote = |key: &str| Remote {
        store: mem.clone(),
        kind: Kind::Other,
        base: "mem://".into(),
        key: key.into(),
        crc_confirmed: false,
    };
    let walk = Walk { recursive: true, follow_symlinks: true };
    let out = plan::expand(vec![Side::Remote(remote("p"))], Side::Remote(remote("q/")), walk).await.unwrap();
    let pairs: Vec<(String, String)> = out
        .jobs
        .iter()
        .map(|j| match (&j.src, &j.dst) {
            (Src::Remote { remote, .. }, Dst::Remote(r)) => (remote.key.clone(), r.key.clone()),
            _ => panic!("store to store"),
        })
        .collect();
    assert_eq!(pairs, [("p/x/y".to_string(), "q/p/x/y".to_string())]);
    let skipped: Vec<String> = out.skipped.iter().map(|s| s.path.display().to_string()).collect();
    assert_eq!(skipped, ["mem://p/x//y"]);
    assert!(out.skipped.iter().all(|s| s.reason == SkipReason::UnaddressableKey));
}
