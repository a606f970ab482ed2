//! One simulated cluster for one seed: back-end nodes each holding a pure replica of every
//! range whose chain they are on, the manager's real membership state machine
//! (`fawn_kv::manager::state`), clients, and a network, on a simulated clock driven by one
//! seeded random source. Nothing here reads the real clock or spawns.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};

use fawn_kv::manager::state::LinkCuts;
use fawn_kv::replica::machine::{Action, Event, Replica};
use fawn_kv::replica::route::Route;
use fawn_kv::replica::store::ReplicaStore;
use fawn_proto::native::{ChainMsg, ClusterConfig, RangeConfig, ReplEffect, ReqId, WireError};
use fawn_proto::op::{Item, Outcome, Update};
use fawn_ring::{key_id, NodeId, Range};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::check::{Op, Value};
use crate::disk::{DiskStore, SyncPolicy};
use crate::Config;

mod checks;
mod clients;
mod frontend;
mod manager;
mod membership;
mod partition;
mod sync;

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
/// timeout and retry (1 s each) and a re-sync take well under it; a chain that leaves an
/// update unacknowledged until the client gives up takes far longer.
const WAIT_MAX: Micros = 5_000 * MS;
/// After the clients are done, faults stop and the cluster runs this long to settle.
const SETTLE: Micros = 5_000 * MS;

/// Mixed into the seed for the crash kinds' random stream.
const DISK_STREAM: u64 = 0x2545_f491_4f6c_dd1d;
/// Longest gap between two disks filling up (`Config::full_disks`).
const DISK_FULL_GAP_MAX: Micros = 3_000 * MS;
/// Mixed into the seed for the joins' and leaves' random stream.
const MEMBERSHIP_STREAM: u64 = 0x94d0_49bb_1331_11eb;
/// Mixed into the seed for the late copies' random stream (`Config::late_copies`).
const LATE_STREAM: u64 = 0xbf58_476d_1ce4_e5b9;
/// Longest a slow attempt arrives after the client's time-out on it.
const LATE_COPY_DELAY_MAX: Micros = 1_000 * MS;
/// The replicas' dedup window in the simulator (`Config::dedup_window`): longer than a client
/// retries one request (every attempt timing out) plus the latest a slow attempt arrives
/// after its time-out, as the real window is longer than any client retries.
pub const DEDUP_WINDOW: u64 =
    CLIENT_ATTEMPTS_MAX as Micros * (CLIENT_TIMEOUT + CLIENT_BACKOFF) + LATE_COPY_DELAY_MAX + 100 * MS;
/// Mixed into the seed for the partitions' random stream.
const PARTITION_STREAM: u64 = 0x9e37_79b9_7f4a_7c15;
/// Longest gap between two chances of a partition.
const PARTITION_GAP_MAX: Micros = 2_000 * MS;

/// A range by its index among every range a configuration ever had (`World::ranges`): a
/// split or merge adds ranges, and a range gone keeps its index.
type RangeIx = usize;

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
    Request(Sent),
    /// A slow update attempt arrives after the client timed out on it (`Config::late_copies`),
    /// if the connection it was sent on, to the node's `life`, still stands.
    LateCopy {
        sent: Sent,
        life: u32,
    },
    /// A node's answer arrives at a client; `tag` names the operation (an update's request
    /// seq, a get's history index).
    Answer {
        client: u32,
        tag: u64,
        answer: Answer,
        /// The attempt of the update it answers (`None`: whichever is current).
        attempt: Option<u32>,
    },
    /// A client sends its current request again after a back-off.
    ClientSend {
        client: u32,
    },
    /// A crashed node's process is back with what its disks kept, and registers with the
    /// manager.
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
    /// The next message of a node's outgoing snapshot or suffix stream of a range.
    StreamNext {
        node: NodeId,
        life: u32,
        range: RangeIx,
        snapshot: u64,
    },
    /// A node's disk fills up (`full`), or has room again (`Config::full_disks`).
    DiskFull {
        node: NodeId,
        life: u32,
        full: bool,
    },
    /// The interval sync of a node's datastores (`SyncPolicy::Interval`).
    DiskSync {
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
    /// The failure detector declares a node failed (unless it came back in the meantime:
    /// `life` is the life that ended).
    Failed {
        node: NodeId,
        life: u32,
    },
    SyncDone {
        node: NodeId,
        range: RangeIx,
    },
    /// A partition may start (drawn from the partitions' own random stream).
    PartitionStart,
    /// The partition `id`, if still in force, is noticed; or it ends.
    PartitionNoticed {
        id: u64,
    },
    Heal {
        id: u64,
    },
    TailReady {
        node: NodeId,
        range: RangeIx,
    },
    Fault,
    /// A chance of a join or a leave (`world::membership`).
    Membership,
    /// The drained head of a range marked for a split (or a `merge`) reports it.
    Drained {
        node: NodeId,
        range: RangeIx,
        merge: bool,
    },
    /// A tail's `Committed` notice arrives at the front-end (`Config::frontend_cache`).
    Committed {
        req: ReqId,
        outcome: Outcome,
        key: Vec<u8>,
    },
}

/// One attempt of a client's update as sent: where, with what floor, which attempt.
#[derive(Clone, Debug)]
struct Sent {
    node: NodeId,
    range: RangeIx,
    client: u32,
    tag: u64,
    req: Req,
    /// Through the front-end, with its `reply_to` (an update's answer is the tail's
    /// `Committed` notice).
    notice: bool,
    /// The client's floor when it sent this (`ReqId`).
    floor: u64,
    /// The client's attempt this is: its answer is taken only while the client waits for it.
    attempt: u32,
    /// The configuration it was routed by.
    epoch: u64,
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
    /// The epoch this life registered at: older configurations still in flight to it are
    /// ignored (the real back-end installs the configuration its registration returns).
    registered: u64,
    /// The newest epoch installed.
    installed: u64,
    replicas: BTreeMap<RangeIx, Replica<DiskStore>>,
    /// What a crash left on the node's disks, by range, until a replica opens it.
    kept: BTreeMap<RangeIx, DiskStore>,
    /// The disk refuses appends (new replicas' too).
    disk_full: bool,
    /// Its syncing replicas' progress (`world::sync`), by range.
    syncs: BTreeMap<RangeIx, fawn_kv::replica::sync::SyncProgress>,
    /// The snapshot or suffix stream it sends, per range (the newest request's).
    sending: BTreeMap<RangeIx, sync::Outgoing>,
}

/// What a crash takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Crash {
    /// The process dies; the host's page cache keeps every record appended.
    Process,
    /// The host dies: records not synced are lost from a random point on.
    Host,
    /// The disk is lost (or replaced): the node comes back empty.
    Disk,
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

/// What a head did with a client update in the step it arrived in (`World::on_request`).
struct Capture {
    node: NodeId,
    req: ReqId,
    /// Its answer in that step.
    answer: Option<Result<Outcome, WireError>>,
    /// Forwarded with the front-end's `reply_to`.
    forwarded: bool,
}

struct Client {
    /// The op in progress: its index in the history, request, its range and attempt.
    current: Option<(usize, Req, RangeIx, u32)>,
    /// Through the front-end: the op's `Committed` notice was waited for in vain, so its
    /// attempts go to the head without `reply_to` (the head answers them).
    notice_missed: bool,
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
    pub partitions: usize,
    pub epochs: u64,
    pub ranges: usize,
    pub joins: usize,
    pub leaves: usize,
    pub splits: usize,
    pub merges: usize,
    /// Updates the front-end asked the head for after no `Committed` notice came.
    pub notice_fallbacks: usize,
    pub sim_ms: u64,
    /// The longest an operation waited for its answer, and operations never answered.
    pub max_wait_ms: u64,
    pub unanswered: usize,
    /// Gets the front-end's cache answered (`Config::frontend_cache`).
    pub cache_hits: usize,
    /// Late copies of client attempts delivered, and those a head refused as stale (below
    /// their client's floor, forgotten).
    pub late_copies: usize,
    pub stale_refusals: usize,
    /// Records the stores' compactions dropped (`Config::compaction`).
    pub compacted: usize,
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
    configs: BTreeMap<u64, ClusterConfig>,
    /// The link cuts the manager believes in.
    cuts: LinkCuts,
    /// The partition in force, partitions so far, and their random stream.
    partition: Option<partition::Partition>,
    partitions: usize,
    prng: SmallRng,
    /// The crash kinds' random stream (`Config::disks`).
    drng: SmallRng,
    /// The late copies' random stream (`Config::late_copies`), copies delivered and refused.
    lrng: SmallRng,
    late_copies: usize,
    stale_refusals: usize,
    /// Records the stores' compactions dropped.
    compacted: usize,
    /// The joins' and leaves' random stream, and how many so far.
    mrng: SmallRng,
    joins: usize,
    leaves: usize,
    splits: usize,
    merges: usize,
    /// Drained heads that reported it, by node, range and epoch (`world::membership`).
    drain_reported: HashSet<(NodeId, RangeIx, u64)>,
    /// Updates a head forwarded with the front-end's `reply_to`: it does not answer them (the
    /// tail's `Committed` does) until an attempt without `reply_to` arrives.
    silenced: HashSet<(NodeId, ReqId)>,
    /// What the head did with a client update in the step it arrived in.
    capture: Option<Capture>,
    notice_fallbacks: usize,
    /// Every range a configuration ever had, by index (see `RangeIx`).
    ranges: Vec<Range>,
    /// Manager -> node is one connection per node: installs arrive in epoch order.
    install_arrival: HashMap<NodeId, Micros>,
    clients: Vec<Client>,
    history: Vec<Op>,
    /// Seqs of acknowledged stores and deletes, by key.
    acked: Vec<(u32, u64)>,
    crashes: usize,
    cuts_made: usize,
    faults_on: bool,
    /// Per node, range and life: highest max_seq and acked seen (they must never go back).
    high: HashMap<(NodeId, RangeIx, u32), (u64, u64)>,
    violations: Vec<String>,
    steps: u64,
    /// Snapshot and suffix streams started (their ids).
    snapshots: u64,
    /// The highest seq of a delete any replica applied, by key: a key without any record is
    /// one deleted, whose tombstone compaction dropped.
    applied_deletes: HashMap<Vec<u8>, u64>,
    /// The (range, seq) each client request was ordered at, and the answer its client took.
    ordered: HashMap<ReqId, Vec<(RangeIx, u64, Outcome)>>,
    answered: HashMap<ReqId, Outcome>,
    /// The latest attempt of each update request that reached each node: a node's answer
    /// answers that attempt.
    attempt_at: HashMap<(NodeId, ReqId), u32>,
    /// (range, seq) stored at the tail of their time.
    committed: HashSet<(RangeIx, u64)>,
    /// The front-end with its query cache, if the run has one (`Config::frontend_cache`).
    frontend: Option<frontend::Frontend>,
}

/// How a violation caused by a retried request decided again starts: a replica that got the
/// request's update by a resend from the log (or, in the real back-end, by a snapshot) has no
/// dedup entry for it, and decides its retry again once it heads the chain.
pub const DEDUP_LOST: &str = "retry decided again";

fn key_bytes(key: u32) -> Vec<u8> {
    format!("k{key}").into_bytes()
}

/// The chain members known to hold every acknowledged update.
fn proven(rc: &RangeConfig) -> impl Iterator<Item = NodeId> + '_ {
    rc.chain.iter().copied().filter(|m| Some(*m) != rc.unproven_tail)
}

impl World {
    pub fn new(seed: u64, cfg: Config) -> World {
        let mut w = World {
            rng: SmallRng::seed_from_u64(seed),
            now: 0,
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            next_event: 0,
            nodes: BTreeMap::new(),
            links: HashMap::new(),
            configs: BTreeMap::new(),
            cuts: LinkCuts::default(),
            partition: None,
            partitions: 0,
            prng: SmallRng::seed_from_u64(seed ^ PARTITION_STREAM),
            drng: SmallRng::seed_from_u64(seed ^ DISK_STREAM),
            mrng: SmallRng::seed_from_u64(seed ^ MEMBERSHIP_STREAM),
            lrng: SmallRng::seed_from_u64(seed ^ LATE_STREAM),
            late_copies: 0,
            stale_refusals: 0,
            compacted: 0,
            joins: 0,
            leaves: 0,
            splits: 0,
            merges: 0,
            drain_reported: HashSet::new(),
            silenced: HashSet::new(),
            capture: None,
            notice_fallbacks: 0,
            ranges: Vec::new(),
            install_arrival: HashMap::new(),
            clients: Vec::new(),
            history: Vec::new(),
            acked: Vec::new(),
            crashes: 0,
            cuts_made: 0,
            faults_on: true,
            high: HashMap::new(),
            violations: Vec::new(),
            steps: 0,
            ordered: HashMap::new(),
            answered: HashMap::new(),
            attempt_at: HashMap::new(),
            committed: HashSet::new(),
            snapshots: 0,
            applied_deletes: HashMap::new(),
            frontend: cfg.frontend_cache.then(|| frontend::Frontend::new(&cfg)),
            cfg,
        };
        let formed = w.form();
        w.ranges = formed.ranges.iter().map(|rc| rc.range).collect();
        let epoch = formed.epoch;
        w.configs.insert(epoch, formed);
        for n in 1..=w.cfg.nodes as NodeId {
            w.nodes.insert(
                n,
                Node {
                    life: 0,
                    alive: true,
                    registered: epoch,
                    installed: 0,
                    replicas: BTreeMap::new(),
                    kept: BTreeMap::new(),
                    disk_full: false,
                    syncs: BTreeMap::new(),
                    sending: BTreeMap::new(),
                },
            );
            w.install_now(n, epoch);
            w.at(TICK_INTERVAL, Ev::Tick { node: n, life: 0 });
            w.schedule_disk_sync(n, 0);
        }
        for c in 0..w.cfg.clients {
            w.clients.push(Client::new(w.cfg.ops_per_client));
            let start = w.rng.gen_range(0..10 * MS);
            w.at(start, Ev::ClientNext { client: c as u32 });
        }
        let first = w.fault_gap();
        w.at(first, Ev::Fault);
        if w.cfg.disks && w.cfg.full_disks {
            let first = w.drng.gen_range(100 * MS..DISK_FULL_GAP_MAX);
            w.at(first, Ev::DiskFull { node: 0, life: 0, full: true });
        }
        if w.cfg.partitions_max > 0 {
            let first = w.prng.gen_range(100 * MS..PARTITION_GAP_MAX);
            w.at(first, Ev::PartitionStart);
        }
        if w.cfg.joins_max + w.cfg.leaves_max > 0 {
            let first = w.mrng.gen_range(100 * MS..membership::MEMBERSHIP_GAP_MAX);
            w.at(first, Ev::Membership);
        }
        w
    }

    pub(super) fn empty_store(&self) -> DiskStore {
        DiskStore::new(self.cfg.sync).keeping_outcomes(!self.cfg.volatile_outcomes)
    }

    pub(super) fn open_replica(&self, store: DiskStore, route: Route) -> Replica<DiskStore> {
        let r = Replica::new(store, route).with_dedup_window(self.cfg.dedup_window).with_shell_sync();
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

    /// The manager's current configuration.
    fn config(&self) -> &ClusterConfig {
        self.configs.values().next_back().expect("a configuration")
    }

    /// The current configuration of range `ix`, unless it was split or merged away.
    fn range_config(&self, ix: RangeIx) -> Option<&RangeConfig> {
        let range = self.ranges[ix];
        self.config().ranges.iter().find(|rc| rc.range == range)
    }

    fn range_ix(&self, range: &Range) -> Option<RangeIx> {
        self.ranges.iter().position(|r| r == range)
    }

    /// The index of `range`, a new one if no configuration had it before.
    fn note_range(&mut self, range: Range) -> RangeIx {
        self.range_ix(&range).unwrap_or_else(|| {
            self.ranges.push(range);
            self.ranges.len() - 1
        })
    }

    /// The range of the current configuration that holds `key`.
    fn range_of_key(&self, key: u32) -> RangeIx {
        let id = key_id(&key_bytes(key));
        let rc =
            self.config().ranges.iter().find(|rc| rc.range.contains(id)).expect("the ranges cover the ring");
        self.range_ix(&rc.range).expect("every configuration's ranges are noted")
    }

    /// The ranges `node` holds a replica of, in index order.
    fn held(&self, node: NodeId) -> Vec<RangeIx> {
        self.nodes.get(&node).map(|n| n.replicas.keys().copied().collect()).unwrap_or_default()
    }

    /// Runs to the end; returns what the checks found.
    pub fn run(mut self) -> RunReport {
        let mut settle_at = None;
        while let Some(Reverse((t, id))) = self.queue.pop() {
            self.now = t;
            if let Some(fe) = &self.frontend {
                fe.set_now(t);
            }
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
            cuts: self.cuts_made,
            partitions: self.partitions,
            epochs: self.config().epoch,
            ranges: self.config().ranges.len(),
            joins: self.joins,
            leaves: self.leaves,
            splits: self.splits,
            merges: self.merges,
            notice_fallbacks: self.notice_fallbacks,
            sim_ms: self.now / MS,
            max_wait_ms: self.history.iter().filter_map(|o| Some(o.ret?.0 - o.call)).max().unwrap_or(0) / MS,
            unanswered: self.history.iter().filter(|o| o.ret.is_none()).count(),
            cache_hits: self.frontend.as_ref().map_or(0, |fe| fe.hits),
            late_copies: self.late_copies,
            stale_refusals: self.stale_refusals,
            compacted: self.compacted,
        };
        RunReport { violations: self.violations, stats }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver { from, to, conn, msg } => {
                if self.links.get(&(from, to)).is_some_and(|l| l.conn == conn) {
                    if let Some(ix) = chain_msg_range(&msg).and_then(|r| self.range_ix(&r)) {
                        // A `Resend` is handled once caught up, an update by the older
                        // configuration first (as the back-end does).
                        let ahead = self.catch_up_needed(to, &msg);
                        let resend = matches!(msg, ChainMsg::Resend { .. });
                        if ahead && resend {
                            let epoch = self.config().epoch;
                            self.install_now(to, epoch);
                        }
                        self.deliver_chain(to, ix, from, msg);
                        if ahead && !resend {
                            self.catch_up(to, from, ix);
                        }
                    }
                }
            }
            Ev::Request(sent) => {
                self.on_request(sent);
            }
            Ev::LateCopy { sent, life } => self.on_late_copy(sent, life),
            Ev::Answer { client, tag, answer, attempt } => self.on_answer(client, tag, answer, attempt),
            Ev::Committed { req, outcome, key } => self.frontend_committed(req, outcome, key),
            Ev::ClientSend { client } => self.send_request(client),
            Ev::NodeBack { node } => self.node_back(node),
            Ev::Install { node, epoch } => self.on_install(node, epoch),
            Ev::Connected { from, to, conn } => self.on_connected(from, to, conn),
            Ev::Tick { node, life } => {
                if self.nodes.get(&node).is_some_and(|n| n.alive && n.life == life) {
                    for ix in self.held(node) {
                        self.tick_sync(node, ix);
                        self.step(node, ix, Event::Tick);
                        self.report_tail_ready(node, ix);
                        self.report_drained(node, ix, true);
                    }
                    self.at(TICK_INTERVAL, Ev::Tick { node, life });
                }
            }
            Ev::StreamNext { node, life, range, snapshot } => self.stream_next(node, life, range, snapshot),
            Ev::DiskSync { node, life } => {
                let compaction = self.cfg.compaction;
                if let Some(n) = self.nodes.get_mut(&node).filter(|n| n.alive && n.life == life) {
                    for r in n.replicas.values_mut() {
                        // As the back-end gives its datastore the replica's tombstone watermark.
                        let watermark = r.tombstone_watermark();
                        r.store_mut().sync();
                        if compaction {
                            self.compacted += r.store_mut().compact(watermark);
                        }
                    }
                    self.schedule_disk_sync(node, life);
                }
            }
            Ev::DiskFull { node, life, full } => self.disk_full(node, life, full),
            Ev::ClientNext { client } => self.client_next(client),
            Ev::ClientTimeout { client, attempt } => {
                let c = &self.clients[client as usize];
                if c.current.as_ref().is_some_and(|(_, _, _, a)| *a == attempt) {
                    self.on_timeout(client);
                }
            }
            Ev::Failed { node, life } => {
                // A node back already registered again (failed first if it was still in a
                // chain): the detector saw its heartbeats resume.
                if self.nodes.get(&node).is_some_and(|n| !n.alive && n.life == life) {
                    self.manager_failed(node);
                }
            }
            // As the back-end, which reports each tick while its replica syncs with its copy
            // done: a report the node no longer makes (the manager dropped the sync, or made
            // the node sync the range anew) is not sent late.
            Ev::SyncDone { node, range } if !self.sync_done_holds(node, range) => {}
            Ev::SyncDone { node, range } if self.isolated(node) => {
                // The report is retried until it reaches the manager.
                self.at(100 * MS, Ev::SyncDone { node, range });
            }
            Ev::SyncDone { node, range } => self.manager_sync_done(node, range),
            Ev::TailReady { node, .. } if self.isolated(node) => {}
            Ev::TailReady { node, range } => self.manager_tail_ready(node, range),
            Ev::PartitionStart => {
                if self.faults_on {
                    self.start_partition();
                    let gap = self.prng.gen_range(100 * MS..PARTITION_GAP_MAX);
                    self.at(gap, Ev::PartitionStart);
                }
            }
            Ev::PartitionNoticed { id } => self.partition_noticed(id),
            Ev::Heal { id } => self.heal(id),
            Ev::Fault => self.fault(),
            Ev::Membership => self.membership_change(),
            Ev::Drained { node, .. } if self.isolated(node) => {}
            Ev::Drained { node, range, merge } => self.manager_drained(node, range, merge),
        }
    }

    /// Feeds `event` to `node`'s replica of range `ix` and carries out what it asks.
    fn step(&mut self, node: NodeId, ix: RangeIx, event: Event) {
        let Some(n) = self.nodes.get_mut(&node).filter(|n| n.alive) else { return };
        let life = n.life;
        let Some(replica) = n.replicas.get_mut(&ix) else { return };
        let before = replica.store().max_seq();
        let actions = replica.step(event);
        let (max_seq, acked) = (replica.store().max_seq(), replica.acked());
        let is_tail = replica.route().is_tail();
        for seq in replica.store().mem().applied_after(before) {
            if is_tail {
                // Stored at the tail: committed.
                self.committed.insert((ix, seq));
            }
            if let Some(u) = replica.store().record(seq).filter(|u| u.effect == ReplEffect::Delete) {
                let top = self.applied_deletes.entry(u.key).or_default();
                *top = (*top).max(seq);
            }
        }
        let high = self.high.entry((node, ix, life)).or_default();
        if max_seq < high.0 || acked < high.1 {
            let msg = format!("node {node} range {ix}: seq went back ({:?} -> {:?})", high, (max_seq, acked));
            self.violations.push(msg);
        }
        *high = (max_seq, acked);
        let reshaping = replica.route().rc.is_reshaping();
        for a in actions {
            self.act(node, ix, a);
        }
        if reshaping {
            self.report_drained(node, ix, false);
        }
    }

    fn act(&mut self, node: NodeId, ix: RangeIx, action: Action) {
        match action {
            Action::Send { to, msg } => {
                if let ChainMsg::Replicate { seq, origin: Some(o), .. } = &msg {
                    self.note_ordered(o.req, ix, *seq, &o.outcome);
                    if let Some(c) = self.capture.as_mut() {
                        if (c.node, c.req) == (node, o.req) && o.reply_to.is_some() {
                            c.forwarded = true;
                        }
                    }
                }
                self.send(node, to, msg)
            }
            Action::Reply { .. } | Action::GetReply { .. } if self.isolated(node) => {}
            Action::Reply { req, result }
                if self.capture.as_ref().is_some_and(|c| (c.node, c.req) == (node, req)) =>
            {
                if let Some(c) = self.capture.as_mut() {
                    c.answer.get_or_insert(result);
                }
            }
            // A head does not answer an update it forwarded with `reply_to`.
            Action::Reply { req, .. } if self.silenced.contains(&(node, req)) => {}
            Action::Reply { req, result } => {
                let attempt = self.attempt_at.get(&(node, req)).copied();
                let (client, tag, answer) = (req.client as u32, req.seq, Answer::Update(result));
                let d = self.delay();
                self.at(d, Ev::Answer { client, tag, answer, attempt });
            }
            Action::GetReply { token, result } => {
                let (client, tag) = ((token >> 32) as u32, token & u32::MAX as u64);
                let d = self.delay();
                self.at(d, Ev::Answer { client, tag, answer: Answer::Get(result), attempt: None });
            }
            Action::Committed { req, outcome, key, .. } => {
                if !self.isolated(node) {
                    self.send_committed(req, outcome, key);
                }
            }
            Action::SyncDone => {
                let d = self.delay();
                self.at(d, Ev::SyncDone { node, range: ix });
            }
        }
    }

    /// Every seq a request was ordered at (a head that fails before forwarding loses its
    /// ordering, and the retry is ordered anew: only two applied orderings are a fault).
    fn note_ordered(&mut self, req: ReqId, ix: RangeIx, seq: u64, outcome: &Outcome) {
        let seqs = self.ordered.entry(req).or_default();
        if !seqs.iter().any(|(r, s, _)| (*r, *s) == (ix, seq)) {
            seqs.push((ix, seq, outcome.clone()));
        }
    }

    /// Every answer a client takes for one request must be the same.
    fn note_answered(&mut self, req: ReqId, outcome: &Outcome) {
        let first = self.answered.entry(req).or_insert_with(|| outcome.clone()).clone();
        if first != *outcome {
            self.violations.push(format!("{DEDUP_LOST}: {req:?} answered {first:?}, then {outcome:?}"));
        }
    }

    fn send(&mut self, from: NodeId, to: NodeId, msg: ChainMsg) {
        if self.partitioned(from, to) {
            return;
        }
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
        for ix in self.held(from) {
            self.step(from, ix, Event::Connected { peer: to });
        }
        for msg in waiting {
            self.send(from, to, msg);
        }
    }

    /// The configuration of `epoch` reaches `node` (over its connection to the manager).
    fn on_install(&mut self, node: NodeId, epoch: u64) {
        let fresh = self.nodes.get(&node).is_some_and(|n| n.alive && epoch >= n.registered);
        let fresh = fresh && !self.isolated(node);
        if fresh {
            self.install_now(node, epoch);
        }
    }

    /// Whether `msg` is of an epoch newer than `node` installed and makes it catch up: an
    /// update (`Replicate`) or a `Resend` (as the back-end's `check_chain_epoch`).
    fn catch_up_needed(&self, node: NodeId, msg: &ChainMsg) -> bool {
        let epoch = match msg {
            ChainMsg::Replicate { epoch, .. } | ChainMsg::Resend { epoch, .. } => *epoch,
            _ => return false,
        };
        let behind = self.nodes.get(&node).is_some_and(|n| n.alive && epoch > n.installed);
        self.cfg.catch_up && behind && !self.isolated(node)
    }

    /// `node` got an update of a newer configuration than it installed, handled (dropped) by
    /// the older one: it fetches and installs the current configuration, then asks the
    /// sender for everything after what its replica holds (`Backend::resend_after_catch_up`:
    /// nothing else would send the update again if no other follows it).
    fn catch_up(&mut self, node: NodeId, from: NodeId, ix: RangeIx) {
        let epoch = self.config().epoch;
        self.install_now(node, epoch);
        self.step(node, ix, Event::AskResend { from });
    }

    /// `node` installs the configuration of `epoch`: each of its replicas takes its range's
    /// new route, and a range whose path it joined gets an empty replica.
    fn install_now(&mut self, node: NodeId, epoch: u64) {
        let Some(config) = self.configs.get(&epoch).cloned() else { return };
        // An older configuration still in flight to a node that caught up (`catch_up`).
        if self.nodes.get(&node).is_none_or(|n| n.installed > epoch) {
            return;
        }
        if self.nodes.get(&node).is_some_and(|n| n.installed < epoch) {
            self.reshape(node, &config);
            // Replicas of ranges gone from the configuration (split or merged without this
            // node, or while it was down).
            let gone: Vec<RangeIx> = self
                .held(node)
                .into_iter()
                .filter(|ix| !config.ranges.iter().any(|rc| rc.range == self.ranges[*ix]))
                .collect();
            if let Some(n) = self.nodes.get_mut(&node) {
                n.installed = epoch;
                for ix in gone {
                    n.replicas.remove(&ix);
                    self.high.remove(&(node, ix, n.life));
                }
            }
        }
        let routes: Vec<(RangeIx, Route)> = config
            .ranges
            .iter()
            .filter_map(|rc| Some((self.range_ix(&rc.range)?, Route { epoch, me: node, rc: rc.clone() })))
            .collect();
        for (ix, route) in routes {
            let Some(n) = self.nodes.get(&node) else { return };
            match n.replicas.get(&ix) {
                Some(r) if r.route().epoch >= epoch => {}
                Some(r)
                    if route.is_syncing()
                        && (!r.route().is_syncing()
                            || self.sync_source_changed(node, ix, &route)
                            || self.copy_done_across_a_gap(node, ix, &route)) =>
                {
                    // As the back-end's `install_range`: an in-sync replica made a syncing one
                    // (declared failed while running) rejoins with its records; a copy from
                    // another source starts afresh.
                    let store = (!r.route().is_syncing()).then(|| r.store().clone());
                    self.start_sync(node, ix, route, store);
                }
                Some(_) => self.step(node, ix, Event::Install(route)),
                None if route.rc.path().any(|m| m == node) => {
                    // Opened on what a crash left of its datastore; a syncing replica keeps it
                    // to ask for the suffix after it, if it is a whole replica's.
                    let kept = self.take_kept(node, &route.rc.range, route.is_syncing());
                    if route.is_syncing() {
                        self.start_sync(node, ix, route, kept);
                        continue;
                    }
                    let replica = self.open_replica(kept.unwrap_or_else(|| self.empty_store()), route);
                    if let Some(n) = self.nodes.get_mut(&node) {
                        n.replicas.insert(ix, replica);
                    }
                }
                None => {}
            }
        }
        self.settle_syncs(node);
        // A replica opened on a full disk finds it full too.
        if let Some(n) = self.nodes.get_mut(&node).filter(|n| n.disk_full) {
            for r in n.replicas.values_mut() {
                r.store_mut().set_full(true);
            }
        }
    }

    /// The manager pushes a new configuration to every node, each over its own connection.
    fn publish(&mut self, config: ClusterConfig) {
        let epoch = config.epoch;
        for rc in &config.ranges {
            self.note_range(rc.range);
        }
        self.stop_departed(&config);
        if self.cfg.trace {
            for rc in &config.ranges {
                let (chain, syncing, unproven) = (&rc.chain, &rc.syncing, rc.unproven_tail);
                let ix = self.range_ix(&rc.range);
                eprintln!(
                    "{:>9} config {epoch} range {ix:?}: chain {chain:?} syncing {syncing:?} unproven tail {unproven:?}",
                    self.now
                );
            }
        }
        self.configs.insert(epoch, config);
        let nodes: Vec<NodeId> = self.nodes.keys().copied().collect();
        for node in nodes {
            let d = self.rng.gen_range(100..100 * MS);
            let arrival = (self.now + d).max(self.install_arrival.get(&node).copied().unwrap_or(0));
            self.install_arrival.insert(node, arrival);
            self.at(arrival - self.now, Ev::Install { node, epoch });
        }
    }

    /// As the back-end's tick: the range's unproven tail that caught up says so, each tick.
    fn report_tail_ready(&mut self, node: NodeId, ix: RangeIx) {
        let ready =
            self.nodes.get(&node).and_then(|n| n.replicas.get(&ix)).is_some_and(|r| r.reports_tail_ready());
        if ready {
            let d = self.delay();
            self.at(d, Ev::TailReady { node, range: ix });
        }
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
                self.cuts_made += 1;
                self.cut(a, b);
            }
        } else if roll < 75 && self.crashes < self.cfg.crashes_max {
            let node = nodes[self.rng.gen_range(0..nodes.len())];
            self.crash(node);
        }
        let gap = self.fault_gap();
        self.at(gap, Ev::Fault);
    }

    /// Crashes `node` if every range keeps a live proven replica without it (one known to
    /// hold every acknowledged update: not an unproven tail), or if the crash keeps its log
    /// and the configuration has no other proven member in the ranges where it is the last
    /// live one (the range waits for it).
    fn crash(&mut self, node: NodeId) {
        let kind = if !self.cfg.disks {
            Crash::Disk
        } else {
            [Crash::Process, Crash::Host, Crash::Disk][self.drng.gen_range(0..3)]
        };
        let loses = kind == Crash::Disk || (kind == Crash::Host && self.cfg.sync != SyncPolicy::Always);
        let config = self.config();
        // A proven replica cut off by a partition counts for none: the failure detector may
        // drop it from the chain, leaving this node the last (see `world::partition`).
        // Chain replication with R replicas promises every acknowledged update only while a
        // range keeps a live proven replica: at most R-1 of its members may fail before
        // re-replication proves new copies, and every crash counts, since a restarted process
        // is failed out of its chains and rejoins as a syncing replica. The one exception is the
        // range's last proven member by the manager's configuration, which stays in the chain
        // however it fails: its crash is survived if it keeps its log. A member that is the
        // last live one while others the manager still counts on are down (not yet detected)
        // would be dropped when its own failure is detected, leaving the range to a replica
        // that lost its data: a schedule beyond the promise, never drawn.
        let beyond = config.ranges.iter().any(|rc| {
            let last_live =
                !proven(rc).any(|m| m != node && self.nodes[&m].alive && !self.partitioned_off(m));
            let kept_by_manager = proven(rc).all(|m| m == node);
            rc.chain.contains(&node) && last_live && (loses || !kept_by_manager)
        });
        if !self.nodes[&node].alive || beyond || self.partition.is_some() {
            return;
        }
        self.crashes += 1;
        let n = self.nodes.get_mut(&node).expect("node");
        n.alive = false;
        n.life += 1;
        let replicas = std::mem::take(&mut n.replicas);
        n.syncs.clear();
        n.sending.clear();
        let kept = match kind {
            Crash::Process => {
                replicas.into_iter().map(|(ix, r)| (ix, r.store().after_crash(u64::MAX))).collect()
            }
            Crash::Host => replicas
                .into_iter()
                .map(|(ix, r)| {
                    let survive = self.drng.gen_range(0..=r.store().max_seq());
                    (ix, r.store().after_crash(survive))
                })
                .collect(),
            Crash::Disk => BTreeMap::new(),
        };
        let n = self.nodes.get_mut(&node).expect("node");
        n.kept = kept;
        n.disk_full = false;
        // The new process has installed nothing yet.
        n.installed = 0;
        if self.cfg.trace {
            eprintln!("{:>9} crash {node}: {kind:?}", self.now);
        }
        let life = n.life;
        let peers: Vec<NodeId> = self.nodes.keys().copied().filter(|m| *m != node).collect();
        for p in peers {
            for key in [(node, p), (p, node)] {
                let link = self.links.entry(key).or_default();
                link.conn += 1;
                link.down = None;
            }
        }
        let detect = self.rng.gen_range(50 * MS..500 * MS);
        self.at(detect, Ev::Failed { node, life });
        // Mostly after the failure detector noticed, sometimes before.
        let back = self.rng.gen_range(100 * MS..2_000 * MS);
        self.at(back, Ev::NodeBack { node });
    }

    /// Node 0 names the next chance of a disk filling up: a random node's, for a while.
    fn disk_full(&mut self, node: NodeId, life: u32, full: bool) {
        if node == 0 {
            if !self.faults_on {
                return;
            }
            let nodes: Vec<NodeId> = self.nodes.keys().copied().collect();
            let node = nodes[self.drng.gen_range(0..nodes.len())];
            let life = self.nodes[&node].life;
            self.disk_full(node, life, true);
            let lasts = self.drng.gen_range(50 * MS..1_000 * MS);
            self.at(lasts, Ev::DiskFull { node, life, full: false });
            let next = self.drng.gen_range(100 * MS..DISK_FULL_GAP_MAX);
            self.at(next, Ev::DiskFull { node: 0, life: 0, full: true });
            return;
        }
        if self.cfg.trace {
            eprintln!("{:>9} disk of {node} full: {full}", self.now);
        }
        if let Some(n) = self.nodes.get_mut(&node).filter(|n| n.alive && n.life == life) {
            n.disk_full = full;
            for r in n.replicas.values_mut() {
                r.store_mut().set_full(full);
            }
        }
    }

    fn schedule_disk_sync(&mut self, node: NodeId, life: u32) {
        if let SyncPolicy::Interval(every) = self.cfg.sync {
            self.at(every, Ev::DiskSync { node, life });
        }
    }

    /// A crashed node's process is back: it registers (the manager fails it first if it is
    /// still alive in a chain: a new process lost its request outcomes, and maybe the end of
    /// its logs), and installs the configuration that returns, opening its replicas on what
    /// its disks kept.
    fn node_back(&mut self, node: NodeId) {
        // Not if it left meanwhile (a crashed leaver the manager let go: `stop_departed`).
        let Some(n) = self.nodes.get_mut(&node) else { return };
        n.alive = true;
        let life = n.life;
        self.manager_registered(node);
        self.schedule_disk_sync(node, life);
        let epoch = self.config().epoch;
        if let Some(n) = self.nodes.get_mut(&node) {
            n.registered = epoch;
        }
        self.install_now(node, epoch);
        self.at(TICK_INTERVAL, Ev::Tick { node, life });
    }
}

/// The range a chain message is about.
fn chain_msg_range(msg: &ChainMsg) -> Option<Range> {
    match msg {
        ChainMsg::Hello { .. } => None,
        ChainMsg::SnapshotBatch { range, .. }
        | ChainMsg::SyncRequest { range, .. }
        | ChainMsg::SnapshotBegin { range, .. }
        | ChainMsg::SnapshotEnd { range, .. }
        | ChainMsg::CaughtUp { range, .. }
        | ChainMsg::Replicate { range, .. }
        | ChainMsg::Resend { range, .. }
        | ChainMsg::Ack { range, .. }
        | ChainMsg::SuffixSyncRequest { range, .. }
        | ChainMsg::SuffixBegin { range, .. }
        | ChainMsg::SuffixRefused { range, .. }
        | ChainMsg::Outcomes { range, .. } => Some(*range),
    }
}
