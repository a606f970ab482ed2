//! One client connection's socket and buffers: the leaf that the request handlers write
//! their replies into (as in mini-redis). It knows nothing of commands.

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::stats::Stats;

/// Replies are flushed once this much is pending, even mid-pipeline, so a long pipeline of
/// large gets cannot grow the output buffer without bound.
const FLUSH_AT_BYTES: usize = 64 * 1024;
/// Most bytes asked of one socket read.
const READ_CHUNK_BYTES: usize = 16 * 1024;

pub(super) struct Connection {
    stream: TcpStream,
    /// Received bytes not yet parsed.
    pub input: BytesMut,
    /// Replies not yet sent.
    pub out: Vec<u8>,
    /// Writing to the client failed or timed out: nothing more is sent and the connection is
    /// to be closed.
    broken: bool,
    /// Most time a write may wait for the client to take bytes.
    write_timeout: Duration,
}

impl Connection {
    pub fn new(stream: TcpStream, write_timeout: Duration) -> Self {
        // Replies are batched per read, so Nagle's delay only adds latency.
        let _ = stream.set_nodelay(true);
        Connection {
            stream,
            input: BytesMut::with_capacity(READ_CHUNK_BYTES),
            out: Vec::with_capacity(READ_CHUNK_BYTES),
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
        (self.stream.as_raw_fd(), self.stream.peer_addr().ok())
    }

    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Reads more input; `Ok(0)` at end of stream.
    pub async fn read(&mut self, stats: &Stats) -> std::io::Result<usize> {
        self.input.reserve(READ_CHUNK_BYTES);
        let n = self.stream.read_buf(&mut self.input).await?;
        Stats::add(&stats.counters.bytes_read, n);
        Ok(n)
    }

    /// Writes and clears pending replies.
    pub async fn flush(&mut self, stats: &Stats) -> std::io::Result<()> {
        if self.broken {
            self.out.clear();
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        if self.out.is_empty() {
            return Ok(());
        }
        // A client that stopped reading is closed after the timeout: the pending replies (at
        // most FLUSH_AT_BYTES plus one value, see `flush_if_full`) are all it holds meanwhile.
        let written = crate::stall::write_all_or_stall(&mut self.stream, &self.out, self.write_timeout).await;
        if written.is_err() {
            self.broken = true;
        }
        Stats::add(&stats.counters.bytes_written, self.out.len());
        self.out.clear();
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
