//! Write-back mode (`--write-back`): `close` returns once the file is staged on local disk;
//! uploads run in the background.
//!
//! A close (or fsync) of a file that changed is a *commit point*: the staged bytes lose their
//! `.open` marker (see [`crate::write`]), so from then on a crash recovers exactly them, and
//! the file joins this queue. Workers upload due files, oldest first, in parallel across
//! files, after `delay` since their last commit (a file rewritten within it goes up once).
//! A failed upload stays queued and is retried with backoff (1 s doubling to 60 s), forever;
//! nothing is dropped. Closes wait (back-pressure) while more than `max_bytes` of committed
//! bytes wait for upload, so local disk use is bounded and a close never fails for room.
//!
//! Reopening a queued file for writing uploads the committed version first, so a crash while
//! it is being rewritten still finds the last closed version in the bucket (the rewrite's
//! unclosed bytes are set aside by recovery, never uploaded).
//!
//! Unlink and rename declare the keys they change exclusively and uploads theirs shared
//! ([`crate::intents`], in both modes: a close's upload too), so a cancel or redirect never
//! races an upload of the same key in flight: an unlinked file is never uploaded, a renamed
//! one (or one in a renamed directory) goes up under its new name, and no stray object is
//! left behind; work on other keys does not wait.

use crate::sync::{Arc, AtomicU64, Mutex, Ordering, Weak};
use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::clock::retry_backoff;
use crate::fs::{Fs, Handle, OpenFile};
use crate::FsError;

/// How write-back behaves; `None` in [`crate::FsConfig::write_back`] means durable at close.
#[derive(Debug, Clone, Copy)]
pub struct WriteBackConfig {
    /// Quiet time after a file's last commit before it is uploaded.
    pub delay: Duration,
    /// Committed bytes waiting for upload above which `close` waits for room.
    pub max_bytes: u64,
    /// Files uploaded at once.
    pub parallel: usize,
}

impl Default for WriteBackConfig {
    fn default() -> Self {
        Self { delay: Duration::from_secs(5), max_bytes: 1024 * 1024 * 1024, parallel: 8 }
    }
}

/// One queued file.
struct Entry {
    key: String,
    bytes: u64,
    /// Its oldest commit not yet in the bucket (for "oldest pending" and the order).
    since: Instant,
    due: Instant,
    /// The entry's last commit: an upload that began before it does not end it.
    seq: u64,
    in_flight: bool,
    /// When its last upload attempt began; `abort` cancels that attempt (a rename or unlink
    /// of the file does not wait for a store that hangs: [`Fs::cancel_upload`]).
    tried_at: Option<Instant>,
    abort: Option<futures::future::AbortHandle>,
    attempts: u32,
    last_error: Option<(Instant, String)>,
    /// The store refused its create-only upload (O_EXCL): another client's object holds
    /// the key. Not tried again until the file is committed again or renamed; `bucketfs
    /// sync` names it.
    refused: bool,
}

/// What `bucketfs status` and the metrics show about the queue.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WriteBackStatus {
    pub files: u64,
    pub bytes: u64,
    pub oldest_secs: u64,
    /// Files whose last upload attempt failed: (key, attempts, error).
    pub failing: Vec<(String, u32, String)>,
    pub uploaded: u64,
    /// Unlinked files whose DELETE is not done yet (deletes.rs).
    pub deletes: u64,
    /// The keys waiting, oldest first (at most [`PENDING_NAMED`]); `true`: being uploaded now.
    pub pending: Vec<(String, bool)>,
}

/// How many waiting keys [`WriteBackStatus::pending`] names.
pub const PENDING_NAMED: usize = 20;

/// The queue of committed files waiting for upload.
#[derive(Default)]
pub(crate) struct Queue {
    /// Lock level 5 (a leaf): taken alone, never across an await.
    entries: Mutex<HashMap<u64, Entry>>,
    uploaded: AtomicU64,
    /// Commit numbers, queue-wide: an upload's end never matches a later entry's commit.
    commits: AtomicU64,
    /// Wakes the scheduler: a file was queued, or `sync` wants everything now.
    work: tokio::sync::Notify,
    /// Wakes closes waiting for room, and `sync` waiting for uploads.
    progress: tokio::sync::Notify,
    /// The keys uploads, unlinks and renames are changing now (intents.rs): lock level 1,
    /// the outermost (docs/ARCHITECTURE.md), held across awaits.
    pub(crate) intents: crate::intents::Intents,
}

/// The store refused a create-only upload: the key holds another client's object.
fn is_refused_create(err: &FsError) -> bool {
    matches!(err, FsError::Exists)
        || matches!(err, FsError::Store(e) if e.kind == bucketfs_store::StoreErrorKind::Exists)
}

impl Queue {
    pub(crate) fn enqueue(&self, ino: u64, key: String, bytes: u64, delay: Duration) {
        let now = Instant::now();
        let mut q = self.entries.lock().unwrap();
        let e = q.entry(ino).or_insert_with(|| Entry {
            key: key.clone(),
            bytes,
            since: now,
            due: now,
            seq: 0,
            in_flight: false,
            tried_at: None,
            abort: None,
            attempts: 0,
            last_error: None,
            refused: false,
        });
        e.key = key;
        e.refused = false;
        e.bytes = bytes;
        e.due = now + delay;
        e.seq = self.commits.fetch_add(1, Ordering::Relaxed) + 1;
        drop(q);
        self.work.notify_one();
    }

    fn bytes(&self) -> u64 {
        self.entries.lock().unwrap().values().map(|e| e.bytes).sum()
    }

    /// Due files not in flight, oldest first, at most `room`, each with the registration
    /// that lets its attempt be cancelled; and when the next one is due.
    fn take_due(&self, room: usize) -> (Vec<(u64, u64, futures::future::AbortRegistration)>, Option<Instant>) {
        let now = Instant::now();
        let mut q = self.entries.lock().unwrap();
        let mut due: Vec<(Instant, u64)> =
            q.iter().filter(|(_, e)| !e.in_flight && !e.refused && e.due <= now).map(|(i, e)| (e.since, *i)).collect();
        due.sort();
        let mut taken = Vec::new();
        for (_, ino) in due.into_iter().take(room) {
            let e = q.get_mut(&ino).expect("listed");
            let (abort, registration) = futures::future::AbortHandle::new_pair();
            (e.in_flight, e.tried_at, e.abort) = (true, Some(now), Some(abort));
            taken.push((ino, e.seq, registration));
        }
        let next = q.values().filter(|e| !e.in_flight && !e.refused).map(|e| e.due).min();
        (taken, next)
    }

    fn in_flight(&self) -> usize {
        self.entries.lock().unwrap().values().filter(|e| e.in_flight).count()
    }

    /// An upload of `ino` (begun at commit `seq`) ended.
    fn finished(&self, ino: u64, seq: u64, result: Result<(), FsError>) {
        let mut q = self.entries.lock().unwrap();
        if let Some(e) = q.get_mut(&ino) {
            (e.in_flight, e.abort) = (false, None);
            match result {
                Ok(()) if e.seq == seq => {
                    q.remove(&ino);
                    self.uploaded.fetch_add(1, Ordering::Relaxed);
                }
                Ok(()) => {} // committed again meanwhile: due at its own time
                Err(err) if is_refused_create(&err) && e.seq == seq => {
                    tracing::error!(key = %e.key, "another client created this key first (the file was created with O_EXCL): \
                        not uploaded, kept here; rename the file to upload it under another name");
                    (e.refused, e.attempts) = (true, e.attempts + 1);
                    e.last_error = Some((
                        Instant::now(),
                        format!(
                            "{err}: another client created it first (O_EXCL); \
                        kept locally, rename it to upload it under another name"
                        ),
                    ));
                }
                Err(err) => {
                    e.attempts += 1;
                    e.due = Instant::now() + retry_backoff(e.attempts);
                    tracing::warn!(key = %e.key, attempts = e.attempts, "write-back upload failed, retrying in {:?}: {err}", retry_backoff(e.attempts));
                    e.last_error = Some((Instant::now(), err.to_string()));
                }
            }
        }
        drop(q);
        self.progress.notify_waiters();
        self.work.notify_one();
    }

    /// Whether `ino` has a version waiting for its upload.
    pub(crate) fn queued(&self, ino: u64) -> bool {
        self.entries.lock().unwrap().contains_key(&ino)
    }

    /// Files whose upload is in flight now.
    pub(crate) fn in_flight_inos(&self) -> Vec<u64> {
        self.entries.lock().unwrap().iter().filter(|(_, e)| e.in_flight).map(|(i, _)| *i).collect()
    }

    /// Cancel `ino`'s upload attempt in flight, if any; whether there was one.
    fn cancel(&self, ino: u64) -> bool {
        let q = self.entries.lock().unwrap();
        match q.get(&ino).filter(|e| e.in_flight).and_then(|e| e.abort.as_ref()) {
            Some(a) => {
                a.abort();
                true
            }
            None => false,
        }
    }

    /// The key `ino` goes up under now (a rename), for what `bucketfs status` names.
    pub(crate) fn set_key(&self, ino: u64, key: &str) {
        if let Some(e) = self.entries.lock().unwrap().get_mut(&ino) {
            e.key = key.to_string();
            e.refused = false; // a rename replaces its target: the upload may go now
        }
        self.work.notify_one();
    }

    pub(crate) fn forget(&self, ino: u64) {
        self.entries.lock().unwrap().remove(&ino);
        self.progress.notify_waiters();
    }

    pub(crate) fn status(&self) -> WriteBackStatus {
        let q = self.entries.lock().unwrap();
        WriteBackStatus {
            files: q.len() as u64,
            bytes: q.values().map(|e| e.bytes).sum(),
            oldest_secs: q.values().map(|e| e.since.elapsed().as_secs()).max().unwrap_or(0),
            failing: q
                .values()
                .filter_map(|e| e.last_error.as_ref().map(|(_, m)| (e.key.clone(), e.attempts, m.clone())))
                .collect(),
            uploaded: self.uploaded.load(Ordering::Relaxed),
            deletes: 0,
            pending: {
                let mut p: Vec<_> = q.values().map(|e| (e.since, e.key.clone(), e.in_flight)).collect();
                p.sort();
                p.into_iter().take(PENDING_NAMED).map(|(_, k, f)| (k, f)).collect()
            },
        }
    }
}

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
        let queue = self.wb.clone();
        crate::sync::spawn(schedule(me, queue, cfg));
    }

    /// Declare an upload of `ino`'s key (intents.rs), as the key is once declared: a
    /// rename that moved it while this waited is waited for, then the new key declared.
    pub(crate) async fn upload_intent(&self, ino: u64) -> crate::intents::Intent<'_> {
        loop {
            let Ok(key) = self.node(ino).map(|n| n.key) else {
                return self.wb.intents.acquire(Vec::new(), false).await; // gone: nothing to guard
            };
            let intent = self.wb.intents.acquire(vec![crate::intents::Scope::Key(key.clone())], false).await;
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
        if !self.write_back() || !self.wb.cancel(ino) {
            return;
        }
        tracing::info!(ino, "upload in flight cancelled by a rename or unlink of its file");
        if let Some(s) = self.staged_of_pub(ino) {
            // Free once the cancelled attempt is dropped.
            let mut st = s.lock().await;
            // Also for a create-only upload: if it lands, the object is this file's (it
            // replaces nothing), and an unlink or rename must delete it.
            st.maybe_landed = true;
            st.in_store |= !st.create_only();
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
            return self.wb.intents.acquire(scopes, true).await;
        }
        loop {
            if let Some(i) = self.wb.intents.try_acquire(scopes.clone(), true) {
                return i;
            }
            self.cancel_uploads_of(key, target).await;
            let wait = self.wb.intents.acquire(scopes.clone(), true);
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
        for ino in self.wb.in_flight_inos() {
            let hit = self.node(ino).is_ok_and(|n| n.key == key || key.ends_with('/') && n.key.starts_with(key));
            if hit || target == Some(ino) {
                self.cancel_upload(ino).await;
            }
        }
    }

    /// What the write-back queue holds now.
    pub fn write_back_status(&self) -> WriteBackStatus {
        let mut s = self.wb.status();
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
        let Some(staged) = self.staged_of_pub(file.ino) else {
            tracing::debug!(ino = file.ino, "write-back commit point: nothing staged");
            return Ok(());
        };
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
                st.commit_as(durable)?;
                // The committed version is this mount's file now (it reaches the store later):
                // handles that read the stored version read it from here on, as an upload
                // would have switched them (read your writes; model test, seed 704951275).
                self.join_handles(file.ino, &mut st);
            }
            if queue && other_writer {
                match self.publish(file.ino, &mut st).await {
                    Ok(()) => {
                        self.wb.forget(file.ino);
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
                self.wb.enqueue(file.ino, key, st.len(), cfg.delay);
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
            let notified = self.wb.progress.notified();
            if self.wb.bytes() <= cfg.max_bytes || self.wb.entries.lock().unwrap().len() <= 1 {
                return Ok(());
            }
            notified.await;
        }
    }

    /// Before a queued file is changed again (opened for writing): upload its committed
    /// version, so a crash during the change still finds it in the bucket.
    pub(crate) async fn upload_before_change(&self, ino: u64) -> Result<(), FsError> {
        if !self.write_back() || !self.wb.entries.lock().unwrap().contains_key(&ino) {
            return Ok(());
        }
        let _intent = self.upload_intent(ino).await;
        self.upload_committed(ino).await?;
        self.wb.forget(ino);
        Ok(())
    }

    /// Upload `ino`'s staged bytes if they are a committed version not yet in the bucket,
    /// and drop the staged copy once clean and unused. Caller holds its upload intent.
    pub(crate) async fn upload_committed(&self, ino: u64) -> Result<(), FsError> {
        let Some(staged) = self.staged_of_pub(ino) else { return Ok(()) };
        let mut st = staged.lock().await;
        self.observe(ino, &mut st)?;
        if st.dirty && !st.unlinked && st.committed() {
            self.publish(ino, &mut st).await?;
        }
        // Not committed: a writer is changing it; its close queues it again. Still mapped:
        // its lingering watch drops it (fs_write.rs).
        let lingering = self.passthrough.lingering.lock().unwrap().contains(&ino);
        if st.handles == 0 && (!st.dirty || st.unlinked) && !lingering {
            if !st.unlinked && self.staged_of_pub(ino).is_some_and(|s| Arc::ptr_eq(&s, &staged)) {
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
        let wanted: Vec<u64> = {
            let mut q = self.wb.entries.lock().unwrap();
            for e in q.values_mut() {
                e.due = started; // due now, backoff or not
            }
            q.keys().copied().collect()
        };
        self.wb.work.notify_one();
        loop {
            let notified = self.wb.progress.notified();
            let mut failed = Vec::new();
            let mut waiting = false;
            {
                let q = self.wb.entries.lock().unwrap();
                for ino in &wanted {
                    let Some(e) = q.get(ino) else { continue };
                    // Failed in an attempt begun since: an attempt that was hanging when the
                    // sync began (a store that stalled, then came back) is tried again first.
                    let tried_since = e.tried_at.is_some_and(|t| t >= started);
                    match &e.last_error {
                        Some((_, msg)) if e.refused => failed.push((e.key.clone(), msg.clone())),
                        Some((at, msg)) if *at >= started && tried_since && !e.in_flight => {
                            failed.push((e.key.clone(), msg.clone()))
                        }
                        _ => waiting = true,
                    }
                }
            }
            if !waiting {
                // And every unlink so far is done in the bucket.
                if let Some(d) = &self.deletes {
                    failed.extend(d.drain_all().await);
                }
                self.store.settle().await; // and its temporary objects are gone
                return failed;
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
            self.wb.work.notify_one();
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

#[cfg(test)]
#[path = "write_back_tests.rs"]
pub(crate) mod tests;

#[cfg(test)]
#[path = "write_back_excl_tests.rs"]
mod excl_tests;
