//! A compose whose destination is one of its sources: GCS's way to append to an object
//! (`compose` of the object's generation and a tail, into the object itself). OpenDAL
//! refuses such a compose before sending it, so the request names the destination
//! [`in_place`]`(key)`, and this HTTP transport wrapper takes the marker out of the URL on
//! the way: GCS then composes into `key`. The destination is named only in the URL (the
//! body names the sources), and GCS requests are signed by a bearer token, not over the
//! URL, so the request stays valid. Without it an append took two composes (into a
//! temporary object, then onto the key): one round trip more, and an emulator copied the
//! whole object twice.

use opendal::{Buffer, HttpBody, HttpTransport, HttpTransporter};

/// The marker before a key that makes a compose's destination that key itself.
const MARKER: &str = ".bucketfs-in-place/";
/// [`MARKER`] as it appears in the URL path (a `/` in an object name is sent as `%2F`).
const MARKER_IN_URL: &str = ".bucketfs-in-place%2F";

/// The destination to give OpenDAL's compose for a compose into `key` itself.
pub fn in_place(key: &str) -> String {
    format!("{MARKER}{key}")
}

/// Wraps the operator's transport; everything but a compose into [`in_place`] passes as is.
pub struct InPlaceCompose {
    pub inner: HttpTransporter,
}

impl HttpTransport for InPlaceCompose {
    async fn fetch(&self, mut req: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
        if req.method() == http::Method::POST {
            if let Some(uri) = rewritten(req.uri()) {
                *req.uri_mut() = uri;
            }
        }
        self.inner.fetch(req).await
    }
}

/// The URI of a compose (`.../o/<name>/compose`) whose destination carries the marker,
/// with the marker taken out (after the store's root prefix, if any).
fn rewritten(uri: &http::Uri) -> Option<http::Uri> {
    let path = uri.path();
    let (before, rest) = path.split_once("/o/")?;
    let name = rest.strip_suffix("/compose")?;
    let at = name.find(MARKER_IN_URL)?;
    let name = format!("{}{}", &name[..at], &name[at + MARKER_IN_URL.len()..]);
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

    fn rw(s: &str) -> Option<String> {
        rewritten(&s.parse().unwrap()).map(|u| u.to_string())
    }

    #[test]
    fn only_a_compose_into_the_marker_is_rewritten() {
        let c = "http://gcs/storage/v1/b/bkt/o/.bucketfs-in-place%2Fdir%2Fa.log/compose?ifGenerationMatch=7";
        assert_eq!(rw(c).as_deref(), Some("http://gcs/storage/v1/b/bkt/o/dir%2Fa.log/compose?ifGenerationMatch=7"));
        // Under a root prefix: the marker follows it.
        let c = "http://gcs/storage/v1/b/bkt/o/pre%2F.bucketfs-in-place%2Fa/compose";
        assert_eq!(rw(c).as_deref(), Some("http://gcs/storage/v1/b/bkt/o/pre%2Fa/compose"));
        assert_eq!(rw("http://gcs/storage/v1/b/bkt/o/dir%2Fa/compose"), None, "no marker");
        assert_eq!(rw("http://gcs/upload/storage/v1/b/bkt/o?name=.bucketfs-in-place%2Fa"), None, "not a compose");
        assert_eq!(rw("http://gcs/storage/v1/b/bkt/o/.bucketfs-in-place%2Fa"), None, "not a compose");
    }
}
