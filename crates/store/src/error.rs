//! The store layer's error type. The core maps it to an errno in exactly one place.

use std::fmt;

/// What kind of failure a store call had; the core decides the errno from this alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// The object (or bucket) does not exist.
    NotFound,
    /// Credentials were refused or lack permission.
    PermissionDenied,
    /// A conditional request failed: the object changed (ETag/generation mismatch).
    Changed,
    /// A create-only upload ([`crate::PutOpts::if_not_exists`]) found the key taken.
    Exists,
    /// The store refused the key's name: too long, or characters it does not take (MinIO
    /// keeps a directory marker under a name 9 bytes longer, and calls one past 255 bytes
    /// `XMinioInvalidObjectName`; S3's `KeyTooLongError`; a local folder's `ENAMETOOLONG`).
    InvalidName,
    /// The server asked us to slow down and retries ran out.
    RateLimited,
    /// The operation is not supported by this store.
    Unsupported,
    /// The store was configured wrongly (bad URL, bad option).
    Config,
    /// A timeout or an unreachable server.
    Unavailable,
    /// Anything else.
    Other,
}

/// An error from a store call, with the operation and key it concerned.
#[derive(Debug, Clone)]
pub struct StoreError {
    pub kind: StoreErrorKind,
    pub message: String,
    /// The store did not answer within the request's timeout, on every try the store
    /// layer made: a caller that tries again waits as long again.
    pub timed_out: bool,
}

impl StoreError {
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), timed_out: false }
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::NotFound, what)
    }

    /// This error as the result of an upload made with `if_not_exists`: its failed
    /// precondition (412, or 409 for a concurrent one) means the key is taken.
    pub fn if_created(self, if_not_exists: bool) -> Self {
        match self.kind {
            StoreErrorKind::Changed if if_not_exists => Self { kind: StoreErrorKind::Exists, ..self },
            _ => self,
        }
    }

    /// Translate an OpenDAL error for operation `op` on `key`.
    pub(crate) fn from_opendal(op: &str, key: &str, e: opendal::Error) -> Self {
        use opendal::ErrorKind as K;
        let full = format!("{e:?}");
        // Matched on the parts a key cannot forge: the S3 error code, OpenDAL's own message,
        // the causes' text (the context and a response's `resource` name the key: a key
        // holding `NoSuchBucket` or `timeout` changed the kind of every error about it).
        let code = s3_code(e.message());
        let causes = causes_text(&e);
        let kind = match e.kind() {
            _ if code == Some("NoSuchBucket") => StoreErrorKind::NotFound,
            // (OpenDAL's message says "signing http request" and its cause the rest.)
            // (Not when the credentials' own server did not answer: a timeout of the
            // instance metadata service is the store being unreachable.)
            _ if (e.message().contains("failed to load signing credential")
                || causes.contains("failed to load signing credential"))
                && !is_unreachable(&e) =>
            {
                StoreErrorKind::PermissionDenied
            }
            _ if code.is_some_and(|c| c.ends_with("InvalidObjectName") || c == "KeyTooLongError")
                || causes.contains("file name too long") =>
            {
                StoreErrorKind::InvalidName
            }
            K::NotFound => StoreErrorKind::NotFound,
            K::PermissionDenied => StoreErrorKind::PermissionDenied,
            K::ConditionNotMatch => StoreErrorKind::Changed,
            // Every range asked for lies inside the size the caller knew: a 416 means the
            // object is shorter now, i.e. another version (a read pinned to it gets ESTALE).
            K::RangeNotSatisfied => StoreErrorKind::Changed,
            K::RateLimited => StoreErrorKind::RateLimited,
            K::Unsupported => StoreErrorKind::Unsupported,
            K::ConfigInvalid => StoreErrorKind::Config,
            _ if is_unreachable(&e) => StoreErrorKind::Unavailable,
            _ => StoreErrorKind::Other,
        };
        let detail = match kind {
            StoreErrorKind::Unavailable => unreachable_summary(&e, &full),
            _ => summary(&e, &full),
        };
        Self { timed_out: is_timeout(&e), ..Self::new(kind, redact_urls(&format!("{op} {key:?}: {detail}"))) }
    }
}

/// `text` with every URL's `user:password@` cut (`http://u:p@host/x` -> `http://host/x`):
/// an endpoint given with credentials in it must not reach a message or a log.
pub fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        out.push_str(&rest[..i + 3]);
        rest = &rest[i + 3..];
        let end = rest.find(|c: char| "/?#\"'".contains(c) || c.is_whitespace()).unwrap_or(rest.len());
        if let Some(at) = rest[..end].rfind('@') {
            rest = &rest[at + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// The code of an S3 error response as OpenDAL gives it (`S3Error { code: "NoSuchBucket",
/// ... }`): the key can appear in it only escaped, inside `resource: "..."`.
fn s3_code(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("S3Error { code: \"")?;
    rest.split_once('"').map(|(code, _)| code)
}

/// The text of an error's cause chain, lower case.
fn causes_text(e: &opendal::Error) -> String {
    let mut causes = Vec::new();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        causes.push(c.to_string().to_lowercase());
        src = c.source();
    }
    causes.join(" ")
}

/// OpenDAL's `TimeoutLayer` gave up on the call (its retries, if any, as well).
fn is_timeout(e: &opendal::Error) -> bool {
    e.kind() == opendal::ErrorKind::Unexpected && e.message().ends_with("timeout reached")
}

/// What a user needs of a store that did not answer: how long was waited, or the
/// innermost cause (`Connection refused`), and the server asked (scheme, host and port:
/// the context's URL, never its path, which holds the key). OpenDAL's own words ("send
/// http request, source: error sending request") named neither (tester Q).
fn unreachable_summary(e: &opendal::Error, full: &str) -> String {
    let server = full.split_once("url: ").and_then(|(_, rest)| {
        let (scheme, after) = rest.split_once("://")?;
        let host = after.split(['/', '?', ',', ' ', '}']).next()?;
        Some(format!(" at {scheme}://{host}"))
    });
    let server = server.unwrap_or_default();
    if is_timeout(e) {
        let secs =
            full.split_once("timeout: ").map(|(_, r)| r.chars().take_while(char::is_ascii_digit).collect::<String>());
        return match secs.filter(|s| !s.is_empty()) {
            Some(s) => format!("no answer from the store{server} within {s} s"),
            None => format!("no answer from the store{server} in time"),
        };
    }
    let mut innermost = None;
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        innermost = Some(c.to_string());
        src = c.source();
    }
    match innermost {
        Some(cause) => {
            format!("cannot reach the store{server}: {}", cause.split_whitespace().collect::<Vec<_>>().join(" "))
        }
        None => format!("cannot reach the store{server}: {}", e.message()),
    }
}

/// OpenDAL reports transport failures (refused, reset, timeout) as `Unexpected` with a
/// source chain; we look for the usual phrases so the user gets "unreachable", not noise.
fn is_unreachable(e: &opendal::Error) -> bool {
    // Only the cause chain and OpenDAL's timeout message: the context of an OpenDAL error
    // names layers, URLs and the key, which would match these phrases by accident.
    let text = causes_text(e);
    is_timeout(e)
        || [
            "error sending request",
            "connection refused",
            "timed out",
            "dns error",
            "connect error",
            "connection reset",
        ]
        .iter()
        .any(|p| text.contains(p))
}

/// OpenDAL's Display carries the whole HTTP response; a user wants one short line: the
/// error kind, plus the server's own code and message (S3 `code`/`message`, GCS `message`)
/// or, for transport errors, the innermost cause.
fn summary(e: &opendal::Error, full: &str) -> String {
    let quoted = |field: &str| {
        let start = full.find(&format!("{field}: \""))? + field.len() + 3;
        let end = full[start..].find('"')? + start;
        Some(full[start..end].to_string())
    };
    let detail = match (quoted("code"), quoted("message")) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        (None, Some(m)) => m,
        _ => e.to_string().rsplit("=> ").next().unwrap_or_default().to_string(),
    };
    let mut line: String = format!("{} ({})", e.kind(), detail.split_whitespace().collect::<Vec<_>>().join(" "));
    if line.len() > 240 {
        let mut cut = 240;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
        line.push('…');
    }
    line
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StoreError {}

/// A store that does not answer is named, with how long was waited or why.
#[cfg(test)]
#[test]
fn an_unreachable_store_is_named() {
    use opendal::{Error, ErrorKind as K};
    let timeout = Error::new(K::Unexpected, "operation timeout reached").with_context("timeout", "30");
    let e = StoreError::from_opendal("head", "k", timeout);
    assert!(e.timed_out && e.kind == StoreErrorKind::Unavailable);
    assert_eq!(e.message, "head \"k\": no answer from the store within 30 s");
    let refused = Error::new(K::Unexpected, "send http request")
        .with_context("url", "http://u:pw@127.0.0.1:1/bkt/secret-key?x=1")
        .set_source(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused (os error 111)"));
    let e = StoreError::from_opendal("list", "p/", refused);
    assert!(!e.timed_out && e.kind == StoreErrorKind::Unavailable);
    assert_eq!(
        e.message,
        "list \"p/\": cannot reach the store at http://127.0.0.1:1: Connection refused (os error 111)"
    );
}

#[cfg(test)]
#[test]
fn urls_lose_their_credentials() {
    assert_eq!(
        redact_urls("at http://u:EpSeCrEt@h:9000/b, url: https://x@h2/k?a=b@c then s3://b/k@1"),
        "at http://h:9000/b, url: https://h2/k?a=b@c then s3://b/k@1"
    );
    assert_eq!(redact_urls("no url"), "no url");
    assert_eq!(redact_urls("http://host?x=a@b and http://u:p@h#f@g"), "http://host?x=a@b and http://h#f@g");
}

/// The kind comes from what the store said, never from the key: a key holding
/// `NoSuchBucket` or `timeout` changed the kind of every error about it.
#[test]
fn kinds_do_not_depend_on_the_key() {
    use opendal::{Error, ErrorKind as K};
    let s3 = |code: &str, key: &str| {
        Error::new(
            K::Unexpected,
            format!(
                "S3Error {{ code: {code:?}, message: \"m\", resource: {:?}, request_id: \"r\" }}",
                format!("/b/{key}")
            ),
        )
        .with_context("path", key)
    };
    let kind = |e: Error, key: &str| StoreError::from_opendal("op", key, e).kind;
    assert_eq!(kind(s3("InvalidRequest", "logs/timeout.json"), "logs/timeout.json"), StoreErrorKind::Other);
    let changed = Error::new(K::ConditionNotMatch, "precondition failed").with_context("path", "NoSuchBucket/x");
    assert_eq!(kind(changed, "NoSuchBucket/x"), StoreErrorKind::Changed);
    assert_eq!(kind(s3("InvalidRequest", "InvalidObjectName"), "InvalidObjectName"), StoreErrorKind::Other);
    // What the store says still counts.
    assert_eq!(kind(s3("NoSuchBucket", "k"), "k"), StoreErrorKind::NotFound);
    assert_eq!(kind(s3("XMinioInvalidObjectName", "k"), "k"), StoreErrorKind::InvalidName);
    assert_eq!(kind(s3("KeyTooLongError", "k"), "k"), StoreErrorKind::InvalidName);
    assert_eq!(kind(Error::new(K::Unexpected, "operation timeout reached"), "k"), StoreErrorKind::Unavailable);
    let timeout_in_key = Error::new(K::Unexpected, "io failed").with_context("path", "timeout reached");
    assert!(!StoreError::from_opendal("op", "timeout reached", timeout_in_key).timed_out);
    let long = Error::new(K::Unexpected, "write failed")
        .set_source(std::io::Error::from_raw_os_error(36 /* ENAMETOOLONG */));
    assert_eq!(kind(long, "k"), StoreErrorKind::InvalidName);
}
