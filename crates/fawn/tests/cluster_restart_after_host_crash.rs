//! Guards a back-end restarted after its *host* crashed, faster than the failure detector
//! notices: under `--sync never` its logs lost what the page cache held (simulated: the
//! logs are cut back to where they were before the last writes, the checkpoints dropped, and
//! the recorded boot id changed). It must not resume its chain positions from those logs —
//! as tail it would serve older values than the chain acknowledged — but resync first; once
//! it is back in every chain, every key still reads as last written.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::procs::{ProcShape, Procs};

const KEYS: u32 = 300;
const VICTIM: u32 = 1;

fn data_logs(backend_dir: &Path) -> Vec<PathBuf> {
    let Ok(ranges) = std::fs::read_dir(backend_dir.join("ranges")) else { return Vec::new() };
    ranges.flatten().map(|r| r.path().join("data.log")).filter(|p| p.exists()).collect()
}

#[test]
fn a_backend_whose_host_crashed_resyncs_before_serving() {
    let shape = ProcShape { sync: "never".into(), ..ProcShape::default() };
    let mut procs = Procs::start(shape);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = rt.block_on(procs.client(Default::default()));
    let key = |i: u32| format!("key-{i}").into_bytes();
    rt.block_on(async {
        for i in 0..KEYS {
            client.put(&key(i), b"first").await.expect("put");
        }
    });
    // What the host had written back when it crashed: the logs as they are now.
    let dir = procs.dir.join(format!("backend-{VICTIM}"));
    let written: BTreeMap<PathBuf, u64> =
        data_logs(&dir).into_iter().map(|p| (p.clone(), std::fs::metadata(&p).unwrap().len())).collect();
    assert!(!written.is_empty(), "no datastore under {}", dir.display());
    rt.block_on(async {
        for i in 0..KEYS {
            client.put(&key(i), b"second").await.expect("put");
        }
    });

    procs.kill9(VICTIM);
    for (log, len) in &written {
        std::fs::OpenOptions::new().write(true).open(log).unwrap().set_len(*len).unwrap();
        let _ = std::fs::remove_file(log.with_file_name("index.ckpt"));
    }
    std::fs::write(dir.join("BOOT_ID"), "a-boot-before-the-crash\n").unwrap();
    procs.restart_backend(VICTIM);

    // Reads while it resyncs, and after it is a replica of its ranges again.
    let read_all = |what: &str| {
        rt.block_on(async {
            for i in 0..KEYS {
                let got = client.get(&key(i)).await.expect("get");
                assert_eq!(
                    got.map(|item| item.value).as_deref(),
                    Some(&b"second"[..]),
                    "{what}: key-{i} reads an older value than the chain acknowledged"
                );
            }
        })
    };
    read_all("right after the restart");
    procs.wait_config("the restarted back-end back in its chains", |c| {
        c.ranges.iter().all(|r| r.syncing.is_empty()) && c.ranges.iter().any(|r| r.tail() == Some(VICTIM))
    });
    std::thread::sleep(Duration::from_millis(500));
    read_all("after it rejoined its chains");
}
