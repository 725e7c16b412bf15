//! Write-back mode's side of `Fs`: queueing committed files, the upload workers, cancelling
//! an upload for a rename or unlink, and `bucketfs sync`. The queue itself is
//! [`crate::write_back`].

use crate::fs::{Fs, Handle, OpenFile};
use crate::sync::{Arc, Ordering, Weak};
use crate::write_back::{Queue, WriteBackConfig, WriteBackStatus};
use crate::FsError;
use std::time::{Duration, Instant};

impl Fs {
    /// Whether this mount runs in write-back mode.
    pub fn write_back(&self) -> bool {
        self.cfg.write_back.is_some()
    }

    /// Start the upload workers of write-back mode (a no-op without it). Needs a runtime.
    /// Deletes an earlier mount left pending are sent from here on, in any mode.
    pub fn start_write_back(self: &Arc<Self>) {
        if let Some(d) = &self.deletes {
            crate::deletes::DeferredDeletes::start(d);
        }
        let Some(cfg) = self.cfg.write_back else { return };
        let me = Arc::downgrade(self);
        let queue = self.staging.queue.clone();
        crate::sync::spawn(schedule(me, queue, cfg));
    }

    /// Declare an upload of `ino`'s key (intents.rs), as the key is once declared: a
    /// rename that moved it while this waited is waited for, then the new key declared.
    pub(crate) async fn upload_intent(&self, ino: u64) -> crate::intents::Intent<'_> {
        loop {
            let Ok(key) = self.node(ino).map(|n| n.key) else {
                return self.intents.acquire(Vec::new(), false).await; // gone: nothing to guard
            };
            let intent = self.intents.acquire(vec![crate::intents::Scope::Key(key.clone())], false).await;
            if self.node(ino).is_ok_and(|n| n.key == key) {
                return intent;
            }
        }
    }

    /// A rename or unlink of `ino` must not wait for its upload in flight (the store may
    /// hang): that attempt is cancelled (retried later under the name the file has then),
    /// and, since the store may still complete the request it received, its key is taken
    /// as possibly holding the file ([`crate::write::Staged::maybe_landed`]).
    pub(crate) async fn cancel_upload(&self, ino: u64) {
        if !self.write_back() || !self.staging.queue.cancel(ino) {
            return;
        }
        tracing::info!(ino, "upload in flight cancelled by a rename or unlink of its file");
        if let Some(s) = self.staging.get(ino) {
            // Free once the cancelled attempt is dropped.
            let mut st = s.lock().await;
            // Also for a create-only upload: if it lands, the object is this file's (it
            // replaces nothing), and an unlink or rename must delete it (only it: see
            // `Staged::cut_off`).
            st.cut_off();
        }
    }

    /// Take an exclusive intent over `scopes` for an unlink or rename of `key` (and of the
    /// target `target`), cancelling uploads of those files that hold a conflicting one
    /// meanwhile: an upload due at the moment of the caller's first cancel may have begun
    /// since, and on a store that hangs it would hold the intent for minutes.
    pub(crate) async fn intent_cancelling(
        &self,
        scopes: Vec<crate::intents::Scope>,
        key: &str,
        target: Option<(u64, &str)>,
    ) -> crate::intents::Intent<'_> {
        if !self.write_back() {
            // No upload is cancelled without write-back: wait (no timer, so shuttle runs it).
            return self.intents.acquire(scopes, true).await;
        }
        loop {
            if let Some(i) = self.intents.try_acquire(scopes.clone(), true) {
                return i;
            }
            self.cancel_uploads_of(key, target).await;
            let wait = self.intents.acquire(scopes.clone(), true);
            if let Ok(i) = tokio::time::timeout(Duration::from_millis(100), wait).await {
                return i;
            }
        }
    }

    /// [`Fs::cancel_upload`] of every file whose key is `key` or below it (a directory's,
    /// ending in `/`), and of the file named `name` in `parent` (a rename's target).
    pub(crate) async fn cancel_uploads_of(&self, key: &str, target: Option<(u64, &str)>) {
        if !self.write_back() {
            return;
        }
        let target = target.and_then(|(p, n)| self.table.lock().unwrap().child(p, n).map(|n| n.ino));
        for ino in self.staging.queue.in_flight_inos() {
            let hit = self.node(ino).is_ok_and(|n| n.key == key || key.ends_with('/') && n.key.starts_with(key));
            if hit || target == Some(ino) {
                self.cancel_upload(ino).await;
            }
        }
    }

    /// What the write-back queue holds now.
    pub fn write_back_status(&self) -> WriteBackStatus {
        let mut s = self.staging.queue.status();
        s.deletes = self.deletes.as_ref().map_or(0, |d| d.pending() as u64);
        s
    }

    /// A commit point of `file` in write-back mode (close, fsync): if it changed the data
    /// (or it is the file's only handle and the file is dirty), its bytes become the version
    /// a crash recovers and the file is queued; `durable` (fsync) also writes them to disk.
    /// Returns once there is room in the queue.
    ///
    /// If another handle has the file open for writing, the version is uploaded now, as
    /// without write-back: that writer may change the staged bytes at any moment (the
    /// kernel writes them itself with passthrough), and the closed version would then exist
    /// nowhere. Should that upload fail, the file is queued as usual.
    pub(crate) async fn commit_for(&self, file: &OpenFile, durable: bool) -> Result<(), FsError> {
        let wrote = file.wrote.load(Ordering::Relaxed) || file.writes_unseen.load(Ordering::Relaxed);
        if !wrote && !file.staged.load(Ordering::Relaxed) {
            return Ok(());
        }
        let Some(staged) = self.staging.get(file.ino) else {
            tracing::debug!(ino = file.ino, "write-back commit point: nothing staged");
            return Ok(());
        };
        if !wrote && !file.writable && !durable && self.staging.view(file.ino).is_some() {
            // An upload holds it (staging.rs), sending the version a reader's close would
            // commit: `cat` does not wait for a store that hangs. (An fsync, even through a
            // reader, `sync FILE`, still waits to make the file durable here.)
            return Ok(());
        }
        let other_writer = self.handles.lock().unwrap().values().any(
            |h| matches!(h, Handle::File(f) if f.ino == file.ino && f.writable && !std::ptr::eq(f.as_ref(), file)),
        );
        let cfg = self.cfg.write_back.expect("write-back mode");
        // The intent before the staged lock, as everywhere (a rename holds its keys' while
        // it moves names).
        let intent = match other_writer {
            true => Some(self.upload_intent(file.ino).await),
            false => None,
        };
        let queued = {
            let mut st = staged.lock().await;
            self.observe(file.ino, &mut st)?;
            let queue = st.dirty && !st.unlinked && (wrote || st.handles <= 1);
            if queue {
                st.commit_as(durable, durable || other_writer)?;
                // The committed version is this mount's file now (it reaches the store later):
                // handles that read the stored version read it from here on, as an upload
                // would have switched them (read your writes; model test, seed 704951275).
                self.join_handles(file.ino, &mut st);
            }
            if queue && other_writer {
                match self.publish(file.ino, &mut st).await {
                    Ok(()) => {
                        self.staging.queue.forget(file.ino);
                        file.wrote.store(false, Ordering::Relaxed);
                        return Ok(());
                    }
                    Err(e) => tracing::warn!(ino = file.ino, "upload beside another writer failed, queued: {e}"),
                }
            }
            if durable {
                st.sync_local()?;
            }
            tracing::debug!(
                ino = file.ino,
                wrote,
                dirty = st.dirty,
                handles = st.handles,
                queue,
                "write-back commit point"
            );
            if queue {
                // Queued under the staged lock: an open for writing that stages the file
                // after this finds it queued (and uploads this version before changing it).
                let key = self.node(file.ino).map(|n| n.key).unwrap_or_default();
                self.staging.queue.enqueue(file.ino, key, st.len(), cfg.delay);
            }
            queue
        };
        // Never held while waiting for room: an unlink or rename waiting for it would hold
        // back the uploads behind it, and the room would never come.
        drop(intent);
        file.wrote.store(false, Ordering::Relaxed);
        if !queued {
            return Ok(());
        }
        // Back-pressure: wait while the queue holds more than its bound (a file larger than
        // the bound alone goes through: it cannot wait for itself).
        loop {
            let notified = self.staging.queue.progress.notified();
            if self.staging.queue.bytes() <= cfg.max_bytes || self.staging.queue.len() <= 1 {
                return Ok(());
            }
            notified.await;
        }
    }

    /// Before a queued file is changed again (opened for writing): upload its committed
    /// version, so a crash during the change still finds it in the bucket.
    pub(crate) async fn upload_before_change(&self, ino: u64) -> Result<(), FsError> {
        if !self.write_back() || !self.staging.queue.queued(ino) {
            return Ok(());
        }
        let _intent = self.upload_intent(ino).await;
        self.upload_committed(ino).await?;
        self.staging.queue.forget(ino);
        Ok(())
    }

    /// Upload `ino`'s staged bytes if they are a committed version not yet in the bucket,
    /// and drop the staged copy once clean and unused. Caller holds its upload intent.
    pub(crate) async fn upload_committed(&self, ino: u64) -> Result<(), FsError> {
        let Some(staged) = self.staging.get(ino) else { return Ok(()) };
        let mut st = staged.lock().await;
        self.observe(ino, &mut st)?;
        if st.dirty && !st.unlinked && st.committed() {
            // Readers go on without the lock while the store takes its time (staging.rs).
            let mut showing = self.staging.show(ino, &staged, &mut st);
            let published = self.publish(ino, &mut showing).await;
            drop(showing);
            published?;
        }
        // Not committed: a writer is changing it; its close queues it again. Still mapped:
        // its lingering watch drops it (fs_write.rs).
        let lingering = self.staging.lingering.lock().unwrap().contains(&ino);
        if st.handles == 0 && (!st.dirty || st.unlinked) && !lingering {
            if !st.unlinked && self.staging.is_current(ino, &staged) {
                self.keep_as_whole(ino, &mut st).await; // for reading back (passthrough.rs)
            }
            self.unstage_this(ino, &staged, &mut st);
        }
        Ok(())
    }

    /// `bucketfs sync`: upload everything committed so far, now, and send every pending
    /// delete; returns (key, error) of each file that could not be uploaded or deleted (it
    /// stays queued and retried).
    pub async fn sync_write_back(&self) -> Vec<(String, String)> {
        let started = Instant::now();
        let wanted = self.staging.queue.all_due_now(started);
        self.staging.queue.work.notify_one();
        loop {
            let notified = self.staging.queue.progress.notified();
            let (mut failed, waiting) = self.staging.queue.sync_state(&wanted, started);
            if !waiting {
                // And every unlink so far is done in the bucket.
                if let Some(d) = &self.deletes {
                    failed.extend(d.drain_all().await);
                }
                self.store.settle().await; // and its temporary objects are gone
                return failed;
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
            self.staging.queue.work.notify_one();
        }
    }
}

/// The scheduler: starts uploads of due files, at most `parallel` at once, until the
/// filesystem is dropped.
async fn schedule(fs: Weak<Fs>, queue: Arc<Queue>, cfg: WriteBackConfig) {
    loop {
        let mut room = cfg.parallel.saturating_sub(queue.in_flight());
        let (due, next) = queue.take_due(room);
        room -= due.len();
        for (ino, seq, registration) in due {
            let Some(fs) = fs.upgrade() else { return };
            let queue = queue.clone();
            crate::sync::spawn(async move {
                let attempt = async {
                    let _intent = fs.upload_intent(ino).await;
                    fs.upload_committed(ino).await
                };
                let result = futures::future::Abortable::new(attempt, registration).await.unwrap_or_else(|_| {
                    Err(FsError::Local("upload cancelled: the file was renamed or removed meanwhile".into()))
                });
                queue.finished(ino, seq, result);
            });
        }
        if fs.strong_count() == 0 {
            return;
        }
        let wait = match next {
            Some(t) if room > 0 => t.saturating_duration_since(Instant::now()),
            _ => Duration::from_secs(1), // full: a finished upload wakes us
        };
        let _ =
            tokio::time::timeout(wait.clamp(Duration::from_millis(10), Duration::from_secs(1)), queue.work.notified())
                .await;
    }
}
