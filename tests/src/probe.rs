//! Small probes for tests of the agent's operator surfaces: a blocking
//! HTTP GET of the metrics endpoint, and owner-only file writes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

/// The body of `GET /metrics` at `addr`, or an empty string when nothing
/// answers (yet).
pub fn metrics_text(addr: SocketAddr) -> String {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else { return String::new() };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return String::new();
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    match response.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => body.to_string(),
        _ => String::new(),
    }
}

/// Writes `text` to `path` with mode 0600 (what the agent's files get).
pub fn write_private(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}
