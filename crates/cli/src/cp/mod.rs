//! `bucketfs cp SRC... DST`: fast, verified copies between local files and store URLs.
//!
//! - [`endpoint`]: parsing each side (`-`, a path, a store URL) and opening stores.
//! - [`plan`]: slice size and parallelism, slice ranges, one job per file (`-r`);
//!   [`walk`]: local trees, symlinks followed, what is skipped and why.
//! - [`work`]: a download's slices shared by its request slots.
//! - [`download`], [`upload`], [`store_to_store`]: the transfers. [`verify`]: end-to-end
//!   checks. [`source`]: a local file being uploaded, which must not change while read.
//! - [`progress`]: the terminal bar and byte counters. [`error`]: why a copy failed, and
//!   the exit status each case gives.
//!
//! Every request takes a slot from one semaphore of `parallel` slots, so many small files
//! and one large file share the same bound on requests (and memory) in flight.

mod download;
mod endpoint;
mod error;
mod filter;
#[cfg(test)]
mod local_tests;
mod noclobber;
mod plan;
mod preserve;
mod progress;
mod source;
mod store_to_store;
#[cfg(test)]
mod tests;
mod upload;
mod verify;
mod walk;
mod work;

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write as _;
use std::time::{Duration, Instant};

use bucketfs_core::block_pool::BlockPool;
use bucketfs_store::{StoreError, StoreErrorKind};
use clap::Args;
use futures::StreamExt;
use tokio::sync::{Semaphore, SemaphorePermit};

use endpoint::{Opener, Side};
pub use error::CpError;
use error::EXIT_SKIPPED;
use plan::{Dst, Job, Src};
use progress::Progress;
use walk::{Skipped, Walk};

const AFTER_HELP: &str = "\
What -r copies (as aws s3 cp does): regular files; symlinks to files and directories,
followed (inside the tree or out of it); an empty directory as a marker object DIR/ (a
marker object downloads as an empty directory). Skipped, each named on stderr as
'skipped PATH: REASON' and in --json's \"skipped\": FIFOs, sockets and devices (never
opened), dangling symlinks, symlink loops (a directory link back to a directory that
contains it), every symlink with --no-follow-symlinks, and, downloading, keys that are
not safe local paths (an empty, '.' or '..' segment). A named source is treated the
same way (exit status 2, or 0 with --skip-special; the exit statuses are listed at the end).

A local file that changes while it is read (its size, mtime or ctime differ after the last
read from before the first, it ends early or goes on past its size, or its path names
another file by then) fails its copy with a message saying it changed, and its upload is
aborted before it completes: no object claims to be a copy of it. Stdin is not checked.

Verification (always on): bucketfs computes crc32c (and MD5 where the store keeps one) of
the bytes it reads or writes and compares them with what the store reports (a download
checked by the object's S3 crc32 computes that instead, and the crc32c only for --json):
  - GCS: the object's MD5 (md5Hash); GCS keeps none for composed (large) uploads.
  - S3 uploads: every request carries the crc32c of its body (x-amz-checksum-crc32c), which
    the server checks and must confirm in its answer; a multipart object's composite
    checksum must equal the one of its parts. A store that does not confirm fails the upload:
    --s3-md5 verifies by the ETag's MD5s instead, as for downloads.
  - S3 downloads: the object's crc32c or crc32 checksum where it has one (bucketfs cp,
    boto3 and the aws cli upload with one), asked for with x-amz-checksum-mode: of the whole
    object, or for a multipart upload the crc of its parts' crcs (tried in every part size
    of whole MiB that gives the part count: if none rebuilds it, a mismatch; --s3-md5 for
    objects uploaded in parts of another size). Else the ETag, which is the MD5 for
    single-request uploads and the MD5 of the part MD5s for multipart uploads (the part size
    guessed from the part count; one that does not match is settled by a re-read).
  - Anything else (no usable digest, file://, mem://, encrypted S3 objects): the object is
    read a second time, ranged and in parallel, and the crc32c of every range compared.
    This re-read costs a second transfer of the data.
A mismatch is an error: the copy is retried (downloads fetch again, uploads delete the bad
object and upload again), and after --retries attempts bucketfs exits with status 7.
--json prints how each copy was verified.
";

#[derive(Args, Clone, Debug)]
#[command(after_long_help = format!("{AFTER_HELP}\n{}", error::EXIT_CODES), override_usage = "bucketfs cp [OPTIONS] SRC... DST")]
pub struct CpArgs {
    /// Sources, then the destination. Each is a local path, a store URL
    /// (s3://BUCKET/KEY, gs://BUCKET/KEY, file:///PATH, mem://KEY) or '-' (stdin as the
    /// only source, streamed into an object; stdout as the destination, in order).
    /// Several sources go into a directory or prefix.
    #[arg(value_name = "PATH", num_args = 2.., required = true)]
    paths: Vec<String>,
    /// Copy directories and prefixes recursively.
    #[arg(short, long)]
    recursive: bool,
    /// Skip symlinks (each is named on stderr) instead of copying what they point to, as
    /// aws s3 cp's --no-follow-symlinks does.
    #[arg(long)]
    no_follow_symlinks: bool,
    /// Exit 0 when paths were skipped (FIFOs, sockets, devices, dangling symlinks, symlink
    /// loops, symlinks with --no-follow-symlinks, keys that are not safe local paths, names the
    /// store would change: whitespace at a key's start or end). They
    /// are named on stderr either way; without this flag the exit status is then 2.
    #[arg(long)]
    skip_special: bool,
    #[command(flatten)]
    store: crate::store_args::StoreArgs,
    /// Endpoint of the s3:// side only (overrides --endpoint): for copies between two
    /// services, like MinIO to a GCS emulator.
    #[arg(long, value_name = "URL")]
    s3_endpoint: Option<String>,
    /// Endpoint of the gs:// side only (overrides --endpoint).
    #[arg(long, value_name = "URL")]
    gcs_endpoint: Option<String>,
    /// Bytes per ranged read or upload part (like 8M, 16MiB). Default: 8 MiB up to
    /// 256 MiB, then 16 MiB (larger past 160 GB); at least 5 MiB for S3 uploads, at most 1G.
    #[arg(long, value_parser = plan::parse_slice_size)]
    slice_size: Option<u64>,
    /// Requests in flight, across all files. Default: 4 per core, between 8 and 16.
    #[arg(long)]
    parallel: Option<usize>,
    /// S3: verify by MD5s (the ETag) instead of checksums: uploads do not ask the server to
    /// check a crc32c of every request (x-amz-checksum-crc32c), downloads do not ask for the
    /// object's checksum (x-amz-checksum-mode). For S3-compatible stores that do not support
    /// checksums (bucketfs names this flag when a store does not confirm them). Costs about
    /// half of an upload's or a download's CPU time.
    #[arg(long)]
    s3_md5: bool,
    /// Attempts after the first, for a failed request and for a failed verification.
    #[arg(long, default_value_t = 4)]
    retries: u32,
    /// Print a JSON summary on stdout (on stderr when the destination is '-').
    #[arg(long)]
    json: bool,
    /// No progress bar even on a terminal.
    #[arg(short, long)]
    quiet: bool,
    #[command(flatten)]
    log: crate::logging::LogArgs,
    /// Skip files whose path matches this glob: `*` crosses `/`, and trailing parts of the
    /// path match too (`*.tmp`, `cache/*`). Repeatable.
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// Copy files matching this glob even when an --exclude matches
    /// (`--exclude '*' --include '*.txt'`). Repeatable.
    #[arg(long, value_name = "GLOB")]
    include: Vec<String>,
    /// Print what would be copied (SRC -> DST, one a line) and copy nothing.
    #[arg(long)]
    dry_run: bool,
    /// Keep each file's mode and modification time: uploads store them in the object's
    /// metadata (the keys a bucketfs mount shows, as rclone and s3fs write them), downloads
    /// set them from it.
    #[arg(short = 'P', long)]
    preserve: bool,
    /// Do not copy onto a destination that already holds the same content: the same size
    /// and, where both sides have one, the same MD5 (S3 single-part ETag, GCS md5Hash, a
    /// local file's); with none, the size decides. Each is named on stderr and counted at
    /// the end (in --json's "verified" as "unchanged-no-clobber"); the exit status is 0.
    #[arg(short = 'n', long)]
    no_clobber: bool,
}

/// What one file's copy did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub bytes: u64,
    /// How it was verified (the `BY_*` names of verify.rs; `SRC>DST` for store to store).
    pub verified: std::borrow::Cow<'static, str>,
    /// The content's crc32c, where it was computed (see `SliceSum::crc`); `--json` prints
    /// 0 for none.
    pub crc32c: Option<u32>,
}

/// Shared by every transfer of one `cp`.
pub struct Ctx {
    slots: Semaphore,
    pub parallel: usize,
    /// The user's `--slice-size`, if given.
    pub slice: Option<u64>,
    pub retries: u32,
    pub progress: Progress,
    /// A `--json` summary reports this copy's crc32c (it does for a single file only): a
    /// download computes it even where the object's crc32 is what verifies it.
    pub summary: bool,
    /// First retry delay; doubles per attempt.
    pub backoff_base: Duration,
    /// `-P`: uploads keep the file's mode and mtime, downloads set the object's.
    pub preserve: bool,
    /// `--no-clobber`: a destination with the same content is left as it is.
    pub no_clobber: bool,
    /// Downloads' write buffers (see `download::receive`), reused across requests.
    pub buffers: BlockPool,
    /// Set on SIGINT/SIGTERM/SIGHUP: transfers stop, uploads abort (deleting their parts).
    cancel: tokio::sync::watch::Sender<bool>,
}

impl Ctx {
    pub fn new(parallel: usize, slice: Option<u64>, retries: u32, progress: Progress) -> Self {
        // 200 ms, doubling: 4 retries wait 3 s in all, enough for a server to come back.
        let cancel = tokio::sync::watch::Sender::new(false);
        Self {
            slots: Semaphore::new(parallel),
            parallel,
            slice,
            retries,
            progress,
            summary: false,
            backoff_base: Duration::from_millis(200),
            preserve: false,
            no_clobber: false,
            buffers: BlockPool::huge_pages(download::WRITE_BUF, download::POOL_MAX),
            cancel,
        }
    }

    pub fn cancel(&self) {
        self.cancel.send_replace(true);
    }

    /// Resolves once the copy is cancelled.
    pub async fn cancelled(&self) {
        let mut rx = self.cancel.subscribe();
        let _ = rx.wait_for(|c| *c).await;
    }

    pub fn is_cancelled(&self) -> bool {
        *self.cancel.borrow()
    }

    pub async fn slot(&self) -> SemaphorePermit<'_> {
        self.slots.acquire().await.expect("the semaphore is never closed")
    }

    pub async fn slots(&self, n: usize) -> SemaphorePermit<'_> {
        let n = u32::try_from(n.min(self.parallel)).unwrap_or(1);
        self.slots.acquire_many(n).await.expect("the semaphore is never closed")
    }

    /// Delay before retry `attempt` (1-based): doubling, capped at 5 s, with jitter.
    pub fn backoff(&self, attempt: u32) -> Duration {
        // Doubling stops at 2^4 (3.2 s from 200 ms); the 5 s cap keeps a copy from stalling
        // long on a flaky server while the store layer's own retries run underneath.
        let base = self.backoff_base.saturating_mul(1 << attempt.min(5).saturating_sub(1));
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let jitter = base.mul_f64(f64::from(nanos % 1000) / 4000.0); // up to +25%
        (base + jitter).min(Duration::from_secs(5))
    }
}

/// Errors that another attempt cannot fix. A store that timed out had its own retries,
/// each waiting the full timeout: trying again multiplied that (an upload to a black-holed
/// store gave up after 12 minutes, tester Q).
pub fn is_retryable(e: &StoreError) -> bool {
    !e.timed_out
        && !matches!(
            e.kind,
            StoreErrorKind::NotFound
                | StoreErrorKind::PermissionDenied
                | StoreErrorKind::Changed
                | StoreErrorKind::Unsupported
                | StoreErrorKind::InvalidName
                | StoreErrorKind::Config
        )
}

/// A copy whose stores have answered nothing and moved no byte for this long gives up on
/// the next failure to reach them, rather than trying again: each try of a black-holed
/// store waits its full timeout, four times in the store layer (tester Q: 12 minutes).
pub const SILENCE_GIVE_UP: Duration = Duration::from_secs(60);

/// What a failure to reach the store says when the copy has heard nothing from it for
/// [`SILENCE_GIVE_UP`] (`None`: not so, it is tried again as any other).
pub fn silence(ctx: &Ctx, unreachable: bool) -> Option<String> {
    let silent = ctx.progress.silent_for();
    (unreachable && silent >= SILENCE_GIVE_UP)
        .then(|| format!("nothing heard from the store for {} s, giving up", silent.as_secs()))
}

/// Run `op` until it succeeds, fails for good, or `ctx.retries` retries are spent.
pub async fn retry<T, F, Fut>(ctx: &Ctx, what: &str, key: &str, mut op: F) -> Result<T, CpError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut attempt = 0;
    loop {
        match op().await {
            Ok(v) => {
                ctx.progress.answered();
                return Ok(v);
            }
            Err(e) => again(ctx, what, key, &mut attempt, e).await?,
        }
    }
}

/// After failure `e`: wait and return `Ok` if another attempt may help (counting it in
/// `attempt`), else the error to give up with.
pub async fn again(ctx: &Ctx, what: &str, key: &str, attempt: &mut u32, e: StoreError) -> Result<(), CpError> {
    if e.kind == StoreErrorKind::Changed {
        return Err(CpError::Changed(format!("{key}: the object changed during the copy ({e})")));
    }
    if let Some(why) = silence(ctx, e.kind == StoreErrorKind::Unavailable) {
        return Err(CpError::store(format!("{what} {key}: {e} ({why})"), &e));
    }
    if *attempt >= ctx.retries || !is_retryable(&e) {
        return Err(CpError::store(format!("{what} {key}: {e}"), &e));
    }
    *attempt += 1;
    tracing::info!("{what} {key}: {e}; retry {attempt} of {}", ctx.retries);
    tokio::time::sleep(ctx.backoff(*attempt)).await;
    Ok(())
}

/// One job, start to end.
async fn run_job(ctx: &Ctx, job: &Job) -> Result<Report, CpError> {
    if ctx.is_cancelled() {
        return Err(CpError::interrupted());
    }
    if ctx.no_clobber && noclobber::unchanged(ctx, job).await? {
        ctx.progress.println(&format!("bucketfs cp: unchanged, not copied (--no-clobber): {}", filter::describe(job)));
        return Ok(Report { bytes: 0, verified: noclobber::UNCHANGED.into(), crc32c: None });
    }
    match (&job.src, &job.dst) {
        (Src::Remote { remote, head, .. }, Dst::Local(path)) => {
            let report = download::to_file(ctx, remote, head.as_deref(), path).await?;
            if ctx.preserve {
                preserve::apply_to_local(remote, path).await?;
            }
            Ok(report)
        }
        (Src::Remote { remote, head, .. }, Dst::Stdout) => download::to_stdout(ctx, remote, head.as_deref()).await,
        (Src::Local { path, size }, Dst::Remote(r)) => {
            upload::upload(ctx, upload::Source::File(path), Some(*size), r).await
        }
        (Src::Remote { remote, head, .. }, Dst::Remote(r)) => {
            store_to_store::copy(ctx, remote, head.as_deref(), r).await
        }
        (Src::Stdin, Dst::Remote(r)) => upload::upload(ctx, upload::Source::Stdin, None, r).await,
        (Src::Dir, dst) => make_dir(ctx, dst).await,
        (Src::Unreadable { path, errno }, _) => {
            Err(CpError::io(path.display(), &std::io::Error::from_raw_os_error(*errno)))
        }
        _ => Err("unsupported combination of source and destination".into()),
    }
}

/// What a directory's [`Report`] says it was verified by: it is counted as a directory, not
/// a file, in the `--json` summary.
const DIR: &str = "directory";

/// An empty directory or a directory marker, made at `dst`: a marker object `KEY/`, or a
/// local directory.
async fn make_dir(ctx: &Ctx, dst: &Dst) -> Result<Report, CpError> {
    match dst {
        Dst::Remote(r) => {
            let key = format!("{}/", r.key.trim_end_matches('/'));
            let _slot = ctx.slot().await;
            retry(ctx, "mkdir", &key, || r.store.create_dir(&key)).await?;
        }
        Dst::Local(p) => std::fs::create_dir_all(p).map_err(|e| CpError::io(p.display(), &e))?,
        Dst::Stdout => return Err("a directory cannot go to stdout".into()),
    }
    Ok(Report { bytes: 0, verified: DIR.into(), crc32c: None })
}

/// Run all jobs; stdout jobs one after another (order matters), others concurrently.
pub async fn run_jobs(ctx: &Ctx, jobs: &[Job]) -> (Vec<Report>, Vec<CpError>) {
    let ordered = jobs.iter().any(|j| matches!(j.dst, Dst::Stdout));
    let width = if ordered { 1 } else { ctx.parallel };
    let results: Vec<Result<Report, CpError>> =
        futures::stream::iter(jobs).map(|j| run_job(ctx, j)).buffered(width).collect().await;
    let mut reports = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(rep) => reports.push(rep),
            Err(e) => errors.push(e),
        }
    }
    (reports, errors)
}

/// The `--json` line; `single`: one file was asked for (only then is a crc32c reported).
/// Directories made (markers, empty local directories) are counted in `dirs`, not `files`;
/// `skipped` lists what was not copied, with why.
fn json_summary(reports: &[Report], skipped: &[Skipped], secs: f64, single: bool) -> String {
    let (dirs, files): (Vec<&Report>, Vec<&Report>) = reports.iter().partition(|r| r.verified == DIR);
    let bytes: u64 = files.iter().map(|r| r.bytes).sum();
    let mut verified: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &files {
        *verified.entry(&r.verified).or_default() += 1;
    }
    let skipped: Vec<serde_json::Value> = skipped
        .iter()
        .map(|s| serde_json::json!({"path": s.path.to_string_lossy(), "reason": s.reason.to_string()}))
        .collect();
    let rate = if secs > 0.0 { bytes as f64 / 1e6 / secs } else { 0.0 };
    let round = |x: f64, places: i32| (x * 10f64.powi(places)).round() / 10f64.powi(places);
    let mut o = serde_json::json!({
        "bytes": bytes,
        "seconds": round(secs, 3),
        "mb_per_s": round(rate, 1),
        "files": files.len(),
        "dirs": dirs.len(),
        "verified": verified,
        "skipped": skipped,
    });
    if let [one] = files.as_slice() {
        if single {
            o["crc32c"] = format!("{:08x}", one.crc32c.unwrap_or(0)).into();
        }
    }
    o.to_string()
}

/// `bucketfs cp`. Failures are `Err` (`main` exits with [`CpError::exit_code`]); a copy
/// that skipped something ends the process with [`EXIT_SKIPPED`] itself, unless
/// `--skip-special`.
pub fn run(args: CpArgs) -> Result<(), CpError> {
    let mut paths = args.paths.clone();
    let dst_arg = paths.pop().ok_or("cp needs a source and a destination")?;
    // Retries and the store's warnings go to stderr (BUCKETFS_LOG changes what is logged).
    let filter = if args.quiet { "error" } else { "warn,bucketfs=info" };
    crate::logging::init(filter, args.log.log_format, None);
    let mut opts = args.store.options();
    opts.s3_crc32c = !args.s3_md5;
    opts.s3_checksum_mode = !args.s3_md5;
    // One thread drives every request; hashing and writing run on the blocking pool. The
    // multi-thread scheduler's hand-offs between workers cost about a fifth of a
    // download's CPU (0.59-0.76 against 0.45-0.57 s per GiB by hand), which on a small
    // machine is the rate.
    let skip_special = args.skip_special;
    let filter = filter::Filter::new(&args.exclude, &args.include)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| format!("runtime: {e}"))?;
    let skipped = rt.block_on(async move {
        let mut opener = Opener::new(opts, args.s3_endpoint.clone(), args.gcs_endpoint.clone());
        let srcs = paths.iter().map(|s| opener.side(s)).collect::<Result<Vec<_>, _>>()?;
        let dst = opener.side(&dst_arg)?;
        let to_stdout = matches!(dst, Side::Stdio);
        let walk = Walk { recursive: args.recursive, follow_symlinks: !args.no_follow_symlinks };
        let walk::Expanded { jobs, skipped } = plan::expand(srcs, dst, walk).await?;
        let jobs = filter::apply(jobs, filter.as_ref());
        // Said before the copy starts (and again, counted, at its end).
        for s in &skipped {
            say!("bucketfs cp: {s}");
        }
        if args.dry_run {
            for j in &jobs {
                println!("(dry run) {}", filter::describe(j));
            }
            return Ok(skipped.len());
        }
        if jobs.is_empty() && skipped.is_empty() {
            return Err(CpError::from("nothing to copy"));
        }
        let total = jobs.iter().map(Job::size).sum::<Option<u64>>();
        let parallel = args.parallel.unwrap_or_else(plan::default_parallel).max(1);
        let mut ctx = Ctx::new(parallel, args.slice_size, args.retries, Progress::new(total, !args.quiet));
        ctx.summary = args.json && jobs.len() == 1;
        ctx.preserve = args.preserve;
        ctx.no_clobber = args.no_clobber;
        let start = Instant::now();
        // On SIGINT/SIGTERM/SIGHUP (a closed terminal or SSH session), cancel and keep
        // waiting: the transfers abort and clean up.
        let hangup_ignored = signal_ignored(libc::SIGHUP);
        let signals = async {
            use tokio::signal::unix::{signal, SignalKind};
            let on = |kind: SignalKind| {
                let mut s = signal(kind).ok();
                async move {
                    match s.as_mut() {
                        Some(s) => s.recv().await,
                        None => std::future::pending().await,
                    }
                }
            };
            let any = || async {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = on(SignalKind::terminate()) => {}
                    // Not under nohup: a hang-up it set to be ignored stays ignored.
                    _ = async { if hangup_ignored { std::future::pending().await } else { on(SignalKind::hangup()).await } } => {}
                }
            };
            any().await;
            ctx.cancel();
            ctx.progress.println(
                "bucketfs cp: interrupted; aborting uploads and removing partial files (interrupt again to stop now)",
            );
            // A second signal stops at once, as the user asks (the cleanup may be waiting
            // on a store that does not answer).
            any().await;
            ctx.progress.finish();
            say!(
                "bucketfs cp: interrupted again: stopped without cleaning up; partial downloads (hidden files \
                 named .NAME.bucketfs-PID-N) may remain beside their destinations, and unfinished \
                 multipart uploads in the bucket until its lifecycle rule removes them"
            );
            std::process::exit(130)
        };
        let (reports, errors) = tokio::select! {
            r = run_jobs(&ctx, &jobs) => r,
            _ = signals => unreachable!("never completes"),
        };
        ctx.progress.finish();
        let unchanged = reports.iter().filter(|r| r.verified == noclobber::UNCHANGED).count();
        if unchanged > 0 {
            say!(
                "bucketfs cp: {unchanged} of {} already at the destination, not copied (--no-clobber)",
                jobs.len()
            );
        }
        if args.json {
            let line = json_summary(&reports, &skipped, start.elapsed().as_secs_f64(), ctx.summary);
            if to_stdout {
                say!("{line}");
            } else {
                println!("{line}");
            }
        }
        if ctx.is_cancelled() {
            let msg = format!("{}: {} of {} copies finished", CpError::interrupted(), reports.len(), jobs.len());
            return Err(CpError::Interrupted(msg));
        }
        match errors.len() {
            0 => Ok(skipped.len()),
            1 => Err(errors.into_iter().next().unwrap_or_else(|| CpError::from("a copy failed"))),
            n => {
                for e in &errors {
                    say!("bucketfs cp: {e}");
                }
                Err(CpError::several(&errors, format!("{n} of {} copies failed (see above)", jobs.len())))
            }
        }
    })?;
    drop(rt);
    if skipped > 0 && !skip_special {
        // main turns every Err into its status; a skip is not a failure of what was copied,
        // and scripts tell the two apart by the status (aws s3 cp's 2), so exit here.
        let what = if skipped == 1 { "path was" } else { "paths were" };
        say!("bucketfs: {skipped} {what} skipped (see above); exit status {EXIT_SKIPPED} (--skip-special: 0)");
        let _ = std::io::stdout().flush();
        std::process::exit(EXIT_SKIPPED.into());
    }
    Ok(())
}

/// Whether `sig` is set to be ignored (as `nohup` sets SIGHUP), before any handler of ours.
pub(crate) fn signal_ignored(sig: libc::c_int) -> bool {
    // SAFETY: a query only (no new action); `old` is written by the call.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}
