//! A check the GCS JSON API leaves to the server: a media download sent with
//! `ifGenerationMatch=G` must return generation G. Real GCS answers 412 otherwise; an
//! emulator that ignores the precondition (fake-gcs-server) hands back another
//! generation's bytes. This HTTP transport wrapper compares the response's
//! `x-goog-generation` with G and turns a mismatch into the 412 GCS would have sent, so a
//! read pinned to a generation never returns another generation's bytes.
//!
//! Media downloads also ask for the bytes as stored (`Accept-Encoding: gzip`). An object
//! uploaded with `Content-Encoding: gzip` (`gsutil cp -z`) is otherwise served
//! decompressed, whole, ignoring the range: its size, CRC32C and MD5 are the stored
//! bytes', so a mount showed its first stored-size bytes of the decompressed text and
//! `bucketfs cp` failed every check (tester Q). Objects stored without an encoding are
//! served as they are either way; one a front end compressed on the way (stored plain,
//! answered gzip) is asked for again without it.

use opendal::{Buffer, HttpBody, HttpTransport, HttpTransporter};

/// Wraps the operator's transport; everything but a pinned media download passes through.
pub struct GenerationCheck {
    pub inner: HttpTransporter,
}

impl HttpTransport for GenerationCheck {
    async fn fetch(&self, mut req: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
        use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING};
        let media = req.method() == http::Method::GET && is_media(req.uri());
        let asked_gzip = media && !req.headers().contains_key(ACCEPT_ENCODING);
        // (Kept to ask again: a GET's body is empty.)
        let again = asked_gzip.then(|| (req.uri().clone(), req.headers().clone()));
        if asked_gzip {
            req.headers_mut().insert(ACCEPT_ENCODING, http::HeaderValue::from_static("gzip"));
        }
        let want = if media { pinned_generation(req.uri()) } else { None };
        let mut resp = self.inner.fetch(req).await?;
        let header =
            |r: &http::Response<HttpBody>, h: &str| r.headers().get(h).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let compressed_here = header(&resp, CONTENT_ENCODING.as_str()).is_some_and(|e| e.eq_ignore_ascii_case("gzip"))
            && !header(&resp, "x-goog-stored-content-encoding").is_some_and(|e| e.eq_ignore_ascii_case("gzip"));
        if let (true, Some((uri, headers))) = (compressed_here, again) {
            // Compressed on the way (a front end may do that for a text object stored as
            // it is): asked again for the bytes as stored.
            let mut plain = http::Request::get(uri).body(Buffer::new()).expect("a GET of a parsed URI");
            *plain.headers_mut() = headers;
            plain.headers_mut().insert(ACCEPT_ENCODING, http::HeaderValue::from_static("identity"));
            resp = self.inner.fetch(plain).await?;
        }
        // A 416 too: a range past the end of a shorter, newer generation.
        let answered = resp.status().is_success() || resp.status() == http::StatusCode::RANGE_NOT_SATISFIABLE;
        let Some(want) = want.filter(|_| answered) else { return Ok(resp) };
        let got = resp.headers().get("x-goog-generation").and_then(|v| v.to_str().ok());
        if got.is_none_or(|got| got == want) {
            return Ok(resp);
        }
        let mut refused = http::Response::new(HttpBody::new(futures::stream::empty(), Some(0)));
        *refused.status_mut() = http::StatusCode::PRECONDITION_FAILED;
        Ok(refused)
    }
}

/// A media download (`alt=media`): an object's bytes, not its metadata.
fn is_media(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|q| q.split('&').any(|p| p == "alt=media"))
}

/// `G` of a media download sent with `ifGenerationMatch=G`.
fn pinned_generation(uri: &http::Uri) -> Option<String> {
    let q = uri.query()?;
    q.split('&').find_map(|p| p.strip_prefix("ifGenerationMatch=")).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers every request with 200 and generation 5.
    struct Gen5;
    impl HttpTransport for Gen5 {
        async fn fetch(&self, _req: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
            let body = HttpBody::new(futures::stream::iter([Ok(Buffer::from("bytes"))]), Some(5));
            Ok(http::Response::builder().header("x-goog-generation", "5").body(body).unwrap())
        }
    }

    async fn status(uri: &str) -> u16 {
        let t = GenerationCheck { inner: HttpTransporter::new(Gen5) };
        let req = http::Request::get(uri).body(Buffer::new()).unwrap();
        t.fetch(req).await.unwrap().status().as_u16()
    }

    /// Answers with the request's Accept-Encoding as its body.
    struct Echo;
    impl HttpTransport for Echo {
        async fn fetch(&self, req: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
            let ae = req.headers().get(http::header::ACCEPT_ENCODING).map(|v| v.to_str().unwrap().to_string());
            let body = Buffer::from(ae.unwrap_or_default());
            Ok(http::Response::new(HttpBody::new(futures::stream::iter([Ok(body)]), None)))
        }
    }

    #[tokio::test]
    async fn media_downloads_ask_for_the_stored_bytes() {
        let t = GenerationCheck { inner: HttpTransporter::new(Echo) };
        for (uri, want) in [("http://gcs/storage/v1/b/b/o/k?alt=media", "gzip"), ("http://gcs/storage/v1/b/b/o/k", "")]
        {
            let resp = t.fetch(http::Request::get(uri).body(Buffer::new()).unwrap()).await.unwrap();
            let text = resp.into_body().to_buffer().await.unwrap().to_vec();
            assert_eq!(String::from_utf8(text).unwrap(), want, "{uri}");
        }
    }

    /// Compresses on the way whatever is asked with `Accept-Encoding: gzip` (the object is
    /// stored plain), as a front end may.
    struct Squeezer;
    impl HttpTransport for Squeezer {
        async fn fetch(&self, req: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
            let gzip = req.headers().get(http::header::ACCEPT_ENCODING).is_some_and(|v| v == "gzip");
            let body = Buffer::from(if gzip { "squeezed" } else { "plain" });
            let mut r = http::Response::new(HttpBody::new(futures::stream::iter([Ok(body)]), None));
            if gzip {
                r.headers_mut().insert(http::header::CONTENT_ENCODING, http::HeaderValue::from_static("gzip"));
            }
            Ok(r)
        }
    }

    #[tokio::test]
    async fn a_plain_object_compressed_on_the_way_is_asked_for_again() {
        let t = GenerationCheck { inner: HttpTransporter::new(Squeezer) };
        let req = http::Request::get("http://gcs/storage/v1/b/b/o/k?alt=media").body(Buffer::new()).unwrap();
        let resp = t.fetch(req).await.unwrap();
        assert_eq!(resp.into_body().to_buffer().await.unwrap().to_vec(), b"plain");
    }

    #[tokio::test]
    async fn a_download_of_another_generation_is_refused() {
        let o = "http://gcs/storage/v1/b/b/o/k?alt=media";
        assert_eq!(status(&format!("{o}&ifGenerationMatch=5")).await, 200);
        assert_eq!(status(&format!("{o}&ifGenerationMatch=4")).await, 412);
        assert_eq!(status(o).await, 200, "not pinned");
        assert_eq!(status("http://gcs/storage/v1/b/b/o/k?ifGenerationMatch=4").await, 200, "metadata, not media");
    }
}
