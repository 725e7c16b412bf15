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
    /// Log debug lines too.
    #[arg(short, long)]
    verbose: bool,
    #[command(flatten)]
    log: crate::logging::LogArgs,
}

pub fn run(args: CsiArgs) -> Result<(), String> {
    crate::logging::init(if args.verbose { "debug" } else { "info" }, args.log.log_format, None);
    let node_id = match args.node_id {
        Some(n) => n,
        None => hostname()?,
    };
    let bucketfs = std::env::current_exe().map_err(|e| format!("cannot find the bucketfs binary: {e}"))?;
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
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(bucketfs_csi::serve(cfg))
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
