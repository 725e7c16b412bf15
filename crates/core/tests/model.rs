//! Model checking the core's namespace bookkeeping with shuttle.
//!
//! The real [`Fs`] runs on shuttle's executor against an in-memory store whose every call
//! first yields to the scheduler, so shuttle explores the orders in which concurrent
//! operations' store calls and table updates interleave. Built with `--features shuttle`
//! the core's own locks are shuttle's too (src/sync.rs), so a task may also be preempted
//! at every lock it takes between two awaits, as on a multi-threaded runtime; without the
//! feature those critical sections run whole.
//!
//! What is checked is what the kernel would see afterwards: a directory created or a file
//! deleted here is found (or not) by the next lookup, whatever a concurrent `ls` did, and
//! lookup/forget reference counts never drop a node the kernel still holds; and the inode
//! table's invariants (`InodeTable::check_invariants`) hold after every step of every task.
//!
//! Run: `cargo test --release -p bucketfs-core --features shuttle --test model` (a few
//! seconds; also part of a plain `cargo test`, with uninstrumented locks).

use std::sync::Arc;

use bucketfs_core::{Fs, FsConfig, FsError, ROOT_INO};
use bucketfs_store::testing::MemStore;
use bucketfs_store::{PutOpts, Store};
use bytes::Bytes;
use shuttle::future::{block_on, spawn};

mod common;
use common::YieldStore;

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
    fs.check_invariants();
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
                spawn(async move {
                    let made = fs.mkdir(d, "new", None).await.map(|a| a.ino);
                    fs.check_invariants();
                    made
                })
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
                spawn(async move {
                    let r = fs.unlink(d, "a").await;
                    fs.check_invariants();
                    r
                })
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
                            fs.check_invariants();
                            fs.forget(a.ino, 1);
                            fs.check_invariants();
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
            fs.check_invariants();
            assert!(matches!(fs.getattr(held).await, Err(FsError::NotFound)), "inode not dropped at zero");
        })
    });
}
