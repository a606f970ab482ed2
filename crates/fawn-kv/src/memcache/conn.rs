//! One client connection's socket and buffers: the leaf that the request handlers write
//! their replies into (as in mini-redis). It knows nothing of commands.

use std::sync::Arc;
use std::time::Duration;

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio_rustls::server::TlsStream;

use super::stats::Stats;

/// Replies are flushed once this much is pending, even mid-pipeline, so a long pipeline of
/// large gets cannot grow the output buffer without bound.
const FLUSH_AT_BYTES: usize = 64 * 1024;
/// Most capacity the reply buffer keeps once written out.
const OUT_CAPACITY_KEPT_BYTES: usize = 4 * FLUSH_AT_BYTES;
/// Most bytes asked of one socket read.
const READ_CHUNK_BYTES: usize = 16 * 1024;

/// A client's socket: plain TCP, or TLS on a port started with a certificate.
pub(super) enum ClientStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl ClientStream {
    fn tcp(&self) -> &TcpStream {
        match self {
            ClientStream::Plain(tcp) => tcp,
            ClientStream::Tls(tls) => tls.get_ref().0,
        }
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            ClientStream::Tls(tls) => Pin::new(tls).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            ClientStream::Tls(tls) => Pin::new(tls).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            ClientStream::Tls(tls) => Pin::new(tls).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            ClientStream::Tls(tls) => Pin::new(tls).poll_shutdown(cx),
        }
    }
}

pub(super) struct Connection {
    stream: ClientStream,
    /// Received bytes not yet parsed.
    pub input: BytesMut,
    /// Replies not yet sent.
    pub out: Vec<u8>,
    /// The fetch budget's room that the values in `out` take (one permit per part of the
    /// budget): given back once they are written (or the connection breaks).
    held: Vec<OwnedSemaphorePermit>,
    /// Writing to the client failed or timed out: nothing more is sent and the connection is
    /// to be closed.
    broken: bool,
    /// Most time a write may wait for the client to take bytes.
    write_timeout: Duration,
}

impl Connection {
    pub fn new(stream: ClientStream, write_timeout: Duration) -> Self {
        // Replies are batched per read, so Nagle's delay only adds latency.
        let _ = stream.tcp().set_nodelay(true);
        Connection {
            stream,
            input: BytesMut::with_capacity(READ_CHUNK_BYTES),
            out: Vec::with_capacity(READ_CHUNK_BYTES),
            held: Vec::new(),
            broken: false,
            write_timeout,
        }
    }

    /// Appends a reply.
    pub fn reply(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    /// The socket's descriptor and peer, for `stats conns`.
    pub fn identity(&self) -> (i32, Option<std::net::SocketAddr>) {
        use std::os::fd::AsRawFd;
        let tcp = self.stream.tcp();
        (tcp.as_raw_fd(), tcp.peer_addr().ok())
    }

    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Keeps `room` of the fetch budget until the replies now pending are written.
    pub fn hold(&mut self, room: OwnedSemaphorePermit) {
        if room.num_permits() == 0 {
            return;
        }
        match self.held.iter_mut().find(|held| Arc::ptr_eq(held.semaphore(), room.semaphore())) {
            Some(held) => held.merge(room),
            None => self.held.push(room),
        }
    }

    /// Whether pending replies hold room of the fetch budget.
    pub fn holds_budget(&self) -> bool {
        self.held.iter().any(|held| held.num_permits() > 0)
    }

    /// Whether the client has taken every byte sent to it (the socket's send queue is empty).
    pub fn nothing_unread(&self) -> bool {
        use std::os::fd::AsRawFd;
        let mut queued: libc::c_int = 0;
        // SAFETY: TIOCOUTQ writes one int through the pointer, which is valid for it.
        let ok = unsafe { libc::ioctl(self.stream.tcp().as_raw_fd(), libc::TIOCOUTQ, &mut queued) } == 0;
        ok && queued == 0
    }

    /// Reads more input; `Ok(0)` at end of stream.
    pub async fn read(&mut self, stats: &Stats) -> std::io::Result<usize> {
        self.input.reserve(READ_CHUNK_BYTES);
        let n = self.stream.read_buf(&mut self.input).await?;
        Stats::add(&stats.counters.bytes_read, n);
        Ok(n)
    }

    /// Writes and clears pending replies, and gives back the fetch budget they held (also
    /// when the write fails: the connection is broken then, its replies dropped).
    pub async fn flush(&mut self, stats: &Stats) -> std::io::Result<()> {
        let result = self.write_out(stats).await;
        self.held.clear();
        result
    }

    async fn write_out(&mut self, stats: &Stats) -> std::io::Result<()> {
        if self.broken {
            self.out.clear();
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        if self.out.is_empty() {
            return Ok(());
        }
        // A client that stopped reading is closed after the timeout: the pending replies (at
        // most FLUSH_AT_BYTES plus one value, see `flush_if_full`) are all it holds meanwhile.
        let mut written =
            crate::stall::write_all_or_stall(&mut self.stream, &self.out, self.write_timeout).await;
        if written.is_ok() && matches!(self.stream, ClientStream::Tls(_)) {
            // TLS may hold the last records (at most its buffer limit) until flushed.
            written = tokio::time::timeout(self.write_timeout, self.stream.flush())
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()));
        }
        if written.is_err() {
            self.broken = true;
        }
        Stats::add(&stats.counters.bytes_written, self.out.len());
        self.out.clear();
        // A large reply's buffer is not kept: an idle client would hold it for good, and a
        // broken one until its request ends.
        if self.broken || self.out.capacity() > OUT_CAPACITY_KEPT_BYTES {
            self.out = Vec::with_capacity(READ_CHUNK_BYTES);
        }
        written
    }

    /// Sends pending replies once they pass the flush threshold, so a request with a large
    /// reply (a multi-get of many big values) streams it instead of buffering it whole. A
    /// failed write marks the connection broken.
    pub async fn flush_if_full(&mut self, stats: &Stats) {
        if self.out.len() >= FLUSH_AT_BYTES {
            let _ = self.flush(stats).await;
        }
    }

    pub async fn shutdown(&mut self) {
        let _ = self.stream.shutdown().await;
    }
}
