//! An S3 object's additional checksum on HEAD, for `bucketfs cp`'s downloads (see
//! [`crate::location`]'s `StoreOptions::s3_checksum_mode`).
//!
//! S3 (and MinIO) answer HeadObject with the object's checksum (`x-amz-checksum-crc32`,
//! `-crc32c`, `-crc64nvme`, `-sha1` or `-sha256`, and `x-amz-checksum-type`) only when the
//! request carries `x-amz-checksum-mode: ENABLED`. OpenDAL's `stat` has no such option and
//! its `Metadata` keeps no such header, so a wrapper of the operator's HTTP transport
//! (OpenDAL's public `HttpTransport`) does both ends:
//!
//! - a HEAD sent inside [`asking`] gets the header, and the checksum headers of its answer
//!   go back to the caller through the same task-local slot (OpenDAL's `stat` runs the
//!   transport on the caller's task; the retry and timeout layers spawn nothing);
//! - the header must be signed: S3 refuses a request with an `x-amz-*` header outside its
//!   SigV4 `SignedHeaders` ("There were headers present in the request which were not
//!   signed"), and OpenDAL signs before the transport sees the request. The wrapper signs
//!   that HEAD again with reqsign (the library OpenDAL signs with) and a credential chain
//!   built like the operator's. MinIO accepts the header either way. If signing fails the
//!   original request goes out unchanged: no checksum, `cp` verifies by MD5 instead.
//! - a multipart object's answer (a COMPOSITE checksum or an ETag ending in `-N`) says how
//!   many parts, not how big: a second HEAD of `?partNumber=1` (S3 and MinIO answer it with
//!   that part's `Content-Length`) tells the part size, so `cp` rebuilds the checksum from
//!   the parts as uploaded instead of guessing their size.

use std::cell::RefCell;
use std::future::Future;

use opendal::{Buffer, HttpBody, HttpTransport, HttpTransporter, Operator};
use reqsign_aws_v4::{Credential, DefaultCredentialProvider, RequestSigner};
use reqsign_core::{Context, OsEnv, Signer};

use crate::ObjectChecksum;

const MODE: &str = "x-amz-checksum-mode";
/// Algorithms S3 has, in the order one is picked if an answer carries several.
const ALGORITHMS: [&str; 5] = ["crc32c", "crc32", "crc64nvme", "sha256", "sha1"];

tokio::task_local! {
    /// Set by [`asking`]: HEADs in its scope ask for the checksum, and leave it here.
    static ASKED: RefCell<Asked>;
}

/// What the last HEAD inside [`asking`] told beyond OpenDAL's metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asked {
    /// The object's checksum (`None` from a store that keeps none or is not wrapped).
    pub checksum: Option<ObjectChecksum>,
    /// A multipart object's first part's size, where the store told it.
    pub first_part: Option<u64>,
}

/// Run `f` (an operator `stat`) asking for the object's checksum and, for a multipart
/// object, its first part's size.
pub async fn asking<T>(f: impl Future<Output = T>) -> (T, Asked) {
    ASKED.scope(RefCell::default(), async { (f.await, ASKED.with(|c| c.take())) }).await
}

/// `op` (an S3 operator) with its transport wrapped in [`ChecksumMode`]. `region`,
/// `profile` and `imds` are those the operator was built with, so the HEAD is signed
/// again with the same credentials.
pub fn with_checksum_mode(op: Operator, region: &str, profile: Option<&str>, imds: bool) -> Operator {
    let inner = op.context().http_transport().clone();
    let mut creds = DefaultCredentialProvider::builder();
    if let Some(p) = profile.filter(|p| !p.is_empty()) {
        creds = creds.with_profile(p);
    }
    if !imds {
        creds = creds.no_imds();
    }
    let ctx = Context::new()
        .with_file_read(reqsign_file_read_tokio::TokioFileRead)
        .with_env(OsEnv)
        .with_http_send(inner.clone());
    let signer = Signer::new(ctx, creds.build(), RequestSigner::new("s3", region));
    let ctx = op.context().with_http_transport(HttpTransporter::new(ChecksumMode { inner, signer }));
    op.with_context(ctx)
}

/// Wraps an S3 operator's transport; requests outside [`asking`] pass through unchanged.
pub struct ChecksumMode {
    pub inner: HttpTransporter,
    pub signer: Signer<Credential>,
}

impl ChecksumMode {
    /// `req` asking for the checksum, signed again if it was signed.
    async fn ask(&self, req: &http::Request<Buffer>) -> Option<http::Request<Buffer>> {
        let mut parts = req.clone().into_parts().0;
        parts.headers.insert(MODE, http::HeaderValue::from_static("ENABLED"));
        if parts.headers.remove(http::header::AUTHORIZATION).is_some() {
            // A fresh date and token: the signer sets both.
            parts.headers.remove("x-amz-date");
            parts.headers.remove("x-amz-security-token");
            if let Err(e) = self.signer.sign(&mut parts, None).await {
                tracing::debug!("not asking for the object's checksum: signing failed: {e}");
                return None;
            }
            // As OpenDAL does after signing: the HTTP client sets Host itself.
            parts.headers.remove(http::header::HOST);
        }
        Some(http::Request::from_parts(parts, req.body().clone()))
    }
}

impl HttpTransport for ChecksumMode {
    async fn fetch(&self, req: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
        let asked = req.method() == http::Method::HEAD && ASKED.try_with(|_| ()).is_ok();
        let req = match asked {
            true => self.ask(&req).await.unwrap_or(req),
            false => req,
        };
        let first = asked.then(|| first_part_head(&req)).flatten();
        let resp = self.inner.fetch(req).await?;
        if asked && resp.status().is_success() {
            let checksum = checksum_of(resp.headers());
            let first_part = match first.filter(|_| multipart(resp.headers(), checksum.as_ref())) {
                Some(first) => self.first_part(first).await,
                None => None,
            };
            let _ = ASKED.try_with(|c| *c.borrow_mut() = Asked { checksum, first_part });
        }
        Ok(resp)
    }
}

impl ChecksumMode {
    /// The size of the first part, from the answer to `head` (of `?partNumber=1`), if any.
    async fn first_part(&self, head: http::Request<Buffer>) -> Option<u64> {
        let head = self.ask(&head).await?;
        let resp = match self.inner.fetch(head).await {
            Ok(r) if r.status().is_success() => r,
            Ok(r) => {
                tracing::debug!(status = %r.status(), "no part size: HEAD of part 1 refused");
                return None;
            }
            Err(e) => {
                tracing::debug!("no part size: HEAD of part 1 failed: {e}");
                return None;
            }
        };
        let len = resp.headers().get(http::header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok();
        len.filter(|&n: &u64| n > 0)
    }
}

/// `req` (a HEAD) for the object's first part: the same with `partNumber=1` in its query.
fn first_part_head(req: &http::Request<Buffer>) -> Option<http::Request<Buffer>> {
    let uri = req.uri();
    let query = match uri.query() {
        Some(q) if !q.is_empty() => format!("{q}&partNumber=1"),
        _ => "partNumber=1".to_string(),
    };
    let uri: http::Uri = format!("{}?{query}", uri.path()).parse().ok()?;
    let mut parts = uri.into_parts();
    (parts.scheme, parts.authority) = (req.uri().scheme().cloned(), req.uri().authority().cloned());
    let mut head = http::Request::new(req.body().clone());
    *head.method_mut() = req.method().clone();
    *head.uri_mut() = http::Uri::from_parts(parts).ok()?;
    *head.headers_mut() = req.headers().clone();
    Some(head)
}

/// Whether an answer is of an object uploaded in more than one part.
fn multipart(h: &http::HeaderMap, checksum: Option<&ObjectChecksum>) -> bool {
    let etag_parts = h.get(http::header::ETAG).and_then(|v| v.to_str().ok()).and_then(crate::multipart_etag_parts);
    checksum.and_then(|c| c.parts).or(etag_parts).is_some_and(|n| n > 1)
}

/// The checksum an answer's headers carry, if any (and readable).
fn checksum_of(h: &http::HeaderMap) -> Option<ObjectChecksum> {
    use base64::Engine;
    let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(|v| v.trim().to_string());
    let (algorithm, value) =
        ALGORITHMS.iter().find_map(|a| Some((a.to_string(), text(&format!("x-amz-checksum-{a}"))?)))?;
    let (b64, parts) = match value.split_once('-') {
        Some((b64, n)) => (b64, Some(n.parse::<u64>().ok().filter(|n| *n > 0)?)),
        None => (value.as_str(), None),
    };
    let digest = base64::engine::general_purpose::STANDARD.decode(b64).ok().filter(|d| !d.is_empty())?;
    Some(ObjectChecksum { algorithm, digest, parts, kind: text("x-amz-checksum-type") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A fake S3: keeps the request it got, answers with the given headers.
    #[derive(Clone, Default)]
    struct Fake {
        got: Arc<Mutex<Option<http::request::Parts>>>,
        answer: Vec<(&'static str, &'static str)>,
    }
    impl HttpTransport for Fake {
        async fn fetch(&self, req: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
            *self.got.lock().unwrap() = Some(req.into_parts().0);
            let mut b = http::Response::builder().status(200);
            for (k, v) in &self.answer {
                b = b.header(*k, *v);
            }
            Ok(b.body(HttpBody::new(futures::stream::empty(), Some(0))).unwrap())
        }
    }

    fn mode(fake: &Fake) -> ChecksumMode {
        let creds = reqsign_aws_v4::StaticCredentialProvider::new("AKID", "secret");
        let signer = Signer::new(Context::new(), creds, RequestSigner::new("s3", "us-east-1"));
        ChecksumMode { inner: HttpTransporter::new(fake.clone()), signer }
    }

    fn head(signed: bool) -> http::Request<Buffer> {
        let mut b = http::Request::head("http://s3.test/b/k");
        if signed {
            let auth = "AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/s3/aws4_request, \
                        SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=00";
            b = b.header("authorization", auth).header("x-amz-date", "20260101T000000Z");
            b = b.header("x-amz-content-sha256", "UNSIGNED-PAYLOAD");
        }
        b.body(Buffer::new()).unwrap()
    }

    #[tokio::test]
    async fn a_head_asked_for_its_checksum_signs_the_header() {
        let fake = Fake {
            answer: vec![("x-amz-checksum-crc32", "7VmA/g==-3"), ("x-amz-checksum-type", "COMPOSITE")],
            ..Default::default()
        };
        let m = mode(&fake);
        let (r, asked) = asking(m.fetch(head(true))).await;
        assert!(r.is_ok());
        let sum = asked.checksum;
        let want = ObjectChecksum {
            algorithm: "crc32".into(),
            digest: vec![0xed, 0x59, 0x80, 0xfe],
            parts: Some(3),
            kind: Some("COMPOSITE".into()),
        };
        assert_eq!(sum, Some(want));
        let got = fake.got.lock().unwrap().take().unwrap();
        assert_eq!(got.headers[MODE], "ENABLED");
        let auth = got.headers["authorization"].to_str().unwrap();
        assert!(auth.contains("SignedHeaders=host;x-amz-checksum-mode;x-amz-content-sha256;x-amz-date,"), "{auth}");
        assert!(!auth.ends_with("Signature=00"), "{auth}");
        assert_ne!(got.headers["x-amz-date"], "20260101T000000Z", "a fresh date");
        assert!(!got.headers.contains_key("host"));
    }

    #[tokio::test]
    async fn a_multipart_objects_first_part_is_asked_for_its_size() {
        let fake = Fake {
            answer: vec![("etag", "\"0123456789abcdef0123456789abcdef-3\""), ("content-length", "5255225")],
            ..Default::default()
        };
        let m = mode(&fake);
        let (_, asked) = asking(m.fetch(head(true))).await;
        assert_eq!(asked.first_part, Some(5255225));
        // The last request was part 1's HEAD, signed with its query.
        let got = fake.got.lock().unwrap().take().unwrap();
        assert_eq!(got.uri.to_string(), "http://s3.test/b/k?partNumber=1");
        assert_eq!(got.headers[MODE], "ENABLED");
        assert!(!got.headers["authorization"].to_str().unwrap().ends_with("Signature=00"));
        // One part, or a single-request upload: no second HEAD.
        for etag in ["\"0123456789abcdef0123456789abcdef-1\"", "\"0123456789abcdef0123456789abcdef\""] {
            let fake = Fake { answer: vec![("etag", etag), ("content-length", "9")], ..Default::default() };
            let (_, asked) = asking(mode(&fake).fetch(head(true))).await;
            assert_eq!(asked.first_part, None);
            assert_eq!(fake.got.lock().unwrap().take().unwrap().uri.query(), None);
        }
    }

    #[tokio::test]
    async fn other_requests_pass_unchanged() {
        let fake = Fake { answer: vec![("x-amz-checksum-crc32c", "AAAAAQ==")], ..Default::default() };
        let m = mode(&fake);
        // Outside `asking`: nothing added, nothing signed again.
        m.fetch(head(true)).await.unwrap();
        let got = fake.got.lock().unwrap().take().unwrap();
        assert!(!got.headers.contains_key(MODE));
        assert!(got.headers["authorization"].to_str().unwrap().ends_with("Signature=00"));
        // A GET inside `asking` is not a HEAD: unchanged.
        let get = http::Request::get("http://s3.test/b/k").body(Buffer::new()).unwrap();
        let (_, asked) = asking(m.fetch(get)).await;
        assert_eq!(asked, Asked::default());
        assert!(!fake.got.lock().unwrap().take().unwrap().headers.contains_key(MODE));
        // An unsigned (anonymous) HEAD gets the header and stays unsigned.
        let (_, asked) = asking(m.fetch(head(false))).await;
        assert_eq!(
            asked.checksum.map(|s| (s.algorithm, s.digest, s.parts, s.kind)),
            Some(("crc32c".into(), vec![0, 0, 0, 1], None, None))
        );
        let got = fake.got.lock().unwrap().take().unwrap();
        assert_eq!(got.headers[MODE], "ENABLED");
        assert!(!got.headers.contains_key("authorization"));
    }

    #[tokio::test]
    async fn an_answer_without_a_readable_checksum_gives_none() {
        for answer in
            [vec![], vec![("x-amz-checksum-crc32", "not base64!")], vec![("x-amz-checksum-crc32", "AAAAAQ==-x")]]
        {
            let fake = Fake { answer, ..Default::default() };
            let (_, asked) = asking(mode(&fake).fetch(head(true))).await;
            assert_eq!(asked.checksum, None);
        }
        // An algorithm cp cannot check is still reported, for the caller to decide.
        let fake = Fake {
            answer: vec![("x-amz-checksum-sha256", "AAAA"), ("x-amz-checksum-type", "FULL_OBJECT")],
            ..Default::default()
        };
        let (_, asked) = asking(mode(&fake).fetch(head(true))).await;
        assert_eq!(asked.checksum.map(|s| (s.algorithm, s.parts)), Some(("sha256".into(), None)));
    }
}
