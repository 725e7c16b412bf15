//! A pending change that a later one takes the place of while its attempt is out: a move
//! (`mv a b; rm b`), whose old key is left alone once a new file of that name goes up (the
//! model test's `rename` ENOENT, issue 42's first item); a directory's marker withdrawn
//! (`rmdir`), deleted twice only if its put may still land.

use std::sync::Arc;
use std::time::Duration;

use bucketfs_store::testing::{FailStore, MemStore, Op};
use bucketfs_store::{PutOpts, Store, StoreErrorKind};

use crate::deletes::DeferredDeletes;
use crate::write_back::tests::{keys, object, staging};

fn bytes(b: &'static [u8]) -> bytes::Bytes {
    bytes::Bytes::from_static(b)
}

/// `mv a d/b` waits for `d/`'s marker (held); `rm d/b` turns it into deletes of `d/b` and
/// `a`; a new `a` is written. Once the marker is made, the move must not go after all:
/// sent, it copied the new `a` to `d/b` and deleted it.
#[tokio::test]
async fn a_move_replaced_while_it_waits_for_a_marker_is_not_sent() {
    let mem = Arc::new(MemStore::new());
    mem.put("a", bytes(b"renamed away"), PutOpts::default()).await.unwrap();
    let copies = Arc::new(FailStore::new(mem.clone(), Op::Copy, u64::MAX, 0, StoreErrorKind::Other)); // counts
    let held = Arc::new(FailStore::new(copies.clone(), Op::Check, u64::MAX, 0, StoreErrorKind::Other));
    let dd = DeferredDeletes::new(held.clone(), &staging("move-replaced-waiting"));
    DeferredDeletes::start(&dd);
    let markers = held.hold(Op::CreateDir, u32::MAX); // made, but answered only later
    dd.defer_marker("d/").await.unwrap();
    assert!(dd.defer_move("a", "d/b", None, None).await.unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await; // its attempt waits for the marker
    dd.defer("d/b").await.unwrap();
    let put = tokio::spawn({
        let dd = dd.clone();
        async move { dd.put("a", bytes(b"made again"), PutOpts::default()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    markers.add_permits(1_000);
    tokio::time::timeout(Duration::from_secs(10), put).await.expect("the PUT waited for good").unwrap().unwrap();
    assert!(dd.drain_all().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["a", "d/"]);
    assert_eq!(object(mem.as_ref(), "a").await.as_deref(), Some(&b"made again"[..]));
    assert_eq!(copies.calls(), 0, "the move was sent after `rm d/b` took its place");
}

/// `mv a b` whose copy is out (held), then `rm b` and a new `a`: the new `a` goes up only
/// after that attempt ends. Before, the delete of `a` and the new `a` went at once, and the
/// move, seeing `a` changed, copied the new one away and deleted it.
#[tokio::test]
async fn a_file_made_again_where_a_replaced_move_copies_from_is_kept() {
    let mem = Arc::new(MemStore::new());
    mem.put("a", bytes(b"renamed away"), PutOpts::default()).await.unwrap();
    let held = Arc::new(FailStore::new(mem.clone(), Op::Check, u64::MAX, 0, StoreErrorKind::Other));
    let dd = DeferredDeletes::new(held.clone(), &staging("move-replaced-copying"));
    DeferredDeletes::start(&dd);
    let copy = held.hold(Op::Copy, 1);
    assert!(dd.defer_move("a", "b", None, None).await.unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await; // its copy is out
    dd.defer("b").await.unwrap();
    let put = tokio::spawn({
        let dd = dd.clone();
        async move { dd.put("a", bytes(b"made again"), PutOpts::default()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!put.is_finished(), "the PUT went out while the move could still take `a`");
    copy.add_permits(1);
    tokio::time::timeout(Duration::from_secs(10), put).await.expect("the PUT waited for good").unwrap().unwrap();
    assert!(dd.drain_all().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["a"]);
    assert_eq!(object(mem.as_ref(), "a").await.as_deref(), Some(&b"made again"[..]));
}

/// `mv a b; mv b c` (the second goes after the first, whose copy is out), then `rm c`: both
/// moves are replaced by deletes while their attempts are out. Nothing waits for good (the
/// delete of `b` waited for the attempt of `c`'s move, which waited for `b`'s change: the
/// model test's `rename` hang), and nothing is left.
#[tokio::test]
async fn chained_moves_replaced_while_out_wait_for_nothing_for_good() {
    let mem = Arc::new(MemStore::new());
    mem.put("a", bytes(b"renamed twice"), PutOpts::default()).await.unwrap();
    let held = Arc::new(FailStore::new(mem.clone(), Op::Check, u64::MAX, 0, StoreErrorKind::Other));
    let dd = DeferredDeletes::new(held.clone(), &staging("chain-replaced"));
    DeferredDeletes::start(&dd);
    let copy = held.hold(Op::Copy, 1);
    assert!(dd.defer_move("a", "b", None, None).await.unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await; // its copy is out
    assert!(dd.defer_move("b", "c", None, None).await.unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await; // its attempt waits for `b`'s
    dd.defer("c").await.unwrap();
    copy.add_permits(1);
    let left =
        tokio::time::timeout(Duration::from_secs(10), dd.drain_all()).await.expect("the changes waited for good");
    assert!(left.is_empty(), "{left:?}");
    assert!(keys(mem.as_ref()).await.is_empty(), "{:?}", keys(mem.as_ref()).await);
}

/// `ln -s t b; mv b a; ln -s t2 b; rm a`, nothing sent yet: `rm a` turns the move into
/// deletes, but the old key `b` is the new link's by then, which goes up. Before, the
/// delete of `b` took the new link's place: it was never made (tester G, every run on S3).
#[tokio::test]
async fn a_link_made_at_a_moved_links_old_name_survives_the_moves_delete() {
    let mem = Arc::new(MemStore::new());
    mem.put("b.rclonelink", bytes(b"t"), PutOpts::default()).await.unwrap();
    let held = Arc::new(FailStore::new(mem.clone(), Op::Check, u64::MAX, 0, StoreErrorKind::Other));
    let dd = DeferredDeletes::new(held.clone(), &staging("link-again"));
    let copy = held.hold(Op::Copy, 1); // nothing goes before the last change is journaled
    DeferredDeletes::start(&dd);
    assert!(dd.defer_move("b.rclonelink", "a.rclonelink", None, None).await.unwrap());
    dd.defer_link("b.rclonelink", "t2").await.unwrap();
    dd.defer("a.rclonelink").await.unwrap();
    copy.add_permits(1);
    let left =
        tokio::time::timeout(Duration::from_secs(10), dd.drain_all()).await.expect("the changes waited for good");
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(keys(mem.as_ref()).await, ["b.rclonelink"]);
    assert_eq!(object(mem.as_ref(), "b.rclonelink").await.as_deref(), Some(&b"t2"[..]));
}

/// A directory's marker whose request was cut off (it may still land) and which is then
/// withdrawn (`rmdir`, or `mv tmp ckpt` before it went up) is deleted twice, as a link is:
/// the marker landing after the first delete does not bring the directory back.
#[tokio::test]
async fn a_marker_withdrawn_after_a_cut_off_attempt_is_deleted_twice() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("marker-landing");
    std::fs::create_dir_all(&dir).unwrap();
    // Counts the deletes.
    let deletes = Arc::new(FailStore::new(mem.clone(), Op::Delete, u64::MAX, 0, StoreErrorKind::Other));
    // Every attempt is cut off (the test lands the marker itself): the withdraw finds it
    // sent however long the test takes to get there.
    let cut = Arc::new(FailStore::new(deletes.clone(), Op::CreateDir, 1, u64::MAX, StoreErrorKind::Unavailable));
    let dd = DeferredDeletes::new(cut.clone(), &dir);
    DeferredDeletes::start(&dd);
    dd.defer_marker("tmp/").await.unwrap();
    let wait = |what: &'static str, done: Box<dyn Fn() -> bool + Send>| async move {
        tokio::time::timeout(Duration::from_secs(5), async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect(what)
    };
    let c = cut.clone();
    wait("the marker's first attempt", Box::new(move || c.calls() >= 1)).await;
    dd.withdraw_marker("tmp/").await.unwrap();
    let d = deletes.clone();
    wait("the first delete", Box::new(move || d.calls() == 1)).await;
    mem.create_dir("tmp/").await.unwrap(); // the cut-off attempt lands now
    assert!(dd.drain_all().await.is_empty());
    assert!(keys(mem.as_ref()).await.is_empty(), "{:?}", keys(mem.as_ref()).await);
}

/// A marker withdrawn while its put is in flight, a put that then succeeds (`mkdir t;
/// rmdir t` in a busy directory): nothing can land later, so the delete goes once and
/// nothing waits out a second one. Before, every such `rmdir` kept a second delete pending
/// 3 s, and a directory with one pair a second had its listings wait for good: another
/// client's files never showed there (tester N).
#[tokio::test]
async fn a_marker_withdrawn_while_its_put_succeeds_is_deleted_once() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("marker-in-flight");
    std::fs::create_dir_all(&dir).unwrap();
    let deletes = Arc::new(FailStore::new(mem.clone(), Op::Delete, u64::MAX, 0, StoreErrorKind::Other));
    let puts = Arc::new(FailStore::new(deletes.clone(), Op::CreateDir, u64::MAX, 0, StoreErrorKind::Other));
    let permits = puts.hold(Op::CreateDir, 1);
    let dd = DeferredDeletes::new(puts.clone(), &dir);
    DeferredDeletes::start(&dd);
    dd.defer_marker("tmp/").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while puts.calls() < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the marker's put was not sent");
    dd.withdraw_marker("tmp/").await.unwrap();
    permits.add_permits(1);
    // Drained well within the grace a second delete would wait.
    let left = tokio::time::timeout(Duration::from_millis(2500), dd.drain_all()).await;
    assert_eq!(left.expect("the drain waited for a second delete"), []);
    assert_eq!(deletes.calls(), 1);
    assert!(keys(mem.as_ref()).await.is_empty(), "{:?}", keys(mem.as_ref()).await);
}
