//! The flags and modes both daemons take. Every flag is global, so that it may stand before or
//! after the mode: `--config X check-config` and `check-config --config X` are the same.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};

use crate::config::{DaemonConfig, default_yaml};

/// The flags every daemon takes; a daemon flattens them into its own (whose struct may have the
/// same name, hence no argument group of this one).
#[derive(Args, Clone, Debug)]
#[group(skip)]
pub struct Flags {
    /// YAML configuration file; without one, the built-in defaults apply.
    #[arg(long, short, global = true)]
    pub config: Option<PathBuf>,
    /// Log filter, in `RUST_LOG` syntax.
    #[arg(long, default_value = "info", global = true)]
    pub log_level: String,
    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event; coloured only when stderr is a terminal.
    Text,
    /// One JSON object per event.
    Json,
}

/// The modes every daemon has besides running; a daemon flattens them into its own.
#[derive(Subcommand, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Check the configuration file, and that the files it names can be read, then exit.
    CheckConfig,
    /// Print the default configuration as YAML (every key, with its default) and exit.
    PrintDefaultConfig,
}

impl Mode {
    /// Runs the mode on `config`, the file [`load`](crate::load)ed (or the defaults).
    ///
    /// # Errors
    ///
    /// `check-config`: when a file the configuration names cannot be used
    /// ([`DaemonConfig::check_files`]).
    pub fn run<C: DaemonConfig>(self, config: &C) -> anyhow::Result<ExitCode> {
        match self {
            Mode::CheckConfig => {
                config.check_files()?;
                println!("configuration is valid");
            }
            Mode::PrintDefaultConfig => print!("{}", default_yaml::<C>()),
        }
        Ok(ExitCode::SUCCESS)
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: Flags,
        #[command(subcommand)]
        mode: Option<Mode>,
    }

    #[test]
    fn flags_may_follow_the_mode() {
        Cli::command().debug_assert();
        for args in [
            ["daemon", "--config", "x.yaml", "check-config"],
            ["daemon", "check-config", "--config", "x.yaml"],
        ] {
            let cli = Cli::try_parse_from(args).unwrap();
            assert_eq!(cli.flags.config, Some(PathBuf::from("x.yaml")));
            assert_eq!(cli.mode, Some(Mode::CheckConfig));
        }
    }
}
