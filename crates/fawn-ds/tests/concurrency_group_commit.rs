//! Guards concurrency: writer threads under `Always` share fdatasyncs (group commit: fewer
//! fsyncs than writes), reader threads running at the same time only ever see complete,
//! correct values, and a reader never waits for an fsync in progress.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fawn_ds::{DataStore, FaultInjector, IoOp, Meta, Options, SyncPolicy};

const WRITERS: u64 = 8;
const READERS: u64 = 4;
const PER_WRITER: u64 = 150;

/// A value that names its key and version, so a reader can check what it got.
fn value(key: u64, version: u64) -> Vec<u8> {
    let mut v = format!("{key}:{version}:").into_bytes();
    v.resize(100 + (key * 31 + version * 7) as usize % 900, (key ^ version) as u8);
    v
}

fn parse(v: &[u8]) -> Option<(u64, u64)> {
    let s = std::str::from_utf8(v.split(|&b| b == b':').next()?).ok()?;
    let rest = &v[s.len() + 1..];
    let ver = std::str::from_utf8(rest.split(|&b| b == b':').next()?).ok()?;
    Some((s.parse().ok()?, ver.parse().ok()?))
}

#[test]
fn concurrent_readers_and_always_writers_share_fsyncs() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options { sync: SyncPolicy::Always, ..Options::default() };
    let ds = Arc::new(DataStore::open(dir.path(), opts).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let (ds, stop, reads) = (ds.clone(), stop.clone(), reads.clone());
            std::thread::spawn(move || {
                let mut i = r;
                while !stop.load(Ordering::Relaxed) {
                    let key = i % (WRITERS * 10);
                    if let Some(e) = ds.lookup(format!("key{key}").as_bytes()).unwrap() {
                        let (k, ver) = parse(&e.value).expect("torn value");
                        assert_eq!(k, key);
                        assert_eq!(e.value, value(key, ver), "wrong bytes for {key}:{ver}");
                        assert_eq!(e.meta.seq, ver);
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                    i += 7;
                }
            })
        })
        .collect();
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let ds = ds.clone();
            std::thread::spawn(move || {
                for n in 0..PER_WRITER {
                    // Writer w owns keys ≡ w (mod WRITERS): versions per key only grow.
                    let key = w + WRITERS * (n % 10);
                    let ver = n + 1;
                    ds.store(
                        format!("key{key}").as_bytes(),
                        &value(key, ver),
                        Meta { seq: ver, ..Meta::default() },
                    )
                    .unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    let st = ds.stats();
    let writes = WRITERS * PER_WRITER;
    eprintln!(
        "{writes} Always writes, {} fsyncs, {} concurrent reads",
        st.fsyncs,
        reads.load(Ordering::Relaxed)
    );
    assert!(st.fsyncs < writes, "no group commit: {} fsyncs for {writes} writes", st.fsyncs);
    assert_eq!(st.live_keys, WRITERS * 10);
}

#[test]
fn readers_do_not_wait_for_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let slow_sync = Arc::new(AtomicBool::new(false));
    let flag = slow_sync.clone();
    let faults = FaultInjector::new(move |op| {
        if op == IoOp::Sync && flag.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(500));
        }
        None
    });
    let opts = Options { sync: SyncPolicy::Always, faults, ..Options::default() };
    let ds = Arc::new(DataStore::open(dir.path(), opts).unwrap());
    ds.store(b"k", b"v1", Meta::default()).unwrap();
    slow_sync.store(true, Ordering::Relaxed);
    let w = {
        let ds = ds.clone();
        std::thread::spawn(move || ds.store(b"other", b"x", Meta::default()).unwrap())
    };
    std::thread::sleep(Duration::from_millis(100)); // the writer is now inside fdatasync
    let t = Instant::now();
    for _ in 0..100 {
        assert_eq!(ds.lookup(b"k").unwrap().unwrap().value, b"v1");
    }
    let _ = ds.iter().count();
    assert!(t.elapsed() < Duration::from_millis(200), "reads waited {:?} behind an fsync", t.elapsed());
    w.join().unwrap();
}
