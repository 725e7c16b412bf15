//! What to copy where, and how to cut each transfer: slice size and parallelism from the
//! file size and the machine, the slice ranges, and expanding `SRC... DST` (with `-r`) into
//! one job per file (local sources are walked by [`super::walk`], which also says what it
//! skips) and per empty directory.

use std::ops::Range;
use std::path::PathBuf;

use futures::TryStreamExt;

use super::endpoint::{Remote, Side};
use super::error::CpError;
use super::walk::{self, Expanded, SkipReason, Skipped, Walk};
use bucketfs_store::{HeadOpts, ObjectHead, StoreErrorKind};

pub const MIB: u64 = 1 << 20;
/// S3 rejects parts under 5 MiB (all but the last), so uploads to S3 never use less.
pub const MIN_S3_PART: u64 = 5 * MIB;
/// S3 allows at most 10,000 parts in one upload.
pub const MAX_PARTS: u64 = 10_000;

/// How one transfer is cut and how many slices run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    pub slice: u64,
    pub parallel: usize,
}

/// Slice size for an object of `size` bytes (`None`: unknown, as for stdin).
pub fn default_slice(size: Option<u64>) -> u64 {
    match size {
        // Unknown length: 16 MiB parts still reach 160 GB within S3's 10,000 parts.
        None => 16 * MIB,
        // Up to 256 MiB: 8 MiB slices give at least 8-way parallelism from 64 MiB up.
        Some(n) if n <= 256 * MIB => 8 * MIB,
        // Larger: 16 MiB halves the request count; past 160 GB grow to stay in 10,000 parts.
        Some(n) => (16 * MIB).max(n.div_ceil(MAX_PARTS).div_ceil(MIB) * MIB),
    }
}

/// Requests in flight: 4 per core hides round trips, 8 at least (even on 2 cores the work
/// is waiting on the network), 16 at most (beyond that a single server gains nothing).
pub fn default_parallel() -> usize {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    (cores * 4).clamp(8, 16)
}

/// The tuning for one transfer, with the user's overrides applied.
pub fn tuning(size: Option<u64>, slice: Option<u64>, parallel: Option<usize>) -> Tuning {
    let mut s = slice.unwrap_or_else(|| default_slice(size)).max(1);
    if let Some(n) = size {
        s = s.max(n.div_ceil(MAX_PARTS)); // never more than 10,000 slices
    }
    Tuning { slice: s, parallel: parallel.unwrap_or_else(default_parallel).max(1) }
}

/// `[0, size)` cut into consecutive ranges of `slice` bytes (the last may be shorter).
/// Zero bytes give no ranges.
pub fn slices(size: u64, slice: u64) -> Vec<Range<u64>> {
    let slice = slice.max(1);
    (0..size.div_ceil(slice)).map(|i| i * slice..((i + 1) * slice).min(size)).collect()
}

/// Parse `--slice-size`: a size of at most 1 GiB. Each request in flight holds one slice
/// in memory (`--slice-size 100G` aborted on a failed allocation).
pub fn parse_slice_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        v if v > 1 << 30 => Err(format!("{s:?}: at most 1G (each request in flight holds a slice in memory)")),
        v => Ok(v),
    }
}

/// Parse `8M`, `16MiB`, `512k`, `1G` or a byte count.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a size (like 8M, 16MiB, 1048576)"))?;
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use K, M or G)")),
    };
    match n.checked_mul(mult) {
        Some(v) if v > 0 => Ok(v),
        _ => Err(format!("{s:?}: the size must be positive and fit in 64 bits")),
    }
}

/// Where one file's bytes come from.
#[derive(Clone)]
pub enum Src {
    Local {
        path: PathBuf,
        size: u64,
    },
    /// `head`: what the HEAD that found a single object said (a listing gives none), so the
    /// copy does not ask again.
    Remote {
        remote: Remote,
        size: u64,
        head: Option<Box<ObjectHead>>,
    },
    Stdin,
    /// An empty directory (local) or a directory marker object (`dir/`): made at the
    /// destination, as a marker object or a local directory.
    Dir,
    /// A local directory below a `-r` source that could not be read (`errno`): its copy
    /// fails with that error (exit 4 when denied), the rest of the tree is copied.
    Unreadable {
        path: PathBuf,
        errno: i32,
    },
}

/// Where they go.
#[derive(Clone)]
pub enum Dst {
    Local(PathBuf),
    Remote(Remote),
    Stdout,
}

#[derive(Clone)]
pub struct Job {
    pub src: Src,
    pub dst: Dst,
}

impl Job {
    pub fn size(&self) -> Option<u64> {
        match &self.src {
            Src::Local { size, .. } | Src::Remote { size, .. } => Some(*size),
            Src::Stdin => None,
            Src::Dir | Src::Unreadable { .. } => Some(0),
        }
    }
}

/// Expand `srcs` into `dst` into one job per file, cp(1)-style: several sources or a
/// directory/prefix destination put each source under its own name; a single source into
/// a destination that does not exist as a directory becomes that destination. Local paths
/// that are not copied (see [`walk`]) are listed in `skipped`.
pub async fn expand(srcs: Vec<Side>, dst: Side, walk: Walk) -> Result<Expanded, CpError> {
    let recursive = walk.recursive;
    let many = srcs.len() > 1;
    if srcs.iter().any(|s| matches!(s, Side::Stdio)) {
        return match (srcs.as_slice(), &dst) {
            ([_], Side::Remote(r)) if !r.key.is_empty() && !r.key.ends_with('/') => {
                Ok(Expanded { jobs: vec![Job { src: Src::Stdin, dst: Dst::Remote(r.clone()) }], skipped: Vec::new() })
            }
            ([_], Side::Remote(r)) => {
                Err(format!("{}: streaming stdin needs an object name, not a prefix", r.url()).into())
            }
            ([_], _) => Err("'-' (stdin) can only be copied to an object URL; use shell redirection for files".into()),
            _ => Err("'-' (stdin) must be the only source".into()),
        };
    }
    let into_dir = match &dst {
        Side::Stdio => false,
        Side::Local(p) => p.is_dir() || p.to_string_lossy().ends_with('/'),
        Side::Remote(r) => r.key.is_empty() || r.key.ends_with('/') || is_prefix(r).await?,
    };
    if many && !into_dir {
        match &dst {
            Side::Local(p) => {
                return Err(format!("{}: copying several sources needs an existing directory", p.display()).into())
            }
            Side::Remote(_) | Side::Stdio => {}
        }
    }
    let into_dir = into_dir || many;
    let mut out = Expanded::default();
    for src in srcs {
        match src {
            Side::Stdio => unreachable!("handled above"),
            Side::Local(path) => walk::expand_local(&path, &dst, into_dir, walk, &mut out)?,
            Side::Remote(r) => expand_remote(&r, &dst, into_dir, recursive, &mut out).await?,
        }
    }
    // A key the store would change (OpenDAL trims whitespace at a key's ends): a
    // destination `x ` would land on `x`, over another file; a source `x ` would read `x`.
    let reaches = |r: &Remote| r.store.capabilities().addressable(&r.key);
    // A name ending in `__XLDIR__` becomes, on MinIO, the marker of the directory without it.
    let marker_like = |r: &Remote| {
        r.store.capabilities().prefix_dirs
            && r.key.split('/').any(|s| s.ends_with(bucketfs_core::names::MINIO_DIR_SUFFIX))
    };
    // Why a job is skipped, and the path that names it.
    let skip = |j: &Job| {
        let reason = match (&j.src, &j.dst) {
            (_, Dst::Remote(r)) if marker_like(r) => SkipReason::MarkerName,
            (_, Dst::Remote(r)) if !reaches(r) => SkipReason::UnaddressableKey,
            (Src::Remote { remote, .. }, _) if !reaches(remote) => SkipReason::UnaddressableKey,
            _ => return None,
        };
        let path = match (&j.src, &j.dst) {
            (Src::Remote { remote, .. }, _) if reason == SkipReason::UnaddressableKey && !reaches(remote) => {
                remote.url().into()
            }
            (Src::Local { path, .. }, _) => path.clone(),
            (_, Dst::Remote(r)) => r.url().into(),
            _ => unreachable!("skipped for a remote source or destination"),
        };
        Some(Skipped { path, reason })
    };
    for j in std::mem::take(&mut out.jobs) {
        match skip(&j) {
            Some(s) => out.skipped.push(s),
            None => out.jobs.push(j),
        }
    }
    refuse_shared_destinations(&out.jobs)?;
    let jobs = &mut out.jobs;
    if jobs.len() > 1 {
        // A later job may start minutes from now: it asks for the object again then.
        for j in jobs.iter_mut() {
            if let Src::Remote { head, .. } = &mut j.src {
                *head = None;
            }
        }
    }
    Ok(out)
}

/// Several sources with one destination (`cp a/x b/x s3://b/p/`, two trees holding the
/// same names): refused before anything is copied, as cp(1) refuses to overwrite a file it
/// just made. All were copied, each over the last, the count saying so, one lost
/// (tester Q).
fn refuse_shared_destinations(jobs: &[Job]) -> Result<(), CpError> {
    let mut seen: std::collections::HashMap<String, &Job> = std::collections::HashMap::new();
    for j in jobs.iter().filter(|j| !matches!(j.src, Src::Dir)) {
        let to = match &j.dst {
            Dst::Local(p) => p.display().to_string(),
            Dst::Remote(r) => r.url(),
            Dst::Stdout => continue,
        };
        if let Some(first) = seen.insert(to.clone(), j) {
            let from = |j: &Job| match &j.src {
                Src::Local { path, .. } | Src::Unreadable { path, .. } => path.display().to_string(),
                Src::Remote { remote, .. } => remote.url(),
                Src::Stdin | Src::Dir => "-".into(),
            };
            return Err(format!(
                "{} and {} would both be copied to {to}: nothing copied; copy them to different destinations",
                from(first),
                from(j)
            )
            .into());
        }
    }
    Ok(())
}

/// True if `key/` holds at least one object (the key names a "directory").
async fn is_prefix(r: &Remote) -> Result<bool, CpError> {
    let prefix = format!("{}/", r.key);
    let first =
        r.store.list(&prefix, false).try_next().await.map_err(|e| CpError::store(format!("{}: {e}", r.url()), &e))?;
    Ok(first.is_some())
}

/// `base` joined with a `/`-separated relative name, on either side.
pub(super) fn target(dst: &Side, base_name: Option<&str>, rel: &str, into_dir: bool) -> Result<Dst, String> {
    let parts: Vec<&str> =
        base_name.into_iter().filter(|_| into_dir).chain(rel.split('/').filter(|s| !s.is_empty())).collect();
    Ok(match dst {
        Side::Stdio => Dst::Stdout,
        Side::Local(p) => Dst::Local(parts.iter().fold(p.clone(), |acc, s| acc.join(s))),
        Side::Remote(r) => {
            let key = if parts.is_empty() {
                r.key.clone()
            } else {
                let base = if r.key.is_empty() || r.key.ends_with('/') { r.key.clone() } else { format!("{}/", r.key) };
                format!("{base}{}", parts.join("/"))
            };
            if key.is_empty() || key.ends_with('/') {
                return Err(format!("{}: needs an object name", r.url()));
            }
            Dst::Remote(r.with_key(key))
        }
    })
}

/// A listed key not copied: named by its URL (a key can hold bytes a path cannot, so lossily).
fn unsafe_key(r: &Remote, key: &str) -> Skipped {
    Skipped { path: format!("{}{key}", r.base).into(), reason: SkipReason::UnsafeKey }
}

/// A key's relative part must be safe as a local path: no empty, `.` or `..` segments.
fn safe_rel(rel: &str) -> bool {
    !rel.is_empty() && rel.split('/').all(|s| !s.is_empty() && s != "." && s != "..")
}

async fn expand_remote(
    r: &Remote,
    dst: &Side,
    into_dir: bool,
    recursive: bool,
    out: &mut Expanded,
) -> Result<(), CpError> {
    // A last segment `.` or `..` names no directory of its own: its keys go into `dst`.
    let name = r.key.trim_end_matches('/').rsplit('/').next().filter(|n| safe_rel(n)).map(str::to_string);
    if !r.key.is_empty() && !r.key.ends_with('/') {
        match r.store.head(&r.key, HeadOpts { digests: true, ..Default::default() }).await {
            Ok(d) => {
                let dst = target(dst, name.as_deref(), "", into_dir)?;
                out.jobs.push(Job {
                    src: Src::Remote { remote: r.clone(), size: d.meta.size, head: Some(Box::new(d)) },
                    dst,
                });
                return Ok(());
            }
            Err(e) if e.kind == StoreErrorKind::NotFound => {
                if !is_prefix(r).await? {
                    return Err(CpError::NotFound(format!("{}: no such object or prefix", r.url())));
                }
            }
            Err(e) => return Err(CpError::store(format!("{}: {e}", r.url()), &e)),
        }
    }
    if !recursive {
        return Err(format!("{} is a prefix (use -r)", r.url()).into());
    }
    if matches!(dst, Side::Stdio) {
        return Err(format!("{}: a prefix cannot go to stdout", r.url()).into());
    }
    let prefix = if r.key.is_empty() || r.key.ends_with('/') { r.key.clone() } else { format!("{}/", r.key) };
    let mut list = r.store.list(&prefix, true);
    // Keys of objects (to tell empty directory markers from markers with objects under them).
    let mut objects = std::collections::BTreeSet::new();
    let mut markers = Vec::new();
    let mut listed_any = false;
    while let Some(m) = list.try_next().await.map_err(|e| CpError::store(format!("{}: {e}", r.url()), &e))? {
        listed_any = true;
        if m.key == prefix {
            continue; // the prefix's own marker, listed when it may hold bytes (no name shows them)
        }
        if m.is_prefix() {
            markers.push(m.key);
            continue;
        }
        let rel = m.key.strip_prefix(&prefix).unwrap_or(&m.key);
        if matches!(dst, Side::Local(_)) && !safe_rel(rel) {
            out.skipped.push(unsafe_key(r, &m.key));
            continue;
        }
        let dst = target(dst, name.as_deref(), rel, into_dir)?;
        out.jobs.push(Job { src: Src::Remote { remote: r.with_key(m.key.clone()), size: m.size, head: None }, dst });
        objects.insert(m.key);
    }
    if !listed_any && !prefix.is_empty() {
        // Nothing at or below `dir/`, not even its marker: as missing as `dir` without the
        // slash (exit 3, not "nothing to copy").
        return Err(CpError::NotFound(format!("{}: no such object or prefix", r.url())));
    }
    // An empty directory marker (`dir/`, what a mount's mkdir makes) is made on the other
    // side too: an empty local directory, or a marker object. One with objects under it
    // needs nothing: their copies make the directory.
    for key in markers {
        if objects.range(key.clone()..).next().is_some_and(|k| k.starts_with(&key)) {
            continue;
        }
        let rel = key.strip_prefix(&prefix).unwrap_or(&key).trim_end_matches('/');
        if matches!(dst, Side::Local(_)) && !safe_rel(rel) {
            out.skipped.push(unsafe_key(r, &key));
            continue;
        }
        out.jobs.push(Job { src: Src::Dir, dst: target(dst, name.as_deref(), rel, into_dir)? });
    }
    Ok(())
}
