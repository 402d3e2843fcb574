//! A relay to the local PostgreSQL that a test can cut, as a network that
//! drops packets would be cut.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A relay to the local PostgreSQL that can be cut like a network that
/// drops packets: while cut it forwards nothing either way (what was read
/// waits) and holds new connections unconnected; no connection is closed.
pub struct Blackhole {
    /// Where to connect instead of PostgreSQL.
    pub addr: std::net::SocketAddr,
    /// Set: nothing passes.
    pub cut: Arc<AtomicBool>,
}

impl Blackhole {
    /// Starts relaying, not cut.
    pub async fn start() -> Blackhole {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let relay_cut = cut.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let cut = relay_cut.clone();
                tokio::spawn(async move {
                    while cut.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    let Ok(server) = tokio::net::TcpStream::connect("127.0.0.1:5432").await else {
                        return;
                    };
                    let (client_rd, client_wr) = client.into_split();
                    let (server_rd, server_wr) = server.into_split();
                    tokio::spawn(pump(client_rd, server_wr, cut.clone()));
                    pump(server_rd, client_wr, cut).await;
                });
            }
        });
        Blackhole { addr, cut }
    }
}

impl Blackhole {
    /// A guard that lets everything through again when dropped: made after
    /// the brokers that use the relay, it is dropped before them, so a test
    /// that fails while cut does not leave them unable to stop.
    pub fn reopen_on_drop(&self) -> Reopen {
        Reopen(self.cut.clone())
    }
}

/// See [`Blackhole::reopen_on_drop`].
pub struct Reopen(Arc<AtomicBool>);

impl Drop for Reopen {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// Copies `from` to `to`, holding what it read while `cut` is set.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while cut.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
