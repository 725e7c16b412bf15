//! Pre-flight checks that turn common mistakes into one clear line before anything mounts.

use std::path::{Path, PathBuf};

/// The positional arguments of `bucketfs mount` make sense: a URL alone means the mount
/// point was forgotten (not a mount point called `s3://...`), and a URL in the mount point's
/// place means the two were swapped. `url` is `None` when only one argument was given.
pub fn positionals(url: Option<&str>, mp: &Path) -> Result<(), String> {
    let mp_text = mp.to_string_lossy();
    let looks_like_url = |s: &str| s.contains("://") || s == "mem:";
    match url {
        None if looks_like_url(&mp_text) => Err(format!(
            "the mount point is missing: only the store {mp_text} was given \
             (usage: bucketfs mount URL MOUNTPOINT)"
        )),
        Some(u) if looks_like_url(&mp_text) && !looks_like_url(u) => {
            Err(format!("the URL comes first: bucketfs mount {mp_text} {u} (usage: bucketfs mount URL MOUNTPOINT)"))
        }
        Some(_) if looks_like_url(&mp_text) => {
            Err(format!("{mp_text} is a URL, not a mount point (usage: bucketfs mount URL MOUNTPOINT)"))
        }
        _ => Ok(()),
    }
}

/// The mount point must exist, be a directory, and not be mounted already.
pub fn mountpoint(mp: &Path) -> Result<PathBuf, String> {
    // Asked of the mount table first, by the path as given: a `stat` of a FUSE mount whose
    // process is stopped or hung waits for it for good (tester H: still blocked at 150 s).
    let given = std::path::absolute(mp).unwrap_or_else(|_| mp.to_path_buf());
    if let Some(fstype) = mounted_fstype(&given).filter(|t| t != "autofs") {
        return Err(already_mounted(&given, &fstype));
    }
    let meta = std::fs::metadata(mp).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            format!("mount point {} does not exist; create it first (mkdir -p {})", mp.display(), mp.display())
        }
        // A mount whose process died: the kernel mount stays until unmounted.
        _ if e.raw_os_error() == Some(libc::ENOTCONN) => format!(
            "mount point {} is a mount whose process has ended (transport endpoint not connected): \
             run `bucketfs unmount {}` (or `fusermount3 -u {}`), then mount again",
            mp.display(),
            mp.display(),
            mp.display()
        ),
        _ => format!("cannot use mount point {}: {e}", mp.display()),
    })?;
    if !meta.is_dir() {
        return Err(format!("mount point {} is not a directory; give an empty directory", mp.display()));
    }
    let canonical = std::fs::canonicalize(mp).map_err(|e| format!("cannot resolve {}: {e}", mp.display()))?;
    // Under systemd's automount (x-systemd.automount) the mount point is an autofs mount
    // waiting for this one to be mounted over it.
    if let Some(fstype) = mounted_fstype(&canonical).filter(|t| t != "autofs") {
        return Err(already_mounted(&canonical, &fstype));
    }
    Ok(canonical)
}

fn already_mounted(mp: &Path, fstype: &str) -> String {
    format!(
        "{} is already a mount point ({fstype}); unmount it first (bucketfs unmount {})",
        mp.display(),
        mp.display()
    )
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

/// Refuse a directory the mount itself needs (`what`: the staging or cache directory, a
/// local folder store) inside the mount point `mp` (canonical, as [`mountpoint`] returns
/// it): the daemon would make and write its files through its own mount, and wait on
/// itself for good. Inside as given (once mounted, that path goes through the mount) or
/// with its symlinks resolved.
pub fn outside_mountpoint(mp: &Path, what: &str, dir: Option<&Path>) -> Result<(), String> {
    let Some(dir) = dir else { return Ok(()) };
    // As given too (a path through the mount point that does not exist yet is not
    // resolved), unless a `..` leads out of it (`mnt/../st` is beside it).
    let abs = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let climbs = abs.components().any(|c| c == std::path::Component::ParentDir);
    if crate::paths::resolved(dir).starts_with(mp) || abs.starts_with(mp) && !climbs {
        return Err(format!(
            "{what} {} is inside the mount point {}: bucketfs would write it through its own mount and wait on itself; choose a directory outside it",
            dir.display(),
            mp.display()
        ));
    }
    Ok(())
}

/// Make the cache directory given with `--cache-dir` (`dir`), or refuse it with what to do:
/// without this a file there (or a directory bucketfs cannot make) left the mount without
/// a disk cache while `bucketfs status` showed one.
pub fn cache_dir_usable(dir: Option<&Path>) -> Result<(), String> {
    let Some(dir) = dir else { return Ok(()) };
    std::fs::create_dir_all(dir).map_err(|e| {
        format!(
            "cannot use the cache directory {}: {e}; give a directory bucketfs can create and write (--cache-dir), or turn the disk cache off with --disk-cache-mib 0",
            dir.display()
        )
    })
}

/// Refuse a mount point `mp` (canonical) inside the local folder `folder` it shows: each
/// listing of the folder would list the mount, which lists the folder (`ls` took 10 s to
/// fail, the log filled with timeouts, and `bucketfs unmount` found the daemon itself
/// holding the mount point busy).
pub fn mountpoint_outside_folder(mp: &Path, folder: &Path) -> Result<(), String> {
    let real = std::fs::canonicalize(folder).unwrap_or_else(|_| folder.to_path_buf());
    if mp.starts_with(&real) {
        return Err(format!(
            "the mount point {} is inside the local folder {} it would show: the mount would list itself; choose a mount point outside the folder",
            mp.display(),
            folder.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory beside the mount point named through it (`mnt/../st`) is not inside it;
    /// one below it is, also through a link or a `..` that stays inside.
    #[test]
    fn a_directory_named_through_the_mount_point_is_judged_by_where_it_is() {
        let base = std::env::temp_dir().join(format!("bucketfs-inside-{}", std::process::id()));
        std::fs::create_dir_all(base.join("mnt/sub")).unwrap();
        let _ = std::fs::remove_file(base.join("link"));
        std::os::unix::fs::symlink(base.join("mnt"), base.join("link")).unwrap();
        let mp = std::fs::canonicalize(base.join("mnt")).unwrap();
        let check = |p: &str| outside_mountpoint(&mp, "the staging directory", Some(&base.join(p)));
        assert!(check("mnt/../st").is_ok());
        assert!(check("st").is_ok());
        for inside in ["mnt/st", "mnt/sub/../st", "link/st", "link/sub"] {
            assert!(check(inside).unwrap_err().contains("inside the mount point"), "{inside}");
        }
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn a_mount_point_inside_the_local_folder_is_refused() {
        let base = std::env::temp_dir().join(format!("bucketfs-selfmount-{}", std::process::id()));
        std::fs::create_dir_all(base.join("folder/mp")).unwrap();
        std::fs::create_dir_all(base.join("elsewhere")).unwrap();
        let real = |p: &str| std::fs::canonicalize(base.join(p)).unwrap();
        let e = mountpoint_outside_folder(&real("folder/mp"), &base.join("folder")).unwrap_err();
        assert!(e.contains("inside the local folder") && e.contains("outside the folder"), "{e}");
        assert!(mountpoint_outside_folder(&real("folder"), &base.join("folder")).is_err(), "the folder itself");
        assert!(mountpoint_outside_folder(&real("elsewhere"), &base.join("folder")).is_ok());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_cache_dir_that_is_a_file_is_refused_and_a_missing_one_made() {
        let base = std::env::temp_dir().join(format!("bucketfs-cachedir-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        std::fs::write(base.join("file"), b"x").unwrap();
        let e = cache_dir_usable(Some(&base.join("file"))).unwrap_err();
        assert!(e.contains("cannot use the cache directory") && e.contains("--disk-cache-mib 0"), "{e}");
        cache_dir_usable(Some(&base.join("new/cache"))).unwrap();
        assert!(base.join("new/cache").is_dir());
        assert!(cache_dir_usable(None).is_ok());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_url_alone_is_a_missing_mount_point() {
        let e = positionals(None, Path::new("s3://my-bucket")).unwrap_err();
        assert!(e.contains("mount point is missing") && !e.contains("mkdir"), "{e}");
        assert!(positionals(None, Path::new("gs://b/p")).is_err());
        // One argument that is a directory: the embedded default store.
        assert!(positionals(None, Path::new("/mnt/b")).is_ok());
        assert!(positionals(Some("s3://b"), Path::new("/mnt/b")).is_ok());
    }

    #[test]
    fn swapped_arguments_say_which_comes_first() {
        let e = positionals(Some("/mnt/b"), Path::new("s3://b")).unwrap_err();
        assert!(e.contains("bucketfs mount s3://b /mnt/b"), "{e}");
        assert!(positionals(Some("s3://a"), Path::new("s3://b")).is_err());
    }
}
