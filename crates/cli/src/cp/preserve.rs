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
    let head = remote.store.head(&remote.key, HeadOpts::default()).await;
    let attrs = head.map_err(|e| CpError::store(format!("{}: {e}", remote.url()), &e))?.attrs;
    let what = |e: std::io::Error| CpError::io(format_args!("{}: keeping mode and mtime", path.display()), &e);
    // The time first: a mode without write permission would stop the open for it.
    if let Some(t) = attrs.mtime {
        std::fs::File::options().write(true).open(path).and_then(|f| f.set_modified(t)).map_err(what)?;
    }
    if let Some(mode) = attrs.mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7777)).map_err(what)?;
    }
    Ok(())
}
