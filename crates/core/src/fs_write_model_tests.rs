//! A proptest model of staged writes: opens, writes, reads, truncates, closes, unlinks
//! and renames of three names against a map of byte vectors, with uploads failing from a
//! random request on; what each close promised must be in the bucket at the end.

use super::*;
use bucketfs_store::testing::{FailStore, MemStore, Op};
use bucketfs_store::StoreErrorKind;
use std::collections::HashMap;

use super::write_tests::{cfg, object};

#[derive(Debug, Clone)]
enum Step {
    Open(usize, bool),
    Write(usize, u16, u8, u8),
    Read(usize, u16, u16),
    Truncate(usize, u16),
    Close(usize),
    Unlink(usize),
    Rename(usize, usize),
}

const NAMES: [&str; 3] = ["a", "b", "c"];

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        (0..3usize, any::<bool>()).prop_map(|(n, t)| Step::Open(n, t)),
        (0..3usize, 0..3000u16, 1..200u8, any::<u8>()).prop_map(|(n, o, l, b)| Step::Write(n, o, l, b)),
        (0..3usize, 0..3500u16, 0..600u16).prop_map(|(n, o, l)| Step::Read(n, o, l)),
        (0..3usize, 0..3000u16).prop_map(|(n, s)| Step::Truncate(n, s)),
        (0..3usize).prop_map(Step::Close),
        (0..3usize).prop_map(Step::Unlink),
        (0..3usize, 0..3usize).prop_map(|(a, b)| Step::Rename(a, b)),
    ]
}

/// Runs steps against the core and a reference model: a map of names to bytes, plus what
/// the bucket must hold after each successful close.
async fn run_model(steps: Vec<Step>, fail_from: u64, moves: bool) {
    let mem = Arc::new(if moves { MemStore::new().with_moves() } else { MemStore::new() });
    let store = Arc::new(FailStore::new(mem.clone(), Op::Put, fail_from, 2, StoreErrorKind::Other));
    let fs = Fs::new(store, cfg());
    let mut model: HashMap<&str, Vec<u8>> = HashMap::new();
    let mut open: HashMap<&str, u64> = HashMap::new();
    for s in steps {
        match s {
            Step::Open(n, trunc) => {
                let name = NAMES[n];
                if open.contains_key(name) {
                    continue;
                }
                let fh = match fs.lookup(ROOT_INO, name).await {
                    Ok(a) => fs.open(a.ino, true, trunc).await.unwrap(),
                    Err(_) => fs.create(ROOT_INO, name, 0, None).await.unwrap().1,
                };
                let content = model.entry(name).or_default();
                if trunc {
                    content.clear();
                }
                open.insert(name, fh);
            }
            Step::Write(n, off, len, byte) => {
                let Some(&fh) = open.get(NAMES[n]) else { continue };
                let data = vec![byte; len as usize];
                fs.write(fh, off as u64, &data).await.unwrap();
                let m = model.get_mut(NAMES[n]).unwrap();
                let end = off as usize + data.len();
                if m.len() < end {
                    m.resize(end, 0);
                }
                m[off as usize..end].copy_from_slice(&data);
            }
            Step::Read(n, off, len) => {
                let Some(&fh) = open.get(NAMES[n]) else { continue };
                let m = &model[NAMES[n]];
                let got = fs.read(fh, off as u64, len as u32).await.unwrap();
                let (a, b) = ((off as usize).min(m.len()), (off as usize + len as usize).min(m.len()));
                assert_eq!(&got[..], &m[a..b], "read {} at {off}+{len}", NAMES[n]);
            }
            Step::Truncate(n, size) => {
                let Some(&fh) = open.get(NAMES[n]) else { continue };
                let ino = fs.lookup(ROOT_INO, NAMES[n]).await.unwrap().ino;
                fs.setattr(ino, SetAttr { size: Some(size as u64), fh: Some(fh), ..Default::default() }).await.unwrap();
                model.get_mut(NAMES[n]).unwrap().resize(size as usize, 0);
            }
            Step::Close(n) => {
                let Some(fh) = open.remove(NAMES[n]) else { continue };
                let ok = fs.flush(fh).await.is_ok() & fs.release(fh).await.is_ok();
                if ok {
                    assert_eq!(object(&mem, NAMES[n]).await.as_ref(), Some(&model[NAMES[n]]), "bucket after close");
                }
            }
            Step::Unlink(n) => {
                if open.contains_key(NAMES[n]) || !model.contains_key(NAMES[n]) {
                    continue;
                }
                fs.unlink(ROOT_INO, NAMES[n]).await.unwrap();
                model.remove(NAMES[n]);
                assert!(object(&mem, NAMES[n]).await.is_none());
            }
            Step::Rename(a, b) => {
                let (from, to) = (NAMES[a], NAMES[b]);
                if a == b || open.contains_key(from) || open.contains_key(to) || !model.contains_key(from) {
                    continue;
                }
                if fs.rename(ROOT_INO, from, ROOT_INO, to, false).await.is_ok() {
                    let v = model.remove(from).unwrap();
                    model.insert(to, v);
                }
            }
        }
    }
    for (name, fh) in open.drain() {
        let _ = fs.flush(fh).await;
        let _ = fs.release(fh).await;
        let _ = name;
    }
    // Whatever failed before, unmount's sync gets everything into the bucket.
    assert!(fs.sync_all().await.is_empty());
    for (name, content) in &model {
        assert_eq!(object(&mem, name).await.as_ref(), Some(content), "bucket at the end: {name}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    #[test]
    fn core_matches_the_model(steps in proptest::collection::vec(step(), 1..60), fail_from in 1..30u64) {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(run_model(steps, fail_from, false));
    }

    /// The same on a store that moves in one request (Google Drive's files.update).
    #[test]
    fn core_matches_the_model_on_a_store_that_moves(steps in proptest::collection::vec(step(), 1..60), fail_from in 1..30u64) {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(run_model(steps, fail_from, true));
    }
}
