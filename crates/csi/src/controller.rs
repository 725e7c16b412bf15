//! The CSI Controller service: dynamic provisioning of prefixes in a bucket.
//!
//! A StorageClass names a base URL (`url: s3://bucket/volumes`). `CreateVolume` of claim
//! `pvc-123` makes the directory `pvc-123/` under it and a record
//! `.bucketfs-csi/pvc-123.json` (the capacity asked and the `onDelete` policy); the volume
//! ID is the volume's URL, `s3://bucket/volumes/pvc-123`, so every call after needs no
//! other state. A second `CreateVolume` of one name returns the same volume (or
//! `AlreadyExists` if it asks another capacity). `DeleteVolume` forgets the record and,
//! with `onDelete: delete`, removes every key of the volume first.
//!
//! Object stores enforce no capacity: the size asked is recorded and reported, not a limit.

use std::collections::HashMap;
use std::sync::Arc;

use bucketfs_store::location::{self, Location};
use bucketfs_store::{PutOpts, Store, StoreError, StoreErrorKind, StoreExt};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tonic::{Request, Response, Status};

use crate::params::{Attributes, Secrets};
use crate::pb::{self, controller_service_capability as cap, volume_capability as vc};

/// Where the records live, under the base URL.
const RECORDS: &str = ".bucketfs-csi/";

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Record {
    name: String,
    capacity_bytes: i64,
    delete_on_delete: bool,
    /// `provisioning: bucket`: the volume's own bucket (else it is a prefix under the base).
    #[serde(default)]
    bucket: Option<String>,
    /// What the nodes get as the volume's attributes.
    volume_context: HashMap<String, String>,
}

pub struct Controller;

/// A store error as a gRPC status that says what to do.
fn store_status(e: StoreError) -> Status {
    let msg = e.to_string();
    match e.kind {
        StoreErrorKind::NotFound => Status::not_found(msg),
        StoreErrorKind::PermissionDenied => {
            Status::permission_denied(format!("{msg} (check the secret's keys and their permissions)"))
        }
        StoreErrorKind::InvalidName => Status::invalid_argument(msg),
        _ => Status::unavailable(msg),
    }
}

/// Whether `seg` can be a volume's key segment (what PV names and csi-sanity's names are).
fn check_segment(seg: &str) -> Result<(), Status> {
    let ok = !seg.is_empty()
        && seg.len() <= 128
        && !seg.starts_with('.')
        && seg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(crate::invalid(format!("volume key {seg:?}: letters, digits, '-', '_' or '.' only")))
    }
}

/// The key segment of volume `name` under `base`: the name itself where it is a valid
/// segment and the volume ID (`base/segment`) fits CSI's 128 bytes; otherwise the name's
/// start, cleaned, and a hash of the whole name (the same name always gives the same one).
fn segment(base: &str, name: &str) -> Result<String, Status> {
    if name.is_empty() {
        return Err(crate::invalid("name is missing"));
    }
    if check_segment(name).is_ok() && base.len() + 1 + name.len() <= 128 {
        return Ok(name.to_string());
    }
    let hash = crate::params::path_id(std::path::Path::new(name));
    let room = 128usize.saturating_sub(base.len() + 1 + 1 + hash.len());
    if room < 8 {
        return Err(crate::invalid(format!("url {base:?} is too long for a CSI volume ID: use a shorter one")));
    }
    let clean: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || "-_".contains(c) { c } else { '-' }).take(room).collect();
    Ok(format!("{clean}-{hash}"))
}

/// Volume IDs of volumes that are buckets of their own: `bucket+` and the base URL and
/// segment (the base bucket keeps their records).
const BUCKET_ID: &str = "bucket+";

/// The bucket of volume `seg` made under base bucket `base`: `base-seg`, lowercased, in
/// S3's bucket-name characters, cut with a hash of the whole past 63 characters.
fn bucket_name(base: &str, seg: &str) -> String {
    let clean: String = format!("{base}-{seg}")
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' })
        .collect();
    if clean.len() <= 63 {
        return clean;
    }
    let hash = crate::params::path_id(std::path::Path::new(&clean));
    format!("{}-{}", clean[..63 - 17].trim_end_matches('-'), hash)
}

/// Split a volume ID into its base URL and name; `None` if it is not one of ours.
fn split_id(id: &str) -> Option<(&str, &str)> {
    let id = id.strip_prefix(BUCKET_ID).unwrap_or(id);
    let (base, name) = id.trim_end_matches('/').rsplit_once('/')?;
    (check_segment(name).is_ok() && Location::parse(base).is_ok() && !base.ends_with('/')).then_some((base, name))
}

fn open(base: &str, secrets: &Secrets, attrs: &Attributes) -> Result<Arc<dyn Store>, Status> {
    let loc = crate::params::volume_location(base)?;
    location::open(&loc, &secrets.store_options(attrs)).map_err(store_status)
}

async fn read_record(store: &dyn Store, name: &str) -> Result<Option<Record>, Status> {
    match store.read(&format!("{RECORDS}{name}.json")).await {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Status::internal(format!("the record of volume {name} is damaged: {e}"))),
        Err(e) if e.kind == StoreErrorKind::NotFound => Ok(None),
        Err(e) => Err(store_status(e)),
    }
}

fn check_capabilities(caps: &[pb::VolumeCapability]) -> Result<(), Status> {
    if caps.is_empty() {
        return Err(crate::invalid("volume_capabilities is empty"));
    }
    for c in caps {
        match &c.access_type {
            Some(vc::AccessType::Mount(_)) => {}
            Some(vc::AccessType::Block(_)) => {
                return Err(crate::invalid("bucketfs volumes are file systems: block access is not offered"))
            }
            None => return Err(crate::invalid("a volume capability has no access type")),
        }
        if c.access_mode.is_none() {
            return Err(crate::invalid("a volume capability has no access mode"));
        }
    }
    Ok(())
}

/// The store options and region for making or deleting a volume's own bucket; the region
/// is `AWS_REGION` (else us-east-1) when neither the parameters nor the secret name one.
fn bucket_opts(secrets: &Secrets, attrs: &Attributes) -> (location::StoreOptions, String) {
    let opts = secrets.store_options(attrs);
    let region =
        opts.region.clone().unwrap_or_else(|| std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()));
    (opts, region)
}

#[tonic::async_trait]
impl pb::controller_server::Controller for Controller {
    async fn create_volume(
        &self,
        req: Request<pb::CreateVolumeRequest>,
    ) -> Result<Response<pb::CreateVolumeResponse>, Status> {
        let r = req.into_inner();
        check_capabilities(&r.volume_capabilities)?;
        if r.volume_content_source.is_some() {
            return Err(crate::invalid("bucketfs volumes cannot be made from a snapshot or another volume"));
        }
        let attrs = Attributes::parse(&r.parameters)?;
        let secrets = Secrets::parse(&r.secrets)?;
        let base = attrs.url.clone().ok_or_else(|| crate::invalid("the StorageClass has no url parameter"))?;
        let base = base.trim_end_matches('/').to_string();
        let id_base = if attrs.bucket_per_volume { format!("{BUCKET_ID}{base}") } else { base.clone() };
        let seg = segment(&id_base, &r.name)?;
        let (id, bucket) = match attrs.bucket_per_volume {
            false => (format!("{base}/{seg}"), None),
            true => match Location::parse(&base) {
                Ok(Location::S3 { bucket, prefix }) if prefix.is_empty() => {
                    (format!("{BUCKET_ID}{base}/{seg}"), Some(bucket_name(&bucket, &seg)))
                }
                _ => return Err(crate::invalid(
                    "provisioning: bucket needs url: s3://BUCKET (no prefix): that bucket keeps the volumes' records",
                )),
            },
        };
        let capacity = r.capacity_range.map(|c| c.required_bytes.max(c.limit_bytes)).unwrap_or(0);
        let store = open(&base, &secrets, &attrs)?;
        let url = match &bucket {
            Some(b) => format!("s3://{b}"),
            None => id.clone(),
        };
        let want = Record {
            name: r.name.clone(),
            capacity_bytes: capacity,
            delete_on_delete: attrs.delete_on_delete,
            bucket: bucket.clone(),
            volume_context: attrs.for_volume(&url),
        };
        let rec = match read_record(store.as_ref(), &seg).await? {
            Some(old) if old.capacity_bytes != want.capacity_bytes => {
                return Err(Status::already_exists(format!(
                    "volume {} exists with capacity {} bytes, not {}",
                    r.name, old.capacity_bytes, want.capacity_bytes
                )))
            }
            Some(old) => old,
            None => {
                match &bucket {
                    Some(b) => {
                        let (opts, region) = bucket_opts(&secrets, &attrs);
                        let made = bucketfs_store::s3::bucket::create_bucket(
                            opts.endpoint.as_deref(),
                            &region,
                            b,
                            opts.keys.as_ref(),
                        )
                        .await
                        .map_err(store_status)?;
                        tracing::info!(bucket = %b, made, "the volume's bucket");
                    }
                    None => store.create_dir(&format!("{seg}/")).await.map_err(store_status)?,
                }
                let body = serde_json::to_vec(&want).expect("a record serializes");
                let key = format!("{RECORDS}{seg}.json");
                match store.put(&key, body.into(), PutOpts { if_not_exists: true, ..Default::default() }).await {
                    Ok(_) => {}
                    // A retry of this call that raced us wrote it: answer as for an existing one.
                    Err(e) if e.kind == StoreErrorKind::Exists => {
                        return Box::pin(self.create_volume(Request::new(pb::CreateVolumeRequest {
                            name: r.name,
                            capacity_range: r.capacity_range,
                            volume_capabilities: r.volume_capabilities,
                            parameters: r.parameters,
                            secrets: r.secrets,
                            ..Default::default()
                        })))
                        .await
                    }
                    Err(e) => return Err(store_status(e)),
                }
                tracing::info!(volume = %id, "created");
                want
            }
        };
        Ok(Response::new(pb::CreateVolumeResponse {
            volume: Some(pb::Volume {
                capacity_bytes: rec.capacity_bytes,
                volume_id: id,
                volume_context: rec.volume_context,
                ..Default::default()
            }),
        }))
    }

    async fn delete_volume(
        &self,
        req: Request<pb::DeleteVolumeRequest>,
    ) -> Result<Response<pb::DeleteVolumeResponse>, Status> {
        let r = req.into_inner();
        if r.volume_id.is_empty() {
            return Err(crate::invalid("volume_id is missing"));
        }
        let Some((base, name)) = split_id(&r.volume_id) else {
            return Ok(Response::new(pb::DeleteVolumeResponse {})); // never one of ours
        };
        let secrets = Secrets::parse(&r.secrets)?;
        let store = open(base, &secrets, &Attributes::default())?;
        let Some(rec) = read_record(store.as_ref(), name).await? else {
            return Ok(Response::new(pb::DeleteVolumeResponse {})); // deleted already
        };
        if rec.delete_on_delete {
            let (target, prefix) = match &rec.bucket {
                Some(b) => (open(&format!("s3://{b}"), &secrets, &Attributes::default())?, String::new()),
                None => (store.clone(), format!("{name}/")),
            };
            let mut keys = target.list(&prefix, true);
            let mut removed = 0u64;
            while let Some(meta) = keys.next().await {
                target.delete(&meta.map_err(store_status)?.key).await.map_err(store_status)?;
                removed += 1;
            }
            match &rec.bucket {
                Some(b) => {
                    let (opts, region) = bucket_opts(&secrets, &Attributes::default());
                    bucketfs_store::s3::bucket::delete_bucket(opts.endpoint.as_deref(), &region, b, opts.keys.as_ref())
                        .await
                        .map_err(store_status)?;
                }
                None => store.delete(&prefix).await.map_err(store_status)?,
            }
            tracing::info!(volume = %r.volume_id, removed, "deleted with its keys");
        } else {
            tracing::info!(volume = %r.volume_id, "deleted; its keys are kept (onDelete: keep)");
        }
        store.delete(&format!("{RECORDS}{name}.json")).await.map_err(store_status)?;
        Ok(Response::new(pb::DeleteVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<pb::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<pb::ValidateVolumeCapabilitiesResponse>, Status> {
        let r = req.into_inner();
        if r.volume_id.is_empty() {
            return Err(crate::invalid("volume_id is missing"));
        }
        if r.volume_capabilities.is_empty() {
            return Err(crate::invalid("volume_capabilities is empty"));
        }
        let (base, name) =
            split_id(&r.volume_id).ok_or_else(|| Status::not_found(format!("no volume {:?}", r.volume_id)))?;
        let secrets = Secrets::parse(&r.secrets)?;
        let store = open(base, &secrets, &Attributes::default())?;
        if read_record(store.as_ref(), name).await?.is_none() {
            return Err(Status::not_found(format!("no volume {:?}", r.volume_id)));
        }
        if let Err(e) = check_capabilities(&r.volume_capabilities) {
            return Ok(Response::new(pb::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: e.message().to_string(),
            }));
        }
        Ok(Response::new(pb::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(pb::validate_volume_capabilities_response::Confirmed {
                volume_context: r.volume_context,
                volume_capabilities: r.volume_capabilities,
                parameters: r.parameters,
                mutable_parameters: Default::default(),
            }),
            message: String::new(),
        }))
    }

    /// A claim grown in Kubernetes: the new size is recorded (object stores enforce none);
    /// no node has anything to do.
    async fn controller_expand_volume(
        &self,
        req: Request<pb::ControllerExpandVolumeRequest>,
    ) -> Result<Response<pb::ControllerExpandVolumeResponse>, Status> {
        let r = req.into_inner();
        if r.volume_id.is_empty() {
            return Err(crate::invalid("volume_id is missing"));
        }
        let range = r.capacity_range.ok_or_else(|| crate::invalid("capacity_range is missing"))?;
        let (base, seg) =
            split_id(&r.volume_id).ok_or_else(|| Status::not_found(format!("no volume {:?}", r.volume_id)))?;
        let secrets = Secrets::parse(&r.secrets)?;
        let store = open(base, &secrets, &Attributes::default())?;
        let mut rec = read_record(store.as_ref(), seg)
            .await?
            .ok_or_else(|| Status::not_found(format!("no volume {:?}", r.volume_id)))?;
        let want = range.required_bytes.max(range.limit_bytes);
        if want > rec.capacity_bytes {
            rec.capacity_bytes = want;
            let body = serde_json::to_vec(&rec).expect("a record serializes");
            store.put(&format!("{RECORDS}{seg}.json"), body.into(), PutOpts::default()).await.map_err(store_status)?;
        }
        Ok(Response::new(pb::ControllerExpandVolumeResponse {
            capacity_bytes: rec.capacity_bytes,
            node_expansion_required: false,
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<pb::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<pb::ControllerGetCapabilitiesResponse>, Status> {
        let rpc = |t: cap::rpc::Type| pb::ControllerServiceCapability {
            r#type: Some(cap::Type::Rpc(cap::Rpc { r#type: t as i32 })),
        };
        Ok(Response::new(pb::ControllerGetCapabilitiesResponse {
            capabilities: vec![
                rpc(cap::rpc::Type::CreateDeleteVolume),
                rpc(cap::rpc::Type::ExpandVolume),
                rpc(cap::rpc::Type::SingleNodeMultiWriter),
            ],
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_ids_split_into_base_and_name() {
        assert_eq!(split_id("s3://bkt/vols/pvc-1"), Some(("s3://bkt/vols", "pvc-1")));
        assert_eq!(split_id("gs://bkt/pvc-1"), Some(("gs://bkt", "pvc-1")));
        assert_eq!(split_id("not-a-url"), None);
        assert_eq!(split_id("s3://bkt/vols/.."), None);
        assert_eq!(split_id("bucket+s3://bkt/pvc-1"), Some(("s3://bkt", "pvc-1")));
        assert_eq!(bucket_name("team", "pvc-1A"), "team-pvc-1a");
        let long = bucket_name("team", &"x".repeat(100));
        assert!(long.len() <= 63 && long.starts_with("team-x"), "{long}");
        assert_eq!(long, bucket_name("team", &"x".repeat(100)));
        assert!(check_segment("..").is_err() && check_segment("a/b").is_err() && check_segment("").is_err());
        assert_eq!(segment("s3://bkt/v", "pvc-1A2B").unwrap(), "pvc-1A2B");
    }

    #[test]
    fn long_or_odd_names_get_a_hashed_segment_that_fits() {
        let long = "n".repeat(128);
        for name in [long.as_str(), "../etc", "a/b", "ünï"] {
            let seg = segment("s3://bucket/volumes", name).unwrap();
            assert!(check_segment(&seg).is_ok(), "{seg}");
            assert!("s3://bucket/volumes/".len() + seg.len() <= 128, "{seg}");
            assert_eq!(seg, segment("s3://bucket/volumes", name).unwrap(), "stable");
        }
        assert_ne!(segment("s3://bkt", "a/b").unwrap(), segment("s3://bkt", "a-b").unwrap());
        assert!(segment(&format!("s3://{}", "b".repeat(120)), &long).is_err());
        assert!(segment("s3://bkt", "").is_err());
    }
}
