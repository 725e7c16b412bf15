//! The inode table: which inode number stands for which key, and what we last knew of it.
//!
//! Invariants ([`InodeTable::check_invariants`], called by the unit tests and by the shuttle
//! model after every step):
//! - The root is inode 1 with key `""`, and the kernel's reference to it never goes. A
//!   directory's key ends with `/`; a file's does not; a node's key is its parent's key and
//!   its name (where the parent is still known).
//! - `index` maps (parent, name) to the live inode for that path, and a node is `linked`
//!   exactly when `index` leads to it: so no inode has two names (in one directory or two).
//!   An inode replaced by a newer one (say a file that became a directory) stays in `nodes`
//!   until the kernel forgets it, but no longer in `index`.
//! - `lookups` counts the kernel's references (lookup, create, readdirplus entries); a node
//!   other than the root is dropped when it reaches zero, unless it carries attributes set
//!   here or staged bytes (`Node::local`).
//! - A name is never both known absent and in `index`; inode numbers are never reused.
//!
//! Locking: the table lives behind one `Mutex` in [`crate::Fs`] (`Fs::table`, level 3 of
//! the order in docs/ARCHITECTURE.md: after a staged file's mutex, before the staged map);
//! every method here is synchronous and short, and no store call is made while it is held.

use std::collections::HashMap;
use std::time::{Instant, SystemTime};

use crate::clock::Clock;
use crate::names::LINK_SUFFIX;

pub const ROOT_INO: u64 = 1;

#[path = "inode_node.rs"]
mod node;
pub use node::{ChildMeta, Kind, Node, Version};

/// A directory's children as of `at`: the listing cache used by lookup and readdir.
#[derive(Debug, Clone)]
pub struct Listing {
    pub at: Instant,
    /// How long it answers without asking the store: the metadata TTL, or longer for a
    /// tree loaded at mount and refreshed in the background.
    pub valid_for: std::time::Duration,
    pub children: HashMap<String, ChildMeta>,
    /// It came from a recursive listing of a subtree that fit in one page: listing the
    /// subtree again is worth a try when it goes stale (see `Fs::ensure_listing`).
    pub subtree: bool,
    /// Fetched while this mount changed the directory ([`InodeTable::set_listing_since`]):
    /// its entries may predate that change, so they name children but do not update them.
    pub overtaken: bool,
}

impl Listing {
    /// Whether it still answers at `now` (the table's clock: [`InodeTable::now`]).
    pub fn is_fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.at) < self.valid_for
    }
}

pub struct InodeTable {
    nodes: HashMap<u64, Node>,
    index: HashMap<(u64, String), u64>,
    listings: HashMap<u64, Listing>,
    next_ino: u64,
    /// Counts changes to directories' contents recorded here; `changed[dir]` is the count at
    /// `dir`'s latest. A listing fetched from the store while its directory changed here may
    /// miss that change, so it is installed stale (see [`InodeTable::set_listing_since`]).
    change_seq: u64,
    changed: HashMap<u64, u64>,
    /// Of those, the count at each directory's latest change not to one name alone (a
    /// rename moving its objects, its keys rewritten, its listing dropped, a store event):
    /// an answer sent before it is distrusted whole. Changes to one name are in `named`.
    whole: HashMap<u64, u64>,
    /// The count at each name's latest change here (create, upload done, unlink, renamed in
    /// or away), until a listing of its directory sent after it is recorded: a listing sent
    /// before takes the mount's state for these names and stands for the rest
    /// ([`InodeTable::set_listing_since`]). Past [`NAMED_MAX`] they fold into `whole`.
    named: std::collections::BTreeMap<(u64, String), u64>,
    /// A change of one name may show or hide others (Google Drive's repeated names: a
    /// rename replacing a file holds two items under one name until the old is trashed, and
    /// a listing then shows `stem~ID8`): every change counts as the directory's whole.
    pub(crate) names_alias: bool,
    /// The change count each directory's newest recorded listing was sent at: an answer
    /// sent before it (held up in the network) arrives with older news, and is not
    /// recorded over it (see [`InodeTable::set_listing_since`]).
    answered: HashMap<u64, u64>,
    /// Directories whose subtree a recursive page showed to be too big for one page: no
    /// recursive page is asked for with their listings (see `preload.rs`).
    big_subtrees: std::collections::HashSet<u64>,
    /// Keys of directories whose last listing held keys the mount does not show (names.rs):
    /// whether such a directory is empty is the store's to say (see `Fs::has_children`).
    /// A renamed directory's entry stays under its old key (then the cached listing answers).
    hidden_in: std::collections::HashSet<String>,
    /// Names a probe found absent, and when: within the TTL a second question about the
    /// same name (the kernel's LOOKUP, then `mkdir`/`create` asking again) costs nothing.
    /// Any name recorded here through [`InodeTable::upsert`] or a listing change is dropped.
    absent: HashMap<(u64, String), Instant>,
    /// The name a probe last found absent in each directory, and when: another name within
    /// the TTL lists the directory instead (see `Fs::find_child`). Cleared past [`ABSENT_MAX`].
    missed: HashMap<u64, (Instant, String)>,
    /// Directories with more children than one listing is worth (`RELIST_MAX`): their
    /// absent names are probed one by one, until a listing shows at most that many.
    wide: std::collections::HashSet<u64>,
    /// The name a probe last found in each directory, and when each directory's width was
    /// last checked: where a plain-prefix LIST reads the whole directory, a second name
    /// found within the TTL checks whether it is wide (`Fs::check_width`). Cleared past
    /// [`ABSENT_MAX`].
    found: HashMap<u64, (Instant, String)>,
    width_checked: HashMap<u64, Instant>,
    /// Names this mount removed (unlink, rmdir, renamed away) and has not seen since: a
    /// listing overtaken by the removal may still show them, and must not bring them back
    /// (see [`InodeTable::removed_here`]). Each with the change count of its removal; dropped
    /// at the name's next upsert, once a listing of its directory sent after the removal is
    /// recorded, or with the directory (no cap: a large `rm -rf` never lets one through).
    removed: std::collections::BTreeMap<(u64, String), u64>,
    /// The renames moving objects in the store now, by id (renames of keys that do not
    /// overlap run at once: intents.rs): see [`InodeTable::begin_move`].
    moving: Vec<(u64, Moving)>,
    /// The last id given to a move.
    moves_begun: u64,
    /// The time freshness is measured in (the mount's [`Clock`]).
    clock: Clock,
    /// Entries of the cached listings, as of their install (entries added or removed one
    /// by one since are not counted): see `inode_trim.rs`.
    listed: usize,
    /// When each cached listing was installed (the order listings are dropped in).
    listed_at: HashMap<u64, Instant>,
    /// A trim that could not get under its bound, and when: until the entries grow past
    /// this many, or a while passed, it does not try again.
    trim_floor: (usize, Instant),
    /// When each directory's contents last changed here (`changed`, in time): a store
    /// event about it soon after may be this change told late (`inode_events.rs`).
    changed_when: HashMap<u64, Instant>,
    /// Since when the store's change events have flowed without a break (`None`: they do
    /// not): a listing fetched since stays trusted past its TTL (`inode_events.rs`).
    events_since: Option<Instant>,
}

/// What a rename in progress is moving (see [`InodeTable::begin_move`]).
struct Moving {
    /// The source's and the target's name, each in its directory.
    names: [(u64, String); 2],
    keys: Vec<String>,
}

impl Moving {
    /// Whether `key` is one of the keys moved, or below one of them (a directory's).
    fn covers(&self, key: &str) -> bool {
        self.keys.iter().any(|k| key == k || k.ends_with('/') && key.starts_with(k.as_str()))
    }
}

/// A directory whose last listing held at most this many entries (one page of an S3 LIST)
/// is listed again to answer a lookup or a `stat` past the TTL (see `Fs::find_child`).
pub const RELIST_MAX: usize = 1000;

/// Bound of [`InodeTable`]'s per-name change records; past it they are folded into their
/// directories' whole changes (an answer sent before them is then distrusted whole).
const NAMED_MAX: usize = 65_536;

/// Bound of [`InodeTable`]'s absent names; past it the oldest half is dropped.
const ABSENT_MAX: usize = 4096;

#[path = "inode_dirs.rs"]
mod dirs;

#[path = "inode_trim.rs"]
mod trim;

#[path = "inode_events.rs"]
mod events;
pub use events::EventApplied;
pub use trim::MIN_IDLE;

impl InodeTable {
    /// A table with only the root, on the real clock.
    pub fn new(root_mtime: SystemTime) -> Self {
        Self::with_clock(root_mtime, Clock::real())
    }

    /// A table with only the root whose freshness is measured by `clock`.
    pub fn with_clock(root_mtime: SystemTime, clock: Clock) -> Self {
        let started = clock.now();
        let root = Node {
            ino: ROOT_INO,
            parent: ROOT_INO,
            name: String::new(),
            kind: Kind::Dir,
            key: String::new(),
            size: 0,
            mtime: root_mtime,
            version: Version::Untagged,
            validated: clock.now(),
            lookups: 1,
            perm: None,
            owner: None,
            kernel_cached: None,
            kernel_dropping: 0,
            mtime_set: None,
            attrs_here: false,
            linked: true,
            local: false,
            opens: 0,
            replaced: false,
            ctime: None,
            size_unknown: false,
            answered: 0,
            attrs_asked: 0,
            foreign: None,
        };
        Self {
            nodes: HashMap::from([(ROOT_INO, root)]),
            index: HashMap::new(),
            listings: HashMap::new(),
            next_ino: 2,
            change_seq: 0,
            changed: HashMap::new(),
            whole: HashMap::new(),
            named: Default::default(),
            names_alias: false,
            answered: HashMap::new(),
            big_subtrees: Default::default(),
            hidden_in: Default::default(),
            absent: HashMap::new(),
            missed: HashMap::new(),
            wide: Default::default(),
            found: HashMap::new(),
            width_checked: HashMap::new(),
            removed: Default::default(),
            moving: Vec::new(),
            moves_begun: 0,
            clock,
            listed: 0,
            listed_at: HashMap::new(),
            trim_floor: (0, started),
            changed_when: HashMap::new(),
            events_since: None,
        }
    }

    /// The time now, by the table's clock: what `validated` and `Listing::at` are compared with.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    pub fn get(&self, ino: u64) -> Option<&Node> {
        self.nodes.get(&ino)
    }

    pub fn get_mut(&mut self, ino: u64) -> Option<&mut Node> {
        self.nodes.get_mut(&ino)
    }

    pub fn child(&self, parent: u64, name: &str) -> Option<&Node> {
        self.index.get(&(parent, name.to_string())).and_then(|i| self.nodes.get(i))
    }

    /// Node `ino`, made here with its tag not known yet (`Version::Unknown`), is the
    /// object tagged `etag`: the node and its parent's kept entry learn it. (The entry
    /// left untagged was later relisted against the node's tag as another version: it
    /// dropped a link's mtime set here, `touch -h`, `rsync -a`.) `None` if it knew one.
    pub fn learn_own_version(&mut self, ino: u64, etag: Option<&str>) -> Option<Version> {
        let cur = self.nodes.get_mut(&ino).filter(|n| n.version == Version::Unknown)?;
        cur.version = Version::from_store(etag);
        self.entry_learns(ino);
        self.nodes.get(&ino).map(|n| n.version.clone())
    }

    /// The parent's kept entry of node `ino` learns the node's identity (no change of ours:
    /// no record). Left untagged, it later told the node "replaced" (an ETag against none).
    fn entry_learns(&mut self, ino: u64) {
        let Some(cur) = self.nodes.get(&ino) else { return };
        let (parent, name, entry) = (cur.parent, cur.name.clone(), ChildMeta { asked: cur.answered, ..cur.entry() });
        if let Some(e) = self.listings.get_mut(&parent).and_then(|l| l.children.get_mut(&name)) {
            *e = entry;
        }
    }

    /// A HEAD of node `ino`'s own key answered `meta` (sent at ticket `meta.asked`): record
    /// it on that node, keeping its inode even for another version (an open's revalidation;
    /// `upsert` is the entrance that may split one off). The caller has checked the rules
    /// of `upsert` (`moving_key`, `Node::holds_newer_than`) and that no change here to the
    /// directory overtook the answer. A staged node keeps its size and mtime (the mount's
    /// own), and takes the store's identity.
    pub fn record_head(&mut self, ino: u64, meta: &ChildMeta, attrs: &bucketfs_store::FileAttrs) -> Option<&Node> {
        let now = self.clock.now();
        let cur = self.nodes.get_mut(&ino)?;
        if cur.version.other_than(meta.etag.as_deref()) && !cur.local {
            cur.forget_attrs(); // changed by someone else: what it carries is the truth
        }
        if !cur.local {
            if !cur.same_tag(meta.etag.as_deref()) {
                cur.mtime = meta.mtime;
            }
            cur.size = meta.size;
            cur.size_unknown = meta.size_unknown;
        }
        cur.version = Version::from_store(meta.etag.as_deref());
        cur.validated = now;
        cur.answered = cur.answered.max(meta.asked);
        cur.fill_attrs(attrs);
        // The parent's cached entry learns the identity too: untagged, it dropped a chmod
        // kept here and the reads' If-Match (`mv`, open, `ls -l`).
        self.entry_learns(ino);
        self.nodes.get(&ino)
    }

    /// Record `meta` as the current state of `name` in `parent` and return its inode.
    /// Reuses the existing inode when it is the same file (same kind, and for a file the
    /// same identity, or one not known), otherwise allocates a new one.
    pub fn upsert(&mut self, parent: u64, meta: &ChildMeta) -> u64 {
        let known = self.index.get(&(parent, meta.name.clone())).copied();
        if let Some(ino) = known.filter(|_| self.changed_here_after(parent, &meta.name, meta.asked)) {
            // The mount changed this name after the request was sent (a symlink or a
            // directory made over a name removed here, a rename onto it): its state wins;
            // the answer describes what was there before.
            return ino;
        }
        self.absent.remove(&(parent, meta.name.clone()));
        self.removed.remove(&(parent, meta.name.clone()));
        let parent_key = self.nodes.get(&parent).map(|p| p.key.clone()).unwrap_or_default();
        let key_of = |m: &ChildMeta| key_for(&parent_key, &m.name, m.kind);
        if let Some(ino) = known {
            let moving = self.nodes.get(&ino).is_some_and(|n| self.moving_key(&n.key));
            if let Some(node) = self.nodes.get_mut(&ino) {
                if node.local || moving {
                    // Staged here: the store's answer predates what this mount holds. Or
                    // moved by a rename in progress: it may describe the other file.
                    return ino;
                }
                if node.holds_newer_than(meta.asked) {
                    // Sent before the answer the node holds (a listing sent before a HEAD
                    // and answered after it): older news, of this name alone.
                    return ino;
                }
                node.answered = node.answered.max(meta.asked);
                let replaced = node.replaced_by(meta);
                node.replaced = replaced;
                if node.kind == meta.kind && !replaced {
                    if meta.etag.is_some() && node.version.other_than(meta.etag.as_deref()) {
                        // A file replaced by someone else carries its own attributes; a
                        // directory's (kept here only) stay. (An entry with no tag, this
                        // mount's own relisted, says nothing of another version.)
                        match node.kind {
                            Kind::File => node.forget_attrs(),
                            _ => node.mtime_set = None,
                        }
                    }
                    if !node.same_tag(meta.etag.as_deref()) {
                        node.mtime = meta.mtime;
                    }
                    node.size = meta.size;
                    node.size_unknown = meta.size_unknown;
                    node.version = node.version.merged(meta.etag.as_deref());
                    node.validated = self.clock.now();
                    if let Some(a) = &meta.attrs {
                        node.fill_attrs(a);
                    }
                    return ino;
                }
            }
            // Another kind, or another file (see `Node::replaced_by`): a new inode.
            self.unlink_path(parent, &meta.name);
            self.removed.remove(&(parent, meta.name.clone()));
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let validated = self.clock.now();
        self.nodes.insert(
            ino,
            Node {
                ino,
                parent,
                name: meta.name.clone(),
                kind: meta.kind,
                key: key_of(meta),
                size: meta.size,
                mtime: meta.mtime,
                version: Version::from_store(meta.etag.as_deref()),
                validated,
                lookups: 0,
                perm: None,
                owner: None,
                kernel_cached: None,
                kernel_dropping: 0,
                mtime_set: None,
                attrs_here: false,
                linked: true,
                local: false,
                opens: 0,
                replaced: false,
                ctime: None,
                size_unknown: meta.size_unknown,
                answered: meta.asked,
                attrs_asked: 0,
                foreign: None,
            },
        );
        if let (Some(a), Some(n)) = (&meta.attrs, self.nodes.get_mut(&ino)) {
            n.fill_attrs(a);
        }
        self.index.insert((parent, meta.name.clone()), ino);
        ino
    }

    /// The kernel took another reference to `ino`.
    pub fn remember(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.lookups += 1;
        }
    }

    /// The kernel dropped `count` references; forget the node when none are left.
    pub fn forget(&mut self, ino: u64, count: u64) {
        if ino == ROOT_INO {
            return;
        }
        let Some(n) = self.nodes.get_mut(&ino) else { return };
        n.lookups = n.lookups.saturating_sub(count);
        // A node carrying chmod/chown/utime from here is kept: the kernel forgets inodes
        // whenever their dentries expire, and those settings must last for the mount.
        // A staged node is kept too: its upload still needs its key.
        // (Not one unlinked: no path leads to it again.)
        let has_overrides = n.linked && n.attrs_here || n.local;
        if n.lookups == 0 && n.kind == Kind::Dir && n.linked {
            // A directory stays (its listing goes): a child kept past its own forget (staged,
            // chmod'ed) is indexed under this inode, and under a new one it was lost (an
            // upload pending in write-back vanished from `ls` after the kernel forgot).
            self.evict_dir(ino); // its listing, and children the kernel holds no reference to
            self.forget_removed_in(ino, u64::MAX); // its next listing starts afresh
            return;
        }
        if n.lookups == 0 && !has_overrides {
            let (parent, name) = (n.parent, n.name.clone());
            let (linked, answered) = (n.linked, n.answered);
            let removed = self.nodes.remove(&ino);
            if linked && answered > self.answered.get(&parent).copied().unwrap_or(0) {
                // The node holds newer news than its parent's listing (a HEAD answered after
                // it): the entry keeps it, or the next lookup would rebuild the node older.
                let entry = self.listings.get_mut(&parent).and_then(|l| l.children.get_mut(&name));
                if let (Some(e), Some(n)) = (entry, removed) {
                    *e = ChildMeta { asked: answered, ..n.entry() };
                }
            }
            self.drop_listing(ino);
            self.big_subtrees.remove(&ino);
            self.forget_removed_in(ino, u64::MAX);
            self.changed.remove(&ino);
            self.whole.remove(&ino);
            self.forget_named_in(ino, u64::MAX);
            self.answered.remove(&ino);
            self.changed_when.remove(&ino);
            self.missed.remove(&ino);
            self.wide.remove(&ino);
            self.found.remove(&ino);
            self.width_checked.remove(&ino);
            if self.index.get(&(parent, name.clone())) == Some(&ino) {
                self.index.remove(&(parent, name));
            }
        }
    }

    /// Forget that (parent, name) exists, e.g. after the store says it is gone.
    pub fn unlink(&mut self, parent: u64, name: &str) {
        self.unlink_path(parent, name);
        self.note_name_change(parent, name);
    }

    fn unlink_path(&mut self, parent: u64, name: &str) {
        if let Some(ino) = self.index.remove(&(parent, name.to_string())) {
            self.unlinked(ino);
            self.note_removed(parent, name);
        }
    }

    /// No path leads to `ino` any more: it stays while something refers to it (the
    /// kernel, a handle, staged bytes: `forget` or release drop it later); a file or link
    /// nothing refers to goes now (a name removed by another client, which the kernel
    /// never looked up, would otherwise stay for the life of the mount).
    fn unlinked(&mut self, ino: u64) {
        let Some(n) = self.nodes.get_mut(&ino) else { return };
        n.linked = false;
        if n.unreferenced() && n.kind != Kind::Dir {
            self.nodes.remove(&ino);
        }
    }

    pub fn relocate(&mut self, ino: u64, parent: u64, name: &str) {
        let Some(node) = self.nodes.get(&ino) else { return };
        let (old_parent, old_name, old_key, kind) = (node.parent, node.name.clone(), node.key.clone(), node.kind);
        let parent_key = self.nodes.get(&parent).map(|p| p.key.clone()).unwrap_or_default();
        let new_key = key_for(&parent_key, name, kind);
        if self.index.get(&(old_parent, old_name.clone())) == Some(&ino) {
            self.index.remove(&(old_parent, old_name.clone()));
            self.note_removed(old_parent, &old_name);
        }
        self.removed.remove(&(parent, name.to_string()));
        self.note_name_change(old_parent, &old_name);
        self.note_name_change(parent, name);
        self.absent.remove(&(parent, name.to_string()));
        if let Some(old) = self.index.insert((parent, name.to_string()), ino) {
            if old != ino {
                // The replaced target stays until the kernel forgets it, unreachable by path.
                self.drop_listing(old);
                self.unlinked(old);
            }
        }
        if kind == Kind::Dir {
            for n in self.nodes.values_mut() {
                if n.ino != ino && n.key.starts_with(&old_key) {
                    n.key = format!("{new_key}{}", &n.key[old_key.len()..]);
                }
            }
        }
        let node = self.nodes.get_mut(&ino).expect("checked above");
        node.parent = parent;
        node.name = name.to_string();
        node.key = new_key;
        node.linked = true;
    }

    /// Every node, for scans that are rare (rename of a directory, staged children).
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Check the invariants in the module doc; panics with the first one broken.
    pub fn check_invariants(&self) {
        let root = self.nodes.get(&ROOT_INO).expect("the root is always in the table");
        assert!(root.key.is_empty() && root.kind == Kind::Dir && root.linked && root.lookups >= 1, "root: {root:?}");
        for (&(parent, ref name), &ino) in &self.index {
            let n = self.nodes.get(&ino).unwrap_or_else(|| panic!("index ({parent}, {name:?}) -> {ino}: no such node"));
            assert!(
                n.parent == parent && n.name == *name && n.linked,
                "index ({parent}, {name:?}) -> {ino}, but the node is {:?}",
                (n.parent, &n.name, n.linked)
            );
            assert!(!self.absent.contains_key(&(parent, name.clone())), "{name:?} in {parent} is indexed and absent");
        }
        for (&ino, n) in &self.nodes {
            assert!(ino == n.ino && ino < self.next_ino, "node {ino} numbered {} (next {})", n.ino, self.next_ino);
            if ino == ROOT_INO {
                continue;
            }
            let indexed = self.index.get(&(n.parent, n.name.clone())) == Some(&ino);
            assert_eq!(n.linked, indexed, "node {ino} ({:?}) linked {} but indexed {indexed}", n.key, n.linked);
            assert!(n.key.ends_with('/') == (n.kind == Kind::Dir), "node {ino}: key {:?} for a {:?}", n.key, n.kind);
            if let Some(p) = self.nodes.get(&n.parent).filter(|_| n.linked) {
                assert_eq!(n.key, key_for(&p.key, &n.name, n.kind), "node {ino}: key not its parent's and its name");
                assert_eq!(p.kind, Kind::Dir, "node {ino}: parent {} is not a directory", p.ino);
            }
        }
        for (dir, l) in &self.listings {
            if let Some(n) = self.nodes.get(dir) {
                assert_eq!(n.kind, Kind::Dir, "listing of {dir}, which is not a directory");
            }
            for (name, c) in &l.children {
                assert_eq!(*name, c.name, "listing of {dir}: entry {name:?} named {:?}", c.name);
            }
        }
        for (dir, &c) in &self.changed {
            assert!(c <= self.change_seq, "change of {dir} at {c}, after the count {}", self.change_seq);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// The object key of `name` of `kind` in the directory with key `parent_key`.
pub fn key_for(parent_key: &str, name: &str, kind: Kind) -> String {
    match kind {
        Kind::Dir => format!("{parent_key}{name}/"),
        Kind::File => format!("{parent_key}{name}"),
        Kind::Symlink => format!("{parent_key}{name}{LINK_SUFFIX}"),
    }
}

#[cfg(test)]
#[path = "inode_tests.rs"]
mod tests;
