use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::*;

/// GCS's attributes for an event of `kind` on `key` at generation `gen`.
fn attrs(kind: &str, key: &str, gen: u64) -> HashMap<String, String> {
    [
        ("bucketId", "b"),
        ("objectId", key),
        ("eventType", kind),
        ("eventTime", "2026-11-30T10:00:00.123456Z"),
        ("payloadFormat", "JSON_API_V1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([("objectGeneration".to_string(), gen.to_string())])
    .collect()
}

const PAYLOAD: &str = r#"{"kind":"storage#object","name":"p/a b.txt","bucket":"b","generation":"1764496800123456","metageneration":"1","size":"42","updated":"2026-11-30T10:00:00.120Z"}"#;

#[test]
fn a_finalize_becomes_a_put_whose_identity_is_the_generation() {
    let rec = record_of(&attrs("OBJECT_FINALIZE", "p/a b.txt", 1764496800123456), PAYLOAD.as_bytes(), "b", "p/")
        .expect("a record");
    match &rec.event {
        Event::Put { key, size, etag, mtime } => {
            assert_eq!(key, "a b.txt");
            assert_eq!(*size, 42);
            assert_eq!(etag.as_deref(), Some("1764496800123456"));
            assert!(mtime.is_some());
        }
        e => panic!("{e:?}"),
    }
    assert!(rec.time.is_some());
    assert!(!rec.version_delete);
    let a = attrs("OBJECT_FINALIZE", "p/a b.txt", 1);
    assert!(record_of(&a, PAYLOAD.as_bytes(), "b", "q/").is_none(), "outside the prefix");
    assert!(record_of(&a, PAYLOAD.as_bytes(), "other", "p/").is_none(), "another bucket");
    assert!(record_of(&attrs("OBJECT_FINALIZE", "p/", 1), b"{}", "b", "p/").is_none(), "the prefix itself");
    assert!(record_of(&HashMap::new(), b"{}", "b", "").is_none(), "not a GCS notification");
    // Payload NONE: no size, so the name is checked.
    let none = record_of(&a, b"", "b", "p/").unwrap();
    assert!(matches!(none.event, Event::Changed { .. }), "{none:?}");
}

#[test]
fn deletes_and_archives_are_removals_unless_a_new_version_replaced_them() {
    let del = record_of(&attrs("OBJECT_DELETE", "k", 7), b"{}", "b", "").unwrap();
    assert_eq!(del.event, Event::Removed { key: "k".into() });
    assert!(!del.version_delete);
    let archived = record_of(&attrs("OBJECT_ARCHIVE", "k", 7), b"{}", "b", "").unwrap();
    assert_eq!(archived.event, Event::Removed { key: "k".into() });
    for kind in ["OBJECT_DELETE", "OBJECT_ARCHIVE"] {
        let mut a = attrs(kind, "k", 7);
        a.insert("overwrittenByGeneration".into(), "8".into());
        assert!(record_of(&a, b"{}", "b", "").is_none(), "{kind} of a replaced version: the finalize tells");
    }
    // A noncurrent version deleted for good: the live one may still be there.
    let old =
        record_of(&attrs("OBJECT_DELETE", "k", 3), br#"{"timeDeleted":"2026-11-01T00:00:00Z"}"#, "b", "").unwrap();
    assert!(old.version_delete);
    // Payload NONE: a delete may be of a noncurrent version, and metadata updates of one
    // version cannot be ordered: both checked, the updates never taken as duplicates.
    assert!(record_of(&attrs("OBJECT_DELETE", "k", 7), b"", "b", "").unwrap().version_delete);
    let meta = record_of(&attrs("OBJECT_METADATA_UPDATE", "k", 7), b"", "b", "").unwrap();
    assert_eq!(meta.event, Event::Changed { key: "k".into() });
    assert_eq!(meta.sequencer, None);
    let meta = record_of(&attrs("OBJECT_METADATA_UPDATE", "k", 7), br#"{"metageneration":"2"}"#, "b", "").unwrap();
    assert_eq!(meta.event, Event::Changed { key: "k".into() });
    assert!(meta.sequencer.is_some());
    assert!(record_of(&attrs("OBJECT_RESTORE_SOMETHING", "k", 7), b"{}", "b", "").is_none());
}

#[test]
fn generations_order_events_of_a_key_and_a_delete_follows_its_own_create() {
    let up = SystemTime::now() - Duration::from_secs(60);
    let mut order = Order::default();
    order.up_at = Some(up);
    let now = SystemTime::now();
    let fresh = |mut r: Record| {
        r.time = Some(now);
        r
    };
    let put = |gen: u64| fresh(record_of(&attrs("OBJECT_FINALIZE", "k", gen), PAYLOAD.as_bytes(), "b", "").unwrap());
    let del = |gen: u64| fresh(record_of(&attrs("OBJECT_DELETE", "k", gen), b"{}", "b", "").unwrap());
    assert!(matches!(order.judge(put(100), now), Some(Event::Put { .. })));
    assert_eq!(order.judge(put(100), now), None, "a duplicate");
    assert_eq!(order.judge(del(100), now), Some(Event::Removed { key: "k".into() }), "its own delete comes after it");
    assert_eq!(order.judge(put(100), now), None, "the create of a deleted generation, late");
    assert_eq!(order.judge(del(99), now), None, "an older generation's delete, late");
    assert!(matches!(order.judge(put(1_000_000_000_000_000), now), Some(Event::Put { .. })), "wider numbers order too");
    assert_eq!(order.judge(del(999_999_999_999_999), now), None);
}

#[test]
fn a_source_must_name_a_subscription() {
    assert_eq!(subscription_of("pubsub://projects/p/subscriptions/s").unwrap(), "projects/p/subscriptions/s");
    assert_eq!(subscription_of("pubsub://projects/p/subscriptions/s/").unwrap(), "projects/p/subscriptions/s");
    for bad in ["pubsub://projects/p/topics/t", "pubsub://p/s", "pubsub://projects//subscriptions/s", "sqs://x"] {
        let e = subscription_of(bad).unwrap_err();
        assert!(e.contains("pubsub://projects/"), "{bad}: {e}");
    }
}
