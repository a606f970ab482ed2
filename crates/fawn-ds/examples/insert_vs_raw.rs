//! Quick check of the append path against raw `pwrite` of the same record sizes (Never).
//! `cargo run --release -p fawn-ds --example insert_vs_raw -- [N] [value_bytes] [dir]`

use std::os::unix::fs::FileExt;
use std::time::Instant;

use fawn_ds::{DataStore, Meta, Options, SyncPolicy};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(1_000_000);
    let vlen: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(256);
    let dir = std::path::PathBuf::from(args.get(3).cloned().unwrap_or_else(|| "/tmp/fawn-ivr".into()));
    let _ = std::fs::remove_dir_all(&dir);
    let opts = Options {
        sync: SyncPolicy::Never,
        checkpoint_every_bytes: 0,
        expected_keys: n,
        ..Options::default()
    };
    let ds = DataStore::open(&dir.join("ds"), opts)?;
    let keys: Vec<Vec<u8>> = (0..n).map(|i| format!("user:{i:012}").into_bytes()).collect();
    let value = vec![7u8; vlen];
    let t = Instant::now();
    for (i, k) in keys.iter().enumerate() {
        ds.store(k, &value, Meta { seq: i as u64 + 1, ..Meta::default() })?;
    }
    let ds_s = t.elapsed().as_secs_f64();
    let bytes = ds.stats().log_bytes;
    let rec = (bytes / n) as usize;
    let raw = std::fs::File::create(dir.join("raw"))?;
    let buf = vec![1u8; rec];
    let t = Instant::now();
    for i in 0..n {
        raw.write_all_at(&buf, i * rec as u64)?;
    }
    let raw_s = t.elapsed().as_secs_f64();
    println!(
        "n={n} value={vlen} record={rec}: fawn-ds {:.0} MB/s ({:.0} ops/s), raw {:.0} MB/s, ratio {:.3}",
        bytes as f64 / 1e6 / ds_s,
        n as f64 / ds_s,
        (rec as u64 * n) as f64 / 1e6 / raw_s,
        raw_s / ds_s
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
