//! `--notify sqs://QUEUE-URL`: S3 event notifications read from an SQS queue (one queue per
//! mount: a message goes to one consumer).
//!
//! The queue is long-polled (`ReceiveMessage`, up to 20 s, 10 messages; the first request
//! after a connect returns at once, to tell the source is up), each batch is
//! sent on as [`Feed`] items and then deleted (`DeleteMessageBatch`). Requests use SQS's
//! query protocol, signed with SigV4 for service `sqs` (credentials as for S3). Bodies may
//! be S3's own event (`{"Records": [...]}`), the same inside an SNS envelope
//! (`{"Type": "Notification", "Message": "..."}`), or an EventBridge event
//! (`"source": "aws.s3"`, `"detail-type": "Object Created" | "Object Deleted"`).
//!
//! SQS neither orders nor deduplicates, and a queue may hold events from before this mount:
//! - an event whose `sequencer` is not above the last one seen for its key (a duplicate, or
//!   one overtaken by a later event) is dropped;
//! - an event older than the last connection (it may predate what the mount has listed
//!   since), without a time, or about a key whose last sequencer was forgotten becomes
//!   [`Event::Changed`]: the mount asks the store rather than believe it.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use super::{offer, Event, Feed};
use crate::{StoreError, StoreErrorKind};

/// How long one `ReceiveMessage` waits for a message (SQS's maximum).
const WAIT_SECS: u32 = 20;
/// Sequencers remembered per key before the map is cleared (then unknown keys are checked).
const REMEMBERED: usize = 100_000;
/// Clock skew allowed between the store's event times and this machine.
const SKEW: Duration = Duration::from_secs(5);

/// Start reading `queue` (`sqs://HOST/ACCOUNT/NAME`, `https://` implied; `sqs://http://...`
/// for a local server). Events for keys outside `bucket`/`prefix` are never sent.
pub fn sqs(
    queue: &str,
    region: Option<&str>,
    bucket: &str,
    prefix: &str,
    profile: Option<&str>,
) -> Result<mpsc::Receiver<Feed>, String> {
    let rest = queue.strip_prefix("sqs://").ok_or_else(|| format!("{queue:?}: an SQS source is sqs://QUEUE-URL"))?;
    let url = if rest.starts_with("http://") || rest.starts_with("https://") {
        rest.to_string()
    } else {
        format!("https://{rest}")
    };
    let parsed = url::Url::parse(&url).map_err(|e| format!("--notify {queue:?}: not a queue URL ({e})"))?;
    if parsed.path().trim_matches('/').is_empty() {
        return Err(format!("--notify {queue:?}: the URL names no queue (sqs://HOST/ACCOUNT/QUEUE)"));
    }
    // sqs.REGION.amazonaws.com or REGION.queue.amazonaws.com; else --region, else us-east-1.
    let host = parsed.host_str().unwrap_or_default();
    let from_host = host
        .strip_prefix("sqs.")
        .and_then(|h| h.split('.').next())
        .or_else(|| host.split_once(".queue.").map(|(r, _)| r))
        .filter(|_| host.ends_with(".amazonaws.com"));
    let region = from_host.or(region).unwrap_or("us-east-1").to_string();
    let (tx, rx) = mpsc::channel(super::CHANNEL);
    let reader = SqsReader {
        url,
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
        signer: crate::s3::bucket::signer_for("sqs", &region, profile, None, false),
        http: reqwest::Client::new(),
    };
    tokio::spawn(reader.run(tx));
    Ok(rx)
}

struct SqsReader {
    url: String,
    bucket: String,
    prefix: String,
    signer: reqsign_core::Signer<reqsign_aws_v4::Credential>,
    http: reqwest::Client,
}

impl SqsReader {
    async fn run(self, tx: mpsc::Sender<Feed>) {
        let mut order = Order::default();
        let mut backoff = Duration::from_millis(500);
        loop {
            let why = match self.poll(&tx, &mut order).await {
                Ok(()) => return, // the mount is gone
                Err(e) => e.to_string(),
            };
            if tx.is_closed() {
                return;
            }
            tracing::warn!("SQS notifications down: {why}; trying again in {backoff:?}");
            if tx.send(Feed::Down(why)).await.is_err() {
                return;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(10));
        }
    }

    /// Receive and delete batches until a request fails (`Err`) or the mount is gone.
    async fn poll(&self, tx: &mpsc::Sender<Feed>, order: &mut Order) -> Result<(), StoreError> {
        let gone = || StoreError::new(StoreErrorKind::Other, "the mount is gone");
        let mut up = false;
        let mut lost = false;
        loop {
            // The first request does not wait: the queue's answer tells the source is up.
            let wait = if up { WAIT_SECS } else { 0 }.to_string();
            let answer = self
                .call(&[
                    ("Action", "ReceiveMessage"),
                    ("MaxNumberOfMessages", "10"),
                    ("WaitTimeSeconds", &wait),
                    ("Version", "2012-11-05"),
                ])
                .await?;
            if !up {
                tx.send(Feed::Up).await.map_err(|_| gone())?;
                order.up_at = Some(SystemTime::now());
                tracing::info!(queue = %self.url, "SQS notifications up");
                up = true;
            }
            let messages = parse_messages(&answer);
            if messages.is_empty() {
                if tx.is_closed() {
                    return Ok(());
                }
                continue;
            }
            for m in &messages {
                for rec in parse_body(&m.body, &self.bucket, &self.prefix) {
                    if let Some(ev) = order.judge(rec) {
                        offer(tx, &mut lost, Feed::Event(ev));
                    }
                }
            }
            if lost {
                tx.send(Feed::Gap).await.map_err(|_| gone())?;
                lost = false;
            }
            let mut form = vec![("Action".to_string(), "DeleteMessageBatch".to_string())];
            for (i, m) in messages.iter().enumerate() {
                let n = i + 1;
                form.push((format!("DeleteMessageBatchRequestEntry.{n}.Id"), format!("m{n}")));
                form.push((format!("DeleteMessageBatchRequestEntry.{n}.ReceiptHandle"), m.receipt.clone()));
            }
            form.push(("Version".to_string(), "2012-11-05".to_string()));
            let pairs: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            self.call(&pairs).await?;
        }
    }

    /// One signed query-protocol request; the answer's body, or the error SQS gave.
    async fn call(&self, form: &[(&str, &str)]) -> Result<String, StoreError> {
        let err = |kind, e: String| StoreError::new(kind, e);
        let action = form.first().map_or("", |p| p.1);
        let body = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(form).finish();
        let req = http::Request::post(&self.url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(())
            .map_err(|e| err(StoreErrorKind::Other, format!("bad queue URL {}: {e}", self.url)))?;
        let mut parts = req.into_parts().0;
        self.signer
            .sign(&mut parts, None)
            .await
            .map_err(|e| err(StoreErrorKind::PermissionDenied, format!("cannot sign the SQS request: {e}")))?;
        let req = reqwest::Request::try_from(http::Request::from_parts(parts, body.into_bytes()))
            .map_err(|e| err(StoreErrorKind::Other, format!("SQS request: {e}")))?;
        let timeout = Duration::from_secs(u64::from(WAIT_SECS) + 20);
        let resp = tokio::time::timeout(timeout, self.http.execute(req))
            .await
            .map_err(|_| err(StoreErrorKind::Unavailable, format!("SQS {action}: no answer within {timeout:?}")))?
            .map_err(|e| err(StoreErrorKind::Other, format!("SQS {action}: {e}")))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| err(StoreErrorKind::Other, format!("SQS {action}: {e}")))?;
        if status.is_success() {
            return Ok(text);
        }
        let kind = match status.as_u16() {
            401 | 403 => StoreErrorKind::PermissionDenied,
            _ if text.contains("NonExistentQueue") || text.contains("QueueNotFound") => StoreErrorKind::NotFound,
            _ => StoreErrorKind::Other,
        };
        let code = xml_field(&text, "Code").unwrap_or_default();
        let message = xml_field(&text, "Message").unwrap_or_else(|| text.trim().chars().take(200).collect());
        Err(err(kind, format!("SQS {action} on {}: HTTP {status}: {code} {message}", self.url)))
    }
}

/// One S3 event as a queue told it: the event, its `sequencer`, and when it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub event: Event,
    pub sequencer: Option<String>,
    pub time: Option<SystemTime>,
}

/// What decides whether a record from the queue is believed (see the module doc).
#[derive(Default)]
struct Order {
    /// The last sequencer seen per key (relative to the prefix).
    last: HashMap<String, String>,
    /// `last` was cleared once: a key missing from it may have had a later event.
    trimmed: bool,
    /// When the queue last answered after a connect.
    up_at: Option<SystemTime>,
}

impl Order {
    /// The event to send for `rec`, `None` to drop it.
    fn judge(&mut self, rec: Record) -> Option<Event> {
        let key = rec.event.key().to_string();
        let known = match &rec.sequencer {
            Some(seq) => {
                if let Some(prev) = self.last.get(&key) {
                    if sequencer_cmp(seq, prev) != std::cmp::Ordering::Greater {
                        return None; // a duplicate, or overtaken by a later event of its key
                    }
                    true
                } else {
                    false
                }
            }
            None => false,
        };
        if let Some(seq) = rec.sequencer {
            if self.last.len() >= REMEMBERED && !self.last.contains_key(&key) {
                self.last.clear();
                self.trimmed = true;
            }
            self.last.insert(key.clone(), seq);
        }
        let old = match (rec.time, self.up_at) {
            (Some(t), Some(up)) => t + SKEW < up,
            (None, _) => true,
            (_, None) => false,
        };
        if old || (!known && self.trimmed) {
            return Some(Event::Changed { key });
        }
        Some(rec.event)
    }
}

/// Order two sequencers of one key: hex strings of any length, the shorter padded with zeros
/// on the left (as AWS documents).
fn sequencer_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let width = a.len().max(b.len());
    let pad = |s: &str| format!("{s:0>width$}").to_ascii_uppercase();
    pad(a).cmp(&pad(b))
}

/// A message from `ReceiveMessage`.
#[derive(Debug, PartialEq, Eq)]
struct Message {
    receipt: String,
    body: String,
}

/// The messages of a `ReceiveMessageResponse` (XML), their text unescaped.
fn parse_messages(xml: &str) -> Vec<Message> {
    use quick_xml::events::Event as X;
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut out = Vec::new();
    let (mut field, mut raw) = (String::new(), String::new());
    let (mut receipt, mut body) = (None, None);
    loop {
        match reader.read_event() {
            Ok(X::Start(e)) => {
                field = e.local_name().as_ref().to_string();
                raw.clear();
            }
            Ok(X::Text(t)) => raw.push_str(&t),
            Ok(X::GeneralRef(r)) => raw.push_str(&format!("&{};", &*r)),
            Ok(X::CData(c)) => raw.push_str(&quick_xml::escape::escape(&*c)),
            Ok(X::End(e)) => {
                let text = || quick_xml::escape::unescape(&raw).map(|s| s.into_owned()).unwrap_or_else(|_| raw.clone());
                match e.local_name().as_ref() {
                    "ReceiptHandle" if field == "ReceiptHandle" => receipt = Some(text()),
                    "Body" if field == "Body" => body = Some(text()),
                    "Message" => {
                        if let (Some(r), Some(b)) = (receipt.take(), body.take()) {
                            out.push(Message { receipt: r, body: b });
                        }
                    }
                    _ => {}
                }
                field.clear();
                raw.clear();
            }
            Ok(X::Eof) => break,
            Err(e) => {
                tracing::warn!("an SQS answer that is not XML: {e}");
                break;
            }
            _ => {}
        }
    }
    out
}

/// The text of the first element `name` in `xml`, if any.
fn xml_field(xml: &str, name: &str) -> Option<String> {
    let start = xml.find(&format!("<{name}>"))? + name.len() + 2;
    let end = start + xml[start..].find(&format!("</{name}>"))?;
    Some(quick_xml::escape::unescape(&xml[start..end]).map_or_else(|_| xml[start..end].to_string(), |s| s.into_owned()))
}

/// The records of one message body: S3's event, in an SNS envelope or not, or EventBridge's.
pub(crate) fn parse_body(body: &str, bucket: &str, prefix: &str) -> Vec<Record> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else {
        tracing::debug!("not an event message: {body:.200}");
        return Vec::new();
    };
    if v.get("Type").and_then(|t| t.as_str()) == Some("Notification") {
        let inner = v.get("Message").and_then(|m| m.as_str()).unwrap_or_default();
        return match serde_json::from_str::<serde_json::Value>(inner) {
            Ok(inner) if inner.get("Type").is_none() => records_of(&inner, bucket, prefix),
            _ => Vec::new(),
        };
    }
    records_of(&v, bucket, prefix)
}

fn records_of(v: &serde_json::Value, bucket: &str, prefix: &str) -> Vec<Record> {
    if v.get("source").and_then(|s| s.as_str()) == Some("aws.s3") {
        return eventbridge(v, bucket, prefix).into_iter().collect();
    }
    let records = v.get("Records").and_then(|r| r.as_array()).map(Vec::as_slice).unwrap_or_default();
    records
        .iter()
        .filter_map(|r| {
            let event = super::parse_record(r, bucket, prefix)?;
            let sequencer = r.pointer("/s3/object/sequencer").and_then(|s| s.as_str()).map(str::to_string);
            let time = event_time(r.get("eventTime"));
            Some(Record { event, sequencer, time })
        })
        .collect()
}

/// An EventBridge event of S3: its keys are not URL-encoded.
fn eventbridge(v: &serde_json::Value, bucket: &str, prefix: &str) -> Option<Record> {
    let detail = v.get("detail")?;
    if detail.pointer("/bucket/name")?.as_str()? != bucket {
        return None;
    }
    let obj = detail.get("object")?;
    let key = obj.get("key")?.as_str()?.strip_prefix(prefix)?.to_string();
    if key.is_empty() {
        return None;
    }
    let time = event_time(v.get("time"));
    let event = match v.get("detail-type")?.as_str()? {
        "Object Created" => Event::Put {
            key,
            size: obj.get("size").and_then(|s| s.as_u64()).unwrap_or(0),
            etag: obj.get("etag").and_then(|e| e.as_str()).map(|e| e.trim_matches('"').to_string()),
            mtime: time,
        },
        "Object Deleted" => Event::Removed { key },
        _ => return None,
    };
    let sequencer = obj.get("sequencer").and_then(|s| s.as_str()).map(str::to_string);
    Some(Record { event, sequencer, time })
}

fn event_time(v: Option<&serde_json::Value>) -> Option<SystemTime> {
    v?.as_str()?.parse::<jiff::Timestamp>().ok().map(SystemTime::from)
}

#[cfg(test)]
#[path = "events_sqs_tests.rs"]
mod tests;
