//! A small Drive v3 REST client: the calls the store needs, each with the access token,
//! retried with jittered exponential backoff on 5xx and transport errors (`retries` times),
//! on throttling (403 `userRateLimitExceeded` / `rateLimitExceeded`, 429) for up to
//! [`THROTTLE_BUDGET`] (Drive's quotas refill per minute: developers.google.com/drive/api/guides/limits),
//! and once with a fresh token on 401. Failures are told apart by status and `reason`, never
//! by the text of a message.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::Deserialize;

use super::auth::Auth;
use super::tree::{File, FILE_FIELDS};
use crate::{ByteStream, StoreError, StoreErrorKind};

/// Google's API host; `--endpoint` replaces it (the tests' emulator).
pub const GOOGLE_API: &str = "https://www.googleapis.com";

pub struct Client {
    pub http: reqwest::Client,
    pub api: String,
    pub auth: Auth,
    pub retries: usize,
    /// IDs from files.generateIds not used yet.
    pub ids: std::sync::Mutex<Vec<String>>,
}

/// The body of a request, re-sent as is on a retry.
pub enum Body {
    None,
    Json(serde_json::Value),
    Raw(Bytes, String),
}

#[derive(Deserialize)]
struct ApiError {
    error: ApiErrorBody,
}

#[derive(Deserialize)]
struct ApiErrorBody {
    #[serde(default)]
    message: String,
    #[serde(default)]
    errors: Vec<ApiErrorItem>,
}

#[derive(Deserialize)]
struct ApiErrorItem {
    #[serde(default)]
    reason: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileList {
    #[serde(default)]
    pub files: Vec<File>,
    pub next_page_token: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// `file` or `drive`: a change to a shared drive itself carries a `driveId` and no
    /// `fileId` (developers.google.com/drive/api/reference/rest/v3/changes#Change).
    #[serde(default)]
    pub change_type: String,
    pub file_id: Option<String>,
    #[serde(default)]
    pub removed: bool,
    pub file: Option<File>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeList {
    #[serde(default)]
    pub changes: Vec<Change>,
    pub next_page_token: Option<String>,
    pub new_start_page_token: Option<String>,
}

/// Said with a 403 `storageQuotaExceeded`: most often a service account writing to My Drive.
const QUOTA_HINT: &str = "; no Drive storage quota left for this account. A service account has none of its own: \
                          mount a folder in a shared drive it is a member of (gdrive://SHARED-DRIVE-ID), or use a \
                          user's account (`bucketfs auth gdrive`)";

/// How long throttled requests are retried (Drive suggests backing off up to a minute).
pub const THROTTLE_BUDGET: Duration = Duration::from_secs(64);

/// A request that failed: Drive's status (None: no answer) and first error `reason`, and
/// the error to report.
pub struct Failure {
    pub status: Option<StatusCode>,
    pub reason: String,
    pub err: StoreError,
}

/// A read's body broke off.
fn read_failed(what: &str, e: reqwest::Error) -> StoreError {
    StoreError::new(StoreErrorKind::Unavailable, format!("read {what:?}: {e}"))
}

impl Client {
    pub fn url(&self, path: &str, query: &[(&str, &str)]) -> String {
        let mut u = format!("{}{path}", self.api);
        if !query.is_empty() {
            u.push('?');
            u.push_str(&url::form_urlencoded::Serializer::new(String::new()).extend_pairs(query).finish());
        }
        u
    }

    /// Send a request, retrying as the module docs say. `op`/`what` name it in errors.
    pub async fn send(
        &self,
        op: &str,
        what: &str,
        method: Method,
        url: &str,
        body: &Body,
        extra: &[(&str, String)],
    ) -> Result<Response, StoreError> {
        self.send_full(op, what, method, url, body, extra, &[], self.retries).await.map_err(|f| f.err)
    }

    /// [`Self::send`], also answering `Ok` for the statuses in `accept`, and on failure
    /// what Drive said (for callers that handle one status or reason); 5xx and transport
    /// errors are retried `retries` times (0: a caller that must look before it resends).
    #[allow(clippy::too_many_arguments)]
    pub async fn send_full(
        &self,
        op: &str,
        what: &str,
        method: Method,
        url: &str,
        body: &Body,
        extra: &[(&str, String)],
        accept: &[StatusCode],
        retries: usize,
    ) -> Result<Response, Failure> {
        let (mut attempt, mut throttled_attempt) = (0, 0);
        let mut reauthed = false;
        let mut throttled_since: Option<Instant> = None;
        let fail = |err: StoreError| Failure { status: None, reason: String::new(), err };
        loop {
            let token = self.auth.token().await.map_err(fail)?;
            let mut rb: RequestBuilder = self.http.request(method.clone(), url).bearer_auth(&token);
            for (k, v) in extra {
                rb = rb.header(*k, v);
            }
            rb = match body {
                Body::None => rb,
                Body::Json(v) => rb.header("Content-Type", "application/json").body(v.to_string()),
                Body::Raw(b, ct) => rb.header("Content-Type", ct).body(b.clone()),
            };
            let (status, reason, err) = match rb.send().await {
                Ok(r)
                    if r.status().is_success()
                        || r.status() == StatusCode::PERMANENT_REDIRECT
                        || accept.contains(&r.status()) =>
                {
                    return Ok(r)
                }
                Ok(r) => {
                    let status = r.status();
                    let retry_after = r
                        .headers()
                        .get("Retry-After")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok());
                    let text = r.text().await.unwrap_or_default();
                    let (message, reason) = match serde_json::from_str::<ApiError>(&text) {
                        Ok(e) => {
                            (e.error.message, e.error.errors.into_iter().next().map(|i| i.reason).unwrap_or_default())
                        }
                        Err(_) => (text.chars().take(200).collect(), String::new()),
                    };
                    let throttled = status == StatusCode::TOO_MANY_REQUESTS
                        || (status == StatusCode::FORBIDDEN && reason.contains("ateLimitExceeded"));
                    let kind = match status {
                        _ if throttled => StoreErrorKind::RateLimited,
                        StatusCode::UNAUTHORIZED if !reauthed => {
                            reauthed = true;
                            self.auth.invalidate().await;
                            continue;
                        }
                        StatusCode::NOT_FOUND => StoreErrorKind::NotFound,
                        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => StoreErrorKind::PermissionDenied,
                        StatusCode::PRECONDITION_FAILED => StoreErrorKind::Changed,
                        s if s.is_server_error() => StoreErrorKind::Unavailable,
                        _ => StoreErrorKind::Other,
                    };
                    let shown = if reason.is_empty() { String::new() } else { format!("{reason}: ") };
                    let mut err = StoreError::new(kind, format!("{op} {what:?}: {status} ({shown}{message})"));
                    if reason == "storageQuotaExceeded" {
                        err.message.push_str(QUOTA_HINT);
                    }
                    if throttled {
                        // Throttling lasts as long as the quota is spent: retried for a
                        // time budget rather than a count, honouring Retry-After.
                        let since = *throttled_since.get_or_insert_with(Instant::now);
                        if since.elapsed() < THROTTLE_BUDGET {
                            let wait = retry_after
                                .map(|s| Duration::from_secs(s.min(THROTTLE_BUDGET.as_secs())))
                                .unwrap_or_else(|| crate::retry::backoff(throttled_attempt, 16_000));
                            tracing::debug!(op, what, throttled_attempt, "drive: throttled, waiting {wait:?}");
                            tokio::time::sleep(wait).await;
                            throttled_attempt += 1;
                            continue;
                        }
                    }
                    (Some(status), reason, err)
                }
                Err(e) => {
                    (None, String::new(), StoreError::new(StoreErrorKind::Unavailable, format!("{op} {what:?}: {e}")))
                }
            };
            let transient = matches!(err.kind, StoreErrorKind::Unavailable);
            if !transient || attempt >= retries {
                return Err(Failure { status, reason, err });
            }
            tracing::debug!(op, what, attempt, "drive: retrying after {}", err.message);
            tokio::time::sleep(crate::retry::backoff(attempt, 8_000)).await;
            attempt += 1;
        }
    }

    async fn json<T: for<'de> Deserialize<'de>>(op: &str, what: &str, r: Response) -> Result<T, StoreError> {
        let text = r.text().await.map_err(|e| {
            StoreError::new(StoreErrorKind::Unavailable, format!("{op} {what:?}: reading the answer: {e}"))
        })?;
        serde_json::from_str(&text)
            .map_err(|e| StoreError::new(StoreErrorKind::Other, format!("{op} {what:?}: bad answer: {e}")))
    }

    pub async fn get_file(&self, id: &str) -> Result<File, StoreError> {
        let url = self.url(&format!("/drive/v3/files/{id}"), &[("fields", FILE_FIELDS), ("supportsAllDrives", "true")]);
        let r = self.send("get", id, Method::GET, &url, &Body::None, &[]).await?;
        Self::json("get", id, r).await
    }

    /// Every file that is not trashed, page by page: of My Drive (and what is shared with
    /// the user), or with `drive`, of that shared drive (Drive omits shared-drive items
    /// unless asked with corpora=drive, driveId and both all-drives flags).
    pub async fn list_all(&self, drive: Option<&str>) -> Result<Vec<File>, StoreError> {
        let fields = format!("nextPageToken,files({FILE_FIELDS})");
        let (mut out, mut page) = (Vec::new(), None::<String>);
        loop {
            let mut q = vec![("q", "trashed=false"), ("pageSize", "1000"), ("fields", fields.as_str())];
            if let Some(d) = drive {
                q.extend([("corpora", "drive"), ("driveId", d)]);
                q.extend([("includeItemsFromAllDrives", "true"), ("supportsAllDrives", "true")]);
            }
            if let Some(p) = &page {
                q.push(("pageToken", p));
            }
            let r = self.send("list", "", Method::GET, &self.url("/drive/v3/files", &q), &Body::None, &[]).await?;
            let l: FileList = Self::json("list", "", r).await?;
            out.extend(l.files);
            match l.next_page_token {
                Some(p) => page = Some(p),
                None => return Ok(out),
            }
        }
    }

    /// The changes feed's token for now: My Drive's, or a shared drive's.
    pub async fn start_page_token(&self, drive: Option<&str>) -> Result<String, StoreError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct T {
            start_page_token: String,
        }
        let mut q = vec![("supportsAllDrives", "true")];
        if let Some(d) = drive {
            q.push(("driveId", d));
        }
        let url = self.url("/drive/v3/changes/startPageToken", &q);
        let r = self.send("changes", "", Method::GET, &url, &Body::None, &[]).await?;
        Ok(Self::json::<T>("changes", "", r).await?.start_page_token)
    }

    /// All changes since `token` (of My Drive, or of the shared drive `drive`), and the
    /// token to ask from next time.
    pub async fn changes(&self, token: &str, drive: Option<&str>) -> Result<(Vec<Change>, String), StoreError> {
        let fields = format!("nextPageToken,newStartPageToken,changes(changeType,fileId,removed,file({FILE_FIELDS}))");
        let (mut out, mut page) = (Vec::new(), token.to_string());
        loop {
            let mut q = vec![
                ("pageToken", page.as_str()),
                ("pageSize", "1000"),
                ("fields", &fields),
                ("includeRemoved", "true"),
            ];
            if let Some(d) = drive {
                q.extend([("driveId", d), ("includeItemsFromAllDrives", "true"), ("supportsAllDrives", "true")]);
            }
            let r = self.send("changes", "", Method::GET, &self.url("/drive/v3/changes", &q), &Body::None, &[]).await?;
            let l: ChangeList = Self::json("changes", "", r).await?;
            out.extend(l.changes);
            match (l.next_page_token, l.new_start_page_token) {
                (Some(p), _) => page = p,
                (None, Some(n)) => return Ok((out, n)),
                (None, None) => {
                    return Err(StoreError::new(StoreErrorKind::Other, "changes: answer without a page token"))
                }
            }
        }
    }

    /// The answer to a GET of bytes `[a, b)` of a file's content; `None` for 416: the range
    /// starts at or past the end (the file shrank).
    /// A file Drive flags as malware or spam answers 403 `cannotDownloadAbusiveFile` unless
    /// asked with `acknowledgeAbuse=true` (files.get); it is read with that, and a warning.
    async fn media(&self, id: &str, what: &str, a: u64, b: u64) -> Result<Option<Response>, StoreError> {
        let range = [("Range", format!("bytes={a}-{}", b - 1))];
        let mut ack = false;
        loop {
            let mut q = vec![("alt", "media"), ("supportsAllDrives", "true")];
            if ack {
                q.push(("acknowledgeAbuse", "true"));
            }
            let url = self.url(&format!("/drive/v3/files/{id}"), &q);
            let accept = [StatusCode::RANGE_NOT_SATISFIABLE];
            match self.send_full("read", what, Method::GET, &url, &Body::None, &range, &accept, self.retries).await {
                Ok(r) if r.status() == StatusCode::RANGE_NOT_SATISFIABLE => return Ok(None),
                Ok(r) => return Ok(Some(r)),
                Err(f) if !ack && f.reason == "cannotDownloadAbusiveFile" => {
                    tracing::warn!(file = what, "Drive flags this file as malware or spam; reading it anyway");
                    ack = true;
                }
                Err(f) => return Err(f.err),
            }
        }
    }

    /// Bytes `[a, b)` of a file's content.
    pub async fn download(&self, id: &str, what: &str, a: u64, b: u64) -> Result<Bytes, StoreError> {
        match self.media(id, what, a, b).await? {
            Some(r) => r.bytes().await.map_err(|e| read_failed(what, e)),
            None => Ok(Bytes::new()),
        }
    }

    /// [`Self::download`] as the chunks of the answer as they arrive: a large range is
    /// never held whole in memory.
    pub async fn download_stream(&self, id: &str, what: &str, a: u64, b: u64) -> Result<ByteStream, StoreError> {
        let Some(r) = self.media(id, what, a, b).await? else { return Ok(futures::stream::empty().boxed()) };
        let what = what.to_string();
        Ok(futures::stream::try_unfold(r, move |mut r| {
            let what = what.clone();
            async move { Ok(r.chunk().await.map_err(|e| read_failed(&what, e))?.map(|c| (c, r))) }
        })
        .boxed())
    }

    /// A Google Doc's export. Drive refuses exports over 10 MB (403
    /// `exportSizeLimitExceeded`, files.export); the failure says so.
    pub async fn export(&self, id: &str, what: &str, mime: &str) -> Result<Bytes, Failure> {
        let url =
            self.url(&format!("/drive/v3/files/{id}/export"), &[("mimeType", mime), ("supportsAllDrives", "true")]);
        let r = self.send_full("export", what, Method::GET, &url, &Body::None, &[], &[], self.retries).await?;
        r.bytes().await.map_err(|e| Failure {
            status: None,
            reason: String::new(),
            err: StoreError::new(StoreErrorKind::Unavailable, format!("export {what:?}: {e}")),
        })
    }

    /// Metadata-only create (folders) or update (rename, trash, move).
    pub async fn meta(
        &self,
        op: &str,
        what: &str,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: serde_json::Value,
    ) -> Result<File, StoreError> {
        let mut q = vec![("fields", FILE_FIELDS), ("supportsAllDrives", "true")];
        q.extend_from_slice(query);
        let r = self.send(op, what, method, &self.url(path, &q), &Body::Json(body), &[]).await?;
        Self::json(op, what, r).await
    }

    /// A new ID for a create or copy, from a pool filled ten at a time (files.generateIds).
    async fn new_id(&self) -> Result<String, StoreError> {
        if let Some(id) = self.ids.lock().unwrap().pop() {
            return Ok(id);
        }
        #[derive(Deserialize)]
        struct Ids {
            ids: Vec<String>,
        }
        let url = self.url("/drive/v3/files/generateIds", &[("count", "10"), ("space", "drive"), ("type", "files")]);
        let r = self.send("create", "", Method::GET, &url, &Body::None, &[]).await?;
        let mut ids = Self::json::<Ids>("create", "", r).await?.ids;
        let id = ids.pop().ok_or_else(|| StoreError::new(StoreErrorKind::Other, "generateIds gave no ID"))?;
        self.ids.lock().unwrap().extend(ids);
        Ok(id)
    }

    /// A create (`POST /drive/v3/files`) or copy (`.../copy`) made safe to retry: the new
    /// file is named by a generated ID, so a retry after Drive did the work but the answer
    /// was lost gets 409, and the file made by the earlier try is the answer, not a duplicate.
    pub async fn create(
        &self,
        op: &str,
        what: &str,
        path: &str,
        mut body: serde_json::Value,
    ) -> Result<File, StoreError> {
        let id = self.new_id().await?;
        body["id"] = serde_json::json!(id);
        let url = self.url(path, &[("fields", FILE_FIELDS), ("supportsAllDrives", "true")]);
        let sent = self.send_full(op, what, Method::POST, &url, &Body::Json(body), &[], &[], self.retries).await;
        self.created(op, what, &id, sent).await
    }

    /// The answer to a create that named its file `id` (see [`Self::create`]).
    async fn created(
        &self,
        op: &str,
        what: &str,
        id: &str,
        sent: Result<Response, Failure>,
    ) -> Result<File, StoreError> {
        match sent {
            Ok(r) => Self::json(op, what, r).await,
            Err(f) if f.status == Some(StatusCode::CONFLICT) => {
                tracing::debug!(op, what, "drive: an earlier try made it; not made twice");
                self.get_file(id).await
            }
            Err(f) => Err(f.err),
        }
    }

    /// One-request upload of a small file: new (`id` None, metadata names it; made safe to
    /// retry as [`Self::create`] says) or new content.
    pub async fn upload_multipart(
        &self,
        what: &str,
        id: Option<&str>,
        mut meta: serde_json::Value,
        data: Bytes,
    ) -> Result<File, StoreError> {
        let new_id = match id {
            Some(_) => None,
            None => Some(self.new_id().await?),
        };
        if let Some(n) = &new_id {
            meta["id"] = serde_json::json!(n);
        }
        let boundary = "bucketfs-part-boundary-7c1e4";
        let mut body = format!("--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{meta}\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n").into_bytes();
        body.extend_from_slice(&data);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let (method, path) = upload_target(id);
        let url =
            self.url(&path, &[("uploadType", "multipart"), ("fields", FILE_FIELDS), ("supportsAllDrives", "true")]);
        let ct = format!("multipart/related; boundary={boundary}");
        let sent =
            self.send_full("write", what, method, &url, &Body::Raw(body.into(), ct), &[], &[], self.retries).await;
        match new_id {
            Some(n) => self.created("write", what, &n, sent).await,
            None => Self::json("write", what, sent.map_err(|f| f.err)?).await,
        }
    }

    /// Start a resumable upload; returns the session URL.
    pub async fn upload_session(
        &self,
        what: &str,
        id: Option<&str>,
        meta: serde_json::Value,
    ) -> Result<String, StoreError> {
        let (method, path) = upload_target(id);
        let url =
            self.url(&path, &[("uploadType", "resumable"), ("fields", FILE_FIELDS), ("supportsAllDrives", "true")]);
        let r = self.send("write", what, method, &url, &Body::Json(meta), &[]).await?;
        r.headers()
            .get("Location")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| StoreError::new(StoreErrorKind::Other, format!("write {what:?}: no upload session URL")))
    }

    /// Send bytes at `offset` of a resumable upload; with `total`, this is the last chunk
    /// and the new file comes back. Drive may keep less than was sent (a 308's `Range` says
    /// how much), and after a failure it is asked how much it has before anything is sent
    /// again; the rest is sent from there (developers.google.com/drive/api/guides/manage-uploads).
    pub async fn upload_chunk(
        &self,
        what: &str,
        session: &str,
        offset: u64,
        data: Bytes,
        total: Option<u64>,
    ) -> Result<Option<File>, StoreError> {
        let end = offset + data.len() as u64;
        let (mut at, mut failures, mut stalls) = (offset, 0, 0);
        loop {
            let part = data.slice((at - offset) as usize..);
            let range = match (part.is_empty(), total) {
                (true, Some(t)) => format!("bytes */{t}"),
                (_, t) => format!("bytes {at}-{}/{}", end.saturating_sub(1), t.map_or("*".into(), |t| t.to_string())),
            };
            let body = Body::Raw(part, "application/octet-stream".into());
            let header = [("Content-Range", range)];
            let sent = self.send_full("write", what, Method::PUT, session, &body, &header, &[], 0);
            let stored = match sent.await {
                Ok(r) if r.status() == StatusCode::PERMANENT_REDIRECT => stored_bytes(&r),
                Ok(r) => return Ok(Some(Self::json("write", what, r).await?)),
                Err(f) if f.err.kind == StoreErrorKind::Unavailable && failures < self.retries => {
                    tokio::time::sleep(crate::retry::backoff(failures, 8_000)).await;
                    failures += 1;
                    // Ask before sending again: the chunk may have arrived.
                    let status = format!("bytes */{}", total.map_or("*".into(), |t| t.to_string()));
                    let r = self
                        .send("write", what, Method::PUT, session, &Body::None, &[("Content-Range", status)])
                        .await?;
                    if r.status() != StatusCode::PERMANENT_REDIRECT {
                        return Ok(Some(Self::json("write", what, r).await?));
                    }
                    stored_bytes(&r)
                }
                Err(f) => return Err(f.err),
            };
            if stored >= end && total.is_none() {
                return Ok(None);
            }
            if stored < offset || stored > end {
                return Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    format!("write {what:?}: Drive holds {stored} bytes of an upload at {offset}..{end}"),
                ));
            }
            if stored == at {
                stalls += 1;
                if stalls > self.retries {
                    return Err(StoreError::new(
                        StoreErrorKind::Unavailable,
                        format!("write {what:?}: Drive keeps none of the bytes from {at}"),
                    ));
                }
            }
            tracing::debug!(what, at, stored, "drive: resuming the upload from what Drive holds");
            at = stored;
        }
    }
}

/// How many bytes a resumable upload holds, from a 308's `Range: bytes=0-N` (none: 0).
fn stored_bytes(r: &Response) -> u64 {
    r.headers()
        .get("Range")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().strip_prefix("bytes=0-"))
        .and_then(|n| n.parse::<u64>().ok())
        .map_or(0, |n| n + 1)
}

fn upload_target(id: Option<&str>) -> (Method, String) {
    match id {
        Some(id) => (Method::PATCH, format!("/upload/drive/v3/files/{id}")),
        None => (Method::POST, "/upload/drive/v3/files".into()),
    }
}
