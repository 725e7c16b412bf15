//! The staging area: the files this mount is writing, beside the namespace (the inode
//! table) and the read path.
//!
//! It holds which inodes have a staged file on local disk (the bytes and their uploads are
//! [`crate::write`]), the mount-wide bound on upload part buffers, the write-back queue of
//! committed files, and the bookkeeping of staged files the kernel writes without us
//! (FUSE passthrough: watched, fed to an eager upload, lingering after their last close).
//! Nothing here looks at names or keys; the steps that need both the namespace and a
//! staged file (stage, unstage, observe) are `Fs`'s, in `fs_stage.rs`.
//!
//! Locks (docs/ARCHITECTURE.md, "Locking"): the map is level 3, taken after `Fs::table`
//! when both are needed, never the other way round; `watched` likewise comes after the
//! table (attributes are built under it); `feeding` and the queue's entries
//! are leaves. None is held across an await; a staged file's own tokio mutex (level 2)
//! is taken before any of them.

use crate::sync::{Arc, Mutex};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use crate::part_budget::PartBudget;
use crate::write::{SharedStaged, Staged};
use crate::write_back::Queue;
use crate::FsError;

pub(crate) struct Staging {
    /// Where staged files live (`FsConfig::staging_dir`).
    dir: PathBuf,
    /// Inodes with staged (local) data. Lock level 3, after `Fs::table`.
    map: Mutex<HashMap<u64, SharedStaged>>,
    /// Upload part buffers of every file, bounded together.
    pub(crate) budget: PartBudget,
    /// Files committed and waiting for upload (write-back mode only).
    pub(crate) queue: Arc<Queue>,
    /// Staged files the kernel may write directly, by inode: their attributes come from
    /// the file itself. After `Fs::table`.
    pub(crate) watched: Mutex<HashMap<u64, Arc<std::fs::File>>>,
    /// Inodes with a task feeding their parts to an eager upload (`Fs::feed_watched`).
    /// A leaf lock.
    pub(crate) feeding: Mutex<HashSet<u64>>,
    /// Staged files a background upload holds locked, with the bytes every handle reads
    /// (see [`Staging::show`]). A leaf lock.
    views: Mutex<HashMap<u64, Shown>>,
    /// Staged files no longer the mount's own: written, in the bucket, and only read now
    /// ([`crate::Fs::settle_readers`]). A leaf lock.
    settled: Mutex<HashSet<u64>>,
}

/// The bytes of a staged file while an upload holds its lock: a descriptor of the file
/// and its length. Nothing but the kernel (passthrough) writes it meanwhile.
pub(crate) type View = (Arc<std::fs::File>, u64);

/// A shown staged file: its bytes, the file, and the read-only opens that joined it
/// meanwhile (not counted in its `handles` yet: that needs its lock).
struct Shown {
    view: View,
    staged: SharedStaged,
    joins: usize,
}

/// A locked staged file whose bytes are shown while this lives ([`Staging::show`]); it
/// derefs to the file. Dropped (the upload done, failed or cancelled), it stops showing
/// and counts the opens that joined meanwhile in `handles`, before the lock is released.
pub(crate) struct Showing<'a, 'b> {
    staging: &'a Staging,
    ino: u64,
    st: &'b mut Staged,
}

impl std::ops::Deref for Showing<'_, '_> {
    type Target = Staged;
    fn deref(&self) -> &Staged {
        self.st
    }
}

impl std::ops::DerefMut for Showing<'_, '_> {
    fn deref_mut(&mut self) -> &mut Staged {
        self.st
    }
}

impl Drop for Showing<'_, '_> {
    fn drop(&mut self) {
        if let Some(shown) = self.staging.views.lock().unwrap().remove(&self.ino) {
            self.st.handles += shown.joins;
        }
    }
}

impl Staging {
    pub(crate) fn new(dir: PathBuf, upload_budget: u64) -> Self {
        Self {
            dir,
            map: Mutex::new(HashMap::new()),
            budget: PartBudget::new(upload_budget),
            queue: Default::default(),
            watched: Mutex::new(HashMap::new()),
            feeding: Mutex::new(HashSet::new()),
            views: Mutex::new(HashMap::new()),
            settled: Mutex::new(HashSet::new()),
        }
    }

    /// While the returned guard lives, reads and read-only opens of `ino` use `st`'s bytes
    /// without its lock: a background upload (write-back) holds the lock for as long as the
    /// store takes, and a store that hangs must not stall readers of a closed file. Shows
    /// nothing while an `O_TRUNC` is pending (handles then read different bytes). `st` is
    /// `staged`, locked by the caller; the guard borrows it, so it ends before the lock.
    pub(crate) fn show<'b>(&self, ino: u64, staged: &SharedStaged, st: &'b mut Staged) -> Showing<'_, 'b> {
        if let Some(view) = st.read_view() {
            self.views.lock().unwrap().insert(ino, Shown { view, staged: staged.clone(), joins: 0 });
        }
        Showing { staging: self, ino, st }
    }

    /// The bytes of `ino` shown by an upload holding its staged file (see [`Staging::show`]).
    pub(crate) fn view(&self, ino: u64) -> Option<View> {
        self.views.lock().unwrap().get(&ino).map(|s| s.view.clone())
    }

    /// A read-only open joins `ino`'s shown staged file without its lock: counted among
    /// its handles when the upload ends. `None`: not shown (stage it as usual).
    pub(crate) fn join_shown(&self, ino: u64) -> Option<SharedStaged> {
        let mut views = self.views.lock().unwrap();
        let shown = views.get_mut(&ino)?;
        shown.joins += 1;
        Some(shown.staged.clone())
    }

    /// A reader's wait for `staged`'s lock (`ino`'s staged file): `None` as soon as an
    /// upload holding it shows its bytes, which the reader takes instead of waiting for
    /// the store. (An upload can take the lock, or be ahead in its queue, before it shows:
    /// a reader that only looked once waited for a hanging store, 2 minutes.)
    pub(crate) async fn lock_unless_shown(
        &self,
        ino: u64,
        staged: &SharedStaged,
    ) -> Option<tokio::sync::OwnedMutexGuard<Staged>> {
        const LOOK_AGAIN: std::time::Duration = std::time::Duration::from_millis(10);
        if let Ok(g) = staged.clone().try_lock_owned() {
            return Some(g);
        }
        // One lock future throughout: the reader keeps its place in the mutex's queue.
        let lock = staged.clone().lock_owned();
        tokio::pin!(lock);
        loop {
            if self.views.lock().unwrap().get(&ino).is_some_and(|s| Arc::ptr_eq(&s.staged, staged)) {
                return None;
            }
            if let Ok(g) = tokio::time::timeout(LOOK_AGAIN, &mut lock).await {
                return Some(g);
            }
        }
    }

    pub(crate) fn contains(&self, ino: u64) -> bool {
        self.map.lock().unwrap().contains_key(&ino)
    }

    /// Whether `ino` has a staged file that is the mount's own: its attributes answer for
    /// the name, not the store's (all but a settled one: [`crate::Fs::settle_readers`]).
    pub(crate) fn owns(&self, ino: u64) -> bool {
        self.contains(ino) && !self.settled.lock().unwrap().contains(&ino)
    }

    /// Mark `ino`'s staged file settled (true) or the mount's own again (false); whether
    /// that changed anything. The caller holds `Fs::table`.
    pub(crate) fn set_settled(&self, ino: u64, settled: bool) -> bool {
        match settled {
            true => self.contains(ino) && self.settled.lock().unwrap().insert(ino),
            false => self.settled.lock().unwrap().remove(&ino),
        }
    }

    /// `ino`'s staged file, if it has one.
    pub(crate) fn get(&self, ino: u64) -> Option<SharedStaged> {
        self.map.lock().unwrap().get(&ino).cloned()
    }

    /// Whether `staged` is still `ino`'s staged file: a task that found it earlier must
    /// not act on a newer one an open made since.
    pub(crate) fn is_current(&self, ino: u64, staged: &SharedStaged) -> bool {
        self.map.lock().unwrap().get(&ino).is_some_and(|s| Arc::ptr_eq(s, staged))
    }

    /// Every staged file, at this moment.
    pub(crate) fn all(&self) -> Vec<(u64, SharedStaged)> {
        self.map.lock().unwrap().iter().map(|(i, s)| (*i, s.clone())).collect()
    }

    /// The inodes with a staged file, at this moment.
    pub(crate) fn inos(&self) -> Vec<u64> {
        self.map.lock().unwrap().keys().copied().collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }

    /// Staged files with changes not yet in the bucket. One locked right now (being
    /// written or uploaded) counts as pending.
    pub(crate) fn pending(&self) -> usize {
        let staged: Vec<SharedStaged> = self.map.lock().unwrap().values().cloned().collect();
        staged.iter().filter(|s| s.try_lock().map(|st| st.dirty && !st.unlinked).unwrap_or(true)).count()
    }

    /// `ino`'s staged file, and if this call made it (empty, on disk), its lock: a new
    /// staged file is locked before it is published, so no other open sees it half-filled
    /// (an O_TRUNC open would otherwise have its empty file filled).
    pub(crate) fn get_or_create(
        &self,
        ino: u64,
    ) -> Result<(SharedStaged, Option<tokio::sync::OwnedMutexGuard<Staged>>), FsError> {
        let mut map = self.map.lock().unwrap();
        if let Some(s) = map.get(&ino) {
            return Ok((s.clone(), None));
        }
        std::fs::create_dir_all(&self.dir).map_err(|e| FsError::Local(e.to_string()))?;
        let s = Arc::new(tokio::sync::Mutex::new(Staged::create(&self.dir, ino, self.budget.clone())?));
        let g = s.clone().try_lock_owned().expect("a new mutex is free");
        map.insert(ino, s.clone());
        Ok((s, Some(g)))
    }

    /// Remove `ino`'s staged file from the map (only if it is `this`, when given); whether
    /// it was removed. The caller holds the table (`Fs::unmap`).
    pub(crate) fn remove(&self, ino: u64, this: Option<&SharedStaged>) -> bool {
        let mut map = self.map.lock().unwrap();
        if this.is_some_and(|this| !map.get(&ino).is_some_and(|s| Arc::ptr_eq(s, this))) {
            return false;
        }
        map.remove(&ino);
        self.settled.lock().unwrap().remove(&ino);
        true
    }

    /// Stop reading `ino`'s attributes from its staged file; its length now, if it was
    /// watched.
    pub(crate) fn unwatch(&self, ino: u64) -> Option<u64> {
        let file = {
            let mut w = self.watched.lock().unwrap();
            if w.is_empty() {
                return None;
            }
            w.remove(&ino)
        };
        file.and_then(|f| f.metadata().ok()).map(|m| m.len())
    }

    /// A watched staged file's length and mtime, read from the file (the kernel may have
    /// written it without us); `None` if `ino` is not watched.
    pub(crate) fn watched_state(&self, ino: u64) -> Option<(u64, std::time::SystemTime)> {
        let w = self.watched.lock().unwrap();
        if w.is_empty() {
            return None;
        }
        let m = w.get(&ino)?.metadata().ok()?;
        Some((m.len(), m.modified().ok()?))
    }
}
