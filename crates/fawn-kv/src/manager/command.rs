//! The manager group's replicated commands: each is one entry of the Raft log, and applying
//! it runs one pure transition of `state` on the configuration. The leader fills in the soft
//! state a transition reads (the cut links it believes in, the expected back-end count), so
//! every replica applying the entry computes the same configuration.

use fawn_proto::native::ClusterConfig;
use fawn_ring::{NodeId, Range};
use serde::{Deserialize, Serialize};

use super::state;

/// One replicated configuration change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// The group's first configuration (proposed once, by the first leader).
    Init(ClusterConfig),
    RegisterBackend {
        expected: usize,
        node: NodeId,
        addr: String,
        logs_complete: bool,
        cuts: Cuts,
    },
    RegisterFrontend {
        id: u32,
        native_addr: String,
        memcache_addr: String,
    },
    SyncDone {
        node: NodeId,
        range: Range,
        cuts: Cuts,
    },
    Leave {
        node: NodeId,
        cuts: Cuts,
    },
    CutLink {
        node: NodeId,
        peer: NodeId,
        cuts: Cuts,
    },
    TailReady {
        node: NodeId,
        range: Range,
        cuts: Cuts,
    },
    SplitReady {
        node: NodeId,
        range: Range,
        cuts: Cuts,
    },
    MergeReady {
        node: NodeId,
        range: Range,
        cuts: Cuts,
    },
    SetFlush {
        at_micros: u64,
    },
    FailNode {
        node: NodeId,
        cuts: Cuts,
    },
    /// A back-end's datastore fails writes (`Request::DiskFault`).
    DegradeNode {
        node: NodeId,
        reason: String,
        cuts: Cuts,
    },
    Settle {
        cuts: Cuts,
    },
    /// A front-end stopped reporting heartbeats: its wedges move to live front-ends.
    FailFrontend {
        id: u32,
    },
}

/// The cut links a transition is computed with, as carried in the log.
pub type Cuts = Vec<(NodeId, NodeId)>;

/// The outcome of applying a command, returned to the proposer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Applied {
    /// The configuration after the command (unchanged if the command changed nothing).
    Config(ClusterConfig),
    /// The transition refused the command; the configuration is unchanged.
    Refused(String),
    /// The group has no configuration yet (no `Init` applied).
    NotReady,
    /// A membership change or blank entry of the group itself.
    Group,
}

/// The link cuts as the state transitions take them.
pub fn link_cuts(cuts: &Cuts) -> state::LinkCuts {
    let mut set = state::LinkCuts::default();
    for (a, b) in cuts {
        set.insert(*a, *b);
    }
    set
}

/// Runs `command` on `config`: `Ok(None)` when it changes nothing. Pure, so every replica of
/// the group computes the same result from the same log.
pub fn transition(config: &ClusterConfig, command: &Command) -> Result<Option<ClusterConfig>, String> {
    let refused = |e: state::Refused| e.to_string();
    match command {
        Command::Init(_) => Ok(None),
        // Whether the node's logs are complete does not change the decision: a new process
        // resyncs in either case, having lost its request outcomes (`state::register_backend`).
        Command::RegisterBackend { expected, node, addr, cuts, .. } => {
            state::register_backend(config, *expected, *node, addr, &link_cuts(cuts)).map_err(refused)
        }
        Command::RegisterFrontend { id, native_addr, memcache_addr } => {
            state::register_frontend(config, *id, native_addr, memcache_addr).map_err(refused)
        }
        Command::SyncDone { node, range, cuts } => {
            state::sync_done(config, *node, *range, &link_cuts(cuts)).map_err(refused)
        }
        Command::Leave { node, cuts } => state::leave(config, *node, &link_cuts(cuts)).map_err(refused),
        Command::CutLink { node, peer, cuts } => {
            state::cut_link(config, *node, *peer, &link_cuts(cuts)).map_err(refused)
        }
        Command::TailReady { node, range, cuts } => {
            state::tail_ready(config, *node, *range, &link_cuts(cuts)).map_err(refused)
        }
        Command::SplitReady { node, range, cuts } => {
            state::split_ready(config, *node, *range, &link_cuts(cuts)).map_err(refused)
        }
        Command::MergeReady { node, range, cuts } => {
            state::merge_ready(config, *node, *range, &link_cuts(cuts)).map_err(refused)
        }
        Command::SetFlush { at_micros } => Ok(Some(state::set_flush(config, *at_micros))),
        Command::FailNode { node, cuts } => {
            state::fail_node(config, *node, &link_cuts(cuts)).map_err(refused)
        }
        Command::DegradeNode { node, reason, cuts } => {
            state::degrade_node(config, *node, reason, &link_cuts(cuts)).map_err(refused)
        }
        Command::Settle { cuts } => Ok(state::settle(config, &link_cuts(cuts))),
        Command::FailFrontend { id } => state::fail_frontend(config, *id).map_err(refused),
    }
}

/// Applies `command` to the group's configuration (`None` before `Init`), returning the
/// outcome; `config` is replaced when the command changed it.
pub fn apply(config: &mut Option<ClusterConfig>, command: &Command) -> Applied {
    match (config.as_ref(), command) {
        (None, Command::Init(first)) => {
            *config = Some(first.clone());
            Applied::Config(first.clone())
        }
        (None, _) => Applied::NotReady,
        (Some(current), _) => match transition(current, command) {
            Ok(None) => Applied::Config(current.clone()),
            Ok(Some(next)) => {
                *config = Some(next.clone());
                Applied::Config(next)
            }
            Err(e) => Applied::Refused(e),
        },
    }
}
