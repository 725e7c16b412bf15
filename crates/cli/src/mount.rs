//! `bucketfs mount`: check, connect, mount, and (unless `--foreground`) daemonize.
//!
//! Daemonizing: the command re-executes itself with `--foreground` in a new session, its
//! stdout a pipe. The child does every check, mounts, and then writes `ready` (or
//! `error: ...`) on that pipe; the parent relays it and exits 0 only once the mount is
//! ready. No fork after threads exist, so the runtime is never copied mid-flight.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use bucketfs_core::{Fs, FsConfig, WriteBackConfig};
use bucketfs_fuse::MountSpec;
use bucketfs_store::location::{self, Location};
use bucketfs_store::metered::{MeteredStore, Metrics};
use bucketfs_store::{Store, StoreErrorKind, WriteOptions};

use crate::observe::Observed;
use crate::{checks, control, metrics_http, notify, paths, MountArgs};

/// Default `--metadata-ttl` of a `--write-back` mount: it is its bucket's main writer (as
/// with rclone's full cache, whose directory cache lasts 5 minutes), so what it made and
/// listed is trusted for a minute; changes from elsewhere show within that.
const WRITE_BACK_TTL: f64 = 60.0;

/// How long a mount waits for an earlier process to finish with its staging directory
/// (see [`paths::lock_staging`]); the command's wait for readiness includes it.
const STAGING_WAIT: Duration = Duration::from_secs(20);

/// Set in the child's environment: report readiness on stdout, then detach it.
const CHILD_ENV: &str = "BUCKETFS_DAEMON_CHILD";

/// `argv` are the arguments after the program name, re-used for the background process.
pub fn run(mut args: MountArgs, argv: &[std::ffi::OsString]) -> Result<(), String> {
    let (url, mp) = args.url_and_mountpoint();
    checks::positionals(url.as_deref(), &mp)?;
    args.access.check(args.allow_other)?;
    paths::ensure_runtime_dir()?;
    checks::fuse_device()?;
    let mp = checks::mountpoint(&mp)?;
    let location = match &url {
        Some(u) => Location::parse(u).map_err(|e| e.message)?,
        None => {
            let dir = paths::default_store();
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create the default store {}: {e}", dir.display()))?;
            Location::File { path: dir }
        }
    };
    checks::outside_mountpoint(&mp, "the staging directory", args.staging_dir.as_deref())?;
    // One name for it, whatever path leads there: the journals beside it are found by it.
    args.staging_dir = args.staging_dir.as_deref().map(paths::resolved);
    checks::outside_mountpoint(&mp, "the cache directory", args.cache_dir.as_deref())?;
    if args.disk_cache_mib > 0 {
        checks::cache_dir_usable(args.cache_dir.as_deref())?;
    }
    if let Location::File { path } = &location {
        checks::outside_mountpoint(&mp, "the local folder", Some(path))?;
        checks::mountpoint_outside_folder(&mp, path)?;
    }
    if matches!(location, Location::Gdrive { .. }) {
        let scope = bucketfs_store::gdrive::auth::effective_scope(args.store.gdrive_scope).map_err(|e| e.message)?;
        if scope == bucketfs_store::gdrive::auth::Scope::ReadOnly && !args.read_only {
            // Drive would refuse every change with 403; the kernel refuses them sooner, with EROFS.
            say!(
                "bucketfs: Google Drive access is read-only (scope drive.readonly): mounting read-only, so \
                 writes fail with \"Read-only file system\". For writes, run `bucketfs auth gdrive \
                 --gdrive-scope full`."
            );
            args.read_only = true;
        }
    }
    if args.foreground {
        let is_child = std::env::var_os(CHILD_ENV).is_some();
        return serve(&args, &location, &mp, is_child);
    }
    spawn_daemon(&args, argv, &mp)
}

/// Start the background process and wait until it says the mount is ready.
fn spawn_daemon(args: &MountArgs, argv: &[std::ffi::OsString], mp: &Path) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the bucketfs executable: {e}"))?;
    let log = args.log_file.clone().unwrap_or_else(|| paths::log_file(mp));
    let log_file = match &args.log_file {
        Some(p) => crate::logging::open_file(p),
        None => paths::open_log(&log),
    }
    .map_err(|e| format!("cannot open log file {}: {e}", log.display()))?;
    let mut cmd = Command::new(exe);
    cmd.args(argv).arg("--foreground").env(CHILD_ENV, "1");
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log_file);
    // SAFETY: setsid is async-signal-safe; it detaches the child from our terminal.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot start the mount process: {e}"))?;
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            let _ = lines.read_line(&mut line);
            let last = !line.starts_with(WORKING);
            let _ = tx.send(line);
            if last {
                break;
            }
        }
    });
    // The child bounds its own store checks by --connect-timeout and its wait for the
    // staging directory by STAGING_WAIT; allow for those and more. Work that takes as long
    // as it must (uploading files an earlier mount left staged) says it is alive every
    // `HEARTBEAT`, and each such line starts the wait again.
    let wait = Duration::from_secs(args.connect_timeout + 30) + STAGING_WAIT;
    let mut said = false;
    let first = loop {
        match rx.recv_timeout(wait) {
            Ok(line) if line.starts_with(WORKING) => {
                // An empty one only asks whether this process still waits (`parent_waits`).
                let what = line[WORKING.len()..].trim();
                if !what.is_empty() && !std::mem::replace(&mut said, true) {
                    say!("bucketfs mount: {what}; waiting");
                }
            }
            other => break other,
        }
    };
    match first {
        Ok(line) if line.trim() == "ready" => Ok(()),
        Ok(line) if line.starts_with("error: ") => {
            // The child exits right after reporting; reap it so nothing outlives the command.
            let _ = child.wait();
            Err(line.trim_start_matches("error: ").trim().to_string())
        }
        Ok(_) => {
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            Err(format!("the mount process exited before the mount was ready ({status}); see {}", log.display()))
        }
        Err(_) => {
            let _ = child.kill();
            Err(format!("the mount was not ready after {}s; see {}", wait.as_secs(), log.display()))
        }
    }
}

fn init_logging(args: &MountArgs) {
    // The FUSE library warns of each request it does not implement (`copy_file_range`: the
    // caller falls back to read and write) and of its own second try to unmount a mount
    // already gone (EINVAL at every clean unmount): noise an operator took for failures. So
    // is its error for a reply the kernel no longer takes (after a lazy unmount, tester E).
    let level = match args.verbose {
        0 => {
            "warn,fuser=error,fuser::reply=off,bucketfs=info,bucketfs_core=info,bucketfs_store=info,bucketfs_fuse=info"
        }
        1 => "info,bucketfs=debug,bucketfs_core=debug,bucketfs_store=debug,bucketfs_fuse=debug",
        _ => "debug,bucketfs=trace,bucketfs_core=trace,bucketfs_store=trace,bucketfs_fuse=trace",
    };
    crate::logging::init(level, args.log.log_format, args.log_file.as_deref());
}

/// The line a mount's child sends its waiting parent while it works before it is ready.
const WORKING: &str = "working: ";
/// How often the child says so.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// Tells the waiting parent every [`HEARTBEAT`] that the child is still at `what`, until
/// dropped: a recovery that uploads gigabytes was killed by the parent's wait (70 s).
struct Heartbeat {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeat {
    fn start(what: &'static str) -> Self {
        let (stop, stopped) = mpsc::channel::<()>();
        // Nothing is said of work that ends within the first beat (most mounts).
        let thread = std::thread::spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(HEARTBEAT) {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{WORKING}{what}");
                let _ = out.flush();
            }
        });
        Heartbeat { stop: Some(stop), thread: Some(thread) }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether the `bucketfs mount` command that started this process still waits for it:
/// one line it ignores, which fails (`EPIPE`) once nothing reads the pipe.
fn parent_waits() -> bool {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{WORKING}").and_then(|()| out.flush()).is_ok()
}

/// Lock the mount point (an `flock` on the directory under it), then check that nothing
/// is mounted there: two mounts started at once both passed the check made before their
/// store answered, and stacked (tester E: 9 of 9). Not over autofs (systemd's automount),
/// whose directory an open would wait on for this very mount.
fn hold_mountpoint(mp: &Path) -> Result<Option<std::fs::File>, String> {
    use std::os::fd::AsRawFd;
    if checks::mounted_fstype(mp).as_deref() == Some("autofs") {
        return Ok(None);
    }
    let dir = std::fs::File::open(mp).map_err(|e| format!("cannot open mount point {}: {e}", mp.display()))?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(format!(
            "another bucketfs mount is being started on {}; wait for it to finish, or unmount it (bucketfs unmount {})",
            mp.display(),
            mp.display()
        ));
    }
    checks::mountpoint(mp)?;
    Ok(Some(dir))
}

/// Tell the waiting parent (if any) how the mount went, then detach stdout.
fn report(is_child: bool, result: &Result<(), String>) {
    if !is_child {
        return;
    }
    let mut out = std::io::stdout();
    let _ = match result {
        Ok(()) => writeln!(out, "ready"),
        Err(e) => writeln!(out, "error: {e}"),
    };
    let _ = out.flush();
    if let Ok(null) = std::fs::File::open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: replaces fd 1 with /dev/null so the parent's pipe sees EOF.
        unsafe { libc::dup2(null.as_raw_fd(), 1) };
    }
}

/// Let the process open as many files as the hard limit allows: staged files waiting for
/// their upload hold descriptors (a `git clone` or `tar -x` with `--write-back` closes
/// thousands of files within the delay), and the usual soft limit of 1,024 made creates
/// fail with EIO from about the 500th. Go programs (gcsfuse, rclone) get this from their
/// runtime. Returns the limit in effect (unlimited if it cannot be read).
fn raise_open_files_limit() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit write and read only the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return u64::MAX;
        }
        if lim.rlim_cur >= lim.rlim_max {
            return lim.rlim_cur;
        }
        let was = lim.rlim_cur;
        lim.rlim_cur = lim.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
            return was;
        }
        tracing::debug!(from = was, to = lim.rlim_max, "open files limit raised");
        lim.rlim_cur
    }
}

/// Explain a failed store check in words a user can act on.
fn explain(location: &Location, args: &MountArgs, e: bucketfs_store::StoreError) -> String {
    let url = location.to_url();
    let endpoint = args.store.endpoint.clone().or_else(|| std::env::var("AWS_ENDPOINT_URL").ok()).unwrap_or_default();
    let endpoint = bucketfs_store::redact_urls(&endpoint);
    let at = if endpoint.is_empty() { String::new() } else { format!(" at {endpoint}") };
    if matches!(location, Location::Gdrive { .. }) {
        // The Drive client's messages already name the folder, the credentials or the server.
        return format!("cannot use {url}{at}: {}", e.message);
    }
    match e.kind {
        StoreErrorKind::NotFound => format!("bucket {url} not found{at}: check the name or create the bucket"),
        StoreErrorKind::PermissionDenied if e.message.contains("credential") => match location {
            Location::Gcs { .. } => format!(
                "no Google Cloud credentials found for {url}: set GOOGLE_APPLICATION_CREDENTIALS to a service account key file or run `gcloud auth application-default login`; --anonymous for a public bucket or an emulator"
            ),
            _ => format!(
                "no AWS credentials found for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE / --profile"
            ),
        },
        StoreErrorKind::PermissionDenied => format!(
            "access to {url}{at} denied: check credentials (S3: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or --profile; GCS: GOOGLE_APPLICATION_CREDENTIALS or --anonymous)"
        ),
        StoreErrorKind::Unavailable => format!("cannot reach the store for {url}{at}: check the endpoint and network ({})", e.message),
        _ => format!("cannot use {url}{at}: {}", e.message),
    }
}

/// Descriptors a mount holds besides one per FUSE thread: 14 at rest (the log, the
/// runtime's, the store's sockets, the staging and cache directories), and room for files
/// open for writing. Below that, the mount came up and its FUSE session died at once
/// ("Too many open files") after `mount` had reported success (found by a tester).
const OPEN_FILES_RESERVE: u64 = 64;

/// Whether `threads` FUSE threads fit under an open-files limit of `limit`.
fn check_open_files(threads: usize, limit: u64) -> Result<(), String> {
    let need = threads as u64 + OPEN_FILES_RESERVE;
    if limit < need {
        return Err(format!(
            "--fuse-threads {threads} needs at least {need} open files (one per thread and {OPEN_FILES_RESERVE} more), \
             but this process may open only {limit} (`ulimit -n`): lower --fuse-threads or raise the limit"
        ));
    }
    Ok(())
}

fn serve(args: &MountArgs, location: &Location, mp: &Path, is_child: bool) -> Result<(), String> {
    init_logging(args);
    let rt = check_open_files(args.fuse_threads, raise_open_files_limit()).and_then(|()| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("bucketfs-io")
            .build()
            .map_err(|e| format!("cannot start the runtime: {e}"))
    });
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            report(is_child, &Err(e.clone()));
            return Err(e);
        }
    };
    let result = prepare(args, location, &rt);
    let store = match result {
        Ok(s) => s,
        Err(e) => {
            report(is_child, &Err(e.clone()));
            return Err(e);
        }
    };
    // Counted from here: the mount-time check above is not part of "since mount".
    let metrics = Metrics::new();
    let store: Arc<dyn Store> = Arc::new(MeteredStore::new(store, metrics.clone()));
    let (uid, gid) = args.access.owner();
    let mut cfg = FsConfig {
        uid,
        gid,
        metadata_ttl: Duration::from_secs_f64(
            args.metadata_ttl.unwrap_or(if args.write_back { WRITE_BACK_TTL } else { 1.0 }).max(0.0),
        ),
        max_prefetch: args.max_prefetch_mib.max(1) * 1024 * 1024,
        prefetch_budget: args.prefetch_budget_mib * 1024 * 1024,
        cache_bytes: cfg_memory_cache(args),
        disk_cache: (args.disk_cache_mib > 0).then(|| {
            let id = format!("{} {}", location.to_url(), args.store.endpoint.clone().unwrap_or_default());
            (args.cache_dir.clone().unwrap_or_else(|| paths::block_cache_dir(&id)), args.disk_cache_mib * 1024 * 1024)
        }),
        staging_dir: args.staging_dir.clone().unwrap_or_else(|| paths::staging_dir(mp)),
        write: WriteOptions {
            // S3 rejects parts under 5 MiB (except the last).
            part_size: args.part_size_mib.max(5) * 1024 * 1024,
            concurrency: args.upload_concurrency.max(1),
            put: Default::default(),
        },
        upload_budget: args.upload_budget_mib.max(1) * 1024 * 1024,
        max_rename_keys: args.max_rename_keys,
        max_cached_entries: args.max_cached_entries,
        list_ahead_keys: args.list_ahead_keys,
        write_back: args.write_back.then(|| WriteBackConfig {
            delay: Duration::from_secs_f64(args.write_back_delay.clamp(0.0, 3600.0)),
            max_bytes: args.write_back_max_mib.max(1) * 1024 * 1024,
            parallel: args.write_back_parallel.max(1),
            ..WriteBackConfig::default() // max_files: from the limit raised in `serve`
        }),
        read_only: args.read_only,
        ..FsConfig::default()
    };
    (cfg.file_mode, cfg.dir_mode) = args.access.modes();
    if let Some((dir, _)) = &cfg.disk_cache {
        // Private before the first cached block is written (core creates it as it is).
        if let Err(e) = paths::create_private_dirs(dir) {
            tracing::warn!(dir = %dir.display(), "cannot create the cache directory private: {e}");
        }
    }
    let staged_here = paths::create_private_dirs(&cfg.staging_dir)
        .map_err(|e| format!("cannot create staging directory {}: {e}", cfg.staging_dir.display()))
        .and_then(|()| paths::lock_staging(&cfg.staging_dir, STAGING_WAIT));
    // The store the staging directory belongs to: bucket and prefix (any endpoint: one
    // store may be reached through several addresses), a local folder by its real path.
    let store_id = match &location {
        Location::File { path } => format!("file://{}", std::fs::canonicalize(path).unwrap_or(path.clone()).display()),
        _ => location.to_url(),
    };
    let staged_here = staged_here
        .and_then(|lock| paths::claim_staging(&cfg.staging_dir, &store_id).map(|()| lock))
        .and_then(|lock| match args.read_only {
            true => Ok(lock),
            false => paths::check_writable(&cfg.staging_dir).map(|()| lock),
        });
    match staged_here {
        // Released only by the process's exit: work on staged files may outlive `serve`
        // (the runtime's last tasks, the recycling thread).
        Ok(lock) => std::mem::forget(lock),
        Err(e) => {
            report(is_child, &Err(e.clone()));
            return Err(e);
        }
    }
    // Temporary objects in the bucket carry this mount point's tag (see recover_staged).
    bucketfs_store::gcs::compose::set_parts_owner(&bucketfs_core::recovery::parts_owner(&cfg.staging_dir));
    let staging_dir = cfg.staging_dir.clone();
    let fs = Fs::new(store, cfg);
    // Staged data an earlier mount of this mount point could not upload (a crash, or a
    // store that was down at unmount) goes up before anything else; not by a read-only
    // mount, which changes nothing in the bucket (a read-write mount sends it later).
    if args.read_only && paths::holds_pending(&staging_dir) {
        tracing::warn!(
            staging = %staging_dir.display(),
            "an earlier mount left changes pending here; a read-only mount does not send them, and shows the bucket as it is: mount read-write to send them"
        );
    }
    let (recovered, still_failing) = match args.read_only {
        true => Default::default(),
        false => {
            let _alive = is_child.then(|| Heartbeat::start("uploading files an earlier mount left staged"));
            rt.block_on(fs.recover_staged())
        }
    };
    if !recovered.is_empty() {
        tracing::warn!(files = ?recovered, "uploaded data staged by an earlier mount");
    }
    if !still_failing.is_empty() {
        // Serving now would show the bucket's older objects, and the next mount would upload
        // these over whatever was written meanwhile: refused, nothing lost.
        let mut keys = still_failing.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        if still_failing.len() > 5 {
            keys.push_str(&format!(" and {} more", still_failing.len() - 5));
        }
        let e = format!(
            "{} file(s) an earlier mount left staged in {} cannot be uploaded yet: {keys}. \
             Nothing is lost; mount again once the store takes them (or move those files, named by their .key sidecars, out of that directory to give them up)",
            still_failing.len(),
            staging_dir.display()
        );
        report(is_child, &Err(e.clone()));
        return Err(e);
    }
    // A directory or file move an earlier mount began and this one could not finish: both
    // names are in the bucket. Serving would show both, and a later replay could copy the
    // old object over a file written meanwhile: refused too, until the store takes it.
    let moves = if args.read_only { Vec::new() } else { bucketfs_core::moves_left(&staging_dir) };
    if let Some((from, to, entry)) = moves.first() {
        let e = format!(
            "{} rename(s) an earlier mount began cannot be finished in the bucket yet (the first: {from} to {to}; \
             the log says why). Nothing is lost; mount again once the store takes it (or remove its journal entry \
             {} to give it up: both names then stay in the bucket)",
            moves.len(),
            entry.display()
        );
        report(is_child, &Err(e.clone()));
        return Err(e);
    }
    // What an earlier mount left pending is done now: its note must not outlive it (an
    // unmount after this mount crashed reported those changes as still pending).
    let _ = std::fs::remove_file(paths::pending_file(mp));
    let notify = match args.notify.as_deref().map(with_host).transpose() {
        Ok(n) => n,
        Err(e) => {
            report(is_child, &Err(e.clone()));
            return Err(e);
        }
    };
    {
        let _rt = rt.enter();
        fs.start_write_back(); // after recovery: nothing of this mount is queued before it
        if let Some(src) = &notify {
            match event_feed(src, args, location) {
                Ok(feed) => fs.follow_events(feed),
                Err(e) => {
                    report(is_child, &Err(e.clone()));
                    return Err(e);
                }
            }
        }
    }
    if args.preload_tree {
        start_preload(args, &fs, &rt);
    }
    let observed = Arc::new(Observed {
        fs: fs.clone(),
        metrics,
        started: Instant::now(),
        mountpoint: mp.display().to_string(),
        store: location.to_url(),
        endpoint: args.store.endpoint.as_deref().map(bucketfs_store::redact_urls),
        read_only: args.read_only,
        memory_cache_limit: cfg_memory_cache(args),
        disk_cache_limit: args.disk_cache_mib * 1024 * 1024,
        max_cached_entries: args.max_cached_entries as u64,
        notify,
    });
    if let Some(addr) = &args.metrics_addr {
        let o = observed.clone();
        match metrics_http::start(&rt, addr, Arc::new(move || o.render())) {
            Ok(a) => tracing::info!("metrics at http://{a}/metrics"),
            Err(e) => {
                report(is_child, &Err(e.clone()));
                return Err(e);
            }
        }
    }
    let spec = MountSpec {
        // A comma would end the option in the mount's option string (fusermount3 read
        // the rest as another option and refused the mount): written as a URL writes it.
        fsname: location.to_url().replace(',', "%2C").replace('\\', "%5C"),
        allow_other: args.allow_other,
        allow_root: args.access.allow_root,
        auto_unmount: args.access.auto_unmount,
        threads: args.fuse_threads,
        read_only: args.read_only,
        passthrough: args.passthrough,
    };
    let fs_after = fs.clone();
    // Held until the kernel mount exists: another mount started at the same time waits or
    // is refused, never mounted over this one.
    let held = match hold_mountpoint(mp) {
        Ok(held) => held,
        Err(e) => {
            report(is_child, &Err(e.clone()));
            return Err(e);
        }
    };
    if is_child && !parent_waits() {
        // The `bucketfs mount` that started this process was interrupted (Ctrl-C, a
        // `timeout`): it failed, so nothing may mount later (this process mounted 20 s
        // after, over another mount of the same mount point: tester E).
        return Err("the bucketfs mount command that started this process is gone: not mounting".into());
    }
    let mut session = match bucketfs_fuse::mount(fs, rt.handle().clone(), mp, &spec) {
        Ok(s) => s,
        Err(e) => {
            let msg = format!("cannot mount on {}: {e}", mp.display());
            report(is_child, &Err(msg.clone()));
            return Err(msg);
        }
    };
    drop(held);
    if args.read_ahead_kib > 0 {
        match bucketfs_fuse::set_read_ahead(mp, args.read_ahead_kib) {
            Ok(old) => tracing::debug!(old, new = args.read_ahead_kib, "kernel readahead set (KiB)"),
            Err(e) => tracing::info!("kernel readahead left at its default ({e}; raising it needs root)"),
        }
    }
    let mut unmounter = session.unmount_callable();
    let (done_tx, done_rx) = mpsc::channel::<&'static str>();
    let session_done = done_tx.clone();
    let worker = std::thread::spawn(move || {
        let r = session.run();
        let _ = session_done.send("session ended");
        r
    });
    // Register the handlers here, before READY=1: a SIGTERM that arrives before a spawned
    // task first runs would otherwise take the default action and kill the mount uncleanly.
    // SIGHUP too (the terminal of a `--foreground` mount closed: it killed the process and
    // left a dead mount), unless it was set to be ignored (`nohup`).
    let (mut term, mut int, mut hup) = {
        use tokio::signal::unix::{signal, SignalKind};
        let _rt = rt.enter();
        let hup = (!crate::cp::signal_ignored(libc::SIGHUP)).then(|| signal(SignalKind::hangup()).expect("SIGHUP"));
        (signal(SignalKind::terminate()).expect("SIGTERM"), signal(SignalKind::interrupt()).expect("SIGINT"), hup)
    };
    rt.spawn(async move {
        let hung_up = async {
            match hup.as_mut() {
                Some(h) => h.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
            _ = hung_up => {}
        }
        let _ = done_tx.send("signal");
    });
    if let Err(e) = paths::write_private(&paths::pid_file(mp), &std::process::id().to_string()) {
        tracing::warn!("cannot write the pid file: {e}");
    }
    let staging = args.staging_dir.clone().unwrap_or_else(|| paths::staging_dir(mp));
    let _ = paths::write_private(&paths::staging_file(mp), &staging.display().to_string());
    let o = observed.clone();
    let fs_sync = fs_after.clone();
    let sync: control::SyncFn = Arc::new(move || {
        let fs = fs_sync.clone();
        Box::pin(async move { control::sync_answer(&fs.sync_closed().await) })
    });
    let control = control::serve(&rt, &paths::control_socket(mp), Arc::new(move || o.status()), sync)
        .map_err(|e| tracing::warn!("`bucketfs status` will not work: {e}"))
        .ok();
    tracing::info!(store = %location.to_url(), mountpoint = %mp.display(), "mounted");
    report(is_child, &Ok(()));
    notify::notify("READY=1");
    let why = done_rx.recv();
    notify::notify("STOPPING=1");
    if why == Ok("signal") {
        tracing::info!("signal received, unmounting");
        if let Err(e) = unmounter.unmount() {
            tracing::warn!("unmount failed ({e}); detaching lazily");
            let _ = Command::new("fusermount3").arg("-u").arg("-z").arg(mp).status();
        }
    }
    let r = worker.join().map_err(|_| "the FUSE session panicked".to_string())?;
    // The session's end uploaded what it could; say what is still only on local disk.
    let pending = rt.block_on(fs_after.pending_keys());
    let set_aside = fs_after.set_aside();
    let _ = std::fs::remove_file(paths::pending_file(mp));
    let mut left = None;
    if !pending.is_empty() || !set_aside.is_empty() {
        let note = paths::PendingNote { staging: staging.clone(), pending: pending.clone(), set_aside };
        let _ = paths::write_private(&paths::pending_file(mp), &note.to_text());
        if !pending.is_empty() {
            tracing::error!(changes = ?pending, "unmounted with changes pending; kept in {} for the next mount", staging.display());
        }
        left = Some(crate::unmount::report(&note, mp));
    }
    let _ = std::fs::remove_file(paths::pid_file(mp));
    let _ = std::fs::remove_file(paths::staging_file(mp));
    drop(control);
    rt.shutdown_timeout(Duration::from_secs(5));
    r.map_err(|e| format!("FUSE session error: {e}"))?;
    tracing::info!("unmounted");
    // A foreground mount (systemd's `Type=notify` unit) stopped with work left exits 1, as
    // `bucketfs unmount` does: a stop with closed files only on local disk is not clean.
    left.map_or(Ok(()), Err)
}

fn cfg_memory_cache(args: &MountArgs) -> u64 {
    args.memory_cache_mib * 1024 * 1024
}

/// `{host}` in a `--notify` source is this machine's short host name (up to its first dot),
/// so that one fstab line serves a fleet whose machines each have a queue or subscription
/// named after them (docs/OPERATIONS.md).
fn with_host(source: &str) -> Result<String, String> {
    if !source.contains("{host}") {
        return Ok(source.to_string());
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let short = host.trim().split('.').next().unwrap_or_default();
    if short.is_empty() {
        return Err(format!("--notify {source:?}: this machine has no host name to put in for {{host}}"));
    }
    Ok(source.replace("{host}", short))
}

/// The change events `--notify SOURCE` asks for (call inside the runtime).
fn event_feed(
    source: &str,
    args: &MountArgs,
    location: &Location,
) -> Result<tokio::sync::mpsc::Receiver<bucketfs_store::events::Feed>, String> {
    let region = args.store.region.clone().or_else(|| std::env::var("AWS_REGION").ok());
    let profile = args.store.profile.as_deref();
    match (source, location) {
        ("minio", Location::S3 { bucket, prefix }) => {
            let endpoint = args.store.endpoint.clone().or_else(|| std::env::var("AWS_ENDPOINT_URL").ok()).ok_or(
                "--notify minio listens to MinIO's own notification API: give --endpoint (MinIO's URL)".to_string(),
            )?;
            let region = region.as_deref().unwrap_or("us-east-1");
            Ok(bucketfs_store::events::minio(&endpoint, bucket, prefix, region, profile))
        }
        ("minio", _) => Err("--notify minio needs an s3:// URL of a MinIO bucket".to_string()),
        (s, Location::S3 { bucket, prefix }) if s.starts_with("sqs://") => {
            bucketfs_store::events::sqs(s, region.as_deref(), bucket, prefix, profile)
        }
        (s, _) if s.starts_with("sqs://") => {
            Err("--notify sqs:// reads S3 event notifications: mount an s3:// URL".into())
        }
        (s, Location::Gcs { bucket, prefix }) if s.starts_with("pubsub://") => {
            bucketfs_store::events::pubsub(s, bucket, prefix)
        }
        (s, _) if s.starts_with("pubsub://") => {
            Err("--notify pubsub:// reads Cloud Storage notifications: mount a gs:// URL".into())
        }
        _ => Err(format!(
            "--notify {source:?}: unknown source; bucketfs listens to: minio, sqs://QUEUE-URL, \
             pubsub://projects/PROJECT/subscriptions/SUBSCRIPTION"
        )),
    }
}

/// Build the store and check, within --connect-timeout, that the bucket answers.
fn prepare(args: &MountArgs, location: &Location, rt: &tokio::runtime::Runtime) -> Result<Arc<dyn Store>, String> {
    let opts = args.store.options();
    let store = location::open(location, &opts).map_err(|e| explain(location, args, e))?;
    let timeout = Duration::from_secs(args.connect_timeout.max(1));
    rt.block_on(async { tokio::time::timeout(timeout, store.check()).await })
        .map_err(|_| {
            format!(
                "the store for {} did not answer within {}s: check the endpoint and network",
                location.to_url(),
                timeout.as_secs()
            )
        })?
        .map_err(|e| explain(location, args, e))?;
    Ok(store)
}

/// Load the tree now (the mount is ready only after it), then refresh it in the background.
/// Listings stay valid for two refresh periods, so one failed refresh changes nothing.
fn start_preload(args: &MountArgs, fs: &Arc<Fs>, rt: &tokio::runtime::Runtime) {
    let (max, every) = (args.preload_max_entries, Duration::from_secs(args.preload_refresh.max(1)));
    match rt.block_on(fs.preload_tree(max, every * 2)) {
        Ok(n) => tracing::info!(entries = n, "tree loaded at mount"),
        Err(e) => {
            tracing::warn!("not preloading: {e}");
            return;
        }
    }
    let fs = fs.clone();
    rt.spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            if let Err(e) = fs.preload_tree(max, every * 2).await {
                tracing::warn!("tree refresh failed (listing per directory meanwhile): {e}");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn host_in_a_notify_source_is_this_machines_short_name() {
        assert_eq!(super::with_host("minio").unwrap(), "minio");
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        let short = host.trim().split('.').next().unwrap();
        let s = super::with_host("pubsub://projects/p/subscriptions/fleet-{host}").unwrap();
        assert_eq!(s, format!("pubsub://projects/p/subscriptions/fleet-{short}"));
    }

    #[test]
    fn fuse_threads_must_fit_under_the_open_files_limit() {
        assert!(super::check_open_files(4, 1024).is_ok());
        assert!(super::check_open_files(4, 68).is_ok());
        let e = super::check_open_files(150, 100).unwrap_err();
        assert!(e.contains("--fuse-threads 150 needs at least 214 open files") && e.contains("100"), "{e}");
    }
}
