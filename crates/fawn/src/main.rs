//! `fawn`: the one binary. A thin main: parse flags, set up logging, call library code.

mod args;
#[cfg(test)]
mod flagdoc;
#[cfg(test)]
mod launch_check;
mod security;
mod status;

use args::{Cli, Command};

fn main() -> std::process::ExitCode {
    let cli = match args::parse() {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    init_logging(&cli);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = cli.worker_threads {
        builder.worker_threads(usize::from(workers));
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fawn: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fawn: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Up(a) => a.run().await,
        Command::Manager(a) => a.run().await,
        Command::Backend(a) => a.run().await,
        Command::Frontend(a) => a.run().await,
        Command::Status(a) => status::run(a).await,
        Command::Leave(a) => status::leave(a).await,
        Command::Managers(a) => status::change_managers(a).await,
        Command::Ca(a) => a.run(),
        Command::Bench(a) => tokio::task::spawn_blocking(move || fawn_bench::run(a)).await?,
    }
}

fn init_logging(cli: &Cli) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FAWN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(quiet_raft(&cli.log_level)));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if cli.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// The log filter with the manager group's consensus library at `warn` unless the filter
/// names it: at `info` it logs every vote and heartbeat timeout.
fn quiet_raft(filter: &str) -> String {
    if filter.contains("openraft") {
        filter.to_string()
    } else {
        format!("{filter},openraft=warn")
    }
}
