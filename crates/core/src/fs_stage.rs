//! The steps that need both the namespace and the staging area (`staging.rs`): create,
//! join, observe and drop a staged file. The bytes and their uploads
//! are [`crate::write`]; opening, reading and writing through handles is `fs_write.rs`.
//!
//! Lock order (docs/ARCHITECTURE.md, "Locking"): a staged file's own mutex, then
//! `Fs::table`, then the staging area's map; nothing takes the table while holding the map.

use std::time::SystemTime;

use crate::fs::Fs;
use crate::inode::{ChildMeta, Version};
use crate::write::{SharedStaged, Staged};
use crate::FsError;

/// The largest file a staging fills from the read caches, not the store.
const CACHED_FILL_MAX: u64 = 64 << 20;

impl Fs {
    /// Drop `ino`'s staged file from the map (called under that file's lock), and with it
    /// the node's claim that its attributes are owned here (`Node::local`).
    pub(crate) fn unstage(&self, ino: u64) {
        self.unmap(ino, None);
    }

    /// The name is gone (unlink, or replaced by a rename): never upload these bytes; drop
    /// them now unless a handle still reads them (then at its last close).
    pub(crate) async fn discard_staged(&self, ino: u64) {
        let Some(staged) = self.staging.get(ino) else { return };
        let mut st = staged.lock().await;
        self.discard_locked(ino, &staged, &mut st);
    }

    /// [`Fs::discard_staged`] with the staged file locked.
    pub(crate) fn discard_locked(&self, ino: u64, staged: &SharedStaged, st: &mut Staged) {
        st.unlinked = true;
        st.drop_key();
        self.staging.queue.forget(ino);
        if st.handles == 0 {
            // Removed under the staged lock: `stage` re-checks the map after taking it.
            self.unstage_this(ino, staged, st);
        }
    }

    /// [`Fs::unstage`] if `staged` (locked: `st`) is still `ino`'s staged file: a task that
    /// found it earlier must not drop a newer one an open made since (write_back.rs). A
    /// clean one's crash-recovery sidecars go with it ([`Staged::leave_clean`]).
    pub(crate) fn unstage_this(&self, ino: u64, staged: &SharedStaged, st: &mut Staged) {
        if self.unmap(ino, Some(staged)) {
            st.leave_clean();
        }
    }

    /// Remove `ino`'s entry from the staging map (only if it is `this`, when given), stop
    /// watching its file and clear `Node::local`, all under the table lock: an open staging
    /// the file again meanwhile (map entry, then `local`, then the kernel's backing file)
    /// comes wholly after, so no step of this removal undoes one of its (a late `unwatch`
    /// dropped the new file's watch: `stat` then showed the old size while the kernel wrote
    /// the new file; model test). Lock order: table, map, watched.
    fn unmap(&self, ino: u64, this: Option<&SharedStaged>) -> bool {
        let mut t = self.table.lock().unwrap();
        if !self.staging.remove(ino, this) {
            return false;
        }
        let watched_len = self.staging.unwatch(ino);
        if let Some(n) = t.get_mut(ino) {
            if let Some(len) = watched_len.filter(|len| *len != n.size) {
                n.size = len;
                n.written_at(SystemTime::now());
            }
            n.local = false;
        }
        true
    }

    /// Children of `dir` that exist only locally so far (created, not yet uploaded).
    pub(crate) fn staged_children(&self, dir: u64) -> Vec<ChildMeta> {
        let inos = self.staging.inos();
        let t = self.table.lock().unwrap();
        inos.iter()
            .filter_map(|i| t.get(*i))
            .filter(|n| n.parent == dir && t.child(dir, &n.name).map(|c| c.ino) == Some(n.ino))
            .map(|n| n.entry())
            .collect()
    }

    /// `ino`'s node if no staged file exists, checked and read under one table lock. A node
    /// read before that check may be from the middle of another handle's O_TRUNC-write-close
    /// cycle (size 0 or the new size, with the old ETag): a reader built on it returns short
    /// reads the kernel fills with zeros. `None`: staged now, read the staged file.
    /// `Some`: the handle about to open on it is counted (`Node::opens`) under the same
    /// lock, so from the version read here on another client's version splits off to a
    /// new inode (`Node::replaced_by`) instead of changing this one: counted only at the
    /// handle's insertion, a refresh in between took the new version in place, and this
    /// handle's reads of the old one shared the kernel's page cache with the new one's
    /// (tester H: one handle read bytes of two versions).
    pub(crate) fn unstaged_node_opened(&self, ino: u64) -> Result<Option<crate::inode::Node>, FsError> {
        // Lock order table -> staged map, as elsewhere. Staging inserts into the map before it
        // changes the node's size, and an upload updates the node before the map entry goes.
        let mut t = self.table.lock().unwrap();
        if self.staging.contains(ino) {
            return Ok(None);
        }
        let n = t.get_mut(ino).ok_or(FsError::NotFound)?;
        if let Some(e) = stale_path(n) {
            return Err(e);
        }
        n.opens += 1;
        Ok(Some(n.clone()))
    }

    /// Stage `node`'s bytes with no handle counted, for the late-landing watch to send
    /// them again (late.rs); whether they are staged. A failure is logged: the rename goes on.
    pub(crate) async fn stage_for_late(&self, node: &crate::inode::Node) -> bool {
        if self.staging.contains(node.ino) {
            return true;
        }
        match self.stage(node, false, false, false).await {
            Ok(staged) => {
                staged.lock().await.handles -= 1;
                true
            }
            Err(e) => {
                tracing::warn!(key = %node.key, "cannot stage a file renamed where an upload cut off may land: {e}");
                false
            }
        }
    }

    /// The staged file of `node`, created (and filled from the store) if needed; counts a handle.
    /// `writer`: for a handle that changes it (an upload in flight is waited for only so
    /// long: `Fs::lock_to_change`). `upload_first`: an `O_TRUNC` of a version still queued
    /// (write-back) tries to upload it first (`false` once that failed: the store is not
    /// answering).
    pub(crate) async fn stage(
        &self,
        node: &crate::inode::Node,
        truncate: bool,
        writer: bool,
        mut upload_first: bool,
    ) -> Result<SharedStaged, FsError> {
        loop {
            match self.stage_once(node, truncate, writer, std::mem::take(&mut upload_first)).await {
                Ok(Some(s)) => return Ok(s),
                Ok(None) => {}
                Err(e) => {
                    // A try that claimed the node (`Node::local`) and then failed to stage it
                    // (the staging directory unwritable) must not leave the claim behind:
                    // listings would never correct its size again.
                    let mut t = self.table.lock().unwrap();
                    if !self.staging.contains(node.ino) {
                        if let Some(n) = t.get_mut(node.ino) {
                            n.local = false;
                        }
                    }
                    return Err(e);
                }
            }
        }
    }

    /// One try of [`Fs::stage`]; `None` if the staged file was dropped (its last handle
    /// closed) between finding it and locking it: then try again. `upload_first`: an
    /// `O_TRUNC` of a queued version may try to upload it first (write-back).
    async fn stage_once(
        &self,
        node: &crate::inode::Node,
        truncate: bool,
        writer: bool,
        upload_first: bool,
    ) -> Result<Option<SharedStaged>, FsError> {
        // A new staged file is locked before it is published in the map, so no other open
        // sees it half-filled (an O_TRUNC open would otherwise have its empty file filled).
        let (shared, guard) = self.staging.get_or_create(node.ino)?;
        if guard.is_some() {
            let gone = self.table.lock().unwrap().get(node.ino).and_then(stale_path);
            if let Some(e) = gone {
                self.unstage(node.ino);
                return Err(e);
            }
        }
        // Moved here, the move not sent yet (write-back), the version it moves whole in the
        // disk cache: filled from there, with no HEAD or GET of the new key (both wait for
        // the move: with the store hanging, an append to a renamed file waited 4 minutes,
        // then failed with ETIMEDOUT; tester U).
        let moving = match guard.is_some() && !truncate {
            true => self.node(node.ino).ok().and_then(|n| self.reader_of_pending_move(&n)),
            false => None,
        };
        if guard.is_some() && !truncate && moving.is_none() {
            // To be filled from the store, pinned to the version the node names: one not
            // validated within the TTL is asked about first (a directory rename gives the
            // moved objects new generations; the fill's If-Match then failed with ESTALE).
            // Within a bound, as `open`'s own check: a store that does not answer leaves the
            // version known here (a fill from the read caches needs no store; appends and
            // truncates of an uploaded file waited 2 minutes for a hanging one).
            let stale = |n: &crate::inode::Node| !self.fresh(n.validated) || n.version == Version::Unknown;
            if let Some(cur) = self.node(node.ino).ok().filter(|n| stale(n) && n.size > 0) {
                let checked = match cur.version {
                    Version::Unknown => self.revalidate(&cur, false).await,
                    _ => self.revalidate_within_as(&cur, false).await,
                };
                if let Err(e) = checked {
                    self.unstage(node.ino);
                    return Err(e);
                }
            }
        }
        if writer || guard.is_some() || self.staging.owns(node.ino) {
            // From now on no listing or HEAD changes its size (see `unstage`). A reader
            // joining a settled file leaves it settled (`Fs::settle_readers`).
            self.claim(node.ino);
        }
        let fresh = guard.is_some();
        let mut st = match guard {
            Some(g) => g,
            // A writer waits for an upload in flight only so long (write-back).
            None if writer => self.lock_to_change(node.ino, &shared).await,
            // A reader joins the bytes an upload shows rather than wait for the store.
            None => match self.staging.lock_unless_shown(node.ino, &shared).await {
                Some(g) => g,
                None => return Ok(self.staging.join_shown(node.ino)),
            },
        };
        if !fresh && !self.staging.is_current(node.ino, &shared) {
            return Ok(None);
        }
        if truncate && !fresh && upload_first && self.staging.queue.queued_version(node.ino) {
            // Write-back: a version closed while this open waited for the lock is queued:
            // it goes up first (its intent before the staged lock), then try again. If the
            // store does not take it in time, the truncate keeps it as `<file>.base` for a
            // crash to recover (write_commit.rs) until its upload.
            drop(st);
            self.upload_before_change(node.ino).await;
            return Ok(None);
        }
        // What the kernel wrote directly (passthrough) counts below.
        self.observe(node.ino, &mut st)?;
        if !fresh && !truncate && writer && !st.dirty && !self.write_back() {
            // A version closed here whose file stays for passthrough (lingering, or open
            // for reading), edited again: as a fill from the store would (its If-Match),
            // only while the bucket still holds it.
            let current = self.node(node.ino).unwrap_or_else(|_| node.clone());
            if let Err(e) = self.check_still_stored(&current).await {
                drop(st);
                return Err(e);
            }
        }
        // The node as of now: with our entry in the map no other open changes it, and the
        // caller's copy may predate a whole write-close cycle of another handle.
        let node = &if fresh { self.node(node.ino).unwrap_or_else(|_| node.clone()) } else { node.clone() };
        // A version whole in the disk cache is taken over, not fetched (passthrough.rs).
        // Without write-back (another client may write the bucket too) only once the store
        // says it still holds that version, as a fill's If-Match would (else the fill below
        // fails so): an edit never goes up over another client's newer version.
        let mut adopted = false;
        if fresh && node.size > 0 {
            let unconfirmed = !truncate && !self.write_back() && self.would_adopt(node);
            if !unconfirmed || self.check_still_stored(node).await.is_ok() {
                adopted = self.adopt_whole(node, &mut st, truncate)?;
            }
        }
        if fresh && !truncate && node.size > 0 && !adopted {
            // On a write-back mount (the bucket's main writer) from the read caches if they
            // hold the whole version (a file just written or read here: `chmod`, an append),
            // else from the store (whose If-Match finds another client's replacement).
            let (key, size, tag) = (&node.key, node.size, node.version.tag());
            let filled = async {
                let moved = |b| moving.as_ref().and_then(|r| r.cached_block(b));
                if moving.is_some() && st.fill_cached(key, size, None, crate::read::BLOCK, moved).await? {
                    return Ok(()); // (no version stored under the new key yet to patch)
                }
                if self.write_back() {
                    let reader = self.reader_for(node);
                    let whole = reader.all_cached(CACHED_FILL_MAX);
                    if whole && st.fill_cached(key, size, tag, crate::read::BLOCK, |b| reader.cached_block(b)).await? {
                        return Ok(());
                    }
                }
                st.fill_from(self.store.as_ref(), key, size, tag).await
            }
            .await;
            if let Err(e) = filled {
                self.unstage(node.ino);
                drop(st);
                if matches!(&e, FsError::Store(s) if s.kind == bucketfs_store::StoreErrorKind::NotFound) {
                    // Deleted by another client since the mount looked (within the TTL):
                    // ESTALE, so the kernel looks the name up again and an `O_CREAT` open
                    // creates the file (it failed with ENOENT for the TTL: tester J).
                    crate::fs::note_deleted(&mut self.table.lock().unwrap(), node);
                    return Err(FsError::Stale(format!("{} was deleted in the bucket", node.key)));
                }
                return Err(e);
            }
        }
        // O_TRUNC of an object with bytes (in the bucket or staged) must upload the empty file.
        if truncate && (!st.is_empty() || fresh && node.size > 0) {
            st.set_key(&node.key)?;
            st.truncate_on_open(fresh.then(|| self.reader_for(node)))?;
            self.set_local_size(node.ino, 0);
        }
        st.handles += 1;
        if writer {
            // Counted under the staged lock: no release settles it from now on, and one
            // that settled it before this lock is undone here.
            st.writers += 1;
            self.claim(node.ino);
        } else {
            // A reader joining a file written and uploaded here: its writer's release may
            // have found it still held (a mapping, or the kernel's passthrough file not
            // let go yet: `Fs::linger`) and left it the mount's own, hiding another
            // client's version from then on (tester A).
            self.settle_readers(node.ino, &st);
        }
        drop(st);
        Ok(Some(shared))
    }

    /// `ino`'s attributes are the mount's own (`Node::local`), its staged file not settled.
    pub(crate) fn claim(&self, ino: u64) {
        let mut t = self.table.lock().unwrap();
        if let Some(n) = t.get_mut(ino) {
            n.local = true;
        }
        self.staging.set_settled(ino, false);
    }

    /// A staged file (`st`, locked) whose writers have all closed, its bytes in the
    /// bucket, and only readers left: the name is the store's again (`Node::local`
    /// cleared). Another client's newer version is then seen by `stat` and new opens (a
    /// new inode: `Node::replaced_by`), while these readers go on reading the bytes they
    /// opened, as on a local disk; before, the name showed the old version until the last
    /// reader closed. A writer's open, or a change through a mapping, claims it back.
    pub(crate) fn settle_readers(&self, ino: u64, st: &Staged) {
        if st.handles == 0 || st.writers > 0 || st.dirty || st.unlinked || st.replaces || st.maybe_landed {
            return;
        }
        let mut t = self.table.lock().unwrap();
        // Only with the version's identity known: else nothing tells another client's
        // version from this one, and a listing would lay its size over the readers' file.
        let Some(n) = t.get_mut(ino).filter(|n| n.linked && n.version.tag().is_some() && n.size == st.size) else {
            return;
        };
        if self.staging.set_settled(ino, true) {
            n.local = false;
            tracing::debug!(ino, readers = st.handles, "written and uploaded, only read now: the store's again");
        }
    }

    /// Catch up with what the kernel wrote to `ino`'s staged file directly (passthrough):
    /// the staged state and the node's size (listings and renames copy it) follow the file.
    pub(crate) fn observe(&self, ino: u64, st: &mut Staged) -> Result<(), FsError> {
        if st.observe()? {
            self.claim(ino); // changed through a mapping: the mount's own again
            self.set_local_size(ino, st.size);
        }
        Ok(())
    }

    pub(crate) fn set_local_size(&self, ino: u64, size: u64) {
        if let Some(n) = self.table.lock().unwrap().get_mut(ino) {
            n.size = size;
            n.written_at(SystemTime::now());
        }
    }
}

/// The error for an open of `n` if no name leads to it any more and no handle holds it: a name
/// the kernel looked up just before this mount's own rename or unlink took it (`mv a.tmp a`
/// while another process opens `a`). Its bytes may exist nowhere else (write-back: staged
/// only, and dropped). ESTALE makes the kernel look the name up again and open the file
/// that has it now (the VFS retries an open once so), as for another client's
/// replacement; before, the open or its reads failed with ENOENT or ESTALE (tester I).
fn stale_path(n: &crate::inode::Node) -> Option<FsError> {
    (!n.linked && n.opens == 0)
        .then(|| FsError::Stale(format!("{} was replaced or removed here after its lookup", n.key)))
}
