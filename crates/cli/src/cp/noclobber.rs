//! `--no-clobber`: a job whose destination already holds the same content is not copied.
//!
//! "The same" is the same size and, where both sides have one, the same MD5: an S3 ETag of
//! a single-request upload (32 hex digits), a GCS `md5Hash`, or a local file's, computed.
//! Where one side has none (an S3 multipart ETag, a filesystem or memory store), the size
//! alone decides, as `aws s3 sync` does. A destination that is missing, of another size or
//! another MD5 is copied over as without the flag.

use std::io::Read;
use std::path::{Path, PathBuf};

use bucketfs_store::{HeadOpts, ObjectHead, StoreErrorKind};
use md5::{Digest, Md5};

use super::endpoint::{Kind, Remote};
use super::plan::{Dst, Job, Src};
use super::{CpError, Ctx};

/// What a skipped job's [`super::Report`] says it was verified by (the `--json` summary
/// counts these under this name).
pub const UNCHANGED: &str = "unchanged-no-clobber";

/// Whether `job`'s destination already holds what its source would put there.
pub async fn unchanged(ctx: &Ctx, job: &Job) -> Result<bool, CpError> {
    let Some(size) = job.size() else { return Ok(false) }; // stdin: unknown until read
    match (&job.src, &job.dst) {
        (Src::Dir | Src::Unreadable { .. }, _) | (_, Dst::Stdout) => Ok(false),
        (Src::Local { path, .. }, Dst::Remote(r)) => match digests(ctx, r).await? {
            Some(d) if d.meta.size == size => same_as_file(md5_of(r.kind, &d), path).await,
            _ => Ok(false),
        },
        (Src::Remote { remote, head, .. }, Dst::Local(path)) => {
            match std::fs::metadata(path) {
                Ok(m) if m.is_file() && m.len() == size => {}
                _ => return Ok(false),
            }
            same_as_file(source_md5(ctx, remote, head.as_deref()).await?, path).await
        }
        (Src::Remote { remote, head, .. }, Dst::Remote(r)) => {
            let Some(dst) = digests(ctx, r).await? else { return Ok(false) };
            if dst.meta.size != size {
                return Ok(false);
            }
            match (source_md5(ctx, remote, head.as_deref()).await?, md5_of(r.kind, &dst)) {
                (Some(a), Some(b)) => Ok(a == b),
                _ => Ok(true),
            }
        }
        _ => Ok(false),
    }
}

/// The object's digests, `None` if it does not exist.
async fn digests(ctx: &Ctx, r: &Remote) -> Result<Option<ObjectHead>, CpError> {
    let _slot = ctx.slot().await;
    let mut attempt = 0;
    loop {
        match r.store.head(&r.key, HeadOpts { digests: true, ..Default::default() }).await {
            Ok(d) => return Ok(Some(d)),
            Err(e) if e.kind == StoreErrorKind::NotFound => return Ok(None),
            Err(e) => super::again(ctx, "head", &r.key, &mut attempt, e).await?,
        }
    }
}

/// The source object's MD5: from the planner's HEAD where it made one, else a HEAD now.
async fn source_md5(ctx: &Ctx, remote: &Remote, head: Option<&ObjectHead>) -> Result<Option<[u8; 16]>, CpError> {
    let fetched = match head {
        Some(_) => None,
        None => digests(ctx, remote).await?,
    };
    Ok(head.or(fetched.as_ref()).and_then(|d| md5_of(remote.kind, d)))
}

/// The whole content's MD5, where the store says it.
fn md5_of(kind: Kind, d: &ObjectHead) -> Option<[u8; 16]> {
    d.md5.or_else(|| {
        let etag = d.etag.as_deref().filter(|e| kind == Kind::S3 && e.len() == 32)?;
        let mut out = [0u8; 16];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(etag.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(out)
    })
}

/// Whether the file at `path` has MD5 `want`; with no MD5 to compare, the size (already
/// equal) decides.
async fn same_as_file(want: Option<[u8; 16]>, path: &Path) -> Result<bool, CpError> {
    let Some(want) = want else { return Ok(true) };
    let p: PathBuf = path.to_path_buf();
    let got = tokio::task::spawn_blocking(move || -> std::io::Result<[u8; 16]> {
        let mut f = std::fs::File::open(&p)?;
        let mut h = Md5::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match f.read(&mut buf)? {
                0 => return Ok(h.finalize().into()),
                n => h.update(&buf[..n]),
            }
        }
    })
    .await
    .map_err(|e| format!("md5: {e}"))?
    .map_err(|e| CpError::io(path.display(), &e))?;
    Ok(got == want)
}
