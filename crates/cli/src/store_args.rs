//! The flags that say how to reach a store, shared by `mount` and `cp`.

use bucketfs_store::location::StoreOptions;
use bucketfs_store::ContentType;
use clap::Args;

#[derive(Args, Clone, Debug, Default)]
pub struct StoreArgs {
    /// Endpoint for S3-compatible stores (MinIO...), a GCS emulator or a Drive API emulator.
    /// Default: the service's own, or AWS_ENDPOINT_URL for S3.
    #[arg(long, value_parser = endpoint_url)]
    pub endpoint: Option<String>,
    /// GCS: send no credentials (public buckets, emulators).
    #[arg(long)]
    pub anonymous: bool,
    /// S3: the AWS profile to use.
    #[arg(long)]
    pub profile: Option<String>,
    /// S3: the bucket's region. Default: AWS_REGION, the profile's region in ~/.aws/config,
    /// else the region the bucket reports.
    #[arg(long)]
    pub region: Option<String>,
    /// Google Drive: hide Docs, Sheets and Slides instead of showing read-only exports.
    #[arg(long)]
    pub gdrive_hide_docs: bool,
    /// Google Drive: full or readonly (default: what `bucketfs auth gdrive` was granted, else
    /// full). With readonly the mount is read-only.
    #[arg(long, value_name = "full|readonly")]
    pub gdrive_scope: Option<bucketfs_store::gdrive::auth::Scope>,
    /// Content-Type of every uploaded object (default: guessed from the name's extension,
    /// as `aws s3 cp` and `gcloud storage cp` do).
    #[arg(long, value_name = "TYPE", conflicts_with = "no_content_type")]
    pub content_type: Option<String>,
    /// Send no Content-Type with uploads (the store then says application/octet-stream).
    #[arg(long)]
    pub no_content_type: bool,
    /// S3 and GCS: storage class of new objects (STANDARD_IA, INTELLIGENT_TIERING, NEARLINE...).
    #[arg(long, value_name = "CLASS")]
    pub storage_class: Option<String>,
    /// S3: server-side encryption of new objects: AES256 (SSE-S3) or aws:kms (SSE-KMS).
    #[arg(long, value_name = "AES256|aws:kms")]
    pub sse: Option<String>,
    /// S3: the KMS key for SSE-KMS (implies --sse aws:kms); without it, AWS's managed key.
    #[arg(long, value_name = "KEY-ID")]
    pub sse_kms_key_id: Option<String>,
    /// S3: the bucket is requester-pays; requests carry x-amz-request-payer: requester and
    /// their cost is billed to you.
    #[arg(long)]
    pub requester_pays: bool,
    /// GCS: the project billed for a requester-pays bucket (sent as userProject).
    #[arg(long, value_name = "PROJECT")]
    pub billing_project: Option<String>,
    /// GCS: how files of several parts go up: xml (multipart, Google's recommendation),
    /// compose (temporary part objects joined by compose; emulators), or auto (xml on
    /// Google's endpoints, compose on a custom --endpoint).
    #[arg(long, value_name = "auto|xml|compose", default_value = "auto")]
    pub gcs_upload: bucketfs_store::location::GcsUpload,
}

/// An endpoint is a URL with its scheme: without one, the store's client failed later with
/// "invalid format".
fn endpoint_url(s: &str) -> Result<String, String> {
    let lower = s.to_ascii_lowercase();
    match lower.split_once("://") {
        Some(("http" | "https", rest)) if !rest.is_empty() => Ok(s.to_string()),
        Some((scheme, _)) => Err(format!("the endpoint must be an http:// or https:// URL, not {scheme}://")),
        None => Err(format!("the endpoint has no scheme: write http://{s} (or https://{s})")),
    }
}

impl StoreArgs {
    pub fn options(&self) -> StoreOptions {
        StoreOptions {
            endpoint: self.endpoint.clone(),
            anonymous: self.anonymous,
            profile: self.profile.clone(),
            region: self.region.clone(),
            gdrive_hide_docs: self.gdrive_hide_docs,
            gdrive_scope: self.gdrive_scope,
            content_type: match (&self.content_type, self.no_content_type) {
                (_, true) => ContentType::Off,
                (Some(t), false) => ContentType::Fixed(t.clone()),
                (None, false) => ContentType::Guess,
            },
            storage_class: self.storage_class.clone(),
            sse: self.sse.clone(),
            sse_kms_key_id: self.sse_kms_key_id.clone(),
            requester_pays: self.requester_pays,
            billing_project: self.billing_project.clone(),
            gcs_upload: self.gcs_upload,
            ..StoreOptions::default()
        }
    }
}

#[test]
fn an_endpoint_needs_its_scheme() {
    assert_eq!(endpoint_url("http://127.0.0.1:9000").unwrap(), "http://127.0.0.1:9000");
    assert!(endpoint_url("HTTPS://s3.example").is_ok());
    assert!(endpoint_url("127.0.0.1:9000").unwrap_err().contains("write http://127.0.0.1:9000"));
    assert!(endpoint_url("ftp://host").unwrap_err().contains("ftp://"));
    assert!(endpoint_url("http://").is_err());
}
