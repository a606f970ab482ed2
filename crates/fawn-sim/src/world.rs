//! One simulated cluster for one seed: a chain of pure replicas for one range, a manager that
//! removes failed nodes and re-adds restarted ones, clients, and a network, on a simulated
//! clock driven by one seeded random source. Nothing here reads the real clock or spawns.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use fawn_kv::replica::machine::{Action, ClientUpdate, Event, Replica};
use fawn_kv::replica::route::Route;
use fawn_kv::replica::store::{MemStore, ReplicaStore};
use fawn_proto::native::{ChainMsg, RangeConfig, ReplEffect, ReqId, WireError};
use fawn_proto::op::{Item, Mutation, Outcome, Update};
use fawn_ring::{NodeId, Range};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::check::{Op, OpKind, OpResult, Value};
use crate::Config;

/// Simulated time, in microseconds.
type Micros = u64;

const MS: Micros = 1_000;
/// Replicas retry (promoted tails, syncing replicas) this often.
const TICK_INTERVAL: Micros = 100 * MS;
/// A client stops waiting for an answer after this long and retries.
const CLIENT_TIMEOUT: Micros = 1_000 * MS;
/// A client waits this long before retrying a refused request.
const CLIENT_BACKOFF: Micros = 20 * MS;
/// Attempts before a client gives up on an operation (its outcome stays unknown).
const CLIENT_ATTEMPTS_MAX: u32 = 10;
/// Longest a client may wait for an answer: failure detection (at most 0.5 s), a client
/// timeout and retry (1 s each) and a re-sync take well under it (the longest seen over
/// thousands of seeds with three crashes is about 3.2 s); a chain that leaves an update
/// unacknowledged until the client gives up takes far longer.
const WAIT_MAX: Micros = 5_000 * MS;
/// After the clients are done, faults stop and the cluster runs this long to settle.
const SETTLE: Micros = 5_000 * MS;

/// Something that happens at a point in simulated time.
#[derive(Debug)]
enum Ev {
    /// A chain message arrives over the link `from -> to` opened as `conn`.
    Deliver {
        from: NodeId,
        to: NodeId,
        conn: u64,
        msg: ChainMsg,
    },
    /// A client's request arrives at a node.
    Request {
        node: NodeId,
        client: u32,
        tag: u64,
        req: Req,
    },
    /// A node's answer arrives at a client; `tag` names the operation (an update's request
    /// seq, a get's history index).
    Answer {
        client: u32,
        tag: u64,
        answer: Answer,
    },
    /// A client sends its current request again after a back-off.
    ClientSend {
        client: u32,
    },
    /// A crashed node's process is back, empty.
    NodeBack {
        node: NodeId,
    },
    /// The manager's configuration of `epoch` arrives at a node.
    Install {
        node: NodeId,
        epoch: u64,
    },
    /// The link `from -> to` is connected again.
    Connected {
        from: NodeId,
        to: NodeId,
        conn: u64,
    },
    Tick {
        node: NodeId,
        life: u32,
    },
    ClientNext {
        client: u32,
    },
    ClientTimeout {
        client: u32,
        attempt: u32,
    },
    /// The manager notices that a node failed, or restarted.
    Failed {
        node: NodeId,
    },
    Restarted {
        node: NodeId,
    },
    SyncDone {
        node: NodeId,
    },
    TailReady {
        node: NodeId,
    },
    Fault,
}

#[derive(Clone, Debug)]
enum Req {
    Update { req: ReqId, update: Update },
    Get { key: Vec<u8> },
}

#[derive(Debug)]
enum Answer {
    Update(Result<Outcome, WireError>),
    Get(Result<Option<Item>, WireError>),
}

struct Node {
    /// Incarnation: bumped at each crash, so events of an earlier life are dropped.
    life: u32,
    alive: bool,
    replica: Option<Replica<MemStore>>,
}

/// A directed link's connection: in-flight messages carry `conn`, and a cut opens a new one.
#[derive(Default)]
struct Link {
    conn: u64,
    /// Messages arrive in order: none before this time.
    last_arrival: Micros,
    /// Down until the `Connected` of `conn`; messages sent meanwhile wait here.
    down: Option<Vec<ChainMsg>>,
}

struct Client {
    /// The op in progress: its index in the history, request and attempt.
    current: Option<(usize, Req, u32)>,
    ops_left: usize,
    writes: u32,
    next_req: u64,
    /// The last value and cas token this client read per key (for cas).
    seen: HashMap<u32, (Value, u64)>,
}

/// What one seed's run found.
#[derive(Debug, Default)]
pub struct RunReport {
    pub violations: Vec<String>,
    pub stats: Stats,
}

/// Counts of one run, to see that a seed exercised something.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub ops: usize,
    pub answered: usize,
    pub events: u64,
    pub crashes: usize,
    pub cuts: usize,
    pub epochs: u64,
    pub sim_ms: u64,
    /// The longest an operation waited for its answer, and operations never answered.
    pub max_wait_ms: u64,
    pub unanswered: usize,
}

pub struct World {
    cfg: Config,
    rng: SmallRng,
    now: Micros,
    queue: BinaryHeap<Reverse<(Micros, u64)>>,
    /// Hash maps are only looked up here, never iterated where order matters.
    events: HashMap<u64, Ev>,
    next_event: u64,
    nodes: BTreeMap<NodeId, Node>,
    links: HashMap<(NodeId, NodeId), Link>,
    /// The manager's configurations by epoch (the latest is current).
    configs: BTreeMap<u64, RangeConfig>,
    /// Manager -> node is one connection per node: installs arrive in epoch order.
    install_arrival: HashMap<NodeId, Micros>,
    clients: Vec<Client>,
    history: Vec<Op>,
    /// Seqs of acknowledged stores and deletes, by key.
    acked: Vec<(u32, u64)>,
    crashes: usize,
    cuts: usize,
    faults_on: bool,
    /// Per node and life: highest max_seq and acked seen (they must never go back).
    high: HashMap<(NodeId, u32), (u64, u64)>,
    violations: Vec<String>,
    steps: u64,
    /// The seq each client request was first ordered at, and its first answer.
    ordered: HashMap<ReqId, Vec<(u64, Outcome)>>,
    answered: HashMap<ReqId, Outcome>,
    /// Seqs stored at the tail of their time.
    committed: std::collections::HashSet<u64>,
}

/// How a violation caused by a retried request decided again starts: a replica that got the
/// request's update by a resend from the log (or, in the real back-end, by a snapshot) has no
/// dedup entry for it, and decides its retry again once it heads the chain.
pub const DEDUP_LOST: &str = "retry decided again";

fn key_bytes(key: u32) -> Vec<u8> {
    format!("k{key}").into_bytes()
}

fn value_bytes(v: Value) -> Vec<u8> {
    format!("{}:{}", v.0, v.1).into_bytes()
}

fn parse_value(bytes: &[u8]) -> Option<Value> {
    let s = std::str::from_utf8(bytes).ok()?;
    let (c, n) = s.split_once(':')?;
    Some((c.parse().ok()?, n.parse().ok()?))
}

/// The chain members known to hold every acknowledged update.
fn proven(rc: &RangeConfig) -> impl Iterator<Item = NodeId> + '_ {
    rc.chain.iter().copied().filter(|m| Some(*m) != rc.unproven_tail)
}

impl World {
    pub fn new(seed: u64, cfg: Config) -> World {
        let chain: Vec<NodeId> = (1..=cfg.replicas as NodeId).collect();
        let rc = RangeConfig::new(Range::full(), chain.clone());
        let mut w = World {
            rng: SmallRng::seed_from_u64(seed),
            now: 0,
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            next_event: 0,
            nodes: BTreeMap::new(),
            links: HashMap::new(),
            configs: BTreeMap::from([(1, rc.clone())]),
            install_arrival: HashMap::new(),
            clients: Vec::new(),
            history: Vec::new(),
            acked: Vec::new(),
            crashes: 0,
            cuts: 0,
            faults_on: true,
            high: HashMap::new(),
            violations: Vec::new(),
            steps: 0,
            ordered: HashMap::new(),
            answered: HashMap::new(),
            committed: Default::default(),
            cfg,
        };
        for n in chain {
            let route = Route { epoch: 1, me: n, rc: rc.clone() };
            let replica = w.new_replica(route);
            w.nodes.insert(n, Node { life: 0, alive: true, replica: Some(replica) });
            w.at(TICK_INTERVAL, Ev::Tick { node: n, life: 0 });
        }
        for c in 0..w.cfg.clients {
            w.clients.push(Client {
                current: None,
                ops_left: w.cfg.ops_per_client,
                writes: 0,
                next_req: 1,
                seen: HashMap::new(),
            });
            let start = w.rng.gen_range(0..10 * MS);
            w.at(start, Ev::ClientNext { client: c as u32 });
        }
        let first = w.fault_gap();
        w.at(first, Ev::Fault);
        w
    }

    fn new_replica(&self, route: Route) -> Replica<MemStore> {
        let r = Replica::new(MemStore::default(), route);
        #[cfg(feature = "faults")]
        let r = r.with_fault(self.cfg.fault);
        r
    }

    fn at(&mut self, delay: Micros, ev: Ev) {
        let id = self.next_event;
        self.next_event += 1;
        self.events.insert(id, ev);
        self.queue.push(Reverse((self.now + delay, id)));
    }

    fn fault_gap(&mut self) -> Micros {
        self.rng.gen_range(50 * MS..600 * MS)
    }

    /// A one-way network delay: mostly short, sometimes long.
    fn delay(&mut self) -> Micros {
        if self.rng.gen_bool(0.05) {
            self.rng.gen_range(10 * MS..100 * MS)
        } else {
            self.rng.gen_range(100..3 * MS)
        }
    }

    fn config(&self) -> (u64, &RangeConfig) {
        let (e, rc) = self.configs.iter().next_back().expect("a configuration");
        (*e, rc)
    }

    /// Runs to the end; returns what the checks found.
    pub fn run(mut self) -> RunReport {
        let mut settle_at = None;
        while let Some(Reverse((t, id))) = self.queue.pop() {
            self.now = t;
            if settle_at.is_some_and(|s| t > s) {
                break;
            }
            let Some(ev) = self.events.remove(&id) else { continue };
            self.steps += 1;
            if self.cfg.trace {
                eprintln!("{:>9} {ev:?}", self.now);
            }
            self.handle(ev);
            if settle_at.is_none() && self.clients.iter().all(|c| c.ops_left == 0 && c.current.is_none()) {
                // Faults stop; cut links reconnect and crashed nodes come back as scheduled.
                self.faults_on = false;
                settle_at = Some(self.now + SETTLE);
            }
        }
        self.final_checks();
        let stats = Stats {
            ops: self.history.len(),
            answered: self.history.iter().filter(|o| o.ret.is_some()).count(),
            events: self.steps,
            crashes: self.crashes,
            cuts: self.cuts,
            epochs: self.config().0,
            sim_ms: self.now / MS,
            max_wait_ms: self.history.iter().filter_map(|o| Some(o.ret?.0 - o.call)).max().unwrap_or(0) / MS,
            unanswered: self.history.iter().filter(|o| o.ret.is_none()).count(),
        };
        RunReport { violations: self.violations, stats }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver { from, to, conn, msg } => {
                if self.links.get(&(from, to)).is_some_and(|l| l.conn == conn) {
                    self.step(to, Event::Chain { from, msg });
                }
            }
            Ev::Request { node, client, tag, req } => self.on_request(node, client, tag, req),
            Ev::Answer { client, tag, answer } => self.on_answer(client, tag, answer),
            Ev::ClientSend { client } => self.send_request(client),
            Ev::NodeBack { node } => {
                let n = self.nodes.get_mut(&node).expect("node");
                n.alive = true;
                let life = n.life;
                self.at(TICK_INTERVAL, Ev::Tick { node, life });
            }
            Ev::Install { node, epoch } => self.on_install(node, epoch),
            Ev::Connected { from, to, conn } => self.on_connected(from, to, conn),
            Ev::Tick { node, life } => {
                if self.nodes.get(&node).is_some_and(|n| n.alive && n.life == life) {
                    self.step(node, Event::Tick);
                    self.report_tail_ready(node);
                    self.at(TICK_INTERVAL, Ev::Tick { node, life });
                }
            }
            Ev::ClientNext { client } => self.client_next(client),
            Ev::ClientTimeout { client, attempt } => {
                let c = &self.clients[client as usize];
                if c.current.as_ref().is_some_and(|(_, _, a)| *a == attempt) {
                    self.retry(client, 0);
                }
            }
            Ev::Failed { node } => self.manager_failed(node),
            Ev::Restarted { node } => self.manager_restarted(node),
            Ev::SyncDone { node } => self.manager_sync_done(node),
            Ev::TailReady { node } => self.manager_tail_ready(node),
            Ev::Fault => self.fault(),
        }
    }

    /// Feeds `event` to `node`'s replica and carries out what it asks.
    fn step(&mut self, node: NodeId, event: Event) {
        let Some(n) = self.nodes.get_mut(&node).filter(|n| n.alive) else { return };
        let life = n.life;
        let Some(replica) = n.replica.as_mut() else { return };
        let before = replica.store().max_seq();
        let actions = replica.step(event);
        let (max_seq, acked) = (replica.store().max_seq(), replica.acked());
        if replica.route().is_tail() {
            // Stored at the tail: committed.
            self.committed.extend(replica.store().applied_after(before));
        }
        let high = self.high.entry((node, life)).or_default();
        if max_seq < high.0 || acked < high.1 {
            let msg = format!("node {node}: seq went back ({:?} -> {:?})", high, (max_seq, acked));
            self.violations.push(msg);
        }
        *high = (max_seq, acked);
        for a in actions {
            self.act(node, a);
        }
    }

    fn act(&mut self, node: NodeId, action: Action) {
        match action {
            Action::Send { to, msg } => {
                if let ChainMsg::Replicate { seq, origin: Some(o), .. } = &msg {
                    self.note_ordered(o.req, *seq, &o.outcome);
                }
                self.send(node, to, msg)
            }
            Action::Reply { req, result } => {
                if let Ok(outcome) = &result {
                    self.note_answered(req, outcome);
                }
                let d = self.delay();
                self.at(
                    d,
                    Ev::Answer { client: req.client as u32, tag: req.seq, answer: Answer::Update(result) },
                );
            }
            Action::GetReply { token, result } => {
                let (client, tag) = ((token >> 32) as u32, token & u32::MAX as u64);
                let d = self.delay();
                self.at(d, Ev::Answer { client, tag, answer: Answer::Get(result) });
            }
            Action::Committed { .. } => {}
            Action::SyncDone => {
                let d = self.delay();
                self.at(d, Ev::SyncDone { node });
            }
        }
    }

    /// Every seq a request was ordered at (a head that fails before forwarding loses its
    /// ordering, and the retry is ordered anew: only two applied orderings are a fault).
    fn note_ordered(&mut self, req: ReqId, seq: u64, outcome: &Outcome) {
        let seqs = self.ordered.entry(req).or_default();
        if !seqs.iter().any(|(s, _)| *s == seq) {
            seqs.push((seq, outcome.clone()));
        }
    }

    /// Every answer to one request must be the same.
    fn note_answered(&mut self, req: ReqId, outcome: &Outcome) {
        let first = self.answered.entry(req).or_insert_with(|| outcome.clone()).clone();
        if first != *outcome {
            self.violations.push(format!("{DEDUP_LOST}: {req:?} answered {first:?}, then {outcome:?}"));
        }
    }

    fn send(&mut self, from: NodeId, to: NodeId, msg: ChainMsg) {
        let delay = self.delay();
        let now = self.now;
        let link = self.links.entry((from, to)).or_default();
        if let Some(waiting) = link.down.as_mut() {
            waiting.push(msg);
            return;
        }
        let arrival = (now + delay).max(link.last_arrival);
        link.last_arrival = arrival;
        let conn = link.conn;
        self.at(arrival - now, Ev::Deliver { from, to, conn, msg });
    }

    /// Drops what is in flight between `a` and `b`; each side reconnects a little later.
    fn cut(&mut self, a: NodeId, b: NodeId) {
        for (from, to) in [(a, b), (b, a)] {
            let link = self.links.entry((from, to)).or_default();
            link.conn += 1;
            link.down = Some(Vec::new());
            let conn = link.conn;
            let d = self.rng.gen_range(MS..50 * MS);
            self.at(d, Ev::Connected { from, to, conn });
        }
    }

    fn on_connected(&mut self, from: NodeId, to: NodeId, conn: u64) {
        let Some(link) = self.links.get_mut(&(from, to)).filter(|l| l.conn == conn) else { return };
        let waiting = link.down.take().unwrap_or_default();
        link.last_arrival = self.now;
        self.step(from, Event::Connected { peer: to });
        for msg in waiting {
            self.send(from, to, msg);
        }
    }

    fn on_install(&mut self, node: NodeId, epoch: u64) {
        let Some(rc) = self.configs.get(&epoch).cloned() else { return };
        let Some(n) = self.nodes.get_mut(&node).filter(|n| n.alive) else { return };
        let route = Route { epoch, me: node, rc };
        match n.replica.as_ref() {
            Some(r) if r.route().epoch >= epoch => {}
            Some(_) => self.step(node, Event::Install(route)),
            None if route.rc.path().any(|m| m == node) => {
                let replica = self.new_replica(route);
                if let Some(n) = self.nodes.get_mut(&node) {
                    n.replica = Some(replica);
                }
            }
            None => {}
        }
    }

    /// The manager pushes a new configuration to every node, each over its own connection.
    fn publish(&mut self, rc: RangeConfig) {
        let epoch = self.config().0 + 1;
        if self.cfg.trace {
            let (chain, syncing, unproven) = (&rc.chain, &rc.syncing, rc.unproven_tail);
            eprintln!(
                "{:>9} config {epoch}: chain {chain:?} syncing {syncing:?} unproven tail {unproven:?}",
                self.now
            );
        }
        self.configs.insert(epoch, rc);
        let nodes: Vec<NodeId> = self.nodes.keys().copied().collect();
        for node in nodes {
            let d = self.rng.gen_range(100..100 * MS);
            let arrival = (self.now + d).max(self.install_arrival.get(&node).copied().unwrap_or(0));
            self.install_arrival.insert(node, arrival);
            self.at(arrival - self.now, Ev::Install { node, epoch });
        }
    }

    /// As the back-end's tick: the range's unproven tail that caught up says so, each tick.
    fn report_tail_ready(&mut self, node: NodeId) {
        let ready =
            self.nodes.get(&node).and_then(|n| n.replica.as_ref()).is_some_and(|r| r.reports_tail_ready());
        if ready {
            let d = self.delay();
            self.at(d, Ev::TailReady { node });
        }
    }

    /// The manager drops a failed node from the chain — never the last proven one (as
    /// `manager::state::fail_node`), which `crash` never picks: the simulator's crashes lose
    /// the node's data, which no chain survives for its last copy.
    fn manager_failed(&mut self, node: NodeId) {
        let mut rc = self.config().1.clone();
        if !rc.path().any(|m| m == node) {
            return;
        }
        assert!(
            proven(&rc).any(|m| m != node),
            "the simulator never fails a range's last proven replica: {rc:?}"
        );
        rc.chain.retain(|m| *m != node);
        rc.syncing.retain(|m| *m != node);
        if rc.unproven_tail == Some(node) {
            rc.unproven_tail = None;
        }
        self.publish(rc);
    }

    /// The range's unproven tail holds everything acknowledged: it is a copy from now on (as
    /// `manager::state::tail_ready`). A report may repeat or predate a newer configuration.
    fn manager_tail_ready(&mut self, node: NodeId) {
        let mut rc = self.config().1.clone();
        if rc.unproven_tail != Some(node) || rc.tail() != Some(node) {
            return;
        }
        rc.unproven_tail = None;
        self.publish(rc);
    }

    fn manager_restarted(&mut self, node: NodeId) {
        let mut rc = self.config().1.clone();
        if rc.path().any(|m| m == node) || !self.nodes[&node].alive {
            return;
        }
        // One replica syncs at a time (its source is the tail), and not from an unproven tail
        // (as `manager::state`): the others wait their turn.
        if !rc.syncing.is_empty() || rc.unproven_tail.is_some() {
            self.at(200 * MS, Ev::Restarted { node });
            return;
        }
        rc.syncing.push(node);
        self.publish(rc);
    }

    /// A syncing replica has everything its source had: it joins the chain as tail (it serves
    /// gets only once its predecessor confirms, `CaughtUp`), unproven until it reports
    /// `TailReady`. Its report may predate a newer configuration; it is not repeated, so it
    /// counts while the node is still syncing.
    fn manager_sync_done(&mut self, node: NodeId) {
        let mut rc = self.config().1.clone();
        if !rc.syncing.contains(&node) {
            return;
        }
        rc.syncing.retain(|m| *m != node);
        rc.chain.push(node);
        rc.unproven_tail = Some(node);
        self.publish(rc);
    }

    fn fault(&mut self) {
        if !self.faults_on {
            return;
        }
        let nodes: Vec<NodeId> = self.nodes.keys().copied().collect();
        let roll = self.rng.gen_range(0..100);
        if roll < 45 {
            let a = nodes[self.rng.gen_range(0..nodes.len())];
            let b = nodes[self.rng.gen_range(0..nodes.len())];
            if a != b {
                self.cuts += 1;
                self.cut(a, b);
            }
        } else if roll < 75 && self.crashes < self.cfg.crashes_max {
            let node = nodes[self.rng.gen_range(0..nodes.len())];
            self.crash(node);
        }
        let gap = self.fault_gap();
        self.at(gap, Ev::Fault);
    }

    /// Crashes `node` if the range keeps a live proven replica without it (one known to hold
    /// every acknowledged update: not an unproven tail).
    fn crash(&mut self, node: NodeId) {
        let (_, rc) = self.config();
        let others = proven(rc).filter(|m| *m != node && self.nodes[m].alive).count();
        if !self.nodes[&node].alive || others == 0 {
            return;
        }
        self.crashes += 1;
        let n = self.nodes.get_mut(&node).expect("node");
        n.alive = false;
        n.life += 1;
        n.replica = None;
        let peers: Vec<NodeId> = self.nodes.keys().copied().filter(|m| *m != node).collect();
        for p in peers {
            for key in [(node, p), (p, node)] {
                let link = self.links.entry(key).or_default();
                link.conn += 1;
                link.down = None;
            }
        }
        let detect = self.rng.gen_range(50 * MS..500 * MS);
        self.at(detect, Ev::Failed { node });
        let back = detect + self.rng.gen_range(100 * MS..2_000 * MS);
        self.at(back, Ev::NodeBack { node });
        self.at(back + MS, Ev::Restarted { node });
    }

    // ---- clients ----

    fn client_next(&mut self, client: u32) {
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
        self.clients[client as usize].current = Some((index, req, 0));
        self.send_request(client);
    }

    fn send_request(&mut self, client: u32) {
        let Some((index, req, attempt)) = self.clients[client as usize].current.clone() else { return };
        let (_, rc) = self.config();
        let node = match req {
            Req::Update { .. } => rc.head(),
            Req::Get { .. } => rc.tail(),
        };
        let Some(node) = node else { return };
        let d = self.delay();
        self.at(d, Ev::Request { node, client, tag: index as u64, req });
        self.at(CLIENT_TIMEOUT, Ev::ClientTimeout { client, attempt });
    }

    fn retry(&mut self, client: u32, backoff: Micros) {
        let c = &mut self.clients[client as usize];
        let Some((index, req, attempt)) = c.current.take() else { return };
        if attempt + 1 >= CLIENT_ATTEMPTS_MAX {
            // Given up: the operation's outcome stays unknown in the history.
            let d = self.rng.gen_range(0..5 * MS);
            self.at(d, Ev::ClientNext { client });
            return;
        }
        c.current = Some((index, req, attempt + 1));
        if backoff == 0 {
            self.send_request(client);
        } else {
            self.at(backoff, Ev::ClientSend { client });
        }
    }

    fn on_request(&mut self, node: NodeId, client: u32, tag: u64, req: Req) {
        let now = (self.now / 1_000_000) as u32;
        let event = match req {
            Req::Update { req, update } => Event::Update(ClientUpdate {
                req,
                update,
                reply_to: None,
                now,
                now_micros: self.now,
                flush_at: 0,
                bulk_copy_pending: false,
            }),
            Req::Get { key } => Event::Get { token: ((client as u64) << 32) | tag, key, now },
        };
        let served = self.nodes.get(&node).is_some_and(|n| n.alive && n.replica.is_some());
        if served {
            self.step(node, event);
        }
    }

    fn on_answer(&mut self, client: u32, tag: u64, answer: Answer) {
        let c = &mut self.clients[client as usize];
        let Some((index, req, _)) = c.current.as_ref() else { return };
        let current = match req {
            Req::Update { req, .. } => req.seq,
            Req::Get { .. } => *index as u64,
        };
        if current != tag {
            return;
        }
        let index = *index;
        let key = self.history[index].key;
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

    // ---- checks ----

    fn final_checks(&mut self) {
        let (_, rc) = self.config();
        let rc = rc.clone();
        let live: Vec<&Replica<MemStore>> =
            rc.chain.iter().filter_map(|n| self.nodes.get(n).filter(|n| n.alive)?.replica.as_ref()).collect();
        let mut problems = Vec::new();
        if let Some(first) = live.first() {
            let contents: Vec<(&Vec<u8>, &(u64, ReplEffect))> = first.store().contents().collect();
            for r in &live[1..] {
                if r.store().contents().collect::<Vec<_>>() != contents {
                    problems.push(format!(
                        "replicas {} and {} differ after settling",
                        first.route().me,
                        r.route().me
                    ));
                }
            }
        }
        // In request order: a seed's report must replay exactly.
        let mut ordered: Vec<_> = self.ordered.iter().collect();
        ordered.sort_by_key(|(r, _)| (r.client, r.seq));
        for (req, seqs) in ordered {
            let committed: Vec<&(u64, Outcome)> =
                seqs.iter().filter(|(s, _)| self.committed.contains(s)).collect();
            if committed.len() > 1 {
                problems.push(format!("{DEDUP_LOST}: {req:?} committed twice: {committed:?}"));
            }
            let answer = self.answered.get(req);
            if let (Some((seq, outcome)), Some(answer)) = (committed.first(), answer) {
                if answer != outcome {
                    problems.push(format!(
                        "{DEDUP_LOST}: {req:?} committed at seq {seq} as {outcome:?}, answered {answer:?}"
                    ));
                }
            }
        }
        for r in &live {
            if r.unacked_len() > 0 {
                problems.push(format!("node {} still has {} unacked updates", r.route().me, r.unacked_len()));
            }
            for (key, seq) in &self.acked {
                if r.store().seq_of(&key_bytes(*key)).is_none_or(|s| s < *seq) {
                    problems.push(format!("node {} lost acknowledged seq {seq} of key {key}", r.route().me));
                }
            }
        }
        // A final read of every key at the tail joins the history.
        if let Some(tail) = rc.tail().and_then(|t| self.nodes.get_mut(&t)?.replica.as_mut()) {
            for key in 0..self.cfg.keys as u32 {
                let actions = tail.step(Event::Get { token: 0, key: key_bytes(key), now: 0 });
                let item = match actions.as_slice() {
                    [Action::GetReply { result: Ok(item), .. }] => item.clone(),
                    other => {
                        problems.push(format!("the final tail refused a get: {other:?}"));
                        continue;
                    }
                };
                let value = item.and_then(|i| parse_value(&i.value));
                let at = self.now + 1;
                self.history.push(Op {
                    client: u32::MAX,
                    key,
                    kind: OpKind::Get,
                    call: at,
                    ret: Some((at, OpResult::Read(value))),
                });
            }
        }
        // Answered operations only: a client gives up after a few quick refusals too.
        for op in &self.history {
            let waited = op.ret.map_or(0, |(t, _)| t - op.call);
            if waited > WAIT_MAX {
                problems.push(format!(
                    "client {} waited {} ms for {:?} (liveness)",
                    op.client,
                    waited / MS,
                    op.kind
                ));
            }
        }
        for key in crate::check::violations(&self.history) {
            if self.cfg.trace {
                let ops: Vec<Op> = self.history.iter().filter(|o| o.key == key).cloned().collect();
                let upto = crate::check::first_failing_time(&ops);
                eprintln!("history of key {key}, fails by time {upto}:");
                for op in ops.iter().filter(|o| o.call <= upto) {
                    eprintln!("history: {op:?}");
                }
            }
            problems.push(format!("key {key}: history not linearizable"));
        }
        self.violations.extend(problems);
    }
}
