//! Unit tests of the operations against the in-memory store.

use super::*;
use bucketfs_store::testing::MemStore;
use bucketfs_store::{GetOpts, PutOpts, StoreExt};
use bytes::Bytes;
use std::sync::atomic::Ordering;

async fn fs_with(keys: &[(&str, &[u8])]) -> (Arc<MemStore>, Arc<Fs>) {
    let store = mem_with(keys).await;
    let fs = Fs::new(store.clone(), FsConfig::default());
    (store, fs)
}

/// A memory store holding `keys`.
async fn mem_with(keys: &[(&str, &[u8])]) -> Arc<MemStore> {
    let store = Arc::new(MemStore::new());
    for (k, v) in keys {
        store.put(k, Bytes::copy_from_slice(v), PutOpts::default()).await.unwrap();
    }
    store
}

async fn names(fs: &Fs, ino: u64) -> Vec<String> {
    let fh = fs.opendir(ino).await.unwrap();
    let v = fs.readdir(fh).unwrap().iter().map(|e| e.name.clone()).collect();
    fs.releasedir(fh);
    v
}

#[tokio::test]
async fn implicit_and_marker_dirs_both_appear() {
    let (_, fs) = fs_with(&[("a/b/c.txt", b"hi"), ("m/", b""), ("top", b"12345")]).await;
    assert_eq!(names(&fs, ROOT_INO).await, [".", "..", "a", "m", "top"]);
    let a = fs.lookup(ROOT_INO, "a").await.unwrap();
    assert_eq!(a.kind, Kind::Dir);
    let m = fs.lookup(ROOT_INO, "m").await.unwrap();
    assert_eq!(m.kind, Kind::Dir);
    assert_eq!(names(&fs, m.ino).await, [".", ".."]);
    let top = fs.lookup(ROOT_INO, "top").await.unwrap();
    assert_eq!((top.kind, top.size), (Kind::File, 5));
}

#[tokio::test]
async fn lookup_without_listing_finds_files_dirs_and_markers() {
    let (_, fs) = fs_with(&[("a/b/c.txt", b"hi"), ("m/", b""), ("top", b"12345")]).await;
    assert_eq!(fs.lookup(ROOT_INO, "a").await.unwrap().kind, Kind::Dir);
    assert_eq!(fs.lookup(ROOT_INO, "m").await.unwrap().kind, Kind::Dir);
    assert_eq!(fs.lookup(ROOT_INO, "top").await.unwrap().kind, Kind::File);
    assert!(matches!(fs.lookup(ROOT_INO, "nope").await, Err(FsError::NotFound)));
}

/// A name that starts a sibling directory's name (`log` beside `logs/`), found by its
/// probe before anything lists its directory: the listing sends `logs/` before the file
/// `log` (a page's prefixes first, as S3 and GCS do). It was not found, so `>>` replaced it.
#[tokio::test]
async fn a_name_beside_a_longer_directory_is_found_before_any_listing() {
    let keys: &[(&str, &[u8])] = &[
        ("log", b"line1\n"),
        ("logs/old.gz", b"z"),
        ("lib.rclonelink", b"lib64"),
        ("lib64/a", b"a"),
        ("d", b"1234"),
        ("d/x", b"x"),
        ("d0/y", b"y"),
        ("s/report", b"r"),
        ("s/reports/r1", b"r"),
    ];
    let store = mem_with(keys).await;
    let fs = Fs::new(store.clone(), FsConfig { list_ahead_keys: 0, ..FsConfig::default() });
    let log = fs.lookup(ROOT_INO, "log").await.unwrap();
    assert_eq!((log.kind, log.size), (Kind::File, 6));
    assert_eq!(fs.lookup(ROOT_INO, "lib").await.unwrap().kind, Kind::Symlink);
    assert_eq!(fs.lookup(ROOT_INO, "d").await.unwrap().kind, Kind::Dir, "a directory wins over a file");
    let s = fs.lookup(ROOT_INO, "s").await.unwrap();
    assert_eq!(fs.lookup(s.ino, "report").await.unwrap().kind, Kind::File);
    assert!(matches!(fs.lookup(ROOT_INO, "lo").await, Err(FsError::NotFound)));
    assert!(matches!(fs.mkdir(ROOT_INO, "log", Some(0o755)).await, Err(FsError::Exists)), "mkdir over the file");
}

/// `bucketfs sync` on a mount without write-back: a file whose close failed to upload
/// (the store down) is still staged; sync uploads it now, or names it while it cannot.
#[tokio::test]
async fn sync_uploads_a_file_whose_close_failed_or_names_it() {
    use bucketfs_store::testing::{FailStore, Op};
    let mem = Arc::new(MemStore::new());
    let down = |inner: Arc<dyn bucketfs_store::Store>, op| {
        Arc::new(FailStore::new(inner, op, 1, 2, bucketfs_store::StoreErrorKind::Unavailable))
    };
    let store = down(down(mem.clone(), Op::Put), Op::Upload);
    let fs = Fs::new(store, FsConfig::default());
    let _ = names(&fs, ROOT_INO).await;
    let (_, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
    fs.write(fh, 0, b"data").await.unwrap();
    assert!(fs.flush(fh).await.is_err(), "the close's upload fails");
    fs.release(fh).await.ok();
    assert!(mem.stat("f").await.is_err());
    let first = fs.sync_closed().await;
    let second = if first.is_empty() { Vec::new() } else { fs.sync_closed().await };
    assert!(first.iter().chain(&second).all(|(k, _)| k == "f"), "{first:?} {second:?}");
    assert!(second.is_empty(), "uploaded once the store takes it: {second:?}");
    let got = crate::write_back::tests::object(mem.as_ref(), "f").await;
    assert_eq!(got.as_deref(), Some(&b"data"[..]));
}

#[tokio::test]
async fn invalid_keys_are_skipped_and_never_escape() {
    let (_, fs) = fs_with(&[
        ("x//y", b"1"),
        ("../evil", b"1"),
        ("./dot", b"1"),
        ("a/../b", b"1"),
        ("ok", b"1"),
        (&format!("{}/f", "n".repeat(300)), b"1"),
    ])
    .await;
    // `x/` holds only an empty-segment key, `a/` only a `..` key: they list as empty dirs.
    assert_eq!(names(&fs, ROOT_INO).await, [".", "..", "a", "ok", "x"]);
    let x = fs.lookup(ROOT_INO, "x").await.unwrap();
    assert_eq!(names(&fs, x.ino).await, [".", ".."]);
    let a = fs.lookup(ROOT_INO, "a").await.unwrap();
    assert_eq!(names(&fs, a.ino).await, [".", ".."]);
    assert!(matches!(fs.lookup(ROOT_INO, "..").await, Err(FsError::NotFound)));
    assert!(matches!(fs.lookup(ROOT_INO, &"n".repeat(300)).await, Err(FsError::NameTooLong)));
}

#[tokio::test]
async fn directory_shadows_file_of_same_name() {
    let (_, fs) = fs_with(&[("k", b"file"), ("k/inner", b"x")]).await;
    assert_eq!(fs.lookup(ROOT_INO, "k").await.unwrap().kind, Kind::Dir);
    assert_eq!(names(&fs, ROOT_INO).await, [".", "..", "k"]);
    let k = fs.lookup(ROOT_INO, "k").await.unwrap();
    assert_eq!(k.kind, Kind::Dir);
}

#[tokio::test]
async fn a_fresh_listing_answers_lookups_without_requests() {
    let keys: Vec<(String, Vec<u8>)> = (0..50).map(|i| (format!("d/f{i}"), vec![1u8; i])).collect();
    let refs = refs(&keys);
    let (store, fs) = fs_with(&refs).await;
    let d = fs.lookup(ROOT_INO, "d").await.unwrap();
    names(&fs, d.ino).await;
    let before = store.requests.load(Ordering::Relaxed);
    for i in 0..50 {
        assert_eq!(fs.lookup(d.ino, &format!("f{i}")).await.unwrap().size, i as u64);
    }
    assert!(matches!(fs.lookup(d.ino, "missing").await, Err(FsError::NotFound)));
    assert_eq!(store.requests.load(Ordering::Relaxed), before, "listing cache must answer lookups");
}

/// A memory store holding `f` = "old", a mount of it with a 50 ms TTL on a manual clock,
/// and `f` looked up.
async fn old_f_with_ttl_50ms() -> (Arc<MemStore>, crate::Clock, Arc<Fs>, Attr) {
    let store = mem_with(&[("f", b"old")]).await;
    let clock = crate::Clock::manual();
    let cfg = FsConfig { metadata_ttl: Duration::from_millis(50), clock: clock.clone(), ..FsConfig::default() };
    let fs = Fs::new(store.clone(), cfg);
    let f = fs.lookup(ROOT_INO, "f").await.unwrap();
    (store, clock, fs, f)
}

#[tokio::test]
async fn getattr_and_open_see_a_changed_object_after_the_ttl() {
    let (store, clock, fs, f) = old_f_with_ttl_50ms().await;
    store.put("f", Bytes::from_static(b"newer"), PutOpts::default()).await.unwrap();
    assert_eq!(fs.getattr(f.ino).await.unwrap().size, 3, "within the TTL: what was known");
    clock.advance(Duration::from_millis(60));
    assert_eq!(fs.getattr(f.ino).await.unwrap().size, 5);
    let fh = fs.open(f.ino, false, false).await.unwrap();
    assert_eq!(&fs.read(fh, 0, 100).await.unwrap()[..], b"newer");
    // (While a handle is open a deleted file keeps attributes, st_nlink 0: integrity_tests.)
    fs.release(fh).await.unwrap();
    store.delete("f").await.unwrap();
    clock.advance(Duration::from_millis(60));
    assert!(matches!(fs.getattr(f.ino).await, Err(FsError::NotFound)));
    fs.check_invariants();
}

/// The kernel drops its cached pages as it finishes an open answered without
/// `FOPEN_KEEP_CACHE`: until that handle's first read or release, no other open keeps them.
/// (A second open of the version just learned kept them: with another client replacing
/// the file every second, one handle's reads mixed two versions, about once a minute.)
#[tokio::test]
async fn no_open_keeps_the_kernels_pages_until_an_open_that_drops_them_is_done() {
    let (store, clock, fs, f) = old_f_with_ttl_50ms().await;
    let first = fs.open(f.ino, false, false).await.unwrap();
    assert!(!fs.keep_cache(first), "nothing known of the kernel's pages yet");
    fs.release(first).await.unwrap();
    let again = fs.open(f.ino, false, false).await.unwrap();
    assert!(fs.keep_cache(again), "the same version, its dropping open done");
    fs.release(again).await.unwrap();
    store.put("f", Bytes::from_static(b"newer"), PutOpts::default()).await.unwrap();
    clock.advance(Duration::from_millis(60));
    let (a, b) = (fs.open(f.ino, false, false).await.unwrap(), fs.open(f.ino, false, false).await.unwrap());
    assert!(!fs.keep_cache(a), "a new version");
    assert!(!fs.keep_cache(b), "the kernel may not have dropped the old version's pages yet");
    assert_eq!(&fs.read(a, 0, 100).await.unwrap()[..], b"newer");
    let c = fs.open(f.ino, false, false).await.unwrap();
    assert!(!fs.keep_cache(c), "b's open may not be finished yet");
    fs.release(b).await.unwrap();
    let d = fs.open(f.ino, false, false).await.unwrap();
    assert!(!fs.keep_cache(d), "c's open may not be finished yet");
    fs.read(c, 0, 1).await.unwrap();
    fs.read(d, 0, 1).await.unwrap();
    let e = fs.open(f.ino, false, false).await.unwrap();
    assert!(fs.keep_cache(e), "every dropping open done");
    for h in [a, c, d, e] {
        fs.release(h).await.unwrap();
    }
    fs.check_invariants();
}

#[tokio::test]
async fn an_open_the_kernel_never_saw_keeps_no_pages_for_the_next() {
    let (store, clock, fs, f) = old_f_with_ttl_50ms().await;
    let first = fs.open(f.ino, false, false).await.unwrap();
    fs.release(first).await.unwrap(); // the kernel caches the old version
    store.put("f", Bytes::from_static(b"newer"), PutOpts::default()).await.unwrap();
    clock.advance(Duration::from_millis(60));
    // The adapter refuses this open of the new version (passthrough's EBUSY): the kernel
    // never drops its old pages.
    let refused = fs.open(f.ino, false, false).await.unwrap();
    assert!(!fs.keep_cache(refused));
    fs.release_unanswered(refused).await.unwrap();
    let next = fs.open(f.ino, false, false).await.unwrap();
    assert!(!fs.keep_cache(next), "the kernel may still hold the old version's pages");
    fs.release(next).await.unwrap();
    fs.check_invariants();
}

#[tokio::test]
async fn reads_are_exact_at_odd_offsets() {
    let body: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    let (_, fs) = fs_with(&[("f", &body)]).await;
    let f = fs.lookup(ROOT_INO, "f").await.unwrap();
    let fh = fs.open(f.ino, false, false).await.unwrap();
    for (off, len) in [(0u64, 1u32), (4095, 4097), (99_999, 10), (100_000, 5), (12_345, 54_321)] {
        let got = fs.read(fh, off, len).await.unwrap();
        let end = (off as usize + len as usize).min(body.len());
        assert_eq!(&got[..], &body[(off as usize).min(end)..end], "off {off} len {len}");
    }
    assert!(matches!(fs.read(fh + 100, 0, 1).await, Err(FsError::BadHandle)));
}

#[tokio::test]
async fn errno_map_covers_store_errors() {
    use bucketfs_store::{StoreError, StoreErrorKind as K};
    let e = |k| FsError::Store(StoreError::new(k, "x")).errno();
    assert_eq!(e(K::NotFound), libc::ENOENT);
    assert_eq!(e(K::PermissionDenied), libc::EACCES);
    assert_eq!(e(K::Changed), libc::ESTALE);
    assert_eq!(e(K::Unavailable), libc::ETIMEDOUT);
    assert_eq!(e(K::Other), libc::EIO);
}

#[tokio::test]
async fn a_preloaded_tree_answers_find_without_requests() {
    let keys: Vec<(String, Vec<u8>)> =
        (0..300).map(|i| (format!("d{}/e{}/f{i}", i % 7, i % 3), vec![1u8; i % 10])).collect();
    let mut refs = refs(&keys);
    refs.push(("marker/", b""));
    refs.push(("x//bad", b"1"));
    let (store, fs) = fs_with(&refs).await;
    assert_eq!(fs.preload_tree(10_000, Duration::from_secs(60)).await.unwrap(), 301);
    let before = store.requests.load(Ordering::Relaxed);
    assert_eq!(find(&fs).await, (300, 30));
    assert_eq!(store.requests.load(Ordering::Relaxed), before, "a preloaded tree needs no requests");
    assert!(matches!(fs.preload_tree(10, Duration::from_secs(60)).await, Err(FsError::Local(_))));
}

/// Walk everything as find does (readdir each directory, look up each entry): (files, dirs).
async fn find(fs: &Fs) -> (usize, usize) {
    let (mut stack, mut files, mut dirs) = (vec![ROOT_INO], 0, 0);
    while let Some(dir) = stack.pop() {
        for e in names(fs, dir).await.into_iter().filter(|n| n != "." && n != "..") {
            let a = fs.lookup(dir, &e).await.unwrap();
            match a.kind {
                Kind::Dir => {
                    dirs += 1;
                    stack.push(a.ino)
                }
                Kind::File | Kind::Symlink => files += 1,
            }
        }
    }
    (files, dirs)
}

/// Owned keys as `fs_with`/`mem_with` take them.
fn refs(keys: &[(String, Vec<u8>)]) -> Vec<(&str, &[u8])> {
    keys.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect()
}

/// 5 top directories with 4 below each, 3 files in each of those and one at the top.
fn small_tree() -> Vec<(String, Vec<u8>)> {
    let mut keys: Vec<(String, Vec<u8>)> = vec![("top".into(), b"t".to_vec())];
    for a in 0..5 {
        for b in 0..4 {
            keys.extend((0..3).map(|i| (format!("d{a}/e{b}/f{i}"), vec![1u8; i + 1])));
        }
    }
    keys
}

#[tokio::test]
async fn list_ahead_lists_a_small_subtree_with_its_parent() {
    let keys = small_tree();
    let (store, fs) = fs_with(&refs(&keys)).await;
    let before = store.requests.load(Ordering::Relaxed);
    assert_eq!(find(&fs).await, (61, 25));
    // The root's own listing and one recursive listing, at the same time; nothing else.
    assert_eq!(store.requests.load(Ordering::Relaxed) - before, 2);
    let d3 = fs.lookup(ROOT_INO, "d3").await.unwrap();
    let e1 = fs.lookup(d3.ino, "e1").await.unwrap();
    assert_eq!(names(&fs, e1.ino).await, [".", "..", "f0", "f1", "f2"]);
    assert_eq!(fs.lookup(e1.ino, "f2").await.unwrap().size, 3);
}

#[tokio::test]
async fn a_subtree_over_the_list_ahead_bound_is_listed_per_directory() {
    let keys = small_tree();
    let store = mem_with(&refs(&keys)).await;
    // The root's subtree (61 keys) does not fit; each top directory's (12 keys) does. The
    // root's page of 20 keys holds d0 whole (its 12 keys come first), so d0 and the 4
    // directories below it are listed from it; d1-d4 are listed with their subtrees.
    let fs = Fs::new(store.clone(), FsConfig { list_ahead_keys: 20, ..FsConfig::default() });
    let before = store.requests.load(Ordering::Relaxed);
    assert_eq!(find(&fs).await, (61, 25));
    assert_eq!(store.requests.load(Ordering::Relaxed) - before, 2 + 4 * 2);
    let d0 = fs.lookup(ROOT_INO, "d0").await.unwrap();
    let e3 = fs.lookup(d0.ino, "e3").await.unwrap();
    assert_eq!(names(&fs, e3.ino).await, [".", "..", "f0", "f1", "f2"], "a directory the page held whole");
    let d1 = fs.lookup(ROOT_INO, "d1").await.unwrap();
    let e3 = fs.lookup(d1.ino, "e3").await.unwrap();
    assert_eq!(names(&fs, e3.ino).await, [".", "..", "f0", "f1", "f2"], "one past the page");
    let off = Fs::new(store.clone(), FsConfig { list_ahead_keys: 0, ..FsConfig::default() });
    let before = store.requests.load(Ordering::Relaxed);
    assert_eq!(find(&off).await, (61, 25));
    assert_eq!(store.requests.load(Ordering::Relaxed) - before, 26, "one listing per directory");
}

#[tokio::test]
async fn a_directory_asked_for_twice_at_once_is_listed_once() {
    let store = Arc::new(MemStore::new().with_latency(std::time::Duration::from_millis(50)));
    store.put("d/f", Bytes::from_static(b"1"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), FsConfig { list_ahead_keys: 0, ..FsConfig::default() });
    let d = fs.lookup(ROOT_INO, "d").await.unwrap();
    let node = fs.node(d.ino).unwrap();
    let before = store.requests.load(Ordering::Relaxed);
    let (a, b) = tokio::join!(fs.ensure_listing(&node, false), fs.ensure_listing(&node, false));
    a.unwrap();
    b.unwrap();
    assert_eq!(store.requests.load(Ordering::Relaxed) - before, 1, "the second waits for the first");
}

#[tokio::test]
async fn symlinks_are_link_objects_that_list_and_move() {
    // One made by rclone --links, one made here; a file shadows a link of its name.
    let (store, fs) = fs_with(&[("d/old.rclonelink", b"../t"), ("both", b"file"), ("both.rclonelink", b"x")]).await;
    let fs2 = Fs::new(store.clone(), FsConfig::default());
    assert_eq!(names(&fs, ROOT_INO).await, [".", "..", "both", "d"]);
    assert_eq!(fs.lookup(ROOT_INO, "both").await.unwrap().kind, Kind::File);
    let d = fs.lookup(ROOT_INO, "d").await.unwrap();
    assert_eq!(names(&fs, d.ino).await, [".", "..", "old"]);
    let old = fs.lookup(d.ino, "old").await.unwrap();
    assert_eq!((old.kind, old.size, old.perm), (Kind::Symlink, 4, 0o777));
    assert_eq!(&fs.readlink(old.ino).await.unwrap()[..], b"../t");

    let new = fs.symlink(ROOT_INO, "ln", "d/old").await.unwrap();
    assert_eq!(new.kind, Kind::Symlink);
    assert_eq!(&store.get_range("ln.rclonelink", 0..5, GetOpts::default()).await.unwrap()[..], b"d/old");
    assert!(matches!(fs.symlink(ROOT_INO, "ln", "x").await, Err(FsError::Exists)));
    assert!(matches!(fs.symlink(ROOT_INO, "long", &"a".repeat(5000)).await, Err(FsError::NameTooLong)));
    // Found by lookup alone (a fresh mount, no listing), as a link.
    let seen = fs2.lookup(ROOT_INO, "ln").await.unwrap();
    assert_eq!(seen.kind, Kind::Symlink);
    assert_eq!(&fs2.readlink(seen.ino).await.unwrap()[..], b"d/old");
    // The link's object is no file of its own (an O_TRUNC open of it overwrote the link).
    assert!(matches!(fs2.lookup(ROOT_INO, "ln.rclonelink").await, Err(FsError::NotFound)));
    let fs3 = Fs::new(store.clone(), FsConfig::default());
    assert!(matches!(fs3.lookup(ROOT_INO, "ln.rclonelink").await, Err(FsError::NotFound)));

    // A link whose object's name would pass NAME_MAX: refused, also as a rename target.
    let long = "L".repeat(250);
    assert!(matches!(fs.symlink(ROOT_INO, &long, "x").await, Err(FsError::NameTooLong)));
    assert!(matches!(fs.rename(ROOT_INO, "ln", ROOT_INO, &long, false).await, Err(FsError::NameTooLong)));
    assert_eq!(fs.lookup(ROOT_INO, "ln").await.unwrap().kind, Kind::Symlink, "left where it was");
    fs.rename(ROOT_INO, "ln", d.ino, "moved", false).await.unwrap();
    assert!(store.stat("ln.rclonelink").await.is_err());
    assert_eq!(&fs.readlink(fs.lookup(d.ino, "moved").await.unwrap().ino).await.unwrap()[..], b"d/old");
    fs.unlink(d.ino, "moved").await.unwrap();
    assert!(store.stat("d/moved.rclonelink").await.is_err());
    assert!(matches!(fs.readlink(fs.lookup(ROOT_INO, "both").await.unwrap().ino).await, Err(FsError::InvalidName)));
}

/// Another client's link whose target Linux cannot hold fails readlink, rather than being
/// served cut short (at 4,095 bytes, or by the kernel at a NUL) for `cp -a` to copy.
#[tokio::test]
async fn links_with_targets_linux_cannot_hold_fail_readlink() {
    let long = vec![b'a'; 5_000];
    let (store, fs) = fs_with(&[
        ("long.rclonelink", &long),
        ("nul.rclonelink", b"safe\0/etc/passwd"),
        ("empty.rclonelink", b""),
        ("max.rclonelink", &[b'm'; crate::links::TARGET_MAX]),
        ("ok.rclonelink", b"../t"),
    ])
    .await;
    assert_eq!(names(&fs, ROOT_INO).await, [".", "..", "empty", "long", "max", "nul", "ok"]);
    let ino = |name: &'static str| {
        let fs = fs.clone();
        async move { fs.lookup(ROOT_INO, name).await.unwrap().ino }
    };
    let (long, nul, empty) = (ino("long").await, ino("nul").await, ino("empty").await);
    for _ in 0..2 {
        let before = store.requests.load(Ordering::Relaxed);
        let e = fs.readlink(long).await.unwrap_err();
        assert!(matches!(e, FsError::NameTooLong), "{e:?}");
        assert_eq!(e.errno(), libc::ENAMETOOLONG);
        assert_eq!(store.requests.load(Ordering::Relaxed) - before, 1, "its size tells, no GET");
        for bad in [nul, empty] {
            assert_eq!(fs.readlink(bad).await.unwrap_err().errno(), libc::EIO, "again: nothing kept");
        }
    }
    assert_eq!(&fs.readlink(ino("ok").await).await.unwrap()[..], b"../t");
    assert_eq!(fs.readlink(ino("max").await).await.unwrap().len(), crate::links::TARGET_MAX);
    // Put right by its client: read as any link.
    store.put("nul.rclonelink", Bytes::from_static(b"safe"), PutOpts::default()).await.unwrap();
    let fs2 = Fs::new(store.clone(), FsConfig::default());
    assert_eq!(&fs2.readlink(fs2.lookup(ROOT_INO, "nul").await.unwrap().ino).await.unwrap()[..], b"safe");
}

#[tokio::test]
async fn names_minio_takes_for_directory_markers_are_refused() {
    let (store, fs) = fs_with(&[("f", b"f")]).await;
    let bad = "x__XLDIR__";
    assert!(matches!(fs.create(ROOT_INO, bad, 0, None).await, Err(FsError::InvalidName)));
    assert!(matches!(fs.mkdir(ROOT_INO, bad, None).await, Err(FsError::InvalidName)));
    assert!(matches!(fs.symlink(ROOT_INO, bad, "f").await, Err(FsError::InvalidName)));
    assert!(matches!(fs.rename(ROOT_INO, "f", ROOT_INO, bad, false).await, Err(FsError::InvalidName)));
    assert_eq!(names(&fs, ROOT_INO).await, [".", "..", "f"]);
    assert!(store.stat(bad).await.is_err() && store.stat("x/").await.is_err());
    fs.create(ROOT_INO, "x__XLDIR__y", 0, None).await.unwrap(); // only the end is MinIO's
}

/// `.bucketfs-parts/` at the top holds the store's temporary upload parts and is never
/// listed: a directory made there (or moved there) would hide what is written into it.
#[tokio::test]
async fn the_directory_of_temporary_parts_is_refused_at_the_top() {
    let (store, fs) = fs_with(&[("f", b"f")]).await;
    let d = fs.mkdir(ROOT_INO, "d", None).await.unwrap();
    assert!(matches!(fs.mkdir(ROOT_INO, ".bucketfs-parts", None).await, Err(FsError::InvalidName)));
    assert!(matches!(fs.rename(ROOT_INO, "d", ROOT_INO, ".bucketfs-parts", false).await, Err(FsError::InvalidName)));
    assert!(store.stat(".bucketfs-parts/").await.is_err());
    // A file of that name, and the directory anywhere below the top, are plain names.
    fs.create(ROOT_INO, ".bucketfs-parts", 0, None).await.unwrap();
    fs.mkdir(d.ino, ".bucketfs-parts", None).await.unwrap();
}

#[tokio::test]
async fn keys_past_the_store_limit_are_name_too_long_without_a_request() {
    let store = Arc::new(MemStore::new().with_max_key_len(12));
    store.put("dir/f", Bytes::from_static(b"x"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), FsConfig::default());
    let d = fs.lookup(ROOT_INO, "dir").await.unwrap().ino;
    assert!(fs.lookup(d, "f").await.is_ok());
    let before = store.requests.load(Ordering::Relaxed);
    // "dir/" + 9 bytes = 13 > 12: the store could not hold it.
    assert!(matches!(fs.lookup(d, "123456789").await, Err(FsError::NameTooLong)));
    assert_eq!(store.requests.load(Ordering::Relaxed), before, "no request for an impossible key");
    // 12 bytes exactly is a possible key: asked, and simply missing.
    assert!(matches!(fs.lookup(d, "12345678").await, Err(FsError::NotFound)));
}

/// The key limit counts a directory's marker `/`, a link's `.rclonelink`, and every key a
/// directory rename would make below it: each is `ENAMETOOLONG` before any request, not
/// an `EINVAL` from the store, or (write-back) an upload refused after the call returned.
#[tokio::test]
async fn markers_links_and_keys_below_a_renamed_directory_count_in_the_key_limit() {
    let store = Arc::new(MemStore::new().with_max_key_len(12));
    store.put("a/bcdefgh", Bytes::from_static(b"x"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), FsConfig::default());
    let before = store.requests.load(Ordering::Relaxed);
    assert!(matches!(fs.mkdir(ROOT_INO, "123456789012", None).await, Err(FsError::NameTooLong)), "13-byte marker");
    assert!(matches!(fs.symlink(ROOT_INO, "ab", "t").await, Err(FsError::NameTooLong)), "ab.rclonelink");
    assert_eq!(store.requests.load(Ordering::Relaxed), before, "no request for an impossible key");
    fs.mkdir(ROOT_INO, "12345678901", None).await.unwrap(); // a 12-byte marker fits
                                                            // a/bcdefgh as abcde/bcdefgh is 13 bytes: refused, nothing moved.
    assert!(matches!(fs.rename(ROOT_INO, "a", ROOT_INO, "abcde", false).await, Err(FsError::NameTooLong)));
    assert!(store.stat("a/bcdefgh").await.is_ok() && store.stat("abcde/bcdefgh").await.is_err());
    fs.rename(ROOT_INO, "a", ROOT_INO, "abcd", false).await.unwrap(); // abcd/bcdefgh: 12
    assert!(store.stat("abcd/bcdefgh").await.is_ok());

    // Write-back: a file known only here (queued, not uploaded) counts too.
    use crate::write_back::tests::{cfg, staging};
    let store = Arc::new(MemStore::new().with_max_key_len(12));
    let dir = staging("key-limit-rename");
    let fs = Fs::new(store.clone(), FsConfig { list_ahead_keys: 0, ..cfg(&dir, 60_000) });
    fs.start_write_back();
    let _ = names(&fs, ROOT_INO).await;
    let q = fs.mkdir(ROOT_INO, "q", None).await.unwrap().ino;
    let (_, fh) = fs.create(q, "f2345678", 0, None).await.unwrap(); // q/f2345678: 10
    fs.write(fh, 0, b"x").await.unwrap();
    fs.release(fh).await.unwrap();
    fs.rename(ROOT_INO, "q", ROOT_INO, "qqq", false).await.unwrap(); // qqq/f2345678: 12
    assert!(matches!(fs.rename(ROOT_INO, "qqq", ROOT_INO, "qqqq", false).await, Err(FsError::NameTooLong)));
    assert!(fs.sync_all().await.is_empty(), "nothing left unsent");
    assert!(store.stat("qqq/f2345678").await.is_ok(), "it went up under the name it kept");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_file_name_past_the_store_limit_is_name_too_long_at_create_and_rename() {
    // The local folder writes through a temporary name longer than the file's own.
    let store = Arc::new(MemStore::new().with_max_file_name_len(10));
    store.put("ok", Bytes::from_static(b"x"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), FsConfig::default());
    assert!(matches!(fs.create(ROOT_INO, "elevenbytes", 0, None).await, Err(FsError::NameTooLong)));
    let (_, fh) = fs.create(ROOT_INO, "tenbytes10", 0, None).await.unwrap();
    fs.release(fh).await.unwrap();
    assert!(matches!(fs.rename(ROOT_INO, "ok", ROOT_INO, "elevenbytes", false).await, Err(FsError::NameTooLong)));
    // A directory is made directly, under its own name: no such limit.
    fs.mkdir(ROOT_INO, "a-longer-directory", None).await.unwrap();
    assert!(store.stat("elevenbytes").await.is_err(), "nothing was written under the long name");
    assert!(store.stat("ok").await.is_ok());
}

#[tokio::test]
async fn an_unlinked_file_still_held_shows_nlink_0() {
    let (_, fs) = fs_with(&[("f", b"data"), ("g", b"x")]).await;
    let f = fs.lookup(ROOT_INO, "f").await.unwrap();
    assert_eq!(f.nlink, 1);
    let fh = fs.open(f.ino, false, false).await.unwrap();
    fs.unlink(ROOT_INO, "f").await.unwrap();
    assert_eq!(fs.getattr(f.ino).await.unwrap().nlink, 0);
    fs.release(fh).await.unwrap();
    assert_eq!(fs.lookup(ROOT_INO, "g").await.unwrap().nlink, 1);
}

#[tokio::test]
async fn a_directory_a_whole_page_lay_in_is_listed_without_a_recursive_page() {
    let keys: Vec<(String, Vec<u8>)> = small_tree().into_iter().map(|(k, v)| (format!("t/{k}"), v)).collect();
    let store = mem_with(&refs(&keys)).await;
    let fs = Fs::new(store.clone(), FsConfig { list_ahead_keys: 20, ..FsConfig::default() });
    let before = store.requests.load(Ordering::Relaxed);
    assert_eq!(find(&fs).await, (61, 26));
    // The root: its own listing and a page of 20 keys, all in t/ (so t/ is bigger than a
    // page) and holding t/d0 whole. t/: its own listing only. t/d1-d4: two each.
    assert_eq!(store.requests.load(Ordering::Relaxed) - before, 2 + 1 + 4 * 2);
}

#[tokio::test]
async fn subdirectories_of_a_big_directory_are_listed_ahead_in_the_background() {
    let keys = small_tree();
    let store = mem_with(&refs(&keys)).await;
    // The root's subtree (61 keys) does not fit; each top directory's (12 keys) does.
    let fs = Fs::new(store.clone(), FsConfig { list_ahead_keys: 20, ..FsConfig::default() });
    let before = store.requests.load(Ordering::Relaxed);
    assert_eq!(names(&fs, ROOT_INO).await.len(), 2 + 6);
    // d0 comes whole in the root's page; d1-d4 get listed (with their subtrees) without
    // being opened.
    for _ in 0..200 {
        if store.requests.load(Ordering::Relaxed) - before == 2 + 4 * 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.requests.load(Ordering::Relaxed) - before, 2 + 4 * 2);
    assert_eq!(find(&fs).await, (61, 25));
    assert_eq!(store.requests.load(Ordering::Relaxed) - before, 2 + 4 * 2, "the walk found everything listed");
    // With list-ahead off, nothing is listed ahead.
    let off = Fs::new(store.clone(), FsConfig { list_ahead_keys: 0, ..FsConfig::default() });
    let before = store.requests.load(Ordering::Relaxed);
    names(&off, ROOT_INO).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.requests.load(Ordering::Relaxed) - before, 1);
}

/// `ls p` in flight while `rmdir p/sub` runs: the listing (overtaken by the rmdir) may show
/// `sub` to the read that asked for it, but must not bring it back into the namespace:
/// a `mkdir p/sub` right after succeeds (it said EEXIST).
#[tokio::test]
async fn a_listing_overtaken_by_rmdir_does_not_bring_the_directory_back() {
    let store = Arc::new(MemStore::new().with_latency(std::time::Duration::from_millis(30)));
    for k in ["p/sub/", "p/f"] {
        store.put(k, Bytes::new(), PutOpts::default()).await.unwrap();
    }
    let fs = Fs::new(store.clone(), FsConfig::default());
    let p = fs.lookup(ROOT_INO, "p").await.unwrap();
    fs.lookup(p.ino, "sub").await.unwrap();
    // The rmdir asks (LIST) and deletes, 30 ms each; the listing starts during the delete
    // and ends after it, so the store may still show `sub` to it.
    let (listing, removed) = tokio::join!(
        async {
            tokio::time::sleep(std::time::Duration::from_millis(40)).await;
            fs.dir_snapshot(p.ino).await
        },
        fs.rmdir(p.ino, "sub")
    );
    listing.unwrap();
    removed.unwrap();
    assert!(matches!(fs.lookup(p.ino, "sub").await, Err(FsError::NotFound)));
    fs.mkdir(p.ino, "sub", None).await.expect("mkdir after rmdir");
    assert!(names(&fs, p.ino).await.contains(&"sub".to_string()));
}

/// A rename whose HEAD of the copy fails leaves the file's version unknown; the next open
/// asks the store before reading, so reads are pinned to the copy's tag again. (The node
/// was "fresh" with no tag: an S3 read went without `If-Match` for up to a TTL.)
#[tokio::test]
async fn an_open_after_a_rename_whose_head_failed_learns_the_version() {
    use bucketfs_store::testing::{FailStore, Op};
    use bucketfs_store::StoreErrorKind;
    let mem = mem_with(&[("f", b"bytes of f")]).await;
    // The first HEAD fails: the one after the rename's copy (a listing found `f`).
    let fail = Arc::new(FailStore::new(mem.clone(), Op::Head, 1, 1, StoreErrorKind::Other));
    let fs = Fs::new(fail.clone(), FsConfig::default());
    assert_eq!(names(&fs, ROOT_INO).await, vec![".", "..", "f"]);
    let ino = fs.lookup(ROOT_INO, "f").await.unwrap().ino;
    fs.rename(ROOT_INO, "f", ROOT_INO, "g", false).await.unwrap();
    assert_eq!(fs.lookup(ROOT_INO, "g").await.unwrap().ino, ino);
    // Not the source's tag either, from the listing's entry (the copy has another).
    assert_eq!(fs.node(ino).unwrap().version, crate::inode::Version::Unknown, "after the rename and a lookup");
    let fh = fs.open(ino, false, false).await.unwrap();
    let tag = mem.stat("g").await.unwrap().etag;
    assert!(tag.is_some());
    assert_eq!(fs.node(ino).unwrap().version.tag(), tag.as_deref(), "open learned the copy's tag");
    assert_eq!(&fs.read(fh, 0, 100).await.unwrap()[..], b"bytes of f");
    fs.release(fh).await.unwrap();
}

/// A recursive listing sent before `rm -rf P/a && mkdir P/a` (write-back makes the `rm`
/// fast), landing after: the new, empty `a` must not get the old `a`'s listing, trusted,
/// which showed the deleted `f` in it (review of the listing merge). Covered twice: `mkdir`
/// records its empty listing as answered now, and listings below a directory changed since
/// the listing began land overtaken.
#[tokio::test]
async fn a_recursive_listing_from_before_rm_and_mkdir_does_not_fill_the_new_directory() {
    let (_, fs) = fs_with(&[("P/a/f", b"1"), ("P/g", b"2")]).await;
    let p = fs.lookup(ROOT_INO, "P").await.unwrap().ino;
    let a = fs.lookup(p, "a").await.unwrap().ino;
    fs.lookup(a, "f").await.unwrap();
    let since = fs.table.lock().unwrap().change_seq(); // the recursive listing is sent
    let root = fs.node(ROOT_INO).unwrap();
    let mut dirs = fs.list_subtree("", 1000).await.unwrap().dirs;
    dirs.insert(String::new(), fs.list_children(&root).await.unwrap());
    assert!(dirs["P/a/"].contains_key("f"));
    fs.unlink(a, "f").await.unwrap();
    fs.rmdir(p, "a").await.unwrap();
    let new_a = fs.mkdir(p, "a", None).await.unwrap().ino;
    let template = crate::inode::Listing {
        at: fs.cfg.clock.now(),
        valid_for: Duration::from_secs(60),
        children: HashMap::new(),
        subtree: false,
        overtaken: false,
    };
    fs.install_subtree("", ROOT_INO, dirs, template, since, &std::collections::HashSet::new());
    assert_eq!(fs.lookup(p, "a").await.unwrap().ino, new_a);
    assert_eq!(names(&fs, new_a).await, [".", ".."], "the deleted f came back in the new a");
    assert!(matches!(fs.lookup(new_a, "f").await, Err(FsError::NotFound)));
}

/// Another client can put bytes at a marker (`d/`): no name shows them, so the mount never
/// deletes or re-creates such a marker. `rmdir` says ENOTEMPTY and a directory rename EXDEV
/// (`mv` copies what it shows), in either write mode, listed ahead or not; an empty marker
/// goes as before.
#[tokio::test]
async fn a_marker_holding_bytes_is_never_deleted_or_moved() {
    use crate::write_back::tests::{cfg, object, staging};
    for (wb, ahead) in [(false, 0), (false, 20), (true, 0), (true, 20)] {
        let store = mem_with(&[("d/", b"payload"), ("p/e/", b"more"), ("p/f", b"1"), ("m/", b"")]).await;
        let dir = staging(&format!("marker-bytes-{ahead}"));
        let base = if wb { cfg(&dir, 60_000) } else { FsConfig::default() };
        let fs = Fs::new(store.clone(), FsConfig { list_ahead_keys: ahead, ..base });
        if wb {
            fs.start_write_back();
        }
        assert_eq!(names(&fs, ROOT_INO).await, [".", "..", "d", "m", "p"]);
        let d = fs.lookup(ROOT_INO, "d").await.unwrap();
        assert_eq!(names(&fs, d.ino).await, [".", ".."], "{wb} {ahead}");
        let p = fs.lookup(ROOT_INO, "p").await.unwrap();
        assert_eq!(names(&fs, p.ino).await, [".", "..", "e", "f"]);
        let e = fs.lookup(p.ino, "e").await.unwrap();
        assert_eq!(names(&fs, e.ino).await, [".", ".."]);
        let r = fs.rmdir(ROOT_INO, "d").await;
        assert!(matches!(r, Err(FsError::NotEmpty)), "{wb} {ahead}: {r:?}");
        let r = fs.rmdir(p.ino, "e").await;
        assert!(matches!(r, Err(FsError::NotEmpty)), "{wb} {ahead}: {r:?}");
        let r = fs.rename(ROOT_INO, "d", ROOT_INO, "d2", false).await;
        assert!(matches!(r, Err(FsError::CrossDevice(_))), "{wb} {ahead}: {r:?}");
        let r = fs.rename(ROOT_INO, "p", ROOT_INO, "p2", false).await;
        assert!(matches!(r, Err(FsError::CrossDevice(_))), "{wb} {ahead}: {r:?}");
        fs.rmdir(ROOT_INO, "m").await.unwrap();
        if wb {
            assert!(fs.sync_write_back().await.is_empty());
        }
        assert_eq!(object(store.as_ref(), "d/").await.as_deref(), Some(&b"payload"[..]), "{wb} {ahead}");
        assert_eq!(object(store.as_ref(), "p/e/").await.as_deref(), Some(&b"more"[..]), "{wb} {ahead}");
        assert_eq!(object(store.as_ref(), "m/").await, None, "{wb} {ahead}: the empty marker stayed");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A file written here with the default mode keeps no node once it is uploaded and the
/// kernel forgets it (a `cp -r` of a million files kept a million nodes); one made with
/// another mode keeps its node, and so its mode, for the mount's life.
#[tokio::test]
async fn a_file_made_with_the_default_mode_goes_when_the_kernel_forgets_it() {
    let (_, fs) = fs_with(&[]).await;
    let _ = names(&fs, ROOT_INO).await;
    let mut inos = Vec::new();
    for (name, mode) in [("plain", 0o644), ("private", 0o600)] {
        let (attr, fh) = fs.create(ROOT_INO, name, 0, Some(mode)).await.unwrap();
        assert_eq!(attr.perm, mode);
        fs.write(fh, 0, b"data").await.unwrap();
        fs.flush(fh).await.unwrap();
        fs.release(fh).await.unwrap();
        fs.forget(attr.ino, 1);
        inos.push(attr.ino);
    }
    {
        let t = fs.table.lock().unwrap();
        assert!(t.get(inos[0]).is_none(), "the default mode kept the node");
        assert_eq!(t.get(inos[1]).map(|n| n.perm), Some(Some(0o600)));
    }
    assert_eq!(fs.lookup(ROOT_INO, "plain").await.unwrap().perm, 0o644);
    assert_eq!(fs.lookup(ROOT_INO, "private").await.unwrap().perm, 0o600);
}
