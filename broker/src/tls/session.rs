//! A rustls server session driven by hand over a glommio stream.
//!
//! `futures-rustls` cannot rebuild a session from its parts after a hand-off,
//! so this small adapter moves bytes between the socket and the
//! [`ServerConnection`] (`read_tls`, `process_new_packets`, `reader`, `writer`,
//! `write_tls`) with poll functions a connection future can call in any order.

use std::io::{self, BufRead, Read, Write};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use rustls::ServerConnection;

use crate::conn::line_buffer::ReadBuffer;

/// Largest socket read: a few TLS records.
const READ_CHUNK: usize = 64 * 1024;
/// Smallest socket read: a few small records.
const MIN_READ: usize = 4 * 1024;
/// First socket read of a session: one full-size TLS record.
const FIRST_READ: usize = 16 * 1024;

/// The socket as rustls' `write_tls` target: sends without waiting, and
/// reports a full socket as `WouldBlock` (rustls then keeps the rest).
struct DirectSend<'a>(&'a TcpStream);

impl Write for DirectSend<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[io::IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        crate::runtime::sys::try_send_vectored(self.0, bufs)
            .unwrap_or_else(|| Err(io::ErrorKind::WouldBlock.into()))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A TLS session plus the ciphertext not yet given to rustls or to the socket.
pub(crate) struct TlsSession {
    /// The rustls state machine.
    pub tls: ServerConnection,
    /// Ciphertext read from the socket and not yet consumed by rustls. Kept
    /// while the connection is busy, freed by [`TlsSession::release_idle`].
    incoming: ReadBuffer,
    /// Room the next socket read asks for, between [`MIN_READ`] and
    /// [`READ_CHUNK`]: doubled when a read fills it, cut to twice what came
    /// when a read uses less than a quarter. It outlives the buffer, so a
    /// connection woken for one small message zeroes a small buffer, not
    /// [`READ_CHUNK`].
    read_size: usize,
    /// Ciphertext the socket could not take when rustls produced it, waiting
    /// for glommio's write (see [`TlsSession::poll_flush`]).
    outgoing: Vec<u8>,
    /// Bytes of `outgoing` already written.
    outgoing_pos: usize,
    /// The peer closed its side of the socket.
    pub eof: bool,
    /// Ciphertext bytes read from / written to the socket and not yet taken
    /// by [`TlsSession::take_traffic`] (for `/metrics`).
    traffic: (u64, u64),
}

impl TlsSession {
    /// Wraps a session; `leftover` is ciphertext already read from the socket.
    pub(crate) fn new(mut tls: ServerConnection, leftover: &[u8]) -> TlsSession {
        // The connection bounds what it renders (see `OUTPUT_HIGH_WATER`); a
        // rustls limit would turn a large `fetch` into a short write.
        tls.set_buffer_limit(None);
        TlsSession {
            tls,
            incoming: ReadBuffer::from_slice(leftover),
            read_size: FIRST_READ,
            outgoing: Vec::new(),
            outgoing_pos: 0,
            eof: false,
            traffic: (0, 0),
        }
    }

    /// Bytes read and written on the socket since the last call.
    pub(crate) fn take_traffic(&mut self) -> (u64, u64) {
        std::mem::take(&mut self.traffic)
    }

    /// Splits the session for a hand-off: rustls state and unconsumed ciphertext.
    pub(crate) fn into_parts(self) -> (ServerConnection, Vec<u8>) {
        let leftover = self.incoming.data().to_vec();
        (self.tls, leftover)
    }

    /// Whether rustls holds encrypted records not yet handed to the socket
    /// or to `outgoing` (those rendered while the socket was full).
    pub(crate) fn holds_records(&self) -> bool {
        self.tls.wants_write()
    }

    /// Whether ciphertext waits to be handed to rustls.
    pub(crate) fn has_incoming(&self) -> bool {
        !self.incoming.is_empty()
    }

    /// Unsent ciphertext, in bytes.
    pub(crate) fn outgoing_len(&self) -> usize {
        self.outgoing.len() - self.outgoing_pos
    }

    /// Gives buffered ciphertext to rustls and decrypts it. Returns whether
    /// anything was consumed.
    pub(crate) fn process_incoming(&mut self) -> Result<bool, rustls::Error> {
        let mut progressed = false;
        while self.has_incoming() && self.tls.wants_read() {
            let mut slice = self.incoming.data();
            let before = slice.len();
            match self.tls.read_tls(&mut slice) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => return Err(rustls::Error::General(e.to_string())),
            }
            let consumed = before - slice.len();
            self.incoming.consume(consumed);
            progressed = true;
            let state = self.tls.process_new_packets()?;
            if state.peer_has_closed() {
                self.eof = true;
            }
        }
        Ok(progressed)
    }

    /// Reads ciphertext from the socket. `Ready(Ok(0))` means end of stream.
    pub(crate) fn poll_read_socket(
        &mut self,
        stream: &mut TcpStream,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        let room = self.incoming.spare(self.read_size);
        let offered = room.len();
        let mut result = Pin::new(&mut *stream).poll_read(cx, &mut *room);
        if result.is_pending() {
            // Data may be there already (see `sys::try_recv`); the waker
            // stays registered with glommio's poll either way.
            if let Some(read) = crate::runtime::sys::try_recv(stream, room) {
                result = Poll::Ready(read);
            }
        }
        if let Poll::Ready(Ok(n)) = result {
            self.incoming.commit(n);
            self.traffic.0 += n as u64;
            self.read_size = next_read_size(self.read_size, offered, n);
            if n == 0 {
                self.eof = true;
            }
        }
        result
    }

    /// Gives buffer memory back before the connection parks idle: ciphertext
    /// and output buffers with nothing in them are freed, a large one holding
    /// little is shrunk (see [`ReadBuffer::release_idle`]).
    pub(crate) fn release_idle(&mut self) {
        self.incoming.release_idle();
        if self.outgoing_pos == self.outgoing.len() {
            self.outgoing = Vec::new();
            self.outgoing_pos = 0;
        }
    }

    /// Bytes of buffer memory held outside rustls (for tests and accounting).
    #[cfg(test)]
    pub(crate) fn buffer_capacity(&self) -> usize {
        self.incoming.capacity() + self.outgoing.capacity()
    }

    /// Decrypted bytes the next [`TlsSession::read_plaintext`] can return at
    /// least (rustls's first buffered record); 0 when none are buffered.
    pub(crate) fn plaintext_ready(&mut self) -> usize {
        self.tls.reader().fill_buf().map_or(0, |chunk| chunk.len())
    }

    /// Copies decrypted bytes into `buf`; 0 when none are buffered.
    pub(crate) fn read_plaintext(&mut self, buf: &mut [u8]) -> usize {
        // WouldBlock: nothing buffered; UnexpectedEof: peer closed without
        // close_notify, which the socket EOF reports too.
        self.tls.reader().read(buf).unwrap_or_default()
    }

    /// Encrypts `plaintext` into the outgoing buffer.
    pub(crate) fn write_plaintext(&mut self, plaintext: &[u8]) -> io::Result<()> {
        self.tls.writer().write_all(plaintext)
    }

    /// Writes buffered ciphertext to the socket. `Ready(Ok(()))` once all of it
    /// is written; `Pending` when the socket is full.
    pub(crate) fn poll_flush(
        &mut self,
        stream: &mut TcpStream,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if self.outgoing_pos == self.outgoing.len() {
                // Kept for the next write; freed when the connection parks.
                self.outgoing.clear();
                self.outgoing_pos = 0;
                // Straight from rustls' records to the socket while it takes
                // them (`sys::try_send_vectored`)...
                while self.tls.wants_write() {
                    match self.tls.write_tls(&mut DirectSend(&*stream)) {
                        // Nothing taken of records that wait: glommio's write
                        // below tells why.
                        Ok(0) => break,
                        Ok(n) => self.traffic.1 += n as u64,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
                if !self.tls.wants_write() {
                    return Poll::Ready(Ok(()));
                }
                // ...and what it cannot take now waits here for glommio's
                // readiness poll.
                while self.tls.wants_write() {
                    self.tls.write_tls(&mut self.outgoing)?;
                }
            }
            match Pin::new(&mut *stream).poll_write(cx, &self.outgoing[self.outgoing_pos..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    self.outgoing_pos += n;
                    self.traffic.1 += n as u64;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Completes the handshake on the accepting shard.
    pub(crate) async fn handshake(&mut self, stream: &mut TcpStream) -> Result<(), HandshakeError> {
        while self.tls.is_handshaking() {
            std::future::poll_fn(|cx| self.poll_flush(stream, cx)).await?;
            if !self.tls.is_handshaking() {
                break;
            }
            if !self.has_incoming() {
                let n = std::future::poll_fn(|cx| {
                    let read = self.poll_read_socket(stream, cx);
                    if read.is_pending() {
                        // A peer stalling mid-handshake holds no read buffer.
                        self.release_idle();
                    }
                    read
                })
                .await?;
                if n == 0 {
                    return Err(HandshakeError::Closed);
                }
            }
            if let Err(e) = self.process_incoming() {
                // Tell the client why (an alert) before giving up.
                let _ = std::future::poll_fn(|cx| self.poll_flush(stream, cx)).await;
                return Err(HandshakeError::Tls(e));
            }
        }
        std::future::poll_fn(|cx| self.poll_flush(stream, cx)).await?;
        Ok(())
    }
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeError {
    /// The peer went away.
    #[error("peer closed the connection during the handshake")]
    Closed,
    /// Socket error.
    #[error("I/O error during the handshake: {0}")]
    Io(#[from] io::Error),
    /// TLS refused (bad certificate, wrong CA, protocol error).
    #[error("TLS handshake failed: {0}")]
    Tls(rustls::Error),
}

/// The next socket read size after a read of `n` bytes into `offered` bytes
/// of room, when `current` was asked for.
fn next_read_size(current: usize, offered: usize, n: usize) -> usize {
    if n > 0 && n == offered {
        (current * 2).min(READ_CHUNK)
    } else if n < current / 4 {
        (2 * n).next_power_of_two().clamp(MIN_READ, READ_CHUNK)
    } else {
        current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_size_follows_the_traffic_within_bounds() {
        let mut size = FIRST_READ;
        // Reads that fill the room: a burst, so ask for more, up to the cap.
        for _ in 0..10 {
            size = next_read_size(size, size, size);
        }
        assert_eq!(size, READ_CHUNK);
        // Room larger than asked for, filled: grow too.
        assert_eq!(
            next_read_size(MIN_READ, 3 * MIN_READ, 3 * MIN_READ),
            2 * MIN_READ
        );
        // Typical reads keep the size.
        assert_eq!(next_read_size(size, size, size / 2), size);
        // A small message after a burst: back to a small read at once.
        assert_eq!(next_read_size(size, size, 1100), MIN_READ);
        assert_eq!(next_read_size(size, size, 5000), 16 * 1024);
        // End of stream: shrink, never below the floor.
        assert_eq!(next_read_size(MIN_READ, MIN_READ, 0), MIN_READ);
    }

    /// Reads plaintext until `want` bytes came; returns the most buffer
    /// memory the session held meanwhile.
    async fn receive(session: &mut TlsSession, stream: &mut TcpStream, want: usize) -> usize {
        let mut plaintext = vec![0u8; 64 * 1024];
        let (mut got, mut peak) = (0, 0);
        while got < want {
            peak = peak.max(session.buffer_capacity());
            let n = session.read_plaintext(&mut plaintext);
            if n > 0 {
                got += n;
            } else if session.has_incoming() {
                session.process_incoming().expect("valid records");
            } else {
                let n = std::future::poll_fn(|cx| session.poll_read_socket(stream, cx))
                    .await
                    .expect("a socket read");
                assert!(n > 0, "the peer closed early");
            }
        }
        assert_eq!(got, want);
        peak
    }

    /// A burst through a real mTLS session, a park, then one small line: the
    /// parked session holds no buffers, and the burst's buffers stay bounded.
    #[test]
    fn a_parked_session_holds_no_buffers() {
        use std::sync::{mpsc, Arc};

        use ciphermq_clients::connection::TlsClientOptions;
        use ciphermq_clients::pki::{self, PkiOptions};

        const BURST: usize = 512 * 1024;
        let dir = tempfile::tempdir().expect("tempdir");
        let certs = dir.path().join("certs");
        let mut opts = PkiOptions::new(&certs, dir.path().join("keys"));
        opts.client_cns = vec!["sender_1".into()];
        pki::generate(&opts).expect("a test PKI");
        let server = crate::tls::material::load(&crate::config::TlsConfig {
            cert_path: certs.join("server.crt"),
            key_path: certs.join("server.key"),
            ca_cert_path: certs.join("ca.crt"),
            ..Default::default()
        })
        .expect("server TLS config")
        .server;
        let client = TlsClientOptions::for_cn(&certs, "sender_1")
            .client_config()
            .expect("client TLS config");

        let (addr_tx, addr_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let peer = std::thread::spawn(move || {
            let addr: std::net::SocketAddr = addr_rx.recv().expect("the address");
            let socket = std::net::TcpStream::connect(addr).expect("connect");
            let name = "localhost".try_into().expect("a server name");
            let conn = rustls::ClientConnection::new(Arc::new(client), name).expect("client");
            let mut tls = rustls::StreamOwned::new(conn, socket);
            tls.write_all(&vec![b'x'; BURST]).expect("the burst");
            tls.flush().expect("flush");
            go_rx.recv().expect("parked");
            tls.write_all(b"ping\n").expect("the line");
            tls.flush().expect("flush");
            let _ = go_rx.recv();
        });

        let executor = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(move || async move {
                let mut stream = crate::runtime::sys::tests::accept_one(&addr_tx).await;
                let tls = ServerConnection::new(server).expect("server session");
                let mut session = TlsSession::new(tls, &[]);
                session.handshake(&mut stream).await.expect("handshake");

                let peak = receive(&mut session, &mut stream, BURST).await;
                assert!(peak > 0 && peak <= 2 * READ_CHUNK, "{peak} bytes held");
                session.release_idle();
                assert_eq!(session.buffer_capacity(), 0, "parked: nothing held");

                go_tx.send(()).expect("go");
                receive(&mut session, &mut stream, 5).await;
                session.release_idle();
                assert_eq!(session.buffer_capacity(), 0);
                let _ = go_tx.send(());
            })
            .expect("an executor");
        executor.join().expect("the server side");
        peer.join().expect("the client side");
    }
}
