//! rename: the namespace change that moves data (files, directories, and their staged
//! and pending state).

use bucketfs_store::{StoreErrorKind, StoreExt};

use super::check_new_name;
use crate::fs::{Fs, Kind};
use crate::inode::Version;
use crate::sync::Arc;
use crate::FsError;

/// Record `key` as the staged file's key in its sidecar (what crash recovery uploads, and
/// where); a failure is logged, the rename goes on.
fn name_staged(st: &mut crate::write::Staged, key: &str) {
    if let Err(e) = st.set_key(key) {
        tracing::warn!(%key, "staged file's new key not recorded: {e}");
    }
}

/// A rename's changes to the store in progress ([`crate::inode::InodeTable::begin_move`]),
/// over when dropped: at the end, or at an error on the way.
/// `done` once the table has recorded the move (else it failed on the way).
struct Moving<'a> {
    fs: &'a Fs,
    id: u64,
    done: bool,
}

impl<'a> Moving<'a> {
    fn begin(fs: &'a Fs, from: (u64, &str), to: (u64, &str), keys: Vec<String>) -> Self {
        let id = fs.table.lock().unwrap().begin_move(from, to, keys);
        Moving { fs, id, done: false }
    }
}

impl Drop for Moving<'_> {
    fn drop(&mut self) {
        self.fs.table.lock().unwrap().end_move(self.id, self.done);
    }
}

impl Fs {
    /// Rename `parent/name` to `newparent/newname`. `noreplace`: fail if the target exists.
    pub async fn rename(
        &self,
        parent: u64,
        name: &str,
        newparent: u64,
        newname: &str,
        noreplace: bool,
    ) -> Result<(), FsError> {
        check_new_name(newname)?;
        let src = self.resolve(parent, name).await?.ok_or(FsError::NotFound)?;
        // An upload of the file (or of one below the directory, or of the target) in flight
        // is cancelled, not waited for: the store may hang (write_back.rs).
        self.cancel_uploads_of(&src.key, Some((newparent, newname))).await;
        if let Some(staged) = self.staging.get(src.ino) {
            // The kernel may have written it directly: the entry moved carries its size.
            self.observe(src.ino, &mut *staged.lock().await)?;
        }
        // No upload of these keys in flight while names move (intents.rs): a close meanwhile
        // would send its bytes to a key being copied away, or left behind. Declared as the
        // keys are once declared (a move of a directory above may change them meanwhile).
        let (_intent, src, target_dir) = loop {
            let (src, target_dir) = (self.node(src.ino)?, self.node(newparent)?);
            let scopes = self.rename_scopes(&src, &target_dir.key, newname);
            let intent = self.intent_cancelling(scopes, &src.key, Some((newparent, newname))).await;
            let (now_src, now_dir) = (self.node(src.ino)?, self.node(newparent)?);
            if now_src.key == src.key && now_dir.key == target_dir.key {
                break (intent, src, target_dir);
            }
        };
        self.new_key(newparent, newname, src.kind)?;
        if parent == newparent && name == newname {
            return Ok(());
        }
        if target_dir.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        if src.kind == Kind::Dir && target_dir.key.starts_with(&src.key) {
            return Err(FsError::InvalidName); // into itself: EINVAL, as on Linux
        }
        let (mut replaced, mut discard_after, mut took_object) = (None, None, false);
        let dst = self.resolve(newparent, newname).await?;
        let new_key = crate::inode::key_for(&target_dir.key, newname, src.kind);
        // From the first change to the store until the table records the move, the store's
        // answers about these names are not recorded (a lister's HEAD or listing in between).
        let mut keys = vec![src.key.clone(), new_key.clone()];
        keys.extend(dst.as_ref().filter(|d| d.key != new_key).map(|d| d.key.clone()));
        let mut moving = Moving::begin(self, (parent, name), (newparent, newname), keys);
        // Versions named by size and mtime (a local folder) whose cached bytes the moved
        // file could be served from at its new name: see `forget_named_alike`.
        let mut alike = Vec::new();
        if src.kind == Kind::File && src.version.tag().is_none() {
            alike.push((new_key.clone(), src.identity(), src.size));
            let replaced_file = dst.as_ref().filter(|d| d.kind == Kind::File && d.version.tag().is_none());
            alike.extend(replaced_file.map(|d| (d.key.clone(), d.identity(), d.size)));
        }
        if let Some(dst) = dst {
            if noreplace {
                return Err(FsError::Exists);
            }
            match (src.kind, dst.kind) {
                (Kind::File | Kind::Symlink, Kind::Dir) => return Err(FsError::IsDir),
                (Kind::Dir, Kind::File | Kind::Symlink) => return Err(FsError::NotDir),
                (Kind::Dir, Kind::Dir) if self.has_children(dst.ino, &dst.key).await? => return Err(FsError::NotEmpty),
                (Kind::Dir, Kind::Dir) => {
                    // Journaled in write-back mode, as an rmdir.
                    let _ = self.delete_removed(&dst.key, crate::write::Landing::Stored).await;
                }
                (_, _) => {
                    took_object = dst.kind == src.kind && self.stored(dst.ino).await;
                    // The target is replaced: its staged bytes must never be uploaded later
                    // (nothing uploads them meanwhile: the intent). Dropped once the source
                    // holds the name: a move that fails keeps them (a writer's unsaved
                    // bytes), and a crash in between recovers one of the two.
                    discard_after = Some(dst.ino);
                    if dst.kind != src.kind {
                        // Another key holds it (a link replaced by a file or back).
                        replaced = Some(dst.key.clone());
                    }
                }
            }
        }
        tracing::debug!(ino = src.ino, from = %src.key, to = %new_key, "rename");
        // Whether the object under the new key holds the bytes of the version the node knew
        // (else the rename uploaded newer ones: nothing cached of the old one may follow);
        // `None`: the object moves in the background (write-back), nothing to learn yet.
        let mut listings_whole = false;
        // Whether the target's upload was cut off (it may land late): asked before the move,
        // which may discard it.
        let (late_target, late_md5s) = match discard_after.and_then(|d| self.staging.get(d)) {
            Some(s) => {
                let st = s.lock().await;
                (st.maybe_landed, st.landing().late_md5s().to_vec())
            }
            None => (false, Vec::new()),
        };
        // Where an upload cut off may still land under the new key (the target's, or one
        // watched since: late.rs), the source's bytes are staged first, for the watch to
        // send them up again over it. Before, a file never opened here lost its bytes to
        // the late landing (tester G: `rm a; mv o a`, o's object moved and gone).
        let kept_for_late =
            src.kind == Kind::File && (late_target || self.late.watches(&new_key)) && self.stage_for_late(&src).await;
        let same_bytes = match src.kind {
            Kind::File | Kind::Symlink => self.move_file(&src, &new_key, discard_after).await?,
            Kind::Dir => {
                listings_whole = self.move_dir(&src, &new_key).await?;
                Some(true)
            }
        };
        self.forget_named_alike(alike).await;
        if took_object {
            // Still the replaced file's object under the name until ours goes up.
            if let Some(staged) = self.staging.get(src.ino) {
                let mut st = staged.lock().await;
                st.replaces = !st.in_store;
            }
        }
        if let Some(dst) = discard_after {
            self.outrank_staged(src.ino, dst).await;
            self.discard_staged(dst).await;
            if late_target && matches!(src.kind, Kind::File) && self.write_back() {
                self.follow_late_landing(src.ino, &new_key).await;
            }
        }
        if kept_for_late {
            self.late.watch(&new_key, &late_md5s, Some(src.ino), std::time::Instant::now());
            self.keep_for_late(src.ino).await;
        }
        if let Some(key) = replaced {
            // Journaled in write-back mode, as an unlink: a file's rename there never waits
            // for the store (it waited, and could fail after the move was journaled).
            match self.delete_removed(&key, crate::write::Landing::Stored).await {
                Err(FsError::Store(e)) if e.kind == StoreErrorKind::NotFound => {}
                r => r?,
            }
        }
        // Files moved that handles are open on, with their old identities.
        let mut open_moved = std::collections::HashMap::new();
        let mut moved_dirs = Vec::new();
        {
            let mut t = self.table.lock().unwrap();
            t.listing_move_out(parent, name);
            t.relocate(src.ino, newparent, newname);
            // Moved objects are new objects (a new GCS generation; on S3 a new ETag for a
            // multipart source): a read pinned to the old identity would fail with ESTALE.
            // (Not a directory moved with no request: the store has nothing below it yet,
            // its listings are whole, and a store that hangs would hold the next `ls`.)
            if src.kind == Kind::Dir && !listings_whole {
                let stale = t.expired_instant(self.cfg.metadata_ttl);
                moved_dirs = t.expire_below(&new_key, stale);
            }
            // Their new identities are not known until `learn_moved` asks: none until then,
            // so a lister that sees one first does not take it for another client's file
            // (`Node::replaced_by`). Linked ones only: a file replaced earlier (unlinked,
            // still open) keeps reading its own version, never the one that took its name.
            let ours =
                |n: &crate::inode::Node| n.ino == src.ino || src.kind == Kind::Dir && n.key.starts_with(&new_key);
            let moved: Vec<u64> = t
                .nodes()
                .filter(|n| n.kind == Kind::File && n.linked && n.opens > 0 && ours(n))
                .map(|n| n.ino)
                .collect();
            for ino in moved {
                let n = t.get_mut(ino).expect("just listed");
                open_moved.insert(ino, n.identity());
                if !n.local {
                    n.version = Version::Unknown;
                }
            }
            if same_bytes.is_none() {
                // The copy's identity is asked for at the next open, which waits for the move.
                if let Some(n) = t.get_mut(src.ino).filter(|n| !n.local) {
                    n.version = Version::Unknown;
                }
            }
            t.relist(src.ino);
        }
        moving.done = true;
        drop(moving); // before `learn_moved`: its HEAD answers after the move

        // What readers saw of them while they moved (a listing the store gave mid-move) is
        // not kept by the kernel either.
        self.drop_dir_caches(moved_dirs);
        self.rekey_staged_below(&new_key).await;
        match src.kind {
            // Moved in the background: learnt at the next open. (A handle opened during the
            // rename reads from the old key: learn now, which waits for the move.)
            Kind::File if same_bytes.is_none() && !open_moved.contains_key(&src.ino) => {}
            Kind::File if self.pending_here(src.ino).await => {} // no object to learn from yet
            Kind::File => {
                let old_identity = open_moved.remove(&src.ino).unwrap_or_else(|| src.identity());
                self.learn_moved(src.ino, &src.key, &old_identity, same_bytes != Some(false)).await
            }
            Kind::Dir => {
                // Handles open on files below read the moved objects from now on (their old
                // keys are gone: a reader left on them was cut short at its cached blocks).
                // Staged files too: no listing updates a staged node (`Node::local`), and
                // its listing entry would carry the old identity past the staged file.
                // (Files opened since the move was recorded too: their identity is the old
                // one still.)
                let below: Vec<(u64, String, String)> = {
                    let t = self.table.lock().unwrap();
                    t.nodes()
                        .filter(|n| n.kind == Kind::File && n.linked && n.key.starts_with(&new_key))
                        .filter(|n| n.opens > 0 || open_moved.contains_key(&n.ino) || self.staging.contains(n.ino))
                        .map(|n| {
                            let old_identity = open_moved.get(&n.ino).cloned().unwrap_or_else(|| n.identity());
                            (n.ino, format!("{}{}", src.key, &n.key[new_key.len()..]), old_identity)
                        })
                        .collect()
                };
                for (ino, old_key, old_identity) in below {
                    // (A pending one has no object to learn from yet.)
                    if !self.pending_here(ino).await {
                        self.learn_moved(ino, &old_key, &old_identity, true).await;
                    }
                }
            }
            Kind::Symlink => {}
        }
        Ok(())
    }

    /// A store without ETags names a version by its size and mtime, and a rename keeps the
    /// mtime: a file moved over another of the same size and mtime (a `cp -p` copy, two
    /// files written in the same clock tick) would be served the replaced file's cached
    /// bytes at its new name. What the caches hold under those names goes, before the
    /// table shows the move. (Readers of the replaced file that pass through its cached
    /// file keep reading it.)
    async fn forget_named_alike(&self, alike: Vec<(String, String, u64)>) {
        if alike.is_empty() {
            return;
        }
        let cache = self.read_cache.clone();
        crate::sync::blocking(move || {
            for (key, identity, size) in alike {
                cache.forget(&key, &identity, size);
            }
        })
        .await;
    }

    /// What a rename of `src` to `newname` in the directory keyed `dir_key` changes: the
    /// source (a directory's every key), and the target under any kind it may have.
    fn rename_scopes(&self, src: &crate::inode::Node, dir_key: &str, newname: &str) -> Vec<crate::intents::Scope> {
        use crate::intents::Scope;
        let of = |key: String, kind: Kind| match kind {
            Kind::Dir => Scope::Below(key),
            _ => Scope::Key(key),
        };
        let mut scopes = vec![of(src.key.clone(), src.kind)];
        for kind in [Kind::File, Kind::Symlink, Kind::Dir] {
            let key = crate::inode::key_for(dir_key, newname, kind);
            if !scopes.iter().any(|s| matches!(s, Scope::Key(k) | Scope::Below(k) if *k == key)) {
                scopes.push(of(key, kind));
            }
        }
        scopes
    }

    /// The identity of a file just moved (HEAD of its new key), for the node and for the
    /// readers of handles open on it (the bytes are the same), and for its whole-object
    /// cache file (from `old_key` and `old_identity`: passthrough readers keep it, new opens
    /// find it), unless the rename uploaded other bytes than that version's (`same_bytes`
    /// false: a staged file changed since its upload, by the kernel writing it directly).
    /// A failure leaves the node to be revalidated at its next open.
    async fn learn_moved(&self, ino: u64, old_key: &str, old_identity: &str, same_bytes: bool) {
        let Ok(node) = self.node(ino) else { return };
        // An answer overtaken by a change beside it (a create in the directory meanwhile)
        // is not recorded: ask again, a few times.
        let mut learned = Ok(None);
        for _ in 0..3 {
            let Ok(cur) = self.node(ino) else { return };
            if !cur.linked {
                break;
            }
            learned = self.revalidate_recorded(&cur, false).await.map(|(_, recorded)| recorded);
            if !matches!(learned, Ok(Some(false))) {
                break;
            }
        }
        if !matches!(learned, Ok(Some(true))) {
            // The identity stays unknown (to be asked at the next open), never the old one:
            // a listing that shows the copy's must not take it for another client's file.
            // Only over the version it had: one learned meanwhile (an upload done, an
            // event) stands, and a staged file's upload will set its own.
            let mut t = self.table.lock().unwrap();
            if let Some(n) = t.get_mut(ino).filter(|n| n.linked && !n.local && n.version == node.version) {
                n.version = Version::Unknown;
                // Its listing entry too: it still named the source's tag, and a lookup
                // served from it put that back on the node (reads of the copy pinned to
                // the old object's tag).
                t.relist(ino);
            }
            drop(t);
            match learned {
                Err(e) => tracing::debug!(key = %node.key, "identity after rename unknown: {e}"),
                _ => tracing::debug!(key = %node.key, "identity after rename unknown: not recorded"),
            }
            return;
        }
        // The listing too: a lookup served from it would bring the old identity back.
        self.table.lock().unwrap().relist(ino);
        let Ok(now) = self.node(ino) else { return };
        if let Some(disk) = self.read_cache.disk().filter(|_| same_bytes) {
            disk.rekey_whole(old_key, old_identity, &now.key, &now.identity());
        }
        let fresh = self.reader_for(&now);
        self.replace_readers(ino, &fresh);
    }

    /// A reader of `node` (a file this mount renamed, its copy's identity not learned yet)
    /// that needs no store, if it has one: while the move is not done, the version the move
    /// carries, where the disk cache holds all of it under the old name. Its open then waits
    /// neither for the move nor for a HEAD of the copy: with the store hanging, that was
    /// minutes (the move's attempts), then `ETIMEDOUT`, for bytes on local disk.
    pub(crate) fn reader_of_pending_move(&self, node: &crate::inode::Node) -> Option<Arc<crate::read::FileReader>> {
        if node.version != Version::Unknown {
            return None; // the copy's version is known: the move is done
        }
        let moved = self.deletes.as_ref()?.moving_version(&node.key)?;
        let disk = self.read_cache.disk()?;
        if moved.size != node.size || !disk.is_complete(&moved.key, &moved.identity, moved.size) {
            return None;
        }
        tracing::debug!(key = %node.key, from = %moved.key, "opened from the cache before its move is done");
        Some(self.reader_of(moved.key, moved.tag, moved.identity, moved.size))
    }

    /// Whether `node` was moved here by a rename whose move is not sent yet (write-back):
    /// until it is, the name is this mount's own, and asking the store waits for the move.
    pub(crate) fn moved_here(&self, node: &crate::inode::Node) -> bool {
        node.version == Version::Unknown && self.deletes.as_ref().is_some_and(|d| d.move_pending(&node.key))
    }

    /// Staged files at or below `key` (just moved there) name their new keys in their
    /// sidecars, so a crash now recovers them under the new names (write-back), or sends an
    /// open file's again there, not under the old name (without).
    async fn rekey_staged_below(&self, key: &str) {
        let staged = self.staging.all();
        for (ino, s) in staged {
            let Ok(node) = self.node(ino) else { continue };
            if node.key == key || node.key.starts_with(key) && key.ends_with('/') {
                self.staging.queue.set_key(ino, &node.key); // what `bucketfs status` names
                let mut st = s.lock().await;
                // A failed check keeps what is known. Clean ones too: a file the kernel writes
                // keeps its sidecar naming the key.
                let _ = self.observe(ino, &mut st);
                if !st.unlinked && st.key().is_some_and(|k| k != node.key) {
                    name_staged(&mut st, &node.key);
                }
            }
        }
    }

    /// `winner` took the name of staged `loser`: make recovery prefer it should the mount
    /// die before `loser` is dropped.
    async fn outrank_staged(&self, winner: u64, loser: u64) {
        let (Some(w), Some(l)) = (self.staging.get(winner), self.staging.get(loser)) else { return };
        let Some(at) = l.lock().await.key_written() else { return };
        w.lock().await.key_written_after(at);
    }

    /// The target's staged file (`replaced`) once the source's bytes hold its name: never
    /// uploaded over them, by a close or by crash recovery, even if a later step of the
    /// rename fails (until then a failed move keeps it: a writer's unsaved bytes).
    async fn discard_replaced(&self, replaced: Option<u64>) {
        if let Some(dst) = replaced {
            self.discard_staged(dst).await;
        }
    }

    /// A write-back file whose bytes are not in the bucket yet.
    async fn pending_here(&self, ino: u64) -> bool {
        match self.staging.get(ino) {
            Some(s) if self.write_back() => {
                let mut st = s.lock().await;
                let _ = self.observe(ino, &mut st); // a failed check keeps what is known
                st.dirty && !st.unlinked
            }
            _ => false,
        }
    }

    /// `replaced`: the target's staged file, if write-back keeps it until the move is done.
    /// `Some(false)` if it uploaded the staged file's bytes (changed since the version the
    /// node knew), `Some(true)` if the object moved as it was, `None` if it moves in the
    /// background ([`Fs::defer_move`]).
    async fn move_file(
        &self,
        src: &crate::inode::Node,
        new_key: &str,
        replaced: Option<u64>,
    ) -> Result<Option<bool>, FsError> {
        if let Some(staged) = self.staging.get(src.ino) {
            let mut st = staged.lock().await;
            self.observe(src.ino, &mut st)?;
            if st.dirty && !st.unlinked && self.write_back() {
                // Not uploaded yet: it goes up under the new name (its queue entry follows
                // the inode); an older object under the old name goes now. Unless a writer
                // is still changing it: then that object is the last closed version, the
                // one a crash must leave, and it moves with the name.
                // A move's journal entry lives until the sidecar names the new key, below.
                let mut journal = None;
                if st.in_store && !st.committed() {
                    // Journaled and sent in the background where it can be (a log renamed
                    // while its writer appends: logrotate), else moved now.
                    if !self.defer_object_move(&src.key, new_key, replaced, None).await? {
                        journal = Some(self.move_object(src, new_key, replaced).await?);
                    }
                    if st.maybe_landed {
                        // An upload this rename cancelled may land after the move's delete.
                        self.delete_removed(&src.key, st.landing()).await?;
                        st.landing_settled();
                    }
                } else if st.may_be_stored() {
                    // Journaled and sent in the background: no wait on the store (issue 48).
                    match self.delete_removed(&src.key, st.landing()).await {
                        Err(FsError::Store(e)) if e.kind != StoreErrorKind::NotFound => return Err(e.into()),
                        Err(e @ (FsError::Local(_) | FsError::NoSpace(_) | FsError::TooManyFiles(_))) => return Err(e),
                        _ => {
                            (st.in_store, st.replaces) = (false, false);
                            st.landing_settled();
                        }
                    }
                }
                // A rename replaces its target. The new key is named first: a crash between
                // the two leaves a create-only upload to the new name (refused if it is
                // taken, the bytes kept for the user), never a plain one to the old name.
                let named = st.set_key(new_key);
                st.set_create_only(false);
                drop(journal);
                return named.map(|()| Some(false));
            }
            if st.dirty && !st.unlinked && st.in_store && self.store.capabilities().moves {
                // Changed since its upload: the new bytes go up under the old name, then the
                // object moves, keeping its identity (a failure midway loses nothing).
                st.upload(self.store.as_ref(), &src.key, &self.cfg.write, &self.attrs_to_keep(src)).await?;
                drop(st);
                self.store.rename(&src.key, new_key).await?;
                self.discard_replaced(replaced).await;
                return Ok(Some(false));
            }
            if st.dirty && !st.unlinked {
                // Not in the bucket yet (or changed): upload straight to the new name, which
                // a rename replaces (an O_EXCL create was about the old name).
                // The old key holds another writer's object if ours never went up there.
                let old = (st.in_store || st.maybe_landed).then(|| st.landing());
                st.upload_replacing(self.store.as_ref(), new_key, &self.cfg.write, &self.attrs_to_keep(src)).await?;
                self.discard_replaced(replaced).await;
                if st.key() == Some(src.key.as_str()) {
                    // Still named (the kernel writes it): recovery must not bring the old name back.
                    name_staged(&mut st, new_key);
                }
                drop(st);
                let Some(old) = old else { return Ok(Some(false)) };
                match self.delete_removed(&src.key, old).await {
                    Err(FsError::Store(e)) if e.kind != StoreErrorKind::NotFound => return Err(e.into()),
                    Err(e @ (FsError::Local(_) | FsError::NoSpace(_) | FsError::TooManyFiles(_))) => return Err(e),
                    _ => return Ok(Some(false)),
                }
            }
        }
        let deferred = self.defer_move(src, new_key, replaced).await?;
        let journal = match deferred {
            true => None,
            false => Some(self.move_object(src, new_key, replaced).await?),
        };
        if let Some(staged) = self.staging.get(src.ino) {
            // Its sidecar may still name the old key (a file the kernel writes keeps it
            // named): renamed before the journal entry goes, so recovery never uploads it there.
            let mut st = staged.lock().await;
            if !st.unlinked && st.key() == Some(src.key.as_str()) {
                name_staged(&mut st, new_key);
            }
        }
        drop(journal);
        Ok((!deferred).then_some(true))
    }

    /// In write-back mode, journal the move of `src`'s object to `new_key` and leave it to
    /// the background (deletes.rs), so the rename waits for no store. Only for a file no
    /// handle has open (a reader's handle reads the moved object at once) and with no
    /// staged file (its sidecar names a key, and it keeps the node's version) on a store
    /// that moves by copy and delete; `false` where the caller moves it now.
    async fn defer_move(
        &self,
        src: &crate::inode::Node,
        new_key: &str,
        replaced: Option<u64>,
    ) -> Result<bool, FsError> {
        if self.node(src.ino)?.opens > 0 || self.staging.contains(src.ino) {
            return Ok(false);
        }
        // The version it moves, for an open of the new name before the move is done: as the
        // caches hold it under the old name, or (moved here earlier, that move not sent
        // yet) as that move carries it.
        let carries = match &src.version {
            Version::Unknown => self.deletes.as_ref().and_then(|d| d.moving_version(&src.key)),
            v => Some(crate::deletes::MovedVersion {
                key: src.key.clone(),
                identity: src.identity(),
                tag: v.tag().map(str::to_owned),
                size: src.size,
            }),
        };
        self.defer_object_move(&src.key, new_key, replaced, carries).await
    }

    /// What a rename's target held, as far as the mount knows: nothing (no file had the
    /// name), or the version of a file in the bucket that no staged file of ours may
    /// replace meanwhile. `replaced`: the target's inode. (See `DeferredDeletes::send_move`.)
    fn held_by(&self, replaced: Option<u64>) -> Option<crate::deletes::Held> {
        use crate::deletes::Held;
        let Some(ino) = replaced else { return Some(Held::Nothing) };
        if self.staging.contains(ino) {
            return None; // ours, maybe uploading or cut off: anything may be there
        }
        let node = self.node(ino).ok()?;
        node.version.tag().map(|tag| Held::Version(tag.to_string()))
    }

    /// Journal the move of object `from` to `to` for the background, on a write-back mount
    /// of a store that moves by copy and delete; `false` where the caller moves it now.
    /// `replaced`: the target's staged file, whose bytes the move replaces: they must not be
    /// recovered over the copy should the mount die before they are discarded.
    async fn defer_object_move(
        &self,
        from: &str,
        to: &str,
        replaced: Option<u64>,
        carries: Option<crate::deletes::MovedVersion>,
    ) -> Result<bool, FsError> {
        let Some(d) = self.deletes.as_ref().filter(|_| self.write_back() && !self.store.capabilities().moves) else {
            return Ok(false);
        };
        // The target's staged file is held first: between the move's journal entry and its
        // key's removal a crash would recover both, its bytes over the moved file; waiting
        // for its lock there (an upload of it in flight) made that window seconds long.
        let dst = replaced.and_then(|d| self.staging.get(d));
        let mut held = match &dst {
            Some(s) => Some(s.lock().await),
            None => None,
        };
        if !d.defer_move(from, to, carries, self.held_by(replaced)).await? {
            return Ok(false);
        }
        if let Some(st) = held.as_mut() {
            st.drop_key();
        }
        Ok(true)
    }

    /// Move one object: in one request where the store moves (Drive), else copy, then
    /// delete. `replaced`: the target's staged file (see [`Fs::move_file`]), whose key
    /// sidecar goes once the copy holds the name.
    /// Returns the move's journal entry: the caller drops it once the file's staged
    /// sidecar names the new key (until then a crash is finished by the next mount, which
    /// reads a staged file still named `from` as named `to`: moves.rs).
    async fn move_object(
        &self,
        src: &crate::inode::Node,
        to: &str,
        replaced: Option<u64>,
    ) -> Result<crate::moves::Entry, FsError> {
        let from = src.key.as_str();
        if self.store.capabilities().moves {
            self.store.rename(from, to).await?;
            self.discard_replaced(replaced).await;
            return Ok(crate::moves::Entry::none());
        }
        // A crash before the target's sidecar goes (below) must not recover its bytes over
        // the copy: the entry names that staged file, for the replay to drop.
        let target = match replaced.and_then(|d| self.staging.get(d)) {
            Some(dst) => Some(dst.lock().await.data_path().to_path_buf()),
            None => None,
        };
        let journal = crate::moves::Entry::begin_replacing(
            &self.cfg.staging_dir,
            from,
            to,
            &[from.to_string()],
            target.as_deref(),
        );
        // The version known here (else asked for): the source goes only while it holds the
        // version copied, so another client's write to it meanwhile is moved too, or stays
        // under the old name (moves::settle). A stale one costs a copy more.
        let seen = match src.version.tag() {
            Some(tag) => {
                bucketfs_store::ObjectMeta { key: from.to_string(), etag: Some(tag.to_string()), ..Default::default() }
            }
            None => self.store.stat(from).await?,
        };
        self.copy_then_delete(from, to, replaced, &seen).await?;
        Ok(journal)
    }

    async fn copy_then_delete(
        &self,
        from: &str,
        to: &str,
        replaced: Option<u64>,
        seen: &bucketfs_store::ObjectMeta,
    ) -> Result<(), FsError> {
        let copied = match self.store.copy(from, to).await {
            Err(e) if e.kind == StoreErrorKind::Changed => false, // copied again by `settle`
            r => r.map(|()| true)?,
        };
        match crate::moves::settle(self.store.as_ref(), from, to, Some(seen), copied).await {
            Ok(_) => {}
            Err(e) if e.kind == StoreErrorKind::NotFound => {}
            Err(e) if copied && self.write_back() && self.deletes.is_some() => {
                // The copy holds the name: the source's delete is journaled and retried in
                // the background, as an unlink's. (Failing the rename here left the copy
                // over the target, which the target's staged bytes then replaced: the
                // source lost if its delete landed after all.) Only of the bytes copied
                // where their MD5 is known (an S3 ETag): another client's version stays.
                tracing::info!(%from, "the source's delete failed ({e}); sent in the background");
                let landing =
                    seen.etag_md5().map_or(crate::write::Landing::Stored, |m| crate::write::Landing::IfMd5(vec![m]));
                self.delete_removed(from, landing).await?;
            }
            Err(e) => {
                if copied {
                    // The copy holds the name, whatever the rename answers: the target's
                    // staged bytes must not go up over it (the source lost if its delete
                    // landed after all).
                    self.discard_replaced(replaced).await;
                }
                return Err(e.into());
            }
        }
        if let Some(dst) = replaced.and_then(|d| self.staging.get(d)) {
            // The move is done: the target's staged bytes must never be recovered over it.
            // (A crash between the copy and here: the move's journal entry names them, and
            // its replay drops them.)
            dst.lock().await.drop_key();
        }
        Ok(())
    }
}

#[path = "fs_rename_dir.rs"]
mod dir;
