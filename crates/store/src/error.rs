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

    /// Translate an OpenDAL error for operation `op` on `key`.
    pub(crate) fn from_opendal(op: &str, key: &str, e: opendal::Error) -> Self {
        use opendal::ErrorKind as K;
        let kind = match e.kind() {
            K::NotFound => StoreErrorKind::NotFound,
            K::PermissionDenied => StoreErrorKind::PermissionDenied,
            K::ConditionNotMatch => StoreErrorKind::Changed,
            K::RateLimited => StoreErrorKind::RateLimited,
            K::Unsupported => StoreErrorKind::Unsupported,
            K::ConfigInvalid => StoreErrorKind::Config,
            _ if is_unreachable(&e) => StoreErrorKind::Unavailable,
            _ => StoreErrorKind::Other,
        };
        Self::new(kind, format!("{op} {key:?}: {}", one_line(&e)))
    }
}

/// OpenDAL reports transport failures (refused, reset, timeout) as `Unexpected` with a
/// source chain; we look for the usual phrases so the user gets "unreachable", not noise.
fn is_unreachable(e: &opendal::Error) -> bool {
    let text = format!("{e:?}").to_lowercase();
    ["error sending request", "connection refused", "timed out", "timeout", "dns error", "connect error"]
        .iter()
        .any(|p| text.contains(p))
}

/// OpenDAL's Display spans several lines with context; a user wants one.
fn one_line(e: &opendal::Error) -> String {
    let s = e.to_string();
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StoreError {}
