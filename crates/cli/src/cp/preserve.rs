//! `-P/--preserve`: a file's mode and modification time travel with the copy, in the object
//! metadata keys the mount reads and writes (`mode`, octal with the file type bits, and
//! `mtime`, seconds with a fraction: rclone's and s3fs's keys, see `bucketfs_store::attrs`).
//! An upload stores them; a download sets them on the local file from the object's. Owner
//! and group are not copied (a uid means nothing on another machine). Stores without user
//! metadata (a local folder, Drive) keep none.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use bucketfs_store::{FileAttrs, HeadOpts};

use super::endpoint::Remote;
use super::CpError;

/// The mode and mtime of a local file, as an upload keeps them.
pub fn local_attrs(path: &Path) -> FileAttrs {
    match std::fs::metadata(path) {
        Ok(m) => FileAttrs { mode: Some(m.mode()), mtime: m.modified().ok(), ..FileAttrs::default() },
        Err(_) => FileAttrs::default(),
    }
}

/// Give the downloaded file at `path` the mode and mtime the object carries, if any.
pub async fn apply_to_local(remote: &Remote, path: &Path) -> Result<(), CpError> {
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return Ok(()); // a device or a FIFO written into (`--preserve` to /dev/null): left as it is
    }
    let head = remote.store.head(&remote.key, HeadOpts::default()).await;
    let attrs = head.map_err(|e| CpError::store(format!("{}: {e}", remote.url()), &e))?.attrs;
    let what = |e: std::io::Error| CpError::io(format_args!("{}: keeping mode and mtime", path.display()), &e);
    if let Some(t) = attrs.mtime {
        set_mtime(path, t).map_err(what)?;
    }
    if let Some(mode) = attrs.mode {
        // Permission bits only: setuid, setgid and sticky from an object's metadata (anyone
        // who can write the bucket sets them) are dropped, as cp -p does without ownership.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o777)).map_err(what)?;
    }
    Ok(())
}

/// Set `path`'s mtime (its atime left as is) by path: no open, so a file whose mode lets
/// nobody write it (a read-only file copied over, `-p` of a 0444 object) still gets it.
fn set_mtime(path: &Path, t: std::time::SystemTime) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let (sec, nsec) = match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos() as i64),
        Err(e) => {
            let d = e.duration();
            let (s, n) = (d.as_secs() as i64, d.subsec_nanos() as i64);
            if n == 0 {
                (-s, 0)
            } else {
                (-s - 1, 1_000_000_000 - n)
            }
        }
    };
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let times = [
        libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
        libc::timespec { tv_sec: sec as libc::time_t, tv_nsec: nsec as _ },
    ];
    // SAFETY: a valid C string and two timespecs, as utimensat(2) takes.
    if unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
