//! Uploads to S3 checked by crc32c, by the server (see [`crate::location`]'s
//! `StoreOptions::s3_crc32c`).
//!
//! With OpenDAL's `checksum_algorithm("crc32c")`, every PutObject and UploadPart carries
//! `x-amz-checksum-crc32c` (computed by OpenDAL over the body it sends), which S3 and MinIO
//! check against the bytes they received: a mismatch is refused. A store that ignores the
//! header would accept anything, so this HTTP transport wrapper makes the check provable:
//!
//! - a successful upload request must echo the same `x-amz-checksum-crc32c` in its response
//!   (S3 and MinIO do); no echo is an error naming `--s3-md5`, a different one a retried error;
//! - a refusal for a checksum mismatch (`BadDigest`, `XAmzContentChecksumMismatch`) becomes a
//!   temporary error, so OpenDAL's retry layer sends the part again;
//! - CompleteMultipartUpload's answer must carry the object's composite checksum, equal to
//!   the crc32c of the parts' crc32cs (big-endian, in order) as listed in the request, `-N`.

use base64::Engine;
use opendal::{Buffer, ErrorKind, HttpBody, HttpTransport, HttpTransporter, Operator};

const HEADER: &str = "x-amz-checksum-crc32c";
const TAG: &str = "ChecksumCRC32C";

/// `op` (an S3 operator built with `checksum_algorithm("crc32c")`) with its transport
/// wrapped in [`ChecksumConfirm`].
pub fn confirmed(op: Operator) -> Operator {
    let confirm = ChecksumConfirm { inner: op.context().http_transport().clone() };
    let ctx = op.context().with_http_transport(HttpTransporter::new(confirm));
    op.with_context(ctx)
}

/// Wraps an S3 operator's transport; requests without a crc32c pass through unchanged.
pub struct ChecksumConfirm {
    pub inner: HttpTransporter,
}

/// The error for a store that does not confirm checksums.
fn unconfirmed(what: &str) -> opendal::Error {
    opendal::Error::new(
        ErrorKind::Unsupported,
        format!(
            "the S3 store did not confirm the crc32c of the {what}: it may not check \
             x-amz-checksum-crc32c; run with --s3-md5 to verify by MD5 instead"
        ),
    )
}

fn mismatch(msg: String) -> opendal::Error {
    opendal::Error::new(ErrorKind::Unexpected, format!("crc32c mismatch: {msg}")).set_temporary()
}

impl HttpTransport for ChecksumConfirm {
    async fn fetch(&self, req: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
        let sent = req.headers().get(HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
        let completes = req.method() == http::Method::POST
            && req.uri().query().is_some_and(|q| q.split('&').any(|p| p.starts_with("uploadId=")));
        let listed = completes.then(|| tag_values(&String::from_utf8_lossy(&req.body().to_bytes())));
        let mut resp = self.inner.fetch(req).await?;
        let status = resp.status();
        if let Some(sent) = sent {
            if !status.is_success() {
                let body = resp.body_mut().to_buffer().await?;
                let text = String::from_utf8_lossy(&body.to_bytes()).to_string();
                if text.contains("BadDigest") || text.contains("ChecksumMismatch") {
                    return Err(mismatch(format!("the server refused the body of crc32c {sent} as corrupted")));
                }
                return Ok(rebuilt(resp, body));
            }
            return match resp.headers().get(HEADER).and_then(|v| v.to_str().ok()) {
                Some(got) if got == sent => Ok(resp),
                Some(got) => Err(mismatch(format!("sent {sent}, the server has {got}"))),
                None => Err(unconfirmed("upload")),
            };
        }
        let Some(parts) = listed.filter(|p| !p.is_empty() && status.is_success()) else {
            return Ok(resp);
        };
        // Small XML: read it, check it, hand OpenDAL the same bytes.
        let body = resp.body_mut().to_buffer().await?;
        let text = String::from_utf8_lossy(&body.to_bytes()).to_string();
        if text.contains("<Error>") {
            return Ok(rebuilt(resp, body));
        }
        let want = composite(&parts).ok_or_else(|| mismatch(format!("unreadable part checksums {parts:?}")))?;
        match tag_values(&text).first() {
            Some(got) if *got == want => Ok(rebuilt(resp, body)),
            // Not temporary: the upload is complete, sending the request again cannot help.
            Some(got) => Err(opendal::Error::new(
                ErrorKind::Unexpected,
                format!("crc32c mismatch: the parts make {want}, the completed object has {got}"),
            )),
            None => Err(unconfirmed("completed multipart upload")),
        }
    }
}

/// `resp` with its body (already read) put back.
fn rebuilt(resp: http::Response<HttpBody>, body: Buffer) -> http::Response<HttpBody> {
    let size = body.len() as u64;
    let (parts, _) = resp.into_parts();
    http::Response::from_parts(parts, HttpBody::new(futures::stream::iter([Ok(body)]), Some(size)))
}

/// The text of every `<ChecksumCRC32C>` element, in order.
fn tag_values(xml: &str) -> Vec<String> {
    let (open, close) = (format!("<{TAG}>"), format!("</{TAG}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        rest = &rest[i + open.len()..];
        let Some(j) = rest.find(&close) else { break };
        out.push(rest[..j].trim().to_string());
        rest = &rest[j..];
    }
    out
}

/// S3's COMPOSITE checksum of parts given as base64 crc32cs: `base64(crc32c(c1 ‖ … ‖ cN))-N`.
pub fn composite(parts: &[String]) -> Option<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut joined = Vec::with_capacity(4 * parts.len());
    for p in parts {
        let raw = b64.decode(p).ok().filter(|r| r.len() == 4)?;
        joined.extend_from_slice(&raw);
    }
    Some(format!("{}-{}", b64.encode(crc32c::crc32c(&joined).to_be_bytes()), parts.len()))
}

/// `crc` as S3 writes it in headers: base64 of the four big-endian bytes.
#[cfg(test)]
fn crc32c_header(crc: u32) -> String {
    base64::engine::general_purpose::STANDARD.encode(crc.to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake S3: answers with `status`, the headers and the body it is given.
    struct Fake {
        status: u16,
        echo: Option<&'static str>,
        body: String,
    }
    impl HttpTransport for Fake {
        async fn fetch(&self, req: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
            let _ = req;
            let body = Buffer::from(self.body.clone());
            let mut b = http::Response::builder().status(self.status);
            if let Some(e) = self.echo {
                b = b.header(HEADER, e);
            }
            Ok(b.body(HttpBody::new(futures::stream::iter([Ok(body.clone())]), Some(body.len() as u64))).unwrap())
        }
    }

    fn fake(status: u16, echo: Option<&'static str>, body: &str) -> ChecksumConfirm {
        let f = Fake { status, echo, body: body.to_string() };
        ChecksumConfirm { inner: HttpTransporter::new(f) }
    }

    fn part(crc: Option<&str>) -> http::Request<Buffer> {
        let mut b = http::Request::put("http://s3/b/k?partNumber=1&uploadId=u");
        if let Some(c) = crc {
            b = b.header(HEADER, c);
        }
        b.body(Buffer::from("data")).unwrap()
    }

    fn complete(crcs: &[&str]) -> http::Request<Buffer> {
        let parts: String = crcs
            .iter()
            .enumerate()
            .map(|(i, c)| format!("<Part><PartNumber>{}</PartNumber><ETag>e</ETag><{TAG}>{c}</{TAG}></Part>", i + 1))
            .collect();
        let xml = format!("<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>");
        http::Request::post("http://s3/b/k?uploadId=u").body(Buffer::from(xml)).unwrap()
    }

    #[test]
    fn composite_matches_what_minio_reported() {
        // MinIO's answer for a 5 MiB part (bytes 0..=255 repeated) and a part of 1000 "x".
        assert_eq!(composite(&["D5dXlQ==".into(), "YXFUyQ==".into()]).unwrap(), "Vmzb2A==-2");
        assert_eq!(crc32c_header(crc32c::crc32c(&[b'x'; 1000])), "YXFUyQ==");
        assert_eq!(composite(&["bad".into()]), None);
    }

    #[tokio::test]
    async fn an_upload_must_be_confirmed_by_its_echo() {
        assert!(fake(200, Some("AAAAAQ=="), "").fetch(part(Some("AAAAAQ=="))).await.is_ok());
        let e = fake(200, None, "").fetch(part(Some("AAAAAQ=="))).await.err().expect("refused");
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        assert!(e.to_string().contains("--s3-md5"), "{e}");
        let e = fake(200, Some("AAAAAg=="), "").fetch(part(Some("AAAAAQ=="))).await.err().expect("refused");
        assert!(e.is_temporary() && e.to_string().contains("mismatch"), "{e}");
        // No checksum sent: nothing to confirm.
        assert!(fake(200, None, "").fetch(part(None)).await.is_ok());
    }

    #[tokio::test]
    async fn a_refused_corrupt_part_is_retried_other_refusals_pass_through() {
        let corrupt = "<Error><Code>XAmzContentChecksumMismatch</Code></Error>";
        let e = fake(400, None, corrupt).fetch(part(Some("AAAAAQ=="))).await.err().expect("refused");
        assert!(e.is_temporary(), "{e}");
        let denied = "<Error><Code>AccessDenied</Code></Error>";
        let mut r = fake(403, None, denied).fetch(part(Some("AAAAAQ=="))).await.unwrap();
        assert_eq!(r.status(), 403);
        assert_eq!(r.body_mut().to_buffer().await.unwrap().to_bytes(), denied.as_bytes());
    }

    #[tokio::test]
    async fn the_completed_object_must_carry_the_parts_composite() {
        let (a, b) = ("AAAAAQ==", "AAAAAg==");
        let want = composite(&[a.into(), b.into()]).unwrap();
        let ok = format!("<CompleteMultipartUploadResult><{TAG}>{want}</{TAG}></CompleteMultipartUploadResult>");
        let mut r = fake(200, None, &ok).fetch(complete(&[a, b])).await.unwrap();
        assert_eq!(r.body_mut().to_buffer().await.unwrap().to_bytes(), ok.as_bytes(), "body handed on intact");
        let e = fake(200, None, &ok).fetch(complete(&[b, a])).await.err().expect("refused");
        assert!(e.to_string().contains("mismatch"), "{e}");
        let e =
            fake(200, None, "<CompleteMultipartUploadResult/>").fetch(complete(&[a, b])).await.err().expect("refused");
        assert_eq!(e.kind(), ErrorKind::Unsupported);
    }
}
