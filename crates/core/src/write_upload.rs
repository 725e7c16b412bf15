//! A staged file's upload: the whole file at a commit point ([`Staged::upload`]: only what
//! changed where the store can keep the rest, else in parallel parts), and the eager upload
//! of a sequential writer's full parts before its close ([`Staged::eager_feed`]).

use super::*;

impl Staged {
    /// Whether the key may hold an object a rename away or an unlink must delete: one of
    /// these bytes' ([`Staged::in_store`]), the replaced file's ([`Staged::replaces`]), or
    /// one an upload cut off may still write ([`Staged::maybe_landed`]).
    pub fn may_be_stored(&self) -> bool {
        self.in_store || self.replaces || self.maybe_landed
    }

    /// The tag of the object `key` holds of these bytes, where this mount stored or read it
    /// and nothing else of it can be there (no replaced file's object, no upload cut off):
    /// an unlink's delete sent late takes only that version.
    pub fn stored_tag(&self, key: &str) -> Option<String> {
        let only_ours = self.in_store && !self.replaces && !self.maybe_landed;
        self.stored.as_ref().filter(|s| only_ours && s.key == key).map(|s| s.identity.clone())
    }

    /// How a rename away or an unlink deletes the key, when [`Staged::may_be_stored`].
    pub fn landing(&self) -> Landing {
        match (&self.landed_md5s, self.maybe_landed, self.in_store || self.replaces) {
            (_, false, _) => Landing::Stored,
            (Some(md5s), true, false) => Landing::IfMd5(md5s.clone()),
            (md5s, true, true) => Landing::Any(md5s.clone().unwrap_or_default()),
            (None, true, false) => Landing::Any(Vec::new()),
        }
    }

    /// An upload was cut off (a timeout, a dropped connection, or cancelled by a rename or
    /// unlink): the store may still complete it. A create-only one lands only where no
    /// object was, so the key is not taken as holding an older version (`in_store`). What
    /// a single request sent is remembered, to tell its object from another client's (and
    /// from a newer version: late.rs).
    pub fn cut_off(&mut self) {
        self.maybe_landed = true;
        self.resending = false; // the next upload that succeeds goes again, as after any
        self.in_store |= !self.create_only;
        let md5 = self.sending.take().map(|data| <md5::Md5 as md5::Digest>::digest(&data[..]).into());
        match (md5, self.landed_md5s.as_mut()) {
            (Some(md5), Some(all)) if all.contains(&md5) => {}
            (Some(md5), Some(all)) => all.push(md5),
            _ => self.landed_md5s = None,
        }
    }

    /// An upload cut off of another file (one this file replaced by a rename) may land
    /// under the key: as after a cut-off upload of its own, but with no MD5 to tell it by,
    /// and the next upload that succeeds goes again after a grace (`Fs::follow_late_landing`).
    pub fn landing_unknown(&mut self) {
        self.maybe_landed = true;
        self.resending = false;
        self.landed_md5s = None;
    }

    /// No upload cut off can land under the key any more (one succeeded there, the store
    /// refused one, or the key's object was deleted after it).
    pub fn landing_settled(&mut self) {
        self.maybe_landed = false;
        self.landed_md5s = Some(Vec::new());
        self.sending = None;
    }

    /// Uploaded to `key`, but an older upload cut off may still land over it: due to go up
    /// again, whole (what the bucket holds is not known to be these bytes). Until then a
    /// crash recovers it (its key named again) and an unlink deletes the key twice.
    pub fn send_again(&mut self, key: &str) -> Result<(), FsError> {
        crate::recycle::write(&self.key_path(), key.as_bytes()).map_err(local)?;
        // Due to go up whatever the bucket holds: no longer a copy kept only in case.
        let _ = std::fs::remove_file(self.late_path());
        if self.fsynced {
            // An fsync'd version: its key is named again on disk before anything else
            // happens, or a power cut would forget that it must go up again.
            self.sync_local()?;
        }
        self.key = Some(key.to_string());
        self.dirty = true;
        self.write_gen += 1;
        self.stored = None;
        self.maybe_landed = true;
        self.resending = true;
        self.keep_as_committed();
        Ok(())
    }

    /// Whether parts of it are being sent ahead of its close (an eager upload to abort).
    pub fn uploading_eagerly(&self) -> bool {
        self.eager.is_some()
    }

    pub(super) fn eager_abandon(&mut self) {
        if let Some(mut e) = self.eager.take() {
            // Abort in the background: the caller is a write and must stay cheap.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = e.writer.abort().await;
                });
            }
        }
    }

    /// What an upload of these bytes is stored with.
    pub(super) fn put_opts(&self, attrs: &FileAttrs) -> PutOpts {
        let created_by = self.excl_tag.filter(|_| self.create_only);
        PutOpts { attrs: FileAttrs { created_by, ..attrs.clone() }, if_not_exists: self.create_only }
    }

    /// Hand every complete part past what was sent to the eager upload, starting one if a
    /// sequential writer has written a first full part.
    pub async fn eager_feed(
        &mut self,
        store: &dyn Store,
        key: &str,
        opts: &WriteOptions,
        attrs: &FileAttrs,
    ) -> Result<(), FsError> {
        let part = opts.part_size as u64;
        self.settle()?;
        if !self.dirty {
            // Unchanged since its last upload (the close's): a tick after it must not send
            // the whole file again.
            return Ok(());
        }
        if self.eager.is_none() {
            // Sequential writes seen here, or a file the kernel writes (checked at the end).
            if self.size < part || !(self.appends_only || self.watched()) {
                return Ok(());
            }
            // The bucket holds a version to patch: close sends only what changed.
            if self.patchable(store, key) {
                return Ok(());
            }
            // No share free now: the file goes up at close instead (never wait here, with
            // a writer that may keep the file open for hours: see part_budget.rs).
            let Some(share) = self.budget.eager(opts) else { return Ok(()) };
            let put = self.put_opts(attrs);
            let writer = store.writer(key, WriteOptions { put: put.clone(), ..opts.clone() }).await?;
            let crcs = self.watched().then(Vec::new);
            let sums = Sums::default();
            self.eager = Some(Eager { key: key.to_string(), put, writer, sent: 0, crcs, sums, _share: share });
        }
        let Some(e) = self.eager.as_mut() else { return Ok(()) };
        if e.key != key {
            self.eager_abandon();
            return Ok(());
        }
        while self.size - e.sent >= part {
            let mut buf = vec![0u8; part as usize];
            self.file.read_exact_at(&mut buf, e.sent).map_err(local)?;
            if let Some(crcs) = e.crcs.as_mut() {
                crcs.push(crc32c::crc32c(&buf));
            }
            e.sums.record(e.sent, &buf);
            if let Err(err) = e.writer.write(buf.into()).await {
                self.eager_abandon();
                return Err(err.into());
            }
            e.sent += part;
        }
        Ok(())
    }

    /// [`Staged::upload`] to `key` replacing whatever it holds (a rename's target), though
    /// the file may be create-only under its own name. That stays so, `.excl` sidecar
    /// included, unless the upload succeeds: after a failed rename, or a crash during it,
    /// no later upload replaces another client's object under the old name.
    pub async fn upload_replacing(
        &mut self,
        store: &dyn Store,
        key: &str,
        opts: &WriteOptions,
        attrs: &FileAttrs,
    ) -> Result<ObjectMeta, FsError> {
        if !self.create_only {
            return self.upload(store, key, opts, attrs).await;
        }
        // What a cut-off upload would note is about `key`, not the name kept on failure.
        let kept = (self.in_store, self.maybe_landed, self.landed_md5s.clone());
        self.create_only = false;
        let r = self.upload(store, key, opts, attrs).await;
        match r {
            Ok(_) => self.mark_excl(false),
            Err(_) => {
                self.create_only = true;
                (self.in_store, self.maybe_landed, self.landed_md5s) = kept;
            }
        }
        r
    }

    /// Upload the staged bytes to `key`; returns the new object's metadata.
    /// `attrs` (mode, owner, mtime) go with it where the store keeps them. Where the bucket
    /// holds a version this mount stored or read, only what changed is sent (write_patch.rs).
    pub async fn upload(
        &mut self,
        store: &dyn Store,
        key: &str,
        opts: &WriteOptions,
        attrs: &FileAttrs,
    ) -> Result<ObjectMeta, FsError> {
        self.settle()?;
        if self.watched() {
            self.write_out()?;
        }
        self.observe()?;
        let gen = self.write_gen;
        let size = self.size;
        let put = self.put_opts(attrs);
        // Set below for a single PUT.
        (self.sending, self.sent_twice) = (None, None);
        let mut sent_twice = None;
        // (Not for the mtime alone, which each write moves: the object carries the one of
        // the eager upload's start.)
        let but_mtime = |p: &PutOpts| PutOpts { attrs: FileAttrs { mtime: None, ..p.attrs.clone() }, ..p.clone() };
        if self.eager.as_ref().is_some_and(|e| but_mtime(&e.put) != but_mtime(&put)) {
            self.eager_abandon(); // chmod/utime since it began: its metadata is out of date
        }
        let mut eager = self.eager.take().filter(|e| e.key == key && e.sent <= self.size);
        if let Some(e) = eager.take_if(|e| !self.parts_unchanged(e, opts)) {
            // The kernel changed a part after it was sent: the file goes up whole.
            let mut e = e;
            let _ = e.writer.abort().await;
        }
        let mut sums = Sums::default();
        let mut pieces = Some(size.div_ceil(opts.part_size as u64).max(1) as u32);
        let patched = match eager {
            None => self.patch(store, key, opts, put.clone(), &mut sums).await,
            Some(_) => None,
        };
        let result = match (patched, eager) {
            (Some(r), _) => r.map(|done| {
                pieces = done.pieces;
                done.meta
            }),
            (None, Some(mut e)) => {
                let r = send_file(&self.file, e.sent, self.size, e.writer.as_mut(), opts, Some(&mut e.sums)).await;
                sums = std::mem::take(&mut e.sums);
                match r {
                    Ok(()) => e.writer.close().await.map_err(FsError::from),
                    Err(err) => {
                        let _ = e.writer.abort().await;
                        Err(err)
                    }
                }
            }
            (None, None) if self.size <= opts.part_size as u64 => {
                // One part or less: a single PUT is one round trip instead of three.
                let _share = self.budget.upload(self.len(), opts).await;
                let data = self.read(0, self.size as u32)?;
                sums.record(0, &data);
                if self.size <= LANDING_MD5_MAX {
                    self.sending = Some(data.clone()); // hashed only if cut off
                }
                let done = store.put_tried(key, data, put).await.map_err(FsError::from);
                if done.as_ref().is_ok_and(|d| d.cut_tries > 0) {
                    sent_twice = self.sending.as_ref().map(|data| <md5::Md5 as md5::Digest>::digest(&data[..]).into());
                }
                done.map(|d| d.meta)
            }
            (None, None) => {
                let _share = self.budget.upload(self.size, opts).await;
                let mut w = store.writer(key, WriteOptions { put, ..opts.clone() }).await?;
                match send_file(&self.file, 0, self.size, w.as_mut(), opts, Some(&mut sums)).await {
                    Ok(()) => w.close().await.map_err(FsError::from),
                    Err(err) => {
                        let _ = w.abort().await;
                        Err(err)
                    }
                }
            }
        };
        let meta = match result {
            Ok(meta) => meta,
            Err(e) => {
                // Not refused outright: the request may still land. A create-only one lands
                // only where no object was, so the key is not taken as holding an older
                // version (`in_store`), but a rename away or an unlink deletes what landed.
                // A create-only upload refused (the key holds an object: another client's,
                // or an earlier try of ours that landed late; which, nothing tells) leaves
                // the key alone from then on.
                let refused = matches!(&e, FsError::Store(s) if !matches!(s.kind, StoreErrorKind::Unavailable | StoreErrorKind::Other));
                let exists = self.create_only && matches!(&e, FsError::Store(s) if s.kind == StoreErrorKind::Exists);
                if exists && landed_here(store, key, self.excl_tag).await {
                    // Our own earlier try landed (its answer lost, then this retry refused):
                    // the create-only promise was kept by that try, and this version
                    // replaces it as any later close would.
                    tracing::info!(
                        key,
                        "a create-only upload found its own earlier try in the store: sent again over it"
                    );
                    self.set_create_only(false);
                    self.landing_settled();
                    (self.in_store, self.sending) = (true, None);
                    return Box::pin(self.upload(store, key, opts, attrs)).await;
                }
                if !refused {
                    self.cut_off();
                } else if exists {
                    self.landing_settled();
                }
                self.sending = None;
                return Err(e);
            }
        };
        self.landing_settled();
        self.sent_twice = sent_twice;
        self.in_store = true;
        self.replaces = false;
        self.set_create_only(false);
        self.stored = meta.etag.clone().map(|identity| Stored {
            key: key.to_string(),
            identity,
            len: size,
            pieces,
            sums: sums.finish(size),
        });
        self.observe()?; // a passthrough write during the upload keeps the file dirty
        if self.write_gen == gen && self.watched() {
            // The kernel may still change it: the key stays named, committed as of now.
            self.dirty = false;
            self.mark_committed_as_is()?;
        } else if self.write_gen == gen {
            self.dirty = false;
            let _ = crate::recycle::remove(&self.key_path());
            self.key = None;
            if self.open_marked {
                let _ = crate::recycle::remove(&self.open_path());
                self.open_marked = false;
                self.marked_as = None;
                self.open_text = None;
            }
        }
        if self.write_gen == gen {
            self.forget_base(); // the bucket holds what was committed, or newer
        }
        Ok(meta)
    }

    /// Write the file's dirty pages out (and wait), before an upload reads a file the kernel
    /// writes (passthrough). A process's shared mapping writes a page it made dirty with no
    /// fault, and only a fault moves the mtime [`Staged::observe`] goes by; written out, the
    /// page is write-protected again, so each write after the upload faults and is seen.
    /// (Before, a write through a mapping after an upload, to a page written before it, never
    /// reached the bucket: tester T.)
    fn write_out(&self) -> Result<(), FsError> {
        use std::os::fd::AsRawFd;
        let all = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: a descriptor this staged file owns; offset 0, length 0: the whole file.
        if unsafe { libc::sync_file_range(self.file.as_raw_fd(), 0, 0, all) } != 0 {
            return Err(local(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Whether the parts an eager upload sent still hold what was sent (always, unless the
    /// kernel writes the file: then each part is read again and its CRC32C compared).
    pub(super) fn parts_unchanged(&self, e: &Eager, opts: &WriteOptions) -> bool {
        let Some(crcs) = &e.crcs else { return true };
        let mut buf = vec![0u8; opts.part_size];
        crcs.iter().enumerate().all(|(i, crc)| {
            self.file.read_exact_at(&mut buf, i as u64 * opts.part_size as u64).is_ok() && crc32c::crc32c(&buf) == *crc
        })
    }
}

/// Feed bytes `from..size` of `file` to `w`, one part (one buffer) at a time.
pub(crate) async fn send_file(
    file: &File,
    from: u64,
    size: u64,
    w: &mut dyn ObjectWriter,
    opts: &WriteOptions,
    mut sums: Option<&mut Sums>,
) -> Result<(), FsError> {
    let mut off = from;
    while off < size {
        let n = (opts.part_size as u64).min(size - off) as usize;
        let mut buf = vec![0u8; n];
        file.read_exact_at(&mut buf, off).map_err(local)?;
        if let Some(s) = sums.as_deref_mut() {
            s.record(off, &buf);
        }
        w.write(buf.into()).await?;
        off += n as u64;
    }
    Ok(())
}

/// Upload `file`'s first `size` bytes to `key`, whole, through one writer (crash recovery;
/// a closed version kept aside, sent over a late landing).
pub(crate) async fn send_whole(
    store: &dyn Store,
    key: &str,
    file: &File,
    size: u64,
    opts: &WriteOptions,
) -> Result<ObjectMeta, FsError> {
    let mut w = store.writer(key, opts.clone()).await?;
    if let Err(e) = send_file(file, 0, size, w.as_mut(), opts, None).await {
        let _ = w.abort().await;
        return Err(e);
    }
    w.close().await.map_err(FsError::from)
}

/// Whether the object at `key` is one of the create-only tries tagged `tag`
/// ([`FileAttrs::created_by`]), landed though its answer was lost: never another writer's,
/// which cannot carry the tag. `false` where it cannot be told (no tag, no answer, a store
/// that keeps no metadata).
pub(crate) async fn landed_here(store: &dyn Store, key: &str, tag: Option<u128>) -> bool {
    let Some(tag) = tag else { return false };
    store.head(key, Default::default()).await.is_ok_and(|h| h.attrs.created_by == Some(tag))
}
