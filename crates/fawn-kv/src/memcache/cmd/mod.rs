//! Request handlers, one file per command group. Each appends its reply to `ctx.out()`; a
//! [`ServiceError`] becomes `SERVER_ERROR <message>` and the connection goes on.

mod admin;
mod arith;
pub(super) mod binary;
mod delete;
pub(super) mod get;
mod meta;
pub(super) mod store;
mod touch;

use std::time::{SystemTime, UNIX_EPOCH};

use fawn_proto::memcache::{reply, Command};
use fawn_proto::op::{Mutation, Outcome, UnixSeconds, Update};
use tokio::sync::OwnedSemaphorePermit;

use super::conn::Connection;
use super::stats::Stats;
use super::Shared;
use crate::service::{KvService, ServiceError};

/// Whether the connection continues after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flow {
    Continue,
    Close,
}

/// What a handler may use: the shared server state and the connection it answers on.
pub(super) struct Ctx<'a, S> {
    pub shared: &'a Shared<S>,
    conn: &'a mut Connection,
}

impl<'a, S: KvService> Ctx<'a, S> {
    pub fn new(shared: &'a Shared<S>, conn: &'a mut Connection) -> Self {
        Ctx { shared, conn }
    }

    /// The connection's pending replies.
    pub fn out(&mut self) -> &mut Vec<u8> {
        &mut self.conn.out
    }

    /// Streams a large reply instead of buffering it whole (see [`Connection::flush_if_full`]).
    pub async fn flush_if_full(&mut self) {
        self.conn.flush_if_full(&self.shared.stats).await;
    }

    /// `bytes` of room in the fetch budget for a batch of reads. If they are not free, the
    /// replies pending on this connection that hold room are written first, which gives it
    /// back: a connection never waits for room while holding some, and fetches only as fast
    /// as its client takes the replies. (A connection holding none does not flush to wait.)
    /// A connection holding none whose client has read everything sent to it takes a small
    /// read's room from the fair share instead, behind such reads only.
    pub async fn reserve_reads(&mut self, bytes: usize) -> OwnedSemaphorePermit {
        let budget = &self.shared.budget;
        if let Some(room) = budget.try_reserve(bytes) {
            return room;
        }
        Stats::incr(&self.stats().counters.fetch_budget_waits);
        if self.conn.holds_budget() {
            // A failed write breaks the connection; the caller sees it after the read.
            let _ = self.conn.flush(&self.shared.stats).await;
        } else if budget.fits_share(bytes) && self.conn.nothing_unread() {
            // Not behind the reads of clients that leave their replies unread.
            return budget.reserve_share(bytes).await;
        }
        budget.reserve(bytes).await
    }

    /// Holds `room`, made exactly `used` bytes, until the replies now pending are written.
    /// `Err(room)` if the replies take more than `room` and the budget has not the rest free
    /// now: the caller drops them (so no reply is ever held beyond the budget) and reads
    /// again with room for them.
    pub fn hold(&mut self, room: OwnedSemaphorePermit, used: usize) -> Result<(), OwnedSemaphorePermit> {
        let room = self.shared.budget.fit(room, used).inspect_err(|_| {
            Stats::incr(&self.shared.stats.counters.fetch_budget_rereads);
        })?;
        self.conn.hold(room);
        Ok(())
    }

    /// Holds `room` as it is, for a reply larger than any reservation (a value limit above
    /// `CONNECTION_FETCH_BYTES_MAX`, which is read alone): better than never answering it.
    pub fn hold_as_is(&mut self, room: OwnedSemaphorePermit) {
        self.conn.hold(room);
    }

    /// Holds `room`, reserved for the largest reply, made `used` bytes if the budget allows
    /// (else as it is): for reads that cannot be repeated (they touch or claim the item).
    pub fn hold_largest(&mut self, room: OwnedSemaphorePermit, used: usize) {
        let room = self.shared.budget.fit(room, used).unwrap_or_else(|room| room);
        self.conn.hold(room);
    }

    /// Whether writing to the client failed: nothing more is to be read for it.
    pub fn is_broken(&self) -> bool {
        self.conn.is_broken()
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    pub fn service(&self) -> &S {
        &self.shared.service
    }

    pub fn reply(&mut self, line: &[u8]) {
        self.conn.reply(line);
    }

    /// Reports a cluster failure; counted, and never fatal for the connection. Under
    /// `noreply` it is not sent, as memcached does, since the client reads no reply.
    pub fn server_error(&mut self, error: &ServiceError, noreply: bool) {
        Stats::incr(&self.stats().counters.server_errors);
        if !noreply {
            reply::server_error(self.out(), &error.to_string());
        }
    }

    /// Sends an update to the cluster, turning a failure into a `SERVER_ERROR` reply.
    pub async fn update(&mut self, update: Update, noreply: bool) -> Option<Outcome> {
        match self.service().update(update).await {
            Ok(outcome) => Some(outcome),
            Err(error) => {
                self.server_error(&error, noreply);
                None
            }
        }
    }
}

/// The server's clock, for exptime conversion and ttl reports.
pub(super) fn now() -> UnixSeconds {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    u32::try_from(secs).unwrap_or(u32::MAX)
}

/// An update with no value (delete, incr, decr, touch).
pub(super) fn bare_update(key: Vec<u8>, mutation: Mutation, expiry: UnixSeconds) -> Update {
    Update { key, mutation, value: Vec::new(), flags: 0, expiry }
}

/// Runs one parsed request.
pub(super) async fn run<S: KvService>(ctx: &mut Ctx<'_, S>, command: Command) -> Flow {
    match command {
        Command::Get(get) => get::run(ctx, get).await,
        Command::Store(store) => store::run(ctx, store).await,
        Command::Delete { key, noreply } => delete::run(ctx, key, noreply).await,
        Command::Arith { key, incr, delta, noreply } => arith::run(ctx, key, incr, delta, noreply).await,
        Command::Touch { key, exptime, noreply } => touch::run(ctx, key, exptime, noreply).await,
        Command::FlushAll { delay, noreply } => admin::flush_all(ctx, delay, noreply).await,
        Command::Version => admin::version(ctx),
        Command::Verbosity { noreply } => admin::verbosity(ctx, noreply),
        Command::Stats { group } => admin::stats(ctx, group).await,
        Command::RefreshCerts { noreply } => admin::refresh_certs(ctx, noreply),
        Command::Quit => return Flow::Close,
        Command::MetaGet(mg) => meta::get(ctx, mg).await,
        Command::MetaSet(ms) => meta::set(ctx, ms).await,
        Command::MetaDelete(md) => meta::delete(ctx, md).await,
        Command::MetaArith(ma) => meta::arith(ctx, ma).await,
        Command::MetaNoop => ctx.reply(reply::META_MN),
        Command::MetaDebug { key } => meta::debug(ctx, key).await,
    }
    Flow::Continue
}
