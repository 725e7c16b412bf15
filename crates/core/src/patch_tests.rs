//! Uploads that send only what changed (write_patch.rs), against the in-memory store made to
//! patch as S3 does: what reaches the store, and that the object is always the file's bytes
//! (a model test of writes, truncates, fsyncs and another client's uploads). Unit tests use
//! 4 KiB blocks ([`crate::write::patch::BLOCK`]).

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
    assert_eq!(store.patch_sent.load(Relaxed), crate::write::patch::BLOCK, "one block sent");
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

#[tokio::test]
async fn a_long_append_run_never_reaches_the_component_limit() {
    // GCS composes each append; a composite may have 1,024 components. The mount counts
    // them and uploads whole before the limit, so the store never refuses.
    let store = Arc::new(MemStore::new().with_patches());
    let fs = Fs::new(store.clone(), cfg());
    let (_, fh) = fs.create(ROOT_INO, "events", 0, None).await.unwrap();
    let mut want = pattern(6 * crate::write::patch::BLOCK as usize, 2);
    fs.write(fh, 0, &want).await.unwrap();
    fs.fsync(fh).await.unwrap();
    for i in 0..2500u32 {
        let chunk = i.to_le_bytes();
        fs.write(fh, want.len() as u64, &chunk).await.unwrap();
        want.extend_from_slice(&chunk);
        fs.fsync(fh).await.unwrap();
    }
    assert_eq!(store.patch_refused.load(Relaxed), 0, "the store refused a compose");
    assert!(store.patch_sent.load(Relaxed) >= 9000, "appends were composed");
    assert_eq!(object(&store, "events").await, want);
    fs.release(fh).await.unwrap();
}

#[derive(Debug, Clone)]
enum Step {
    Write {
        at: u64,
        len: usize,
        seed: u8,
    },
    Append {
        len: usize,
        seed: u8,
    },
    Truncate(u64),
    Fsync,
    /// Another client uploads its own version.
    Replace(u8),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    const B: u64 = crate::write::patch::BLOCK;
    prop_oneof![
        2 => (0..12 * B, 1..3 * B as usize, any::<u8>()).prop_map(|(at, len, seed)| Step::Write { at, len, seed }),
        3 => (1..2 * B as usize, any::<u8>()).prop_map(|(len, seed)| Step::Append { len, seed }),
        1 => (0..12 * B).prop_map(Step::Truncate),
        4 => Just(Step::Fsync),
        1 => Just(Step::Replace(7)),
    ]
}

/// Where two byte strings first differ, for a readable failure.
fn same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        panic!("{what}: {} bytes, want {}; first difference at {at}", got.len(), want.len());
    }
}

/// After every fsync the object is exactly the file; at the end, fewer bytes were sent than
/// whole uploads would have.
async fn run_model(steps: Vec<Step>) {
    let store = Arc::new(MemStore::new().with_patches());
    let fs = Fs::new(store.clone(), cfg());
    let (attr, fh) = fs.create(ROOT_INO, "m", 0, None).await.unwrap();
    let mut want = pattern(8 * crate::write::patch::BLOCK as usize, 1);
    fs.write(fh, 0, &want).await.unwrap();
    fs.fsync(fh).await.unwrap();
    // Another client's version, while this file has not changed since (an fsync of an
    // unchanged file uploads nothing: the other version stays, the last upload won).
    let (mut theirs, mut dirty): (Option<Vec<u8>>, bool) = (None, false);
    for s in steps {
        if !matches!(s, Step::Fsync | Step::Replace(_)) {
            dirty = true;
        }
        match s {
            Step::Write { at, len, seed } => {
                let data = pattern(len, seed);
                fs.write(fh, at, &data).await.unwrap();
                let end = at as usize + len;
                if want.len() < end {
                    want.resize(end, 0);
                }
                want[at as usize..end].copy_from_slice(&data);
            }
            Step::Append { len, seed } => {
                let data = pattern(len, seed);
                fs.write(fh, want.len() as u64, &data).await.unwrap();
                want.extend_from_slice(&data);
            }
            Step::Truncate(n) => {
                fs.setattr(attr.ino, SetAttr { size: Some(n), fh: Some(fh), ..Default::default() }).await.unwrap();
                want.resize(n as usize, 0);
            }
            Step::Fsync => {
                fs.fsync(fh).await.unwrap();
                if std::mem::take(&mut dirty) {
                    theirs = None;
                }
                same(&object(&store, "m").await, theirs.as_ref().unwrap_or(&want), "the object after an fsync");
            }
            Step::Replace(seed) => {
                let other = pattern(9 * crate::write::patch::BLOCK as usize, seed);
                store.put("m", Bytes::from(other.clone()), PutOpts::default()).await.unwrap();
                theirs = Some(other);
            }
        }
    }
    fs.fsync(fh).await.unwrap();
    if dirty {
        theirs = None;
    }
    same(&object(&store, "m").await, theirs.as_ref().unwrap_or(&want), "the object at the end");
    fs.release(fh).await.unwrap();
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
    #[test]
    fn the_object_is_the_file_after_every_fsync(steps in proptest::collection::vec(step(), 1..40)) {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(run_model(steps));
    }
}
