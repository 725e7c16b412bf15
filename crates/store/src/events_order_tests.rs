use std::time::{Duration, SystemTime};

use super::*;

#[test]
fn sequencers_order_by_value_whatever_their_length() {
    use std::cmp::Ordering::*;
    assert_eq!(sequencer_cmp("0A", "9"), Greater);
    assert_eq!(sequencer_cmp("00ff", "FF"), Equal);
    assert_eq!(sequencer_cmp("0064D3901D00059242", "0064D3901D00059243"), Less);
}

#[test]
fn late_duplicate_and_pre_mount_events_are_dropped_or_checked() {
    let up = SystemTime::now();
    let mut order = Order { up_at: Some(up), ..Default::default() };
    let at = |secs: i64| {
        if secs >= 0 {
            up + Duration::from_secs(secs as u64)
        } else {
            up - Duration::from_secs((-secs) as u64)
        }
    };
    let rec = |event: Event, seq: &str, t: i64| Record {
        event,
        sequencer: Some(seq.into()),
        time: Some(at(t)),
        version_delete: false,
    };
    let put =
        |seq: &str, t: i64| rec(Event::Put { key: "k".into(), size: 1, etag: Some(seq.into()), mtime: None }, seq, t);
    let removed = |seq: &str, t: i64| rec(Event::Removed { key: "k".into() }, seq, t);
    let changed = Some(Event::Changed { key: "k".into() });
    // From before the queue answered (or within the skew after): maybe older than a listing.
    assert_eq!(order.judge(put("10", -60), at(10)), changed);
    assert_eq!(order.judge(put("11", 3), at(10)), changed, "within the skew after up");
    // Fresh ones after that are believed, in sequencer order only.
    assert!(matches!(order.judge(put("20", 10), at(10)), Some(Event::Put { .. })));
    assert_eq!(order.judge(put("20", 10), at(11)), None, "a duplicate");
    assert_eq!(order.judge(put("18", 10), at(11)), None, "overtaken");
    assert_eq!(order.judge(removed("30", 11), at(12)), Some(Event::Removed { key: "k".into() }));
    assert_eq!(order.judge(removed("30", 11), at(12)), None, "a removal delivered twice");
    assert_eq!(order.judge(put("25", 11), at(12)), None, "a put older than the removal");
    // Newer than all seen, but it took longer than FRESH to come: checked, not believed.
    assert_eq!(order.judge(put("40", 20), at(20) + FRESH + Duration::from_secs(1)), changed);
    assert!(matches!(order.judge(put("41", 30), at(30) + FRESH), Some(Event::Put { .. })));
    // Dated ahead of this clock (the store's runs fast): believed only a little ahead.
    assert!(matches!(order.judge(put("42", 32), at(30)), Some(Event::Put { .. })));
    assert_eq!(order.judge(put("43", 40), at(30)), changed, "10 s in the future");
    // No time at all: not believed.
    let timeless = Record { time: None, ..removed("50", 0) };
    assert_eq!(order.judge(timeless, at(40)), changed);
    // A removal of one version of a versioned object: the object may still be there.
    let version = Record { version_delete: true, ..removed("60", 40) };
    assert_eq!(order.judge(version, at(40)), changed);
}

#[test]
fn forgetting_keys_bounds_memory_and_checks_only_what_may_be_overtaken() {
    let up = SystemTime::now() - Duration::from_secs(3600);
    let mut order = Order { up_at: Some(up), ..Default::default() };
    let put = |key: String, t: SystemTime| Record {
        event: Event::Put { key, size: 1, etag: None, mtime: None },
        sequencer: Some("1".into()),
        time: Some(t),
        version_delete: false,
    };
    // Old keys, then a burst of fresh ones past the bound.
    let t0 = up + Duration::from_secs(60);
    for i in 0..REMEMBERED {
        order.judge(put(format!("old{i}"), t0), t0);
    }
    let t1 = t0 + Duration::from_secs(600);
    assert!(matches!(order.judge(put("new".into(), t1), t1), Some(Event::Put { .. })));
    assert!(order.last.len() <= 2, "the old keys were forgotten: {}", order.last.len());
    // A late event of a forgotten key is checked; a fresh event of a new key is believed.
    let late = order.judge(put("old1".into(), t0), t1);
    assert_eq!(late, Some(Event::Changed { key: "old1".into() }));
    assert!(matches!(order.judge(put("other".into(), t1), t1), Some(Event::Put { .. })));
}
