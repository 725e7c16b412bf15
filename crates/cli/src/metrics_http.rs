//! `--metrics-addr`: a tiny HTTP/1.1 responder for Prometheus scrapes, on a tokio
//! `TcpListener`, no HTTP library. `GET /metrics` gets the text exposition format; any other
//! path 404, any other method 405. One request per connection (`Connection: close`).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A request head larger than this is refused (a scrape's is ~200 bytes).
const MAX_HEAD: usize = 8 * 1024;
/// A client that sends no complete request head within this is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Bind `addr` now (so a taken port fails the mount), then serve `render()` in the background.
pub fn start(
    rt: &tokio::runtime::Runtime,
    addr: &str,
    render: Arc<dyn Fn() -> String + Send + Sync>,
) -> Result<std::net::SocketAddr, String> {
    let listener = rt.block_on(TcpListener::bind(addr)).map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    rt.spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else { continue };
            let render = render.clone();
            tokio::spawn(async move {
                let head = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut conn)).await {
                    Ok(Some(h)) => h,
                    _ => return,
                };
                let resp = respond(&head, || render());
                let _ = conn.write_all(resp.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    Ok(local)
}

async fn read_head(conn: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = Vec::with_capacity(512); // a scrape's request head fits
    let mut chunk = [0u8; 1024]; // one read of a small request head
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() + n > MAX_HEAD {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// The whole HTTP response for a request head.
pub fn respond(head: &str, body: impl FnOnce() -> String) -> String {
    let mut words = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", body()),
        ("GET" | "HEAD", _) => ("404 Not Found", "text/plain", "not found; try /metrics\n".to_string()),
        _ => ("405 Method Not Allowed", "text/plain", "only GET\n".to_string()),
    };
    let len = body.len();
    let body = if method == "HEAD" { "" } else { body.as_str() };
    format!("HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_metrics_and_refuses_the_rest() {
        let ok = respond("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", || "a 1\n".into());
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(ok.contains("Content-Length: 4\r\n"));
        assert!(ok.ends_with("\r\n\r\na 1\n"));
        assert!(respond("GET / HTTP/1.1\r\n\r\n", String::new).starts_with("HTTP/1.1 404"));
        assert!(respond("POST /metrics HTTP/1.1\r\n\r\n", String::new).starts_with("HTTP/1.1 405"));
        assert!(respond("HEAD /metrics HTTP/1.1\r\n\r\n", || "abc".into()).ends_with("\r\n\r\n"));
    }

    #[test]
    fn answers_over_tcp() {
        use std::io::{Read, Write};
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let addr = start(&rt, "127.0.0.1:0", Arc::new(|| "x_total 7\n".to_string())).unwrap();
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK") && out.ends_with("x_total 7\n"), "{out}");
    }
}
