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
//! A file move over a staged file not uploaded yet adds an empty part, then `/` and that
//! file's name in the staging directory: the move replaces it, so a replay that finishes
//! the move drops it ([`Move::replaces`]) rather than recover it over the copy. (A part
//! starting with `/` is never taken for a key: no key starts with one.)

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bucketfs_store::{ObjectMeta, Store, StoreError, StoreErrorKind, StoreExt};

/// The journal directory of moves for a mount staging in `staging`.
fn dir_for(staging: &Path) -> Option<PathBuf> {
    let name = staging.file_name()?.to_string_lossy();
    Some(staging.with_file_name(format!(".{name}.moves")))
}

/// Moves an earlier mount staging in `staging` journaled and did not finish: the next
/// mount finishes them in its store, so it must be the same store (the CLI's claim).
pub fn unfinished(staging: &Path) -> usize {
    let entries = dir_for(staging).and_then(|d| std::fs::read_dir(d).ok());
    entries.map_or(0, |d| d.flatten().filter(|e| e.path().extension().is_none_or(|x| x != "tmp")).count())
}

/// The moves an earlier mount of `staging` left unfinished (`from`, `to`, the entry's
/// path), as the mount's replay left them: a mount must not serve while one is (both names would
/// show, and the next replay could copy the old object over a file written meanwhile).
pub fn left(staging: &Path) -> Vec<(String, String, PathBuf)> {
    let Some(entries) = dir_for(staging).and_then(|d| std::fs::read_dir(d).ok()) else { return Vec::new() };
    let mut out = Vec::new();
    for path in entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_none_or(|x| x != "tmp")) {
        let Ok(text) = std::fs::read(&path) else { continue };
        let text = String::from_utf8_lossy(&text);
        let mut parts = text.split('\0');
        if let (Some(from), Some(to)) = (parts.next(), parts.next()) {
            out.push((from.to_string(), to.to_string(), path.clone()));
        }
    }
    out.sort_by(|a, b| a.2.cmp(&b.2));
    out
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
        Self::begin_replacing(staging, from, to, keys, None)
    }

    /// [`Entry::begin`] for a file move over `replaces`, the staged data file (in
    /// `staging`) of a target not uploaded yet.
    pub(crate) fn begin_replacing(
        staging: &Path,
        from: &str,
        to: &str,
        keys: &[String],
        replaces: Option<&Path>,
    ) -> Self {
        let Some(dir) = dir_for(staging) else { return Self { path: None } };
        let mut text = format!("{from}\0{to}");
        for k in keys {
            text.push('\0');
            text.push_str(k);
        }
        if let Some(name) = replaces.and_then(Path::file_name) {
            text.push_str("\0\0/");
            text.push_str(&name.to_string_lossy());
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
/// failure midway loses nothing. `again`: finishing a journaled move (begun at `began`, if
/// known), where a source already gone was moved before the crash. There, a source object
/// written since (by more than [`CLOCK_SLACK`]) is another file made there later, and
/// stays; a target written since is newer than the source (an edit after an earlier
/// replay copied it), and is not copied over.
///
/// `seen`: the version of each object as listed before the move. Such a source goes only
/// while it holds the version copied ([`settle`]): another client's write that lands
/// mid-move is moved too, or stays under the old name, never lost. A source another
/// client deleted meanwhile is left out.
pub(crate) async fn run(
    store: &dyn Store,
    from: &str,
    to: &str,
    keys: &[String],
    seen: &HashMap<String, ObjectMeta>,
    again: bool,
    began: Option<SystemTime>,
) -> Result<(), StoreError> {
    let gone = |e: &StoreError| e.kind == StoreErrorKind::NotFound;
    let (markers, mut objects): (Vec<&String>, Vec<&String>) = keys.iter().partition(|k| k.ends_with('/'));
    let since = |t: Option<SystemTime>| matches!((t, began), (Some(t), Some(b)) if t > b + CLOCK_SLACK);
    let mut copied = std::collections::HashSet::new();
    // Finishing a journaled move, versions unknown: each source's is asked for before its
    // copy, so the copy is checked against it once (a write meanwhile is not lost).
    let mut found: HashMap<String, ObjectMeta> = HashMap::new();
    if again {
        let mut journaled = Vec::with_capacity(objects.len());
        for k in objects {
            match store.stat(k).await {
                Ok(m) if since(m.mtime) => {
                    tracing::warn!(key = %k, "written after the move an earlier mount began: left where it is");
                    continue;
                }
                Ok(m) if !seen.contains_key(k.as_str()) => {
                    found.insert(k.to_string(), m);
                }
                Err(e) if !gone(&e) => return Err(e),
                _ => {}
            }
            journaled.push(k);
            if began.is_none() {
                continue;
            }
            match store.stat(&format!("{to}{}", &k[from.len()..])).await {
                Ok(m) if since(m.mtime) => {
                    copied.insert(k.to_string());
                }
                Err(e) if !gone(&e) => return Err(e),
                _ => {}
            }
        }
        objects = journaled;
    }
    let seen_of = |k: &str| seen.get(k).or_else(|| found.get(k));
    let dir = from.ends_with('/');
    if dir {
        store.create_dir(to).await?;
    }
    let mut sorted_markers = markers.clone();
    sorted_markers.sort_by_key(|k| k.len());
    for k in &sorted_markers {
        store.create_dir(&format!("{to}{}", &k[from.len()..])).await?;
    }
    let target = |k: &str| format!("{to}{}", &k[from.len()..]);
    // Sources whose copy did not happen: deleted meanwhile (or before a crash, once
    // copied), or changed while copied (copied again at their delete, below).
    let (mut vanished, mut uncopied) = (std::collections::HashSet::new(), std::collections::HashSet::new());
    for k in objects.iter().filter(|k| !copied.contains(k.as_str())) {
        match store.copy(k, &target(k)).await {
            Err(e) if gone(&e) => {
                vanished.insert(k.as_str());
            }
            Err(e) if e.kind == StoreErrorKind::Changed && seen_of(k).is_some() => {
                uncopied.insert(k.as_str());
            }
            r => r?,
        }
    }
    for k in objects.iter().filter(|k| !vanished.contains(k.as_str())) {
        match (seen_of(k), copied.contains(k.as_str())) {
            // Its target edited since an earlier replay copied it: the source goes, unless
            // written since it was asked for.
            (Some(m), true) => match store.delete_version(k, m).await {
                Err(e) if e.kind == StoreErrorKind::Changed => {
                    tracing::warn!(key = %k, "written to while its move finished: left under its old name");
                }
                Err(e) if gone(&e) => {}
                r => r?,
            },
            (Some(m), false) => {
                settle(store, k, &target(k), Some(m), !uncopied.contains(k.as_str())).await?;
            }
            // Gone at its stat, and copied before: nothing to delete.
            (None, true) => {}
            // Not found when asked for: copied again if it came back.
            (None, false) => {
                settle(store, k, &target(k), None, false).await?;
            }
        }
    }
    for k in sorted_markers.iter().rev() {
        delete_dir(store, k).await?;
    }
    if !dir {
        return Ok(()); // the file, its one key, went above
    }
    delete_dir(store, from).await
}

/// Delete the directory `key` a move emptied. Where directories are real (a local folder),
/// one that holds a file another client wrote meanwhile, or a source left under its old
/// name, stays with it: a directory that is not empty cannot go.
async fn delete_dir(store: &dyn Store, key: &str) -> Result<(), StoreError> {
    use futures::TryStreamExt;
    if !store.capabilities().prefix_dirs {
        if let Some(m) = store.list(key, false).try_next().await? {
            tracing::info!(dir = %key, holds = %m.key, "a key below it was written or kept during the move: it stays");
            return Ok(());
        }
    }
    match store.delete(key).await {
        Err(e) if e.kind != StoreErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// How many times a source written to during its move is copied again before it is left
/// under its old name ([`settle`]).
const RECOPIES: usize = 3;

/// Move one object from `from` to `to`: delete the source only while it holds the version
/// copied, so a write another client makes during the move is never lost. `seen`: the
/// version listed (else asked for first); `copied`: whether a copy made since that listing
/// succeeded (else one is made).
///
/// A source found in another version at its delete was written since: that version is
/// copied in turn, up to [`RECOPIES`] times; one still changing then stays where it is,
/// with what it holds (a warning names it), and `Ok(false)` says so. A source deleted
/// meanwhile has nothing left to move: `Ok(true)`, as for one moved. An error where no
/// copy was made (every one found the source changing): `Changed`.
pub(crate) async fn settle(
    store: &dyn Store,
    from: &str,
    to: &str,
    seen: Option<&ObjectMeta>,
    copied: bool,
) -> Result<bool, StoreError> {
    let gone = |e: &StoreError| e.kind == StoreErrorKind::NotFound;
    let mut seen = seen.cloned();
    let (mut copies, mut made) = (0, copied);
    loop {
        if let (Some(m), true) = (&seen, made) {
            // A copy made here just after asking for the version is taken to hold it (where
            // copies get new ETags, SSE-KMS on S3, `copy_holds` would never pass); one made
            // before (the caller's) is checked.
            if copies > 0 || copy_holds(store, to, m).await? {
                match store.delete_version(from, m).await {
                    Err(e) if e.kind == StoreErrorKind::Changed => {}
                    r => return r.map(|()| true),
                }
            }
        }
        // Copy the version there now (again, if it changed since).
        loop {
            if copies >= RECOPIES {
                if !made {
                    return Err(StoreError::new(StoreErrorKind::Changed, format!("copy {from:?}: it kept changing")));
                }
                tracing::warn!(key = %from, copy = %to, "written to again and again while it moved: left under its old name, with what it holds now");
                return Ok(false);
            }
            copies += 1;
            seen = match store.stat(from).await {
                Err(e) if gone(&e) => return Ok(true),
                r => Some(r?),
            };
            match store.copy(from, to).await {
                Ok(()) => {
                    made = true;
                    break;
                }
                Err(e) if gone(&e) => return Ok(true),
                Err(e) if e.kind == StoreErrorKind::Changed => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Whether the copy at `to` may hold the version `seen` of its source: false only where the
/// store tells that it holds other bytes. An S3 ETag of a single-request upload is the MD5
/// of the bytes, and a copy keeps it: the same ETag twice may be two versions, the first
/// written back (`A`, then `B`, then `A` again), and a copy made while `B` was there would
/// otherwise pass for `A` and the source's `A` be deleted. (Where a tag names the version
/// itself, a GCS generation, the source's delete condition covers that; a multipart ETag
/// may not survive a copy, and is not compared.)
async fn copy_holds(store: &dyn Store, to: &str, seen: &ObjectMeta) -> Result<bool, StoreError> {
    let Some(md5) = seen.etag_md5() else { return Ok(true) };
    match store.stat(to).await {
        Ok(m) => Ok(m.etag_md5() == Some(md5)),
        Err(e) if e.kind == StoreErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// How far the store's clock may be ahead of this machine's when a journaled move's
/// sources are told from files written there since (see [`run`]).
const CLOCK_SLACK: Duration = Duration::from_secs(120);

/// A journaled move: its source and target, and until when staged files named below its
/// source are the crashed mount's (see [`replay`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Move {
    pub from: String,
    pub to: String,
    pub named_before: SystemTime,
    /// The staged data file (its name in the staging directory) of a target this move
    /// replaced: never recovered over the copy. Dropped once the move is `finished`; kept
    /// back (not uploaded) while it is not, or a later replay would find the target
    /// written since and skip the copy, losing the source.
    pub replaces: Option<String>,
    /// The replay finished the move (else its entry is kept for the next mount).
    pub finished: bool,
    /// A finished move's journal entry: removed by [`Move::done`] once recovery has named
    /// the staged files below it under the target and dropped the replaced ones (a crash
    /// before then replays the move again, which is idempotent).
    entry: Option<PathBuf>,
}

impl Move {
    /// Recovery acted on this move: a finished one's entry goes.
    pub(crate) fn done(&self) {
        if let Some(p) = &self.entry {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// What a kept entry's name gets when a replay first fails: the time of that replay.
const KEPT: &str = ".kept-";

/// Finish the moves an earlier mount of `staging` journaled and did not complete (see the
/// module doc). Returns every journaled move, in the order begun, finished or not (a
/// failure is kept for the next try): staged files the crashed mount left named below
/// `from` belong below `to` (the crash fell before they were renamed).
///
/// An entry kept by a failure is tried again at each mount after, maybe much later. Its
/// name then carries the time of the first replay ([`KEPT`]): staged files named after it
/// are a later mount's and stay where they were named, and so do source objects written
/// after the move began and targets written since ([`run`]'s `began`).
pub(crate) async fn replay(staging: &Path, store: &dyn Store) -> Vec<Move> {
    let mut moves = Vec::new();
    let Some(dir) = dir_for(staging) else { return moves };
    let Ok(entries) = std::fs::read_dir(&dir) else { return moves };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    paths.sort(); // by time: the order they were begun in
    let now = SystemTime::now();
    for path in paths {
        if path.extension().is_some_and(|x| x == "tmp") {
            let _ = std::fs::remove_file(&path); // never complete: its move never began
            continue;
        }
        let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        let began = nanos_at(name.split('-').next().unwrap_or(""));
        let kept = name.split_once(KEPT).and_then(|(_, t)| nanos_at(t));
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
        let mut parts: Vec<&str> = parts.collect();
        let replaces = match parts.iter().position(|p| p.is_empty()) {
            Some(i) => parts.split_off(i).iter().find_map(|p| p.strip_prefix('/')).map(str::to_string),
            None => None,
        };
        let keys: Vec<String> = parts.into_iter().filter(|k| k.starts_with(from)).map(str::to_string).collect();
        let done = if store.capabilities().moves {
            // One request moves the folder (Drive), so it moved whole or not at all. `run`'s
            // create-copy-delete would delete `from`, and deleting a folder there takes
            // everything in it.
            match store.rename(from, to).await {
                Err(e) if e.kind == StoreErrorKind::NotFound => Ok(()), // moved before the crash
                r => r,
            }
        } else {
            run(store, from, to, &keys, &HashMap::new(), true, began).await
        };
        let finished = done.is_ok();
        match done {
            Ok(()) => {
                tracing::warn!(%from, %to, keys = keys.len(), "finished a move an earlier mount began");
            }
            Err(e) => {
                tracing::error!(%from, %to, "cannot finish a move an earlier mount began (kept, retried at the next mount): {e}");
                if kept.is_none() {
                    let stamped = path.with_file_name(format!("{name}{KEPT}{:032x}", nanos_of(now)));
                    if let Err(e) = std::fs::rename(&path, &stamped) {
                        tracing::warn!(%from, %to, "cannot mark a kept move ({e}): files made under its source may be moved by a later mount");
                    }
                }
            }
        }
        moves.push(Move {
            from: from.to_string(),
            to: to.to_string(),
            named_before: kept.unwrap_or(now),
            replaces,
            finished,
            entry: finished.then_some(path),
        });
    }
    moves
}

/// The time a hex count of nanoseconds since the epoch stands for (an entry's name).
fn nanos_at(hex: &str) -> Option<SystemTime> {
    let n = u128::from_str_radix(hex, 16).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_nanos(u64::try_from(n).ok()?))
}

fn nanos_of(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// `key`, named by a staged file's sidecar written at `named`, as it is after the `moves`,
/// applied in order. A move whose entry was kept by an earlier replay does not apply to a
/// sidecar written after that replay: a later mount named that file, in a directory of the
/// same name, and it stays there.
pub(crate) fn moved_key(key: &str, named: SystemTime, moves: &[Move]) -> String {
    let mut key = key.to_string();
    for m in moves.iter().filter(|m| named <= m.named_before) {
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
    let nanos = nanos_of(SystemTime::now());
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{nanos:032x}-{:x}-{seq}", std::process::id())
}

#[cfg(test)]
#[path = "moves_tests.rs"]
mod tests;
