//! systemd's readiness protocol (`Type=notify`) without libsystemd: one datagram with
//! `READY=1` once the mount is usable and `STOPPING=1` when it starts to unmount, sent to
//! the socket named by `NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace).
//! Without `NOTIFY_SOCKET` nothing is sent.

use std::os::unix::net::UnixDatagram;

/// Send `msg` to systemd if it is listening; failures are logged, never fatal.
pub fn notify(msg: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else { return };
    if let Err(e) = send(&target.to_string_lossy(), msg) {
        tracing::warn!("cannot notify systemd ({msg}): {e}");
    }
}

fn send(target: &str, msg: &str) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    if let Some(name) = target.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        sock.send_to_addr(msg.as_bytes(), &addr)?;
    } else {
        sock.send_to(msg.as_bytes(), target)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_socket() {
        let dir = std::env::temp_dir().join(format!("bucketfs-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let rx = UnixDatagram::bind(&path).unwrap();
        send(&path.to_string_lossy(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sends_to_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("bucketfs-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        send(&format!("@{name}"), "STOPPING=1").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }
}
