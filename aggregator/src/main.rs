//! `smolder-aggregator`: the central daemon. Parses flags, loads the config and hands over to
//! [`smolder_aggregator::app`].

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use smolder_aggregator::{app, config::Config};

/// Smolder's aggregator: stores profiles, answers flame-graph queries, serves the UI.
#[derive(Parser)]
#[command(version, about)]
struct Flags {
    /// YAML configuration file; without one, the built-in defaults apply.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Where profiles are stored; created if missing.
    #[arg(long, default_value = "./data")]
    data_dir: PathBuf,
    /// Log filter, in `RUST_LOG` syntax.
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    mode: Option<Mode>,
}

#[derive(Subcommand)]
enum Mode {
    /// Check the configuration file and exit.
    CheckConfig,
    /// Print the default configuration as YAML and exit.
    PrintDefaultConfig,
    /// Verify every block of the data directory (checksums, index, rollups); exit 1 if any is
    /// damaged. Safe while the aggregator runs.
    Check,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    init_logs(&flags.log_level, flags.log_format);
    match run(flags) {
        Ok(code) => code,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(flags: Flags) -> anyhow::Result<ExitCode> {
    let config = match &flags.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    match flags.mode {
        None => app::run(config, &flags.data_dir).map(|()| ExitCode::SUCCESS),
        Some(Mode::CheckConfig) => {
            println!("configuration is valid");
            Ok(ExitCode::SUCCESS)
        }
        Some(Mode::PrintDefaultConfig) => {
            print!("{}", Config::default_yaml());
            Ok(ExitCode::SUCCESS)
        }
        Some(Mode::Check) => check(&config, &flags.data_dir),
    }
}

/// Runs `check` and prints what it found, one line per damaged block.
fn check(config: &Config, data_dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    let report = app::check(config, data_dir)?;
    for (block, problem) in &report.damaged {
        println!("DAMAGED {block}: {problem}");
    }
    println!(
        "{} blocks good ({} series, {} trees, {} nodes, {} bytes), {} damaged, {} replaced by a merge",
        report.good,
        report.series,
        report.trees,
        report.nodes,
        report.bytes,
        report.damaged.len(),
        report.replaced
    );
    Ok(if report.damaged.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn init_logs(filter: &str, format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
