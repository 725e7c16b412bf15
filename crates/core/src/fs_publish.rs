//! A staged file's upload and what it shows: the node's new version, the block caches
//! (write-through of small files), the readers of open handles; and the attributes an
//! upload carries (mode, owner, mtime, what another client stored with the object).

use crate::sync::Arc;
use std::time::{Instant, SystemTime};

use crate::fs::{Fs, Handle};
use crate::inode::Version;
use crate::write::Staged;
use crate::FsError;

use super::WRITE_THROUGH_MAX;

impl Fs {
    /// What to keep with `node`'s object at upload, on stores that keep them: its mode and
    /// owner where set here (or carried before), and always the mtime the mount shows, as
    /// rclone does. Else the store's time of the upload became the mtime a new mount shows:
    /// a `chmod` (uploaded again) or a write-back upload made later moved it (tester W).
    pub(crate) fn attrs_to_keep(&self, node: &crate::inode::Node) -> bucketfs_store::FileAttrs {
        if self.store.capabilities().keeps_attrs {
            // (Of a file the kernel writes, the staged file's: [`Fs::attr`].)
            bucketfs_store::FileAttrs { mtime: Some(self.attr(node).mtime), ..node.attrs() }
        } else {
            Default::default()
        }
    }

    /// Record the attributes `ino`'s upload is to carry beside its staged bytes, for crash
    /// recovery ([`crate::write::Staged::keep_attrs`]): at each commit point and change.
    pub(crate) fn keep_attrs(&self, ino: u64, st: &mut Staged) {
        let Ok(node) = self.node(ino) else { return };
        if let Err(e) = st.keep_attrs(&self.attrs_to_keep(&node)) {
            tracing::warn!(key = %node.key, "mode, owner and mtime not kept for crash recovery: {e}");
        }
    }

    /// A commit point of `ino`'s staged file ([`Staged::commit_as`]), with the attributes its
    /// upload is to carry recorded beside it: what a crash recovers from here on.
    pub(crate) fn commit_staged(&self, ino: u64, st: &mut Staged, fsync: bool, keep: bool) -> Result<(), FsError> {
        st.commit_as(fsync, keep)?;
        self.keep_attrs(ino, st);
        Ok(())
    }

    pub(crate) async fn upload_pub(&self, ino: u64) -> Result<(), FsError> {
        self.upload_ino(ino, false).await
    }

    /// The mode, owner and mtime `node`'s object may carry, and what another client stored
    /// with it, which go with its upload: a listing does not tell them, a HEAD does (else
    /// an edit of a file first seen in a listing uploaded it without them, and a script
    /// lost its x bit; a chmod dropped a web site's Cache-Control). Only for the version
    /// the node holds, and only what the store answers within `KNOWN_ANSWER_WAIT`: any
    /// other outcome (an error, another version, no answer yet) leaves the open as before.
    /// The answer is remembered for that version ([`crate::inode::Node::attrs_asked`]).
    pub(super) async fn learn_attrs(&self, node: &crate::inode::Node) {
        let Some(Ok(h)) = self.head_briefly(&node.key).await else { return };
        self.learned_attrs(node, &h);
    }

    /// Record what a HEAD of `node`'s key answered ([`Fs::learn_attrs`]), if it is of the
    /// version the node holds.
    pub(crate) fn learned_attrs(&self, node: &crate::inode::Node, h: &bucketfs_store::ObjectHead) {
        let mut t = self.table.lock().unwrap();
        let same = |n: &&mut crate::inode::Node| {
            n.linked && n.key == node.key && n.holds_version(h.meta.etag.as_deref(), h.meta.size)
        };
        if let Some(n) = t.get_mut(node.ino).filter(same) {
            n.fill_attrs(&h.attrs);
            n.attrs_asked = n.version_mark(); // the next open does not ask again
        }
    }

    /// HEAD `key`, waiting `KNOWN_ANSWER_WAIT` at most: `None` if no answer came by then.
    pub(crate) async fn head_briefly(
        &self,
        key: &str,
    ) -> Option<Result<bucketfs_store::ObjectHead, bucketfs_store::StoreError>> {
        let (store, key) = (self.store.clone(), key.to_string());
        let head = async move { store.head(&key, Default::default()).await };
        crate::sync::within(crate::fs::KNOWN_ANSWER_WAIT, head).await
    }

    /// Upload `ino`'s staged data if it changed; the durability point of flush and fsync.
    /// `only_if_sole`: only if no other handle has it open, decided under the staged lock.
    pub(super) async fn upload_ino(&self, ino: u64, only_if_sole: bool) -> Result<(), FsError> {
        let Some(staged) = self.staging.get(ino) else { return Ok(()) };
        let mut st = staged.lock().await;
        self.observe(ino, &mut st)?;
        if !st.dirty || st.unlinked || only_if_sole && st.handles > 1 {
            return Ok(());
        }
        // What goes up is a version someone closed: if the upload fails, the next mount
        // recovers these bytes (write.rs).
        self.commit_staged(ino, &mut st, false, false)?;
        self.publish(ino, &mut st).await
    }

    /// Upload `ino`'s staged bytes (the caller holds its lock and checked they are dirty),
    /// then show the new version: node, block caches, readers of open handles.
    pub(crate) async fn publish(&self, ino: u64, st: &mut Staged) -> Result<(), FsError> {
        let node = self.node(ino)?;
        // An upload of it cut off may land over this one later: the key is watched (late.rs).
        let late = st.landing();
        let meta = st
            .upload(self.store.as_ref(), &node.key, &self.cfg.write, &self.attrs_to_keep(&node))
            .await
            .map_err(|e| match e {
                FsError::Store(e) if e.kind == bucketfs_store::StoreErrorKind::Exists => {
                    tracing::error!(key = %node.key, "created with O_EXCL, but another writer made this object first: not replaced; the bytes stay staged ({e})");
                    FsError::Exists
                }
                e => {
                    tracing::warn!(key = %node.key, "upload failed; data kept in staging: {e}");
                    FsError::UploadFailed(Box::new(e))
                }
            })?;
        let size = st.size;
        // Write-through: what was just uploaded is read back soon (make after a clone, a
        // test after its build), so small files go into the block caches under the new ETag.
        // Only with the upload's own identity: without it a cached block could be claimed
        // by another writer's version. While handles stay open (an fsync), the staged file
        // serves the reads and the next fsync makes a new version: the bytes go into the
        // caches at the last close instead (each fsync of an appender copied the whole file).
        // Not when the staged file changed during the upload (a shared mapping's writes,
        // seen by the upload's last look: dirty again): its bytes are not that version's.
        let through =
            !st.dirty && size <= WRITE_THROUGH_MAX && (meta.etag.is_some() || !self.store.capabilities().prefix_dirs);
        // The node, caches and readers are updated before the staged lock is released: two
        // uploads of one file (a flush, then the next open's flush) must publish their
        // versions in order, or the node would go back to the older ETag for its whole TTL.
        {
            let mut t = self.table.lock().unwrap();
            // The upload's own answer is the newest news: one to a request sent before it
            // (a HEAD or listing in flight meanwhile) is not recorded over it.
            let ticket = t.ask();
            // No ETag in the response (some stores): ask the store at the next access.
            let (version, validated) = match meta.etag.as_deref() {
                Some(tag) => (Version::Tag(tag.to_string()), self.cfg.clock.now()),
                None if !self.store.capabilities().prefix_dirs => (Version::Untagged, self.cfg.clock.now()),
                None => (Version::Unknown, t.expired_instant(self.cfg.metadata_ttl)),
            };
            // Its mtime stays that of its last write here, as a local file's: the store's
            // is the upload's, so a chmod's upload moved it (make rebuilt), and so did a
            // write-back upload seconds later. Not where the mtime names the version (a
            // store with no ETag, only test doubles now), which must be the stored file's.
            let mtime = match meta.etag {
                Some(_) => self.staging.watched_state(ino).map(|(_, m)| m),
                None => Some(meta.mtime.unwrap_or_else(SystemTime::now)),
            };
            let Some(n) = t.get_mut(ino) else { return Ok(()) };
            n.size = size;
            n.version = version;
            // The object has what this upload sent: the next open (a chmod's) need not ask.
            n.attrs_asked = n.version_mark();
            n.mtime = mtime.unwrap_or(n.mtime);
            n.validated = validated;
            n.answered = ticket;
            t.relist(ino);
        }
        // So may a try of this one the store sent twice (timed out, then sent again).
        let md5s: Vec<[u8; 16]> = late.late_md5s().iter().copied().chain(st.sent_twice.take()).collect();
        self.late.watch(&node.key, &md5s, Some(ino), Instant::now());
        // Kept now, not only at the last close: a writer with the file open already (or
        // one opening beside a reader) must find this version kept aside (tester L).
        self.kept_for_late(ino, st);
        let now = self.node(ino)?;
        let identity = now.identity();
        tracing::debug!(ino, key = %now.key, %identity, size, "uploaded");
        st.cache_pending = (through && st.handles > 0).then(|| identity.clone());
        // Handles that read through the store must now read the version we just wrote.
        let fresh = self.reader_for(&now);
        self.replace_readers(ino, &fresh);
        if through && st.handles == 0 {
            self.write_through(&now.key, &identity, st)?;
        }
        Ok(())
    }

    /// Put the staged bytes (the version `identity` of `key`) into the block caches.
    fn write_through(&self, key: &str, identity: &str, st: &Staged) -> Result<(), FsError> {
        let mut off = 0;
        while off < st.size {
            let data = st.read(off, crate::read::BLOCK as u32)?;
            self.read_cache.remember(key, identity, st.size, off / crate::read::BLOCK, data);
            off += crate::read::BLOCK;
        }
        Ok(())
    }

    /// At the last close: the write-through [`Fs::publish`] left for it, if the node still
    /// shows the version uploaded then (nothing changed since: the file is clean).
    pub(super) fn write_through_pending(&self, ino: u64, st: &mut Staged) {
        let Some(identity) = st.cache_pending.take() else { return };
        let Ok(node) = self.node(ino) else { return };
        if st.dirty || node.size != st.size || node.identity() != identity {
            return;
        }
        if let Err(e) = self.write_through(&node.key, &identity, st) {
            tracing::debug!(ino, "no write-through at close: {e}");
        }
    }

    /// Point the handles open on `ino` that read through the store at `reader`.
    pub(crate) fn replace_readers(&self, ino: u64, reader: &Arc<crate::read::FileReader>) {
        for h in self.handles.lock().unwrap().values() {
            if let Handle::File(f) = h {
                if f.ino == ino {
                    *f.reader.lock().unwrap() = reader.clone();
                }
            }
        }
    }
}
