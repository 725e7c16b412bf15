//! The store's change events in the inode table (`bucketfs mount --notify`).
//!
//! While events flow without a break ([`InodeTable::set_events_since`]), a listing fetched
//! since they started stays trusted past its TTL (up to [`crate::events::EVENT_TRUST_MAX`]):
//! a change by anyone else arrives as an event and is applied here.
//!
//! An event is applied to the one name it is about. It counts as a change of the directory
//! in the store, so a listing sent before it lands overtaken (it may not erase the event);
//! it does not count as a change made here. It is not applied blindly where it may
//! be this mount's own change told late, or older than one: when the name is staged here
//! (`Node::local`), or its directory changed here within [`OWN_CHANGE_WINDOW`]. Then, and
//! where the event does not map to one plain entry (a directory marker, a link, a name
//! shadowed by another kind), the directory's listing and the name's attributes are
//! expired: the next lookup or readdir asks the store, whose answer is the truth.

use std::time::{Duration, Instant};

use super::{ChildMeta, InodeTable, Kind, Listing};

/// How soon after a change here an event about the same directory may be that change told
/// late (MinIO delivers in milliseconds; a fleet's queue may take seconds).
pub const OWN_CHANGE_WINDOW: Duration = Duration::from_secs(5);

/// What applying an event did, for the caller to tell the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventApplied {
    /// Nothing cached was about it, or it told what the table already held.
    Nothing,
    /// `name` in `dir` changed (added, replaced or removed); `ino` is its node, if any.
    Changed { dir: u64, name: String, ino: Option<u64> },
    /// `dir`'s listing and `name` were expired: the next access asks the store.
    Expired { dir: u64, name: String, ino: Option<u64> },
}

impl InodeTable {
    /// Events flow from `since` on (`None`: they stopped; every listing is back on its TTL).
    pub fn set_events_since(&mut self, since: Option<Instant>) {
        self.events_since = since;
        if since.is_none() {
            self.changed_when.clear();
        }
    }

    /// Whether store events flow now (listings fetched since are trusted past the TTL).
    pub fn events_flowing(&self) -> bool {
        self.events_since.is_some()
    }

    /// Whether `l` answers without asking the store: within its TTL, or fetched while
    /// events flowed (and not overtaken by a change here: `valid_for` zero), up to
    /// [`crate::events::EVENT_TRUST_MAX`] ago.
    pub fn trusted(&self, l: &Listing) -> bool {
        let now = self.clock.now();
        let vouched = self.events_since.is_some_and(|s| l.at >= s)
            && now.saturating_duration_since(l.at) < crate::events::EVENT_TRUST_MAX;
        l.is_fresh(now) || (!l.valid_for.is_zero() && vouched)
    }

    /// An instant that counts as expired both by the TTL and by events.
    pub fn expired_instant(&self, ttl: Duration) -> Instant {
        let now = self.clock.now();
        let by_ttl = now.checked_sub(ttl).unwrap_or(now);
        match self.events_since {
            // Before the events began: not vouched for by them either.
            Some(s) => by_ttl.min(s.checked_sub(Duration::from_nanos(1)).unwrap_or(s)),
            None => by_ttl,
        }
    }

    /// The deepest directory of `key`'s path the table holds, and the next segment below it
    /// (what a listing of that directory would show), with whether the event is about that
    /// very entry (`true`) or something deeper. A directory node is stepped into only if
    /// its parent's held listing (if any) shows it: one the store lost and that comes back
    /// must reach the parent, whose listing does not show it.
    fn nearest(&self, key: &str) -> Option<(u64, String, bool)> {
        let trimmed = key.strip_suffix('/').unwrap_or(key);
        let segs: Vec<&str> = trimmed.split('/').collect();
        if segs.iter().any(|s| !crate::names::valid_segment(s)) {
            return None; // never shown: nothing to update
        }
        let mut dir = super::ROOT_INO;
        for (i, seg) in segs.iter().enumerate() {
            let last = i + 1 == segs.len();
            match self.child(dir, seg) {
                Some(n)
                    if n.kind == Kind::Dir
                        && !last
                        && self.listings.get(&dir).is_none_or(|l| l.children.contains_key(*seg)) =>
                {
                    dir = n.ino
                }
                _ => return Some((dir, seg.to_string(), last && !key.ends_with('/'))),
            }
        }
        None
    }

    /// Whether the table holds anything an event about `name` in `dir` could make stale: a
    /// node, the directory's listing, or a record that the name is absent.
    fn holds_any(&self, dir: u64, name: &str) -> bool {
        self.child(dir, name).is_some()
            || self.listings.contains_key(&dir)
            || self.absent.contains_key(&(dir, name.to_string()))
    }

    /// `dir` changed in the store, as an event told: a listing of it sent before now may
    /// miss the change, so it is installed overtaken (`set_listing_since`). Not a change made
    /// here: the own-change window does not open.
    fn note_remote_change(&mut self, dir: u64) {
        self.change_seq += 1;
        self.changed.insert(dir, self.change_seq);
        self.whole.insert(dir, self.change_seq); // no own state to merge: distrusted whole
    }

    /// Expire `name` in `dir`: drop the listing, mark the node unconfirmed (and, for a
    /// directory, drop its own listing: what it holds is not known either).
    fn expire_name(&mut self, dir: u64, name: &str, ttl: Duration) -> EventApplied {
        // A listing of `dir` on its way may predate the change: it lands overtaken.
        self.note_remote_change(dir);
        let at = self.expired_instant(ttl);
        self.drop_listing(dir);
        self.absent.remove(&(dir, name.to_string()));
        let ino = self.child(dir, name).map(|n| n.ino);
        if let Some(d) = ino.filter(|i| self.nodes.get(i).is_some_and(|n| n.kind == Kind::Dir)) {
            self.drop_listing(d);
            self.note_remote_change(d); // and a listing of it on its way lands overtaken
        }
        if let Some(n) = ino.and_then(|i| self.nodes.get_mut(&i)) {
            n.validated = at;
        }
        EventApplied::Expired { dir, name: name.to_string(), ino }
    }

    /// After a removal left `dir`'s listing empty: the directory may have been only implied
    /// by the keys below it, and be gone from the store with the last of them. Its name is
    /// expired in its parent, so the next access asks the store (a directory with a marker
    /// object stays). Not for the root, or one whose listing is not held (a directory made
    /// here has a marker, and names staged in it are in its listing).
    pub fn expire_if_emptied(&mut self, dir: u64, ttl: Duration) -> Option<EventApplied> {
        if dir == super::ROOT_INO || !self.listings.get(&dir)?.children.is_empty() {
            return None;
        }
        let n = self.nodes.get(&dir).filter(|n| n.kind == Kind::Dir)?;
        let (parent, name) = (n.parent, n.name.clone());
        self.note_remote_change(parent);
        Some(self.expire_name(parent, &name, ttl))
    }

    /// Something changed at `key` at a time the source cannot place (a late event, maybe
    /// older than what is cached here): nothing of it is believed; the name is asked again.
    pub fn expire_event(&mut self, key: &str, ttl: Duration) -> EventApplied {
        if self.moving_key(key) {
            return EventApplied::Nothing; // see `apply_event`
        }
        let Some((dir, name, _)) = self.nearest(key) else { return EventApplied::Nothing };
        self.note_remote_change(dir);
        if !self.holds_any(dir, &name) {
            return EventApplied::Nothing; // a listing on its way is installed overtaken
        }
        self.expire_name(dir, &name, ttl)
    }

    /// Another client's change, as an event: `meta` is the new state of the object at
    /// `key` (relative to the store root), `None` if it was removed. `ttl`: the metadata
    /// TTL (what an expired name must be older than).
    pub fn apply_event(&mut self, key: &str, meta: Option<ChildMeta>, ttl: Duration) -> EventApplied {
        if self.moving_key(key) {
            // A key a rename here moves now: most likely that move's own copy or delete
            // (applied, a directory's listing lost each moved name as its old key went).
            // The move's end drops what it covered below a directory and learns a moved
            // file's identity, so nothing this event could say is kept past it.
            return EventApplied::Nothing;
        }
        let Some((dir, name, exact)) = self.nearest(key) else { return EventApplied::Nothing };
        let listed = self.listings.get(&dir).and_then(|l| l.children.get(&name)).cloned();
        let node = self.child(dir, &name).cloned();
        if !self.holds_any(dir, &name) {
            // Nothing cached about it; a listing of `dir` on its way may predate it.
            self.note_remote_change(dir);
            if meta.is_none() && dir != super::ROOT_INO && !self.listings.contains_key(&dir) {
                // A removal below a directory whose contents are not held: the directory may
                // have been implied by this key alone. Its own name is asked again (a lookup
                // would otherwise answer from the confirmed node: fs_lookup.rs).
                if let Some((parent, dname)) =
                    self.nodes.get(&dir).filter(|n| n.kind == Kind::Dir).map(|n| (n.parent, n.name.clone()))
                {
                    return self.expire_name(parent, &dname, ttl);
                }
            }
            return EventApplied::Nothing;
        }
        // The same version this table already has (this mount's own upload, told again).
        let same = |m: &ChildMeta| {
            let (etag, size, kind) = match (&node, &listed) {
                (Some(n), _) => (n.version.tag().map(str::to_owned), n.size, n.kind),
                (None, Some(l)) => (l.etag.clone(), l.size, l.kind),
                (None, None) => return false,
            };
            kind == m.kind && size == m.size && etag.is_some() && etag == m.etag
        };
        match &meta {
            Some(m) if exact && same(m) => return EventApplied::Nothing,
            None if exact && node.is_none() && listed.is_none() => {
                self.note_remote_change(dir); // a listing on its way may still show it
                return EventApplied::Nothing;
            }
            // Something new below a directory the listing already shows: it still shows.
            Some(_) if !exact && listed.as_ref().is_some_and(|l| l.kind == Kind::Dir) => return EventApplied::Nothing,
            _ => {}
        }
        let recent =
            self.changed_when.get(&dir).is_some_and(|t| self.clock.now().duration_since(*t) < OWN_CHANGE_WINDOW);
        if !exact && meta.is_some() && node.is_none() && !recent {
            // A key below a directory this listing does not show yet: it shows it now (a
            // directory shadows a file of its name, as in any listing).
            self.absent.remove(&(dir, name.clone()));
            self.note_remote_change(dir);
            let Some(l) = self.listings.get_mut(&dir) else {
                // No listing; a probe had found the name absent: it is there now.
                return EventApplied::Changed { dir, name, ino: None };
            };
            let now = std::time::SystemTime::now();
            let d = ChildMeta {
                name: name.clone(),
                kind: Kind::Dir,
                size: 0,
                mtime: now,
                etag: None,
                attrs: None,
                size_unknown: false,
                asked: 0,
            };
            if l.children.insert(name.clone(), d).is_none() {
                self.listed += 1;
            }
            return EventApplied::Changed { dir, name, ino: None };
        }
        let odd = !exact
            || meta.as_ref().is_some_and(|m| m.kind != Kind::File)
            || listed.as_ref().is_some_and(|l| l.kind != Kind::File)
            || node.as_ref().is_some_and(|n| n.kind != Kind::File || n.local || n.opens > 0);
        if recent || odd {
            return self.expire_name(dir, &name, ttl);
        }
        match meta {
            Some(m) => {
                let ino = node.as_ref().map(|_| self.upsert(dir, &m));
                self.absent.remove(&(dir, name.clone()));
                self.removed.remove(&(dir, name.clone()));
                if let Some(l) = self.listings.get_mut(&dir) {
                    if l.children.insert(name.clone(), m).is_none() {
                        self.listed += 1; // counted for the memory bound (inode_trim.rs)
                    }
                }
                self.note_remote_change(dir);
                EventApplied::Changed { dir, name, ino }
            }
            None => {
                let ino = node.map(|n| n.ino);
                if let Some(l) = self.listings.get_mut(&dir) {
                    if l.children.remove(&name).is_some() {
                        self.listed = self.listed.saturating_sub(1);
                    }
                }
                self.unlink_path(dir, &name);
                self.note_remote_change(dir);
                EventApplied::Changed { dir, name, ino }
            }
        }
    }
}
