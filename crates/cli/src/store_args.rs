//! The flags that say how to reach a store, shared by `mount` and `cp`.

use bucketfs_store::location::StoreOptions;
use clap::Args;

#[derive(Args, Clone, Debug, Default)]
pub struct StoreArgs {
    /// Endpoint for S3-compatible stores (MinIO...) or a GCS emulator. Default: the
    /// service's own, or AWS_ENDPOINT_URL for S3.
    #[arg(long)]
    pub endpoint: Option<String>,
    /// GCS: send no credentials (public buckets, emulators).
    #[arg(long)]
    pub anonymous: bool,
    /// S3: the AWS profile to use.
    #[arg(long)]
    pub profile: Option<String>,
}

impl StoreArgs {
    pub fn options(&self) -> StoreOptions {
        StoreOptions {
            endpoint: self.endpoint.clone(),
            anonymous: self.anonymous,
            profile: self.profile.clone(),
            ..StoreOptions::default()
        }
    }
}
