//! A peer front-end that refuses connections is reported to the manager group at once
//! (`Request::FrontendRefused`): the leader checks for itself and, when nothing listens there,
//! lends the dead front-end's wedges without waiting for its heartbeat silence
//! (docs/PROTOCOL.md, "Front-end failover"). Native clients refused by a front-end send the
//! same report through another front-end, which relays it.

use std::time::{Duration, Instant};

use fawn_client::rpc::RpcError;
use fawn_proto::native::{Request, Response, WireError};

use super::Frontend;
use crate::view::View;

/// Shortest time between two reports of this front-end: many requests refused at once cost
/// the manager one check.
const REPORT_INTERVAL: Duration = Duration::from_millis(100);

impl Frontend {
    /// The process is stopping: it gives its lease up before its listeners close, so that
    /// nothing it still answers on an open connection uses its cache once a refused
    /// connection can get its wedge lent.
    pub fn stopping(&self) {
        self.ownership.release();
    }

    /// A call to `addr` failed with `error`: if `addr` is a peer front-end's and the
    /// connection could not be made, tell the manager group (and install its answer).
    pub(super) async fn peer_unreachable(&self, view: &View, addr: &str, error: &RpcError) {
        if !matches!(error, RpcError::Connect { .. }) {
            return;
        }
        let peer = view.config.frontends.iter().find(|f| f.native_addr == addr && f.id != self.options.id);
        if let Some(peer) = peer {
            let _ = self.report_refused(peer.id).await;
        }
    }

    /// Tells the manager group that front-end `frontend` refused a connection; answers with
    /// the configuration the leader answered with (installed here too).
    pub(super) async fn report_refused(&self, frontend: u32) -> Result<Response, WireError> {
        {
            let mut last = self.refusal_reported.lock();
            if last.is_some_and(|t| t.elapsed() < REPORT_INTERVAL) {
                return Ok(Response::Config(self.current().config.clone()));
            }
            *last = Some(Instant::now());
        }
        let request = Request::FrontendRefused { frontend };
        let manager = &self.options.manager;
        match crate::manager::client::call(&self.pool, manager, request, self.options.request_timeout).await {
            Ok(Response::Config(c)) => {
                self.install(c);
                Ok(Response::Config(self.current().config.clone()))
            }
            Ok(Response::Error(e)) => Err(e),
            Ok(other) => Err(super::unexpected(other)),
            Err(e) => Err(WireError::Unavailable(e.to_string())),
        }
    }
}
