//! Moves in the store (directories, and files copied then deleted), journaled so a crash
//! never leaves both names.
//!
//! On a store that cannot move a folder in one request (S3, GCS, a local folder), `mv d d2`
//! copies every key below `d/` to `d2/`, then deletes the sources: a process that dies in
//! between leaves both names in the bucket (and a `kill -9` right after a `mv` of freshly
//! written files did, issue 48). So before the first change a journal entry names the
//! move and its keys, in `.<staging dir name>.moves/` beside the staging directory; it goes
//! once the last source is deleted (or the move fails with an error the caller sees). The next mount of the staging directory finds what a
//! crash left there and finishes each move ([`replay`]) before it serves, and uploads the
//! staged files named below the old directory under the new one ([`moved_key`]): the
//! entry is written before any staged file is renamed, so a crash among those renames
//! never splits a directory between the two names.
//!
//! A file's move (`from` not ending in `/`: copy, then delete) is journaled the same way,
//! its one key being `from` itself, so a crash between the copy and the delete leaves one
//! name too.
//!
//! Finishing is idempotent: a source that is gone was copied (sources go only after every
//! copy), so it is skipped; one still there is copied again, then every source goes.
//! An entry is `from`, `to` and the keys, separated by NUL bytes (no shown key has one).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bucketfs_store::{Store, StoreError, StoreErrorKind, StoreExt};

/// The journal directory of moves for a mount staging in `staging`.
fn dir_for(staging: &Path) -> Option<PathBuf> {
    let name = staging.file_name()?.to_string_lossy();
    Some(staging.with_file_name(format!(".{name}.moves")))
}

/// A journaled move in progress. Its entry goes when this is dropped: at the end, or at an
/// error on the way (the process lives on, and the error says what was done: SEMANTICS.md).
/// Only a process that dies midway leaves the entry, for the next mount to finish.
pub(crate) struct Entry {
    path: Option<PathBuf>,
}

impl Entry {
    /// Journal the move of `keys` (all below `from`) to `to`, on local disk, before any of
    /// it happens. Without a journal (it cannot be written) the move goes on unjournaled,
    /// as before, and says so.
    pub(crate) fn begin(staging: &Path, from: &str, to: &str, keys: &[String]) -> Self {
        let Some(dir) = dir_for(staging) else { return Self { path: None } };
        let mut text = format!("{from}\0{to}");
        for k in keys {
            text.push('\0');
            text.push_str(k);
        }
        let path = dir.join(unique_name());
        let tmp = path.with_extension("tmp");
        let written = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&tmp, text.as_bytes()))
            .and_then(|()| std::fs::rename(&tmp, &path));
        match written {
            Ok(()) => Self { path: Some(path) },
            Err(e) => {
                tracing::warn!(%from, %to, "cannot journal a directory move ({e}): a crash midway leaves both names");
                let _ = std::fs::remove_file(&tmp);
                Self { path: None }
            }
        }
    }
}

impl Entry {
    /// No entry (a store that moves in one request).
    pub(crate) fn none() -> Self {
        Self { path: None }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Some(p) = self.path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Move `keys` (every key below `from`, markers included) to `to`: markers are created and
/// objects copied first, then sources go (objects first, markers deepest first), so a
/// failure midway loses nothing. `began`: finishing a journaled move begun then, where a
/// source already gone was moved before the crash, and one written since (by more than
/// [`CLOCK_SLACK`]) is another file made there later, which stays.
pub(crate) async fn run(
    store: &dyn Store,
    from: &str,
    to: &str,
    keys: &[String],
    began: Option<SystemTime>,
) -> Result<(), StoreError> {
    let gone = |e: &StoreError| e.kind == StoreErrorKind::NotFound;
    let again = began.is_some();
    let (markers, mut objects): (Vec<&String>, Vec<&String>) = keys.iter().partition(|k| k.ends_with('/'));
    if let Some(began) = began {
        let mut journaled = Vec::with_capacity(objects.len());
        for k in objects {
            match store.stat(k).await {
                Ok(m) if m.mtime.is_some_and(|t| t > began + CLOCK_SLACK) => {
                    tracing::warn!(key = %k, "written after the move an earlier mount began: left where it is");
                }
                Err(e) if !gone(&e) => return Err(e),
                _ => journaled.push(k),
            }
        }
        objects = journaled;
    }
    let dir = from.ends_with('/');
    if dir {
        store.create_dir(to).await?;
    }
    let mut sorted_markers = markers.clone();
    sorted_markers.sort_by_key(|k| k.len());
    for k in &sorted_markers {
        store.create_dir(&format!("{to}{}", &k[from.len()..])).await?;
    }
    for k in &objects {
        match store.copy(k, &format!("{to}{}", &k[from.len()..])).await {
            Err(e) if again && gone(&e) => {} // copied before the crash, its source deleted
            r => r?,
        }
    }
    for k in &objects {
        match store.delete(k).await {
            Err(e) if again && gone(&e) => {}
            r => r?,
        }
    }
    for k in sorted_markers.iter().rev() {
        match store.delete(k).await {
            Err(e) if !gone(&e) => return Err(e),
            _ => {}
        }
    }
    if !dir {
        return Ok(()); // the file, its one key, went above
    }
    match store.delete(from).await {
        Err(e) if !gone(&e) => Err(e),
        _ => Ok(()),
    }
}

/// How far the store's clock may be ahead of this machine's when a journaled move's
/// sources are told from files written there since (see [`run`]).
const CLOCK_SLACK: Duration = Duration::from_secs(120);

/// A journaled move: its source and target, and when its entry was written (on the clock
/// of the staging directory's file system).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Move {
    pub from: String,
    pub to: String,
    pub at: SystemTime,
}

/// Finish the moves an earlier mount of `staging` journaled and did not complete (see the
/// module doc). Returns every journaled move, in the order begun, finished or not (a
/// failure is kept for the next try): staged files named below `from` before the move
/// began belong below `to` (the crash fell before they were renamed).
///
/// An entry kept by a failure is tried again at the next mount, maybe much later: a source
/// key written after the move began is another file made there since (by a later mount),
/// and stays ([`run`]'s `began`).
pub(crate) async fn replay(staging: &Path, store: &dyn Store) -> Vec<Move> {
    let mut moves = Vec::new();
    let Some(dir) = dir_for(staging) else { return moves };
    let Ok(entries) = std::fs::read_dir(&dir) else { return moves };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    paths.sort(); // by time: the order they were begun in
    for path in paths {
        if path.extension().is_some_and(|x| x == "tmp") {
            let _ = std::fs::remove_file(&path); // never complete: its move never began
            continue;
        }
        let at = std::fs::metadata(&path).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
        let Ok(text) = std::fs::read(&path).map(String::from_utf8) else { continue };
        let Ok(text) = text else {
            let _ = std::fs::remove_file(&path);
            continue;
        };
        let mut parts = text.split('\0');
        let (Some(from), Some(to)) = (parts.next(), parts.next()) else {
            let _ = std::fs::remove_file(&path);
            continue;
        };
        let keys: Vec<String> = parts.filter(|k| k.starts_with(from)).map(str::to_string).collect();
        let done = if store.capabilities().moves {
            // One request moves the folder (Drive), so it moved whole or not at all. `run`'s
            // create-copy-delete would delete `from`, and deleting a folder there takes
            // everything in it.
            match store.rename(from, to).await {
                Err(e) if e.kind == StoreErrorKind::NotFound => Ok(()), // moved before the crash
                r => r,
            }
        } else {
            run(store, from, to, &keys, Some(at)).await
        };
        match done {
            Ok(()) => {
                tracing::warn!(%from, %to, keys = keys.len(), "finished a move an earlier mount began");
                let _ = std::fs::remove_file(&path);
            }
            Err(e) => {
                tracing::error!(%from, %to, "cannot finish a move an earlier mount began (kept, retried at the next mount): {e}");
            }
        }
        moves.push(Move { from: from.to_string(), to: to.to_string(), at });
    }
    moves
}

/// `key`, named by a staged file's sidecar written at `named`, as it is after the `moves`,
/// applied in order. A move begun before the sidecar was written does not apply: the file
/// was named after it (renamed there by the move itself, or made by a later mount in a
/// directory of the same name while the entry was kept for another try).
pub(crate) fn moved_key(key: &str, named: SystemTime, moves: &[Move]) -> String {
    let mut key = key.to_string();
    for m in moves.iter().filter(|m| named <= m.at) {
        match key.strip_prefix(m.from.as_str()) {
            // A directory's keys below it; a file's key itself only.
            Some(rest) if m.from.ends_with('/') || rest.is_empty() => key = format!("{}{rest}", m.to),
            _ => {}
        }
    }
    key
}

/// An entry's name: sorts by the time it was begun (then process, then a counter).
fn unique_name() -> String {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{nanos:032x}-{:x}-{seq}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bucketfs_store::testing::MemStore;
    use bucketfs_store::{PutOpts, StoreExt};

    fn journaled(from: &str, to: &str, at: SystemTime) -> Move {
        Move { from: from.to_string(), to: to.to_string(), at }
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

    #[test]
    fn a_file_named_after_a_move_began_stays_where_it_was_named() {
        // A move's entry kept by a failed replay: a later mount made d/new in a directory
        // of the same name; its staged bytes belong there, not below the move's target.
        let t = SystemTime::now();
        let moves = vec![journaled("d/", "e/", t)];
        assert_eq!(moved_key("d/old", t - Duration::from_secs(1), &moves), "e/old");
        assert_eq!(moved_key("d/new", t + Duration::from_millis(1), &moves), "d/new");
    }

    #[tokio::test]
    async fn a_kept_move_finished_later_leaves_files_made_since() {
        let mem = MemStore::new();
        for key in ["d/a", "d/b"] {
            mem.put(key, bytes::Bytes::from_static(b"journaled"), PutOpts::default()).await.unwrap();
        }
        let keys = ["d/a".to_string(), "d/b".to_string()];
        // Begun long before the objects were written (by a later mount, after a failed replay).
        let long_ago = SystemTime::now() - Duration::from_secs(3600);
        run(&mem, "d/", "e/", &keys, Some(long_ago)).await.unwrap();
        assert_eq!(&mem.get_range("d/a", 0..9, Default::default()).await.unwrap()[..], b"journaled");
        assert!(mem.stat("e/a").await.is_err(), "a file written since the move began was moved");
        // Begun just now: the same objects are the journaled ones, and move.
        run(&mem, "d/", "e/", &keys, Some(SystemTime::now())).await.unwrap();
        assert!(mem.stat("d/a").await.is_err() && mem.stat("e/a").await.is_ok());
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
        let mut keys: Vec<String> = futures::TryStreamExt::try_collect::<Vec<_>>(mem.list("", true))
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.key)
            .collect();
        keys.sort();
        assert_eq!(keys, ["a/f2", "b/g"]);
        assert_eq!(&mem.get_range("b/g", 0..5, Default::default()).await.unwrap()[..], b"moved");
        assert!(replay(&staging, &mem).await.is_empty(), "the entry went once finished");
    }
}
