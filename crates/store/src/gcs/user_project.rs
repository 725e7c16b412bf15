//! The GCS billing project (`--billing-project`), for requester-pays buckets.
//!
//! A requester-pays bucket refuses requests that do not name the project to bill: the JSON
//! API takes it as the `userProject` query parameter and the XML API as the
//! `x-goog-user-project` header (Google's "Requester Pays" page; the header is also the
//! system parameter every Google API reads for the quota and billing project). OpenDAL's GCS
//! builder has no option for it, so this wrapper of the operator's HTTP transport adds both to
//! every request sent to the storage endpoint. Requests elsewhere (the OAuth token endpoint,
//! the VM metadata server) pass through unchanged: they bill nothing.

use opendal::{Buffer, HttpBody, HttpTransport, HttpTransporter};

const HEADER: &str = "x-goog-user-project";

/// Wraps a GCS operator's transport; see the module doc.
pub struct UserProject {
    pub inner: HttpTransporter,
    /// The storage endpoint (`https://storage.googleapis.com` or the `--endpoint`).
    pub endpoint: String,
    pub project: http::HeaderValue,
}

impl UserProject {
    /// `None` when `project` cannot be a header value (it is checked when the store opens).
    pub fn new(inner: HttpTransporter, endpoint: &str, project: &str) -> Option<Self> {
        let project = http::HeaderValue::from_str(project).ok()?;
        Some(UserProject { inner, endpoint: endpoint.trim_end_matches('/').to_string(), project })
    }

    fn is_storage(&self, uri: &http::Uri) -> bool {
        let s = uri.to_string();
        s.strip_prefix(&self.endpoint).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }
}

impl HttpTransport for UserProject {
    async fn fetch(&self, mut req: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
        if self.is_storage(req.uri()) {
            req.headers_mut().insert(HEADER, self.project.clone());
            if let Some(uri) = with_user_project(req.uri(), self.project.to_str().unwrap_or_default()) {
                *req.uri_mut() = uri;
            }
        }
        self.inner.fetch(req).await
    }
}

/// `uri` with `userProject=P` added when it is a JSON API request (`/storage/v1/`,
/// `/upload/storage/v1/`, `/download/storage/v1/`) that has none yet.
fn with_user_project(uri: &http::Uri, project: &str) -> Option<http::Uri> {
    let path = uri.path();
    let json = ["/storage/v1/", "/upload/storage/v1/", "/download/storage/v1/"].iter().any(|p| path.starts_with(p));
    let query = uri.query().unwrap_or("");
    if !json || query.split('&').any(|p| p.starts_with("userProject=")) {
        return None;
    }
    let value: String = url::form_urlencoded::byte_serialize(project.as_bytes()).collect();
    let pq = if query.is_empty() {
        format!("{path}?userProject={value}")
    } else {
        format!("{path}?{query}&userProject={value}")
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(pq.parse().ok()?);
    http::Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A request's URI and its `x-goog-user-project`.
    type Sent = (String, Option<String>);

    /// Answers 200 and keeps what it was sent.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<Sent>>>);
    impl HttpTransport for Seen {
        async fn fetch(&self, req: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
            let h = req.headers().get(HEADER).map(|v| v.to_str().unwrap().to_string());
            self.0.lock().unwrap().push((req.uri().to_string(), h));
            Ok(http::Response::new(HttpBody::new(futures::stream::empty(), Some(0))))
        }
    }

    async fn sent(uri: &str) -> Sent {
        let seen = Seen::default();
        let t = UserProject::new(HttpTransporter::new(seen.clone()), "http://gcs:4443/", "my-proj").unwrap();
        t.fetch(http::Request::get(uri).body(Buffer::new()).unwrap()).await.unwrap();
        let got = seen.0.lock().unwrap().pop().unwrap();
        got
    }

    #[tokio::test]
    async fn storage_requests_name_the_project_and_others_do_not() {
        let p = Some("my-proj".to_string());
        assert_eq!(
            sent("http://gcs:4443/storage/v1/b/b/o/k?alt=media").await,
            ("http://gcs:4443/storage/v1/b/b/o/k?alt=media&userProject=my-proj".into(), p.clone())
        );
        assert_eq!(
            sent("http://gcs:4443/upload/storage/v1/b/b/o").await,
            ("http://gcs:4443/upload/storage/v1/b/b/o?userProject=my-proj".into(), p.clone())
        );
        // The XML API: the header only.
        assert_eq!(sent("http://gcs:4443/b/k?uploads").await, ("http://gcs:4443/b/k?uploads".into(), p.clone()));
        assert_eq!(
            sent("http://gcs:4443/storage/v1/b/b/o?userProject=x").await,
            ("http://gcs:4443/storage/v1/b/b/o?userProject=x".into(), p)
        );
        assert_eq!(
            sent("https://oauth2.googleapis.com/token").await,
            ("https://oauth2.googleapis.com/token".into(), None)
        );
        assert_eq!(sent("http://gcs:44430/storage/v1/b").await.1, None, "another port is another host");
    }
}
