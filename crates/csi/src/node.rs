//! The CSI Node service: one bucketfs mount per volume and node, bind-mounted into pods.
//!
//! - `NodeStageVolume` runs `bucketfs mount` at the staging path (the volume's URL from its
//!   attributes, or its ID when that is a URL: a static PV may name its bucket directly),
//!   with the credential files of [`crate::params`], and records the volume in the state
//!   directory. A staging path whose mount died is detached and mounted again.
//! - `NodePublishVolume` bind-mounts the staging path on the pod's target path, read-only
//!   when the pod or the access mode asks.
//! - `NodeUnpublishVolume` removes the bind mount and the target directory;
//!   `NodeUnstageVolume` unmounts through `bucketfs unmount`, which returns once what the
//!   pods closed is in the bucket, then forgets the record and the credential files.
//! - `NodeGetVolumeStats` fails with the reason when the mount's process is gone: a mount
//!   that died is reported, not left as a silent `ENOTCONN`.
//!
//! Every call is idempotent, as the spec asks: the kernel's mount table says what is done.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tonic::{Request, Response, Status};

use crate::mounts;
use crate::params::{path_id, Attributes, Secrets};
use crate::pb::{self, node_service_capability as cap, volume_capability as vc};

/// What the node remembers of a staged volume.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    volume_id: String,
    staging_path: PathBuf,
    url: String,
    /// The mount's arguments and credential files, so an unstage can mount the volume
    /// again to send what a mount that died left staged (older records have none).
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<(String, PathBuf)>,
}

/// The record at `path`, if it is one (unreadable or not a record: none).
fn read_record(path: &Path) -> Option<Record> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

pub struct Node {
    node_id: String,
    state: PathBuf,
    bin: PathBuf,
    prefix: Vec<String>,
    check_mount_args: crate::CheckMountArgs,
    /// Stage and unstage calls run one at a time per staging path.
    locks: tokio::sync::Mutex<HashMap<PathBuf, std::sync::Arc<tokio::sync::Mutex<()>>>>,
}

impl Node {
    pub fn new(cfg: &crate::Config) -> Result<Self, String> {
        for d in ["volumes", "secrets", "logs"] {
            let p = cfg.state_dir.join(d);
            std::fs::create_dir_all(&p).map_err(|e| format!("cannot create {}: {e}", p.display()))?;
        }
        let secrets = cfg.state_dir.join("secrets");
        std::fs::set_permissions(&secrets, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| format!("cannot restrict {}: {e}", secrets.display()))?;
        Ok(Node {
            node_id: cfg.node_id.clone(),
            state: cfg.state_dir.clone(),
            bin: cfg.bucketfs.clone(),
            prefix: cfg.mount_prefix.clone(),
            check_mount_args: cfg.check_mount_args,
            locks: Default::default(),
        })
    }

    /// A volume's mount that died (`kill -9`, a crash), or gave up on an upload at an
    /// earlier unstage, may have left closed files in its staging directory, which only a
    /// mount of them sends: mounted again (its recovery sends them before it serves) and
    /// unmounted (which waits for them). Unstage answered OK with the files on this node
    /// only (tester R). A store that still refuses fails the call; the CO calls again.
    async fn send_what_was_left(&self, volume: &str, staging: &Path) -> Result<(), Status> {
        let Some(rec) = read_record(&self.record_path(staging)).filter(|r| !r.args.is_empty()) else { return Ok(()) };
        let env: Vec<(&str, PathBuf)> = rec.env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        tracing::info!(volume, staging = %staging.display(), "the mount was not running: mounting again to send what it left");
        mounts::mount(&self.prefix, &self.bin, &rec.url, staging, &rec.args, &env).await.map_err(|e| {
            Status::unavailable(format!(
                "volume {volume}: its mount was not running, and mounting it again to send what it left failed: {e}"
            ))
        })?;
        mounts::unmount(&self.bin, staging).await.map_err(Status::internal)
    }

    /// At start: find the mounts an earlier run of the plugin made, and say how each is.
    /// A hung mount holds the start for at most the stat timeout, then is reported.
    pub async fn adopt(&self) {
        let Ok(dir) = std::fs::read_dir(self.state.join("volumes")) else { return };
        for entry in dir.flatten() {
            let Some(rec) = read_record(&entry.path()) else { continue };
            let p = rec.staging_path.display().to_string();
            let answers = match mounts::mounted_at(&rec.staging_path) {
                Some(_) => Some(mounts::answers_bounded(&rec.staging_path).await),
                None => None,
            };
            match answers {
                Some(Ok(())) => tracing::info!(volume = %rec.volume_id, staging = %p, "adopted a running mount"),
                Some(Err(e)) => tracing::warn!(volume = %rec.volume_id, staging = %p, "mount found dead: {e}"),
                None => tracing::warn!(
                    volume = %rec.volume_id, staging = %p,
                    "staged volume not mounted (the node restarted?); the next stage mounts it"
                ),
            }
        }
    }

    async fn lock(&self, path: &Path) -> tokio::sync::OwnedMutexGuard<()> {
        let m = self.locks.lock().await.entry(path.to_path_buf()).or_default().clone();
        m.lock_owned().await
    }

    fn record_path(&self, staging: &Path) -> PathBuf {
        self.state.join("volumes").join(format!("{}.json", path_id(staging)))
    }

    fn secrets_dir(&self, staging: &Path) -> PathBuf {
        self.state.join("secrets").join(path_id(staging))
    }
}

/// The checks every stage and publish makes of a capability: present, a mount (bucketfs
/// is a file system, not a block device), and whether it allows writing.
fn check_capability(c: Option<&pb::VolumeCapability>) -> Result<(bool, &vc::MountVolume, bool), Status> {
    let c = c.ok_or_else(|| crate::invalid("volume_capability is missing"))?;
    let mount = match &c.access_type {
        Some(vc::AccessType::Mount(m)) => m,
        Some(vc::AccessType::Block(_)) => {
            return Err(crate::invalid("bucketfs volumes are file systems: block access is not offered"))
        }
        None => return Err(crate::invalid("volume_capability has no access type")),
    };
    use vc::access_mode::Mode;
    let mode = c.access_mode.as_ref().map(|m| m.mode).unwrap_or(0);
    let read_only = matches!(Mode::try_from(mode), Ok(Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly));
    if !mount.fs_type.is_empty() && mount.fs_type != "bucketfs" && mount.fs_type != "fuse" {
        return Err(crate::invalid(format!("fs_type {:?}: bucketfs volumes are bucketfs", mount.fs_type)));
    }
    let single_writer = matches!(Mode::try_from(mode), Ok(Mode::SingleNodeSingleWriter));
    Ok((read_only, mount, single_writer))
}

fn required<'a>(v: &'a str, what: &str) -> Result<&'a str, Status> {
    if v.is_empty() {
        Err(crate::invalid(format!("{what} is missing")))
    } else {
        Ok(v)
    }
}

/// The `bucketfs mount` arguments after URL and path.
fn mount_args(
    node_id: &str,
    attrs: &Attributes,
    secrets: &Secrets,
    mount: &vc::MountVolume,
    read_only: bool,
    log: &Path,
) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(e) = secrets.endpoint.as_ref().or(attrs.endpoint.as_ref()) {
        args.extend(["--endpoint".to_string(), e.clone()]);
    }
    if let Some(r) = secrets.region.as_ref().or(attrs.region.as_ref()) {
        args.extend(["--region".to_string(), r.clone()]);
    }
    // `{host}` (in `notify=...`): this node's name up to its first dot, so that one volume
    // serves a fleet whose nodes each have a queue or subscription named after them.
    let host = node_id.split('.').next().unwrap_or(node_id);
    let mut opts: Vec<String> = attrs.mount_options.iter().map(|o| o.replace("{host}", host)).collect();
    opts.extend(mount.mount_flags.iter().cloned());
    if !mount.volume_mount_group.is_empty() {
        // fsGroup: the volume's files belong to the pod's group, which may write them.
        opts.push(format!("gid={},umask=002", mount.volume_mount_group));
    }
    if read_only {
        opts.push("ro".into());
    }
    // Pods rarely run as the user who mounted (root): the kernel still checks each access
    // against the files' owner and mode (bucketfs mounts with default_permissions).
    opts.push("allow_other".into());
    if !opts.is_empty() {
        args.extend(["-o".to_string(), opts.join(",")]);
    }
    args.extend(["--log-file".to_string(), log.display().to_string()]);
    args
}

#[tonic::async_trait]
impl pb::node_server::Node for Node {
    async fn node_stage_volume(
        &self,
        req: Request<pb::NodeStageVolumeRequest>,
    ) -> Result<Response<pb::NodeStageVolumeResponse>, Status> {
        let r = req.into_inner();
        let volume_id = required(&r.volume_id, "volume_id")?;
        let staging = PathBuf::from(required(&r.staging_target_path, "staging_target_path")?);
        let (read_only, mount, _) = check_capability(r.volume_capability.as_ref())?;
        let attrs = Attributes::parse(&r.volume_context)?;
        let secrets = Secrets::parse(&r.secrets)?;
        let url = match &attrs.url {
            Some(u) => u.clone(),
            None if bucketfs_store::location::Location::parse(volume_id).is_ok() => {
                crate::params::volume_location(volume_id)?;
                volume_id.to_string()
            }
            None => return Err(crate::invalid(format!("volume {volume_id:?} has no url attribute and is not a URL"))),
        };
        let _one = self.lock(&staging).await;
        let mounted = mounts::mounted_at(&staging);
        if let Some(m) = &mounted {
            match mounts::answers_bounded(&staging).await {
                Ok(()) => {
                    // Staged already: done if as asked. Another volume or URL, or another
                    // read-only, answered OK and changed nothing (tester R); the spec asks
                    // ALREADY_EXISTS.
                    let rec = read_record(&self.record_path(&staging));
                    let differs = rec.is_some_and(|rec| rec.volume_id != volume_id || rec.url != url);
                    if differs || m.read_only != read_only {
                        return Err(Status::already_exists(format!(
                            "{} is staged already as another volume, URL or access mode: unstage it first",
                            staging.display()
                        )));
                    }
                    return Ok(Response::new(pb::NodeStageVolumeResponse {}));
                }
                Err(e) => {
                    tracing::warn!(volume = volume_id, "staged mount is dead, mounting again: {e}");
                    mounts::detach(&staging).map_err(Status::internal)?;
                }
            }
        }
        let log = self.state.join("logs").join(format!("{}.log", path_id(&staging)));
        let args = mount_args(&self.node_id, &attrs, &secrets, mount, read_only, &log);
        (self.check_mount_args)(&url, &staging, &args).map_err(|e| {
            crate::invalid(format!("volume {volume_id:?}: its mountOptions or mount flags are not valid: {e}"))
        })?;
        std::fs::create_dir_all(&staging)
            .map_err(|e| Status::internal(format!("cannot create {}: {e}", staging.display())))?;
        let env = secrets
            .write_files(&self.secrets_dir(&staging))
            .map_err(|e| Status::internal(format!("cannot write the volume's credential files: {e}")))?;
        let rec = Record {
            volume_id: volume_id.to_string(),
            staging_path: staging.clone(),
            url: url.clone(),
            args: args.clone(),
            env: env.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
        };
        std::fs::write(self.record_path(&staging), serde_json::to_vec(&rec).expect("a record serializes"))
            .map_err(|e| Status::internal(format!("cannot record the volume: {e}")))?;
        if let Err(e) = mounts::mount(&self.prefix, &self.bin, &url, &staging, &args, &env).await {
            let _ = std::fs::remove_file(self.record_path(&staging));
            let _ = std::fs::remove_dir_all(self.secrets_dir(&staging));
            tracing::warn!(volume = volume_id, "mount failed: {e}");
            let hint = if e.contains("denied") {
                " (the keys come from the volume's node-stage secret: awsAccessKeyId and awsSecretAccessKey, or gcsServiceAccountKey)"
            } else {
                ""
            };
            return Err(Status::internal(format!("bucketfs mount {url}: {e}{hint}")));
        }
        tracing::info!(volume = volume_id, staging = %staging.display(), "staged");
        Ok(Response::new(pb::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        req: Request<pb::NodeUnstageVolumeRequest>,
    ) -> Result<Response<pb::NodeUnstageVolumeResponse>, Status> {
        let r = req.into_inner();
        required(&r.volume_id, "volume_id")?;
        let staging = PathBuf::from(required(&r.staging_target_path, "staging_target_path")?);
        let _one = self.lock(&staging).await;
        let mounted = mounts::mounted_at(&staging).is_some();
        if mounted {
            // The CO unpublishes first: a pod still using the volume keeps the daemon
            // serving, and its last uploads could not be waited for.
            if let Some(other) = mounts::binds_of(&staging).first() {
                return Err(Status::failed_precondition(format!(
                    "volume {} is still published at {}: unpublish it first",
                    r.volume_id,
                    other.display()
                )));
            }
        }
        // Also when nothing is mounted but the volume's record is here: an earlier call
        // unmounted and gave up waiting while the mount's process still uploads. The record
        // goes only once that is done, so every retry waits again.
        let healthy = mounted && mounts::answers_bounded(&staging).await.is_ok();
        if mounted || self.record_path(&staging).exists() {
            mounts::unmount(&self.bin, &staging).await.map_err(Status::internal)?;
        }
        if !healthy {
            self.send_what_was_left(&r.volume_id, &staging).await?;
        }
        let _ = std::fs::remove_file(self.record_path(&staging));
        let _ = std::fs::remove_dir_all(self.secrets_dir(&staging));
        tracing::info!(volume = %r.volume_id, staging = %staging.display(), "unstaged");
        Ok(Response::new(pb::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        req: Request<pb::NodePublishVolumeRequest>,
    ) -> Result<Response<pb::NodePublishVolumeResponse>, Status> {
        let r = req.into_inner();
        required(&r.volume_id, "volume_id")?;
        let staging = PathBuf::from(required(&r.staging_target_path, "staging_target_path")?);
        let target = PathBuf::from(required(&r.target_path, "target_path")?);
        let (read_only, _, single_writer) = check_capability(r.volume_capability.as_ref())?;
        let read_only = read_only || r.readonly;
        if std::fs::symlink_metadata(&target).is_ok_and(|m| m.file_type().is_symlink()) {
            // mount(2) follows it: the bind landed where it points, and no unpublish
            // could remove it (tester R).
            return Err(Status::invalid_argument(format!(
                "target path {} is a symbolic link: publish to a directory",
                target.display()
            )));
        }
        if let Some(bound) = mounts::mounted_at(&target) {
            // Published already, if it is a bind of the staged mount and it answers. A bind
            // of an earlier one (the daemon died, the volume was staged again) answers
            // ENOTCONN for good: it is bound again.
            let current = mounts::mounted_at(&staging).is_some_and(|s| s.dev == bound.dev);
            if current && mounts::answers_bounded(&target).await.is_ok() {
                if bound.read_only != read_only {
                    // The spec's answer to a publish that differs: a read-only one left
                    // the target writable, and OK (tester R).
                    return Err(Status::already_exists(format!(
                        "volume {} is published at {} {}: unpublish it first",
                        r.volume_id,
                        target.display(),
                        if bound.read_only { "read-only" } else { "read-write" }
                    )));
                }
                return Ok(Response::new(pb::NodePublishVolumeResponse {}));
            }
            tracing::warn!(volume = %r.volume_id, target = %target.display(), "published bind is stale; binding again");
            while mounts::mounted_at(&target).is_some() {
                mounts::detach(&target).map_err(Status::internal)?;
            }
        }
        if single_writer {
            if let Some(other) = mounts::binds_of(&staging).first() {
                return Err(Status::failed_precondition(format!(
                    "volume {} is single-node-single-writer and already published at {}",
                    r.volume_id,
                    other.display()
                )));
            }
        }
        if mounts::mounted_at(&staging).is_none() {
            return Err(Status::failed_precondition(format!(
                "volume {} is not staged at {}: stage it first",
                r.volume_id,
                staging.display()
            )));
        }
        mounts::answers_bounded(&staging).await.map_err(Status::failed_precondition)?;
        std::fs::create_dir_all(&target)
            .map_err(|e| Status::internal(format!("cannot create {}: {e}", target.display())))?;
        mounts::bind(&staging, &target, read_only).map_err(Status::internal)?;
        tracing::info!(volume = %r.volume_id, target = %target.display(), read_only, "published");
        Ok(Response::new(pb::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<pb::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<pb::NodeUnpublishVolumeResponse>, Status> {
        let r = req.into_inner();
        required(&r.volume_id, "volume_id")?;
        let target = PathBuf::from(required(&r.target_path, "target_path")?);
        while mounts::mounted_at(&target).is_some() {
            mounts::detach(&target).map_err(Status::internal)?;
        }
        match std::fs::remove_dir(&target) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Status::internal(format!("cannot remove {}: {e}", target.display())))
            }
            _ => {}
        }
        tracing::info!(volume = %r.volume_id, target = %target.display(), "unpublished");
        Ok(Response::new(pb::NodeUnpublishVolumeResponse {}))
    }

    #[allow(clippy::unnecessary_cast)] // statvfs's field types differ between platforms
    async fn node_get_volume_stats(
        &self,
        req: Request<pb::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<pb::NodeGetVolumeStatsResponse>, Status> {
        let r = req.into_inner();
        required(&r.volume_id, "volume_id")?;
        let path = PathBuf::from(required(&r.volume_path, "volume_path")?);
        if mounts::mounted_at(&path).is_none() {
            return Err(Status::not_found(format!("volume {} is not mounted at {}", r.volume_id, path.display())));
        }
        let st = match mounts::statvfs_bounded(&path).await {
            Ok(st) => st,
            Err(e) if mounts::is_dead(&e) => {
                return Err(Status::failed_precondition(format!(
                    "volume {}: the bucketfs process of its mount is gone ({e}); the pods using it need a new one",
                    r.volume_id
                )))
            }
            Err(e) => return Err(Status::internal(format!("statfs {}: {e}", path.display()))),
        };
        use pb::volume_usage::Unit;
        let usage = |total: u64, free: u64, unit: Unit| pb::VolumeUsage {
            total: total as i64,
            available: free as i64,
            used: total.saturating_sub(free) as i64,
            unit: unit as i32,
        };
        let frag = st.f_frsize as u64;
        Ok(Response::new(pb::NodeGetVolumeStatsResponse {
            usage: vec![
                usage(st.f_blocks as u64 * frag, st.f_bavail as u64 * frag, Unit::Bytes),
                usage(st.f_files as u64, st.f_ffree as u64, Unit::Inodes),
            ],
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<pb::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<pb::NodeGetCapabilitiesResponse>, Status> {
        let rpc = |t: cap::rpc::Type| pb::NodeServiceCapability {
            r#type: Some(cap::Type::Rpc(cap::Rpc { r#type: t as i32 })),
        };
        Ok(Response::new(pb::NodeGetCapabilitiesResponse {
            capabilities: vec![
                rpc(cap::rpc::Type::StageUnstageVolume),
                rpc(cap::rpc::Type::GetVolumeStats),
                rpc(cap::rpc::Type::VolumeMountGroup),
                rpc(cap::rpc::Type::SingleNodeMultiWriter),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<pb::NodeGetInfoRequest>,
    ) -> Result<Response<pb::NodeGetInfoResponse>, Status> {
        Ok(Response::new(pb::NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_in_mount_options_is_the_nodes_short_name() {
        let attrs = Attributes {
            mount_options: Some("metadata-ttl=3600,notify=sqs://h/1/q-{host}".into()),
            ..Attributes::default()
        };
        let args = mount_args(
            "ip-10-0-0-7.ec2.internal",
            &attrs,
            &Secrets::default(),
            &vc::MountVolume::default(),
            false,
            Path::new("/l"),
        );
        let o = args.iter().position(|a| a == "-o").expect("-o");
        assert!(args[o + 1].contains("notify=sqs://h/1/q-ip-10-0-0-7,"), "{args:?}");
    }
}
