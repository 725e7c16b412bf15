//! Model checking the core's namespace bookkeeping with shuttle.
//!
//! The real [`Fs`] runs on shuttle's executor against an in-memory store whose every call
//! first yields to the scheduler, so shuttle explores the orders in which concurrent
//! operations' store calls and table updates interleave. The table's `std` mutex is never
//! held across an await (see fs.rs), so those critical sections are atomic in every real
//! schedule too and need no instrumenting: no production code changes for this test.
//!
//! What is checked is what the kernel would see afterwards: a directory created or a file
//! deleted here is found (or not) by the next lookup, whatever a concurrent `ls` did, and
//! lookup/forget reference counts never drop a node the kernel still holds.
//!
//! Run: `cargo test --release -p bucketfs-core --test model` (a few seconds).

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bucketfs_core::{Fs, FsConfig, FsError, ROOT_INO};
use bucketfs_store::testing::MemStore;
use bucketfs_store::{
    ByteStream, Capabilities, GetOpts, HeadOpts, ListStream, ObjectHead, ObjectMeta, ObjectWriter, PutOpts, Store,
    StoreError, WriteOptions,
};
use bytes::Bytes;
use futures::StreamExt;
use shuttle::future::{block_on, spawn, yield_now};

/// MemStore where each request is a round trip: scheduling points before and after it, so
/// another task may run between sending a request and seeing its answer.
struct YieldStore(Arc<MemStore>);

async fn rt<T>(call: impl std::future::Future<Output = T>) -> T {
    yield_now().await;
    let out = call.await;
    yield_now().await;
    out
}

#[async_trait]
impl Store for YieldStore {
    fn describe(&self) -> String {
        "yield-mem".into()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn check(&self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn head(&self, key: &str, opts: HeadOpts) -> Result<ObjectHead, StoreError> {
        rt(self.0.head(key, opts)).await
    }
    async fn get(&self, key: &str, range: Range<u64>, opts: GetOpts<'_>) -> Result<ByteStream, StoreError> {
        rt(self.0.get(key, range, opts)).await
    }
    fn list(&self, prefix: &str, recursive: bool) -> ListStream {
        // The listing is taken when the first page is asked for, after a yield, like a LIST.
        let (inner, prefix) = (self.0.clone(), prefix.to_string());
        futures::stream::once(async move {
            yield_now().await;
            let page: Vec<_> = inner.list(&prefix, recursive).collect().await;
            yield_now().await;
            futures::stream::iter(page)
        })
        .flatten()
        .boxed()
    }
    async fn put(&self, key: &str, data: Bytes, opts: PutOpts) -> Result<ObjectMeta, StoreError> {
        rt(self.0.put(key, data, opts)).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        rt(self.0.delete(key)).await
    }
    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        rt(self.0.copy(from, to)).await
    }
    async fn create_dir(&self, key: &str) -> Result<(), StoreError> {
        rt(self.0.create_dir(key)).await
    }
    async fn writer(&self, key: &str, opts: WriteOptions) -> Result<Box<dyn ObjectWriter>, StoreError> {
        rt(self.0.writer(key, opts)).await
    }
}

fn fs_with(keys: &[&str]) -> Arc<Fs> {
    let mem = MemStore::new();
    for k in keys {
        let (k, data) = (k.to_string(), Bytes::from_static(b"x"));
        futures::executor::block_on(mem.put(&k, data, PutOpts::default())).unwrap();
    }
    let staging = std::env::temp_dir().join(format!("bucketfs-model-{}", std::process::id()));
    // A long TTL: within one schedule every listing stays fresh, so a stale one is visible.
    let cfg =
        FsConfig { staging_dir: staging, metadata_ttl: std::time::Duration::from_secs(3600), ..Default::default() };
    Fs::new(Arc::new(YieldStore(Arc::new(mem))), cfg)
}

async fn ls(fs: &Fs, ino: u64) -> Vec<String> {
    let fh = fs.opendir(ino).await.unwrap();
    let names = fs.readdir(fh).unwrap().iter().skip(2).map(|e| e.name.clone()).collect();
    fs.releasedir(fh);
    names
}

/// Explore with shuttle's PCT scheduler (depth 3 finds bugs of up to 3 ordering constraints)
/// and random schedules; each closure is one whole run of the scenario.
fn explore(scenario: impl Fn() + Send + Sync + 'static) {
    let scenario = Arc::new(scenario);
    let s = scenario.clone();
    shuttle::check_pct(move || s(), 2_000, 3);
    shuttle::check_random(move || scenario(), 2_000);
}

/// `mkdir d/new` while `ls d` lists: afterwards `new` is found by lookup and by `ls`.
#[test]
fn mkdir_during_listing_is_not_lost() {
    explore(|| {
        block_on(async {
            let fs = fs_with(&["d/a"]);
            let d = fs.lookup(ROOT_INO, "d").await.unwrap().ino;
            let lister = {
                let fs = fs.clone();
                spawn(async move { ls(&fs, d).await })
            };
            let maker = {
                let fs = fs.clone();
                spawn(async move { fs.mkdir(d, "new", None).await.map(|a| a.ino) })
            };
            let _ = lister.await.unwrap();
            maker.await.unwrap().unwrap();
            assert!(fs.lookup(d, "new").await.is_ok(), "mkdir'ed directory not found after a concurrent ls");
            assert!(ls(&fs, d).await.contains(&"new".to_string()));
        })
    });
}

/// `rm d/a` while `ls d` lists: afterwards `a` is gone for lookup and `ls`.
#[test]
fn unlink_during_listing_is_not_undone() {
    explore(|| {
        block_on(async {
            let fs = fs_with(&["d/a", "d/b"]);
            let d = fs.lookup(ROOT_INO, "d").await.unwrap().ino;
            let lister = {
                let fs = fs.clone();
                spawn(async move { ls(&fs, d).await })
            };
            let remover = {
                let fs = fs.clone();
                spawn(async move { fs.unlink(d, "a").await })
            };
            let _ = lister.await.unwrap();
            remover.await.unwrap().unwrap();
            assert!(
                matches!(fs.lookup(d, "a").await, Err(FsError::NotFound)),
                "unlinked file found after a concurrent ls"
            );
            assert_eq!(ls(&fs, d).await, vec!["b".to_string()]);
        })
    });
}

/// Lookups and forgets of one name racing with `ls` (which re-records the child): while the
/// kernel holds a reference the inode stays valid, and it keeps one inode number.
#[test]
fn lookup_forget_keep_held_inodes() {
    explore(|| {
        block_on(async {
            let fs = fs_with(&["d/f"]);
            let d = fs.lookup(ROOT_INO, "d").await.unwrap().ino;
            let held = fs.lookup(d, "f").await.unwrap().ino;
            let tasks: Vec<_> = (0..2)
                .map(|i| {
                    let fs = fs.clone();
                    spawn(async move {
                        if i == 0 {
                            let a = fs.lookup(d, "f").await.unwrap();
                            fs.forget(a.ino, 1);
                            a.ino
                        } else {
                            ls(&fs, d).await;
                            held
                        }
                    })
                })
                .collect();
            for t in tasks {
                assert_eq!(t.await.unwrap(), held, "one path, one inode while it is held");
            }
            assert_eq!(fs.getattr(held).await.unwrap().ino, held, "held inode dropped");
            fs.forget(held, 1);
            assert!(matches!(fs.getattr(held).await, Err(FsError::NotFound)), "inode not dropped at zero");
        })
    });
}
