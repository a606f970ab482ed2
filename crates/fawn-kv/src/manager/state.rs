//! The manager's configuration state machine: pure transitions on [`ClusterConfig`].
//!
//! Kept free of I/O so it can later be driven by a replicated log (Raft) unchanged: each
//! transition takes the current config and returns the next one (or a refusal).

use fawn_proto::native::{BackendInfo, ClusterConfig, FrontendInfo};
use fawn_ring::NodeId;

/// Largest replication factor accepted.
pub const REPLICAS_MAX: u32 = 7;
/// Most virtual ids per back-end accepted.
pub const VNODES_MAX: u32 = 64;

/// Why a transition was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the ring is formed with {have} back-ends; adding node {node} needs the join protocol, which this version does not have yet")]
    RingFormed { node: NodeId, have: usize },
    #[error("front-end id {got} is out of range: the cluster has {expected} front-ends (ids 0..{expected})")]
    FrontendId { expected: u32, got: u32 },
}

/// A fresh configuration for a cluster of `frontends` front-ends.
pub fn initial(replicas: u32, vnodes: u32, frontends: u32) -> ClusterConfig {
    ClusterConfig {
        epoch: 1,
        frontends_expected: frontends.max(1),
        replicas: replicas.clamp(1, REPLICAS_MAX),
        vnodes: vnodes.clamp(1, VNODES_MAX),
        ..ClusterConfig::default()
    }
}

/// A back-end announces its address. Returns `None` when nothing changed.
pub fn register_backend(
    config: &ClusterConfig,
    expected_backends: usize,
    node: NodeId,
    addr: &str,
) -> Result<Option<ClusterConfig>, Refused> {
    let mut next = config.clone();
    match next.backends.iter_mut().find(|b| b.node == node) {
        Some(b) if b.addr == addr => return Ok(None),
        Some(b) => b.addr = addr.to_string(),
        None if config.formed => return Err(Refused::RingFormed { node, have: config.backends.len() }),
        None => {
            next.backends.push(BackendInfo { node, addr: addr.to_string() });
            next.backends.sort_by_key(|b| b.node);
        }
    }
    next.formed = next.backends.len() >= expected_backends;
    next.epoch += 1;
    Ok(Some(next))
}

/// A front-end announces its addresses. Returns `None` when nothing changed.
pub fn register_frontend(
    config: &ClusterConfig,
    id: u32,
    native_addr: &str,
    memcache_addr: &str,
) -> Result<Option<ClusterConfig>, Refused> {
    let info =
        FrontendInfo { id, native_addr: native_addr.to_string(), memcache_addr: memcache_addr.to_string() };
    if id >= config.frontends_expected {
        return Err(Refused::FrontendId { expected: config.frontends_expected, got: id });
    }
    let mut next = config.clone();
    match next.frontends.iter_mut().find(|f| f.id == id) {
        Some(f) if *f == info => return Ok(None),
        Some(f) => *f = info,
        None => {
            next.frontends.push(info);
            next.frontends.sort_by_key(|f| f.id);
        }
    }
    next.epoch += 1;
    Ok(Some(next))
}

/// `flush_all`: everything stored before `at_unix` becomes invisible at `at_unix`.
pub fn set_flush(config: &ClusterConfig, at_unix: u32) -> ClusterConfig {
    let mut next = config.clone();
    next.flush_at_unix = at_unix;
    next.epoch += 1;
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_forms_at_expected_count_and_then_refuses_new_nodes() {
        let c = initial(3, 2, 1);
        let c = register_backend(&c, 2, 1, "a:1").unwrap().unwrap();
        assert!(!c.formed);
        let c = register_backend(&c, 2, 2, "a:2").unwrap().unwrap();
        assert!(c.formed);
        assert_eq!(c.epoch, 3);
        assert!(register_backend(&c, 2, 2, "a:2").unwrap().is_none());
        assert!(register_backend(&c, 2, 3, "a:3").is_err());
        let moved = register_backend(&c, 2, 2, "a:9").unwrap().unwrap();
        assert_eq!(moved.backends[1].addr, "a:9");
    }

    #[test]
    fn frontends_register_in_any_order_within_the_expected_count() {
        let c = initial(3, 2, 2);
        assert!(register_frontend(&c, 2, "n", "m").is_err());
        let c = register_frontend(&c, 1, "n1", "m1").unwrap().unwrap();
        let c = register_frontend(&c, 0, "n0", "m0").unwrap().unwrap();
        assert_eq!(c.frontends.iter().map(|f| f.id).collect::<Vec<_>>(), vec![0, 1]);
    }
}
