//! Reading files through their handles: a staged file's bytes, or the version the handle
//! opened, through the read caches and the store (`read.rs`). A handle whose version is
//! gone from the bucket before it returned anything takes the one there now.

use crate::sync::{Arc, Ordering};

use bytes::Bytes;

use crate::fs::{Fs, OpenFile};
use crate::read::FileReader;
use crate::FsError;

/// Versions one read may move on to, each replacing the last while it was being read.
const NEW_VERSIONS_PER_READ: usize = 3;

impl Fs {
    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Bytes, FsError> {
        let file = self.open_file(fh)?;
        self.kernel_finished_open(&file);
        if let Some(staged) = self.staging.get(file.ino) {
            file.served.store(true, Ordering::Relaxed); // this version's bytes, if any
                                                        // An upload holds it: the bytes it shows (the same for every handle). Changed
                                                        // under this read (the upload ended and a writer truncated the file), the lock
                                                        // decides.
            let mut st = match staged.clone().try_lock_owned() {
                Ok(st) => st,
                Err(_) => loop {
                    if let Some((f, len)) = self.staging.view(file.ino) {
                        match crate::write::read_at(&f, offset, size, len) {
                            Ok(b) => return Ok(b),
                            Err(_) => break staged.clone().lock_owned().await, // the lock decides
                        }
                    }
                    if let Some(st) = self.staging.lock_unless_shown(file.ino, &staged).await {
                        break st;
                    }
                },
            };
            self.observe(file.ino, &mut st)?;
            if file.wrote.load(Ordering::Relaxed) {
                return st.read(offset, size);
            }
            match st.read_old(offset, size) {
                Ok(r) => return r,
                Err(Some(old)) => {
                    drop(st);
                    return old.read(offset, size).await;
                }
                Err(None) => {}
            }
        }
        // Unlinked or replaced since open, on a store that cannot pin a read to a version
        // (no If-Match: local folder, memory, Drive): its key may hold another file now,
        // whose bytes the reader would return as this one's (model test soak, mem://).
        // The capability first: on S3 and GCS this costs no table lock per read.
        let unpinned = !self.store.capabilities().read_if_match;
        if unpinned && self.table.lock().unwrap().get(file.ino).is_none_or(|n| !n.linked) {
            return Err(FsError::Stale("the file was removed or replaced since it was opened".into()));
        }
        let mut reader = file.reader.lock().unwrap().clone();
        let mut moves = 0;
        loop {
            match reader.read(offset, size).await {
                Ok(bytes) => {
                    // Returned from the handle's version only: one another read replaced
                    // meanwhile (`Fs::take_new_version`) is read again.
                    let cur = file.reader.lock().unwrap();
                    if Arc::ptr_eq(&cur, &reader) {
                        file.served.store(true, Ordering::Relaxed);
                        return Ok(bytes);
                    }
                    reader = cur.clone();
                }
                Err(e @ FsError::Stale(_)) => {
                    moves += 1;
                    match self.version_gone(&file, &reader, (offset, size)).await {
                        Some(now) if moves <= NEW_VERSIONS_PER_READ => reader = now,
                        _ => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A read found that `gone`, the version `file` reads, is no longer in the bucket: if
    /// the node still names it, the store is asked (one HEAD, within a bound) so the next
    /// open reads what is there now. An object another client replaced after this mount
    /// listed it failed every open's first read with `ESTALE` for the whole TTL (60 s in
    /// write-back mode; tester F): the open took the listing's version as fresh.
    /// Then the handle reads the new version, if it may ([`Fs::take_new_version`]).
    async fn version_gone(&self, file: &OpenFile, gone: &Arc<FileReader>, read: (u64, u32)) -> Option<Arc<FileReader>> {
        let node = self.node(file.ino).ok()?;
        if node.identity() == gone.identity() && !node.local {
            // The only handle, nothing returned yet: the node takes the new version with
            // its inode rather than split it off, so this handle may read it.
            let keep = u32::from(self.may_take_new_version(file));
            if let Err(e) = self.revalidate_within_keeping(&node, keep).await {
                tracing::debug!(ino = node.ino, key = %node.key, "asking after a version gone from the bucket: {e}");
            }
        }
        self.take_new_version(file, gone, read)
    }

    /// Whether `file` may move on to another version: it returned nothing yet, the
    /// kernel's pages were dropped at its open (none of an older version are read), and
    /// no other handle is open on the file (whose reads may fill the kernel's pages).
    fn may_take_new_version(&self, file: &OpenFile) -> bool {
        !file.keep_cache
            && !file.served.load(Ordering::Relaxed)
            && self.table.lock().unwrap().get(file.ino).is_some_and(|n| n.opens == 1 && n.linked && !n.replaced)
    }

    /// The reader `file` goes on with after `gone` failed: one another of its reads took
    /// already, or one of the version the node names now, if the handle may take it
    /// ([`Fs::may_take_new_version`]); `None`: the read fails (`ESTALE`). `cat` of a file
    /// replaced by another client right after this mount listed it failed so (tester M:
    /// 20 of 20 at the default TTL).
    ///
    /// The kernel ends reads at the size it holds, `gone`'s: a longer version's tail is
    /// read once it asks for the size again (dropped here), but a shorter one only lowers
    /// it through a short read, and of several reads in flight the first to end decides
    /// (the others then read zeros: 2 MiB of a new 1 MiB file). So a shorter version is
    /// taken only by a `read` (offset, length) that covers all of `gone`, the one read
    /// the kernel has in flight then.
    fn take_new_version(&self, file: &OpenFile, gone: &Arc<FileReader>, read: (u64, u32)) -> Option<Arc<FileReader>> {
        {
            let cur = file.reader.lock().unwrap();
            if !Arc::ptr_eq(&cur, gone) {
                return Some(cur.clone());
            }
        }
        if !self.may_take_new_version(file) || self.staging.contains(file.ino) {
            return None;
        }
        let whole = read.0 == 0 && u64::from(read.1) >= gone.size();
        let node = self.node(file.ino).ok().filter(|n| n.identity() != gone.identity() && !n.local)?;
        if node.size < gone.size() && !whole {
            return None;
        }
        let now = self.reader_for(&node);
        let mut cur = file.reader.lock().unwrap();
        if !Arc::ptr_eq(&cur, gone) {
            return Some(cur.clone());
        }
        if file.served.load(Ordering::Relaxed) {
            return None;
        }
        *cur = now.clone();
        drop(cur);
        tracing::debug!(ino = node.ino, key = %node.key, identity = %node.identity(), "a handle that read nothing yet reads the new version");
        if node.size > gone.size() {
            if let Some(drop_attrs) = self.kernel_attrs.get() {
                drop_attrs(file.ino);
            }
        }
        Some(now)
    }

    /// Drop the kernel's attributes of an inode (not its pages) when a handle's version
    /// changes under it (the FUSE adapter's notifier).
    pub fn on_attrs_change(&self, f: crate::InvalidateDir) {
        let _ = self.kernel_attrs.set(f);
    }
}
