//! `bucketfs`: mount a bucket as a local directory, or copy to and from one fast.
//!
//! `main` parses arguments and turns every failure into one line on stderr and exit code 1
//! (`cp`'s failures into their own codes, see [`cp::CpError::exit_code`]).
//! [`mount`] does the pre-flight checks, the daemonizing and the session; [`unmount`] ends one;
//! [`status`] asks a running mount over its [`control`] socket. Called as
//! `mount.fuse.bucketfs` (a symlink), the binary is mount(8)'s helper ([`fstab`]).
//! [`metrics_http`] serves `--metrics-addr`; [`notify`] speaks systemd's readiness protocol.
//! [`auth`] runs the headless Google Drive consent flow.
//! [`cp`] copies files and objects with parallel ranged reads and parts, verified end to end.
//! [`manual`] prints the man page and shell completions generated from these definitions.

/// `eprintln!` that never panics: a closed stderr (`bucketfs cp ... 2>&1 | head -1`) must
/// not turn a command's exit status into a panic's 101.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod auth;
mod checks;
mod control;
mod cp;
mod csi;
mod fstab;
mod logging;
mod manual;
mod metrics_http;
mod mount;
mod mount_opts;
mod notify;
mod observe;
mod paths;
mod status;
mod store_args;
mod unmount;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "bucketfs", version, about = "Use a cloud bucket as a local directory")]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process
enum Command {
    /// Mount a bucket (or the embedded default store) on a directory.
    // A flag given twice (directly and in `-o`, or an fstab line and the command line): the
    // last wins, as mount(8)'s options do; it was "cannot be used multiple times".
    #[command(args_override_self = true)]
    Mount(MountArgs),
    /// Unmount a bucketfs mount, waiting for its process to finish.
    Unmount {
        /// The mount point.
        mountpoint: PathBuf,
        /// How long to wait for the mount's process to finish what was closed (its
        /// uploads) after the kernel lets go, in seconds; 0: as long as it takes. A mount
        /// point already unmounted whose process still works is waited for too.
        #[arg(long, value_name = "SECONDS", default_value_t = 60)]
        wait: u64,
        /// Succeed when nothing is mounted there and no mount's process is finishing.
        #[arg(long)]
        missing_ok: bool,
    },
    /// Copy files to and from a bucket: parallel, verified end to end (see --help).
    Cp(cp::CpArgs),
    /// Run the Kubernetes CSI driver (docs/KUBERNETES.md).
    Csi(csi::CsiArgs),
    /// Authorize access to a store that needs a consent step (Google Drive).
    #[command(subcommand)]
    Auth(auth::AuthCommand),
    /// Wait until everything closed on a mount so far is in the bucket (write-back mode; on
    /// other mounts, files whose upload failed at their close are tried again now); exit 1
    /// naming each file that could not be uploaded and why.
    Sync {
        /// The mount point.
        mountpoint: PathBuf,
        /// Give up after this many seconds (exit 1, naming what is still pending; the mount
        /// keeps uploading). Default: wait as long as it takes, saying every 10 s what for.
        #[arg(long, value_name = "SECS")]
        timeout: Option<u64>,
    },
    /// Show what a mount is doing: pending uploads, cache use, store requests since mount.
    Status {
        /// The mount point.
        mountpoint: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script on stdout, e.g.
    /// `bucketfs completions bash > /etc/bash_completion.d/bucketfs`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) on stdout, e.g. `bucketfs man > /usr/local/share/man/man1/bucketfs.1`,
    /// or one page per subcommand with --dir (bucketfs.1, bucketfs-mount.1, bucketfs-cp.1...).
    Man {
        /// Print only this subcommand's page (bucketfs-SUBCOMMAND.1), e.g. `bucketfs man cp`.
        #[arg(value_name = "SUBCOMMAND", conflicts_with = "dir")]
        subcommand: Option<String>,
        /// Write bucketfs.1 and one bucketfs-SUBCOMMAND.1 per subcommand into DIR (created if
        /// missing), e.g. --dir /usr/local/share/man/man1.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Args, Clone, Debug)]
pub struct MountArgs {
    /// s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX], gdrive://[FOLDER-ID], file:///PATH or mem://. Without it, the
    /// embedded default store under the user's data directory is mounted.
    #[arg(value_name = "URL")]
    first: String,
    /// The directory to mount on.
    #[arg(value_name = "MOUNTPOINT")]
    second: Option<PathBuf>,
    #[command(flatten)]
    store: store_args::StoreArgs,
    #[command(flatten)]
    access: mount_opts::AccessArgs,
    #[command(flatten)]
    log: logging::LogArgs,
    /// Stay attached to the terminal; SIGINT or SIGTERM unmounts (so does SIGHUP, unless
    /// ignored with `nohup`, in the foreground and in the background alike).
    #[arg(short, long)]
    foreground: bool,
    /// Mount read-only: writes fail with EROFS.
    #[arg(long)]
    read_only: bool,
    /// Let other users access the mount (FUSE's allow_other). Off unless asked for.
    #[arg(long)]
    allow_other: bool,
    /// Seconds that listings and attributes are trusted before asking the store again
    /// [default: 1, or 60 with --write-back, where this mount is the bucket's main writer].
    #[arg(long, value_name = "SECS", value_parser = parse_ttl)]
    metadata_ttl: Option<f64>,
    /// Largest sequential prefetch window per open file, in MiB.
    #[arg(long, default_value_t = 64)]
    max_prefetch_mib: u64,
    /// Prefetched bytes held (in flight or not yet read) across all open files, in MiB.
    #[arg(long, default_value_t = 64)]
    prefetch_budget_mib: u64,
    /// Kernel readahead for the mount, in KiB (its read_ahead_kb; the kernel's default is
    /// 128). Sequential reads reach bucketfs in requests of this size, up to 1024. Needs
    /// root; others keep the default. 0 leaves it alone.
    #[arg(long, default_value_t = 1024)]
    read_ahead_kib: u32,
    /// Memory block cache, in MiB.
    #[arg(long, default_value_t = 32)]
    memory_cache_mib: u64,
    /// On-disk block cache (survives remounts), in MiB; 0 turns it off.
    #[arg(long, default_value_t = 2048)]
    disk_cache_mib: u64,
    /// Directory of the on-disk block cache (default: the user's cache directory).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Directory where files being written are staged (default: the user's cache directory).
    #[arg(long)]
    staging_dir: Option<PathBuf>,
    /// Upload part size in MiB (S3 needs at least 5).
    #[arg(long, default_value_t = 8)]
    part_size_mib: usize,
    /// Parts uploaded in parallel per file.
    #[arg(long, default_value_t = 4)]
    upload_concurrency: usize,
    /// Memory for upload parts across all files, in MiB; a close waits for room when it is in use.
    #[arg(long, default_value_t = 80)]
    upload_budget_mib: u64,
    /// Write-back: `close` returns once the file is staged on local disk and uploads run in
    /// the background (a crash loses nothing closed: the next mount uploads it). `bucketfs
    /// sync DIR` waits for them. Default: every close waits for its upload.
    #[arg(long)]
    write_back: bool,
    /// Write-back: MiB of closed files waiting for upload above which `close` waits for room
    /// (at most 2 minutes without an upload done, while the staging disk keeps as much free).
    #[arg(long, default_value_t = 1024, value_name = "MIB")]
    write_back_max_mib: u64,
    /// Write-back: seconds a closed file waits before its upload (a rewrite within it is
    /// uploaded once; a file deleted within it is never uploaded). 5, as rclone's
    /// `--vfs-write-back`.
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    write_back_delay: f64,
    /// Write-back: files uploaded in parallel.
    #[arg(long, default_value_t = 8)]
    write_back_parallel: usize,
    /// A directory rename moves every key below it; past this many keys it fails with EXDEV.
    #[arg(long, default_value_t = 10_000)]
    max_rename_keys: usize,
    /// Listing a directory also asks for one page of the recursive listing below it; if the
    /// whole subtree holds at most this many keys, every directory in it is listed at once
    /// (a `find` of a small tree costs one round trip, not one per directory). 0 turns it off.
    #[arg(long, default_value_t = 999)]
    list_ahead_keys: usize,
    /// Names kept in memory: inodes and cached directory listings, about 1 KB each. Past
    /// this many, the cached listings of directories not in use are dropped, least recently
    /// listed first, with the names nothing else holds (the kernel's, open, staged and
    /// chmod'ed ones stay); they are listed again when next needed. 0: no bound.
    #[arg(long, default_value_t = 250_000, value_name = "N")]
    max_cached_entries: usize,
    /// Hear of other clients' changes at once from the store's change events, and trust
    /// listings past --metadata-ttl while they flow (the TTL is the fallback when they
    /// stop). SOURCE: minio (MinIO's bucket notification stream; needs --endpoint), or
    /// sqs://QUEUE-URL (S3 event notifications in an SQS queue of this mount's own; direct,
    /// via SNS or EventBridge; https implied, sqs://http://... for a local server), or
    /// pubsub://projects/P/subscriptions/S (Cloud Storage notifications in a Pub/Sub
    /// subscription of this mount's own; PUBSUB_EMULATOR_HOST for an emulator).
    #[arg(long, value_name = "SOURCE")]
    notify: Option<String>,
    /// Load the whole tree at mount (one recursive listing) so the first `find`/`ls -R` is
    /// served from memory; refreshed in the background every --preload-refresh seconds.
    #[arg(long)]
    preload_tree: bool,
    /// Refuse to preload a bucket with more keys than this (memory: ~200 bytes a key).
    #[arg(long, default_value_t = 1_000_000)]
    preload_max_entries: usize,
    /// Seconds between background refreshes of a preloaded tree.
    #[arg(long, default_value_t = 60)]
    preload_refresh: u64,
    /// FUSE dispatch threads (1 to 256; each holds a descriptor of the FUSE device).
    #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256))]
    fuse_threads: usize,
    /// FUSE passthrough: the kernel reads and writes staged files, and reads files held
    /// whole in the disk cache, by itself, with no round trip through bucketfs (Linux 6.9
    /// or later, as root; otherwise off, and the log says why). See docs/SEMANTICS.md.
    #[arg(long, value_name = "on|off", default_value = "on", action = clap::ArgAction::Set,
          hide_possible_values = true, value_parser = clap::builder::BoolishValueParser::new())]
    passthrough: bool,
    /// Seconds to wait for the store to answer at mount before giving up (1 to 3600).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=3600))]
    connect_timeout: u64,
    /// Serve Prometheus metrics at http://ADDR/metrics (for example 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<String>,
    /// Write logs here (the background process logs to a file under the runtime dir otherwise).
    #[arg(long)]
    log_file: Option<PathBuf>,
    /// More detail in the log (-v debug, -vv trace).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

impl MountArgs {
    /// (URL, mount point): one positional argument means the embedded default store.
    fn url_and_mountpoint(&self) -> (Option<String>, PathBuf) {
        match &self.second {
            Some(mp) => (Some(self.first.clone()), mp.clone()),
            None => (None, PathBuf::from(&self.first)),
        }
    }
}

/// glibc gives each thread that allocates its own arena and keeps what is freed there; with
/// tokio workers and blocking threads (disk cache, staging) passing buffers between them,
/// that retained memory was most of the peak RSS (reading 1 GiB: 272 MiB with the disk
/// cache, 152 MiB with two arenas). Two arenas. Read blocks come from core's bounded pool
/// of reused buffers (block_pool.rs), not from here.
///
/// The HTTP client's receive buffers (up to about 400 KiB each) are allocated and freed
/// for every few chunks. Served by mmap, or trimmed back after each free, every reuse costs
/// fresh page faults, which are dear in a VM (`cp` of 1 GiB: 1.0-1.15 s of system CPU).
/// So they stay in the arenas (mmap from 1 MiB), and up to 32 MiB free at an arena's top
/// stays mapped (system CPU 0.7-0.85 s; peak RSS 3-4 MiB higher).
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1024 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 32 * 1024 * 1024);
    }
}

/// clap's error text on one line: its message, the names it lists below it (missing
/// arguments, possible values) and its tips, without the usage block.
fn one_line(text: &str) -> String {
    let keep = |l: &&str| !l.trim().is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more information");
    let parts: Vec<&str> = text.lines().filter(keep).map(|l| l.trim().trim_start_matches("error: ")).collect();
    parts.join(" ")
}

/// Library errors capture no backtrace, whatever `RUST_BACKTRACE` says (a panic still
/// prints one): the store library's errors take one each, and the first symbolized loaded
/// the binary's debug info, 227 MB of RSS at the first store timeout (tester F).
fn no_library_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // Before any other thread exists (nothing reads the environment concurrently).
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
}

/// The `-o` option behind clap's unknown-argument error `e`, if it came from one.
fn unknown_option(e: &clap::Error, given: &[OsString]) -> Option<String> {
    let flag = match e.get(clap::error::ContextKind::InvalidArg) {
        Some(clap::error::ContextValue::String(s)) => s.clone(),
        _ => return None,
    };
    mount_opts::option_for_flag(given, &flag)
}

/// What a parse error says to the user, in one line.
fn usage_error(e: &clap::Error, given: &[OsString]) -> String {
    match unknown_option(e, given).filter(|_| e.kind() == clap::error::ErrorKind::UnknownArgument) {
        Some(opt) => format!("mount option {opt:?} is not one bucketfs knows (see bucketfs mount --help: -o takes ro, rw, allow_other, uid=N, gid=N, umask=022, and any flag as key=value)"),
        None => format!("{} (see --help)", one_line(&e.to_string())),
    }
}

/// Whether `bucketfs mount URL PATH ARGS...` would parse, and if not what is wrong: the
/// CSI node checks a volume's `mountOptions` so that a bad one is the caller's error
/// (`INVALID_ARGUMENT`), found before any credential file is written.
fn check_mount_args(url: &str, path: &std::path::Path, args: &[String]) -> Result<(), String> {
    let given: Vec<OsString> = ["bucketfs", "mount", url]
        .into_iter()
        .map(OsString::from)
        .chain([path.as_os_str().to_owned()])
        .chain(args.iter().map(OsString::from))
        .collect();
    let argv = mount_opts::expand_argv(given.clone())?;
    Cli::try_parse_from(&argv).map(|_| ()).map_err(|e| usage_error(&e, &given))
}

fn main() -> ExitCode {
    tune_malloc();
    no_library_backtraces();
    let mut argv: Vec<OsString> = std::env::args_os().collect();
    if argv.first().is_some_and(|a| fstab::is_helper(&a.to_string_lossy())) {
        let lossy: Vec<String> = argv.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        match fstab::helper_args(&lossy) {
            Ok(Some(translated)) => argv = translated.into_iter().map(OsString::from).collect(),
            Ok(None) => return ExitCode::SUCCESS,
            Err(msg) => {
                say!("bucketfs: {msg}");
                return ExitCode::FAILURE;
            }
        }
    }
    let given = argv.clone();
    argv = match mount_opts::expand_argv(argv) {
        Ok(a) => a,
        Err(msg) => {
            say!("bucketfs: {msg}");
            return ExitCode::FAILURE;
        }
    };
    // A bad argument is one line and exit 1 (clap's own exit 2 is `cp`'s "skipped").
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind as K;
            let _ = match e.kind() {
                K::DisplayHelp | K::DisplayVersion => {
                    return e.print().map_or(ExitCode::FAILURE, |()| ExitCode::SUCCESS)
                }
                K::DisplayHelpOnMissingArgumentOrSubcommand => e.print(),
                _ => {
                    say!("bucketfs: {}", usage_error(&e, &given));
                    Ok(())
                }
            };
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.cmd {
        Command::Mount(args) => mount::run(args, &argv[1..]),
        Command::Unmount { mountpoint, wait, missing_ok } => {
            let wait = (wait > 0).then(|| std::time::Duration::from_secs(wait));
            unmount::run(&mountpoint, &unmount::Opts { wait, missing_ok })
        }
        Command::Cp(args) => {
            return cp::run(args).map_or_else(
                |e| {
                    say!("bucketfs: {e}");
                    ExitCode::from(e.exit_code())
                },
                |()| ExitCode::SUCCESS,
            )
        }
        Command::Auth(cmd) => auth::run(cmd),
        Command::Csi(args) => csi::run(args, check_mount_args),
        Command::Status { mountpoint, json } => status::run(&mountpoint, json),
        Command::Sync { mountpoint, timeout } => status::sync(&mountpoint, timeout.map(std::time::Duration::from_secs)),
        Command::Completions { shell } => manual::print(&manual::completions(shell, Cli::command())),
        Command::Man { subcommand: None, dir: None } => manual::man(Cli::command()).and_then(|p| manual::print(&p)),
        Command::Man { subcommand: Some(sub), .. } => {
            manual::subcommand_page(Cli::command(), &sub).and_then(|p| manual::print(&p))
        }
        Command::Man { dir: Some(dir), .. } => manual::write_pages(Cli::command(), &dir).map(|written| {
            for p in written {
                println!("{}", p.display());
            }
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            say!("bucketfs: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// `--metadata-ttl`: seconds, from 0 to a year (`inf` or `1e30` made the mount panic).
fn parse_ttl(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=365.0 * 86400.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds from 0 to 31536000 (a year)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_flag_given_twice_takes_the_last() {
        // As `bucketfs mount --metadata-ttl 5 --read-only -o metadata_ttl=7,ro` expands.
        let argv = [
            "bucketfs",
            "mount",
            "mem://",
            "/m",
            "--metadata-ttl",
            "5",
            "--read-only",
            "--metadata-ttl",
            "7",
            "--read-only",
        ];
        let Command::Mount(args) = Cli::try_parse_from(argv).expect("parses").cmd else { panic!("not mount") };
        assert_eq!((args.metadata_ttl, args.read_only), (Some(7.0), true));
    }
}
