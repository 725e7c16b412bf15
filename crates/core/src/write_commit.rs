//! Commit points. A commit point (close, fsync) makes the bytes as they are the version a
//! crash recovers. Until that version is in the bucket, a later change must not destroy it:
//! the first change after a commit that lands at or past the committed length (an
//! appender) only records the length in the `.open` marker (`base N`: the first N bytes are
//! the committed version); a change inside it first copies the committed bytes to
//! `<file>.base` (in the kernel, with `copy_file_range`). A file the kernel writes unseen
//! (passthrough) is copied at an fsync itself, since its next change cannot be caught
//! before it lands. So a `kill -9` after `fsync` and more writes still uploads the fsync'd
//! version, and the later bytes go to `lost+found`, never over it.

use std::fs::File;
use std::path::PathBuf;

use super::{local, Staged};
use crate::FsError;

/// Where the last committed version is, while the bytes change after it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Base {
    pub(super) len: u64,
    /// `<file>.base` holds it; otherwise the data file's first `len` bytes still do.
    copied: bool,
    /// Committed by an fsync: its copy reaches the disk before the data file changes.
    synced: bool,
}

/// What tells us a file changed without seeing the change: its length and mtime (Linux
/// 6.13+ gives a change after a query a distinct timestamp: multigrain timestamps).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Stamp {
    pub(super) len: u64,
    mtime_ns: i128,
}

impl Stamp {
    pub(crate) fn of(file: &File) -> Result<Self, FsError> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata().map_err(local)?;
        Ok(Self { len: m.len(), mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128 })
    }

    /// The `.open` marker's text for "committed as of this state" (see [`crate::recovery::recover`]).
    pub(crate) fn marker(&self) -> String {
        format!("{} {}", self.len, self.mtime_ns)
    }
}

impl Staged {
    pub(super) fn open_path(&self) -> PathBuf {
        self.path.with_extension("open")
    }

    pub(super) fn base_path(&self) -> PathBuf {
        self.path.with_extension("base")
    }

    /// The bytes are about to change from offset `from` on (`None`: they already changed,
    /// somewhere: the kernel wrote them): from now until the next [`Staged::commit`] they
    /// are not a version a close returned for, and crash recovery must not upload them. The
    /// last committed version stays recoverable (module doc): as the data file's prefix
    /// while the change lands past it, else as a copy made first.
    pub(super) fn mark_open(&mut self, from: Option<u64>) -> Result<(), FsError> {
        // After an fsync the marker reaches the disk before the bytes change: a power cut
        // that kept the change but lost the marker would upload unclosed bytes.
        let synced = self.base.is_some_and(|b| b.synced);
        if let Some(b) = self.base.filter(|b| !b.copied) {
            match from {
                Some(at) if at >= b.len => {}
                Some(_) => self.copy_base(b)?,
                None => self.base = None, // changed already: nothing left to keep
            }
        }
        let text = match self.base {
            Some(Base { len, copied: false, .. }) => format!("base {len}"),
            // Any text but a stamp or `base N` says "open" (a `.base` beside it, if any, is
            // the committed version). Not empty: emptying a spare frees its block.
            _ => "open".to_string(),
        };
        if !self.open_marked || self.open_text.as_deref() != Some(&text) {
            crate::recycle::write(&self.open_path(), text.as_bytes()).map_err(local)?;
            if synced {
                self.sync_marker().map_err(local)?;
            }
            self.open_marked = true;
            self.marked_as = None;
            self.open_text = Some(text);
        }
        Ok(())
    }

    fn sync_marker(&self) -> std::io::Result<()> {
        File::open(self.open_path())?.sync_all()?;
        self.sync_dir()
    }

    /// Sync the staging directory: the entries naming the file and its sidecars.
    pub(super) fn sync_dir(&self) -> std::io::Result<()> {
        match self.path.parent() {
            Some(dir) => File::open(dir)?.sync_all(),
            None => Ok(()),
        }
    }

    /// Copy the committed version (the data file's first `b.len` bytes) to `<file>.base`,
    /// before a change would overwrite it. Through a temporary, so recovery sees it whole
    /// or not at all; synced first when an fsync committed it.
    pub(super) fn copy_base(&mut self, b: Base) -> Result<(), FsError> {
        let tmp = self.path.with_extension("basetmp");
        let copy = || -> std::io::Result<()> {
            std::fs::copy(&self.path, &tmp)?; // copy_file_range: no bytes through user space
            let f = File::options().write(true).open(&tmp)?;
            f.set_len(b.len)?;
            if b.synced {
                f.sync_all()?;
            }
            std::fs::rename(&tmp, self.base_path())?;
            if b.synced {
                self.sync_dir()?;
            }
            Ok(())
        };
        if let Err(e) = copy() {
            let _ = std::fs::remove_file(&tmp);
            return Err(local(e));
        }
        self.base = Some(Base { copied: true, ..b });
        Ok(())
    }

    /// The bytes as they are are a version still to go up (sent again after a cut-off
    /// upload): kept aside before a change, as after a commit; and, if an fsync committed
    /// them, still synced ahead of every change, as after that fsync.
    pub(super) fn keep_as_committed(&mut self) {
        self.forget_base();
        self.base = Some(Base { len: self.size, copied: false, synced: self.fsynced });
    }

    /// Clean, and kept for a late-landing watch (late.rs) on `key`: the bytes as they are
    /// stay a version still to go up. Their key stays named, so a crash before the watch
    /// ends sends them again, but only over an older upload landed late: `note` (the tag
    /// of this version's upload, the MD5s of the cut-off uploads) goes in a `.late`
    /// sidecar for recovery to check first, which leaves alone an object another client
    /// wrote or deleted since (tester L). A change keeps them aside first (at once for a
    /// file the kernel writes unseen), so they can go up over a late landing while a
    /// writer has the file open ([`Staged::closed_copy`]). Before, a `kill -9` while a
    /// writer had the file open left the late, older bytes in the bucket for good (tester K).
    pub fn keep_for_late(&mut self, key: &str, note: &LateNote) -> Result<(), FsError> {
        crate::recycle::write(&self.late_path(), note.to_text().as_bytes()).map_err(local)?;
        if self.key.as_deref() != Some(key) {
            crate::recycle::write(&self.key_path(), key.as_bytes()).map_err(local)?;
            self.key = Some(key.to_string());
        }
        self.keep_as_committed();
        match self.base.filter(|_| self.seen.is_some()) {
            Some(b) if b.len > 0 => self.copy_base(b),
            _ => Ok(()),
        }
    }

    pub(super) fn late_path(&self) -> PathBuf {
        self.path.with_extension("late")
    }

    /// The last committed version while the bytes changed after it: a file holding it
    /// (its `.base` copy, made now if the data file still holds it), and its length.
    /// `None` if none is kept (changed unseen: the kernel wrote it).
    pub fn closed_copy(&mut self) -> Result<Option<(File, u64)>, FsError> {
        let Some(b) = self.base else { return Ok(None) };
        if !b.copied {
            self.copy_base(b)?;
        }
        let f = File::open(self.base_path()).map_err(local)?;
        Ok(Some((f, b.len)))
    }

    /// An fsync found the committed version as it is (queued, through a handle that did not
    /// write), and synced it: from now on it is kept synced ahead of every change, as after
    /// the fsync that committed it.
    pub(crate) fn fsynced_as_is(&mut self) {
        if self.committed() {
            self.fsynced = true;
            if let Some(b) = self.base.as_mut() {
                b.synced = true;
            }
        }
    }

    /// Whether the version kept aside before a change was committed by an fsync.
    #[cfg(test)]
    pub(crate) fn keeps_synced(&self) -> bool {
        self.base.is_some_and(|b| b.synced)
    }

    /// Someone is about to change the bytes unseen (a writer the kernel serves from this
    /// file: passthrough): copy the committed version not yet in the bucket, if any, now.
    pub fn keep_committed(&mut self) -> Result<(), FsError> {
        match self.base.filter(|b| !b.copied) {
            Some(b) if b.len > 0 => self.copy_base(b),
            _ => Ok(()),
        }
    }

    /// The mode, owner and mtime the upload is to carry, and another client's metadata (`a`,
    /// empty: none), in a `.attrs` sidecar, so a crash recovers them with the bytes (an
    /// executable stays one). Written only when they change; for a file with a key (one
    /// whose bytes go up).
    pub fn keep_attrs(&mut self, a: &bucketfs_store::FileAttrs) -> Result<(), FsError> {
        if self.key.is_none()
            || self.unlinked
            || self.attrs_kept.as_ref() == Some(a)
            || a.is_empty() && self.attrs_kept.is_none()
        {
            return Ok(());
        }
        if a.is_empty() {
            self.forget_attrs();
            return Ok(());
        }
        crate::recycle::write(&self.attrs_path(), a.to_lines().as_bytes()).map_err(local)?;
        self.attrs_kept = Some(a.clone());
        Ok(())
    }

    pub(super) fn forget_attrs(&mut self) {
        if self.attrs_kept.take().is_some() {
            let _ = crate::recycle::remove(&self.attrs_path());
        }
    }

    fn attrs_path(&self) -> PathBuf {
        self.path.with_extension("attrs")
    }

    /// The committed version is in the bucket (or will never be uploaded): no copy kept.
    pub(super) fn forget_base(&mut self) {
        if self.base.take().is_some_and(|b| b.copied) {
            let _ = std::fs::remove_file(self.base_path());
        }
    }

    /// A commit point (close): the bytes as they are now are what a crash recovers.
    pub fn commit(&mut self) -> Result<(), FsError> {
        self.commit_as(false, false)
    }

    /// A commit point; `fsync`: the caller syncs the file to disk. `keep`: the version must
    /// survive the writes that may follow, so a file the kernel writes unseen is copied now
    /// (at an fsync; and at a close beside another handle that may write it through the
    /// kernel before this version is uploaded: its marker alone would then no longer
    /// match, and a crash would lose the version the close returned for).
    pub fn commit_as(&mut self, fsync: bool, keep: bool) -> Result<(), FsError> {
        // A close right after an fsync, nothing changed between (every change marks the
        // file open; the kernel's are found by `observe`, run before each commit point),
        // commits the fsync'd version again: it stays synced ahead of later changes.
        let fsync = fsync || self.fsynced && !self.open_marked && !self.trunc_pending;
        // The file on disk must hold exactly the committed bytes: recovery uploads it whole.
        self.settle()?;
        if fsync {
            // The bytes reach the disk before the marker that said "not committed" (or the
            // copy of the version before) goes: a power cut between must not leave a file
            // that says "committed" over bytes half old, half new.
            self.file.sync_data().map_err(local)?;
        }
        if self.seen.is_some() {
            self.mark_committed_as_is()?;
        } else if self.open_marked {
            crate::recycle::remove(&self.open_path()).map_err(local)?;
            self.open_marked = false;
            self.marked_as = None;
            self.open_text = None;
        }
        // The marker says "committed" now: an older version's copy is obsolete, and so is
        // the note that this one was kept for a late landing (it goes up as any other).
        self.forget_base();
        let _ = std::fs::remove_file(self.late_path());
        self.fsynced = fsync;
        let b = Base { len: self.size, copied: false, synced: fsync };
        self.base = Some(b);
        if keep && self.seen.is_some() {
            self.copy_base(b)?;
        }
        Ok(())
    }

    /// For a file the kernel may change unseen: the marker says "committed as of this
    /// length and mtime" instead of going away, so recovery uploads the file only if
    /// nothing changed it since (a change we did not see yet would make it a torn version).
    ///
    /// The stamp is the one last compared ([`Staged::observe`]), not a new one: a kernel
    /// write landing after that check was not part of what the caller uploaded or
    /// committed, so it must still show as a change at the next `observe`.
    pub(super) fn mark_committed_as_is(&mut self) -> Result<(), FsError> {
        let now = match self.seen {
            Some(seen) => seen,
            None => Stamp::of(&self.file)?,
        };
        self.seen = Some(now);
        if self.open_marked || self.marked_as != Some(now) {
            match crate::recycle::write(&self.open_path(), now.marker().as_bytes()) {
                Ok(()) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) => {
                    // No room for the stamp: no marker says "committed" too (recovery's
                    // `Committed::Whole`), and removing one takes no room. Before, the
                    // version could not be committed, so not uploaded, until the staging
                    // disk had room, which it held itself (tester I). Left: the kernel's
                    // writes after this, with a crash before the next commit point, would
                    // count as committed (with the disk full they fail).
                    tracing::warn!(path = %self.path.display(), "the staging disk is full: the commit's marker removed, not written");
                    match std::fs::remove_file(self.open_path()) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(local(e)),
                        _ => {}
                    }
                }
                Err(e) => return Err(local(e)),
            }
            self.open_marked = false;
            self.marked_as = Some(now);
            self.open_text = None;
        }
        Ok(())
    }
}

/// Why a staged copy was kept for a late landing (`<file>.late`): the tag of its version's
/// upload and the MD5s of the cut-off uploads that may land over it. Crash recovery sends
/// the copy again only if one of those landed (`late::landed`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LateNote {
    pub ours: Option<String>,
    pub md5s: Vec<[u8; 16]>,
}

impl LateNote {
    pub(crate) fn to_text(&self) -> String {
        let mut t = format!("ours {}\n", self.ours.as_deref().unwrap_or("-"));
        for m in &self.md5s {
            t.push_str(&format!("md5 {}\n", m.iter().map(|b| format!("{b:02x}")).collect::<String>()));
        }
        t
    }

    pub(crate) fn parse(text: &str) -> Self {
        let mut note = LateNote::default();
        for line in text.lines() {
            if let Some(tag) = line.strip_prefix("ours ") {
                note.ours = (tag != "-").then(|| tag.to_string());
            } else if let Some(m) = line.strip_prefix("md5 ").and_then(bucketfs_store::parse_md5_hex) {
                note.md5s.push(m);
            }
        }
        note
    }
}
