//! Lookups: what a name in a directory is, and a file's attributes past the TTL, each from
//! the cheapest source (a fresh listing, a new listing of a small directory, else one probe
//! of the name or a HEAD; see the module doc of `fs`).

use bucketfs_store::{HeadOpts, ObjectHead, ObjectMeta, StoreErrorKind, StoreExt};
use futures::StreamExt;

use crate::fs::{Attr, Fs, Kind, RELIST_MAX};
use crate::inode::{ChildMeta, Node, Version};
use crate::{names, FsError};

impl Fs {
    /// Look `name` up in `parent`; the kernel holds one more reference on success.
    pub async fn lookup(&self, parent: u64, name: &str) -> Result<Attr, FsError> {
        if let Some(answer) = self.lookup_now(parent, name) {
            return answer;
        }
        let dir = self.node(parent)?;
        let since = self.table.lock().unwrap().change_seq();
        let mut found = self.find_child(&dir, name).await?;
        if self.table.lock().unwrap().changed_at(parent) > since {
            // The directory changed here while the store was asked (an upload, a create, an
            // unlink): the answer may predate that change, so ask again (a listing this
            // mount keeps current usually answers with no request).
            found = self.find_child(&dir, name).await?;
        }
        let meta = found.ok_or(FsError::NotFound)?;
        let mut t = self.table.lock().unwrap();
        let ino = t.upsert(parent, &meta);
        t.remember(ino);
        Ok(self.attr(t.get(ino).expect("just inserted")))
    }

    /// [`Fs::lookup`] where no request is needed (a bad name, a file staged here, a name a
    /// fresh listing answers), at once: the adapter replies on the thread that got the
    /// request. `None`: the store must be asked (run [`Fs::lookup`]).
    pub fn lookup_now(&self, parent: u64, name: &str) -> Option<Result<Attr, FsError>> {
        if let Err(e) = names::check_lookup_name(name) {
            return Some(Err(e));
        }
        let dir = match self.node(parent) {
            Ok(dir) => dir,
            Err(e) => return Some(Err(e)),
        };
        if dir.kind != Kind::Dir {
            return Some(Err(FsError::NotDir));
        }
        // A key the store cannot hold (S3, GCS: 1,024 bytes) cannot exist: ENAMETOOLONG, and
        // a create or mkdir of it fails so before any request (the kernel looks up first).
        if self.store.capabilities().max_key_len.is_some_and(|max| dir.key.len() + name.len() > max) {
            return Some(Err(FsError::NameTooLong));
        }
        {
            // Created or written here and maybe not uploaded yet: the local state is the truth.
            let mut t = self.table.lock().unwrap();
            // So is a name moved here whose move is not sent yet (write-back): probing the
            // store for it waits for that move (with the store hanging, an append to a file
            // just renamed failed with ETIMEDOUT at its lookup; tester U).
            let own = |n: &&crate::inode::Node| self.staging.owns(n.ino) || self.moved_here(n);
            if let Some(ino) = t.child(parent, name).filter(own).map(|n| n.ino) {
                t.remember(ino);
                return Some(Ok(self.attr(t.get(ino).expect("indexed"))));
            }
        }
        let Some(listed) = self.listed_child(parent, name) else {
            // No fresh listing: a node the store confirmed within the TTL (a probe, a
            // listing since dropped, an event) answers, as `getattr` does. (With events the
            // kernel keeps its entries 1 s at most and looks the name up again each time.)
            // Not one confirmed before its directory was last asked about (the directory was
            // expired: what is below it is not vouched for either).
            let mut t = self.table.lock().unwrap();
            let ino = t
                .child(parent, name)
                .filter(|n| self.fresh(n.validated) && n.validated >= dir.validated && n.version != Version::Unknown)
                .map(|n| n.ino)?;
            t.remember(ino);
            return Some(Ok(self.attr(t.get(ino).expect("indexed"))));
        };
        let Some(meta) = listed else { return Some(Err(FsError::NotFound)) };
        let mut t = self.table.lock().unwrap();
        let ino = t.upsert(parent, &meta);
        t.remember(ino);
        Some(Ok(self.attr(t.get(ino).expect("just inserted"))))
    }

    /// `name` in directory `dir` as the store has it (`None`: absent), from the cheapest
    /// source: a fresh listing (no request); else, for a small directory listed before, a
    /// new listing of it (one LIST answers this name and every other lookup and `stat` in
    /// the directory for the TTL); else a probe of the name.
    pub(crate) async fn find_child(&self, dir: &Node, name: &str) -> Result<Option<ChildMeta>, FsError> {
        if let Some(answer) = self.listed_child(dir.ino, name) {
            return Ok(answer);
        }
        if self.relist_worthwhile(dir.ino) {
            self.ensure_listing(dir, false).await?;
            // Installed stale (the directory changed here meanwhile): the probe decides.
            if let Some(answer) = self.listed_child(dir.ino, name) {
                return Ok(answer);
            }
        } else if self.list_for_lookups(dir.ino, name) {
            match self.list_if_small(dir).await {
                Ok(()) => {
                    if let Some(answer) = self.listed_child(dir.ino, name) {
                        return Ok(answer);
                    }
                }
                Err(e) => {
                    tracing::debug!(dir = %dir.key, "listing for lookups failed, probing: {e}");
                    self.table.lock().unwrap().forget_missed(dir.ino);
                }
            }
        }
        let ttl = self.cfg.metadata_ttl;
        let mut check_width = false;
        let (since, wide) = {
            let mut t = self.table.lock().unwrap();
            if t.known_absent(dir.ino, name, ttl) {
                return Ok(None);
            }
            if self.store.capabilities().prefix_list_reads_dir && t.width_worth_checking(dir.ino, name, ttl) {
                t.note_width_checked(dir.ino);
                check_width = true;
            }
            (t.ask(), t.is_wide(dir.ino))
        };
        let wide = wide || check_width && self.check_width(dir).await;
        let probed = match self.known_child(dir.ino, name) {
            // A name the mount knows answers if the probe takes long (`Fs::refresh_within`).
            Some(_) => {
                let (key, name) = (dir.key.clone(), name.to_string());
                self.refresh_within(true, |me| async move { me.probe(&key, &name, wide).await }).await
            }
            None => self.probe(&dir.key, name, wide).await,
        };
        match probed {
            Ok(m) => {
                self.table.lock().unwrap().note_found(dir.ino, name);
                Ok(Some(ChildMeta { asked: since, ..m }))
            }
            Err(FsError::NotFound) => {
                self.table.lock().unwrap().note_absent(dir.ino, name, since);
                Ok(None)
            }
            // Stale if the store is down: what this mount last knew of the name answers.
            Err(FsError::Store(e)) if e.kind == StoreErrorKind::Unavailable => {
                let Some(answer) = self.known_child(dir.ino, name) else { return Err(FsError::Store(e)) };
                tracing::warn!(dir = %dir.key, name, "store unreachable, answering from what the mount knows: {e}");
                Ok(answer)
            }
            Err(e) => Err(e),
        }
    }

    /// What the mount knows of `name` in `dir`, fresh or not: its last listing's word, else
    /// the inode it has for the name; `None`: nothing.
    /// A listing overtaken by a change here (not merged with it) yields to the node, or to
    /// the name's removal here.
    fn known_child(&self, dir: u64, name: &str) -> Option<Option<ChildMeta>> {
        let t = self.table.lock().unwrap();
        let node = t.child(dir, name).map(|n| n.entry());
        match t.listing(dir) {
            Some(l) if l.overtaken && node.is_some() => Some(node),
            Some(l) if l.overtaken && t.removed_here(dir, name) => Some(None),
            Some(l) => Some(l.children.get(name).cloned()),
            None => node.map(Some),
        }
    }

    /// What `dir`'s fresh listing says of `name`; `None` without a fresh listing.
    fn listed_child(&self, dir: u64, name: &str) -> Option<Option<ChildMeta>> {
        let t = self.table.lock().unwrap();
        t.listing(dir).filter(|l| t.trusted(l)).map(|l| l.children.get(name).cloned())
    }

    /// Whether listing `dir` again beats asking about one name: it was listed before and
    /// held one page at most. (With a TTL of 0 no listing is ever fresh: never.)
    /// Not while its last listing was overtaken by a change here less than a TTL ago (a
    /// directory being written to): a new one may well be overtaken again, and a probe answers.
    fn relist_worthwhile(&self, dir: u64) -> bool {
        let ttl = self.cfg.metadata_ttl;
        let t = self.table.lock().unwrap();
        !ttl.is_zero()
            && t.listing(dir).is_some_and(|l| l.children.len() <= RELIST_MAX && !(l.overtaken && t.now() - l.at < ttl))
    }

    /// Whether to list `dir` (never listed, or forgotten) to answer a lookup of `name`: a
    /// probe found another name absent in it within the TTL, it is not known to be wide,
    /// and `name` itself is not known absent (the kernel's LOOKUP, then `create` asking
    /// again, is one name: a single new file costs no listing).
    fn list_for_lookups(&self, dir: u64, name: &str) -> bool {
        let ttl = self.cfg.metadata_ttl;
        let t = self.table.lock().unwrap();
        !ttl.is_zero()
            && t.listing(dir).is_none()
            && !t.known_absent(dir, name, ttl)
            && t.missed_another(dir, name, ttl)
    }

    /// A file's attributes once their TTL ran out: from a new listing of its directory when
    /// that is worthwhile (`git status` after the TTL costs one LIST per directory, not a
    /// HEAD per file), else from a HEAD. A version put by another client gets a new inode
    /// (`Node::replaced_by`); `node` then keeps its own attributes, unlinked.
    pub(crate) async fn refresh(&self, node: &Node) -> Result<Attr, FsError> {
        if node.linked && self.relist_worthwhile(node.parent) {
            if let Ok(dir) = self.node(node.parent) {
                self.ensure_listing(&dir, false).await?;
                if let Some(Some(m)) = self.listed_child(node.parent, &node.name) {
                    let mut t = self.table.lock().unwrap();
                    if m.kind == node.kind && t.child(node.parent, &node.name).is_some_and(|c| c.ino == node.ino) {
                        let ino = t.upsert(node.parent, &m);
                        let n = t.get(ino).expect("indexed");
                        tracing::debug!(ino, key = %n.key, identity = %n.identity(), "refreshed from the listing");
                        // Replaced by another client (a new inode): this one keeps its own.
                        return Ok(self.attr(t.get(node.ino).ok_or(FsError::NotFound)?));
                    }
                }
            }
        }
        self.revalidate_within(node).await
    }

    /// Ask the store whether `name` under `prefix` is a directory, a file, or nothing: on an
    /// object store one LIST of the plain prefix `prefix+name` (a HEAD more for a file whose
    /// mode and owner the store keeps), else [`Fs::probe_each`]. Also `probe_each` in a
    /// directory known `wide` on a store where that LIST reads the whole directory
    /// (`Capabilities::prefix_list_reads_dir`: MinIO, 133 ms against 7 ms per name among
    /// 100,000 keys): there its requests, all at once, cost less than the one.
    pub(crate) async fn probe(&self, prefix: &str, name: &str, wide: bool) -> Result<ChildMeta, FsError> {
        let file_key = format!("{prefix}{name}");
        let caps = self.store.capabilities();
        if caps.prefix_dirs && caps.addressable(&file_key) && !(wide && caps.prefix_list_reads_dir) {
            if let Some(found) = self.probe_by_list(&file_key, name).await? {
                return found.ok_or(FsError::NotFound);
            }
        }
        self.probe_each(prefix, name).await
    }

    /// `name` (key `file_key`) from one listing of the plain prefix `file_key`. The listing
    /// has two sorted groups, objects and common prefixes (`d/`), each page in key order but
    /// its groups in either order (S3 and GCS send a page's prefixes first): so everything
    /// that decides (`k`, `k.rclonelink`, `k/`) has come once an object and a prefix past
    /// `k/` have both come (`logs/` alone says nothing about the file `log`), or the listing
    /// ended. `None` if the store's answer did not settle it.
    async fn probe_by_list(&self, file_key: &str, name: &str) -> Result<Option<Option<ChildMeta>>, FsError> {
        let dir_key = format!("{file_key}/");
        let link_key = format!("{file_key}{}", crate::links::LINK_SUFFIX);
        let (mut file, mut link, mut dir) = (None, None, false);
        // Read until an object and a prefix past `k/` came (or the end): the rest cannot decide.
        let (mut object_past, mut prefix_past) = (false, false);
        let mut stream = self.store.list(file_key, false);
        while let Some(m) = stream.next().await {
            let m = m?;
            if !m.key.starts_with(file_key) {
                return Ok(None); // not a prefix listing after all: ask the old way
            }
            if m.key.starts_with(&dir_key) {
                dir = true;
            }
            if m.key.as_str() > dir_key.as_str() {
                match m.is_prefix() {
                    true => prefix_past = true,
                    false => object_past = true,
                }
            }
            if m.key == file_key && !is_link_object(name) {
                file = Some(m);
            } else if m.key == link_key && crate::links::may_be_link(name) {
                link = Some(m);
            }
            if object_past && prefix_past {
                break;
            }
        }
        drop(stream);
        if dir {
            return Ok(Some(Some(self.child_meta(
                name,
                &ObjectMeta { key: dir_key, size: 0, etag: None, mtime: None, size_unknown: false },
                Kind::Dir,
            ))));
        }
        if let Some(m) = file {
            if !self.store.capabilities().keeps_attrs {
                return Ok(Some(Some(self.child_meta(name, &m, Kind::File))));
            }
            // The mode, owner and mtime the object carries come only with a HEAD.
            return match self.store.head(file_key, HeadOpts::default()).await {
                Ok(ObjectHead { meta: m, attrs, .. }) if !m.is_prefix() => {
                    Ok(Some(Some(ChildMeta { attrs: Some(attrs), ..self.child_meta(name, &m, Kind::File) })))
                }
                Ok(_) => Ok(None),
                Err(e) if e.kind == StoreErrorKind::NotFound => Ok(None), // deleted meanwhile: ask again
                Err(e) => Err(e.into()),
            };
        }
        Ok(Some(link.map(|m| self.child_meta(name, &m, Kind::Symlink))))
    }

    /// [`Fs::probe`] by asking about each key at once (HEAD `k`, HEAD `k/`, LIST `k/`, HEAD
    /// the link): for stores without prefix listings, or when one did not settle it.
    async fn probe_each(&self, prefix: &str, name: &str) -> Result<ChildMeta, FsError> {
        let file_key = format!("{prefix}{name}");
        let dir_key = format!("{file_key}/");
        let caps = self.store.capabilities();
        // Keys the store would change on the way (see `Capabilities::addressable`) are not
        // asked for: their answer would be another object's.
        let prefix_dirs = caps.prefix_dirs && caps.addressable(&dir_key);
        let file_ok = caps.addressable(&file_key) && !is_link_object(name);
        let link_key = format!("{file_key}{}", crate::links::LINK_SUFFIX);
        let link_ok = crate::links::may_be_link(name) && caps.addressable(&link_key);
        let first_child = async {
            if !prefix_dirs {
                return None;
            }
            self.store.list(&dir_key, false).next().await
        };
        let marker = async {
            if !prefix_dirs {
                return Err(bucketfs_store::StoreError::not_found(""));
            }
            self.store.stat(&dir_key).await
        };
        let link = async {
            if !link_ok {
                return Err(bucketfs_store::StoreError::not_found(""));
            }
            self.store.stat(&link_key).await
        };
        let file = async {
            match file_ok {
                true => self.store.head(&file_key, HeadOpts::default()).await,
                false => Err(bucketfs_store::StoreError::not_found("")),
            }
        };
        let (file, child, marker, link) = tokio::join!(file, first_child, marker, link);
        // A file found beside a directory that could not be asked about may be shadowed by it
        // (a directory wins): an error, as the LIST of `probe_by_list` failing is.
        let unsettled = |e: &bucketfs_store::StoreError| file.is_ok() && e.kind != StoreErrorKind::NotFound;
        let child = match child {
            Some(Err(e)) if unsettled(&e) => return Err(e.into()),
            c => c,
        };
        let marker = match marker {
            Err(e) if unsettled(&e) => return Err(e.into()),
            m => m,
        };
        let dir_meta = ObjectMeta { key: dir_key, size: 0, etag: None, mtime: None, size_unknown: false };
        if matches!(child, Some(Ok(_))) || marker.is_ok() {
            let mtime = marker.as_ref().ok().and_then(|m| m.mtime);
            return Ok(self.child_meta(name, &ObjectMeta { mtime, ..dir_meta }, Kind::Dir));
        }
        match file {
            Ok(ObjectHead { meta: m, .. }) if m.is_prefix() => Ok(self.child_meta(name, &m, Kind::Dir)),
            Ok(ObjectHead { meta: m, attrs, .. }) => {
                Ok(ChildMeta { attrs: Some(attrs), ..self.child_meta(name, &m, Kind::File) })
            }
            Err(e) if e.kind == StoreErrorKind::NotFound => match (child, link) {
                (Some(Err(e)), _) if e.kind != StoreErrorKind::NotFound => Err(e.into()),
                (_, Ok(m)) => Ok(self.child_meta(name, &m, Kind::Symlink)),
                (_, Err(e)) if e.kind != StoreErrorKind::NotFound => Err(e.into()),
                // A marker that could not be asked about may be an empty directory: not
                // "no such name" (which the kernel would cache for the TTL).
                _ => match marker {
                    Err(e) if e.kind != StoreErrorKind::NotFound => Err(e.into()),
                    _ => Err(FsError::NotFound),
                },
            },
            Err(e) => Err(e.into()),
        }
    }
}

/// Whether a file named `name` would be the object of the link `x` for `name` =
/// `x.rclonelink` (links.rs): such a name is never a file here (a listing shows the link
/// `x`; a create of it is refused), so a probe never answers it with that object.
fn is_link_object(name: &str) -> bool {
    crate::links::link_name(name).is_some()
}
