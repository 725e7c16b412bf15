//! Directory moves in the store, journaled so a crash never leaves both names.
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
    store.create_dir(to).await?;
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
        match run(store, from, to, &keys, true).await {
            Ok(()) => {
                tracing::warn!(%from, %to, keys = keys.len(), "finished a directory move an earlier mount began");
                let _ = std::fs::remove_file(&path);
            }
            Err(e) => {
                tracing::error!(%from, %to, "cannot finish a directory move an earlier mount began (kept, retried at the next mount): {e}");
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
        if let Some(rest) = key.strip_prefix(from.as_str()) {
            key = format!("{to}{rest}");
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
