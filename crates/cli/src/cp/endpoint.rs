//! The two sides of a copy: `-` (stdin/stdout), a local path, or a store URL with an
//! object key. URLs and store flags are the mount's; one store is opened per bucket.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use bucketfs_store::location::{self, Location, StoreOptions};
use bucketfs_store::Store;

/// Which service a store is: it decides what its digests mean (see `verify`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    S3,
    Gcs,
    Other,
}

/// One object (or prefix, when `key` ends with `/` or is empty) in a store.
#[derive(Clone)]
pub struct Remote {
    pub store: Arc<dyn Store>,
    pub kind: Kind,
    /// `s3://bucket/`, for messages.
    pub base: String,
    pub key: String,
    /// S3 with `StoreOptions::s3_crc32c`: the server confirmed the crc32c of every upload
    /// request, so an upload that succeeded is verified (no MD5s needed).
    pub crc_confirmed: bool,
}

impl Remote {
    pub fn url(&self) -> String {
        format!("{}{}", self.base, self.key)
    }
    pub fn with_key(&self, key: String) -> Self {
        Self { key, ..self.clone() }
    }
}

pub enum Side {
    Stdio,
    Local(PathBuf),
    Remote(Remote),
}

/// Parses sides, opening each bucket's store once.
pub struct Opener {
    opts: StoreOptions,
    /// Per-service endpoints (`--s3-endpoint`, `--gcs-endpoint`), over `opts.endpoint`.
    s3_endpoint: Option<String>,
    gcs_endpoint: Option<String>,
    stores: HashMap<String, Arc<dyn Store>>,
}

impl Opener {
    pub fn new(opts: StoreOptions, s3_endpoint: Option<String>, gcs_endpoint: Option<String>) -> Self {
        Self { opts, s3_endpoint, gcs_endpoint, stores: HashMap::new() }
    }

    pub fn side(&mut self, arg: &str) -> Result<Side, String> {
        if arg == "-" {
            return Ok(Side::Stdio);
        }
        let Some((scheme, rest)) = arg.split_once("://") else {
            return Ok(Side::Local(PathBuf::from(arg)));
        };
        let (kind, bucket_url, key) = match scheme.to_ascii_lowercase().as_str() {
            "file" => {
                if !rest.starts_with('/') {
                    return Err(format!("{arg:?}: a file URL needs an absolute path, like file:///data/x"));
                }
                return Ok(Side::Local(PathBuf::from(rest)));
            }
            "mem" | "memory" => (Kind::Other, "mem://".to_string(), rest),
            s @ ("s3" | "gs" | "gcs") => {
                let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
                let kind = if s == "s3" { Kind::S3 } else { Kind::Gcs };
                let scheme = if s == "s3" { "s3" } else { "gs" };
                (kind, format!("{scheme}://{bucket}"), key)
            }
            // gdrive://FOLDER-ID/path (gdrive:///path: My Drive).
            "gdrive" => {
                let (folder, key) = rest.split_once('/').unwrap_or((rest, ""));
                (Kind::Other, format!("gdrive://{folder}"), key)
            }
            // Let the URL parser name what is wrong.
            _ => return Err(Location::parse(arg).err().map(|e| e.to_string()).unwrap_or_default()),
        };
        if key.starts_with('/') {
            // `s3://b//x` names the key `/x`, not `x`: refused, never written over another.
            return Err(format!(
                "{arg:?}: the key starts with '/' (an empty first segment), which bucketfs does not copy; \
                 write the key without the extra slash"
            ));
        }
        let key = key.to_string();
        let store = match self.stores.get(&bucket_url) {
            Some(s) => s.clone(),
            None => {
                let loc = Location::parse(&bucket_url).map_err(|e| e.to_string())?;
                let mut opts = self.opts.clone();
                let own = match kind {
                    Kind::S3 => &self.s3_endpoint,
                    Kind::Gcs => &self.gcs_endpoint,
                    Kind::Other => &None,
                };
                if let Some(ep) = own {
                    opts.endpoint = Some(ep.clone());
                }
                let s = location::open(&loc, &opts).map_err(|e| e.to_string())?;
                self.stores.insert(bucket_url.clone(), s.clone());
                s
            }
        };
        let base = if bucket_url.ends_with("://") { bucket_url } else { format!("{bucket_url}/") };
        let crc_confirmed = kind == Kind::S3 && self.opts.s3_crc32c;
        Ok(Side::Remote(Remote { store, kind, base, key, crc_confirmed }))
    }
}
