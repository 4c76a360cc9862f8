//! `smolder-agent`: the per-host daemon. Parses flags, loads the config and hands over to
//! [`smolder_agent::app`].

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use smolder_agent::{app, config::Config, ebpf};

/// Smolder's agent: profiles every process on this host and ships the stacks to an aggregator.
#[derive(Parser)]
#[command(version, about)]
struct Flags {
    /// YAML configuration file; without one, the built-in defaults apply.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Where the agent keeps its state: its id and the spool of batches not yet acknowledged
    /// (the systemd unit uses /var/lib/smolder-agent). Created if missing.
    #[arg(long, default_value = "./agent-data")]
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
    /// Sample every process on this host with eBPF for a while and print what was sampled
    /// (unwind tables and debug files are cached in --data-dir, as the daemon does).
    Record {
        /// How long to sample, such as `10s` or `1m`.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        duration: std::time::Duration,
        /// Output format: `folded` prints `service_name;frame;...;leaf count` lines, `json`
        /// every window's stacks and when each process's unwind tables went in.
        #[arg(long, value_enum, default_value_t = ebpf::RecordFormat::Folded)]
        format: ebpf::RecordFormat,
    },
}

fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    smolder_common::timestamp::parse_offset(text).map_err(|err| err.to_string())
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
        Some(Mode::Record { duration, format }) => ebpf::print_record(
            &config,
            duration,
            Some(&flags.data_dir),
            format,
            std::io::stdout().lock(),
        )
        .map(|()| ExitCode::SUCCESS),
    }
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
