//! Opening, reading and writing files; staged files are `staging.rs` and `fs_stage.rs`,
//! their uploads `fs_publish.rs`, creating and removing names `fs_names.rs`, renaming
//! `fs_rename.rs` (directories `fs_rename_dir.rs`).
//!
//! Data: see [`crate::write`] (staging, upload on flush/fsync, eager multipart upload).
//! Namespace changes go to the store first and to the caches only once the store agreed,
//! so a failed call leaves the mount showing what the bucket holds:
//! - `create` stages an empty file; the object appears at the first flush (close).
//! - `mkdir` writes a `dir/` marker, so empty directories persist.
//! - `unlink` deletes the object; `rmdir` refuses a non-empty directory, then deletes the marker.
//! - `rename` of a file copies on the server and deletes the source (a staged file is
//!   uploaded to the new key instead); of a directory, moves every key below it, up to
//!   `max_rename_keys` (EXDEV beyond, so `mv` copies instead). Neither is atomic: a crash
//!   midway can leave both names; SEMANTICS.md says so.

use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::fs::{Fs, Handle, Kind, OpenFile};
use crate::inode::Version;
use crate::write::{Landing, Staged};
use crate::{names, FsError};

/// Files up to this size are copied into the block caches after upload (write-through);
/// 64 MiB: source trees and build outputs fit, a bulk copy of large files does not churn.
const WRITE_THROUGH_MAX: u64 = 64 * 1024 * 1024;

/// Check a name for create/mkdir/rename targets.
pub(crate) fn check_new_name(name: &str) -> Result<(), FsError> {
    if name.len() > names::NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if !names::valid_segment(name) || name.contains('/') {
        return Err(FsError::InvalidName);
    }
    Ok(())
}

/// Whether `name`, at the top of a mount, is the directory of the store's temporary upload
/// parts (`bucketfs_store::gcs::compose::PARTS_PREFIX`), which listings never show.
fn is_parts_dir(name: &str) -> bool {
    bucketfs_store::gcs::compose::PARTS_PREFIX.strip_suffix('/') == Some(name)
}

impl Fs {
    /// The key a new `name` of `kind` in directory `parent` gets, or why it cannot exist:
    /// an invalid name (`EINVAL`), or one the store would not keep byte for byte (OpenDAL
    /// trims whitespace at a key's ends: `"dup "` would overwrite `"dup"`), also `EINVAL`.
    /// A file or directory named `x.rclonelink` would be (or hide) the object of the link
    /// `x` (links.rs): one object for two names, so `EINVAL` too, as is a name MinIO would take for a directory
    /// marker ([`names::MINIO_DIR_SUFFIX`]), or a directory `.bucketfs-parts` at the top
    /// (`is_parts_dir`). A link whose object's name (`x.rclonelink`)
    /// would pass NAME_MAX gets `ENAMETOOLONG`, also when renamed there, as does a key
    /// longer than the store holds (S3, GCS: 1,024 bytes).
    pub(crate) fn new_key(&self, parent: u64, name: &str, kind: Kind) -> Result<String, FsError> {
        check_new_name(name)?;
        // A directory too: on S3 an object `x.rclonelink` hides the keys under the prefix
        // `x.rclonelink/` from MinIO's listings (tester W: a file in it gone after a remount).
        if kind != Kind::Symlink && crate::links::link_name(name).is_some() {
            return Err(FsError::InvalidName);
        }
        if kind == Kind::Symlink && !crate::links::may_be_link(name) {
            return Err(FsError::NameTooLong);
        }
        let caps = self.store.capabilities();
        if caps.prefix_dirs && name.ends_with(names::MINIO_DIR_SUFFIX) {
            return Err(FsError::InvalidName);
        }
        if kind == Kind::Dir && parent == crate::inode::ROOT_INO && is_parts_dir(name) {
            // The store's temporary upload parts live there, hidden from every listing: a
            // directory of that name would hide whatever is written into it.
            tracing::warn!("{name:?} is reserved at the top of a mount (bucketfs's temporary upload parts)");
            return Err(FsError::InvalidName);
        }
        let key = crate::inode::key_for(&self.node(parent)?.key, name, kind);
        // A directory's marker (`d/`) and a link's object (`l.rclonelink`) count too.
        if caps.max_key_len.is_some_and(|max| key.len() > max) {
            return Err(FsError::NameTooLong);
        }
        if !caps.addressable(&key) {
            return Err(FsError::InvalidName);
        }
        if kind != Kind::Dir && caps.max_file_name_len.is_some_and(|max| name.len() > max) {
            return Err(FsError::NameTooLong);
        }
        Ok(key)
    }

    /// Whether `key`, listed below directory key `dir`, is a name the mount shows: a valid
    /// file name at every level, and a key the store addresses byte for byte. bucketfs never
    /// deletes or moves keys it does not show.
    pub(crate) fn shown_below(&self, dir: &str, key: &str) -> bool {
        names::shown_below(dir, key) && self.store.capabilities().addressable(key)
    }

    /// Whether the bucket may hold an object of `ino` under its key: not for a file created
    /// here and never uploaded (its unlink or rename needs no request), unless an upload of
    /// it was cut off and may still land.
    pub(crate) async fn stored(&self, ino: u64) -> bool {
        self.stored_how(ino).await.is_some()
    }

    /// [`Fs::stored`], and how its key is deleted (an upload of it that failed may still
    /// land: [`Landing`]); `None`: nothing of it can be in the bucket.
    pub(crate) async fn stored_how(&self, ino: u64) -> Option<Landing> {
        match self.staging.get(ino) {
            Some(s) => {
                let st = s.lock().await;
                st.may_be_stored().then(|| st.landing())
            }
            None => Some(Landing::Stored),
        }
    }

    /// Delete `key` of a file this mount removes or renames away: journaled and sent in
    /// the background on a write-back mount (one an upload may still land on: twice, see
    /// [`crate::deletes::DeferredDeletes::defer_landing`]), else now.
    pub(crate) async fn delete_removed(&self, key: &str, landing: Landing) -> Result<(), FsError> {
        self.delete_removed_version(key, landing, None).await
    }

    /// [`Fs::delete_removed`] of an object that held `version` (its tag) when the file
    /// was removed: a journaled delete sent late takes only that version
    /// ([`crate::deletes::DeferredDeletes::defer_version`]).
    pub(crate) async fn delete_removed_version(
        &self,
        key: &str,
        landing: Landing,
        version: Option<String>,
    ) -> Result<(), FsError> {
        let only = match &landing {
            Landing::IfMd5(md5s) => Some(md5s.clone()),
            _ => None,
        };
        // An upload cut off may land after the delete: the key is watched (late.rs).
        self.late.watch(key, landing.late_md5s(), None, Instant::now());
        match &self.deletes {
            Some(d) if self.write_back() && landing != Landing::Stored => d.defer_landing(key, only).await?,
            Some(d) if self.write_back() => d.defer_version(key, version).await?,
            _ => crate::deletes::delete_if_ours(self.store.as_ref(), key, only.as_deref()).await?,
        }
        Ok(())
    }

    /// Make directory marker `key`: journaled and created in the background in write-back
    /// mode (deletes.rs), else now.
    pub(crate) async fn make_marker(&self, key: &str) -> Result<(), FsError> {
        match &self.deletes {
            Some(d) if self.write_back() && !self.marker_may_be_refused(key) => d.defer_marker(key).await?,
            _ => self.store.create_dir(key).await?,
        }
        Ok(())
    }

    /// Whether the store may refuse directory marker `key` for its name's length, so that
    /// a write-back `mkdir` makes it now and fails with the store's answer, rather than
    /// succeed and have it refused in the background: MinIO keeps marker `x/` as the file
    /// `x__XLDIR__`, so a name over 246 bytes (255 with the suffix) is refused there.
    fn marker_may_be_refused(&self, key: &str) -> bool {
        let name = key.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
        self.store.capabilities().prefix_dirs && name.len() + names::MINIO_DIR_SUFFIX.len() > names::NAME_MAX
    }

    /// Resolve (parent, name) without taking a kernel reference.
    pub(crate) async fn resolve(&self, parent: u64, name: &str) -> Result<Option<crate::inode::Node>, FsError> {
        if let Some(n) = self.table.lock().unwrap().child(parent, name).cloned() {
            if self.staging.owns(n.ino) || n.kind == Kind::Dir && self.fresh(n.validated) {
                return Ok(Some(n));
            }
        }
        let dir = self.node(parent)?;
        let Some(meta) = self.find_child(&dir, name).await? else { return Ok(None) };
        let mut t = self.table.lock().unwrap();
        let ino = t.upsert(parent, &meta);
        Ok(t.get(ino).cloned())
    }

    /// Open a file. `write` stages it (loading its current bytes unless `truncate`).
    ///
    /// A read-only `truncate` (`O_RDONLY|O_TRUNC`) empties the file as Linux does, but at
    /// the handle's first flush (close or fsync), not now: the kernel checks ETXTBSY for
    /// this open only after we answer, and a refused open is released without a flush, so
    /// the file must stay whole until then. (The adapter refuses it first where it can
    /// tell the file is running: fuse/src/running.rs.)
    pub async fn open(&self, ino: u64, write: bool, truncate: bool) -> Result<u64, FsError> {
        let mut node = self.node(ino)?;
        match node.kind {
            Kind::Dir => return Err(FsError::IsDir),
            Kind::Symlink => return Err(FsError::InvalidName), // the kernel follows links first
            Kind::File => {}
        }
        // A size the listing could not tell (a Drive Doc not exported yet) is a placeholder
        // the kernel may hold, even if the refresh below learns the real one: such a handle
        // is opened direct (reads come here whatever size the kernel believes).
        let placeholder = node.size_unknown;
        let mut moving = None;
        if node.version == Version::Unknown && node.linked && !self.staging.contains(ino) {
            // Moved here, the copy's tag not learned yet (`Fs::learn_moved` failed, or the
            // move is still to be done): asked now, so reads are pinned to the version again
            // (without it an S3 read went unpinned for up to a TTL); unless the move is not
            // done and the disk cache holds what it moves.
            moving = self.reader_of_pending_move(&node);
            if moving.is_none() {
                self.revalidate(&node, false).await?;
                node = self.node(ino)?;
            }
        } else if !self.fresh(node.validated) && !self.staging.owns(ino) {
            match self.refresh(&node).await {
                // Deleted by another client (its name gone from the listing, `replaced`):
                // ESTALE, so the kernel looks the name up again, finds none, and an
                // `O_CREAT` open creates the file (`touch`, `>>` failed with ENOENT for
                // the kernel's whole TTL: tester J); without `O_CREAT` it says ENOENT.
                Err(FsError::NotFound) if self.node(ino).is_ok_and(|n| n.replaced) => {
                    return Err(FsError::Stale(format!("{} was deleted in the bucket", node.key)));
                }
                r => {
                    r?;
                }
            }
            node = self.node(ino)?;
        }
        // Attributes set here (a chmod's upload comes through here) say nothing of what
        // another client stored with the object, which the upload must keep too.
        let known = node.attrs_asked == node.version_mark() || node.has_attrs() && !node.attrs_here;
        if write && !known && self.store.capabilities().keeps_attrs && !self.staging.contains(ino) {
            self.learn_attrs(&node).await;
            node = self.node(ino)?;
        }
        if node.replaced {
            // Replaced by another client since the kernel looked the name up (a new inode
            // has it now, `Node::replaced_by`): ESTALE makes the kernel look it up again
            // and open that one (the VFS retries an open once so), as NFS does.
            return Err(FsError::Stale(format!("{} was replaced in the bucket", node.key)));
        }
        let direct = (placeholder || node.size_unknown) && !write && !self.staging.contains(ino);
        if direct && node.size_unknown {
            // A HEAD learns the size; still unknown: the store refused to read it, and a
            // read's error says why.
            self.revalidate(&node, false).await?;
            node = self.node(ino)?;
            if node.size_unknown {
                drop(self.store.get(&node.key, 0..1, Default::default()).await?);
            }
        }
        // Write-back: a queued version goes up before it changes again, if the store takes
        // it within a few seconds (`Fs::upload_before_change`).
        let went_up = !write || self.upload_before_change(ino).await;
        // A reader of a file an upload holds joins it without waiting (staging.rs).
        let shown = if write || truncate { None } else { self.staging.join_shown(ino) };
        let mut counted = false;
        let staged = if shown.is_some() {
            shown
        } else if write || self.staging.contains(ino) {
            match self.stage(&node, truncate && write, write, went_up).await {
                Ok(staged) => {
                    if write && !truncate && went_up {
                        // A close that queued its version after the check above (while this
                        // open waited for the staged lock) is uploaded before this handle
                        // changes it. (No early return once staged: the staged file counts
                        // this handle.)
                        self.upload_before_change(ino).await;
                    }
                    Some(staged)
                }
                // A reader that found the file staged, dropped meanwhile by its last close
                // (whose RELEASE comes after close(2) returns), could not stage it again on
                // the staging disk: it reads through the store, as any reader of a file
                // not staged (`cat big > f; cat f` failed with ENOSPC once that close had
                // filled the disk: tester K).
                Err(e @ (FsError::NoSpace(_) | FsError::Local(_))) if !write => {
                    match self.unstaged_node_opened(ino)? {
                        Some(now) => {
                            node = now;
                            counted = true;
                            None
                        }
                        None => return Err(e),
                    }
                }
                Err(e @ FsError::NoSpace(_)) => {
                    // An edit stages a copy of the whole object first: the staging disk
                    // may be nearly empty and still too small (tester U: ENOSPC, no word).
                    tracing::warn!(key = %node.key, size = node.size, "open for writing failed: no room on the staging disk for a copy of the file: {e}");
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        } else if let Some(now) = self.unstaged_node_opened(ino)? {
            // Read through the store: with a snapshot that belongs to one upload.
            node = now;
            counted = true;
            None
        } else {
            Some(self.stage(&node, false, false, false).await?) // a writer staged it meanwhile
        };
        // Close-to-open for the kernel's page cache: keep it only if the object is the same
        // version the kernel cached at the previous open (and nothing is staged), and every
        // open that drops it has been finished by the kernel (`Node::kernel_dropping`: a
        // concurrent open of a version just learned; keeping pages the kernel had not
        // dropped yet mixed two versions in one handle's reads).
        // (A node gone meanwhile keeps nothing; no early return, which would leave the
        // staged file's handle count raised with no handle to lower it.)
        let (mut keep_cache, mut dropping) = (false, false);
        if let Some(n) = self.table.lock().unwrap().get_mut(ino) {
            let identity = n.identity();
            keep_cache =
                staged.is_none() && n.kernel_dropping == 0 && n.kernel_cached.as_deref() == Some(identity.as_str());
            n.kernel_cached = if staged.is_none() { Some(identity) } else { None };
            dropping = !keep_cache;
            n.kernel_dropping += u32::from(dropping);
        }
        tracing::debug!(ino, keep_cache, staged = staged.is_some(), write, truncate, identity = %node.identity(), "open");
        // Where the staged file stands as this handle starts (`OpenFile::unseen_mark`); not
        // waited for (an upload in flight holds the lock): unknown then, as before.
        let mark = staged.as_ref().filter(|_| write).and_then(|s| s.try_lock().ok().map(|st| st.write_gen));
        let file = OpenFile {
            ino,
            reader: Mutex::new(moving.unwrap_or_else(|| self.reader_for(&node))),
            keep_cache,
            dropping: AtomicBool::new(dropping),
            direct,
            staged: AtomicBool::new(staged.is_some()),
            wrote: AtomicBool::new(staged.is_some() && truncate && write),
            truncate_at_flush: AtomicBool::new(truncate && !write),
            writable: write,
            writes_unseen: Default::default(),
            unseen_mark: AtomicU64::new(mark.unwrap_or(u64::MAX)),
        };
        Ok(self.insert_handle_as(Handle::File(Arc::new(file)), counted))
    }

    pub(crate) fn open_file(&self, fh: u64) -> Result<Arc<OpenFile>, FsError> {
        match self.handles.lock().unwrap().get(&fh) {
            Some(Handle::File(f)) => Ok(f.clone()),
            _ => Err(FsError::BadHandle),
        }
    }

    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Bytes, FsError> {
        let file = self.open_file(fh)?;
        self.kernel_finished_open(&file);
        if let Some(staged) = self.staging.get(file.ino) {
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
        let reader = file.reader.lock().unwrap().clone();
        let read = reader.read(offset, size).await;
        if let Err(FsError::Stale(_)) = &read {
            self.version_gone(file.ino, reader.identity()).await;
        }
        read
    }

    /// A read found that the version `identity` of `ino` is no longer in the bucket: if the
    /// node still names it, the store is asked (one HEAD, within a bound) so the next open
    /// reads what is there now. An object another client replaced after this mount listed
    /// it failed every open's first read with `ESTALE` for the whole TTL (60 s in
    /// write-back mode; tester F): the open took the listing's version as fresh.
    async fn version_gone(&self, ino: u64, identity: &str) {
        let Ok(node) = self.node(ino) else { return };
        if node.identity() == identity && !node.local {
            if let Err(e) = self.revalidate_within(&node).await {
                tracing::debug!(ino, key = %node.key, "asking after a version gone from the bucket: {e}");
            }
        }
    }

    pub async fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32, FsError> {
        let file = self.open_file(fh)?;
        let staged = self.staging.get(file.ino).ok_or(FsError::BadHandle)?;
        file.wrote.store(true, Ordering::Relaxed);
        let mut st = self.lock_to_change(file.ino, &staged).await;
        self.observe(file.ino, &mut st)?;
        let node = self.node(file.ino)?;
        let key = node.key.clone();
        st.set_key(&key)?;
        st.write(offset, data)?;
        let size = st.size;
        self.set_local_size(file.ino, size);
        // Write-back: nothing goes up before the close (the point is a fast write and close).
        if size >= self.cfg.write.part_size as u64 && !self.write_back() {
            if let Err(e) = st.eager_feed(self.store.as_ref(), &key, &self.cfg.write, &self.attrs_to_keep(&node)).await
            {
                // Not fatal: the data is staged and goes up whole at close.
                tracing::debug!(%key, "eager upload stopped: {e}");
            }
        }
        Ok(data.len() as u32)
    }

    /// Upload on behalf of one handle: if it changed the data since its last upload, or it
    /// is the only handle on the staged file. Another handle's flush or release must never
    /// publish bytes a writer is still producing (an `open(O_TRUNC)` that has not written
    /// yet); that writer's own close publishes them, and the last close publishes whatever
    /// is left dirty.
    ///
    /// Whether it is the only handle is decided under the staged lock, with the upload: an
    /// `open(O_TRUNC)` racing the release of the previous handle (the kernel does not wait
    /// for RELEASE) must not have its pending empty file published by that release.
    async fn upload_for(&self, file: &OpenFile, durable: bool) -> Result<(), FsError> {
        if !file.wrote.load(Ordering::Relaxed)
            && !file.writes_unseen.load(Ordering::Relaxed)
            && !file.staged.load(Ordering::Relaxed)
        {
            return Ok(());
        }
        let (wrote, gen) = self.changed_by(file).await?;
        // Shared: a rename or unlink of this key in progress (exclusive) finishes first, so
        // the upload goes to the name as it is after it.
        let _intent = self.upload_intent(file.ino).await;
        match self.upload_ino(file.ino, !wrote).await {
            // A handle that wrote nothing (a reader) retried another's upload: its failure
            // is that writer's (told at its close), the data stays staged and is retried at
            // the next close or unmount. A reader's close never fails for it (a refused
            // O_EXCL upload made every later `cat` of the file fail with EEXIST). Its
            // fsync does: it asks for the file's bytes in the bucket, whoever wrote them
            // (it returned 0 with them staged only, the staging disk full).
            Err(e) if !wrote && !durable => {
                tracing::warn!(ino = file.ino, "upload retried at a reader's close failed: {e}")
            }
            Err(FsError::Exists) if !wrote => return Err(FsError::UploadFailed(Box::new(FsError::Exists))),
            r => r?,
        }
        file.wrote.store(false, Ordering::Relaxed);
        file.unseen_mark.store(gen, Ordering::Relaxed);
        Ok(())
    }

    /// Whether `file`'s flush publishes as the handle that changed the data
    /// ([`OpenFile::changed_data`]; the staged file is locked and observed only when its
    /// writes are unseen). A change before its mark was another handle's (one still
    /// writing: an `O_RDWR` handle that wrote nothing must not publish it). With the
    /// staged file's write generation now, for the mark once published.
    pub(crate) async fn changed_by(&self, file: &OpenFile) -> Result<(bool, u64), FsError> {
        let mark = file.unseen_mark.load(Ordering::Relaxed);
        if file.wrote.load(Ordering::Relaxed) || !file.writes_unseen.load(Ordering::Relaxed) {
            return Ok((file.wrote.load(Ordering::Relaxed), mark));
        }
        let Some(staged) = self.staging.get(file.ino) else { return Ok((true, mark)) };
        let mut st = staged.lock().await;
        self.observe(file.ino, &mut st)?;
        Ok((file.changed_data(st.write_gen), st.write_gen))
    }

    /// Mark a handle as having changed the data (a truncate through it).
    pub(crate) fn mark_wrote(&self, fh: u64) {
        if let Ok(f) = self.open_file(fh) {
            f.wrote.store(true, Ordering::Relaxed);
        }
    }

    /// close(2): upload what this handle wrote; an error means it is not in the bucket.
    /// In write-back mode: commit it and queue its upload (write_back.rs).
    pub async fn flush(&self, fh: u64) -> Result<(), FsError> {
        self.flush_as(fh, false).await
    }

    /// fsync(2): as flush; in write-back mode the bytes reach the local disk instead.
    pub async fn fsync(&self, fh: u64) -> Result<(), FsError> {
        self.flush_as(fh, true).await
    }

    async fn flush_as(&self, fh: u64, durable: bool) -> Result<(), FsError> {
        let file = self.open_file(fh)?;
        if file.truncate_at_flush.swap(false, Ordering::Relaxed) {
            // A truncate by path: emptied and uploaded at once (boxed: setattr flushes too).
            Box::pin(self.setattr(file.ino, crate::SetAttr { size: Some(0), ..Default::default() })).await?;
        }
        if self.write_back() {
            return self.commit_for(&file, durable).await;
        }
        self.upload_for(&file, durable).await
    }

    /// Release `fh` whose open the adapter refused after [`Self::open`] (passthrough's
    /// `EBUSY`/`ENOSPC`): the kernel never saw it, so whatever pages it caches are not the
    /// version that open recorded, and the next open must drop them.
    pub async fn release_unanswered(&self, fh: u64) -> Result<(), FsError> {
        if let Ok(file) = self.open_file(fh) {
            if let Some(n) = self.table.lock().unwrap().get_mut(file.ino) {
                n.kernel_cached = None;
            }
        }
        self.release(fh).await
    }

    /// The last close of a handle: upload if still dirty (and ours to publish), and drop
    /// clean staged data.
    pub async fn release(&self, fh: u64) -> Result<(), FsError> {
        let file = match self.handles.lock().unwrap().remove(&fh) {
            Some(Handle::File(f)) => f,
            _ => return Ok(()),
        };
        self.count_open(file.ino, false);
        self.kernel_finished_open(&file);
        // The close's FLUSH (always sent before RELEASE) covered what the kernel wrote through
        // this handle (passthrough); what changed since is another handle's to publish (an
        // O_TRUNC open racing this RELEASE: uploading it now published an empty object), or,
        // with no other handle left, a mapping's writes, uploaded below as any dirty file is.
        file.writes_unseen.store(false, Ordering::Relaxed);
        let result =
            if self.write_back() { self.commit_for(&file, false).await } else { self.upload_for(&file, false).await };
        self.prepare_backing(&file);
        if let Some(staged) = self.staging.get(file.ino) {
            let mut st = staged.lock().await;
            if !self.staging.is_current(file.ino, &staged) {
                // Dropped by another handle's release while we waited (a newer staged
                // file of the node may be in the map now: not ours to drop).
                return result;
            }
            if let Err(e) = self.observe(file.ino, &mut st) {
                tracing::warn!(ino = file.ino, "cannot check the staged file: {e}");
            }
            if file.staged.load(Ordering::Relaxed) {
                st.drop_handle(file.writable);
            }
            // An unlinked file's bytes exist only here: they stay while any handle is open,
            // a reader opened before the file was staged included (it reads the staged
            // bytes, as on a local disk; dropping them cut its reads short: model test).
            let readers = st.unlinked && self.has_open_handle(file.ino);
            if st.handles == 0 && !st.unlinked && st.watched() && st.mapped_elsewhere() {
                // A shared mapping outlives the handles and may still write the file.
                self.linger(file.ino, &staged, &mut st);
            } else if st.handles == 0 && !st.unlinked && !st.committed() && self.write_back() {
                // Changed since its last commit and no handle left to commit it: a mapping's
                // writes while an upload held the file (this RELEASE did not wait for it:
                // `Fs::commit_for`). Committed and queued here, as a last close does.
                if let Err(e) = self.commit_last(file.ino, &mut st) {
                    // Named by status and sync, which commit it again (`Fs::commit_left`).
                    tracing::warn!(ino = file.ino, "cannot commit the staged file at its last close: {e}");
                }
            } else if st.handles == 0
                && (!st.dirty || st.unlinked)
                && !readers
                && !self.kept_for_late(file.ino, &mut st)
            {
                // The version just uploaded stays on disk for reading back (passthrough.rs),
                // or else its blocks go into the block caches (no copy when it stays).
                self.keep_as_whole(file.ino, &mut st).await;
                if !st.unlinked && !st.is_given() {
                    self.write_through_pending(file.ino, &mut st);
                }
                // Under the staged lock: an open racing this re-checks the map (`stage`).
                self.unstage_this(file.ino, &staged, &mut st);
            } else if result.is_ok() {
                self.settle_readers(file.ino, &st);
            }
        }
        result
    }

    /// Commit `ino`'s staged file `st` and queue it (write-back), as a last close does.
    pub(crate) fn commit_last(&self, ino: u64, st: &mut Staged) -> Result<(), FsError> {
        self.commit_staged(ino, st, false, false)?;
        self.join_handles(ino, st);
        self.queue_committed(ino, st);
        Ok(())
    }

    /// Keep a staged file whose last handle closed while a process still maps it (FUSE
    /// passthrough maps the staged file itself, so its writes reach no FUSE handle): every
    /// 200 ms look at it; a change that held still for a tick is a commit point, uploaded
    /// (queued in write-back mode) as a close's would be; once the mapping is gone, the
    /// last change goes up and the staged file is dropped as at a last release. Without
    /// this, a linker's output (mapped, fd closed, then written) never reached the bucket.
    pub(crate) fn linger(&self, ino: u64, staged: &crate::write::SharedStaged, st: &mut Staged) {
        if std::mem::replace(&mut st.lingering, true) {
            return; // watched already
        }
        tracing::debug!(ino, "staged file still mapped after its last close: watched until unmapped");
        let (me, staged) = (self.me.clone(), staged.clone());
        crate::sync::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let Some(fs) = me.upgrade() else { return };
                if !fs.staging.is_current(ino, &staged) {
                    return;
                }
                // The intent before the staged lock, as everywhere.
                let _intent = fs.upload_intent(ino).await;
                let mut st = staged.lock().await;
                // Ended under the lock: a release that finds it over starts a new watch.
                if fs.linger_tick(ino, &staged, &mut st).await {
                    st.lingering = false;
                    return;
                }
            }
        });
    }

    /// One look at a lingering staged file (`st`, locked); `true` when lingering is over.
    async fn linger_tick(&self, ino: u64, staged: &crate::write::SharedStaged, st: &mut Staged) -> bool {
        if !self.staging.is_current(ino, staged) || st.handles > 0 || st.unlinked {
            return true; // an open's own release decides again; an unlinked file is gone
        }
        let mapped = st.mapped_elsewhere();
        let changed = match st.observe() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(ino, "cannot check a mapped staged file: {e}");
                return false;
            }
        };
        if changed {
            self.set_local_size(ino, st.size);
            if mapped {
                return false; // still being written: upload once it holds still
            }
        }
        if st.dirty {
            if let Err(e) = self.commit_staged(ino, st, false, false) {
                tracing::warn!(ino, "cannot commit a mapped staged file: {e}");
                return false;
            }
            if self.write_back() {
                self.queue_committed(ino, st);
            } else if let Err(e) = self.publish(ino, st).await {
                tracing::warn!(ino, "upload of a mapped file's writes failed, retried: {e}");
                return false;
            }
        }
        if mapped {
            return false;
        }
        if !st.dirty {
            self.unstage_this(ino, staged, st);
        }
        true // a queued version: the queue drops the staged file after its upload
    }
}

#[path = "fs_publish.rs"]
mod publish;
#[path = "fs_rename.rs"]
mod rename;
#[path = "fs_setattr.rs"]
mod setattr;
#[path = "fs_sync.rs"]
mod sync_all;
