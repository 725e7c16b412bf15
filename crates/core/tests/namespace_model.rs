//! The namespace against a reference model while the store's answers come late (issue 42).
//!
//! Workers change a tree two levels deep (write, truncate, unlink, mkdir, rmdir, rename
//! of files and directories; a step, or two independent steps at once). Listers read it at
//! the same time, their listings and HEADs held (`FailStore::hold`: sent at once, answered
//! only when released) and released in the order the steps say, so answers land after
//! the workers' later changes. The clock moves past the TTL now and then, so listings are
//! asked again. Another client writes below `x/` directly in the store. After every step,
//! what the mount shows (each name's kind and size, each directory's entries) must equal
//! the model: an answer sent before a change here never undoes it. Now and then the mount
//! dies (no request of it answered from then on, as after a `kill -9`) and the next mount of
//! its staging directory starts: every step done before must still show. At the end, after
//! `sync_all`, the bucket holds the model's files. Durable and write-back mounts. proptest
//! shrinks a failure to its steps.
//!
//! Run: `cargo test --release -p bucketfs-core --test namespace_model` (a few seconds).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bucketfs_core::{Clock, Fs, FsConfig, FsError, Kind, SetAttr, WriteBackConfig, ROOT_INO};
use bucketfs_store::metered::Op;
use bucketfs_store::testing::{FailStore, MemStore};
use bucketfs_store::{PutOpts, Store, StoreErrorKind};
use bytes::Bytes;
use proptest::prelude::*;

mod mortal;
use mortal::Mortal;

const TTL: Duration = Duration::from_secs(1);
/// Paths the worker uses: files `a` `b`, directories `d` `e`, two levels deep.
const PATHS: [&str; 14] =
    ["a", "b", "d", "e", "d/a", "d/b", "d/e", "e/a", "e/d", "d/e/a", "d/e/b", "e/d/a", "e/a", "d/d"];

#[derive(Debug, Clone, PartialEq)]
enum Entry {
    Dir,
    File(u64),
}

#[derive(Debug, Clone)]
enum Step {
    /// Create or truncate `PATHS[i]` as a file of `len` bytes, closed.
    Write(usize, u16),
    Truncate(usize, u16),
    Unlink(usize),
    Mkdir(usize),
    Rmdir(usize),
    Rename(usize, usize),
    /// Past the TTL, listers start: `n` listings or HEADs held, by readdirs and lookups in
    /// `PATHS[i]`'s parent (or the directory itself).
    Listen(usize, u8, bool),
    /// `n` held answers arrive.
    Release(u8),
    /// Past the TTL, listers start as for `Listen`, and the store refuses their `n`
    /// listings or HEADs as if unreachable: what the mount shows stays as it was.
    Outage(usize, u8, bool),
    /// Past the TTL: listings are asked again.
    Tick,
    /// Another client puts `x/f{n}` of `len` bytes.
    Other(u8, u16),
    /// Two workers' steps at once (when neither's names are at or below the other's).
    Pair(Box<Step>, Box<Step>),
    /// The mount dies (`kill -9`: no request of it is answered from now on, uploads and
    /// listings in flight included) and the next mount of its staging directory starts
    /// (recovery first). Every step done so far was promised: the model stays.
    Crash,
}

/// A worker's step the model allows, on its paths.
#[derive(Debug, Clone, Copy)]
enum Action {
    Write(&'static str, u16),
    Truncate(&'static str, u16),
    Unlink(&'static str),
    Mkdir(&'static str),
    Rmdir(&'static str),
    Rename(&'static str, &'static str),
}

impl Action {
    /// The names it changes (a rename: both).
    fn names(&self) -> Vec<&'static str> {
        match *self {
            Action::Write(p, _) | Action::Truncate(p, _) | Action::Unlink(p) | Action::Mkdir(p) | Action::Rmdir(p) => {
                vec![p]
            }
            Action::Rename(a, b) => vec![a, b],
        }
    }

    /// Whether a name of one is at or below a name of the other: then their order matters.
    fn overlaps(&self, other: &Action) -> bool {
        let related = |a: &str, b: &str| a == b || b.starts_with(&format!("{a}/")) || a.starts_with(&format!("{b}/"));
        self.names().iter().any(|a| other.names().iter().any(|b| related(a, b)))
    }
}

fn worker_step() -> impl Strategy<Value = Step> {
    let p = 0..PATHS.len();
    prop_oneof![
        3 => (p.clone(), 0..3000u16).prop_map(|(i, l)| Step::Write(i, l)),
        1 => (p.clone(), 0..3000u16).prop_map(|(i, l)| Step::Truncate(i, l)),
        2 => p.clone().prop_map(Step::Unlink),
        3 => p.clone().prop_map(Step::Mkdir),
        1 => p.clone().prop_map(Step::Rmdir),
        3 => (p.clone(), p).prop_map(|(a, b)| Step::Rename(a, b)),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let p = 0..PATHS.len();
    prop_oneof![
        12 => worker_step(),
        4 => (worker_step(), worker_step()).prop_map(|(a, b)| Step::Pair(Box::new(a), Box::new(b))),
        3 => (p.clone(), 1..4u8, any::<bool>()).prop_map(|(i, n, h)| Step::Listen(i, n, h)),
        2 => (1..4u8).prop_map(Step::Release),
        1 => (p.clone(), 1..4u8, any::<bool>()).prop_map(|(i, n, h)| Step::Outage(i, n, h)),
        1 => Just(Step::Tick),
        1 => Just(Step::Crash),
        1 => (0..3u8, 0..2000u16).prop_map(|(n, l)| Step::Other(n, l)),
    ]
}

fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(p, _)| p)
}

fn leaf(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(_, n)| n)
}

struct World {
    fs: Arc<Fs>,
    fail: Arc<FailStore>,
    /// The mount's process, for [`Step::Crash`].
    life: Arc<Mortal>,
    write_back: bool,
    mem: Arc<MemStore>,
    clock: Clock,
    /// The tree as a user made it; "" is the root.
    model: BTreeMap<String, Entry>,
    /// What another client put below `x/` (name -> size).
    other: BTreeMap<String, u64>,
    /// Each hold's permits, and how many of its calls still wait for one.
    held: std::sync::Mutex<Vec<(Arc<tokio::sync::Semaphore>, u32)>>,
    listers: Vec<tokio::task::JoinHandle<()>>,
    staging: tempdir::Dir,
}

/// A throwaway directory (std only).
mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Self {
            use std::sync::atomic::{AtomicU64, Ordering};
            static N: AtomicU64 = AtomicU64::new(0);
            let p = std::env::temp_dir().join(format!(
                "bucketfs-nsmodel-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Run `fut` to its end; whenever it stalls (waiting for a held answer, or for a lock a
/// held lister keeps), the oldest held answer arrives.
async fn drive<T>(w: &World, fut: impl std::future::Future<Output = T>) -> T {
    tokio::pin!(fut);
    loop {
        tokio::select! {
            biased;
            out = &mut fut => return out,
            _ = settle() => {
                w.release_one(); // nothing held: it just runs on
            }
        }
    }
}

/// Let every other task run until it waits for something (the store answers at once).
async fn settle() {
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
}

impl World {
    /// The oldest held answer arrives; `false` if none is held.
    fn release_one(&self) -> bool {
        let mut held = self.held.lock().unwrap();
        let Some((p, left)) = held.iter_mut().find(|(_, left)| *left > 0) else { return false };
        p.add_permits(1);
        *left -= 1;
        true
    }

    fn answers_held(&self) -> bool {
        self.held.lock().unwrap().iter().any(|(_, left)| *left > 0)
    }

    /// `write_back`: closes return once staged, uploads follow at once in the background.
    async fn new(write_back: bool) -> Self {
        let mem = Arc::new(MemStore::new());
        mem.put("x/seed", Bytes::from_static(b"s"), PutOpts::default()).await.unwrap();
        let clock = Clock::manual();
        let staging = tempdir::Dir::new();
        let (fail, life, fs) = start(&mem, &staging.0, &clock, write_back).await;
        let mut model = BTreeMap::new();
        model.insert(String::new(), Entry::Dir);
        model.insert("x".into(), Entry::Dir);
        for d in ["d", "e"] {
            fs.mkdir(ROOT_INO, d, None).await.unwrap();
            model.insert(d.into(), Entry::Dir);
        }
        World {
            fs,
            fail,
            life,
            write_back,
            mem,
            clock,
            model,
            other: BTreeMap::from([("seed".to_string(), 1)]),
            held: Default::default(),
            listers: Vec::new(),
            staging,
        }
    }

    /// The inode of `path` (a lookup per component, as the kernel does).
    async fn ino(&self, path: &str) -> Result<u64, FsError> {
        let mut ino = ROOT_INO;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            ino = self.fs.lookup(ino, part).await?.ino;
        }
        Ok(ino)
    }

    fn children(&self, dir: &str) -> Vec<String> {
        let pre = if dir.is_empty() { String::new() } else { format!("{dir}/") };
        let mut names: Vec<String> = self
            .model
            .keys()
            .filter(|k| !k.is_empty() && k.starts_with(&pre) && !k[pre.len()..].contains('/'))
            .map(|k| k[pre.len()..].to_string())
            .collect();
        if dir == "x" {
            names.extend(self.other.keys().cloned());
        }
        names.sort();
        names
    }

    /// What `s` does, if the model allows it now (else the step is skipped).
    fn plan(&self, s: &Step) -> Option<Action> {
        let is_dir = |p: &str| self.model.get(p) == Some(&Entry::Dir);
        let is_file = |p: &str| matches!(self.model.get(p), Some(Entry::File(_)));
        Some(match *s {
            Step::Write(i, len) if is_dir(parent(PATHS[i])) && !is_dir(PATHS[i]) => Action::Write(PATHS[i], len),
            Step::Truncate(i, len) if is_file(PATHS[i]) => Action::Truncate(PATHS[i], len),
            Step::Unlink(i) if is_file(PATHS[i]) => Action::Unlink(PATHS[i]),
            Step::Mkdir(i) if is_dir(parent(PATHS[i])) && !self.model.contains_key(PATHS[i]) => Action::Mkdir(PATHS[i]),
            Step::Rmdir(i) if is_dir(PATHS[i]) && self.children(PATHS[i]).is_empty() => Action::Rmdir(PATHS[i]),
            Step::Rename(a, b) => {
                let (src, dst) = (PATHS[a], PATHS[b]);
                let kind = self.model.get(src)?;
                let into_itself = dst == src || dst.starts_with(&format!("{src}/"));
                let target_ok = match (self.model.get(dst), kind) {
                    (None, _) => true,
                    (Some(Entry::File(_)), Entry::File(_)) => true,
                    (Some(Entry::Dir), Entry::Dir) => self.children(dst).is_empty(),
                    _ => false,
                };
                if into_itself || !target_ok || !is_dir(parent(dst)) {
                    return None;
                }
                Action::Rename(src, dst)
            }
            _ => return None,
        })
    }

    /// Do `a` through the mount (the model is not changed: [`World::commit`]).
    async fn exec(&self, a: &Action) -> Result<(), String> {
        let fs = &self.fs;
        let dir_of = |path: &'static str| async move {
            drive(self, self.ino(parent(path))).await.map_err(|e| format!("{path}: parent: {e:?}"))
        };
        match *a {
            Action::Write(path, len) => {
                let (_, fh) = drive(self, fs.create(dir_of(path).await?, leaf(path), libc_trunc(), None))
                    .await
                    .map_err(|e| format!("create {path}: {e:?}"))?;
                drive(self, fs.write(fh, 0, &vec![b'w'; len as usize]))
                    .await
                    .map_err(|e| format!("write {path}: {e:?}"))?;
                drive(self, fs.release(fh)).await.map_err(|e| format!("close {path}: {e:?}"))?;
            }
            Action::Truncate(path, len) => {
                let ino = drive(self, self.ino(path)).await.map_err(|e| format!("{path}: {e:?}"))?;
                let change = SetAttr { size: Some(len as u64), ..Default::default() };
                drive(self, fs.setattr(ino, change)).await.map_err(|e| format!("truncate {path}: {e:?}"))?;
            }
            Action::Unlink(path) => drive(self, fs.unlink(dir_of(path).await?, leaf(path)))
                .await
                .map_err(|e| format!("unlink {path}: {e:?}"))?,
            Action::Mkdir(path) => {
                drive(self, fs.mkdir(dir_of(path).await?, leaf(path), None))
                    .await
                    .map_err(|e| format!("mkdir {path}: {e:?}"))?;
            }
            Action::Rmdir(path) => drive(self, fs.rmdir(dir_of(path).await?, leaf(path)))
                .await
                .map_err(|e| format!("rmdir {path}: {e:?}"))?,
            Action::Rename(src, dst) => {
                let (from, to) = (dir_of(src).await?, dir_of(dst).await?);
                drive(self, fs.rename(from, leaf(src), to, leaf(dst), false))
                    .await
                    .map_err(|e| format!("rename {src} {dst}: {e:?}"))?;
            }
        }
        Ok(())
    }

    /// `a` is done: the model follows.
    fn commit(&mut self, a: &Action) {
        match *a {
            Action::Write(path, len) | Action::Truncate(path, len) => {
                self.model.insert(path.into(), Entry::File(len as u64));
            }
            Action::Unlink(path) | Action::Rmdir(path) => {
                self.model.remove(path);
            }
            Action::Mkdir(path) => {
                self.model.insert(path.into(), Entry::Dir);
            }
            Action::Rename(src, dst) => {
                let moved: Vec<(String, Entry)> = self
                    .model
                    .iter()
                    .filter(|(k, _)| *k == src || k.starts_with(&format!("{src}/")))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                self.model.remove(dst);
                for (k, v) in moved {
                    self.model.remove(&k);
                    self.model.insert(format!("{dst}{}", &k[src.len()..]), v);
                }
            }
        }
    }

    async fn apply(&mut self, s: &Step) -> Result<(), String> {
        let fs = self.fs.clone();
        match *s {
            Step::Pair(ref a, ref b) => {
                let (Some(a), Some(b)) = (self.plan(a), self.plan(b)) else {
                    // One is not allowed now: the other alone.
                    if let Some(one) = self.plan(a).or_else(|| self.plan(b)) {
                        self.exec(&one).await?;
                        self.commit(&one);
                    }
                    return Ok(());
                };
                if a.overlaps(&b) {
                    return Ok(()); // their order would decide the outcome
                }
                let (ra, rb) = futures::future::join(self.exec(&a), self.exec(&b)).await;
                ra?;
                rb?;
                self.commit(&a);
                self.commit(&b);
            }
            Step::Listen(..) | Step::Outage(..) | Step::Release(_) | Step::Tick | Step::Other(..) | Step::Crash => {
                return self.apply_other(s, &fs).await
            }
            _ => {
                if let Some(a) = self.plan(s) {
                    self.exec(&a).await?;
                    self.commit(&a);
                }
            }
        }
        Ok(())
    }

    /// The steps that are not the worker's.
    async fn apply_other(&mut self, s: &Step, fs: &Arc<Fs>) -> Result<(), String> {
        match *s {
            Step::Listen(i, n, head) | Step::Outage(i, n, head) => {
                let dir = match self.model.get(PATHS[i]) {
                    Some(Entry::Dir) => PATHS[i],
                    _ => parent(PATHS[i]),
                };
                // Time passed: what they read is asked of the store again.
                self.clock.advance(TTL + Duration::from_millis(1));
                // Their answers held (`Listen`), or refused (`Outage`).
                let permits = match s {
                    Step::Outage(..) => {
                        self.life.refuse(head, n as u32);
                        None
                    }
                    _ => Some(self.fail.hold(if head { Op::Head } else { Op::List }, n as u32)),
                };
                for k in 0..n {
                    let (fs, dir, name) =
                        (fs.clone(), dir.to_string(), leaf(PATHS[(i + k as usize) % PATHS.len()]).to_string());
                    self.listers.push(tokio::spawn(async move {
                        let mut ino = ROOT_INO;
                        for part in dir.split('/').filter(|p| !p.is_empty()) {
                            match fs.lookup(ino, part).await {
                                Ok(a) => ino = a.ino,
                                Err(_) => return,
                            }
                        }
                        if let Ok(fh) = fs.opendir(ino).await {
                            let _ = fs.readdir(fh);
                            fs.releasedir(fh);
                        }
                        if let Ok(a) = fs.lookup(ino, &name).await {
                            let _ = fs.getattr(a.ino).await; // a `stat`: a HEAD past the TTL
                        }
                    }));
                }
                settle().await;
                let Some(permits) = permits else {
                    self.life.refuse(head, 0); // over
                    return Ok(());
                };
                let unused = self.fail.disarm(); // calls not made by now answer at once
                self.held.lock().unwrap().push((permits, n as u32 - unused));
            }
            Step::Release(n) => {
                for _ in 0..n {
                    self.release_one();
                }
                settle().await;
            }
            Step::Tick => self.clock.advance(TTL + Duration::from_millis(1)),
            Step::Crash => {
                self.life.kill();
                for l in self.listers.drain(..) {
                    l.abort();
                }
                self.held.lock().unwrap().clear();
                let (fail, life, fs) = start(&self.mem, &self.staging.0, &self.clock, self.write_back).await;
                (self.fail, self.life, self.fs) = (fail, life, fs);
            }
            Step::Other(n, len) => {
                let name = format!("f{n}");
                self.mem
                    .put(&format!("x/{name}"), Bytes::from(vec![b'o'; len as usize]), PutOpts::default())
                    .await
                    .unwrap();
                self.other.insert(name, len as u64);
            }
            _ => unreachable!("a worker's step"),
        }
        Ok(())
    }

    /// What the mount shows equals the model (`x/` only once another client's change had a
    /// TTL to show: `x_settled`).
    async fn check(&self, x_settled: bool) -> Result<(), String> {
        for (path, want) in &self.model {
            if path == "x" && !x_settled {
                continue;
            }
            let ino = drive(self, self.ino(path)).await.map_err(|e| format!("{path:?} in the model, lookup: {e:?}"))?;
            let attr = drive(self, self.fs.getattr(ino)).await.map_err(|e| format!("{path:?}: getattr {e:?}"))?;
            match want {
                Entry::File(size) if attr.kind != Kind::File || attr.size != *size => {
                    return Err(format!("{path:?}: {:?} of {} bytes, model: a file of {size}", attr.kind, attr.size));
                }
                Entry::Dir if attr.kind != Kind::Dir => {
                    return Err(format!("{path:?}: {:?}, model: a directory", attr.kind))
                }
                Entry::Dir if path != "x" || x_settled => {
                    let fh = drive(self, self.fs.opendir(ino)).await.map_err(|e| format!("{path:?}: opendir {e:?}"))?;
                    let entries = self.fs.readdir(fh).map_err(|e| format!("{path:?}: readdir {e:?}"))?;
                    self.fs.releasedir(fh);
                    let mut seen: Vec<String> = entries.iter().skip(2).map(|e| e.name.clone()).collect();
                    seen.sort();
                    if seen != self.children(path) {
                        return Err(format!("ls {path:?}: {seen:?}, model: {:?}", self.children(path)));
                    }
                }
                _ => {}
            }
        }
        self.fs.check_invariants();
        Ok(())
    }

    /// Every held answer arrives, and the listers end.
    async fn finish(&mut self) {
        self.fail.disarm();
        while self.release_one() {}
        for l in self.listers.drain(..) {
            let _ = l.await;
        }
    }
}

/// A mount of `mem` staging in `staging`, as `bucketfs mount` starts one: what an earlier
/// mount of the staging directory left is recovered first. `write_back`: closes return
/// once staged, uploads follow at once in the background.
async fn start(
    mem: &Arc<MemStore>,
    staging: &std::path::Path,
    clock: &Clock,
    write_back: bool,
) -> (Arc<FailStore>, Arc<Mortal>, Arc<Fs>) {
    let fail = Arc::new(FailStore::new(mem.clone(), Op::Check, u64::MAX, 0, StoreErrorKind::Other));
    let life = Arc::new(Mortal::new(fail.clone()));
    let write_back = write_back.then(|| WriteBackConfig { delay: Duration::ZERO, ..Default::default() });
    let cfg = FsConfig {
        staging_dir: staging.to_path_buf(),
        metadata_ttl: TTL,
        clock: clock.clone(),
        write_back,
        ..Default::default()
    };
    let fs = Fs::new(life.clone() as Arc<dyn Store>, cfg);
    let (_, failed) = fs.recover_staged().await;
    assert!(failed.is_empty(), "recovery failed for {failed:?}");
    fs.start_write_back(); // as the mount does (deferred deletes; the write-back queue)
    (fail, life, fs)
}

/// O_CREAT | O_TRUNC | O_WRONLY (Linux values).
fn libc_trunc() -> i32 {
    0o100 | 0o1000 | 0o1
}

async fn run(steps: Vec<Step>, write_back: bool) -> Result<(), String> {
    let mut w = World::new(write_back).await;
    let mut x_settled = true; // nothing from another client yet
    for (i, s) in steps.iter().enumerate() {
        w.apply(s).await.map_err(|e| format!("step {i} {s:?}: {e}"))?;
        match s {
            Step::Other(..) => x_settled = false,
            // Answers held from before the other client's change may still land (another
            // client's changes are only ordered by the TTL): only once none is held.
            Step::Tick if !w.answers_held() => x_settled = true,
            _ => {}
        }
        w.check(x_settled).await.map_err(|e| format!("after step {i} {s:?}: {e}"))?;
    }
    w.finish().await;
    w.clock.advance(TTL + Duration::from_millis(1));
    w.check(true).await.map_err(|e| format!("at the end, all answers in: {e}"))?;
    // Everything reached the bucket: each file of the model is an object of its size,
    // and no other path of the worker's is one.
    let failed = tokio::time::timeout(Duration::from_secs(30), w.fs.sync_all())
        .await
        .map_err(|_| "sync_all did not return in 30 s".to_string())?;
    if !failed.is_empty() {
        return Err(format!("sync failed for {failed:?}"));
    }
    for path in PATHS {
        let head = w.mem.head(path, Default::default()).await;
        match (w.model.get(path), head) {
            (Some(Entry::File(size)), Ok(h)) if h.meta.size == *size => {}
            (Some(Entry::File(size)), other) => {
                return Err(format!("{path}: a file of {size} in the model, in the bucket {other:?}"))
            }
            (_, Ok(h)) => return Err(format!("{path}: not a file in the model, but an object of {}", h.meta.size)),
            (_, Err(_)) => {}
        }
    }
    Ok(())
}

/// [`run`] on a runtime of its own, as each test case needs.
fn replay(steps: Vec<Step>, write_back: bool) -> Result<(), String> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(run(steps, write_back))
}

/// A fixed seed unless PROPTEST_RNG_SEED gives one: the suite's verdict must not depend on
/// which 256 cases a run happens to draw (run with a random seed, or PROPTEST_CASES=5000,
/// to explore; a failure found so goes below as a test of its own).
fn config() -> ProptestConfig {
    let default = ProptestConfig::default();
    let rng_seed = match std::env::var_os("PROPTEST_RNG_SEED") {
        Some(_) => default.rng_seed,
        None => proptest::test_runner::RngSeed::Fixed(20_261_129),
    };
    ProptestConfig { rng_seed, ..default }
}

/// Found by a random run on 2026-11-29 (already failing at a56cb20): in write-back mode,
/// `d` holding an uploaded file is renamed to `e/a` while a listing of the root is held.
/// A listing ahead of `d`, queued before the rename, then listed the old key `d/` after the
/// deferred move had emptied it, and installed that on the inode now at `e/a`: `ls e/a`
/// showed nothing. A listing now takes the directory's key from the table when it starts.
#[test]
fn a_listing_queued_before_a_rename_lists_the_new_key() {
    let steps = vec![
        Step::Write(4, 0),
        Step::Listen(7, 1, false),
        Step::Rename(2, 12),
        Step::Listen(0, 1, false),
        Step::Release(1),
    ];
    let out = replay(steps, true);
    assert!(out.is_ok(), "{}", out.unwrap_err());
}

/// Found by random runs on 2026-11-29 (seeds 303-606; it fails at 2bd2c6f too): `d/e/b`
/// renamed over `e` while a listing ahead of `d/` (sent before) is held. A listing of the
/// root sent after the rename lands first and, knowing of the removal, clears its record;
/// then the late one lands and its `d/e/` part made a node of `b` again: `create d/e/b`
/// said EISDIR. A listing older than the one a directory holds is now not recorded.
#[test]
fn a_directory_renamed_over_another_does_not_come_back() {
    use Step::*;
    let steps = vec![
        Pair(Box::new(Mkdir(6)), Box::new(Write(9, 0))),
        Pair(Box::new(Mkdir(10)), Box::new(Write(13, 0))),
        Listen(6, 1, false),
        Listen(0, 1, false),
        Rename(10, 3),
        Tick,
        Listen(0, 1, false),
        Pair(Box::new(Write(0, 0)), Box::new(Write(10, 0))),
    ];
    let out = replay(steps, true);
    assert!(out.is_ok(), "{}", out.unwrap_err());
}

proptest! {
    #![proptest_config(config())]
    // 256 cases (PROPTEST_CASES sets another number): about 5 s.
    #[test]
    fn the_namespace_matches_the_model_while_answers_come_late(steps in proptest::collection::vec(step(), 1..40)) {
        let out = replay(steps, false);
        prop_assert!(out.is_ok(), "{}", out.unwrap_err());
    }

    /// The same in write-back mode: uploads, deletes and moves reach the store in the
    /// background while the worker goes on.
    #[test]
    fn the_namespace_matches_the_model_in_write_back_mode(steps in proptest::collection::vec(step(), 1..40)) {
        let out = replay(steps, true);
        prop_assert!(out.is_ok(), "{}", out.unwrap_err());
    }
}
