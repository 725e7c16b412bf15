//! What the inode table knows of directories' contents: the cached listings, names found
//! absent, names removed here, the change count that decides whether a store answer may
//! still be recorded (`changed_at`, `set_listing_since`), and the renames moving objects.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{ChildMeta, InodeTable, Kind, Listing, Moving, ABSENT_MAX, NAMED_MAX, RELIST_MAX};

impl InodeTable {
    /// A probe begun at change count `since` found `name` absent from `dir`; not recorded if
    /// `dir` changed here meanwhile (the answer may predate a create).
    pub fn note_absent(&mut self, dir: u64, name: &str, since: u64) {
        let here = self.index.contains_key(&(dir, name.to_string()));
        if self.changed_at(dir) > since || here || self.moving_name(dir, name) {
            return;
        }
        if self.absent.len() >= ABSENT_MAX {
            let mut ages: Vec<Instant> = self.absent.values().copied().collect();
            ages.sort();
            let cut = ages[ages.len() / 2];
            self.absent.retain(|_, at| *at > cut);
        }
        self.absent.insert((dir, name.to_string()), self.clock.now());
        capped_insert(&mut self.missed, dir, (self.clock.now(), name.to_string()));
    }

    /// A probe found `name` in `dir` (see `found`).
    pub fn note_found(&mut self, dir: u64, name: &str) {
        capped_insert(&mut self.found, dir, (self.clock.now(), name.to_string()));
    }

    /// Whether `last` (`missed` or `found`) holds another name than `name` for `dir`, recorded
    /// less than `ttl` ago.
    fn other_name_recent(&self, last: &HashMap<u64, (Instant, String)>, dir: u64, name: &str, ttl: Duration) -> bool {
        last.get(&dir).is_some_and(|(at, n)| n != name && self.clock.since(*at) < ttl)
    }

    /// Whether to check `dir`'s width before probing `name` (see `found`): a probe found
    /// another name in it less than `ttl` ago, and its width is neither known nor checked
    /// within `ttl`.
    pub fn width_worth_checking(&self, dir: u64, name: &str, ttl: Duration) -> bool {
        self.other_name_recent(&self.found, dir, name, ttl)
            && self.width_checked.get(&dir).is_none_or(|at| self.clock.since(*at) >= ttl)
            && !self.is_wide(dir)
    }

    /// `dir`'s width is being checked now: no other lookup checks it within the TTL.
    pub fn note_width_checked(&mut self, dir: u64) {
        capped_insert(&mut self.width_checked, dir, self.clock.now());
    }

    /// Whether `dir` holds more children than one listing is worth: a listing for lookups
    /// stopped there ([`InodeTable::mark_wide`]), or its last listing (fresh or not) held more.
    pub fn is_wide(&self, dir: u64) -> bool {
        self.wide.contains(&dir) || self.listing(dir).is_some_and(|l| l.children.len() > RELIST_MAX)
    }

    /// Whether a probe found another name than `name` absent from `dir` less than `ttl` ago,
    /// and `dir` is not known to be too wide to list for that.
    pub fn missed_another(&self, dir: u64, name: &str, ttl: Duration) -> bool {
        self.other_name_recent(&self.missed, dir, name, ttl) && !self.wide.contains(&dir)
    }

    /// A listing of `dir` for lookups failed: its names are probed until the next miss.
    pub fn forget_missed(&mut self, dir: u64) {
        self.missed.remove(&dir);
    }

    /// A listing of `dir` stopped at more children than one listing is worth.
    pub fn mark_wide(&mut self, dir: u64) {
        self.wide.insert(dir);
    }

    /// Whether a probe found `name` absent from `dir` less than `ttl` ago and nothing here
    /// has made it since.
    pub fn known_absent(&self, dir: u64, name: &str, ttl: std::time::Duration) -> bool {
        let k = (dir, name.to_string());
        self.absent.get(&k).is_some_and(|at| self.clock.since(*at) < ttl) && !self.index.contains_key(&k)
    }

    pub(super) fn note_removed(&mut self, parent: u64, name: &str) {
        self.change_seq += 1; // a listing sent from now on knows of the removal
        self.removed.insert((parent, name.to_string()), self.change_seq);
    }

    /// Whether this mount removed `name` from `dir` and has not seen it since: a listing
    /// overtaken by that change (`Listing::overtaken`) names it, but no node is made of it.
    pub fn removed_here(&self, dir: u64, name: &str) -> bool {
        self.removed.contains_key(&(dir, name.to_string()))
    }

    /// Drop the removal records of `dir` made at or before change count `upto` (a listing
    /// sent after them is recorded: it knows), or all of them (`u64::MAX`: the directory
    /// itself went).
    pub(super) fn forget_removed_in(&mut self, dir: u64, upto: u64) {
        forget_in(&mut self.removed, dir, upto);
    }

    /// A change here of `dir` as a whole (see `whole`).
    pub(super) fn note_change(&mut self, dir: u64) {
        self.note_dir_change(dir);
        self.whole.insert(dir, self.change_seq);
    }

    /// A change here of `name` in `dir` alone (see `named`).
    pub(super) fn note_name_change(&mut self, dir: u64, name: &str) {
        if self.names_alias {
            return self.note_change(dir);
        }
        self.note_dir_change(dir);
        if self.named.len() >= NAMED_MAX {
            // Folded into whole changes, later than any of them: it errs on the safe side.
            let dirs: std::collections::HashSet<u64> = self.named.keys().map(|(d, _)| *d).collect();
            for d in dirs {
                self.whole.insert(d, self.change_seq);
            }
            self.named.clear();
        }
        self.named.insert((dir, name.to_string()), self.change_seq);
    }

    fn note_dir_change(&mut self, dir: u64) {
        self.change_seq += 1;
        self.changed.insert(dir, self.change_seq);
        if self.events_since.is_some() {
            self.changed_when.insert(dir, self.clock.now());
        }
    }

    /// Whether this mount changed `name` in `dir` (or `dir` as a whole) after a request
    /// sent at change count `asked` (0: an answer of no known age, never older).
    pub(super) fn changed_here_after(&self, dir: u64, name: &str, asked: u64) -> bool {
        asked != 0
            && (self.named.get(&(dir, name.to_string())).is_some_and(|&s| s > asked)
                || self.whole.get(&dir).is_some_and(|&s| s > asked))
    }

    /// Drop the per-name change records of `dir` made at or before change count `upto`.
    pub(super) fn forget_named_in(&mut self, dir: u64, upto: u64) {
        forget_in(&mut self.named, dir, upto);
    }

    /// `listing` of `dir`, sent at change count `since`, with the mount's state for the
    /// names of `dir` changed here since: each as its node holds it, or absent if it was
    /// removed here. `false` if a changed name has neither (its node forgotten by the
    /// kernel meanwhile): it is then as the listing held shows it, if one is, and the
    /// listing is distrusted whole.
    /// A name a rename moves now counts as changed here too: it shows as the mount holds
    /// it (a target not yet taken is absent), whatever the store showed mid-move.
    fn merge_own_changes(&self, dir: u64, listing: &mut Listing, since: u64) -> bool {
        let changed = names_in(&self.named, dir).filter(|(_, s)| **s > since).map(|((_, name), _)| name);
        let moving = self.moving.iter().flat_map(|(_, m)| &m.names).filter(|(d, _)| *d == dir).map(|(_, n)| n);
        let names: std::collections::BTreeSet<&String> = changed.chain(moving).collect();
        // Every name the mount can tell is merged, even when one cannot be: the readdir
        // that asked is answered from this listing (overtaken or not), and stopping at the
        // first unknown name left out the names after it (tester X: `rename(a, b)`, then
        // a listing without `b`, while other renames ran in the directory).
        let mut whole = true;
        for name in names {
            if let Some(n) = self.child(dir, name) {
                listing.children.insert(name.clone(), n.entry());
            } else if self.removed_here(dir, name) || self.moving_name(dir, name) {
                listing.children.remove(name);
            } else {
                // Its node forgotten (the kernel let go of it): the listing held shows it
                // as this mount last recorded it, there or not (tester X: a file made here
                // missing from a listing, with `--max-cached-entries`).
                whole = false;
                match self.listings.get(&dir).map(|l| l.children.get(name)) {
                    Some(Some(held)) => _ = listing.children.insert(name.clone(), held.clone()),
                    Some(None) => _ = listing.children.remove(name),
                    None => {}
                }
            }
        }
        whole
    }

    /// The change count now: take it before listing the store, pass it to
    /// [`InodeTable::set_listing_since`].
    pub fn change_seq(&self) -> u64 {
        self.change_seq
    }

    /// The change count of `dir`'s latest record of a name removed or changed here (0: none).
    pub(super) fn last_name_record(&self, dir: u64) -> u64 {
        names_in(&self.removed, dir).chain(names_in(&self.named, dir)).map(|(_, s)| *s).max().unwrap_or(0)
    }

    /// A ticket for a request about to be sent: the change count, moved on so that no two
    /// requests share one. An answer is recorded on a name only if no change here to that
    /// name, and no answer to a request sent later, is newer (`set_listing_since`,
    /// `upsert`, `ChildMeta::asked`).
    pub fn ask(&mut self) -> u64 {
        self.change_seq += 1;
        self.change_seq
    }

    /// A recursive page showed `dir`'s subtree to be bigger than a page.
    pub fn mark_big_subtree(&mut self, dir: u64) {
        self.big_subtrees.insert(dir);
    }

    pub fn is_big_subtree(&self, dir: u64) -> bool {
        self.big_subtrees.contains(&dir)
    }

    /// A listing of the directory with key `dir` held (`hidden`) keys that are not shown,
    /// or held none.
    pub fn note_hidden(&mut self, dir: &str, hidden: bool) {
        if hidden {
            self.hidden_in.insert(dir.to_string());
        } else if !self.hidden_in.is_empty() {
            self.hidden_in.remove(dir);
        }
    }

    /// Whether the directory with key `dir` was last listed with keys that are not shown.
    pub fn holds_hidden(&self, dir: &str) -> bool {
        self.hidden_in.contains(dir)
    }

    /// The count at `dir`'s latest change recorded here (0: none); `u64::MAX` while a
    /// rename moves the objects below `dir` (it is the directory moved, or inside it; see
    /// `moving_now`): every answer about it taken meanwhile counts as overtaken.
    pub fn changed_at(&self, dir: u64) -> u64 {
        if self.moving_now(dir) {
            return u64::MAX;
        }
        self.changed.get(&dir).copied().unwrap_or(0)
    }

    /// [`InodeTable::changed_at`], counting only changes of `dir` as a whole (`whole`).
    fn changed_whole_at(&self, dir: u64) -> u64 {
        if self.moving_now(dir) {
            return u64::MAX;
        }
        self.whole.get(&dir).copied().unwrap_or(0)
    }

    /// Whether a rename in progress moves `dir`'s objects (`dir` is moved, or is below),
    /// or, on Google Drive (`names_alias`), moves a name in or out of `dir`: there a
    /// listing taken meanwhile may show the name twice, the second as `stem~ID8`, a name
    /// the merge of the two moving ones does not cover.
    pub(crate) fn moving_now(&self, dir: u64) -> bool {
        let alias = |m: &Moving| self.names_alias && m.names.iter().any(|(d, _)| *d == dir);
        self.nodes.get(&dir).is_some_and(|d| self.moving_key(&d.key)) || self.moving.iter().any(|(_, m)| alias(m))
    }

    /// Whether a rename in progress moves `key` (it is a source, a target or a replaced
    /// key, or below a directory moved): the store's answers about it may describe either
    /// file, or neither.
    pub fn moving_key(&self, key: &str) -> bool {
        self.moving.iter().any(|(_, m)| m.covers(key))
    }

    /// Whether a rename in progress moves a file from or to `name` in `dir`.
    pub fn moving_name(&self, dir: u64, name: &str) -> bool {
        self.moving.iter().any(|(_, m)| m.names.iter().any(|(d, n)| *d == dir && n == name))
    }

    /// A rename is about to change the store: `from_name` in `from_dir` (key `keys[0]`)
    /// goes to `to_name` in `to_dir`. Until [`InodeTable::end_move`], after the table
    /// records the move, the store shows what the table does not yet (the target's object
    /// already replaced, the source's gone, a directory half copied). For those two names
    /// alone, an answer taken meanwhile is not the truth: a listing of either directory
    /// takes the mount's state for them (`merge_own_changes`) and stands for its other
    /// names; a HEAD of a key moved is not recorded (it put the new file's size on the
    /// replaced one, whose open handle then read nothing: model test), nor a missing
    /// object unlinks its node, and `upsert` leaves the nodes under those keys as they
    /// are. Answers about a directory moved, or below it, are distrusted whole
    /// (`changed_at`). `keys`: the source's, the target's, and a replaced target's key
    /// where it differs (a link's). Returns the move's id, for [`InodeTable::end_move`].
    pub fn begin_move(&mut self, from: (u64, &str), to: (u64, &str), keys: Vec<String>) -> u64 {
        self.note_name_change(from.0, from.1);
        self.note_name_change(to.0, to.1);
        self.moves_begun += 1;
        let names = [(from.0, from.1.to_string()), (to.0, to.1.to_string())];
        self.moving.push((self.moves_begun, Moving { names, keys }));
        self.moves_begun
    }

    /// The move begun by [`InodeTable::begin_move`] is recorded (`done`), or failed: answers
    /// about its names count from now on, those sent before count as overtaken by it. A
    /// move that failed half-way may have left the store in a state the table does not
    /// hold (a target copied, a source not deleted, a directory half moved): both
    /// directories then count as changed whole, so a listing taken meanwhile is not
    /// trusted and their names are asked for again.
    pub fn end_move(&mut self, id: u64, done: bool) {
        if let Some(i) = self.moving.iter().position(|(m, _)| *m == id) {
            let (_, m) = self.moving.swap_remove(i);
            for (dir, name) in &m.names {
                match done {
                    true => self.note_name_change(*dir, name),
                    false => self.note_change(*dir),
                }
            }
        }
    }

    /// Record a child created or changed here in `dir`'s cached listing (if any).
    /// Put `ino`'s current size and identity into its parent's cached listing.
    pub fn relist(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get(&ino) {
            let (parent, entry) = (n.parent, n.entry());
            self.listing_insert(parent, entry);
        }
    }

    pub fn listing_insert(&mut self, dir: u64, meta: ChildMeta) {
        self.note_name_change(dir, &meta.name);
        self.absent.remove(&(dir, meta.name.clone()));
        if let Some(l) = self.listings.get_mut(&dir) {
            l.children.insert(meta.name.clone(), meta);
        }
    }

    /// Drop `name` from `dir`'s cached listing and from the path index.
    pub fn listing_remove(&mut self, dir: u64, name: &str) {
        self.listing_move_out(dir, name);
        self.unlink(dir, name);
    }

    /// Drop `name` from `dir`'s cached listing: its node moves (the caller relocates it
    /// next; unlinked, a node nothing refers to would go).
    pub fn listing_move_out(&mut self, dir: u64, name: &str) {
        self.note_name_change(dir, name);
        if let Some(l) = self.listings.get_mut(&dir) {
            l.children.remove(name);
        }
    }

    /// A store answer (a HEAD: a name gone, or replaced by another client) changed what
    /// `dir` shows. Not a change made here, so a listing sent before it is not merged with
    /// the mount's state for that name (it may be newer than the answer): it lands
    /// overtaken, as after any change of the directory as a whole.
    pub fn note_store_answer(&mut self, dir: u64) {
        self.note_change(dir);
    }

    /// Forget `dir`'s cached listing so the next readdir asks the store.
    pub fn invalidate_listing(&mut self, dir: u64) {
        self.note_change(dir);
        self.drop_listing(dir);
    }

    /// Move `ino` to (`parent`, `name`), rewriting the keys of it and everything below it.
    /// Mark every node whose key starts with `prefix` as last validated `at` and drop the
    /// listings of the directories there (entries carry identities), so that the next
    /// lookup or open asks the store. Each such directory counts as changed: a listing
    /// fetched before (of the old keys, with the old identities) is installed overtaken.
    /// Returns the directories it expired.
    pub fn expire_below(&mut self, prefix: &str, at: std::time::Instant) -> Vec<u64> {
        let mut dirs = Vec::new();
        for n in self.nodes.values_mut().filter(|n| n.key.starts_with(prefix)) {
            n.validated = at;
            if n.kind == Kind::Dir {
                dirs.push(n.ino);
            }
        }
        for &d in &dirs {
            self.drop_listing(d);
            // A listing or HEAD of the old keys in flight must not land as current.
            self.note_change(d);
            // Names probed absent under the old keys say nothing of the new ones.
            self.absent.retain(|(dir, _), _| *dir != d);
            self.missed.remove(&d);
        }
        dirs
    }

    pub fn listing(&self, dir: u64) -> Option<&Listing> {
        self.listings.get(&dir)
    }

    /// `dir` has a listing within its TTL.
    pub fn listing_fresh(&self, dir: u64) -> bool {
        self.listing(dir).is_some_and(|l| self.trusted(l))
    }

    /// Let `dir`'s listing answer for another TTL from now, as it is; its age before.
    pub fn renew_listing(&mut self, dir: u64, ttl: std::time::Duration) -> Option<std::time::Duration> {
        let l = self.listings.get_mut(&dir)?;
        let now = self.clock.now();
        let age = now.saturating_duration_since(l.at);
        // Fresh for `ttl` more, from when it was fetched: moving `at` to now would make a
        // listing from before the store's events began look vouched for by them.
        if !l.valid_for.is_zero() {
            l.valid_for = l.valid_for.max(age.saturating_add(ttl));
        }
        Some(age)
    }

    pub fn set_listing(&mut self, dir: u64, listing: Listing) {
        self.put_listing(dir, listing);
    }

    /// Install a listing fetched from the store after [`InodeTable::change_seq`] was
    /// `since`. Names of `dir` changed here meanwhile (a create, upload, unlink or rename
    /// the listing may or may not include) take the mount's state, and the listing stands
    /// for the rest (a busy directory's lookups are not probed name by name). If `dir`
    /// changed as a whole meanwhile (a rename moving its objects, its keys rewritten, a
    /// store event), or a changed name's state is no longer held, it is installed already
    /// stale: it serves the readdir that asked for it, but lookups and the next readdir ask
    /// the store again instead of trusting it (found by the shuttle model,
    /// crates/core/tests/model.rs).
    ///
    /// A listing sent before the one `dir` holds now (an answer held up, landing late) is
    /// older news: it is not recorded at all. It may show a name removed here whose record
    /// the newer listing cleared (it knew of the removal), and so bring it back (found by
    /// the property test: a directory renamed away came back).
    pub fn set_listing_since(&mut self, dir: u64, mut listing: Listing, since: u64) {
        if self.has_newer_listing(dir, since) || !self.nodes.contains_key(&dir) {
            return; // older news, or a directory gone meanwhile
        }
        self.answered.insert(dir, since);
        for c in listing.children.values_mut() {
            c.asked = since; // its entries are answers sent at `since` (see `upsert`)
        }
        if self.changed_whole_at(dir) > since || !self.merge_own_changes(dir, &mut listing, since) {
            listing.valid_for = std::time::Duration::ZERO;
            listing.overtaken = true;
        } else if !listing.valid_for.is_zero() {
            // Trusted for the TTL from when it arrived, as a HEAD's attributes are: an
            // answer slower than the TTL would otherwise land stale, and every lookup it
            // was meant to answer would list again (a loaded machine: one LIST and one HEAD
            // per `stat`). `at` stays the sending time, which events are compared with.
            listing.valid_for += self.clock.now().saturating_duration_since(listing.at);
        }
        // Removals before the listing was sent are in it (a delete is done, or pending and
        // waited for, before a listing of its prefix goes out: deletes.rs).
        self.forget_removed_in(dir, since);
        self.forget_named_in(dir, since);
        if listing.children.len() <= RELIST_MAX {
            self.wide.remove(&dir); // it shrank: one listing answers its lookups again
        }
        self.put_listing(dir, listing);
    }

    /// Whether `dir` holds (or held, until it was dropped: [`InodeTable::evict_dir`]) a
    /// listing sent after change count `since` (see [`InodeTable::set_listing_since`]).
    pub fn has_newer_listing(&self, dir: u64, since: u64) -> bool {
        self.answered.get(&dir).is_some_and(|&at| at > since)
    }
}

/// A per-name record map (`removed`, `named`: change count by (directory, name)).
type NameRecords = std::collections::BTreeMap<(u64, String), u64>;

/// The records of `dir` in `map`, as a range.
fn names_in(map: &NameRecords, dir: u64) -> impl Iterator<Item = (&(u64, String), &u64)> {
    map.range((dir, String::new())..).take_while(move |((d, _), _)| *d == dir)
}

/// Drop the records of `dir` in `map` made at or before change count `upto`.
fn forget_in(map: &mut NameRecords, dir: u64, upto: u64) {
    let gone: Vec<(u64, String)> = names_in(map, dir).filter(|(_, s)| **s <= upto).map(|(k, _)| k.clone()).collect();
    for k in gone {
        map.remove(&k);
    }
}

/// Record `k` in a per-directory map of recent probes, emptied past [`ABSENT_MAX`] entries
/// (they only save requests: losing them costs a probe).
fn capped_insert<V>(map: &mut HashMap<u64, V>, k: u64, v: V) {
    if map.len() >= ABSENT_MAX {
        map.clear();
    }
    map.insert(k, v);
}
