//! Why a copy failed, as far as a caller acts on it, and the exit status each case gives.
//!
//! Every case keeps the human message (what was wrong and what to do); the case says which
//! kind of failure it was, so a script can tell "the source is not there" from "the disk
//! is full" by the exit status alone. [`CpError::exit_code`] is the one map from cases to
//! statuses, and [`EXIT_CODES`] is its documentation (printed by `bucketfs cp --help`).
//! Errors are classified where they arise: a store's error by its kind
//! ([`CpError::store`]), a local file's by its errno ([`CpError::io`]); anything else is
//! [`CpError::Failed`].

use std::fmt;

use bucketfs_store::{StoreError, StoreErrorKind};

/// A failed copy (or a failed `cp` before any copy started).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpError {
    /// The source object, prefix or file does not exist.
    NotFound(String),
    /// The store refused access, or a local path cannot be read or written (EACCES,
    /// EPERM, a read-only file system).
    Permission(String),
    /// The source changed during the copy (a local file written to, an object replaced).
    Changed(String),
    /// No space left for the destination (ENOSPC, EDQUOT).
    DiskFull(String),
    /// The bytes did not match the checksum the source or destination reports, on every
    /// attempt.
    Mismatch(String),
    /// Cancelled by SIGINT, SIGTERM or SIGHUP.
    Interrupted(String),
    /// Anything else: a bad argument, a network or store failure after the retries.
    Failed(String),
}

/// Exit status when everything that was copied was copied but something asked for was
/// skipped (as `aws s3 cp`'s 2).
pub const EXIT_SKIPPED: u8 = 2;

/// The exit statuses of `bucketfs cp`, as `--help` prints them; kept beside
/// [`CpError::exit_code`], which a unit test checks it against.
pub const EXIT_CODES: &str = "\
Exit status:
  0    everything asked for was copied (or skipped with --skip-special, or unchanged
       with --no-clobber)
  1    a copy failed for another reason (a bad argument, a network or store error after
       the retries)
  2    something was skipped (see above) and everything else was copied
  3    not found: a source object, prefix or file does not exist
  4    permission denied: the store refused access, or a local path cannot be read or
       written (including a read-only file system)
  5    the source changed during the copy (a local file written to, an object replaced)
  6    no space left on the destination's disk (or quota exceeded)
  7    checksum mismatch on every attempt: the bytes are not what the store reports
  130  interrupted (SIGINT, SIGTERM or SIGHUP); partial files are removed, uploads aborted
When several copies fail, the status is their common one, or 1 if they differ.";

impl CpError {
    /// The process exit status for this error: the one map from cases to statuses.
    pub fn exit_code(&self) -> u8 {
        match self {
            CpError::Failed(_) => 1,
            CpError::NotFound(_) => 3,
            CpError::Permission(_) => 4,
            CpError::Changed(_) => 5,
            CpError::DiskFull(_) => 6,
            CpError::Mismatch(_) => 7,
            CpError::Interrupted(_) => 130,
        }
    }

    /// The message, whatever the case.
    pub fn message(&self) -> &str {
        self.parts().1
    }

    fn parts(&self) -> (fn(String) -> CpError, &str) {
        match self {
            CpError::NotFound(m) => (CpError::NotFound, m),
            CpError::Permission(m) => (CpError::Permission, m),
            CpError::Changed(m) => (CpError::Changed, m),
            CpError::DiskFull(m) => (CpError::DiskFull, m),
            CpError::Mismatch(m) => (CpError::Mismatch, m),
            CpError::Interrupted(m) => (CpError::Interrupted, m),
            CpError::Failed(m) => (CpError::Failed, m),
        }
    }

    /// The same case with `prefix: ` before its message.
    pub fn context(self, prefix: impl fmt::Display) -> Self {
        let (case, msg) = self.parts();
        case(format!("{prefix}: {msg}"))
    }

    /// The same case with message `msg` instead.
    pub fn with_message(&self, msg: String) -> Self {
        (self.parts().0)(msg)
    }

    /// A local I/O error on `what` (a path, or what was being done), classified by errno.
    pub fn io(what: impl fmt::Display, e: &std::io::Error) -> Self {
        Self::io_msg(format!("{what}: {e}"), e)
    }

    /// A local I/O error `e` with message `msg` (which names it), classified by errno.
    pub fn io_msg(msg: String, e: &std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        match (e.kind(), e.raw_os_error()) {
            (_, Some(libc::ENOSPC | libc::EDQUOT)) | (K::StorageFull | K::QuotaExceeded, _) => CpError::DiskFull(msg),
            (_, Some(libc::EACCES | libc::EPERM | libc::EROFS)) | (K::PermissionDenied | K::ReadOnlyFilesystem, _) => {
                CpError::Permission(msg)
            }
            (K::NotFound, _) => CpError::NotFound(msg),
            _ => CpError::Failed(msg),
        }
    }

    /// A store's error `e`, with message `msg` (which says what failed, usually naming `e`),
    /// classified by its kind.
    pub fn store(msg: String, e: &StoreError) -> Self {
        let msg = format!("{msg}{}", hint(e));
        match e.kind {
            StoreErrorKind::NotFound => CpError::NotFound(msg),
            StoreErrorKind::PermissionDenied => CpError::Permission(msg),
            StoreErrorKind::Changed => CpError::Changed(msg),
            // The S3 store's wording for a body the server refused as corrupted, or whose
            // checksum it confirmed differently (`s3::checksum`), after its retries.
            _ if e.message.contains("crc32c mismatch: ") => CpError::Mismatch(msg),
            _ => CpError::Failed(msg),
        }
    }

    /// The copy was cancelled.
    pub fn interrupted() -> Self {
        CpError::Interrupted(INTERRUPTED.into())
    }

    /// One error for several failed copies: their common case, else [`CpError::Failed`].
    pub fn several(errors: &[CpError], msg: String) -> Self {
        let code = errors.first().map(CpError::exit_code);
        match errors.first() {
            Some(e) if errors.iter().all(|x| Some(x.exit_code()) == code) => e.with_message(msg),
            _ => CpError::Failed(msg),
        }
    }
}

/// What to do about a store error whose cause the store named (a missing bucket, refused
/// credentials), appended to its message; empty otherwise.
fn hint(e: &StoreError) -> &'static str {
    let said = |codes: &[&str]| codes.iter().any(|c| e.message.contains(c));
    // A listing finds no prefix empty, never missing: only its bucket can be.
    let missing_list = e.kind == StoreErrorKind::NotFound && e.message.starts_with("list ");
    if missing_list || said(&["NoSuchBucket", "The specified bucket does not exist"]) {
        "; check the bucket's name, or create the bucket"
    } else if said(&["SignatureDoesNotMatch", "InvalidAccessKeyId"]) {
        "; check the credentials (S3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or --profile)"
    } else if e.kind == StoreErrorKind::Unavailable {
        "; check the network, and the endpoint (--endpoint) if one is given"
    } else if e.kind == StoreErrorKind::PermissionDenied {
        // A HEAD's 403 has no body to name the cause: wrong keys, or keys without access.
        "; the store refused access: check the credentials (S3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, \
         or --profile; GCS: GOOGLE_APPLICATION_CREDENTIALS) and that they may use this bucket"
    } else {
        ""
    }
}

/// The message of a copy stopped by SIGINT, SIGTERM or SIGHUP.
const INTERRUPTED: &str = "interrupted";

impl fmt::Display for CpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for CpError {}

/// A message alone is a [`CpError::Failed`].
impl From<String> for CpError {
    fn from(msg: String) -> Self {
        CpError::Failed(msg)
    }
}

impl From<&str> for CpError {
    fn from(msg: &str) -> Self {
        CpError::Failed(msg.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<CpError> {
        let m = || "m".to_string();
        vec![
            CpError::Failed(m()),
            CpError::NotFound(m()),
            CpError::Permission(m()),
            CpError::Changed(m()),
            CpError::DiskFull(m()),
            CpError::Mismatch(m()),
            CpError::Interrupted(m()),
        ]
    }

    #[test]
    fn each_case_has_its_own_status_and_help_documents_it() {
        let codes: Vec<u8> = all().iter().map(CpError::exit_code).collect();
        let mut distinct = codes.clone();
        distinct.push(EXIT_SKIPPED);
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), codes.len() + 1, "codes overlap: {codes:?}");
        assert!(!codes.contains(&0));
        for code in codes.into_iter().chain([EXIT_SKIPPED]) {
            assert!(EXIT_CODES.lines().any(|l| l.trim_start().starts_with(&format!("{code} "))), "{code} undocumented");
        }
    }

    #[test]
    fn local_errors_are_classified_by_errno() {
        let io = |errno| CpError::io("/x", &std::io::Error::from_raw_os_error(errno)).exit_code();
        assert_eq!(io(libc::ENOENT), 3);
        assert_eq!(io(libc::EACCES), 4);
        assert_eq!(io(libc::EPERM), 4);
        assert_eq!(io(libc::EROFS), 4);
        assert_eq!(io(libc::ENOSPC), 6);
        assert_eq!(io(libc::EDQUOT), 6);
        assert_eq!(io(libc::EIO), 1);
        // A message made for the user keeps the kind it was made from.
        let e = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let wrapped = std::io::Error::new(e.kind(), format!("no space here ({e}); free some space"));
        assert_eq!(CpError::io("/d", &wrapped), CpError::DiskFull(format!("/d: {wrapped}")));
    }

    #[test]
    fn store_errors_are_classified_by_kind() {
        let st = |kind| CpError::store("m".into(), &StoreError::new(kind, "x")).exit_code();
        assert_eq!(st(StoreErrorKind::NotFound), 3);
        assert_eq!(st(StoreErrorKind::PermissionDenied), 4);
        assert_eq!(st(StoreErrorKind::Changed), 5);
        assert_eq!(st(StoreErrorKind::Other), 1);
        // A body S3 refused as corrupted on every attempt is a checksum mismatch.
        let e = StoreError::new(StoreErrorKind::Other, "write: crc32c mismatch: the server refused the body");
        assert_eq!(CpError::store("m".into(), &e).exit_code(), 7);
        // What the store named gets a hint the user can act on; the kind is kept.
        let e = StoreError::new(StoreErrorKind::NotFound, "list \"k/\": ConfigInvalid (NoSuchBucket: gone)");
        let got = CpError::store("s3://b/k".into(), &e);
        assert_eq!(got.exit_code(), 3);
        assert!(got.to_string().ends_with("check the bucket's name, or create the bucket"), "{got}");
        let e = StoreError::new(StoreErrorKind::PermissionDenied, "PermissionDenied (SignatureDoesNotMatch: no)");
        assert!(CpError::store("m".into(), &e).to_string().contains("AWS_SECRET_ACCESS_KEY"));
        assert_eq!(CpError::store("m".into(), &StoreError::new(StoreErrorKind::Other, "x")).to_string(), "m");
    }

    #[test]
    fn context_keeps_the_case_and_several_keep_a_common_one() {
        let e = CpError::NotFound("no such key".into()).context("s3://b/k");
        assert_eq!(e, CpError::NotFound("s3://b/k: no such key".into()));
        assert_eq!(e.to_string(), "s3://b/k: no such key");
        let two = [CpError::DiskFull("a".into()), CpError::DiskFull("b".into())];
        assert_eq!(CpError::several(&two, "2 failed".into()), CpError::DiskFull("2 failed".into()));
        let mixed = [CpError::DiskFull("a".into()), CpError::NotFound("b".into())];
        assert_eq!(CpError::several(&mixed, "2 failed".into()).exit_code(), 1);
        assert_eq!(CpError::from("x".to_string()).exit_code(), 1);
    }
}
