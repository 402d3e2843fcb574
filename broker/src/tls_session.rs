//! A rustls server session driven by hand over a glommio stream.
//!
//! `futures-rustls` cannot rebuild a session from its parts after a hand-off,
//! so this small adapter moves bytes between the socket and the
//! [`ServerConnection`] (`read_tls`, `process_new_packets`, `reader`, `writer`,
//! `write_tls`) with poll functions a connection future can call in any order.

use std::io::{self, Read, Write};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use rustls::ServerConnection;

/// Size of one socket read: a few TLS records.
const READ_CHUNK: usize = 64 * 1024;
/// Buffers larger than this are freed rather than kept when they empty, so an
/// idle connection costs little memory.
pub const IDLE_BUFFER_BYTES: usize = 16 * 1024;

/// A TLS session plus the ciphertext not yet given to rustls or to the socket.
pub struct TlsSession {
    /// The rustls state machine.
    pub tls: ServerConnection,
    /// Ciphertext read from the socket; `incoming[incoming_pos..]` is not yet
    /// consumed by rustls. Freed once consumed, so idle connections hold no
    /// read buffer.
    incoming: Vec<u8>,
    incoming_pos: usize,
    /// Ciphertext produced by rustls, not yet written to the socket.
    outgoing: Vec<u8>,
    outgoing_pos: usize,
    /// The peer closed its side of the socket.
    pub eof: bool,
}

impl TlsSession {
    /// Wraps a session; `leftover` is ciphertext already read from the socket.
    pub fn new(mut tls: ServerConnection, leftover: &[u8]) -> TlsSession {
        // The connection bounds what it renders (see `OUTPUT_HIGH_WATER`); a
        // rustls limit would turn a large `fetch` into a short write.
        tls.set_buffer_limit(None);
        TlsSession {
            tls,
            incoming: leftover.to_vec(),
            incoming_pos: 0,
            outgoing: Vec::new(),
            outgoing_pos: 0,
            eof: false,
        }
    }

    /// Splits the session for a hand-off: rustls state and unconsumed ciphertext.
    pub fn into_parts(self) -> (ServerConnection, Vec<u8>) {
        let leftover = self.incoming[self.incoming_pos..].to_vec();
        (self.tls, leftover)
    }

    /// Whether ciphertext waits to be handed to rustls.
    pub fn has_incoming(&self) -> bool {
        self.incoming_pos < self.incoming.len()
    }

    /// Unsent ciphertext, in bytes.
    pub fn outgoing_len(&self) -> usize {
        self.outgoing.len() - self.outgoing_pos
    }

    /// Gives buffered ciphertext to rustls and decrypts it. Returns whether
    /// anything was consumed.
    pub fn process_incoming(&mut self) -> Result<bool, rustls::Error> {
        let mut progressed = false;
        while self.has_incoming() && self.tls.wants_read() {
            let mut slice = &self.incoming[self.incoming_pos..];
            let before = slice.len();
            match self.tls.read_tls(&mut slice) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => return Err(rustls::Error::General(e.to_string())),
            }
            self.incoming_pos += before - slice.len();
            progressed = true;
            let state = self.tls.process_new_packets()?;
            if state.peer_has_closed() {
                self.eof = true;
            }
        }
        if self.incoming_pos == self.incoming.len() {
            self.incoming_pos = 0;
            if self.incoming.capacity() > IDLE_BUFFER_BYTES {
                self.incoming = Vec::new();
            } else {
                self.incoming.clear();
            }
        }
        Ok(progressed)
    }

    /// Reads ciphertext from the socket. `Ready(Ok(0))` means end of stream.
    pub fn poll_read_socket(
        &mut self,
        stream: &mut TcpStream,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        if self.incoming_pos > 0 {
            self.incoming.drain(..self.incoming_pos);
            self.incoming_pos = 0;
        }
        let len = self.incoming.len();
        self.incoming.resize(len + READ_CHUNK, 0);
        let result = Pin::new(stream).poll_read(cx, &mut self.incoming[len..]);
        let n = match result {
            Poll::Ready(Ok(n)) => n,
            _ => 0,
        };
        self.incoming.truncate(len + n);
        if n == 0 && self.incoming.is_empty() && self.incoming.capacity() > IDLE_BUFFER_BYTES {
            self.incoming = Vec::new();
        }
        if let Poll::Ready(Ok(0)) = result {
            self.eof = true;
        }
        result
    }

    /// Copies decrypted bytes into `buf`; 0 when none are buffered.
    pub fn read_plaintext(&mut self, buf: &mut [u8]) -> usize {
        // WouldBlock: nothing buffered; UnexpectedEof: peer closed without
        // close_notify, which the socket EOF reports too.
        self.tls.reader().read(buf).unwrap_or_default()
    }

    /// Encrypts `plaintext` into the outgoing buffer.
    pub fn write_plaintext(&mut self, plaintext: &[u8]) -> io::Result<()> {
        self.tls.writer().write_all(plaintext)
    }

    /// Writes buffered ciphertext to the socket. `Ready(Ok(()))` once all of it
    /// is written; `Pending` when the socket is full.
    pub fn poll_flush(
        &mut self,
        stream: &mut TcpStream,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if self.outgoing_pos == self.outgoing.len() {
                self.outgoing.clear();
                self.outgoing_pos = 0;
                if !self.tls.wants_write() {
                    if self.outgoing.capacity() > IDLE_BUFFER_BYTES {
                        self.outgoing = Vec::new();
                    }
                    return Poll::Ready(Ok(()));
                }
                while self.tls.wants_write() {
                    self.tls.write_tls(&mut self.outgoing)?;
                }
            }
            match Pin::new(&mut *stream).poll_write(cx, &self.outgoing[self.outgoing_pos..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => self.outgoing_pos += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Completes the handshake on the accepting shard.
    pub async fn handshake(&mut self, stream: &mut TcpStream) -> Result<(), HandshakeError> {
        while self.tls.is_handshaking() {
            std::future::poll_fn(|cx| self.poll_flush(stream, cx)).await?;
            if !self.tls.is_handshaking() {
                break;
            }
            if !self.has_incoming() {
                let n = std::future::poll_fn(|cx| self.poll_read_socket(stream, cx)).await?;
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
pub enum HandshakeError {
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
