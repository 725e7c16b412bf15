//! The sidecars that name a staged file's object for crash recovery: its key (`.key`),
//! whether its upload is create-only (`.excl`), and when the key was written; and the
//! bytes set aside in `lost+found` instead of uploaded.

use super::*;

impl Staged {
    /// Record which key these bytes belong to, for recovery after a crash. Called on the
    /// first change and on rename. The first key comes with the `.open` marker (made
    /// before it): until a commit point the bytes are no closed version. Never for a file
    /// unlinked ([`Staged::drop_key`]): a change through a handle still open named its old
    /// key again, and a crash brought the removed file back.
    pub fn set_key(&mut self, key: &str) -> Result<(), FsError> {
        if self.key.as_deref() == Some(key) || self.unlinked {
            return Ok(());
        }
        if self.key.is_none() {
            self.mark_open(Some(u64::MAX))?; // where the change lands, it says itself
        }
        crate::recycle::write(&self.key_path(), key.as_bytes()).map_err(local)?;
        let first = self.key.is_none();
        self.key = Some(key.to_string());
        if first && self.create_only {
            self.mark_excl(true);
        }
        Ok(())
    }

    /// Whether the next upload is create-only (see the field).
    pub fn create_only(&self) -> bool {
        self.create_only
    }

    /// Make the next upload create-only, or not; crash recovery learns it from the
    /// `<file>.excl` sidecar (a recovered upload of an `O_EXCL` file never replaces an
    /// object another writer made meanwhile).
    pub fn set_create_only(&mut self, on: bool) {
        if on && self.excl_tag.is_none() {
            self.excl_tag = Some(bucketfs_store::new_create_tag());
        }
        if self.create_only != on {
            self.create_only = on;
            if self.key.is_some() {
                self.mark_excl(on);
            }
        }
    }

    pub(super) fn mark_excl(&self, on: bool) {
        let path = self.path.with_extension("excl");
        // `O_EXCL`, then the tag its tries carry (`Staged::excl_tag`), for recovery's.
        let text = format!("O_EXCL\n{:032x}\n", self.excl_tag.unwrap_or_default());
        let done = if on { crate::recycle::write(&path, text.as_bytes()) } else { crate::recycle::remove(&path) };
        if let Err(e) = done.or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) }) {
            tracing::warn!(key = ?self.key, on, "cannot mark the staged file create-only for crash recovery: {e}");
        }
    }

    /// These bytes will never be uploaded (unlinked, or replaced by a rename): drop the
    /// sidecar, so crash recovery does not upload them either, even while handles hold them.
    pub fn drop_key(&mut self) {
        let _ = crate::recycle::remove(&self.key_path());
        if self.create_only {
            self.mark_excl(false);
        }
        let _ = crate::recycle::remove(&self.open_path());
        self.open_marked = false;
        self.marked_as = None;
        self.forget_attrs();
        self.forget_base();
        let _ = std::fs::remove_file(self.late_path());
    }

    /// Leaving the staging map with nothing the bucket lacks (clean): crash recovery has
    /// nothing of these bytes to upload, so the sidecars go now, not when the last reference
    /// does (the FUSE adapter may hold the file a while for the kernel's passthrough). Out
    /// of the map, a rename or unlink no longer finds this file to rename or drop them, and
    /// a crash in that window uploaded the bytes under the old name again: the renamed or
    /// deleted file came back (test_rename_of_an_uploaded_file_right_before_kill_9).
    pub fn leave_clean(&mut self) {
        if self.dirty || self.key.is_none() && !self.open_marked {
            return;
        }
        self.drop_key();
        self.key = None;
        self.open_text = None;
    }

    /// When the sidecar naming the key was last written.
    pub fn key_written(&self) -> Option<std::time::SystemTime> {
        std::fs::metadata(self.key_path()).and_then(|m| m.modified()).ok()
    }

    /// Make the sidecar count as written after `other` (recovery keeps, of two staged files
    /// naming one key, the one named last: see `recovery::recover`); timestamps are coarse.
    pub fn key_written_after(&self, other: std::time::SystemTime) {
        let at = std::time::SystemTime::now().max(other + std::time::Duration::from_millis(1));
        let set = File::options().write(true).open(self.key_path()).and_then(|f| f.set_modified(at));
        if let Err(e) = set {
            tracing::warn!(key = ?self.key, "cannot order staged sidecars: {e}");
        }
    }

    /// The staged data file.
    pub(crate) fn data_path(&self) -> &std::path::Path {
        &self.path
    }

    pub(super) fn key_path(&self) -> PathBuf {
        self.path.with_extension("key")
    }

    /// The key the bytes go to, once they have changed (the sidecar's; a rename moves it).
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }
}

/// What [`set_aside`] moved in this process: (staging directory, key, where the bytes are).
static SET_ASIDE: std::sync::Mutex<Vec<(PathBuf, String, PathBuf)>> = std::sync::Mutex::new(Vec::new());

/// The (key, file) of each staged file of `dir` that this process moved to `lost+found`
/// (its recovery, or an upload it could not make): what an unmount reports.
pub(crate) fn set_aside_in(dir: &Path) -> Vec<(String, PathBuf)> {
    let all = SET_ASIDE.lock().unwrap();
    all.iter().filter(|(d, _, _)| d == dir).map(|(_, k, p)| (k.clone(), p.clone())).collect()
}

/// Move bytes that were being written when the mount died to `<staging>/lost+found/`,
/// named after their key, instead of uploading them: a half-written rewrite must never
/// replace the version its last close left in the bucket. `why` ends the log line: why the
/// bytes were not uploaded. `false` if they could not be moved.
pub(crate) fn set_aside(dir: &Path, data: &Path, key: &str, why: &str) -> bool {
    let found = dir.join("lost+found");
    // The key's last name (cut to 150 bytes, to fit a file name), and the whole key in a sidecar.
    let mut base = key.rsplit('/').next().unwrap_or("").to_string();
    base.truncate(base.char_indices().map(|(i, c)| i + c.len_utf8()).take_while(|&end| end <= 150).last().unwrap_or(0));
    let stem = format!("{}-{base}", unique());
    let to = found.join(&stem);
    let moved = std::fs::create_dir_all(&found)
        .and_then(|_| std::fs::write(found.join(format!("{stem}.key")), key))
        .and_then(|_| std::fs::rename(data, &to));
    match moved {
        Ok(()) => {
            tracing::warn!(%key, kept = %to.display(), "staged bytes not uploaded, kept here: {why}");
            remove_staged(data, false);
            SET_ASIDE.lock().unwrap().push((dir.to_path_buf(), key.to_string(), to));
            true
        }
        Err(e) => {
            tracing::error!(%key, data = %data.display(), "cannot set aside staged bytes: {e}");
            false
        }
    }
}
