use std::time::{Duration, SystemTime};

use super::*;

fn s3_body(event: &str, key: &str, seq: &str, time: &str) -> String {
    format!(
        r#"{{"Records":[{{"eventVersion":"2.1","eventSource":"aws:s3","eventTime":"{time}","eventName":"{event}","s3":{{"bucket":{{"name":"b"}},"object":{{"key":"{key}","size":7,"eTag":"e1","sequencer":"{seq}"}}}}}}]}}"#
    )
}

#[test]
fn s3_sns_and_eventbridge_bodies_become_records_under_the_prefix() {
    let direct = s3_body("ObjectCreated:Put", "p/a+b%3A.txt", "00A1", "2026-11-29T10:00:00.000Z");
    let recs = parse_body(&direct, "b", "p/");
    assert_eq!(recs.len(), 1);
    assert!(matches!(&recs[0].event, Event::Put { key, size: 7, .. } if key == "a b:.txt"));
    assert_eq!(recs[0].sequencer.as_deref(), Some("00A1"));
    assert!(recs[0].time.is_some());
    assert!(parse_body(&direct, "b", "q/").is_empty(), "outside the prefix");
    assert!(parse_body(&direct, "other", "p/").is_empty(), "another bucket");

    let sns = serde_json::json!({"Type": "Notification", "MessageId": "1", "Message": direct}).to_string();
    assert_eq!(parse_body(&sns, "b", "p/"), recs, "the same record inside SNS's envelope");

    let eb = r#"{"version":"0","detail-type":"Object Deleted","source":"aws.s3","time":"2026-11-29T10:00:01Z",
        "detail":{"bucket":{"name":"b"},"object":{"key":"p/x y:z","sequencer":"00A2"}}}"#;
    let recs = parse_body(eb, "b", "p/");
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].event, Event::Removed { key: "x y:z".into() }, "EventBridge keys are not encoded");

    let test_event = r#"{"Service":"Amazon S3","Event":"s3:TestEvent","Bucket":"b"}"#;
    assert!(parse_body(test_event, "b", "").is_empty());
    assert!(parse_body("not json", "b", "").is_empty());
}

#[test]
fn a_receive_answer_yields_its_messages_unescaped() {
    let xml = r#"<?xml version="1.0"?><ReceiveMessageResponse><ReceiveMessageResult>
        <Message><MessageId>1</MessageId><ReceiptHandle>r&amp;1</ReceiptHandle>
        <Body>{&quot;Records&quot;:[]} &lt;&#65;&gt;</Body></Message>
        <Message><MessageId>2</MessageId><ReceiptHandle>r2</ReceiptHandle><Body><![CDATA[{"x":1}]]></Body></Message>
        </ReceiveMessageResult></ReceiveMessageResponse>"#;
    let got = parse_messages(xml);
    assert_eq!(
        got.unwrap(),
        vec![
            Message { receipt: "r&1".into(), body: r#"{"Records":[]} <A>"#.into() },
            Message { receipt: "r2".into(), body: r#"{"x":1}"#.into() },
        ]
    );
    let empty = parse_messages("<ReceiveMessageResponse><ReceiveMessageResult/></ReceiveMessageResponse>");
    assert_eq!(empty, Some(vec![]));
    assert_eq!(parse_messages("<html><body>a proxy's page</body></html>"), None, "not an SQS answer");
    assert_eq!(parse_messages("<Receive"), None);
    let err = "<ErrorResponse><Error><Code>AWS.SimpleQueueService.NonExistentQueue</Code><Message>no &amp; such</Message></Error></ErrorResponse>";
    assert_eq!(xml_field(err, "Message").as_deref(), Some("no & such"));
}

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

#[test]
fn queue_urls_are_checked_and_give_the_region() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _g = rt.enter();
    assert!(sqs("https://x/q", None, "b", "", None).is_err(), "not sqs://");
    assert!(sqs("sqs://host.example", None, "b", "", None).unwrap_err().contains("names no queue"));
    assert!(sqs("sqs://http://127.0.0.1:1/1/q", None, "b", "", None).is_ok());
    assert_eq!(region_of("sqs.eu-west-3.amazonaws.com", Some("us-west-2")), "eu-west-3");
    assert_eq!(region_of("ap-south-1.queue.amazonaws.com", None), "ap-south-1");
    assert_eq!(region_of("127.0.0.1", Some("us-west-2")), "us-west-2");
    assert_eq!(region_of("sqs.example.com", None), "us-east-1");
    assert_eq!(region_of("sqs.cn-north-1.amazonaws.com.cn", None), "cn-north-1");
}
