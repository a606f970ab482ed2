//! Guards the administrative commands: version, verbosity, flush_all (now and delayed,
//! noreply), stats (counters, reset, settings, groups), quit.

mod memcache_support;
use std::time::Duration;

use memcache_support::{now, Server};

#[tokio::test]
async fn version_and_verbosity() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"version\r\n", b"VERSION 1.6.21-fawn-0.1.0\r\n").await;
    c.roundtrip(b"verbosity 1\r\n", b"OK\r\n").await;
    c.send(b"verbosity 1 noreply\r\nverbosity noreply\r\n").await;
    c.roundtrip(b"verbosity\r\n", b"ERROR\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn flush_all_now_and_delayed() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"set a 0 0 1\r\na\r\nflush_all\r\nget a\r\n", b"STORED\r\nOK\r\nEND\r\n").await;
    c.roundtrip(b"set a 0 0 1\r\na\r\nflush_all 0\r\nget a\r\n", b"STORED\r\nOK\r\nEND\r\n").await;
    c.send(b"set a 0 0 1 noreply\r\na\r\nflush_all noreply\r\n").await;
    c.roundtrip(b"get a\r\n", b"END\r\n").await;
    // Delayed: still there until the delay passes.
    c.roundtrip(b"set a 0 0 1\r\na\r\nflush_all 2\r\n", b"STORED\r\nOK\r\n").await;
    c.roundtrip(b"get a\r\n", b"VALUE a 0 1\r\na\r\nEND\r\n").await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    c.roundtrip(b"get a\r\n", b"END\r\n").await;
    assert_eq!(c.stat("cmd_flush").await, "4");
    server.shutdown().await;
}

#[tokio::test]
async fn stats_counters() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.roundtrip(b"set a 0 0 3\r\nabc\r\nget a b\r\n", b"STORED\r\nVALUE a 0 3\r\nabc\r\nEND\r\n").await;
    assert_eq!(c.stat("cmd_get").await, "2");
    assert_eq!(c.stat("get_hits").await, "1");
    assert_eq!(c.stat("get_misses").await, "1");
    assert_eq!(c.stat("cmd_set").await, "1");
    assert_eq!(c.stat("total_items").await, "1");
    assert_eq!(c.stat("curr_items").await, "1");
    assert_eq!(c.stat("bytes").await, "4");
    assert_eq!(c.stat("curr_connections").await, "1");
    assert_eq!(c.stat("total_connections").await, "1");
    assert_eq!(c.stat("version").await, "1.6.21-fawn-0.1.0");
    assert_eq!(c.stat("pid").await, std::process::id().to_string());
    let time: u32 = c.stat("time").await.parse().expect("time");
    assert!(time.abs_diff(now()) <= 2);
    assert!(c.stat("bytes_read").await.parse::<u64>().expect("bytes_read") > 20);
    assert!(c.stat("bytes_written").await.parse::<u64>().expect("bytes_written") > 20);
    for name in ["uptime", "limit_maxbytes", "threads", "cmd_touch", "get_expired"] {
        c.stat(name).await;
    }
    c.roundtrip(b"stats reset\r\n", b"RESET\r\n").await;
    assert_eq!(c.stat("cmd_get").await, "0");
    c.roundtrip(b"stats nonsense\r\n", b"ERROR\r\n").await;
    server.shutdown().await;
}

#[tokio::test]
async fn stats_groups_have_memcached_fields() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    // No items: memcached lists no class.
    assert_eq!(c.stats("stats items\r\n").await, "END\r\n");
    let slabs = c.stats("stats slabs\r\n").await;
    assert_eq!(slabs, "STAT active_slabs 0\r\nSTAT total_malloced 0\r\nEND\r\n");
    c.roundtrip(b"set a 0 0 3\r\nabc\r\nget a\r\n", b"STORED\r\nVALUE a 0 3\r\nabc\r\nEND\r\n").await;
    let items = c.stats("stats items\r\n").await;
    assert!(items.starts_with("STAT items:1:number 1\r\nSTAT items:1:number_hot 0\r\n"), "{items}");
    assert!(items.contains("STAT items:1:mem_requested 4\r\n"), "{items}");
    assert_eq!(items.lines().count(), 28 + 1, "{items}");
    let slabs = c.stats("stats slabs\r\n").await;
    assert!(slabs.contains("STAT 1:used_chunks 1\r\n") && slabs.contains("STAT 1:get_hits 1\r\n"), "{slabs}");
    assert!(slabs.ends_with("STAT active_slabs 1\r\nSTAT total_malloced 4\r\nEND\r\n"), "{slabs}");
    let settings = c.stats("stats settings\r\n").await;
    assert!(settings.starts_with("STAT maxbytes 67108864\r\nSTAT maxconns 1024\r\n"), "{settings}");
    let port = server.addr.port();
    assert!(settings.contains(&format!("STAT tcpport {port}\r\nSTAT udpport 0\r\nSTAT inter 127.0.0.1\r\n")));
    assert!(
        settings.contains("STAT auth_enabled_sasl no\r\n")
            && settings.ends_with("STAT memory_file (null)\r\nEND\r\n")
    );
    assert_eq!(settings.lines().count(), 76 + 1, "{settings}");
    let mut idle = server.connect().await;
    idle.roundtrip(b"mn\r\n", b"MN\r\n").await;
    let conns = c.stats("stats conns\r\n").await;
    let states: Vec<&str> = conns.lines().filter_map(|l| l.split_once(":state ").map(|(_, s)| s)).collect();
    assert_eq!(states, ["conn_listening", "conn_parse_cmd", "conn_waiting"], "{conns}");
    assert_eq!(conns.matches(&format!(":listen_addr tcp:{}\r\n", server.addr)).count(), 2, "{conns}");
    server.shutdown().await;
}

#[tokio::test]
async fn quit_closes_without_reply() {
    let server = Server::start().await;
    let mut c = server.connect().await;
    c.send(b"quit\r\nversion\r\n").await;
    c.expect_closed().await;
    let mut d = server.connect().await;
    assert_eq!(d.stat("curr_connections").await, "1");
    server.shutdown().await;
}
