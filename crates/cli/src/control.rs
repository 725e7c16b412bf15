//! The per-mount control socket: a Unix stream socket in the runtime directory (next to the
//! pid file, named `<mount>.sock`, mode 0600) served by the mount process. A client sends
//! one line, `status` (human text), `status json`, or `sync` (answered once everything
//! closed so far is uploaded: `ok`, or `error: ` and one line per file that failed), and
//! reads the answer until EOF.
//! The answer never contains credentials: the store URL has none, and the endpoint is
//! shown without any `user:password@` part.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

/// A request line longer than this is refused ("status json" is 11 bytes).
const MAX_REQUEST: u64 = 256;
/// A client that sends no request line within this is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Everything `bucketfs status` shows, at one moment (`status json`: these fields, in this
/// order; `upload_errors` as objects `{key, attempts, error}`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Status {
    pub mountpoint: String,
    pub store: String,
    pub endpoint: Option<String>,
    pub pid: u32,
    pub read_only: bool,
    pub uptime_secs: u64,
    pub pending_uploads: u64,
    pub staged_files: u64,
    pub memory_cache_bytes: u64,
    pub memory_cache_limit: u64,
    pub disk_cache_bytes: u64,
    pub disk_cache_limit: u64,
    /// Names kept in memory (inodes and cached listing entries), and their bound (0: none).
    pub cached_entries: u64,
    pub max_cached_entries: u64,
    pub requests: u64,
    pub errors: u64,
    pub not_found: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Bytes of new versions kept in the store (copied there) instead of sent again: what
    /// uploads of only what changed saved.
    pub bytes_copied: u64,
    /// Write-back mode, and its queue: files and bytes closed but not yet uploaded, the
    /// oldest one's age, files uploaded since mount, and each failing file (key, attempts, error).
    pub write_back: bool,
    pub write_back_files: u64,
    pub write_back_bytes: u64,
    pub write_back_oldest_secs: u64,
    pub write_back_uploaded: u64,
    /// Unlinked files whose DELETE is journaled and not done yet.
    pub write_back_deletes: u64,
    /// Deferred changes the store refused for good since mount (not retried; logged).
    #[serde(default)]
    pub write_back_refused: u64,
    #[serde(serialize_with = "upload_errors_json")]
    pub upload_errors: Vec<(String, u32, String)>,
    /// The first keys waiting for upload, oldest first (`bucketfs sync` names them).
    pub write_back_pending: Vec<String>,
    /// FUSE passthrough in use, and opens the kernel served from a local file since mount.
    pub passthrough: bool,
    pub passthrough_opens: u64,
    /// `--notify`: the event source (`None`: not asked for), whether its events flow, how
    /// many changed a cached name or were checked with the store instead, breaks and gaps
    /// so far, and while it is down, for how long and why.
    pub notify: Option<String>,
    pub notify_up: bool,
    pub notify_applied: u64,
    pub notify_checked: u64,
    pub notify_downs: u64,
    pub notify_gaps: u64,
    /// Kernel notices dropped in a flood of events (the kernel's caches expire within 1 s).
    pub notify_notices_dropped: u64,
    pub notify_down_secs: Option<u64>,
    pub notify_down_reason: Option<String>,
}

/// The `sync` request's work: upload everything queued, then the answer line(s).
pub type SyncFn = Arc<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = String> + Send>> + Send + Sync>;

/// The answer to `sync`: `ok`, or `error: N file(s) not uploaded` and one line per file.
pub fn sync_answer(failed: &[(String, String)]) -> String {
    if failed.is_empty() {
        return "ok\n".to_string();
    }
    let mut o = format!(
        "error: {} change(s) not in the bucket: a change the store refused is dropped and not retried (its line says why, and the log); the others are kept and retried (run `bucketfs sync` again once the store answers):\n",
        failed.len()
    );
    for (key, e) in failed {
        o.push_str(&format!("  {key}: {e}\n"));
    }
    o
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

impl Status {
    pub fn text(&self) -> String {
        let endpoint = self.endpoint.as_deref().map(|e| format!(" at {e}")).unwrap_or_default();
        let ro = if self.read_only { " (read-only)" } else { "" };
        let disk = if self.disk_cache_limit == 0 {
            "off".to_string()
        } else {
            format!("{} of {}", mib(self.disk_cache_bytes), mib(self.disk_cache_limit))
        };
        format!(
            "mount point:      {}\nstore:            {}{endpoint}{ro}\nprocess:          {}, up {}s\n\
             pending uploads:  {} ({} staged files)\nmemory cache:     {} of {}\ndisk cache:       {disk}\nnames in memory:  {}\n\
             store requests:   {} since mount, {} errors, {} not found\ntransferred:      {} read, {} written, {} kept in the store (not sent again)\n",
            self.mountpoint,
            self.store,
            self.pid,
            self.uptime_secs,
            self.pending_uploads,
            self.staged_files,
            mib(self.memory_cache_bytes),
            mib(self.memory_cache_limit),
            if self.max_cached_entries == 0 {
                format!("{} (no bound)", self.cached_entries)
            } else {
                format!("{} of {}", self.cached_entries, self.max_cached_entries)
            },
            self.requests,
            self.errors,
            self.not_found,
            mib(self.bytes_read),
            mib(self.bytes_written),
            mib(self.bytes_copied),
        ) + &self.write_back_text()
            + &if self.passthrough {
                format!(
                    "passthrough:      on, {} opens served by the kernel from local files\n",
                    self.passthrough_opens
                )
            } else {
                "passthrough:      off (see the log for why)\n".to_string()
            }
            + &self.notify_text()
    }

    fn notify_text(&self) -> String {
        let Some(src) = &self.notify else {
            return "store events:     off (freshness from --metadata-ttl)\n".to_string();
        };
        let mut counts = format!(
            "{} applied, {} checked with the store, {} breaks, {} gaps",
            self.notify_applied, self.notify_checked, self.notify_downs, self.notify_gaps
        );
        if self.notify_notices_dropped > 0 {
            counts += &format!(", {} kernel notices dropped in floods", self.notify_notices_dropped);
        }
        if self.notify_up {
            format!("store events:     {src}, flowing ({counts})\n")
        } else {
            format!(
                "store events:     {src}, DOWN for {}s ({}): freshness falls back to --metadata-ttl ({counts})\n",
                self.notify_down_secs.unwrap_or(0),
                self.notify_down_reason.as_deref().unwrap_or("unknown")
            )
        }
    }

    fn write_back_text(&self) -> String {
        if !self.write_back {
            return "write-back:       off (every close uploads)\n".to_string();
        }
        let mut o = format!(
            "write-back:       {} files ({}) waiting, oldest {}s; {} uploaded since mount; {} deletes pending; {} failing\n",
            self.write_back_files,
            mib(self.write_back_bytes),
            self.write_back_oldest_secs,
            self.write_back_uploaded,
            self.write_back_deletes,
            self.upload_errors.len()
        );
        for (key, attempts, e) in &self.upload_errors {
            o.push_str(&format!("  failing: {key} ({attempts} attempts): {e}\n"));
        }
        if self.write_back_refused > 0 {
            o.push_str(&format!(
                "  refused:  {} change(s) the store refused for good since mount, not retried (the log names them)\n",
                self.write_back_refused
            ));
        }
        o
    }

    pub fn json(&self) -> String {
        serde_json::to_string(self).expect("a Status always serializes") + "\n"
    }
}

/// Each failing upload as `{"key", "attempts", "error"}`.
fn upload_errors_json<S: serde::Serializer>(v: &[(String, u32, String)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(v.len()))?;
    for (key, attempts, error) in v {
        seq.serialize_element(&serde_json::json!({"key": key, "attempts": attempts, "error": error}))?;
    }
    seq.end()
}

/// Listens on `path` until the process exits; the socket file is removed by [`Server::drop`].
pub struct Server {
    path: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Bind `path` (replacing a stale socket of a dead mount) and answer requests in the background.
pub fn serve(
    rt: &tokio::runtime::Runtime,
    path: &Path,
    status: Arc<dyn Fn() -> Status + Send + Sync>,
    sync: SyncFn,
) -> Result<Server, String> {
    let _ = std::fs::remove_file(path);
    let listener = {
        let _guard = rt.enter();
        UnixListener::bind(path).map_err(|e| format!("cannot create control socket {}: {e}", path.display()))?
    };
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    rt.spawn(async move {
        loop {
            let Ok((conn, _)) = listener.accept().await else { continue };
            let status = status.clone();
            let sync = sync.clone();
            tokio::spawn(async move {
                let (rd, mut wr) = conn.into_split();
                let mut line = String::new();
                let mut rd = BufReader::new(tokio::io::AsyncReadExt::take(rd, MAX_REQUEST));
                if tokio::time::timeout(READ_TIMEOUT, rd.read_line(&mut line)).await.is_err() {
                    return;
                }
                let answer = match line.trim() {
                    "status" => status().text(),
                    "status json" => status().json(),
                    "sync" => sync().await,
                    other => {
                        format!("error: unknown request {other:?}; expected \"status\", \"status json\" or \"sync\"\n")
                    }
                };
                let _ = wr.write_all(answer.as_bytes()).await;
                let _ = wr.shutdown().await;
            });
        }
    });
    Ok(Server { path: path.to_path_buf() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_escaped_and_complete() {
        let st = Status {
            mountpoint: "/mnt/a \"b\"".into(),
            store: "s3://b/".into(),
            pending_uploads: 2,
            ..Status::default()
        };
        let st = Status { upload_errors: vec![("k\u{1}".into(), 3, "refused".into())], ..st };
        let j = st.json();
        assert!(j.starts_with("{\"mountpoint\":\"/mnt/a \\\"b\\\"\",\"store\":\"s3://b/\",\"endpoint\":null,"), "{j}");
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["pending_uploads"], 2);
        assert_eq!(v["upload_errors"][0], serde_json::json!({"key": "k\u{1}", "attempts": 3, "error": "refused"}));
        assert!(j.contains("\"k\\u0001\""), "{j}");
    }

    #[test]
    fn text_names_the_counts() {
        let st = Status { pending_uploads: 3, requests: 10, errors: 1, ..Status::default() };
        let t = st.text();
        assert!(t.contains("pending uploads:  3 "), "{t}");
        assert!(t.contains("10 since mount, 1 errors"), "{t}");
        assert!(t.contains("disk cache:       off"), "{t}");
    }

    #[test]
    fn endpoint_credentials_are_cut() {
        use bucketfs_store::redact_urls;
        assert_eq!(redact_urls("http://u:p@host:9000/x@y"), "http://host:9000/x@y");
        assert_eq!(redact_urls("http://127.0.0.1:9000"), "http://127.0.0.1:9000");
    }
}
