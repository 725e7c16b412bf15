//! Write-back mode against the in-memory store: close returns before the upload, the queue
//! drains, rename and unlink of queued files leave no stray object, back-pressure holds.

use std::sync::Arc;
use std::time::Duration;

use bucketfs_store::testing::{FailStore, MemStore, Op};
use bucketfs_store::{GetOpts, Store, StoreErrorKind, StoreExt};

use crate::fs::{Fs, FsConfig, ROOT_INO};
use crate::write_back::WriteBackConfig;

pub(crate) fn cfg(dir: &std::path::Path, delay_ms: u64) -> FsConfig {
    FsConfig {
        staging_dir: dir.to_path_buf(),
        write_back: Some(WriteBackConfig {
            delay: Duration::from_millis(delay_ms),
            max_bytes: 1 << 30,
            parallel: 4,
            ..Default::default()
        }),
        ..FsConfig::default()
    }
}

pub(crate) fn staging(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("bucketfs-wb-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

pub(crate) async fn object(store: &dyn Store, key: &str) -> Option<Vec<u8>> {
    let len = store.stat(key).await.ok()?.size;
    store.get_range(key, 0..len, GetOpts::default()).await.ok().map(|b| b.to_vec())
}

pub(crate) async fn keys(store: &dyn Store) -> Vec<String> {
    use futures::StreamExt;
    let mut out = Vec::new();
    let mut s = store.list("", true);
    while let Some(m) = s.next().await {
        out.push(m.unwrap().key);
    }
    out.sort();
    out
}

pub(crate) async fn write_file(fs: &Fs, name: &str, data: &[u8]) -> u64 {
    let (attr, fh) = fs.create(ROOT_INO, name, 0, None).await.unwrap();
    fs.write(fh, 0, data).await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    attr.ino
}

#[tokio::test]
async fn close_returns_before_upload_and_the_queue_drains() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("drain");
    let fs = Fs::new(mem.clone(), cfg(&dir, 300));
    fs.start_write_back();
    write_file(&fs, "a", b"alpha").await;
    assert!(object(mem.as_ref(), "a").await.is_none(), "uploaded only after the delay");
    assert_eq!(fs.write_back_status().files, 1);
    let ino = fs.lookup(ROOT_INO, "a").await.unwrap().ino;
    let fh = fs.open(ino, false, false).await.unwrap();
    assert_eq!(&fs.read(fh, 0, 100).await.unwrap()[..], b"alpha", "read your writes");
    fs.release(fh).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "a").await.unwrap(), b"alpha");
    assert_eq!(fs.write_back_status().files, 0);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "staging emptied after upload");
}

#[tokio::test]
async fn rename_and_unlink_of_queued_files_leave_no_stray_object() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("rename");
    let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
    fs.start_write_back();
    write_file(&fs, "tmp1", b"one").await;
    write_file(&fs, "gone", b"two").await;
    fs.rename(ROOT_INO, "tmp1", ROOT_INO, "final", false).await.unwrap();
    fs.unlink(ROOT_INO, "gone").await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, vec!["final".to_string()]);
    assert_eq!(object(mem.as_ref(), "final").await.unwrap(), b"one");
}

#[tokio::test]
async fn a_file_rewritten_within_the_delay_keeps_its_last_close() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("rewrite");
    let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
    fs.start_write_back();
    let ino = write_file(&fs, "f", b"first").await;
    // Reopened for writing: the closed version goes up first (a crash now must find it).
    let fh = fs.open(ino, true, true).await.unwrap();
    assert_eq!(object(mem.as_ref(), "f").await.unwrap(), b"first");
    fs.write(fh, 0, b"second").await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "f").await.unwrap(), b"second");
}

#[tokio::test]
async fn failing_uploads_stay_queued_and_sync_reports_them() {
    let mem = Arc::new(MemStore::new());
    let failing = Arc::new(FailStore::new(mem.clone(), Op::Put, 1, 2, StoreErrorKind::Unavailable));
    let dir = staging("fail");
    let fs = Fs::new(failing, cfg(&dir, 0));
    fs.start_write_back();
    write_file(&fs, "x", b"keep me").await; // close succeeds: the bytes are staged
    let failed = fs.sync_write_back().await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, "x");
    let st = fs.write_back_status();
    assert_eq!((st.files, st.failing.len()), (1, 1), "{st:?}");
    // Still failing: sync retries at once (ignoring the backoff) and reports again.
    assert_eq!(fs.sync_write_back().await.len(), 1);
    assert_eq!(fs.write_back_status().failing[0].1, 2, "two attempts");
    // The store recovers (FailStore fails twice): the next sync uploads.
    let failed = fs.sync_write_back().await;
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(object(mem.as_ref(), "x").await.unwrap(), b"keep me");
}

/// Six closed files and a store whose every PUT fails with `kind`, tried one at a time,
/// of which only `answered` get their answer (the rest wait, as on a store that hangs):
/// what `sync` names, or `None` if it still waited after `patience`.
async fn sync_against_failing_puts(
    name: &str,
    kind: StoreErrorKind,
    answered: usize,
    patience: Duration,
) -> Option<Vec<(String, String)>> {
    let failing = Arc::new(FailStore::new(Arc::new(MemStore::new()), Op::Put, 1, u64::MAX, kind));
    let held = Arc::new(FailStore::new(failing, Op::Put, u64::MAX, 0, StoreErrorKind::Other));
    let permits = held.hold(Op::Put, 100);
    let mut c = cfg(&staging(name), 60_000);
    c.write_back.as_mut().unwrap().parallel = 1;
    let fs = Fs::new(held.clone(), c);
    fs.start_write_back();
    for i in 0..6 {
        write_file(&fs, &format!("f{i}"), b"staged").await;
    }
    permits.add_permits(answered);
    let mut failed = tokio::time::timeout(patience, fs.sync_write_back()).await.ok()?;
    failed.sort();
    Some(failed)
}

/// A store that does not answer: `sync` names every file once one attempt since it began
/// says so, rather than waiting for a try of each (minutes each on a store that hangs). A
/// store that refuses a file for a reason of its own says nothing of the others: each gets
/// its try.
#[tokio::test]
async fn sync_against_a_store_that_does_not_answer_names_every_file_after_one_try() {
    let failed = sync_against_failing_puts("down", StoreErrorKind::Unavailable, 1, Duration::from_secs(30)).await;
    let failed = failed.expect("sync waited for every file to be tried");
    let keys: Vec<_> = failed.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["f0", "f1", "f2", "f3", "f4", "f5"], "{failed:?}");
    let named_for_it = |start: &str| {
        let why =
            |w: &String| w.starts_with(start) && w.contains("the store did not answer an upload since the sync began");
        failed.iter().filter(|(_, w)| why(w)).count()
    };
    // One failed, the next is in flight (held), four are not tried.
    assert_eq!(named_for_it("upload still in flight"), 1, "{failed:?}");
    assert_eq!(named_for_it("not uploaded yet"), 4, "{failed:?}");

    let refused =
        sync_against_failing_puts("refused", StoreErrorKind::PermissionDenied, 1, Duration::from_secs(1)).await;
    assert!(refused.is_none(), "sync answered before each file was tried: {refused:?}");
    let refused =
        sync_against_failing_puts("refused-all", StoreErrorKind::PermissionDenied, 6, Duration::from_secs(30)).await;
    assert_eq!(refused.expect("each file tried").len(), 6);
}

/// An upload begun before a sync that fails during it, the store not answering (it hung,
/// then timed out), is tried again by the sync only if the store answers a listing:
/// against a store still down each try is one more timeout (an unmount waited for two).
#[tokio::test]
async fn a_sync_tries_an_upload_that_timed_out_during_it_again_only_if_the_store_answers() {
    for answers in [false, true] {
        let mem = Arc::new(MemStore::new());
        let failing = Arc::new(FailStore::new(mem.clone(), Op::Put, 1, 1, StoreErrorKind::Unavailable));
        let held = Arc::new(FailStore::new(failing, Op::Put, u64::MAX, 0, StoreErrorKind::Other));
        let permits = held.hold(Op::Put, 1);
        let lists = Arc::new(FailStore::new(held.clone(), Op::List, u64::MAX, 0, StoreErrorKind::Unavailable));
        let fs = Fs::new(lists.clone(), cfg(&staging(&format!("stalled-{answers}")), 0));
        fs.start_write_back();
        write_file(&fs, "f", b"kept").await;
        if !answers {
            lists.fail_next(u64::MAX);
        }
        while held.calls() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await; // its upload is in flight
        }
        let times_out = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            permits.add_permits(1);
        };
        let (failed, ()) = tokio::join!(fs.sync_write_back(), times_out);
        if answers {
            assert_eq!(failed, [], "answers: {answers}");
            assert_eq!(object(mem.as_ref(), "f").await.as_deref(), Some(&b"kept"[..]));
        } else {
            let keys: Vec<_> = failed.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(keys, ["f"], "{failed:?}");
            assert_eq!(held.calls(), 1, "tried again against a store that does not answer");
        }
    }
}

#[tokio::test]
async fn unclosed_bytes_are_set_aside_and_closed_ones_recovered_after_a_crash() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("crash");
    {
        let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
        write_file(&fs, "closed", b"closed bytes").await;
        let (_, fh) = fs.create(ROOT_INO, "open", 0, None).await.unwrap();
        fs.write(fh, 0, b"half").await.unwrap();
        // A 240-byte name of 4-byte characters: its first 150 characters pass NAME_MAX.
        let (_, fh) = fs.create(ROOT_INO, &"😀".repeat(60), 0, None).await.unwrap();
        fs.write(fh, 0, b"wide").await.unwrap();
        // The process dies here: no release, no unmount.
        std::mem::forget(fs);
    }
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    let (done, failed) = fs.recover_staged().await;
    assert_eq!((done, failed), (vec!["closed".to_string()], vec![]));
    assert_eq!(object(mem.as_ref(), "closed").await.unwrap(), b"closed bytes");
    assert!(object(mem.as_ref(), "open").await.is_none(), "never closed: never uploaded");
    let found: Vec<_> = std::fs::read_dir(dir.join("lost+found")).unwrap().flatten().collect();
    assert_eq!(found.len(), 4, "the bytes and their key of each file, kept for the user");
    let kept: Vec<_> = found.iter().filter_map(|e| std::fs::read(e.path()).ok()).collect();
    assert!(kept.iter().any(|b| b == b"wide") && kept.iter().any(|b| b == b"half"), "both set aside");
}

#[tokio::test]
async fn close_waits_for_room_when_the_queue_is_full() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("room");
    let mut c = cfg(&dir, 200);
    c.write_back.as_mut().unwrap().max_bytes = 10;
    let fs = Fs::new(mem.clone(), c);
    fs.start_write_back();
    write_file(&fs, "a", b"0123456789").await;
    let t = std::time::Instant::now();
    write_file(&fs, "b", b"0123456789").await; // 20 bytes > 10: waits for "a" to go up
    assert!(object(mem.as_ref(), "a").await.is_some(), "the second close waited for the first upload");
    assert!(t.elapsed() >= Duration::from_millis(100), "{:?}", t.elapsed());
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "b").await.unwrap(), b"0123456789");
}

/// A store that takes no upload (down, or hanging) holds closes at the bound for
/// `STALLED` at most, once for all of them: then they go on over the bound, the staging
/// disk having room, and the files stay queued for the store's return.
#[tokio::test]
async fn a_close_at_the_bound_goes_on_when_the_store_takes_no_upload() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("room-stalled");
    let down = Arc::new(FailStore::new(mem.clone(), Op::Put, 1, u64::MAX, StoreErrorKind::Unavailable));
    let clock = crate::Clock::manual();
    let mut c = FsConfig { clock: clock.clone(), ..cfg(&dir, 0) };
    c.write_back.as_mut().unwrap().max_bytes = 10;
    let fs = Fs::new(down, c);
    fs.start_write_back();
    write_file(&fs, "a", b"0123456789").await;
    let b = tokio::spawn({
        let fs = fs.clone();
        async move { write_file(&fs, "b", b"0123456789").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!b.is_finished(), "20 bytes > 10 and the store is up as far as anyone knows: the close waits");
    clock.advance(crate::write_back::STALLED);
    tokio::time::timeout(Duration::from_secs(10), b).await.expect("the close waited past the stall").unwrap();
    // The store is still taking nothing: later closes do not wait the stall out again.
    tokio::time::timeout(Duration::from_secs(10), async {
        write_file(&fs, "c", b"0123456789").await;
        write_file(&fs, "d", b"0123456789").await;
    })
    .await
    .expect("a later close waited for the stall again");
    let st = fs.write_back_status();
    assert_eq!((st.files, st.bytes, st.uploaded), (4, 40, 0));
    assert!(object(mem.as_ref(), "a").await.is_none());
}

/// The files bound is not escaped when the store takes no upload: each queued file holds
/// descriptors, and past the process's limit creates failed with EIO (tester Y).
#[tokio::test]
async fn a_close_over_the_files_bound_waits_even_when_the_store_takes_no_upload() {
    let down = Arc::new(FailStore::new(Arc::new(MemStore::new()), Op::Put, 1, u64::MAX, StoreErrorKind::Unavailable));
    let clock = crate::Clock::manual();
    let mut c = FsConfig { clock: clock.clone(), ..cfg(&staging("files-stalled"), 0) };
    c.write_back.as_mut().unwrap().max_files = 2;
    let fs = Fs::new(down, c);
    fs.start_write_back();
    write_file(&fs, "a", b"a").await;
    write_file(&fs, "b", b"b").await;
    let third = tokio::spawn({
        let fs = fs.clone();
        async move { write_file(&fs, "c", b"c").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!third.is_finished(), "3 files > 2: the close waits");
    clock.advance(crate::write_back::STALLED);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!third.is_finished(), "a close went on over the files bound");
    third.abort();
}

#[tokio::test]
async fn a_truncating_rewrite_closed_before_a_crash_is_recovered_empty() {
    // O_TRUNC keeps the old bytes on disk for readers until it settles; the commit at close
    // must settle it, or recovery uploads the old bytes over the empty version.
    let mem = Arc::new(MemStore::new());
    let dir = staging("trunc");
    {
        let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
        fs.start_write_back();
        let ino = write_file(&fs, "t", b"old bytes").await;
        assert!(fs.sync_write_back().await.is_empty());
        let fh = fs.open(ino, true, true).await.unwrap();
        fs.flush(fh).await.unwrap();
        fs.release(fh).await.unwrap();
        std::mem::forget(fs); // dies before the upload
    }
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    let (done, failed) = fs.recover_staged().await;
    assert_eq!((done, failed), (vec!["t".to_string()], vec![]));
    assert_eq!(object(mem.as_ref(), "t").await.unwrap(), b"");
}

#[tokio::test]
async fn of_two_staged_files_naming_one_key_recovery_uploads_the_one_named_last() {
    // A crash inside a rename over a pending file leaves both naming the key: the source
    // (named last, see Fs::rename) holds the name.
    let mem = Arc::new(MemStore::new());
    let dir = staging("dup");
    std::fs::create_dir_all(&dir).unwrap();
    let t = std::time::SystemTime::now();
    for (stem, bytes, at) in [("7-a", "replaced", t), ("9-b", "renamed over it", t + Duration::from_millis(1))] {
        std::fs::write(dir.join(format!("{stem}.data")), bytes).unwrap();
        std::fs::write(dir.join(format!("{stem}.key")), "f3").unwrap();
        let f = std::fs::File::options().write(true).open(dir.join(format!("{stem}.key"))).unwrap();
        f.set_modified(at).unwrap();
    }
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    let (done, failed) = fs.recover_staged().await;
    assert_eq!((done, failed), (vec!["f3".to_string()], vec![]));
    assert_eq!(object(mem.as_ref(), "f3").await.unwrap(), b"renamed over it");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the replaced bytes are dropped");
}

#[tokio::test]
async fn a_large_file_sends_nothing_before_its_close_is_due() {
    // Default mode starts uploading parts while a sequential writer writes; write-back
    // must not (the writes and the close are what it makes fast).
    let mem = Arc::new(MemStore::new());
    let dir = staging("large");
    let mut c = cfg(&dir, 60_000);
    c.write.part_size = 64 * 1024;
    let fs = Fs::new(mem.clone(), c);
    fs.start_write_back();
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let (_, fh) = fs.create(ROOT_INO, "big", 0, None).await.unwrap(); // one probe of the name
    let before = mem.requests.load(std::sync::atomic::Ordering::Relaxed);
    for (i, chunk) in data.chunks(128 * 1024).enumerate() {
        fs.write(fh, (i * 128 * 1024) as u64, chunk).await.unwrap();
    }
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    assert_eq!(mem.requests.load(std::sync::atomic::Ordering::Relaxed), before, "no request before the upload is due");
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "big").await.unwrap(), data);
}

/// Shuttle (random schedules): an upload of a queued file races a new commit of it (a
/// close after more writes). The queue entry may end only with an upload that began at or
/// after the file's last commit (`Entry::seq`, the queue's form of `write_gen`): an upload
/// that took the older commit must leave the newer one queued, or its bytes never go up.
#[test]
fn shuttle_an_upload_begun_before_a_commit_does_not_end_it() {
    use crate::write_back::Queue;
    shuttle::check_random(
        || {
            shuttle::future::block_on(async {
                let q = Arc::new(Queue::default());
                q.enqueue(7, "f".into(), 1, Duration::ZERO);
                let uploader = {
                    let q = q.clone();
                    shuttle::future::spawn(async move {
                        let (taken, _) = q.take_due(1);
                        shuttle::future::yield_now().await; // the upload's round trips
                        let taken: Vec<(u64, u64)> = taken.into_iter().map(|(i, s, _)| (i, s)).collect();
                        for &(ino, seq) in &taken {
                            q.finished(ino, seq, Ok(()));
                        }
                        taken
                    })
                };
                let committer = {
                    let q = q.clone();
                    shuttle::future::spawn(async move { q.enqueue(7, "f".into(), 2, Duration::ZERO) })
                };
                committer.await.unwrap();
                let taken = uploader.await.unwrap();
                let queued = q.status().files;
                match taken.as_slice() {
                    // The upload began after the second commit: it carried it, nothing is left.
                    [(7, 2)] => assert_eq!(queued, 0, "uploaded, yet still queued"),
                    // It began with the first commit only: the second must still be queued.
                    [(7, 1)] => assert_eq!(queued, 1, "a commit made during an upload was dropped"),
                    // The commit moved the due time past the scheduler's look (it read the
                    // clock, then the commit took the lock first): nothing went up, it waits.
                    [] => assert_eq!(queued, 1, "a file not uploaded left the queue"),
                    other => panic!("took {other:?}"),
                }
            })
        },
        500,
    );
}

/// A daemon holds a log open for writing; another process appends and closes. That close
/// must survive the daemon's next write and a crash: with another writer open, the version
/// is uploaded at close (the staged bytes are no longer a closed version once it writes).
#[tokio::test]
async fn a_close_beside_another_writer_survives_that_writer_and_a_crash() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("two-writers");
    {
        let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
        let (attr, daemon) = fs.create(ROOT_INO, "log", 0, None).await.unwrap();
        let other = fs.open(attr.ino, true, false).await.unwrap();
        fs.write(other, 0, b"important").await.unwrap();
        fs.flush(other).await.unwrap();
        fs.release(other).await.unwrap();
        assert_eq!(object(mem.as_ref(), "log").await.unwrap(), b"important", "uploaded at close");
        assert!(fs.sync_write_back().await.is_empty());
        fs.write(daemon, 9, b" and more").await.unwrap();
        std::mem::forget(fs); // dies before the daemon's close
    }
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    let (done, failed) = fs.recover_staged().await;
    assert!(done.is_empty() && failed.is_empty(), "{done:?} {failed:?}");
    assert_eq!(object(mem.as_ref(), "log").await.unwrap(), b"important");
}

/// A write-back mount over a memory store whose PUTs the test can hold (`FailStore::hold`),
/// staging in `staging(name)`: the memory store, the holding store and the mount.
pub(crate) fn over_held_puts(name: &str, delay_ms: u64) -> (Arc<MemStore>, Arc<FailStore>, Arc<Fs>) {
    let mem = Arc::new(MemStore::new());
    let held = Arc::new(FailStore::new(mem.clone(), Op::Put, u64::MAX, 0, StoreErrorKind::Unavailable));
    let fs = Fs::new(held.clone(), cfg(&staging(name), delay_ms));
    fs.start_write_back();
    (mem, held, fs)
}

/// Wait until the write-back queue holds no file (resends included); panics after `limit`.
pub(crate) async fn queue_empty(fs: &Fs, limit: Duration) {
    let settled = async {
        while fs.write_back_status().files > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(limit, settled).await.expect("never settled");
}

/// Wait until an upload of `ino` has begun and shows its bytes (staging.rs); panics after
/// `limit`.
pub(crate) async fn upload_shown(fs: &Fs, ino: u64, limit: Duration) {
    let shown = async {
        while fs.staging.view(ino).is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(limit, shown).await.expect("the upload never began");
}

pub(crate) async fn listed(fs: &Fs, ino: u64) -> Result<Vec<String>, crate::FsError> {
    let fh = fs.opendir(ino).await?;
    let v = fs.readdir(fh).map(|v| v.iter().map(|e| e.name.clone()).collect());
    fs.releasedir(fh);
    v
}

pub(crate) fn cfg_ttl0(dir: &std::path::Path) -> FsConfig {
    // Every readdir and lookup asks the store: what a listing of it shows is what counts.
    FsConfig { metadata_ttl: Duration::ZERO, ..cfg(dir, 0) }
}

pub(crate) async fn uploaded_files(fs: &Fs, n: usize) -> Vec<String> {
    let names: Vec<String> = (0..n).map(|i| format!("f{i:02}")).collect();
    for name in &names {
        write_file(fs, name, name.as_bytes()).await;
    }
    assert!(fs.sync_write_back().await.is_empty());
    names
}

#[tokio::test]
async fn a_reader_open_before_a_queued_change_reads_the_change() {
    // Same inode, same mount: a handle opened on the stored version reads what this mount
    // committed since (truncate(path), a writer's close), though it is only queued; an
    // upload would have switched it. It read the stored version's end (model test).
    let mem = Arc::new(MemStore::new());
    let dir = staging("reader-sees-queued");
    let clock = crate::Clock::manual();
    let fs = Fs::new(mem.clone(), FsConfig { clock: clock.clone(), ..cfg(&dir, 60_000) });
    fs.start_write_back();
    let ino = write_file(&fs, "f", b"0123456789").await;
    assert!(fs.sync_write_back().await.is_empty());
    let reader = fs.open(ino, false, false).await.unwrap();
    assert_eq!(&fs.read(reader, 0, 100).await.unwrap()[..], b"0123456789");
    fs.setattr(ino, crate::SetAttr { size: Some(16), ..Default::default() }).await.unwrap();
    assert!(object(mem.as_ref(), "f").await.is_some_and(|o| o.len() == 10), "queued, not uploaded");
    assert_eq!(&fs.read(reader, 8, 100).await.unwrap()[..], b"89\0\0\0\0\0\0", "the truncate's new end");
    let w = fs.open(ino, true, false).await.unwrap();
    fs.write(w, 0, b"ab").await.unwrap();
    fs.release(w).await.unwrap();
    assert_eq!(&fs.read(reader, 0, 4).await.unwrap()[..], b"ab23", "the writer's closed version");
    // Unlinked: the handle keeps reading the file it had (as on a local disk), not the
    // stored version cut short at its old end.
    fs.unlink(ROOT_INO, "f").await.unwrap();
    clock.advance(Duration::from_secs(5)); // what the kernel asks for next is from the store
    assert_eq!(fs.getattr(ino).await.unwrap().size, 16, "the size the handle reads, not the stored one");
    assert_eq!(&fs.read(reader, 8, 100).await.unwrap()[..], b"89\0\0\0\0\0\0", "after the unlink");
    fs.release(reader).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert!(keys(mem.as_ref()).await.is_empty());
}

/// A file created and deleted before its upload (a build's temporary) is unlinked at once
/// on the thread that asked, with no request; one the bucket has goes the slow way.
#[tokio::test]
async fn a_file_never_uploaded_is_unlinked_at_once_with_no_request() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("unlink-now");
    let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
    fs.start_write_back();
    let d = fs.mkdir(ROOT_INO, "d", None).await.unwrap();
    let (_, fh) = fs.create(d.ino, "tmp", 0, None).await.unwrap();
    fs.write(fh, 0, b"scratch").await.unwrap();
    fs.release(fh).await.unwrap();
    assert_eq!(fs.lookup_now(d.ino, "tmp").unwrap().unwrap().size, 7, "a staged file answers at once");
    let before = mem.requests.load(std::sync::atomic::Ordering::Relaxed);
    assert!(matches!(fs.unlink_now(d.ino, "tmp"), Some(Ok(()))));
    assert!(matches!(fs.lookup_now(d.ino, "tmp"), Some(Err(crate::FsError::NotFound))), "gone, known at once");
    assert!(fs.unlink_now(d.ino, "tmp").is_none(), "an unknown name is left to `unlink`");
    assert_eq!(mem.requests.load(std::sync::atomic::Ordering::Relaxed), before, "no request");
    assert_eq!(fs.write_back_status().files, 0, "its upload is cancelled");
    // The sidecars go at once (a crash uploads nothing); the data file soon after.
    let now: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(!now.iter().any(|n| n.to_string_lossy().ends_with(".key")), "{now:?}");
    let mut left = Vec::new();
    for _ in 0..100 {
        left = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(left.is_empty(), "nothing left in staging: {left:?}");
    // Uploaded: the bucket has it, so the fast path declines.
    let (_, fh) = fs.create(d.ino, "kept", 0, None).await.unwrap();
    fs.write(fh, 0, b"k").await.unwrap();
    fs.release(fh).await.unwrap();
    fs.sync_write_back().await;
    assert_eq!(object(mem.as_ref(), "d/kept").await.unwrap(), b"k");
    assert!(fs.unlink_now(d.ino, "kept").is_none());
    fs.unlink(d.ino, "kept").await.unwrap();
    fs.sync_write_back().await;
    let left = keys(mem.as_ref()).await;
    assert!(!left.iter().any(|k| k.starts_with("d/tmp") || k == "d/kept"), "{left:?}");
}

/// The kernel forgets a directory (its dentries expired, memory pressure, `drop_caches`)
/// while a file in it waits for its upload: the file stays in the directory, readable, and
/// a create of its name finds it (not a second staged file for one key).
#[tokio::test]
async fn a_pending_file_stays_in_its_directory_after_the_kernel_forgets_both() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("forget");
    let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
    fs.start_write_back();
    let d = fs.mkdir(ROOT_INO, "d", None).await.unwrap();
    let (f, fh) = fs.create(d.ino, "f", 0, None).await.unwrap();
    fs.write(fh, 0, b"pending").await.unwrap();
    fs.release(fh).await.unwrap();
    fs.forget(f.ino, 1);
    fs.forget(d.ino, 1);
    let d2 = fs.lookup(ROOT_INO, "d").await.unwrap();
    let f2 = fs.lookup(d2.ino, "f").await.expect("the pending file is still in its directory");
    assert_eq!(f2.ino, f.ino);
    assert_eq!(f2.size, 7);
    let fh = fs.open(f2.ino, false, false).await.unwrap();
    assert_eq!(&fs.read(fh, 0, 100).await.unwrap()[..], b"pending");
    fs.release(fh).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "d/f").await.unwrap(), b"pending");
}

/// A reader of a file whose upload hangs opens, reads and closes it at once (the upload
/// shows the bytes: staging.rs). Its open is counted in the staged file's handles when
/// the upload ends, whether it succeeds or a rename cancels it: the staged file stays
/// while the reader is open and goes once everything is closed.
#[tokio::test]
async fn a_reader_of_a_file_whose_upload_hangs_is_served_and_counted() {
    for cancel in [false, true] {
        let (mem, held, fs) = over_held_puts(&format!("shown-{cancel}"), 0);
        let hang = held.hold(Op::Put, 1);
        let (attr, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
        fs.write(fh, 0, b"closed bytes").await.unwrap();
        fs.release(fh).await.unwrap();
        let quick = Duration::from_secs(5);
        // The upload has begun (and waits for the store) once the reader finds it shown.
        upload_shown(&fs, attr.ino, quick).await;
        let (reader, read) = tokio::time::timeout(quick, async {
            let r = fs.open(attr.ino, false, false).await.unwrap();
            (r, fs.read(r, 0, 100).await.unwrap())
        })
        .await
        .expect("the reader waited for the upload");
        assert_eq!(&read[..], b"closed bytes");
        tokio::time::timeout(quick, fs.flush(reader)).await.expect("the reader's close waited").unwrap();
        let second = fs.open(attr.ino, false, false).await.unwrap();
        let ending = async {
            if cancel {
                fs.rename(ROOT_INO, "f", ROOT_INO, "g", false).await.unwrap();
            }
            hang.add_permits(1);
            assert!(fs.sync_write_back().await.is_empty());
        };
        tokio::time::timeout(quick, ending).await.expect("the upload did not end");
        fs.release(reader).await.unwrap();
        assert!(fs.staging.contains(attr.ino), "dropped while a reader is open (cancel {cancel})");
        assert_eq!(&fs.read(second, 0, 100).await.unwrap()[..], b"closed bytes");
        fs.release(second).await.unwrap();
        assert!(!fs.staging.contains(attr.ino), "still staged with nothing open (cancel {cancel})");
        let key = if cancel { "g" } else { "f" };
        assert_eq!(object(mem.as_ref(), key).await.unwrap(), b"closed bytes");
    }
}

/// A reader that comes while an upload waits for the staged file's lock (the writer's
/// RELEASE held it) queues behind that upload; once the upload shows the bytes and waits
/// for a store that hangs, the reader's open, read and close go on at once (before, they
/// waited for the store: CI saw a rewrite's read-back blocked for more than 30 s).
#[tokio::test]
async fn a_reader_queued_behind_an_upload_is_served_once_it_shows() {
    let (mem, held, fs) = over_held_puts("queued-reader", 60_000);
    let hang = held.hold(Op::Put, 1);
    let ino = write_file(&fs, "f", b"closed bytes").await;
    let early = fs.open(ino, false, false).await.unwrap(); // a reader open before the upload
    let staged = fs.staging.get(ino).expect("staged");
    let lock = staged.clone().lock_owned().await; // as a RELEASE holds it
    let sync = tokio::spawn({
        let fs = fs.clone();
        async move { fs.sync_write_back().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await; // the upload waits for the lock
    let closing = tokio::spawn({
        let fs = fs.clone();
        async move { fs.flush(early).await }
    });
    let opening = tokio::spawn({
        let fs = fs.clone();
        async move {
            let r = fs.open(ino, false, false).await.unwrap();
            let read = fs.read(r, 0, 100).await.unwrap();
            fs.flush(r).await.unwrap();
            (r, read)
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await; // the readers wait behind it
    drop(lock);
    let quick = Duration::from_secs(3); // under a writer's patience (5 s)
    upload_shown(&fs, ino, quick).await;
    let waited = "a reader waited for the store";
    tokio::time::timeout(quick, closing).await.expect(waited).unwrap().unwrap();
    let (late, read) = tokio::time::timeout(quick, opening).await.expect(waited).unwrap();
    assert!(fs.staging.view(ino).is_some(), "a reader cancelled the upload");
    assert_eq!(&read[..], b"closed bytes");
    hang.add_permits(1);
    assert!(tokio::time::timeout(quick, sync).await.expect("the upload did not end").unwrap().is_empty());
    fs.release(late).await.unwrap();
    fs.release(early).await.unwrap();
    assert!(!fs.staging.contains(ino), "still staged with nothing open");
    assert_eq!(object(mem.as_ref(), "f").await.unwrap(), b"closed bytes");
}

/// A writer's RELEASE after its FLUSH queued the file (a close sends both) leaves the
/// upload that hangs alone: before, it waited a writer's patience (5 s) and cancelled it,
/// holding the upload back 30 s.
#[tokio::test]
async fn a_writers_release_does_not_cancel_its_upload() {
    let (mem, held, fs) = over_held_puts("release-keeps-upload", 0);
    let hang = held.hold(Op::Put, 1);
    let (attr, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
    fs.write(fh, 0, b"closed bytes").await.unwrap();
    fs.flush(fh).await.unwrap();
    upload_shown(&fs, attr.ino, Duration::from_secs(5)).await;
    let release = tokio::spawn({
        let fs = fs.clone();
        async move { fs.release(fh).await }
    });
    tokio::time::sleep(Duration::from_secs(6)).await; // past a writer's patience
    assert!(fs.staging.view(attr.ino).is_some(), "the release cancelled the upload");
    hang.add_permits(1);
    let quick = Duration::from_secs(5);
    tokio::time::timeout(quick, release).await.expect("the release never ended").unwrap().unwrap();
    assert!(tokio::time::timeout(quick, fs.sync_write_back()).await.expect("the upload did not end").is_empty());
    assert_eq!(object(mem.as_ref(), "f").await.unwrap(), b"closed bytes");
    assert!(!fs.staging.contains(attr.ino), "still staged with nothing open");
}

/// Passthrough: a mapping's writes (the kernel's, straight into the staged file) made while
/// the upload of the file's last close hangs, and its RELEASE did not wait for that upload,
/// are committed and queued when the RELEASE ends: `bucketfs sync` puts them in the bucket
/// (before, nothing committed them and the bucket kept the closed version).
#[tokio::test]
async fn a_mappings_writes_during_an_upload_reach_the_bucket() {
    use std::os::unix::fs::FileExt;
    let (mem, held, fs) = over_held_puts("mapped-during-upload", 0);
    let hang = held.hold(Op::Put, 1);
    let (attr, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
    fs.write(fh, 0, b"closed bytes").await.unwrap();
    let backing = fs.backing_file(fh).await.unwrap();
    fs.note_passthrough_open(fh);
    fs.flush(fh).await.unwrap();
    let quick = Duration::from_secs(5);
    upload_shown(&fs, attr.ino, quick).await;
    let release = tokio::spawn({
        let fs = fs.clone();
        async move { fs.release(fh).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await; // the release waits for the upload
    backing.file.write_all_at(b"MAPPED", 0).unwrap(); // as the kernel writes a mapping's pages
    drop(backing); // and lets go of the file, the mapping gone
    hang.add_permits(1);
    tokio::time::timeout(quick, release).await.expect("the release never ended").unwrap().unwrap();
    assert!(tokio::time::timeout(quick, fs.sync_write_back()).await.expect("sync hung").is_empty());
    assert_eq!(object(mem.as_ref(), "f").await.unwrap(), b"MAPPED bytes");
}

/// A file this mount just wrote and uploaded is staged again from the read caches when it
/// changes (an append, a truncate, a `chmod` where the store keeps modes): no GET, so such
/// a call neither pays for one nor stalls on a store that hangs.
#[tokio::test]
async fn a_file_just_uploaded_is_staged_again_from_the_caches() {
    use crate::fs::SetAttr;
    let mem = Arc::new(MemStore::new());
    let no_get = Arc::new(FailStore::new(mem.clone(), Op::Get, 1, 1_000_000, StoreErrorKind::Unavailable));
    let dir = staging("cached-fill");
    let fs = Fs::new(no_get.clone(), cfg(&dir, 0));
    fs.start_write_back();
    let data: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
    let (a, b) = (write_file(&fs, "a", &data).await, write_file(&fs, "b", &data).await);
    assert!(fs.sync_write_back().await.is_empty());
    let fh = fs.open(a, true, false).await.expect("the append waited for a GET");
    fs.write(fh, data.len() as u64, b"tail").await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    fs.setattr(b, SetAttr { size: Some(3), ..Default::default() }).await.expect("the truncate waited for a GET");
    fs.setattr(a, SetAttr { mode: Some(0o100755), ..Default::default() }).await.expect("the chmod waited for a GET");
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(no_get.calls(), 0, "GETs sent");
    let mut want = data.clone();
    want.extend_from_slice(b"tail");
    assert_eq!(object(mem.as_ref(), "a").await.as_deref(), Some(&want[..]));
    assert_eq!(object(mem.as_ref(), "b").await.as_deref(), Some(&data[..3]));
}

/// After the unmount's own tries, the queue sends nothing more: an upload hanging in
/// flight is cancelled, so what is pending can be named at once. Before, against a store
/// that hung, the queue's retries held the process 100 s past the unmount's tries (tester
/// I: 205 s from SIGTERM to exit).
#[tokio::test]
async fn stopped_uploads_let_the_unmount_name_what_is_pending_at_once() {
    let limit = crate::fs_write_back::WRITER_PATIENCE * 4;
    let (_mem, held, fs) = over_held_puts("stopped-uploads", 0);
    let _hang = held.hold(Op::Put, 1);
    let ino = write_file(&fs, "f", b"pending").await;
    upload_shown(&fs, ino, limit).await; // in flight, hanging
    fs.stop_uploads();
    let pending = tokio::time::timeout(Duration::from_secs(5), fs.pending_keys()).await;
    assert_eq!(pending.expect("the hanging upload held the staged file"), ["f"]);
}
