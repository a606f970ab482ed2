//! Result lines: JSON lines on stdout or in a file (one object per measurement) and an optional
//! CSV file.
//!
//! Every line has at least `scenario, system, metric, value, unit` (DESIGN.md §8) so scripts can
//! join runs; `params` carries the workload that produced it.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;

/// One measurement.
#[derive(Clone, Debug, Serialize)]
pub struct ResultLine {
    pub scenario: String,
    pub system: String,
    pub metric: String,
    pub value: f64,
    pub unit: String,
    /// Free-form description of the workload (a JSON object), the same for every metric of a run.
    pub params: serde_json::Value,
}

/// Where results go. Collects every line so that callers can compute ratios afterwards.
pub struct Reporter {
    /// JSON lines go here instead of stdout when set.
    out: Option<PathBuf>,
    csv: Option<PathBuf>,
    lines: Vec<ResultLine>,
}

const CSV_HEADER: &str = "scenario,system,metric,value,unit,params";

impl Reporter {
    /// A reporter that prints JSON lines to stdout, or appends them to `out` if given, and also
    /// appends to `csv` (writing the header if the file is new or empty).
    pub fn new(out: Option<PathBuf>, csv: Option<PathBuf>) -> Result<Reporter> {
        if let Some(path) = &csv {
            let mut f = open_append(path)?;
            let empty = f.metadata().map(|m| m.len() == 0).unwrap_or(true);
            if empty {
                writeln!(f, "{CSV_HEADER}").with_context(|| format!("writing {}", path.display()))?;
            }
        }
        Ok(Reporter { out, csv, lines: Vec::new() })
    }

    /// Emit one measurement: print it as a JSON line now (so a crash later loses nothing).
    pub fn emit(&mut self, line: ResultLine) -> Result<()> {
        let json = serde_json::to_string(&line).context("encoding result line")?;
        match &self.out {
            Some(path) => writeln!(open_append(path)?, "{json}")
                .with_context(|| format!("writing {}", path.display()))?,
            None => {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{json}").context("writing result to stdout")?;
                out.flush().context("flushing stdout")?;
            }
        }
        if let Some(path) = &self.csv {
            let mut f = open_append(path)?;
            writeln!(f, "{}", csv_row(&line)).with_context(|| format!("writing {}", path.display()))?;
        }
        self.lines.push(line);
        Ok(())
    }

    /// Shorthand for [`Reporter::emit`].
    pub fn metric(
        &mut self,
        scenario: &str,
        system: &str,
        metric: &str,
        value: f64,
        unit: &str,
        params: &serde_json::Value,
    ) -> Result<()> {
        self.emit(ResultLine {
            scenario: scenario.to_string(),
            system: system.to_string(),
            metric: metric.to_string(),
            value,
            unit: unit.to_string(),
            params: params.clone(),
        })
    }

    /// Everything emitted so far.
    pub fn lines(&self) -> &[ResultLine] {
        &self.lines
    }

    /// The value of one metric, if it was emitted.
    pub fn find(&self, scenario: &str, system: &str, metric: &str) -> Option<f64> {
        self.lines
            .iter()
            .rev()
            .find(|l| l.scenario == scenario && l.system == system && l.metric == metric)
            .map(|l| l.value)
    }
}

fn open_append(path: &PathBuf) -> Result<std::fs::File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening output file {}", path.display()))
}

/// RFC 4180 quoting: wrap in quotes and double inner quotes when needed.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn csv_row(l: &ResultLine) -> String {
    [
        csv_field(&l.scenario),
        csv_field(&l.system),
        csv_field(&l.metric),
        l.value.to_string(),
        csv_field(&l.unit),
        csv_field(&l.params.to_string()),
    ]
    .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_params() {
        let l = ResultLine {
            scenario: "s".into(),
            system: "memcached".into(),
            metric: "ops_per_s".into(),
            value: 1.5,
            unit: "ops/s".into(),
            params: serde_json::json!({"a": 1, "b": "x"}),
        };
        assert_eq!(csv_row(&l), r#"s,memcached,ops_per_s,1.5,ops/s,"{""a"":1,""b"":""x""}""#);
    }
}
