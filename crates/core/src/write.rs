//! Staged writes: what makes writing to a bucket cheap, and durable on close.
//!
//! An inode being written has one [`Staged`] file on local disk, shared by all its handles.
//! `write` is a positional write into that file: no network, no allocation, so thousands of
//! 4 KiB writes (`git clone` writes 4,107 bytes at a time) cost what a local disk costs.
//! Reads of a staged inode come from the same file, so a read after a write returns what
//! was written, from any handle, before and after the upload.
//!
//! The upload happens on `flush` (close), `fsync`, and unmount: the whole staged file goes
//! up through [`Store::writer`] in parallel parts, and the call returns only when the store
//! has the object, or an error (EIO) if it failed. A failed upload leaves the staged file
//! dirty: nothing is dropped, and the next flush, fsync or unmount tries again.
//!
//! Sequential writers (`cp`, a download) do not wait for close to start uploading: while
//! every write lands at the end of the file, each full part is handed to an open
//! multipart upload as soon as it is written ("eager upload"), so close sends only the
//! tail. A write anywhere else aborts the eager upload and the file goes up whole at close.
//!
//! Invariant: `dirty` is cleared only by an upload that started after the last write
//! (`write_gen` is unchanged across the upload); `unlinked` files are never uploaded.
//!
//! Crash safety: while a staged file is dirty, a sidecar `<file>.key` beside it names the
//! object key it belongs to (and `<file>.excl`, while its upload is create-only). A staged
//! file is deleted only when clean or unlinked, never
//! while it holds data the bucket lacks; after a crash (or an unmount whose uploads kept
//! failing) the next mount of the same mount point finds the pairs and uploads them
//! (`recovery::recover`).
//!
//! Commit points (close, fsync) and what keeps the committed version recoverable while
//! the bytes change after it: `write_commit.rs` (module `commit`).

use crate::sync::Arc;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bucketfs_store::{
    FileAttrs, GetOpts, ObjectMeta, ObjectWriter, PutOpts, Store, StoreErrorKind, StoreExt, WriteOptions,
};
use bytes::Bytes;

use crate::part_budget::PartBudget;
#[path = "write_commit.rs"]
mod commit;
#[path = "write_key.rs"]
mod key;
#[path = "write_patch.rs"]
pub(crate) mod patch;
#[path = "write_upload.rs"]
mod upload;
use crate::FsError;
use commit::Base;
pub use commit::LateNote;
pub(crate) use commit::Stamp;
pub(crate) use key::{set_aside, set_aside_in};
use patch::{Stored, Sums};
pub(crate) use upload::{landed_here, send_whole};

/// State of one staged inode. Guarded by the `tokio::sync::Mutex` that holds it
/// ([`SharedStaged`], lock level 2 in docs/ARCHITECTURE.md).
pub struct Staged {
    file: File,
    path: PathBuf,
    pub size: u64,
    pub dirty: bool,
    /// Bumped by every change; an upload only cleans the file if this did not move.
    pub write_gen: u64,
    pub unlinked: bool,
    /// Handles open on this inode; the staged file is dropped when the last one closes clean.
    pub handles: usize,
    /// Those of `handles` opened for writing (see `Fs::settle_readers`).
    pub writers: usize,
    /// A task watches it while a mapping outlives its handles (`Fs::linger`). Kept here,
    /// under the staged lock, so a release deciding to linger and a watch ending never
    /// miss each other (a set beside the map, updated after the lock, let a release find
    /// the old watch still listed just as it ended: the file then stayed staged for good).
    pub lingering: bool,
    /// The key named by the sidecar file, once the file has been dirty.
    key: Option<String>,
    /// Every write so far landed at the end of the file: eager upload is possible.
    appends_only: bool,
    /// An `open(O_TRUNC)` emptied the file, but the old bytes stay until the first change or
    /// upload ([`Staged::truncate_on_open`]).
    trunc_pending: bool,
    /// While an O_TRUNC is pending on bytes never staged: a reader of the version it hides.
    old: Option<Arc<crate::read::FileReader>>,
    eager: Option<Eager>,
    /// Part buffers are counted against the mount's upload memory bound.
    budget: PartBudget,
    /// The `<file>.open` marker exists: the bytes changed since the last commit point
    /// (close or fsync), so after a crash they are not a version anyone closed.
    open_marked: bool,
    /// What the `.open` marker says now if it says "committed as of" a state (written by
    /// [`Staged::mark_committed_as_is`]), so the same state is not written again at each
    /// commit point (a close's flush and release both commit).
    marked_as: Option<Stamp>,
    /// Its text while `open_marked` (`open`, or `base N`: see [`Staged::mark_open`]).
    open_text: Option<String>,
    /// What the `.attrs` sidecar holds, if written ([`Staged::keep_attrs`]).
    attrs_kept: Option<bucketfs_store::FileAttrs>,
    /// The disk cache took the file over ([`Staged::given_away`]): its inode is the cache's
    /// (and a later staged file of the same node may adopt and rewrite it).
    given: bool,
    /// Its inode was the disk cache's ([`Staged::adopt`]): readers of that file may still
    /// hold it open, so it is recycled only if a lease says none does.
    adopted: bool,
    /// The key may hold an object written from these bytes' inode (it came from the store,
    /// or was uploaded here): a rename or unlink must delete it there.
    pub in_store: bool,
    /// Not uploaded yet, but renamed over another file whose object the key still holds
    /// (write-back): until this file's upload replaces it, an unlink or a rename away must
    /// delete that object, or it would come back.
    pub replaces: bool,
    /// An upload of these bytes failed in a way that may still have reached the store (a
    /// timeout, a dropped connection: a server that hung may process the request later):
    /// until an upload succeeds, a rename away or an unlink deletes the key, and does it
    /// again a moment later (deletes.rs), or the late object would stay under a name the
    /// file no longer has.
    pub maybe_landed: bool,
    /// Sent again after an upload that followed a cut-off one ([`Staged::send_again`]):
    /// its success ends that, with no further round.
    pub resending: bool,
    /// While `maybe_landed`: the MD5 of each single-request upload cut off; `None` once
    /// one in parts was cut off.
    landed_md5s: Option<Vec<[u8; 16]>>,
    /// The bytes of the single-request upload being sent now (hashed for `landed_md5s` if
    /// it is cut off).
    sending: Option<Bytes>,
    /// The MD5 of the last upload's bytes, if the store sent it more than once after tries
    /// cut off ([`bucketfs_store::Store::put_tried`]): one of those may still land, over a
    /// newer version (`Fs::publish` has the key watched: late.rs).
    pub sent_twice: Option<[u8; 16]>,
    /// Made by an `O_EXCL` create and not uploaded yet: the first upload is create-only
    /// ([`PutOpts::if_not_exists`]), so an object another writer made meanwhile is never
    /// replaced (the upload fails with `Exists`; the bytes stay here). While the key is
    /// named, the `<file>.excl` sidecar says so to crash recovery ([`Staged::set_create_only`]).
    create_only: bool,
    /// The tag every create-only upload of this file carries ([`FileAttrs::created_by`],
    /// also in the `.excl` sidecar): a refused one tells its own landed try by it.
    excl_tag: Option<u128>,
    /// The kernel may change the file without us (FUSE passthrough, see
    /// [`Staged::watch_external`]): its state as we last saw it, `None` if it never could.
    seen: Option<Stamp>,
    /// Uploaded while handles stayed open (an fsync): that version's identity. Its bytes go
    /// into the block caches at the last close, not at each fsync (`Fs::publish`).
    pub cache_pending: Option<String>,
    /// The last committed version, while it may not be in the bucket: its length, and
    /// where it is (see the module doc).
    base: Option<Base>,
    /// The last commit point was an fsync: a version sent again ([`Staged::send_again`])
    /// keeps the promise that it survives a power cut, as its first upload did.
    fsynced: bool,
    /// The version the bucket holds of these bytes, as this mount last stored or read it:
    /// the next upload sends only the blocks that differ from it (write_patch.rs).
    stored: Option<Stored>,
}

/// The largest upload whose MD5 is kept when it is cut off ([`Landing::IfMd5`]): the
/// delete then reads an object of up to this size to hash it where the store tells no MD5.
pub(crate) const LANDING_MD5_MAX: u64 = 64 * 1024 * 1024;

/// What a rename away or an unlink deletes under a staged file's key ([`Staged::landing`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Landing {
    /// The object there is this file's, or the one it replaced: deleted once.
    Stored,
    /// An upload cut off may still land: deleted, and once more a moment later. With the
    /// MD5s of the cut-off uploads known (their key is watched for a while: late.rs).
    Any(Vec<[u8; 16]>),
    /// Only create-only uploads were cut off, and such an upload lands only where no object
    /// was: an object there is this file's only if its MD5 is one of these (what they
    /// sent); another client's, made first (the store refused ours), stays. Checked before
    /// each of the two deletes; an object whose store tells no MD5 is deleted as before.
    IfMd5(Vec<[u8; 16]>),
}

impl Landing {
    /// What the uploads cut off that may land sent, as far as known.
    pub fn late_md5s(&self) -> &[[u8; 16]] {
        match self {
            Landing::Stored => &[],
            Landing::Any(md5s) | Landing::IfMd5(md5s) => md5s,
        }
    }
}

/// A multipart upload fed while a sequential writer is still writing.
struct Eager {
    key: String,
    /// What the upload was started with (attributes, create-only; sent when it began).
    put: PutOpts,
    writer: Box<dyn ObjectWriter>,
    /// Bytes `0..sent` of the staged file are already handed to the writer.
    sent: u64,
    /// For a file the kernel writes (passthrough), where a part sent may change after: the
    /// CRC32C of each part sent, checked against the file before the upload completes.
    crcs: Option<Vec<u32>>,
    /// The sums of what it sent, for [`Staged::stored`].
    sums: Sums,
    /// Its part buffers' room in the mount's upload budget.
    _share: crate::part_budget::Share,
}

impl Staged {
    /// A new empty staged file in `dir`.
    pub fn create(dir: &Path, ino: u64, budget: PartBudget) -> Result<Self, FsError> {
        let path = dir.join(format!("{ino}-{}.data", unique()));
        let file = crate::recycle::create(&path).map_err(|e| match local(e) {
            FsError::Local(m) => FsError::Local(format!("cannot create staging file {}: {m}", path.display())),
            other => other,
        })?;
        Ok(Self {
            file,
            path,
            size: 0,
            dirty: false,
            write_gen: 0,
            unlinked: false,
            handles: 0,
            writers: 0,
            key: None,
            appends_only: true,
            trunc_pending: false,
            old: None,
            eager: None,
            budget,
            open_marked: false,
            marked_as: None,
            open_text: None,
            attrs_kept: None,
            given: false,
            adopted: false,
            in_store: true,
            replaces: false,
            create_only: false,
            excl_tag: None,
            maybe_landed: false,
            resending: false,
            landed_md5s: Some(Vec::new()),
            sending: None,
            sent_twice: None,
            seen: None,
            cache_pending: None,
            base: None,
            fsynced: false,
            stored: None,
            lingering: false,
        })
    }

    /// Take over a local file holding the object's current `size` bytes instead of fetching
    /// them: `take` moves it to this staged file's path (replacing the empty file `create`
    /// made). `false` (nothing changed) if `take` could not. A fresh staged file only.
    pub fn adopt(&mut self, size: u64, take: impl FnOnce(&Path) -> bool) -> Result<bool, FsError> {
        debug_assert!(self.size == 0 && !self.dirty && self.key.is_none());
        if !take(&self.path) {
            return Ok(false);
        }
        self.adopted = true;
        self.file = std::fs::OpenOptions::new().read(true).write(true).open(&self.path).map_err(local)?;
        self.size = size;
        Ok(true)
    }

    /// Fill the staged file with the object's current bytes (open for write without
    /// O_TRUNC), in ranged reads of one part each, so memory stays at one part.
    pub async fn fill_from(
        &mut self,
        store: &dyn Store,
        key: &str,
        size: u64,
        etag: Option<&str>,
    ) -> Result<(), FsError> {
        const CHUNK: u64 = 8 * 1024 * 1024; // one part: bounded memory, few requests
        let mut off = 0;
        let mut sums = Sums::default();
        while off < size {
            let end = (off + CHUNK).min(size);
            let _room = self.budget.buffer(end - off).await; // until written out
            let data = store.get_range(key, off..end, GetOpts { if_match: etag }).await?;
            if data.len() as u64 != end - off {
                return Err(FsError::Stale(format!("{key} changed while it was being opened")));
            }
            self.file.write_all_at(&data, off).map_err(local)?;
            sums.record(off, &data);
            off = end;
        }
        self.filled(key, size, etag, sums);
        Ok(())
    }

    /// [`Staged::fill_from`] from the read caches: `block(i)` is the version's `i`-th
    /// block of `block_size` bytes, read one at a time. `false` (nothing usable) if one is
    /// no longer there: the caller fills from the store instead.
    pub async fn fill_cached(
        &mut self,
        key: &str,
        size: u64,
        etag: Option<&str>,
        block_size: u64,
        mut block: impl FnMut(u64) -> Option<Bytes>,
    ) -> Result<bool, FsError> {
        let (mut off, mut sums) = (0, Sums::default());
        while off < size {
            let _room = self.budget.buffer(block_size.min(size - off)).await; // until written out
            let Some(data) = block(off / block_size) else { return Ok(false) };
            self.file.write_all_at(&data, off).map_err(local)?;
            sums.record(off, &data);
            off += data.len() as u64;
        }
        self.filled(key, size, etag, sums);
        Ok(true)
    }

    fn filled(&mut self, key: &str, size: u64, etag: Option<&str>, sums: Sums) {
        self.size = size;
        self.stored = etag.map(|e| Stored {
            key: key.to_string(),
            identity: e.to_string(),
            len: size,
            pieces: None,
            sums: sums.finish(size),
        });
    }

    /// Let the kernel write the file directly (FUSE passthrough): from now on changes
    /// arrive unseen, so [`Staged::observe`] compares the file's state with the last one
    /// seen wherever its size or dirtiness matters. A pending O_TRUNC is applied now (the
    /// kernel reads the file itself), the key is named for crash recovery, and the eager
    /// upload stops (writes may land anywhere). Returns the file opened anew for the
    /// kernel: an open file description of its own, so [`Staged::mapped_elsewhere`] can
    /// tell when the kernel (a mapping included) is done with it. A committed file gets
    /// `mtime` (the one the mount shows), which the file's own is from then on: staged
    /// from the bucket, it held the staging's time, and an `O_RDWR` open with no write
    /// (sqlite's, for a read) showed the file changed now (tester W).
    pub fn watch_external(&mut self, key: &str, mtime: Option<std::time::SystemTime>) -> Result<File, FsError> {
        self.settle()?;
        let was_open = self.open_marked;
        self.set_key(key)?;
        if self.seen.is_none() {
            self.eager_abandon();
            self.appends_only = false;
            if was_open {
                self.seen = Some(Stamp::of(&self.file)?);
            } else {
                if let Some(Err(e)) = mtime.map(|t| self.file.set_modified(t)) {
                    tracing::debug!(path = %self.path.display(), "mtime of the staged file not set: {e}");
                }
                self.mark_committed_as_is()?; // records what it saw
            }
        }
        File::options().read(true).write(true).open(&self.path).map_err(local)
    }

    /// A second handle of our own open file description (not the kernel's).
    pub fn dup(&self) -> Result<File, FsError> {
        self.file.try_clone().map_err(local)
    }

    /// Whether another open file description of the file may still write it: the kernel's
    /// (see [`Staged::watch_external`]) outlives every handle while a process keeps a
    /// shared mapping of it (FUSE passthrough maps the staged file itself; a linker maps
    /// its output, closes the fd, then writes). Asked by taking a write lease, which Linux
    /// grants only when no other description has the file open for writing. `false`
    /// where leases are unavailable.
    pub fn mapped_elsewhere(&self) -> bool {
        let Err(e) = crate::recycle::try_write_lease(&self.file) else { return false };
        if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EBUSY)) {
            return true;
        }
        tracing::debug!(path = %self.path.display(), "no write lease on the staged file ({e}): taken as unmapped");
        false
    }

    /// Whether the kernel may change the file unseen (see [`Staged::watch_external`]).
    pub fn watched(&self) -> bool {
        self.seen.is_some()
    }

    /// Catch up with changes the kernel made directly (passthrough): if the file's length
    /// or mtime moved since last seen, it is dirty and its size is the file's. Returns
    /// whether it changed. Free for files never watched.
    pub fn observe(&mut self) -> Result<bool, FsError> {
        let Some(seen) = self.seen.filter(|_| !self.given) else { return Ok(false) };
        let now = Stamp::of(&self.file)?;
        if now == seen {
            return Ok(false);
        }
        // Dirty before the marker is written: a marker that fails (the staging disk full)
        // must not leave the change unseen, or the file was dropped as clean at its last
        // close, the kernel's writes lost (tester I: `dd` onto a full staging disk).
        self.seen = Some(now);
        self.size = now.len;
        self.dirty = true;
        self.write_gen += 1;
        self.mark_open(None)?;
        Ok(true)
    }

    /// Whether the bytes are a committed version (no change since the last commit point).
    pub fn committed(&self) -> bool {
        !self.open_marked
    }

    /// The disk cache took the file (the path [`Staged::as_uploaded`] gave) over: from now on
    /// this staged file is inert. A handle still holding it must not see the cache's file (or
    /// a later staged file that adopted and rewrote it) as a change of its own, nor keep it
    /// at drop as unsent data (it was: sidecars left behind, concurrency test).
    pub fn given_away(&mut self) {
        self.given = true;
    }

    /// Whether the disk cache took the file over ([`Staged::given_away`]).
    pub fn is_given(&self) -> bool {
        self.given
    }

    /// Its path, if its bytes are exactly the version last uploaded (clean, in the bucket,
    /// nothing pending) and no other open file description may write it (a mapping): the
    /// disk cache may take the file over once this staged file goes (a rename; dropping it
    /// then deletes only the sidecars).
    pub fn as_uploaded(&self) -> Option<PathBuf> {
        if self.dirty || self.unlinked || !self.in_store || self.trunc_pending || self.eager.is_some() {
            return None;
        }
        if !crate::recycle::lease_granted(&self.file) {
            return None;
        }
        Some(self.path.clone())
    }

    /// fsync: the staged bytes and their sidecar reach the local disk (survive a machine
    /// crash), with the directory entries that name them.
    pub fn sync_local(&self) -> Result<(), FsError> {
        self.file.sync_data().map_err(local)?;
        // The sidecars too: a new one is made under a temporary name and renamed over, or
        // written over a spare in place, and neither orders its bytes before the rename.
        for side in SIDECARS {
            match File::open(self.path.with_extension(side)) {
                Ok(f) => f.sync_all().map_err(local)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(local(e)),
            }
        }
        self.sync_dir().map_err(local)
    }

    /// Empty the file for an `open(O_TRUNC)`: the new size is 0 from now on, but the old
    /// bytes stay readable to handles that were reading them until the first write, truncate
    /// or upload. Reads the kernel sent before the open completed may still arrive; if they
    /// found an empty file the kernel would take the short read for EOF and zero-fill pages
    /// of the old size, and a reader would see bytes nobody wrote. `old` reads the hidden
    /// version when its bytes were never staged.
    pub fn truncate_on_open(&mut self, old: Option<Arc<crate::read::FileReader>>) -> Result<(), FsError> {
        self.mark_open(Some(0))?;
        self.eager_abandon();
        self.appends_only = true;
        self.trunc_pending = true;
        self.old = if self.size == 0 { old } else { None };
        self.dirty = true;
        self.write_gen += 1;
        // The kernel reads a watched file itself while a passthrough open of it is live (a
        // description of its own: no write lease then): it must be empty now. Else the
        // opens are ordinary ones, whose reads in flight come to us (a passthrough open
        // made later applies it first: `Staged::watch_external`). Emptied at every open
        // of a file once passed through, a reader's read sent before the open came back
        // short and the kernel zero-filled it: zeros nobody wrote (tester C).
        if self.watched() && !crate::recycle::lease_granted(&self.file) {
            self.settle()?;
            self.seen = Some(Stamp::of(&self.file)?);
        }
        Ok(())
    }

    /// The bytes are unchanged but what goes with them (mode, owner, mtime) changed: upload again.
    pub fn mark_changed(&mut self) {
        self.dirty = true;
        self.write_gen += 1;
    }

    /// Apply a pending `truncate_on_open`.
    fn settle(&mut self) -> Result<(), FsError> {
        if self.trunc_pending {
            crate::recycle::set_len(&self.file, &self.path, 0).map_err(local)?;
            self.size = 0;
            self.trunc_pending = false;
            self.old = None;
        }
        Ok(())
    }

    /// A handle counted in `handles` (and `writers`, if `writable`) closed.
    pub fn drop_handle(&mut self, writable: bool) {
        self.handles = self.handles.saturating_sub(1);
        if writable {
            self.writers = self.writers.saturating_sub(1);
        }
    }

    /// The size writers see (0 while an O_TRUNC is pending).
    pub fn len(&self) -> u64 {
        if self.trunc_pending {
            0
        } else {
            self.size
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A read by a handle that did not write: `Err(reader)` means "read the hidden version
    /// through this reader" (an O_TRUNC is pending on a file whose old bytes were never staged).
    pub fn read_old(
        &self,
        offset: u64,
        len: u32,
    ) -> Result<Result<Bytes, FsError>, Option<Arc<crate::read::FileReader>>> {
        if self.trunc_pending && self.size == 0 {
            return Err(self.old.clone());
        }
        Ok(self.read_raw(offset, len, self.size))
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), FsError> {
        self.mark_open(Some(self.changes_from(offset)))?;
        self.settle()?;
        if let Err(e) = self.file.write_all_at(data, offset) {
            // A write cut short (the disk full) may have left some of its bytes past the
            // file's end: cut them off, or the staged file would hold, and a crash's
            // recovery upload, bytes the writer was told were not written. Bytes it
            // changed below the end stay changed (write(2) allows it): the file is dirty.
            if offset < self.size {
                self.dirty = true;
                self.write_gen += 1;
                self.appends_only = false;
                self.eager_abandon();
            }
            if let Err(cut) = self.file.set_len(self.size) {
                tracing::warn!(path = %self.path.display(), "a failed write's bytes not cut off: {cut}");
            }
            return Err(local(e));
        }
        let end = offset + data.len() as u64;
        if offset != self.size {
            self.appends_only = false;
            self.eager_abandon();
        }
        self.size = self.size.max(end);
        self.dirty = true;
        self.write_gen += 1;
        Ok(())
    }

    /// Where a change through us at `offset` changes the file, for [`Staged::mark_open`]:
    /// from 0 while an `O_TRUNC` is pending, and for a file the kernel may also write
    /// directly (watched): its next look (`observe`) takes our change for one of the
    /// kernel's, which leaves no committed prefix to trust, so the committed version is
    /// copied aside first (or the change fails, `ENOSPC`, with no room for the copy).
    fn changes_from(&self, offset: u64) -> u64 {
        if self.trunc_pending || self.watched() {
            0
        } else {
            offset
        }
    }

    /// Read as a writer sees the file.
    pub fn read(&self, offset: u64, len: u32) -> Result<Bytes, FsError> {
        self.read_raw(offset, len, self.len())
    }

    fn read_raw(&self, offset: u64, len: u32, size: u64) -> Result<Bytes, FsError> {
        read_at(&self.file, offset, len, size)
    }

    /// What every handle reads now (a second descriptor of the file and its length), for
    /// reads while an upload holds the lock; `None` while an `O_TRUNC` is pending (the
    /// handles that wrote and those that did not read different bytes then).
    pub fn read_view(&self) -> Option<(Arc<File>, u64)> {
        if self.trunc_pending {
            return None;
        }
        self.file.try_clone().ok().map(|f| (Arc::new(f), self.size))
    }

    pub fn truncate(&mut self, size: u64) -> Result<(), FsError> {
        self.mark_open(Some(self.changes_from(size)))?;
        self.settle()?;
        crate::recycle::set_len(&self.file, &self.path, size).map_err(local)?;
        if size != self.size {
            self.appends_only = size == 0;
            self.eager_abandon();
        }
        self.size = size;
        self.dirty = true;
        self.write_gen += 1;
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        self.eager_abandon();
        if self.given {
            self.drop_key();
            return;
        }
        if self.dirty && !self.unlinked && self.create_only && !self.path.with_extension("excl").exists() {
            // Without its `.excl` sidecar recovery would upload it over another writer's
            // object; with it, recovery uploads it create-only (a store down at unmount).
            if let (Some(dir), Some(key)) = (self.path.parent(), self.key.clone()) {
                set_aside(dir, &self.path, &key, "made with O_EXCL and its create-only mark could not be kept");
                return;
            }
        }
        if self.dirty && !self.unlinked {
            // Data the bucket does not have: leave it (and its sidecar) for recovery.
            tracing::warn!(path = %self.path.display(), key = ?self.key, "staged data kept for the next mount");
            return;
        }
        self.drop_key();
        // Handed to the kernel (passthrough): recycled only if no other description of
        // it is left (a process's mapping may still hold the kernel's).
        // So may readers of a disk-cache file this one took over (`adopt`).
        let exclusive = (self.seen.is_none() && !self.adopted) || crate::recycle::lease_granted(&self.file);
        crate::recycle::remove_data(&self.path, &self.file, exclusive);
    }
}

/// A staged inode shared by its handles; async because uploads hold it across awaits.
/// Lock level 2: taken before `Fs::table` and the staged map, never while holding them
/// (a new one is only try-locked, uncontended, under the map before the map publishes it).
pub type SharedStaged = Arc<tokio::sync::Mutex<Staged>>;

pub(crate) fn local(e: std::io::Error) -> FsError {
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => FsError::NoSpace(format!("staging file: {e}")),
        Some(libc::EMFILE | libc::ENFILE) => FsError::TooManyFiles(format!("staging file: {e}")),
        _ => FsError::Local(format!("staging file: {e}")),
    }
}

pub(crate) fn unique() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let n = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{:x}-{:x}", std::process::id(), n)
}

/// The sidecars beside a staged data file `<id>.data` (`<id>.<ext>`): its key, its open
/// or committed marker, the committed version's copy, the create-only mark, its attributes.
pub(crate) const SIDECARS: [&str; 6] = ["key", "open", "base", "excl", "attrs", "late"];

/// Remove a staged data file's sidecars, and the data file itself if `with_data`. The
/// key sidecar goes first: a crash midway leaves data with no key (dropped as never
/// dirty), never a key with no data (which recovery takes for data lost).
pub(crate) fn remove_staged(data: &Path, with_data: bool) {
    let _ = std::fs::remove_file(data.with_extension("key"));
    if with_data {
        let _ = std::fs::remove_file(data);
    }
    for ext in SIDECARS {
        let _ = std::fs::remove_file(data.with_extension(ext));
    }
}

#[cfg(test)]
#[path = "write_tests.rs"]
mod tests;

/// Up to `len` bytes of `file` at `offset`, of its first `size`.
pub(crate) fn read_at(file: &File, offset: u64, len: u32, size: u64) -> Result<Bytes, FsError> {
    if offset >= size {
        return Ok(Bytes::new());
    }
    let n = (len as u64).min(size - offset) as usize;
    let mut buf = vec![0u8; n];
    file.read_exact_at(&mut buf, offset).map_err(local)?;
    Ok(buf.into())
}
