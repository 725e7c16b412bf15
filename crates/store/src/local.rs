//! The local folder (`file://`): what OpenDAL's fs service does not do, a version's
//! identity and reads pinned to it.
//!
//! A local file has no ETag. Size and mtime alone named a version until a rename showed
//! their limit: a rename keeps the mtime, so a file renamed over another of the same size
//! and mtime (a `cp -p` copy, two files written in one clock tick) was taken for the file
//! it replaced, and the caches served the replaced file's bytes under the new name. The
//! inode tells two files apart, and the ctime one file's states: a rename moves it (the
//! bytes are read again under the new name, a small cost on a local disk), and so does a
//! rewrite in place with size and mtime put back (`cp -p` over an existing file). A read
//! pinned to a version opens the file and checks that the file it opened is that version
//! before reading from it, as S3's `If-Match` is checked.

use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use futures::StreamExt;

use crate::{ByteStream, ObjectMeta, StoreError, StoreErrorKind};

/// Bytes per read of a pinned stream.
const CHUNK: u64 = 1 << 20;

/// The identity of the version `md` describes: its inode, size, mtime and ctime. Never 32
/// hex digits (it is not taken for an MD5: [`ObjectMeta::etag_md5`]).
pub(crate) fn tag(md: &std::fs::Metadata) -> String {
    let (m, c) = ((md.mtime(), md.mtime_nsec()), (md.ctime(), md.ctime_nsec()));
    format!("fs-{:x}-{}-{}.{:09}-{}.{:09}", md.ino(), md.len(), m.0, m.1, c.0, c.1)
}

/// Where uploads to the folder `root` are written before they are renamed into place (a
/// sibling, so on the same filesystem as a rule): a half-written file is never seen.
pub fn temp_dir(root: &Path) -> PathBuf {
    match (root.parent(), root.file_name()) {
        (Some(parent), Some(name)) => parent.join(format!(".{}.bucketfs-tmp", name.to_string_lossy())),
        _ => std::env::temp_dir().join("bucketfs-atomic"),
    }
}

/// The path of `key` in the folder `root`.
pub(crate) fn path_of(root: &Path, key: &str) -> PathBuf {
    root.join(key.trim_start_matches('/'))
}

/// A fresh name for a copy to `to` being made in the folder `root`, below the folder's own
/// parts directory (`.bucketfs-parts/`, never listed, a name the mount refuses as a
/// directory): on the same filesystem as every file of the folder, so it can be renamed
/// into place. Where something else holds that name (a file of the folder named
/// `.bucketfs-parts`, an ordinary name), a hidden name beside `to` instead,
/// `.<name>.bucketfs-copy-…`, which a listing meanwhile shows (every rename in the folder
/// failed with `EIO` before; a copy made in place kept the replaced file's attributes and
/// cut it short on a failure).
pub(crate) fn copy_key(root: &Path, to: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let unique = format!("copy-{}-{}-{nanos:x}", std::process::id(), NEXT.fetch_add(1, Relaxed));
    let parts = crate::gcs::compose::PARTS_PREFIX;
    match std::fs::symlink_metadata(path_of(root, parts.trim_end_matches('/'))) {
        Ok(md) if !md.is_dir() => {
            let (dir, name) = to.split_at(to.rfind('/').map_or(0, |i| i + 1));
            // Short enough for any file system's name limit (255 bytes).
            let mut end = name.len().min(160);
            while !name.is_char_boundary(end) {
                end -= 1;
            }
            format!("{dir}.{}.bucketfs-{unique}", &name[..end])
        }
        _ => format!("{parts}{unique}"),
    }
}

/// A copy made at `tmp` (OpenDAL's copy: the bytes and the `user.*` attributes the mount
/// keeps there) takes `mtime` and is renamed to `to` (paths in the folder `root`): a new
/// file, never the replaced one rewritten in place, so whoever holds that one keeps its
/// bytes, and the copy is a new version. The times are set through a read-only
/// descriptor: a copy of a read-only file (`.git/objects`) is read-only too.
pub(crate) fn finish_copy(root: &Path, tmp: &str, to: &str, mtime: Option<SystemTime>) -> std::io::Result<()> {
    let (tmp, dst) = (path_of(root, tmp), path_of(root, to));
    let done = (|| {
        if let Some(mtime) = mtime {
            std::fs::File::open(&tmp)?.set_modified(mtime)?;
        }
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::rename(&tmp, &dst)
    })();
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// `meta` (a file's, from OpenDAL) takes the identity of the file at `root`/`meta.key`,
/// with the size and mtime of the same `lstat`, so that the three describe one version.
/// Left as it is where no regular file is there now (gone, a directory, a link).
pub(crate) fn identify(root: &Path, meta: &mut ObjectMeta) {
    if meta.is_prefix() || meta.key.is_empty() {
        return;
    }
    match std::fs::symlink_metadata(path_of(root, &meta.key)) {
        Ok(md) if md.is_file() => {
            meta.size = md.len();
            meta.mtime = md.modified().ok().or(meta.mtime);
            meta.etag = Some(tag(&md));
        }
        _ => {}
    }
}

/// The bytes of `range` of the file at `path` (key `key`), of version `tag` only: another
/// version there (replaced, rewritten) answers [`StoreErrorKind::Changed`], as a read with
/// `If-Match` does. The bytes come from the file opened and checked, whatever its name
/// leads to later. A file cut short in place while read answers `Changed` too.
pub(crate) async fn read_pinned(
    path: &Path,
    key: &str,
    tag: &str,
    range: Range<u64>,
) -> Result<ByteStream, StoreError> {
    let path = path.to_path_buf();
    let file = tokio::task::spawn_blocking(move || {
        let f = std::fs::File::open(&path)?;
        let md = f.metadata()?;
        Ok::<_, std::io::Error>((f, md))
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    let (file, md) = file.map_err(|e| io(key, e))?;
    if tag != self::tag(&md) {
        return Err(changed(key));
    }
    let (file, key) = (Arc::new(file), key.to_string());
    let chunks = futures::stream::try_unfold(range.start, move |at| {
        let (file, key, end) = (file.clone(), key.clone(), range.end);
        async move {
            if at >= end {
                return Ok(None);
            }
            let len = (end - at).min(CHUNK) as usize;
            let read = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0; len];
                file.read_exact_at(&mut buf, at).map(|()| buf)
            })
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            match read {
                Ok(buf) => Ok(Some((Bytes::from(buf), at + len as u64))),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(changed(&key)),
                Err(e) => Err(io(&key, e)),
            }
        }
    });
    Ok(chunks.boxed())
}

fn io(key: &str, e: std::io::Error) -> StoreError {
    let kind = match e.kind() {
        // Below a folder replaced by a file: no object there, as a 404 (else EIO, not ESTALE).
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => StoreErrorKind::NotFound,
        std::io::ErrorKind::PermissionDenied => StoreErrorKind::PermissionDenied,
        _ => StoreErrorKind::Other,
    };
    StoreError::new(kind, format!("get {key:?}: {e}"))
}

fn changed(key: &str) -> StoreError {
    StoreError::new(StoreErrorKind::Changed, format!("get {key:?}: another version now"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(key: &str) -> ObjectMeta {
        ObjectMeta { key: key.into(), ..Default::default() }
    }

    #[test]
    fn files_of_one_size_and_mtime_renamed_or_rewritten_are_other_versions() {
        let dir = std::env::temp_dir().join(format!("bucketfs-local-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::write(&a, b"one").unwrap();
        std::fs::write(&b, b"two").unwrap();
        let when = std::fs::metadata(&a).unwrap().modified().unwrap();
        std::fs::File::options().write(true).open(&b).unwrap().set_modified(when).unwrap();
        let tag_of = |name: &str| {
            let mut m = meta(name);
            identify(&dir, &mut m);
            m
        };
        let (ma, mb) = (tag_of("a"), tag_of("b"));
        assert_eq!((ma.size, ma.mtime), (mb.size, mb.mtime), "same size and mtime");
        assert_ne!(ma.etag, mb.etag);
        assert!(ma.etag_md5().is_none());
        // `b` renamed over `a`: never taken for the replaced `a`.
        std::fs::rename(&b, &a).unwrap();
        let renamed = tag_of("a");
        assert_ne!(renamed.etag, ma.etag);
        // Rewritten in place with its mtime put back: another version.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&a, b"new").unwrap();
        std::fs::File::options().write(true).open(&a).unwrap().set_modified(when).unwrap();
        let rewritten = tag_of("a");
        assert_eq!((rewritten.size, rewritten.mtime), (renamed.size, renamed.mtime));
        assert_ne!(rewritten.etag, renamed.etag);
        // A name gone stays as OpenDAL told it.
        assert_eq!(tag_of("b").etag, None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
