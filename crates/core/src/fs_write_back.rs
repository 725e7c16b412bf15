//! Write-back mode's side of `Fs`: queueing committed files, the upload workers, cancelling
//! an upload for a rename or unlink, and `bucketfs sync`. The queue itself is
//! [`crate::write_back`].

use crate::fs::{Fs, Handle, OpenFile};
use crate::sync::{Arc, Ordering, Weak};
use crate::write_back::{Queue, WriteBackConfig, WriteBackStatus};
use crate::FsError;
use std::time::{Duration, Instant};

/// How long a writer of a file waits for its upload in flight (write-back mode) before it
/// cuts that upload off and goes ahead: a store that hangs must not stall writes. A second
/// more per [`PATIENCE_PER_SEC`] bytes of the file, so a large file's upload that is only
/// slow is not cut off (and started over) by every writer.
pub(crate) const WRITER_PATIENCE: Duration = Duration::from_secs(5);
const PATIENCE_PER_SEC: u64 = 16 << 20;

/// How long `bucketfs sync` (and unmount) waits for one listing of the store, asked when an
/// upload begun before the sync timed out during it: no answer, and that file is named as
/// not uploaded rather than tried again (one more timeout against a store that hangs).
pub(crate) const STORE_PROBE: Duration = Duration::from_secs(15);

/// How long after an upload that followed a cut-off one the file goes up again: the store
/// may still complete the older request (as for deletes: deletes.rs).
pub(crate) const LANDING_GRACE: Duration = Duration::from_secs(3);

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
        let me = Arc::downgrade(self);
        crate::sync::spawn(crate::fs_late::watch_late(me.clone()));
        let Some(cfg) = self.cfg.write_back else { return };
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
        for (ino, staged) in self.staging.all() {
            // (One another task holds is looked at by the next status.)
            let Ok(st) = staged.try_lock() else { continue };
            if left_uncommitted(&st) {
                let key = self.node(ino).map(|n| n.key).unwrap_or_default();
                (s.files, s.bytes) = (s.files + 1, s.bytes + st.len());
                s.failing.push((key, 0, UNCOMMITTED.to_string()));
            }
        }
        s.deletes = self.deletes.as_ref().map_or(0, |d| d.pending() as u64);
        s.refused = self.deletes.as_ref().map_or(0, |d| d.refused_since_mount());
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
    /// nowhere (it is also kept aside: write_commit.rs). Should that upload fail or take
    /// longer than [`WRITER_PATIENCE`], the file is queued as usual.
    pub(crate) async fn commit_for(&self, file: &OpenFile, durable: bool) -> Result<(), FsError> {
        let wrote = file.wrote.load(Ordering::Relaxed) || file.writes_unseen.load(Ordering::Relaxed);
        if !wrote && !file.staged.load(Ordering::Relaxed) {
            return Ok(());
        }
        let Some(staged) = self.staging.get(file.ino) else {
            tracing::debug!(ino = file.ino, "write-back commit point: nothing staged");
            return Ok(());
        };
        // A close of a handle that wrote nothing while an upload holds the file (staging.rs)
        // returns: the upload sends the version it would commit, and `cat` does not wait
        // for a store that hangs. Nor does it cancel that upload (a writer's RELEASE after
        // its FLUSH queued the file did, and held the upload back 30 s). (An fsync, even
        // through a reader, `sync FILE`, still waits to make the file durable.)
        let reader = !wrote && !durable;
        if reader && self.staging.view(file.ino).is_some() {
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
            let mut st = match reader {
                true => match self.staging.lock_unless_shown(file.ino, &staged).await {
                    Some(st) => st,
                    None => return Ok(()),
                },
                false => self.lock_to_change(file.ino, &staged).await,
            };
            self.observe(file.ino, &mut st)?;
            // A handle passed through (its writes unseen) changed the data only if the file
            // changed since it opened it or last committed.
            let wrote = file.changed_data(st.write_gen);
            // A last handle that wrote nothing commits a dirty file not queued yet, or one
            // changed since its commit (a mapping's writes). A committed version queued
            // already stays as it is (re-queued, an upload a writer held back would start
            // again at once and take the file from that writer).
            let queued_as_is = st.committed() && self.staging.queue.queued_version(file.ino);
            let queue = st.dirty && !st.unlinked && (wrote || st.handles <= 1 && !queued_as_is);
            if queue {
                self.commit_staged(file.ino, &mut st, durable, durable || other_writer)?;
                // The committed version is this mount's file now (it reaches the store later):
                // handles that read the stored version read it from here on, as an upload
                // would have switched them (read your writes; model test, seed 704951275).
                self.join_handles(file.ino, &mut st);
            }
            file.unseen_mark.store(st.write_gen, Ordering::Relaxed);
            if queue && other_writer {
                // Not longer than a writer waits (the version is kept aside meanwhile).
                let followed_cut = st.maybe_landed && !st.resending;
                match tokio::time::timeout(self.patience(file.ino), self.publish(file.ino, &mut st)).await {
                    Ok(Ok(())) => {
                        if !self.resend_after_cut(file.ino, &mut st, followed_cut)? {
                            self.staging.queue.forget(file.ino);
                        }
                        file.wrote.store(false, Ordering::Relaxed);
                        return Ok(());
                    }
                    Ok(Err(e)) => tracing::warn!(ino = file.ino, "upload beside another writer failed, queued: {e}"),
                    Err(_) => {
                        st.cut_off();
                        tracing::warn!(ino = file.ino, "upload beside another writer took too long, queued");
                    }
                }
            }
            if durable {
                st.sync_local()?;
                if !queue && st.dirty {
                    st.fsynced_as_is();
                }
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
                self.queue_committed(file.ino, &st);
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
        // Back-pressure: wait while the queue holds more than its bounds, bytes or files (a
        // file larger than the bound alone goes through: it cannot wait for itself); over
        // the bytes bound not for good while the store takes no upload (write_back.rs).
        let q = &self.staging.queue;
        loop {
            let notified = q.progress.notified();
            if q.bytes() <= cfg.max_bytes && q.len() <= cfg.max_files || q.len() <= 1 {
                q.under_bound();
                return Ok(());
            }
            // Not past the files bound: each file holds descriptors, and past the process's
            // limit creates failed with EIO (tester Y: 2,013 of 12,000 in an outage).
            if q.len() <= cfg.max_files && q.stalled(self.cfg.clock.now()) && self.staging_room(cfg.max_bytes) {
                if !q.over_bound.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        waiting_mib = q.bytes() >> 20,
                        bound_mib = cfg.max_bytes >> 20,
                        "the store took no upload for {:?}: closes go on over --write-back-max-mib while the staging disk has room",
                        crate::write_back::STALLED
                    );
                }
                return Ok(());
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
        }
    }

    /// Whether the staging directory's file system has `bytes` free for its user.
    fn staging_room(&self, bytes: u64) -> bool {
        crate::disk_cache::room::space(&self.cfg.staging_dir).is_some_and(|(_, free)| free >= bytes)
    }

    /// How long a writer of `ino` waits for its upload ([`WRITER_PATIENCE`]).
    fn patience(&self, ino: u64) -> Duration {
        let size = self.node(ino).map_or(0, |n| n.size);
        WRITER_PATIENCE + Duration::from_secs(size / PATIENCE_PER_SEC)
    }

    /// Before a queued file is changed again (opened for writing): upload its committed
    /// version, so it is in the bucket before the change, as without write-back. `false`:
    /// the upload failed, or the store did not take it within [`WRITER_PATIENCE`] (slow or
    /// hanging: the attempt is cut off); the file stays queued and the change goes ahead
    /// anyway: the committed version stays recoverable on local disk until it is uploaded
    /// (write_commit.rs).
    pub(crate) async fn upload_before_change(&self, ino: u64) -> bool {
        if !self.write_back() || !self.staging.queue.queued_version(ino) {
            return true;
        }
        let Some(staged) = self.staging.get(ino) else { return true };
        let sending = crate::sync::AtomicBool::new(false);
        let attempt = async {
            let _intent = self.upload_intent(ino).await;
            let mut st = staged.lock().await;
            sending.store(true, Ordering::Relaxed);
            // Only sent, not unstaged after: the writer stages it again right away.
            self.publish_committed(ino, &staged, &mut st).await
        };
        let patience = self.patience(ino);
        match tokio::time::timeout(patience, attempt).await {
            Ok(Ok(settled)) => {
                if settled {
                    self.staging.queue.forget(ino);
                }
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(
                    ino,
                    "a closed version could not be uploaded before a writer changes it, still queued: {e}"
                );
                false
            }
            Err(_) => {
                let queued = self.staging.queue.cancel_for_writer(ino);
                tracing::info!(ino, queued, "the store took no upload within {patience:?}: a writer goes ahead, the closed version stays queued");
                if queued || sending.load(Ordering::Relaxed) {
                    self.lock_to_change(ino, &staged).await.cut_off(); // what was sent may still land
                }
                false
            }
        }
    }

    /// `staged`'s lock, for a change of `ino` (a write, a truncate, an open for writing).
    /// In write-back mode an upload sending the file holds it for as long as the store
    /// takes: past [`WRITER_PATIENCE`] that upload is cancelled (queued still: it goes up
    /// after the writer's close, and its version stays recoverable: write_commit.rs), so a
    /// writer does not wait for a store that hangs. Other holders are waited for.
    pub(crate) async fn lock_to_change(
        &self,
        ino: u64,
        staged: &crate::write::SharedStaged,
    ) -> tokio::sync::OwnedMutexGuard<crate::write::Staged> {
        if let Ok(st) = staged.clone().try_lock_owned() {
            return st;
        }
        if !self.write_back() {
            return staged.clone().lock_owned().await;
        }
        let patience = self.patience(ino);
        // One lock future throughout: the writer keeps its place in the mutex's queue (a
        // new one each round put it behind an upload queued meanwhile: 5 s more a round).
        let lock = staged.clone().lock_owned();
        tokio::pin!(lock);
        loop {
            if let Ok(st) = tokio::time::timeout(patience, &mut lock).await {
                return st;
            }
            // Shown: an upload is sending it (not a local step after, nor a close's).
            if self.staging.view(ino).is_some() && self.staging.queue.cancel_for_writer(ino) {
                let mut st = lock.await;
                tracing::info!(
                    ino,
                    "upload in flight cancelled after {patience:?}: a writer waited for it (retried after its close)"
                );
                st.cut_off();
                return st;
            }
        }
    }

    /// Upload `ino`'s staged bytes if they are a committed version not yet in the bucket,
    /// and drop the staged copy once clean and unused. Caller holds its upload intent.
    pub(crate) async fn upload_committed(&self, ino: u64) -> Result<(), FsError> {
        let Some(staged) = self.staging.get(ino) else { return Ok(()) };
        let mut st = staged.lock().await;
        self.publish_committed(ino, &staged, &mut st).await?;
        // Still mapped: its lingering watch drops it (fs_write.rs).
        if st.handles == 0 && (!st.dirty || st.unlinked) && !st.lingering && !self.kept_for_late(ino, &mut st) {
            if !st.unlinked && self.staging.is_current(ino, &staged) {
                self.keep_as_whole(ino, &mut st).await; // for reading back (passthrough.rs)
            }
            self.unstage_this(ino, &staged, &mut st);
        } else if self.staging.is_current(ino, &staged) {
            self.settle_readers(ino, &st);
        }
        Ok(())
    }

    /// The sending half of [`Fs::upload_committed`], with the staged file locked. A version
    /// a writer is changing fails (it stays queued; its copy kept aside is the closed one:
    /// write_commit.rs), so `bucketfs sync` never reports it in the bucket. After an
    /// upload that followed one cut off, the file goes up once more `LANDING_GRACE` later
    /// (the older bytes may land after these: a request the store still held); `false`
    /// then: queued again.
    async fn publish_committed(
        &self,
        ino: u64,
        staged: &crate::write::SharedStaged,
        st: &mut crate::write::Staged,
    ) -> Result<bool, FsError> {
        self.observe(ino, st)?;
        if !st.dirty || st.unlinked {
            return Ok(true);
        }
        if !st.committed() && st.resending {
            // Changed since it was sent again: the writer's close sends a newer version.
            return Ok(true);
        }
        if !st.committed() {
            return Err(FsError::Local(
                "open for writing and changed since its last close: that version goes up after the writer's close"
                    .into(),
            ));
        }
        let followed_cut = st.maybe_landed && !st.resending;
        // Readers go on without the lock while the store takes its time (staging.rs).
        let mut showing = self.staging.show(ino, staged, st);
        let published = self.publish(ino, &mut showing).await;
        drop(showing);
        published?;
        Ok(!self.resend_after_cut(ino, st, followed_cut)?)
    }

    /// Queue `ino`'s committed version `st` for upload after the write-back delay.
    pub(crate) fn queue_committed(&self, ino: u64, st: &crate::write::Staged) {
        let key = self.node(ino).map(|n| n.key).unwrap_or_default();
        let delay = self.cfg.write_back.expect("write-back mode").delay;
        self.staging.queue.enqueue(ino, key, st.len(), delay);
    }

    /// After an upload of `ino` succeeded: if it `followed_cut` (one before it was cut off
    /// and may land late), queue it to go up once more `LANDING_GRACE` later; whether so.
    fn resend_after_cut(&self, ino: u64, st: &mut crate::write::Staged, followed_cut: bool) -> Result<bool, FsError> {
        st.resending = false;
        if !followed_cut || st.unlinked {
            return Ok(false);
        }
        let key = self.node(ino)?.key;
        st.send_again(&key)?;
        tracing::info!(%key, "uploaded after an upload cut off: sent again {LANDING_GRACE:?} later, over anything that lands late");
        self.staging.queue.enqueue_resend(ino, key, st.len(), LANDING_GRACE);
        Ok(true)
    }

    /// `bucketfs sync`: upload everything committed so far, now, and send every pending
    /// delete; returns (key, error) of each file that could not be uploaded or deleted (it
    /// stays queued and retried). A file whose attempt begun before the sync failed during
    /// it, the store not answering, is tried again only if one listing answers within
    /// `STORE_PROBE` (15 s; `Queue::stalled_across`); otherwise it is named at once.
    pub async fn sync_write_back(&self) -> Vec<(String, String)> {
        // First what cut-off uploads landed late: their undoing is part of what is synced.
        self.check_late_now().await;
        let stuck = self.late_stuck();
        let started = Instant::now();
        let queue = &self.staging.queue;
        let uncommitted = self.commit_left().await;
        let wanted = queue.all_due_now(started);
        queue.work.notify_one();
        let mut stalled = Vec::new(); // files named as failed: the store did not answer
        let mut answers: Option<bool> = None; // the probe's verdict, once made
        loop {
            let notified = queue.progress.notified();
            let (mut failed, waiting) = queue.sync_state(&wanted, started, &stalled);
            if !waiting {
                // And every unlink so far is done in the bucket.
                if let Some(d) = &self.deletes {
                    failed.extend(d.drain_all_since(started).await);
                }
                self.store.settle().await; // and its temporary objects are gone
                failed.extend(uncommitted);
                failed.extend(stuck);
                return failed;
            }
            let found = queue.stalled_across(&wanted, started, Instant::now() + STORE_PROBE + Duration::from_secs(1));
            if !found.is_empty() {
                if answers.is_none() {
                    let probe = tokio::time::timeout(STORE_PROBE, self.store.check()).await;
                    answers = Some(probe.is_ok_and(|r| r.is_ok()));
                }
                if answers == Some(true) {
                    queue.due_now(&found);
                } else if found != stalled {
                    tracing::warn!(
                        files = found.len(),
                        "the store does not answer: uploads that timed out not tried again"
                    );
                    stalled = found;
                    continue;
                }
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
            queue.work.notify_one();
        }
    }

    /// Commit and queue ([`Fs::commit_last`]), as their last close would have, the staged
    /// files that close could not commit ([`left_uncommitted`]); (key, error) of each that still cannot be. Before,
    /// nothing named them: `bucketfs sync` said all was in the bucket, and a crash then set
    /// their bytes aside in `lost+found`.
    async fn commit_left(&self) -> Vec<(String, String)> {
        let mut failed = Vec::new();
        for (ino, staged) in self.staging.all() {
            let mut st = staged.lock().await;
            if !left_uncommitted(&st) || !self.staging.is_current(ino, &staged) {
                continue;
            }
            if let Err(e) = self.commit_last(ino, &mut st) {
                let key = self.node(ino).map(|n| n.key).unwrap_or_default();
                failed.push((key, format!("{UNCOMMITTED}: {e}")));
            }
        }
        failed
    }
}

/// Why a staged file of [`left_uncommitted`] is named by `status` and `sync`.
const UNCOMMITTED: &str = "changed, but its last close could not commit it (kept locally; `bucketfs sync` tries again)";

/// A staged file changed since its last commit with no handle left to commit it: its last
/// close's commit failed (a full staging disk: ENOSPC), or a mapping wrote it (watched
/// then: [`Fs::linger`]).
fn left_uncommitted(st: &crate::write::Staged) -> bool {
    st.handles == 0 && !st.unlinked && !st.committed() && !st.lingering && !st.is_given()
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
                    Err(FsError::Local(
                        "upload cancelled: the file was renamed, removed or opened for writing meanwhile".into(),
                    ))
                });
                queue.finished(ino, seq, result);
            });
        }
        if fs.strong_count() == 0 || queue.stopped.load(crate::sync::Ordering::Relaxed) {
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
