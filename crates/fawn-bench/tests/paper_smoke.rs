//! Smoke test of `fawn bench paper` with tiny sizes: every part runs (device, FAWN-DS, files,
//! clusters of real `fawn` processes, a join, a frozen back-end, memcached and Redis) and every
//! plot is written. memcached, redis-server and the `fawn` binary must be present (CI installs
//! the first two and builds the workspace first): a missing one fails the test, loudly.

use clap::Parser;
use serde_json::Value;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: fawn_bench::BenchArgs,
}

#[test]
fn tiny_paper_run_writes_every_figure() {
    let bin = fawn_bench::launch::find_fawn_bin(None).unwrap();
    assert!(
        bin.is_file(),
        "the `fawn` binary is needed ({} not found): cargo build -p fawn first, or set FAWN_BIN",
        bin.display()
    );
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = dir.path().join("results");
    let argv = [
        "bench",
        "--quiet",
        "paper",
        "--smoke",
        "--out-dir",
        out.to_str().unwrap(),
        "--dir",
        dir.path().to_str().unwrap(),
    ];
    fawn_bench::run(Cli::parse_from(argv).bench)
        .unwrap_or_else(|e| panic!("fawn bench paper --smoke: {e:#}"));
    for f in [
        "table1_device.svg",
        "table2_reads_vs_size.svg",
        "bulk_store.svg",
        "fig09_semi_random.svg",
        "fig10_put_fraction.svg",
        "fig11_get_rate.svg",
        "fig13_join.svg",
        "fig15_latency_cdf.svg",
        "failure.svg",
        "table3_qpcs.svg",
        "distance.svg",
    ] {
        let svg = std::fs::read_to_string(out.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(svg.starts_with("<svg") && (svg.contains("polyline") || svg.contains("<rect x=")), "{f}");
    }
    let text = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for l in &lines {
        for field in ["scenario", "system", "metric", "unit"] {
            assert!(l[field].is_string(), "{field} missing in {l}");
        }
        assert!(l["value"].is_number(), "value missing in {l}");
    }
    let has = |sys: &str, metric: &str| lines.iter().any(|l| l["system"] == sys && l["metric"] == metric);
    for (sys, m) in [
        ("fawn", "time_to_detect_s"),
        ("fawn", "time_to_rereplicate_s"),
        ("fawn", "join_duration_s"),
        ("fawn", "timeline_ops_per_s"),
        ("memcached", "ops_per_cpu_s"),
        ("redis", "ops_per_cpu_s"),
        ("fawn-ds", "lookup_ops_per_s"),
        ("raw", "semi_random_write_mb_per_s"),
    ] {
        assert!(has(sys, m), "no {sys} {m} in the results");
    }
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), lines.len() + 1);
}
