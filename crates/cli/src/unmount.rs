//! `bucketfs unmount`: unmount, then wait for the mount's process to finish its work.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{checks, paths};

/// How long to wait for the mount process to exit after the kernel let go.
const EXIT_WAIT: Duration = Duration::from_secs(60);

pub fn run(mp: &Path) -> Result<(), String> {
    let canonical = std::fs::canonicalize(mp).map_err(|e| format!("cannot resolve {}: {e}", mp.display()))?;
    match checks::mounted_fstype(&canonical) {
        Some(t) if t.starts_with("fuse") => {}
        Some(t) => return Err(format!("{} is a {t} mount, not a bucketfs one", canonical.display())),
        None => return Err(format!("{} is not mounted", canonical.display())),
    }
    // The mount's process, if its pid file names one that still serves this mount point
    // (after a crash the file stays, and its pid may be another process's by now).
    let pid: Option<i32> = std::fs::read_to_string(paths::pid_file(&canonical))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|&pid| serves(pid, &canonical));
    let out = Command::new("fusermount3")
        .arg("-u")
        .arg(&canonical)
        .output()
        .map_err(|e| format!("cannot run fusermount3 (install fuse3): {e}"))?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if why.contains("busy") {
            return Err(format!(
                "{} is busy: a process still uses it (find it with: fuser -vm {})",
                canonical.display(),
                canonical.display()
            ));
        }
        return Err(format!("cannot unmount {}: {why}", canonical.display()));
    }
    if let Some(pid) = pid {
        let start = Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid) {
            if start.elapsed() > EXIT_WAIT {
                return Err(format!(
                    "unmounted, but the mount process {pid} is still running after {}s",
                    EXIT_WAIT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // Uploads that still failed at the end are kept on local disk, never dropped: say so.
    if let Ok(note) = std::fs::read_to_string(paths::pending_file(&canonical)) {
        let mut lines = note.lines();
        let staging = lines.next().unwrap_or_default().to_string();
        let keys: Vec<&str> = lines.collect();
        return Err(format!(
            "unmounted, but {} change(s) could not be made in the bucket and are kept on local disk ({staging}); mounting {} again makes them: {}",
            keys.len(),
            canonical.display(),
            keys.join(", ")
        ));
    }
    Ok(())
}

/// Whether process `pid` looks like the bucketfs mount of `mp`: its program is bucketfs and
/// an argument ends with the mount point's name (paths are not resolved: a hung mount would
/// hang that).
fn serves(pid: i32, mp: &Path) -> bool {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let is_bucketfs = exe.file_name().is_some_and(|n| n.to_string_lossy().starts_with("bucketfs"));
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let name = mp.file_name().map(|n| n.as_encoded_bytes().to_vec()).unwrap_or_default();
    let trimmed = |a: &[u8]| a.strip_suffix(b"/").unwrap_or(a).to_vec();
    is_bucketfs && cmdline.split(|&b| b == 0).any(|a| !name.is_empty() && trimmed(a).ends_with(&name))
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        .unwrap_or(true)
}
