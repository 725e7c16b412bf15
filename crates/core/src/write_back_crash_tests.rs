//! Write-back mode against the in-memory store, when things go wrong: a crash (the next
//! mount recovers what was committed), a store that hangs or times out, a delete or a move
//! cut half-way.

use std::sync::Arc;
use std::time::Duration;

use bucketfs_store::testing::{FailStore, MemStore, Op};
use bucketfs_store::{FileAttrs, PutOpts, Store, StoreErrorKind};

use super::tests::{
    cfg, cfg_ttl0, keys, listed, object, over_held_puts, queue_empty, staging, upload_shown, uploaded_files, write_file,
};
use crate::fs::{Fs, FsConfig, ROOT_INO};

/// `mv a b` over a pending `b` dies between the copy of `a` and its delete: the next mount
/// must not recover `b`'s old staged bytes over the copy (then `a` was lost once deleted).
/// With a handle open on `a` the rename moves the object itself, and journals the delete
/// that fails (it failed the rename, leaving `b`'s bytes to replace the copy while `a`'s
/// delete might still land); without, it journals the move and returns, and the next mount
/// finishes it.
#[tokio::test]
async fn a_rename_over_a_pending_file_that_dies_midway_keeps_the_source() {
    for open_a in [true, false] {
        let mem = Arc::new(MemStore::new());
        mem.put("a", bytes::Bytes::from_static(b"source"), Default::default()).await.unwrap();
        let dir = staging(&format!("rename-crash-{open_a}"));
        {
            let down = Arc::new(FailStore::new(mem.clone(), Op::Delete, 1, 1_000_000, StoreErrorKind::Unavailable));
            let fs = Fs::new(down, cfg(&dir, 60_000));
            fs.start_write_back();
            write_file(&fs, "b", b"old b").await;
            let a = fs.lookup(ROOT_INO, "a").await.unwrap().ino;
            let _fh = if open_a { Some(fs.open(a, false, false).await.unwrap()) } else { None };
            let renamed = fs.rename(ROOT_INO, "a", ROOT_INO, "b", false).await;
            assert!(renamed.is_ok(), "the source's delete or the move is journaled: {renamed:?}");
        } // the "crash"
        let copied = object(mem.as_ref(), "b").await;
        assert_eq!(copied.as_deref(), open_a.then_some(&b"source"[..]), "copied only by the rename itself");
        let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
        let (done, failed) = fs.recover_staged().await;
        assert!(failed.is_empty(), "{failed:?}");
        assert!(!done.contains(&"b".to_string()), "b's replaced bytes were recovered over the copy");
        fs.start_write_back();
        assert!(fs.sync_write_back().await.is_empty());
        assert_eq!(object(mem.as_ref(), "b").await.unwrap(), b"source");
        // The journaled delete or move is finished.
        assert_eq!(object(mem.as_ref(), "a").await, None, "open_a {open_a}");
    }
}

/// A delete journaled by a write-back mount that died is finished by the next mount even
/// without `--write-back`, before the file can show, and a new file of that name made
/// afterwards is never deleted by it.
#[tokio::test]
async fn a_delete_pending_at_a_crash_is_done_by_a_durable_mount_too() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("deferred-crash-durable");
    {
        let down = Arc::new(FailStore::new(mem.clone(), Op::Delete, 1, 1_000_000, StoreErrorKind::Unavailable));
        let fs = Fs::new(down, cfg_ttl0(&dir));
        fs.start_write_back();
        uploaded_files(&fs, 2).await;
        fs.unlink(ROOT_INO, "f01").await.unwrap();
    } // the "crash"
    assert!(object(mem.as_ref(), "f01").await.is_some());
    let durable = FsConfig { write_back: None, ..cfg_ttl0(&dir) };
    let fs = Fs::new(mem.clone(), durable);
    fs.start_write_back();
    assert_eq!(listed(&fs, ROOT_INO).await.unwrap(), [".", "..", "f00"], "the pending delete is done first");
    assert_eq!(keys(mem.as_ref()).await, ["f00"]);
    let (_, fh) = fs.create(ROOT_INO, "f01", 0, None).await.unwrap();
    fs.write(fh, 0, b"new").await.unwrap();
    fs.release(fh).await.unwrap();
    drop(fs);
    let fs = Fs::new(mem.clone(), cfg_ttl0(&dir));
    fs.start_write_back();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "f01").await.unwrap(), b"new", "no old delete replayed");
}

/// Tester R: `rm x` while the store was out, the mount killed, another client writing a
/// new `x` meanwhile: the next mount's replay of the delete deleted that client's file. A
/// delete sent late takes only the version unlinked (also without a crash, once the
/// outage ends); one sent at once, as before.
#[tokio::test]
async fn a_delete_sent_late_leaves_another_clients_newer_object() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("late-delete-other");
    {
        let down = Arc::new(FailStore::new(mem.clone(), Op::Delete, 1, 1_000_000, StoreErrorKind::Unavailable));
        let fs = Fs::new(down, cfg_ttl0(&dir));
        fs.start_write_back();
        uploaded_files(&fs, 3).await;
        fs.unlink(ROOT_INO, "f01").await.unwrap();
        fs.unlink(ROOT_INO, "f02").await.unwrap();
    } // the "crash"
    mem.put("f01", bytes::Bytes::from_static(b"another client's"), Default::default()).await.unwrap();
    let fs = Fs::new(mem.clone(), cfg_ttl0(&dir));
    fs.start_write_back();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["f00", "f01"], "f02 deleted, f01 another client's");
    assert_eq!(object(mem.as_ref(), "f01").await.unwrap(), b"another client's");
    drop(fs);

    // No crash: the store out at the unlink (its first attempt fails), back after the
    // other client's write; the retry (a second later) leaves that client's object.
    let dir = staging("late-delete-other-2");
    let down = Arc::new(FailStore::new(mem.clone(), Op::Delete, 1, 1, StoreErrorKind::Unavailable));
    let fs = Fs::new(down.clone(), cfg_ttl0(&dir));
    fs.start_write_back();
    uploaded_files(&fs, 2).await; // (a listing of the memory store tells no tags)
    fs.unlink(ROOT_INO, "f00").await.unwrap();
    while down.calls() < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    mem.put("f00", bytes::Bytes::from_static(b"written since"), Default::default()).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "f00").await.unwrap(), b"written since");
    // Sent at once, a delete takes whatever is there, as any client's does.
    fs.unlink(ROOT_INO, "f01").await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["f00"]);
}

/// A directory renamed while a file in it is being written moves the file's last closed
/// version; the bytes written since reach the bucket at their close, under the new name.
#[tokio::test]
async fn a_directory_rename_moves_the_last_closed_version_of_a_file_being_written() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("dir-rename-open");
    let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
    fs.start_write_back();
    let d = fs.mkdir(ROOT_INO, "d", None).await.unwrap();
    let (f, fh) = fs.create(d.ino, "f", 0, None).await.unwrap();
    fs.write(fh, 0, b"closed").await.unwrap();
    fs.release(fh).await.unwrap();
    let fh = fs.open(f.ino, true, false).await.unwrap(); // uploads the closed version first
    fs.write(fh, 0, b"UNCLOSED").await.unwrap();
    fs.rename(ROOT_INO, "d", ROOT_INO, "e", false).await.unwrap();
    assert_eq!(object(mem.as_ref(), "e/f").await.unwrap(), b"closed", "bytes nobody closed went up");
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "e/f").await.unwrap(), b"UNCLOSED");
    assert!(object(mem.as_ref(), "d/f").await.is_none());
}

/// A delete the store refuses for good (permission) is dropped, the file back in the
/// bucket, and `bucketfs sync` says so once (exit 1), as SEMANTICS promises.
#[tokio::test]
async fn a_delete_refused_for_good_is_named_by_sync() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("delete-refused");
    let refusing = Arc::new(FailStore::new(mem.clone(), Op::Delete, 1, 1_000_000, StoreErrorKind::PermissionDenied));
    let fs = Fs::new(refusing, cfg(&dir, 0));
    fs.start_write_back();
    uploaded_files(&fs, 1).await;
    fs.unlink(ROOT_INO, "f00").await.unwrap();
    let failed = fs.sync_write_back().await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, "f00");
    assert!(fs.sync_write_back().await.is_empty(), "said once");
    assert!(object(mem.as_ref(), "f00").await.is_some(), "nothing lost");
}

/// `fsync` in write-back mode commits: a crash after more writes still uploads the fsync'd
/// version (issue: the bucket held nothing, the bytes went to lost+found), and the later
/// bytes go aside, never over it. Appends past it, an overwrite inside it and a truncate.
#[tokio::test]
async fn an_fsyncd_version_survives_later_writes_and_a_crash() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("fsync-more");
    mem.put("over", bytes::Bytes::from_static(b"older object"), Default::default()).await.unwrap();
    {
        let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
        for name in ["append", "inside", "over", "cut"] {
            let (ino, fh) = match fs.lookup(ROOT_INO, name).await {
                Ok(a) => (a.ino, fs.open(a.ino, true, true).await.unwrap()),
                Err(_) => fs.create(ROOT_INO, name, 0, None).await.map(|(a, fh)| (a.ino, fh)).unwrap(),
            };
            fs.write(fh, 0, b"version-1-fsynced").await.unwrap();
            fs.fsync(fh).await.unwrap();
            match name {
                "inside" => fs.write(fh, 3, b"XXXX").await.map(drop).unwrap(),
                "cut" => {
                    let cut = crate::SetAttr { size: Some(4), fh: Some(fh), ..Default::default() };
                    fs.setattr(ino, cut).await.map(drop).unwrap()
                }
                _ => fs.write(fh, 17, b"+more-after-fsync").await.map(drop).unwrap(),
            }
            // A second fsync'd change of "append", then more: the newest fsync wins.
            if name == "append" {
                fs.fsync(fh).await.unwrap();
                fs.write(fh, 0, b"V").await.unwrap();
            }
        }
        std::mem::forget(fs); // kill -9: no close, no unmount
    }
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    let (mut done, failed) = fs.recover_staged().await;
    done.sort();
    assert_eq!((done, failed), (vec!["append".into(), "cut".into(), "inside".into(), "over".into()], vec![]));
    assert_eq!(object(mem.as_ref(), "append").await.unwrap(), b"version-1-fsynced+more-after-fsync");
    for k in ["inside", "over", "cut"] {
        assert_eq!(object(mem.as_ref(), k).await.unwrap(), b"version-1-fsynced", "{k}");
    }
    let found = std::fs::read_dir(dir.join("lost+found")).unwrap().count();
    assert_eq!(found, 8, "each file's unclosed bytes and their key, kept aside");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().filter(|e| e.path().is_file()).collect();
    assert!(left.is_empty(), "staging left behind: {:?}", left.iter().map(|e| e.path()).collect::<Vec<_>>());
}

/// `sync f` on a file closed and queued, through a handle that reads, makes that
/// version durable as the fsync of its writer would: a change after it copies it aside,
/// synced (before, that fsync synced the file but left the version unmarked, so a later
/// change kept it aside unsynced and a power cut could lose the version `sync` returned for).
#[tokio::test]
async fn an_fsync_that_wrote_nothing_keeps_the_queued_version_synced() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("fsync-as-is");
    let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
    fs.start_write_back();
    let ino = write_file(&fs, "f", b"closed and queued").await;
    let staged = fs.staging.get(ino).expect("staged");
    assert!(!staged.lock().await.keeps_synced(), "a close alone syncs nothing");
    let fh = fs.open(ino, false, false).await.unwrap(); // as `sync f` opens it
    fs.fsync(fh).await.unwrap();
    assert!(staged.lock().await.keeps_synced(), "the fsync'd version is not kept synced");
    fs.release(fh).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "f").await.unwrap(), b"closed and queued");
}

/// `mv d e` with files in `d` not uploaded yet and others in the bucket, the mount dies
/// in the middle of the move (after a source's delete): the next mount finishes the move
/// and uploads the pending files under `e/`. Nothing is left or made again under `d/` (issue
/// 48: both names came back). No pending file is uploaded before the move, under `d/`.
#[tokio::test]
async fn a_directory_move_cut_by_a_crash_is_finished_by_the_next_mount() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("dir-move-crash");
    let held = Arc::new(FailStore::new(mem.clone(), Op::Delete, u64::MAX, 0, StoreErrorKind::Unavailable));
    let fs = Fs::new(held.clone(), cfg(&dir, 60_000));
    fs.start_write_back();
    let d = fs.mkdir(ROOT_INO, "d", None).await.unwrap();
    for (name, data) in [("g0", &b"stored 0"[..]), ("g1", b"stored 1")] {
        let (_, fh) = fs.create(d.ino, name, 0, None).await.unwrap();
        fs.write(fh, 0, data).await.unwrap();
        fs.release(fh).await.unwrap();
    }
    assert!(fs.sync_write_back().await.is_empty());
    for name in ["p0", "p1"] {
        let (_, fh) = fs.create(d.ino, name, 0, None).await.unwrap();
        fs.write(fh, 0, name.as_bytes()).await.unwrap();
        fs.release(fh).await.unwrap();
    }
    let paused = held.hold(Op::Delete, 1); // the move stops after its first delete
    let fs2 = fs.clone();
    let mv = tokio::spawn(async move { fs2.rename(ROOT_INO, "d", ROOT_INO, "e", false).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!mv.is_finished(), "the move waits at its first delete");
    assert!(object(mem.as_ref(), "d/p0").await.is_none(), "a pending file went up under its old name");
    // The mount dies here (the move's future never finishes; nothing of it is dropped).
    let fresh = Fs::new(mem.clone(), cfg(&dir, 0));
    let (mut done, failed) = fresh.recover_staged().await;
    done.sort();
    assert_eq!((done, failed), (vec!["e/p0".to_string(), "e/p1".to_string()], vec![]));
    assert_eq!(keys(mem.as_ref()).await, ["e/", "e/g0", "e/g1", "e/p0", "e/p1"]);
    assert_eq!(object(mem.as_ref(), "e/g1").await.unwrap(), b"stored 1");
    std::mem::forget(mv);
    std::mem::forget(paused);
    std::mem::forget(fs);
}

/// A store that hangs in one upload (its PUT never answers) stalls no call that needs
/// nothing of that upload: `rm` of an uploaded file (journaled), `mv` of another pending
/// file, the close of a new file (issue 48: 17-28 s each, 141 s in a burst, behind one
/// mount-wide gate); nor a rename of the file being uploaded (its upload is cancelled).
#[tokio::test]
async fn a_hanging_upload_stalls_no_call_on_other_files() {
    let (mem, held, fs) = over_held_puts("hang", 0);
    write_file(&fs, "uploaded", b"in the bucket").await;
    assert!(fs.sync_write_back().await.is_empty());
    let _hang = held.hold(Op::Put, 1);
    write_file(&fs, "big", b"its upload hangs").await;
    let waited = tokio::time::timeout(Duration::from_secs(5), async {
        while fs.staging.queue.in_flight() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    waited.await.expect("the upload starts");
    let quick = Duration::from_secs(5); // the hang lasts for ever: any wait on it fails here
    let calls = async {
        fs.unlink(ROOT_INO, "uploaded").await.unwrap();
        write_file(&fs, "new", b"closed at once").await;
        fs.rename(ROOT_INO, "new", ROOT_INO, "renamed", false).await.unwrap();
        fs.unlink(ROOT_INO, "renamed").await.unwrap();
    };
    tokio::time::timeout(quick, calls).await.expect("calls on other files wait for the hanging upload");
    // The file being uploaded itself: its upload is cancelled, not waited for. The store
    // had the PUT (it landed): the old name is deleted, twice.
    let mv = fs.rename(ROOT_INO, "big", ROOT_INO, "big2", false);
    tokio::time::timeout(quick, mv).await.expect("mv of the file whose upload hangs").unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["big2"]);
    assert_eq!(object(mem.as_ref(), "big2").await.unwrap(), b"its upload hangs");
}

/// A pending file whose upload timed out is renamed; the PUT the store had received lands
/// after the rename's delete of the old name (a store that hung, then resumed). The old
/// name is deleted once more a moment later, and `bucketfs sync` waits for that: only the
/// new name is left (issue 48: both names stayed, 2 runs in 4).
#[tokio::test]
async fn a_timed_out_upload_landing_after_a_rename_leaves_no_object_behind() {
    late_landing_after_a_rename("late-put", 0).await;
}

/// The same for an `O_EXCL` file: its create-only PUT, landing late, made the object.
#[tokio::test]
async fn an_exclusive_create_whose_timed_out_upload_lands_late_is_renamed_cleanly() {
    late_landing_after_a_rename("excl-late-put", libc::O_EXCL).await;
}

/// A file created with `flags` whose first upload times out; it is renamed, and the PUT
/// lands after the rename's delete of the old name.
async fn late_landing_after_a_rename(name: &str, flags: i32) {
    let mem = Arc::new(MemStore::new());
    let dir = staging(name);
    let flaky = Arc::new(FailStore::new(mem.clone(), Op::Put, 1, 1, StoreErrorKind::Unavailable));
    let fs = Fs::new(flaky, cfg(&dir, 0));
    fs.start_write_back();
    let (_, fh) = fs.create(ROOT_INO, "p", flags, None).await.unwrap();
    fs.write(fh, 0, b"pending").await.unwrap();
    fs.release(fh).await.unwrap();
    let failed = tokio::time::timeout(Duration::from_secs(5), async {
        while fs.write_back_status().failing.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    failed.await.expect("the first upload fails (a timeout)");
    fs.rename(ROOT_INO, "p", ROOT_INO, "q", false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // the rename's delete of `p` is done
    mem.put("p", bytes::Bytes::from_static(b"pending"), Default::default()).await.unwrap(); // it lands
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["q"], "the late object under the old name was deleted again");
    assert_eq!(object(mem.as_ref(), "q").await.unwrap(), b"pending");
}

/// The crash falls after the move's journal entry and before its pending files were renamed
/// (or among those renames): the next mount uploads every one of them under the new name,
/// never some under each (issue 48: `d2/` held g0-g5 and g7-g9, `d2-renamed/` g6).
#[tokio::test]
async fn pending_files_of_a_journaled_move_are_recovered_under_the_new_name() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("dir-move-journal");
    {
        let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
        let d = fs.mkdir(ROOT_INO, "d", None).await.unwrap();
        for name in ["p0", "p1"] {
            let (_, fh) = fs.create(d.ino, name, 0, None).await.unwrap();
            fs.write(fh, 0, name.as_bytes()).await.unwrap();
            fs.release(fh).await.unwrap();
        }
        let keys = vec!["d/".to_string()];
        std::mem::forget(crate::moves::Entry::begin(&dir, "d/", "e/", &keys)); // the crash
        std::mem::forget(fs);
    }
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    let (mut done, failed) = fs.recover_staged().await;
    done.sort();
    assert_eq!((done, failed), (vec!["e/p0".to_string(), "e/p1".to_string()], vec![]));
    assert_eq!(keys(mem.as_ref()).await, ["e/", "e/p0", "e/p1"], "the marker moved too");
}

/// Two handles write one file through the kernel (passthrough), with the store down: one
/// closes, and its version is queued. The other then writes the file in place before the
/// upload, and the daemon is killed: the next mount uploads the closed version (kept as a
/// copy at the close), never loses it to `lost+found`.
#[tokio::test]
async fn a_version_closed_beside_another_kernel_writer_survives_a_crash() {
    use std::os::unix::fs::FileExt;
    let mem = Arc::new(MemStore::new());
    let dir = staging("closed-beside-writer");
    {
        let down = Arc::new(FailStore::new(mem.clone(), Op::Put, 1, 1_000_000, StoreErrorKind::Unavailable));
        let fs = Fs::new(down, cfg(&dir, 60_000));
        fs.start_write_back();
        let (attr, fa) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
        let fb = fs.open(attr.ino, true, false).await.unwrap();
        let backing = fs.backing_file(fa).await.unwrap();
        fs.note_passthrough_open(fa);
        fs.note_passthrough_open(fb);
        backing.file.write_all_at(b"closed", 0).unwrap(); // as the kernel would
        fs.flush(fa).await.unwrap();
        fs.release(fa).await.unwrap();
        backing.file.write_all_at(b"LATER!", 0).unwrap(); // fb's write, never closed
        std::mem::forget(fs); // the crash
    }
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    let (done, failed) = fs.recover_staged().await;
    assert_eq!((done, failed), (vec!["f".to_string()], vec![]));
    assert_eq!(object(mem.as_ref(), "f").await.unwrap(), b"closed");
}

/// On a store that moves a folder in one request (Drive), a directory move cut by a crash
/// is finished with that request: deleting the source folder, as a copy-then-delete move
/// does, would take the files still in it.
#[tokio::test]
async fn a_journaled_move_on_a_store_that_moves_folders_keeps_their_files() {
    use bucketfs_store::{PutOpts, Store};
    for moved_before_the_crash in [false, true] {
        let mem = Arc::new(MemStore::new().with_moves());
        let dir = staging("dir-move-journal-drive");
        for (k, v) in [("d/", ""), ("d/x", "x"), ("d/s/y", "y")] {
            mem.put(k, bytes::Bytes::from(v), PutOpts::default()).await.unwrap();
        }
        if moved_before_the_crash {
            mem.rename("d/", "e/").await.unwrap();
        }
        std::mem::forget(crate::moves::Entry::begin(&dir, "d/", "e/", &[])); // the crash
        let fs = Fs::new(mem.clone(), cfg(&dir, 0));
        assert_eq!(fs.recover_staged().await, (vec![], vec![]));
        assert_eq!(
            keys(mem.as_ref()).await,
            ["e/", "e/s/y", "e/x"],
            "moved before the crash: {moved_before_the_crash}"
        );
        assert_eq!(object(mem.as_ref(), "e/x").await.unwrap(), b"x");
    }
}

/// Write-back O_EXCL create, and another client makes the key before the upload: the upload
/// is refused once and not tried again (no retry storm against their object), `sync` names
/// it, and a rename sends our bytes under the new name.
#[tokio::test]
async fn a_refused_exclusive_upload_waits_for_a_rename_and_sync_names_it() {
    use bucketfs_store::PutOpts;
    let mem = Arc::new(MemStore::new());
    let dir = staging("excl-refused");
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    fs.start_write_back();
    let (_, fh) = fs.create(ROOT_INO, "lock", libc::O_EXCL, None).await.unwrap();
    fs.write(fh, 0, b"ours").await.unwrap();
    mem.put("lock", bytes::Bytes::from_static(b"theirs"), PutOpts::default()).await.unwrap();
    fs.release(fh).await.unwrap();
    let failed = fs.sync_write_back().await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].1.contains("another client created it first"), "{failed:?}");
    // Backoff would have tried again by now (1 s, then 2 s): a refusal is not retried.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let failing = fs.write_back_status().failing;
    assert_eq!(failing.len(), 1);
    assert_eq!(failing[0].1, 1, "attempts: {failing:?}");
    assert_eq!(object(mem.as_ref(), "lock").await.as_deref(), Some(&b"theirs"[..]));
    fs.rename(ROOT_INO, "lock", ROOT_INO, "lock.mine", false).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "lock.mine").await.as_deref(), Some(&b"ours"[..]));
    assert_eq!(object(mem.as_ref(), "lock").await.as_deref(), Some(&b"theirs"[..]));
}

/// A writer of a file whose upload hangs goes ahead after `WRITER_PATIENCE`: the upload is
/// cut off and its open, write and close return. The closed version it changes stays
/// recoverable: a crash before the writer's close uploads that version at the next mount;
/// with no crash, the writer's version goes up once the store answers.
#[tokio::test]
async fn a_writer_of_a_file_whose_upload_hangs_goes_ahead_and_keeps_the_closed_version() {
    let limit = crate::fs_write_back::WRITER_PATIENCE * 4;
    for crash in [false, true] {
        let mem = Arc::new(MemStore::new());
        let dir = staging(&format!("writer-hang-{crash}"));
        let held = Arc::new(FailStore::new(mem.clone(), Op::Put, u64::MAX, 0, StoreErrorKind::Unavailable));
        let ino = {
            let fs = Fs::new(held.clone(), cfg(&dir, 0));
            fs.start_write_back();
            let hang = held.hold(Op::Put, 100);
            let (attr, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
            fs.write(fh, 0, b"closed version").await.unwrap();
            fs.release(fh).await.unwrap();
            upload_shown(&fs, attr.ino, limit).await;
            let writer = tokio::time::timeout(limit, async {
                let w = fs.open(attr.ino, true, false).await.unwrap();
                fs.write(w, 0, b"CHANGED").await.unwrap();
                w
            })
            .await
            .expect("the writer waited for the upload that hangs");
            if crash {
                std::mem::forget(fs); // dies before the writer's close
                attr.ino
            } else {
                hang.add_permits(100);
                // The closed version is not known to be in the bucket while the writer
                // changes it: sync says so.
                let failed = fs.sync_write_back().await;
                assert_eq!(failed.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["f"], "{failed:?}");
                tokio::time::timeout(limit, fs.flush(writer)).await.expect("the writer's close waited").unwrap();
                fs.release(writer).await.unwrap();
                assert!(fs.sync_write_back().await.is_empty());
                assert_eq!(object(mem.as_ref(), "f").await.unwrap(), b"CHANGEDversion");
                continue;
            }
        };
        let fs = Fs::new(mem.clone(), cfg(&dir, 0));
        let (done, failed) = fs.recover_staged().await;
        assert!(failed.is_empty(), "{failed:?}");
        assert_eq!(done, ["f"], "the closed version was not recovered (inode {ino})");
        assert_eq!(object(mem.as_ref(), "f").await.unwrap(), b"closed version");
    }
}

/// A handle that flushed (its version queued) writes again while that version's upload
/// hangs: the write cuts the upload off after `WRITER_PATIENCE` instead of waiting for the
/// store, and its close's version goes up once the store answers.
#[tokio::test]
async fn a_write_after_a_flush_does_not_wait_for_its_upload_that_hangs() {
    let limit = crate::fs_write_back::WRITER_PATIENCE * 4;
    let (mem, held, fs) = over_held_puts("write-after-flush-hang", 0);
    let hang = held.hold(Op::Put, 100);
    let (attr, fh) = fs.create(ROOT_INO, "log", 0, None).await.unwrap();
    fs.write(fh, 0, b"first line\n").await.unwrap();
    fs.flush(fh).await.unwrap();
    upload_shown(&fs, attr.ino, limit).await;
    tokio::time::timeout(limit, fs.write(fh, 11, b"second line\n")).await.expect("the write waited").unwrap();
    tokio::time::timeout(limit, fs.flush(fh)).await.expect("the close waited").unwrap();
    fs.release(fh).await.unwrap();
    hang.add_permits(100);
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "log").await.unwrap(), b"first line\nsecond line\n");
}

/// A file closed while the store refuses uploads is opened for writing, and the kernel is
/// given its staged file (passthrough): its writes land unseen, so the closed version is
/// copied aside first, and a crash before the writer's close recovers that version.
#[tokio::test]
async fn a_passthrough_writer_of_a_queued_file_keeps_its_closed_version_through_a_crash() {
    use std::os::unix::fs::FileExt;
    let mem = Arc::new(MemStore::new());
    let dir = staging("passthrough-writer-queued");
    {
        let down = Arc::new(FailStore::new(mem.clone(), Op::Put, 1, u64::MAX, StoreErrorKind::Unavailable));
        let fs = Fs::new(down, cfg(&dir, 0));
        fs.start_write_back();
        let (attr, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
        fs.write(fh, 0, b"closed version").await.unwrap();
        fs.release(fh).await.unwrap();
        let writer = fs.open(attr.ino, true, false).await.unwrap(); // the upload first fails
        let backing = fs.backing_file(writer).await.unwrap();
        fs.note_passthrough_open(writer);
        backing.file.write_all_at(b"TORN", 0).unwrap(); // as the kernel would
        std::mem::forget(fs); // dies before the writer's close
    }
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    let (done, failed) = fs.recover_staged().await;
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(done, ["f"], "the closed version was not kept aside");
    assert_eq!(object(mem.as_ref(), "f").await.unwrap(), b"closed version");
}

/// The older version's request, cut off while the store hung, lands after the newer
/// version's upload (the store still held it): the newer version goes up once more a
/// moment later, so the bucket ends with it; a crash before that recovers it.
#[tokio::test]
async fn an_upload_cut_off_that_lands_late_is_overwritten_by_the_newer_version() {
    let limit = crate::fs_write_back::WRITER_PATIENCE * 4;
    for crash in [false, true] {
        let mem = Arc::new(MemStore::new());
        let dir = staging(&format!("cut-off-lands-late-{crash}"));
        let held = Arc::new(FailStore::new(mem.clone(), Op::Put, u64::MAX, 0, StoreErrorKind::Unavailable));
        let fs = Fs::new(held.clone(), cfg(&dir, 0));
        fs.start_write_back();
        let hang = held.hold(Op::Put, 1);
        let (attr, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
        fs.write(fh, 0, b"older").await.unwrap();
        fs.release(fh).await.unwrap();
        upload_shown(&fs, attr.ino, limit).await;
        let w = tokio::time::timeout(limit, fs.open(attr.ino, true, true)).await.expect("the writer waited").unwrap();
        fs.write(w, 0, b"newer").await.unwrap();
        fs.release(w).await.unwrap();
        let uploaded = async {
            while object(mem.as_ref(), "f").await.as_deref() != Some(b"newer".as_slice()) {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        };
        tokio::time::timeout(limit, uploaded).await.expect("the newer version never went up");
        mem.put("f", bytes::Bytes::from_static(b"older"), Default::default()).await.unwrap(); // lands late
        if crash {
            std::mem::forget(fs); // before the second upload
            let fs = Fs::new(mem.clone(), cfg(&dir, 0));
            let (done, failed) = fs.recover_staged().await;
            assert!(failed.is_empty() && done == ["f"], "{done:?} {failed:?}");
        } else {
            assert!(fs.sync_write_back().await.is_empty());
            queue_empty(&fs, limit).await; // sent again
        }
        assert_eq!(object(mem.as_ref(), "f").await.unwrap(), b"newer", "crash {crash}");
        drop(hang);
    }
}

/// A close beside another writer uploads at once; one cut off while the store hung may
/// land after the next such close's upload: that one goes up again a moment later too.
#[tokio::test]
async fn a_close_beside_a_writer_after_a_cut_off_one_is_sent_again() {
    let limit = crate::fs_write_back::WRITER_PATIENCE * 4;
    let (mem, held, fs) = over_held_puts("beside-writer-cut-off", 60_000);
    let (attr, daemon) = fs.create(ROOT_INO, "log", 0, None).await.unwrap();
    let hang = held.hold(Op::Put, 1);
    let script = fs.open(attr.ino, true, false).await.unwrap();
    fs.write(script, 0, b"older").await.unwrap();
    tokio::time::timeout(limit, fs.flush(script)).await.expect("the close waited for the store").unwrap();
    fs.write(script, 0, b"newer").await.unwrap();
    fs.flush(script).await.unwrap(); // the store answers again: uploaded at once
    assert_eq!(object(mem.as_ref(), "log").await.unwrap(), b"newer");
    mem.put("log", bytes::Bytes::from_static(b"older"), Default::default()).await.unwrap(); // lands late
    fs.release(script).await.unwrap();
    fs.release(daemon).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "log").await.unwrap(), b"newer");
    drop(hang);
}

/// The keys recovery names as failed (each is followed by why, in parentheses).
fn failed_keys(failed: &[String]) -> Vec<&str> {
    failed.iter().map(|f| f.split(" (").next().unwrap_or_default()).collect()
}

/// What a `kill -9` at this instant leaves on local disk: the staging directory and its
/// journals beside it, copied under a new name (`<dir>-crash`) while the mount goes on.
fn crash_image(dir: &std::path::Path) -> std::path::PathBuf {
    fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
        let Ok(entries) = std::fs::read_dir(from) else { return };
        std::fs::create_dir_all(to).unwrap();
        for e in entries.flatten() {
            let (src, dst) = (e.path(), to.join(e.file_name()));
            if e.file_type().unwrap().is_dir() {
                copy_tree(&src, &dst);
            } else {
                let _ = std::fs::copy(&src, &dst);
            }
        }
    }
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let image = dir.with_file_name(format!("{name}-crash"));
    for (from, to) in [
        (dir.to_path_buf(), image.clone()),
        (dir.with_file_name(format!(".{name}.moves")), dir.with_file_name(format!(".{name}-crash.moves"))),
        (dir.with_file_name(format!(".{name}.deletes")), dir.with_file_name(format!(".{name}-crash.deletes"))),
    ] {
        let _ = std::fs::remove_dir_all(&to);
        copy_tree(&from, &to);
    }
    image
}

/// `mv a b` over a pending `b`, with `a` open (read: it moves now, by copy then delete;
/// written: its move is journaled and sent in the background): the daemon dies during the
/// copy. The next mount finishes the move and must not recover `b`'s
/// replaced bytes over the copy: `a`'s bytes hold `b`, never lost. `a` is either only read
/// or being written (its last closed version is the one that moves).
#[tokio::test]
async fn a_rename_over_a_pending_file_cut_during_its_copy_keeps_the_source() {
    for writing in [false, true] {
        let mem = Arc::new(MemStore::new());
        mem.put("a", bytes::Bytes::from_static(b"source"), Default::default()).await.unwrap();
        let dir = staging(&format!("rename-copy-crash-{writing}"));
        let held = Arc::new(FailStore::new(mem.clone(), Op::Copy, u64::MAX, 0, StoreErrorKind::Unavailable));
        let copy = held.hold(Op::Copy, 1);
        let fs = Arc::new(Fs::new(held.clone(), cfg(&dir, 60_000)));
        fs.start_write_back();
        write_file(&fs, "b", b"old b").await;
        let a = fs.lookup(ROOT_INO, "a").await.unwrap().ino;
        let fh = fs.open(a, writing, false).await.unwrap();
        if writing {
            fs.write(fh, 0, b"never closed").await.unwrap();
        }
        let f = fs.clone();
        let rename = tokio::spawn(async move { f.rename(ROOT_INO, "a", ROOT_INO, "b", false).await });
        for _ in 0..500 {
            if held.calls() > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Being written, `a`'s move is journaled and sent in the background.
        assert_eq!(held.calls(), 1, "the rename, or its move in the background, copies a");
        let image = crash_image(&dir); // the crash, during the copy
        rename.abort();
        let _ = rename.await;
        drop((fs, copy));
        // A first remount cannot finish the move (its copy fails): b's replaced bytes are
        // neither uploaded (a later replay would take them for a newer b and skip the copy)
        // nor recovered; kept back while the move is unfinished, or dropped once it was
        // journaled for the background (where it always goes first).
        let no_copy = Arc::new(FailStore::new(mem.clone(), Op::Copy, 1, u64::MAX, StoreErrorKind::Unavailable));
        let fs = Fs::new(no_copy, cfg(&image, 60_000));
        let (done, failed) = fs.recover_staged().await;
        let kept_back: &[&str] = if writing { &[] } else { &["b"] };
        assert!(!done.contains(&"b".to_string()) && failed_keys(&failed) == kept_back, "{done:?} {failed:?}");
        assert_eq!(object(mem.as_ref(), "b").await, None, "writing {writing}: b uploaded while its move is unfinished");
        drop(fs);
        let fs = Fs::new(mem.clone(), cfg(&image, 60_000));
        let (done, failed) = fs.recover_staged().await;
        assert!(failed.is_empty(), "{failed:?}");
        fs.start_write_back();
        assert!(fs.sync_write_back().await.is_empty());
        assert!(!done.contains(&"b".to_string()), "writing {writing}: b's replaced bytes were recovered over the copy");
        assert_eq!(keys(mem.as_ref()).await, ["b"], "writing {writing}: one name");
        assert_eq!(object(mem.as_ref(), "b").await.unwrap(), b"source", "writing {writing}");
    }
}

/// Files closed (or changed by `chmod`/`touch -d`) and killed before their upload: the next
/// mount uploads them with the mode and mtime the upload would have carried (an executable
/// stays one; `make` sees the mtime `tar -x` set).
#[tokio::test]
async fn a_crash_keeps_the_mode_and_mtime_of_pending_files() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("attrs-crash");
    let old = std::time::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    // Another client's object with headers and metadata of its own: a chmod keeps them.
    let theirs = bucketfs_store::attrs::Foreign {
        cache_control: Some("max-age=600".into()),
        user: vec![("team".into(), "ml".into())],
        ..Default::default()
    };
    let put =
        PutOpts { attrs: FileAttrs { foreign: theirs.clone().new(), ..Default::default() }, ..Default::default() };
    mem.put("theirs", bytes::Bytes::from_static(b"site"), put).await.unwrap();
    {
        let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
        fs.start_write_back();
        fs.readdir_unopened(ROOT_INO, 0).await.unwrap(); // known from a listing: no metadata
        let ino = fs.lookup(ROOT_INO, "theirs").await.unwrap().ino;
        fs.setattr(ino, crate::fs::SetAttr { mode: Some(0o100600), ..Default::default() }).await.unwrap();
        let (made, fh) = fs.create(ROOT_INO, "made-755", 0, Some(0o755)).await.unwrap();
        fs.write(fh, 0, b"#!/bin/sh\n").await.unwrap();
        fs.release(fh).await.unwrap();
        let later = write_file(&fs, "chmod-later", b"x").await;
        let set = |mode, mtime| crate::fs::SetAttr { size: None, mode, uid: None, gid: None, mtime, fh: None };
        fs.setattr(later, set(Some(0o100700), Some(old))).await.unwrap();
        assert_eq!(made.perm, 0o755);
        std::mem::forget(fs); // the crash
    }
    let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
    let (mut done, failed) = fs.recover_staged().await;
    done.sort();
    assert_eq!((done, failed), (vec!["chmod-later".to_string(), "made-755".to_string(), "theirs".into()], vec![]));
    let attrs = |key: &'static str| {
        let mem = mem.clone();
        async move { mem.head(key, Default::default()).await.unwrap().attrs }
    };
    assert_eq!(attrs("made-755").await.mode, Some(0o100755));
    let a = attrs("chmod-later").await;
    assert_eq!((a.mode, a.mtime), (Some(0o100700), Some(old)));
    let a = attrs("theirs").await;
    assert_eq!((a.mode, a.foreign.as_deref()), (Some(0o100600), theirs.new().as_deref()));
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "attrs"))
        .collect();
    assert!(left.is_empty(), "sidecars left: {left:?}");
}

/// An `O_EXCL` file whose upload fails at a clean unmount (the store down) stays staged
/// for the next mount, which uploads it (create-only), as any other pending file; it is
/// not set aside in `lost+found` as if refused.
#[tokio::test]
async fn an_exclusive_file_pending_at_unmount_is_uploaded_by_the_next_mount() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("excl-unmount");
    {
        let down = Arc::new(FailStore::new(mem.clone(), Op::Put, 1, u64::MAX, StoreErrorKind::Unavailable));
        let fs = Fs::new(down.clone(), cfg(&dir, 0));
        fs.start_write_back();
        let (_, fh) = fs.create(ROOT_INO, "lock", libc::O_EXCL, None).await.unwrap();
        fs.write(fh, 0, b"pid 42").await.unwrap();
        fs.release(fh).await.unwrap();
        assert_eq!(fs.sync_all().await, ["lock"], "the unmount names it");
        assert!(down.calls() > 0, "the upload was tried");
    } // the unmount
    assert!(!dir.join("lost+found").exists(), "set aside as if refused");
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    let (done, failed) = fs.recover_staged().await;
    assert_eq!((done, failed), (vec!["lock".to_string()], vec![]));
    assert_eq!(object(mem.as_ref(), "lock").await.unwrap(), b"pid 42");
}

/// Recovery against a store that fails: once an upload fails for want of the store, the
/// other files are not tried (each would wait out the same timeouts) and all are named, kept
/// for the next try (a denied permission too: credentials that cannot write deny every key);
/// one the store refuses for good (the key's name) goes to `lost+found`.
#[tokio::test]
async fn recovery_stops_at_a_failing_store_and_sets_aside_a_refusal() {
    for (kind, tries, aside) in [
        (StoreErrorKind::Unavailable, 1, false),
        (StoreErrorKind::PermissionDenied, 1, false),
        (StoreErrorKind::InvalidName, 3, true),
    ] {
        let mem = Arc::new(MemStore::new());
        let dir = staging(&format!("recovery-fails-{kind:?}"));
        {
            let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
            fs.start_write_back();
            for name in ["f0", "f1", "f2"] {
                write_file(&fs, name, name.as_bytes()).await;
            }
            std::mem::forget(fs); // the crash
        }
        let failing = Arc::new(FailStore::new(mem.clone(), Op::Upload, 1, u64::MAX, kind));
        let fs = Fs::new(failing.clone(), cfg(&dir, 60_000));
        let (done, mut failed) = fs.recover_staged().await;
        failed.sort();
        assert!(done.is_empty(), "{kind:?}: {done:?}");
        assert_eq!(failing.calls(), tries, "{kind:?}: uploads tried");
        let found = std::fs::read_dir(dir.join("lost+found")).map_or(0, |d| d.count());
        if aside {
            assert!(failed.is_empty(), "{kind:?}: {failed:?}");
            assert_eq!(found, 6, "{kind:?}: each file and its .key in lost+found");
        } else {
            assert_eq!(failed_keys(&failed), ["f0", "f1", "f2"], "{kind:?}");
            assert!(failed.iter().filter(|f| f.ends_with("(not tried)")).count() == 2, "{failed:?}");
            assert_eq!(found, 0);
            // Kept: the next mount, with the store back, uploads them.
            let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
            let (mut done, failed) = fs.recover_staged().await;
            done.sort();
            assert_eq!((done, failed), (vec!["f0".to_string(), "f1".into(), "f2".into()], vec![]));
        }
    }
}

/// A directory move a crash cut short is finished by the next mount, whose recovery then
/// stops at a failing store: the files it did not upload are named under the new directory
/// on disk, so the mount after (the move's entry gone) uploads them there, not under the old.
#[tokio::test]
async fn files_of_a_finished_move_kept_by_a_failed_recovery_stay_under_the_new_name() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("dir-move-kept");
    {
        let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
        let d = fs.mkdir(ROOT_INO, "d", None).await.unwrap();
        for name in ["p0", "p1"] {
            let (_, fh) = fs.create(d.ino, name, 0, None).await.unwrap();
            fs.write(fh, 0, name.as_bytes()).await.unwrap();
            fs.release(fh).await.unwrap();
        }
        std::mem::forget(crate::moves::Entry::begin(&dir, "d/", "e/", &["d/".to_string()])); // the crash
        std::mem::forget(fs);
    }
    let down = Arc::new(FailStore::new(mem.clone(), Op::Upload, 1, u64::MAX, StoreErrorKind::Unavailable));
    let fs = Fs::new(down, cfg(&dir, 0));
    let (done, mut failed) = fs.recover_staged().await;
    failed.sort();
    assert!(done.is_empty(), "{done:?}");
    assert_eq!(failed_keys(&failed), ["e/p0", "e/p1"]);
    drop(fs);
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    let (mut done, failed) = fs.recover_staged().await;
    done.sort();
    assert_eq!((done, failed), (vec!["e/p0".to_string(), "e/p1".to_string()], vec![]));
    assert_eq!(keys(mem.as_ref()).await, ["e/", "e/p0", "e/p1"]);
}

/// An fsync'd version changed inside afterwards (kept as a `.base` copy), then a crash, and
/// the store refuses the key for good: `lost+found` keeps the fsync'd version (and the later
/// bytes beside it), never only the torn ones.
#[tokio::test]
async fn a_refused_recovery_keeps_the_committed_version_aside() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("refused-base");
    {
        let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
        let (_, fh) = fs.create(ROOT_INO, "inside", 0, None).await.unwrap();
        fs.write(fh, 0, b"version-1-fsynced").await.unwrap();
        fs.fsync(fh).await.unwrap();
        fs.write(fh, 3, b"XXXX").await.unwrap();
        std::mem::forget(fs); // kill -9
    }
    let refusing = Arc::new(FailStore::new(mem.clone(), Op::Upload, 1, u64::MAX, StoreErrorKind::InvalidName));
    let fs = Fs::new(refusing, cfg(&dir, 0));
    let (done, failed) = fs.recover_staged().await;
    assert!(done.is_empty() && failed.is_empty(), "{done:?} {failed:?}");
    let mut kept: Vec<Vec<u8>> = std::fs::read_dir(dir.join("lost+found"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_none_or(|x| x != "key"))
        .map(|e| std::fs::read(e.path()).unwrap())
        .collect();
    kept.sort();
    assert_eq!(kept, [b"verXXXX-1-fsynced".to_vec(), b"version-1-fsynced".to_vec()]);
}
