//! `bucketfs csi`: run the Kubernetes CSI driver (crates/csi; docs/KUBERNETES.md).

use std::path::PathBuf;

use clap::{Args, ValueEnum};

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum CsiMode {
    /// Identity and Node services: the DaemonSet on every node.
    Node,
    /// Identity and Controller services: the provisioner's Deployment.
    Controller,
    /// All three in one process.
    All,
}

#[derive(Args, Clone, Debug)]
pub struct CsiArgs {
    /// The gRPC socket, unix:///PATH (Kubernetes' sidecars pass it as CSI_ENDPOINT).
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock", value_name = "unix:///PATH")]
    endpoint: String,
    /// This node's name, as Kubernetes knows it.
    #[arg(long, env = "KUBE_NODE_NAME", value_name = "NAME")]
    node_id: Option<String>,
    /// Which services to serve.
    #[arg(long, value_enum, default_value = "all")]
    mode: CsiMode,
    /// Where the node keeps its staged volumes' records, credential files (mode 0600) and
    /// mount logs; on the host, so that a restarted plugin finds its mounts again.
    #[arg(long, default_value = "/var/lib/bucketfs-csi", value_name = "DIR")]
    state_dir: PathBuf,
    /// Copy this binary to PATH at start (on the host, through a hostPath volume) and mount
    /// with that copy: with --mount-prefix, mounts run on the host, outside the container.
    #[arg(long, value_name = "PATH")]
    host_binary: Option<PathBuf>,
    /// A command to run each `bucketfs mount` through, as words separated by spaces, e.g.
    /// "nsenter --target 1 --mount --pid -- systemd-run --scope --collect --quiet --": each
    /// mount then lives in a host scope of its own and outlives the plugin's container.
    #[arg(long, value_name = "COMMAND", allow_hyphen_values = true)]
    mount_prefix: Option<String>,
    /// Log debug lines too.
    #[arg(short, long)]
    verbose: bool,
    #[command(flatten)]
    log: crate::logging::LogArgs,
}

pub fn run(args: CsiArgs, check_mount_args: bucketfs_csi::CheckMountArgs) -> Result<(), String> {
    crate::logging::init(if args.verbose { "debug" } else { "info" }, args.log.log_format, None);
    let node_id = match args.node_id {
        Some(n) => n,
        None => hostname()?,
    };
    let mut bucketfs = std::env::current_exe().map_err(|e| format!("cannot find the bucketfs binary: {e}"))?;
    if let Some(dst) = args.host_binary {
        install_copy(&bucketfs, &dst)?;
        bucketfs = dst;
    }
    let cfg = bucketfs_csi::Config {
        endpoint: args.endpoint,
        node_id,
        mode: match args.mode {
            CsiMode::Node => bucketfs_csi::Mode::Node,
            CsiMode::Controller => bucketfs_csi::Mode::Controller,
            CsiMode::All => bucketfs_csi::Mode::All,
        },
        state_dir: args.state_dir,
        bucketfs,
        mount_prefix: args.mount_prefix.map(|p| p.split_whitespace().map(String::from).collect()).unwrap_or_default(),
        check_mount_args,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let served = rt.block_on(bucketfs_csi::serve(cfg));
    // A statfs of a hung mount may still be waiting in the kernel on a blocking thread:
    // the plugin exits without it (a plain drop of the runtime would wait for it).
    rt.shutdown_background();
    served
}

fn hostname() -> Result<String, String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return Err("cannot read the host name: give --node-id".into());
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// Copy `src` to `dst` by a rename, so a mount running the old copy keeps its file.
fn install_copy(src: &std::path::Path, dst: &std::path::Path) -> Result<(), String> {
    let tmp = dst.with_extension("new");
    if let Some(dir) = dst.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    std::fs::copy(src, &tmp)
        .and_then(|_| std::fs::rename(&tmp, dst))
        .map_err(|e| format!("cannot install {} as {}: {e}", src.display(), dst.display()))?;
    tracing::info!(path = %dst.display(), "installed this binary for the mounts");
    Ok(())
}
