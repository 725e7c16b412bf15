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

/// Longest request of a download. Idle slots take over the tail of a slow request and a
/// failed one resumes at its first unfinished slice, so a long request costs nothing; the
/// bound only hedges against servers that limit a request's duration.
const GROUP_MAX: u64 = 1024 << 20;

/// Cut `n` slices of `slice` bytes into groups for `parallel` slots. With `MIN_LEFT` or
/// more slices per slot: one group per slot (more if a group would pass `GROUP_MAX`), of
/// sizes that differ by one slice at most, so each slot pays a request's round trip and
/// slow start once and a slow one can be relieved. With fewer: one slice per group, and
/// the queue itself balances the slots.
pub(super) fn groups(n: usize, slice: u64, parallel: usize) -> Vec<Group> {
    let parallel = parallel.max(1);
    if n < MIN_LEFT * parallel {
        return (0..n).map(|i| i..i + 1).collect();
    }
    let most = (GROUP_MAX / slice.max(1)).max(1) as usize;
    let k = parallel.max(n.div_ceil(most));
    (0..k).map(|j| j * n / k..(j + 1) * n / k).collect()
}

pub(super) struct Work {
    inner: Mutex<Inner>,
}

struct Inner {
    queue: VecDeque<Group>,
    /// A slot failed for good: the others stop at their next slice boundary.
    aborted: bool,
    /// Per slot: the group it is reading, as (first slice not yet received, end).
    running: Vec<Option<(usize, usize)>>,
}

impl Work {
    pub(super) fn new(groups: Vec<Group>, slots: usize) -> Self {
        let inner = Inner { queue: groups.into(), aborted: false, running: vec![None; slots.max(1)] };
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
        if w.aborted {
            return None;
        }
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

    /// The end of `slot`'s group as it stands now (within a group it only moves down).
    pub(super) fn end(&self, slot: usize) -> usize {
        let w = self.lock();
        if w.aborted {
            return 0;
        }
        w.running[slot].map_or(0, |(_, e)| e)
    }

    /// `slot` has received slice `i`: returns its group's end, so the caller stops there.
    pub(super) fn received(&self, slot: usize, i: usize) -> usize {
        let mut w = self.lock();
        if w.aborted {
            return 0;
        }
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

    /// A slot failed for good: no slot starts anything more, and the running ones stop at
    /// their next slice boundary instead of reading a file that will be thrown away.
    pub(super) fn abort(&self) {
        let mut w = self.lock();
        w.aborted = true;
        w.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_one_per_slot_and_balanced_or_single_slices() {
        let mib = 1 << 20;
        // 1 GiB of 8 MiB slices, 8 slots: 8 groups of 16.
        let g = groups(128, 8 * mib, 8);
        assert_eq!(g.len(), 8);
        assert!(g.iter().all(|r| r.len() == 16));
        // 33 slices: 8 groups of 4 or 5, covering all of them in order.
        let g = groups(33, 8 * mib, 8);
        assert_eq!(g.len(), 8);
        assert!(g.iter().all(|r| r.len() == 4 || r.len() == 5), "{g:?}");
        assert!(g.windows(2).all(|w| w[0].end == w[1].start) && g[0].start == 0 && g[7].end == 33);
        // Fewer than MIN_LEFT per slot: single slices.
        assert_eq!(groups(24, 8 * mib, 8), (0..24).map(|i| i..i + 1).collect::<Vec<_>>());
        assert!(groups(0, 8 * mib, 8).is_empty());
        // 16 GiB: groups stay within GROUP_MAX (1 GiB = 128 slices).
        let g = groups(2048, 8 * mib, 8);
        assert_eq!(g.len(), 16);
        assert!(g.iter().all(|r| r.len() as u64 * 8 * mib <= GROUP_MAX));
    }

    #[test]
    fn the_queue_goes_first_then_the_longest_running_group_is_halved() {
        let w = Work::new(vec![0..8, 8..12], 4);
        assert_eq!(w.take(0), Some(0..8));
        assert_eq!(w.take(1), Some(8..12));
        // Slot 0 is receiving slice 2 of 0..8: 6 slices left, it keeps 2..5.
        assert_eq!(w.received(0, 1), 8);
        assert_eq!(w.take(2), Some(5..8));
        assert_eq!(w.end(0), 5);
        assert_eq!(w.received(0, 2), 5);
        // Now slot 1 (8..12, 4 left) has the most: halved too.
        assert_eq!(w.take(3), Some(10..12));
        assert_eq!(w.end(1), 10);
        // Slot 0's 3..5, slot 1's 8..10, slot 2's 5..8 and slot 3's 10..12 are too short.
        w.idle(3);
        assert_eq!(w.take(3), None);
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
    fn after_an_abort_nothing_starts_and_running_groups_stop() {
        let w = Work::new(vec![0..8, 8..16, 16..24], 2);
        assert_eq!(w.take(0), Some(0..8));
        w.abort();
        assert_eq!(w.received(0, 0), 0);
        assert_eq!(w.end(0), 0);
        assert_eq!(w.take(1), None);
    }

    /// Slots driven as the download drives them, in a random order, some stalling for a
    /// while (a retry's backoff) or failing mid-slice and resuming at that slice.
    #[test]
    fn every_slice_is_read_once_whatever_the_interleaving() {
        for seed in 1..200u64 {
            let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut rand = |n: usize| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % n as u64) as usize
            };
            let n = 1 + rand(120);
            let slots = 1 + rand(9);
            let per = 1 + rand(n);
            let groups: Vec<Group> = (0..n).step_by(per).map(|i| i..(i + per).min(n)).collect();
            let w = Work::new(groups, slots);
            let mut seen = vec![0u32; n];
            // Per slot: the slice it is on, and turns left to wait.
            let mut cur: Vec<Option<usize>> = vec![None; slots];
            let mut wait = vec![0usize; slots];
            let mut ended = vec![false; slots];
            while !ended.iter().all(|&e| e) {
                let s = rand(slots);
                if ended[s] {
                    continue;
                }
                if wait[s] > 0 {
                    wait[s] -= 1;
                    continue;
                }
                let i = match cur[s] {
                    Some(i) => i,
                    None => match w.take(s) {
                        Some(g) => g.start,
                        None => {
                            ended[s] = true;
                            continue;
                        }
                    },
                };
                if rand(10) == 0 {
                    // The request breaks mid-slice: back off, then ask again from slice i
                    // up to the group's end as it stands then.
                    wait[s] = rand(20);
                    cur[s] = (i < w.end(s)).then_some(i);
                    if cur[s].is_none() {
                        w.idle(s);
                    }
                    continue;
                }
                seen[i] += 1;
                cur[s] = (i + 1 < w.received(s, i)).then_some(i + 1);
                if cur[s].is_none() {
                    w.idle(s);
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "seed {seed}: {seen:?}");
        }
    }
}
