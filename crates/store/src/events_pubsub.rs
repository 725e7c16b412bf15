//! `--notify pubsub://projects/P/subscriptions/S`: Cloud Storage's Pub/Sub notifications
//! (payload `JSON_API_V1` or `NONE`), pulled from a subscription of this mount's own (a
//! message goes to one subscriber of a subscription).
//!
//! The subscription is pulled over gRPC (`google.pubsub.v1.Subscriber/Pull`, 100 messages,
//! the server holding the call while there are none), each batch is sent on as [`Feed`]
//! items (waiting for room: the subscription keeps what is not yet acknowledged) and then
//! acknowledged. The endpoint is `pubsub.googleapis.com:443` over TLS with an OAuth token
//! from the usual Google chain (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's default
//! credentials, the VM's metadata server); with `PUBSUB_EMULATOR_HOST=HOST:PORT` set (as
//! Google's own clients read it) it is that emulator, in plain text without a token.
//!
//! What an event says is read from its attributes (`eventType`, `objectId`, `bucketId`,
//! `objectGeneration`, `eventTime`, `overwrittenByGeneration`) and, for a new object, the
//! payload's `size` and `updated`. The generation is the object's identity in this store
//! (as in `opendal_store.rs`), so an event of this mount's own upload is recognised.
//! Order: the generation, then the kind (a delete above a create of the same generation),
//! then the metageneration, made into a sequencer for `events_order.rs`, which decides what
//! is believed. Kinds:
//! - `OBJECT_FINALIZE`: created or replaced;
//! - `OBJECT_DELETE` or `OBJECT_ARCHIVE` with `overwrittenByGeneration`: replaced, told by
//!   the new version's own `OBJECT_FINALIZE`; dropped;
//! - `OBJECT_ARCHIVE` otherwise: the live version became noncurrent (a delete in a
//!   versioned bucket): removed;
//! - `OBJECT_DELETE` otherwise: removed, unless the payload says the version was already
//!   noncurrent (`timeDeleted`): then only that old version went, and the name is checked;
//! - `OBJECT_METADATA_UPDATE`: the name is checked (its attributes may have changed).

use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use super::order::{Order, Record};
use super::{Event, Feed};
use crate::{StoreError, StoreErrorKind};

mod pb {
    tonic::include_proto!("google.pubsub.v1");
}

/// Google's endpoint; `PUBSUB_EMULATOR_HOST` replaces it.
const ENDPOINT: &str = "https://pubsub.googleapis.com";
const SCOPE: &str = "https://www.googleapis.com/auth/pubsub";
/// Messages asked for per pull.
const BATCH: i32 = 100;
/// How long one pull may be held by the server before it is asked again.
const PULL_DEADLINE: Duration = Duration::from_secs(30);
/// How long an OAuth token is used (Google's last an hour).
const TOKEN_KEPT: Duration = Duration::from_secs(30 * 60);

/// Start pulling `source` (`pubsub://projects/P/subscriptions/S`). Events for keys outside
/// `bucket`/`prefix` are never sent.
pub fn pubsub(source: &str, bucket: &str, prefix: &str) -> Result<mpsc::Receiver<Feed>, String> {
    let subscription = subscription_of(source)?;
    let emulator = std::env::var("PUBSUB_EMULATOR_HOST").ok().filter(|h| !h.is_empty());
    let endpoint = match &emulator {
        Some(host) => format!("http://{host}"),
        None => ENDPOINT.to_string(),
    };
    let channel = tonic::transport::Endpoint::from_shared(endpoint.clone())
        .map_err(|e| format!("--notify {source:?}: bad Pub/Sub endpoint {endpoint:?} ({e})"))?
        .connect_timeout(Duration::from_secs(10))
        .tcp_keepalive(Some(Duration::from_secs(30)));
    let channel = if emulator.is_some() {
        channel
    } else {
        channel
            .tls_config(tonic::transport::ClientTlsConfig::new().with_native_roots())
            .map_err(|e| format!("--notify {source:?}: TLS for Pub/Sub: {e}"))?
    };
    let token = emulator.is_none().then(|| {
        let ctx = reqsign_core::Context::new()
            .with_file_read(reqsign_file_read_tokio::TokioFileRead)
            .with_env(reqsign_core::OsEnv)
            .with_http_send(opendal::HttpTransporter::default());
        reqsign_core::Signer::new(
            ctx,
            reqsign_google::DefaultCredentialProvider::new(),
            reqsign_google::RequestSigner::new("pubsub").with_scope(SCOPE),
        )
    });
    let (tx, rx) = mpsc::channel(super::CHANNEL);
    let puller = Puller {
        subscription,
        endpoint,
        channel: channel.connect_lazy(),
        token,
        kept: std::sync::Mutex::new(None),
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
    };
    tokio::spawn(puller.run(tx));
    Ok(rx)
}

/// `projects/P/subscriptions/S` of a `pubsub://` source, checked.
fn subscription_of(source: &str) -> Result<String, String> {
    let path = source.strip_prefix("pubsub://").ok_or_else(|| {
        format!("{source:?}: a Pub/Sub source is pubsub://projects/PROJECT/subscriptions/SUBSCRIPTION")
    })?;
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    match parts.as_slice() {
        ["projects", p, "subscriptions", s] if !p.is_empty() && !s.is_empty() => {
            Ok(format!("projects/{p}/subscriptions/{s}"))
        }
        _ => Err(format!(
            "--notify {source:?}: not a subscription; give pubsub://projects/PROJECT/subscriptions/SUBSCRIPTION"
        )),
    }
}

struct Puller {
    subscription: String,
    endpoint: String,
    channel: tonic::transport::Channel,
    token: Option<reqsign_core::Signer<reqsign_google::Credential>>,
    /// The last `authorization` value and when it was had.
    kept: std::sync::Mutex<Option<(String, std::time::Instant)>>,
    bucket: String,
    prefix: String,
}

impl Puller {
    async fn run(self, tx: mpsc::Sender<Feed>) {
        let mut order = Order::default();
        let mut backoff = super::Backoff::default();
        loop {
            let (mut up, mut worked) = (false, false);
            let why = match self.pull(&tx, &mut order, &mut up, &mut worked).await {
                Ok(()) => return, // the mount is gone
                Err(e) => e.to_string(),
            };
            if !backoff.after_break("Pub/Sub notifications", why, worked, &tx).await {
                return;
            }
        }
    }

    /// Pull and acknowledge batches until a call fails (`Err`) or the mount is gone.
    async fn pull(
        &self,
        tx: &mpsc::Sender<Feed>,
        order: &mut Order,
        up: &mut bool,
        worked: &mut bool,
    ) -> Result<(), StoreError> {
        let gone = || StoreError::new(StoreErrorKind::Other, "the mount is gone");
        let mut client = pb::subscriber_client::SubscriberClient::new(self.channel.clone());
        loop {
            let asked = std::time::Instant::now();
            // The first pull returns at once: its answer tells the subscription is there.
            let pull = pb::PullRequest {
                subscription: self.subscription.clone(),
                return_immediately: !*up,
                max_messages: BATCH,
            };
            let call = client.pull(self.request(pull, PULL_DEADLINE).await?);
            // The server enforces the deadline; a server that hangs is cut off here too.
            let answer = tokio::time::timeout(PULL_DEADLINE + Duration::from_secs(10), call).await.map_err(|_| {
                StoreError::new(StoreErrorKind::Unavailable, format!("Pub/Sub Pull at {}: no answer", self.endpoint))
            })?;
            let messages = match answer {
                Ok(answer) => answer.into_inner().received_messages,
                // Held to its deadline with nothing to say (the server says DeadlineExceeded;
                // tonic, whose clock starts first, Cancelled): ask again.
                Err(s)
                    if *up
                        && matches!(s.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled)
                        && asked.elapsed() + Duration::from_secs(1) >= PULL_DEADLINE =>
                {
                    Vec::new()
                }
                Err(s) => return Err(self.error("Pull", s)),
            };
            if !*up {
                tx.send(Feed::Up).await.map_err(|_| gone())?;
                order.up_at = Some(SystemTime::now());
                tracing::info!(subscription = %self.subscription, "Pub/Sub notifications up");
                *up = true;
            } else {
                *worked = true; // a held pull answered: a later break starts the backoff anew
            }
            if messages.is_empty() {
                if tx.is_closed() {
                    return Ok(());
                }
                if asked.elapsed() < Duration::from_millis(100) {
                    // A server that does not hold the call: no busy loop.
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                continue;
            }
            let mut acks = Vec::with_capacity(messages.len());
            for m in messages {
                acks.push(m.ack_id);
                let Some(msg) = m.message else { continue };
                let Some(rec) = record_of(&msg.attributes, &msg.data, &self.bucket, &self.prefix) else { continue };
                // Waits for room (what is not acknowledged is delivered again), then judges
                // the event as of when it is handed on.
                let room = tx.reserve().await.map_err(|_| gone())?;
                if let Some(ev) = order.judge(rec, SystemTime::now()) {
                    room.send(Feed::Event(ev));
                }
            }
            let ack = pb::AcknowledgeRequest { subscription: self.subscription.clone(), ack_ids: acks };
            let call = client.acknowledge(self.request(ack, Duration::from_secs(20)).await?);
            tokio::time::timeout(Duration::from_secs(30), call)
                .await
                .map_err(|_| {
                    StoreError::new(
                        StoreErrorKind::Unavailable,
                        format!("Pub/Sub Acknowledge at {}: no answer", self.endpoint),
                    )
                })?
                .map_err(|s| self.error("Acknowledge", s))?;
        }
    }

    /// A call's request: its deadline and, for Google's endpoint, the bearer token.
    async fn request<T>(&self, body: T, deadline: Duration) -> Result<tonic::Request<T>, StoreError> {
        let mut req = tonic::Request::new(body);
        req.set_timeout(deadline);
        if let Some(auth) = self.authorization().await? {
            let v = auth.parse().map_err(|_| StoreError::new(StoreErrorKind::Other, "an unusable OAuth token"))?;
            req.metadata_mut().insert("authorization", v);
        }
        Ok(req)
    }

    /// The `authorization` value for Google's endpoint (`None` for an emulator), kept for
    /// [`TOKEN_KEPT`]: a service-account key is otherwise exchanged for a new token at every
    /// call. Getting one is bounded in time: a stalled metadata server is a break, not a hang.
    async fn authorization(&self) -> Result<Option<String>, StoreError> {
        let Some(signer) = &self.token else { return Ok(None) };
        if let Some((auth, at)) = self.kept.lock().unwrap().clone() {
            if at.elapsed() < TOKEN_KEPT {
                return Ok(Some(auth));
            }
        }
        let mut parts = http::Request::get(ENDPOINT).body(()).expect("a GET builds").into_parts().0;
        let signed =
            tokio::time::timeout(Duration::from_secs(30), signer.sign(&mut parts, None)).await.map_err(|_| {
                StoreError::new(
                    StoreErrorKind::Unavailable,
                    "no OAuth token for Pub/Sub within 30 s (metadata server or token endpoint)",
                )
            })?;
        signed.map_err(|e| {
            StoreError::new(
                StoreErrorKind::PermissionDenied,
                format!("cannot get an OAuth token for Pub/Sub: {e} (credentials: GOOGLE_APPLICATION_CREDENTIALS, gcloud's default login, or the VM's service account)"),
            )
        })?;
        let auth = parts.headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_string);
        if let Some(a) = &auth {
            *self.kept.lock().unwrap() = Some((a.clone(), std::time::Instant::now()));
        }
        Ok(auth)
    }

    fn error(&self, call: &str, s: tonic::Status) -> StoreError {
        if s.code() == tonic::Code::Unauthenticated {
            *self.kept.lock().unwrap() = None; // a token revoked or expired early: get another
        }
        let kind = match s.code() {
            tonic::Code::PermissionDenied | tonic::Code::Unauthenticated => StoreErrorKind::PermissionDenied,
            tonic::Code::NotFound => StoreErrorKind::NotFound,
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => StoreErrorKind::Unavailable,
            _ => StoreErrorKind::Other,
        };
        StoreError::new(
            kind,
            format!("Pub/Sub {call} of {} at {}: {:?}: {}", self.subscription, self.endpoint, s.code(), s.message()),
        )
    }
}

/// The record of one GCS notification (see the module doc), `None` if it is about another
/// bucket, a key outside the prefix, or not a GCS notification at all.
pub(crate) fn record_of(
    attrs: &std::collections::HashMap<String, String>,
    data: &[u8],
    bucket: &str,
    prefix: &str,
) -> Option<Record> {
    if attrs.get("bucketId")? != bucket {
        return None;
    }
    let key = attrs.get("objectId")?.strip_prefix(prefix)?.to_string();
    if key.is_empty() {
        return None; // the prefix's own marker
    }
    let payload: serde_json::Value = serde_json::from_slice(data).unwrap_or(serde_json::Value::Null);
    let generation: u64 = attrs.get("objectGeneration")?.parse().ok()?;
    let metageneration = payload.get("metageneration").and_then(number).unwrap_or(0);
    let time = attrs.get("eventTime").and_then(|t| t.parse::<jiff::Timestamp>().ok()).map(SystemTime::from);
    let replaced = attrs.contains_key("overwrittenByGeneration");
    let (event, rank, version_delete) = match attrs.get("eventType")?.as_str() {
        "OBJECT_FINALIZE" => {
            let mtime = payload.get("updated").and_then(|t| t.as_str()).and_then(|t| t.parse::<jiff::Timestamp>().ok());
            let size = payload.get("size").and_then(number);
            let event = match size {
                Some(size) => {
                    Event::Put { key, size, etag: Some(generation.to_string()), mtime: mtime.map(SystemTime::from) }
                }
                None => Event::Changed { key }, // payload NONE: the size is not told
            };
            (event, 0, false)
        }
        "OBJECT_METADATA_UPDATE" if payload.get("metageneration").is_none() => {
            // No payload (format NONE): no metageneration to order updates of one version.
            return Some(Record { event: Event::Changed { key }, sequencer: None, time, version_delete: false });
        }
        "OBJECT_METADATA_UPDATE" => (Event::Changed { key }, 1, false),
        "OBJECT_DELETE" | "OBJECT_ARCHIVE" if replaced => return None,
        "OBJECT_ARCHIVE" => (Event::Removed { key }, 2, false),
        "OBJECT_DELETE" => {
            // Already noncurrent (`timeDeleted`), or no payload to tell: checked.
            let noncurrent = payload.get("timeDeleted").is_some() || !payload.is_object();
            (Event::Removed { key }, 2, noncurrent)
        }
        _ => return None,
    };
    let sequencer = Some(format!("{generation:016X}{rank}{metageneration:016X}"));
    Some(Record { event, sequencer, time, version_delete })
}

/// A JSON API number, which GCS sends as a string ("size": "42").
fn number(v: &serde_json::Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str()?.parse().ok())
}

#[cfg(test)]
#[path = "events_pubsub_tests.rs"]
mod tests;
