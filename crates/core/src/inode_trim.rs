//! Memory that follows the directories in use, not the bucket.
//!
//! Every listing the mount fetches is kept (lookups and readdirs answer from it), and every
//! name a readdir shows becomes a node (its entry needs an inode number). The kernel takes a
//! reference only to the names it looks up (or gets through readdirplus) and forgets them
//! under memory pressure; names a plain readdir showed it never holds. Left alone, a walk
//! of a big bucket keeps all of it for the life of the mount (about 1 KB a name).
//!
//! So the table drops, least recently fetched first, the cached state of directories not
//! in use once it holds more than its bound of entries (`--max-cached-entries`): a
//! directory's listing, and its children that nothing here needs (no kernel reference, no
//! open handle, nothing staged or set here: [`Node::droppable`]). The next lookup or
//! readdir lists the directory again and makes new nodes. A directory the kernel forgets
//! drops the same. Directory nodes stay (children may be indexed below them), and so do
//! names with pending work, open handles or attributes set here.
//!
//! "In use" (never dropped): a directory with a handle open, read or listed in the last
//! [`MIN_IDLE`] (a readdir may still be paging through its snapshot, whose entries name
//! these nodes), and the root.

use std::time::{Duration, Instant};

use super::{InodeTable, Kind, Listing, Node, ROOT_INO};

/// A directory listed or read more recently than this is in use: never dropped.
pub const MIN_IDLE: Duration = Duration::from_secs(2);

impl Node {
    /// Nothing here needs this node but its parent's cached listing: the kernel holds no
    /// reference to it, no handle is open on it, it has no staged bytes and no attributes
    /// set here (those a HEAD found, a HEAD finds again). Not a directory (children may be
    /// indexed below it).
    pub(super) fn droppable(&self) -> bool {
        self.unreferenced() && self.kind != Kind::Dir && !self.attrs_here
    }

    /// Nothing refers to this node: no kernel reference, no open handle, no staged bytes.
    pub(super) fn unreferenced(&self) -> bool {
        self.lookups == 0 && self.opens == 0 && !self.local
    }
}

impl InodeTable {
    /// Install `dir`'s listing, counting its entries. Nodes of names that left it (removed
    /// by another client) go when nothing here needs them ([`Node::droppable`]): nothing
    /// else would ever drop them (`evict_dir` drops a listing's own names).
    pub(super) fn put_listing(&mut self, dir: u64, listing: Listing) {
        self.listed += listing.children.len();
        self.listed_at.insert(dir, self.clock.now());
        let Some(old) = self.listings.insert(dir, listing) else { return };
        self.listed = self.listed.saturating_sub(old.children.len());
        let new = &self.listings[&dir].children;
        let gone: Vec<String> = old.children.into_keys().filter(|name| !new.contains_key(name)).collect();
        for name in gone {
            self.drop_if_unneeded(dir, name);
        }
    }

    /// Drop the node of `name` in `dir` if nothing but a listing needs it
    /// ([`Node::droppable`]); whether one went.
    fn drop_if_unneeded(&mut self, dir: u64, name: String) -> bool {
        let at = (dir, name);
        let Some(&ino) = self.index.get(&at) else { return false };
        if !self.nodes.get(&ino).is_some_and(Node::droppable) {
            return false;
        }
        self.index.remove(&at);
        self.nodes.remove(&ino);
        true
    }

    /// Drop `dir`'s cached listing, if any; its children stay.
    pub(super) fn drop_listing(&mut self, dir: u64) -> Option<Listing> {
        self.listed_at.remove(&dir);
        let old = self.listings.remove(&dir)?;
        self.listed = self.listed.saturating_sub(old.children.len());
        Some(old)
    }

    /// Names this table holds: nodes, and entries of cached listings (a name usually
    /// counts in both). What `--max-cached-entries` bounds.
    pub fn cached_entries(&self) -> usize {
        self.nodes.len() + self.listed
    }

    /// Give back the room of maps far bigger than what they hold (a map keeps its peak
    /// capacity: after a walk of a million names, about 300 MB).
    pub fn shrink(&mut self) {
        fn fit<K: std::hash::Hash + Eq, V>(m: &mut std::collections::HashMap<K, V>) {
            if m.capacity() > 4 * m.len() + 1024 {
                m.shrink_to(2 * m.len());
            }
        }
        fit(&mut self.nodes);
        fit(&mut self.index);
        fit(&mut self.listings);
        fit(&mut self.listed_at);
        fit(&mut self.changed);
        fit(&mut self.whole);
        fit(&mut self.answered);
    }

    /// Drop `dir`'s cached listing and those of its children that nothing but the listing
    /// needs (`Node::droppable`). Returns the number of entries dropped.
    pub fn evict_dir(&mut self, dir: u64) -> usize {
        // Its next listing tries list-ahead again.
        self.big_subtrees.remove(&dir);
        // Its records of names removed or changed here go with it (`forget`): a listing sent
        // before the last of them, still in flight, could bring one back, so none of those
        // is recorded.
        let last = self.last_name_record(dir);
        if last > 0 {
            self.answered.entry(dir).and_modify(|at| *at = (*at).max(last)).or_insert(last);
        }
        let Some(listing) = self.drop_listing(dir) else { return 0 };
        let mut dropped = listing.children.len();
        for name in listing.children.into_keys() {
            dropped += usize::from(self.drop_if_unneeded(dir, name));
        }
        dropped
    }

    /// Bring the entries held down to `target` if they are over `max`: drop directories'
    /// cached state ([`InodeTable::evict_dir`]), least recently listed first, skipping the
    /// root and those listed in the last [`MIN_IDLE`]. `in_use(dir)` is asked just before
    /// a directory goes (under this table's lock): `true` keeps it. Returns the directories
    /// dropped. Once it could not get under `max`, it tries again only after the entries
    /// grew by a sixteenth of `max` or [`MIN_IDLE`] passed (each try scans every listing).
    pub fn trim(&mut self, max: usize, target: usize, in_use: &dyn Fn(u64) -> bool) -> Vec<u64> {
        let now = self.clock.now();
        let (floor, tried) = self.trim_floor;
        if self.cached_entries() <= max
            || self.cached_entries() <= floor && now.saturating_duration_since(tried) < MIN_IDLE
        {
            return Vec::new();
        }
        // Entries added to or removed from listings one by one drift the count: recount.
        self.listed = self.listings.values().map(|l| l.children.len()).sum();
        if self.cached_entries() <= max {
            return Vec::new();
        }
        let mut candidates: Vec<(Instant, u64)> = self
            .listed_at
            .iter()
            .filter(|(&dir, &at)| dir != ROOT_INO && now.saturating_duration_since(at) >= MIN_IDLE)
            .map(|(&dir, &at)| (at, dir))
            .collect();
        candidates.sort_unstable();
        let mut dropped = Vec::new();
        for (_, dir) in candidates {
            if self.cached_entries() <= target {
                break;
            }
            if !in_use(dir) {
                self.evict_dir(dir);
                dropped.push(dir);
            }
        }
        let left = self.cached_entries();
        self.trim_floor = (if left > max { left + max / 16 } else { 0 }, now);
        dropped
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::SystemTime;

    use super::*;
    use crate::clock::Clock;
    use crate::inode::ChildMeta;

    fn listing(at: Instant, names: &[&str]) -> Listing {
        let children: HashMap<String, ChildMeta> = names
            .iter()
            .map(|n| {
                let m = ChildMeta {
                    name: n.to_string(),
                    kind: Kind::File,
                    size: 1,
                    mtime: SystemTime::UNIX_EPOCH,
                    etag: Some("e".into()),
                    attrs: None,
                    size_unknown: false,
                    asked: 0,
                };
                (n.to_string(), m)
            })
            .collect();
        Listing { at, valid_for: Duration::from_secs(60), children, subtree: false, overtaken: false }
    }

    fn dir(t: &mut InodeTable, name: &str) -> u64 {
        let m = ChildMeta {
            name: name.into(),
            kind: Kind::Dir,
            size: 0,
            mtime: SystemTime::UNIX_EPOCH,
            etag: None,
            attrs: None,
            size_unknown: false,
            asked: 0,
        };
        let ino = t.upsert(ROOT_INO, &m);
        t.remember(ino); // the kernel holds it
        ino
    }

    /// A directory of `n` files, listed at the clock's now, each file a node (as a readdir
    /// makes them).
    fn listed_dir(t: &mut InodeTable, name: &str, n: usize) -> u64 {
        let d = dir(t, name);
        let names: Vec<String> = (0..n).map(|i| format!("f{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let l = listing(t.now(), &refs);
        for m in l.children.values() {
            t.upsert(d, m);
        }
        t.set_listing(d, l);
        d
    }

    #[test]
    fn over_the_bound_idle_directories_go_oldest_first_and_what_is_needed_stays() {
        let clock = Clock::manual();
        let mut t = InodeTable::with_clock(SystemTime::UNIX_EPOCH, clock.clone());
        let a = listed_dir(&mut t, "a", 100);
        clock.advance(Duration::from_secs(1));
        let b = listed_dir(&mut t, "b", 100);
        clock.advance(Duration::from_secs(1));
        let c = listed_dir(&mut t, "c", 100);
        // In a: one file the kernel holds, one chmod'ed here.
        let held = t.child(a, "f1").unwrap().ino;
        t.remember(held);
        let set = t.child(a, "f2").unwrap().ino;
        let n = t.get_mut(set).unwrap();
        (n.perm, n.attrs_here) = (Some(0o600), true);
        // One whose mode a HEAD found on the object: the next HEAD finds it again.
        t.get_mut(t.child(a, "f4").unwrap().ino).unwrap().perm = Some(0o600);
        let before = t.cached_entries();
        assert_eq!(before, 1 + 3 + 300 + 300);
        // Under the bound: nothing goes.
        assert!(t.trim(before, 0, &|_| false).is_empty());
        // Over it, but c was listed less than MIN_IDLE ago and b is busy: only a goes.
        clock.advance(Duration::from_millis(1500));
        let dropped = t.trim(200, 0, &|d| d == b);
        assert_eq!(dropped, vec![a]);
        assert!(t.listing(a).is_none() && t.listing(b).is_some() && t.listing(c).is_some());
        assert_eq!(t.child(a, "f1").map(|n| n.ino), Some(held), "a node the kernel holds stays");
        assert_eq!(t.child(a, "f2").map(|n| n.ino), Some(set), "a node with a chmod stays");
        assert!(t.child(a, "f3").is_none(), "an unreferenced node goes with its listing");
        assert!(t.child(a, "f4").is_none(), "so does one whose mode the store keeps");
        assert_eq!(t.cached_entries(), 1 + 3 + 2 + 400);
        t.check_invariants();
        // Later, with nothing busy: b (older) goes before c, and the trim stops at target.
        clock.advance(Duration::from_secs(5));
        let dropped = t.trim(200, 250, &|_| false);
        assert_eq!(dropped, vec![b]);
        assert!(t.listing(c).is_some());
        t.check_invariants();
    }

    #[test]
    fn names_another_client_removed_do_not_keep_their_nodes() {
        let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
        let d = listed_dir(&mut t, "d", 4);
        let ino = |t: &InodeTable, name: &str| t.child(d, name).unwrap().ino;
        let (gone, held, set, evented) = (ino(&t, "f0"), ino(&t, "f1"), ino(&t, "f2"), ino(&t, "f3"));
        t.remember(held);
        t.get_mut(set).unwrap().attrs_here = true;
        // A new listing without f0-f2 (removed by another client).
        let l = listing(t.now(), &["f3"]);
        t.set_listing(d, l);
        assert!(t.get(gone).is_none(), "a node nothing refers to goes with its name");
        assert!(t.get(held).is_some() && t.get(set).is_some(), "one the kernel holds or set here stays");
        t.forget(held, 1);
        assert!(t.get(held).is_none(), "and goes when the kernel forgets it");
        // A store event (or a HEAD's 404) removes f3, which the kernel never looked up.
        t.unlink(d, "f3");
        assert!(t.get(evented).is_none(), "an unlinked node nothing refers to goes at once");
        t.check_invariants();
    }

    #[test]
    fn a_mode_a_head_found_leaves_with_its_node_and_stays_in_the_entry() {
        let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
        let d = listed_dir(&mut t, "d", 1);
        let ino = t.child(d, "f0").unwrap().ino;
        let meta = t.listing(d).unwrap().children["f0"].clone();
        let attrs = bucketfs_store::FileAttrs { mode: Some(0o100755), ..Default::default() };
        t.remember(ino);
        t.record_head(ino, &meta, &attrs);
        t.forget(ino, 1);
        assert!(t.get(ino).is_none(), "nothing set here: the node goes when the kernel forgets it");
        let entry = t.listing(d).unwrap().children["f0"].clone();
        let again = t.upsert(d, &entry);
        assert_eq!(t.get(again).unwrap().perm, Some(0o755), "its listing entry kept what the HEAD found");
        t.check_invariants();
    }

    #[test]
    fn a_directory_the_kernel_forgets_drops_its_unreferenced_children() {
        let mut t = InodeTable::new(SystemTime::UNIX_EPOCH);
        let d = listed_dir(&mut t, "d", 50);
        let held = t.child(d, "f7").unwrap().ino;
        t.remember(held);
        t.forget(d, 1);
        assert!(t.get(d).is_some(), "a directory node stays");
        assert!(t.listing(d).is_none());
        assert_eq!(t.len(), 3, "root, d and the file the kernel holds");
        assert_eq!(t.cached_entries(), 3);
        t.check_invariants();
    }
}
