//! Stand-alone `fawn bench` for developing the benchmarks without building the whole binary:
//! `cargo run --release -p fawn-bench --example bench -- peers --duration 5`.

use clap::Parser;

#[derive(Parser)]
#[command(name = "bench", about = "fawn bench, stand-alone")]
struct Cli {
    #[command(flatten)]
    bench: fawn_bench::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    fawn_bench::run(Cli::parse().bench)
}
