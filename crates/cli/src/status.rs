//! `bucketfs status MOUNTPOINT`: ask a running mount, over its control socket, what it is
//! doing (pending uploads, cache use, request counts since mount, the store URL).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::{checks, paths};

/// A mount process answers from memory; more than this means it is stuck.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

pub fn run(mp: &Path, json: bool) -> Result<(), String> {
    let canonical = std::fs::canonicalize(mp).map_err(|e| format!("cannot resolve {}: {e}", mp.display()))?;
    match checks::mounted_fstype(&canonical) {
        // fusermount3 may record the type as plain "fuse"; the control socket tells.
        Some(t) if t == "fuse" || t == "fuse.bucketfs" => {}
        Some(t) => return Err(format!("{} is a {t} mount, not a bucketfs one", canonical.display())),
        None => return Err(format!("{} is not a bucketfs mount (nothing is mounted there)", canonical.display())),
    }
    let sock = paths::control_socket(&canonical);
    if !sock.exists() {
        return Err(format!(
            "{} is not a bucketfs mount: a FUSE mount without a bucketfs control socket ({}); or it was mounted by another user",
            canonical.display(),
            sock.display()
        ));
    }
    let mut conn = UnixStream::connect(&sock).map_err(|e| {
        format!(
            "cannot reach the mount process of {} at {} ({e}); was it mounted by another user or an older bucketfs?",
            canonical.display(),
            sock.display()
        )
    })?;
    conn.set_read_timeout(Some(ANSWER_TIMEOUT)).map_err(|e| e.to_string())?;
    let request: &[u8] = if json { b"status json\n" } else { b"status\n" };
    conn.write_all(request).map_err(|e| format!("cannot ask the mount process: {e}"))?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).map_err(|e| format!("no answer from the mount process: {e}"))?;
    if let Some(e) = answer.strip_prefix("error: ") {
        return Err(e.trim().to_string());
    }
    print!("{answer}");
    Ok(())
}
