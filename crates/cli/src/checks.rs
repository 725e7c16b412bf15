//! Pre-flight checks that turn common mistakes into one clear line before anything mounts.

use std::path::{Path, PathBuf};

/// The mount point must exist, be a directory, and not be mounted already.
pub fn mountpoint(mp: &Path) -> Result<PathBuf, String> {
    let meta = std::fs::metadata(mp).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            format!("mount point {} does not exist; create it first (mkdir -p {})", mp.display(), mp.display())
        }
        _ => format!("cannot use mount point {}: {e}", mp.display()),
    })?;
    if !meta.is_dir() {
        return Err(format!("mount point {} is not a directory; give an empty directory", mp.display()));
    }
    let canonical = std::fs::canonicalize(mp).map_err(|e| format!("cannot resolve {}: {e}", mp.display()))?;
    if let Some(fstype) = mounted_fstype(&canonical) {
        return Err(format!(
            "{} is already a mount point ({fstype}); unmount it first (bucketfs unmount {})",
            canonical.display(),
            canonical.display()
        ));
    }
    Ok(canonical)
}

/// The filesystem type mounted exactly at `path`, from /proc/self/mountinfo.
pub fn mounted_fstype(path: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.to_string_lossy();
    info.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let mount_point = unescape(fields.get(4)?);
        let sep = fields.iter().position(|f| *f == "-")?;
        (mount_point == want).then(|| fields.get(sep + 1).unwrap_or(&"?").to_string())
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
}

/// FUSE needs /dev/fuse.
pub fn fuse_device() -> Result<(), String> {
    if Path::new("/dev/fuse").exists() {
        Ok(())
    } else {
        Err("FUSE is not available: /dev/fuse is missing; load the module (modprobe fuse) and install fuse3".into())
    }
}
