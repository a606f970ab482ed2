//! `fawn status`: the configuration, the ring with its chains, and each process's health.

use std::time::Duration;

use anyhow::Context;
use fawn_client::pool::Pool;
use fawn_kv::manager::{client, RAFT_STATES};
use fawn_proto::native::{BackendInfo, ClusterConfig, Request, Response};

use crate::args::{LeaveArgs, ManagersArgs, StatusArgs};

const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// A new manager first catches up as a learner, then becomes a voter.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    args.transport.apply()?;
    let pool = Pool::new(STATUS_TIMEOUT);
    let config = match client::call(&pool, &args.manager, Request::GetConfig, STATUS_TIMEOUT).await {
        Ok(Response::Config(c)) => c,
        Ok(other) => anyhow::bail!("unexpected manager answer: {other:?}"),
        Err(e) => return Err(e).with_context(|| format!("asking the managers at {}", args.manager)),
    };
    println!(
        "epoch {}   R={} V={}   ring {}   flush_all at {}",
        config.epoch,
        config.replicas,
        config.vnodes,
        if config.formed { "formed" } else { "forming" },
        config.flush_at_micros
    );
    println!("\nmanagers:");
    for addr in client::parse_list(&args.manager) {
        println!("  manager      {:<22} {}", addr, manager_health(&pool, &addr).await);
    }
    println!("\nprocesses:");
    for b in &config.backends {
        println!(
            "  backend-{:<3} {:<22} {}: {}",
            b.node,
            b.addr,
            backend_state(b),
            health(&pool, &b.addr).await
        );
    }
    for f in &config.frontends {
        let wedges: Vec<String> = (0..config.frontends_expected)
            .filter(|w| config.wedge_server(*w) == f.id)
            .map(|w| w.to_string())
            .collect();
        println!(
            "  frontend-{:<2} {:<22} {} (memcached {}) serves wedges [{}]",
            f.id,
            f.native_addr,
            health(&pool, &f.native_addr).await,
            f.memcache_addr,
            wedges.join(", ")
        );
    }
    print_chains(&config);
    Ok(())
}

/// A back-end's membership state, with the reason when it is degraded (its datastore failed
/// a write: docs/OPERATIONS.md, "A degraded back-end").
fn backend_state(b: &BackendInfo) -> String {
    match &b.reason {
        Some(reason) => format!("{:?} ({reason})", b.state),
        None => format!("{:?}", b.state),
    }
}

/// One manager's place in the group: its role, term and log position.
async fn manager_health(pool: &Pool, addr: &str) -> String {
    match pool.call(addr, Request::Status, STATUS_TIMEOUT).await {
        Ok(Response::Status(s)) => {
            let get = |k: &str| s.counters.iter().find(|(n, _)| n == k).map_or(0, |(_, v)| *v);
            let role = RAFT_STATES.get(get("raft_state") as usize).copied().unwrap_or("?");
            format!(
                "id {} {:<9} term {} log {} applied {} leader {} voters {}   up {}s epoch {}",
                get("raft_id"),
                role.to_uppercase(),
                get("raft_term"),
                get("raft_last_log_index"),
                get("raft_applied_index"),
                get("raft_leader"),
                get("raft_voters"),
                s.uptime_secs,
                s.epoch
            )
        }
        Ok(other) => format!("UNEXPECTED {other:?}"),
        Err(e) => format!("DOWN ({e})"),
    }
}

async fn health(pool: &Pool, addr: &str) -> String {
    match pool.call(addr, Request::Status, STATUS_TIMEOUT).await {
        Ok(Response::Status(s)) => {
            let counters: Vec<String> = s.counters.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("up {}s epoch {} {}", s.uptime_secs, s.epoch, counters.join(" "))
        }
        Ok(other) => format!("UNEXPECTED {other:?}"),
        Err(e) => format!("DOWN ({e})"),
    }
}

fn print_chains(config: &ClusterConfig) {
    if config.ranges.is_empty() {
        println!("\nranges: none yet (waiting for back-ends to register)");
        return;
    }
    println!("\nranges (start, end] -> chain head ... tail [syncing] [splitting] [merging]:");
    for rc in &config.ranges {
        let chain: Vec<String> = rc.chain.iter().map(|n| format!("backend-{n}")).collect();
        let syncing: Vec<String> = rc.syncing.iter().map(|n| format!("backend-{n}")).collect();
        let extra =
            if syncing.is_empty() { String::new() } else { format!("   [syncing: {}]", syncing.join(", ")) };
        let short = if rc.chain.len() < config.replicas as usize { "   UNDER-REPLICATED" } else { "" };
        let split = match rc.splitting {
            Some(at) => format!("   [splitting at {:032x}: puts wait for the chain to drain]", at.0),
            None => String::new(),
        };
        let merge = match (rc.merging, rc.merge_drained) {
            (Some(at), drained) => format!(
                "   [merging at {:032x}: puts wait; {}]",
                at.0,
                if drained { "drained" } else { "draining" }
            ),
            (None, _) => String::new(),
        };
        println!(
            "  ({:032x}, {:032x}]  {}{extra}{short}{split}{merge}",
            rc.range.start_exclusive.0,
            rc.range.end_inclusive.0,
            chain.join(" -> ")
        );
    }
}

/// `fawn leave`: asks the manager to move a back-end's replicas elsewhere, then to drop it.
pub async fn leave(args: LeaveArgs) -> anyhow::Result<()> {
    args.transport.apply()?;
    let pool = Pool::new(STATUS_TIMEOUT);
    match client::call(&pool, &args.manager, Request::Leave { node: args.node }, STATUS_TIMEOUT).await {
        Ok(Response::Config(c)) => {
            println!("back-end {} is leaving (epoch {}); its replacements are syncing.", args.node, c.epoch);
            println!("Watch `fawn status`; stop the process once its state is Left.");
            Ok(())
        }
        Ok(Response::Error(e)) => anyhow::bail!("the manager refused: {e}"),
        Ok(other) => anyhow::bail!("unexpected manager answer: {other:?}"),
        Err(e) => Err(e).with_context(|| format!("asking the managers at {}", args.manager)),
    }
}

/// `fawn managers add|remove`: changes the manager group's membership through its leader.
pub async fn change_managers(args: ManagersArgs) -> anyhow::Result<()> {
    args.transport.apply()?;
    let add = args.action == "add";
    anyhow::ensure!(!add || !args.addr.is_empty(), "`add` needs --addr");
    let request = Request::ChangeManagers { id: args.id, addr: args.addr.clone(), add };
    let pool = Pool::new(STATUS_TIMEOUT);
    match client::call(&pool, &args.manager, request, CHANGE_TIMEOUT).await {
        Ok(Response::Ok) => {
            println!(
                "manager {} {}",
                args.id,
                if add { "added to the group" } else { "removed from the group" }
            );
            Ok(())
        }
        Ok(Response::Error(e)) => anyhow::bail!("the manager group refused: {e}"),
        Ok(other) => anyhow::bail!("unexpected manager answer: {other:?}"),
        Err(e) => Err(e).with_context(|| format!("asking the managers at {}", args.manager)),
    }
}
