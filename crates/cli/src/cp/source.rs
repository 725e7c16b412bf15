//! A local file being uploaded, watched for changes while it is read.
//!
//! A copy must be one version of the file. [`LocalSource::open`] takes the file's `fstat`
//! before the first read (size, mtime, ctime, device and inode); reads never go past that
//! size, and a read that ends before it means the file was truncated. [`LocalSource::finish`],
//! after the last read and before the upload is completed, checks that no byte follows the
//! size seen at the start, that `fstat` still says the same, and that the path still names
//! the same file. Any difference is a [`Changed`], which fails the copy: the upload is then
//! aborted, so no object claims to be a copy of a file it is not.
//!
//! Timestamps are as fine as the file system keeps them (for ext4 on most kernels, a clock
//! tick of a few milliseconds): a write that keeps the size and falls within the tick of
//! the first `fstat` is not seen. Stdin is a stream and has no such check.

use std::fmt;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use bucketfs_core::block_pool::read_full;

/// What `fstat` says about a file, for telling two moments apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    dev: u64,
    ino: u64,
}

impl Stat {
    fn of(m: &std::fs::Metadata) -> Self {
        Self {
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

/// How a source differed between the start and the end of reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A read ended at `got` bytes, before the `size` it had at the start; `now`: its
    /// size then, if `fstat` said.
    Truncated { size: u64, got: u64, now: Option<u64> },
    /// There were bytes past the `size` it had at the start.
    Grew { size: u64 },
    /// `fstat` gave another size after the last read.
    Size { before: u64, after: u64 },
    /// Written to: a new modification time.
    Modified,
    /// A new status-change time (a write, a truncation, chmod, a link...).
    StatusChanged,
    /// The path now names another file (replaced, for example renamed over).
    Replaced,
    /// The path no longer names any file.
    Removed,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Truncated { size, got, now } => {
                write!(f, "it ended after {got} of the {size} bytes it had when the copy started")?;
                match now {
                    Some(now) => write!(f, " and has {now} now: truncated"),
                    None => write!(f, ": truncated"),
                }
            }
            Change::Grew { size } => write!(f, "it grew past the {size} bytes it had when the copy started"),
            Change::Size { before, after } => write!(f, "its size went from {before} to {after} bytes"),
            Change::Modified => write!(f, "its modification time changed: it was written to"),
            Change::StatusChanged => write!(f, "its change time (ctime) moved: it was written to or altered"),
            Change::Replaced => write!(f, "its path now names another file: it was replaced"),
            Change::Removed => write!(f, "it was removed"),
        }
    }
}

/// A local source that changed while it was read: the copy is not one version of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    pub path: PathBuf,
    pub change: Change,
}

impl fmt::Display for Changed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} changed during the copy ({}), so the copy was abandoned and the destination left \
             as it was. Copy it again once nothing is writing to it, or copy a snapshot of it",
            self.path.display(),
            self.change
        )
    }
}

impl std::error::Error for Changed {}

/// Why reading a local source failed.
#[derive(Debug)]
pub enum SourceError {
    Io { path: PathBuf, err: std::io::Error },
    Changed(Changed),
}

impl From<SourceError> for super::CpError {
    fn from(e: SourceError) -> Self {
        match &e {
            SourceError::Io { err, .. } => Self::io_msg(e.to_string(), err),
            SourceError::Changed(_) => Self::Changed(e.to_string()),
        }
    }
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceError::Io { path, err } => write!(f, "reading {}: {err}", path.display()),
            SourceError::Changed(c) => c.fmt(f),
        }
    }
}

impl std::error::Error for SourceError {}

/// An open local file and what it was when opened.
pub struct LocalSource {
    file: File,
    path: PathBuf,
    start: Stat,
    /// Bytes read so far.
    read: u64,
}

impl LocalSource {
    /// Open `path` and take its `fstat` before any byte is read.
    pub fn open(path: &Path) -> Result<Self, SourceError> {
        let io = |err| SourceError::Io { path: path.to_path_buf(), err };
        let file = File::open(path).map_err(io)?;
        let start = Stat::of(&file.metadata().map_err(io)?);
        Ok(Self { file, path: path.to_path_buf(), start, read: 0 })
    }

    /// Open `path` for another attempt at copying what an earlier attempt opened as `first`:
    /// the path must still name that file, unchanged, or the attempts would send two
    /// versions (a file renamed over between them would be copied in its place).
    pub fn reopen(path: &Path, first: &Stat) -> Result<Self, SourceError> {
        let s = Self::open(path)?;
        if (s.start.dev, s.start.ino) != (first.dev, first.ino) {
            return Err(s.changed(Change::Replaced));
        }
        match difference(first, &s.start) {
            Some(change) => Err(s.changed(change)),
            None => Ok(s),
        }
    }

    /// What the file was when opened.
    pub fn stat(&self) -> &Stat {
        &self.start
    }

    fn truncated(&self) -> SourceError {
        let now = self.file.metadata().ok().map(|m| m.size());
        self.changed(Change::Truncated { size: self.start.size, got: self.read, now })
    }

    fn changed(&self, change: Change) -> SourceError {
        SourceError::Changed(Changed { path: self.path.clone(), change })
    }

    fn io(&self, err: std::io::Error) -> SourceError {
        SourceError::Io { path: self.path.clone(), err }
    }

    /// Bytes left of the size the file had when opened.
    pub fn remaining(&self) -> u64 {
        self.start.size.saturating_sub(self.read)
    }

    /// Fill `buf` (at most [`Self::remaining`] bytes of it) with the next bytes. A file that
    /// ends sooner was truncated while being read: that is an error, not a short copy.
    pub fn read_into(&mut self, buf: &mut [u8]) -> Result<usize, SourceError> {
        let want = usize::try_from(self.remaining()).unwrap_or(usize::MAX).min(buf.len());
        let n = read_full(&mut self.file, &mut buf[..want]).map_err(|e| self.io(e))?;
        self.read += n as u64;
        if n < want {
            return Err(self.truncated());
        }
        Ok(n)
    }

    /// After the last read, before the copy is committed: nothing past the size seen at the
    /// start, the same `fstat`, and the path still naming this file.
    pub fn finish(&mut self) -> Result<(), SourceError> {
        if self.remaining() > 0 {
            return Err(self.truncated());
        }
        let mut probe = [0u8; 1];
        if read_full(&mut self.file, &mut probe).map_err(|e| self.io(e))? > 0 {
            return Err(self.changed(Change::Grew { size: self.start.size }));
        }
        let now = Stat::of(&self.file.metadata().map_err(|e| self.io(e))?);
        // The path first: replacing or removing the file also moves its ctime, and "it was
        // replaced" says more.
        match std::fs::metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) == (self.start.dev, self.start.ino) => {}
            Ok(_) => return Err(self.changed(Change::Replaced)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(self.changed(Change::Removed)),
            Err(e) => return Err(self.io(e)),
        }
        match difference(&self.start, &now) {
            Some(change) => Err(self.changed(change)),
            None => Ok(()),
        }
    }
}

/// The first way `after` differs from `before`, if any (the same open file, so its identity
/// cannot differ).
fn difference(before: &Stat, after: &Stat) -> Option<Change> {
    if after.size != before.size {
        Some(Change::Size { before: before.size, after: after.size })
    } else if after.mtime != before.mtime {
        Some(Change::Modified)
    } else if after.ctime != before.ctime {
        Some(Change::StatusChanged)
    } else {
        None
    }
}
