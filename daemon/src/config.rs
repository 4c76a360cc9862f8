//! Reading a daemon's YAML config: unknown keys are errors, renamed keys still read (with a
//! warning naming the new key), and what serde cannot check is checked before the daemon
//! starts.

use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::warn;

/// A daemon's whole config file.
///
/// Each section is its stage's `XConfig`, `#[serde(deny_unknown_fields, default, rename_all =
/// "kebab-case")]`. A key that is renamed keeps its old name as a serde `alias` on the field and
/// a row in [`RENAMED`](DaemonConfig::RENAMED), which makes loading warn.
pub trait DaemonConfig: Default + Serialize + DeserializeOwned {
    /// Keys read under an old name as well, with a warning.
    const RENAMED: &'static [RenamedKey] = &[];

    /// Checks what deserializing cannot (rules compile, names are unique, values agree); every
    /// load runs it.
    ///
    /// # Errors
    ///
    /// When the config cannot run, with what is wrong.
    fn validate(&self) -> anyhow::Result<()> {
        Ok(())
    }

    /// Checks that the files the config names (TLS certificates, keys, tokens) exist and read
    /// as what they should be. `check-config` runs it; a daemon at start may wait for files
    /// another process writes, so loading does not.
    ///
    /// # Errors
    ///
    /// When a file is missing, unreadable or not what its key expects.
    fn check_files(&self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// A config key that was renamed: still read under `old`, with a warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenamedKey {
    /// The section holding the key, outermost first (`["ingest", "quic"]`); empty for the top.
    pub section: &'static [&'static str],
    /// The name it had.
    pub old: &'static str,
    /// The name it has.
    pub new: &'static str,
}

impl RenamedKey {
    fn path(&self, key: &str) -> String {
        let mut path: Vec<&str> = self.section.to_vec();
        path.push(key);
        path.join(".")
    }
}

/// The file at `path`, or the defaults without one.
///
/// # Errors
///
/// When the file cannot be read, does not parse, or fails [`DaemonConfig::validate`]; the
/// message names the file and, for a parse error, the line.
pub fn load<C: DaemonConfig>(path: Option<&Path>) -> anyhow::Result<C> {
    let Some(path) = path else {
        return Ok(C::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    parse(&text).with_context(|| format!("config file {}", path.display()))
}

/// A config from YAML text: as [`load`] reads a file.
///
/// # Errors
///
/// When `text` does not parse or fails [`DaemonConfig::validate`].
pub fn parse<C: DaemonConfig>(text: &str) -> anyhow::Result<C> {
    // A key given twice (a rule's name, a section) is an error here, where a typed map would
    // keep the last one silently.
    serde_norway::from_str::<serde_norway::Value>(text).context("parsing")?;
    let config: C = serde_norway::from_str(text).context("parsing")?;
    for renamed in renamed_keys_in::<C>(text) {
        warn!(
            old = renamed.path(renamed.old),
            new = renamed.path(renamed.new),
            "the config uses a deprecated key name; rename it, the old name will stop working"
        );
    }
    config.validate().context("checking")?;
    Ok(config)
}

/// The defaults of `C`, as YAML: every key.
pub fn default_yaml<C: DaemonConfig>() -> String {
    serde_norway::to_string(&C::default()).expect("the default config serializes")
}

/// The renamed keys `text` uses under their old name (`text` has parsed as `C` already).
fn renamed_keys_in<C: DaemonConfig>(text: &str) -> Vec<&'static RenamedKey> {
    let Ok(value) = serde_norway::from_str::<serde_norway::Value>(text) else {
        return Vec::new();
    };
    C::RENAMED
        .iter()
        .filter(|renamed| {
            let section = renamed
                .section
                .iter()
                .try_fold(&value, |value, key| value.get(key));
            section.is_some_and(|section| section.get(renamed.old).is_some())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Default, PartialEq, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
    struct Config {
        inner: Inner,
    }

    #[derive(Debug, Default, PartialEq, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
    struct Inner {
        #[serde(alias = "old-name")]
        new_name: u32,
    }

    impl DaemonConfig for Config {
        const RENAMED: &'static [RenamedKey] = &[RenamedKey {
            section: &["inner"],
            old: "old-name",
            new: "new-name",
        }];

        fn validate(&self) -> anyhow::Result<()> {
            anyhow::ensure!(self.inner.new_name != 13, "13 is unlucky");
            Ok(())
        }
    }

    #[test]
    fn renamed_keys_read_under_both_names_and_are_reported() {
        let old: Config = parse("inner:\n  old-name: 3\n").unwrap();
        let new: Config = parse("inner:\n  new-name: 3\n").unwrap();
        assert_eq!(old, new);
        assert_eq!(
            renamed_keys_in::<Config>("inner:\n  old-name: 3\n"),
            [&Config::RENAMED[0]]
        );
        assert!(renamed_keys_in::<Config>("inner:\n  new-name: 3\n").is_empty());
        assert_eq!(Config::RENAMED[0].path("old-name"), "inner.old-name");
    }

    #[test]
    fn a_key_given_twice_is_an_error() {
        let err = parse::<Config>("inner:\n  new-name: 3\ninner:\n  new-name: 4\n").unwrap_err();
        assert!(
            format!("{err:#}").contains("duplicate entry with key \"inner\""),
            "{err:#}"
        );
    }

    #[test]
    fn both_names_at_once_is_an_error() {
        let err = parse::<Config>("inner:\n  old-name: 3\n  new-name: 4\n").unwrap_err();
        assert!(format!("{err:#}").contains("duplicate field"), "{err:#}");
    }

    #[test]
    fn unknown_keys_and_failed_checks_are_errors_with_the_file_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, "inner:\n  nwe-name: 1\n").unwrap();
        let err = format!("{:#}", load::<Config>(Some(&path)).unwrap_err());
        assert!(
            err.contains("c.yaml") && err.contains("unknown field `nwe-name`"),
            "{err}"
        );
        std::fs::write(&path, "inner:\n  new-name: 13\n").unwrap();
        let err = format!("{:#}", load::<Config>(Some(&path)).unwrap_err());
        assert!(err.contains("13 is unlucky"), "{err}");
        assert_eq!(load::<Config>(None).unwrap(), Config::default());
    }

    #[test]
    fn defaults_round_trip_through_yaml() {
        let parsed: Config = parse(&default_yaml::<Config>()).unwrap();
        assert_eq!(parsed, Config::default());
    }
}
