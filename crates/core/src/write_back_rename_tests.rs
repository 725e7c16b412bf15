//! Write-back renames of files being written, queued, moved with their directory, or
//! whose move waits for a store that hangs (split from write_back_tests.rs).

use std::sync::Arc;
use std::time::Duration;

use bucketfs_store::testing::{FailStore, MemStore, Op};
use bucketfs_store::{Store, StoreErrorKind};

use super::tests::{cfg, cfg_ttl0, keys, object, staging, write_file};
use crate::fs::{Fs, FsConfig, ROOT_INO};

/// logrotate's `mv app.log app.log.1` while the app still appends, then a crash before the
/// app closes: the last closed version must be in the bucket under the new name (the
/// unclosed bytes are set aside, as always), never under neither name.
#[tokio::test]
async fn a_file_renamed_while_written_keeps_its_last_closed_version_through_a_crash() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("rename-open");
    mem.put("app.log", bytes::Bytes::from_static(b"v0 closed"), Default::default()).await.unwrap();
    {
        let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
        let ino = fs.lookup(ROOT_INO, "app.log").await.unwrap().ino;
        let fh = fs.open(ino, true, false).await.unwrap();
        fs.write(fh, 9, b" + appended").await.unwrap();
        fs.rename(ROOT_INO, "app.log", ROOT_INO, "app.log.1", false).await.unwrap();
        std::mem::forget(fs); // dies before the app's close (and before the move is sent)
    }
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    let (done, failed) = fs.recover_staged().await;
    assert!(done.is_empty() && failed.is_empty(), "{done:?} {failed:?}");
    fs.start_write_back();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "app.log.1").await.unwrap(), b"v0 closed");
    assert!(object(mem.as_ref(), "app.log").await.is_none());
}

/// The same rename without a crash: the writer's close sends everything under the new
/// name, and nothing is left under the old one.
#[tokio::test]
async fn a_file_renamed_while_written_arrives_whole_under_its_new_name() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("rename-open-2");
    mem.put("app.log", bytes::Bytes::from_static(b"v0 closed"), Default::default()).await.unwrap();
    let fs = Fs::new(mem.clone(), cfg(&dir, 0));
    fs.start_write_back();
    let ino = fs.lookup(ROOT_INO, "app.log").await.unwrap().ino;
    let fh = fs.open(ino, true, false).await.unwrap();
    fs.write(fh, 9, b" + appended").await.unwrap();
    fs.rename(ROOT_INO, "app.log", ROOT_INO, "app.log.1", false).await.unwrap();
    fs.write(fh, 20, b"!").await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["app.log.1"]);
    assert_eq!(object(mem.as_ref(), "app.log.1").await.unwrap(), b"v0 closed + appended!");
}

/// The same rename while every copy hangs: the move is journaled and the rename returns;
/// the copy goes in the background, before the writer's close sends the rest.
#[tokio::test]
async fn a_file_renamed_while_written_does_not_wait_for_a_hanging_copy() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("rename-open-hang");
    mem.put("app.log", bytes::Bytes::from_static(b"v0 closed"), Default::default()).await.unwrap();
    let held = Arc::new(FailStore::new(mem.clone(), Op::Check, u64::MAX, 0, StoreErrorKind::Other));
    let fs = Fs::new(held.clone(), cfg(&dir, 0));
    fs.start_write_back();
    let ino = fs.lookup(ROOT_INO, "app.log").await.unwrap().ino;
    let fh = fs.open(ino, true, false).await.unwrap();
    fs.write(fh, 9, b" + appended").await.unwrap();
    let copies = held.hold(Op::Copy, u32::MAX);
    tokio::time::timeout(Duration::from_secs(5), fs.rename(ROOT_INO, "app.log", ROOT_INO, "app.log.1", false))
        .await
        .expect("the rename waited for the copy")
        .unwrap();
    assert_eq!(keys(mem.as_ref()).await, ["app.log"], "moved while copies were held");
    fs.write(fh, 20, b"!").await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    copies.add_permits(1_000);
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["app.log.1"]);
    assert_eq!(object(mem.as_ref(), "app.log.1").await.unwrap(), b"v0 closed + appended!");
}

/// An editor's save (write a new file, rename it over the old one), then `rm`, all before
/// the upload: the old file's object is still under the name, and nothing else will
/// delete it; the unlink must, or the old contents come back (model test, seed 1615287091).
#[tokio::test]
async fn a_queued_file_renamed_over_an_object_then_unlinked_leaves_nothing() {
    use bytes::Bytes;
    let mem = Arc::new(MemStore::new());
    mem.put("doc", Bytes::from_static(b"old version"), Default::default()).await.unwrap();
    let dir = staging("replace-unlink");
    let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
    fs.start_write_back();
    fs.lookup(ROOT_INO, "doc").await.unwrap();
    write_file(&fs, "doc.tmp", b"new version").await;
    fs.rename(ROOT_INO, "doc.tmp", ROOT_INO, "doc", false).await.unwrap();
    fs.unlink(ROOT_INO, "doc").await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, Vec::<String>::new(), "the replaced object came back");
    // Renamed away instead of unlinked: the old name goes too. (The old version is written
    // here this time: the root's listing, made for the absent names above, is fresh.)
    write_file(&fs, "doc", b"old version").await;
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "doc").await.unwrap(), b"old version");
    write_file(&fs, "doc.tmp", b"new version").await;
    fs.rename(ROOT_INO, "doc.tmp", ROOT_INO, "doc", false).await.unwrap();
    fs.rename(ROOT_INO, "doc", ROOT_INO, "moved", false).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, vec!["moved".to_string()]);
    assert_eq!(object(mem.as_ref(), "moved").await.unwrap(), b"new version");
}

#[tokio::test]
async fn a_staged_file_moved_with_its_directory_is_read_under_its_new_identity() {
    // GCS and S3 copy a directory's objects: each gets a new identity. A staged file below
    // (uploaded after the move, then kept) must not leave the old one in its node or listing,
    // or its next open pins the old identity and reads fail with ESTALE (model test, gcs).
    let mem = Arc::new(MemStore::new());
    let dir = staging("movedir");
    let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
    fs.start_write_back();
    let d = fs.mkdir(ROOT_INO, "d", None).await.unwrap().ino;
    let (attr, fh) = fs.create(d, "f", 0, None).await.unwrap();
    fs.write(fh, 0, b"hello").await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    fs.rename(ROOT_INO, "d", ROOT_INO, "e", false).await.unwrap();
    assert_eq!(object(mem.as_ref(), "e/f").await, None, "pending: the move sends nothing of it");
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["e/", "e/f"]);
    // A lister walks the moved directory while the staged file is still there.
    let e = fs.lookup(ROOT_INO, "e").await.unwrap().ino;
    let dh = fs.opendir(e).await.unwrap();
    assert!(fs.readdir(dh).unwrap().iter().any(|x| x.name == "f"));
    fs.releasedir(dh);
    // A reader's close drops the clean staged file; the next open reads the store.
    let fh = fs.open(attr.ino, false, false).await.unwrap();
    assert_eq!(&fs.read(fh, 0, 100).await.unwrap()[..], b"hello");
    fs.release(fh).await.unwrap();
    let fh = fs.open(attr.ino, false, false).await.unwrap();
    assert_eq!(&fs.read(fh, 0, 100).await.unwrap()[..], b"hello", "read under the moved object's identity");
    fs.release(fh).await.unwrap();
}

/// A file renamed while the store hangs, its bytes whole in the disk cache: the rename
/// returns at once (the move goes in the background), and so do an open and reads of the
/// new name. They waited for the move's attempts (minutes, with a store that hangs), then
/// failed with `ETIMEDOUT`, for bytes on local disk.
#[tokio::test]
async fn a_renamed_file_whose_bytes_are_cached_opens_while_its_move_hangs() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("rename-cached-hang");
    let held = Arc::new(FailStore::new(mem.clone(), Op::Check, u64::MAX, 0, StoreErrorKind::Other));
    let fs = Fs::new(
        held.clone(),
        FsConfig { disk_cache: Some((dir.join("cache"), 64 << 20)), ..cfg(&dir.join("staging"), 0) },
    );
    fs.set_passthrough(true); // kept whole at its last release
    fs.start_write_back();
    let body: Vec<u8> = (0..3 << 20).map(|i| (i * 7 % 253) as u8).collect();
    let ino = write_file(&fs, "a", &body).await;
    assert!(fs.sync_write_back().await.is_empty());
    let node = fs.node(ino).unwrap();
    let disk = fs.read_cache.disk().unwrap().clone();
    assert!(disk.is_complete("a", &node.identity(), node.size), "not kept whole in the disk cache");
    let copies = held.hold(Op::Copy, u32::MAX);
    fs.rename(ROOT_INO, "a", ROOT_INO, "b", false).await.unwrap();
    let read_back = async {
        let fh = fs.open(ino, false, false).await.unwrap();
        let mut got = Vec::new();
        while got.len() < body.len() {
            got.extend_from_slice(&fs.read(fh, got.len() as u64, 1 << 20).await.unwrap());
        }
        fs.release(fh).await.unwrap();
        got
    };
    let got = tokio::time::timeout(Duration::from_secs(10), read_back).await.expect("the open waited for the move");
    assert!(got == body, "other bytes read");
    // Renamed again before the first move is done (`mv a b; mv b c`): the same.
    fs.rename(ROOT_INO, "b", ROOT_INO, "c", false).await.unwrap();
    let reopened = async {
        let fh = fs.open(ino, false, false).await.unwrap();
        let got = fs.read(fh, 1 << 20, 16).await.unwrap();
        fs.release(fh).await.unwrap();
        got
    };
    let got = tokio::time::timeout(Duration::from_secs(10), reopened).await.expect("the open waited for the moves");
    assert_eq!(got, &body[1 << 20..(1 << 20) + 16]);
    assert_eq!(keys(mem.as_ref()).await, ["a"], "moved while copies were held");
    copies.add_permits(1_000);
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["c"]);
    // Once moved, an open asks the store for the copy's version again, and reads it.
    let fh = fs.open(ino, false, false).await.unwrap();
    assert_eq!(fs.read(fh, 0, 16).await.unwrap(), &body[..16]);
    fs.release(fh).await.unwrap();
    assert!(fs.node(ino).unwrap().version.tag().is_some(), "the copy's tag not learned");
}

/// Renames journaled while the store is out and sent by the next mount never copy over an
/// object another client wrote at the new name meanwhile: theirs stays, and so does the
/// renamed file, under its old name; renamed on (`mv z z2; mv z2 z3`), it moves from there.
/// Before, `mv y y2` replaced the other client's `y2`, and the chain deleted their `z2`.
#[tokio::test]
async fn a_rename_sent_late_leaves_another_clients_object_at_the_new_name() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("late-move-other");
    {
        let down = Arc::new(FailStore::new(mem.clone(), Op::Copy, 1, 1_000_000, StoreErrorKind::Unavailable));
        let fs = Fs::new(down, cfg_ttl0(&dir));
        fs.start_write_back();
        for name in ["y", "z", "w"] {
            write_file(&fs, name, format!("mine {name}").as_bytes()).await;
        }
        assert!(fs.sync_write_back().await.is_empty());
        for (from, to) in [("y", "y2"), ("z", "z2"), ("z2", "z3"), ("w", "w2")] {
            fs.rename(ROOT_INO, from, ROOT_INO, to, false).await.unwrap();
        }
    } // the "crash", the copies never made
    for key in ["y2", "z2"] {
        mem.put(key, format!("another client's {key}").into(), Default::default()).await.unwrap();
    }
    let fs = Fs::new(mem.clone(), cfg_ttl0(&dir));
    fs.start_write_back();
    assert!(fs.sync_write_back().await.is_empty());
    let got = |k: &'static str| {
        let mem = mem.clone();
        async move { object(mem.as_ref(), k).await.map(|b| String::from_utf8(b).unwrap()) }
    };
    assert_eq!(got("y2").await.as_deref(), Some("another client's y2"), "copied over their y2");
    assert_eq!(got("y").await.as_deref(), Some("mine y"), "the renamed file was lost");
    assert_eq!(got("z2").await.as_deref(), Some("another client's z2"), "their z2 replaced or deleted");
    assert_eq!(got("z3").await.as_deref(), Some("mine z"));
    assert_eq!(got("w2").await.as_deref(), Some("mine w"), "a rename nobody raced must still go");
    assert_eq!(keys(mem.as_ref()).await, ["w2", "y", "y2", "z2", "z3"]);
}

/// The same without a crash: the store out at the rename (its first copy fails), back after
/// another client wrote the new name; the retry leaves their object. A target the rename
/// replaced (its version known) is still replaced.
#[tokio::test]
async fn a_rename_retried_after_an_outage_leaves_another_clients_object() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("late-move-retry");
    let down = Arc::new(FailStore::new(mem.clone(), Op::Copy, 1, 2, StoreErrorKind::Unavailable));
    let fs = Fs::new(down.clone(), cfg_ttl0(&dir));
    fs.start_write_back();
    for name in ["a", "b", "old"] {
        write_file(&fs, name, format!("mine {name}").as_bytes()).await;
    }
    assert!(fs.sync_write_back().await.is_empty());
    fs.rename(ROOT_INO, "a", ROOT_INO, "a2", false).await.unwrap();
    fs.rename(ROOT_INO, "b", ROOT_INO, "old", false).await.unwrap(); // replaces our `old`
    while down.calls() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    mem.put("a2", bytes::Bytes::from_static(b"written since"), Default::default()).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "a2").await.unwrap(), b"written since");
    assert_eq!(object(mem.as_ref(), "a").await.unwrap(), b"mine a");
    assert_eq!(object(mem.as_ref(), "old").await.unwrap(), b"mine b");
    assert_eq!(keys(mem.as_ref()).await, ["a", "a2", "old"]);
}

/// As above for a change: an append to a file renamed while the store hangs, and a truncate
/// of another, stage the file from the disk cache and return at once; once the store is
/// back, the moves go first and the changed files replace their copies (tester U: each
/// waited 4 minutes for the move, then failed with ETIMEDOUT).
#[tokio::test]
async fn a_renamed_file_whose_bytes_are_cached_changes_while_its_move_hangs() {
    use crate::fs::SetAttr;
    let mem = Arc::new(MemStore::new());
    let dir = staging("rename-cached-change");
    let held = Arc::new(FailStore::new(mem.clone(), Op::Check, u64::MAX, 0, StoreErrorKind::Other));
    let fs = Fs::new(
        held.clone(),
        FsConfig { disk_cache: Some((dir.join("cache"), 64 << 20)), ..cfg_ttl0(&dir.join("staging")) },
    );
    fs.set_passthrough(true); // kept whole at its last release
    fs.start_write_back();
    let body: Vec<u8> = (0..2 << 20).map(|i| (i * 7 % 253) as u8).collect();
    let (a, t) = (write_file(&fs, "a", &body).await, write_file(&fs, "t", &body).await);
    assert!(fs.sync_write_back().await.is_empty());
    let copies = held.hold(Op::Copy, u32::MAX);
    fs.rename(ROOT_INO, "a", ROOT_INO, "b", false).await.unwrap();
    fs.rename(ROOT_INO, "t", ROOT_INO, "u", false).await.unwrap();
    let change = async {
        // The kernel looks the names up first (every listing is past its TTL here): answered
        // with no request, the names being this mount's own until their moves are done.
        for (name, ino) in [("b", a), ("u", t)] {
            let now = fs.lookup_now(ROOT_INO, name).and_then(|r| r.ok()).map(|attr| attr.ino);
            assert_eq!(now, Some(ino), "{name}: the store was asked for it");
        }
        let fh = fs.open(a, true, false).await.unwrap();
        fs.write(fh, body.len() as u64, b"+more").await.unwrap();
        fs.flush(fh).await.unwrap();
        fs.release(fh).await.unwrap();
        fs.setattr(t, SetAttr { size: Some(2), ..Default::default() }).await.unwrap();
    };
    tokio::time::timeout(Duration::from_secs(10), change).await.expect("the change waited for the move");
    assert_eq!(keys(mem.as_ref()).await, ["a", "t"], "moved while copies were held");
    copies.add_permits(1_000);
    assert!(fs.sync_write_back().await.is_empty());
    let mut want = body.clone();
    want.extend_from_slice(b"+more");
    assert!(object(mem.as_ref(), "b").await.unwrap() == want, "the append is not in the bucket");
    assert_eq!(object(mem.as_ref(), "u").await.unwrap(), &body[..2]);
    assert_eq!(keys(mem.as_ref()).await, ["b", "u"]);
}

/// A chmod of a closed file another client deleted fails with `ENOENT`, as without
/// write-back: its re-upload for the new mode, staged from the disk cache, brought the
/// file back with its old bytes (tester W).
#[tokio::test]
async fn a_chmod_of_a_file_deleted_elsewhere_does_not_bring_it_back() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("chmod-deleted");
    let fs = Fs::new(
        mem.clone(),
        FsConfig { disk_cache: Some((dir.join("cache"), 64 << 20)), ..cfg(&dir.join("staging"), 0) },
    );
    fs.set_passthrough(true); // kept whole at its last release
    fs.start_write_back();
    let ino = write_file(&fs, "f", b"old bytes").await;
    assert!(fs.sync_write_back().await.is_empty());
    mem.delete("f").await.unwrap(); // another client
    let chmod = crate::fs::SetAttr { size: None, mode: Some(0o600), uid: None, gid: None, mtime: None, fh: None };
    assert!(matches!(fs.setattr(ino, chmod).await, Err(crate::FsError::NotFound)));
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, Vec::<String>::new(), "the deleted file came back");
}

/// The same through a handle open for writing and unchanged (`touch` opens the file, then
/// sets its times; fchmod): it brought the file back (tester J). A change made through the
/// handle since (an append) is the writer's, and goes up.
#[tokio::test]
async fn a_touch_through_a_handle_of_a_file_deleted_elsewhere_does_not_bring_it_back() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("touch-deleted");
    let fs = Fs::new(
        mem.clone(),
        FsConfig { disk_cache: Some((dir.join("cache"), 64 << 20)), ..cfg(&dir.join("staging"), 0) },
    );
    fs.set_passthrough(true);
    fs.start_write_back();
    let ino = write_file(&fs, "f", b"old bytes").await;
    assert!(fs.sync_write_back().await.is_empty());
    mem.delete("f").await.unwrap(); // another client
    let fh = fs.open(ino, true, false).await.unwrap();
    let mtime = Some(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(946_684_800));
    let touch = crate::fs::SetAttr { size: None, mode: None, uid: None, gid: None, mtime, fh: Some(fh) };
    assert!(matches!(fs.setattr(ino, touch).await, Err(crate::FsError::NotFound)));
    fs.release(fh).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, Vec::<String>::new(), "the deleted file came back");
}
