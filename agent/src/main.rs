//! `smolder-agent`: the per-host daemon. Parses flags, loads the config and hands over to
//! [`smolder_agent::app`]; the plumbing both daemons share is `smolder_daemon`'s.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use smolder_agent::{app, config::Config, ebpf};

/// Smolder's agent: profiles every process on this host and ships the stacks to an aggregator.
#[derive(Parser)]
#[command(version, about)]
struct Flags {
    #[command(flatten)]
    daemon: smolder_daemon::Flags,
    /// Where the agent keeps its state: its id, the spool of batches not yet acknowledged and
    /// the caches of unwind tables and debuginfod's debug files (the systemd unit uses
    /// /var/lib/smolder-agent). Created if missing.
    #[arg(long, default_value = "./agent-data", global = true)]
    data_dir: PathBuf,
    #[command(subcommand)]
    mode: Option<Mode>,
}

#[derive(Subcommand)]
enum Mode {
    #[command(flatten)]
    Config(smolder_daemon::Mode),
    /// Sample every process on this host with eBPF for a while and print what was sampled
    /// (unwind tables and debug files are cached in --data-dir, as the daemon does).
    Record {
        /// How long to sample, such as `10s` or `1m`.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        duration: Duration,
        /// Output format: `folded` prints `service_name;frame;...;leaf count` lines, `json`
        /// every window's stacks and when each process's unwind tables went in.
        #[arg(long, value_enum, default_value_t = ebpf::RecordFormat::Folded)]
        format: ebpf::RecordFormat,
    },
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    smolder_common::timestamp::parse_offset(text).map_err(|err| err.to_string())
}

fn main() -> ExitCode {
    smolder_daemon::main(|flags: &Flags| &flags.daemon, run)
}

/// The daemon, one of the config modes, or `record`.
fn run(flags: Flags, config: Config) -> anyhow::Result<ExitCode> {
    match flags.mode {
        None => app::run(config, &flags.data_dir).map(|()| ExitCode::SUCCESS),
        Some(Mode::Config(mode)) => mode.run(&config),
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        super::Flags::command().debug_assert();
    }
}
