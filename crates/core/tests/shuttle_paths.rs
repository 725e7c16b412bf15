//! Model checking the read path and the staging area with shuttle (the namespace is in
//! model.rs). Needs `--features shuttle`: the core's locks, atomics and spawned tasks are
//! then shuttle's (src/sync.rs), so a task may be preempted at each of them.
//!
//! - Read path: readers of one open file (one [`FileReader`], as the kernel's concurrent
//!   readahead requests are) and of another handle sharing the block cache, with a prefetch
//!   budget smaller than what they would all fetch: every read returns the object's bytes,
//!   and nothing waits forever.
//! - Staging area: an open racing the last close of a staged file (which drops it), and
//!   two writers flushing one file: a write is never lost to a staged file dropped under it,
//!   and a flush returns only once the store holds the writes made before it (`dirty` is
//!   cleared only by an upload that began after the last write). And a rename racing a
//!   writer's close, then a crash: the next mount's recovery leaves one name, the new one.
//!
//! Run: `cargo test --release -p bucketfs-core --features shuttle --test shuttle_paths`.

use std::sync::Arc;

use bucketfs_core::read::{FileReader, ReadCache, BLOCK};
use bucketfs_core::{Fs, FsConfig, ROOT_INO};
use bucketfs_store::testing::MemStore;
use bucketfs_store::{GetOpts, PutOpts, Store, StoreExt};
use bytes::Bytes;
use futures::StreamExt;
use shuttle::future::{block_on, spawn};

mod common;
use common::YieldStore;

/// Reads a task makes, in order: (offset, length).
type Reads = Vec<(u64, u32)>;

/// Random schedules per test: a few hundred, a few seconds each.
const SCHEDULES: usize = 300;

fn body(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8 ^ (i / 4096) as u8).collect()
}

fn mem_with(key: &str, data: &[u8]) -> Arc<MemStore> {
    let mem = Arc::new(MemStore::new());
    futures::executor::block_on(mem.put(key, Bytes::copy_from_slice(data), PutOpts::default())).unwrap();
    mem
}

async fn object(mem: &MemStore, key: &str) -> Vec<u8> {
    let len = mem.stat(key).await.unwrap().size;
    mem.get_range(key, 0..len, GetOpts::default()).await.unwrap().to_vec()
}

#[test]
fn readers_sharing_a_file_and_the_block_cache_get_its_bytes() {
    let size = (3 * BLOCK + 1000) as usize;
    let data = Arc::new(body(size));
    shuttle::check_random(
        move || {
            let data = data.clone();
            block_on(async move {
                let store: Arc<dyn Store> = Arc::new(YieldStore(mem_with("f", &data)));
                // Room to prefetch two blocks: the readers' prefetches compete for it.
                let cache = Arc::new(ReadCache::new(2 * BLOCK, 2 * BLOCK));
                let reader = || {
                    let (s, c) = (store.clone(), cache.clone());
                    Arc::new(FileReader::new(s, c, "f".into(), None, "v1".into(), size as u64, 4 * BLOCK))
                };
                let (one, other) = (reader(), reader());
                let mib = 1024 * 1024;
                // Sequential 1 MiB reads (the kernel's readahead), an odd-sized random
                // reader on the same handle, and a second handle reading sequentially.
                let plans: Vec<(Arc<FileReader>, Reads)> = vec![
                    (one.clone(), (0..size as u64).step_by(mib).map(|o| (o, mib as u32)).collect()),
                    (one.clone(), vec![(size as u64 - 100, 4096), (BLOCK - 10, 20), (5, 7), (2 * BLOCK + 7, 9000)]),
                    (other, (0..size as u64).step_by(mib).map(|o| (o, mib as u32)).collect()),
                ];
                let tasks: Vec<_> = plans
                    .into_iter()
                    .map(|(r, reads)| {
                        let data = data.clone();
                        spawn(async move {
                            for (off, len) in reads {
                                let got = r.read(off, len).await.unwrap();
                                let end = (off as usize + len as usize).min(data.len());
                                assert!(got[..] == data[off as usize..end], "bytes {off}..{end} wrong");
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
            })
        },
        SCHEDULES,
    );
}

fn fs_over(mem: Arc<MemStore>) -> Arc<Fs> {
    let staging = std::env::temp_dir().join(format!("bucketfs-shuttle-{}", std::process::id()));
    let cfg =
        FsConfig { staging_dir: staging, metadata_ttl: std::time::Duration::from_secs(3600), ..Default::default() };
    Fs::new(Arc::new(YieldStore(mem)), cfg)
}

/// The last close of a clean staged file drops it, while another open (for writing) finds
/// it: the open must not attach to the dropped file, or its writes go nowhere.
#[test]
fn an_open_racing_the_last_close_keeps_its_writes() {
    shuttle::check_random(
        || {
            block_on(async {
                let mem = mem_with("f", b"aaaa");
                let fs = fs_over(mem.clone());
                let ino = fs.lookup(ROOT_INO, "f").await.unwrap().ino;
                let first = fs.open(ino, true, false).await.unwrap(); // staged, clean
                let closer = {
                    let fs = fs.clone();
                    spawn(async move { fs.release(first).await })
                };
                let writer = {
                    let fs = fs.clone();
                    spawn(async move {
                        let fh = fs.open(ino, true, false).await?;
                        fs.check_invariants();
                        fs.write(fh, 0, b"bb").await?;
                        fs.flush(fh).await?;
                        fs.release(fh).await
                    })
                };
                closer.await.unwrap().unwrap();
                writer.await.unwrap().expect("open, write, flush and close");
                fs.check_invariants();
                assert_eq!(object(&mem, "f").await, b"bbaa", "the write reached the store");
            })
        },
        SCHEDULES,
    );
}

/// Two handles write their own bytes of one file and flush: whatever the order, after both
/// flushes returned the store holds both writes (a flush that finds the file clean relies
/// on the upload that cleaned it having begun after every write before it).
#[test]
fn flushes_of_two_writers_leave_both_writes_in_the_store() {
    shuttle::check_random(
        || {
            block_on(async {
                let mem = mem_with("f", b"aaaa");
                let fs = fs_over(mem.clone());
                let ino = fs.lookup(ROOT_INO, "f").await.unwrap().ino;
                let tasks: Vec<_> = [(0u64, &b"XX"[..]), (2, &b"YY"[..])]
                    .into_iter()
                    .map(|(off, bytes)| {
                        let fs = fs.clone();
                        spawn(async move {
                            let fh = fs.open(ino, true, false).await.unwrap();
                            fs.write(fh, off, bytes).await.unwrap();
                            fs.flush(fh).await.unwrap();
                            fs.check_invariants();
                            fh
                        })
                    })
                    .collect();
                let mut handles = Vec::new();
                for t in tasks {
                    handles.push(t.await.unwrap());
                }
                assert_eq!(object(&mem, "f").await, b"XXYY", "a flushed write is missing from the store");
                for fh in handles {
                    fs.release(fh).await.unwrap();
                }
                assert_eq!(fs.getattr(ino).await.unwrap().size, 4);
                fs.check_invariants();
            })
        },
        SCHEDULES,
    );
}

/// A writer's close (its upload, then the release that drops the clean staged file) racing
/// a rename of the file, then a crash: the next mount of the staging directory must leave
/// exactly one name in the bucket, the new one since the rename returned, holding the
/// bytes. (A staged file out of the map whose sidecar still named the old key was uploaded
/// there again by recovery: both names.)
#[test]
fn a_rename_racing_the_last_close_leaves_one_name_after_a_crash() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static RUN: AtomicU64 = AtomicU64::new(0);
    shuttle::check_random(
        || {
            block_on(async {
                let mem = Arc::new(MemStore::new());
                let staging = std::env::temp_dir().join(format!(
                    "bucketfs-shuttle-crash-{}-{}",
                    std::process::id(),
                    RUN.fetch_add(1, Ordering::Relaxed)
                ));
                let cfg = || FsConfig { staging_dir: staging.clone(), ..Default::default() };
                let fs = Fs::new(Arc::new(YieldStore(mem.clone())), cfg());
                let (_, fh) = fs.create(ROOT_INO, "u", 0, None).await.unwrap();
                fs.write(fh, 0, b"bytes").await.unwrap();
                let closer = {
                    let fs = fs.clone();
                    spawn(async move {
                        fs.flush(fh).await.unwrap();
                        fs.release(fh).await.unwrap();
                    })
                };
                let mover = {
                    let fs = fs.clone();
                    spawn(async move { fs.rename(ROOT_INO, "u", ROOT_INO, "v", false).await })
                };
                closer.await.unwrap();
                mover.await.unwrap().expect("rename");
                // A crash now (nothing more runs in `fs`): the next mount recovers.
                let next = Fs::new(mem.clone(), cfg());
                let (_, failed) = next.recover_staged().await;
                assert!(failed.is_empty(), "{failed:?}");
                let names: Vec<String> = mem.list("", true).map(|m| m.unwrap().key).collect::<Vec<_>>().await;
                assert_eq!(names, vec!["v".to_string()], "the bucket after the crash");
                assert_eq!(object(&mem, "v").await, b"bytes");
                drop((fs, next));
                let _ = std::fs::remove_dir_all(&staging);
            })
        },
        SCHEDULES,
    );
}
