//! Listing a whole subtree with one recursive LIST instead of one LIST per directory.
//!
//! Two users:
//! - `--preload-tree` (GCSF's approach): the whole bucket at mount, bounded by
//!   `max_entries` (a bigger bucket is refused with a message; listing per directory still
//!   works), kept valid for `valid_for` and refreshed in the background by the mount.
//! - List-ahead: when a directory is listed, one page of a recursive listing of it is asked
//!   for at the same time as its own listing (see `Fs::ensure_listing`). If the page holds
//!   the whole subtree, every directory below gets its listing from it, so a `find` or
//!   `ls -R` of a small tree costs one round trip per big directory, not one per directory.
//!   If it does not, the directories the page held whole get theirs from it all the same
//!   (see [`Seen::incomplete`]).
//!   A directory whose subtree does not fit has its subdirectories (if it has at most
//!   [`MAX_SUBDIRS_AHEAD`]) listed the same way in the background, a few at a time
//!   mount-wide, so a walk finds them listed when it gets there. Only a listing asked for
//!   by `opendir` starts that; background listings start nothing further.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::TryStreamExt;

use crate::fs::{Fs, Kind};
use crate::inode::{ChildMeta, Listing, ROOT_INO};
use crate::{names, FsError};

/// A directory with more subdirectories than this does not have them listed ahead (an
/// `ls` of a bucket's root with thousands of prefixes costs nothing extra).
pub(crate) const MAX_SUBDIRS_AHEAD: usize = 16;

/// Directory key (relative to the listed root, "" for the root) -> its children.
pub(crate) type Subtree = HashMap<String, HashMap<String, ChildMeta>>;

/// What one page of a recursive listing showed.
pub(crate) struct Seen {
    pub dirs: Subtree,
    /// Keys that are valid paths.
    pub count: usize,
    /// The page held the whole subtree.
    pub whole: bool,
    /// Directories in `dirs` whose children the page did not hold whole (their listing is
    /// not installed): when `whole`, none; otherwise the root and every directory that
    /// the first key past the page lies in. The others were whole: an object store lists
    /// keys in byte order, so all of a directory's keys come before any key after them.
    /// Stores whose listings are not in that order (`prefix_dirs` false), or a page whose
    /// keys were not, mark all.
    pub incomplete: HashSet<String>,
    /// Directories below the root that the whole page lay in: their subtrees are bigger
    /// than a page, so listing them asks for no recursive page.
    pub too_big: HashSet<String>,
}

impl Fs {
    /// Load every key into the listing cache; returns the number of entries loaded.
    pub async fn preload_tree(&self, max_entries: usize, valid_for: Duration) -> Result<usize, FsError> {
        let started = self.cfg.clock.now();
        let since = self.table.lock().unwrap().ask();
        let root = self.node(ROOT_INO)?;
        let (own, subtree) = tokio::join!(self.list_children(&root), self.list_subtree("", max_entries));
        let Seen { mut dirs, count, whole: true, .. } = subtree? else {
            return Err(FsError::Local(format!(
                "the bucket holds over {max_entries} keys; not preloading the tree (directories are listed as they are opened)"
            )));
        };
        dirs.insert(String::new(), own?);
        let template = Listing { at: started, valid_for, children: HashMap::new(), subtree: false, overtaken: false };
        self.install_subtree("", ROOT_INO, dirs, template, since, &HashSet::new());
        tracing::info!(entries = count, ms = self.cfg.clock.since(started).as_millis() as u64, "tree preloaded");
        Ok(count)
    }

    /// Every directory at or below `root` (a directory key) with its children, from one
    /// recursive listing of at most `max_entries` keys (the listing stops at the next
    /// one: the store is not asked for the next page). See [`Seen`].
    pub(crate) async fn list_subtree(&self, root: &str, max_entries: usize) -> Result<Seen, FsError> {
        let mut dirs: Subtree = HashMap::from([(String::new(), HashMap::new())]);
        let (mut seen, mut count) = (0usize, 0usize);
        // Whether the keys came in byte order (GCS's "/lead" shown as "lead" does not).
        let caps = self.store.capabilities();
        let mut in_order = caps.prefix_dirs;
        let (mut first, mut last) = (None, String::new());
        let mut stream = self.store.list(root, true);
        // Keys of the directories holding keys that are not shown (`InodeTable::note_hidden`).
        let mut hidden: HashSet<String> = HashSet::new();
        while let Some(m) = stream.try_next().await? {
            seen += 1;
            in_order &= m.key >= last;
            if seen > max_entries {
                let rest = m.key.strip_prefix(root).unwrap_or_default();
                let first = first.as_deref().and_then(|k: &str| k.strip_prefix(root)).unwrap_or_default();
                let (incomplete, too_big) = match in_order {
                    true => {
                        let incomplete: HashSet<String> =
                            dirs.keys().filter(|d| rest.starts_with(d.as_str())).cloned().collect();
                        let big = incomplete
                            .iter()
                            .filter(|d| !d.is_empty() && first.starts_with(d.as_str()))
                            .cloned()
                            .collect();
                        (incomplete, big)
                    }
                    false => (dirs.keys().cloned().collect(), HashSet::new()),
                };
                self.note_hidden(&hidden);
                return Ok(Seen { dirs, count, whole: false, incomplete, too_big });
            }
            if first.is_none() {
                first = Some(m.key.clone());
            }
            last.clone_from(&m.key);
            if m.may_hold_bytes() {
                // A marker's bytes show under no name: its directory holds a key not shown.
                hidden.insert(m.key.clone());
            }
            let Some(rel) = m.key.strip_prefix(root).filter(|r| !r.is_empty()) else { continue };
            // One trailing '/' is a marker's; `d//` holds an empty segment (not shown).
            let segments: Vec<&str> = rel.strip_suffix('/').unwrap_or(rel).split('/').collect();
            if !caps.addressable(&m.key) {
                // Another object's bytes would be read for it (see `Capabilities::addressable`);
                // a key with leading whitespace is a whole directory the store cannot reach.
                // Every directory above it holds a key not shown.
                hidden.extend(names::ancestors(root, &m.key));
                continue;
            }
            // A key with a segment that is not a valid file name is never exposed (see
            // names.rs); the directories above that segment still show, as a delimited
            // listing shows them.
            let valid = segments.iter().take_while(|s| names::valid_segment(s)).count();
            count += usize::from(valid == segments.len());
            if valid < segments.len() {
                hidden.extend(names::ancestors(root, &m.key));
            }
            let mut parent = String::new();
            for (i, seg) in segments[..valid].iter().enumerate() {
                let is_dir = i + 1 < segments.len() || rel.ends_with('/');
                let meta = if is_dir {
                    let dir = bucketfs_store::ObjectMeta {
                        key: String::new(),
                        size: 0,
                        etag: None,
                        mtime: None,
                        size_unknown: false,
                    };
                    self.child_meta(seg, &dir, Kind::Dir)
                } else {
                    let (name, kind) = crate::links::classify(seg);
                    self.child_meta(name, &m, kind)
                };
                // A directory shadows a file, a file a link (SEMANTICS.md).
                crate::links::merge_child(dirs.entry(parent.clone()).or_default(), meta);
                parent = format!("{parent}{seg}/");
                if is_dir {
                    dirs.entry(parent.clone()).or_default();
                }
            }
        }
        self.note_hidden(&hidden);
        Ok(Seen { dirs, count, whole: true, incomplete: HashSet::new(), too_big: HashSet::new() })
    }

    /// Record `dirs` (keys) as holding keys that are not shown.
    fn note_hidden(&self, dirs: &HashSet<String>) {
        let mut t = self.table.lock().unwrap();
        for d in dirs {
            t.note_hidden(d, true);
        }
    }

    /// List the subdirectories of `dir` that have no fresh listing, in the background.
    pub(crate) fn list_subdirs_ahead(&self, dir: u64) {
        let Some(me) = self.me.upgrade().filter(|_| self.cfg.list_ahead_keys > 0) else { return };
        let subdirs: Vec<crate::inode::Node> = {
            let mut t = self.table.lock().unwrap();
            // A listing overtaken by a change here does not lead to a directory removed
            // meanwhile (it would come back: `mkdir` of its name then said EEXIST).
            let dirs: Vec<ChildMeta> = match t.listing(dir) {
                Some(l) => l
                    .children
                    .values()
                    .filter(|c| c.kind == Kind::Dir && !(l.overtaken && t.removed_here(dir, &c.name)))
                    .cloned()
                    .collect(),
                None => return,
            };
            if dirs.is_empty() || dirs.len() > MAX_SUBDIRS_AHEAD {
                return;
            }
            let inos: Vec<u64> = dirs.iter().map(|m| t.upsert(dir, m)).collect();
            inos.into_iter().filter(|&i| !t.listing_fresh(i)).filter_map(|i| t.get(i).cloned()).collect()
        };
        for node in subdirs {
            let Ok(permit) = self.listing_ahead.clone().try_acquire_owned() else { break };
            let me = me.clone();
            crate::sync::spawn(async move {
                if let Err(e) = me.ensure_listing(&node, false).await {
                    tracing::debug!(dir = %node.key, "listing ahead failed: {e}");
                }
                drop(permit);
            });
        }
    }

    /// Install the listing of `root` (inode `root_ino`) and of every directory below it,
    /// each with `template`'s time and validity. The root's entry must be its own delimited
    /// listing: a recursive listing through OpenDAL shows a key with a leading '/' (GCS
    /// allows "/lead") as "lead", and only directories the root's own listing has are
    /// installed. Files written here and not yet uploaded stay part of their directories.
    /// Directories in `incomplete` only lead to the ones below them: no listing of theirs.
    /// Returns the inode of every directory it reached, by key relative to `root`.
    pub(crate) fn install_subtree(
        &self,
        root: &str,
        root_ino: u64,
        mut dirs: Subtree,
        template: Listing,
        since: u64,
        incomplete: &HashSet<String>,
    ) -> HashMap<String, u64> {
        // Parents before children, so each directory has an inode when listed.
        let mut keys: Vec<String> = dirs.keys().cloned().collect();
        keys.sort_by_key(|k| k.matches('/').count());
        let mut inos: HashMap<String, u64> = HashMap::from([(String::new(), root_ino)]);
        // Directories changed here since the listing began, and all below them: a
        // directory this install makes has no change records of its own, and what was
        // changed above it (moved, removed and made again, an event about it) may be
        // missing from its listing, so that lands overtaken too.
        let mut distrusted: HashSet<String> = HashSet::new();
        for key in keys {
            let Some(&ino) = inos.get(&key) else { continue };
            let mut children = dirs.remove(&key).unwrap_or_default();
            for meta in self.staged_children(ino) {
                children.insert(meta.name.clone(), meta); // the mount's own state wins
            }
            let mut t = self.table.lock().unwrap();
            if t.has_newer_listing(ino, since) {
                // A listing sent later is recorded: this one's news of the directory, and
                // of those below it, is older (set_listing_since).
                continue;
            }
            // Changed here since the listing began: a directory it has that the mount
            // removed or moved meanwhile stays so.
            let inherited = parent_key(&key).is_some_and(|p| distrusted.contains(p));
            let overtaken = t.changed_at(ino) > since || inherited;
            if overtaken {
                distrusted.insert(key.clone());
            }
            // A change below the subtree's root since the listing began (a store event
            // resolves to the deepest directory the table held then) may be missing from
            // every listing of it: they all land overtaken.
            let root_changed = t.events_flowing() && t.changed_at(root_ino) > since;
            for (name, meta) in &children {
                // A name a rename moves now stays as the mount holds it (`begin_move`).
                if meta.kind == Kind::Dir && !(overtaken && t.removed_here(ino, name)) && !t.moving_name(ino, name) {
                    // An answer sent at `since` (a node holding newer news keeps it).
                    let child = t.upsert(ino, &ChildMeta { asked: since, ..meta.clone() });
                    if t.get(child).is_some_and(|n| n.kind == Kind::Dir) {
                        inos.insert(format!("{key}{name}/"), child);
                    }
                }
            }
            if !incomplete.contains(&key) {
                let mut listing = Listing { children, ..template.clone() };
                if root_changed || inherited {
                    listing.valid_for = std::time::Duration::ZERO;
                    listing.overtaken = true;
                }
                t.set_listing_since(ino, listing, since);
            }
        }
        tracing::debug!(root, dirs = inos.len() - incomplete.len(), "subtree listed");
        self.trim_names();
        inos
    }
}

/// The key of the directory holding directory `key` (both relative to a subtree's root,
/// ending in '/'; the root is ""), `None` for the root itself.
fn parent_key(key: &str) -> Option<&str> {
    let inner = key.strip_suffix('/')?;
    Some(inner.rfind('/').map_or("", |i| &key[..=i]))
}

#[cfg(test)]
mod tests {
    #[test]
    fn parent_key_of_a_subtree_directory() {
        assert_eq!(super::parent_key(""), None);
        assert_eq!(super::parent_key("d/"), Some(""));
        assert_eq!(super::parent_key("d/e/"), Some("d/"));
        assert_eq!(super::parent_key("d/e/f/"), Some("d/e/"));
    }
}
