//! The slices of one download, shared by its request slots. A slot takes the next group
//! of consecutive slices from a queue; once the queue is empty, a slot that runs out of
//! work takes the second half of what is left of the running group with the most slices
//! left, whose request then stops at the new end. The last requests of a file then end
//! together instead of one slow connection finishing alone while the others idle.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Mutex;

/// Consecutive slice indices read by one request.
pub(super) type Group = Range<usize>;

/// Slices a running group must have left (the one being received included) for another
/// slot to take half: a new request costs a round trip and a slow start, which a slice
/// or two would hardly repay, and on a busy machine the connections already running
/// would have taken that share of the CPU anyway.
const MIN_LEFT: usize = 4;

pub(super) struct Work {
    inner: Mutex<Inner>,
}

struct Inner {
    queue: VecDeque<Group>,
    /// Per slot: the group it is reading, as (first slice not yet received, end).
    running: Vec<Option<(usize, usize)>>,
}

impl Work {
    pub(super) fn new(groups: Vec<Group>, slots: usize) -> Self {
        let inner = Inner { queue: groups.into(), running: vec![None; slots.max(1)] };
        Self { inner: Mutex::new(inner) }
    }

    pub(super) fn slots(&self) -> usize {
        self.lock().running.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next group for `slot`: from the queue, else the back half of the running group
    /// with the most slices left, if it has `MIN_LEFT` or more. `None`: nothing to share.
    pub(super) fn take(&self, slot: usize) -> Option<Group> {
        let mut w = self.lock();
        let g = match w.queue.pop_front() {
            Some(g) => Some(g),
            None => {
                let most = w.running.iter().enumerate().filter(|(s, _)| *s != slot);
                let most = most.filter_map(|(s, r)| r.map(|(n, e)| (e - n, s))).max();
                match most {
                    Some((left, victim)) if left >= MIN_LEFT => {
                        let (next, end) = w.running[victim].expect("chosen among running");
                        // The victim keeps the slice it is receiving and the first half.
                        let mid = next + left.div_ceil(2);
                        w.running[victim] = Some((next, mid));
                        Some(mid..end)
                    }
                    _ => None,
                }
            }
        };
        w.running[slot] = g.as_ref().map(|g| (g.start, g.end));
        g
    }

    /// The end of `slot`'s group as it stands now (it only ever moves down).
    pub(super) fn end(&self, slot: usize) -> usize {
        self.lock().running[slot].map_or(0, |(_, e)| e)
    }

    /// `slot` has received slice `i`: returns its group's end, so the caller stops there.
    pub(super) fn received(&self, slot: usize, i: usize) -> usize {
        let mut w = self.lock();
        match w.running[slot].as_mut() {
            Some(r) => {
                r.0 = i + 1;
                r.1
            }
            None => 0,
        }
    }

    /// `slot` stopped reading (its group is done, or it failed).
    pub(super) fn idle(&self, slot: usize) {
        self.lock().running[slot] = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_goes_first_then_the_longest_running_group_is_halved() {
        let w = Work::new(vec![0..8, 8..12], 3);
        assert_eq!(w.take(0), Some(0..8));
        assert_eq!(w.take(1), Some(8..12));
        // Slot 0 is receiving slice 2 of 0..8: 6 slices left, it keeps 2..5.
        assert_eq!(w.received(0, 1), 8);
        assert_eq!(w.take(2), Some(5..8));
        assert_eq!(w.end(0), 5);
        assert_eq!(w.received(0, 2), 5);
        // Now slot 1 (8..12, 4 left) has the most: halved too.
        assert_eq!(w.take(0), Some(10..12));
        assert_eq!(w.end(1), 10);
        // Slot 0's 3..5 (2 left) and slot 2's 5..8 (3 left) are too short to share.
        assert_eq!(w.take(0), None);
    }

    #[test]
    fn a_group_with_few_slices_left_is_not_split() {
        let w = Work::new(vec![Group { start: 0, end: MIN_LEFT }], 2);
        assert_eq!(w.take(0), Some(0..MIN_LEFT));
        assert_eq!(w.received(0, 0), MIN_LEFT);
        assert_eq!(w.take(1), None); // slice 1 is being received: one short
        w.idle(0);
        assert_eq!(w.take(0), None);
    }

    #[test]
    fn every_slice_is_read_once_whatever_the_interleaving() {
        // Slots receive one slice per turn, in turn, taking work whenever they have none.
        let n = 97;
        let w = Work::new(vec![0..40, 40..80, 80..97], 5);
        let mut seen = vec![0u32; n];
        let mut cur: Vec<Option<usize>> = vec![None; w.slots()];
        for round in 0..10_000 {
            let s = (round * 7) % w.slots();
            let i = match cur[s] {
                Some(i) => i,
                None => match w.take(s) {
                    Some(g) => g.start,
                    None => continue,
                },
            };
            seen[i] += 1;
            cur[s] = (i + 1 < w.received(s, i)).then_some(i + 1);
            if cur[s].is_none() {
                w.idle(s);
            }
        }
        assert!(seen.iter().all(|&c| c == 1), "{seen:?}");
    }
}
