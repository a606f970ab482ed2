//! The clients: each runs one operation at a time on a few shared keys (sets, deletes, cas
//! and gets), sends updates to its range's head and gets to its tail by the manager's
//! current configuration, and retries on a refusal or a timeout, recording the history.
//!
//! Each update carries the client's floor as a front-end sends its own (`ReqFloor`): the
//! lowest request seq it may still send, here the seq of the update in flight (one operation
//! at a time), and retries keep it. Client 0 sends none, as the Rust client's updates reach
//! heads (`NATIVE_CLIENT`): its outcomes go by the window, and hold back others' behind
//! them. With `Config::late_copies`, now and then an update attempt is slow: it arrives after
//! the client timed out on it, mostly once its operation ended (answered or given up) and the
//! floor passed it. The head answers it if it still remembers it and refuses it as stale
//! otherwise (`Dedup::is_stale`); it must never apply it again.

use std::collections::HashMap;

use fawn_kv::replica::machine::{Action, ClientUpdate, Event};
use fawn_proto::native::{ReqId, WireError};
use fawn_proto::op::{Mutation, Outcome, Update};
use fawn_ring::key_id;
use rand::Rng;

use super::frontend::FRONTEND_ADDR;
use super::{
    key_bytes, Answer, Capture, Client, Ev, Micros, Req, Sent, World, CLIENT_ATTEMPTS_MAX, CLIENT_BACKOFF,
    CLIENT_TIMEOUT, LATE_COPY_DELAY_MAX, MS,
};
use crate::check::{Op, OpKind, OpResult, Value};

/// The client whose updates carry no floor, as a native client's (`fawn_client`) do: the
/// front-end routes them for it and knows no floor of its.
const NATIVE_CLIENT: u32 = 0;

fn value_bytes(v: Value) -> Vec<u8> {
    format!("{}:{}", v.0, v.1).into_bytes()
}

pub(super) fn parse_value(bytes: &[u8]) -> Option<Value> {
    let s = std::str::from_utf8(bytes).ok()?;
    let (c, n) = s.split_once(':')?;
    Some((c.parse().ok()?, n.parse().ok()?))
}

impl Client {
    pub(super) fn new(ops: usize) -> Client {
        Client {
            current: None,
            notice_missed: false,
            ops_left: ops,
            writes: 0,
            next_req: 1,
            seen: HashMap::new(),
        }
    }

    /// The lowest request seq this client may still send: its update in flight, else the
    /// next (as `ReqFloor::floor` with one request at a time).
    fn floor(&self) -> u64 {
        match &self.current {
            Some((_, Req::Update { req, .. }, _, _)) => req.seq,
            _ => self.next_req,
        }
    }
}

impl World {
    pub(super) fn client_next(&mut self, client: u32) {
        let c = &mut self.clients[client as usize];
        if c.ops_left == 0 || c.current.is_some() {
            return;
        }
        c.ops_left -= 1;
        let key = self.rng.gen_range(0..self.cfg.keys as u32);
        let roll = self.rng.gen_range(0..100);
        let c = &mut self.clients[client as usize];
        let (kind, req) = if roll < 35 {
            (OpKind::Get, Req::Get { key: key_bytes(key) })
        } else {
            let req_id = ReqId { client: client as u64, seq: c.next_req };
            c.next_req += 1;
            let seen = c.seen.get(&key).copied();
            let (kind, mutation, value) = if roll < 50 {
                (OpKind::Delete, Mutation::Delete, Vec::new())
            } else {
                c.writes += 1;
                let new = (client, c.writes);
                match seen {
                    Some((old, cas)) if roll < 70 => {
                        (OpKind::Cas { old, new }, Mutation::Cas { unique: cas }, value_bytes(new))
                    }
                    _ => (OpKind::Set(new), Mutation::Set, value_bytes(new)),
                }
            };
            let update = Update { key: key_bytes(key), mutation, value, flags: 0, expiry: 0 };
            (kind, Req::Update { req: req_id, update })
        };
        let index = self.history.len();
        self.history.push(Op { client, key, kind, call: self.now, ret: None });
        let range = self.range_of_key(key);
        let c = &mut self.clients[client as usize];
        c.current = Some((index, req.clone(), range, 0));
        c.notice_missed = false;
        match req {
            Req::Update { req, update } => self.frontend_update_starts(req, &update.key),
            Req::Get { key } => {
                if let Some(item) = self.frontend_get(client, index, &key) {
                    let answer = Answer::Get(Ok(Some(item)));
                    return self.at(0, Ev::Answer { client, tag: index as u64, answer, attempt: None });
                }
            }
        }
        self.send_request(client);
    }

    pub(super) fn send_request(&mut self, client: u32) {
        let Some((index, req, _, attempt)) = self.clients[client as usize].current.clone() else {
            return;
        };
        // Routed by the current configuration (its range may have been split or merged).
        let range = self.range_of_key(self.history[index].key);
        if let Some(current) = self.clients[client as usize].current.as_mut() {
            current.2 = range;
        }
        let Some(rc) = self.range_config(range) else { return };
        let node = match req {
            Req::Update { .. } => rc.head(),
            Req::Get { .. } => rc.tail(),
        };
        let Some(node) = node else { return };
        let c = &self.clients[client as usize];
        let notice = self.frontend.is_some() && !c.notice_missed;
        let floor = if client == NATIVE_CLIENT { 0 } else { c.floor() };
        let epoch = self.config().epoch;
        let d = self.delay();
        let tag = index as u64;
        let update = matches!(req, Req::Update { .. });
        if update && self.cfg.late_copies && self.lrng.gen_ratio(self.cfg.late_copy_percent, 100) {
            // Slow: it arrives after the client's time-out, on the connection to the node's
            // current process (none if the node is down).
            let late = CLIENT_TIMEOUT + self.lrng.gen_range(0..LATE_COPY_DELAY_MAX);
            if let Some(life) = self.nodes.get(&node).filter(|n| n.alive).map(|n| n.life) {
                let sent = Sent { node, range, client, tag, req, notice, floor, attempt, epoch };
                self.at(late, Ev::LateCopy { sent, life });
            }
        } else {
            self.at(d, Ev::Request(Sent { node, range, client, tag, req, notice, floor, attempt, epoch }));
        }
        self.at(CLIENT_TIMEOUT, Ev::ClientTimeout { client, attempt });
    }

    /// A slow attempt reaches its node, unless the node restarted since it was sent (the
    /// connection it came on closed). The node's newer configuration routes it by its key,
    /// as the back-end serves a request of an older epoch (`Backend::view_for`).
    pub(super) fn on_late_copy(&mut self, mut sent: Sent, life: u32) {
        let Req::Update { update, .. } = &sent.req else { return };
        let Some(n) = self.nodes.get(&sent.node).filter(|n| n.alive && n.life == life) else { return };
        if !n.replicas.contains_key(&sent.range) {
            let id = key_id(&update.key);
            let Some(ix) = n.replicas.keys().copied().find(|ix| self.ranges[*ix].contains(id)) else {
                return;
            };
            sent.range = ix;
        }
        self.late_copies += 1;
        if self.on_request(sent) {
            self.stale_refusals += 1;
        }
    }

    pub(super) fn retry(&mut self, client: u32, backoff: Micros) {
        let c = &mut self.clients[client as usize];
        let Some((index, req, range, attempt)) = c.current.take() else { return };
        if attempt + 1 >= CLIENT_ATTEMPTS_MAX {
            // Given up: the operation's outcome stays unknown in the history.
            let update = match req {
                Req::Update { req, .. } => Some(req),
                Req::Get { .. } => None,
            };
            self.frontend_op_ends(client, index, update, true);
            let d = self.rng.gen_range(0..5 * MS);
            self.at(d, Ev::ClientNext { client });
            return;
        }
        c.current = Some((index, req, range, attempt + 1));
        if backoff == 0 {
            self.send_request(client);
        } else {
            self.at(backoff, Ev::ClientSend { client });
        }
    }

    /// The client's op got no answer in time. Through the front-end an update's answer is
    /// the tail's `Committed` notice: the front-end stops waiting for it and asks the head
    /// without `reply_to`, which the head answers (`COMMIT_NOTICE_WAIT_MAX`).
    pub(super) fn on_timeout(&mut self, client: u32) {
        let c = &mut self.clients[client as usize];
        let update = matches!(c.current, Some((_, Req::Update { .. }, _, _)));
        if self.frontend.is_some() && update && !c.notice_missed {
            c.notice_missed = true;
            self.notice_fallbacks += 1;
        }
        self.retry(client, 0);
    }

    /// A client's request reaches its node. True if the head refused it as invalid in this
    /// step (for an update below its client's floor: a stale copy).
    pub(super) fn on_request(&mut self, sent: Sent) -> bool {
        let Sent { node, range, client, tag, req, notice, floor, attempt, epoch } = sent;
        if self.isolated(node) || !self.nodes.get(&node).is_some_and(|n| n.alive) {
            return false;
        }
        if !self.nodes[&node].replicas.contains_key(&range) {
            // No such range here (split or merged away, or not yet installed): the back-end
            // tells the sender to refresh its configuration.
            let current = self.nodes[&node].installed;
            let err = Err(WireError::StaleEpoch { current });
            let (answer, attempt) = match req {
                Req::Update { .. } => (Answer::Update(err), Some(attempt)),
                Req::Get { .. } => (Answer::Get(Err(WireError::StaleEpoch { current })), None),
            };
            let d = self.delay();
            self.at(d, Ev::Answer { client, tag, answer, attempt });
            return false;
        }
        let now = (self.now / 1_000_000) as u32;
        let mut update_req = None;
        let event = match req {
            Req::Update { req, update } => Event::Update(ClientUpdate {
                req: {
                    update_req = Some(req);
                    req
                },
                update,
                reply_to: notice.then(|| FRONTEND_ADDR.to_string()),
                now,
                now_micros: self.now,
                flush_at: 0,
                bulk_copy_pending: false,
                floor,
                epoch,
            }),
            Req::Get { key } => Event::Get { token: ((client as u64) << 32) | tag, key, now },
        };
        let Some(req) = update_req else {
            self.step(node, range, event);
            return false;
        };
        self.attempt_at.insert((node, req), attempt);
        // The head answers in this step (a refusal, a remembered outcome, a failed
        // condition), or forwards the update with `reply_to` and stays silent (the tail's
        // `Committed` answers), or keeps a waiter that its ack answers.
        self.capture = Some(Capture { node, req, answer: None, forwarded: false });
        self.step(node, range, event);
        match self.capture.take() {
            Some(Capture { answer: Some(result), .. }) => {
                self.silenced.remove(&(node, req));
                let invalid = matches!(result, Err(WireError::Invalid(_)));
                self.act(node, range, Action::Reply { req, result });
                invalid
            }
            Some(Capture { forwarded: true, .. }) => {
                self.silenced.insert((node, req));
                false
            }
            _ => {
                self.silenced.remove(&(node, req));
                false
            }
        }
    }

    /// An answer reaches a client. An update's answer to an attempt the client no longer
    /// waits for is dropped, as the RPC layer drops the response of a call that timed out
    /// (`fawn_client::rpc`), and as the front-end drops its first call once it asks the head
    /// again: a client never takes it. (A condition that failed wrote nothing and is
    /// remembered only by the head that decided it; a retry at another head is decided
    /// again, and only that decision's answer may be taken.)
    pub(super) fn on_answer(&mut self, client: u32, tag: u64, answer: Answer, attempt: Option<u32>) {
        let c = &mut self.clients[client as usize];
        let Some((index, req, _, current_attempt)) = c.current.as_ref() else { return };
        if attempt.is_some_and(|a| a != *current_attempt) {
            return;
        }
        // An update's tag is its request seq, a get's its history index: the two can be
        // equal, so an answer of the other kind (a late or duplicate one) is not this op's.
        let current = match (req, &answer) {
            (Req::Update { req, .. }, Answer::Update(_)) => req.seq,
            (Req::Get { .. }, Answer::Get(_)) => *index as u64,
            _ => return,
        };
        if current != tag {
            return;
        }
        let (index, update) = match req {
            Req::Update { req, .. } => (*index, Some(*req)),
            Req::Get { .. } => (*index, None),
        };
        let key = self.history[index].key;
        match &answer {
            Answer::Update(Ok(_)) => self.frontend_op_ends(client, index, update, false),
            Answer::Get(Ok(item)) => self.frontend_read(client, index, &key_bytes(key), item),
            Answer::Update(Err(_)) | Answer::Get(Err(_)) => {}
        }
        if let (Some(req), Answer::Update(Ok(outcome))) = (update, &answer) {
            self.note_answered(req, outcome);
        }
        let c = &mut self.clients[client as usize];
        let result = match answer {
            Answer::Update(Ok(outcome)) => {
                let (r, seq) = match outcome {
                    Outcome::Stored { cas } => (OpResult::Stored, Some(cas)),
                    Outcome::Deleted => (OpResult::Deleted, None),
                    Outcome::NotFound => (OpResult::NotFound, None),
                    Outcome::Exists => (OpResult::Exists, None),
                    other => {
                        self.violations.push(format!("unexpected outcome {other:?}"));
                        return;
                    }
                };
                if let Some(seq) = seq {
                    self.acked.push((key, seq));
                }
                r
            }
            Answer::Get(Ok(item)) => {
                let value = item.as_ref().and_then(|i| parse_value(&i.value));
                if let (Some(v), Some(i)) = (value, item.as_ref()) {
                    c.seen.insert(key, (v, i.cas));
                }
                OpResult::Read(value)
            }
            Answer::Update(Err(_)) | Answer::Get(Err(_)) => return self.retry(client, CLIENT_BACKOFF),
        };
        self.history[index].ret = Some((self.now, result));
        c.current = None;
        let d = self.rng.gen_range(0..5 * MS);
        self.at(d, Ev::ClientNext { client });
    }
}
