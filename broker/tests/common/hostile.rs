//! Clients that misbehave on purpose, and what they cost the broker: the
//! tools of the tests that bound a connection's memory.

use ciphermq_clients::connection::TlsClientOptions;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpSocket;

use super::{pki, TIMEOUT};

/// `VmRSS` of `pid`, in bytes.
pub fn rss(pid: u32) -> u64 {
    status_bytes(pid, "VmRSS:")
}

/// `VmHWM` of `pid` (the most it was resident at once), in bytes.
pub fn peak_rss(pid: u32) -> u64 {
    status_bytes(pid, "VmHWM:")
}

fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"));
    kib * 1024
}

/// A mutual-TLS connection as `cn` whose receive buffer is small and never
/// read after the greeting: the broker's replies and deliveries pile up on
/// its side.
pub async fn never_reading(
    addr: &str,
    cn: &str,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let tcp = socket.connect(addr.parse().unwrap()).await.unwrap();
    let connector = TlsClientOptions::for_cn(&pki().certs, cn)
        .connector()
        .unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = tokio::time::timeout(TIMEOUT, connector.connect(name, tcp))
        .await
        .expect("handshake in time")
        .expect("handshake");
    let mut reader = BufReader::new(tls);
    let mut hello = String::new();
    tokio::time::timeout(TIMEOUT, reader.read_line(&mut hello))
        .await
        .expect("greeting in time")
        .unwrap();
    assert!(hello.starts_with("HELLO ciphermq/1 "), "{hello}");
    reader.into_inner()
}
