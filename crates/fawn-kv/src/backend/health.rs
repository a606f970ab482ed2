//! Link health: a syncing replica's silent source and chain successors are probed; a link
//! that stays cut is reported to the manager (`report_cut`, in `mod.rs`).

use super::*;

impl Backend {
    /// Notices chain links that make no progress — a link cut between neighbours that both
    /// still reach the manager, or a stuck successor — and logs and counts each stall and its
    /// end. The updates stay unacknowledged (and their puts wait) until the link flows again
    /// or the manager changes the chain; `check_cuts` asks it to when the stall lasts.
    /// `sync_heard` lists, per syncing replica still waiting for its copy, its source (the
    /// tail) and when it last heard from it: the tail keeps no unacknowledged updates for a
    /// syncing replica, so the replica watches that link from its end — a source silent for
    /// `LINK_STALL` is a stalled link like any other.
    pub(super) fn check_links(&self, sync_heard: &[(NodeId, Instant)]) {
        let view = self.current();
        let now = crate::clock::unix_micros();
        let mut oldest: HashMap<NodeId, u64> = HashMap::new();
        for (range, r) in self.replicas.read().iter() {
            let Some(seq) = r.oldest_unacked() else { continue };
            let rc = view.config.ranges.iter().find(|rc| rc.range == *range);
            let Some(succ) = rc.and_then(|rc| rc.successor(self.options.node)) else { continue };
            let age = now.saturating_sub(seq);
            let worst = oldest.entry(succ).or_default();
            *worst = (*worst).max(age);
        }
        for (source, heard) in sync_heard {
            let age = heard.elapsed().as_micros() as u64;
            let worst = oldest.entry(*source).or_default();
            *worst = (*worst).max(age);
        }
        let limit = LINK_STALL.as_micros() as u64;
        let mut stalled = self.stalled_links.lock();
        for (&peer, &age) in &oldest {
            if age >= limit && !stalled.contains_key(&peer) {
                warn!(
                    peer,
                    stalled_ms = age / 1000,
                    "chain link stalled: updates forwarded to this successor are not acknowledged, \
                     or this sync source sends nothing (link cut or stuck node); puts on those \
                     ranges wait, syncs from it make no progress"
                );
                self.counters.link_stalls.fetch_add(1, Ordering::Relaxed);
                let since =
                    Instant::now().checked_sub(Duration::from_micros(age)).unwrap_or_else(Instant::now);
                stalled.insert(peer, since);
            }
        }
        stalled.retain(|peer, since| {
            let still = oldest.get(peer).is_some_and(|age| *age >= limit);
            if !still {
                info!(peer, stalled_ms = since.elapsed().as_millis() as u64, "chain link flowing again");
            }
            still
        });
    }

    /// Starts a direct probe (`Ping` on a client connection, not the chain link) of `peer`
    /// unless one is in flight; its result lands in `link_probes`.
    pub(super) fn probe_link(&self, peer: NodeId) {
        let Some(addr) = self.current().config.backend_addr(peer).map(str::to_string) else { return };
        let Some(b) = self.me.upgrade() else { return };
        {
            let mut probes = self.link_probes.lock();
            let p = probes.entry(peer).or_default();
            if p.in_flight {
                return;
            }
            p.in_flight = true;
        }
        tokio::spawn(async move {
            let started = Instant::now();
            let call = b.pool.call(&addr, Request::Ping, LINK_PROBE_TIMEOUT);
            let ok = matches!(tokio::time::timeout(LINK_PROBE_TIMEOUT, call).await, Ok(Ok(Response::Pong)));
            let mut probes = b.link_probes.lock();
            let p = probes.entry(peer).or_default();
            p.in_flight = false;
            p.last = Some((started, ok));
        });
    }

    /// The latest finished probe of `peer`: (started, answered).
    pub(super) fn last_probe(&self, peer: NodeId) -> Option<(Instant, bool)> {
        self.link_probes.lock().get(&peer).and_then(|p| p.last)
    }

    /// Turns stalls into repairs: a successor stalled for `link_repair_after` that does not
    /// answer a direct probe started after the stall began is reported to the manager as a cut
    /// link; a reported peer is probed and re-reported until it answers again. A stall whose
    /// successor still answers (a slow or overloaded node) is not reported.
    pub(super) fn check_cuts(&self) {
        let threshold = self.options.link_repair_after;
        if threshold.is_zero() {
            return;
        }
        let stalled: Vec<(NodeId, Instant)> =
            self.stalled_links.lock().iter().map(|(p, t)| (*p, *t)).collect();
        let reported: Vec<(NodeId, Instant)> =
            self.reported_cuts.lock().iter().map(|(p, t)| (*p, *t)).collect();
        for (peer, _) in stalled.iter().chain(&reported) {
            self.probe_link(*peer);
        }
        for (peer, since) in &stalled {
            let unanswered = self.last_probe(*peer).is_some_and(|(at, ok)| !ok && at >= *since);
            if since.elapsed() >= threshold && unanswered {
                self.report_cut(*peer);
            }
        }
        for (peer, last_report) in reported {
            if stalled.iter().any(|(p, _)| *p == peer) {
                continue;
            }
            match self.last_probe(peer) {
                Some((at, true)) if at > last_report => {
                    info!(peer, "chain neighbour answers again; no longer reporting the link cut");
                    self.reported_cuts.lock().remove(&peer);
                }
                _ => self.report_cut(peer),
            }
        }
    }
}

/// A direct probe of a chain successor.
#[derive(Default)]
pub(super) struct LinkProbe {
    in_flight: bool,
    /// The latest finished probe: when it started, and whether the peer answered.
    last: Option<(Instant, bool)>,
}
