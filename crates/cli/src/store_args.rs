//! The flags that say how to reach a store, shared by `mount` and `cp`.

use bucketfs_store::location::StoreOptions;
use bucketfs_store::ContentType;
use clap::Args;

#[derive(Args, Clone, Debug, Default)]
pub struct StoreArgs {
    /// Endpoint for S3-compatible stores (MinIO...), a GCS emulator or a Drive API emulator.
    /// Default: the service's own, or AWS_ENDPOINT_URL for S3.
    #[arg(long)]
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
    /// Content-Type of every uploaded object (default: guessed from the name's extension,
    /// as `aws s3 cp` and `gcloud storage cp` do).
    #[arg(long, value_name = "TYPE", conflicts_with = "no_content_type")]
    pub content_type: Option<String>,
    /// Send no Content-Type with uploads (the store then says application/octet-stream).
    #[arg(long)]
    pub no_content_type: bool,
}

impl StoreArgs {
    pub fn options(&self) -> StoreOptions {
        StoreOptions {
            endpoint: self.endpoint.clone(),
            anonymous: self.anonymous,
            profile: self.profile.clone(),
            region: self.region.clone(),
            gdrive_hide_docs: self.gdrive_hide_docs,
            content_type: match (&self.content_type, self.no_content_type) {
                (_, true) => ContentType::Off,
                (Some(t), false) => ContentType::Fixed(t.clone()),
                (None, false) => ContentType::Guess,
            },
            ..StoreOptions::default()
        }
    }
}
