//! `smolder-aggregator`: the central daemon. Parses flags, loads the config and hands over to
//! [`smolder_aggregator::app`]; the plumbing both daemons share is `smolder_daemon`'s.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use smolder_aggregator::{app, config::Config};

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
    mode: Option<smolder_daemon::Mode>,
}

fn main() -> ExitCode {
    smolder_daemon::main(
        |flags: &Flags| &flags.daemon,
        |flags, config: Config| match flags.mode {
            None => app::run(config, &flags.data_dir).map(|()| ExitCode::SUCCESS),
            Some(mode) => mode.run(&config),
        },
    )
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        super::Flags::command().debug_assert();
    }
}
