//! The core's errors and the single place where any bucketfs error becomes an errno.

use bucketfs_store::{StoreError, StoreErrorKind};

#[derive(Debug, Clone, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("file name too long (over 255 bytes)")]
    NameTooLong,
    #[error("invalid file name")]
    InvalidName,
    #[error("unknown file handle")]
    BadHandle,
    #[error("the object changed in the bucket while open: {0}")]
    Stale(String),
    #[error("read-only file system")]
    ReadOnly,
    #[error("operation not supported")]
    Unsupported,
    #[error("file exists")]
    Exists,
    #[error("directory not empty")]
    NotEmpty,
    #[error("{0}")]
    CrossDevice(String),
    #[error("upload failed, data kept locally: {0}")]
    UploadFailed(Box<FsError>),
    #[error("local staging failed: {0}")]
    Local(String),
    /// The staging disk is full (or the user's quota spent): `ENOSPC`, as a local disk's.
    #[error("the staging disk is full: {0}")]
    NoSpace(String),
    /// The mount process has as many files open as its limit allows (files being written
    /// hold descriptors): `ENFILE`, "too many open files in system", not a bare `EIO`.
    #[error("the mount process has too many files open: {0}")]
    TooManyFiles(String),
    #[error("{0}")]
    Store(#[from] StoreError),
}

impl FsError {
    /// The store did not answer (a timeout, a refused connection; its retries ran out),
    /// as opposed to an answer that refused this one request.
    pub fn store_unreachable(&self) -> bool {
        match self {
            FsError::Store(e) => e.kind == StoreErrorKind::Unavailable,
            FsError::UploadFailed(e) => e.store_unreachable(),
            _ => false,
        }
    }

    /// The one error-to-errno map of bucketfs. docs/SEMANTICS.md lists the same table.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NameTooLong => libc::ENAMETOOLONG,
            FsError::InvalidName => libc::EINVAL,
            FsError::BadHandle => libc::EBADF,
            FsError::Stale(_) => libc::ESTALE,
            FsError::ReadOnly => libc::EROFS,
            FsError::Unsupported => libc::ENOTSUP,
            FsError::Exists => libc::EEXIST,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::CrossDevice(_) => libc::EXDEV,
            FsError::UploadFailed(_) | FsError::Local(_) => libc::EIO,
            FsError::NoSpace(_) => libc::ENOSPC,
            FsError::TooManyFiles(_) => libc::ENFILE,
            FsError::Store(e) => match e.kind {
                StoreErrorKind::NotFound => libc::ENOENT,
                StoreErrorKind::PermissionDenied => libc::EACCES,
                StoreErrorKind::Changed => libc::ESTALE,
                StoreErrorKind::Exists => libc::EEXIST,
                StoreErrorKind::InvalidName => libc::EINVAL,
                StoreErrorKind::Unsupported => libc::ENOTSUP,
                StoreErrorKind::Unavailable => libc::ETIMEDOUT,
                StoreErrorKind::RateLimited | StoreErrorKind::Config | StoreErrorKind::Other => libc::EIO,
            },
        }
    }
}
