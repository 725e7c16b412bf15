//! Uploads that send only what changed (write_patch.rs), against the in-memory store made to
//! patch as S3 does: what reaches the store, and that the object is always the file's bytes.

use super::*;
use bucketfs_store::testing::MemStore;
use bucketfs_store::{GetOpts, PutOpts, StoreExt};
use bytes::Bytes;
use std::sync::atomic::Ordering::Relaxed;

const M: usize = 1024 * 1024;

fn cfg() -> FsConfig {
    let dir = std::env::temp_dir().join(format!("bucketfs-patch-fs-test-{}", std::process::id()));
    FsConfig { staging_dir: dir, ..FsConfig::default() }
}

async fn object(store: &MemStore, key: &str) -> Vec<u8> {
    let m = store.stat(key).await.unwrap();
    store.get_range(key, 0..m.size, GetOpts::default()).await.unwrap().to_vec()
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect()
}

#[tokio::test]
async fn an_appender_that_fsyncs_sends_only_what_it_appended() {
    let store = Arc::new(MemStore::new().with_patches());
    let fs = Fs::new(store.clone(), cfg());
    let (attr, fh) = fs.create(ROOT_INO, "log", 0, None).await.unwrap();
    let mut want = pattern(8 * M, 1);
    fs.write(fh, 0, &want).await.unwrap();
    fs.fsync(fh).await.unwrap();
    assert_eq!(store.patch_sent.load(Relaxed), 0, "the first upload is whole");
    for i in 0..20u8 {
        let chunk = pattern(16384 + i as usize, i);
        fs.write(fh, want.len() as u64, &chunk).await.unwrap();
        want.extend_from_slice(&chunk);
        fs.fsync(fh).await.unwrap();
        assert_eq!(object(&store, "log").await, want, "after fsync {i}");
    }
    let appended = (want.len() - 8 * M) as u64;
    assert_eq!(store.patch_sent.load(Relaxed), appended, "each fsync sent its appended bytes only");
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    assert_eq!(object(&store, "log").await, want);
    assert_eq!(fs.getattr(attr.ino).await.unwrap().size, want.len() as u64);
}

#[tokio::test]
async fn an_edit_of_a_file_opened_from_the_bucket_sends_its_block() {
    let store = Arc::new(MemStore::new().with_patches());
    let mut want = pattern(20 * M + 123, 7);
    store.put("db", Bytes::from(want.clone()), PutOpts::default()).await.unwrap();
    let fs = Fs::new(store.clone(), cfg());
    let f = fs.lookup(ROOT_INO, "db").await.unwrap();
    let fh = fs.open(f.ino, true, false).await.unwrap();
    fs.write(fh, 10 * M as u64 + 5, b"X").await.unwrap();
    want[10 * M + 5] = b'X';
    fs.flush(fh).await.unwrap();
    assert_eq!(object(&store, "db").await, want);
    assert_eq!(store.patch_sent.load(Relaxed), M as u64, "one block sent");
    // A truncation and a write past the old end, then close.
    let size = Some(15 * M as u64 + 9);
    fs.setattr(f.ino, SetAttr { size, fh: Some(fh), ..Default::default() }).await.unwrap();
    want.truncate(15 * M + 9);
    fs.write(fh, 16 * M as u64, b"tail").await.unwrap();
    want.resize(16 * M, 0);
    want.extend_from_slice(b"tail");
    fs.flush(fh).await.unwrap();
    fs.release(fh).await.unwrap();
    assert_eq!(object(&store, "db").await, want);
    assert!(store.patch_sent.load(Relaxed) < 3 * M as u64, "sent {}", store.patch_sent.load(Relaxed));
}

#[tokio::test]
async fn another_writers_version_is_never_patched() {
    let store = Arc::new(MemStore::new().with_patches());
    let fs = Fs::new(store.clone(), cfg());
    let (_, fh) = fs.create(ROOT_INO, "f", 0, None).await.unwrap();
    let mut want = pattern(6 * M, 3);
    fs.write(fh, 0, &want).await.unwrap();
    fs.fsync(fh).await.unwrap();
    // Another client replaces the object; our next fsync must not keep its bytes.
    store.put("f", Bytes::from(pattern(6 * M, 99)), PutOpts::default()).await.unwrap();
    fs.write(fh, want.len() as u64, b"mine").await.unwrap();
    want.extend_from_slice(b"mine");
    fs.fsync(fh).await.unwrap();
    assert_eq!(object(&store, "f").await, want, "the last upload wins, whole");
    fs.release(fh).await.unwrap();
}
