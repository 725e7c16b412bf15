//! The pending changes of [`DeferredDeletes`] by key, with what keeps the background's
//! work per change independent of how many are pending (an `rm -rf` of 100,000 files
//! against a slow store queues that many): when each is due, as a queue of hints, and
//! whether any move is pending (most drains then look at one key, not every entry).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Instant;

use super::Pending;

#[derive(Default)]
pub(super) struct Table {
    entries: BTreeMap<String, Pending>,
    /// (when, key): the entry became due then. A hint is stale when its entry has gone, is
    /// in flight or is due later (a later hint says when): it is skipped. Every change that
    /// leaves an entry waiting to be sent pushes one ([`Table::insert`], [`Table::hint`]).
    due: BinaryHeap<Reverse<(Instant, String)>>,
    /// Entries with a source (moves), counted at insert and removal, and where a change in
    /// place clears one ([`Table::source_cleared`]).
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
        self.moves += e.source.is_some() as usize;
        let old = self.entries.insert(key, e);
        self.moves -= old.as_ref().is_some_and(|o| o.source.is_some()) as usize;
        old
    }

    pub(super) fn remove(&mut self, key: &str) -> Option<Pending> {
        let old = self.entries.remove(key);
        self.moves -= old.as_ref().is_some_and(|o| o.source.is_some()) as usize;
        old
    }

    /// An entry's source was cleared in place (a later change took the move's place).
    pub(super) fn source_cleared(&mut self) {
        self.moves = self.moves.saturating_sub(1);
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
