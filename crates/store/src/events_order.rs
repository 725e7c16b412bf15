//! Whether an event read from a queue (`sqs://`, `pubsub://`) is believed. Queues neither
//! order nor deduplicate, and a queue may hold events from before this mount:
//! - an event whose `sequencer` is not above the last one seen for its key (a duplicate, or
//!   one overtaken by a later event) is dropped;
//! - an event is believed only if it arrives within [`FRESH`] of its time and after the
//!   queue first answered (plus [`SKEW`]): a later one may be older than what the mount
//!   listed meanwhile. Others, those without a time, and those about a key whose sequencer
//!   was forgotten become [`Event::Changed`]: the mount asks the store rather than believe
//!   them. A believed event can thus be older than a listing by at most `FRESH`, until the
//!   next event of its key (or the next check) corrects it.
//! - A removal of one version of a versioned object may leave the object there:
//!   [`Event::Changed`] too.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::Event;

/// Keys whose last sequencer is remembered; past this, those older than [`FRESH`] +
/// [`SKEW`] are forgotten (their events are checked, not believed, anyway), and if that is
/// not enough, all.
const REMEMBERED: usize = 10_000;
/// Clock skew allowed between the store's event times and this machine.
const SKEW: Duration = Duration::from_secs(5);
/// How soon after its change an event must arrive to be believed.
pub(crate) const FRESH: Duration = Duration::from_secs(3);
/// How far ahead of this machine's clock an event's time may be and still be believed (the
/// store's clock runs fast): FRESH plus this stays inside the mount's 5 s own-change window.
const AHEAD: Duration = Duration::from_secs(2);

/// One event as a queue told it: the event, its `sequencer` (S3's, or one made from GCS's
/// generations), and when it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub event: Event,
    pub sequencer: Option<String>,
    pub time: Option<SystemTime>,
    /// A removal of one version (not a delete marker) in a versioned bucket: the object
    /// may still be there.
    pub version_delete: bool,
}

/// What decides whether a record from the queue is believed (see the module doc).
#[derive(Default)]
pub(crate) struct Order {
    /// The last sequencer seen per key (relative to the prefix), and when its event was.
    last: HashMap<String, (String, SystemTime)>,
    /// When sequencers of keys were last forgotten: an event of a key missing from `last`
    /// from before then may have been overtaken.
    forgot_at: Option<SystemTime>,
    /// When the queue first answered after a connect.
    pub up_at: Option<SystemTime>,
}

impl Order {
    /// The event to send for `rec` received at `now`, `None` to drop it.
    pub fn judge(&mut self, rec: Record, now: SystemTime) -> Option<Event> {
        let key = rec.event.key().to_string();
        let known = match (&rec.sequencer, self.last.get(&key)) {
            (Some(seq), Some((prev, _))) if sequencer_cmp(seq, prev) != std::cmp::Ordering::Greater => {
                return None; // a duplicate, or overtaken by a later event of its key
            }
            (Some(_), Some(_)) => true,
            _ => false,
        };
        if let Some(seq) = rec.sequencer.clone() {
            if self.last.len() >= REMEMBERED && !self.last.contains_key(&key) {
                self.forget(now);
            }
            self.last.insert(key.clone(), (seq, rec.time.unwrap_or(now)));
        }
        let believed = rec.time.is_some_and(|t| {
            let after_up = self.up_at.is_some_and(|up| t >= up + SKEW);
            let fresh = match now.duration_since(t) {
                Ok(late) => late <= FRESH,
                Err(ahead) => ahead.duration() <= AHEAD,
            };
            let placed = known || self.forgot_at.is_none_or(|f| t > f + SKEW);
            after_up && fresh && placed
        });
        if !believed || rec.version_delete {
            return Some(Event::Changed { key });
        }
        Some(rec.event)
    }

    /// Make room in `last`: drop what is too old to be believed anyway, else everything.
    fn forget(&mut self, now: SystemTime) {
        let horizon = now - FRESH - SKEW;
        self.last.retain(|_, (_, t)| *t > horizon);
        if self.last.len() >= REMEMBERED / 2 {
            self.last.clear();
            self.forget_at(now);
        } else {
            self.forget_at(horizon);
        }
    }

    fn forget_at(&mut self, t: SystemTime) {
        self.forgot_at = Some(self.forgot_at.map_or(t, |f| f.max(t)));
    }
}

/// Order two sequencers of one key: hex strings of any length, the shorter padded with zeros
/// on the left (as AWS documents).
pub(crate) fn sequencer_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let width = a.len().max(b.len());
    let pad = |s: &str| format!("{s:0>width$}").to_ascii_uppercase();
    pad(a).cmp(&pad(b))
}

#[cfg(test)]
#[path = "events_order_tests.rs"]
mod tests;
