//! `bucketfs csi`: the Kubernetes CSI driver (CSI spec v1.13, gRPC over a Unix socket).
//!
//! - [`identity`]: who the plugin is and whether it is ready.
//! - [`node`]: `NodeStageVolume` mounts bucketfs once per volume and node (at the staging
//!   path); `NodePublishVolume` bind-mounts that into each pod's target path, read-only
//!   where asked. One mount per volume per node, as the peers' drivers moved to: pods of one
//!   node share its caches, its memory and its uploads. The mounts are `bucketfs mount`
//!   processes of their own session ([`mounts`]), so a restart of the plugin leaves them
//!   serving; the restarted plugin finds them in its state directory and the mount table.
//! - [`controller`]: dynamic provisioning. `CreateVolume` gives each claim its own prefix
//!   in the bucket a StorageClass names; `DeleteVolume` keeps or removes it.
//! - [`params`]: volume attributes, StorageClass parameters and secrets, and how they turn
//!   into a mount's arguments and credential files (never an argv or an environment).
//!
//! The gRPC code is generated from the spec's `csi.proto` at build time (`build.rs`).

pub mod controller;
pub mod identity;
pub mod mounts;
pub mod node;
pub mod params;

use std::path::PathBuf;

/// The generated CSI messages and services.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("csi.v1");
}

/// The name the plugin registers under (the CSIDriver object's name).
pub const DRIVER_NAME: &str = "csi.bucketfs.dev";

/// Which services this process serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Identity and Node: the DaemonSet on every node.
    Node,
    /// Identity and Controller: the provisioner's Deployment.
    Controller,
    /// All three (a single process, for tests and small setups).
    All,
}

/// How `bucketfs csi` runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// `unix:///path/csi.sock` or a plain path.
    pub endpoint: String,
    /// This node's name (NodeGetInfo); Kubernetes passes the node's name.
    pub node_id: String,
    pub mode: Mode,
    /// Where the node keeps what it must find again after a restart: one record per staged
    /// volume, its credential files (mode 0600) and its mount's log.
    pub state_dir: PathBuf,
    /// The `bucketfs` binary that mounts (this one, normally).
    pub bucketfs: PathBuf,
    /// A command that runs each `bucketfs mount` (its words), e.g. `nsenter --target 1
    /// --mount --pid -- systemd-run --scope --collect --quiet --` so that a mount lives in
    /// a host scope of its own and outlives the plugin's container (docs/KUBERNETES.md).
    /// Empty: mounts run as children of the plugin, in sessions of their own.
    pub mount_prefix: Vec<String>,
    /// Whether `bucketfs mount URL PATH ARGS...` parses (the CLI's own parser): a volume's
    /// bad `mountOptions` are then `INVALID_ARGUMENT`, not a failed mount.
    pub check_mount_args: CheckMountArgs,
}

/// See [`Config::check_mount_args`].
pub type CheckMountArgs = fn(url: &str, path: &std::path::Path, args: &[String]) -> Result<(), String>;

/// Serve until SIGTERM or SIGINT; the mounts keep running after.
pub async fn serve(cfg: Config) -> Result<(), String> {
    use tokio_stream::wrappers::UnixListenerStream;
    let path = PathBuf::from(cfg.endpoint.strip_prefix("unix://").unwrap_or(&cfg.endpoint));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    // A socket left by a previous run of the plugin (its restart) is ours to replace.
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(format!("cannot remove the old socket {}: {e}", path.display()))
        }
        _ => {}
    }
    let mut router = tonic::transport::Server::builder()
        .add_service(pb::identity_server::IdentityServer::new(identity::Identity { mode: cfg.mode }));
    if cfg.mode != Mode::Controller {
        let node = node::Node::new(&cfg)?;
        node.adopt().await;
        router = router.add_service(pb::node_server::NodeServer::new(node));
    }
    if cfg.mode != Mode::Node {
        router = router.add_service(pb::controller_server::ControllerServer::new(controller::Controller));
    }
    // Listen only once the mounts of an earlier run are adopted: a caller that sees the
    // socket sees a plugin that knows its mounts.
    // The handlers exist before the socket does: a SIGTERM sent the moment the socket shows
    // would otherwise take the default action and skip removing it.
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("cannot handle SIGTERM: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("cannot handle SIGINT: {e}"))?;
    let listener = tokio::net::UnixListener::bind(&path)
        .map_err(|e| format!("cannot listen on {}: {e} (is the directory writable?)", path.display()))?;
    tracing::info!(endpoint = %path.display(), mode = ?cfg.mode, node = %cfg.node_id, "CSI driver serving");
    let stop = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("CSI driver stopping; its mounts keep serving");
    };
    router
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop)
        .await
        .map_err(|e| format!("gRPC server: {e}"))?;
    let _ = std::fs::remove_file(&path);
    Ok(())
}

/// A gRPC status for a request that lacks a field or has a bad one.
pub(crate) fn invalid(msg: impl Into<String>) -> tonic::Status {
    tonic::Status::invalid_argument(msg)
}
