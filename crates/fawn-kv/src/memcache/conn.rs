//! One client connection: read, parse, run, reply — in order, with bounded buffers.

use std::sync::Arc;

use bytes::{Buf, BytesMut};
use fawn_proto::memcache::{parse, Command, GetCommand, Invalid, Parse};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::cmd::{self, Flow};
use super::stats::Stats;
use super::Shared;
use crate::service::KvService;

/// Replies are flushed once this much is pending, even mid-pipeline, so a long pipeline of
/// large gets cannot grow the output buffer without bound.
pub(super) const FLUSH_AT: usize = 64 * 1024;
const READ_CHUNK: usize = 16 * 1024;
/// Most keys read at once for a run of pipelined gets (bounds the replies held in memory).
const PIPELINED_KEYS: usize = 64;

pub(super) struct Connection<S> {
    stream: TcpStream,
    shared: Arc<Shared<S>>,
    stop: watch::Receiver<bool>,
    input: BytesMut,
    output: Vec<u8>,
    /// Bytes of a refused data block still to discard as they arrive.
    swallow: usize,
}

/// What to run next: a run of pipelined plain gets, or one request.
enum Next {
    Reads(Vec<GetCommand>),
    One(Command),
}

/// Why reading stopped.
enum ReadEnd {
    Data,
    Closed,
}

impl<S: KvService> Connection<S> {
    pub(super) fn new(stream: TcpStream, shared: Arc<Shared<S>>, stop: watch::Receiver<bool>) -> Self {
        // Replies are batched per read, so Nagle's delay only adds latency.
        let _ = stream.set_nodelay(true);
        Connection {
            stream,
            shared,
            stop,
            input: BytesMut::with_capacity(READ_CHUNK),
            output: Vec::with_capacity(READ_CHUNK),
            swallow: 0,
        }
    }

    pub(super) async fn run(mut self) {
        self.shared.stats.connection_opened();
        let _ = self.serve().await;
        let _ = self.stream.shutdown().await;
        self.shared.stats.connection_closed();
    }

    /// Alternates: answer every complete request in the buffer, flush, read more.
    async fn serve(&mut self) -> std::io::Result<()> {
        loop {
            let flow = self.process_buffer().await?;
            self.flush().await?;
            if matches!(flow, Flow::Close) || *self.stop.borrow() {
                return Ok(());
            }
            if let ReadEnd::Closed = self.read().await? {
                return Ok(());
            }
        }
    }

    /// Runs the requests that are complete in the input buffer, in order.
    async fn process_buffer(&mut self) -> std::io::Result<Flow> {
        loop {
            if self.swallow > 0 {
                let n = self.swallow.min(self.input.len());
                self.input.advance(n);
                self.swallow -= n;
                if self.swallow > 0 {
                    return Ok(Flow::Continue);
                }
            }
            let flow = match parse(&self.input, &self.shared.config.limits) {
                Parse::Incomplete => return Ok(Flow::Continue),
                Parse::Frame { command, consumed } => {
                    self.input.advance(consumed);
                    let batch = self.gather_reads(command);
                    let mut ctx = cmd::Ctx::new(&self.shared, &mut self.output, &mut self.stream);
                    let flow = match batch {
                        Next::Reads(gets) => cmd::get::run_pipelined(&mut ctx, gets).await,
                        Next::One(command) => cmd::run(&mut ctx, command).await,
                    };
                    if ctx.broken {
                        return Ok(Flow::Close);
                    }
                    flow
                }
                Parse::Invalid(invalid) => self.invalid(invalid).await,
            };
            if matches!(flow, Flow::Close) {
                return Ok(flow);
            }
            if self.output.len() >= FLUSH_AT {
                self.flush().await?;
            }
        }
    }

    /// Pipelined `get`/`gets` requests that follow each other in the buffer are read
    /// concurrently (each key may be a round trip to a chain's tail) and answered in order.
    /// Reads do not conflict with each other, and the run stops at the first other request,
    /// so every read still sees all updates sent before it on this connection.
    fn gather_reads(&mut self, first: Command) -> Next {
        let first = match first {
            Command::Get(get) if get.touch.is_none() && get.keys.len() < PIPELINED_KEYS => get,
            other => return Next::One(other),
        };
        let mut keys = first.keys.len();
        let mut gets = vec![first];
        while let Parse::Frame { command: Command::Get(get), consumed } =
            parse(&self.input, &self.shared.config.limits)
        {
            if get.touch.is_some() || keys + get.keys.len() > PIPELINED_KEYS {
                break;
            }
            keys += get.keys.len();
            gets.push(get);
            self.input.advance(consumed);
        }
        Next::Reads(gets)
    }

    async fn invalid(&mut self, invalid: Invalid) -> Flow {
        if let Some(reply) = invalid.reply {
            self.output.extend_from_slice(reply);
        }
        if let Some(key) = invalid.unlink {
            cmd::store::unlink(&self.shared, key).await;
        }
        self.input.advance(invalid.consumed.min(self.input.len()));
        self.swallow = invalid.swallow;
        if invalid.close {
            Flow::Close
        } else {
            Flow::Continue
        }
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        write_out(&mut self.stream, &mut self.output, &self.shared.stats).await
    }

    /// Reads more input; ends on EOF, idle timeout or server shutdown.
    async fn read(&mut self) -> std::io::Result<ReadEnd> {
        self.input.reserve(READ_CHUNK);
        let idle = self.shared.config.idle_timeout;
        let read = self.stream.read_buf(&mut self.input);
        let timed = async {
            match idle {
                Some(limit) => tokio::time::timeout(limit, read).await.ok(),
                None => Some(read.await),
            }
        };
        let n = tokio::select! {
            result = timed => match result {
                Some(result) => result?,
                None => return Ok(ReadEnd::Closed),
            },
            _ = self.stop.changed() => return Ok(ReadEnd::Closed),
        };
        if n == 0 {
            return Ok(ReadEnd::Closed);
        }
        Stats::add(&self.shared.stats.counters.bytes_read, n);
        Ok(ReadEnd::Data)
    }
}

/// Writes and clears pending replies.
pub(super) async fn write_out(
    stream: &mut TcpStream,
    output: &mut Vec<u8>,
    stats: &Stats,
) -> std::io::Result<()> {
    if output.is_empty() {
        return Ok(());
    }
    stream.write_all(output).await?;
    Stats::add(&stats.counters.bytes_written, output.len());
    output.clear();
    Ok(())
}
