//! Deferred deletes and directory markers (write-back mode) against the in-memory store:
//! unlink, mkdir and rmdir return before their requests, no listing contradicts them, and
//! what a crash leaves pending is done by the next mount.

use std::sync::Arc;
use std::time::Duration;

use bucketfs_store::testing::{FailStore, MemStore, Op};
use bucketfs_store::{Store, StoreErrorKind};

use crate::fs::{Fs, FsConfig, ROOT_INO};
use crate::write_back::tests::{cfg, cfg_ttl0, keys, listed, object, staging, uploaded_files, write_file};

#[tokio::test]
async fn unlink_returns_before_the_delete_and_no_listing_brings_the_file_back() {
    let mem = Arc::new(MemStore::new().with_latency(Duration::from_millis(40)));
    let dir = staging("deferred");
    let clock = crate::Clock::manual();
    let fs = Fs::new(mem.clone(), FsConfig { clock: clock.clone(), ..cfg(&dir, 0) });
    fs.start_write_back();
    let names = uploaded_files(&fs, 20).await;
    assert_eq!(listed(&fs, ROOT_INO).await.unwrap().len(), 22);
    let t = std::time::Instant::now();
    for name in &names {
        fs.unlink(ROOT_INO, name).await.unwrap();
    }
    // 20 DELETEs one after another take 800 ms here; journaled, the unlinks take far less.
    assert!(t.elapsed() < Duration::from_millis(400), "unlinks waited for their DELETEs: {:?}", t.elapsed());
    // Past the TTL every listing and lookup asks the store, which may still hold some of
    // them: none shows through the mount.
    clock.advance(Duration::from_secs(5));
    assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", ".."]);
    clock.advance(Duration::from_secs(5));
    for name in &names {
        assert!(fs.lookup(ROOT_INO, name).await.is_err(), "{name} found after its unlink");
    }
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(fs.write_back_status().deletes, 0);
    assert!(keys(mem.as_ref()).await.is_empty(), "{:?}", keys(mem.as_ref()).await);
}

#[tokio::test]
async fn a_name_made_again_after_its_unlink_keeps_the_new_file() {
    let mem = Arc::new(MemStore::new().with_latency(Duration::from_millis(20)));
    let dir = staging("deferred-again");
    let fs = Fs::new(mem.clone(), cfg_ttl0(&dir));
    fs.start_write_back();
    uploaded_files(&fs, 1).await;
    fs.unlink(ROOT_INO, "f00").await.unwrap();
    write_file(&fs, "f00", b"second").await; // the upload waits for the delete
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "f00").await.as_deref(), Some(&b"second"[..]));
}

#[tokio::test]
async fn a_delete_pending_at_a_crash_is_done_by_the_next_mount() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("deferred-crash");
    {
        // Every DELETE fails as if the store were unreachable: the unlink is only journaled.
        let down = Arc::new(FailStore::new(mem.clone(), Op::Delete, 1, 1_000_000, StoreErrorKind::Unavailable));
        let fs = Fs::new(down, cfg_ttl0(&dir));
        fs.start_write_back();
        uploaded_files(&fs, 3).await;
        fs.unlink(ROOT_INO, "f01").await.unwrap();
        // A listing meanwhile fails as the store does; it never shows the file.
        // A listing meanwhile gets the store's error (or the last listing): never the file.
        assert!(listed(&fs, ROOT_INO).await.map_or(true, |l| !l.contains(&"f01".to_string())));
        assert_eq!(fs.write_back_status().deletes, 1);
        assert!(!fs.sync_write_back().await.is_empty(), "sync says the delete is not done");
        // And an unmount now names it (before, it named staged files only, and exited 0).
        assert_eq!(fs.pending_keys().await, ["f01 (delete)"]);
    } // the "crash": the process goes with the delete pending
    assert!(object(mem.as_ref(), "f01").await.is_some());
    let fs = Fs::new(mem.clone(), cfg_ttl0(&dir));
    assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", "..", "f00", "f02"], "the pending delete is done first");
    fs.start_write_back();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["f00", "f02"]);
}

#[tokio::test]
async fn mkdir_returns_before_its_marker_and_no_listing_misses_the_directory() {
    let mem = Arc::new(MemStore::new().with_latency(Duration::from_millis(150)));
    let dir = staging("marker");
    let clock = crate::Clock::manual();
    let fs = Fs::new(mem.clone(), FsConfig { clock: clock.clone(), ..cfg(&dir, 0) });
    fs.start_write_back();
    assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", ".."]);
    let t = std::time::Instant::now();
    for name in ["a", "b", "c"] {
        fs.mkdir(ROOT_INO, name, None).await.unwrap();
    }
    // Three markers one after another take 450 ms here; journaled, the mkdirs take far less.
    assert!(t.elapsed() < Duration::from_millis(300), "mkdir waited for its marker: {:?}", t.elapsed());
    // Past the TTL the listing asks the store: it goes after the markers, never before.
    clock.advance(Duration::from_secs(3600));
    assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", "..", "a", "b", "c"]);
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["a/", "b/", "c/"]);
    assert_eq!(fs.write_back_status().deletes, 0);
}

#[tokio::test]
async fn rmdir_and_mkdir_again_end_as_the_last_one_said() {
    // Slow enough that a marker is still in flight when the rmdir comes.
    let mem = Arc::new(MemStore::new().with_latency(Duration::from_millis(60)));
    let dir = staging("marker-again");
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    fs.start_write_back();
    fs.mkdir(ROOT_INO, "gone", None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await; // its marker is being sent
    fs.rmdir(ROOT_INO, "gone").await.unwrap();
    fs.mkdir(ROOT_INO, "kept", None).await.unwrap();
    fs.rmdir(ROOT_INO, "kept").await.unwrap(); // replaces a marker not sent yet
    fs.mkdir(ROOT_INO, "kept", None).await.unwrap();
    let ino = fs.mkdir(ROOT_INO, "full", None).await.unwrap().ino;
    let (_, fh) = fs.create(ino, "f", 0, None).await.unwrap();
    fs.release(fh).await.unwrap();
    assert!(matches!(fs.rmdir(ROOT_INO, "full").await, Err(crate::FsError::NotEmpty)));
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["full/", "full/f", "kept/"]);
}

#[tokio::test]
async fn a_marker_pending_at_a_crash_is_made_by_the_next_mount() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("marker-crash");
    {
        // Every marker fails as if the store were unreachable: the mkdir is only journaled.
        let down = Arc::new(FailStore::new(mem.clone(), Op::CreateDir, 1, 1_000_000, StoreErrorKind::Unavailable));
        let fs = Fs::new(down, cfg(&dir, 0));
        fs.start_write_back();
        assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", ".."]);
        fs.mkdir(ROOT_INO, "d", None).await.unwrap();
        assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", "..", "d"]);
        assert!(!fs.sync_write_back().await.is_empty(), "sync says the marker is not made");
    } // the "crash"
    assert!(keys(mem.as_ref()).await.is_empty());
    let fs = Fs::new(mem.clone(), cfg_ttl0(&dir));
    assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", "..", "d"], "the pending marker is made first");
    fs.start_write_back();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["d/"]);
}

/// A delete of a key an upload may still land on is sent twice, 3 s apart; a crash
/// between the two left the next mount sending it once only, so an object landing late
/// stayed. The journal says which kind it is.
#[tokio::test]
async fn a_landing_delete_pending_at_a_crash_is_still_sent_twice() {
    use bucketfs_store::Store;
    let mem = Arc::new(MemStore::new());
    let dir = staging("landing-crash");
    std::fs::create_dir_all(&dir).unwrap();
    {
        let dd = crate::deletes::DeferredDeletes::new(mem.clone(), &dir);
        dd.defer_landing("late", None).await.unwrap(); // journaled; never sent: the "crash"
    }
    mem.put("late", bytes::Bytes::from_static(b"landed"), Default::default()).await.unwrap();
    let dd = crate::deletes::DeferredDeletes::new(mem.clone(), &dir);
    crate::deletes::DeferredDeletes::start(&dd);
    tokio::time::timeout(Duration::from_secs(5), async {
        while object(mem.as_ref(), "late").await.is_some() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the first delete");
    // The upload that hung lands now, after the first delete.
    mem.put("late", bytes::Bytes::from_static(b"landed late"), Default::default()).await.unwrap();
    assert!(dd.drain_all().await.is_empty());
    assert_eq!(object(mem.as_ref(), "late").await, None, "the second delete was not sent");
}

/// A crash after `mv a b` was sent, while `mv b c` (journaled `w`, after it) waits and a
/// delete of a new file at `b` is journaled: the next mount copies `b` to `c` before that
/// delete, as the mount that journaled them would have.
#[tokio::test]
async fn a_chained_move_whose_first_was_sent_goes_before_a_later_delete_after_a_crash() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("chained-after-crash");
    let journal = crate::deletes::journal_dir_for(&dir).unwrap();
    std::fs::create_dir_all(&journal).unwrap();
    std::fs::write(journal.join("1-1-1"), "w\0c\0b").unwrap();
    std::fs::write(journal.join("1-1-2"), "l\0b").unwrap();
    mem.put("b", bytes::Bytes::from_static(b"moved from a"), Default::default()).await.unwrap();
    let dd = crate::deletes::DeferredDeletes::new(mem.clone(), &dir);
    crate::deletes::DeferredDeletes::start(&dd); // the landing delete's second send
    let drained = tokio::time::timeout(Duration::from_secs(20), dd.drain_all()).await;
    assert!(drained.expect("the journal was never drained").is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["c"]);
    assert_eq!(object(mem.as_ref(), "c").await.as_deref(), Some(&b"moved from a"[..]));
}

/// A landing delete that names the MD5s of what was sent (a create-only upload cut off)
/// takes only an object with those bytes, at both of its deletes, also when a crash left
/// it journaled: an object another client made first, with other bytes, stays.
#[tokio::test]
async fn a_landing_delete_with_md5s_takes_only_those_bytes_also_after_a_crash() {
    for told in [true, false] {
        landing_delete_with_md5s(told).await;
    }
}

/// `told`: the store tells the MD5 in a head; else the delete reads the object to hash it.
async fn landing_delete_with_md5s(told: bool) {
    use bucketfs_store::Store;
    let md5 = |b: &[u8]| -> [u8; 16] { <md5::Md5 as md5::Digest>::digest(b).into() };
    let mem = Arc::new(if told { MemStore::new().with_md5() } else { MemStore::new() });
    let dir = staging(&format!("landing-md5-{told}"));
    std::fs::create_dir_all(&dir).unwrap();
    {
        let dd = crate::deletes::DeferredDeletes::new(mem.clone(), &dir);
        dd.defer_landing("ours", Some(vec![md5(b"ours")])).await.unwrap();
        dd.defer_landing("theirs", Some(vec![md5(b"ours too")])).await.unwrap();
    }
    mem.put("ours", bytes::Bytes::from_static(b"ours"), Default::default()).await.unwrap();
    mem.put("theirs", bytes::Bytes::from_static(b"another client's"), Default::default()).await.unwrap();
    let dd = crate::deletes::DeferredDeletes::new(mem.clone(), &dir);
    crate::deletes::DeferredDeletes::start(&dd);
    tokio::time::timeout(Duration::from_secs(5), async {
        while object(mem.as_ref(), "ours").await.is_some() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the first delete of our bytes");
    // Between the two deletes: ours lands late, and another client writes the other key.
    mem.put("ours", bytes::Bytes::from_static(b"ours"), Default::default()).await.unwrap();
    mem.put("theirs", bytes::Bytes::from_static(b"theirs, rewritten"), Default::default()).await.unwrap();
    assert!(dd.drain_all().await.is_empty());
    assert_eq!(object(mem.as_ref(), "ours").await, None, "our late bytes were left (MD5 told: {told})");
    assert_eq!(object(mem.as_ref(), "theirs").await.as_deref(), Some(&b"theirs, rewritten"[..]), "told: {told}");
}

/// A mount's recovery uploads what a crash left staged before the background sender of
/// deferred changes starts. A landing delete the crash left (`l`: deleted twice, 3 s apart)
/// of a key beside the one uploaded (`f12` beside `f1`) held that upload for good: the
/// drain sent the first delete, then waited for a second one only the background sends.
/// Now the upload waits for no key but its own and those below it, and a drain sends a
/// second delete itself when it is due.
#[tokio::test]
async fn recovery_before_the_sender_starts_waits_for_no_landing_delete_for_good() {
    use bucketfs_store::{PutOpts, Store};
    let mem = Arc::new(MemStore::new());
    let dir = staging("landing-before-start");
    std::fs::create_dir_all(&dir).unwrap();
    {
        let dd = crate::deletes::DeferredDeletes::new(mem.clone(), &dir);
        dd.defer_landing("f12", None).await.unwrap();
        dd.defer_landing("f1", None).await.unwrap();
    } // the crash: both journaled, never sent
    let dd = crate::deletes::DeferredDeletes::new(mem.clone(), &dir); // not started
    mem.put("f12", bytes::Bytes::from_static(b"landed late"), PutOpts::default()).await.unwrap();
    let put = dd.put("f1", bytes::Bytes::from_static(b"recovered"), PutOpts::default());
    tokio::time::timeout(Duration::from_secs(20), put).await.expect("the upload waited for good").unwrap();
    assert_eq!(object(mem.as_ref(), "f1").await.as_deref(), Some(&b"recovered"[..]));
    assert!(object(mem.as_ref(), "f12").await.is_some(), "f12's delete was sent for f1's upload");
}

/// A HEAD of a file's old name waits for its pending move (`mv a b`). `rm b` meanwhile
/// turns the move into a delete of `a`, a new entry: the HEAD waits for that one too, and
/// never sees the file renamed away (the drain looked only at the entries it began with).
#[tokio::test]
async fn a_request_waiting_for_a_move_waits_for_the_delete_that_takes_its_place() {
    use bucketfs_store::{PutOpts, Store};
    let mem = Arc::new(MemStore::new());
    mem.put("a", bytes::Bytes::from_static(b"renamed away"), PutOpts::default()).await.unwrap();
    let deletes = Arc::new(FailStore::new(mem.clone(), Op::Delete, 0, 0, StoreErrorKind::Other));
    // The move's copy is held, then cut off: the move ends leaving `a` in place.
    let cut = Arc::new(FailStore::new(deletes.clone(), Op::Copy, 1, 1, StoreErrorKind::Unavailable));
    let copies = Arc::new(FailStore::new(cut, Op::Copy, 0, 0, StoreErrorKind::Other));
    let dir = staging("move-then-rm");
    let dd = crate::deletes::DeferredDeletes::new(copies.clone(), &dir);
    crate::deletes::DeferredDeletes::start(&dd);
    let copy = copies.hold(Op::Copy, 1);
    let del = deletes.hold(Op::Delete, 3);
    assert!(dd.defer_move("a", "b", None, None).await.unwrap());
    let head = tokio::spawn({
        let dd = dd.clone();
        async move { dd.head("a", Default::default()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    dd.defer("b").await.unwrap(); // rm b: a delete of `a` too, and `b`'s move becomes a delete
    copy.add_permits(1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!head.is_finished(), "the HEAD went out with the delete of `a` still pending: {:?}", head.await);
    del.add_permits(3);
    let got = tokio::time::timeout(Duration::from_secs(10), head).await.expect("the HEAD waited for good").unwrap();
    assert!(got.is_err_and(|e| e.kind == StoreErrorKind::NotFound));
    assert!(dd.drain_all().await.is_empty());
    assert!(keys(mem.as_ref()).await.is_empty(), "{:?}", keys(mem.as_ref()).await);
}

/// A write whose caller gives up (an upload cancelled by a rename or an unlink) while the
/// pending delete it sent first is still in flight leaves that delete to finish: no later
/// request over the key, `bucketfs sync` or unmount waits on it for good.
#[tokio::test]
async fn a_request_cut_off_while_it_sends_a_pending_delete_leaves_nothing_stuck() {
    use bucketfs_store::{PutOpts, Store};
    let mem = Arc::new(MemStore::new());
    mem.put("f", bytes::Bytes::from_static(b"old"), PutOpts::default()).await.unwrap();
    let fail = Arc::new(FailStore::new(mem.clone(), Op::Delete, 1, 0, StoreErrorKind::Unavailable));
    let dir = staging("deferred-cut-off");
    let store = crate::deletes::DeferredDeletes::new(fail.clone(), &dir);
    store.defer("f").await.unwrap();
    let permits = fail.hold(Op::Delete, 1);
    // The PUT sends the pending DELETE first and waits for it; its caller is dropped.
    let put = store.put("f", bytes::Bytes::from_static(b"new"), PutOpts::default());
    assert!(tokio::time::timeout(Duration::from_millis(100), put).await.is_err(), "the DELETE was held");
    permits.add_permits(1);
    let left = tokio::time::timeout(Duration::from_secs(10), store.drain_all()).await;
    assert_eq!(left.expect("a pending delete stayed in flight for good"), []);
    assert!(object(mem.as_ref(), "f").await.is_none());
    let put = store.put("f", bytes::Bytes::from_static(b"new"), PutOpts::default());
    tokio::time::timeout(Duration::from_secs(10), put).await.expect("the PUT waited for good").unwrap();
}

/// A sync's drain names a change whose attempt failed since the sync began (an upload
/// waiting for its directory's marker sent it), even while another try is out: waiting
/// for that one too cost an unmount one more timeout (two rounds of four 30 s tries).
#[tokio::test]
async fn a_drain_names_a_change_that_failed_since_the_sync_began_without_another_try() {
    use bucketfs_store::{PutOpts, Store};
    let mem = Arc::new(MemStore::new());
    mem.put("f", bytes::Bytes::from_static(b"old"), PutOpts::default()).await.unwrap();
    let fail = Arc::new(FailStore::new(mem.clone(), Op::Delete, 1, 1, StoreErrorKind::Unavailable));
    let held = Arc::new(FailStore::new(fail, Op::Delete, u64::MAX, 0, StoreErrorKind::Other));
    let store = crate::deletes::DeferredDeletes::new(held.clone(), &staging("deferred-since"));
    store.defer("f").await.unwrap();
    let permits = held.hold(Op::Delete, 2);
    let started = std::time::Instant::now();
    let first = tokio::spawn({
        let store = store.clone();
        async move { store.head("f", Default::default()).await.map(|_| ()) }
    });
    permits.add_permits(1);
    assert!(first.await.unwrap().is_err(), "the first try failed");
    let again = tokio::spawn({
        let store = store.clone();
        async move { store.head("f", Default::default()).await.map(|_| ()) }
    });
    while held.calls() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await; // the second try is out (held)
    }
    let named = tokio::time::timeout(Duration::from_secs(5), store.drain_all_since(started)).await;
    let named = named.expect("the drain waited for the second try");
    assert!(named.len() == 1 && named[0].0 == "f", "{named:?}");
    assert_eq!(held.calls(), 2, "sent once more by the drain");
    permits.add_permits(1);
    again.await.unwrap().expect_err("deleted: f is gone");
    assert!(store.drain_all().await.is_empty());
}

/// A change the store refuses for good is named once by `bucketfs sync`, and counted by
/// `bucketfs status` for the life of the mount (before, status said "0 failing").
#[tokio::test]
async fn a_change_refused_for_good_stays_counted() {
    use bucketfs_store::{PutOpts, Store};
    let mem = Arc::new(MemStore::new());
    mem.put("f", bytes::Bytes::from_static(b"old"), PutOpts::default()).await.unwrap();
    let fail = Arc::new(FailStore::new(mem.clone(), Op::Delete, 1, 1, StoreErrorKind::PermissionDenied));
    let dir = staging("deferred-refused");
    let store = crate::deletes::DeferredDeletes::new(fail.clone(), &dir);
    store.defer("f").await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), store.drain_all()).await.unwrap();
    assert!(first.len() == 1 && first[0].1.contains("delete refused"), "{first:?}");
    assert_eq!(store.drain_all().await, [], "named once");
    assert_eq!(store.refused_since_mount(), 1);
    assert_eq!(fail.calls(), 1, "not retried");
}

/// A delete that fails with an error of no known kind (an HTTP 500 past retries: a
/// brownout) is tried again, as an upload is; before, it was dropped at once as refused for
/// good, and the unlinked file came back for good.
#[tokio::test]
async fn a_delete_that_meets_a_server_error_is_tried_again() {
    use bucketfs_store::{PutOpts, Store};
    let mem = Arc::new(MemStore::new());
    mem.put("f", bytes::Bytes::from_static(b"old"), PutOpts::default()).await.unwrap();
    let fail = Arc::new(FailStore::new(mem.clone(), Op::Delete, 1, 1, StoreErrorKind::Other));
    let dir = staging("deferred-500");
    let store = crate::deletes::DeferredDeletes::new(fail.clone(), &dir);
    store.defer("f").await.unwrap();
    // `bucketfs sync` names it while it fails (as in an outage), and it stays pending.
    let first = store.drain_all().await;
    assert!(first.len() == 1 && first[0].1.contains("not done yet"), "{first:?}");
    let drained = async {
        while !store.drain_all().await.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), drained).await.expect("the delete stayed pending");
    assert!(object(mem.as_ref(), "f").await.is_none(), "the delete was dropped after one server error");
    assert_eq!(fail.calls(), 2);
}

/// A DELETE cut off (a timeout: the store may hold the request and act on it later) and
/// then retried is sent once more after `LANDING_GRACE`, and a file made again under the
/// name goes up after that: the late DELETE does not remove the new file.
#[tokio::test]
async fn a_file_made_again_after_a_delete_cut_off_survives_the_late_delete() {
    use bucketfs_store::{PutOpts, Store};
    let mem = Arc::new(MemStore::new());
    mem.put("f", bytes::Bytes::from_static(b"old"), PutOpts::default()).await.unwrap();
    let fail = Arc::new(FailStore::new(mem.clone(), Op::Delete, 1, 1, StoreErrorKind::Unavailable));
    let dir = staging("deferred-delete-cut");
    let store = crate::deletes::DeferredDeletes::new(fail.clone(), &dir);
    crate::deletes::DeferredDeletes::start(&store);
    store.defer("f").await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), async {
        while fail.calls() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the delete was not tried again");
    let put = tokio::spawn({
        let store = store.clone();
        async move { store.put("f", bytes::Bytes::from_static(b"new"), PutOpts::default()).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    mem.delete("f").await.unwrap(); // the first DELETE lands now, late
    tokio::time::timeout(Duration::from_secs(10), put).await.expect("the PUT waited for good").unwrap().unwrap();
    assert_eq!(object(mem.as_ref(), "f").await.as_deref(), Some(&b"new"[..]), "the late DELETE removed the new file");
}

/// docs/SEMANTICS.md: a directory whose only keys are not shown is shown empty, and `rmdir`
/// fails with ENOTEMPTY; in write-back mode too, where an empty listing in cache answers
/// `rmdir` without the store. Each way the directory gets listed: on its own, and from a
/// listing ahead (one recursive page).
#[tokio::test]
async fn rmdir_of_a_directory_holding_only_keys_not_shown_fails() {
    for ahead in [0, 999] {
        let mem = Arc::new(MemStore::new());
        for k in ["d//y", "e/../z", "g/", "k//"] {
            mem.put(k, bytes::Bytes::from_static(b""), Default::default()).await.unwrap();
        }
        let dir = staging(&format!("hidden-{ahead}"));
        let fs = Fs::new(mem.clone(), FsConfig { list_ahead_keys: ahead, ..cfg(&dir, 0) });
        fs.start_write_back();
        // Before their own listings: with a listing ahead, the root's page lists them.
        assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", "..", "d", "e", "g", "k"]);
        for d in ["d", "e", "k"] {
            let r = fs.rmdir(ROOT_INO, d).await;
            assert!(matches!(r, Err(crate::FsError::NotEmpty)), "rmdir {d} (ahead {ahead}): {r:?}");
        }
        for d in ["d", "e", "g", "k"] {
            let ino = fs.lookup(ROOT_INO, d).await.unwrap().ino;
            assert_eq!(listed(&fs, ino).await.unwrap(), [".", ".."], "{d} (ahead {ahead})");
        }
        for d in ["d", "e", "k"] {
            let r = fs.rmdir(ROOT_INO, d).await;
            assert!(matches!(r, Err(crate::FsError::NotEmpty)), "rmdir {d}, listed (ahead {ahead}): {r:?}");
        }
        // A directory that is really empty still goes at once.
        fs.rmdir(ROOT_INO, "g").await.unwrap();
        assert!(fs.sync_write_back().await.is_empty());
        assert_eq!(keys(mem.as_ref()).await, ["d//y", "e/../z", "k//"], "ahead {ahead}");
    }
}

/// docs/SEMANTICS.md "What waits for the store": in write-back mode a rename of a file in
/// the bucket answers locally. Here no copy succeeds (the store is down for them), yet the
/// renames return and the mount shows them; then a "crash", and the next mount finishes
/// every move before anything sees the keys, in order: a file unlinked after its rename
/// leaves neither name, and a file made again under the old name keeps its new bytes.
#[tokio::test]
async fn a_rename_of_an_uploaded_file_waits_for_no_copy_and_a_crash_finishes_it() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("deferred-move");
    {
        let down = Arc::new(FailStore::new(mem.clone(), Op::Copy, 1, 1_000_000, StoreErrorKind::Unavailable));
        let fs = Fs::new(down, cfg(&dir, 0));
        fs.start_write_back();
        uploaded_files(&fs, 3).await;
        fs.rename(ROOT_INO, "f00", ROOT_INO, "g", false).await.expect("the rename waited for its copy");
        fs.rename(ROOT_INO, "f01", ROOT_INO, "h", false).await.unwrap();
        fs.unlink(ROOT_INO, "h").await.unwrap();
        fs.rename(ROOT_INO, "f02", ROOT_INO, "g2", false).await.unwrap();
        write_file(&fs, "f02", b"new").await;
        assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", "..", "f02", "g", "g2"]);
        assert!(fs.lookup(ROOT_INO, "f00").await.is_err());
        assert_eq!(fs.lookup(ROOT_INO, "g").await.unwrap().size, 3);
        assert!(!fs.sync_write_back().await.is_empty(), "sync says the moves are not done");
    } // the "crash"
    assert!(object(mem.as_ref(), "g").await.is_none());
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    // The moves are done first; the new `f02` goes up with the recovery, after its move.
    assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", "..", "g", "g2"]);
    let (done, failed) = fs.recover_staged().await;
    assert!(done.contains(&"f02".to_string()) && failed.is_empty(), "{done:?} {failed:?}");
    fs.start_write_back();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["f02", "g", "g2"]);
    assert_eq!(object(mem.as_ref(), "g").await.as_deref(), Some(&b"f00"[..]));
    assert_eq!(object(mem.as_ref(), "g2").await.as_deref(), Some(&b"f02"[..]));
    assert_eq!(object(mem.as_ref(), "f02").await.as_deref(), Some(&b"new"[..]));
}

/// A second and a third rename of a file whose first move is still pending
/// (`mv f00 b; mv b c; mv c d`) are journaled too: with every copy held, the renames
/// return. Each move goes after the one before it, sent in the background or, after a
/// "crash", by the next mount.
#[tokio::test]
async fn chained_renames_wait_for_no_copy_and_keep_their_order() {
    for crash in [false, true] {
        let mem = Arc::new(MemStore::new());
        let dir = staging(&format!("chained-moves-{crash}"));
        {
            let held = Arc::new(FailStore::new(mem.clone(), Op::Check, u64::MAX, 0, StoreErrorKind::Other));
            let fs = Fs::new(held.clone(), cfg(&dir, 0));
            fs.start_write_back();
            uploaded_files(&fs, 3).await;
            let copies = held.hold(Op::Copy, u32::MAX); // every copy waits
            tokio::time::timeout(Duration::from_secs(5), async {
                fs.rename(ROOT_INO, "f00", ROOT_INO, "b", false).await.unwrap();
                fs.rename(ROOT_INO, "b", ROOT_INO, "c", false).await.unwrap();
                fs.rename(ROOT_INO, "c", ROOT_INO, "d", false).await.unwrap();
                fs.rename(ROOT_INO, "f01", ROOT_INO, "g", false).await.unwrap();
            })
            .await
            .expect("a rename waited for a copy");
            assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", "..", "d", "f02", "g"]);
            assert_eq!(keys(mem.as_ref()).await, ["f00", "f01", "f02"], "a move was sent while copies were held");
            if !crash {
                copies.add_permits(1_000);
                assert!(fs.sync_write_back().await.is_empty());
            }
        } // with `crash`, the "crash": the next mount sends them
        if crash {
            let fs = Fs::new(mem.clone(), cfg(&dir, 0));
            assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", "..", "d", "f02", "g"]);
        }
        assert_eq!(keys(mem.as_ref()).await, ["d", "f02", "g"], "crash {crash}");
        for (key, bytes) in [("d", b"f00"), ("f02", b"f02"), ("g", b"f01")] {
            assert_eq!(object(mem.as_ref(), key).await.as_deref(), Some(&bytes[..]), "{key}, crash {crash}");
        }
    }
}

/// Which renames `move_order` lets wait: the file's next rename after its pending move,
/// never one that closes a cycle (`mv a b; mv b a`) or lands on a pending move's old key;
/// once the earlier move is done, the next one is a plain move from that key.
#[test]
fn a_move_goes_after_its_files_earlier_move_and_never_closes_a_cycle() {
    use super::{move_order, settle_after, Op as Change, Pending};
    let mv = |from: &str| Pending {
        op: Change::Move,
        source: Some(from.to_string()),
        ..Pending::new(std::path::PathBuf::from("/nonexistent"))
    };
    let mut p = super::Table::default();
    p.insert("b".to_string(), mv("a"));
    assert_eq!(move_order(&p, "b", "c"), Some(true), "mv a b; mv b c");
    assert_eq!(move_order(&p, "x", "y"), Some(false));
    assert_eq!(move_order(&p, "b", "a"), None, "mv a b; mv b a");
    assert_eq!(move_order(&p, "x", "a"), None, "onto a pending move's old key");
    assert_eq!(move_order(&p, "a", "y"), None, "the old key again");
    assert_eq!(move_order(&p, "x", "b"), None, "onto a pending move's new key");
    p.insert("c".to_string(), Pending { after: true, ..mv("b") });
    assert_eq!(move_order(&p, "c", "d"), Some(true), "a third rename");
    assert_eq!(move_order(&p, "c", "a"), None, "mv a b; mv b c; mv c a");
    p.remove("b");
    settle_after(&mut p, "b");
    assert!(!p["c"].after, "the earlier move done, a later change of `b` must wait for `c`'s");
}

/// `symlink` on a write-back mount returns before its PUT (in the kernel it holds its
/// directory locked: a store that hangs stalled every lookup there), reads back from the
/// journal meanwhile, goes after the marker of the directory made before it, and a crash
/// leaves it for the next mount; unlinked before it is sent, it never reaches the bucket.
#[tokio::test]
async fn a_symlink_waits_for_no_put_and_a_crash_leaves_it_pending() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("deferred-link");
    {
        let hung = Arc::new(FailStore::new(mem.clone(), Op::Check, u64::MAX, 0, StoreErrorKind::Other));
        let _held = hung.hold(Op::Put, u32::MAX); // every PUT hangs
        let fs = Fs::new(hung, cfg(&dir, 0));
        fs.start_write_back();
        assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", ".."]);
        let d = fs.mkdir(ROOT_INO, "d", None).await.unwrap().ino;
        let made = tokio::time::timeout(Duration::from_secs(5), async {
            let l = fs.symlink(d, "l", "../target").await.unwrap();
            fs.symlink(ROOT_INO, "gone", "x").await.unwrap();
            fs.unlink(ROOT_INO, "gone").await.unwrap();
            l
        })
        .await
        .expect("symlink waited for its PUT");
        assert_eq!(made.size, 9);
        assert_eq!(&fs.readlink(made.ino).await.unwrap()[..], b"../target");
        let found = fs.lookup(d, "l").await.unwrap(); // from the listing kept here
        assert_eq!((found.ino, found.size), (made.ino, 9));
        assert!(found.mtime > std::time::SystemTime::now() - Duration::from_secs(60), "mtime {:?}", found.mtime);
        assert_eq!(listed(&fs, d).await.unwrap(), [".", "..", "l"]);
    } // the "crash"
    assert!(keys(mem.as_ref()).await.is_empty());
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    fs.start_write_back();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["d/", "d/l.rclonelink"]);
    assert_eq!(object(mem.as_ref(), "d/l.rclonelink").await.as_deref(), Some(&b"../target"[..]));
    let d = fs.lookup(ROOT_INO, "d").await.unwrap().ino;
    let l = fs.lookup(d, "l").await.unwrap();
    assert_eq!(&fs.readlink(l.ino).await.unwrap()[..], b"../target");
}

/// Once its object is made in the background, the link reads from the store, and a
/// listing past the TTL keeps its inode.
#[tokio::test]
async fn a_symlink_made_in_the_background_keeps_its_inode() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("deferred-link-tag");
    let clock = crate::Clock::manual();
    let fs = Fs::new(mem.clone(), FsConfig { clock: clock.clone(), ..cfg(&dir, 0) });
    fs.start_write_back();
    let l = fs.symlink(ROOT_INO, "l", "t").await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "l.rclonelink").await.as_deref(), Some(&b"t"[..]));
    clock.advance(Duration::from_secs(120));
    assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", "..", "l"]);
    assert_eq!(fs.lookup(ROOT_INO, "l").await.unwrap().ino, l.ino);
    assert_eq!(&fs.readlink(l.ino).await.unwrap()[..], b"t");
}

/// A link's mtime set here (`touch -h`, `rsync -a`, `tar x`) holds for the mount's life:
/// also once its object is made in the background and listed again, read or not before.
#[tokio::test]
async fn a_symlinks_mtime_set_here_outlives_its_background_put() {
    for read_first in [false, true] {
        let mem = Arc::new(MemStore::new());
        let dir = staging("link-mtime");
        let clock = crate::Clock::manual();
        let fs = Fs::new(mem.clone(), FsConfig { clock: clock.clone(), ..cfg(&dir, 0) });
        fs.start_write_back();
        // In a directory made here: its listing is kept from the start, with the entry.
        let d = fs.mkdir(ROOT_INO, "d", None).await.unwrap().ino;
        let l = fs.symlink(d, "l", "t").await.unwrap();
        let then = std::time::UNIX_EPOCH + Duration::from_secs(1_009_843_200);
        let change = crate::fs::SetAttr { mtime: Some(then), ..Default::default() };
        assert_eq!(fs.setattr(l.ino, change).await.unwrap().mtime, then);
        if read_first {
            assert_eq!(&fs.readlink(l.ino).await.unwrap()[..], b"t"); // from the journal
        }
        assert!(fs.sync_write_back().await.is_empty());
        // Read from the object (its tag learned), then listed from the entry kept here,
        // then from the store past the TTL.
        assert_eq!(&fs.readlink(l.ino).await.unwrap()[..], b"t");
        for wait in [0, 120] {
            clock.advance(Duration::from_secs(wait));
            assert_eq!(listed(&fs, d).await.unwrap(), [".", "..", "l"]);
            let found = fs.lookup(d, "l").await.unwrap();
            assert_eq!((found.ino, found.mtime), (l.ino, then), "read first: {read_first}, {wait} s on");
            assert_eq!(fs.getattr(l.ino).await.unwrap().mtime, then, "read first: {read_first}, {wait} s on");
        }
    }
}

/// A link unlinked while its PUT is out (it may have been cut off and land later) is
/// deleted as a landing key: twice, the journal says so (`l`, NUL, the key).
#[tokio::test]
async fn a_link_unlinked_while_its_put_is_out_is_deleted_twice() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("link-landing");
    let held = Arc::new(FailStore::new(mem.clone(), Op::Put, u64::MAX, 0, StoreErrorKind::Other)); // counts PUTs
    let permits = held.hold(Op::Put, 1);
    let fs = Fs::new(held.clone(), cfg(&dir, 0));
    fs.start_write_back();
    assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", ".."]);
    fs.symlink(ROOT_INO, "l", "t").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while held.calls() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the link's PUT was sent");
    fs.unlink(ROOT_INO, "l").await.unwrap();
    let journal = crate::deletes::journal_dir_for(&dir).unwrap();
    let entries: Vec<Vec<u8>> =
        std::fs::read_dir(&journal).unwrap().flatten().map(|e| std::fs::read(e.path()).unwrap()).collect();
    assert_eq!(entries, [b"l\0l.rclonelink".to_vec()]);
    permits.add_permits(1);
    assert!(fs.sync_write_back().await.is_empty());
    assert!(keys(mem.as_ref()).await.is_empty());
}

/// The checkpoint pattern on a store that hangs: `mkdir tmp`, files written in it and in a
/// directory below, `mv tmp ckpt`. Nothing of `tmp` is in the store yet (its markers hang,
/// and every write below waits for them), so the rename lists and copies nothing: it
/// returns, and the bucket ends with `ckpt` alone, in the background or after a crash.
#[tokio::test]
async fn a_directory_made_here_is_renamed_with_no_request_while_its_marker_hangs() {
    for crash in [false, true] {
        let mem = Arc::new(MemStore::new());
        let dir = staging(&format!("checkpoint-{crash}"));
        {
            let held = Arc::new(FailStore::new(mem.clone(), Op::Check, u64::MAX, 0, StoreErrorKind::Other));
            let fs = Fs::new(held.clone(), cfg(&dir, 0));
            fs.start_write_back();
            assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", ".."]);
            let markers = held.hold(Op::CreateDir, u32::MAX); // made, but never answered
            let put = |parent: u64, name: &'static str| {
                let fs = fs.clone();
                async move {
                    let (_, fh) = fs.create(parent, name, 0, None).await.unwrap();
                    fs.write(fh, 0, name.as_bytes()).await.unwrap();
                    fs.release(fh).await.unwrap();
                }
            };
            tokio::time::timeout(Duration::from_secs(5), async {
                let tmp = fs.mkdir(ROOT_INO, "tmp", None).await.unwrap().ino;
                let sub = fs.mkdir(tmp, "sub", None).await.unwrap().ino;
                put(tmp, "a").await;
                put(sub, "b").await;
                tokio::time::sleep(Duration::from_millis(50)).await; // the markers are in flight
                fs.rename(ROOT_INO, "tmp", ROOT_INO, "ckpt", false).await.unwrap();
            })
            .await
            .expect("the rename waited for the store");
            assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", "..", "ckpt"]);
            if !crash {
                markers.add_permits(1_000);
                assert!(fs.sync_write_back().await.is_empty());
            }
        }
        if crash {
            let fs = Fs::new(mem.clone(), cfg(&dir, 0));
            let (done, failed) = fs.recover_staged().await;
            assert!(done.len() == 2 && failed.is_empty(), "{done:?} {failed:?}");
            fs.start_write_back();
            assert!(fs.sync_write_back().await.is_empty());
            assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", "..", "ckpt"]);
        }
        assert_eq!(keys(mem.as_ref()).await, ["ckpt/", "ckpt/a", "ckpt/sub/", "ckpt/sub/b"], "crash {crash}");
        assert_eq!(object(mem.as_ref(), "ckpt/sub/b").await.as_deref(), Some(&b"b"[..]));
    }
}

/// `mv app.log tmp/` of a log being written (its last closed version in the bucket) into a
/// directory made here whose marker hangs: the object's move goes after the marker, as an
/// upload there would. (Done before it, `mv tmp ckpt` next took the rename with no request,
/// which left the log's old version at `tmp/app.log` in the bucket.)
#[tokio::test]
async fn a_file_moved_into_a_directory_made_here_goes_after_its_marker() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("move-into-made");
    mem.put("app.log", bytes::Bytes::from_static(b"v0 closed"), Default::default()).await.unwrap();
    let held = Arc::new(FailStore::new(mem.clone(), Op::Check, u64::MAX, 0, StoreErrorKind::Other));
    let fs = Fs::new(held.clone(), cfg(&dir, 0));
    fs.start_write_back();
    assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", "..", "app.log"]);
    let ino = fs.lookup(ROOT_INO, "app.log").await.unwrap().ino;
    let fh = fs.open(ino, true, false).await.unwrap();
    fs.write(fh, 9, b" + appended").await.unwrap();
    let markers = held.hold(Op::CreateDir, u32::MAX); // made, but never answered
    let tmp = fs.mkdir(ROOT_INO, "tmp", None).await.unwrap().ino;
    fs.rename(ROOT_INO, "app.log", tmp, "app.log", false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await; // a move not waiting is done by now
    let renamed = tokio::spawn({
        let fs = fs.clone();
        async move { fs.rename(ROOT_INO, "tmp", ROOT_INO, "ckpt", false).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    markers.add_permits(1_000);
    tokio::time::timeout(Duration::from_secs(10), renamed).await.expect("the rename").unwrap().unwrap();
    fs.write(fh, 20, b"!").await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["ckpt/", "ckpt/app.log"]);
    assert_eq!(object(mem.as_ref(), "ckpt/app.log").await.as_deref(), Some(&b"v0 closed + appended!"[..]));
}

/// What is on disk for staging directory `dir` now, it and the journals beside it, put
/// back by the returned closure: a crash at this point, though the test goes on.
fn disk_now(dir: &std::path::Path) -> impl FnOnce() {
    let parent = dir.parent().unwrap().to_path_buf();
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let saved = parent.join(format!("{name}.crash"));
    let _ = std::fs::remove_dir_all(&saved);
    std::fs::create_dir_all(&saved).unwrap();
    let ours: Vec<String> = std::fs::read_dir(&parent)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| *n == name || n.starts_with(&format!(".{name}.")))
        .collect();
    for n in &ours {
        let ok = std::process::Command::new("cp").arg("-a").arg(parent.join(n)).arg(&saved).status().unwrap();
        assert!(ok.success());
    }
    move || {
        for n in &ours {
            let _ = std::fs::remove_dir_all(parent.join(n));
            let ok = std::process::Command::new("cp").arg("-a").arg(saved.join(n)).arg(&parent).status().unwrap();
            assert!(ok.success());
        }
        let _ = std::fs::remove_dir_all(&saved);
    }
}

/// A crash amid the rename with no request of a directory made here (its markers journaled
/// under the new name, the old ones not yet withdrawn, the files not yet renamed): the next
/// mount ends with the new name and every directory below it, and nothing of the old one.
#[tokio::test]
async fn a_crash_amid_a_rename_with_no_request_leaves_one_name() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("checkpoint-torn");
    let journal = crate::deletes::journal_dir_for(&dir).unwrap();
    let crash = {
        // Every marker fails as if the store were unreachable: they stay pending.
        let down = Arc::new(FailStore::new(mem.clone(), Op::CreateDir, 1, u64::MAX, StoreErrorKind::Unavailable));
        let fs = Fs::new(down, cfg(&dir, 0));
        fs.start_write_back();
        assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", ".."]);
        let tmp = fs.mkdir(ROOT_INO, "tmp", None).await.unwrap().ino;
        fs.mkdir(tmp, "sub", None).await.unwrap();
        let (_, fh) = fs.create(tmp, "a", 0, None).await.unwrap();
        fs.write(fh, 0, b"a").await.unwrap();
        fs.release(fh).await.unwrap();
        let pause = crate::pause::arm(&dir, "move_dir: new markers journaled");
        let renamed = tokio::spawn({
            let fs = fs.clone();
            async move { fs.rename(ROOT_INO, "tmp", ROOT_INO, "ckpt", false).await }
        });
        tokio::time::timeout(Duration::from_secs(10), pause.reached()).await.expect("the rename's pause");
        let entries: Vec<Vec<u8>> =
            std::fs::read_dir(&journal).unwrap().flatten().map(|e| std::fs::read(e.path()).unwrap()).collect();
        assert!(entries.iter().any(|e| e == b"m\0ckpt/sub/"), "{entries:?}");
        let crash = disk_now(&dir);
        pause.go();
        renamed.await.unwrap().unwrap();
        crash
    };
    crash();
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    let (done, failed) = fs.recover_staged().await;
    assert!(done.len() == 1 && failed.is_empty(), "{done:?} {failed:?}");
    fs.start_write_back();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["ckpt/", "ckpt/a", "ckpt/sub/"]);
    assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", "..", "ckpt"]);
}

/// Names made or removed inside a directory while its rename is under way (the kernel locks
/// the parent for a rename, not the directory moved: `mkdir tmp/x` may run during `mv tmp
/// ckpt`) end under the new name in the bucket, never under the old one.
#[tokio::test]
async fn names_made_inside_a_directory_being_renamed_go_up_under_its_new_name() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("made-during-rename");
    let held = Arc::new(FailStore::new(mem.clone(), Op::Check, u64::MAX, 0, StoreErrorKind::Other));
    let fs = Fs::new(held.clone(), cfg(&dir, 0));
    fs.start_write_back();
    assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", ".."]);
    let markers = held.hold(Op::CreateDir, u32::MAX); // made, but never answered
    let tmp = fs.mkdir(ROOT_INO, "tmp", None).await.unwrap().ino;
    fs.mkdir(tmp, "sub", None).await.unwrap();
    let pause = crate::pause::arm(&dir, "move_dir: new markers journaled");
    let renamed = tokio::spawn({
        let fs = fs.clone();
        async move { fs.rename(ROOT_INO, "tmp", ROOT_INO, "ckpt", false).await }
    });
    tokio::time::timeout(Duration::from_secs(10), pause.reached()).await.expect("the rename's pause");
    let made = tokio::spawn({
        let fs = fs.clone();
        async move {
            fs.rmdir(tmp, "sub").await.unwrap();
            fs.mkdir(tmp, "x", None).await.unwrap();
            let (_, fh) = fs.create(tmp, "f", 0, None).await.unwrap();
            fs.write(fh, 0, b"f").await.unwrap();
            fs.release(fh).await.unwrap();
            fs.symlink(tmp, "l", "f").await.unwrap();
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    pause.go();
    markers.add_permits(1_000); // (an rmdir after the rename may ask the store)
    tokio::time::timeout(Duration::from_secs(10), renamed).await.expect("the rename").unwrap().unwrap();
    tokio::time::timeout(Duration::from_secs(10), made).await.expect("the names made").unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["ckpt/", "ckpt/f", "ckpt/l.rclonelink", "ckpt/x/"]);
    assert_eq!(listed(&fs, tmp).await.unwrap(), [".", "..", "f", "l", "x"]);
}
