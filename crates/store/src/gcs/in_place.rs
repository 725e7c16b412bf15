//! A compose whose destination is one of its sources: GCS's way to append to an object
//! (`compose` of the object's generation and a tail, into the object itself). OpenDAL
//! refuses such a compose before sending it, so the request names the destination
//! [`in_place`]`(key)`, and this HTTP transport wrapper takes the marker out of the URL on
//! the way (only for a compose sent inside [`composing_in_place`], and only right after
//! the store's root: a user's key under the marker, or one that merely contains it, is
//! never touched): GCS then composes into `key`. If the wrapper ever stopped matching, the
//! compose would make `.bucketfs-in-place/<key>` instead; the store conformance test reads
//! the appended key back, so it would fail. The destination is named only in the URL (the
//! body names the sources), and GCS requests are signed by a bearer token, not over the
//! URL, so the request stays valid. Without it an append took two composes (into a
//! temporary object, then onto the key): one round trip more, and an emulator copied the
//! whole object twice.

use opendal::{Buffer, HttpBody, HttpTransport, HttpTransporter};
use percent_encoding::{percent_decode_str, utf8_percent_encode, NON_ALPHANUMERIC};

/// The marker before a key that makes a compose's destination that key itself.
const MARKER: &str = ".bucketfs-in-place/";

tokio::task_local! {
    /// Set by [`composing_in_place`]: only a compose sent in its scope is rewritten. A
    /// user's own key under the marker (`.bucketfs-in-place/big`, composed from its parts
    /// on an emulator, or by `bucketfs cp`) is never taken for one.
    static IN_PLACE: ();
}

/// Run `f`, a compose into [`in_place`]`(key)`, so that it goes into `key` itself.
pub async fn composing_in_place<T>(f: impl std::future::Future<Output = T>) -> T {
    IN_PLACE.scope((), f).await
}

/// Whether the request being sent belongs to a [`composing_in_place`].
fn in_scope() -> bool {
    IN_PLACE.try_with(|_| ()).is_ok()
}

/// The destination to give OpenDAL's compose for a compose into `key` itself.
pub fn in_place(key: &str) -> String {
    format!("{MARKER}{key}")
}

/// Wraps the operator's transport; everything but a compose into [`in_place`] passes as is.
pub struct InPlaceCompose {
    pub inner: HttpTransporter,
    /// The operator's root as object names carry it (`""`, or `sub/dir/`): the marker
    /// counts only right after it, so a key that merely contains it is never rewritten.
    pub root: String,
}

impl HttpTransport for InPlaceCompose {
    async fn fetch(&self, mut req: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
        if req.method() == http::Method::POST && in_scope() {
            if let Some(uri) = rewritten(req.uri(), &self.root) {
                *req.uri_mut() = uri;
            }
        }
        self.inner.fetch(req).await
    }
}

/// The URI of a compose (`.../o/<name>/compose`) whose destination is `root` + the marker +
/// a key, with the marker taken out.
fn rewritten(uri: &http::Uri, root: &str) -> Option<http::Uri> {
    let (before, rest) = uri.path().split_once("/o/")?;
    let name = percent_decode_str(rest.strip_suffix("/compose")?).decode_utf8().ok()?;
    let key = name.strip_prefix(root)?.strip_prefix(MARKER)?;
    let name = utf8_percent_encode(&format!("{root}{key}"), NON_ALPHANUMERIC).to_string();
    let path_and_query = match uri.query() {
        Some(q) => format!("{before}/o/{name}/compose?{q}"),
        None => format!("{before}/o/{name}/compose"),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().ok()?);
    http::Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(s: &str, root: &str) -> Option<String> {
        rewritten(&s.parse().unwrap(), root).map(|u| u.to_string())
    }

    #[tokio::test]
    async fn only_a_compose_in_place_is_in_scope() {
        assert!(!in_scope(), "a compose of a user's key under the marker");
        assert!(composing_in_place(async { in_scope() }).await);
        assert!(!in_scope());
    }

    #[test]
    fn only_a_compose_into_the_marker_after_the_root_is_rewritten() {
        let c = "http://gcs/storage/v1/b/bkt/o/.bucketfs-in-place%2Fdir%2Fa%20b.log/compose?ifGenerationMatch=7";
        assert_eq!(
            rw(c, "").as_deref(),
            Some("http://gcs/storage/v1/b/bkt/o/dir%2Fa%20b%2Elog/compose?ifGenerationMatch=7")
        );
        let c = "http://gcs/storage/v1/b/bkt/o/pre%2F.bucketfs-in-place%2Fa/compose";
        assert_eq!(rw(c, "pre/").as_deref(), Some("http://gcs/storage/v1/b/bkt/o/pre%2Fa/compose"));
        assert_eq!(rw(c, ""), None, "the marker is not at the start of the name");
        let user = "http://gcs/storage/v1/b/bkt/o/d%2F.bucketfs-in-place%2Fbig/compose";
        assert_eq!(rw(user, ""), None, "a key that merely contains the marker");
        assert_eq!(rw("http://gcs/storage/v1/b/bkt/o/dir%2Fa/compose", ""), None, "no marker");
        assert_eq!(rw("http://gcs/upload/storage/v1/b/bkt/o?name=.bucketfs-in-place%2Fa", ""), None);
        assert_eq!(rw("http://gcs/storage/v1/b/bkt/o/.bucketfs-in-place%2Fa", ""), None, "not a compose");
    }
}
