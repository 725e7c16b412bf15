//! The `Fs` side of [`crate::late`]: checking the keys an upload cut off may still land
//! on, and undoing what landed (the file under the name goes up again, or the object is
//! deleted), in either mode; `bucketfs sync` checks them all first.

use std::time::{Duration, Instant};

use crate::fs::Fs;
use crate::fs_write_back::{LANDING_GRACE, STORE_PROBE};
use crate::sync::Weak;

impl Fs {
    /// `ino` was renamed over a file whose upload was cut off (cancelled by the rename) and
    /// may still land under `key`, over it: its bytes go up there once more `LANDING_GRACE`
    /// after its next upload (pending), or after now (uploaded already), over anything that
    /// lands late. Before, `echo A > X; mv B X` could end with X holding A for good (tester
    /// I: 3 of 10 rounds on GCS, some on S3).
    pub(crate) async fn follow_late_landing(&self, ino: u64, key: &str) {
        self.send_over_late(ino, key, LANDING_GRACE).await;
    }

    /// Send `ino`'s version up under `key` again `after` from now, over what an upload cut
    /// off may land there (or has), or once more after its next upload if one is pending.
    async fn send_over_late(&self, ino: u64, key: &str, after: Duration) -> bool {
        // Not staged, or dropped by a reader's last close while this waited (clean): marked
        // dirty, it would stay out of the queue and be left on disk for the next mount.
        let staged = self.staging.get(ino);
        let st = match &staged {
            Some(s) => Some(s.lock().await).filter(|_| self.staging.is_current(ino, s)),
            None => None,
        };
        let Some(mut st) = st else {
            tracing::warn!(%key, "an upload cut off may land over this file's version, which is no longer staged here to send again");
            return false;
        };
        if st.unlinked {
            return true;
        }
        // A writer the kernel serves (passthrough) changes the file unseen until looked at.
        let _ = self.observe(ino, &mut st);
        if st.dirty {
            st.landing_unknown();
            if st.committed() {
                return false; // closed, its upload pending: that goes up, then again later
            }
            // Open and changed by a writer: its close sends the newer bytes; the version
            // closed before it goes up now, from its copy kept aside.
            drop(st);
            return self.send_closed_over_late(ino, key).await;
        }
        // The mount's own again until the resend (a settled file's node is the store's:
        // a listing would lay a late object's size over it meanwhile).
        self.claim(ino);
        if let Err(e) = st.send_again(key) {
            tracing::warn!(%key, "cannot queue the file to go up again over a late landing: {e}");
            return false;
        }
        if self.write_back() {
            self.staging.queue.enqueue_resend(ino, key.to_string(), st.len(), after);
            return true;
        }
        // A durable mount has no queue: up now, as its closes do.
        drop(st);
        let _intent = self.upload_intent(ino).await;
        match self.upload_committed(ino).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(%key, "cannot send the file again over a late landing: {e}");
                false
            }
        }
    }

    /// A writer has `ino` open and changed: the version closed before it (kept aside:
    /// [`crate::write::Staged::keep_for_late`]) goes up to `key` now, over a late landing,
    /// instead of at the writer's close, which may be hours away (or never, at a crash).
    /// Whether it went up.
    async fn send_closed_over_late(&self, ino: u64, key: &str) -> bool {
        // Exclusive: the writer's own upload (its close) waits, so its newer bytes go up
        // after these; its writes do not (the staged lock is not held while these go up:
        // a writer without passthrough waited minutes behind a slow store, tester L).
        let _intent = self.intents.acquire(vec![crate::intents::Scope::Key(key.to_string())], true).await;
        let Some(staged) = self.staging.get(ino).filter(|s| self.staging.is_current(ino, s)) else { return false };
        let (node, copy) = {
            let mut st = staged.lock().await;
            let node = match self.node(ino) {
                Ok(n) if n.key == key && !st.unlinked && st.dirty => n,
                _ => return false, // moved, removed or closed meanwhile: that decides
            };
            match st.closed_copy() {
                Ok(Some(c)) => (node, c),
                Ok(None) => return false,
                Err(e) => {
                    tracing::warn!(%key, "the version closed before cannot be read to go up again: {e}");
                    return false;
                }
            }
        };
        let opts = bucketfs_store::WriteOptions {
            put: bucketfs_store::PutOpts { attrs: self.attrs_to_keep(&node), ..Default::default() },
            ..self.cfg.write.clone()
        };
        match crate::write::send_whole(self.store.as_ref(), key, &copy.0, copy.1, &opts).await {
            Ok(meta) => {
                if let Some(tag) = meta.etag {
                    let mut t = self.table.lock().unwrap();
                    let ticket = t.ask();
                    if let Some(n) = t.get_mut(ino) {
                        n.version = crate::inode::Version::Tag(tag);
                        n.answered = ticket;
                    }
                }
                true
            }
            Err(e) => {
                tracing::warn!(%key, "cannot send the version closed before over a late landing: {e}");
                false
            }
        }
    }

    /// Whether the staged file of `ino`, clean, stays staged after its upload: a key it
    /// holds is watched for a cut-off upload landing late (late.rs), and would need these
    /// bytes to go up again, also after a crash or while a writer changes them
    /// ([`crate::write::Staged::keep_for_late`]).
    pub(crate) fn kept_for_late(&self, ino: u64, st: &mut crate::write::Staged) -> bool {
        if st.unlinked || st.dirty || !self.late.pins(ino) {
            return false;
        }
        match self.node(ino) {
            Ok(n) => {
                let note =
                    crate::write::LateNote { ours: n.version.tag().map(str::to_owned), md5s: self.late.md5s(&n.key) };
                if let Err(e) = st.keep_for_late(&n.key, &note) {
                    tracing::warn!(key = %n.key, "a file kept to go up over a late landing is not named for crash recovery: {e}");
                }
            }
            Err(_) => st.drop_key(),
        }
        true
    }

    /// [`Fs::kept_for_late`] for `ino`'s staged file, if it has one.
    pub(crate) async fn keep_for_late(&self, ino: u64) {
        if let Some(staged) = self.staging.get(ino) {
            self.kept_for_late(ino, &mut *staged.lock().await);
        }
    }

    /// Check `key`, watched for an upload cut off that may land late (late.rs): if one
    /// landed, the file under the name goes up again, or, with none, the object is deleted.
    async fn undo_late_landing(&self, key: &str, w: &crate::late::Watch) {
        let holder =
            w.holder.filter(|i| self.node(*i).is_ok_and(|n| n.key == key && n.linked)).or_else(|| self.file_at(key));
        let ours = holder.and_then(|i| self.node(i).ok()).and_then(|n| n.version.tag().map(str::to_owned));
        match crate::late::landed(self.store.as_ref(), key, &w.md5s, ours.as_deref()).await {
            Ok(None) => {}
            Ok(Some(_)) => match holder {
                Some(ino) => {
                    if self.send_over_late(ino, key, Duration::ZERO).await {
                        tracing::warn!(%key, "an upload cut off earlier landed late, over a newer version: that goes up again");
                    } else {
                        // Named by `bucketfs sync` until the file's next upload (tester K:
                        // sync said all was in the bucket while the older bytes were).
                        tracing::error!(%key, "an upload cut off earlier landed late, over a newer version, which cannot go up again now (a writer has the file open and changed: its close sends its bytes)");
                        self.late.stuck(key);
                    }
                }
                None => {
                    tracing::warn!(%key, "an upload cut off earlier landed late under a name removed since: deleted again");
                    if let Err(e) = self.delete_removed(key, crate::write::Landing::IfMd5(w.md5s.clone())).await {
                        tracing::warn!(%key, "cannot delete what a cut-off upload left: {e}");
                    }
                }
            },
            Err(e) => tracing::debug!(%key, "cannot check for a late landing now: {e}"),
        }
    }

    /// (key, why) of each key an older upload landed on that could not be undone yet.
    pub(crate) fn late_stuck(&self) -> Vec<(String, String)> {
        let why = "an older upload landed over its last closed version, which goes up again at the writer's close";
        self.late.stuck_keys().into_iter().map(|k| (k, why.to_string())).collect()
    }

    /// The file the mount shows under `key`, if its node is known.
    fn file_at(&self, key: &str) -> Option<u64> {
        let t = self.table.lock().unwrap();
        let mut ino = crate::inode::ROOT_INO;
        for name in key.split('/') {
            ino = t.child(ino, name)?.ino;
        }
        t.get(ino).filter(|n| n.kind == crate::fs::Kind::File && n.key == key).map(|n| n.ino)
    }

    /// Every watched key checked now (`bucketfs sync`), within `STORE_PROBE`.
    pub(crate) async fn check_late_now(&self) {
        let all = self.late.all();
        let check = async {
            for (key, w) in &all {
                self.undo_late_landing(key, w).await;
            }
        };
        if tokio::time::timeout(STORE_PROBE, check).await.is_err() {
            tracing::warn!(
                keys = all.len(),
                "keys an upload cut off may land on were not all checked: the store did not answer"
            );
        }
    }

    /// A watch that pinned `ino`'s staged file ended: dropped now if clean and unused (as
    /// after its upload), unless another watch still pins it.
    async fn unpin_late(&self, ino: u64) {
        let Some(staged) = self.staging.get(ino) else { return };
        if self.late.pins(ino) || staged.lock().await.dirty {
            return; // its upload drops it
        }
        let _intent = self.upload_intent(ino).await;
        if let Err(e) = self.upload_committed(ino).await {
            tracing::debug!(ino, "staged file kept for a late landing not dropped: {e}");
        }
    }
}

/// Check the keys an upload cut off may still land on as they come due (late.rs), until
/// the mount goes; a watch that ends unpins its file's staged copy.
pub(crate) async fn watch_late(fs: Weak<Fs>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Some(fs) = fs.upgrade() else { return };
        if fs.staging.queue.stopped.load(crate::sync::Ordering::Relaxed) {
            return; // unmounted
        }
        for (key, watch, last) in fs.late.due(Instant::now()) {
            fs.undo_late_landing(&key, &watch).await;
            if let Some(ino) = watch.holder.filter(|_| last) {
                fs.unpin_late(ino).await;
            }
        }
    }
}
