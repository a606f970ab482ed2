//! Front-end transitions: registration, and the failover of a dead front-end's wedges.
//!
//! Every wedge has its own front-end (wedge `i`, front-end `i`); `ClusterConfig::wedges` says
//! which front-end serves it now. A front-end declared dead lends every wedge it serves to the
//! live front-ends (paper §3.4: "VIDs attach to a new front-end"); when it registers again it
//! takes its own wedge back. A front-end is live while it serves its own wedge, so the map
//! alone is the front-ends' state.

use fawn_proto::native::{ClusterConfig, FrontendInfo};

use super::Refused;

/// The front-ends that registered and serve their own wedge (not declared dead), by id.
pub fn live_frontends(config: &ClusterConfig) -> Vec<u32> {
    config.frontends.iter().map(|f| f.id).filter(|id| config.wedge_server(*id) == *id).collect()
}

/// The wedge map of `config`, one entry per wedge.
fn full_map(config: &ClusterConfig) -> Vec<u32> {
    (0..config.frontends_expected.max(1)).map(|w| config.wedge_server(w)).collect()
}

/// A front-end announces its addresses; a front-end whose wedge was lent while it was declared
/// dead takes it back (only its own: wedges it had borrowed moved on when it was declared dead).
/// Returns `None` when nothing changed.
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
    let lent = config.wedge_server(id) != id;
    match next.frontends.iter_mut().find(|f| f.id == id) {
        Some(f) if *f == info && !lent => return Ok(None),
        Some(f) => *f = info,
        None => {
            next.frontends.push(info);
            next.frontends.sort_by_key(|f| f.id);
        }
    }
    if lent {
        let mut map = full_map(config);
        map[id as usize] = id;
        next.wedges = map;
    }
    next.epoch += 1;
    Ok(Some(next))
}

/// Front-end `id` was declared dead (it stopped reporting heartbeats): every wedge it serves
/// moves, one at a time, to the live front-end serving the fewest (the lowest id on a tie).
/// `None` when it serves no wedge (already declared dead) or no other front-end is live.
pub fn fail_frontend(config: &ClusterConfig, id: u32) -> Result<Option<ClusterConfig>, Refused> {
    if id >= config.frontends_expected {
        return Err(Refused::FrontendId { expected: config.frontends_expected, got: id });
    }
    let heirs: Vec<u32> = live_frontends(config).into_iter().filter(|f| *f != id).collect();
    let mut map = full_map(config);
    if heirs.is_empty() || !map.contains(&id) {
        return Ok(None);
    }
    for wedge in 0..map.len() {
        if map[wedge] != id {
            continue;
        }
        let load = |f: &u32| map.iter().filter(|s| *s == f).count();
        let heir = heirs.iter().copied().min_by_key(|f| (load(f), *f)).unwrap_or(id);
        map[wedge] = heir;
    }
    let mut next = config.clone();
    next.wedges = map;
    next.epoch += 1;
    Ok(Some(next))
}

#[cfg(test)]
mod tests {
    use super::super::initial;
    use super::*;

    fn registered(n: u32) -> ClusterConfig {
        let mut c = initial(3, 2, n);
        for id in 0..n {
            c = register_frontend(&c, id, &format!("n{id}"), &format!("m{id}")).unwrap().unwrap();
        }
        c
    }

    fn servers(c: &ClusterConfig) -> Vec<u32> {
        (0..c.frontends_expected).map(|w| c.wedge_server(w)).collect()
    }

    #[test]
    fn every_front_end_serves_its_own_wedge_until_one_is_declared_dead() {
        let c = registered(3);
        assert_eq!(servers(&c), vec![0, 1, 2]);
        assert_eq!(live_frontends(&c), vec![0, 1, 2]);
        assert_eq!(register_frontend(&c, 1, "n1", "m1"), Ok(None), "a repeated registration changes nothing");
    }

    #[test]
    fn a_dead_front_ends_wedge_moves_to_the_least_loaded_live_one_and_comes_back() {
        let c = registered(3);
        let failed = fail_frontend(&c, 1).unwrap().unwrap();
        assert_eq!(failed.epoch, c.epoch + 1);
        assert_eq!(servers(&failed), vec![0, 0, 2], "lowest id among the equally loaded");
        assert_eq!(live_frontends(&failed), vec![0, 2]);
        assert_eq!(fail_frontend(&failed, 1), Ok(None), "declared dead once");

        // Front-end 0 dies too: both wedges it serves go to the last live one.
        let both = fail_frontend(&failed, 0).unwrap().unwrap();
        assert_eq!(servers(&both), vec![2, 2, 2]);
        assert_eq!(fail_frontend(&both, 2), Ok(None), "the last live front-end keeps its wedges");

        // Front-end 1 returns (same addresses): it takes its own wedge back, only that one.
        let back = register_frontend(&both, 1, "n1", "m1").unwrap().unwrap();
        assert_eq!(back.epoch, both.epoch + 1);
        assert_eq!(servers(&back), vec![2, 1, 2]);
        assert_eq!(live_frontends(&back), vec![1, 2]);
    }

    #[test]
    fn wedges_spread_over_the_live_front_ends() {
        let c = registered(4);
        let c = fail_frontend(&c, 0).unwrap().unwrap();
        let c = fail_frontend(&c, 1).unwrap().unwrap();
        assert_eq!(servers(&c), vec![2, 3, 2, 3], "each heir takes one of the two lent wedges");
    }

    #[test]
    fn a_configuration_without_a_map_serves_each_wedge_by_its_own_front_end() {
        let mut c = registered(2);
        c.wedges.clear();
        assert_eq!(servers(&c), vec![0, 1]);
        let failed = fail_frontend(&c, 0).unwrap().unwrap();
        assert_eq!(failed.wedges, vec![1, 1]);
        assert!(fail_frontend(&c, 2).is_err(), "no such front-end");
    }

    #[test]
    fn a_single_front_end_is_never_declared_dead() {
        let c = registered(1);
        assert_eq!(fail_frontend(&c, 0), Ok(None));
    }
}
