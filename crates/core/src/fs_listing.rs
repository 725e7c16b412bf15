//! How the mount learns what the store holds: a directory's listing (one delimited LIST
//! sequence, kept for the TTL and current with this mount's own changes; see the module doc
//! of `fs`) and a file's HEAD, with what each answers while the store is unreachable.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use bucketfs_store::{HeadOpts, ObjectHead, StoreError, StoreErrorKind};
use futures::StreamExt;

use crate::fs::{Attr, Fs, Kind, RELIST_MAX};
use crate::inode::{ChildMeta, Listing, Node};
use crate::sync::{Arc, AtomicBool, AtomicU64, Ordering};
use crate::{names, FsError};

/// One refresh's share of [`Fs::overdue_refreshes`], shared by its caller and its task:
/// counted from when the caller gives up on it ([`Overdue::give_up`]) until the last of the
/// two lets go of it, which is when the work ends, panics or is cancelled.
struct Overdue {
    count: Arc<AtomicU64>,
    given_up: AtomicBool,
}

impl Overdue {
    fn give_up(&self) {
        self.count.fetch_add(1, Ordering::AcqRel);
        self.given_up.store(true, Ordering::Release);
    }
}

impl Drop for Overdue {
    fn drop(&mut self) {
        if self.given_up.load(Ordering::Acquire) {
            self.count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// One directory's listing lock: one listing of it runs at a time (a walk and the listing
/// ahead often ask for the same one together), and `done` counts the listings that ended
/// under it, however they ended, so a caller queued behind one can tell it was answered
/// meanwhile (see `Fs::list_dir`).
#[derive(Default)]
pub(crate) struct Flight {
    pub(crate) lock: tokio::sync::Mutex<()>,
    done: AtomicU64,
}

/// What [`Fs::list_dir`] was asked for over: the directory's [`Flight::done`] then, and
/// when the listing it had then (past its TTL) was fetched.
#[derive(Clone, Copy)]
struct Asked {
    done: u64,
    at: Option<std::time::Instant>,
}

/// Counts a listing in [`Flight::done`] as it ends, however it ends.
struct Done<'a>(&'a AtomicU64);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// How long a call of a write-back mount waits for the store to refresh what the mount
/// already knows (a listing or a file's attributes past their TTL, a known name's probe)
/// before it answers with what it knows, as when the store is unreachable: such a mount is
/// its bucket's main writer, and a store that hangs must not stall `ls` or `stat` for the
/// minutes its requests take to time out (docs/SEMANTICS.md, "Freshness").
pub(crate) const KNOWN_ANSWER_WAIT: Duration = Duration::from_secs(2);

impl Fs {
    /// `work` (a refresh of something the mount knows), run on a write-back mount in a task
    /// of its own and waited for at most [`KNOWN_ANSWER_WAIT`]: past it the task goes on in
    /// the background (a listing or a HEAD is recorded when it comes, by the sequence rule)
    /// and the caller gets an `Unavailable` error, which it answers as an unreachable store.
    /// `one_request`: `work` is one small request (a HEAD, a probe, a listing that fit one
    /// page), so its being overdue shows the store hangs (a longer listing may page for
    /// long); while such a one is still out, the next callers do not wait at all (a path's
    /// every level would otherwise cost the wait again), and are not counted themselves.
    /// On other mounts `work` is awaited.
    pub(crate) async fn refresh_within<T, Fut>(
        &self,
        one_request: bool,
        work: impl FnOnce(Arc<Fs>) -> Fut,
    ) -> Result<T, FsError>
    where
        Fut: Future<Output = Result<T, FsError>> + Send + 'static,
        T: Send + 'static,
    {
        let me = self.me.upgrade().expect("an Fs lives in an Arc (Fs::new)");
        if self.cfg.write_back.is_none() {
            return work(me).await;
        }
        let overdue = self.overdue_refreshes.clone();
        let patience = match overdue.load(Ordering::Acquire) {
            0 => KNOWN_ANSWER_WAIT,
            _ => Duration::ZERO,
        };
        let settle = Arc::new(Overdue { count: overdue.clone(), given_up: AtomicBool::new(false) });
        let task = {
            let settle = settle.clone();
            let work = work(me);
            // `settle` drops when the work ends, panics or is cancelled.
            async move { (work.await, settle).0 }
        };
        if let Some(done) = crate::sync::within(patience, task).await {
            return done;
        }
        // Only one waited for counts: one given no wait would keep the count up for as long
        // as calls come (a walk), though the store answers again.
        if one_request && !patience.is_zero() {
            settle.give_up();
        }
        Err(FsError::Store(StoreError::new(
            StoreErrorKind::Unavailable,
            format!(
                "the store did not answer within {patience:?} (requests overdue: {})",
                overdue.load(Ordering::Acquire)
            ),
        )))
    }

    /// Whether `dir`'s last listing (kept current by this mount's own changes) answers for
    /// another TTL because the store cannot be reached (`e`), so lookups,
    /// creates and `ls` go on through an outage (docs/SEMANTICS.md, "Freshness").
    fn serve_stale_listing(&self, dir: &Node, e: &StoreError) -> bool {
        if e.kind != StoreErrorKind::Unavailable {
            return false;
        }
        let Some(age) = self.table.lock().unwrap().renew_listing(dir.ino, self.cfg.metadata_ttl) else { return false };
        tracing::warn!(dir = %dir.key, age_s = age.as_secs(), "store unreachable, serving the last listing: {e}");
        true
    }

    /// HEAD a file again and record what the store says now. `split`: a version another
    /// client put under the name gets a new inode (`Node::replaced_by`), and this one keeps
    /// its own attributes; else (this mount's own move, an open that already holds the
    /// inode) the node takes the new version.
    pub(crate) async fn revalidate(&self, node: &Node, split: bool) -> Result<Attr, FsError> {
        self.revalidate_recorded(node, split).await.map(|(attr, _)| attr)
    }

    /// [`Fs::revalidate`], and whether the store's answer was recorded on the node: `Some(true)`
    /// yes, `Some(false)` not because a change here overtook it (asking again may do),
    /// `None` not for another reason (unlinked, staged, the store unreachable).
    pub(crate) async fn revalidate_recorded(&self, node: &Node, split: bool) -> Result<(Attr, Option<bool>), FsError> {
        match self.head_and_record(node, split).await {
            Err(FsError::Store(e)) if e.kind == StoreErrorKind::Unavailable => self.serve_known_attrs(node, &e),
            done => done,
        }
    }

    /// [`Fs::revalidate`] (`split`) of a file whose attributes ran past the TTL (`getattr`,
    /// `open`), within [`Fs::refresh_within`]. Callers that must have the store's word (a
    /// rename learning the copy's identity, a fill pinned to the version) wait for it.
    pub(crate) async fn revalidate_within(&self, node: &Node) -> Result<Attr, FsError> {
        self.revalidate_within_as(node, true).await
    }

    /// [`Fs::revalidate_within`], splitting a replaced file off (`split`) or not.
    pub(crate) async fn revalidate_within_as(&self, node: &Node, split: bool) -> Result<Attr, FsError> {
        let n = node.clone();
        let answer = match self.refresh_within(true, |me| async move { me.head_and_record(&n, split).await }).await {
            Err(FsError::Store(e)) if e.kind == StoreErrorKind::Unavailable => self.serve_known_attrs(node, &e),
            done => done,
        };
        answer.map(|(attr, _)| attr)
    }

    /// What the mount knows of `node`'s attributes, for another TTL, because the store
    /// cannot be reached or did not answer in time (`e`).
    fn serve_known_attrs(&self, node: &Node, e: &StoreError) -> Result<(Attr, Option<bool>), FsError> {
        let mut t = self.table.lock().unwrap();
        let cur = t.get_mut(node.ino).ok_or(FsError::Store(e.clone()))?;
        tracing::warn!(key = %node.key, "store unreachable, serving the last attributes: {e}");
        // Marked checked now, so served for another TTL. With store events flowing that
        // makes them vouch for it, though they began after its last HEAD (a known gap:
        // the alternative, a HEAD at every access through the outage, is worse).
        cur.validated = self.cfg.clock.now();
        Ok((self.attr(cur), None))
    }

    /// The HEAD of [`Fs::revalidate_recorded`], and its answer recorded.
    async fn head_and_record(&self, node: &Node, split: bool) -> Result<(Attr, Option<bool>), FsError> {
        if let Some(gone) = self.table.lock().unwrap().get(node.ino).filter(|n| !n.linked) {
            // Unlinked or replaced while open: its key names another file now, if any.
            return Ok((self.attr(gone), None));
        }
        let since = self.table.lock().unwrap().ask();
        let head = self.store.head(&node.key, HeadOpts::default()).await;
        // Checked and recorded under one lock: an upload finishing between the two would
        // otherwise be overwritten by this older answer.
        let mut t = self.table.lock().unwrap();
        {
            // An upload, create, unlink or rename here since the HEAD was sent or while it
            // ran (each notes a change in the parent; a rename from before it changes the
            // store): the answer may predate it or describe another file now under the key,
            // and must not put the node back on an older version, give it another file's
            // size (or unlink a file just made). What the mount holds answers.
            let overtaken =
                |n: &Node| t.changed_at(n.parent) > since || !n.linked || n.key != node.key || t.moving_key(&n.key);
            if let Some(cur) = t.get(node.ino).filter(|n| overtaken(n)) {
                tracing::debug!(ino = cur.ino, key = %cur.key, identity = %cur.identity(), "revalidation raced a change here");
                return Ok((self.attr(cur), Some(false)));
            }
            if let Some(cur) = t.get_mut(node.ino).filter(|n| n.holds_newer_than(since)) {
                // A request sent after this one was answered first: the node holds newer news.
                // A listing's carries no mode, owner or mtime: this HEAD's, of the same
                // version, still count (an upload carries them: `Fs::open`).
                let same =
                    |h: &&ObjectHead| h.meta.etag.is_some() && cur.holds_version(h.meta.etag.as_deref(), h.meta.size);
                if let Some(h) = head.as_ref().ok().filter(same) {
                    cur.fill_attrs(&h.attrs);
                }
                tracing::debug!(ino = cur.ino, key = %cur.key, "revalidation answered after a later one");
                return Ok((self.attr(t.get(node.ino).ok_or(FsError::NotFound)?), Some(true)));
            }
        }
        match head {
            Ok(ObjectHead { meta: m, attrs, .. }) if !m.is_prefix() => {
                let meta = ChildMeta { asked: since, ..self.child_meta(&node.name, &m, Kind::File) };
                if split && t.get(node.ino).is_some_and(|n| n.replaced_by(&meta)) {
                    let meta = ChildMeta { attrs: Some(attrs), ..meta };
                    let new = t.upsert(node.parent, &meta);
                    t.listing_insert(node.parent, meta);
                    t.note_store_answer(node.parent);
                    tracing::debug!(ino = node.ino, new, key = %node.key, "replaced by another client: a new inode");
                    return Ok((self.attr(t.get(node.ino).ok_or(FsError::NotFound)?), None));
                }
                let cur = t.record_head(node.ino, &meta, &attrs).ok_or(FsError::NotFound)?;
                tracing::debug!(ino = cur.ino, key = %cur.key, identity = %cur.identity(), "revalidated");
                Ok((self.attr(cur), Some(true)))
            }
            Ok(_) => Err(FsError::NotFound),
            Err(e) if e.kind == StoreErrorKind::NotFound => {
                if let Some(n) = t.get(node.ino).filter(|n| n.local) {
                    // Staged here meanwhile (an O_TRUNC open, a write): the mount's own file
                    // now, which its close uploads; gone from the bucket is no news.
                    return Ok((self.attr(n), None));
                }
                note_deleted(&mut t, node);
                // Deleted behind the mount while a handle is open: like a file unlinked while
                // open, it still has attributes (st_nlink 0); reads through the handle fail
                // with ESTALE. `fstat` must not fail, nor a read the kernel precedes with a
                // GETATTR (it does, near the end of what it knows of the file).
                match t.get(node.ino) {
                    Some(n) if n.opens > 0 => Ok((self.attr(n), None)),
                    _ => Err(FsError::NotFound),
                }
            }
            // Stale if the store is down, as for listings (`serve_stale_listing`): the caller
            // answers with what the mount knows (`Fs::serve_known_attrs`).
            Err(e) => Err(e.into()),
        }
    }

    /// Refresh `dir`'s listing from the store if it is older than the TTL. On a first visit
    /// (or where the subtree fit last time) one page of a recursive listing is asked for at
    /// the same time; if it holds the whole subtree, every directory below is listed too.
    /// If not, and `subdirs_ahead`, its subdirectories are listed in the background
    /// (preload.rs).
    /// A listing known before but past its TTL is refreshed within [`Fs::refresh_within`].
    pub(crate) async fn ensure_listing(&self, dir: &Node, subdirs_ahead: bool) -> Result<(), FsError> {
        let flight = self.listing_flight(dir.ino);
        let done = flight.done.load(Ordering::Acquire);
        let (asked, one_page) = {
            let mut t = self.table.lock().unwrap();
            if t.listing_fresh(dir.ino) {
                return Ok(());
            }
            if t.moving_now(dir.ino) && t.listing(dir.ino).is_some() {
                // A rename here moves its keys: the store shows them half moved, the
                // listing held shows its names as they are (the move's end drops it).
                return Ok(());
            }
            if t.listing(dir.ino).is_some() && self.deletes.as_ref().is_some_and(|d| d.marker_pending(&dir.key)) {
                // Made here (write-back) and its marker not in the store yet: the store has
                // nothing of ours below it, the listing held has it all. A store that hangs
                // would hold the call (`mkdir d; mv d d2; ls d2` waited 2 minutes).
                t.renew_listing(dir.ino, self.cfg.metadata_ttl);
                return Ok(());
            }
            let last = t.listing(dir.ino);
            (Asked { done, at: last.map(|l| l.at) }, last.is_some_and(|l| l.children.len() <= RELIST_MAX))
        };
        if asked.at.is_none() {
            return self.list_dir(dir, subdirs_ahead, asked).await;
        }
        // One queued behind another listing of the directory may wait for two.
        let one_page = one_page && flight.lock.try_lock().is_ok();
        let d = dir.clone();
        // A directory that fit one page last time is listed in one small request: its being
        // overdue shows the store hangs, as a HEAD's does (a path's every level would
        // otherwise wait again).
        match self.refresh_within(one_page, |me| async move { me.list_dir(&d, subdirs_ahead, asked).await }).await {
            Err(FsError::Store(e)) if self.serve_stale_listing(dir, &e) => Ok(()),
            done => done,
        }
    }

    /// The listing of [`Fs::ensure_listing`]. Skipped if the directory's listing is fresh
    /// and came since it was `asked` for, or a listing of it ended since (one that failed
    /// renews what was known): not for a listing only renewed by this one's caller as it
    /// stopped waiting (`serve_stale_listing`), so this refresh goes on and is recorded.
    async fn list_dir(&self, dir: &Node, subdirs_ahead: bool, asked: Asked) -> Result<(), FsError> {
        let flight = self.listing_flight(dir.ino);
        let listed = |t: &crate::inode::InodeTable| {
            t.listing_fresh(dir.ino)
                && (t.listing(dir.ino).is_some_and(|l| Some(l.at) != asked.at)
                    || flight.done.load(Ordering::Acquire) != asked.done)
        };
        if listed(&self.table.lock().unwrap()) {
            return Ok(());
        }
        // One listing of a directory at a time: a walk and the listing ahead often ask for
        // the same one together; the second finds it fresh when the first is done.
        let _one = flight.lock.lock().await;
        let _done = Done(&flight.done);
        if listed(&self.table.lock().unwrap()) {
            // Listed meanwhile by another caller (often the listing ahead, which does not
            // go further down): this one still asks for the next level ahead.
            if subdirs_ahead {
                self.list_subdirs_ahead(dir.ino);
            }
            return Ok(());
        }
        let (since, ahead, dir) = {
            let mut t = self.table.lock().unwrap();
            let listing = t.listing(dir.ino);
            let ahead = self.cfg.list_ahead_keys > 0 && listing.is_none_or(|l| l.subtree) && !t.is_big_subtree(dir.ino);
            (t.ask(), ahead, current(&t, dir))
        };
        let dir = &dir;
        let started = self.cfg.clock.now();
        let subtree = async {
            match ahead {
                true => self.list_subtree(&dir.key, self.cfg.list_ahead_keys).await.map(Some),
                false => Ok(None),
            }
        };
        let (own, subtree) = tokio::join!(self.list_children(dir), subtree);
        let template = Listing {
            at: started,
            valid_for: self.cfg.metadata_ttl,
            children: HashMap::new(),
            subtree: false,
            overtaken: false,
        };
        let mut children = match own {
            Ok(c) => c,
            Err(FsError::Store(e)) if self.serve_stale_listing(dir, &e) => return Ok(()),
            Err(e) => return Err(e),
        };
        let part = match subtree {
            Ok(Some(mut seen)) if seen.whole => {
                seen.dirs.insert(String::new(), children);
                self.install_subtree(
                    &dir.key,
                    dir.ino,
                    seen.dirs,
                    Listing { subtree: true, ..template },
                    since,
                    &seen.incomplete,
                );
                return Ok(());
            }
            Ok(part) => part,
            // Its own listing decides; the look-ahead is only a shortcut.
            Err(e) => {
                tracing::debug!(dir = %dir.key, "recursive listing failed: {e}");
                None
            }
        };
        // Files created here and not yet uploaded are part of the directory too.
        for meta in self.staged_children(dir.ino) {
            children.insert(meta.name.clone(), meta); // the mount's own state wins
        }
        tracing::debug!(dir = %dir.key, entries = children.len(), ms = self.cfg.clock.since(started).as_millis() as u64, "listed");
        if let Some(mut seen) = part.filter(|p| p.dirs.len() > p.incomplete.len() || !p.too_big.is_empty()) {
            // The directories the page held whole are listed from it (the root's own
            // listing only leads to them: it is in `incomplete`).
            seen.dirs.insert(String::new(), children.clone());
            let inos = self.install_subtree(
                &dir.key,
                dir.ino,
                seen.dirs,
                Listing { subtree: true, ..template.clone() },
                since,
                &seen.incomplete,
            );
            let mut t = self.table.lock().unwrap();
            for ino in seen.too_big.iter().filter_map(|d| inos.get(d)) {
                t.mark_big_subtree(*ino);
            }
        }
        self.table.lock().unwrap().set_listing_since(dir.ino, Listing { children, ..template }, since);
        self.trim_names();
        if subdirs_ahead {
            self.list_subdirs_ahead(dir.ino);
        }
        Ok(())
    }

    /// Whether `dir` is wide, from one listing of at most `RELIST_MAX` children, for a store
    /// whose plain-prefix LIST reads the whole directory (`Fs::probe`): marked so if it is.
    /// The listing is not installed: it carries no mode or owner, and names `stat`ed one by
    /// one show what their HEAD brings (SEMANTICS.md, `chmod`). False if the listing failed.
    pub(crate) async fn check_width(&self, dir: &Node) -> bool {
        match self.list_children_upto(dir, Some(RELIST_MAX)).await {
            Ok(Some(_)) => false,
            Ok(None) => {
                tracing::debug!(dir = %dir.key, "a wide directory: its names are asked about key by key");
                self.table.lock().unwrap().mark_wide(dir.ino);
                true
            }
            Err(e) => {
                tracing::debug!(dir = %dir.key, "width of a directory not checked: {e}");
                false
            }
        }
    }

    /// The lock that lets one listing of directory `ino` run at a time.
    pub(crate) fn listing_flight(&self, ino: u64) -> std::sync::Arc<Flight> {
        self.listing_flights.lock().unwrap().entry(ino).or_default().clone()
    }

    /// List `dir` if it has at most `RELIST_MAX` children (one page), for lookups of names it
    /// does not hold: a second such name within the TTL in a directory never listed (files
    /// copied into it) costs one LIST, and every later one nothing. A wider directory is
    /// marked so, and its names are probed one by one.
    pub(crate) async fn list_if_small(&self, dir: &Node) -> Result<(), FsError> {
        let flight = self.listing_flight(dir.ino);
        let _one = flight.lock.lock().await;
        let _done = Done(&flight.done);
        let (since, dir) = {
            let mut t = self.table.lock().unwrap();
            if t.listing_fresh(dir.ino) {
                return Ok(());
            }
            (t.ask(), current(&t, dir))
        };
        let dir = &dir;
        let started = self.cfg.clock.now();
        let Some(mut children) = self.list_children_upto(dir, Some(RELIST_MAX)).await? else {
            tracing::debug!(dir = %dir.key, "too many children to list for lookups: probing names");
            self.table.lock().unwrap().mark_wide(dir.ino);
            return Ok(());
        };
        for meta in self.staged_children(dir.ino) {
            children.insert(meta.name.clone(), meta); // the mount's own state wins
        }
        tracing::debug!(dir = %dir.key, entries = children.len(), "listed for lookups");
        // `subtree`: as for a directory never listed, `ls` or `find` still looks ahead.
        let listing =
            Listing { at: started, valid_for: self.cfg.metadata_ttl, children, subtree: true, overtaken: false };
        self.table.lock().unwrap().set_listing_since(dir.ino, listing, since);
        self.trim_names();
        Ok(())
    }

    /// `dir`'s children from one delimited LIST sequence.
    pub(crate) async fn list_children(&self, dir: &Node) -> Result<HashMap<String, ChildMeta>, FsError> {
        Ok(self.list_children_upto(dir, None).await?.unwrap_or_default())
    }

    /// [`Fs::list_children`], or `None` past `max` keys listed (read a page at most past it).
    async fn list_children_upto(
        &self,
        dir: &Node,
        max: Option<usize>,
    ) -> Result<Option<HashMap<String, ChildMeta>>, FsError> {
        let mut children: HashMap<String, ChildMeta> = HashMap::new();
        let mut skipped = 0usize;
        let mut seen = 0usize;
        let caps = self.store.capabilities();
        let mut stream = self.store.list(&dir.key, false);
        while let Some(item) = stream.next().await {
            let m = item?;
            seen += 1;
            if max.is_some_and(|max| seen > max) {
                return Ok(None);
            }
            // A key the store cannot address exactly would read another object's bytes.
            match names::child_name(&dir.key, &m.key).filter(|_| caps.addressable(&m.key)) {
                Some((name, true)) => {
                    children.insert(name.to_string(), self.child_meta(name, &m, Kind::Dir));
                }
                Some((name, false)) => {
                    // A directory shadows a file, a file a link (see SEMANTICS.md).
                    let (name, kind) = crate::links::classify(name);
                    crate::links::merge_child(&mut children, self.child_meta(name, &m, kind));
                }
                None => skipped += 1,
            }
        }
        if skipped > 0 {
            tracing::debug!(dir = %dir.key, skipped, "keys that are not valid file names are not shown");
        }
        self.table.lock().unwrap().note_hidden(&dir.key, skipped > 0);
        Ok(Some(children))
    }
}

/// `dir` as the table holds it now, taken with the change count a listing starts from: the
/// caller's copy may be from before a rename (a listing ahead queued, a lookup that
/// waited), and a listing of its old key installed on the inode would show the old
/// directory's contents, or none once a deferred move has emptied it (namespace_model).
/// A rename from now on counts as a change of the directory (`expire_below`).
fn current(t: &crate::inode::InodeTable, dir: &Node) -> Node {
    t.get(dir.ino).cloned().unwrap_or_else(|| dir.clone())
}

/// `node`'s object is gone from the store (another client deleted it): out of the cached
/// listing too (a lookup would find the name there), and `replaced`. The kernel may hold
/// the name for its TTL: an open of this inode then fails with ESTALE, and the kernel's
/// second lookup finds no name (an open read the deleted version and failed for the whole
/// TTL: tester H; an `O_CREAT` open failed with ENOENT: tester J).
pub(crate) fn note_deleted(t: &mut crate::inode::InodeTable, node: &crate::inode::Node) {
    if t.child(node.parent, &node.name).is_some_and(|c| c.ino == node.ino) {
        t.listing_remove(node.parent, &node.name);
        t.note_store_answer(node.parent);
        if let Some(n) = t.get_mut(node.ino) {
            n.replaced = true;
        }
    }
}
