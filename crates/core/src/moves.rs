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

use bucketfs_store::{Store, StoreError, StoreErrorKind};

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
/// failure midway loses nothing. `again`: finishing a journaled move, where a source
/// already gone was moved before the crash.
pub(crate) async fn run(
    store: &dyn Store,
    from: &str,
    to: &str,
    keys: &[String],
    again: bool,
) -> Result<(), StoreError> {
    let gone = |e: &StoreError| e.kind == StoreErrorKind::NotFound;
    let (markers, objects): (Vec<&String>, Vec<&String>) = keys.iter().partition(|k| k.ends_with('/'));
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

/// Finish the moves an earlier mount of `staging` journaled and did not complete (see the
/// module doc). Returns every journaled move (from, to), in the order begun, finished or
/// not (a failure is kept for the next try): staged files still named below `from` belong
/// below `to` (the crash fell before they were renamed).
pub(crate) async fn replay(staging: &Path, store: &dyn Store) -> Vec<(String, String)> {
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
            run(store, from, to, &keys, true).await
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
        moves.push((from.to_string(), to.to_string()));
    }
    moves
}

/// `key` as it is after the `moves` (from, to), applied in order.
pub(crate) fn moved_key(key: &str, moves: &[(String, String)]) -> String {
    let mut key = key.to_string();
    for (from, to) in moves {
        match key.strip_prefix(from.as_str()) {
            // A directory's keys below it; a file's key itself only.
            Some(rest) if from.ends_with('/') || rest.is_empty() => key = format!("{to}{rest}"),
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

    #[test]
    fn a_file_move_renames_that_key_only() {
        let moves = vec![("a/f".to_string(), "b/g".to_string()), ("d/".to_string(), "e/".to_string())];
        assert_eq!(moved_key("a/f", &moves), "b/g");
        assert_eq!(moved_key("a/f2", &moves), "a/f2");
        assert_eq!(moved_key("a/f/x", &moves), "a/f/x");
        assert_eq!(moved_key("d/x/y", &moves), "e/x/y");
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
        assert_eq!(replay(&staging, &mem).await, [("a/f".to_string(), "b/g".to_string())]);
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
