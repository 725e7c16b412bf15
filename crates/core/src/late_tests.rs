//! The late-landing watch through [`Fs`] on a durable mount: a try of an upload that the
//! store sent twice (it timed out, and went again) lands after what followed it.

use std::sync::Arc;

use bucketfs_store::testing::{FailStore, MemStore, Op};
use bucketfs_store::{FileAttrs, GetOpts, PutOpts, Store, StoreErrorKind, StoreExt};
use bytes::Bytes;

use crate::fs::{Fs, FsConfig, ROOT_INO};

fn durable(name: &str) -> FsConfig {
    let dir = std::env::temp_dir().join(format!("bucketfs-late-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    FsConfig { staging_dir: dir, ..FsConfig::default() }
}

async fn object(store: &MemStore, key: &str) -> Option<Vec<u8>> {
    let m = store.stat(key).await.ok()?;
    Some(store.get_range(key, 0..m.size, GetOpts::default()).await.unwrap().to_vec())
}

/// What an upload of ours would have left under `key`: its bytes, with a file's mtime.
async fn lands_late(store: &MemStore, key: &str, data: &'static [u8]) {
    let attrs = FileAttrs { mtime: Some(std::time::SystemTime::now()), ..Default::default() };
    store.put(key, Bytes::from_static(data), PutOpts { attrs, ..Default::default() }).await.unwrap();
}

async fn write(fs: &Fs, fh: u64, data: &[u8]) {
    fs.write(fh, 0, data).await.unwrap();
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
}

/// A durable mount (staging under `label`) whose first upload of "older" to `f` is sent
/// twice: its first try cut off, as by a timeout, and retried. (the bucket, the store the
/// mount talks to, the mount, f's inode)
async fn older_sent_twice(label: &str) -> (Arc<MemStore>, Arc<FailStore>, Arc<Fs>, u64) {
    let mem = Arc::new(MemStore::new());
    let store = Arc::new(FailStore::new(mem.clone(), Op::Put, u64::MAX, 0, StoreErrorKind::Unavailable));
    let fs = Fs::new(store.clone(), durable(label));
    store.cut_tries_before(1);
    let (attr, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
    write(&fs, fh, b"older").await;
    (mem, store, fs, attr.ino)
}

/// Tester G's GCS case (a PUT retried after 45 s of latency): the first try of "older"
/// lands after the close of "newer", or after the name was removed. `sync` (or the watch,
/// in its own time) puts "newer" back, and deletes the name again.
#[tokio::test]
async fn a_try_sent_twice_that_lands_later_is_undone_on_a_durable_mount() {
    let (mem, store, fs, ino) = older_sent_twice("twice").await;
    assert!(fs.staging.contains(ino), "kept while the key is watched: it may go up again");
    write(&fs, fs.open(ino, true, true).await.unwrap(), b"newer").await;
    assert_eq!(object(&mem, "f").await.unwrap(), b"newer");
    lands_late(&mem, "f", b"older").await;
    assert!(fs.sync_closed().await.is_empty());
    assert_eq!(object(&mem, "f").await.unwrap(), b"newer", "the newer close's version is back");

    store.cut_tries_before(1);
    let (_, fh) = fs.create(ROOT_INO, "g", 0, None).await.unwrap();
    write(&fs, fh, b"removed").await;
    fs.unlink(ROOT_INO, "g").await.unwrap();
    lands_late(&mem, "g", b"removed").await;
    assert!(fs.sync_closed().await.is_empty());
    assert_eq!(object(&mem, "g").await, None, "a removed name never comes back");

    // Another client's object is never touched, even with the bytes of ours that were cut.
    mem.put("f", Bytes::from_static(b"older"), Default::default()).await.unwrap();
    assert!(fs.sync_closed().await.is_empty());
    assert_eq!(object(&mem, "f").await.unwrap(), b"older");
}

/// An upload no try of which was cut off leaves nothing watched, and nothing staged.
#[tokio::test]
async fn an_upload_sent_once_leaves_nothing_watched() {
    let mem = Arc::new(MemStore::new());
    let fs = Fs::new(mem.clone(), durable("once"));
    let (attr, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
    write(&fs, fh, b"only").await;
    assert!(fs.late.all().is_empty());
    assert!(!fs.staging.contains(attr.ino));
}

/// A late landing found while a writer has the file open and changed: the version closed
/// before goes up again at once, from its copy kept aside, not at the writer's close
/// (tester K: the older bytes stayed until then, and for good after a crash); the close's
/// upload then sends the writer's bytes.
#[tokio::test]
async fn a_late_landing_under_an_open_writer_is_undone_before_its_close() {
    let (mem, _, fs, ino) = older_sent_twice("stuck").await;
    write(&fs, fs.open(ino, true, true).await.unwrap(), b"newer").await;
    let w = fs.open(ino, true, false).await.unwrap();
    fs.write(w, 0, b"NEWEST").await.unwrap();
    lands_late(&mem, "f", b"older").await;
    assert!(fs.sync_closed().await.is_empty(), "the closed version is not back in the bucket");
    assert_eq!(object(&mem, "f").await.unwrap(), b"newer");
    assert_eq!(fs.read(w, 0, 10).await.unwrap().as_ref(), b"NEWEST", "the writer's bytes are not shown");
    fs.flush(w).await.unwrap();
    fs.release(w).await.unwrap();
    assert!(fs.sync_closed().await.is_empty());
    assert_eq!(object(&mem, "f").await.unwrap(), b"NEWEST");
}
