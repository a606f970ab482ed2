//! Smoke test of `fawn bench`: tiny FAWN-DS and device benches, and a tiny memcached bench against a
//! memcached this test starts. memcached must be installed (CI installs it): a missing binary
//! fails the test rather than skipping it, so the benchmark cannot silently rot.

use std::path::Path;

use clap::Parser;
use serde_json::Value;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: fawn_bench::BenchArgs,
}

/// Run `fawn bench <args>` writing results to `out` (JSON lines) and `csv`.
fn bench(args: &[&str], out: &Path, csv: &Path) {
    let mut argv = vec!["bench", "--quiet", "--out", out.to_str().unwrap(), "--csv", csv.to_str().unwrap()];
    argv.extend_from_slice(args);
    fawn_bench::run(Cli::parse_from(argv).bench).unwrap_or_else(|e| panic!("fawn bench {args:?}: {e:#}"));
}

fn lines(out: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(out).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The value of the last line with this system and metric.
fn value(lines: &[Value], system: &str, metric: &str) -> f64 {
    lines
        .iter()
        .rev()
        .find(|l| l["system"] == system && l["metric"] == metric)
        .and_then(|l| l["value"].as_f64())
        .unwrap_or_else(|| panic!("no {system} {metric} in results"))
}

fn assert_schema(lines: &[Value]) {
    assert!(!lines.is_empty());
    for l in lines {
        for field in ["scenario", "system", "metric", "unit"] {
            assert!(l[field].is_string(), "{field} missing in {l}");
        }
        assert!(l["value"].is_number(), "value missing in {l}");
    }
}

#[test]
fn tiny_ds_bench() {
    // Under target/, not /tmp: O_DIRECT needs a real file system (tmpfs refuses it).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (out, csv) = (dir.path().join("ds.jsonl"), dir.path().join("ds.csv"));
    let d = dir.path().to_str().unwrap();
    bench(
        &[
            "ds",
            "--dir",
            d,
            "--keys",
            "3000",
            "--value-size",
            "64,256",
            "--duration",
            "0.2",
            "--device-reads",
            "300",
        ],
        &out,
        &csv,
    );
    let l = lines(&out);
    assert_schema(&l);
    assert!(value(&l, "fawn-ds", "lookup_ops_per_s") > 0.0);
    assert!(value(&l, "fawn-ds", "bulk_insert_mb_per_s") > 0.0);
    assert!(value(&l, "raw", "direct_4k_read_ops_per_s") > 0.0);
    assert!(value(&l, "fawn-ds", "index_bytes_per_key") > 0.0);
    assert!(value(&l, "fawn-ds", "restart_with_checkpoint_s") > 0.0);
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    assert!(csv_text.starts_with("scenario,system,metric,value,unit"));
    assert_eq!(csv_text.lines().count(), l.len() + 1);
    // The work directory is removed afterwards.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("fawn-bench-ds-"))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn tiny_device_bench() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (out, csv) = (dir.path().join("dev.jsonl"), dir.path().join("dev.csv"));
    let d = dir.path().to_str().unwrap();
    bench(&["device", "--dir", d, "--file-mb", "8", "--threads", "1,2", "--count", "200"], &out, &csv);
    let l = lines(&out);
    assert_schema(&l);
    for m in ["seq_write_mb_per_s", "seq_read_mb_per_s", "rand_read_4k_iops_t2", "rand_write_4k_iops_t1"] {
        assert!(value(&l, "raw", m) > 0.0, "{m}");
    }
}

#[test]
fn tiny_files_bench() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (out, csv) = (dir.path().join("files.jsonl"), dir.path().join("files.csv"));
    let d = dir.path().to_str().unwrap();
    bench(&["files", "--dir", d, "--files", "1,8", "--mb", "2"], &out, &csv);
    let l = lines(&out);
    assert_schema(&l);
    let points = l.iter().filter(|x| x["metric"] == "semi_random_write_vs_raw").count();
    assert_eq!(points, 2);
}

#[test]
fn tiny_memcached_bench() {
    let server = fawn_bench::servers::start_memcached("memcached", 1, 64)
        .unwrap_or_else(|e| panic!("memcached is required for this test: {e:#}"));
    let dir = tempfile::tempdir().unwrap();
    let (out, csv) = (dir.path().join("mc.jsonl"), dir.path().join("mc.csv"));
    let target = server.addr.to_string();
    let common = ["--keys", "2000", "--duration", "0.5", "--warmup", "0.1", "--connections", "4"];
    let mut closed = vec!["memcached", "--target", &target, "--pipeline", "4", "--distribution", "zipfian"];
    closed.extend_from_slice(&common);
    bench(&closed, &out, &csv);
    let mut open = vec!["memcached", "--target", &target, "--rate", "2000", "--get-ratio", "0.5,1"];
    open.extend_from_slice(&common);
    bench(&open, &out, &csv);

    let l = lines(&out);
    assert_schema(&l);
    let runs: Vec<_> = l.iter().filter(|x| x["metric"] == "ops_per_s").collect();
    assert_eq!(runs.len(), 3, "one closed-loop and two open-loop runs");
    for r in &runs {
        assert!(r["value"].as_f64().unwrap() > 0.0, "{r}");
    }
    for x in l.iter().filter(|x| x["metric"] == "errors" || x["metric"] == "get_hit_ratio") {
        let want = if x["metric"] == "errors" { 0.0 } else { 1.0 };
        assert_eq!(x["value"].as_f64(), Some(want), "{x}");
    }
    // Open loop at 2000 ops/s for 0.5 s: the offered rate is what was achieved.
    let open_rate = runs[2]["value"].as_f64().unwrap();
    assert!((1500.0..2500.0).contains(&open_rate), "open-loop rate {open_rate}");
    assert!(value(&l, "memcached", "get_p99_us") > 0.0);
}

#[test]
fn tiny_peers_bench_starts_memcached_itself() {
    let dir = tempfile::tempdir().unwrap();
    let (out, csv) = (dir.path().join("peers.jsonl"), dir.path().join("peers.csv"));
    let args =
        ["peers", "--no-redis", "--repeat", "2", "--keys", "500", "--duration", "0.3", "--warmup", "0"];
    bench(&args, &out, &csv);
    let l = lines(&out);
    assert_schema(&l);
    assert_eq!(value(&l, "memcached", "runs"), 2.0);
    assert!(value(&l, "memcached", "ops_per_s_min") <= value(&l, "memcached", "ops_per_s_max"));
}

#[test]
fn refuses_remote_targets() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["bench", "--quiet", "memcached", "--target", "192.0.2.1:11211", "--duration", "0.1"];
    let err = fawn_bench::run(Cli::parse_from(args).bench).unwrap_err();
    assert!(err.to_string().contains("--allow-remote"), "{err}");
    drop(dir);
}
