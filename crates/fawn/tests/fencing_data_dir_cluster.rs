//! Guards a back-end's data directory against another cluster: a back-end restarted with the
//! `--manager` of a different cluster exits with an error naming both clusters, without
//! registering there and without touching its datastores; restarted with its own cluster's
//! managers it serves every write it held.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::bounds::one_of_each;
use common::procs::{fawn_binary, free_ports, start_filled, Procs};
use fawn_kv::launch::BackendCommand;

/// The names under a directory, recursively, with their sizes: what "untouched" compares.
fn listing(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let meta = e.metadata().expect("metadata");
            if meta.is_dir() {
                stack.push(e.path());
            } else {
                out.push((e.path().display().to_string(), meta.len()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_data_directory_refuses_another_clusters_managers() {
    let (mut a, rt, client, want) = start_filled(one_of_each(&[], &[]), 200);
    let b = Procs::start(one_of_each(&[], &[]));
    let (config_a, config_b) = (a.config().expect("config a"), b.config().expect("config b"));
    assert_ne!(config_a.cluster_id, config_b.cluster_id, "two clusters, two ids");

    a.kill9(0);
    let data_dir = a.dir.join("backend-0");
    let recorded = std::fs::read_to_string(data_dir.join("CLUSTER_ID")).expect("the cluster id is recorded");
    assert_eq!(recorded.trim(), format!("{:016x}", config_a.cluster_id));
    let before = listing(&data_dir.join("ranges"));
    assert!(!before.is_empty(), "the back-end held datastores");

    let port = free_ports(1)[0];
    let args = BackendCommand {
        node: 7,
        listen: format!("127.0.0.1:{port}"),
        advertise: None,
        managers: b.manager_addr.clone(),
        data_dir: data_dir.clone(),
        sync: "always".into(),
        expected_keys: None,
        tls_dir: None,
    }
    .args();
    let mut child = Command::new(fawn_binary())
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the misdirected back-end");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("a back-end pointed at another cluster's managers kept running");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().expect("stderr"), &mut stderr).expect("stderr");
    assert!(!status.success(), "it must fail: {stderr}");
    assert!(
        stderr.contains(&format!("{:016x}", config_a.cluster_id))
            && stderr.contains(&format!("{:016x}", config_b.cluster_id)),
        "the error names both clusters: {stderr}"
    );
    let after_b = b.config().expect("config b");
    assert!(!after_b.backends.iter().any(|x| x.node == 7), "it did not register: {after_b:?}");
    assert_eq!(listing(&data_dir.join("ranges")), before, "its datastores are untouched");

    a.restart_backend(0);
    let config = a.wait_config("back-end 0 serves again", |c| c.epoch > 0);
    rt.block_on(common::assert_every_write_held(&client, &want, &config));
}
