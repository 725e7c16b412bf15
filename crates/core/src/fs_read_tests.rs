//! A handle whose version another client replaced before the handle returned anything
//! reads the new version (`fs_read.rs`); one that returned bytes, or shares the file with
//! another handle, gets `ESTALE` and never a mix of two versions.

use super::*;
use bucketfs_store::testing::MemStore;
use bucketfs_store::PutOpts;
use bytes::Bytes;

/// A mount of `old` at `f` (listed, never read) whose object another client then
/// replaces with `new`; the TTL is long, so an open does not ask the store again.
async fn replaced(old: &[u8], new: &[u8]) -> (Arc<MemStore>, Arc<Fs>, u64) {
    let store = Arc::new(MemStore::new());
    store.put("f", Bytes::copy_from_slice(old), PutOpts::default()).await.unwrap();
    let dir = std::env::temp_dir().join(format!("bucketfs-read-test-{}", std::process::id()));
    let cfg =
        FsConfig { staging_dir: dir, metadata_ttl: Duration::from_secs(300), cache_bytes: 0, ..FsConfig::default() };
    let fs = Fs::new(store.clone(), cfg);
    let f = fs.lookup(ROOT_INO, "f").await.unwrap().ino;
    store.put("f", Bytes::copy_from_slice(new), PutOpts::default()).await.unwrap();
    (store, fs, f)
}

/// The inodes whose kernel attributes the mount dropped.
fn watch_attrs(fs: &Fs) -> Arc<Mutex<Vec<u64>>> {
    let dropped = Arc::new(Mutex::new(Vec::new()));
    let seen = dropped.clone();
    fs.on_attrs_change(Arc::new(move |ino| seen.lock().unwrap().push(ino)));
    dropped
}

#[tokio::test]
async fn a_handle_that_read_nothing_reads_the_new_version() {
    for new in [&b"version-2, longer"[..], b"version-2"] {
        let (_store, fs, f) = replaced(b"version-1", new).await;
        let dropped = watch_attrs(&fs);
        let fh = fs.open(f, false, false).await.unwrap();
        assert_eq!(&fs.read(fh, 0, 4).await.unwrap()[..], &new[..4], "the first read, of part of the file");
        assert_eq!(&fs.read(fh, 0, 100).await.unwrap()[..], new);
        let attr = fs.getattr(f).await.unwrap();
        assert_eq!((attr.ino, attr.size), (f, new.len() as u64), "the same inode, the new size");
        assert_eq!(fs.lookup(ROOT_INO, "f").await.unwrap().ino, f, "not split off");
        let longer = new.len() > 9;
        assert_eq!(*dropped.lock().unwrap(), if longer { vec![f] } else { vec![] }, "kernel size dropped if longer");
        fs.release(fh).await.unwrap();
        fs.check_invariants();
    }
}

#[tokio::test]
async fn a_shorter_version_is_taken_only_by_a_read_of_the_whole_old_one() {
    // The kernel lowers its size from the first short read to end: of several in flight,
    // the others then read zeros. One read of all of the old version is the only one.
    let (_store, fs, f) = replaced(b"version-1, long", b"v2").await;
    let fh = fs.open(f, false, false).await.unwrap();
    assert!(matches!(fs.read(fh, 4, 4).await, Err(FsError::Stale(_))), "a read of part of the old version");
    fs.release(fh).await.unwrap();
    let (_store, fs, f) = replaced(b"version-1, long", b"v2").await;
    let fh = fs.open(f, false, false).await.unwrap();
    assert_eq!(&fs.read(fh, 0, 4096).await.unwrap()[..], b"v2");
    fs.release(fh).await.unwrap();
}

#[tokio::test]
async fn a_handle_that_returned_bytes_keeps_its_version() {
    let store = Arc::new(MemStore::new());
    let old: Vec<u8> = (0..3 * 2048 * 1024u32).map(|i| (i % 251) as u8).collect();
    store.put("f", Bytes::from(old.clone()), PutOpts::default()).await.unwrap();
    let dir = std::env::temp_dir().join(format!("bucketfs-read-test-{}", std::process::id()));
    let cfg =
        FsConfig { staging_dir: dir, metadata_ttl: Duration::from_secs(300), cache_bytes: 0, ..FsConfig::default() };
    let fs = Fs::new(store.clone(), cfg);
    let f = fs.lookup(ROOT_INO, "f").await.unwrap().ino;
    let fh = fs.open(f, false, false).await.unwrap();
    assert_eq!(fs.read(fh, 0, 4096).await.unwrap()[..], old[..4096]);
    store.put("f", Bytes::from(vec![9u8; old.len() * 2]), PutOpts::default()).await.unwrap();
    // Past what the first block fetched: the old version's bytes are gone.
    assert!(matches!(fs.read(fh, 5 * 1024 * 1024, 4096).await, Err(FsError::Stale(_))), "ESTALE, never a mix");
    assert_eq!(fs.getattr(f).await.unwrap().size, old.len() as u64, "the handle's own size");
    let now = fs.lookup(ROOT_INO, "f").await.unwrap();
    assert_ne!(now.ino, f, "the new version is a new inode");
    fs.release(fh).await.unwrap();
    fs.check_invariants();
}

#[tokio::test]
async fn a_handle_beside_another_keeps_its_version() {
    // The other handle's reads may fill the kernel's pages of the inode with old bytes.
    let (_store, fs, f) = replaced(b"version-1", b"version-2, longer").await;
    let a = fs.open(f, false, false).await.unwrap();
    let b = fs.open(f, false, false).await.unwrap();
    assert!(matches!(fs.read(a, 0, 100).await, Err(FsError::Stale(_))));
    assert!(matches!(fs.read(b, 0, 100).await, Err(FsError::Stale(_))));
    fs.release(a).await.unwrap();
    fs.release(b).await.unwrap();
    let now = fs.lookup(ROOT_INO, "f").await.unwrap();
    let fh = fs.open(now.ino, false, false).await.unwrap();
    assert_eq!(&fs.read(fh, 0, 100).await.unwrap()[..], b"version-2, longer", "the next open reads it");
    fs.release(fh).await.unwrap();
}

#[tokio::test]
async fn concurrent_first_reads_move_on_together() {
    // The kernel's readahead: several reads of one handle in flight, all failing at once;
    // every one returns the new version's bytes.
    let new: Vec<u8> = (0..4 * 2048 * 1024u32).map(|i| (i % 241) as u8).collect();
    let (_store, fs, f) = replaced(&vec![1u8; 2 * 2048 * 1024], &new).await;
    let fh = fs.open(f, false, false).await.unwrap();
    let block = 1024 * 1024u64;
    let reads = (0..4).map(|i| fs.read(fh, i * block, block as u32));
    for (i, got) in futures::future::join_all(reads).await.into_iter().enumerate() {
        let at = i * block as usize;
        assert!(got.unwrap()[..] == new[at..at + block as usize], "read {i}");
    }
    fs.release(fh).await.unwrap();
}
