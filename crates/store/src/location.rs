//! Store URLs (`s3://`, `gs://`, `gdrive://`, `file://`, `mem://`) and building a [`Store`] from one.
//!
//! Credentials follow each ecosystem's conventions and are never part of the URL:
//! S3 reads `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, the region
//! ([`crate::region`]: `--region`, `AWS_REGION`, the profile's, the bucket's),
//! `AWS_ENDPOINT_URL` and AWS profiles; GCS reads `GOOGLE_APPLICATION_CREDENTIALS`, or runs
//! anonymously with `anonymous`; Google Drive: see [`crate::gdrive::auth`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use opendal::layers::{RetryEvent, RetryLayer, TimeoutLayer};
use opendal::{services, Operator};

use crate::opendal_store::OpendalStore;
use crate::{Store, StoreError, StoreErrorKind};

/// Where the data lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    S3 {
        bucket: String,
        prefix: String,
    },
    Gcs {
        bucket: String,
        prefix: String,
    },
    File {
        path: PathBuf,
    },
    /// A Google Drive folder by ID (`root`: My Drive).
    Gdrive {
        folder: String,
    },
    Memory,
}

/// Options that are not part of the URL.
#[derive(Debug, Clone, Default)]
pub struct StoreOptions {
    /// Custom endpoint (MinIO, an emulator, any S3-compatible store).
    pub endpoint: Option<String>,
    /// GCS: send no credentials (public buckets, emulators).
    pub anonymous: bool,
    /// S3: AWS profile name.
    pub profile: Option<String>,
    /// S3: the bucket's region; otherwise found as [`crate::region`] says.
    pub region: Option<String>,
    /// Per-request timeout; retries happen within [`StoreOptions::retries`].
    pub request_timeout: Option<Duration>,
    pub retries: Option<usize>,
    /// Google Drive: hide Docs/Sheets/Slides instead of showing read-only exports.
    pub gdrive_hide_docs: bool,
    /// Google Drive: the access asked for (default: as [`crate::gdrive::auth::effective_scope`] says).
    pub gdrive_scope: Option<crate::gdrive::auth::Scope>,
    /// S3: send the crc32c of every upload request's body (`x-amz-checksum-crc32c`, a
    /// COMPOSITE checksum for multipart uploads) and require the server to confirm it
    /// ([`crate::s3::checksum`]). `bucketfs cp` turns it on; a store that does not confirm
    /// fails the upload.
    pub s3_crc32c: bool,
    /// S3: ask HEADs made with [`crate::HeadOpts::digests`] for the object's additional checksum
    /// (`x-amz-checksum-mode`, signed; [`crate::s3::checksum_mode`]). `bucketfs cp` turns it
    /// on to verify downloads by crc instead of MD5.
    pub s3_checksum_mode: bool,
    /// The Content-Type uploads carry (default: guessed from the key's extension).
    pub content_type: crate::ContentType,
    /// S3 and GCS: the storage class of new objects (`STANDARD_IA`, `NEARLINE`...).
    pub storage_class: Option<String>,
    /// S3: server-side encryption of new objects, `AES256` (SSE-S3) or `aws:kms` (SSE-KMS,
    /// with `sse_kms_key_id` or the AWS-managed key).
    pub sse: Option<String>,
    pub sse_kms_key_id: Option<String>,
    /// S3: requester-pays buckets (`x-amz-request-payer: requester` on every request).
    pub requester_pays: bool,
    /// GCS: the project billed for requests to a requester-pays bucket
    /// (`gcs::user_project`).
    pub billing_project: Option<String>,
    /// GCS: how files of several parts are uploaded ([`gcs_uses_compose`]).
    pub gcs_upload: GcsUpload,
    /// Credentials given by the caller instead of the environment's (the CSI controller
    /// gets them per request from Kubernetes secrets). `None`: the usual chain.
    pub keys: Option<Keys>,
}

/// Credentials handed to [`open`] directly. Their `Debug` never shows the secret parts.
#[derive(Clone)]
pub enum Keys {
    /// S3: an access key, its secret, and an optional session token.
    S3 { access_key_id: String, secret_access_key: String, session_token: Option<String> },
    /// GCS: a service account's JSON key.
    GcsServiceAccount(String),
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Keys::S3 { access_key_id, .. } => write!(f, "S3 keys ({access_key_id}, secret hidden)"),
            Keys::GcsServiceAccount(_) => write!(f, "GCS service account key (hidden)"),
        }
    }
}

/// GCS: how a file of several parts is uploaded (`--gcs-upload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GcsUpload {
    /// XML multipart on Google's own endpoints, compose anywhere else.
    #[default]
    Auto,
    /// OpenDAL's GCS writer: the XML API's multipart upload, as Google recommends for
    /// parallel uploads. Needs no delete permission, leaves no temporary objects, and has
    /// no early-deletion fees for parts in other storage classes.
    Xml,
    /// Parts as temporary objects joined by the JSON API's compose ([`crate::gcs::compose`]):
    /// for emulators (fake-gcs-server) and GCS-compatible stores without XML multipart.
    Compose,
}

impl std::str::FromStr for GcsUpload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(GcsUpload::Auto),
            "xml" | "multipart" => Ok(GcsUpload::Xml),
            "compose" => Ok(GcsUpload::Compose),
            _ => Err(format!("{s:?}: use auto, xml or compose")),
        }
    }
}

/// Whether a GCS store at `endpoint` (None: Google's) uploads parts by compose. `Auto`
/// picks XML multipart only for Google's own hosts (`*.googleapis.com` over https): an
/// emulator or other custom endpoint may lack the XML API, and compose needs only JSON.
pub fn gcs_uses_compose(choice: GcsUpload, endpoint: Option<&str>) -> bool {
    match choice {
        GcsUpload::Xml => false,
        GcsUpload::Compose => true,
        GcsUpload::Auto => endpoint.is_some_and(|e| !is_google_endpoint(e)),
    }
}

fn is_google_endpoint(endpoint: &str) -> bool {
    url::Url::parse(endpoint).ok().is_some_and(|u| {
        u.scheme() == "https"
            && u.host_str().is_some_and(|h| {
                let h = h.to_ascii_lowercase();
                h == "storage.googleapis.com" || (h.starts_with("storage") && h.ends_with(".googleapis.com"))
            })
    })
}

const SCHEMES: &str = "s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX], gdrive://[FOLDER-ID], file:///PATH or mem://";

fn config_err(msg: String) -> StoreError {
    StoreError::new(StoreErrorKind::Config, msg)
}

impl Location {
    /// Parse a store URL, naming what is wrong and what is expected on failure.
    pub fn parse(s: &str) -> Result<Self, StoreError> {
        let Some((scheme, rest)) = s.split_once("://") else {
            return Err(config_err(format!("{s:?} is not a store URL; expected {SCHEMES}")));
        };
        let scheme = scheme.to_ascii_lowercase();
        match scheme.as_str() {
            "s3" | "gs" | "gcs" => {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    return Err(config_err(format!("{s:?} has no bucket name; expected {SCHEMES}")));
                }
                if !valid_bucket(bucket) {
                    return Err(config_err(format!(
                        "{bucket:?} is not a valid bucket name (3-222 characters: lowercase letters, digits, '-', '_', '.')"
                    )));
                }
                let prefix = normalize_prefix(prefix).ok_or_else(|| {
                    config_err(format!("{s:?}: the prefix may not contain '.', '..' or empty segments"))
                })?;
                let (bucket, prefix) = (bucket.to_string(), prefix);
                Ok(if scheme == "s3" { Location::S3 { bucket, prefix } } else { Location::Gcs { bucket, prefix } })
            }
            "file" => {
                if !rest.starts_with('/') {
                    return Err(config_err(format!(
                        "{s:?}: a file URL needs an absolute path, like file:///data/bucket"
                    )));
                }
                Ok(Location::File { path: PathBuf::from(rest) })
            }
            "gdrive" => {
                let folder = rest.trim_matches('/');
                if folder.contains('/') || !folder.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
                {
                    return Err(config_err(format!(
                        "{s:?}: expected gdrive:// (My Drive), gdrive://FOLDER-ID (the ID in the folder's web address) or \
                         gdrive://SHARED-DRIVE-ID"
                    )));
                }
                Ok(Location::Gdrive { folder: if folder.is_empty() { "root".into() } else { folder.into() } })
            }
            "mem" | "memory" => Ok(Location::Memory),
            other => Err(config_err(format!("unknown scheme {other:?} in {s:?}; expected {SCHEMES}"))),
        }
    }

    /// The URL again, for messages and the mount table (never contains credentials).
    pub fn to_url(&self) -> String {
        match self {
            Location::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}"),
            Location::Gcs { bucket, prefix } => format!("gs://{bucket}/{prefix}"),
            Location::File { path } => format!("file://{}", path.display()),
            Location::Gdrive { folder } => format!("gdrive://{folder}"),
            Location::Memory => "mem://".into(),
        }
    }
}

fn valid_bucket(b: &str) -> bool {
    (3..=222).contains(&b.len())
        && b.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"-_.".contains(&c))
}

/// `a/b` or `/a/b/` becomes `a/b/`; `` stays ``. Rejects `.`/`..`/empty inner segments.
fn normalize_prefix(p: &str) -> Option<String> {
    let trimmed = p.trim_matches('/');
    if trimmed.is_empty() {
        return Some(String::new());
    }
    let ok = trimmed.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != "..");
    ok.then(|| format!("{trimmed}/"))
}

/// Google's storage endpoint, OpenDAL's default for GCS.
const GCS_ENDPOINT: &str = "https://storage.googleapis.com";

/// `--requester-pays` is S3's and `--billing-project` GCS's: refuse either elsewhere rather
/// than send requests that a requester-pays bucket would refuse anyway.
fn check_billing(loc: &Location, opts: &StoreOptions) -> Result<(), StoreError> {
    if opts.requester_pays && !matches!(loc, Location::S3 { .. }) {
        let hint = if matches!(loc, Location::Gcs { .. }) {
            "; on GCS, name the project to bill with --billing-project"
        } else {
            ""
        };
        return Err(config_err(format!("--requester-pays is for s3:// buckets{hint}")));
    }
    if opts.billing_project.is_some() && !matches!(loc, Location::Gcs { .. }) {
        let hint = if matches!(loc, Location::S3 { .. }) { "; on S3, use --requester-pays" } else { "" };
        return Err(config_err(format!("--billing-project is for gs:// buckets{hint}")));
    }
    Ok(())
}

/// `op` with bucketfs's timeouts and retries. Transient failures (5xx, throttling, resets)
/// retry with jittered exponential backoff; 3 retries from 200 ms keeps a dead server's
/// failure under ~10 s per call.
fn layered(op: Operator, request_timeout: Duration, retries: usize, io_timeout: Duration) -> Operator {
    let op = op.layer(TimeoutLayer::new().with_timeout(request_timeout).with_io_timeout(io_timeout));
    if retries == 0 {
        // No retry layer at all: one with no retries marks every error persistent, and
        // what `crate::retry` sends again itself must still tell a temporary one.
        return op;
    }
    op.layer(
        RetryLayer::new()
            .with_max_times(retries)
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(4))
            .with_jitter()
            .with_notify(log_retry),
    )
}

/// One log line per retry. OpenDAL's own notice logs the error's `Debug` form, which with
/// `RUST_BACKTRACE` set carries a backtrace of some 240 lines: an outage filled the log.
fn log_retry(event: RetryEvent<'_>) {
    let after_ms = event.retry_after.as_millis() as u64;
    tracing::warn!(op = ?event.op, attempt = event.attempt, after_ms, "store request failed, retrying: {}", crate::redact_urls(&event.err.to_string()));
}

/// Build the store for `loc`. Nothing is contacted yet; call [`Store::check`] for that.
pub fn open(loc: &Location, opts: &StoreOptions) -> Result<Arc<dyn Store>, StoreError> {
    check_billing(loc, opts)?;
    let env_endpoint = std::env::var("AWS_ENDPOINT_URL").ok().filter(|s| !s.is_empty());
    let s3_env = env_endpoint.iter().filter(|_| matches!(loc, Location::S3 { .. }));
    for e in opts.endpoint.iter().chain(s3_env) {
        // The services sign requests with their own credentials; a `user:password@` in the
        // address is never sent (S3 refused such requests), and must never be logged. An
        // address without a scheme gets `https://` from OpenDAL: checked as such.
        let as_url = with_scheme(e);
        if crate::redact_urls(&as_url) != as_url {
            return Err(config_err(format!(
                "the endpoint {} has a user name or password in it (`user:password@`), which \
                 bucketfs does not send: remove it, and give credentials as AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY (or --profile) for S3, GOOGLE_APPLICATION_CREDENTIALS for GCS",
                crate::redact_urls(&as_url)
            )));
        }
    }
    if let Location::Gdrive { folder } = loc {
        let poll = std::env::var("BUCKETFS_GDRIVE_POLL_SECS").ok().and_then(|s| s.parse::<f64>().ok()).unwrap_or(1.0);
        return Ok(crate::gdrive::GdriveStore::open(crate::gdrive::DriveConfig {
            folder: folder.clone(),
            endpoint: opts.endpoint.clone(),
            hide_docs: opts.gdrive_hide_docs,
            scope: crate::gdrive::auth::effective_scope(opts.gdrive_scope)?,
            poll: Duration::from_secs_f64(poll.max(0.0)),
            retries: opts.retries.unwrap_or(5),
            request_timeout: opts.request_timeout.unwrap_or(Duration::from_secs(30)),
        })?);
    }
    let err = |e: opendal::Error| StoreError::from_opendal("configure", &loc.to_url(), e);
    let (op, prefix_dirs) = match loc {
        Location::S3 { bucket, prefix } => {
            let endpoint = opts.endpoint.clone().or(env_endpoint.clone());
            let (region, source) = crate::region::resolve(
                opts.region.as_deref(),
                opts.profile.as_deref(),
                |k| std::env::var(k).ok(),
                crate::region::config_file_text,
                || crate::region::detect(endpoint.as_deref(), bucket),
            );
            tracing::debug!(region = %region, ?source, "S3 region");
            let mut b = services::S3::default().bucket(bucket).root(&format!("/{prefix}")).region(&region);
            if let Some(ep) = &endpoint {
                // A custom endpoint is never EC2: skip the instance-metadata credential probe.
                b = b.endpoint(ep).disable_ec2_metadata();
            }
            if let Some(p) = &opts.profile {
                b = b.profile(p);
            }
            if let Some(Keys::S3 { access_key_id, secret_access_key, session_token }) = &opts.keys {
                b = b.access_key_id(access_key_id).secret_access_key(secret_access_key).disable_config_load();
                if let Some(t) = session_token {
                    b = b.session_token(t);
                }
            }
            if let Some(c) = &opts.storage_class {
                b = b.default_storage_class(c);
            }
            if opts.requester_pays {
                b = b.enable_request_payer();
            }
            b = match (opts.sse.as_deref(), &opts.sse_kms_key_id) {
                (None, None) => b,
                (Some("AES256"), None) => b.server_side_encryption_with_s3_key(),
                (Some("aws:kms") | None, Some(key)) => b.server_side_encryption_with_customer_managed_kms_key(key),
                (Some("aws:kms"), None) => b.server_side_encryption_with_aws_managed_kms_key(),
                (Some(other), _) => {
                    return Err(StoreError::new(
                        crate::StoreErrorKind::Config,
                        format!("--sse {other:?}: use AES256 (SSE-S3) or aws:kms (SSE-KMS, with --sse-kms-key-id)"),
                    ))
                }
            };
            let op = if !opts.s3_crc32c {
                Operator::new(b).map_err(err)?
            } else {
                // OpenDAL then also stops offering `write_can_copy_from` (UploadPartCopy),
                // which bucketfs does not use.
                crate::s3::checksum::confirmed(Operator::new(b.checksum_algorithm("crc32c")).map_err(err)?)
            };
            if !opts.s3_checksum_mode {
                (op, true)
            } else {
                // The same credential configuration as the builder's: a profile, and no
                // instance-metadata probe with a custom endpoint.
                (
                    crate::s3::checksum_mode::with_checksum_mode(
                        op,
                        &region,
                        opts.profile.as_deref(),
                        endpoint.is_none(),
                    ),
                    true,
                )
            }
        }
        Location::Gcs { bucket, prefix } => {
            let mut b = services::Gcs::default().bucket(bucket).root(&format!("/{prefix}"));
            if let Some(c) = &opts.storage_class {
                b = b.default_storage_class(c);
            }
            if let Some(ep) = &opts.endpoint {
                b = b.endpoint(ep).disable_vm_metadata();
            }
            if opts.anonymous {
                b = b.skip_signature().disable_vm_metadata().disable_config_load();
            }
            if let Some(Keys::GcsServiceAccount(json)) = &opts.keys {
                use base64::Engine as _;
                b = b.credential(&base64::engine::general_purpose::STANDARD.encode(json)).disable_vm_metadata();
            }
            let op = Operator::new(b).map_err(err)?;
            let mut transport = op.context().http_transport().clone();
            if let Some(p) = &opts.billing_project {
                let endpoint = opts.endpoint.as_deref().unwrap_or(GCS_ENDPOINT);
                let billed = crate::gcs::user_project::UserProject::new(transport, endpoint, p)
                    .ok_or_else(|| config_err(format!("--billing-project {p:?} is not a project ID")))?;
                transport = opendal::HttpTransporter::new(billed);
            }
            let root = op.info().root().trim_start_matches('/').to_string();
            let in_place = crate::gcs::in_place::InPlaceCompose { inner: transport, root };
            let check = crate::gcs::generation::GenerationCheck { inner: opendal::HttpTransporter::new(in_place) };
            let ctx = op.context().with_http_transport(opendal::HttpTransporter::new(check));
            (op.with_context(ctx), true)
        }
        Location::File { path } => {
            if !path.is_dir() {
                return Err(StoreError::not_found(format!(
                    "{} is not an existing directory; create it or pick another file:// path",
                    path.display()
                )));
            }
            let root = path.to_string_lossy();
            // Uploads land in a sibling temp directory and are renamed into place at close,
            // so a half-written file is never visible (same filesystem, so rename works).
            let tmp = crate::local::temp_dir(path);
            std::fs::create_dir_all(&tmp).map_err(|e| config_err(format!("cannot create {}: {e}", tmp.display())))?;
            let fs = services::Fs::default().root(&root).atomic_write_dir(&tmp.to_string_lossy());
            (Operator::new(fs).map_err(err)?, false)
        }
        Location::Memory => (Operator::new(services::Memory::default()).map_err(err)?, true),
        Location::Gdrive { .. } => unreachable!("handled above"),
    };
    let (request_timeout, retries) =
        (opts.request_timeout.unwrap_or(Duration::from_secs(30)), opts.retries.unwrap_or(3));
    // GCS compose answers only when the object is assembled: instant on GCS, but emulators
    // copy the bytes (fake-gcs-server took over 10 s for 1 GB on 2 cores), so 5 minutes.
    let compose = matches!(loc, Location::Gcs { .. }) && gcs_uses_compose(opts.gcs_upload, opts.endpoint.as_deref());
    tracing::debug!(compose, "GCS uploads of several parts: compose, else XML multipart");
    let compose_op = compose.then(|| layered(op.clone(), request_timeout, retries, Duration::from_secs(300)));
    let (base, unretried) = (op.clone(), op.clone());
    let mut store = OpendalStore::new(
        layered(op, request_timeout, retries, crate::opendal_store::IO_TIMEOUT),
        loc.to_url(),
        prefix_dirs,
    )
    .with_content_type(opts.content_type.clone())
    .with_upload_operators(Arc::new(move |io| layered(base.clone(), request_timeout, retries, io)))
    // For what the store sends again itself (`crate::retry`): no OpenDAL retries (0 times).
    .with_unretried_upload_operators(Arc::new(move |io| layered(unretried.clone(), request_timeout, 0, io)), retries);
    if let Some(c) = compose_op {
        store = store.with_compose_operator(c);
    }
    if matches!(loc, Location::Gcs { .. }) {
        store = store.with_in_place_compose(); // its transport is wrapped above
    }
    if matches!(loc, Location::S3 { .. }) && s3_compatible_server(opts.endpoint.as_deref().or(env_endpoint.as_deref()))
    {
        store = store.with_prefix_list_reading_dir();
    }
    Ok(Arc::new(store))
}

/// An endpoint as OpenDAL reads it: an address without a scheme gets `https://`.
fn with_scheme(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("https://{endpoint}")
    }
}

/// Whether an S3 endpoint is a server of its own (MinIO, Ceph, ...) rather than AWS S3: see
/// [`crate::Capabilities::prefix_list_reads_dir`]. No endpoint: AWS.
fn s3_compatible_server(endpoint: Option<&str>) -> bool {
    const AWS: [&str; 5] = [".amazonaws.com", ".amazonaws.com.cn", ".amazonaws.eu", ".c2s.ic.gov", ".sc2s.sgov.gov"];
    let Some(ep) = endpoint else { return false };
    let host = url::Url::parse(&with_scheme(ep)).ok().and_then(|u| u.host_str().map(str::to_ascii_lowercase));
    !host.is_some_and(|h| AWS.iter().any(|d| h.trim_end_matches('.').ends_with(d)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_aws_endpoints_list_prefixes_from_an_index() {
        assert!(!s3_compatible_server(None));
        assert!(!s3_compatible_server(Some("https://s3.eu-west-1.amazonaws.com")));
        assert!(!s3_compatible_server(Some("https://S3.cn-north-1.amazonaws.com.cn/")));
        assert!(!s3_compatible_server(Some("s3.eu-west-1.amazonaws.com")));
        assert!(!s3_compatible_server(Some("bucket.s3.amazonaws.com:443")));
        assert!(!s3_compatible_server(Some("https://s3.amazonaws.com.")));
        assert!(!s3_compatible_server(Some("https://s3.dualstack.us-east-1.amazonaws.com")));
        assert!(!s3_compatible_server(Some("https://s3-fips.us-gov-west-1.amazonaws.com")));
        assert!(s3_compatible_server(Some("http://127.0.0.1:9000")));
        assert!(s3_compatible_server(Some("https://minio.example.org")));
        assert!(s3_compatible_server(Some("https://amazonaws.com.evil.example")));
    }

    #[test]
    fn parses_supported_urls() {
        assert_eq!(
            Location::parse("s3://b-1/x/y").unwrap(),
            Location::S3 { bucket: "b-1".into(), prefix: "x/y/".into() }
        );
        assert_eq!(Location::parse("gs://bkt").unwrap(), Location::Gcs { bucket: "bkt".into(), prefix: "".into() });
        assert_eq!(Location::parse("file:///tmp/x").unwrap(), Location::File { path: "/tmp/x".into() });
        assert_eq!(Location::parse("mem://").unwrap(), Location::Memory);
        assert_eq!(Location::parse("gdrive://").unwrap(), Location::Gdrive { folder: "root".into() });
        assert_eq!(Location::parse("gdrive://1AbC_d-9").unwrap(), Location::Gdrive { folder: "1AbC_d-9".into() });
    }

    /// Found by the `url` fuzz target: `S3://b` was taken for a GCS bucket.
    #[test]
    fn scheme_case_does_not_change_the_store() {
        assert_eq!(Location::parse("S3://b-1/p").unwrap(), Location::S3 { bucket: "b-1".into(), prefix: "p/".into() });
        assert_eq!(Location::parse("GS://b-1").unwrap(), Location::Gcs { bucket: "b-1".into(), prefix: "".into() });
    }

    #[test]
    fn gcs_upload_method() {
        use GcsUpload::*;
        assert!(!gcs_uses_compose(Auto, None), "Google's default endpoint: XML multipart");
        assert!(!gcs_uses_compose(Auto, Some("https://storage.googleapis.com")));
        assert!(!gcs_uses_compose(Auto, Some("https://storage.europe-west3.rep.googleapis.com/")));
        assert!(gcs_uses_compose(Auto, Some("http://127.0.0.1:4443")), "an emulator: compose");
        assert!(gcs_uses_compose(Auto, Some("http://storage.googleapis.com")), "plain http is no Google endpoint");
        assert!(gcs_uses_compose(Auto, Some("https://storage.googleapis.com.evil.example")));
        assert!(gcs_uses_compose(Compose, None) && !gcs_uses_compose(Xml, Some("http://127.0.0.1:4443")));
        assert_eq!("xml".parse::<GcsUpload>(), Ok(Xml));
        assert!("json".parse::<GcsUpload>().is_err());
    }

    #[test]
    fn billing_flags_belong_to_their_store() {
        let s3 = Location::parse("s3://b-1").unwrap();
        let gs = Location::parse("gs://b-1").unwrap();
        let rp = StoreOptions { requester_pays: true, ..StoreOptions::default() };
        let bp = StoreOptions { billing_project: Some("p".into()), ..StoreOptions::default() };
        assert!(check_billing(&s3, &rp).is_ok() && check_billing(&gs, &bp).is_ok());
        assert!(check_billing(&gs, &rp).unwrap_err().message.contains("--billing-project"));
        assert!(check_billing(&s3, &bp).unwrap_err().message.contains("--requester-pays"));
        assert!(check_billing(&Location::Memory, &bp).is_err());
        let bad = StoreOptions { billing_project: Some("a\nb".into()), ..StoreOptions::default() };
        assert!(open(&gs, &bad).err().unwrap().message.contains("not a project ID"));
    }

    #[test]
    fn rejects_bad_urls_with_a_reason() {
        for (url, word) in [
            ("foo://x", "unknown scheme"),
            ("s3://", "no bucket"),
            ("s3:///x", "no bucket"),
            ("just-a-name", "not a store URL"),
            ("s3://Bad_Bucket!", "not a valid bucket"),
            ("s3://b-1/a/../b", "prefix"),
            ("file://relative", "absolute path"),
            ("gdrive://My Folder/x", "FOLDER-ID"),
        ] {
            let e = Location::parse(url).unwrap_err();
            assert_eq!(e.kind, StoreErrorKind::Config, "{url}");
            assert!(e.message.contains(word), "{url}: {}", e.message);
        }
    }
}
