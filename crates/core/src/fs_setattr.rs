//! setattr: chmod, chown, utimens and truncate, and the attributes kept in the store.

use std::time::SystemTime;

use crate::fs::{Attr, Fs, Kind, SetAttr};
use crate::FsError;

impl Fs {
    /// chmod, chown, utimens, truncate. Size changes are staged (and uploaded at once when
    /// no handle is given, since no close will follow a truncate(2)).
    pub async fn setattr(&self, ino: u64, change: SetAttr) -> Result<Attr, FsError> {
        let SetAttr { size, mode, uid, gid, mtime, fh } = change;
        let node = self.node(ino)?;
        if let Some(size) = size {
            if node.kind == Kind::Dir {
                return Err(FsError::IsDir);
            }
            let temp = match fh.filter(|_| self.staging.contains(ino)) {
                Some(_) => None,
                None => Some(self.open(ino, true, size == 0).await?),
            };
            if let Some(h) = temp.or(fh) {
                self.mark_wrote(h);
            }
            if let Some(staged) = self.staging.get(ino) {
                let mut st = self.lock_to_change(ino, &staged).await;
                self.observe(ino, &mut st)?;
                st.set_key(&node.key)?;
                st.truncate(size)?;
            }
            self.set_size(ino, size);
            if let Some(tfh) = temp {
                self.flush(tfh).await?;
                self.release(tfh).await?;
            }
        }
        if let Some(staged) = self.staging.get(ino).filter(|_| mtime.is_some()) {
            // Writes the kernel made itself (passthrough) are seen first, as made before the
            // mtime is set (`cp -p`, `tar x` set it on the open file): seen only at the
            // close, they moved it to the close's time. Not waiting for an upload in flight
            // (it looks at the file itself), nor cutting it off for a `touch`.
            if let Ok(mut st) = staged.try_lock() {
                self.observe(ino, &mut st)?;
            }
        }
        let (before, attr) = {
            let mut t = self.table.lock().unwrap();
            let n = t.get_mut(ino).ok_or(FsError::NotFound)?;
            let before = n.attrs();
            self.set_attrs(n, mode, uid, gid, mtime);
            (before, self.attr(n))
        };
        let node = self.node(ino)?;
        if node.kind == Kind::File && node.attrs() != before && self.store.capabilities().keeps_attrs {
            self.persist_attrs(&node, fh).await?;
        }
        Ok(attr)
    }

    /// Keep a file's new mode, owner or mtime in the bucket: with the staged file's upload
    /// at its close, or (closed files up to 64 MiB) by uploading it again now. Larger closed
    /// files keep the change for the mount's life only (SEMANTICS.md).
    async fn persist_attrs(&self, node: &crate::inode::Node, fh: Option<u64>) -> Result<(), FsError> {
        if let Some(staged) = self.staging.get(node.ino) {
            // Staged unchanged by a handle open for writing (`touch` opens the file, then
            // sets its mtime; fchmod): from the mount's copy, as for a closed file below.
            // Before, a write-back `touch` brought a file another client had deleted back
            // with its old bytes (tester J, S3 and GCS). Not a file unlinked here, whose
            // object this mount deleted itself (`fchmod` after `rm` of an open file).
            let unchanged = staged.try_lock().is_ok_and(|st| !st.dirty && st.in_store && !st.unlinked);
            if unchanged && self.write_back() && self.gone_from_store(node).await {
                return Err(FsError::NotFound);
            }
            // A change: waits for an upload in flight only so long (write-back).
            let mut st = self.lock_to_change(node.ino, &staged).await;
            // Else the last handle's RELEASE (which comes after close returned) dropped it
            // while this waited: marked there, the change was never uploaded, and the next
            // mount set the file aside as never closed. It goes up as a closed file's.
            if self.staging.is_current(node.ino, &staged) {
                st.set_key(&node.key)?;
                st.mark_changed();
                // A settled file (only read, `Fs::settle_readers`) changed: the mount's own
                // again, or another client's version would split it off and this upload,
                // at the last reader's close, go up over that version.
                self.claim(node.ino);
                self.keep_attrs(node.ino, &mut st);
                if let Some(h) = fh {
                    self.mark_wrote(h);
                }
                return Ok(());
            }
        }
        if node.size > super::WRITE_THROUGH_MAX {
            tracing::debug!(key = %node.key, "mode/owner/mtime of a large closed file kept for this mount only");
            return Ok(());
        }
        if self.write_back() && self.gone_from_store(node).await {
            return Err(FsError::NotFound);
        }
        let temp = self.open(node.ino, true, false).await?;
        if let Some(staged) = self.staging.get(node.ino) {
            let mut st = staged.lock().await;
            st.set_key(&node.key)?;
            st.mark_changed();
            self.keep_attrs(node.ino, &mut st);
        }
        self.mark_wrote(temp);
        let flushed = self.flush(temp).await;
        self.release(temp).await?;
        flushed
    }

    /// Whether the store says `node`'s object is gone (another client deleted it), asked
    /// for `KNOWN_ANSWER_WAIT` at most. A write-back re-upload for new attributes stages
    /// the file from the mount's copy without asking the store, and brought a file deleted
    /// elsewhere back with its old bytes (tester W). No answer in time (an outage) tells
    /// nothing: the change goes on as before.
    /// An answer of the same version tells what the object carries ([`Fs::learn_attrs`]).
    async fn gone_from_store(&self, node: &crate::inode::Node) -> bool {
        match self.head_briefly(&node.key).await {
            Some(Ok(h)) => {
                self.learned_attrs(node, &h);
                false
            }
            Some(Err(e)) => e.kind == bucketfs_store::StoreErrorKind::NotFound,
            None => false,
        }
    }

    fn set_attrs(
        &self,
        n: &mut crate::inode::Node,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        mtime: Option<SystemTime>,
    ) {
        if let Some(m) = mode {
            n.perm = Some((m & 0o7777) as u16);
        }
        if uid.is_some() || gid.is_some() {
            let (u, g) = n.owner.unwrap_or((self.cfg.uid, self.cfg.gid));
            n.owner = Some((uid.unwrap_or(u), gid.unwrap_or(g)));
        }
        if let Some(t) = mtime {
            n.mtime = t;
            n.mtime_set = Some(t);
        }
        if mode.is_some() || uid.is_some() || gid.is_some() || mtime.is_some() {
            n.ctime = Some(SystemTime::now());
            n.attrs_here = true; // kept for the mount's life (`Node::attrs_here`)
        }
    }

    fn set_size(&self, ino: u64, size: u64) {
        if let Some(n) = self.table.lock().unwrap().get_mut(ino) {
            n.size = size;
            n.written_at(SystemTime::now());
        }
    }
}
