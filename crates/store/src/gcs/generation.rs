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
//! served as they are either way.

use opendal::{Buffer, HttpBody, HttpTransport, HttpTransporter};

/// Wraps the operator's transport; everything but a pinned media download passes through.
pub struct GenerationCheck {
    pub inner: HttpTransporter,
}

impl HttpTransport for GenerationCheck {
    async fn fetch(&self, mut req: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
        let media = req.method() == http::Method::GET && is_media(req.uri());
        if media && !req.headers().contains_key(http::header::ACCEPT_ENCODING) {
            req.headers_mut().insert(http::header::ACCEPT_ENCODING, http::HeaderValue::from_static("gzip"));
        }
        let want = if media { pinned_generation(req.uri()) } else { None };
        let resp = self.inner.fetch(req).await?;
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

    #[tokio::test]
    async fn a_download_of_another_generation_is_refused() {
        let o = "http://gcs/storage/v1/b/b/o/k?alt=media";
        assert_eq!(status(&format!("{o}&ifGenerationMatch=5")).await, 200);
        assert_eq!(status(&format!("{o}&ifGenerationMatch=4")).await, 412);
        assert_eq!(status(o).await, 200, "not pinned");
        assert_eq!(status("http://gcs/storage/v1/b/b/o/k?ifGenerationMatch=4").await, 200, "metadata, not media");
    }
}
