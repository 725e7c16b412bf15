//! `--notify sqs://QUEUE-URL`: S3 event notifications read from an SQS queue (one queue per
//! mount: a message goes to one consumer).
//!
//! The queue is long-polled (`ReceiveMessage`, up to 20 s, 10 messages; the first request
//! after a connect returns at once, to tell the source is up), each batch is sent on as
//! [`Feed`] items (waiting for room: the queue keeps what is not yet taken) and then
//! deleted (`DeleteMessageBatch`). Requests use SQS's query protocol, signed with SigV4 for
//! service `sqs` over the body's hash (credentials as for S3, instance metadata included
//! for AWS's own endpoints). Bodies may
//! be S3's own event (`{"Records": [...]}`), the same inside an SNS envelope
//! (`{"Type": "Notification", "Message": "..."}`), or an EventBridge event
//! (`"source": "aws.s3"`, `"detail-type": "Object Created" | "Object Deleted"`).
//!
//! What is believed of an event, and what is checked instead: `events_order.rs`.

use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use super::order::{Order, Record};
use super::{Event, Feed};
use crate::{StoreError, StoreErrorKind};

/// How long one `ReceiveMessage` waits for a message (SQS's maximum).
const WAIT_SECS: u32 = 20;

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
    let host = parsed.host_str().unwrap_or_default();
    let region = region_of(host, region);
    let (tx, rx) = mpsc::channel(super::CHANNEL);
    let reader = SqsReader {
        url,
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
        signer: crate::s3::bucket::signer_for("sqs", &region, profile, None, aws_host(host)),
        http: reqwest::Client::new(),
    };
    tokio::spawn(reader.run(tx));
    Ok(rx)
}

/// The region of a queue's host: sqs.REGION.amazonaws.com or REGION.queue.amazonaws.com;
/// else `given` (--region, AWS_REGION), else us-east-1.
fn region_of(host: &str, given: Option<&str>) -> String {
    let from_host = host
        .strip_prefix("sqs.")
        .and_then(|h| h.split('.').next())
        .or_else(|| host.split_once(".queue.").map(|(r, _)| r))
        .filter(|_| aws_host(host));
    from_host.or(given).unwrap_or("us-east-1").to_string()
}

/// AWS's own endpoints (where instance metadata may hold the credentials).
fn aws_host(host: &str) -> bool {
    host.ends_with(".amazonaws.com") || host.ends_with(".amazonaws.com.cn")
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
        let mut backoff = super::Backoff::default();
        loop {
            let (mut up, mut worked) = (false, false);
            let why = match self.poll(&tx, &mut order, &mut up, &mut worked).await {
                Ok(()) => return, // the mount is gone
                Err(e) => e.to_string(),
            };
            if !backoff.after_break("SQS notifications", why, worked, &tx).await {
                return;
            }
        }
    }

    /// Receive and delete batches until a request fails (`Err`) or the mount is gone.
    async fn poll(
        &self,
        tx: &mpsc::Sender<Feed>,
        order: &mut Order,
        up: &mut bool,
        worked: &mut bool,
    ) -> Result<(), StoreError> {
        let gone = || StoreError::new(StoreErrorKind::Other, "the mount is gone");
        loop {
            let asked = std::time::Instant::now();
            // The first request does not wait: the queue's answer tells the source is up.
            let long = *up;
            let wait = if long { WAIT_SECS } else { 0 }.to_string();
            let answer = self
                .call(&[
                    ("Action", "ReceiveMessage"),
                    ("MaxNumberOfMessages", "10"),
                    ("WaitTimeSeconds", &wait),
                    ("Version", "2012-11-05"),
                ])
                .await?;
            let Some(messages) = parse_messages(&answer) else {
                return Err(self.not_sqs("ReceiveMessage", &answer));
            };
            if !*up {
                tx.send(Feed::Up).await.map_err(|_| gone())?;
                order.up_at = Some(SystemTime::now());
                tracing::info!(queue = %self.url, "SQS notifications up");
                *up = true;
            } else {
                *worked = true; // a long poll answered: a later break starts the backoff anew
            }
            if messages.is_empty() {
                if tx.is_closed() {
                    return Ok(());
                }
                if long && asked.elapsed() < Duration::from_secs(1) {
                    // A server that does not hold the request: no busy loop.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                continue;
            }
            for m in &messages {
                for rec in parse_body(&m.body, &self.bucket, &self.prefix) {
                    // Waits for room (what is not taken stays in the queue), then judges the
                    // event as of when it is handed on.
                    let room = tx.reserve().await.map_err(|_| gone())?;
                    if let Some(ev) = order.judge(rec, SystemTime::now()) {
                        room.send(Feed::Event(ev));
                    }
                }
            }
            let mut form = vec![("Action".to_string(), "DeleteMessageBatch".to_string())];
            for (i, m) in messages.iter().enumerate() {
                let n = i + 1;
                form.push((format!("DeleteMessageBatchRequestEntry.{n}.Id"), format!("m{n}")));
                form.push((format!("DeleteMessageBatchRequestEntry.{n}.ReceiptHandle"), m.receipt.clone()));
            }
            form.push(("Version".to_string(), "2012-11-05".to_string()));
            let pairs: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let answer = self.call(&pairs).await?;
            if !answer.contains("DeleteMessageBatchResponse") {
                return Err(self.not_sqs("DeleteMessageBatch", &answer));
            }
            if let Some(at) = answer.find("<BatchResultErrorEntry") {
                // They come again; their sequencers make that harmless.
                tracing::warn!(queue = %self.url, "SQS kept some messages it was asked to delete: {:.400}", &answer[at..]);
            }
        }
    }

    /// A 200 answer to `action` that is not SQS's (a wrong URL, a proxy's page).
    fn not_sqs(&self, action: &str, answer: &str) -> StoreError {
        let start: String = answer.trim().chars().take(120).collect();
        StoreError::new(
            StoreErrorKind::Other,
            format!("{} answered {action}, but not as SQS does: {start:?}", self.url),
        )
    }

    /// One signed query-protocol request, all of it within a timeout; the answer's body, or
    /// the error SQS gave.
    async fn call(&self, form: &[(&str, &str)]) -> Result<String, StoreError> {
        let action = form.first().map_or("", |p| p.1);
        let timeout = Duration::from_secs(u64::from(WAIT_SECS) + 20);
        tokio::time::timeout(timeout, self.call_once(form)).await.map_err(|_| {
            StoreError::new(StoreErrorKind::Unavailable, format!("SQS {action}: no answer within {timeout:?}"))
        })?
    }

    async fn call_once(&self, form: &[(&str, &str)]) -> Result<String, StoreError> {
        use sha2::Digest;
        let err = |kind, e: String| StoreError::new(kind, e);
        let action = form.first().map_or("", |p| p.1);
        let body = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(form).finish();
        // Signed over the body's hash: only S3 takes an unsigned payload.
        let hash = format!("{:x}", sha2::Sha256::digest(body.as_bytes()));
        let req = http::Request::post(&self.url)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-amz-content-sha256", hash)
            .body(())
            .map_err(|e| err(StoreErrorKind::Other, format!("bad queue URL {}: {e}", self.url)))?;
        let mut parts = req.into_parts().0;
        self.signer
            .sign(&mut parts, None)
            .await
            .map_err(|e| err(StoreErrorKind::PermissionDenied, format!("cannot sign the SQS request: {e}")))?;
        let req = reqwest::Request::try_from(http::Request::from_parts(parts, body.into_bytes()))
            .map_err(|e| err(StoreErrorKind::Other, format!("SQS request: {e}")))?;
        let resp =
            self.http.execute(req).await.map_err(|e| err(StoreErrorKind::Other, format!("SQS {action}: {e}")))?;
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

/// A message from `ReceiveMessage`.
#[derive(Debug, PartialEq, Eq)]
struct Message {
    receipt: String,
    body: String,
}

/// The messages of a `ReceiveMessageResponse` (XML), their text unescaped; `None` if the
/// answer is not one.
fn parse_messages(xml: &str) -> Option<Vec<Message>> {
    use quick_xml::events::Event as X;
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut out = Vec::new();
    let (mut field, mut raw) = (String::new(), String::new());
    let (mut receipt, mut body) = (None, None);
    let mut is_answer = false;
    loop {
        match reader.read_event() {
            Ok(X::Start(e) | X::Empty(e)) => {
                field = e.local_name().as_ref().to_string();
                is_answer |= field == "ReceiveMessageResponse";
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
                return None;
            }
            _ => {}
        }
    }
    is_answer.then_some(out)
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
            // (A delete of one version is already `Changed`: `parse_record`.)
            Some(Record { event, sequencer, time, version_delete: false })
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
    let version = obj.get("version-id").and_then(|v| v.as_str());
    let version_delete = detail.get("deletion-type").and_then(|d| d.as_str()) == Some("Permanently Deleted")
        && version.is_some_and(|v| !v.is_empty() && v != "null");
    Some(Record { event, sequencer, time, version_delete })
}

fn event_time(v: Option<&serde_json::Value>) -> Option<SystemTime> {
    v?.as_str()?.parse::<jiff::Timestamp>().ok().map(SystemTime::from)
}

#[cfg(test)]
#[path = "events_sqs_tests.rs"]
mod tests;
