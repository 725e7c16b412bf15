//! The filesystem core: turns kernel-shaped requests (lookup, getattr, readdir, open, read)
//! into store calls. It never imports fuser; the adapter crate translates requests and
//! replies, and everything here is testable against the in-memory store.
//!
//! - [`names`]: which object keys become which file names, and which are never exposed.
//! - [`inode`]: the inode table (ino <-> key), lookup counts, directory listing cache.
//! - [`read`]: the per-handle read path with sequential prefetch and the memory cache;
//!   [`disk_cache`]: the checksummed on-disk block cache that survives remounts;
//!   [`block_pool`]: the bounded pool of aligned buffers blocks are read into.
//! - `staging`: the files being written (staged files, the upload budget, the write-back
//!   queue, the passthrough watch), a component beside the inode table and the read path.
//! - [`write`](mod@write): staged writes and their upload on flush/fsync/unmount; [`recovery`]: what
//!   a mount that died left staged, uploaded by the next;
//!   [`part_budget`]: the mount-wide bound on upload buffers; [`write_back`]: the
//!   background upload queue of `--write-back` mounts; [`deletes`]: their deferred,
//!   journaled deletes and directory markers; `moves`: moves (directories, files copied
//!   then deleted) journaled so a crash never leaves both names; `late`: keys an upload
//!   cut off may still land on, watched for a while.
//! - [`fs`]: the `Fs` state and getattr; its operations live in `fs_*` modules, one
//!   concern each (`fs_lookup`, `fs_listing`, `fs_readdir`, `fs_write`, `fs_publish`, `fs_names`,
//!   `fs_links`, `fs_rename`, `fs_sync`, `fs_write_back`, `fs_late`, `fs_passthrough`, `fs_events`). The component
//!   modules never import `Fs`.
//! - [`passthrough`]: local files holding a whole object version, which the kernel reads
//!   directly (FUSE passthrough) instead of asking us.
//! - [`events`]: change events the store pushes (`--notify`), applied as they come.
//! - [`stats`]: read-only figures (pending uploads, cache use) for metrics and status.
//! - [`clock`]: the time TTLs are measured in (real, or manual in tests); `sync`: where
//!   the core's locks come from (std and tokio, or shuttle's in model-checking tests).
//! - [`error`]: the core's error enum and the one map from errors to errno.

pub mod block_pool;
pub mod clock;
pub mod deletes;
pub mod dir_cache;
pub mod disk_cache;
pub mod error;
pub mod events;
pub mod fs;
pub(crate) mod fs_events;
pub(crate) mod fs_late;
pub(crate) mod fs_links;
pub(crate) mod fs_names;
pub(crate) mod fs_passthrough;
pub(crate) mod fs_readdir;
pub(crate) mod fs_stage;
pub(crate) mod fs_write;
pub(crate) mod fs_write_back;
pub mod inode;
pub(crate) mod intents;
pub(crate) mod late;
pub mod links;
pub(crate) mod moves;
pub mod names;
pub mod part_budget;
pub mod passthrough;
pub(crate) mod pause;
mod preload;
pub mod read;
pub mod recovery;
pub(crate) mod recycle;
pub(crate) mod staging;
pub mod stats;
pub(crate) mod sync;
pub(crate) mod weighted;
pub mod write;
pub mod write_back;

pub use clock::Clock;
pub use dir_cache::InvalidateDir;
pub use error::FsError;
pub use fs::{Attr, DirEntry, Fs, FsConfig, Kind, SetAttr, StatFs, ROOT_INO};
pub use moves::{left as moves_left, unfinished as unfinished_moves};
pub use stats::CacheStats;
pub use write_back::{WriteBackConfig, WriteBackStatus};
