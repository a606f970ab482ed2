//! Guards `fawn_kv::launch`: every command line it builds, with every optional flag set, is
//! one this binary accepts, and means what the builder was given.

use std::path::PathBuf;

use clap::Parser;
use fawn_kv::launch::{with_metrics, BackendCommand, FrontendCommand, ManagerCommand, RingShape};

use crate::args::Cli;

fn parses(args: Vec<String>) -> Cli {
    let argv = std::iter::once("fawn".to_string()).chain(args);
    Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("a launch command line is refused: {e}"))
}

#[test]
fn every_role_command_line_parses() {
    let ring = RingShape { backends: 3, frontends: 2, replicas: 3, vnodes: 2 };
    let manager = ManagerCommand {
        listen: "127.0.0.1:7400".into(),
        group: Some("127.0.0.1:7400,127.0.0.1:7651,127.0.0.1:7652".into()),
        data_dir: PathBuf::from("/tmp/m"),
        ring,
        tls_dir: None,
    };
    let backend = BackendCommand {
        node: 2,
        listen: "127.0.0.1:7403".into(),
        advertise: Some("10.0.0.2:7403".into()),
        managers: "127.0.0.1:7400".into(),
        data_dir: PathBuf::from("/tmp/b"),
        sync: "always".into(),
        expected_keys: Some(1_000),
        tls_dir: Some(PathBuf::from("/tmp/tls")),
    };
    let frontend = FrontendCommand {
        id: 1,
        listen: "127.0.0.1:7501".into(),
        memcached: "127.0.0.1:11212".into(),
        managers: "127.0.0.1:7400".into(),
        data_dir: PathBuf::from("/tmp/f"),
        cache_entries: Some(0),
        request_timeout_ms: Some(1500),
        memcached_auth_file: Some(PathBuf::from("/tmp/users")),
        memcached_tls: Some(fawn_kv::launch::MemcachedTlsFiles {
            cert: PathBuf::from("/tmp/mc.pem"),
            key: PathBuf::from("/tmp/mc.key"),
        }),
        tls_dir: Some(PathBuf::from("/tmp/tls")),
    };
    let group_of_one = ManagerCommand { group: None, ..manager.clone() };
    assert!(format!("{:?}", parses(manager.args()).command).contains("plaintext: true"), "--plaintext lost");
    for args in [manager.args(), group_of_one.args(), backend.args(), frontend.args()] {
        let role = args[0].clone();
        let cli = parses(with_metrics(args, Some("127.0.0.1:9100".into())));
        let debug = format!("{:?}", cli.command);
        assert!(debug.to_lowercase().starts_with(&role), "{role}: parsed as {debug}");
        assert!(debug.contains("9100"), "{role}: --metrics lost: {debug}");
    }
    let debug = format!("{:?}", parses(frontend.args()).command);
    for expected in ["11212", "1500", "/tmp/users", "/tmp/tls", "/tmp/mc.pem", "/tmp/mc.key"] {
        assert!(debug.contains(expected), "frontend: {expected} lost: {debug}");
    }
    let debug = format!("{:?}", parses(backend.args()).command);
    for expected in ["10.0.0.2:7403", "1000", "Always", "/tmp/tls"] {
        assert!(debug.contains(expected), "backend: {expected} lost: {debug}");
    }
}
