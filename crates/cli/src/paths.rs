//! Where bucketfs keeps its files: the embedded default store and per-mount runtime files.
//!
//! Runtime files (pid, log, control socket, the note of uploads left pending) live in one
//! private directory per user: `$XDG_RUNTIME_DIR/bucketfs`; for root without one (systemd
//! units, fstab at boot) `/run/bucketfs`; otherwise `/tmp/bucketfs-UID`. [`ensure_runtime_dir`]
//! creates it 0700 and refuses one that is a symlink or belongs to someone else (in `/tmp`
//! anyone could have made it first); a group- or world-accessible one of ours is made
//! private. Files written there are created anew and never through a symlink.
//!
//! Each mount point gets a name ([`mount_id`]) that is a one-to-one function of its canonical
//! path: `%` and `/` are percent-escaped, so `/a_b` and `/a/b` no longer share a staging
//! directory, socket or pid file (with the old `/` -> `_` scheme they did, and crash
//! recovery could have uploaded one mount's files into the other's bucket). A staging
//! directory under the old name is still used when it exists and the new one does not, so
//! data staged before an upgrade is recovered.
//!
//! The block cache directory is named by the 64-bit FNV-1a hash of the store's identity,
//! fixed by its published constants; the old name came from `DefaultHasher`, whose output
//! may change with any Rust release (orphaning a 2 GiB cache). An old-named cache is
//! renamed to the new name when found.

use std::fs::{DirBuilder, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"))
}

fn cache_base() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| home().join(".cache"))
}

/// `$XDG_DATA_HOME/bucketfs/default`, or `~/.local/share/bucketfs/default`.
pub fn default_store() -> PathBuf {
    let base = std::env::var_os("XDG_DATA_HOME").map(PathBuf::from).unwrap_or_else(|| home().join(".local/share"));
    base.join("bucketfs/default")
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// Per-user directory for the pid, log and socket files of running mounts (not created here:
/// see [`ensure_runtime_dir`]).
pub fn runtime_dir() -> PathBuf {
    runtime_dir_for(std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from), euid())
}

fn runtime_dir_for(xdg: Option<PathBuf>, uid: u32) -> PathBuf {
    match xdg {
        Some(d) if d.is_absolute() => d.join("bucketfs"),
        _ if uid == 0 => PathBuf::from("/run/bucketfs"),
        _ => std::env::temp_dir().join(format!("bucketfs-{uid}")),
    }
}

/// Create the runtime directory if needed and check it is ours and private.
pub fn ensure_runtime_dir() -> Result<PathBuf, String> {
    let dir = runtime_dir();
    ensure_private_dir(&dir, euid())?;
    Ok(dir)
}

/// `dir` exists, is a real directory (not a symlink), belongs to `uid` and is mode 0700.
fn ensure_private_dir(dir: &Path, uid: u32) -> Result<(), String> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create runtime directory {}: {e}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("cannot use {}: {e}", dir.display()))?;
    if !meta.file_type().is_dir() {
        return Err(format!("runtime directory {} is not a directory (a symlink?); remove it", dir.display()));
    }
    if meta.uid() != uid {
        return Err(format!(
            "runtime directory {} belongs to uid {}, not to this user ({uid}); remove it",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot make {} private: {e}", dir.display()))?;
    }
    Ok(())
}

/// `dir` as the kernel finds it: absolute, its deepest existing part with symlinks and
/// `..` resolved, the rest as given. Journals and records kept beside a staging directory
/// are found by this path, so a link to it (or `mnt/../st`) names the same ones.
pub fn resolved(dir: &Path) -> PathBuf {
    let abs = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    match abs.ancestors().find(|a| a.exists()) {
        Some(existing) => std::fs::canonicalize(existing)
            .unwrap_or_else(|_| existing.to_path_buf())
            .join(abs.strip_prefix(existing).unwrap_or(Path::new(""))),
        None => abs,
    }
}

/// Create `dir` and its missing parents private to this user (0700): staged files and
/// cached blocks hold the bucket's data, which other local users must not read there (the
/// mount itself is private unless `--allow-other`). Under the default location
/// (`~/.cache/bucketfs`), that directory is made private too if ours (older versions
/// made it with the umask's mode); a directory the user named that exists is left as is.
pub fn create_private_dirs(dir: &Path) -> std::io::Result<()> {
    create_private_dirs_in(&cache_base().join("bucketfs"), dir)
}

fn create_private_dirs_in(base: &Path, dir: &Path) -> std::io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    if dir.starts_with(base) {
        let meta = std::fs::symlink_metadata(base)?;
        if meta.file_type().is_dir() && meta.uid() == euid() && meta.mode() & 0o077 != 0 {
            std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    Ok(())
}

/// Write `contents` to a new file at `path` (0600), replacing what was there. A symlink
/// at `path` is removed, never followed.
pub fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(contents.as_bytes())
}

/// Open a log file for appending (0600 if created), refusing to follow a symlink.
pub fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    OpenOptions::new().create(true).append(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// A file name that is a one-to-one function of a canonical mount point: the path without
/// its leading `/`, with `%` written `%25` and `/` written `%2F`. Names that would pass
/// 200 bytes keep a prefix and end in the FNV-1a hash of the whole path.
pub fn mount_id(mountpoint: &Path) -> String {
    let raw = mountpoint.to_string_lossy();
    let escaped = raw.trim_start_matches('/').replace('%', "%25").replace('/', "%2F");
    if escaped.len() <= 200 {
        return escaped;
    }
    let mut cut = 150;
    while !escaped.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{:016x}", &escaped[..cut], fnv1a64(raw.as_bytes()))
}

/// The name used before mount ids were injective (`/` -> `_`); staged data may sit under it.
fn old_mount_id(mountpoint: &Path) -> String {
    mountpoint.to_string_lossy().trim_start_matches('/').replace('/', "_")
}

/// 64-bit FNV-1a (offset basis 0xcbf29ce484222325, prime 0x100000001b3): stable across
/// Rust releases and platforms, unlike `DefaultHasher`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

pub fn pid_file(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(format!("{}.pid", mount_id(mountpoint)))
}

/// The staging directory of the mount running at `mountpoint` (written beside its pid file,
/// removed with it): a `bucketfs unmount` after a crash looks there for what it left.
pub fn staging_file(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(format!("{}.staging", mount_id(mountpoint)))
}

/// Keys a finished mount could not upload (written at exit, read by `bucketfs unmount`).
pub fn pending_file(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(format!("{}.pending", mount_id(mountpoint)))
}

/// What a finished mount left for `bucketfs unmount` to report ([`pending_file`]): changes
/// it could not make in the bucket (kept for the next mount), and the files its recovery
/// moved to `lost+found` (bytes an earlier mount's crash left never closed: never uploaded).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PendingNote {
    pub staging: PathBuf,
    pub pending: Vec<String>,
    /// (key, file in `lost+found`).
    pub set_aside: Vec<(String, PathBuf)>,
}

impl PendingNote {
    /// The staging directory, then a line per pending key, then a line per file set aside,
    /// starting with NUL (no key holds one): NUL, key, NUL, path.
    pub fn to_text(&self) -> String {
        let mut text = format!("{}\n", self.staging.display());
        for k in &self.pending {
            text.push_str(&format!("{k}\n"));
        }
        for (k, p) in &self.set_aside {
            text.push_str(&format!("\0{k}\0{}\n", p.display()));
        }
        text
    }

    pub fn parse(text: &str) -> Self {
        let mut lines = text.lines();
        let mut note = PendingNote { staging: lines.next().unwrap_or_default().into(), ..Default::default() };
        for line in lines {
            match line.strip_prefix('\0').and_then(|l| l.split_once('\0')) {
                Some((k, p)) => note.set_aside.push((k.to_string(), p.into())),
                None => note.pending.push(line.to_string()),
            }
        }
        note
    }
}

/// The mount process's control socket (`bucketfs status` talks to it). A socket's path must
/// fit in 108 bytes (`sun_path`); a longer one is named by the hash of the mount point.
pub fn control_socket(mountpoint: &Path) -> PathBuf {
    let dir = runtime_dir();
    let named = dir.join(format!("{}.sock", mount_id(mountpoint)));
    if named.as_os_str().len() < 108 {
        return named;
    }
    dir.join(format!("{:016x}.sock", fnv1a64(mountpoint.as_os_str().as_encoded_bytes())))
}

pub fn log_file(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(format!("{}.log", mount_id(mountpoint)))
}

/// `$XDG_CACHE_HOME/bucketfs/staging/<mount>`, or under `~/.cache`: staged writes survive a
/// crash of the mount process there. An old-style directory is used if only it exists.
/// What `staging` holds that an earlier mount left for the bucket: (staged files, named
/// by their `.key` sidecars; journaled deletes; unfinished moves).
fn pending_in(staging: &Path) -> (usize, usize, usize) {
    let count = |dir: &Path, pending: &dyn Fn(&str) -> bool| {
        std::fs::read_dir(dir)
            .map_or(0, |d| d.flatten().filter(|e| e.file_name().to_str().is_some_and(pending)).count())
    };
    let staged = count(staging, &|n| n.ends_with(".key"));
    let journal = bucketfs_core::deletes::journal_dir_for(staging);
    let deletes = journal.map_or(0, |j| count(&j, &|n| !n.starts_with('.')));
    (staged, deletes, bucketfs_core::unfinished_moves(staging))
}

/// Whether `staging` holds changes an earlier mount left for the bucket ([`pending_in`]).
pub fn holds_pending(staging: &Path) -> bool {
    pending_in(staging) != (0, 0, 0)
}

pub fn staging_dir(mountpoint: &Path) -> PathBuf {
    staging_dir_in(&cache_base().join("bucketfs/staging"), mountpoint)
}

fn staging_dir_in(base: &Path, mountpoint: &Path) -> PathBuf {
    let new = base.join(mount_id(mountpoint));
    let old = base.join(old_mount_id(mountpoint));
    if !new.exists() && old.is_dir() {
        return old;
    }
    new
}

/// Whether files can be made in `staging` (a read-only file system, a directory of another
/// user): checked at mount, where every create would otherwise fail with a bare `EIO`.
pub fn check_writable(staging: &Path) -> Result<(), String> {
    let probe = staging.join(format!(".bucketfs-probe-{}", std::process::id()));
    std::fs::File::create(&probe).and_then(|_| std::fs::remove_file(&probe)).map_err(|e| {
        format!("cannot write in the staging directory {}: {e}; give a writable --staging-dir", staging.display())
    })
}

/// Claim `staging` for the store at `url` (bucket and prefix): the files a mount leaves
/// there (uploads not done, and deletes and moves journaled beside it) belong to
/// the store it mounted, and the next mount sends them to its own store. If an earlier
/// mount of another store left such files, refuse, naming that store, rather than upload
/// them into the wrong bucket (over whatever its keys hold) or delete its keys there.
/// Call with the staging lock held.
pub fn claim_staging(staging: &Path, url: &str) -> Result<(), String> {
    // Beside the directory, as the deletes journal: the staging directory itself holds
    // only staged files (empty once everything is uploaded).
    let name = staging.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let owner_file = staging.with_file_name(format!(".{name}.store"));
    let owner = std::fs::read_to_string(&owner_file).ok().map(|s| s.trim_end().to_string());
    if let Some(owner) = owner.filter(|o| o != url) {
        let (staged, deletes, moves) = pending_in(staging);
        if staged + deletes + moves > 0 {
            return Err(format!(
                "the staging directory {} holds {staged} file(s) not yet uploaded, {deletes} delete(s) and \
                 {moves} move(s) not yet done for {owner}, left by an earlier mount of it on this mount point: \
                 mount {owner} here first to finish them (or move them away), or give this mount its own \
                 --staging-dir",
                staging.display()
            ));
        }
    }
    write_private(&owner_file, &format!("{url}\n")).map_err(|e| format!("cannot write {}: {e}", owner_file.display()))
}

/// Hold `staging` (a staging directory, made already) for this process until it exits.
///
/// An unmount returns once the kernel lets go, while the process still uploads what it
/// staged; a mount of the same mount point right after would start a second process in
/// the same directory, and two would take the same spare files (two staged files, one
/// inode) and each upload the other's files as if a crash had left them. The lock is an
/// `flock` on the directory itself (whatever path or symlink names it, and with no file
/// to write); a process that dies releases it. Waits `wait` for the holder to finish, then
/// refuses, naming the holder (from `/proc/locks`). The caller keeps the descriptor open
/// until the process exits.
pub fn lock_staging(staging: &Path, wait: std::time::Duration) -> Result<std::fs::File, String> {
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(staging)
        .map_err(|e| format!("cannot open the staging directory {}: {e}", staging.display()))?;
    let deadline = std::time::Instant::now() + wait;
    let mut told = false;
    loop {
        // SAFETY: flock on a descriptor we own; released when the process exits.
        if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(dir);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(format!("cannot lock the staging directory {}: {e}", staging.display()));
        }
        let holder = || dir.metadata().ok().and_then(|m| lock_holder(m.ino())).unwrap_or_else(|| "?".into());
        if std::time::Instant::now() >= deadline {
            let holder = holder();
            return Err(format!(
                "the staging directory {} is in use by bucketfs process {holder} (most likely an \
                 earlier mount of this mount point, still uploading what it staged): wait for it \
                 to exit, or give this mount its own --staging-dir",
                staging.display()
            ));
        }
        if !told {
            tracing::warn!(
                pid = holder(),
                "waiting for an earlier bucketfs process to finish with {}",
                staging.display()
            );
            told = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The pid holding an `flock` on inode `ino`, from `/proc/locks` ("1: FLOCK ADVISORY WRITE
/// <pid> <maj>:<min>:<ino> 0 EOF").
fn lock_holder(ino: u64) -> Option<String> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let found = f.get(1) == Some(&"FLOCK") && f.get(5)?.rsplit(':').next()? == ino.to_string();
        found.then(|| f[4].to_string())
    })
}

/// `~/.cache/bucketfs/blocks/<hash of the store>`: one block cache per store URL (and
/// endpoint). A cache under the old `DefaultHasher` name is moved to the new one.
pub fn block_cache_dir(store_id: &str) -> PathBuf {
    block_cache_dir_in(&cache_base().join("bucketfs/blocks"), store_id)
}

fn block_cache_dir_in(base: &Path, store_id: &str) -> PathBuf {
    let new = base.join(format!("{:016x}", fnv1a64(store_id.as_bytes())));
    let old = base.join(format!("{:016x}", default_hasher(store_id)));
    if !new.exists() && old.is_dir() && std::fs::rename(&old, &new).is_err() {
        return old;
    }
    new
}

/// The old cache name's hash; only to find a cache made by an earlier version.
fn default_hasher(store_id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    store_id.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A staging directory named through a link or a `..` is the one it leads to: the
    /// journals beside it were looked for beside the link (a delete journaled there was
    /// not sent, and the store record guarding the staged files was not found).
    #[test]
    fn a_staging_directory_named_through_a_link_resolves_to_its_target() {
        let base = std::env::temp_dir().join(format!("bucketfs-resolve-{}", std::process::id()));
        std::fs::create_dir_all(base.join("real/st")).unwrap();
        let _ = std::fs::remove_file(base.join("link"));
        symlink(base.join("real/st"), base.join("link")).unwrap();
        let real = std::fs::canonicalize(base.join("real/st")).unwrap();
        assert_eq!(resolved(&base.join("link")), real);
        assert_eq!(resolved(&base.join("real/x/../st")), real.with_file_name("x/../st"), "x does not exist");
        assert_eq!(resolved(&base.join("real/st/../st")), real);
        assert_eq!(resolved(&base.join("link/new")), real.join("new"), "not made yet");
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn a_pending_note_reads_back_as_written() {
        let note = PendingNote {
            staging: "/var/stage dir".into(),
            pending: vec!["a/b c".into(), "d (rename to e)".into()],
            set_aside: vec![("x/y".into(), "/var/stage dir/lost+found/1-y".into())],
        };
        assert_eq!(PendingNote::parse(&note.to_text()), note);
        let old = PendingNote::parse("/s\nk1\nk2\n"); // as written before files set aside were
        assert_eq!((old.pending.len(), old.set_aside.len()), (2, 0));
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("bucketfs-paths-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_staging_directory_with_a_move_left_unfinished_is_not_claimed_by_another_store() {
        // A mount of s3://a died during `mv d e`: the next mount finishes the move in its
        // store, so a mount of s3://b there would copy b's d/ over e/ and delete d/.
        let base = tmp("claim");
        let staging = base.join("mnt");
        std::fs::create_dir_all(&staging).unwrap();
        claim_staging(&staging, "s3://a").unwrap();
        let journal = base.join(".mnt.moves");
        std::fs::create_dir_all(&journal).unwrap();
        std::fs::write(journal.join("0000000000000001-1"), "d/\0e/\0d/x").unwrap();
        let refused = claim_staging(&staging, "s3://b").unwrap_err();
        assert!(refused.contains("1 move(s)") && refused.contains("s3://a"), "{refused}");
        claim_staging(&staging, "s3://a").expect("its own store finishes it");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn mount_ids_are_one_to_one() {
        let ids: Vec<String> =
            ["/a_b", "/a/b", "/a%2Fb", "/a%b", "/mnt/data"].iter().map(|p| mount_id(Path::new(p))).collect();
        assert_eq!(ids, ["a_b", "a%2Fb", "a%252Fb", "a%25b", "mnt%2Fdata"]);
        let long_a = format!("/{}", "x".repeat(300));
        let long_b = format!("/{}y", "x".repeat(299));
        let (a, b) = (mount_id(Path::new(&long_a)), mount_id(Path::new(&long_b)));
        assert!(a.len() < 200 && a != b, "{a} {b}");
        assert!(control_socket(Path::new(&long_a)).as_os_str().len() < 108);
    }

    #[test]
    fn root_without_xdg_uses_run() {
        assert_eq!(runtime_dir_for(None, 0), PathBuf::from("/run/bucketfs"));
        assert_eq!(runtime_dir_for(Some("/run/user/1000".into()), 1000), PathBuf::from("/run/user/1000/bucketfs"));
        assert!(runtime_dir_for(None, 1000).ends_with("bucketfs-1000"));
        // A relative XDG_RUNTIME_DIR is invalid by the spec and ignored.
        assert_eq!(runtime_dir_for(Some("rel".into()), 0), PathBuf::from("/run/bucketfs"));
    }

    #[test]
    fn staging_and_cache_dirs_are_private() {
        let base = tmp("priv").join("bucketfs");
        std::fs::create_dir_all(&base).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap(); // an older version's
        let dir = base.join("staging/abc");
        create_private_dirs_in(&base, &dir).unwrap();
        for d in [&base, &base.join("staging"), &dir] {
            assert_eq!(std::fs::metadata(d).unwrap().mode() & 0o777, 0o700, "{}", d.display());
        }
        // A directory the user named, existing: left as it is.
        let named = tmp("named");
        std::fs::create_dir_all(&named).unwrap();
        std::fs::set_permissions(&named, std::fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dirs_in(&base, &named).unwrap();
        assert_eq!(std::fs::metadata(&named).unwrap().mode() & 0o777, 0o755);
    }

    #[test]
    fn runtime_dir_is_private_and_ours() {
        let base = tmp("rt");
        let dir = base.join("bucketfs");
        ensure_private_dir(&dir, euid()).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        // Opened up by someone: made private again.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        ensure_private_dir(&dir, euid()).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        // Someone else's: refused.
        assert!(ensure_private_dir(&dir, euid() + 1).unwrap_err().contains("belongs to uid"));
        // A symlink to a directory: refused, not followed.
        let link = base.join("link");
        symlink(&dir, &link).unwrap();
        assert!(ensure_private_dir(&link, euid()).unwrap_err().contains("not a directory"));
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn private_files_never_follow_a_symlink() {
        let base = tmp("pid");
        let target = base.join("target");
        std::fs::write(&target, "keep").unwrap();
        let pid = base.join("x.pid");
        symlink(&target, &pid).unwrap();
        write_private(&pid, "123").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&pid).unwrap(), "123");
        assert!(!std::fs::symlink_metadata(&pid).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::metadata(&pid).unwrap().mode() & 0o777, 0o600);
        let log = base.join("x.log");
        symlink(&target, &log).unwrap();
        assert!(open_log(&log).is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn old_staging_and_cache_names_are_still_found() {
        let base = tmp("old");
        let mp = Path::new("/mnt/my_data");
        assert_eq!(staging_dir_in(&base, mp), base.join("mnt%2Fmy_data"));
        std::fs::create_dir(base.join("mnt_my_data")).unwrap();
        assert_eq!(staging_dir_in(&base, mp), base.join("mnt_my_data"));
        std::fs::create_dir(base.join("mnt%2Fmy_data")).unwrap();
        assert_eq!(staging_dir_in(&base, mp), base.join("mnt%2Fmy_data"));

        let id = "s3://b http://127.0.0.1:9000";
        let old = base.join(format!("{:016x}", default_hasher(id)));
        std::fs::create_dir(&old).unwrap();
        std::fs::write(old.join("block"), "cached").unwrap();
        let got = block_cache_dir_in(&base, id);
        assert_eq!(got, base.join(format!("{:016x}", fnv1a64(id.as_bytes()))));
        assert_eq!(std::fs::read_to_string(got.join("block")).unwrap(), "cached");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn fnv1a64_matches_the_published_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }
}
