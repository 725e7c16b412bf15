//! Tests of the move journal (moves.rs).

use super::*;
use bucketfs_store::testing::MemStore;
use bucketfs_store::{PutOpts, StoreExt};
use std::sync::Arc;

async fn keys_of(mem: &MemStore) -> Vec<String> {
    let all = futures::TryStreamExt::try_collect::<Vec<_>>(mem.list("", true)).await.unwrap();
    let mut keys: Vec<String> = all.into_iter().map(|m| m.key).collect();
    keys.sort();
    keys
}

fn journaled(from: &str, to: &str, at: SystemTime) -> Move {
    Move { from: from.to_string(), to: to.to_string(), named_before: at, replaces: None, finished: true, entry: None }
}

#[test]
fn a_file_move_renames_that_key_only() {
    let t = SystemTime::now();
    let moves = vec![journaled("a/f", "b/g", t), journaled("d/", "e/", t)];
    assert_eq!(moved_key("a/f", t, &moves), "b/g");
    assert_eq!(moved_key("a/f2", t, &moves), "a/f2");
    assert_eq!(moved_key("a/f/x", t, &moves), "a/f/x");
    assert_eq!(moved_key("d/x/y", t, &moves), "e/x/y");
}

#[tokio::test]
async fn a_kept_move_finished_later_leaves_files_made_since() {
    let mem = MemStore::new();
    for key in ["d/a", "d/b", "e/b"] {
        mem.put(key, bytes::Bytes::from_static(b"written now"), PutOpts::default()).await.unwrap();
    }
    let keys = ["d/a".to_string(), "d/b".to_string()];
    // Begun an hour ago: d/a and d/b were written by a later mount, after a failed
    // replay (and e/b is an edit of the copy that replay made).
    let long_ago = SystemTime::now() - Duration::from_secs(3600);
    run(&mem, "d/", "e/", &keys, &HashMap::new(), true, Some(long_ago)).await.unwrap();
    assert!(mem.stat("d/a").await.is_ok() && mem.stat("e/a").await.is_err(), "a file made since was moved");
    // Begun just now: the same objects are the journaled ones and move, but e/b,
    // written since, is not copied over.
    mem.put("d/b", bytes::Bytes::from_static(b"journaled"), PutOpts::default()).await.unwrap();
    run(&mem, "d/", "e/", &keys, &HashMap::new(), true, Some(SystemTime::now())).await.unwrap();
    assert!(mem.stat("d/a").await.is_err() && mem.stat("e/a").await.is_ok());
    assert_eq!(&mem.get_range("e/b", 0..9, Default::default()).await.unwrap()[..], b"journaled");
    // The copy an earlier replay made, edited past the slack after the move began: kept,
    // and the journaled source (written before that) goes.
    let began = SystemTime::now() - CLOCK_SLACK + Duration::from_millis(300);
    mem.put("d/b", bytes::Bytes::from_static(b"old"), PutOpts::default()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    mem.put("e/b", bytes::Bytes::from_static(b"edited"), PutOpts::default()).await.unwrap();
    run(&mem, "d/", "e/", &keys[1..], &HashMap::new(), true, Some(began)).await.unwrap();
    assert_eq!(&mem.get_range("e/b", 0..6, Default::default()).await.unwrap()[..], b"edited");
    assert!(mem.stat("d/b").await.is_err(), "the journaled source went");
}

/// `d/a`, `d/b`, `d/c` moved to `e/` as a directory rename moves them (with the
/// versions listed first), while another client changes keys just after each copy:
/// `others(source)` names them, with the bytes written (`None`: deleted).
async fn move_while(
    others: impl Fn(&str) -> Vec<(&'static str, Option<&'static [u8]>)> + Send + Sync + 'static,
) -> Arc<MemStore> {
    move_as(false, others).await
}

/// [`move_while`]; `journaled`: as the next mount finishes a move a crash cut short
/// (no versions listed).
async fn move_as(
    journaled: bool,
    others: impl Fn(&str) -> Vec<(&'static str, Option<&'static [u8]>)> + Send + Sync + 'static,
) -> Arc<MemStore> {
    use bucketfs_store::testing::{FailStore, Op};
    // ETags that are MD5s, as S3's: the same bytes again are the same ETag.
    let mem = Arc::new(MemStore::new().with_content_etags());
    for key in ["d/a", "d/b", "d/c"] {
        mem.put(key, bytes::Bytes::from_static(b"listed"), PutOpts::default()).await.unwrap();
    }
    let listed: Vec<ObjectMeta> = futures::TryStreamExt::try_collect(mem.list("d/", true)).await.unwrap();
    let seen: HashMap<String, ObjectMeta> = listed.iter().map(|m| (m.key.clone(), m.clone())).collect();
    let keys: Vec<String> = listed.into_iter().map(|m| m.key).collect();
    let other = mem.clone();
    let store = FailStore::new(mem.clone(), Op::Copy, 0, 0, StoreErrorKind::Other).after_copy(move |from| {
        let (other, changes) = (other.clone(), others(from));
        Box::pin(async move {
            for (key, bytes) in changes {
                match bytes {
                    Some(b) => drop(other.put(key, bytes::Bytes::from_static(b), PutOpts::default()).await.unwrap()),
                    None => other.delete(key).await.unwrap(),
                }
            }
        })
    });
    let none = HashMap::new();
    match journaled {
        true => run(&store, "d/", "e/", &keys, &none, true, None).await,
        false => run(&store, "d/", "e/", &keys, &seen, false, None).await,
    }
    .unwrap();
    mem
}

async fn read(mem: &MemStore, key: &str) -> Option<Vec<u8>> {
    let m = mem.stat(key).await.ok()?;
    Some(mem.get_range(key, 0..m.size, Default::default()).await.unwrap().to_vec())
}

#[tokio::test]
async fn a_write_landing_during_a_directory_move_is_never_lost() {
    // Written just after its copy: the newer version is copied too, then the source goes.
    let once = std::sync::atomic::AtomicBool::new(false);
    let mem = move_while(move |from| match from == "d/b" && !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
        true => vec![("d/b", Some(&b"newer"[..]))],
        false => vec![],
    })
    .await;
    assert_eq!(read(&mem, "e/b").await.as_deref(), Some(&b"newer"[..]), "the write that landed mid-move");
    assert_eq!(keys_of(&mem).await, ["e/", "e/a", "e/b", "e/c"]);

    // Written after every copy: after a few copies it stays where it is, with its bytes.
    const AGAIN: [&[u8]; 8] = [b"again 1", b"again 2", b"again 3", b"again 4", b"again 5", b"again 6", b"7", b"8"];
    let writes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let n = writes.clone();
    let mem = move_while(move |from| match from {
        "d/b" => vec![("d/b", Some(AGAIN[n.fetch_add(1, std::sync::atomic::Ordering::SeqCst)]))],
        _ => vec![],
    })
    .await;
    let last = AGAIN[writes.load(std::sync::atomic::Ordering::SeqCst) - 1];
    assert_eq!(read(&mem, "d/b").await.as_deref(), Some(last), "a source written to again and again");
    assert_eq!(read(&mem, "e/a").await.as_deref(), Some(&b"listed"[..]));

    // Deleted by another client before its copy: nothing to move there, the rest moves.
    let mem = move_while(|from| match from {
        "d/a" => vec![("d/c", None)],
        _ => vec![],
    })
    .await;
    assert_eq!(keys_of(&mem).await, ["e/", "e/a", "e/b"]);

    // Written over and then back (`B`, then the listed bytes again: the listed ETag) around
    // its copy: the copy holds `B`, so it is copied again before the source goes.
    let mem = move_while(|from| match from {
        "d/a" => vec![("d/b", Some(&b"B"[..]))],
        "d/b" => vec![("d/b", Some(&b"listed"[..]))],
        _ => vec![],
    })
    .await;
    assert_eq!(read(&mem, "e/b").await.as_deref(), Some(&b"listed"[..]), "the bytes written back");
    assert_eq!(keys_of(&mem).await, ["e/", "e/a", "e/b", "e/c"]);

    // Finishing a move a crash cut short: the same for a write that lands meanwhile.
    let once = std::sync::atomic::AtomicBool::new(false);
    let mem = move_as(true, move |from| match from == "d/b" && !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
        true => vec![("d/b", Some(&b"newer"[..]))],
        false => vec![],
    })
    .await;
    assert_eq!(read(&mem, "e/b").await.as_deref(), Some(&b"newer"[..]), "a write that landed mid-replay");
    assert_eq!(keys_of(&mem).await, ["e/", "e/a", "e/b", "e/c"]);
}

#[tokio::test]
async fn finishing_a_journaled_move_copies_each_source_once() {
    use bucketfs_store::testing::{FailStore, Op};
    let mem = Arc::new(MemStore::new().with_content_etags());
    let keys: Vec<String> = ["d/a", "d/b", "d/c"].map(str::to_string).to_vec();
    for key in &keys {
        mem.put(key, bytes::Bytes::from(key.clone()), PutOpts::default()).await.unwrap();
    }
    let counted = FailStore::new(mem.clone(), Op::Copy, 0, 0, StoreErrorKind::Other);
    run(&counted, "d/", "e/", &keys, &HashMap::new(), true, None).await.unwrap();
    assert_eq!(keys_of(&mem).await, ["e/", "e/a", "e/b", "e/c"]);
    assert_eq!(counted.calls(), 3, "copies made to finish a move of 3 objects");
}

#[tokio::test]
async fn a_move_kept_by_a_failed_replay_applies_to_the_crashed_mounts_files_only() {
    let staging = std::env::temp_dir().join(format!("bucketfs-moves-kept-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(dir_for(&staging).unwrap());
    let mem = MemStore::new();
    mem.put("d/x", bytes::Bytes::from_static(b"x"), PutOpts::default()).await.unwrap();
    std::mem::forget(Entry::begin(&staging, "d/", "e/", &["d/x".to_string()]));
    let before = SystemTime::now();
    // The store refuses the copy: the replay fails, and the entry is kept, marked.
    let refusing = bucketfs_store::testing::FailStore::new(
        std::sync::Arc::new(mem),
        bucketfs_store::testing::Op::Copy,
        1,
        u64::MAX,
        StoreErrorKind::PermissionDenied,
    );
    let first = replay(&staging, &refusing).await;
    assert_eq!(first.len(), 1);
    // Every staged file the crashed mount left counts as named before the move ended.
    assert_eq!(moved_key("d/old", before, &first), "e/old");
    let after_first = SystemTime::now() + Duration::from_millis(5);
    let again = replay(&staging, &refusing).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].named_before, first[0].named_before, "the first replay's time is kept");
    assert_eq!(moved_key("d/old", before, &again), "e/old");
    assert_eq!(moved_key("d/new", after_first, &again), "d/new", "a later mount's file was moved");
    let _ = std::fs::remove_dir_all(dir_for(&staging).unwrap());
}

#[tokio::test]
async fn a_file_move_cut_by_a_crash_is_finished_with_one_name() {
    let staging = std::env::temp_dir().join(format!("bucketfs-moves-file-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(dir_for(&staging).unwrap());
    let mem = MemStore::new();
    for (key, body) in [("a/f", "moved"), ("a/f2", "beside")] {
        mem.put(key, bytes::Bytes::from(body), PutOpts::default()).await.unwrap();
    }
    // The crash: journaled and copied, the source not yet deleted.
    std::mem::forget(Entry::begin(&staging, "a/f", "b/g", &["a/f".to_string()]));
    mem.copy("a/f", "b/g").await.unwrap();
    let moved = replay(&staging, &mem).await;
    assert_eq!(moved.iter().map(|m| (m.from.as_str(), m.to.as_str())).collect::<Vec<_>>(), [("a/f", "b/g")]);
    assert_eq!(keys_of(&mem).await, ["a/f2", "b/g"]);
    assert_eq!(&mem.get_range("b/g", 0..5, Default::default()).await.unwrap()[..], b"moved");
    // Kept until recovery acted on it (a crash before then replays it again, harmlessly).
    let again = replay(&staging, &mem).await;
    assert_eq!(again.iter().map(|m| (m.from.as_str(), m.finished)).collect::<Vec<_>>(), [("a/f", true)]);
    assert_eq!(keys_of(&mem).await, ["a/f2", "b/g"]);
    moved.iter().for_each(Move::done);
    assert!(replay(&staging, &mem).await.is_empty(), "the entry went once finished");
}
