//! The mount's start and end: what an earlier mount left is finished (directory moves,
//! staged files), and at unmount every staged change goes up or stays staged.

use futures::StreamExt;

use crate::fs::Fs;

/// Staged files uploaded at once at unmount (see [`Fs::sync_all`]).
const UNMOUNT_PARALLEL: usize = 4;

/// How long `bucketfs sync` waits for the RELEASE of changed files' handles (a close's
/// last step, sent by the kernel after close(2) returned).
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl Fs {
    /// `fsync` of a directory. Without write-back a name changes in the store before its
    /// call returns: nothing to do. With it, the changes of names journaled on local disk
    /// (a rename's `.key` sidecar, the deletes and moves journals, their directories) reach
    /// the disk, as a local filesystem's would: one `syncfs` of the staging directory's
    /// filesystem (and the journal's, if apart). It also writes out staged bytes not synced
    /// yet, as `sync` does.
    pub async fn fsync_dir(&self) -> Result<(), crate::FsError> {
        if !self.write_back() {
            return Ok(());
        }
        let mut dirs = vec![self.cfg.staging_dir.clone()];
        dirs.extend(crate::deletes::journal_dir_for(&self.cfg.staging_dir));
        let synced = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            use std::os::fd::AsRawFd;
            use std::os::unix::fs::MetadataExt;
            let mut done = Vec::new(); // filesystems synced (the journal is usually beside)
            for d in dirs {
                let f = match std::fs::File::open(&d) {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                };
                let dev = f.metadata()?.dev();
                if done.contains(&dev) {
                    continue;
                }
                // SAFETY: a valid descriptor, open for the call's duration.
                if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                done.push(dev);
            }
            Ok(())
        })
        .await;
        synced.unwrap_or_else(|e| Err(std::io::Error::other(e))).map_err(crate::write::local)
    }

    /// Finish what an earlier mount left: directory moves it began, then uploads of what it
    /// left in the staging directory (a crash, or an unmount whose uploads kept failing).
    /// Returns (uploaded keys, keys still failing).
    /// Then the spare files it left are adopted in the background (see `recycle::warm`).
    pub async fn recover_staged(&self) -> (Vec<String>, Vec<String>) {
        // Directory moves a crash cut short first: staged files may be named below their
        // new directories already (moves.rs).
        let moved = crate::moves::replay(&self.cfg.staging_dir, self.store.as_ref()).await;
        // Temporary objects of uploads a crash cut short (before any upload of this mount).
        let owner = crate::recovery::parts_owner(&self.cfg.staging_dir);
        match self.store.clean_parts(&owner).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(n, "deleted temporary objects an earlier mount left in the bucket"),
            Err(e) => tracing::warn!("cannot delete temporary objects an earlier mount left: {e}"),
        }
        let r = crate::recovery::recover(
            &self.cfg.staging_dir,
            self.store.as_ref(),
            self.cfg.write.clone(),
            &self.staging.budget,
            &moved,
        )
        .await;
        moved.iter().for_each(crate::moves::Move::done);
        crate::recycle::warm(&self.cfg.staging_dir);
        r
    }

    /// Keys whose staged data the bucket does not have yet, then the changes of names it
    /// does not have yet (`key (what)`): what an unmount leaves for the next mount.
    pub async fn pending_keys(&self) -> Vec<String> {
        let staged = self.staging.all();
        let mut keys = Vec::new();
        for (ino, s) in staged {
            let mut st = s.lock().await;
            let _ = self.observe(ino, &mut st); // a failed check keeps what is known
            if st.dirty && !st.unlinked {
                keys.push(self.node(ino).map(|n| n.key).unwrap_or_default());
            }
        }
        // Renames, unlinks, directories and links the bucket does not have yet (write-back).
        keys.extend(self.deletes.iter().flat_map(|d| d.pending_changes()));
        keys
    }

    /// (key, file) of each staged file this mount moved to `lost+found` instead of
    /// uploading it (bytes an earlier mount's crash left never closed): an unmount names them.
    pub fn set_aside(&self) -> Vec<(String, std::path::PathBuf)> {
        crate::write::set_aside_in(&self.cfg.staging_dir)
    }

    /// `bucketfs sync`: on a write-back mount [`Fs::sync_write_back`]; on a durable one,
    /// every closed file whose upload failed at its close (still staged and changed, no
    /// handle open, after waiting `RELEASE_WAIT` for handles closing) is uploaded now. Returns
    /// (key, error) of each still not in the bucket.
    pub async fn sync_closed(&self) -> Vec<(String, String)> {
        if self.write_back() {
            return self.sync_write_back().await;
        }
        // What cut-off uploads landed late is undone first (late.rs).
        self.check_late_now().await;
        // A close returns at its FLUSH, and the kernel sends the RELEASE after it: a sync
        // run right after a close that failed found the handle still open and skipped the
        // file (exit 0, or a list without it). Handles of changed files get a moment to go.
        let dirty = |st: &crate::write::Staged| st.dirty && !st.unlinked;
        let mut open = Vec::new();
        for (ino, staged) in self.staging.all() {
            if dirty(&*staged.lock().await) && self.has_open_handle(ino) {
                open.push(ino);
            }
        }
        let released = async {
            while open.iter().any(|&ino| self.has_open_handle(ino)) {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        };
        let _ = tokio::time::timeout(RELEASE_WAIT, released).await;
        // Closed: no handle open here (one being released counts as closed; its upload and
        // this one take turns under the staged lock).
        let mut closed = Vec::new();
        for (ino, staged) in self.staging.all() {
            if dirty(&*staged.lock().await) && !self.has_open_handle(ino) {
                closed.push(ino);
            }
        }
        let failed = self.upload_each(closed).await;
        self.store.settle().await;
        let failed = failed.into_iter().map(|(key, e)| (key, e.to_string()));
        failed.chain(self.late_stuck()).collect()
    }

    /// Upload each of `inos`, a few at a time; the key and error of each that failed.
    async fn upload_each(&self, inos: Vec<u64>) -> Vec<(String, crate::FsError)> {
        let uploads = futures::stream::iter(inos).map(|ino| async move { (ino, self.upload_pub(ino).await) });
        let results: Vec<_> = uploads.buffer_unordered(UNMOUNT_PARALLEL).collect().await;
        let key = |ino| self.node(ino).map(|n| n.key).unwrap_or_default();
        results.into_iter().filter_map(|(ino, r)| r.err().map(|e| (key(ino), e))).collect()
    }

    /// Upload every dirty staged file (unmount). Returns the keys that could not be uploaded.
    /// In write-back mode a file whose upload the queue just tried and failed is not tried
    /// again: against a store that hangs each try is a timeout, and one after another they
    /// kept an unmount waiting for an hour. Its bytes stay staged for the next mount.
    pub async fn sync_all(&self) -> Vec<String> {
        let mut failed = Vec::new();
        if self.write_back() {
            for (key, e) in self.sync_write_back().await {
                tracing::error!(%key, "not uploaded at unmount, kept in staging: {e}");
                failed.push(key);
            }
        }
        // What is left (files still open, and every staged file of a durable mount), a few
        // at a time.
        let staged = self.staging.inos();
        let left: Vec<u64> = {
            let t = self.table.lock().unwrap();
            staged.into_iter().filter(|ino| !t.get(*ino).is_some_and(|n| failed.contains(&n.key))).collect()
        };
        for (key, e) in self.upload_each(left).await {
            tracing::error!(%key, "not uploaded at unmount, kept in staging: {e}");
            failed.push(key);
        }
        self.store.settle().await; // no temporary object left in the bucket
        failed
    }

    /// At unmount, after [`Fs::sync_all`]: the write-back queue and the late-landing watch
    /// send nothing more; what is left stays staged for the next mount.
    pub fn stop_uploads(&self) {
        self.staging.queue.stop();
    }
}
