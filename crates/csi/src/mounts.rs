//! The node's mounts: `bucketfs mount` processes at staging paths, and bind mounts of
//! them at pods' target paths; found again through the kernel's mount table.
//!
//! `bucketfs mount` daemonizes into a session of its own and returns once the mount
//! answers, so a mount outlives the plugin process that asked for it. Unmounting goes
//! through `bucketfs unmount`, which waits until the daemon has uploaded what was
//! closed; a daemon that died (`ENOTCONN`) is detached lazily instead.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

/// How long a mount may take to answer before the stage call fails.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an unmount may wait for uploads before the call fails (the CO retries).
const UNMOUNT_TIMEOUT: Duration = Duration::from_secs(600);

/// One line of /proc/self/mountinfo that matters here.
#[derive(Debug, Clone)]
pub struct MountEntry {
    pub target: PathBuf,
    pub fstype: String,
    /// `major:minor`: a bind mount has its source's.
    pub dev: String,
    /// Mounted read-only (this mount point's own flags: a bind's may differ from its source's).
    pub read_only: bool,
}

/// The mount table, from /proc/self/mountinfo.
pub fn table() -> Vec<MountEntry> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountEntry> {
    // id parent major:minor root target options [optional...] - fstype source super
    let (left, right) = line.split_once(" - ")?;
    let mut f = left.split(' ');
    let dev = f.nth(2)?;
    let target = f.nth(1)?;
    let read_only = f.next()?.split(',').any(|o| o == "ro");
    let fstype = right.split(' ').next()?;
    let target = PathBuf::from(unescape(target));
    Some(MountEntry { target, fstype: fstype.to_string(), dev: dev.to_string(), read_only })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> OsString {
    use std::os::unix::ffi::OsStringExt;
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    OsString::from_vec(out)
}

/// The entry mounted at `path` last (the one a lookup of `path` sees), if any. Only the
/// parent is resolved (a stat of the mount point itself would wait on a hung daemon).
pub fn mounted_at(path: &Path) -> Option<MountEntry> {
    let path = match (path.parent().and_then(|p| std::fs::canonicalize(p).ok()), path.file_name()) {
        (Some(parent), Some(name)) => parent.join(name),
        _ => path.to_path_buf(),
    };
    table().into_iter().rev().find(|m| m.target == path)
}

/// The other mount points of the mount at `path`: its bind mounts (and its source, if
/// `path` is itself a bind mount).
pub fn binds_of(path: &Path) -> Vec<PathBuf> {
    let Some(me) = mounted_at(path) else { return Vec::new() };
    table().into_iter().filter(|m| m.dev == me.dev && m.target != me.target).map(|m| m.target).collect()
}

/// Whether an error says the FUSE daemon behind a mount is gone: `ECONNABORTED` while
/// the kernel aborts the connection, `ENOTCONN` after.
pub fn is_dead(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED))
}

/// Whether the mount at `path` answers (a `statfs`, as `df` asks), off the async threads
/// and bounded in time: a hung daemon counts as gone.
pub async fn answers_bounded(path: &Path) -> Result<(), String> {
    match statvfs_bounded(path).await {
        Ok(_) => Ok(()),
        Err(e) if is_dead(&e) => {
            Err(format!("the bucketfs process of this mount is gone or hung ({e}); unstage and stage the volume again"))
        }
        Err(e) => Err(format!("cannot stat {}: {e}", path.display())),
    }
}

/// How long a statfs of a mount may take before it counts as hung.
const STAT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// [`statvfs`] off the async threads, given up after `STAT_TIMEOUT` (a hung daemon
/// leaves the call waiting in the kernel; only that blocking thread waits with it).
pub async fn statvfs_bounded(path: &Path) -> std::io::Result<libc::statvfs> {
    let p = path.to_path_buf();
    match tokio::time::timeout(STAT_TIMEOUT, tokio::task::spawn_blocking(move || statvfs(&p))).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(std::io::Error::other(e.to_string())),
        Err(_) => Err(std::io::Error::from_raw_os_error(libc::ENOTCONN)),
    }
}

/// `statvfs(3)` of `path`.
pub fn statvfs(path: &Path) -> std::io::Result<libc::statvfs> {
    let c = cpath(path).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs fills the zeroed struct; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// Run `[PREFIX...] bucketfs mount URL PATH ARGS...` with the credential files in `env`,
/// and wait until the mount answers or the command fails; its message is returned on
/// failure.
pub async fn mount(
    prefix: &[String],
    bin: &Path,
    url: &str,
    path: &Path,
    args: &[String],
    env: &[(&str, PathBuf)],
) -> Result<(), String> {
    let mut cmd = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.arg("mount").arg(url).arg(path).args(args);
    // Credentials come from the files alone: none of the plugin's own may leak in.
    for k in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "GOOGLE_APPLICATION_CREDENTIALS"] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(std::process::Stdio::null()).kill_on_drop(false);
    let out = tokio::time::timeout(MOUNT_TIMEOUT, cmd.output())
        .await
        .map_err(|_| format!("bucketfs mount did not answer within {} s", MOUNT_TIMEOUT.as_secs()))?
        .map_err(|e| {
            format!("cannot run {}: {e}", prefix.first().map(PathBuf::from).unwrap_or(bin.into()).display())
        })?;
    if out.status.success() {
        return Ok(());
    }
    let msg = String::from_utf8_lossy(&out.stderr);
    Err(msg.trim().lines().last().unwrap_or("bucketfs mount failed").to_string())
}

/// Unmount the bucketfs mount at `path`, waiting for its uploads; a dead one is detached.
/// Also when the kernel let go of it already (an earlier call that gave up waiting): its
/// process may still be uploading, and this returns once it is done.
pub async fn unmount(bin: &Path, path: &Path) -> Result<(), String> {
    if answers_bounded(path).await.is_err() {
        return detach(path);
    }
    // `bucketfs unmount` gives up first, with its own message (it names the process).
    let wait = (UNMOUNT_TIMEOUT - Duration::from_secs(10)).as_secs().to_string();
    let run = Command::new(bin)
        .args(["unmount", "--missing-ok", "--wait", &wait])
        .arg(path)
        .stdin(std::process::Stdio::null())
        // A call the CO gave up on (its deadline passed) stops its waiting `bucketfs
        // unmount` (never the mount's own process): the retried call starts another.
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(UNMOUNT_TIMEOUT, run)
        .await
        .map_err(|_| {
            format!("unmount of {} still waiting for uploads after {} s", path.display(), UNMOUNT_TIMEOUT.as_secs())
        })?
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    if out.status.success() {
        return Ok(());
    }
    // Still uploading, or an upload failed: the CO calls again (the mount is gone then, and
    // the daemon finishes or keeps what it could not upload for the next mount).
    Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
}

fn cpath(path: &Path) -> Result<std::ffi::CString, String> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| format!("{} holds a NUL byte", path.display()))
}

/// Bind-mount `src` on `dst`, read-only if asked (a bind mount takes the read-only flag
/// only on a remount).
pub fn bind(src: &Path, dst: &Path, read_only: bool) -> Result<(), String> {
    let (s, d) = (cpath(src)?, cpath(dst)?);
    let call = |flags: libc::c_ulong| {
        // SAFETY: both strings are NUL-terminated and outlive the call; no fs type or data.
        let rc = unsafe { libc::mount(s.as_ptr(), d.as_ptr(), std::ptr::null(), flags, std::ptr::null()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(format!("bind mount {} on {}: {}", src.display(), dst.display(), std::io::Error::last_os_error()))
        }
    };
    call(libc::MS_BIND)?;
    if read_only {
        // A remount sets every per-mount flag anew: keep nosuid and nodev.
        let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
        if let Err(e) = call(flags) {
            let _ = detach(dst);
            return Err(e);
        }
    }
    Ok(())
}

/// Unmount whatever is mounted at `path`, lazily (a pod's process still in the directory
/// must not keep the call failing forever).
pub fn detach(path: &Path) -> Result<(), String> {
    let p = cpath(path)?;
    // SAFETY: a NUL-terminated path that outlives the call.
    let rc = unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
    if rc == 0 || mounted_at(path).is_none() {
        Ok(())
    } else {
        Err(format!("unmount {}: {}", path.display(), std::io::Error::last_os_error()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_with_escaped_spaces() {
        let l = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - fuse.bucketfs s3://b rw,user_id=0";
        let e = parse_line(l).unwrap();
        assert_eq!(e.target, PathBuf::from("/mnt/a b"));
        assert_eq!(e.fstype, "fuse.bucketfs");
        assert_eq!(e.dev, "98:0");
        assert!(!e.read_only);
        assert!(parse_line("37 35 98:0 / /mnt/ro ro,relatime shared:2 - fuse.bucketfs s3://b rw").unwrap().read_only);
        assert!(parse_line("garbage").is_none());
        assert!(!table().is_empty(), "this process's own mount table is readable");
    }
}
