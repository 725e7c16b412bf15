//! The local temp file a download fills: named beside the destination (renamed over it
//! once verified), sized and allocated before the first byte, written with `O_DIRECT`
//! where the file system allows it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bucketfs_core::block_pool::ALIGN;

use super::super::CpError;

/// A temp file beside `dst`, so a half-written file never has the final name. Its name
/// is the destination's, cut short where needed to stay within 255 bytes (a legal final
/// name of 230 bytes made an illegal temporary one: ENAMETOOLONG).
pub(super) fn temp_path(dst: &Path) -> PathBuf {
    const NAME_MAX: usize = 255;
    let name = dst.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let n =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
    let suffix = format!(".bucketfs-{:x}-{n:x}", std::process::id());
    let mut keep = name.len().min(NAME_MAX - 1 - suffix.len());
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    dst.with_file_name(format!(".{}{suffix}", &name[..keep]))
}

/// The temp file being filled. Where the file system allows it, aligned writes go through
/// a second descriptor opened with `O_DIRECT`: they skip the copy into the page cache,
/// which costs about as much CPU as hashing (much more in a VM that returns freed memory
/// to its host). Unaligned writes (a file's tail) and file systems that refuse it use the
/// page cache.
pub(in crate::cp) struct Target {
    pub(super) file: Arc<File>,
    direct: Option<File>,
}

impl Target {
    pub(in crate::cp) fn open(path: &Path, direct: bool) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        // Read as well as write: the MD5 thread reads back what landed.
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
        let direct = direct
            .then(|| std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path).ok())
            .flatten();
        Ok(Self { file: Arc::new(file), direct })
    }

    /// Give the file its size and, where the file system can, allocate its blocks now:
    /// a disk too small fails here, before any byte is fetched, and `O_DIRECT` writes into
    /// allocated blocks run side by side (ext4 serializes direct writes that must allocate).
    pub(in crate::cp) fn reserve(&self, size: u64) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        self.file.set_len(size)?;
        if size == 0 {
            return Ok(());
        }
        // SAFETY: a plain system call on a descriptor this struct owns.
        let r = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, 0, size as libc::off_t) };
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            _ if r == 0 => Ok(()),
            // The kind stays (StorageFull, QuotaExceeded): the copy's exit status says it.
            Some(libc::ENOSPC | libc::EDQUOT) => Err(std::io::Error::new(
                e.kind(),
                format!("no space for {size} bytes here ({e}); free some space or copy elsewhere"),
            )),
            _ => Ok(()), // not supported here (e.g. some network file systems): stays sparse
        }
    }

    pub(super) fn write_at(&self, data: &[u8], at: u64) -> std::io::Result<()> {
        let aligned = at.is_multiple_of(ALIGN as u64)
            && data.len().is_multiple_of(ALIGN)
            && (data.as_ptr() as usize).is_multiple_of(ALIGN);
        if let Some(d) = self.direct.as_ref().filter(|_| aligned) {
            match d.write_all_at(data, at) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {} // not after all: buffered
                r => return r,
            }
        }
        self.file.write_all_at(data, at)
    }
}

/// [`Target::open`] and [`Target::reserve`] on a blocking thread (allocating can take a
/// while: tmpfs clears the pages, NFS asks its server).
pub(super) async fn open_reserved(tmp: &Path, direct: bool, size: u64) -> Result<Target, CpError> {
    let tmp = tmp.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let file = Target::open(&tmp, direct).map_err(|e| CpError::io(tmp.display(), &e))?;
        let dir = tmp.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        file.reserve(size).map_err(|e| CpError::io(dir.display(), &e))?;
        Ok(file)
    })
    .await
    .map_err(|e| CpError::from(e.to_string()))?
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_temp_name_stays_within_255_bytes() {
        for len in [1, 200, 230, 255] {
            let name = "é".repeat(len / 2) + &"x".repeat(len % 2);
            let t = super::temp_path(&std::path::Path::new("/d").join(&name));
            let tname = t.file_name().unwrap().to_str().unwrap();
            assert!(tname.len() <= 255, "{len}: {} bytes", tname.len());
            assert!(tname.starts_with(&format!(".{}", &name[..name.len().min(20)])), "{tname}");
            assert_eq!(t.parent(), Some(std::path::Path::new("/d")));
        }
    }
}
