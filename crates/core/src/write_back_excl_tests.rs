//! Write-back mode and `O_EXCL` files (create-only uploads): an upload cut off by a rename
//! or unlink, or timed out, may still land, and what lands is the file's own.

use std::sync::Arc;
use std::time::Duration;

use bucketfs_store::testing::{FailStore, MemStore, Op};
use bucketfs_store::{Store, StoreErrorKind};

use super::tests::{cfg, keys, object, over_held_puts, staging};
use crate::fs::{Fs, ROOT_INO};

/// Create `name` in `parent` with `O_EXCL`, write `data` and close it.
async fn create_exclusive(fs: &Fs, parent: u64, name: &str, data: &[u8]) {
    let (_, fh) = fs.create(parent, name, libc::O_EXCL, None).await.unwrap();
    fs.write(fh, 0, data).await.unwrap();
    fs.release(fh).await.unwrap();
}

/// An `O_EXCL` file's first upload hangs after the store took the PUT (it landed); `rm`
/// cancels it. The object that landed is this file's: it is deleted (twice), never left
/// under the removed name (model test: `f1`, unlinked, came back in a directory renamed to
/// its old parent's name).
#[tokio::test]
async fn an_exclusive_create_whose_cancelled_upload_landed_is_gone_after_rm() {
    let (mem, held, fs) = over_held_puts("excl-cancelled", 0);
    let _hang = held.hold(Op::Put, 1);
    create_exclusive(&fs, ROOT_INO, "x", b"created exclusively").await;
    let started = tokio::time::timeout(Duration::from_secs(5), async {
        while object(mem.as_ref(), "x").await.is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    started.await.expect("the PUT reaches the store");
    fs.unlink(ROOT_INO, "x").await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, Vec::<String>::new(), "the landed object of a removed file");
}

/// The kernel's `rm` first tries [`Fs::unlink_now`] (no request). An `O_EXCL` file whose
/// upload timed out, and whose PUT then landed, is not one it may take: the DELETE is due.
#[tokio::test]
async fn rm_of_an_exclusive_create_whose_upload_may_have_landed_sends_the_delete() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("excl-rm-now");
    let flaky = Arc::new(FailStore::new(mem.clone(), Op::Put, 1, 1, StoreErrorKind::Unavailable));
    let fs = Fs::new(flaky, cfg(&dir, 60_000));
    fs.start_write_back();
    create_exclusive(&fs, ROOT_INO, "p", b"pending").await;
    let failed = fs.upload_pub(fs.lookup(ROOT_INO, "p").await.unwrap().ino).await;
    assert!(failed.is_err(), "the first upload fails (a timeout)");
    mem.put("p", bytes::Bytes::from_static(b"pending"), Default::default()).await.unwrap(); // it lands
    match fs.unlink_now(ROOT_INO, "p") {
        Some(r) => r.unwrap(),
        None => fs.unlink(ROOT_INO, "p").await.unwrap(),
    }
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, Vec::<String>::new(), "the landed object of a removed file");
}

/// An `O_EXCL` file's first upload times out without landing, another client then creates
/// the key, and the retry is refused: the key is another writer's, and a rename of our file
/// leaves it alone.
#[tokio::test]
async fn a_refused_retry_of_an_exclusive_create_never_deletes_the_other_object() {
    use bucketfs_store::PutOpts;
    let mem = Arc::new(MemStore::new());
    let dir = staging("excl-refused-retry");
    let flaky = Arc::new(FailStore::new(mem.clone(), Op::Put, 1, 1, StoreErrorKind::Unavailable));
    let fs = Fs::new(flaky, cfg(&dir, 60_000));
    fs.start_write_back();
    create_exclusive(&fs, ROOT_INO, "lock", b"ours").await;
    let ino = fs.lookup(ROOT_INO, "lock").await.unwrap().ino;
    assert!(fs.upload_pub(ino).await.is_err(), "the first upload fails (a timeout)");
    mem.put("lock", bytes::Bytes::from_static(b"theirs"), PutOpts::default()).await.unwrap();
    assert!(matches!(fs.upload_pub(ino).await, Err(crate::FsError::Exists)), "the retry is refused");
    fs.rename(ROOT_INO, "lock", ROOT_INO, "lock.mine", false).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(object(mem.as_ref(), "lock").await.as_deref(), Some(&b"theirs"[..]));
    assert_eq!(object(mem.as_ref(), "lock.mine").await.as_deref(), Some(&b"ours"[..]));
}

/// An `O_EXCL` file's PUT lands while its upload hangs, and `mv` of its directory cancels
/// the upload and moves what landed with the rest: the file goes up over that copy (it is
/// its own), not refused as if another client had made it; `rm` then leaves nothing.
#[tokio::test]
async fn an_exclusive_create_moved_with_its_directory_uploads_over_its_own_copy() {
    let (mem, held, fs) = over_held_puts("excl-dir-move", 0);
    let d = fs.mkdir(ROOT_INO, "d", None).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    let _hang = held.hold(Op::Put, 1);
    create_exclusive(&fs, d.ino, "f", b"created exclusively").await;
    let landed = tokio::time::timeout(Duration::from_secs(5), async {
        while object(mem.as_ref(), "d/f").await.is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    landed.await.expect("the PUT reaches the store");
    fs.rename(ROOT_INO, "d", ROOT_INO, "e", false).await.unwrap();
    assert!(fs.sync_write_back().await.is_empty(), "the upload of e/f was refused by its own copy");
    assert_eq!(keys(mem.as_ref()).await, ["e/", "e/f"]);
    fs.unlink(fs.lookup(ROOT_INO, "e").await.unwrap().ino, "f").await.unwrap();
    assert!(fs.sync_write_back().await.is_empty());
    assert_eq!(keys(mem.as_ref()).await, ["e/"]);
}

/// A mount killed before an `O_EXCL` file's upload: the next mount's recovery uploads it
/// create-only too, so an object another client made meanwhile stays, and the bytes go to
/// `lost+found`. Without another object, the file goes up as usual.
#[tokio::test]
async fn recovery_after_a_crash_keeps_an_exclusive_create_create_only() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("excl-recovered");
    let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
    fs.start_write_back();
    create_exclusive(&fs, ROOT_INO, "taken", b"ours").await;
    create_exclusive(&fs, ROOT_INO, "free", b"ours too").await;
    mem.put("taken", bytes::Bytes::from_static(b"theirs"), Default::default()).await.unwrap();
    // A crash now (`fs` never drops): the next mount of the staging directory.
    let fs2 = Fs::new(mem.clone(), cfg(&dir, 60_000));
    let (done, _) = fs2.recover_staged().await;
    assert_eq!(object(mem.as_ref(), "taken").await.unwrap(), b"theirs", "recovery replaced another client's object");
    assert_eq!(object(mem.as_ref(), "free").await.unwrap(), b"ours too");
    assert_eq!(done, vec!["free".to_string()]);
    let kept: Vec<_> = std::fs::read_dir(dir.join("lost+found")).unwrap().flatten().map(|e| e.path()).collect();
    assert!(kept.iter().any(|p| std::fs::read(p).is_ok_and(|b| b == b"ours")), "the refused bytes are kept: {kept:?}");
    drop((fs, fs2));
}

/// A rename makes an `O_EXCL` file's upload a plain one (a rename replaces its target),
/// and so is the recovery of it after a crash.
#[tokio::test]
async fn recovery_after_a_crash_replaces_the_target_of_a_rename() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("excl-renamed");
    mem.put("target", bytes::Bytes::from_static(b"old"), Default::default()).await.unwrap();
    let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
    fs.start_write_back();
    create_exclusive(&fs, ROOT_INO, "new", b"renamed over").await;
    fs.rename(ROOT_INO, "new", ROOT_INO, "target", false).await.unwrap();
    // The key holds an object again at the crash (the rename's delete, or another client):
    // the renamed file replaces it, as its own upload would have.
    mem.put("target", bytes::Bytes::from_static(b"other"), Default::default()).await.unwrap();
    let fs2 = Fs::new(mem.clone(), cfg(&dir, 60_000));
    let (done, failed) = fs2.recover_staged().await;
    assert_eq!((done, failed), (vec!["target".to_string()], vec![]));
    assert_eq!(object(mem.as_ref(), "target").await.unwrap(), b"renamed over");
    drop((fs, fs2));
}

/// An `O_EXCL` file's create-only upload times out without landing; another client then
/// creates the key; `rm` (or `mv`) of our file follows before any retry. The cut-off
/// upload could only have landed where no object was, and the object there has other
/// bytes: it is the other client's, and stays. (Before, the key was deleted.) In
/// write-back mode and on a durable mount.
#[tokio::test]
async fn a_cut_off_exclusive_create_never_deletes_an_object_made_first_by_another_client() {
    use bucketfs_store::{PutOpts, Store};
    for (rename, write_back) in [(false, true), (true, true), (false, false), (true, false)] {
        let mem = Arc::new(MemStore::new());
        let dir = staging(&format!("excl-made-first-{rename}-{write_back}"));
        let flaky = Arc::new(FailStore::new(mem.clone(), Op::Put, 1, 1, StoreErrorKind::Unavailable));
        let mut config = cfg(&dir, 60_000);
        if !write_back {
            config.write_back = None;
        }
        let fs = Fs::new(flaky, config);
        fs.start_write_back();
        let (_, fh) = fs.create(ROOT_INO, "lock", libc::O_EXCL, None).await.unwrap();
        fs.write(fh, 0, b"ours").await.unwrap();
        let closed = fs.release(fh).await; // a durable mount uploads here
        let ino = fs.lookup(ROOT_INO, "lock").await.unwrap().ino;
        let failed = if write_back { fs.upload_pub(ino).await } else { closed };
        assert!(failed.is_err(), "the first upload fails (a timeout)");
        mem.put("lock", bytes::Bytes::from_static(b"theirs"), PutOpts::default()).await.unwrap();
        match rename {
            false => fs.unlink(ROOT_INO, "lock").await.unwrap(),
            true => fs.rename(ROOT_INO, "lock", ROOT_INO, "lock.mine", false).await.unwrap(),
        }
        assert!(fs.sync_write_back().await.is_empty());
        let case = format!("rename {rename}, write-back {write_back}");
        assert_eq!(object(mem.as_ref(), "lock").await.as_deref(), Some(&b"theirs"[..]), "{case}");
        let mine = object(mem.as_ref(), "lock.mine").await;
        assert_eq!(mine.as_deref(), rename.then_some(&b"ours"[..]), "{case}");
    }
}

/// A durable mount: an `O_EXCL` file's close is refused (another client made the name
/// first), and the rename that would keep our bytes under another name fails in its upload.
/// The file is still create-only under its old name: neither a later upload nor the next
/// mount's recovery replaces the other client's object.
#[tokio::test]
async fn a_failed_rename_of_a_refused_exclusive_create_keeps_it_exclusive() {
    use bucketfs_store::PutOpts;
    for crash in [false, true] {
        let mem = Arc::new(MemStore::new());
        let dir = staging(&format!("excl-rename-fails-{crash}"));
        // PUT 1 is the close's (refused: the key is taken), PUT 2 the rename's upload.
        let flaky = Arc::new(FailStore::new(mem.clone(), Op::Put, 2, 1, StoreErrorKind::Unavailable));
        let mut config = cfg(&dir, 0);
        config.write_back = None;
        let fs = Fs::new(flaky, config);
        let (_, fh) = fs.create(ROOT_INO, "lock", libc::O_EXCL, None).await.unwrap();
        fs.write(fh, 0, b"ours").await.unwrap();
        mem.put("lock", bytes::Bytes::from_static(b"theirs"), PutOpts::default()).await.unwrap();
        assert!(fs.release(fh).await.is_err(), "the close is refused");
        assert!(fs.rename(ROOT_INO, "lock", ROOT_INO, "lock.mine", false).await.is_err(), "the upload failed");
        if crash {
            std::mem::forget(fs);
            let fs = Fs::new(mem.clone(), cfg(&dir, 0));
            let _ = fs.recover_staged().await;
        } else {
            let ino = fs.lookup(ROOT_INO, "lock").await.unwrap().ino;
            assert!(fs.upload_pub(ino).await.is_err(), "a later upload is refused too");
        }
        assert_eq!(object(mem.as_ref(), "lock").await.as_deref(), Some(&b"theirs"[..]), "crash {crash}");
    }
}

/// The tag in the `.excl` sidecar of the one staged file in `dir`: what its create-only
/// tries carry.
fn excl_tag(dir: &std::path::Path) -> u128 {
    let excl = std::fs::read_dir(dir).unwrap().flatten().find(|e| e.path().extension().is_some_and(|x| x == "excl"));
    let text = std::fs::read_to_string(excl.expect("an .excl sidecar").path()).unwrap();
    u128::from_str_radix(text.lines().nth(1).expect("a tag line"), 16).unwrap()
}

/// `mem` takes `data` at `key` as a create-only try tagged `tag` would leave it.
async fn landed(mem: &MemStore, key: &str, data: &'static [u8], tag: Option<u128>) {
    let attrs = bucketfs_store::FileAttrs { created_by: tag, ..Default::default() };
    let opts = bucketfs_store::PutOpts { attrs, ..Default::default() };
    mem.put(key, bytes::Bytes::from_static(data), opts).await.unwrap();
}

/// An `O_EXCL` file's first upload lands but its answer is lost (a timeout); the retry is
/// refused, the key being taken. The object carries the file's own tag: the promise was
/// kept by that try, and later versions go up. Before, every later close failed with
/// `EEXIST` and the unmount put the newest version in lost+found.
#[tokio::test]
async fn an_exclusive_files_own_landed_try_is_known_by_its_tag() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("excl-own-try");
    let flaky = Arc::new(FailStore::new(mem.clone(), Op::Put, 1, 1, StoreErrorKind::Unavailable));
    let fs = Fs::new(flaky, cfg(&dir, 60_000));
    fs.start_write_back();
    create_exclusive(&fs, ROOT_INO, "n", b"v1").await;
    let ino = fs.lookup(ROOT_INO, "n").await.unwrap().ino;
    assert!(fs.upload_pub(ino).await.is_err(), "the first upload times out");
    landed(&mem, "n", b"v1", Some(excl_tag(&dir))).await; // it landed all the same
    let fh = fs.open(ino, true, true).await.unwrap();
    fs.write(fh, 0, b"v2, longer").await.unwrap();
    fs.release(fh).await.unwrap();
    assert_eq!(fs.sync_write_back().await, Vec::<(String, String)>::new());
    assert_eq!(object(mem.as_ref(), "n").await.as_deref(), Some(&b"v2, longer"[..]));
}

/// As above, but the object is another client's with the very bytes of the file's try (an
/// empty lock file, made between our create and our upload): no tag of ours, so it is
/// never replaced (taking it by its MD5 broke `O_EXCL`: both clients held the lock).
#[tokio::test]
async fn another_writers_object_with_the_same_bytes_is_never_taken_for_ours() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("excl-same-bytes");
    let flaky = Arc::new(FailStore::new(mem.clone(), Op::Put, 1, 1, StoreErrorKind::Unavailable));
    let fs = Fs::new(flaky, cfg(&dir, 60_000));
    fs.start_write_back();
    create_exclusive(&fs, ROOT_INO, "lock", b"").await;
    let ino = fs.lookup(ROOT_INO, "lock").await.unwrap().ino;
    assert!(fs.upload_pub(ino).await.is_err(), "the first upload times out (it did not land)");
    landed(&mem, "lock", b"", None).await; // another client's lock, the same (no) bytes
    let r = fs.upload_pub(ino).await;
    assert!(matches!(r, Err(crate::FsError::Exists)), "{r:?}");
    landed(&mem, "lock", b"theirs", None).await; // their lock file goes on being theirs
    assert!(!fs.sync_write_back().await.is_empty(), "sync says it is not uploaded");
    assert_eq!(object(mem.as_ref(), "lock").await.as_deref(), Some(&b"theirs"[..]));
}

/// An `O_EXCL` file's first upload times out after it landed, the file is rewritten and
/// closed, and the mount crashes before the retry. The object carries the tag the `.excl`
/// sidecar names: recovery sends the closed version over it, where it set that version
/// aside in `lost+found` as refused by another writer's object.
#[tokio::test]
async fn recovery_knows_an_exclusive_files_own_landed_try() {
    let mem = Arc::new(MemStore::new());
    let dir = staging("excl-landed-crash");
    let flaky = Arc::new(FailStore::new(mem.clone(), Op::Put, 1, u64::MAX, StoreErrorKind::Unavailable));
    {
        let fs = Fs::new(flaky.clone(), cfg(&dir, 60_000));
        fs.start_write_back();
        create_exclusive(&fs, ROOT_INO, "n", b"v1").await;
        let ino = fs.lookup(ROOT_INO, "n").await.unwrap().ino;
        assert!(fs.upload_pub(ino).await.is_err(), "the first upload times out");
        landed(&mem, "n", b"v1", Some(excl_tag(&dir))).await; // it landed
        let fh = fs.open(ino, true, true).await.unwrap();
        fs.write(fh, 0, b"v2, longer").await.unwrap();
        fs.release(fh).await.unwrap();
        std::mem::forget(fs); // the crash
    }
    let fs = Fs::new(mem.clone(), cfg(&dir, 60_000));
    let (done, failed) = fs.recover_staged().await;
    assert_eq!((done, failed), (vec!["n".to_string()], vec![]));
    assert_eq!(object(mem.as_ref(), "n").await.as_deref(), Some(&b"v2, longer"[..]));
    assert!(!dir.join("lost+found").exists(), "set aside as if another writer's object refused it");
}
