//! Log set-up: every line to stderr, as text or JSON, filtered by `--log-level`. Colour only
//! when stderr is a terminal, so that a file, a pipe or the journal get no ANSI escapes.

use std::io::IsTerminal;

use crate::flags::{Flags, LogFormat};

/// Installs the global subscriber for `flags`; call it once, first thing in `main`.
///
/// # Panics
///
/// When a global subscriber is installed already.
pub fn init(flags: &Flags) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(flags.log_level.as_str())
        .with_writer(std::io::stderr)
        .with_ansi(colour(flags.log_format, std::io::stderr().is_terminal()));
    match flags.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Whether log lines carry colour escapes: text on a terminal only.
fn colour(format: LogFormat, terminal: bool) -> bool {
    format == LogFormat::Text && terminal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_for_text_on_a_terminal() {
        assert!(colour(LogFormat::Text, true));
        assert!(!colour(LogFormat::Text, false));
        assert!(!colour(LogFormat::Json, true));
    }
}
