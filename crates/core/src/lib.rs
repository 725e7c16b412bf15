//! The filesystem core: turns kernel-shaped requests (lookup, getattr, readdir, open, read)
//! into store calls. It never imports fuser; the adapter crate translates requests and
//! replies, and everything here is testable against the in-memory store.
//!
//! - [`names`]: which object keys become which file names, and which are never exposed.
//! - [`inode`]: the inode table (ino <-> key), lookup counts, directory listing cache.
//! - [`read`]: the per-handle read path with sequential prefetch.
//! - [`fs`]: the operations themselves.
//! - [`error`]: the core's error enum and the one map from errors to errno.

pub mod error;
pub mod fs;
pub mod inode;
pub mod names;
pub mod read;

pub use error::FsError;
pub use fs::{Attr, DirEntry, Fs, FsConfig, Kind, StatFs, ROOT_INO};
