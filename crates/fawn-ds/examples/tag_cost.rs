//! The cost of caller tags (record format 3) on the append path: the same records written
//! without a tag and with tags of FAWN-KV's sizes (17 bytes: a set's request id and outcome;
//! 25: an incr's), side by side in one process, alternating, several rounds (Never: the
//! page-cache speed, i.e. the CPU cost of encoding, checking and appending). Reports the
//! process CPU time per record (steadier than the rate on a shared machine) and the rate.
//! `cargo run --release -p fawn-ds --example tag_cost -- [N] [value_bytes] [batch_records] [rounds] [dir]`

use std::time::Instant;

use fawn_ds::{BatchOp, DataStore, Meta, Options, SyncPolicy};

const TAG_SIZES: [usize; 3] = [0, 17, 25];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: u64| -> Result<u64, std::num::ParseIntError> {
        args.get(i).map(|s| s.parse()).transpose().map(|v| v.unwrap_or(default))
    };
    let n = arg(1, 500_000)?;
    let vlen = arg(2, 256)? as usize;
    let batch = arg(3, 64)?.max(1);
    let rounds = arg(4, 3)?;
    let dir = std::path::PathBuf::from(args.get(5).cloned().unwrap_or_else(|| "/tmp/fawn-tag-cost".into()));
    let keys: Vec<Vec<u8>> = (0..n).map(|i| format!("user:{i:012}").into_bytes()).collect();
    let tags: Vec<[u8; 25]> = (0..n).map(tag).collect();
    let value = vec![7u8; vlen];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); TAG_SIZES.len()];
    let mut cpu_ns: Vec<Vec<f64>> = vec![Vec::new(); TAG_SIZES.len()];
    let mut bytes_per_record = [0u64; TAG_SIZES.len()];
    for round in 0..rounds {
        for j in 0..TAG_SIZES.len() {
            // Alternate the order, so that no size always runs first.
            let j = if round % 2 == 0 { j } else { TAG_SIZES.len() - 1 - j };
            let _ = std::fs::remove_dir_all(&dir);
            let opts = Options {
                sync: SyncPolicy::Never,
                checkpoint_every_bytes: 0,
                auto_compact: false,
                expected_keys: n,
                ..Options::default()
            };
            let ds = DataStore::open(&dir, opts)?;
            let t = Instant::now();
            let c = cpu_seconds();
            for first in (0..n).step_by(batch as usize) {
                let ops: Vec<BatchOp<'_>> = (first..(first + batch).min(n))
                    .map(|i| {
                        let i = i as usize;
                        let op =
                            BatchOp::put(&keys[i], &value, Meta { seq: i as u64 + 1, ..Meta::default() });
                        op.with_tag(&tags[i][..TAG_SIZES[j]])
                    })
                    .collect();
                ds.write_batch(&ops)?;
            }
            rates[j].push(n as f64 / t.elapsed().as_secs_f64());
            cpu_ns[j].push((cpu_seconds() - c) * 1e9 / n as f64);
            bytes_per_record[j] = ds.stats().log_bytes / n;
            ds.close()?;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let base = median(&mut rates[0].clone());
    let base_cpu = median(&mut cpu_ns[0].clone());
    println!("n={n} value={vlen} batch={batch} rounds={rounds} (medians)");
    for (j, size) in TAG_SIZES.iter().enumerate() {
        let (m, c) = (median(&mut rates[j]), median(&mut cpu_ns[j]));
        println!(
            "tag {size:>2} B: {c:>6.0} ns CPU/record ({:.3} of untagged), {m:>9.0} records/s ({:.3}), {} log bytes/record (CPU ns per round: {:?})",
            c / base_cpu,
            m / base,
            bytes_per_record[j],
            cpu_ns[j].iter().map(|r| *r as u64).collect::<Vec<_>>(),
        );
    }
    Ok(())
}

/// A tag as FAWN-KV writes one: a client id, a request seq, an outcome code, a value.
fn tag(i: u64) -> [u8; 25] {
    let mut t = [0u8; 25];
    t[..8].copy_from_slice(&0x5EED_0123_4567_89ABu64.to_le_bytes());
    t[8..16].copy_from_slice(&i.to_le_bytes());
    t[16] = 0x80;
    t[17..].copy_from_slice(&(i * 3).to_le_bytes());
    t
}

/// CPU time used by this process so far (user + system, all threads).
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
