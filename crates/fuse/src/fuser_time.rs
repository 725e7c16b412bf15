//! Undo fuser 0.18's misreading of times before 1970 in requests.
//!
//! The kernel sends a time as a timespec `(sec, nsec)` with `0 <= nsec < 1e9`, the time
//! being `sec + nsec / 1e9`: 23:59:59.5 on 1969-12-31 is `(-1, 500_000_000)`. fuser's
//! `system_time_from_time` turns a negative `sec` into `UNIX_EPOCH - (-sec + nsec / 1e9)`
//! (its own TODO says so), subtracting the fraction instead of adding it: that time becomes
//! -1.5 s. Its replies (`time_from_system_time`) are right, so only request times need this.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The time the kernel sent, from the `SystemTime` fuser made of it (setattr's mtime).
///
/// fuser gives `UNIX_EPOCH - (a + n)` for the timespec `(-a, n)`, whose time is
/// `-a + n = -(a - n)`. Times from the epoch on, and whole seconds before it, are right
/// as they are. Apply it only to a time fuser converted from a request, and only once.
pub(crate) fn fuser_time_fixed(t: SystemTime) -> SystemTime {
    let Err(before) = t.duration_since(UNIX_EPOCH) else { return t };
    let d = before.duration();
    let (a, n) = (d.as_secs(), d.subsec_nanos());
    // Under a second before the epoch (`a == 0`) fuser cannot have made: its `sec` was
    // negative, so `a >= 1`. Left as it is.
    if n == 0 || a == 0 {
        return t;
    }
    UNIX_EPOCH - (Duration::from_secs(a) - Duration::from_nanos(n.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// fuser 0.18's conversion of a request's timespec, as in its `time.rs`.
    fn as_fuser_reads(secs: i64, nsecs: u32) -> SystemTime {
        if secs >= 0 {
            UNIX_EPOCH + Duration::new(secs as u64, nsecs)
        } else {
            UNIX_EPOCH - Duration::new((-secs) as u64, nsecs)
        }
    }

    const HALF: Duration = Duration::from_millis(500);

    #[test]
    fn half_a_second_before_the_epoch() {
        // `touch -d '1969-12-31 23:59:59.5'`: the kernel sends (-1, 5e8); fuser gives -1.5 s.
        let fuser = as_fuser_reads(-1, 500_000_000);
        assert_eq!(fuser, UNIX_EPOCH - Duration::from_millis(1_500), "fuser's reading, if this fails fuser changed");
        assert_eq!(fuser_time_fixed(fuser), UNIX_EPOCH - HALF);
    }

    #[test]
    fn one_and_a_half_seconds_before_the_epoch() {
        // (-2, 5e8): fuser gives -2.5 s.
        let fuser = as_fuser_reads(-2, 500_000_000);
        assert_eq!(fuser, UNIX_EPOCH - Duration::from_millis(2_500));
        assert_eq!(fuser_time_fixed(fuser), UNIX_EPOCH - Duration::from_millis(1_500));
        // A nanosecond off a whole second.
        let fuser = as_fuser_reads(-10, 999_999_999);
        assert_eq!(fuser_time_fixed(fuser), UNIX_EPOCH - Duration::from_nanos(9_000_000_001));
    }

    #[test]
    fn whole_seconds_before_the_epoch_are_right_already() {
        let fuser = as_fuser_reads(-1, 0);
        assert_eq!(fuser_time_fixed(fuser), UNIX_EPOCH - Duration::from_secs(1));
        let fuser = as_fuser_reads(-86_400 * 365, 0);
        assert_eq!(fuser_time_fixed(fuser), UNIX_EPOCH - Duration::from_secs(86_400 * 365));
    }

    #[test]
    fn times_from_the_epoch_on_are_unchanged() {
        for (s, n) in [(0, 0), (0, 500_000_000), (1, 500_000_000), (1_700_000_000, 123_456_789)] {
            let t = as_fuser_reads(s, n);
            assert_eq!(fuser_time_fixed(t), t);
            assert_eq!(t, UNIX_EPOCH + Duration::new(s as u64, n));
        }
    }

    #[test]
    fn a_time_fuser_cannot_make_is_left_alone() {
        // Under a second before the epoch: fuser never gives it (sec 0 is not negative).
        let t = UNIX_EPOCH - Duration::from_millis(300);
        assert_eq!(fuser_time_fixed(t), t);
    }
}
