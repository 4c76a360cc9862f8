//! A profile: one series' tree over a span of time, with what is needed to read its values.

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use crate::{Series, Tree};

/// How a series' trees combine across time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Aggregation {
    /// Values add up (CPU samples, allocations).
    #[default]
    Sum,
    /// Each write is a snapshot (in-use memory, goroutines), so a range shows the average of its
    /// writes rather than their sum.
    Average,
}

impl Aggregation {
    /// The name Pyroscope's API uses: `sum` or `average`.
    pub fn as_str(self) -> &'static str {
        match self {
            Aggregation::Sum => "sum",
            Aggregation::Average => "average",
        }
    }
}

impl fmt::Display for Aggregation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An aggregation name that is neither `sum` nor `average` (nor `avg`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown aggregation {0:?}: expected sum or average")]
pub struct UnknownAggregation(pub String);

impl FromStr for Aggregation {
    type Err = UnknownAggregation;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sum" => Ok(Aggregation::Sum),
            "average" | "avg" => Ok(Aggregation::Average),
            other => Err(UnknownAggregation(other.to_owned())),
        }
    }
}

/// What the values of a series mean.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ProfileMeta {
    /// The profiler that produced the data (`gospy`, `pyspy`, `ebpfspy`, `unknown`...).
    pub spy_name: String,
    /// Samples per second of a sampled profile (CPU); 0 when values are not samples.
    pub sample_rate: u32,
    /// `samples`, `objects`, `bytes`, `goroutines`, `lock_nanoseconds`, `lock_samples`...
    pub units: String,
    /// How trees of this series combine across time.
    pub aggregation: Aggregation,
}

impl Default for ProfileMeta {
    /// Pyroscope's defaults for `/ingest`: spy `unknown`, 100 Hz, samples, sum.
    fn default() -> Self {
        ProfileMeta {
            spy_name: "unknown".to_owned(),
            sample_rate: 100,
            units: "samples".to_owned(),
            aggregation: Aggregation::Sum,
        }
    }
}

/// One series' tree over `[from, until)`.
#[derive(Clone, Debug)]
pub struct Profile {
    /// Which series it belongs to.
    pub series: Series,
    /// What its values mean.
    pub meta: ProfileMeta,
    /// Start of the span the samples were taken in.
    pub from: SystemTime,
    /// End of that span.
    pub until: SystemTime,
    /// The stacks and their values.
    pub tree: Tree,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregation_names() {
        assert_eq!("avg".parse::<Aggregation>(), Ok(Aggregation::Average));
        assert_eq!("sum".parse::<Aggregation>(), Ok(Aggregation::Sum));
        assert_eq!(
            "max".parse::<Aggregation>().unwrap_err().to_string(),
            r#"unknown aggregation "max": expected sum or average"#
        );
    }
}
