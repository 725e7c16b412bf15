//! A check the GCS JSON API leaves to the server: a media download sent with
//! `ifGenerationMatch=G` must return generation G. Real GCS answers 412 otherwise; an
//! emulator that ignores the precondition (fake-gcs-server) hands back another
//! generation's bytes. This HTTP transport wrapper compares the response's
//! `x-goog-generation` with G and turns a mismatch into the 412 GCS would have sent, so a
//! read pinned to a generation never returns another generation's bytes.

use opendal::{Buffer, HttpBody, HttpTransport, HttpTransporter};

/// Wraps the operator's transport; everything but a pinned media download passes through.
pub struct GenerationCheck {
    pub inner: HttpTransporter,
}

impl HttpTransport for GenerationCheck {
    async fn fetch(&self, req: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
        let want = if req.method() == http::Method::GET { pinned_generation(req.uri()) } else { None };
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

/// `G` of a media download (`alt=media`) sent with `ifGenerationMatch=G`.
fn pinned_generation(uri: &http::Uri) -> Option<String> {
    let q = uri.query()?;
    if !q.split('&').any(|p| p == "alt=media") {
        return None;
    }
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

    #[tokio::test]
    async fn a_download_of_another_generation_is_refused() {
        let o = "http://gcs/storage/v1/b/b/o/k?alt=media";
        assert_eq!(status(&format!("{o}&ifGenerationMatch=5")).await, 200);
        assert_eq!(status(&format!("{o}&ifGenerationMatch=4")).await, 412);
        assert_eq!(status(o).await, 200, "not pinned");
        assert_eq!(status("http://gcs/storage/v1/b/b/o/k?ifGenerationMatch=4").await, 200, "metadata, not media");
    }
}
