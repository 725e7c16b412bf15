//! Is a file some process's running program?
//!
//! Opening a running program for writing fails with ETXTBSY, and for `O_WRONLY` or `O_RDWR`
//! the kernel checks that before it asks us to open. For `open(O_RDONLY|O_TRUNC)` on a FUSE
//! mount with atomic O_TRUNC it asks first and checks after: by then it has set the file's
//! size to 0 and dropped its pages, so the running program dies of SIGBUS at its next page
//! fault, while the open itself still fails. The adapter asks here before such an open.
//!
//! What holds the kernel's mark is each process's program file, `/proc/PID/exe`. It points
//! there from early in `execve`, before the program's file is mapped (so `/proc/PID/maps`
//! misses a program just started; `exe` missed none in 800 runs), though not for the very
//! first reads of the file. `statx` of that link with `AT_STATX_DONT_SYNC` gives the file's
//! device and inode from the kernel's inode, without any request to its file system (so
//! neither a call back into this mount nor a hung mount elsewhere).
//!
//! Not seen: processes we may not inspect (another user's unless we are root, `hidepid`,
//! other PID namespaces) and a program whose first thread has ended. A running program
//! missed here still fails the open (the kernel's own check) and keeps its file: core
//! empties a file opened so only at the handle's flush, which a refused open never sends.
//! Only the program itself may then fault on its dropped pages.

use std::path::Path;

/// The device (major, minor) of the mount at `mountpoint` (absolute, canonical): the last
/// mount there in /proc/self/mountinfo, so look it up right after mounting.
pub fn mount_device(mountpoint: &Path) -> Option<(u32, u32)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    crate::readahead::device_of(&info, &mountpoint.to_string_lossy()).and_then(|d| parse_dev(&d))
}

/// Whether any process we can see runs inode `ino` of device `dev` (major, minor).
pub fn is_running(dev: (u32, u32), ino: u64) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else { return false };
    procs
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        .any(|e| program_of(&e.path().join("exe")) == Some((dev, ino)))
}

/// The device and inode of the file `link` leads to, from the kernel's cached inode.
fn program_of(link: &Path) -> Option<((u32, u32), u64)> {
    let path = std::ffi::CString::new(link.as_os_str().as_encoded_bytes()).ok()?;
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statx buffer the call fills.
    let r = unsafe { libc::statx(libc::AT_FDCWD, path.as_ptr(), libc::AT_STATX_DONT_SYNC, libc::STATX_INO, &mut st) };
    (r == 0).then_some(((st.stx_dev_major, st.stx_dev_minor), st.stx_ino))
}

/// mountinfo's `major:minor`.
fn parse_dev(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn reads_devices() {
        assert_eq!(parse_dev("0:45"), Some((0, 45)));
        assert_eq!(parse_dev("253:2"), Some((253, 2)));
        assert_eq!(parse_dev("045"), None);
    }

    #[test]
    fn a_running_program_is_seen_until_it_ends() {
        // Beside the test binary, under target/: /tmp may be mounted noexec.
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().unwrap().join(format!("bucketfs-running-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let prog = dir.join("sleeper");
        std::fs::copy("/bin/sleep", &prog).unwrap();
        let meta = std::fs::metadata(&prog).unwrap();
        let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
        assert!(!is_running(dev, meta.ino()), "not running yet");
        let mut child = std::process::Command::new(&prog).arg("30").spawn().unwrap();
        let seen = is_running(dev, meta.ino());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(seen, "a program is seen as soon as it is started");
        assert!(!is_running(dev, meta.ino()), "not running any more");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
