//! Guards index growth over a log with a damaged record inside the checkpointed region
//! (bit rot is not detected at open: the checkpoint covers that region unread). The growth
//! scan must step past the bad record and place every entry after it, as recovery does:
//! giving up the rest of the log stashed nearly every entry (each then matched on its
//! fragment alone, every lookup comparing against all of them), and since a big stash starts
//! growth again, the table kept doubling. Only the entries whose own records are damaged
//! may be left unplaced; every other key reads back. With more damaged live records than
//! the stash tolerates (16), the table must still stay sized to the keys: growing again
//! cannot place entries whose records are unreadable.

use std::os::unix::fs::FileExt;

use fawn_ds::{DataStore, Error, Meta, Options, SyncPolicy};

fn opts() -> Options {
    Options {
        sync: SyncPolicy::Never,
        checkpoint_every_bytes: 0,
        auto_compact: false,
        background_growth: false,
        hot_cold: false,
        ..Options::default()
    }
}

fn key(i: u64) -> Vec<u8> {
    format!("k-{i:07}").into_bytes()
}

fn value(i: u64) -> Vec<u8> {
    format!("value of {i} {}", "x".repeat((i % 50) as usize)).into_bytes()
}

#[test]
fn growth_scan_steps_past_a_damaged_record() {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();
    const FIRST: u64 = 3000;
    const MORE: u64 = 30_000;
    // Keys whose live record gets damaged.
    let damaged = 100..120u64;
    let (garbage_at, live_at) = {
        let ds = DataStore::open(dir.path(), opts()).unwrap();
        for i in 0..FIRST {
            ds.store(&key(i), &value(i), Meta { seq: i + 1, ..Meta::default() }).unwrap();
        }
        // Key 5's first record becomes garbage; key 7's stays live.
        ds.store(&key(5), &value(5), Meta { seq: FIRST + 1, ..Meta::default() }).unwrap();
        let mut garbage_at = None;
        let mut live_at = Vec::new();
        for r in ds.iter() {
            let r = r.unwrap();
            if r.key == key(5) && garbage_at.is_none() {
                garbage_at = Some(r.offset);
            }
            if damaged.clone().any(|i| r.key == key(i)) {
                live_at.push(r.offset);
            }
        }
        ds.close().unwrap();
        (garbage_at.unwrap(), live_at)
    };
    assert_eq!(live_at.len(), damaged.clone().count());
    // Flip a byte in the value of each (the checksum no longer matches).
    let log = std::fs::OpenOptions::new().read(true).write(true).open(dir.path().join("data.log")).unwrap();
    for at in std::iter::once(garbage_at).chain(live_at) {
        let at = at + 32 + key(0).len() as u64 + 2;
        let mut b = [0u8];
        log.read_exact_at(&mut b, at).unwrap();
        log.write_all_at(&[b[0] ^ 0x5A], at).unwrap();
    }
    drop(log);
    // The background migrator finishes each migration quickly: a growth that restarted at
    // once after each one would double the table again and again.
    let ds = DataStore::open(dir.path(), Options { background_growth: true, ..opts() }).unwrap();
    assert!(ds.recovery_report().from_checkpoint, "{:?}", ds.recovery_report().checkpoint_error);
    let start_capacity = ds.stats().index_capacity;
    let mut growths = 0u64;
    let mut capacity = start_capacity;
    for i in FIRST..FIRST + MORE {
        ds.store(&key(i), &value(i), Meta { seq: i + 2, ..Meta::default() }).unwrap();
        let c = ds.stats().index_capacity;
        growths += (c > capacity) as u64;
        capacity = c;
        // A doubling happens at 95 % load, so the table holds at least 47.5 % of its slots.
        assert!(
            c <= start_capacity.max(((i + 1) as f64 / 0.45) as u64),
            "index of {c} slots for {} keys after {growths} growths: it kept growing",
            i + 1
        );
        if i % 64 == 0 {
            // Give the migrator time to run (on a loaded machine too).
            std::thread::yield_now();
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while ds.stats().index_migrating {
        assert!(std::time::Instant::now() < deadline, "the migration did not finish");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let st = ds.stats();
    assert!(growths >= 3, "the index grew only {growths} times");
    // Only the damaged keys' entries cannot be placed (again at each growth).
    let per_growth = damaged.clone().count() as u64;
    assert!(
        st.growth_unplaced <= per_growth * growths,
        "{} entries left unplaced over {growths} growths",
        st.growth_unplaced
    );
    let keys = FIRST + MORE;
    eprintln!(
        "{growths} growths, {} slots for {keys} keys, {} entries unplaced",
        st.index_capacity, st.growth_unplaced
    );
    assert_eq!(st.live_keys, keys);
    for i in 0..keys {
        let got = ds.lookup(&key(i));
        if damaged.contains(&i) {
            assert!(matches!(got, Err(Error::Corrupt { .. })), "key {i}: {got:?}");
        } else {
            assert_eq!(got.unwrap().map(|e| e.value), Some(value(i)), "key {i}");
        }
    }
}
