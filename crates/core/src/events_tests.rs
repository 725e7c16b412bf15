//! The store's change events against the in-memory store, on a manual clock.

use super::*;
use crate::clock::Clock;
use crate::fs::{FsConfig, ROOT_INO};
use crate::FsError;
use bucketfs_store::testing::MemStore;
use bucketfs_store::{PutOpts, Store};
use bytes::Bytes;
use std::sync::Arc;

fn fs_on(store: &Arc<MemStore>, clock: &Clock) -> Arc<Fs> {
    let dir = std::env::temp_dir().join(format!(
        "bucketfs-events-test-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let cfg = FsConfig { staging_dir: dir, clock: clock.clone(), ..FsConfig::default() };
    let fs = Fs::new(store.clone(), cfg);
    let (tx, rx) = mpsc::channel(8);
    fs.follow_events(rx);
    std::mem::forget(tx); // the feed stays open; the tests hand items to `on_feed` directly
    fs
}

fn requests(store: &MemStore) -> u64 {
    store.requests.load(Relaxed)
}

async fn names(fs: &Fs) -> Vec<String> {
    let fh = fs.opendir(ROOT_INO).await.unwrap();
    let v = fs.readdir(fh).unwrap().iter().skip(2).map(|e| e.name.clone()).collect();
    fs.releasedir(fh);
    v
}

async fn write(fs: &Fs, name: &str, data: &[u8]) {
    let (_, fh) = fs.create(ROOT_INO, name, libc::O_TRUNC, None).await.unwrap();
    fs.write(fh, 0, data).await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
}

fn put(key: &str, size: u64, etag: &str) -> Feed {
    Feed::Event(Event::Put { key: key.into(), size, etag: Some(etag.into()), mtime: None })
}

#[tokio::test]
async fn while_events_flow_listings_outlive_the_ttl_and_changes_arrive_without_requests() {
    let store = Arc::new(MemStore::new());
    store.put("a.txt", Bytes::from_static(b"aaa"), PutOpts::default()).await.unwrap();
    let clock = Clock::manual();
    let fs = fs_on(&store, &clock);
    fs.on_feed(Feed::Up);
    assert_eq!(names(&fs).await, ["a.txt"]);
    let before = requests(&store);
    clock.advance(Duration::from_secs(30));
    assert_eq!(names(&fs).await, ["a.txt"], "trusted past the TTL");
    fs.on_feed(put("b.txt", 5, "e-b"));
    fs.on_feed(put("d/deep.txt", 1, "e-d"));
    fs.on_feed(Feed::Event(Event::Removed { key: "a.txt".into() }));
    assert_eq!(names(&fs).await, ["b.txt", "d"]);
    assert_eq!(fs.lookup(ROOT_INO, "b.txt").await.unwrap().size, 5);
    assert!(matches!(fs.lookup(ROOT_INO, "a.txt").await, Err(FsError::NotFound)));
    assert_eq!(requests(&store), before, "no store request: the events told it all");
    assert_eq!(fs.event_stats().applied, 3);

    // However long events flow, an answer is trusted on their word for so long only: a
    // change whose event the source held back or lost shows then (tester V: a removal
    // stayed listed for good on a quiet MinIO).
    // (The events above were told, not made: the store holds `a.txt` alone now.)
    store.delete("b.txt").await.unwrap(); // no event comes
    clock.advance(crate::events::EVENT_TRUST_MAX);
    assert_eq!(names(&fs).await, ["a.txt"], "a listing stayed trusted past the events' bound");
    assert!(matches!(fs.lookup(ROOT_INO, "b.txt").await, Err(FsError::NotFound)));
    let before = requests(&store);

    // The feed stops: the TTL is back, and the next readdir asks the store.
    fs.on_feed(Feed::Down("cut".into()));
    assert!(!fs.event_stats().up && fs.event_stats().down_reason.as_deref() == Some("cut"));
    clock.advance(Duration::from_secs(2));
    names(&fs).await;
    assert!(requests(&store) > before, "past the TTL with no events, the store is asked");
}

#[tokio::test]
async fn an_event_told_late_never_undoes_a_newer_change_here() {
    let store = Arc::new(MemStore::new());
    let clock = Clock::manual();
    let fs = fs_on(&store, &clock);
    fs.on_feed(Feed::Up);
    names(&fs).await;
    write(&fs, "x", b"version one").await;
    let v1 = fs.lookup(ROOT_INO, "x").await.unwrap();
    let v1_etag = store.head("x", Default::default()).await.unwrap().meta.etag.unwrap();
    write(&fs, "x", b"version two, longer").await;
    write(&fs, "gone", b"soon gone").await;
    fs.unlink(ROOT_INO, "gone").await.unwrap();
    // The first version's event, and the removed file's creation, arrive now.
    fs.on_feed(put("x", v1.size, &v1_etag));
    fs.on_feed(put("gone", 9, "e-gone"));
    assert_eq!(fs.lookup(ROOT_INO, "x").await.unwrap().size, 19, "the newer version stays");
    assert!(matches!(fs.lookup(ROOT_INO, "gone").await, Err(FsError::NotFound)), "no revival");
    assert_eq!(names(&fs).await, ["x"]);
    assert!(fs.event_stats().expired >= 1, "checked with the store instead");
}

#[tokio::test]
async fn a_gap_sends_what_was_cached_back_to_its_ttl() {
    let store = Arc::new(MemStore::new());
    store.put("a.txt", Bytes::from_static(b"a"), PutOpts::default()).await.unwrap();
    let clock = Clock::manual();
    let fs = fs_on(&store, &clock);
    fs.on_feed(Feed::Up);
    names(&fs).await;
    clock.advance(Duration::from_secs(10));
    // Events were lost: another client's new file, never told.
    store.put("b.txt", Bytes::from_static(b"b"), PutOpts::default()).await.unwrap();
    fs.on_feed(Feed::Gap);
    assert_eq!(names(&fs).await, ["a.txt", "b.txt"], "listed again after the gap");
    assert_eq!(fs.event_stats().gaps, 1);
}

#[tokio::test]
async fn the_kernel_timeouts_stay_short_with_events() {
    let store = Arc::new(MemStore::new());
    let clock = Clock::manual();
    let dir = std::env::temp_dir().join("bucketfs-events-ttl");
    let cfg = FsConfig { staging_dir: dir, clock, metadata_ttl: Duration::from_secs(3600), ..FsConfig::default() };
    let fs = Fs::new(store, cfg);
    assert_eq!(fs.ttl(), Duration::from_secs(3600));
    let (_tx, rx) = mpsc::channel(1);
    fs.follow_events(rx);
    assert_eq!(fs.ttl(), KERNEL_TTL_CAP);
}

#[tokio::test]
async fn a_listing_sent_before_an_event_never_erases_it() {
    use bucketfs_store::testing::{FailStore, Op};
    use bucketfs_store::StoreErrorKind;
    let mem = Arc::new(MemStore::new());
    mem.put("a.txt", Bytes::from_static(b"a"), PutOpts::default()).await.unwrap();
    let fail = Arc::new(FailStore::new(mem.clone(), Op::Check, u64::MAX, 0, StoreErrorKind::Other));
    let clock = Clock::manual();
    let dir = std::env::temp_dir().join(format!("bucketfs-events-race-{}", std::process::id()));
    let fs = Fs::new(fail.clone(), FsConfig { staging_dir: dir, clock: clock.clone(), ..FsConfig::default() });
    let (tx, rx) = mpsc::channel(1);
    fs.follow_events(rx);
    std::mem::forget(tx);
    fs.on_feed(Feed::Up);
    // A readdir's LIST goes out and is held; meanwhile another client adds b.txt and its
    // event arrives; then the (older) listing answers.
    let permits = fail.hold(Op::List, 1);
    let reader = {
        let fs = fs.clone();
        tokio::spawn(async move { names(&fs).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    mem.put("b.txt", Bytes::from_static(b"bb"), PutOpts::default()).await.unwrap();
    fs.on_feed(put("b.txt", 2, "e-b"));
    permits.add_permits(1);
    let _ = reader.await.unwrap();
    clock.advance(Duration::from_secs(30));
    // The next readdir must show b.txt: the held listing may not stand as trusted.
    assert_eq!(names(&fs).await, ["a.txt", "b.txt"]);
}

#[tokio::test]
async fn a_name_probed_absent_shows_once_an_event_makes_it() {
    let store = Arc::new(MemStore::new());
    let clock = Clock::manual();
    let fs = fs_on(&store, &clock);
    fs.on_feed(Feed::Up);
    // Probed absent (no listing of the root yet): cached as absent for the TTL.
    assert!(matches!(fs.lookup(ROOT_INO, "newdir").await, Err(FsError::NotFound)));
    store.put("newdir/f", Bytes::from_static(b"f"), PutOpts::default()).await.unwrap();
    fs.on_feed(put("newdir/f", 1, "e-f"));
    assert_eq!(fs.lookup(ROOT_INO, "newdir").await.unwrap().kind, Kind::Dir);
}

#[tokio::test]
async fn an_event_for_a_key_the_store_cannot_address_shows_nothing() {
    // S3 through OpenDAL trims a key's edge whitespace: `dup ` would read and write `dup`.
    let store = Arc::new(MemStore::new().trimming_whitespace());
    let clock = Clock::manual();
    let fs = fs_on(&store, &clock);
    fs.on_feed(Feed::Up);
    write(&fs, "dup", b"mine").await;
    assert_eq!(names(&fs).await, ["dup"]);
    clock.advance(Duration::from_secs(30)); // past the window in which our own change is echoed
    fs.on_feed(put("dup ", 5, "e-x"));
    fs.on_feed(put(" dup/x", 5, "e-y")); // a directory ` dup` would list `dup/`'s keys
    assert_eq!(names(&fs).await, ["dup"], "listed from the events, as the store's listing would be");
}

#[tokio::test]
async fn a_link_object_event_is_checked_under_the_links_name() {
    let store = Arc::new(MemStore::new());
    store.put("x.rclonelink", Bytes::from_static(b"target"), PutOpts::default()).await.unwrap();
    let clock = Clock::manual();
    let fs = fs_on(&store, &clock);
    fs.on_feed(Feed::Up);
    assert_eq!(names(&fs).await, ["x"]);
    assert_eq!(fs.lookup(ROOT_INO, "x").await.unwrap().kind, Kind::Symlink);
    store.delete("x.rclonelink").await.unwrap();
    fs.on_feed(Feed::Event(Event::Removed { key: "x.rclonelink".into() }));
    assert!(fs.event_stats().expired >= 1, "checked with the store");
    assert!(names(&fs).await.is_empty(), "the removed link is gone");
}

/// A flood of events while the kernel takes no notice (the notifier blocks): the notices
/// wait in one bounded queue on one thread, the rest are dropped and counted, and every
/// event still reaches the mount's own view. (Each notice was a blocking task of its own:
/// a flood queued one per event, without bound.)
#[tokio::test]
async fn a_flood_of_events_queues_a_bounded_number_of_kernel_notices() {
    let store = Arc::new(MemStore::new());
    let clock = Clock::manual();
    let fs = fs_on(&store, &clock);
    let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
    let gate = std::sync::Mutex::new(gate_rx);
    let told = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = told.clone();
    fs.on_entry_change(Arc::new(move |_dir, _name| {
        let _ = gate.lock().unwrap().recv(); // the kernel is busy until the gate opens
        counter.fetch_add(1, Relaxed);
    }));
    fs.on_feed(Feed::Up);
    assert_eq!(names(&fs).await, Vec::<String>::new());
    let n = 3 * NOTICES_QUEUED as u64;
    for i in 0..n {
        fs.on_feed(put(&format!("f{i}"), 1, "e"));
    }
    let dropped = fs.event_stats().notices_dropped;
    // One notice may be taken by the thread (waiting at the gate), the queue holds the bound.
    assert!(dropped >= n - NOTICES_QUEUED as u64 - 1, "dropped {dropped} of {n}");
    assert_eq!(names(&fs).await.len() as u64, n, "the mount shows every name");
    for _ in 0..n {
        let _ = gate_tx.send(());
    }
    drop(gate_tx);
    // The thread sends what it queued, in order, and no more.
    for _ in 0..3000 {
        if told.load(Relaxed) == n - dropped {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(told.load(Relaxed), n - dropped, "every queued notice reached the kernel");
}

#[tokio::test]
async fn a_change_the_source_cannot_place_is_asked_of_the_store_not_believed() {
    let store = Arc::new(MemStore::new());
    store.put("a.txt", Bytes::from_static(b"v2-longer"), PutOpts::default()).await.unwrap();
    let clock = Clock::manual();
    let fs = fs_on(&store, &clock);
    fs.on_feed(Feed::Up);
    assert_eq!(fs.lookup(ROOT_INO, "a.txt").await.unwrap().size, 9);
    assert_eq!(names(&fs).await, ["a.txt"]);
    // Another client writes v3; a late, unplaceable event about the name arrives.
    store.put("a.txt", Bytes::from_static(b"v3"), PutOpts::default()).await.unwrap();
    store.put("b.txt", Bytes::from_static(b"b"), PutOpts::default()).await.unwrap();
    let before = requests(&store);
    fs.on_feed(Feed::Event(Event::Changed { key: "a.txt".into() }));
    assert_eq!(requests(&store), before, "nothing asked until someone looks");
    assert_eq!(fs.lookup(ROOT_INO, "a.txt").await.unwrap().size, 2, "the store's answer, not a cached one");
    assert_eq!(names(&fs).await, ["a.txt", "b.txt"], "the listing was dropped and fetched again");
    // Below a name the listing does not show: the listing is fetched again.
    store.put("new/x", Bytes::from_static(b"x"), PutOpts::default()).await.unwrap();
    fs.on_feed(Feed::Event(Event::Changed { key: "new/x".into() }));
    assert_eq!(names(&fs).await, ["a.txt", "b.txt", "new"]);
    assert_eq!(fs.event_stats().expired, 2);
}

#[tokio::test]
async fn a_directory_implied_by_its_last_removed_key_goes_with_it() {
    let store = Arc::new(MemStore::new());
    store.put("implied/x", Bytes::from_static(b"x"), PutOpts::default()).await.unwrap();
    store.put("marked/", Bytes::new(), PutOpts::default()).await.unwrap();
    store.put("marked/y", Bytes::from_static(b"y"), PutOpts::default()).await.unwrap();
    store.put("full/a", Bytes::from_static(b"a"), PutOpts::default()).await.unwrap();
    store.put("full/b", Bytes::from_static(b"b"), PutOpts::default()).await.unwrap();
    let clock = Clock::manual();
    let fs = fs_on(&store, &clock);
    fs.on_feed(Feed::Up);
    assert_eq!(names(&fs).await, ["full", "implied", "marked"]);
    for d in ["implied", "marked", "full"] {
        let ino = fs.lookup(ROOT_INO, d).await.unwrap().ino;
        let fh = fs.opendir(ino).await.unwrap();
        assert!(fs.readdir(fh).unwrap().len() >= 3, "{d}: . .. and its names");
        fs.releasedir(fh);
    }
    for key in ["implied/x", "marked/y", "full/a"] {
        store.delete(key).await.unwrap();
        fs.on_feed(Feed::Event(Event::Removed { key: key.into() }));
    }
    // The root is listed again once: the implied directory is gone, the marked one stays.
    let before = requests(&store);
    assert_eq!(names(&fs).await, ["full", "marked"]);
    assert!(requests(&store) > before, "the root was asked again");
    let before = requests(&store);
    assert_eq!(names(&fs).await, ["full", "marked"]);
    assert_eq!(requests(&store), before, "and trusted again after");
}

#[tokio::test]
async fn a_directory_that_comes_back_after_going_shows_again() {
    let store = Arc::new(MemStore::new());
    store.put("d/x", Bytes::from_static(b"x"), PutOpts::default()).await.unwrap();
    let clock = Clock::manual();
    let fs = fs_on(&store, &clock);
    fs.on_feed(Feed::Up);
    let d = fs.lookup(ROOT_INO, "d").await.unwrap().ino;
    let fh = fs.opendir(d).await.unwrap();
    fs.releasedir(fh);
    store.delete("d/x").await.unwrap();
    fs.on_feed(Feed::Event(Event::Removed { key: "d/x".into() }));
    assert!(names(&fs).await.is_empty(), "gone with its last key");
    // Another client writes below it again: the event reaches the root, whose listing
    // no longer shows `d`, and `d`'s old (empty) listing is not trusted.
    store.put("d/y", Bytes::from_static(b"y"), PutOpts::default()).await.unwrap();
    fs.on_feed(put("d/y", 1, "e-y"));
    assert_eq!(names(&fs).await, ["d"]);
    let d = fs.lookup(ROOT_INO, "d").await.unwrap().ino;
    let fh = fs.opendir(d).await.unwrap();
    let inside: Vec<String> = fs.readdir(fh).unwrap().iter().skip(2).map(|e| e.name.clone()).collect();
    fs.releasedir(fh);
    assert_eq!(inside, ["y"]);
}

/// A directory reached by name (its parent never listed, its own contents never listed),
/// implied by one key: when an event removes that key, the directory's own name is asked
/// of the store again instead of being answered from its node (review of 5d217a0).
#[tokio::test]
async fn a_directory_reached_by_name_goes_when_an_event_removes_its_only_key() {
    let store = Arc::new(MemStore::new());
    store.put("jobs/123/out", Bytes::from_static(b"o"), PutOpts::default()).await.unwrap();
    let clock = Clock::manual();
    let fs = fs_on(&store, &clock);
    fs.on_feed(Feed::Up);
    let jobs = fs.lookup(ROOT_INO, "jobs").await.unwrap();
    let job = fs.lookup(jobs.ino, "123").await.unwrap();
    let before = requests(&store);
    assert_eq!(fs.lookup(jobs.ino, "123").await.unwrap().ino, job.ino);
    assert_eq!(requests(&store), before, "a confirmed node answers");
    store.delete("jobs/123/out").await.unwrap();
    fs.on_feed(Feed::Event(Event::Removed { key: "jobs/123/out".into() }));
    assert!(matches!(fs.lookup(jobs.ino, "123").await, Err(FsError::NotFound)), "the directory went with its key");
    fs.check_invariants();
}

/// A node confirmed before its directory was last asked about does not answer a lookup by
/// itself: the directory was expired since, so what is below it is not vouched for.
#[tokio::test]
async fn a_name_below_an_expired_directory_is_asked_again() {
    let store = Arc::new(MemStore::new());
    store.put("w/x", Bytes::from_static(b"x"), PutOpts::default()).await.unwrap();
    store.put("w/y", Bytes::from_static(b"y"), PutOpts::default()).await.unwrap();
    let clock = Clock::manual();
    let fs = fs_on(&store, &clock);
    fs.on_feed(Feed::Up);
    let w = fs.lookup(ROOT_INO, "w").await.unwrap();
    fs.lookup(w.ino, "x").await.unwrap();
    // Another client removes w/x; the event is one the source cannot place: `w` is expired.
    store.delete("w/x").await.unwrap();
    clock.advance(Duration::from_millis(10));
    fs.on_feed(Feed::Event(Event::Changed { key: "w/".into() }));
    clock.advance(Duration::from_millis(10));
    assert_eq!(fs.lookup(ROOT_INO, "w").await.unwrap().ino, w.ino, "w is still there (w/y)");
    assert!(matches!(fs.lookup(w.ino, "x").await, Err(FsError::NotFound)), "x was confirmed before w was asked again");
    fs.check_invariants();
}

/// A listing from before the events began, served again while the store is unreachable,
/// stays on its TTL: serving it must not make it look fetched while events flowed (they
/// never told what changed before they began), or it would be trusted for good.
#[tokio::test]
async fn a_listing_served_through_an_outage_is_not_vouched_for_by_events() {
    use bucketfs_store::testing::{FailStore, Op};
    use bucketfs_store::StoreErrorKind;
    let mem = Arc::new(MemStore::new());
    mem.put("a.txt", Bytes::from_static(b"a"), PutOpts::default()).await.unwrap();
    // The second LIST finds the store unreachable; the others answer.
    let fail = Arc::new(FailStore::new(mem.clone(), Op::List, 2, 1, StoreErrorKind::Unavailable));
    let clock = Clock::manual();
    let dir = std::env::temp_dir().join(format!("bucketfs-events-outage-{}", std::process::id()));
    let cfg = FsConfig { staging_dir: dir, clock: clock.clone(), list_ahead_keys: 0, ..FsConfig::default() };
    let fs = Fs::new(fail.clone(), cfg);
    let (tx, rx) = mpsc::channel(1);
    fs.follow_events(rx);
    std::mem::forget(tx);
    assert_eq!(names(&fs).await, ["a.txt"]);
    // Another client's change before the events began: no event tells it.
    mem.put("b.txt", Bytes::from_static(b"b"), PutOpts::default()).await.unwrap();
    clock.advance(Duration::from_millis(100));
    fs.on_feed(Feed::Up);
    clock.advance(Duration::from_secs(2));
    assert_eq!(names(&fs).await, ["a.txt"], "the last listing, served through the outage");
    clock.advance(Duration::from_secs(2));
    assert_eq!(names(&fs).await, ["a.txt", "b.txt"], "past the TTL again, the store is asked");
}

/// A mount of `store` following events, with directory `d` (an empty marker) listed.
async fn with_d_listed_empty(store: &Arc<MemStore>) -> Arc<Fs> {
    store.put("d/", Bytes::new(), PutOpts::default()).await.unwrap();
    let fs = fs_on(store, &Clock::manual());
    fs.on_feed(Feed::Up);
    let d = fs.lookup(ROOT_INO, "d").await.unwrap().ino;
    let fh = fs.opendir(d).await.unwrap();
    assert_eq!(fs.readdir(fh).unwrap().len(), 2, "empty");
    fs.releasedir(fh);
    fs
}

/// An event for a key not shown (`d//y`) marks the directories above it as holding it:
/// `rmdir` asks the store there instead of its cached, empty listing.
#[tokio::test]
async fn an_event_for_a_key_not_shown_keeps_its_directory_from_rmdir() {
    let store = Arc::new(MemStore::new());
    let fs = with_d_listed_empty(&store).await;
    store.put("d//y", Bytes::from_static(b"y"), PutOpts::default()).await.unwrap();
    fs.on_feed(put("d//y", 1, "e-y"));
    assert!(fs.table.lock().unwrap().holds_hidden("d/"));
    assert!(matches!(fs.rmdir(ROOT_INO, "d").await, Err(FsError::NotEmpty)));
}

/// Another client puts bytes at a marker already listed empty: the directory then holds a
/// key not shown, so write-back's `rmdir` asks the store and keeps those bytes.
#[tokio::test]
async fn an_event_putting_bytes_at_a_marker_keeps_its_directory_from_rmdir() {
    let store = Arc::new(MemStore::new());
    let fs = with_d_listed_empty(&store).await;
    assert!(!fs.table.lock().unwrap().holds_hidden("d/"));
    store.put("d/", Bytes::from_static(b"payload"), PutOpts::default()).await.unwrap();
    fs.on_feed(put("d/", 7, "e-d"));
    assert!(fs.table.lock().unwrap().holds_hidden("d/"));
    assert!(matches!(fs.rmdir(ROOT_INO, "d").await, Err(FsError::NotEmpty)));
    assert_eq!(bucketfs_store::StoreExt::stat(store.as_ref(), "d/").await.unwrap().size, 7);
}
