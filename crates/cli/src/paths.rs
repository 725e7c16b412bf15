//! Where bucketfs keeps its files: the embedded default store and per-mount runtime files.

use std::path::{Path, PathBuf};

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"))
}

/// `$XDG_DATA_HOME/bucketfs/default`, or `~/.local/share/bucketfs/default`.
pub fn default_store() -> PathBuf {
    let base = std::env::var_os("XDG_DATA_HOME").map(PathBuf::from).unwrap_or_else(|| home().join(".local/share"));
    base.join("bucketfs/default")
}

/// Per-user directory for pid and log files of running mounts.
pub fn runtime_dir() -> PathBuf {
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(|d| PathBuf::from(d).join("bucketfs"))
        .unwrap_or_else(|| std::env::temp_dir().join(format!("bucketfs-{}", unsafe { libc::getuid() })));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// A file name unique to one mount point: its path with `/` replaced.
fn mount_id(mountpoint: &Path) -> String {
    mountpoint.to_string_lossy().trim_start_matches('/').replace('/', "_")
}

pub fn pid_file(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(format!("{}.pid", mount_id(mountpoint)))
}

/// Keys a finished mount could not upload (written at exit, read by `bucketfs unmount`).
pub fn pending_file(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(format!("{}.pending", mount_id(mountpoint)))
}

/// The mount process's control socket (`bucketfs status` talks to it).
pub fn control_socket(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(format!("{}.sock", mount_id(mountpoint)))
}

pub fn log_file(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(format!("{}.log", mount_id(mountpoint)))
}

/// `$XDG_CACHE_HOME/bucketfs/staging/<mount>`, or under `~/.cache`: staged writes survive a
/// crash of the mount process there.
pub fn staging_dir(mountpoint: &Path) -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| home().join(".cache"));
    base.join("bucketfs/staging").join(mount_id(mountpoint))
}

/// `~/.cache/bucketfs/blocks/<store>`: one block cache per store URL (and endpoint).
pub fn block_cache_dir(store_id: &str) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    store_id.hash(&mut h);
    let base = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| home().join(".cache"));
    base.join("bucketfs/blocks").join(format!("{:016x}", h.finish()))
}
