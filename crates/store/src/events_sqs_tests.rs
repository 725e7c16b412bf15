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
