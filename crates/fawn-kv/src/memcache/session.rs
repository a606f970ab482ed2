//! Serves one client: read, parse, run, reply — in order, with bounded buffers.

use std::sync::Arc;

use bytes::Buf;
use fawn_proto::memcache::binary::{self, BinInvalid, BinParse};
use fawn_proto::memcache::{parse, Command, GetCommand, Invalid, Parse};
use tokio::sync::watch;

use super::cmd::{self, Flow};
use super::conn::Connection;
use super::Shared;
use crate::service::KvService;

/// Most keys read at once for a run of pipelined gets (bounds the replies held in memory).
const PIPELINED_KEYS_MAX: usize = 64;

pub(super) struct Session<S> {
    conn: Connection,
    shared: Arc<Shared<S>>,
    stop: watch::Receiver<bool>,
    /// Bytes of a refused data block still to discard as they arrive.
    swallow: usize,
    /// The protocol, fixed by the connection's first byte as memcached does (`None` before
    /// it arrives): the binary protocol's request magic, or text.
    binary: Option<bool>,
}

/// What to run next: a run of pipelined plain gets, or one request.
enum Next {
    Reads(Vec<GetCommand>),
    One(Command),
}

impl<S: KvService> Session<S> {
    pub fn new(conn: Connection, shared: Arc<Shared<S>>, stop: watch::Receiver<bool>) -> Self {
        Session { conn, shared, stop, swallow: 0, binary: None }
    }

    pub async fn run(mut self) {
        self.shared.stats.connection_opened();
        let _ = self.serve().await;
        self.conn.shutdown().await;
        self.shared.stats.connection_closed();
    }

    /// Alternates: answer every complete request in the buffer, flush, read more.
    async fn serve(&mut self) -> std::io::Result<()> {
        loop {
            let flow = self.process_buffer().await;
            self.conn.flush(&self.shared.stats).await?;
            if matches!(flow, Flow::Close) || *self.stop.borrow() {
                return Ok(());
            }
            if !self.read().await? {
                return Ok(());
            }
        }
    }

    /// Runs the requests that are complete in the input buffer, in order.
    async fn process_buffer(&mut self) -> Flow {
        loop {
            if self.swallow > 0 {
                let n = self.swallow.min(self.conn.input.len());
                self.conn.input.advance(n);
                self.swallow -= n;
                if self.swallow > 0 {
                    return Flow::Continue;
                }
            }
            let binary = match (self.binary, self.conn.input.first()) {
                (Some(binary), _) => binary,
                (None, Some(first)) => *self.binary.insert(*first == binary::REQUEST_MAGIC),
                (None, None) => return Flow::Continue,
            };
            let step = if binary { self.binary_step().await } else { self.text_step().await };
            let Some(flow) = step else {
                return Flow::Continue;
            };
            if matches!(flow, Flow::Close) {
                return flow;
            }
            self.conn.flush_if_full(&self.shared.stats).await;
            if self.conn.is_broken() {
                return Flow::Close;
            }
        }
    }

    /// Runs the next text request; `None` if it is not all there yet.
    async fn text_step(&mut self) -> Option<Flow> {
        let flow = match parse(&self.conn.input, &self.shared.config.limits) {
            Parse::Incomplete => return None,
            Parse::Frame { command, consumed } => {
                self.conn.input.advance(consumed);
                let next = self.gather_reads(command);
                let mut ctx = cmd::Ctx::new(&self.shared, &mut self.conn);
                match next {
                    Next::Reads(gets) => cmd::get::run_pipelined(&mut ctx, gets).await,
                    Next::One(command) => cmd::run(&mut ctx, command).await,
                }
            }
            Parse::Invalid(invalid) => self.invalid(invalid).await,
        };
        Some(if self.conn.is_broken() { Flow::Close } else { flow })
    }

    /// Runs the next binary request; `None` if it is not all there yet.
    async fn binary_step(&mut self) -> Option<Flow> {
        let flow = match binary::parse(&self.conn.input, &self.shared.config.limits) {
            BinParse::Incomplete => return None,
            BinParse::Frame { request, consumed } => {
                self.conn.input.advance(consumed);
                let mut ctx = cmd::Ctx::new(&self.shared, &mut self.conn);
                cmd::binary::run(&mut ctx, request).await
            }
            BinParse::Invalid(invalid) => self.binary_invalid(invalid).await,
        };
        Some(if self.conn.is_broken() { Flow::Close } else { flow })
    }

    async fn binary_invalid(&mut self, invalid: BinInvalid) -> Flow {
        if let Some((opcode, opaque, status)) = invalid.reply {
            binary::error(&mut self.conn.out, opcode, opaque, status);
        }
        let (reply, consumed, swallow, close) = (None, invalid.consumed, invalid.swallow, invalid.close);
        self.invalid(Invalid { reply, consumed, swallow, close, unlink: invalid.unlink }).await
    }

    /// Pipelined `get`/`gets` requests that follow each other in the buffer are read
    /// concurrently (each key may be a round trip to a chain's tail) and answered in order.
    /// Reads do not conflict with each other, and the run stops at the first other request,
    /// so every read still sees all updates sent before it on this connection.
    fn gather_reads(&mut self, first: Command) -> Next {
        let first = match first {
            Command::Get(get) if get.touch.is_none() && get.keys.len() < PIPELINED_KEYS_MAX => get,
            other => return Next::One(other),
        };
        let mut keys = first.keys.len();
        let mut gets = vec![first];
        while let Parse::Frame { command: Command::Get(get), consumed } =
            parse(&self.conn.input, &self.shared.config.limits)
        {
            if get.touch.is_some() || keys + get.keys.len() > PIPELINED_KEYS_MAX {
                break;
            }
            keys += get.keys.len();
            gets.push(get);
            self.conn.input.advance(consumed);
        }
        Next::Reads(gets)
    }

    async fn invalid(&mut self, invalid: Invalid) -> Flow {
        if let Some(reply) = invalid.reply {
            self.conn.reply(reply);
        }
        if let Some(key) = invalid.unlink {
            cmd::store::unlink(&self.shared, key).await;
        }
        let consumed = invalid.consumed.min(self.conn.input.len());
        self.conn.input.advance(consumed);
        self.swallow = invalid.swallow;
        if invalid.close && invalid.reply.is_none() && !self.binary.unwrap_or(false) {
            // memcached drops the connection at once, unsent replies and all.
            self.conn.out.clear();
            Flow::Close
        } else if invalid.close {
            Flow::Close
        } else {
            Flow::Continue
        }
    }

    /// Reads more input; `false` on end of stream, idle timeout or server shutdown.
    async fn read(&mut self) -> std::io::Result<bool> {
        let idle = self.shared.config.idle_timeout;
        let stats = &self.shared.stats;
        let read = self.conn.read(stats);
        let timed = async {
            match idle {
                Some(limit) => tokio::time::timeout(limit, read).await.ok(),
                None => Some(read.await),
            }
        };
        tokio::select! {
            result = timed => match result {
                Some(result) => Ok(result? > 0),
                None => Ok(false),
            },
            _ = self.stop.changed() => Ok(false),
        }
    }
}
