//! The pending changes of [`DeferredDeletes`] by key (each a [`Pending`] entry, journaled), with what keeps the background's
//! work per change independent of how many are pending (an `rm -rf` of 100,000 files
//! against a slow store queues that many): when each is due, as a queue of hints, and
//! whether any move is pending (most drains then look at one key, not every entry).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::path::PathBuf;
use std::time::Instant;

use bucketfs_store::StoreError;

#[derive(Default)]
pub(super) struct Table {
    entries: BTreeMap<String, Pending>,
    /// (when, key): the entry became due then. A hint is stale when its entry has gone, is
    /// in flight or is due later (a later hint says when): it is skipped. Every change that
    /// leaves an entry waiting to be sent pushes one ([`Table::insert`], [`Table::hint`]).
    due: BinaryHeap<Reverse<(Instant, String)>>,
    /// Entries with a source or one in flight (moves, [`Pending::moving`]), counted at insert
    /// and removal, and where a change in place alters one ([`Table::recount`]).
    moves: usize,
}

impl std::ops::Deref for Table {
    type Target = BTreeMap<String, Pending>;
    fn deref(&self) -> &Self::Target {
        &self.entries
    }
}

/// For changes of entries in place. Adding and removing go through [`Table::insert`] and
/// [`Table::remove`] (found before these), which keep the counts.
impl std::ops::DerefMut for Table {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.entries
    }
}

impl Table {
    pub(super) fn insert(&mut self, key: String, e: Pending) -> Option<Pending> {
        self.hint(e.next_try, &key);
        self.moves += e.moving() as usize;
        let old = self.entries.insert(key, e);
        self.moves -= old.as_ref().is_some_and(Pending::moving) as usize;
        old
    }

    pub(super) fn remove(&mut self, key: &str) -> Option<Pending> {
        let old = self.entries.remove(key);
        self.moves -= old.as_ref().is_some_and(Pending::moving) as usize;
        old
    }

    /// An entry changed in place from moving (`was`) to moving or not (`is`).
    pub(super) fn recount(&mut self, was: bool, is: bool) {
        self.moves = (self.moves + is as usize).saturating_sub(was as usize);
    }

    /// `key`'s entry waits to be sent at `at` (again: after a failure, a replacement).
    pub(super) fn hint(&mut self, at: Instant, key: &str) {
        self.due.push(Reverse((at, key.to_string())));
    }

    /// Whether a change is pending at the marker of a directory above `key` (`a/` and
    /// `a/b/` for `a/b/c` or `a/b/c/`), found by key.
    pub(super) fn marker_above(&self, key: &str) -> bool {
        key.match_indices('/').any(|(i, _)| i + 1 < key.len() && self.entries.contains_key(&key[..=i]))
    }

    /// Whether a move may be pending: if not, no entry has a source to look at.
    pub(super) fn any_move(&self) -> bool {
        self.moves > 0
    }

    /// Up to `room` entries due by `now`, marked in flight; and when the next one is due.
    pub(super) fn take_due(&mut self, room: usize, now: Instant) -> (Vec<String>, Option<Instant>) {
        let mut due = Vec::new();
        while due.len() < room {
            match self.due.peek() {
                Some(Reverse((at, _))) if *at <= now => {}
                _ => break,
            }
            let Some(Reverse((_, key))) = self.due.pop() else { break };
            if let Some(e) = self.entries.get_mut(&key).filter(|e| !e.in_flight && e.next_try <= now) {
                e.in_flight = true;
                due.push(key);
            }
        }
        (due, self.due.peek().map(|Reverse((at, _))| *at))
    }
}

/// What is pending for a key.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Op {
    Delete,
    /// Create the directory marker (`mkdir`).
    Marker,
    /// Copy [`Pending::source`] to the key, then delete the source (a file's rename).
    Move,
    /// Put the link object [`Pending::target`] (`symlink`).
    Link,
}

pub(super) struct Pending {
    pub(super) journal: PathBuf,
    pub(super) op: Op,
    /// Bumped when a later change takes this one's place: an attempt of the older one that
    /// ends afterwards does not end the newer.
    pub(super) gen: u64,
    pub(super) in_flight: bool,
    pub(super) attempts: u32,
    /// When the last attempt failed, and why (only an outage keeps a delete pending).
    pub(super) failed: Option<(Instant, StoreError)>,
    pub(super) next_try: Instant,
    /// An upload to the key may still land: delete it again `LANDING_GRACE` after the
    /// first success (see [`DeferredDeletes::defer_landing`]).
    pub(super) again: bool,
    /// The second delete waits until then, also for a drain (`bucketfs sync`).
    pub(super) not_before: Option<Instant>,
    /// Delete only an object with one of these MD5s (see [`delete_if_ours`]).
    pub(super) only: Option<Vec<[u8; 16]>>,
    /// [`Op::Move`]'s old key: a request that could see it waits as for the key itself.
    pub(super) source: Option<String>,
    /// The old key of a move still in flight that a later change took the place of: it may
    /// still copy that key and delete it, so a request that could see it waits until that
    /// attempt ends, as for [`Pending::source`] (an upload to it meanwhile was deleted).
    pub(super) flying: Option<String>,
    /// [`Op::Move`] of a file whose move to [`Pending::source`] is pending too (journaled
    /// before it): that one goes first, not after as for any other change of the key.
    pub(super) after: bool,
    /// [`Op::Link`]'s target: the link object's content.
    pub(super) target: Option<String>,
    /// A delete that took the place of a marker's or link's put still in flight: should
    /// that attempt fail (cut off, it may land later), the delete is sent twice (`again`);
    /// if it succeeds, once is enough (`rmdir` right after `mkdir` made a listing of the
    /// parent wait out the second delete's grace).
    pub(super) after_put_in_flight: bool,
    /// [`Op::Move`]: the version of the file it moves, where this mount's caches hold it.
    pub(super) carries: Option<super::MovedVersion>,
    /// [`Op::Delete`] of an unlinked file: the tag of the version it had. A delete sent
    /// [`Pending::late`] takes only that version, so another client's object written there
    /// meanwhile stays.
    pub(super) version: Option<String>,
    /// An attempt failed (the store out), or an earlier mount left it pending: it goes
    /// late, maybe long after the unlink.
    pub(super) late: bool,
    /// [`Op::Move`]: what its target held at the rename, where the mount knew. A move sent
    /// late copies over the target only while it still holds that (`DeferredDeletes::send_move`).
    pub(super) target_was: Option<Held>,
    /// [`Op::Move`]: the tag of the version renamed, under [`Pending::source`], where the
    /// mount knew it (journaled, so the next mount's move checks it too). A move sent late
    /// moves nothing if the source holds another version by then (`send_move`).
    pub(super) renamed: Option<String>,
}

/// What a move's target key held when the rename was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Held {
    /// No object the mount knew of.
    Nothing,
    /// The object of this tag (the rename replaced it).
    Version(String),
}

impl Held {
    /// As a move's journal entry keeps it (the field after the old key).
    pub(super) fn journaled(&self) -> String {
        match self {
            Held::Nothing => "n".to_string(),
            Held::Version(tag) => format!("t{tag}"),
        }
    }

    /// [`Held::journaled`] read back; `None` for an entry without it (unknown).
    pub(super) fn parse(text: &str) -> Option<Self> {
        match text.split_at_checked(1) {
            Some(("n", "")) => Some(Held::Nothing),
            Some(("t", tag)) if !tag.is_empty() => Some(Held::Version(tag.to_string())),
            _ => None,
        }
    }
}

impl Pending {
    pub(super) fn new(journal: PathBuf) -> Self {
        Self {
            journal,
            op: Op::Delete,
            gen: 0,
            in_flight: false,
            attempts: 0,
            failed: None,
            next_try: Instant::now(),
            again: false,
            not_before: None,
            only: None,
            source: None,
            flying: None,
            after: false,
            target: None,
            after_put_in_flight: false,
            carries: None,
            version: None,
            late: false,
            target_was: None,
            renamed: None,
        }
    }

    /// Whether `hit` takes this entry, pending under `key`: a pending rename is seen under
    /// its old key as well.
    pub(super) fn seen(&self, key: &str, hit: impl Fn(&str) -> bool) -> bool {
        hit(key) || self.source.as_deref().is_some_and(&hit) || self.flying.as_deref().is_some_and(&hit)
    }

    /// Whether the entry is a move, or one is still in flight for it: a request over its
    /// old key must look at it.
    pub(super) fn moving(&self) -> bool {
        self.source.is_some() || self.flying.is_some()
    }

    /// Whether a change of `key` must wait for this entry: a move from `key` (not one that
    /// goes after that change, [`Pending::after`]), or one still in flight from it.
    pub(super) fn moves_from(&self, key: &str) -> bool {
        self.source.as_deref() == Some(key) && !self.after || self.flying.as_deref() == Some(key)
    }

    pub(super) fn forget_journal(self) {
        let _ = crate::recycle::remove(&self.journal);
    }
}

pub(super) fn hex_md5s(md5s: &[[u8; 16]]) -> String {
    let hex = |m: &[u8; 16]| m.iter().map(|b| format!("{b:02x}")).collect::<String>();
    md5s.iter().map(hex).collect::<Vec<_>>().join(",")
}

/// [`hex_md5s`] read back; `None` (delete whatever is there) if none reads as an MD5.
pub(super) fn parse_md5s(text: &str) -> Option<Vec<[u8; 16]>> {
    Some(text.split(',').filter_map(bucketfs_store::parse_md5_hex).collect::<Vec<_>>()).filter(|v| !v.is_empty())
}
