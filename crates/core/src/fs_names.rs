//! Creating and removing names: `create` stages an empty file (the object appears at the
//! first flush), `mkdir` writes a `dir/` marker (so empty directories persist), `unlink`
//! deletes the object, `rmdir` refuses a non-empty directory, then deletes the marker. Each
//! goes to the store first and to the caches only once the store agreed.

use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex};
use std::time::SystemTime;

use bucketfs_store::{HeadOpts, StoreErrorKind};
use futures::StreamExt;

use crate::fs::{Attr, Fs, Handle, Kind, OpenFile};
use crate::inode::ChildMeta;
use crate::FsError;

impl Fs {
    /// Undo a create of `ino` that failed after its name was made (`e`, returned): the name
    /// goes as by `unlink` once staged (nothing of it is in the store), else from the table
    /// alone (with nothing staged, `unlink` asks the store, which never had it).
    async fn create_failed(&self, parent: u64, name: &str, ino: u64, e: FsError) -> FsError {
        tracing::warn!(parent, name, "create failed, the name is removed again: {e}");
        if self.staging.contains(ino) {
            if let Err(u) = self.unlink(parent, name).await {
                tracing::warn!(parent, name, "removing the name of a failed create failed: {u}");
            }
        }
        let mut t = self.table.lock().unwrap();
        if t.child(parent, name).is_some_and(|n| n.ino == ino) {
            t.listing_remove(parent, name);
        }
        t.forget(ino, 1); // the kernel never got the entry this create remembered
        e
    }

    /// Create and open a new, empty file; it reaches the bucket at the first flush.
    /// `flags`: the open(2) flags asked; of them `O_EXCL` (fail if the name exists) and
    /// `O_TRUNC` count. The kernel asks to create when it believes the name absent, which a
    /// cached negative entry may make untrue: an existing file is then opened as open(2)
    /// would open it, emptied only with `O_TRUNC`.
    /// `mode`: permission bits to show (already masked by the umask), or `None` for the default.
    pub async fn create(&self, parent: u64, name: &str, flags: i32, mode: Option<u16>) -> Result<(Attr, u64), FsError> {
        self.new_key(parent, name, Kind::File)?;
        if let Some(existing) = self.resolve(parent, name).await? {
            if flags & libc::O_EXCL != 0 {
                return Err(FsError::Exists);
            }
            if existing.kind == Kind::Dir {
                return Err(FsError::IsDir);
            }
            let fh = self.open(existing.ino, true, flags & libc::O_TRUNC != 0).await?;
            self.table.lock().unwrap().remember(existing.ino);
            return Ok((self.attr(&self.node(existing.ino)?), fh));
        }
        let now = SystemTime::now();
        let meta = ChildMeta {
            name: name.to_string(),
            kind: Kind::File,
            size: 0,
            mtime: now,
            etag: None,
            attrs: None,
            size_unknown: false,
            asked: 0,
        };
        let ino = {
            let mut t = self.table.lock().unwrap();
            let ino = t.upsert(parent, &meta);
            t.remember(ino);
            t.listing_insert(parent, meta);
            // The default mode is what the node shows without one: left unset, the node
            // can go once its upload is done and nothing refers to it (inode_trim.rs).
            if let (Some(n), Some(m)) = (t.get_mut(ino), mode.filter(|&m| m != self.cfg.file_mode)) {
                n.perm = Some(m);
                n.attrs_here = true;
            }
            ino
        };
        let node = self.node(ino)?;
        // A create that fails here (the staging disk full) leaves no name behind: it showed
        // with size 0 for good, and an O_EXCL create of it again failed with EEXIST.
        let staged = match self.stage(&node, true, true, true).await {
            Ok(staged) => staged,
            Err(e) => return Err(self.create_failed(parent, name, ino, e).await),
        };
        let made = {
            let mut st = staged.lock().await;
            let made = st.set_key(&node.key).and_then(|_| st.truncate(0)); // dirty: even an empty file goes up
            st.in_store = false; // a new name: nothing to delete when it goes before upload
            st.set_create_only(flags & libc::O_EXCL != 0); // O_EXCL: never replace an object made meanwhile
            if made.is_err() {
                st.drop_handle(true); // the handle this create will not return
            }
            made
        };
        if let Err(e) = made {
            return Err(self.create_failed(parent, name, ino, e).await);
        }
        let file = OpenFile {
            ino,
            reader: Mutex::new(self.reader_for(&node)),
            keep_cache: false,
            dropping: AtomicBool::new(false),
            direct: false,
            staged: AtomicBool::new(true),
            wrote: AtomicBool::new(true),
            truncate_at_flush: AtomicBool::new(false),
            writable: true,
            writes_unseen: Default::default(),
            unseen_mark: AtomicU64::new(u64::MAX), // it wrote: `wrote` decides
        };
        let fh = self.insert_handle(Handle::File(Arc::new(file)));
        Ok((self.attr(&node), fh))
    }

    /// The key `name` has in `parent`, with an intent on it held while the caller makes or
    /// removes it there: a rename of a directory above (exclusive below it) goes before or
    /// after, never between the key's choice and the change. (The kernel locks a renamed
    /// directory's parent, not the directory: `mkdir tmp/x` may run during `mv tmp ckpt`.)
    pub(crate) async fn name_intent(
        &self,
        parent: u64,
        name: &str,
        kind: Kind,
    ) -> Result<(String, crate::intents::Intent<'_>), FsError> {
        loop {
            let key = self.new_key(parent, name, kind)?;
            let intent = self.intents.acquire(vec![crate::intents::Scope::Key(key.clone())], false).await;
            if self.new_key(parent, name, kind)? == key {
                return Ok((key, intent));
            }
        }
    }

    pub async fn mkdir(&self, parent: u64, name: &str, mode: Option<u16>) -> Result<Attr, FsError> {
        let (key, _intent) = self.name_intent(parent, name, Kind::Dir).await?;
        if self.resolve(parent, name).await?.is_some() {
            return Err(FsError::Exists);
        }
        self.make_marker(&key).await?;
        let meta = ChildMeta {
            name: name.to_string(),
            kind: Kind::Dir,
            size: 0,
            mtime: SystemTime::now(),
            etag: None,
            attrs: None,
            size_unknown: false,
            asked: 0,
        };
        let mut t = self.table.lock().unwrap();
        let ino = t.upsert(parent, &meta);
        t.remember(ino);
        t.listing_insert(parent, meta);
        // Made here, so known empty for the TTL: lookups of new names in it (a `git clone`,
        // `tar -x`) are answered with no request.
        let empty = crate::inode::Listing {
            at: self.cfg.clock.now(),
            valid_for: self.cfg.metadata_ttl,
            children: Default::default(),
            subtree: true,
            overtaken: false,
        };
        // Recorded as a listing sent now: one of an older directory of this name, still on
        // its way (a recursive listing of an ancestor), is older news (`has_newer_listing`).
        let now = t.change_seq();
        t.set_listing_since(ino, empty, now);
        let n = t.get_mut(ino).expect("just inserted");
        if let Some(m) = mode.filter(|&m| m != self.cfg.dir_mode) {
            n.perm = Some(m);
            n.attrs_here = true;
        }
        Ok(self.attr(n))
    }

    /// [`Fs::unlink`] of a file created here and never uploaded (nothing to ask the store:
    /// a build's or a clone's temporary files), at once, if no lock is held; `None`: run
    /// [`Fs::unlink`]. The adapter replies on the thread that got the request.
    pub fn unlink_now(&self, parent: u64, name: &str) -> Option<Result<(), FsError>> {
        let node = self.table.lock().unwrap().child(parent, name).cloned()?;
        let staged = self.staging.get(node.ino)?;
        // The intent before the staged lock, as in `unlink`.
        let _intent = self.intents.try_acquire(vec![crate::intents::Scope::Key(node.key.clone())], true)?;
        let mut st = staged.try_lock().ok()?;
        if st.may_be_stored() || st.uploading_eagerly() {
            return None; // the bucket may hold it (a DELETE is due), or parts to abort
        }
        self.discard_locked(node.ino, &staged, &mut st);
        drop(st);
        self.table.lock().unwrap().listing_remove(parent, name);
        // Its sidecars went above (a crash now uploads nothing); the data file is recycled
        // after the reply.
        crate::recycle::drop_later(staged);
        Some(Ok(()))
    }

    pub async fn unlink(&self, parent: u64, name: &str) -> Result<(), FsError> {
        let node = self.resolve(parent, name).await?.ok_or(FsError::NotFound)?;
        if node.kind == Kind::Dir {
            return Err(FsError::IsDir);
        }
        // No upload of it may be in flight while it goes (intents.rs): one landing after
        // the delete would bring the file back. Uploads of other keys go on; its own, in
        // flight, is cancelled rather than waited for (the store may hang; write_back.rs).
        self.cancel_upload(node.ino).await;
        let mut key = node.key.clone();
        let (_intent, node) = loop {
            let intent = self.intent_cancelling(vec![crate::intents::Scope::Key(key.clone())], &key, None).await;
            // As of now: a rename of a directory above it may have moved its key meanwhile
            // (the kernel serializes this unlink with any change of the name itself).
            match self.table.lock().unwrap().child(parent, name) {
                Some(n) if n.ino == node.ino && n.key == key => break (intent, n.clone()),
                Some(n) if n.ino == node.ino => key = n.key.clone(),
                _ => return Err(FsError::NotFound),
            }
        };
        if let Some(landing) = self.stored_how(node.ino).await {
            // Write-back: journaled, sent soon; with the version unlinked, in case it goes
            // late. A staged file's is the version it last stored or read (its object may be
            // older than the node knows): a file still staged after its upload (a release
            // late under load) was deleted late with no condition, over another client's
            // object written since (test_a_change_whose_first_try_failed..., rm-gcs).
            let version = match self.staging.get(node.ino) {
                Some(s) => s.lock().await.stored_tag(&node.key),
                None => node.version.tag().map(str::to_owned),
            };
            let version = version.filter(|_| landing == crate::write::Landing::Stored);
            self.delete_removed_version(&node.key, landing, version).await?;
        }
        self.discard_staged(node.ino).await;
        self.table.lock().unwrap().listing_remove(parent, name);
        Ok(())
    }

    /// Whether listed marker `m` (`d/`) holds bytes, which no file name shows and which
    /// deleting or re-creating the marker would lose (another client can put content
    /// there). A stat answers where the listing could not tell.
    pub(crate) async fn marker_holds_bytes(&self, m: &bucketfs_store::ObjectMeta) -> Result<bool, FsError> {
        if !m.may_hold_bytes() {
            return Ok(false);
        }
        let holds = match m.size {
            0 => match self.store.head(&m.key, HeadOpts { marker_bytes: true, ..Default::default() }).await {
                Ok(now) => now.meta.size > 0 || now.meta.size_unknown,
                Err(e) if e.kind == StoreErrorKind::NotFound => false,
                Err(e) => return Err(e.into()),
            },
            _ => true,
        };
        if holds {
            tracing::warn!(key = %m.key, "a directory marker holds bytes no file name shows, so the directory is kept as it is: move or delete that key with another client");
        }
        Ok(holds)
    }

    /// Whether the directory with key `key` (and inode `ino`) has any child.
    pub(crate) async fn has_children(&self, ino: u64, key: &str) -> Result<bool, FsError> {
        if !self.staged_children(ino).is_empty() {
            return Ok(true);
        }
        if self.write_back() {
            // Answered locally from a listing within its TTL, as `ls` is: no wait on the
            // store (a file another client put there since keeps the directory in the
            // bucket; only the marker goes). One past its TTL is refreshed as `ls` would
            // refresh it: waited for briefly, else renewed while the store does not answer.
            // A directory holding keys it does not show asks the store, which names them.
            let stale = {
                let t = self.table.lock().unwrap();
                t.listing(ino).is_some_and(|l| !t.trusted(l)) && !t.holds_hidden(key)
            };
            if stale {
                if let Ok(dir) = self.node(ino) {
                    let _ = self.ensure_listing(&dir, false).await; // a failure: asked below
                }
            }
            let t = self.table.lock().unwrap();
            if let Some(l) = t.listing(ino).filter(|l| !l.overtaken && t.trusted(l) && !t.holds_hidden(key)) {
                return Ok(!l.children.is_empty());
            }
        }
        let mut stream = self.store.list(key, false);
        loop {
            match stream.next().await {
                // Its own marker, listed when it may hold bytes: those make it not empty.
                Some(Ok(m)) if m.key == key => {
                    if self.marker_holds_bytes(&m).await? {
                        return Ok(true);
                    }
                }
                Some(Ok(m)) => {
                    if !self.shown_below(key, &m.key) {
                        tracing::warn!(dir = %key, key = %m.key, "directory holds a key with no file name here (not shown), so it is not empty: move or delete that key with another client");
                    }
                    return Ok(true);
                }
                Some(Err(e)) if e.kind != StoreErrorKind::NotFound => return Err(e.into()),
                _ => return Ok(false),
            }
        }
    }

    pub async fn rmdir(&self, parent: u64, name: &str) -> Result<(), FsError> {
        let node = self.resolve(parent, name).await?.ok_or(FsError::NotFound)?;
        if node.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let (key, _intent) = self.name_intent(parent, name, Kind::Dir).await?;
        let node = match self.table.lock().unwrap().child(parent, name) {
            Some(n) if n.ino == node.ino && n.key == key => n.clone(),
            _ => return Err(FsError::NotFound), // gone or replaced while the intent waited
        };
        if self.has_children(node.ino, &node.key).await? {
            return Err(FsError::NotEmpty);
        }
        // Journaled and sent in the background in write-back mode, as an unlink.
        match self.delete_removed(&node.key, crate::write::Landing::Stored).await {
            Err(FsError::Store(e)) if e.kind == StoreErrorKind::NotFound => {}
            r => r?,
        }
        let mut t = self.table.lock().unwrap();
        t.listing_remove(parent, name);
        t.invalidate_listing(node.ino);
        Ok(())
    }
}
