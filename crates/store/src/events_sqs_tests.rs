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
        got,
        vec![
            Message { receipt: "r&1".into(), body: r#"{"Records":[]} <A>"#.into() },
            Message { receipt: "r2".into(), body: r#"{"x":1}"#.into() },
        ]
    );
    assert!(parse_messages("<ReceiveMessageResponse><ReceiveMessageResult/></ReceiveMessageResponse>").is_empty());
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
    let put = |seq: &str, age: i64| Record {
        event: Event::Put { key: "k".into(), size: 1, etag: Some(seq.into()), mtime: None },
        sequencer: Some(seq.into()),
        time: Some(if age >= 0 {
            up - Duration::from_secs(age as u64)
        } else {
            up + Duration::from_secs((-age) as u64)
        }),
    };
    let removed = |seq: &str| Record {
        event: Event::Removed { key: "k".into() },
        sequencer: Some(seq.into()),
        time: Some(up + Duration::from_secs(2)),
    };
    // From before the queue answered, first of its key: maybe older than a listing since.
    assert_eq!(order.judge(put("10", 60)), Some(Event::Changed { key: "k".into() }));
    // Later ones of a known key are believed, in sequencer order only.
    assert!(matches!(order.judge(put("20", -1)), Some(Event::Put { .. })));
    assert_eq!(order.judge(put("20", -1)), None, "a duplicate");
    assert_eq!(order.judge(put("18", -1)), None, "overtaken");
    assert_eq!(order.judge(removed("30")), Some(Event::Removed { key: "k".into() }));
    assert_eq!(order.judge(removed("30")), None, "a removal delivered twice");
    assert_eq!(order.judge(put("25", -3)), None, "a put older than the removal");
    // Newer than all seen, but from before the queue answered: checked, not believed.
    assert_eq!(order.judge(put("40", 60)), Some(Event::Changed { key: "k".into() }));
    assert!(matches!(order.judge(put("41", 0)), Some(Event::Put { .. })), "within the skew allowed");
    // A recent event of a new key is believed.
    let fresh = Record { event: Event::Removed { key: "n".into() }, sequencer: Some("1".into()), time: Some(up) };
    assert_eq!(order.judge(fresh), Some(Event::Removed { key: "n".into() }));
    // No time at all: not believed.
    let timeless = Record { event: Event::Removed { key: "t".into() }, sequencer: None, time: None };
    assert_eq!(order.judge(timeless), Some(Event::Changed { key: "t".into() }));
}

#[test]
fn queue_urls_are_checked_and_give_the_region() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _g = rt.enter();
    assert!(sqs("https://x/q", None, "b", "", None).is_err(), "not sqs://");
    assert!(sqs("sqs://host.example", None, "b", "", None).unwrap_err().contains("names no queue"));
    assert!(sqs("sqs://http://127.0.0.1:1/1/q", None, "b", "", None).is_ok());
}
