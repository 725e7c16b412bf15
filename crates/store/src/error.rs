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
}

impl StoreError {
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
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
        Self::new(kind, redact_urls(&format!("{op} {key:?}: {}", summary(&e, &full))))
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

/// OpenDAL reports transport failures (refused, reset, timeout) as `Unexpected` with a
/// source chain; we look for the usual phrases so the user gets "unreachable", not noise.
fn is_unreachable(e: &opendal::Error) -> bool {
    // Only the cause chain and OpenDAL's timeout message: the context of an OpenDAL error
    // names layers, URLs and the key, which would match these phrases by accident.
    let text = causes_text(e);
    e.kind() == opendal::ErrorKind::Unexpected && e.message().ends_with("timeout reached")
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
    let long = Error::new(K::Unexpected, "write failed")
        .set_source(std::io::Error::from_raw_os_error(36 /* ENAMETOOLONG */));
    assert_eq!(kind(long, "k"), StoreErrorKind::InvalidName);
}
