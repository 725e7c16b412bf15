//! Passthrough's side of `Fs`: which opens the kernel may serve from a local file, and the
//! bookkeeping of staged files the kernel writes directly. How it works: [`crate::passthrough`].

use crate::passthrough::{is_staged_identity, staged_identity, Backing, SETTLE, WHOLE_MIN};
use crate::sync::{Arc, Ordering::Relaxed};
use crate::Fs;
use std::time::Duration;

impl Fs {
    /// What the kernel would use for handle `fh`, if it can use a local file: the staged
    /// file of a staged inode (any handle), or the version a read-only handle pinned if it is
    /// large enough to be kept whole. `None` for an `O_RDONLY|O_TRUNC` handle (emptied at
    /// its flush, through us) and for small objects.
    ///
    /// A handle opened before its file was staged (a writer came meanwhile) reads the staged
    /// file, as [`Fs::read`] does: it joins it here, counted among the staged file's
    /// handles, so the file lives while the kernel reads it for this handle.
    pub async fn passthrough_identity(&self, fh: u64) -> Option<String> {
        let f = self.open_file(fh).ok()?;
        if f.truncate_at_flush.load(Relaxed) {
            return None;
        }
        if !f.staged.load(Relaxed) {
            if let Some(staged) = self.staging.get(f.ino) {
                // An upload shows it: reads go through us (`Fs::read` uses the shown bytes).
                let mut st = self.staging.lock_unless_shown(f.ino, &staged).await?;
                if self.staging.is_current(f.ino, &staged) {
                    join_staged(&f, &mut st);
                }
            }
        }
        if f.staged.load(Relaxed) {
            return self.staging.get(f.ino).map(|s| staged_identity(&s));
        }
        let r = f.reader.lock().unwrap().clone();
        (r.size >= WHOLE_MIN).then(|| r.identity().to_string())
    }

    /// The local file for handle `fh` (see [`Fs::passthrough_identity`]): for a staged
    /// inode, its staged file, watched from now on; else the whole-object file of the version
    /// `fh` pinned, built from the disk cache's blocks if they are all there. `Err`: why
    /// not, for the log.
    pub async fn backing_file(&self, fh: u64) -> Result<Backing, &'static str> {
        let identity = self.passthrough_identity(fh).await.ok_or("truncating or small")?;
        let f = self.open_file(fh).map_err(|_| "handle gone")?;
        if is_staged_identity(&identity) {
            return self.staged_backing(f.ino, identity, f.writable).await;
        }
        let r = f.reader.lock().unwrap().clone();
        let disk = self.read_cache.disk().ok_or("no disk cache")?.clone();
        let (key, size) = (r.key.to_string(), r.size);
        // Blocks still queued for the disk may complete it: worth a short wait, but only
        // when few enough are missing for the queue to hold them all. A cold file waited
        // for the whole mount's queue at every open (2 s under parallel streams).
        let missing = disk.missing_blocks(&key, &identity, size);
        if missing > 0 && missing <= crate::read::DISK_QUEUE as u64 {
            self.read_cache.disk_settled(SETTLE).await;
        }
        let id = identity.clone();
        let found = crate::sync::blocking(move || {
            if !disk.is_complete(&key, &id, size) {
                return Err("not all of it on local disk");
            }
            disk.whole(&key, &id, size).ok_or("disk cache file unusable")
        })
        .await
        .ok_or("task failed")??;
        Ok(Backing { file: found.file, identity, _pin: Some(found.pin) })
    }

    /// Before a writable handle `fh` of a staged file passes through to it (a backing file
    /// already given to the kernel included): its writes land unseen, so the committed
    /// version not yet uploaded is copied aside first (write_commit.rs). `Err`: why not
    /// (`FsError::NoSpace`: no room on the staging disk for the copy).
    pub async fn keep_committed_for(&self, fh: u64) -> Result<(), crate::FsError> {
        let f = self.open_file(fh)?;
        let staged = match self.staging.get(f.ino) {
            Some(s) if f.writable => s,
            _ => return Ok(()),
        };
        let mut st = self.lock_to_change(f.ino, &staged).await;
        self.keep_aside(f.ino, &mut st)
    }

    /// The committed version of `ino` not yet uploaded, copied aside before a writer the
    /// kernel serves changes it (the caller holds the staged lock).
    fn keep_aside(&self, ino: u64, st: &mut crate::write::Staged) -> Result<(), crate::FsError> {
        self.observe(ino, st).and_then(|()| st.keep_committed()).inspect_err(|e| {
            tracing::warn!(ino, "the committed version could not be kept aside: {e}");
        })
    }

    /// `ino`'s staged file for the kernel, watched from now on (see the module doc); for a
    /// `writable` handle, whose writes we will not see before they land, with the committed
    /// version not yet uploaded copied first (write_commit.rs).
    async fn staged_backing(&self, ino: u64, identity: String, writable: bool) -> Result<Backing, &'static str> {
        let staged = self.staging.get(ino).ok_or("not staged any more")?;
        let node = self.node(ino).map_err(|_| "gone")?;
        let (key, shown) = (node.key.clone(), node.mtime_set.unwrap_or(node.mtime));
        // An upload holds it (and the store may hang): this open reads through us instead.
        let Some(mut st) = self.staging.lock_unless_shown(ino, &staged).await else {
            return Err("being uploaded");
        };
        // Still the map's (its upload may have dropped it while this waited for the lock):
        // a watch on a dropped file would outlive it.
        let current = self.staging.is_current(ino, &staged);
        if !current || staged_identity(&staged) != identity {
            return Err("staged again meanwhile");
        }
        if writable {
            self.keep_aside(ino, &mut st).map_err(|_| "staged file unusable")?;
        }
        let file = st.watch_external(&key, Some(shown)).map_err(|e| {
            tracing::warn!(ino, "staged file not handed to the kernel: {e}");
            "staged file unusable"
        })?;
        let second = st.dup().map_err(|_| "cannot duplicate the staged file")?;
        self.staging.watched.lock().unwrap().insert(ino, Arc::new(second));
        drop(st);
        self.feed_watched(ino, staged);
        Ok(Backing { file, identity, _pin: None })
    }

    /// A staged file the kernel writes, on a durable mount: hand the parts it completes to
    /// an eager upload, as bucketfs's own writes do, so close sends only the tail. Parts may
    /// change after they were sent (the kernel writes anywhere): the upload checks each
    /// against the file before it completes, and sends the file whole if one changed
    /// (write.rs). Ticks every 200 ms while the file stays staged and watched; feeds only
    /// while the file grows (a file rewritten in place, a database, would waste uploads).
    fn feed_watched(&self, ino: u64, staged: crate::write::SharedStaged) {
        const TICK: Duration = Duration::from_millis(200);
        if self.write_back() || !self.staging.feeding.lock().unwrap().insert(ino) {
            return;
        }
        let me = self.me.clone();
        crate::sync::spawn(async move {
            let mut last = 0;
            loop {
                tokio::time::sleep(TICK).await;
                let Some(fs) = me.upgrade() else { return };
                if !fs.staging.is_current(ino, &staged) {
                    break;
                }
                let mut st = staged.lock().await;
                if !st.watched() || st.unlinked || fs.observe(ino, &mut st).is_err() {
                    break;
                }
                let grew = std::mem::replace(&mut last, st.size) < st.size;
                if !grew || st.size < fs.cfg.write.part_size as u64 {
                    continue;
                }
                let Ok(node) = fs.node(ino) else { break };
                if let Err(e) =
                    st.eager_feed(fs.store.as_ref(), &node.key, &fs.cfg.write, &fs.attrs_to_keep(&node)).await
                {
                    tracing::debug!(key = %node.key, "eager upload stopped: {e}");
                }
            }
            if let Some(fs) = me.upgrade() {
                fs.staging.feeding.lock().unwrap().remove(&ino);
            }
        });
    }

    /// At the close of a handle that read through the store: if all but a few blocks of the
    /// version are on disk now, fetch those in the background, so the next open passes
    /// through.
    pub(crate) fn prepare_backing(&self, file: &crate::fs::OpenFile) {
        if file.staged.load(Relaxed) || !self.passthrough.on.load(Relaxed) {
            return;
        }
        let r = file.reader.lock().unwrap().clone();
        let Some(disk) = self.read_cache.disk().cloned() else { return };
        if r.size < WHOLE_MIN || disk.is_complete(&r.key, r.identity(), r.size) {
            return;
        }
        // Another handle open on the file may read through the same reader (they share one
        // after an upload or a rename: `Fs::replace_readers`): its close prepares instead.
        let shared = self.handles.lock().unwrap().values().any(|h| match h {
            crate::fs::Handle::File(f) => Arc::ptr_eq(&f.reader.lock().unwrap(), &r),
            _ => false,
        });
        if shared {
            return;
        }
        r.quiesce(); // the fill keeps the reader; not its blocks and fetches ahead
        let cache = self.read_cache.clone();
        crate::sync::spawn(async move {
            cache.disk_settled(SETTLE).await;
            // Blocks that skipped a lagging disk are fetched again, up to a quarter of them.
            r.fill_disk(r.size.div_ceil(crate::read::BLOCK) / 4 + 1).await;
        });
    }

    /// The last close of a staged file holding the version just uploaded: the disk cache
    /// takes the file over as that version's whole file (a rename; its CRC32C read once), so
    /// reading back what was just written passes through to it, with no download. Only
    /// with passthrough on, and where an ETag names the version (size and mtime could name
    /// an older one). The caller holds the staged lock and drops the staged file next.
    pub(crate) async fn keep_as_whole(&self, ino: u64, st: &mut crate::write::Staged) {
        if !self.passthrough.on.load(Relaxed) {
            return;
        }
        let Some(disk) = self.read_cache.disk().cloned() else { return };
        let Ok(node) = self.node(ino) else { return };
        if node.version.tag().is_none() || node.size != st.size || node.size < WHOLE_MIN || !node.linked {
            return;
        }
        let identity = node.identity();
        if disk.is_complete(&node.key, &identity, node.size) {
            return;
        }
        let Some(path) = st.as_uploaded() else { return };
        // Clean, in the bucket, and unstaged by the caller next: its key sidecar goes before
        // the data file moves (a crash between would leave a key with no data, which
        // recovery takes for data lost).
        st.drop_key();
        let (key, size) = (node.key.clone(), node.size);
        let given = crate::sync::blocking(move || disk.give_whole(&key, &identity, size, &path)).await;
        if given == Some(true) {
            st.given_away();
        } else {
            tracing::debug!(ino, "staged file not kept as a whole-object file");
        }
    }

    /// A fresh staged file of `node` takes over the whole-object file of the node's version,
    /// if the disk cache has one: no download, and readers passing through that file (the
    /// kernel's one backing file of the inode) read the staged file from now on, so the
    /// writer can pass through to it too. The handles already open on the file count as
    /// the staged file's from then on: it lives while the kernel reads it for them.
    ///
    /// An `O_TRUNC` open (`truncate`) takes it only while readers pass through it (the
    /// kernel's one backing file): otherwise it needs none of its bytes, and handles reading
    /// the version through the store must keep reading it, not the emptied file.
    pub(crate) fn adopt_whole(
        &self,
        node: &crate::inode::Node,
        st: &mut crate::write::Staged,
        truncate: bool,
    ) -> Result<bool, crate::FsError> {
        let Some(disk) = self.read_cache.disk() else { return Ok(false) };
        let identity = node.identity();
        if !self.passthrough.on.load(Relaxed) || node.size < WHOLE_MIN {
            return Ok(false);
        }
        let pinned = disk.whole_pinned(&node.key, &identity);
        if truncate && !pinned {
            return Ok(false);
        }
        if !st.adopt(node.size, |to| disk.take_whole(&node.key, &identity, node.size, to))? {
            return Ok(false);
        }
        // Its version is the bucket's: the first upload sends only what changed.
        let patches = self.store.capabilities().patches && node.size >= crate::write::patch::MIN_PATCH;
        if let Some(etag) = node.version.tag().filter(|_| patches && !truncate) {
            if let Err(e) = st.remember_stored(&node.key, etag) {
                tracing::debug!(key = %node.key, "the first upload will be whole: {e}");
            }
        }
        if pinned {
            self.join_handles(node.ino, st);
        } // else handles reading it through the store keep their version
        Ok(true)
    }

    /// Whether [`Fs::adopt_whole`] would take `node`'s version over from the disk cache
    /// (a non-truncating open).
    pub(crate) fn would_adopt(&self, node: &crate::inode::Node) -> bool {
        let Some(disk) = self.read_cache.disk() else { return false };
        self.passthrough.on.load(Relaxed)
            && node.size >= WHOLE_MIN
            && disk.is_complete(&node.key, &node.identity(), node.size)
    }

    /// `Ok` if the bucket still holds the version `node` names (a HEAD); else `ESTALE`, as
    /// a fill pinned to that version gets (or the store's error).
    pub(crate) async fn check_still_stored(&self, node: &crate::inode::Node) -> Result<(), crate::FsError> {
        let h = self.store.head(&node.key, Default::default()).await?;
        if node.holds_version(h.meta.etag.as_deref(), h.meta.size) {
            return Ok(());
        }
        Err(crate::FsError::Stale(format!("{} was replaced in the bucket", node.key)))
    }

    /// Every handle open on `ino` reads its staged file `st` from now on ([`join_staged`]).
    pub(crate) fn join_handles(&self, ino: u64, st: &mut crate::write::Staged) {
        for h in self.handles.lock().unwrap().values() {
            if let crate::fs::Handle::File(f) = h {
                if f.ino == ino {
                    join_staged(f, st);
                }
            }
        }
    }

    /// Close `fh`, a handle opened only to stage its file (the adapter's, while a writer's
    /// open is answered): while other handles of the file remain it uploads nothing (they
    /// do, at their own close); the last one closes as [`Fs::release`] does.
    pub async fn release_quietly(&self, fh: u64) -> Result<(), crate::FsError> {
        let file = self.open_file(fh)?;
        if let Some(staged) = self.staging.get(file.ino) {
            let mut st = staged.lock().await;
            if file.staged.load(Relaxed) && st.handles > 1 && self.handles.lock().unwrap().remove(&fh).is_some() {
                self.count_open(file.ino, false);
                self.kernel_finished_open(&file);
                st.drop_handle(file.writable);
                return Ok(());
            }
        }
        self.release(fh).await
    }

    /// Whether opens may pass through: set by the adapter once the kernel granted it (and
    /// cleared if registering a backing file fails). Whole files are built ahead only then.
    pub fn set_passthrough(&self, on: bool) {
        self.passthrough.on.store(on, Relaxed);
    }

    /// Whether backing files can exist at all: they live in the disk cache.
    pub fn passthrough_possible(&self) -> bool {
        self.read_cache.disk().is_some()
    }

    pub fn passthrough_on(&self) -> bool {
        self.passthrough.on.load(Relaxed)
    }

    /// Count an open the kernel serves from a backing file; a writable one writes unseen,
    /// so its flush publishes whatever changed.
    pub fn note_passthrough_open(&self, fh: u64) {
        self.passthrough.opens.fetch_add(1, Relaxed);
        if let Ok(f) = self.open_file(fh) {
            if f.writable {
                f.writes_unseen.store(true, Relaxed);
            }
        }
    }

    /// Opens served from a backing file since mount.
    pub fn passthrough_opens(&self) -> u64 {
        self.passthrough.opens.load(Relaxed)
    }
}

/// Handle `f`, opened before its file was staged, reads the staged file `st` from now on
/// and counts among its handles (the file then lives until it closes). Once per handle.
pub(crate) fn join_staged(f: &crate::fs::OpenFile, st: &mut crate::write::Staged) {
    if !f.staged.swap(true, crate::sync::Ordering::Relaxed) {
        st.handles += 1;
    }
}
