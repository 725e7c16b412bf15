//! Request economy: what a developer's day on a mount (create, `stat` after the TTL, lookups
//! of names that do not exist) costs in store requests, counted by the in-memory store.

use super::*;
use bucketfs_store::testing::MemStore;
use bucketfs_store::PutOpts;
use bytes::Bytes;
use std::sync::atomic::Ordering;

fn cfg(ttl_ms: u64) -> FsConfig {
    let dir = std::env::temp_dir().join(format!("bucketfs-economy-test-{}", std::process::id()));
    FsConfig { staging_dir: dir, metadata_ttl: Duration::from_millis(ttl_ms), ..FsConfig::default() }
}

fn requests(store: &MemStore) -> u64 {
    store.requests.load(Ordering::Relaxed)
}

/// What the kernel sends for `cp` of a new file: LOOKUP (absent), CREATE, WRITE, FLUSH, RELEASE.
async fn new_file(fs: &Fs, dir: u64, name: &str, data: &[u8]) {
    assert!(matches!(fs.lookup(dir, name).await, Err(FsError::NotFound)));
    let (_, fh) = fs.create(dir, name, 0, None).await.unwrap();
    fs.write(fh, 0, data).await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
}

/// `wide/` with one entry more than a listing for lookups takes (`RELIST_MAX`).
async fn seed_wide(store: &MemStore) {
    for i in 0..=crate::fs::RELIST_MAX {
        store.put(&format!("wide/f{i:05}"), Bytes::from_static(b"w"), PutOpts::default()).await.unwrap();
    }
}

#[tokio::test]
async fn new_files_in_a_directory_made_here_cost_one_request_each() {
    let store = Arc::new(MemStore::new());
    let fs = Fs::new(store.clone(), cfg(60_000));
    let d = fs.mkdir(ROOT_INO, "d", None).await.unwrap();
    let before = requests(&store);
    for i in 0..50 {
        new_file(&fs, d.ino, &format!("f{i}"), &[1; 4107]).await;
    }
    assert_eq!(requests(&store) - before, 50, "one PUT per file and nothing else");
}

#[tokio::test]
async fn stat_past_the_ttl_is_one_listing_per_directory() {
    let store = Arc::new(MemStore::new());
    for i in 0..200 {
        store.put(&format!("src/f{i}"), Bytes::from(vec![1; i]), PutOpts::default()).await.unwrap();
    }
    let ttl = 100;
    let clock = crate::Clock::manual();
    let fs = Fs::new(store.clone(), FsConfig { clock: clock.clone(), ..cfg(ttl) });
    let d = fs.lookup(ROOT_INO, "src").await.unwrap();
    fs.dir_snapshot(d.ino).await.unwrap(); // `git status` reads the directories too
    let mut inos = Vec::new();
    for i in 0..200 {
        inos.push(fs.lookup(d.ino, &format!("f{i}")).await.unwrap().ino);
    }
    clock.advance(Duration::from_millis(ttl + 20));
    store.put("src/f7", Bytes::from_static(b"changed elsewhere"), PutOpts::default()).await.unwrap();
    let before = requests(&store);
    for (i, ino) in inos.iter().enumerate() {
        let size = fs.getattr(*ino).await.unwrap().size;
        assert_eq!(size, if i == 7 { 17 } else { i as u64 });
    }
    // The directory's own listing and at most one page of the recursive one beside it.
    assert!(requests(&store) - before <= 2, "{} requests for 200 stats", requests(&store) - before);
    // A name that does not exist in a directory listed now costs nothing.
    let before = requests(&store);
    assert!(matches!(fs.lookup(d.ino, "missing.h").await, Err(FsError::NotFound)));
    assert_eq!(requests(&store), before);
    fs.check_invariants();
}

/// On a loaded machine a LIST may take longer than the TTL: the listing still answers the
/// lookups after it for a TTL, not one LIST and one HEAD per `stat` (test_economy.py saw
/// 121 requests for 60 `stat`s so).
#[tokio::test]
async fn a_listing_slower_than_the_ttl_still_answers_the_lookups_after_it() {
    use bucketfs_store::testing::{FailStore, Op};
    let mem = Arc::new(MemStore::new());
    for i in 0..20 {
        mem.put(&format!("src/f{i}.c"), Bytes::from(vec![1; i]), PutOpts::default()).await.unwrap();
    }
    let ttl = 100;
    let clock = crate::Clock::manual();
    let slow = Arc::new(FailStore::new(mem.clone(), Op::List, u64::MAX, 0, bucketfs_store::StoreErrorKind::Other));
    let fs = Fs::new(slow.clone(), FsConfig { list_ahead_keys: 0, clock: clock.clone(), ..cfg(ttl) });
    let d = fs.lookup(ROOT_INO, "src").await.unwrap();
    fs.dir_snapshot(d.ino).await.unwrap();
    clock.advance(Duration::from_millis(ttl + 20));
    let answer = slow.hold(Op::List, 1);
    let before = requests(&mem);
    let first = tokio::spawn({
        let fs = fs.clone();
        async move { fs.lookup(d.ino, "f0.c").await }
    });
    while requests(&mem) == before {
        tokio::time::sleep(Duration::from_millis(1)).await; // the LIST is sent
    }
    clock.advance(Duration::from_millis(2 * ttl)); // and answers after twice the TTL
    answer.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap().size, 0);
    let listed = requests(&mem);
    for i in 1..20 {
        assert_eq!(fs.lookup(d.ino, &format!("f{i}.c")).await.unwrap().size, i as u64);
    }
    assert_eq!(requests(&mem), listed, "the lookups after a slow listing are answered by it");
    // And it expires a TTL after it arrived: another client's change is seen then.
    mem.put("src/f1.c", Bytes::from_static(b"changed"), PutOpts::default()).await.unwrap();
    clock.advance(Duration::from_millis(ttl + 20));
    let f1 = fs.lookup(d.ino, "f1.c").await.unwrap();
    assert_eq!(fs.getattr(f1.ino).await.unwrap().size, 7);
    fs.check_invariants();
}

/// A name probed (its directory not listed) is looked up again whenever the kernel drops
/// its entry, which with store events is every second: the node the store confirmed
/// within the TTL answers, as `getattr` does; once the TTL has passed, the store is asked.
#[tokio::test]
async fn a_name_probed_within_the_ttl_is_looked_up_again_without_a_request() {
    let store = Arc::new(MemStore::new());
    store.put("w/a", Bytes::from_static(b"a"), PutOpts::default()).await.unwrap();
    let ttl = 100;
    let clock = crate::Clock::manual();
    let fs = Fs::new(store.clone(), FsConfig { list_ahead_keys: 0, clock: clock.clone(), ..cfg(ttl) });
    let w = fs.lookup(ROOT_INO, "w").await.unwrap();
    let before = requests(&store);
    for _ in 0..10 {
        assert_eq!(fs.lookup(ROOT_INO, "w").await.unwrap().ino, w.ino);
    }
    assert_eq!(requests(&store), before, "a fresh node answers its lookups");
    store.delete("w/a").await.unwrap();
    clock.advance(Duration::from_millis(ttl + 20));
    assert!(matches!(fs.lookup(ROOT_INO, "w").await, Err(FsError::NotFound)), "past the TTL the store is asked");
    assert!(requests(&store) > before);
    fs.check_invariants();
}

#[tokio::test]
async fn an_unknown_name_in_a_stale_small_directory_is_one_listing() {
    let store = Arc::new(MemStore::new());
    store.put("inc/a.h", Bytes::from_static(b"a"), PutOpts::default()).await.unwrap();
    let ttl = 100;
    let clock = crate::Clock::manual();
    let fs = Fs::new(store.clone(), FsConfig { list_ahead_keys: 0, clock: clock.clone(), ..cfg(ttl) });
    let d = fs.lookup(ROOT_INO, "inc").await.unwrap();
    fs.dir_snapshot(d.ino).await.unwrap();
    clock.advance(Duration::from_millis(ttl + 20));
    store.put("inc/b.h", Bytes::from_static(b"bb"), PutOpts::default()).await.unwrap();
    let before = requests(&store);
    for name in ["x.h", "y.h", "z.h"] {
        assert!(matches!(fs.lookup(d.ino, name).await, Err(FsError::NotFound)));
    }
    assert_eq!(fs.lookup(d.ino, "b.h").await.unwrap().size, 2, "another client's file, seen after the TTL");
    assert_eq!(requests(&store) - before, 1, "one LIST, not four requests per name");
    fs.check_invariants();
}

#[tokio::test]
async fn files_copied_into_a_directory_never_listed_cost_a_put_each_and_two_lists() {
    let store = Arc::new(MemStore::new());
    for i in 0..20 {
        store.put(&format!("dst/old{i}"), Bytes::from_static(b"o"), PutOpts::default()).await.unwrap();
    }
    let fs = Fs::new(store.clone(), FsConfig { list_ahead_keys: 0, ..cfg(60_000) });
    let d = fs.lookup(ROOT_INO, "dst").await.unwrap();
    let before = requests(&store);
    for i in 0..30 {
        new_file(&fs, d.ino, &format!("new{i}"), b"n").await;
    }
    // The first absent name is probed, the second lists the directory, which answers the rest.
    assert_eq!(requests(&store) - before, 30 + 2, "a PUT per file, one probe and one LIST");
    assert_eq!(fs.lookup(d.ino, "old7").await.unwrap().size, 1, "the listing holds what was there");
    fs.check_invariants();
}

#[tokio::test]
async fn absent_names_in_a_wide_directory_are_probed_after_one_listing() {
    let store = Arc::new(MemStore::new());
    seed_wide(&store).await;
    let fs = Fs::new(store.clone(), FsConfig { list_ahead_keys: 0, ..cfg(60_000) });
    let d = fs.lookup(ROOT_INO, "wide").await.unwrap();
    let before = requests(&store);
    for i in 0..10 {
        assert!(matches!(fs.lookup(d.ino, &format!("x{i}")).await, Err(FsError::NotFound)));
    }
    // A probe, a listing cut short, then a probe per name: never a listing per name.
    let used = requests(&store) - before;
    assert!((10..=13).contains(&used), "{used} requests for 10 absent names");
    assert_eq!(fs.lookup(d.ino, "f00500").await.unwrap().size, 1);
    // `wide` itself, then each name: a LIST of `k` per name on S3 and GCS.
    assert_eq!(store.plain_prefix_lists.load(Ordering::Relaxed), 12, "a LIST of the plain prefix per name");
}

/// On a store whose plain-prefix LIST reads the whole directory (MinIO), names in a
/// directory known wide are asked about key by key (HEADs and a LIST of `k/` at once): no
/// LIST of a plain prefix after the first, and each kind of entry still found.
#[tokio::test]
async fn a_wide_directory_on_minio_is_probed_key_by_key() {
    let store = Arc::new(MemStore::new().with_prefix_list_reading_dir());
    seed_wide(&store).await;
    store.put("wide/sub/inner", Bytes::from_static(b"i"), PutOpts::default()).await.unwrap();
    store.put("wide/ln.rclonelink", Bytes::from_static(b"f00001"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), FsConfig { list_ahead_keys: 0, ..cfg(60_000) });
    let d = fs.lookup(ROOT_INO, "wide").await.unwrap();
    let plain = || store.plain_prefix_lists.load(Ordering::Relaxed);
    let before = plain();
    for i in 0..10 {
        assert!(matches!(fs.lookup(d.ino, &format!("x{i}")).await, Err(FsError::NotFound)));
    }
    assert_eq!(fs.lookup(d.ino, "f00500").await.unwrap().size, 1);
    assert_eq!(fs.lookup(d.ino, "sub").await.unwrap().kind, Kind::Dir);
    assert_eq!(fs.lookup(d.ino, "ln").await.unwrap().kind, Kind::Symlink);
    // The first absent name's probe; then a listing cut short marks it wide.
    assert_eq!(plain() - before, 1, "one plain-prefix LIST, before the directory was known wide");
}

/// Key by key, a file found while the LIST of `k/` fails is no answer: a directory `k/`
/// would hide it (as the one LIST's failure is an error on other stores).
#[tokio::test]
async fn a_file_found_beside_a_failed_directory_probe_is_an_error() {
    use bucketfs_store::testing::{FailStore, Op};
    let mem = Arc::new(MemStore::new().with_prefix_list_reading_dir());
    seed_wide(&mem).await;
    mem.put("wide/k", Bytes::from_static(b"file"), PutOpts::default()).await.unwrap();
    mem.put("wide/k/x", Bytes::from_static(b"in the dir"), PutOpts::default()).await.unwrap();
    // LISTs: `wide` in the root, `x0`, the listing cut short, `x1/`; then all fail.
    let fail = Arc::new(FailStore::new(mem.clone(), Op::List, 5, 1_000_000, bucketfs_store::StoreErrorKind::Other));
    let fs = Fs::new(fail, FsConfig { list_ahead_keys: 0, ..cfg(60_000) });
    let d = fs.lookup(ROOT_INO, "wide").await.unwrap();
    for i in 0..2 {
        assert!(matches!(fs.lookup(d.ino, &format!("x{i}")).await, Err(FsError::NotFound)));
    }
    let got = fs.lookup(d.ino, "k").await;
    assert!(got.is_err(), "the file was taken for the answer: {:?}", got.map(|a| a.kind));
}

/// The same for existing names only (`stat` of paths: no absent name marks the directory
/// wide): the second name found checks the width with one listing, and the rest are asked
/// about key by key. A narrow directory keeps its one LIST per name and shows each file's
/// mode from its HEAD (the check installs no listing).
#[tokio::test]
async fn the_second_name_found_on_minio_checks_the_directory_width() {
    let store = Arc::new(MemStore::new().with_prefix_list_reading_dir());
    seed_wide(&store).await;
    let attrs = bucketfs_store::FileAttrs { mode: Some(0o100600), ..Default::default() };
    for i in 0..5 {
        let opts = PutOpts { attrs: attrs.clone(), ..PutOpts::default() };
        store.put(&format!("narrow/g{i}"), Bytes::from_static(b"n"), opts).await.unwrap();
    }
    let fs = Fs::new(store.clone(), FsConfig { list_ahead_keys: 0, ..cfg(60_000) });
    let plain = || store.plain_prefix_lists.load(Ordering::Relaxed);
    let d = fs.lookup(ROOT_INO, "wide").await.unwrap();
    let p0 = plain();
    for i in 0..20 {
        assert_eq!(fs.lookup(d.ino, &format!("f{:05}", i * 37)).await.unwrap().size, 1);
    }
    assert_eq!(plain() - p0, 1, "only the first name by a plain-prefix LIST");
    let n = fs.lookup(ROOT_INO, "narrow").await.unwrap();
    let (p0, r0) = (plain(), requests(&store));
    for i in 0..5 {
        assert_eq!(fs.lookup(n.ino, &format!("g{i}")).await.unwrap().perm, 0o600, "the mode from the HEAD");
    }
    assert_eq!(plain() - p0, 5, "a narrow directory keeps its LIST per name");
    assert_eq!(requests(&store) - r0, 11, "a LIST and a HEAD per name, and one check of the width");
}

#[tokio::test]
async fn a_wide_directory_that_shrank_is_listed_for_lookups_again() {
    let store = Arc::new(MemStore::new());
    seed_wide(&store).await;
    let ttl = 100;
    let clock = crate::Clock::manual();
    let fs = Fs::new(store.clone(), FsConfig { list_ahead_keys: 0, clock: clock.clone(), ..cfg(ttl) });
    let d = fs.lookup(ROOT_INO, "wide").await.unwrap();
    for i in 0..3 {
        assert!(matches!(fs.lookup(d.ino, &format!("x{i}")).await, Err(FsError::NotFound)));
    }
    // Another client empties most of it; `ls` past the TTL sees a directory of one page.
    for i in 10..=crate::fs::RELIST_MAX {
        store.delete(&format!("wide/f{i:05}")).await.unwrap();
    }
    clock.advance(Duration::from_millis(ttl + 20));
    fs.dir_snapshot(d.ino).await.unwrap();
    // The kernel forgets the directory: its listing goes, the directory stays.
    fs.forget(d.ino, 1);
    let d = fs.lookup(ROOT_INO, "wide").await.unwrap();
    let before = requests(&store);
    for i in 0..20 {
        assert!(matches!(fs.lookup(d.ino, &format!("y{i}")).await, Err(FsError::NotFound)));
    }
    // A probe, then one listing answers the other 19: the directory is no longer wide.
    assert_eq!(requests(&store) - before, 2, "a probe and one listing");
}

#[tokio::test]
async fn one_new_file_in_a_directory_never_listed_costs_a_probe_and_its_put() {
    let store = Arc::new(MemStore::new());
    store.put("dst/old", Bytes::from_static(b"o"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), FsConfig { list_ahead_keys: 0, ..cfg(60_000) });
    let d = fs.lookup(ROOT_INO, "dst").await.unwrap();
    let before = requests(&store);
    // The kernel's LOOKUP, then CREATE asking about the same name: one name, no listing.
    new_file(&fs, d.ino, "new", b"n").await;
    assert_eq!(requests(&store) - before, 2, "the probe and the PUT");
}

/// Each path walk through a link asks `readlink`: within the TTL a link read (or made) here
/// costs no request again; another client's change shows once the node learns the new
/// version (its next lookup past the TTL).
#[tokio::test]
async fn readlink_within_the_ttl_costs_no_request() {
    let store = Arc::new(MemStore::new());
    let clock = crate::Clock::manual();
    let fs = Fs::new(store.clone(), FsConfig { clock: clock.clone(), ..cfg(1_000) });
    let made = fs.symlink(ROOT_INO, "made", "target/one").await.unwrap();
    let before = requests(&store);
    for _ in 0..10 {
        assert_eq!(&fs.readlink(made.ino).await.unwrap()[..], b"target/one");
    }
    assert_eq!(requests(&store) - before, 0, "a link made here, read again");
    let key = fs.node(made.ino).unwrap().key;
    store.put(&key, Bytes::from_static(b"elsewhere"), PutOpts::default()).await.unwrap();
    clock.advance(Duration::from_secs(2));
    let ino = fs.lookup(ROOT_INO, "made").await.unwrap().ino;
    assert_eq!(&fs.readlink(ino).await.unwrap()[..], b"elsewhere", "another client's change");
    let before = requests(&store);
    for _ in 0..10 {
        assert_eq!(&fs.readlink(ino).await.unwrap()[..], b"elsewhere");
    }
    assert_eq!(requests(&store) - before, 0, "a link read once, read again");
}

/// `echo >> log` again and again on a file another tool put (no mode, owner or mtime of
/// ours): the first write-open asks a HEAD for them, the next opens of that version do not.
#[tokio::test]
async fn write_opens_of_a_file_with_no_attributes_ask_for_them_once() {
    let store = Arc::new(MemStore::new());
    store.put("log", Bytes::from_static(b"line\n"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), cfg(60_000));
    fs.dir_snapshot(ROOT_INO).await.unwrap(); // known from a listing, which carries no attributes
    let ino = fs.lookup(ROOT_INO, "log").await.unwrap().ino;
    let mut costs = Vec::new();
    for _ in 0..4 {
        let before = requests(&store);
        let fh = fs.open(ino, true, false).await.unwrap(); // loads the bytes to stage them
        fs.release(fh).await.unwrap();
        costs.push(requests(&store) - before);
    }
    let later = costs[1];
    assert_eq!(costs, [later + 1, later, later, later], "one HEAD, at the first write-open only");
}
