//! `bucketfs status MOUNTPOINT` and `bucketfs sync MOUNTPOINT`: ask a running mount, over its
//! control socket, what it is doing (pending uploads, cache use, request counts since mount,
//! the store URL), or to upload everything closed so far and say when it is done.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::{checks, paths};

/// A mount process answers `status` from memory; more than this means it is stuck.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

pub fn run(mp: &Path, json: bool) -> Result<(), String> {
    let request = if json { "status json" } else { "status" };
    print!("{}", ask(mp, request, Some(ANSWER_TIMEOUT))?);
    Ok(())
}

/// `bucketfs sync`: waits as long as the uploads take (no timeout); an error names the
/// files still not in the bucket.
pub fn sync(mp: &Path) -> Result<(), String> {
    let answer = ask(mp, "sync", None)?;
    if answer.trim().is_empty() {
        return Err(format!(
            "the mount process of {} ended before the sync finished: run `bucketfs unmount {}`, then mount \
             again (the next mount uploads what it had not)",
            mp.display(),
            mp.display()
        ));
    }
    if answer.trim() != "ok" {
        return Err(format!("unexpected answer from the mount process: {answer}"));
    }
    Ok(())
}

/// Send one request line to the mount process of `mp` and read its answer; an `error: `
/// answer becomes `Err`.
fn ask(mp: &Path, request: &str, timeout: Option<Duration>) -> Result<String, String> {
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
    let mut conn = UnixStream::connect(&sock).map_err(|e| match e.kind() {
        // The socket file outlived its process (killed): the mount is dead.
        std::io::ErrorKind::ConnectionRefused => format!(
            "the mount process of {} has ended (nothing answers at {}): run `bucketfs unmount {}`, \
             then mount again; files it had not uploaded are uploaded by that next mount",
            canonical.display(),
            sock.display(),
            canonical.display()
        ),
        _ => format!(
            "cannot reach the mount process of {} at {} ({e}); was it mounted by another user or an older bucketfs?",
            canonical.display(),
            sock.display()
        ),
    })?;
    conn.set_read_timeout(timeout).map_err(|e| e.to_string())?;
    conn.write_all(format!("{request}\n").as_bytes()).map_err(|e| format!("cannot ask the mount process: {e}"))?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).map_err(|e| format!("no answer from the mount process: {e}"))?;
    if let Some(e) = answer.strip_prefix("error: ") {
        return Err(e.trim_end().to_string());
    }
    Ok(answer)
}
