//! Workload options shared by every network benchmark, and one resolved workload point.

use std::time::Duration;

use anyhow::{ensure, Result};
use serde_json::json;

use crate::keydist::Distribution;

/// How to load a key-value server. List options (`--value-size 256,1024`) run one point each.
#[derive(clap::Args, Clone, Debug)]
pub struct WorkloadArgs {
    /// Number of distinct keys (preloaded before measuring unless --no-preload).
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Value sizes in bytes; one run per size.
    #[arg(long = "value-size", value_delimiter = ',', default_value = "256")]
    pub value_sizes: Vec<usize>,
    /// Fraction of operations that are gets (the rest are sets); one run per ratio.
    #[arg(long = "get-ratio", value_delimiter = ',', default_value = "0.9")]
    pub get_ratios: Vec<f64>,
    /// Key popularity.
    #[arg(long, value_enum, default_value_t = Distribution::Uniform)]
    pub distribution: Distribution,
    /// Skew of the zipfian and latest distributions, in (0, 1).
    #[arg(long, default_value_t = 0.99)]
    pub zipf_theta: f64,
    /// Concurrent TCP connections.
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// Requests in flight per connection (1 = no pipelining).
    #[arg(long, default_value_t = 1)]
    pub pipeline: usize,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds of load before measuring starts.
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// Open-loop mode: total offered ops/s, spread evenly over connections; latency is measured
    /// from each request's scheduled time (no coordinated omission). 0 = closed loop.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Do not write every key before measuring (gets of unwritten keys are misses).
    #[arg(long)]
    pub no_preload: bool,
    /// Prefix of every key the benchmark writes.
    #[arg(long, default_value = "fawnbench:")]
    pub key_prefix: String,
    /// Load-generator threads. Keep it small: on 2 cores the generator competes with the server.
    #[arg(long, default_value_t = 1)]
    pub client_threads: usize,
    /// Seed of the per-connection random generators (runs are reproducible up to timing).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Seconds to wait for any one response before failing the run.
    #[arg(long, default_value_t = 5.0)]
    pub timeout: f64,
    /// Scenario name in the results (default: derived from the workload).
    #[arg(long)]
    pub scenario: Option<String>,
    /// Speak TLS to the server (memcached protocol), trusting the CA certificate in this PEM
    /// file; the server's certificate must name the address connected to.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
}

/// One fully resolved workload: a single value size and get ratio.
#[derive(Clone, Debug)]
pub struct Workload {
    pub keys: u64,
    pub value_size: usize,
    pub get_ratio: f64,
    pub distribution: Distribution,
    pub zipf_theta: f64,
    pub connections: usize,
    pub pipeline: usize,
    pub duration: Duration,
    pub warmup: Duration,
    pub rate: f64,
    pub preload: bool,
    pub key_prefix: String,
    pub seed: u64,
    pub timeout: Duration,
    /// TLS to the server, trusting this CA certificate (PEM file); `None`: plain TCP.
    pub tls_ca: Option<std::path::PathBuf>,
    scenario: Option<String>,
}

impl WorkloadArgs {
    /// Every (value size × get ratio) point, validated.
    pub fn points(&self) -> Result<Vec<Workload>> {
        self.validate()?;
        let mut out = Vec::new();
        for &value_size in &self.value_sizes {
            for &get_ratio in &self.get_ratios {
                out.push(self.point(value_size, get_ratio));
            }
        }
        Ok(out)
    }

    fn point(&self, value_size: usize, get_ratio: f64) -> Workload {
        let multi = self.value_sizes.len() * self.get_ratios.len() > 1;
        Workload {
            keys: self.keys,
            value_size,
            get_ratio,
            distribution: self.distribution,
            zipf_theta: self.zipf_theta,
            connections: self.connections,
            pipeline: self.pipeline,
            duration: Duration::from_secs_f64(self.duration),
            warmup: Duration::from_secs_f64(self.warmup),
            rate: self.rate,
            preload: !self.no_preload,
            key_prefix: self.key_prefix.clone(),
            seed: self.seed,
            timeout: Duration::from_secs_f64(self.timeout),
            tls_ca: self.tls_ca.clone(),
            // A user-given name stays unique per point by suffixing the point's parameters.
            scenario: self.scenario.as_ref().map(|s| {
                if multi {
                    format!("{s}/v{value_size}/g{}", pct(get_ratio))
                } else {
                    s.clone()
                }
            }),
        }
    }

    fn validate(&self) -> Result<()> {
        ensure!(self.keys >= 1, "--keys must be at least 1");
        ensure!(self.connections >= 1, "--connections must be at least 1");
        ensure!(self.pipeline >= 1, "--pipeline must be at least 1");
        ensure!(self.client_threads >= 1, "--client-threads must be at least 1");
        ensure!(self.duration > 0.0 && self.warmup >= 0.0, "--duration must be > 0, --warmup >= 0");
        ensure!(self.timeout > 0.0, "--timeout must be > 0");
        ensure!(self.rate >= 0.0, "--rate must be >= 0");
        ensure!(
            self.get_ratios.iter().all(|g| (0.0..=1.0).contains(g)),
            "--get-ratio values must be in [0, 1]"
        );
        ensure!(
            self.value_sizes.iter().all(|&v| (1..=1 << 20).contains(&v)),
            "--value-size must be in 1..=1048576"
        );
        ensure!(
            !self.key_prefix.bytes().any(|b| b <= b' ' || b == 0x7f),
            "--key-prefix must not contain spaces or control characters (memcached keys)"
        );
        Ok(())
    }
}

fn pct(ratio: f64) -> u32 {
    (ratio * 100.0).round() as u32
}

impl Workload {
    /// Scenario name: given, or e.g. `kv/get90/v256/uniform/c32/p1/closed`.
    pub fn scenario(&self) -> String {
        if let Some(s) = &self.scenario {
            return s.clone();
        }
        let mode = if self.rate > 0.0 { format!("rate{}", self.rate) } else { "closed".to_string() };
        format!(
            "kv/get{}/v{}/{}/c{}/p{}/{}",
            pct(self.get_ratio),
            self.value_size,
            serde_json::to_value(self.distribution)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            self.connections,
            self.pipeline,
            mode
        )
    }

    /// The workload as a JSON object for the `params` field of every result.
    pub fn params(&self) -> serde_json::Value {
        json!({
            "keys": self.keys,
            "value_size": self.value_size,
            "get_ratio": self.get_ratio,
            "distribution": self.distribution,
            "zipf_theta": self.zipf_theta,
            "connections": self.connections,
            "pipeline": self.pipeline,
            "duration_s": self.duration.as_secs_f64(),
            "warmup_s": self.warmup.as_secs_f64(),
            "rate": self.rate,
        })
    }

    /// The key bytes of key index `i`.
    pub fn key(&self, i: u64, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(self.key_prefix.as_bytes());
        // Fixed width so every key has the same length (comparable across servers).
        out.extend_from_slice(format!("{i:012}").as_bytes());
    }

    /// A value of `value_size` printable bytes, fixed per seed (so servers cannot special-case it).
    pub fn value(&self) -> Vec<u8> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(self.seed);
        (0..self.value_size).map(|_| rng.gen_range(b'a'..=b'z')).collect()
    }
}
