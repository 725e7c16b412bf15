//! Crash recovery of the staging area: what a mount that died (or whose uploads kept
//! failing at unmount) left staged is uploaded by the next mount of the same staging
//! directory before it serves (see [`crate::write`] for the sidecars and markers read here).
//!
//! For each staged data file with a `.key` sidecar: of two naming one key, the one named
//! last wins (a rename over a file not uploaded yet); a key below a directory whose move a
//! crash cut short is named below its new place (`moves.rs`); then the `.open`
//! marker says what is a committed version (`Committed`): it is uploaded, and bytes
//! written after it, never closed, go to `<staging>/lost+found/`, never to the bucket.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use bucketfs_store::{Store, WriteOptions};

use crate::part_budget::PartBudget;
use crate::write::{local, remove_staged, set_aside, Stamp, SIDECARS};
use crate::FsError;

/// The tag of this mount point's temporary objects in the bucket (parts of uploads, tails
/// of appends): its host and staging directory, which one process at a time holds (the
/// staging lock), so the next mount of it may delete what a crash left (`Fs::recover_staged`).
pub fn parts_owner(staging_dir: &Path) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let dir = std::fs::canonicalize(staging_dir).unwrap_or_else(|_| staging_dir.to_path_buf());
    let id = format!("{}\0{}", host.trim(), dir.display());
    format!("m{:08x}", crc32c::crc32c(id.as_bytes()))
}

/// Upload what a crashed (or failed) earlier mount left staged in `dir`; returns the keys
/// uploaded and the keys that still failed, each with why in parentheses (their files stay
/// for the next try: the caller must not serve meanwhile, or a later mount would upload them
/// over newer versions). An upload the store refuses for good (the key's name) and a staged
/// file that cannot be read go to `lost+found`.
/// `moved`: directory moves a crash cut short (moves.rs): a sidecar naming a key below a
/// move's source names it below its target.
pub(crate) async fn recover(
    dir: &Path,
    store: &dyn Store,
    opts: WriteOptions,
    budget: &PartBudget,
    moved: &[crate::moves::Move],
) -> (Vec<String>, Vec<String>) {
    let (mut done, mut failed) = (Vec::new(), Vec::new());
    // The staged bytes of a target a rename replaced, where the crash fell before they were
    // dropped (during the copy): once the move is finished it holds the name, and they never
    // go up; until then they are kept back, neither uploaded nor dropped (`Move::replaces`).
    let mut held_back = std::collections::HashSet::new();
    for (m, name) in moved.iter().filter_map(|m| Some((m, m.replaces.as_deref()?))) {
        let data = dir.join(name);
        if name.contains('/') || data.extension().is_none_or(|x| x != "data") || !data.exists() {
            continue;
        }
        if m.finished {
            tracing::info!(from = %m.from, to = %m.to, "staged bytes replaced by a rename a crash cut short: dropped");
            remove_staged(&data, true);
        } else {
            held_back.insert(data);
        }
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return (done, failed) };
    // key -> (its newest sidecar's mtime, data file)
    let mut newest: HashMap<String, (std::time::SystemTime, PathBuf)> = HashMap::new();
    for e in entries.flatten() {
        let data = e.path();
        if data.extension().and_then(|x| x.to_str()) != Some("data") {
            continue;
        }
        let key_file = data.with_extension("key");
        let (Ok(key), Ok(meta)) = (std::fs::read_to_string(&key_file), std::fs::metadata(&key_file)) else {
            let _ = std::fs::remove_file(&data); // never dirty: nothing to recover
            let _ = std::fs::remove_file(data.with_extension("open"));
            continue;
        };
        let at = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
        if held_back.contains(&data) {
            tracing::error!(%key, "staged bytes a rename replaced, kept until the next mount finishes that rename");
            failed.push(format!("{key} (replaced by a rename not finished yet)"));
            continue;
        }
        let named = crate::moves::moved_key(&key, at, moved);
        if named != key {
            // Named under the move's target on disk too: a finished move's entry is gone by
            // the next mount, and a file not uploaded now must not go up under the old name.
            rename_staged(&key_file, &named, at);
        }
        let key = named;
        // Two staged files name one key only when a crash fell inside a rename over a file
        // not yet uploaded (the source names the key before the target is dropped): the
        // one named last is the file that now has the name; the other was replaced.
        let older = match newest.get(&key) {
            Some((t, _)) if *t > at => Some(data.clone()),
            Some(_) => newest.insert(key.clone(), (at, data.clone())).map(|(_, d)| d),
            None => {
                newest.insert(key.clone(), (at, data.clone()));
                None
            }
        };
        if let Some(old) = older {
            tracing::info!(%key, "staged bytes replaced by a rename before the crash: dropped");
            remove_staged(&old, true);
        }
    }
    // Once the store fails as a whole (down, hanging, throttling), the other files are not
    // tried: each would wait out the same timeouts, and the mount is refused anyway.
    let mut store_failing = false;
    for (key, (_, data)) in newest {
        if store_failing {
            failed.push(format!("{key} (not tried)"));
            continue;
        }
        let base_file = data.with_extension("base");
        // What to upload: the file, or the last committed version a later change kept
        // (its first `len` bytes, or its `.base` copy: see the module doc).
        let (source, len) = match committed_on_disk(&data) {
            Committed::Whole => (data.clone(), None),
            Committed::Prefix(n) => (data.clone(), Some(n)),
            Committed::Open if base_file.exists() => (base_file.clone(), None),
            Committed::Open => {
                // Changed after its last close or fsync, no committed version kept: no
                // version anyone closed, so never uploaded over what the bucket holds.
                // Kept for the user, and said so.
                set_aside(dir, &data, &key, "written but never closed before the mount stopped");
                continue;
            }
        };
        // Kept only for a late landing (uploaded already, then watched: `.late`): sent
        // again only over an older upload of ours that landed; an object another client
        // wrote or deleted since stays as it is (tester L: recovery overwrote it).
        if let Ok(text) = std::fs::read_to_string(data.with_extension("late")) {
            let note = crate::write::LateNote::parse(&text);
            match crate::late::landed(store, &key, &note.md5s, note.ours.as_deref()).await {
                Ok(Some(_)) => {
                    tracing::warn!(%key, "an older upload landed over a version closed before the crash: sent again")
                }
                Ok(None) => {
                    // In the bucket already, or replaced or deleted since.
                    finish_committed(dir, &data, &key, source != data || len.is_some());
                    continue;
                }
                Err(e) => {
                    tracing::error!(%key, "cannot check the bucket for a late landing over staged data: {e}");
                    store_failing |= !refused_for_good(e.kind);
                    failed.push(format!("{key} ({e})"));
                    continue;
                }
            }
        }
        // Made with O_EXCL and never uploaded: create-only here too, never over an object
        // another writer made meanwhile.
        let excl_file = data.with_extension("excl");
        let excl = std::fs::read_to_string(&excl_file).ok();
        let mut create_only = excl.is_some();
        // The tag its create-only tries carried (`Staged::excl_tag`): an object with it is
        // one of them, landed though its answer was lost.
        let tag = excl.as_deref().and_then(|t| t.lines().nth(1)).and_then(|t| u128::from_str_radix(t, 16).ok());
        let (key_ref, source_ref, data_ref) = (&key, &source, &data);
        let (budget_ref, opts) = (&budget, &opts);
        let send = |create_only: bool| async move {
            let (key, source, data, budget) = (key_ref, source_ref, data_ref, budget_ref);
            let file = File::open(source).map_err(local)?;
            let size = file.metadata().map_err(local)?.len();
            let size = len.map_or(size, |n| n.min(size));
            let _share = budget.upload(size, opts).await;
            let mut opts = opts.clone();
            opts.put.if_not_exists |= create_only;
            // The mode, owner and mtime the crashed mount's upload would have carried.
            if let Ok(text) = std::fs::read_to_string(data.with_extension("attrs")) {
                opts.put.attrs = bucketfs_store::FileAttrs::from_lines(&text);
            }
            opts.put.attrs.created_by = tag.filter(|_| create_only);
            crate::write::send_whole(store, key, &file, size, &opts).await
        };
        let result = loop {
            let r = send(create_only).await;
            match &r {
                Err(FsError::Store(e))
                    if create_only
                        && e.kind == bucketfs_store::StoreErrorKind::Exists
                        && crate::write::landed_here(store, &key, tag).await =>
                {
                    // One of this file's own create-only tries (its answer lost, or cut off
                    // by the crash) made the object: the promise was kept, and this version
                    // goes up over it as an ordinary file's.
                    tracing::info!(%key, "the object is an earlier create-only try of this file: sent again over it");
                    create_only = false;
                }
                _ => break r,
            }
        };
        match result {
            Ok(_) if source != data || len.is_some() => {
                tracing::info!(%key, "uploaded the version committed (closed or fsync'd) before the crash");
                finish_committed(dir, &data, &key, true);
                done.push(key);
            }
            Ok(_) => {
                finish_committed(dir, &data, &key, false);
                done.push(key);
            }
            Err(FsError::Store(e)) if create_only && e.kind == bucketfs_store::StoreErrorKind::Exists => {
                tracing::error!(%key, "created with O_EXCL, but another writer made this object before the recovered upload: not replaced; the bytes go to lost+found");
                if !keep_aside(dir, &data, &source, &key) {
                    failed.push(format!("{key} (cannot be set aside)"));
                }
            }
            // Refused for this key for good (its name): kept for the user, not retried at
            // every mount.
            Err(FsError::Store(e)) if refused_for_good(e.kind) => {
                tracing::error!(%key, "the store refuses the staged data an earlier mount left: {e}; the bytes go to lost+found");
                if !keep_aside(dir, &data, &source, &key) {
                    failed.push(format!("{key} ({e})"));
                }
            }
            // The staged file itself cannot be read: kept for the user (no store will help).
            Err(e @ FsError::Local(_)) => {
                tracing::error!(%key, "cannot read the staged data an earlier mount left: {e}; moved to lost+found");
                if !keep_aside(dir, &data, &source, &key) {
                    failed.push(format!("{key} ({e})"));
                }
            }
            Err(e) => {
                tracing::error!(%key, "recovered staged data still cannot be uploaded: {e}");
                store_failing |= matches!(&e, FsError::Store(e) if !refused_for_good(e.kind));
                failed.push(format!("{key} ({e})"));
            }
        }
    }
    sweep_orphans(dir); // (what it finds lost is logged: nothing is left to upload)
    (done, failed)
}

/// Move a staged file that will not be uploaded to `lost+found`: the committed version
/// (`source`, the `.base` copy where it is not the data file) first, then the bytes written
/// after it. Whether the committed version is kept there.
fn keep_aside(dir: &Path, data: &Path, source: &Path, key: &str) -> bool {
    let kept = set_aside(dir, source, key, "the version last closed; the error above says why");
    if kept && source != data {
        set_aside(dir, data, key, "written after the last close or fsync, before the mount stopped");
    }
    kept
}

/// Make the sidecar `key_file` name `key`, keeping its time (`at`: what orders two sidecars
/// naming one key, and moves kept by a failed replay).
fn rename_staged(key_file: &Path, key: &str, at: std::time::SystemTime) {
    let tmp = key_file.with_extension("tmp");
    let done = std::fs::write(&tmp, key)
        .and_then(|()| File::options().write(true).open(&tmp)?.set_modified(at))
        .and_then(|()| std::fs::rename(&tmp, key_file));
    if let Err(e) = done {
        tracing::warn!(%key, "cannot name a staged file under its moved directory: {e}");
        let _ = std::fs::remove_file(&tmp);
    }
}

/// An upload refused for this key whatever the retries: kept aside, not tried again.
fn refused_for_good(kind: bucketfs_store::StoreErrorKind) -> bool {
    use bucketfs_store::StoreErrorKind::*;
    // Not a denied permission: read-only or expired credentials deny every key alike, and
    // the files must wait for credentials that can write, not go to lost+found.
    matches!(kind, InvalidName | Unsupported)
}

/// Remove what a crash left beside no staged data: a sidecar whose data file went (the
/// disk cache took it, or it was removed) and a sidecar's temporary. Before serving only.
fn sweep_orphans(dir: &Path) -> Vec<String> {
    let mut lost = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let orphan = match p.extension().and_then(|x| x.to_str()) {
            Some("tmp" | "basetmp") => true,
            Some(x) if SIDECARS.contains(&x) => !p.with_extension("data").exists(),
            _ => false,
        };
        if !orphan || !e.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        if p.extension().is_some_and(|x| x == "key") {
            lost.extend(lost_data(dir, &p));
        }
        tracing::debug!(path = %p.display(), "left by a crash beside no staged data: removed");
        let _ = std::fs::remove_file(&p);
    }
    lost
}

/// A key sidecar with no data beside it: bucketfs removes the key first and moves bytes
/// to `lost+found` before dropping it, so the data was removed by something else (a clean-up
/// of the staging directory), and a version not uploaded yet is lost. Said, naming the key.
fn lost_data(dir: &Path, key_file: &Path) -> Option<String> {
    let key = std::fs::read_to_string(key_file).ok()?;
    // Set aside, the crash falling before its sidecars went: the bytes are in lost+found.
    let found = dir.join("lost+found");
    let aside = std::fs::read_dir(&found).into_iter().flatten().flatten().any(|e| {
        let p = e.path();
        p.extension().is_some_and(|x| x == "key") && std::fs::read_to_string(&p).is_ok_and(|k| k == key)
    });
    if aside {
        return None;
    }
    tracing::error!(%key, dir = %dir.display(), "staged data missing (removed from the staging directory by something else): if its last version was not uploaded yet, it is lost; check the bucket");
    Some(key)
}

/// What staged file `data` holds, by its `.open` marker.
#[derive(Debug, PartialEq)]
enum Committed {
    /// A committed version: no marker, or one naming exactly the file's current length and
    /// mtime (a file the kernel wrote directly: [`Staged::mark_committed_as_is`]).
    Whole,
    /// Its first N bytes are the last committed version; bytes past them came after (`base N`).
    Prefix(u64),
    /// Changed since its last commit point (any other text); a `.base` beside it, if there
    /// is one, holds the last committed version.
    Open,
}

/// The committed version of staged `data` (for `key`) needs no upload any more (sent, or
/// in the bucket already): the staged file goes; bytes written after that version
/// (`later`) were never committed, and are kept aside in lost+found, not uploaded.
fn finish_committed(dir: &Path, data: &Path, key: &str, later: bool) {
    if later {
        set_aside(dir, data, key, "written after the last close or fsync, before the mount stopped");
        let _ = std::fs::remove_file(data.with_extension("base"));
    } else {
        remove_staged(data, true);
    }
}

fn committed_on_disk(data: &Path) -> Committed {
    let Ok(marker) = std::fs::read_to_string(data.with_extension("open")) else { return Committed::Whole };
    if let Some(n) = marker.strip_prefix("base ").and_then(|n| n.trim().parse().ok()) {
        return Committed::Prefix(n);
    }
    let now = File::open(data).map(|f| Stamp::of(&f));
    match !marker.is_empty() && matches!(now, Ok(Ok(s)) if s.marker() == marker) {
        true => Committed::Whole,
        false => Committed::Open,
    }
}

#[cfg(test)]
mod lost_tests {
    /// Tester R: a pending file whose staged data was removed by hand (its key sidecar
    /// left) vanished at the next mount with no trace. It is named now; a key whose bytes a
    /// crash left set aside in lost+found is not.
    #[test]
    fn a_key_sidecar_without_its_data_is_named_as_lost() {
        let dir = std::env::temp_dir().join(format!("bucketfs-lost-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("lost+found")).unwrap();
        std::fs::write(dir.join("1.key"), "a/gone").unwrap();
        std::fs::write(dir.join("1.open"), "").unwrap();
        std::fs::write(dir.join("2.key"), "b/aside").unwrap();
        std::fs::write(dir.join("lost+found/9-aside.key"), "b/aside").unwrap();
        std::fs::write(dir.join("3.key"), "c/here").unwrap();
        std::fs::write(dir.join("3.data"), "bytes").unwrap();
        assert_eq!(super::sweep_orphans(&dir), ["a/gone"]);
        assert!(!dir.join("1.key").exists() && !dir.join("1.open").exists() && !dir.join("2.key").exists());
        assert!(dir.join("3.key").exists(), "a key beside its data stays");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
