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

/// How often `bucketfs sync` says what it is still waiting for.
const SYNC_PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// How long `bucketfs sync` waits for the status it reports alongside: the mount process
/// may not answer (stopped, hung), and `--timeout` must still hold (a 5 s one took 20 s).
const SYNC_STATUS_WAIT: Duration = Duration::from_secs(1);

/// `bucketfs sync`: waits as long as the uploads take, or at most `timeout`; every 10 s it
/// says on stderr what is still pending and why (a store that does not answer keeps an
/// upload in flight without an error). An error names the files still not in the bucket.
pub fn sync(mp: &Path, timeout: Option<Duration>) -> Result<(), String> {
    let started = std::time::Instant::now();
    let mut conn = connect(mp)?;
    conn.write_all(b"sync\n").map_err(|e| format!("cannot ask the mount process: {e}"))?;
    let mut answer = Vec::new();
    // Bytes the mount had sent at the last progress line: whether uploads move.
    let mut sent = bytes_sent(mp);
    loop {
        let left = timeout.map(|t| t.saturating_sub(started.elapsed()));
        if left.is_some_and(|l| l.is_zero()) {
            let pending = pending_now(mp, &mut sent);
            return Err(format!(
                "timed out after {}s; the mount keeps uploading and retrying. {pending}",
                started.elapsed().as_secs()
            ));
        }
        let wait = left.map_or(SYNC_PROGRESS_EVERY, |l| l.min(SYNC_PROGRESS_EVERY));
        conn.set_read_timeout(Some(wait)).map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4096];
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                say!(
                    "bucketfs sync: still waiting after {}s. {}",
                    started.elapsed().as_secs(),
                    pending_now(mp, &mut sent)
                );
            }
            Err(e) => return Err(format!("no answer from the mount process: {e}")),
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    if let Some(e) = answer.strip_prefix("error: ") {
        return Err(e.trim_end().to_string());
    }
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

/// The bytes the mount has sent to the store so far, from its status.
fn bytes_sent(mp: &Path) -> Option<u64> {
    let json = ask(mp, "status json", Some(SYNC_STATUS_WAIT)).ok()?;
    serde_json::from_str::<serde_json::Value>(&json).ok()?["bytes_written"].as_u64()
}

/// One sentence of what a sync still waits for, from the mount's status. `sent`: the bytes
/// the mount had sent at the last call (updated), to tell uploads that move from a store
/// that does not answer.
fn pending_now(mp: &Path, sent: &mut Option<u64>) -> String {
    let Ok(json) = ask(mp, "status json", Some(SYNC_STATUS_WAIT)) else {
        return "The mount process does not answer a status request either.".to_string();
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&json) else { return String::new() };
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let mut s = pending_sentence(&v);
    let waiting: Vec<&str> =
        v["write_back_pending"].as_array().into_iter().flatten().filter_map(|k| k.as_str()).collect();
    if !waiting.is_empty() {
        s.push_str(&format!("\n  waiting: {}", waiting.join(", ")));
        if n("write_back_files") > waiting.len() as u64 {
            s.push_str(&format!(" and {} more", n("write_back_files") - waiting.len() as u64));
        }
    }
    let failing = v["upload_errors"].as_array().cloned().unwrap_or_default();
    let now_sent = v["bytes_written"].as_u64();
    let moved = match (now_sent, std::mem::replace(sent, now_sent)) {
        (Some(now), Some(before)) => Some(now.saturating_sub(before)),
        _ => None,
    };
    // (Bytes count as sent once handed to an upload: a slow part still counts as moving.)
    match moved {
        Some(b) if b > 0 => {
            s.push_str(&format!(" Uploading: {:.1} MiB sent since the last line.", b as f64 / 1048576.0))
        }
        _ if failing.is_empty() => s.push_str(
            " No upload has failed; those in flight have not finished yet (a slow store, or one that does not answer).",
        ),
        _ => {}
    }
    for f in failing.iter().take(10) {
        s.push_str(&format!(
            "\n  {}: {} attempt(s), last error: {}",
            f["key"].as_str().unwrap_or("?"),
            f["attempts"].as_u64().unwrap_or(0),
            f["error"].as_str().unwrap_or("?")
        ));
    }
    if failing.len() > 10 {
        s.push_str(&format!("\n  and {} more (bucketfs status {})", failing.len() - 10, mp.display()));
    }
    s
}

/// What is pending, from a status: the write-back queue's files, or else the uploads in
/// flight (a durable close's, a version sent again), which the queue does not count: a
/// slow resend read "0 file(s) (0.0 MiB) to upload, the oldest closed 0s ago" (tester L).
fn pending_sentence(v: &serde_json::Value) -> String {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let files = match (n("write_back_files"), n("pending_uploads")) {
        (0, 0) => "no file to upload".to_string(),
        (0, busy) => format!("{busy} file(s) being uploaded or written"),
        (queued, _) => format!(
            "{queued} file(s) ({:.1} MiB) to upload, the oldest closed {}s ago",
            n("write_back_bytes") as f64 / (1024.0 * 1024.0),
            n("write_back_oldest_secs")
        ),
    };
    format!("Pending: {files}; {} delete(s) or directory marker(s).", n("write_back_deletes"))
}

/// Send one request line to the mount process of `mp` and read its answer; an `error: `
/// answer becomes `Err`.
fn ask(mp: &Path, request: &str, timeout: Option<Duration>) -> Result<String, String> {
    let mut conn = connect(mp)?;
    conn.set_read_timeout(timeout).map_err(|e| e.to_string())?;
    conn.write_all(format!("{request}\n").as_bytes()).map_err(|e| format!("cannot ask the mount process: {e}"))?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).map_err(|e| format!("no answer from the mount process: {e}"))?;
    if let Some(e) = answer.strip_prefix("error: ") {
        return Err(e.trim_end().to_string());
    }
    Ok(answer)
}

/// The control socket of the bucketfs mount at `mp`, connected.
fn connect(mp: &Path) -> Result<UnixStream, String> {
    let canonical = std::fs::canonicalize(mp).map_err(|e| format!("cannot resolve {}: {e}", mp.display()))?;
    match checks::mounted_fstype(&canonical) {
        // fusermount3 may record the type as plain "fuse"; the control socket tells.
        Some(t) if t == "fuse" || t == "fuse.bucketfs" => {}
        Some(t) => return Err(format!("{} is a {t} mount, not a bucketfs one", canonical.display())),
        None => {
            // Unmounted, its process still sending what was closed (an unmount that gave
            // up waiting, `fusermount3 -u`): it still answers (tester S: "nothing is mounted
            // there" while it uploaded for 75 s).
            if let Ok(conn) = UnixStream::connect(paths::control_socket(&canonical)) {
                say!(
                    "bucketfs: {} is unmounted; its process is still finishing what was closed (`bucketfs unmount {}` waits for it):",
                    canonical.display(),
                    canonical.display()
                );
                return Ok(conn);
            }
            return Err(format!("{} is not a bucketfs mount (nothing is mounted there)", canonical.display()));
        }
    }
    let sock = paths::control_socket(&canonical);
    if !sock.exists() {
        return Err(format!(
            "{} is not a bucketfs mount: a FUSE mount without a bucketfs control socket ({}); or it was mounted by another user",
            canonical.display(),
            sock.display()
        ));
    }
    UnixStream::connect(&sock).map_err(|e| match e.kind() {
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
    })
}

#[cfg(test)]
mod tests {
    use super::pending_sentence;

    #[test]
    fn the_pending_line_names_what_is_pending() {
        let queued = serde_json::json!({"write_back_files": 2, "pending_uploads": 3,
            "write_back_bytes": 3 << 20, "write_back_oldest_secs": 7, "write_back_deletes": 1});
        assert_eq!(
            pending_sentence(&queued),
            "Pending: 2 file(s) (3.0 MiB) to upload, the oldest closed 7s ago; 1 delete(s) or directory marker(s)."
        );
        let resend = serde_json::json!({"write_back_files": 0, "pending_uploads": 1, "write_back_deletes": 0});
        assert_eq!(
            pending_sentence(&resend),
            "Pending: 1 file(s) being uploaded or written; 0 delete(s) or directory marker(s)."
        );
        let none = serde_json::json!({"write_back_deletes": 2});
        assert_eq!(pending_sentence(&none), "Pending: no file to upload; 2 delete(s) or directory marker(s).");
    }
}
