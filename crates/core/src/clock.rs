//! The time that decides freshness: the metadata TTL of nodes and listings, negative
//! entries, listing renewal. The [`crate::Fs`] reads it from the [`Clock`] in its
//! [`crate::FsConfig`]: the real monotonic clock on a mount, a manual one in tests, which
//! then let a TTL run out by advancing it instead of sleeping.
//!
//! Only freshness goes through it. Timers (tokio sleeps), the write-back queue's delays and
//! durations logged for humans use the real clock. [`retry_backoff`] is the one retry
//! schedule of background work (write-back uploads, deferred deletes).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long background work waits before its retry number `attempts` (1 = the first):
/// doubling from 1 s to at most a minute. Such work is retried forever, never dropped.
pub fn retry_backoff(attempts: u32) -> Duration {
    Duration::from_secs(1u64 << attempts.min(6).saturating_sub(1)).min(Duration::from_secs(60))
}

/// A monotonic clock: real by default, or manual (see [`Clock::manual`]).
#[derive(Clone, Default)]
pub struct Clock {
    manual: Option<Arc<Manual>>,
}

/// A manual clock's time: `base` plus the nanoseconds it was advanced by.
struct Manual {
    base: Instant,
    advanced_ns: AtomicU64,
}

impl Clock {
    /// The real monotonic clock (`Instant::now`).
    pub fn real() -> Self {
        Self::default()
    }

    /// A clock that stands still at the moment it was made and moves only by
    /// [`Clock::advance`]. Clones share its time.
    pub fn manual() -> Self {
        Self { manual: Some(Arc::new(Manual { base: Instant::now(), advanced_ns: AtomicU64::new(0) })) }
    }

    pub fn now(&self) -> Instant {
        match &self.manual {
            None => Instant::now(),
            Some(m) => m.base + Duration::from_nanos(m.advanced_ns.load(Ordering::SeqCst)),
        }
    }

    /// Time since `at` (zero if `at` is later).
    pub fn since(&self, at: Instant) -> Duration {
        self.now().saturating_duration_since(at)
    }

    /// Move a manual clock forward by `by`.
    ///
    /// # Panics
    /// On the real clock: a test that means to control time and does not is a broken test.
    pub fn advance(&self, by: Duration) {
        let m = self.manual.as_ref().expect("Clock::advance on the real clock");
        m.advanced_ns.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.manual {
            None => f.write_str("Clock::real"),
            Some(m) => write!(f, "Clock::manual(+{:?})", Duration::from_nanos(m.advanced_ns.load(Ordering::SeqCst))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let c = Clock::manual();
        let t0 = c.now();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(c.now(), t0, "a manual clock stands still");
        let shared = c.clone();
        shared.advance(Duration::from_secs(2));
        assert_eq!(c.since(t0), Duration::from_secs(2), "clones share the time");
        assert_eq!(c.since(t0 + Duration::from_secs(9)), Duration::ZERO);
        let r = Clock::real();
        let t = r.now();
        std::thread::sleep(Duration::from_millis(5));
        assert!(r.since(t) >= Duration::from_millis(5));
    }
}
