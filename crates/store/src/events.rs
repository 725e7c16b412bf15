//! Change events pushed by the store: a mount that hears of other clients' changes at once
//! instead of listing again when its TTL runs out (`bucketfs mount --notify`).
//!
//! A source is a task that keeps one connection to the store's event stream and sends
//! [`Feed`] items on a bounded channel: [`Feed::Up`] when the stream is connected (and
//! again after every reconnect), each object event as [`Feed::Event`], and [`Feed::Down`]
//! when it breaks, with the reason, before it tries again (0.5 s, doubling to 10 s).
//! Events the consumer has no room for are not queued without bound: they are dropped and
//! the next item is [`Feed::Gap`] (the consumer must then distrust what it cached).
//!
//! Sources: `minio`, MinIO's `ListenBucketNotification` (a signed `GET
//! /BUCKET?events=...&prefix=...` whose answer streams one JSON object per line, the S3
//! event format, with blank keep-alive lines); `sqs://QUEUE-URL`, S3 event notifications
//! read from an SQS queue (`events_sqs.rs`); `pubsub://projects/P/subscriptions/S`, Cloud
//! Storage notifications pulled from Pub/Sub (`events_pubsub.rs`). Keys are relative to the mounted prefix;
//! events for keys outside it are never sent.

use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use crate::{StoreError, StoreErrorKind};

/// One object changed in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Created or replaced: its new size and identity.
    Put { key: String, size: u64, etag: Option<String>, mtime: Option<SystemTime> },
    /// Deleted.
    Removed { key: String },
    /// Changed at a time the source cannot place (maybe before what the mount cached): the
    /// mount asks the store instead of believing it.
    Changed { key: String },
}

impl Event {
    pub fn key(&self) -> &str {
        match self {
            Event::Put { key, .. } | Event::Removed { key } | Event::Changed { key } => key,
        }
    }
}

/// What a source says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Feed {
    /// Connected: from now on every change is told.
    Up,
    Event(Event),
    /// Events were lost (the consumer fell behind, or the store said so): what was cached
    /// before may be stale. The source is still connected.
    Gap,
    /// Disconnected, with the reason; changes are not told until the next `Up`.
    Down(String),
}

/// How many items wait for the consumer before events are dropped (and a gap told).
const CHANNEL: usize = 4096;

#[path = "events_order.rs"]
mod order;
#[path = "events_sqs.rs"]
mod sqs;
pub use sqs::sqs;
#[path = "events_pubsub.rs"]
mod pubsub;
pub use pubsub::pubsub;

/// The wait of a source before it connects again: 0.5 s, doubling to 10 s, and 0.5 s again
/// after a break that followed a working spell.
struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Backoff(Duration::from_millis(500))
    }
}

impl Backoff {
    /// After a break for `why` (`worked`: the source had worked for a while before it):
    /// warn, tell the consumer [`Feed::Down`], wait. `false` if the mount is gone.
    async fn after_break(&mut self, source: &str, why: String, worked: bool, tx: &mpsc::Sender<Feed>) -> bool {
        if tx.is_closed() {
            return false;
        }
        if worked {
            self.0 = Duration::from_millis(500);
        }
        tracing::warn!("{source} down: {why}; trying again in {:?}", self.0);
        if tx.send(Feed::Down(why)).await.is_err() {
            return false;
        }
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_secs(10));
        true
    }
}

/// A listen request not refused within this is taken as listening (see `listen`).
const ACCEPTED_AFTER: Duration = Duration::from_millis(1500);

/// Start listening to MinIO's bucket notifications for keys under `prefix` (which is empty
/// or ends with `/`). Credentials come from the usual chain (environment, profile).
pub fn minio(endpoint: &str, bucket: &str, prefix: &str, region: &str, profile: Option<&str>) -> mpsc::Receiver<Feed> {
    let (tx, rx) = mpsc::channel(CHANNEL);
    let listen = MinioListen {
        endpoint: endpoint.trim_end_matches('/').to_string(),
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
        signer: crate::s3::bucket::signer(region, profile, None, false),
        http: reqwest::Client::new(),
    };
    tokio::spawn(listen.run(tx));
    rx
}

struct MinioListen {
    endpoint: String,
    bucket: String,
    prefix: String,
    signer: reqsign_core::Signer<reqsign_aws_v4::Credential>,
    http: reqwest::Client,
}

impl MinioListen {
    async fn run(self, tx: mpsc::Sender<Feed>) {
        let mut backoff = Backoff::default();
        loop {
            let began = std::time::Instant::now();
            let why = match self.listen(&tx).await {
                Ok(()) => "the store closed the event stream".to_string(),
                Err(e) => e.to_string(),
            };
            // A connection that held for a while starts the next wait short again.
            let worked = began.elapsed() > Duration::from_secs(30);
            if !backoff.after_break("bucket notifications", why, worked, &tx).await {
                return; // the mount is gone
            }
        }
    }

    /// One connection: until it ends or fails.
    async fn listen(&self, tx: &mpsc::Sender<Feed>) -> Result<(), StoreError> {
        let err = |e: String| StoreError::new(StoreErrorKind::Other, e);
        let mut url = url::Url::parse(&format!("{}/{}", self.endpoint, self.bucket))
            .map_err(|e| err(format!("bad endpoint {}: {e}", self.endpoint)))?;
        url.query_pairs_mut()
            .append_pair("prefix", &self.prefix)
            .append_pair("events", "s3:ObjectCreated:*")
            .append_pair("events", "s3:ObjectRemoved:*");
        let mut parts = http::Request::get(url.as_str()).body(()).expect("a GET builds").into_parts().0;
        self.signer.sign(&mut parts, None).await.map_err(|e| err(format!("cannot sign the listen request: {e}")))?;
        let req = http::Request::from_parts(parts, Vec::<u8>::new());
        let req = reqwest::Request::try_from(req).map_err(|e| err(format!("listen request: {e}")))?;
        // MinIO sends the answer's headers with the first event, while it refuses at once
        // (a 403, a missing bucket): a request still unanswered after a moment is listening.
        let mut pending = Box::pin(self.http.execute(req));
        let mut told_up = false;
        let answer = match tokio::time::timeout(ACCEPTED_AFTER, &mut pending).await {
            Ok(answer) => answer,
            Err(_) => {
                tx.send(Feed::Up).await.map_err(|_| err("the mount is gone".into()))?;
                told_up = true;
                pending.await
            }
        };
        let mut resp = answer.map_err(|e| err(format!("listen: {e}")))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            let kind = match status.as_u16() {
                403 => StoreErrorKind::PermissionDenied,
                404 => StoreErrorKind::NotFound,
                _ => StoreErrorKind::Other,
            };
            return Err(StoreError::new(kind, format!("listen: HTTP {status}: {}", body.trim())));
        }
        if !told_up {
            tx.send(Feed::Up).await.map_err(|_| err("the mount is gone".into()))?;
        }
        tracing::info!(bucket = %self.bucket, prefix = %self.prefix, "bucket notifications up");
        let mut line = Vec::new();
        let mut lost = false;
        while let Some(chunk) = resp.chunk().await.map_err(|e| err(format!("event stream: {e}")))? {
            for &b in chunk.iter() {
                if b != b'\n' {
                    line.push(b);
                    continue;
                }
                for ev in parse_line(&line, &self.bucket, &self.prefix) {
                    offer(tx, &mut lost, Feed::Event(ev));
                }
                line.clear();
            }
            if lost {
                // Events were dropped: the gap is told now, not at the next event (the
                // stream may stay quiet for long), waiting for room if need be.
                tx.send(Feed::Gap).await.map_err(|_| err("the mount is gone".into()))?;
                lost = false;
            }
        }
        Ok(())
    }
}

/// Send without waiting: if the consumer has no room, drop the item and remember (in
/// `lost`) that a gap must be told before the next one.
fn offer(tx: &mpsc::Sender<Feed>, lost: &mut bool, item: Feed) {
    if *lost {
        match tx.try_send(Feed::Gap) {
            Ok(()) => *lost = false,
            Err(_) => return,
        }
    }
    if tx.try_send(item).is_err() {
        *lost = true;
    }
}

/// The events of one line of the stream (S3's event format): keys decoded, made relative
/// to `prefix`, and kept only if they are under it.
pub fn parse_line(line: &[u8], bucket: &str, prefix: &str) -> Vec<Event> {
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    if text.is_empty() {
        return Vec::new(); // keep-alive
    }
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
        tracing::debug!("not an event line: {text:.200}");
        return Vec::new();
    };
    let records = v.get("Records").and_then(|r| r.as_array()).cloned().unwrap_or_default();
    records.iter().filter_map(|r| parse_record(r, bucket, prefix)).collect()
}

fn parse_record(r: &serde_json::Value, bucket: &str, prefix: &str) -> Option<Event> {
    let name = r.get("eventName")?.as_str()?;
    let s3 = r.get("s3")?;
    if s3.get("bucket")?.get("name")?.as_str()? != bucket {
        return None;
    }
    let obj = s3.get("object")?;
    // Keys in S3 events are URL-encoded as a form value is ('+' for a space).
    let raw = obj.get("key")?.as_str()?;
    let key: String = url::form_urlencoded::parse(format!("k={raw}").as_bytes()).next()?.1.into_owned();
    let key = key.strip_prefix(prefix)?.to_string();
    if key.is_empty() {
        return None; // the prefix's own marker
    }
    let event = name.trim_start_matches("s3:");
    // A DELETE of one version (not one that makes a delete marker) in a versioned bucket,
    // or a lifecycle expiration of a noncurrent one (`LifecycleExpiration:Delete` with its
    // versionId), may leave another version there: checked, not believed.
    let version = obj.get("versionId").and_then(|v| v.as_str()).filter(|v| !v.is_empty() && *v != "null");
    if event.ends_with(":Delete") && version.is_some() {
        return Some(Event::Changed { key });
    }
    // Lifecycle expirations remove as a DELETE does (S3 names them apart).
    if event.starts_with("ObjectRemoved") || event.starts_with("LifecycleExpiration") {
        return Some(Event::Removed { key });
    }
    if !event.starts_with("ObjectCreated") {
        return None;
    }
    let etag =
        obj.get("eTag").and_then(|e| e.as_str()).filter(|e| !e.is_empty()).map(|e| e.trim_matches('"').to_string());
    let mtime = r
        .get("eventTime")
        .and_then(|t| t.as_str())
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map(SystemTime::from);
    Some(Event::Put { key, size: obj.get("size").and_then(|s| s.as_u64()).unwrap_or(0), etag, mtime })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"EventName":"s3:ObjectCreated:Put","Key":"b/p/a+b%2Bc.txt","Records":[{"eventVersion":"2.0","eventSource":"minio:s3","eventTime":"2026-11-29T11:00:00.123Z","eventName":"s3:ObjectCreated:Put","s3":{"bucket":{"name":"b"},"object":{"key":"p%2Fa+b%2Bc.txt","size":42,"eTag":"abc123","sequencer":"1"}}}]}"#;

    #[test]
    fn a_minio_event_line_becomes_an_event_under_the_prefix() {
        let evs = parse_line(LINE.as_bytes(), "b", "p/");
        assert_eq!(evs.len(), 1);
        match &evs[0] {
            Event::Put { key, size, etag, mtime } => {
                assert_eq!(key, "a b+c.txt");
                assert_eq!(*size, 42);
                assert_eq!(etag.as_deref(), Some("abc123"));
                assert!(mtime.is_some());
            }
            e => panic!("{e:?}"),
        }
        assert!(parse_line(LINE.as_bytes(), "b", "q/").is_empty(), "outside the prefix");
        assert!(parse_line(LINE.as_bytes(), "other", "p/").is_empty(), "another bucket");
        assert!(parse_line(b"   ", "b", "").is_empty(), "keep-alive");
        assert!(parse_line(b"{not json", "b", "").is_empty());
        let removed = LINE.replace("ObjectCreated:Put", "ObjectRemoved:Delete");
        assert_eq!(parse_line(removed.as_bytes(), "b", ""), vec![Event::Removed { key: "p/a b+c.txt".into() }]);
        // Versioned: a delete marker removes; a delete of one version is checked.
        let null = removed.replace(r#""sequencer":"1""#, r#""sequencer":"1","versionId":"null""#);
        assert_eq!(parse_line(null.as_bytes(), "b", ""), vec![Event::Removed { key: "p/a b+c.txt".into() }]);
        let marker = LINE
            .replace("ObjectCreated:Put", "ObjectRemoved:DeleteMarkerCreated")
            .replace(r#""sequencer":"1""#, r#""sequencer":"1","versionId":"v2""#);
        assert_eq!(parse_line(marker.as_bytes(), "b", ""), vec![Event::Removed { key: "p/a b+c.txt".into() }]);
        let one = removed.replace(r#""sequencer":"1""#, r#""sequencer":"1","versionId":"v1""#);
        assert_eq!(parse_line(one.as_bytes(), "b", ""), vec![Event::Changed { key: "p/a b+c.txt".into() }]);
        let expired_old = one.replace("ObjectRemoved:Delete", "LifecycleExpiration:Delete");
        assert_eq!(parse_line(expired_old.as_bytes(), "b", ""), vec![Event::Changed { key: "p/a b+c.txt".into() }]);
        let expired = removed.replace("ObjectRemoved:Delete", "LifecycleExpiration:Delete");
        assert_eq!(parse_line(expired.as_bytes(), "b", ""), vec![Event::Removed { key: "p/a b+c.txt".into() }]);
    }

    #[test]
    fn a_consumer_that_falls_behind_gets_a_gap_not_a_queue() {
        let (tx, mut rx) = mpsc::channel(2);
        let mut lost = false;
        let ev = |k: &str| Feed::Event(Event::Removed { key: k.into() });
        for k in ["a", "b", "c", "d"] {
            offer(&tx, &mut lost, ev(k));
        }
        assert_eq!(rx.try_recv().unwrap(), ev("a"));
        assert_eq!(rx.try_recv().unwrap(), ev("b"));
        assert!(rx.try_recv().is_err(), "c and d were dropped, not queued");
        offer(&tx, &mut lost, ev("e"));
        assert_eq!(rx.try_recv().unwrap(), Feed::Gap, "the gap is told before the next event");
        assert_eq!(rx.try_recv().unwrap(), ev("e"));
    }
}
