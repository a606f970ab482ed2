//! Measure the index at scale: stores N keys (default 10 M) with small values under
//! `SyncPolicy::Never`, then reports index DRAM per key, load, extra reads per 1,000
//! lookups, the worst growth step, and restart time with and without a checkpoint.
//!
//! `cargo run --release -p fawn-ds --example index_footprint -- [N] [presize:0|1] [dir]`

use std::time::Instant;

use fawn_ds::{DataStore, Meta, Options, SyncPolicy};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(10_000_000);
    let presize = args.get(2).map(|s| s == "1").unwrap_or(true);
    let dir = match args.get(3) {
        Some(d) => std::path::PathBuf::from(d),
        None => std::env::temp_dir().join(format!("fawn-ds-footprint-{}", std::process::id())),
    };
    let _ = std::fs::remove_dir_all(&dir);
    let opts = Options {
        sync: SyncPolicy::Never,
        checkpoint_every_bytes: 0,
        expected_keys: if presize { n } else { 0 },
        ..Options::default()
    };
    let ds = DataStore::open(&dir, opts.clone())?;
    let t = Instant::now();
    for i in 0..n {
        ds.store(
            format!("user:{i:012}").as_bytes(),
            &i.to_le_bytes(),
            Meta { seq: i + 1, ..Meta::default() },
        )?;
    }
    let insert_s = t.elapsed().as_secs_f64();
    let during = ds.stats();
    // Let a growth that started near the end finish (the background migrator does it).
    while ds.stats().index_migrating {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    println!("at end of inserts: index_bytes={} migrating={}", during.index_bytes, during.index_migrating);
    let t = Instant::now();
    for i in 0..n {
        let k = (i * 7_919) % n;
        ds.lookup(format!("user:{k:012}").as_bytes())?.ok_or("missing key")?;
    }
    let lookup_s = t.elapsed().as_secs_f64();
    let st = ds.stats();
    println!("keys={} presize={presize} insert_s={insert_s:.1} lookup_s={lookup_s:.1}", st.live_keys);
    println!(
        "index_bytes={} bytes_per_key={:.3} load={:.3} stash={} extra_reads_per_1000={:.4} growth_step_max_us={}",
        st.index_bytes,
        st.index_bytes as f64 / st.live_keys as f64,
        st.live_keys as f64 / st.index_capacity as f64,
        st.index_stash,
        st.extra_reads as f64 * 1000.0 / st.lookups as f64,
        st.growth_step_max_us
    );
    drop(ds);
    let t = Instant::now();
    let ds = DataStore::open(&dir, opts.clone())?;
    println!(
        "restart_without_checkpoint_s={:.2} replayed={}",
        t.elapsed().as_secs_f64(),
        ds.recovery_report().records_replayed
    );
    let t = Instant::now();
    ds.close()?;
    println!("checkpoint_s={:.2}", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let ds = DataStore::open(&dir, opts)?;
    println!(
        "restart_with_checkpoint_s={:.2} from_checkpoint={}",
        t.elapsed().as_secs_f64(),
        ds.recovery_report().from_checkpoint
    );
    drop(ds);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
