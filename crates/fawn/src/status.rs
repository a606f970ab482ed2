//! `fawn status`: the configuration, the ring with its chains, and each process's health.

use std::time::Duration;

use anyhow::Context;
use fawn_client::pool::Pool;
use fawn_proto::native::{ClusterConfig, Request, Response};
use fawn_ring::Ring;

use crate::args::StatusArgs;

const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let pool = Pool::new(STATUS_TIMEOUT);
    let config = match pool.call(&args.manager, Request::GetConfig, STATUS_TIMEOUT).await {
        Ok(Response::Config(c)) => c,
        Ok(other) => anyhow::bail!("unexpected manager answer: {other:?}"),
        Err(e) => return Err(e).with_context(|| format!("asking the manager at {}", args.manager)),
    };
    println!(
        "epoch {}   R={} V={}   ring {}   flush_all at {}",
        config.epoch,
        config.replicas,
        config.vnodes,
        if config.formed { "formed" } else { "forming" },
        config.flush_at_unix
    );
    println!("\nprocesses:");
    println!("  manager      {:<22} {}", args.manager, health(&pool, &args.manager).await);
    for b in &config.backends {
        println!("  backend-{:<3} {:<22} {}", b.node, b.addr, health(&pool, &b.addr).await);
    }
    for f in &config.frontends {
        println!(
            "  frontend-{:<2} {:<22} {} (memcached {})",
            f.id,
            f.native_addr,
            health(&pool, &f.native_addr).await,
            f.memcache_addr
        );
    }
    print_chains(&config);
    Ok(())
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
    let nodes: Vec<_> = config.backends.iter().map(|b| b.node).collect();
    if nodes.is_empty() {
        return;
    }
    let ring = Ring::new(&nodes, config.vnodes, config.replicas);
    println!("\nranges (start, end] -> chain head ... tail:");
    for (range, owner) in ring.ranges() {
        let chain = ring.chain_for_range(&owner);
        let nodes: Vec<String> = chain.nodes.iter().map(|n| format!("backend-{n}")).collect();
        println!(
            "  ({:032x}, {:032x}]  {}",
            range.start_exclusive.0,
            range.end_inclusive.0,
            nodes.join(" -> ")
        );
    }
}
