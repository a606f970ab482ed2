//! Serves one client: read, parse, run, reply — in order, with bounded buffers.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use bytes::Buf;
use fawn_proto::memcache::binary::{self, BinCommand, BinInvalid, BinParse, BinRequest, Status};
use fawn_proto::memcache::{parse, reply, Command, GetCommand, Invalid, Parse, SetMode};
use tokio::sync::watch;

use super::budget::CONNECTION_FETCH_BYTES_MAX;
use super::cmd::{self, Flow};
use super::conn::Connection;
use super::stats::Activity;
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
    /// Whether requests may run: from the start without a user file, else once the client has
    /// authenticated (see [`super::auth`]).
    authenticated: bool,
    /// When the partial request now in the input began arriving (`None`: no partial request).
    partial_since: Option<Instant>,
}

/// What to run next: a run of pipelined plain gets, or one request.
enum Next {
    Reads(Vec<GetCommand>),
    One(Command),
}

impl<S: KvService> Session<S> {
    pub fn new(conn: Connection, shared: Arc<Shared<S>>, stop: watch::Receiver<bool>) -> Self {
        let authenticated = shared.config.users.is_none();
        Session { conn, shared, stop, swallow: 0, binary: None, authenticated, partial_since: None }
    }

    pub async fn run(mut self) {
        self.shared.stats.connection_opened();
        let (fd, peer) = self.conn.identity();
        let activity = self.shared.stats.register(fd, peer);
        let _ = self.serve(&activity).await;
        self.shared.stats.deregister(fd);
        self.conn.shutdown().await;
        self.shared.stats.connection_closed();
    }

    /// Alternates: answer every complete request in the buffer, flush, read more.
    async fn serve(&mut self, activity: &Activity) -> std::io::Result<()> {
        loop {
            activity.busy.store(true, Relaxed);
            activity.last_cmd_secs.store(self.shared.stats.uptime_secs(), Relaxed);
            let unparsed = self.conn.input.len();
            let flow = self.process_buffer().await;
            activity.busy.store(false, Relaxed);
            self.conn.flush(&self.shared.stats).await?;
            if matches!(flow, Flow::Close) || *self.stop.borrow() {
                return Ok(());
            }
            // The clock of a partial request restarts whenever input was consumed, so a client
            // that keeps pipelining is never taken for a slow one.
            self.partial_since = match (self.conn.input.is_empty() && self.swallow == 0, self.partial_since) {
                (true, _) => None,
                (false, Some(since)) if self.conn.input.len() >= unparsed => Some(since),
                (false, _) => Some(Instant::now()),
            };
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
        if !self.authenticated {
            return self.text_login();
        }
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

    /// Before authentication, as memcached with a user file: only `set <key> <flags> <exptime>
    /// <bytes>` with `<user> <password>` as data is accepted (`STORED`, even under `noreply`);
    /// anything else is `CLIENT_ERROR unauthenticated` and the rest of the input is dropped.
    fn text_login(&mut self) -> Option<Flow> {
        let (reply, consumed) = match parse(&self.conn.input, &self.shared.config.limits) {
            Parse::Incomplete => return None,
            Parse::Frame { command: Command::Store(store), consumed } if store.mode == SetMode::Set => {
                let users = self.shared.config.users.as_deref();
                self.authenticated = users.is_some_and(|users| users.check_text(&store.value));
                let reply: &[u8] = if self.authenticated {
                    reply::STORED
                } else {
                    b"CLIENT_ERROR authentication failure\r\n"
                };
                (reply, consumed)
            }
            _ => (&b"CLIENT_ERROR unauthenticated\r\n"[..], self.conn.input.len()),
        };
        self.conn.input.advance(consumed);
        self.swallow = 0;
        self.conn.reply(reply);
        Some(Flow::Continue)
    }

    /// Runs the next binary request; `None` if it is not all there yet.
    async fn binary_step(&mut self) -> Option<Flow> {
        let flow = match binary::parse(&self.conn.input, &self.shared.config.limits) {
            BinParse::Incomplete => return None,
            BinParse::Frame { request, consumed } => {
                self.conn.input.advance(consumed);
                if let BinCommand::SaslList | BinCommand::SaslAuth { .. } | BinCommand::SaslStep =
                    request.command
                {
                    return Some(self.sasl(&request));
                }
                if !self.authenticated && request.opcode != binary::opcode::VERSION {
                    // As memcached with SASL: refused, and the connection closed.
                    binary::error(&mut self.conn.out, request.opcode, request.opaque, Status::AuthError);
                    return Some(Flow::Close);
                }
                let mut ctx = cmd::Ctx::new(&self.shared, &mut self.conn);
                cmd::binary::run(&mut ctx, request).await
            }
            BinParse::Invalid(invalid) => self.binary_invalid(invalid).await,
        };
        Some(if self.conn.is_broken() { Flow::Close } else { flow })
    }

    /// SASL with the `PLAIN` mechanism against the user file; without one, memcached built
    /// without SASL answers `Unknown command`.
    fn sasl(&mut self, request: &BinRequest) -> Flow {
        let head = (request.opcode, request.opaque, Status::Ok);
        let Some(users) = self.shared.config.users.as_deref() else {
            binary::error(&mut self.conn.out, request.opcode, request.opaque, Status::UnknownCommand);
            return Flow::Continue;
        };
        match &request.command {
            BinCommand::SaslList => binary::response(&mut self.conn.out, head, 0, &[], &[], b"PLAIN"),
            BinCommand::SaslAuth { data } if request.key == b"PLAIN" && users.check_plain(data) => {
                self.authenticated = true;
                binary::response(&mut self.conn.out, head, 0, &[], &[], b"Authenticated");
            }
            _ => binary::error(&mut self.conn.out, request.opcode, request.opaque, Status::AuthError),
        }
        Flow::Continue
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
        // Read at once: at most PIPELINED_KEYS_MAX keys whose first rooms in the fetch budget
        // stay within its per-connection bound.
        let budget = &self.shared.budget;
        let first = match first {
            Command::Get(get) if get.touch.is_none() && get.keys.len() < PIPELINED_KEYS_MAX => get,
            other => return Next::One(other),
        };
        let mut room = budget.rooms(&first.keys);
        if room > CONNECTION_FETCH_BYTES_MAX {
            return Next::One(Command::Get(first));
        }
        let mut keys = first.keys.len();
        let mut gets = vec![first];
        while let Parse::Frame { command: Command::Get(get), consumed } =
            parse(&self.conn.input, &self.shared.config.limits)
        {
            if get.touch.is_some() || keys + get.keys.len() > PIPELINED_KEYS_MAX {
                break;
            }
            let more = budget.rooms(&get.keys);
            if room + more > CONNECTION_FETCH_BYTES_MAX {
                break;
            }
            (keys, room) = (keys + get.keys.len(), room + more);
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

    /// Reads more input; `false` on end of stream, idle timeout, a request that takes too
    /// long to arrive whole (`request_read_timeout`), or server shutdown.
    async fn read(&mut self) -> std::io::Result<bool> {
        let idle = match self.partial_since {
            Some(since) => {
                let limit = self.shared.config.request_read_timeout;
                Some(limit.saturating_sub(since.elapsed()))
            }
            None => self.shared.config.idle_timeout,
        };
        let stats = &self.shared.stats;
        let read = self.conn.read(stats);
        let timed = async {
            match idle {
                Some(limit) => tokio::time::timeout(limit, read).await.ok(),
                None => Some(read.await),
            }
        };
        // In this order, without drawing a random one per read: a stop is seen first.
        tokio::select! {
            biased;
            _ = self.stop.changed() => Ok(false),
            result = timed => match result {
                Some(result) => Ok(result? > 0),
                None => Ok(false),
            },
        }
    }
}
