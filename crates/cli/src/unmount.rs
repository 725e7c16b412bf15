//! `bucketfs unmount`: unmount, then wait for the mount's process to finish its work.
//!
//! A mount point the kernel has let go of while its process still uploads (an earlier
//! unmount that gave up waiting, `fusermount3 -u`) is waited for as well: a call that is
//! retried, as the CSI plugin's unstage is, returns only once that work is done.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{checks, paths};

/// What `bucketfs unmount` does besides unmounting.
pub struct Opts {
    /// How long to wait for the mount's process to exit after the kernel let go (`None`:
    /// as long as it takes).
    pub wait: Option<Duration>,
    /// Succeed when nothing is mounted there and no mount's process is finishing.
    pub missing_ok: bool,
}

pub fn run(mp: &Path, opts: &Opts) -> Result<(), String> {
    let canonical = std::fs::canonicalize(mp).map_err(|e| format!("cannot resolve {}: {e}", mp.display()))?;
    // The mount's process, if its pid file names the process that wrote it (after a crash
    // the file stays, and its pid may be another process's by now).
    let pid_file = paths::pid_file(&canonical);
    let pid = pid_in(&pid_file).filter(|&pid| running(pid) && wrote(pid, &pid_file));
    // A pid file whose process is gone: it ended without finishing (a clean end removes
    // the file). What it had not uploaded, if anything, is only in its staging directory.
    let staging = std::fs::read_to_string(paths::staging_file(&canonical)).ok().map(std::path::PathBuf::from);
    let ended = pid_in(&pid_file).filter(|_| pid.is_none() && staging.as_deref().is_some_and(paths::holds_pending));
    match checks::mounted_fstype(&canonical) {
        Some(t) if t.starts_with("fuse") => {
            unmount(&canonical, pid)?;
            if let Some(dead) = ended {
                // (tester S: this exited 0, silent, with a closed file not in the bucket)
                return Err(format!(
                    "unmounted, but the mount process {dead} had ended before (killed, or it crashed): files \
                     closed on it and not uploaded yet are kept in its staging directory ({}); mounting {} \
                     again uploads them (`bucketfs sync` then waits for them)",
                    staging.as_deref().unwrap_or(Path::new("?")).display(),
                    canonical.display()
                ));
            }
        }
        Some(t) => return Err(format!("{} is a {t} mount, not a bucketfs one", canonical.display())),
        // Unmounted already, its process still at work: wait for it below.
        None if pid.is_some() => {}
        None if opts.missing_ok => return Ok(()),
        None => return Err(format!("{} is not mounted", canonical.display())),
    }
    if let Some(pid) = pid {
        let start = Instant::now();
        while running(pid) {
            if opts.wait.is_some_and(|w| start.elapsed() > w) {
                return Err(format!(
                    "unmounted, but the mount process {pid} is still running after {}s, uploading what was closed \
                     (its log says what); run `bucketfs unmount {}` again to wait for it",
                    start.elapsed().as_secs(),
                    canonical.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // A process that finished its work removed its pid file; one still naming it ended
        // midway (killed, or crashed): what it had not uploaded yet was not uploaded.
        if pid_in(&pid_file) == Some(pid) {
            return Err(format!(
                "unmounted, but the mount process {pid} ended before it finished its work (killed, or it crashed): \
                 files closed on it and not uploaded yet are kept in its staging directory; mounting {} again \
                 uploads them (`bucketfs sync` then waits for them)",
                canonical.display()
            ));
        }
    }
    // Uploads that still failed at the end are kept on local disk, never dropped, and bytes
    // a crash left never closed were set aside, not uploaded: say so.
    match std::fs::read_to_string(paths::pending_file(&canonical)) {
        Ok(text) => Err(report(&paths::PendingNote::parse(&text), &canonical)),
        Err(_) => Ok(()),
    }
}

/// What an unmount says of what the mount left ([`paths::PendingNote`]).
pub(crate) fn report(note: &paths::PendingNote, canonical: &Path) -> String {
    let mut parts = Vec::new();
    if !note.pending.is_empty() {
        parts.push(format!(
            "{} change(s) could not be made in the bucket and are kept on local disk ({}); mounting {} again makes them: {}",
            note.pending.len(),
            note.staging.display(),
            canonical.display(),
            note.pending.join(", ")
        ));
    }
    if !note.set_aside.is_empty() {
        let files: Vec<String> = note.set_aside.iter().map(|(k, p)| format!("{k} -> {}", p.display())).collect();
        parts.push(format!(
            "{} file(s) were not uploaded and their bytes are kept in lost+found (bytes never closed before a mount stopped, or that the bucket refused, as an exclusive create whose name another client took; the log says why for each; copy back what you want): {}",
            files.len(),
            files.join(", ")
        ));
    }
    format!("unmounted, but {}", parts.join("; and "))
}

/// Detach the kernel's mount at `canonical` (fails while a process uses it). `pid`: the
/// mount's own process, if it runs.
fn unmount(canonical: &Path, pid: Option<i32>) -> Result<(), String> {
    let out = Command::new("fusermount3")
        .arg("-u")
        .arg(canonical)
        .output()
        .map_err(|e| format!("cannot run fusermount3 (install fuse3): {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if why.contains("busy") {
        if let Some(pid) = pid.filter(|&p| !answers(canonical) && running(p)) {
            // A caller waiting on a stopped or hung daemon holds the mount: the daemon is
            // the one to look at, not the caller (tester S).
            return Err(format!(
                "{} is busy, and its mount process {pid} does not answer (stopped, as by SIGSTOP, or hung): \
                 resume it (kill -CONT {pid}) or end it (kill {pid}; closed files not yet uploaded are \
                 kept for the next mount), or detach the mount point at once with umount -l {}",
                canonical.display(),
                canonical.display()
            ));
        }
        return Err(format!(
            "{} is busy: a process still uses it (find it with: fuser -vm {})",
            canonical.display(),
            canonical.display()
        ));
    }
    Err(format!("cannot unmount {}: {why}", canonical.display()))
}

/// Whether the mount at `path` answers a `statfs` within 2 s (asked on a thread of its
/// own, which a hung daemon leaves waiting in the kernel).
fn answers(path: &Path) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(bucketfs_csi::mounts::statvfs(&p).is_ok());
    });
    rx.recv_timeout(Duration::from_secs(2)).unwrap_or(false)
}

/// The pid a pid file names, if it names one.
fn pid_in(file: &Path) -> Option<i32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

fn running(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid)
}

/// Whether process `pid` is the one that wrote the pid file `file`: it started before the
/// file was written (a pid reused after a crash belongs to a process started later). By
/// times, not names: `bucketfs mount s3://b .` or a mount point reached through a symlink
/// name it otherwise than its canonical path.
fn wrote(pid: i32, file: &Path) -> bool {
    let Ok(written) = std::fs::metadata(file).and_then(|m| m.modified()) else { return false };
    started_at(pid).is_some_and(|started| started <= written + Duration::from_secs(1))
}

/// When process `pid` started: its start in clock ticks after boot (`/proc/PID/stat`, field
/// 22) and the boot time (`/proc/stat`, `btime`).
fn started_at(pid: i32) -> Option<std::time::SystemTime> {
    // After the command, state is field 3: start time is the 20th field from it.
    let ticks: u64 = stat_fields(pid)?.split_whitespace().nth(19)?.parse().ok()?;
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok().filter(|&h| h > 0)?;
    let at = Duration::from_secs(boot) + Duration::from_millis(ticks * 1000 / hz);
    Some(std::time::UNIX_EPOCH + at)
}

/// The fields of `/proc/PID/stat` after the command (which may hold spaces and
/// parentheses), from field 3 (state) on.
fn stat_fields(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.rsplit_once(')')?.1.trim_start().to_string())
}

fn is_zombie(pid: i32) -> bool {
    stat_fields(pid).is_none_or(|f| f.starts_with('Z'))
}
