//! Write-back mode (`--write-back`): `close` returns once the file is staged on local disk;
//! uploads run in the background.
//!
//! A close (or fsync) of a file that changed is a *commit point*: the staged bytes lose their
//! `.open` marker (see [`crate::write`]), so from then on a crash recovers exactly them, and
//! the file joins this queue. Workers upload due files, oldest first, in parallel across
//! files, after `delay` since their last commit (a file rewritten within it goes up once).
//! A failed upload stays queued and is retried with backoff (1 s doubling to 60 s), forever;
//! nothing is dropped. Closes wait (back-pressure) while more than `max_bytes` of committed
//! bytes wait for upload, so local disk use is bounded and a close never fails for room;
//! but not for good: once the store has taken no upload for `STALLED` (2 minutes), a close goes over
//! the bound while the staging disk keeps `max_bytes` free (a hung store must not hang
//! every writer; the data is as safe on disk as the rest of the queue).
//!
//! Reopening a queued file for writing uploads the committed version first, so a crash while
//! it is being rewritten still finds the last closed version in the bucket (the rewrite's
//! unclosed bytes are set aside by recovery, never uploaded).
//!
//! Unlink and rename declare the keys they change exclusively and uploads theirs shared
//! (`crate::intents`, in both modes: a close's upload too), so a cancel or redirect never
//! races an upload of the same key in flight: an unlinked file is never uploaded, a renamed
//! one (or one in a renamed directory) goes up under its new name, and no stray object is
//! left behind; work on other keys does not wait.

use crate::sync::{AtomicU64, Mutex, Ordering};
use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::clock::retry_backoff;
use crate::FsError;

/// How long a close waits at the bound for a store that takes no upload: the two minutes
/// any call waits for a store that hangs (30 s a request, tried 4 times).
pub(crate) const STALLED: Duration = Duration::from_secs(120);

/// How write-back behaves; `None` in [`crate::FsConfig::write_back`] means durable at close.
#[derive(Debug, Clone, Copy)]
pub struct WriteBackConfig {
    /// Quiet time after a file's last commit before it is uploaded.
    pub delay: Duration,
    /// Committed bytes waiting for upload above which `close` waits for room.
    pub max_bytes: u64,
    /// Files uploaded at once.
    pub parallel: usize,
    /// Closed files waiting for upload above which `close` waits for room, as for
    /// `max_bytes`: each holds up to two descriptors (its staged file, and the kernel's
    /// passthrough one), and past the process's limit creates failed with EIO.
    pub max_files: usize,
}

impl Default for WriteBackConfig {
    fn default() -> Self {
        Self { delay: Duration::from_secs(5), max_bytes: 1024 * 1024 * 1024, parallel: 8, max_files: files_bound() }
    }
}

/// [`WriteBackConfig::max_files`] for this process: what its open files limit leaves two
/// descriptors each after 512 kept for everything else (readers, the cache, the store's
/// connections); at least 64.
pub fn files_bound() -> usize {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only the struct passed.
    let cur = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } {
        0 => lim.rlim_cur,
        _ => 1024,
    };
    (cur.min(1 << 20).saturating_sub(512) / 2).max(64) as usize
}

/// A failed upload attempt: when it began and ended, and its error.
struct Failure {
    began: Instant,
    ended: Instant,
    msg: String,
}

/// One queued file.
struct Entry {
    key: String,
    pub(crate) bytes: u64,
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
    /// The attempt that failed last.
    last_error: Option<Failure>,
    /// Its last attempt failed because the store did not answer (its retries ran out):
    /// every other file would fail the same way (see [`Queue::sync_state`]).
    store_down: bool,
    /// The store refused its create-only upload (O_EXCL): another client's object holds
    /// the key. Not tried again until the file is committed again or renamed; `bucketfs
    /// sync` names it.
    refused: bool,
    /// Queued to go up again after an upload that followed a cut-off one (fs_write_back.rs):
    /// not a version a writer must upload first, and due only after its grace.
    resend: bool,
    /// Its attempt was cancelled for a writer ([`Queue::cancel_for_writer`]): not tried
    /// again until that writer's close queues it (or `WRITER_HOLD` passes).
    writer_cut: bool,
}

/// How long an upload cancelled for a writer waits before it is tried again, if that
/// writer's close has not queued a newer version by then.
const WRITER_HOLD: Duration = Duration::from_secs(30);

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
    /// Deferred changes (deletes, directory markers, links, renames) the store refused for
    /// good since mount: not retried, each logged as an error (deletes.rs).
    pub refused: u64,
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
    /// Closes went over `max_bytes` while the store took no upload (said once, until the
    /// queue is back under the bound).
    pub(crate) over_bound: crate::sync::AtomicBool,
    /// Closes at the bound: (uploads done when last seen, since when none was done while
    /// the queue was over the bound). One for the mount: a store that takes no upload holds
    /// the closes [`STALLED`] once, not each of them.
    at_bound: Mutex<(u64, Option<Instant>)>,
    /// Commit numbers, queue-wide: an upload's end never matches a later entry's commit.
    commits: AtomicU64,
    /// Wakes the scheduler: a file was queued, or `sync` wants everything now.
    pub(crate) work: tokio::sync::Notify,
    /// Wakes closes waiting for room, and `sync` waiting for uploads.
    pub(crate) progress: tokio::sync::Notify,
    /// Set at unmount ([`Queue::stop`]): nothing more is sent.
    pub(crate) stopped: crate::sync::AtomicBool,
}

/// The store refused a create-only upload: the key holds another client's object.
fn is_refused_create(err: &FsError) -> bool {
    matches!(err, FsError::Exists)
        || matches!(err, FsError::Store(e) if e.kind == bucketfs_store::StoreErrorKind::Exists)
}

impl Queue {
    /// `bucketfs sync` began at `started`: every queued file is due now, backoff or not.
    /// Returns the files queued.
    pub(crate) fn all_due_now(&self, started: Instant) -> Vec<u64> {
        let mut q = self.entries.lock().unwrap();
        for e in q.values_mut().filter(|e| !e.resend || e.attempts > 0) {
            e.due = started; // a resend keeps its grace (waited for all the same), not a backoff
        }
        q.keys().copied().collect()
    }

    /// Of the files a sync begun at `started` waits for (`wanted`): (key, error) of those
    /// that failed since, and whether any is still to be tried. Once an attempt begun since
    /// found the store not answering, the files not done are named at once: each would
    /// wait for a try of its own that fails the same way (20 closes against a dead store
    /// kept `bucketfs sync` waiting three minutes).
    /// `stalled`: files of [`Queue::stalled_across`] to name as failed too, as the store
    /// still does not answer.
    pub(crate) fn sync_state(
        &self,
        wanted: &[u64],
        started: Instant,
        stalled: &[String],
    ) -> (Vec<(String, String)>, bool) {
        let (mut failed, mut waiting) = (Vec::new(), false);
        let q = self.entries.lock().unwrap();
        // Failed in an attempt begun since: an attempt that was hanging when the sync
        // began (a store that stalled, then came back) is tried again first, unless the
        // store still does not answer (it is in `stalled`).
        let failed_since = |e: &Entry| {
            !e.in_flight
                && e.last_error
                    .as_ref()
                    .is_some_and(|f| f.began >= started || stalled.contains(&e.key) && f.ended >= started)
        };
        let down = q.values().find(|e| e.store_down && failed_since(e)).map(|e| {
            let msg = e.last_error.as_ref().map_or("", |f| f.msg.as_str());
            format!("the store did not answer an upload since the sync began ({}: {msg})", e.key)
        });
        for ino in wanted {
            let Some(e) = q.get(ino) else { continue };
            match (&e.last_error, &down) {
                (Some(f), _) if e.refused || failed_since(e) => failed.push((e.key.clone(), f.msg.clone())),
                // Named as not in the bucket yet: one in flight may still get there.
                (_, Some(why)) if e.in_flight => failed.push((e.key.clone(), format!("upload still in flight; {why}"))),
                (_, Some(why)) => failed.push((e.key.clone(), format!("not uploaded yet: {why}"))),
                (_, None) => waiting = true,
            }
        }
        (failed, waiting)
    }

    /// Of `wanted`, the files whose attempt begun before a sync began at `started` failed
    /// since because the store did not answer (it hung, say, and timed out during the
    /// sync). The store may be back, so the sync tries them again, but only once it
    /// answers ([`Fs::sync_write_back`]): against a store still hanging each try is one
    /// more timeout. Until `hold` they are not tried again in the background meanwhile.
    pub(crate) fn stalled_across(&self, wanted: &[u64], started: Instant, hold: Instant) -> Vec<String> {
        let mut q = self.entries.lock().unwrap();
        let mut stalled = Vec::new();
        for ino in wanted {
            let Some(e) = q.get_mut(ino) else { continue };
            let across = e.last_error.as_ref().is_some_and(|f| f.began < started && f.ended >= started);
            if across && e.store_down && !e.in_flight && !e.refused {
                e.due = e.due.max(hold);
                stalled.push(e.key.clone());
            }
        }
        stalled
    }

    /// Make the files of [`Queue::stalled_across`] due now (the store answers again).
    pub(crate) fn due_now(&self, keys: &[String]) {
        let now = Instant::now();
        for e in self.entries.lock().unwrap().values_mut().filter(|e| keys.contains(&e.key)) {
            e.due = e.due.min(now);
        }
        self.work.notify_one();
    }

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
            store_down: false,
            refused: false,
            resend: false,
            writer_cut: false,
        });
        e.key = key;
        e.refused = false;
        (e.resend, e.writer_cut) = (false, false);
        (e.attempts, e.last_error, e.store_down) = (0, None, false); // a new version: its own attempts
        e.bytes = bytes;
        e.due = now + delay;
        e.seq = self.commits.fetch_add(1, Ordering::Relaxed) + 1;
        drop(q);
        self.work.notify_one();
    }

    /// Files queued.
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().unwrap().len()
    }

    /// Uploads done since the mount began.
    pub(crate) fn uploaded(&self) -> u64 {
        self.uploaded.load(Ordering::Relaxed)
    }

    /// A close waiting at the bound looks at `now`: whether no upload has been done for
    /// [`STALLED`] while the queue was over the bound.
    pub(crate) fn stalled(&self, now: Instant) -> bool {
        let done = self.uploaded();
        let mut at = self.at_bound.lock().unwrap();
        match *at {
            (seen, Some(since)) if seen == done => now.saturating_duration_since(since) >= STALLED,
            _ => {
                *at = (done, Some(now));
                false
            }
        }
    }

    /// A close found the queue under its bound: a later wait at it starts afresh.
    pub(crate) fn under_bound(&self) {
        self.at_bound.lock().unwrap().1 = None;
        self.over_bound.store(false, Ordering::Relaxed);
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.entries.lock().unwrap().values().map(|e| e.bytes).sum()
    }

    /// Due files not in flight, oldest first, at most `room`, each with the registration
    /// that lets its attempt be cancelled; and when the next one is due.
    pub(crate) fn take_due(
        &self,
        room: usize,
    ) -> (Vec<(u64, u64, futures::future::AbortRegistration)>, Option<Instant>) {
        let now = Instant::now();
        let mut q = self.entries.lock().unwrap();
        if self.stopped.load(Ordering::Relaxed) {
            return (Vec::new(), None);
        }
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

    pub(crate) fn in_flight(&self) -> usize {
        self.entries.lock().unwrap().values().filter(|e| e.in_flight).count()
    }

    /// An upload of `ino` (begun at commit `seq`) ended.
    pub(crate) fn finished(&self, ino: u64, seq: u64, result: Result<(), FsError>) {
        let mut q = self.entries.lock().unwrap();
        if let Some(e) = q.get_mut(&ino) {
            (e.in_flight, e.abort) = (false, None);
            let began = e.tried_at.unwrap_or_else(Instant::now);
            match result {
                Ok(()) if e.seq == seq => {
                    q.remove(&ino);
                    self.uploaded.fetch_add(1, Ordering::Relaxed);
                }
                Ok(()) => {} // committed again meanwhile: due at its own time
                Err(err) if is_refused_create(&err) && e.seq == seq => {
                    tracing::error!(key = %e.key, "another client created this key first (the file was created with O_EXCL): \
                        not uploaded, kept here; rename the file to upload it under another name");
                    (e.refused, e.attempts, e.store_down) = (true, e.attempts + 1, false);
                    let msg = format!(
                        "{err}: another client created it first (O_EXCL); \
                        kept locally, rename it to upload it under another name"
                    );
                    e.last_error = Some(Failure { began, ended: Instant::now(), msg });
                }
                Err(_) if std::mem::take(&mut e.writer_cut) => {
                    // Not a failure: a writer changes it, and its close queues it again.
                    e.due = Instant::now() + WRITER_HOLD;
                    tracing::debug!(key = %e.key, "write-back upload cancelled for a writer");
                }
                Err(err) => {
                    e.attempts += 1;
                    e.due = Instant::now() + retry_backoff(e.attempts);
                    tracing::warn!(key = %e.key, attempts = e.attempts, "write-back upload failed, retrying in {:?}: {err}", retry_backoff(e.attempts));
                    e.last_error = Some(Failure { began, ended: Instant::now(), msg: err.to_string() });
                    e.store_down = err.store_unreachable();
                }
            }
        }
        drop(q);
        self.progress.notify_waiters();
        self.work.notify_one();
    }

    /// Whether `ino` has a version waiting for its first upload (not only a resend).
    pub(crate) fn queued_version(&self, ino: u64) -> bool {
        self.entries.lock().unwrap().get(&ino).is_some_and(|e| !e.resend)
    }

    /// Queue `ino` to go up again after `delay` (see `Entry::resend`).
    pub(crate) fn enqueue_resend(&self, ino: u64, key: String, bytes: u64, delay: Duration) {
        self.enqueue(ino, key, bytes, delay);
        if let Some(e) = self.entries.lock().unwrap().get_mut(&ino) {
            e.resend = true;
        }
    }

    /// Files whose upload is in flight now.
    pub(crate) fn in_flight_inos(&self) -> Vec<u64> {
        self.entries.lock().unwrap().iter().filter(|(_, e)| e.in_flight).map(|(i, _)| *i).collect()
    }

    /// At unmount, once its own tries are done: no upload is started or retried any more,
    /// and those in flight are cancelled (the files stay staged for the next mount).
    /// Before, against a store that hung, the queue's retries held the process 100 s past
    /// the unmount's tries (tester I: 205 s after SIGTERM).
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        for e in self.entries.lock().unwrap().values() {
            if let Some(a) = e.abort.as_ref() {
                a.abort();
            }
        }
        self.work.notify_one();
    }

    /// Cancel `ino`'s upload attempt in flight, if any; whether there was one.
    pub(crate) fn cancel(&self, ino: u64) -> bool {
        let q = self.entries.lock().unwrap();
        match q.get(&ino).filter(|e| e.in_flight).and_then(|e| e.abort.as_ref()) {
            Some(a) => {
                a.abort();
                true
            }
            None => false,
        }
    }

    /// [`Queue::cancel`] for a writer of the file: the upload waits for that writer's close
    /// (which queues it again) instead of taking the file back a second later.
    pub(crate) fn cancel_for_writer(&self, ino: u64) -> bool {
        let mut q = self.entries.lock().unwrap();
        match q.get_mut(&ino).filter(|e| e.in_flight) {
            Some(e) => {
                e.writer_cut = true;
                e.due = Instant::now() + WRITER_HOLD;
                if let Some(a) = e.abort.as_ref() {
                    a.abort();
                }
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
                .filter_map(|e| e.last_error.as_ref().map(|f| (e.key.clone(), e.attempts, f.msg.clone())))
                .collect(),
            uploaded: self.uploaded.load(Ordering::Relaxed),
            deletes: 0,
            refused: 0,
            pending: {
                let mut p: Vec<_> = q.values().map(|e| (e.since, e.key.clone(), e.in_flight)).collect();
                p.sort();
                p.into_iter().take(PENDING_NAMED).map(|(_, k, f)| (k, f)).collect()
            },
        }
    }
}

#[cfg(test)]
#[path = "write_back_tests.rs"]
pub(crate) mod tests;

#[cfg(test)]
#[path = "write_back_excl_tests.rs"]
mod excl_tests;

#[cfg(test)]
#[path = "write_back_crash_tests.rs"]
mod crash_tests;

#[cfg(test)]
#[path = "write_back_landing_tests.rs"]
mod landing_tests;

#[cfg(test)]
#[path = "write_back_rename_tests.rs"]
mod rename_tests;
