//! Creating and deleting an S3 bucket (the CSI controller's volume-per-bucket provisioning):
//! OpenDAL has no call for either, so a signed `PUT /BUCKET` or `DELETE /BUCKET` goes out,
//! path-style, to the endpoint (AWS's regional one when none is given).

use bytes::Bytes;

use crate::location::Keys;
use crate::{StoreError, StoreErrorKind};

/// A signer for S3 requests: the given keys, else the usual chain (environment, profile;
/// no instance metadata when an endpoint is given).
pub(crate) fn signer(
    region: &str,
    profile: Option<&str>,
    keys: Option<&Keys>,
    imds: bool,
) -> reqsign_core::Signer<reqsign_aws_v4::Credential> {
    signer_for("s3", region, profile, keys, imds)
}

/// A SigV4 signer for AWS `service` (`s3`, `sqs`), credentials as [`signer`] finds them.
pub(crate) fn signer_for(
    service: &str,
    region: &str,
    profile: Option<&str>,
    keys: Option<&Keys>,
    imds: bool,
) -> reqsign_core::Signer<reqsign_aws_v4::Credential> {
    use reqsign_aws_v4::{DefaultCredentialProvider, RequestSigner, StaticCredentialProvider};
    let ctx = reqsign_core::Context::new()
        .with_file_read(reqsign_file_read_tokio::TokioFileRead)
        .with_env(reqsign_core::OsEnv)
        .with_http_send(opendal::HttpTransporter::default());
    let request = RequestSigner::new(service, region);
    if let Some(Keys::S3 { access_key_id, secret_access_key, session_token }) = keys {
        let mut p = StaticCredentialProvider::new(access_key_id, secret_access_key);
        if let Some(t) = session_token {
            p = p.with_session_token(t);
        }
        return reqsign_core::Signer::new(ctx, p, request);
    }
    let mut creds = DefaultCredentialProvider::builder();
    if let Some(p) = profile.filter(|p| !p.is_empty()) {
        creds = creds.with_profile(p);
    }
    if !imds {
        creds = creds.no_imds();
    }
    reqsign_core::Signer::new(ctx, creds.build(), request)
}

fn bucket_url(endpoint: Option<&str>, region: &str, bucket: &str) -> String {
    match endpoint {
        Some(e) => format!("{}/{bucket}", e.trim_end_matches('/')),
        None => format!("https://s3.{region}.amazonaws.com/{bucket}"),
    }
}

async fn send(
    method: http::Method,
    endpoint: Option<&str>,
    region: &str,
    bucket: &str,
    keys: Option<&Keys>,
    body: Bytes,
) -> Result<(u16, String), StoreError> {
    let err = |e: String| StoreError::new(StoreErrorKind::Other, e);
    let url = bucket_url(endpoint, region, bucket);
    let mut parts =
        http::Request::builder().method(method).uri(&url).body(()).expect("a request builds").into_parts().0;
    signer(region, None, keys, endpoint.is_none())
        .sign(&mut parts, None)
        .await
        .map_err(|e| err(format!("cannot sign a request for bucket {bucket}: {e}")))?;
    let req = reqwest::Request::try_from(http::Request::from_parts(parts, body.to_vec()))
        .map_err(|e| err(format!("{url}: {e}")))?;
    let resp = reqwest::Client::new().execute(req).await.map_err(|e| err(format!("{url}: {e}")))?;
    let status = resp.status().as_u16();
    Ok((status, resp.text().await.unwrap_or_default()))
}

fn refused(bucket: &str, what: &str, status: u16, body: &str) -> StoreError {
    let code = body.split("<Code>").nth(1).and_then(|s| s.split("</Code>").next()).unwrap_or("").to_string();
    let kind = match (status, code.as_str()) {
        (403, _) => StoreErrorKind::PermissionDenied,
        (404, _) | (_, "NoSuchBucket") => StoreErrorKind::NotFound,
        (409, "BucketAlreadyExists") => StoreErrorKind::Exists,
        (409, "BucketNotEmpty") => StoreErrorKind::Changed,
        (400, "InvalidBucketName") => StoreErrorKind::InvalidName,
        _ => StoreErrorKind::Other,
    };
    StoreError::new(kind, format!("{what} bucket {bucket}: HTTP {status} {code}"))
}

/// Create `bucket`; `Ok(false)` if this account has it already (a retry), an `Exists` error
/// if another account does.
pub async fn create_bucket(
    endpoint: Option<&str>,
    region: &str,
    bucket: &str,
    keys: Option<&Keys>,
) -> Result<bool, StoreError> {
    // Outside us-east-1 the region goes in the body (S3 refuses the request without it).
    let body = if region == "us-east-1" {
        Bytes::new()
    } else {
        Bytes::from(format!(
            "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><LocationConstraint>{region}</LocationConstraint></CreateBucketConfiguration>"
        ))
    };
    let (status, text) = send(http::Method::PUT, endpoint, region, bucket, keys, body).await?;
    match status {
        200 => Ok(true),
        409 if text.contains("BucketAlreadyOwnedByYou") => Ok(false),
        _ => Err(refused(bucket, "create", status, &text)),
    }
}

/// Delete `bucket` (it must be empty); a missing one counts as deleted.
pub async fn delete_bucket(
    endpoint: Option<&str>,
    region: &str,
    bucket: &str,
    keys: Option<&Keys>,
) -> Result<(), StoreError> {
    let (status, text) = send(http::Method::DELETE, endpoint, region, bucket, keys, Bytes::new()).await?;
    match status {
        200 | 204 | 404 => Ok(()),
        _ => Err(refused(bucket, "delete", status, &text)),
    }
}
