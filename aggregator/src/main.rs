//! `smolder-aggregator`: the central daemon. Parses flags, loads the config and hands over to
//! [`smolder_aggregator::app`]; the plumbing both daemons share is `smolder_daemon`'s.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use smolder_aggregator::{app, config::Config};

/// mimalloc, not glibc's malloc: under a fleet's load glibc's per-thread arenas kept what the
/// head's growing vectors and the cuts' block buffers freed, and RSS climbed past 8 GiB in ten
/// minutes over a heap of about 2 GiB (BENCHMARKS.md, "fleet_to_store").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Smolder's aggregator: stores profiles, answers flame-graph queries, serves the UI.
#[derive(Parser)]
#[command(version, about)]
struct Flags {
    #[command(flatten)]
    daemon: smolder_daemon::Flags,
    /// Where profiles are stored; created if missing.
    #[arg(long, default_value = "./data", global = true)]
    data_dir: PathBuf,
    #[command(subcommand)]
    mode: Option<Mode>,
}

#[derive(Subcommand)]
enum Mode {
    #[command(flatten)]
    Config(smolder_daemon::Mode),
    /// Verify every block of the data directory (checksums, index, rollups); exit 1 if any is
    /// damaged. Safe while the aggregator runs.
    Check,
}

fn main() -> ExitCode {
    smolder_daemon::main(|flags: &Flags| &flags.daemon, run)
}

/// The daemon, one of the config modes, or `check`.
fn run(flags: Flags, config: Config) -> anyhow::Result<ExitCode> {
    match flags.mode {
        None => app::run(config, &flags.data_dir).map(|()| ExitCode::SUCCESS),
        Some(Mode::Config(mode)) => mode.run(&config),
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
        "{} blocks good ({} series, {} trees, {} nodes, {} span trees, {} bytes), {} damaged, {} replaced by a merge",
        report.good,
        report.series,
        report.trees,
        report.nodes,
        report.spans,
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        super::Flags::command().debug_assert();
    }
}
