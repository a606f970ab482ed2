//! The native protocol: length-prefixed, versioned binary frames over TCP.
//!
//! ```text
//! +----------------+---------+------------------+---------------------------+
//! | length: u32 LE | version | request_id: u64 LE | body: bincode(Message)  |
//! +----------------+---------+------------------+---------------------------+
//!   bytes after the length field: 1 + 8 + body
//! ```
//! Many requests may be in flight per connection; responses carry the request id of the
//! request they answer and may arrive in any order. Chain messages use request id 0.
//! See docs/PROTOCOL.md.

use bincode::Options;
use serde::{Deserialize, Serialize};

use crate::op::{Item, Outcome, Update};
use fawn_ring::{KeyId, NodeId, Range};

/// Version byte of every frame. A peer receiving another version closes the connection.
/// 2: snapshot streams carry stream ids and batch indexes (`SnapshotBegin`, `SnapshotBatch`,
/// `SnapshotEnd` changed fields), so version-1 nodes cannot join a version-2 cluster.
/// 3: ranges split on join (`RangeConfig::splitting`, `Request::SplitReady`).
/// 4: ranges merge after a leave (`RangeConfig::merging`, `Request::MergeReady`).
/// 5: front-ends heartbeat the back-ends and report to the manager (`Request::Heartbeats`).
/// 6: `Request::Committed` names the key; `Request::RegisterBackend` says whether the
/// back-end's logs are complete.
/// 7: `ChainMsg::Outcomes` carries request outcomes with resent and copied updates.
/// 8: `ClusterConfig::wedges` maps each wedge to the front-end serving it (front-end
/// failover); the manager answers a front-end's `Heartbeats` with the configuration;
/// `RangeConfig::unproven_tail` (a new tail is a copy only once it reports `TailReady`);
/// items and replicated puts carry memcached's access marks (`state`), with the `Claim`,
/// `Invalidate` and `CasStale` mutations and their outcomes.
/// 9: `ClusterConfig::cluster_id`, carried in `ChainMsg::Hello`.
/// 10: `Request::FrontendRefused` (a peer front-end refused a connection).
/// 11: `Request::Committed` carries the notices of many updates.
/// 12: leases carry the manager group's term: `Request::Renew`, answered (like a front-end's
/// `Heartbeats`) with `Response::Lease`.
/// 13: the head answers an `Update` sent with `reply_to` only on failure: the tail's
/// `Committed` is its one success message.
/// 14: `Request::Committed` is one-way: the front-end sends no response. `Request::Update`
/// and `Origin` carry the client's `floor` (its lowest request id that may still be sent),
/// below which replicas forget the client's outcomes.
/// 15: `ChainMsg::SnapshotEnd` carries the source's `dropped_seq_max`, which the copy takes.
pub const PROTOCOL_VERSION: u8 = 15;
/// Largest frame body accepted (a 1 MiB value plus key and headers fits many times over).
pub const FRAME_BYTES_MAX: usize = 8 << 20;
/// Bytes before the body: length (4) + version (1) + request id (8).
pub const FRAME_HEADER_BYTES: usize = 13;
/// Most digest entries returned in one `RangeDigest` page.
pub const DIGEST_PAGE_ENTRIES_MAX: u32 = 10_000;
/// Most notices one `Request::Committed` carries (a tail sends more as several requests).
pub const COMMITTED_NOTICES_MAX: usize = 1024;

/// Configuration epoch: bumped by the manager on every membership or config change.
pub type Epoch = u64;

/// Identifies one client operation so that a retried update is applied once. A client's
/// floor is the lowest seq it may still send (an update in flight, or one whose stale
/// attempts may still be on their way): it only rises, and outcomes below it are never asked
/// for again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReqId {
    /// Random per client process.
    pub client: u64,
    /// Increasing per client.
    pub seq: u64,
}

/// One update the tail committed (`Request::Committed`). `key` lets a front-end that stopped
/// waiting for the update (or restarted since) invalidate its cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommittedNotice {
    pub req: ReqId,
    pub outcome: Outcome,
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
}

/// Everything that travels in a frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    Request(Request),
    Response(Response),
    Chain(ChainMsg),
}

/// Requests from clients, front-ends, back-ends and tools.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Read at the tail (to a back-end) or via the owning front-end.
    Get {
        epoch: Epoch,
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        forwarded: bool,
    },
    /// An update to the head (to a back-end) or via the owning front-end. `reply_to`: the
    /// native address of the front-end waiting for it; the tail tells it `Committed` directly,
    /// and a head that forwarded the update with it to a front-end of its configuration does
    /// not answer success (it still answers a failure, or an outcome it knows at once). The
    /// front-end sends the update again without `reply_to` if no notice comes in time.
    /// `floor`: no request of `req.client` with a lower seq will reach any head again (0: none
    /// known), so replicas may forget its outcomes below it (see `ReqId`).
    Update { epoch: Epoch, req: ReqId, update: Update, forwarded: bool, reply_to: Option<String>, floor: u64 },
    /// Cluster-wide flush (to a front-end, which asks the manager).
    FlushAll { at_unix: u32 },
    /// Live item counts: of the ranges this back-end is tail of, or of the whole cluster
    /// when sent to a front-end.
    ItemStats,
    /// The current cluster configuration (manager, front-end).
    GetConfig,
    /// A back-end announces itself to the manager. `logs_complete`: its datastores hold
    /// every update it acknowledged (it may resume its chain positions); false after a restart
    /// of its host under a sync policy other than `always`, when it must resync first.
    RegisterBackend { node: NodeId, addr: String, logs_complete: bool },
    /// A syncing back-end has caught up on a range (to the manager).
    SyncDone { node: NodeId, range: Range },
    /// Begin a graceful leave of a back-end (to the manager).
    Leave { node: NodeId },
    /// A front-end announces itself to the manager.
    RegisterFrontend { id: u32, native_addr: String, memcache_addr: String },
    /// The manager pushes a new configuration (back-ends, front-ends).
    Install { config: ClusterConfig },
    /// Manager: set the flush time (`flush_all`).
    SetFlush { at_micros: u64 },
    /// Health and counters of one process.
    Status,
    /// Committed contents of one range on this back-end, in key order, paged.
    RangeDigest { range: Range, after_key: Option<Vec<u8>>, limit: u32 },
    /// Liveness probe (heartbeats).
    Ping,
    /// The tail committed these updates of a front-end (tail → front-end): those one step of
    /// the tail committed, at most `COMMITTED_NOTICES_MAX`, so a batch of updates costs one
    /// request, not one each. One-way: never answered (a lost notice is covered by the
    /// front-end asking the head again).
    Committed { notices: Vec<CommittedNotice> },
    /// Back-end `node` cannot reach its chain neighbour `peer` although both still reach the
    /// manager: updates it forwarded to `peer` went unacknowledged past its repair threshold
    /// and `peer` did not answer a direct probe (to the manager; answered with `Config`).
    /// Re-sent while the probes keep failing.
    LinkCut { node: NodeId, peer: NodeId },
    /// Back-end `node`, the tail of `range` after a sync, serves gets (its predecessor confirmed
    /// the catch-up, so no older tail is still acting as one): the chain may shed the old tail
    /// (to the manager; answered with `Config`). Re-sent while the chain holds more than R.
    TailReady { node: NodeId, range: Range },
    /// Back-end `node`, head of `range` which the configuration marks `splitting`, ordered no
    /// update since and has every update it ordered acknowledged: the range may be split (to
    /// the manager; answered with `Config`). Re-sent while the range is marked.
    SplitReady { node: NodeId, range: Range },
    /// Back-end `node`, head of `range`, which the configuration marks `merging`, ordered no
    /// update since and has every update it ordered acknowledged (to the manager; answered
    /// with `Config`). Re-sent while the range is marked and not yet `merge_drained`.
    MergeReady { node: NodeId, range: Range },
    /// Front-end `frontend` finished a heartbeat round (to the manager; answered with `Ok`):
    /// for every back-end it probes, the milliseconds since that back-end last answered one of
    /// its pings (0 = it answered this round). The manager declares a back-end failed when a
    /// report shows it silent past the failure threshold, no one heard from it within that
    /// time, and it does not answer the manager's own ping either.
    Heartbeats { frontend: u32, silent_ms: Vec<(NodeId, u64)> },
    /// One Raft RPC between the replicas of the manager group: an encoded request of the
    /// consensus library, opaque here (answered with `Response::Raft`).
    Raft(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Add (`add: true`) or remove a manager of the group (to any manager; the leader acts).
    ChangeManagers { id: u64, addr: String, add: bool },
    /// Back-end `node` cannot write one of its datastores (a full disk, an I/O error, a store
    /// poisoned by a failed fsync; `reason` says which) although it still runs and answers
    /// pings (to the manager; answered with `Config`). The manager takes it out of its chains
    /// and re-replicates them elsewhere (`NodeState::Degraded`). Re-sent while the
    /// configuration does not show it degraded.
    DiskFault { node: NodeId, reason: String },
    /// A connection to front-end `frontend`'s native address was refused (to the manager, by
    /// a front-end forwarding to it; answered with `Config`). The leader checks for itself:
    /// when both of that front-end's addresses refuse its own connections (no process listens
    /// there), it lends the front-end's wedges at once instead of after the heartbeat silence
    /// (docs/PROTOCOL.md, "Front-end failover").
    FrontendRefused { frontend: u32 },
    /// A back-end renews its lease (to the manager; answered with `Response::Lease` by a
    /// leader that confirmed a majority still follows it after the request was sent).
    Renew,
}

impl Request {
    /// Whether this request is one-way: never answered, not even with an error (its frame's
    /// id is 0).
    pub fn is_one_way(&self) -> bool {
        matches!(self, Request::Committed { .. })
    }
}

/// Answers, one per request, with the request's id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Get(Option<Item>),
    Update(Outcome),
    Ok,
    ItemStats {
        curr_items: u64,
        bytes: u64,
    },
    Config(ClusterConfig),
    Status(NodeStatus),
    Digest(Vec<DigestEntry>),
    Pong,
    Error(WireError),
    /// The encoded answer to `Request::Raft`.
    Raft(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A lease renewed (the answer to `Renew` and `Heartbeats`): `term` is the manager group's
    /// Raft term in which the leader confirmed it still led, `config` its configuration then.
    /// A process ignores a lease of an older term or an older epoch than it holds.
    Lease {
        term: u64,
        config: ClusterConfig,
    },
}

/// Errors that cross the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum WireError {
    /// The sender's epoch differs from the receiver's; refresh the configuration and retry.
    #[error("stale epoch (receiver is at {current})")]
    StaleEpoch { current: Epoch },
    /// This node does not hold the role the request needs (not head / not tail of the range).
    #[error("wrong node: {0}")]
    WrongNode(String),
    /// The range cannot serve right now.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Key or value over a limit.
    #[error("object too large for cache")]
    TooLarge,
    /// The storage engine failed (I/O, full disk, poisoned).
    #[error("storage: {0}")]
    Storage(String),
    /// Timed out waiting for the chain.
    #[error("timeout")]
    Timeout,
    /// The request was malformed or not allowed.
    #[error("invalid: {0}")]
    Invalid(String),
    /// This manager is not the leader of the manager group; `leader` is the one it knows of.
    #[error("not the manager leader (leader: {leader:?})")]
    NotLeader { leader: Option<String> },
}

/// Messages between chain neighbours, in sequence order per range.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChainMsg {
    /// First frame of a chain connection: who is sending, and of which cluster
    /// ([`ClusterConfig::cluster_id`]): a receiver of another cluster refuses it.
    Hello { from: NodeId, cluster: u64 },
    /// A syncing replica asks the last in-sync replica for a snapshot of the range.
    SyncRequest { epoch: Epoch, range: Range },
    /// Start of a snapshot; the receiver empties its copy of the range. `snapshot` names this
    /// snapshot stream (unique per sender, which runs only the stream of the latest request):
    /// a receiver takes the batches and the end of the latest stream it began, never those of
    /// an older stream still in flight on the link (a repeated `SyncRequest`, or a receiver
    /// that restarted mid-copy).
    SnapshotBegin { epoch: Epoch, range: Range, snapshot: u64 },
    /// Consecutive records of a snapshot, in the sender's log order (a few dozen KiB per
    /// message: one frame and one datastore write per batch instead of per record). `index`
    /// counts the stream's batches from 0, so that a lost batch is noticed.
    SnapshotBatch { range: Range, snapshot: u64, index: u64, records: Vec<SnapshotItem> },
    /// End of a snapshot: it held every update up to `upto_seq`, in `batches` batches.
    /// `dropped_seq_max` is the source's drop floor at the cut: its compaction (or a merge)
    /// dropped records up to that seq, which the copy lacks as well, so the copy takes that
    /// floor and refuses suffixes below it as its source would.
    SnapshotEnd {
        epoch: Epoch,
        range: Range,
        snapshot: u64,
        batches: u64,
        upto_seq: u64,
        dropped_seq_max: u64,
    },
    /// Answer to `Resend`: every update the sender had when it handled the resend was sent
    /// before this message.
    CaughtUp { epoch: Epoch, range: Range, seq: u64 },
    /// An update the head ordered, travelling head → tail. `prev_seq` is the sequence number
    /// of the range's previous update, so a receiver can tell a gap from a duplicate.
    Replicate {
        epoch: Epoch,
        range: Range,
        seq: u64,
        prev_seq: u64,
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        effect: ReplEffect,
        /// The client request and its outcome, so every replica can deduplicate a retry
        /// after the head changes.
        origin: Option<Origin>,
    },
    /// A receiver found a gap: resend every update of `range` after `after_seq`; travels
    /// downstream → upstream.
    Resend { epoch: Epoch, range: Range, after_seq: u64 },
    /// Everything up to `seq` in `range` is stored at the tail; travels tail → head.
    Ack { epoch: Epoch, range: Range, seq: u64 },
    /// A syncing replica that kept its datastore from before it failed asks the last in-sync
    /// replica for only the records after `have_seq` (its highest seq). `top` identifies its
    /// record of seq `have_seq`; the source streams the suffix (`SuffixBegin`, then
    /// `SnapshotBatch`es, then `SnapshotEnd`) only if it can prove that record committed and
    /// its own log complete above `have_seq`, else it answers `SuffixRefused` (docs/PROTOCOL.md).
    SuffixSyncRequest { epoch: Epoch, range: Range, have_seq: u64, top: RecordMark },
    /// Start of a suffix: the receiver keeps its records up to `after_seq` and appends what
    /// follows (every record of the sender's log with a seq above `after_seq`), streamed as
    /// `snapshot` (the stream id its `SnapshotBatch`es and `SnapshotEnd` carry).
    SuffixBegin { epoch: Epoch, range: Range, snapshot: u64, after_seq: u64 },
    /// The sender cannot prove a suffix safe; the receiver discards its copy and asks for a
    /// full snapshot (`SyncRequest`).
    SuffixRefused { epoch: Epoch, range: Range, reason: String },
    /// Request outcomes of updates the sender resent (after the updates) or copied in a
    /// snapshot (before its end), which travel without their `Origin`: the receiver keeps
    /// those of updates it holds, so that as a later head it answers a retry of one instead
    /// of ordering it a second time.
    Outcomes { epoch: Epoch, range: Range, entries: Vec<OutcomeEntry> },
}

/// The outcome of the client request whose update has sequence number `seq`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeEntry {
    pub req: ReqId,
    pub seq: u64,
    pub outcome: Outcome,
}

/// Identifies one stored record: its key, seq and contents (a delete, or a put with the
/// CRC32C of its value, its flags and expiry; all 0 for a delete).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordMark {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub seq: u64,
    pub delete: bool,
    pub value_crc: u32,
    pub flags: u32,
    pub expiry: u32,
}

/// Where a replicated update came from: the client request (so every replica can deduplicate
/// a retry after the head changes) and the front-end the tail tells when it commits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    pub req: ReqId,
    pub outcome: Outcome,
    pub reply_to: Option<String>,
    /// The client's floor the head knew (`Request::Update::floor`): followers forget below it
    /// as the head does, so a promoted one keeps what a retry may still ask for.
    pub floor: u64,
}

/// One record of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotItem {
    pub seq: u64,
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub effect: ReplEffect,
}

/// The replicated effect of an update.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplEffect {
    Put {
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        flags: u32,
        expiry: u32,
        /// The item's state bits (`op::state`).
        state: u8,
    },
    Delete,
}

/// One back-end process as the manager knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendInfo {
    pub node: NodeId,
    pub addr: String,
    pub state: NodeState,
    /// Why the node is `Degraded` (its datastore's write error); `None` in every other state.
    #[serde(default)]
    pub reason: Option<String>,
}

/// Membership state of a back-end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeState {
    /// Serving; eligible for chains.
    Alive,
    /// Declared failed by the manager (missed heartbeats); removed from every chain.
    Failed,
    /// Leaving gracefully: replacements are synced, then it is removed from its chains.
    Leaving,
    /// Left: in no chain.
    Left,
    /// Its datastore failed a write (`Request::DiskFault`; `BackendInfo::reason`): removed
    /// from every chain but where it is the last proven replica, never chosen for a chain,
    /// not watched by failure detection. It becomes `Alive` again only by registering again
    /// (a restart of the back-end, once the operator freed or replaced the disk).
    Degraded,
}

/// One range of the key space and the back-ends replicating it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeConfig {
    pub range: Range,
    /// In-sync replicas, head first, tail last. Puts enter at the head, gets go to the tail.
    pub chain: Vec<NodeId>,
    /// Replicas being added behind the tail: they receive every update the tail stores and a
    /// snapshot of the range, but do not ack or serve gets until they report `SyncDone`.
    pub syncing: Vec<NodeId>,
    /// Set while the range is being split at this id (a joined node's virtual id inside it):
    /// the head orders no new updates (`Unavailable`, retried), and once every update it
    /// ordered is acknowledged it reports `SplitReady`; the next configuration holds
    /// `(start, at]` and `(at, end]`, each with this chain, split locally by every replica.
    #[serde(default)]
    pub splitting: Option<KeyId>,
    /// Set on two adjacent ranges replicated by the same nodes while they are being merged
    /// into one: the boundary between them (the lower one's end), a virtual id of a node that
    /// left. Their heads order no new updates (`Unavailable`, retried); once every update it
    /// ordered is acknowledged, each head reports `MergeReady` for its range. Once both did,
    /// the next configuration holds their union with the upper one's chain, merged locally by
    /// every replica.
    #[serde(default)]
    pub merging: Option<KeyId>,
    /// The head of this range (marked `merging`) reported it drained (`MergeReady`).
    #[serde(default)]
    pub merge_drained: bool,
    /// The tail that `SyncDone` appended to the chain, until it reports `TailReady`. Until
    /// its predecessor, no longer a tail itself, confirmed it caught up, it may miss updates
    /// the old tail acknowledged alone by its older configuration: it is not yet a copy of
    /// the range, and the manager never lets the chain depend on it alone.
    #[serde(default)]
    pub unproven_tail: Option<NodeId>,
}

impl RangeConfig {
    /// A range served by `chain`, with nothing syncing, splitting or merging.
    pub fn new(range: Range, chain: Vec<NodeId>) -> RangeConfig {
        RangeConfig {
            range,
            chain,
            syncing: Vec::new(),
            splitting: None,
            merging: None,
            merge_drained: false,
            unproven_tail: None,
        }
    }

    /// The forwarding path: chain then syncing replicas.
    pub fn path(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.chain.iter().chain(self.syncing.iter()).copied()
    }

    /// The node before `node` on the forwarding path.
    pub fn predecessor(&self, node: NodeId) -> Option<NodeId> {
        let path: Vec<NodeId> = self.path().collect();
        let i = path.iter().position(|n| *n == node)?;
        i.checked_sub(1).map(|j| path[j])
    }

    /// The node after `node` on the forwarding path.
    pub fn successor(&self, node: NodeId) -> Option<NodeId> {
        let path: Vec<NodeId> = self.path().collect();
        let i = path.iter().position(|n| *n == node)?;
        path.get(i + 1).copied()
    }

    /// Being split or merged: the head orders no new updates until the new ranges are
    /// installed.
    pub fn is_reshaping(&self) -> bool {
        self.splitting.is_some() || self.merging.is_some()
    }

    pub fn head(&self) -> Option<NodeId> {
        self.chain.first().copied()
    }

    pub fn tail(&self) -> Option<NodeId> {
        self.chain.last().copied()
    }
}

/// One front-end process as the manager knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrontendInfo {
    pub id: u32,
    pub native_addr: String,
    pub memcache_addr: String,
}

/// The authoritative cluster configuration, published by the manager.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ClusterConfig {
    pub epoch: Epoch,
    pub replicas: u32,
    pub vnodes: u32,
    /// Back-ends the ring is formed from, sorted by node id.
    pub backends: Vec<BackendInfo>,
    /// Front-ends registered so far, sorted by id; front-end `i` owns wedge `i` of
    /// `frontends_expected` wedges unless `wedges` lends it to another.
    pub frontends: Vec<FrontendInfo>,
    /// How many front-ends (wedges) the cluster has.
    pub frontends_expected: u32,
    /// `flush_all`: items whose sequence number (a microsecond timestamp) is below this are
    /// invisible once the clock passes it. 0 = never flushed.
    pub flush_at_micros: u64,
    /// True once the expected number of back-ends registered and the ranges are fixed.
    pub formed: bool,
    /// Every range with its chain, sorted by `range.end_inclusive`; empty until formed.
    pub ranges: Vec<RangeConfig>,
    /// The front-end serving each wedge (index = wedge): its own front-end, or a live one
    /// while its own is declared dead. Empty (a configuration from before failover) or short:
    /// every wedge missing from it is served by its own front-end. Read it through
    /// [`ClusterConfig::wedge_server`].
    #[serde(default)]
    pub wedges: Vec<u32>,
    /// The cluster's id, drawn by the manager group's first leader when it creates the
    /// cluster's first configuration (0: none, a configuration saved before ids). Every chain
    /// `Hello` carries it, so a back-end of another cluster is refused even without TLS.
    #[serde(default)]
    pub cluster_id: u64,
}

/// Health and counters of one process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct NodeStatus {
    pub role: String,
    pub epoch: Epoch,
    pub uptime_secs: u64,
    /// (name, value) counters.
    pub counters: Vec<(String, u64)>,
}

/// One committed item of a range, for replica comparison.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestEntry {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub seq: u64,
    /// CRC32C of the value, or `None` for a delete record.
    pub value_crc: Option<u32>,
}

impl ClusterConfig {
    /// The range holding key id `id`, if the cluster is formed.
    pub fn range_of(&self, id: KeyId) -> Option<&RangeConfig> {
        if self.ranges.len() == 1 {
            return self.ranges.first();
        }
        let i = self.ranges.partition_point(|r| r.range.end_inclusive < id);
        // Past the last end: wraps to the first range.
        self.ranges.get(i).or_else(|| self.ranges.first())
    }

    /// The id of the front-end serving `wedge`.
    pub fn wedge_server(&self, wedge: u32) -> u32 {
        self.wedges.get(wedge as usize).copied().unwrap_or(wedge)
    }

    /// The wedge of key id `id` among `frontends_expected` wedges.
    pub fn wedge_of(&self, id: KeyId) -> u32 {
        fawn_ring::wedge_of(id, self.frontends_expected.max(1)) as u32
    }

    /// The registered front-end serving key id `id`'s wedge.
    pub fn frontend_for(&self, id: KeyId) -> Option<&FrontendInfo> {
        let server = self.wedge_server(self.wedge_of(id));
        self.frontends.iter().find(|f| f.id == server)
    }

    /// The back-end's address.
    pub fn backend_addr(&self, node: NodeId) -> Option<&str> {
        self.backends.iter().find(|b| b.node == node).map(|b| b.addr.as_str())
    }

    /// Whether `native_addr` is the native address of a front-end of this configuration (the
    /// only addresses a tail sends `Committed` notices to).
    pub fn lists_frontend(&self, native_addr: &str) -> bool {
        self.frontends.iter().any(|f| f.native_addr == native_addr)
    }
}

/// Why a byte stream could not be decoded. Framing is lost: close the connection.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes exceeds the {FRAME_BYTES_MAX}-byte limit")]
    TooLarge(usize),
    #[error("unsupported protocol version {0}")]
    Version(u8),
    #[error("frame shorter than its header")]
    Short,
    #[error("undecodable frame body: {0}")]
    Body(String),
}

/// Appends one frame to `out`.
pub fn encode_frame(request_id: u64, message: &Message, out: &mut Vec<u8>) -> Result<(), FrameError> {
    let start = out.len();
    // Sized once: grown as the encoder writes, a frame's buffer was reallocated about
    // log2(size) times (a 333-byte update: 7 allocations).
    if let Ok(body) = body_options().serialized_size(message) {
        out.reserve(FRAME_HEADER_BYTES + (body as usize).min(FRAME_BYTES_MAX));
    }
    out.extend_from_slice(&[0; 4]);
    out.push(PROTOCOL_VERSION);
    out.extend_from_slice(&request_id.to_le_bytes());
    if let Err(e) = body_options().serialize_into(&mut *out, message) {
        // A failed encoding leaves nothing behind: `out` may already hold other frames.
        out.truncate(start);
        return Err(FrameError::Body(e.to_string()));
    }
    let len = out.len() - start - 4;
    if len > FRAME_BYTES_MAX {
        out.truncate(start);
        return Err(FrameError::TooLarge(len));
    }
    out[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(())
}

/// Decodes one frame from the front of `buf`.
///
/// `Ok(None)`: incomplete, read more. `Ok(Some((id, msg, used)))`: a frame of `used` bytes.
/// `Err`: invalid, framing is lost.
pub fn decode_frame(buf: &[u8]) -> Result<Option<(u64, Message, usize)>, FrameError> {
    let Some(len_bytes) = buf.get(..4) else {
        return Ok(None);
    };
    let len = u32::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]) as usize;
    if len > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge(len));
    }
    if len < FRAME_HEADER_BYTES - 4 {
        return Err(FrameError::Short);
    }
    let Some(frame) = buf.get(4..4 + len) else {
        return Ok(None);
    };
    if frame[0] != PROTOCOL_VERSION {
        return Err(FrameError::Version(frame[0]));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&frame[1..9]);
    let msg: Message =
        body_options().deserialize(&frame[9..]).map_err(|e| FrameError::Body(e.to_string()))?;
    Ok(Some((u64::from_le_bytes(id), msg, 4 + len)))
}

/// bincode settings of the body: little-endian, varint integers, bounded by the frame limit
/// so a hostile length prefix cannot make the decoder allocate more than a frame.
fn body_options() -> impl Options {
    bincode::DefaultOptions::new().with_limit(FRAME_BYTES_MAX as u64).reject_trailing_bytes()
}
