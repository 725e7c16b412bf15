//! What `cp` takes from a local path: one file, or with `-r` a tree, and what it skips.
//!
//! Like `aws s3 cp`: symlinks are followed, to files and to directories (inside the tree or
//! not), unless `--no-follow-symlinks`; a directory symlink that leads back to a directory
//! on the path walked so far is a loop and skipped, as is a dangling symlink. FIFOs,
//! sockets and devices are never opened (a FIFO's reader would wait for a writer, a device
//! may never end): skipped. A directory with nothing copied from it is copied as itself, a
//! marker object `dir/`, so it exists on the destination (and in a bucketfs mount).
//!
//! Every skip is a [`Skipped`]: `cp` names each on stderr, lists them in `--json` and exits
//! with status 2 unless `--skip-special`. Nothing is skipped without a word.

use std::fmt;
use std::fs::{FileType, Metadata};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::endpoint::Side;
use super::error::CpError;
use super::plan::{target, Job, Src};

/// How to walk local sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walk {
    /// `-r`: directories are copied with everything in them.
    pub recursive: bool,
    /// Symlinks are followed (the default); without, each is skipped.
    pub follow_symlinks: bool,
}

/// Why a path was not copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    /// A file type none of the above (there are none on Linux today).
    OtherType,
    /// A symlink to nothing.
    Dangling {
        target: PathBuf,
    },
    /// A symlink to a directory that contains it (`ancestor`, on the path walked so far).
    Loop {
        ancestor: PathBuf,
    },
    /// A symlink whose resolution loops (ELOOP), like `a -> b -> a`.
    TooManyLinks,
    /// A directory that is one of its own ancestors without a symlink (a bind mount).
    DirLoop {
        ancestor: PathBuf,
    },
    /// `--no-follow-symlinks`.
    NotFollowed {
        target: PathBuf,
    },
    /// A key whose part below the copied prefix is not a safe local path (an empty, `.`
    /// or `..` segment, as in `a//b` or `../x`): never written, so never outside the
    /// destination.
    UnsafeKey,
    /// A key the store would change (whitespace at the start or end of a name, an empty
    /// segment, a leading `/`; on S3, a control character its listings cannot carry):
    /// never written, since it would land on another name (`x ` on `x`) or never be
    /// listed, nor read, since the request would read another object.
    UnaddressableKey,
    /// A name ending in `__XLDIR__` on S3 or GCS: MinIO keeps a directory marker `x/` as
    /// `x__XLDIR__`, so the file would become the empty directory `x`, its bytes hidden.
    MarkerName,
    /// A local name that is not UTF-8, which an object key must be: converted, two such
    /// names became one key, one file lost (tester Q).
    NotUtf8,
}

impl SkipReason {
    fn of_type(ft: FileType) -> Self {
        if ft.is_fifo() {
            SkipReason::Fifo
        } else if ft.is_socket() {
            SkipReason::Socket
        } else if ft.is_char_device() {
            SkipReason::CharDevice
        } else if ft.is_block_device() {
            SkipReason::BlockDevice
        } else {
            SkipReason::OtherType
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::Fifo => write!(f, "a FIFO (named pipe), not a regular file; never read (stream one with '-')"),
            SkipReason::Socket => write!(f, "a socket, not a regular file"),
            SkipReason::CharDevice => write!(f, "a character device, not a regular file"),
            SkipReason::BlockDevice => write!(f, "a block device, not a regular file"),
            SkipReason::OtherType => write!(f, "not a regular file, directory or symlink"),
            SkipReason::Dangling { target } => {
                write!(f, "dangling symlink (to {}, which does not exist)", target.display())
            }
            SkipReason::Loop { ancestor } => {
                write!(f, "symlink loop (leads back to {}, which contains it)", ancestor.display())
            }
            SkipReason::TooManyLinks => write!(f, "symlink loop (too many levels of symbolic links)"),
            SkipReason::DirLoop { ancestor } => {
                write!(f, "directory loop (the same directory as {}, which contains it)", ancestor.display())
            }
            SkipReason::NotFollowed { target } => {
                write!(f, "symlink (to {}), not followed (--no-follow-symlinks)", target.display())
            }
            SkipReason::UnsafeKey => {
                write!(f, "key is not a safe local path (an empty, '.' or '..' segment); rename the object to copy it")
            }
            SkipReason::UnaddressableKey => write!(
                f,
                "the store would change its name (whitespace at the start or end of a name, an empty segment as in a//b, a leading /; on S3, a control character or a . or .. segment): it would write over or read another; rename it to copy it"
            ),
            SkipReason::MarkerName => write!(
                f,
                "a name ending in __XLDIR__, which MinIO stores as the marker of the directory without it (the bytes would vanish); rename it to copy it"
            ),
            SkipReason::NotUtf8 => write!(
                f,
                "a name that is not UTF-8, which object names must be (converted, two such names could become one); rename it to copy it"
            ),
        }
    }
}

/// A path asked for (named, or inside a tree) and not copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: SkipReason,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "skipped {}: {}", self.path.display(), self.reason)
    }
}

/// Jobs and skips from expanding the sources.
#[derive(Default)]
pub struct Expanded {
    pub jobs: Vec<Job>,
    pub skipped: Vec<Skipped>,
}

impl Expanded {
    fn skip(&mut self, path: &Path, reason: SkipReason) {
        self.skipped.push(Skipped { path: path.to_path_buf(), reason });
    }
}

/// Where a followed symlink leads: its target's metadata, or why it leads nowhere.
fn follow(link: &Path) -> Result<Result<Metadata, SkipReason>, CpError> {
    match std::fs::metadata(link) {
        Ok(m) => Ok(Ok(m)),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Ok(Err(SkipReason::TooManyLinks)),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => {
            Ok(Err(SkipReason::Dangling { target: read_link(link) }))
        }
        Err(e) => Err(CpError::io(link.display(), &e)),
    }
}

fn read_link(link: &Path) -> PathBuf {
    std::fs::read_link(link).unwrap_or_else(|_| PathBuf::from("?"))
}

/// A named local source: one job (a file), a tree of them (a directory, with `-r`), or a skip.
pub(super) fn expand_local(
    path: &Path,
    dst: &Side,
    into_dir: bool,
    walk: Walk,
    out: &mut Expanded,
) -> Result<(), CpError> {
    if matches!(dst, Side::Local(_)) {
        return Err("both sides are local paths; use cp(1)".into());
    }
    let lmeta = std::fs::symlink_metadata(path).map_err(|e| CpError::io(path.display(), &e))?;
    let meta = if lmeta.file_type().is_symlink() {
        if !walk.follow_symlinks {
            out.skip(path, SkipReason::NotFollowed { target: read_link(path) });
            return Ok(());
        }
        match follow(path)? {
            Ok(m) => m,
            Err(reason) => {
                out.skip(path, reason);
                return Ok(());
            }
        }
    } else {
        lmeta
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    if meta.is_file() {
        let dst = target(dst, name.as_deref(), "", into_dir)?;
        out.jobs.push(Job { src: Src::Local { path: path.to_path_buf(), size: meta.len() }, dst });
        return Ok(());
    }
    if !meta.is_dir() {
        out.skip(path, SkipReason::of_type(meta.file_type()));
        return Ok(());
    }
    if !walk.recursive {
        return Err(format!("{} is a directory (use -r)", path.display()).into());
    }
    if matches!(dst, Side::Stdio) {
        return Err(format!("{}: a directory cannot go to stdout", path.display()).into());
    }
    let mut tree = Tree { dst, name: name.as_deref(), into_dir, walk, ancestors: Vec::new(), out };
    tree.ancestors.push(Ancestor { id: (meta.dev(), meta.ino()), path: path.to_path_buf(), via_link: false });
    if tree.dir(path, "")? == 0 {
        tree.marker("")?;
    }
    Ok(())
}

/// A directory on the path being walked.
struct Ancestor {
    id: (u64, u64),
    path: PathBuf,
    via_link: bool,
}

/// One `-r` walk of a directory.
struct Tree<'a> {
    dst: &'a Side,
    /// The tree's own name, put first in destination keys when copying into a directory.
    name: Option<&'a str>,
    into_dir: bool,
    walk: Walk,
    /// Each directory from the root to the one being read: its (device, inode), its path,
    /// and whether it was reached through a symlink.
    ancestors: Vec<Ancestor>,
    out: &'a mut Expanded,
}

impl Tree<'_> {
    /// A marker job for the directory at `rel` (relative, without a trailing `/`).
    fn marker(&mut self, rel: &str) -> Result<(), CpError> {
        let dst = target(self.dst, self.name, rel, self.into_dir)?;
        self.out.jobs.push(Job { src: Src::Dir, dst });
        Ok(())
    }

    /// A job for `path` (at `rel`, without a trailing `/`) that could not be read: its copy
    /// fails with `err`, named, while the rest of the tree is copied.
    fn unreadable(&mut self, path: PathBuf, rel: &str, err: &std::io::Error) -> Result<(), CpError> {
        let errno = err.raw_os_error().unwrap_or(libc::EIO);
        let dst = target(self.dst, self.name, rel, self.into_dir)?;
        self.out.jobs.push(Job { src: Src::Unreadable { path, errno }, dst });
        Ok(())
    }

    /// Add the jobs and skips of everything in `dir` (at `rel`, empty or ending in `/`);
    /// returns how many jobs it added.
    fn dir(&mut self, dir: &Path, rel: &str) -> Result<usize, CpError> {
        let listed = std::fs::read_dir(dir).and_then(|it| it.collect::<Result<Vec<_>, _>>());
        let mut entries = match listed {
            Ok(entries) => entries,
            // Below the source, as an unreadable file: that copy fails, the others go on.
            Err(e) if !rel.is_empty() && e.raw_os_error().is_some() => {
                self.unreadable(dir.to_path_buf(), rel.trim_end_matches('/'), &e)?;
                return Ok(1);
            }
            Err(e) => return Err(CpError::io(dir.display(), &e)),
        };
        entries.sort_by_key(|e| e.file_name());
        let before = self.out.jobs.len();
        for e in entries {
            let path = e.path();
            let Some(name) = e.file_name().to_str().map(str::to_owned) else {
                self.out.skip(&path, SkipReason::NotUtf8);
                continue;
            };
            let child_rel = format!("{rel}{name}");
            let ft = e.file_type().map_err(|err| CpError::io(path.display(), &err))?;
            let is_link = ft.is_symlink();
            let meta = if is_link {
                if !self.walk.follow_symlinks {
                    self.out.skip(&path, SkipReason::NotFollowed { target: read_link(&path) });
                    continue;
                }
                match follow(&path)? {
                    Ok(m) => m,
                    Err(reason) => {
                        self.out.skip(&path, reason);
                        continue;
                    }
                }
            } else if ft.is_file() || ft.is_dir() {
                match e.metadata() {
                    Ok(m) => m,
                    // A directory listed but not searchable (mode r without x): this entry
                    // fails alone, as an unreadable directory does.
                    Err(err) => {
                        self.unreadable(path, &child_rel, &err)?;
                        continue;
                    }
                }
            } else {
                self.out.skip(&path, SkipReason::of_type(ft));
                continue;
            };
            if meta.is_file() {
                let dst = target(self.dst, self.name, &child_rel, self.into_dir)?;
                self.out.jobs.push(Job { src: Src::Local { path, size: meta.len() }, dst });
            } else if meta.is_dir() {
                let id = (meta.dev(), meta.ino());
                if let Some(i) = self.ancestors.iter().position(|a| a.id == id) {
                    // A loop made by a symlink followed on the way (this entry or one between
                    // it and the directory it repeats), else by a mount.
                    let by_link = is_link || self.ancestors[i + 1..].iter().any(|a| a.via_link);
                    let ancestor = self.ancestors[i].path.clone();
                    let reason = if by_link { SkipReason::Loop { ancestor } } else { SkipReason::DirLoop { ancestor } };
                    self.out.skip(&path, reason);
                    continue;
                }
                self.ancestors.push(Ancestor { id, path: path.clone(), via_link: is_link });
                let n = self.dir(&path, &format!("{child_rel}/"))?;
                self.ancestors.pop();
                if n == 0 {
                    self.marker(&child_rel)?;
                }
            } else {
                self.out.skip(&path, SkipReason::of_type(meta.file_type()));
            }
        }
        Ok(self.out.jobs.len() - before)
    }
}
