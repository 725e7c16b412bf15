//! Write-path tests of the core against the in-memory store (the proptest model of the
//! write path is `fs_write_model_tests.rs`).

use super::*;
use bucketfs_store::testing::{FailStore, MemStore, Op};
use bucketfs_store::{GetOpts, HeadOpts, PutOpts, StoreErrorKind, StoreExt};
use bytes::Bytes;
use futures::TryStreamExt;
use std::sync::atomic::Ordering;

pub(super) fn cfg() -> FsConfig {
    let dir = std::env::temp_dir().join(format!("bucketfs-core-test-{}", std::process::id()));
    FsConfig { staging_dir: dir, ..FsConfig::default() }
}

pub(super) async fn object(store: &MemStore, key: &str) -> Option<Vec<u8>> {
    let m = store.stat(key).await.ok()?;
    Some(store.get_range(key, 0..m.size, GetOpts::default()).await.unwrap().to_vec())
}

#[tokio::test]
async fn create_write_read_flush_reaches_the_store() {
    let store = Arc::new(MemStore::new());
    let fs = Fs::new(store.clone(), cfg());
    let (attr, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
    let after_create = store.requests.load(Ordering::Relaxed);
    for i in 0..100u64 {
        // git writes 4,107 bytes at a time: each is a local positional write.
        assert_eq!(fs.write(fh, i * 4107, &[i as u8; 4107]).await.unwrap(), 4107);
    }
    assert_eq!(store.requests.load(Ordering::Relaxed), after_create, "writes before close must not touch the store");
    assert_eq!(fs.read(fh, 4107 * 3, 2).await.unwrap()[..], [3, 3]);
    assert_eq!(fs.getattr(attr.ino).await.unwrap().size, 410_700);
    assert!(object(&store, "f").await.is_none(), "not visible before close");
    fs.flush(fh).await.unwrap();
    let data = object(&store, "f").await.unwrap();
    assert_eq!(data.len(), 410_700);
    assert_eq!(data[4107 * 99], 99);
    fs.release(fh).await.unwrap();
    assert!(!fs.staging.contains(attr.ino), "clean staged data is dropped at the last close");
}

#[tokio::test]
async fn a_read_only_o_trunc_empties_the_file_at_its_flush_and_never_without_one() {
    // The kernel may refuse an O_RDONLY|O_TRUNC open after we answered it (ETXTBSY, a
    // running program): it then sends RELEASE without FLUSH, and the file must stay whole.
    let store = Arc::new(MemStore::new());
    store.put("f", Bytes::from_static(b"a program"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), cfg());
    let f = fs.lookup(ROOT_INO, "f").await.unwrap();
    let refused = fs.open(f.ino, false, true).await.unwrap();
    fs.release(refused).await.unwrap();
    assert_eq!(object(&store, "f").await.unwrap(), b"a program", "a refused open emptied the file");
    assert_eq!(fs.getattr(f.ino).await.unwrap().size, 9);
    let fh = fs.open(f.ino, false, true).await.unwrap();
    fs.flush(fh).await.unwrap();
    assert_eq!(object(&store, "f").await.unwrap(), b"", "emptied at close, as on Linux");
    assert_eq!(fs.getattr(f.ino).await.unwrap().size, 0);
    fs.flush(fh).await.unwrap(); // a second close (a dup'ed descriptor) changes nothing
    fs.release(fh).await.unwrap();
    assert!(!fs.staging.contains(f.ino));
}

#[tokio::test]
async fn a_late_release_never_publishes_the_next_writers_unfinished_rewrite() {
    // The kernel's RELEASE of a closed handle can arrive after the next open(O_TRUNC).
    let store = Arc::new(MemStore::new());
    let fs = Fs::new(store.clone(), cfg());
    let (attr, a) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
    fs.write(a, 0, b"first version").await.unwrap();
    fs.flush(a).await.unwrap();
    let b = fs.open(attr.ino, true, true).await.unwrap(); // O_TRUNC: staged file now empty
    fs.release(a).await.unwrap();
    assert_eq!(object(&store, "f").await.unwrap(), b"first version", "release of A published B's empty file");
    fs.write(b, 0, b"second").await.unwrap();
    fs.flush(b).await.unwrap();
    assert_eq!(object(&store, "f").await.unwrap(), b"second");
    // A reader's close does not publish a writer's unfinished bytes either.
    let w = fs.open(attr.ino, true, true).await.unwrap();
    let r = fs.open(attr.ino, false, false).await.unwrap();
    fs.flush(r).await.unwrap();
    fs.release(r).await.unwrap();
    assert_eq!(object(&store, "f").await.unwrap(), b"second");
    fs.write(w, 0, b"third").await.unwrap();
    fs.release(w).await.unwrap();
    assert_eq!(object(&store, "f").await.unwrap(), b"third", "the last close publishes");
}

#[tokio::test]
async fn reading_back_what_was_written_needs_no_request() {
    let store = Arc::new(MemStore::new());
    let fs = Fs::new(store.clone(), cfg());
    let (attr, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
    let body: Vec<u8> = (0..3_000_000u32).map(|i| (i % 249) as u8).collect();
    fs.write(fh, 0, &body).await.unwrap();
    fs.release(fh).await.unwrap();
    read_back_with_no_request(&fs, &store, attr.ino, &body).await;
}

/// Open `ino` and read it whole: `body`, served by the write-through caches (no request).
async fn read_back_with_no_request(fs: &Fs, store: &MemStore, ino: u64, body: &[u8]) {
    let before = store.requests.load(Ordering::Relaxed);
    let fh = fs.open(ino, false, false).await.unwrap();
    let mut got = Vec::new();
    while got.len() < body.len() {
        let piece = fs.read(fh, got.len() as u64, 1 << 20).await.unwrap();
        if piece.is_empty() {
            break; // short: the comparison below says so
        }
        got.extend_from_slice(&piece);
    }
    assert_eq!(got, body);
    assert_eq!(store.requests.load(Ordering::Relaxed), before, "write-through cache serves the read-back");
}

#[tokio::test]
async fn an_fsyncing_appender_fills_the_caches_once_at_its_close() {
    // Each fsync copied the whole file into the block caches: quadratic in an appender's
    // size (57% of its fsync CPU). The staged file serves reads while it is open.
    let store = Arc::new(MemStore::new());
    let fs = Fs::new(store.clone(), cfg());
    let (attr, fh) = fs.create(ROOT_INO, "log", 0, None).await.unwrap();
    let chunk: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let mut body = Vec::new();
    for _ in 0..5 {
        fs.write(fh, body.len() as u64, &chunk).await.unwrap();
        body.extend_from_slice(&chunk);
        fs.fsync(fh).await.unwrap();
        assert_eq!(object(&store, "log").await.unwrap(), body, "fsync is durable");
    }
    assert_eq!(fs.read_cache.cached_bytes(), 0, "an fsync copied the open file into the block cache");
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    assert!(fs.read_cache.cached_bytes() >= body.len() as u64, "the close wrote the last version through");
    read_back_with_no_request(&fs, &store, attr.ino, &body).await;
}

#[tokio::test]
async fn an_empty_new_file_is_uploaded_and_listed() {
    let store = Arc::new(MemStore::new());
    let fs = Fs::new(store.clone(), cfg());
    let (_, fh) = fs.create(ROOT_INO, "empty", 0, None).await.unwrap();
    let dh = fs.opendir(ROOT_INO).await.unwrap();
    assert!(fs.readdir(dh).unwrap().iter().any(|e| e.name == "empty"), "listed before upload");
    fs.release(fh).await.unwrap();
    assert_eq!(object(&store, "empty").await.unwrap(), Vec::<u8>::new());
}

#[tokio::test]
async fn overwrite_in_the_middle_keeps_the_rest() {
    let store = Arc::new(MemStore::new());
    store.put("f", Bytes::from_static(b"0123456789"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), cfg());
    let f = fs.lookup(ROOT_INO, "f").await.unwrap();
    let fh = fs.open(f.ino, true, false).await.unwrap();
    fs.write(fh, 3, b"ab").await.unwrap();
    fs.write(fh, 12, b"Z").await.unwrap(); // past the end: a hole of zeros
    fs.release(fh).await.unwrap();
    assert_eq!(object(&store, "f").await.unwrap(), b"012ab56789\0\0Z");
}

#[tokio::test]
async fn a_reader_opened_before_a_write_sees_the_new_bytes() {
    let store = Arc::new(MemStore::new());
    store.put("f", Bytes::from_static(b"old old"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), cfg());
    let f = fs.lookup(ROOT_INO, "f").await.unwrap();
    let reader = fs.open(f.ino, false, false).await.unwrap();
    let writer = fs.open(f.ino, true, true).await.unwrap();
    fs.write(writer, 0, b"new").await.unwrap();
    assert_eq!(&fs.read(reader, 0, 10).await.unwrap()[..], b"new", "before upload");
    fs.release(writer).await.unwrap();
    assert_eq!(&fs.read(reader, 0, 10).await.unwrap()[..], b"new", "after upload");
}

#[tokio::test]
async fn a_failed_upload_is_reported_and_retried_never_dropped() {
    let mem = Arc::new(MemStore::new());
    let store = Arc::new(FailStore::new(mem.clone(), Op::Put, 1, 2, StoreErrorKind::Unavailable));
    let fs = Fs::new(store, cfg());
    let (attr, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
    fs.write(fh, 0, b"precious").await.unwrap();
    assert!(matches!(fs.flush(fh).await, Err(FsError::UploadFailed(_))));
    assert_eq!(FsError::UploadFailed(Box::new(FsError::Local(String::new()))).errno(), libc::EIO);
    assert!(fs.release(fh).await.is_err(), "second attempt fails too");
    assert!(fs.staging.contains(attr.ino), "data kept after failed uploads");
    assert_eq!(fs.sync_all().await, Vec::<String>::new(), "third attempt (unmount) succeeds");
    assert_eq!(object(&mem, "f").await.unwrap(), b"precious");
}

/// A create the staging disk cannot take (full, or here a file where its directory should
/// be) fails and leaves no name: before, the name stayed with size 0 and an O_EXCL create
/// of it again failed with EEXIST (tester P, a full staging tmpfs).
#[tokio::test]
async fn a_create_that_cannot_stage_leaves_no_name() {
    let store = Arc::new(MemStore::new());
    let dir = std::env::temp_dir().join(format!("bucketfs-core-nostage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::write(&dir, b"not a directory").unwrap();
    let fs = Fs::new(store.clone(), FsConfig { staging_dir: dir.clone(), ..FsConfig::default() });
    assert!(fs.create(ROOT_INO, "f", libc::O_EXCL, None).await.is_err());
    assert!(matches!(fs.lookup(ROOT_INO, "f").await, Err(FsError::NotFound)), "the failed create's name stayed");
    let dh = fs.opendir(ROOT_INO).await.unwrap();
    let listed: Vec<String> = fs.readdir(dh).unwrap().iter().map(|e| e.name.clone()).collect();
    fs.releasedir(dh);
    assert_eq!(listed, [".", ".."]);
    std::fs::remove_file(&dir).unwrap();
    let (_, fh) = fs.create(ROOT_INO, "f", libc::O_EXCL, None).await.expect("the name was left taken");
    fs.write(fh, 0, b"x").await.unwrap();
    fs.release(fh).await.unwrap();
    assert_eq!(object(&store, "f").await.unwrap(), b"x");
    fs.check_invariants();
    let _ = std::fs::remove_dir_all(&dir);
}

/// O_EXCL create, then another writer makes the object before our close: the close fails
/// with EEXIST, their object is untouched, and our bytes stay readable here (staged); a
/// rename then puts them under another name.
#[tokio::test]
async fn an_exclusive_create_never_replaces_an_object_made_meanwhile() {
    let store = Arc::new(MemStore::new());
    let fs = Fs::new(store.clone(), cfg());
    let (attr, fh) = fs.create(ROOT_INO, "lock", libc::O_EXCL, None).await.unwrap();
    fs.write(fh, 0, b"ours").await.unwrap();
    store.put("lock", Bytes::from_static(b"theirs"), PutOpts::default()).await.unwrap();
    let e = fs.flush(fh).await.unwrap_err();
    assert_eq!(e.errno(), libc::EEXIST, "{e}");
    assert_eq!(object(&store, "lock").await.unwrap(), b"theirs", "their object untouched");
    assert_eq!(&fs.read(fh, 0, 100).await.unwrap()[..], b"ours", "our bytes kept");
    assert_eq!(fs.release(fh).await.unwrap_err().errno(), libc::EEXIST, "still not replaced");
    assert!(fs.staging.contains(attr.ino), "data kept after the refused upload");
    // A reader of the file afterwards (`cat lock`): its close retries the upload, which
    // is refused again, and is not its failure to report.
    let reader = fs.open(attr.ino, false, false).await.unwrap();
    assert_eq!(&fs.read(reader, 0, 100).await.unwrap()[..], b"ours");
    fs.flush(reader).await.expect("a reader's close never fails for another's upload");
    // Its fsync does: it asks for the file's bytes in the bucket, whoever wrote them.
    let e = fs.fsync(reader).await.expect_err("fsync returned 0, the bytes not in the bucket");
    assert_eq!(e.errno(), libc::EIO, "{e}");
    fs.release(reader).await.unwrap();
    assert_eq!(object(&store, "lock").await.unwrap(), b"theirs", "still theirs");
    fs.rename(ROOT_INO, "lock", ROOT_INO, "lock.mine", false).await.unwrap();
    assert_eq!(object(&store, "lock.mine").await.unwrap(), b"ours");
    assert_eq!(object(&store, "lock").await.unwrap(), b"theirs");
    // Without O_EXCL (or when nobody raced) the create goes up as before.
    let (_, fh) = fs.create(ROOT_INO, "free", libc::O_EXCL, None).await.unwrap();
    fs.write(fh, 0, b"x").await.unwrap();
    fs.release(fh).await.unwrap();
    assert_eq!(object(&store, "free").await.unwrap(), b"x");
}

#[tokio::test]
async fn staged_data_survives_a_crash_and_is_uploaded_by_the_next_mount() {
    let mem = Arc::new(MemStore::new());
    let dir = std::env::temp_dir().join(format!("bucketfs-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    {
        // Every upload fails; then the process "dies" (the Fs is dropped without unmount).
        let failing = Arc::new(FailStore::new(mem.clone(), Op::Put, 1, 1000, StoreErrorKind::Unavailable));
        let fs = Fs::new(failing, FsConfig { staging_dir: dir.clone(), ..cfg() });
        let d = fs.mkdir(ROOT_INO, "d", None).await.unwrap();
        let (_, fh) = fs.create(d.ino, "precious", 0, None).await.unwrap();
        fs.write(fh, 0, b"do not lose me").await.unwrap();
        assert!(fs.flush(fh).await.is_err());
        let (_, fh2) = fs.create(ROOT_INO, "clean", 0, None).await.unwrap();
        fs.release(fh2).await.unwrap_err();
    }
    assert!(object(&mem, "d/precious").await.is_none());
    // What a crash may leave beside no data: sidecars whose data went, a sidecar's temporary.
    for orphan in ["9-1-2.key", "9-1-3.open", "7-1-2.key.tmp", "7-1-2.open.tmp"] {
        std::fs::write(dir.join(orphan), "d/old").unwrap();
    }
    let fs = Fs::new(mem.clone(), FsConfig { staging_dir: dir.clone(), ..cfg() });
    let (done, failed) = fs.recover_staged().await;
    assert!(failed.is_empty(), "{failed:?}");
    assert!(done.contains(&"d/precious".to_string()), "{done:?}");
    assert_eq!(object(&mem, "d/precious").await.unwrap(), b"do not lose me");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "recovered files and orphans are removed: {left:?}");
    assert!(object(&mem, "d/old").await.is_none(), "an orphan sidecar uploads nothing");
}

#[tokio::test]
async fn large_sequential_writes_upload_eagerly_in_parts() {
    let mem = Arc::new(MemStore::new());
    let mut c = cfg();
    c.write = bucketfs_store::WriteOptions { part_size: 64 * 1024, concurrency: 2, ..Default::default() };
    let fs = Fs::new(mem.clone(), c);
    let (_, fh) = fs.create(ROOT_INO, "big", 0, None).await.unwrap();
    let chunk = vec![7u8; 10_000];
    for i in 0..100u64 {
        fs.write(fh, i * 10_000, &chunk).await.unwrap();
    }
    fs.release(fh).await.unwrap();
    assert_eq!(object(&mem, "big").await.unwrap().len(), 1_000_000);
}

#[tokio::test]
async fn namespace_changes() {
    let store = Arc::new(MemStore::new());
    store.put("d/a", Bytes::from_static(b"A"), PutOpts::default()).await.unwrap();
    store.put("d/sub/b", Bytes::from_static(b"B"), PutOpts::default()).await.unwrap();
    store.put("x", Bytes::from_static(b"X"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), cfg());
    // mkdir persists an empty directory as a marker.
    let m = fs.mkdir(ROOT_INO, "m", None).await.unwrap();
    assert_eq!(m.kind, Kind::Dir);
    assert!(object(&store, "m/").await.is_some());
    assert!(matches!(fs.mkdir(ROOT_INO, "m", None).await, Err(FsError::Exists)));
    // rmdir refuses a non-empty directory.
    assert!(matches!(fs.rmdir(ROOT_INO, "d").await, Err(FsError::NotEmpty)));
    fs.rmdir(ROOT_INO, "m").await.unwrap();
    assert!(object(&store, "m/").await.is_none());
    // rename a file over another, then a populated directory.
    fs.rename(ROOT_INO, "x", ROOT_INO, "y", false).await.unwrap();
    assert_eq!(object(&store, "y").await.unwrap(), b"X");
    assert!(object(&store, "x").await.is_none());
    let d = fs.lookup(ROOT_INO, "d").await.unwrap();
    fs.rename(ROOT_INO, "d", ROOT_INO, "e", false).await.unwrap();
    assert_eq!(object(&store, "e/a").await.unwrap(), b"A");
    assert_eq!(object(&store, "e/sub/b").await.unwrap(), b"B");
    assert!(object(&store, "d/a").await.is_none());
    assert_eq!(fs.lookup(ROOT_INO, "e").await.unwrap().ino, d.ino, "the inode moves with the name");
    let sub = fs.lookup(d.ino, "sub").await.unwrap();
    let b = fs.lookup(sub.ino, "b").await.unwrap();
    let fh = fs.open(b.ino, false, false).await.unwrap();
    assert_eq!(&fs.read(fh, 0, 5).await.unwrap()[..], b"B", "children read from their new keys");
    assert!(matches!(fs.rename(ROOT_INO, "e", d.ino, "inside", false).await, Err(FsError::InvalidName)));
    assert!(matches!(fs.rename(ROOT_INO, "y", ROOT_INO, "e", true).await, Err(FsError::Exists)));
    fs.unlink(ROOT_INO, "y").await.unwrap();
    assert!(matches!(fs.lookup(ROOT_INO, "y").await, Err(FsError::NotFound)));
    assert!(matches!(fs.unlink(ROOT_INO, "e").await, Err(FsError::IsDir)));
}

#[tokio::test]
async fn directory_rename_past_the_bound_is_exdev() {
    let store = Arc::new(MemStore::new());
    for i in 0..5 {
        store.put(&format!("d/{i}"), Bytes::from_static(b"1"), PutOpts::default()).await.unwrap();
    }
    let fs = Fs::new(store.clone(), FsConfig { max_rename_keys: 3, ..cfg() });
    let e = fs.rename(ROOT_INO, "d", ROOT_INO, "e", false).await.unwrap_err();
    assert_eq!(e.errno(), libc::EXDEV);
    assert!(object(&store, "d/4").await.is_some(), "nothing moved");
}

#[tokio::test]
async fn a_directory_holding_a_key_with_no_file_name_is_not_renamed_half_way() {
    let store = Arc::new(MemStore::new());
    for k in ["d/a", "d/z", "d//hidden", "d/sub/../up"] {
        store.put(k, Bytes::from_static(b"1"), PutOpts::default()).await.unwrap();
    }
    let fs = Fs::new(store.clone(), cfg());
    let e = fs.rename(ROOT_INO, "d", ROOT_INO, "e", false).await.unwrap_err();
    assert_eq!(e.errno(), libc::EXDEV, "mv then moves what it sees");
    let mut keys: Vec<String> = store.list("", true).map_ok(|m| m.key).try_collect().await.unwrap();
    keys.sort();
    assert_eq!(keys, ["d//hidden", "d/a", "d/sub/../up", "d/z"], "nothing copied, nothing deleted");
    // Emptied of what it shows, it is still not empty: the hidden keys are never deleted.
    let d = fs.lookup(ROOT_INO, "d").await.unwrap();
    fs.unlink(d.ino, "a").await.unwrap();
    fs.unlink(d.ino, "z").await.unwrap();
    assert!(matches!(fs.rmdir(ROOT_INO, "d").await, Err(FsError::NotEmpty)));
    assert!(object(&store, "d//hidden").await.is_some());
}

/// Where the store moves in one request (Drive), a rename keeps the object itself (its
/// ETag: no copy), a directory of any size moves at once, and a file changed since its
/// upload sends its new bytes before it moves.
#[tokio::test]
async fn a_store_that_moves_keeps_the_object_through_a_rename() {
    let store = Arc::new(MemStore::new().with_moves());
    for i in 0..5 {
        store.put(&format!("d/{i}"), Bytes::from_static(b"1"), PutOpts::default()).await.unwrap();
    }
    store.put("f", Bytes::from_static(b"F"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), FsConfig { max_rename_keys: 3, ..cfg() });
    let etag = store.stat("f").await.unwrap().etag;
    let f = fs.lookup(ROOT_INO, "f").await.unwrap();
    let rfh = fs.open(f.ino, false, false).await.unwrap();
    fs.rename(ROOT_INO, "f", ROOT_INO, "g", false).await.unwrap();
    assert_eq!(store.stat("g").await.unwrap().etag, etag, "moved, not copied");
    assert!(object(&store, "f").await.is_none());
    assert_eq!(&fs.read(rfh, 0, 5).await.unwrap()[..], b"F", "a reader open across the rename");
    fs.release(rfh).await.unwrap();
    // Past max_rename_keys, which bounds copies only.
    fs.rename(ROOT_INO, "d", ROOT_INO, "e", false).await.unwrap();
    assert_eq!(object(&store, "e/4").await.unwrap(), b"1");
    assert!(object(&store, "d/4").await.is_none());
    // Written, uploaded, written again, renamed while open: the new bytes arrive under the
    // new name in the same object.
    let (w, fh) = fs.create(ROOT_INO, "w", 0, None).await.unwrap();
    fs.write(fh, 0, b"one").await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.write(fh, 0, b"two").await.unwrap();
    fs.rename(ROOT_INO, "w", ROOT_INO, "v", false).await.unwrap();
    let uploaded = store.stat("v").await.unwrap().etag;
    assert_eq!(object(&store, "v").await.unwrap(), b"two");
    assert!(object(&store, "w").await.is_none());
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    assert_eq!(store.stat("v").await.unwrap().etag, uploaded, "nothing left to send at close");
    assert_eq!(fs.lookup(ROOT_INO, "v").await.unwrap().ino, w.ino);
    // Over an existing file: replaced.
    fs.rename(ROOT_INO, "v", ROOT_INO, "g", false).await.unwrap();
    assert_eq!(object(&store, "g").await.unwrap(), b"two");
    assert!(object(&store, "v").await.is_none());
}

#[tokio::test]
async fn truncate_by_path_uploads_at_once() {
    let store = Arc::new(MemStore::new());
    store.put("f", Bytes::from_static(b"0123456789"), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), cfg());
    let f = fs.lookup(ROOT_INO, "f").await.unwrap();
    assert_eq!(fs.setattr(f.ino, SetAttr { size: Some(4), ..Default::default() }).await.unwrap().size, 4);
    assert_eq!(object(&store, "f").await.unwrap(), b"0123");
    let a = fs.setattr(f.ino, SetAttr { mode: Some(0o100600), uid: Some(5), ..Default::default() }).await.unwrap();
    assert_eq!((a.perm, a.uid), (0o600, 5));
}

#[tokio::test]
async fn mode_owner_and_mtime_persist_as_object_metadata() {
    let store = Arc::new(MemStore::new());
    let fs = Fs::new(store.clone(), cfg());
    let (attr, fh) = fs.create(ROOT_INO, "run.sh", 0, Some(0o750)).await.unwrap();
    fs.write(fh, 0, b"#!/bin/sh\n").await.unwrap();
    fs.release(fh).await.unwrap();
    let a = store.head("run.sh", HeadOpts::default()).await.unwrap().attrs;
    assert_eq!(a.mode, Some(0o100750), "mode given at create goes up with the first upload");
    // After close: chmod, chown and utime (tar -x, cp -p, rsync -a) upload the file again.
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    fs.setattr(
        attr.ino,
        SetAttr { mode: Some(0o700), uid: Some(123), gid: Some(456), mtime: Some(when), ..Default::default() },
    )
    .await
    .unwrap();
    let a = store.head("run.sh", HeadOpts::default()).await.unwrap().attrs;
    assert_eq!((a.mode, a.uid, a.gid, a.mtime), (Some(0o100700), Some(123), Some(456), Some(when)));
    assert_eq!(object(&store, "run.sh").await.unwrap(), b"#!/bin/sh\n", "bytes unchanged");
    // Another mount sees them.
    let other = Fs::new(store.clone(), cfg());
    let seen = other.lookup(ROOT_INO, "run.sh").await.unwrap();
    assert_eq!((seen.perm, seen.uid, seen.gid, seen.mtime), (0o700, 123, 456, when));
    // Setting the same values again costs nothing.
    let before = store.requests.load(Ordering::Relaxed);
    fs.setattr(attr.ino, SetAttr { mode: Some(0o700), ..Default::default() }).await.unwrap();
    assert_eq!(store.requests.load(Ordering::Relaxed), before);
}

/// A file opened for writing with passthrough and not written keeps the mtime the mount
/// showed, and a chmod's upload carries that mtime (tester W: sqlite's read-only `O_RDWR`
/// open showed the file changed now; after a remount a chmod'ed file showed the chmod's).
#[tokio::test]
async fn an_open_for_writing_and_a_chmod_keep_the_objects_mtime() {
    let mem = Arc::new(MemStore::new());
    mem.put("f", Bytes::from_static(b"data"), PutOpts::default()).await.unwrap();
    let dir = std::env::temp_dir().join(format!("bucketfs-keep-mtime-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fs = Fs::new(mem.clone(), FsConfig { staging_dir: dir, ..cfg() });
    let ino = fs.lookup(ROOT_INO, "f").await.unwrap().ino;
    let shown = fs.getattr(ino).await.unwrap().mtime;
    let fh = fs.open(ino, true, false).await.unwrap();
    let backing = fs.backing_file(fh).await.unwrap();
    fs.note_passthrough_open(fh);
    assert_eq!(fs.getattr(ino).await.unwrap().mtime, shown, "an open with no write moved the mtime");
    fs.flush(fh).await.unwrap();
    drop(backing); // the kernel's file goes at the close
    fs.release(fh).await.unwrap();
    let chmod = SetAttr { size: None, mode: Some(0o600), uid: None, gid: None, mtime: None, fh: None };
    fs.setattr(ino, chmod).await.unwrap();
    let head = mem.head("f", HeadOpts::default()).await.unwrap();
    assert_eq!((head.attrs.mode, head.attrs.mtime), (Some(0o100600), Some(shown)), "{head:?}");
}

/// The kernel writes a passthrough file without us: the core learns of it from the file.
#[tokio::test]
async fn writes_the_kernel_made_directly_are_seen_and_uploaded() {
    use std::os::unix::fs::FileExt;
    let mem = Arc::new(MemStore::new());
    let dir = std::env::temp_dir().join(format!("bucketfs-unseen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fs = Fs::new(mem.clone(), FsConfig { staging_dir: dir.clone(), ..cfg() });
    let (attr, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
    fs.write(fh, 0, b"0123456789").await.unwrap();
    let backing = fs.backing_file(fh).await.unwrap();
    fs.note_passthrough_open(fh);
    backing.file.write_all_at(b"kernel", 10).unwrap(); // as the kernel would
    assert_eq!(fs.getattr(attr.ino).await.unwrap().size, 16, "stat must show the file's size");
    fs.flush(fh).await.unwrap();
    assert_eq!(object(&mem, "f").await.unwrap(), b"0123456789kernel");
    // Same size, other bytes: only the mtime tells.
    backing.file.write_all_at(b"K", 10).unwrap();
    fs.flush(fh).await.unwrap();
    assert_eq!(object(&mem, "f").await.unwrap(), b"0123456789Kernel", "an in-place change was missed");
    // A crash now: recovery uploads the file as committed at the last flush...
    let fs2 = Fs::new(mem.clone(), FsConfig { staging_dir: dir.clone(), ..cfg() });
    mem.delete("f").await.unwrap();
    let (done, _) = fs2.recover_staged().await;
    assert_eq!(done, vec!["f".to_string()]);
    assert_eq!(object(&mem, "f").await.unwrap(), b"0123456789Kernel");
    // ... but never bytes changed after it that nobody closed (set aside instead).
    let fs = Fs::new(mem.clone(), FsConfig { staging_dir: dir.clone(), ..cfg() });
    let (_, fh) = fs.create(ROOT_INO, "g", 0, None).await.unwrap();
    fs.write(fh, 0, b"closed").await.unwrap();
    let backing = fs.backing_file(fh).await.unwrap();
    fs.note_passthrough_open(fh);
    fs.flush(fh).await.unwrap();
    backing.file.write_all_at(b"torn", 0).unwrap();
    mem.delete("g").await.unwrap();
    let fs3 = Fs::new(mem.clone(), FsConfig { staging_dir: dir.clone(), ..cfg() });
    let (done, _) = fs3.recover_staged().await;
    assert!(!done.contains(&"g".to_string()), "uploaded a version nobody closed: {done:?}");
    assert!(object(&mem, "g").await.is_none());
    assert!(dir.join("lost+found").exists(), "the unclosed bytes were not kept");
    drop(fs);
}

/// A clean file the kernel wrote leaves staging at its last close, while a task (the
/// eager-upload feeder) still holds it: a rename or unlink right after no longer finds it,
/// so its crash-recovery sidecars must already be gone. They were not: a crash then
/// uploaded the file under its old name again (both names in the bucket after `mv`, and an
/// `rm`'d file back).
#[tokio::test]
async fn a_clean_file_out_of_staging_is_never_recovered_under_its_old_name() {
    use std::os::unix::fs::FileExt;
    let mem = Arc::new(MemStore::new());
    let dir = std::env::temp_dir().join(format!("bucketfs-leave-clean-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fs = Fs::new(mem.clone(), FsConfig { staging_dir: dir.clone(), ..cfg() });
    for name in ["moved", "removed"] {
        let (_, fh) = fs.create(ROOT_INO, name, 0, None).await.unwrap();
        let backing = fs.backing_file(fh).await.unwrap();
        fs.note_passthrough_open(fh);
        backing.file.write_all_at(b"kernel bytes", 0).unwrap(); // as the kernel would
        fs.flush(fh).await.unwrap();
        drop(backing); // the kernel lets go of it before the RELEASE
        fs.release(fh).await.unwrap();
        assert!(!fs.staging.contains(fs.lookup(ROOT_INO, name).await.unwrap().ino), "clean and closed: out of staging");
    }
    // Before the feeder's next tick (200 ms) lets go of them:
    fs.rename(ROOT_INO, "moved", ROOT_INO, "moved2", false).await.unwrap();
    fs.unlink(ROOT_INO, "removed").await.unwrap();
    // A crash now: the next mount of the staging directory recovers nothing.
    let fs2 = Fs::new(mem.clone(), FsConfig { staging_dir: dir.clone(), ..cfg() });
    let (done, failed) = fs2.recover_staged().await;
    assert!(done.is_empty() && failed.is_empty(), "recovered {done:?} (failed {failed:?})");
    assert!(object(&mem, "moved").await.is_none(), "the old name came back");
    assert!(object(&mem, "removed").await.is_none(), "the removed file came back");
    assert_eq!(object(&mem, "moved2").await.unwrap(), b"kernel bytes");
    drop((fs, fs2));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A mapping that outlives a file's handles is watched (`Fs::linger`); a reader's open and
/// close meanwhile end that watch and start another, and once the mapping goes the staged
/// file goes too. (A watch's end was recorded after the staged lock: a close just then found
/// the watch still listed and started none, and the file stayed staged for good, its
/// sidecars left in the staging directory; concurrency test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapped_file_leaves_staging_after_readers_come_and_go() {
    let mem = Arc::new(MemStore::new());
    let dir = std::env::temp_dir().join(format!("bucketfs-linger-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fs = Fs::new(mem.clone(), FsConfig { staging_dir: dir.clone(), ..cfg() });
    let (attr, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
    fs.write(fh, 0, b"mapped bytes").await.unwrap();
    let backing = fs.backing_file(fh).await.unwrap();
    fs.note_passthrough_open(fh);
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap(); // the kernel's file still open: a mapping
    assert!(fs.staging.contains(attr.ino), "dropped while mapped");
    for _ in 0..3 {
        let r = fs.open(attr.ino, false, false).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await; // a look finds the handle: the watch ends
        fs.release(r).await.unwrap(); // still mapped: watched again
    }
    drop(backing); // the mapping goes
    let gone = async {
        while fs.staging.contains(attr.ino) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), gone).await.expect("still staged with nothing open or mapped");
    assert_eq!(object(&mem, "f").await.unwrap(), b"mapped bytes");
    assert!(!dir.join("lost+found").exists());
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A durable mount renames a file the kernel is still writing (open, changed since its
/// last upload): its bytes go up under the new name, and its sidecar, which stays while
/// the kernel may still write, names the new key. A crash then never brings the old
/// name back.
#[tokio::test]
async fn a_renamed_file_the_kernel_writes_is_never_recovered_under_its_old_name() {
    use std::os::unix::fs::FileExt;
    let mem = Arc::new(MemStore::new());
    let dir = std::env::temp_dir().join(format!("bucketfs-rename-watched-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fs = Fs::new(mem.clone(), FsConfig { staging_dir: dir.clone(), ..cfg() });
    let (_, fh) = fs.create(ROOT_INO, "a", 0, None).await.unwrap();
    let backing = fs.backing_file(fh).await.unwrap();
    fs.note_passthrough_open(fh);
    backing.file.write_all_at(b"kernel bytes", 0).unwrap(); // as the kernel would
    fs.rename(ROOT_INO, "a", ROOT_INO, "b", false).await.unwrap();
    assert_eq!(object(&mem, "b").await.unwrap(), b"kernel bytes");
    std::mem::forget(fs); // a crash, with the file still open
    let fs2 = Fs::new(mem.clone(), FsConfig { staging_dir: dir.clone(), ..cfg() });
    let _ = fs2.recover_staged().await;
    assert!(object(&mem, "a").await.is_none(), "the old name came back");
    assert_eq!(object(&mem, "b").await.unwrap(), b"kernel bytes");
    drop(fs2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file the kernel wrote (passthrough) is fed to an eager upload every 200 ms while it
/// grows; a tick after the close's upload must not start the whole file again (it did:
/// a 256 MiB `cp` was sent twice, and its release held the file for a second).
#[tokio::test]
async fn a_file_uploaded_at_close_is_not_fed_again() {
    use std::os::unix::fs::FileExt;
    let mem = Arc::new(MemStore::new());
    let dir = std::env::temp_dir().join(format!("bucketfs-refeed-{}", std::process::id()));
    let fs = Fs::new(mem.clone(), FsConfig { staging_dir: dir.clone(), ..cfg() });
    let part = fs.cfg.write.part_size;
    let (_, fh) = fs.create(ROOT_INO, "big", 0, None).await.unwrap();
    let backing = fs.backing_file(fh).await.unwrap();
    fs.note_passthrough_open(fh);
    let body: Vec<u8> = (0..3 * part).map(|i| (i % 251) as u8).collect();
    backing.file.write_all_at(&body[..part], 0).unwrap();
    tokio::time::sleep(Duration::from_millis(450)).await; // the feeder saw it grow
    backing.file.write_all_at(&body[part..], part as u64).unwrap();
    fs.flush(fh).await.unwrap();
    assert_eq!(object(&mem, "big").await.unwrap(), body);
    let after_close = mem.requests.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(650)).await; // three more ticks
    assert_eq!(mem.requests.load(Ordering::Relaxed), after_close, "an unchanged file was sent again");
    fs.release(fh).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A mount with passthrough on and a disk cache under a fresh temporary directory.
fn passthrough_with_disk_cache(name: &str) -> (Arc<MemStore>, std::path::PathBuf, Arc<Fs>) {
    passthrough_with_disk_cache_on(name, MemStore::new())
}

/// [`passthrough_with_disk_cache`] of `store`.
fn passthrough_with_disk_cache_on(name: &str, store: MemStore) -> (Arc<MemStore>, std::path::PathBuf, Arc<Fs>) {
    let mem = Arc::new(store);
    let dir = std::env::temp_dir().join(format!("bucketfs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fs = Fs::new(
        mem.clone(),
        FsConfig { staging_dir: dir.join("staging"), disk_cache: Some((dir.join("cache"), 64 << 20)), ..cfg() },
    );
    fs.set_passthrough(true);
    (mem, dir, fs)
}

fn all_of(file: &std::fs::File) -> Vec<u8> {
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut &*file, &mut got).unwrap();
    got
}

/// Reading back what was just written: the last release hands the staged file (exactly the
/// version uploaded) to the disk cache, and the next open passes through to it with no
/// download.
#[tokio::test]
async fn a_file_just_written_is_read_back_from_local_disk() {
    let (mem, dir, fs) = passthrough_with_disk_cache("keepwhole");
    let body: Vec<u8> = (0..3 << 20).map(|i| (i * 7 % 253) as u8).collect();
    let (attr, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
    fs.write(fh, 0, &body).await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    let staged_left = std::fs::read_dir(dir.join("staging")).unwrap().count();
    assert_eq!(staged_left, 0, "the staged file moved, nothing left behind");
    let node = fs.node(attr.ino).unwrap();
    assert!(
        fs.read_cache.disk().unwrap().is_complete("f", &node.identity(), node.size),
        "kept as the whole file at release"
    );
    assert_eq!(fs.read_cache.cached_bytes(), 0, "kept whole, yet also copied into the block caches");
    let before = mem.requests.load(Ordering::Relaxed);
    let fh = fs.open(attr.ino, false, false).await.unwrap();
    let backing = fs.backing_file(fh).await.expect("passes through to the kept file");
    let got = all_of(&backing.file);
    assert!(got == body, "the kept file holds other bytes");
    assert_eq!(mem.requests.load(Ordering::Relaxed), before, "no download");
    fs.release(fh).await.unwrap();
    // A version changed since is never served from it.
    let (_, fh) = fs.create(ROOT_INO, "f", libc::O_TRUNC, None).await.unwrap();
    fs.write(fh, 0, b"new").await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    let fh = fs.open(attr.ino, false, false).await.unwrap();
    assert_eq!(fs.read(fh, 0, 100).await.unwrap(), &b"new"[..]);
    fs.release(fh).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file kept for reading back, then rewritten with O_TRUNC while a handle reads the kept
/// version through the store: that handle keeps its version until the writer's close (the
/// emptied staged file is a new one, not the kept file taken over), and the new version
/// reads back from local disk.
#[tokio::test]
async fn an_o_trunc_rewrite_of_a_kept_file_leaves_its_readers_their_version() {
    let (_mem, dir, fs) = passthrough_with_disk_cache("keepwhole-trunc");
    let v1: Vec<u8> = (0..2 << 20).map(|i| (i * 7 % 253) as u8).collect();
    let v2: Vec<u8> = (0..2 << 20).map(|i| (i * 5 % 251) as u8).collect();
    let (attr, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
    fs.write(fh, 0, &v1).await.unwrap();
    fs.release(fh).await.unwrap();
    let reader = fs.open(attr.ino, false, false).await.unwrap(); // reads through the daemon
    let w = fs.open(attr.ino, true, true).await.unwrap();
    assert!(fs.read(reader, 0, 4096).await.unwrap()[..] == v1[..4096], "the reader's version, not the emptied file");
    fs.write(w, 0, &v2).await.unwrap();
    fs.release(w).await.unwrap();
    // Its close shows the new version to every handle of this mount (read your writes).
    assert!(fs.read(reader, 1 << 20, 4096).await.unwrap()[..] == v2[1 << 20..(1 << 20) + 4096]);
    fs.release(reader).await.unwrap();
    let fh = fs.open(attr.ino, false, false).await.unwrap();
    let backing = fs.backing_file(fh).await.expect("the new version passes through to its kept file");
    let got = all_of(&backing.file);
    assert!(got == v2, "the kept file holds other bytes");
    fs.release(fh).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two handles read one file; a rename gives them one reader (`Fs::replace_readers`). The
/// close of one ended that reader's fetches ahead (to fill the disk cache), and a read of
/// the other waiting on one of them failed with EIO ("the reader is gone").
#[tokio::test]
async fn closing_one_reader_leaves_another_reading_the_same_file() {
    let (mem, dir, fs) =
        passthrough_with_disk_cache_on("sharedreader", MemStore::new().with_latency(Duration::from_millis(300)));
    let body: Vec<u8> = (0..8 << 20).map(|i| (i * 7 % 253) as u8).collect();
    mem.put("f", Bytes::from(body.clone()), PutOpts::default()).await.unwrap();
    let attr = fs.lookup(ROOT_INO, "f").await.unwrap();
    let (one, two) = (fs.open(attr.ino, false, false).await.unwrap(), fs.open(attr.ino, false, false).await.unwrap());
    assert_eq!(fs.read(one, 0, 4096).await.unwrap()[..], body[..4096]);
    fs.rename(ROOT_INO, "f", ROOT_INO, "g", false).await.unwrap();
    {
        let (a, b) = (fs.open_file(one).unwrap(), fs.open_file(two).unwrap());
        assert!(Arc::ptr_eq(&a.reader.lock().unwrap(), &b.reader.lock().unwrap()), "one reader");
    }
    // `two` streams: its window fetches the blocks ahead of it.
    assert!(fs.read(two, 0, 1 << 20).await.unwrap()[..] == body[..1 << 20]);
    assert!(fs.read(two, 1 << 20, 1 << 20).await.unwrap()[..] == body[1 << 20..2 << 20]);
    let reading = {
        let fs = fs.clone();
        tokio::spawn(async move { fs.read(two, 4 << 20, 4096).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await; // its block's GET is on its way
    fs.release(one).await.unwrap();
    let got = reading.await.unwrap().expect("a read through the other handle failed");
    assert!(got[..] == body[4 << 20..(4 << 20) + 4096]);
    fs.release(two).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_file_only_read_after_its_writer_closed_is_the_stores_until_changed_again() {
    // Settled (`Fs::settle_readers`): another client's version may then split it off while
    // the reader goes on reading these bytes. A chmod makes it the mount's own again: its
    // upload at the reader's close must not follow such a split.
    let store = Arc::new(MemStore::new());
    let fs = Fs::new(store.clone(), cfg());
    let (attr, w) = fs.create(ROOT_INO, "f", 0o644, None).await.unwrap();
    fs.write(w, 0, b"written here").await.unwrap();
    let r = fs.open(attr.ino, false, false).await.unwrap();
    assert!(fs.staging.contains(attr.ino), "the reader joined the staged file");
    fs.flush(w).await.unwrap();
    fs.release(w).await.unwrap();
    assert!(fs.staging.contains(attr.ino) && !fs.staging.owns(attr.ino), "only read now: settled");
    assert!(!fs.node(attr.ino).unwrap().local);
    fs.setattr(attr.ino, SetAttr { mode: Some(0o600), ..Default::default() }).await.unwrap();
    assert!(fs.staging.owns(attr.ino), "changed by chmod: the mount's own again");
    assert!(fs.node(attr.ino).unwrap().local);
    assert_eq!(fs.read(r, 0, 12).await.unwrap()[..], b"written here"[..]);
    fs.release(r).await.unwrap();
    assert!(!fs.staging.contains(attr.ino), "dropped at the last close");
    assert_eq!(object(&store, "f").await.unwrap(), b"written here");
}

/// Without write-back, a rename whose copy took the target's name but whose delete of the
/// source failed answers an error; the target's writer closes after it. Its unsaved bytes
/// must not go up over the copy: the source's bytes, perhaps under no other name now (a
/// delete that timed out may have landed). Before the copy, a failure keeps them.
#[tokio::test]
async fn a_rename_failing_after_its_copy_never_uploads_the_targets_bytes_over_it() {
    for delete_fails in [false, true] {
        let mem = Arc::new(MemStore::new());
        mem.put("a", Bytes::from_static(b"source"), PutOpts::default()).await.unwrap();
        mem.put("b", Bytes::from_static(b"old"), PutOpts::default()).await.unwrap();
        // Either the delete of the source or the copy itself fails.
        let op = if delete_fails { Op::Delete } else { Op::Copy };
        let fs = Fs::new(Arc::new(FailStore::new(mem.clone(), op, 1, u64::MAX, StoreErrorKind::Other)), cfg());
        let b = fs.lookup(ROOT_INO, "b").await.unwrap().ino;
        let fh = fs.open(b, true, false).await.unwrap();
        fs.write(fh, 0, b"unsaved").await.unwrap();
        assert!(fs.rename(ROOT_INO, "a", ROOT_INO, "b", false).await.is_err(), "{op:?} fails");
        let _ = fs.flush(fh).await;
        fs.release(fh).await.unwrap();
        let want: &[u8] = if delete_fails { b"source" } else { b"unsaved" };
        assert_eq!(object(&mem, "b").await.as_deref(), Some(want), "{op:?} failed");
    }
}
