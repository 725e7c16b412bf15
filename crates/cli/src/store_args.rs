//! The flags that say how to reach a store, shared by `mount` and `cp`.

use bucketfs_store::location::StoreOptions;
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
    /// Google Drive: hide Docs, Sheets and Slides instead of showing read-only exports.
    #[arg(long)]
    pub gdrive_hide_docs: bool,
}

impl StoreArgs {
    pub fn options(&self) -> StoreOptions {
        StoreOptions {
            endpoint: self.endpoint.clone(),
            anonymous: self.anonymous,
            profile: self.profile.clone(),
            gdrive_hide_docs: self.gdrive_hide_docs,
            ..StoreOptions::default()
        }
    }
}
