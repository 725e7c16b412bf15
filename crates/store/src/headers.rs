//! What an upload stores beside its bytes, the same for every kind of upload request (one
//! PUT, a multipart upload, a GCS compose, a patch): the Content-Type (the object's own
//! where a HEAD found one, else guessed from the key), the other headers another client
//! gave the object ([`crate::attrs::Foreign`]), and the user metadata, ours and others'.
//! Each only where the service keeps it: OpenDAL refuses a request that asks for more.

use std::collections::HashMap;

use opendal::Capability;

use crate::PutOpts;

/// The values one upload sends; see [`crate::apply_headers!`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    pub content_type: Option<String>,
    pub cache_control: Option<String>,
    pub content_disposition: Option<String>,
    pub content_encoding: Option<String>,
    pub metadata: Option<HashMap<String, String>>,
}

impl Headers {
    /// For an upload with `put`'s attributes, on a service that can do `cap`; `guessed`:
    /// the Content-Type the mount's policy gives the key.
    pub fn new(cap: &Capability, put: &PutOpts, guessed: Option<String>) -> Self {
        let foreign = put.attrs.foreign.as_deref().cloned().unwrap_or_default();
        let keep = |can: bool, v: Option<String>| v.filter(|_| can);
        Self {
            content_type: keep(cap.write_with_content_type, foreign.content_type.or(guessed)),
            cache_control: keep(cap.write_with_cache_control, foreign.cache_control),
            content_disposition: keep(cap.write_with_content_disposition, foreign.content_disposition),
            content_encoding: keep(cap.write_with_content_encoding, foreign.content_encoding),
            metadata: (cap.write_with_user_metadata && !put.attrs.is_empty()).then(|| put.attrs.to_metadata()),
        }
    }
}

/// Set [`Headers`] `$h` on an OpenDAL upload request `$req` (a write, writer or compose
/// builder: they share these methods but no trait).
#[macro_export]
#[doc(hidden)]
macro_rules! apply_headers {
    ($req:expr, $h:expr) => {{
        let (mut req, h) = ($req, $h);
        if let Some(v) = &h.content_type {
            req = req.content_type(v);
        }
        if let Some(v) = &h.cache_control {
            req = req.cache_control(v);
        }
        if let Some(v) = &h.content_disposition {
            req = req.content_disposition(v);
        }
        if let Some(v) = &h.content_encoding {
            req = req.content_encoding(v);
        }
        if let Some(m) = &h.metadata {
            req = req.user_metadata(m.clone());
        }
        req
    }};
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attrs::{FileAttrs, Foreign};

    #[test]
    fn the_objects_own_headers_win_over_the_guess_where_the_service_keeps_them() {
        let foreign = Foreign {
            content_type: Some("text/x-custom".into()),
            cache_control: Some("max-age=60".into()),
            content_disposition: Some("attachment".into()),
            user: vec![("owner-team".into(), "ml".into())],
            ..Default::default()
        };
        let put = PutOpts {
            attrs: FileAttrs { mode: Some(0o100600), foreign: foreign.new(), ..Default::default() },
            ..Default::default()
        };
        let cap = Capability {
            write_with_content_type: true,
            write_with_cache_control: true,
            write_with_user_metadata: true,
            ..Default::default()
        };
        let h = Headers::new(&cap, &put, Some("text/plain".into()));
        assert_eq!(h.content_type.as_deref(), Some("text/x-custom"));
        assert_eq!(h.cache_control.as_deref(), Some("max-age=60"));
        assert_eq!(h.content_disposition, None, "not kept by this service: not asked for");
        let m = h.metadata.unwrap();
        assert_eq!((m["owner-team"].as_str(), m["mode"].as_str()), ("ml", "100600"));
        // The generic type a client that sent none got is not kept: the guess serves.
        let generic = Foreign { content_type: Some("binary/octet-stream".into()), ..Default::default() };
        let put = PutOpts { attrs: FileAttrs { foreign: generic.new(), ..Default::default() }, ..Default::default() };
        let h = Headers::new(&cap, &put, Some("text/plain".into()));
        assert_eq!((h.content_type.as_deref(), h.metadata), (Some("text/plain"), None));
    }
}
