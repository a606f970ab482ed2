//! `fawn bench report`: renders the tables of `docs/BENCHMARKS.md` from the JSON result lines kept
//! in `docs/results/`, so that the results document cannot drift from the runs it quotes.
//!
//! A generated table sits between two marker lines of the document:
//!
//! ```text
//! <!-- report: TABLE results/full/results.jsonl -->
//! | ... generated ... |
//! <!-- /report -->
//! ```
//!
//! `TABLE` names one of [`TABLES`]; the path is relative to the document. `fawn bench report`
//! rewrites every block in place; `--check` only compares and fails on the first stale block, which
//! is how the test suite keeps the committed document honest. Everything outside the markers
//! (the prose, the commands, the commits) is left alone.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

const BLOCK_START: &str = "<!-- report:";
const BLOCK_END: &str = "<!-- /report -->";

/// Arguments of `fawn bench report`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReportArgs {
    /// The results document whose marked tables are regenerated.
    #[arg(long, default_value = "docs/BENCHMARKS.md")]
    pub doc: PathBuf,
    /// Compare only: exit with an error naming the first table that differs from its results.
    #[arg(long)]
    pub check: bool,
}

/// Regenerates (or with `--check`, verifies) every marked table of the document.
pub fn run(args: &ReportArgs) -> Result<()> {
    let text =
        std::fs::read_to_string(&args.doc).with_context(|| format!("reading {}", args.doc.display()))?;
    let base = args.doc.parent().unwrap_or(Path::new("."));
    let rendered = render_document(&text, base)?;
    if rendered == text {
        eprintln!("{}: every generated table is current", args.doc.display());
        return Ok(());
    }
    if args.check {
        bail!("{} is stale: run `fawn bench report --doc {}`", args.doc.display(), args.doc.display());
    }
    std::fs::write(&args.doc, rendered).with_context(|| format!("writing {}", args.doc.display()))?;
    eprintln!("{}: generated tables rewritten", args.doc.display());
    Ok(())
}

/// The document with every marked block's body replaced by its table, rendered from the results
/// file the marker names (relative to `base`).
pub fn render_document(text: &str, base: &Path) -> Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut lines = text.split_inclusive('\n').enumerate();
    while let Some((number, line)) = lines.next() {
        out.push_str(line);
        let Some(spec) = line.trim().strip_prefix(BLOCK_START) else { continue };
        let (table, file) =
            parse_marker(spec).with_context(|| format!("line {}: bad report marker", number + 1))?;
        let end = loop {
            let Some((_, skipped)) = lines.next() else {
                bail!("line {}: report block without `{BLOCK_END}`", number + 1)
            };
            if skipped.trim() == BLOCK_END {
                break skipped;
            }
        };
        let results = Results::load(&base.join(file))?;
        let body = render_table(table, &results)
            .with_context(|| format!("line {}: table `{table}` from {file}", number + 1))?;
        out.push_str(&body);
        out.push_str(end);
    }
    Ok(out)
}

fn parse_marker(spec: &str) -> Result<(&str, &str)> {
    let spec = spec.trim().strip_suffix("-->").context("missing `-->`")?;
    let mut words = spec.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some(table), Some(file), None) => Ok((table, file)),
        _ => bail!("expected `<!-- report: TABLE FILE -->`"),
    }
}

/// The tables the document may ask for, by name.
pub const TABLES: &[&str] = &["cluster-ops", "put-replicas", "vs-memcached", "fig10", "table3"];

fn render_table(name: &str, results: &Results) -> Result<String> {
    match name {
        "cluster-ops" => cluster_ops(results),
        "put-replicas" => put_replicas(results),
        "vs-memcached" => vs_memcached(results),
        "fig10" => fig10(results),
        "table3" => table3(results),
        _ => bail!("unknown table (known: {})", TABLES.join(", ")),
    }
}

/// The JSON result lines of one run, keyed by (scenario, system, metric). A key measured twice
/// keeps its last value, as a re-run appended to the same file supersedes the earlier one.
pub struct Results {
    path: PathBuf,
    values: HashMap<(String, String, String), f64>,
}

#[derive(serde::Deserialize)]
struct Line {
    scenario: String,
    system: String,
    metric: String,
    value: f64,
}

impl Results {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut values = HashMap::new();
        for (number, line) in text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()) {
            let line: Line =
                serde_json::from_str(line).with_context(|| format!("{}:{}", path.display(), number + 1))?;
            values.insert((line.scenario, line.system, line.metric), line.value);
        }
        Ok(Self { path: path.to_owned(), values })
    }

    fn get(&self, scenario: &str, system: &str, metric: &str) -> Result<f64> {
        let key = (scenario.to_owned(), system.to_owned(), metric.to_owned());
        self.values
            .get(&key)
            .copied()
            .with_context(|| format!("{} has no {scenario} / {system} / {metric}", self.path.display()))
    }
}

/// Operations per second (or per CPU-second) with thousands separators.
fn count(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A latency in microseconds, to three significant digits in µs or ms.
fn latency(us: f64) -> String {
    match us {
        us if us < 1_000.0 => format!("{us:.0} µs"),
        us if us < 10_000.0 => format!("{:.2} ms", us / 1_000.0),
        us if us < 100_000.0 => format!("{:.1} ms", us / 1_000.0),
        us => format!("{:.0} ms", us / 1_000.0),
    }
}

fn ratio(value: f64) -> String {
    format!("{value:.2}")
}

fn header(out: &mut String, columns: &[&str]) {
    let _ = writeln!(out, "| {} |", columns.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(columns.len()));
}

fn row(out: &mut String, cells: &[String]) {
    let _ = writeln!(out, "| {} |", cells.join(" | "));
}

const VALUE_SIZES: [(u32, &str); 2] = [(256, "256 B"), (1024, "1 KiB")];

/// `fawn bench cluster`: gets and puts at 64 connections over both client protocols.
fn cluster_ops(results: &Results) -> Result<String> {
    let mut out = String::new();
    header(&mut out, &["", "ops/s", "p50", "p99", "p99.9", "ops per CPU-s"]);
    for (op, prefix) in [("get", "get"), ("put", "set")] {
        for (size, size_label) in VALUE_SIZES {
            for (protocol, system, protocol_label) in
                [("memcached-protocol", "fawn", "memcached protocol"), ("native", "fawn-native", "native")]
            {
                let scenario = format!("cluster/{op}/v{size}/c64/{protocol}");
                let metric = |name: &str| results.get(&scenario, system, name);
                row(
                    &mut out,
                    &[
                        format!("{op} {size_label}, {protocol_label}"),
                        count(metric("ops_per_s")?),
                        latency(metric(&format!("{prefix}_p50_us"))?),
                        latency(metric(&format!("{prefix}_p99_us"))?),
                        latency(metric(&format!("{prefix}_p999_us"))?),
                        count(metric("ops_per_cpu_s")?),
                    ],
                );
            }
        }
    }
    Ok(out)
}

/// Put latency and rate with one and with three replicas, at 1 and 32 connections.
fn put_replicas(results: &Results) -> Result<String> {
    let mut out = String::new();
    header(&mut out, &["", "R = 1", "R = 3", "R = 3 / R = 1"]);
    for connections in [1, 32] {
        let metric = |replicas: u32, name: &str| {
            results.get(&format!("cluster/put-replicas/c{connections}/r{replicas}"), "fawn", name)
        };
        let label =
            if connections == 1 { "1 connection".to_owned() } else { format!("{connections} connections") };
        let (p50_1, p50_3) = (metric(1, "set_p50_us")?, metric(3, "set_p50_us")?);
        let (p99_1, p99_3) = (metric(1, "set_p99_us")?, metric(3, "set_p99_us")?);
        row(
            &mut out,
            &[
                format!("{label}: put p50 / p99"),
                format!("{} / {}", latency(p50_1), latency(p99_1)),
                format!("{} / {}", latency(p50_3), latency(p99_3)),
                format!("**{}×** p50, {}× p99", ratio(p50_3 / p50_1), ratio(p99_3 / p99_1)),
            ],
        );
        let (rate_1, rate_3) = (metric(1, "ops_per_s")?, metric(3, "ops_per_s")?);
        row(&mut out, &[format!("{label}: puts/s"), count(rate_1), count(rate_3), ratio(rate_3 / rate_1)]);
    }
    Ok(out)
}

/// GET/SET against `memcached -t 1`, FAWN with every key cached and with the cache off.
fn vs_memcached(results: &Results) -> Result<String> {
    let mut out = String::new();
    header(
        &mut out,
        &[
            "op",
            "value",
            "pipeline",
            "memcached ops/s",
            "FAWN cache hit: ops/s (× memcached; per CPU-s)",
            "FAWN cache off: ops/s (× memcached; per CPU-s)",
        ],
    );
    for op in ["get", "set"] {
        for (size, size_label) in VALUE_SIZES {
            for pipeline in [1, 16] {
                let point = format!("cluster/vs-memcached/{op}/v{size}/c32/p{pipeline}");
                let memcached = results.get(&format!("{point}/memcached"), "memcached", "ops_per_s")?;
                let fawn = |system: &str| -> Result<String> {
                    let metric = |name: &str| results.get(&format!("{point}/fawn"), system, name);
                    let (rate, vs, per_cpu) = (
                        metric("ops_per_s")?,
                        metric("ops_per_s_vs_memcached")?,
                        metric("ops_per_cpu_s_vs_memcached")?,
                    );
                    let highlight = op == "get" && system == "fawn-cache-hit";
                    let vs = if highlight { format!("**{}**", ratio(vs)) } else { ratio(vs) };
                    Ok(format!("{} ({vs}; {})", count(rate), ratio(per_cpu)))
                };
                row(
                    &mut out,
                    &[
                        op.to_owned(),
                        size_label.to_owned(),
                        pipeline.to_string(),
                        count(memcached),
                        fawn("fawn-cache-hit")?,
                        fawn("fawn-cache-miss")?,
                    ],
                );
            }
        }
    }
    Ok(out)
}

const PUT_PERCENTS: [u32; 6] = [0, 10, 25, 50, 75, 100];

/// Figure 10: throughput as the fraction of puts grows, FAWN beside memcached.
fn fig10(results: &Results) -> Result<String> {
    let mut out = String::new();
    let percents: Vec<String> = PUT_PERCENTS.iter().map(|percent| format!("{percent} %")).collect();
    let mut columns = vec!["puts"];
    columns.extend(percents.iter().map(String::as_str));
    header(&mut out, &columns);
    let series = |system: &str, metric: &str| -> Result<Vec<f64>> {
        PUT_PERCENTS
            .iter()
            .map(|percent| results.get(&format!("fig10/put{percent}"), system, metric))
            .collect()
    };
    let (fawn, memcached) = (series("fawn", "ops_per_s")?, series("memcached", "ops_per_s")?);
    let line = |label: &str, values: &[f64], format: fn(f64) -> String| {
        std::iter::once(label.to_owned()).chain(values.iter().map(|value| format(*value))).collect::<Vec<_>>()
    };
    row(&mut out, &line("FAWN ops/s", &fawn, count));
    row(&mut out, &line("memcached ops/s", &memcached, count));
    let ratios: Vec<f64> = fawn.iter().zip(&memcached).map(|(fawn, memcached)| fawn / memcached).collect();
    row(&mut out, &line("**FAWN / memcached**", &ratios, ratio));
    row(&mut out, &line("FAWN ops per CPU-s", &series("fawn", "ops_per_cpu_s")?, count));
    row(&mut out, &line("memcached ops per CPU-s", &series("memcached", "ops_per_cpu_s")?, count));
    Ok(out)
}

/// Table 3 analogue: operations per CPU-second of the server processes.
fn table3(results: &Results) -> Result<String> {
    let mut out = String::new();
    header(
        &mut out,
        &[
            "workload",
            "FAWN cluster",
            "memcached -t 1",
            "Redis",
            "**FAWN / memcached**",
            "embedded FAWN-DS",
            "embedded RocksDB",
        ],
    );
    for (gets, gets_label) in [(100, "gets"), (90, "90 % gets")] {
        for (size, size_label) in VALUE_SIZES {
            let scenario = format!("table3/g{gets}/v{size}");
            let per_cpu = |system: &str| results.get(&scenario, system, "ops_per_cpu_s");
            let embedded = |system: &str| per_cpu(system).map(count).unwrap_or_default();
            let (fawn, memcached) = (per_cpu("fawn")?, per_cpu("memcached")?);
            row(
                &mut out,
                &[
                    format!("{gets_label}, {size_label}"),
                    count(fawn),
                    count(memcached),
                    count(per_cpu("redis")?),
                    format!("**{}**", ratio(fawn / memcached)),
                    embedded("fawn-ds"),
                    embedded("rocksdb"),
                ],
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_formatted_for_reading() {
        assert_eq!(count(0.4), "0");
        assert_eq!(count(999.0), "999");
        assert_eq!(count(124_131.625), "124,132");
        assert_eq!(count(1_234_567.0), "1,234,567");
        assert_eq!(latency(516.863), "517 µs");
        assert_eq!(latency(1_860.607), "1.86 ms");
        assert_eq!(latency(18_874.367), "18.9 ms");
        assert_eq!(latency(491_000.0), "491 ms");
        assert_eq!(ratio(0.753), "0.75");
    }

    #[test]
    fn a_block_is_replaced_and_the_prose_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut lines = String::new();
        for percent in PUT_PERCENTS {
            for (system, rate) in [("fawn", 1_000.0), ("memcached", 4_000.0)] {
                for metric in ["ops_per_s", "ops_per_cpu_s"] {
                    let _ = writeln!(
                        lines,
                        r#"{{"scenario":"fig10/put{percent}","system":"{system}","metric":"{metric}","value":{rate},"unit":"ops/s","params":{{}}}}"#
                    );
                }
            }
        }
        std::fs::write(dir.path().join("r.jsonl"), lines).expect("write results");
        let doc = "# Title\nprose\n<!-- report: fig10 r.jsonl -->\n| stale |\n<!-- /report -->\nmore prose\n";
        let rendered = render_document(doc, dir.path()).expect("render");
        assert!(rendered.starts_with("# Title\nprose\n<!-- report: fig10 r.jsonl -->\n| puts | 0 % |"));
        assert!(rendered.contains("| FAWN ops/s | 1,000 | 1,000 |"));
        assert!(rendered.contains("| **FAWN / memcached** | 0.25 |"));
        assert!(rendered.ends_with("<!-- /report -->\nmore prose\n"));
        assert!(!rendered.contains("stale"));
        assert_eq!(render_document(&rendered, dir.path()).expect("render again"), rendered);
    }

    #[test]
    fn a_missing_measurement_or_marker_end_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("r.jsonl"), "").expect("write results");
        let missing = render_document("<!-- report: fig10 r.jsonl -->\n<!-- /report -->\n", dir.path());
        assert!(format!("{:#}", missing.expect_err("no data")).contains("fig10/put0"));
        let unterminated = render_document("<!-- report: fig10 r.jsonl -->\n| x |\n", dir.path());
        assert!(format!("{:#}", unterminated.expect_err("no end")).contains("without"));
        let unknown = render_document("<!-- report: nope r.jsonl -->\n<!-- /report -->\n", dir.path());
        assert!(format!("{:#}", unknown.expect_err("unknown table")).contains("unknown table"));
    }
}
