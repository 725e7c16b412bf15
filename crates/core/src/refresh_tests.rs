//! A write-back mount answers with what it knows when the store is slow to refresh it
//! (`Fs::refresh_within`): a listing or a file's attributes past their TTL, with the
//! store's answers held (`FailStore::hold`). The held answers are recorded once they come.

use std::sync::Arc;
use std::time::Duration;

use bucketfs_store::testing::{FailStore, MemStore, Op};
use bucketfs_store::{Store, StoreErrorKind};

use crate::fs::{Fs, FsConfig, ROOT_INO};
use crate::write_back::tests::{cfg, listed, staging};

/// Comfortably past `KNOWN_ANSWER_WAIT` (fs_listing.rs), far below a hanging store's minutes.
const ANSWERED_WITHIN: Duration = Duration::from_secs(4);

struct Held {
    mem: Arc<MemStore>,
    lists: Arc<FailStore>,
    heads: Arc<FailStore>,
    fs: Arc<Fs>,
    clock: crate::Clock,
}

/// A mount (write-back or not) of a memory store holding `d/a`, `d/b` and `w/a` beside
/// 1,000 other files (a directory too wide to list again for a `stat`: a HEAD answers),
/// whose LISTs and HEADs a test can hold; `d` listed and `w/a` stat'ed, TTL 1 s on a
/// manual clock.
async fn mount(name: &str, write_back: bool) -> (Held, u64, u64) {
    let mem = Arc::new(MemStore::new());
    for k in ["d/a", "d/b", "w/a"] {
        mem.put(k, bytes::Bytes::from_static(b"known"), Default::default()).await.unwrap();
    }
    for i in 0..crate::fs::RELIST_MAX {
        mem.put(&format!("w/f{i:04}"), bytes::Bytes::new(), Default::default()).await.unwrap();
    }
    let never = |inner: Arc<dyn Store>, op| Arc::new(FailStore::new(inner, op, u64::MAX, 0, StoreErrorKind::Other));
    let lists = never(mem.clone(), Op::List);
    let heads = never(lists.clone(), Op::Head);
    let clock = crate::Clock::manual();
    let mut c = FsConfig { metadata_ttl: Duration::from_secs(1), clock: clock.clone(), ..cfg(&staging(name), 0) };
    if !write_back {
        c.write_back = None;
    }
    let fs = Fs::new(heads.clone(), c);
    let d = fs.lookup(ROOT_INO, "d").await.unwrap().ino;
    assert_eq!(listed(&fs, d).await.unwrap(), [".", "..", "a", "b"]);
    let w = fs.lookup(ROOT_INO, "w").await.unwrap().ino;
    assert_eq!(listed(&fs, w).await.unwrap().len(), 2 + 1 + crate::fs::RELIST_MAX);
    let a = fs.lookup(w, "a").await.unwrap().ino;
    (Held { mem, lists, heads, fs, clock }, d, a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_back_mount_answers_what_it_knows_while_the_store_is_slow() {
    let (h, d, a) = mount("known-answers", true).await;
    h.mem.put("d/c", bytes::Bytes::from_static(b"another client's"), Default::default()).await.unwrap();
    h.clock.advance(Duration::from_secs(2)); // past the TTL of the listing and of `a`
    let list_permits = h.lists.hold(Op::List, 100);
    let head_permits = h.heads.hold(Op::Head, 100);

    // A HEAD overdue: the store hangs, and the listing after it does not wait at all.
    let attr = tokio::time::timeout(ANSWERED_WITHIN, h.fs.getattr(a)).await;
    assert_eq!(attr.expect("stat waited for the held answer").unwrap().size, 5);
    assert_eq!(h.fs.overdue_refreshes.load(std::sync::atomic::Ordering::SeqCst), 1);
    let names = tokio::time::timeout(Duration::from_millis(500), listed(&h.fs, d)).await;
    assert_eq!(names.expect("ls waited though a HEAD was overdue").unwrap(), [".", "..", "a", "b"]);
    // Given no wait, it does not count: the count falls once the store answers the HEAD.
    assert_eq!(h.fs.overdue_refreshes.load(std::sync::atomic::Ordering::SeqCst), 1);

    // The answers come: the listing goes on in the background and is recorded.
    list_permits.add_permits(100);
    head_permits.add_permits(100);
    h.lists.disarm();
    h.heads.disarm();
    let recorded = async {
        while listed(&h.fs, d).await.unwrap() != [".", "..", "a", "b", "c"] {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), recorded).await.expect("the held listing was never recorded");
    let settled = async {
        while h.fs.overdue_refreshes.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), settled).await.expect("refreshes still counted overdue");
}

/// A listing of a directory that fit one page, overdue, shows the store hangs as a HEAD
/// does: the next listing does not wait at all (`ls -R`, `find` and a path's every level
/// would otherwise wait again). One of a directory wider than a page does not count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overdue_listing_of_one_page_shows_the_store_hangs() {
    let (h, d, a) = mount("overdue-listing", true).await;
    let w = h.fs.node(a).unwrap().parent;
    h.mem.put("e/a", bytes::Bytes::from_static(b"known"), Default::default()).await.unwrap();
    let e = h.fs.lookup(ROOT_INO, "e").await.unwrap().ino;
    assert_eq!(listed(&h.fs, e).await.unwrap(), [".", "..", "a"]);
    h.clock.advance(Duration::from_secs(2)); // past the TTL of every listing
    let list_permits = h.lists.hold(Op::List, 100);
    let overdue = || h.fs.overdue_refreshes.load(std::sync::atomic::Ordering::SeqCst);

    let wide = tokio::time::timeout(ANSWERED_WITHIN, listed(&h.fs, w)).await;
    assert_eq!(wide.expect("ls of the wide directory waited").unwrap().len(), 2 + 1 + crate::fs::RELIST_MAX);
    assert_eq!(overdue(), 0, "a listing of many pages counted as one small request");
    let names = tokio::time::timeout(ANSWERED_WITHIN, listed(&h.fs, d)).await;
    assert_eq!(names.expect("ls waited for the held listing").unwrap(), [".", "..", "a", "b"]);
    assert_eq!(overdue(), 1);
    let next = tokio::time::timeout(Duration::from_millis(500), listed(&h.fs, e)).await;
    assert_eq!(next.expect("ls waited though a listing was overdue").unwrap(), [".", "..", "a"]);
    assert_eq!(overdue(), 1, "a refresh given no wait counted");

    list_permits.add_permits(100);
    h.lists.disarm();
    let settled = async {
        while overdue() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), settled).await.expect("refreshes still counted overdue");
}

/// A refresh the caller stopped waiting for still lists and is recorded, though the stale
/// listing was renewed meanwhile (`serve_stale_listing`): here the refresh waits behind
/// another listing of the directory until after the renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_given_up_on_is_recorded_though_the_listing_was_renewed() {
    let (h, d, _) = mount("given-up-refresh", true).await;
    h.mem.put("d/c", bytes::Bytes::from_static(b"another client's"), Default::default()).await.unwrap();
    h.clock.advance(Duration::from_secs(2));
    let flight = h.fs.listing_flight(d);
    let other_listing = flight.lock.lock().await;
    let names = tokio::time::timeout(ANSWERED_WITHIN, listed(&h.fs, d)).await;
    assert_eq!(names.expect("ls waited past the known-answer wait").unwrap(), [".", "..", "a", "b"]);
    drop(other_listing);
    let recorded = async {
        while listed(&h.fs, d).await.unwrap() != [".", "..", "a", "b", "c"] {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), recorded).await.expect("the refresh was dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_without_write_back_waits_for_the_store() {
    let (h, d, _) = mount("known-answers-wait", false).await;
    h.mem.put("d/c", bytes::Bytes::from_static(b"another client's"), Default::default()).await.unwrap();
    h.clock.advance(Duration::from_secs(2));
    let permits = h.lists.hold(Op::List, 100);
    let fs = h.fs.clone();
    let ls = tokio::spawn(async move { listed(&fs, d).await });
    tokio::time::sleep(ANSWERED_WITHIN).await;
    assert!(!ls.is_finished(), "ls answered without the store's listing");
    permits.add_permits(100);
    assert_eq!(ls.await.unwrap().unwrap(), [".", "..", "a", "b", "c"]);
}

/// `rmdir` of a directory whose listing is past its TTL, while the store does not answer
/// listings: a write-back mount answers from the listing it knows (renewed, as `ls` is),
/// within moments, not when the store's requests time out; one the listing shows holding
/// a file is still not empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmdir_past_the_ttl_answers_what_it_knows_while_the_store_is_slow() {
    let (h, _, _) = mount("rmdir-known", true).await;
    h.fs.mkdir(ROOT_INO, "e", None).await.unwrap();
    h.clock.advance(Duration::from_secs(2)); // past the TTL of both listings
    let _permits = h.lists.hold(Op::List, 100);
    let r = tokio::time::timeout(ANSWERED_WITHIN, h.fs.rmdir(ROOT_INO, "d")).await;
    assert!(matches!(r.expect("rmdir of d waited for the held listing"), Err(crate::FsError::NotEmpty)));
    let r = tokio::time::timeout(ANSWERED_WITHIN, h.fs.rmdir(ROOT_INO, "e")).await;
    r.expect("rmdir of e waited for the held listing").unwrap();
    h.lists.disarm();
}
