//! What a volume is made of: its attributes (a static PV's `volumeAttributes`, or what
//! `CreateVolume` returned from a StorageClass's `parameters`) and its secrets.
//!
//! Attributes: `url` (the bucket and prefix, as `bucketfs mount` takes it), `endpoint`,
//! `region`, `mountOptions` (the options of `bucketfs mount -o`, such as
//! `write-back,uid=1000,metadata-ttl=60`), and for the controller `onDelete`
//! (`keep`, the default, or `delete`) and `provisioning` (`prefix`, the default: each volume
//! a prefix under `url`; `bucket`: each volume an S3 bucket of its own). Keys under `csi.storage.k8s.io/` are Kubernetes' own
//! and ignored; any other key is an error that names the known ones.
//!
//! Secrets: `awsAccessKeyId`, `awsSecretAccessKey`, `awsSessionToken` (S3),
//! `gcsServiceAccountKey` (GCS, the JSON key), and optionally `endpoint` and `region`.
//! They reach a mount as files of mode 0600 in the plugin's state directory, named by
//! `AWS_SHARED_CREDENTIALS_FILE` / `GOOGLE_APPLICATION_CREDENTIALS` (paths, not secrets),
//! so no argv, environment or log of any process holds them.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use bucketfs_store::location::{Keys, Location, StoreOptions};
use tonic::Status;

/// The attribute keys a volume may carry.
pub const ATTRIBUTES: [&str; 6] = ["url", "endpoint", "region", "mountOptions", "onDelete", "provisioning"];
/// The secret keys the driver reads.
pub const SECRETS: [&str; 6] =
    ["awsAccessKeyId", "awsSecretAccessKey", "awsSessionToken", "gcsServiceAccountKey", "endpoint", "region"];

/// A volume's attributes, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attributes {
    pub url: Option<String>,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// The `-o` list for `bucketfs mount`, as given.
    pub mount_options: Option<String>,
    /// Remove the volume's keys at `DeleteVolume`.
    pub delete_on_delete: bool,
    /// `provisioning: bucket`: each volume is a bucket of its own (S3), not a prefix.
    pub bucket_per_volume: bool,
}

impl Attributes {
    pub fn parse(map: &HashMap<String, String>) -> Result<Self, Status> {
        let mut a = Attributes::default();
        for (k, v) in map {
            match k.as_str() {
                "url" => a.url = Some(v.clone()),
                "endpoint" => a.endpoint = Some(v.clone()),
                "region" => a.region = Some(v.clone()),
                "mountOptions" => a.mount_options = Some(v.clone()),
                "onDelete" => {
                    a.delete_on_delete = match v.as_str() {
                        "keep" => false,
                        "delete" => true,
                        _ => return Err(crate::invalid(format!("onDelete {v:?}: use keep or delete"))),
                    }
                }
                "provisioning" => {
                    a.bucket_per_volume = match v.as_str() {
                        "prefix" => false,
                        "bucket" => true,
                        _ => return Err(crate::invalid(format!("provisioning {v:?}: use prefix or bucket"))),
                    }
                }
                _ if k.starts_with("csi.storage.k8s.io/") => {}
                _ => {
                    return Err(crate::invalid(format!(
                        "unknown volume attribute {k:?}; bucketfs knows {}",
                        ATTRIBUTES.join(", ")
                    )))
                }
            }
        }
        if let Some(u) = &a.url {
            volume_location(u)?;
        }
        Ok(a)
    }

    /// The attributes `CreateVolume` hands to the nodes of a volume at `url`.
    pub fn for_volume(&self, url: &str) -> HashMap<String, String> {
        let mut m = HashMap::from([("url".to_string(), url.to_string())]);
        for (k, v) in [("endpoint", &self.endpoint), ("region", &self.region), ("mountOptions", &self.mount_options)] {
            if let Some(v) = v {
                m.insert(k.to_string(), v.clone());
            }
        }
        m
    }
}

/// The store a volume URL names: a bucket or a Drive folder. A `file://` volume would hand
/// a directory of the node to pods, and a `mem://` one holds nothing between processes.
pub fn volume_location(url: &str) -> Result<Location, Status> {
    let loc = Location::parse(url).map_err(|e| crate::invalid(format!("url {url:?}: {e}")))?;
    match loc {
        Location::File { .. } => Err(crate::invalid(format!(
            "url {url:?}: a volume is a bucket (s3://, gs://) or a Drive folder (gdrive://); a file:// \
             volume would give pods a directory of the node"
        ))),
        Location::Memory => Err(crate::invalid(format!(
            "url {url:?}: mem:// holds nothing between processes: name a bucket (s3://, gs://)"
        ))),
        loc => Ok(loc),
    }
}

/// A request's secrets, checked.
#[derive(Clone, Default)]
pub struct Secrets {
    pub keys: Option<Keys>,
    pub endpoint: Option<String>,
    pub region: Option<String>,
}

impl Secrets {
    pub fn parse(map: &HashMap<String, String>) -> Result<Self, Status> {
        if let Some(k) = map.keys().find(|k| !SECRETS.contains(&k.as_str())) {
            // The key's name only: a value is never repeated in an error.
            return Err(crate::invalid(format!("unknown secret key {k:?}; bucketfs reads {}", SECRETS.join(", "))));
        }
        let get = |k: &str| map.get(k).filter(|v| !v.is_empty()).cloned();
        let keys = match (get("awsAccessKeyId"), get("awsSecretAccessKey"), get("gcsServiceAccountKey")) {
            (Some(_), Some(_), Some(_)) => {
                return Err(crate::invalid("secrets hold both AWS keys and a GCS key: give the one the store needs"))
            }
            (Some(id), Some(secret), None) => {
                Some(Keys::S3 { access_key_id: id, secret_access_key: secret, session_token: get("awsSessionToken") })
            }
            (Some(_), None, _) | (None, Some(_), _) => {
                return Err(crate::invalid("secrets need both awsAccessKeyId and awsSecretAccessKey"))
            }
            (None, None, Some(json)) => Some(Keys::GcsServiceAccount(json)),
            (None, None, None) => None,
        };
        Ok(Secrets { keys, endpoint: get("endpoint"), region: get("region") })
    }

    /// Store options for the controller's own requests.
    pub fn store_options(&self, attrs: &Attributes) -> StoreOptions {
        StoreOptions {
            endpoint: self.endpoint.clone().or_else(|| attrs.endpoint.clone()),
            region: self.region.clone().or_else(|| attrs.region.clone()),
            keys: self.keys.clone(),
            ..StoreOptions::default()
        }
    }

    /// Write the credentials for a mount into `dir` (created mode 0700), and return the
    /// environment variables that point at them.
    pub fn write_files(&self, dir: &Path) -> std::io::Result<Vec<(&'static str, PathBuf)>> {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let write = |name: &str, text: &str| -> std::io::Result<PathBuf> {
            let path = dir.join(name);
            let tmp = dir.join(format!(".{name}.tmp"));
            let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            Ok(path)
        };
        Ok(match &self.keys {
            Some(Keys::S3 { access_key_id, secret_access_key, session_token }) => {
                let mut text = format!(
                    "[default]\naws_access_key_id = {access_key_id}\naws_secret_access_key = {secret_access_key}\n"
                );
                if let Some(t) = session_token {
                    text.push_str(&format!("aws_session_token = {t}\n"));
                }
                vec![("AWS_SHARED_CREDENTIALS_FILE", write("aws-credentials", &text)?)]
            }
            Some(Keys::GcsServiceAccount(json)) => {
                vec![("GOOGLE_APPLICATION_CREDENTIALS", write("gcs-key.json", json)?)]
            }
            None => Vec::new(),
        })
    }
}

/// A short stable name for a path (FNV-1a, 64 bits, in hex): the state directory's file
/// names for a staging path. Stable across builds, unlike std's hasher.
pub fn path_id(path: &Path) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn attributes_name_an_unknown_key_and_skip_kubernetes_keys() {
        let e = Attributes::parse(&map(&[("url", "s3://bkt/p"), ("bogus", "1")])).unwrap_err();
        assert!(e.message().contains("\"bogus\"") && e.message().contains("mountOptions"), "{}", e.message());
        let a = Attributes::parse(&map(&[("url", "s3://bkt/p"), ("csi.storage.k8s.io/pod.name", "x")])).unwrap();
        assert_eq!(a.url.as_deref(), Some("s3://bkt/p"));
        assert!(Attributes::parse(&map(&[("url", "ftp://x")])).is_err());
        for local in ["file:///etc", "mem://"] {
            let e = Attributes::parse(&map(&[("url", local)])).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{local}");
            assert!(e.message().contains("s3://"), "{}", e.message());
        }
        assert!(volume_location("gs://bkt/p").is_ok());
        assert!(Attributes::parse(&map(&[("onDelete", "sometimes")])).is_err());
        assert!(Attributes::parse(&map(&[("onDelete", "delete")])).unwrap().delete_on_delete);
    }

    #[test]
    fn secrets_never_appear_in_errors_or_debug() {
        let e = Secrets::parse(&map(&[("awsAccessKeyId", "AKIA"), ("password", "hunter2")])).err().unwrap();
        assert!(!e.message().contains("hunter2"));
        assert!(Secrets::parse(&map(&[("awsAccessKeyId", "AKIA")])).is_err());
        let s = Secrets::parse(&map(&[("awsAccessKeyId", "AKIA"), ("awsSecretAccessKey", "s3cr3t")])).unwrap();
        assert!(!format!("{:?}", s.keys).contains("s3cr3t"));
    }

    #[test]
    fn credential_files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let s = Secrets::parse(&map(&[("awsAccessKeyId", "AKIA"), ("awsSecretAccessKey", "s3cr3t")])).unwrap();
        let env = s.write_files(&dir.path().join("v")).unwrap();
        assert_eq!(env[0].0, "AWS_SHARED_CREDENTIALS_FILE");
        let meta = std::fs::metadata(&env[0].1).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(std::fs::read_to_string(&env[0].1).unwrap().contains("aws_secret_access_key = s3cr3t"));
        assert_eq!(std::fs::metadata(dir.path().join("v")).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(path_id(Path::new("/a/b")), path_id(Path::new("/a/b")));
        assert_ne!(path_id(Path::new("/a/b")), path_id(Path::new("/a/c")));
    }
}
