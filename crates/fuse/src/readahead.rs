//! The kernel's readahead for a mount (its backing device's `read_ahead_kb` in sysfs).
//!
//! A FUSE mount starts with the kernel's default readahead, 128 KiB, and the `max_readahead`
//! asked for at init can only lower it. Reads through the page cache then reach us as
//! 128 KiB requests, eight times as many as the 1 MiB the connection allows. Raising it is
//! a sysfs write, which only root may do; others keep the default.

use std::io;
use std::path::Path;

/// Set the readahead of the FUSE mount at `mountpoint` (absolute, canonical) to `kib` KiB.
/// Returns the value it had.
pub fn set_read_ahead(mountpoint: &Path, kib: u32) -> io::Result<u32> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let dev = device_of(&info, &mountpoint.to_string_lossy())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "mount point not in /proc/self/mountinfo"))?;
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    let old = std::fs::read_to_string(&path)?.trim().parse().unwrap_or(0);
    std::fs::write(&path, kib.to_string())?;
    Ok(old)
}

/// The `major:minor` of the last mount on `mountpoint` in a mountinfo table.
pub(crate) fn device_of(mountinfo: &str, mountpoint: &str) -> Option<String> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() > 4 && unescape(f[4]) == mountpoint).then(|| f[2].to_string())
        })
        .next_back()
}

/// mountinfo writes space, tab, newline and backslash in paths as `\ooo` octal escapes.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b.get(i + 1..i + 4).and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match (b[i], oct) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n\
        40 22 0:41 / /tmp/a\\040b rw,nosuid - fuse.bucketfs s3://x rw\n\
        41 22 0:52 / /mnt/m rw - fuse.bucketfs s3://y rw\n\
        42 41 0:53 / /mnt/m rw - fuse.bucketfs s3://z rw\n";

    #[test]
    fn finds_the_last_mount_on_a_path() {
        assert_eq!(device_of(INFO, "/mnt/m").as_deref(), Some("0:53"));
        assert_eq!(device_of(INFO, "/tmp/a b").as_deref(), Some("0:41"));
        assert_eq!(device_of(INFO, "/tmp/a"), None);
    }

    #[test]
    fn unescapes_octal() {
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
        assert_eq!(unescape("plain\\x"), "plain\\x");
    }
}
